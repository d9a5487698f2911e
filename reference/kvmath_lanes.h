/* kvmath_lanes.h: the end of kv_dot's pattern (kvmath.h, KV_DOT_LANES),
 * shared by kvmath.c (kv_dot, the row kernel) and gemm.c (the blocked GEMM),
 * so every path that must be bitwise kv_dot ends in the same scalar code.
 * Internal to the reference library; not part of the public API.
 *
 * Plain static (unused-tolerant), not static inline: that way kvmath.c
 * compiles to the same instructions as when these were its own static
 * functions (checked with objdump: kv_dot, kv_dot_rows and the matmul's
 * region); the decode kernel's timing is sensitive to such changes
 * (kvmath.c, kv_dot_rows). */
#ifndef KV_MATH_LANES_H
#define KV_MATH_LANES_H

#include <stdint.h>

#include "kvparallel.h"

/* The contract's tree over the 16 lane sums: lane j += lane j+8, then j+4,
 * j+2, j+1, in scalar float adds. gemm.c's AVX-512 finish writes the same
 * adds as vector ops (each a per-lane IEEE add of the same two operands);
 * test_math checks the two agree bitwise. */
__attribute__((unused)) static float kv_lanes_sum(const float l[KV_DOT_LANES]) {
    float t[8];
    for (int j = 0; j < 8; j++) t[j] = l[j] + l[j + 8];
    float u[4];
    for (int j = 0; j < 4; j++) u[j] = t[j] + t[j + 4];
    const float s0 = u[0] + u[2];
    const float s1 = u[1] + u[3];
    return s0 + s1;
}

/* Tail of one row: elements n16 <= i < n, one by one, ascending, added to
 * the tree's sum s. */
__attribute__((unused)) static float kv_dot_tail(const float *x /* (n) */, const float *w /* (n) */, int64_t n16,
                                int64_t n, float s) {
    for (int64_t i = n16; i < n; i++) s += x[i] * w[i];
    return s;
}

#endif
