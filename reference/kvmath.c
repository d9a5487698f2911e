/* kvmath.c: the reference's numeric building blocks. Every function here
 * follows the exact contract written in kvmath.h; the contracts are what
 * makes the reference bitwise reproducible for any thread count, so change
 * the header first if a pattern must change. */
#include "kvmath.h"
#include "attend_simd.h"
#include "gemm.h"
#include "kvmath_lanes.h"

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Four 4-wide vectors hold the 16 lanes: vector v, element e is lane
 * 4v + e. GCC vector types make the SIMD explicit instead of hoping the
 * auto-vectorizer keeps the lanes in registers (at -O2 it kept them in
 * memory); each lane still sees exactly the operations of the contract. */
typedef float KvF4 __attribute__((vector_size(16)));

static inline KvF4 kv_load4(const float *p) {
    KvF4 v;
    memcpy(&v, p, sizeof v); /* unaligned load without UB */
    return v;
}

float kv_dot(const float *a, const float *b, int64_t n) {
    KvF4 l0 = {0.0f, 0.0f, 0.0f, 0.0f}; /* lanes 0..3 */
    KvF4 l1 = l0;                       /* lanes 4..7 */
    KvF4 l2 = l0;                       /* lanes 8..11 */
    KvF4 l3 = l0;                       /* lanes 12..15 */
    int64_t n16 = n - n % KV_DOT_LANES;
    for (int64_t i = 0; i < n16; i += KV_DOT_LANES) {
        l0 += kv_load4(a + i) * kv_load4(b + i);
        l1 += kv_load4(a + i + 4) * kv_load4(b + i + 4);
        l2 += kv_load4(a + i + 8) * kv_load4(b + i + 8);
        l3 += kv_load4(a + i + 12) * kv_load4(b + i + 12);
    }
    float lanes[KV_DOT_LANES];
    memcpy(lanes, &l0, 16);
    memcpy(lanes + 4, &l1, 16);
    memcpy(lanes + 8, &l2, 16);
    memcpy(lanes + 12, &l3, 16);
    return kv_dot_tail(a, b, n16, n, kv_lanes_sum(lanes));
}

/* Rows per block: the unit of work an OpenMP thread takes. Results do not
 * depend on it. */
#define KV_MM_ROWS 4

/* Software prefetch distance for the weight streams, into L2 (locality 2:
 * prefetcht1 on x86). Measured on this project's machine kind, the
 * gemma2-medium decode's matmuls alone at two threads with huge pages: no
 * prefetch 24 GB/s; 4, 8 and 16 KiB ahead all 32-34 GB/s (memcpy reaches
 * 42-46 GB/s read+write); the whole decode at 8 KiB: into L1 13.6-14.1
 * ms/token, into L2 13.3-13.7. Timing only: results do not depend on it. */
#define KV_PREFETCH_BYTES 8192

/* Prefetch for a weight row being read at element i. Address arithmetic on
 * integers, so no out-of-bounds pointer is formed; a prefetch never faults. */
static inline void kv_prefetch_row(const float *w, int64_t i) {
    __builtin_prefetch((const void *)((uintptr_t)(w + i) + KV_PREFETCH_BYTES), 0, 2);
}

/* The 16 lane sums of KV_MM_ROWS dot products x . w[r] over the first n16
 * elements, two rows at a time sharing each x load (what brings the
 * memory-bound decode matvec close to the read bandwidth). Four 4-wide
 * vectors per row hold the 16 lanes, vector v element e being lane 4v + e,
 * each lane getting a separate multiply and add per element in ascending i:
 * kv_dot's pattern, so with the tree and tail of kv_matmul_block every output
 * is bitwise kv_dot(x, w[r], n).
 *
 * Every accumulator is a named variable, and two rows (8 accumulators, 4 x
 * vectors) fit the 16 SSE registers, so nothing spills. The earlier form
 * (arrays of accumulators, four rows) was kept on the stack at -O2, and those
 * stores aliased (4 KiB) with the weight loads: the gemma2-medium matmuls ran
 * at 27 GB/s instead of 33, and at 25-31 depending on where the weights sat
 * in their pages. AVX2 and AVX-512 forms of this loop measured no faster
 * (memory-bound), so there is one portable kernel.
 *
 * noinline, measured: inlined into kv_matmul_block, the same loop (the same
 * instructions, reordered and in other registers) made the gemma2-medium
 * decode at two threads 15.4-16.6 ms/token instead of 13.2-14.1, and one
 * thread 15% slower. The cause was not pinned down; bench_decode shows it. */
