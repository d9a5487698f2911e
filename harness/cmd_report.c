/* cmd_report.c: the report subcommands. `kvrepro show R.h5` prints a report's
 * summary; `kvrepro diff` compares two recorded runs with the same comparator
 * the gate uses; `kvrepro merge` joins shard reports into one. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "compare.h"
#include "report.h"
#include "report_h5.h"

static void report_print_root(const KvReport *rep, const char *path) {
    printf("report %s: kvrepro %s (commit %s), host %s\n", path, rep->tool_version,
           rep->git_commit, rep->host);
    printf("device: %s; math: %s; shard %s\n", rep->device, rep->math_mode, rep->shard);
    printf("seeds: weights %" PRIu64 ", prompts %" PRIu64 "; model fnv1a64 0x%016" PRIx64 "\n",
           rep->weight_seed, rep->prompt_seed, rep->model_hash);
    for (int64_t t = 0; t < rep->n_tolerances; t++) {
        printf("tolerance %s = %g (%s)\n", rep->tolerances[t].name, rep->tolerances[t].value,
               rep->tolerances[t].reason);
    }
}

/* Whether runs a and b hold the same row texts and tokenizer. */
static bool show_same_texts(const KvRun *a, const KvRun *b) {
    if (a->batch != b->batch || strcmp(a->tokenizer, b->tokenizer) != 0) return false;
    for (int64_t r = 0; r < a->batch; r++) {
        if (strcmp(a->prompt_text[r], b->prompt_text[r]) != 0) return false;
    }
    return true;
}

/* The row texts of the runs of a prompts file with texts (docs/SCHEMA.md),
 * each batch once with the runs that decoded it; nothing for a report
 * without texts. The C side has no tokenizer: the generated tokens are
 * decoded by kvrepro-hf. */
static void show_prompt_texts(const KvReport *rep, const char *path) {
    bool any = false;
    for (int64_t i = 0; i < rep->n_runs; i++) {
        const KvRun *r = &rep->runs[i];
        if (r->prompt_text == NULL) continue;
        bool seen = false;
        for (int64_t j = 0; j < i && !seen; j++) {
            seen = rep->runs[j].prompt_text != NULL && show_same_texts(&rep->runs[j], r);
        }
        if (seen) continue;
        any = true;
        /* the runs with this batch, as ranges of indices */
        char runs[160] = "";
        size_t used = 0;
        for (int64_t j = i; j < rep->n_runs && used + 24 < sizeof runs; j++) {
            const KvRun *q = &rep->runs[j];
            if (q->prompt_text == NULL || !show_same_texts(q, r)) continue;
            int64_t k = j;
            while (k + 1 < rep->n_runs && rep->runs[k + 1].prompt_text != NULL &&
                   show_same_texts(&rep->runs[k + 1], r)) {
                k++;
            }
            used += (size_t)snprintf(runs + used, sizeof runs - used, "%s%lld", used ? ", " : "",
                                     (long long)j);
            if (k > j) {
                used += (size_t)snprintf(runs + used, sizeof runs - used, "-%lld", (long long)k);
            }
            j = k;
        }
        printf("prompt texts of runs %s (%s%s):\n", runs,
               r->tokenizer[0] != '\0' ? "tokenizer " : "no tokenizer recorded",
               r->tokenizer);
        for (int64_t b = 0; b < r->batch; b++) {
            char snip[256];
            kv_text_snippet(r->prompt_text[b], 60, snip, sizeof snip);
            printf("  row %lld (%lld ids): \"%s\"\n", (long long)b,
                   (long long)kv_run_row_ids(r, b), snip);
        }
    }
    if (any) printf("decode the tokens: kvrepro-hf show %s --model DIR\n", path);
}

