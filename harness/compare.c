/* compare.c: comparisons between recorded runs (DESIGN §6). Pure functions
 * of KvRun data, so recorded reports (kvrepro diff) and live runs go through
 * exactly the same code. */
#include "compare.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

KvTolerances kv_tolerances_default(void) {
    KvTolerances t = {KV_TOL_MAX_REL_ERR, KV_TOL_TIE_MARGIN};
    return t;
}

KvStatus kv_tolerances_set(KvTolerances *t, const char *assignment, KvError *err) {
    const char *eq = strchr(assignment, '=');
    if (eq == NULL) {
        return kv_error_set(err, KV_ERR_INPUT, "--tol '%s': expected NAME=VALUE", assignment);
    }
    size_t n = (size_t)(eq - assignment);
    char *end = NULL;
    errno = 0;
    double v = strtod(eq + 1, &end);
    if (errno != 0 || end == eq + 1 || *end != '\0' || !isfinite(v) || v < 0.0) {
        return kv_error_set(err, KV_ERR_INPUT,
                            "--tol '%s': expected a finite number >= 0 after '=', found '%s'",
                            assignment, eq + 1);
    }
    if (n == strlen("max_rel_err") && strncmp(assignment, "max_rel_err", n) == 0) {
        t->max_rel_err = v;
    } else if (n == strlen("tie_margin") && strncmp(assignment, "tie_margin", n) == 0) {
        t->tie_margin = v;
    } else {
        return kv_error_set(err, KV_ERR_INPUT,
                            "--tol '%s': unknown tolerance '%.*s'; expected max_rel_err or "
                            "tie_margin",
                            assignment, (int)n, assignment);
    }
    return KV_OK;
}

KvStatus kv_tolerances_record(const KvTolerances *t, KvReport *rep, KvError *err) {
    free(rep->tolerances);
    rep->tolerances = calloc(2, sizeof *rep->tolerances);
    if (rep->tolerances == NULL) return kv_error_set(err, KV_ERR_INTERNAL, "out of memory");
    rep->n_tolerances = 2;
    snprintf(rep->tolerances[0].name, sizeof rep->tolerances[0].name, "max_rel_err");
    rep->tolerances[0].value = t->max_rel_err;
    snprintf(rep->tolerances[0].reason, sizeof rep->tolerances[0].reason,
             "F32 reduction-order differences stay < 1e-5; a window off by one moves logits "
             "by > 0.3 (relative to the row's largest |logit|)");
    snprintf(rep->tolerances[1].name, sizeof rep->tolerances[1].name, "tie_margin");
    rep->tolerances[1].value = t->tie_margin;
    snprintf(rep->tolerances[1].reason, sizeof rep->tolerances[1].reason,
             "a token flip is a near-tie when the reference's top-1 margin is at most this");
    return KV_OK;
}

int64_t kv_report_find_run(const KvReport *rep, const char *sel) {
    char *end = NULL;
    const long long idx = strtoll(sel, &end, 10);
    if (end != sel && *end == '\0') return idx >= 0 && idx < rep->n_runs ? (int64_t)idx : -1;
    for (int64_t i = 0; i < rep->n_runs; i++) {
        const KvRun *r = &rep->runs[i];
        char run[192], label[384];
        kv_run_label(r, run, sizeof run);
        snprintf(label, sizeof label, "%.64s/%.64s/%s", r->model, r->scenario, run);
        if (strcmp(label, sel) == 0) return i;
    }
    return -1;
}

void kv_run_label(const KvRun *r, char *out, size_t len) {
    char vl[2 * KV_NAME_LEN + 2];
    kv_run_variant_label(r, vl, sizeof vl);
    snprintf(out, len, "%s/%s/%s/r%d", vl, r->backend, r->mode, (int)r->repeat);
}

static void compare_init(KvComparison *c, KvCompareKind kind, int64_t a, int64_t b) {
    memset(c, 0, sizeof *c);
    c->kind = kind;
    c->run_a = a;
    c->run_b = b;
    c->first_step = c->first_row = c->first_probe = -1;
    c->verdict = KV_VERDICT_PASS;
}

/* The first (step, probe, row) whose probe hash differs; false when none. */
static bool first_probe_difference(const KvRun *a, const KvRun *b, int64_t *step, int64_t *row,
                                   int64_t *probe) {
    if (a->probe_hash == NULL || b->probe_hash == NULL || a->n_probes != b->n_probes) return false;
    const int64_t np = a->n_probes, B = a->batch;
    const int64_t steps = a->steps < b->steps ? a->steps : b->steps;
    for (int64_t s = 0; s < steps; s++) {
        for (int64_t p = 0; p < np; p++) {
            for (int64_t r = 0; r < B; r++) {
                const int64_t i = (s * np + p) * B + r;
                if (a->probe_hash[i] != b->probe_hash[i]) {
                    *step = s;
                    *row = r;
                    *probe = p;
                    return true;
                }
            }
        }
    }
    return false;
}

static bool runs_shaped_alike(const KvRun *a, const KvRun *b, KvComparison *out) {
    if (a->steps == b->steps && a->batch == b->batch && a->vocab == b->vocab) return true;
    out->verdict = KV_VERDICT_FAIL;
    snprintf(out->message, sizeof out->message,
             "runs have different shapes: %lld steps x %lld rows x %lld vocab vs %lld x %lld x %lld",
             (long long)a->steps, (long long)a->batch, (long long)a->vocab, (long long)b->steps,
             (long long)b->batch, (long long)b->vocab);
    return false;
}

static bool compare_skipped(const KvRun *a, const KvRun *b, KvComparison *out) {
    const KvRun *sk = a->skipped ? a : (b->skipped ? b : NULL);
    if (sk == NULL) return false;
    out->verdict = KV_VERDICT_SKIP;
    snprintf(out->message, sizeof out->message, "skipped: %s", sk->skip_reason);
    return true;
}

