/* forward.c: the reference forward pass (DESIGN §1, §2), written as ops on a
 * stream (stream.h) so that the same code runs eagerly or is captured into a
 * graph and replayed (DESIGN §4, graph mode on the CPU). Read it top down:
 * the state, the ops in the order a layer runs them, then the op list of
 * one forward (launch_layer, kv_ref_launch_forward). The state's allocation
 * is in state.c, attention over the static cache in attention.c, gpt_oss's
 * experts in moe.c.
 *
 * Graph rule: everything that changes from one decode step to the next (the
 * position, the input tokens, the RoPE positions) is read by the ops from
 * state memory at execution time; op arguments hold only pointers and values
 * that are fixed for the captured step (n, layer index, sizes).
 *
 * Determinism: every reduction is a kv_dot (fixed 16-lane pattern) or a
 * kv_attend over visible keys in ascending position; OpenMP splits only
 * independent outputs, so results are bitwise the same for any thread count.
 * A hook (KvRefHooks, state.h) is called at fixed places and changes only
 * what it replaces. */
#include "forward.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attention.h"
#include "kvmath.h"
#include "moe.h"

/* ---- the observer (KvRefHooks.observe) as an op ---- */

typedef struct {
    KvRefState *s;
    int64_t layer;
    KvPoint point;
    const void *base;
    int64_t per_seq; /* bytes */
} ArgsObserve;

static void op_observe(const void *ap) {
    const ArgsObserve *a = ap;
    a->s->hooks->observe(a->s->hooks->ctx, a->s, a->layer, a->point, a->base, a->per_seq);
}

static void launch_observe(KvRefState *s, int64_t layer, KvPoint point, const void *base,
                           int64_t per_seq) {
    if (s->hooks == NULL || s->hooks->observe == NULL) return;
    const ArgsObserve a = {s, layer, point, base, per_seq};
    kv_stream_launch(&s->stream, op_observe, &a, sizeof a);
}

/* ---- ops: each takes one argument struct, copied by value at launch ---- */

void kv_ref_place_tokens(KvRefState *s, int64_t n, bool pads_take_slots) {
    const int64_t len = s->total_mem;
    for (int64_t b = 0; b < s->batch; b++) {
        const int64_t pos = len - s->lag[b]; /* the sequence's slots so far */
        bool seen = s->n_real[b] > 0;
        int64_t m = 0; /* tokens that take a slot */
        s->pos0[b] = pos;
        for (int64_t t = 0; t < n; t++) {
            const int64_t r = b * n + t;
            const uint8_t is_real = s->real_in[r] ? 1 : 0;
            if (!is_real && seen && !pads_take_slots) {
                /* A trailing pad: static-shape filler, no slot, no position
                 * (only real tokens precede it in this forward, and none
                 * follows: kv_ref_check_input). */
                s->qpos[r] = 0;
                continue;
            }
            seen = seen || is_real;
            s->real[b * s->max_len + pos + m] = is_real;
            s->qpos[r] = is_real ? s->n_real[b]++ : 0;
            m++;
        }
        s->n_new[b] = m;
    }
}

/* Arguments of the ops that need only the state and the token count. */
typedef struct {
    KvRefState *s;
    int64_t n;
} ArgsStepN;

/* Per new token: its slot, whether the slot is real, its RoPE position. */
static void op_positions(const void *ap) {
    const ArgsStepN *a = ap;
    kv_ref_place_tokens(a->s, a->n, false);
}

static void op_embed(const void *ap) {
    const ArgsStepN *a = ap;
    KvRefState *s = a->s;
    const KvConfig *c = &s->model->config;
    const int64_t hidden = c->hidden_size;
    const bool gemma = kv_config_gemma_style(c);
    /* gemma2/3 scale embeddings by sqrt(hidden) rounded to the activation
     * dtype (F32), as torch.tensor(hidden**0.5, dtype=...) does. */
    const float normalizer = gemma ? (float)sqrt((double)hidden) : 1.0f;
    for (int64_t r = 0; r < s->batch * a->n; r++) {
        float *xr = s->x + r * hidden; /* (hidden) the token's embedding row, widened */
        kv_mat_widen(s->model->embed, (int64_t)s->tok_in[r] * hidden, hidden, xr);
        if (gemma) {
            for (int64_t i = 0; i < hidden; i++) xr[i] = xr[i] * normalizer;
        }
    }
}

