/* test_external.c: `kvrepro gate --model DIR --external RUN.h5` end to end.
 *
 * The external runs are built here, in C, the way the Python side writes
 * them (docs/SCHEMA.md): from the CPU reference's own decode of a left-padded
 * batch on the committed tiny checkpoint fixtures/hf/mistral, relabelled as
 * runs of another engine (backend torch-cpu, modes eager/compile/
 * reduce-overhead, an opaque variant name, engine-specific probe names and
 * hashes, the engine, recompiles and graph_budget attributes), then edited
 * one way per test. The kvrepro binary is run on them and its exit code,
 * output and report are checked:
 *   - an unedited copy passes every comparison (reference, finite, repeat,
 *     compiled_vs_eager, graph_budget), and the new attributes round-trip;
 *   - runs from two files in two prompt groups: one reference each, first;
 *   - a logit moved beyond max_rel_err fails `reference` at its step/row;
 *   - one probe hash changed in repeat 1 fails `repeat` at that step, row
 *     and probe, which diff and bisect also name; bisect --rerun refuses;
 *   - a token flipped at a clear margin in compile mode fails
 *     `compiled_vs_eager`;
 *   - 9 graphs against a budget of 1 fails `graph_budget` with the numbers;
 *   - a skipped run is a SKIP row with its reason;
 *   - top-k runs are compared at their kept ids, and say so;
 *   - a flip at a near-tie is not a failure when the run then follows the
 *     reference fed its tokens (the gate teacher-forces the reference);
 *   - bad values of a recording (top-k ids naming one id twice, a NaN margin
 *     beside finite logits, a negative margin, repeat or graph count, a skip
 *     reason that hides a failure, is empty, or sits on a run that ran) exit
 *     2 naming the file, the run and the field; a broken engine (NaN logits,
 *     "failed: ...") still fails with exit 1;
 *   - bad input (vocab, no --model, --variants, a missing, corrupt or
 *     repeated run) exits 2 naming the file, and writes nothing;
 *   - the count line comes last, after "report:" and "junit:"; a report or
 *     JUnit file that cannot be written after the runs are judged (a full
 *     disk) exits 2 naming it, with no count line printed and the previous
 *     file intact. */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <hdf5.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "decode.h"
#include "ensemble.h"
#include "model.h"
#include "prng.h"
#include "report.h"
#include "report_h5.h"
#include "tool_run.h"

#define EXT_MODEL_DIR KV_SOURCE_DIR "/fixtures/hf/mistral"
#define EXT_STEPS 12           /* past the window (8) of the fixture */
#define EXT_LAYERS_PROBES 3    /* per layer: attn, cache, out */

/* The reference decode every external run is built from, and a scratch
 * directory for the files of one test. */
typedef struct {
    KvModel model;
    KvDecodeResult res;
    int32_t *prompt; /* (B, P) */
    uint8_t *real;   /* (B, P) */
    int64_t batch, prompt_len;
    char dir[256];
} ExtFixture;

static ExtFixture fx;

static void ext_fixture_setup(void) {
    memset(&fx, 0, sizeof fx);
    KvError err = {{0}};
    ck_assert_msg(kv_model_load_dir(EXT_MODEL_DIR, &fx.model, &err) == KV_OK, "%s", err.msg);
    static const int32_t row0[] = {5, 17, 42, 7, 99, 3, 8, 1, 2, 3};
    static const int32_t row1[] = {11, 12, 13, 14};
    const int32_t *rows[] = {row0, row1};
    const int64_t lens[] = {10, 4};
    fx.batch = 2;
    ck_assert(kv_batch_left_pad(rows, lens, 2, 0, &fx.prompt, &fx.real, &fx.prompt_len, &err) ==
              KV_OK);
    const KvDecodeSpec spec = {.batch = fx.batch, .prompt_len = fx.prompt_len, .prompt = fx.prompt,
                               .prompt_real = fx.real, .new_tokens = EXT_STEPS};
    ck_assert_msg(kv_decode_greedy(&fx.model, &spec, &fx.res, &err) == KV_OK, "%s", err.msg);
    snprintf(fx.dir, sizeof fx.dir, "/tmp/kv_external_XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(fx.dir));
}

static void ext_fixture_teardown(void) {
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", fx.dir);
    if (system(cmd) != 0) fprintf(stderr, "test_external: could not remove %s\n", fx.dir);
    kv_decode_result_free(&fx.res);
    kv_model_free(&fx.model);
    free(fx.prompt);
    free(fx.real);
}

static void *dup_bytes(const void *src, size_t n) {
    void *p = malloc(n > 0 ? n : 1);
    ck_assert_ptr_nonnull(p);
    if (n > 0) memcpy(p, src, n);
    return p;
}

/* A run of "another engine": the reference decode's tokens, logits and
 * margins under the engine's own identity and probe layout. */
static KvRun ext_run(const char *scenario, const char *mode, int repeat) {
    KvRun r;
    kv_run_init(&r);
    const KvDecodeResult *d = &fx.res;
    const int64_t S = d->steps, B = d->batch, V = d->vocab, P = fx.prompt_len;
    snprintf(r.model, sizeof r.model, "mistral");
    snprintf(r.scenario, sizeof r.scenario, "%s", scenario);
    snprintf(r.variant, sizeof r.variant, "hf:static_sliding:sdpa:fp32");
    snprintf(r.backend, sizeof r.backend, "torch-cpu");
    snprintf(r.mode, sizeof r.mode, "%s", mode);
    snprintf(r.engine, sizeof r.engine, "transformers 5.23.0, torch 2.15.0, attn sdpa, fp32");
    r.repeat = repeat;
    r.steps = S;
    r.batch = B;
    r.vocab = V;
    r.prompt_len = P;
    r.prompt = dup_bytes(fx.prompt, (size_t)(B * P) * sizeof *r.prompt);
    r.prompt_real = dup_bytes(fx.real, (size_t)(B * P));
    r.tokens = dup_bytes(d->tokens, (size_t)(S * B) * sizeof *r.tokens);
    r.logits = dup_bytes(d->logits, (size_t)(S * B * V) * sizeof *r.logits);
    r.margins = dup_bytes(d->margins, (size_t)(S * B) * sizeof *r.margins);
    r.logits_hash = malloc((size_t)(S * B) * sizeof *r.logits_hash);
    ck_assert_ptr_nonnull(r.logits_hash);
    for (int64_t i = 0; i < S * B; i++) {
        r.logits_hash[i] = kv_fnv1a(KV_FNV_OFFSET, r.logits + i * V, (size_t)V * sizeof(float));
    }
    /* engine-specific probes: embed, per layer attn/cache/out, logits */
    const int64_t L = fx.model.config.num_layers;
    r.n_probes = 2 + EXT_LAYERS_PROBES * L;
    r.probe_names = calloc((size_t)r.n_probes, sizeof *r.probe_names);
    ck_assert_ptr_nonnull(r.probe_names);
    static const char *const items[] = {"attn", "cache", "out"};
    snprintf(r.probe_names[0], KV_NAME_LEN, "embed");
    for (int64_t l = 0; l < L; l++) {
        for (int k = 0; k < EXT_LAYERS_PROBES; k++) {
            snprintf(r.probe_names[1 + l * EXT_LAYERS_PROBES + k], KV_NAME_LEN, "layer%lld.%s",
                     (long long)l, items[k]);
        }
    }
    snprintf(r.probe_names[r.n_probes - 1], KV_NAME_LEN, "logits");
    r.probe_hash = malloc((size_t)(S * r.n_probes * B) * sizeof *r.probe_hash);
    ck_assert_ptr_nonnull(r.probe_hash);
    for (int64_t i = 0; i < S * r.n_probes * B; i++) {
        r.probe_hash[i] = kv_fnv1a(KV_FNV_OFFSET, &i, sizeof i);
    }
    const bool compiled = strcmp(mode, "eager") != 0;
    r.graphs_captured = compiled ? 1 : 0;
    r.recompiles = compiled ? 0 : -1;
    r.graph_budget = compiled ? 1 : -1;
    r.replay_mismatch_step = -1;
    return r;
}

/* A skipped run: attributes only. */
static KvRun ext_skipped(const char *scenario, const char *mode, const char *why) {
    KvRun r;
    kv_run_init(&r);
    snprintf(r.model, sizeof r.model, "mistral");
    snprintf(r.scenario, sizeof r.scenario, "%s", scenario);
    snprintf(r.variant, sizeof r.variant, "hf:static_sliding:sdpa:fp32");
    snprintf(r.backend, sizeof r.backend, "torch-cpu");
    snprintf(r.mode, sizeof r.mode, "%s", mode);
    r.skipped = true;
    snprintf(r.skip_reason, sizeof r.skip_reason, "%s", why);
    r.vocab = fx.res.vocab;
    return r;
}

/* Writes runs (taken: freed here) as a full schema-1 report at dir/name,
 * as the Python side writes one; returns its path (static per slot). */
static const char *ext_write(const char *name, KvRun *runs, int n) {
    static char paths[4][512];
    static int slot = 0;
    char *path = paths[slot++ % 4];
    snprintf(path, 512, "%s/%s", fx.dir, name);
    KvReport rep;
    memset(&rep, 0, sizeof rep);
    snprintf(rep.tool_version, sizeof rep.tool_version, "kvrepro-hf 0.1.0");
    snprintf(rep.git_commit, sizeof rep.git_commit, "none");
    snprintf(rep.host, sizeof rep.host, "test");
    snprintf(rep.device, sizeof rep.device, "cpu");
    snprintf(rep.math_mode, sizeof rep.math_mode, "fp32");
    snprintf(rep.shard, sizeof rep.shard, "1/1");
    rep.runs = calloc((size_t)n, sizeof *rep.runs);
    ck_assert_ptr_nonnull(rep.runs);
    memcpy(rep.runs, runs, (size_t)n * sizeof *runs);
    rep.n_runs = n;
    KvError err = {{0}};
    ck_assert_msg(kv_report_write_h5(&rep, path, &err) == KV_OK, "%s", err.msg);
    kv_report_free(&rep);
    return path;
}

/* Output of the last kvrepro run (stdout and stderr together). */
static char out[1 << 17];

/* Runs the kvrepro binary with the NULL-terminated arguments; returns its
 * exit code, its output in `out`. */
static int kvrepro(const char *arg0, ...) {
    const char *argv[64];
    int n = 0;
    argv[n++] = KVREPRO;
    va_list ap;
    va_start(ap, arg0);
    for (const char *a = arg0; a != NULL && n < 63; a = va_arg(ap, const char *)) argv[n++] = a;
    va_end(ap);
    argv[n] = NULL;
    char log[600];
    snprintf(log, sizeof log, "%s/kvrepro.log", fx.dir);
    const int rc = kv_tool_run(argv, log, out, sizeof out);
    ck_assert_msg(rc >= 0, "kvrepro did not exit normally:\n%s", out);
    return rc;
}

#define EXPECT_OUT(needle)                                                                         \
    ck_assert_msg(strstr(out, (needle)) != NULL, "expected '%s' in the output:\n%s", (needle), out)

/* dir/name (in one of 4 static slots, reused in turn). */
static const char *ext_path(const char *name) {
    static char paths[4][512];
    static int slot = 0;
    char *p = paths[slot++ % 4];
    snprintf(p, 512, "%s/%s", fx.dir, name);
    return p;
}

static bool file_exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0;
}

