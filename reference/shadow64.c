/* shadow64.c: the fp64 shadow of the reference forward, the yardstick of
 * fp32 rounding on a given model and sequence (shadow64.h says why and which
 * constants stay float32). Written to be read beside forward.c and kvmath.c:
 * the same ops in the same order, in double, over a whole sequence at once. */
#include "shadow64.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gemm.h"
#include "kvmath.h"

#if defined(__x86_64__) && defined(__GNUC__)
#define KV_SHADOW_X86 1
#include <immintrin.h>
#else
#define KV_SHADOW_X86 0
#endif

/* Activations of one row's whole sequence (n positions). */
typedef struct {
    double *x;      /* (n, hidden) residual stream */
    double *xn;     /* (n, hidden) normed input */
    double *q;      /* (n, num_heads * head_dim) after RoPE */
    double *k;      /* (n, num_kv_heads * head_dim) after RoPE */
    double *v;      /* (n, num_kv_heads * head_dim) */
    double *att;    /* (n, num_heads * head_dim) attention output */
    double *tmp;    /* (n, hidden) o_proj / down_proj output */
    double *gate;   /* (n, intermediate) in: gate projection, out: act(gate) * up */
    double *up;     /* (n, intermediate) */
    const float *layer_sinks; /* (num_heads) the current layer's gpt_oss sinks, or NULL */
    double *cos_t;  /* (2, n, head_dim / 2) cos(position * inv_freq[i]): [0] rope_theta's,
                     * [1] the sliding layers' (gemma3's rope_theta_local, else the same) */
    double *sin_t;  /* (2, n, head_dim / 2) */
    double *scores; /* (num_heads, n) one query's scores per head */
    /* gpt_oss's MoE, one position at a time (NULL for a dense MLP): */
    double *moe;    /* (num_experts + 3 * intermediate + hidden + 2 * experts_per_tok) */
} ShadowState;

/* rows x cols doubles, NULL on overflow or out of memory (at least one, so
 * a NULL always means failure). */
static double *shadow_alloc(int64_t rows, int64_t cols) {
    if (rows < 1) rows = 1;
    if (cols < 1) cols = 1;
    if (rows > (int64_t)(SIZE_MAX / sizeof(double)) / cols) return NULL;
    return malloc((size_t)(rows * cols) * sizeof(double));
}

static void shadow_state_free(ShadowState *s) {
    free(s->x);
    free(s->xn);
    free(s->q);
    free(s->k);
    free(s->v);
    free(s->att);
    free(s->tmp);
    free(s->gate);
    free(s->up);
    free(s->cos_t);
    free(s->sin_t);
    free(s->scores);
    free(s->moe);
    memset(s, 0, sizeof *s);
}

static bool shadow_state_init(ShadowState *s, const KvConfig *c, int64_t n) {
    const int64_t q_dim = c->num_heads * c->head_dim;
    const int64_t kv_dim = c->num_kv_heads * c->head_dim;
    memset(s, 0, sizeof *s);
    s->x = shadow_alloc(n, c->hidden_size);
    s->xn = shadow_alloc(n, c->hidden_size);
    s->q = shadow_alloc(n, q_dim);
    s->k = shadow_alloc(n, kv_dim);
    s->v = shadow_alloc(n, kv_dim);
    s->att = shadow_alloc(n, q_dim);
    s->tmp = shadow_alloc(n, c->hidden_size);
    s->gate = shadow_alloc(n, c->intermediate_size);
    s->up = shadow_alloc(n, c->intermediate_size);
    s->cos_t = shadow_alloc(2 * n, c->head_dim / 2);
    s->sin_t = shadow_alloc(2 * n, c->head_dim / 2);
    s->scores = shadow_alloc(c->num_heads, n);
    if (c->num_experts > 0) {
        s->moe = shadow_alloc(1, c->num_experts + 3 * c->intermediate_size + c->hidden_size +
                                     2 * c->experts_per_tok);
        if (s->moe == NULL) return false;
    }
    return s->x && s->xn && s->q && s->k && s->v && s->att && s->tmp && s->gate && s->up &&
           s->cos_t && s->sin_t && s->scores;
}

/* y[r, o] = sum_i x[r, i] * w[o, i] in ascending i, weights widened on the
 * fly. Threads split the outputs only; each element is one thread's
 * sequential sum, so the bits do not depend on the thread count. Eight
 * outputs sit in the lanes of one vector (a block of weight rows widened
 * once and transposed so their i-th elements are adjacent) and four input
 * rows run at once: each lane is still one output's ascending sum of
 * IEEE double products (the bits of one at a time), and 4 x 8 independent
 * chains hide the add latency of one. */
#define SHADOW_OUT_BLOCK 8
#define SHADOW_ROWS 4
typedef double ShadowLanes __attribute__((vector_size(SHADOW_OUT_BLOCK * sizeof(double))));

/* Outputs o0 .. o0 + n - 1 one at a time (a last partial block, or any
 * block when the widened copy could not be allocated). */
