/* test_shard_env.c: `gate --shard auto` (harness/shard_env.h) on tables of
 * variables, never the process environment (setenv would race with Check's
 * forks and leak between tests): each source, their precedence, Slurm
 * arrays starting at 0, 1 and elsewhere, a count from MAX, every malformed
 * or out-of-range value, non-contiguous arrays, and none set. */
#include <check.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shard_env.h"

/* One environment: name/value pairs, ended by a NULL name. */
typedef struct {
    const char *name, *value;
} EnvVar;

static const char *env_lookup(const char *name, void *ctx) {
    for (const EnvVar *v = ctx; v->name != NULL; v++) {
        if (strcmp(v->name, name) == 0) return v->value;
    }
    return NULL;
}

/* A shard no resolver returns: an error must leave *out as it was. */
static const KvShard k_untouched = {-7, -7, "untouched"};

/* Resolves env and requires success with I/N from source. */
static void expect_shard(const EnvVar *env, int index, int count, const char *source) {
    KvShard s = k_untouched;
    KvError err = {{0}};
    const KvStatus st = kv_shard_from_env(env_lookup, (void *)env, &s, &err);
    ck_assert_msg(st == KV_OK, "expected shard %d/%d, got status %d: %s", index, count, st,
                  err.msg);
    ck_assert_int_eq(s.index, index);
    ck_assert_int_eq(s.count, count);
    if (source != NULL) ck_assert_str_eq(s.source, source);
}

/* Resolves env and requires KV_ERR_INPUT with a message containing each
 * of the NULL-terminated fragments, and *out untouched. */
static void expect_error(const EnvVar *env, ...) {
    KvShard s = k_untouched;
    KvError err = {{0}};
    const KvStatus st = kv_shard_from_env(env_lookup, (void *)env, &s, &err);
    ck_assert_msg(st == KV_ERR_INPUT, "expected an input error, got %d (shard %d/%d from %s)", st,
                  s.index, s.count, s.source);
    ck_assert_int_eq(s.index, k_untouched.index);
    ck_assert_int_eq(s.count, k_untouched.count);
    ck_assert_str_eq(s.source, k_untouched.source);
    va_list ap;
    va_start(ap, env);
    for (const char *frag = va_arg(ap, const char *); frag != NULL;
         frag = va_arg(ap, const char *)) {
        ck_assert_msg(strstr(err.msg, frag) != NULL, "message '%s' lacks '%s'", err.msg, frag);
    }
    va_end(ap);
}

START_TEST(parse_i_of_n) {
    int i = 0, n = 0;
    ck_assert(kv_shard_parse("1/3", &i, &n) && i == 1 && n == 3);
    ck_assert(kv_shard_parse("3/3", &i, &n) && i == 3 && n == 3);
    ck_assert(kv_shard_parse("1/1", &i, &n) && i == 1 && n == 1);
    ck_assert(kv_shard_parse("12/40", &i, &n) && i == 12 && n == 40);
    ck_assert(kv_shard_parse("2147483647/2147483647", &i, &n) && i == 2147483647);
    static const char *const bad[] = {
        "", "0/3", "4/3", "3", "/3", "1/", "1/0", "0/0", "+1/3", "-1/3", " 1/3", "1/3 ", "1 /3",
        "1/3x", "1/3/3", "a/b", "1//3", "0x1/3", "1.0/3", "2147483648/2147483648",
        "1/99999999999999999999", "auto",
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        i = n = -5;
        ck_assert_msg(!kv_shard_parse(bad[k], &i, &n), "'%s' was accepted", bad[k]);
        ck_assert_msg(i == -5 && n == -5, "'%s' changed the outputs on failure", bad[k]);
    }
}
END_TEST

START_TEST(explicit_variable) {
    const EnvVar env[] = {{"KVREPRO_SHARD", "2/4"}, {NULL, NULL}};
    expect_shard(env, 2, 4, "KVREPRO_SHARD=2/4");
    const EnvVar one[] = {{"KVREPRO_SHARD", "1/1"}, {NULL, NULL}};
    expect_shard(one, 1, 1, "KVREPRO_SHARD=1/1");
}
END_TEST

