/* test_variants.c: every sliding-window cache variant decodes bitwise like
 * the reference (DESIGN §2: on the CPU every variant is bitwise identical to
 * the reference), for every scenario of DESIGN §5 and both tiny families.
 *
 * The forward pass checks every cache's sentinel regions after every step
 * (kv_cpu_forward returns KV_ERR_INTERNAL on an out-of-bounds write), so
 * each decode here is also an out-of-bounds check. */
#include <check.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache.h"
#include "cache_registry.h"
#include "cpu_state.h"
#include "decode.h"
#include "fault.h"
#include "fixture.h"
#include "prng.h"
#include "scenario.h"
#include "script.h"

#define TEST_SEED KV_FIXTURE_DEFAULT_SEED
#define TEST_PROMPT_SEED 11ULL
#define N_VARIANTS 6
static const char *const k_families[] = {"gemma2-tiny", "mistral-tiny", "qwen2-tiny", "gemma3-tiny", "gpt_oss-tiny"};
#define N_FAM ((int)(sizeof k_families / sizeof k_families[0]))

/* The scenarios are the gate's own (harness/scenario.c), the extended ones
 * included, so this suite checks exactly what `kvrepro gate` runs. */
static int n_scenarios(void) {
    int n = 0;
    kv_scenario_all_names(&n);
    return n;
}
#define N_SCENARIOS n_scenarios()

static const char *scenario_name(int i) {
    int n = 0;
    return kv_scenario_all_names(&n)[i];
}

/* The captures a graph-mode decode must make: 1 for variants
 * without a host branch or shape change; cat_shift and roll re-capture once
 * when the decode crosses W (their host regime flips); dynamic once per
 * distinct attended length min(total, W - 1) over the decode steps. */
static int64_t expected_captures(const KvCacheOps *v, int64_t prompt_len, int64_t steps,
                                 int64_t w) {
    if (steps <= 1) return 0;
    /* decode step s (1 <= s < steps) starts with total = prompt_len + s - 1 */
    const int64_t first = prompt_len, last = prompt_len + steps - 2;
    if (v->host_branch) return first < w && last >= w ? 2 : 1;
    if (v->one_token_order == KV_ATTEND_BEFORE_UPDATE) {
        const int64_t cap = w - 1;
        const int64_t lo = first < cap ? first : cap;
        const int64_t hi = last < cap ? last : cap;
        return hi - lo + 1;
    }
    return 1;
}

/* The same for a right-padded batch (per-row positions): the capture key
 * sums the rows' regimes and attended lengths, so it changes at every step
 * where some row's changes. lens: (B) each row's positions after the
 * prefill. */
static int64_t expected_captures_rows(const KvCacheOps *v, const int64_t *lens, int64_t batch,
                                      int64_t steps, int64_t w) {
    if (steps <= 1) return 0;
    int64_t captures = 0, prev = -1;
    for (int64_t s = 1; s < steps; s++) {
        int64_t key = 0;
        for (int64_t b = 0; b < batch; b++) {
            const int64_t total = lens[b] + s - 1;
            if (v->host_branch) key += total >= w ? 1 : 0;
            if (v->one_token_order == KV_ATTEND_BEFORE_UPDATE) key += total < w - 1 ? total : w - 1;
        }
        if (key != prev) captures++;
        prev = key;
    }
    return captures;
}

/* Each row's positions after the prefill of a (B, P) prompt: its columns up
 * to its last real token (all P when left-padded). */
static void row_lengths(const uint8_t *real, int64_t batch, int64_t P, int64_t *lens) {
    const bool right = kv_decode_right_padded(real, batch, P);
    for (int64_t b = 0; b < batch; b++) {
        lens[b] = P;
        while (right && lens[b] > 1 && !real[b * P + lens[b] - 1]) lens[b]--;
    }
}

