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
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cache.h"

struct KvSlidingCache {
    const KvCacheOps *ops; /* &kv_cache_always_roll: a handle given to another table is refused */
    int64_t batch;         /* B */
    int64_t window;        /* W */
    int64_t dim;           /* floats per slot */
    float *k;              /* (B, W, dim) */
    float *v;              /* (B, W, dim) */
    uint8_t *real;         /* (B, W) */
    int64_t *pos;          /* (W) position held by each slot, -1 = empty */
    /* A snapshot of the cache taken before the roll, the roll's source: the
     * roll then never reads a slot it has already written. */
    float *src_k;          /* (B, W, dim) */
    float *src_v;          /* (B, W, dim) */
    uint8_t *src_real;     /* (B, W) */
    int64_t *src_pos;      /* (W) */
};

static bool always_roll_shape_fits(int64_t batch, int64_t window, int64_t dim) {
    const uint64_t limit = (uint64_t)(SIZE_MAX / 16);
    uint64_t n = (uint64_t)batch;
    if ((uint64_t)window > limit / n) return false;
    n *= (uint64_t)window;
    return (uint64_t)dim <= limit / n;
}

static void always_roll_destroy(KvSlidingCache *c) {
    if (c == NULL) return;
    kv_guard_free(c->k);
    kv_guard_free(c->v);
    kv_guard_free(c->real);
    kv_guard_free(c->pos);
    kv_guard_free(c->src_k);
    kv_guard_free(c->src_v);
    kv_guard_free(c->src_real);
    kv_guard_free(c->src_pos);
    free(c);
}

static void always_roll_reset(KvSlidingCache *c) {
    if (c == NULL || c->ops != &kv_cache_always_roll) return;
    const int64_t slots = c->batch * c->window;
    const int64_t floats = slots * c->dim;
    /* NaN K/V: a read of a never-written slot poisons the logits. */
    for (int64_t i = 0; i < floats; i++) {
        c->k[i] = NAN;
        c->v[i] = NAN;
        c->src_k[i] = NAN;
        c->src_v[i] = NAN;
    }
    memset(c->real, 0, (size_t)slots);
    memset(c->src_real, 0, (size_t)slots);
    for (int64_t i = 0; i < c->window; i++) {
        c->pos[i] = -1;
        c->src_pos[i] = -1;
    }
}

