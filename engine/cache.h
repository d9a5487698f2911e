/* cache.h: the sliding-window cache-layer interface (DESIGN §3), ggml-style:
 * a table of function pointers (KvCacheOps) plus an opaque context.
 *
 * A sliding layer keeps W slots per batch row (dynamic keeps W - 1). The
 * forward pass hands the cache the K/V rows of n >= 1 new tokens; the cache
 * stores the last min(W, seen) tokens in its own layout and exposes a view:
 * the slots, per row whether the token there is real (pads are never
 * visible), and the position the writer recorded for each slot. Attention
 * finds a slot's position from the variant's layout rule (layout.h), as a
 * real kernel does, not from that record; it gathers the visible keys and
 * reduces them in ascending position (the canonical key order), so any
 * correct variant is bitwise equal to the reference, and a writer that
 * stores a key where its rule does not look for it changes the outputs. The
 * recorded positions are an independent check (the cache probe).
 *
 * Positions here are cache positions: they count padded slots, exactly as
 * the reference's slot index does (DESIGN §2). All rows advance together.
 *
 * Two scalars, on purpose: `*total` is the number of positions stored so
 * far read from memory (what a CUDA graph would read from device memory);
 * `host_total` is the host's own count, which only host-branch variants
 * (cat_shift, roll) may use, and only to choose their regime, as
 * transformers' `is_full` does. Graph mode bakes that choice in at capture. */
#ifndef KV_CACHE_H
#define KV_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "layout.h"
#include "status.h"

typedef struct KvSlidingCache KvSlidingCache; /* opaque, one per sliding layer */

typedef struct {
    int64_t n_slots;      /* slots attention may read (W, or W - 1 for dynamic) */
    int64_t row_stride;   /* slots between consecutive rows in k, v, real */
    int64_t dim;          /* floats per slot (num_kv_heads * head_dim) */
    const float *k;       /* (B, row_stride, dim) */
    const float *v;       /* (B, row_stride, dim) */
    const int64_t *pos;   /* (n_slots) position the writer recorded for slot i, -1 = empty;
                           * checked against the layout rule, never read by attention */
    const uint8_t *real;  /* (B, row_stride) 1 when the token in the slot is real */
} KvCacheView;

/* Everything of a cache that persists between updates, for snapshots (the
 * replay check restores it before each replay). Temporaries are scratch and
 * not part of it. */
typedef struct {
    float *k;           /* (B, slots, dim) */
    float *v;           /* (B, slots, dim) */
    uint8_t *real;      /* (B, slots) */
    int64_t *pos;       /* (slots) */
    int64_t *counters;  /* (n_counters) host-side scalars that persist (dynamic: filled) */
    int64_t batch, slots, dim, n_counters;
} KvCacheState;

/* When attention reads the cache relative to the update. */
typedef enum {
    /* n == 1 fast path: update, then attend over the view alone (the new
     * key is in the cache). n > 1 always uses KV_ATTEND_BEFORE_UPDATE. */
    KV_ATTEND_AFTER_UPDATE = 0,
    /* attend over the view plus the new keys, then update (dynamic, and
     * every variant when n > 1). */
    KV_ATTEND_BEFORE_UPDATE = 1,
} KvAttendOrder;

typedef struct {
    const char *name;
    KvAttendOrder one_token_order; /* order used for n == 1 */
    bool host_branch;              /* regime chosen on the host (cat_shift, roll) */
    bool host_shape;               /* keeps W - 1 slots and attends over the filled ones: a
                                    * length the host knows and a graph bakes in (dynamic) */
    KvLayoutRule layout;           /* which position each slot holds (layout.h): what attention
                                    * and the cache probe read keys by; pos[] is only checked */

    /* Allocates a cache for `batch` rows of `window` slots of `dim` floats,
     * every buffer wrapped in sentinel regions (kv_guard_alloc). */
    KvStatus (*create)(int64_t batch, int64_t window, int64_t dim, KvSlidingCache **out,
                       KvError *err);
    void (*destroy)(KvSlidingCache *c); /* NULL-safe */
    /* Empties every slot (pos = -1, real = 0) and poisons K/V with NaN so a
     * read of a never-written slot shows up in the logits. */
    void (*reset)(KvSlidingCache *c);
    /* Stores n >= 1 new tokens at positions *total .. *total + n - 1.
     * k_new, v_new: (B, n, dim); real_new: (B, n). After the call the cache
     * holds the last min(W, *total + n) positions (dynamic: W - 1). The
     * caller advances *total afterwards. */
    void (*update)(KvSlidingCache *c, const float *k_new, const float *v_new,
                   const uint8_t *real_new, int64_t n, const int64_t *total, int64_t host_total);
    /* The pointers stay fixed for the cache's lifetime (a captured graph
     * keeps them by value); n_slots, pos and the contents change. */
    KvCacheView (*view)(const KvSlidingCache *c);
    /* Host regime for host-branch variants: 0 filling, 1 full; always 0 for
     * the others. Graph mode re-captures when it changes. */
    int (*regime)(const KvSlidingCache *c, int64_t host_total);
    /* True when every sentinel region is intact (tests call it every step). */
    bool (*sentinels_ok)(const KvSlidingCache *c);
    /* The persistent state (buffers and counters), for snapshots. */
    KvCacheState (*state)(KvSlidingCache *c);
    /* Planted faults (fault.h): the variant keeps the KV_FAULT_* bits it
     * implements and ignores the rest. NULL when it implements none. */
    void (*plant)(KvSlidingCache *c, unsigned faults);
    /* The most graphs a graph-mode decode of this layout is designed to need
     * (DESIGN §3, "graphs per decode"): decode_steps one-token steps after a
     * prefill of prompt_len positions, on sliding layers of `window` slots.
     * The graph runner re-captures only when the capture key changes (the
     * host regime or the attended length), so the budget is one graph plus
     * the key changes the layout makes by design. The gate records it on
     * every graph-mode run and fails a run that captures more (comparison
     * kind graph_budget): a re-capture per step is the recompile-per-step
     * bug. decode_steps <= 0 captures nothing. */
    int64_t (*graph_budget)(int64_t window, int64_t prompt_len, int64_t decode_steps);
} KvCacheOps;

/* Snapshots of a cache's persistent state (KvCacheState): bytes needed,
 * save into dst, restore from src. Used by the replay check. */
size_t kv_cache_snapshot_bytes(const KvCacheOps *ops, KvSlidingCache *c);
void kv_cache_snapshot_save(const KvCacheOps *ops, KvSlidingCache *c, void *dst);
void kv_cache_snapshot_load(const KvCacheOps *ops, KvSlidingCache *c, const void *src);
/* Restores only the host counters of a snapshot, leaving the slots (K, V,
 * real, recorded positions) as they are: the planted KV_FAULT_PREFIX_ALIAS,
 * a prefix-cache entry that shares the live cache's slots. */
void kv_cache_snapshot_load_counters(const KvCacheOps *ops, KvSlidingCache *c, const void *src);

/* Sentinel-guarded buffers: KV_GUARD_FLOATS floats of a fixed bit pattern
 * before and after the n usable bytes. */
#define KV_GUARD_FLOATS 64
void *kv_guard_alloc(size_t bytes);
void kv_guard_free(void *p);
bool kv_guard_ok(const void *p);

#endif
