/* cuda_validate_ops.cu: the per-op validation (cuda_validate.h) of the
 * launchers that do not touch the KV cache: positions, embedding, RMSNorm
 * (both forms), the cuBLAS matmul, RoPE, softcap, GLU (both activations),
 * the residual add and argmax with the position advance. Each runs once on
 * seeded inputs into guarded buffers and is compared with the CPU op of
 * reference/kvmath.h (or, for ops that live inside reference/forward.c, the
 * same few lines of logic), bitwise or within the bound stated below. */
#include "cuda_validate_internal.cuh"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "kvmath.h"
#include "prng.h"
}

/* ---- tolerances ----
 * Each bound is on |gpu - cpu| for one output element, derived from the
 * op's first-order error analysis in units of u = 2^-24 (KV_VAL_U), with
 * slack for the second-order terms: any correct kernel stays under it,
 * while a wrong element, row, head or position lands orders of magnitude
 * above (a TF32 matmul, ~2^-11 relative, is ~30x over the matmul's). */

/* RMSNorm, (n + KV_VAL_RMSNORM_SLACK) u |cpu|: the sum of the n squares
 * (the squares themselves are identical) runs in different orders (device:
 * per-thread strided partials and a 256-wide tree; CPU: 16 lanes and a
 * tree), each within (n - 1) u of the exact sum relative (positive terms,
 * any order), so 2(n - 1) u apart; 1 / sqrt halves that. The divide by n,
 * + eps, sqrtf, the reciprocal and the two products round once per side
 * (12u); 1 + w is the same operation on the same operands on both. */
#define KV_VAL_RMSNORM_SLACK 16.0

/* Matmul, (2k + KV_VAL_GEMM_SLACK) u sum_i |x_i| |w_i| for a dot of length
 * k: any summation order (cuBLAS's tiles, split-K, FMA or not) is within
 * k u of the exact dot times sum |x_i w_i|, so the two sides 2k u apart;
 * the slack covers the second-order terms. */
#define KV_VAL_GEMM_SLACK 8.0

/* RoPE, KV_VAL_ROPE_U u (|a| + |b|) for the pair (a, b) an output element
 * belongs to: the angle (float)pos * inv_freq is the same product on both
 * sides (the device uses the host's inv_freq), cosf and sinf differ by at
 * most KV_VAL_LIBM_U u of an absolute value <= 1, and a c - b s (b c + a s)
 * rounds three times per side: (8 + 6) u, rounded up. */
#define KV_VAL_ROPE_U 16.0

/* softcap, KV_VAL_SOFTCAP_U u |cpu|: x / cap is the same division on both
 * sides, tanhf differs by KV_VAL_LIBM_U u relative, the product with cap
 * rounds once per side: 10u, rounded up. */
#define KV_VAL_SOFTCAP_U 16.0

/* GLU, KV_VAL_GLU_U u |x| |up| with x the gate input: gelu's inner
 * polynomial is the same operations on both sides, tanhf differs by at most
 * 8u absolute (|tanh| <= 1), 1 + t and the products add 2u each per side,
 * and |0.5 x (1 + t)| <= |x|; silu's expf differs by 8u relative, which 1 +
 * e and the division keep relative to |act| <= |x|, plus 2u per rounding.
 * Both stay under 12u |x| |up|; rounded up. */
#define KV_VAL_GLU_U 16.0

/* The cap softcap is validated with when the model has no final softcap
 * (mistral): gemma2's final_logit_softcapping. */
#define KV_VAL_SOFTCAP_FALLBACK 30.0f

static KvStatus val_oom(KvError *err) {
    return kv_error_set(err, KV_ERR_INTERNAL, "cuda validate: out of host memory");
}

/* The op's end: a CUDA failure is recorded as the op's failure too, so its
 * line says what stopped the run. */
static void val_op_finish(KvValRun *v, KvCudaValidateOp *op, KvStatus st, const KvError *err) {
    if (op == NULL) return;
    if (st != KV_OK) kv_val_fail(op, "%s: stopped: %s", op->op, err->msg);
    kv_val_op_end(v, op);
}

/* ---- positions ---- */

/* kv_cuda_positions for n tokens at positions len.. against op_positions'
 * logic (reference/forward.c): slot realness, the RoPE position (real
 * tokens before it in the row; pads 0) and the per-row count. */