static KvStatus always_roll_create(int64_t batch, int64_t window, int64_t dim,
                                   KvSlidingCache **out, KvError *err) {
    KvStatus st = KV_OK;
    KvSlidingCache *c = NULL;
    if (out == NULL) return kv_error_set(err, KV_ERR_INPUT, "always_roll: create: out is NULL");
    *out = NULL;
    if (batch < 1 || window < 1 || dim < 1) {
        return kv_error_set(err, KV_ERR_INPUT,
                            "always_roll: create: batch, window and dim must be >= 1, "
                            "got batch %lld, window %lld, dim %lld",
                            (long long)batch, (long long)window, (long long)dim);
    }
    if (!always_roll_shape_fits(batch, window, dim)) {
        return kv_error_set(err, KV_ERR_INPUT,
                            "always_roll: create: batch %lld x window %lld x dim %lld "
                            "does not fit in memory sizes",
                            (long long)batch, (long long)window, (long long)dim);
    }
    c = calloc(1, sizeof *c);
    if (c == NULL) {
        st = kv_error_set(err, KV_ERR_INTERNAL,
                          "always_roll: create: out of memory (cache struct)");
        goto exit;
    }
    c->ops = &kv_cache_always_roll;
    c->batch = batch;
    c->window = window;
    c->dim = dim;
    const size_t slots = (size_t)batch * (size_t)window;
    const size_t fbytes = slots * (size_t)dim * sizeof(float);
    c->k = kv_guard_alloc(fbytes);
    c->v = kv_guard_alloc(fbytes);
    c->real = kv_guard_alloc(slots);
    c->pos = kv_guard_alloc((size_t)window * sizeof(int64_t));
    c->src_k = kv_guard_alloc(fbytes);
    c->src_v = kv_guard_alloc(fbytes);
    c->src_real = kv_guard_alloc(slots);
    c->src_pos = kv_guard_alloc((size_t)window * sizeof(int64_t));
    if (c->k == NULL || c->v == NULL || c->real == NULL || c->pos == NULL || c->src_k == NULL ||
        c->src_v == NULL || c->src_real == NULL || c->src_pos == NULL) {
        st = kv_error_set(err, KV_ERR_INTERNAL,
                          "always_roll: create: out of memory for batch %lld x window %lld x "
                          "dim %lld",
                          (long long)batch, (long long)window, (long long)dim);
        goto exit;
    }
    always_roll_reset(c);
    *out = c;
    c = NULL;
exit:
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
    const int64_t B = c->batch, W = c->window, D = c->dim;
    const size_t row_bytes = (size_t)D * sizeof(float);
    const size_t slots = (size_t)B * (size_t)W;
    const int64_t p0 = *total; /* read now, as a graph reads device memory at replay */
    if (p0 < 0) return;        /* not a position: nothing sensible to store */
    const int64_t m = n < W ? n : W; /* rows that enter the window */

    /* Snapshot, then roll left by m from the snapshot into the cache:
     * slots 0 .. W-m-1 take the snapshot's slots m .. W-1, and the m oldest
     * rows wrap into the rightmost m slots (overwritten just below). */
    memcpy(c->src_k, c->k, slots * row_bytes);
    memcpy(c->src_v, c->v, slots * row_bytes);
    memcpy(c->src_real, c->real, slots);
    memcpy(c->src_pos, c->pos, (size_t)W * sizeof(int64_t));
    const int64_t keep = W - m;
    for (int64_t b = 0; b < B; b++) {
        float *kr = c->k + b * W * D;            /* (W, dim) this row's slots */
        float *vr = c->v + b * W * D;            /* (W, dim) */
        const float *ks = c->src_k + b * W * D;  /* (W, dim) */
        const float *vs = c->src_v + b * W * D;  /* (W, dim) */
        memcpy(kr, ks + m * D, (size_t)keep * row_bytes);
        memcpy(vr, vs + m * D, (size_t)keep * row_bytes);
        memcpy(kr + keep * D, ks, (size_t)m * row_bytes);
        memcpy(vr + keep * D, vs, (size_t)m * row_bytes);
        memcpy(c->real + b * W, c->src_real + b * W + m, (size_t)keep);
        memcpy(c->real + b * W + keep, c->src_real + b * W, (size_t)m);
    }
    memcpy(c->pos, c->src_pos + m, (size_t)keep * sizeof(int64_t));
    memcpy(c->pos + keep, c->src_pos, (size_t)m * sizeof(int64_t));

    /* The last m new rows (j = n - m .. n - 1) into slots keep .. W - 1. */
    for (int64_t t = 0; t < m; t++) {
        const int64_t j = n - m + t;
        const int64_t slot = keep + t;
        for (int64_t b = 0; b < B; b++) {
            memcpy(c->k + (b * W + slot) * D, k_new + (b * n + j) * D, row_bytes);
            memcpy(c->v + (b * W + slot) * D, v_new + (b * n + j) * D, row_bytes);
            c->real[b * W + slot] = real_new[b * n + j];
        }
        c->pos[slot] = p0 + j;
    }
}

static KvCacheView always_roll_view(const KvSlidingCache *c) {
    KvCacheView view = {0};
    if (c == NULL || c->ops != &kv_cache_always_roll) return view;
    view.n_slots = c->window;
    view.row_stride = c->window;
    view.dim = c->dim;
    view.k = c->k;
    view.v = c->v;
    view.pos = c->pos;
    view.real = c->real;
    return view;
}

static int always_roll_regime(const KvSlidingCache *c, int64_t host_total) {
    (void)c;
    (void)host_total;
    return 0; /* no host regime: one graph for both */
}

static bool always_roll_sentinels_ok(const KvSlidingCache *c) {
    if (c == NULL || c->ops != &kv_cache_always_roll) return false;
    return kv_guard_ok(c->k) && kv_guard_ok(c->v) && kv_guard_ok(c->real) &&
           kv_guard_ok(c->pos) && kv_guard_ok(c->src_k) && kv_guard_ok(c->src_v) &&
           kv_guard_ok(c->src_real) && kv_guard_ok(c->src_pos);
}

/* The persistent state: the slots; temporaries are scratch. */
static KvCacheState always_roll_state(KvSlidingCache *c) {
    return (KvCacheState){.k = c->k, .v = c->v, .real = c->real, .pos = c->pos,
                          .counters = NULL, .batch = c->batch, .slots = c->window,
                          .dim = c->dim, .n_counters = 0};
}

const KvCacheOps kv_cache_always_roll = {
    .name = "always_roll",
    .one_token_order = KV_ATTEND_AFTER_UPDATE,
    .host_branch = false,
    .create = always_roll_create,
    .destroy = always_roll_destroy,
    .reset = always_roll_reset,
    .update = always_roll_update,
    .view = always_roll_view,
    .regime = always_roll_regime,
    .sentinels_ok = always_roll_sentinels_ok,
    .state = always_roll_state,
};
