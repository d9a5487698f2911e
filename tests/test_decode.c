/* test_decode.c: determinism and semantics of the CPU reference decode.
 *
 * Bitwise invariants (DESIGN §2, §4): the same decode gives the same logits
 * bytes across repeats and OpenMP thread counts; a chunked prefill equals a
 * whole one; a row of a left-padded batch equals the same prompt decoded
 * alone (padding shifts slots, never relative positions). Semantics: the
 * window mask first changes a logit exactly when the context outgrows W. */
#include <check.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache_registry.h"
#include "decode.h"
#include "ensemble.h"
#include "fault.h"
#include "fixture.h"
#include "gemm.h"
#include "kvmath.h"
#include "prng.h"
#include "probe.h"
#include "shadow64.h"

#ifdef _OPENMP
#include <omp.h>
#endif

#define TEST_SEED KV_FIXTURE_DEFAULT_SEED
#define TEST_PROMPT_SEED 7ULL
static const char *const k_families[] = {"gemma2-tiny", "mistral-tiny", "qwen2-tiny", "gemma3-tiny", "gpt_oss-tiny"};
#define N_FAM ((int)(sizeof k_families / sizeof k_families[0]))

/* One prompt of len tokens from [1, vocab), seeded. */
static int32_t *make_prompt(int64_t len, uint64_t seed, int64_t vocab) {
    int32_t *p = malloc((size_t)len * sizeof *p);
    ck_assert_ptr_nonnull(p);
    KvPrng g = kv_prng_seed(seed);
    for (int64_t i = 0; i < len; i++) p[i] = 1 + (int32_t)kv_prng_below(&g, (uint32_t)(vocab - 1));
    return p;
}

/* Decodes `batch` prompts (left-padded) and returns the result; probes
 * recorded when `probes` (every pad row then computed: forward.c). */
static KvDecodeResult run_decode_probes(const KvModel *m, int32_t **prompts, const int64_t *lens,
                                        int64_t batch, int64_t new_tokens, int64_t chunk,
                                        bool probes) {
    int32_t *tok = NULL;
    uint8_t *real = NULL;
    int64_t plen = 0;
    KvError err = {{0}};
    KvStatus st = kv_batch_left_pad((const int32_t *const *)prompts, lens, batch, 0, &tok, &real,
                                    &plen, &err);
    ck_assert_msg(st == KV_OK, "left pad: %s", err.msg);
    KvDecodeSpec spec = {.batch = batch, .prompt_len = plen, .prompt = tok, .prompt_real = real,
                         .new_tokens = new_tokens, .prefill_chunk = chunk,
                         .record_probes = probes};
    KvDecodeResult r = {0};
    st = kv_decode_greedy(m, &spec, &r, &err);
    ck_assert_msg(st == KV_OK, "decode: %s", err.msg);
    free(tok);
    free(real);
    return r;
}

/* Without probes: pad rows' matmuls skipped. */
static KvDecodeResult run_decode(const KvModel *m, int32_t **prompts, const int64_t *lens,
                                 int64_t batch, int64_t new_tokens, int64_t chunk) {
    return run_decode_probes(m, prompts, lens, batch, new_tokens, chunk, false);
}

static void assert_same(const KvDecodeResult *a, const KvDecodeResult *b, const char *what) {
    ck_assert_int_eq(a->steps, b->steps);
    ck_assert_int_eq(a->batch, b->batch);
    size_t n = (size_t)(a->steps * a->batch * a->vocab);
    for (size_t i = 0; i < n; i++) {
        if (memcmp(&a->logits[i], &b->logits[i], sizeof(float)) != 0) {
            ck_abort_msg("Nondeterminism! %s: first differing logit at step %zu row %zu id %zu: "
                         "%.9g vs %.9g (seeds %llu/%llu)",
                         what, i / (size_t)(a->batch * a->vocab),
                         (i / (size_t)a->vocab) % (size_t)a->batch, i % (size_t)a->vocab,
                         (double)a->logits[i], (double)b->logits[i],
                         (unsigned long long)TEST_SEED, (unsigned long long)TEST_PROMPT_SEED);
        }
    }
    ck_assert_msg(memcmp(a->tokens, b->tokens, (size_t)(a->steps * a->batch) * sizeof(int32_t)) == 0,
                  "%s: tokens differ", what);
}

/* The three prompt shapes of the acceptance: shorter than W, longer than W,
 * and a left-padded batch of both lengths. */
typedef struct {
    const char *name;
    int64_t batch;
    int64_t lens[2];
} Shape;
static const Shape k_shapes[] = {
    {"short", 1, {5, 0}},
    {"long", 1, {3 * 16 + 2, 0}},
    {"padded batch", 2, {3 * 16 + 2, 3}},
};
#define N_SHAPES (sizeof k_shapes / sizeof k_shapes[0])

static KvDecodeResult run_shape(const KvModel *m, const Shape *s, int64_t new_tokens, int64_t chunk) {
    int32_t *p[2] = {NULL, NULL};
    for (int64_t b = 0; b < s->batch; b++) {
        p[b] = make_prompt(s->lens[b], TEST_PROMPT_SEED + (uint64_t)b, m->config.vocab_size);
    }
    KvDecodeResult r = run_decode(m, p, s->lens, s->batch, new_tokens, chunk);
    free(p[0]);
    free(p[1]);
    return r;
}

/* loop index i: family = i / N_SHAPES, shape = i % N_SHAPES. The rows > 1
 * matmuls (prefill, the batch's steps, a chunked prefill) on each blocked
 * GEMM this CPU runs (AVX-512, AVX2) and on the portable per-output kernel
 * (gemm.h): the whole decode's logits bitwise the same, at 1 and 2 threads
 * with every region parallel. A path the CPU lacks is skipped, saying so. */
