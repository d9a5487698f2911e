/* cpu_attention.c: a cache variant's sliding layers in the CPU run
 * (DESIGN §3), plugged into the reference as its attention hook
 * (KvRefHooks.launch_attention). Sliding layers keep K/V in the variant's
 * slots and attention gathers the variant's view by its layout rule
 * (layout.h), sorted by position, so every correct variant is bitwise equal
 * to the reference and a variant that writes where its rule does not read
 * is not.
 *
 * Graph rule (forward.c) with one deliberate exception: `host_total` for
 * cache updates is frozen at capture; host-branch variants choose their
 * regime from it, and graph mode re-captures when that regime changes, as a
 * framework does. */
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "attention.h"
#include "cpu_state.h"
#include "fault.h"
#include "kvmath.h"

/* A variant's cache update. host_total is frozen at capture on purpose (see
 * the file comment); positions come from memory through &total_mem. */
typedef struct {
    KvCpuState *cs;
    int64_t layer, n, host_total;
    /* per_row: each row's host count (positions stored), frozen likewise */
    int64_t host_rows[KV_PER_ROW_MAX];
} ArgsCacheUpdate;

static void op_cache_update(const void *ap) {
    const ArgsCacheUpdate *a = ap;
    KvCpuState *cs = a->cs;
    KvRefState *s = &cs->ref;
    if (!cs->per_row) {
        cs->variant->update(kv_cpu_cache(cs, a->layer, 0, NULL), s->kn, s->vn, s->real_in, a->n,
                            &s->total_mem, a->host_total);
        return;
    }
    /* Each row's own cache takes the row's tokens that take positions (its
     * first n_new), at the row's own position from memory. */
    const int64_t kv_dim = s->model->config.num_kv_heads * s->model->config.head_dim;
    for (int64_t b = 0; b < s->batch; b++) {
        if (s->n_new[b] < 1) continue;
        cs->variant->update(kv_cpu_cache(cs, a->layer, b, NULL), s->kn + b * a->n * kv_dim,
                           s->vn + b * a->n * kv_dim, s->real_in + b * a->n, s->n_new[b],
                           &s->pos0[b], a->host_rows[b]);
    }
}

/* Attention over a variant's view of a sliding layer plus (include_new) the
 * new keys. n_slots is the attended length frozen at capture (the "shape"
 * baked into a graph; the dynamic variant re-captures when it grows). Slots
 * may hold positions in any order (ring, always_roll): each slot's position
 * comes from the layout rule, keys are gathered and sorted by it, so the
 * reduction order is the reference's. */
typedef struct {
    KvCpuState *cs;
    int64_t layer, n, n_slots;
    bool include_new;
} ArgsAttnVariant;

/* Insertion sort of gathered keys by position (distinct): the canonical
 * key order. Linear when they are already in order. */
static void sort_by_position(const float **gk /* (nk) */, const float **gv /* (nk) */,
                             int64_t *gp /* (nk) */, int64_t nk) {
    for (int64_t i = 1; i < nk; i++) {
        const float *ki = gk[i];
        const float *vi = gv[i];
        const int64_t pi = gp[i];
        int64_t j = i - 1;
        for (; j >= 0 && gp[j] > pi; j--) {
            gk[j + 1] = gk[j];
            gv[j + 1] = gv[j];
            gp[j + 1] = gp[j];
        }
        gk[j + 1] = ki;
        gv[j + 1] = vi;
        gp[j + 1] = pi;
    }
}

/* op_attn_variant with a kv head's rows together (as the reference's
 * static attention, attention.c): one item per (row, kv head, group of its
 * query heads, block of consecutive queries). The block's keys are gathered
 * and put in position order once: the layout rules (layout.h) keep slot
 * positions ascending, or a rotation of ascending (ring), so the walk starts
 * at the oldest slot; the new keys follow, younger than every stored one.
 * Each query's keys are then one run of that list, and kv_ref_attend_rows
 * gives every row kv_ref_attend's bits over its run: the outputs of the
 * one-item-per-row loop. Not for KV_FAULT_UNWRITTEN_SLOT, whose empty slots
 * are keys of every query whatever their position. */
