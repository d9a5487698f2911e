/* fuzz_report.c: libFuzzer target for the HDF5 report reader. The input is
 * a report file; kv_report_read_h5 takes a path only, so each input is
 * written to this process's scratch directory first.
 *
 * Each input goes through kv_report_read_h5 and then what `kvrepro show`
 * does with a loaded report (the root lines and kv_report_print_summary,
 * printed to /dev/null). A report that reads must also:
 *  - keep the reader's promises (terminated strings, comparisons naming
 *    existing runs, every array of a run that ran);
 *  - round-trip: kv_report_write_h5 accepts it and reading that file back
 *    gives the same report (what `merge` and `bisect` rely on).
 * After every input, no HDF5 file or object may be left open. */
#include <hdf5.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fuzz_common.h"
#include "fuzz_reports.h"
#include "report.h"
#include "report_h5.h"

static char g_input[4096], g_copy[4096];
static FILE *g_null;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    kv_fuzz_path(g_input, sizeof g_input, "input.h5");
    kv_fuzz_path(g_copy, sizeof g_copy, "copy.h5");
    g_null = fopen("/dev/null", "w");
    if (g_null == NULL) {
        perror("/dev/null");
        abort();
    }
    /* No limits on HDF5's free lists: each file open allocates a metadata
     * cache of over 512 KB, which the default limits hand back to malloc at
     * close; under ASan that is a fresh mmap and page faults every time
     * (3x slower). Kept blocks stay reachable, so LeakSanitizer is not
     * misled; what HDF5 loses for good on a damaged file is its own leak
     * (lsan.supp). */
    if (H5set_free_list_limits(-1, -1, -1, -1, -1, -1) < 0) {
        fprintf(stderr, "kvrepro fuzz: H5set_free_list_limits failed\n");
        abort();
    }
    /* Every seed kind must write and read back: the harness works. */
    for (int k = 0; k < KV_FUZZ_REPORT_COUNT; k++) {
        KvReport rep, back;
        KvError err = {{0}};
        kv_fuzz_tiny_report((KvFuzzReportKind)k, &rep);
        if (kv_report_write_h5(&rep, g_copy, &err) != KV_OK ||
            kv_report_read_h5(g_copy, &back, &err) != KV_OK) {
            fprintf(stderr, "kvrepro fuzz: warm-up report %d: %s\n", k, err.msg);
            abort();
        }
        kv_report_free(&rep);
        kv_report_free(&back);
    }
    (void)unlink(g_copy);
    return 0;
}

/* What `kvrepro show` prints before the table (cmd_report.c). */
static void print_root(const KvReport *rep, const char *path) {
    fprintf(g_null, "report %s: kvrepro %s (commit %s), host %s\n", path, rep->tool_version,
            rep->git_commit, rep->host);
    fprintf(g_null, "device: %s; math: %s; shard %s\n", rep->device, rep->math_mode, rep->shard);
    fprintf(g_null, "seeds: weights %" PRIu64 ", prompts %" PRIu64 "; model fnv1a64 0x%016" PRIx64 "\n",
            rep->weight_seed, rep->prompt_seed, rep->model_hash);
    for (int64_t t = 0; t < rep->n_tolerances; t++) {
        fprintf(g_null, "tolerance %s = %g (%s)\n", rep->tolerances[t].name,
                rep->tolerances[t].value, rep->tolerances[t].reason);
    }
}

#define TERMINATED(s) (memchr((s), '\0', sizeof(s)) != NULL)