START_TEST(test_gemm_paths_bitwise) {
    const char *fam = k_families[_i / (int)N_SHAPES];
    const Shape *shape = &k_shapes[_i % (int)N_SHAPES];
    static const KvGemmPath paths[] = {KV_GEMM_AVX512, KV_GEMM_AVX2};
    KvFixtureModel f;
    KvError err = {{0}};
    ck_assert_msg(kv_fixture_load(fam, TEST_SEED, &f, &err) == KV_OK, "%s", err.msg);
    const int64_t new_tokens = 2 * f.model.config.sliding_window + 4;
    ck_assert_int_eq(kv_gemm_set_path(KV_GEMM_PORTABLE), KV_OK);
    KvDecodeResult base = run_shape(&f.model, shape, new_tokens, 0);
    KvDecodeResult chunked_base = run_shape(&f.model, shape, new_tokens, 4);
    char what[160];
#ifdef _OPENMP
    const int saved = omp_get_max_threads();
    kv_set_parallel_min_work(0);
    const int threads[] = {1, 2};
#else
    const int threads[] = {1};
#endif
    for (size_t p = 0; p < sizeof paths / sizeof paths[0]; p++) {
        const char *name = kv_gemm_path_name(paths[p]);
        if (kv_gemm_set_path(paths[p]) != KV_OK) {
            printf("test_gemm_paths_bitwise: %s skipped: this CPU or build cannot run it\n", name);
            continue;
        }
        for (size_t t = 0; t < sizeof threads / sizeof threads[0]; t++) {
#ifdef _OPENMP
            omp_set_num_threads(threads[t]);
#endif
            KvDecodeResult r = run_shape(&f.model, shape, new_tokens, 0);
            snprintf(what, sizeof what, "%s %s: %s GEMM (%d threads) vs portable matmul", fam,
                     shape->name, name, threads[t]);
            assert_same(&base, &r, what);
            kv_decode_result_free(&r);
            r = run_shape(&f.model, shape, new_tokens, 4);
            snprintf(what, sizeof what, "%s %s chunk 4: %s GEMM (%d threads) vs portable matmul",
                     fam, shape->name, name, threads[t]);
            assert_same(&chunked_base, &r, what);
            kv_decode_result_free(&r);
        }
    }
#ifdef _OPENMP
    omp_set_num_threads(saved);
    kv_set_parallel_min_work(KV_PARALLEL_MIN_WORK);
#endif
    ck_assert_int_eq(kv_gemm_set_path(KV_GEMM_AUTO), KV_OK);
    kv_decode_result_free(&base);
    kv_decode_result_free(&chunked_base);
    kv_fixture_free(&f);
}
END_TEST

/* loop index i: family = i / N_SHAPES, shape = i % N_SHAPES */
START_TEST(test_repeat_and_threads_bitwise) {
    const char *fam = k_families[_i / (int)N_SHAPES];
    const Shape *shape = &k_shapes[_i % (int)N_SHAPES];
    KvFixtureModel f;
    KvError err = {{0}};
    ck_assert_msg(kv_fixture_load(fam, TEST_SEED, &f, &err) == KV_OK, "%s", err.msg);
    int64_t w = f.model.config.sliding_window;
    int64_t new_tokens = 3 * w + 4; /* at least 3 x W past the window */
    KvDecodeResult base = run_shape(&f.model, shape, new_tokens, 0);
    char what[128];
    for (int rep = 0; rep < 2; rep++) {
        KvDecodeResult again = run_shape(&f.model, shape, new_tokens, 0);
        snprintf(what, sizeof what, "%s %s repeat %d", fam, shape->name, rep + 2);
        assert_same(&base, &again, what);
        kv_decode_result_free(&again);
    }
#ifdef _OPENMP
    int saved = omp_get_max_threads();
    /* Force every parallel region open, so the thread counts really split
     * the work (the tiny fixture is below the default threshold). */
    kv_set_parallel_min_work(0);
    const int threads[] = {1, 2, 4};
    for (size_t t = 0; t < 3; t++) {
        omp_set_num_threads(threads[t]);
        ck_assert_int_eq(omp_get_max_threads(), threads[t]);
        KvDecodeResult r = run_shape(&f.model, shape, new_tokens, 0);
        snprintf(what, sizeof what, "%s %s OMP threads %d", fam, shape->name, threads[t]);
        assert_same(&base, &r, what);
        kv_decode_result_free(&r);
    }
    omp_set_num_threads(saved);
    kv_set_parallel_min_work(KV_PARALLEL_MIN_WORK);
#else
    fprintf(stderr, "test_decode: built without OpenMP: thread-count check covers 1 thread only\n");
#endif
    kv_decode_result_free(&base);
    kv_fixture_free(&f);
}
END_TEST

START_TEST(test_chunked_prefill_bitwise) {
    KvFixtureModel f;
    KvError err = {{0}};
    ck_assert_msg(kv_fixture_load(k_families[_i], TEST_SEED, &f, &err) == KV_OK, "%s", err.msg);
    const Shape *s = &k_shapes[2]; /* padded batch, 50-token prompt */
    KvDecodeResult whole = run_shape(&f.model, s, 20, 0);
    const int64_t chunks[] = {1, 9, 16, 17};
    for (size_t c = 0; c < 4; c++) {
        KvDecodeResult r = run_shape(&f.model, s, 20, chunks[c]);
        char what[96];
        snprintf(what, sizeof what, "%s chunk %lld vs whole prefill", k_families[_i],
                 (long long)chunks[c]);
        assert_same(&whole, &r, what);
        kv_decode_result_free(&r);
    }
    kv_decode_result_free(&whole);
    kv_fixture_free(&f);
}
END_TEST

/* Skipping the pad rows' matmuls (no probes) gives the bits of computing
 * them (probes on), whole and chunked prefill (chunk 9: a chunk of the
 * short row's pads and real tokens mixed; 1: one row at a time). */
