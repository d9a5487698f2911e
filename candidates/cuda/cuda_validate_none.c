/* cuda_validate_none.c: the cuda_validate.h API for a build without CUDA (no
 * nvcc at configure time). The validation reports KV_SKIP with the reason
 * and records no op, so a CPU-only build never claims a validated kernel
 * (DESIGN §4). */
#include "cuda_validate.h"

#include <string.h>

#define KV_CUDA_VALIDATE_NONE_REASON \
    "cuda validate: kvrepro was built without CUDA (no nvcc at configure time)"

KvStatus kv_cuda_validate_ops(const KvModel *m, uint64_t seed, unsigned faults, FILE *log,
                              KvCudaValidateReport *out, KvError *err) {
    (void)m;
    (void)log;
    if (out != NULL) {
        memset(out, 0, sizeof *out);
        out->seed = seed;
        out->faults = faults;
    }
    /* Not kv_error_set: this library must link in any order relative to kvcore. */
    if (err != NULL) snprintf(err->msg, sizeof err->msg, "%s", KV_CUDA_VALIDATE_NONE_REASON);
    return KV_SKIP;
}

const KvCudaValidateOp *kv_cuda_validate_find(const KvCudaValidateReport *r, const char *op) {
    for (int i = 0; r != NULL && i < r->n_ops; i++) {
        if (strcmp(r->ops[i].op, op) == 0) return &r->ops[i];
    }
    return NULL;
}
