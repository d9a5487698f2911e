/* test_real_scale.c: the real-scale scenario set and the shared prefill
 * (DESIGN §5).
 *
 * sizes: above KV_SCENARIO_FULL_MAX_W every scenario keeps its bug class at
 * its documented size (prompts around W, KV_SCENARIO_TAIL steps past the
 * crossing), and the full set is unchanged at W 16.
 * tape: a variant run that takes the reference's prefill tape gives the
 * bits of the same run computed in full (logits, tokens, probe hashes); a
 * tape for another prompt, a calibration order or a planted fault in the
 * forward's own computation is not taken; a fault in the variant's own
 * update still shows through the tape.
 * stream: the references' prefills cut from one long forward are bitwise
 * their own (stream_tape.h).
 * gate: the real-scale matrix on tiny models at W 64, every variant, eager
 * and graph, passes with and without the shared prefill (and the stream),
 * bitwise alike, calibrated once per model (on the unit with the most token
 * positions), its members run only where a tolerance decides. */
#include <check.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache_registry.h"
#include "decode.h"
#include "ensemble.h"
#include "fault.h"
#include "fixture.h"
#include "matrix.h"
#include "prefill_tape.h"
#include "scenario.h"
#include "stream_tape.h"

#define SEED KV_FIXTURE_DEFAULT_SEED

/* A tiny fixture of `family` with window w. */
static void load_window(KvFamily family, int64_t w, KvFixtureModel *fx) {
    KvError err = {{0}};
    KvConfig cfg;
    memset(fx, 0, sizeof *fx);
    ck_assert_msg(kv_fixture_config(family, KV_SIZE_TINY, &cfg, &err) == KV_OK, "%s", err.msg);
    cfg.sliding_window = w;
    size_t st_len = 0;
    ck_assert_msg(kv_fixture_build(&cfg, SEED, &fx->st, &st_len, &fx->config_json, &err) == KV_OK,
                  "%s", err.msg);
    ck_assert_msg(kv_model_load_memory(fx->config_json, strlen(fx->config_json), fx->st, st_len,
                                       "tiny-w", &fx->model, &err) == KV_OK,
                  "%s", err.msg);
}

static void build(const KvConfig *cfg, const char *name, KvScenario *sc) {
    KvError err = {{0}};
    ck_assert_msg(kv_scenario_build(cfg, name, SEED, sc, &err) == KV_OK, "%s", err.msg);
}

/* The longest real row of sc. */
static int64_t longest_row(const KvScenario *sc) {
    int64_t best = 0;
    for (int64_t b = 0; b < sc->batch; b++) {
        int64_t n = 0;
        for (int64_t t = 0; t < sc->prompt_len; t++) n += sc->real[b * sc->prompt_len + t];
        best = n > best ? n : best;
    }
    return best;
}

