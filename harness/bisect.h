/* bisect.h: finding where two recorded runs part (DESIGN §6), from their
 * probe hashes alone, and re-executing both up to that step with full
 * probe values (`kvrepro bisect`). */
#ifndef KV_BISECT_H
#define KV_BISECT_H

#include <stdbool.h>
#include <stdint.h>

#include "decode.h"
#include "model.h"
#include "report.h"
#include "status.h"

/* The first point at which two runs differ, in execution order: the
 * earliest step; within it the first probe in probe order (the order the
 * forward computes them); within that the lowest batch row. */
typedef struct {
    int64_t step, row, probe; /* -1 when the runs agree everywhere recorded */
    int64_t layer;            /* the probe's layer, -1 for embed, final_norm, logits */
    bool by_tokens;           /* no probes recorded: found from tokens / logits hashes */
} KvBisectPoint;

/* Checks, before anything is indexed, that runs a and b can be compared
 * point by point: neither skipped; the same model name, steps, batch, vocab
 * and prompt length; the same n_probes and identical probe names (a probe
 * index must mean the same probe in both); every recorded token in
 * [0, vocab). name_a and name_b say where the runs are in messages, e.g.
 * "R.h5: runs/0012". KV_ERR_INPUT naming both runs and the field with both
 * values; for the probes, the first differing index and both names. */
KvStatus kv_bisect_check_pair(const KvRun *a, const char *name_a, const KvRun *b,
                              const char *name_b, KvError *err);

/* Checks that a recorded run (named `name` in messages) fits model m
 * (named model_name) so that a rerun on m reproduces its layout and can be
 * indexed with the recording's indices: not skipped; its vocab is the
 * model's; every prompt id (the forward embeds pads too) and recorded token
 * is in [0, vocab); and its probe layout is exactly the one the forward
 * produces for m (kv_probe_count, kv_probe_name): same count, same name at
 * every index. KV_ERR_INPUT, e.g. "R.h5: runs/0012 records 30 probes,
 * gemma2-tiny has 31 (probe 1: recorded 'layer0.k', model 'layer0.q'); the
 * report does not match this model". */
KvStatus kv_bisect_check_model(const KvRun *run, const char *name, const KvModel *m,
                               const char *model_name, KvError *err);

/* Checks that kvrepro can re-execute a recorded run at all: a run of
 * another engine (`gate --external`: a backend kvrepro does not have, such
 * as "torch-cuda", or an engine recorded) cannot be, whatever the model.
 * KV_ERR_INPUT naming the run, its backend and engine, and what bisect can
 * still do without --rerun. */
KvStatus kv_bisect_check_rerunnable(const KvRun *run, const char *name, KvError *err);

/* Compares the recorded probe hashes (or, when the runs have none, tokens
 * and logits hashes). The runs are checked first (kv_bisect_check_pair,
 * named "run A" and "run B"). out->layer is set only when the runs' probes
 * are the forward's layout (kv_probe_name for some layer count); for a
 * report from another engine with other probes it stays -1. */
KvStatus kv_bisect_find(const KvRun *a, const KvRun *b, KvBisectPoint *out, KvError *err);

/* The probes whose values feed probe p, in probe-index order (at most 2):
 * q/k/v <- the layer input (previous residual or embed); cache <- k, v;
 * attn <- q, cache; mlp <- attn; residual <- mlp, layer input; final_norm
 * <- last residual; logits <- final_norm; embed <- none. Returns the count. */
int kv_bisect_inputs(int64_t n_probes, int64_t p, int64_t inputs[2]);

/* Re-executes a recorded run (its prompt, prefill chunk, variant, backend,
 * mode and planted faults) on model m for steps 0..step, recording probes
 * and, on a backend that keeps them (the CPU), the full probe values of the
 * last step (out->dump; left empty by the others). KV_ERR_INPUT when the run
 * names an unknown variant, backend or fault, its backend cannot run here,
 * or it does not fit the model (kv_bisect_check_model). On success out has step + 1 steps, the run's
 * batch and the run's n_probes, so recorded indices are valid in it. */
KvStatus kv_bisect_rerun(const KvModel *m, const KvRun *run, int64_t step, KvDecodeResult *out,
                         KvError *err);

/* kv_bisect_rerun that also digests every step's full probe values: on a
 * backend that keeps dumps, *digest (malloc'd, the caller frees it) is
 * (step + 1, n_probes, batch), the FNV-1a 64 of each probe row's dumped
 * length and floats at each step, indexed like probe_hash; NULL on a backend
 * that keeps none. Unlike a recorded probe hash, which is whatever its
 * engine's hook covered, a digest covers every value the dump holds, so it
 * is what the walk back (kv_bisect_walk_back) trusts. On failure *digest is
 * NULL and out is freed. */
KvStatus kv_bisect_rerun_digests(const KvModel *m, const KvRun *run, int64_t step,
                                 KvDecodeResult *out, uint64_t **digest, KvError *err);

/* The walk back of bisect --rerun. The recorded hashes named `named`
 * (kv_bisect_find); da and db are the digests of both reruns to at least
 * named->step (kv_bisect_rerun_digests). Sets *out to the earliest point, in
 * execution order (step, then probe order, then row), at or before the
 * named point whose full values differ: every probe of the steps before
 * named->step, and at named->step the probes before named->probe (every
 * row) and rows 0..named->row of named->probe. The
 * localisation from the hashes is consistent when *out is `named`; an
 * earlier *out means a probe hash missed a difference there (an input of
 * the named probe, or anything computed before it). out->step is -1 when
 * nothing up to the named probe differs (the rerun does not show the
 * divergence there). The layout must be the forward's (kv_bisect_check_model):
 * out->layer comes from kv_probe_layer. */
void kv_bisect_walk_back(const uint64_t *da, const uint64_t *db, int64_t n_probes, int64_t batch,
                         const KvBisectPoint *named, KvBisectPoint *out);

/* Elementwise comparison of one probe's values in two reruns. */
typedef struct {
    int64_t len;          /* floats per row (a and b agree, else shape_differs) */
    bool shape_differs;
    bool differs;         /* any bit differs in any row */
    int64_t first_index;  /* first differing element of the divergent row, -1 if none */
    float value_a, value_b;
    int64_t ulp;          /* ULP distance of that element, -1 when one is NaN */
    double max_abs_diff;  /* over every row; +inf when a NaN meets a number */
} KvBisectDiff;

/* a, b: (batch, len) each; row: the divergent row. */
void kv_bisect_diff(const float *a, int64_t len_a, const float *b, int64_t len_b, int64_t batch,
                    int64_t row, KvBisectDiff *out);

#endif