static KvStatus val_positions_case(KvValRun *v, KvCudaValidateOp *op, int64_t len, int64_t n,
                                   KvError *err) {
    KvStatus st = KV_OK;
    KvCudaCtx *ctx = v->ctx;
    const int64_t B = ctx->B, L = ctx->max_len;
    KvValBuf real = {}, n_real = {}, qpos = {};
    uint8_t *real_in = (uint8_t *)kv_val_alloc(B * n, 1);                   /* (B, n) */
    uint8_t *real_want = (uint8_t *)kv_val_alloc(B * L, 1);                 /* (B, max_len) */
    uint8_t *real_got = (uint8_t *)kv_val_alloc(B * L, 1);                  /* (B, max_len) */
    int64_t *n_real0 = (int64_t *)kv_val_alloc(B, sizeof(int64_t));         /* (B) */
    int64_t *n_real_want = (int64_t *)kv_val_alloc(B, sizeof(int64_t));     /* (B) */
    int64_t *n_real_got = (int64_t *)kv_val_alloc(B, sizeof(int64_t));      /* (B) */
    int64_t *qpos_want = (int64_t *)kv_val_alloc(B * n, sizeof(int64_t));   /* (B, n) */
    int64_t *qpos_got = (int64_t *)kv_val_alloc(B * n, sizeof(int64_t));    /* (B, n) */
    char where[96];
    snprintf(where, sizeof where, "%lld tokens at positions %lld..%lld", (long long)n,
             (long long)len, (long long)(len + n - 1));
    if (real_in == NULL || real_want == NULL || real_got == NULL || n_real0 == NULL ||
        n_real_want == NULL || n_real_got == NULL || qpos_want == NULL || qpos_got == NULL) {
        st = val_oom(err);
        goto cleanup;
    }
    /* Slots hold 2 before the op, a value it never writes: a write to the
     * wrong slot shows. */
    memset(real_want, 2, (size_t)(B * L));
    for (int64_t b = 0; b < B; b++) {
        n_real0[b] = len > v->pad[b] ? len - v->pad[b] : 0;
        for (int64_t t = 0; t < n; t++) real_in[b * n + t] = kv_val_real(v, b, len + t) ? 1 : 0;
    }
    /* A pad after real tokens in the last row: the decode driver refuses
     * such input, but op_positions defines it (RoPE position 0, the count
     * unchanged), and only such a pad tells "0" from "the count so far". */
    if (n > 5) real_in[(B - 1) * n + 5] = 0;
    KV_TRY(kv_val_buf_alloc(v, &real, "real (B, max_len)", (size_t)(B * L), 2, err));
    KV_TRY(kv_val_buf_alloc(v, &n_real, "n_real (B)", (size_t)B * sizeof(int64_t), 0, err));
    KV_TRY(kv_val_buf_alloc(v, &qpos, "qpos (B, n)", (size_t)(B * n) * sizeof(int64_t),
                            KV_VAL_POISON_BYTE, err));
    KV_TRY(kv_val_upload(v, n_real.p, n_real0, (size_t)B * sizeof(int64_t), err));
    KV_TRY(kv_val_upload(v, ctx->real_in, real_in, (size_t)(B * n), err));
    ctx->real = (uint8_t *)real.p;
    ctx->n_real = (int64_t *)n_real.p;
    ctx->qpos = (int64_t *)qpos.p;
    KV_TRY(kv_val_set_total(v, len, err));

    KV_TRY(kv_cuda_positions(ctx, n, err));

    for (int64_t b = 0; b < B; b++) {
        int64_t seen = n_real0[b];
        for (int64_t t = 0; t < n; t++) {
            const int64_t r = b * n + t;
            const uint8_t is_real = real_in[r] ? 1 : 0;
            real_want[b * L + len + t] = is_real;
            qpos_want[r] = is_real ? seen++ : 0;
        }
        n_real_want[b] = seen;
    }
    KV_TRY(kv_val_download(v, real_got, real.p, (size_t)(B * L), err));
    KV_TRY(kv_val_download(v, n_real_got, n_real.p, (size_t)B * sizeof(int64_t), err));
    KV_TRY(kv_val_download(v, qpos_got, qpos.p, (size_t)(B * n) * sizeof(int64_t), err));
    kv_val_check_ints(op, "real (B, max_len)", where, real_got, real_want, B * L, 1, L);
    kv_val_check_ints(op, "qpos (B, n)", where, qpos_got, qpos_want, B * n, sizeof(int64_t), n);
    kv_val_check_ints(op, "n_real (B)", where, n_real_got, n_real_want, B, sizeof(int64_t), 1);
    KV_TRY(kv_val_buf_check(v, op, &real, err));
    KV_TRY(kv_val_buf_check(v, op, &n_real, err));
    KV_TRY(kv_val_buf_check(v, op, &qpos, err));
    KV_TRY(kv_val_dev_err(v, op, where, err));
cleanup:
    kv_val_buf_free(&real);
    kv_val_buf_free(&n_real);
    kv_val_buf_free(&qpos);
    free(real_in);
    free(real_want);
    free(real_got);
    free(n_real0);
    free(n_real_want);
    free(n_real_got);
    free(qpos_want);
    free(qpos_got);
    return st;
}

KvStatus kv_val_positions(KvValRun *v, KvError *err) {
    KvStatus st = KV_OK;
    KvCudaCtx *ctx = v->ctx;
    const KvCudaCtx saved = *ctx;
    const int64_t n = ctx->max_chunk;
    KvCudaValidateOp *op = NULL;
    KV_TRY(kv_val_op_begin(v, "positions", NULL, true, &op, err));
    kv_val_op_shape(op, "B %lld, n %lld at 2 and at max_len - n", (long long)ctx->B,
                    (long long)n);
    /* A second chunk whose rows are still partly padding, and the last n
     * slots of the state (its writes end at the buffer's end). */
    KV_TRY(val_positions_case(v, op, 2, n, err));
    KV_TRY(val_positions_case(v, op, ctx->max_len - n, n, err));
cleanup:
    *ctx = saved;
    val_op_finish(v, op, st, err);
    return st;
}

/* ---- embedding ---- */

/* kv_cuda_embed against op_embed's logic: the token's row, times
 * sqrt(hidden) rounded to F32 on gemma2. One multiply: bitwise. */