START_TEST(test_sizes) {
    KvError err = {{0}};
    KvConfig cfg;
    ck_assert(kv_fixture_config(KV_FAMILY_GEMMA3, KV_SIZE_TINY, &cfg, &err) == KV_OK);
    ck_assert_int_eq(kv_scenario_scale(&cfg), KV_SCALE_FULL); /* W 16 */
    KvScenario sc;
    build(&cfg, "prompt_w", &sc);
    ck_assert_int_eq(sc.new_tokens, 3 * 16 + 1);
    kv_scenario_free(&sc);

    const int64_t W = 512, T = KV_SCENARIO_TAIL;
    cfg.sliding_window = W;
    ck_assert_int_eq(kv_scenario_scale(&cfg), KV_SCALE_REAL);
    const struct {
        const char *name;
        int64_t prompt, steps;
    } want[] = {
        {"short_prompt_crosses_window", W - 8, 8 + T},
        {"prompt_w_minus_1", W - 1, 1 + T},
        {"prompt_w", W, T},
        {"prompt_w_plus_1", W + 1, T},
        {"prefill_longer_than_window", W + W / 2 + 3, T},
        {"left_padded_batch", W + W / 32, T},
        {"chunked_prefill", W + 3, T},
        {"prefix_reuse_after_wrap", W + KV_SCENARIO_LEAD, 2 + T},
        {"speculative_rollback_past_window", W + W / 2 + 9, 1 + T},
        {"right_padded_static_loop", W + 3, 5 + T},
        {"parallel_positions", W + W / 2 + 3, 6 + T},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        build(&cfg, want[i].name, &sc);
        ck_assert_msg(longest_row(&sc) == want[i].prompt && sc.new_tokens == want[i].steps,
                      "%s: prompt %lld, %lld steps; expected %lld and %lld", want[i].name,
                      (long long)longest_row(&sc), (long long)sc.new_tokens,
                      (long long)want[i].prompt, (long long)want[i].steps);
        kv_scenario_free(&sc);
    }
    /* pytorch #159855's batch: a ~1.03 W row beside a 10-token one */
    build(&cfg, "left_padded_batch", &sc);
    int64_t second = 0;
    for (int64_t t = 0; t < sc.prompt_len; t++) second += sc.real[sc.prompt_len + t];
    ck_assert_int_eq(second, 10);
    kv_scenario_free(&sc);
    /* the prefix entry and the switch: the first request has wrapped */
    build(&cfg, "prefix_reuse_after_wrap", &sc);
    ck_assert_int_eq(sc.save_after, W - KV_SCENARIO_LEAD);
    ck_assert_int_eq(sc.switch_step, 2);
    ck_assert_int_gt(sc.prompt_len, W);
    /* the entry's first slots were overwritten: positions W .. P + 1 */
    ck_assert_int_gt(sc.save_after, sc.prompt_len + sc.switch_step - W);
    /* the second request's forward crosses W */
    ck_assert_int_eq(sc.suffix_len, 2 * KV_SCENARIO_LEAD);
    ck_assert_int_gt(sc.save_after + sc.suffix_len, W);
    kv_scenario_free(&sc);
    /* chunked: a long first chunk, then one short chunk across W */
    build(&cfg, "chunked_prefill", &sc);
    ck_assert_int_eq(sc.prefill_chunk, W - KV_SCENARIO_LEAD);
    ck_assert_int_gt(sc.prompt_len, W);
    ck_assert_int_le(sc.prompt_len, 2 * sc.prefill_chunk);
    kv_scenario_free(&sc);
    /* the right-padded static loop keeps chunks of W / 2 + 1 */
    build(&cfg, "right_padded_static_loop", &sc);
    ck_assert_int_eq(sc.prefill_chunk, W / 2 + 1);
    kv_scenario_free(&sc);
}
END_TEST

/* A decode of sc on the CPU (variant NULL: the reference) with probes. */
static KvDecodeResult decode(const KvModel *m, const KvScenario *sc, const KvCacheOps *variant,
                             unsigned faults, unsigned order, KvPrefillTape *record,
                             const KvPrefillTape *play) {
    KvDecodeSpec spec = {
        .batch = sc->batch,
        .prompt_len = sc->prompt_len,
        .prompt = sc->prompt,
        .prompt_real = sc->real,
        .new_tokens = sc->new_tokens,
        .prefill_chunk = sc->prefill_chunk,
        .variant = variant,
        .faults = faults,
        .order = order,
        .record_probes = true,
        .tape_record = record,
        .tape_play = play,
    };
    KvDecodeResult r;
    KvError err = {{0}};
    ck_assert_msg(kv_decode_greedy(m, &spec, &r, &err) == KV_OK, "%s", err.msg);
    return r;
}

static bool same_bits(const KvDecodeResult *a, const KvDecodeResult *b) {
    const size_t n = (size_t)(a->steps * a->batch);
    return a->steps == b->steps && a->batch == b->batch &&
           memcmp(a->logits, b->logits, n * (size_t)a->vocab * sizeof(float)) == 0 &&
           memcmp(a->tokens, b->tokens, n * sizeof(int32_t)) == 0 &&
           memcmp(a->probe_hash, b->probe_hash, n * (size_t)a->n_probes * sizeof(uint64_t)) == 0;
}

