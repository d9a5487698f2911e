/* forward.c: the reference forward pass (DESIGN §1, §2) over a full-length
 * cache where slot = absolute position, so the window is purely a mask.
 *
 * Determinism: every reduction is a kv_dot (fixed 16-lane pattern) or a
 * sequential sum over visible keys in ascending position (the canonical key
 * order of DESIGN §2); OpenMP splits only independent outputs (matmul output
 * columns, attention heads), so results are bitwise the same for any thread
 * count. */
#include "forward.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kvmath.h"

static void *kv_alloc_floats(int64_t n) {
    return calloc((size_t)(n > 0 ? n : 1), sizeof(float));
}

void kv_ref_state_free(KvRefState *s) {
    if (s == NULL) return;
    free(s->k);
    free(s->v);
    free(s->real);
    free(s->n_real);
    free(s->inv_freq);
    free(s->x);
    free(s->xn);
    free(s->q);
    free(s->kn);
    free(s->vn);
    free(s->att);
    free(s->tmp);
    free(s->gate);
    free(s->up);
    free(s->qpos);
    free(s->last);
    free(s->scores);
    memset(s, 0, sizeof *s);
}

KvStatus kv_ref_state_init(KvRefState *s, const KvModel *m, int64_t batch, int64_t max_len,
                           int64_t max_chunk, KvError *err) {
    const KvConfig *c = &m->config;
    memset(s, 0, sizeof *s);
    if (batch < 1 || max_len < 1 || max_chunk < 1 || max_chunk > max_len) {
        return kv_error_set(err, KV_ERR_INPUT,
                            "reference state: expected batch >= 1, 1 <= max_chunk <= max_len, "
                            "found batch %lld, max_len %lld, max_chunk %lld",
                            (long long)batch, (long long)max_len, (long long)max_chunk);
    }
    int64_t kv_dim = c->num_kv_heads * c->head_dim;
    int64_t q_dim = c->num_heads * c->head_dim;
    int64_t rows = batch * max_chunk;
    s->batch = batch;
    s->max_len = max_len;
    s->max_chunk = max_chunk;
    s->k = kv_alloc_floats(c->num_layers * batch * max_len * kv_dim);
    s->v = kv_alloc_floats(c->num_layers * batch * max_len * kv_dim);
    s->real = calloc((size_t)(batch * max_len), 1);
    s->n_real = calloc((size_t)batch, sizeof(int64_t));
    s->inv_freq = kv_alloc_floats(c->head_dim / 2);
    s->x = kv_alloc_floats(rows * c->hidden_size);
    s->xn = kv_alloc_floats(rows * c->hidden_size);
    s->q = kv_alloc_floats(rows * q_dim);
    s->kn = kv_alloc_floats(rows * kv_dim);
    s->vn = kv_alloc_floats(rows * kv_dim);
    s->att = kv_alloc_floats(rows * q_dim);
    s->tmp = kv_alloc_floats(rows * c->hidden_size);
    s->gate = kv_alloc_floats(rows * c->intermediate_size);
    s->up = kv_alloc_floats(rows * c->intermediate_size);
    s->qpos = calloc((size_t)rows, sizeof(int64_t));
    s->last = kv_alloc_floats(batch * c->hidden_size);
    s->scores = kv_alloc_floats(c->num_heads * max_len);
    if (!s->k || !s->v || !s->real || !s->n_real || !s->inv_freq || !s->x || !s->xn || !s->q ||
        !s->kn || !s->vn || !s->att || !s->tmp || !s->gate || !s->up || !s->qpos || !s->last ||
        !s->scores) {
        kv_ref_state_free(s);
        return kv_error_set(err, KV_ERR_INTERNAL,
                            "reference state: out of memory (batch %lld, max_len %lld)",
                            (long long)batch, (long long)max_len);
    }
    kv_rope_inv_freq(c->head_dim, c->rope_theta, s->inv_freq);
    return KV_OK;
}

/* out[r, :] = rmsnorm(in[r, :]) for rows r. */
static void ref_norm_rows(const KvConfig *c, const float *in, const float *w, int64_t rows,
                          float *out) {
    bool offset = c->family == KV_FAMILY_GEMMA2;
    for (int64_t r = 0; r < rows; r++) {
        kv_rmsnorm(in + r * c->hidden_size, w, c->hidden_size, (float)c->rms_norm_eps, offset,
                   out + r * c->hidden_size);
    }
}

/* Attention for the n new tokens of every row at layer `layer`, reading the
 * cache (which already holds the new keys). Keys are visited in ascending
 * slot order, i.e. ascending position: the canonical key order. */
