/* shift.h: the context shift's steps over plain buffers (DESIGN §5), shared
 * by the CPU run's kv_cpu_shift (shift.c, cpu_state.h) and the CUDA
 * backend's shift (candidates/cuda/cuda_shift.cu, which copies its device
 * state to the host, runs these and copies it back), so both backends drop
 * the same positions, re-lay the same slots and re-rotate the same keys
 * with the same host arithmetic.
 *
 * T is the number of positions stored (padded slots included); positions
 * keep .. keep + drop - 1 are dropped and keep + drop .. T - 1 move down by
 * drop. dropped[b] is the number of real tokens row b loses: its keys are
 * re-rotated by RoPE(-dropped[b]) (left pads take no RoPE position). */
#ifndef KV_SHIFT_H
#define KV_SHIFT_H

#include <stdint.h>

#include "cache.h"
#include "config.h"
#include "status.h"

/* The input rule: keep >= 0, drop >= 1 and keep + drop <= stored - the
 * largest window (every position a sliding layer holds survives, and the
 * kept prefix lies outside the next query's window). KV_ERR_INPUT naming the
 * values otherwise. */
KvStatus kv_shift_check(const KvConfig *c, int64_t stored, int64_t keep, int64_t drop,
                        KvError *err);

/* Realness (B, L) and RoPE counts (B): each row's flags move down, the freed
 * tail is emptied; dropped[b] = real tokens row b lost; n_real[b] -= it. */
void kv_shift_real(uint8_t *real /* (B, L) */, int64_t *n_real /* (B) */, int64_t B, int64_t L,
                   int64_t keep, int64_t drop, int64_t T, int64_t *dropped /* (B) out */);

/* A static (full-length) layer cache: rows keep + drop .. T - 1 move to
 * keep .., keys re-rotated by the row's dropped[b]; the freed tail is
 * zeroed, as at init. inv_freq is the layer's (head_dim / 2). */
void kv_shift_static(float *k /* (B, L, kv_dim) */, float *v /* (B, L, kv_dim) */, int64_t B,
                     int64_t L, const KvConfig *c, const float *inv_freq, int64_t keep,
                     int64_t drop, int64_t T, const int64_t *dropped /* (B) */);

/* One sliding layer's variant cache cs (window w, layout rule): each held
 * slot's position p (by the rule at count T) moves to the slot the rule
 * gives p - drop at count T - drop, its key re-rotated; slots left empty are
 * emptied as a reset does (NaN, no real token, position -1). Written back
 * into cs's own buffers (a captured graph holds them by value). Under
 * KV_FAULT_SHIFT_CELLS (in faults) a slot stays in its cell. KV_ERR_INTERNAL
 * when a surviving position has no slot (a broken layout), naming layer and
 * variant. */
KvStatus kv_shift_slots(const KvCacheState *cs, KvLayoutRule rule, int64_t w, const KvConfig *c,
                        const float *inv_freq, int64_t drop, int64_t T,
                        const int64_t *dropped /* (B) */, unsigned faults, int64_t layer,
                        const char *variant, KvError *err);

#endif
