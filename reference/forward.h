/* forward.h: the reference forward pass over a full-length cache.
 *
 * The reference keeps every position of every layer (slot = absolute
 * position, max_len slots) and applies the window as a mask (DESIGN §2):
 * this is the "obviously right" layout every cache variant is compared with.
 * Batches are left-padded: each row has the same number of slots; pad slots
 * are never visible as keys, and a row's RoPE position is the number of real
 * tokens before it. */
#ifndef KV_FORWARD_H
#define KV_FORWARD_H

#include <stdint.h>

#include "model.h"
#include "status.h"

typedef struct {
    int64_t batch;      /* B */
    int64_t max_len;    /* slots per row */
    int64_t max_chunk;  /* most tokens one forward call may take */
    int64_t len;        /* slots filled so far (same for every row) */
    float *k;           /* (num_layers, B, max_len, num_kv_heads * head_dim) after RoPE */
    float *v;           /* (num_layers, B, max_len, num_kv_heads * head_dim) */
    uint8_t *real;      /* (B, max_len) 1 when the slot holds a real (non-pad) token */
    int64_t *n_real;    /* (B) real tokens seen so far = next RoPE position */
    float *inv_freq;    /* (head_dim / 2) */
    /* scratch, sized for max_chunk tokens per row: */
    float *x;           /* (B * max_chunk, hidden) residual stream */
    float *xn;          /* (B * max_chunk, hidden) normed input */
    float *q;           /* (B * max_chunk, num_heads * head_dim) */
    float *kn;          /* (B * max_chunk, num_kv_heads * head_dim) new keys */
    float *vn;          /* (B * max_chunk, num_kv_heads * head_dim) new values */
    float *att;         /* (B * max_chunk, num_heads * head_dim) attention output */
    float *tmp;         /* (B * max_chunk, hidden) projection output */
    float *gate;        /* (B * max_chunk, intermediate) */
    float *up;          /* (B * max_chunk, intermediate) */
    int64_t *qpos;      /* (B * max_chunk) RoPE position of each new token */
    float *last;        /* (B, hidden) final-normed last position of each row */
    float *scores;      /* (num_heads, max_len) softmax scratch, one row per head */
} KvRefState;

/* Allocates a state for `batch` rows of up to max_len slots, taking up to
 * max_chunk tokens per forward call. */
KvStatus kv_ref_state_init(KvRefState *s, const KvModel *m, int64_t batch, int64_t max_len,
                           int64_t max_chunk, KvError *err);
void kv_ref_state_free(KvRefState *s);

/* Appends n tokens to every row (slots len .. len+n-1) and runs the model.
 * tokens: (B, n); real: (B, n) 0 marks a pad (left padding only: a pad never
 * follows a real token in a row). logits: (B, vocab), the logits of each
 * row's last new token (after the final softcap). */
KvStatus kv_ref_forward(const KvModel *m, KvRefState *s, const int32_t *tokens,
                        const uint8_t *real, int64_t n, float *logits, KvError *err);

#endif
