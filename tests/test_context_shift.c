/* test_context_shift.c: the context shift (cpu_state.h kv_cpu_shift, DESIGN
 * §5, llama.cpp #12357). A shifted state must match the shifted context
 * run from scratch within the shift's tolerance on a model whose layers all
 * slide, and a shift that forgets to re-rotate must fall far outside it;
 * the ring's slots must be re-laid by its rule; bad shifts are refused and
 * leave the state as it was. (That every variant, eager and graph, equals
 * the reference's shift bitwise is test_variants', over the gate's own
 * context_shift scenario.) */
#include <check.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "cache.h"
#include "cache_registry.h"
#include "cpu_state.h"
#include "decode.h"
#include "fault.h"
#include "fixture.h"
#include "kvmath.h"
#include "layout.h"
#include "scenario.h"
#include "script.h"

#define TEST_PROMPT_SEED 11ULL
/* The models on which a shift is judged against a fresh run: every layer
 * slides (kv_scenario_shift_judged). */
static const char *const k_judged[] = {"mistral-tiny", "mistral_mixed-tiny"};

static KvFixtureModel load(const char *name) {
    KvFixtureModel fx;
    KvError err = {{0}};
    ck_assert_msg(kv_fixture_load(name, KV_FIXTURE_DEFAULT_SEED, &fx, &err) == KV_OK, "%s",
                  err.msg);
    return fx;
}

/* The gate's context_shift scenario for m. */
static void shift_scenario(const KvModel *m, KvScenario *sc) {
    KvError err = {{0}};
    ck_assert_msg(kv_scenario_build(&m->config, "context_shift", TEST_PROMPT_SEED, sc, &err) ==
                  KV_OK, "%s", err.msg);
}

/* Largest |a - b| relative to the largest |b| of the row. */
static double rel_err(const float *a, const float *b, int64_t n) {
    double d = 0.0, m = 0.0;
    for (int64_t i = 0; i < n; i++) {
        d = fmax(d, fabs((double)a[i] - (double)b[i]));
        m = fmax(m, fabs((double)b[i]));
    }
    return d / (m > 0.0 ? m : 1.0);
}

static KvDecodeSpec scenario_spec(const KvScenario *sc, const int32_t *forced) {
    return (KvDecodeSpec){
        .batch = sc->batch, .prompt_len = sc->prompt_len, .prompt = sc->prompt,
        .prompt_real = sc->real, .new_tokens = sc->new_tokens,
        .prefill_chunk = sc->prefill_chunk, .forced = forced,
    };
}

/* The scenario's shift as the harness's script (script.h). */
static KvScript scenario_script(const KvScenario *sc) {
    return (KvScript){.shift_step = sc->shift_step, .shift_keep = sc->shift_keep,
                      .shift_drop = sc->shift_drop};
}

/* The gate's context_shift scenario: the decode after the shift agrees
 * with the shifted context decoded from scratch within 1e-5 (a tenth of
 * the uncalibrated max_rel_err; measured ~9e-7) and greedy tokens agree,
 * yet not bitwise (the re-rotation rounds on its own); the steps before the
 * shift are bitwise those of the same decode without one. */
