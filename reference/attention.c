/* attention.c: the reference's cache store and attention (DESIGN §2): the
 * static cache keeps slot = position, and each query reduces its visible
 * keys in ascending position, the canonical key order every correct cache
 * variant must reproduce bitwise. */
#include "attention.h"

#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

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
