/* shadow64.h: an fp64 shadow of the reference forward.
 *
 * Why it exists: it is the yardstick for tolerances. Two correct fp32
 * implementations (the C reference, transformers, a CUDA forward) differ by
 * rounding alone, and how large that rounding is depends on the model and the
 * sequence. The shadow computes the same model with every intermediate in
 * double, so the fp32 reference's own error against it measures how far a
 * correct fp32 implementation may be from exact on this model and these
 * tokens; a candidate's distance to the reference is then judged against a
 * multiple of it instead of a constant set by eye.
 *
 * Same math as reference/forward.c + reference/kvmath.c (DESIGN §1, §2):
 * embedding (gemma2: times sqrt(hidden)), RMSNorm (gemma2 (1 + w), else w),
 * RoPE with positions counted over real tokens, GQA, attention scale and
 * softcap, sliding windows per layer (q - W < k <= q), gemma2's extra norms,
 * qwen2's q/k/v biases, GeGLU / SwiGLU, final norm, tied or untied lm_head,
 * final softcap.
 *
 * What is double and what is not: every value computed from the activations
 * (sums, norms, angles, cos/sin, tanh, exp, softmax) is double, with plain
 * sequential sums (the order does not matter at this precision for a
 * yardstick of fp32 rounding). The model's constants are taken as the float32
 * values that both fp32 implementations use, because they are part of the
 * model transformers defines, not rounding error of an implementation: the
 * weights (F32 as loaded), gemma2's embedding normalizer (rounded to the
 * activation dtype), the attention scale (kv_config_attn_scale), RoPE's
 * inv_freq (computed in float32 by transformers, kv_rope_inv_freq), the
 * RMSNorm eps and the softcaps (Python floats that torch rounds to float32
 * when it applies them). The activation functions' own constants (gelu's
 * sqrt(2/pi), 0.044715) are double: they belong to the function, and each
 * fp32 kernel rounds them its own way.
 *
 * No cache: the whole sequence is processed at once with O(n^2) attention
 * under the per-layer window mask. A row's pads never matter: they are never
 * visible as keys and, all on the left, shift every slot of the row alike,
 * so the window relation q - W < k <= q holds over real positions too. */
#ifndef KV_SHADOW64_H
#define KV_SHADOW64_H

#include <stdint.h>

#include "model.h"
#include "status.h"

/* Teacher-forced fp64 logits for one batch row: the row's real tokens
 * tokens[0..n) (no pads; token i has RoPE position i), logits for every
 * position p >= from (after the final softcap, as the reference's logits),
 * position p in logits row p - from. Deterministic: the same inputs give the
 * same bits for any thread count (each output is summed by one thread in a
 * fixed order).
 * KV_ERR_INPUT: n < 1, from outside [0, n), a token id outside
 * [0, vocab_size), a NULL pointer. KV_ERR_INTERNAL: out of memory. On failure
 * logits is left unspecified. */
KvStatus kv_shadow64_logits(const KvModel *m, const int32_t *tokens /* (n) */, int64_t n,
                            int64_t from, double *logits /* (n - from, vocab) */, KvError *err);

/* The yardstick of a recorded fp32 decode: for each step s and row b,
 *   rel(s, b) = max_i |logits[s, b, i] - shadow[s, b, i]| / max_i |shadow[s, b, i]|
 * (the denominator taken as 1 if the shadow's logits are all zero), where
 * the shadow teacher-forces the row's real prompt tokens and then the tokens
 * the decode fed: step 0's logits are the prefill's last position, step s's
 * come after feeding fed[s - 1, b]. *max_rel receives the maximum over steps
 * and rows; per_step (may be NULL) the maximum over rows of each step.
 *
 * fed is what the decode fed back: the greedy tokens (KvDecodeResult.tokens)
 * or, under teacher forcing, KvDecodeSpec.forced; rows 0 .. steps - 2 are
 * read. The result does not depend on prefill chunking or on left padding.
 * KV_ERR_INPUT: a shape < 1, a NULL pointer, a prompt row that is not
 * left-padded or ends in a pad, a token id out of range, a non-finite
 * recorded logit (a yardstick of a broken run means nothing); the message
 * names the step, row and element. KV_ERR_INTERNAL: out of memory. */
KvStatus kv_shadow64_rel_error(const KvModel *m, int64_t batch, int64_t prompt_len,
                               const int32_t *prompt /* (B, P) left-padded */,
                               const uint8_t *prompt_real /* (B, P) 0 on pads */, int64_t steps,
                               const int32_t *fed /* (steps, B) */,
                               const float *logits /* (steps, B, vocab) */,
                               double *per_step /* (steps) or NULL */, double *max_rel,
                               KvError *err);

/* A long shadow's progress (a real model's prompt in doubles runs for
 * minutes): fn is called after each layer of each row's forward. */
typedef struct {
    void (*fn)(void *ctx, int64_t row, int64_t layer);
    void *ctx;
} KvShadowProgress;

/* kv_shadow64_rel_error, calling progress (NULL: none) as it goes. */
KvStatus kv_shadow64_rel_error_watched(const KvModel *m, int64_t batch, int64_t prompt_len,
                                       const int32_t *prompt, const uint8_t *prompt_real,
                                       int64_t steps, const int32_t *fed, const float *logits,
                                       double *per_step, double *max_rel,
                                       const KvShadowProgress *progress, KvError *err);

#endif
