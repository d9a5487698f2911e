/* stream_tape.h: one long prefill whose prefixes are the first forwards of
 * several runs (DESIGN §5, shared work). At real scale the scenarios' first
 * rows are prefixes of one token stream (scenario.h), and a causal forward
 * computes each position from the positions before it only, each row's
 * matmuls, norms and attention in its own fixed order: the first n
 * positions of a forward of N > n tokens are bitwise a forward of the first
 * n. So the first rows of a model's references are computed once, as one
 * forward of the longest, and each is cut from it: its keys and values, its
 * probe hashes over its own n tokens (kv_probe_hash_prefixes) and the final
 * norm and logits of its position n - 1. A cut is a prefill tape
 * (prefill_tape.h) that a reference run takes in place of its own first
 * forward (its other rows, if any, computed alone: kv_stream_tape_rows). */
#ifndef KV_STREAM_TAPE_H
#define KV_STREAM_TAPE_H

#include <stdbool.h>
#include <stdint.h>

#include "model.h"
#include "prefill_tape.h"
#include "probe.h"
#include "status.h"

typedef struct KvStreamTape {
    bool filled;          /* recorded, every probe value finite */
    const KvModel *model; /* the model it ran */
    int64_t n;            /* tokens of the long forward */
    int64_t kv_dim, n_layers, vocab, n_probes;
    int32_t *tokens;      /* (n) */
    float *k, *v;         /* (num_layers, n, kv_dim) after RoPE, as the static cache holds them */
    int64_t n_cut;
    int64_t cut[KV_PROBE_CUT_MAX]; /* (n_cut) ascending prefix lengths */
    uint64_t *cut_hash;   /* (n_cut, n_probes) each cut's probe hashes (the cache probe's
                           * are not: a run taking the cut hashes its own cache) */
    float *cut_logits;    /* (n_cut, vocab) */
    int32_t cut_tok[KV_PROBE_CUT_MAX];
    float cut_margin[KV_PROBE_CUT_MAX];
} KvStreamTape;

/* Runs the clean reference's forward of tokens (n), one row, with probes,
 * and keeps what each prefix cut[0..n_cut) (ascending, distinct, 1..n; at
 * most KV_PROBE_CUT_MAX) needs. A forward with a non-finite probe value
 * leaves t unfilled: its runs compute their own first forward, and their
 * finite checks name the value. on_layer (NULL: none) is called after each
 * layer, for a progress line. */
KvStatus kv_stream_tape_record(const KvModel *m, const int32_t *tokens, int64_t n,
                               const int64_t *cut, int64_t n_cut,
                               void (*on_layer)(void *ctx, int64_t layer), void *ctx,
                               KvStreamTape *t, KvError *err);

/* Whether a run of one row whose first forward is tokens (n) can take a
 * cut: t filled, n one of its cuts, and the tokens the stream's. */
bool kv_stream_tape_fits(const KvStreamTape *t, const int32_t *tokens, int64_t n);

/* The prefill tape of t's first n tokens (kv_stream_tape_fits), one row. */
KvStatus kv_stream_tape_cut(const KvStreamTape *t, int64_t n, KvPrefillTape *out,
                            KvError *err);

/* The prefill tape of a first forward of `batch` rows (tokens, real
 * (batch, n), left-padded) when at least one row is a cut: those rows cut
 * from t, every other row its own one-row forward computed here, with
 * probes (a row of a batch reads only its own columns, so its bits are
 * those of the row alone). Left unfilled when no row is a cut. */
KvStatus kv_stream_tape_rows(const KvStreamTape *t, const int32_t *tokens, const uint8_t *real,
                             int64_t batch, int64_t n, KvPrefillTape *out, KvError *err);

void kv_stream_tape_free(KvStreamTape *t);

#endif