__attribute__((noinline)) static void kv_dot_rows(const float *x, const float *w0, int64_t n,
                                                  int64_t n16,
                                                  float lanes[KV_MM_ROWS][KV_DOT_LANES]) {
    for (int r = 0; r < KV_MM_ROWS; r += 2) {
        const float *wa = w0 + r * n;
        const float *wb = wa + n;
        KvF4 a0 = {0.0f, 0.0f, 0.0f, 0.0f}, a1 = a0, a2 = a0, a3 = a0;
        KvF4 b0 = a0, b1 = a0, b2 = a0, b3 = a0;
        for (int64_t i = 0; i < n16; i += KV_DOT_LANES) {
            kv_prefetch_row(wa, i);
            kv_prefetch_row(wb, i);
            const KvF4 x0 = kv_load4(x + i), x1 = kv_load4(x + i + 4);
            const KvF4 x2 = kv_load4(x + i + 8), x3 = kv_load4(x + i + 12);
            a0 += kv_load4(wa + i) * x0;
            a1 += kv_load4(wa + i + 4) * x1;
            a2 += kv_load4(wa + i + 8) * x2;
            a3 += kv_load4(wa + i + 12) * x3;
            b0 += kv_load4(wb + i) * x0;
            b1 += kv_load4(wb + i + 4) * x1;
            b2 += kv_load4(wb + i + 8) * x2;
            b3 += kv_load4(wb + i + 12) * x3;
        }
        memcpy(lanes[r], &a0, 16);
        memcpy(lanes[r] + 4, &a1, 16);
        memcpy(lanes[r] + 8, &a2, 16);
        memcpy(lanes[r] + 12, &a3, 16);
        memcpy(lanes[r + 1], &b0, 16);
        memcpy(lanes[r + 1] + 4, &b1, 16);
        memcpy(lanes[r + 1] + 8, &b2, 16);
        memcpy(lanes[r + 1] + 12, &b3, 16);
    }
}

/* Rows r of y[o .. o + KV_MM_ROWS) for one block; wb: the block's weight
 * rows as F32. */
static void kv_matmul_block(const float *x, const float *wb /* (KV_MM_ROWS, in) */, int64_t rows,
                            int64_t in, int64_t out, int64_t o, float *y) {
    const int64_t n16 = in - in % KV_DOT_LANES;
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * in; /* (in) */
        float lanes[KV_MM_ROWS][KV_DOT_LANES];
        kv_dot_rows(xr, wb, in, n16, lanes);
        for (int k = 0; k < KV_MM_ROWS; k++) {
            y[r * out + o + k] = kv_dot_tail(xr, wb + k * in, n16, in, kv_lanes_sum(lanes[k]));
        }
    }
}

/* Elements widened per step of kv_dot_mat: a multiple of KV_DOT_LANES. */
#define KV_DOT_MAT_CHUNK 256

float kv_dot_mat(const float *x, KvMat w, int64_t row, int64_t n) {
    if (w.dtype == KV_DTYPE_F32) return kv_dot(x, (const float *)w.data + row * n, n);
    /* kv_dot's lanes carried across chunks of widened weights: each lane
     * still adds its products in ascending i from zero. */
    KvF4 l0 = {0.0f, 0.0f, 0.0f, 0.0f}, l1 = l0, l2 = l0, l3 = l0;
    float wc[KV_DOT_MAT_CHUNK]; /* (chunk) the row's widened elements */
    const int64_t n16 = n - n % KV_DOT_LANES;
    for (int64_t c0 = 0; c0 < n16; c0 += KV_DOT_MAT_CHUNK) {
        const int64_t c1 = c0 + KV_DOT_MAT_CHUNK < n16 ? c0 + KV_DOT_MAT_CHUNK : n16;
        kv_mat_widen(w, row * n + c0, c1 - c0, wc);
        for (int64_t i = c0; i < c1; i += KV_DOT_LANES) {
            const float *wi = wc + (i - c0);
            l0 += kv_load4(x + i) * kv_load4(wi);
            l1 += kv_load4(x + i + 4) * kv_load4(wi + 4);
            l2 += kv_load4(x + i + 8) * kv_load4(wi + 8);
            l3 += kv_load4(x + i + 12) * kv_load4(wi + 12);
        }
    }
    float lanes[KV_DOT_LANES];
    memcpy(lanes, &l0, 16);
    memcpy(lanes + 4, &l1, 16);
    memcpy(lanes + 8, &l2, 16);
    memcpy(lanes + 12, &l3, 16);
    float s = kv_lanes_sum(lanes);
    for (int64_t i = n16; i < n; i++) s += x[i] * kv_mat_at(w, row * n + i);
    return s;
}

