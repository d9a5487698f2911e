/* cpu_state.h: one run of the reference on the CPU as the engine drives it:
 * the reference's state (state.h) plus what plugs into it from outside,
 * through its hooks: a cache variant's sliding layers (DESIGN §3), one
 * single-row cache per row when rows sit at their own positions (right
 * padding, DESIGN §2), the probes (probe.h), planted faults (fault.h) and a
 * calibration run's reduction order (ensemble.h).
 *
 * The reference itself knows none of these: each is an entry of the hook
 * table this file fills (cpu_hooks_update), kept beside the code it changes:
 * the variant attention in cpu_attention.c, the probes in probe.c, the
 * faults and orders here. */
#ifndef KV_CPU_STATE_H
#define KV_CPU_STATE_H

#include <stdbool.h>
#include <stdint.h>

#include "cache.h"
#include "forward.h"
#include "probe.h"

/* Most rows of a per-row state: the host's per-row counts travel by value in
 * a captured op's arguments. */
#define KV_PER_ROW_MAX 8

typedef struct {
    KvRefState ref;             /* the reference's activations and static cache */
    KvRefHooks hooks;           /* ref.hooks points here */
    const KvCacheOps *variant;  /* NULL: the reference (every layer in the static cache) */
    KvSlidingCache **caches;    /* (num_layers, cache_rows) the variant's cache(s) per
                                 * sliding layer, else NULL */
    int64_t n_layers;           /* num_layers */
    bool per_row;               /* rows at their own positions: one single-row cache per row */
    int64_t cache_rows;         /* caches per layer: 1, or B with per_row */
    int64_t n_caches;           /* entries in caches: n_layers * cache_rows */
    unsigned faults;            /* KV_FAULT_* bits (fault.h); 0 in every clean run */
    unsigned order;             /* KV_ORDER_* bits (ensemble.h); 0 outside calibration */
    KvProbes probes;            /* hashes, non-finite record, dump (probe.h) */
    /* the probes' observer (cpu_probe.c), NULL while they are off */
    void (*observer)(void *ctx, KvRefState *s, int64_t layer, KvPoint point, const void *base,
                     int64_t per_seq);
} KvCpuState;

/* Allocates a run of `batch` rows of up to max_len slots, up to max_chunk
 * tokens per forward. variant NULL: the reference; else sliding layers use
 * it. The state must not move afterwards (the hooks point into it). */
KvStatus kv_cpu_state_init(KvCpuState *cs, const KvModel *m, int64_t batch, int64_t max_len,
                           int64_t max_chunk, const KvCacheOps *variant, KvError *err);
void kv_cpu_state_free(KvCpuState *cs);

/* Rows at their own positions before the first forward: each sliding layer
 * keeps one single-row cache per row and forwards may right-pad.
 * KV_ERR_INPUT for more than KV_PER_ROW_MAX rows or after a forward. */
KvStatus kv_cpu_state_set_per_row(KvCpuState *cs, KvError *err);

/* Plants faults (fault.h bits) in the run and in every variant cache that
 * implements one of them; 0 makes it clean again. */
void kv_cpu_state_plant(KvCpuState *cs, unsigned faults);

/* A calibration order (ensemble.h bits); 0: the canonical one. */
void kv_cpu_state_set_order(KvCpuState *cs, unsigned order);

/* Turns the probes on (dump: also keep the last forward's full values).
 * Call before a graph is captured. (cpu_probe.c) */
KvStatus kv_cpu_state_probe(KvCpuState *cs, bool dump, KvError *err);

/* Rebuilds the hook table from the run's variant, observer, faults and
 * order (after any of them changed). */
void kv_cpu_state_hooks_update(KvCpuState *cs);

/* Layer l's variant cache serving row b (the layer's only cache without
 * per-row positions), or NULL on a layer without one; *view_row receives b's
 * row inside that cache's view. */
KvSlidingCache *kv_cpu_cache(const KvCpuState *cs, int64_t layer, int64_t b, int64_t *view_row);

/* KV_ERR_INTERNAL naming the layer when a variant cache's sentinel region
 * was overwritten by the last n positions (ref.len already advanced). */
KvStatus kv_cpu_check_sentinels(const KvCpuState *cs, int64_t n, KvError *err);

/* kv_ref_forward, then the sentinel check. */
KvStatus kv_cpu_forward(KvCpuState *cs, const int32_t *tokens, const uint8_t *real, int64_t n,
                        float *logits, KvError *err);

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
 * prefix must lie outside the next query's window. (shift.c) */
KvStatus kv_cpu_shift(KvCpuState *cs, int64_t keep, int64_t drop, KvError *err);

struct KvPrefillTape;
/* The prefill tape (prefill_tape.h, cpu_tape.c): records the first forward
 * of n tokens (input tokens, real (B, n)) of a clean reference run into an
 * empty *t (else leaves it empty); takes it in place of a run's first
 * forward, *used false when it does not fit (another model or input, a
 * calibration order, per-row positions, full probe dumps). The caller then
 * advances the host count as after a forward. */
KvStatus kv_cpu_tape_save(const KvCpuState *cs, const int32_t *tokens, const uint8_t *real,
                          int64_t n, struct KvPrefillTape *t, KvError *err);
KvStatus kv_cpu_tape_load(KvCpuState *cs, int64_t n, const struct KvPrefillTape *t, bool *used,
                          KvError *err);

/* The variant attention hook (cpu_attention.c): launches layer l's variant
 * update and attention when the layer has a variant cache. */
bool kv_cpu_launch_attention(void *ctx, KvRefState *s, int64_t layer, int64_t n);

#endif
