/* forward.h: the reference forward pass over a full-length cache.
 *
 * The reference keeps every position of every layer (slot = absolute
 * position, max_len slots) and applies the window as a mask (DESIGN §2):
 * this is the "obviously right" layout every cache variant is compared with.
 * Batches are left-padded: each row has the same number of slots; pad slots
 * are never visible as keys, and a row's RoPE position is the number of real
 * tokens before it. With per-row positions (kv_ref_state_set_per_row) rows
 * may also be right-padded (DESIGN §2): a pad after a row's first real token
 * is static-shape filler that takes no slot and no position, so rows sit at
 * different positions (row b's slot = position = len - lag[b]).
 *
 * With a cache variant (cache.h), sliding layers keep their K/V in
 * the variant's W slots instead and attention reads the variant's view; full
 * layers keep the static max_len cache. Attention always reduces the visible
 * keys in ascending position through kv_attend, so every correct variant is
 * bitwise equal to the reference. */
#ifndef KV_FORWARD_H
#define KV_FORWARD_H

#include <stdint.h>

#include "cache.h"
#include "fault.h"
#include "model.h"
#include "status.h"
#include "stream.h"

/* Full values of every probe of the last forward (bisect --rerun): what
 * the probe hashes summarise. Every probe is a float tensor per batch row;
 * the cache probe is dense: for each position the next query may see
 * (ascending, q - W < p <= q - 1 on a sliding layer, all on a full one), the
 * K row then the V row, NaN where the cache does not hold that position for
 * the row (a pad, or a slot the layout lost). */
typedef struct {
    int64_t n_probes, batch;
    float **data;   /* (n_probes) -> (batch, len[p]) */
    int64_t *len;   /* (n_probes) floats per row in the last forward */
    int64_t *cap;   /* (n_probes) floats per row allocated */
} KvProbeDump;

void kv_probe_dump_free(KvProbeDump *d);

