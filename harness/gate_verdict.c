/* gate_verdict.c: the gate's verdict on one screen (gate_verdict.h): the
 * model x scenario grid, the skips grouped by reason, the next command for
 * a failure. */
#include "gate_verdict.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "compare.h"
#include "junit.h"

/* Index of name in names[0 .. n), -1 when absent. */
static int64_t name_find(char (*names)[KV_NAME_LEN], int64_t n, const char *name) {
    for (int64_t i = 0; i < n; i++) {
        if (strncmp(names[i], name, KV_NAME_LEN) == 0) return i;
    }
    return -1;
}

/* Index of name in names[0 .. *n), appended when absent and *n < cap;
 * -1 when absent and full. */
static int64_t name_index(char (*names)[KV_NAME_LEN], int64_t *n, int64_t cap, const char *name) {
    for (int64_t i = 0; i < *n; i++) {
        if (strncmp(names[i], name, KV_NAME_LEN) == 0) return i;
    }
    if (*n >= cap) return -1;
    snprintf(names[*n], KV_NAME_LEN, "%.*s", (int)strnlen(name, KV_NAME_LEN), name);
    return (*n)++;
}

/* A unit's scenario as the grid shows it: a twin run ("S.fresh", the
 * second request decoded from scratch) counts under its scenario S. */
static void grid_scenario(const KvRun *r, char *out) {
    const int len = (int)strnlen(r->scenario, KV_NAME_LEN);
    const char *dot = memchr(r->scenario, '.', (size_t)len);
    snprintf(out, KV_NAME_LEN, "%.*s", dot != NULL ? (int)(dot - r->scenario) : len, r->scenario);
}

/* Whether run r judges the reference against transformers' goldens (the
 * golden units: one line each in the header, one line here). */
static bool grid_golden(const KvRun *r) {
    return strncmp(r->engine, "transformers golden", strlen("transformers golden")) == 0;
}

