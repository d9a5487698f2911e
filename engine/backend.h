/* backend.h: the backend table (ggml-style: function pointers plus an
 * opaque context). A backend is a place the model runs: the CPU reference
 * (backend_cpu.c) or the GPU (candidates/cuda/cuda_backend.cu). The one
 * decode driver (decode.c) and the graph runner (graph_runner.c) run any
 * backend through this table, so the prefill chunks, forced tokens, input
 * checks, replay check, recapture rule and recording are written once.
 *
 * A backend keeps the run's persistent state (caches, positions, the next
 * step's input) wherever it computes, plus the host's own count of filled
 * slots (`len`), which only host-branch cache variants read (cache.h). */
#ifndef KV_BACKEND_H
#define KV_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cache.h"
#include "probe.h"
#include "model.h"
#include "status.h"

typedef struct KvBackend KvBackend; /* opaque: one run's state on one backend */
struct KvPrefillTape;               /* prefill_tape.h */

/* What a run needs allocated before its first forward. */
typedef struct {
    int64_t batch;              /* B */
    int64_t max_len;            /* slots per row */
    int64_t max_chunk;          /* most tokens one forward takes */
    const KvCacheOps *variant;  /* NULL: the reference layout; else sliding layers use it */
    unsigned faults;            /* planted KV_FAULT_* bits (fault.h); 0 for clean runs */
    unsigned order;             /* KV_ORDER_* bits (ensemble.h); 0 outside calibration */
    bool probes;                /* record probe hashes */
    bool dump_probes;           /* keep the last forward's full probe values (take_dump) */
    bool prefix_slot;           /* snapshot slot KV_SNAP_PREFIX is used (prefix reuse) */
    bool per_row;               /* rows sit at different positions (right padding, DESIGN §2);
                                 * only for a backend whose per_row is true */
} KvBackendSetup;

/* Snapshot slots: the replay check's, and a prefix-cache entry held across
 * many decode steps (and replay checks) until a second request reuses it. */
#define KV_SNAP_REPLAY 0
#define KV_SNAP_PREFIX 1
#define KV_SNAP_SLOTS 2

/* The last forward's outputs in host memory owned by the backend; valid
 * until the next call on it. */
typedef struct {
    const float *logits;        /* (B, vocab) each row's last-token logits */
    const int32_t *tokens;      /* (B) greedy token */
    const float *margins;       /* (B) top-1 minus runner-up */
    const uint64_t *probe_hash; /* (n_probes, B), NULL without probes */
} KvBackendStep;

/* The first non-finite probe value of a forward: lowest probe index, then
 * row, then element within the probe row. */
typedef struct {
    int64_t probe, row, index;
    float value;
} KvNonfinite;

/* What a run did besides its results (reports, tests, benchmarks). */
typedef struct {
    int64_t graphs_captured;      /* captures made (= KvDecodeResult.graphs_captured) */
    int64_t graph_instantiations; /* CUDA: cudaGraphInstantiate calls */
    int64_t exec_updates;         /* CUDA: re-captures applied with cudaGraphExecUpdate */
    bool exec_update_used;        /* exec_updates > 0 */
    int64_t graph_launches;       /* graph replays */
    int64_t eager_forwards;       /* forwards launched op by op (prefill chunks included) */
    char device[256];             /* where it ran, e.g. "NAME (sm_XY, N SMs), driver ..." */
    char math_mode[64];           /* e.g. "pedantic fp32 (no TF32)" */
} KvBackendStats;

