/* compare.h: the one comparator module (DESIGN §6). Reference agreement
 * within named tolerances and tie-aware tokens; reproducibility bitwise,
 * naming the first differing (step, row, probe) from the probe hashes. */
#ifndef KV_COMPARE_H
#define KV_COMPARE_H

#include <stdbool.h>
#include <stddef.h>

#include "report.h"
#include "report_h5.h"
#include "status.h"

/* Default tolerances, each with the reason it has this value. */
/* Largest logit error relative to the largest |logit| of the row. F32
 * backends that differ only in reduction order (cuBLAS vs the CPU pattern,
 * torch vs the reference) stay below 1e-5 (measured 4.9e-6 against
 * transformers); a window off by one moves logits by 0.38..0.59 relative
 * (measured on the goldens). 1e-4 sits between with margin on both sides. */
#define KV_TOL_MAX_REL_ERR 1e-4
/* A token flip counts as a near-tie, not a failure, when the reference's
 * top-1 margin is at most this. Logit errors allowed by KV_TOL_MAX_REL_ERR
 * are <= 1e-4 x |logit| (logits are O(1..10)), so a margin above 1e-3 can
 * only flip through a real bug. */
#define KV_TOL_TIE_MARGIN 1e-3

/* Calibrated tolerances (DESIGN §6). Per (model, scenario) unit the gate
 * measures two things: the spread, the largest relative logit error of the
 * reference run again under KV_ENSEMBLE_SIZE other valid reduction orders
 * (ensemble.h), and the fp64 error, the reference's own error against an
 * fp64 forward of the same math (shadow64.h). A correct fp32 candidate c is
 * about as far from exact as the reference r, so |c - r| <= |c - x| + |r - x|
 * is about 2 x the fp64 error, and the spread samples |c - r| directly for
 * three orders. Other implementations reorder more than our three members
 * (cuBLAS blocking and split-K, fused softmax, another exp or rsqrt), so
 * each gets headroom. Measured on the transformers goldens (fixtures/hf):
 * torch vs the reference 1.8e-6 (mistral) and 4.9e-6 (gemma2), the fp64
 * errors 1.0e-6 and 4.7e-6: ratio <= 1.8 to the fp64 error, so 8 x leaves
 * over 4 x margin; on the tiny fixtures the spread is 0.7..2.2e-6 and the
 * fp64 error 0.6..1.2e-6, so 16 x the spread is about as wide. A real bug
 * sits far above either: TF32 moves logits 1.6e-3 (50 x the calibrated
 * value on the tiny fixtures), a window off by one 0.2..2. */
#define KV_CAL_SPREAD_MULT 16
#define KV_CAL_FP64_MULT 8
/* The least calibrated max_rel_err: should every member agree bitwise with
 * the reference (a spread of 0), a few fp32 ulps of the largest logit. */
#define KV_CAL_FLOOR 1e-6

/* One row's relative error as every reference comparison measures it:
 * max_i |cand - ref| / max_i |ref| (the denominator 1 when ref is all
 * zero); non-finite values count in neither max (the finite check judges
 * them). */
double kv_compare_row_rel_err(const float *ref /* (n) */, const float *cand /* (n) */,
                              int64_t n);

/* The calibrated max_rel_err: max(KV_CAL_SPREAD_MULT x spread,
 * KV_CAL_FP64_MULT x fp64, KV_CAL_FLOOR); a NaN term lends nothing. */
double kv_cal_tolerance(double spread, double fp64);
/* The farthest the reference may be from its own fp64 shadow before the
 * reference itself fails (comparison fp64_shadow): a bug in the reference
 * moves every run alike, so no candidate comparison sees it, but the fp64
 * forward is written apart from the fp32 one. The fp64 errors measured
 * (above) are 0.6e-6..4.7e-6; the trained Gemma 3 270M reference agrees
 * with transformers to 5e-6; 1e-4 leaves 20 x over the largest for deeper
 * models and longer decodes, and every reference bug tried moves logits by
 * 1e-2 or more. */
#define KV_FP64_MAX_REL_ERR 1e-4