KvStatus kv_gate_print_grid(const KvReport *rep, FILE *f) {
    if (rep->n_runs == 0) return KV_OK;
    KvStatus st = KV_OK;
    KvRunSummary *sum = NULL;
    char(*models)[KV_NAME_LEN] = calloc((size_t)rep->n_runs, KV_NAME_LEN);
    char(*scens)[KV_NAME_LEN] = calloc((size_t)rep->n_runs, KV_NAME_LEN);
    bool *golden = calloc((size_t)rep->n_runs, sizeof *golden); /* (n_runs) by model index */
    int64_t *cells = NULL; /* (n_scen, n_models, 3) passed, failed, skipped */
    int64_t n_models = 0, n_scens = 0, gold[3] = {0, 0, 0}, gold_models = 0;
    if (models == NULL || scens == NULL || golden == NULL ||
        kv_report_summarize_runs(rep, &sum) != KV_OK) {
        st = KV_ERR_INTERNAL;
        goto cleanup;
    }
    /* a golden unit's model ("hf/FAMILY") is golden for all its runs */
    for (int64_t i = 0; i < rep->n_runs; i++) {
        const int64_t m = name_index(models, &n_models, rep->n_runs, rep->runs[i].model);
        if (m >= 0 && grid_golden(&rep->runs[i])) golden[m] = true;
    }
    int64_t n_all = n_models;
    n_models = 0;
    char name[KV_NAME_LEN];
    for (int64_t i = 0; i < rep->n_runs; i++) {
        const int64_t m = name_find(models, n_all, rep->runs[i].model);
        if (m >= 0 && golden[m]) continue;
        grid_scenario(&rep->runs[i], name);
        name_index(scens, &n_scens, rep->n_runs, name);
    }
    /* the matrix models, in order, first; the golden ones after */
    char(*order)[KV_NAME_LEN] = calloc((size_t)(n_all > 0 ? n_all : 1), KV_NAME_LEN);
    if (order == NULL) {
        st = KV_ERR_INTERNAL;
        goto cleanup;
    }
    for (int64_t m = 0; m < n_all; m++) {
        if (!golden[m]) memcpy(order[n_models++], models[m], KV_NAME_LEN);
        else gold_models++;
    }
    memcpy(models, order, (size_t)n_models * KV_NAME_LEN);
    free(order);
    cells = calloc((size_t)((n_scens > 0 ? n_scens : 1) * (n_models > 0 ? n_models : 1) * 3),
                   sizeof *cells);
    if (cells == NULL) {
        st = KV_ERR_INTERNAL;
        goto cleanup;
    }
    for (int64_t i = 0; i < rep->n_runs; i++) {
        const int k = sum[i].verdict == KV_VERDICT_PASS ? 0 : sum[i].verdict == KV_VERDICT_FAIL ? 1
                                                                                                : 2;
        const int64_t m = name_find(models, n_models, rep->runs[i].model);
        if (m < 0) { /* a golden unit's */
            gold[k]++;
            continue;
        }
        grid_scenario(&rep->runs[i], name);
        const int64_t s = name_find(scens, n_scens, name);
        cells[(s * n_models + m) * 3 + k]++;
    }
    if (gold_models > 0) {
        fprintf(f, "transformers goldens (%" PRId64 " famil%s): %" PRId64 "/%" PRId64 "/%" PRId64
                   "%s\n", gold_models, gold_models == 1 ? "y" : "ies", gold[0], gold[1], gold[2],
                gold[1] > 0 ? "!" : "");
    }
    if (n_models == 0 || n_scens == 0) goto legend;
    /* column widths: the scenario names, then each model's name or cell */
    int sw = (int)strlen("scenario");
    for (int64_t s = 0; s < n_scens; s++) {
        const int len = (int)strnlen(scens[s], KV_NAME_LEN);
        sw = len > sw ? len : sw;
    }
    fprintf(f, "%-*s", sw, "scenario");
    int *mw = calloc((size_t)n_models, sizeof *mw);
    if (mw == NULL) {
        st = KV_ERR_INTERNAL;
        goto cleanup;
    }
    char cell[96];
    for (int64_t m = 0; m < n_models; m++) {
        mw[m] = (int)strnlen(models[m], KV_NAME_LEN);
        for (int64_t s = 0; s < n_scens; s++) {
            const int64_t *c = cells + (s * n_models + m) * 3;
            const int len = snprintf(cell, sizeof cell, "%" PRId64 "/%" PRId64 "/%" PRId64 "%s",
                                     c[0], c[1], c[2], c[1] > 0 ? "!" : "");
            mw[m] = len > mw[m] ? len : mw[m];
        }
        fprintf(f, "  %*.*s", mw[m], KV_NAME_LEN, models[m]);
    }
    fputc('\n', f);
    for (int64_t s = 0; s < n_scens; s++) {
        fprintf(f, "%-*.*s", sw, KV_NAME_LEN, scens[s]);
        for (int64_t m = 0; m < n_models; m++) {
            const int64_t *c = cells + (s * n_models + m) * 3;
            if (c[0] + c[1] + c[2] == 0) snprintf(cell, sizeof cell, ".");
            else snprintf(cell, sizeof cell, "%" PRId64 "/%" PRId64 "/%" PRId64 "%s", c[0], c[1],
                          c[2], c[1] > 0 ? "!" : "");
            fprintf(f, "  %*s", mw[m], cell);
        }
        fputc('\n', f);
    }
    free(mw);
legend:
    fprintf(f, "(runs passed/failed/skipped per model and scenario; ! marks a failure; the "
               "per-run table: --table, or kvrepro show REPORT.h5)\n");
    if (fflush(f) != 0 || ferror(f)) st = KV_ERR_INTERNAL;
cleanup:
    free(sum);
    free(models);
    free(scens);
    free(golden);
    free(cells);
    return st;
}

/* Why skipped run i was not judged: its own reason, or its first skipped
 * comparison's (sum: kv_report_summarize_runs). */
static const char *skip_reason_of(const KvReport *rep, const KvRunSummary *sum, int64_t i) {
    const KvRun *r = &rep->runs[i];
    if (r->skipped) return r->skip_reason;
    return sum[i].first_skip >= 0 ? rep->comparisons[sum[i].first_skip].message
                                  : "no comparison judged it";
}