static void shadow_matmul_scalar(const double *x /* (rows, in) */, KvMat w /* (out, in) */,
                                 int64_t rows, int64_t in, int64_t out, int64_t o0, int64_t n,
                                 double *y /* (rows, out) */) {
    for (int64_t o = o0; o < o0 + n; o++) {
        for (int64_t r = 0; r < rows; r++) {
            const double *xr = x + r * in; /* (in) */
            double sum = 0.0;
            for (int64_t i = 0; i < in; i++) sum += xr[i] * (double)kv_mat_at(w, o * in + i);
            y[r * out + o] = sum;
        }
    }
}

/* Every row of x against one widened block wt of SHADOW_OUT_BLOCK outputs
 * from o0 on. Four rows run at once in named accumulators (GCC keeps an
 * array of vectors on the stack). Inlined into a plain, an AVX2 and an AVX-512
 * wrapper: the same IEEE double multiply then add per lane either way. */
static inline __attribute__((always_inline)) void
shadow_block_rows(const double *x /* (rows, in) */, const ShadowLanes *wt /* (in) */,
                  int64_t rows, int64_t in, int64_t out, int64_t o0,
                  double *y /* (rows, out) */) {
    int64_t r0 = 0;
    for (; r0 + SHADOW_ROWS <= rows; r0 += SHADOW_ROWS) {
        const double *x0 = x + r0 * in, *x1 = x0 + in, *x2 = x1 + in, *x3 = x2 + in; /* (in) */
        ShadowLanes a0 = {0.0}, a1 = {0.0}, a2 = {0.0}, a3 = {0.0};
        for (int64_t i = 0; i < in; i++) {
            a0 += x0[i] * wt[i]; /* the scalar splat to every lane */
            a1 += x1[i] * wt[i];
            a2 += x2[i] * wt[i];
            a3 += x3[i] * wt[i];
        }
        for (int k = 0; k < SHADOW_OUT_BLOCK; k++) {
            y[r0 * out + o0 + k] = a0[k];
            y[(r0 + 1) * out + o0 + k] = a1[k];
            y[(r0 + 2) * out + o0 + k] = a2[k];
            y[(r0 + 3) * out + o0 + k] = a3[k];
        }
    }
    for (; r0 < rows; r0++) {
        const double *xr = x + r0 * in; /* (in) */
        ShadowLanes acc = {0.0};
        for (int64_t i = 0; i < in; i++) acc += xr[i] * wt[i];
        for (int k = 0; k < SHADOW_OUT_BLOCK; k++) y[r0 * out + o0 + k] = acc[k];
    }
}

typedef void (*ShadowBlockFn)(const double *, const ShadowLanes *, int64_t, int64_t, int64_t,
                              int64_t, double *);

static void shadow_block_plain(const double *x, const ShadowLanes *wt, int64_t rows, int64_t in,
                               int64_t out, int64_t o0, double *y) {
    shadow_block_rows(x, wt, rows, in, out, o0, y);
}

#if KV_SHADOW_X86
/* The same code with AVX-512 enabled: a block's eight doubles in one
 * register, no contraction (-ffp-contract=off), so the bits are the plain
 * wrapper's; taken when the GEMM's path is (gemm.h). */
__attribute__((target("avx512f"))) static void
shadow_block_wide(const double *x, const ShadowLanes *wt, int64_t rows, int64_t in, int64_t out,
                  int64_t o0, double *y) {
    shadow_block_rows(x, wt, rows, in, out, o0, y);
}

/* And with AVX2, written out: GCC splits the eight-double vector type
 * into halves kept on the stack there. Each lane is the same IEEE double
 * multiply, then add (two instructions, never fused), in the same
 * ascending order as shadow_block_rows: the same bits. */
