/* test_shadow64.c: the fp64 shadow (reference/shadow64.h), the yardstick of
 * fp32 rounding.
 *
 * Asserted:
 *   - fixtures: on the tiny gemma2 and mistral fixtures, a reference decode of
 *     the default scenarios (left padding and chunked prefill among them) is
 *     within KV_SHADOW_MAX_REL_ERR of the shadow and not equal to it; most
 *     shadow logits are not float32 values (the shadow really carries more
 *     precision); the greedy tokens agree wherever the shadow's top-1 margin
 *     exceeds KV_SHADOW_TIE_MARGIN; the decode helper's per-step numbers are
 *     those of the test's own row-by-row comparison;
 *   - goldens: the shadow teacher-forced over transformers' sequences
 *     (fixtures/hf/, read by harness/golden.c as the gate and test_golden.c read
 *     them) is within the tolerance the fp32 reference meets there,
 *     KV_GOLDEN_MAX_REL_ERR;
 *   - causality: the logits of a prefix are bitwise those of the longer
 *     sequence, whatever `from` is;
 *   - bad inputs give KV_ERR_INPUT with a message.
 * Every measured error is printed (fixture/scenario: fp32 reference vs
 * shadow; golden scenario: also shadow vs transformers and fp32 reference vs
 * transformers), so the tolerances built on the yardstick can quote them. */
#include <check.h>
#include <hdf5.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "decode.h"
#include "fixture.h"
#include "gemm.h"
#include "golden.h"
#include "model.h"
#include "scenario.h"
#include "shadow64.h"

/* fp32 against fp64 over a 4-layer decode of ~100 positions: a few float32
 * ulps of the largest logit, ~1e-7..1e-6 relative. 1e-5 is the tolerance the
 * fp32 reference meets against transformers (test_golden.c); the reference
 * must be at least that close to exact. */
#define KV_SHADOW_MAX_REL_ERR 1e-5
/* Below this top-1 margin of the shadow (absolute; logits are O(1..10)) fp32
 * rounding may flip the greedy token legitimately: ~100x the largest
 * absolute fp32 error seen. */
#define KV_SHADOW_TIE_MARGIN 1e-4
/* test_golden.c's tolerance for the fp32 reference against transformers. */
#define KV_GOLDEN_MAX_REL_ERR 1e-5

static const char *const k_families[] = {"gemma2-tiny", "mistral-tiny", "qwen2-tiny", "gemma3-tiny", "gpt_oss-tiny"};
#define N_FAM ((int)(sizeof k_families / sizeof k_families[0]))
static const char *const k_scenarios[] = {"short_prompt_crosses_window",
                                          "prefill_longer_than_window", "left_padded_batch",
                                          "chunked_prefill"};
#define N_SCENARIOS 4

/* Argmax with ties to the lowest id, and the gap to the runner-up. */
static int32_t argmax64(const double *x /* (n) */, int64_t n, double *margin) {
    int64_t best = 0;
    for (int64_t i = 1; i < n; i++) {
        if (x[i] > x[best]) best = i;
    }
    double second = -INFINITY;
    for (int64_t i = 0; i < n; i++) {
        if (i != best && x[i] > second) second = x[i];
    }
    *margin = x[best] - second;
    return (int32_t)best;
}

/* max_i |a - ex| / max_i |ex| (1 when ex is all zero). */
static double rel_error(const float *a /* (n) */, const double *ex /* (n) */, int64_t n) {
    double max_abs = 0.0, max_ex = 0.0;
    for (int64_t i = 0; i < n; i++) {
        const double d = fabs((double)a[i] - ex[i]);
        max_abs = d > max_abs ? d : max_abs;
        max_ex = fabs(ex[i]) > max_ex ? fabs(ex[i]) : max_ex;
    }
    return max_abs / (max_ex > 0.0 ? max_ex : 1.0);
}

/* A row's sequence as the decode fed it: real prompt tokens, then
 * fed[0 .. steps - 2] of that row. *from receives the prefill's last
 * position. malloc'd. */
