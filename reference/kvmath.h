/* kvmath.h: the reference's numeric building blocks (DESIGN §1, §2, §4).
 *
 * Everything is F32 with -ffp-contract=off and no fast-math. Every reduction
 * has a fixed order that depends only on the length of the data, never on the
 * thread count, so the reference is bitwise reproducible for any
 * OMP_NUM_THREADS. The dot-product pattern (KV_DOT_LANES partial sums) is the
 * one documented contract that lets the compiler vectorize without changing
 * results. */
#ifndef KV_MATH_H
#define KV_MATH_H

#include <stdbool.h>
#include <stdint.h>

#include "status.h"
#include "config.h"
#include "kvparallel.h"
#include "weight.h"

/* KV_DOT_LANES, the dot-product pattern, and the parallel threshold. */

float kv_dot(const float *a /* (n) */, const float *b /* (n) */, int64_t n);

/* y[r, o] = dot(x[r, :], w[o, :]) for every row r and output o.
 * x: (rows, in), w: (out, in) row-major as torch Linear stores it, y: (rows, out).
 * Each y element is bitwise one kv_dot. One row (a decode step): the row
 * kernel here, parallel (OpenMP) over blocks of outputs. Several rows: the
 * blocked GEMM (gemm.h), parallel over blocks of outputs and rows, on the
 * fastest path this CPU runs; the path never changes a bit. */
void kv_matmul(const float *x, const float *w, int64_t rows, int64_t in, int64_t out, float *y);

/* kv_matmul with w as stored (weight.h): BF16 and F16 rows are widened to
 * F32 as the kernels read them, which is exact, so every y element is the
 * bits kv_matmul gives on the F32 copy of w. */
void kv_matmul_mat(const float *x, KvMat w, int64_t rows, int64_t in, int64_t out, float *y);

/* kv_dot(x, row `row` of w widened, n): the same bits, the row widened a
 * chunk at a time (no allocation). */
float kv_dot_mat(const float *x /* (n) */, KvMat w /* (rows, n) */, int64_t row, int64_t n);

/* Several matmuls of the same input in one parallel region (q/k/v, gate/up):
 * ys[j] = x @ ws[j]^T with ws[j]: (outs[j], in), ys[j]: (rows, outs[j]).
 * Every element is exactly what kv_matmul computes; only the fork/join is
 * shared, which is what a memory-bound decode step pays for per region. */
void kv_matmul_multi(const float *x, int64_t rows, int64_t in, int count, const KvMat *ws,
                     const int64_t *outs, float *const *ys);

/* Planted fault KV_FAULT_TF32 (fault.h), the CPU analog of TF32 in cuBLAS:
 * kv_matmul with both inputs first rounded to TF32 (10 mantissa bits, round
 * to nearest even), accumulation still in F32. KV_ERR_INTERNAL when the
 * scratch cannot be allocated (y is then left untouched). */
KvStatus kv_matmul_tf32(const float *x, KvMat w, int64_t rows, int64_t in, int64_t out,
                        float *y);
/* An ensemble order (KV_ORDER_DOT_SEQUENTIAL, ensemble.h): kv_matmul with
 * each output one accumulator summed in ascending i, the naive kernel's
 * order instead of the 16-lane pattern. Equally correct, not bitwise equal:
 * the spread between it and kv_matmul is part of what calibrates the
 * tolerances. Parallel over outputs only, so thread-count independent. */
void kv_matmul_sequential(const float *x, KvMat w, int64_t rows, int64_t in, int64_t out,
                          float *y);

/* f rounded to TF32 (NaN and infinities unchanged). */
float kv_round_tf32(float f);

/* RMSNorm over n elements: x * rsqrt(mean(x^2) + eps), then times (1 + w)
 * (gemma2, offset = true) or times w (mistral, offset = false). The sum of
 * squares uses the kv_dot pattern; the mean divides by n in F32. */
void kv_rmsnorm(const float *x /* (n) */, const float *w /* (n) */, int64_t n, float eps,
                bool offset, float *out /* (n) */);

/* RoPE inverse frequencies as transformers computes them in F32:
 * inv_freq[i] = 1 / (theta ^ ((2i) / head_dim)), i < head_dim / 2. */
void kv_rope_inv_freq(int64_t head_dim, double theta, float *inv_freq /* (head_dim / 2) */);

/* Rotates one head vector in place at position pos (non-interleaved,
 * rotate_half): with h = head_dim/2, angle_i = (float)pos * inv_freq[i],
 *   out[i]   = x[i]   * cos(angle_i) - x[i+h] * sin(angle_i)
 *   out[i+h] = x[i+h] * cos(angle_i) + x[i]   * sin(angle_i). */