void kv_matmul_multi(const float *x, int64_t rows, int64_t in, int count, const KvMat *ws,
                     const int64_t *outs, float *const *ys) {
    /* Several rows share every weight load there: the blocked GEMM (gemm.c),
     * bitwise the same outputs. One row (the decode matvec) is memory-bound
     * and stays on the row kernel below, tuned for that; one or two rows
     * against BF16 weights, where widening makes the row kernel
     * compute-bound, take gemm.c's AVX-512 matvec. */
    if (rows <= 2 && kv_gemv_stored(x, rows, in, count, ws, outs, ys)) return;
    if (rows > 1 && kv_gemm_multi(x, rows, in, count, ws, outs, ys)) return;
    int64_t work = 0;
    bool stored = false; /* some matrix is not F32: blocks are widened first */
    for (int j = 0; j < count; j++) {
        work += rows * in * outs[j];
        stored = stored || ws[j].dtype != KV_DTYPE_F32;
    }
#pragma omp parallel if (work >= kv_parallel_min_work())
    {
        /* (KV_MM_ROWS, in): a block's weight rows widened, per thread */
        float *scratch = stored ? malloc((size_t)(KV_MM_ROWS * in) * sizeof(float) + 1) : NULL;
        for (int j = 0; j < count; j++) {
            const int64_t blocks = outs[j] / KV_MM_ROWS;
            const bool direct = ws[j].dtype == KV_DTYPE_F32 || scratch != NULL;
            /* nowait: the matrices are independent, so threads move on to
             * the next one without a barrier in between. */
#pragma omp for schedule(static) nowait
            for (int64_t blk = 0; blk < blocks; blk++) {
                const int64_t o = blk * KV_MM_ROWS;
                if (direct) {
                    const float *wb = kv_mat_rows(ws[j], in, o, KV_MM_ROWS, scratch);
                    kv_matmul_block(x, wb, rows, in, outs[j], o, ys[j]);
                    continue;
                }
                /* no scratch (out of memory): the same dots, widened in chunks */
                for (int64_t k = 0; k < KV_MM_ROWS; k++) {
                    for (int64_t r = 0; r < rows; r++) {
                        ys[j][r * outs[j] + o + k] = kv_dot_mat(x + r * in, ws[j], o + k, in);
                    }
                }
            }
        }
        free(scratch);
    }
    /* Tails (out not a multiple of KV_MM_ROWS): one kv_dot each. */
    for (int j = 0; j < count; j++) {
        for (int64_t o = outs[j] / KV_MM_ROWS * KV_MM_ROWS; o < outs[j]; o++) {
            for (int64_t r = 0; r < rows; r++) {
                ys[j][r * outs[j] + o] = kv_dot_mat(x + r * in, ws[j], o, in);
            }
        }
    }
}

float kv_round_tf32(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7f800000u) == 0x7f800000u) return f; /* NaN, infinity */
    /* Keep 10 of 23 mantissa bits: add half an ulp of the result (minus one
     * when the kept lsb is 0: ties to even), then truncate. A carry into the
     * exponent is the correct rounding up. */
    u += 0x00000fffu + ((u >> 13) & 1u);
    u &= ~0x00001fffu;
    memcpy(&f, &u, sizeof f);
    return f;
}

KvStatus kv_matmul_tf32(const float *x, KvMat w, int64_t rows, int64_t in, int64_t out,
                        float *y) {
    float *xr = malloc((size_t)(rows * in > 0 ? rows * in : 1) * sizeof *xr); /* (rows, in) */
    if (xr == NULL) return KV_ERR_INTERNAL;
    for (int64_t i = 0; i < rows * in; i++) xr[i] = kv_round_tf32(x[i]);
    bool oom = false;
    /* Each output is one kv_dot of rounded rows, whichever thread runs it. */
#pragma omp parallel if (rows * in * out >= kv_parallel_min_work())
    {
        float *wr = malloc((size_t)(in > 0 ? in : 1) * sizeof *wr); /* (in) */
        if (wr == NULL) {
#pragma omp atomic write
            oom = true;
        }
#pragma omp for schedule(static)
        for (int64_t o = 0; o < out; o++) {
            if (wr == NULL) continue;
            kv_mat_widen(w, o * in, in, wr);
            for (int64_t i = 0; i < in; i++) wr[i] = kv_round_tf32(wr[i]);
            for (int64_t r = 0; r < rows; r++) y[r * out + o] = kv_dot(xr + r * in, wr, in);
        }
        free(wr);
    }
    free(xr);
    return oom ? KV_ERR_INTERNAL : KV_OK;
}