__attribute__((target("avx2"))) static void
shadow_block_avx2(const double *x, const ShadowLanes *wt, int64_t rows, int64_t in, int64_t out,
                  int64_t o0, double *y) {
    const double *w = (const double *)wt; /* (in, SHADOW_OUT_BLOCK), rows 64-byte aligned */
    int64_t r0 = 0;
    for (; r0 + SHADOW_ROWS <= rows; r0 += SHADOW_ROWS) {
        const double *x0 = x + r0 * in, *x1 = x0 + in, *x2 = x1 + in, *x3 = x2 + in; /* (in) */
        __m256d a0l = _mm256_setzero_pd(), a0h = _mm256_setzero_pd();
        __m256d a1l = _mm256_setzero_pd(), a1h = _mm256_setzero_pd();
        __m256d a2l = _mm256_setzero_pd(), a2h = _mm256_setzero_pd();
        __m256d a3l = _mm256_setzero_pd(), a3h = _mm256_setzero_pd();
        for (int64_t i = 0; i < in; i++) {
            const __m256d wl = _mm256_load_pd(w + i * SHADOW_OUT_BLOCK);
            const __m256d wh = _mm256_load_pd(w + i * SHADOW_OUT_BLOCK + 4);
            __m256d b = _mm256_broadcast_sd(x0 + i);
            a0l = _mm256_add_pd(a0l, _mm256_mul_pd(b, wl));
            a0h = _mm256_add_pd(a0h, _mm256_mul_pd(b, wh));
            b = _mm256_broadcast_sd(x1 + i);
            a1l = _mm256_add_pd(a1l, _mm256_mul_pd(b, wl));
            a1h = _mm256_add_pd(a1h, _mm256_mul_pd(b, wh));
            b = _mm256_broadcast_sd(x2 + i);
            a2l = _mm256_add_pd(a2l, _mm256_mul_pd(b, wl));
            a2h = _mm256_add_pd(a2h, _mm256_mul_pd(b, wh));
            b = _mm256_broadcast_sd(x3 + i);
            a3l = _mm256_add_pd(a3l, _mm256_mul_pd(b, wl));
            a3h = _mm256_add_pd(a3h, _mm256_mul_pd(b, wh));
        }
        double *y0 = y + r0 * out + o0; /* (4 rows, 8) at stride out */
        _mm256_storeu_pd(y0, a0l);
        _mm256_storeu_pd(y0 + 4, a0h);
        _mm256_storeu_pd(y0 + out, a1l);
        _mm256_storeu_pd(y0 + out + 4, a1h);
        _mm256_storeu_pd(y0 + 2 * out, a2l);
        _mm256_storeu_pd(y0 + 2 * out + 4, a2h);
        _mm256_storeu_pd(y0 + 3 * out, a3l);
        _mm256_storeu_pd(y0 + 3 * out + 4, a3h);
    }
    for (; r0 < rows; r0++) {
        const double *xr = x + r0 * in; /* (in) */
        __m256d al = _mm256_setzero_pd(), ah = _mm256_setzero_pd();
        for (int64_t i = 0; i < in; i++) {
            const __m256d b = _mm256_broadcast_sd(xr + i);
            al = _mm256_add_pd(al, _mm256_mul_pd(b, _mm256_load_pd(w + i * SHADOW_OUT_BLOCK)));
            ah = _mm256_add_pd(ah, _mm256_mul_pd(b, _mm256_load_pd(w + i * SHADOW_OUT_BLOCK + 4)));
        }
        _mm256_storeu_pd(y + r0 * out + o0, al);
        _mm256_storeu_pd(y + r0 * out + o0 + 4, ah);
    }
}
#endif

static ShadowBlockFn shadow_block_fn(void) {
#if KV_SHADOW_X86
    if (kv_gemm_path() == KV_GEMM_AVX512) return shadow_block_wide;
    if (kv_gemm_path() == KV_GEMM_AVX2) return shadow_block_avx2;
#endif
    return shadow_block_plain;
}

static void shadow_matmul(const double *x /* (rows, in) */, KvMat w /* (out, in) as stored */,
                          int64_t rows, int64_t in, int64_t out, double *y /* (rows, out) */) {
    const int64_t blocks = (out + SHADOW_OUT_BLOCK - 1) / SHADOW_OUT_BLOCK;
    const ShadowBlockFn block = shadow_block_fn();
#pragma omp parallel if (rows * in * out >= kv_parallel_min_work())
    {
        /* (in) lanes, aligned for the vector type: a block widened and
         * transposed, per thread */
        ShadowLanes *wt = aligned_alloc(sizeof *wt, (size_t)in * sizeof *wt + sizeof *wt);
        /* (SHADOW_OUT_BLOCK, in): the block's rows as F32; F32 is read in place */
        float *rows32 = w.dtype != KV_DTYPE_F32
                            ? malloc((size_t)(SHADOW_OUT_BLOCK * in) * sizeof(float) + 1)
                            : NULL;
#pragma omp for schedule(static)
        for (int64_t blk = 0; blk < blocks; blk++) {
            const int64_t o0 = blk * SHADOW_OUT_BLOCK;
            const int64_t n = out - o0 < SHADOW_OUT_BLOCK ? out - o0 : SHADOW_OUT_BLOCK;
            if (n < SHADOW_OUT_BLOCK || wt == NULL ||
                (w.dtype != KV_DTYPE_F32 && rows32 == NULL)) {
                shadow_matmul_scalar(x, w, rows, in, out, o0, n, y);
                continue;
            }
            const float *wb = kv_mat_rows(w, in, o0, n, rows32); /* (n, in) */
            for (int k = 0; k < SHADOW_OUT_BLOCK; k++) {
                const float *src = wb + k * in; /* (in) one weight row, read in order */
                for (int64_t i = 0; i < in; i++) wt[i][k] = (double)src[i];
            }
            block(x, wt, rows, in, out, o0, y);
        }
        free(rows32);
        free(wt);
    }
}

/* kv_rmsnorm in double: x * 1/sqrt(mean(x^2) + eps), times (1 + w) for
 * gemma2 (weights stored as the offset from 1), w times it otherwise. */
static void shadow_rmsnorm(const double *x /* (n) */, const float *w /* (n) */, int64_t n,
                           double eps, bool offset, double *out /* (n) */) {
    double ss = 0.0;
    for (int64_t i = 0; i < n; i++) ss += x[i] * x[i];
    const double r = 1.0 / sqrt(ss / (double)n + eps);
    for (int64_t i = 0; i < n; i++) {
        const double xn = x[i] * r;
        out[i] = offset ? xn * (1.0 + (double)w[i]) : (double)w[i] * xn;
    }
}