typedef struct {
    double max_rel_err;
    double tie_margin;
} KvTolerances;

/* The defaults above. */
KvTolerances kv_tolerances_default(void);

/* Applies "NAME=VALUE" (names: max_rel_err, tie_margin). KV_ERR_INPUT with a
 * message naming the text when the name is unknown or the value is not a
 * finite number >= 0. */
KvStatus kv_tolerances_set(KvTolerances *t, const char *assignment, KvError *err);

/* Fills rep->tolerances with t's values and reasons. */
KvStatus kv_tolerances_record(const KvTolerances *t, KvReport *rep, KvError *err);

/* Candidate vs reference (kind KV_CMP_REFERENCE). Fails on a NaN or Inf
 * logit on either side (the row is then left out of the error metrics), a
 * logit error above max_rel_err or a token flip where the reference's margin exceeds
 * tie_margin; flips at or under it are counted as near-ties. The first
 * differing probe (if any) is named as the first divergence. */
void kv_compare_reference(const KvRun *ref, const KvRun *cand, const KvTolerances *t,
                          int64_t ref_index, int64_t cand_index, KvComparison *out);

/* After kv_compare_reference on the CPU backend: a candidate there runs the
 * reference's own arithmetic over its variant's cache, so with the
 * canonical key order (DESIGN §3) it is bitwise the reference, and any
 * difference is a bug however small (a variant reading its keys in slot
 * order lands within any rounding tolerance). A passing *out whose runs
 * differ in a probe hash, a logits hash or a token becomes a failure
 * naming the first (step, row, probe); anything else is left as it is. */
void kv_compare_require_bitwise(const KvRun *ref, const KvRun *cand, KvComparison *out);

/* A run that another engine started but could not complete is stored as
 * skipped (it has no data) with a skip_reason that starts with this; its
 * finite check fails (python/kvrepro/capture.py writes such runs). */
#define KV_RUN_FAILED_PREFIX KV_REPORT_FAILED_MARKER /* one marker: the reader checks it */

/* One run's own check (kind KV_CMP_FINITE, a = b = index): fails when its
 * logits (full or kept top-k) or, where the decode checked them
 * (run->nonfinite_checked), its probes hold a NaN or Inf, naming the first
 * (step, row, probe, element) and the value; the reference run's message
 * says that the reference itself is not finite. A skipped run's check is
 * SKIP, but FAIL when its skip_reason starts with KV_RUN_FAILED_PREFIX. */
void kv_compare_finite(const KvRun *run, int64_t index, KvComparison *out);

/* a vs b, bitwise (repeat, graph vs eager, variant vs variant): the first
 * (step, row, probe) whose hash differs, else logits/tokens bytes. */
void kv_compare_bitwise(const KvRun *a, const KvRun *b, KvCompareKind kind, int64_t a_index,
                        int64_t b_index, KvComparison *out);

/* a vs b by their outputs alone: logits (or, when either kept only top-k,
 * their logits hashes) and tokens bitwise, the first differing (step, row);
 * first_probe -1. For runs whose probe layouts differ (another engine's
 * probes hash other arithmetic), where a probe index would mean nothing. */
void kv_compare_bitwise_outputs(const KvRun *a, const KvRun *b, KvCompareKind kind,
                                int64_t a_index, int64_t b_index, KvComparison *out);

/* Candidate vs a baseline of another engine, or of the same engine in
 * another mode (kind KV_CMP_REFERENCE: a run of another engine vs the CPU
 * reference; KV_CMP_COMPILED: a compiled mode vs its eager twin): the
 * tolerances and tie-aware token rule of kv_compare_reference, by the
 * outputs alone. No probe is named (probe hashes of different arithmetic
 * never match): first_step/first_row are the first token flip above the
 * tie margin, logit row beyond max_rel_err or non-finite logit; first_probe
 * is -1. There is no teacher forcing for a recording: after a flip at a
 * near-tie the rest of that row is not compared (the message says from
 * which step). When either run kept only its top-k logits, the kept values
 * are compared with the other run's at the same ids (both top-k: the ids
 * both kept), max_rel_err is relative to the baseline's largest |logit|
 * over all it kept, KL is NaN, and the message says only top-k were
 * compared. A kept id outside the vocabulary fails ("cannot compare"). */
