/* matrix.h: the gate's run matrix (DESIGN §4-§6): for each model and
 * scenario, the reference run, then every selected variant x backend x mode
 * x repeat, each recorded as a KvRun, and every comparison the design
 * requires, appended to a KvReport. */
#ifndef KV_MATRIX_H
#define KV_MATRIX_H

#include <stdbool.h>
#include <stdint.h>

#include "backend.h"
#include "cache.h"
#include "compare.h"
#include "decode.h"
#include "model.h"
#include "rate.h"
#include "report.h"
#include "scenario.h"
#include "script.h"
#include "status.h"

/* Logits kept per row when the vocabulary is too large to store whole. */
#define KV_TOPK 16
/* Failing runs per unit that keep their full logits where the others keep
 * their top-k (kv_gate_trim_logits). */
#define KV_FAILING_FULL_MAX 8
/* Default --full-logits-max-vocab: tiny and medium fixtures keep everything;
 * real checkpoints (128K-256K vocabularies) keep the top KV_TOPK + a hash. */
#define KV_FULL_LOGITS_MAX_VOCAB 65536

/* How the gate shows progress on stderr: not at all (--quiet), one line
 * rewritten in place (a terminal), or a full line every
 * KV_PROGRESS_EVERY_S seconds (a CI log: not a terminal). */
typedef enum { KV_PROGRESS_OFF = 0, KV_PROGRESS_TTY = 1, KV_PROGRESS_LINES = 2 } KvProgress;
/* A CI log shows the gate is alive without flooding: ~100 lines an hour
 * rather than one per run (a default gate makes ~1000 runs). */
#define KV_PROGRESS_EVERY_S 5.0

/* A backend the gate runs candidates on. */
typedef struct {
    const KvBackendOps *ops;
    char skip[256]; /* "" while its runs may run; else why they cannot (the gate's one
                     * query, or the first run that returned KV_SKIP): every later run
                     * on it is recorded as skipped with this reason */
} KvGateBackend;

typedef struct {
    const char *const *scenarios;     /* (n_scenarios) names of the default set */
    int n_scenarios;
    const KvScenario *custom;         /* --prompts: replaces the scenarios when non-NULL */
    const KvCacheOps *const *variants; /* (n_variants) */
    int n_variants;
    KvGateBackend *backends;          /* (n_backends) in report order; skip reasons are
                                       * written as runs meet them */
    int n_backends;
    bool eager, graph;                /* modes */
    int repeats;                      /* >= 1 */
    int64_t replay_every;             /* replay check stride in decode steps (0 = off) */
    unsigned faults;                  /* planted faults for candidate runs (0 = clean) */
    KvTolerances tol;
    bool tol_max_rel_err_set;         /* --tol max_rel_err given: it overrides calibration */
    bool calibrate;                   /* run the reduction-order ensemble per unit and judge
                                       * reference agreement by its spread (ensemble.h) */
    uint64_t prompt_seed;
    int shard_i, shard_n;             /* run the (model, scenario) units u with
                                       * u % shard_n == shard_i - 1 */
    bool timings;                     /* keep each run's wall time in the HDF5 report too
                                       * (breaks byte-identical reports); the runs always
                                       * carry it, for JUnit (kv_gate_write_outputs) */
    KvProgress progress;              /* progress on stderr */
    int64_t *runs_done;               /* progress: runs finished so far (all models) */
    double *progress_last;            /* progress: when the last KV_PROGRESS_LINES line was
                                       * printed (CLOCK_MONOTONIC seconds) */
    int64_t runs_total;               /* progress: runs the whole gate will make */
    int64_t *runs_accounted;          /* planned runs made, or recorded as skipped with a
                                       * reason (a skipped entry stands for the repeats it
                                       * ends); NULL: not counted. The gate holds it to
                                       * the units x kv_gate_runs_planned_per_unit: a run
                                       * that silently did not happen fails the gate */
    double started;                   /* progress: CLOCK_MONOTONIC seconds at gate start */
    double progress_every;            /* progress: seconds between two lines in a log
                                       * (KV_PROGRESS_EVERY_S; KVREPRO_PROGRESS_EVERY) */
    int64_t full_logits_max_vocab;    /* above this vocabulary, runs keep only their top
                                       * KV_TOPK logits per row (after all comparisons) */
    int64_t max_new_tokens;           /* > 0: the scenarios decode at most this many tokens */
    bool mutation;                    /* a --faults run: above full_logits_max_vocab its
                                       * planted-fault passes keep no full logits */
    bool stop_at_catch;               /* a planted-fault pass stops at its first failed
                                       * comparison (--first-catch; never the clean pass) */
    int64_t *runs_stopped;            /* planned runs a pass did not make because it had
                                       * stopped at its catch; NULL: not counted */
    KvTolerances *model_tol_out;      /* a pass that calibrates per model writes the model's
                                       * tolerance here (NULL: not asked) */
    const KvTolerances *model_tol_in; /* non-NULL: a per-model pass takes this tolerance (its
                                       * clean pass's) and calibrates no unit; its units run in
                                       * the scenarios' order */
    bool share_prefill;               /* CPU variant runs take the reference's first prefill
                                       * forward (prefill_tape.h); false: each computes its own
                                       * (--no-shared-prefill) */
    const struct KvStreamTape *stream; /* set by kv_gate_run_model for one model's units
                                        * (stream_tape.h): a reference whose first row is
                                        * one of its cuts takes that row from it; NULL: none */
    /* progress by estimated cost (rate.h), NULL / 0 when not measured: the
     * rate, the whole gate's estimated seconds, and the estimated seconds
     * of the work done so far (runs finished, plus the running one's share) */
    const KvRate *rate;
    double est_total;
    double *est_done;
    double *est_running;
} KvGateOptions;