typedef struct {
    const KvConfig *c;
    const float *in;  /* (rows, hidden) */
    const float *w;   /* (hidden) */
    float *out;       /* (rows, hidden); may equal in */
    int64_t rows;
} ArgsNorm;

static void op_norm_rows(const void *ap) {
    const ArgsNorm *a = ap;
    const bool offset = kv_config_gemma_style(a->c);
    const int64_t h = a->c->hidden_size;
    for (int64_t r = 0; r < a->rows; r++) {
        kv_rmsnorm(a->in + r * h, a->w, h, (float)a->c->rms_norm_eps, offset, a->out + r * h);
    }
}

/* Left padding: the pad rows of a prefill chunk feed nothing a real token
 * reads (attention skips pad keys and pad queries; each row's matmuls,
 * norms and activations are its own), so their matmuls can be skipped
 * without changing a real token's bits. Not while an observer watches: it
 * sees every row of the chunk, pads too. Returns the mask to pass (real_in)
 * or NULL. */
static const uint8_t *pad_skip_mask(const KvRefState *s, int64_t n) {
    const bool observed = s->hooks != NULL && s->hooks->observe != NULL;
    return observed || n == 1 ? NULL : s->real_in;
}

/* The first real row of sequence b's chunk (n when it is all pad): every
 * real row of the chunk is in [first, n) (kv_ref_check_input: left pads
 * before, trailing pads after, which are computed and never read). */
static int64_t chunk_first_real(const uint8_t *real /* (B * n) */, int64_t b, int64_t n) {
    int64_t f = 0;
    while (f < n && !real[b * n + f]) f++;
    return f;
}

/* The matmul a hook installed, or NULL for the canonical kernels. */
static KvMatmulFn matmul_hook(const KvRefState *s) {
    return s->hooks != NULL ? s->hooks->matmul : NULL;
}

/* Up to three projections of one input: y[j] = x w[j]^T. */
typedef struct {
    const float *x;     /* (rows, in) */
    KvMat w[3];         /* (out[j], in) as stored */
    float *y[3];        /* (rows, out[j]) */
    int64_t out[3];
    int64_t rows, in;
    int count;
    KvMatmulFn mm;       /* NULL: kv_matmul_multi, one parallel region */
    /* (rows) the chunk's real mask, rows = B * n, when pad rows may be
     * skipped (pad_skip_mask); NULL: every row is computed. */
    const uint8_t *real;
    int64_t n;
} ArgsMatmul;

static void matmul_rows(const ArgsMatmul *a, int64_t r0, int64_t rows) {
    const float *x = a->x + r0 * a->in; /* (rows, in) */
    if (a->mm == NULL && a->count > 1) {
        float *y[3] = {NULL, NULL, NULL};
        for (int j = 0; j < a->count; j++) y[j] = a->y[j] + r0 * a->out[j];
        kv_matmul_multi(x, rows, a->in, a->count, a->w, a->out, y);
        return;
    }
    for (int j = 0; j < a->count; j++) {
        kv_ref_matmul(a->mm, x, a->w[j], rows, a->in, a->out[j], a->y[j] + r0 * a->out[j]);
    }
}

static void op_matmul(const void *ap) {
    const ArgsMatmul *a = ap;
    if (a->real == NULL) {
        matmul_rows(a, 0, a->rows);
        return;
    }
    /* Per sequence, its real rows only; pad rows of y are zeroed so that
     * what reads them (norms, the cache's pad slots) sees finite values. */
    for (int64_t r0 = 0; r0 < a->rows; r0 += a->n) {
        const int64_t f = chunk_first_real(a->real, r0 / a->n, a->n);
        for (int j = 0; j < a->count; j++) {
            memset(a->y[j] + r0 * a->out[j], 0, (size_t)(f * a->out[j]) * sizeof(float));
        }
        if (f < a->n) matmul_rows(a, r0 + f, a->n - f);
    }
}

