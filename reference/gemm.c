/* gemm.c: the blocked matmul for rows > 1 (gemm.h).
 *
 * Why it is fast: kvmath.c's row kernel computes each output as its own dot
 * product with 4-wide SSE vectors, reloading x for every 4 outputs, so a long
 * prefill runs at a fraction of what the cores can do. Here a micro-kernel
 * keeps GEMM_MR x rows by GEMM_NR weight rows of outputs in registers, each
 * output's 16 lanes in one __m512: per 16 input elements it loads MR + NR
 * vectors and does MR * NR vector multiplies and adds, so it is bound by the
 * floating-point pipes, not by loads.
 *
 * Why it is still bitwise kv_dot: output (r, o)'s accumulator is kv_dot's
 * 16 lanes exactly: lane j gets x[r][i] * w[o][i] (one rounded multiply)
 * added (one rounded add) for i % 16 == j in ascending i, starting from 0.
 * An AVX-512 vmulps / vaddps is 16 independent IEEE single operations, the
 * same ones the SSE form does 4 at a time (no FMA: -ffp-contract=off, no fma
 * intrinsics; no DAZ/FTZ, so denormals behave the same). Splitting `in` into
 * blocks of GEMM_KC elements (for cache reuse) stores the lanes to memory and
 * reloads them between blocks, which changes no lane's sequence of adds.
 * Each finished accumulator goes through the same tree (vector adds of the
 * same operand pairs as kv_lanes_sum) and the same scalar tail
 * (kv_dot_tail). Each output is computed by one thread, start to end, so
 * the thread count and the blocking never change a bit.
 *
 * Blocking, per job (GEMM_MC x rows by GEMM_NC outputs of one matrix; jobs
 * are the unit of OpenMP work): for each block of MR rows, for each pass over
 * KC elements of `in`, the rows' x is packed (aligned, the MR vectors of a
 * step side by side: 24 KiB, in L1) and meets every NR-output tile of the
 * job, whose weights come from L2 (the job's NC x in block fits there); the
 * tiles' lane accumulators (NC x MR x 16 floats, 24 KiB) wait on the stack
 * between passes. Measured on the medium fixtures' shapes (in 768 and 2048)
 * at one thread: this order (x in L1, weights from L2) 170-190 GFLOP/s; the
 * weight tile held in L1 and x from L2 instead, 140-160; KC 512 or NC 32,
 * 3-5% slower; MC 24 to 96 within noise. With a single row block (rows <=
 * MR: multi-token decode steps, small batches) there is no reuse to block
 * for: each tile's weight rows are streamed once, end to end, with kvmath.c's
 * software prefetch, as the memory-bound decode kernel does.
 *
 * Edges: a row block past the last row, or a tile past the last output,
 * reads the last valid row again (valid memory, same cost) and its results
 * are dropped; so there is one kernel shape and no masked loads. */
#define _DEFAULT_SOURCE /* MADV_HUGEPAGE */
#include "gemm.h"

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <string.h>

#include "kvmath.h"
#include "kvmath_lanes.h"
#include "kvparallel.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define KV_GEMM_X86 1
#else
#define KV_GEMM_X86 0
#endif

/* Timing only: no result depends on these. */
#define GEMM_MR 6    /* x rows per micro-tile */
#define GEMM_NR 4    /* weight rows (outputs) per micro-tile; 6 x 4 = 24 of the 32 zmm */
#define GEMM_MC 48   /* x rows per job: a multiple of GEMM_MR */
#define GEMM_NC 64   /* outputs per job: a multiple of GEMM_NR */
#define GEMM_KC 1024 /* input elements per pass: a multiple of KV_DOT_LANES */

/* As kvmath.c's KV_PREFETCH_BYTES (measured there): how far ahead a streamed
 * weight row is prefetched into L2 when there is one row block. Timing
 * only. */
#define GEMM_PREFETCH_BYTES 8192

static KvGemmPath g_gemm_path = KV_GEMM_AUTO;

bool kv_gemm_path_supported(KvGemmPath path) {
    switch (path) {
    case KV_GEMM_AUTO:
    case KV_GEMM_PORTABLE:
        return true;
    case KV_GEMM_AVX512:
#if KV_GEMM_X86
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx512f") != 0;
#else
        return false;
#endif
    case KV_GEMM_AVX2:
#if KV_GEMM_X86
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx2") != 0;
#else
        return false;
#endif
    }
    return false;
}

KvStatus kv_gemm_set_path(KvGemmPath path) {
    if (path != KV_GEMM_AUTO && path != KV_GEMM_PORTABLE && path != KV_GEMM_AVX512 &&
        path != KV_GEMM_AVX2) {
        return KV_ERR_INPUT;
    }
    if (!kv_gemm_path_supported(path)) return KV_ERR_INPUT;
    g_gemm_path = path;
    return KV_OK;
}

