/* cuda_validate_attn.cu: the per-op validation (cuda_validate.h) of the KV
 * cache's ops: the key gather and attention over the static layout (a
 * sliding and a full-attention layer, after the static store of the
 * chunk's new rows), and for each of the six cache
 * variants a schedule of updates from an empty cache (one-token and
 * multi-token, while filling, crossing the window, when full, a prefill
 * longer than the window), each step run as the forward runs it
 * (cuda_forward.cu: update then attend for a one-token fast path, else
 * attend over the cache plus the new keys, then update) and compared with
 * the CPU variant (candidates/cache_*.c) after the same step:
 *   - the cache's slots (K, V, realness) and positions, bitwise, every slot:
 *     a slot holding a position must match the CPU's bit for bit, an empty
 *     one must still hold NaN (the poison that makes a read of it visible);
 *   - the host regime and the attended length, exactly;
 *   - the gather: each query's key codes (cache slot, or new token
 *     -(u + 1)) in ascending position, bitwise against the CPU's gather
 *     (reference/forward.c op_attn_variant's logic over the CPU view);
 *   - attention against kv_attend within the bound below, and bitwise
 *     against the first variant's output for the same step (on the GPU
 *     every variant is bitwise equal to every other, DESIGN §2). */
#include "cuda_validate_internal.cuh"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "cache.h"
#include "kvmath.h"
#include "prng.h"
}

/* ---- the attention bound ----
 * For one output element d of one query head over nk keys, with A = max_j
 * scale * sum_d |q_d| |k_jd| (what bounds every score) and P_d = sum_j p_j
 * |v_jd| (p the CPU's softmax):
 *   - scores: the dot of length hd in two orders (device: ascending d;
 *     CPU: 16 lanes and a tree) differs by 2 hd u A; the scale, the
 *     softcap's divide, tanhf (KV_VAL_LIBM_U) and multiply, and s - max add
 *     at most 32u A more: E_s = (2 hd + KV_VAL_ATTN_SCORE_SLACK) u A;
 *   - softmax: a score error moves p_j by at most 2 E_s relative (its own
 *     and the normaliser's); expf differs by 8u per term; the sum of the nk
 *     positive terms in two orders (device: strided partials and a tree;
 *     CPU: ascending) by 2 nk u; the division by 2u;
 *   - output: sum_j p_j v_jd accumulates in ascending j on both sides, so
 *     its roundings differ only through p: 2 nk u P_d more.
 *   |gpu - cpu| <= KV_VAL_ATTN_SAFETY (2 E_s + (4 nk + KV_VAL_ATTN_SUM_SLACK) u) P_d,
 * the safety factor covering the second-order terms. A wrong key, head,
 * position or window moves an output by O(|v|), far above it. */
#define KV_VAL_ATTN_SCORE_SLACK 32.0
#define KV_VAL_ATTN_SUM_SLACK 16.0
#define KV_VAL_ATTN_SAFETY 2.0

/* One query row's visible keys for the CPU, in ascending position. */
typedef struct {
    const float **k; /* (max_keys) -> (kv_dim) key rows */
    const float **v; /* (max_keys) -> (kv_dim) value rows */
    int32_t *code;   /* (max_keys) the GPU's gather code: a slot >= 0, or new token -(u + 1) */
    int64_t *pos;    /* (max_keys) the key's position */
    int64_t n;
} ValKeys;

/* Attention outputs (guarded), their host copies and the CPU's scratch. */
typedef struct {
    KvValBuf gidx;        /* (B * max_chunk, max_keys) int32 */
    KvValBuf nkeys;       /* (B * max_chunk) int32 */
    KvValBuf att;         /* (B * max_chunk, q_dim) */
    int32_t *gidx_got;    /* (B * max_chunk, max_keys) */
    int32_t *nk_got;      /* (B * max_chunk) */
    float *att_got;       /* (B * max_chunk, q_dim) */
    float *att_want;      /* (B * max_chunk, q_dim) */
    float *att_bound;     /* (B * max_chunk, q_dim) */
    float *q;             /* (B * max_chunk, q_dim) the queries */
    ValKeys keys;
    float *scores;        /* (max_keys) kv_attend's scratch */
    float *probs;         /* (max_keys) */
    const float **hk;     /* (max_keys) one head's key rows */
    const float **hv;     /* (max_keys) */
} ValAttn;

static KvStatus val_oom(KvError *err) {
    return kv_error_set(err, KV_ERR_INTERNAL, "cuda validate: out of host memory");
}

static void val_op_finish(KvValRun *v, KvCudaValidateOp *op, KvStatus st, const KvError *err) {
    if (op == NULL) return;
    if (st != KV_OK) kv_val_fail(op, "%s: stopped: %s", op->op, err->msg);
    kv_val_op_end(v, op);
}

static void val_attn_free(ValAttn *a) {
    kv_val_buf_free(&a->gidx);
    kv_val_buf_free(&a->nkeys);
    kv_val_buf_free(&a->att);
    free(a->gidx_got);
    free(a->nk_got);
    free(a->att_got);
    free(a->att_want);
    free(a->att_bound);
    free(a->q);
    free(a->keys.k);
    free(a->keys.v);
    free(a->keys.code);
    free(a->keys.pos);
    free(a->scores);
    free(a->probs);
    free(a->hk);
    free(a->hv);
    memset(a, 0, sizeof *a);
}