static void describe_divergence(const KvRun *a, const KvRun *b, KvComparison *out,
                                const char *what) {
    char pname[KV_NAME_LEN] = "logits";
    if (out->first_probe >= 0 && a->probe_names != NULL) {
        snprintf(pname, sizeof pname, "%s", a->probe_names[out->first_probe]);
    }
    const int64_t i = out->first_step * a->batch + out->first_row;
    snprintf(out->message, sizeof out->message,
             "%s: first divergence at step %lld row %lld, probe %s (tokens %d vs %d)", what,
             (long long)out->first_step, (long long)out->first_row, pname, a->tokens[i],
             b->tokens[i]);
}

/* a vs b bitwise; use_probes: name the first differing probe from the
 * probe hashes (the runs' probe layouts are the same), else compare the
 * logits and tokens alone. */
static void compare_bitwise(const KvRun *a, const KvRun *b, KvCompareKind kind, int64_t a_index,
                            int64_t b_index, bool use_probes, KvComparison *out) {
    compare_init(out, kind, a_index, b_index);
    if (compare_skipped(a, b, out)) return;
    if (!runs_shaped_alike(a, b, out)) return;
    int64_t s, r, p;
    if (use_probes && first_probe_difference(a, b, &s, &r, &p)) {
        out->first_step = s;
        out->first_row = r;
        out->first_probe = p;
        out->verdict = KV_VERDICT_FAIL;
        describe_divergence(a, b, out, "not bitwise identical");
        return;
    }
    /* No probes (or equal probes): fall back to the logits and tokens. */
    const size_t per = (size_t)(a->batch * a->vocab);
    for (int64_t st = 0; st < a->steps; st++) {
        for (int64_t row = 0; row < a->batch; row++) {
            const size_t off = (size_t)st * per + (size_t)(row * a->vocab);
            /* Full logits when both runs kept them, else their hashes. */
            const bool logits_differ =
                a->logits != NULL && b->logits != NULL
                    ? memcmp(a->logits + off, b->logits + off, (size_t)a->vocab * sizeof(float)) != 0
                    : a->logits_hash != NULL && b->logits_hash != NULL &&
                          a->logits_hash[st * a->batch + row] != b->logits_hash[st * a->batch + row];
            const bool token_differs = a->tokens[st * a->batch + row] != b->tokens[st * a->batch + row];
            if (logits_differ || token_differs) {
                out->first_step = st;
                out->first_row = row;
                out->verdict = KV_VERDICT_FAIL;
                describe_divergence(a, b, out, "not bitwise identical");
                return;
            }
        }
    }
    snprintf(out->message, sizeof out->message, "bitwise identical (%lld steps)", (long long)a->steps);
}

void kv_compare_bitwise(const KvRun *a, const KvRun *b, KvCompareKind kind, int64_t a_index,
                        int64_t b_index, KvComparison *out) {
    compare_bitwise(a, b, kind, a_index, b_index, true, out);
}

void kv_compare_bitwise_outputs(const KvRun *a, const KvRun *b, KvCompareKind kind,
                                int64_t a_index, int64_t b_index, KvComparison *out) {
    compare_bitwise(a, b, kind, a_index, b_index, false, out);
}

void kv_compare_fresh(const KvRun *reuse, const KvRun *fresh, int64_t offset, int64_t reuse_index,
                      int64_t fresh_index, KvComparison *out) {
    compare_init(out, KV_CMP_FRESH, reuse_index, fresh_index);
    if (reuse->skipped || fresh->skipped) {
        out->verdict = KV_VERDICT_SKIP;
        snprintf(out->message, sizeof out->message, "skipped: %s",
                 reuse->skipped ? reuse->skip_reason : fresh->skip_reason);
        return;
    }
    const int64_t B = reuse->batch, V = reuse->vocab;
    if (offset < 0 || fresh->steps + offset != reuse->steps || fresh->batch != B ||
        fresh->vocab != V) {
        out->verdict = KV_VERDICT_FAIL;
        snprintf(out->message, sizeof out->message,
                 "cannot compare: the fresh run has %lld steps x %lld rows x %lld vocab, the "
                 "reused one %lld steps (switch at %lld) x %lld rows x %lld vocab",
                 (long long)fresh->steps, (long long)fresh->batch, (long long)fresh->vocab,
                 (long long)reuse->steps, (long long)offset, (long long)B, (long long)V);
        return;
    }
    const bool full = reuse->logits != NULL && fresh->logits != NULL;
    for (int64_t s = 0; s < fresh->steps; s++) {
        for (int64_t b = 0; b < B; b++) {
            const int64_t i = (s + offset) * B + b, j = s * B + b;
            const bool same =
                reuse->tokens[i] == fresh->tokens[j] &&
                (full ? memcmp(reuse->logits + i * V, fresh->logits + j * V,
                               (size_t)V * sizeof(float)) == 0
                      : reuse->logits_hash[i] == fresh->logits_hash[j]);
            if (same) continue;
            out->verdict = KV_VERDICT_FAIL;
            out->first_step = s + offset;
            out->first_row = b;
            snprintf(out->message, sizeof out->message,
                     "the reused state differs from a fresh run of the same context at step "
                     "%lld row %lld (%lld steps after the request switch): token %d vs %d%s",
                     (long long)(s + offset), (long long)b, (long long)s, reuse->tokens[i],
                     fresh->tokens[j], reuse->tokens[i] == fresh->tokens[j] ? ", logits differ" : "");
            return;
        }
    }
    snprintf(out->message, sizeof out->message,
             "%lld steps after the request switch at step %lld bitwise equal to a fresh run",
             (long long)fresh->steps, (long long)offset);
}

