/* attend_simd.h: AVX-512 forms of kv_attend's two inner loops (the scores'
 * dot products and the weighted sum of the values), bitwise what the
 * portable loops give: the same operations on every element in the same
 * order, only wider and over each key's row at once. The portable weighted
 * sum walks all keys once per 16 output elements, touching each key's row
 * 16 times, one 4 KiB-strided cache line at a time; this one reads each row
 * once. Internal to the reference library. */
#ifndef KV_ATTEND_SIMD_H
#define KV_ATTEND_SIMD_H

#include <stdbool.h>
#include <stdint.h>

/* Whether the AVX-512 forms run here: built for x86-64, the CPU has
 * AVX-512F, and the GEMM path in force (kv_gemm_path: tests force
 * "portable" to compare the two) is AVX-512. */
bool kv_attend_simd_on(void);

/* scores[j] = kv_dot(q, k[j], hd), bitwise, for j < nk. */
void kv_attend_dots_avx512(const float *q /* (hd) */, const float *const *k /* (nk) -> (hd) */,
                           int64_t nk, int64_t hd, float *scores /* (nk) */);

/* out[d] = sum over j ascending of p[j] * v[j][d], from +0, one multiply
 * and one add per term (kv_weighted_sum's contract), for hd a multiple of
 * 64 (the head sizes of the supported families; others take the portable
 * loop). */
void kv_weighted_sum_avx512(const float *p /* (nk) */, const float *const *v /* (nk) -> (hd) */,
                            int64_t nk, int64_t hd, float *out /* (hd) */);

#endif