/* The gate's report, read back. */
static KvReport read_report(const char *path) {
    KvReport rep;
    KvError err = {{0}};
    ck_assert_msg(kv_report_read_h5(path, &rep, &err) == KV_OK, "%s", err.msg);
    return rep;
}

/* The comparison of kind k whose candidate is run b, or NULL. */
static const KvComparison *find_cmp(const KvReport *rep, KvCompareKind k, int64_t b) {
    for (int64_t c = 0; c < rep->n_comparisons; c++) {
        if (rep->comparisons[c].kind == k && rep->comparisons[c].run_b == b) {
            return &rep->comparisons[c];
        }
    }
    return NULL;
}

/* The step of the first row-0 position whose reference margin is clearly
 * above the tie margin (a flip there is a real failure), from step 1 on. */
static int64_t clear_margin_step(void) {
    for (int64_t s = 1; s < fx.res.steps; s++) {
        if (fx.res.margins[s * fx.res.batch] > 0.05f) return s;
    }
    ck_abort_msg("no step with a clear margin in row 0");
    return -1;
}

/* ---- passes --------------------------------------------------------------- */

START_TEST(test_copy_passes) {
    KvRun runs[4] = {ext_run("short", "eager", 0), ext_run("short", "eager", 1),
                     ext_run("short", "compile", 0),
                     ext_skipped("short", "reduce-overhead", "reduce-overhead needs a CUDA device")};
    const char *ext = ext_write("ext.h5", runs, 4);
    const char *rep_path = ext_path("r.h5");
    char junit[600];
    snprintf(junit, sizeof junit, "%s/r.xml", fx.dir);
    ck_assert_int_eq(kvrepro("gate", "--model", EXT_MODEL_DIR, "--external", ext, "--report",
                             rep_path, "--junit", junit, NULL), 0);
    /* 1 reference, 3 external runs and 3 calibration members pass */
    EXPECT_OUT("7 passed, 0 failed, 1 skipped");
    EXPECT_OUT("reduce-overhead needs a CUDA device");
    EXPECT_OUT("max_rel_err calibrated per prompt batch");
    EXPECT_OUT("calibrated short: max_rel_err ");
    /* the count line last, once both files are written */
    char tail[1400];
    snprintf(tail, sizeof tail, "\nreport: %s\njunit: %s\n7 passed, 0 failed, 1 skipped\n",
             rep_path, junit);
    const size_t lo = strlen(out), lt = strlen(tail);
    ck_assert_msg(lo >= lt && strcmp(out + lo - lt, tail) == 0,
                  "expected the output to end in:%s\nfound:\n%s", tail, out);
    KvReport rep = read_report(rep_path);
    ck_assert_int_eq(rep.n_runs, 8);
    /* the calibration last: three members, the unit's three tolerances, the
     * fp64 yardstick per step on the reference; the external runs are judged
     * by the calibrated max_rel_err */
    for (int64_t i = 5; i < 8; i++) {
        ck_assert_msg(strncmp(rep.runs[i].variant, "reference~", 10) == 0, "%s",
                      rep.runs[i].variant);
        const KvComparison *mc = find_cmp(&rep, KV_CMP_REFERENCE, i);
        ck_assert(mc != NULL && mc->verdict == KV_VERDICT_PASS && mc->run_a == 0);
    }
    ck_assert_ptr_nonnull(rep.runs[0].fp64_rel_err);
    double cal = -1.0;
    for (int64_t t = 0; t < rep.n_tolerances; t++) {
        if (strcmp(rep.tolerances[t].name, "max_rel_err@mistral/short") == 0) {
            cal = rep.tolerances[t].value;
        }
    }
    ck_assert_msg(cal > 0.0 && cal < 1e-4, "calibrated max_rel_err %g", cal);
    {
        char within[64];
        snprintf(within, sizeof within, "within max_rel_err %g", cal);
        const KvComparison *rc = find_cmp(&rep, KV_CMP_REFERENCE, 3);
        ck_assert_msg(strstr(rc->message, within) != NULL, "%s (want %s)", rc->message, within);
    }
    /* the reference first, named by the model directory and the scenario */
    ck_assert_str_eq(rep.runs[0].variant, "reference");
    ck_assert_str_eq(rep.runs[0].model, "mistral");
    ck_assert_str_eq(rep.runs[0].scenario, "short");
    ck_assert_str_eq(rep.runs[0].backend, "cpu");
    ck_assert_str_eq(rep.device, "cpu only");
    ck_assert_uint_eq(rep.model_hash, kv_model_hash(&fx.model));
    ck_assert_int_eq(rep.runs[0].recompiles, -1);
    ck_assert_int_eq(rep.runs[0].graph_budget, -1);
    ck_assert_str_eq(rep.runs[0].engine, "");
    /* then the external runs in file order, with all they recorded */
    ck_assert_str_eq(rep.runs[3].mode, "compile");
    ck_assert_str_eq(rep.runs[3].engine, "transformers 5.23.0, torch 2.15.0, attn sdpa, fp32");
    ck_assert_int_eq(rep.runs[3].recompiles, 0);
    ck_assert_int_eq(rep.runs[3].graph_budget, 1);
    ck_assert_int_eq(rep.runs[1].recompiles, -1);
    ck_assert(rep.runs[4].skipped);
    const KvCompareKind kinds[] = {KV_CMP_REFERENCE, KV_CMP_FINITE};
    for (int64_t x = 1; x <= 3; x++) {
        for (size_t k = 0; k < 2; k++) {
            const KvComparison *c = find_cmp(&rep, kinds[k], x);
            ck_assert_ptr_nonnull(c);
            ck_assert_msg(c->verdict == KV_VERDICT_PASS, "run %lld kind %d: %s", (long long)x,
                          (int)kinds[k], c->message);
        }
    }
    const KvComparison *ref = find_cmp(&rep, KV_CMP_REFERENCE, 1);
    ck_assert_int_eq(ref->run_a, 0);
    ck_assert_int_eq(ref->first_probe, -1);
    ck_assert(ref->max_rel_err == 0.0);
    const KvComparison *c = find_cmp(&rep, KV_CMP_REPEAT, 2);
    ck_assert(c != NULL && c->verdict == KV_VERDICT_PASS && c->run_a == 1);
    c = find_cmp(&rep, KV_CMP_COMPILED, 3);
    ck_assert(c != NULL && c->verdict == KV_VERDICT_PASS && c->run_a == 1);
    c = find_cmp(&rep, KV_CMP_GRAPH_BUDGET, 3);
    ck_assert(c != NULL && c->verdict == KV_VERDICT_PASS);
    ck_assert_msg(strstr(c->message, "1 decode graph (0 recompiles)") != NULL, "%s", c->message);
    /* a repeat, an eager run and a skipped run have none of these */
    ck_assert_ptr_null(find_cmp(&rep, KV_CMP_COMPILED, 1));
    ck_assert_ptr_null(find_cmp(&rep, KV_CMP_GRAPH_BUDGET, 1));
    for (int64_t k = 0; k < rep.n_comparisons; k++) ck_assert_int_ne(rep.comparisons[k].run_b, 4);
    kv_report_free(&rep);

    /* set attributes are written, unset ones are not */
    hid_t f = H5Fopen(rep_path, H5F_ACC_RDONLY, H5P_DEFAULT);
    ck_assert_int_ge(f, 0);
    hid_t g0 = H5Gopen2(f, "runs/0000", H5P_DEFAULT), g3 = H5Gopen2(f, "runs/0003", H5P_DEFAULT);
    ck_assert_int_eq(H5Aexists(g0, "engine"), 0);
    ck_assert_int_eq(H5Aexists(g0, "recompiles"), 0);
    ck_assert_int_eq(H5Aexists(g0, "graph_budget"), 0);
    ck_assert_int_gt(H5Aexists(g3, "engine"), 0);
    ck_assert_int_gt(H5Aexists(g3, "recompiles"), 0);
    ck_assert_int_gt(H5Aexists(g3, "graph_budget"), 0);
    H5Gclose(g0);
    H5Gclose(g3);
    H5Fclose(f);

    FILE *jf = fopen(junit, "r");
    ck_assert_ptr_nonnull(jf);
    static char xml[1 << 16];
    xml[fread(xml, 1, sizeof xml - 1, jf)] = '\0';
    fclose(jf);
    ck_assert(strstr(xml, "compiled_vs_eager: ") != NULL);
    ck_assert(strstr(xml, "graph_budget: ") != NULL);

    /* show works on the gate's report and on the external file itself */
    ck_assert_int_eq(kvrepro("show", rep_path, NULL), 0);
    EXPECT_OUT("hf:static_sliding:sdpa:fp32");
    ck_assert_int_eq(kvrepro("show", ext, NULL), 0);
    EXPECT_OUT("torch-cpu");
    /* diff of an external run against the reference: outputs only */
    ck_assert_int_eq(kvrepro("diff", rep_path, "--run", "0", "--run", "1", NULL), 0);
    EXPECT_OUT("probe layouts differ");
    EXPECT_OUT("reference agreement: agrees");
    /* --quiet: the count line only */
    ck_assert_int_eq(kvrepro("gate", "--model", EXT_MODEL_DIR, "--external", ext, "--quiet", NULL),
                     0);
    ck_assert_str_eq(out, "7 passed, 0 failed, 1 skipped\n");
    /* --no-calibrate: no members, the fixed default */
    ck_assert_int_eq(kvrepro("gate", "--model", EXT_MODEL_DIR, "--external", ext, "--no-calibrate",
                             "--report", rep_path, NULL), 0);
    EXPECT_OUT("tolerances: max_rel_err 0.0001,");
    EXPECT_OUT("4 passed, 0 failed, 1 skipped");
    rep = read_report(rep_path);
    ck_assert_int_eq(rep.n_runs, 5);
    ck_assert_int_eq(rep.n_tolerances, 2);
    ck_assert_ptr_null(rep.runs[0].fp64_rel_err);
    kv_report_free(&rep);
}
END_TEST