void kv_compare_replay(const KvRun *run, int64_t index, KvComparison *out) {
    compare_init(out, KV_CMP_REPLAY, index, index);
    if (run->skipped) {
        out->verdict = KV_VERDICT_SKIP;
        snprintf(out->message, sizeof out->message, "skipped: %s", run->skip_reason);
    } else if (run->replay_mismatch_step >= 0) {
        out->verdict = KV_VERDICT_FAIL;
        out->first_step = run->replay_mismatch_step;
        snprintf(out->message, sizeof out->message,
                 "replays of step %lld from one snapshot were not bitwise identical",
                 (long long)run->replay_mismatch_step);
    } else if (run->replays_checked == 0) {
        out->verdict = KV_VERDICT_SKIP;
        snprintf(out->message, sizeof out->message, "no step was replay-checked");
    } else {
        snprintf(out->message, sizeof out->message, "%lld steps replayed, all bitwise identical",
                 (long long)run->replays_checked);
    }
}

/* The first non-finite logit of a run in (step, row, index) order: full
 * logits, or the kept top-k values. False when all are finite. */
static bool first_nonfinite_logit(const KvRun *r, int64_t *step, int64_t *row, int64_t *index,
                                  float *value) {
    const float *vals = r->logits != NULL ? r->logits : r->topk_values;
    const int64_t per = r->logits != NULL ? r->vocab : r->topk;
    if (vals == NULL || per <= 0) return false;
    for (int64_t i = 0; i < r->steps * r->batch * per; i++) {
        if (isfinite(vals[i])) continue;
        *step = i / (r->batch * per);
        *row = (i / per) % r->batch;
        /* a top-k position names the token id it holds */
        *index = r->logits != NULL ? i % per : (int64_t)r->topk_ids[i];
        *value = vals[i];
        return true;
    }
    return false;
}

void kv_compare_finite(const KvRun *run, int64_t index, KvComparison *out) {
    compare_init(out, KV_CMP_FINITE, index, index);
    if (run->skipped && strncmp(run->skip_reason, KV_RUN_FAILED_PREFIX,
                                strlen(KV_RUN_FAILED_PREFIX)) == 0) {
        /* an engine that crashed produced nothing to check: that is a
         * failure of the run, never a skip that a gate could pass over */
        out->verdict = KV_VERDICT_FAIL;
        snprintf(out->message, sizeof out->message, "the run did not complete: %s",
                 run->skip_reason + strlen(KV_RUN_FAILED_PREFIX));
        return;
    }
    if (run->skipped) {
        out->verdict = KV_VERDICT_SKIP;
        snprintf(out->message, sizeof out->message, "skipped: %s", run->skip_reason);
        return;
    }
    int64_t ls = -1, lr = -1, li = -1;
    float lv = 0.0f;
    const bool bad_logit = first_nonfinite_logit(run, &ls, &lr, &li, &lv);
    /* A probe value comes before the logits of its step (probe order ends
     * with the logits), so the probe record wins at an equal step. */
    const bool bad_probe = run->nonfinite_checked && run->nonfinite_step >= 0 &&
                           (!bad_logit || run->nonfinite_step <= ls);
    if (!bad_logit && !bad_probe) {
        snprintf(out->message, sizeof out->message, "finite: %s hold no NaN or Inf",
                 run->nonfinite_checked ? "logits and every probe" :
                                          "logits (this backend does not check its probes)");
        return;
    }
    out->verdict = KV_VERDICT_FAIL;
    const bool is_ref = strcmp(run->variant, "reference") == 0;
    const char *who = is_ref ? "the reference itself is not finite" : "non-finite value";
    if (bad_probe) {
        out->first_step = run->nonfinite_step;
        out->first_row = run->nonfinite_row;
        out->first_probe = run->nonfinite_probe;
        char pname[KV_NAME_LEN] = "?";
        if (run->probe_names != NULL && run->nonfinite_probe < run->n_probes) {
            snprintf(pname, sizeof pname, "%s", run->probe_names[run->nonfinite_probe]);
        }
        snprintf(out->message, sizeof out->message,
                 "%s: %g first at step %lld row %lld, probe %s element %lld (the first "
                 "non-finite probe value in step, probe, row order)",
                 who, (double)run->nonfinite_value, (long long)run->nonfinite_step,
                 (long long)run->nonfinite_row, pname, (long long)run->nonfinite_index);
    } else {
        out->first_step = ls;
        out->first_row = lr;
        snprintf(out->message, sizeof out->message,
                 "%s: logit %g first at step %lld row %lld, token id %lld%s", who, (double)lv,
                 (long long)ls, (long long)lr, (long long)li,
                 run->nonfinite_checked ? "" : " (this backend does not check its probes)");
    }
}

/* The error of one row of logits: candidate c against baseline r, n values
 * each (all finite). */
typedef struct {
    double max_abs; /* largest |c - r| */
    double max_ref; /* largest |r|: what max_rel_err is relative to */
    double kl;      /* KL(softmax(r) || softmax(c)); 0 when not asked for */
} RowError;

/* Fills *e for the row and adds its squared error and the baseline's
 * squares to *se and *ss (NMSE over all rows). with_kl: the rows are whole
 * vocabularies, so their softmax is the model's. */
static void row_error(const float *r, const float *c, int64_t n, bool with_kl, double *se,
                      double *ss, RowError *e) {
    double max_abs = 0.0, max_ref = 0.0, mr = -INFINITY, mc = -INFINITY;
    for (int64_t v = 0; v < n; v++) {
        const double d = (double)c[v] - (double)r[v];
        max_abs = fabs(d) > max_abs ? fabs(d) : max_abs;
        max_ref = fabs((double)r[v]) > max_ref ? fabs((double)r[v]) : max_ref;
        *se += d * d;
        *ss += (double)r[v] * (double)r[v];
        mr = r[v] > mr ? r[v] : mr;
        mc = c[v] > mc ? c[v] : mc;
    }
    e->max_abs = max_abs;
    e->max_ref = max_ref;
    e->kl = 0.0;
    if (!with_kl) return;
    /* KL(softmax(ref) || softmax(cand)) in double. */
    double zr = 0.0, zc = 0.0;
    for (int64_t v = 0; v < n; v++) {
        zr += exp((double)r[v] - mr);
        zc += exp((double)c[v] - mc);
    }
    double kl = 0.0;
    for (int64_t v = 0; v < n; v++) {
        const double lp = (double)r[v] - mr - log(zr);
        const double lq = (double)c[v] - mc - log(zc);
        kl += exp(lp) * (lp - lq);
    }
    e->kl = kl;
}