static KvStatus val_attn_alloc(KvValRun *v, ValAttn *a, KvError *err) {
    KvStatus st = KV_OK;
    const KvCudaCtx *ctx = v->ctx;
    const int64_t rows = ctx->B * ctx->max_chunk, mk = ctx->max_keys, qd = ctx->q_dim;
    memset(a, 0, sizeof *a);
    a->gidx_got = (int32_t *)kv_val_alloc(rows * mk, sizeof(int32_t));
    a->nk_got = (int32_t *)kv_val_alloc(rows, sizeof(int32_t));
    a->att_got = (float *)kv_val_alloc(rows * qd, sizeof(float));
    a->att_want = (float *)kv_val_alloc(rows * qd, sizeof(float));
    a->att_bound = (float *)kv_val_alloc(rows * qd, sizeof(float));
    a->q = (float *)kv_val_alloc(rows * qd, sizeof(float));
    a->keys.k = (const float **)kv_val_alloc(mk, sizeof(float *));
    a->keys.v = (const float **)kv_val_alloc(mk, sizeof(float *));
    a->keys.code = (int32_t *)kv_val_alloc(mk, sizeof(int32_t));
    a->keys.pos = (int64_t *)kv_val_alloc(mk, sizeof(int64_t));
    a->scores = (float *)kv_val_alloc(mk, sizeof(float));
    a->probs = (float *)kv_val_alloc(mk, sizeof(float));
    a->hk = (const float **)kv_val_alloc(mk, sizeof(float *));
    a->hv = (const float **)kv_val_alloc(mk, sizeof(float *));
    if (a->gidx_got == NULL || a->nk_got == NULL || a->att_got == NULL || a->att_want == NULL ||
        a->att_bound == NULL || a->q == NULL || a->keys.k == NULL || a->keys.v == NULL ||
        a->keys.code == NULL || a->keys.pos == NULL || a->scores == NULL || a->probs == NULL ||
        a->hk == NULL || a->hv == NULL) {
        st = val_oom(err);
        goto cleanup;
    }
    KV_TRY(kv_val_buf_alloc(v, &a->gidx, "gidx (B*n, max_keys)",
                            (size_t)(rows * mk) * sizeof(int32_t), KV_VAL_POISON_BYTE, err));
    KV_TRY(kv_val_buf_alloc(v, &a->nkeys, "nkeys (B*n)", (size_t)rows * sizeof(int32_t),
                            KV_VAL_POISON_BYTE, err));
    KV_TRY(kv_val_buf_alloc(v, &a->att, "att (B*n, q_dim)", (size_t)(rows * qd) * sizeof(float),
                            KV_VAL_POISON_BYTE, err));
cleanup:
    return st;
}

/* Before a gather: the outputs' bodies back to the poison (a value left by
 * the previous case must not pass for this one's), the context pointed at
 * them, this case's queries drawn and uploaded into the context's q. */
static KvStatus val_attn_arm(KvValRun *v, ValAttn *a, int64_t n, const char *stream,
                             KvError *err) {
    KvStatus st = KV_OK;
    KvCudaCtx *ctx = v->ctx;
    const int64_t rows = ctx->B * n;
    KV_CUDA_CHECK(cudaMemsetAsync(a->gidx.p, KV_VAL_POISON_BYTE, a->gidx.bytes, ctx->stream));
    KV_CUDA_CHECK(cudaMemsetAsync(a->nkeys.p, KV_VAL_POISON_BYTE, a->nkeys.bytes, ctx->stream));
    KV_CUDA_CHECK(cudaMemsetAsync(a->att.p, KV_VAL_POISON_BYTE, a->att.bytes, ctx->stream));
    ctx->gidx = (int32_t *)a->gidx.p;
    ctx->nkeys = (int32_t *)a->nkeys.p;
    ctx->att = (float *)a->att.p;
    kv_val_fill(v, a->q, rows * ctx->q_dim, -1.0f, 1.0f, stream);
    KV_TRY(kv_val_upload(v, ctx->q, a->q, (size_t)(rows * ctx->q_dim) * sizeof(float), err));
cleanup:
    return st;
}

static KvStatus val_attn_download(KvValRun *v, ValAttn *a, int64_t n, KvError *err) {
    KvStatus st = KV_OK;
    const KvCudaCtx *ctx = v->ctx;
    const int64_t rows = ctx->B * n;
    KV_TRY(kv_val_download(v, a->nk_got, a->nkeys.p, (size_t)rows * sizeof(int32_t), err));
    KV_TRY(kv_val_download(v, a->gidx_got, a->gidx.p,
                           (size_t)(rows * ctx->max_keys) * sizeof(int32_t), err));
    KV_TRY(kv_val_download(v, a->att_got, a->att.p, (size_t)(rows * ctx->q_dim) * sizeof(float),
                           err));
cleanup:
    return st;
}

/* Row r's gather (a->keys, collected by the caller) against the GPU's, and
 * the CPU's attention of that row with each element's bound into
 * att_want/att_bound. */
static void val_attn_row(KvValRun *v, ValAttn *a, KvCudaValidateOp *gat, const char *where,
                         int64_t r, int64_t n, int64_t len) {
    const KvCudaCtx *ctx = v->ctx;
    const KvConfig *c = &v->m->config;
    const int64_t hd = ctx->hd, qd = ctx->q_dim, nk = a->keys.n;
    const float scale = kv_config_attn_scale(c);
    const float cap = (float)c->attn_logit_softcapping;
    const float *q = a->q + r * qd; /* (q_dim) */
    const long long b = (long long)(r / n), qs = (long long)(len + r % n);

    gat->compared += 1 + nk;
    if ((int64_t)a->nk_got[r] != nk) {
        kv_val_fail(gat, "%s: %s: query row %lld (batch row %lld, position %lld): the gpu gathered "
                         "%d keys, the cpu %lld",
                    gat->op, where, (long long)r, b, qs, a->nk_got[r], (long long)nk);
    }
    for (int64_t j = 0; j < nk && (int64_t)a->nk_got[r] == nk; j++) {
        const int32_t g = a->gidx_got[r * ctx->max_keys + j];
        if (g != a->keys.code[j]) {
            kv_val_fail(gat, "%s: %s: query row %lld (batch row %lld, position %lld): key %lld "
                             "(position %lld): gpu code %d, cpu code %d (>= 0 a slot, < 0 new "
                             "token -(u+1))",
                        gat->op, where, (long long)r, b, qs, (long long)j,
                        (long long)a->keys.pos[j], g, a->keys.code[j]);
            break;
        }
    }

    for (int64_t h = 0; h < ctx->n_heads; h++) {
        const int64_t kvh = kv_gqa_kv_head(h, ctx->n_heads, ctx->n_kv_heads);
        double amax = 0.0;
        for (int64_t j = 0; j < nk; j++) {
            a->hk[j] = a->keys.k[j] + kvh * hd;
            a->hv[j] = a->keys.v[j] + kvh * hd;
            double mag = 0.0;
            for (int64_t d = 0; d < hd; d++) mag += fabs((double)q[h * hd + d] * (double)a->hk[j][d]);
            mag *= (double)scale;
            if (mag > amax) amax = mag;
            a->probs[j] = kv_softcap(kv_dot(q + h * hd, a->hk[j], hd) * scale, cap);
        }
        kv_attend(q + h * hd, a->hk, a->hv, nk, hd, scale, cap, a->scores,
                  a->att_want + r * qd + h * hd);
        kv_softmax(a->probs, nk);
        const double es = (2.0 * (double)hd + KV_VAL_ATTN_SCORE_SLACK) * KV_VAL_U * amax;
        const double rel = 2.0 * es + (4.0 * (double)nk + KV_VAL_ATTN_SUM_SLACK) * KV_VAL_U;
        for (int64_t d = 0; d < hd; d++) {
            double p = 0.0;
            for (int64_t j = 0; j < nk; j++) p += (double)a->probs[j] * fabs((double)a->hv[j][d]);
            a->att_bound[r * qd + h * hd + d] = (float)(KV_VAL_ATTN_SAFETY * rel * p) + KV_VAL_TINY;
        }
    }
}