static void shadow_norm_rows(const KvConfig *c, const double *in /* (rows, hidden) */,
                             const float *w /* (hidden) */, int64_t rows,
                             double *out /* (rows, hidden); may equal in */) {
    const int64_t h = c->hidden_size;
    /* eps is a Python float that torch rounds to float32 when it adds it,
     * as the reference does: a model constant, kept as float32. */
    const double eps = (double)(float)c->rms_norm_eps;
    for (int64_t r = 0; r < rows; r++) {
        shadow_rmsnorm(in + r * h, w, h, eps, kv_config_gemma_style(c), out + r * h);
    }
}

/* gemma3's q_norm / k_norm: a (1 + w) RMSNorm of each of `rows` head
 * vectors (head_dim values each) in place. */
static void shadow_norm_heads(const KvConfig *c, double *x /* (rows, head_dim) */,
                              const float *w /* (head_dim) */, int64_t rows) {
    const int64_t hd = c->head_dim;
    for (int64_t r = 0; r < rows; r++) {
        shadow_rmsnorm(x + r * hd, w, hd, (double)(float)c->rms_norm_eps, true, x + r * hd);
    }
}

/* cap * tanh(x / cap); cap <= 0 means none (kv_softcap). */
static double shadow_softcap(double x, double cap) {
    return cap > 0.0 ? tanh(x / cap) * cap : x;
}

static double shadow_gelu_tanh(double x) {
    const double k_beta = 0.79788456080286535588; /* sqrt(2 / pi) */
    const double k_kappa = 0.044715;
    return 0.5 * x * (1.0 + tanh(k_beta * (x + k_kappa * x * x * x)));
}

static double shadow_silu(double x) {
    return x / (1.0 + exp(-x));
}

/* RoPE tables: position p (the p-th real token) rotates pair i by
 * p * inv_freq[i]. inv_freq is transformers' float32 one (kv_rope_inv_freq),
 * a model constant; the angle and its cos/sin are double. */
static void shadow_rope_tables(const KvConfig *c, const float *inv_f /* (head_dim / 2) */,
                               int64_t n, double *cos_t /* (n, head_dim / 2) */,
                               double *sin_t /* (n, head_dim / 2) */) {
    const int64_t half = c->head_dim / 2;
    /* YaRN's attention factor on cos and sin: a model constant, in float32
     * as torch multiplies it (1 otherwise) */
    const double scale = (double)kv_rope_scale(c);
    for (int64_t p = 0; p < n; p++) {
        for (int64_t i = 0; i < half; i++) {
            const double angle = (double)p * (double)inv_f[i];
            cos_t[p * half + i] = cos(angle) * scale;
            sin_t[p * half + i] = sin(angle) * scale;
        }
    }
}

/* Rotates `heads` head vectors of every position in place (rotate_half,
 * non-interleaved, as kv_rope_apply). */
static void shadow_rope(const KvConfig *c, const double *cos_t /* (n, hd / 2) */,
                        const double *sin_t /* (n, hd / 2) */, double *x /* (n, heads, hd) */,
                        int64_t n, int64_t heads) {
    const int64_t hd = c->head_dim;
    const int64_t half = hd / 2;
    for (int64_t p = 0; p < n; p++) {
        for (int64_t h = 0; h < heads; h++) {
            double *xh = x + (p * heads + h) * hd; /* (hd) */
            for (int64_t i = 0; i < half; i++) {
                const double cs = cos_t[p * half + i];
                const double sn = sin_t[p * half + i];
                const double a = xh[i];
                const double b = xh[i + half];
                xh[i] = a * cs - b * sn;
                xh[i + half] = b * cs + a * sn;
            }
        }
    }
}

/* Causal attention over the whole sequence with the layer's window (DESIGN
 * §2: query q sees q - W < k <= q; a full layer every k <= q): softcapped
 * scaled scores, softmax, weighted sum of values. */
