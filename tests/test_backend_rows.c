/* test_backend_rows.c: rows at their own positions as one single-row run
 * per row (engine/backend_rows.h), the way the CUDA backend runs a
 * right-padded batch, proven here on the CPU: the adapter over the CPU
 * backend must equal the CPU reference's own per-row mode bitwise (logits,
 * tokens, margins at every step, the decode steps' probe hashes, the graph
 * captures), on the gate's two right-padded scenarios
 * (right_padded_static_loop: chunked prefill where short rows feed chunks
 * of only pads; parallel_positions: one prefill, rows crossing the window
 * at different steps), for the reference layout and all six variants,
 * eager and graph, with the replay check, and teacher-forced in graph
 * mode. A row run alone is bitwise the same row in the adapter's batch by
 * construction; what this test proves is the adapter's bookkeeping (which
 * tokens each row feeds, kept outputs, snapshots of its host state, summed
 * capture keys) without a GPU. The same adapter over the CUDA backend is
 * test_cuda_forward's (device only). */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "backend_rows.h"
#include "cache.h"
#include "cache_registry.h"
#include "decode.h"
#include "fault.h"
#include "fixture.h"
#include "forward.h"
#include "scenario.h"

#define TEST_PROMPT_SEED 23ULL

static const char *const k_families[] = {"gemma2-tiny", "mistral-tiny", "qwen2-tiny",
                                          "gemma3-tiny", "gpt_oss-tiny", "mistral_mixed-tiny"};
#define N_FAMILIES 6
static const char *const k_scenarios[] = {"right_padded_static_loop", "parallel_positions"};
#define N_SCENARIOS 2

/* ---- the adapter over the CPU backend, as a backend table ---- */

static KvRows *rows_of(KvBackend *b) { return (KvRows *)(void *)b; }
static const KvRows *rows_of_const(const KvBackend *b) { return (const KvRows *)(const void *)b; }

static KvStatus ad_query(char *device, size_t device_len, KvError *err) {
    (void)err;
    if (device != NULL && device_len > 0) snprintf(device, device_len, "cpu rows");
    return KV_OK;
}
static KvStatus ad_create(const KvModel *m, const KvBackendSetup *setup, KvBackend **out,
                          KvError *err) {
    KvRows *r = NULL;
    const KvStatus st = kv_rows_create(&kv_backend_cpu, NULL, m, setup, &r, err);
    *out = (KvBackend *)(void *)r;
    return st;
}
static void ad_destroy(KvBackend *b) { kv_rows_destroy(rows_of(b)); }
static KvStatus ad_set_input(KvBackend *b, const int32_t *t, const uint8_t *r, int64_t n,
                             KvError *err) {
    return kv_rows_set_input(rows_of(b), t, r, n, err);
}
static KvStatus ad_forward(KvBackend *b, int64_t n, KvError *err) {
    return kv_rows_forward(rows_of(b), n, err);
}
static void ad_layer_key(const KvBackend *b, int64_t layer, int64_t n, int64_t *regime,
                         int64_t *slots) {
    kv_rows_layer_key(rows_of_const(b), layer, n, regime, slots);
}
static KvStatus ad_capture(KvBackend *b, int64_t n, KvError *err) {
    return kv_rows_capture(rows_of(b), n, err);
}
static KvStatus ad_replay(KvBackend *b, KvError *err) { return kv_rows_replay(rows_of(b), err); }
static KvStatus ad_save(KvBackend *b, int slot, KvError *err) {
    return kv_rows_snapshot(rows_of(b), slot, true, err);
}
static KvStatus ad_load(KvBackend *b, int slot, KvError *err) {
    return kv_rows_snapshot(rows_of(b), slot, false, err);
}
static KvStatus ad_read_step(KvBackend *b, KvBackendStep *out, KvError *err) {
    return kv_rows_read_step(rows_of(b), out, err);
}
static bool ad_take_nonfinite(KvBackend *b, KvNonfinite *out) {
    return kv_rows_take_nonfinite(rows_of(b), out);
}
static void ad_stats(const KvBackend *b, KvBackendStats *out) {
    kv_rows_stats(rows_of_const(b), out);
}