/* Sorts the row's keys by position (distinct): the canonical key order. */
static void val_keys_sort(ValKeys *k) {
    for (int64_t i = 1; i < k->n; i++) {
        const float *ki = k->k[i], *vi = k->v[i];
        const int32_t ci = k->code[i];
        const int64_t pi = k->pos[i];
        int64_t j = i - 1;
        for (; j >= 0 && k->pos[j] > pi; j--) {
            k->k[j + 1] = k->k[j];
            k->v[j + 1] = k->v[j];
            k->code[j + 1] = k->code[j];
            k->pos[j + 1] = k->pos[j];
        }
        k->k[j + 1] = ki;
        k->v[j + 1] = vi;
        k->code[j + 1] = ci;
        k->pos[j + 1] = pi;
    }
}

static void val_keys_add(ValKeys *k, const float *krow, const float *vrow, int32_t code,
                         int64_t pos) {
    k->k[k->n] = krow;
    k->v[k->n] = vrow;
    k->code[k->n] = code;
    k->pos[k->n] = pos;
    k->n++;
}

/* ---- the static layout ---- */

/* The static layout's buffers: the layer's cache and the slots' realness
 * (guarded, the context pointed at them), and their host copies. */
typedef struct {
    int64_t layer, window;
    KvValBuf real;        /* (B, max_len) */
    KvValBuf kc, vc;      /* (B, max_len, kv_dim) the layer's static K and V */
    uint8_t *real_h;      /* (B, max_len) */
    float *kc_h, *vc_h;   /* (B, max_len, kv_dim) the cache as the store must leave it */
    float *kn_h, *vn_h;   /* (B, max_chunk, kv_dim) the chunk's new rows */
    float *got;           /* (B, max_len, kv_dim) a cache read back */
    KvCudaValidateOp *store, *gat, *att;
} ValStatic;

/* One case, as the forward runs a full or reference-layout layer: n new
 * tokens at positions len.. are stored (kv_cuda_store_static) into a cache
 * holding positions 0 .. len - 1 (the rest NaN, as after a reset), then
 * gathered and attended. Left-padded rows; realness set as
 * kv_cuda_positions leaves it. */