/* Two files, two prompt groups (the same batch decoded for 12 and for 8
 * steps: every array is step-major, so the first 8 steps are a prefix):
 * one reference decode per group, the references first, then the external
 * runs in file order. */
START_TEST(test_two_files_two_groups) {
    KvRun a[1] = {ext_run("short", "eager", 0)};
    KvRun b[2] = {ext_run("short8", "eager", 0), ext_run("short", "compile", 0)};
    b[0].steps = 8;
    const char *fa = ext_write("a.h5", a, 1);
    const char *fb = ext_write("b.h5", b, 2);
    const char *rep_path = ext_path("r.h5");
    ck_assert_int_eq(kvrepro("gate", "--model", EXT_MODEL_DIR, "--external", fa, "--external",
                             fb, "--report", rep_path, NULL), 0);
    EXPECT_OUT("reference: 2 CPU decodes");
    EXPECT_OUT("11 passed, 0 failed, 0 skipped"); /* with two groups' 3 members each */
    KvReport rep = read_report(rep_path);
    ck_assert_int_eq(rep.n_runs, 11);
    ck_assert_str_eq(rep.runs[0].variant, "reference");
    ck_assert_str_eq(rep.runs[0].scenario, "short");
    ck_assert_int_eq(rep.runs[0].steps, EXT_STEPS);
    ck_assert_str_eq(rep.runs[1].variant, "reference");
    ck_assert_str_eq(rep.runs[1].scenario, "short8");
    ck_assert_int_eq(rep.runs[1].steps, 8);
    ck_assert_str_eq(rep.runs[2].scenario, "short");
    ck_assert_str_eq(rep.runs[3].scenario, "short8");
    ck_assert_str_eq(rep.runs[4].mode, "compile");
    ck_assert_int_eq(find_cmp(&rep, KV_CMP_REFERENCE, 3)->run_a, 1);
    ck_assert_int_eq(find_cmp(&rep, KV_CMP_REFERENCE, 4)->run_a, 0);
    /* the compile run's eager twin is in the other file */
    ck_assert_int_eq(find_cmp(&rep, KV_CMP_COMPILED, 4)->run_a, 2);
    kv_report_free(&rep);
}
END_TEST

/* A run that kept only its top-k logits is compared at the kept ids. */
START_TEST(test_topk_compared_at_kept_ids) {
    KvRun runs[2] = {ext_run("short", "eager", 0), ext_run("short", "compile", 0)};
    const int K = 4;
    for (int k = 0; k < 2; k++) {
        KvRun *r = &runs[k];
        const int64_t rows = r->steps * r->batch;
        r->topk = K;
        r->topk_ids = malloc((size_t)(rows * K) * sizeof *r->topk_ids);
        r->topk_values = malloc((size_t)(rows * K) * sizeof *r->topk_values);
        for (int64_t i = 0; i < rows; i++) {
            /* any K ids will do for the comparison: the token and three others */
            for (int j = 0; j < K; j++) {
                const int32_t id = j == 0 ? r->tokens[i] : (r->tokens[i] + 7 * j) % (int32_t)r->vocab;
                r->topk_ids[i * K + j] = id;
                r->topk_values[i * K + j] = r->logits[i * r->vocab + id];
            }
        }
        free(r->logits);
        r->logits = NULL;
    }
    /* the compile run's kept value at step 5 row 1 moves by a lot */
    runs[1].topk_values[(5 * 2 + 1) * K + 2] += 3.0f;
    const char *ext = ext_write("topk.h5", runs, 2);
    const char *rep_path = ext_path("r.h5");
    ck_assert_int_eq(kvrepro("gate", "--model", EXT_MODEL_DIR, "--external", ext, "--report",
                             rep_path, NULL), 1);
    KvReport rep = read_report(rep_path);
    const KvComparison *c = find_cmp(&rep, KV_CMP_REFERENCE, 1);
    ck_assert_msg(c->verdict == KV_VERDICT_PASS, "%s", c->message);
    ck_assert_msg(strstr(c->message, "only the top-4 logits were compared") != NULL, "%s",
                  c->message);
    c = find_cmp(&rep, KV_CMP_REFERENCE, 2);
    ck_assert_msg(c->verdict == KV_VERDICT_FAIL, "%s", c->message);
    ck_assert_int_eq(c->first_step, 5);
    ck_assert_int_eq(c->first_row, 1);
    ck_assert_int_eq(c->first_probe, -1);
    c = find_cmp(&rep, KV_CMP_COMPILED, 2);
    ck_assert_msg(c->verdict == KV_VERDICT_FAIL && c->first_step == 5, "%s", c->message);
    kv_report_free(&rep);
}
END_TEST

