/* test_cuda_ops.c: the per-op validation of the CUDA backend
 * (candidates/cuda/cuda_validate.h), llm.c's dev/cuda pattern: every
 * launcher against its CPU op before anything decodes on the GPU.
 *
 * Two parts:
 *   no-device: always runs. The program re-executes itself with
 *     CUDA_VISIBLE_DEVICES="" and the child requires kv_cuda_validate_ops
 *     to return KV_SKIP for both fixture families with a reason naming the
 *     CUDA call that failed (cudaGetDeviceCount; "without CUDA" in a build
 *     without nvcc), no op recorded and no op line printed.
 *   device: kv_cuda_query first; on KV_SKIP prints "SKIPPED" with the reason
 *     and exits 77 (ctest's SKIP_RETURN_CODE). With a GPU, on the tiny
 *     fixtures of both families:
 *       - every op passes, and every op the backend has is in the report:
 *         positions, embed, both RMSNorm forms, gemm, RoPE, store, gather
 *         and attention on the static layout (sliding and full layers), softcap,
 *         both GLU activations, add, argmax, and per cache variant its
 *         updates, gathers and attention;
 *       - a second validation with the same seed gives the same report,
 *         error statistics included ("Nondeterminism!" otherwise);
 *       - planted faults with a deterministic effect on one op make that op
 *         fail and the call return KV_ERR_INTERNAL naming it: the in-place
 *         shift (cat_shift's and roll's updates), a prefill storing its first
 *         W rows (index_copy's update), the window off by one (the static
 *         sliding gather) and empty slots gathered (ring's gather).
 * Usage: test_cuda_ops [--no-device-only | --device-only]; the default runs
 * both. Exit 0 pass, 1 failure, 77 skipped.
 * Check runs with CK_NOFORK: CUDA cannot be used in a child forked after the
 * parent initialised it, and the fixtures are shared by the tests. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache.h"
#include "cache_registry.h"
#include "cuda_device.h"
#include "cuda_validate.h"
#include "fault.h"
#include "fixture.h"
#include "no_device.h"

#define TEST_SEED KV_FIXTURE_DEFAULT_SEED
/* The inputs' seed, printed with every report. */
#define TEST_INPUT_SEED 11ULL

#ifndef KV_HAVE_CUDA
#define KV_HAVE_CUDA 0
#endif

static const char *const k_families[] = {"gemma2-tiny", "mistral-tiny"};
#define N_FAMILIES 2

/* Fixtures, loaded once per process (CK_NOFORK: the tests share them). */
static KvFixtureModel g_models[N_FAMILIES];
static int g_loaded[N_FAMILIES];

static const KvModel *model_for(int fam) {
    if (!g_loaded[fam]) {
        KvError err = {{0}};
        KvStatus st = kv_fixture_load(k_families[fam], TEST_SEED, &g_models[fam], &err);
        ck_assert_msg(st == KV_OK, "kv_fixture_load(%s, seed %llu): %s", k_families[fam],
                      (unsigned long long)TEST_SEED, err.msg);
        g_loaded[fam] = 1;
    }
    return &g_models[fam].model;
}

static void free_models(void) {
    for (int f = 0; f < N_FAMILIES; f++) {
        if (g_loaded[f]) kv_fixture_free(&g_models[f]);
        g_loaded[f] = 0;
    }
}

/* ---- no device ---- */

/* loop index: family */
START_TEST(test_no_device_skips) {
    const KvModel *m = model_for(_i);
    KvCudaValidateReport *rep = malloc(sizeof *rep);
    KvError err = {{0}};
    char *text = NULL;
    size_t text_len = 0;
    ck_assert_ptr_nonnull(rep);
    memset(rep, 0xAB, sizeof *rep);
    FILE *log = open_memstream(&text, &text_len);
    ck_assert_ptr_nonnull(log);
    KvStatus st = kv_cuda_validate_ops(m, TEST_INPUT_SEED, 0, log, rep, &err);
    fclose(log);
    printf("cuda_ops: no device: %s -> %d: %s\n", k_families[_i], (int)st, err.msg);
    ck_assert_msg(st == KV_SKIP,
                  "%s: with no visible device kv_cuda_validate_ops must return KV_SKIP (77), got "
                  "%d (with a device it means CUDA_VISIBLE_DEVICES=\"\" did not hide it): %s",
                  k_families[_i], (int)st, err.msg);
    if (KV_HAVE_CUDA) {
        ck_assert_msg(strstr(err.msg, "cudaGetDeviceCount") != NULL,
                      "%s: the skip reason must name the CUDA call (cudaGetDeviceCount): '%s'",
                      k_families[_i], err.msg);
    } else {
        ck_assert_msg(strstr(err.msg, "without CUDA") != NULL,
                      "%s: the skip reason must say CUDA was not built in: '%s'", k_families[_i],
                      err.msg);
    }
    ck_assert_msg(rep->n_ops == 0 && rep->n_failed == 0 && rep->device[0] == '\0',
                  "%s: a skipped validation must record no op (n_ops %d)", k_families[_i],
                  rep->n_ops);
    ck_assert_msg(rep->seed == TEST_INPUT_SEED, "the report must keep its seed");
    ck_assert_msg(text == NULL || strstr(text, "PASS") == NULL,
                  "%s: a skipped validation printed an op as passed:\n%s", k_families[_i], text);
    /* out and err may be NULL. */
    ck_assert_int_eq(kv_cuda_validate_ops(m, TEST_INPUT_SEED, 0, NULL, NULL, NULL), KV_SKIP);
    free(text);
    free(rep);
}
END_TEST

