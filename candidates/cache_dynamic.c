/* cache_dynamic.c: the `dynamic` sliding-window cache variant (DESIGN §3),
 * transformers' DynamicSlidingWindowLayer.
 *
 * Layout: W - 1 slots per row (not W: the new token is attended from the
 * call's own keys, so the cache only needs the W - 1 before it). The filled
 * slots hold ascending positions, the newest last; view.n_slots is the
 * number filled, growing 0 .. W - 1 while the window fills (the attended
 * length, hence the tensor shape, changes step to step until then).
 *
 * Data movement (attention reads the view plus the new keys first, then
 * calls update: KV_ATTEND_BEFORE_UPDATE even for one token):
 *   - one token, not yet full: append it at slot n_slots (the cat grows the
 *     tensor by one row);
 *   - one token, full: cat(keys[:, 1:], new) built in a temporary and copied
 *     back, transformers' `full = cat((keys, new)); keys = full[:, -(W-1):]`;
 *   - n > 1: cat(stored rows, new rows) and keep the last min(W - 1, stored
 *     + n) through the temporary (a prefill longer than the window keeps its
 *     last W - 1 rows).
 * The stored count is the cache's own (the tensor's shape in transformers),
 * not recomputed from *total; positions are counted from *total.
 * W = 1 keeps no slots at all: every update stores nothing.
 *
 * Why it exists: its cache has a different shape on every step until the
 * window fills, so a captured graph needs one capture per distinct length,
 * and the number of stored rows is W - 1, not W: the bugs of this shape in
 * the wild are a window off by one (keeping W rows, or W - 2) and a graph
 * replayed at a stale length. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cache_internal.h"
#include "cache_registry.h"
#include "fault.h"

struct KvSlidingCache {
    const KvCacheOps *ops; /* &kv_cache_dynamic: a handle given to another table is refused */
    int64_t window;        /* W */
    int64_t filled;        /* slots holding a position, 0 .. S (the attended length) */
    KvCacheSlots cur;      /* S = W - 1 slots per row (cur.slots), the capacity */
    /* The sliced cat result, distinct from the cache so the shift never
     * reads a row it has already overwritten. */
    KvCacheSlots tmp;      /* S slots per row, same shape as cur */
};

static void dynamic_destroy(KvSlidingCache *c) {
    if (c == NULL) return;
    kv_slots_free(&c->cur);
    kv_slots_free(&c->tmp);
    free(c);
}

static void dynamic_reset(KvSlidingCache *c) {
    if (c == NULL || c->ops != &kv_cache_dynamic) return;
    kv_slots_clear(&c->cur);
    kv_slots_clear(&c->tmp);
    c->filled = 0;
}

static KvStatus dynamic_create(int64_t batch, int64_t window, int64_t dim, KvSlidingCache **out,
                               KvError *err) {
    KvStatus st = kv_slots_check_create("dynamic", batch, window, dim, out, err);
    if (st != KV_OK) return st;
    KvSlidingCache *c = calloc(1, sizeof *c);
    if (c == NULL) {
        st = kv_slots_oom_struct("dynamic", err);
        goto cleanup;
    }
    c->ops = &kv_cache_dynamic;
    c->window = window;
    /* S = W - 1 is 0 when W = 1: zero-byte buffers, still guarded */
    if (!kv_slots_alloc(&c->cur, batch, window - 1, dim) ||
        !kv_slots_alloc(&c->tmp, batch, window - 1, dim)) {
        st = kv_slots_oom_buffers("dynamic", batch, window, dim, err);
        goto cleanup;
    }
    dynamic_reset(c);
    *out = c;
    c = NULL;
cleanup:
    dynamic_destroy(c);
    return st;
}

/* KV_FAULT_DYNAMIC_KEEPS_W: the buffers re-made with W slots, so every update
 * keeps W rows (positions recorded right). Planted before the first update,
 * while no view has been taken; should the allocation fail the cache stays
 * correct (the clean run), which the gate would show as a missed fault. */
