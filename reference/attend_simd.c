/* attend_simd.c: kv_attend's inner loops in AVX-512 (attend_simd.h). */
#include "attend_simd.h"

#include <string.h>

#include "gemm.h"
#include "kvmath.h"
#include "kvmath_lanes.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define ATTEND_X86 1
#else
#define ATTEND_X86 0
#endif

bool kv_attend_simd_on(void) {
    return ATTEND_X86 && kv_gemm_path() == KV_GEMM_AVX512;
}

#if ATTEND_X86

#define ATTEND_AVX512 __attribute__((target("avx512f")))

/* Keys per pass of the dots: independent chains, so the adds' latency
 * overlaps. Timing only. */
#define DOT_KEYS 4

/* One key's 16 lane sums finished as kv_dot finishes them (kv_lanes_sum's
 * tree, then the scalar tail). */
ATTEND_AVX512 static inline float dot_finish(__m512 acc, const float *q, const float *k,
                                             int64_t n16, int64_t hd) {
    float lanes[KV_DOT_LANES] __attribute__((aligned(64)));
    _mm512_store_ps(lanes, acc);
    return kv_dot_tail(q, k, n16, hd, kv_lanes_sum(lanes));
}

/* Lane l of a key's accumulator sums q[i] * k[i] for i = l mod 16, i
 * ascending, from +0, a multiply then an add: kv_dot's lanes exactly. */
ATTEND_AVX512 void kv_attend_dots_avx512(const float *q, const float *const *k, int64_t nk,
                                         int64_t hd, float *scores) {
    const int64_t n16 = hd - hd % KV_DOT_LANES;
    int64_t j = 0;
    for (; j + DOT_KEYS <= nk; j += DOT_KEYS) {
        const float *k0 = k[j], *k1 = k[j + 1], *k2 = k[j + 2], *k3 = k[j + 3];
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int64_t i = 0; i < n16; i += KV_DOT_LANES) {
            const __m512 qv = _mm512_loadu_ps(q + i);
            a0 = _mm512_add_ps(a0, _mm512_mul_ps(qv, _mm512_loadu_ps(k0 + i)));
            a1 = _mm512_add_ps(a1, _mm512_mul_ps(qv, _mm512_loadu_ps(k1 + i)));
            a2 = _mm512_add_ps(a2, _mm512_mul_ps(qv, _mm512_loadu_ps(k2 + i)));
            a3 = _mm512_add_ps(a3, _mm512_mul_ps(qv, _mm512_loadu_ps(k3 + i)));
        }
        scores[j] = dot_finish(a0, q, k0, n16, hd);
        scores[j + 1] = dot_finish(a1, q, k1, n16, hd);
        scores[j + 2] = dot_finish(a2, q, k2, n16, hd);
        scores[j + 3] = dot_finish(a3, q, k3, n16, hd);
    }
    for (; j < nk; j++) {
        __m512 a = _mm512_setzero_ps();
        for (int64_t i = 0; i < n16; i += KV_DOT_LANES) {
            a = _mm512_add_ps(a, _mm512_mul_ps(_mm512_loadu_ps(q + i), _mm512_loadu_ps(k[j] + i)));
        }
        scores[j] = dot_finish(a, q, k[j], n16, hd);
    }
}

/* Accumulators of one block of output elements: named, not an array (at
 * -O2 GCC keeps arrays of vectors on the stack, gemm.c saw the same). */
#define WS_DECL4(s) __m512 s##0 = _mm512_setzero_ps(), s##1 = s##0, s##2 = s##0, s##3 = s##0
#define WS_STEP(a, i) a = _mm512_add_ps(a, _mm512_mul_ps(pj, _mm512_loadu_ps(vj + 16 * (i))))
#define WS_STEP4(s, i0)                                                                            \
    WS_STEP(s##0, (i0));                                                                           \
    WS_STEP(s##1, (i0) + 1);                                                                       \
    WS_STEP(s##2, (i0) + 2);                                                                       \
    WS_STEP(s##3, (i0) + 3)
#define WS_STORE4(s, i0)                                                                           \
    _mm512_storeu_ps(o + 16 * (i0), s##0);                                                         \
    _mm512_storeu_ps(o + 16 * ((i0) + 1), s##1);                                                   \
    _mm512_storeu_ps(o + 16 * ((i0) + 2), s##2);                                                   \
    _mm512_storeu_ps(o + 16 * ((i0) + 3), s##3)

/* 256 outputs from d0: every key's 1 KiB of them in one pass. */
ATTEND_AVX512 static void ws_block256(const float *p, const float *const *v, int64_t nk,
                                      int64_t d0, float *o) {
    WS_DECL4(a);
    WS_DECL4(b);
    WS_DECL4(c);
    WS_DECL4(e);
    for (int64_t j = 0; j < nk; j++) {
        const __m512 pj = _mm512_set1_ps(p[j]);
        const float *vj = v[j] + d0;
        WS_STEP4(a, 0);
        WS_STEP4(b, 4);
        WS_STEP4(c, 8);
        WS_STEP4(e, 12);
    }
    WS_STORE4(a, 0);
    WS_STORE4(b, 4);
    WS_STORE4(c, 8);
    WS_STORE4(e, 12);
}

/* 64 outputs from d0. */
ATTEND_AVX512 static void ws_block64(const float *p, const float *const *v, int64_t nk,
                                     int64_t d0, float *o) {
    WS_DECL4(a);
    for (int64_t j = 0; j < nk; j++) {
        const __m512 pj = _mm512_set1_ps(p[j]);
        const float *vj = v[j] + d0;
        WS_STEP4(a, 0);
    }
    WS_STORE4(a, 0);
}

ATTEND_AVX512 void kv_weighted_sum_avx512(const float *p, const float *const *v, int64_t nk,
                                          int64_t hd, float *out) {
    int64_t d = 0;
    for (; d + 256 <= hd; d += 256) ws_block256(p, v, nk, d, out + d);
    for (; d + 64 <= hd; d += 64) ws_block64(p, v, nk, d, out + d);
}

#else

void kv_attend_dots_avx512(const float *q, const float *const *k, int64_t nk, int64_t hd,
                           float *scores) {
    for (int64_t j = 0; j < nk; j++) scores[j] = kv_dot(q, k[j], hd);
}

/* Off x86-64 kv_attend_simd_on() is false and these are not called; they
 * still keep the contract. */
void kv_weighted_sum_avx512(const float *p, const float *const *v, int64_t nk, int64_t hd,
                            float *out) {
    for (int64_t d = 0; d < hd; d++) {
        float acc = 0.0f;
        for (int64_t j = 0; j < nk; j++) acc = acc + p[j] * v[j][d];
        out[d] = acc;
    }
}

#endif