/* The recording of an engine that flipped row 0's token at step s and went
 * on from there: the reference decode teacher-forced with the flipped
 * token, then with its own greedy tokens (one pass fixes one more step). */
static void ext_follow_flip(KvRun *r, int64_t s) {
    const KvDecodeResult *d = &fx.res;
    const int64_t S = d->steps, B = d->batch, V = d->vocab;
    int32_t *forced = dup_bytes(d->tokens, (size_t)(S * B) * sizeof *forced);
    forced[s * B] ^= 1;
    KvDecodeResult res = {0};
    KvError err = {{0}};
    for (int64_t pass = s; pass < S; pass++) {
        kv_decode_result_free(&res);
        const KvDecodeSpec spec = {.batch = B, .prompt_len = fx.prompt_len, .prompt = fx.prompt,
                                   .prompt_real = fx.real, .new_tokens = S, .forced = forced};
        ck_assert_msg(kv_decode_greedy(&fx.model, &spec, &res, &err) == KV_OK, "%s", err.msg);
        for (int64_t t = s + 1; t < S; t++) {
            for (int64_t b = 0; b < B; b++) forced[t * B + b] = res.tokens[t * B + b];
        }
    }
    memcpy(r->tokens, forced, (size_t)(S * B) * sizeof *forced);
    memcpy(r->logits, res.logits, (size_t)(S * B * V) * sizeof *r->logits);
    memcpy(r->margins, res.margins, (size_t)(S * B) * sizeof *r->margins);
    for (int64_t i = 0; i < S * B; i++) {
        r->logits_hash[i] = kv_fnv1a(KV_FNV_OFFSET, r->logits + i * V, (size_t)V * sizeof(float));
    }
    kv_decode_result_free(&res);
    free(forced);
}

/* A flip where the reference's margin is a near-tie is not a failure; the
 * reference is then fed the run's tokens and the rest of the row is
 * compared with that (here it agrees: the run is the forced decode). */
START_TEST(test_near_tie_flip_not_failed) {
    KvRun runs[1] = {ext_run("short", "eager", 0)};
    const int64_t s = clear_margin_step();
    ext_follow_flip(&runs[0], s);
    const char *ext = ext_write("tie.h5", runs, 1);
    const char *rep_path = ext_path("r.h5");
    /* every margin counts as a near-tie */
    ck_assert_int_eq(kvrepro("gate", "--model", EXT_MODEL_DIR, "--external", ext, "--tol",
                             "tie_margin=1000", "--report", rep_path, NULL), 0);
    KvReport rep = read_report(rep_path);
    const KvComparison *c = find_cmp(&rep, KV_CMP_REFERENCE, 1);
    ck_assert_msg(c->verdict == KV_VERDICT_PASS && c->near_ties == 1, "%s", c->message);
    kv_report_free(&rep);
}
END_TEST

/* A recording that flips at a near-tie at step 1 and then holds noise
 * (random logits and tokens) for the rest of that row: before teacher
 * forcing the rest of the row was never compared and this passed with "max
 * rel err 0"; now the reference fed its tokens judges every later step, and
 * the report says from where it forced. */
START_TEST(test_noise_after_tie_flip_fails) {
    KvRun runs[1] = {ext_run("short", "eager", 0)};
    KvRun *r = &runs[0];
    const int64_t B = r->batch, V = r->vocab;
    r->tokens[1 * B + 0] ^= 1; /* the flip, at a near-tie with tie_margin=1000 */
    KvPrng rng = kv_prng_seed(20261126);
    for (int64_t t = 2; t < r->steps; t++) {
        r->tokens[t * B + 0] = (int32_t)(kv_prng_next(&rng) % (uint64_t)V);
        for (int64_t v = 0; v < V; v++) {
            r->logits[(t * B + 0) * V + v] = (float)(kv_prng_next(&rng) % 1000) / 100.0f;
        }
    }
    for (int64_t i = 0; i < r->steps * B; i++) {
        r->logits_hash[i] = kv_fnv1a(KV_FNV_OFFSET, r->logits + i * V, (size_t)V * sizeof(float));
    }
    const char *ext = ext_write("noise.h5", runs, 1);
    const char *rep_path = ext_path("r.h5");
    ck_assert_int_eq(kvrepro("gate", "--model", EXT_MODEL_DIR, "--external", ext, "--tol",
                             "tie_margin=1000", "--report", rep_path, NULL), 1);
    EXPECT_OUT("forced from step 2 on");
    KvReport rep = read_report(rep_path);
    /* the forced reference is in the report, labelled so */
    int64_t forced = -1;
    for (int64_t i = 0; i < rep.n_runs; i++) {
        if (strcmp(rep.runs[i].variant, "reference~forced") == 0) forced = i;
    }
    ck_assert_int_ge(forced, 0);
    const KvComparison *c = find_cmp(&rep, KV_CMP_REFERENCE, 1);
    ck_assert_msg(c->verdict == KV_VERDICT_FAIL && c->first_step >= 2 && c->first_row == 0,
                  "%s", c->message);
    ck_assert_int_eq(c->run_a, forced);
    kv_report_free(&rep);
}
END_TEST

/* Every external run skipped: nothing was judged, the gate fails. */
START_TEST(test_all_skipped_fails) {
    KvRun runs[2] = {ext_skipped("short", "reduce-overhead", "no CUDA device"),
                     ext_skipped("short", "compile", "no CUDA device")};
    const char *ext = ext_write("skipped.h5", runs, 2);
    ck_assert_int_eq(kvrepro("gate", "--model", EXT_MODEL_DIR, "--external", ext, NULL), 1);
    EXPECT_OUT("FAIL: the gate judged no external run: all 2 were recorded as skipped");
}
END_TEST

/* A prompt batch whose reference work is above the gate's limit is
 * refused before it runs (exit 2), as the matrix gate refuses, unless
 * --allow-large-work: a file of a few hundred KB held
 * a 100,000-token prompt that ran for hours. Here: one row of 200,000
 * tokens, one step, on fixtures/hf/gemma2, whose full-attention layers
 * make the prefill quadratic. */
START_TEST(test_work_limit_applies) {
    const int64_t P = 200000, V = 256;
    KvRun r;
    kv_run_init(&r);
    snprintf(r.model, sizeof r.model, "gemma2");
    snprintf(r.scenario, sizeof r.scenario, "long_prompt");
    snprintf(r.variant, sizeof r.variant, "hf:static_sliding:sdpa:fp32");
    snprintf(r.backend, sizeof r.backend, "torch-cpu");
    snprintf(r.mode, sizeof r.mode, "eager");
    r.steps = 1;
    r.batch = 1;
    r.vocab = V;
    r.prompt_len = P;
    r.prompt = malloc((size_t)P * sizeof *r.prompt);
    r.prompt_real = malloc((size_t)P);
    r.tokens = calloc(1, sizeof *r.tokens);
    r.logits = calloc((size_t)V, sizeof *r.logits);
    r.margins = calloc(1, sizeof *r.margins);
    r.logits_hash = calloc(1, sizeof *r.logits_hash);
    ck_assert(r.prompt && r.prompt_real && r.tokens && r.logits && r.margins && r.logits_hash);
    for (int64_t i = 0; i < P; i++) {
        r.prompt[i] = (int32_t)(1 + i % (V - 1));
        r.prompt_real[i] = 1;
    }
    r.logits[0] = 1.0f;
    r.margins[0] = 1.0f;
    r.logits_hash[0] = kv_fnv1a(KV_FNV_OFFSET, r.logits, (size_t)V * sizeof(float));
    r.graphs_captured = 0;
    r.recompiles = -1;
    r.graph_budget = -1;
    r.replay_mismatch_step = -1;
    KvRun runs[1] = {r};
    const char *ext = ext_write("long.h5", runs, 1);
    const char *rep_path = ext_path("r.h5");
    ck_assert_int_eq(kvrepro("gate", "--model", KV_SOURCE_DIR "/fixtures/hf/gemma2", "--external",
                             ext, "--report", rep_path, NULL), 2);
    EXPECT_OUT("TFLOP of CPU reference work");
    EXPECT_OUT("--allow-large-work");
    ck_assert(!file_exists(rep_path));
}
END_TEST