static const KvBackendOps k_cpu_rows = {
    .name = "cpu_rows",
    .host = true,
    .per_row = true,
    .query = ad_query,
    .create = ad_create,
    .destroy = ad_destroy,
    .set_input = ad_set_input,
    .forward = ad_forward,
    .layer_key = ad_layer_key,
    .capture = ad_capture,
    .replay = ad_replay,
    .snapshot_save = ad_save,
    .snapshot_load = ad_load,
    .read_step = ad_read_step,
    .take_nonfinite = ad_take_nonfinite,
    .stats = ad_stats,
};

/* ---- helpers ---- */

/* 0: the reference layout; 1..: the variants */
static const KvCacheOps *impl(int i) {
    int count = 0;
    const KvCacheOps *const *all = kv_cache_all(&count);
    return i == 0 || i > count ? NULL : all[i - 1];
}
static int impl_count(void) {
    int count = 0;
    (void)kv_cache_all(&count);
    return count + 1;
}

static KvDecodeResult run(const KvBackendOps *ops, const KvModel *m, const KvDecodeSpec *spec,
                          const char *what) {
    KvDecodeResult r;
    KvBackendStats stats;
    KvError err = {{0}};
    memset(&stats, 0, sizeof stats);
    const KvStatus st = kv_decode_run(ops, m, spec, &r, &stats, &err);
    ck_assert_msg(st == KV_OK, "%s on %s: %d: %s", what, ops->name, (int)st, err.msg);
    return r;
}

/* a (native per-row) vs b (the adapter), bitwise. */
static void assert_same(const KvDecodeResult *a, const KvDecodeResult *b, const char *what) {
    ck_assert_int_eq(a->steps, b->steps);
    const int64_t B = a->batch, V = a->vocab;
    for (int64_t s = 0; s < a->steps; s++) {
        for (int64_t r = 0; r < B; r++) {
            ck_assert_msg(memcmp(a->logits + (s * B + r) * V, b->logits + (s * B + r) * V,
                                 (size_t)V * sizeof(float)) == 0,
                          "%s: step %lld row %lld: logits differ", what, (long long)s,
                          (long long)r);
            ck_assert_msg(a->tokens[s * B + r] == b->tokens[s * B + r],
                          "%s: step %lld row %lld: token %d vs %d", what, (long long)s,
                          (long long)r, a->tokens[s * B + r], b->tokens[s * B + r]);
            ck_assert_msg(memcmp(&a->margins[s * B + r], &b->margins[s * B + r], sizeof(float)) ==
                              0,
                          "%s: step %lld row %lld: margins differ", what, (long long)s,
                          (long long)r);
        }
        /* Decode steps only: a prefill chunk's probes hash the trailing
         * pads' filler too in the native mode, which the adapter does not
         * compute. */
        for (int64_t i = 0; s > 0 && a->probe_hash != NULL && i < a->n_probes * B; i++) {
            const int64_t at = s * a->n_probes * B + i;
            ck_assert_msg(a->probe_hash[at] == b->probe_hash[at],
                          "%s: step %lld probe %lld row %lld: hashes differ", what, (long long)s,
                          (long long)(i / B), (long long)(i % B));
        }
    }
    /* the first non-finite probe value: the same step, probe, row, element */
    ck_assert(a->nonfinite_checked && b->nonfinite_checked);
    ck_assert_msg(a->nonfinite_step == b->nonfinite_step &&
                      a->nonfinite_probe == b->nonfinite_probe &&
                      a->nonfinite_row == b->nonfinite_row &&
                      a->nonfinite_index == b->nonfinite_index,
                  "%s: first non-finite: step %lld probe %lld row %lld index %lld vs step %lld "
                  "probe %lld row %lld index %lld",
                  what, (long long)a->nonfinite_step, (long long)a->nonfinite_probe,
                  (long long)a->nonfinite_row, (long long)a->nonfinite_index,
                  (long long)b->nonfinite_step, (long long)b->nonfinite_probe,
                  (long long)b->nonfinite_row, (long long)b->nonfinite_index);
    ck_assert_int_eq(a->graphs_captured, b->graphs_captured);
    ck_assert_int_eq(a->replay_mismatch_step, -1);
    ck_assert_int_eq(b->replay_mismatch_step, -1);
}