static void shadow_attention(const KvConfig *c, ShadowState *s, int64_t layer, int64_t n) {
    const int64_t hd = c->head_dim;
    const int64_t q_dim = c->num_heads * hd;
    const int64_t kv_dim = c->num_kv_heads * hd;
    const int64_t window = kv_config_layer_window(c, layer);
    /* The scale and the cap as torch applies them to float32 scores: model
     * constants rounded to float32, like every fp32 implementation's. */
    const double scale = (double)kv_config_attn_scale(c);
    const double cap = (double)(float)c->attn_logit_softcapping;
    const float *sinks = s->layer_sinks; /* (num_heads) gpt_oss's, else NULL */
#pragma omp parallel for schedule(static) \
    if (c->num_heads * n * n * hd >= kv_parallel_min_work())
    for (int64_t h = 0; h < c->num_heads; h++) {
        const int64_t kvh = kv_gqa_kv_head(h, c->num_heads, c->num_kv_heads);
        double *sc = s->scores + h * n; /* (n) */
        for (int64_t qp = 0; qp < n; qp++) {
            const double *q = s->q + qp * q_dim + h * hd; /* (hd) */
            double *out = s->att + qp * q_dim + h * hd;   /* (hd) */
            const int64_t lo = window > 0 && qp - window + 1 > 0 ? qp - window + 1 : 0;
            /* gpt_oss: the sink joins the max and the sum, its share dropped */
            const double sink = sinks != NULL ? (double)sinks[h] : -INFINITY;
            double mx = sink;
            /* Each key's dot is one ascending sum over d; four keys' sums
             * run side by side (a lone sum waits on every add). */
            int64_t kp = lo;
            for (; kp + 4 <= qp + 1; kp += 4) {
                const double *k0 = s->k + kp * kv_dim + kvh * hd; /* (4 keys, hd) */
                const double *k1 = k0 + kv_dim, *k2 = k1 + kv_dim, *k3 = k2 + kv_dim;
                double d0 = 0.0, d1 = 0.0, d2 = 0.0, d3 = 0.0;
                for (int64_t d = 0; d < hd; d++) {
                    d0 += q[d] * k0[d];
                    d1 += q[d] * k1[d];
                    d2 += q[d] * k2[d];
                    d3 += q[d] * k3[d];
                }
                sc[kp] = d0;
                sc[kp + 1] = d1;
                sc[kp + 2] = d2;
                sc[kp + 3] = d3;
            }
            for (; kp <= qp; kp++) {
                const double *k = s->k + kp * kv_dim + kvh * hd; /* (hd) */
                double dot = 0.0;
                for (int64_t d = 0; d < hd; d++) dot += q[d] * k[d];
                sc[kp] = dot;
            }
            for (kp = lo; kp <= qp; kp++) {
                sc[kp] = shadow_softcap(sc[kp] * scale, cap);
                mx = sc[kp] > mx ? sc[kp] : mx;
            }
            double sum = 0.0;
            for (int64_t kp = lo; kp <= qp; kp++) {
                sc[kp] = exp(sc[kp] - mx);
                sum += sc[kp];
            }
            if (sinks != NULL) sum += exp(sink - mx);
            for (int64_t d = 0; d < hd; d++) out[d] = 0.0;
            for (int64_t kp = lo; kp <= qp; kp++) {
                const double p = sc[kp] / sum;
                const double *v = s->v + kp * kv_dim + kvh * hd; /* (hd) */
                for (int64_t d = 0; d < hd; d++) out[d] += p * v[d];
            }
        }
    }
}

static void shadow_add(double *x /* (count) */, const double *y /* (count) */, int64_t count) {
    for (int64_t i = 0; i < count; i++) x[i] += y[i];
}

/* y[r, :] += b (the bias as stored, a model constant). */
static void shadow_bias(double *y /* (rows, out) */, const float *b /* (out) */, int64_t rows,
                        int64_t out) {
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t i = 0; i < out; i++) y[r * out + i] += (double)b[i];
    }
}

/* gpt_oss's MoE block (forward.c's op_moe) in double, s->xn into s->tmp:
 * router logits, the experts_per_tok largest (ties to the lowest id), their
 * softmax, then the chosen experts in ascending id, each a clamped SwiGLU
 * with its biases, weighted and summed. The limit and alpha are model
 * constants taken in float32, as torch applies them. A router near-tie can
 * pick other experts here than in fp32: the yardstick then reads high, on
 * the safe side. */
static void shadow_moe(const KvConfig *c, const KvLayerWeights *w, ShadowState *s, int64_t n) {
    const int64_t H = c->hidden_size, I = c->intermediate_size, E = c->num_experts;
    const int64_t K = c->experts_per_tok;
    const double limit = (double)(float)c->swiglu_limit, alpha = (double)(float)c->swiglu_alpha;
    double *logits = s->moe;      /* (E) */
    double *gu = logits + E;      /* (2I) */
    double *hh = gu + 2 * I;      /* (I) */
    double *out = hh + I;         /* (H) */
    double *weight = out + H;     /* (K) */
    double *pick = weight + K;    /* (K) expert ids, as doubles */
    for (int64_t p = 0; p < n; p++) {
        const double *x = s->xn + p * H; /* (H) */
        double *acc = s->tmp + p * H;    /* (H) */
        shadow_matmul(x, kv_mat_f32(w->router_w), 1, H, E, logits);
        for (int64_t e = 0; e < E; e++) logits[e] += (double)w->router_b[e];
        double mx = -INFINITY;
        for (int64_t k = 0; k < K; k++) {
            int64_t best = -1;
            for (int64_t e = 0; e < E; e++) {
                bool taken = false;
                for (int64_t j = 0; j < k && !taken; j++) taken = (int64_t)pick[j] == e;
                if (!taken && (best < 0 || logits[e] > logits[best])) best = e;
            }
            pick[k] = (double)best;
            weight[k] = logits[best];
            mx = weight[k] > mx ? weight[k] : mx;
        }
        double sum = 0.0;
        for (int64_t k = 0; k < K; k++) {
            weight[k] = exp(weight[k] - mx);
            sum += weight[k];
        }
        for (int64_t i = 0; i < H; i++) acc[i] = 0.0;
        for (int64_t e = 0; e < E; e++) {
            int64_t rank = -1;
            for (int64_t k = 0; k < K; k++) {
                if ((int64_t)pick[k] == e) rank = k;
            }
            if (rank < 0) continue;
            shadow_matmul(x, kv_mat_skip(w->experts_gate_up, e * 2 * I * H), 1, H, 2 * I, gu);
            const float *bgu = w->experts_gate_up_b + e * 2 * I; /* (2I) */
            for (int64_t j = 0; j < I; j++) {
                double gate = gu[2 * j] + (double)bgu[2 * j];
                double up = gu[2 * j + 1] + (double)bgu[2 * j + 1];
                gate = gate > limit ? limit : gate;
                up = up > limit ? limit : (up < -limit ? -limit : up);
                hh[j] = (up + 1.0) * (gate / (1.0 + exp(-(gate * alpha))));
            }
            shadow_matmul(hh, kv_mat_skip(w->experts_down, e * H * I), 1, I, H, out);
            const float *bd = w->experts_down_b + e * H; /* (H) */
            const double wt = weight[rank] / sum;
            for (int64_t i = 0; i < H; i++) acc[i] += (out[i] + (double)bd[i]) * wt;
        }
    }
}

