/* matrix.h: the gate's run matrix (DESIGN §4-§6): for each model and
 * scenario, the reference run, then every selected variant x backend x mode
 * x repeat, each recorded as a KvRun, and every comparison the design
 * requires, appended to a KvReport. */
#ifndef KV_MATRIX_H
#define KV_MATRIX_H

#include <stdbool.h>
#include <stdint.h>

#include "cache.h"
#include "compare.h"
#include "model.h"
#include "report.h"
#include "scenario.h"
#include "status.h"

/* Logits kept per row when the vocabulary is too large to store whole. */
#define KV_TOPK 16
/* Default --full-logits-max-vocab: tiny and medium fixtures keep everything;
 * real checkpoints (128K-256K vocabularies) keep the top KV_TOPK + a hash. */
#define KV_FULL_LOGITS_MAX_VOCAB 65536

typedef struct {
    const char *const *scenarios;     /* (n_scenarios) names of the default set */
    int n_scenarios;
    const KvScenario *custom;         /* --prompts: replaces the scenarios when non-NULL */
    const KvCacheOps *const *variants; /* (n_variants) */
    int n_variants;
    bool cpu, cuda;                   /* backends */
    bool eager, graph;                /* modes */
    int repeats;                      /* >= 1 */
    int64_t replay_every;             /* replay check stride in decode steps (0 = off) */
    unsigned faults;                  /* planted faults for candidate runs (0 = clean) */
    KvTolerances tol;
    uint64_t prompt_seed;
    int shard_i, shard_n;             /* run the (model, scenario) units u with
                                       * u % shard_n == shard_i - 1 */
    bool timings;                     /* record wall time (breaks byte-identical reports) */
    bool progress;                    /* progress line on stderr */
    int64_t *runs_done;               /* progress: runs finished so far (all models) */
    int64_t runs_total;               /* progress: runs the whole gate will make */
    double started;                   /* progress: CLOCK_MONOTONIC seconds at gate start */
    int64_t full_logits_max_vocab;    /* above this vocabulary, runs keep only their top
                                       * KV_TOPK logits per row (after all comparisons) */
} KvGateOptions;

/* Candidate + reference runs one (model, scenario) unit makes (CPU runs;
 * skipped CUDA entries are not runs that take time). */
int64_t kv_gate_runs_per_unit(const KvGateOptions *o);

/* CLOCK_MONOTONIC in seconds (progress and --timings). */
double kv_gate_now(void);

/* Runs the matrix for one model and appends runs and comparisons to rep.
 * *unit is the running (model, scenario) counter used for sharding. */
KvStatus kv_gate_run_model(const KvModel *m, const char *model_name, const KvGateOptions *o,
                           int *unit, KvReport *rep, KvError *err);

#endif
