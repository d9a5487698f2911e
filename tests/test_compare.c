/* test_compare.c: the comparator on synthetic runs, so every verdict path is
 * exercised, including those a clean CPU gate never reaches (near-tie flips,
 * real flips, tolerance breaches, replay mismatches). Expected values are
 * computed here by hand from the constructed data. */
#include <check.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "compare.h"
#include "matrix.h"
#include "report.h"

#define S 4 /* steps */
#define B 2 /* rows */
#define V 8 /* vocab */
#define P 3 /* probes */

/* A run whose logits are v * 0.5 + step (row 0) / - step (row 1) style data
 * with a clear top-1 at id (step + row) % V, margin 1.0. */
static KvRun make_run(void) {
    KvRun r;
    memset(&r, 0, sizeof r);
    snprintf(r.variant, sizeof r.variant, "ring");
    snprintf(r.backend, sizeof r.backend, "cpu");
    snprintf(r.mode, sizeof r.mode, "eager");
    r.steps = S;
    r.batch = B;
    r.vocab = V;
    r.n_probes = P;
    r.replay_mismatch_step = -1;
    r.tokens = calloc(S * B, sizeof *r.tokens);
    r.logits = calloc(S * B * V, sizeof *r.logits);
    r.margins = calloc(S * B, sizeof *r.margins);
    r.probe_hash = calloc(S * P * B, sizeof *r.probe_hash);
    r.probe_names = calloc(P, sizeof *r.probe_names);
    ck_assert(r.tokens && r.logits && r.margins && r.probe_hash && r.probe_names);
    snprintf(r.probe_names[0], KV_NAME_LEN, "embed");
    snprintf(r.probe_names[1], KV_NAME_LEN, "layer0.cache");
    snprintf(r.probe_names[2], KV_NAME_LEN, "logits");
    for (int s = 0; s < S; s++) {
        for (int b = 0; b < B; b++) {
            const int top = (s + b) % V;
            for (int v = 0; v < V; v++) r.logits[(s * B + b) * V + v] = v == top ? 4.0f : 3.0f - 0.25f * (float)v;
            r.tokens[s * B + b] = top;
            r.margins[s * B + b] = 4.0f - 3.0f + 0.25f * (float)(top == 0 ? 1 : 0); /* runner-up */
        }
    }
    for (int i = 0; i < S * P * B; i++) r.probe_hash[i] = 1000u + (uint64_t)i;
    return r;
}

static KvRun copy_run(const KvRun *a);

/* NaN compares false with every tolerance: a NaN or Inf logit on either
 * side must fail the reference comparison, whatever else agrees. */
START_TEST(test_nonfinite_logits_fail_reference) {
    const float bad[3] = {NAN, INFINITY, -INFINITY};
    for (int k = 0; k < 3; k++) {
        for (int side = 0; side < 2; side++) {
            KvRun a = make_run(), b = copy_run(&a);
            KvRun *victim = side == 0 ? &a : &b;
            /* step 2, row 1, id 5: not the top-1, so tokens still agree */
            victim->logits[(2 * B + 1) * V + 5] = bad[k];
            KvComparison c;
            const KvTolerances t = kv_tolerances_default();
            kv_compare_reference(&a, &b, &t, 0, 1, &c);
            ck_assert_msg(c.verdict == KV_VERDICT_FAIL, "value %g on side %d passed: %s",
                          (double)bad[k], side, c.message);
            ck_assert_ptr_nonnull(strstr(c.message, "non-finite logit at token id 5"));
            ck_assert_int_eq(c.first_step, 2);
            ck_assert_int_eq(c.first_row, 1);
            /* the row is kept out of the metrics, which stay finite */
            ck_assert(isfinite(c.max_rel_err) && c.max_rel_err == 0.0);
            /* and no tolerance is offered that would pass it */
            ck_assert_msg(strstr(c.message, "no tolerance passes a non-finite logit") != NULL &&
                          strstr(c.message, "least passing") == NULL, "%s", c.message);
            kv_compare_outputs(&a, &b, &t, KV_CMP_REFERENCE, 0, 1, &c);
            ck_assert_msg(c.verdict == KV_VERDICT_FAIL &&
                          strstr(c.message, "no tolerance passes a non-finite logit") != NULL &&
                          strstr(c.message, "least passing") == NULL, "%s", c.message);
            kv_run_free(&a);
            kv_run_free(&b);
        }
    }
}
END_TEST