/* One whole-vocabulary row of a tolerance comparison: its error metrics
 * folded into out's maxima (and *se, *ss for the NMSE); returns its
 * relative error, against the baseline r's largest |logit|. */
static double row_metrics(const float *r, const float *c, int64_t V, double *se, double *ss,
                          KvComparison *out) {
    RowError e;
    row_error(r, c, V, true, se, ss, &e);
    const double rel = e.max_abs / (e.max_ref > 0.0 ? e.max_ref : 1.0);
    out->max_abs_err = e.max_abs > out->max_abs_err ? e.max_abs : out->max_abs_err;
    out->max_rel_err = rel > out->max_rel_err ? rel : out->max_rel_err;
    out->kl = e.kl > out->kl ? e.kl : out->kl;
    return rel;
}

/* The least tolerances under which a comparison would have passed, as
 * Polygraphy prints them, so a pass shows how close to the edge it was and a
 * failure how far past it: max_rel_err >= the largest relative error seen,
 * tie_margin >= the largest baseline margin at a flipped token (0: no flip).
 * Non-finite logits pass under no tolerance and are not counted here. */
static void least_passing(char *buf, size_t n, double max_rel, double max_flip_margin,
                          bool nonfinite) {
    if (nonfinite) {
        snprintf(buf, n, "; no tolerance passes a non-finite logit");
        return;
    }
    snprintf(buf, n, "; least passing tolerances: max_rel_err %.3g, tie_margin %.3g", max_rel,
             max_flip_margin);
}

void kv_compare_shifted(const KvRun *shifted, const KvRun *fresh, int64_t offset,
                        const KvTolerances *t, int64_t shifted_index, int64_t fresh_index,
                        KvComparison *out) {
    compare_init(out, KV_CMP_SHIFT, shifted_index, fresh_index);
    if (compare_skipped(shifted, fresh, out)) return;
    const int64_t B = shifted->batch, V = shifted->vocab;
    if (offset < 1 || fresh->steps + offset != shifted->steps || fresh->batch != B ||
        fresh->vocab != V || shifted->logits == NULL || fresh->logits == NULL) {
        out->verdict = KV_VERDICT_FAIL;
        snprintf(out->message, sizeof out->message,
                 "cannot compare: the fresh run has %lld steps x %lld rows x %lld vocab%s, the "
                 "shifted run %lld x %lld x %lld%s from step %lld",
                 (long long)fresh->steps, (long long)fresh->batch, (long long)fresh->vocab,
                 fresh->logits == NULL ? " (top-k only)" : "", (long long)shifted->steps,
                 (long long)B, (long long)V, shifted->logits == NULL ? " (top-k only)" : "",
                 (long long)offset);
        return;
    }
    double se = 0.0, ss = 0.0, flip_margin = 0.0;
    int64_t agree = 0;
    bool nonfinite = false;
    const char *fail_what = NULL;
    for (int64_t j = 0; j < fresh->steps; j++) {
        for (int64_t b = 0; b < B; b++) {
            const int64_t fi = j * B + b, si = (offset + j) * B + b;
            const float *r = fresh->logits + fi * V;
            const float *c = shifted->logits + si * V;
            const char *what = NULL;
            bool finite = true;
            for (int64_t v = 0; v < V && finite; v++) finite = isfinite(r[v]) && isfinite(c[v]);
            if (!finite) {
                what = "non-finite logit";
                nonfinite = true;
            } else {
                const double rel = row_metrics(r, c, V, &se, &ss, out);
                if (fresh->tokens[fi] == shifted->tokens[si]) {
                    agree++;
                } else {
                    flip_margin = fresh->margins[fi] > flip_margin ? fresh->margins[fi]
                                                                   : flip_margin;
                    if (fresh->margins[fi] <= t->tie_margin) {
                        out->near_ties++;
                    } else {
                        what = "token flip above the tie margin";
                    }
                }
                if (rel > t->max_rel_err) what = "logits beyond the shift's max_rel_err";
            }
            if (what != NULL && fail_what == NULL) {
                fail_what = what;
                out->first_step = offset + j;
                out->first_row = b;
            }
        }
    }
    out->nmse = ss > 0.0 ? se / ss : 0.0;
    out->top1_agreement = 100.0 * (double)agree / (double)(fresh->steps * B);
    char least[96];
    least_passing(least, sizeof least, out->max_rel_err, flip_margin, nonfinite);
    if (fail_what != NULL) {
        out->verdict = KV_VERDICT_FAIL;
        const int64_t si = out->first_step * B + out->first_row;
        const int64_t fi = (out->first_step - offset) * B + out->first_row;
        snprintf(out->message, sizeof out->message,
                 "the shifted context differs from a fresh run of it: %s at step %lld row %lld "
                 "(tokens %d vs fresh %d; max rel err %.3g > %g%s)",
                 fail_what, (long long)out->first_step, (long long)out->first_row,
                 shifted->tokens[si], fresh->tokens[fi], out->max_rel_err, t->max_rel_err, least);
        return;
    }
    snprintf(out->message, sizeof out->message,
             "%lld steps after the context shift at step %lld agree with a fresh run of the "
             "shifted context within max_rel_err %.3g: max rel err %.3g, top-1 %.1f%%, %lld "
             "near-ties%s",
             (long long)fresh->steps, (long long)offset, t->max_rel_err, out->max_rel_err,
             out->top1_agreement, (long long)out->near_ties, least);
}