static Suite *no_device_suite(void) {
    Suite *s = suite_create("cuda_ops_no_device");
    TCase *tc = tcase_create("skips");
    tcase_add_loop_test(tc, test_no_device_skips, 0, N_FAMILIES);
    suite_add_tcase(s, tc);
    return s;
}

/* ---- device ---- */

/* The op names the report of family fam must hold. */
static int expected_ops(int fam, const KvModel *m, char names[][48], int cap) {
    static const char *const k_common[] = {"positions", "embed", "rmsnorm[gemma2]",
                                           "rmsnorm[mistral]", "gemm", "rope", "softcap",
                                           "glu[gelu_tanh]", "glu[silu]", "add", "argmax"};
    int n = 0, count = 0;
    const KvCacheOps *const *all = kv_cache_all(&count);
    for (size_t i = 0; i < sizeof k_common / sizeof k_common[0] && n < cap; i++) {
        snprintf(names[n++], 48, "%s", k_common[i]);
    }
    snprintf(names[n++], 48, "store[static W=%lld]", (long long)m->config.sliding_window);
    snprintf(names[n++], 48, "gather[static W=%lld]", (long long)m->config.sliding_window);
    snprintf(names[n++], 48, "attention[static W=%lld]", (long long)m->config.sliding_window);
    if (fam == 0) { /* gemma2 is hybrid: full-attention layers too */
        snprintf(names[n++], 48, "store[static full]");
        snprintf(names[n++], 48, "gather[static full]");
        snprintf(names[n++], 48, "attention[static full]");
    }
    for (int v = 0; v < count && n + 3 <= cap; v++) {
        snprintf(names[n++], 48, "cache_update[%s]", all[v]->name);
        snprintf(names[n++], 48, "gather[%s]", all[v]->name);
        snprintf(names[n++], 48, "attention[%s]", all[v]->name);
    }
    return n;
}

/* loop index: family */
START_TEST(test_every_op_passes) {
    const KvModel *m = model_for(_i);
    KvCudaValidateReport *a = malloc(sizeof *a), *b = malloc(sizeof *b);
    char names[64][48];
    KvError err = {{0}};
    ck_assert_ptr_nonnull(a);
    ck_assert_ptr_nonnull(b);
    printf("cuda_ops: %s, input seed %llu\n", k_families[_i], (unsigned long long)TEST_INPUT_SEED);
    KvStatus st = kv_cuda_validate_ops(m, TEST_INPUT_SEED, 0, stdout, a, &err);
    ck_assert_msg(st == KV_OK, "%s (seed %llu): validation returned %d: %s", k_families[_i],
                  (unsigned long long)TEST_INPUT_SEED, (int)st, err.msg);
    ck_assert_int_eq(a->n_failed, 0);
    const int n = expected_ops(_i, m, names, 64);
    ck_assert_int_eq(a->n_ops, n);
    for (int i = 0; i < n; i++) {
        const KvCudaValidateOp *op = kv_cuda_validate_find(a, names[i]);
        ck_assert_msg(op != NULL, "%s: op %s is not in the report", k_families[_i], names[i]);
        ck_assert_msg(op->passed, "%s: %s failed: %s", k_families[_i], names[i], op->failure);
        ck_assert_msg(op->compared > 0, "%s: %s compared nothing", k_families[_i], names[i]);
        ck_assert_msg(op->bitwise || op->worst_ratio <= 1.0,
                      "%s: %s passed with an error %.3g times its bound", k_families[_i], names[i],
                      op->worst_ratio);
    }
    /* The same seed again: the same report, to the last bit of every error. */
    st = kv_cuda_validate_ops(m, TEST_INPUT_SEED, 0, NULL, b, &err);
    ck_assert_msg(st == KV_OK, "%s: second validation returned %d: %s", k_families[_i], (int)st,
                  err.msg);
    ck_assert_int_eq(b->n_ops, a->n_ops);
    for (int i = 0; i < a->n_ops; i++) {
        const KvCudaValidateOp *x = &a->ops[i], *y = &b->ops[i];
        ck_assert_str_eq(x->op, y->op);
        ck_assert_msg(x->compared == y->compared && memcmp(&x->max_abs_err, &y->max_abs_err,
                                                           sizeof x->max_abs_err) == 0 &&
                          memcmp(&x->max_rel_err, &y->max_rel_err, sizeof x->max_rel_err) == 0,
                      "Nondeterminism! %s: %s: max_abs %.9g then %.9g, max_rel %.9g then %.9g "
                      "with the same seed %llu",
                      k_families[_i], x->op, x->max_abs_err, y->max_abs_err, x->max_rel_err,
                      y->max_rel_err, (unsigned long long)TEST_INPUT_SEED);
    }
    free(a);
    free(b);
}
END_TEST