KvGemmPath kv_gemm_path(void) {
    if (g_gemm_path != KV_GEMM_AUTO) return g_gemm_path;
    if (kv_gemm_path_supported(KV_GEMM_AVX512)) return KV_GEMM_AVX512;
    return kv_gemm_path_supported(KV_GEMM_AVX2) ? KV_GEMM_AVX2 : KV_GEMM_PORTABLE;
}

const char *kv_gemm_path_name(KvGemmPath path) {
    switch (path) {
    case KV_GEMM_AUTO:
        return "auto";
    case KV_GEMM_PORTABLE:
        return "portable";
    case KV_GEMM_AVX512:
        return "avx512";
    case KV_GEMM_AVX2:
        return "avx2";
    }
    return "unknown";
}

#if KV_GEMM_X86

#define GEMM_AVX512 __attribute__((target("avx512f")))

/* Accumulator of tile row r (0..5), column c (0..3). Named variables, not an
 * array: at -O2 GCC keeps arrays of vectors on the stack (kvmath.c saw the
 * same), and the 24 must stay in registers. */
#define GEMM_ACC_DECL(r) __m512 a##r##0, a##r##1, a##r##2, a##r##3
#define GEMM_ACC_ZERO(r) a##r##0 = a##r##1 = a##r##2 = a##r##3 = _mm512_setzero_ps()
#define GEMM_ACC_LOAD(r)                                                                           \
    a##r##0 = _mm512_load_ps(acc[(r) * GEMM_NR + 0]);                                              \
    a##r##1 = _mm512_load_ps(acc[(r) * GEMM_NR + 1]);                                              \
    a##r##2 = _mm512_load_ps(acc[(r) * GEMM_NR + 2]);                                              \
    a##r##3 = _mm512_load_ps(acc[(r) * GEMM_NR + 3])