double kv_compare_row_rel_err(const float *ref, const float *cand, int64_t n) {
    double se = 0.0, ss = 0.0;
    RowError e;
    row_error(ref, cand, n, false, &se, &ss, &e);
    return e.max_abs / (e.max_ref > 0.0 ? e.max_ref : 1.0);
}

double kv_cal_tolerance(double spread, double fp64) {
    double cal = KV_CAL_FLOOR;
    if (KV_CAL_SPREAD_MULT * spread > cal) cal = KV_CAL_SPREAD_MULT * spread; /* NaN: false */
    if (KV_CAL_FP64_MULT * fp64 > cal) cal = KV_CAL_FP64_MULT * fp64;
    return cal;
}

void kv_compare_reference(const KvRun *ref, const KvRun *cand, const KvTolerances *t,
                          int64_t ref_index, int64_t cand_index, KvComparison *out) {
    compare_init(out, KV_CMP_REFERENCE, ref_index, cand_index);
    if (compare_skipped(ref, cand, out)) return;
    if (!runs_shaped_alike(ref, cand, out)) return;
    if (ref->logits == NULL || cand->logits == NULL) {
        out->verdict = KV_VERDICT_SKIP;
        snprintf(out->message, sizeof out->message,
                 "reference agreement needs full logits; a run kept only its top-%d",
                 (int)(ref->logits == NULL ? ref->topk : cand->topk));
        return;
    }
    const int64_t V = ref->vocab, B = ref->batch;
    double se = 0.0, ss = 0.0;
    int64_t agree = 0, fail_step = -1, fail_row = -1;
    double flip_margin = 0.0; /* the largest reference margin at a flipped token */
    bool nonfinite = false;
    const char *fail_what = NULL;
    char nonfinite_what[160];
    for (int64_t s = 0; s < ref->steps; s++) {
        for (int64_t b = 0; b < B; b++) {
            const float *r = ref->logits + (s * B + b) * V;
            const float *c = cand->logits + (s * B + b) * V;
            /* NaN compares false with every tolerance: a non-finite logit on
             * either side fails by itself and is kept out of the metrics. */
            int64_t bad = -1;
            for (int64_t v = 0; v < V && bad < 0; v++) {
                if (!isfinite(r[v]) || !isfinite(c[v])) bad = v;
            }
            if (bad >= 0) {
                nonfinite = true;
                if (fail_step < 0) {
                    fail_step = s;
                    fail_row = b;
                    snprintf(nonfinite_what, sizeof nonfinite_what,
                             "non-finite logit at token id %lld (reference %g, candidate %g)",
                             (long long)bad, (double)r[bad], (double)c[bad]);
                    fail_what = nonfinite_what;
                }
                continue;
            }
            const double rel = row_metrics(r, c, V, &se, &ss, out);
            const int64_t i = s * B + b;
            if (ref->tokens[i] != cand->tokens[i] && ref->margins[i] > flip_margin) {
                flip_margin = ref->margins[i];
            }
            if (ref->tokens[i] == cand->tokens[i]) {
                agree++;
            } else if (ref->margins[i] <= t->tie_margin) {
                out->near_ties++;
            } else if (fail_step < 0) {
                fail_step = s;
                fail_row = b;
                fail_what = "token flip above the tie margin";
            }
            if (rel > t->max_rel_err && fail_step < 0) {
                fail_step = s;
                fail_row = b;
                fail_what = "logits beyond max_rel_err";
            }
        }
    }
    out->nmse = ss > 0.0 ? se / ss : 0.0;
    out->top1_agreement = 100.0 * (double)agree / (double)(ref->steps * B);
    int64_t ps, pr, pp;
    const bool probe_diff = first_probe_difference(ref, cand, &ps, &pr, &pp);
    if (probe_diff) {
        out->first_step = ps;
        out->first_row = pr;
        out->first_probe = pp;
    }
    if (fail_step >= 0) {
        out->verdict = KV_VERDICT_FAIL;
        if (!probe_diff) {
            out->first_step = fail_step;
            out->first_row = fail_row;
        }
        char what[320], least[96];
        least_passing(least, sizeof least, out->max_rel_err, flip_margin, nonfinite);
        snprintf(what, sizeof what, "%s at step %lld row %lld (max rel err %.3g > %g%s)",
                 fail_what, (long long)fail_step, (long long)fail_row, out->max_rel_err,
                 t->max_rel_err, least);
        describe_divergence(ref, cand, out, what);
    } else {
        char least[96];
        least_passing(least, sizeof least, out->max_rel_err, flip_margin, false);
        snprintf(out->message, sizeof out->message,
                 "agrees within max_rel_err %.3g: max rel err %.3g, top-1 %.1f%%, %lld "
                 "near-ties%s%s", t->max_rel_err, out->max_rel_err, out->top1_agreement,
                 (long long)out->near_ties, probe_diff ? " (not bitwise)" : ", bitwise identical",
                 least);
    }
}

