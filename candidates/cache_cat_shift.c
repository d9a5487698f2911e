/* cache_cat_shift.c: the `cat_shift` sliding-window cache variant
 * (DESIGN §3), transformers' SlidingWindowLayer with a host `is_full` flag.
 *
 * Layout: W slots per row in ascending position (slot i holds i while
 * filling, total - W + i once full), the same as index_copy.
 *
 * Data movement for one new token, with the regime chosen on the host from
 * host_total (is_full = host_total >= W, as transformers keeps a Python
 * bool):
 *   - filling: index_copy of the new row straight into the cache at slot
 *     clamp(p, 0, W - 1), p read from *total;
 *   - full: cat(keys[:, 1:], new) built in a separate temporary, then copied
 *     back over the cache. Two distinct buffers: the shift by one row never
 *     reads a row that the same pass already overwrote.
 * For n > 1 new tokens: cat(the stored rows, the new rows) and keep the last
 * min(W, stored + n), again through the temporary (a prefill longer than W
 * keeps its last W rows).
 *
 * Why it exists: the regime is a host branch, so a captured graph bakes in
 * one side of it; graph mode must re-capture when is_full flips. The bugs
 * this shape has in the wild: a graph not re-captured at the flip (filling
 * code replayed on a full cache), and the shift done in place
 * (keys[:, :-1] = keys[:, 1:]), which races across blocks on a GPU. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cache_internal.h"
#include "cache_registry.h"
#include "fault.h"

struct KvSlidingCache {
    const KvCacheOps *ops; /* &kv_cache_cat_shift: a handle given to another table is refused */
    int64_t window;        /* W */
    KvCacheSlots cur;      /* W slots per row, the ones attention reads */
    /* The cat result, distinct from the cache so the shift never overlaps. */
    KvCacheSlots tmp;      /* W slots per row, same shape as cur */
    unsigned faults;       /* planted: KV_FAULT_INPLACE_SHIFT, KV_FAULT_RACY_SHIFT or 0 */
};

static void cat_shift_destroy(KvSlidingCache *c) {
    if (c == NULL) return;
    kv_slots_free(&c->cur);
    kv_slots_free(&c->tmp);
    free(c);
}

static void cat_shift_reset(KvSlidingCache *c) {
    if (c == NULL || c->ops != &kv_cache_cat_shift) return;
    kv_slots_clear(&c->cur);
    kv_slots_clear(&c->tmp);
}

static KvStatus cat_shift_create(int64_t batch, int64_t window, int64_t dim, KvSlidingCache **out,
                                 KvError *err) {
    KvStatus st = kv_slots_check_create("cat_shift", batch, window, dim, out, err);
    if (st != KV_OK) return st;
    KvSlidingCache *c = calloc(1, sizeof *c);
    if (c == NULL) {
        st = kv_slots_oom_struct("cat_shift", err);
        goto cleanup;
    }
    c->ops = &kv_cache_cat_shift;
    c->window = window;
    if (!kv_slots_alloc(&c->cur, batch, window, dim) ||
        !kv_slots_alloc(&c->tmp, batch, window, dim)) {
        st = kv_slots_oom_buffers("cat_shift", batch, window, dim, err);
        goto cleanup;
    }
    cat_shift_reset(c);
    *out = c;
    c = NULL;
cleanup:
    cat_shift_destroy(c);
    return st;
}

/* The temporary becomes the cache (a copy, not a pointer swap: the view's
 * pointers stay fixed for the cache's lifetime, as a captured graph needs). */
static void cat_shift_commit(KvSlidingCache *c) {
    kv_slots_copy(&c->cur, &c->tmp);
}

static int cat_shift_regime(const KvSlidingCache *c, int64_t host_total) {
    if (c == NULL) return 0;
    return host_total >= c->window ? 1 : 0;
}

/* Two graphs: one per side of the host is_full branch, which a graph bakes
 * in (transformers' one recompile when the window fills). A decode that
 * never crosses W needs only one; the budget is the design's most. */
