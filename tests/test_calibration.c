/* test_calibration.c: calibrated tolerances on the tiny fixtures (DESIGN §6,
 * compare.h).
 *
 * For each tiny family and two scenarios (`medium`: each medium family, one
 * scenario; label long, not in `make test`) the gate unit runs with its
 * calibration (three reduction orders, the fp64 shadow), then:
 *   - held out: the fp64 shadow's logits, a correct implementation in an
 *     order the ensemble never ran (exact), are within the calibrated
 *     max_rel_err of the reference, and so is every ensemble member;
 *   - the calibrated value is the documented max(16 x spread, 8 x fp64
 *     error, floor), with a spread and an fp64 error that are > 0 (the
 *     members really reorder, the shadow really is another precision);
 *   - planted tf32, window_off_by_one and stale_scalar each fail at least
 *     one reference comparison under that calibrated tolerance.
 * Every figure is printed (so that a report can quote them): the
 * fp64 error, the spread, the tolerance and each fault's smallest failing
 * error as a multiple of it. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache_registry.h"
#include "compare.h"
#include "fault.h"
#include "fixture.h"
#include "matrix.h"
#include "scenario.h"
#include "shadow64.h"

static const char *const k_tiny[] = {"gemma2-tiny", "mistral-tiny", "qwen2-tiny", "gemma3-tiny", "gpt_oss-tiny"};
/* ~100M parameters, hidden 768 (`test_calibration medium`, label long). */
static const char *const k_medium[] = {"gemma2-medium", "mistral-medium"};
/* A reported 125M Mistral shape (`test_calibration 125m`, label long). */
static const char *const k_125m[] = {"mistral-125m"};
static const char *const *k_families = k_tiny; /* main picks the set */
static int k_n_families = 5;
/* The tiny run calibrates each fault pass again and checks that the value
 * does not move (calibration runs the clean reference, never a candidate's
 * fault); the long runs reuse the clean pass's value (each calibration is
 * four more decodes and an fp64 shadow of a large model). */
static bool k_recalibrate = true;
/* prompt_w_plus_1: the window acts from the prefill on; short_prompt_
 * crosses_window: graph replays cross W (where a stale position acts). The
 * medium run takes the first only (each medium unit takes minutes). */
static const char *const k_scenarios[] = {"prompt_w_plus_1", "short_prompt_crosses_window"};
static int k_n_scenarios = 2;

/* The unit (family, scenario) gated on the CPU, ring and index_copy, eager
 * and graph, one repeat, calibrated, with `faults`; into *rep. max_rel_err
 * > 0 is given as by --tol (the calibration still runs and is recorded, but
 * does not set the value). */
static void gate_unit(const KvFixtureModel *fx, const char *family, const char *scenario,
                      unsigned faults, double max_rel_err, KvReport *rep) {
    static KvGateBackend cpu_only = {&kv_backend_cpu, ""};
    const KvCacheOps *const variants[] = {kv_cache_find("ring"), kv_cache_find("index_copy")};
    const char *const scen[] = {scenario};
    const KvGateOptions o = {
        .scenarios = scen, .n_scenarios = 1, .variants = variants, .n_variants = 2,
        .backends = &cpu_only, .n_backends = 1, .eager = true, .graph = true, .repeats = 1,
        .replay_every = 5, .faults = faults, .tol = kv_tolerances_default(), .calibrate = true,
        .tol_max_rel_err_set = max_rel_err > 0.0, .share_prefill = true,
        .prompt_seed = KV_FIXTURE_DEFAULT_SEED, .shard_i = 1, .shard_n = 1,
        .full_logits_max_vocab = KV_FULL_LOGITS_MAX_VOCAB,
    };
    KvGateOptions use = o;
    if (max_rel_err > 0.0) use.tol.max_rel_err = max_rel_err;
    memset(rep, 0, sizeof *rep);
    KvError err = {{0}};
    int unit = 0;
    ck_assert_msg(kv_gate_run_model(&fx->model, family, &use, &unit, rep, &err) == KV_OK, "%s",
                  err.msg);
}

/* The value of the report's tolerance "prefix@family/scenario". */
static double unit_tolerance(const KvReport *rep, const char *prefix, const char *family,
                             const char *scenario) {
    char name[KV_NAME_LEN];
    snprintf(name, sizeof name, "%s@%s/%s", prefix, family, scenario);
    for (int64_t t = 0; t < rep->n_tolerances; t++) {
        if (strcmp(rep->tolerances[t].name, name) == 0) return rep->tolerances[t].value;
    }
    ck_abort_msg("no tolerance %s in the report", name);
    return NAN;
}