#define GEMM_ACC_STORE(r)                                                                          \
    _mm512_store_ps(acc[(r) * GEMM_NR + 0], a##r##0);                                              \
    _mm512_store_ps(acc[(r) * GEMM_NR + 1], a##r##1);                                              \
    _mm512_store_ps(acc[(r) * GEMM_NR + 2], a##r##2);                                              \
    _mm512_store_ps(acc[(r) * GEMM_NR + 3], a##r##3)
/* kv_dot's step for 16 elements of row r against the 4 weight vectors:
 * lanes += x * w, product first rounded, operands in kv_dot's order. */
#define GEMM_ROW_STEP(r)                                                                           \
    xv = _mm512_load_ps(xk + (r) * KV_DOT_LANES);                                                  \
    a##r##0 = _mm512_add_ps(a##r##0, _mm512_mul_ps(xv, w0));                                       \
    a##r##1 = _mm512_add_ps(a##r##1, _mm512_mul_ps(xv, w1));                                       \
    a##r##2 = _mm512_add_ps(a##r##2, _mm512_mul_ps(xv, w2));                                       \
    a##r##3 = _mm512_add_ps(a##r##3, _mm512_mul_ps(xv, w3))

/* One micro-tile over input elements [k0, k1) (multiples of 16): the lanes
 * of 6 x rows by 4 weight rows, started from zero (`first`) or from acc,
 * left in acc. prefetch: the weight rows are being streamed once (see the
 * file comment). always_inline so each call site gets a copy with
 * `prefetch` constant. */
GEMM_AVX512 __attribute__((always_inline)) static inline void
gemm_tile_avx512(const float *xpk /* (kc / 16, MR, 16), 64-byte aligned */,
                 const float *const wp[GEMM_NR] /* -> (in) */, int64_t k0, int64_t k1,
                 float acc[GEMM_MR * GEMM_NR][KV_DOT_LANES], bool first, bool prefetch) {
    const float *v0 = wp[0], *v1 = wp[1], *v2 = wp[2], *v3 = wp[3];
    GEMM_ACC_DECL(0);
    GEMM_ACC_DECL(1);
    GEMM_ACC_DECL(2);
    GEMM_ACC_DECL(3);
    GEMM_ACC_DECL(4);
    GEMM_ACC_DECL(5);
    if (first) {
        GEMM_ACC_ZERO(0);
        GEMM_ACC_ZERO(1);
        GEMM_ACC_ZERO(2);
        GEMM_ACC_ZERO(3);
        GEMM_ACC_ZERO(4);
        GEMM_ACC_ZERO(5);
    } else {
        GEMM_ACC_LOAD(0);
        GEMM_ACC_LOAD(1);
        GEMM_ACC_LOAD(2);
        GEMM_ACC_LOAD(3);
        GEMM_ACC_LOAD(4);
        GEMM_ACC_LOAD(5);
    }
    const float *xk = xpk; /* the packed x vectors of step k */
    for (int64_t k = k0; k < k1; k += KV_DOT_LANES, xk += GEMM_MR * KV_DOT_LANES) {
        if (prefetch) {
            /* Integer address arithmetic: no out-of-bounds pointer is
             * formed, and a prefetch never faults. */
            __builtin_prefetch((const void *)((uintptr_t)(v0 + k) + GEMM_PREFETCH_BYTES), 0, 2);
            __builtin_prefetch((const void *)((uintptr_t)(v1 + k) + GEMM_PREFETCH_BYTES), 0, 2);
            __builtin_prefetch((const void *)((uintptr_t)(v2 + k) + GEMM_PREFETCH_BYTES), 0, 2);
            __builtin_prefetch((const void *)((uintptr_t)(v3 + k) + GEMM_PREFETCH_BYTES), 0, 2);
        }
        const __m512 w0 = _mm512_loadu_ps(v0 + k), w1 = _mm512_loadu_ps(v1 + k);
        const __m512 w2 = _mm512_loadu_ps(v2 + k), w3 = _mm512_loadu_ps(v3 + k);
        __m512 xv;
        GEMM_ROW_STEP(0);
        GEMM_ROW_STEP(1);
        GEMM_ROW_STEP(2);
        GEMM_ROW_STEP(3);
        GEMM_ROW_STEP(4);
        GEMM_ROW_STEP(5);
    }
    GEMM_ACC_STORE(0);
    GEMM_ACC_STORE(1);
    GEMM_ACC_STORE(2);
    GEMM_ACC_STORE(3);
    GEMM_ACC_STORE(4);
    GEMM_ACC_STORE(5);
}

/* A micro-tile pass (gemm_tile_avx512's contract) behind a call, so one job
 * loop (gemm_job) serves every vector path. */
typedef void (*GemmTileFn)(const float *xpk, const float *const wp[GEMM_NR], int64_t k0,
                           int64_t k1, float acc[GEMM_MR * GEMM_NR][KV_DOT_LANES], bool first,
                           bool prefetch);

GEMM_AVX512 static void gemm_tile_avx512_call(const float *xpk, const float *const wp[GEMM_NR],
                                              int64_t k0, int64_t k1,
                                              float acc[GEMM_MR * GEMM_NR][KV_DOT_LANES],
                                              bool first, bool prefetch) {
    if (prefetch) {
        gemm_tile_avx512(xpk, wp, k0, k1, acc, first, true);
    } else {
        gemm_tile_avx512(xpk, wp, k0, k1, acc, first, false);
    }
}

/* ---- AVX2 (16 ymm registers) ---------------------------------------------
 * The same 6 x 4 tile and the same lanes, in pieces that fit: a piece is the
 * 6 x rows by 2 of the weight rows by 8 of the 16 lanes (12 accumulators, 2
 * weight vectors, an x vector), run over the whole pass, its lanes loaded
 * from acc and stored back between pieces (which changes no lane's sequence
 * of adds). The weights' pass sits in L2 for the four pieces; measured
 * against shorter runs (256 or 512 elements a piece, the weights then in
 * L1), longer runs won. */
#define GEMM_AVX2 __attribute__((target("avx2")))

#define GEMM_P_STEP(a, xv, wv) a = _mm256_add_ps(a, _mm256_mul_ps(xv, wv))

#define GEMM_P_LOAD(r)                                                                             \
    a##r##0 = zero ? _mm256_setzero_ps() : _mm256_load_ps(acc[(r) * GEMM_NR + c] + h);            \
    a##r##1 = zero ? _mm256_setzero_ps() : _mm256_load_ps(acc[(r) * GEMM_NR + c + 1] + h)
#define GEMM_P_STORE(r)                                                                            \
    _mm256_store_ps(acc[(r) * GEMM_NR + c] + h, a##r##0);                                          \
    _mm256_store_ps(acc[(r) * GEMM_NR + c + 1] + h, a##r##1)
#define GEMM_P_ROW(r)                                                                              \
    xv = _mm256_load_ps(xk + (r) * KV_DOT_LANES);                                                  \
    GEMM_P_STEP(a##r##0, xv, w0);                                                                  \
    GEMM_P_STEP(a##r##1, xv, w1)

/* Lanes h .. h + 8 of all 6 tile rows against weight rows c, c + 1 over
 * input elements [k0, k1) (an empty range zeroes them when `zero`): 12
 * accumulators, the 2 weight vectors and an x vector. */
GEMM_AVX2 __attribute__((always_inline)) static inline void
gemm_piece_avx2(const float *xpk /* (kc / 16, MR, 16) from k0 */,
                const float *const wp[GEMM_NR] /* -> (in) */, int64_t k0, int64_t k1,
                float acc[GEMM_MR * GEMM_NR][KV_DOT_LANES], int c, int h, bool zero,
                bool prefetch) {
    __m256 a00, a01, a10, a11, a20, a21, a30, a31, a40, a41, a50, a51;
    GEMM_P_LOAD(0);
    GEMM_P_LOAD(1);
    GEMM_P_LOAD(2);
    GEMM_P_LOAD(3);
    GEMM_P_LOAD(4);
    GEMM_P_LOAD(5);
    const float *v0 = wp[c] + h, *v1 = wp[c + 1] + h;
    const float *xk = xpk + h;
    for (int64_t k = k0; k < k1; k += KV_DOT_LANES, xk += GEMM_MR * KV_DOT_LANES) {
        if (prefetch) {
            __builtin_prefetch((const void *)((uintptr_t)(v0 + k) + GEMM_PREFETCH_BYTES), 0, 2);
            __builtin_prefetch((const void *)((uintptr_t)(v1 + k) + GEMM_PREFETCH_BYTES), 0, 2);
        }
        __m256 w0 = _mm256_loadu_ps(v0 + k), w1 = _mm256_loadu_ps(v1 + k);
        /* in registers: GCC would otherwise load each six times as a memory operand */
        __asm__("" : "+x"(w0), "+x"(w1));
        __m256 xv;
        GEMM_P_ROW(0);
        GEMM_P_ROW(1);
        GEMM_P_ROW(2);
        GEMM_P_ROW(3);
        GEMM_P_ROW(4);
        GEMM_P_ROW(5);
    }
    GEMM_P_STORE(0);
    GEMM_P_STORE(1);
    GEMM_P_STORE(2);
    GEMM_P_STORE(3);
    GEMM_P_STORE(4);
    GEMM_P_STORE(5);
}

/* gemm_tile_avx512's contract on AVX2, in four pieces: weight rows 0-1 and
 * 2-3, each for lanes 0-7 and 8-15. A streamed tile (prefetch) is
 * prefetched by the pieces of lanes 0-7. */
GEMM_AVX2 static void gemm_tile_avx2(const float *xpk, const float *const wp[GEMM_NR], int64_t k0,
                                     int64_t k1, float acc[GEMM_MR * GEMM_NR][KV_DOT_LANES],
                                     bool first, bool prefetch) {
    for (int c = 0; c < GEMM_NR; c += 2) {
        for (int h = 0; h < KV_DOT_LANES; h += 8) {
            if (prefetch && h == 0) {
                gemm_piece_avx2(xpk, wp, k0, k1, acc, c, h, first, true);
            } else {
                gemm_piece_avx2(xpk, wp, k0, k1, acc, c, h, first, false);
            }
        }
    }
}

/* kv_lanes_sum's tree as vector adds: each add below is the tree's scalar
 * add of the same two lanes in the same operand order (lane j + lane j+8,
 * then j + j+4, then 0+2 and 1+3, then those two), an IEEE single add
 * whether done alone or beside others. */
GEMM_AVX512 static inline float gemm_lanes_sum_avx512(const float l[KV_DOT_LANES]) {
    const __m512 v = _mm512_load_ps(l);
    const __m256 lo = _mm512_castps512_ps256(v);
    const __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
    const __m256 t = _mm256_add_ps(lo, hi); /* t[j] = l[j] + l[j+8] */
    const __m128 u = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
    const __m128 s = _mm_add_ps(u, _mm_movehl_ps(u, u)); /* s0 = u0 + u2, s1 = u1 + u3 */
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps(s, s, 1))); /* s0 + s1 */
}

/* The row block's x over [k0, k1) into xpk, (k / 16, MR, 16). */
static void gemm_pack_x(const float *const xp[GEMM_MR] /* -> (in) */, int64_t k0, int64_t k1,
                        float xpk[][GEMM_MR][KV_DOT_LANES]) {
    for (int64_t k = k0; k < k1; k += KV_DOT_LANES) {
        for (int i = 0; i < GEMM_MR; i++) {
            memcpy(xpk[(k - k0) / KV_DOT_LANES][i], xp[i] + k, sizeof xpk[0][0]);
        }
    }
}

/* One job: rows [r0, r1) by outputs [o0, o1) of y = x w^T; w holds the
 * job's weight rows o0 .. o1 as F32. */
static void gemm_job(const float *x /* (rows, in) */, int64_t in,
                     const float *w /* (o1 - o0, in) */, int64_t out, float *y /* (rows, out) */,
                     int64_t r0, int64_t r1, int64_t o0, int64_t o1, GemmTileFn tile) {
    enum { TILES = GEMM_NC / GEMM_NR };
    /* (TILES, MR * NR, 16): one row block's lane accumulators, tile by tile */
    float acc[TILES][GEMM_MR * GEMM_NR][KV_DOT_LANES] __attribute__((aligned(64)));
    /* (KC / 16, MR, 16): the row block's x for one pass, the MR vectors of a
     * step side by side: aligned full-line loads from one stream (the
     * activations' rows are not 64-byte aligned, and split loads cost the
     * kernel ~10%, measured). */
    float xpk[GEMM_KC / KV_DOT_LANES][GEMM_MR][KV_DOT_LANES] __attribute__((aligned(64)));
    const int64_t n16 = in - in % KV_DOT_LANES;
    const int64_t ntile = (o1 - o0 + GEMM_NR - 1) / GEMM_NR;
    for (int64_t r = r0; r < r1; r += GEMM_MR) {
        const float *xp[GEMM_MR]; /* -> (in) */
        for (int i = 0; i < GEMM_MR; i++) {
            xp[i] = x + (r + i < r1 ? r + i : r1 - 1) * in; /* past the edge: dropped */
        }
        if (r1 - r0 > GEMM_MR) {
            /* Several row blocks share the job's weights: pass by pass, the
             * packed x (in L1) meets every tile's weights (in L2). */
            int64_t k0 = 0; /* at least one pass, so in < 16 still zeroes the lanes */
            do {
                const int64_t k1 = k0 + GEMM_KC < n16 ? k0 + GEMM_KC : n16;
                gemm_pack_x(xp, k0, k1, xpk);
                for (int64_t t = 0; t < ntile; t++) {
                    const int64_t o = o0 + t * GEMM_NR;
                    const float *wp[GEMM_NR]; /* -> (in) */
                    for (int c = 0; c < GEMM_NR; c++) {
                        wp[c] = w + ((o + c < o1 ? o + c : o1 - 1) - o0) * in; /* past the edge: dropped */
                    }
                    tile(&xpk[0][0][0], wp, k0, k1, acc[t], k0 == 0, false);
                }
                k0 = k1;
            } while (k0 < n16);
        } else {
            /* One row block: each weight row is read once, so stream the
             * tiles' rows end to end, prefetched, repacking x per pass when
             * `in` needs more than one (x is a few rows, in L1). */
            int64_t packed = -1; /* k0 of the pass in xpk */
            for (int64_t t = 0; t < ntile; t++) {
                const int64_t o = o0 + t * GEMM_NR;
                const float *wp[GEMM_NR]; /* -> (in) */
                for (int c = 0; c < GEMM_NR; c++) {
                    wp[c] = w + ((o + c < o1 ? o + c : o1 - 1) - o0) * in; /* past the edge: dropped */
                }
                int64_t k0 = 0;
                do {
                    const int64_t k1 = k0 + GEMM_KC < n16 ? k0 + GEMM_KC : n16;
                    if (packed != k0) gemm_pack_x(xp, k0, k1, xpk);
                    packed = k0;
                    tile(&xpk[0][0][0], wp, k0, k1, acc[t], k0 == 0, true);
                    k0 = k1;
                } while (k0 < n16);
            }
        }
        for (int i = 0; i < GEMM_MR && r + i < r1; i++) {
            for (int64_t t = 0; t < ntile; t++) {
                for (int c = 0; c < GEMM_NR; c++) {
                    const int64_t o = o0 + t * GEMM_NR + c;
                    if (o >= o1) break;
                    const float s = kv_lanes_sum(acc[t][i * GEMM_NR + c]);
                    y[(r + i) * out + o] = kv_dot_tail(xp[i], w + (o - o0) * in, n16, in, s);
                }
            }
        }
    }
}

/* Jobs of one matrix: ceil(out / NC) output groups by ceil(rows / MC) row
 * blocks, numbered group-major so a thread's contiguous share of the static
 * schedule reads a contiguous share of the weights. */
static int64_t gemm_jobs(int64_t rows, int64_t out) {
    return ((out + GEMM_NC - 1) / GEMM_NC) * ((rows + GEMM_MC - 1) / GEMM_MC);
}

/* ---- one or two rows against BF16 weights (the decode matvec) ------------ */

/* 16 BF16 values at p widened to F32 in a register: each shifted into the
 * top half of a 32-bit lane (exact). */
#define GEMV_WIDEN(p)                                                                              \
    _mm512_castsi512_ps(_mm512_slli_epi32(                                                         \
        _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(const void *)(p))), 16))

/* Element i of a BF16 row, widened. */
static inline float gemv_bf16_at(const uint16_t *w, int64_t i) {
    const uint32_t b = (uint32_t)w[i] << 16;
    float f;
    memcpy(&f, &b, sizeof f);
    return f;
}

/* Outputs o .. o + 4 of rows (1 or 2) rows of x against the BF16 weight
 * rows w (4, in): each (row, output) is kv_dot's 16 lanes in one __m512,
 * lane j the products of elements i % 16 == j added in ascending i (the
 * weights widened in the register, which is exact), then kv_dot's tree and
 * scalar tail: bitwise kv_dot(x[r], widened w[c]). The widening is what
 * makes a stored-BF16 matvec compute-bound on the portable row kernel;
 * here it is two instructions per 16 weights. */
GEMM_AVX512 __attribute__((always_inline)) static inline void
gemv_bf16_block(const float *x /* (rows, in) */, int64_t rows, int64_t in,
                const uint16_t *w /* (4, in) */, int64_t out, int64_t o,
                float *y /* (rows, out) */) {
    const int64_t n16 = in - in % KV_DOT_LANES;
    const uint16_t *w0 = w, *w1 = w + in, *w2 = w + 2 * in, *w3 = w + 3 * in;
    const float *x1 = rows > 1 ? x + in : x; /* (in) a second row, or the first again */
    __m512 a00 = _mm512_setzero_ps(), a01 = a00, a02 = a00, a03 = a00;
    __m512 a10 = a00, a11 = a00, a12 = a00, a13 = a00;
    for (int64_t k = 0; k < n16; k += KV_DOT_LANES) {
        __builtin_prefetch((const void *)((uintptr_t)(w0 + k) + GEMM_PREFETCH_BYTES), 0, 2);
        __builtin_prefetch((const void *)((uintptr_t)(w1 + k) + GEMM_PREFETCH_BYTES), 0, 2);
        __builtin_prefetch((const void *)((uintptr_t)(w2 + k) + GEMM_PREFETCH_BYTES), 0, 2);
        __builtin_prefetch((const void *)((uintptr_t)(w3 + k) + GEMM_PREFETCH_BYTES), 0, 2);
        const __m512 v0 = GEMV_WIDEN(w0 + k), v1 = GEMV_WIDEN(w1 + k);
        const __m512 v2 = GEMV_WIDEN(w2 + k), v3 = GEMV_WIDEN(w3 + k);
        const __m512 xa = _mm512_loadu_ps(x + k), xb = _mm512_loadu_ps(x1 + k);
        a00 = _mm512_add_ps(a00, _mm512_mul_ps(xa, v0));
        a01 = _mm512_add_ps(a01, _mm512_mul_ps(xa, v1));
        a02 = _mm512_add_ps(a02, _mm512_mul_ps(xa, v2));
        a03 = _mm512_add_ps(a03, _mm512_mul_ps(xa, v3));
        a10 = _mm512_add_ps(a10, _mm512_mul_ps(xb, v0));
        a11 = _mm512_add_ps(a11, _mm512_mul_ps(xb, v1));
        a12 = _mm512_add_ps(a12, _mm512_mul_ps(xb, v2));
        a13 = _mm512_add_ps(a13, _mm512_mul_ps(xb, v3));
    }
    float lanes[2][4][KV_DOT_LANES] __attribute__((aligned(64)));
    _mm512_store_ps(lanes[0][0], a00);
    _mm512_store_ps(lanes[0][1], a01);
    _mm512_store_ps(lanes[0][2], a02);
    _mm512_store_ps(lanes[0][3], a03);
    _mm512_store_ps(lanes[1][0], a10);
    _mm512_store_ps(lanes[1][1], a11);
    _mm512_store_ps(lanes[1][2], a12);
    _mm512_store_ps(lanes[1][3], a13);
    const uint16_t *wc[4] = {w0, w1, w2, w3};
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * in; /* (in) */
        for (int c = 0; c < 4; c++) {
            float sum = gemm_lanes_sum_avx512(lanes[r][c]);
            for (int64_t i = n16; i < in; i++) sum += xr[i] * gemv_bf16_at(wc[c], i);
            y[r * out + o + c] = sum;
        }
    }
}

/* The block with rows a constant, so one row's copy drops the second
 * row's accumulators and multiplies. */
GEMM_AVX512 static void gemv_bf16_block1(const float *x, int64_t in, const uint16_t *w,
                                         int64_t out, int64_t o, float *y) {
    gemv_bf16_block(x, 1, in, w, out, o, y);
}

GEMM_AVX512 static void gemv_bf16_block2(const float *x, int64_t in, const uint16_t *w,
                                         int64_t out, int64_t o, float *y) {
    gemv_bf16_block(x, 2, in, w, out, o, y);
}

/* gemv_bf16_block's contract on AVX2: lanes 0-7, then lanes 8-15, of the
 * rows' 4 outputs in 8 accumulators each pass (the second pass finds the 4
 * weight rows in cache), finished by kv_lanes_sum's tree from the two
 * halves (its first step is lane j + lane j + 8). */
#define GEMV_WIDEN8(p)                                                                             \
    _mm256_castsi256_ps(_mm256_slli_epi32(                                                         \
        _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)(p))), 16))
