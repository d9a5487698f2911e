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
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cache.h"

struct KvSlidingCache {
    const KvCacheOps *ops; /* &kv_cache_index_copy: a handle given to another table is refused */
    int64_t batch;         /* B */
    int64_t window;        /* W */
    int64_t dim;           /* floats per slot */
    float *k;              /* (B, W, dim) */
    float *v;              /* (B, W, dim) */
    uint8_t *real;         /* (B, W) */
    int64_t *pos;          /* (W) position held by each slot, -1 = empty */
    /* The gather target (k_out): a buffer distinct from the cache, because a
     * gather through a permutation cannot run in place. */
    float *tmp_k;          /* (B, W, dim) */
    float *tmp_v;          /* (B, W, dim) */
    uint8_t *tmp_real;     /* (B, W) */
    int64_t *tmp_pos;      /* (W) */
    int64_t *indices;      /* (W) gather indices, recomputed from *total on every update */
};

/* True when B * W * dim floats (and the same count of any other element up
 * to 8 bytes) fit a size_t with room for the guards. */
static bool index_copy_shape_fits(int64_t batch, int64_t window, int64_t dim) {
    const uint64_t limit = (uint64_t)(SIZE_MAX / 16);
    uint64_t n = (uint64_t)batch;
    if ((uint64_t)window > limit / n) return false;
    n *= (uint64_t)window;
    return (uint64_t)dim <= limit / n;
}

static void index_copy_destroy(KvSlidingCache *c) {
    if (c == NULL) return;
    kv_guard_free(c->k);
    kv_guard_free(c->v);
    kv_guard_free(c->real);
    kv_guard_free(c->pos);
    kv_guard_free(c->tmp_k);
    kv_guard_free(c->tmp_v);
    kv_guard_free(c->tmp_real);
    kv_guard_free(c->tmp_pos);
    kv_guard_free(c->indices);
    free(c);
}

static void index_copy_reset(KvSlidingCache *c) {
    if (c == NULL || c->ops != &kv_cache_index_copy) return;
    const int64_t slots = c->batch * c->window;
    const int64_t floats = slots * c->dim;
    /* NaN in K and V (and the temporaries, so no earlier run can leak through
     * them): a read of a never-written slot poisons the logits. */
    for (int64_t i = 0; i < floats; i++) {
        c->k[i] = NAN;
        c->v[i] = NAN;
        c->tmp_k[i] = NAN;
        c->tmp_v[i] = NAN;
    }
    memset(c->real, 0, (size_t)slots);
    memset(c->tmp_real, 0, (size_t)slots);
    for (int64_t i = 0; i < c->window; i++) {
        c->pos[i] = -1;
        c->tmp_pos[i] = -1;
        c->indices[i] = i;
    }
}

static KvStatus index_copy_create(int64_t batch, int64_t window, int64_t dim, KvSlidingCache **out,
                                  KvError *err) {
    KvStatus st = KV_OK;
    KvSlidingCache *c = NULL;
    if (out == NULL) return kv_error_set(err, KV_ERR_INPUT, "index_copy: create: out is NULL");
    *out = NULL;
    if (batch < 1 || window < 1 || dim < 1) {
        return kv_error_set(err, KV_ERR_INPUT,
                            "index_copy: create: batch, window and dim must be >= 1, "
                            "got batch %lld, window %lld, dim %lld",
                            (long long)batch, (long long)window, (long long)dim);
    }
    if (!index_copy_shape_fits(batch, window, dim)) {
        return kv_error_set(err, KV_ERR_INPUT,
                            "index_copy: create: batch %lld x window %lld x dim %lld "
                            "does not fit in memory sizes",
                            (long long)batch, (long long)window, (long long)dim);
    }
    c = calloc(1, sizeof *c);
    if (c == NULL) {
        st = kv_error_set(err, KV_ERR_INTERNAL, "index_copy: create: out of memory (cache struct)");
        goto exit;
    }
    c->ops = &kv_cache_index_copy;
    c->batch = batch;
    c->window = window;
    c->dim = dim;
    const size_t slots = (size_t)batch * (size_t)window;
    const size_t fbytes = slots * (size_t)dim * sizeof(float);
    c->k = kv_guard_alloc(fbytes);
    c->v = kv_guard_alloc(fbytes);
    c->real = kv_guard_alloc(slots);
    c->pos = kv_guard_alloc((size_t)window * sizeof(int64_t));
    c->tmp_k = kv_guard_alloc(fbytes);
    c->tmp_v = kv_guard_alloc(fbytes);
    c->tmp_real = kv_guard_alloc(slots);
    c->tmp_pos = kv_guard_alloc((size_t)window * sizeof(int64_t));
    c->indices = kv_guard_alloc((size_t)window * sizeof(int64_t));
    if (c->k == NULL || c->v == NULL || c->real == NULL || c->pos == NULL || c->tmp_k == NULL ||
        c->tmp_v == NULL || c->tmp_real == NULL || c->tmp_pos == NULL || c->indices == NULL) {
        st = kv_error_set(err, KV_ERR_INTERNAL,
                          "index_copy: create: out of memory for batch %lld x window %lld x "
                          "dim %lld",
                          (long long)batch, (long long)window, (long long)dim);
        goto exit;
    }
    index_copy_reset(c);
    *out = c;
    c = NULL;
exit:
    index_copy_destroy(c);
    return st;
}