/* Half the candidate's logits NaN: still a failure (the old code said
 * "agrees: max rel err 0"). */
/* On the CPU a candidate must be bitwise the reference (DESIGN §3): one
 * logit an ulp away, or one probe hash apart, passes any tolerance and must
 * still fail kv_compare_require_bitwise, naming where; an identical copy
 * stays a pass. */
START_TEST(test_cpu_candidate_bitwise) {
    const KvTolerances t = kv_tolerances_default();
    KvComparison c;
    /* a probe hash apart at step 1, row 0, probe 1 (the cache) */
    KvRun a = make_run(), b = copy_run(&a);
    b.probe_hash[(1 * P + 1) * B + 0] ^= 1;
    kv_compare_reference(&a, &b, &t, 0, 1, &c);
    ck_assert_int_eq(c.verdict, KV_VERDICT_PASS);
    kv_compare_require_bitwise(&a, &b, &c);
    ck_assert_msg(c.verdict == KV_VERDICT_FAIL, "%s", c.message);
    ck_assert_int_eq(c.first_step, 1);
    ck_assert_int_eq(c.first_row, 0);
    ck_assert_int_eq(c.first_probe, 1);
    ck_assert_ptr_nonnull(strstr(c.message, "not bitwise the reference"));
    kv_run_free(&b);
    /* the logits an ulp apart at step 2, row 1 (not the top-1), probes equal */
    b = copy_run(&a);
    a.logits_hash = calloc(S * B, sizeof *a.logits_hash);
    b.logits_hash = calloc(S * B, sizeof *b.logits_hash);
    ck_assert(a.logits_hash && b.logits_hash);
    float *x = &b.logits[(2 * B + 1) * V + 5];
    *x = nextafterf(*x, 10.0f);
    b.logits_hash[2 * B + 1] = 7;
    kv_compare_reference(&a, &b, &t, 0, 1, &c);
    ck_assert_int_eq(c.verdict, KV_VERDICT_PASS);
    kv_compare_require_bitwise(&a, &b, &c);
    ck_assert_msg(c.verdict == KV_VERDICT_FAIL, "%s", c.message);
    ck_assert_int_eq(c.first_step, 2);
    ck_assert_int_eq(c.first_row, 1);
    ck_assert_int_eq(c.first_probe, -1);
    ck_assert_ptr_nonnull(strstr(c.message, "the logits"));
    kv_run_free(&b);
    /* an identical copy: still a pass */
    b = copy_run(&a);
    b.logits_hash = calloc(S * B, sizeof *b.logits_hash);
    ck_assert_ptr_nonnull(b.logits_hash);
    kv_compare_reference(&a, &b, &t, 0, 1, &c);
    kv_compare_require_bitwise(&a, &b, &c);
    ck_assert_msg(c.verdict == KV_VERDICT_PASS, "%s", c.message);
    kv_run_free(&a);
    kv_run_free(&b);
}
END_TEST