void kv_compare_require_bitwise(const KvRun *ref, const KvRun *cand, KvComparison *out) {
    if (out->verdict != KV_VERDICT_PASS || ref->batch != cand->batch) return;
    int64_t ps = -1, pr = -1, pp = -1;
    if (!first_probe_difference(ref, cand, &ps, &pr, &pp)) {
        const int64_t B = ref->batch;
        const int64_t n = (ref->steps < cand->steps ? ref->steps : cand->steps) * B;
        for (int64_t i = 0; i < n && ps < 0; i++) {
            const bool hashes = ref->logits_hash != NULL && cand->logits_hash != NULL;
            if (ref->tokens[i] != cand->tokens[i] ||
                (hashes && ref->logits_hash[i] != cand->logits_hash[i])) {
                ps = i / B;
                pr = i % B;
            }
        }
        if (ps < 0 && ref->steps == cand->steps) return; /* bitwise */
        if (ps < 0) ps = ref->steps < cand->steps ? ref->steps : cand->steps;
    }
    out->verdict = KV_VERDICT_FAIL;
    out->first_step = ps;
    out->first_row = pr;
    out->first_probe = pp;
    char pname[48] = "the logits";
    if (pp >= 0 && cand->probe_names != NULL) {
        snprintf(pname, sizeof pname, "probe %.40s", cand->probe_names[pp]);
    } else if (pp >= 0) {
        snprintf(pname, sizeof pname, "probe %lld", (long long)pp);
    }
    snprintf(out->message, sizeof out->message,
             "not bitwise the reference on the CPU (DESIGN §3: a CPU variant runs the "
             "reference's arithmetic in the canonical key order): first difference at step "
             "%lld row %lld, %s; within max_rel_err (max rel err %.3g), so a tolerance alone "
             "would have passed it", (long long)ps, (long long)pr, pname, out->max_rel_err);
}

/* ---- runs of another engine ----------------------------------------------- */

/* One row of two runs as (baseline, candidate) value pairs: the whole
 * vocabulary when both kept full logits, else the ids one side kept
 * (the candidate's when it kept top-k, else the baseline's) looked up on
 * the other side (ids both kept, when both kept top-k). */
typedef struct {
    const float *r, *c; /* (n) baseline and candidate values */
    int64_t n;
    bool full;          /* whole rows: the softmax (KL) is the model's */
    double max_ref;     /* >= 0: the baseline row's largest |logit| over everything it kept
                         * (what max_rel_err is relative to); < 0: row_error's */
    int64_t bad_id;     /* >= 0: a non-finite value at this token id ... */
    float bad_r, bad_c; /* ... with both sides' values there (NaN when not kept) */
} RowPairs;

/* The first non-finite value of n values at vals, -1 when none. */
static int64_t first_nonfinite(const float *vals, int64_t n) {
    for (int64_t v = 0; v < n; v++) {
        if (!isfinite(vals[v])) return v;
    }
    return -1;
}

/* The largest |v| over n values. */
static double max_magnitude(const float *vals, int64_t n) {
    double m = 0.0;
    for (int64_t v = 0; v < n; v++) m = fabs((double)vals[v]) > m ? fabs((double)vals[v]) : m;
    return m;
}

/* Gathers row i (= step * batch + row) of base and cand into p, through
 * rbuf and cbuf (room for the larger topk) when a side kept top-k only.
 * Returns false with *why set when a kept id lies outside the vocabulary
 * (a damaged file: nothing can be looked up). */
static bool row_pairs(const KvRun *base, const KvRun *cand, int64_t i, float *rbuf, float *cbuf,
                      RowPairs *p, char *why, size_t why_len) {
    const int64_t V = base->vocab;
    *p = (RowPairs){NULL, NULL, 0, false, -1.0, -1, NAN, NAN};
    const float *rfull = base->logits != NULL ? base->logits + i * V : NULL;
    const float *cfull = cand->logits != NULL ? cand->logits + i * V : NULL;
    if (rfull != NULL && cfull != NULL) {
        for (int64_t v = 0; v < V && p->bad_id < 0; v++) {
            if (isfinite(rfull[v]) && isfinite(cfull[v])) continue;
            p->bad_id = v;
            p->bad_r = rfull[v];
            p->bad_c = cfull[v];
        }
        p->r = rfull;
        p->c = cfull;
        p->n = V;
        p->full = true;
        return true;
    }
    /* One side kept top-k: its ids are the ones compared. */
    const KvRun *kept = cfull == NULL ? cand : base;
    const int64_t K = kept->topk;
    const int32_t *ids = kept->topk_ids + i * K;
    const float *vals = kept->topk_values + i * K;
    const int32_t *other_ids = NULL;
    const float *other_vals = NULL;
    int64_t other_k = 0;
    const KvRun *other = kept == cand ? base : cand;
    if (other->logits == NULL) {
        other_k = other->topk;
        other_ids = other->topk_ids + i * other_k;
        other_vals = other->topk_values + i * other_k;
    }
    int64_t n = 0;
    for (int64_t j = 0; j < K; j++) {
        const int32_t id = ids[j];
        if (id < 0 || id >= V) {
            snprintf(why, why_len, "%s: topk_ids[step %lld, row %lld, %lld] = %d lies outside the "
                     "vocabulary (%lld)", kept == cand ? "candidate" : "baseline",
                     (long long)(i / base->batch), (long long)(i % base->batch), (long long)j,
                     (int)id, (long long)V);
            return false;
        }
        float ov = NAN;
        bool found = other_ids == NULL;
        if (found) ov = other->logits[i * V + id];
        for (int64_t q = 0; q < other_k && !found; q++) {
            if (other_ids[q] == id) {
                ov = other_vals[q];
                found = true;
            }
        }
        if (!found) continue; /* both kept top-k and the other did not keep this id */
        rbuf[n] = kept == base ? vals[j] : ov;
        cbuf[n] = kept == cand ? vals[j] : ov;
        if (p->bad_id < 0 && (!isfinite(rbuf[n]) || !isfinite(cbuf[n]))) {
            p->bad_id = id;
            p->bad_r = rbuf[n];
            p->bad_c = cbuf[n];
        }
        n++;
    }
    /* A full side's NaN outside the kept ids fails the row all the same. */
    const float *full = rfull != NULL ? rfull : cfull;
    const int64_t off = full != NULL ? first_nonfinite(full, V) : -1;
    if (p->bad_id < 0 && off >= 0) {
        p->bad_id = off;
        p->bad_r = rfull != NULL ? rfull[off] : NAN;
        p->bad_c = cfull != NULL ? cfull[off] : NAN;
    }
    p->r = rbuf;
    p->c = cbuf;
    p->n = n;
    /* relative to the baseline's largest |logit| over all it kept */
    p->max_ref = rfull != NULL ? max_magnitude(rfull, V)
                               : max_magnitude(base->topk_values + i * base->topk, base->topk);
    return true;
}

