/* test_cuda_forward.c: the CUDA backend (candidates/cuda/cuda_forward.h).
 *
 * Two parts:
 *   no-device: always runs. The program re-executes itself with
 *     CUDA_VISIBLE_DEVICES="" (the runtime reads it once, at initialisation)
 *     and the child requires every entry point to return KV_SKIP with a
 *     reason naming the CUDA call that failed (cudaGetDeviceCount), outputs
 *     zeroed, for the reference layout and all six variants in both modes;
 *     and bad specs to be refused as KV_ERR_INPUT before any CUDA call.
 *   device: kv_cuda_query first; on KV_SKIP prints "SKIPPED" with the reason
 *     and exits 77 (ctest's SKIP_RETURN_CODE). With a GPU, on the tiny
 *     fixtures of both families (DESIGN §2, §4):
 *       - every variant is bitwise equal to the GPU reference layout
 *         (tokens, logits, margins, every probe hash), eagerly, for prompts
 *         shorter than W, W-1, W, W+1, longer than W, a left-padded batch
 *         and a chunked prefill, decoding 3W + 4 tokens;
 *       - graph mode is bitwise equal to eager, with the number of captures
 *         the capture keys imply (1; 2 for cat_shift and roll crossing W;
 *         one per attended length for dynamic);
 *       - repeats and the replay check are bitwise identical;
 *       - the GPU reference agrees with the CPU reference within the gate's
 *         tolerances (harness/compare.h), teacher-forced on the CPU tokens;
 *       - the device's finite check of every probe: nothing recorded in a
 *         clean run, the NaN slots of unwritten_slot recorded;
 *       - planted faults whose effect does not depend on scheduling or on
 *         cuBLAS's kernel choice change the results; the others must run;
 *       - a context shift mid-decode: every variant, eager and graph,
 *         bitwise the GPU reference's, which is within tolerance of the
 *         CPU's shifted run; shift_cells changes the results;
 *       - a right-padded batch (rows at their own positions): every
 *         variant, eager and graph, bitwise the GPU reference's, each row
 *         bitwise the row alone, within tolerance of the CPU; pad_slots
 *         changes the results.
 * Usage: test_cuda_forward [--no-device-only | --device-only]; the default
 * runs both. Exit 0 pass, 1 failure, 77 skipped.
 * Check runs with CK_NOFORK: CUDA cannot be used in a child forked after the
 * parent initialised it, and the fixtures are shared by the tests. */
#include <check.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cache.h"
#include "cache_registry.h"
#include "compare.h"
#include "cuda_device.h"
#include "cuda_forward.h"
#include "decode.h"
#include "fault.h"
#include "fixture.h"
#include "forward.h"
#include "no_device.h"
#include "prng.h"
#include "script.h"

#define TEST_SEED KV_FIXTURE_DEFAULT_SEED
#define TEST_PROMPT_SEED 7ULL

#ifndef KV_HAVE_CUDA
#define KV_HAVE_CUDA 0
#endif

static const char *const k_families[] = {"gemma2-tiny", "mistral-tiny", "qwen2-tiny", "gemma3-tiny",
                                          "gpt_oss-tiny", "mistral_mixed-tiny"};
#define N_FAMILIES 6
/* The reference layout (NULL) and the six variants: index 0 is NULL. */
#define N_IMPLS 7

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

static const KvCacheOps *impl_variant(int i) {
    int count = 0;
    const KvCacheOps *const *all = kv_cache_all(&count);
    ck_assert_int_eq(count, N_IMPLS - 1);
    return i == 0 ? NULL : all[i - 1];
}

static const char *impl_name(int i) {
    return i == 0 ? "reference" : impl_variant(i)->name;
}

/* ---- prompts ---- */

typedef enum {
    SHAPE_SHORT,   /* 5 tokens: decode crosses W */
    SHAPE_WM1,     /* W - 1 */
    SHAPE_W,       /* W */
    SHAPE_WP1,     /* W + 1 */
    SHAPE_LONG,    /* 3W + 2: prefill longer than the window */
    SHAPE_PADDED,  /* a left-padded batch of 3W + 2 and 3 tokens */
    SHAPE_CHUNKED, /* 3W + 2 prefilled in chunks of 7 */
    N_SHAPES
} ShapeKind;

static const char *const k_shape_names[N_SHAPES] = {"short", "W-1", "W", "W+1", "long",
                                                    "padded batch", "chunked prefill"};

typedef struct {
    int32_t *tok;  /* (B, P) left-padded */
    uint8_t *real; /* (B, P) */
    int64_t batch, plen, chunk, new_tokens;
} Prompt;

static int32_t *make_tokens(int64_t len, uint64_t seed, int64_t vocab) {
    int32_t *p = malloc((size_t)len * sizeof *p);
    ck_assert_ptr_nonnull(p);
    KvPrng g = kv_prng_seed(seed);
    for (int64_t i = 0; i < len; i++) p[i] = 1 + (int32_t)kv_prng_below(&g, (uint32_t)(vocab - 1));
    return p;
}

static Prompt make_prompt(const KvModel *m, ShapeKind kind) {
    const int64_t W = m->config.sliding_window;
    int64_t lens[2] = {0, 0}, batch = 1, chunk = 0;
    switch (kind) {
    case SHAPE_SHORT: lens[0] = 5; break;
    case SHAPE_WM1: lens[0] = W - 1; break;
    case SHAPE_W: lens[0] = W; break;
    case SHAPE_WP1: lens[0] = W + 1; break;
    case SHAPE_LONG: lens[0] = 3 * W + 2; break;
    case SHAPE_PADDED:
        lens[0] = 3 * W + 2;
        lens[1] = 3;
        batch = 2;
        break;
    case SHAPE_CHUNKED:
        lens[0] = 3 * W + 2;
        chunk = 7;
        break;
    default: ck_abort_msg("unknown shape %d", (int)kind);
    }
    int32_t *rows[2] = {NULL, NULL};
    for (int64_t b = 0; b < batch; b++) {
        rows[b] = make_tokens(lens[b], TEST_PROMPT_SEED + (uint64_t)b, m->config.vocab_size);
    }
    Prompt p = {0};
    KvError err = {{0}};
    KvStatus st = kv_batch_left_pad((const int32_t *const *)rows, lens, batch, 0, &p.tok, &p.real,
                                    &p.plen, &err);
    ck_assert_msg(st == KV_OK, "left pad: %s", err.msg);
    free(rows[0]);
    free(rows[1]);
    p.batch = batch;
    p.chunk = chunk;
    p.new_tokens = 3 * W + 4; /* at least 3 x W past the window */
    return p;
}