START_TEST(test_pad_skip_bitwise) {
    KvFixtureModel f;
    KvError err = {{0}};
    ck_assert_msg(kv_fixture_load(k_families[_i], TEST_SEED, &f, &err) == KV_OK, "%s", err.msg);
    const int64_t V = f.model.config.vocab_size;
    int64_t lens[2] = {50, 13};
    int32_t *p[2] = {make_prompt(50, TEST_PROMPT_SEED, V), make_prompt(13, TEST_PROMPT_SEED + 1, V)};
    const int64_t chunks[] = {0, 9, 1};
    for (size_t c = 0; c < 3; c++) {
        KvDecodeResult all = run_decode_probes(&f.model, p, lens, 2, 20, chunks[c], true);
        KvDecodeResult skip = run_decode_probes(&f.model, p, lens, 2, 20, chunks[c], false);
        char what[96];
        snprintf(what, sizeof what, "%s chunk %lld: pad rows skipped vs computed", k_families[_i],
                 (long long)chunks[c]);
        assert_same(&all, &skip, what);
        kv_decode_result_free(&all);
        kv_decode_result_free(&skip);
    }
    free(p[0]);
    free(p[1]);
    kv_fixture_free(&f);
}
END_TEST

START_TEST(test_padded_row_equals_alone) {
    KvFixtureModel f;
    KvError err = {{0}};
    ck_assert_msg(kv_fixture_load(k_families[_i], TEST_SEED, &f, &err) == KV_OK, "%s", err.msg);
    int64_t V = f.model.config.vocab_size;
    int64_t lens[2] = {50, 3};
    int32_t *p[2] = {make_prompt(50, TEST_PROMPT_SEED, V), make_prompt(3, TEST_PROMPT_SEED + 1, V)};
    KvDecodeResult both = run_decode(&f.model, p, lens, 2, 52, 0);
    for (int64_t b = 0; b < 2; b++) {
        KvDecodeResult alone = run_decode(&f.model, &p[b], &lens[b], 1, 52, 0);
        for (int64_t s = 0; s < 52; s++) {
            ck_assert_msg(memcmp(alone.logits + s * V, both.logits + (s * 2 + b) * V,
                                 (size_t)V * sizeof(float)) == 0,
                          "%s: row %lld of the padded batch differs from decoding it alone at step %lld",
                          k_families[_i], (long long)b, (long long)s);
        }
        kv_decode_result_free(&alone);
    }
    kv_decode_result_free(&both);
    free(p[0]);
    free(p[1]);
    kv_fixture_free(&f);
}
END_TEST

/* First step whose logits differ between two models on the same forced
 * tokens (prompt p of P tokens, steps new tokens). */
static int64_t first_changed_step(const KvModel *a, const KvModel *b, const int32_t *p, int64_t P,
                                  const int32_t *forced, int64_t steps) {
    uint8_t *real = malloc((size_t)P);
    ck_assert_ptr_nonnull(real);
    memset(real, 1, (size_t)P); /* no pads */
    KvDecodeSpec spec = {.batch = 1, .prompt_len = P, .prompt = p, .prompt_real = real,
                         .new_tokens = steps, .forced = forced};
    KvDecodeResult ra, rb;
    KvError err = {{0}};
    ck_assert_msg(kv_decode_greedy(a, &spec, &ra, &err) == KV_OK, "%s", err.msg);
    ck_assert_msg(kv_decode_greedy(b, &spec, &rb, &err) == KV_OK, "%s", err.msg);
    const int64_t V = ra.vocab;
    int64_t first = -1;
    for (int64_t s = 0; s < steps && first < 0; s++) {
        if (memcmp(ra.logits + s * V, rb.logits + s * V, (size_t)V * sizeof(float)) != 0) first = s;
    }
    kv_decode_result_free(&ra);
    kv_decode_result_free(&rb);
    free(real);
    return first;
}

/* mistral_mixed-tiny (windows 4, 16, 4, 16): against the same weights with
 * one window 16 everywhere, the first changed step is the one whose query
 * reaches past 4 (query slot P - 1 + s = 4); against windows 4, full, 4,
 * full, the one whose query reaches past 16. Each layer keeps its own window. */
START_TEST(test_mixed_windows_boundary) {
    KvFixtureModel f;
    KvError err = {{0}};
    ck_assert_msg(kv_fixture_load("mistral_mixed-tiny", TEST_SEED, &f, &err) == KV_OK, "%s",
                  err.msg);
    const KvConfig *c = &f.model.config;
    ck_assert(kv_config_mixed_windows(c));
    const int64_t small = KV_FIXTURE_MIXED_SMALL_WINDOW, W = c->sliding_window, P = 2;
    ck_assert_int_eq(kv_config_layer_window(c, 0), small);
    ck_assert_int_eq(kv_config_layer_window(c, 1), W);
    int32_t *p = make_prompt(P, TEST_PROMPT_SEED, c->vocab_size);
    const int64_t steps = 2 * W;
    int32_t *forced = malloc((size_t)steps * sizeof *forced);
    ck_assert_ptr_nonnull(forced);
    /* any fixed tokens: both models read the same inputs at every step */
    for (int64_t s = 0; s < steps; s++) forced[s] = (int32_t)(1 + (s * 37) % (c->vocab_size - 1));
    KvModel one = f.model; /* shallow: same weights, other windows */
    for (int64_t l = 0; l < c->num_layers; l++) one.config.layer_window[l] = 0;
    ck_assert(!kv_config_mixed_windows(&one.config));
    int64_t first = first_changed_step(&f.model, &one, p, P, forced, steps);
    ck_assert_msg(first == small - P + 1, "vs window %lld everywhere: first change at step %lld, "
                  "expected %lld", (long long)W, (long long)first, (long long)(small - P + 1));
    /* windows 4, full, 4, full: only the odd layers differ, from past 16 */
    for (int64_t l = 0; l < c->num_layers; l++) {
        one.config.layer_sliding[l] = l % 2 == 0;
        one.config.layer_window[l] = l % 2 == 0 ? small : 0;
    }
    one.config.sliding_window = small;
    first = first_changed_step(&f.model, &one, p, P, forced, steps);
    ck_assert_msg(first == W - P + 1, "vs windows 4/full: first change at step %lld, expected "
                  "%lld", (long long)first, (long long)(W - P + 1));
    free(forced);
    free(p);
    kv_fixture_free(&f);
}
END_TEST

/* With the window removed the logits agree exactly while the context fits
 * in W and differ from the first query that would drop a key: the query at
 * slot W (context W + 1) is the first whose window (q - W < k) excludes
 * slot 0. This pins the convention: an off-by-one moves the boundary. */