#define GEMV8_STEP(a, xv, wv) a = _mm256_add_ps(a, _mm256_mul_ps(xv, wv))

GEMM_AVX2 __attribute__((always_inline)) static inline void
gemv_bf16_half_avx2(const float *x /* (rows, in) */, const float *x1 /* (in) */,
                    const uint16_t *const w[4] /* -> (in) */, int64_t n16, int h,
                    float half[2][4][8]) {
    __m256 a00 = _mm256_setzero_ps(), a01 = a00, a02 = a00, a03 = a00;
    __m256 a10 = a00, a11 = a00, a12 = a00, a13 = a00;
    for (int64_t k = h; k < n16; k += KV_DOT_LANES) {
        if (h == 0) {
            __builtin_prefetch((const void *)((uintptr_t)(w[0] + k) + GEMM_PREFETCH_BYTES), 0, 2);
            __builtin_prefetch((const void *)((uintptr_t)(w[1] + k) + GEMM_PREFETCH_BYTES), 0, 2);
            __builtin_prefetch((const void *)((uintptr_t)(w[2] + k) + GEMM_PREFETCH_BYTES), 0, 2);
            __builtin_prefetch((const void *)((uintptr_t)(w[3] + k) + GEMM_PREFETCH_BYTES), 0, 2);
        }
        const __m256 v0 = GEMV_WIDEN8(w[0] + k), v1 = GEMV_WIDEN8(w[1] + k);
        const __m256 v2 = GEMV_WIDEN8(w[2] + k), v3 = GEMV_WIDEN8(w[3] + k);
        const __m256 xa = _mm256_loadu_ps(x + k), xb = _mm256_loadu_ps(x1 + k);
        GEMV8_STEP(a00, xa, v0);
        GEMV8_STEP(a01, xa, v1);
        GEMV8_STEP(a02, xa, v2);
        GEMV8_STEP(a03, xa, v3);
        GEMV8_STEP(a10, xb, v0);
        GEMV8_STEP(a11, xb, v1);
        GEMV8_STEP(a12, xb, v2);
        GEMV8_STEP(a13, xb, v3);
    }
    _mm256_store_ps(half[0][0], a00);
    _mm256_store_ps(half[0][1], a01);
    _mm256_store_ps(half[0][2], a02);
    _mm256_store_ps(half[0][3], a03);
    _mm256_store_ps(half[1][0], a10);
    _mm256_store_ps(half[1][1], a11);
    _mm256_store_ps(half[1][2], a12);
    _mm256_store_ps(half[1][3], a13);
}