/* Whether (model, scenario) unit u (counted over all models) is in this
 * gate's shard: u % shard_n == shard_i - 1. Every count and every run
 * loop asks this one function. */
bool kv_gate_unit_in_shard(const KvGateOptions *o, int64_t u);

/* Candidate + reference runs one (model, scenario) unit makes (runs on
 * skipped backends are entries, not runs that take time). */
int64_t kv_gate_runs_per_unit(const KvGateOptions *o);

/* The runs one unit plans on every selected backend, those that cannot
 * run included (each is made or recorded as skipped with its reason:
 * runs_accounted). */
int64_t kv_gate_runs_planned_per_unit(const KvGateOptions *o);

/* Prints the progress line for the runs done so far (at the end of the
 * gate: the final count), as o->progress says. */
void kv_gate_progress_print(const KvGateOptions *o, const char *current, bool final);

/* CLOCK_MONOTONIC in seconds (progress and --timings). */
double kv_gate_now(void);

/* The CPU work the gate runs without --allow-large-work. Measured on 2
 * cores: the default gate on the tiny fixtures is ~76 GFLOP in 50-80 s
 * (overhead-bound, ~1.5 GFLOP/s); the ~100M-parameter medium fixtures decode
 * at ~20 GFLOP/s, and their default gate is ~18 TFLOP (~15 min). Above 20
 * TFLOP a gate runs for hours, which deserves a conscious choice, not a
 * config.json whose window (the scenarios are sized in multiples of it)
 * happens to be 4096 (a tiny model with that window: ~66 TFLOP). */
#define KV_GATE_MAX_WORK_FLOP 2e13 /* both gates: the matrix and --external */

/* The CPU work a gate will do, stated before it runs. */
typedef struct {
    int64_t runs;    /* runs planned, every backend's (the report's /runs) */
    int64_t max_steps, max_batch, max_prompt_len; /* the largest unit's sizes */
    int64_t decodes; /* CPU decodes, all kinds: */
    int64_t references, twins, members, shadows, candidates;
    int64_t streams; /* shared prefill streams (stream_tape.h), one per model at most; the
                      * references whose first row is cut from one do not count that row */
    int64_t tokens;  /* token positions those decodes run through the model (a candidate's
                      * shared prefill columns not counted) */
    double flop;     /* ~floating-point operations (matmuls and attention) */
    double seconds;  /* estimated wall time at the measured rate (0: not estimated) */
    /* bytes one unit holds at once beside the weights, at most (the largest
     * unit's): a run's state (its static cache and activations), a
     * variant's cache beside it, the shared prefill's tape; and the unit
     * it is, for the refusal's message */
    double unit_bytes;
    char unit_name[160];
    double report_bytes; /* what the report holds in memory until it is written, all units */
    double stream_bytes; /* the model's stream (stream_tape.h) held through its units */
} KvGateWork;