START_TEST(test_half_nan_candidate_fails) {
    KvRun a = make_run(), b = copy_run(&a);
    for (int i = 0; i < S * B * V; i += 2) b.logits[i] = NAN;
    KvComparison c;
    const KvTolerances t = kv_tolerances_default();
    kv_compare_reference(&a, &b, &t, 0, 1, &c);
    ck_assert_int_eq(c.verdict, KV_VERDICT_FAIL);
    ck_assert_int_eq(c.first_step, 0);
    ck_assert_int_eq(c.first_row, 0);
    kv_compare_finite(&b, 1, &c);
    ck_assert_int_eq(c.kind, KV_CMP_FINITE);
    ck_assert_int_eq(c.verdict, KV_VERDICT_FAIL);
    ck_assert_int_eq(c.run_a, 1);
    ck_assert_int_eq(c.run_b, 1);
    ck_assert_ptr_nonnull(strstr(c.message, "logit nan first at step 0 row 0, token id 0"));
    kv_run_free(&a);
    kv_run_free(&b);
}
END_TEST

/* The finite check: a clean run passes and says what it checked; a probe
 * record names the probe and element; an earlier-step logit or a later-step
 * probe decide which is reported first; a top-k run's values are checked by
 * token id; the reference's message says it is the reference. */
START_TEST(test_finite_check) {
    KvComparison c;
    KvRun a = make_run();
    a.nonfinite_checked = true;
    a.nonfinite_step = a.nonfinite_probe = a.nonfinite_row = a.nonfinite_index = -1;
    kv_compare_finite(&a, 3, &c);
    ck_assert_int_eq(c.verdict, KV_VERDICT_PASS);
    ck_assert_ptr_nonnull(strstr(c.message, "logits and every probe"));

    a.nonfinite_step = 1;
    a.nonfinite_probe = 1;
    a.nonfinite_row = 1;
    a.nonfinite_index = 7;
    a.nonfinite_value = INFINITY;
    kv_compare_finite(&a, 3, &c);
    ck_assert_int_eq(c.verdict, KV_VERDICT_FAIL);
    ck_assert_int_eq(c.first_step, 1);
    ck_assert_int_eq(c.first_row, 1);
    ck_assert_int_eq(c.first_probe, 1);
    ck_assert_ptr_nonnull(strstr(c.message, "inf first at step 1 row 1, probe layer0.cache element 7"));

    /* a NaN logit at step 2 comes after the probe record at step 1 */
    a.logits[(2 * B + 0) * V + 3] = NAN;
    kv_compare_finite(&a, 3, &c);
    ck_assert_int_eq(c.first_probe, 1);
    /* ... and before a probe record at step 3 */
    a.nonfinite_step = 3;
    kv_compare_finite(&a, 3, &c);
    ck_assert_int_eq(c.verdict, KV_VERDICT_FAIL);
    ck_assert_int_eq(c.first_step, 2);
    ck_assert_int_eq(c.first_probe, -1);
    ck_assert_ptr_nonnull(strstr(c.message, "logit nan first at step 2 row 0, token id 3"));

    snprintf(a.variant, sizeof a.variant, "reference");
    kv_compare_finite(&a, 3, &c);
    ck_assert_ptr_nonnull(strstr(c.message, "the reference itself is not finite"));

    /* a backend that does not check probes says so */
    a.nonfinite_checked = false;
    a.logits[(2 * B + 0) * V + 3] = 1.0f;
    kv_compare_finite(&a, 3, &c);
    ck_assert_int_eq(c.verdict, KV_VERDICT_PASS);
    ck_assert_ptr_nonnull(strstr(c.message, "does not check its probes"));

    /* top-k only: the kept values are checked, named by token id */
    a.topk = 2;
    a.topk_ids = calloc(S * B * 2, sizeof *a.topk_ids);
    a.topk_values = calloc(S * B * 2, sizeof *a.topk_values);
    ck_assert(a.topk_ids && a.topk_values);
    free(a.logits);
    a.logits = NULL;
    a.topk_ids[(1 * B + 1) * 2 + 1] = 6;
    a.topk_values[(1 * B + 1) * 2 + 1] = -INFINITY;
    kv_compare_finite(&a, 3, &c);
    ck_assert_int_eq(c.verdict, KV_VERDICT_FAIL);
    ck_assert_ptr_nonnull(strstr(c.message, "logit -inf first at step 1 row 1, token id 6"));

    a.skipped = true;
    snprintf(a.skip_reason, sizeof a.skip_reason, "no device");
    kv_compare_finite(&a, 3, &c);
    ck_assert_int_eq(c.verdict, KV_VERDICT_SKIP);
    kv_run_free(&a);
}
END_TEST

