/* backend.c: the backend table's optional entries (backend.h), each checked
 * here once, as ggml's ggml_backend_* wrappers do, so a caller never tests
 * an entry for NULL and a backend without one behaves the same everywhere. */
#include <string.h>

#include "backend.h"

bool kv_backend_can_shift(const KvBackendOps *ops) {
    return ops->shift != NULL;
}

KvStatus kv_backend_refuse_shift(const KvBackendOps *ops, KvError *err) {
    return kv_error_set(err, KV_ERR_INPUT,
                        "decode: a context shift is not implemented on the %s backend", ops->name);
}

KvStatus kv_backend_shift(const KvBackendOps *ops, KvBackend *b, int64_t keep, int64_t drop,
                          KvError *err) {
    if (ops->shift == NULL) return kv_backend_refuse_shift(ops, err);
    return ops->shift(b, keep, drop, err);
}

bool kv_backend_checks_nonfinite(const KvBackendOps *ops) {
    return ops->take_nonfinite != NULL;
}

bool kv_backend_take_nonfinite(const KvBackendOps *ops, KvBackend *b, KvNonfinite *out) {
    return ops->take_nonfinite != NULL && ops->take_nonfinite(b, out);
}

bool kv_backend_keeps_dumps(const KvBackendOps *ops) {
    return ops->take_dump != NULL;
}

void kv_backend_take_dump(const KvBackendOps *ops, KvBackend *b, KvProbeDump *out) {
    if (ops->take_dump != NULL) ops->take_dump(b, out);
}

const KvProbeDump *kv_backend_peek_dump(const KvBackendOps *ops, const KvBackend *b) {
    return ops->peek_dump != NULL ? ops->peek_dump(b) : NULL;
}

void kv_backend_stats(const KvBackendOps *ops, const KvBackend *b, KvBackendStats *out) {
    if (ops->stats != NULL) ops->stats(b, out);
}