START_TEST(explicit_bad_values) {
    static const char *const bad[] = {"", "0/4", "5/4", "2", "auto", "2/4 ", "two/four", "-1/4"};
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        /* A bad explicit value is an error even with a valid scheduler
         * source present: falling through would run another job's units. */
        const EnvVar env[] = {{"KVREPRO_SHARD", bad[k]},  {"SLURM_ARRAY_TASK_ID", "0"},
                              {"SLURM_ARRAY_TASK_MIN", "0"}, {"SLURM_ARRAY_TASK_COUNT", "4"},
                              {"CI_NODE_INDEX", "1"},     {"CI_NODE_TOTAL", "4"},
                              {NULL, NULL}};
        char quoted[64];
        snprintf(quoted, sizeof quoted, "KVREPRO_SHARD='%s'", bad[k]);
        expect_error(env, quoted, "expected I/N", NULL);
    }
}
END_TEST

START_TEST(precedence) {
    /* KVREPRO_SHARD over Slurm over GitLab. */
    const EnvVar all[] = {{"CI_NODE_INDEX", "4"},         {"CI_NODE_TOTAL", "5"},
                          {"SLURM_ARRAY_TASK_ID", "2"},   {"SLURM_ARRAY_TASK_MIN", "0"},
                          {"SLURM_ARRAY_TASK_COUNT", "3"}, {"KVREPRO_SHARD", "1/2"},
                          {NULL, NULL}};
    expect_shard(all, 1, 2, "KVREPRO_SHARD=1/2");
    expect_shard(all, 1, 2, NULL);
    const EnvVar slurm_gitlab[] = {{"CI_NODE_INDEX", "4"},          {"CI_NODE_TOTAL", "5"},
                                   {"SLURM_ARRAY_TASK_ID", "2"},    {"SLURM_ARRAY_TASK_MIN", "0"},
                                   {"SLURM_ARRAY_TASK_COUNT", "3"}, {NULL, NULL}};
    expect_shard(slurm_gitlab, 3, 3,
                 "SLURM_ARRAY_TASK_ID=2, SLURM_ARRAY_TASK_MIN=0, SLURM_ARRAY_TASK_COUNT=3");
    const EnvVar gitlab[] = {{"CI_NODE_INDEX", "4"}, {"CI_NODE_TOTAL", "5"}, {NULL, NULL}};
    expect_shard(gitlab, 4, 5, "CI_NODE_INDEX=4, CI_NODE_TOTAL=5");
}
END_TEST

/* Every task of a contiguous array, whatever its first id, gets its own
 * shard, and together they are 1..N: the property a merge relies on. */
START_TEST(slurm_every_task_once) {
    static const int mins[] = {0, 1, 7, 1000};
    for (size_t m = 0; m < sizeof mins / sizeof mins[0]; m++) {
        for (int n = 1; n <= 6; n++) {
            for (int use_max = 0; use_max < 2; use_max++) {
                for (int id = mins[m]; id < mins[m] + n; id++) {
                    char id_s[16], min_s[16], count_s[16], max_s[16], source[160];
                    snprintf(id_s, sizeof id_s, "%d", id);
                    snprintf(min_s, sizeof min_s, "%d", mins[m]);
                    snprintf(count_s, sizeof count_s, "%d", n);
                    snprintf(max_s, sizeof max_s, "%d", mins[m] + n - 1);
                    /* Slurm also sets STEP=1 and MAX with COUNT; without
                     * COUNT (older releases) the count comes from MAX. */
                    const EnvVar env[] = {{"SLURM_ARRAY_TASK_ID", id_s},
                                          {"SLURM_ARRAY_TASK_MIN", min_s},
                                          {"SLURM_ARRAY_TASK_MAX", max_s},
                                          {"SLURM_ARRAY_TASK_STEP", "1"},
                                          {use_max ? "NOT_SET" : "SLURM_ARRAY_TASK_COUNT", count_s},
                                          {NULL, NULL}};
                    snprintf(source, sizeof source,
                             "SLURM_ARRAY_TASK_ID=%s, SLURM_ARRAY_TASK_MIN=%s, %s=%s", id_s, min_s,
                             use_max ? "SLURM_ARRAY_TASK_MAX" : "SLURM_ARRAY_TASK_COUNT",
                             use_max ? max_s : count_s);
                    expect_shard(env, id - mins[m] + 1, n, source);
                }
            }
        }
    }
}
END_TEST