static KvRun copy_run(const KvRun *a) {
    KvRun r = make_run();
    memcpy(r.logits, a->logits, S * B * V * sizeof(float));
    memcpy(r.tokens, a->tokens, S * B * sizeof(int32_t));
    memcpy(r.margins, a->margins, S * B * sizeof(float));
    memcpy(r.probe_hash, a->probe_hash, S * P * B * sizeof(uint64_t));
    return r;
}

START_TEST(test_identical_runs_pass) {
    KvRun a = make_run(), b = copy_run(&a);
    KvComparison c;
    const KvTolerances t = kv_tolerances_default();
    kv_compare_reference(&a, &b, &t, 0, 1, &c);
    ck_assert_int_eq(c.verdict, KV_VERDICT_PASS);
    ck_assert(c.max_rel_err == 0.0 && c.nmse == 0.0 && c.top1_agreement == 100.0);
    ck_assert_int_eq(c.first_step, -1);
    kv_compare_bitwise(&a, &b, KV_CMP_REPEAT, 0, 1, &c);
    ck_assert_int_eq(c.verdict, KV_VERDICT_PASS);
    kv_run_free(&a);
    kv_run_free(&b);
}
END_TEST

START_TEST(test_bitwise_names_first_probe) {
    KvRun a = make_run(), b = copy_run(&a);
    /* step 2, probe 1 (layer0.cache), row 1 differs; a later probe too */
    b.probe_hash[(2 * P + 1) * B + 1] ^= 1;
    b.probe_hash[(3 * P + 0) * B + 0] ^= 1;
    KvComparison c;
    kv_compare_bitwise(&a, &b, KV_CMP_GRAPH, 0, 1, &c);
    ck_assert_int_eq(c.verdict, KV_VERDICT_FAIL);
    ck_assert_int_eq(c.first_step, 2);
    ck_assert_int_eq(c.first_row, 1);
    ck_assert_int_eq(c.first_probe, 1);
    ck_assert_msg(strstr(c.message, "layer0.cache") != NULL, "%s", c.message);
    kv_run_free(&a);
    kv_run_free(&b);
}
END_TEST

START_TEST(test_near_tie_flip_is_reported_not_failed) {
    KvRun ref = make_run(), cand = copy_run(&ref);
    /* At step 1 row 0 the reference's margin is tiny: a flip there is a
     * near-tie. */
    ref.margins[1 * B + 0] = 1e-4f;
    cand.tokens[1 * B + 0] = (ref.tokens[1 * B + 0] + 1) % V;
    KvComparison c;
    const KvTolerances t = kv_tolerances_default();
    kv_compare_reference(&ref, &cand, &t, 0, 1, &c);
    ck_assert_int_eq(c.verdict, KV_VERDICT_PASS);
    ck_assert_int_eq(c.near_ties, 1);
    ck_assert(fabs(c.top1_agreement - 100.0 * 7.0 / 8.0) < 1e-12);
    kv_run_free(&ref);
    kv_run_free(&cand);
}
END_TEST

/* The boundary of "near-tie" (DESIGN §6): a flip where the reference's
 * margin equals tie_margin exactly is still a near-tie (<=), one float step
 * above it is a real flip; for kv_compare_reference and kv_compare_outputs
 * alike (a mutant with `<` for `<=` once passed every check). */