static void attn_variant_rows(const ArgsAttnVariant *a, const KvAttnParams *prm,
                              const KvCacheView *views, int nt) {
    KvCpuState *cs = a->cs;
    KvRefState *s = &cs->ref;
    const int64_t hd = prm->hd, kv_dim = prm->kv_dim;
    const int64_t mw = prm->mask_window, n = a->n;
    const KvLayoutRule rule = cs->variant->layout;
    const int64_t items = kv_ref_attn_item_count(prm, s->batch, n);
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        const int64_t slot = kv_ref_attn_slot();
        const float **gk = s->gk + slot * s->max_keys; /* (max_keys) */
        const float **gv = s->gv + slot * s->max_keys; /* (max_keys) */
        int64_t *gp = s->gpos + slot * s->max_keys;    /* (max_keys) */
        float *scores = s->row_scores + slot * KV_ATTN_ROWS * s->max_keys; /* (ROWS, max_keys) */
#pragma omp for schedule(dynamic, 1)
        for (int64_t i = 0; i < items; i++) {
            KvAttnItem it = kv_ref_attn_item(prm, n, i);
            const int64_t b = it.b, len = s->pos0[b];
            for (int64_t t = it.t0; t < it.t1; t++) {
                it.real[t - it.t0] = s->real_in[b * n + t] != 0 && t < s->n_new[b];
            }
            if (!kv_ref_attn_item_begin(prm, &it, n, len, s->att)) continue;
            const int64_t stored = a->include_new ? len : len + s->n_new[b];
            const KvCacheView *view = &views[cs->per_row ? b : 0];
            const int64_t vb = cs->per_row ? 0 : b;
            const int64_t n_slots = a->n_slots < view->row_stride ? a->n_slots : view->row_stride;
            /* the stored keys some query of the block sees, oldest slot first */
            int64_t first = -1, pmin = INT64_MAX;
            for (int64_t j = 0; j < n_slots; j++) {
                const int64_t p = kv_layout_position(rule, prm->window, j, stored);
                if (p >= 0 && p < pmin) {
                    pmin = p;
                    first = j;
                }
            }
            int64_t nu = 0;
            for (int64_t c = 0; first >= 0 && c < n_slots; c++) {
                const int64_t j = (first + c) % n_slots;
                const int64_t p = kv_layout_position(rule, prm->window, j, stored);
                if (p < 0 || !view->real[vb * view->row_stride + j]) continue;
                if (p > it.qmax || (mw > 0 && p <= it.qmin - mw)) continue;
                gk[nu] = view->k + (vb * view->row_stride + j) * view->dim + it.kvh * hd;
                gv[nu] = view->v + (vb * view->row_stride + j) * view->dim + it.kvh * hd;
                gp[nu] = p;
                nu++;
            }
            sort_by_position(gk, gv, gp, nu); /* already in order under every rule */
            for (int64_t u = 0; a->include_new && len + u <= it.qmax; u++) {
                const int64_t p = len + u;
                if (!s->real_in[b * n + u] || (mw > 0 && p <= it.qmin - mw)) continue;
                gk[nu] = s->kn + (b * n + u) * kv_dim + it.kvh * hd;
                gv[nu] = s->vn + (b * n + u) * kv_dim + it.kvh * hd;
                gp[nu] = p;
                nu++;
            }
            kv_ref_attn_item_run(prm, &it, n, len, gp, gk, gv, nu, s->q, s->att, scores,
                                 s->max_keys);
        }
    }
}