START_TEST(test_tape) {
    KvFixtureModel fx;
    load_window(KV_FAMILY_GEMMA3, 64, &fx);
    KvScenario sc, other;
    build(&fx.model.config, "left_padded_batch", &sc);
    build(&fx.model.config, "prompt_w_plus_1", &other);
    KvPrefillTape tape = {0};
    KvDecodeResult ref = decode(&fx.model, &sc, NULL, 0, 0, &tape, NULL);
    ck_assert(tape.filled);
    ck_assert_int_eq(tape.n, sc.prompt_len);
    ck_assert(!ref.prefill_taped);

    int n_var = 0;
    const KvCacheOps *const *all = kv_cache_all(&n_var);
    for (int v = 0; v < n_var; v++) {
        KvDecodeResult taped = decode(&fx.model, &sc, all[v], 0, 0, NULL, &tape);
        KvDecodeResult full = decode(&fx.model, &sc, all[v], 0, 0, NULL, NULL);
        ck_assert_msg(taped.prefill_taped, "%s did not take the tape", all[v]->name);
        ck_assert(!full.prefill_taped);
        ck_assert_msg(same_bits(&taped, &full), "%s: the taped run differs from the full one",
                      all[v]->name);
        ck_assert_msg(same_bits(&taped, &ref), "%s: differs from the reference", all[v]->name);
        kv_decode_result_free(&taped);
        kv_decode_result_free(&full);
    }
    /* not taken: another prompt, a calibration order */
    const KvCacheOps *ring = kv_cache_find("ring");
    KvDecodeResult r = decode(&fx.model, &other, ring, 0, 0, NULL, &tape);
    ck_assert(!r.prefill_taped);
    kv_decode_result_free(&r);
    r = decode(&fx.model, &sc, NULL, 0, KV_ORDER_KEYS_REVERSED, NULL, &tape);
    ck_assert(!r.prefill_taped);
    kv_decode_result_free(&r);
    /* a fault of the forward's own computation: its prefill is its own */
    int n_faults = 0;
    const KvFaultInfo *faults = kv_fault_all(&n_faults);
    for (int i = 0; i < n_faults; i++) {
        r = decode(&fx.model, &sc, ring, faults[i].bit, 0, NULL, &tape);
        ck_assert_msg(r.prefill_taped == ((faults[i].bit & KV_FAULTS_IN_FORWARD) == 0),
                      "%s: taped %d", faults[i].name, (int)r.prefill_taped);
        kv_decode_result_free(&r);
    }
    /* a full tape is never overwritten, and a variant run records none */
    KvPrefillTape none = {0};
    r = decode(&fx.model, &sc, ring, 0, 0, &none, NULL);
    ck_assert(!none.filled);
    kv_decode_result_free(&r);

    /* the variant's own update runs on the tape's keys: index_copy storing
     * the first W rows of a prefill longer than W is seen at step 0's cache
     * probe and in the logits after it */
    KvScenario longer;
    build(&fx.model.config, "prefill_longer_than_window", &longer);
    KvPrefillTape tape2 = {0};
    KvDecodeResult ref2 = decode(&fx.model, &longer, NULL, 0, 0, &tape2, NULL);
    KvDecodeResult bad = decode(&fx.model, &longer, kv_cache_find("index_copy"),
                                KV_FAULT_PREFILL_FIRST_W, 0, NULL, &tape2);
    ck_assert(bad.prefill_taped);
    ck_assert_msg(!same_bits(&bad, &ref2), "prefill_first_w hidden by the tape");
    bool cache_probe_differs = false;
    for (int64_t p = 0; p < bad.n_probes; p++) {
        if (kv_probe_item(bad.n_probes, p) != KV_PROBE_CACHE) continue;
        cache_probe_differs = cache_probe_differs || bad.probe_hash[p * bad.batch] !=
                                                         ref2.probe_hash[p * ref2.batch];
    }
    ck_assert_msg(cache_probe_differs, "step 0's cache probes do not see the variant's write");
    kv_decode_result_free(&bad);
    kv_decode_result_free(&ref2);
    kv_prefill_tape_free(&tape2);
    kv_scenario_free(&longer);

    kv_decode_result_free(&ref);
    kv_prefill_tape_free(&tape);
    kv_scenario_free(&sc);
    kv_scenario_free(&other);
    kv_fixture_free(&fx);
}
END_TEST