/* One decoder layer over all n positions (forward.c's launch_layer). */
static void shadow_layer(const KvConfig *c, const KvLayerWeights *w, ShadowState *s,
                         int64_t layer, int64_t n) {
    const int64_t hidden = c->hidden_size;
    const int64_t inter = c->intermediate_size;
    const int64_t q_dim = c->num_heads * c->head_dim;
    const int64_t kv_dim = c->num_kv_heads * c->head_dim;
    const bool gemma = kv_config_gemma_style(c);

    shadow_norm_rows(c, s->x, w->input_norm, n, s->xn);
    shadow_matmul(s->xn, w->wq, n, hidden, q_dim, s->q);
    shadow_matmul(s->xn, w->wk, n, hidden, kv_dim, s->k);
    shadow_matmul(s->xn, w->wv, n, hidden, kv_dim, s->v);
    if (c->attn_qkv_bias) { /* qwen2: after the product, as torch's linear */
        shadow_bias(s->q, w->bq, n, q_dim);
        shadow_bias(s->k, w->bk, n, kv_dim);
        shadow_bias(s->v, w->bv, n, kv_dim);
    }
    if (c->qk_norm) { /* gemma3: (1 + w) per head, before RoPE */
        shadow_norm_heads(c, s->q, w->q_norm, n * c->num_heads);
        shadow_norm_heads(c, s->k, w->k_norm, n * c->num_kv_heads);
    }
    /* the layer's table: [1] on sliding layers (gemma3's own base) */
    const size_t tab = c->layer_sliding[layer] ? (size_t)(n * (c->head_dim / 2)) : 0;
    shadow_rope(c, s->cos_t + tab, s->sin_t + tab, s->q, n, c->num_heads);
    shadow_rope(c, s->cos_t + tab, s->sin_t + tab, s->k, n, c->num_kv_heads);
    s->layer_sinks = w->sinks;
    shadow_attention(c, s, layer, n);
    shadow_matmul(s->att, w->wo, n, q_dim, hidden, s->tmp);
    if (c->attn_o_bias) shadow_bias(s->tmp, w->bo, n, hidden); /* gpt_oss */
    if (gemma) {
        /* h = x + post_attention_layernorm(attn(...)) */
        shadow_norm_rows(c, s->tmp, w->post_attn_norm, n, s->tmp);
        shadow_add(s->x, s->tmp, n * hidden);
        shadow_norm_rows(c, s->x, w->pre_ffw_norm, n, s->xn);
    } else {
        shadow_add(s->x, s->tmp, n * hidden);
        shadow_norm_rows(c, s->x, w->post_attn_norm, n, s->xn);
    }
    if (c->num_experts > 0) {
        shadow_moe(c, w, s, n);
    } else {
        shadow_matmul(s->xn, w->w_gate, n, hidden, inter, s->gate);
        shadow_matmul(s->xn, w->w_up, n, hidden, inter, s->up);
        for (int64_t i = 0; i < n * inter; i++) {
            const double act = gemma ? shadow_gelu_tanh(s->gate[i]) : shadow_silu(s->gate[i]);
            s->gate[i] = act * s->up[i];
        }
        shadow_matmul(s->gate, w->w_down, n, inter, hidden, s->tmp);
    }
    if (gemma) shadow_norm_rows(c, s->tmp, w->post_ffw_norm, n, s->tmp);
    shadow_add(s->x, s->tmp, n * hidden);
}

/* kv_shadow64_logits of row `row`, calling progress (NULL: none) after each
 * layer. */