/* bisect's run label: MODEL/SCENARIO/VARIANT[+FAULT]/BACKEND/MODE/rN */
static void run_full_label(const KvRun *r, char *out, size_t n) {
    char l[KV_NAME_LEN * 4];
    kv_run_label(r, l, sizeof l);
    snprintf(out, n, "%.*s/%.*s/%s", (int)strnlen(r->model, KV_NAME_LEN), r->model,
             (int)strnlen(r->scenario, KV_NAME_LEN), r->scenario, l);
}

KvStatus kv_gate_print_skips(const KvReport *rep, FILE *f) {
    if (rep->n_runs == 0) return KV_OK;
    KvRunSummary *sum = NULL;
    if (kv_report_summarize_runs(rep, &sum) != KV_OK) return KV_ERR_INTERNAL;
    /* groups: (backend, reason) of their first run, and their counts */
    int64_t *first = malloc((size_t)rep->n_runs * sizeof *first);
    int64_t *count = calloc((size_t)rep->n_runs, sizeof *count);
    const char **why = calloc((size_t)rep->n_runs, sizeof *why);
    if (first == NULL || count == NULL || why == NULL) {
        free(sum);
        free(first);
        free(count);
        free(why);
        return KV_ERR_INTERNAL;
    }
    int64_t n = 0;
    for (int64_t i = 0; i < rep->n_runs; i++) {
        if (sum[i].verdict != KV_VERDICT_SKIP) continue;
        const KvRun *r = &rep->runs[i];
        const char *reason = skip_reason_of(rep, sum, i);
        int64_t g = 0;
        while (g < n && !(strcmp(why[g], reason) == 0 &&
                          strncmp(rep->runs[first[g]].backend, r->backend,
                                  sizeof r->backend) == 0)) {
            g++;
        }
        if (g == n) {
            first[n] = i;
            why[n++] = reason;
        }
        count[g]++;
    }
    for (int64_t g = 0; g < n; g++) {
        const KvRun *r = &rep->runs[first[g]];
        fprintf(f, "%" PRId64 " run%s skipped on %.*s: %s\n", count[g], count[g] == 1 ? "" : "s",
                (int)strnlen(r->backend, sizeof r->backend), r->backend, why[g]);
    }
    free(sum);
    free(first);
    free(count);
    free(why);
    return fflush(f) != 0 || ferror(f) ? KV_ERR_INTERNAL : KV_OK;
}

bool kv_gate_print_next(const KvReport *rep, const KvComparison *c, const char *report_path,
                        FILE *f) {
    if (c->run_a == c->run_b || c->run_a < 0 || c->run_b < 0 || c->run_a >= rep->n_runs ||
        c->run_b >= rep->n_runs || rep->runs[c->run_a].skipped || rep->runs[c->run_b].skipped) {
        return false;
    }
    char la[KV_NAME_LEN * 6], lb[KV_NAME_LEN * 6];
    run_full_label(&rep->runs[c->run_a], la, sizeof la);
    run_full_label(&rep->runs[c->run_b], lb, sizeof lb);
    fprintf(f, "     next: kvrepro bisect %s --run %s --run %s --rerun%s\n",
            report_path != NULL ? report_path : "REPORT.h5", la, lb,
            report_path != NULL ? "" : " (write REPORT.h5 with --report)");
    return true;
}