/* k_out = cache[:, :, indices] for K, V, real and pos. */
static void index_copy_gather(KvSlidingCache *c) {
    const int64_t W = c->window, D = c->dim;
    const size_t row_bytes = (size_t)D * sizeof(float);
    for (int64_t b = 0; b < c->batch; b++) {
        for (int64_t i = 0; i < W; i++) {
            const int64_t src = b * W + c->indices[i];
            const int64_t dst = b * W + i;
            memcpy(c->tmp_k + dst * D, c->k + src * D, row_bytes);
            memcpy(c->tmp_v + dst * D, c->v + src * D, row_bytes);
            c->tmp_real[dst] = c->real[src];
        }
    }
    for (int64_t i = 0; i < W; i++) c->tmp_pos[i] = c->pos[c->indices[i]];
}

/* k_out[:, :, slot] = new[:, j] (index_copy of one new token into the
 * gathered temporary). k_new, v_new: (B, n, dim); real_new: (B, n). */
static void index_copy_put(KvSlidingCache *c, int64_t slot, const float *k_new, const float *v_new,
                           const uint8_t *real_new, int64_t n, int64_t j, int64_t position) {
    const int64_t W = c->window, D = c->dim;
    const size_t row_bytes = (size_t)D * sizeof(float);
    for (int64_t b = 0; b < c->batch; b++) {
        const int64_t dst = b * W + slot;
        memcpy(c->tmp_k + dst * D, k_new + (b * n + j) * D, row_bytes);
        memcpy(c->tmp_v + dst * D, v_new + (b * n + j) * D, row_bytes);
        c->tmp_real[dst] = real_new[b * n + j];
    }
    c->tmp_pos[slot] = position;
}

/* self.keys.copy_(k_out): the temporary becomes the cache. A copy rather than
 * a pointer swap keeps the view's pointers fixed for the cache's lifetime,
 * which a captured graph relies on. */
static void index_copy_commit(KvSlidingCache *c) {
    const size_t slots = (size_t)c->batch * (size_t)c->window;
    const size_t fbytes = slots * (size_t)c->dim * sizeof(float);
    memcpy(c->k, c->tmp_k, fbytes);
    memcpy(c->v, c->tmp_v, fbytes);
    memcpy(c->real, c->tmp_real, slots);
    memcpy(c->pos, c->tmp_pos, (size_t)c->window * sizeof(int64_t));
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
     * the last W. */
    const int64_t j0 = first_new > p0 ? first_new - p0 : 0;
    for (int64_t j = j0; j < n; j++) {
        index_copy_put(c, p0 + j - first_new, k_new, v_new, real_new, n, j, p0 + j);
    }
    index_copy_commit(c);
}

static KvCacheView index_copy_view(const KvSlidingCache *c) {
    KvCacheView view = {0};
    if (c == NULL || c->ops != &kv_cache_index_copy) return view;
    view.n_slots = c->window;
    view.row_stride = c->window;
    view.dim = c->dim;
    view.k = c->k;
    view.v = c->v;
    view.pos = c->pos;
    view.real = c->real;
    return view;
}

static int index_copy_regime(const KvSlidingCache *c, int64_t host_total) {
    (void)c;
    (void)host_total;
    return 0; /* no host regime: one graph for both */
}

static bool index_copy_sentinels_ok(const KvSlidingCache *c) {
    if (c == NULL || c->ops != &kv_cache_index_copy) return false;
    return kv_guard_ok(c->k) && kv_guard_ok(c->v) && kv_guard_ok(c->real) &&
           kv_guard_ok(c->pos) && kv_guard_ok(c->tmp_k) && kv_guard_ok(c->tmp_v) &&
           kv_guard_ok(c->tmp_real) && kv_guard_ok(c->tmp_pos) && kv_guard_ok(c->indices);
}

/* The persistent state: the slots; temporaries are scratch. */
static KvCacheState index_copy_state(KvSlidingCache *c) {
    return (KvCacheState){.k = c->k, .v = c->v, .real = c->real, .pos = c->pos,
                          .counters = NULL, .batch = c->batch, .slots = c->window,
                          .dim = c->dim, .n_counters = 0};
}

const KvCacheOps kv_cache_index_copy = {
    .name = "index_copy",
    .one_token_order = KV_ATTEND_AFTER_UPDATE,
    .host_branch = false,
    .create = index_copy_create,
    .destroy = index_copy_destroy,
    .reset = index_copy_reset,
    .update = index_copy_update,
    .view = index_copy_view,
    .regime = index_copy_regime,
    .sentinels_ok = index_copy_sentinels_ok,
    .state = index_copy_state,
};