/* Outputs summed side by side in the sequential kernel: each accumulator
 * is still one output's ascending sum (the bits of one at a time), but
 * eight outputs sit in the lanes of one vector (a block of weight rows
 * transposed so their i-th elements are adjacent) and four input rows run
 * at once: 4 x 8 independent chains hide the add latency, and each lane
 * does the scalar kernel's mul then add, so the bits are the scalar's. */
#define KV_SEQ_OUT_BLOCK 8
#define KV_SEQ_ROWS 4
typedef float KvSeqLanes __attribute__((vector_size(KV_SEQ_OUT_BLOCK * sizeof(float))));
_Static_assert(KV_SEQ_OUT_BLOCK == 8, "the lane splats below write eight values");

/* One block of n < KV_SEQ_OUT_BLOCK outputs from o0 on, or any block when
 * no scratch could be allocated: one output at a time, its weight row
 * widened a chunk at a time (still one ascending sum per output). */
static void seq_block_scalar(const float *x /* (rows, in) */, KvMat w /* (out, in) */,
                             int64_t rows, int64_t in, int64_t o0, int64_t n, int64_t out,
                             float *y /* (rows, out) */) {
    float wc[KV_DOT_MAT_CHUNK]; /* (chunk) widened weights */
    for (int64_t k = 0; k < n; k++) {
        for (int64_t r = 0; r < rows; r++) {
            float acc = 0.0f;
            for (int64_t c0 = 0; c0 < in; c0 += KV_DOT_MAT_CHUNK) {
                const int64_t c1 = c0 + KV_DOT_MAT_CHUNK < in ? c0 + KV_DOT_MAT_CHUNK : in;
                kv_mat_widen(w, (o0 + k) * in + c0, c1 - c0, wc);
                for (int64_t i = c0; i < c1; i++) acc += x[r * in + i] * wc[i - c0];
            }
            y[r * out + o0 + k] = acc;
        }
    }
}

/* Eight outputs from o0 on as eight scalar chains over their weight rows
 * wb, each read in order: one ascending sum per output. */
static void seq_eight_rows(const float *x /* (rows, in) */, const float *wb /* (8, in) */,
                           int64_t rows, int64_t in, int64_t out, int64_t o0,
                           float *y /* (rows, out) */) {
    const float *w0 = wb, *w1 = wb + in, *w2 = wb + 2 * in, *w3 = wb + 3 * in;
    const float *w4 = wb + 4 * in, *w5 = wb + 5 * in, *w6 = wb + 6 * in, *w7 = wb + 7 * in;
    for (int64_t q = 0; q < rows; q++) {
        const float *xr = x + q * in; /* (in) */
        float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
        float a4 = 0.0f, a5 = 0.0f, a6 = 0.0f, a7 = 0.0f;
        for (int64_t i = 0; i < in; i++) {
            const float xi = xr[i];
            a0 += xi * w0[i];
            a1 += xi * w1[i];
            a2 += xi * w2[i];
            a3 += xi * w3[i];
            a4 += xi * w4[i];
            a5 += xi * w5[i];
            a6 += xi * w6[i];
            a7 += xi * w7[i];
        }
        float *yr = y + q * out + o0; /* (KV_SEQ_OUT_BLOCK) */
        yr[0] = a0;
        yr[1] = a1;
        yr[2] = a2;
        yr[3] = a3;
        yr[4] = a4;
        yr[5] = a5;
        yr[6] = a6;
        yr[7] = a7;
    }
}

/* Fewer than KV_SEQ_ROWS input rows (a decode step's): transposing a
 * weight block would cost more than the few rows' sums, so eight outputs
 * run as eight scalar chains over their weight rows, each read in order
 * (still one ascending sum per output: the scalar kernel's bits). */
