/* backends.h: the registered backends (engine/backend.h): the CPU
 * reference and CUDA (a build without nvcc registers a CUDA table whose
 * every run is KV_SKIP "built without CUDA"). */
#ifndef KV_BACKENDS_H
#define KV_BACKENDS_H

#include "backend.h"

/* All backends, CPU first; *count receives their number. */
const KvBackendOps *const *kv_backend_all(int *count);
/* By name ("cpu", "cuda"), or NULL. */
const KvBackendOps *kv_backend_find(const char *name);

#endif