/* The real-scale matrix on a tiny model of window 64, CPU only. */
static void gate_real(KvFamily family, bool share, KvReport *rep) {
    static KvGateBackend cpu_only = {&kv_backend_cpu, ""};
    int n_scen = 0, n_var = 0;
    const char *const *scen = kv_scenario_all_names(&n_scen);
    const KvCacheOps *const *all = kv_cache_all(&n_var);
    const KvGateOptions o = {
        .scenarios = scen, .n_scenarios = n_scen, .variants = all, .n_variants = n_var,
        .backends = &cpu_only, .n_backends = 1, .eager = true, .graph = true, .repeats = 1,
        .replay_every = 5, .tol = kv_tolerances_default(), .calibrate = true,
        .share_prefill = share, .prompt_seed = SEED, .shard_i = 1, .shard_n = 1,
        .full_logits_max_vocab = KV_FULL_LOGITS_MAX_VOCAB,
    };
    KvFixtureModel fx;
    load_window(family, 64, &fx);
    ck_assert_int_eq(kv_scenario_scale(&fx.model.config), KV_SCALE_REAL);
    memset(rep, 0, sizeof *rep);
    KvError err = {{0}};
    int unit = 0;
    ck_assert_msg(kv_gate_run_model(&fx.model, "tiny-w64", &o, &unit, rep, &err) == KV_OK, "%s",
                  err.msg);
    kv_fixture_free(&fx);
}

/* _i: 0 mistral (every layer slides: the context shift is judged), 1 gemma3 */
START_TEST(test_gate) {
    const KvFamily fam = _i == 0 ? KV_FAMILY_MISTRAL : KV_FAMILY_GEMMA3;
    KvReport shared, alone;
    gate_real(fam, true, &shared);
    gate_real(fam, false, &alone);
    int64_t failed = 0;
    for (int64_t i = 0; i < shared.n_comparisons; i++) {
        if (shared.comparisons[i].verdict == KV_VERDICT_FAIL) {
            if (failed++ < 5) fprintf(stderr, "FAIL: %s\n", shared.comparisons[i].message);
        }
    }
    ck_assert_int_gt(shared.n_comparisons, 0);
    ck_assert_int_eq(failed, 0);
    /* calibrated once per model: the members of one unit, the one with the
     * most token positions (rows x (prompt + decode)), and every unit
     * judged by a max_rel_err row */
    int n_scen = 0;
    const char *const *names = kv_scenario_all_names(&n_scen);
    KvFixtureModel fx;
    load_window(fam, 64, &fx);
    const char *most = NULL;
    int64_t best = -1;
    for (int i = 0; i < n_scen; i++) {
        KvScenario sc;
        build(&fx.model.config, names[i], &sc);
        if (sc.batch * (sc.prompt_len + sc.new_tokens) > best) {
            best = sc.batch * (sc.prompt_len + sc.new_tokens);
            most = names[i];
        }
        kv_scenario_free(&sc);
    }
    kv_fixture_free(&fx);
    char made[128];
    snprintf(made, sizeof made, "made once on %s", most);
    int64_t members = 0, rows = 0, shared_rows = 0;
    for (int64_t i = 0; i < shared.n_runs; i++) {
        if (strncmp(shared.runs[i].variant, "reference~", 10) == 0) {
            members++;
            ck_assert_str_eq(shared.runs[i].scenario, most);
        }
    }
    for (int64_t i = 0; i < shared.n_tolerances; i++) {
        const KvTolerance *t = &shared.tolerances[i];
        if (strncmp(t->name, "max_rel_err@", 12) != 0) continue;
        rows++;
        shared_rows += strstr(t->reason, made) != NULL;
    }
    /* the members run only where a tolerance decides something: this
     * CPU-only gate's context shift, judged on mistral (every layer
     * slides), not on gemma3 (a full layer); the shadow runs in both */
    ck_assert_int_eq(members, fam == KV_FAMILY_MISTRAL ? KV_ENSEMBLE_SIZE : 0);
    int64_t fp64_rows = 0, uncalibrated = 0;
    for (int64_t i = 0; i < shared.n_tolerances; i++) {
        fp64_rows += strncmp(shared.tolerances[i].name, "fp64_err@", 9) == 0;
        uncalibrated += strncmp(shared.tolerances[i].reason, "not calibrated: no tolerance "
                                "decides here", 40) == 0;
    }
    ck_assert_int_eq(fp64_rows, 1);
    ck_assert_int_eq(uncalibrated, fam == KV_FAMILY_MISTRAL ? 0 : 1);
    ck_assert_int_eq(rows, n_scen);
    ck_assert_int_eq(shared_rows, n_scen - 1);
    ck_assert_int_eq(shared.n_runs, alone.n_runs);
    for (int64_t i = 0; i < shared.n_runs; i++) {
        const KvRun *a = &shared.runs[i], *b = &alone.runs[i];
        ck_assert_str_eq(a->variant, b->variant);
        ck_assert(a->steps == b->steps && a->batch == b->batch);
        ck_assert_msg(memcmp(a->logits_hash, b->logits_hash,
                             (size_t)(a->steps * a->batch) * sizeof *a->logits_hash) == 0 &&
                          memcmp(a->probe_hash, b->probe_hash,
                                 (size_t)(a->steps * a->n_probes * a->batch) *
                                     sizeof *a->probe_hash) == 0,
                      "run %lld (%s %s %s): shared prefill changed its logits", (long long)i,
                      a->scenario, a->variant, a->mode);
    }
    kv_report_free(&shared);
    kv_report_free(&alone);
}
END_TEST