static KvStatus val_static_case(KvValRun *v, ValAttn *a, ValStatic *s, int64_t len, int64_t n,
                                KvError *err) {
    KvStatus st = KV_OK;
    KvCudaCtx *ctx = v->ctx;
    const int64_t B = ctx->B, L = ctx->max_len, D = ctx->kv_dim, qd = ctx->q_dim;
    const int64_t stored = len + n;
    const size_t fbytes = (size_t)(B * L * D) * sizeof(float);
    char where[96], stream[64], kstream[64];
    snprintf(where, sizeof where, "%lld queries at positions %lld..%lld", (long long)n,
             (long long)len, (long long)(stored - 1));
    snprintf(stream, sizeof stream, "validate.static.l%lld.%lld.%lld.q", (long long)s->layer,
             (long long)len, (long long)n);
    snprintf(kstream, sizeof kstream, "validate.static.l%lld.%lld.%lld.kn", (long long)s->layer,
             (long long)len, (long long)n);
    kv_val_fill(v, s->kc_h, B * L * D, -1.0f, 1.0f, "validate.static.k");
    kv_val_fill(v, s->vc_h, B * L * D, -1.0f, 1.0f, "validate.static.v");
    for (int64_t b = 0; b < B; b++) {
        for (int64_t p = 0; p < L; p++) {
            s->real_h[b * L + p] = p < stored && kv_val_real(v, b, p) ? 1 : 0;
            if (p < len) continue;
            for (int64_t d = 0; d < D; d++) {
                s->kc_h[(b * L + p) * D + d] = NAN;
                s->vc_h[(b * L + p) * D + d] = NAN;
            }
        }
    }
    KV_TRY(kv_val_upload(v, s->real.p, s->real_h, (size_t)(B * L), err));
    KV_TRY(kv_val_upload(v, s->kc.p, s->kc_h, fbytes, err));
    KV_TRY(kv_val_upload(v, s->vc.p, s->vc_h, fbytes, err));
    /* The new rows, pads included (their slots are never visible). */
    kv_val_fill(v, s->kn_h, B * n * D, -1.0f, 1.0f, kstream);
    kv_val_fill(v, s->vn_h, B * n * D, -1.0f, 1.0f, "validate.static.vn");
    KV_TRY(kv_val_upload(v, ctx->kn, s->kn_h, (size_t)(B * n * D) * sizeof(float), err));
    KV_TRY(kv_val_upload(v, ctx->vn, s->vn_h, (size_t)(B * n * D) * sizeof(float), err));
    KV_TRY(val_attn_arm(v, a, n, stream, err));
    ctx->real = (uint8_t *)s->real.p;
    ctx->kc[s->layer] = (float *)s->kc.p;
    ctx->vc[s->layer] = (float *)s->vc.p;
    KV_TRY(kv_val_set_total(v, len, err));

    KV_TRY(kv_cuda_store_static(ctx, s->layer, n, err));
    KV_TRY(kv_cuda_gather_static(ctx, s->layer, n, err));
    KV_TRY(kv_cuda_attend(ctx, s->layer, n, ctx->kc[s->layer], ctx->vc[s->layer], L, err));

    KV_TRY(kv_val_dev_err(v, s->gat, where, err));
    /* op_store_static: row t of the chunk at slot len + t; nothing else. */
    for (int64_t b = 0; b < B; b++) {
        for (int64_t t = 0; t < n; t++) {
            memcpy(s->kc_h + (b * L + len + t) * D, s->kn_h + (b * n + t) * D,
                   (size_t)D * sizeof(float));
            memcpy(s->vc_h + (b * L + len + t) * D, s->vn_h + (b * n + t) * D,
                   (size_t)D * sizeof(float));
        }
    }
    KV_TRY(kv_val_download(v, s->got, s->kc.p, fbytes, err));
    kv_val_check_bits(s->store, "k cache (B, max_len, kv_dim)", where, s->got, s->kc_h, B * L * D,
                      D);
    KV_TRY(kv_val_download(v, s->got, s->vc.p, fbytes, err));
    kv_val_check_bits(s->store, "v cache (B, max_len, kv_dim)", where, s->got, s->vc_h, B * L * D,
                      D);
    KV_TRY(val_attn_download(v, a, n, err));
    /* op_attn_static's gather over the stored cache: the real slots k <= qs
     * in the window, in slot (= position) order; a pad query sees nothing. */
    for (int64_t r = 0; r < B * n; r++) {
        const int64_t b = r / n, qs = len + r % n;
        a->keys.n = 0;
        for (int64_t k = 0; s->real_h[b * L + qs] && k <= qs; k++) {
            if (!s->real_h[b * L + k] || !kv_window_visible(qs, k, s->window)) continue;
            val_keys_add(&a->keys, s->kc_h + (b * L + k) * D, s->vc_h + (b * L + k) * D,
                         (int32_t)k, k);
        }
        val_attn_row(v, a, s->gat, where, r, n, len);
    }
    kv_val_check_floats(s->att, "att (B*n, q_dim)", where, a->att_got, a->att_want, a->att_bound,
                        B * n * qd, qd);
cleanup:
    return st;
}

KvStatus kv_val_attn_static(KvValRun *v, int64_t layer, KvError *err) {
    KvStatus st = KV_OK;
    KvCudaCtx *ctx = v->ctx;
    const KvCudaCtx saved = *ctx;
    /* The context's own cache of the layer: an element of its kc/vc arrays,
     * which the struct copy above does not cover. */
    float *const saved_kc = ctx->kc[layer], *const saved_vc = ctx->vc[layer];
    const int64_t B = ctx->B, L = ctx->max_len, D = ctx->kv_dim, n = ctx->max_chunk;
    const size_t fbytes = (size_t)(B * L * D) * sizeof(float);
    ValAttn a;
    ValStatic s;
    char name[48], wtext[24];
    memset(&a, 0, sizeof a);
    memset(&s, 0, sizeof s);
    s.layer = layer;
    s.window = kv_config_layer_window(&v->m->config, layer);
    if (s.window > 0) {
        snprintf(wtext, sizeof wtext, "W=%lld", (long long)s.window);
    } else {
        snprintf(wtext, sizeof wtext, "full");
    }
    snprintf(name, sizeof name, "store[static %s]", wtext);
    KV_TRY(kv_val_op_begin(v, name, NULL, true, &s.store, err));
    snprintf(name, sizeof name, "gather[static %s]", wtext);
    KV_TRY(kv_val_op_begin(v, name, NULL, true, &s.gat, err));
    snprintf(name, sizeof name, "attention[static %s]", wtext);
    KV_TRY(kv_val_op_begin(v, name, "2(2E_s+(4nk+16)u)sum p|v|", false, &s.att, err));
    kv_val_op_shape(s.store, "layer %lld, (%lld, %lld, %lld), n 1/%lld", (long long)layer,
                    (long long)B, (long long)L, (long long)D, (long long)n);
    kv_val_op_shape(s.gat, "layer %lld, B %lld, n 1/%lld, max_len %lld", (long long)layer,
                    (long long)B, (long long)n, (long long)L);
    kv_val_op_shape(s.att, "layer %lld, heads %lld/%lld x %lld, keys <= %lld", (long long)layer,
                    (long long)ctx->n_heads, (long long)ctx->n_kv_heads, (long long)ctx->hd,
                    (long long)L);
    s.real_h = (uint8_t *)kv_val_alloc(B * L, 1);
    s.kc_h = (float *)kv_val_alloc(B * L * D, sizeof(float));
    s.vc_h = (float *)kv_val_alloc(B * L * D, sizeof(float));
    s.kn_h = (float *)kv_val_alloc(B * n * D, sizeof(float));
    s.vn_h = (float *)kv_val_alloc(B * n * D, sizeof(float));
    s.got = (float *)kv_val_alloc(B * L * D, sizeof(float));
    if (s.real_h == NULL || s.kc_h == NULL || s.vc_h == NULL || s.kn_h == NULL ||
        s.vn_h == NULL || s.got == NULL) {
        st = val_oom(err);
        goto cleanup;
    }
    KV_TRY(val_attn_alloc(v, &a, err));
    KV_TRY(kv_val_buf_alloc(v, &s.real, "real (B, max_len)", (size_t)(B * L), 0, err));
    KV_TRY(kv_val_buf_alloc(v, &s.kc, "k cache (B, max_len, kv_dim)", fbytes, KV_VAL_POISON_BYTE,
                            err));
    KV_TRY(kv_val_buf_alloc(v, &s.vc, "v cache (B, max_len, kv_dim)", fbytes, KV_VAL_POISON_BYTE,
                            err));
    /* A decode step into the last slot (a full layer gathers every slot:
     * two block-scan chunks), a chunk while the window fills, the first
     * token. */
    KV_TRY(val_static_case(v, &a, &s, L - 1, 1, err));
    KV_TRY(val_static_case(v, &a, &s, s.window > 0 ? s.window / 2 : 3, n, err));
    KV_TRY(val_static_case(v, &a, &s, 0, 1, err));
    KV_TRY(kv_val_buf_check(v, s.store, &s.kc, err));
    KV_TRY(kv_val_buf_check(v, s.store, &s.vc, err));
    KV_TRY(kv_val_buf_check(v, s.gat, &s.real, err));
    KV_TRY(kv_val_buf_check(v, s.gat, &a.gidx, err));
    KV_TRY(kv_val_buf_check(v, s.gat, &a.nkeys, err));
    KV_TRY(kv_val_buf_check(v, s.att, &a.att, err));
    KV_TRY(kv_val_dev_err(v, s.att, "attention", err));
cleanup:
    ctx->kc[layer] = saved_kc;
    ctx->vc[layer] = saved_vc;
    *ctx = saved;
    val_op_finish(v, s.store, st, err);
    val_op_finish(v, s.gat, st, err);
    val_op_finish(v, s.att, st, err);
    val_attn_free(&a);
    kv_val_buf_free(&s.real);
    kv_val_buf_free(&s.kc);
    kv_val_buf_free(&s.vc);
    free(s.real_h);
    free(s.kc_h);
    free(s.vc_h);
    free(s.kn_h);
    free(s.vn_h);
    free(s.got);
    return st;
}