/* Adds to *w the CPU work of the units of one model with config cfg that
 * this shard runs (the same units, scenario sizes, --max-new-tokens cap and
 * replay checks as kv_gate_run_model; *unit advances the same way), and
 * refuses (KV_ERR_INPUT) a unit whose sizes the report could not hold
 * (kv_limits_check_scenario). rate (NULL: none) adds the estimated wall
 * time to w->seconds. */
KvStatus kv_gate_work_add(const KvConfig *cfg, const KvGateOptions *o, const KvRate *rate,
                          int *unit, KvGateWork *w,
                          KvError *err);

/* Names a run: model, scenario, variant, backend, mode, repeat, and the
 * planted faults' names (0: clean, ""). */
void kv_run_identify(KvRun *r, const char *model, const char *scenario, const char *variant,
                     const char *backend, const char *mode, int repeat, unsigned faults);

/* Records in run (made by kv_run_init, identity aside) the decode of spec
 * that gave res: the sizes, a copy of the prompt, its script (switch and
 * shift; NULL: none), each row's logits hash, the probes' names (cfg's; none
 * when res has no probes), the graph, replay and non-finite findings; res's
 * tokens, logits, margins and probe hashes move into run. The one place a
 * decode becomes a report run: the gate's runs, a golden's (another
 * engine's decode held as a result) and the tests' all record the same
 * fields. res is freed on every return; KV_ERR_INTERNAL when out of memory
 * (run then holds what was allocated, for kv_run_free). The wall time and
 * the graph budget are the caller's. */
KvStatus kv_run_from_result(KvRun *run, const KvConfig *cfg, const KvDecodeSpec *spec,
                            const KvScript *script, KvDecodeResult *res, KvError *err);

/* Appends a run made by kv_run_init to rep->runs; returns its index, or -1
 * when out of memory. */
int64_t kv_gate_add_run(KvReport *rep);

/* Appends a copy of *c to rep->comparisons; KV_ERR_INTERNAL when out of
 * memory. */
KvStatus kv_gate_add_comparison(KvReport *rep, const KvComparison *c, KvError *err);

/* The reference run of scenario sc: the CPU reference decode of its prompt
 * batch (variant "reference", backend cpu, mode eager, repeat 0, named
 * model_name / sc->name), appended to rep at *ref together with its finite
 * check, which is also copied to *fin (a reference that is not finite has
 * nothing to judge candidates by). Errors of the decode are returned as
 * they are (KV_ERR_INPUT for a batch the model cannot take). tape (NULL:
 * none) receives its first prefill forward (prefill_tape.h) for the
 * scenario's CPU variant runs. */
KvStatus kv_gate_run_reference(const KvModel *m, const char *model_name, const KvScenario *sc,
                               const KvGateOptions *o, struct KvPrefillTape *tape, KvReport *rep,
                               int64_t *ref, KvComparison *fin, KvError *err);

/* A CPU reference decode of scenario sc teacher-forced with forced ((new
 * tokens, batch) token ids fed after each step; NULL: free-running),
 * appended to rep as run *idx (variant "reference", backend cpu, mode
 * eager) with its finite check: a scenario's fresh twin, or the external
 * gate's reference fed an external run's tokens. */
KvStatus kv_gate_run_forced_reference(const KvModel *m, const char *model_name,
                                      const KvScenario *sc, const KvGateOptions *o,
                                      const int32_t *forced, KvReport *rep, int64_t *idx,
                                      KvError *err);

/* The rows-alone check of the reference (KV_CMP_ROW_ALONE, DESIGN §6): each
 * row of run r, a left-padded batch decoded on the CPU reference fed the
 * tokens `fed` ((steps, B): r's own when it ran free, a golden's when it was
 * forced), decoded again alone from its real tokens, fed the same tokens,
 * must give bitwise r's logits at every step. *c gets the verdict, the first
 * (step, row) that differs and the message; its run_a and run_b are for
 * the caller to set. r must hold full logits. */
KvStatus kv_gate_rows_alone(const KvModel *m, const KvRun *r, const int32_t *fed,
                            const struct KvStreamTape *stream, KvComparison *c, KvError *err);