static KvDecodeResult scenario_decode(const KvModel *m, const char *name,
                                      const KvCacheOps *variant, KvExecMode mode,
                                      unsigned faults, int64_t *prompt_len,
                                      int64_t replay_every, int64_t *row_lens /* (B) or NULL */) {
    KvScenario sc;
    KvError err = {{0}};
    ck_assert_msg(kv_scenario_build(&m->config, name, TEST_PROMPT_SEED, &sc, &err) == KV_OK, "%s",
                  err.msg);
    KvScript script = kv_script_of_scenario(&sc);
    KvDecodeSpec spec = {
        .batch = sc.batch,
        .prompt_len = sc.prompt_len,
        .prompt = sc.prompt,
        .prompt_real = sc.real,
        .new_tokens = sc.new_tokens,
        .prefill_chunk = sc.prefill_chunk,
        .variant = variant,
        .mode = mode,
        .faults = faults,
        .replay_every = replay_every,
        .record_probes = true,
    };
    if (prompt_len != NULL) *prompt_len = sc.prompt_len;
    if (row_lens != NULL) row_lengths(sc.real, sc.batch, sc.prompt_len, row_lens);
    KvDecodeResult r;
    KvStatus st = kv_script_decode(NULL, &script, m, &spec, &r, NULL, &err);
    ck_assert_msg(st == KV_OK, "%s %s: %s", name, variant ? variant->name : "reference", err.msg);
    kv_scenario_free(&sc);
    return r;
}

/* _i = (family * N_SCENARIOS + scenario) */
START_TEST(test_variants_bitwise) {
    const char *fam = k_families[_i / N_SCENARIOS];
    const char *sc = scenario_name(_i % N_SCENARIOS);
    KvFixtureModel f;
    KvError err = {{0}};
    ck_assert_msg(kv_fixture_load(fam, TEST_SEED, &f, &err) == KV_OK, "%s", err.msg);
    const int64_t w = f.model.config.sliding_window;
    int64_t plen = 0, lens[8] = {0};
    KvDecodeResult ref = scenario_decode(&f.model, sc, NULL, KV_MODE_EAGER, 0, &plen, 0, lens);
    bool per_row = false; /* right-padded: rows at their own positions */
    for (int64_t b = 0; b < ref.batch; b++) per_row = per_row || lens[b] != plen;
    int count = 0;
    const KvCacheOps *const *all = kv_cache_all(&count);
    ck_assert_int_eq(count, N_VARIANTS);
    static const char *const mode_name[] = {"eager", "graph"};
    for (int v = 0; v < count; v++) {
        for (int mode = KV_MODE_EAGER; mode <= KV_MODE_GRAPH; mode++) {
            /* Replay check every 7th step: K = 3 runs from one snapshot. */
            KvDecodeResult r = scenario_decode(&f.model, sc, all[v], (KvExecMode)mode, 0, NULL, 7, NULL);
            ck_assert_msg(r.replays_checked > 0 && r.replay_mismatch_step < 0,
                          "%s %s %s (%s): replay check: %lld steps checked, mismatch at %lld",
                          fam, sc, all[v]->name, mode_name[mode],
                          (long long)r.replays_checked, (long long)r.replay_mismatch_step);
            ck_assert_int_eq(r.steps, ref.steps);
            size_t per_step = (size_t)(ref.batch * ref.vocab);
            for (int64_t s = 0; s < ref.steps; s++) {
                if (memcmp(r.logits + (size_t)s * per_step, ref.logits + (size_t)s * per_step,
                           per_step * sizeof(float)) != 0) {
                    ck_abort_msg("%s %s: variant %s (%s) differs from the reference at step %lld "
                                 "(window %lld, seeds %llu/%llu)",
                                 fam, sc, all[v]->name, mode_name[mode], (long long)s,
                                 (long long)w, (unsigned long long)TEST_SEED,
                                 (unsigned long long)TEST_PROMPT_SEED);
                }
            }
            ck_assert_msg(memcmp(r.tokens, ref.tokens,
                                 (size_t)(ref.steps * ref.batch) * sizeof(int32_t)) == 0,
                          "%s %s %s (%s): tokens differ", fam, sc, all[v]->name,
                          mode_name[mode]);
            /* Every probe, including the layout-independent cache view,
             * hashes the same as the reference's. */
            ck_assert_int_eq(r.n_probes, ref.n_probes);
            ck_assert_int_gt(r.n_probes, 0);
            const size_t np = (size_t)(ref.steps * ref.n_probes * ref.batch);
            for (size_t i = 0; i < np; i++) {
                if (r.probe_hash[i] != ref.probe_hash[i]) {
                    char name[64];
                    kv_probe_name(&f.model.config, (int64_t)(i / (size_t)ref.batch) % ref.n_probes,
                                  name, sizeof name);
                    ck_abort_msg("%s %s %s (%s): probe %s differs at step %zu row %zu", fam,
                                 sc, all[v]->name, mode_name[mode], name,
                                 i / (size_t)(ref.n_probes * ref.batch), i % (size_t)ref.batch);
                }
            }
            const int64_t want =
                mode != KV_MODE_GRAPH ? 0
                : per_row ? expected_captures_rows(all[v], lens, ref.batch, ref.steps, w)
                          : expected_captures(all[v], plen, ref.steps, w);
            ck_assert_msg(r.graphs_captured == want,
                          "%s %s %s (%s): %lld graph captures, expected %lld", fam, sc,
                          all[v]->name, mode_name[mode], (long long)r.graphs_captured,
                          (long long)want);
            /* The budget the gate judges graph runs by (KvCacheOps.graph_budget)
             * holds for every clean decode; dynamic's is exact. */
            int64_t budget = 1;
            for (int64_t b = 0; b < (per_row ? ref.batch : 1); b++) {
                budget += all[v]->graph_budget(w, per_row ? lens[b] : plen, ref.steps - 1) - 1;
            }
            /* exact for dynamic on one row; rows' changes may coincide */
            ck_assert_msg(r.graphs_captured <= budget &&
                              (!all[v]->host_shape || mode != KV_MODE_GRAPH || per_row ||
                               r.graphs_captured == budget),
                          "%s %s %s (%s): %lld graph captures, budget %lld", fam, sc,
                          all[v]->name, mode_name[mode], (long long)r.graphs_captured,
                          (long long)budget);
            kv_decode_result_free(&r);
        }
    }
    kv_decode_result_free(&ref);
    kv_fixture_free(&f);
}
END_TEST

