/* cuda_device_none.c: the cuda_device.h API for a build without CUDA (no
 * nvcc at configure time). Every CUDA run reports KV_SKIP with the reason, so
 * a CPU-only build never claims a GPU result (DESIGN §4). */
#include "cuda_device.h"

#include <stdio.h>
#include <string.h>

#define KV_CUDA_NONE_REASON "kvrepro was built without CUDA (no nvcc at configure time)"

/* Not kv_error_set: this library must link in any order relative to kvcore,
 * as the CUDA build of it does. */
static KvStatus cuda_none_skip(KvError *err) {
    if (err != NULL) snprintf(err->msg, sizeof err->msg, "%s", KV_CUDA_NONE_REASON);
    return KV_SKIP;
}

KvStatus kv_cuda_query(KvCudaInfo *out, KvError *err) {
    memset(out, 0, sizeof *out);
    return cuda_none_skip(err);
}

KvStatus kv_cuda_selftest(KvError *err) { return cuda_none_skip(err); }

const char *kv_cuda_build_info(void) { return "built without CUDA"; }