START_TEST(test_near_tie_boundary_inclusive) {
    KvTolerances t = kv_tolerances_default();
    t.tie_margin = 0.015625; /* 2^-6: exact in float and double */
    for (int fn = 0; fn < 2; fn++) {
        for (int above = 0; above < 2; above++) {
            KvRun ref = make_run(), cand = copy_run(&ref);
            ref.margins[1 * B + 0] = above ? nextafterf(0.015625f, 1.0f) : 0.015625f;
            cand.tokens[1 * B + 0] = (ref.tokens[1 * B + 0] + 1) % V;
            KvComparison c;
            if (fn == 0) {
                kv_compare_reference(&ref, &cand, &t, 0, 1, &c);
            } else {
                kv_compare_outputs(&ref, &cand, &t, KV_CMP_REFERENCE, 0, 1, &c);
            }
            ck_assert_msg(c.verdict == (above ? KV_VERDICT_FAIL : KV_VERDICT_PASS),
                          "fn %d, margin %s tie_margin: %s", fn, above ? "above" : "equal to",
                          c.message);
            ck_assert_int_eq(c.near_ties, above ? 0 : 1);
            kv_run_free(&ref);
            kv_run_free(&cand);
        }
    }
}
END_TEST

START_TEST(test_real_flip_fails) {
    KvRun ref = make_run(), cand = copy_run(&ref);
    cand.tokens[2 * B + 1] = (ref.tokens[2 * B + 1] + 3) % V; /* margin 1.0 >> tie margin */
    KvComparison c;
    const KvTolerances t = kv_tolerances_default();
    kv_compare_reference(&ref, &cand, &t, 0, 1, &c);
    ck_assert_int_eq(c.verdict, KV_VERDICT_FAIL);
    ck_assert_msg(strstr(c.message, "token flip above the tie margin at step 2 row 1") != NULL,
                  "%s", c.message);
    kv_run_free(&ref);
    kv_run_free(&cand);
}
END_TEST

START_TEST(test_tolerance_breach_fails_and_metrics) {
    KvRun ref = make_run(), cand = copy_run(&ref);
    /* One logit off by 2e-3 (relative 5e-4 of the row's max 4.0): above
     * 1e-4, fails; with --tol max_rel_err=1e-3 it passes. */
    cand.logits[(3 * B + 0) * V + 5] += 2e-3f;
    KvComparison c;
    KvTolerances t = kv_tolerances_default();
    kv_compare_reference(&ref, &cand, &t, 0, 1, &c);
    ck_assert_int_eq(c.verdict, KV_VERDICT_FAIL);
    const double d = (double)cand.logits[(3 * B + 0) * V + 5] - (double)ref.logits[(3 * B + 0) * V + 5];
    ck_assert(fabs(c.max_abs_err - fabs(d)) < 1e-12);
    ck_assert(fabs(c.max_rel_err - fabs(d) / 4.0) < 1e-12);
    ck_assert(c.nmse > 0.0 && c.kl > 0.0);
    KvError err = {{0}};
    ck_assert_int_eq(kv_tolerances_set(&t, "max_rel_err=1e-3", &err), KV_OK);
    kv_compare_reference(&ref, &cand, &t, 0, 1, &c);
    ck_assert_int_eq(c.verdict, KV_VERDICT_PASS);
    ck_assert_int_eq(kv_tolerances_set(&t, "max_rel=1", &err), KV_ERR_INPUT);
    ck_assert_int_eq(kv_tolerances_set(&t, "tie_margin=-1", &err), KV_ERR_INPUT);
    ck_assert_int_eq(kv_tolerances_set(&t, "tie_margin=nan", &err), KV_ERR_INPUT);
    kv_run_free(&ref);
    kv_run_free(&cand);
}
END_TEST