/* The scripted scenarios (DESIGN §5), each judged against its fresh twin:
 * prefix reuse after wrap (a second request restored from a prefix entry
 * saved before the wrap, fed its suffix) and speculative rollback past the
 * window (drafts verified at 1.5 W in one forward, rolled back to the
 * accepted ones). The decode after the switch is bitwise the same as that
 * context run from scratch, for the reference and every variant in both
 * modes (the reference's equality with each variant is
 * test_variants_bitwise's). Under the planted prefix_alias the first change
 * is exactly the switch step: the restored slots were overwritten after the
 * save (by the first request's later tokens; by the rejected drafts).
 * _i / 2: family, then mistral_mixed-tiny; _i % 2: the scenario. */
static const char *const k_scripted[2] = {"prefix_reuse_after_wrap",
                                          "speculative_rollback_past_window"};

START_TEST(test_prefix_reuse_equals_fresh) {
    const char *fam = _i / 2 < N_FAM ? k_families[_i / 2] : "mistral_mixed-tiny";
    const char *name = k_scripted[_i % 2];
    const bool spec = _i % 2 == 1;
    KvFixtureModel f;
    KvError err = {{0}};
    ck_assert_msg(kv_fixture_load(fam, TEST_SEED, &f, &err) == KV_OK, "%s", err.msg);
    KvScenario sc, fresh;
    ck_assert_msg(kv_scenario_build(&f.model.config, name, TEST_PROMPT_SEED, &sc, &err) == KV_OK,
                  "%s", err.msg);
    ck_assert(kv_scenario_switches(&sc));
    const int64_t w = f.model.config.sliding_window;
    ck_assert_int_gt(sc.prompt_len, w);
    if (!spec) {
        /* the first request wraps before the switch; the suffix crosses W */
        ck_assert_int_lt(sc.save_after, w);
        ck_assert_int_gt(sc.save_after + sc.suffix_len, w);
    } else {
        /* saved past W, drafts verified at once, >= 2 rejected; the suffix
         * is the accepted drafts; rollback right after the verification */
        ck_assert_int_gt(sc.save_after, w);
        ck_assert_int_ge(sc.prompt_len - sc.save_after, sc.suffix_len + 2);
        ck_assert_int_eq(sc.switch_step, 1);
        ck_assert(memcmp(sc.suffix, sc.prompt + sc.save_after,
                         (size_t)sc.suffix_len * sizeof *sc.suffix) == 0);
    }
    ck_assert_msg(kv_scenario_fresh(&sc, &fresh, &err) == KV_OK, "%s", err.msg);
    ck_assert_int_eq(fresh.new_tokens, sc.new_tokens - sc.switch_step);
    const int64_t V = f.model.config.vocab_size, K = sc.switch_step;
    KvDecodeSpec fs = {.batch = 1, .prompt_len = fresh.prompt_len, .prompt = fresh.prompt,
                       .prompt_real = fresh.real, .new_tokens = fresh.new_tokens};
    KvDecodeResult twin;
    ck_assert_msg(kv_decode_greedy(&f.model, &fs, &twin, &err) == KV_OK, "%s", err.msg);
    int count = 0;
    const KvCacheOps *const *all = kv_cache_all(&count);
    for (int v = -1; v < count; v++) {
        for (int mode = KV_MODE_EAGER; mode <= KV_MODE_GRAPH; mode++) {
            if (v < 0 && mode == KV_MODE_GRAPH) continue;
            const KvCacheOps *var = v < 0 ? NULL : all[v];
            KvDecodeResult r = scenario_decode(&f.model, name, var,
                                               (KvExecMode)mode, 0, NULL, 5, NULL);
            ck_assert_int_eq(r.steps, K + twin.steps);
            for (int64_t s = 0; s < twin.steps; s++) {
                ck_assert_msg(memcmp(r.logits + (s + K) * V, twin.logits + s * V,
                                     (size_t)V * sizeof(float)) == 0 &&
                                  r.tokens[s + K] == twin.tokens[s],
                              "%s %s %s (%s): step %lld after the switch differs from the fresh run",
                              name, fam, var ? var->name : "reference", mode ? "graph" : "eager",
                              (long long)s);
            }
            kv_decode_result_free(&r);
        }
    }
    /* prefix_alias on a wrapped variant: equal up to the switch, not at it */
    KvDecodeResult clean = scenario_decode(&f.model, name,
                                           kv_cache_find("ring"), KV_MODE_EAGER, 0, NULL, 0, NULL);
    KvDecodeResult alias =
        scenario_decode(&f.model, name, kv_cache_find("ring"), KV_MODE_EAGER,
                        KV_FAULT_PREFIX_ALIAS, NULL, 0, NULL);
    ck_assert_msg(memcmp(clean.logits, alias.logits, (size_t)(K * V) * sizeof(float)) == 0,
                  "%s %s: prefix_alias changed a step before the switch", name, fam);
    ck_assert_msg(memcmp(clean.logits + K * V, alias.logits + K * V, (size_t)V * sizeof(float)) != 0,
                  "%s %s: prefix_alias left the switch step unchanged", name, fam);
    kv_decode_result_free(&clean);
    kv_decode_result_free(&alias);
    /* the export-style static layer is caught here too (DESIGN §7):
     * the first request is past W from its prefill on */
    clean = scenario_decode(&f.model, name, kv_cache_find("index_copy"),
                            KV_MODE_EAGER, 0, NULL, 0, NULL);
    KvDecodeResult fixed = scenario_decode(&f.model, name,
                                           kv_cache_find("index_copy"), KV_MODE_EAGER,
                                           KV_FAULT_STATIC_LAYER, NULL, 0, NULL);
    ck_assert_msg(memcmp(clean.logits, fixed.logits, (size_t)(clean.steps * V) * sizeof(float)) != 0,
                  "%s: static_layer left %s unchanged", fam, name);
    kv_decode_result_free(&clean);
    kv_decode_result_free(&fixed);
    /* A script the decode cannot follow is refused before the backend. */
    KvDecodeSpec bad = {.batch = 1, .prompt_len = sc.prompt_len, .prompt = sc.prompt,
                        .prompt_real = sc.real, .new_tokens = sc.new_tokens};
    KvScript bad_script = {.save_after = sc.prompt_len, .switch_step = K,
                           .suffix_len = sc.suffix_len, .suffix = sc.suffix};
    KvDecodeResult none;
    ck_assert_int_eq(kv_script_decode(NULL, &bad_script, &f.model, &bad, &none, NULL, &err),
                     KV_ERR_INPUT);
    ck_assert_msg(strstr(err.msg, "save_after") != NULL, "%s", err.msg);
    kv_decode_result_free(&twin);
    kv_scenario_free(&fresh);
    kv_scenario_free(&sc);
    kv_fixture_free(&f);
}
END_TEST