/* y[r, :] += b for every row: a projection's bias (qwen2's q/k/v), added
 * after the matmul, as torch's linear adds it to the finished product. */
typedef struct {
    float *y;       /* (rows, out) */
    const float *b; /* (out) */
    int64_t rows, out;
} ArgsBias;

static void op_bias_rows(const void *ap) {
    const ArgsBias *a = ap;
    for (int64_t r = 0; r < a->rows; r++) {
        for (int64_t i = 0; i < a->out; i++) a->y[r * a->out + i] += a->b[i];
    }
}

/* gemma3's q_norm / k_norm: a (1 + w) RMSNorm over each head's head_dim
 * values of q and of the new keys, in place, before RoPE. */
typedef struct {
    KvRefState *s;
    int64_t n;
    const float *q_norm; /* (head_dim) */
    const float *k_norm; /* (head_dim) */
} ArgsQkNorm;

static void op_qk_norm(const void *ap) {
    const ArgsQkNorm *a = ap;
    KvRefState *s = a->s;
    const KvConfig *c = &s->model->config;
    const int64_t hd = c->head_dim;
    const float eps = (float)c->rms_norm_eps;
    for (int64_t r = 0; r < s->batch * a->n; r++) {
        for (int64_t h = 0; h < c->num_heads; h++) {
            float *x = s->q + (r * c->num_heads + h) * hd; /* (head_dim) */
            kv_rmsnorm(x, a->q_norm, hd, eps, true, x);
        }
        for (int64_t h = 0; h < c->num_kv_heads; h++) {
            float *x = s->kn + (r * c->num_kv_heads + h) * hd; /* (head_dim) */
            kv_rmsnorm(x, a->k_norm, hd, eps, true, x);
        }
    }
}

typedef struct {
    KvRefState *s;
    int64_t n;
    const float *inv_freq; /* (head_dim / 2) the layer's: gemma3's sliding layers have their own */
    float scale;           /* on cos and sin: YaRN's attention factor, else 1 */
} ArgsRope;

static void op_rope(const void *ap) {
    const ArgsRope *a = ap;
    KvRefState *s = a->s;
    const KvConfig *c = &s->model->config;
    const int64_t hd = c->head_dim;
    const int64_t q_dim = c->num_heads * hd;
    const int64_t kv_dim = c->num_kv_heads * hd;
    for (int64_t r = 0; r < s->batch * a->n; r++) {
        for (int64_t h = 0; h < c->num_heads; h++) {
            kv_rope_apply_scaled(s->q + r * q_dim + h * hd, hd, a->inv_freq, s->qpos[r], a->scale);
        }
        for (int64_t h = 0; h < c->num_kv_heads; h++) {
            kv_rope_apply_scaled(s->kn + r * kv_dim + h * hd, hd, a->inv_freq, s->qpos[r],
                                 a->scale);
        }
    }
}

typedef struct {
    float *x;       /* (count) */
    const float *y; /* (count) */
    int64_t count;
} ArgsAdd;

static void op_add(const void *ap) {
    const ArgsAdd *a = ap;
    for (int64_t i = 0; i < a->count; i++) a->x[i] = a->x[i] + a->y[i];
}

typedef struct {
    float *gate;     /* (count) in: gate projection, out: act(gate) * up */
    const float *up; /* (count) */
    int64_t count;
    bool gelu;       /* gemma2/3 GeGLU (tanh gelu); else SwiGLU (silu) */
} ArgsGlu;

/* A transcendental (tanh, exp) costs about as much as this many
 * multiply-adds: elementwise loops weigh their work by it against the
 * parallel threshold. */
#define KV_TRANSCENDENTAL_WORK 128

static void op_glu(const void *ap) {
    const ArgsGlu *a = ap;
    /* Elementwise: no reduction, so threads cannot change any bit. */
#pragma omp parallel for schedule(static) \
    if (a->count * KV_TRANSCENDENTAL_WORK >= kv_parallel_min_work())
    for (int64_t i = 0; i < a->count; i++) {
        const float act = a->gelu ? kv_gelu_tanh(a->gate[i]) : kv_silu(a->gate[i]);
        a->gate[i] = act * a->up[i];
    }
}