START_TEST(test_window_boundary) {
    KvFixtureModel f;
    KvError err = {{0}};
    ck_assert_msg(kv_fixture_load(k_families[_i], TEST_SEED, &f, &err) == KV_OK, "%s", err.msg);
    const int64_t W = f.model.config.sliding_window;
    const int64_t V = f.model.config.vocab_size;
    const int64_t P = 5;
    int32_t *p = make_prompt(P, TEST_PROMPT_SEED, V);
    int64_t len = P;
    KvDecodeResult win = run_decode(&f.model, &p, &len, 1, 2 * W, 0);
    /* Shallow copy: same weights, a window no query reaches past. The layer
     * kinds stay (gemma3's sliding layers keep their own RoPE base). */
    KvModel full = f.model;
    full.config.sliding_window = KV_CONFIG_MAX_WINDOW;
    /* Teacher-force the windowed tokens so both runs see the same inputs. */
    int32_t *forced = malloc((size_t)(P + 2 * W) * sizeof *forced);
    ck_assert_ptr_nonnull(forced);
    memcpy(forced, p, (size_t)P * sizeof *forced);
    for (int64_t s = 0; s < 2 * W; s++) forced[P + s] = win.tokens[s];
    int64_t first_diff = -1;
    for (int64_t s = 0; s < 2 * W && first_diff < 0; s++) {
        /* Step s's logits come from the query at slot P - 1 + s. */
        int64_t flen = P + s;
        KvDecodeResult r = run_decode(&full, &forced, &flen, 1, 1, 0);
        if (memcmp(r.logits, win.logits + s * V, (size_t)V * sizeof(float)) != 0) first_diff = s;
        kv_decode_result_free(&r);
    }
    ck_assert_msg(first_diff == W - P + 1,
                  "%s: window W=%lld should first change step %lld (query slot %lld), changed step %lld",
                  k_families[_i], (long long)W, (long long)(W - P + 1), (long long)W,
                  (long long)first_diff);
    free(forced);
    free(p);
    kv_decode_result_free(&win);
    kv_fixture_free(&f);
}
END_TEST

START_TEST(test_margins_clear_of_ties) {
    /* The fixtures are scaled so greedy margins are clear of F32 rounding:
     * the smallest margin over a 64-step decode must exceed 1e-3 (logits
     * are O(1..10); F32 rounding of them is ~1e-6). */
    KvFixtureModel f;
    KvError err = {{0}};
    ck_assert_msg(kv_fixture_load(k_families[_i], TEST_SEED, &f, &err) == KV_OK, "%s", err.msg);
    int64_t len = 5;
    int32_t *p = make_prompt(len, TEST_PROMPT_SEED, f.model.config.vocab_size);
    KvDecodeResult r = run_decode(&f.model, &p, &len, 1, 64, 0);
    float mn = INFINITY;
    for (int64_t i = 0; i < r.steps; i++) mn = r.margins[i] < mn ? r.margins[i] : mn;
    ck_assert_msg(mn > 1e-3f, "%s: smallest top-1 margin %g", k_families[_i], (double)mn);
    int distinct = 0;
    for (int64_t i = 0; i < r.steps; i++) {
        bool seen = false;
        for (int64_t j = 0; j < i; j++) seen = seen || r.tokens[j] == r.tokens[i];
        distinct += !seen;
    }
    fprintf(stderr, "%s: min margin %g, %d distinct tokens in 64 steps\n", k_families[_i],
            (double)mn, distinct);
    free(p);
    kv_decode_result_free(&r);
    kv_fixture_free(&f);
}
END_TEST

START_TEST(test_bad_tokens_rejected) {
    KvFixtureModel f;
    KvError err = {{0}};
    ck_assert_msg(kv_fixture_load("mistral-tiny", TEST_SEED, &f, &err) == KV_OK, "%s", err.msg);
    int32_t tok[3] = {3, 512, 5};
    uint8_t real[3] = {1, 1, 1};
    KvDecodeSpec spec = {.batch = 1, .prompt_len = 3, .prompt = tok, .prompt_real = real,
                         .new_tokens = 4};
    KvDecodeResult r;
    ck_assert_int_eq(kv_decode_greedy(&f.model, &spec, &r, &err), KV_ERR_INPUT);
    ck_assert_msg(strstr(err.msg, "512") != NULL && strstr(err.msg, "[0, 512)") != NULL, "%s", err.msg);
    ck_assert_ptr_null(r.logits);
    tok[1] = 4;
    real[1] = 0; /* a real token after a trailing pad */
    ck_assert_int_eq(kv_decode_greedy(&f.model, &spec, &r, &err), KV_ERR_INPUT);
    ck_assert_msg(strstr(err.msg, "trailing pad") != NULL, "%s", err.msg);
    real[0] = real[1] = real[2] = 0; /* only pads */
    ck_assert_int_eq(kv_decode_greedy(&f.model, &spec, &r, &err), KV_ERR_INPUT);
    ck_assert_msg(strstr(err.msg, "only pads") != NULL, "%s", err.msg);
    /* right padding (DESIGN §2) is the row alone: [3, pad, pad] == [3] */
    real[0] = 1;
    KvDecodeResult padded, alone;
    ck_assert_msg(kv_decode_greedy(&f.model, &spec, &padded, &err) == KV_OK, "%s", err.msg);
    KvDecodeSpec one = {.batch = 1, .prompt_len = 1, .prompt = tok, .prompt_real = real,
                        .new_tokens = 4};
    ck_assert_msg(kv_decode_greedy(&f.model, &one, &alone, &err) == KV_OK, "%s", err.msg);
    ck_assert(memcmp(padded.logits, alone.logits, (size_t)(4 * 512) * sizeof(float)) == 0);
    kv_decode_result_free(&padded);
    kv_decode_result_free(&alone);
    real[1] = real[2] = 1;
    spec.new_tokens = 0;
    ck_assert_int_eq(kv_decode_greedy(&f.model, &spec, &r, &err), KV_ERR_INPUT);
    kv_fixture_free(&f);
}
END_TEST

