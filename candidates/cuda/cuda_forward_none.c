/* cuda_forward_none.c: the cuda_forward.h API for a build without CUDA (no
 * nvcc at configure time). Every call reports KV_SKIP with the reason, so a
 * CPU-only build never claims a GPU result (DESIGN §4); outputs are zeroed
 * as the CUDA build leaves them on failure. */
#include "cuda_forward.h"

#include <stdio.h>
#include <string.h>

#define KV_CUDA_FORWARD_NONE_REASON "kvrepro was built without CUDA (no nvcc at configure time)"

/* Not kv_error_set: this library must link in any order relative to kvcore. */
static KvStatus cuda_forward_none_skip(KvError *err) {
    if (err != NULL) snprintf(err->msg, sizeof err->msg, "%s", KV_CUDA_FORWARD_NONE_REASON);
    return KV_SKIP;
}

static KvStatus cuda_none_query(char *device, size_t device_len, KvError *err) {
    if (device != NULL && device_len > 0) device[0] = '\0';
    return cuda_forward_none_skip(err);
}

static KvStatus cuda_none_create(const KvModel *m, const KvBackendSetup *setup, KvBackend **out,
                                 KvError *err) {
    (void)m;
    (void)setup;
    *out = NULL;
    return cuda_forward_none_skip(err);
}

/* Only create and query are ever called: create never succeeds. */
const KvBackendOps kv_backend_cuda = {
    .name = "cuda",
    .host = false,
    .query = cuda_none_query,
    .create = cuda_none_create,
};

KvStatus kv_cuda_bench_decode(const KvModel *m, const KvDecodeSpec *spec, KvCudaBenchResult *out,
                              KvError *err) {
    (void)m;
    (void)spec;
    if (out != NULL) memset(out, 0, sizeof *out);
    return cuda_forward_none_skip(err);
}

KvStatus kv_cuda_bench_bandwidth(size_t bytes, double *bytes_per_s, KvError *err) {
    (void)bytes;
    if (bytes_per_s != NULL) *bytes_per_s = 0.0;
    return cuda_forward_none_skip(err);
}

KvStatus kv_cuda_racy_shift_count(int64_t B, int64_t W, int64_t D, bool downwards, int64_t *wrong,
                                  KvError *err) {
    (void)B;
    (void)W;
    (void)D;
    (void)downwards;
    if (wrong != NULL) *wrong = -1;
    return cuda_forward_none_skip(err);
}