static void prompt_free(Prompt *p) {
    free(p->tok);
    free(p->real);
    memset(p, 0, sizeof *p);
}

static KvDecodeSpec make_spec(const Prompt *p, const KvCacheOps *variant, KvExecMode mode) {
    KvDecodeSpec s = {.batch = p->batch, .prompt_len = p->plen, .prompt = p->tok,
                      .prompt_real = p->real, .new_tokens = p->new_tokens,
                      .prefill_chunk = p->chunk, .variant = variant, .mode = mode,
                      .record_probes = true};
    return s;
}

/* Runs spec on the GPU; the test fails unless it returns KV_OK. */
static KvDecodeResult run_gpu(const KvModel *m, const KvDecodeSpec *spec, KvBackendStats *stats,
                              const char *what) {
    KvDecodeResult r;
    KvBackendStats local;
    KvError err = {{0}};
    KvStatus st = kv_decode_run(&kv_backend_cuda, m, spec, &r, stats != NULL ? stats : &local, &err);
    ck_assert_msg(st == KV_OK, "%s: kv_decode_run on cuda returned %d: %s", what, (int)st, err.msg);
    return r;
}

/* ---- comparisons ---- */

static int bits_equal(const void *a, const void *b, size_t n) {
    return memcmp(a, b, n) == 0;
}

/* Fails at the first difference, naming the step, row and, for probes, the
 * probe (so a failure says where, as the gate would). */
static void assert_bitwise(const KvModel *m, const KvDecodeResult *a, const KvDecodeResult *b,
                           const char *what) {
    ck_assert_int_eq(a->steps, b->steps);
    ck_assert_int_eq(a->batch, b->batch);
    ck_assert_int_eq(a->vocab, b->vocab);
    const int64_t S = a->steps, B = a->batch, V = a->vocab;
    for (int64_t s = 0; s < S; s++) {
        if (a->probe_hash != NULL && b->probe_hash != NULL) {
            ck_assert_int_eq(a->n_probes, b->n_probes);
            for (int64_t i = 0; i < a->n_probes; i++) {
                for (int64_t r = 0; r < B; r++) {
                    const int64_t at = (s * a->n_probes + i) * B + r;
                    if (a->probe_hash[at] != b->probe_hash[at]) {
                        char name[64];
                        kv_probe_name(&m->config, i, name, sizeof name);
                        ck_abort_msg("Nondeterminism! %s: first differing probe at step %lld row "
                                     "%lld: %s (%016" PRIx64 " vs %016" PRIx64 ", seeds %llu/%llu)",
                                     what, (long long)s, (long long)r, name, a->probe_hash[at],
                                     b->probe_hash[at], (unsigned long long)TEST_SEED,
                                     (unsigned long long)TEST_PROMPT_SEED);
                    }
                }
            }
        }
        for (int64_t r = 0; r < B; r++) {
            const size_t off = (size_t)((s * B + r) * V);
            for (int64_t v = 0; v < V; v++) {
                if (!bits_equal(&a->logits[off + (size_t)v], &b->logits[off + (size_t)v],
                                sizeof(float))) {
                    ck_abort_msg("Nondeterminism! %s: first differing logit at step %lld row "
                                 "%lld id %lld: %.9g vs %.9g",
                                 what, (long long)s, (long long)r, (long long)v,
                                 (double)a->logits[off + (size_t)v],
                                 (double)b->logits[off + (size_t)v]);
                }
            }
            ck_assert_msg(a->tokens[s * B + r] == b->tokens[s * B + r],
                          "%s: tokens differ at step %lld row %lld: %d vs %d", what, (long long)s,
                          (long long)r, a->tokens[s * B + r], b->tokens[s * B + r]);
            ck_assert_msg(bits_equal(&a->margins[s * B + r], &b->margins[s * B + r], sizeof(float)),
                          "%s: margins differ at step %lld row %lld", what, (long long)s,
                          (long long)r);
        }
    }
}

/* 1 when any logit bit differs (a planted fault showed). */
static int results_differ(const KvDecodeResult *a, const KvDecodeResult *b) {
    const size_t n = (size_t)(a->steps * a->batch * a->vocab);
    return a->steps != b->steps || !bits_equal(a->logits, b->logits, n * sizeof(float));
}

/* Graph captures the capture key implies (kv_graph_runner_step's rule):
 * one per change of (host regime, attended length) over the decode steps. */
static int64_t expected_captures(const char *variant, int64_t W, int64_t P, int64_t new_tokens) {
    int64_t caps = 0, prev = -1;
    for (int64_t step = 1; step < new_tokens; step++) {
        const int64_t len = P + step - 1; /* positions stored before the step */
        int64_t key = 0;
        if (variant != NULL && (strcmp(variant, "cat_shift") == 0 || strcmp(variant, "roll") == 0)) {
            key = len >= W;
        } else if (variant != NULL && strcmp(variant, "dynamic") == 0) {
            key = len < W - 1 ? len : W - 1; /* filled = min(W - 1, stored) */
        }
        if (caps == 0 || key != prev) caps++;
        prev = key;
    }
    return caps;
}

/* GPU logits within the gate's relative tolerance of the CPU's at every
 * step and row (tokens too where the CPU's margin is clear of a tie, when
 * tokens is set); returns the largest relative error. */
