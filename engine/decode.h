/* decode.h: greedy decoding of a left-padded batch with the reference. */
#ifndef KV_DECODE_H
#define KV_DECODE_H

#include <stdbool.h>
#include <stdint.h>

#include "backend.h"
#include "cache.h"
#include "probe.h"
#include "model.h"
#include "status.h"

/* How decode steps run (DESIGN §4). */
typedef enum {
    KV_MODE_EAGER = 0, /* every step launches its ops */
    KV_MODE_GRAPH = 1, /* one decode step captured after prefill and replayed; re-captured
                        * when a cache's capture key (host regime, attended length) changes */
} KvExecMode;

/* A decode's script: what a scenario does besides decoding (a request
 * switch, a context shift), written by the harness over the backend table
 * (harness/script.c) and called by the driver at fixed points. */
typedef struct KvDecodeScript {
    void *ctx;
    int64_t max_len;       /* slots the backend must hold at least (0: the decode's own) */
    int64_t max_chunk;     /* tokens one of its forwards feeds at most (0: none) */
    bool prefix_slot;      /* it saves and restores snapshot slot KV_SNAP_PREFIX */
    bool shifts;           /* it shifts the context: refused before the run on a backend
                            * without shift */
    int64_t prefill_pause; /* the prefill's chunks stop after this many columns and at_pause
                            * runs there (0, or >= the prompt length: never) */
    KvStatus (*at_pause)(void *ctx, const KvBackendOps *ops, KvBackend *b, KvError *err);
    /* Before decode step `step` (>= 1): *fed true when it ran the step's
     * forward itself (eager, one forward), which then is the step. */
    KvStatus (*before_step)(void *ctx, const KvBackendOps *ops, KvBackend *b, int64_t step,
                            bool *fed, KvError *err);
} KvDecodeScript;

typedef struct {
    int64_t batch;             /* B */
    int64_t prompt_len;        /* P, padded length (longest prompt) */
    const int32_t *prompt;     /* (B, P) left-padded token ids */
    const uint8_t *prompt_real;/* (B, P) 0 on pads */
    int64_t new_tokens;        /* tokens generated per row, >= 1 */
    int64_t prefill_chunk;     /* tokens per prefill forward; 0 = whole prompt at once */
    const int32_t *forced;     /* (new_tokens, B) or NULL: teacher forcing. When set, step
                                * s > 0 feeds forced[s - 1] instead of the greedy token;
                                * the result still records the greedy choice at each step.
                                * Used to keep comparing after a flip at a near-tie. */
    /* A scripted decode (prefix reuse, speculative rollback, a context
     * shift: harness/script.h), or NULL. */
    const struct KvDecodeScript *script;
    const KvCacheOps *variant; /* NULL: the reference; else the sliding-layer cache variant */
    KvExecMode mode;           /* eager (default) or graph */
    unsigned faults;           /* planted KV_FAULT_* bits (fault.h); 0 for clean runs */
    unsigned order;            /* KV_ORDER_* bits (ensemble.h): a calibration run of the
                                * reference in another valid reduction order; 0 normally */
    int64_t replay_every;      /* replay check at every decode step s with s % replay_every
                                * == 0 (0 = off): the step runs replay_k times from one
                                * snapshot and every run must be bitwise identical; a
                                * decode too short to reach such a step checks its last
                                * step instead, so every decode step count >= 1 checks one */
    int64_t replay_k;          /* runs per checked step; <= 0 means 3 */
    bool record_probes;        /* fill KvDecodeResult.probe_hash */
    bool dump_probes;          /* (with record_probes) fill KvDecodeResult.dump with the full
                                * probe values of the last step (bisect --rerun) */
    /* (with dump_probes) called after every step, the prefill as step 0,
     * with that step's full probe values, still the backend's (valid during
     * the call only): bisect --rerun compares every step, not only the last.
     * Not called on a backend that keeps no dumps (peek_dump NULL). */
    void (*on_step_dump)(void *ctx, int64_t step, const KvProbeDump *dump);
    void *on_step_dump_ctx;
    /* The prefill tape (prefill_tape.h): the first prefill forward is
     * recorded into tape_record when empty (a clean CPU reference), or
     * taken from tape_play when it fits the run (the backend's tape_load);
     * NULL: neither. */
    struct KvPrefillTape *tape_record;
    const struct KvPrefillTape *tape_play;
    /* Called (NULL: not) after each prefill forward and each decode step
     * with the prompt columns and the decode steps done so far: a gate's
     * progress during a long run. */
    void (*on_progress)(void *ctx, int64_t columns, int64_t steps);
    void *on_progress_ctx;
} KvDecodeSpec;

