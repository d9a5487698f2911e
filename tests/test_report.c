/* test_report.c: the "report" suite: the in-memory report (reports/report.h),
 * its HDF5 form (reports/report_h5.h, SCHEMA.md) and the summary table.
 *
 * A small synthetic report (one model, three runs of which one is skipped,
 * two comparisons, two tolerances; values exactly representable, plus -0,
 * +inf, a NaN with a payload and 64-bit values above INT64_MAX) is written,
 * read back and compared field by field; written twice across a clock
 * second and under malloc perturbation, and the bytes compared; opened with
 * h5dump; and damaged in the ways a reader meets (missing, not HDF5,
 * truncated, other schema version, missing objects, inconsistent shapes).
 *
 * Hostile reports are crafted with the HDF5 API (sizes the file does not
 * back, tables of ten million declared rows, links to other files and
 * objects, objects of the wrong kind): each must be refused as bad input, in
 * a child process with a time limit and (outside ASan) an address-space
 * limit, so that a reader that allocated what the file declares, or worked
 * for minutes, fails the test instead of the machine. Writes meet a "full
 * disk" (RLIMIT_FSIZE: the same failed write() a full disk gives, with
 * EFBIG for ENOSPC), a writer killed mid-write, and temporaries left by dead
 * writers. */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <hdf5.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

#include "report.h"
#include "report_h5.h"

/* Synthetic report shape: (steps, batch, vocab), prompt length, probes. */
#define T_STEPS 3
#define T_BATCH 2
#define T_VOCAB 5
#define T_PLEN 4
#define T_PROBES 3

static char g_dir[PATH_MAX]; /* per-test scratch directory */

static void *test_alloc(size_t n) {
    void *p = calloc(1, n > 0 ? n : 1);
    ck_assert_msg(p != NULL, "out of memory (%zu bytes)", n);
    return p;
}

static void scratch_path(char *buf, size_t n, const char *name) {
    int w = snprintf(buf, n, "%s/%s", g_dir, name);
    ck_assert_msg(w > 0 && (size_t)w < n, "path too long: %s/%s", g_dir, name);
}

/* Removes everything under dir (one level of subdirectories is enough here). */
static void remove_tree(const char *dir) {
    DIR *d = opendir(dir);
    if (d == NULL) return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        char p[PATH_MAX];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        struct stat sb;
        if (lstat(p, &sb) == 0 && S_ISDIR(sb.st_mode)) {
            remove_tree(p);
        } else {
            unlink(p);
        }
    }
    closedir(d);
    rmdir(dir);
}

static void setup(void) {
    const char *tmp = getenv("TMPDIR");
    snprintf(g_dir, sizeof g_dir, "%s/kvrepro-test-report-XXXXXX",
             tmp != NULL && tmp[0] != '\0' ? tmp : "/tmp");
    ck_assert_msg(mkdtemp(g_dir) != NULL, "mkdtemp %s: %s", g_dir, strerror(errno));
}

static void teardown(void) { remove_tree(g_dir); }

/* Number of entries in the scratch directory whose name contains part
 * (NULL: all entries). */
static int count_entries(const char *part) {
    DIR *d = opendir(g_dir);
    ck_assert_msg(d != NULL, "opendir %s: %s", g_dir, strerror(errno));
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        if (part == NULL || strstr(e->d_name, part) != NULL) n++;
    }
    closedir(d);
    return n;
}

static bool path_exists(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0;
}

/* ---- the synthetic report ------------------------------------------------ */

static float float_from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static void fill_run(KvRun *r, const char *variant, const char *mode, int32_t repeat, int salt) {
    snprintf(r->model, sizeof r->model, "fx-gemma2");
    snprintf(r->scenario, sizeof r->scenario, "prompt_w_plus_1");
    snprintf(r->variant, sizeof r->variant, "%s", variant);
    snprintf(r->backend, sizeof r->backend, "cpu");
    snprintf(r->mode, sizeof r->mode, "%s", mode);
    r->repeat = repeat;
    r->steps = T_STEPS;
    r->batch = T_BATCH;
    r->vocab = T_VOCAB;
    r->prompt_len = T_PLEN;
    r->n_probes = T_PROBES;
    r->prompt = test_alloc(T_BATCH * T_PLEN * sizeof *r->prompt);           /* (B, P) */
    r->prompt_real = test_alloc(T_BATCH * T_PLEN * sizeof *r->prompt_real); /* (B, P) */
    for (int b = 0; b < T_BATCH; b++) {
        for (int p = 0; p < T_PLEN; p++) {
            const bool pad = b == 1 && p == 0; /* row 1 is left-padded by one */
            r->prompt[b * T_PLEN + p] = pad ? 0 : 100 + 10 * b + p;
            r->prompt_real[b * T_PLEN + p] = pad ? 0 : 1;
        }
    }
    r->tokens = test_alloc(T_STEPS * T_BATCH * sizeof *r->tokens); /* (S, B) */
    r->logits_hash = test_alloc(T_STEPS * T_BATCH * sizeof *r->logits_hash);
    r->margins = test_alloc(T_STEPS * T_BATCH * sizeof *r->margins);
    r->logits = test_alloc(T_STEPS * T_BATCH * T_VOCAB * sizeof *r->logits); /* (S, B, V) */
    for (int i = 0; i < T_STEPS * T_BATCH; i++) {
        r->tokens[i] = (i * 3 + salt) % T_VOCAB;
        r->logits_hash[i] = 0xcbf29ce484222325ULL ^ (uint64_t)(i + 17 * salt);
        r->margins[i] = 0.125f * (float)(i + 1);
    }
    for (int i = 0; i < T_STEPS * T_BATCH * T_VOCAB; i++) {
        r->logits[i] = 0.25f * (float)(i - 7 + salt); /* exactly representable */
    }
    r->logits[0] = -0.0f;
    r->logits[1] = INFINITY;
    r->logits[2] = float_from_bits(0x7fc01234u); /* a NaN with a payload */
    r->probe_names = test_alloc(T_PROBES * sizeof *r->probe_names);
    snprintf(r->probe_names[0], KV_NAME_LEN, "embed");
    snprintf(r->probe_names[1], KV_NAME_LEN, "layer0.q");
    snprintf(r->probe_names[2], KV_NAME_LEN, "layer0.k");
    r->probe_hash = test_alloc(T_STEPS * T_PROBES * T_BATCH * sizeof *r->probe_hash);
    for (int i = 0; i < T_STEPS * T_PROBES * T_BATCH; i++) {
        r->probe_hash[i] = 0x8000000000000000ULL | (uint64_t)(i * 7919 + salt);
    }
    r->replay_mismatch_step = -1;
}

/* One model, three runs (reference; a failing graph run; a skipped CUDA
 * run), two comparisons, two tolerances. */
static void build_report(KvReport *rep) {
    memset(rep, 0, sizeof *rep);
    snprintf(rep->tool_version, sizeof rep->tool_version, "0.1.0");
    snprintf(rep->git_commit, sizeof rep->git_commit, "81bb48f0a1b2");
    snprintf(rep->host, sizeof rep->host, "ci-runner-7");
    snprintf(rep->device, sizeof rep->device, "cpu only");
    snprintf(rep->math_mode, sizeof rep->math_mode, "fp32, no TF32, -ffp-contract=off");
    rep->weight_seed = UINT64_MAX; /* above INT64_MAX: must stay unsigned */
    rep->prompt_seed = 12345;
    rep->model_hash = 0x8000000000000001ULL;
    snprintf(rep->shard, sizeof rep->shard, "1/1");

    rep->n_tolerances = 2;
    rep->tolerances = test_alloc(2 * sizeof *rep->tolerances);
    snprintf(rep->tolerances[0].name, KV_NAME_LEN, "max_rel_err");
    rep->tolerances[0].value = 0.0001220703125; /* 2^-13 */
    snprintf(rep->tolerances[0].reason, sizeof rep->tolerances[0].reason,
             "F32 reduction-order differences stay below it");
    snprintf(rep->tolerances[1].name, KV_NAME_LEN, "tie_margin");
    rep->tolerances[1].value = 0.015625;
    snprintf(rep->tolerances[1].reason, sizeof rep->tolerances[1].reason,
             "a flip under this top-1 margin is a near-tie");

    rep->n_runs = 3;
    rep->runs = test_alloc(3 * sizeof *rep->runs);
    fill_run(&rep->runs[0], "reference", "eager", 0, 0);
    fill_run(&rep->runs[1], "index_copy", "graph", 1, 1);
    /* the optional attributes of another engine's run: unset in run 0 (and
     * the skipped run 2), set in run 1 */
    rep->runs[0].recompiles = rep->runs[0].graph_budget = -1;
    /* the optional per-step fp64 error: on run 0 (a calibrated reference) only */
    rep->runs[0].fp64_rel_err = test_alloc(T_STEPS * sizeof(double));
    for (int s = 0; s < T_STEPS; s++) rep->runs[0].fp64_rel_err[s] = (s + 1) / 3.0e6;
    snprintf(rep->runs[1].engine, sizeof rep->runs[1].engine, "transformers 5.23.0, fp32");
    rep->runs[1].recompiles = 3;
    rep->runs[1].graph_budget = 1;
    rep->runs[1].graphs_captured = 2;
    rep->runs[1].replays_checked = 3;
    rep->runs[1].replay_mismatch_step = 2;
    rep->runs[1].seconds = 0.5;
    KvRun *sk = &rep->runs[2]; /* attributes only */
    snprintf(sk->model, sizeof sk->model, "fx-gemma2");
    snprintf(sk->scenario, sizeof sk->scenario, "prompt_w_plus_1");
    snprintf(sk->variant, sizeof sk->variant, "ring");
    snprintf(sk->backend, sizeof sk->backend, "cuda");
    snprintf(sk->mode, sizeof sk->mode, "eager");
    sk->skipped = true;
    snprintf(sk->skip_reason, sizeof sk->skip_reason, "no CUDA device: cudaErrorNoDevice");
    sk->steps = T_STEPS;
    sk->batch = T_BATCH;
    sk->vocab = T_VOCAB;
    sk->prompt_len = T_PLEN;
    sk->replay_mismatch_step = -1;
    sk->recompiles = sk->graph_budget = -1;

    rep->n_comparisons = 2;
    rep->comparisons = test_alloc(2 * sizeof *rep->comparisons);
    KvComparison *c0 = &rep->comparisons[0];
    c0->kind = KV_CMP_REFERENCE;
    c0->run_a = 0;
    c0->run_b = 1;
    c0->verdict = KV_VERDICT_FAIL;
    snprintf(c0->message, sizeof c0->message,
             "max_rel_err 0.0625 > 0.000122 at step 1 row 0, probe layer0.k");
    c0->first_step = 1;
    c0->first_row = 0;
    c0->first_probe = 2;
    c0->near_ties = 1;
    c0->max_abs_err = 0.125;
    c0->max_rel_err = 0.0625;
    c0->nmse = 0.001953125;
    c0->kl = 0.0078125;
    c0->top1_agreement = 0.75;
    KvComparison *c1 = &rep->comparisons[1];
    c1->kind = KV_CMP_VARIANT;
    c1->run_a = 0;
    c1->run_b = 2;
    c1->verdict = KV_VERDICT_SKIP;
    snprintf(c1->message, sizeof c1->message, "skipped: no CUDA device: cudaErrorNoDevice");
    c1->first_step = c1->first_row = c1->first_probe = -1;
    c1->max_rel_err = NAN;
}

/* Writes the synthetic report to scratch name; path returned in buf. */
static void write_synthetic(const char *name, char *buf, size_t n) {
    KvReport rep;
    build_report(&rep);
    scratch_path(buf, n, name);
    KvError err = {{0}};
    KvStatus st = kv_report_write_h5(&rep, buf, &err);
    ck_assert_msg(st == KV_OK, "write %s: status %d: %s", buf, st, err.msg);
    kv_report_free(&rep);
}

/* ---- exact comparison --------------------------------------------------- */

#define SAME_BYTES(a, b, n, what)                                                                  \
    ck_assert_msg(((a) == NULL && (b) == NULL) ||                                                  \
                      ((a) != NULL && (b) != NULL && memcmp((a), (b), (n)) == 0),                  \
                  "%s differs", what)

static void assert_same_run(const KvRun *a, const KvRun *b, int64_t i) {
    char what[64];
    snprintf(what, sizeof what, "runs[%lld]", (long long)i);
    ck_assert_str_eq(a->model, b->model);
    ck_assert_str_eq(a->scenario, b->scenario);
    ck_assert_str_eq(a->variant, b->variant);
    ck_assert_str_eq(a->fault, b->fault);
    ck_assert_int_eq(a->prefill_chunk, b->prefill_chunk);
    ck_assert_str_eq(a->backend, b->backend);
    ck_assert_str_eq(a->mode, b->mode);
    ck_assert_int_eq(a->repeat, b->repeat);
    ck_assert_int_eq(a->skipped, b->skipped);
    ck_assert_str_eq(a->skip_reason, b->skip_reason);
    ck_assert_int_eq(a->steps, b->steps);
    ck_assert_int_eq(a->batch, b->batch);
    ck_assert_int_eq(a->vocab, b->vocab);
    ck_assert_int_eq(a->prompt_len, b->prompt_len);
    ck_assert_int_eq(a->n_probes, b->n_probes);
    ck_assert_int_eq(a->graphs_captured, b->graphs_captured);
    ck_assert_int_eq(a->replays_checked, b->replays_checked);
    ck_assert_int_eq(a->replay_mismatch_step, b->replay_mismatch_step);
    ck_assert_str_eq(a->engine, b->engine);
    ck_assert_int_eq(a->recompiles, b->recompiles);
    ck_assert_int_eq(a->graph_budget, b->graph_budget);
    ck_assert_msg(memcmp(&a->seconds, &b->seconds, sizeof a->seconds) == 0, "%s.seconds", what);
    if (a->skipped) {
        /* skipped runs are stored as attributes only */
        ck_assert_ptr_null(b->prompt);
        ck_assert_ptr_null(b->logits);
        ck_assert_ptr_null(b->probe_names);
        return;
    }
    const size_t BP = (size_t)(a->batch * a->prompt_len), SB = (size_t)(a->steps * a->batch);
    SAME_BYTES(a->prompt, b->prompt, BP * sizeof *a->prompt, "prompt");
    SAME_BYTES(a->prompt_real, b->prompt_real, BP, "prompt_real");
    SAME_BYTES(a->tokens, b->tokens, SB * sizeof *a->tokens, "tokens");
    SAME_BYTES(a->logits, b->logits, SB * (size_t)a->vocab * sizeof(float), "logits");
    SAME_BYTES(a->logits_hash, b->logits_hash, SB * sizeof(uint64_t), "logits_hash");
    SAME_BYTES(a->margins, b->margins, SB * sizeof(float), "margins");
    for (int64_t p = 0; p < a->n_probes; p++) {
        ck_assert_str_eq(a->probe_names[p], b->probe_names[p]);
    }
    SAME_BYTES(a->probe_hash, b->probe_hash, SB * (size_t)a->n_probes * sizeof(uint64_t),
               "probe_hash");
    if (a->fp64_rel_err == NULL) {
        ck_assert_msg(b->fp64_rel_err == NULL, "%s.fp64_rel_err: read back from nothing", what);
    } else {
        SAME_BYTES(a->fp64_rel_err, b->fp64_rel_err, (size_t)a->steps * sizeof(double),
                   "fp64_rel_err");
    }
}