static void ref_attention(const KvModel *m, KvRefState *s, int64_t layer, int64_t n) {
    const KvConfig *c = &m->config;
    const int64_t hd = c->head_dim;
    const int64_t kv_dim = c->num_kv_heads * hd;
    const int64_t q_dim = c->num_heads * hd;
    const int64_t window = kv_config_layer_window(c, layer);
    const float scale = kv_config_attn_scale(c);
    const float cap = (float)c->attn_logit_softcapping;
    const float *kc = s->k + layer * s->batch * s->max_len * kv_dim; /* (B, max_len, kv_dim) */
    const float *vc = s->v + layer * s->batch * s->max_len * kv_dim; /* (B, max_len, kv_dim) */

    for (int64_t b = 0; b < s->batch; b++) {
        const uint8_t *real = s->real + b * s->max_len;
        for (int64_t t = 0; t < n; t++) {
            int64_t qs = s->len + t; /* the query's slot (= cache position) */
            int64_t r = b * n + t;
#pragma omp parallel for schedule(static)
            for (int64_t h = 0; h < c->num_heads; h++) {
                const float *qh = s->q + r * q_dim + h * hd;
                float *out = s->att + r * q_dim + h * hd;
                float *sc = s->scores + h * s->max_len; /* (visible keys) */
                int64_t kvh = kv_gqa_kv_head(h, c->num_heads, c->num_kv_heads);
                for (int64_t d = 0; d < hd; d++) out[d] = 0.0f;
                if (!real[qs]) continue; /* a pad query sees nothing; its output is unused */
                int64_t nv = 0;
                for (int64_t k = 0; k <= qs; k++) {
                    if (!real[k] || !kv_window_visible(qs, k, window)) continue;
                    float dot = kv_dot(qh, kc + (b * s->max_len + k) * kv_dim + kvh * hd, hd);
                    sc[nv++] = kv_softcap(dot * scale, cap);
                }
                kv_softmax(sc, nv);
                int64_t rank = 0;
                for (int64_t k = 0; k <= qs; k++) {
                    if (!real[k] || !kv_window_visible(qs, k, window)) continue;
                    const float *vk = vc + (b * s->max_len + k) * kv_dim + kvh * hd;
                    float p = sc[rank++];
                    for (int64_t d = 0; d < hd; d++) out[d] += p * vk[d];
                }
            }
        }
    }
}

static void ref_layer(const KvModel *m, KvRefState *s, int64_t layer, int64_t n) {
    const KvConfig *c = &m->config;
    const KvLayerWeights *w = &m->layers[layer];
    const int64_t rows = s->batch * n;
    const int64_t hd = c->head_dim;
    const int64_t kv_dim = c->num_kv_heads * hd;
    const int64_t q_dim = c->num_heads * hd;
    const int64_t hidden = c->hidden_size;
    const bool gemma = c->family == KV_FAMILY_GEMMA2;

    ref_norm_rows(c, s->x, w->input_norm, rows, s->xn);
    kv_matmul(s->xn, w->wq, rows, hidden, q_dim, s->q);
    kv_matmul(s->xn, w->wk, rows, hidden, kv_dim, s->kn);
    kv_matmul(s->xn, w->wv, rows, hidden, kv_dim, s->vn);
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t h = 0; h < c->num_heads; h++) {
            kv_rope_apply(s->q + r * q_dim + h * hd, hd, s->inv_freq, s->qpos[r]);
        }
        for (int64_t h = 0; h < c->num_kv_heads; h++) {
            kv_rope_apply(s->kn + r * kv_dim + h * hd, hd, s->inv_freq, s->qpos[r]);
        }
    }
    /* Store the new keys/values at their slots, then attend. */
    float *kc = s->k + layer * s->batch * s->max_len * kv_dim; /* (B, max_len, kv_dim) */
    float *vc = s->v + layer * s->batch * s->max_len * kv_dim; /* (B, max_len, kv_dim) */
    for (int64_t b = 0; b < s->batch; b++) {
        for (int64_t t = 0; t < n; t++) {
            int64_t slot = s->len + t;
            memcpy(kc + (b * s->max_len + slot) * kv_dim, s->kn + (b * n + t) * kv_dim,
                   (size_t)kv_dim * sizeof(float));
            memcpy(vc + (b * s->max_len + slot) * kv_dim, s->vn + (b * n + t) * kv_dim,
                   (size_t)kv_dim * sizeof(float));
        }
    }
    ref_attention(m, s, layer, n);
    kv_matmul(s->att, w->wo, rows, q_dim, hidden, s->tmp);

    if (gemma) {
        /* h = x + post_attention_layernorm(attn(...)) */
        ref_norm_rows(c, s->tmp, w->post_attn_norm, rows, s->tmp);
        for (int64_t i = 0; i < rows * hidden; i++) s->x[i] = s->x[i] + s->tmp[i];
        ref_norm_rows(c, s->x, w->pre_ffw_norm, rows, s->xn);
    } else {
        for (int64_t i = 0; i < rows * hidden; i++) s->x[i] = s->x[i] + s->tmp[i];
        ref_norm_rows(c, s->x, w->post_attn_norm, rows, s->xn);
    }

    const int64_t inter = c->intermediate_size;
    kv_matmul(s->xn, w->w_gate, rows, hidden, inter, s->gate);
    kv_matmul(s->xn, w->w_up, rows, hidden, inter, s->up);
    for (int64_t i = 0; i < rows * inter; i++) {
        float a = gemma ? kv_gelu_tanh(s->gate[i]) : kv_silu(s->gate[i]);
        s->gate[i] = a * s->up[i];
    }
    kv_matmul(s->gate, w->w_down, rows, inter, hidden, s->tmp);
    if (gemma) ref_norm_rows(c, s->tmp, w->post_ffw_norm, rows, s->tmp);
    for (int64_t i = 0; i < rows * hidden; i++) s->x[i] = s->x[i] + s->tmp[i];
}

