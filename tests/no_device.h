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

/* A CUDA test with a no-device part and a device part. */
typedef struct {
    const char *name;         /* line prefix, e.g. "cuda_forward" */
    const char *passed;       /* what the no-device child's pass means */
    int (*run_no_device)(void); /* failures of the no-device part (run in the child) */
    int (*run_device)(void);    /* failures of the device part */
    void (*cleanup)(void);      /* after either part; may be NULL */
} KvCudaTest;

/* The whole main of such a test: the child flag runs the no-device part;
 * otherwise the no-device child first (before this process initialises
 * CUDA), then the device part, or exit 77 naming why there is no device.
 * "--no-device-only" and "--device-only" pick one part. */
int kv_test_cuda_main(int argc, char **argv, const KvCudaTest *t);

#endif