bool kv_gate_print_failures(const KvReport *rep, bool mutation, bool verbose, bool next,
                            const char *report_path, FILE *f) {
    bool failed = false, texts = false;
    int64_t nexts = 0, more = 0; /* next lines printed, and failures past KV_GATE_NEXT_MAX */
    for (int64_t c = 0; c < rep->n_comparisons; c++) {
        const KvComparison *cmp = &rep->comparisons[c];
        const bool planted = mutation && rep->runs[cmp->run_b].fault[0] != '\0';
        failed = failed || cmp->verdict == KV_VERDICT_FAIL;
        if (!verbose && (planted || cmp->verdict != KV_VERDICT_FAIL)) continue;
        char la[96], lb[96], pair[200];
        kv_run_label(&rep->runs[cmp->run_a], la, sizeof la);
        kv_run_label(&rep->runs[cmp->run_b], lb, sizeof lb);
        /* a per-run check (finite, replay) names its one run */
        if (cmp->run_a == cmp->run_b) snprintf(pair, sizeof pair, "%s", lb);
        else snprintf(pair, sizeof pair, "%s vs %s", la, lb);
        fprintf(f, "%s %s %s: %s %s: %s\n", cmp->verdict == KV_VERDICT_FAIL ? "FAIL" : "ok  ",
               rep->runs[cmp->run_b].model, rep->runs[cmp->run_b].scenario, pair,
               kv_compare_kind_name(cmp->kind), cmp->message);
        /* a prompts file with texts: the failing row as text (the C side
         * has no tokenizer for the generated ids: said once) */
        const KvRun *rb = &rep->runs[cmp->run_b];
        if (cmp->verdict == KV_VERDICT_FAIL && rb->prompt_text != NULL && cmp->first_row >= 0 &&
            cmp->first_row < rb->batch) {
            char snip[256];
            kv_text_snippet(rb->prompt_text[cmp->first_row], 60, snip, sizeof snip);
            fprintf(f, "     row %lld (%lld ids): \"%s\"\n", (long long)cmp->first_row,
                   (long long)kv_run_row_ids(rb, cmp->first_row), snip);
            texts = true;
        }
        /* then the command that looks closer */
        if (next && cmp->verdict == KV_VERDICT_FAIL) {
            if (nexts < KV_GATE_NEXT_MAX) nexts += kv_gate_print_next(rep, cmp, report_path, f);
            else more++;
        }
    }
    if (more > 0) {
        fprintf(f, "     (%lld more failures: bisect them the same way, with their runs' labels)\n",
               (long long)more);
    }
    if (texts) fprintf(f, "decode the tokens: kvrepro-hf show REPORT.h5 --model DIR\n");
    return failed;
}

/* The counts of kv_report_print_counts, into three numbers. */
static KvStatus verdict_counts(const KvReport *rep, int64_t *passed, int64_t *failed,
                               int64_t *skipped) {
    *passed = *failed = *skipped = 0;
    KvRunSummary *sum = NULL;
    if (rep->n_runs > 0 && kv_report_summarize_runs(rep, &sum) != KV_OK) return KV_ERR_INTERNAL;
    for (int64_t i = 0; i < rep->n_runs; i++) {
        *passed += sum[i].verdict == KV_VERDICT_PASS;
        *failed += sum[i].verdict == KV_VERDICT_FAIL;
        *skipped += sum[i].verdict == KV_VERDICT_SKIP;
    }
    free(sum);
    return KV_OK;
}

KvStatus kv_gate_write_summary_md(const KvReport *rep, bool failed, const char *fail_why,
                                  const char *report_path, const char *path, KvError *err) {
    int64_t np, nf, ns;
    if (verdict_counts(rep, &np, &nf, &ns) != KV_OK) {
        return kv_error_set(err, KV_ERR_INTERNAL, "%s: out of memory", path);
    }
    char *text = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&text, &len);
    if (m == NULL) return kv_error_set(err, KV_ERR_INTERNAL, "%s: out of memory", path);
    fprintf(m, "## kvrepro gate: %s\n\n", failed ? "FAIL" : "PASS");
    fprintf(m, "%" PRId64 " passed, %" PRId64 " failed, %" PRId64 " skipped (runs)%s%s%s\n\n",
            np, nf, ns, report_path != NULL ? "; report `" : "",
            report_path != NULL ? report_path : "", report_path != NULL ? "`" : "");
    fprintf(m, "```text\n");
    KvStatus st = kv_gate_print_grid(rep, m);
    kv_gate_print_failures(rep, false, false, true, report_path, m);
    if (st == KV_OK) st = kv_gate_print_skips(rep, m);
    if (fail_why != NULL) fprintf(m, "FAIL: %s\n", fail_why);
    fprintf(m, "```\n");
    if (fclose(m) != 0 || st != KV_OK) {
        free(text);
        return kv_error_set(err, KV_ERR_INTERNAL, "%s: out of memory", path);
    }
    st = kv_report_file_publish(path, text, len, err);
    free(text);
    return st;
}

