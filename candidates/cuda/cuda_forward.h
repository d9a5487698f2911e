/* cuda_forward.h: the GPU backend (DESIGN §2-§4): kv_backend_cuda, the
 * backend table (engine/backend.h) that kv_decode_run drives, plus the
 * benchmark entry points.
 *
 * The same spec gives the same kind of result as on the CPU: no variant
 * runs the reference layout on the GPU (every layer in a static max_len
 * cache, the window applied as a mask); a variant runs its GPU form
 * (candidates/cuda/cuda_cache.cu, keyed by the KvCacheOps table, with the
 * slot semantics of candidates/cache_*.c). Eager and graph modes, teacher
 * forcing, the replay check and the probe hashes (same names, order and
 * byte definitions as kv_probe_name) behave as on the CPU, because the
 * driver is the same.
 *
 * Contract (DESIGN §2): on the GPU every variant is bitwise equal to every
 * other variant and to the GPU reference layout, graph replay is bitwise
 * equal to eager, and repeats are bitwise equal. GPU vs CPU agree within a
 * tolerance only (cuBLAS and the device's libm round differently).
 *
 * With no device the table's query and create return KV_SKIP with the CUDA
 * call and its error text, never KV_OK (DESIGN §4); a device that is there
 * but cannot be set up is KV_ERR_INTERNAL. A build without nvcc links
 * cuda_forward_none.c, whose table returns KV_SKIP "built without CUDA".
 * C11-includable. */
#ifndef KV_CUDA_FORWARD_H
#define KV_CUDA_FORWARD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
/* decode.h and its includes are C headers without their own linkage block. */
extern "C" {
#endif

#include "backend.h"
#include "decode.h"
#include "model.h"
#include "status.h"

/* The CUDA backend (name "cuda"). */
extern const KvBackendOps kv_backend_cuda;

/* Decode timings for bench/bench_cuda.c. */
typedef struct {
    int64_t steps;            /* one-token decode steps timed per mode */
    double eager_ms_per_step; /* mean wall time of an eager step, host sync included */
    double eager_ms_best;     /* fastest eager step */
    double graph_ms_per_step; /* mean wall time of a graph replay step (capture steps excluded) */
    double graph_ms_best;     /* fastest graph replay step */
    double capture_ms;        /* total wall time of the steps that (re-)captured */
    int64_t graphs_captured;
    int64_t graph_instantiations;
    int64_t exec_updates;
    double kernel_sum_ms;     /* one eager step: sum of CUDA-event times around each kernel,
                               * cuBLAS call and copy (launch gaps excluded) */
    int64_t ops_per_step;     /* operations timed in that step */
    char device[256];
} KvCudaBenchResult;

/* Prefills spec's prompt, then times spec->new_tokens - 1 decode steps
 * eagerly, the same again in graph mode (from a fresh state), and one eager
 * step op by op. Probes, forced tokens and the replay check of spec are not
 * used. KV_SKIP / KV_ERR_* as kv_decode_run on kv_backend_cuda. */
KvStatus kv_cuda_bench_decode(const KvModel *m, const KvDecodeSpec *spec, KvCudaBenchResult *out,
                              KvError *err);

/* Device-to-device copy bandwidth over a buffer of `bytes`: best of several
 * cudaMemcpyAsync runs, counted as (read + write) bytes / s. */
KvStatus kv_cuda_bench_bandwidth(size_t bytes, double *bytes_per_s, KvError *err);

#ifdef __cplusplus
}
#endif

#endif
