/* attention.c: the reference's cache store and attention (DESIGN §2): the
 * static cache keeps slot = position, and each query reduces its visible
 * keys in ascending position, the canonical key order every correct cache
 * variant must reproduce bitwise. */
#include "attention.h"

#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "attend_rows.h"
#include "kvmath.h"

KvAttnParams kv_ref_attn_params(const KvRefState *s, int64_t layer) {
    const KvConfig *c = &s->model->config;
    const KvRefHooks *hk = s->hooks;
    KvAttnParams p;
    p.hd = c->head_dim;
    p.heads = c->num_heads;
    p.kv_heads = c->num_kv_heads;
    p.kv_dim = c->num_kv_heads * c->head_dim;
    p.q_dim = c->num_heads * c->head_dim;
    p.window = kv_config_layer_window(c, layer);
    p.mask_window = hk != NULL && hk->mask_window != NULL ? hk->mask_window(hk->ctx, p.window)
                                                          : p.window;
    p.scale = kv_config_attn_scale(c);
    p.cap = (float)c->attn_logit_softcapping;
    p.sinks = s->model->layers[layer].sinks;
    p.descending = hk != NULL && hk->keys_descending != NULL && hk->keys_descending(hk->ctx);
    return p;
}

int kv_ref_attn_threads(const KvRefState *s, int64_t work) {
#ifdef _OPENMP
    if (work < kv_parallel_min_work()) return 1;
    int nt = omp_get_max_threads();
    return nt > s->n_scratch ? (int)s->n_scratch : nt;
#else
    (void)s;
    (void)work;
    return 1;
#endif
}

int64_t kv_ref_attn_slot(void) {
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}

void kv_ref_attend(const KvAttnParams *p, int64_t head, const float *q, const float **gk,
                   const float **gv, int64_t nk, float *scores, float *out) {
    for (int64_t i = 0; p->descending && i < nk / 2; i++) {
        const float *tk = gk[i], *tv = gv[i];
        gk[i] = gk[nk - 1 - i];
        gv[i] = gv[nk - 1 - i];
        gk[nk - 1 - i] = tk;
        gv[nk - 1 - i] = tv;
    }
    if (p->sinks != NULL) {
        kv_attend_sink(q, gk, gv, nk, p->hd, p->scale, p->sinks[head], scores, out); /* gpt_oss */
    } else {
        kv_attend(q, gk, gv, nk, p->hd, p->scale, p->cap, scores, out);
    }
}

bool kv_ref_attend_rows_ok(const KvAttnParams *p) {
    return kv_attend_rows_on() && p->hd % KV_DOT_LANES == 0 && !p->descending;
}

void kv_ref_attend_rows(const KvAttnParams *p, int64_t nr, const int64_t *heads,
                        const float *const *q, const int64_t *lo, const int64_t *hi,
                        const float *const *gk, const float *const *gv, float *scores,
                        int64_t ld, float *const *out) {
    const int64_t hd = p->hd;
    int64_t jmin = INT64_MAX, jmax = 0;  /* the rows' keys together */
    int64_t c0 = 0, c1 = INT64_MAX;      /* the keys every row has */
    for (int64_t r = 0; r < nr; r++) {
        jmin = lo[r] < jmin ? lo[r] : jmin;
        jmax = hi[r] > jmax ? hi[r] : jmax;
        c0 = lo[r] > c0 ? lo[r] : c0;
        c1 = hi[r] < c1 ? hi[r] : c1;
        memset(out[r], 0, (size_t)hd * sizeof(float)); /* the sums' +0 (and an empty row's output) */
    }
    if (nr == 0 || jmax <= jmin) return;
    /* Every row's dots over all the rows' keys: a row's extra dots (keys
     * outside its run) are never read. */
    kv_attend_dots_rows(q, nr, gk + jmin, jmax - jmin, hd, scores + jmin, ld);
    const float *pr[KV_ATTN_ROWS]; /* (nr) -> (ld) each row's weights */
    for (int64_t r = 0; r < nr; r++) {
        const float *sink = p->sinks != NULL ? &p->sinks[heads[r]] : NULL;
        kv_attend_weights(scores + r * ld + lo[r], hi[r] - lo[r], p->scale, p->cap, sink);
        pr[r] = scores + r * ld;
    }
    if (c0 >= c1) {
        for (int64_t r = 0; r < nr; r++) {
            kv_weighted_sum_rows(&pr[r], 1, gv, lo[r], hi[r], hd, &out[r]);
        }
        return;
    }
    /* Each row in key order: its own keys before the shared run, the shared
     * run beside the others, its own keys after. */
    for (int64_t r = 0; r < nr; r++) kv_weighted_sum_rows(&pr[r], 1, gv, lo[r], c0, hd, &out[r]);
    kv_weighted_sum_rows(pr, nr, gv, c0, c1, hd, out);
    for (int64_t r = 0; r < nr; r++) kv_weighted_sum_rows(&pr[r], 1, gv, c1, hi[r], hd, &out[r]);
}

