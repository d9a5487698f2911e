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
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cache.h"

struct KvSlidingCache {
    const KvCacheOps *ops; /* &kv_cache_dynamic: a handle given to another table is refused */
    int64_t batch;         /* B */
    int64_t window;        /* W */
    int64_t slots;         /* S = W - 1, the capacity */
    int64_t filled;        /* slots holding a position, 0 .. S (the attended length) */
    int64_t dim;           /* floats per slot */
    float *k;              /* (B, S, dim) */
    float *v;              /* (B, S, dim) */
    uint8_t *real;         /* (B, S) */
    int64_t *pos;          /* (S) position held by each slot, -1 = empty */
    /* The sliced cat result, distinct from the cache so the shift never
     * reads a row it has already overwritten. */
    float *tmp_k;          /* (B, S, dim) */
    float *tmp_v;          /* (B, S, dim) */
    uint8_t *tmp_real;     /* (B, S) */
    int64_t *tmp_pos;      /* (S) */
};

static bool dynamic_shape_fits(int64_t batch, int64_t window, int64_t dim) {
    const uint64_t limit = (uint64_t)(SIZE_MAX / 16);
    uint64_t n = (uint64_t)batch;
    if ((uint64_t)window > limit / n) return false;
    n *= (uint64_t)window;
    return (uint64_t)dim <= limit / n;
}

static void dynamic_destroy(KvSlidingCache *c) {
    if (c == NULL) return;
    kv_guard_free(c->k);
    kv_guard_free(c->v);
    kv_guard_free(c->real);
    kv_guard_free(c->pos);
    kv_guard_free(c->tmp_k);
    kv_guard_free(c->tmp_v);
    kv_guard_free(c->tmp_real);
    kv_guard_free(c->tmp_pos);
    free(c);
}

static void dynamic_reset(KvSlidingCache *c) {
    if (c == NULL || c->ops != &kv_cache_dynamic) return;
    const int64_t slots = c->batch * c->slots;
    const int64_t floats = slots * c->dim;
    /* NaN K/V: a read of a never-written slot poisons the logits. */
    for (int64_t i = 0; i < floats; i++) {
        c->k[i] = NAN;
        c->v[i] = NAN;
        c->tmp_k[i] = NAN;
        c->tmp_v[i] = NAN;
    }
    memset(c->real, 0, (size_t)slots);
    memset(c->tmp_real, 0, (size_t)slots);
    for (int64_t i = 0; i < c->slots; i++) {
        c->pos[i] = -1;
        c->tmp_pos[i] = -1;
    }
    c->filled = 0;
}

static KvStatus dynamic_create(int64_t batch, int64_t window, int64_t dim, KvSlidingCache **out,
                               KvError *err) {
    KvStatus st = KV_OK;
    KvSlidingCache *c = NULL;
    if (out == NULL) return kv_error_set(err, KV_ERR_INPUT, "dynamic: create: out is NULL");
    *out = NULL;
    if (batch < 1 || window < 1 || dim < 1) {
        return kv_error_set(err, KV_ERR_INPUT,
                            "dynamic: create: batch, window and dim must be >= 1, "
                            "got batch %lld, window %lld, dim %lld",
                            (long long)batch, (long long)window, (long long)dim);
    }
    if (!dynamic_shape_fits(batch, window, dim)) {
        return kv_error_set(err, KV_ERR_INPUT,
                            "dynamic: create: batch %lld x window %lld x dim %lld "
                            "does not fit in memory sizes",
                            (long long)batch, (long long)window, (long long)dim);
    }
    c = calloc(1, sizeof *c);
    if (c == NULL) {
        st = kv_error_set(err, KV_ERR_INTERNAL, "dynamic: create: out of memory (cache struct)");
        goto exit;
    }
    c->ops = &kv_cache_dynamic;
    c->batch = batch;
    c->window = window;
    c->slots = window - 1; /* 0 when W = 1: zero-byte buffers, still guarded */
    c->dim = dim;
    const size_t slots = (size_t)batch * (size_t)c->slots;
    const size_t fbytes = slots * (size_t)dim * sizeof(float);
    c->k = kv_guard_alloc(fbytes);
    c->v = kv_guard_alloc(fbytes);
    c->real = kv_guard_alloc(slots);
    c->pos = kv_guard_alloc((size_t)c->slots * sizeof(int64_t));
    c->tmp_k = kv_guard_alloc(fbytes);
    c->tmp_v = kv_guard_alloc(fbytes);
    c->tmp_real = kv_guard_alloc(slots);
    c->tmp_pos = kv_guard_alloc((size_t)c->slots * sizeof(int64_t));
    if (c->k == NULL || c->v == NULL || c->real == NULL || c->pos == NULL || c->tmp_k == NULL ||
        c->tmp_v == NULL || c->tmp_real == NULL || c->tmp_pos == NULL) {
        st = kv_error_set(err, KV_ERR_INTERNAL,
                          "dynamic: create: out of memory for batch %lld x window %lld x "
                          "dim %lld",
                          (long long)batch, (long long)window, (long long)dim);
        goto exit;
    }
    dynamic_reset(c);
    *out = c;
    c = NULL;
exit:
    dynamic_destroy(c);
    return st;
}

/* Copies the first `count` slots of the temporary over the cache. A copy, not
 * a swap: the view's pointers stay fixed for the cache's lifetime. */