/* loop index: family = i / N_SCENARIOS, scenario = i % N_SCENARIOS */
START_TEST(test_adapter_equals_native) {
    const char *fam = k_families[_i / N_SCENARIOS];
    const char *scn = k_scenarios[_i % N_SCENARIOS];
    KvFixtureModel fx;
    KvScenario sc;
    KvError err = {{0}};
    ck_assert_msg(kv_fixture_load(fam, KV_FIXTURE_DEFAULT_SEED, &fx, &err) == KV_OK, "%s",
                  err.msg);
    const KvModel *m = &fx.model;
    ck_assert_msg(kv_scenario_build(&m->config, scn, TEST_PROMPT_SEED, &sc, &err) == KV_OK, "%s",
                  err.msg);
    ck_assert(kv_decode_right_padded(sc.real, sc.batch, sc.prompt_len));
    char what[160];
    int64_t rows_skipping = 0; /* rows that feed a chunk of only trailing pads somewhere */
    for (int64_t b = 0; b < sc.batch && sc.prefill_chunk > 0; b++) {
        if (!sc.real[b * sc.prompt_len + sc.prompt_len - sc.prefill_chunk]) rows_skipping++;
    }
    if (strcmp(scn, "right_padded_static_loop") == 0) {
        ck_assert_msg(rows_skipping > 0, "%s %s: no row feeds a chunk of only pads", fam, scn);
    }
    for (int v = 0; v < impl_count(); v++) {
        for (int g = 0; g < 2; g++) {
            KvDecodeSpec spec = {
                .batch = sc.batch, .prompt_len = sc.prompt_len, .prompt = sc.prompt,
                .prompt_real = sc.real, .new_tokens = sc.new_tokens,
                .prefill_chunk = sc.prefill_chunk, .variant = impl(v),
                .mode = g ? KV_MODE_GRAPH : KV_MODE_EAGER, .record_probes = true,
                .replay_every = 5,
            };
            snprintf(what, sizeof what, "%s %s %s %s", fam, scn, v ? impl(v)->name : "reference",
                     g ? "graph" : "eager");
            KvDecodeResult native = run(&kv_backend_cpu, m, &spec, what);
            KvDecodeResult adapted = run(&k_cpu_rows, m, &spec, what);
            assert_same(&native, &adapted, what);
            if (g) {
                /* teacher-forced: every step's input comes through set_input,
                 * then capture and replay (the pending path) */
                KvDecodeSpec forced = spec;
                forced.forced = native.tokens;
                KvDecodeResult fa = run(&k_cpu_rows, m, &forced, what);
                snprintf(what + strlen(what), sizeof what - strlen(what), " forced");
                assert_same(&native, &fa, what);
                kv_decode_result_free(&fa);
            }
            kv_decode_result_free(&native);
            kv_decode_result_free(&adapted);
        }
    }
    kv_scenario_free(&sc);
    kv_fixture_free(&fx);
}
END_TEST

/* loop index: family. The finite check through the adapter: the planted
 * unwritten_slot (never-written, NaN-poisoned slots read while the window
 * fills) is recorded at the same step, probe, row and element as by the
 * native per-row mode, and the runs stay bitwise equal. */
