/* gemm.h: the register- and cache-blocked matmul that kv_matmul and
 * kv_matmul_multi use when x has more than one row (prefill, chunked
 * prefill, multi-token steps, batched decode). rows == 1 never comes here:
 * the decode matvec is memory-bound and keeps kvmath.c's row kernel.
 *
 * The numeric contract is kv_matmul's (kvmath.h): every y[r, o] is bitwise
 * kv_dot(x[r, :], w[o, :], in), i.e. kv_dot's 16-lane pattern (a separate
 * multiply and add per element, no FMA), the same pairwise tree and the same
 * scalar tail. Only the order in which independent outputs are computed, and
 * which thread computes them, changes; so results are the same for any
 * thread count, any path below and any x86-64 CPU. */
#ifndef KV_GEMM_H
#define KV_GEMM_H

#include <stdbool.h>
#include <stdint.h>

#include "status.h"
#include "weight.h"

/* Which code computes kv_matmul's rows > 1 case. Every path gives the same
 * bits; they differ in speed only. */
typedef enum {
    KV_GEMM_AUTO = 0,     /* the fastest this CPU supports (the default) */
    KV_GEMM_PORTABLE = 1, /* kvmath.c's SSE row kernel: one kv_dot-pattern dot per output,
                             any x86-64 (and any GCC target) */
    KV_GEMM_AVX512 = 2,   /* the blocked micro-kernel, one __m512 per output's 16 lanes */
    KV_GEMM_AVX2 = 3,     /* the same blocking, each output's 16 lanes in two __m256 */
} KvGemmPath;

/* For tests and benchmarks only (not thread-safe: call it outside parallel
 * work): forces the path every later rows > 1 matmul takes, so the AVX-512
 * kernel and the portable fallback can both be checked, and timed, in one
 * binary on one machine. KV_ERR_INPUT (path unchanged) when this CPU or this
 * build cannot run `path`; KV_GEMM_AUTO is always accepted. */
KvStatus kv_gemm_set_path(KvGemmPath path);

/* The path rows > 1 matmuls take now: KV_GEMM_AUTO resolved to what this
 * CPU supports, so never KV_GEMM_AUTO. */
KvGemmPath kv_gemm_path(void);

/* "portable", "avx2", "avx512" (or "auto"). */
const char *kv_gemm_path_name(KvGemmPath path);

/* Whether this CPU and build can run `path` (KV_GEMM_AUTO and
 * KV_GEMM_PORTABLE always can). */
bool kv_gemm_path_supported(KvGemmPath path);

/* kv_matmul_multi's contract (kvmath.h) computed by the blocked kernel:
 * ys[j] = x @ ws[j]^T with x: (rows, in), ws[j]: (outs[j], in), ys[j]:
 * (rows, outs[j]), every matrix in one OpenMP region (parallel when the work
 * reaches kv_parallel_min_work()). Returns false, touching nothing, when the
 * current path is KV_GEMM_PORTABLE: the caller then runs its own kernel.
 * Called by kv_matmul_multi for rows > 1; callers use kv_matmul(_multi). */
bool kv_gemm_multi(const float *x /* (rows, in) */, int64_t rows, int64_t in, int count,
                   const KvMat *ws /* (count) -> (outs[j], in), as stored */,
                   const int64_t *outs /* (count) */,
                   float *const *ys /* (count) -> (rows, outs[j]) */);

/* kv_matmul_multi's contract for one or two rows against weights stored as
 * BF16 (the decode matvec of a BF16 checkpoint): the weights widened in
 * registers by an AVX-512 kernel (16 at a time) or an AVX2 one (8), bitwise
 * kv_dot on the widened values. Returns false, touching nothing, unless
 * every matrix is BF16, rows is 1 or 2 and the current path is
 * KV_GEMM_AVX512 or KV_GEMM_AVX2. */
bool kv_gemv_stored(const float *x /* (rows, in) */, int64_t rows, int64_t in, int count,
                    const KvMat *ws /* (count) -> (outs[j], in) BF16 */,
                    const int64_t *outs /* (count) */,
                    float *const *ys /* (count) -> (rows, outs[j]) */);

#endif