/* The right-padded scenarios (DESIGN §2, §5: transformers #44742's static-shape loop
 * and llama.cpp #14097's parallel sequences): every row of the batch is
 * bitwise the row decoded alone (its real tokens, no pads), so rows at
 * different positions keep their own windows; the variants' equality with
 * the batched reference is test_variants_bitwise's. The rows sit at
 * different positions and cross W at different decode steps. Under the
 * planted pad_slots (right pads stored as positions) a row with trailing
 * pads differs from its clean run, and the export-style static_layer is
 * caught too. _i / 2: family, then mistral_mixed-tiny; _i % 2: scenario. */
static const char *const k_right_padded[2] = {"right_padded_static_loop", "parallel_positions"};

START_TEST(test_right_padded_rows_equal_alone) {
    const char *fam = _i / 2 < N_FAM ? k_families[_i / 2] : "mistral_mixed-tiny";
    const char *name = k_right_padded[_i % 2];
    KvFixtureModel f;
    KvError err = {{0}};
    ck_assert_msg(kv_fixture_load(fam, TEST_SEED, &f, &err) == KV_OK, "%s", err.msg);
    KvScenario sc;
    ck_assert_msg(kv_scenario_build(&f.model.config, name, TEST_PROMPT_SEED, &sc, &err) == KV_OK,
                  "%s", err.msg);
    const int64_t B = sc.batch, P = sc.prompt_len, V = f.model.config.vocab_size;
    const int64_t w = f.model.config.sliding_window;
    ck_assert(kv_decode_right_padded(sc.real, B, P));
    int64_t lens[8] = {0};
    row_lengths(sc.real, B, P, lens);
    /* the rows cross W at different decode steps, every one inside the
     * decode (a row of lens[b] >= W positions is past it from step 0) */
    for (int64_t b = 0; b < B; b++) {
        const int64_t cross = lens[b] >= w ? 0 : w - lens[b];
        ck_assert_int_lt(cross, sc.new_tokens - 1);
        for (int64_t c = 0; c < b; c++) {
            ck_assert_int_ne(cross, lens[c] >= w ? 0 : w - lens[c]);
        }
    }
    if (sc.prefill_chunk > 0) ck_assert_int_eq(P % sc.prefill_chunk, 0); /* one chunk shape */
    KvDecodeResult both = scenario_decode(&f.model, name, NULL, KV_MODE_EAGER, 0, NULL, 0, NULL);
    ck_assert_int_eq(both.steps, sc.new_tokens);
    for (int64_t b = 0; b < B; b++) {
        KvDecodeSpec one = {.batch = 1, .prompt_len = lens[b], .prompt = sc.prompt + b * P,
                            .prompt_real = sc.real + b * P, .new_tokens = sc.new_tokens};
        KvDecodeResult alone;
        ck_assert_msg(kv_decode_greedy(&f.model, &one, &alone, &err) == KV_OK, "%s", err.msg);
        for (int64_t s = 0; s < sc.new_tokens; s++) {
            ck_assert_msg(memcmp(alone.logits + s * V, both.logits + (s * B + b) * V,
                                 (size_t)V * sizeof(float)) == 0 &&
                              alone.tokens[s] == both.tokens[s * B + b],
                          "%s %s: row %lld differs from decoding it alone at step %lld", fam,
                          name, (long long)b, (long long)s);
        }
        kv_decode_result_free(&alone);
    }
    /* the planted faults this scenario must catch, on one variant each */
    static const struct {
        unsigned fault;
        const char *variant;
    } k_caught[] = {{KV_FAULT_PAD_SLOTS, "ring"}, {KV_FAULT_PAD_SLOTS, "cat_shift"},
                    {KV_FAULT_STATIC_LAYER, "index_copy"}, {KV_FAULT_STALE_SCALAR, "ring"}};
    for (size_t k = 0; k < sizeof k_caught / sizeof k_caught[0]; k++) {
        const KvCacheOps *var = kv_cache_find(k_caught[k].variant);
        const KvExecMode mode =
            k_caught[k].fault == KV_FAULT_STALE_SCALAR ? KV_MODE_GRAPH : KV_MODE_EAGER;
        KvDecodeResult bad =
            scenario_decode(&f.model, name, var, mode, k_caught[k].fault, NULL, 0, NULL);
        char fname[64];
        kv_fault_names(k_caught[k].fault, fname, sizeof fname);
        ck_assert_msg(memcmp(bad.logits, both.logits,
                             (size_t)(both.steps * B * V) * sizeof(float)) != 0,
                      "%s %s: planted %s on %s left every logit unchanged", fam, name, fname,
                      var->name);
        kv_decode_result_free(&bad);
    }
    kv_decode_result_free(&both);
    kv_scenario_free(&sc);
    kv_fixture_free(&f);
}
END_TEST