START_TEST(slurm_min_not_zero) {
    /* --array=1-4: task 1 is shard 1, not 2. */
    const EnvVar one[] = {{"SLURM_ARRAY_TASK_ID", "1"}, {"SLURM_ARRAY_TASK_MIN", "1"},
                          {"SLURM_ARRAY_TASK_COUNT", "4"}, {NULL, NULL}};
    expect_shard(one, 1, 4, NULL);
    /* --array=100-102 */
    const EnvVar hundred[] = {{"SLURM_ARRAY_TASK_ID", "102"}, {"SLURM_ARRAY_TASK_MIN", "100"},
                              {"SLURM_ARRAY_TASK_COUNT", "3"}, {NULL, NULL}};
    expect_shard(hundred, 3, 3, NULL);
}
END_TEST

START_TEST(slurm_count_from_max) {
    const EnvVar env[] = {{"SLURM_ARRAY_TASK_ID", "6"}, {"SLURM_ARRAY_TASK_MIN", "5"},
                          {"SLURM_ARRAY_TASK_MAX", "8"}, {NULL, NULL}};
    expect_shard(env, 2, 4, "SLURM_ARRAY_TASK_ID=6, SLURM_ARRAY_TASK_MIN=5, SLURM_ARRAY_TASK_MAX=8");
    const EnvVar single[] = {{"SLURM_ARRAY_TASK_ID", "3"}, {"SLURM_ARRAY_TASK_MIN", "3"},
                             {"SLURM_ARRAY_TASK_MAX", "3"}, {NULL, NULL}};
    expect_shard(single, 1, 1, NULL);
    const EnvVar neither[] = {{"SLURM_ARRAY_TASK_ID", "3"}, {"SLURM_ARRAY_TASK_MIN", "0"},
                              {NULL, NULL}};
    expect_error(neither, "SLURM_ARRAY_TASK_ID=3 is set but neither SLURM_ARRAY_TASK_COUNT nor "
                 "SLURM_ARRAY_TASK_MAX", NULL);
    const EnvVar below[] = {{"SLURM_ARRAY_TASK_ID", "3"}, {"SLURM_ARRAY_TASK_MIN", "4"},
                            {"SLURM_ARRAY_TASK_MAX", "2"}, {NULL, NULL}};
    expect_error(below, "SLURM_ARRAY_TASK_MAX=2: expected >= SLURM_ARRAY_TASK_MIN=4", NULL);
    const EnvVar huge[] = {{"SLURM_ARRAY_TASK_ID", "0"}, {"SLURM_ARRAY_TASK_MIN", "0"},
                           {"SLURM_ARRAY_TASK_MAX", "2147483647"}, {NULL, NULL}};
    expect_error(huge, "SLURM_ARRAY_TASK_MAX=2147483647", "more than", NULL);
}
END_TEST

START_TEST(slurm_not_contiguous) {
    /* --array=0-9:2: ids 0,2,4,6,8. */
    const EnvVar step[] = {{"SLURM_ARRAY_TASK_ID", "2"},    {"SLURM_ARRAY_TASK_MIN", "0"},
                           {"SLURM_ARRAY_TASK_MAX", "8"},   {"SLURM_ARRAY_TASK_COUNT", "5"},
                           {"SLURM_ARRAY_TASK_STEP", "2"},  {NULL, NULL}};
    expect_error(step, "SLURM_ARRAY_TASK_STEP=2", "not contiguous", NULL);
    /* the step alone reveals it, without MAX to compare COUNT with */
    const EnvVar step_only[] = {{"SLURM_ARRAY_TASK_ID", "2"},   {"SLURM_ARRAY_TASK_MIN", "0"},
                                {"SLURM_ARRAY_TASK_COUNT", "5"}, {"SLURM_ARRAY_TASK_STEP", "2"},
                                {NULL, NULL}};
    expect_error(step_only, "SLURM_ARRAY_TASK_STEP=2", NULL);
    /* --array=1,3,5: no step, but 3 tasks over ids 1..5 */
    const EnvVar list[] = {{"SLURM_ARRAY_TASK_ID", "3"},  {"SLURM_ARRAY_TASK_MIN", "1"},
                           {"SLURM_ARRAY_TASK_MAX", "5"}, {"SLURM_ARRAY_TASK_COUNT", "3"},
                           {NULL, NULL}};
    expect_error(list, "SLURM_ARRAY_TASK_COUNT=3, but SLURM_ARRAY_TASK_MIN=1 to "
                 "SLURM_ARRAY_TASK_MAX=5 spans 5 ids", "not contiguous", NULL);
    const EnvVar step0[] = {{"SLURM_ARRAY_TASK_ID", "2"},   {"SLURM_ARRAY_TASK_MIN", "0"},
                            {"SLURM_ARRAY_TASK_COUNT", "5"}, {"SLURM_ARRAY_TASK_STEP", "0"},
                            {NULL, NULL}};
    expect_error(step0, "SLURM_ARRAY_TASK_STEP=0: expected 1", NULL);
}
END_TEST

