/* test_gate_bytes.c: the matrix gate's report keeps its bytes.
 *
 * Optional run attributes written only when set (engine, recompiles,
 * graph_budget; docs/SCHEMA.md) and new comparison kinds must leave every
 * report of the normal gate byte for byte as it was, unless the gate itself
 * was changed to record or judge more. The hashes below were first taken
 * from reports written by the kvrepro binary of commit 732c781 (before
 * `gate --external` existed), with the same gates as here. They were taken
 * again when the gate began to judge its own graph-mode runs against their
 * variant's graph budget: each graph-mode run now carries the
 * graph_budget attribute and one comparison of kind 7, and h5dump of the
 * reports of both binaries differs in exactly those (and nothing else).
 * And again when reference comparisons began to state the least passing
 * tolerances in their messages and the root max_rel_err its reason: the
 * sizes stayed the same to the byte (messages are fixed-width), only
 * those texts changed. These gates run with --no-calibrate, so the run list
 * is what it was; the calibration ensemble is checked by cli tests. They
 * run with --no-goldens: the transformers goldens add units of
 * their own, and these pins show that nothing else about the report moved.
 * Taken again when the gate began to judge the reference's left-padded
 * batches row by row (comparison kind 12 row_alone): the two
 * --prompts gates (a left-padded batch of rows of different lengths) grew by
 * exactly one comparison row (608 bytes), kind 12 on run 0, and nothing
 * else; the fault gate (one row) kept its bytes.
 * Taken again when the reference runs and the runs that failed a tolerance
 * or finite comparison began to keep their full logits above
 * --full-logits-max-vocab and in planted-fault passes (kv_gate_trim_logits):
 * on the fault and full_logits_max_vocab gates those runs store `logits`
 * instead of `topk_ids`/`topk_values` (h5dump -H), nothing else moved.
 * Taken again when the probe hash became two-level (probe.h, so a GPU
 * hashes slices in parallel): h5dump of the fault gate's reports from both
 * binaries differs in the probe_hash datasets alone (and the commit
 * attribute), every size the same.
 * Three root attributes depend on where and from which commit the gate runs
 * (host, git_commit, device); each report is therefore read back, those
 * three set to fixed text and written again, by the reader and writer of
 * the binary the hashes were taken with and by the current ones here. The
 * rest (every run, dataset, link, comparison and summary row) is what the
 * gate wrote.
 *
 * The gates: a --prompts batch on mistral-tiny with two variants, both
 * modes, two repeats and the replay check (hard-linked logits, repeat,
 * graph and variant comparisons); a planted fault on gemma2-tiny (top-k
 * storage, failing comparisons); --full-logits-max-vocab on the dynamic
 * variant with a --tol override. The bytes are HDF5 1.10.8's (Debian's
 * libhdf5 1.10.8, what scripts/ensure-deps.sh installs): another library
 * version may lay out the same objects differently, so the test is skipped
 * (exit 77) there, saying so. */
#include <check.h>
#include <hdf5.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "prng.h"
#include "report.h"
#include "report_h5.h"
#include "tool_run.h"

/* The library the hashes were taken with. */
#define BYTES_H5_MAJOR 1
#define BYTES_H5_MINOR 10
#define BYTES_H5_RELEASE 8

typedef struct {
    const char *name;
    const char *args[24]; /* after "gate", NULL-terminated; "@P" is the prompts file */
    int exit_code;
    long bytes;           /* of the normalised report */
    uint64_t fnv;         /* FNV-1a 64 of its bytes */
} GateCase;

static const GateCase k_cases[] = {
    {"prompts_two_variants",
     {"--fixture", "mistral-tiny", "--prompts", "@P", "--max-new-tokens", "10", "--backends", "cpu",
      "--variants", "ring,cat_shift", "--repeats", "2", "--no-calibrate", "--no-goldens", NULL},
     0, 172476, 0xfd61a9e319364e69ULL},
    {"fault_topk",
     {"--fixture", "gemma2-tiny", "--scenarios", "prompt_w_plus_1", "--variants", "ring",
      "--repeats", "1", "--fault", "window_off_by_one", "--max-new-tokens", "8", "--backends",
      "cpu", "--no-calibrate", "--no-goldens", NULL},
     1, 75945, 0x8aa28d8d8749030bULL},
    {"full_logits_max_vocab",
     {"--fixture", "mistral-tiny", "--prompts", "@P", "--max-new-tokens", "6", "--backends", "cpu",
      "--variants", "dynamic", "--repeats", "1", "--full-logits-max-vocab", "100", "--tol",
      "max_rel_err=0.001", "--no-calibrate", "--no-goldens", NULL},
     0, 83495, 0xd219d465b3cdec9fULL},
};