static int32_t *row_sequence(const int32_t *prompt /* (B, P) */, const uint8_t *real /* (B, P) */,
                             int64_t prompt_len, const int32_t *fed /* (steps, B) */,
                             int64_t batch, int64_t steps, int64_t b, int64_t *n, int64_t *from) {
    int32_t *seq = malloc((size_t)(prompt_len + steps) * sizeof *seq); /* (n) */
    ck_assert_ptr_nonnull(seq);
    int64_t k = 0;
    for (int64_t i = 0; i < prompt_len; i++) {
        if (real[b * prompt_len + i]) seq[k++] = prompt[b * prompt_len + i];
    }
    *from = k - 1;
    for (int64_t s = 0; s + 1 < steps; s++) seq[k++] = fed[s * batch + b];
    *n = k;
    return seq;
}

/* One (fixture, scenario): the reference decode against the shadow. */
START_TEST(test_shadow_fixture) {
    const char *fam = k_families[_i / N_SCENARIOS];
    const char *scen = k_scenarios[_i % N_SCENARIOS];
    KvFixtureModel fx;
    KvScenario sc;
    KvError err = {{0}};
    ck_assert_msg(kv_fixture_load(fam, KV_FIXTURE_DEFAULT_SEED, &fx, &err) == KV_OK, "%s",
                  err.msg);
    ck_assert_msg(kv_scenario_build(&fx.model.config, scen, KV_FIXTURE_DEFAULT_SEED, &sc, &err) ==
                      KV_OK,
                  "%s", err.msg);
    const KvModel *m = &fx.model;
    const int64_t V = m->config.vocab_size;
    KvDecodeSpec spec = {
        .batch = sc.batch,
        .prompt_len = sc.prompt_len,
        .prompt = sc.prompt,
        .prompt_real = sc.real,
        .new_tokens = sc.new_tokens,
        .prefill_chunk = sc.prefill_chunk,
        .variant = NULL,
    };
    KvDecodeResult r;
    ck_assert_msg(kv_decode_greedy(m, &spec, &r, &err) == KV_OK, "%s/%s: %s", fam, scen, err.msg);
    const int64_t steps = r.steps;

    double *per_step = calloc((size_t)steps, sizeof *per_step);
    double *own_step = calloc((size_t)steps, sizeof *own_step);
    double *sh = malloc((size_t)(steps * V) * sizeof *sh); /* (steps, V) one row */
    ck_assert(per_step != NULL && own_step != NULL && sh != NULL);
    double max_rel = -1.0;
    ck_assert_msg(kv_shadow64_decode_rel_error(m, &spec, &r, per_step, &max_rel, &err) == KV_OK,
                  "%s/%s: %s", fam, scen, err.msg);

    int64_t near_ties = 0, wide = 0, total = 0;
    double min_margin = INFINITY;
    for (int64_t b = 0; b < sc.batch; b++) {
        int64_t n, from;
        int32_t *seq = row_sequence(sc.prompt, sc.real, sc.prompt_len, r.tokens, sc.batch, steps,
                                    b, &n, &from);
        ck_assert_int_eq(n - from, steps);
        ck_assert_msg(kv_shadow64_logits(m, seq, n, from, sh, &err) == KV_OK, "%s", err.msg);
        for (int64_t s = 0; s < steps; s++) {
            const double *ex = sh + s * V;
            const double rel = rel_error(r.logits + (s * sc.batch + b) * V, ex, V);
            own_step[s] = rel > own_step[s] ? rel : own_step[s];
            double margin;
            const int32_t want = argmax64(ex, V, &margin);
            const int32_t got = r.tokens[s * sc.batch + b];
            min_margin = margin < min_margin ? margin : min_margin;
            if (got != want) {
                ck_assert_msg(margin <= KV_SHADOW_TIE_MARGIN,
                              "%s/%s step %lld row %lld: reference token %d, shadow %d (shadow "
                              "margin %.3g above the tie threshold %.1g)",
                              fam, scen, (long long)s, (long long)b, got, want, margin,
                              KV_SHADOW_TIE_MARGIN);
                fprintf(stderr, "shadow %s/%s step %lld row %lld: near-tie flip %d vs %d (margin "
                                "%.3g)\n", fam, scen, (long long)s, (long long)b, got, want,
                        margin);
                near_ties++;
            }
            for (int64_t i = 0; i < V; i++) wide += (double)(float)ex[i] != ex[i];
            total += V;
        }
        free(seq);
    }
    double own_max = 0.0;
    for (int64_t s = 0; s < steps; s++) {
        ck_assert_msg(own_step[s] == per_step[s],
                      "%s/%s step %lld: helper says %.17g, row-by-row %.17g", fam, scen,
                      (long long)s, per_step[s], own_step[s]);
        own_max = own_step[s] > own_max ? own_step[s] : own_max;
    }
    ck_assert(own_max == max_rel);
    fprintf(stderr, "shadow %s/%s: batch %lld, prompt %lld, chunk %lld, %lld steps: fp32 "
                    "reference vs shadow max rel error %.3g (step 0 %.3g, last %.3g); shadow min "
                    "margin %.3g, %lld near-tie flips, %.1f%% of shadow logits not float32\n",
            fam, scen, (long long)sc.batch, (long long)sc.prompt_len,
            (long long)sc.prefill_chunk, (long long)steps, max_rel, per_step[0],
            per_step[steps - 1], min_margin, (long long)near_ties,
            100.0 * (double)wide / (double)total);
    ck_assert_msg(max_rel < KV_SHADOW_MAX_REL_ERR,
                  "%s/%s: fp32 reference vs fp64 shadow: max rel error %.3g >= %.1g", fam, scen,
                  max_rel, KV_SHADOW_MAX_REL_ERR);
    /* Equal would mean the shadow rounds like the fp32 reference: no
     * yardstick at all. */
    ck_assert_msg(max_rel > 0.0, "%s/%s: the fp64 shadow equals the fp32 reference", fam, scen);
    ck_assert_msg(wide * 2 > total,
                  "%s/%s: only %lld of %lld shadow logits carry more than float32 precision",
                  fam, scen, (long long)wide, (long long)total);
    free(per_step);
    free(own_step);
    free(sh);
    kv_decode_result_free(&r);
    kv_scenario_free(&sc);
    kv_fixture_free(&fx);
}
END_TEST

