/* state.h: the reference's state (KvRefState: the activations and the
 * static cache of one batch) and the hook table through which everything
 * else plugs into the forward (KvRefHooks; forward.h has the why). */
#ifndef KV_STATE_H
#define KV_STATE_H

#include <stdbool.h>
#include <stdint.h>

#include "model.h"
#include "status.h"
#include "stream.h"

/* Most (query, head) rows attention takes together (kv_ref_attend_rows,
 * attention.h): the size of its score scratch. Timing only. */
#define KV_ATTN_ROWS 16

typedef struct KvRefState KvRefState;

/* The named intermediates, in forward order: "embed"; per layer q, k, v
 * (after RoPE), cache (the keys and values the next query reads), attn,
 * mlp, residual; then "final_norm" and "logits". */
typedef enum {
    KV_POINT_EMBED = 0,
    KV_POINT_Q, KV_POINT_K, KV_POINT_V, KV_POINT_CACHE, KV_POINT_ATTN, KV_POINT_MLP,
    KV_POINT_RESIDUAL,
    KV_POINT_FINAL_NORM, KV_POINT_LOGITS
} KvPoint;

/* y = x w^T: x (rows, in), w (out, in) as stored, y (rows, out). */
typedef void (*KvMatmulFn)(const float *x, KvMat w, int64_t rows, int64_t in, int64_t out,
                           float *y);

/* What plugs into the forward from outside; every entry may be NULL. The
 * state holds a pointer: the table must outlive it. */
typedef struct {
    void *ctx; /* passed to every callback */
    /* Run as an op (graphs replay it) after each named intermediate: layer
     * (-1 outside the layers), the point, and `per_seq` bytes for each of
     * the B sequences from base, consecutive. KV_POINT_CACHE carries no
     * tensor (base NULL): the observer reads the caches itself. */
    void (*observe)(void *ctx, KvRefState *s, int64_t layer, KvPoint point, const void *base,
                    int64_t per_seq);
    /* Every projection and the lm_head (NULL: kv_matmul_mat / kv_matmul_multi). */
    KvMatmulFn matmul;
    /* Asked once per attention op as it runs: true sums the visible keys in
     * descending position instead of ascending. */
    bool (*keys_descending)(void *ctx);
    /* The window the attention mask applies for a layer window w (0: full). */
    int64_t (*mask_window)(void *ctx, int64_t w);
    /* Launches layer l's cache store and attention of n tokens in place of
     * the static cache's; false leaves the layer to the reference. */
    bool (*launch_attention)(void *ctx, KvRefState *s, int64_t layer, int64_t n);
    /* Launches the positions op of n tokens in place of the reference's
     * (which calls kv_ref_place_tokens(s, n, false)); false: the reference's. */
    bool (*launch_positions)(void *ctx, KvRefState *s, int64_t n);
} KvRefHooks;

struct KvRefState {
    const KvModel *model;
    const KvRefHooks *hooks; /* NULL: the plain reference */
    KvStream stream;    /* eager, or capturing a decode step into a graph */
    int64_t batch;      /* B */
    int64_t max_len;    /* slots per sequence */
    int64_t max_chunk;  /* most tokens one forward call may take */
    bool trailing_pads; /* a sequence may end a forward in pads (right padding) */
    int64_t len;        /* host's count of columns fed so far */
    int64_t total_mem;  /* the same count in memory: ops read it at execution (the value a
                         * CUDA graph reads from device memory) */
    float *k;           /* (num_layers, B, max_len, num_kv_heads * head_dim) after RoPE */
    float *v;           /* (num_layers, B, max_len, num_kv_heads * head_dim) */
    uint8_t *real;      /* (B, max_len) 1 when the slot holds a real (non-pad) token */
    int64_t *n_real;    /* (B) real tokens seen so far = next RoPE position */
    int64_t *lag;       /* (B) trailing pads so far: a sequence's slots are total_mem - lag */
    int64_t *pos0;      /* (B) slots a sequence had filled before this forward */
    int64_t *n_new;     /* (B) tokens of this forward that take slots (all but trailing pads) */
    float *inv_freq;    /* (head_dim / 2) rope_theta's */
    float *inv_freq_local; /* (head_dim / 2) gemma3's sliding layers' (rope_theta_local), or NULL */
    float rope_scale;   /* kv_rope_scale: YaRN's attention factor on cos, sin; else 1 */
    /* activations, sized for max_chunk tokens per sequence: */
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
    float *last;        /* (B, hidden) final-normed last position of each sequence */
    /* gpt_oss's MoE scratch (NULL for a dense MLP), for B * max_chunk rows;
     * an expert's rows are gathered, so each expert runs once per forward: */
    float *moe_logits;  /* (B * max_chunk, num_experts) router logits */
    int64_t *moe_pick;  /* (B * max_chunk, experts_per_tok) chosen experts, by descending logit */
    float *moe_weight;  /* (B * max_chunk, experts_per_tok) their softmax weights */
    int64_t *moe_rows;  /* (B * max_chunk) the rows that chose the current expert */
    float *moe_x;       /* (B * max_chunk, hidden) those rows' normed inputs, gathered */
    float *moe_gu;      /* (B * max_chunk, 2 * intermediate) their interleaved gate/up */
    float *moe_h;       /* (B * max_chunk, intermediate) their gated activations */
    float *moe_out;     /* (B * max_chunk, hidden) the expert's outputs */
    /* Attention scratch, one row per slot: attention runs (sequence, query,
     * head) items in parallel and an item uses its thread's slot. */
    int64_t n_scratch;  /* slots: at least num_heads and the threads at init */
    int64_t max_keys;   /* most keys one query can gather: max_len + window */
    float *scores;      /* (n_scratch, max_keys) softmax scratch */
    const float **gk;   /* (n_scratch, max_keys) gathered key rows, ascending position */
    const float **gv;   /* (n_scratch, max_keys) gathered value rows */
    int64_t *gpos;      /* (n_scratch, max_keys) their positions */
    /* kv_ref_attend_rows' scores, one block per thread at init: */
    int64_t n_row_slots;
    float *row_scores;  /* (n_row_slots, KV_ATTN_ROWS, max_keys) */
    /* Step inputs and outputs in memory, as a captured graph sees them: */
    int32_t *tok_in;    /* (B, max_chunk) tokens of the next forward; argmax writes (B, 1) */
    uint8_t *real_in;   /* (B, max_chunk) 0 marks a pad */
    float *logits;      /* (B, vocab) logits of each sequence's last token */
    int32_t *next_tok;  /* (B) greedy token of the last forward */
    float *margin;      /* (B) its top-1 margin */
};

/* Allocates a state for `batch` sequences of up to max_len slots, taking up
 * to max_chunk tokens per forward call. */
KvStatus kv_ref_state_init(KvRefState *s, const KvModel *m, int64_t batch, int64_t max_len,
                           int64_t max_chunk, KvError *err);
void kv_ref_state_free(KvRefState *s);

/* y = x w^T by mm, or by kv_matmul_mat when mm is NULL (no hook installed). */
void kv_ref_matmul(KvMatmulFn mm, const float *x, KvMat w, int64_t rows, int64_t in,
                   int64_t out, float *y);

/* Layer l's RoPE inverse frequencies (head_dim / 2). */
const float *kv_ref_layer_inv_freq(const KvRefState *s, int64_t layer);

#endif