static char dir[256];
static char out[1 << 16];

/* The report at path with host, git_commit and device set to fixed text,
 * written to norm; its size and FNV-1a 64 into *bytes and *fnv. */
static void normalise(const char *path, const char *norm, long *bytes, uint64_t *fnv) {
    KvReport rep;
    KvError err = {{0}};
    ck_assert_msg(kv_report_read_h5(path, &rep, &err) == KV_OK, "%s", err.msg);
    snprintf(rep.host, sizeof rep.host, "host");
    snprintf(rep.git_commit, sizeof rep.git_commit, "commit");
    snprintf(rep.device, sizeof rep.device, "device");
    ck_assert_msg(kv_report_write_h5(&rep, norm, &err) == KV_OK, "%s", err.msg);
    kv_report_free(&rep);
    FILE *f = fopen(norm, "rb");
    ck_assert_ptr_nonnull(f);
    ck_assert_int_eq(fseek(f, 0, SEEK_END), 0);
    *bytes = ftell(f);
    rewind(f);
    unsigned char *buf = malloc((size_t)*bytes);
    ck_assert_ptr_nonnull(buf);
    ck_assert_int_eq(fread(buf, 1, (size_t)*bytes, f), (size_t)*bytes);
    fclose(f);
    *fnv = kv_fnv1a(KV_FNV_OFFSET, buf, (size_t)*bytes);
    free(buf);
}

START_TEST(test_gate_report_bytes_unchanged) {
    const GateCase *gc = &k_cases[_i];
    char prompts[320], report[320], norm[320], log[320];
    snprintf(prompts, sizeof prompts, "%s/prompts.json", dir);
    snprintf(report, sizeof report, "%s/%s.h5", dir, gc->name);
    snprintf(norm, sizeof norm, "%s/%s.norm.h5", dir, gc->name);
    snprintf(log, sizeof log, "%s/%s.log", dir, gc->name);
    FILE *f = fopen(prompts, "w");
    ck_assert_ptr_nonnull(f);
    fputs("[[5,17,42,7,99,3],[11,12,13]]\n", f);
    fclose(f);
    const char *argv[40];
    int n = 0;
    argv[n++] = KVREPRO;
    argv[n++] = "gate";
    for (int k = 0; gc->args[k] != NULL; k++) {
        argv[n++] = strcmp(gc->args[k], "@P") == 0 ? prompts : gc->args[k];
    }
    argv[n++] = "--report";
    argv[n++] = report;
    argv[n++] = "--quiet";
    argv[n] = NULL;
    const int rc = kv_tool_run(argv, log, out, sizeof out);
    ck_assert_msg(rc == gc->exit_code, "%s: gate exit %d, expected %d:\n%s", gc->name, rc,
                  gc->exit_code, out);
    long bytes = 0;
    uint64_t fnv = 0;
    normalise(report, norm, &bytes, &fnv);
    ck_assert_msg(bytes == gc->bytes && fnv == gc->fnv,
                  "%s: the normal gate's report changed: %ld bytes, fnv1a64 %016llx; before "
                  "(the pinned report): %ld bytes, %016llx",
                  gc->name, bytes, (unsigned long long)fnv, gc->bytes,
                  (unsigned long long)gc->fnv);
}
END_TEST

static void bytes_setup(void) {
    snprintf(dir, sizeof dir, "/tmp/kv_gate_bytes_XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(dir));
}

static void bytes_teardown(void) {
    char cmd[320];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "test_gate_bytes: could not remove %s\n", dir);
}

int main(void) {
    unsigned maj = 0, min = 0, rel = 0;
    if (H5get_libversion(&maj, &min, &rel) < 0 || maj != BYTES_H5_MAJOR ||
        min != BYTES_H5_MINOR || rel != BYTES_H5_RELEASE) {
        printf("test_gate_bytes: SKIPPED: the hashes were taken with HDF5 %d.%d.%d, this is "
               "%u.%u.%u, which may lay out the same report differently\n",
               BYTES_H5_MAJOR, BYTES_H5_MINOR, BYTES_H5_RELEASE, maj, min, rel);
        return 77;
    }
    Suite *s = suite_create("gate_bytes");
    TCase *tc = tcase_create("gate_bytes");
    tcase_add_checked_fixture(tc, bytes_setup, bytes_teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_loop_test(tc, test_gate_report_bytes_unchanged, 0,
                        (int)(sizeof k_cases / sizeof k_cases[0]));
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    const int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