static double assert_near_cpu(const KvDecodeResult *cpu, const KvDecodeResult *gpu, bool tokens,
                              const char *what) {
    const int64_t B = cpu->batch, V = cpu->vocab;
    double worst = 0.0;
    ck_assert_int_eq(cpu->steps, gpu->steps);
    for (int64_t s = 0; s < cpu->steps; s++) {
        for (int64_t r = 0; r < B; r++) {
            const float *c = cpu->logits + (s * B + r) * V;
            const float *g = gpu->logits + (s * B + r) * V;
            double max_abs = 0.0, max_ref = 0.0;
            for (int64_t v = 0; v < V; v++) {
                const double d = fabs((double)g[v] - (double)c[v]);
                max_abs = d > max_abs ? d : max_abs;
                max_ref = fabs((double)c[v]) > max_ref ? fabs((double)c[v]) : max_ref;
            }
            const double rel = max_abs / (max_ref > 0.0 ? max_ref : 1.0);
            worst = rel > worst ? rel : worst;
            ck_assert_msg(rel <= KV_TOL_MAX_REL_ERR,
                          "%s: step %lld row %lld: GPU logits off the CPU by %.3g relative "
                          "(KV_TOL_MAX_REL_ERR %.3g)",
                          what, (long long)s, (long long)r, rel, KV_TOL_MAX_REL_ERR);
            if (tokens && cpu->margins[s * B + r] > KV_TOL_TIE_MARGIN) {
                ck_assert_msg(cpu->tokens[s * B + r] == gpu->tokens[s * B + r],
                              "%s: step %lld row %lld: token %d on the GPU, %d on the CPU with "
                              "margin %.3g",
                              what, (long long)s, (long long)r, gpu->tokens[s * B + r],
                              cpu->tokens[s * B + r], (double)cpu->margins[s * B + r]);
            }
        }
    }
    return worst;
}

/* ---- device tests ---- */

/* loop index: family = i / N_SHAPES, shape = i % N_SHAPES */
START_TEST(test_variants_equal_reference) {
    const int fam = _i / N_SHAPES;
    const ShapeKind shape = (ShapeKind)(_i % N_SHAPES);
    const KvModel *m = model_for(fam);
    Prompt p = make_prompt(m, shape);
    char what[160];
    KvDecodeSpec spec = make_spec(&p, NULL, KV_MODE_EAGER);
    KvBackendStats stats;
    snprintf(what, sizeof what, "%s %s gpu reference eager", k_families[fam], k_shape_names[shape]);
    KvDecodeResult ref = run_gpu(m, &spec, &stats, what);
    ck_assert_int_eq(ref.n_probes, kv_probe_count(&m->config));
    ck_assert_int_eq(ref.graphs_captured, 0);
    ck_assert_msg(ref.nonfinite_checked && ref.nonfinite_step < 0,
                  "%s: non-finite probe %lld row %lld at step %lld (value %g)", what,
                  (long long)ref.nonfinite_probe, (long long)ref.nonfinite_row,
                  (long long)ref.nonfinite_step, (double)ref.nonfinite_value);
    ck_assert_msg(stats.device[0] != '\0', "stats.device is empty");
    ck_assert_msg(strstr(stats.math_mode, "pedantic") != NULL, "math mode '%s'", stats.math_mode);
    for (int v = 1; v < N_IMPLS; v++) {
        spec = make_spec(&p, impl_variant(v), KV_MODE_EAGER);
        snprintf(what, sizeof what, "%s %s: %s eager vs gpu reference", k_families[fam],
                 k_shape_names[shape], impl_name(v));
        KvDecodeResult r = run_gpu(m, &spec, NULL, what);
        assert_bitwise(m, &ref, &r, what);
        kv_decode_result_free(&r);
    }
    kv_decode_result_free(&ref);
    prompt_free(&p);
}
END_TEST

/* The shapes the graph test runs: the regime flips during decode (short),
 * at the first step (W), never (long), and a padded batch. */
static const ShapeKind k_graph_shapes[] = {SHAPE_SHORT, SHAPE_W, SHAPE_LONG, SHAPE_PADDED};
#define N_GRAPH_SHAPES ((int)(sizeof k_graph_shapes / sizeof k_graph_shapes[0]))

/* loop index: family = i / (N_GRAPH_SHAPES * N_IMPLS), then shape, then impl */
START_TEST(test_graph_equals_eager) {
    const int fam = _i / (N_GRAPH_SHAPES * N_IMPLS);
    const ShapeKind shape = k_graph_shapes[(_i / N_IMPLS) % N_GRAPH_SHAPES];
    const int impl = _i % N_IMPLS;
    const KvModel *m = model_for(fam);
    Prompt p = make_prompt(m, shape);
    char what[160];
    snprintf(what, sizeof what, "%s %s %s", k_families[fam], k_shape_names[shape], impl_name(impl));
    KvDecodeSpec spec = make_spec(&p, impl_variant(impl), KV_MODE_EAGER);
    KvDecodeResult eager = run_gpu(m, &spec, NULL, what);
    spec.mode = KV_MODE_GRAPH;
    KvBackendStats stats;
    KvDecodeResult graph = run_gpu(m, &spec, &stats, what);
    assert_bitwise(m, &eager, &graph, what);
    const int64_t want = expected_captures(impl == 0 ? NULL : impl_name(impl),
                                           m->config.sliding_window, p.plen, p.new_tokens);
    ck_assert_msg(graph.graphs_captured == want, "%s: %lld graphs captured, want %lld", what,
                  (long long)graph.graphs_captured, (long long)want);
    ck_assert_int_eq(stats.graphs_captured, graph.graphs_captured);
    ck_assert_msg(stats.graph_instantiations >= 1 &&
                      stats.graph_instantiations + stats.exec_updates == stats.graphs_captured,
                  "%s: %lld captures = %lld instantiations + %lld exec updates?", what,
                  (long long)stats.graphs_captured, (long long)stats.graph_instantiations,
                  (long long)stats.exec_updates);
    ck_assert_int_eq(stats.exec_update_used, stats.exec_updates > 0);
    ck_assert_int_eq(stats.graph_launches, p.new_tokens - 1);
    printf("cuda_forward: %s: %lld captures, %lld instantiations, %lld exec updates\n", what,
           (long long)stats.graphs_captured, (long long)stats.graph_instantiations,
           (long long)stats.exec_updates);
    kv_decode_result_free(&eager);
    kv_decode_result_free(&graph);
    prompt_free(&p);
}
END_TEST

