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

#include "cache.h"

struct KvSlidingCache {
    const KvCacheOps *ops; /* &kv_cache_cat_shift: a handle given to another table is refused */
    int64_t batch;         /* B */
    int64_t window;        /* W */
    int64_t dim;           /* floats per slot */
    float *k;              /* (B, W, dim) */
    float *v;              /* (B, W, dim) */
    uint8_t *real;         /* (B, W) */
    int64_t *pos;          /* (W) position held by each slot, -1 = empty */
    /* The cat result, distinct from the cache so the shift never overlaps. */
    float *tmp_k;          /* (B, W, dim) */
    float *tmp_v;          /* (B, W, dim) */
    uint8_t *tmp_real;     /* (B, W) */
    int64_t *tmp_pos;      /* (W) */
};

static bool cat_shift_shape_fits(int64_t batch, int64_t window, int64_t dim) {
    const uint64_t limit = (uint64_t)(SIZE_MAX / 16);
    uint64_t n = (uint64_t)batch;
    if ((uint64_t)window > limit / n) return false;
    n *= (uint64_t)window;
    return (uint64_t)dim <= limit / n;
}

static void cat_shift_destroy(KvSlidingCache *c) {
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

static void cat_shift_reset(KvSlidingCache *c) {
    if (c == NULL || c->ops != &kv_cache_cat_shift) return;
    const int64_t slots = c->batch * c->window;
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
    for (int64_t i = 0; i < c->window; i++) {
        c->pos[i] = -1;
        c->tmp_pos[i] = -1;
    }
}

static KvStatus cat_shift_create(int64_t batch, int64_t window, int64_t dim, KvSlidingCache **out,
                                 KvError *err) {
    KvStatus st = KV_OK;
    KvSlidingCache *c = NULL;
    if (out == NULL) return kv_error_set(err, KV_ERR_INPUT, "cat_shift: create: out is NULL");
    *out = NULL;
    if (batch < 1 || window < 1 || dim < 1) {
        return kv_error_set(err, KV_ERR_INPUT,
                            "cat_shift: create: batch, window and dim must be >= 1, "
                            "got batch %lld, window %lld, dim %lld",
                            (long long)batch, (long long)window, (long long)dim);
    }
    if (!cat_shift_shape_fits(batch, window, dim)) {
        return kv_error_set(err, KV_ERR_INPUT,
                            "cat_shift: create: batch %lld x window %lld x dim %lld "
                            "does not fit in memory sizes",
                            (long long)batch, (long long)window, (long long)dim);
    }
    c = calloc(1, sizeof *c);
    if (c == NULL) {
        st = kv_error_set(err, KV_ERR_INTERNAL, "cat_shift: create: out of memory (cache struct)");
        goto exit;
    }
    c->ops = &kv_cache_cat_shift;
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
    if (c->k == NULL || c->v == NULL || c->real == NULL || c->pos == NULL || c->tmp_k == NULL ||
        c->tmp_v == NULL || c->tmp_real == NULL || c->tmp_pos == NULL) {
        st = kv_error_set(err, KV_ERR_INTERNAL,
                          "cat_shift: create: out of memory for batch %lld x window %lld x "
                          "dim %lld",
                          (long long)batch, (long long)window, (long long)dim);
        goto exit;
    }
    cat_shift_reset(c);
    *out = c;
    c = NULL;
exit:
    cat_shift_destroy(c);
    return st;
}

/* The temporary becomes the cache (a copy, not a pointer swap: the view's
 * pointers stay fixed for the cache's lifetime, as a captured graph needs). */
static void cat_shift_commit(KvSlidingCache *c) {
    const size_t slots = (size_t)c->batch * (size_t)c->window;
    const size_t fbytes = slots * (size_t)c->dim * sizeof(float);
    memcpy(c->k, c->tmp_k, fbytes);
    memcpy(c->v, c->tmp_v, fbytes);
    memcpy(c->real, c->tmp_real, slots);
    memcpy(c->pos, c->tmp_pos, (size_t)c->window * sizeof(int64_t));
}

static int cat_shift_regime(const KvSlidingCache *c, int64_t host_total) {
    if (c == NULL) return 0;
    return host_total >= c->window ? 1 : 0;
}

/* k_new, v_new: (B, n, dim); real_new: (B, n); *total: positions stored before
 * this call (the device scalar); host_total: the host's count. */
static void cat_shift_update(KvSlidingCache *c, const float *k_new, const float *v_new,
                             const uint8_t *real_new, int64_t n, const int64_t *total,
                             int64_t host_total) {
    if (c == NULL || c->ops != &kv_cache_cat_shift || total == NULL || n < 1) return;
    const int64_t B = c->batch, W = c->window, D = c->dim;
    const size_t row_bytes = (size_t)D * sizeof(float);
    /* Positions come from the device scalar; host_total only picks the regime. */
    const int64_t p0 = *total;
    if (p0 < 0) return; /* not a position: nothing sensible to store */

    if (n == 1 && cat_shift_regime(c, host_total) == 0) {
        /* Filling: index_copy at the position, in place (no row moves). The
         * clamp is transformers'; it keeps a stale regime in bounds. */
        const int64_t slot = p0 < W - 1 ? p0 : W - 1;
        for (int64_t b = 0; b < B; b++) {
            memcpy(c->k + (b * W + slot) * D, k_new + b * D, row_bytes);
            memcpy(c->v + (b * W + slot) * D, v_new + b * D, row_bytes);
            c->real[b * W + slot] = real_new[b];
        }
        c->pos[slot] = p0;
        return;
    }

    if (n == 1) {
        /* Full: tmp = cat(keys[:, 1:], new), then keys = tmp. */
        for (int64_t b = 0; b < B; b++) {
            memcpy(c->tmp_k + b * W * D, c->k + (b * W + 1) * D, (size_t)(W - 1) * row_bytes);
            memcpy(c->tmp_v + b * W * D, c->v + (b * W + 1) * D, (size_t)(W - 1) * row_bytes);
            memcpy(c->tmp_real + b * W, c->real + b * W + 1, (size_t)(W - 1));
            memcpy(c->tmp_k + (b * W + W - 1) * D, k_new + b * D, row_bytes);
            memcpy(c->tmp_v + (b * W + W - 1) * D, v_new + b * D, row_bytes);
            c->tmp_real[b * W + W - 1] = real_new[b];
        }
        memcpy(c->tmp_pos, c->pos + 1, (size_t)(W - 1) * sizeof(int64_t));
        c->tmp_pos[W - 1] = p0;
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
                memcpy(c->tmp_k + dst * D, c->k + (b * W + s) * D, row_bytes);
                memcpy(c->tmp_v + dst * D, c->v + (b * W + s) * D, row_bytes);
                c->tmp_real[dst] = c->real[b * W + s];
            } else {
                const int64_t j = s - stored; /* new row */
                memcpy(c->tmp_k + dst * D, k_new + (b * n + j) * D, row_bytes);
                memcpy(c->tmp_v + dst * D, v_new + (b * n + j) * D, row_bytes);
                c->tmp_real[dst] = real_new[b * n + j];
            }
        }
        c->tmp_pos[i] = s < stored ? c->pos[s] : p0 + (s - stored);
    }
    for (int64_t i = keep; i < W; i++) {
        /* Still empty: the poison of reset, so a read shows in the logits. */
        for (int64_t b = 0; b < B; b++) {
            const int64_t dst = b * W + i;
            for (int64_t e = 0; e < D; e++) {
                c->tmp_k[dst * D + e] = NAN;
                c->tmp_v[dst * D + e] = NAN;
            }
            c->tmp_real[dst] = 0;
        }
        c->tmp_pos[i] = -1;
    }
    cat_shift_commit(c);
}