/* Final norm of each sequence's last token, lm_head, final softcap. */
/* The lm_head over rows of last (rows, hidden) into logits (rows, vocab),
 * then the final softcap. */
static void final_logits(const KvRefState *s, const float *last, int64_t rows, float *logits) {
    const KvModel *m = s->model;
    const KvConfig *c = &m->config;
    kv_ref_matmul(matmul_hook(s), last, m->lm_head, rows, c->hidden_size, c->vocab_size, logits);
    if (c->final_logit_softcapping > 0.0) {
        const float cap = (float)c->final_logit_softcapping;
        const int64_t count = rows * c->vocab_size;
#pragma omp parallel for schedule(static) \
    if (count * KV_TRANSCENDENTAL_WORK >= kv_parallel_min_work())
        for (int64_t i = 0; i < count; i++) {
            logits[i] = kv_softcap(logits[i], cap);
        }
    }
}

static void op_final(const void *ap) {
    const ArgsStepN *a = ap;
    KvRefState *s = a->s;
    const KvModel *m = s->model;
    const KvConfig *c = &m->config;
    const int64_t hidden = c->hidden_size;
    for (int64_t b = 0; b < s->batch; b++) {
        /* The last token that took a slot; a sequence of only trailing pads
         * keeps its last one (and so its logits). */
        if (s->n_new[b] < 1) continue;
        kv_rmsnorm(s->x + (b * a->n + s->n_new[b] - 1) * hidden, m->final_norm, hidden,
                   (float)c->rms_norm_eps, kv_config_gemma_style(c), s->last + b * hidden);
    }
    final_logits(s, s->last, s->batch, s->logits);
}

void kv_ref_final_row(const KvRefState *s, const float *x, float *last, float *logits) {
    const KvModel *m = s->model;
    const KvConfig *c = &m->config;
    kv_rmsnorm(x, m->final_norm, c->hidden_size, (float)c->rms_norm_eps,
               kv_config_gemma_style(c), last);
    final_logits(s, last, 1, logits);
}

/* Greedy argmax into the next step's input (ties to the lowest id), then
 * the count advances by n: the last op of a captured decode step. */
static void op_argmax_advance(const void *ap) {
    const ArgsStepN *a = ap;
    KvRefState *s = a->s;
    const int64_t vocab = s->model->config.vocab_size;
    for (int64_t b = 0; b < s->batch; b++) {
        s->next_tok[b] = kv_argmax(s->logits + b * vocab, vocab, &s->margin[b]);
        s->tok_in[b] = s->next_tok[b]; /* the next step's (B, 1) input */
        s->real_in[b] = 1;
        s->lag[b] += a->n - s->n_new[b]; /* trailing pads take no slot */
    }
    s->total_mem += a->n;
}

/* ---- one forward of n tokens as a list of ops ---- */