/* Decodes one prompt with probes on; variant NULL: the reference. */
static KvDecodeResult probe_decode(const KvModel *m, const int32_t *prompt, int64_t len,
                                   const KvCacheOps *variant, KvExecMode mode) {
    uint8_t *real = malloc((size_t)len);
    ck_assert_ptr_nonnull(real);
    memset(real, 1, (size_t)len);
    KvDecodeSpec spec = {.batch = 1, .prompt_len = len, .prompt = prompt, .prompt_real = real,
                         .new_tokens = 24, .variant = variant, .mode = mode,
                         .record_probes = true};
    KvDecodeResult r = {0};
    KvError err = {{0}};
    ck_assert_msg(kv_decode_greedy(m, &spec, &r, &err) == KV_OK, "decode: %s", err.msg);
    free(real);
    return r;
}

/* A NaN weight is located where it first shows (DESIGN §6: a NaN compares
 * false with every tolerance, so the decode itself records it). A NaN in
 * the embedding row of a token first generated at step s shows at step s+1
 * in "embed" (element 0 of the row); with a tied lm_head (gemma2) that row
 * is also a logit, so it already shows at step 0 in "logits" as element t.
 * A NaN in layer 1's down projection (row 0) shows at step 0 in
 * "layer1.mlp", element 0. The same holds for a variant in graph mode (the
 * probe ops are replayed). A clean decode records nothing. */
/* The probe hash's two levels (probe.h): 4096-byte slices hashed with
 * FNV-1a 64, their hashes folded as little-endian bytes. The expected value
 * was computed by a separate implementation (Python, plain integer FNV-1a
 * over the same bytes); the one-level FNV-1a of the same bytes differs. */
START_TEST(test_probe_hash_two_levels) {
    enum { N = 2 * KV_PROBE_CHUNK + 12 };
    unsigned char *d = malloc(N);
    ck_assert_ptr_nonnull(d);
    for (int i = 0; i < N; i++) d[i] = (unsigned char)((i * 7 + 3) % 251);
    ck_assert_uint_eq(kv_probe_hash_bytes(d, N), 0x6a989e1965db094dULL);
    ck_assert_uint_eq(kv_fnv1a(KV_FNV_OFFSET, d, N), 0x22ab2025d1b52f04ULL);
    /* the fold is FNV-1a over the slice hash's little-endian bytes */
    const uint64_t e = kv_fnv1a(KV_FNV_OFFSET, d, KV_PROBE_CHUNK);
    unsigned char le[8];
    for (int i = 0; i < 8; i++) le[i] = (unsigned char)(e >> (8 * i));
    ck_assert_uint_eq(kv_probe_fold(KV_FNV_OFFSET, e), kv_fnv1a(KV_FNV_OFFSET, le, 8));
    ck_assert_uint_eq(kv_probe_hash_bytes(d, KV_PROBE_CHUNK), kv_probe_fold(KV_FNV_OFFSET, e));
    ck_assert_uint_eq(kv_probe_hash_bytes(d, 0), KV_FNV_OFFSET);
    /* a flipped bit in the short last slice changes the hash */
    d[N - 1] ^= 1;
    ck_assert_uint_ne(kv_probe_hash_bytes(d, N), 0x6a989e1965db094dULL);
    free(d);
}
END_TEST

/* kv_probe_hash_bytes hashes its slices four side by side and, in long
 * rows, across threads, in blocks of 256: its value must be the plain loop's
 * (each slice by kv_fnv1a, folded in order) at every count of slices around
 * those boundaries, and kv_fnv1a_x4 must be four kv_fnv1a calls. */
START_TEST(test_probe_hash_side_by_side) {
    const int64_t counts[] = {0, 1, 3, 4, 5, 7, 8, 31, 32, 33, 255, 256, 257, 301, 515};
    const int64_t most = 515 * KV_PROBE_CHUNK + 5;
    unsigned char *d = malloc((size_t)most);
    ck_assert_ptr_nonnull(d);
    uint64_t z = 0x9e3779b97f4a7c15ULL;
    for (int64_t i = 0; i < most; i++) {
        z ^= z << 13;
        z ^= z >> 7;
        z ^= z << 17;
        d[i] = (unsigned char)z;
    }
    for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
        for (int64_t tail = 0; tail <= 5; tail += 5) {
            const size_t n = (size_t)(counts[c] * KV_PROBE_CHUNK + tail);
            uint64_t want = KV_FNV_OFFSET;
            for (size_t at = 0; at < n; at += KV_PROBE_CHUNK) {
                const size_t len = n - at < KV_PROBE_CHUNK ? n - at : KV_PROBE_CHUNK;
                want = kv_probe_fold(want, kv_fnv1a(KV_FNV_OFFSET, d + at, len));
            }
            ck_assert_msg(kv_probe_hash_bytes(d, n) == want, "%lld slices + %lld bytes",
                          (long long)counts[c], (long long)tail);
        }
    }
    uint64_t h[4] = {KV_FNV_OFFSET, 1, 2, 0xfeedULL};
    const void *p[4] = {d, d + 4097, d + 9000, d + 3};
    uint64_t want[4];
    for (int j = 0; j < 4; j++) want[j] = kv_fnv1a(h[j], p[j], 777);
    kv_fnv1a_x4(h, p, 777);
    for (int j = 0; j < 4; j++) ck_assert_uint_eq(h[j], want[j]);
    free(d);
}
END_TEST