/* loop index: family = i / N_IMPLS, impl = i % N_IMPLS */
START_TEST(test_repeat_and_replay) {
    const int fam = _i / N_IMPLS;
    const int impl = _i % N_IMPLS;
    const KvModel *m = model_for(fam);
    Prompt p = make_prompt(m, SHAPE_SHORT);
    char what[160];
    for (int mode = 0; mode < 2; mode++) {
        snprintf(what, sizeof what, "%s %s %s", k_families[fam], impl_name(impl),
                 mode == 0 ? "eager" : "graph");
        KvDecodeSpec spec = make_spec(&p, impl_variant(impl), (KvExecMode)mode);
        KvDecodeResult a = run_gpu(m, &spec, NULL, what);
        KvDecodeResult b = run_gpu(m, &spec, NULL, what);
        assert_bitwise(m, &a, &b, what); /* repeat */
        spec.replay_every = 1;
        spec.replay_k = 3;
        KvDecodeResult c = run_gpu(m, &spec, NULL, what);
        ck_assert_msg(c.replay_mismatch_step < 0, "Nondeterminism! %s: replays differ at step %lld",
                      what, (long long)c.replay_mismatch_step);
        ck_assert_int_eq(c.replays_checked, p.new_tokens - 1);
        assert_bitwise(m, &a, &c, what); /* the check must not change the results */
        kv_decode_result_free(&a);
        kv_decode_result_free(&b);
        kv_decode_result_free(&c);
    }
    prompt_free(&p);
}
END_TEST

/* loop index: family = i / N_SHAPES, shape = i % N_SHAPES */
START_TEST(test_cpu_agreement) {
    const int fam = _i / N_SHAPES;
    const ShapeKind shape = (ShapeKind)(_i % N_SHAPES);
    const KvModel *m = model_for(fam);
    Prompt p = make_prompt(m, shape);
    char what[160];
    KvError err = {{0}};
    snprintf(what, sizeof what, "%s %s", k_families[fam], k_shape_names[shape]);
    KvDecodeSpec spec = make_spec(&p, NULL, KV_MODE_EAGER);
    KvDecodeResult cpu;
    KvStatus st = kv_decode_greedy(m, &spec, &cpu, &err);
    ck_assert_msg(st == KV_OK, "%s: cpu decode: %s", what, err.msg);
    /* Teacher-forced on the CPU's tokens, so both see the same context at
     * every step even after a near-tie flip. */
    spec.forced = cpu.tokens;
    KvDecodeResult gpu = run_gpu(m, &spec, NULL, what);
    const double worst = assert_near_cpu(&cpu, &gpu, true, what);
    printf("cuda_forward: %s: GPU vs CPU max rel err %.3g\n", what, worst);
    /* The embedding probe holds the same bytes on both backends (the same
     * rows, gemma's one F32 multiply): the probe hash (probe.h), computed
     * in parallel slices on the GPU, must then be the CPU's, every step. */
    ck_assert_int_eq(cpu.n_probes, gpu.n_probes);
    for (int64_t s = 0; s < cpu.steps; s++) {
        for (int64_t r = 0; r < spec.batch; r++) {
            const int64_t at = (s * cpu.n_probes + 0) * spec.batch + r;
            ck_assert_msg(cpu.probe_hash[at] == gpu.probe_hash[at],
                          "%s: embed probe at step %lld row %lld: cpu %016llx, gpu %016llx", what,
                          (long long)s, (long long)r, (unsigned long long)cpu.probe_hash[at],
                          (unsigned long long)gpu.probe_hash[at]);
        }
    }
    /* The forced run of a variant in graph mode is still bitwise the GPU
     * reference's. */
    spec.variant = &kv_cache_ring;
    spec.mode = KV_MODE_GRAPH;
    KvDecodeResult ring = run_gpu(m, &spec, NULL, what);
    assert_bitwise(m, &gpu, &ring, "forced: ring graph vs gpu reference eager");
    kv_decode_result_free(&ring);
    kv_decode_result_free(&gpu);
    kv_decode_result_free(&cpu);
    prompt_free(&p);
}
END_TEST

/* A clean and a faulty run of the same spec. */
static void fault_pair(const KvModel *m, const KvDecodeSpec *spec, unsigned fault,
                       KvDecodeResult *clean, KvDecodeResult *faulty, KvBackendStats *stats,
                       const char *what) {
    KvDecodeSpec f = *spec;
    *clean = run_gpu(m, spec, NULL, what);
    f.faults = fault;
    *faulty = run_gpu(m, &f, stats, what);
}