typedef struct {
    KvRefState *s;
    int64_t layer, n;
} ArgsLayerN;

/* Store the new K/V at slot = position. */
static void op_store_static(const void *ap) {
    const ArgsLayerN *a = ap;
    KvRefState *s = a->s;
    const KvConfig *c = &s->model->config;
    const int64_t kv_dim = c->num_kv_heads * c->head_dim;
    float *kc = s->k + a->layer * s->batch * s->max_len * kv_dim; /* (B, max_len, kv_dim) */
    float *vc = s->v + a->layer * s->batch * s->max_len * kv_dim; /* (B, max_len, kv_dim) */
    for (int64_t b = 0; b < s->batch; b++) {
        for (int64_t t = 0; t < s->n_new[b]; t++) {
            const int64_t slot = s->pos0[b] + t;
            memcpy(kc + (b * s->max_len + slot) * kv_dim, s->kn + (b * a->n + t) * kv_dim,
                   (size_t)kv_dim * sizeof(float));
            memcpy(vc + (b * s->max_len + slot) * kv_dim, s->vn + (b * a->n + t) * kv_dim,
                   (size_t)kv_dim * sizeof(float));
        }
    }
}

int64_t kv_ref_attn_item_count(const KvAttnParams *p, int64_t batch, int64_t n) {
    const int64_t g = p->heads / p->kv_heads;                /* query heads per kv head */
    const int64_t gb = g < KV_ATTN_ROWS ? g : KV_ATTN_ROWS;  /* heads per item */
    const int64_t qb = KV_ATTN_ROWS / gb;                    /* queries per item */
    return batch * p->kv_heads * ((g + gb - 1) / gb) * ((n + qb - 1) / qb);
}

KvAttnItem kv_ref_attn_item(const KvAttnParams *p, int64_t n, int64_t it) {
    const int64_t g = p->heads / p->kv_heads;
    const int64_t gb = g < KV_ATTN_ROWS ? g : KV_ATTN_ROWS;
    const int64_t ng = (g + gb - 1) / gb, qb = KV_ATTN_ROWS / gb, nqb = (n + qb - 1) / qb;
    KvAttnItem m;
    memset(&m, 0, sizeof m);
    const int64_t qblk = it % nqb, hg = (it / nqb) % ng;
    m.kvh = (it / (nqb * ng)) % p->kv_heads;
    m.b = it / (nqb * ng * p->kv_heads);
    m.h0 = m.kvh * g + hg * gb;
    m.h1 = m.h0 + gb < (m.kvh + 1) * g ? m.h0 + gb : (m.kvh + 1) * g;
    m.t0 = qblk * qb;
    m.t1 = m.t0 + qb < n ? m.t0 + qb : n;
    m.qmin = m.qmax = -1;
    return m;
}