/* Right padding's input rules (DESIGN §2): a real token after a trailing
 * pad in one forward is refused, and a state without per-row positions
 * refuses a right-padded row (it would store the pads as positions). */
START_TEST(test_right_padding_rules) {
    KvFixtureModel f;
    KvError err = {{0}};
    ck_assert_msg(kv_fixture_load("mistral-tiny", TEST_SEED, &f, &err) == KV_OK, "%s", err.msg);
    KvCpuState st;
    const int32_t tok[2 * 4] = {5, 6, 0, 7, 5, 6, 7, 8};
    const uint8_t gap[2 * 4] = {1, 1, 0, 1, 1, 1, 1, 1};   /* row 0: real after a pad */
    const uint8_t right[2 * 4] = {1, 1, 0, 0, 1, 1, 1, 1}; /* row 0 right-padded */
    ck_assert(kv_cpu_state_init(&st, &f.model, 2, 16, 4, kv_cache_find("ring"), &err) == KV_OK);
    ck_assert_int_eq(kv_cpu_forward(&st, tok, right, 4, NULL, &err), KV_ERR_INPUT);
    ck_assert_msg(strstr(err.msg, "per-row positions") != NULL, "%s", err.msg);
    ck_assert_int_eq(kv_cpu_state_set_per_row(&st, &err), KV_OK);
    ck_assert_int_eq(kv_cpu_forward(&st, tok, gap, 4, NULL, &err), KV_ERR_INPUT);
    ck_assert_msg(strstr(err.msg, "trailing pad") != NULL, "%s", err.msg);
    ck_assert_int_eq(kv_cpu_forward(&st, tok, right, 4, NULL, &err), KV_OK);
    /* row 0 stored 2 positions, row 1 four; a later switch is refused */
    ck_assert_int_eq(st.ref.lag[0], 2);
    ck_assert_int_eq(st.ref.lag[1], 0);
    ck_assert_int_eq(kv_cpu_state_set_per_row(&st, &err), KV_ERR_INPUT);
    kv_cpu_state_free(&st);
    kv_fixture_free(&f);
}
END_TEST