static int64_t cat_shift_graph_budget(int64_t window, int64_t prompt_len, int64_t decode_steps) {
    (void)window;
    (void)prompt_len;
    return decode_steps > 0 ? 2 : 0;
}

/* One new token at position p0 into slot `slot` of every row of cur.
 * k_new, v_new: (B, 1, dim); real_new: (B, 1). */
static void cat_shift_put_one(KvCacheSlots *cur, int64_t W, int64_t slot, const float *k_new,
                              const float *v_new, const uint8_t *real_new, int64_t p0) {
    const int64_t D = cur->dim;
    for (int64_t b = 0; b < cur->batch; b++) {
        memcpy(cur->k + (b * W + slot) * D, k_new + b * D, (size_t)D * sizeof(float));
        memcpy(cur->v + (b * W + slot) * D, v_new + b * D, (size_t)D * sizeof(float));
        cur->real[b * W + slot] = real_new[b];
    }
    cur->pos[slot] = p0;
}

/* k_new, v_new: (B, n, dim); real_new: (B, n); *total: positions stored before
 * this call (the device scalar); host_total: the host's count. */
static void cat_shift_update(KvSlidingCache *c, const float *k_new, const float *v_new,
                             const uint8_t *real_new, int64_t n, const int64_t *total,
                             int64_t host_total) {
    if (c == NULL || c->ops != &kv_cache_cat_shift || total == NULL || n < 1) return;
    KvCacheSlots *cur = &c->cur, *tmp = &c->tmp;
    const int64_t B = cur->batch, W = c->window, D = cur->dim;
    const size_t row_bytes = (size_t)D * sizeof(float);
    /* Positions come from the device scalar; host_total only picks the regime. */
    const int64_t p0 = *total;
    if (p0 < 0) return; /* not a position: nothing sensible to store */

    if (n == 1 && cat_shift_regime(c, host_total) == 0) {
        /* Filling: index_copy at the position, in place (no row moves). The
         * clamp is transformers'; it keeps a stale regime in bounds. */
        cat_shift_put_one(cur, W, p0 < W - 1 ? p0 : W - 1, k_new, v_new, real_new, p0);
        return;
    }

    if (n == 1 && (c->faults & (KV_FAULT_RACY_SHIFT | KV_FAULT_INPLACE_SHIFT))) {
        /* keys[:, :-1] = keys[:, 1:] with no temporary (fault.h). */
        if (c->faults & KV_FAULT_RACY_SHIFT) {
            /* Planted KV_FAULT_RACY_SHIFT: by blocks walking upwards, in
             * order: right on the CPU, a race on a GPU (cache_racy_shift.c). */
            kv_slots_shift_blocks(cur, W, W - 1, 1, false);
        } else {
            /* Planted KV_FAULT_INPLACE_SHIFT: on a GPU the blocks race; the
             * CPU analog is the overlapping copy run in the wrong direction
             * (last slot first), so every slot ends up holding the newest
             * old row. */
            for (int64_t b = 0; b < B; b++) {
                for (int64_t i = W - 2; i >= 0; i--) {
                    memcpy(cur->k + (b * W + i) * D, cur->k + (b * W + i + 1) * D, row_bytes);
                    memcpy(cur->v + (b * W + i) * D, cur->v + (b * W + i + 1) * D, row_bytes);
                    cur->real[b * W + i] = cur->real[b * W + i + 1];
                }
            }
        }
        /* The positions are bookkeeping and stay right, so the cache looks
         * plausible. */
        memmove(cur->pos, cur->pos + 1, (size_t)(W - 1) * sizeof(int64_t));
        cat_shift_put_one(cur, W, W - 1, k_new, v_new, real_new, p0);
        return;
    }

    if (n == 1) {
        /* Full: tmp = cat(keys[:, 1:], new), then keys = tmp. */
        for (int64_t b = 0; b < B; b++) {
            memcpy(tmp->k + b * W * D, cur->k + (b * W + 1) * D, (size_t)(W - 1) * row_bytes);
            memcpy(tmp->v + b * W * D, cur->v + (b * W + 1) * D, (size_t)(W - 1) * row_bytes);
            memcpy(tmp->real + b * W, cur->real + b * W + 1, (size_t)(W - 1));
            memcpy(tmp->k + (b * W + W - 1) * D, k_new + b * D, row_bytes);
            memcpy(tmp->v + (b * W + W - 1) * D, v_new + b * D, row_bytes);
            tmp->real[b * W + W - 1] = real_new[b];
        }
        memcpy(tmp->pos, cur->pos + 1, (size_t)(W - 1) * sizeof(int64_t));
        tmp->pos[W - 1] = p0;
        cat_shift_commit(c);
        return;
    }

    /* n > 1: seq = cat(stored rows, new rows) of length stored + n; the cache
     * keeps its last min(W, stored + n) entries in slots 0.. and the rest
     * stay empty. stored comes from the device position, like p0. */
    const int64_t stored = p0 < W ? p0 : W;
    const int64_t len = stored + n;
    const int64_t keep = len < W ? len : W;
    const int64_t start = len - keep;
    for (int64_t i = 0; i < keep; i++) {
        const int64_t s = start + i; /* index into seq */
        for (int64_t b = 0; b < B; b++) {
            const int64_t dst = b * W + i;
            if (s < stored) {
                memcpy(tmp->k + dst * D, cur->k + (b * W + s) * D, row_bytes);
                memcpy(tmp->v + dst * D, cur->v + (b * W + s) * D, row_bytes);
                tmp->real[dst] = cur->real[b * W + s];
            } else {
                const int64_t j = s - stored; /* new row */
                memcpy(tmp->k + dst * D, k_new + (b * n + j) * D, row_bytes);
                memcpy(tmp->v + dst * D, v_new + (b * n + j) * D, row_bytes);
                tmp->real[dst] = real_new[b * n + j];
            }
        }
        tmp->pos[i] = s < stored ? cur->pos[s] : p0 + (s - stored);
    }
    for (int64_t i = keep; i < W; i++) {
        /* Still empty: the poison of reset, so a read shows in the logits. */
        for (int64_t b = 0; b < B; b++) {
            const int64_t dst = b * W + i;
            for (int64_t e = 0; e < D; e++) {
                tmp->k[dst * D + e] = NAN;
                tmp->v[dst * D + e] = NAN;
            }
            tmp->real[dst] = 0;
        }
        tmp->pos[i] = -1;
    }
    cat_shift_commit(c);
}