/* loop index: family */
START_TEST(test_planted_faults) {
    const KvModel *m = model_for(_i);
    Prompt shrt = make_prompt(m, SHAPE_SHORT);
    Prompt lng = make_prompt(m, SHAPE_LONG);
    KvDecodeResult a, b;
    KvBackendStats stats;
    char what[160];

    /* stale_scalar: harmless eagerly (a fresh argument every launch), frozen
     * by the graph. */
    snprintf(what, sizeof what, "%s stale_scalar", k_families[_i]);
    KvDecodeSpec spec = make_spec(&shrt, NULL, KV_MODE_EAGER);
    fault_pair(m, &spec, KV_FAULT_STALE_SCALAR, &a, &b, NULL, what);
    assert_bitwise(m, &a, &b, "stale_scalar eager must equal clean eager");
    kv_decode_result_free(&a);
    kv_decode_result_free(&b);
    spec.mode = KV_MODE_GRAPH;
    fault_pair(m, &spec, KV_FAULT_STALE_SCALAR, &a, &b, NULL, what);
    ck_assert_msg(results_differ(&a, &b), "%s: graph replays did not show the stale position", what);
    kv_decode_result_free(&a);
    kv_decode_result_free(&b);

    /* window_off_by_one: W + 1 keys once the context exceeds W. */
    snprintf(what, sizeof what, "%s window_off_by_one", k_families[_i]);
    spec = make_spec(&lng, &kv_cache_ring, KV_MODE_EAGER);
    fault_pair(m, &spec, KV_FAULT_WINDOW_OFF_BY_ONE, &a, &b, NULL, what);
    ck_assert_msg(results_differ(&a, &b), "%s: no effect", what);
    kv_decode_result_free(&a);
    kv_decode_result_free(&b);

    /* unwritten_slot: empty (NaN) slots read while the window fills. */
    snprintf(what, sizeof what, "%s unwritten_slot", k_families[_i]);
    spec = make_spec(&shrt, &kv_cache_index_copy, KV_MODE_EAGER);
    fault_pair(m, &spec, KV_FAULT_UNWRITTEN_SLOT, &a, &b, NULL, what);
    ck_assert_msg(results_differ(&a, &b), "%s: no effect", what);
    /* The device's finite check of the probes (take_nonfinite): the NaN
     * slots read are recorded, and nothing is in the clean run. */
    ck_assert(a.nonfinite_checked && b.nonfinite_checked);
    ck_assert_msg(a.nonfinite_step < 0, "%s: clean run: non-finite probe %lld at step %lld",
                  what, (long long)a.nonfinite_probe, (long long)a.nonfinite_step);
    ck_assert_msg(b.nonfinite_step >= 0, "%s: the NaN slots read were not recorded", what);
    kv_decode_result_free(&a);
    kv_decode_result_free(&b);

    /* prefill_first_w: a prefill longer than W keeps the wrong rows. */
    snprintf(what, sizeof what, "%s prefill_first_w", k_families[_i]);
    spec = make_spec(&lng, &kv_cache_index_copy, KV_MODE_EAGER);
    fault_pair(m, &spec, KV_FAULT_PREFILL_FIRST_W, &a, &b, NULL, what);
    ck_assert_msg(results_differ(&a, &b), "%s: no effect", what);
    kv_decode_result_free(&a);
    kv_decode_result_free(&b);

    /* static_layer: index_copy as a static layer of W slots (writes clamped
     * at W - 1) reads the wrong keys from the first step past W, in a long
     * prefill (several rows clamped to one slot) and in decode. */
    for (int k = 0; k < 2; k++) {
        snprintf(what, sizeof what, "%s static_layer %s", k_families[_i],
                 k == 0 ? "short" : "long");
        spec = make_spec(k == 0 ? &shrt : &lng, &kv_cache_index_copy, KV_MODE_GRAPH);
        fault_pair(m, &spec, KV_FAULT_STATIC_LAYER, &a, &b, NULL, what);
        ck_assert_msg(results_differ(&a, &b), "%s: no effect", what);
        kv_decode_result_free(&a);
        kv_decode_result_free(&b);
    }

    /* no_recapture: cat_shift's filling graph replayed on a full cache. */
    snprintf(what, sizeof what, "%s no_recapture", k_families[_i]);
    spec = make_spec(&shrt, &kv_cache_cat_shift, KV_MODE_GRAPH);
    fault_pair(m, &spec, KV_FAULT_NO_RECAPTURE, &a, &b, &stats, what);
    ck_assert_int_eq(b.graphs_captured, 1);
    ck_assert_msg(results_differ(&a, &b), "%s: no effect", what);
    kv_decode_result_free(&a);
    kv_decode_result_free(&b);

    /* inplace_shift: roll's and cat_shift's shift walked in the wrong
     * direction overwrites rows it still has to read, once the window is full. */
    static const KvCacheOps *const k_shifting[] = {&kv_cache_roll, &kv_cache_cat_shift};
    for (size_t v = 0; v < sizeof k_shifting / sizeof k_shifting[0]; v++) {
        snprintf(what, sizeof what, "%s inplace_shift %s", k_families[_i], k_shifting[v]->name);
        spec = make_spec(&shrt, k_shifting[v], KV_MODE_EAGER);
        fault_pair(m, &spec, KV_FAULT_INPLACE_SHIFT, &a, &b, NULL, what);
        ck_assert_msg(results_differ(&a, &b), "%s: no effect", what);
        kv_decode_result_free(&a);
        kv_decode_result_free(&b);
    }

    /* Faults whose effect depends on scheduling (atomic_reduction's float
     * atomics) or on the kernels cuBLAS picks (tf32): they must run; whether
     * they showed is printed, not asserted. */
    static const struct {
        unsigned bit;
        const char *name;
        const KvCacheOps *variant;
    } k_soft[] = {{KV_FAULT_ATOMIC_REDUCTION, "atomic_reduction", &kv_cache_ring},
                  {KV_FAULT_TF32, "tf32", NULL}};
    for (size_t k = 0; k < sizeof k_soft / sizeof k_soft[0]; k++) {
        snprintf(what, sizeof what, "%s %s", k_families[_i], k_soft[k].name);
        spec = make_spec(&shrt, k_soft[k].variant, KV_MODE_GRAPH);
        spec.replay_every = 1;
        fault_pair(m, &spec, k_soft[k].bit, &a, &b, &stats, what);
        ck_assert_msg(a.replay_mismatch_step < 0, "%s: the clean run's replays differ", what);
        if (k_soft[k].bit == KV_FAULT_TF32) {
            ck_assert_msg(strstr(stats.math_mode, "TF32") != NULL, "%s: math mode '%s'", what,
                          stats.math_mode);
        }
        printf("cuda_forward: %s: %s (replay mismatch step %lld)\n", what,
               results_differ(&a, &b) ? "results changed" : "results unchanged",
               (long long)b.replay_mismatch_step);
        kv_decode_result_free(&a);
        kv_decode_result_free(&b);
    }
    prompt_free(&shrt);
    prompt_free(&lng);
}
END_TEST

/* loop index: family. The context shift (DESIGN §5, cuda_shift.cu) on the
 * GPU: the padded batch shifted at decode step W/2 + 1 (keep W/4, drop up
 * to W + 1, W the largest window): every variant, eager and graph, bitwise
 * the GPU reference's shifted run; the GPU reference within the gate's
 * tolerance of the CPU reference's shifted run, teacher-forced on the
 * CPU's tokens; the planted shift_cells (a ring slot left in its cell)
 * changes the results. */