static KvStatus shadow_logits(const KvModel *m, const int32_t *tokens, int64_t n, int64_t from,
                              double *logits, const KvShadowProgress *progress, int64_t row,
                              KvError *err) {
    if (m == NULL || tokens == NULL || logits == NULL) {
        return kv_error_set(err, KV_ERR_INPUT, "shadow64: expected a model, tokens and logits, "
                                               "found a NULL pointer");
    }
    if (n < 1 || from < 0 || from >= n) {
        return kv_error_set(err, KV_ERR_INPUT,
                            "shadow64: expected n >= 1 tokens and 0 <= from < n, found n %lld, "
                            "from %lld",
                            (long long)n, (long long)from);
    }
    const KvConfig *c = &m->config;
    for (int64_t p = 0; p < n; p++) {
        if (tokens[p] < 0 || tokens[p] >= c->vocab_size) {
            return kv_error_set(err, KV_ERR_INPUT,
                                "shadow64: tokens: position %lld: expected a token id in "
                                "[0, %lld), found %d",
                                (long long)p, (long long)c->vocab_size, tokens[p]);
        }
    }
    const int64_t hidden = c->hidden_size;
    KvStatus st = KV_OK;
    ShadowState s;
    if (!shadow_state_init(&s, c, n)) {
        st = kv_error_set(err, KV_ERR_INTERNAL, "shadow64: out of memory (%lld positions)",
                          (long long)n);
        goto cleanup;
    }
    /* gemma2 scales embeddings by sqrt(hidden) rounded to the activation
     * dtype (float32 for these checkpoints), as forward.c's op_embed and
     * transformers' embed_scale do: part of the model, kept as float32. */
    const double normalizer =
        kv_config_gemma_style(c) ? (double)(float)sqrt((double)hidden) : 1.0;
    for (int64_t p = 0; p < n; p++) {
        const int64_t e = (int64_t)tokens[p] * hidden; /* the token's embedding row */
        for (int64_t i = 0; i < hidden; i++) {
            s.x[p * hidden + i] = (double)kv_mat_at(m->embed, e + i) * normalizer;
        }
    }
    const size_t tab = (size_t)(n * (c->head_dim / 2));
    float inv_f[KV_CONFIG_MAX_HEAD_DIM / 2]; /* (head_dim / 2) transformers' float32 one */
    kv_rope_layer_inv_freq(c, -1, inv_f);     /* rope_theta's (gpt_oss: YaRN's) */
    shadow_rope_tables(c, inv_f, n, s.cos_t, s.sin_t);
    if (c->rope_theta_local > 0.0) kv_rope_inv_freq(c->head_dim, c->rope_theta_local, inv_f);
    shadow_rope_tables(c, inv_f, n, s.cos_t + tab, s.sin_t + tab);
    for (int64_t l = 0; l < c->num_layers; l++) {
        shadow_layer(c, &m->layers[l], &s, l, n);
        if (progress != NULL && progress->fn != NULL) progress->fn(progress->ctx, row, l);
    }
    /* Final norm, lm_head and softcap only where logits are asked for. */
    const double final_cap = (double)(float)c->final_logit_softcapping;
    /* every asked-for position at once: the lm_head's weight block is then
     * widened once for all of them (each logit is still one sum) */
    double *last = s.xn + from * hidden; /* (n - from, hidden) the final-normed states */
    shadow_norm_rows(c, s.x + from * hidden, m->final_norm, n - from, last);
    shadow_matmul(last, m->lm_head, n - from, hidden, c->vocab_size, logits);
    for (int64_t i = 0; i < (n - from) * c->vocab_size; i++) {
        logits[i] = shadow_softcap(logits[i], final_cap);
    }
cleanup:
    shadow_state_free(&s);
    return st;
}

KvStatus kv_shadow64_logits(const KvModel *m, const int32_t *tokens, int64_t n, int64_t from,
                            double *logits, KvError *err) {
    return shadow_logits(m, tokens, n, from, logits, NULL, 0, err);
}

/* Checks a recorded decode's inputs before any shadow runs, so a bad call
 * names the step, row and element instead of a shadow position. */
static KvStatus shadow_check_decode(const KvModel *m, int64_t batch, int64_t prompt_len,
                                    const int32_t *prompt /* (B, P) */,
                                    const uint8_t *real /* (B, P) */, int64_t steps,
                                    const int32_t *fed /* (steps, B) */,
                                    const float *logits /* (steps, B, vocab) */, KvError *err) {
    const int64_t vocab = m->config.vocab_size;
    for (int64_t b = 0; b < batch; b++) {
        /* Left pads, real tokens, then (right padding) trailing pads: the
         * shadow runs the row alone on its real tokens either way. */
        bool seen_real = false, trailing = false;
        for (int64_t i = 0; i < prompt_len; i++) {
            const int32_t tok = prompt[b * prompt_len + i];
            if (!real[b * prompt_len + i]) {
                trailing = trailing || seen_real;
                continue;
            }
            if (trailing) {
                return kv_error_set(err, KV_ERR_INPUT,
                                    "shadow64: prompt row %lld position %lld: a real token after "
                                    "a trailing pad (rows are left pads, real tokens, then pads)",
                                    (long long)b, (long long)i);
            }
            seen_real = true;
            if (tok < 0 || tok >= vocab) {
                return kv_error_set(err, KV_ERR_INPUT,
                                    "shadow64: prompt row %lld position %lld: expected a token "
                                    "id in [0, %lld), found %d",
                                    (long long)b, (long long)i, (long long)vocab, tok);
            }
        }
        if (!seen_real) {
            return kv_error_set(err, KV_ERR_INPUT,
                                "shadow64: prompt row %lld: expected at least one real token, "
                                "found only pads",
                                (long long)b);
        }
    }
    for (int64_t s = 0; s + 1 < steps; s++) {
        for (int64_t b = 0; b < batch; b++) {
            const int32_t tok = fed[s * batch + b];
            if (tok < 0 || tok >= vocab) {
                return kv_error_set(err, KV_ERR_INPUT,
                                    "shadow64: fed token after step %lld row %lld: expected a "
                                    "token id in [0, %lld), found %d",
                                    (long long)s, (long long)b, (long long)vocab, tok);
            }
        }
    }
    for (int64_t s = 0; s < steps; s++) {
        for (int64_t b = 0; b < batch; b++) {
            const float *row = logits + (s * batch + b) * vocab; /* (vocab) */
            for (int64_t i = 0; i < vocab; i++) {
                if (!isfinite(row[i])) {
                    return kv_error_set(err, KV_ERR_INPUT,
                                        "shadow64: logits step %lld row %lld index %lld: "
                                        "expected a finite value, found %g",
                                        (long long)s, (long long)b, (long long)i, (double)row[i]);
                }
            }
        }
    }
    return KV_OK;
}