static bool same_double(double a, double b) { return memcmp(&a, &b, sizeof a) == 0; }

static void assert_same_report(const KvReport *a, const KvReport *b) {
    ck_assert_str_eq(a->tool_version, b->tool_version);
    ck_assert_str_eq(a->git_commit, b->git_commit);
    ck_assert_str_eq(a->host, b->host);
    ck_assert_str_eq(a->device, b->device);
    ck_assert_str_eq(a->math_mode, b->math_mode);
    ck_assert_uint_eq(a->weight_seed, b->weight_seed);
    ck_assert_uint_eq(a->prompt_seed, b->prompt_seed);
    ck_assert_uint_eq(a->model_hash, b->model_hash);
    ck_assert_str_eq(a->shard, b->shard);
    ck_assert_int_eq(a->n_tolerances, b->n_tolerances);
    for (int64_t t = 0; t < a->n_tolerances; t++) {
        ck_assert_str_eq(a->tolerances[t].name, b->tolerances[t].name);
        ck_assert_msg(same_double(a->tolerances[t].value, b->tolerances[t].value),
                      "tolerances[%lld].value", (long long)t);
        ck_assert_str_eq(a->tolerances[t].reason, b->tolerances[t].reason);
    }
    ck_assert_int_eq(a->n_runs, b->n_runs);
    for (int64_t i = 0; i < a->n_runs; i++) assert_same_run(&a->runs[i], &b->runs[i], i);
    ck_assert_int_eq(a->n_comparisons, b->n_comparisons);
    for (int64_t k = 0; k < a->n_comparisons; k++) {
        const KvComparison *x = &a->comparisons[k], *y = &b->comparisons[k];
        ck_assert_int_eq(x->kind, y->kind);
        ck_assert_int_eq(x->run_a, y->run_a);
        ck_assert_int_eq(x->run_b, y->run_b);
        ck_assert_int_eq(x->verdict, y->verdict);
        ck_assert_str_eq(x->message, y->message);
        ck_assert_int_eq(x->first_step, y->first_step);
        ck_assert_int_eq(x->first_row, y->first_row);
        ck_assert_int_eq(x->first_probe, y->first_probe);
        ck_assert_int_eq(x->near_ties, y->near_ties);
        ck_assert_msg(same_double(x->max_abs_err, y->max_abs_err) &&
                          same_double(x->max_rel_err, y->max_rel_err) &&
                          same_double(x->nmse, y->nmse) && same_double(x->kl, y->kl) &&
                          same_double(x->top1_agreement, y->top1_agreement),
                      "comparisons[%lld] metrics differ", (long long)k);
    }
}

/* A struct full of garbage, so "zeroed on failure" is checked, not assumed. */
static void report_poison(KvReport *r) { memset(r, 0xA5, sizeof *r); }

static bool report_is_zero(const KvReport *r) {
    static const KvReport zero;
    return memcmp(r, &zero, sizeof zero) == 0;
}

/* ---- round trip ------------------------------------------------------- */

START_TEST(test_roundtrip_exact) {
    KvReport rep, back;
    build_report(&rep);
    char path[PATH_MAX];
    scratch_path(path, sizeof path, "r.h5");
    KvError err = {{0}};
    ck_assert_msg(kv_report_write_h5(&rep, path, &err) == KV_OK, "write: %s", err.msg);
    ck_assert_int_eq(count_entries(".tmp-"), 0);
    report_poison(&back);
    ck_assert_msg(kv_report_read_h5(path, &back, &err) == KV_OK, "read: %s", err.msg);
    assert_same_report(&rep, &back);
    kv_report_free(&back);
    kv_report_free(&rep);
}
END_TEST

/* engine, recompiles and graph_budget are written only when set, so the
 * gate's own runs keep their bytes; absent, they read as unset. */
START_TEST(test_optional_attrs_only_when_set) {
    char path[PATH_MAX];
    write_synthetic("opt.h5", path, sizeof path);
    hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    ck_assert_int_ge(f, 0);
    static const char *const names[] = {"engine", "recompiles", "graph_budget"};
    for (int run = 0; run < 3; run++) {
        char g_name[32];
        snprintf(g_name, sizeof g_name, "runs/%04d", run);
        hid_t g = H5Gopen2(f, g_name, H5P_DEFAULT);
        ck_assert_int_ge(g, 0);
        for (int k = 0; k < 3; k++) {
            ck_assert_msg(H5Aexists(g, names[k]) == (run == 1), "%s: attribute %s", g_name,
                          names[k]);
        }
        /* the optional dataset: only where the run has it */
        ck_assert_msg(H5Lexists(g, "fp64_rel_err", H5P_DEFAULT) == (run == 0),
                      "%s: dataset fp64_rel_err", g_name);
        H5Gclose(g);
    }
    H5Fclose(f);
    KvReport back;
    KvError err = {{0}};
    ck_assert_msg(kv_report_read_h5(path, &back, &err) == KV_OK, "read: %s", err.msg);
    ck_assert_int_eq(back.runs[0].recompiles, -1);
    ck_assert_int_eq(back.runs[0].graph_budget, -1);
    ck_assert_str_eq(back.runs[0].engine, "");
    ck_assert_int_eq(back.runs[1].recompiles, 3);
    ck_assert_int_eq(back.runs[1].graph_budget, 1);
    ck_assert_str_eq(back.runs[1].engine, "transformers 5.23.0, fp32");
    ck_assert_ptr_nonnull(back.runs[0].fp64_rel_err);
    ck_assert(back.runs[0].fp64_rel_err[T_STEPS - 1] == T_STEPS / 3.0e6);
    ck_assert_ptr_null(back.runs[1].fp64_rel_err);
    kv_report_free(&back);
}
END_TEST

/* Empty tables, a run with no probes and no steps: zero-sized datasets. */
START_TEST(test_roundtrip_empty_shapes) {
    KvReport rep, back;
    build_report(&rep);
    free(rep.tolerances);
    rep.tolerances = NULL;
    rep.n_tolerances = 0;
    free(rep.comparisons);
    rep.comparisons = NULL;
    rep.n_comparisons = 0;
    KvRun *r = &rep.runs[1];
    r->steps = 0;
    r->n_probes = 0;
    char path[PATH_MAX];
    scratch_path(path, sizeof path, "empty.h5");
    KvError err = {{0}};
    ck_assert_msg(kv_report_write_h5(&rep, path, &err) == KV_OK, "write: %s", err.msg);
    ck_assert_msg(kv_report_read_h5(path, &back, &err) == KV_OK, "read: %s", err.msg);
    ck_assert_int_eq(back.n_tolerances, 0);
    ck_assert_int_eq(back.n_comparisons, 0);
    ck_assert_int_eq(back.runs[1].steps, 0);
    ck_assert_ptr_null(back.runs[1].logits);
    ck_assert_ptr_null(back.runs[1].probe_names);
    ck_assert_int_eq(back.runs[1].prompt[1], rep.runs[1].prompt[1]);
    kv_report_free(&back);
    kv_report_free(&rep);
}
END_TEST

/* ---- reproducible bytes ------------------------------------------------- */

static unsigned char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    ck_assert_msg(f != NULL, "open %s: %s", path, strerror(errno));
    ck_assert(fseek(f, 0, SEEK_END) == 0);
    long len = ftell(f);
    ck_assert(len >= 0);
    ck_assert(fseek(f, 0, SEEK_SET) == 0);
    unsigned char *buf = test_alloc((size_t)len);
    ck_assert(fread(buf, 1, (size_t)len, f) == (size_t)len);
    fclose(f);
    *n = (size_t)len;
    return buf;
}

static void assert_same_file(const char *a, const char *b) {
    size_t na, nb;
    unsigned char *x = slurp(a, &na), *y = slurp(b, &nb);
    size_t first = 0;
    while (first < na && first < nb && x[first] == y[first]) first++;
    ck_assert_msg(na == nb && first == na,
                  "Nondeterminism! %s (%zu bytes) and %s (%zu bytes) differ first at byte %zu", a,
                  na, b, nb, first);
    free(x);
    free(y);
}

/* The same report twice: across a clock second (any timestamp would
 * differ), with HDF5's free lists returned and glibc filling fresh memory
 * with a pattern (any uninitialised byte written would differ). And the
 * report read back writes the same bytes again (every field round-trips). */
