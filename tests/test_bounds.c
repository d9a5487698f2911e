/* test_bounds.c: the limits table the report writer, its reader and the
 * gate share (reports/kv_limits.h), and the prompts file
 * (harness/prompts.c):
 *   - kv_limits_check_scenario takes the table's largest sizes and refuses
 *     one more of each, naming the source and the field;
 *   - kv_limits_check_report refuses a matrix whose report its reader could
 *     not hold (a million steps of full logits in 73 runs);
 *   - kv_limits_read_budget: the floor, 1032 bytes per byte of file, the cap;
 *   - a prompts file is one JSON value: content after the array is refused
 *     (whitespace is not), naming the file;
 *   - a prompts file of more rows or a longer row than the table allows, or
 *     a decode longer than it, is refused before any row is copied;
 *   - `kvrepro gate --prompts` with such a file exits 2 naming the file,
 *     before any work and without writing its report. */
#include <check.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kv_limits.h"
#include "prompts.h"
#include "tool_run.h"

static char g_dir[256];

static void setup(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/kv_bounds_XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(g_dir));
}

static void teardown(void) {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd) != 0) fprintf(stderr, "test_bounds: could not remove %s\n", g_dir);
}

/* Writes text (n bytes) to g_dir/name; the path in one of 4 static slots. */
static const char *write_file(const char *name, const char *text, size_t n) {
    static char paths[4][300];
    static int slot = 0;
    char *p = paths[slot++ % 4];
    snprintf(p, 300, "%s/%s", g_dir, name);
    FILE *f = fopen(p, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert(fwrite(text, 1, n, f) == n);
    ck_assert(fclose(f) == 0);
    return p;
}

static const char *write_text(const char *name, const char *text) {
    return write_file(name, text, strlen(text));
}

/* kv_prompts_load on path: the status, the message in err. */
static KvStatus load(const char *path, int64_t new_tokens, KvScenario *sc, KvError *err) {
    memset(sc, 0, sizeof *sc);
    memset(err, 0, sizeof *err);
    return kv_prompts_load(path, new_tokens, sc, err);
}

static void expect_refused(const char *path, int64_t new_tokens, const char *part) {
    KvScenario sc;
    KvError err;
    const KvStatus st = load(path, new_tokens, &sc, &err);
    ck_assert_msg(st == KV_ERR_INPUT, "%s: expected KV_ERR_INPUT, found %d (%s)", path, st,
                  err.msg);
    ck_assert_msg(strncmp(err.msg, path, strlen(path)) == 0, "message lacks the path: %s",
                  err.msg);
    ck_assert_msg(strstr(err.msg, part) != NULL, "message lacks \"%s\": %s", part, err.msg);
    kv_scenario_free(&sc);
}

START_TEST(test_check_scenario) {
    KvError err = {{0}};
    ck_assert_int_eq(kv_limits_check_scenario(KV_REPORT_MAX_BATCH, KV_REPORT_MAX_PROMPT_LEN,
                                              KV_REPORT_MAX_STEPS, "x", &err),
                     KV_OK);
    ck_assert_int_eq(kv_limits_check_scenario(KV_REPORT_MAX_BATCH + 1, 1, 1, "p.json", &err),
                     KV_ERR_INPUT);
    ck_assert_str_eq(err.msg, "p.json: prompt rows: expected 1..4096 (KV_REPORT_MAX_BATCH, a "
                              "run's batch; kv_limits.h), found 4097");
    ck_assert_int_eq(kv_limits_check_scenario(1, KV_REPORT_MAX_PROMPT_LEN + 1, 1, "p.json", &err),
                     KV_ERR_INPUT);
    ck_assert_ptr_nonnull(strstr(err.msg, "prompt length: expected 1..1048576"));
    ck_assert_int_eq(kv_limits_check_scenario(1, 1, KV_REPORT_MAX_STEPS + 1, "--max-new-tokens",
                                              &err),
                     KV_ERR_INPUT);
    ck_assert_ptr_nonnull(strstr(err.msg, "--max-new-tokens: new tokens: expected 1..1048576"));
    ck_assert_int_eq(kv_limits_check_scenario(1, 0, 1, NULL, &err), KV_ERR_INPUT);
    ck_assert_ptr_nonnull(strstr(err.msg, "the scenario: prompt length: expected 1.."));
}
END_TEST

/* `--max-new-tokens 1048576` ended in exit 3: the matrix's runs of a
 * million steps of full logits are tens of GiB, which the gate held until
 * malloc failed. The table says so up front. */
START_TEST(test_check_report) {
    KvError err = {{0}};
    /* a default-gate unit: 73 runs of a few hundred steps */
    ck_assert_msg(kv_limits_check_report(73, 256, 2, 256, 0, 40, 64, "gate", &err) == KV_OK,
                  "%s", err.msg);
    ck_assert_int_eq(kv_limits_check_report(73, KV_REPORT_MAX_STEPS, 1, 256, 0, 40, 2,
                                            "--max-new-tokens", &err),
                     KV_ERR_INPUT);
    ck_assert_msg(strstr(err.msg, "--max-new-tokens: a report of 73 runs of 1048576 steps x 1 "
                                  "rows x 256 logits needs ~") != NULL &&
                      strstr(err.msg, "above the 16 GiB its reader takes") != NULL,
                  "%s", err.msg);
    /* top-k keeps it small: 16 a row */
    ck_assert_msg(kv_limits_check_report(73, 4096, 1, 262144, 16, 40, 2, "gate", &err) == KV_OK,
                  "%s", err.msg);
    ck_assert_int_eq(kv_limits_check_report(1, 1, KV_REPORT_MAX_BATCH + 1, 4, 0, 1, 1, "gate",
                                            &err),
                     KV_ERR_INPUT);
    ck_assert_ptr_nonnull(strstr(err.msg, "prompt rows: expected 1..4096"));
    ck_assert_int_eq(kv_limits_check_report(1, 1, 1, 4, 5, 1, 1, "gate", &err), KV_ERR_INPUT);
}
END_TEST

START_TEST(test_read_budget) {
    ck_assert_uint_eq(kv_limits_read_budget(0), KV_REPORT_READ_FLOOR_BYTES);
    ck_assert_uint_eq(kv_limits_read_budget(1000), KV_REPORT_READ_FLOOR_BYTES);
    ck_assert_uint_eq(kv_limits_read_budget(1 << 20), (uint64_t)1032 << 20);
    ck_assert_uint_eq(kv_limits_read_budget((uint64_t)1 << 40), KV_REPORT_MAX_READ_BYTES);
    ck_assert_uint_eq(kv_limits_read_budget(UINT64_MAX), KV_REPORT_MAX_READ_BYTES);
}
END_TEST

/* `[[1,2]] [[3,4,5]]` was read as one row: the second value was dropped. */
START_TEST(test_prompts_trailing_content_refused) {
    static const char *const bad[] = {"[[1,2]] [[3,4,5]]", "[[1,2]]]", "[[1,2]],", "[[1,2]] x",
                                      "[[1,2]]\n{}"};
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        const char *p = write_text("trail.json", bad[k]);
        expect_refused(p, 2, "expected the end of the file after the prompts array");
    }
    const char *nul = write_file("nul.json", "[[1,2]]\0[[3]]", 13);
    expect_refused(nul, 2, "byte 7: expected the end of the file");
    /* whitespace around the value is fine */
    const char *ok = write_text("ws.json", " \t[[1,2],[3,4,5]]\r\n \n");
    KvScenario sc;
    KvError err;
    ck_assert_msg(load(ok, 2, &sc, &err) == KV_OK, "%s", err.msg);
    ck_assert_int_eq(sc.batch, 2);
    ck_assert_int_eq(sc.prompt_len, 3);
    kv_scenario_free(&sc);
}
END_TEST