START_TEST(test_replay_and_skip) {
    KvRun r = make_run();
    KvComparison c;
    r.replays_checked = 3;
    kv_compare_replay(&r, 0, &c);
    ck_assert_int_eq(c.verdict, KV_VERDICT_PASS);
    r.replay_mismatch_step = 2;
    kv_compare_replay(&r, 0, &c);
    ck_assert_int_eq(c.verdict, KV_VERDICT_FAIL);
    ck_assert_int_eq(c.first_step, 2);
    KvRun sk = make_run();
    sk.skipped = true;
    snprintf(sk.skip_reason, sizeof sk.skip_reason, "no CUDA device");
    kv_compare_bitwise(&r, &sk, KV_CMP_VARIANT, 0, 1, &c);
    ck_assert_int_eq(c.verdict, KV_VERDICT_SKIP);
    ck_assert_msg(strstr(c.message, "no CUDA device") != NULL, "%s", c.message);
    kv_run_free(&r);
    kv_run_free(&sk);
}
END_TEST

/* After a flip at a near-tie the unforced comparison stops comparing that
 * row (the runs were fed different tokens), so anything may follow; against
 * a baseline teacher-forced with the candidate's tokens every later step is
 * compared, and a later wrong logit fails. */
START_TEST(test_forced_outputs_compare_after_tie) {
    KvRun ref = make_run(), cand = copy_run(&ref);
    cand.tokens[1 * B + 0] = (cand.tokens[1 * B + 0] + 1) % V; /* step 1, row 0: a flip ... */
    ref.margins[1 * B + 0] = 1e-5f;                          /* ... at a near-tie */
    for (int v = 0; v < V; v++) cand.logits[(3 * B + 0) * V + v] = (float)(7 * v % 5); /* garbage */
    const KvTolerances t = {1e-4, 1e-3};
    KvComparison c;
    kv_compare_outputs(&ref, &cand, &t, KV_CMP_REFERENCE, 0, 1, &c);
    ck_assert_msg(c.verdict == KV_VERDICT_PASS && strstr(c.message, "not compared after step 1"),
                  "%s", c.message);
    kv_compare_outputs_forced(&ref, &cand, &t, KV_CMP_REFERENCE, 0, 1, &c);
    ck_assert_msg(c.verdict == KV_VERDICT_FAIL, "%s", c.message);
    ck_assert_int_eq(c.first_step, 3);
    ck_assert_int_eq(c.first_row, 0);
    ck_assert_int_eq(c.near_ties, 1);
    ck_assert_msg(strstr(c.message, "not compared") == NULL, "%s", c.message);
    kv_run_free(&ref);
    kv_run_free(&cand);
}
END_TEST

/* Another engine's run: no probe is ever named from hashes (they hash
 * other arithmetic), even where the layouts happen to match; the first
 * divergence is the first over-tolerance row. */
START_TEST(test_outputs_name_no_probe) {
    KvRun ref = make_run(), cand = copy_run(&ref);
    cand.probe_hash[0] ^= 1; /* step 0, embed, row 0: would be "the" divergence by hashes */
    KvComparison c;
    kv_compare_outputs(&ref, &cand, &(KvTolerances){1e-4, 1e-3}, KV_CMP_REFERENCE, 0, 1, &c);
    ck_assert_int_eq(c.verdict, KV_VERDICT_PASS);
    ck_assert_int_eq(c.first_probe, -1);
    cand.logits[(2 * B + 1) * V + 5] += 0.5f; /* step 2, row 1 */
    kv_compare_outputs(&ref, &cand, &(KvTolerances){1e-4, 1e-3}, KV_CMP_COMPILED, 0, 1, &c);
    ck_assert_int_eq(c.kind, KV_CMP_COMPILED);
    ck_assert_int_eq(c.verdict, KV_VERDICT_FAIL);
    ck_assert_int_eq(c.first_step, 2);
    ck_assert_int_eq(c.first_row, 1);
    ck_assert_int_eq(c.first_probe, -1);
    ck_assert_msg(strstr(c.message, "compiled vs eager") != NULL, "%s", c.message);
    /* max |logit| of that row is 4: 0.5 / 4 */
    ck_assert(fabs(c.max_rel_err - 0.125) < 1e-12);
    kv_run_free(&ref);
    kv_run_free(&cand);
}
END_TEST