/* kv_compare_outputs and kv_compare_outputs_forced: fed_alike says both
 * runs were fed the same tokens at every step (the baseline teacher-forced
 * with the candidate's), so a near-tie flip does not end a row's
 * comparison. */
static void compare_outputs(const KvRun *base, const KvRun *cand, const KvTolerances *t,
                            KvCompareKind kind, int64_t base_index, int64_t cand_index,
                            bool fed_alike, KvComparison *out) {
    compare_init(out, kind, base_index, cand_index);
    if (compare_skipped(base, cand, out)) return;
    if (!runs_shaped_alike(base, cand, out)) return;
    const int64_t B = base->batch, S = base->steps;
    const bool topk = base->logits == NULL || cand->logits == NULL;
    const int64_t kmax = base->topk > cand->topk ? base->topk : cand->topk;
    float *rbuf = malloc((size_t)(kmax > 0 ? kmax : 1) * sizeof *rbuf);
    float *cbuf = malloc((size_t)(kmax > 0 ? kmax : 1) * sizeof *cbuf);
    /* per row: the step of its first near-tie flip (-1: none); the runs fed
     * different tokens after it, so the rest of the row is not compared */
    int64_t *tie_step = malloc((size_t)(B > 0 ? B : 1) * sizeof *tie_step);
    if (rbuf == NULL || cbuf == NULL || tie_step == NULL) {
        out->verdict = KV_VERDICT_FAIL;
        snprintf(out->message, sizeof out->message, "out of memory comparing the runs");
        goto cleanup;
    }
    for (int64_t b = 0; b < B; b++) tie_step[b] = -1;
    double se = 0.0, ss = 0.0;
    int64_t agree = 0, compared = 0, fail_step = -1, fail_row = -1;
    double flip_margin = 0.0; /* the largest baseline margin at a flipped token */
    bool nonfinite = false;
    char fail_what[256] = "";
    for (int64_t s = 0; s < S; s++) {
        for (int64_t b = 0; b < B; b++) {
            const int64_t i = s * B + b;
            if (tie_step[b] >= 0) continue;
            RowPairs p;
            char why[200] = "";
            if (!row_pairs(base, cand, i, rbuf, cbuf, &p, why, sizeof why)) {
                out->verdict = KV_VERDICT_FAIL;
                out->first_step = s;
                out->first_row = b;
                snprintf(out->message, sizeof out->message, "cannot compare: %s", why);
                goto cleanup;
            }
            /* NaN compares false with every tolerance: a non-finite logit
             * on either side fails by itself and is kept out of the metrics. */
            if (p.bad_id >= 0) {
                nonfinite = true;
                if (fail_step < 0) {
                    fail_step = s;
                    fail_row = b;
                    snprintf(fail_what, sizeof fail_what, "non-finite logit at step %lld row %lld, "
                             "token id %lld (baseline %g, candidate %g)", (long long)s,
                             (long long)b, (long long)p.bad_id, (double)p.bad_r, (double)p.bad_c);
                }
                continue;
            }
            RowError e;
            row_error(p.r, p.c, p.n, p.full, &se, &ss, &e);
            const double max_ref = p.max_ref >= 0.0 ? p.max_ref : e.max_ref;
            const double rel = e.max_abs / (max_ref > 0.0 ? max_ref : 1.0);
            out->max_abs_err = e.max_abs > out->max_abs_err ? e.max_abs : out->max_abs_err;
            out->max_rel_err = rel > out->max_rel_err ? rel : out->max_rel_err;
            out->kl = e.kl > out->kl ? e.kl : out->kl;
            compared++;
            if (base->tokens[i] != cand->tokens[i] && base->margins[i] > flip_margin) {
                flip_margin = base->margins[i];
            }
            if (base->tokens[i] == cand->tokens[i]) {
                agree++;
            } else if (base->margins[i] <= t->tie_margin) {
                out->near_ties++;
                if (!fed_alike) tie_step[b] = s;
            } else if (fail_step < 0) {
                fail_step = s;
                fail_row = b;
                snprintf(fail_what, sizeof fail_what, "token flip above the tie margin at step "
                         "%lld row %lld: tokens %d vs %d, baseline margin %.3g > tie_margin %g",
                         (long long)s, (long long)b, base->tokens[i], cand->tokens[i],
                         (double)base->margins[i], t->tie_margin);
            }
            if (rel > t->max_rel_err && fail_step < 0) {
                fail_step = s;
                fail_row = b;
                snprintf(fail_what, sizeof fail_what, "logits beyond max_rel_err at step %lld row "
                         "%lld: rel err %.3g > %g", (long long)s, (long long)b, rel,
                         t->max_rel_err);
            }
        }
    }
    out->nmse = ss > 0.0 ? se / ss : 0.0;
    /* top-k values are not a distribution: no KL */
    if (topk) out->kl = NAN;
    out->top1_agreement = compared > 0 ? 100.0 * (double)agree / (double)compared : 0.0;
    /* What was and was not compared, for both verdicts. */
    char notes[256] = "";
    size_t used = 0;
    if (topk) {
        used += (size_t)snprintf(notes + used, sizeof notes - used, "; only the top-%lld logits "
                                 "were compared (no KL)", (long long)kmax);
    }
    for (int64_t b = 0; b < B && used < sizeof notes; b++) {
        if (tie_step[b] < 0) continue;
        used += (size_t)snprintf(notes + used, sizeof notes - used, "; row %lld not compared "
                                 "after step %lld (different tokens from a near-tie on)",
                                 (long long)b, (long long)tie_step[b]);
    }
    /* Two modes of one engine usually record one probe layout: whether they
     * are bitwise the same is worth saying, though compiled code may
     * legitimately reorder float math, so it decides nothing. */
    if (kind == KV_CMP_COMPILED && used < sizeof notes && base->probe_hash != NULL &&
        cand->probe_hash != NULL && kv_probe_layouts_equal(base, cand)) {
        int64_t ps, pr, pp;
        if (first_probe_difference(base, cand, &ps, &pr, &pp)) {
            used += (size_t)snprintf(notes + used, sizeof notes - used, "; not bitwise: probe "
                                     "hashes first differ at step %lld row %lld, probe %.64s",
                                     (long long)ps, (long long)pr, cand->probe_names[pp]);
        } else {
            used += (size_t)snprintf(notes + used, sizeof notes - used,
                                     "; probe hashes bitwise identical");
        }
    }
    const char *whose = kind == KV_CMP_COMPILED ? " (compiled vs eager: the gate's tolerance)" : "";
    char least[96];
    least_passing(least, sizeof least, out->max_rel_err, flip_margin, nonfinite);
    if (fail_step >= 0) {
        out->verdict = KV_VERDICT_FAIL;
        out->first_step = fail_step;
        out->first_row = fail_row;
        snprintf(out->message, sizeof out->message, "%s%s; max rel err %.3g%s%s", fail_what,
                 whose, out->max_rel_err, least, notes);
    } else {
        snprintf(out->message, sizeof out->message, "agrees within max_rel_err %g%s: max rel err "
                 "%.3g, top-1 %.1f%%, %lld near-ties%s%s", t->max_rel_err, whose,
                 out->max_rel_err, out->top1_agreement, (long long)out->near_ties, least, notes);
    }
cleanup:
    free(rbuf);
    free(cbuf);
    free(tie_step);
}