START_TEST(slurm_bad_values) {
    static const char *const not_int[] = {"", "x", "-1", "+1", " 1", "1 ", "1.5", "0x1",
                                          "99999999999"};
    static const char *const names[] = {"SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_MIN",
                                        "SLURM_ARRAY_TASK_COUNT", "SLURM_ARRAY_TASK_MAX",
                                        "SLURM_ARRAY_TASK_STEP"};
    for (size_t v = 0; v < sizeof names / sizeof names[0]; v++) {
        for (size_t k = 0; k < sizeof not_int / sizeof not_int[0]; k++) {
            EnvVar env[] = {{"SLURM_ARRAY_TASK_ID", "1"},    {"SLURM_ARRAY_TASK_MIN", "0"},
                            {"SLURM_ARRAY_TASK_COUNT", "4"}, {"SLURM_ARRAY_TASK_MAX", "3"},
                            {"SLURM_ARRAY_TASK_STEP", "1"},  {NULL, NULL}};
            env[v].value = not_int[k];
            char quoted[96];
            snprintf(quoted, sizeof quoted, "%s='%s': expected a non-negative decimal integer",
                     names[v], not_int[k]);
            expect_error(env, quoted, NULL);
        }
    }
    const EnvVar no_min[] = {{"SLURM_ARRAY_TASK_ID", "1"}, {"SLURM_ARRAY_TASK_COUNT", "4"},
                             {NULL, NULL}};
    expect_error(no_min, "SLURM_ARRAY_TASK_ID=1 is set but SLURM_ARRAY_TASK_MIN is not", NULL);
    const EnvVar zero[] = {{"SLURM_ARRAY_TASK_ID", "0"}, {"SLURM_ARRAY_TASK_MIN", "0"},
                           {"SLURM_ARRAY_TASK_COUNT", "0"}, {NULL, NULL}};
    expect_error(zero, "SLURM_ARRAY_TASK_COUNT=0: expected >= 1", NULL);
    const EnvVar past[] = {{"SLURM_ARRAY_TASK_ID", "4"}, {"SLURM_ARRAY_TASK_MIN", "0"},
                           {"SLURM_ARRAY_TASK_COUNT", "4"}, {NULL, NULL}};
    expect_error(past, "SLURM_ARRAY_TASK_ID=4: expected 0..3", "SLURM_ARRAY_TASK_MIN=0",
                 "SLURM_ARRAY_TASK_COUNT=4", NULL);
    const EnvVar before[] = {{"SLURM_ARRAY_TASK_ID", "0"}, {"SLURM_ARRAY_TASK_MIN", "1"},
                             {"SLURM_ARRAY_TASK_COUNT", "4"}, {NULL, NULL}};
    expect_error(before, "SLURM_ARRAY_TASK_ID=0: expected 1..4", NULL);
    const EnvVar past_max[] = {{"SLURM_ARRAY_TASK_ID", "9"}, {"SLURM_ARRAY_TASK_MIN", "5"},
                               {"SLURM_ARRAY_TASK_MAX", "8"}, {NULL, NULL}};
    expect_error(past_max, "SLURM_ARRAY_TASK_ID=9: expected 5..8", "SLURM_ARRAY_TASK_MAX=8", NULL);
}
END_TEST

START_TEST(gitlab) {
    for (int i = 1; i <= 4; i++) {
        char index[8], source[64];
        snprintf(index, sizeof index, "%d", i);
        snprintf(source, sizeof source, "CI_NODE_INDEX=%d, CI_NODE_TOTAL=4", i);
        const EnvVar env[] = {{"CI_NODE_INDEX", index}, {"CI_NODE_TOTAL", "4"}, {NULL, NULL}};
        expect_shard(env, i, 4, source);
    }
    /* GitLab's job without `parallel`: CI_NODE_TOTAL=1 and no index. */
    const EnvVar plain[] = {{"CI_NODE_TOTAL", "1"}, {NULL, NULL}};
    expect_shard(plain, 1, 1, NULL);
}
END_TEST