START_TEST(test_context_shift_gpu) {
    const KvModel *m = model_for(_i);
    const int64_t W = kv_config_max_window(&m->config);
    Prompt p = make_prompt(m, SHAPE_PADDED);
    char what[160];
    KvError err = {{0}};
    KvDecodeSpec spec = make_spec(&p, NULL, KV_MODE_EAGER);
    KvScript shift = {.shift_step = W / 2 + 1, .shift_keep = W / 4};
    const int64_t stored = p.plen + shift.shift_step - 1; /* positions before the shift */
    shift.shift_drop = W + 1;
    if (shift.shift_keep + shift.shift_drop > stored - W) {
        shift.shift_drop = stored - W - shift.shift_keep;
    }
    ck_assert_msg(shift.shift_drop >= 1, "%s: prompt too short to shift", k_families[_i]);
    ck_assert_msg(shift.shift_step < spec.new_tokens, "%s: the shift must fall inside the decode",
                  k_families[_i]);
    ck_assert_msg(kv_script_bind(&shift, m, &spec, &err) == KV_OK, "%s", err.msg);
    snprintf(what, sizeof what, "%s shift gpu reference eager", k_families[_i]);
    KvDecodeResult ref = run_gpu(m, &spec, NULL, what);
    for (int v = 1; v < N_IMPLS; v++) {
        for (int g = 0; g < 2; g++) {
            KvDecodeSpec vs = make_spec(&p, impl_variant(v), g ? KV_MODE_GRAPH : KV_MODE_EAGER);
            KvScript vshift = shift;
            ck_assert_msg(kv_script_bind(&vshift, m, &vs, &err) == KV_OK, "%s", err.msg);
            snprintf(what, sizeof what, "%s shift: %s %s vs gpu reference eager", k_families[_i],
                     impl_name(v), g ? "graph" : "eager");
            KvDecodeResult r = run_gpu(m, &vs, NULL, what);
            assert_bitwise(m, &ref, &r, what);
            kv_decode_result_free(&r);
        }
    }
    /* GPU vs CPU, both shifted, teacher-forced on the CPU's tokens. */
    KvDecodeResult cpu;
    KvStatus st = kv_decode_greedy(m, &spec, &cpu, &err);
    ck_assert_msg(st == KV_OK, "%s shift: cpu decode: %s", k_families[_i], err.msg);
    KvDecodeSpec forced = spec;
    forced.forced = cpu.tokens;
    snprintf(what, sizeof what, "%s shift forced", k_families[_i]);
    KvDecodeResult gpu = run_gpu(m, &forced, NULL, what);
    const double worst = assert_near_cpu(&cpu, &gpu, false, what);
    printf("cuda_forward: %s: shifted GPU vs shifted CPU max rel err %.3g\n", what, worst);
    /* The planted shift_cells on ring. */
    KvDecodeSpec fs = make_spec(&p, &kv_cache_ring, KV_MODE_EAGER);
    KvScript fshift = shift;
    ck_assert_msg(kv_script_bind(&fshift, m, &fs, &err) == KV_OK, "%s", err.msg);
    KvDecodeResult clean, faulty;
    snprintf(what, sizeof what, "%s shift_cells", k_families[_i]);
    fault_pair(m, &fs, KV_FAULT_SHIFT_CELLS, &clean, &faulty, NULL, what);
    ck_assert_msg(results_differ(&clean, &faulty), "%s: no effect", what);
    kv_decode_result_free(&clean);
    kv_decode_result_free(&faulty);
    kv_decode_result_free(&gpu);
    kv_decode_result_free(&cpu);
    kv_decode_result_free(&ref);
    prompt_free(&p);
}
END_TEST

/* loop index: family. Rows at their own positions (DESIGN §2,
 * backend_rows.h): three prompts of W + 3, W/2 + 1 and 2 tokens right-padded
 * to one length (W the largest window), prefilled in chunks of 4, decoded
 * 2W + 4 tokens: every variant, eager and graph, bitwise the GPU
 * reference's; each row bitwise the row decoded alone on the GPU; the GPU
 * reference within the gate's tolerance of the CPU's, teacher-forced; the
 * planted pad_slots (right pads stored as positions) changes the results. */