START_TEST(test_graph_budget) {
    KvRun r = make_run();
    r.graph_budget = 1;
    r.recompiles = 11;
    r.graphs_captured = 12;
    KvComparison c;
    kv_compare_graph_budget(&r, 3, &c);
    ck_assert_int_eq(c.kind, KV_CMP_GRAPH_BUDGET);
    ck_assert_int_eq(c.run_a, 3);
    ck_assert_int_eq(c.run_b, 3);
    ck_assert_int_eq(c.verdict, KV_VERDICT_FAIL);
    ck_assert_str_eq(c.message, "12 decode graphs (11 recompiles), budget 1: the decode recompiles");
    r.graphs_captured = 1;
    r.recompiles = -1;
    kv_compare_graph_budget(&r, 3, &c);
    ck_assert_int_eq(c.verdict, KV_VERDICT_PASS);
    ck_assert_str_eq(c.message, "1 decode graph, within the budget of 1");
    kv_run_free(&r);
}
END_TEST

/* Repeats of one configuration with different probe layouts fail rather
 * than compare hashes of different probes. */
START_TEST(test_repeat_layouts_differ) {
    KvRun a = make_run(), b = copy_run(&a);
    snprintf(b.probe_names[1], KV_NAME_LEN, "layer0.attn");
    KvComparison c;
    kv_compare_repeat(&a, &b, 0, 1, &c);
    ck_assert_int_eq(c.verdict, KV_VERDICT_FAIL);
    ck_assert_msg(strstr(c.message, "probe 1: 'layer0.cache' vs 'layer0.attn'") != NULL, "%s",
                  c.message);
    ck_assert(!kv_probe_layouts_equal(&a, &b));
    kv_run_free(&a);
    kv_run_free(&b);
}
END_TEST

/* The calibration rule (DESIGN §6): each of its three terms decides in one
 * case, so a rule that drops one of them fails here, not only as false
 * alarms on a real model. */
/* kv_gate_keep_topk against its definition, k rounds of "the largest
 * untaken logit, the lowest id of equals, where `>` decides" (so a NaN
 * wins only as the lowest untaken id): rows with ties, signed zeros,
 * infinities and NaN. */
static void topk_rounds(const float *row, int64_t vocab, int64_t k, int32_t *ids, float *vals) {
    for (int64_t j = 0; j < k; j++) {
        int64_t best = -1;
        for (int64_t v = 0; v < vocab; v++) {
            bool taken = false;
            for (int64_t q = 0; q < j && !taken; q++) taken = ids[q] == v;
            if (taken) continue;
            if (best < 0 || row[v] > row[best]) best = v;
        }
        ids[j] = (int32_t)best;
        vals[j] = row[best];
    }
}