/* The stream (stream_tape.h): every real-scale scenario's first row is a
 * prefix of one stream, and each cut of one long forward is bitwise the
 * prefill tape a reference run of that prefix records itself: keys and
 * values, logits, greedy token and margin, every probe hash but the cache
 * probe's (a run taking a cut hashes its own cache); and a reference run
 * taking the cut decodes the bits of one that does not. A probe row's
 * prefixes hash as kv_probe_hash_bytes of each. */
START_TEST(test_stream) {
    KvFixtureModel fx;
    load_window(_i == 0 ? KV_FAMILY_GEMMA3 : KV_FAMILY_GPT_OSS, 64, &fx);
    const KvConfig *cfg = &fx.model.config;
    const char *names[] = {"prompt_w_minus_1", "prompt_w", "prefill_longer_than_window",
                           "chunked_prefill"};
    KvScenario sc[4];
    int64_t cut[4];
    for (int i = 0; i < 4; i++) {
        build(cfg, names[i], &sc[i]);
        cut[i] = sc[i].prefill_chunk > 0 ? sc[i].prefill_chunk : sc[i].prompt_len;
    }
    ck_assert_int_lt(cut[3], cut[0]); /* the chunk (W - 8) first: ascending below */
    const int64_t order[4] = {cut[3], cut[0], cut[1], cut[2]};
    const int64_t n = cut[2];
    int32_t *stream = malloc((size_t)n * sizeof *stream);
    ck_assert_ptr_nonnull(stream);
    kv_scenario_stream(cfg, SEED, n, stream);
    for (int i = 0; i < 4; i++) {
        ck_assert_msg(memcmp(sc[i].prompt, stream, (size_t)cut[i] * sizeof *stream) == 0,
                      "%s: its first row is not a prefix of the stream", names[i]);
    }
    KvStreamTape st;
    KvError err = {{0}};
    ck_assert_msg(kv_stream_tape_record(&fx.model, stream, n, order, 4, NULL, NULL, &st, &err) == KV_OK, "%s",
                  err.msg);
    ck_assert(st.filled);
    for (int i = 0; i < 4; i++) {
        ck_assert(kv_stream_tape_fits(&st, sc[i].prompt, cut[i]));
        KvPrefillTape own = {0}, got = {0};
        KvDecodeResult ref = decode(&fx.model, &sc[i], NULL, 0, 0, &own, NULL);
        ck_assert(own.filled && own.n == cut[i]);
        ck_assert_msg(kv_stream_tape_cut(&st, cut[i], &got, &err) == KV_OK, "%s", err.msg);
        const size_t kv = (size_t)(own.n_layers * own.n * own.kv_dim) * sizeof(float);
        ck_assert_msg(memcmp(own.k, got.k, kv) == 0 && memcmp(own.v, got.v, kv) == 0,
                      "%s: the cut's keys or values differ", names[i]);
        ck_assert_msg(memcmp(own.logits, got.logits, (size_t)own.vocab * sizeof(float)) == 0 &&
                          own.next_tok[0] == got.next_tok[0] && own.margin[0] == got.margin[0],
                      "%s: the cut's logits differ", names[i]);
        for (int64_t p = 0; p < own.n_probes; p++) {
            if (kv_probe_item(own.n_probes, p) == KV_PROBE_CACHE) continue;
            char name[64];
            kv_probe_name(cfg, p, name, sizeof name);
            ck_assert_msg(own.probe_hash[p] == got.probe_hash[p], "%s: probe %s differs",
                          names[i], name);
        }
        KvDecodeResult taken = decode(&fx.model, &sc[i], NULL, 0, 0, NULL, &got);
        ck_assert_msg(taken.prefill_taped, "%s: the reference did not take its cut", names[i]);
        ck_assert_msg(same_bits(&taken, &ref), "%s: the run taking the cut differs", names[i]);
        kv_decode_result_free(&taken);
        kv_decode_result_free(&ref);
        kv_prefill_tape_free(&own);
        kv_prefill_tape_free(&got);
    }
    /* another prompt, or a length that is not a cut, does not fit */
    ck_assert(!kv_stream_tape_fits(&st, sc[0].prompt, cut[0] - 1));
    stream[0] = stream[0] == 1 ? 2 : 1;
    ck_assert(!kv_stream_tape_fits(&st, stream, cut[0]));
    /* prefixes of one row hash as each prefix alone, around the slice and
     * block boundaries */
    const size_t bytes = 300 * KV_PROBE_CHUNK + 123;
    unsigned char *row = malloc(bytes);
    ck_assert_ptr_nonnull(row);
    for (size_t i = 0; i < bytes; i++) row[i] = (unsigned char)(i * 2654435761u >> 13);
    const size_t pre[] = {0, 1, KV_PROBE_CHUNK - 1, KV_PROBE_CHUNK, KV_PROBE_CHUNK + 1,
                          256 * KV_PROBE_CHUNK, 256 * KV_PROBE_CHUNK + 5, 299 * KV_PROBE_CHUNK,
                          bytes};
    const int64_t n_pre = (int64_t)(sizeof pre / sizeof pre[0]);
    uint64_t h[sizeof pre / sizeof pre[0]];
    kv_probe_hash_prefixes(row, bytes, pre, n_pre, h);
    for (int64_t j = 0; j < n_pre; j++) {
        ck_assert_msg(h[j] == kv_probe_hash_bytes(row, pre[j]), "prefix of %zu bytes", pre[j]);
    }
    free(row);
    kv_stream_tape_free(&st);
    free(stream);
    for (int i = 0; i < 4; i++) kv_scenario_free(&sc[i]);
    kv_fixture_free(&fx);
}
END_TEST

int main(int argc, char **argv) {
    Suite *s = suite_create("real_scale");
    TCase *tc = tcase_create("sizes");
    tcase_add_test(tc, test_sizes);
    suite_add_tcase(s, tc);
    tc = tcase_create("tape");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_tape);
    suite_add_tcase(s, tc);
    tc = tcase_create("stream");
    tcase_set_timeout(tc, 300);
    tcase_add_loop_test(tc, test_stream, 0, 2);
    suite_add_tcase(s, tc);
    tc = tcase_create("gate");
    tcase_set_timeout(tc, 900);
    tcase_add_loop_test(tc, test_gate, 0, 1);
    suite_add_tcase(s, tc);
    tc = tcase_create("gate_gemma3");
    tcase_set_timeout(tc, 900);
    tcase_add_loop_test(tc, test_gate, 1, 2);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    if (argc > 1) srunner_run(sr, NULL, argv[1], CK_NORMAL);
    else srunner_run_all(sr, CK_NORMAL);
    const int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? 0 : 1;
}