static void dynamic_plant(KvSlidingCache *c, unsigned faults) {
    if (c == NULL || c->ops != &kv_cache_dynamic || !(faults & KV_FAULT_DYNAMIC_KEEPS_W)) return;
    KvCacheSlots cur = {0}, tmp = {0};
    const int64_t B = c->cur.batch, D = c->cur.dim;
    if (!kv_slots_alloc(&cur, B, c->window, D) || !kv_slots_alloc(&tmp, B, c->window, D)) {
        kv_slots_free(&cur);
        kv_slots_free(&tmp);
        return;
    }
    kv_slots_free(&c->cur);
    kv_slots_free(&c->tmp);
    c->cur = cur;
    c->tmp = tmp;
    dynamic_reset(c);
}

/* Copies the first `count` slots of the temporary over the cache. A copy, not
 * a swap: the view's pointers stay fixed for the cache's lifetime. */
static void dynamic_commit(KvSlidingCache *c, int64_t count) {
    KvCacheSlots *cur = &c->cur;
    const KvCacheSlots *tmp = &c->tmp;
    const int64_t S = cur->slots, D = cur->dim;
    for (int64_t b = 0; b < cur->batch; b++) {
        memcpy(cur->k + b * S * D, tmp->k + b * S * D, (size_t)(count * D) * sizeof(float));
        memcpy(cur->v + b * S * D, tmp->v + b * S * D, (size_t)(count * D) * sizeof(float));
        memcpy(cur->real + b * S, tmp->real + b * S, (size_t)count);
    }
    memcpy(cur->pos, tmp->pos, (size_t)count * sizeof(int64_t));
    c->filled = count;
}

/* k_new, v_new: (B, n, dim); real_new: (B, n); *total: positions stored before
 * this call (the device scalar); host_total: the host's count. */
static void dynamic_update(KvSlidingCache *c, const float *k_new, const float *v_new,
                           const uint8_t *real_new, int64_t n, const int64_t *total,
                           int64_t host_total) {
    (void)host_total; /* the shape is the cache's own; positions come from the device scalar */
    if (c == NULL || c->ops != &kv_cache_dynamic || total == NULL || n < 1) return;
    KvCacheSlots *cur = &c->cur, *tmp = &c->tmp;
    const int64_t B = cur->batch, S = cur->slots, D = cur->dim;
    const size_t row_bytes = (size_t)D * sizeof(float);
    if (S == 0) return;        /* W = 1: the window is the new token alone */
    const int64_t p0 = *total; /* read now, as a graph reads device memory at replay */
    if (p0 < 0) return;        /* not a position: nothing sensible to store */
    const int64_t stored = c->filled;

    if (n == 1 && stored < S) {
        /* Growing: cat appends one row; nothing already stored moves. */
        for (int64_t b = 0; b < B; b++) {
            memcpy(cur->k + (b * S + stored) * D, k_new + b * D, row_bytes);
            memcpy(cur->v + (b * S + stored) * D, v_new + b * D, row_bytes);
            cur->real[b * S + stored] = real_new[b];
        }
        cur->pos[stored] = p0;
        c->filled = stored + 1;
        return;
    }

    if (n == 1) {
        /* Full: keys = cat(keys, new)[:, 1:], i.e. cat(keys[:, 1:], new). */
        for (int64_t b = 0; b < B; b++) {
            memcpy(tmp->k + b * S * D, cur->k + (b * S + 1) * D, (size_t)(S - 1) * row_bytes);
            memcpy(tmp->v + b * S * D, cur->v + (b * S + 1) * D, (size_t)(S - 1) * row_bytes);
            memcpy(tmp->real + b * S, cur->real + b * S + 1, (size_t)(S - 1));
            memcpy(tmp->k + (b * S + S - 1) * D, k_new + b * D, row_bytes);
            memcpy(tmp->v + (b * S + S - 1) * D, v_new + b * D, row_bytes);
            tmp->real[b * S + S - 1] = real_new[b];
        }
        memcpy(tmp->pos, cur->pos + 1, (size_t)(S - 1) * sizeof(int64_t));
        tmp->pos[S - 1] = p0;
        dynamic_commit(c, S);
        return;
    }

    /* n > 1: seq = cat(stored rows, new rows); keep its last min(S, len). */
    const int64_t len = stored + n;
    const int64_t keep = len < S ? len : S;
    const int64_t start = len - keep;
    for (int64_t i = 0; i < keep; i++) {
        const int64_t s = start + i; /* index into seq */
        for (int64_t b = 0; b < B; b++) {
            const int64_t dst = b * S + i;
            if (s < stored) {
                memcpy(tmp->k + dst * D, cur->k + (b * S + s) * D, row_bytes);
                memcpy(tmp->v + dst * D, cur->v + (b * S + s) * D, row_bytes);
                tmp->real[dst] = cur->real[b * S + s];
            } else {
                const int64_t j = s - stored; /* new row */
                memcpy(tmp->k + dst * D, k_new + (b * n + j) * D, row_bytes);
                memcpy(tmp->v + dst * D, v_new + (b * n + j) * D, row_bytes);
                tmp->real[dst] = real_new[b * n + j];
            }
        }
        tmp->pos[i] = s < stored ? cur->pos[s] : p0 + (s - stored);
    }
    dynamic_commit(c, keep);
}