/* Text of a prompts file: rows rows of len tokens each (ids 1). */
static char *prompts_text(int64_t rows, int64_t len, size_t *n) {
    const size_t cap = (size_t)(rows * (2 * len + 3) + 3);
    char *t = malloc(cap);
    ck_assert_ptr_nonnull(t);
    size_t u = 0;
    t[u++] = '[';
    for (int64_t r = 0; r < rows; r++) {
        if (r > 0) t[u++] = ',';
        t[u++] = '[';
        for (int64_t i = 0; i < len; i++) {
            if (i > 0) t[u++] = ',';
            t[u++] = '1';
        }
        t[u++] = ']';
    }
    t[u++] = ']';
    ck_assert(u <= cap);
    *n = u;
    return t;
}

/* The gate took 4097 rows and a 2^20 + 1-token prompt that its reader then
 * refused in the report: now the file is refused, naming it. */
START_TEST(test_prompts_over_limits_refused) {
    size_t n;
    char *t = prompts_text(KV_REPORT_MAX_BATCH + 1, 1, &n);
    const char *rows = write_file("rows.json", t, n);
    free(t);
    expect_refused(rows, 1, "prompt rows: expected 1..4096");
    t = prompts_text(1, KV_REPORT_MAX_PROMPT_LEN + 1, &n);
    const char *len = write_file("len.json", t, n);
    free(t);
    expect_refused(len, 1, "prompt length: expected 1..1048576");
    const char *one = write_text("one.json", "[[1,2]]");
    expect_refused(one, KV_REPORT_MAX_STEPS + 1, "new tokens: expected 1..1048576");
    /* the largest batch is taken */
    t = prompts_text(KV_REPORT_MAX_BATCH, 1, &n);
    const char *most = write_file("most.json", t, n);
    free(t);
    KvScenario sc;
    KvError err;
    ck_assert_msg(load(most, 1, &sc, &err) == KV_OK, "%s", err.msg);
    ck_assert_int_eq(sc.batch, KV_REPORT_MAX_BATCH);
    kv_scenario_free(&sc);
}
END_TEST