static void seq_few_rows(const float *x /* (rows, in) */, KvMat w /* (out, in) */, int64_t rows,
                         int64_t in, int64_t out, float *y /* (rows, out) */) {
    const int64_t blocks = (out + KV_SEQ_OUT_BLOCK - 1) / KV_SEQ_OUT_BLOCK;
#pragma omp parallel if (rows * in * out >= kv_parallel_min_work())
    {
        /* (KV_SEQ_OUT_BLOCK, in): a block's rows widened, per thread; F32 is read in place */
        float *scratch = w.dtype != KV_DTYPE_F32
                             ? malloc((size_t)(KV_SEQ_OUT_BLOCK * in) * sizeof(float) + 1)
                             : NULL;
#pragma omp for schedule(static)
        for (int64_t blk = 0; blk < blocks; blk++) {
            const int64_t o0 = blk * KV_SEQ_OUT_BLOCK;
            const int64_t n = out - o0 < KV_SEQ_OUT_BLOCK ? out - o0 : KV_SEQ_OUT_BLOCK;
            if (n < KV_SEQ_OUT_BLOCK || (w.dtype != KV_DTYPE_F32 && scratch == NULL)) {
                seq_block_scalar(x, w, rows, in, o0, n, out, y);
                continue;
            }
            const float *wb = kv_mat_rows(w, in, o0, n, scratch); /* (n, in) */
            seq_eight_rows(x, wb, rows, in, out, o0, y);
        }
        free(scratch);
    }
}

/* Every row of x against one transposed block wt of KV_SEQ_OUT_BLOCK
 * outputs from o0 on: four rows at once in named accumulators (GCC keeps
 * an array of vectors on the stack), then one at a time. Inlined into a
 * plain, an AVX2 and an AVX-512 wrapper: the same IEEE multiply then add per lane
 * either way (-ffp-contract=off), so the same bits. */
static inline __attribute__((always_inline)) void
seq_block_rows(const float *x /* (rows, in) */, const KvSeqLanes *wt /* (in) */, int64_t rows,
               int64_t in, int64_t out, int64_t o0, float *y /* (rows, out) */) {
    int64_t r0 = 0;
    for (; r0 + KV_SEQ_ROWS <= rows; r0 += KV_SEQ_ROWS) {
        const float *x0 = x + r0 * in, *x1 = x0 + in, *x2 = x1 + in, *x3 = x2 + in; /* (in) */
        KvSeqLanes a0 = {0.0f}, a1 = {0.0f}, a2 = {0.0f}, a3 = {0.0f};
        for (int64_t i = 0; i < in; i++) {
            const KvSeqLanes v0 = {x0[i], x0[i], x0[i], x0[i], x0[i], x0[i], x0[i], x0[i]};
            const KvSeqLanes v1 = {x1[i], x1[i], x1[i], x1[i], x1[i], x1[i], x1[i], x1[i]};
            const KvSeqLanes v2 = {x2[i], x2[i], x2[i], x2[i], x2[i], x2[i], x2[i], x2[i]};
            const KvSeqLanes v3 = {x3[i], x3[i], x3[i], x3[i], x3[i], x3[i], x3[i], x3[i]};
            a0 += v0 * wt[i];
            a1 += v1 * wt[i];
            a2 += v2 * wt[i];
            a3 += v3 * wt[i];
        }
        for (int k = 0; k < KV_SEQ_OUT_BLOCK; k++) {
            y[r0 * out + o0 + k] = a0[k];
            y[(r0 + 1) * out + o0 + k] = a1[k];
            y[(r0 + 2) * out + o0 + k] = a2[k];
            y[(r0 + 3) * out + o0 + k] = a3[k];
        }
    }
    for (; r0 < rows; r0++) {
        const float *xr = x + r0 * in; /* (in) */
        KvSeqLanes acc = {0.0f};
        for (int64_t i = 0; i < in; i++) {
            const KvSeqLanes xv = {xr[i], xr[i], xr[i], xr[i], xr[i], xr[i], xr[i], xr[i]};
            acc += xv * wt[i];
        }
        for (int k = 0; k < KV_SEQ_OUT_BLOCK; k++) y[r0 * out + o0 + k] = acc[k];
    }
}

typedef void (*SeqBlockFn)(const float *, const KvSeqLanes *, int64_t, int64_t, int64_t, int64_t,
                           float *);

static void seq_block_plain(const float *x, const KvSeqLanes *wt, int64_t rows, int64_t in,
                            int64_t out, int64_t o0, float *y) {
    seq_block_rows(x, wt, rows, in, out, o0, y);
}

#if defined(__x86_64__) && defined(__GNUC__)
#define KV_SEQ_X86 1
/* The same code with AVX-512 enabled (a block's eight lanes in one
 * register), taken when the GEMM's path is (gemm.h). */
__attribute__((target("avx512f"))) static void
seq_block_wide(const float *x, const KvSeqLanes *wt, int64_t rows, int64_t in, int64_t out,
               int64_t o0, float *y) {
    seq_block_rows(x, wt, rows, in, out, o0, y);
}

/* And with AVX2 (the eight lanes in one 256-bit register). */
__attribute__((target("avx2"))) static void
seq_block_avx2(const float *x, const KvSeqLanes *wt, int64_t rows, int64_t in, int64_t out,
               int64_t o0, float *y) {
    seq_block_rows(x, wt, rows, in, out, o0, y);
}
#else
#define KV_SEQ_X86 0
#endif