/* Multi-token decode (DESIGN §3: any n >= 1 at any point): the reference's
 * own greedy continuation is fed back k tokens per forward (k = 2, 3), as a
 * speculative verifier would, eagerly and through a captured k-token graph;
 * each forward's logits must be bitwise the reference's.
 * _i = (family * 2 + (k - 2)) * 2 + mode. */
START_TEST(test_variants_multi_token) {
    const char *fam = k_families[_i / 4];
    const int64_t k = 2 + (_i / 2) % 2;
    const bool graph = _i % 2 == 1;
    KvFixtureModel f;
    KvError err = {{0}};
    ck_assert_msg(kv_fixture_load(fam, TEST_SEED, &f, &err) == KV_OK, "%s", err.msg);
    const KvModel *m = &f.model;
    const int64_t w = m->config.sliding_window;
    const int64_t V = m->config.vocab_size;
    const char *sc = "short_prompt_crosses_window";
    KvScenario scen;
    ck_assert(kv_scenario_build(&m->config, sc, TEST_PROMPT_SEED, &scen, &err) == KV_OK);
    int64_t plen = 0;
    KvDecodeResult greedy = scenario_decode(m, sc, NULL, KV_MODE_EAGER, 0, &plen, 0, NULL);
    /* prompt + continuation, fed as: the prompt at once, then k at a time */
    const int64_t total = plen + greedy.steps;
    int32_t *seq = malloc((size_t)total * sizeof *seq);
    uint8_t *real = malloc((size_t)total);
    ck_assert(seq != NULL && real != NULL);
    memcpy(seq, scen.prompt, (size_t)plen * sizeof *seq); /* one row, no padding */
    kv_scenario_free(&scen);
    for (int64_t i = 0; i < greedy.steps; i++) seq[plen + i] = greedy.tokens[i];
    memset(real, 1, (size_t)total);
    ck_assert_msg(greedy.steps - 1 >= 3 * w, "decode must run 3W past the window");

    int count = 0;
    const KvCacheOps *const *all = kv_cache_all(&count);
    float *ref_logits = malloc((size_t)V * sizeof(float) * (size_t)(total / k + 2));
    float *got = malloc((size_t)V * sizeof(float));
    ck_assert(ref_logits != NULL && got != NULL);
    for (int v = -1; v < count; v++) {
        /* The CPU backend's table, as the decode driver drives it. */
        const KvBackendOps *ops = &kv_backend_cpu;
        const KvBackendSetup setup = {.batch = 1, .max_len = total,
                                      .max_chunk = plen > k ? plen : k,
                                      .variant = v < 0 ? NULL : all[v]};
        KvBackend *b = NULL;
        KvBackendStep out;
        ck_assert_msg(ops->create(m, &setup, &b, &err) == KV_OK, "%s", err.msg);
        ck_assert_msg(ops->set_input(b, seq, real, plen, &err) == KV_OK, "%s", err.msg);
        ck_assert_msg(ops->forward(b, plen, &err) == KV_OK, "%s", err.msg);
        KvGraphRunner runner;
        ck_assert(kv_graph_runner_init(&runner, m->config.num_layers, (KvRecapturePolicy){0}, &err) == KV_OK);
        int64_t calls = 0;
        for (int64_t off = plen; off + k <= total; off += k, calls++) {
            /* The host writes the step's tokens into memory, then runs or
             * replays (sentinels are checked as each forward finishes). */
            KvStatus rc = ops->set_input(b, seq + off, real + off, k, &err);
            if (rc == KV_OK) {
                rc = graph && v >= 0
                         ? kv_graph_runner_step(&runner, ops, b, m->config.num_layers, k, &err)
                         : ops->forward(b, k, &err);
            }
            if (rc == KV_OK) rc = ops->read_step(b, &out, &err);
            ck_assert_msg(rc == KV_OK, "%s: %s", v < 0 ? "reference" : all[v]->name, err.msg);
            memcpy(got, out.logits, (size_t)V * sizeof(float));
            float *want = ref_logits + calls * V;
            if (v < 0) {
                memcpy(want, got, (size_t)V * sizeof(float));
            } else {
                ck_assert_msg(memcmp(want, got, (size_t)V * sizeof(float)) == 0,
                              "%s: %s (%s) with %lld tokens per forward differs from the "
                              "reference at forward %lld (positions %lld..%lld)",
                              fam, all[v]->name, graph ? "graph" : "eager", (long long)k,
                              (long long)calls, (long long)off, (long long)(off + k - 1));
            }
        }
        if (graph && v >= 0) {
            ck_assert_msg(runner.captures >= 1, "%s: no graph captured", all[v]->name);
        }
        kv_graph_runner_free(&runner);
        ops->destroy(b);
    }
    free(ref_logits);
    free(got);
    free(seq);
    free(real);
    kv_decode_result_free(&greedy);
    kv_fixture_free(&f);
}
END_TEST