static void op_attn_variant(const void *ap) {
    const ArgsAttnVariant *a = ap;
    KvCpuState *cs = a->cs;
    KvRefState *s = &cs->ref;
    const KvAttnParams prm = kv_ref_attn_params(s, a->layer);
    const int64_t hd = prm.hd, kv_dim = prm.kv_dim, q_dim = prm.q_dim;
    const int64_t window = prm.mask_window;
    /* KV_FAULT_UNWRITTEN_SLOT: the mask forgets slot validity, so an empty
     * slot (position -1, NaN since reset) is gathered like a key. */
    const bool unwritten = (cs->faults & KV_FAULT_UNWRITTEN_SLOT) != 0;
    /* Each row's view: the layer's one cache, or the row's own (per_row). */
    KvCacheView views[KV_PER_ROW_MAX];
    const int64_t n_views = cs->per_row ? s->batch : 1;
    for (int64_t i = 0; i < n_views; i++) {
        views[i] = cs->variant->view(kv_cpu_cache(cs, a->layer, i, NULL));
    }
    const int64_t n = a->n;
    /* Slot i's position by the variant's layout rule (layout.h), as a real
     * kernel finds it: positions stored so far are len, plus this step's n
     * when the update ran first. view.pos is the writer's record and is not
     * read here; the cache probe checks it. */
    const KvLayoutRule rule = cs->variant->layout;
    const int64_t cache_w = prm.window;

    const int64_t items = s->batch * n * prm.heads;
    const int nt = kv_ref_attn_threads(s, 2 * items * (a->n_slots + n) * hd);
    if (kv_ref_attend_rows_ok(&prm) && !unwritten && nt <= s->n_row_slots) {
        attn_variant_rows(a, &prm, views, nt);
        return;
    }

    /* One item per (row, query, head), in any thread (see op_attn_static). */
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        const int64_t slot = kv_ref_attn_slot();
        const float **gk = s->gk + slot * s->max_keys; /* (max_keys) */
        const float **gv = s->gv + slot * s->max_keys; /* (max_keys) */
        int64_t *gp = s->gpos + slot * s->max_keys;    /* (max_keys) */
        float *scores = s->scores + slot * s->max_keys; /* (max_keys) */
#pragma omp for schedule(dynamic, 1)
        for (int64_t it = 0; it < items; it++) {
            const int64_t h = it % prm.heads;
            const int64_t r = it / prm.heads; /* b * n + t */
            const int64_t b = r / n, t = r % n;
            const int64_t len = s->pos0[b]; /* the row's positions before this forward */
            const int64_t stored = a->include_new ? len : len + s->n_new[b];
            const KvCacheView *view = &views[cs->per_row ? b : 0];
            const int64_t vb = cs->per_row ? 0 : b; /* the row inside the view */
            /* n_slots is baked at capture (the widest row's with per_row:
             * a shorter row's extra slots are empty by its rule) */
            const int64_t n_slots = a->n_slots < view->row_stride ? a->n_slots : view->row_stride;
            const int64_t qs = len + t;
            const bool q_real = s->real_in[r] != 0 && t < s->n_new[b];
            const int64_t kvh = kv_gqa_kv_head(h, prm.heads, prm.kv_heads);
            int64_t nk = 0;
            for (int64_t i = 0; q_real && i < n_slots; i++) {
                const int64_t p = kv_layout_position(rule, cache_w, i, stored);
                if (!(p < 0 && unwritten)) {
                    if (p < 0 || !view->real[vb * view->row_stride + i]) continue;
                    if (!kv_window_visible(qs, p, window)) continue;
                }
                gk[nk] = view->k + (vb * view->row_stride + i) * view->dim + kvh * hd;
                gv[nk] = view->v + (vb * view->row_stride + i) * view->dim + kvh * hd;
                gp[nk] = p;
                nk++;
            }
            for (int64_t u = 0; q_real && a->include_new && u <= t; u++) {
                if (!s->real_in[b * n + u] || !kv_window_visible(qs, len + u, window)) continue;
                gk[nk] = s->kn + (b * n + u) * kv_dim + kvh * hd;
                gv[nk] = s->vn + (b * n + u) * kv_dim + kvh * hd;
                gp[nk] = len + u;
                nk++;
            }
            sort_by_position(gk, gv, gp, nk); /* canonical key order */
            kv_ref_attend(&prm, h, s->q + r * q_dim + h * hd, gk, gv, nk, scores,
                          s->att + r * q_dim + h * hd);
        }
    }
}

bool kv_cpu_launch_attention(void *ctx, KvRefState *s, int64_t layer, int64_t n) {
    KvCpuState *cs = ctx;
    if (kv_cpu_cache(cs, layer, 0, NULL) == NULL) return false; /* a full layer */
    /* n == 1 takes the variant's fast path; n > 1 attends over the cached
     * keys plus the new ones, then stores the last min(W, seen). */
    const KvCacheOps *ops = cs->variant;
    const bool after = n == 1 && ops->one_token_order == KV_ATTEND_AFTER_UPDATE;
    ArgsCacheUpdate up = {cs, layer, n, s->len, {0}};
    /* The attended length is read now, at launch: a graph bakes it in.
     * Fixed-size variants always expose W slots; dynamic attends before
     * its update, so this is the length the step really attends over
     * (with per-row positions the widest row's). */
    int64_t n_slots = 0;
    for (int64_t b = 0; b < (cs->per_row ? s->batch : 1); b++) {
        const int64_t v = ops->view(kv_cpu_cache(cs, layer, b, NULL)).n_slots;
        if (v > n_slots) n_slots = v;
        /* the host's own count of the row's positions */
        if (cs->per_row) up.host_rows[b] = s->len - s->lag[b];
    }
    if (after) kv_stream_launch(&s->stream, op_cache_update, &up, sizeof up);
    ArgsAttnVariant att = {cs, layer, n, n_slots, !after};
    kv_stream_launch(&s->stream, op_attn_variant, &att, sizeof att);
    if (!after) kv_stream_launch(&s->stream, op_cache_update, &up, sizeof up);
    return true;
}