START_TEST(gitlab_bad_values) {
    const EnvVar zero[] = {{"CI_NODE_INDEX", "0"}, {"CI_NODE_TOTAL", "4"}, {NULL, NULL}};
    expect_error(zero, "CI_NODE_INDEX=0: expected 1..CI_NODE_TOTAL=4", "1-based", NULL);
    const EnvVar past[] = {{"CI_NODE_INDEX", "5"}, {"CI_NODE_TOTAL", "4"}, {NULL, NULL}};
    expect_error(past, "CI_NODE_INDEX=5: expected 1..CI_NODE_TOTAL=4", NULL);
    const EnvVar not_int[] = {{"CI_NODE_INDEX", "two"}, {"CI_NODE_TOTAL", "4"}, {NULL, NULL}};
    expect_error(not_int, "CI_NODE_INDEX='two': expected a non-negative decimal integer", NULL);
    const EnvVar total_bad[] = {{"CI_NODE_INDEX", "1"}, {"CI_NODE_TOTAL", "4x"}, {NULL, NULL}};
    expect_error(total_bad, "CI_NODE_TOTAL='4x'", NULL);
    const EnvVar total_zero[] = {{"CI_NODE_INDEX", "1"}, {"CI_NODE_TOTAL", "0"}, {NULL, NULL}};
    expect_error(total_zero, "CI_NODE_TOTAL=0: expected >= 1", NULL);
    const EnvVar no_total[] = {{"CI_NODE_INDEX", "1"}, {NULL, NULL}};
    expect_error(no_total, "CI_NODE_INDEX=1 is set but CI_NODE_TOTAL is not", NULL);
    const EnvVar no_index[] = {{"CI_NODE_TOTAL", "3"}, {NULL, NULL}};
    expect_error(no_index, "CI_NODE_TOTAL=3 is set but CI_NODE_INDEX is not", NULL);
    const EnvVar empty[] = {{"CI_NODE_INDEX", ""}, {"CI_NODE_TOTAL", "4"}, {NULL, NULL}};
    expect_error(empty, "CI_NODE_INDEX=''", NULL);
}
END_TEST

START_TEST(none_set) {
    const EnvVar nothing[] = {{NULL, NULL}};
    expect_error(nothing, "found none of KVREPRO_SHARD, SLURM_ARRAY_TASK_ID/COUNT, "
                 "CI_NODE_INDEX/TOTAL", NULL);
    /* A Slurm job that is not an array task, and a stray count, are not
     * sources. */
    const EnvVar slurm_job[] = {{"SLURM_JOB_ID", "1234"}, {"SLURM_ARRAY_TASK_COUNT", "4"},
                                {"SLURM_ARRAY_TASK_MIN", "0"}, {"kvrepro_shard", "1/2"},
                                {NULL, NULL}};
    expect_error(slurm_job, "found none of", NULL);
    /* err may be NULL */
    KvShard s = k_untouched;
    ck_assert_int_eq(kv_shard_from_env(env_lookup, (void *)nothing, &s, NULL), KV_ERR_INPUT);
}
END_TEST

/* A value too long for the message is cut, not overflowed. */
START_TEST(long_values) {
    char big[4096];
    memset(big, '7', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    const EnvVar env[] = {{"KVREPRO_SHARD", big}, {NULL, NULL}};
    expect_error(env, "KVREPRO_SHARD='7777", NULL);
    char zeros[600];
    memset(zeros, '0', sizeof zeros - 2);
    zeros[sizeof zeros - 2] = '2';
    zeros[sizeof zeros - 1] = '\0';
    const EnvVar padded[] = {{"CI_NODE_INDEX", zeros}, {"CI_NODE_TOTAL", "3"}, {NULL, NULL}};
    expect_shard(padded, 2, 3, NULL);
}
END_TEST

int main(void) {
    Suite *s = suite_create("shard_env");
    TCase *tc = tcase_create("shard_env");
    tcase_add_test(tc, parse_i_of_n);
    tcase_add_test(tc, explicit_variable);
    tcase_add_test(tc, explicit_bad_values);
    tcase_add_test(tc, precedence);
    tcase_add_test(tc, slurm_every_task_once);
    tcase_add_test(tc, slurm_min_not_zero);
    tcase_add_test(tc, slurm_count_from_max);
    tcase_add_test(tc, slurm_not_contiguous);
    tcase_add_test(tc, slurm_bad_values);
    tcase_add_test(tc, gitlab);
    tcase_add_test(tc, gitlab_bad_values);
    tcase_add_test(tc, none_set);
    tcase_add_test(tc, long_values);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    const int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