bool kv_ref_attn_item_begin(const KvAttnParams *p, KvAttnItem *it, int64_t n, int64_t pos0,
                            float *att) {
    it->qmin = it->qmax = -1;
    for (int64_t t = it->t0; t < it->t1; t++) {
        if (!it->real[t - it->t0]) {
            for (int64_t h = it->h0; h < it->h1; h++) {
                memset(att + (it->b * n + t) * p->q_dim + h * p->hd, 0,
                       (size_t)p->hd * sizeof(float));
            }
            continue;
        }
        if (it->qmin < 0) it->qmin = pos0 + t;
        it->qmax = pos0 + t;
    }
    return it->qmin >= 0;
}

void kv_ref_attn_item_run(const KvAttnParams *p, const KvAttnItem *it, int64_t n, int64_t pos0,
                          const int64_t *gp, const float *const *gk, const float *const *gv,
                          int64_t nu, const float *q, float *att, float *scores, int64_t ld) {
    int64_t heads[KV_ATTN_ROWS], lo[KV_ATTN_ROWS], hi[KV_ATTN_ROWS];
    const float *qr[KV_ATTN_ROWS];
    float *out[KV_ATTN_ROWS];
    int64_t nr = 0, jlo = 0, jhi = 0;
    for (int64_t t = it->t0; t < it->t1; t++) {
        if (!it->real[t - it->t0]) continue;
        const int64_t qs = pos0 + t, r = it->b * n + t;
        /* this query's run: the keys kv_window_visible lets it see */
        while (jlo < nu && !kv_window_visible(qs, gp[jlo], p->mask_window)) jlo++;
        while (jhi < nu && gp[jhi] <= qs) jhi++;
        for (int64_t h = it->h0; h < it->h1; h++, nr++) {
            heads[nr] = h;
            lo[nr] = jlo;
            hi[nr] = jhi;
            qr[nr] = q + r * p->q_dim + h * p->hd;
            out[nr] = att + r * p->q_dim + h * p->hd;
        }
    }
    kv_ref_attend_rows(p, nr, heads, qr, lo, hi, gk, gv, scores, ld, out);
}

/* op_attn_static with a kv head's rows together: one item per (sequence,
 * kv head, group of its query heads, block of consecutive queries), so each
 * key and value row is read once for up to KV_ATTN_ROWS (query, head) rows
 * instead of once per row. The queries of a block see overlapping runs of
 * one list of keys (the static cache's slots in ascending position), and
 * kv_ref_attend_rows gives each row kv_ref_attend's bits over its own run,
 * so the outputs are those of the one-item-per-row loop. */
static void attn_static_rows(KvRefState *s, const KvAttnParams *p, int64_t layer, int64_t n,
                             int nt) {
    const int64_t hd = p->hd, mw = p->mask_window;
    const float *kc = s->k + layer * s->batch * s->max_len * p->kv_dim; /* (B, max_len, kv_dim) */
    const float *vc = s->v + layer * s->batch * s->max_len * p->kv_dim; /* (B, max_len, kv_dim) */
    const int64_t items = kv_ref_attn_item_count(p, s->batch, n);
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        const int64_t slot = kv_ref_attn_slot();
        const float **gk = s->gk + slot * s->max_keys; /* (max_keys) */
        const float **gv = s->gv + slot * s->max_keys; /* (max_keys) */
        int64_t *gp = s->gpos + slot * s->max_keys;    /* (max_keys) */
        float *scores = s->row_scores + slot * KV_ATTN_ROWS * s->max_keys; /* (ROWS, max_keys) */
#pragma omp for schedule(dynamic, 1)
        for (int64_t i = 0; i < items; i++) {
            KvAttnItem it = kv_ref_attn_item(p, n, i);
            const int64_t b = it.b, pos0 = s->pos0[b];
            const uint8_t *real = s->real + b * s->max_len; /* (max_len) */
            for (int64_t t = it.t0; t < it.t1; t++) {
                it.real[t - it.t0] = t < s->n_new[b] && real[pos0 + t];
            }
            if (!kv_ref_attn_item_begin(p, &it, n, pos0, s->att)) continue;
            /* every key some query of the block sees, ascending */
            int64_t nu = 0;
            const int64_t k0 = mw > 0 && it.qmin - mw + 1 > 0 ? it.qmin - mw + 1 : 0;
            for (int64_t k = k0; k <= it.qmax; k++) {
                if (!real[k]) continue;
                gk[nu] = kc + (b * s->max_len + k) * p->kv_dim + it.kvh * hd;
                gv[nu] = vc + (b * s->max_len + k) * p->kv_dim + it.kvh * hd;
                gp[nu] = k;
                nu++;
            }
            kv_ref_attn_item_run(p, &it, n, pos0, gp, gk, gv, nu, s->q, s->att, scores,
                                 s->max_keys);
        }
    }
}