void kv_matmul_sequential(const float *x, KvMat w, int64_t rows, int64_t in, int64_t out,
                          float *y) {
    if (rows < KV_SEQ_ROWS) {
        seq_few_rows(x, w, rows, in, out, y);
        return;
    }
    SeqBlockFn block = seq_block_plain;
#if KV_SEQ_X86
    if (kv_gemm_path() == KV_GEMM_AVX512) block = seq_block_wide;
    if (kv_gemm_path() == KV_GEMM_AVX2) block = seq_block_avx2;
#endif
    const int64_t blocks = (out + KV_SEQ_OUT_BLOCK - 1) / KV_SEQ_OUT_BLOCK;
#pragma omp parallel if (rows * in * out >= kv_parallel_min_work())
    {
        /* (in) lanes, aligned for the vector type: a block transposed, per thread */
        KvSeqLanes *wt = aligned_alloc(sizeof *wt, (size_t)in * sizeof *wt + sizeof *wt);
        /* (KV_SEQ_OUT_BLOCK, in): the block's rows widened; F32 is read in place */
        float *scratch = w.dtype != KV_DTYPE_F32
                             ? malloc((size_t)(KV_SEQ_OUT_BLOCK * in) * sizeof(float) + 1)
                             : NULL;
#pragma omp for schedule(static)
        for (int64_t blk = 0; blk < blocks; blk++) {
            const int64_t o0 = blk * KV_SEQ_OUT_BLOCK;
            const int64_t n = out - o0 < KV_SEQ_OUT_BLOCK ? out - o0 : KV_SEQ_OUT_BLOCK;
            if (n < KV_SEQ_OUT_BLOCK || wt == NULL ||
                (w.dtype != KV_DTYPE_F32 && scratch == NULL)) {
                seq_block_scalar(x, w, rows, in, o0, n, out, y);
                continue;
            }
            const float *wb = kv_mat_rows(w, in, o0, n, scratch); /* (n, in) */
            for (int k = 0; k < KV_SEQ_OUT_BLOCK; k++) {
                const float *src = wb + k * in; /* (in) one weight row, read in order */
                for (int64_t i = 0; i < in; i++) wt[i][k] = src[i];
            }
            block(x, wt, rows, in, out, o0, y);
        }
        free(scratch);
        free(wt);
    }
}

void kv_matmul_mat(const float *x, KvMat w, int64_t rows, int64_t in, int64_t out, float *y) {
    /* Outputs are split across threads in blocks of KV_MM_ROWS; each y
     * element is computed by one thread with kv_dot's exact pattern, so the
     * result does not depend on the thread count. A block of weight rows
     * stays in cache while every input row uses it. */
    kv_matmul_multi(x, rows, in, 1, &w, &out, &y);
}

void kv_matmul(const float *x, const float *w, int64_t rows, int64_t in, int64_t out, float *y) {
    kv_matmul_mat(x, kv_mat_f32(w), rows, in, out, y);
}

void kv_rmsnorm(const float *x, const float *w, int64_t n, float eps, bool offset, float *out) {
    float mean = kv_dot(x, x, n) / (float)n;
    float r = 1.0f / sqrtf(mean + eps);
    for (int64_t i = 0; i < n; i++) {
        float xn = x[i] * r;
        /* gemma2 stores w as an offset from 1 (Gemma2RMSNorm: * (1 + w));
         * mistral/llama multiply by w (weight * hidden_states). */
        out[i] = offset ? xn * (1.0f + w[i]) : w[i] * xn;
    }
}

void kv_rope_inv_freq(int64_t head_dim, double theta, float *inv_freq) {
    /* transformers: 1.0 / (base ** (arange(0, dim, 2).float() / dim)), all F32. */
    for (int64_t i = 0; i < head_dim / 2; i++) {
        float e = (float)(2 * i) / (float)head_dim;
        inv_freq[i] = 1.0f / powf((float)theta, e);
    }
}