KvStatus kv_val_embed(KvValRun *v, KvError *err) {
    KvStatus st = KV_OK;
    KvCudaCtx *ctx = v->ctx;
    const KvCudaCtx saved = *ctx;
    const KvModel *m = v->m;
    const int64_t n = ctx->max_chunk, rows = ctx->B * n, H = ctx->hidden, V = ctx->vocab;
    const bool gemma = kv_config_gemma_style(&m->config);
    const float normalizer = gemma ? (float)sqrt((double)H) : 1.0f;
    KvCudaValidateOp *op = NULL;
    KvValBuf x = {};
    int32_t *tok = (int32_t *)kv_val_alloc(rows, sizeof(int32_t)); /* (B, n) */
    float *want = (float *)kv_val_alloc(rows * H, sizeof(float));  /* (B * n, hidden) */
    float *got = (float *)kv_val_alloc(rows * H, sizeof(float));   /* (B * n, hidden) */
    KvPrng g = kv_prng_stream(v->seed, "validate.embed.tokens");
    KV_TRY(kv_val_op_begin(v, "embed", NULL, true, &op, err));
    kv_val_op_shape(op, "tokens (%lld), table (%lld, %lld)", (long long)rows, (long long)V,
                    (long long)H);
    if (tok == NULL || want == NULL || got == NULL) {
        st = val_oom(err);
        goto cleanup;
    }
    for (int64_t r = 0; r < rows; r++) tok[r] = (int32_t)kv_prng_below(&g, (uint32_t)V);
    tok[0] = 0; /* both ends of the table */
    tok[rows - 1] = (int32_t)(V - 1);
    KV_TRY(kv_val_buf_alloc(v, &x, "x (B*n, hidden)", (size_t)(rows * H) * sizeof(float),
                            KV_VAL_POISON_BYTE, err));
    KV_TRY(kv_val_upload(v, ctx->tok_in, tok, (size_t)rows * sizeof(int32_t), err));
    ctx->x = (float *)x.p;

    KV_TRY(kv_cuda_embed(ctx, n, err));

    for (int64_t r = 0; r < rows; r++) {
        float *e = want + r * H; /* (hidden) the token's row, widened as the host reads it */
        kv_mat_widen(m->embed, (int64_t)tok[r] * H, H, e);
        if (gemma) {
            for (int64_t i = 0; i < H; i++) e[i] = e[i] * normalizer;
        }
    }
    KV_TRY(kv_val_download(v, got, x.p, (size_t)(rows * H) * sizeof(float), err));
    kv_val_check_floats(op, "x (B*n, hidden)", "embed", got, want, NULL, rows * H, H);
    KV_TRY(kv_val_buf_check(v, op, &x, err));
    KV_TRY(kv_val_dev_err(v, op, "embed", err));
cleanup:
    *ctx = saved;
    kv_val_buf_free(&x);
    free(tok);
    free(want);
    free(got);
    val_op_finish(v, op, st, err);
    return st;
}

/* ---- RMSNorm ---- */

/* CPU RMSNorm of rows spaced by in_stride into (rows, n), and each
 * element's bound. */
static void val_rmsnorm_cpu(const float *in, int64_t in_stride, const float *w /* (n) */,
                            int64_t rows, int64_t n, float eps, bool offset,
                            float *out /* (rows, n) */, float *bound /* (rows, n) */) {
    for (int64_t r = 0; r < rows; r++) {
        kv_rmsnorm(in + r * in_stride, w, n, eps, offset, out + r * n);
        for (int64_t i = 0; i < n; i++) {
            bound[r * n + i] = (float)(((double)n + KV_VAL_RMSNORM_SLACK) * KV_VAL_U *
                                       fabs((double)out[r * n + i])) + KV_VAL_TINY;
        }
    }
}

/* kv_cuda_rmsnorm in the form `offset` selects (gemma2: x r (1 + w);
 * mistral: w (x r)) with the model's layer-0 input norm weights: rows out
 * of place, the same rows in place, and the final norm's strided form (the
 * last token of each row). */
KvStatus kv_val_rmsnorm(KvValRun *v, bool offset, KvError *err) {
    KvStatus st = KV_OK;
    KvCudaCtx *ctx = v->ctx;
    const KvCudaCtx saved = *ctx;
    const int64_t n = ctx->max_chunk, B = ctx->B, rows = B * n, H = ctx->hidden;
    const float *w_dev = ctx->layers[0].input_norm;  /* (hidden) device */
    const float *w = v->m->layers[0].input_norm;     /* (hidden) host */
    const size_t bytes = (size_t)(rows * H) * sizeof(float);
    KvCudaValidateOp *op = NULL;
    KvValBuf xin = {}, y = {}, z = {}, y2 = {};
    float *x = (float *)kv_val_alloc(rows * H, sizeof(float));     /* (B * n, hidden) */
    float *want = (float *)kv_val_alloc(rows * H, sizeof(float));  /* (B * n, hidden) */
    float *bound = (float *)kv_val_alloc(rows * H, sizeof(float)); /* (B * n, hidden) */
    float *got = (float *)kv_val_alloc(rows * H, sizeof(float));   /* (B * n, hidden) */
    KV_TRY(kv_val_op_begin(v, offset ? "rmsnorm[gemma2]" : "rmsnorm[mistral]",
                           "(n+16)u|cpu|", false, &op, err));
    kv_val_op_shape(op, "(%lld, %lld) out/in place, strided (%lld, %lld)", (long long)rows,
                    (long long)H, (long long)B, (long long)H);
    if (x == NULL || want == NULL || bound == NULL || got == NULL) {
        st = val_oom(err);
        goto cleanup;
    }
    kv_val_fill(v, x, rows * H, -2.0f, 2.0f, "validate.rmsnorm.x");
    /* A zero row (mean 0: 1 / sqrt(eps)), a large one, and one whose mean
     * square is near eps (where adding eps in the wrong place shows). */
    for (int64_t i = 0; i < H; i++) {
        x[i] = 0.0f;
        if (rows > 2) {
            x[H + i] *= 1000.0f;
            x[2 * H + i] *= 1e-3f;
        }
    }
    ctx->gemma = offset;
    KV_TRY(kv_val_buf_alloc(v, &xin, "in (B*n, hidden)", bytes, KV_VAL_POISON_BYTE, err));
    KV_TRY(kv_val_buf_alloc(v, &y, "out (B*n, hidden)", bytes, KV_VAL_POISON_BYTE, err));
    KV_TRY(kv_val_buf_alloc(v, &z, "in = out (B*n, hidden)", bytes, KV_VAL_POISON_BYTE, err));
    KV_TRY(kv_val_buf_alloc(v, &y2, "out (B, hidden)", (size_t)(B * H) * sizeof(float),
                            KV_VAL_POISON_BYTE, err));
    KV_TRY(kv_val_upload(v, xin.p, x, bytes, err));
    KV_TRY(kv_val_upload(v, z.p, x, bytes, err));

    KV_TRY(kv_cuda_rmsnorm(ctx, (const float *)xin.p, H, w_dev, (float *)y.p, H, rows, err));
    KV_TRY(kv_cuda_rmsnorm(ctx, (const float *)z.p, H, w_dev, (float *)z.p, H, rows, err));
    KV_TRY(kv_cuda_rmsnorm(ctx, (const float *)xin.p + (n - 1) * H, n * H, w_dev, (float *)y2.p,
                           H, B, err));

    val_rmsnorm_cpu(x, H, w, rows, H, ctx->eps, offset, want, bound);
    KV_TRY(kv_val_download(v, got, y.p, bytes, err));
    kv_val_check_floats(op, "out (B*n, hidden)", "out of place", got, want, bound, rows * H, H);
    KV_TRY(kv_val_download(v, got, z.p, bytes, err));
    kv_val_check_floats(op, "in = out (B*n, hidden)", "in place", got, want, bound, rows * H, H);
    val_rmsnorm_cpu(x + (n - 1) * H, n * H, w, B, H, ctx->eps, offset, want, bound);
    KV_TRY(kv_val_download(v, got, y2.p, (size_t)(B * H) * sizeof(float), err));
    kv_val_check_floats(op, "out (B, hidden)", "strided (final norm)", got, want, bound, B * H, H);
    KV_TRY(kv_val_buf_check(v, op, &xin, err));
    KV_TRY(kv_val_buf_check(v, op, &y, err));
    KV_TRY(kv_val_buf_check(v, op, &z, err));
    KV_TRY(kv_val_buf_check(v, op, &y2, err));
    KV_TRY(kv_val_dev_err(v, op, "rmsnorm", err));
cleanup:
    *ctx = saved;
    kv_val_buf_free(&xin);
    kv_val_buf_free(&y);
    kv_val_buf_free(&z);
    kv_val_buf_free(&y2);
    free(x);
    free(want);
    free(bound);
    free(got);
    val_op_finish(v, op, st, err);
    return st;
}