START_TEST(test_right_padded_gpu) {
    const KvModel *m = model_for(_i);
    const int64_t W = kv_config_max_window(&m->config);
    const int64_t lens[3] = {W + 3, W / 2 + 1, 2};
    int32_t *rows[3];
    char what[160];
    KvError err = {{0}};
    for (int64_t b = 0; b < 3; b++) {
        rows[b] = make_tokens(lens[b], TEST_PROMPT_SEED + 10 + (uint64_t)b, m->config.vocab_size);
    }
    Prompt p = {0};
    KvStatus st = kv_batch_pad((const int32_t *const *)rows, lens, 3, 0, true, &p.tok, &p.real,
                               &p.plen, &err);
    ck_assert_msg(st == KV_OK, "right pad: %s", err.msg);
    p.batch = 3;
    p.chunk = 4;
    p.new_tokens = 2 * W + 4;
    KvDecodeSpec spec = make_spec(&p, NULL, KV_MODE_EAGER);
    ck_assert(kv_decode_right_padded(p.real, p.batch, p.plen));
    snprintf(what, sizeof what, "%s right-padded gpu reference eager", k_families[_i]);
    KvDecodeResult ref = run_gpu(m, &spec, NULL, what);
    for (int v = 1; v < N_IMPLS; v++) {
        for (int g = 0; g < 2; g++) {
            KvDecodeSpec vs = make_spec(&p, impl_variant(v), g ? KV_MODE_GRAPH : KV_MODE_EAGER);
            snprintf(what, sizeof what, "%s right-padded: %s %s vs gpu reference eager",
                     k_families[_i], impl_name(v), g ? "graph" : "eager");
            KvDecodeResult r = run_gpu(m, &vs, NULL, what);
            assert_bitwise(m, &ref, &r, what);
            kv_decode_result_free(&r);
        }
    }
    /* Each row vs the row alone (its real tokens, the same chunks). */
    const int64_t V = ref.vocab;
    for (int64_t b = 0; b < 3; b++) {
        uint8_t *one_real = malloc((size_t)lens[b]);
        ck_assert_ptr_nonnull(one_real);
        memset(one_real, 1, (size_t)lens[b]);
        Prompt one = {rows[b], one_real, 1, lens[b], 4, p.new_tokens};
        KvDecodeSpec os = make_spec(&one, NULL, KV_MODE_EAGER);
        snprintf(what, sizeof what, "%s right-padded row %lld alone", k_families[_i], (long long)b);
        KvDecodeResult alone = run_gpu(m, &os, NULL, what);
        for (int64_t s = 0; s < ref.steps; s++) {
            ck_assert_msg(bits_equal(ref.logits + (s * 3 + b) * V, alone.logits + s * V,
                                     (size_t)V * sizeof(float)),
                          "%s: step %lld: the row in the batch differs from the row alone",
                          what, (long long)s);
            ck_assert_int_eq(ref.tokens[s * 3 + b], alone.tokens[s]);
        }
        kv_decode_result_free(&alone);
        free(one_real);
    }
    /* GPU vs CPU, teacher-forced on the CPU's tokens. */
    KvDecodeResult cpu;
    st = kv_decode_greedy(m, &spec, &cpu, &err);
    ck_assert_msg(st == KV_OK, "%s right-padded: cpu decode: %s", k_families[_i], err.msg);
    KvDecodeSpec forced = spec;
    forced.forced = cpu.tokens;
    snprintf(what, sizeof what, "%s right-padded forced", k_families[_i]);
    KvDecodeResult gpu = run_gpu(m, &forced, NULL, what);
    const double worst = assert_near_cpu(&cpu, &gpu, false, what);
    printf("cuda_forward: %s: right-padded GPU vs CPU max rel err %.3g\n", what, worst);
    /* The planted pad_slots on ring. */
    KvDecodeSpec fs = make_spec(&p, &kv_cache_ring, KV_MODE_EAGER);
    KvDecodeResult clean, faulty;
    snprintf(what, sizeof what, "%s pad_slots", k_families[_i]);
    fault_pair(m, &fs, KV_FAULT_PAD_SLOTS, &clean, &faulty, NULL, what);
    ck_assert_msg(results_differ(&clean, &faulty), "%s: no effect", what);
    kv_decode_result_free(&clean);
    kv_decode_result_free(&faulty);
    kv_decode_result_free(&gpu);
    kv_decode_result_free(&cpu);
    kv_decode_result_free(&ref);
    for (int64_t b = 0; b < 3; b++) free(rows[b]);
    prompt_free(&p);
}
END_TEST

/* Planted racy_shift at the seed's cache size (pytorch #159855: gemma-2-2b,
 * batch 2, 4 kv heads x head_dim 256, W 4096): the kernel alone, five
 * times each way, on distinct values. The downward walk (roll's) starts its
 * blocks on slots whose sources lower blocks overwrite: every repeat must
 * be wrong somewhere. The counts are printed, so a run shows whether the
 * race moved between repeats (it is a race: nothing fixes them). */
START_TEST(test_racy_shift_at_seed_size) {
    const int64_t B = 2, W = 4096, D = 4 * 256;
    for (int down = 0; down < 2; down++) {
        int64_t first = -1;
        bool moved = false;
        printf("cuda_forward: racy_shift %s walk (B %lld, W %lld, kv_dim %lld) wrong elements per "
               "repeat:", down ? "downward (roll)" : "upward (cat_shift)", (long long)B,
               (long long)W, (long long)D);
        for (int r = 0; r < 5; r++) {
            int64_t wrong = -1;
            KvError err = {{0}};
            ck_assert_msg(kv_cuda_racy_shift_count(B, W, D, down == 1, &wrong, &err) == KV_OK,
                          "%s", err.msg);
            printf(" %lld", (long long)wrong);
            if (r == 0) first = wrong;
            moved |= wrong != first;
            if (down == 1) ck_assert_msg(wrong > 0, "downward racy shift right in repeat %d", r);
        }
        printf("%s\n", moved ? " (moved between repeats)" : " (the same every repeat)");
    }
}
END_TEST

static Suite *device_suite(void) {
    Suite *s = suite_create("cuda_forward");
    TCase *eq = tcase_create("variants");
    tcase_set_timeout(eq, 600);
    tcase_add_loop_test(eq, test_variants_equal_reference, 0, N_FAMILIES * N_SHAPES);
    tcase_add_loop_test(eq, test_graph_equals_eager, 0, N_FAMILIES * N_GRAPH_SHAPES * N_IMPLS);
    tcase_add_loop_test(eq, test_repeat_and_replay, 0, N_FAMILIES * N_IMPLS);
    suite_add_tcase(s, eq);
    TCase *ref = tcase_create("reference");
    tcase_set_timeout(ref, 600);
    tcase_add_loop_test(ref, test_cpu_agreement, 0, N_FAMILIES * N_SHAPES);
    tcase_add_loop_test(ref, test_planted_faults, 0, N_FAMILIES);
    tcase_add_loop_test(ref, test_context_shift_gpu, 0, N_FAMILIES);
    tcase_add_loop_test(ref, test_right_padded_gpu, 0, N_FAMILIES);
    tcase_add_test(ref, test_racy_shift_at_seed_size);
    suite_add_tcase(s, ref);
    return s;
}

/* ---- no-device tests (in the child with CUDA_VISIBLE_DEVICES="") ---- */

/* A skip must say why: with CUDA, the runtime call that failed; without,
 * that CUDA was not built in. */
static void assert_skip_reason(const KvError *e, const char *what) {
    if (KV_HAVE_CUDA) {
        ck_assert_msg(strstr(e->msg, "cudaGetDeviceCount") != NULL,
                      "%s: the skip reason must name the CUDA call (cudaGetDeviceCount): '%s'",
                      what, e->msg);
    } else {
        ck_assert_msg(strstr(e->msg, "without CUDA") != NULL,
                      "%s: the skip reason must say CUDA was not built in: '%s'", what, e->msg);
    }
}

