/* gate_external.h: `kvrepro gate --model DIR --external RUN.h5 ...`: the gate
 * for runs another engine recorded in the report schema (DESIGN §8b,
 * docs/SCHEMA.md), e.g. transformers' generate in eager, compile and
 * reduce-overhead modes. It runs no cache variants and no scenarios: the CPU
 * reference decodes each distinct prompt batch the files hold, and every
 * external run is judged against it and against its own eager mode and
 * repeat 0, with the same table, exit codes, JUnit and HDF5 report as the
 * matrix gate (cmd_gate.c). */
#ifndef KV_GATE_EXTERNAL_H
#define KV_GATE_EXTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "compare.h"

/* The bf16 yardstick (gate_external.c, ext_bf16_yardstick): a bf16 run's
 * max_rel_err is this many times the spread of the engine's own bf16 eager
 * runs under other kernels (a correct bf16 run's distance from the fp32
 * reference measured under twice that spread: docs/measurements.md), and a
 * top-1 margin of this many bf16 ulps of the largest logit is a near-tie
 * (logits that tie in bf16 differ by a few ulps in another kernel). */
#define KV_BF16_SPREAD_MULT 4
#define KV_BF16_TIE_ULPS 4

typedef struct {
    const char *model_dir;            /* --model DIR: the checkpoint the runs decoded */
    const char *const *paths;         /* (n_paths) --external files, in the order given */
    int n_paths;
    const char *report_path;          /* --report, or NULL */
    const char *junit_path;           /* --junit, or NULL */
    KvTolerances tol;                 /* the defaults with every --tol applied */
    bool tol_max_rel_err_set;         /* --tol max_rel_err given: it overrides calibration */
    bool calibrate;                   /* calibrate max_rel_err per prompt batch (matrix.h
                                       * kv_gate_calibrate); --no-calibrate: o->tol as is */
    uint64_t weight_seed, prompt_seed; /* stored in the report as given */
    int64_t full_logits_max_vocab;    /* above it the reference runs keep top-k (after all
                                       * comparisons), as in the matrix gate */
    bool quiet, verbose, timings;
    bool allow_large;                 /* --allow-large-work: above KV_GATE_MAX_WORK_FLOP */
} KvExternalOptions;

/* Runs the external gate and returns the exit code: 0 when no comparison
 * failed, 1 when one did, 2 for bad input (a file that cannot be read as a
 * report, a run label given twice, a run whose vocab is not the model's,
 * a prompt the model cannot take, two prompt batches under one scenario
 * name: the message names the file, the run and the field, and nothing is
 * written), 3 for an internal error.
 *
 * Calibration (o->calibrate): after each group's reference decode, the
 * reduction-order ensemble and the fp64 shadow of that decode set the
 * group's max_rel_err (kv_gate_calibrate: the members and the three
 * tolerances are in the report), used by its reference and
 * compiled_vs_eager comparisons: another engine's fp32 run differs from the
 * reference by rounding alone, and how much depends on the model and the
 * prompts, so a constant set on the tiny fixtures would cry wolf at real
 * size or let bugs through on small models.
 *
 * Comparisons, for each external run X that was not skipped, in this order:
 *   - reference (0): X vs the CPU reference of its (scenario, steps,
 *     prompt, prompt_real) group, by outputs alone (kv_compare_outputs);
 *   - finite (5);
 *   - repeat (1): repeat k > 0 vs repeat 0 of the same (model, scenario,
 *     variant, backend, mode), bitwise with the first differing probe
 *     (their probe layouts must be identical);
 *   - compiled_vs_eager (6): mode other than eager, repeat 0, vs its eager
 *     twin (same model, scenario, variant, backend), when there is one;
 *   - graph_budget (7): when X records a budget.
 * A twin that was skipped counts as absent. A skipped X has no comparison
 * and shows as SKIP with its reason. The report holds the reference runs
 * first (with their finite checks), then the external runs in file order
 * with all they recorded, then each group's calibration members
 * (`reference~ORDER`, with their reference and finite comparisons). */
int kv_gate_external(const KvExternalOptions *o);

#endif