typedef struct {
    const KvModel *model;
    unsigned faults;    /* KV_FAULT_* bits (fault.h); 0 in every clean run. Set with
                         * kv_ref_state_plant so the caches get theirs too. */
    unsigned order;     /* KV_ORDER_* bits (ensemble.h): a valid reduction order other
                         * than the canonical one, for calibration; 0 normally */
    KvStream stream;    /* eager, or capturing a decode step into a graph */
    int64_t batch;      /* B */
    int64_t max_len;    /* slots per row */
    int64_t max_chunk;  /* most tokens one forward call may take */
    int64_t len;        /* host's count of slots filled so far (same for every row) */
    float *k;           /* (num_layers, B, max_len, num_kv_heads * head_dim) after RoPE */
    float *v;           /* (num_layers, B, max_len, num_kv_heads * head_dim) */
    uint8_t *real;      /* (B, max_len) 1 when the slot holds a real (non-pad) token */
    int64_t *n_real;    /* (B) real tokens seen so far = next RoPE position */
    float *inv_freq;    /* (head_dim / 2) rope_theta's */
    float *inv_freq_local; /* (head_dim / 2) gemma3's sliding layers' (rope_theta_local), or NULL */
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
    /* gpt_oss's MoE scratch (NULL for a dense MLP), one token at a time: */
    float *moe_logits;  /* (num_experts) router logits */
    int64_t *moe_pick;  /* (experts_per_tok) chosen experts, by descending logit */
    float *moe_weight;  /* (experts_per_tok) their softmax weights */
    float *moe_gu;      /* (2 * intermediate) one expert's interleaved gate/up */
    float *moe_h;       /* (intermediate) its gated activation */
    float *moe_out;     /* (hidden) its output */
    float rope_scale;   /* kv_rope_scale: YaRN's attention factor on cos, sin; else 1 */
    int64_t *qpos;      /* (B * max_chunk) RoPE position of each new token */
    float *last;        /* (B, hidden) final-normed last position of each row */
    /* Attention scratch, one row per slot: attention runs (row, query, head)
     * items in parallel and an item uses its thread's slot. */
    int64_t n_scratch;  /* slots: at least num_heads and the threads at init */
    float *scores;      /* (n_scratch, max_keys) softmax scratch */
    int64_t max_keys;   /* most keys one query can gather: max_len + window */
    const float **gk;   /* (n_scratch, max_keys) gathered key rows, ascending position */
    const float **gv;   /* (n_scratch, max_keys) gathered value rows */
    int64_t *gpos;      /* (n_scratch, max_keys) their positions */
    /* Step inputs and outputs in memory, as a captured graph sees them: */
    int32_t *tok_in;    /* (B, max_chunk) tokens of the next forward; argmax writes (B, 1) */
    uint8_t *real_in;   /* (B, max_chunk) 0 marks a pad */
    float *logits;      /* (B, vocab) logits of each row's last token */
    int32_t *next_tok;  /* (B) greedy token of the last forward */
    float *margin;      /* (B) its top-1 margin */
    /* Probes (DESIGN §6): per forward, an FNV-1a 64 hash per batch row of
     * every named intermediate, computed by ops (so graphs record them). */
    bool probes;        /* record probe hashes (off in benchmarks) */
    int64_t n_probes;   /* 3 + 7 * num_layers */
    uint64_t *probe_hash; /* (n_probes, B) hashes of the last forward */
    KvProbeDump dump;   /* full probe values of the last forward when dump.data != NULL */
    /* The full layers' cache-probe memo (op_probe_cache), per (layer, row),
     * allocated on first use: the FNV state after the positions hashed at
     * the last step and a copy of the bytes it covered. A step whose old
     * positions memcmp equal to the copy continues the hash over its new
     * ones only: the same hash of the same bytes, linear instead of
     * quadratic in the decode length. */
    struct KvProbeMemo *probe_memo; /* (num_layers * B) or NULL */
    /* The first non-finite (NaN or Inf) probe value of the forwards since the
     * caller last set nonfinite_probe to -1 (kv_ref_nonfinite_reset): the
     * lowest probe index, then row, then element. Written by the probe ops,
     * so graph replays record it too. -1 when every probe value was finite. */
    int64_t nonfinite_probe, nonfinite_row, nonfinite_index;
    float nonfinite_value;
    const KvCacheOps *variant;  /* NULL: the reference (every layer in the static cache) */
    KvSlidingCache **caches;    /* (num_layers, cache_rows) the variant's cache(s) per sliding
                                 * layer, else NULL */
    int64_t n_layers;   /* num_layers */
    int64_t total_mem;  /* columns fed so far, in memory: ops read it at execution
                         * (the value a CUDA graph would read from device memory); a row's
                         * positions are total_mem - lag[b] */
    /* Per-row positions (right padding, DESIGN §2). Without them every row
     * has lag 0 and row_n = n, so row_pos = total_mem for every row. */
    bool per_row;       /* rows may sit at different positions: each sliding layer keeps
                         * one single-row cache per row (cache_rows = B) */
    int64_t cache_rows; /* caches per layer: 1, or B with per_row */
    int64_t n_caches;   /* entries in caches: n_layers * cache_rows */
    int64_t *lag;       /* (B) trailing pads of row b so far (no slot, no position) */
    int64_t *row_pos;   /* (B) positions row b had stored before this forward */
    int64_t *row_n;     /* (B) tokens of this forward that take positions in row b (all but
                         * its trailing pads) */
} KvRefState;

/* Most rows of a per-row state: the host's per-row counts travel by value in
 * a captured op's arguments. */
#define KV_PER_ROW_MAX 8

/* Allocates a state for `batch` rows of up to max_len slots, taking up to
 * max_chunk tokens per forward call. variant NULL: the reference; else
 * sliding layers use that cache variant. */
KvStatus kv_ref_state_init(KvRefState *s, const KvModel *m, int64_t batch, int64_t max_len,
                           int64_t max_chunk, const KvCacheOps *variant, KvError *err);
void kv_ref_state_free(KvRefState *s);

/* Switches the state to per-row positions before its first forward: every
 * sliding layer's cache becomes one single-row cache per row, and forwards
 * may right-pad (kv_ref_check_input). KV_ERR_INPUT for more than
 * KV_PER_ROW_MAX rows or after a forward. */
KvStatus kv_ref_state_set_per_row(KvRefState *s, KvError *err);

/* Layer l's variant cache serving row b (the layer's only cache without
 * per-row positions), or NULL on a layer without one; *view_row receives b's
 * row inside that cache's view. */
KvSlidingCache *kv_ref_cache(const KvRefState *s, int64_t layer, int64_t b, int64_t *view_row);

