/* cache_ring.c: the `ring` sliding-window cache variant (DESIGN §3), the
 * ring buffer production engines use.
 *
 * Layout: position p lives in slot p % W; pos[slot] records which position a
 * slot holds, so the slots are not in position order once the ring wraps.
 *
 * Data movement: none. Each new token is written once, at slot p % W with p
 * counted from *total read at call time; nothing already stored moves. For
 * n > 1 new tokens only the last min(n, W) are written (earlier ones would be
 * overwritten within the same call anyway), which is how a prefill longer
 * than W keeps exactly its last W rows.
 *
 * Why it exists: it is the cheapest update and the baseline the others are
 * measured against; since attention must then order keys by position (from
 * the rule slot = p % W, layout.h) rather than by slot, it checks that the
 * canonical key order (DESIGN §2) really does not depend on the slot. Its bugs in the wild: p % W computed from a
 * stale position (the wrong slot overwritten), and a mask that trusts slot
 * order instead of pos[]. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cache_internal.h"
#include "cache_registry.h"
#include "fault.h"

struct KvSlidingCache {
    const KvCacheOps *ops; /* &kv_cache_ring: a handle given to another table is refused */
    int64_t window;        /* W */
    KvCacheSlots cur;      /* W slots per row, the ones attention reads */
    unsigned faults;       /* planted: KV_FAULT_RING_SLOT or 0 */
};

static void ring_destroy(KvSlidingCache *c) {
    if (c == NULL) return;
    kv_slots_free(&c->cur);
    free(c);
}

static void ring_reset(KvSlidingCache *c) {
    if (c == NULL || c->ops != &kv_cache_ring) return;
    kv_slots_clear(&c->cur);
}

static KvStatus ring_create(int64_t batch, int64_t window, int64_t dim, KvSlidingCache **out,
                            KvError *err) {
    KvStatus st = kv_slots_check_create("ring", batch, window, dim, out, err);
    if (st != KV_OK) return st;
    KvSlidingCache *c = calloc(1, sizeof *c);
    if (c == NULL) {
        st = kv_slots_oom_struct("ring", err);
        goto cleanup;
    }
    c->ops = &kv_cache_ring;
    c->window = window;
    if (!kv_slots_alloc(&c->cur, batch, window, dim)) {
        st = kv_slots_oom_buffers("ring", batch, window, dim, err);
        goto cleanup;
    }
    ring_reset(c);
    *out = c;
    c = NULL;
cleanup:
    ring_destroy(c);
    return st;
}

/* k_new, v_new: (B, n, dim); real_new: (B, n); *total: positions stored before
 * this call (the device scalar); host_total: the host's count. */
static void ring_update(KvSlidingCache *c, const float *k_new, const float *v_new,
                        const uint8_t *real_new, int64_t n, const int64_t *total,
                        int64_t host_total) {
    (void)host_total; /* the slot comes from the device scalar alone */
    if (c == NULL || c->ops != &kv_cache_ring || total == NULL || n < 1) return;
    KvCacheSlots *s = &c->cur;
    const int64_t W = c->window, D = s->dim;
    const size_t row_bytes = (size_t)D * sizeof(float);
    const int64_t p0 = *total; /* read now, as a graph reads device memory at replay */
    if (p0 < 0) return;        /* not a position: nothing sensible to store */
    const int64_t j0 = n > W ? n - W : 0;
    for (int64_t j = j0; j < n; j++) {
        const int64_t p = p0 + j;
        /* KV_FAULT_RING_SLOT: one slot ahead, recorded faithfully in pos[],
         * so only a reader that follows the rule p % W sees it. */
        const int64_t slot = (c->faults & KV_FAULT_RING_SLOT) ? (p + 1) % W : p % W;
        for (int64_t b = 0; b < s->batch; b++) {
            memcpy(s->k + (b * W + slot) * D, k_new + (b * n + j) * D, row_bytes);
            memcpy(s->v + (b * W + slot) * D, v_new + (b * n + j) * D, row_bytes);
            s->real[b * W + slot] = real_new[b * n + j];
        }
        s->pos[slot] = p;
    }
}

static void ring_plant(KvSlidingCache *c, unsigned faults) {
    if (c == NULL || c->ops != &kv_cache_ring) return;
    c->faults = faults & KV_FAULT_RING_SLOT;
}

static KvCacheView ring_view(const KvSlidingCache *c) {
    if (c == NULL || c->ops != &kv_cache_ring) return (KvCacheView){0};
    return kv_slots_view(&c->cur, c->window);
}

static int ring_regime(const KvSlidingCache *c, int64_t host_total) {
    (void)c;
    (void)host_total;
    return 0; /* no host regime: one graph for both */
}

/* One graph: no host regime and a fixed attended length (W), so the capture
 * key never changes during a decode; a second capture is a bug. */
static int64_t ring_graph_budget(int64_t window, int64_t prompt_len, int64_t decode_steps) {
    (void)window;
    (void)prompt_len;
    return decode_steps > 0 ? 1 : 0;
}

static bool ring_sentinels_ok(const KvSlidingCache *c) {
    if (c == NULL || c->ops != &kv_cache_ring) return false;
    return kv_slots_ok(&c->cur);
}

/* The persistent state: the slots. */
static KvCacheState ring_state(KvSlidingCache *c) {
    return kv_slots_state(&c->cur, NULL, 0);
}

const KvCacheOps kv_cache_ring = {
    .name = "ring",
    .one_token_order = KV_ATTEND_AFTER_UPDATE,
    .host_branch = false,
    .host_shape = false,
    .layout = KV_LAYOUT_RING,
    .create = ring_create,
    .destroy = ring_destroy,
    .reset = ring_reset,
    .update = ring_update,
    .view = ring_view,
    .regime = ring_regime,
    .sentinels_ok = ring_sentinels_ok,
    .state = ring_state,
    .plant = ring_plant,
    .graph_budget = ring_graph_budget,
};
