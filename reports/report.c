/* report.c: ownership of the in-memory report (kv_run_free, kv_report_free)
 * and the summary table that `kvrepro show` and the gate print. Nothing here
 * touches HDF5, so the harness can print a summary without the writer. */
#include "report.h"

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

void kv_run_free(KvRun *r) {
    if (r == NULL) return;
    free(r->prompt);
    free(r->prompt_real);
    free(r->tokens);
    free(r->logits);
    free(r->topk_ids);
    free(r->topk_values);
    free(r->logits_hash);
    free(r->margins);
    free(r->probe_names);
    free(r->probe_hash);
    memset(r, 0, sizeof *r);
}

void kv_report_free(KvReport *rep) {
    if (rep == NULL) return;
    if (rep->runs != NULL) {
        for (int64_t i = 0; i < rep->n_runs; i++) kv_run_free(&rep->runs[i]);
    }
    free(rep->runs);
    free(rep->tolerances);
    free(rep->comparisons);
    memset(rep, 0, sizeof *rep);
}

/* A comparison counts for run i when it names i as its candidate. */
static bool comparison_is_for(const KvReport *rep, int64_t c, int64_t i) {
    return rep->comparisons != NULL && rep->comparisons[c].run_b == i;
}

/* Reference comparisons of run i: the ones that measure a logit error. */
static int64_t reference_comparisons_for(const KvReport *rep, int64_t i) {
    int64_t n = 0;
    for (int64_t c = 0; c < rep->n_comparisons; c++) {
        n += comparison_is_for(rep, c, i) && rep->comparisons[c].kind == KV_CMP_REFERENCE;
    }
    return n;
}

KvStatus kv_report_print_counts(const KvReport *rep, FILE *f) {
    if (rep == NULL || f == NULL) return KV_ERR_INTERNAL;
    int64_t passed = 0, failed = 0, skipped = 0;
    for (int64_t i = 0; i < rep->n_runs; i++) {
        const KvVerdict v = kv_report_run_verdict(rep, i);
        passed += v == KV_VERDICT_PASS;
        failed += v == KV_VERDICT_FAIL;
        skipped += v == KV_VERDICT_SKIP;
    }
    fprintf(f, "%" PRId64 " passed, %" PRId64 " failed, %" PRId64 " skipped\n", passed, failed,
            skipped);
    if (fflush(f) != 0 || ferror(f)) return KV_ERR_INTERNAL;
    return KV_OK;
}

KvVerdict kv_report_run_verdict(const KvReport *rep, int64_t i) {
    if (rep == NULL || i < 0 || i >= rep->n_runs || rep->runs == NULL) return KV_VERDICT_SKIP;
    bool any_skip = rep->runs[i].skipped;
    for (int64_t c = 0; c < rep->n_comparisons; c++) {
        if (!comparison_is_for(rep, c, i)) continue;
        if (rep->comparisons[c].verdict == KV_VERDICT_FAIL) return KV_VERDICT_FAIL;
        if (rep->comparisons[c].verdict == KV_VERDICT_SKIP) any_skip = true;
    }
    return any_skip ? KV_VERDICT_SKIP : KV_VERDICT_PASS;
}

double kv_report_run_max_rel_err(const KvReport *rep, int64_t i) {
    double worst = NAN;
    if (rep == NULL) return worst;
    for (int64_t c = 0; c < rep->n_comparisons; c++) {
        /* only reference comparisons measure an error; the others are
         * bitwise or per-run checks whose max_rel_err is always 0 */
        if (!comparison_is_for(rep, c, i) || rep->comparisons[c].kind != KV_CMP_REFERENCE) continue;
        const double e = rep->comparisons[c].max_rel_err;
        /* a NaN error is the worst possible and must not be hidden by max() */
        if (isnan(worst) || isnan(e) || e > worst) worst = e;
        if (isnan(e)) break;
    }
    return worst;
}

/* Text of a fixed-size name field, safe when it is not NUL-terminated. */
static int field_len(const char *s, size_t cap) { return (int)strnlen(s, cap); }

void kv_run_variant_label(const KvRun *r, char *out, size_t n) {
    const int fl = field_len(r->fault, sizeof r->fault);
    snprintf(out, n, "%.*s%s%.*s", field_len(r->variant, sizeof r->variant), r->variant,
             fl > 0 ? "+" : "", fl, r->fault);
}

