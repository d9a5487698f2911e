/* attention.h: the reference's attention over its static cache (slot =
 * position), and the pieces every attention op shares, the engine's
 * cache-variant attention included. */
#ifndef KV_ATTENTION_H
#define KV_ATTENTION_H

#include <stdint.h>

#include "state.h"

/* Launches layer l's store of the n new keys and values at their slots and
 * its attention over the static cache. */
void kv_ref_launch_static_attention(KvRefState *s, int64_t layer, int64_t n);

/* What every attention op of a layer shares (the two attention ops' one
 * prologue): sizes, the window the mask applies, scale, softcap, sinks and
 * the key order of this execution. */
typedef struct {
    int64_t hd, kv_dim, q_dim, heads, kv_heads;
    int64_t window;       /* the layer's window (0: full) */
    int64_t mask_window;  /* the window the mask applies */
    float scale, cap;
    const float *sinks;   /* (num_heads) gpt_oss's, else NULL */
    bool descending;      /* sum the keys newest first */
} KvAttnParams;

/* Call inside an attention op as it runs (the key order may change per run). */
KvAttnParams kv_ref_attn_params(const KvRefState *s, int64_t layer);

/* Threads for an attention op of about `work` flops, and this thread's
 * scratch slot. */
int kv_ref_attn_threads(const KvRefState *s, int64_t work);
int64_t kv_ref_attn_slot(void);

/* One (query, head) over nk gathered keys in ascending position (reversed
 * in place first when p->descending): out (head_dim). */
void kv_ref_attend(const KvAttnParams *p, int64_t head, const float *q, const float **gk,
                   const float **gv, int64_t nk, float *scores, float *out);

#endif
