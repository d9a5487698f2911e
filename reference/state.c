/* state.c: the reference's state (state.h KvRefState): its allocation,
 * sized once for the largest forward it will run; and the matmul a hook
 * may replace. */
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "state.h"
#include "kvmath.h"

static void *kv_alloc_floats(int64_t n) {
    return calloc((size_t)(n > 0 ? n : 1), sizeof(float));
}

void kv_ref_state_free(KvRefState *s) {
    if (s == NULL) return;
    void *owned[] = {s->k,          s->v,          s->real,       s->n_real,     s->lag,
                     s->pos0,       s->n_new,      s->inv_freq,   s->inv_freq_local,
                     s->x,          s->xn,         s->q,          s->kn,         s->vn,
                     s->att,        s->tmp,        s->gate,       s->up,         s->qpos,
                     s->last,       s->moe_logits, s->moe_pick,   s->moe_weight, s->moe_gu,
                     s->moe_h,      s->moe_out,    s->moe_rows,   s->moe_x,      s->scores,     (void *)s->gk, (void *)s->gv, s->row_scores,
                     s->gpos,       s->tok_in,     s->real_in,    s->logits,     s->next_tok,
                     s->margin};
    for (size_t i = 0; i < sizeof owned / sizeof owned[0]; i++) free(owned[i]);
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
    const int64_t kv_dim = c->num_kv_heads * c->head_dim;
    const int64_t q_dim = c->num_heads * c->head_dim;
    const int64_t rows = batch * max_chunk;
    const int64_t H = c->hidden_size, I = c->intermediate_size;
    s->model = m;
    s->batch = batch;
    s->max_len = max_len;
    s->max_chunk = max_chunk;
    s->k = kv_alloc_floats(c->num_layers * batch * max_len * kv_dim);
    s->v = kv_alloc_floats(c->num_layers * batch * max_len * kv_dim);
    s->real = calloc((size_t)(batch * max_len), 1);
    s->n_real = calloc((size_t)batch, sizeof(int64_t));
    s->lag = calloc((size_t)batch, sizeof(int64_t));
    s->pos0 = calloc((size_t)batch, sizeof(int64_t));
    s->n_new = calloc((size_t)batch, sizeof(int64_t));
    s->inv_freq = kv_alloc_floats(c->head_dim / 2);
    bool ok = true;
    if (c->num_experts > 0) {
        s->moe_logits = kv_alloc_floats(rows * c->num_experts);
        s->moe_pick = calloc((size_t)(rows * c->experts_per_tok), sizeof *s->moe_pick);
        s->moe_weight = kv_alloc_floats(rows * c->experts_per_tok);
        s->moe_rows = calloc((size_t)rows, sizeof *s->moe_rows);
        s->moe_x = kv_alloc_floats(rows * H);
        s->moe_gu = kv_alloc_floats(rows * 2 * I);
        s->moe_h = kv_alloc_floats(rows * I);
        s->moe_out = kv_alloc_floats(rows * H);
        ok = s->moe_logits && s->moe_pick && s->moe_weight && s->moe_rows && s->moe_x &&
             s->moe_gu && s->moe_h && s->moe_out;
    }
    s->x = kv_alloc_floats(rows * H);
    s->xn = kv_alloc_floats(rows * H);
    s->q = kv_alloc_floats(rows * q_dim);
    s->kn = kv_alloc_floats(rows * kv_dim);
    s->vn = kv_alloc_floats(rows * kv_dim);
    s->att = kv_alloc_floats(rows * q_dim);
    s->tmp = kv_alloc_floats(rows * H);
    s->gate = kv_alloc_floats(rows * I);
    s->up = kv_alloc_floats(rows * I);
    s->qpos = calloc((size_t)rows, sizeof(int64_t));
    s->last = kv_alloc_floats(batch * H);
    s->max_keys = max_len + c->sliding_window;
    s->n_scratch = c->num_heads;
#ifdef _OPENMP
    /* Enough slots for every thread at init; attention runs on at most
     * n_scratch threads if the count grows later. */
    if (omp_get_max_threads() > s->n_scratch) s->n_scratch = omp_get_max_threads();
#endif
    s->scores = kv_alloc_floats(s->n_scratch * s->max_keys);
    s->gk = calloc((size_t)(s->n_scratch * s->max_keys), sizeof *s->gk);
    s->gv = calloc((size_t)(s->n_scratch * s->max_keys), sizeof *s->gv);
    s->gpos = calloc((size_t)(s->n_scratch * s->max_keys), sizeof *s->gpos);
    s->n_row_slots = 1;
#ifdef _OPENMP
    s->n_row_slots = omp_get_max_threads();
#endif
    s->row_scores = kv_alloc_floats(s->n_row_slots * KV_ATTN_ROWS * s->max_keys);
    s->tok_in = calloc((size_t)rows, sizeof *s->tok_in);
    s->real_in = calloc((size_t)rows, 1);
    s->logits = kv_alloc_floats(batch * c->vocab_size);
    s->next_tok = calloc((size_t)batch, sizeof *s->next_tok);
    s->margin = kv_alloc_floats(batch);
    if (c->rope_theta_local > 0.0) s->inv_freq_local = kv_alloc_floats(c->head_dim / 2);
    ok = ok && s->k && s->v && s->real && s->n_real && s->lag && s->pos0 && s->n_new &&
         s->inv_freq && s->x && s->xn && s->q && s->kn && s->vn && s->att && s->tmp &&
         s->gate && s->up && s->qpos && s->last && s->scores && s->gk && s->gv && s->gpos && s->row_scores &&
         s->tok_in && s->real_in && s->logits && s->next_tok && s->margin &&
         (c->rope_theta_local <= 0.0 || s->inv_freq_local);
    if (!ok) {
        kv_ref_state_free(s);
        return kv_error_set(err, KV_ERR_INTERNAL,
                            "reference state: out of memory (batch %lld, max_len %lld)",
                            (long long)batch, (long long)max_len);
    }
    kv_rope_layer_inv_freq(c, -1, s->inv_freq); /* rope_theta's (YaRN's for gpt_oss) */
    s->rope_scale = kv_rope_scale(c);
    if (s->inv_freq_local != NULL) {
        /* gemma3: the sliding layers' own base */
        kv_rope_inv_freq(c->head_dim, c->rope_theta_local, s->inv_freq_local);
    }
    return KV_OK;
}

const float *kv_ref_layer_inv_freq(const KvRefState *s, int64_t layer) {
    const bool local = s->inv_freq_local != NULL && s->model->config.layer_sliding[layer];
    return local ? s->inv_freq_local : s->inv_freq;
}

void kv_ref_matmul(KvMatmulFn mm, const float *x, KvMat w, int64_t rows, int64_t in,
                   int64_t out, float *y) {
    if (mm != NULL) {
        mm(x, w, rows, in, out, y);
    } else {
        kv_matmul_mat(x, w, rows, in, out, y);
    }
}