void kv_report_run_divergence(const KvReport *rep, int64_t i, char *buf, size_t n) {
    if (buf == NULL || n == 0) return;
    snprintf(buf, n, "-");
    if (rep == NULL || rep->runs == NULL || i < 0 || i >= rep->n_runs) return;
    const KvRun *run = &rep->runs[i];
    const KvComparison *fail = NULL, *skip = NULL;
    for (int64_t c = 0; c < rep->n_comparisons && fail == NULL; c++) {
        if (!comparison_is_for(rep, c, i)) continue;
        const KvComparison *cmp = &rep->comparisons[c];
        if (cmp->verdict == KV_VERDICT_FAIL) fail = cmp;
        if (cmp->verdict == KV_VERDICT_SKIP && skip == NULL) skip = cmp;
    }
    if (fail != NULL) {
        const char *msg = fail->message;
        const int msg_len = field_len(msg, sizeof fail->message);
        if (fail->first_step < 0 || fail->run_a < 0 || fail->run_a >= rep->n_runs) {
            snprintf(buf, n, "%.*s", msg_len, msg);
            return;
        }
        const KvRun *a = &rep->runs[fail->run_a];
        char va[2 * KV_NAME_LEN + 2];
        kv_run_variant_label(a, va, sizeof va);
        char probe[KV_NAME_LEN + 16] = "";
        if (fail->first_probe >= 0 && fail->first_probe < run->n_probes &&
            run->probe_names != NULL) {
            snprintf(probe, sizeof probe, " probe %.*s",
                     field_len(run->probe_names[fail->first_probe], KV_NAME_LEN),
                     run->probe_names[fail->first_probe]);
        } else if (fail->first_probe >= 0) {
            snprintf(probe, sizeof probe, " probe #%" PRId64, fail->first_probe);
        }
        snprintf(buf, n, "step %" PRId64 " row %" PRId64 "%s vs %s/%.*s/%.*s/r%" PRId32,
                 fail->first_step, fail->first_row, probe, va,
                 field_len(a->backend, sizeof a->backend), a->backend,
                 field_len(a->mode, sizeof a->mode), a->mode, a->repeat);
        return;
    }
    if (run->skipped) {
        snprintf(buf, n, "skipped: %.*s", field_len(run->skip_reason, sizeof run->skip_reason),
                 run->skip_reason);
    } else if (skip != NULL) {
        snprintf(buf, n, "%.*s", field_len(skip->message, sizeof skip->message), skip->message);
    }
}

static const char *verdict_text(KvVerdict v) {
    switch (v) {
    case KV_VERDICT_PASS: return "PASS";
    case KV_VERDICT_FAIL: return "FAIL";
    case KV_VERDICT_SKIP: return "SKIP";
    }
    return "?";
}

/* The table's divergence column is cut to this many characters (the full
 * message is in the report and the JUnit XML): CUDA skip reasons are long. */
#define KV_SUMMARY_DIVERGENCE_MAX 60

static void summary_divergence(const KvReport *rep, int64_t i, char *div, size_t n) {
    kv_report_run_divergence(rep, i, div, n);
    if (strlen(div) > KV_SUMMARY_DIVERGENCE_MAX && n > KV_SUMMARY_DIVERGENCE_MAX) {
        memcpy(div + KV_SUMMARY_DIVERGENCE_MAX - 3, "...", 4);
    }
}

/* Column widths of the summary table: the widest entry or header. */
typedef struct {
    int index, model, scenario, variant, backend, mode, divergence;
} SummaryWidths;

static int max_int(int a, int b) { return a > b ? a : b; }

KvStatus kv_report_print_summary(const KvReport *rep, FILE *f) {
    if (rep == NULL || f == NULL) return KV_ERR_INTERNAL;
    char div[512];
    SummaryWidths w = {1, 5, 8, 7, 7, 4, 16}; /* the header words */
    char num[24];
    w.index = max_int(w.index, snprintf(num, sizeof num, "%" PRId64, rep->n_runs - 1));
    for (int64_t i = 0; i < rep->n_runs; i++) {
        const KvRun *r = &rep->runs[i];
        w.model = max_int(w.model, field_len(r->model, sizeof r->model));
        w.scenario = max_int(w.scenario, field_len(r->scenario, sizeof r->scenario));
        char vl[2 * KV_NAME_LEN + 2];
        kv_run_variant_label(r, vl, sizeof vl);
        w.variant = max_int(w.variant, (int)strlen(vl));
        w.backend = max_int(w.backend, field_len(r->backend, sizeof r->backend));
        w.mode = max_int(w.mode, field_len(r->mode, sizeof r->mode));
        summary_divergence(rep, i, div, sizeof div);
        w.divergence = max_int(w.divergence, (int)strlen(div));
    }
    /* "#" is the run index that diff and bisect take as --run (as does the
     * label MODEL/SCENARIO/VARIANT/BACKEND/MODE/rN from these columns) */
    fprintf(f, "%*s  %-*s  %-*s  %-*s  %-*s  %-*s  %6s  %-7s  %-*s  %11s  %6s\n", w.index, "#",
            w.model, "model", w.scenario, "scenario", w.variant, "variant", w.backend, "backend", w.mode, "mode",
            "repeat", "verdict", w.divergence, "first divergence", "max rel err", "graphs");
    for (int64_t i = 0; i < rep->n_runs; i++) {
        const KvRun *r = &rep->runs[i];
        const KvVerdict v = kv_report_run_verdict(rep, i);
        summary_divergence(rep, i, div, sizeof div);
        char vl[2 * KV_NAME_LEN + 2];
        kv_run_variant_label(r, vl, sizeof vl);
        /* "-" when nothing measured an error; a NaN error prints as "nan" */
        char rel_text[32] = "-";
        if (reference_comparisons_for(rep, i) > 0) {
            snprintf(rel_text, sizeof rel_text, "%.3e", kv_report_run_max_rel_err(rep, i));
        }
        fprintf(f,
                "%*" PRId64 "  %-*.*s  %-*.*s  %-*s  %-*.*s  %-*.*s  %6" PRId32
                "  %-7s  %-*s  %11s  %6" PRId64 "\n",
                w.index, i, w.model, field_len(r->model, sizeof r->model), r->model, w.scenario,
                field_len(r->scenario, sizeof r->scenario), r->scenario, w.variant, vl, w.backend,
                field_len(r->backend, sizeof r->backend), r->backend, w.mode,
                field_len(r->mode, sizeof r->mode), r->mode, r->repeat, verdict_text(v),
                w.divergence, div, rel_text, r->graphs_captured);
    }
    return kv_report_print_counts(rep, f);
}
