/* weight.c: widening stored weights to F32 (weight.h). */
#include "weight.h"

#include <math.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define KV_WEIGHT_SSE2 1
#else
#define KV_WEIGHT_SSE2 0
#endif

const float kv_e2m1_values[16] = {+0.0f, +0.5f, +1.0f, +1.5f, +2.0f, +3.0f, +4.0f, +6.0f,
                                  -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

/* 2^(e - 127) as an F32 for each e8m0 exponent: 2^-127 (a subnormal) up to
 * 2^127, and 255 (NaN in the OCP spec) as infinity, which is what
 * transformers' ldexp gives it. Every product with an e2m1 value (at most
 * two significant bits, magnitude 0.5 to 6) is then exact. */
static float mx_scale(uint8_t e) {
    if (e == 255) return INFINITY;
    return ldexpf(1.0f, (int)e - 127);
}

/* MXFP4 elements from .. from + n widened. */
static void widen_mxfp4(KvMat m, int64_t from, int64_t n, float *dst /* (n) */) {
    const uint8_t *q = m.data;
    int64_t i = from;
    const int64_t end = from + n;
    while (i < end) {
        /* one 32-element block (or the part of it asked for): one scale */
        const int64_t block_end = (i / 32 + 1) * 32 < end ? (i / 32 + 1) * 32 : end;
        const float scale = mx_scale(m.scales[i / 32]);
        for (; i < block_end; i++) {
            const uint8_t byte = q[i / 2];
            dst[i - from] = kv_e2m1_values[(i & 1) ? byte >> 4 : byte & 15u] * scale;
        }
    }
}

float kv_mat_at(KvMat m, int64_t i) {
    float f;
    kv_mat_widen(m, i, 1, &f);
    return f;
}

/* BF16 is the top half of a binary32: each element shifted up 16 bits. */
static void widen_bf16(const uint8_t *src /* (n) bf16 */, int64_t n, float *dst /* (n) */) {
    int64_t i = 0;
#if KV_WEIGHT_SSE2
    /* Interleaving zero halves below each bf16 is the shift: eight per load,
     * on every x86-64 (SSE2). */
    const __m128i zero = _mm_setzero_si128();
    for (; i + 8 <= n; i += 8) {
        const __m128i v = _mm_loadu_si128((const __m128i *)(const void *)(src + 2 * i));
        _mm_storeu_si128((__m128i *)(void *)(dst + i), _mm_unpacklo_epi16(zero, v));
        _mm_storeu_si128((__m128i *)(void *)(dst + i + 4), _mm_unpackhi_epi16(zero, v));
    }
#endif
    for (; i < n; i++) {
        const uint32_t b = ((uint32_t)src[2 * i] | ((uint32_t)src[2 * i + 1] << 8)) << 16;
        memcpy(dst + i, &b, sizeof b);
    }
}

void kv_mat_widen(KvMat m, int64_t from, int64_t n, float *dst) {
    if (n <= 0) return;
    if (m.dtype == KV_DTYPE_F4) {
        widen_mxfp4(m, from, n, dst);
        return;
    }
    const uint8_t *src = (const uint8_t *)m.data + (size_t)from * (m.dtype == KV_DTYPE_F32 ? 4u : 2u);
    switch (m.dtype) {
    case KV_DTYPE_BF16:
        widen_bf16(src, n, dst);
        return;
    default: /* F32 (a copy), F16 (safetensors.c's exact conversion) */
        kv_dtype_to_f32(m.dtype, src, (size_t)n, dst);
        return;
    }
}

const float *kv_mat_rows(KvMat m, int64_t cols, int64_t row0, int64_t n, float *scratch) {
    if (m.dtype == KV_DTYPE_F32) return (const float *)m.data + row0 * cols;
    kv_mat_widen(m, row0 * cols, n * cols, scratch);
    return scratch;
}