/* ---- the cache variants ---- */

/* What an update step is, for the coverage line. */
enum {
    VAL_ONE_FILLING = 0, /* one token, the window not yet full before it */
    VAL_ONE_FULL,        /* one token into a full window */
    VAL_MULTI_FILLING,   /* n > 1 tokens that fit in the window */
    VAL_MULTI_CROSSING,  /* n > 1 tokens that fill the window and slide it */
    VAL_MULTI_FULL,      /* n > 1 tokens into a full window */
    VAL_MULTI_OVER_W,    /* a prefill longer than the window */
    VAL_N_CASES
};
static const char *const k_val_case_names[VAL_N_CASES] = {"1/filling", "1/full", "n/filling",
                                                          "n/crossing", "n/full", "n>W"};

static int val_case(int64_t n, int64_t len, int64_t W) {
    if (n == 1) return len >= W ? VAL_ONE_FULL : VAL_ONE_FILLING;
    if (n > W) return VAL_MULTI_OVER_W;
    if (len + n <= W) return VAL_MULTI_FILLING;
    return len >= W ? VAL_MULTI_FULL : VAL_MULTI_CROSSING;
}

/* The update sizes every variant runs, from an empty cache; -1 empties
 * both caches again. Covers every case above: a 3-token prefill, one token
 * at a time up to W - 2, 4 tokens across W, one-token steps and a 3-token
 * chunk on a full window; then from empty a prefill of W + 5 and two more
 * steps. Returns the count (at most W + 16). */
static int val_schedule(int64_t W, int64_t *out /* (W + 16) */) {
    int k = 0;
    int64_t t = W >= 6 ? 3 : 1;
    out[k++] = t;
    for (; t < W - 2; t++) out[k++] = 1;
    out[k++] = 4;
    out[k++] = 1;
    out[k++] = 1;
    out[k++] = 3;
    out[k++] = 1;
    out[k++] = -1;
    out[k++] = W + 5;
    out[k++] = 1;
    out[k++] = 2;
    return k;
}

/* One variant's validation state. */
typedef struct {
    const KvCacheOps *ops;
    int64_t layer;
    KvCudaCache *c;       /* the context's cache of that layer, pointed at the guarded slots */
    KvSlidingCache *cpu;  /* the CPU variant's cache, fed the same steps */
    KvCudaValidateOp *upd, *gat, *att;
    KvValBuf slots[8];    /* cur k, v, real, pos; tmp k, v, real, pos (guarded) */
    KvValBuf indices;     /* (W) index_copy's gather indices */
    KvValBuf gtab;        /* (B * max_chunk, W + 1) the gather's position table */
    ValAttn a;
    float *kn;            /* (B, max_chunk, kv_dim) a step's new keys */
    float *vn;            /* (B, max_chunk, kv_dim) */
    uint8_t *real_in;     /* (B, max_chunk) */
    float *ck, *cv;       /* (B, S, kv_dim) the GPU cache read back */
    uint8_t *creal;       /* (B, S) */
    int64_t *cpos;        /* (S) */
    int64_t counts[VAL_N_CASES];
} ValVariant;

/* The GPU cache's slots against the CPU variant's state after the same
 * update. */