GEMM_AVX2 static void gemv_bf16_block_avx2(const float *x /* (rows, in) */, int64_t rows,
                                           int64_t in, const uint16_t *w /* (4, in) */,
                                           int64_t out, int64_t o, float *y /* (rows, out) */) {
    const int64_t n16 = in - in % KV_DOT_LANES;
    const uint16_t *wc[4] = {w, w + in, w + 2 * in, w + 3 * in};
    const float *x1 = rows > 1 ? x + in : x; /* (in) a second row, or the first again */
    float lo[2][4][8] __attribute__((aligned(32)));
    float hi[2][4][8] __attribute__((aligned(32)));
    gemv_bf16_half_avx2(x, x1, wc, n16, 0, lo);
    gemv_bf16_half_avx2(x, x1, wc, n16, 8, hi);
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * in; /* (in) */
        for (int c = 0; c < 4; c++) {
            const __m256 t = _mm256_add_ps(_mm256_load_ps(lo[r][c]), _mm256_load_ps(hi[r][c]));
            const __m128 u = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
            const __m128 s2 = _mm_add_ps(u, _mm_movehl_ps(u, u));
            float sum = _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
            for (int64_t i = n16; i < in; i++) sum += xr[i] * gemv_bf16_at(wc[c], i);
            y[r * out + o + c] = sum;
        }
    }
}