/* kv_tolerances_record of o->tol, with the root max_rel_err's reason
 * saying whether it is used: set by --tol (it overrides calibration), not
 * used (calibrated per unit), or the value itself (--no-calibrate). */
KvStatus kv_gate_record_tolerances(const KvGateOptions *o, KvReport *rep, KvError *err);

/* Appends a tolerance row (name, value, why) to rep's /tolerances. */
KvStatus kv_gate_add_tolerance(KvReport *rep, const char *name, double value, const char *reason,
                               KvError *err);

/* The calibration ensemble of one unit (ensemble.h, DESIGN §6): the
 * reference run rep->runs[ref] again under each valid reduction order,
 * each compared with it. Their largest relative logit error is the spread a
 * correct implementation shows on this model and these prompts; the
 * reference's own error against its fp64 shadow (shadow64.h) is the
 * yardstick of how far fp32 may be from exact, recorded per step on the
 * reference run (KvRun.fp64_rel_err). *tol is o->tol with max_rel_err set
 * to the larger of KV_CAL_SPREAD_MULT x spread and KV_CAL_FP64_MULT x the
 * fp64 error, never below KV_CAL_FLOOR (compare.h says why), unless
 * o->tol_max_rel_err_set (--tol max_rel_err overrides, and the report says
 * what calibration would have given). The members, their reference and
 * finite comparisons (judged by the calibrated tolerance: a member flipping
 * a token above the tie margin fails) and three tolerances per unit
 * (spread@M/S, fp64_err@M/S, max_rel_err@M/S, each with its reason) go into
 * rep. Nothing is run when !o->calibrate or !ref_finite (a reference that
 * is not finite has nothing to calibrate): *tol = o->tol. The reference run
 * must hold full logits. */
KvStatus kv_gate_calibrate(const KvModel *m, const char *model_name, const KvScenario *sc,
                           const KvGateOptions *o, int64_t ref, bool ref_finite, KvReport *rep,
                           KvTolerances *tol, KvError *err);

/* Replaces a run's full logits by each row's KV_TOPK largest (descending,
 * ties to the lowest id); logits_hash still identifies the full rows. */
KvStatus kv_gate_keep_topk(KvRun *r, KvError *err);

/* After every comparison of runs [lo, hi) is made: each of them that holds
 * full logits keeps only its top-k (kv_gate_keep_topk), except the runs
 * named in keep ((n_keep) indices: the references) and both runs of every
 * comparison from cmp_from on that failed within a tolerance (reference
 * agreement, compiled vs eager, a shift) or failed its finite check: those
 * keep their full logits (the first failing_max of them, normally
 * KV_FAILING_FULL_MAX), so `kvrepro diff` and the plots can measure what
 * failed. */
KvStatus kv_gate_trim_logits(KvReport *rep, int64_t lo, int64_t hi, const int64_t *keep,
                             int64_t n_keep, int64_t failing_max, int64_t cmp_from,
                             KvError *err);

/* Whether the units of a model with config cfg calibrate once, on the unit
 * with the most token positions, instead of each its own (DESIGN §6): the
 * real-scale set (kv_scenario_scale), calibrated, not sharded. */
bool kv_gate_calibrates_per_model(const KvConfig *cfg, const KvGateOptions *o);

/* *needed: whether the calibration's reduction-order members run on model
 * cfg: o->calibrate, except where the model calibrates once at real scale
 * and no comparison of the gate is judged by a tolerance (only CPU runs,
 * held bitwise, and no context shift judged on this model): there the
 * fp64 shadow runs alone and max_rel_err@ says why (DESIGN §6). */
KvStatus kv_gate_members_needed(const KvConfig *cfg, const KvGateOptions *o, bool *needed,
                                KvError *err);

/* Whether a comparison of rep from index `from` on failed. */
bool kv_gate_failed_since(const KvReport *rep, int64_t from);

/* Runs the matrix for one model and appends runs and comparisons to rep.
 * *unit is the running (model, scenario) counter used for sharding. */
KvStatus kv_gate_run_model(const KvModel *m, const char *model_name, const KvGateOptions *o,
                           int *unit, KvReport *rep, KvError *err);

#endif