static void launch_layer(KvRefState *s, int64_t layer, int64_t n) {
    const KvModel *m = s->model;
    const KvConfig *c = &m->config;
    const KvLayerWeights *w = &m->layers[layer];
    const int64_t rows = s->batch * n;
    const int64_t hd = c->head_dim;
    const int64_t kv_dim = c->num_kv_heads * hd;
    const int64_t q_dim = c->num_heads * hd;
    const int64_t hidden = c->hidden_size;
    const int64_t inter = c->intermediate_size;
    const int64_t f = (int64_t)sizeof(float);
    const bool gemma = kv_config_gemma_style(c);
    const KvMatmulFn mm = matmul_hook(s);
    const uint8_t *skip = pad_skip_mask(s, n); /* (rows) or NULL */
    KvStream *st = &s->stream;

    /* attention block: norm, q/k/v (+ bias, + qk norm), RoPE */
    ArgsNorm norm_in = {c, s->x, w->input_norm, s->xn, rows};
    kv_stream_launch(st, op_norm_rows, &norm_in, sizeof norm_in);
    ArgsMatmul qkv = {s->xn, {w->wq, w->wk, w->wv}, {s->q, s->kn, s->vn},
                      {q_dim, kv_dim, kv_dim}, rows, hidden, 3, mm, skip, n};
    kv_stream_launch(st, op_matmul, &qkv, sizeof qkv);
    if (c->attn_qkv_bias) {
        const ArgsBias bias[3] = {{s->q, w->bq, rows, q_dim},
                                  {s->kn, w->bk, rows, kv_dim},
                                  {s->vn, w->bv, rows, kv_dim}};
        for (int j = 0; j < 3; j++) kv_stream_launch(st, op_bias_rows, &bias[j], sizeof bias[j]);
    }
    if (c->qk_norm) {
        const ArgsQkNorm qk = {s, n, w->q_norm, w->k_norm};
        kv_stream_launch(st, op_qk_norm, &qk, sizeof qk);
    }
    ArgsRope rope = {s, n, kv_ref_layer_inv_freq(s, layer), s->rope_scale};
    kv_stream_launch(st, op_rope, &rope, sizeof rope);
    launch_observe(s, layer, KV_POINT_Q, s->q, n * q_dim * f);
    launch_observe(s, layer, KV_POINT_K, s->kn, n * kv_dim * f);
    launch_observe(s, layer, KV_POINT_V, s->vn, n * kv_dim * f);

    /* the cache store and attention: the static cache's, or a hook's */
    const KvRefHooks *hk = s->hooks;
    if (hk == NULL || hk->launch_attention == NULL || !hk->launch_attention(hk->ctx, s, layer, n)) {
        kv_ref_launch_static_attention(s, layer, n);
    }
    launch_observe(s, layer, KV_POINT_CACHE, NULL, 0);
    launch_observe(s, layer, KV_POINT_ATTN, s->att, n * q_dim * f);

    /* output projection and residual */
    ArgsMatmul mo = {s->att, {w->wo}, {s->tmp}, {hidden}, rows, q_dim, 1, mm, skip, n};
    kv_stream_launch(st, op_matmul, &mo, sizeof mo);
    if (c->attn_o_bias) {
        const ArgsBias bo = {s->tmp, w->bo, rows, hidden};
        kv_stream_launch(st, op_bias_rows, &bo, sizeof bo);
    }
    ArgsAdd add = {s->x, s->tmp, rows * hidden};
    if (gemma) {
        /* h = x + post_attention_layernorm(attn(...)) */
        ArgsNorm post = {c, s->tmp, w->post_attn_norm, s->tmp, rows};
        kv_stream_launch(st, op_norm_rows, &post, sizeof post);
        kv_stream_launch(st, op_add, &add, sizeof add);
        ArgsNorm pre = {c, s->x, w->pre_ffw_norm, s->xn, rows};
        kv_stream_launch(st, op_norm_rows, &pre, sizeof pre);
    } else {
        kv_stream_launch(st, op_add, &add, sizeof add);
        ArgsNorm post = {c, s->x, w->post_attn_norm, s->xn, rows};
        kv_stream_launch(st, op_norm_rows, &post, sizeof post);
    }

    /* MLP: gpt_oss's experts, or a gated MLP */
    if (c->num_experts > 0) {
        kv_ref_launch_moe(s, w, rows, mm);
    } else {
        ArgsMatmul gu = {s->xn, {w->w_gate, w->w_up}, {s->gate, s->up}, {inter, inter},
                         rows, hidden, 2, mm, skip, n};
        kv_stream_launch(st, op_matmul, &gu, sizeof gu);
        ArgsGlu glu = {s->gate, s->up, rows * inter, gemma};
        kv_stream_launch(st, op_glu, &glu, sizeof glu);
        ArgsMatmul md = {s->gate, {w->w_down}, {s->tmp}, {hidden}, rows, inter, 1, mm, skip, n};
        kv_stream_launch(st, op_matmul, &md, sizeof md);
    }
    if (gemma) {
        ArgsNorm post = {c, s->tmp, w->post_ffw_norm, s->tmp, rows};
        kv_stream_launch(st, op_norm_rows, &post, sizeof post);
    }
    launch_observe(s, layer, KV_POINT_MLP, s->tmp, n * hidden * f);
    kv_stream_launch(st, op_add, &add, sizeof add);
    launch_observe(s, layer, KV_POINT_RESIDUAL, s->x, n * hidden * f);
}