KvStatus kv_ref_forward(const KvModel *m, KvRefState *s, const int32_t *tokens,
                        const uint8_t *real, int64_t n, float *logits, KvError *err) {
    const KvConfig *c = &m->config;
    if (n < 1 || n > s->max_chunk || s->len + n > s->max_len) {
        return kv_error_set(err, KV_ERR_INPUT,
                            "reference forward: %lld new tokens at slot %lld exceed the state "
                            "(max_chunk %lld, max_len %lld)",
                            (long long)n, (long long)s->len, (long long)s->max_chunk,
                            (long long)s->max_len);
    }
    /* Validate everything before touching the state, so a bad call leaves
     * the cache as it was. */
    for (int64_t b = 0; b < s->batch; b++) {
        bool seen_real = s->n_real[b] > 0;
        for (int64_t t = 0; t < n; t++) {
            int32_t tok = tokens[b * n + t];
            if (tok < 0 || tok >= c->vocab_size) {
                return kv_error_set(err, KV_ERR_INPUT,
                                    "tokens: row %lld position %lld: expected a token id in "
                                    "[0, %lld), found %d",
                                    (long long)b, (long long)(s->len + t),
                                    (long long)c->vocab_size, tok);
            }
            if (real[b * n + t]) {
                seen_real = true;
            } else if (seen_real) {
                return kv_error_set(err, KV_ERR_INPUT,
                                    "tokens: row %lld position %lld: a pad after a real token "
                                    "(batches must be left-padded)",
                                    (long long)b, (long long)(s->len + t));
            }
        }
    }

    const int64_t hidden = c->hidden_size;
    /* gemma2 scales embeddings by sqrt(hidden) rounded to the activation
     * dtype (F32), as torch.tensor(hidden**0.5, dtype=...) does. */
    const float normalizer = c->family == KV_FAMILY_GEMMA2 ? (float)sqrt((double)hidden) : 1.0f;
    for (int64_t b = 0; b < s->batch; b++) {
        for (int64_t t = 0; t < n; t++) {
            int64_t r = b * n + t;
            const float *e = m->embed + (int64_t)tokens[r] * hidden;
            for (int64_t i = 0; i < hidden; i++) {
                s->x[r * hidden + i] = c->family == KV_FAMILY_GEMMA2 ? e[i] * normalizer : e[i];
            }
            uint8_t is_real = real[r] ? 1 : 0;
            s->real[b * s->max_len + s->len + t] = is_real;
            /* RoPE position = real tokens before this one in the row. */
            s->qpos[r] = is_real ? s->n_real[b]++ : 0;
        }
    }

    for (int64_t l = 0; l < c->num_layers; l++) ref_layer(m, s, l, n);

    for (int64_t b = 0; b < s->batch; b++) {
        kv_rmsnorm(s->x + (b * n + n - 1) * hidden, m->final_norm, hidden,
                   (float)c->rms_norm_eps, c->family == KV_FAMILY_GEMMA2,
                   s->last + b * hidden);
    }
    kv_matmul(s->last, m->lm_head, s->batch, hidden, c->vocab_size, logits);
    if (c->final_logit_softcapping > 0.0) {
        float cap = (float)c->final_logit_softcapping;
        for (int64_t i = 0; i < s->batch * c->vocab_size; i++) logits[i] = kv_softcap(logits[i], cap);
    }
    s->len += n;
    return KV_OK;
}