#endif /* KV_GEMM_X86 */

bool kv_gemv_stored(const float *x, int64_t rows, int64_t in, int count, const KvMat *ws,
                    const int64_t *outs, float *const *ys) {
#if KV_GEMM_X86
    const KvGemmPath path = kv_gemm_path();
    if (rows < 1 || rows > 2 || (path != KV_GEMM_AVX512 && path != KV_GEMM_AVX2)) return false;
    int64_t work = 0;
    for (int j = 0; j < count; j++) {
        if (ws[j].dtype != KV_DTYPE_BF16) return false;
        work += rows * in * outs[j];
    }
#pragma omp parallel if (work >= kv_parallel_min_work())
    {
        for (int j = 0; j < count; j++) {
            const uint16_t *w = ws[j].data; /* (outs[j], in) */
            const int64_t blocks = outs[j] / 4;
            /* nowait: the matrices are independent (kv_matmul_multi) */
#pragma omp for schedule(static) nowait
            for (int64_t b = 0; b < blocks; b++) {
                if (path == KV_GEMM_AVX2) {
                    gemv_bf16_block_avx2(x, rows, in, w + b * 4 * in, outs[j], b * 4, ys[j]);
                } else if (rows == 1) {
                    gemv_bf16_block1(x, in, w + b * 4 * in, outs[j], b * 4, ys[j]);
                } else {
                    gemv_bf16_block2(x, in, w + b * 4 * in, outs[j], b * 4, ys[j]);
                }
            }
        }
    }
    /* the last outs % 4 outputs: one kv_dot each */
    for (int j = 0; j < count; j++) {
        for (int64_t o = outs[j] / 4 * 4; o < outs[j]; o++) {
            for (int64_t r = 0; r < rows; r++) {
                ys[j][r * outs[j] + o] = kv_dot_mat(x + r * in, ws[j], o, in);
            }
        }
    }
    return true;
#else
    (void)x;
    (void)rows;
    (void)in;
    (void)count;
    (void)ws;
    (void)outs;
    (void)ys;
    return false;
#endif
}