/* cJSON's adders return NULL when out of memory; one flag for all. */
static void json_num(cJSON *o, const char *k, double v, bool *oom) {
    if (cJSON_AddNumberToObject(o, k, v) == NULL) *oom = true;
}
static void json_str(cJSON *o, const char *k, const char *v, bool *oom) {
    if (cJSON_AddStringToObject(o, k, v) == NULL) *oom = true;
}

/* The object of arr whose ka and kb are va and vb, appended with them and
 * each of counters (NULL-terminated) at 0 when absent; NULL, *oom set, when
 * out of memory. Both the grid's cells and the skip groups are these. */
static cJSON *json_group(cJSON *arr, const char *ka, const char *va, const char *kb,
                         const char *vb, const char *const *counters, bool *oom) {
    cJSON *it = NULL;
    cJSON_ArrayForEach(it, arr) {
        if (strcmp(cJSON_GetObjectItem(it, ka)->valuestring, va) == 0 &&
            strcmp(cJSON_GetObjectItem(it, kb)->valuestring, vb) == 0) {
            return it;
        }
    }
    cJSON *g = cJSON_CreateObject();
    if (g == NULL || !cJSON_AddItemToArray(arr, g)) {
        cJSON_Delete(g);
        *oom = true;
        return NULL;
    }
    json_str(g, ka, va, oom);
    json_str(g, kb, vb, oom);
    for (int i = 0; counters[i] != NULL; i++) json_num(g, counters[i], 0, oom);
    return *oom ? NULL : g;
}

/* counter k of group g plus one */
static void json_count(cJSON *g, const char *k) {
    cJSON *n = cJSON_GetObjectItem(g, k);
    cJSON_SetNumberValue(n, n->valuedouble + 1.0);
}