static KvCacheView dynamic_view(const KvSlidingCache *c) {
    if (c == NULL || c->ops != &kv_cache_dynamic) return (KvCacheView){0};
    return kv_slots_view(&c->cur, c->filled); /* the attended length: the "shape change" */
}

static int dynamic_regime(const KvSlidingCache *c, int64_t host_total) {
    (void)c;
    (void)host_total;
    return 0; /* the shape changes, but there is no filling/full host flag */
}

/* One graph per distinct attended length (the view's n_slots, which a graph
 * bakes in as a shape): decode step s (1 .. decode_steps) attends over
 * min(W - 1, prompt_len + s - 1) cached rows, so the lengths run from
 * min(W - 1, prompt_len) to min(W - 1, prompt_len + decode_steps - 1), the
 * growing ones and then the full one, W - 1, once the window has filled.
 * At most W graphs (lengths 0 .. W - 1) and at most one per step; exactly
 * one when the prefill already filled the window. */
static int64_t dynamic_graph_budget(int64_t window, int64_t prompt_len, int64_t decode_steps) {
    if (decode_steps <= 0) return 0;
    const int64_t full = window > 1 ? window - 1 : 0;
    const int64_t first = prompt_len < full ? prompt_len : full;
    const int64_t last_total = prompt_len + decode_steps - 1;
    const int64_t last = last_total < full ? last_total : full;
    return last - first + 1;
}

static bool dynamic_sentinels_ok(const KvSlidingCache *c) {
    if (c == NULL || c->ops != &kv_cache_dynamic) return false;
    return kv_slots_ok(&c->cur) && kv_slots_ok(&c->tmp);
}

/* The persistent state: the slots and the filled count; temporaries are scratch. */
static KvCacheState dynamic_state(KvSlidingCache *c) {
    return kv_slots_state(&c->cur, &c->filled, 1);
}

const KvCacheOps kv_cache_dynamic = {
    .name = "dynamic",
    .one_token_order = KV_ATTEND_BEFORE_UPDATE,
    .host_branch = false,
    .host_shape = true,
    .layout = KV_LAYOUT_GROWING,
    .create = dynamic_create,
    .destroy = dynamic_destroy,
    .reset = dynamic_reset,
    .update = dynamic_update,
    .view = dynamic_view,
    .regime = dynamic_regime,
    .sentinels_ok = dynamic_sentinels_ok,
    .state = dynamic_state,
    .plant = dynamic_plant,
    .graph_budget = dynamic_graph_budget,
};