/* A thread's widened weight rows: 2 MiB aligned, in huge pages where the
 * kernel grants them, as converted weights are (bigalloc.h): the
 * micro-kernel's weight loads span the whole block, and on 4 KiB pages they
 * miss the TLB (a long prefill of the 2b shape measured slower than on F32
 * weights until this). Release with free(). */
static void *gemm_scratch_alloc(size_t bytes) {
    const size_t huge = (size_t)2 << 20;
    const size_t size = (bytes + huge - 1) / huge * huge;
    void *p = NULL;
    if (posix_memalign(&p, huge, size) != 0) return NULL;
#ifdef MADV_HUGEPAGE
    (void)madvise(p, size, MADV_HUGEPAGE);
#endif
    return p;
}

bool kv_gemm_multi(const float *x, int64_t rows, int64_t in, int count, const KvMat *ws,
                   const int64_t *outs, float *const *ys) {
#if KV_GEMM_X86
    const KvGemmPath path = kv_gemm_path();
    if (path != KV_GEMM_AVX512 && path != KV_GEMM_AVX2) return false;
    const GemmTileFn tile = path == KV_GEMM_AVX512 ? gemm_tile_avx512_call : gemm_tile_avx2;
    int64_t jobs = 0, work = 0;
    bool stored = false; /* some matrix is not F32: a job's rows are widened first */
    for (int j = 0; j < count; j++) {
        jobs += gemm_jobs(rows, outs[j]);
        work += rows * in * outs[j];
        stored = stored || ws[j].dtype != KV_DTYPE_F32;
    }
    const int64_t rblocks = (rows + GEMM_MC - 1) / GEMM_MC;
    /* Every job writes its own outputs and each output is finished by the
     * job that starts it, so the schedule decides only who computes what. */
#pragma omp parallel if (work >= kv_parallel_min_work())
    {
        /* (GEMM_NC, in): a job's weight rows widened, per thread. */
        float *scratch = stored ? gemm_scratch_alloc((size_t)(GEMM_NC * in) * sizeof(float)) : NULL;
        /* the output group in scratch: jobs are numbered group-major, so a
         * thread's consecutive jobs mostly share one and widen it once */
        int held_j = -1;
        int64_t held_g = -1;
#pragma omp for schedule(static)
        for (int64_t q = 0; q < jobs; q++) {
            int j = 0;
            int64_t rest = q;
            while (rest >= gemm_jobs(rows, outs[j])) rest -= gemm_jobs(rows, outs[j++]);
            const int64_t g = rest / rblocks, rb = rest % rblocks;
            const int64_t o0 = g * GEMM_NC, o1 = o0 + GEMM_NC < outs[j] ? o0 + GEMM_NC : outs[j];
            const int64_t r0 = rb * GEMM_MC, r1 = r0 + GEMM_MC < rows ? r0 + GEMM_MC : rows;
            if (ws[j].dtype != KV_DTYPE_F32 && scratch == NULL) {
                /* out of memory for the scratch: the same dots, widened in chunks */
                for (int64_t r = r0; r < r1; r++) {
                    for (int64_t o = o0; o < o1; o++) {
                        ys[j][r * outs[j] + o] = kv_dot_mat(x + r * in, ws[j], o, in);
                    }
                }
                continue;
            }
            const float *wj = scratch; /* (o1 - o0, in) */
            if (ws[j].dtype == KV_DTYPE_F32 || j != held_j || g != held_g) {
                wj = kv_mat_rows(ws[j], in, o0, o1 - o0, scratch);
                held_j = ws[j].dtype == KV_DTYPE_F32 ? -1 : j;
                held_g = g;
            }
            gemm_job(x, in, wj, outs[j], ys[j], r0, r1, o0, o1, tile);
        }
        free(scratch);
    }
    return true;
#else
    (void)x;
    (void)rows;
    (void)in;
    (void)count;
    (void)ws;
    (void)outs;
    (void)ys;
    return false;
#endif
}