/* ---- transformers goldens (fixtures/hf/, layout in its README) ---- */

static const char *const k_golden_families[] = {"gemma2", "mistral", "qwen2", "gemma3_text", "gpt_oss"};

/* max over (step, row) of max |a - b| / max |b|, both float32. */
static double rel_error_f32(const float *a /* (steps, batch, vocab) */,
                            const float *b /* (steps, batch, vocab) */, int64_t steps,
                            int64_t batch, int64_t vocab) {
    double worst = 0.0;
    for (int64_t r = 0; r < steps * batch; r++) {
        double max_abs = 0.0, max_b = 0.0;
        for (int64_t i = 0; i < vocab; i++) {
            const double d = fabs((double)a[r * vocab + i] - (double)b[r * vocab + i]);
            max_abs = d > max_abs ? d : max_abs;
            max_b = fabs((double)b[r * vocab + i]) > max_b ? fabs((double)b[r * vocab + i]) : max_b;
        }
        const double rel = max_abs / (max_b > 0.0 ? max_b : 1.0);
        worst = rel > worst ? rel : worst;
    }
    return worst;
}

/* One family: every golden scenario, teacher-forced over transformers'
 * tokens: the shadow vs transformers, the fp32 reference vs the shadow and
 * vs transformers. */
START_TEST(test_shadow_golden) {
    const char *fam = k_golden_families[_i];
    char dir[1024], h5path[1100];
    const char *root = getenv("KVREPRO_SOURCE_DIR");
    snprintf(dir, sizeof dir, "%s/fixtures/hf/%s", root != NULL ? root : KV_SOURCE_DIR, fam);
    snprintf(h5path, sizeof h5path, "%s/golden.h5", dir);
    KvModel m;
    KvError err = {{0}};
    ck_assert_msg(kv_model_load_dir(dir, &m, &err) == KV_OK, "%s", err.msg);
    /* the goldens read as the gate reads them (harness/golden.c) */
    KvGoldenFile gf;
    ck_assert_msg(kv_golden_load(h5path, &gf, &err) == KV_OK, "%s", err.msg);

    int n_scen = 0;
    double worst_sh_hf = 0.0, worst_ref_sh = 0.0, worst_ref_hf = 0.0;
    for (int s = 0; s < gf.n; s++, n_scen++) {
        const KvGoldenScenario g = gf.sc[s]; /* borrowed: gf owns the arrays */
        ck_assert_int_eq(g.vocab, m.config.vocab_size);
        KvDecodeSpec spec = {
            .batch = g.batch,
            .prompt_len = g.prompt_len,
            .prompt = g.input_ids,
            .prompt_real = g.mask,
            .new_tokens = g.steps,
            .forced = g.tokens,
        };
        KvDecodeResult r;
        ck_assert_msg(kv_decode_greedy(&m, &spec, &r, &err) == KV_OK, "%s/%s: %s", fam, g.name,
                      err.msg);
        double sh_hf = -1.0, ref_sh = -1.0;
        ck_assert_msg(kv_shadow64_rel_error(&m, g.batch, g.prompt_len, g.input_ids, g.mask,
                                            g.steps, g.tokens, g.logits, NULL, &sh_hf,
                                            &err) == KV_OK,
                      "%s/%s: %s", fam, g.name, err.msg);
        ck_assert_msg(kv_shadow64_decode_rel_error(&m, &spec, &r, NULL, &ref_sh, &err) == KV_OK,
                      "%s/%s: %s", fam, g.name, err.msg);
        const double ref_hf = rel_error_f32(r.logits, g.logits, g.steps, g.batch, g.vocab);
        fprintf(stderr, "shadow golden %s/%s: batch %lld, prompt %lld, %lld steps: transformers "
                        "vs shadow %.3g, fp32 reference vs shadow %.3g, fp32 reference vs "
                        "transformers %.3g\n",
                fam, g.name, (long long)g.batch, (long long)g.prompt_len, (long long)g.steps,
                sh_hf, ref_sh, ref_hf);
        ck_assert_msg(sh_hf <= KV_GOLDEN_MAX_REL_ERR,
                      "%s/%s: transformers vs fp64 shadow: max rel error %.3g > %.1g", fam,
                      g.name, sh_hf, KV_GOLDEN_MAX_REL_ERR);
        ck_assert_msg(ref_sh <= KV_SHADOW_MAX_REL_ERR && ref_sh > 0.0,
                      "%s/%s: fp32 reference vs fp64 shadow: max rel error %.3g outside "
                      "(0, %.1g]", fam, g.name, ref_sh, KV_SHADOW_MAX_REL_ERR);
        worst_sh_hf = sh_hf > worst_sh_hf ? sh_hf : worst_sh_hf;
        worst_ref_sh = ref_sh > worst_ref_sh ? ref_sh : worst_ref_sh;
        worst_ref_hf = ref_hf > worst_ref_hf ? ref_hf : worst_ref_hf;
        kv_decode_result_free(&r);
    }
    fprintf(stderr, "shadow golden %s: %d scenarios, max rel error: transformers vs shadow %.3g, "
                    "fp32 reference vs shadow %.3g, fp32 reference vs transformers %.3g\n",
            fam, n_scen, worst_sh_hf, worst_ref_sh, worst_ref_hf);
    ck_assert_msg(n_scen >= 6, "%s: expected the 6 golden scenarios, found %d", h5path, n_scen);
    kv_golden_file_free(&gf);
    kv_model_free(&m);
}
END_TEST