static KvStatus val_cache_compare(KvValRun *v, ValVariant *s, const char *where, KvError *err) {
    KvStatus st = KV_OK;
    const KvCudaCtx *ctx = v->ctx;
    const KvCacheState cs = s->ops->state(s->cpu);
    const int64_t B = ctx->B, S = s->c->slots, D = ctx->kv_dim;
    KvCudaValidateOp *op = s->upd;
    if (cs.batch != B || cs.slots != S || cs.dim != D) {
        kv_val_fail(op, "%s: %s: the gpu cache is (%lld, %lld, %lld), the cpu's (%lld, %lld, %lld)",
                    op->op, where, (long long)B, (long long)S, (long long)D, (long long)cs.batch,
                    (long long)cs.slots, (long long)cs.dim);
        return KV_OK;
    }
    KV_TRY(kv_val_download(v, s->ck, s->c->cur.k, (size_t)(B * S * D) * sizeof(float), err));
    KV_TRY(kv_val_download(v, s->cv, s->c->cur.v, (size_t)(B * S * D) * sizeof(float), err));
    KV_TRY(kv_val_download(v, s->creal, s->c->cur.real, (size_t)(B * S), err));
    KV_TRY(kv_val_download(v, s->cpos, s->c->cur.pos, (size_t)S * sizeof(int64_t), err));
    kv_val_check_ints(op, "pos (S)", where, s->cpos, cs.pos, S, sizeof(int64_t), S);
    kv_val_check_ints(op, "real (B, S)", where, s->creal, cs.real, B * S, 1, S);
    for (int64_t b = 0; b < B; b++) {
        for (int64_t i = 0; i < S; i++) {
            for (int kv = 0; kv < 2; kv++) {
                const float *g = (kv == 0 ? s->ck : s->cv) + (b * S + i) * D; /* (D) */
                const float *c = (kv == 0 ? cs.k : cs.v) + (b * S + i) * D;   /* (D) */
                op->compared += D;
                for (int64_t d = 0; d < D; d++) {
                    uint32_t gb, cb;
                    memcpy(&gb, &g[d], sizeof gb);
                    memcpy(&cb, &c[d], sizeof cb);
                    if (cs.pos[i] < 0 && !isnan(g[d])) {
                        kv_val_fail(op, "%s: %s: %s slot %lld of batch row %lld is empty (position "
                                        "-1) but element %lld holds %.9g: the NaN poison of empty "
                                        "slots is gone",
                                    op->op, where, kv == 0 ? "K" : "V", (long long)i,
                                    (long long)b, (long long)d, (double)g[d]);
                        return KV_OK;
                    }
                    if (cs.pos[i] >= 0 && (gb != cb || !isfinite(g[d]))) {
                        kv_val_fail(op, "%s: %s: %s slot %lld (position %lld) of batch row %lld, "
                                        "element %lld: gpu %.9g (0x%08x) != cpu %.9g (0x%08x)",
                                    op->op, where, kv == 0 ? "K" : "V", (long long)i,
                                    (long long)cs.pos[i], (long long)b, (long long)d, (double)g[d],
                                    gb, (double)c[d], cb);
                        return KV_OK;
                    }
                }
            }
        }
    }
cleanup:
    return st;
}

/* A GPU cache update for the step, then the CPU's, then the comparison. */
static KvStatus val_variant_update(KvValRun *v, ValVariant *s, int64_t n, int64_t len,
                                   const char *where, KvError *err) {
    KvStatus st = KV_OK;
    const int64_t total = len; /* the CPU's *total: positions stored before the update */
    KV_TRY(kv_cuda_cache_update(v->ctx, s->layer, n, len, err));
    s->ops->update(s->cpu, s->kn, s->vn, s->real_in, n, &total, len);
    KV_TRY(kv_val_dev_err(v, s->upd, where, err));
    KV_TRY(val_cache_compare(v, s, where, err));
cleanup:
    return st;
}

/* FNV-1a of n floats' bytes. */
static uint64_t val_hash(const float *x, int64_t n) {
    return kv_fnv1a(KV_FNV_OFFSET, x, (size_t)n * sizeof(float));
}

/* One step of n tokens at positions len.. as cuda_launch_layer runs a
 * variant's sliding layer, mirrored on the CPU as launch_layer does. */
