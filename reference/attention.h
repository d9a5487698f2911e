/* attention.h: the reference's attention over its static cache (slot =
 * position), and the pieces every attention op shares, the engine's
 * cache-variant attention included. */
#ifndef KV_ATTENTION_H
#define KV_ATTENTION_H

#include <stdbool.h>
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

/* kv_ref_attend for up to KV_ATTN_ROWS (state.h) (query, head) rows of one kv head at once:
 * every row's keys are the contiguous run [lo[r], hi[r]) of one shared list
 * gk/gv in ascending position, not reversed (p->descending false), and the
 * AVX-512 path is on with head_dim a multiple of 64 (kv_ref_attend_rows_ok).
 * out[r] is bitwise what kv_ref_attend gives row r over its own run: each
 * row's dots, softmax and weighted sum are the same operations in the same
 * order; the rows only share the loads of each key and value row. heads[r]
 * is row r's head (its sink). scores (nr, ld), ld >= the shared list's
 * length. */
void kv_ref_attend_rows(const KvAttnParams *p, int64_t nr, const int64_t *heads /* (nr) */,
                        const float *const *q /* (nr) -> (hd) */, const int64_t *lo /* (nr) */,
                        const int64_t *hi /* (nr) */, const float *const *gk /* -> (hd) */,
                        const float *const *gv /* -> (hd) */, float *scores /* (nr, ld) */,
                        int64_t ld, float *const *out /* (nr) -> (hd) */);

/* Whether kv_ref_attend_rows can stand in for kv_ref_attend under p. */
bool kv_ref_attend_rows_ok(const KvAttnParams *p);

#endif