void kv_compare_outputs(const KvRun *base, const KvRun *cand, const KvTolerances *t,
                        KvCompareKind kind, int64_t base_index, int64_t cand_index,
                        KvComparison *out) {
    compare_outputs(base, cand, t, kind, base_index, cand_index, false, out);
}

void kv_compare_outputs_forced(const KvRun *forced_base, const KvRun *cand, const KvTolerances *t,
                               KvCompareKind kind, int64_t base_index, int64_t cand_index,
                               KvComparison *out) {
    compare_outputs(forced_base, cand, t, kind, base_index, cand_index, true, out);
}

void kv_compare_graph_budget(const KvRun *run, int64_t index, KvComparison *out) {
    compare_init(out, KV_CMP_GRAPH_BUDGET, index, index);
    if (run->skipped) {
        out->verdict = KV_VERDICT_SKIP;
        snprintf(out->message, sizeof out->message, "skipped: %s", run->skip_reason);
        return;
    }
    if (run->graph_budget < 0) {
        out->verdict = KV_VERDICT_SKIP;
        snprintf(out->message, sizeof out->message, "no graph budget recorded");
        return;
    }
    char recompiles[48] = "";
    if (run->recompiles >= 0) {
        snprintf(recompiles, sizeof recompiles, " (%lld recompile%s)", (long long)run->recompiles,
                 run->recompiles == 1 ? "" : "s");
    }
    const char *graphs = run->graphs_captured == 1 ? "graph" : "graphs";
    if (run->graphs_captured > run->graph_budget) {
        out->verdict = KV_VERDICT_FAIL;
        snprintf(out->message, sizeof out->message, "%lld decode %s%s, budget %lld: the decode "
                 "recompiles", (long long)run->graphs_captured, graphs, recompiles,
                 (long long)run->graph_budget);
    } else {
        snprintf(out->message, sizeof out->message, "%lld decode %s%s, within the budget of %lld",
                 (long long)run->graphs_captured, graphs, recompiles,
                 (long long)run->graph_budget);
    }
}

/* The first index at which a's and b's probe names differ (an index one
 * past the shorter list when one is a prefix of the other); -1 when the
 * layouts are identical. */
static int64_t probe_layout_mismatch(const KvRun *a, const KvRun *b) {
    const int64_t common = a->n_probes < b->n_probes ? a->n_probes : b->n_probes;
    /* a skipped run records sizes but no names */
    if (common > 0 && (a->probe_names == NULL || b->probe_names == NULL)) return 0;
    for (int64_t p = 0; p < common; p++) {
        if (strncmp(a->probe_names[p], b->probe_names[p], KV_NAME_LEN) != 0) return p;
    }
    return a->n_probes == b->n_probes ? -1 : common;
}

bool kv_probe_layouts_equal(const KvRun *a, const KvRun *b) {
    return probe_layout_mismatch(a, b) < 0;
}

void kv_compare_repeat(const KvRun *first, const KvRun *run, int64_t first_index, int64_t index,
                       KvComparison *out) {
    const int64_t p = first->skipped || run->skipped ? -1 : probe_layout_mismatch(first, run);
    if (p < 0) {
        kv_compare_bitwise(first, run, KV_CMP_REPEAT, first_index, index, out);
        return;
    }
    compare_init(out, KV_CMP_REPEAT, first_index, index);
    out->verdict = KV_VERDICT_FAIL;
    snprintf(out->message, sizeof out->message,
             "probe layouts differ (%lld vs %lld probes; probe %lld: '%.64s' vs '%.64s'): repeats "
             "of one configuration must record the same probes", (long long)first->n_probes,
             (long long)run->n_probes, (long long)p,
             p < first->n_probes ? first->probe_names[p] : "(none)",
             p < run->n_probes ? run->probe_names[p] : "(none)");
}
