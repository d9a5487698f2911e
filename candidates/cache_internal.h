/* cache_internal.h: plumbing shared by the six cache variants (cache.h),
 * private to candidates/: nothing outside this directory includes it.
 *
 * Every variant keeps the same four guarded buffers (K, V, real flags,
 * positions), some keep a second set as a temporary, and all create, empty,
 * check and expose them the same way. Only the data movement of update (and
 * each variant's layout) differs, and that stays in the variant's own file;
 * what is here moves no data between slots, except the planted racy shift
 * the two shifting variants share. */
#ifndef KV_CACHE_INTERNAL_H
#define KV_CACHE_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "cache.h"

/* One set of slot buffers, each wrapped in sentinel regions (kv_guard_alloc).
 * slots is W for most variants, W - 1 for dynamic (0 when W = 1). */
typedef struct {
    float *k;      /* (B, slots, dim) */
    float *v;      /* (B, slots, dim) */
    uint8_t *real; /* (B, slots) 1 when the token in the slot is real */
    int64_t *pos;  /* (slots) position held by each slot, -1 = empty */
    int64_t batch, slots, dim;
} KvCacheSlots;

/* create's argument checks, so every variant refuses the same inputs with the
 * same messages ("<variant>: create: ..."): out must not be NULL (then *out is
 * set to NULL), batch, window and dim must be >= 1, and B * W * dim elements
 * of up to 8 bytes must fit a size_t with room for the guards. KV_ERR_INPUT
 * when any fails. */
KvStatus kv_slots_check_create(const char *variant, int64_t batch, int64_t window, int64_t dim,
                               KvSlidingCache **out, KvError *err);

/* The messages create gives when an allocation fails (KV_ERR_INTERNAL): the
 * variant's own struct, and any of its buffers (named by the requested batch,
 * window and dim, whatever the slot count). */
KvStatus kv_slots_oom_struct(const char *variant, KvError *err);
KvStatus kv_slots_oom_buffers(const char *variant, int64_t batch, int64_t window, int64_t dim,
                              KvError *err);

/* Allocates the four guarded buffers of s for batch x slots x dim (slots may
 * be 0: zero-byte buffers, still guarded). False when any allocation failed;
 * the ones that succeeded stay in s for kv_slots_free. The contents are the
 * guard pattern until kv_slots_clear. */
bool kv_slots_alloc(KvCacheSlots *s, int64_t batch, int64_t slots, int64_t dim);

/* Frees every buffer of s; NULL buffers (a failed or never-run alloc) are
 * skipped. s itself is not freed. */
void kv_slots_free(KvCacheSlots *s);

/* Empties every slot: K and V NaN (a read of a never-written slot poisons the
 * logits), real 0, pos -1. */
void kv_slots_clear(KvCacheSlots *s);

/* True when every sentinel region of the four buffers is intact. */
bool kv_slots_ok(const KvCacheSlots *s);

/* dst <- src, every buffer whole. Both must have the same shape. A copy, not
 * a pointer swap: the view's pointers stay fixed for the cache's lifetime, as
 * a captured graph needs. */
void kv_slots_copy(KvCacheSlots *dst, const KvCacheSlots *src);

/* The view of s with n_slots attended slots (row_stride is s->slots). */
KvCacheView kv_slots_view(const KvCacheSlots *s, int64_t n_slots);

/* s as persistent state, plus n_counters host scalars at counters (NULL, 0
 * when the variant keeps none). */
KvCacheState kv_slots_state(KvCacheSlots *s, int64_t *counters, int64_t n_counters);

/* Planted KV_FAULT_RACY_SHIFT, CPU analog (cache_racy_shift.c): slot i of
 * every row takes slot (i + shift) % window, for i < count, in place, in
 * blocks of KV_RACY_SHIFT_BLOCK (fault.h) elements run one after another, upwards or
 * downwards. K, V and real move; positions are the caller's. */
void kv_slots_shift_blocks(KvCacheSlots *s, int64_t window, int64_t count, int64_t shift,
                           bool downwards);

#endif