START_TEST(test_shift_matches_fresh) {
    KvFixtureModel fx = load(k_judged[_i]);
    const KvModel *m = &fx.model;
    char why[256];
    ck_assert_msg(kv_scenario_shift_judged(&m->config, why, sizeof why), "%s", why);
    KvScenario sc, fresh;
    KvError err = {{0}};
    shift_scenario(m, &sc);
    ck_assert(kv_scenario_shifts(&sc));
    KvDecodeSpec spec = scenario_spec(&sc, NULL);
    KvScript script = scenario_script(&sc);
    KvDecodeResult r, plain, f;
    ck_assert_msg(kv_script_decode(NULL, &script, m, &spec, &r, NULL, &err) == KV_OK, "%s",
                  err.msg);
    spec = scenario_spec(&sc, NULL); /* no script */
    ck_assert_msg(kv_decode_greedy(m, &spec, &plain, &err) == KV_OK, "%s", err.msg);
    const int64_t V = r.vocab, s0 = sc.shift_step;
    ck_assert_mem_eq(r.logits, plain.logits, (size_t)(s0 * V) * sizeof(float));

    int32_t *forced = NULL;
    ck_assert_msg(kv_scenario_shift_fresh(&sc, r.tokens, &fresh, &forced, &err) == KV_OK, "%s",
                  err.msg);
    ck_assert_int_eq(fresh.prompt_len, sc.prompt_len + s0 - 1 - sc.shift_drop + 1);
    ck_assert_int_eq(fresh.new_tokens, sc.new_tokens - s0);
    KvDecodeSpec fs = scenario_spec(&fresh, forced);
    ck_assert_msg(kv_decode_greedy(m, &fs, &f, &err) == KV_OK, "%s", err.msg);
    double worst = 0.0;
    for (int64_t j = 0; j < f.steps; j++) {
        worst = fmax(worst, rel_err(r.logits + (s0 + j) * V, f.logits + j * V, V));
        ck_assert_msg(r.tokens[s0 + j] == f.tokens[j], "%s: step %lld: token %d, fresh %d",
                      k_judged[_i], (long long)(s0 + j), r.tokens[s0 + j], f.tokens[j]);
    }
    fprintf(stderr, "%s: shifted vs fresh over %lld steps: max rel err %.3g\n", k_judged[_i],
            (long long)f.steps, worst);
    ck_assert_msg(worst <= 1e-5, "%s: max rel err %.3g", k_judged[_i], worst);
    ck_assert_msg(worst > 0.0, "%s: bitwise equal: the re-rotation should round on its own",
                  k_judged[_i]);
    free(forced);
    kv_decode_result_free(&r);
    kv_decode_result_free(&plain);
    kv_decode_result_free(&f);
    kv_scenario_free(&sc);
    kv_scenario_free(&fresh);
    kv_fixture_free(&fx);
}
END_TEST

/* The scenario shifts at decode step s0, after s0 - 1 more positions than
 * its prompt; a shift right after the prefill drops that many fewer, so
 * that the dropped span still lies beyond the receptive field. */
static int64_t direct_drop(const KvScenario *sc) { return sc->shift_drop - (sc->shift_step - 1); }

/* One forward of token `tok` after the prompt was prefilled and shifted
 * (undo: the re-rotation taken back afterwards, an engine that relabels
 * positions but leaves the keys as they were), into logits (V). */
static void shifted_step(const KvModel *m, const KvScenario *sc, int32_t tok, bool undo,
                         float *logits) {
    const KvConfig *c = &m->config;
    KvCpuState s;
    KvError err = {{0}};
    const int64_t P = sc->prompt_len, K = sc->shift_keep, D = direct_drop(sc);
    ck_assert_msg(kv_cpu_state_init(&s, m, 1, P + 1, P, NULL, &err) == KV_OK, "%s", err.msg);
    ck_assert_msg(kv_cpu_forward(&s, sc->prompt, sc->real, P, NULL, &err) == KV_OK, "%s",
                  err.msg);
    ck_assert_msg(kv_cpu_shift(&s, K, D, &err) == KV_OK, "%s", err.msg);
    ck_assert_int_eq(s.ref.len, P - D);
    ck_assert_int_eq(s.ref.n_real[0], P - D);
    const int64_t kvd = c->num_kv_heads * c->head_dim;
    for (int64_t l = 0; undo && l < c->num_layers; l++) {
        for (int64_t j = K; j < s.ref.len; j++) {
            float *k = s.ref.k + (l * s.ref.max_len + j) * kvd; /* (kv_dim) one stored key, B = 1 */
            for (int64_t h = 0; h < c->num_kv_heads; h++) {
                kv_rope_apply(k + h * c->head_dim, c->head_dim, s.ref.inv_freq, D);
            }
        }
    }
    const uint8_t one = 1;
    ck_assert_msg(kv_cpu_forward(&s, &tok, &one, 1, logits, &err) == KV_OK, "%s", err.msg);
    kv_cpu_state_free(&s);
}

/* The same shift right after a prefill, on the state directly: the kept
 * and moved positions decoded from scratch agree with it within 1e-5; a
 * shift whose keys are not re-rotated is off by far more than any
 * tolerance (the comparison has teeth). */