/* Graph mode really freezes scalars: with the position advanced from a
 * captured host scalar (KV_FAULT_STALE_SCALAR), eager decoding is untouched
 * (the scalar is fresh every launch), the first replay is still right, and
 * the second replay re-uses the captured position, so its logits differ. */
START_TEST(test_graph_freezes_scalars) {
    KvFixtureModel f;
    KvError err = {{0}};
    ck_assert_msg(kv_fixture_load(k_families[_i], TEST_SEED, &f, &err) == KV_OK, "%s", err.msg);
    const char *sc = "prefill_longer_than_window"; /* no re-capture during the decode */
    const KvCacheOps *ring = kv_cache_find("ring");
    ck_assert_ptr_nonnull(ring);
    KvDecodeResult clean = scenario_decode(&f.model, sc, ring, KV_MODE_GRAPH, 0, NULL, 0, NULL);
    KvDecodeResult eager = scenario_decode(&f.model, sc, ring, KV_MODE_EAGER, KV_FAULT_STALE_SCALAR, NULL, 0, NULL);
    KvDecodeResult graph = scenario_decode(&f.model, sc, ring, KV_MODE_GRAPH, KV_FAULT_STALE_SCALAR, NULL, 0, NULL);
    const size_t per = (size_t)(clean.batch * clean.vocab) * sizeof(float);
    ck_assert_msg(memcmp(clean.logits, eager.logits, per * (size_t)clean.steps) == 0,
                  "the stale scalar must be invisible in eager mode");
    ck_assert_int_eq(graph.graphs_captured, 1);
    /* step 0: prefill; step 1: first replay; step 2: second replay */
    ck_assert_msg(memcmp(clean.logits + 1 * (per / sizeof(float)), graph.logits + 1 * (per / sizeof(float)), per) == 0,
                  "first replay should still be right");
    ck_assert_msg(memcmp(clean.logits + 2 * (per / sizeof(float)), graph.logits + 2 * (per / sizeof(float)), per) != 0,
                  "%s: a position captured by value must change the logits after the first "
                  "replay, or graph mode is not freezing scalars", k_families[_i]);
    kv_decode_result_free(&clean);
    kv_decode_result_free(&eager);
    kv_decode_result_free(&graph);
    kv_fixture_free(&f);
}
END_TEST

