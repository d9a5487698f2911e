/* backends.c: the backends the harness can run candidates on, in report
 * order (backends.h). */
#include "backends.h"

#include <string.h>

#include "cuda_forward.h"

static const KvBackendOps *const k_backends[] = {&kv_backend_cpu, &kv_backend_cuda};
#define KV_BACKEND_COUNT ((int)(sizeof k_backends / sizeof k_backends[0]))

const KvBackendOps *const *kv_backend_all(int *count) {
    if (count != NULL) *count = KV_BACKEND_COUNT;
    return k_backends;
}

const KvBackendOps *kv_backend_find(const char *name) {
    if (name == NULL) return NULL;
    for (int i = 0; i < KV_BACKEND_COUNT; i++) {
        if (strcmp(k_backends[i]->name, name) == 0) return k_backends[i];
    }
    return NULL;
}
