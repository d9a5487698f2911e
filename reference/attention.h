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

/* kv_ref_attend for up to KV_ATTN_ROWS (state.h) (query, head) rows of one
 * kv head at once:
 * every row's keys are the contiguous run [lo[r], hi[r]) of one shared list
 * gk/gv in ascending position, not reversed (p->descending false), and the
 * AVX2 kernels run with head_dim a multiple of 16 (kv_ref_attend_rows_ok).
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

/* An item of the grouped attention (the static cache's and the variants'):
 * sequence b, kv head kvh, its query heads [h0, h1) at the consecutive
 * queries [t0, t1) of an n-token forward, at most KV_ATTN_ROWS rows. */
typedef struct {
    int64_t b, kvh, h0, h1, t0, t1;
    bool real[KV_ATTN_ROWS]; /* query t0 + i sees keys: the caller's rule */
    int64_t qmin, qmax;      /* the real queries' first and last position */
} KvAttnItem;

/* How many items a forward of n tokens over `batch` sequences has, and
 * item `it` (real[] left for the caller). */
int64_t kv_ref_attn_item_count(const KvAttnParams *p, int64_t batch, int64_t n);
KvAttnItem kv_ref_attn_item(const KvAttnParams *p, int64_t n, int64_t it);

/* Once the caller set it->real: zeroes the outputs of the item's pad
 * queries in att (B * n, q_dim), as kv_attend gives a query with no keys,
 * and sets qmin and qmax from pos0 (the sequence's position of query 0).
 * False when no query of the item is real. */
bool kv_ref_attn_item_begin(const KvAttnParams *p, KvAttnItem *it, int64_t n, int64_t pos0,
                            float *att /* (B * n, q_dim) */);

/* The item's attention over the keys gk/gv at ascending positions gp (nu,
 * every key some real query of the item sees): each real query's run of
 * them under p->mask_window, each of its heads a row of
 * kv_ref_attend_rows; q and att are the forward's (B * n, q_dim). */
void kv_ref_attn_item_run(const KvAttnParams *p, const KvAttnItem *it, int64_t n, int64_t pos0,
                          const int64_t *gp /* (nu) */, const float *const *gk /* (nu) */,
                          const float *const *gv /* (nu) */, int64_t nu,
                          const float *q /* (B * n, q_dim) */, float *att /* (B * n, q_dim) */,
                          float *scores /* (KV_ATTN_ROWS, ld) */, int64_t ld);

#endif