/* A planted fault and the ops it must fail. */
typedef struct {
    unsigned fault;
    const char *ops[2]; /* NULL-terminated; "gather[static W]" means the sliding layer's */
} FaultCase;

static const FaultCase k_fault_cases[] = {
    {KV_FAULT_INPLACE_SHIFT, {"cache_update[cat_shift]", "cache_update[roll]"}},
    {KV_FAULT_PREFILL_FIRST_W, {"cache_update[index_copy]", NULL}},
    {KV_FAULT_WINDOW_OFF_BY_ONE, {"gather[static W]", NULL}},
    {KV_FAULT_UNWRITTEN_SLOT, {"gather[ring]", NULL}},
};
#define N_FAULT_CASES ((int)(sizeof k_fault_cases / sizeof k_fault_cases[0]))

/* loop index: fault case (on gemma2-tiny) */
START_TEST(test_planted_fault_caught) {
    const KvModel *m = model_for(0);
    const FaultCase *fc = &k_fault_cases[_i];
    KvCudaValidateReport *rep = malloc(sizeof *rep);
    KvError err = {{0}};
    ck_assert_ptr_nonnull(rep);
    KvStatus st = kv_cuda_validate_ops(m, TEST_INPUT_SEED, fc->fault, NULL, rep, &err);
    printf("cuda_ops: fault 0x%x -> %d (%d of %d ops failed): %s\n", fc->fault, (int)st,
           rep->n_failed, rep->n_ops, err.msg);
    ck_assert_msg(st == KV_ERR_INTERNAL, "fault 0x%x: the validation must fail, got %d: %s",
                  fc->fault, (int)st, err.msg);
    for (int k = 0; k < 2 && fc->ops[k] != NULL; k++) {
        char name[48];
        if (strcmp(fc->ops[k], "gather[static W]") == 0) {
            snprintf(name, sizeof name, "gather[static W=%lld]", (long long)m->config.sliding_window);
        } else {
            snprintf(name, sizeof name, "%s", fc->ops[k]);
        }
        const KvCudaValidateOp *op = kv_cuda_validate_find(rep, name);
        ck_assert_msg(op != NULL, "fault 0x%x: op %s missing from the report", fc->fault, name);
        ck_assert_msg(!op->passed, "fault 0x%x: %s passed; the validation cannot see this fault",
                      fc->fault, name);
        printf("cuda_ops: fault 0x%x caught by %s: %s\n", fc->fault, name, op->failure);
    }
    free(rep);
}
END_TEST

static Suite *device_suite(void) {
    Suite *s = suite_create("cuda_ops");
    TCase *tc = tcase_create("validate");
    tcase_set_timeout(tc, 600);
    tcase_add_loop_test(tc, test_every_op_passes, 0, N_FAMILIES);
    tcase_add_loop_test(tc, test_planted_fault_caught, 0, N_FAULT_CASES);
    suite_add_tcase(s, tc);
    return s;
}

static int run_suite(Suite *s) {
    SRunner *sr = srunner_create(s);
    srunner_set_fork_status(sr, CK_NOFORK);
    srunner_run_all(sr, CK_NORMAL);
    const int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed;
}

static int run_no_device(void) { return run_suite(no_device_suite()); }
static int run_device(void) { return run_suite(device_suite()); }

int main(int argc, char **argv) {
    static const KvCudaTest test = {"cuda_ops", "(the validation skipped with a reason)", run_no_device, run_device, free_models};
    return kv_test_cuda_main(argc, argv, &test);
}