/* The replay check can fail: with a reduction whose order changes from one
 * execution to the next (KV_FAULT_ATOMIC_REDUCTION), replays of the same
 * step from one snapshot differ, in eager and in graph mode, at the first
 * checked step. _i = mode. */
START_TEST(test_replay_check_catches_nondeterminism) {
    KvFixtureModel f;
    KvError err = {{0}};
    ck_assert_msg(kv_fixture_load("mistral-tiny", TEST_SEED, &f, &err) == KV_OK, "%s", err.msg);
    const KvCacheOps *ring = kv_cache_find("ring");
    KvDecodeResult r = scenario_decode(&f.model, "short_prompt_crosses_window", ring, (KvExecMode)_i,
                                       KV_FAULT_ATOMIC_REDUCTION, NULL, 4, NULL);
    ck_assert_msg(r.replay_mismatch_step == 4,
                  "replay check should flag step 4 (the first checked), flagged %lld",
                  (long long)r.replay_mismatch_step);
    kv_decode_result_free(&r);
    kv_fixture_free(&f);
}
END_TEST

/* An out-of-bounds cache write fails the decode: a float written just
 * before a sliding layer's first key slot (where a wrong index would land)
 * makes the next forward return KV_ERR_INTERNAL naming layer and variant.
 * _i = variant index. */
START_TEST(test_sentinel_write_fails_forward) {
    KvFixtureModel f;
    KvError err = {{0}};
    ck_assert_msg(kv_fixture_load("mistral-tiny", TEST_SEED, &f, &err) == KV_OK, "%s", err.msg);
    int count = 0;
    const KvCacheOps *v = kv_cache_all(&count)[_i];
    KvCpuState st;
    ck_assert(kv_cpu_state_init(&st, &f.model, 1, 64, 8, v, &err) == KV_OK);
    int32_t tok[8] = {3, 4, 5, 6, 7, 8, 9, 10};
    uint8_t real[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    ck_assert_msg(kv_cpu_forward(&st, tok, real, 8, NULL, &err) == KV_OK, "%s", err.msg);
    const KvCacheView view = v->view(st.caches[0]);
    float *before = (float *)view.k - 1; /* inside the front guard region */
    const float saved = *before;
    *before = 1.0f;
    ck_assert_int_eq(kv_cpu_forward(&st, tok, real, 1, NULL, &err), KV_ERR_INTERNAL);
    ck_assert_msg(strstr(err.msg, "sentinel") != NULL && strstr(err.msg, "layer 0") != NULL &&
                      strstr(err.msg, v->name) != NULL,
                  "%s", err.msg);
    *before = saved;
    kv_cpu_state_free(&st);
    kv_fixture_free(&f);
}
END_TEST

int main(void) {
    Suite *s = suite_create("variants");
    TCase *tc = tcase_create("cpu");
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, test_variants_bitwise, 0, N_FAM * N_SCENARIOS);
    tcase_add_loop_test(tc, test_variants_multi_token, 0, N_FAM * 4);
    tcase_add_loop_test(tc, test_prefix_reuse_equals_fresh, 0, 2 * (N_FAM + 1));
    tcase_add_loop_test(tc, test_right_padded_rows_equal_alone, 0, 2 * (N_FAM + 1));
    tcase_add_test(tc, test_right_padding_rules);
    tcase_add_loop_test(tc, test_graph_freezes_scalars, 0, N_FAM);
    tcase_add_loop_test(tc, test_replay_check_catches_nondeterminism, 0, 2);
    tcase_add_loop_test(tc, test_sentinel_write_fails_forward, 0, N_VARIANTS);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
