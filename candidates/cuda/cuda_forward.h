/* cuda_forward.h: greedy decoding on the GPU (DESIGN §2-§4), the CUDA twin
 * of kv_decode_greedy (reference/decode.h).
 *
 * The same spec gives the same kind of result: spec->variant NULL runs the
 * reference layout on the GPU (every layer in a static max_len cache, the
 * window applied as a mask); otherwise the variant's name selects the GPU
 * implementation of that cache variant (index_copy, cat_shift, roll,
 * always_roll, ring, dynamic) with the same slot semantics as
 * candidates/cache_*.c. Eager and graph modes, teacher forcing, the replay
 * check and the probe hashes (same names, order and byte definitions as
 * kv_probe_name in reference/forward.h) behave as on the CPU.
 *
 * Contract (DESIGN §2): on the GPU every variant is bitwise equal to every
 * other variant and to the GPU reference layout, graph replay is bitwise
 * equal to eager, and repeats are bitwise equal. GPU vs CPU agree within a
 * tolerance only (cuBLAS and the device's libm round differently).
 *
 * With no device, no driver, or any failure while setting up CUDA or cuBLAS
 * the calls return KV_SKIP with the CUDA call and its error text in err,
 * never KV_OK (DESIGN §4). A build without nvcc links cuda_forward_none.c,
 * which returns KV_SKIP "built without CUDA". C11-includable. */
#ifndef KV_CUDA_FORWARD_H
#define KV_CUDA_FORWARD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
/* decode.h and its includes are C headers without their own linkage block. */
extern "C" {
#endif

#include "decode.h"
#include "model.h"
#include "status.h"

/* What a CUDA run did besides its results (for reports and tests). */
typedef struct {
    int64_t graphs_captured;      /* stream captures made (= KvDecodeResult.graphs_captured) */
    int64_t graph_instantiations; /* cudaGraphInstantiate calls */
    int64_t exec_updates;         /* re-captures applied with cudaGraphExecUpdate instead of a
                                   * new instantiation */
    bool exec_update_used;        /* exec_updates > 0 */
    int64_t graph_launches;       /* cudaGraphLaunch calls (replays) */
    int64_t eager_forwards;       /* forwards launched op by op (prefill chunks included) */
    char device[256];             /* "NAME (sm_XY, N SMs), driver A.B, runtime C.D, cuBLAS V" */
    char math_mode[64];           /* cuBLAS math mode of the run, e.g. "pedantic fp32 (no TF32)" */
} KvCudaRunStats;

/* Runs spec on device 0 and fills *out exactly as kv_decode_greedy does
 * (tokens, logits, margins, graphs_captured, replays_checked,
 * replay_mismatch_step, and probe_hash when spec->record_probes). stats may
 * be NULL. Unknown spec->faults bits are ignored; the KV_FAULT_* bits of
 * reference/fault.h are planted as their GPU forms (see cuda_forward.cu).
 * Returns KV_ERR_INPUT for a bad spec (checked before any CUDA call),
 * KV_SKIP when CUDA is unavailable, KV_ERR_INTERNAL for a CUDA or cuBLAS
 * failure after setup (err names the file, line and statement) or a broken
 * device-side invariant. On any failure *out is freed and zeroed. */
KvStatus kv_cuda_decode_greedy(const KvModel *m, const KvDecodeSpec *spec, KvDecodeResult *out,
                               KvCudaRunStats *stats, KvError *err);

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
 * used. KV_SKIP / KV_ERR_* as kv_cuda_decode_greedy. */
KvStatus kv_cuda_bench_decode(const KvModel *m, const KvDecodeSpec *spec, KvCudaBenchResult *out,
                              KvError *err);

/* Device-to-device copy bandwidth over a buffer of `bytes`: best of several
 * cudaMemcpyAsync runs, counted as (read + write) bytes / s. */
KvStatus kv_cuda_bench_bandwidth(size_t bytes, double *bytes_per_s, KvError *err);

#ifdef __cplusplus
}
#endif

#endif
