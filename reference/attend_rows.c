/* attend_rows.c: attention's inner loops for rows that share their keys
 * (attend_rows.h), in AVX2.
 *
 * AVX2 has 16 vector registers of 8 floats; a kv_dot accumulator is 16
 * lanes. The dots therefore run in halves: lanes 0-7 (elements i % 16 < 8)
 * of a 4-row by 3-key tile in 12 registers, then lanes 8-15, and the two
 * halves meet in kv_lanes_sum's first step (lane j + lane j + 8), whose
 * remaining steps follow as vector adds of the same lane pairs (gemm.c does
 * the same from a __m512). The weighted sum keeps 6 rows by 16 outputs in
 * 12 registers and reads each value row's 16 outputs once for the 6.
 *
 * Tiles past the last row or key repeat the last one (the same operations
 * on the same values, stored to the same place), so there is one kernel
 * shape. */
#include "attend_rows.h"

#include <string.h>

#include "gemm.h"
#include "kvmath.h"
#include "kvmath_lanes.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define ROWS_X86 1
#else
#define ROWS_X86 0
#endif

bool kv_attend_rows_on(void) {
    const KvGemmPath path = kv_gemm_path();
    return ROWS_X86 && path != KV_GEMM_PORTABLE && kv_gemm_path_supported(KV_GEMM_AVX2);
}

#if ROWS_X86

#define ROWS_AVX2 __attribute__((target("avx2")))

#define DOTS_ROWS 4 /* rows per dots tile: 4 x 3 accumulators, 3 keys and a query vector */
#define DOTS_KEYS 3
#define WS_ROWS 6   /* rows per weighted-sum pass: 6 x 2 accumulators, 2 value vectors */

#define DOT_STEP(a, qv, kv) a = _mm256_add_ps(a, _mm256_mul_ps(qv, kv))
#define DOT_ROW(r, a0, a1, a2)                                                                     \
    qv = _mm256_loadu_ps(q[r] + i);                                                                \
    DOT_STEP(a0, qv, k0);                                                                          \
    DOT_STEP(a1, qv, k1);                                                                          \
    DOT_STEP(a2, qv, k2)

/* Lanes h .. h + 7 of the tile's 12 dots over the first n16 elements, into
 * half[r * DOTS_KEYS + c]. */
ROWS_AVX2 static void dots_half(const float *const q[DOTS_ROWS] /* -> (hd) */,
                                const float *const k[DOTS_KEYS] /* -> (hd) */, int64_t n16, int h,
                                float half[DOTS_ROWS * DOTS_KEYS][8]) {
    __m256 a00 = _mm256_setzero_ps(), a01 = a00, a02 = a00, a10 = a00, a11 = a00, a12 = a00;
    __m256 a20 = a00, a21 = a00, a22 = a00, a30 = a00, a31 = a00, a32 = a00;
    for (int64_t i = h; i < n16; i += KV_DOT_LANES) {
        const __m256 k0 = _mm256_loadu_ps(k[0] + i), k1 = _mm256_loadu_ps(k[1] + i);
        const __m256 k2 = _mm256_loadu_ps(k[2] + i);
        __m256 qv;
        DOT_ROW(0, a00, a01, a02);
        DOT_ROW(1, a10, a11, a12);
        DOT_ROW(2, a20, a21, a22);
        DOT_ROW(3, a30, a31, a32);
    }
    _mm256_store_ps(half[0], a00);
    _mm256_store_ps(half[1], a01);
    _mm256_store_ps(half[2], a02);
    _mm256_store_ps(half[3], a10);
    _mm256_store_ps(half[4], a11);
    _mm256_store_ps(half[5], a12);
    _mm256_store_ps(half[6], a20);
    _mm256_store_ps(half[7], a21);
    _mm256_store_ps(half[8], a22);
    _mm256_store_ps(half[9], a30);
    _mm256_store_ps(half[10], a31);
    _mm256_store_ps(half[11], a32);
}

/* kv_lanes_sum of the 16 lanes lo (0-7) and hi (8-15): t[j] = l[j] + l[j+8],
 * then t[j] + t[j+4], then u0 + u2 and u1 + u3, then those two. */
ROWS_AVX2 static float lanes_sum_halves(const float *lo, const float *hi) {
    const __m256 t = _mm256_add_ps(_mm256_load_ps(lo), _mm256_load_ps(hi));
    const __m128 u = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
    const __m128 s = _mm_add_ps(u, _mm_movehl_ps(u, u));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps(s, s, 1)));
}

