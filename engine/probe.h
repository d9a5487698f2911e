/* probe.h: probes (DESIGN §6): per forward, a hash per batch row of every
 * named intermediate of the reference (state.h KvPoint), the first
 * non-finite value among them, and on request their full values.
 *
 * The hash has two levels so that a GPU can compute it in parallel (FNV-1a
 * is a chain: one GPU thread per row dominated a CUDA run at the seed's cache
 * size): a probe row is cut into slices, each slice is hashed with FNV-1a 64
 * on its own, and the row's hash is FNV-1a 64 over the slice hashes' 8
 * little-endian bytes each, in order (kv_probe_fold). The slices are
 * KV_PROBE_CHUNK bytes of the row (the last one shorter), except for the
 * cache probe, whose slices are its positions' entries (probe_cache in
 * cpu_probe.c). Both backends hash the same way, so equal bytes give equal
 * hashes across them.
 * Computed by an observer the engine installs in the reference's hooks, run
 * as ops, so graph replays record them too.
 *
 * Probe order: "embed", then per layer l "layer<l>.q", ".k", ".v" (after
 * RoPE), ".cache" (the keys and values the next query will read, ascending
 * position: comparable across cache layouts), ".attn" (attention output),
 * ".mlp" (MLP output), ".residual"; then "final_norm", "logits". */
#ifndef KV_PROBE_H
#define KV_PROBE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "status.h"

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

/* Bytes per slice of a probe row (the last slice of a row may be shorter). */
#define KV_PROBE_CHUNK 4096

/* FNV-1a 64 continued from h over the 8 little-endian bytes of slice, a
 * slice's hash: the probe hash's outer level. */
uint64_t kv_probe_fold(uint64_t h, uint64_t slice);

/* A probe row's hash: the slices' hashes folded from KV_FNV_OFFSET, slices
 * of KV_PROBE_CHUNK bytes. n == 0 gives KV_FNV_OFFSET. */
uint64_t kv_probe_hash_bytes(const void *data, size_t n);

/* The hashes of several prefixes of one row (out[j]: kv_probe_hash_bytes of
 * its first prefix[j] bytes, prefix ascending and <= n), its slices hashed
 * once: a long prefill's probes cut to the shorter prefills it contains
 * (stream_tape.h). */
void kv_probe_hash_prefixes(const void *data, size_t n, const size_t *prefix, int64_t n_prefix,
                            uint64_t *out);

/* 3 + 7 * num_layers. */
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

/* One full layer's cache-probe memo for one row (KvProbes.memo). */
typedef struct KvProbeMemo {
    int64_t n;        /* positions 0 .. n - 1 hashed into h (0: nothing memoised) */
    uint64_t h;       /* the outer FNV state (kv_probe_fold) after them */
    bool finite;      /* every value of theirs was finite (their finite check is done) */
    bool off;         /* allocation failed: always hash in full */
    float *k, *v;     /* (max_len, kv_dim) copies of the static cache's rows 0 .. n - 1 */
    uint8_t *real;    /* (max_len) copy of the row's real flags */
} KvProbeMemo;

/* One position of the cache probe: where its K and V are, its position p,
 * the position its slot records (rec, = p in a correct cache) and its
 * slice's hash e (cpu_probe.c). */
typedef struct {
    const float *k, *v; /* (kv_dim) each */
    int64_t p, rec;
    uint64_t e;
} KvProbeEntry;

/* One CPU run's probes (cpu_state.h). */
typedef struct {
    bool on;              /* record probe hashes (off in benchmarks) */
    int64_t n_probes;     /* kv_probe_count */
    int64_t batch, max_len, n_layers;
    uint64_t *hash;       /* (n_probes, B) hashes of the last forward */
    KvProbeDump dump;     /* full values of the last forward when dump.data != NULL */
    /* The full layers' cache-probe memo, per (layer, row), allocated on
     * first use: the FNV state after the positions hashed at the last step
     * and a copy of the bytes it covered. A step whose old positions memcmp
     * equal to the copy continues the hash over its new ones only: the same
     * hash of the same bytes, linear instead of quadratic in the decode
     * length. */
    KvProbeMemo *memo;    /* (num_layers * B) or NULL */
    KvProbeEntry *entries; /* (max_len) the cache probe's scratch: a row's positions */
    /* The first non-finite (NaN or Inf) probe value since the last reset:
     * the lowest probe index, then row, then element; -1 when none. */
    int64_t nonfinite_probe, nonfinite_row, nonfinite_index;
    float nonfinite_value;
    /* Prefix cuts (stream_tape.h): while n_cut > 0, a one-row forward of
     * cut_total tokens also hashes each probe over its first cut[j] tokens
     * into cut_hash (n_cut, n_probes), and keeps the hidden row cut[j] - 1
     * after the last layer in cut_x (n_cut, hidden), whose final norm and
     * logits the tape computes; the cache, final-norm and logits probes are
     * not cut here. */
    int64_t n_cut, cut_total;
    const int64_t *cut;  /* (n_cut) ascending, each <= cut_total */
    uint64_t *cut_hash;  /* (n_cut, n_probes) */
    float *cut_x;        /* (n_cut, hidden) */
    /* called after each layer of a forward (NULL: none): a long one's
     * progress (stream_tape.h) */
    void (*on_layer)(void *ctx, int64_t layer);
    void *on_layer_ctx;
} KvProbes;

/* Most prefix cuts of one forward. */
#define KV_PROBE_CUT_MAX 32

KvStatus kv_probes_init(KvProbes *p, const KvConfig *c, int64_t batch, int64_t max_len,
                        KvError *err);
void kv_probes_free(KvProbes *p);
/* Makes every later probe also keep its full values in p->dump. */
KvStatus kv_probes_dump_enable(KvProbes *p, const KvConfig *c, int64_t max_chunk, KvError *err);
/* Forgets the recorded non-finite probe value. */
void kv_probes_nonfinite_reset(KvProbes *p);
/* Records the first non-finite value among `count` floats of probe idx,
 * row b, at element offset `first`, unless an earlier (probe, row, element)
 * is already recorded. */
void kv_probes_check_finite(KvProbes *p, int64_t idx, int64_t b, const float *v, int64_t count,
                            int64_t first);
/* Row b of full layer l's memo, allocated on first use; NULL when it cannot
 * be (the probe then hashes in full, as without one). */
KvProbeMemo *kv_probes_memo(KvProbes *p, int64_t layer, int64_t b, int64_t kv_dim);
/* Keeps probe idx's full values: per_row bytes of floats for each row. */
void kv_probes_dump_rows(KvProbeDump *d, int64_t idx, const void *base, int64_t per_row);

#endif