/* ---- matmul ---- */

/* One kv_cuda_gemm case: y (rows, out) = x (rows, in) W^T against
 * kv_matmul, with the model's weights (w_dev on the device, w on the host). */
static KvStatus val_gemm_case(KvValRun *v, KvCudaValidateOp *op, const char *what,
                              const float *w_dev /* (out, in) */, KvMat w /* (out, in) */,
                              int64_t rows, int64_t in, int64_t out, KvError *err) {
    KvStatus st = KV_OK;
    KvCudaCtx *ctx = v->ctx;
    KvValBuf xb = {}, yb = {};
    float *x = (float *)kv_val_alloc(rows * in, sizeof(float));      /* (rows, in) */
    float *want = (float *)kv_val_alloc(rows * out, sizeof(float));  /* (rows, out) */
    float *bound = (float *)kv_val_alloc(rows * out, sizeof(float)); /* (rows, out) */
    float *got = (float *)kv_val_alloc(rows * out, sizeof(float));   /* (rows, out) */
    char stream[64];
    snprintf(stream, sizeof stream, "validate.gemm.%s", what);
    if (x == NULL || want == NULL || bound == NULL || got == NULL) {
        st = val_oom(err);
        goto cleanup;
    }
    kv_val_fill(v, x, rows * in, -1.0f, 1.0f, stream);
    KV_TRY(kv_val_buf_alloc(v, &xb, "x (rows, in)", (size_t)(rows * in) * sizeof(float),
                            KV_VAL_POISON_BYTE, err));
    KV_TRY(kv_val_buf_alloc(v, &yb, "y (rows, out)", (size_t)(rows * out) * sizeof(float),
                            KV_VAL_POISON_BYTE, err));
    KV_TRY(kv_val_upload(v, xb.p, x, (size_t)(rows * in) * sizeof(float), err));

    KV_TRY(kv_cuda_gemm(ctx, (const float *)xb.p, w_dev, (float *)yb.p, rows, in, out, err));

    kv_matmul_mat(x, w, rows, in, out, want);
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t o = 0; o < out; o++) {
            double mag = 0.0;
            for (int64_t i = 0; i < in; i++) {
                mag += fabs((double)x[r * in + i] * (double)kv_mat_at(w, o * in + i));
            }
            bound[r * out + o] =
                (float)((2.0 * (double)in + KV_VAL_GEMM_SLACK) * KV_VAL_U * mag) + KV_VAL_TINY;
        }
    }
    KV_TRY(kv_val_download(v, got, yb.p, (size_t)(rows * out) * sizeof(float), err));
    kv_val_check_floats(op, "y (rows, out)", what, got, want, bound, rows * out, out);
    KV_TRY(kv_val_buf_check(v, op, &xb, err));
    KV_TRY(kv_val_buf_check(v, op, &yb, err));
cleanup:
    kv_val_buf_free(&xb);
    kv_val_buf_free(&yb);
    free(x);
    free(want);
    free(bound);
    free(got);
    return st;
}

/* kv_cuda_gemm (cuBLAS, pedantic F32) on the q projection of a chunk and on
 * lm_head for one token per row. */