START_TEST(test_keep_topk_rounds) {
    enum { TS = 3, TB = 4, TV = 300 };
    const float pool[] = {0.0f, -0.0f, 1.0f, 1.0f, -1.0f, 2.5f, INFINITY, -INFINITY, 7.0f, 0.5f};
    KvRun r;
    memset(&r, 0, sizeof r);
    r.steps = TS;
    r.batch = TB;
    r.vocab = TV;
    r.logits = malloc((size_t)(TS * TB * TV) * sizeof *r.logits);
    float *copy = malloc((size_t)(TS * TB * TV) * sizeof *copy);
    ck_assert(r.logits && copy);
    uint32_t g = 12345u;
    for (int64_t i = 0; i < TS * TB * TV; i++) {
        g = g * 1664525u + 1013904223u;
        r.logits[i] = (g >> 8) % 3 == 0 ? pool[(g >> 12) % 10] : (float)((g >> 10) % 2000) / 7.0f;
    }
    r.logits[1 * TV + 5] = NAN;           /* row 1: a NaN in the middle */
    r.logits[2 * TV + 0] = NAN;           /* row 2: a NaN at id 0 (wins round 0) */
    r.logits[2 * TV + 1] = NAN;           /* and at id 1 (wins round 1) */
    for (int64_t v = 0; v < TV; v++) r.logits[3 * TV + v] = 1.0f; /* row 3: all equal */
    memcpy(copy, r.logits, (size_t)(TS * TB * TV) * sizeof *copy);
    KvError err = {{0}};
    ck_assert(kv_gate_keep_topk(&r, &err) == KV_OK);
    ck_assert_int_eq(r.topk, KV_TOPK);
    for (int64_t i = 0; i < TS * TB; i++) {
        int32_t ids[KV_TOPK];
        float vals[KV_TOPK];
        topk_rounds(copy + i * TV, TV, KV_TOPK, ids, vals);
        for (int j = 0; j < KV_TOPK; j++) {
            ck_assert_msg(r.topk_ids[i * KV_TOPK + j] == ids[j] &&
                              memcmp(&r.topk_values[i * KV_TOPK + j], &vals[j], sizeof(float)) ==
                                  0,
                          "row %lld rank %d: id %d (%g), the rounds give %d (%g)", (long long)i, j,
                          r.topk_ids[i * KV_TOPK + j], (double)r.topk_values[i * KV_TOPK + j],
                          ids[j], (double)vals[j]);
        }
    }
    kv_run_free(&r);
    free(copy);
}
END_TEST

START_TEST(test_cal_tolerance_terms) {
    /* the spread decides: 16 x 2e-6 above 8 x 1e-6 and the floor */
    ck_assert_double_eq_tol(kv_cal_tolerance(2e-6, 1e-6), 3.2e-5, 1e-12);
    /* the fp64 error decides: a deep model whose orders agree closely but
     * which is far from exact (8 x 1.3e-5 above 16 x 1e-6) */
    ck_assert_double_eq_tol(kv_cal_tolerance(1e-6, 1.3e-5), 1.04e-4, 1e-12);
    /* the floor decides: members bitwise equal, a shadow exact */
    ck_assert_double_eq_tol(kv_cal_tolerance(0.0, 0.0), 1e-6, 1e-15);
    ck_assert_double_eq_tol(kv_cal_tolerance(1e-8, 1e-8), 1e-6, 1e-15);
    /* a NaN term lends nothing */
    ck_assert_double_eq_tol(kv_cal_tolerance(NAN, 1e-5), 8e-5, 1e-12);
    ck_assert_double_eq_tol(kv_cal_tolerance(1e-5, NAN), 1.6e-4, 1e-12);
    ck_assert_double_eq_tol(kv_cal_tolerance(NAN, NAN), 1e-6, 1e-15);
}
END_TEST

int main(void) {
    Suite *s = suite_create("compare");
    TCase *tc = tcase_create("comparator");
    tcase_add_test(tc, test_identical_runs_pass);
    tcase_add_test(tc, test_nonfinite_logits_fail_reference);
    tcase_add_test(tc, test_half_nan_candidate_fails);
    tcase_add_test(tc, test_cpu_candidate_bitwise);
    tcase_add_test(tc, test_forced_outputs_compare_after_tie);
    tcase_add_test(tc, test_finite_check);
    tcase_add_test(tc, test_bitwise_names_first_probe);
    tcase_add_test(tc, test_near_tie_flip_is_reported_not_failed);
    tcase_add_test(tc, test_near_tie_boundary_inclusive);
    tcase_add_test(tc, test_real_flip_fails);
    tcase_add_test(tc, test_tolerance_breach_fails_and_metrics);
    tcase_add_test(tc, test_replay_and_skip);
    tcase_add_test(tc, test_outputs_name_no_probe);
    tcase_add_test(tc, test_graph_budget);
    tcase_add_test(tc, test_repeat_layouts_differ);
    tcase_add_test(tc, test_cal_tolerance_terms);
    tcase_add_test(tc, test_keep_topk_rounds);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
