/* attend_rows.h: attention's two inner loops for several query rows that
 * share their keys (one kv head's query heads at consecutive positions), in
 * AVX2: each key and value row is loaded once for a group of rows instead
 * of once per row, which is what bounds the one-row loops (attend_simd.h,
 * kvmath.c) on a long prompt. Every row's every result is bitwise what the
 * one-row loops give it: the same operations on every lane in the same
 * order. Internal to the reference library. */
#ifndef KV_ATTEND_ROWS_H
#define KV_ATTEND_ROWS_H

#include <stdbool.h>
#include <stdint.h>

/* Whether these run here: built for x86-64, the CPU has AVX2 and the GEMM
 * path in force (kv_gemm_path; tests force "portable") is a vector one. */
bool kv_attend_rows_on(void);

/* scores[r * ld + j] = kv_dot(q[r], k[j], hd), bitwise, for r < nr and
 * j < nk. hd a multiple of 16. */
void kv_attend_dots_rows(const float *const *q /* (nr) -> (hd) */, int64_t nr,
                         const float *const *k /* (nk) -> (hd) */, int64_t nk, int64_t hd,
                         float *scores /* (nr, ld) */, int64_t ld);

/* For every row r < nr: out[r][d] += p[r][j] * v[j][d] for j = j0 .. j1 - 1
 * in ascending order, a multiply then an add per term, resumed from out[r]
 * (set it to +0 before a row's first keys): kv_weighted_sum's contract
 * (kvmath.c) continued over a run of keys. hd a multiple of 16. */
void kv_weighted_sum_rows(const float *const *p /* (nr) -> (j1) */, int64_t nr,
                          const float *const *v /* (j1) -> (hd) */, int64_t j0, int64_t j1,
                          int64_t hd, float *const *out /* (nr) -> (hd) */);

#endif