/* The gate refuses them before any work: exit 2 naming the file, no report. */
START_TEST(test_gate_refuses_before_work) {
    size_t n;
    char *t = prompts_text(KV_REPORT_MAX_BATCH + 1, 2, &n);
    const char *rows = write_file("rows.json", t, n);
    free(t);
    const char *trail = write_text("trail.json", "[[1,2]] [[3,4,5]]");
    const char *const files[] = {rows, trail};
    const char *const want[] = {"prompt rows: expected 1..4096",
                                "expected the end of the file after the prompts array"};
    for (int k = 0; k < 2; k++) {
        char report[300], log[300], out[8192];
        snprintf(report, sizeof report, "%s/r.h5", g_dir);
        snprintf(log, sizeof log, "%s/gate.log", g_dir);
        const char *const argv[] = {KVREPRO, "gate", "--fixture", "mistral-tiny", "--prompts",
                                    files[k], "--max-new-tokens", "2", "--report", report,
                                    NULL};
        ck_assert_int_eq(kv_tool_run(argv, log, out, sizeof out), 2);
        ck_assert_msg(strstr(out, files[k]) != NULL && strstr(out, want[k]) != NULL, "%s", out);
        ck_assert_msg(strstr(out, "passed") == NULL, "work was done: %s", out);
        struct stat sb;
        ck_assert_msg(stat(report, &sb) != 0, "%s written", report);
    }
}
END_TEST

int main(void) {
    Suite *s = suite_create("bounds");
    TCase *tc = tcase_create("limits");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_check_scenario);
    tcase_add_test(tc, test_check_report);
    tcase_add_test(tc, test_read_budget);
    tcase_add_test(tc, test_prompts_trailing_content_refused);
    tcase_add_test(tc, test_prompts_over_limits_refused);
    tcase_add_test(tc, test_gate_refuses_before_work);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    const int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
