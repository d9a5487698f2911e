/* cache_index_copy.c: the `index_copy` sliding-window cache variant
 * (DESIGN §3), transformers' original SlidingWindowCache.update.
 *
 * Layout: W slots per row in ascending position. While filling, slot i holds
 * position i; once full, slot i holds total - W + i.
 *
 * Data movement for one new token at position p, with p read from *total at
 * call time (the device-side cache_position): indices (i + shift) % W with
 * shift = (p >= W ? 1 : 0), a gather of K, V, real and pos through those
 * indices into a temporary (transformers' `k_out = k_out[:, :, indices]`),
 * an index_copy of the new row into the temporary at slot clamp(p, 0, W - 1),
 * and a copy of the temporary back into the cache (`self.keys.copy_(k_out)`).
 * For n > 1 new tokens the gather shifts by the number of positions that
 * leave the window, then the new rows that stay are index-copied at their
 * slots; of a prefill longer than W only the last W rows are kept.
 *
 * Why it exists: the regime (filling or full) lives in the gather indices
 * computed from a device scalar, with no host branch, so one captured graph
 * serves both regimes. The bugs this shape has in the wild: a position
 * captured by value into the graph (a stale shift), a shift threshold off by
 * one (p >= W - 1), a gather done in place over its own source, and a long
 * prefill that stores the first W rows instead of the last W. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cache_internal.h"
#include "cache_registry.h"
#include "fault.h"

struct KvSlidingCache {
    const KvCacheOps *ops; /* &kv_cache_index_copy: a handle given to another table is refused */
    int64_t window;        /* W */
    KvCacheSlots cur;      /* W slots per row, the ones attention reads */
    /* The gather target (k_out): a buffer distinct from the cache, because a
     * gather through a permutation cannot run in place. */
    KvCacheSlots tmp;      /* W slots per row, same shape as cur */
    int64_t *indices;      /* (W) gather indices, recomputed from *total on every update */
    unsigned faults;       /* planted: KV_FAULT_PREFILL_FIRST_W, KV_FAULT_STATIC_LAYER or 0 */
};

static void index_copy_destroy(KvSlidingCache *c) {
    if (c == NULL) return;
    kv_slots_free(&c->cur);
    kv_slots_free(&c->tmp);
    kv_guard_free(c->indices);
    free(c);
}

static void index_copy_reset(KvSlidingCache *c) {
    if (c == NULL || c->ops != &kv_cache_index_copy) return;
    /* The temporaries too, so no earlier run can leak through them. */
    kv_slots_clear(&c->cur);
    kv_slots_clear(&c->tmp);
    for (int64_t i = 0; i < c->window; i++) c->indices[i] = i;
}

static KvStatus index_copy_create(int64_t batch, int64_t window, int64_t dim, KvSlidingCache **out,
                                  KvError *err) {
    KvStatus st = kv_slots_check_create("index_copy", batch, window, dim, out, err);
    if (st != KV_OK) return st;
    KvSlidingCache *c = calloc(1, sizeof *c);
    if (c == NULL) {
        st = kv_slots_oom_struct("index_copy", err);
        goto cleanup;
    }
    c->ops = &kv_cache_index_copy;
    c->window = window;
    c->indices = kv_guard_alloc((size_t)window * sizeof(int64_t));
    if (!kv_slots_alloc(&c->cur, batch, window, dim) ||
        !kv_slots_alloc(&c->tmp, batch, window, dim) || c->indices == NULL) {
        st = kv_slots_oom_buffers("index_copy", batch, window, dim, err);
        goto cleanup;
    }
    index_copy_reset(c);
    *out = c;
    c = NULL;
cleanup:
    index_copy_destroy(c);
    return st;
}

/* k_out = cache[:, :, indices] for K, V, real and pos. */
static void index_copy_gather(KvSlidingCache *c) {
    const KvCacheSlots *cur = &c->cur;
    KvCacheSlots *tmp = &c->tmp;
    const int64_t W = c->window, D = cur->dim;
    const size_t row_bytes = (size_t)D * sizeof(float);
    for (int64_t b = 0; b < cur->batch; b++) {
        for (int64_t i = 0; i < W; i++) {
            const int64_t src = b * W + c->indices[i];
            const int64_t dst = b * W + i;
            memcpy(tmp->k + dst * D, cur->k + src * D, row_bytes);
            memcpy(tmp->v + dst * D, cur->v + src * D, row_bytes);
            tmp->real[dst] = cur->real[src];
        }
    }
    for (int64_t i = 0; i < W; i++) tmp->pos[i] = cur->pos[c->indices[i]];
}

/* k_out[:, :, slot] = new[:, j] (index_copy of one new token into the
 * gathered temporary). k_new, v_new: (B, n, dim); real_new: (B, n). */
static void index_copy_put(KvSlidingCache *c, int64_t slot, const float *k_new, const float *v_new,
                           const uint8_t *real_new, int64_t n, int64_t j, int64_t position) {
    KvCacheSlots *tmp = &c->tmp;
    const int64_t W = c->window, D = tmp->dim;
    const size_t row_bytes = (size_t)D * sizeof(float);
    for (int64_t b = 0; b < tmp->batch; b++) {
        const int64_t dst = b * W + slot;
        memcpy(tmp->k + dst * D, k_new + (b * n + j) * D, row_bytes);
        memcpy(tmp->v + dst * D, v_new + (b * n + j) * D, row_bytes);
        tmp->real[dst] = real_new[b * n + j];
    }
    tmp->pos[slot] = position;
}

