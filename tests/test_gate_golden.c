/* test_gate_golden.c: the gate judges the reference itself against
 * transformers' goldens (harness/golden.c), end to end.
 *
 * A reference bug moves every run alike, so no candidate comparison sees
 * it; from the gate's side a reference that disagrees with a golden is the
 * same as a golden that disagrees with the reference. Each test copies
 * fixtures/hf/mistral to a scratch directory, edits its golden.h5 with the
 * HDF5 API, and runs `kvrepro gate --fixture mistral-tiny --goldens DIR`:
 *   - the copy unedited passes, and the log says the reference was judged;
 *   - one logit moved by 0.05 fails `golden` at its step and row;
 *   - a token changed where transformers' margin is clear fails `golden`
 *     ("token flip above the tie margin");
 *   - a golden directory without the family is exit 2 naming the file, and
 *     --no-goldens runs without them and says so. */
#include <check.h>
#include <hdf5.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tool_run.h"

#define GOLDEN_SRC KV_SOURCE_DIR "/fixtures/hf/mistral"

static char dir[256];  /* scratch: dir/mistral is the copied family */
static char out[1 << 16];

static void setup(void) {
    snprintf(dir, sizeof dir, "/tmp/kv_gate_golden_XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(dir));
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "cp -r '%s' '%s/mistral'", GOLDEN_SRC, dir);
    ck_assert_int_eq(system(cmd), 0);
}

static void teardown(void) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "test_gate_golden: could not remove %s\n", dir);
}

/* The gate on one small unit of mistral-tiny with the goldens in dir (or
 * the extra arguments); its exit code, its output in `out`. */
static int gate(const char *extra) {
    char log[400];
    snprintf(log, sizeof log, "%s/gate.log", dir);
    const char *argv[20] = {KVREPRO, "gate", "--fixture", "mistral-tiny", "--scenarios",
                            "prompt_w", "--variants", "ring", "--repeats", "1",
                            "--max-new-tokens", "4", "--no-calibrate", "--backends", "cpu"};
    int n = 15;
    if (extra != NULL) {
        argv[n++] = extra;
    } else {
        argv[n++] = "--goldens";
        argv[n++] = dir;
    }
    argv[n] = NULL;
    const int rc = kv_tool_run(argv, log, out, sizeof out);
    ck_assert_msg(rc >= 0, "kvrepro did not exit normally:\n%s", out);
    return rc;
}

#define EXPECT_OUT(needle)                                                                         \
    ck_assert_msg(strstr(out, (needle)) != NULL, "expected '%s' in the output:\n%s", (needle), out)

/* Reads (op = 0) or writes (op = 1) one float32 or int32 element of
 * /scenarios/long/<name> in the copied golden at flat index i. */
static void golden_element(const char *name, hid_t type, int64_t i, void *value, int op) {
    char path[400];
    snprintf(path, sizeof path, "%s/mistral/golden.h5", dir);
    hid_t f = H5Fopen(path, op ? H5F_ACC_RDWR : H5F_ACC_RDONLY, H5P_DEFAULT);
    ck_assert_int_ge(f, 0);
    char ds[96];
    snprintf(ds, sizeof ds, "/scenarios/long/%s", name);
    hid_t d = H5Dopen2(f, ds, H5P_DEFAULT);
    ck_assert_int_ge(d, 0);
    hid_t fs = H5Dget_space(d);
    const int rank = H5Sget_simple_extent_ndims(fs);
    hsize_t dims[3] = {0, 0, 0}, at[3] = {0, 0, 0};
    H5Sget_simple_extent_dims(fs, dims, NULL);
    int64_t rest = i;
    for (int k = rank - 1; k >= 0; k--) {
        at[k] = (hsize_t)(rest % (int64_t)dims[k]);
        rest /= (int64_t)dims[k];
    }
    const hsize_t one = 1;
    ck_assert(H5Sselect_elements(fs, H5S_SELECT_SET, 1, at) >= 0);
    hid_t ms = H5Screate_simple(1, &one, NULL);
    if (op) ck_assert(H5Dwrite(d, type, ms, fs, H5P_DEFAULT, value) >= 0);
    else ck_assert(H5Dread(d, type, ms, fs, H5P_DEFAULT, value) >= 0);
    H5Sclose(ms);
    H5Sclose(fs);
    H5Dclose(d);
    H5Fclose(f);
}

START_TEST(test_unedited_golden_passes) {
    ck_assert_int_eq(gate(NULL), 0);
    EXPECT_OUT("reference judged by: transformers goldens (1 family)");
    EXPECT_OUT("/mistral: 7 comparisons, all agree"); /* 6 scenarios + row_alone */
}
END_TEST

/* step 3, row 0 of "long" (batch 1, vocab 256): logit id 7 moved by 0.05 */
START_TEST(test_moved_logit_fails_golden) {
    const int64_t step = 3, V = 256, i = step * V + 7;
    float v = 0.0f;
    golden_element("logits", H5T_NATIVE_FLOAT, i, &v, 0);
    v += 0.05f;
    golden_element("logits", H5T_NATIVE_FLOAT, i, &v, 1);
    ck_assert_int_eq(gate(NULL), 1);
    EXPECT_OUT("DISAGREES");
    EXPECT_OUT("FAIL hf/mistral long: transformers/torch-cpu/eager/r0 vs reference/cpu/eager/r0 "
               "golden: logits beyond max_rel_err at step 3 row 0");
}
END_TEST

/* A token at a clear margin changed: transformers "chose" another token
 * where the reference's choice is not a near-tie. */
START_TEST(test_flipped_token_fails_golden) {
    int64_t step = -1;
    for (int64_t s = 1; s < 40 && step < 0; s++) {
        float margin = 0.0f;
        golden_element("margins", H5T_NATIVE_FLOAT, s, &margin, 0);
        if (margin > 0.05f) step = s;
    }
    ck_assert_int_ge(step, 1);
    int32_t tok = 0;
    golden_element("tokens", H5T_NATIVE_INT32, step, &tok, 0);
    tok = (tok + 1) % 256;
    golden_element("tokens", H5T_NATIVE_INT32, step, &tok, 1);
    ck_assert_int_eq(gate(NULL), 1);
    char want[96];
    snprintf(want, sizeof want, "golden: token flip above the tie margin at step %lld row 0",
             (long long)step);
    EXPECT_OUT(want);
}
END_TEST

START_TEST(test_missing_golden_exit_2) {
    char path[400];
    snprintf(path, sizeof path, "%s/mistral/golden.h5", dir);
    ck_assert_int_eq(unlink(path), 0);
    ck_assert_int_eq(gate(NULL), 2);
    EXPECT_OUT("golden.h5: cannot open the transformers golden");
    ck_assert_int_eq(gate("--no-goldens"), 0);
    EXPECT_OUT("no transformers golden (--no-goldens)");
}
END_TEST

static Suite *golden_suite(void) {
    Suite *s = suite_create("gate_golden");
    TCase *tc = tcase_create("golden");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_unedited_golden_passes);
    tcase_add_test(tc, test_moved_logit_fails_golden);
    tcase_add_test(tc, test_flipped_token_fails_golden);
    tcase_add_test(tc, test_missing_golden_exit_2);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    SRunner *sr = srunner_create(golden_suite());
    srunner_run_all(sr, CK_NORMAL);
    const int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