int kv_cmd_show(int argc, char **argv) {
    if (argc != 2 || strcmp(argv[1], "--help") == 0) {
        fprintf(argc == 2 ? stdout : stderr,
                "usage: kvrepro show REPORT.h5\n\nPrints a report's root attributes and its "
                "summary table (one line per run,\nthen 'N passed, N failed, N skipped').\n");
        return argc == 2 ? KV_EXIT_PASS : KV_EXIT_USAGE;
    }
    KvReport rep;
    KvError err = {{0}};
    KvStatus st = kv_report_read_h5(argv[1], &rep, &err);
    if (st != KV_OK) {
        fprintf(stderr, "kvrepro show: %s\n", err.msg);
        return kv_cli_exit_code(st);
    }
    report_print_root(&rep, argv[1]);
    st = kv_report_print_summary(&rep, stdout);
    if (st == KV_OK) show_prompt_texts(&rep, argv[1]);
    kv_report_free(&rep);
    return st == KV_OK ? KV_EXIT_PASS : KV_EXIT_INTERNAL;
}

static void diff_usage(FILE *f) {
    fprintf(f,
            "usage: kvrepro diff A.h5 [B.h5] --run X --run Y\n\n"
            "Compares run X (of A.h5) with run Y (of B.h5, or of A.h5 when only one report is\n"
            "given) bitwise, with the gate's comparator, and prints the first differing\n"
            "(step, row, probe). With a reference run on either side, the reference\n"
            "agreement metrics are printed too. Runs whose probe layouts differ (another\n"
            "engine's run vs kvrepro's) are compared by tokens and logits only, naming no\n"
            "probe. Runs are selected by index or by label\n"
            "MODEL/SCENARIO/VARIANT/BACKEND/MODE/rN (as `kvrepro show` lists them).\n"
            "Exit codes: 0 identical, 1 different, 2 bad input (unknown run, mismatched\n"
            "runs).\n");
}

int kv_cmd_diff(int argc, char **argv) {
    const char *paths[2] = {NULL, NULL};
    const char *sel[2] = {NULL, NULL};
    int n_paths = 0, n_sel = 0;
    bool bad = false;
    for (int i = 1; i < argc && !bad; i++) {
        const char *v = NULL;
        if (strcmp(argv[i], "--help") == 0) {
            diff_usage(stdout);
            return KV_EXIT_PASS;
        } else if (kv_cli_take(argc, argv, &i, "--run", &v, &bad)) {
            if (!bad && n_sel < 2) sel[n_sel++] = v;
            else bad = true;
        } else if (argv[i][0] != '-' && n_paths < 2) {
            paths[n_paths++] = argv[i];
        } else {
            fprintf(stderr, "kvrepro diff: unexpected argument '%s'\n", argv[i]);
            bad = true;
        }
    }
    if (bad || n_paths < 1 || n_sel != 2) {
        diff_usage(stderr);
        return KV_EXIT_USAGE;
    }
    KvReport rep[2];
    memset(rep, 0, sizeof rep);
    KvError err = {{0}};
    int rc = KV_EXIT_PASS;
    KvStatus st = KV_OK;
    for (int k = 0; k < n_paths && st == KV_OK; k++) st = kv_report_read_h5(paths[k], &rep[k], &err);
    if (st != KV_OK) {
        fprintf(stderr, "kvrepro diff: %s\n", err.msg);
        rc = kv_cli_exit_code(st);
        goto cleanup;
    }
    const KvReport *ra = &rep[0];
    const KvReport *rb = n_paths == 2 ? &rep[1] : &rep[0];
    const int64_t a = kv_report_find_run(ra, sel[0]);
    const int64_t b = kv_report_find_run(rb, sel[1]);
    if (a < 0 || b < 0) {
        fprintf(stderr, "kvrepro diff: %s: no run '%s' (%lld runs; see kvrepro show)\n",
                a < 0 ? paths[0] : paths[n_paths - 1], a < 0 ? sel[0] : sel[1],
                (long long)(a < 0 ? ra->n_runs : rb->n_runs));
        rc = KV_EXIT_USAGE;
        goto cleanup;
    }
    const KvRun *x = &ra->runs[a], *y = &rb->runs[b];
    if (x->skipped || y->skipped || x->steps != y->steps || x->batch != y->batch ||
        x->vocab != y->vocab) {
        fprintf(stderr, "kvrepro diff: mismatched runs: %s is %s%lld steps x %lld rows x %lld vocab, "
                "%s is %s%lld x %lld x %lld\n", sel[0], x->skipped ? "skipped, " : "",
                (long long)x->steps, (long long)x->batch, (long long)x->vocab, sel[1],
                y->skipped ? "skipped, " : "", (long long)y->steps, (long long)y->batch,
                (long long)y->vocab);
        rc = KV_EXIT_USAGE;
        goto cleanup;
    }
    /* Another engine's probes hash other arithmetic: with different probe
     * layouts only the outputs say anything, and no probe is named. */
    const bool like = kv_probe_layouts_equal(x, y);
    if (!like) {
        printf("probe layouts differ (%lld vs %lld probes): comparing tokens and logits only\n",
               (long long)x->n_probes, (long long)y->n_probes);
    }
    KvComparison c;
    if (like) kv_compare_bitwise(x, y, KV_CMP_VARIANT, a, b, &c);
    else kv_compare_bitwise_outputs(x, y, KV_CMP_VARIANT, a, b, &c);
    printf("%s vs %s: %s\n", sel[0], sel[1], c.message);
    if (strcmp(x->variant, "reference") == 0 || strcmp(y->variant, "reference") == 0) {
        KvTolerances tol = kv_tolerances_default();
        const bool x_ref = strcmp(x->variant, "reference") == 0;
        KvComparison rc_cmp;
        if (like) {
            kv_compare_reference(x_ref ? x : y, x_ref ? y : x, &tol, x_ref ? a : b,
                                 x_ref ? b : a, &rc_cmp);
        } else {
            kv_compare_outputs(x_ref ? x : y, x_ref ? y : x, &tol, KV_CMP_REFERENCE,
                               x_ref ? a : b, x_ref ? b : a, &rc_cmp);
        }
        if (rc_cmp.verdict == KV_VERDICT_SKIP) {
            printf("reference agreement: %s\n", rc_cmp.message);
        } else {
            printf("reference agreement: %s (max abs %.3g, nmse %.3g, kl %.3g, top-1 %.1f%%)\n",
                   rc_cmp.message, rc_cmp.max_abs_err, rc_cmp.nmse, rc_cmp.kl,
                   rc_cmp.top1_agreement);
        }
    }
    rc = c.verdict == KV_VERDICT_FAIL ? KV_EXIT_GATE_FAIL : KV_EXIT_PASS;
cleanup:
    kv_report_free(&rep[0]);
    kv_report_free(&rep[1]);
    return rc;
}