void kv_compare_outputs(const KvRun *base, const KvRun *cand, const KvTolerances *t,
                        KvCompareKind kind, int64_t base_index, int64_t cand_index,
                        KvComparison *out);

/* kv_compare_outputs against a baseline teacher-forced with cand's tokens
 * (both fed alike at every step): no row stops at a near-tie flip, every
 * step of every row is compared (gate --external after a near-tie). */
void kv_compare_outputs_forced(const KvRun *forced_base, const KvRun *cand, const KvTolerances *t,
                               KvCompareKind kind, int64_t base_index, int64_t cand_index,
                               KvComparison *out);

/* True when a and b record the same probes, name for name, in the same
 * order (so a probe index means the same probe in both). */
bool kv_probe_layouts_equal(const KvRun *a, const KvRun *b);

/* Repeat k (run) vs repeat 0 (first), kind KV_CMP_REPEAT: kv_compare_bitwise
 * when their probe layouts are identical; otherwise a failure naming the
 * first differing probe name (repeats of one configuration record the same
 * probes; hashes of different layouts cannot be compared index by index). */
void kv_compare_repeat(const KvRun *first, const KvRun *run, int64_t first_index, int64_t index,
                       KvComparison *out);

/* One run's graph budget (kind KV_CMP_GRAPH_BUDGET, a = b = index): fails
 * when graphs_captured exceeds graph_budget, e.g. "12 decode graphs (11
 * recompiles), budget 1: the decode recompiles"; skipped when the run was
 * skipped or records no budget (graph_budget < 0). */
void kv_compare_graph_budget(const KvRun *run, int64_t index, KvComparison *out);

/* A reused state against a fresh run of the same context (kind
 * KV_CMP_FRESH, DESIGN §5): reuse's steps from `offset` on (the request
 * switch of prefix_reuse_after_wrap) against fresh's steps from 0, logits
 * and tokens bitwise (or logits hashes where either kept only top-k). The
 * first differing (step, row) is named in reuse's numbering; no probe (the
 * switch's forward and the fresh prefill hash different rows). Fails when
 * the two do not line up (fresh's steps + offset != reuse's, another batch
 * or vocabulary). */
/* A context-shifted run against a fresh run of the shifted context (kind
 * KV_CMP_SHIFT, DESIGN §5): shifted's steps from `offset` (the shift step)
 * on against fresh's steps from 0, teacher-forced with shifted's tokens so
 * a near-tie flip does not end the comparison. The rule of
 * kv_compare_reference with t's tolerances (fresh is the baseline: its
 * margins decide a near-tie): a non-finite logit, a logit error above
 * max_rel_err relative to fresh's largest |logit| of the row, or a token
 * flip above tie_margin fails. The first failing (step, row) is named in
 * shifted's numbering, no probe (the shifted and fresh forwards hash
 * different positions). Fails when the two do not line up. */
void kv_compare_shifted(const KvRun *shifted, const KvRun *fresh, int64_t offset,
                        const KvTolerances *t, int64_t shifted_index, int64_t fresh_index,
                        KvComparison *out);

void kv_compare_fresh(const KvRun *reuse, const KvRun *fresh, int64_t offset, int64_t reuse_index,
                      int64_t fresh_index, KvComparison *out);

/* The replay check recorded in run (kind KV_CMP_REPLAY; a = b = index). */
void kv_compare_replay(const KvRun *run, int64_t index, KvComparison *out);

/* A short label "variant/backend/mode/rN" for messages. */
void kv_run_label(const KvRun *r, char *out, size_t len);

/* Selects a run by index ("12") or by its full label
 * "model/scenario/variant[+fault]/backend/mode/rN" (exact: a clean and a
 * faulty run of one variant are different runs); -1 when there is none. */
int64_t kv_report_find_run(const KvReport *rep, const char *sel);

#endif