START_TEST(test_nonfinite_located) {
    KvFixtureModel f;
    KvError err = {{0}};
    ck_assert_msg(kv_fixture_load(k_families[_i], TEST_SEED, &f, &err) == KV_OK, "%s", err.msg);
    const KvModel *m = &f.model;
    const int64_t V = m->config.vocab_size, H = m->config.hidden_size;
    const int64_t len = 5;
    int32_t *p = make_prompt(len, TEST_PROMPT_SEED, V);
    KvDecodeResult clean = probe_decode(m, p, len, NULL, KV_MODE_EAGER);
    ck_assert(clean.nonfinite_checked);
    ck_assert_int_eq(clean.nonfinite_step, -1);
    ck_assert_int_eq(clean.nonfinite_probe, -1);

    /* the first generated token that is neither in the prompt nor earlier */
    int64_t s_new = -1;
    for (int64_t st = 0; st + 1 < clean.steps && s_new < 0; st++) {
        bool seen = false;
        for (int64_t i = 0; i < len; i++) seen = seen || p[i] == clean.tokens[st];
        for (int64_t j = 0; j < st; j++) seen = seen || clean.tokens[j] == clean.tokens[st];
        if (!seen) s_new = st;
    }
    ck_assert_msg(s_new >= 0, "no fresh token in %lld steps", (long long)clean.steps);
    const int32_t t = clean.tokens[s_new];
    const bool tied = m->lm_head.data == m->embed.data;
    char name[64];

    ck_assert_int_eq(m->embed.dtype, KV_DTYPE_F32); /* the fixtures are F32 */
    float *emb = (float *)(uintptr_t)m->embed.data; /* the test owns the fixture */
    const float saved = emb[(int64_t)t * H];
    emb[(int64_t)t * H] = NAN;
    const KvCacheOps *ring = kv_cache_find("ring");
    ck_assert_ptr_nonnull(ring);
    for (int g = 0; g < 2; g++) {
        KvDecodeResult r = g == 0 ? probe_decode(m, p, len, NULL, KV_MODE_EAGER)
                                  : probe_decode(m, p, len, ring, KV_MODE_GRAPH);
        kv_probe_name(&m->config, r.nonfinite_probe, name, sizeof name);
        ck_assert_msg(r.nonfinite_step == (tied ? 0 : s_new + 1), "%s: step %lld, token %d first "
                      "generated at %lld", k_families[_i], (long long)r.nonfinite_step, t,
                      (long long)s_new);
        ck_assert_str_eq(name, tied ? "logits" : "embed");
        ck_assert_int_eq(r.nonfinite_row, 0);
        ck_assert_int_eq(r.nonfinite_index, tied ? t : 0);
        ck_assert(isnan(r.nonfinite_value));
        kv_decode_result_free(&r);
    }
    emb[(int64_t)t * H] = saved;

    if (m->config.num_experts > 0) {
        /* gpt_oss: every expert's down projection, so whichever the router
         * picks (E, hidden, intermediate) */
        const int64_t I = m->config.intermediate_size;
        ck_assert_int_eq(m->layers[1].experts_down.dtype, KV_DTYPE_F32);
        float *down = (float *)(uintptr_t)m->layers[1].experts_down.data;
        for (int64_t e = 0; e < m->config.num_experts; e++) down[e * H * I + 5] = INFINITY;
    } else {
        ck_assert_int_eq(m->layers[1].w_down.dtype, KV_DTYPE_F32);
        float *down = (float *)(uintptr_t)m->layers[1].w_down.data; /* (hidden, intermediate) */
        down[5] = INFINITY;
    }
    for (int g = 0; g < 2; g++) {
        KvDecodeResult r = g == 0 ? probe_decode(m, p, len, NULL, KV_MODE_EAGER)
                                  : probe_decode(m, p, len, ring, KV_MODE_GRAPH);
        kv_probe_name(&m->config, r.nonfinite_probe, name, sizeof name);
        ck_assert_int_eq(r.nonfinite_step, 0);
        ck_assert_str_eq(name, "layer1.mlp");
        ck_assert_int_eq(r.nonfinite_row, 0);
        ck_assert_int_eq(r.nonfinite_index, 0);
        ck_assert(!isfinite(r.nonfinite_value));
        kv_decode_result_free(&r);
    }
    free(p);
    kv_decode_result_free(&clean);
    kv_fixture_free(&f);
}
END_TEST

/* ---- weights kept as stored -------------------------------------------- */

/* The F32 fixture with every weight rounded to BF16 in place, as
 * kv_fixture_build_dtype's BF16 image rounds it: the same values, stored
 * as F32. */
static void round_image_to_bf16(uint8_t *img, size_t len) {
    KvSafetensors tab;
    KvError err = {{0}};
    ck_assert_msg(kv_st_parse(img, len, "f32", &tab, &err) == KV_OK, "%s", err.msg);
    for (size_t t = 0; t < tab.n_tensors; t++) {
        ck_assert_int_eq(tab.tensors[t].dtype, KV_DTYPE_F32);
        uint8_t *p = (uint8_t *)(uintptr_t)(tab.data + tab.tensors[t].begin);
        const size_t n = (size_t)(tab.tensors[t].end - tab.tensors[t].begin) / 4;
        for (size_t i = 0; i < n; i++) {
            float f;
            uint8_t b[2];
            memcpy(&f, p + 4 * i, 4);
            kv_f32_to_bf16(&f, 1, b);
            kv_dtype_to_f32(KV_DTYPE_BF16, b, 1, &f);
            memcpy(p + 4 * i, &f, 4);
        }
    }
    kv_st_close(&tab);
}

/* The model ms (weights as stored: BF16, MXFP4) computes the bits of mf
 * (the same values stored as F32): every logit of the reference (whole and
 * chunked prefill: the GEMM; decode: the row kernel), a graph-mode variant,
 * the sequential-order calibration member, planted TF32, each at batch 2
 * (every step's matmuls have two rows) and 1 (the decode row kernel), and
 * the fp64 shadow over the long prompt. */