static KvStatus val_variant_step(KvValRun *v, ValVariant *s, int step, int64_t n, int64_t len,
                                 KvError *err) {
    KvStatus st = KV_OK;
    KvCudaCtx *ctx = v->ctx;
    const KvCacheOps *ops = s->ops;
    const int64_t B = ctx->B, D = ctx->kv_dim, qd = ctx->q_dim, W = s->c->window;
    /* The variant's order (cache.h), as the forward takes it. */
    const bool after = n == 1 && ops->one_token_order == KV_ATTEND_AFTER_UPDATE;
    const int64_t n_slots = kv_cuda_cache_n_slots(ctx, s->layer, n, after);
    const int cls = val_case(n, len, W);
    const int regime_gpu = kv_cuda_cache_regime(ctx, s->layer, len);
    const int regime_cpu = ops->regime(s->cpu, len);
    KvCacheView view;
    char where[128], stream[64];
    snprintf(where, sizeof where, "step %d (%s: n %lld at positions %lld..%lld)", step,
             k_val_case_names[cls], (long long)n, (long long)len, (long long)(len + n - 1));
    s->counts[cls]++;

    /* Inputs from streams that do not name the variant: every variant gets
     * the same steps, so their attention outputs must agree bitwise. */
    snprintf(stream, sizeof stream, "validate.variant.%d.k", step);
    kv_val_fill(v, s->kn, B * n * D, -1.0f, 1.0f, stream);
    snprintf(stream, sizeof stream, "validate.variant.%d.v", step);
    kv_val_fill(v, s->vn, B * n * D, -1.0f, 1.0f, stream);
    for (int64_t b = 0; b < B; b++) {
        for (int64_t t = 0; t < n; t++) s->real_in[b * n + t] = kv_val_real(v, b, len + t) ? 1 : 0;
    }
    KV_TRY(kv_val_upload(v, ctx->kn, s->kn, (size_t)(B * n * D) * sizeof(float), err));
    KV_TRY(kv_val_upload(v, ctx->vn, s->vn, (size_t)(B * n * D) * sizeof(float), err));
    KV_TRY(kv_val_upload(v, ctx->real_in, s->real_in, (size_t)(B * n), err));
    KV_TRY(kv_val_set_total(v, len, err));
    if (regime_gpu != regime_cpu) {
        kv_val_fail(s->upd, "%s: %s: host regime %d on the gpu, %d on the cpu", s->upd->op, where,
                    regime_gpu, regime_cpu);
    }

    if (after) KV_TRY(val_variant_update(v, s, n, len, where, err));
    view = ops->view(s->cpu);
    if (view.n_slots != n_slots) {
        kv_val_fail(s->gat, "%s: %s: the gpu attends over %lld slots, the cpu view has %lld",
                    s->gat->op, where, (long long)n_slots, (long long)view.n_slots);
    }
    snprintf(stream, sizeof stream, "validate.variant.%d.q", step);
    KV_TRY(val_attn_arm(v, &s->a, n, stream, err));
    ctx->gtab = (int32_t *)s->gtab.p;

    KV_TRY(kv_cuda_gather_variant(ctx, s->layer, n, n_slots, !after, err));
    KV_TRY(kv_cuda_attend(ctx, s->layer, n, s->c->cur.k, s->c->cur.v, s->c->slots, err));

    KV_TRY(kv_val_dev_err(v, s->gat, where, err));
    KV_TRY(val_attn_download(v, &s->a, n, err));
    /* op_attn_variant's gather over the CPU view by the layout rule (plus
     * the new keys u <= t when attending before the update), in ascending
     * position. */
    for (int64_t r = 0; r < B * n; r++) {
        const int64_t b = r / n, t = r % n, qs = len + t;
        ValKeys *k = &s->a.keys;
        k->n = 0;
        for (int64_t i = 0; s->real_in[r] && i < view.n_slots; i++) {
            const int64_t p = kv_layout_position(ops->layout, W, i, after ? len + n : len);
            if (p < 0 || !view.real[b * view.row_stride + i] || !kv_window_visible(qs, p, W)) {
                continue;
            }
            val_keys_add(k, view.k + (b * view.row_stride + i) * view.dim,
                         view.v + (b * view.row_stride + i) * view.dim, (int32_t)i, p);
        }
        for (int64_t u = 0; s->real_in[r] && !after && u <= t; u++) {
            if (!s->real_in[b * n + u] || !kv_window_visible(qs, len + u, W)) continue;
            val_keys_add(k, s->kn + (b * n + u) * D, s->vn + (b * n + u) * D, (int32_t)(-(u + 1)),
                         len + u);
        }
        val_keys_sort(k);
        val_attn_row(v, &s->a, s->gat, where, r, n, len);
    }
    kv_val_check_floats(s->att, "att (B*n, q_dim)", where, s->a.att_got, s->a.att_want,
                        s->a.att_bound, B * n * qd, qd);
    if (v->att_hash_from == NULL) { /* no reference yet: this variant's may become it */
        v->att_hash[step] = val_hash(s->a.att_got, B * n * qd);
    } else if (v->att_hash[step] != val_hash(s->a.att_got, B * n * qd)) {
        kv_val_fail(s->att, "%s: %s: the output differs bitwise from %s's on the same inputs "
                            "(on the GPU every variant must be bitwise equal, DESIGN §2)",
                    s->att->op, where, v->att_hash_from);
    }

    if (!after) KV_TRY(val_variant_update(v, s, n, len, where, err));
    /* The host side of an executed forward (dynamic's filled count), then
     * the attended length the next step starts from. */
    kv_cuda_cache_advance(ctx, n);
    {
        const int64_t gpu_next = kv_cuda_cache_n_slots(ctx, s->layer, 1, false);
        const int64_t cpu_next = ops->view(s->cpu).n_slots;
        if (gpu_next != cpu_next) {
            kv_val_fail(s->upd, "%s: %s: after the update the gpu cache holds %lld attended "
                                "slots, the cpu's %lld",
                        s->upd->op, where, (long long)gpu_next, (long long)cpu_next);
        }
    }
    for (int i = 0; i < 8; i++) KV_TRY(kv_val_buf_check(v, s->upd, &s->slots[i], err));
    KV_TRY(kv_val_buf_check(v, s->upd, &s->indices, err));
    KV_TRY(kv_val_buf_check(v, s->gat, &s->gtab, err));
    KV_TRY(kv_val_buf_check(v, s->gat, &s->a.gidx, err));
    KV_TRY(kv_val_buf_check(v, s->gat, &s->a.nkeys, err));
    KV_TRY(kv_val_buf_check(v, s->att, &s->a.att, err));
cleanup:
    return st;
}

static void val_variant_free(ValVariant *s) {
    if (s->cpu != NULL) s->ops->destroy(s->cpu);
    for (int i = 0; i < 8; i++) kv_val_buf_free(&s->slots[i]);
    kv_val_buf_free(&s->indices);
    kv_val_buf_free(&s->gtab);
    val_attn_free(&s->a);
    free(s->kn);
    free(s->vn);
    free(s->real_in);
    free(s->ck);
    free(s->cv);
    free(s->creal);
    free(s->cpos);
    memset(s, 0, sizeof *s);
}

/* The variant's cache of `layer` pointed at guarded slots, and everything
 * else a step needs. */