/* True when two shard reports come from the same gate (same tool, commit,
 * seeds, model and tolerances), so their runs may be joined. */
static bool merge_compatible(const KvReport *a, const KvReport *b, char *why, size_t n) {
    if (strcmp(a->tool_version, b->tool_version) != 0 || strcmp(a->git_commit, b->git_commit) != 0) {
        snprintf(why, n, "tool version/commit %.40s/%.40s vs %.40s/%.40s", a->tool_version, a->git_commit,
                 b->tool_version, b->git_commit);
        return false;
    }
    if (a->weight_seed != b->weight_seed || a->prompt_seed != b->prompt_seed ||
        a->model_hash != b->model_hash) {
        snprintf(why, n, "seeds or model differ");
        return false;
    }
    /* The gate-wide tolerances (names without '@') must match one for one;
     * a unit's calibrated "NAME@MODEL/SCENARIO" belongs to that unit's shard
     * alone and is joined by merge_unit_tolerances. */
    int64_t ta = 0, tb = 0;
    for (;;) {
        while (ta < a->n_tolerances && strchr(a->tolerances[ta].name, '@') != NULL) ta++;
        while (tb < b->n_tolerances && strchr(b->tolerances[tb].name, '@') != NULL) tb++;
        if (ta == a->n_tolerances || tb == b->n_tolerances) break;
        if (strcmp(a->tolerances[ta].name, b->tolerances[tb].name) != 0 ||
            a->tolerances[ta].value != b->tolerances[tb].value) {
            snprintf(why, n, "tolerance %s differs", a->tolerances[ta].name);
            return false;
        }
        ta++;
        tb++;
    }
    if (ta != a->n_tolerances || tb != b->n_tolerances) {
        snprintf(why, n, "tolerances differ");
        return false;
    }
    return true;
}

/* Appends in's per-unit tolerances ("NAME@MODEL/SCENARIO", one per unit the
 * shard ran) to out's. Units never repeat across shards (the duplicate-run
 * check comes first), so neither do these names. */