typedef struct {
    int64_t steps;    /* = new_tokens */
    int64_t batch;
    int64_t vocab;
    int32_t *tokens;  /* (steps, B) the greedy token chosen at each step */
    float *logits;    /* (steps, B, vocab) logits the token was chosen from */
    float *margins;   /* (steps, B) top-1 minus runner-up logit */
    int64_t graphs_captured; /* graph mode: captures made (0 in eager mode) */
    int64_t replays_checked; /* steps that went through the replay check */
    int64_t replay_mismatch_step; /* first step whose replays differed, -1 when none */
    int64_t n_probes;         /* kv_probe_count (probe.h) when probes were recorded, else 0 */
    uint64_t *probe_hash;     /* (steps, n_probes, B) or NULL */
    KvProbeDump dump;         /* dump_probes: every probe's values at the last step */
    /* The first non-finite probe value (record_probes only; the prefill
     * counts as step 0): step, probe index, batch row, element within the
     * probe row (as in the dump) and the value. All -1 when every probe
     * value was finite or probes were not recorded (nonfinite_checked). */
    bool nonfinite_checked;
    int64_t nonfinite_step, nonfinite_probe, nonfinite_row, nonfinite_index;
    float nonfinite_value;
    bool prefill_taped; /* the first prefill forward came from spec.tape_play */
} KvDecodeResult;

/* True when a row of real (B, n) has a pad after a real token: a
 * right-padded batch, which runs with per-row positions (DESIGN §2). */
bool kv_decode_right_padded(const uint8_t *real, int64_t batch, int64_t n);

/* Builds a left-padded batch from `batch` prompts of the given lengths.
 * prompt: (B, P) and real: (B, P) are malloc'd; pads hold pad_id. */
KvStatus kv_batch_left_pad(const int32_t *const *prompts, const int64_t *lens, int64_t batch,
                           int32_t pad_id, int32_t **prompt, uint8_t **real, int64_t *prompt_len,
                           KvError *err);
/* The same, left- or (right) right-padded: a right-padded row's tokens
 * start in column 0 and pads fill the rest (DESIGN §2). */
KvStatus kv_batch_pad(const int32_t *const *prompts, const int64_t *lens, int64_t batch,
                      int32_t pad_id, bool right, int32_t **prompt, uint8_t **real,
                      int64_t *prompt_len, KvError *err);

/* The replay check's runs per checked step when replay_k <= 0. */
#define KV_REPLAY_K 3

/* The decode driver, for any backend: checks the spec (shapes, token ids,
 * left padding) before the backend is touched, runs the prefill (in chunks
 * of prefill_chunk when set) and then one token per step; step 0's logits
 * come from the prefill. KV_ERR_INPUT for a bad spec or a variant the
 * backend does not implement, KV_SKIP when the backend cannot run here
 * (err says why), KV_ERR_INTERNAL for a broken invariant (a sentinel
 * overwritten, a device error). On any failure *out is freed and zeroed.
 * stats (may be NULL) receives the backend's counters, also on failure. */
KvStatus kv_decode_run(const KvBackendOps *ops, const KvModel *m, const KvDecodeSpec *spec,
                       KvDecodeResult *out, KvBackendStats *stats, KvError *err);

/* Checks n tokens per row, tokens (B, n) and real (B, n), starting at
 * cache position pos0: ids inside the vocabulary, and the padding: left
 * padding, or with `right` left pads, real tokens, then trailing pads. */
KvStatus kv_decode_check_tokens(int64_t vocab, const int32_t *tokens, const uint8_t *real,
                                int64_t batch, int64_t n, int64_t pos0, bool right,
                                KvError *err);

/* The spec checks kv_decode_run makes before any backend is touched (a
 * script checks its own when it is bound: harness/script.h). */
KvStatus kv_decode_check_spec(const KvModel *m, const KvDecodeSpec *spec, KvError *err);

/* Runs the prefill of spec's prompt on run b eagerly, in chunks of
 * prefill_chunk when set (the backend's setup must allow that chunk). out
 * (may be NULL) records the first non-finite probe value as step 0. */
KvStatus kv_decode_prefill(const KvBackendOps *ops, KvBackend *b, const KvDecodeSpec *spec,
                           KvDecodeResult *out, KvError *err);

/* kv_decode_run on the CPU reference backend. */
KvStatus kv_decode_greedy(const KvModel *m, const KvDecodeSpec *spec, KvDecodeResult *out,
                          KvError *err);

void kv_decode_result_free(KvDecodeResult *r);

/* kv_shadow64_rel_error of a decode run with kv_decode_run / kv_decode_greedy:
 * the prompt from spec, fed = spec->forced when set, else result->tokens.
 * KV_ERR_INPUT also when result's shape (steps, batch, vocab) is not the
 * spec's and the model's. */
KvStatus kv_shadow64_decode_rel_error(const KvModel *m, const KvDecodeSpec *spec,
                                      const KvDecodeResult *result,
                                      double *per_step /* (steps) or NULL */, double *max_rel,
                                      KvError *err);

#endif