void kv_rope_apply(float *x /* (head_dim) */, int64_t head_dim, const float *inv_freq, int64_t pos);

/* kv_rope_apply with cos and sin each multiplied by `scale` in F32 first
 * (YaRN's attention factor; scale 1 gives kv_rope_apply's bits). */
void kv_rope_apply_scaled(float *x /* (head_dim) */, int64_t head_dim, const float *inv_freq,
                          int64_t pos, float scale);

/* YaRN's inverse frequencies (transformers' _compute_yarn_parameters):
 * pos_freq_i = theta^(2i / head_dim) in F32; the correction range
 * low/high = head_dim ln(orig / (beta 2 pi)) / (2 ln theta) in double for
 * beta_fast/beta_slow (floor/ceil when truncate, clamped to [0, head_dim-1]);
 * ramp_i = clamp((i - low) / (high - low), 0, 1) and
 * inv_freq_i = 1/(factor pos_freq_i) * (1 - (1 - ramp_i)) + 1/pos_freq_i * (1 - ramp_i),
 * all in F32 in that order. */
void kv_rope_inv_freq_yarn(int64_t head_dim, double theta, double factor, double beta_fast,
                           double beta_slow, double orig_max_pos, bool truncate,
                           float *inv_freq /* (head_dim / 2) */);

/* Layer `layer`'s inverse frequencies: YaRN (c->rope_yarn), else the default
 * ones at the layer's base (kv_config_layer_rope_theta: gemma3's sliding
 * layers have their own). */
void kv_rope_layer_inv_freq(const KvConfig *c, int64_t layer, float *inv_freq /* (head_dim/2) */);

/* What cos and sin are multiplied by: YaRN's attention factor rounded to
 * F32, else 1. */
float kv_rope_scale(const KvConfig *c);

/* cap * tanh(x / cap); cap <= 0 means no softcap (returns x). */
float kv_softcap(float x, float cap);

/* gelu with the tanh approximation (gelu_pytorch_tanh):
 * 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3))). */
float kv_gelu_tanh(float x);

/* x * sigmoid(x) = x / (1 + exp(-x)). */
float kv_silu(float x);

/* In-place softmax over n values: subtract the max, exponentiate, sum in
 * ascending index order, divide. n == 0 is a no-op. */
void kv_softmax(float *x /* (n) */, int64_t n);

/* Attention of one query head over nk keys given in ascending position (the
 * canonical key order of DESIGN §2; the caller gathers and orders them):
 *   s_j = softcap(kv_dot(q, k_j) * scale, cap), p = kv_softmax(s),
 *   out[d] = sum_j p_j * v_j[d], accumulated in j order starting from 0.
 * nk == 0 gives out = 0. scores: (nk) scratch. Every backend path that
 * must be bitwise equal to the reference calls exactly this. */
void kv_attend(const float *q /* (hd) */, const float *const *k /* (nk) -> (hd) */,
               const float *const *v /* (nk) -> (hd) */, int64_t nk, int64_t hd, float scale,
               float cap, float *scores /* (nk) */, float *out /* (hd) */);

/* kv_attend's middle: nk scores (q . k[j]) turned in place into the
 * softmax weights, scaled and softcapped (cap > 0), or with gpt_oss's sink
 * logit (sink non-NULL: no softcap) as kv_attend_sink takes it. */
void kv_attend_weights(float *x /* (nk) */, int64_t nk, float scale, float cap,
                       const float *sink);

/* kv_attend with gpt_oss's attention sink and no softcap: the logit `sink`
 * joins the softmax as a last column (in the max and the sum, summed after
 * the keys) and its probability is dropped, so out = sum_j p_j v_j with
 * sum_j p_j < 1. nk == 0 gives out = 0. */
void kv_attend_sink(const float *q /* (hd) */, const float *const *k /* (nk) -> (hd) */,
                    const float *const *v /* (nk) -> (hd) */, int64_t nk, int64_t hd,
                    float scale, float sink, float *scores /* (nk) */, float *out /* (hd) */);

/* GQA: the key/value head that query head `head` reads (transformers'
 * repeat_kv: consecutive groups of num_heads / num_kv_heads query heads). */
int64_t kv_gqa_kv_head(int64_t head, int64_t num_heads, int64_t num_kv_heads);

/* DESIGN §2: a query at position q sees a key at position k when
 * k <= q and (window == 0 or q - window < k). */
bool kv_window_visible(int64_t q, int64_t k, int64_t window);

/* Greedy argmax, ties to the lowest index. *margin (may be NULL) receives the
 * gap between the best and the runner-up value (0 on a tie; +inf when n == 1). */
int32_t kv_argmax(const float *x /* (n) */, int64_t n, float *margin);

#endif
