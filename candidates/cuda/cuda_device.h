/* cuda_device.h: CUDA device discovery and a self-test kernel (DESIGN §4).
 *
 * A C API over the CUDA runtime so that C code (the harness, tests) can ask
 * whether a usable GPU is present and prove that this build carries a kernel
 * image for it, without including CUDA headers. kvrepro builds without a GPU:
 * when there is no device or no driver these calls return KV_SKIP with the
 * CUDA call and CUDA's error text, never crash, and never report a pass. The
 * no-CUDA build (cuda_device_none.c) implements the same API as KV_SKIP. */
#ifndef KV_CUDA_DEVICE_H
#define KV_CUDA_DEVICE_H

#include <stddef.h>

#ifdef __cplusplus
/* status.h is a C header without its own linkage block. */
extern "C" {
#endif

#include "status.h"

typedef struct {
    int device_count;    /* devices visible to the runtime (CUDA_VISIBLE_DEVICES applies) */
    int device;          /* the device described below: always 0 */
    char name[256];      /* cudaDeviceProp.name */
    int cc_major, cc_minor;
    int driver_version;  /* cudaDriverGetVersion, e.g. 13000 for 13.0 */
    int runtime_version; /* cudaRuntimeGetVersion */
    size_t total_mem;    /* bytes of device memory */
    int sm_count;        /* multiprocessors; record it wherever a grid shape depends on it */
} KvCudaInfo;

/* Fills *out for device 0. KV_OK when a device is usable; KV_SKIP when there
 * is no device, no driver or a driver too old for this runtime, with err
 * naming the CUDA call and its error (cudaGetErrorName: cudaGetErrorString);
 * KV_ERR_INTERNAL for any other CUDA failure. *out is zeroed first. */
KvStatus kv_cuda_query(KvCudaInfo *out, KvError *err);

/* Runs a small deterministic kernel on device 0 and checks every result
 * bitwise on the host: exact integer sums (any order gives the same bits) and
 * a fixed-order F32 multiply-add chain that matches the host only when the
 * device code was compiled without FMA contraction (--fmad=false), plus a
 * guard region the kernel must not write. Proves that a kernel image for this
 * device's architecture is in the binary: "no kernel image is available"
 * comes out as KV_ERR_INTERNAL with CUDA's text. KV_SKIP as kv_cuda_query.
 * On KV_OK, err->msg (err may be NULL) says what ran: device, architecture,
 * and the kernel's binary and PTX versions. */
KvStatus kv_cuda_selftest(KvError *err);

/* How this library was built, e.g. "CUDA 13.0 (nvcc 13.0), archs 80-real,90"
 * or "built without CUDA". A static string. */
const char *kv_cuda_build_info(void);

#ifdef __cplusplus
}
#endif

#endif