KvStatus kv_gate_write_summary_json(const KvReport *rep, bool failed, const char *fail_why,
                                    const char *report_path, const char *path, KvError *err) {
    int64_t np = 0, nf = 0, ns = 0;
    KvRunSummary *sum = NULL;
    if (rep->n_runs > 0 && kv_report_summarize_runs(rep, &sum) != KV_OK) {
        return kv_error_set(err, KV_ERR_INTERNAL, "%s: out of memory", path);
    }
    for (int64_t i = 0; i < rep->n_runs; i++) {
        np += sum[i].verdict == KV_VERDICT_PASS;
        nf += sum[i].verdict == KV_VERDICT_FAIL;
        ns += sum[i].verdict == KV_VERDICT_SKIP;
    }
    bool oom = false;
    cJSON *root = cJSON_CreateObject();
    cJSON *grid = cJSON_CreateArray(), *fails = cJSON_CreateArray(), *skips = cJSON_CreateArray();
    if (root == NULL || grid == NULL || fails == NULL || skips == NULL) oom = true;
    if (!oom) {
        json_str(root, "format", "kvrepro-summary", &oom);
        json_num(root, "version", 1, &oom);
        json_str(root, "verdict", failed ? "fail" : "pass", &oom);
        json_num(root, "passed", (double)np, &oom);
        json_num(root, "failed", (double)nf, &oom);
        json_num(root, "skipped", (double)ns, &oom);
        if (fail_why != NULL) json_str(root, "gate_failure", fail_why, &oom);
        else if (cJSON_AddNullToObject(root, "gate_failure") == NULL) oom = true;
        if (report_path != NULL) json_str(root, "report", report_path, &oom);
        else if (cJSON_AddNullToObject(root, "report") == NULL) oom = true;
    }
    /* the grid's cells: (model, scenario) in the order first seen */
    static const char *const verdicts[] = {"passed", "failed", "skipped", NULL};
    for (int64_t i = 0; i < rep->n_runs && !oom; i++) {
        const KvRun *r = &rep->runs[i];
        char model[KV_NAME_LEN + 1], scen[KV_NAME_LEN + 1];
        snprintf(model, sizeof model, "%.*s", (int)strnlen(r->model, KV_NAME_LEN), r->model);
        snprintf(scen, sizeof scen, "%.*s", (int)strnlen(r->scenario, KV_NAME_LEN), r->scenario);
        cJSON *cell = json_group(grid, "model", model, "scenario", scen, verdicts, &oom);
        if (cell == NULL) break;
        json_count(cell, verdicts[sum[i].verdict == KV_VERDICT_PASS   ? 0
                                  : sum[i].verdict == KV_VERDICT_FAIL ? 1
                                                                      : 2]);
    }
    for (int64_t c = 0; c < rep->n_comparisons && !oom; c++) {
        const KvComparison *cmp = &rep->comparisons[c];
        if (cmp->verdict != KV_VERDICT_FAIL || cmp->run_a < 0 || cmp->run_b < 0 ||
            cmp->run_a >= rep->n_runs || cmp->run_b >= rep->n_runs) {
            continue;
        }
        cJSON *o = cJSON_CreateObject();
        if (o == NULL || !cJSON_AddItemToArray(fails, o)) {
            cJSON_Delete(o);
            oom = true;
            break;
        }
        char la[KV_NAME_LEN * 6], lb[KV_NAME_LEN * 6];
        run_full_label(&rep->runs[cmp->run_a], la, sizeof la);
        run_full_label(&rep->runs[cmp->run_b], lb, sizeof lb);
        json_str(o, "kind", kv_compare_kind_name(cmp->kind), &oom);
        json_str(o, "run_a", la, &oom);
        json_str(o, "run_b", lb, &oom);
        json_num(o, "first_step", (double)cmp->first_step, &oom);
        json_num(o, "first_row", (double)cmp->first_row, &oom);
        json_str(o, "message", cmp->message, &oom);
        if (cmp->run_a != cmp->run_b && !rep->runs[cmp->run_a].skipped &&
            !rep->runs[cmp->run_b].skipped) {
            char cmd[KV_NAME_LEN * 16];
            snprintf(cmd, sizeof cmd, "kvrepro bisect %s --run %s --run %s --rerun",
                     report_path != NULL ? report_path : "REPORT.h5", la, lb);
            json_str(o, "next", cmd, &oom);
        }
    }
    /* the skip groups, as kv_gate_print_skips groups them */
    static const char *const runs_count[] = {"runs", NULL};
    for (int64_t i = 0; i < rep->n_runs && !oom; i++) {
        if (sum[i].verdict != KV_VERDICT_SKIP) continue;
        const KvRun *r = &rep->runs[i];
        char be[sizeof r->backend + 1];
        snprintf(be, sizeof be, "%.*s", (int)strnlen(r->backend, sizeof r->backend), r->backend);
        cJSON *g = json_group(skips, "backend", be, "reason", skip_reason_of(rep, sum, i),
                              runs_count, &oom);
        if (g == NULL) break;
        json_count(g, "runs");
    }
    free(sum);
    /* each array owned by root once added */
    if (!oom && cJSON_AddItemToObject(root, "grid", grid)) grid = NULL;
    else oom = true;
    if (!oom && cJSON_AddItemToObject(root, "failures", fails)) fails = NULL;
    else oom = true;
    if (!oom && cJSON_AddItemToObject(root, "skips", skips)) skips = NULL;
    else oom = true;
    char *text = oom ? NULL : cJSON_Print(root);
    cJSON_Delete(root);
    cJSON_Delete(grid);
    cJSON_Delete(fails);
    cJSON_Delete(skips);
    char *line = NULL; /* the document and its final newline */
    if (text != NULL) {
        line = malloc(strlen(text) + 2);
        if (line != NULL) snprintf(line, strlen(text) + 2, "%s\n", text);
        cJSON_free(text);
    }
    if (line == NULL) return kv_error_set(err, KV_ERR_INTERNAL, "%s: out of memory", path);
    KvStatus st = kv_report_file_publish(path, line, strlen(line), err);
    free(line);
    return st;
}