typedef struct {
    const char *name; /* "cpu", "cuda": the report's backend column */
    bool host;        /* computes on this machine's CPU (its work counts against the gate's
                       * CPU budget) */
    bool per_row;     /* runs rows at different positions (setup.per_row: right padding);
                       * a scenario that needs them is skipped, with the reason, on a
                       * backend without */

    /* Whether the backend can run here: KV_OK and a description of the
     * device, KV_SKIP with why not (no device, built without it), an error
     * for a device it cannot use. The gate calls it once. */
    KvStatus (*query)(char *device, size_t device_len, KvError *err);
    /* Allocates a run. KV_ERR_INPUT for a setup it cannot run (a variant
     * it does not implement) before touching any device; KV_SKIP when the
     * backend is not usable here. */
    KvStatus (*create)(const KvModel *m, const KvBackendSetup *setup, KvBackend **out,
                       KvError *err);
    void (*destroy)(KvBackend *b); /* NULL-safe */
    /* Copies n checked tokens per row, tokens (B, n) and real (B, n), into
     * the input the next forward reads. Without it the next forward reads
     * the greedy tokens the last one wrote there. */
    KvStatus (*set_input)(KvBackend *b, const int32_t *tokens, const uint8_t *real, int64_t n,
                          KvError *err);
    /* Runs one forward of the n input tokens now, op by op; the host count
     * advances by n. */
    KvStatus (*forward)(KvBackend *b, int64_t n, KvError *err);
    /* Layer l's part of the capture key of a forward of n tokens: the cache
     * variant's host regime and attended length (0, 0 on a layer without a
     * variant cache). */
    void (*layer_key)(const KvBackend *b, int64_t layer, int64_t n, int64_t *regime,
                      int64_t *slots);
    /* Records a forward of n tokens as the backend's graph (replacing the
     * last one) without running it. */
    KvStatus (*capture)(KvBackend *b, int64_t n, KvError *err);
    /* Runs the graph once; the host count advances by the captured n. */
    KvStatus (*replay)(KvBackend *b, KvError *err);
    /* Saves / restores the persistent state and the host counts in slot
     * KV_SNAP_REPLAY (the replay check) or KV_SNAP_PREFIX (a prefix-cache
     * entry; only when setup.prefix_slot). */
    KvStatus (*snapshot_save)(KvBackend *b, int slot, KvError *err);
    KvStatus (*snapshot_load)(KvBackend *b, int slot, KvError *err);
    /* The last forward's outputs (waits for them); KV_ERR_INTERNAL when the
     * backend saw a broken invariant (a sentinel overwritten, a device error
     * flag). */
    KvStatus (*read_step)(KvBackend *b, KvBackendStep *out, KvError *err);

    /* Optional (NULL when the backend has none): */
    /* Context shift (cpu_state.h kv_cpu_shift, DESIGN §5) of the persistent
     * state between two forwards: positions keep .. keep + drop - 1 dropped,
     * the later ones moved down and their keys re-rotated; the host count
     * goes down by drop. NULL: a scenario with a context shift is skipped
     * on this backend, with the reason. */
    KvStatus (*shift)(KvBackend *b, int64_t keep, int64_t drop, KvError *err);
    /* Moves the first non-finite probe value since the last take into *out
     * and forgets it; false when every probe value was finite. NULL: this
     * backend does not check its probes for NaN. */
    bool (*take_nonfinite)(KvBackend *b, KvNonfinite *out);
    /* Moves the last forward's full probe values (setup.dump_probes). */
    void (*take_dump)(KvBackend *b, KvProbeDump *out);
    /* The last forward's full probe values (setup.dump_probes), still the
     * backend's: valid until the next call on it. NULL when it keeps none. */
    const KvProbeDump *(*peek_dump)(const KvBackend *b);
    /* Counters and device text of the run so far. */
    void (*stats)(const KvBackend *b, KvBackendStats *out);
    /* The prefill tape (prefill_tape.h). tape_save, after the run's first
     * forward of n tokens from an empty state (its input tokens, real (B,
     * n)), records it into an empty *t when this run can give one (a clean
     * reference; else t stays empty). tape_load, in place of that forward
     * (the input set), leaves the state as the forward would, the sliding
     * layers' keys and values written by the run's own variant update;
     * *used false when the tape does not fit the run (the caller then
     * forwards). */
    KvStatus (*tape_save)(KvBackend *b, const int32_t *tokens, const uint8_t *real, int64_t n,
                          struct KvPrefillTape *t, KvError *err);
    KvStatus (*tape_load)(KvBackend *b, int64_t n, const struct KvPrefillTape *t, bool *used,
                          KvError *err);
} KvBackendOps;

/* The optional entries, checked once (backend.c): a backend without shift
 * refuses with KV_ERR_INPUT naming it; without take_nonfinite it reports
 * none (and kv_backend_checks_nonfinite says so); without dumps it keeps
 * none (take_dump leaves *out as it is, peek_dump gives NULL; a backend
 * has both dump entries or neither); without
 * stats *out is left as it is. */
bool kv_backend_can_shift(const KvBackendOps *ops);
/* The refusal a backend without shift gives (KV_ERR_INPUT naming it). */
KvStatus kv_backend_refuse_shift(const KvBackendOps *ops, KvError *err);
KvStatus kv_backend_shift(const KvBackendOps *ops, KvBackend *b, int64_t keep, int64_t drop,
                          KvError *err);
bool kv_backend_checks_nonfinite(const KvBackendOps *ops);
bool kv_backend_take_nonfinite(const KvBackendOps *ops, KvBackend *b, KvNonfinite *out);
bool kv_backend_keeps_dumps(const KvBackendOps *ops);
void kv_backend_take_dump(const KvBackendOps *ops, KvBackend *b, KvProbeDump *out);
const KvProbeDump *kv_backend_peek_dump(const KvBackendOps *ops, const KvBackend *b);
void kv_backend_stats(const KvBackendOps *ops, const KvBackend *b, KvBackendStats *out);

/* The CPU reference backend (backend_cpu.c). */
extern const KvBackendOps kv_backend_cpu;

/* Graph mode, written once for every backend: captures a forward of n
 * tokens and replays it; re-captures when the capture key changes: n, or
 * for any sliding layer the variant's host regime or attended length (a
 * framework re-records when a host branch flips or a shape changes). The
 * rule's two ways of going wrong are planted by the harness as a policy
 * (fault.h kv_fault_recapture: no_recapture, recapture_every_step). */
typedef struct {
    bool ignore_regime; /* leave the host regime out of the key: a graph captured while
                         * filling is replayed on a full cache */
    bool every_step;    /* capture before every step although the key did not change */
} KvRecapturePolicy;

typedef struct {
    int64_t *key;      /* (1 + 2 * num_layers) key of the next step */
    int64_t *cur_key;  /* (1 + 2 * num_layers) key of the captured graph */
    int64_t key_len;
    int64_t captures;  /* graphs captured so far */
    KvRecapturePolicy policy; /* all false: the rule as written */
} KvGraphRunner;

KvStatus kv_graph_runner_init(KvGraphRunner *r, int64_t num_layers, KvRecapturePolicy policy,
                              KvError *err);
/* Runs one forward of the n input tokens through the graph, capturing
 * first when needed; the host count advances by n. */
KvStatus kv_graph_runner_step(KvGraphRunner *r, const KvBackendOps *ops, KvBackend *b,
                              int64_t num_layers, int64_t n, KvError *err);
void kv_graph_runner_free(KvGraphRunner *r);

#endif