KvStatus kv_val_gemm(KvValRun *v, KvError *err) {
    KvStatus st = KV_OK;
    KvCudaCtx *ctx = v->ctx;
    const KvCudaCtx saved = *ctx;
    const KvModel *m = v->m;
    const int64_t rows = ctx->B * ctx->max_chunk;
    KvCudaValidateOp *op = NULL;
    KV_TRY(kv_val_op_begin(v, "gemm", "(2k+8)u sum|x||w|", false, &op, err));
    kv_val_op_shape(op, "(%lld,%lld)x(%lld,%lld)^T, (%lld,%lld)x(%lld,%lld)^T", (long long)rows,
                    (long long)ctx->hidden, (long long)ctx->q_dim, (long long)ctx->hidden,
                    (long long)ctx->B, (long long)ctx->hidden, (long long)ctx->vocab,
                    (long long)ctx->hidden);
    KV_TRY(val_gemm_case(v, op, "wq", ctx->layers[0].wq, m->layers[0].wq, rows, ctx->hidden,
                         ctx->q_dim, err));
    KV_TRY(val_gemm_case(v, op, "lm_head", ctx->w_lm_head, m->lm_head, ctx->B, ctx->hidden,
                         ctx->vocab, err));
    KV_TRY(kv_val_dev_err(v, op, "gemm", err));
cleanup:
    *ctx = saved;
    val_op_finish(v, op, st, err);
    return st;
}

/* ---- RoPE ---- */

/* The bound of each element of rows of `heads` head vectors before
 * rotation: KV_VAL_ROPE_U u (|a| + |b|) for its (j, j + hd/2) pair. */
static void val_rope_bound(const float *x /* (rows, heads * hd) */, int64_t rows, int64_t heads,
                           int64_t hd, float *bound /* (rows, heads * hd) */) {
    const int64_t half = hd / 2;
    for (int64_t r = 0; r < rows * heads; r++) {
        for (int64_t j = 0; j < half; j++) {
            const float a = x[r * hd + j], b = x[r * hd + j + half];
            const float e =
                (float)(KV_VAL_ROPE_U * KV_VAL_U * (fabs((double)a) + fabs((double)b))) + KV_VAL_TINY;
            bound[r * hd + j] = e;
            bound[r * hd + j + half] = e;
        }
    }
}

/* kv_cuda_rope on q and the new keys of a chunk against kv_rope_apply, at
 * positions across the whole state (0 and max_len - 1 included). */
KvStatus kv_val_rope(KvValRun *v, KvError *err) {
    KvStatus st = KV_OK;
    KvCudaCtx *ctx = v->ctx;
    const KvCudaCtx saved = *ctx;
    const KvConfig *c = &v->m->config;
    const int64_t n = ctx->max_chunk, rows = ctx->B * n, hd = ctx->hd;
    const int64_t qd = ctx->q_dim, kd = ctx->kv_dim;
    KvCudaValidateOp *op = NULL;
    KvValBuf qb = {}, kb = {};
    KvPrng g = kv_prng_stream(v->seed, "validate.rope.pos");
    float *q = (float *)kv_val_alloc(rows * qd, sizeof(float));      /* (B * n, q_dim) */
    float *k = (float *)kv_val_alloc(rows * kd, sizeof(float));      /* (B * n, kv_dim) */
    float *qw = (float *)kv_val_alloc(rows * qd, sizeof(float));     /* (B * n, q_dim) */
    float *kw = (float *)kv_val_alloc(rows * kd, sizeof(float));     /* (B * n, kv_dim) */
    float *qbound = (float *)kv_val_alloc(rows * qd, sizeof(float)); /* (B * n, q_dim) */
    float *kbound = (float *)kv_val_alloc(rows * kd, sizeof(float)); /* (B * n, kv_dim) */
    float *got = (float *)kv_val_alloc(rows * qd, sizeof(float));    /* (B * n, q_dim) */
    float *inv = (float *)kv_val_alloc(hd / 2, sizeof(float));       /* (hd / 2) */
    int64_t *pos = (int64_t *)kv_val_alloc(rows, sizeof(int64_t));   /* (B * n) */
    KV_TRY(kv_val_op_begin(v, "rope", "16u(|a|+|b|)", false, &op, err));
    kv_val_op_shape(op, "q (%lld, %lld), k (%lld, %lld), pos < %lld", (long long)rows,
                    (long long)qd, (long long)rows, (long long)kd, (long long)ctx->max_len);
    if (q == NULL || k == NULL || qw == NULL || kw == NULL || qbound == NULL || kbound == NULL ||
        got == NULL || inv == NULL || pos == NULL) {
        st = val_oom(err);
        goto cleanup;
    }
    kv_val_fill(v, q, rows * qd, -2.0f, 2.0f, "validate.rope.q");
    kv_val_fill(v, k, rows * kd, -2.0f, 2.0f, "validate.rope.k");
    for (int64_t r = 0; r < rows; r++) pos[r] = (int64_t)kv_prng_below(&g, (uint32_t)ctx->max_len);
    pos[0] = 0;
    pos[rows - 1] = ctx->max_len - 1;
    KV_TRY(kv_val_buf_alloc(v, &qb, "q (B*n, q_dim)", (size_t)(rows * qd) * sizeof(float),
                            KV_VAL_POISON_BYTE, err));
    KV_TRY(kv_val_buf_alloc(v, &kb, "kn (B*n, kv_dim)", (size_t)(rows * kd) * sizeof(float),
                            KV_VAL_POISON_BYTE, err));
    KV_TRY(kv_val_upload(v, qb.p, q, (size_t)(rows * qd) * sizeof(float), err));
    KV_TRY(kv_val_upload(v, kb.p, k, (size_t)(rows * kd) * sizeof(float), err));
    KV_TRY(kv_val_upload(v, ctx->qpos, pos, (size_t)rows * sizeof(int64_t), err));
    ctx->q = (float *)qb.p;
    ctx->kn = (float *)kb.p;

    KV_TRY(kv_cuda_rope(ctx, n, 0, err)); /* layer 0's frequencies */

    /* The same F32 inverse frequencies the context uploaded for layer 0. */
    kv_rope_inv_freq(hd, kv_config_layer_rope_theta(c, 0), inv);
    memcpy(qw, q, (size_t)(rows * qd) * sizeof(float));
    memcpy(kw, k, (size_t)(rows * kd) * sizeof(float));
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t h = 0; h < ctx->n_heads; h++) kv_rope_apply(qw + r * qd + h * hd, hd, inv, pos[r]);
        for (int64_t h = 0; h < ctx->n_kv_heads; h++) kv_rope_apply(kw + r * kd + h * hd, hd, inv, pos[r]);
    }
    val_rope_bound(q, rows, ctx->n_heads, hd, qbound);
    val_rope_bound(k, rows, ctx->n_kv_heads, hd, kbound);
    KV_TRY(kv_val_download(v, got, qb.p, (size_t)(rows * qd) * sizeof(float), err));
    kv_val_check_floats(op, "q (B*n, q_dim)", "rope", got, qw, qbound, rows * qd, qd);
    KV_TRY(kv_val_download(v, got, kb.p, (size_t)(rows * kd) * sizeof(float), err));
    kv_val_check_floats(op, "kn (B*n, kv_dim)", "rope", got, kw, kbound, rows * kd, kd);
    KV_TRY(kv_val_buf_check(v, op, &qb, err));
    KV_TRY(kv_val_buf_check(v, op, &kb, err));
    KV_TRY(kv_val_dev_err(v, op, "rope", err));