START_TEST(test_byte_identical) {
    char a[PATH_MAX], b[PATH_MAX], c[PATH_MAX];
    write_synthetic("a.h5", a, sizeof a);
    const time_t t0 = time(NULL);
    while (time(NULL) == t0) {
        struct timespec ts = {0, 50 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    ck_assert(H5garbage_collect() >= 0);
    /* glibc's malloc only: under ASan, mallopt is a no-op returning 0 and
     * ASan fills fresh memory with its own pattern instead */
    bool perturbed = false;
#ifdef __GLIBC__
    perturbed = mallopt(M_PERTURB, 0xA5) == 1;
#endif
    write_synthetic("b.h5", b, sizeof b);
#ifdef __GLIBC__
    if (perturbed) ck_assert(mallopt(M_PERTURB, 0) == 1);
#endif
    (void)perturbed;
    assert_same_file(a, b);
    /* the format is pinned to v1.8 objects: superblock version 2 */
    size_t n;
    unsigned char *bytes = slurp(a, &n);
    ck_assert_msg(n > 8 && memcmp(bytes, "\211HDF\r\n\032\n", 8) == 0 && bytes[8] == 2,
                  "expected the HDF5 signature and superblock version 2 at offset 0");
    free(bytes);

    KvReport back;
    KvError err = {{0}};
    ck_assert_msg(kv_report_read_h5(a, &back, &err) == KV_OK, "read: %s", err.msg);
    scratch_path(c, sizeof c, "c.h5");
    ck_assert_msg(kv_report_write_h5(&back, c, &err) == KV_OK, "write: %s", err.msg);
    kv_report_free(&back);
    assert_same_file(a, c);
}
END_TEST

/* Garbage after a string's terminator must not reach the file. */
START_TEST(test_bytes_ignore_garbage_after_strings) {
    char a[PATH_MAX], b[PATH_MAX];
    write_synthetic("clean.h5", a, sizeof a);
    KvReport rep;
    build_report(&rep);
    memset(rep.host + strlen(rep.host) + 1, 'x', sizeof rep.host - strlen(rep.host) - 2);
    memset(rep.runs[1].variant + strlen(rep.runs[1].variant) + 1, 'y',
           KV_NAME_LEN - strlen(rep.runs[1].variant) - 2);
    memset(rep.runs[1].probe_names[0] + 6, 'z', KV_NAME_LEN - 7);
    memset(rep.comparisons[0].message + strlen(rep.comparisons[0].message) + 1, 'w', 100);
    scratch_path(b, sizeof b, "dirty.h5");
    KvError err = {{0}};
    ck_assert_msg(kv_report_write_h5(&rep, b, &err) == KV_OK, "write: %s", err.msg);
    kv_report_free(&rep);
    assert_same_file(a, b);
}
END_TEST

/* ---- h5dump ------------------------------------------------------------- */

/* h5dump on PATH (or $H5DUMP); NULL when absent. */
static const char *find_h5dump(char *buf, size_t n) {
    const char *env = getenv("H5DUMP");
    if (env != NULL && env[0] != '\0') return access(env, X_OK) == 0 ? env : NULL;
    const char *path = getenv("PATH");
    if (path == NULL) return NULL;
    const char *p = path;
    while (*p != '\0') {
        const char *end = strchr(p, ':');
        size_t len = end != NULL ? (size_t)(end - p) : strlen(p);
        snprintf(buf, n, "%.*s/h5dump", (int)len, p);
        if (len > 0 && access(buf, X_OK) == 0) return buf;
        if (end == NULL) break;
        p = end + 1;
    }
    return NULL;
}

/* Runs a command, returns its exit status and its stdout in out. */
static int run_capture(const char *cmd, char *out, size_t n) {
    FILE *p = popen(cmd, "r");
    ck_assert_msg(p != NULL, "popen %s: %s", cmd, strerror(errno));
    size_t used = 0;
    while (used + 1 < n) {
        size_t got = fread(out + used, 1, n - 1 - used, p);
        if (got == 0) break;
        used += got;
    }
    out[used] = '\0';
    char sink[4096];
    while (fread(sink, 1, sizeof sink, p) > 0) {
    }
    int status = pclose(p);
    return status;
}

/* Identical full logits share one dataset (a hard link) even when a top-k
 * run (a planted-fault pass) comes before them; faults round-trip. */
START_TEST(test_logits_linked_across_topk_run) {
    KvReport rep;
    memset(&rep, 0, sizeof rep);
    snprintf(rep.shard, sizeof rep.shard, "1/1");
    rep.n_runs = 3;
    rep.runs = test_alloc(3 * sizeof *rep.runs);
    memset(rep.runs, 0, 3 * sizeof *rep.runs);
    fill_run(&rep.runs[0], "ring", "graph", 0, 1);
    fill_run(&rep.runs[1], "reference", "eager", 0, 0);
    fill_run(&rep.runs[2], "ring", "eager", 0, 0);
    /* run 0: a planted-fault run keeping only its top 2 logits, before the
     * two identical full runs */
    KvRun *t = &rep.runs[0];
    snprintf(t->fault, sizeof t->fault, "inplace_shift,tf32");
    t->prefill_chunk = 3;
    free(t->logits);
    t->logits = NULL;
    t->topk = 2;
    t->topk_ids = test_alloc(T_STEPS * T_BATCH * 2 * sizeof *t->topk_ids);
    t->topk_values = test_alloc(T_STEPS * T_BATCH * 2 * sizeof *t->topk_values);
    for (int i = 0; i < T_STEPS * T_BATCH * 2; i++) {
        t->topk_ids[i] = i % T_VOCAB;
        t->topk_values[i] = (float)(T_STEPS * T_BATCH * 2 - i);
    }
    char path[PATH_MAX];
    scratch_path(path, sizeof path, "linked.h5");
    KvError err = {{0}};
    ck_assert_msg(kv_report_write_h5(&rep, path, &err) == KV_OK, "%s", err.msg);
    hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    ck_assert(f >= 0);
    H5O_info_t info; /* HDF5 1.10: H5Oget_info_by_name2 */
    ck_assert(H5Oget_info_by_name2(f, "/runs/0002/logits", &info, H5O_INFO_BASIC, H5P_DEFAULT) >= 0);
    ck_assert_msg(info.rc == 2, "run 2's logits are not linked to run 1's (rc %u)", info.rc);
    H5Fclose(f);
    KvReport back;
    ck_assert_msg(kv_report_read_h5(path, &back, &err) == KV_OK, "%s", err.msg);
    for (int64_t i = 0; i < 3; i++) assert_same_run(&rep.runs[i], &back.runs[i], i);
    kv_report_free(&back);
    kv_report_free(&rep);
}
END_TEST

START_TEST(test_h5dump_reads_report) {
    char tool[PATH_MAX];
    const char *h5dump = find_h5dump(tool, sizeof tool);
    if (h5dump == NULL) {
        const char *require = getenv("KV_REQUIRE_H5DUMP");
        ck_assert_msg(require == NULL || require[0] == '\0' || strcmp(require, "0") == 0,
                      "h5dump not found on PATH and KV_REQUIRE_H5DUMP is set "
                      "(Debian package hdf5-tools)");
        fprintf(stderr, "test_report: h5dump check SKIPPED: no h5dump on PATH (install the Debian "
                        "package hdf5-tools; set KV_REQUIRE_H5DUMP=1 to make this a failure)\n");
        return;
    }
    char path[PATH_MAX], cmd[3 * PATH_MAX];
    write_synthetic("dump.h5", path, sizeof path);
    static char out[1 << 16];

    snprintf(cmd, sizeof cmd, "'%s' -H '%s' 2>&1", h5dump, path);
    int status = run_capture(cmd, out, sizeof out);
    ck_assert_msg(status == 0, "%s: exit status %d:\n%s", cmd, status, out);
    const char *expect[] = {"ATTRIBUTE \"schema_version\"",
                            "DATASET \"tolerances\"",
                            "GROUP \"runs\"",
                            "GROUP \"0000\"",
                            "GROUP \"0002\"",
                            "DATASET \"logits\"",
                            "DATASET \"probe_hash\"",
                            "DATASET \"comparisons\"",
                            "DATASET \"summary\"",
                            "H5T_STD_U64LE",
                            "SIMPLE { ( 3, 2, 5 ) / ( 3, 2, 5 ) }"};
    for (size_t i = 0; i < sizeof expect / sizeof expect[0]; i++) {
        ck_assert_msg(strstr(out, expect[i]) != NULL, "h5dump -H output lacks %s:\n%s", expect[i],
                      out);
    }

    snprintf(cmd, sizeof cmd, "'%s' -d /runs/0001/tokens '%s' 2>&1", h5dump, path);
    status = run_capture(cmd, out, sizeof out);
    ck_assert_msg(status == 0, "%s: exit status %d:\n%s", cmd, status, out);
    /* tokens[s][b] = (3 * (s * B + b) + 1) % V with the salt 1 of run 1 */
    ck_assert_msg(strstr(out, "(0,0): 1, 4,") != NULL && strstr(out, "(1,0): 2, 0,") != NULL,
                  "h5dump tokens of run 1 unexpected:\n%s", out);
}
END_TEST

/* ---- write failures ----------------------------------------------------- */

static void assert_write_fails(const KvReport *rep, const char *path, KvStatus want,
                               const char *part) {
    KvError err = {{0}};
    KvStatus st = kv_report_write_h5(rep, path, &err);
    ck_assert_msg(st == want, "write %s: expected status %d, found %d (%s)", path, want, st,
                  err.msg);
    ck_assert_msg(strncmp(err.msg, path, strlen(path)) == 0, "message lacks the path: %s", err.msg);
    ck_assert_msg(strstr(err.msg, part) != NULL, "message lacks \"%s\": %s", part, err.msg);
    ck_assert_int_eq(count_entries(".tmp-"), 0);
}

START_TEST(test_write_missing_directory) {
    KvReport rep;
    build_report(&rep);
    char path[PATH_MAX];
    scratch_path(path, sizeof path, "no-such-dir/r.h5");
    assert_write_fails(&rep, path, KV_ERR_INPUT, ": cannot create: No such file or directory");
    ck_assert(!path_exists(path));
    ck_assert_int_eq(count_entries(NULL), 0);
    kv_report_free(&rep);
}
END_TEST

START_TEST(test_write_under_regular_file) {
    KvReport rep;
    build_report(&rep);
    char file[PATH_MAX], path[PATH_MAX];
    scratch_path(file, sizeof file, "plain.txt");
    FILE *f = fopen(file, "w");
    ck_assert(f != NULL && fputs("not a directory\n", f) >= 0 && fclose(f) == 0);
    scratch_path(path, sizeof path, "plain.txt/r.h5");
    assert_write_fails(&rep, path, KV_ERR_INPUT, ": cannot create: Not a directory");
    ck_assert_int_eq(count_entries(NULL), 1);
    kv_report_free(&rep);
}
END_TEST

/* The rename is what fails: the finished temporary must be removed. */
START_TEST(test_write_over_directory_leaves_no_temp) {
    KvReport rep;
    build_report(&rep);
    char path[PATH_MAX];
    scratch_path(path, sizeof path, "taken.h5");
    ck_assert(mkdir(path, 0755) == 0);
    assert_write_fails(&rep, path, KV_ERR_INPUT, ": cannot create: ");
    struct stat sb;
    ck_assert(stat(path, &sb) == 0 && S_ISDIR(sb.st_mode));
    ck_assert_int_eq(count_entries(NULL), 1);
    kv_report_free(&rep);
}
END_TEST

START_TEST(test_write_inconsistent_report) {
    KvReport rep;
    build_report(&rep);
    char path[PATH_MAX];
    scratch_path(path, sizeof path, "bad.h5");
    rep.comparisons[1].run_b = 3;
    assert_write_fails(&rep, path, KV_ERR_INPUT, "comparisons[1]");
    rep.comparisons[1].run_b = 2;
    memset(rep.runs[0].variant, 'v', sizeof rep.runs[0].variant); /* no terminator */
    assert_write_fails(&rep, path, KV_ERR_INPUT, "runs[0].variant: expected a NUL-terminated");
    snprintf(rep.runs[0].variant, KV_NAME_LEN, "reference");
    free(rep.runs[1].margins);
    rep.runs[1].margins = NULL;
    assert_write_fails(&rep, path, KV_ERR_INPUT, "runs[1].margins: expected 6 elements");
    ck_assert_int_eq(count_entries(NULL), 0);
    kv_report_free(&rep);
}
END_TEST

START_TEST(test_write_replaces_existing) {
    KvReport rep, back;
    build_report(&rep);
    char path[PATH_MAX];
    write_synthetic("r.h5", path, sizeof path);
    snprintf(rep.host, sizeof rep.host, "second-host");
    KvError err = {{0}};
    ck_assert_msg(kv_report_write_h5(&rep, path, &err) == KV_OK, "write: %s", err.msg);
    ck_assert_msg(kv_report_read_h5(path, &back, &err) == KV_OK, "read: %s", err.msg);
    ck_assert_str_eq(back.host, "second-host");
    ck_assert_int_eq(count_entries(NULL), 1);
    kv_report_free(&back);
    kv_report_free(&rep);
}
END_TEST

/* ---- read failures ------------------------------------------------------ */

static void assert_read_fails(const char *path, const char *part) {
    KvReport out;
    report_poison(&out);
    KvError err = {{0}};
    KvStatus st = kv_report_read_h5(path, &out, &err);
    ck_assert_msg(st == KV_ERR_INPUT, "read %s: expected KV_ERR_INPUT, found %d (%s)", path, st,
                  err.msg);
    ck_assert_msg(strncmp(err.msg, path, strlen(path)) == 0 && err.msg[strlen(path)] == ':',
                  "message does not start with the path: %s", err.msg);
    ck_assert_msg(strstr(err.msg, part) != NULL, "message lacks \"%s\": %s", part, err.msg);
    ck_assert_msg(report_is_zero(&out), "output not zeroed after a failed read");
}

/* A prefix-reuse run's script (DESIGN §5) survives the round trip; a run
 * without one writes none of it; a partial script is refused on write and
 * on read (a file whose suffix dataset was removed). */
/* /runs's link storage as written: compact (every report of at most 1024
 * runs, as before) or dense (more: a compact group's n links cost n^2 to
 * add). */
static H5G_storage_type_t runs_storage(const char *path) {
    hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    ck_assert(f >= 0);
    H5G_info_t info;
    ck_assert(H5Gget_info_by_name(f, "runs", &info, H5P_DEFAULT) >= 0);
    ck_assert(H5Fclose(f) >= 0);
    return info.storage_type;
}

START_TEST(test_many_runs_roundtrip) {
    KvReport rep, back;
    build_report(&rep);
    char path[PATH_MAX];
    KvError err = {{0}};
    scratch_path(path, sizeof path, "few.h5");
    ck_assert_msg(kv_report_write_h5(&rep, path, &err) == KV_OK, "write: %s", err.msg);
    ck_assert_int_eq(runs_storage(path), H5G_STORAGE_TYPE_COMPACT);
    /* 1100 runs: the skipped run (attributes only) repeated */
    const int64_t n = 1100;
    KvRun *runs = realloc(rep.runs, (size_t)n * sizeof *runs);
    ck_assert_ptr_nonnull(runs);
    rep.runs = runs;
    for (int64_t i = 3; i < n; i++) {
        rep.runs[i] = rep.runs[2];
        rep.runs[i].repeat = (int32_t)i;
    }
    rep.n_runs = n;
    scratch_path(path, sizeof path, "many.h5");
    ck_assert_msg(kv_report_write_h5(&rep, path, &err) == KV_OK, "write: %s", err.msg);
    ck_assert_int_eq(runs_storage(path), H5G_STORAGE_TYPE_DENSE);
    report_poison(&back);
    ck_assert_msg(kv_report_read_h5(path, &back, &err) == KV_OK, "read: %s", err.msg);
    assert_same_report(&rep, &back);
    kv_report_free(&back);
    kv_report_free(&rep);
}
END_TEST

START_TEST(test_prefix_script_roundtrip) {
    KvReport rep, back;
    build_report(&rep);
    KvRun *r = &rep.runs[0];
    r->save_after = 1;
    r->switch_step = 1;
    r->suffix_len = 2;
    r->suffix = test_alloc(T_BATCH * 2 * sizeof *r->suffix); /* (B, 2) */
    for (int i = 0; i < T_BATCH * 2; i++) r->suffix[i] = 40 + i;
    char path[PATH_MAX];
    scratch_path(path, sizeof path, "script.h5");
    KvError err = {{0}};
    ck_assert_msg(kv_report_write_h5(&rep, path, &err) == KV_OK, "write: %s", err.msg);
    report_poison(&back);
    ck_assert_msg(kv_report_read_h5(path, &back, &err) == KV_OK, "read: %s", err.msg);
    ck_assert_int_eq(back.runs[0].save_after, 1);
    ck_assert_int_eq(back.runs[0].switch_step, 1);
    ck_assert_int_eq(back.runs[0].suffix_len, 2);
    ck_assert_ptr_nonnull(back.runs[0].suffix);
    ck_assert_mem_eq(back.runs[0].suffix, r->suffix, T_BATCH * 2 * sizeof *r->suffix);
    ck_assert_int_eq(back.runs[1].switch_step, 0);
    ck_assert_ptr_null(back.runs[1].suffix);
    kv_report_free(&back);
    hid_t f = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
    ck_assert_int_ge(f, 0);
    hid_t g = H5Gopen2(f, "runs/0001", H5P_DEFAULT);
    ck_assert_int_ge(g, 0);
    ck_assert_int_eq(H5Aexists(g, "switch_step"), 0); /* not written when unset */
    H5Gclose(g);
    ck_assert_int_ge(H5Ldelete(f, "runs/0000/suffix", H5P_DEFAULT), 0);
    H5Fclose(f);
    assert_read_fails(path, "prefix-reuse script");
    r->save_after = T_PLEN; /* outside the prompt */
    scratch_path(path, sizeof path, "script_bad.h5");
    assert_write_fails(&rep, path, KV_ERR_INPUT, "prefix-reuse script");
    kv_report_free(&rep);
}
END_TEST

/* A context-shift script (shift_step, shift_keep, shift_drop) round-trips,
 * is written only when set, and a partial or out-of-range one is refused
 * by the writer and the reader. */
START_TEST(test_shift_script_roundtrip) {
    KvReport rep, back;
    build_report(&rep);
    KvRun *r = &rep.runs[0];
    r->shift_step = 2;
    r->shift_keep = 1;
    r->shift_drop = 1;
    char path[PATH_MAX];
    scratch_path(path, sizeof path, "shift.h5");
    KvError err = {{0}};
    ck_assert_msg(kv_report_write_h5(&rep, path, &err) == KV_OK, "write: %s", err.msg);
    report_poison(&back);
    ck_assert_msg(kv_report_read_h5(path, &back, &err) == KV_OK, "read: %s", err.msg);
    ck_assert_int_eq(back.runs[0].shift_step, 2);
    ck_assert_int_eq(back.runs[0].shift_keep, 1);
    ck_assert_int_eq(back.runs[0].shift_drop, 1);
    ck_assert_int_eq(back.runs[1].shift_step, 0);
    kv_report_free(&back);
    hid_t f = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
    ck_assert_int_ge(f, 0);
    hid_t g = H5Gopen2(f, "runs/0001", H5P_DEFAULT);
    ck_assert_int_ge(g, 0);
    ck_assert_int_eq(H5Aexists(g, "shift_step"), 0); /* not written when unset */
    H5Gclose(g);
    ck_assert_int_ge(H5Adelete_by_name(f, "runs/0000", "shift_drop", H5P_DEFAULT), 0);
    H5Fclose(f);
    assert_read_fails(path, "context shift");
    r->shift_drop = T_PLEN + 2; /* more than the positions stored before the shift */
    scratch_path(path, sizeof path, "shift_bad.h5");
    assert_write_fails(&rep, path, KV_ERR_INPUT, "context shift");
    kv_report_free(&rep);
}
END_TEST

START_TEST(test_read_missing_file) {
    char path[PATH_MAX];
    scratch_path(path, sizeof path, "absent.h5");
    assert_read_fails(path, "cannot open: No such file or directory");
}
END_TEST

START_TEST(test_read_text_file) {
    char path[PATH_MAX];
    scratch_path(path, sizeof path, "notes.txt");
    FILE *f = fopen(path, "w");
    ck_assert(f != NULL && fputs("tokens: 1 2 3\n", f) >= 0 && fclose(f) == 0);
    assert_read_fails(path, "expected an HDF5 file, found 14 bytes without an HDF5 signature");
}
END_TEST

START_TEST(test_read_directory) {
    assert_read_fails(g_dir, "expected an HDF5 file, found a directory");
}
END_TEST

START_TEST(test_read_truncated) {
    char full[PATH_MAX], half[PATH_MAX];
    write_synthetic("full.h5", full, sizeof full);
    size_t n;
    unsigned char *bytes = slurp(full, &n);
    scratch_path(half, sizeof half, "half.h5");
    FILE *f = fopen(half, "wb");
    ck_assert(f != NULL && fwrite(bytes, 1, n / 2, f) == n / 2 && fclose(f) == 0);
    free(bytes);
    assert_read_fails(half, "expected a complete HDF5 file");
    assert_read_fails(half, "truncated");
}
END_TEST

/* Opens a written report for editing with the HDF5 API; every call checked. */
static hid_t open_rw(const char *path) {
    hid_t f = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
    ck_assert_msg(f >= 0, "H5Fopen %s", path);
    return f;
}

START_TEST(test_read_other_schema_version) {
    char path[PATH_MAX];
    write_synthetic("v2.h5", path, sizeof path);
    hid_t f = open_rw(path);
    hid_t a = H5Aopen(f, "schema_version", H5P_DEFAULT);
    ck_assert(a >= 0);
    const int32_t v = KV_REPORT_SCHEMA_VERSION + 98;
    ck_assert(H5Awrite(a, H5T_NATIVE_INT32, &v) >= 0);
    ck_assert(H5Aclose(a) >= 0);
    ck_assert(H5Fclose(f) >= 0);
    char want[96];
    snprintf(want, sizeof want, "/: attribute schema_version: expected %d, found %d",
             KV_REPORT_SCHEMA_VERSION, (int)v);
    assert_read_fails(path, want);
}
END_TEST

START_TEST(test_read_missing_dataset) {
    char path[PATH_MAX];
    write_synthetic("nologits.h5", path, sizeof path);
    hid_t f = open_rw(path);
    ck_assert(H5Ldelete(f, "/runs/0001/logits", H5P_DEFAULT) >= 0);
    ck_assert(H5Fclose(f) >= 0);
    assert_read_fails(path, "/runs/0001/logits: expected a float dataset of shape (3, 2, 5), "
                            "found nothing");
}
END_TEST

START_TEST(test_read_missing_group) {
    char path[PATH_MAX];
    write_synthetic("norun.h5", path, sizeof path);
    hid_t f = open_rw(path);
    ck_assert(H5Ldelete(f, "/runs/0000", H5P_DEFAULT) >= 0);
    ck_assert(H5Fclose(f) >= 0);
    assert_read_fails(path, "/runs/0000: expected a group");
}
END_TEST

START_TEST(test_read_missing_attribute) {
    char path[PATH_MAX];
    write_synthetic("novariant.h5", path, sizeof path);
    hid_t f = open_rw(path);
    hid_t g = H5Gopen2(f, "/runs/0001", H5P_DEFAULT);
    ck_assert(g >= 0);
    ck_assert(H5Adelete(g, "variant") >= 0);
    ck_assert(H5Gclose(g) >= 0);
    ck_assert(H5Fclose(f) >= 0);
    assert_read_fails(path, "/runs/0001: attribute variant: expected a string, found nothing");
}
END_TEST

START_TEST(test_read_inconsistent_shape) {
    char path[PATH_MAX];
    write_synthetic("shape.h5", path, sizeof path);
    hid_t f = open_rw(path);
    hid_t g = H5Gopen2(f, "/runs/0001", H5P_DEFAULT);
    ck_assert(g >= 0);
    hid_t a = H5Aopen(g, "vocab", H5P_DEFAULT);
    ck_assert(a >= 0);
    const int64_t vocab = T_VOCAB + 1;
    ck_assert(H5Awrite(a, H5T_NATIVE_INT64, &vocab) >= 0);
    ck_assert(H5Aclose(a) >= 0);
    ck_assert(H5Gclose(g) >= 0);
    ck_assert(H5Fclose(f) >= 0);
    assert_read_fails(path, "/runs/0001/logits: expected shape (3, 2, 6), found (3, 2, 5)");
}
END_TEST

START_TEST(test_read_missing_table) {
    char path[PATH_MAX];
    write_synthetic("nosummary.h5", path, sizeof path);
    hid_t f = open_rw(path);
    ck_assert(H5Ldelete(f, "/summary", H5P_DEFAULT) >= 0);
    ck_assert(H5Fclose(f) >= 0);
    assert_read_fails(path, "/summary: expected a 1-D compound dataset, found nothing");
}
END_TEST

/* h5py writes str attributes as variable-length UTF-8: accepted. */
START_TEST(test_read_variable_length_attribute) {
    char path[PATH_MAX];
    write_synthetic("vlen.h5", path, sizeof path);
    hid_t f = open_rw(path);
    hid_t g = H5Gopen2(f, "/runs/0001", H5P_DEFAULT);
    ck_assert(g >= 0);
    ck_assert(H5Adelete(g, "variant") >= 0);
    hid_t t = H5Tcopy(H5T_C_S1);
    ck_assert(t >= 0);
    ck_assert(H5Tset_size(t, H5T_VARIABLE) >= 0 && H5Tset_cset(t, H5T_CSET_UTF8) >= 0);
    hid_t s = H5Screate(H5S_SCALAR);
    ck_assert(s >= 0);
    hid_t a = H5Acreate2(g, "variant", t, s, H5P_DEFAULT, H5P_DEFAULT);
    ck_assert(a >= 0);
    const char *value = "always_roll";
    ck_assert(H5Awrite(a, t, &value) >= 0);
    ck_assert(H5Aclose(a) >= 0 && H5Sclose(s) >= 0 && H5Tclose(t) >= 0);
    ck_assert(H5Gclose(g) >= 0);
    ck_assert(H5Fclose(f) >= 0);
    KvReport back;
    KvError err = {{0}};
    ck_assert_msg(kv_report_read_h5(path, &back, &err) == KV_OK, "read: %s", err.msg);
    ck_assert_str_eq(back.runs[1].variant, "always_roll");
    kv_report_free(&back);
}
END_TEST

/* Replaces /tolerances with one row written the way h5py writes numpy "S"
 * fields: ASCII, NULL-padded, no terminator when the text fills the field. */
static void write_ascii_tolerance(const char *path, const char *name) {
    typedef struct {
        char name[KV_NAME_LEN];
        double value;
        char reason[160];
    } Row;
    Row row;
    memset(&row, 0, sizeof row);
    memcpy(row.name, name, strnlen(name, sizeof row.name));
    row.value = 0.5;
    snprintf(row.reason, sizeof row.reason, "written like h5py");
    hid_t f = open_rw(path);
    ck_assert(H5Ldelete(f, "/tolerances", H5P_DEFAULT) >= 0);
    hid_t s_name = H5Tcopy(H5T_C_S1), s_reason = H5Tcopy(H5T_C_S1);
    ck_assert(s_name >= 0 && s_reason >= 0);
    ck_assert(H5Tset_size(s_name, sizeof row.name) >= 0 &&
              H5Tset_strpad(s_name, H5T_STR_NULLPAD) >= 0);
    ck_assert(H5Tset_size(s_reason, sizeof row.reason) >= 0 &&
              H5Tset_strpad(s_reason, H5T_STR_NULLPAD) >= 0);
    hid_t t = H5Tcreate(H5T_COMPOUND, sizeof row);
    ck_assert(t >= 0);
    ck_assert(H5Tinsert(t, "name", offsetof(Row, name), s_name) >= 0);
    ck_assert(H5Tinsert(t, "value", offsetof(Row, value), H5T_NATIVE_DOUBLE) >= 0);
    ck_assert(H5Tinsert(t, "reason", offsetof(Row, reason), s_reason) >= 0);
    const hsize_t dims[1] = {1};
    hid_t sp = H5Screate_simple(1, dims, NULL);
    ck_assert(sp >= 0);
    hid_t d = H5Dcreate2(f, "tolerances", t, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    ck_assert(d >= 0);
    ck_assert(H5Dwrite(d, t, H5S_ALL, H5S_ALL, H5P_DEFAULT, &row) >= 0);
    ck_assert(H5Dclose(d) >= 0 && H5Sclose(sp) >= 0 && H5Tclose(t) >= 0);
    ck_assert(H5Tclose(s_reason) >= 0 && H5Tclose(s_name) >= 0);
    ck_assert(H5Fclose(f) >= 0);
}

START_TEST(test_read_ascii_table_strings) {
    char path[PATH_MAX];
    write_synthetic("ascii.h5", path, sizeof path);
    write_ascii_tolerance(path, "max_rel_err");
    KvReport back;
    KvError err = {{0}};
    ck_assert_msg(kv_report_read_h5(path, &back, &err) == KV_OK, "read: %s", err.msg);
    ck_assert_int_eq(back.n_tolerances, 1);
    ck_assert_str_eq(back.tolerances[0].name, "max_rel_err");
    ck_assert_str_eq(back.tolerances[0].reason, "written like h5py");
    ck_assert(back.tolerances[0].value == 0.5);
    kv_report_free(&back);
}
END_TEST

/* A name that fills all 64 bytes cannot round-trip through char[64]. */
START_TEST(test_read_table_string_too_long) {
    char path[PATH_MAX], name[KV_NAME_LEN + 1];
    memset(name, 'n', KV_NAME_LEN);
    name[KV_NAME_LEN] = '\0';
    write_synthetic("long.h5", path, sizeof path);
    write_ascii_tolerance(path, name);
    assert_read_fails(path, "/tolerances[0]: member name: expected a string of at most 63 bytes");
}
END_TEST

/* ---- hostile reports ---------------------------------------------------- */

#if defined(__SANITIZE_ADDRESS__)
#define T_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define T_ASAN 1
#endif
#endif

/* What a refused read may take: seconds of wall time, and (outside ASan)
 * bytes of address space beyond what the process has when it starts
 * reading. Every hostile file here declares far more than the headroom. */
#define T_READ_SECONDS 20
#define T_READ_HEADROOM ((rlim_t)512 << 20)

/* The process's address-space size now (/proc/self/statm), 0 if unknown. */
static rlim_t address_space_now(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    if (f == NULL) return 0;
    unsigned long pages = 0;
    const int got = fscanf(f, "%lu", &pages);
    fclose(f);
    return got == 1 ? (rlim_t)pages * (rlim_t)sysconf(_SC_PAGESIZE) : 0;
}

/* The result of a read in a child process. */
typedef struct {
    KvStatus st;
    bool zeroed;
    char msg[sizeof(((KvError *)0)->msg)];
} ChildRead;

/* Reads path in a child under T_READ_SECONDS and the address-space limit,
 * and checks that it was refused like assert_read_fails: KV_ERR_INPUT, the
 * path first, part in the message, *out zeroed. A reader that tried to
 * allocate what the file declares gets NULL from malloc under the limit and
 * says KV_ERR_INTERNAL, which fails here; one that works for minutes is
 * killed by SIGALRM, which fails here too. */
static void assert_read_refused_bounded(const char *path, const char *part) {
    int fds[2];
    ck_assert_msg(pipe(fds) == 0, "pipe: %s", strerror(errno));
    const rlim_t base = address_space_now();
    const pid_t pid = fork();
    ck_assert_msg(pid >= 0, "fork: %s", strerror(errno));
    if (pid == 0) {
        close(fds[0]);
        alarm(T_READ_SECONDS);
#ifndef T_ASAN
        if (base > 0) {
            const struct rlimit lim = {base + T_READ_HEADROOM, base + T_READ_HEADROOM};
            if (setrlimit(RLIMIT_AS, &lim) != 0) _exit(3);
        }
#else
        /* ASan reserves terabytes of shadow memory: no limit under it, the
         * status check and the alarm still apply */
        (void)base;
#endif
        ChildRead r;
        memset(&r, 0, sizeof r);
        KvReport out;
        report_poison(&out);
        KvError err = {{0}};
        r.st = kv_report_read_h5(path, &out, &err);
        r.zeroed = report_is_zero(&out);
        snprintf(r.msg, sizeof r.msg, "%s", err.msg);
        if (r.st == KV_OK) kv_report_free(&out);
        const ssize_t w = write(fds[1], &r, sizeof r);
        _exit(w == (ssize_t)sizeof r ? 0 : 4);
    }
    close(fds[1]);
    ChildRead r;
    memset(&r, 0, sizeof r);
    size_t got = 0;
    while (got < sizeof r) {
        const ssize_t n = read(fds[0], (char *)&r + got, sizeof r - got);
        if (n <= 0) break;
        got += (size_t)n;
    }
    close(fds[0]);
    int status = 0;
    ck_assert(waitpid(pid, &status, 0) == pid);
    ck_assert_msg(!(WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM),
                  "read %s: still working after %d s", path, T_READ_SECONDS);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0 && got == sizeof r,
                  "read %s: the child died (status 0x%x)", path, (unsigned)status);
    ck_assert_msg(r.st == KV_ERR_INPUT, "read %s: expected KV_ERR_INPUT, found %d (%s)", path, r.st,
                  r.msg);
    ck_assert_msg(strncmp(r.msg, path, strlen(path)) == 0 && r.msg[strlen(path)] == ':',
                  "message does not start with the path: %s", r.msg);
    ck_assert_msg(strstr(r.msg, part) != NULL, "message lacks \"%s\": %s", part, r.msg);
    ck_assert_msg(r.zeroed, "output not zeroed after a failed read");
}

static long file_size(const char *path) {
    struct stat sb;
    ck_assert_msg(stat(path, &sb) == 0, "stat %s: %s", path, strerror(errno));
    return (long)sb.st_size;
}

static void set_attr_i64(hid_t obj, const char *name, int64_t v) {
    hid_t a = H5Aopen(obj, name, H5P_DEFAULT);
    ck_assert_msg(a >= 0, "attribute %s", name);
    ck_assert(H5Awrite(a, H5T_NATIVE_INT64, &v) >= 0);
    ck_assert(H5Aclose(a) >= 0);
}

/* Replaces dataset name in g (when present) by one of type and shape dims
 * with creation list dcpl; filled with zeros when fill. */
static void replace_dataset(hid_t g, const char *name, hid_t type, int rank, const hsize_t *dims,
                            hid_t dcpl, bool fill) {
    if (H5Lexists(g, name, H5P_DEFAULT) > 0) ck_assert(H5Ldelete(g, name, H5P_DEFAULT) >= 0);
    hid_t sp = H5Screate_simple(rank, dims, NULL);
    ck_assert(sp >= 0);
    hid_t d = H5Dcreate2(g, name, type, sp, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    ck_assert_msg(d >= 0, "create %s", name);
    if (fill) {
        size_t count = 1;
        for (int k = 0; k < rank; k++) count *= (size_t)dims[k];
        void *zeros = test_alloc(count * H5Tget_size(type));
        ck_assert(H5Dwrite(d, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, zeros) >= 0);
        free(zeros);
    }
    ck_assert(H5Dclose(d) >= 0 && H5Sclose(sp) >= 0);
}

/* Run 1 of the synthetic report made consistent with 64 steps and the
 * largest vocabulary the reader accepts (KV_REPORT_MAX_VOCAB), every
 * dataset but logits written (a few KB); logits is left to the caller: its
 * (64, 2, 2^22) floats are 2 GiB. The file is opened read-write and run 1's
 * group returned in *g. */
#define T_HUGE_STEPS 64
static hid_t craft_huge_run(const char *name, char *path, size_t n, hid_t *g) {
    write_synthetic(name, path, n);
    hid_t f = open_rw(path);
    *g = H5Gopen2(f, "/runs/0001", H5P_DEFAULT);
    ck_assert(*g >= 0);
    set_attr_i64(*g, "steps", T_HUGE_STEPS);
    set_attr_i64(*g, "vocab", KV_REPORT_MAX_VOCAB);
    const hsize_t rows[2] = {T_HUGE_STEPS, T_BATCH};
    const hsize_t probes[3] = {T_HUGE_STEPS, T_PROBES, T_BATCH};
    replace_dataset(*g, "tokens", H5T_NATIVE_INT32, 2, rows, H5P_DEFAULT, true);
    replace_dataset(*g, "logits_hash", H5T_NATIVE_UINT64, 2, rows, H5P_DEFAULT, true);
    replace_dataset(*g, "margins", H5T_NATIVE_FLOAT, 2, rows, H5P_DEFAULT, true);
    replace_dataset(*g, "probe_hash", H5T_NATIVE_UINT64, 3, probes, H5P_DEFAULT, true);
    ck_assert(H5Ldelete(*g, "logits", H5P_DEFAULT) >= 0);
    return f;
}

static const hsize_t T_HUGE_LOGITS[3] = {T_HUGE_STEPS, T_BATCH, KV_REPORT_MAX_VOCAB};

/* 2 GiB of logits declared contiguous and never written: nothing stored. */
START_TEST(test_refuse_huge_logits_unallocated) {
    char path[PATH_MAX];
    hid_t g;
    hid_t f = craft_huge_run("huge_contiguous.h5", path, sizeof path, &g);
    replace_dataset(g, "logits", H5T_NATIVE_FLOAT, 3, T_HUGE_LOGITS, H5P_DEFAULT, false);
    ck_assert(H5Gclose(g) >= 0 && H5Fclose(f) >= 0);
    ck_assert_msg(file_size(path) < 1 << 20, "the crafted file is not tiny: %ld", file_size(path));
    assert_read_refused_bounded(path, "/runs/0001/logits: expected 2147483648 bytes of data "
                                      "stored in the file, found 0");
}
END_TEST

/* The same, chunked and deflated as the writer stores logits, no chunk
 * written: no deflate stream expands 0 bytes into 2 GiB. */
START_TEST(test_refuse_huge_logits_chunked) {
    char path[PATH_MAX];
    hid_t g;
    hid_t f = craft_huge_run("huge_chunked.h5", path, sizeof path, &g);
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    const hsize_t chunk[3] = {1, T_BATCH, KV_REPORT_MAX_VOCAB};
    ck_assert(dcpl >= 0 && H5Pset_chunk(dcpl, 3, chunk) >= 0 && H5Pset_shuffle(dcpl) >= 0 &&
              H5Pset_deflate(dcpl, 4) >= 0);
    replace_dataset(g, "logits", H5T_NATIVE_FLOAT, 3, T_HUGE_LOGITS, dcpl, false);
    ck_assert(H5Pclose(dcpl) >= 0 && H5Gclose(g) >= 0 && H5Fclose(f) >= 0);
    ck_assert_msg(file_size(path) < 1 << 20, "the crafted file is not tiny: %ld", file_size(path));
    assert_read_refused_bounded(path, "/runs/0001/logits: expected at most 1032 bytes of data per "
                                      "stored byte (deflate's limit), found 2147483648 bytes "
                                      "declared in 0 stored");
}
END_TEST

/* Logits of the synthetic shape (3, 2, 5) in chunks (1, 2, 5) of which only
 * the first is written: the other two would read as fill values. Deflated,
 * the ratio is plausible, so the chunk count is what refuses it; without a
 * filter, the stored size already does. */
static void write_first_chunk_only(const char *name, bool deflate, char *path, size_t n) {
    write_synthetic(name, path, n);
    hid_t f = open_rw(path);
    hid_t g = H5Gopen2(f, "/runs/0001", H5P_DEFAULT);
    ck_assert(g >= 0);
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    const hsize_t dims[3] = {T_STEPS, T_BATCH, T_VOCAB}, chunk[3] = {1, T_BATCH, T_VOCAB};
    ck_assert(dcpl >= 0 && H5Pset_chunk(dcpl, 3, chunk) >= 0);
    if (deflate) ck_assert(H5Pset_deflate(dcpl, 4) >= 0);
    replace_dataset(g, "logits", H5T_NATIVE_FLOAT, 3, dims, dcpl, false);
    hid_t d = H5Dopen2(g, "logits", H5P_DEFAULT);
    hid_t fs = H5Dget_space(d);
    const hsize_t start[3] = {0, 0, 0};
    hid_t ms = H5Screate_simple(3, chunk, NULL);
    ck_assert(d >= 0 && fs >= 0 && ms >= 0 &&
              H5Sselect_hyperslab(fs, H5S_SELECT_SET, start, NULL, chunk, NULL) >= 0);
    float values[T_BATCH * T_VOCAB];
    for (int k = 0; k < T_BATCH * T_VOCAB; k++) values[k] = 1.0f / (float)(k + 3);
    ck_assert(H5Dwrite(d, H5T_NATIVE_FLOAT, ms, fs, H5P_DEFAULT, values) >= 0);
    ck_assert(H5Sclose(ms) >= 0 && H5Sclose(fs) >= 0 && H5Dclose(d) >= 0);
    ck_assert(H5Pclose(dcpl) >= 0 && H5Gclose(g) >= 0 && H5Fclose(f) >= 0);
}

START_TEST(test_refuse_missing_chunks) {
    char path[PATH_MAX];
    write_first_chunk_only("chunks_deflate.h5", true, path, sizeof path);
    assert_read_refused_bounded(path, "/runs/0001/logits: expected all 3 chunks stored, found 1");
    write_first_chunk_only("chunks_plain.h5", false, path, sizeof path);
    assert_read_refused_bounded(path, "/runs/0001/logits: expected 120 bytes of data stored in "
                                      "the file, found 40");
}
END_TEST

/* Data the ratio bound does not cover, or that is not in this file at all:
 * a scale-offset filter (constant data in 0 bits per value), raw data in an
 * external file, a virtual dataset mapping another file. */
START_TEST(test_refuse_foreign_storage) {
    const hsize_t dims[3] = {T_STEPS, T_BATCH, T_VOCAB};
    char path[PATH_MAX], raw[PATH_MAX], other[PATH_MAX];

    write_synthetic("scaleoffset.h5", path, sizeof path);
    hid_t f = open_rw(path);
    hid_t g = H5Gopen2(f, "/runs/0001", H5P_DEFAULT);
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    const hsize_t chunk[3] = {1, T_BATCH, T_VOCAB};
    ck_assert(g >= 0 && dcpl >= 0 && H5Pset_chunk(dcpl, 3, chunk) >= 0 &&
              H5Pset_scaleoffset(dcpl, H5Z_SO_FLOAT_DSCALE, 2) >= 0);
    replace_dataset(g, "logits", H5T_NATIVE_FLOAT, 3, dims, dcpl, true);
    ck_assert(H5Pclose(dcpl) >= 0 && H5Gclose(g) >= 0 && H5Fclose(f) >= 0);
    assert_read_refused_bounded(path, "/runs/0001/logits: expected no filters but shuffle, "
                                      "deflate and fletcher32, found filter 6");

    /* the raw file exists and holds the right number of bytes: only where
     * it is matters */
    scratch_path(raw, sizeof raw, "raw.bin");
    FILE *rf = fopen(raw, "wb");
    ck_assert(rf != NULL);
    for (int k = 0; k < T_STEPS * T_BATCH * T_VOCAB; k++) {
        const float v = 0.5f;
        ck_assert(fwrite(&v, sizeof v, 1, rf) == 1);
    }
    ck_assert(fclose(rf) == 0);
    write_synthetic("external_raw.h5", path, sizeof path);
    f = open_rw(path);
    g = H5Gopen2(f, "/runs/0001", H5P_DEFAULT);
    dcpl = H5Pcreate(H5P_DATASET_CREATE);
    ck_assert(g >= 0 && dcpl >= 0 &&
              H5Pset_external(dcpl, raw, 0, T_STEPS * T_BATCH * T_VOCAB * sizeof(float)) >= 0);
    replace_dataset(g, "logits", H5T_NATIVE_FLOAT, 3, dims, dcpl, false);
    ck_assert(H5Pclose(dcpl) >= 0 && H5Gclose(g) >= 0 && H5Fclose(f) >= 0);
    assert_read_refused_bounded(path, "/runs/0001/logits: expected data stored in this file, "
                                      "found it in 1 external file");

    write_synthetic("other.h5", other, sizeof other);
    write_synthetic("virtual.h5", path, sizeof path);
    f = open_rw(path);
    g = H5Gopen2(f, "/runs/0001", H5P_DEFAULT);
    dcpl = H5Pcreate(H5P_DATASET_CREATE);
    hid_t vs = H5Screate_simple(3, dims, NULL), ss = H5Screate_simple(3, dims, NULL);
    ck_assert(g >= 0 && dcpl >= 0 && vs >= 0 && ss >= 0 &&
              H5Pset_virtual(dcpl, vs, other, "/runs/0000/logits", ss) >= 0);
    replace_dataset(g, "logits", H5T_NATIVE_FLOAT, 3, dims, dcpl, false);
    ck_assert(H5Sclose(vs) >= 0 && H5Sclose(ss) >= 0);
    ck_assert(H5Pclose(dcpl) >= 0 && H5Gclose(g) >= 0 && H5Fclose(f) >= 0);
    assert_read_refused_bounded(path, "/runs/0001/logits: expected data stored in this file, "
                                      "found a virtual dataset");
}
END_TEST

/* Replaces table /name with one of the same row type and rows rows,
 * contiguous and never written (the file stays small). */
static void replace_table_rows(const char *path, const char *name, hsize_t rows) {
    hid_t f = open_rw(path);
    hid_t old = H5Dopen2(f, name, H5P_DEFAULT);
    ck_assert(old >= 0);
    hid_t t = H5Dget_type(old);
    ck_assert(t >= 0 && H5Dclose(old) >= 0);
    const hsize_t dims[1] = {rows};
    replace_dataset(f, name, t, 1, dims, H5P_DEFAULT, false);
    ck_assert(H5Tclose(t) >= 0 && H5Fclose(f) >= 0);
}

/* Ten million declared rows in a file of a few KB: each table's row count
 * is checked against the run count (or its cap) before a row is read. */
START_TEST(test_refuse_table_10m_rows) {
    char path[PATH_MAX];
    write_synthetic("summary10m.h5", path, sizeof path);
    replace_table_rows(path, "summary", 10000000);
    ck_assert_msg(file_size(path) < 1 << 20, "the crafted file is not tiny: %ld", file_size(path));
    assert_read_refused_bounded(path, "/summary: expected 3 rows (one per run), found 10000000");

    write_synthetic("comparisons10m.h5", path, sizeof path);
    replace_table_rows(path, "comparisons", 10000000);
    assert_read_refused_bounded(path, "/comparisons: expected at most 48 rows (16 per run, 3 runs), "
                                      "found 10000000");

    write_synthetic("tolerances10m.h5", path, sizeof path);
    replace_table_rows(path, "tolerances", 10000000);
    assert_read_refused_bounded(path, "/tolerances: expected at most 262144 rows");

    /* the right row count, but nothing stored */
    write_synthetic("summary_unwritten.h5", path, sizeof path);
    replace_table_rows(path, "summary", 3);
    assert_read_refused_bounded(path, "/summary: expected ");
    assert_read_refused_bounded(path, " bytes of data stored in the file, found 0");
}
END_TEST

/* Sizes above the caps are refused from the attributes, before any
 * product is formed or any dataset opened. */
START_TEST(test_refuse_sizes_over_caps) {
    char path[PATH_MAX], want[160];
    const struct {
        const char *attr;
        int64_t value, cap;
    } cases[] = {
        {"steps", (int64_t)1 << 40, KV_REPORT_MAX_STEPS},
        {"batch", KV_REPORT_MAX_BATCH + 1, KV_REPORT_MAX_BATCH},
        {"vocab", KV_REPORT_MAX_VOCAB + 1, KV_REPORT_MAX_VOCAB},
        {"prompt_len", INT64_MAX, KV_REPORT_MAX_PROMPT_LEN},
        {"n_probes", KV_REPORT_MAX_PROBES + 1, KV_REPORT_MAX_PROBES},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        char name[64];
        snprintf(name, sizeof name, "cap_%s.h5", cases[k].attr);
        write_synthetic(name, path, sizeof path);
        hid_t f = open_rw(path);
        hid_t g = H5Gopen2(f, "/runs/0001", H5P_DEFAULT);
        ck_assert(g >= 0);
        set_attr_i64(g, cases[k].attr, cases[k].value);
        ck_assert(H5Gclose(g) >= 0 && H5Fclose(f) >= 0);
        snprintf(want, sizeof want, "/runs/0001: attribute %s: expected 0..%lld, found %lld",
                 cases[k].attr, (long long)cases[k].cap, (long long)cases[k].value);
        assert_read_refused_bounded(path, want);
    }
}
END_TEST

/* Steps in the attributes and in the datasets disagree. */
START_TEST(test_refuse_inconsistent_steps) {
    char path[PATH_MAX];
    write_synthetic("steps.h5", path, sizeof path);
    hid_t f = open_rw(path);
    hid_t g = H5Gopen2(f, "/runs/0001", H5P_DEFAULT);
    ck_assert(g >= 0);
    set_attr_i64(g, "steps", T_STEPS + 1);
    ck_assert(H5Gclose(g) >= 0 && H5Fclose(f) >= 0);
    assert_read_refused_bounded(path, "/runs/0001/tokens: expected shape (4, 2), found (3, 2)");
}
END_TEST

/* An external link would pull runs from another file; it is refused where
 * it stands, for a dataset and for a group, even though following it would
 * find a perfectly good object. */
START_TEST(test_refuse_external_link) {
    char path[PATH_MAX], other[PATH_MAX];
    write_synthetic("elink_target.h5", other, sizeof other);
    write_synthetic("elink.h5", path, sizeof path);
    hid_t f = open_rw(path);
    hid_t g = H5Gopen2(f, "/runs/0001", H5P_DEFAULT);
    ck_assert(g >= 0 && H5Ldelete(g, "logits", H5P_DEFAULT) >= 0);
    ck_assert(H5Lcreate_external(other, "/runs/0001/logits", g, "logits", H5P_DEFAULT,
                                 H5P_DEFAULT) >= 0);
    ck_assert(H5Gclose(g) >= 0 && H5Fclose(f) >= 0);
    char want[2 * PATH_MAX];
    snprintf(want, sizeof want,
             "/runs/0001/logits: expected a dataset stored in this file, found an external link to "
             "'%.150s:/runs/0001/logits'",
             other);
    assert_read_refused_bounded(path, want);

    write_synthetic("elink_group.h5", path, sizeof path);
    f = open_rw(path);
    ck_assert(H5Ldelete(f, "/runs/0002", H5P_DEFAULT) >= 0);
    hid_t runs = H5Gopen2(f, "/runs", H5P_DEFAULT);
    ck_assert(runs >= 0 && H5Lcreate_external(other, "/runs/0002", runs, "0002", H5P_DEFAULT,
                                              H5P_DEFAULT) >= 0);
    ck_assert(H5Gclose(runs) >= 0 && H5Fclose(f) >= 0);
    assert_read_refused_bounded(path, "/runs/0002: expected a run group stored in this file, found "
                                      "an external link to");
}
END_TEST

/* A soft link, even to the very object the writer would hard-link, and a
 * dangling one in a place the reader never opens. */
START_TEST(test_refuse_soft_link) {
    char path[PATH_MAX];
    write_synthetic("slink.h5", path, sizeof path);
    hid_t f = open_rw(path);
    ck_assert(H5Ldelete(f, "/runs/0001/logits", H5P_DEFAULT) >= 0);
    ck_assert(H5Lcreate_soft("/runs/0000/logits", f, "/runs/0001/logits", H5P_DEFAULT,
                             H5P_DEFAULT) >= 0);
    ck_assert(H5Fclose(f) >= 0);
    assert_read_refused_bounded(path, "/runs/0001/logits: expected a dataset stored in this file, "
                                      "found a soft link to '/runs/0000/logits'");

    write_synthetic("slink_root.h5", path, sizeof path);
    f = open_rw(path);
    ck_assert(H5Lcreate_soft("/nowhere", f, "/bisect", H5P_DEFAULT, H5P_DEFAULT) >= 0);
    ck_assert(H5Fclose(f) >= 0);
    assert_read_refused_bounded(path, "/bisect: expected an object stored in this file, found a "
                                      "soft link to '/nowhere'");
}
END_TEST

/* A dataset where the schema has a group, and a group where it has a
 * dataset. */
START_TEST(test_refuse_wrong_object_type) {
    char path[PATH_MAX];
    write_synthetic("dataset_run.h5", path, sizeof path);
    hid_t f = open_rw(path);
    hid_t runs = H5Gopen2(f, "/runs", H5P_DEFAULT);
    ck_assert(runs >= 0 && H5Ldelete(runs, "0001", H5P_DEFAULT) >= 0);
    const hsize_t one[1] = {1};
    replace_dataset(runs, "0001", H5T_NATIVE_INT32, 1, one, H5P_DEFAULT, true);
    ck_assert(H5Gclose(runs) >= 0 && H5Fclose(f) >= 0);
    assert_read_refused_bounded(path, "/runs/0001: expected a group (runs are numbered "
                                      "0000..0002), found a dataset");

    write_synthetic("group_tokens.h5", path, sizeof path);
    f = open_rw(path);
    ck_assert(H5Ldelete(f, "/runs/0001/tokens", H5P_DEFAULT) >= 0);
    hid_t g = H5Gcreate2(f, "/runs/0001/tokens", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    ck_assert(g >= 0 && H5Gclose(g) >= 0 && H5Fclose(f) >= 0);
    assert_read_refused_bounded(path, "/runs/0001/tokens: expected an integer dataset of shape (3, "
                                      "2), found a group");

    write_synthetic("group_summary.h5", path, sizeof path);
    f = open_rw(path);
    ck_assert(H5Ldelete(f, "/summary", H5P_DEFAULT) >= 0);
    g = H5Gcreate2(f, "/summary", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    ck_assert(g >= 0 && H5Gclose(g) >= 0 && H5Fclose(f) >= 0);
    assert_read_refused_bounded(path, "/summary: expected a 1-D compound dataset, found a group");
}
END_TEST

/* Objects the schema does not name: datasets in a skipped run (its flag
 * would hide a result), a stray object among the runs or at the root. */
START_TEST(test_refuse_extra_objects) {
    char path[PATH_MAX];
    const hsize_t rows[2] = {T_STEPS, T_BATCH};
    write_synthetic("skipped_data.h5", path, sizeof path);
    hid_t f = open_rw(path);
    hid_t g = H5Gopen2(f, "/runs/0002", H5P_DEFAULT);
    ck_assert(g >= 0);
    replace_dataset(g, "tokens", H5T_NATIVE_INT32, 2, rows, H5P_DEFAULT, true);
    ck_assert(H5Gclose(g) >= 0 && H5Fclose(f) >= 0);
    assert_read_refused_bounded(path, "/runs/0002: expected only attributes (the run is skipped), "
                                      "found 'tokens'");

    write_synthetic("runs_extra.h5", path, sizeof path);
    f = open_rw(path);
    g = H5Gopen2(f, "/runs", H5P_DEFAULT);
    ck_assert(g >= 0);
    replace_dataset(g, "notes", H5T_NATIVE_INT32, 2, rows, H5P_DEFAULT, true);
    ck_assert(H5Gclose(g) >= 0 && H5Fclose(f) >= 0);
    assert_read_refused_bounded(path, "/runs: expected only run groups named by their index "
                                      "(0000, 0001, ...), found 'notes'");

    write_synthetic("run_extra.h5", path, sizeof path);
    f = open_rw(path);
    g = H5Gopen2(f, "/runs/0001", H5P_DEFAULT);
    ck_assert(g >= 0);
    replace_dataset(g, "hidden_states", H5T_NATIVE_INT32, 2, rows, H5P_DEFAULT, true);
    ck_assert(H5Gclose(g) >= 0 && H5Fclose(f) >= 0);
    assert_read_refused_bounded(path, "/runs/0001: expected only the datasets of a run "
                                      "(SCHEMA.md), found 'hidden_states'");

    write_synthetic("root_extra.h5", path, sizeof path);
    f = open_rw(path);
    replace_dataset(f, "extra", H5T_NATIVE_INT32, 2, rows, H5P_DEFAULT, true);
    ck_assert(H5Fclose(f) >= 0);
    assert_read_refused_bounded(path, "/: expected only tolerances, runs, comparisons, summary and "
                                      "bisect, found 'extra'");
}
END_TEST

/* Only logits may be shared between runs (the writer's hard links): any
 * other object reached by two links, a run group above all (one group
 * under many names would multiply its arrays), is refused. */
START_TEST(test_refuse_shared_objects) {
    char path[PATH_MAX];
    write_synthetic("shared_tokens.h5", path, sizeof path);
    hid_t f = open_rw(path);
    ck_assert(H5Ldelete(f, "/runs/0001/tokens", H5P_DEFAULT) >= 0);
    ck_assert(H5Lcreate_hard(f, "/runs/0000/tokens", f, "/runs/0001/tokens", H5P_DEFAULT,
                             H5P_DEFAULT) >= 0);
    ck_assert(H5Fclose(f) >= 0);
    assert_read_refused_bounded(path, "/runs/0000/tokens: expected an integer dataset of shape (3, "
                                      "2) of its own, found one that 2 links share");

    write_synthetic("shared_run.h5", path, sizeof path);
    f = open_rw(path);
    ck_assert(H5Lcreate_hard(f, "/runs/0000", f, "/runs/0003", H5P_DEFAULT, H5P_DEFAULT) >= 0);
    ck_assert(H5Fclose(f) >= 0);
    assert_read_refused_bounded(path, "/runs/0000: expected a group (runs are numbered "
                                      "0000..0003) of its own, found one that 2 links share");
}
END_TEST

/* ---- shared logits and the read budget ----------------------------------- */

/* A report of n runs of one unit, each (1, 1, vocab) with all-zero logits
 * (identical, so the writer links them), prompt length 1 and no probes. */
static void build_zero_runs(KvReport *rep, int n, int64_t vocab) {
    memset(rep, 0, sizeof *rep);
    snprintf(rep->shard, sizeof rep->shard, "1/1");
    rep->n_runs = n;
    rep->runs = test_alloc((size_t)n * sizeof *rep->runs);
    for (int i = 0; i < n; i++) {
        KvRun *r = &rep->runs[i];
        kv_run_init(r);
        snprintf(r->model, sizeof r->model, "fx-gemma2");
        snprintf(r->scenario, sizeof r->scenario, "prompt_w");
        snprintf(r->variant, sizeof r->variant, "ring");
        snprintf(r->backend, sizeof r->backend, "cpu");
        snprintf(r->mode, sizeof r->mode, "eager");
        r->repeat = i;
        r->steps = r->batch = r->prompt_len = 1;
        r->vocab = vocab;
        r->prompt = test_alloc(sizeof *r->prompt);
        r->prompt_real = test_alloc(1);
        r->prompt_real[0] = 1;
        r->tokens = test_alloc(sizeof *r->tokens);
        r->logits = test_alloc((size_t)vocab * sizeof *r->logits);
        r->logits_hash = test_alloc(sizeof *r->logits_hash);
        r->margins = test_alloc(sizeof *r->margins);
    }
}

/* How many links lead to run i's logits in path. */
static unsigned logits_links(const char *path, int i) {
    hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    ck_assert(f >= 0);
    char name[64];
    snprintf(name, sizeof name, "/runs/%04d/logits", i);
    H5O_info_t info; /* HDF5 1.10: H5Oget_info_by_name2 */
    ck_assert(H5Oget_info_by_name2(f, name, &info, H5O_INFO_BASIC, H5P_DEFAULT) >= 0);
    ck_assert(H5Fclose(f) >= 0);
    return info.rc;
}

/* A few hundred KB of hard links to one well-compressed logits dataset
 * would each be decompressed into a copy: gigabytes from a small file. The
 * reader's budget follows the file's size (kv_limits_read_budget: 1032
 * bytes a byte, at least 64 MiB), so it is refused within its headroom;
 * before, every copy was made (640 MiB here, 4.8 GiB in the reported case). */
#define T_AMP_RUNS 40
START_TEST(test_refuse_shared_logits_amplified) {
    KvReport rep;
    build_zero_runs(&rep, T_AMP_RUNS, 1);
    char path[PATH_MAX];
    scratch_path(path, sizeof path, "amplified.h5");
    KvError err = {{0}};
    ck_assert_msg(kv_report_write_h5(&rep, path, &err) == KV_OK, "%s", err.msg);
    kv_report_free(&rep);
    /* every run's vocab becomes the largest the reader takes; run 0 stores
     * its (1, 1, 2^22) zeros deflated (16 MiB in ~16 KB), the others link it */
    hid_t f = open_rw(path);
    const hsize_t dims[3] = {1, 1, KV_REPORT_MAX_VOCAB};
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    ck_assert(dcpl >= 0 && H5Pset_chunk(dcpl, 3, dims) >= 0 && H5Pset_shuffle(dcpl) >= 0 &&
              H5Pset_deflate(dcpl, 9) >= 0);
    for (int i = 0; i < T_AMP_RUNS; i++) {
        char name[32];
        snprintf(name, sizeof name, "/runs/%04d", i);
        hid_t g = H5Gopen2(f, name, H5P_DEFAULT);
        ck_assert(g >= 0);
        set_attr_i64(g, "vocab", KV_REPORT_MAX_VOCAB);
        ck_assert(H5Ldelete(g, "logits", H5P_DEFAULT) >= 0);
        if (i == 0) {
            replace_dataset(g, "logits", H5T_NATIVE_FLOAT, 3, dims, dcpl, true);
        } else {
            ck_assert(H5Lcreate_hard(f, "/runs/0000/logits", g, "logits", H5P_DEFAULT,
                                     H5P_DEFAULT) >= 0);
        }
        ck_assert(H5Gclose(g) >= 0);
    }
    ck_assert(H5Pclose(dcpl) >= 0 && H5Fclose(f) >= 0);
    ck_assert_msg(file_size(path) < 1 << 20, "the crafted file is not small: %ld",
                  file_size(path));
    assert_read_refused_bounded(path, "/logits: expected a report that fits in");
    assert_read_refused_bounded(path, "per byte of its");
}
END_TEST

/* The writer links identical logits within one (model, scenario) unit
 * only; a link between units is refused, naming both runs' datasets. */
START_TEST(test_refuse_logits_shared_across_units) {
    KvReport rep;
    build_zero_runs(&rep, 2, 4);
    char path[PATH_MAX];
    scratch_path(path, sizeof path, "across.h5");
    KvError err = {{0}};
    ck_assert_msg(kv_report_write_h5(&rep, path, &err) == KV_OK, "%s", err.msg);
    kv_report_free(&rep);
    ck_assert_int_eq(logits_links(path, 1), 2);
    hid_t f = open_rw(path);
    hid_t g = H5Gopen2(f, "/runs/0001", H5P_DEFAULT);
    hid_t a = g >= 0 ? H5Aopen(g, "scenario", H5P_DEFAULT) : H5I_INVALID_HID;
    hid_t t = a >= 0 ? H5Aget_type(a) : H5I_INVALID_HID;
    ck_assert(t >= 0 && H5Tget_size(t) == KV_NAME_LEN);
    char other[KV_NAME_LEN] = "long_decode";
    ck_assert(H5Awrite(a, t, other) >= 0);
    ck_assert(H5Tclose(t) >= 0 && H5Aclose(a) >= 0 && H5Gclose(g) >= 0 && H5Fclose(f) >= 0);
    assert_read_refused_bounded(path, "/runs/0001/logits: expected a float dataset of shape (1, "
                                      "1, 4) of its own or shared with runs of the same model "
                                      "and scenario");
    assert_read_refused_bounded(path, "found the dataset of /runs/0000/logits (model "
                                      "'fx-gemma2', scenario 'prompt_w'; this run: 'fx-gemma2', "
                                      "'long_decode')");
}
END_TEST

/* Where sharing would make the file ask its reader for more than its size
 * allows, the writer stores every run's logits itself (each within
 * deflate's ratio), and the report reads back; a report that stays within
 * keeps its links (test_logits_linked_across_topk_run). */
#define T_UNSHARE_RUNS 10
START_TEST(test_write_unshares_amplified_logits) {
    KvReport rep, back;
    build_zero_runs(&rep, T_UNSHARE_RUNS, (int64_t)1 << 21); /* 80 MiB of logits */
    char path[PATH_MAX];
    scratch_path(path, sizeof path, "unshared.h5");
    KvError err = {{0}};
    ck_assert_msg(kv_report_write_h5(&rep, path, &err) == KV_OK, "%s", err.msg);
    for (int i = 0; i < T_UNSHARE_RUNS; i++) {
        ck_assert_msg(logits_links(path, i) == 1, "run %d's logits are shared (%u links) in a "
                      "%ld-byte file", i, logits_links(path, i), file_size(path));
    }
    ck_assert_msg(kv_report_read_h5(path, &back, &err) == KV_OK, "%s", err.msg);
    for (int64_t i = 0; i < T_UNSHARE_RUNS; i++) assert_same_run(&rep.runs[i], &back.runs[i], i);
    kv_report_free(&back);
    kv_report_free(&rep);
}
END_TEST

/* What the reader refuses, the writer refuses before it creates anything:
 * sizes beyond the limits table, negative counts, a top-k row naming one
 * id twice or an id outside the vocabulary (before, these were written and
 * then could not be read back). */
START_TEST(test_write_refuses_what_reader_refuses) {
    KvReport rep;
    build_report(&rep);
    char path[PATH_MAX];
    scratch_path(path, sizeof path, "limits.h5");
    rep.runs[2].batch = KV_REPORT_MAX_BATCH + 1; /* skipped: no arrays to allocate */
    assert_write_fails(&rep, path, KV_ERR_INPUT, "runs[2].batch: expected 0..4096");
    rep.runs[2].batch = T_BATCH;
    rep.runs[2].prompt_len = KV_REPORT_MAX_PROMPT_LEN + 1;
    assert_write_fails(&rep, path, KV_ERR_INPUT, "runs[2].prompt_len: expected 0..1048576");
    rep.runs[2].prompt_len = T_PLEN;
    rep.runs[2].steps = KV_REPORT_MAX_STEPS + 1;
    assert_write_fails(&rep, path, KV_ERR_INPUT, "runs[2].steps: expected 0..1048576");
    rep.runs[2].steps = T_STEPS;
    rep.runs[0].repeat = -1;
    assert_write_fails(&rep, path, KV_ERR_INPUT, "runs[0].repeat: expected 0..2147483647");
    rep.runs[0].repeat = 0;
    rep.runs[1].graphs_captured = -1;
    assert_write_fails(&rep, path, KV_ERR_INPUT, "runs[1].graphs_captured: expected 0..");
    rep.runs[1].graphs_captured = 2;
    KvRun *t = &rep.runs[0];
    free(t->logits);
    t->logits = NULL;
    t->topk = 2;
    t->topk_ids = test_alloc(T_STEPS * T_BATCH * 2 * sizeof *t->topk_ids);
    t->topk_values = test_alloc(T_STEPS * T_BATCH * 2 * sizeof *t->topk_values);
    for (int i = 0; i < T_STEPS * T_BATCH * 2; i++) t->topk_ids[i] = i % T_VOCAB;
    t->topk_ids[(1 * T_BATCH + 1) * 2 + 1] = t->topk_ids[(1 * T_BATCH + 1) * 2];
    assert_write_fails(&rep, path, KV_ERR_INPUT,
                       "runs[0].topk_ids[step 1, row 1]: expected 2 distinct token ids");
    t->topk_ids[(1 * T_BATCH + 1) * 2 + 1] = T_VOCAB;
    assert_write_fails(&rep, path, KV_ERR_INPUT,
                       "runs[0].topk_ids[step 1, row 1, 1]: expected a token id 0..4, found 5");
    ck_assert_int_eq(count_entries(NULL), 0);
    kv_report_free(&rep);
}
END_TEST

/* The same values in a file are refused by the reader, naming the run. */
START_TEST(test_refuse_bad_values) {
    char path[PATH_MAX];
    const struct {
        const char *attr;
        int64_t value;
        const char *want;
    } cases[] = {
        {"repeat", -1, "/runs/0001: attribute repeat: expected 0..2147483647, found -1"},
        {"graphs_captured", -2, "/runs/0001: attribute graphs_captured: expected 0..9223372036854775807, found -2"},
        {"replays_checked", -1, "/runs/0001: attribute replays_checked: expected 0.."},
        {"replay_mismatch_step", -2, "/runs/0001: attribute replay_mismatch_step: expected -1.."},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        write_synthetic("values.h5", path, sizeof path);
        hid_t f = open_rw(path);
        hid_t g = H5Gopen2(f, "/runs/0001", H5P_DEFAULT);
        ck_assert(g >= 0);
        set_attr_i64(g, cases[k].attr, cases[k].value);
        ck_assert(H5Gclose(g) >= 0 && H5Fclose(f) >= 0);
        assert_read_fails(path, cases[k].want);
    }
    /* a top-k row naming one id twice: the file as the writer wrote it,
     * then one id edited */
    KvReport rep;
    build_report(&rep);
    KvRun *t = &rep.runs[0];
    free(t->logits);
    t->logits = NULL;
    t->topk = 2;
    t->topk_ids = test_alloc(T_STEPS * T_BATCH * 2 * sizeof *t->topk_ids);
    t->topk_values = test_alloc(T_STEPS * T_BATCH * 2 * sizeof *t->topk_values);
    for (int i = 0; i < T_STEPS * T_BATCH * 2; i++) t->topk_ids[i] = i % T_VOCAB;
    scratch_path(path, sizeof path, "topk.h5");
    KvError err = {{0}};
    ck_assert_msg(kv_report_write_h5(&rep, path, &err) == KV_OK, "%s", err.msg);
    t->topk_ids[(2 * T_BATCH + 0) * 2 + 1] = t->topk_ids[(2 * T_BATCH + 0) * 2];
    hid_t f = open_rw(path);
    hid_t d = H5Dopen2(f, "/runs/0000/topk_ids", H5P_DEFAULT);
    ck_assert(d >= 0 && H5Dwrite(d, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT,
                                 t->topk_ids) >= 0);
    ck_assert(H5Dclose(d) >= 0 && H5Fclose(f) >= 0);
    assert_read_fails(path, "/runs/0000 (fx-gemma2/prompt_w_plus_1/reference/cpu/eager/r0): "
                            "topk_ids[step 2, row 0]: expected 2 distinct token ids (the row's "
                            "largest logits), found id 3 more than once");
    kv_report_free(&rep);
}
END_TEST

/* A writer's temporary is not a report, whatever it holds. */
START_TEST(test_refuse_writer_temporary) {
    char path[PATH_MAX], tmp[PATH_MAX + 32];
    write_synthetic("r.h5", path, sizeof path);
    snprintf(tmp, sizeof tmp, "%s.tmp-12345", path);
    ck_assert(link(path, tmp) == 0);
    assert_read_refused_bounded(tmp, "expected a report, found a writer's temporary");
    ck_assert(kv_report_is_temp_name("a/b/r.h5.tmp-7"));
    ck_assert(kv_report_is_temp_name("r.h5.tmp-1.tmp-22"));
    ck_assert(!kv_report_is_temp_name("r.h5"));
    ck_assert(!kv_report_is_temp_name("r.h5.tmp-"));
    ck_assert(!kv_report_is_temp_name("r.h5.tmp-12x"));
    ck_assert(!kv_report_is_temp_name(".tmp-12"));
    ck_assert(!kv_report_is_temp_name("dir.tmp-3/r.h5"));
}
END_TEST

/* ---- report files: check, full disk, killed writers, stale temporaries -- */

static void assert_check_fails(const char *path, const char *part) {
    KvError err = {{0}};
    const KvStatus st = kv_report_check_writable(path, &err);
    ck_assert_msg(st == KV_ERR_INPUT, "check %s: expected KV_ERR_INPUT, found %d (%s)", path, st,
                  err.msg);
    ck_assert_msg(strncmp(err.msg, path, strlen(path)) == 0, "message lacks the path: %s", err.msg);
    ck_assert_msg(strstr(err.msg, part) != NULL, "message lacks \"%s\": %s", part, err.msg);
}

START_TEST(test_check_writable) {
    char path[PATH_MAX], file[PATH_MAX], fifo[PATH_MAX];
    KvError err = {{0}};
    scratch_path(path, sizeof path, "new.h5");
    ck_assert_msg(kv_report_check_writable(path, &err) == KV_OK, "%s", err.msg);
    ck_assert_int_eq(count_entries(NULL), 0); /* nothing left behind */
    write_synthetic("old.h5", path, sizeof path);
    ck_assert_msg(kv_report_check_writable(path, &err) == KV_OK, "%s", err.msg);
    ck_assert_int_eq(count_entries(NULL), 1);

    scratch_path(path, sizeof path, "no-such-dir/r.h5");
    assert_check_fails(path, ": cannot create: No such file or directory");
    assert_check_fails(g_dir, ": cannot create: Is a directory");
    scratch_path(file, sizeof file, "plain.txt");
    FILE *f = fopen(file, "w");
    ck_assert(f != NULL && fclose(f) == 0);
    scratch_path(path, sizeof path, "plain.txt/r.h5");
    assert_check_fails(path, ": cannot create: Not a directory");
    /* a FIFO (or a device: renaming over /dev/null as root would replace
     * it) is refused, and the writers refuse it too, leaving it alone */
    scratch_path(fifo, sizeof fifo, "fifo.h5");
    ck_assert(mkfifo(fifo, 0644) == 0);
    assert_check_fails(fifo, ": cannot create: expected a regular file or a new name, found a FIFO");
    KvReport rep;
    build_report(&rep);
    assert_write_fails(&rep, fifo, KV_ERR_INPUT, "found a FIFO");
    kv_report_free(&rep);
    struct stat sb;
    ck_assert(lstat(fifo, &sb) == 0 && S_ISFIFO(sb.st_mode));
    /* a name the reader would refuse is not written */
    scratch_path(path, sizeof path, "r.h5.tmp-42");
    assert_check_fails(path, ": cannot create: a name ending in .tmp-DIGITS is a writer's "
                             "temporary");
    ck_assert_int_eq(kv_report_check_writable(NULL, &err), KV_ERR_INPUT);
    ck_assert_int_eq(kv_report_check_writable("", &err), KV_ERR_INPUT);
}
END_TEST

/* The result of a write in a child process. */
typedef struct {
    KvStatus st;
    char msg[sizeof(((KvError *)0)->msg)];
} ChildWrite;

/* Writes the synthetic report to path in a child whose files may not grow
 * past limit bytes (RLIMIT_FSIZE). With SIGXFSZ ignored, write() fails with
 * EFBIG: the failure a full disk gives (ENOSPC) by the same path. With it
 * left at its default, the child is killed inside write(): a writer killed
 * mid-write. Returns the wait status; *out has the result when it exited. */
static int write_in_child(const char *path, rlim_t limit, bool kill_on_limit, ChildWrite *out) {
    int fds[2];
    ck_assert_msg(pipe(fds) == 0, "pipe: %s", strerror(errno));
    KvReport rep;
    build_report(&rep);
    const pid_t pid = fork();
    ck_assert_msg(pid >= 0, "fork: %s", strerror(errno));
    if (pid == 0) {
        close(fds[0]);
        alarm(T_READ_SECONDS);
        if (!kill_on_limit) signal(SIGXFSZ, SIG_IGN);
        const struct rlimit lim = {limit, limit};
        if (setrlimit(RLIMIT_FSIZE, &lim) != 0) _exit(3);
        ChildWrite w;
        memset(&w, 0, sizeof w);
        KvError err = {{0}};
        w.st = kv_report_write_h5(&rep, path, &err);
        snprintf(w.msg, sizeof w.msg, "%s", err.msg);
        _exit(write(fds[1], &w, sizeof w) == (ssize_t)sizeof w ? 0 : 4);
    }
    close(fds[1]);
    kv_report_free(&rep);
    memset(out, 0, sizeof *out);
    size_t got = 0;
    while (got < sizeof *out) {
        const ssize_t n = read(fds[0], (char *)out + got, sizeof *out - got);
        if (n <= 0) break;
        got += (size_t)n;
    }
    close(fds[0]);
    int status = 0;
    ck_assert(waitpid(pid, &status, 0) == pid);
    return status;
}

/* A full disk is bad input naming the path, like every other failure of the
 * destination; the old report and the directory are as they were. */
START_TEST(test_write_disk_full) {
    char path[PATH_MAX], before[PATH_MAX];
    write_synthetic("full.h5", path, sizeof path);
    write_synthetic("before.h5", before, sizeof before); /* the same bytes, to compare with */
    const long old_size = file_size(path);
    ChildWrite w;
    const int status = write_in_child(path, 1024, false, &w);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child status 0x%x",
                  (unsigned)status);
    ck_assert_msg(w.st == KV_ERR_INPUT, "expected KV_ERR_INPUT, found %d (%s)", w.st, w.msg);
    char want[PATH_MAX + 64];
    snprintf(want, sizeof want, "%s: cannot write: %s", path, strerror(EFBIG));
    ck_assert_str_eq(w.msg, want);
    ck_assert_int_eq(file_size(path), old_size);
    assert_same_file(path, before);
    ck_assert_int_eq(count_entries(".tmp-"), 0);
    ck_assert_int_eq(count_entries(NULL), 2);
}
END_TEST

/* A writer killed in the middle of writing leaves no temporary and no
 * partial report: the bytes were going to a file without a name. */
START_TEST(test_killed_writer_leaves_nothing) {
    char path[PATH_MAX];
    scratch_path(path, sizeof path, "killed.h5");
    ChildWrite w;
    const int status = write_in_child(path, 1024, true, &w);
    ck_assert_msg(WIFSIGNALED(status) && WTERMSIG(status) == SIGXFSZ,
                  "expected the writer killed by SIGXFSZ, found status 0x%x", (unsigned)status);
    ck_assert(!path_exists(path));
    ck_assert_int_eq(count_entries(NULL), 0);
}
END_TEST

/* A pid that no longer exists: a child that has exited and been reaped. */
static pid_t dead_pid(void) {
    const pid_t pid = fork();
    ck_assert(pid >= 0);
    if (pid == 0) _exit(0);
    ck_assert(waitpid(pid, NULL, 0) == pid);
    return pid;
}

static void touch(const char *path) {
    FILE *f = fopen(path, "w");
    ck_assert_msg(f != NULL && fputs("half a report", f) >= 0 && fclose(f) == 0, "%s", path);
}

/* Temporaries a killed writer of an older version left (named files) are
 * removed by the next write of the same report when their process is gone;
 * a live process's, and other reports', are left alone. */
START_TEST(test_stale_temporaries_removed) {
    char path[PATH_MAX], stale[PATH_MAX + 32], live[PATH_MAX + 32], other[PATH_MAX + 32];
    scratch_path(path, sizeof path, "r.h5");
    snprintf(stale, sizeof stale, "%s.tmp-%ld", path, (long)dead_pid());
    snprintf(live, sizeof live, "%s.tmp-%ld", path, (long)getppid());
    scratch_path(other, sizeof other, "other.h5");
    snprintf(other + strlen(other), sizeof other - strlen(other), ".tmp-%ld", (long)dead_pid());
    touch(stale);
    touch(live);
    touch(other);
    KvReport rep, back;
    build_report(&rep);
    KvError err = {{0}};
    ck_assert_msg(kv_report_write_h5(&rep, path, &err) == KV_OK, "write: %s", err.msg);
    kv_report_free(&rep);
    ck_assert_msg(!path_exists(stale), "stale temporary %s left", stale);
    ck_assert_msg(path_exists(live), "a live writer's temporary %s removed", live);
    ck_assert_msg(path_exists(other), "another report's temporary %s removed", other);
    ck_assert_msg(kv_report_read_h5(path, &back, &err) == KV_OK, "read: %s", err.msg);
    kv_report_free(&back);
    assert_read_fails(live, "expected a report, found a writer's temporary");
}
END_TEST

/* ---- summary ------------------------------------------------------------ */

START_TEST(test_run_verdicts) {
    KvReport rep;
    build_report(&rep);
    ck_assert_int_eq(kv_report_run_verdict(&rep, 0), KV_VERDICT_PASS); /* reference */
    ck_assert_int_eq(kv_report_run_verdict(&rep, 1), KV_VERDICT_FAIL);
    ck_assert_int_eq(kv_report_run_verdict(&rep, 2), KV_VERDICT_SKIP);
    ck_assert_int_eq(kv_report_run_verdict(&rep, 3), KV_VERDICT_SKIP); /* out of range */
    ck_assert_int_eq(kv_report_run_verdict(&rep, -1), KV_VERDICT_SKIP);
    ck_assert(isnan(kv_report_run_max_rel_err(&rep, 0)));
    ck_assert(kv_report_run_max_rel_err(&rep, 1) == 0.0625);
    /* a failure outranks a skip, on a skipped run too */
    rep.comparisons[1].verdict = KV_VERDICT_FAIL;
    ck_assert_int_eq(kv_report_run_verdict(&rep, 2), KV_VERDICT_FAIL);
    /* a ran run whose only comparison was skipped is not a pass */
    rep.comparisons[0].verdict = KV_VERDICT_SKIP;
    ck_assert_int_eq(kv_report_run_verdict(&rep, 1), KV_VERDICT_SKIP);
    rep.comparisons[0].verdict = KV_VERDICT_PASS;
    ck_assert_int_eq(kv_report_run_verdict(&rep, 1), KV_VERDICT_PASS);
    char div[128];
    kv_report_run_divergence(&rep, 1, div, sizeof div);
    ck_assert_str_eq(div, "-");
    rep.comparisons[0].verdict = KV_VERDICT_FAIL;
    kv_report_run_divergence(&rep, 1, div, sizeof div);
    ck_assert_str_eq(div, "step 1 row 0 probe layer0.k vs reference/cpu/eager/r0");
    kv_report_run_divergence(&rep, 1, div, 8); /* truncated, terminated */
    ck_assert_str_eq(div, "step 1 ");
    kv_report_free(&rep);
}
END_TEST

/* kv_report_summarize_runs says what the per-run calls say, in one pass. */
START_TEST(test_summaries_match_per_run_calls) {
    KvReport rep;
    build_report(&rep);
    for (int pass = 0; pass < 3; pass++) {
        if (pass == 1) rep.comparisons[1].verdict = KV_VERDICT_FAIL;
        if (pass == 2) {
            rep.comparisons[0].verdict = KV_VERDICT_SKIP;
            rep.comparisons[1].run_b = 1;
            rep.comparisons[1].max_rel_err = NAN;
        }
        KvRunSummary *sum = NULL;
        ck_assert_int_eq(kv_report_summarize_runs(&rep, &sum), KV_OK);
        for (int64_t i = 0; i < rep.n_runs; i++) {
            ck_assert_int_eq(sum[i].verdict, kv_report_run_verdict(&rep, i));
            const double a = sum[i].max_rel_err, b = kv_report_run_max_rel_err(&rep, i);
            ck_assert_msg(memcmp(&a, &b, sizeof a) == 0, "run %lld: max_rel_err %g vs %g",
                          (long long)i, a, b);
            char d1[256], d2[256];
            kv_report_run_divergence_of(&rep, i, &sum[i], d1, sizeof d1);
            kv_report_run_divergence(&rep, i, d2, sizeof d2);
            ck_assert_str_eq(d1, d2);
        }
        free(sum);
    }
    ck_assert_int_eq(kv_report_summarize_runs(NULL, NULL), KV_ERR_INPUT);
    kv_report_free(&rep);
}
END_TEST

/* Splits text into lines in place; returns the count. */
static int split_lines(char *text, char **lines, int max) {
    int n = 0;
    char *p = text;
    while (*p != '\0' && n < max) {
        lines[n++] = p;
        char *nl = strchr(p, '\n');
        if (nl == NULL) break;
        *nl = '\0';
        p = nl + 1;
    }
    return n;
}

START_TEST(test_print_summary) {
    KvReport rep;
    build_report(&rep);
    FILE *f = tmpfile();
    ck_assert(f != NULL);
    ck_assert_int_eq(kv_report_print_summary(&rep, f), KV_OK);
    rewind(f);
    static char text[8192];
    size_t n = fread(text, 1, sizeof text - 1, f);
    text[n] = '\0';
    fclose(f);
    ck_assert_msg(n > 0 && text[n - 1] == '\n', "summary does not end with a newline:\n%s", text);
    char *lines[16];
    const int nl = split_lines(text, lines, 16);
    ck_assert_msg(nl == 5, "expected header + 3 runs + totals, found %d lines", nl);
    /* the run index comes first: what diff and bisect take as --run */
    ck_assert_msg(strncmp(lines[0], "#  model", 8) == 0 && strstr(lines[0], "verdict") != NULL &&
                      strstr(lines[0], "first divergence") != NULL &&
                      strstr(lines[0], "max rel err") != NULL && strstr(lines[0], "graphs") != NULL,
                  "header: %s", lines[0]);
    const char *verdicts[3] = {"PASS", "FAIL", "SKIP"};
    const char *vcol = strstr(lines[0], "verdict");
    for (int i = 0; i < 3; i++) {
        const char *line = lines[1 + i];
        char head[16];
        snprintf(head, sizeof head, "%d  fx-gemma2", i);
        ck_assert_msg(strncmp(line, head, strlen(head)) == 0, "run %d: %s", i, line);
        /* columns line up: the verdict sits under its header */
        ck_assert_msg(strncmp(line + (vcol - lines[0]), verdicts[i], 4) == 0,
                      "run %d verdict not under the header:\n%s\n%s", i, lines[0], line);
    }
    ck_assert_msg(strstr(lines[1], "reference") != NULL && strstr(lines[1], " - ") != NULL, "%s",
                  lines[1]);
    ck_assert_msg(strstr(lines[2], "index_copy") != NULL && strstr(lines[2], "graph") != NULL &&
                      strstr(lines[2], "step 1 row 0 probe layer0.k vs reference/cpu/eager/r0") !=
                          NULL &&
                      strstr(lines[2], "6.250e-02") != NULL,
                  "%s", lines[2]);
    const size_t l2 = strlen(lines[2]);
    ck_assert_msg(l2 > 2 && lines[2][l2 - 1] == '2' && lines[2][l2 - 2] == ' ', "graphs column: %s",
                  lines[2]);
    ck_assert_msg(strstr(lines[3], "cuda") != NULL &&
                      strstr(lines[3], "skipped: no CUDA device: cudaErrorNoDevice") != NULL,
                  "%s", lines[3]);
    ck_assert_str_eq(lines[4], "1 passed, 1 failed, 1 skipped");
    kv_report_free(&rep);
}
END_TEST

START_TEST(test_print_summary_empty) {
    KvReport rep;
    memset(&rep, 0, sizeof rep);
    FILE *f = tmpfile();
    ck_assert(f != NULL);
    ck_assert_int_eq(kv_report_print_summary(&rep, f), KV_OK);
    rewind(f);
    char text[512];
    size_t n = fread(text, 1, sizeof text - 1, f);
    text[n] = '\0';
    fclose(f);
    const char *last = strstr(text, "\n");
    ck_assert(last != NULL);
    ck_assert_str_eq(last + 1, "0 passed, 0 failed, 0 skipped\n");
}
END_TEST

START_TEST(test_free_is_safe) {
    kv_report_free(NULL);
    kv_run_free(NULL);
    KvReport rep;
    build_report(&rep);
    kv_run_free(&rep.runs[0]);
    ck_assert_ptr_null(rep.runs[0].logits);
    kv_run_free(&rep.runs[0]); /* twice: zeroed, so nothing to free */
    kv_report_free(&rep);
    ck_assert(report_is_zero(&rep));
    kv_report_free(&rep);
}
END_TEST

static Suite *report_suite(void) {
    Suite *s = suite_create("report");

    TCase *rt = tcase_create("roundtrip");
    tcase_add_checked_fixture(rt, setup, teardown);
    tcase_add_test(rt, test_roundtrip_exact);
    tcase_add_test(rt, test_prefix_script_roundtrip);
    tcase_add_test(rt, test_shift_script_roundtrip);
    tcase_add_test(rt, test_many_runs_roundtrip);
    tcase_add_test(rt, test_roundtrip_empty_shapes);
    tcase_add_test(rt, test_optional_attrs_only_when_set);
    tcase_add_test(rt, test_read_variable_length_attribute);
    suite_add_tcase(s, rt);

    TCase *bytes = tcase_create("reproducible_bytes");
    tcase_add_checked_fixture(bytes, setup, teardown);
    tcase_set_timeout(bytes, 30);
    tcase_add_test(bytes, test_byte_identical);
    tcase_add_test(bytes, test_bytes_ignore_garbage_after_strings);
    tcase_add_test(bytes, test_h5dump_reads_report);
    tcase_add_test(bytes, test_logits_linked_across_topk_run);
    suite_add_tcase(s, bytes);

    TCase *wr = tcase_create("write_errors");
    tcase_add_checked_fixture(wr, setup, teardown);
    tcase_add_test(wr, test_write_missing_directory);
    tcase_add_test(wr, test_write_under_regular_file);
    tcase_add_test(wr, test_write_over_directory_leaves_no_temp);
    tcase_add_test(wr, test_write_inconsistent_report);
    tcase_add_test(wr, test_write_replaces_existing);
    suite_add_tcase(s, wr);

    TCase *rd = tcase_create("read_errors");
    tcase_add_checked_fixture(rd, setup, teardown);
    tcase_add_test(rd, test_read_missing_file);
    tcase_add_test(rd, test_read_text_file);
    tcase_add_test(rd, test_read_directory);
    tcase_add_test(rd, test_read_truncated);
    tcase_add_test(rd, test_read_other_schema_version);
    tcase_add_test(rd, test_read_missing_dataset);
    tcase_add_test(rd, test_read_missing_group);
    tcase_add_test(rd, test_read_missing_attribute);
    tcase_add_test(rd, test_read_inconsistent_shape);
    tcase_add_test(rd, test_read_missing_table);
    tcase_add_test(rd, test_read_ascii_table_strings);
    tcase_add_test(rd, test_read_table_string_too_long);
    suite_add_tcase(s, rd);

    TCase *hostile = tcase_create("hostile_reports");
    tcase_add_checked_fixture(hostile, setup, teardown);
    tcase_set_timeout(hostile, 120);
    tcase_add_test(hostile, test_refuse_huge_logits_unallocated);
    tcase_add_test(hostile, test_refuse_huge_logits_chunked);
    tcase_add_test(hostile, test_refuse_missing_chunks);
    tcase_add_test(hostile, test_refuse_foreign_storage);
    tcase_add_test(hostile, test_refuse_table_10m_rows);
    tcase_add_test(hostile, test_refuse_sizes_over_caps);
    tcase_add_test(hostile, test_refuse_inconsistent_steps);
    tcase_add_test(hostile, test_refuse_external_link);
    tcase_add_test(hostile, test_refuse_soft_link);
    tcase_add_test(hostile, test_refuse_wrong_object_type);
    tcase_add_test(hostile, test_refuse_extra_objects);
    tcase_add_test(hostile, test_refuse_shared_objects);
    tcase_add_test(hostile, test_refuse_writer_temporary);
    tcase_add_test(hostile, test_refuse_shared_logits_amplified);
    tcase_add_test(hostile, test_refuse_logits_shared_across_units);
    tcase_add_test(hostile, test_write_unshares_amplified_logits);
    tcase_add_test(hostile, test_write_refuses_what_reader_refuses);
    tcase_add_test(hostile, test_refuse_bad_values);
    suite_add_tcase(s, hostile);

    TCase *files = tcase_create("report_files");
    tcase_add_checked_fixture(files, setup, teardown);
    tcase_set_timeout(files, 60);
    tcase_add_test(files, test_check_writable);
    tcase_add_test(files, test_write_disk_full);
    tcase_add_test(files, test_killed_writer_leaves_nothing);
    tcase_add_test(files, test_stale_temporaries_removed);
    suite_add_tcase(s, files);

    TCase *sum = tcase_create("summary");
    tcase_add_test(sum, test_run_verdicts);
    tcase_add_test(sum, test_summaries_match_per_run_calls);
    tcase_add_test(sum, test_print_summary);
    tcase_add_test(sum, test_print_summary_empty);
    tcase_add_test(sum, test_free_is_safe);
    suite_add_tcase(s, sum);
    return s;
}

int main(void) {
    SRunner *sr = srunner_create(report_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