KvStatus kv_shadow64_rel_error(const KvModel *m, int64_t batch, int64_t prompt_len,
                               const int32_t *prompt, const uint8_t *prompt_real, int64_t steps,
                               const int32_t *fed, const float *logits, double *per_step,
                               double *max_rel, KvError *err) {
    return kv_shadow64_rel_error_watched(m, batch, prompt_len, prompt, prompt_real, steps, fed,
                                         logits, per_step, max_rel, NULL, err);
}

KvStatus kv_shadow64_rel_error_watched(const KvModel *m, int64_t batch, int64_t prompt_len,
                                       const int32_t *prompt, const uint8_t *prompt_real,
                                       int64_t steps, const int32_t *fed, const float *logits,
                                       double *per_step, double *max_rel,
                                       const KvShadowProgress *progress, KvError *err) {
    if (m == NULL || prompt == NULL || prompt_real == NULL || fed == NULL || logits == NULL ||
        max_rel == NULL) {
        return kv_error_set(err, KV_ERR_INPUT, "shadow64: expected a model, a prompt, fed "
                                               "tokens, logits and max_rel, found a NULL pointer");
    }
    if (batch < 1 || prompt_len < 1 || steps < 1) {
        return kv_error_set(err, KV_ERR_INPUT,
                            "shadow64: expected batch >= 1, prompt length >= 1 and steps >= 1, "
                            "found %lld, %lld, %lld",
                            (long long)batch, (long long)prompt_len, (long long)steps);
    }
    KvStatus st = shadow_check_decode(m, batch, prompt_len, prompt, prompt_real, steps, fed,
                                      logits, err);
    if (st != KV_OK) return st;
    const int64_t vocab = m->config.vocab_size;
    int32_t *seq = malloc((size_t)(prompt_len + steps) * sizeof *seq); /* (n) one row's tokens */
    double *sh = shadow_alloc(steps, vocab);                            /* (steps, vocab) */
    if (seq == NULL || sh == NULL) {
        st = kv_error_set(err, KV_ERR_INTERNAL, "shadow64: out of memory (%lld steps)",
                          (long long)steps);
        goto cleanup;
    }
    *max_rel = 0.0;
    for (int64_t s = 0; per_step != NULL && s < steps; s++) per_step[s] = 0.0;
    for (int64_t b = 0; b < batch; b++) {
        /* The row as the model sees it: its real prompt tokens, then what the
         * decode fed after each step but the last. */
        int64_t n = 0;
        for (int64_t i = 0; i < prompt_len; i++) {
            if (prompt_real[b * prompt_len + i]) seq[n++] = prompt[b * prompt_len + i];
        }
        const int64_t from = n - 1; /* the prefill's last position: step 0 */
        for (int64_t s = 0; s + 1 < steps; s++) seq[n++] = fed[s * batch + b];
        st = shadow_logits(m, seq, n, from, sh, progress, b, err);
        if (st != KV_OK) goto cleanup;
        for (int64_t s = 0; s < steps; s++) {
            const float *ref = logits + (s * batch + b) * vocab; /* (vocab) */
            const double *ex = sh + s * vocab;                   /* (vocab) */
            double max_abs = 0.0, max_ex = 0.0;
            for (int64_t i = 0; i < vocab; i++) {
                if (!isfinite(ex[i])) {
                    st = kv_error_set(err, KV_ERR_INTERNAL,
                                      "shadow64: step %lld row %lld index %lld: the shadow's "
                                      "logit is not finite (%g)",
                                      (long long)s, (long long)b, (long long)i, ex[i]);
                    goto cleanup;
                }
                const double d = fabs((double)ref[i] - ex[i]);
                max_abs = d > max_abs ? d : max_abs;
                max_ex = fabs(ex[i]) > max_ex ? fabs(ex[i]) : max_ex;
            }
            const double rel = max_abs / (max_ex > 0.0 ? max_ex : 1.0);
            if (per_step != NULL && rel > per_step[s]) per_step[s] = rel;
            if (rel > *max_rel) *max_rel = rel;
        }
    }
cleanup:
    free(seq);
    free(sh);
    return st;
}