void kv_ref_launch_forward(KvRefState *s, int64_t n) {
    const KvConfig *c = &s->model->config;
    const int64_t f = (int64_t)sizeof(float);
    const KvRefHooks *hk = s->hooks;
    ArgsStepN sn = {s, n};
    if (hk == NULL || hk->launch_positions == NULL || !hk->launch_positions(hk->ctx, s, n)) {
        kv_stream_launch(&s->stream, op_positions, &sn, sizeof sn);
    }
    kv_stream_launch(&s->stream, op_embed, &sn, sizeof sn);
    launch_observe(s, -1, KV_POINT_EMBED, s->x, n * c->hidden_size * f);
    for (int64_t l = 0; l < c->num_layers; l++) launch_layer(s, l, n);
    kv_stream_launch(&s->stream, op_final, &sn, sizeof sn);
    launch_observe(s, -1, KV_POINT_FINAL_NORM, s->last, c->hidden_size * f);
    launch_observe(s, -1, KV_POINT_LOGITS, s->logits, c->vocab_size * f);
    kv_stream_launch(&s->stream, op_argmax_advance, &sn, sizeof sn);
}

KvStatus kv_ref_check_input(const KvRefState *s, const int32_t *tokens, const uint8_t *real,
                            int64_t n, KvError *err) {
    const KvConfig *c = &s->model->config;
    if (n < 1 || n > s->max_chunk || s->len + n > s->max_len) {
        return kv_error_set(err, KV_ERR_INPUT,
                            "reference forward: %lld new tokens at slot %lld exceed the state "
                            "(max_chunk %lld, max_len %lld)",
                            (long long)n, (long long)s->len, (long long)s->max_chunk,
                            (long long)s->max_len);
    }
    for (int64_t b = 0; b < s->batch; b++) {
        bool seen_real = s->n_real[b] > 0;
        bool trailing = false; /* a trailing pad seen in this forward */
        for (int64_t t = 0; t < n; t++) {
            const int32_t tok = tokens[b * n + t];
            if (tok < 0 || tok >= c->vocab_size) {
                return kv_error_set(err, KV_ERR_INPUT,
                                    "tokens: row %lld position %lld: expected a token id in "
                                    "[0, %lld), found %d",
                                    (long long)b, (long long)(s->len + t),
                                    (long long)c->vocab_size, tok);
            }
            if (real[b * n + t]) {
                if (trailing) {
                    return kv_error_set(err, KV_ERR_INPUT,
                                        "tokens: row %lld column %lld: a real token after a "
                                        "trailing pad in one forward (a right-padded row ends "
                                        "its forward in pads)",
                                        (long long)b, (long long)(s->len + t));
                }
                seen_real = true;
            } else if (seen_real && s->trailing_pads) {
                trailing = true;
            } else if (seen_real) {
                return kv_error_set(err, KV_ERR_INPUT,
                                    "tokens: row %lld position %lld: a pad after a real token "
                                    "(batches must be left-padded; right padding needs "
                                    "per-row positions)",
                                    (long long)b, (long long)(s->len + t));
            }
        }
    }
    return KV_OK;
}

KvStatus kv_ref_forward(KvRefState *s, const int32_t *tokens, const uint8_t *real, int64_t n,
                        float *logits, KvError *err) {
    /* Validate everything before touching the state, so a bad call leaves
     * the cache as it was. */
    KvStatus st = kv_ref_check_input(s, tokens, real, n, err);
    if (st != KV_OK) return st;
    memcpy(s->tok_in, tokens, (size_t)(s->batch * n) * sizeof *tokens);
    memcpy(s->real_in, real, (size_t)(s->batch * n));
    kv_ref_launch_forward(s, n);
    s->len += n;
    if (logits != NULL) {
        memcpy(logits, s->logits, (size_t)(s->batch * s->model->config.vocab_size) * sizeof(float));
    }
    return KV_OK;
}