/* The work line counts the calibration once: its members are
 * KV_ENSEMBLE_SIZE more decodes of the batch and the fp64 shadow one more of
 * its real tokens (it decodes each row alone: a padded batch's pads are
 * not its work), so calibrating multiplies the reference's work by at most
 * KV_ENSEMBLE_SIZE + 2, and by less with pads, not by that again (the limit
 * above is held to this figure). */
static double work_gflop(void) {
    const char *w = strstr(out, "token positions, ~");
    ck_assert_msg(w != NULL, "no work line in:\n%s", out);
    return strtod(w + strlen("token positions, ~"), NULL);
}

START_TEST(test_work_counts_calibration_once) {
    KvRun runs[1] = {ext_run("short", "eager", 0)};
    const char *ext = ext_write("ext.h5", runs, 1);
    ck_assert_int_eq(kvrepro("gate", "--model", EXT_MODEL_DIR, "--external", ext, "--no-calibrate",
                             NULL), 0);
    const double plain = work_gflop();
    ck_assert_int_eq(kvrepro("gate", "--model", EXT_MODEL_DIR, "--external", ext, NULL), 0);
    const double calibrated = work_gflop();
    ck_assert_msg(plain > 0.0 && calibrated / plain > KV_ENSEMBLE_SIZE + 1.5 &&
                      calibrated / plain < KV_ENSEMBLE_SIZE + 2 - 0.01,
                  "calibrated work %g GFLOP against %g without: ratio %g, expected %d less the "
                  "shadow's pads", calibrated, plain, calibrated / plain, KV_ENSEMBLE_SIZE + 2);
}
END_TEST

/* ---- bfloat16 runs ---------------------------------------------------------- */

/* ext_run as a bf16 run of attention `attn` whose logits carry noise of
 * `scale` x each row's largest |logit| (a deterministic LCG per run), the
 * tokens kept: what bfloat16 arithmetic does to a correct run. */
static KvRun bf16_run(const char *cache, const char *attn, const char *mode, double scale,
                      uint32_t seed) {
    KvRun r = ext_run("bf16", mode, 0);
    snprintf(r.variant, sizeof r.variant, "hf:%s:%s:bf16", cache, attn);
    snprintf(r.dtype, sizeof r.dtype, "bf16");
    snprintf(r.cache_layer, sizeof r.cache_layer, "%s", cache);
    snprintf(r.attn_impl, sizeof r.attn_impl, "%s", attn);
    const int64_t rows = r.steps * r.batch, V = r.vocab;
    uint32_t g = seed;
    for (int64_t i = 0; i < rows; i++) {
        float *row = r.logits + i * V;
        float mx = 0.0f;
        for (int64_t v = 0; v < V; v++) mx = fabsf(row[v]) > mx ? fabsf(row[v]) : mx;
        for (int64_t v = 0; v < V; v++) {
            g = g * 1664525u + 1013904223u;
            row[v] += (float)(scale * mx * ((double)(g >> 8) / 16777216.0 - 0.5));
        }
        r.logits_hash[i] = kv_fnv1a(KV_FNV_OFFSET, row, (size_t)V * sizeof(float));
    }
    return r;
}

/* The tolerance row named PREFIX@... of rep, or NULL. */
static const KvTolerance *find_tol(const KvReport *rep, const char *prefix) {
    for (int64_t i = 0; i < rep->n_tolerances; i++) {
        if (strncmp(rep->tolerances[i].name, prefix, strlen(prefix)) == 0) {
            return &rep->tolerances[i];
        }
    }
    return NULL;
}

/* A bf16 run is judged by the spread of the engine's own bf16 eager runs
 * (transformers' cache class) under two attention kernels: fp32's
 * calibration is a thousand times tighter than bfloat16 rounding. Correct
 * bf16 runs, eager and compiled, pass within 4x that spread; a cache layer
 * under test never joins the yardstick, so a broken one cannot excuse
 * itself, even run eager under both kernels; a lone bf16 run has no
 * yardstick and fails saying what to capture. */
START_TEST(test_bf16_yardstick) {
    KvRun runs[3] = {bf16_run("static_sliding", "eager", "eager", 0.01, 1u),
                     bf16_run("static_sliding", "sdpa", "eager", 0.01, 2u),
                     bf16_run("static_sliding", "sdpa", "compile", 0.01, 3u)};
    const char *ext = ext_write("bf16.h5", runs, 3);
    const char *rep_path = ext_path("bf16_r.h5");
    ck_assert_int_eq(kvrepro("gate", "--model", EXT_MODEL_DIR, "--external", ext, "--report",
                             rep_path, NULL), 0);
    KvReport rep = read_report(rep_path);
    const KvTolerance *spread = find_tol(&rep, "bf16_spread@");
    const KvTolerance *mre = find_tol(&rep, "bf16_max_rel_err@");
    const KvTolerance *tie = find_tol(&rep, "bf16_tie_margin@");
    ck_assert_ptr_nonnull(spread);
    ck_assert_ptr_nonnull(mre);
    ck_assert_ptr_nonnull(tie);
    /* two runs of uniform noise +-0.005 x max differ by at most 0.01 x max */
    ck_assert_msg(spread->value > 0.002 && spread->value <= 0.0101, "spread %g", spread->value);
    ck_assert(mre->value == 4.0 * spread->value);
    ck_assert(tie->value > 0.0);
    kv_report_free(&rep);

    /* a cache layer under test, eager under both kernels, one logit of its
     * last step 0.2 x max off in both: its pair does not set the yardstick,
     * and it fails against the one set by transformers' own layer */
    KvRun more[5] = {bf16_run("static_sliding", "eager", "eager", 0.01, 1u),
                     bf16_run("static_sliding", "sdpa", "eager", 0.01, 2u),
                     bf16_run("static_sliding", "sdpa", "compile", 0.01, 3u),
                     bf16_run("always_roll", "eager", "eager", 0.01, 4u),
                     bf16_run("always_roll", "sdpa", "eager", 0.01, 5u)};
    for (int k = 3; k < 5; k++) {
        KvRun *r = &more[k];
        const int64_t row = ((r->steps - 1) * r->batch) * r->vocab;
        float mx = 0.0f;
        int64_t low = 0; /* the smallest logit: the token stays */
        for (int64_t v = 0; v < r->vocab; v++) {
            mx = fabsf(r->logits[row + v]) > mx ? fabsf(r->logits[row + v]) : mx;
            low = r->logits[row + v] < r->logits[row + low] ? v : low;
        }
        r->logits[row + low] -= 0.2f * mx;
        r->logits_hash[(r->steps - 1) * r->batch] =
            kv_fnv1a(KV_FNV_OFFSET, r->logits + row, (size_t)r->vocab * sizeof(float));
    }
    ext = ext_write("bf16_bad.h5", more, 5);
    ck_assert_int_eq(kvrepro("gate", "--model", EXT_MODEL_DIR, "--external", ext, NULL), 1);
    EXPECT_OUT("hf:always_roll:eager:bf16/torch-cpu/eager/r0 reference: logits beyond "
               "max_rel_err");
    EXPECT_OUT("hf:always_roll:sdpa:bf16/torch-cpu/eager/r0 reference: logits beyond "
               "max_rel_err");
    EXPECT_OUT(" 2 failed"); /* never more: transformers' own runs pass */

    /* one bf16 run alone: no yardstick, judged by fp32's, and told why */
    KvRun lone[1] = {bf16_run("static_sliding", "eager", "eager", 0.01, 1u)};
    ext = ext_write("bf16_lone.h5", lone, 1);
    ck_assert_int_eq(kvrepro("gate", "--model", EXT_MODEL_DIR, "--external", ext, NULL), 1);
    EXPECT_OUT("a bf16 run is judged by a bf16 yardstick: capture this batch in bf16 eager with "
               "two attention kernels (--cache static_sliding --attn eager,sdpa)");
}
END_TEST

/* ---- failures ------------------------------------------------------------- */

START_TEST(test_logit_beyond_tolerance_fails_reference) {
    KvRun runs[1] = {ext_run("short", "eager", 0)};
    KvRun *r = &runs[0];
    /* step 2, row 1: the smallest logit lowered further (the token stays) */
    const int64_t row = (2 * r->batch + 1) * r->vocab;
    int64_t low = 0;
    for (int64_t v = 1; v < r->vocab; v++) low = r->logits[row + v] < r->logits[row + low] ? v : low;
    r->logits[row + low] -= 1.0f;
    const char *ext = ext_write("ext.h5", runs, 1);
    const char *rep_path = ext_path("r.h5");
    ck_assert_int_eq(kvrepro("gate", "--model", EXT_MODEL_DIR, "--external", ext, "--report",
                             rep_path, NULL), 1);
    EXPECT_OUT("logits beyond max_rel_err at step 2 row 1");
    EXPECT_OUT("4 passed, 1 failed, 0 skipped"); /* the reference run and its members pass */
}
END_TEST