static void check_report(const KvReport *rep) {
    KV_FUZZ_CHECK(TERMINATED(rep->tool_version) && TERMINATED(rep->git_commit) &&
                      TERMINATED(rep->host) && TERMINATED(rep->device) &&
                      TERMINATED(rep->math_mode) && TERMINATED(rep->shard),
                  "a root string is not terminated");
    KV_FUZZ_CHECK(rep->n_tolerances >= 0 && rep->n_runs >= 0 && rep->n_comparisons >= 0,
                  "a negative count");
    KV_FUZZ_CHECK((rep->n_tolerances == 0 || rep->tolerances != NULL) &&
                      (rep->n_runs == 0 || rep->runs != NULL) &&
                      (rep->n_comparisons == 0 || rep->comparisons != NULL),
                  "a count without its array");
    for (int64_t t = 0; t < rep->n_tolerances; t++) {
        KV_FUZZ_CHECK(TERMINATED(rep->tolerances[t].name) && TERMINATED(rep->tolerances[t].reason),
                      "tolerances[%" PRId64 "]: a string is not terminated", t);
    }
    for (int64_t i = 0; i < rep->n_runs; i++) {
        const KvRun *r = &rep->runs[i];
        KV_FUZZ_CHECK(TERMINATED(r->model) && TERMINATED(r->scenario) && TERMINATED(r->variant) &&
                          TERMINATED(r->fault) && TERMINATED(r->backend) && TERMINATED(r->mode) &&
                          TERMINATED(r->skip_reason),
                      "runs[%" PRId64 "]: a string is not terminated", i);
        KV_FUZZ_CHECK(r->steps >= 0 && r->batch >= 0 && r->vocab >= 0 && r->prompt_len >= 0 &&
                          r->n_probes >= 0 && r->prefill_chunk >= 0,
                      "runs[%" PRId64 "]: a negative size", i);
        KV_FUZZ_CHECK(r->topk >= 0 && r->topk <= r->vocab,
                      "runs[%" PRId64 "]: topk %" PRId32 " outside 0..vocab (%" PRId64 ")", i,
                      r->topk, r->vocab);
        if (r->skipped) continue;
        bool any = r->steps > 0 && r->batch > 0;
        KV_FUZZ_CHECK(!any || (r->tokens != NULL && r->logits_hash != NULL && r->margins != NULL),
                      "runs[%" PRId64 "]: a run that ran lacks its arrays", i);
        KV_FUZZ_CHECK(!any || r->vocab == 0 || (r->topk > 0 ? r->topk_ids != NULL : r->logits != NULL),
                      "runs[%" PRId64 "]: no logits", i);
        for (int64_t p = 0; p < r->n_probes; p++) {
            KV_FUZZ_CHECK(r->probe_names != NULL && TERMINATED(r->probe_names[p]),
                          "runs[%" PRId64 "].probe_names[%" PRId64 "] is not terminated", i, p);
        }
    }
    for (int64_t k = 0; k < rep->n_comparisons; k++) {
        const KvComparison *c = &rep->comparisons[k];
        KV_FUZZ_CHECK(TERMINATED(c->message), "comparisons[%" PRId64 "]: message", k);
        KV_FUZZ_CHECK(c->run_a >= 0 && c->run_a < rep->n_runs && c->run_b >= 0 &&
                          c->run_b < rep->n_runs,
                      "comparisons[%" PRId64 "] names runs %" PRId64 " and %" PRId64 " of %" PRId64,
                      k, c->run_a, c->run_b, rep->n_runs);
    }
}

/* HDF5 1.10 cannot count dataspace or datatype identifiers from outside
 * (H5Inmembers refuses library types); what it can count is every object
 * still open in any file: none may be, once the reader has returned. */
static void check_ids(const char *when) {
    ssize_t open_objs = H5Fget_obj_count((hid_t)H5F_OBJ_ALL, H5F_OBJ_ALL);
    KV_FUZZ_CHECK(open_objs == 0, "%s: %zd HDF5 files or objects left open", when, open_objs);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    kv_fuzz_write_file(g_input, data, size);
    KvReport rep;
    KvError err = {{0}};
    KvStatus st = kv_report_read_h5(g_input, &rep, &err);
    kv_fuzz_check_status(st, &err, "kv_report_read_h5");
    check_ids("after kv_report_read_h5");
    if (st != KV_OK) {
        KV_FUZZ_CHECK(kv_fuzz_all_zero(&rep, sizeof rep), "a failed read left *out set");
        return 0;
    }
    check_report(&rep);
    print_root(&rep, g_input);
    KV_FUZZ_CHECK(kv_report_print_summary(&rep, g_null) == KV_OK, "kv_report_print_summary failed");

    KvReport back;
    st = kv_report_write_h5(&rep, g_copy, &err);
    KV_FUZZ_CHECK(st == KV_OK, "a report that reads cannot be written back: %s", err.msg);
    st = kv_report_read_h5(g_copy, &back, &err);
    KV_FUZZ_CHECK(st == KV_OK, "a rewritten report does not read: %s", err.msg);
    char why[160];
    KV_FUZZ_CHECK(kv_fuzz_report_equal(&rep, &back, why, sizeof why),
                  "a rewritten report reads back different: %s", why);
    kv_report_free(&back);
    kv_report_free(&rep);
    check_ids("after the round trip");
    return 0;
}
