/* gate_output.c: the root attributes, failure lines and output files every
 * gate shares (gate_output.h). */
#include "gate_output.h"

#include <stdio.h>
#include <unistd.h>

#include "compare.h"
#include "junit.h"
#include "report_h5.h"

void kv_gate_fill_root(KvReport *rep, uint64_t weight_seed, uint64_t prompt_seed, int shard_i,
                       int shard_n) {
    snprintf(rep->tool_version, sizeof rep->tool_version, "%s", KV_VERSION);
    snprintf(rep->git_commit, sizeof rep->git_commit, "%s", KV_GIT_COMMIT);
    if (gethostname(rep->host, sizeof rep->host) != 0) snprintf(rep->host, sizeof rep->host, "unknown");
    rep->host[sizeof rep->host - 1] = '\0';
    snprintf(rep->math_mode, sizeof rep->math_mode, "fp32, -ffp-contract=off, no fast-math");
    rep->weight_seed = weight_seed;
    rep->prompt_seed = prompt_seed;
    snprintf(rep->shard, sizeof rep->shard, "%d/%d", shard_i, shard_n);
}

KvStatus kv_gate_check_outputs(const char *report_path, const char *junit_path, KvError *err) {
    KvStatus st = KV_OK;
    if (report_path != NULL) st = kv_report_check_writable(report_path, err);
    if (st == KV_OK && junit_path != NULL) st = kv_report_check_writable(junit_path, err);
    return st;
}

bool kv_gate_print_failures(const KvReport *rep, bool mutation, bool verbose) {
    bool failed = false;
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
        printf("%s %s %s: %s %s: %s\n", cmp->verdict == KV_VERDICT_FAIL ? "FAIL" : "ok  ",
               rep->runs[cmp->run_b].model, rep->runs[cmp->run_b].scenario, pair,
               kv_compare_kind_name(cmp->kind), cmp->message);
    }
    return failed;
}

KvStatus kv_gate_write_outputs(const KvReport *rep, const char *report_path,
                               const char *junit_path, bool quiet, KvError *err) {
    if (report_path != NULL) {
        KvStatus st = kv_report_write_h5(rep, report_path, err);
        if (st != KV_OK) return st;
        if (!quiet) printf("report: %s\n", report_path);
    }
    if (junit_path != NULL) {
        KvStatus st = kv_junit_write(rep, junit_path, err);
        if (st != KV_OK) return st;
        if (!quiet) printf("junit: %s\n", junit_path);
    }
    return KV_OK;
}
