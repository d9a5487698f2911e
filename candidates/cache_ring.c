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
 * measured against; since attention must then order keys by pos[] rather
 * than by slot, it checks that the canonical key order (DESIGN §2) really
 * does not depend on the slot. Its bugs in the wild: p % W computed from a
 * stale position (the wrong slot overwritten), and a mask that trusts slot
 * order instead of pos[]. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cache.h"

struct KvSlidingCache {
    const KvCacheOps *ops; /* &kv_cache_ring: a handle given to another table is refused */
    int64_t batch;         /* B */
    int64_t window;        /* W */
    int64_t dim;           /* floats per slot */
    float *k;              /* (B, W, dim) */
    float *v;              /* (B, W, dim) */
    uint8_t *real;         /* (B, W) */
    int64_t *pos;          /* (W) position held by each slot, -1 = empty */
};

static bool ring_shape_fits(int64_t batch, int64_t window, int64_t dim) {
    const uint64_t limit = (uint64_t)(SIZE_MAX / 16);
    uint64_t n = (uint64_t)batch;
    if ((uint64_t)window > limit / n) return false;
    n *= (uint64_t)window;
    return (uint64_t)dim <= limit / n;
}

static void ring_destroy(KvSlidingCache *c) {
    if (c == NULL) return;
    kv_guard_free(c->k);
    kv_guard_free(c->v);
    kv_guard_free(c->real);
    kv_guard_free(c->pos);
    free(c);
}

static void ring_reset(KvSlidingCache *c) {
    if (c == NULL || c->ops != &kv_cache_ring) return;
    const int64_t slots = c->batch * c->window;
    const int64_t floats = slots * c->dim;
    /* NaN K/V: a read of a never-written slot poisons the logits. */
    for (int64_t i = 0; i < floats; i++) {
        c->k[i] = NAN;
        c->v[i] = NAN;
    }
    memset(c->real, 0, (size_t)slots);
    for (int64_t i = 0; i < c->window; i++) c->pos[i] = -1;
}

static KvStatus ring_create(int64_t batch, int64_t window, int64_t dim, KvSlidingCache **out,
                            KvError *err) {
    KvStatus st = KV_OK;
    KvSlidingCache *c = NULL;
    if (out == NULL) return kv_error_set(err, KV_ERR_INPUT, "ring: create: out is NULL");
    *out = NULL;
    if (batch < 1 || window < 1 || dim < 1) {
        return kv_error_set(err, KV_ERR_INPUT,
                            "ring: create: batch, window and dim must be >= 1, "
                            "got batch %lld, window %lld, dim %lld",
                            (long long)batch, (long long)window, (long long)dim);
    }
    if (!ring_shape_fits(batch, window, dim)) {
        return kv_error_set(err, KV_ERR_INPUT,
                            "ring: create: batch %lld x window %lld x dim %lld "
                            "does not fit in memory sizes",
                            (long long)batch, (long long)window, (long long)dim);
    }
    c = calloc(1, sizeof *c);
    if (c == NULL) {
        st = kv_error_set(err, KV_ERR_INTERNAL, "ring: create: out of memory (cache struct)");
        goto exit;
    }
    c->ops = &kv_cache_ring;
    c->batch = batch;
    c->window = window;
    c->dim = dim;
    const size_t slots = (size_t)batch * (size_t)window;
    c->k = kv_guard_alloc(slots * (size_t)dim * sizeof(float));
    c->v = kv_guard_alloc(slots * (size_t)dim * sizeof(float));
    c->real = kv_guard_alloc(slots);
    c->pos = kv_guard_alloc((size_t)window * sizeof(int64_t));
    if (c->k == NULL || c->v == NULL || c->real == NULL || c->pos == NULL) {
        st = kv_error_set(err, KV_ERR_INTERNAL,
                          "ring: create: out of memory for batch %lld x window %lld x dim %lld",
                          (long long)batch, (long long)window, (long long)dim);
        goto exit;
    }
    ring_reset(c);
    *out = c;
    c = NULL;
exit:
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
    const int64_t W = c->window, D = c->dim;
    const size_t row_bytes = (size_t)D * sizeof(float);
    const int64_t p0 = *total; /* read now, as a graph reads device memory at replay */
    if (p0 < 0) return;        /* not a position: nothing sensible to store */
    const int64_t j0 = n > W ? n - W : 0;
    for (int64_t j = j0; j < n; j++) {
        const int64_t p = p0 + j;
        const int64_t slot = p % W;
        for (int64_t b = 0; b < c->batch; b++) {
            memcpy(c->k + (b * W + slot) * D, k_new + (b * n + j) * D, row_bytes);
            memcpy(c->v + (b * W + slot) * D, v_new + (b * n + j) * D, row_bytes);
            c->real[b * W + slot] = real_new[b * n + j];
        }
        c->pos[slot] = p;
    }
}

static KvCacheView ring_view(const KvSlidingCache *c) {
    KvCacheView view = {0};
    if (c == NULL || c->ops != &kv_cache_ring) return view;
    view.n_slots = c->window;
    view.row_stride = c->window;
    view.dim = c->dim;
    view.k = c->k;
    view.v = c->v;
    view.pos = c->pos;
    view.real = c->real;
    return view;
}

static int ring_regime(const KvSlidingCache *c, int64_t host_total) {
    (void)c;
    (void)host_total;
    return 0; /* no host regime: one graph for both */
}

static bool ring_sentinels_ok(const KvSlidingCache *c) {
    if (c == NULL || c->ops != &kv_cache_ring) return false;
    return kv_guard_ok(c->k) && kv_guard_ok(c->v) && kv_guard_ok(c->real) && kv_guard_ok(c->pos);
}

/* The persistent state: the slots; temporaries are scratch. */
static KvCacheState ring_state(KvSlidingCache *c) {
    return (KvCacheState){.k = c->k, .v = c->v, .real = c->real, .pos = c->pos,
                          .counters = NULL, .batch = c->batch, .slots = c->window,
                          .dim = c->dim, .n_counters = 0};
}

const KvCacheOps kv_cache_ring = {
    .name = "ring",
    .one_token_order = KV_ATTEND_AFTER_UPDATE,
    .host_branch = false,
    .create = ring_create,
    .destroy = ring_destroy,
    .reset = ring_reset,
    .update = ring_update,
    .view = ring_view,
    .regime = ring_regime,
    .sentinels_ok = ring_sentinels_ok,
    .state = ring_state,
};