/* loop index: impl * 2 + mode */
START_TEST(test_no_device_skips) {
    const int impl = _i / 2;
    const KvExecMode mode = (KvExecMode)(_i % 2);
    const KvModel *m = model_for(0);
    Prompt p = make_prompt(m, SHAPE_SHORT);
    KvDecodeSpec spec = make_spec(&p, impl_variant(impl), mode);
    KvDecodeResult r;
    KvBackendStats stats;
    KvError err = {{0}};
    char what[96];
    snprintf(what, sizeof what, "%s %s", impl_name(impl), mode == KV_MODE_GRAPH ? "graph" : "eager");
    memset(&r, 0xAB, sizeof r);
    memset(&stats, 0xAB, sizeof stats);
    KvStatus st = kv_decode_run(&kv_backend_cuda, m, &spec, &r, &stats, &err);
    printf("cuda_forward: no device: %s -> %d: %s\n", what, (int)st, err.msg);
    ck_assert_msg(st == KV_SKIP,
                  "%s: with no visible device kv_decode_run on cuda must return KV_SKIP (77), got "
                  "%d (with a device it means CUDA_VISIBLE_DEVICES=\"\" did not hide it): %s",
                  what, (int)st, err.msg);
    assert_skip_reason(&err, what);
    ck_assert_msg(r.tokens == NULL && r.logits == NULL && r.margins == NULL &&
                      r.probe_hash == NULL && r.steps == 0,
                  "%s: a skipped run must leave its result empty", what);
    ck_assert_msg(stats.graphs_captured == 0 && stats.graph_instantiations == 0 &&
                      stats.device[0] == '\0',
                  "%s: a skipped run must leave its stats empty", what);
    prompt_free(&p);
}
END_TEST

START_TEST(test_no_device_bench_skips) {
    const KvModel *m = model_for(1);
    Prompt p = make_prompt(m, SHAPE_SHORT);
    KvDecodeSpec spec = make_spec(&p, &kv_cache_dynamic, KV_MODE_EAGER);
    KvCudaBenchResult r;
    KvError err = {{0}};
    KvStatus st = kv_cuda_bench_decode(m, &spec, &r, &err);
    ck_assert_msg(st == KV_SKIP, "kv_cuda_bench_decode: got %d: %s", (int)st, err.msg);
    assert_skip_reason(&err, "kv_cuda_bench_decode");
    double bw = -1.0;
    KvError err2 = {{0}};
    st = kv_cuda_bench_bandwidth((size_t)1 << 20, &bw, &err2);
    ck_assert_msg(st == KV_SKIP, "kv_cuda_bench_bandwidth: got %d: %s", (int)st, err2.msg);
    assert_skip_reason(&err2, "kv_cuda_bench_bandwidth");
    ck_assert_msg(bw == 0.0, "a skipped bandwidth probe must report 0, got %g", bw);
    int64_t wrong = 0;
    KvError err3 = {{0}};
    st = kv_cuda_racy_shift_count(2, 16, 8, true, &wrong, &err3);
    ck_assert_msg(st == KV_SKIP, "kv_cuda_racy_shift_count: got %d: %s", (int)st, err3.msg);
    assert_skip_reason(&err3, "kv_cuda_racy_shift_count");
    ck_assert_int_eq(wrong, -1);
    prompt_free(&p);
}
END_TEST

/* Bad specs are the caller's bug whatever the machine or build: the driver
 * refuses them before the backend is touched. A variant with no GPU form is
 * refused by the CUDA build before any CUDA call; the no-CUDA build skips. */
START_TEST(test_bad_spec_refused_first) {
    const KvModel *m = model_for(0);
    Prompt p = make_prompt(m, SHAPE_SHORT);
    const KvStatus want = KV_ERR_INPUT;
    const KvStatus want_variant = KV_HAVE_CUDA ? KV_ERR_INPUT : KV_SKIP;
    KvDecodeResult r;
    KvError err = {{0}};

    KvDecodeSpec spec = make_spec(&p, NULL, KV_MODE_EAGER);
    spec.batch = 0;
    ck_assert_int_eq(kv_decode_run(&kv_backend_cuda, m, &spec, &r, NULL, &err), want);

    KvCacheOps bogus = kv_cache_ring;
    bogus.name = "bogus";
    spec = make_spec(&p, &bogus, KV_MODE_EAGER);
    ck_assert_int_eq(kv_decode_run(&kv_backend_cuda, m, &spec, &r, NULL, &err), want_variant);
    if (KV_HAVE_CUDA) ck_assert_msg(strstr(err.msg, "bogus") != NULL, "message: %s", err.msg);

    spec = make_spec(&p, NULL, KV_MODE_EAGER);
    const int32_t saved = p.tok[0];
    p.tok[0] = (int32_t)m->config.vocab_size; /* one past the vocabulary */
    ck_assert_int_eq(kv_decode_run(&kv_backend_cuda, m, &spec, &r, NULL, &err), want);
    p.tok[0] = saved;

    /* A pad between real tokens: a real token after a trailing pad (a pad
     * in the last column alone is a right-padded row, which is valid). */
    p.real[p.plen - 2] = 0;
    ck_assert_int_eq(kv_decode_run(&kv_backend_cuda, m, &spec, &r, NULL, &err), want);
    ck_assert_msg(strstr(err.msg, "trailing pad") != NULL, "message: %s", err.msg);
    prompt_free(&p);
}
END_TEST

static Suite *no_device_suite(void) {
    Suite *s = suite_create("cuda_forward_no_device");
    TCase *tc = tcase_create("skip");
    tcase_add_loop_test(tc, test_no_device_skips, 0, 2 * N_IMPLS);
    tcase_add_test(tc, test_no_device_bench_skips);
    tcase_add_test(tc, test_bad_spec_refused_first);
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

static void free_models(void) {
    for (int f = 0; f < N_FAMILIES; f++) {
        if (g_loaded[f]) kv_fixture_free(&g_models[f]);
        g_loaded[f] = 0;
    }
}

static int run_no_device(void) { return run_suite(no_device_suite()); }
static int run_device(void) { return run_suite(device_suite()); }

int main(int argc, char **argv) {
    static const KvCudaTest test = {"cuda_forward", "(every run reported as skipped with a reason)", run_no_device, run_device, free_models};
    return kv_test_cuda_main(argc, argv, &test);
}
