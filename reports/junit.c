/* junit.c: JUnit XML for CI test reporters (junit.h has the mapping).
 *
 * The whole document is built in memory first and written in one go through
 * kv_report_file_publish (report.h): an unnamed temporary beside the target,
 * linked and renamed into place, so a reader (a CI job collecting artifacts)
 * never sees half a file, and a failed or killed write leaves nothing. The
 * output depends only on the report, in report order, so that two writes of
 * one report compare equal byte for byte. */
#include "junit.h"

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const kv_compare_kind_names[] = {
    [KV_CMP_REFERENCE] = "reference",
    [KV_CMP_REPEAT] = "repeat",
    [KV_CMP_GRAPH] = "graph_vs_eager",
    [KV_CMP_VARIANT] = "variant_vs_variant",
    [KV_CMP_REPLAY] = "replay",
    [KV_CMP_FINITE] = "finite",
    [KV_CMP_COMPILED] = "compiled_vs_eager",
    [KV_CMP_GRAPH_BUDGET] = "graph_budget",
    [KV_CMP_FRESH] = "fresh_run",
    [KV_CMP_SHIFT] = "shifted_vs_fresh",
    [KV_CMP_GOLDEN] = "golden",
    [KV_CMP_SHADOW] = "fp64_shadow",
    [KV_CMP_ROW_ALONE] = "row_alone",
};

#define JUNIT_N_KINDS ((int)(sizeof kv_compare_kind_names / sizeof kv_compare_kind_names[0]))

const char *kv_compare_kind_name(KvCompareKind kind) {
    int k = (int)kind;
    if (k < 0 || k >= JUNIT_N_KINDS) return "unknown";
    return kv_compare_kind_names[k];
}

/* ---- growable output buffer ---------------------------------------------- */

/* Appends never fail individually; the first allocation failure sets oom and
 * every later append is a no-op, checked once at the end. */
typedef struct {
    char *data;
    size_t len, cap;
    int oom;
} JunitBuf;

static int junit_buf_reserve(JunitBuf *b, size_t extra) {
    if (b->oom) return 0;
    if (extra <= b->cap - b->len) return 1;
    size_t cap = b->cap > 0 ? b->cap : 4096;
    while (cap - b->len < extra) {
        if (cap > SIZE_MAX / 2) {
            b->oom = 1;
            return 0;
        }
        cap *= 2;
    }
    char *p = realloc(b->data, cap);
    if (p == NULL) {
        b->oom = 1;
        return 0;
    }
    b->data = p;
    b->cap = cap;
    return 1;
}

static void junit_put(JunitBuf *b, const char *s, size_t n) {
    if (!junit_buf_reserve(b, n)) return;
    memcpy(b->data + b->len, s, n);
    b->len += n;
}

static void junit_puts(JunitBuf *b, const char *s) { junit_put(b, s, strlen(s)); }