/* _i: family x scenario. */
START_TEST(test_calibrated_tolerance) {
    const char *family = k_families[_i / k_n_scenarios];
    const char *scenario = k_scenarios[_i % k_n_scenarios];
    KvFixtureModel fx;
    KvError err = {{0}};
    ck_assert_msg(kv_fixture_load(family, KV_FIXTURE_DEFAULT_SEED, &fx, &err) == KV_OK, "%s",
                  err.msg);
    KvReport rep;
    gate_unit(&fx, family, scenario, 0, 0.0, &rep);
    const double spread = unit_tolerance(&rep, "spread", family, scenario);
    const double fp64 = unit_tolerance(&rep, "fp64_err", family, scenario);
    const double tol = unit_tolerance(&rep, "max_rel_err", family, scenario);
    ck_assert_msg(spread > 0.0 && fp64 > 0.0, "%s %s: spread %g, fp64 error %g", family, scenario,
                  spread, fp64);
    double want = KV_CAL_SPREAD_MULT * spread;
    if (KV_CAL_FP64_MULT * fp64 > want) want = KV_CAL_FP64_MULT * fp64;
    if (want < KV_CAL_FLOOR) want = KV_CAL_FLOOR;
    ck_assert_msg(tol == want, "%s %s: max_rel_err %g, the rule gives %g", family, scenario, tol,
                  want);
    /* The yardstick per step, on the reference run: its maximum is fp64. */
    const KvRun *r0 = &rep.runs[0];
    ck_assert_ptr_nonnull(r0->fp64_rel_err);
    double step_max = 0.0;
    int64_t worst = 0;
    for (int64_t t = 0; t < r0->steps; t++) {
        ck_assert_msg(r0->fp64_rel_err[t] > 0.0 && r0->fp64_rel_err[t] <= fp64, "step %lld: %g",
                      (long long)t, r0->fp64_rel_err[t]);
        if (r0->fp64_rel_err[t] > step_max) {
            step_max = r0->fp64_rel_err[t];
            worst = t;
        }
    }
    ck_assert(step_max == fp64);
    fprintf(stderr, "%s %s: fp64 error per step: first %.3g, last %.3g, largest %.3g at step "
            "%lld of %lld\n", family, scenario, r0->fp64_rel_err[0],
            r0->fp64_rel_err[r0->steps - 1], step_max, (long long)worst, (long long)r0->steps);
    for (int64_t c = 0; c < rep.n_comparisons; c++) {
        ck_assert_msg(rep.comparisons[c].verdict == KV_VERDICT_PASS, "%s %s: clean comparison "
                      "%lld failed: %s", family, scenario, (long long)c,
                      rep.comparisons[c].message);
    }

    /* Held out: the exact logits (the fp64 shadow) as a candidate. */
    const KvRun *ref = &rep.runs[0];
    ck_assert_str_eq(ref->variant, "reference");
    double held_out = 0.0;
    ck_assert_msg(kv_shadow64_rel_error(&fx.model, ref->batch, ref->prompt_len, ref->prompt,
                                        ref->prompt_real, ref->steps, ref->tokens, ref->logits,
                                        NULL, &held_out, &err) == KV_OK,
                  "%s", err.msg);
    ck_assert_msg(held_out <= tol, "%s %s: the fp64 shadow is %g from the reference, above the "
                  "calibrated %g", family, scenario, held_out, tol);
    fprintf(stderr, "%s %s: fp64 err %.3g, spread %.3g, calibrated max_rel_err %.3g (fixed "
            "default %g); held-out exact logits at %.3g (%.1f%% of it)\n", family, scenario, fp64,
            spread, tol, KV_TOL_MAX_REL_ERR, held_out, 100.0 * held_out / tol);
    kv_report_free(&rep);

    /* Three real bugs, each far past the calibrated value. */
    /* window_off_by_one admits one key more than W; a variant's cache
     * holds W keys, so the extra key can only come from a prefill's own
     * chunk: it acts where the prompt is longer than W (prompt_w_plus_1),
     * and is not tried on the short prompt. */
    const char *const faults[] = {"tf32", "window_off_by_one", "stale_scalar"};
    for (int f = 0; f < 3; f++) {
        if (f == 1 && strcmp(scenario, "prompt_w_plus_1") != 0) continue;
        const KvFaultInfo *fi = kv_fault_find(faults[f]);
        ck_assert_ptr_nonnull(fi);
        gate_unit(&fx, family, scenario, fi->bit, k_recalibrate ? 0.0 : tol, &rep);
        const double ftol = unit_tolerance(&rep, "max_rel_err", family, scenario);
        ck_assert(ftol == tol); /* calibration runs the clean reference: unchanged */
        int64_t failed = 0;
        double least = INFINITY;
        for (int64_t c = 0; c < rep.n_comparisons; c++) {
            const KvComparison *cmp = &rep.comparisons[c];
            if (cmp->kind != KV_CMP_REFERENCE || cmp->verdict != KV_VERDICT_FAIL) continue;
            failed++;
            if (cmp->max_rel_err < least) least = cmp->max_rel_err;
        }
        ck_assert_msg(failed > 0, "%s %s: %s failed no reference comparison under the "
                      "calibrated %g", family, scenario, faults[f], tol);
        fprintf(stderr, "%s %s: %s fails %lld reference comparisons, the least at %.3g = %.0f x "
                "the calibrated tolerance\n", family, scenario, faults[f], (long long)failed, least,
                least / tol);
        kv_report_free(&rep);
    }
    kv_fixture_free(&fx);
}
END_TEST

static Suite *calibration_suite(void) {
    Suite *s = suite_create("calibration");
    TCase *tc = tcase_create("calibrated");
    tcase_set_timeout(tc, 7200);
    tcase_add_loop_test(tc, test_calibrated_tolerance, 0, k_n_families * k_n_scenarios);
    suite_add_tcase(s, tc);
    return s;
}

/* Usage: test_calibration [medium|125m] (default: the tiny fixtures). */
int main(int argc, char **argv) {
    if (argc > 1 && (strcmp(argv[1], "medium") == 0 || strcmp(argv[1], "125m") == 0)) {
        const bool medium = strcmp(argv[1], "medium") == 0;
        k_families = medium ? k_medium : k_125m;
        k_n_families = medium ? 2 : 1;
        k_n_scenarios = 1;
        k_recalibrate = false;
    } else if (argc > 1) {
        fprintf(stderr, "usage: test_calibration [medium|125m]\n");
        return 2;
    }
    SRunner *sr = srunner_create(calibration_suite());
    srunner_run_all(sr, CK_NORMAL);
    const int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