START_TEST(test_shift_without_rerotation_is_far_off) {
    KvFixtureModel fx = load(k_judged[_i]);
    const KvModel *m = &fx.model;
    KvScenario sc;
    KvError err = {{0}};
    shift_scenario(m, &sc);
    const int64_t P = sc.prompt_len, K = sc.shift_keep, D = direct_drop(&sc), V = m->config.vocab_size;
    const int32_t tok = 7;
    float *good = malloc((size_t)V * sizeof *good), *bad = malloc((size_t)V * sizeof *bad);
    float *ref = malloc((size_t)V * sizeof *ref);
    int32_t *ctx = malloc((size_t)(P - D + 1) * sizeof *ctx);
    uint8_t *real = malloc((size_t)(P - D + 1));
    ck_assert(good && bad && ref && ctx && real);
    shifted_step(m, &sc, tok, false, good);
    shifted_step(m, &sc, tok, true, bad);
    memcpy(ctx, sc.prompt, (size_t)K * sizeof *ctx);
    memcpy(ctx + K, sc.prompt + K + D, (size_t)(P - K - D) * sizeof *ctx);
    ctx[P - D] = tok;
    memset(real, 1, (size_t)(P - D + 1));
    KvCpuState s;
    ck_assert_msg(kv_cpu_state_init(&s, m, 1, P - D + 1, P - D + 1, NULL, &err) == KV_OK, "%s",
                  err.msg);
    ck_assert_msg(kv_cpu_forward(&s, ctx, real, P - D + 1, ref, &err) == KV_OK, "%s", err.msg);
    kv_cpu_state_free(&s);
    const double e_good = rel_err(good, ref, V), e_bad = rel_err(bad, ref, V);
    fprintf(stderr, "%s: one step after the shift: re-rotated %.3g, not re-rotated %.3g\n",
            k_judged[_i], e_good, e_bad);
    ck_assert_msg(e_good <= 1e-5, "re-rotated: %.3g", e_good);
    ck_assert_msg(e_bad > 1e-2, "not re-rotated: %.3g, should be far off", e_bad);
    free(good);
    free(bad);
    free(ref);
    free(ctx);
    free(real);
    kv_scenario_free(&sc);
    kv_fixture_free(&fx);
}
END_TEST

/* The ring after a shift by a drop that is not a multiple of W: every slot
 * holds the position the ring's rule gives for the new count, and the
 * writer's record says so; under shift_cells (slots left in their cells)
 * the record and the rule part. */
START_TEST(test_shift_relays_ring) {
    KvFixtureModel fx = load("mistral-tiny");
    const KvModel *m = &fx.model;
    KvScenario sc;
    KvError err = {{0}};
    shift_scenario(m, &sc);
    const int64_t P = sc.prompt_len, w = m->config.sliding_window, D = direct_drop(&sc);
    ck_assert_int_ne(D % w, 0);
    for (int faulted = 0; faulted < 2; faulted++) {
        KvCpuState s;
        ck_assert_msg(kv_cpu_state_init(&s, m, 1, P, P, &kv_cache_ring, &err) == KV_OK, "%s",
                      err.msg);
        kv_cpu_state_plant(&s, faulted ? KV_FAULT_SHIFT_CELLS : 0);
        ck_assert_msg(kv_cpu_forward(&s, sc.prompt, sc.real, P, NULL, &err) == KV_OK, "%s",
                      err.msg);
        ck_assert_msg(kv_cpu_shift(&s, sc.shift_keep, D, &err) == KV_OK, "%s", err.msg);
        ck_assert_int_eq(s.ref.total_mem, P - D);
        const KvCacheView v = kv_cache_ring.view(kv_cpu_cache(&s, 0, 0, NULL));
        int64_t off_rule = 0;
        for (int64_t i = 0; i < v.n_slots; i++) {
            off_rule += v.pos[i] != kv_layout_position(KV_LAYOUT_RING, w, i, s.ref.total_mem);
            ck_assert(v.pos[i] >= 0 && v.real[i]);
        }
        if (faulted) {
            ck_assert_int_eq(off_rule, w);
        } else {
            ck_assert_int_eq(off_rule, 0);
        }
        kv_cpu_state_free(&s);
    }
    kv_scenario_free(&sc);
    kv_fixture_free(&fx);
}
END_TEST

static const KvBackendOps *backend_without_shift(void) {
    static KvBackendOps ops;
    ops = kv_backend_cpu;
    ops.shift = NULL;
    return &ops;
}