/* Context shift (DESIGN §5, llama.cpp #12357): drops positions keep ..
 * keep + drop - 1 of every row and moves the later ones down by drop, as
 * an engine does when its context is full. Every key that moves is
 * re-rotated by RoPE(-d) in place (d: the real tokens dropped from its
 * row), with the layer's own inverse frequencies and no YaRN factor (the
 * stored key already carries it). The static cache is compacted; each
 * sliding layer's variant cache is re-laid by the variant's layout rule
 * (layout.h) for the new count, so a ring's slot p % W becomes
 * (p - drop) % W. The host count, the count in memory and each row's RoPE
 * position go down with it. KV_ERR_INPUT for per-row positions, keep < 0,
 * drop < 1, or keep + drop > len - W (W the largest window): every
 * position a sliding layer still holds must survive the shift, and the kept
 * prefix must lie outside the next query's window, or the shifted state
 * would need keys the sliding caches have already evicted. */
KvStatus kv_ref_shift(KvRefState *s, int64_t keep, int64_t drop, KvError *err);

/* Plants faults (fault.h bits) in the state and in every variant cache
 * that implements one of them; 0 makes the state clean again. */
void kv_ref_state_plant(KvRefState *s, unsigned faults);

/* Forgets the recorded non-finite probe value (KvRefState.nonfinite_*). */
void kv_ref_nonfinite_reset(KvRefState *s);

/* Makes every later probe op also keep its full values in s->dump (probes
 * must be on). Call before a graph is captured. */
KvStatus kv_ref_dump_enable(KvRefState *s, KvError *err);

/* Appends n tokens to every row (slots len .. len+n-1) and runs the model.
 * tokens: (B, n); real: (B, n) 0 marks a pad (left padding: a pad never
 * follows a real token in a row; with per-row positions a row may end its
 * forward in trailing pads, after which no real token follows in the same
 * forward; a row with no token that takes a position keeps its logits). logits: (B, vocab), the logits of each
 * row's last new token (after the final softcap). With a variant, every
 * cache's sentinel regions are checked after the call: an out-of-bounds
 * write is KV_ERR_INTERNAL naming the layer and the variant. */
KvStatus kv_ref_forward(const KvModel *m, KvRefState *s, const int32_t *tokens,
                        const uint8_t *real, int64_t n, float *logits, KvError *err);

/* Probe names in probe order: "embed", then per layer l "layer<l>.q", ".k",
 * ".v" (after RoPE), ".cache" (the keys and values the next query will read,
 * ascending position: comparable across cache layouts), ".attn" (attention
 * output), ".mlp" (MLP output), ".residual"; then "final_norm", "logits". */
int64_t kv_probe_count(const KvConfig *c);

/* The per-layer probes, in probe order. */
enum {
    KV_PROBE_Q = 0, KV_PROBE_K, KV_PROBE_V, KV_PROBE_CACHE, KV_PROBE_ATTN, KV_PROBE_MLP,
    KV_PROBE_RESIDUAL, KV_PROBE_PER_LAYER
};
/* Probe index of layer's item (KV_PROBE_*). */
int64_t kv_probe_index(int64_t layer, int item);
/* Layer and per-layer item (KV_PROBE_*) of probe idx among n_probes; -1 for
 * embed, final_norm and logits (and out-of-range indices). */
int64_t kv_probe_layer(int64_t n_probes, int64_t idx);
int kv_probe_item(int64_t n_probes, int64_t idx);
void kv_probe_name(const KvConfig *c, int64_t index, char *out, size_t out_len);

/* Checks n new tokens (B, n) against the vocabulary, left padding and the
 * state's capacity without touching the state. */
KvStatus kv_ref_check_input(const KvRefState *s, const int32_t *tokens, const uint8_t *real,
                            int64_t n, KvError *err);

/* Launches one forward of the n tokens already in tok_in/real_in on
 * s->stream: positions, embedding, layers, final norm + lm_head + softcap,
 * argmax into tok_in[0..B) (the next step's input) and total_mem += n. On an
 * eager stream it runs now; while capturing it is recorded. The caller
 * advances s->len (the host count) by n afterwards. */
void kv_ref_launch_forward(KvRefState *s, int64_t n);

/* KV_ERR_INTERNAL naming the layer when a variant cache's sentinel region
 * was overwritten by the last n positions (s->len already advanced). */
KvStatus kv_ref_check_sentinels(const KvRefState *s, int64_t n, KvError *err);

#endif
