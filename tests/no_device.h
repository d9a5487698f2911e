/* no_device.h: the no-device path of the CUDA tests. The test re-executes
 * itself with CUDA_VISIBLE_DEVICES="" and a child flag, so the path a
 * machine without a GPU takes is tested on every machine, GPU or not. */
#ifndef KV_TEST_NO_DEVICE_H
#define KV_TEST_NO_DEVICE_H

#define KV_NO_DEVICE_CHILD_FLAG "--no-device-child"

/* Runs argv0 KV_NO_DEVICE_CHILD_FLAG with no visible device and waits.
 * name prefixes every line printed ("cuda_device"); passed is printed after
 * "<name>: no-device path: PASSED " when the child exits 0. Returns 1 when
 * it did, else 0 after saying why on stderr. */
int kv_test_no_device_child(const char *argv0, const char *name, const char *passed);

#endif