/* self.keys.copy_(k_out): the temporary becomes the cache. A copy rather than
 * a pointer swap keeps the view's pointers fixed for the cache's lifetime,
 * which a captured graph relies on. */
static void index_copy_commit(KvSlidingCache *c) {
    kv_slots_copy(&c->cur, &c->tmp);
}

/* k_new, v_new: (B, n, dim); real_new: (B, n); *total: positions stored before
 * this call (the device scalar); host_total: the host's count. */
static void index_copy_update(KvSlidingCache *c, const float *k_new, const float *v_new,
                              const uint8_t *real_new, int64_t n, const int64_t *total,
                              int64_t host_total) {
    (void)host_total; /* the regime is in the indices, computed from the device scalar */
    if (c == NULL || c->ops != &kv_cache_index_copy || total == NULL || n < 1) return;
    const int64_t W = c->window;
    const int64_t p0 = *total; /* read now, as a graph reads device memory at replay */
    if (p0 < 0) return;        /* not a position: nothing sensible to store */

    if (c->faults & KV_FAULT_STATIC_LAYER) {
        /* Planted (fault.h): a static layer of W slots, StaticLayer.update's
         * index_copy_ at cache_position with positions past the end clamped
         * to W - 1. No shift: the gather is the identity. Rows in order, so
         * of several rows clamped to W - 1 the last one stays. */
        for (int64_t i = 0; i < W; i++) c->indices[i] = i;
        index_copy_gather(c);
        for (int64_t j = 0; j < n; j++) {
            const int64_t p = p0 + j;
            index_copy_put(c, p < W - 1 ? p : W - 1, k_new, v_new, real_new, n, j, p);
        }
        index_copy_commit(c);
        return;
    }

    if (n == 1) {
        /* transformers: to_shift = cache_position >= W; indices =
         * (arange(W) + to_shift) % W; k_out[:, :, clamp(pos, 0, W - 1)] = new. */
        const int64_t shift = p0 >= W ? 1 : 0;
        for (int64_t i = 0; i < W; i++) c->indices[i] = (i + shift) % W;
        index_copy_gather(c);
        const int64_t slot = p0 < W - 1 ? p0 : W - 1;
        index_copy_put(c, slot, k_new, v_new, real_new, 1, 0, p0);
        index_copy_commit(c);
        return;
    }

    /* n > 1: slot i holds first + i before and first' + i after, so the
     * gather shifts by first' - first; new rows then land at p - first'. */
    const int64_t end = p0 + n;
    const int64_t first_old = p0 > W ? p0 - W : 0;
    const int64_t first_new = end > W ? end - W : 0;
    const int64_t shift = (first_new - first_old) % W;
    for (int64_t i = 0; i < W; i++) c->indices[i] = (i + shift) % W;
    index_copy_gather(c);
    /* Only new rows inside the window are stored: of a prefill longer than W,
     * the last W. Planted KV_FAULT_PREFILL_FIRST_W (fault.h): the slots and
     * positions are right but the data comes from the first rows
     * (key_states[:, :, :W] instead of [:, :, -W:]). */
    const int64_t j0 = first_new > p0 ? first_new - p0 : 0;
    const bool first_w = (c->faults & KV_FAULT_PREFILL_FIRST_W) != 0;
    for (int64_t j = j0; j < n; j++) {
        index_copy_put(c, p0 + j - first_new, k_new, v_new, real_new, n, first_w ? j - j0 : j,
                       p0 + j);
    }
    index_copy_commit(c);
}

static void index_copy_plant(KvSlidingCache *c, unsigned faults) {
    if (c == NULL || c->ops != &kv_cache_index_copy) return;
    c->faults = faults & (KV_FAULT_PREFILL_FIRST_W | KV_FAULT_STATIC_LAYER);
}

static KvCacheView index_copy_view(const KvSlidingCache *c) {
    if (c == NULL || c->ops != &kv_cache_index_copy) return (KvCacheView){0};
    return kv_slots_view(&c->cur, c->window);
}

static int index_copy_regime(const KvSlidingCache *c, int64_t host_total) {
    (void)c;
    (void)host_total;
    return 0; /* no host regime: one graph for both */
}

/* One graph: no host regime and a fixed attended length (W), so the capture
 * key never changes during a decode; a second capture is a bug. */
static int64_t index_copy_graph_budget(int64_t window, int64_t prompt_len, int64_t decode_steps) {
    (void)window;
    (void)prompt_len;
    return decode_steps > 0 ? 1 : 0;
}

static bool index_copy_sentinels_ok(const KvSlidingCache *c) {
    if (c == NULL || c->ops != &kv_cache_index_copy) return false;
    return kv_slots_ok(&c->cur) && kv_slots_ok(&c->tmp) && kv_guard_ok(c->indices);
}

/* The persistent state: the slots; temporaries are scratch. */
static KvCacheState index_copy_state(KvSlidingCache *c) {
    return kv_slots_state(&c->cur, NULL, 0);
}

const KvCacheOps kv_cache_index_copy = {
    .name = "index_copy",
    .one_token_order = KV_ATTEND_AFTER_UPDATE,
    .host_branch = false,
    .host_shape = false,
    .layout = KV_LAYOUT_LEFT_ALIGNED,
    .create = index_copy_create,
    .destroy = index_copy_destroy,
    .reset = index_copy_reset,
    .update = index_copy_update,
    .view = index_copy_view,
    .regime = index_copy_regime,
    .sentinels_ok = index_copy_sentinels_ok,
    .state = index_copy_state,
    .graph_budget = index_copy_graph_budget,
    .plant = index_copy_plant,
};