/* Attention over the static cache, which already holds the new keys: keys
 * are visited in ascending slot order, i.e. ascending position. */
static void op_attn_static(const void *ap) {
    const ArgsLayerN *a = ap;
    KvRefState *s = a->s;
    const KvAttnParams p = kv_ref_attn_params(s, a->layer);
    const int64_t hd = p.hd;
    const float *kc = s->k + a->layer * s->batch * s->max_len * p.kv_dim; /* (B, max_len, kv_dim) */
    const float *vc = s->v + a->layer * s->batch * s->max_len * p.kv_dim; /* (B, max_len, kv_dim) */
    const int64_t n = a->n;
    const int64_t items = s->batch * n * p.heads;
    const int nt = kv_ref_attn_threads(s, 2 * items * (s->total_mem + n) * hd);
    if (kv_ref_attend_rows_ok(&p) && nt <= s->n_row_slots) {
        attn_static_rows(s, &p, a->layer, n, nt);
        return;
    }

    /* One item per (sequence, query, head), in any thread: each item's keys
     * and sums are its own, so the bits do not depend on who runs it.
     * Dynamic schedule: a later query sees more keys. */
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        const int64_t slot = kv_ref_attn_slot();
        const float **gk = s->gk + slot * s->max_keys; /* (max_keys) */
        const float **gv = s->gv + slot * s->max_keys; /* (max_keys) */
        float *scores = s->scores + slot * s->max_keys; /* (max_keys) */
#pragma omp for schedule(dynamic, 1)
        for (int64_t it = 0; it < items; it++) {
            const int64_t h = it % p.heads;
            const int64_t r = it / p.heads; /* b * n + t */
            const int64_t b = r / n, t = r % n;
            const uint8_t *real = s->real + b * s->max_len; /* (max_len) */
            const int64_t qs = s->pos0[b] + t; /* the query's slot (= cache position) */
            const int64_t kvh = kv_gqa_kv_head(h, p.heads, p.kv_heads);
            int64_t nk = 0;
            /* A pad query (left or trailing) sees nothing; its output is
             * never used. */
            const bool q_real = t < s->n_new[b] && real[qs];
            for (int64_t k = 0; q_real && k <= qs; k++) {
                if (!real[k] || !kv_window_visible(qs, k, p.mask_window)) continue;
                gk[nk] = kc + (b * s->max_len + k) * p.kv_dim + kvh * hd;
                gv[nk] = vc + (b * s->max_len + k) * p.kv_dim + kvh * hd;
                nk++;
            }
            kv_ref_attend(&p, h, s->q + r * p.q_dim + h * hd, gk, gv, nk, scores,
                          s->att + r * p.q_dim + h * hd);
        }
    }
}

void kv_ref_launch_static_attention(KvRefState *s, int64_t layer, int64_t n) {
    const ArgsLayerN a = {s, layer, n};
    kv_stream_launch(&s->stream, op_store_static, &a, sizeof a);
    kv_stream_launch(&s->stream, op_attn_static, &a, sizeof a);
}