static void assert_stored_same(const KvModel *mf, const KvModel *ms, const char *what_model) {
    const KvConfig *cfg = &mf->config;
    KvError err = {{0}};
    const int64_t W = cfg->sliding_window > 0 ? cfg->sliding_window : 16;
    int32_t *prompts[2] = {make_prompt(W + 3, TEST_PROMPT_SEED, cfg->vocab_size),
                           make_prompt(4, TEST_PROMPT_SEED + 1, cfg->vocab_size)};
    const int64_t lens[2] = {W + 3, 4};
    const KvCacheOps *ring = kv_cache_find("ring");
    ck_assert_ptr_nonnull(ring);
    struct {
        const char *what;
        int64_t chunk;
        const KvCacheOps *variant;
        KvExecMode mode;
        unsigned order, faults;
    } runs[] = {
        {"reference", 0, NULL, KV_MODE_EAGER, 0, 0},
        {"chunked prefill", 5, NULL, KV_MODE_EAGER, 0, 0},
        {"ring, graph", 0, ring, KV_MODE_GRAPH, 0, 0},
        {"dot_sequential member", 0, NULL, KV_MODE_EAGER, KV_ORDER_DOT_SEQUENTIAL, 0},
        {"planted tf32", 0, NULL, KV_MODE_EAGER, 0, KV_FAULT_TF32},
    };
    for (size_t k = 0; k < 2 * sizeof runs / sizeof runs[0]; k++) {
        const int64_t batch = k % 2 == 0 ? 2 : 1;
        int32_t *tok = NULL;
        uint8_t *real = NULL;
        int64_t plen = 0;
        ck_assert_int_eq(kv_batch_left_pad((const int32_t *const *)prompts, lens, batch, 0, &tok,
                                           &real, &plen, &err), KV_OK);
        KvDecodeSpec spec = {.batch = batch, .prompt_len = plen, .prompt = tok, .prompt_real = real,
                             .new_tokens = W + 2, .prefill_chunk = runs[k / 2].chunk,
                             .variant = runs[k / 2].variant, .mode = runs[k / 2].mode,
                             .order = runs[k / 2].order, .faults = runs[k / 2].faults};
        KvDecodeResult rf = {0}, rs = {0};
        ck_assert_msg(kv_decode_greedy(mf, &spec, &rf, &err) == KV_OK, "%s", err.msg);
        ck_assert_msg(kv_decode_greedy(ms, &spec, &rs, &err) == KV_OK, "%s", err.msg);
        char what[160];
        snprintf(what, sizeof what, "%s: %s, batch %lld", what_model, runs[k / 2].what,
                 (long long)batch);
        assert_same(&rf, &rs, what);
        kv_decode_result_free(&rf);
        kv_decode_result_free(&rs);
        free(tok);
        free(real);
    }
    const int64_t n = lens[0];
    double *sf = malloc((size_t)(n * cfg->vocab_size) * sizeof *sf); /* (n, vocab) */
    double *ss = malloc((size_t)(n * cfg->vocab_size) * sizeof *ss); /* (n, vocab) */
    ck_assert(sf != NULL && ss != NULL);
    ck_assert_msg(kv_shadow64_logits(mf, prompts[0], n, 0, sf, &err) == KV_OK, "%s", err.msg);
    ck_assert_msg(kv_shadow64_logits(ms, prompts[0], n, 0, ss, &err) == KV_OK, "%s", err.msg);
    ck_assert_msg(memcmp(sf, ss, (size_t)(n * cfg->vocab_size) * sizeof *sf) == 0,
                  "%s: the fp64 shadow differs by storage", what_model);
    free(sf);
    free(ss);
    free(prompts[0]);
    free(prompts[1]);
}

/* A BF16 checkpoint, read as stored and widened in the kernels, computes
 * the bits of the same values stored as F32: the model hash, and every run
 * of assert_stored_same. */
START_TEST(test_stored_bf16_bitwise) {
    KvFamily family;
    KvFixtureSize size;
    KvConfig cfg;
    KvError err = {{0}};
    ck_assert_int_eq(kv_fixture_lookup(k_families[_i], &family, &size, &err), KV_OK);
    ck_assert_int_eq(kv_fixture_config(family, size, &cfg, &err), KV_OK);
    uint8_t *fimg = NULL, *bimg = NULL;
    size_t flen = 0, blen = 0;
    char *fjson = NULL, *bjson = NULL;
    ck_assert_int_eq(kv_fixture_build(&cfg, TEST_SEED, &fimg, &flen, &fjson, &err), KV_OK);
    ck_assert_int_eq(
        kv_fixture_build_dtype(&cfg, TEST_SEED, KV_DTYPE_BF16, &bimg, &blen, &bjson, &err), KV_OK);
    round_image_to_bf16(fimg, flen);
    KvModel mf, mb;
    ck_assert_msg(kv_model_load_memory(fjson, strlen(fjson), fimg, flen, "f32", &mf, &err) == KV_OK,
                  "%s", err.msg);
    ck_assert_msg(kv_model_load_memory(bjson, strlen(bjson), bimg, blen, "bf16", &mb, &err) == KV_OK,
                  "%s", err.msg);
    ck_assert_int_eq(mb.layers[0].wq.dtype, KV_DTYPE_BF16);
    ck_assert_int_eq(mb.lm_head.dtype, KV_DTYPE_BF16);
    ck_assert_int_eq(mf.lm_head.dtype, KV_DTYPE_F32);
    ck_assert_msg(kv_model_hash(&mf) == kv_model_hash(&mb), "%s: the hashes of the same values "
                  "differ by storage", k_families[_i]);
    ck_assert_uint_eq(mb.weight_bytes * 2 > mf.weight_bytes, true); /* vectors stay F32 */
    ck_assert_uint_eq(mb.weight_bytes < mf.weight_bytes, true);

    char what[96];
    snprintf(what, sizeof what, "%s, BF16 stored vs F32 stored", k_families[_i]);
    assert_stored_same(&mf, &mb, what);
    kv_model_free(&mf);
    kv_model_free(&mb);
    free(fimg);
    free(bimg);
    free(fjson);
    free(bjson);
}
END_TEST

/* An F32 checkpoint of m's values (m loaded from st): every tensor widened,
 * an MXFP4 expert stack (E, out, in) written back as the dense [E, in, out]
 * it stands for. */