/* The logits of a prefix are bitwise those of the longer sequence (the mask
 * is causal and nothing is reduced across positions), for any `from`. */
START_TEST(test_shadow_causal) {
    KvFixtureModel fx;
    KvError err = {{0}};
    ck_assert_msg(kv_fixture_load(k_families[_i], KV_FIXTURE_DEFAULT_SEED, &fx, &err) == KV_OK,
                  "%s", err.msg);
    const KvModel *m = &fx.model;
    const int64_t V = m->config.vocab_size;
    /* Longer than twice the window, so sliding layers drop keys. */
    const int64_t n = 3 * m->config.sliding_window + 5;
    int32_t *tok = malloc((size_t)n * sizeof *tok);
    double *all = malloc((size_t)(n * V) * sizeof *all);  /* (n, V) from 0 */
    double *part = malloc((size_t)(n * V) * sizeof *part); /* (n, V) */
    ck_assert(tok != NULL && all != NULL && part != NULL);
    for (int64_t i = 0; i < n; i++) tok[i] = (int32_t)(1 + (i * 37 + 11) % (V - 1));
    ck_assert_msg(kv_shadow64_logits(m, tok, n, 0, all, &err) == KV_OK, "%s", err.msg);
    /* the plain build of the matmul block gives the vector builds' bits */
    const KvGemmPath autop = kv_gemm_path(); /* the path `all` took */
    if (autop != KV_GEMM_PORTABLE) {
        const KvGemmPath paths[] = {KV_GEMM_PORTABLE, KV_GEMM_AVX2};
        for (size_t p = 0; p < sizeof paths / sizeof paths[0]; p++) {
            if (paths[p] == autop || kv_gemm_set_path(paths[p]) != KV_OK) continue;
            ck_assert_msg(kv_shadow64_logits(m, tok, n, 0, part, &err) == KV_OK, "%s", err.msg);
            kv_gemm_set_path(KV_GEMM_AUTO);
            ck_assert_msg(memcmp(part, all, (size_t)(n * V) * sizeof *part) == 0,
                          "%s: the %s path's logits differ from the %s path's", k_families[_i],
                          kv_gemm_path_name(paths[p]), kv_gemm_path_name(autop));
        }
        kv_gemm_set_path(KV_GEMM_AUTO);
    } else {
        fprintf(stderr, "shadow_causal: no vector path here, one path checked\n");
    }
    const int64_t cuts[] = {1, m->config.sliding_window, n - 1};
    for (int c = 0; c < 3; c++) {
        const int64_t len = cuts[c];
        ck_assert_msg(kv_shadow64_logits(m, tok, len, 0, part, &err) == KV_OK, "%s", err.msg);
        ck_assert_msg(memcmp(part, all, (size_t)(len * V) * sizeof *part) == 0,
                      "%s: the first %lld positions' logits change when later tokens are added",
                      k_families[_i], (long long)len);
        ck_assert_msg(kv_shadow64_logits(m, tok, n, len, part, &err) == KV_OK, "%s", err.msg);
        ck_assert_msg(memcmp(part, all + len * V, (size_t)((n - len) * V) * sizeof *part) == 0,
                      "%s: from = %lld does not give rows %lld.. of from = 0", k_families[_i],
                      (long long)len, (long long)len);
    }
    free(tok);
    free(all);
    free(part);
    kv_fixture_free(&fx);
}
END_TEST