static void cat_shift_plant(KvSlidingCache *c, unsigned faults) {
    if (c == NULL || c->ops != &kv_cache_cat_shift) return;
    c->faults = faults & (KV_FAULT_INPLACE_SHIFT | KV_FAULT_RACY_SHIFT);
}

static KvCacheView cat_shift_view(const KvSlidingCache *c) {
    if (c == NULL || c->ops != &kv_cache_cat_shift) return (KvCacheView){0};
    return kv_slots_view(&c->cur, c->window);
}

static bool cat_shift_sentinels_ok(const KvSlidingCache *c) {
    if (c == NULL || c->ops != &kv_cache_cat_shift) return false;
    return kv_slots_ok(&c->cur) && kv_slots_ok(&c->tmp);
}

/* The persistent state: the slots; temporaries are scratch. */
static KvCacheState cat_shift_state(KvSlidingCache *c) {
    return kv_slots_state(&c->cur, NULL, 0);
}

const KvCacheOps kv_cache_cat_shift = {
    .name = "cat_shift",
    .one_token_order = KV_ATTEND_AFTER_UPDATE,
    .host_branch = true,
    .host_shape = false,
    .layout = KV_LAYOUT_LEFT_ALIGNED,
    .create = cat_shift_create,
    .destroy = cat_shift_destroy,
    .reset = cat_shift_reset,
    .update = cat_shift_update,
    .view = cat_shift_view,
    .regime = cat_shift_regime,
    .sentinels_ok = cat_shift_sentinels_ok,
    .state = cat_shift_state,
    .plant = cat_shift_plant,
    .graph_budget = cat_shift_graph_budget,
};