static KvStatus val_variant_setup(KvValRun *v, ValVariant *s, int64_t layer, KvError *err) {
    static const char *const k_slot_names[8] = {
        "cur.k (B, S, kv_dim)", "cur.v (B, S, kv_dim)", "cur.real (B, S)", "cur.pos (S)",
        "tmp.k (B, S, kv_dim)", "tmp.v (B, S, kv_dim)", "tmp.real (B, S)", "tmp.pos (S)"};
    KvStatus st = KV_OK;
    KvCudaCtx *ctx = v->ctx;
    KvCudaCache *c = &ctx->caches[layer];
    const int64_t B = ctx->B, S = c->slots, W = c->window, D = ctx->kv_dim;
    const int64_t n = ctx->max_chunk;
    const size_t sizes[4] = {(size_t)(B * S * D) * sizeof(float), (size_t)(B * S * D) * sizeof(float),
                             (size_t)(B * S), (size_t)S * sizeof(int64_t)};
    KvCudaSlots *sets[2] = {&c->cur, &c->tmp};
    s->ops = ctx->variant;
    s->layer = layer;
    s->c = c;
    s->kn = (float *)kv_val_alloc(B * n * D, sizeof(float));
    s->vn = (float *)kv_val_alloc(B * n * D, sizeof(float));
    s->real_in = (uint8_t *)kv_val_alloc(B * n, 1);
    s->ck = (float *)kv_val_alloc(B * S * D, sizeof(float));
    s->cv = (float *)kv_val_alloc(B * S * D, sizeof(float));
    s->creal = (uint8_t *)kv_val_alloc(B * S, 1);
    s->cpos = (int64_t *)kv_val_alloc(S, sizeof(int64_t));
    if (s->kn == NULL || s->vn == NULL || s->real_in == NULL || s->ck == NULL || s->cv == NULL ||
        s->creal == NULL || s->cpos == NULL) {
        st = val_oom(err);
        goto cleanup;
    }
    for (int i = 0; i < 8; i++) {
        KV_TRY(kv_val_buf_alloc(v, &s->slots[i], k_slot_names[i], sizes[i % 4], KV_VAL_POISON_BYTE,
                                err));
    }
    KV_TRY(kv_val_buf_alloc(v, &s->indices, "indices (W)", (size_t)W * sizeof(int64_t),
                            KV_VAL_POISON_BYTE, err));
    KV_TRY(kv_val_buf_alloc(v, &s->gtab, "gtab (B*n, W + 1)",
                            (size_t)(B * n * (ctx->window + 1)) * sizeof(int32_t),
                            KV_VAL_POISON_BYTE, err));
    KV_TRY(val_attn_alloc(v, &s->a, err));
    for (int i = 0; i < 2; i++) {
        sets[i]->k = (float *)s->slots[4 * i + 0].p;
        sets[i]->v = (float *)s->slots[4 * i + 1].p;
        sets[i]->real = (uint8_t *)s->slots[4 * i + 2].p;
        sets[i]->pos = (int64_t *)s->slots[4 * i + 3].p;
    }
    c->indices = (int64_t *)s->indices.p;
    KV_TRY(s->ops->create(B, W, D, &s->cpu, err));
    s->ops->reset(s->cpu);
    /* The context's own reset empties the guarded slots as it empties its
     * own (K/V NaN, real 0, positions -1) and zeroes the position. */
    KV_TRY(kv_cuda_ctx_reset_state(ctx, err));
cleanup:
    return st;
}

KvStatus kv_val_variant(KvValRun *v, int64_t layer, KvError *err) {
    KvStatus st = KV_OK;
    KvCudaCtx *ctx = v->ctx;
    const KvCudaCtx saved = *ctx;
    const KvCudaCache saved_cache = ctx->caches[layer];
    const char *name = ctx->variant->name;
    const int64_t W = saved_cache.window;
    ValVariant s;
    int64_t *sched = (int64_t *)kv_val_alloc(W + 16, sizeof(int64_t)); /* (W + 16) */
    int n_sched = 0;
    int64_t len = 0;
    char text[48];
    memset(&s, 0, sizeof s);
    snprintf(text, sizeof text, "cache_update[%s]", name);
    KV_TRY(kv_val_op_begin(v, text, NULL, true, &s.upd, err));
    snprintf(text, sizeof text, "gather[%s]", name);
    KV_TRY(kv_val_op_begin(v, text, NULL, true, &s.gat, err));
    snprintf(text, sizeof text, "attention[%s]", name);
    KV_TRY(kv_val_op_begin(v, text, NULL, false, &s.att, err));
    snprintf(s.att->tolerance, sizeof s.att->tolerance, "2(2E_s+(4nk+16)u)sum p|v|");
    if (sched == NULL) {
        st = val_oom(err);
        goto cleanup;
    }
    n_sched = val_schedule(W, sched);
    if (v->att_hash == NULL) {
        v->att_hash = (uint64_t *)kv_val_alloc(n_sched, sizeof(uint64_t));
        if (v->att_hash == NULL) {
            st = val_oom(err);
            goto cleanup;
        }
    }
    KV_TRY(val_variant_setup(v, &s, layer, err));
    for (int i = 0; i < n_sched; i++) {
        if (sched[i] < 0) {
            s.ops->reset(s.cpu);
            KV_TRY(kv_cuda_ctx_reset_state(ctx, err));
            len = 0;
            continue;
        }
        KV_TRY(val_variant_step(v, &s, i, sched[i], len, err));
        len += sched[i];
    }
    /* A variant that matched the CPU at every step is the reference the
     * later ones must equal bitwise. */
    if (v->att_hash_from == NULL && s.att->passed) v->att_hash_from = name;
    {
        /* The update's line: the schedule's coverage, updates per case. */
        char *p = s.upd->shape;
        size_t left = sizeof s.upd->shape;
        int used = snprintf(p, left, "W %lld S %lld:", (long long)W, (long long)saved_cache.slots);
        for (int k = 0; k < VAL_N_CASES && used > 0 && (size_t)used < left; k++) {
            p += used;
            left -= (size_t)used;
            used = snprintf(p, left, " %s %lld%s", k_val_case_names[k], (long long)s.counts[k],
                            k + 1 < VAL_N_CASES ? "," : "");
        }
        for (int k = 0; k < VAL_N_CASES; k++) {
            if (s.counts[k] == 0) {
                kv_val_fail(s.upd, "%s: the schedule never ran a %s update", s.upd->op,
                            k_val_case_names[k]);
            }
        }
    }
    kv_val_op_shape(s.gat, "B %lld, %d steps, n 1..%lld, kv_dim %lld", (long long)ctx->B,
                    n_sched - 1, (long long)ctx->max_chunk, (long long)ctx->kv_dim);
    kv_val_op_shape(s.att, "heads %lld/%lld x %lld, keys <= %lld", (long long)ctx->n_heads,
                    (long long)ctx->n_kv_heads, (long long)ctx->hd, (long long)W);
cleanup:
    /* The context's own buffers back before it is destroyed or reused. */
    ctx->caches[layer] = saved_cache;
    *ctx = saved;
    val_op_finish(v, s.upd, st, err);
    val_op_finish(v, s.gat, st, err);
    val_op_finish(v, s.att, st, err);
    val_variant_free(&s);
    free(sched);
    return st;
}