START_TEST(test_repeat_probe_hash_fails_repeat) {
    KvRun runs[2] = {ext_run("short", "eager", 0), ext_run("short", "eager", 1)};
    const int64_t NP = runs[1].n_probes, B = runs[1].batch;
    const int64_t step = 3, probe = 2, row = 1;
    runs[1].probe_hash[(step * NP + probe) * B + row] ^= 0x10;
    const char *ext = ext_write("ext.h5", runs, 2);
    const char *rep_path = ext_path("r.h5");
    ck_assert_int_eq(kvrepro("gate", "--model", EXT_MODEL_DIR, "--external", ext, "--report",
                             rep_path, NULL), 1);
    EXPECT_OUT("repeat: not bitwise identical: first divergence at step 3 row 1, probe "
               "layer0.cache");
    KvReport rep = read_report(rep_path);
    const KvComparison *c = find_cmp(&rep, KV_CMP_REPEAT, 2);
    ck_assert_int_eq(c->verdict, KV_VERDICT_FAIL);
    ck_assert_int_eq(c->first_step, step);
    ck_assert_int_eq(c->first_row, row);
    ck_assert_int_eq(c->first_probe, probe);
    /* the repeat still agrees with the reference: its outputs are the same */
    ck_assert_int_eq(find_cmp(&rep, KV_CMP_REFERENCE, 2)->verdict, KV_VERDICT_PASS);
    kv_report_free(&rep);
    /* diff and bisect on the external file itself name the same point */
    ck_assert_int_eq(kvrepro("diff", ext, "--run", "0", "--run", "1", NULL), 1);
    EXPECT_OUT("first divergence at step 3 row 1, probe layer0.cache");
    ck_assert_int_eq(kvrepro("bisect", ext, "--run", "0", "--run", "1", NULL), 1);
    EXPECT_OUT("first divergence: step 3, row 1, probe layer0.cache");
    /* and on the gate's report, without --run: its first failing comparison
     * (the repeat; the reference comparisons pass) */
    ck_assert_int_eq(kvrepro("bisect", rep_path, NULL), 1);
    EXPECT_OUT("first divergence: step 3, row 1, probe layer0.cache");
    /* a recording of another engine cannot be re-executed */
    ck_assert_int_eq(kvrepro("bisect", ext, "--run", "0", "--run", "1", "--rerun", "--model",
                             EXT_MODEL_DIR, NULL), 2);
    EXPECT_OUT("recorded by another engine (backend 'torch-cpu'");
}
END_TEST

START_TEST(test_compile_flip_fails_compiled_vs_eager) {
    KvRun runs[2] = {ext_run("short", "eager", 0), ext_run("short", "compile", 0)};
    const int64_t s = clear_margin_step();
    runs[1].tokens[s * runs[1].batch] = (runs[1].tokens[s * runs[1].batch] + 1) % 256;
    const char *ext = ext_write("ext.h5", runs, 2);
    const char *rep_path = ext_path("r.h5");
    ck_assert_int_eq(kvrepro("gate", "--model", EXT_MODEL_DIR, "--external", ext, "--report",
                             rep_path, NULL), 1);
    EXPECT_OUT("compiled_vs_eager: token flip above the tie margin");
    KvReport rep = read_report(rep_path);
    const KvComparison *c = find_cmp(&rep, KV_CMP_COMPILED, 2);
    ck_assert_int_eq(c->verdict, KV_VERDICT_FAIL);
    ck_assert_int_eq(c->run_a, 1);
    ck_assert_int_eq(c->first_step, s);
    ck_assert_int_eq(c->first_row, 0);
    ck_assert_int_eq(c->first_probe, -1);
    ck_assert_msg(strstr(c->message, "compiled vs eager") != NULL, "%s", c->message);
    kv_report_free(&rep);
}
END_TEST

START_TEST(test_graphs_over_budget_fail) {
    KvRun runs[2] = {ext_run("short", "eager", 0), ext_run("short", "compile", 0)};
    runs[1].graphs_captured = 9;
    runs[1].recompiles = 8;
    runs[1].graph_budget = 1;
    const char *ext = ext_write("ext.h5", runs, 2);
    ck_assert_int_eq(kvrepro("gate", "--model", EXT_MODEL_DIR, "--external", ext, NULL), 1);
    EXPECT_OUT("graph_budget: 9 decode graphs (8 recompiles), budget 1: the decode recompiles");
    EXPECT_OUT("5 passed, 1 failed, 0 skipped");
}
END_TEST

/* ---- bad input: exit 2, a message naming the file, nothing written -------- */

START_TEST(test_bad_input_exits_2) {
    KvRun ok[1] = {ext_run("short", "eager", 0)};
    const char *good = ext_write("good.h5", ok, 1);
    const char *rep_path = ext_path("never.h5");

    /* a vocabulary that is not the model's */
    KvRun wide[1] = {ext_run("short", "eager", 0)};
    KvRun *w = &wide[0];
    const int64_t V = w->vocab + 1;
    float *logits = calloc((size_t)(w->steps * w->batch * V), sizeof *logits);
    free(w->logits);
    w->logits = logits;
    w->vocab = V;
    const char *bad_vocab = ext_write("vocab.h5", wide, 1);
    ck_assert_int_eq(kvrepro("gate", "--model", EXT_MODEL_DIR, "--external", bad_vocab,
                             "--report", rep_path, NULL), 2);
    EXPECT_OUT("vocab.h5: runs/0000 (mistral/short/hf:static_sliding:sdpa:fp32/torch-cpu/eager/"
               "r0): vocab: expected 256");
    ck_assert(!file_exists(rep_path));

    /* no --model, a fixture, or two models */
    ck_assert_int_eq(kvrepro("gate", "--external", good, NULL), 2);
    EXPECT_OUT("--external needs exactly one --model DIR");
    ck_assert_int_eq(kvrepro("gate", "--model", EXT_MODEL_DIR, "--model", EXT_MODEL_DIR,
                             "--external", good, NULL), 2);
    EXPECT_OUT("--external needs exactly one --model DIR");
    ck_assert_int_eq(kvrepro("gate", "--fixture", "mistral-tiny", "--external", good, NULL), 2);
    EXPECT_OUT("--fixture cannot be used with --external");

    /* matrix options are refused, not ignored */
    static const char *const refused[][2] = {
        {"--variants", "ring"}, {"--scenarios", "prompt_w"}, {"--backends", "cpu"},
        {"--modes", "eager"},   {"--repeats", "2"},          {"--fault", "tf32"},
        {"--faults", "all"},    {"--shard", "1/2"},          {"--max-new-tokens", "4"},
    };
    for (size_t k = 0; k < sizeof refused / sizeof refused[0]; k++) {
        ck_assert_int_eq(kvrepro("gate", "--model", EXT_MODEL_DIR, "--external", good,
                                 refused[k][0], refused[k][1], "--report", rep_path, NULL), 2);
        char want[96];
        snprintf(want, sizeof want, "%s cannot be used with --external", refused[k][0]);
        EXPECT_OUT(want);
    }
    /* --prompts needs a file that parses; refused before it is read */
    ck_assert_int_eq(kvrepro("gate", "--model", EXT_MODEL_DIR, "--prompts", good,
                             "--max-new-tokens", "3", "--external", good, NULL), 2);
    EXPECT_OUT("--prompts cannot be used with --external");

    /* a missing file and a corrupt one */
    const char *missing = ext_path("missing.h5");
    ck_assert_int_eq(kvrepro("gate", "--model", EXT_MODEL_DIR, "--external", good, "--external",
                             missing, "--report", rep_path, NULL), 2);
    EXPECT_OUT("missing.h5: cannot open");
    char corrupt[600];
    snprintf(corrupt, sizeof corrupt, "%s/corrupt.h5", fx.dir);
    FILE *f = fopen(corrupt, "wb");
    ck_assert_ptr_nonnull(f);
    fputs("this is not an HDF5 file\n", f);
    fclose(f);
    ck_assert_int_eq(kvrepro("gate", "--model", EXT_MODEL_DIR, "--external", corrupt,
                             "--report", rep_path, NULL), 2);
    EXPECT_OUT("corrupt.h5: expected an HDF5 file");

    /* one run label from two files */
    KvRun again[1] = {ext_run("short", "eager", 0)};
    const char *dup = ext_write("dup.h5", again, 1);
    ck_assert_int_eq(kvrepro("gate", "--model", EXT_MODEL_DIR, "--external", good, "--external",
                             dup, "--report", rep_path, NULL), 2);
    EXPECT_OUT("dup.h5: runs/0000: run label mistral/short/hf:static_sliding:sdpa:fp32/torch-cpu/"
               "eager/r0 is given again");

    /* one scenario name with two prompt batches */
    KvRun other[1] = {ext_run("short", "compile", 0)};
    other[0].prompt[0] = 77; /* row 0's first token */
    const char *two = ext_write("two.h5", other, 1);
    ck_assert_int_eq(kvrepro("gate", "--model", EXT_MODEL_DIR, "--external", good, "--external",
                             two, "--report", rep_path, NULL), 2);
    EXPECT_OUT("two.h5: runs/0000");
    EXPECT_OUT("scenario 'short' has another prompt batch");
    ck_assert(!file_exists(rep_path));
}
END_TEST