cleanup:
    *ctx = saved;
    kv_val_buf_free(&qb);
    kv_val_buf_free(&kb);
    free(q);
    free(k);
    free(qw);
    free(kw);
    free(qbound);
    free(kbound);
    free(got);
    free(inv);
    free(pos);
    val_op_finish(v, op, st, err);
    return st;
}

/* ---- softcap ---- */

/* kv_cuda_softcap on a (B, vocab) logits buffer against kv_softcap, from
 * well inside the cap to deep saturation. */
KvStatus kv_val_softcap(KvValRun *v, KvError *err) {
    KvStatus st = KV_OK;
    KvCudaCtx *ctx = v->ctx;
    const KvCudaCtx saved = *ctx;
    const int64_t count = ctx->B * ctx->vocab;
    const float cap = ctx->final_cap > 0.0f ? ctx->final_cap : KV_VAL_SOFTCAP_FALLBACK;
    KvCudaValidateOp *op = NULL;
    KvValBuf xb = {};
    float *x = (float *)kv_val_alloc(count, sizeof(float));     /* (B, vocab) */
    float *want = (float *)kv_val_alloc(count, sizeof(float));  /* (B, vocab) */
    float *bound = (float *)kv_val_alloc(count, sizeof(float)); /* (B, vocab) */
    float *got = (float *)kv_val_alloc(count, sizeof(float));   /* (B, vocab) */
    KV_TRY(kv_val_op_begin(v, "softcap", "16u|cpu|", false, &op, err));
    kv_val_op_shape(op, "(%lld, %lld), cap %g%s", (long long)ctx->B, (long long)ctx->vocab,
                    (double)cap, ctx->final_cap > 0.0f ? "" : " (model has none)");
    if (x == NULL || want == NULL || bound == NULL || got == NULL) {
        st = val_oom(err);
        goto cleanup;
    }
    kv_val_fill(v, x, count, -4.0f * cap, 4.0f * cap, "validate.softcap.x");
    x[0] = 0.0f;
    x[1] = cap;
    x[2] = -40.0f * cap;
    for (int64_t i = 0; i < count; i++) {
        want[i] = kv_softcap(x[i], cap);
        bound[i] = (float)(KV_VAL_SOFTCAP_U * KV_VAL_U * fabs((double)want[i])) + KV_VAL_TINY;
    }
    KV_TRY(kv_val_buf_alloc(v, &xb, "x (B, vocab)", (size_t)count * sizeof(float),
                            KV_VAL_POISON_BYTE, err));
    KV_TRY(kv_val_upload(v, xb.p, x, (size_t)count * sizeof(float), err));

    KV_TRY(kv_cuda_softcap(ctx, (float *)xb.p, count, cap, err));

    KV_TRY(kv_val_download(v, got, xb.p, (size_t)count * sizeof(float), err));
    kv_val_check_floats(op, "x (B, vocab)", "softcap", got, want, bound, count, ctx->vocab);
    KV_TRY(kv_val_buf_check(v, op, &xb, err));
    KV_TRY(kv_val_dev_err(v, op, "softcap", err));
cleanup:
    *ctx = saved;
    kv_val_buf_free(&xb);
    free(x);
    free(want);
    free(bound);
    free(got);
    val_op_finish(v, op, st, err);
    return st;
}

/* ---- GLU ---- */

/* kv_cuda_glu, gate = act(gate) * up, with gemma2's tanh gelu (gelu) or
 * mistral's silu, against kv_gelu_tanh / kv_silu. */