static void dynamic_commit(KvSlidingCache *c, int64_t count) {
    const int64_t S = c->slots, D = c->dim;
    for (int64_t b = 0; b < c->batch; b++) {
        memcpy(c->k + b * S * D, c->tmp_k + b * S * D, (size_t)(count * D) * sizeof(float));
        memcpy(c->v + b * S * D, c->tmp_v + b * S * D, (size_t)(count * D) * sizeof(float));
        memcpy(c->real + b * S, c->tmp_real + b * S, (size_t)count);
    }
    memcpy(c->pos, c->tmp_pos, (size_t)count * sizeof(int64_t));
    c->filled = count;
}

/* k_new, v_new: (B, n, dim); real_new: (B, n); *total: positions stored before
 * this call (the device scalar); host_total: the host's count. */
static void dynamic_update(KvSlidingCache *c, const float *k_new, const float *v_new,
                           const uint8_t *real_new, int64_t n, const int64_t *total,
                           int64_t host_total) {
    (void)host_total; /* the shape is the cache's own; positions come from the device scalar */
    if (c == NULL || c->ops != &kv_cache_dynamic || total == NULL || n < 1) return;
    const int64_t B = c->batch, S = c->slots, D = c->dim;
    const size_t row_bytes = (size_t)D * sizeof(float);
    if (S == 0) return;        /* W = 1: the window is the new token alone */
    const int64_t p0 = *total; /* read now, as a graph reads device memory at replay */
    if (p0 < 0) return;        /* not a position: nothing sensible to store */
    const int64_t stored = c->filled;

    if (n == 1 && stored < S) {
        /* Growing: cat appends one row; nothing already stored moves. */
        for (int64_t b = 0; b < B; b++) {
            memcpy(c->k + (b * S + stored) * D, k_new + b * D, row_bytes);
            memcpy(c->v + (b * S + stored) * D, v_new + b * D, row_bytes);
            c->real[b * S + stored] = real_new[b];
        }
        c->pos[stored] = p0;
        c->filled = stored + 1;
        return;
    }

    if (n == 1) {
        /* Full: keys = cat(keys, new)[:, 1:], i.e. cat(keys[:, 1:], new). */
        for (int64_t b = 0; b < B; b++) {
            memcpy(c->tmp_k + b * S * D, c->k + (b * S + 1) * D, (size_t)(S - 1) * row_bytes);
            memcpy(c->tmp_v + b * S * D, c->v + (b * S + 1) * D, (size_t)(S - 1) * row_bytes);
            memcpy(c->tmp_real + b * S, c->real + b * S + 1, (size_t)(S - 1));
            memcpy(c->tmp_k + (b * S + S - 1) * D, k_new + b * D, row_bytes);
            memcpy(c->tmp_v + (b * S + S - 1) * D, v_new + b * D, row_bytes);
            c->tmp_real[b * S + S - 1] = real_new[b];
        }
        memcpy(c->tmp_pos, c->pos + 1, (size_t)(S - 1) * sizeof(int64_t));
        c->tmp_pos[S - 1] = p0;
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
                memcpy(c->tmp_k + dst * D, c->k + (b * S + s) * D, row_bytes);
                memcpy(c->tmp_v + dst * D, c->v + (b * S + s) * D, row_bytes);
                c->tmp_real[dst] = c->real[b * S + s];
            } else {
                const int64_t j = s - stored; /* new row */
                memcpy(c->tmp_k + dst * D, k_new + (b * n + j) * D, row_bytes);
                memcpy(c->tmp_v + dst * D, v_new + (b * n + j) * D, row_bytes);
                c->tmp_real[dst] = real_new[b * n + j];
            }
        }
        c->tmp_pos[i] = s < stored ? c->pos[s] : p0 + (s - stored);
    }
    dynamic_commit(c, keep);
}

static KvCacheView dynamic_view(const KvSlidingCache *c) {
    KvCacheView view = {0};
    if (c == NULL || c->ops != &kv_cache_dynamic) return view;
    view.n_slots = c->filled; /* the attended length: the "shape change" */
    view.row_stride = c->slots;
    view.dim = c->dim;
    view.k = c->k;
    view.v = c->v;
    view.pos = c->pos;
    view.real = c->real;
    return view;
}

static int dynamic_regime(const KvSlidingCache *c, int64_t host_total) {
    (void)c;
    (void)host_total;
    return 0; /* the shape changes, but there is no filling/full host flag */
}

static bool dynamic_sentinels_ok(const KvSlidingCache *c) {
    if (c == NULL || c->ops != &kv_cache_dynamic) return false;
    return kv_guard_ok(c->k) && kv_guard_ok(c->v) && kv_guard_ok(c->real) &&
           kv_guard_ok(c->pos) && kv_guard_ok(c->tmp_k) && kv_guard_ok(c->tmp_v) &&
           kv_guard_ok(c->tmp_real) && kv_guard_ok(c->tmp_pos);
}

/* The persistent state: the slots and the filled count; temporaries are scratch. */
static KvCacheState dynamic_state(KvSlidingCache *c) {
    return (KvCacheState){.k = c->k, .v = c->v, .real = c->real, .pos = c->pos,
                          .counters = &c->filled, .batch = c->batch, .slots = c->slots,
                          .dim = c->dim, .n_counters = 1};
}

const KvCacheOps kv_cache_dynamic = {
    .name = "dynamic",
    .one_token_order = KV_ATTEND_BEFORE_UPDATE,
    .host_branch = false,
    .create = dynamic_create,
    .destroy = dynamic_destroy,
    .reset = dynamic_reset,
    .update = dynamic_update,
    .view = dynamic_view,
    .regime = dynamic_regime,
    .sentinels_ok = dynamic_sentinels_ok,
    .state = dynamic_state,
};