static bool merge_unit_tolerances(KvReport *out, const KvReport *in) {
    int64_t extra = 0;
    for (int64_t t = 0; t < in->n_tolerances; t++) {
        if (strchr(in->tolerances[t].name, '@') != NULL) extra++;
    }
    if (extra == 0) return true;
    KvTolerance *ts = realloc(out->tolerances,
                              (size_t)(out->n_tolerances + extra) * sizeof *ts);
    if (ts == NULL) return false;
    out->tolerances = ts;
    for (int64_t t = 0; t < in->n_tolerances; t++) {
        if (strchr(in->tolerances[t].name, '@') != NULL) {
            out->tolerances[out->n_tolerances++] = in->tolerances[t];
        }
    }
    return true;
}

/* The first run of in that out already holds (same model, scenario,
 * variant and fault, backend, mode and repeat): -1 when none. Merging the
 * same shard twice, or two gates over the same units, would count one run
 * twice and pass or fail it twice. */
static int64_t merge_duplicate_run(const KvReport *out, const KvReport *in) {
    for (int64_t j = 0; j < in->n_runs; j++) {
        const KvRun *b = &in->runs[j];
        for (int64_t i = 0; i < out->n_runs; i++) {
            const KvRun *a = &out->runs[i];
            if (a->repeat == b->repeat && strcmp(a->model, b->model) == 0 &&
                strcmp(a->scenario, b->scenario) == 0 && strcmp(a->variant, b->variant) == 0 &&
                strcmp(a->fault, b->fault) == 0 && strcmp(a->backend, b->backend) == 0 &&
                strcmp(a->mode, b->mode) == 0) {
                return j;
            }
        }
    }
    return -1;
}

/* A decimal count written as the gate writes it: digits only, no sign,
 * space or leading zero, at most 9 digits. Returns the end, or NULL. */
static const char *merge_count(const char *p, long *v) {
    if (*p < '1' || *p > '9') return NULL;
    long x = 0;
    int n = 0;
    for (; *p >= '0' && *p <= '9'; p++) {
        if (++n > 9) return NULL;
        x = x * 10 + (*p - '0');
    }
    *v = x;
    return p;
}

/* A report's shard label: "I/N" with 1 <= I <= N (a gate's, `--shard I/N`;
 * "1/1" unsharded), or "merged N" (an earlier merge's, N >= 1). Sets
 * *i and *n for "I/N" (*i = 0 for a merged report). False for anything
 * else ("x", "0/0", "3/2"): a report that says it is no shard of any split
 * is not merged as if it were one. */
static bool merge_shard_label(const char *label, long *i, long *n) {
    const char *p;
    *i = 0;
    if (strncmp(label, "merged ", 7) == 0) {
        p = merge_count(label + 7, n);
        return p != NULL && *p == '\0';
    }
    p = merge_count(label, i);
    if (p == NULL || *p != '/') return false;
    p = merge_count(p + 1, n);
    return p != NULL && *p == '\0' && *i <= *n;
}

/* KV_ERR_INPUT naming the file and the field when rep's shard label is
 * not one merge_shard_label accepts. */
static KvStatus merge_check_shard(const KvReport *rep, const char *path, long *i, long *n,
                                  KvError *err) {
    if (merge_shard_label(rep->shard, i, n)) return KV_OK;
    return kv_error_set(err, KV_ERR_INPUT, "%s: shard: expected I/N with 1 <= I <= N (a gate's "
                        "--shard) or 'merged N', found '%.31s'", path, rep->shard);
}