KvStatus kv_val_glu(KvValRun *v, bool gelu, KvError *err) {
    KvStatus st = KV_OK;
    KvCudaCtx *ctx = v->ctx;
    const KvCudaCtx saved = *ctx;
    const int64_t count = ctx->B * ctx->max_chunk * ctx->inter;
    KvCudaValidateOp *op = NULL;
    KvValBuf gb = {};
    float *gate = (float *)kv_val_alloc(count, sizeof(float));  /* (B * n, inter) */
    float *up = (float *)kv_val_alloc(count, sizeof(float));    /* (B * n, inter) */
    float *want = (float *)kv_val_alloc(count, sizeof(float));  /* (B * n, inter) */
    float *bound = (float *)kv_val_alloc(count, sizeof(float)); /* (B * n, inter) */
    float *got = (float *)kv_val_alloc(count, sizeof(float));   /* (B * n, inter) */
    KV_TRY(kv_val_op_begin(v, gelu ? "glu[gelu_tanh]" : "glu[silu]", "16u|x||up|", false, &op,
                           err));
    kv_val_op_shape(op, "(%lld, %lld)", (long long)(ctx->B * ctx->max_chunk),
                    (long long)ctx->inter);
    if (gate == NULL || up == NULL || want == NULL || bound == NULL || got == NULL) {
        st = val_oom(err);
        goto cleanup;
    }
    /* Gates far enough out that tanh and exp saturate at both ends. */
    kv_val_fill(v, gate, count, -12.0f, 12.0f, "validate.glu.gate");
    kv_val_fill(v, up, count, -2.0f, 2.0f, "validate.glu.up");
    gate[0] = 0.0f;
    for (int64_t i = 0; i < count; i++) {
        const float act = gelu ? kv_gelu_tanh(gate[i]) : kv_silu(gate[i]);
        want[i] = act * up[i];
        bound[i] = (float)(KV_VAL_GLU_U * KV_VAL_U * fabs((double)gate[i]) * fabs((double)up[i])) +
                   KV_VAL_TINY;
    }
    KV_TRY(kv_val_buf_alloc(v, &gb, "gate (B*n, inter)", (size_t)count * sizeof(float),
                            KV_VAL_POISON_BYTE, err));
    KV_TRY(kv_val_upload(v, gb.p, gate, (size_t)count * sizeof(float), err));
    KV_TRY(kv_val_upload(v, ctx->up, up, (size_t)count * sizeof(float), err));
    ctx->gate = (float *)gb.p;
    ctx->gemma = gelu;

    KV_TRY(kv_cuda_glu(ctx, count, err));

    KV_TRY(kv_val_download(v, got, gb.p, (size_t)count * sizeof(float), err));
    kv_val_check_floats(op, "gate (B*n, inter)", "glu", got, want, bound, count, ctx->inter);
    KV_TRY(kv_val_buf_check(v, op, &gb, err));
    KV_TRY(kv_val_dev_err(v, op, "glu", err));
cleanup:
    *ctx = saved;
    kv_val_buf_free(&gb);
    free(gate);
    free(up);
    free(want);
    free(bound);
    free(got);
    val_op_finish(v, op, st, err);
    return st;
}

/* ---- residual add ---- */

/* kv_cuda_add, x += y: one rounding, the same on both sides: bitwise. */
KvStatus kv_val_add(KvValRun *v, KvError *err) {
    KvStatus st = KV_OK;
    KvCudaCtx *ctx = v->ctx;
    const KvCudaCtx saved = *ctx;
    const int64_t count = ctx->B * ctx->max_chunk * ctx->hidden;
    KvCudaValidateOp *op = NULL;
    KvValBuf xb = {};
    float *x = (float *)kv_val_alloc(count, sizeof(float));    /* (B * n, hidden) */
    float *y = (float *)kv_val_alloc(count, sizeof(float));    /* (B * n, hidden) */
    float *want = (float *)kv_val_alloc(count, sizeof(float)); /* (B * n, hidden) */
    float *got = (float *)kv_val_alloc(count, sizeof(float));  /* (B * n, hidden) */
    KV_TRY(kv_val_op_begin(v, "add", NULL, true, &op, err));
    kv_val_op_shape(op, "(%lld, %lld)", (long long)(ctx->B * ctx->max_chunk),
                    (long long)ctx->hidden);
    if (x == NULL || y == NULL || want == NULL || got == NULL) {
        st = val_oom(err);
        goto cleanup;
    }
    kv_val_fill(v, x, count, -4.0f, 4.0f, "validate.add.x");
    kv_val_fill(v, y, count, -4.0f, 4.0f, "validate.add.y");
    for (int64_t i = 0; i < count; i++) want[i] = x[i] + y[i];
    KV_TRY(kv_val_buf_alloc(v, &xb, "x (B*n, hidden)", (size_t)count * sizeof(float),
                            KV_VAL_POISON_BYTE, err));
    KV_TRY(kv_val_upload(v, xb.p, x, (size_t)count * sizeof(float), err));
    KV_TRY(kv_val_upload(v, ctx->tmp, y, (size_t)count * sizeof(float), err));

    KV_TRY(kv_cuda_add(ctx, (float *)xb.p, ctx->tmp, count, err));

    KV_TRY(kv_val_download(v, got, xb.p, (size_t)count * sizeof(float), err));
    kv_val_check_floats(op, "x (B*n, hidden)", "add", got, want, NULL, count, ctx->hidden);
    KV_TRY(kv_val_buf_check(v, op, &xb, err));
    KV_TRY(kv_val_dev_err(v, op, "add", err));
cleanup:
    *ctx = saved;
    kv_val_buf_free(&xb);
    free(x);
    free(y);
    free(want);
    free(got);
    val_op_finish(v, op, st, err);
    return st;
}

/* ---- argmax and the position advance ---- */

/* kv_cuda_argmax_advance against kv_argmax, one case per batch row (B is
 * KV_VAL_B = 4): random logits; the maximum tied at three ids (the lowest
 * wins); the maximum at the last id with the runner-up at the first; a
 * constant row (id 0, margin 0). Token, margin, the next step's (B, 1)
 * input and realness, and *total += n: all bitwise. */