START_TEST(test_adapter_nonfinite) {
    const char *fam = k_families[_i];
    KvFixtureModel fx;
    KvScenario sc;
    KvError err = {{0}};
    ck_assert(kv_fixture_load(fam, KV_FIXTURE_DEFAULT_SEED, &fx, &err) == KV_OK);
    const KvModel *m = &fx.model;
    ck_assert_msg(kv_scenario_build(&m->config, "parallel_positions", TEST_PROMPT_SEED, &sc,
                                    &err) == KV_OK, "%s", err.msg);
    const KvDecodeSpec spec = {
        .batch = sc.batch, .prompt_len = sc.prompt_len, .prompt = sc.prompt,
        .prompt_real = sc.real, .new_tokens = sc.new_tokens, .variant = &kv_cache_index_copy,
        .mode = KV_MODE_EAGER, .record_probes = true, .faults = KV_FAULT_UNWRITTEN_SLOT,
    };
    char what[128];
    snprintf(what, sizeof what, "%s parallel_positions index_copy unwritten_slot", fam);
    KvDecodeResult native = run(&kv_backend_cpu, m, &spec, what);
    KvDecodeResult adapted = run(&k_cpu_rows, m, &spec, what);
    ck_assert_msg(native.nonfinite_step >= 0, "%s: the fault left every probe finite", what);
    assert_same(&native, &adapted, what);
    kv_decode_result_free(&native);
    kv_decode_result_free(&adapted);
    kv_scenario_free(&sc);
    kv_fixture_free(&fx);
}
END_TEST

/* A real token after a trailing pad is refused (KV_ERR_INPUT) with the row
 * and column named, before any row's input is copied; a valid input then
 * runs. */
START_TEST(test_adapter_refuses_real_after_trailing_pad) {
    KvFixtureModel fx;
    KvError err = {{0}};
    ck_assert(kv_fixture_load("mistral-tiny", KV_FIXTURE_DEFAULT_SEED, &fx, &err) == KV_OK);
    const KvBackendSetup setup = {.batch = 2, .max_len = 16, .max_chunk = 4, .per_row = true};
    KvRows *rows = NULL;
    ck_assert_msg(kv_rows_create(&kv_backend_cpu, NULL, &fx.model, &setup, &rows, &err) == KV_OK,
                  "%s", err.msg);
    const int32_t tok[8] = {5, 6, 7, 8, 5, 6, 0, 9};
    const uint8_t real[8] = {1, 1, 1, 1, 1, 1, 0, 1};
    ck_assert_int_eq(kv_rows_set_input(rows, tok, real, 4, &err), KV_ERR_INPUT);
    ck_assert_msg(strstr(err.msg, "row 1 column 3") != NULL, "message: %s", err.msg);
    /* nothing was applied: a valid input and its forward still run */
    const uint8_t fine[8] = {1, 1, 1, 1, 1, 1, 0, 0};
    ck_assert_msg(kv_rows_set_input(rows, tok, fine, 4, &err) == KV_OK, "%s", err.msg);
    ck_assert_msg(kv_rows_forward(rows, 4, &err) == KV_OK, "%s", err.msg);
    KvBackendStep step;
    ck_assert_msg(kv_rows_read_step(rows, &step, &err) == KV_OK, "%s", err.msg);
    kv_rows_destroy(rows);
    kv_fixture_free(&fx);
}
END_TEST

int main(void) {
    Suite *s = suite_create("backend_rows");
    TCase *tc = tcase_create("rows");
    tcase_set_timeout(tc, 600);
    tcase_add_loop_test(tc, test_adapter_equals_native, 0, N_FAMILIES * N_SCENARIOS);
    tcase_add_loop_test(tc, test_adapter_nonfinite, 0, N_FAMILIES);
    tcase_add_test(tc, test_adapter_refuses_real_after_trailing_pad);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    const int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? 0 : 1;
}