/* ---- values a recording may not hold ------------------------------------ */

/* The files below are written valid (the writer refuses these values too)
 * and then edited with HDF5, as a hand-made or damaged recording would be. */
static hid_t ext_open_run(const char *path, int run, hid_t *g) {
    hid_t f = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
    ck_assert_msg(f >= 0, "open %s", path);
    char name[32];
    snprintf(name, sizeof name, "/runs/%04d", run);
    *g = H5Gopen2(f, name, H5P_DEFAULT);
    ck_assert_msg(*g >= 0, "open %s", name);
    return f;
}

static void ext_close_run(hid_t f, hid_t g) { ck_assert(H5Gclose(g) >= 0 && H5Fclose(f) >= 0); }

/* Sets integer attribute name of run `run` in path (converted to its type). */
static void ext_set_int(const char *path, int run, const char *name, int64_t v) {
    hid_t g;
    hid_t f = ext_open_run(path, run, &g);
    hid_t a = H5Aopen(g, name, H5P_DEFAULT);
    ck_assert_msg(a >= 0 && H5Awrite(a, H5T_NATIVE_INT64, &v) >= 0, "write %s", name);
    ck_assert(H5Aclose(a) >= 0);
    ext_close_run(f, g);
}

/* Sets the fixed-length string attribute name of run `run` in path. */
static void ext_set_str(const char *path, int run, const char *name, const char *v) {
    hid_t g;
    hid_t f = ext_open_run(path, run, &g);
    hid_t a = H5Aopen(g, name, H5P_DEFAULT);
    hid_t t = a >= 0 ? H5Aget_type(a) : H5I_INVALID_HID;
    ck_assert_msg(t >= 0, "open %s", name);
    char buf[512] = {0};
    ck_assert(H5Tget_size(t) <= sizeof buf);
    snprintf(buf, H5Tget_size(t), "%s", v);
    ck_assert_msg(H5Awrite(a, t, buf) >= 0, "write %s", name);
    ck_assert(H5Tclose(t) >= 0 && H5Aclose(a) >= 0);
    ext_close_run(f, g);
}

/* Element k of dataset name of run `run` in path becomes v (read in the
 * memory type mem of elem bytes, changed, written back). */
static void ext_poke(const char *path, int run, const char *name, hid_t mem, size_t elem,
                     int64_t k, const void *v) {
    hid_t g;
    hid_t f = ext_open_run(path, run, &g);
    hid_t d = H5Dopen2(g, name, H5P_DEFAULT);
    hid_t sp = d >= 0 ? H5Dget_space(d) : H5I_INVALID_HID;
    ck_assert_msg(sp >= 0, "open %s", name);
    const hssize_t n = H5Sget_simple_extent_npoints(sp);
    ck_assert(n > k);
    char *buf = malloc((size_t)n * elem);
    ck_assert_ptr_nonnull(buf);
    ck_assert(H5Dread(d, mem, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf) >= 0);
    memcpy(buf + (size_t)k * elem, v, elem);
    ck_assert(H5Dwrite(d, mem, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf) >= 0);
    free(buf);
    ck_assert(H5Sclose(sp) >= 0 && H5Dclose(d) >= 0);
    ext_close_run(f, g);
}

/* kvrepro gate --external on path: exit 2, the message naming the file, the
 * run (its group and label) and the field, and no report written. */
static void expect_refused(const char *path, const char *run_label, const char *field) {
    const char *rep_path = ext_path("refused.h5");
    ck_assert_int_eq(kvrepro("gate", "--model", EXT_MODEL_DIR, "--external", path, "--report",
                             rep_path, NULL), 2);
    EXPECT_OUT(path);
    EXPECT_OUT(run_label);
    EXPECT_OUT(field);
    ck_assert(!file_exists(rep_path));
}

#define EXT_LABEL0 "/runs/0000 (mistral/short/hf:static_sliding:sdpa:fp32/torch-cpu/eager/r0)"

/* Top-k ids that repeat one id, a NaN margin beside finite logits, a
 * negative margin, a negative repeat or graph count, and a skip reason
 * that hides a failure (or says nothing, or sits on a run that ran) are
 * bad input: exit 2 naming the file, the run and the field. */
START_TEST(test_bad_values_exit_2) {
    /* a top-k run whose row (step 2, row 1) names one id twice */
    KvRun tk[1] = {ext_run("short", "eager", 0)};
    const int K = 4;
    KvRun *r = &tk[0];
    const int64_t rows = r->steps * r->batch;
    r->topk = K;
    r->topk_ids = malloc((size_t)(rows * K) * sizeof *r->topk_ids);
    r->topk_values = malloc((size_t)(rows * K) * sizeof *r->topk_values);
    ck_assert(r->topk_ids != NULL && r->topk_values != NULL);
    for (int64_t i = 0; i < rows; i++) {
        for (int j = 0; j < K; j++) {
            const int32_t id = j == 0 ? r->tokens[i] : (r->tokens[i] + 7 * j) % (int32_t)r->vocab;
            r->topk_ids[i * K + j] = id;
            r->topk_values[i * K + j] = r->logits[i * r->vocab + id];
        }
    }
    const int32_t again = r->topk_ids[(2 * 2 + 1) * K];
    free(r->logits);
    r->logits = NULL;
    const char *topk = ext_write("dup_ids.h5", tk, 1);
    ext_poke(topk, 0, "topk_ids", H5T_NATIVE_INT32, sizeof(int32_t), (2 * 2 + 1) * K + 3, &again);
    expect_refused(topk, EXT_LABEL0, "topk_ids[step 2, row 1]: expected 4 distinct token ids");

    /* a NaN margin beside finite logits, and a negative one */
    const float nan = NAN, neg = -0.5f;
    KvRun m1[1] = {ext_run("short", "eager", 0)};
    const char *nan_margin = ext_write("nan_margin.h5", m1, 1);
    ext_poke(nan_margin, 0, "margins", H5T_NATIVE_FLOAT, sizeof(float), 3 * 2 + 1, &nan);
    expect_refused(nan_margin, EXT_LABEL0, "margins[step 3, row 1]: expected a number");
    KvRun m2[1] = {ext_run("short", "eager", 0)};
    const char *neg_margin = ext_write("neg_margin.h5", m2, 1);
    ext_poke(neg_margin, 0, "margins", H5T_NATIVE_FLOAT, sizeof(float), 4 * 2, &neg);
    expect_refused(neg_margin, EXT_LABEL0, "margins[step 4, row 0]: expected >= 0");

    /* negative counts */
    KvRun c1[1] = {ext_run("short", "eager", 0)};
    const char *neg_repeat = ext_write("neg_repeat.h5", c1, 1);
    ext_set_int(neg_repeat, 0, "repeat", -1);
    expect_refused(neg_repeat, "/runs/0000", "attribute repeat: expected 0..2147483647, found -1");
    KvRun c2[1] = {ext_run("short", "compile", 0)};
    const char *neg_graphs = ext_write("neg_graphs.h5", c2, 1);
    ext_set_int(neg_graphs, 0, "graphs_captured", -3);
    expect_refused(neg_graphs, "/runs/0000", "attribute graphs_captured: expected 0..");

    /* skip reasons: a failure without the marker, none, one on a run that ran */
    static const struct {
        const char *reason;
        const char *want;
    } bad_reasons[] = {
        {"Failed: RuntimeError: CUDA error", "expected a run that failed to start with the marker "
                                             "'failed: '"},
        {"failed:RuntimeError", "expected a run that failed to start with the marker 'failed: '"},
        {"  failed: RuntimeError", "expected a run that failed to start with the marker"},
        {"failed: ", "expected a run that failed to start with the marker"},
        {"", "skip_reason: expected why the run was skipped, found an empty reason"},
    };
    for (size_t k = 0; k < sizeof bad_reasons / sizeof bad_reasons[0]; k++) {
        KvRun sk[2] = {ext_run("short", "eager", 0),
                       ext_skipped("short", "reduce-overhead", "no CUDA device")};
        const char *path = ext_write("bad_reason.h5", sk, 2);
        ext_set_str(path, 1, "skip_reason", bad_reasons[k].reason);
        expect_refused(path, "/runs/0001 (mistral/short/hf:static_sliding:sdpa:fp32/torch-cpu/"
                             "reduce-overhead/r0)", bad_reasons[k].want);
    }
    KvRun ran[1] = {ext_run("short", "eager", 0)};
    const char *ran_reason = ext_write("ran_reason.h5", ran, 1);
    ext_set_str(ran_reason, 0, "skip_reason", "reduce-overhead needs a CUDA device");
    expect_refused(ran_reason, EXT_LABEL0,
                   "skip_reason: expected an empty reason on a run that ran (skipped 0)");
}
END_TEST

