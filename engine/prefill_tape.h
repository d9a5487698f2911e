/* prefill_tape.h: a prefill computed once and handed to the later runs of
 * the same prompt (DESIGN §5, shared work). The reference's first prefill
 * forward (the whole prompt, or its first chunk) is the same computation in
 * every CPU run of a scenario up to each variant's own cache write: the
 * cache starts empty, so a variant's attention sees only the new keys, in
 * the canonical order. The tape keeps what that forward leaves behind (each
 * layer's keys and values, the logits, the probe hashes); a run that takes
 * it writes the keys and values through its own variant's update, into its
 * own buffers, and runs everything after the first forward itself. */
#ifndef KV_PREFILL_TAPE_H
#define KV_PREFILL_TAPE_H

#include <stdbool.h>
#include <stdint.h>

#include "model.h"
#include "status.h"

typedef struct KvPrefillTape {
    bool filled;          /* a forward was recorded */
    const KvModel *model; /* the model it ran */
    int64_t batch, n;     /* B, and the tokens of the forward */
    int64_t kv_dim, n_layers, vocab;
    int32_t *tokens;      /* (B, n) the forward's input */
    uint8_t *real;        /* (B, n) */
    float *k, *v;         /* (num_layers, B, n, kv_dim) keys after RoPE and values, as the
                           * static cache holds them */
    float *logits;        /* (B, vocab) the forward's last-token logits */
    int32_t *next_tok;    /* (B) greedy tokens */
    float *margin;        /* (B) top-1 margins */
    int64_t n_probes;     /* kv_probe_count, or 0 when recorded without probes */
    uint64_t *probe_hash; /* (n_probes, B) or NULL */
    /* the forward's first non-finite probe value (-1: none) */
    int64_t nonfinite_probe, nonfinite_row, nonfinite_index;
    float nonfinite_value;
} KvPrefillTape;

/* Allocates an unfilled tape of `batch` rows of n tokens for model m (its
 * arrays sized by m's config; probe hashes when `probes`), non-finite record
 * empty. KV_ERR_INTERNAL when out of memory, *t then empty. */
KvStatus kv_prefill_tape_alloc(KvPrefillTape *t, const KvModel *m, int64_t batch, int64_t n,
                               bool probes, KvError *err);

/* Frees the tape's arrays and zeroes it (NULL-safe). */
void kv_prefill_tape_free(KvPrefillTape *t);

#endif