/* Bad shifts: refused with a message, the state as it was. */
START_TEST(test_shift_rules) {
    KvFixtureModel fx = load("mistral-tiny");
    const KvModel *m = &fx.model;
    KvScenario sc;
    KvError err = {{0}};
    shift_scenario(m, &sc);
    const int64_t P = sc.prompt_len, w = m->config.sliding_window;
    KvCpuState s;
    ck_assert(kv_cpu_state_init(&s, m, 1, P, P, NULL, &err) == KV_OK);
    ck_assert(kv_cpu_forward(&s, sc.prompt, sc.real, P, NULL, &err) == KV_OK);
    const int64_t bad[][2] = {{0, 0}, {-1, 3}, {1, P - w}, {P - w, 1}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ck_assert_int_eq(kv_cpu_shift(&s, bad[i][0], bad[i][1], &err), KV_ERR_INPUT);
        ck_assert_msg(strstr(err.msg, "context shift") != NULL, "%s", err.msg);
        ck_assert_int_eq(s.ref.len, P);
        ck_assert_int_eq(s.ref.total_mem, P);
        ck_assert_int_eq(s.ref.n_real[0], P);
    }
    ck_assert_int_eq(kv_cpu_shift(&s, 0, P - w, &err), KV_OK); /* the most it may drop */
    kv_cpu_state_free(&s);

    /* the script's own checks, before any backend is touched */
    KvDecodeSpec spec = scenario_spec(&sc, NULL);
    KvScript script = scenario_script(&sc);
    script.shift_drop = P + sc.shift_step; /* more than is stored before the shift */
    ck_assert_int_eq(kv_script_bind(&script, m, &spec, &err), KV_ERR_INPUT);
    ck_assert_msg(strstr(err.msg, "context shift") != NULL, "%s", err.msg);
    script = scenario_script(&sc);
    script.shift_drop = 0; /* partial */
    ck_assert_int_eq(kv_script_bind(&script, m, &spec, &err), KV_ERR_INPUT);
    script = scenario_script(&sc);
    const int32_t suffix[1] = {5};
    script.save_after = 1;
    script.switch_step = 2;
    script.suffix_len = 1;
    script.suffix = suffix;
    ck_assert_int_eq(kv_script_bind(&script, m, &spec, &err), KV_ERR_INPUT);
    ck_assert_msg(strstr(err.msg, "request switch") != NULL, "%s", err.msg);
    /* a backend without the op refuses the decode by name */
    spec = scenario_spec(&sc, NULL);
    script = scenario_script(&sc);
    KvDecodeResult r;
    ck_assert_int_eq(kv_script_decode(backend_without_shift(), &script, m, &spec, &r, NULL, &err),
                     KV_ERR_INPUT);
    ck_assert_msg(strstr(err.msg, "not implemented on the cpu backend") != NULL, "%s", err.msg);
    /* per-row positions (right padding) are not shifted */
    ck_assert(kv_cpu_state_init(&s, m, 2, P, P, NULL, &err) == KV_OK);
    ck_assert(kv_cpu_state_set_per_row(&s, &err) == KV_OK);
    ck_assert_int_eq(kv_cpu_shift(&s, 0, 1, &err), KV_ERR_INPUT);
    ck_assert_msg(strstr(err.msg, "right padding") != NULL, "%s", err.msg);
    kv_cpu_state_free(&s);
    kv_scenario_free(&sc);
    kv_fixture_free(&fx);
}
END_TEST

/* Only models whose layers all slide are judged against a fresh run; the
 * others say why. */
START_TEST(test_shift_judged_only_when_all_slide) {
    static const struct {
        const char *name;
        bool judged;
    } k_cases[] = {{"mistral-tiny", true},  {"mistral_mixed-tiny", true}, {"gemma2-tiny", false},
                   {"qwen2-tiny", false},   {"gemma3-tiny", false},       {"gpt_oss-tiny", false}};
    for (size_t i = 0; i < sizeof k_cases / sizeof k_cases[0]; i++) {
        KvFixtureModel fx = load(k_cases[i].name);
        const KvConfig c = fx.model.config;
        char why[256] = "unset";
        ck_assert_msg(kv_scenario_shift_judged(&c, why, sizeof why) == k_cases[i].judged, "%s",
                      k_cases[i].name);
        ck_assert(k_cases[i].judged ? why[0] == '\0' : strstr(why, "whole context") != NULL);
        kv_fixture_free(&fx);
    }
}
END_TEST

int main(void) {
    Suite *s = suite_create("context_shift");
    TCase *tc = tcase_create("cpu");
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, test_shift_matches_fresh, 0, 2);
    tcase_add_loop_test(tc, test_shift_without_rerotation_is_far_off, 0, 2);
    tcase_add_test(tc, test_shift_relays_ring);
    tcase_add_test(tc, test_shift_rules);
    tcase_add_test(tc, test_shift_judged_only_when_all_slide);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    const int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? 0 : 1;
}