/* What is not bad input: a NaN margin where the row holds a NaN logit (the
 * engine broke: its finite check fails), and a failure stated with the
 * marker (it fails, never skips): exit 1, not 2. */
START_TEST(test_broken_engine_fails_not_refused) {
    KvRun runs[1] = {ext_run("short", "eager", 0)};
    KvRun *r = &runs[0];
    r->logits[(5 * r->batch + 0) * r->vocab + 9] = NAN;
    r->margins[5 * r->batch] = NAN;
    const char *ext = ext_write("nan_row.h5", runs, 1);
    const char *rep_path = ext_path("r.h5");
    ck_assert_int_eq(kvrepro("gate", "--model", EXT_MODEL_DIR, "--external", ext, "--report",
                             rep_path, NULL), 1);
    KvReport rep = read_report(rep_path);
    const KvComparison *c = find_cmp(&rep, KV_CMP_FINITE, 1);
    ck_assert_msg(c != NULL && c->verdict == KV_VERDICT_FAIL, "%s", c ? c->message : "none");
    kv_report_free(&rep);

    KvRun sk[2] = {ext_run("short", "eager", 0),
                   ext_skipped("short", "compile", "failed: RuntimeError: boom")};
    const char *failed = ext_write("failed.h5", sk, 2);
    ck_assert_int_eq(kvrepro("gate", "--model", EXT_MODEL_DIR, "--external", failed, "--report",
                             rep_path, NULL), 1);
    EXPECT_OUT("RuntimeError: boom");
}
END_TEST

/* ---- an output that cannot be written after the run --------------------- */

/* The files a full disk stops: RLIMIT_FSIZE bytes, with SIGXFSZ ignored so
 * that write() fails with EFBIG, the way ENOSPC makes it fail. */
#define EXT_FSIZE_LIMIT 1024

/* kvrepro with argv (NULL-terminated, after the binary) under
 * EXT_FSIZE_LIMIT; its output (through a pipe, which the limit does not
 * cover) in `out`; returns its exit code. */
static int kvrepro_disk_full(const char *const *args) {
    const char *argv[64];
    int n = 0;
    argv[n++] = KVREPRO;
    for (int k = 0; args[k] != NULL && n < 63; k++) argv[n++] = args[k];
    argv[n] = NULL;
    int fds[2];
    ck_assert_msg(pipe(fds) == 0, "pipe: %s", strerror(errno));
    const pid_t pid = fork();
    ck_assert_msg(pid >= 0, "fork: %s", strerror(errno));
    if (pid == 0) {
        close(fds[0]);
        const struct rlimit lim = {EXT_FSIZE_LIMIT, EXT_FSIZE_LIMIT};
        if (dup2(fds[1], 1) < 0 || dup2(fds[1], 2) < 0 || signal(SIGXFSZ, SIG_IGN) == SIG_ERR ||
            setrlimit(RLIMIT_FSIZE, &lim) != 0) {
            _exit(126);
        }
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    close(fds[1]);
    size_t got = 0;
    ssize_t r;
    while ((r = read(fds[0], out + got, sizeof out - 1 - got)) > 0) got += (size_t)r;
    out[got] = '\0';
    close(fds[0]);
    int status = 0;
    ck_assert(waitpid(pid, &status, 0) == pid);
    ck_assert_msg(WIFEXITED(status), "kvrepro did not exit normally (status 0x%x):\n%s",
                  (unsigned)status, out);
    return WEXITSTATUS(status);
}

static char *slurp_file(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    ck_assert_msg(f != NULL, "open %s: %s", path, strerror(errno));
    ck_assert(fseek(f, 0, SEEK_END) == 0);
    const long len = ftell(f);
    ck_assert(len >= 0 && fseek(f, 0, SEEK_SET) == 0);
    char *buf = malloc((size_t)len + 1);
    ck_assert_ptr_nonnull(buf);
    ck_assert(fread(buf, 1, (size_t)len, f) == (size_t)len);
    fclose(f);
    *n = (size_t)len;
    return buf;
}

/* The gate judged every run, then cannot write --report (or --junit): exit
 * 2 naming the path, no count line (a log must not say "passed" for a gate
 * whose report is missing), the previous file byte for byte and no
 * temporary beside it. */
START_TEST(test_unwritable_output_exits_2) {
    KvRun runs[2] = {ext_run("short", "eager", 0), ext_run("short", "compile", 0)};
    const char *ext = ext_write("ext.h5", runs, 2);
    static const char *const flags[2] = {"--report", "--junit"};
    static const char *const names[2] = {"r.h5", "r.xml"};
    for (int k = 0; k < 2; k++) {
        const char *path = ext_path(names[k]);
        const char *const args[] = {"gate", "--model", EXT_MODEL_DIR, "--external", ext,
                                    flags[k], path, NULL};
        ck_assert_int_eq(kvrepro(args[0], args[1], args[2], args[3], args[4], args[5], args[6],
                                 NULL), 0);
        size_t n_before = 0, n_after = 0;
        char *before = slurp_file(path, &n_before);
        ck_assert_msg(n_before > EXT_FSIZE_LIMIT, "%s: %zu bytes fit under the limit", path,
                      n_before);
        ck_assert_int_eq(kvrepro_disk_full(args), 2);
        char want[700];
        snprintf(want, sizeof want, "%s: cannot write: %s", path, strerror(EFBIG));
        EXPECT_OUT(want);
        EXPECT_OUT("#  model"); /* the table was printed, before the write */
        ck_assert_msg(strstr(out, " passed, ") == NULL,
                      "a count line printed for a gate whose %s was not written:\n%s", flags[k],
                      out);
        char *after = slurp_file(path, &n_after);
        ck_assert_msg(n_after == n_before && memcmp(before, after, n_before) == 0,
                      "%s changed by the failed write", path);
        free(before);
        free(after);
        DIR *d = opendir(fx.dir);
        ck_assert_ptr_nonnull(d);
        struct dirent *e;
        while ((e = readdir(d)) != NULL) {
            ck_assert_msg(strstr(e->d_name, ".tmp-") == NULL, "temporary %s left in %s",
                          e->d_name, fx.dir);
        }
        closedir(d);
    }
}
END_TEST

static Suite *external_suite(void) {
    Suite *s = suite_create("external");
    TCase *tc = tcase_create("gate_external");
    tcase_add_checked_fixture(tc, ext_fixture_setup, ext_fixture_teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_copy_passes);
    tcase_add_test(tc, test_two_files_two_groups);
    tcase_add_test(tc, test_topk_compared_at_kept_ids);
    tcase_add_test(tc, test_near_tie_flip_not_failed);
    tcase_add_test(tc, test_noise_after_tie_flip_fails);
    tcase_add_test(tc, test_all_skipped_fails);
    tcase_add_test(tc, test_work_limit_applies);
    tcase_add_test(tc, test_work_counts_calibration_once);
    tcase_add_test(tc, test_bf16_yardstick);
    tcase_add_test(tc, test_logit_beyond_tolerance_fails_reference);
    tcase_add_test(tc, test_repeat_probe_hash_fails_repeat);
    tcase_add_test(tc, test_compile_flip_fails_compiled_vs_eager);
    tcase_add_test(tc, test_graphs_over_budget_fail);
    tcase_add_test(tc, test_bad_input_exits_2);
    tcase_add_test(tc, test_bad_values_exit_2);
    tcase_add_test(tc, test_broken_engine_fails_not_refused);
    tcase_add_test(tc, test_unwritable_output_exits_2);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    SRunner *sr = srunner_create(external_suite());
    srunner_run_all(sr, CK_NORMAL);
    const int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
