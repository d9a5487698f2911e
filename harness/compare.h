/* compare.h: the one comparator module (DESIGN §6). Reference agreement
 * within named tolerances and tie-aware tokens; reproducibility bitwise,
 * naming the first differing (step, row, probe) from the probe hashes. */
#ifndef KV_COMPARE_H
#define KV_COMPARE_H

#include <stdbool.h>
#include <stddef.h>

#include "report.h"
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

/* One run's own check (kind KV_CMP_FINITE, a = b = index): fails when its
 * logits (full or kept top-k) or, where the decode checked them
 * (run->nonfinite_checked), its probes hold a NaN or Inf, naming the first
 * (step, row, probe, element) and the value; the reference run's message
 * says that the reference itself is not finite. */
void kv_compare_finite(const KvRun *run, int64_t index, KvComparison *out);

/* a vs b, bitwise (repeat, graph vs eager, variant vs variant): the first
 * (step, row, probe) whose hash differs, else logits/tokens bytes. */
void kv_compare_bitwise(const KvRun *a, const KvRun *b, KvCompareKind kind, int64_t a_index,
                        int64_t b_index, KvComparison *out);

/* The replay check recorded in run (kind KV_CMP_REPLAY; a = b = index). */
void kv_compare_replay(const KvRun *run, int64_t index, KvComparison *out);

/* A short label "variant/backend/mode/rN" for messages. */
void kv_run_label(const KvRun *r, char *out, size_t len);

/* Selects a run by index ("12") or by its full label
 * "model/scenario/variant[+fault]/backend/mode/rN" (exact: a clean and a
 * faulty run of one variant are different runs); -1 when there is none. */
int64_t kv_report_find_run(const KvReport *rep, const char *sel);

#endif