void kv_rope_inv_freq_yarn(int64_t head_dim, double theta, double factor, double beta_fast,
                           double beta_slow, double orig_max_pos, bool truncate,
                           float *inv_freq) {
    /* transformers' _compute_yarn_parameters, op for op: the correction
     * range in Python doubles, the ramp and the blend in F32 (a Python
     * scalar meeting an F32 tensor is rounded to F32 first). */
    const double dim = (double)head_dim;
    const double two_pi = 2.0 * 3.14159265358979323846;
    double low = dim * log(orig_max_pos / (beta_fast * two_pi)) / (2.0 * log(theta));
    double high = dim * log(orig_max_pos / (beta_slow * two_pi)) / (2.0 * log(theta));
    if (truncate) {
        low = floor(low);
        high = ceil(high);
    }
    if (low < 0.0) low = 0.0;
    if (high > dim - 1.0) high = dim - 1.0;
    if (low == high) high += 0.001; /* "Prevent singularity" */
    const float f_low = (float)low, f_span = (float)(high - low), f_factor = (float)factor;
    for (int64_t i = 0; i < head_dim / 2; i++) {
        const float e = (float)(2 * i) / (float)head_dim;
        const float pos_freq = powf((float)theta, e);
        const float extra = 1.0f / pos_freq;
        const float inter = 1.0f / (f_factor * pos_freq);
        float ramp = ((float)i - f_low) / f_span;
        ramp = ramp < 0.0f ? 0.0f : (ramp > 1.0f ? 1.0f : ramp);
        const float extra_factor = 1.0f - ramp;
        inv_freq[i] = inter * (1.0f - extra_factor) + extra * extra_factor;
    }
}

void kv_rope_layer_inv_freq(const KvConfig *c, int64_t layer, float *inv_freq) {
    if (c->rope_yarn) {
        kv_rope_inv_freq_yarn(c->head_dim, c->rope_theta, c->rope_factor, c->rope_beta_fast,
                              c->rope_beta_slow, c->rope_orig_max_pos, c->rope_truncate,
                              inv_freq);
    } else {
        kv_rope_inv_freq(c->head_dim, kv_config_layer_rope_theta(c, layer), inv_freq);
    }
}

float kv_rope_scale(const KvConfig *c) {
    return c->rope_yarn ? (float)c->rope_attention_factor : 1.0f;
}

void kv_rope_apply(float *x, int64_t head_dim, const float *inv_freq, int64_t pos) {
    kv_rope_apply_scaled(x, head_dim, inv_freq, pos, 1.0f);
}

void kv_rope_apply_scaled(float *x, int64_t head_dim, const float *inv_freq, int64_t pos,
                          float scale) {
    int64_t h = head_dim / 2;
    for (int64_t i = 0; i < h; i++) {
        float angle = (float)pos * inv_freq[i];
        /* YaRN's attention factor multiplies cos and sin (x 1 is exact) */
        float c = cosf(angle) * scale;
        float s = sinf(angle) * scale;
        float a = x[i];
        float b = x[i + h];
        /* q * cos + rotate_half(q) * sin, rotate_half(q) = cat(-q2, q1). */
        x[i] = a * c - b * s;
        x[i + h] = b * c + a * s;
    }
}

float kv_softcap(float x, float cap) {
    if (cap <= 0.0f) return x;
    return tanhf(x / cap) * cap;
}

float kv_gelu_tanh(float x) {
    const float k_beta = 0.7978845608028654f; /* sqrt(2 / pi) */
    const float k_kappa = 0.044715f;
    float inner = k_beta * (x + k_kappa * x * x * x);
    return 0.5f * x * (1.0f + tanhf(inner));
}

float kv_silu(float x) {
    return x / (1.0f + expf(-x));
}

void kv_softmax(float *x, int64_t n) {
    if (n <= 0) return;
    float mx = x[0];
    for (int64_t i = 1; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    float sum = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        x[i] = expf(x[i] - mx);
        sum += x[i];
    }
    for (int64_t i = 0; i < n; i++) x[i] = x[i] / sum;
}

/* out[d] = sum over j ascending of p[j] * v[j][d], from 0, one multiply and
 * one add per term: the plain loop's bits for each d. Sixteen d's at a time
 * in four vector registers across all keys (each output element is one
 * lane, so the vector width cannot change a bit), then 4, then 1. */
