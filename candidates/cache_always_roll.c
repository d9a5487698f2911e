/* cache_always_roll.c: the `always_roll` sliding-window cache variant
 * (DESIGN §3): no regime at all, the window always slides.
 *
 * Layout: right-aligned. After the cache has seen `total` positions, slot i
 * holds position total - W + i, empty (-1) when that is negative; so while
 * filling the data sits in the rightmost slots and the left ones are empty.
 *
 * Data movement for n new tokens (n == 1 is the decode fast path): with
 * m = min(n, W), copy the cache out to a temporary, roll left by m back into
 * the cache (slot i takes the temporary's slot (i + m) % W), then write the
 * last m new rows into the rightmost m slots, which the roll filled with the
 * m oldest rows. Empty slots move like any other, so the NaN poison of reset
 * and pos = -1 travel with them. Of a prefill longer than W, only the last W
 * rows are written.
 *
 * Why it exists: one code path for filling and full, so one graph, at the
 * price of moving every row on every step. It mirrors caches that slide
 * unconditionally; its bugs in the wild are the roll done in place (the
 * source row already overwritten when it is read, a race on a GPU) and an
 * n > W prefill that writes the first W rows instead of the last W. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cache_internal.h"
#include "cache_registry.h"

struct KvSlidingCache {
    const KvCacheOps *ops; /* &kv_cache_always_roll: a handle given to another table is refused */
    int64_t window;        /* W */
    KvCacheSlots cur;      /* W slots per row, the ones attention reads */
    /* A snapshot of the cache taken before the roll, the roll's source: the
     * roll then never reads a slot it has already written. */
    KvCacheSlots src;      /* W slots per row, same shape as cur */
};

static void always_roll_destroy(KvSlidingCache *c) {
    if (c == NULL) return;
    kv_slots_free(&c->cur);
    kv_slots_free(&c->src);
    free(c);
}

static void always_roll_reset(KvSlidingCache *c) {
    if (c == NULL || c->ops != &kv_cache_always_roll) return;
    kv_slots_clear(&c->cur);
    kv_slots_clear(&c->src);
}

static KvStatus always_roll_create(int64_t batch, int64_t window, int64_t dim,
                                   KvSlidingCache **out, KvError *err) {
    KvStatus st = kv_slots_check_create("always_roll", batch, window, dim, out, err);
    if (st != KV_OK) return st;
    KvSlidingCache *c = calloc(1, sizeof *c);
    if (c == NULL) {
        st = kv_slots_oom_struct("always_roll", err);
        goto cleanup;
    }
    c->ops = &kv_cache_always_roll;
    c->window = window;
    if (!kv_slots_alloc(&c->cur, batch, window, dim) ||
        !kv_slots_alloc(&c->src, batch, window, dim)) {
        st = kv_slots_oom_buffers("always_roll", batch, window, dim, err);
        goto cleanup;
    }
    always_roll_reset(c);
    *out = c;
    c = NULL;
cleanup:
    always_roll_destroy(c);
    return st;
}

/* k_new, v_new: (B, n, dim); real_new: (B, n); *total: positions stored before
 * this call (the device scalar); host_total: the host's count. */
static void always_roll_update(KvSlidingCache *c, const float *k_new, const float *v_new,
                               const uint8_t *real_new, int64_t n, const int64_t *total,
                               int64_t host_total) {
    (void)host_total; /* no regime: the same movement every step */
    if (c == NULL || c->ops != &kv_cache_always_roll || total == NULL || n < 1) return;
    KvCacheSlots *cur = &c->cur, *src = &c->src;
    const int64_t B = cur->batch, W = c->window, D = cur->dim;
    const size_t row_bytes = (size_t)D * sizeof(float);
    const int64_t p0 = *total; /* read now, as a graph reads device memory at replay */
    if (p0 < 0) return;        /* not a position: nothing sensible to store */
    const int64_t m = n < W ? n : W; /* rows that enter the window */

    /* Snapshot, then roll left by m from the snapshot into the cache:
     * slots 0 .. W-m-1 take the snapshot's slots m .. W-1, and the m oldest
     * rows wrap into the rightmost m slots (overwritten just below). */
    kv_slots_copy(src, cur);
    const int64_t keep = W - m;
    for (int64_t b = 0; b < B; b++) {
        float *kr = cur->k + b * W * D;        /* (W, dim) this row's slots */
        float *vr = cur->v + b * W * D;        /* (W, dim) */
        const float *ks = src->k + b * W * D;  /* (W, dim) */
        const float *vs = src->v + b * W * D;  /* (W, dim) */
        memcpy(kr, ks + m * D, (size_t)keep * row_bytes);
        memcpy(vr, vs + m * D, (size_t)keep * row_bytes);
        memcpy(kr + keep * D, ks, (size_t)m * row_bytes);
        memcpy(vr + keep * D, vs, (size_t)m * row_bytes);
        memcpy(cur->real + b * W, src->real + b * W + m, (size_t)keep);
        memcpy(cur->real + b * W + keep, src->real + b * W, (size_t)m);
    }
    memcpy(cur->pos, src->pos + m, (size_t)keep * sizeof(int64_t));
    memcpy(cur->pos + keep, src->pos, (size_t)m * sizeof(int64_t));

    /* The last m new rows (j = n - m .. n - 1) into slots keep .. W - 1. */
    for (int64_t t = 0; t < m; t++) {
        const int64_t j = n - m + t;
        const int64_t slot = keep + t;
        for (int64_t b = 0; b < B; b++) {
            memcpy(cur->k + (b * W + slot) * D, k_new + (b * n + j) * D, row_bytes);
            memcpy(cur->v + (b * W + slot) * D, v_new + (b * n + j) * D, row_bytes);
            cur->real[b * W + slot] = real_new[b * n + j];
        }
        cur->pos[slot] = p0 + j;
    }
}

static KvCacheView always_roll_view(const KvSlidingCache *c) {
    if (c == NULL || c->ops != &kv_cache_always_roll) return (KvCacheView){0};
    return kv_slots_view(&c->cur, c->window);
}

static int always_roll_regime(const KvSlidingCache *c, int64_t host_total) {
    (void)c;
    (void)host_total;
    return 0; /* no host regime: one graph for both */
}

/* One graph: no host regime and a fixed attended length (W), so the capture
 * key never changes during a decode; a second capture is a bug. */
static int64_t always_roll_graph_budget(int64_t window, int64_t prompt_len, int64_t decode_steps) {
    (void)window;
    (void)prompt_len;
    return decode_steps > 0 ? 1 : 0;
}

static bool always_roll_sentinels_ok(const KvSlidingCache *c) {
    if (c == NULL || c->ops != &kv_cache_always_roll) return false;
    return kv_slots_ok(&c->cur) && kv_slots_ok(&c->src);
}

/* The persistent state: the slots; temporaries are scratch. */
static KvCacheState always_roll_state(KvSlidingCache *c) {
    return kv_slots_state(&c->cur, NULL, 0);
}

const KvCacheOps kv_cache_always_roll = {
    .name = "always_roll",
    .one_token_order = KV_ATTEND_AFTER_UPDATE,
    .host_branch = false,
    .host_shape = false,
    .layout = KV_LAYOUT_RIGHT_ALIGNED,
    .create = always_roll_create,
    .destroy = always_roll_destroy,
    .reset = always_roll_reset,
    .update = always_roll_update,
    .view = always_roll_view,
    .regime = always_roll_regime,
    .sentinels_ok = always_roll_sentinels_ok,
    .state = always_roll_state,
    .graph_budget = always_roll_graph_budget,
};