/* Expects KV_ERR_INPUT with a message from the call `expr`. */
#define EXPECT_INPUT(expr)                                                                    \
    do {                                                                                      \
        KvError e_ = {{0}};                                                                   \
        KvError *err_ = &e_;                                                                  \
        (void)err_;                                                                           \
        const KvStatus st_ = (expr);                                                          \
        ck_assert_msg(st_ == KV_ERR_INPUT, "%s: expected KV_ERR_INPUT, got %d (%s)", #expr,   \
                      (int)st_, e_.msg);                                                      \
        ck_assert_msg(strncmp(e_.msg, "shadow64: ", 10) == 0, "%s: message '%s'", #expr,      \
                      e_.msg);                                                                \
    } while (0)

START_TEST(test_shadow_bad_input) {
    KvFixtureModel fx;
    KvError err = {{0}};
    ck_assert_msg(kv_fixture_load("mistral-tiny", KV_FIXTURE_DEFAULT_SEED, &fx, &err) == KV_OK,
                  "%s", err.msg);
    const KvModel *m = &fx.model;
    const int32_t V = (int32_t)m->config.vocab_size;
    int32_t tok[4] = {1, 2, 3, 4};
    double out[4 * 512];
    ck_assert_int_le(V, 512);

    EXPECT_INPUT(kv_shadow64_logits(m, tok, 0, 0, out, err_));
    EXPECT_INPUT(kv_shadow64_logits(m, tok, -1, 0, out, err_));
    EXPECT_INPUT(kv_shadow64_logits(m, tok, 4, -1, out, err_));
    EXPECT_INPUT(kv_shadow64_logits(m, tok, 4, 4, out, err_));
    EXPECT_INPUT(kv_shadow64_logits(NULL, tok, 4, 0, out, err_));
    EXPECT_INPUT(kv_shadow64_logits(m, NULL, 4, 0, out, err_));
    EXPECT_INPUT(kv_shadow64_logits(m, tok, 4, 0, NULL, err_));
    tok[2] = -1;
    EXPECT_INPUT(kv_shadow64_logits(m, tok, 4, 0, out, err_));
    tok[2] = V;
    EXPECT_INPUT(kv_shadow64_logits(m, tok, 4, 0, out, err_));
    tok[2] = V - 1; /* the last id is fine */
    ck_assert_msg(kv_shadow64_logits(m, tok, 4, 3, out, &err) == KV_OK, "%s", err.msg);

    /* The decode helper: batch 2, prompt 3, 2 steps. */
    int32_t prompt[6] = {0, 5, 6, 7, 8, 9};
    uint8_t real[6] = {0, 1, 1, 1, 1, 1};
    int32_t fed[4] = {10, 11, 12, 13};
    float *logits = calloc((size_t)(2 * 2 * V), sizeof *logits); /* (2, 2, V) */
    ck_assert_ptr_nonnull(logits);
    double rel = 0.0, per[2];
    ck_assert_msg(kv_shadow64_rel_error(m, 2, 3, prompt, real, 2, fed, logits, per, &rel, &err) ==
                      KV_OK,
                  "%s", err.msg);
    ck_assert(rel == 1.0); /* zero logits: the whole shadow is the error */
    EXPECT_INPUT(kv_shadow64_rel_error(m, 0, 3, prompt, real, 2, fed, logits, per, &rel, err_));
    EXPECT_INPUT(kv_shadow64_rel_error(m, 2, 0, prompt, real, 2, fed, logits, per, &rel, err_));
    EXPECT_INPUT(kv_shadow64_rel_error(m, 2, 3, prompt, real, 0, fed, logits, per, &rel, err_));
    EXPECT_INPUT(kv_shadow64_rel_error(m, 2, 3, prompt, real, 2, fed, logits, per, NULL, err_));
    EXPECT_INPUT(kv_shadow64_rel_error(m, 2, 3, prompt, real, 2, NULL, logits, per, &rel, err_));
    real[1] = 0; /* row 0 now pad, pad, real: still left-padded */
    ck_assert_msg(kv_shadow64_rel_error(m, 2, 3, prompt, real, 2, fed, logits, per, &rel, &err) ==
                      KV_OK,
                  "%s", err.msg);
    real[1] = 1;
    real[4] = 0; /* row 1: real, pad, real: not left-padded */
    EXPECT_INPUT(kv_shadow64_rel_error(m, 2, 3, prompt, real, 2, fed, logits, per, &rel, err_));
    real[4] = 1;
    real[5] = 0; /* row 1 ends in a pad: right padding (DESIGN §2), the row alone */
    ck_assert_msg(kv_shadow64_rel_error(m, 2, 3, prompt, real, 2, fed, logits, per, &rel, &err) ==
                      KV_OK,
                  "%s", err.msg);
    real[3] = real[4] = 0; /* row 1 all pads */
    EXPECT_INPUT(kv_shadow64_rel_error(m, 2, 3, prompt, real, 2, fed, logits, per, &rel, err_));
    real[3] = real[4] = real[5] = 1;
    prompt[4] = V; /* a real prompt token out of range */
    EXPECT_INPUT(kv_shadow64_rel_error(m, 2, 3, prompt, real, 2, fed, logits, per, &rel, err_));
    prompt[4] = 8;
    prompt[0] = -7; /* a pad's id is never read */
    ck_assert_msg(kv_shadow64_rel_error(m, 2, 3, prompt, real, 2, fed, logits, per, &rel, &err) ==
                      KV_OK,
                  "%s", err.msg);
    fed[1] = -1; /* fed after step 0, row 1 */
    EXPECT_INPUT(kv_shadow64_rel_error(m, 2, 3, prompt, real, 2, fed, logits, per, &rel, err_));
    fed[1] = 11;
    fed[3] = -1; /* after the last step: never fed, never read */
    ck_assert_msg(kv_shadow64_rel_error(m, 2, 3, prompt, real, 2, fed, logits, per, &rel, &err) ==
                      KV_OK,
                  "%s", err.msg);
    logits[3 * V + 7] = NAN; /* step 1, row 1 */
    EXPECT_INPUT(kv_shadow64_rel_error(m, 2, 3, prompt, real, 2, fed, logits, per, &rel, err_));
    logits[3 * V + 7] = INFINITY;
    EXPECT_INPUT(kv_shadow64_rel_error(m, 2, 3, prompt, real, 2, fed, logits, per, &rel, err_));
    logits[3 * V + 7] = 0.0f;

    /* The spec/result wrapper: a result whose shape is not the spec's. */
    KvDecodeSpec spec = {.batch = 2, .prompt_len = 3, .prompt = prompt, .prompt_real = real,
                         .new_tokens = 2};
    KvDecodeResult r = {.steps = 2, .batch = 2, .vocab = V, .tokens = fed, .logits = logits};
    ck_assert_msg(kv_shadow64_decode_rel_error(m, &spec, &r, per, &rel, &err) == KV_OK, "%s",
                  err.msg);
    r.steps = 3;
    EXPECT_INPUT(kv_shadow64_decode_rel_error(m, &spec, &r, per, &rel, err_));
    r.steps = 2;
    r.vocab = V - 1;
    EXPECT_INPUT(kv_shadow64_decode_rel_error(m, &spec, &r, per, &rel, err_));
    r.vocab = V;
    r.batch = 1;
    EXPECT_INPUT(kv_shadow64_decode_rel_error(m, &spec, &r, per, &rel, err_));
    r.batch = 2;
    EXPECT_INPUT(kv_shadow64_decode_rel_error(m, NULL, &r, per, &rel, err_));
    EXPECT_INPUT(kv_shadow64_decode_rel_error(m, &spec, NULL, per, &rel, err_));
    /* Teacher forcing: the forced tokens are what was fed. */
    int32_t forced[4] = {V, V, 0, 0};
    spec.forced = forced;
    EXPECT_INPUT(kv_shadow64_decode_rel_error(m, &spec, &r, per, &rel, err_));
    free(logits);
    kv_fixture_free(&fx);
}
END_TEST

int main(void) {
    Suite *s = suite_create("shadow64");
    TCase *tc = tcase_create("fixtures");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, test_shadow_fixture, 0, N_FAM * N_SCENARIOS);
    tcase_add_loop_test(tc, test_shadow_causal, 0, N_FAM);
    tcase_add_test(tc, test_shadow_bad_input);
    suite_add_tcase(s, tc);
    TCase *tg = tcase_create("golden");
    tcase_set_timeout(tg, 120);
    tcase_add_loop_test(tg, test_shadow_golden, 0, 5);
    suite_add_tcase(s, tg);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