static uint8_t *f32_twin(const KvModel *m, const KvSafetensors *st, size_t *len) {
    KvStWriteTensor *wt = calloc(st->n_tensors, sizeof *wt);
    float **vals = calloc(st->n_tensors, sizeof *vals);
    char (*names)[KV_ST_MAX_NAME] = calloc(st->n_tensors, sizeof *names);
    ck_assert(wt != NULL && vals != NULL && names != NULL);
    size_t n = 0;
    const int64_t H = m->config.hidden_size, I = m->config.intermediate_size;
    for (size_t t = 0; t < st->n_tensors; t++) {
        const KvTensorInfo *ti = &st->tensors[t];
        const char *suffix = strstr(ti->name, "_scales");
        if (suffix != NULL && suffix[7] == '\0') continue; /* with its blocks */
        const char *blk = strstr(ti->name, "_blocks");
        KvStWriteTensor *w = &wt[n];
        w->dtype = KV_DTYPE_F32;
        if (blk != NULL && blk[7] == '\0') {
            /* model.layers.L.mlp.experts.{gate_up,down}_proj_blocks */
            snprintf(names[n], sizeof names[n], "%.*s", (int)(blk - ti->name), ti->name);
            const long long l = strtoll(ti->name + strlen("model.layers."), NULL, 10);
            const bool gu = strstr(ti->name, "gate_up_proj") != NULL;
            const KvMat x = gu ? m->layers[l].experts_gate_up : m->layers[l].experts_down;
            const int64_t E = m->config.num_experts, out = gu ? 2 * I : H, in = gu ? H : I;
            ck_assert_int_eq(x.dtype, KV_DTYPE_F4);
            vals[n] = malloc((size_t)(E * out * in) * sizeof(float));
            ck_assert_ptr_nonnull(vals[n]);
            for (int64_t e = 0; e < E; e++)
                for (int64_t o = 0; o < out; o++)
                    for (int64_t i = 0; i < in; i++)
                        vals[n][(e * in + i) * out + o] = kv_mat_at(x, (e * out + o) * in + i);
            w->rank = 3;
            w->shape[0] = E;
            w->shape[1] = in;
            w->shape[2] = out;
        } else {
            snprintf(names[n], sizeof names[n], "%s", ti->name);
            int64_t numel = 1;
            for (int d = 0; d < ti->rank; d++) numel *= ti->shape[d];
            vals[n] = malloc((size_t)numel * sizeof(float) + 1);
            ck_assert_ptr_nonnull(vals[n]);
            kv_dtype_to_f32(ti->dtype, st->data + ti->begin, (size_t)numel, vals[n]);
            w->rank = ti->rank;
            for (int d = 0; d < ti->rank; d++) w->shape[d] = ti->shape[d];
        }
        w->name = names[n];
        w->data = vals[n];
        n++;
    }
    uint8_t *img = NULL;
    KvError err = {{0}};
    ck_assert_msg(kv_st_serialize(wt, n, &img, len, &err) == KV_OK, "%s", err.msg);
    for (size_t t = 0; t < n; t++) free(vals[t]);
    free(vals);
    free(names);
    free(wt);
    return img;
}

/* gpt-oss's MXFP4 experts read as stored (and the rest as BF16) compute the
 * bits of the same values stored as F32: the hash, and every run of
 * assert_stored_same (each expert's matmul one row at a time). */
START_TEST(test_stored_mxfp4_bitwise) {
    KvConfig cfg;
    KvError err = {{0}};
    ck_assert_int_eq(kv_fixture_config(KV_FAMILY_GPT_OSS, KV_SIZE_TINY, &cfg, &err), KV_OK);
    uint8_t *ximg = NULL;
    size_t xlen = 0;
    char *json = NULL;
    ck_assert_msg(kv_fixture_build_dtype(&cfg, TEST_SEED, KV_DTYPE_F4, &ximg, &xlen, &json,
                                         &err) == KV_OK, "%s", err.msg);
    KvModel mx, mf;
    ck_assert_msg(kv_model_load_memory(json, strlen(json), ximg, xlen, "mxfp4", &mx, &err) == KV_OK,
                  "%s", err.msg);
    ck_assert_int_eq(mx.layers[1].experts_down.dtype, KV_DTYPE_F4);
    size_t flen = 0;
    uint8_t *fimg = f32_twin(&mx, &mx.st, &flen);
    ck_assert_msg(kv_model_load_memory(json, strlen(json), fimg, flen, "f32", &mf, &err) == KV_OK,
                  "%s", err.msg);
    ck_assert_int_eq(mf.layers[1].experts_down.dtype, KV_DTYPE_F32);
    ck_assert_msg(kv_model_hash(&mx) == kv_model_hash(&mf), "the hashes of the same values differ "
                  "by storage");
    /* as stored: 4.25 bits an expert weight against 32 */
    ck_assert_uint_lt(mx.weight_bytes * 3, mf.weight_bytes);

    assert_stored_same(&mf, &mx, "gpt_oss-tiny, MXFP4 stored vs F32 stored");
    kv_model_free(&mx);
    kv_model_free(&mf);
    free(ximg);
    free(fimg);
    free(json);
}
END_TEST

static Suite *decode_suite(void) {
    Suite *s = suite_create("decode");
    TCase *tc = tcase_create("determinism");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, test_repeat_and_threads_bitwise, 0, N_FAM * (int)N_SHAPES);
    tcase_add_loop_test(tc, test_gemm_paths_bitwise, 0, N_FAM * (int)N_SHAPES);
    tcase_add_loop_test(tc, test_chunked_prefill_bitwise, 0, N_FAM);
    tcase_add_loop_test(tc, test_padded_row_equals_alone, 0, N_FAM);
    tcase_add_loop_test(tc, test_pad_skip_bitwise, 0, N_FAM);
    tcase_add_test(tc, test_probe_hash_two_levels);
    tcase_add_test(tc, test_probe_hash_side_by_side);
    tcase_add_loop_test(tc, test_stored_bf16_bitwise, 0, N_FAM);
    tcase_add_test(tc, test_stored_mxfp4_bitwise);
    suite_add_tcase(s, tc);
    TCase *sem = tcase_create("semantics");
    tcase_set_timeout(sem, 120);
    tcase_add_loop_test(sem, test_window_boundary, 0, N_FAM);
    tcase_add_test(sem, test_mixed_windows_boundary);
    tcase_add_loop_test(sem, test_margins_clear_of_ties, 0, N_FAM);
    tcase_add_test(sem, test_bad_tokens_rejected);
    tcase_add_loop_test(sem, test_nonfinite_located, 0, N_FAM);
    suite_add_tcase(s, sem);
    return s;
}

int main(void) {
    SRunner *sr = srunner_create(decode_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