static void kv_weighted_sum(const float *p /* (nk) */, const float *const *v, int64_t nk,
                            int64_t hd, float *out /* (hd) */) {
    int64_t d = 0;
    for (; d + 16 <= hd; d += 16) {
        KvF4 a0 = {0.0f, 0.0f, 0.0f, 0.0f}, a1 = a0, a2 = a0, a3 = a0;
        for (int64_t j = 0; j < nk; j++) {
            const KvF4 pj = {p[j], p[j], p[j], p[j]};
            const float *vj = v[j] + d;
            a0 = a0 + pj * kv_load4(vj);
            a1 = a1 + pj * kv_load4(vj + 4);
            a2 = a2 + pj * kv_load4(vj + 8);
            a3 = a3 + pj * kv_load4(vj + 12);
        }
        memcpy(out + d, &a0, 16);
        memcpy(out + d + 4, &a1, 16);
        memcpy(out + d + 8, &a2, 16);
        memcpy(out + d + 12, &a3, 16);
    }
    for (; d + 4 <= hd; d += 4) {
        KvF4 a0 = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int64_t j = 0; j < nk; j++) {
            const KvF4 pj = {p[j], p[j], p[j], p[j]};
            a0 = a0 + pj * kv_load4(v[j] + d);
        }
        memcpy(out + d, &a0, 16);
    }
    for (; d < hd; d++) {
        float acc = 0.0f;
        for (int64_t j = 0; j < nk; j++) acc = acc + p[j] * v[j][d];
        out[d] = acc;
    }
}

/* scores[j] = kv_dot(q, k[j], hd): in AVX-512 where it runs (the same bits,
 * attend_simd.h). */
static void attend_dots(const float *q /* (hd) */, const float *const *k /* (nk) -> (hd) */,
                        int64_t nk, int64_t hd, bool simd, float *scores /* (nk) */) {
    if (simd) {
        kv_attend_dots_avx512(q, k, nk, hd, scores);
        return;
    }
    for (int64_t j = 0; j < nk; j++) scores[j] = kv_dot(q, k[j], hd);
}

/* kv_weighted_sum, in AVX-512 where it runs and hd allows. */
static void attend_weighted_sum(const float *p /* (nk) */, const float *const *v, int64_t nk,
                                int64_t hd, bool simd, float *out /* (hd) */) {
    if (simd && hd % 64 == 0) {
        kv_weighted_sum_avx512(p, v, nk, hd, out);
        return;
    }
    kv_weighted_sum(p, v, nk, hd, out);
}

void kv_attend_weights(float *x, int64_t nk, float scale, float cap, const float *sink) {
    if (sink == NULL) {
        for (int64_t j = 0; j < nk; j++) x[j] = kv_softcap(x[j] * scale, cap);
        kv_softmax(x, nk);
        return;
    }
    /* gpt_oss (eager_attention_forward): the sink is a last column of the
     * logits, the row max taken over it too, the softmax over n + 1 values
     * (summed in column order, the sink last), the sink's share dropped. */
    float mx = *sink;
    for (int64_t j = 0; j < nk; j++) {
        x[j] = x[j] * scale;
        mx = x[j] > mx ? x[j] : mx;
    }
    float sum = 0.0f;
    for (int64_t j = 0; j < nk; j++) {
        x[j] = expf(x[j] - mx);
        sum += x[j];
    }
    sum += expf(*sink - mx);
    for (int64_t j = 0; j < nk; j++) x[j] = x[j] / sum;
}

void kv_attend_sink(const float *q, const float *const *k, const float *const *v, int64_t nk,
                    int64_t hd, float scale, float sink, float *scores, float *out) {
    const bool simd = kv_attend_simd_on();
    attend_dots(q, k, nk, hd, simd, scores);
    kv_attend_weights(scores, nk, scale, 0.0f, &sink);
    attend_weighted_sum(scores, v, nk, hd, simd, out);
}

void kv_attend(const float *q, const float *const *k, const float *const *v, int64_t nk,
               int64_t hd, float scale, float cap, float *scores, float *out) {
    if (nk == 0) {
        for (int64_t d = 0; d < hd; d++) out[d] = 0.0f;
        return;
    }
    const bool simd = kv_attend_simd_on();
    attend_dots(q, k, nk, hd, simd, scores);
    kv_attend_weights(scores, nk, scale, cap, NULL);
    attend_weighted_sum(scores, v, nk, hd, simd, out);
}

int64_t kv_gqa_kv_head(int64_t head, int64_t num_heads, int64_t num_kv_heads) {
    return head / (num_heads / num_kv_heads);
}

bool kv_window_visible(int64_t q, int64_t k, int64_t window) {
    if (k > q) return false;
    return window == 0 || q - window < k;
}

int32_t kv_argmax(const float *x, int64_t n, float *margin) {
    int64_t best = 0;
    for (int64_t i = 1; i < n; i++) {
        if (x[i] > x[best]) best = i; /* strict: ties keep the lowest id */
    }
    if (margin != NULL) {
        float second = -INFINITY;
        for (int64_t i = 0; i < n; i++) {
            if (i != best && x[i] > second) second = x[i];
        }
        *margin = n > 1 ? x[best] - second : INFINITY;
    }
    return (int32_t)best;
}