static void junit_printf(JunitBuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void junit_printf(JunitBuf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0) {
        b->oom = 1;
        return;
    }
    if (!junit_buf_reserve(b, (size_t)n + 1)) return;
    va_start(ap, fmt);
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

/* ---- XML escaping ----------------------------------------------------------- */

/* Length of the well-formed UTF-8 sequence at s (at most n bytes) that XML 1.0
 * can carry, or 0: overlong forms, surrogates, code points past U+10FFFF and
 * the non-characters U+FFFE/U+FFFF are rejected (RFC 3629, XML 1.0 §2.2). */
static size_t junit_utf8_len(const unsigned char *s, size_t n) {
    unsigned char c = s[0];
    size_t len;
    unsigned char lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
    if (c >= 0xC2 && c <= 0xDF) {
        len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else {
        return 0;
    }
    if (n < len) return 0;
    if (s[1] < lo || s[1] > hi) return 0;
    for (size_t i = 2; i < len; i++) {
        if (s[i] < 0x80 || s[i] > 0xBF) return 0;
    }
    if (len == 3 && c == 0xEF && s[1] == 0xBF && (s[2] == 0xBE || s[2] == 0xBF)) return 0;
    return len;
}

/* Writes s, read up to its NUL or max bytes, escaped for XML.
 * in_attr: tab, newline and CR become character references, since attribute
 * value normalisation would otherwise turn them into spaces. Bytes XML 1.0
 * cannot represent at all (C0 controls, DEL, invalid UTF-8) become the
 * visible text "\xNN" so the message stays readable and the file parses. */
static void junit_put_escaped(JunitBuf *b, const char *s, size_t max, int in_attr) {
    const unsigned char *u = (const unsigned char *)s;
    size_t n = strnlen(s, max);
    size_t i = 0;
    while (i < n) {
        unsigned char c = u[i];
        switch (c) {
        case '&': junit_puts(b, "&amp;"); i++; continue;
        case '<': junit_puts(b, "&lt;"); i++; continue;
        case '>': junit_puts(b, "&gt;"); i++; continue;
        case '"': junit_puts(b, "&quot;"); i++; continue;
        case '\'': junit_puts(b, "&apos;"); i++; continue;
        case '\t':
        case '\n':
            if (in_attr) {
                junit_printf(b, "&#%d;", c);
            } else {
                junit_put(b, (const char *)&u[i], 1);
            }
            i++;
            continue;
        case '\r': /* a literal CR is folded away by end-of-line handling */
            junit_puts(b, "&#13;");
            i++;
            continue;
        default: break;
        }
        if (c < 0x20 || c == 0x7F) {
            junit_printf(b, "\\x%02X", c);
            i++;
        } else if (c < 0x80) {
            junit_put(b, (const char *)&u[i], 1);
            i++;
        } else {
            size_t len = junit_utf8_len(u + i, n - i);
            if (len == 0) {
                junit_printf(b, "\\x%02X", c);
                i++;
            } else if (len == 2 && c == 0xC2 && u[i + 1] <= 0x9F) {
                junit_printf(b, "&#x%02X;", u[i + 1]); /* C1 control: legal, but keep it visible */
                i += 2;
            } else {
                junit_put(b, (const char *)&u[i], len);
                i += len;
            }
        }
    }
}

#define JUNIT_FIELD(b, field, in_attr) junit_put_escaped((b), (field), sizeof(field), (in_attr))

/* "variant[+fault]/backend/mode rN", escaped: a run within its suite. */
static void junit_put_run_label(JunitBuf *b, const KvRun *r, int in_attr) {
    char vl[2 * KV_NAME_LEN + 2];
    kv_run_variant_label(r, vl, sizeof vl);
    JUNIT_FIELD(b, vl, in_attr);
    junit_puts(b, "/");
    JUNIT_FIELD(b, r->backend, in_attr);
    junit_puts(b, "/");
    JUNIT_FIELD(b, r->mode, in_attr);
    junit_printf(b, " r%d", (int)r->repeat);
}

/* "model/scenario/variant[+fault]/backend/mode rN": a test case's name,
 * whole, so that it reads alone in a flat list of failures (GitLab's, a
 * GitHub check's annotations) and is the same from pipeline to pipeline
 * whatever the verdict (CI tracks a test's history by its name). */
static void junit_put_run_name(JunitBuf *b, const KvRun *r, int in_attr) {
    JUNIT_FIELD(b, r->model, in_attr);
    junit_puts(b, "/");
    JUNIT_FIELD(b, r->scenario, in_attr);
    junit_puts(b, "/");
    junit_put_run_label(b, r, in_attr);
}

static void junit_put_classname(JunitBuf *b, const KvRun *r) {
    junit_puts(b, "kvrepro.");
    JUNIT_FIELD(b, r->model, 1);
    junit_puts(b, ".");
    JUNIT_FIELD(b, r->scenario, 1);
}

/* ---- report structure ------------------------------------------------------- */

static int junit_same_pair(const KvRun *a, const KvRun *b) {
    return strncmp(a->model, b->model, sizeof a->model) == 0 &&
           strncmp(a->scenario, b->scenario, sizeof a->scenario) == 0;
}

/* A time CI can parse: NaN, infinities and negative values (never measured)
 * count as 0 rather than becoming "nan" in the file. */
static double junit_run_seconds(const KvRun *r) {
    return isfinite(r->seconds) && r->seconds >= 0.0 ? r->seconds : 0.0;
}

typedef struct {
    int64_t tests, failures, skipped;
    double seconds;
} JunitCounts;

static KvStatus junit_check_report(const KvReport *rep, KvError *err) {
    if (rep->n_runs < 0 || rep->n_comparisons < 0) {
        return kv_error_set(err, KV_ERR_INPUT, "report: n_runs %lld, n_comparisons %lld: expected >= 0",
                            (long long)rep->n_runs, (long long)rep->n_comparisons);
    }
    if ((rep->n_runs > 0 && rep->runs == NULL) || (rep->n_comparisons > 0 && rep->comparisons == NULL)) {
        return kv_error_set(err, KV_ERR_INPUT, "report: runs or comparisons array is NULL with a nonzero count");
    }
    for (int64_t c = 0; c < rep->n_comparisons; c++) {
        const KvComparison *cmp = &rep->comparisons[c];
        if (cmp->run_a < 0 || cmp->run_a >= rep->n_runs || cmp->run_b < 0 || cmp->run_b >= rep->n_runs) {
            return kv_error_set(err, KV_ERR_INPUT,
                                "report: comparison %lld: run_a %lld, run_b %lld: expected indices in [0, %lld)",
                                (long long)c, (long long)cmp->run_a, (long long)cmp->run_b,
                                (long long)rep->n_runs);
        }
        if ((int)cmp->kind < 0 || (int)cmp->kind >= JUNIT_N_KINDS) {
            return kv_error_set(err, KV_ERR_INPUT, "report: comparison %lld: kind %d: expected 0..%d",
                                (long long)c, (int)cmp->kind, JUNIT_N_KINDS - 1);
        }
        if (cmp->verdict != KV_VERDICT_PASS && cmp->verdict != KV_VERDICT_FAIL &&
            cmp->verdict != KV_VERDICT_SKIP) {
            return kv_error_set(err, KV_ERR_INPUT, "report: comparison %lld: verdict %d: expected PASS, FAIL or SKIP",
                                (long long)c, (int)cmp->verdict);
        }
    }
    return KV_OK;
}

static void junit_put_properties(JunitBuf *b, const KvReport *rep) {
    junit_puts(b, "    <properties>\n");
    const struct {
        const char *name;
        const char *value;
        size_t size;
    } text[] = {
        {"tool_version", rep->tool_version, sizeof rep->tool_version},
        {"git_commit", rep->git_commit, sizeof rep->git_commit},
        {"host", rep->host, sizeof rep->host},
        {"device", rep->device, sizeof rep->device},
        {"math_mode", rep->math_mode, sizeof rep->math_mode},
        {"shard", rep->shard, sizeof rep->shard},
    };
    for (size_t i = 0; i < sizeof text / sizeof text[0]; i++) {
        junit_printf(b, "      <property name=\"%s\" value=\"", text[i].name);
        junit_put_escaped(b, text[i].value, text[i].size, 1);
        junit_puts(b, "\"/>\n");
    }
    junit_printf(b, "      <property name=\"weight_seed\" value=\"%llu\"/>\n", (unsigned long long)rep->weight_seed);
    junit_printf(b, "      <property name=\"prompt_seed\" value=\"%llu\"/>\n", (unsigned long long)rep->prompt_seed);
    junit_printf(b, "      <property name=\"model_hash\" value=\"0x%016llx\"/>\n",
                 (unsigned long long)rep->model_hash);
    for (int64_t t = 0; rep->tolerances != NULL && t < rep->n_tolerances; t++) {
        const KvTolerance *tol = &rep->tolerances[t];
        junit_puts(b, "      <property name=\"tolerance.");
        JUNIT_FIELD(b, tol->name, 1);
        junit_printf(b, "\" value=\"%.9g\"/>\n", tol->value);
    }
    junit_puts(b, "    </properties>\n");
}

static void junit_put_seeds_line(JunitBuf *b, const KvReport *rep) {
    junit_printf(b, "weight_seed=%llu prompt_seed=%llu\n", (unsigned long long)rep->weight_seed,
                 (unsigned long long)rep->prompt_seed);
}

/* Run i as a test case's text names it: its label within the case's
 * suite, or its whole name when it belongs to another (model, scenario),
 * e.g. a reference run of the fresh twin "S.fresh". */
static void junit_put_run_ref(JunitBuf *b, const KvReport *rep, int64_t i, const KvRun *home) {
    const KvRun *r = &rep->runs[i];
    if (junit_same_pair(r, home)) {
        junit_put_run_label(b, r, 0);
    } else {
        junit_put_run_name(b, r, 0);
    }
}

/* "<kind>: <a> vs <b>", or "<kind>: <run>" for a check of one run (replay,
 * finite, graph_budget: run_a == run_b). */
static void junit_put_cmp_name(JunitBuf *b, const KvReport *rep, const KvComparison *cmp) {
    const KvRun *home = &rep->runs[cmp->run_b];
    junit_puts(b, kv_compare_kind_name(cmp->kind));
    junit_puts(b, ": ");
    if (cmp->run_a != cmp->run_b) {
        junit_put_run_ref(b, rep, cmp->run_a, home);
        junit_puts(b, " vs ");
    }
    junit_put_run_ref(b, rep, cmp->run_b, home);
}

/* The comparison's message, or a stand-in when the harness left it empty
 * (an empty message= would read as "no reason" in CI). */
static void junit_put_cmp_message(JunitBuf *b, const KvComparison *cmp, int in_attr) {
    if (cmp->message[0] != '\0') {
        JUNIT_FIELD(b, cmp->message, in_attr);
    } else {
        junit_printf(b, "%s comparison %s", kv_compare_kind_name(cmp->kind),
                     cmp->verdict == KV_VERDICT_SKIP ? "skipped" : "failed");
    }
}

/* A failing comparison in a failure's body: its name and message, where
 * it first differs, and the errors of a tolerance comparison. */
static void junit_put_cmp_failure(JunitBuf *b, const KvReport *rep, const KvComparison *cmp) {
    junit_put_cmp_name(b, rep, cmp);
    junit_puts(b, ": ");
    junit_put_cmp_message(b, cmp, 0);
    junit_printf(b, "\n  first_step=%lld first_row=%lld first_probe=%lld\n", (long long)cmp->first_step,
                 (long long)cmp->first_row, (long long)cmp->first_probe);
    if (cmp->kind == KV_CMP_REFERENCE || cmp->kind == KV_CMP_COMPILED) {
        junit_printf(b,
                     "  max_abs_err=%.9g max_rel_err=%.9g nmse=%.9g kl=%.9g top1_agreement=%.9g "
                     "near_ties=%lld\n",
                     cmp->max_abs_err, cmp->max_rel_err, cmp->nmse, cmp->kl, cmp->top1_agreement,
                     (long long)cmp->near_ties);
    }
}

/* Run i as one test case: its verdict is the console's (sum[i], from
 * kv_report_summarize_runs, which kv_report_print_counts counts), its
 * time the run's seconds. The comparisons that judged it are listed in
 * <system-out>, one line each with its verdict, so a passing case still
 * says what it was checked by. */
static void junit_put_run_case(JunitBuf *b, const KvReport *rep, int64_t i, const KvRunSummary *sum) {
    const KvRun *r = &rep->runs[i];
    const KvRunSummary *s = &sum[i];
    junit_puts(b, "    <testcase name=\"");
    junit_put_run_name(b, r, 1);
    junit_puts(b, "\" classname=\"");
    junit_put_classname(b, r);
    junit_printf(b, "\" time=\"%.3f\"", junit_run_seconds(r));
    if (s->verdict == KV_VERDICT_PASS && s->n_comparisons == 0) {
        junit_puts(b, "/>\n");
        return;
    }
    junit_puts(b, ">\n");
    if (s->verdict == KV_VERDICT_FAIL) {
        const KvComparison *first = &rep->comparisons[s->first_fail];
        int64_t n_fail = 0;
        for (int64_t c = s->first_fail; c < rep->n_comparisons; c++) {
            const KvComparison *cmp = &rep->comparisons[c];
            n_fail += cmp->run_b == i && cmp->verdict == KV_VERDICT_FAIL;
        }
        /* the headline: which check failed, and how; the body: every one */
        junit_printf(b, "      <failure message=\"%s: ", kv_compare_kind_name(first->kind));
        junit_put_cmp_message(b, first, 1);
        if (n_fail > 1) junit_printf(b, " (and %lld more)", (long long)(n_fail - 1));
        junit_printf(b, "\" type=\"%s\">", kv_compare_kind_name(first->kind));
        for (int64_t c = s->first_fail; c < rep->n_comparisons; c++) {
            const KvComparison *cmp = &rep->comparisons[c];
            if (cmp->run_b == i && cmp->verdict == KV_VERDICT_FAIL) junit_put_cmp_failure(b, rep, cmp);
        }
        junit_put_seeds_line(b, rep);
        junit_puts(b, "</failure>\n");
    } else if (s->verdict == KV_VERDICT_SKIP) {
        /* the console's reason (gate_verdict.c): the run's own, or its
         * first skipped comparison's */
        junit_puts(b, "      <skipped message=\"");
        if (r->skipped && r->skip_reason[0] != '\0') {
            JUNIT_FIELD(b, r->skip_reason, 1);
        } else if (!r->skipped && s->first_skip >= 0) {
            junit_put_cmp_message(b, &rep->comparisons[s->first_skip], 1);
        } else {
            junit_puts(b, "skipped");
        }
        junit_puts(b, "\"/>\n");
    }
    if (s->n_comparisons > 0) {
        junit_puts(b, "      <system-out>");
        for (int64_t c = 0; c < rep->n_comparisons; c++) {
            const KvComparison *cmp = &rep->comparisons[c];
            if (cmp->run_b != i) continue;
            junit_put_cmp_name(b, rep, cmp);
            if (cmp->verdict == KV_VERDICT_PASS) {
                junit_puts(b, ": pass");
                if (cmp->message[0] != '\0') {
                    junit_puts(b, ": ");
                    JUNIT_FIELD(b, cmp->message, 0);
                }
            } else {
                junit_puts(b, cmp->verdict == KV_VERDICT_FAIL ? ": FAIL: " : ": skipped: ");
                junit_put_cmp_message(b, cmp, 0);
            }
            junit_puts(b, "\n");
        }
        junit_puts(b, "</system-out>\n");
    }
    junit_puts(b, "    </testcase>\n");
}

static void junit_put_counts(JunitBuf *b, const JunitCounts *k) {
    junit_printf(b, " tests=\"%lld\" failures=\"%lld\" errors=\"0\" skipped=\"%lld\" time=\"%.3f\"",
                 (long long)k->tests, (long long)k->failures, (long long)k->skipped, k->seconds);
}

/* The whole document. leader[i]: index of the first run with run i's
 * (model, scenario); sum[i]: run i's summary; counts[L]: the totals of
 * the suite led by run L. */
static void junit_build(JunitBuf *b, const KvReport *rep, const int64_t *leader, const KvRunSummary *sum,
                        const JunitCounts *counts, const JunitCounts *total, const char *gate_fail) {
    junit_puts(b, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites name=\"kvrepro\"");
    junit_put_counts(b, total);
    junit_puts(b, ">\n");
    for (int64_t l = 0; l < rep->n_runs; l++) {
        if (leader[l] != l) continue;
        const KvRun *lr = &rep->runs[l];
        junit_puts(b, "  <testsuite name=\"");
        JUNIT_FIELD(b, lr->model, 1);
        junit_puts(b, "/");
        JUNIT_FIELD(b, lr->scenario, 1);
        junit_puts(b, "\"");
        junit_put_counts(b, &counts[l]);
        junit_puts(b, ">\n");
        junit_put_properties(b, rep);
        for (int64_t i = l; i < rep->n_runs; i++) {
            if (leader[i] == l) junit_put_run_case(b, rep, i, sum);
        }
        junit_puts(b, "  </testsuite>\n");
    }
    if (gate_fail != NULL) {
        /* the gate's own verdict, failed beyond any run (it judged too
         * little): a JUnit reader must not see all green where the console
         * ends in FAIL */
        junit_puts(b, "  <testsuite name=\"kvrepro/gate\" tests=\"1\" failures=\"1\" errors=\"0\" "
                      "skipped=\"0\" time=\"0.000\">\n"
                      "    <testcase name=\"gate: judged enough\" classname=\"kvrepro.gate\" "
                      "time=\"0.000\">\n      <failure message=\"");
        junit_put_escaped(b, gate_fail, strlen(gate_fail), 1);
        junit_puts(b, "\" type=\"gate\">FAIL: ");
        junit_put_escaped(b, gate_fail, strlen(gate_fail), 0);
        junit_puts(b, "</failure>\n    </testcase>\n  </testsuite>\n");
    }
    junit_puts(b, "</testsuites>\n");
}

/* ---- entry point -------------------------------------------------------------- */

KvStatus kv_junit_write(const KvReport *rep, const char *path, KvError *err) {
    return kv_junit_write_verdict(rep, NULL, path, err);
}

KvStatus kv_junit_write_verdict(const KvReport *rep, const char *gate_fail, const char *path,
                                KvError *err) {
    KvStatus st = KV_OK;
    int64_t *leader = NULL;
    KvRunSummary *sum = NULL;
    JunitCounts *counts = NULL;
    JunitBuf buf = {0};
    JunitCounts total = {0};

    if (rep == NULL || path == NULL || path[0] == '\0') {
        return kv_error_set(err, KV_ERR_INPUT, "kv_junit_write: report and a non-empty path are required");
    }
    st = junit_check_report(rep, err);
    if (st != KV_OK) {
        kv_error_prefix(err, path);
        return st;
    }

    size_t nr = (size_t)rep->n_runs;
    leader = malloc((nr > 0 ? nr : 1) * sizeof *leader);
    counts = calloc(nr > 0 ? nr : 1, sizeof *counts);
    if (leader == NULL || counts == NULL || kv_report_summarize_runs(rep, &sum) != KV_OK) {
        st = kv_error_set(err, KV_ERR_INTERNAL, "%s: out of memory for %zu runs", path, nr);
        goto cleanup;
    }

    /* Quadratic in the run count, which is a test matrix (thousands at
     * most), and it keeps suite order = order of first appearance without
     * sorting. */
    for (int64_t i = 0; i < rep->n_runs; i++) {
        leader[i] = i;
        for (int64_t j = 0; j < i; j++) {
            if (junit_same_pair(&rep->runs[j], &rep->runs[i])) {
                leader[i] = j;
                break;
            }
        }
    }

    /* A test case is a run, with the console's verdict: the same
     * summaries kv_report_print_counts counts, so the totals here are its
     * "N passed, N failed, N skipped" line, by construction. */
    for (int64_t i = 0; i < rep->n_runs; i++) {
        JunitCounts *k = &counts[leader[i]];
        k->tests++;
        k->failures += sum[i].verdict == KV_VERDICT_FAIL;
        k->skipped += sum[i].verdict == KV_VERDICT_SKIP;
        k->seconds += junit_run_seconds(&rep->runs[i]);
    }
    /* Totals summed suite by suite in suite order, so the root's time is the
     * sum of the suites' own (unrounded) times in one fixed order. */
    for (int64_t l = 0; l < rep->n_runs; l++) {
        if (leader[l] != l) continue;
        total.tests += counts[l].tests;
        total.failures += counts[l].failures;
        total.skipped += counts[l].skipped;
        total.seconds += counts[l].seconds;
    }
    total.tests += gate_fail != NULL;
    total.failures += gate_fail != NULL;

    junit_build(&buf, rep, leader, sum, counts, &total, gate_fail);
    if (buf.oom) {
        st = kv_error_set(err, KV_ERR_INTERNAL, "%s: out of memory building the JUnit document", path);
        goto cleanup;
    }

    /* the shared writer: an unnamed temporary linked and renamed into
     * place, so a killed gate leaves no partial file and no temporary; a
     * full disk is bad input naming path, like an unwritable directory */
    st = kv_report_file_publish(path, buf.data != NULL ? buf.data : "", buf.len, err);

cleanup:
    free(buf.data);
    free(counts);
    free(sum);
    free(leader);
    return st;
}
