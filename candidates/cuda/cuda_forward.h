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

/* Decode-step graph replays timed back to back for the replay floor. */
#define KV_CUDA_BENCH_FLOOR_REPS 50

/* Decode timings for bench/bench_cuda.c. */
typedef struct {
    int64_t steps;            /* one-token decode steps timed per mode (eager, graph) */
    double eager_ms_per_step; /* mean wall time of an eager step, host sync included */
    double eager_ms_best;     /* fastest eager step */
    double graph_ms_per_step; /* mean wall time of a graph replay step, host sync included
                               * (capture steps excluded) */
    double graph_ms_best;     /* fastest graph replay step */
    double capture_ms;        /* total wall time of the steps that (re-)captured */
    int64_t graphs_captured;  /* captures during the timed graph steps */
    int64_t graph_instantiations;
    int64_t exec_updates;
    /* The replay floor: the decode-step graph launched floor_reps times
     * back to back with no host sync between, one event pair around them
     * all. Each replay is the next decode step (the argmax kernel moves the
     * device position on and feeds its token back), so the context has
     * room for them; the work per step is the same shape. */
    double floor_ms_per_step;      /* device time per replay */
    double floor_host_ms_per_step; /* host time to enqueue one replay: well below
                                    * floor_ms_per_step the device never waited on the
                                    * host; near it, it may have (or the launch queue was
                                    * full and held the host back) */
    int64_t floor_reps;
    int64_t floor_settle_steps; /* synchronised graph steps first, until the window has
                                 * filled and the capture key stays put */
    bool floor_stale;         /* the capture key changed across the floor (a replay ran a
                               * graph captured for another regime or length): the timing
                               * stands, the decode's values do not */
    /* The replayed decode-step graph's nodes, child graphs expanded: what
     * one token launches. */
    int64_t graph_nodes;       /* every node below */
    int64_t graph_kernel_nodes;
    int64_t graph_memcpy_nodes;
    int64_t graph_memset_nodes;
    int64_t graph_other_nodes; /* any other type (event, host, empty) */
    /* One eager step with a CUDA event pair around every kernel, cuBLAS
     * call and copy: the sum of those times. Not a floor: each pair adds
     * its own overhead to the op it times. */
    double event_sum_ms;
    int64_t ops_per_step;     /* operations timed in that step */
    char device[256];
} KvCudaBenchResult;

/* Prefills spec's prompt, then times spec->new_tokens - 1 decode steps
 * eagerly and the same again in graph mode (from a fresh state); then,
 * continuing the graph decode, the replay floor (KV_CUDA_BENCH_FLOOR_REPS
 * replays) and one eager step op by op. The backend is sized for those
 * extra steps (and for the steps that fill the window first when the
 * decode has not), so no position runs past it. Probes, forced tokens and
 * the replay check of spec are not used. KV_SKIP / KV_ERR_* as
 * kv_decode_run on kv_backend_cuda. */
KvStatus kv_cuda_bench_decode(const KvModel *m, const KvDecodeSpec *spec, KvCudaBenchResult *out,
                              KvError *err);

/* Device-to-device copy bandwidth over a buffer of `bytes`: best of several
 * cudaMemcpyAsync runs, counted as (read + write) bytes / s. */
KvStatus kv_cuda_bench_bandwidth(size_t bytes, double *bytes_per_s, KvError *err);

/* The planted racy_shift kernel (fault.h KV_FAULT_RACY_SHIFT) run once, by
 * itself, on a (B, W, D) cache of distinct values: the elements of K, V and
 * real that differ afterwards from the right shift by one, in *wrong.
 * downwards: roll's form (all W slots, blocks from the top), else
 * cat_shift's (slots 0 .. W-2, blocks from the bottom). Repeated, it shows
 * whether the race moves from run to run. KV_SKIP without a device. */
KvStatus kv_cuda_racy_shift_count(int64_t B, int64_t W, int64_t D, bool downwards, int64_t *wrong,
                                  KvError *err);

#ifdef __cplusplus
}
#endif

#endif