static KvCacheView cat_shift_view(const KvSlidingCache *c) {
    KvCacheView view = {0};
    if (c == NULL || c->ops != &kv_cache_cat_shift) return view;
    view.n_slots = c->window;
    view.row_stride = c->window;
    view.dim = c->dim;
    view.k = c->k;
    view.v = c->v;
    view.pos = c->pos;
    view.real = c->real;
    return view;
}

static bool cat_shift_sentinels_ok(const KvSlidingCache *c) {
    if (c == NULL || c->ops != &kv_cache_cat_shift) return false;
    return kv_guard_ok(c->k) && kv_guard_ok(c->v) && kv_guard_ok(c->real) &&
           kv_guard_ok(c->pos) && kv_guard_ok(c->tmp_k) && kv_guard_ok(c->tmp_v) &&
           kv_guard_ok(c->tmp_real) && kv_guard_ok(c->tmp_pos);
}

/* The persistent state: the slots; temporaries are scratch. */
static KvCacheState cat_shift_state(KvSlidingCache *c) {
    return (KvCacheState){.k = c->k, .v = c->v, .real = c->real, .pos = c->pos,
                          .counters = NULL, .batch = c->batch, .slots = c->window,
                          .dim = c->dim, .n_counters = 0};
}

const KvCacheOps kv_cache_cat_shift = {
    .name = "cat_shift",
    .one_token_order = KV_ATTEND_AFTER_UPDATE,
    .host_branch = true,
    .create = cat_shift_create,
    .destroy = cat_shift_destroy,
    .reset = cat_shift_reset,
    .update = cat_shift_update,
    .view = cat_shift_view,
    .regime = cat_shift_regime,
    .sentinels_ok = cat_shift_sentinels_ok,
    .state = cat_shift_state,
};