ROWS_AVX2 void kv_attend_dots_rows(const float *const *q, int64_t nr, const float *const *k,
                                   int64_t nk, int64_t hd, float *scores, int64_t ld) {
    const int64_t n16 = hd - hd % KV_DOT_LANES;
    float lo[DOTS_ROWS * DOTS_KEYS][8] __attribute__((aligned(32)));
    float hi[DOTS_ROWS * DOTS_KEYS][8] __attribute__((aligned(32)));
    for (int64_t r = 0; r < nr; r += DOTS_ROWS) {
        const float *qt[DOTS_ROWS]; /* -> (hd) */
        for (int i = 0; i < DOTS_ROWS; i++) qt[i] = q[r + i < nr ? r + i : nr - 1];
        for (int64_t j = 0; j < nk; j += DOTS_KEYS) {
            const float *kt[DOTS_KEYS]; /* -> (hd) */
            for (int c = 0; c < DOTS_KEYS; c++) kt[c] = k[j + c < nk ? j + c : nk - 1];
            dots_half(qt, kt, n16, 0, lo);
            dots_half(qt, kt, n16, 8, hi);
            for (int i = 0; i < DOTS_ROWS && r + i < nr; i++) {
                for (int c = 0; c < DOTS_KEYS && j + c < nk; c++) {
                    const int t = i * DOTS_KEYS + c;
                    scores[(r + i) * ld + j + c] =
                        kv_dot_tail(qt[i], kt[c], n16, hd, lanes_sum_halves(lo[t], hi[t]));
                }
            }
        }
    }
}

#define WS_STEP(r)                                                                                 \
    pj = _mm256_set1_ps(p[r][j]);                                                                  \
    c##r##0 = _mm256_add_ps(c##r##0, _mm256_mul_ps(pj, v0));                                       \
    c##r##1 = _mm256_add_ps(c##r##1, _mm256_mul_ps(pj, v1))
#define WS_LOAD(r)                                                                                 \
    __m256 c##r##0 = _mm256_loadu_ps(out[r] + d0), c##r##1 = _mm256_loadu_ps(out[r] + d0 + 8)
#define WS_STORE(r)                                                                                \
    _mm256_storeu_ps(out[r] + d0, c##r##0);                                                        \
    _mm256_storeu_ps(out[r] + d0 + 8, c##r##1)

/* Outputs d0 .. d0 + 15 of 6 rows over keys [j0, j1). */
ROWS_AVX2 static void ws_pass(const float *const p[WS_ROWS] /* -> (j1) */,
                              const float *const *v /* (j1) -> (hd) */, int64_t j0, int64_t j1,
                              int64_t d0, float *const out[WS_ROWS] /* -> (hd) */) {
    WS_LOAD(0);
    WS_LOAD(1);
    WS_LOAD(2);
    WS_LOAD(3);
    WS_LOAD(4);
    WS_LOAD(5);
    for (int64_t j = j0; j < j1; j++) {
        const __m256 v0 = _mm256_loadu_ps(v[j] + d0), v1 = _mm256_loadu_ps(v[j] + d0 + 8);
        __m256 pj;
        WS_STEP(0);
        WS_STEP(1);
        WS_STEP(2);
        WS_STEP(3);
        WS_STEP(4);
        WS_STEP(5);
    }
    WS_STORE(0);
    WS_STORE(1);
    WS_STORE(2);
    WS_STORE(3);
    WS_STORE(4);
    WS_STORE(5);
}

ROWS_AVX2 void kv_weighted_sum_rows(const float *const *p, int64_t nr, const float *const *v,
                                    int64_t j0, int64_t j1, int64_t hd, float *const *out) {
    if (j1 <= j0) return;
    for (int64_t r = 0; r < nr; r += WS_ROWS) {
        const float *pt[WS_ROWS]; /* -> (j1) */
        float *ot[WS_ROWS];       /* -> (hd) */
        for (int i = 0; i < WS_ROWS; i++) {
            const int64_t ri = r + i < nr ? r + i : nr - 1;
            pt[i] = p[ri];
            ot[i] = out[ri];
        }
        for (int64_t d = 0; d + 16 <= hd; d += 16) ws_pass(pt, v, j0, j1, d, ot);
    }
}

#else

/* Off x86-64 kv_attend_rows_on() is false and these are not called; they
 * still keep the contract. */
void kv_attend_dots_rows(const float *const *q, int64_t nr, const float *const *k, int64_t nk,
                         int64_t hd, float *scores, int64_t ld) {
    for (int64_t r = 0; r < nr; r++) {
        for (int64_t j = 0; j < nk; j++) scores[r * ld + j] = kv_dot(q[r], k[j], hd);
    }
}

void kv_weighted_sum_rows(const float *const *p, int64_t nr, const float *const *v, int64_t j0,
                          int64_t j1, int64_t hd, float *const *out) {
    for (int64_t r = 0; r < nr; r++) {
        for (int64_t d = 0; d < hd; d++) {
            float acc = out[r][d];
            for (int64_t j = j0; j < j1; j++) acc = acc + p[r][j] * v[j][d];
            out[r][d] = acc;
        }
    }
}

#endif