KvStatus kv_val_argmax(KvValRun *v, KvError *err) {
    KvStatus st = KV_OK;
    KvCudaCtx *ctx = v->ctx;
    const KvCudaCtx saved = *ctx;
    const int64_t B = ctx->B, V = ctx->vocab, len = 11, n = 3;
    const int64_t total_want = len + n;
    KvCudaValidateOp *op = NULL;
    KvValBuf lb = {}, tokb = {}, marb = {}, tinb = {}, rinb = {}, totb = {};
    float *logits = (float *)kv_val_alloc(B * V, sizeof(float));         /* (B, vocab) */
    int32_t *tok_want = (int32_t *)kv_val_alloc(B, sizeof(int32_t));     /* (B) */
    int32_t *tok_got = (int32_t *)kv_val_alloc(B, sizeof(int32_t));      /* (B) */
    int32_t *tin_got = (int32_t *)kv_val_alloc(B, sizeof(int32_t));      /* (B, 1) */
    float *mar_want = (float *)kv_val_alloc(B, sizeof(float));           /* (B) */
    float *mar_got = (float *)kv_val_alloc(B, sizeof(float));            /* (B) */
    uint8_t *rin_want = (uint8_t *)kv_val_alloc(B, 1);                   /* (B, 1) */
    uint8_t *rin_got = (uint8_t *)kv_val_alloc(B, 1);                    /* (B, 1) */
    int64_t total_got = -1;
    KV_TRY(kv_val_op_begin(v, "argmax", NULL, true, &op, err));
    kv_val_op_shape(op, "(%lld, %lld): random, 3-way tie, last id, constant", (long long)B,
                    (long long)V);
    if (logits == NULL || tok_want == NULL || tok_got == NULL || tin_got == NULL ||
        mar_want == NULL || mar_got == NULL || rin_want == NULL || rin_got == NULL) {
        st = val_oom(err);
        goto cleanup;
    }
    if (B < 4 || V < 8) {
        st = kv_error_set(err, KV_ERR_INTERNAL,
                          "cuda validate: argmax needs B >= 4 and vocab >= 8, have %lld and %lld",
                          (long long)B, (long long)V);
        goto cleanup;
    }
    kv_val_fill(v, logits, B * V, -5.0f, 5.0f, "validate.argmax.logits");
    logits[1 * V + V / 5] = 9.0f; /* ties: ids in different threads' strides */
    logits[1 * V + V / 2] = 9.0f;
    logits[1 * V + V - 1] = 9.0f;
    logits[2 * V + V - 1] = 9.0f;
    logits[2 * V + 0] = 8.5f;
    for (int64_t i = 0; i < V; i++) logits[3 * V + i] = 0.25f;
    for (int64_t b = 0; b < B; b++) {
        tok_want[b] = kv_argmax(logits + b * V, V, &mar_want[b]);
        rin_want[b] = 1;
    }
    KV_TRY(kv_val_buf_alloc(v, &lb, "logits (B, vocab)", (size_t)(B * V) * sizeof(float),
                            KV_VAL_POISON_BYTE, err));
    KV_TRY(kv_val_buf_alloc(v, &tokb, "next_tok (B)", (size_t)B * sizeof(int32_t),
                            KV_VAL_POISON_BYTE, err));
    KV_TRY(kv_val_buf_alloc(v, &marb, "margin (B)", (size_t)B * sizeof(float), KV_VAL_POISON_BYTE,
                            err));
    KV_TRY(kv_val_buf_alloc(v, &tinb, "tok_in (B, 1)", (size_t)B * sizeof(int32_t),
                            KV_VAL_POISON_BYTE, err));
    KV_TRY(kv_val_buf_alloc(v, &rinb, "real_in (B, 1)", (size_t)B, 0, err));
    KV_TRY(kv_val_buf_alloc(v, &totb, "total (1)", sizeof(int64_t), 0, err));
    KV_TRY(kv_val_upload(v, lb.p, logits, (size_t)(B * V) * sizeof(float), err));
    ctx->logits = (float *)lb.p;
    ctx->next_tok = (int32_t *)tokb.p;
    ctx->margin = (float *)marb.p;
    ctx->tok_in = (int32_t *)tinb.p;
    ctx->real_in = (uint8_t *)rinb.p;
    ctx->total = (int64_t *)totb.p;
    KV_TRY(kv_val_set_total(v, len, err)); /* the guarded scalar, now ctx->total */

    KV_TRY(kv_cuda_argmax_advance(ctx, n, err));

    KV_TRY(kv_val_download(v, tok_got, tokb.p, (size_t)B * sizeof(int32_t), err));
    KV_TRY(kv_val_download(v, mar_got, marb.p, (size_t)B * sizeof(float), err));
    KV_TRY(kv_val_download(v, tin_got, tinb.p, (size_t)B * sizeof(int32_t), err));
    KV_TRY(kv_val_download(v, rin_got, rinb.p, (size_t)B, err));
    KV_TRY(kv_val_download(v, &total_got, totb.p, sizeof total_got, err));
    kv_val_check_ints(op, "next_tok (B)", "argmax", tok_got, tok_want, B, sizeof(int32_t), 1);
    kv_val_check_floats(op, "margin (B)", "argmax", mar_got, mar_want, NULL, B, 1);
    kv_val_check_ints(op, "tok_in (B, 1)", "argmax", tin_got, tok_want, B, sizeof(int32_t), 1);
    kv_val_check_ints(op, "real_in (B, 1)", "argmax", rin_got, rin_want, B, 1, 1);
    kv_val_check_ints(op, "total (1)", "argmax, advance by 3 from 11", &total_got, &total_want, 1,
                      sizeof(int64_t), 1);
    KV_TRY(kv_val_buf_check(v, op, &lb, err));
    KV_TRY(kv_val_buf_check(v, op, &tokb, err));
    KV_TRY(kv_val_buf_check(v, op, &marb, err));
    KV_TRY(kv_val_buf_check(v, op, &tinb, err));
    KV_TRY(kv_val_buf_check(v, op, &rinb, err));
    KV_TRY(kv_val_buf_check(v, op, &totb, err));
    KV_TRY(kv_val_dev_err(v, op, "argmax", err));
cleanup:
    *ctx = saved;
    kv_val_buf_free(&lb);
    kv_val_buf_free(&tokb);
    kv_val_buf_free(&marb);
    kv_val_buf_free(&tinb);
    kv_val_buf_free(&rinb);
    kv_val_buf_free(&totb);
    free(logits);
    free(tok_want);
    free(tok_got);
    free(tin_got);
    free(mar_want);
    free(mar_got);
    free(rin_want);
    free(rin_got);
    val_op_finish(v, op, st, err);
    return st;
}
