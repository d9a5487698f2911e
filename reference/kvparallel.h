/* kvparallel.h: what every kernel of the reference shares: the dot-product
 * lane count of the numeric contract and the threshold below which a
 * parallel region stays serial. Apart from kvmath.h so that the GEMM
 * (gemm.c), which kvmath.c calls, takes nothing back from kvmath. */
#ifndef KV_KVPARALLEL_H
#define KV_KVPARALLEL_H

#include <stdint.h>

/* Dot-product pattern: lane j (0 <= j < 16) accumulates a[i]*b[i] for every
 * i < n16 with i % 16 == j, in ascending i, where n16 = n rounded down to a
 * multiple of 16. The lanes are then combined as a fixed pairwise tree
 * (lane j += lane j+8, then j+4, j+2, j+1), and the tail elements
 * i >= n16 are added to that sum one by one in ascending i. */
#define KV_DOT_LANES 16

/* Parallel regions only open when their work (multiply-adds) reaches this
 * threshold: for tiny models the fork/join costs more than the work, and
 * spinning OpenMP workers collapse when several processes share the cores
 * (ctest -j). Results never depend on it (each output is computed by one
 * thread in a fixed order); tests set it to 0 to force every region
 * parallel. Default KV_PARALLEL_MIN_WORK. */
#define KV_PARALLEL_MIN_WORK (1 << 18)
void kv_set_parallel_min_work(int64_t work);
int64_t kv_parallel_min_work(void);

#endif