int kv_cmd_merge(int argc, char **argv) {
    if (argc < 3 || strcmp(argv[1], "--help") == 0) {
        fprintf(argc >= 2 && strcmp(argv[1], "--help") == 0 ? stdout : stderr,
                "usage: kvrepro merge OUT.h5 IN.h5...\n\nJoins shard reports of one gate "
                "(`kvrepro gate --shard I/N`) into one\nreport; the inputs must share the tool "
                "version, commit, seeds, model and\ntolerances, be shards of one split, and "
                "hold no run twice.\n");
        return argc >= 2 && strcmp(argv[1], "--help") == 0 ? KV_EXIT_PASS : KV_EXIT_USAGE;
    }
    const char *out_path = argv[1];
    KvReport out, in, first_shard;
    memset(&out, 0, sizeof out);
    memset(&in, 0, sizeof in);
    memset(&first_shard, 0, sizeof first_shard); /* only .shard: the first input's */
    KvError err = {{0}};
    int rc = KV_EXIT_PASS;
    long fi = 0, fn = 0; /* the first input's shard */
    /* the output is checked before the inputs are read (a directory, a
     * device or a FIFO there is refused, nothing is left behind) */
    KvStatus st = kv_report_check_writable(out_path, &err);
    if (st != KV_OK) goto fail;
    for (int k = 2; k < argc; k++) {
        st = kv_report_read_h5(argv[k], &in, &err);
        if (st != KV_OK) goto fail;
        long si = 0, sn = 0;
        st = merge_check_shard(&in, argv[k], &si, &sn, &err);
        if (st != KV_OK) goto fail;
        if (k == 2) {
            fi = si;
            fn = sn;
            snprintf(first_shard.shard, sizeof first_shard.shard, "%s", in.shard);
            out = in; /* take the first report whole */
            memset(&in, 0, sizeof in);
            continue;
        }
        char why[256];
        if (!merge_compatible(&out, &in, why, sizeof why)) {
            st = kv_error_set(&err, KV_ERR_INPUT, "%s: not a shard of the same gate as %s: %s",
                              argv[k], argv[2], why);
            goto fail;
        }
        if (si > 0 && fi > 0 && sn != fn) {
            st = kv_error_set(&err, KV_ERR_INPUT, "%s: shard %s of a gate split %ld ways, but %s "
                              "is shard %s of %ld", argv[k], in.shard, sn, argv[2],
                              first_shard.shard, fn);
            goto fail;
        }
        const int64_t dup = merge_duplicate_run(&out, &in);
        if (dup >= 0) {
            char label[192];
            kv_run_label(&in.runs[dup], label, sizeof label);
            st = kv_error_set(&err, KV_ERR_INPUT, "%s: run %lld (%.64s/%.64s/%s) is already in an "
                              "earlier input: the same shard given twice, or overlapping gates",
                              argv[k], (long long)dup, in.runs[dup].model, in.runs[dup].scenario,
                              label);
            goto fail;
        }
        if (!merge_unit_tolerances(&out, &in)) goto oom;
        const int64_t base = out.n_runs;
        KvRun *runs = realloc(out.runs, (size_t)(out.n_runs + in.n_runs) * sizeof *runs);
        if (runs == NULL) goto oom;
        out.runs = runs;
        memcpy(out.runs + out.n_runs, in.runs, (size_t)in.n_runs * sizeof *runs);
        out.n_runs += in.n_runs;
        KvComparison *cs = realloc(out.comparisons,
                                   (size_t)(out.n_comparisons + in.n_comparisons) * sizeof *cs);
        if (cs == NULL) goto oom;
        out.comparisons = cs;
        for (int64_t c = 0; c < in.n_comparisons; c++) {
            KvComparison cmp = in.comparisons[c];
            cmp.run_a += base; /* run indices move with the runs */
            cmp.run_b += base;
            out.comparisons[out.n_comparisons++] = cmp;
        }
        /* The runs' arrays now belong to out. */
        free(in.runs);
        in.runs = NULL;
        in.n_runs = 0;
        kv_report_free(&in);
    }
    snprintf(out.shard, sizeof out.shard, "merged %d", argc - 2);
    st = kv_report_write_h5(&out, out_path, &err);
    if (st != KV_OK) goto fail;
    printf("merged %d reports into %s: %lld runs, %lld comparisons\n", argc - 2, out_path,
           (long long)out.n_runs, (long long)out.n_comparisons);
    goto cleanup;
oom:
    st = kv_error_set(&err, KV_ERR_INTERNAL, "out of memory");
fail:
    fprintf(stderr, "kvrepro merge: %s\n", err.msg);
    rc = kv_cli_exit_code(st);
cleanup:
    kv_report_free(&in);
    kv_report_free(&out);
    return rc;
}
