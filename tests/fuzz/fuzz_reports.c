/* fuzz_reports.c: see fuzz_reports.h. */
#include "fuzz_reports.h"
#include "fuzz_common.h"
#include "report_h5.h"

#include <hdf5.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void *xcalloc(size_t n, size_t size) {
    void *p = calloc(n > 0 ? n : 1, size);
    if (p == NULL) {
        fprintf(stderr, "kvrepro fuzz: out of memory\n");
        abort();
    }
    return p;
}

/* A run of steps 2, batch 1, vocab 4, prompt 3, 2 probes; topk 0 or 2. */
static void tiny_run(KvRun *r, const char *variant, const char *mode, int32_t repeat,
                     int32_t topk, uint32_t salt) {
    const int64_t S = 2, B = 1, V = 4, P = 3, NP = 2;
    memset(r, 0, sizeof *r);
    snprintf(r->model, sizeof r->model, "tiny");
    snprintf(r->scenario, sizeof r->scenario, "prompt_w");
    snprintf(r->variant, sizeof r->variant, "%s", variant);
    snprintf(r->backend, sizeof r->backend, "cpu");
    snprintf(r->mode, sizeof r->mode, "%s", mode);
    r->repeat = repeat;
    r->steps = S;
    r->batch = B;
    r->vocab = V;
    r->prompt_len = P;
    r->n_probes = NP;
    r->topk = topk;
    r->replay_mismatch_step = -1;
    r->prompt = xcalloc((size_t)(B * P), sizeof *r->prompt);
    r->prompt_real = xcalloc((size_t)(B * P), sizeof *r->prompt_real);
    for (int64_t i = 0; i < B * P; i++) {
        r->prompt[i] = (int32_t)(i + 1);
        r->prompt_real[i] = 1;
    }
    r->tokens = xcalloc((size_t)(S * B), sizeof *r->tokens);
    r->logits_hash = xcalloc((size_t)(S * B), sizeof *r->logits_hash);
    r->margins = xcalloc((size_t)(S * B), sizeof *r->margins);
    for (int64_t i = 0; i < S * B; i++) {
        r->tokens[i] = (int32_t)((i + salt) % V);
        r->logits_hash[i] = 0x9e3779b97f4a7c15ull * (uint64_t)(i + 1 + salt);
        r->margins[i] = 0.25f * (float)(i + 1);
    }
    if (topk == 0) {
        r->logits = xcalloc((size_t)(S * B * V), sizeof *r->logits);
        for (int64_t i = 0; i < S * B * V; i++) r->logits[i] = (float)(i % V) - 1.5f;
    } else {
        r->topk_ids = xcalloc((size_t)(S * B * topk), sizeof *r->topk_ids);
        r->topk_values = xcalloc((size_t)(S * B * topk), sizeof *r->topk_values);
        for (int64_t i = 0; i < S * B * topk; i++) {
            r->topk_ids[i] = (int32_t)(V - 1 - i % topk);
            r->topk_values[i] = 1.0f - 0.5f * (float)(i % topk);
        }
    }
    r->probe_names = xcalloc((size_t)NP, sizeof *r->probe_names);
    snprintf(r->probe_names[0], KV_NAME_LEN, "embed");
    snprintf(r->probe_names[1], KV_NAME_LEN, "logits");
    r->probe_hash = xcalloc((size_t)(S * NP * B), sizeof *r->probe_hash);
    for (int64_t i = 0; i < S * NP * B; i++) r->probe_hash[i] = 0xcbf29ce484222325ull ^ (uint64_t)(i + salt);
}

static void tiny_comparison(KvComparison *c, KvCompareKind kind, int64_t a, int64_t b,
                            KvVerdict v, const char *msg) {
    memset(c, 0, sizeof *c);
    c->kind = kind;
    c->run_a = a;
    c->run_b = b;
    c->verdict = v;
    snprintf(c->message, sizeof c->message, "%s", msg);
    c->first_step = c->first_row = c->first_probe = -1;
    c->top1_agreement = 1.0;
}

static void tiny_foreign_runs(KvReport *rep);

void kv_fuzz_tiny_report(KvFuzzReportKind kind, KvReport *rep) {
    memset(rep, 0, sizeof *rep);
    snprintf(rep->tool_version, sizeof rep->tool_version, "0.1.0");
    snprintf(rep->git_commit, sizeof rep->git_commit, "fuzzseed");
    snprintf(rep->host, sizeof rep->host, "fuzz");
    snprintf(rep->device, sizeof rep->device, "cpu only");
    snprintf(rep->math_mode, sizeof rep->math_mode, "fp32, no TF32, -ffp-contract=off");
    snprintf(rep->shard, sizeof rep->shard, "1/1");
    rep->weight_seed = 1;
    rep->prompt_seed = 2;
    rep->model_hash = 0x0123456789abcdefull;
    if (kind == KV_FUZZ_REPORT_EMPTY) return;

    rep->n_tolerances = 2;
    rep->tolerances = xcalloc(2, sizeof *rep->tolerances);
    snprintf(rep->tolerances[0].name, KV_NAME_LEN, "max_rel_err");
    rep->tolerances[0].value = 1e-4;
    snprintf(rep->tolerances[0].reason, sizeof rep->tolerances[0].reason, "fp32 reorderings");
    snprintf(rep->tolerances[1].name, KV_NAME_LEN, "tie_margin");
    rep->tolerances[1].value = 1e-3;
    snprintf(rep->tolerances[1].reason, sizeof rep->tolerances[1].reason, "near ties");

    const int32_t topk = kind == KV_FUZZ_REPORT_TOPK ? 2 : 0;
    rep->n_runs = kind == KV_FUZZ_REPORT_FAIL ? 3 : 2;
    rep->runs = xcalloc((size_t)rep->n_runs, sizeof *rep->runs);
    tiny_run(&rep->runs[0], "reference", "eager", 0, topk, 0);
    tiny_run(&rep->runs[1], "ring", kind == KV_FUZZ_REPORT_FAIL ? "graph" : "eager", 0, topk,
             kind == KV_FUZZ_REPORT_FAIL ? 1 : 0);
    rep->n_comparisons = kind == KV_FUZZ_REPORT_FAIL ? 3 : 1;
    rep->comparisons = xcalloc((size_t)rep->n_comparisons, sizeof *rep->comparisons);
    tiny_comparison(&rep->comparisons[0], KV_CMP_REFERENCE, 0, 1,
                    kind == KV_FUZZ_REPORT_FAIL ? KV_VERDICT_FAIL : KV_VERDICT_PASS,
                    kind == KV_FUZZ_REPORT_FAIL ? "token differs at step 1 row 0" : "agrees");
    rep->comparisons[0].max_rel_err = kind == KV_FUZZ_REPORT_FAIL ? 0.5 : 0.0;
    if (kind == KV_FUZZ_REPORT_FAIL) {
        rep->comparisons[0].first_step = 1;
        rep->comparisons[0].first_row = 0;
        rep->comparisons[0].first_probe = 1;
        rep->comparisons[0].near_ties = 1;
        rep->comparisons[0].top1_agreement = 0.5;
        rep->runs[1].graphs_captured = 2;
        rep->runs[1].replays_checked = 1;
        rep->runs[1].replay_mismatch_step = 1;
        /* A cuda run skipped here: attributes only. */
        KvRun *s = &rep->runs[2];
        memset(s, 0, sizeof *s);
        snprintf(s->model, sizeof s->model, "tiny");
        snprintf(s->scenario, sizeof s->scenario, "prompt_w");
        snprintf(s->variant, sizeof s->variant, "ring");
        snprintf(s->backend, sizeof s->backend, "cuda");
        snprintf(s->mode, sizeof s->mode, "eager");
        s->skipped = true;
        snprintf(s->skip_reason, sizeof s->skip_reason, "no CUDA device");
        s->replay_mismatch_step = -1;
        tiny_comparison(&rep->comparisons[1], KV_CMP_REFERENCE, 0, 2, KV_VERDICT_SKIP,
                        "skipped: no CUDA device");
        tiny_comparison(&rep->comparisons[2], KV_CMP_GRAPH, 1, 1, KV_VERDICT_PASS, "identical");
        tiny_foreign_runs(rep);
    }
    if (kind == KV_FUZZ_REPORT_TOPK) {
        snprintf(rep->runs[1].fault, sizeof rep->runs[1].fault, "stale_scalar");
        rep->runs[1].prefill_chunk = 2;
    }
}

/* The FAIL kind's runs of another engine (what `gate --external` reads and
 * its report keeps): a compiled top-k run with the engine's attributes, and
 * a run the engine could not complete ("failed: ..."). Its margins and skip
 * reasons are checked by the reader (h5_run_values_ok). */
static void tiny_foreign_runs(KvReport *rep) {
    const int64_t n = rep->n_runs;
    KvRun *grown = realloc(rep->runs, (size_t)(n + 2) * sizeof *grown);
    if (grown == NULL) {
        fprintf(stderr, "kvrepro fuzz: out of memory\n");
        abort();
    }
    rep->runs = grown;
    rep->n_runs = n + 2;
    KvRun *x = &rep->runs[n];
    tiny_run(x, "hf:static_sliding:sdpa:fp32", "compile", 0, 2, 2);
    snprintf(x->backend, sizeof x->backend, "torch-cpu");
    snprintf(x->engine, sizeof x->engine, "transformers 5.23.0, torch 2.15.0, attn sdpa, fp32");
    x->recompiles = 0;
    x->graph_budget = 1;
    x->graphs_captured = 1;
    KvRun *f = &rep->runs[n + 1];
    memset(f, 0, sizeof *f);
    snprintf(f->model, sizeof f->model, "tiny");
    snprintf(f->scenario, sizeof f->scenario, "prompt_w");
    snprintf(f->variant, sizeof f->variant, "hf:static_sliding:sdpa:fp32");
    snprintf(f->backend, sizeof f->backend, "torch-cpu");
    snprintf(f->mode, sizeof f->mode, "reduce-overhead");
    snprintf(f->engine, sizeof f->engine, "transformers 5.23.0");
    f->skipped = true;
    snprintf(f->skip_reason, sizeof f->skip_reason, "failed: RuntimeError: boom");
    f->recompiles = f->graph_budget = -1;
    f->replay_mismatch_step = -1;
}

#define DIFF(...)                                                                                  \
    do {                                                                                           \
        snprintf(why, n, __VA_ARGS__);                                                             \
        return false;                                                                              \
    } while (0)
#define SAME_STR(a, b, f, what)                                                                    \
    if (strncmp((a)->f, (b)->f, sizeof (a)->f) != 0) DIFF("%s.%s", what, #f)
#define SAME_BITS(a, b, f, what)                                                                   \
    if (memcmp(&(a)->f, &(b)->f, sizeof (a)->f) != 0) DIFF("%s.%s", what, #f)

static bool same_array(const void *a, const void *b, size_t bytes) {
    if (bytes == 0) return true;
    if (a == NULL || b == NULL) return a == b;
    return memcmp(a, b, bytes) == 0;
}

static bool run_equal(const KvRun *a, const KvRun *b, int64_t i, char *why, size_t n) {
    char what[32];
    snprintf(what, sizeof what, "runs[%" PRId64 "]", i);
    SAME_STR(a, b, model, what);
    SAME_STR(a, b, scenario, what);
    SAME_STR(a, b, variant, what);
    SAME_STR(a, b, fault, what);
    SAME_STR(a, b, backend, what);
    SAME_STR(a, b, mode, what);
    SAME_STR(a, b, skip_reason, what);
    SAME_BITS(a, b, repeat, what);
    SAME_BITS(a, b, skipped, what);
    SAME_BITS(a, b, steps, what);
    SAME_BITS(a, b, batch, what);
    SAME_BITS(a, b, vocab, what);
    SAME_BITS(a, b, prompt_len, what);
    SAME_BITS(a, b, prefill_chunk, what);
    SAME_BITS(a, b, topk, what);
    SAME_BITS(a, b, n_probes, what);
    SAME_BITS(a, b, graphs_captured, what);
    SAME_BITS(a, b, replays_checked, what);
    SAME_BITS(a, b, replay_mismatch_step, what);
    SAME_BITS(a, b, seconds, what);
    if (a->skipped) return true;
    /* Sizes were compared above and are small enough here to multiply. */
    const size_t S = (size_t)a->steps, B = (size_t)a->batch, V = (size_t)a->vocab,
                 P = (size_t)a->prompt_len, NP = (size_t)a->n_probes, K = (size_t)a->topk;
    const struct {
        const char *name;
        const void *x, *y;
        size_t bytes;
    } arrays[] = {
        {"prompt", a->prompt, b->prompt, B * P * sizeof(int32_t)},
        {"prompt_real", a->prompt_real, b->prompt_real, B * P},
        {"tokens", a->tokens, b->tokens, S * B * sizeof(int32_t)},
        {"logits", a->logits, b->logits, K > 0 ? 0 : S * B * V * sizeof(float)},
        {"topk_ids", a->topk_ids, b->topk_ids, S * B * K * sizeof(int32_t)},
        {"topk_values", a->topk_values, b->topk_values, S * B * K * sizeof(float)},
        {"logits_hash", a->logits_hash, b->logits_hash, S * B * sizeof(uint64_t)},
        {"margins", a->margins, b->margins, S * B * sizeof(float)},
        {"probe_names", a->probe_names, b->probe_names, NP * KV_NAME_LEN},
        {"probe_hash", a->probe_hash, b->probe_hash, S * NP * B * sizeof(uint64_t)},
    };
    for (size_t k = 0; k < sizeof arrays / sizeof arrays[0]; k++) {
        if (!same_array(arrays[k].x, arrays[k].y, arrays[k].bytes)) {
            DIFF("%s.%s", what, arrays[k].name);
        }
    }
    return true;
}

bool kv_fuzz_report_equal(const KvReport *a, const KvReport *b, char *why, size_t n) {
    SAME_STR(a, b, tool_version, "/");
    SAME_STR(a, b, git_commit, "/");
    SAME_STR(a, b, host, "/");
    SAME_STR(a, b, device, "/");
    SAME_STR(a, b, math_mode, "/");
    SAME_STR(a, b, shard, "/");
    SAME_BITS(a, b, weight_seed, "/");
    SAME_BITS(a, b, prompt_seed, "/");
    SAME_BITS(a, b, model_hash, "/");
    if (a->n_tolerances != b->n_tolerances) DIFF("n_tolerances");
    if (a->n_runs != b->n_runs) DIFF("n_runs");
    if (a->n_comparisons != b->n_comparisons) DIFF("n_comparisons");
    for (int64_t t = 0; t < a->n_tolerances; t++) {
        char what[32];
        snprintf(what, sizeof what, "tolerances[%" PRId64 "]", t);
        SAME_STR(&a->tolerances[t], &b->tolerances[t], name, what);
        SAME_STR(&a->tolerances[t], &b->tolerances[t], reason, what);
        SAME_BITS(&a->tolerances[t], &b->tolerances[t], value, what);
    }
    for (int64_t i = 0; i < a->n_runs; i++) {
        if (!run_equal(&a->runs[i], &b->runs[i], i, why, n)) return false;
    }
    for (int64_t k = 0; k < a->n_comparisons; k++) {
        const KvComparison *x = &a->comparisons[k], *y = &b->comparisons[k];
        char what[32];
        snprintf(what, sizeof what, "comparisons[%" PRId64 "]", k);
        SAME_BITS(x, y, kind, what);
        SAME_BITS(x, y, run_a, what);
        SAME_BITS(x, y, run_b, what);
        SAME_BITS(x, y, verdict, what);
        SAME_STR(x, y, message, what);
        SAME_BITS(x, y, first_step, what);
        SAME_BITS(x, y, first_row, what);
        SAME_BITS(x, y, first_probe, what);
        SAME_BITS(x, y, near_ties, what);
        SAME_BITS(x, y, max_abs_err, what);
        SAME_BITS(x, y, max_rel_err, what);
        SAME_BITS(x, y, nmse, what);
        SAME_BITS(x, y, kl, what);
        SAME_BITS(x, y, top1_agreement, what);
    }
    return true;
}

/* ---- reading a report file and checking what comes back ---------------- */

/* What `kvrepro show` prints before the table (cmd_report.c). */
static void print_root(const KvReport *rep, const char *path, FILE *sink) {
    fprintf(sink, "report %s: kvrepro %s (commit %s), host %s\n", path, rep->tool_version,
            rep->git_commit, rep->host);
    fprintf(sink, "device: %s; math: %s; shard %s\n", rep->device, rep->math_mode, rep->shard);
    fprintf(sink, "seeds: weights %" PRIu64 ", prompts %" PRIu64 "; model fnv1a64 0x%016" PRIx64 "\n",
            rep->weight_seed, rep->prompt_seed, rep->model_hash);
    for (int64_t t = 0; t < rep->n_tolerances; t++) {
        fprintf(sink, "tolerance %s = %g (%s)\n", rep->tolerances[t].name,
                rep->tolerances[t].value, rep->tolerances[t].reason);
    }
}

#define TERMINATED(s) (memchr((s), '\0', sizeof(s)) != NULL)

/* Another engine's run (docs/SCHEMA.md): a backend not kvrepro's, or an
 * engine recorded. Listed here, not taken from reports/, so the check is
 * independent of the reader it checks. */
static bool is_foreign(const KvRun *r) {
    return r->engine[0] != '\0' || (strcmp(r->backend, "cpu") != 0 && strcmp(r->backend, "cuda") != 0);
}

/* A foreign run's skip reason: empty when it ran; when skipped, not empty,
 * and one that says it failed carries the marker "failed: " and a text. */
static void check_foreign_reason(const KvRun *r, int64_t i) {
    if (!is_foreign(r)) return;
    const char *s = r->skip_reason;
    KV_FUZZ_CHECK(r->skipped || s[0] == '\0', "runs[%" PRId64 "]: a reason on a run that ran", i);
    if (!r->skipped) return;
    KV_FUZZ_CHECK(s[0] != '\0', "runs[%" PRId64 "]: skipped without a reason", i);
    while (*s == ' ' || *s == '\t' || *s == '\n' || *s == '\r') s++;
    const bool says_failed = (s[0] | 0x20) == 'f' && (s[1] | 0x20) == 'a' &&
                             (s[2] | 0x20) == 'i' && (s[3] | 0x20) == 'l';
    KV_FUZZ_CHECK(!says_failed || (strncmp(r->skip_reason, "failed: ", 8) == 0 &&
                                   r->skip_reason[8] != '\0'),
                  "runs[%" PRId64 "]: a failure without the marker: '%.60s'", i, r->skip_reason);
}

/* A run that ran: top-k rows of distinct ids within the vocabulary; a
 * foreign run's margins >= 0, or NaN beside a non-finite stored logit. */
static void check_run_values(const KvRun *r, int64_t i) {
    const int64_t rows = r->steps * r->batch, K = r->topk;
    for (int64_t w = 0; w < rows && K > 0; w++) {
        const int32_t *ids = r->topk_ids + w * K;
        for (int64_t a = 0; a < K; a++) {
            KV_FUZZ_CHECK(ids[a] >= 0 && ids[a] < r->vocab,
                          "runs[%" PRId64 "]: top-k id %" PRId32 " outside the vocabulary", i,
                          ids[a]);
            for (int64_t b = 0; b < a; b++) {
                KV_FUZZ_CHECK(ids[a] != ids[b], "runs[%" PRId64 "]: top-k id %" PRId32 " twice",
                              i, ids[a]);
            }
        }
    }
    if (!is_foreign(r)) return;
    const int64_t width = K > 0 ? K : r->vocab;
    const float *vals = K > 0 ? r->topk_values : r->logits;
    for (int64_t w = 0; w < rows; w++) {
        const float m = r->margins[w];
        if (m >= 0.0f) continue;
        bool nonfinite = false;
        for (int64_t v = 0; v < width && m != m; v++) {
            const float x = vals[w * width + v];
            nonfinite = nonfinite || x != x || x - x != 0.0f;
        }
        KV_FUZZ_CHECK(m != m && nonfinite,
                      "runs[%" PRId64 "]: margin %g at row %" PRId64 " (negative, or NaN beside "
                      "finite logits)",
                      i, (double)m, w);
    }
}

static void check_report(const KvReport *rep) {
    KV_FUZZ_CHECK(TERMINATED(rep->tool_version) && TERMINATED(rep->git_commit) &&
                      TERMINATED(rep->host) && TERMINATED(rep->device) &&
                      TERMINATED(rep->math_mode) && TERMINATED(rep->shard),
                  "a root string is not terminated");
    KV_FUZZ_CHECK(rep->n_tolerances >= 0 && rep->n_runs >= 0 && rep->n_comparisons >= 0,
                  "a negative count");
    KV_FUZZ_CHECK((rep->n_tolerances == 0 || rep->tolerances != NULL) &&
                      (rep->n_runs == 0 || rep->runs != NULL) &&
                      (rep->n_comparisons == 0 || rep->comparisons != NULL),
                  "a count without its array");
    for (int64_t t = 0; t < rep->n_tolerances; t++) {
        KV_FUZZ_CHECK(TERMINATED(rep->tolerances[t].name) && TERMINATED(rep->tolerances[t].reason),
                      "tolerances[%" PRId64 "]: a string is not terminated", t);
    }
    for (int64_t i = 0; i < rep->n_runs; i++) {
        const KvRun *r = &rep->runs[i];
        KV_FUZZ_CHECK(TERMINATED(r->model) && TERMINATED(r->scenario) && TERMINATED(r->variant) &&
                          TERMINATED(r->fault) && TERMINATED(r->backend) && TERMINATED(r->mode) &&
                          TERMINATED(r->skip_reason),
                      "runs[%" PRId64 "]: a string is not terminated", i);
        KV_FUZZ_CHECK(r->steps >= 0 && r->batch >= 0 && r->vocab >= 0 && r->prompt_len >= 0 &&
                          r->n_probes >= 0 && r->prefill_chunk >= 0,
                      "runs[%" PRId64 "]: a negative size", i);
        KV_FUZZ_CHECK(r->topk >= 0 && r->topk <= r->vocab,
                      "runs[%" PRId64 "]: topk %" PRId32 " outside 0..vocab (%" PRId64 ")", i,
                      r->topk, r->vocab);
        KV_FUZZ_CHECK(r->repeat >= 0 && r->graphs_captured >= 0 && r->replays_checked >= 0 &&
                          r->replay_mismatch_step >= -1,
                      "runs[%" PRId64 "]: a negative count", i);
        check_foreign_reason(r, i);
        if (r->skipped) continue;
        check_run_values(r, i);
        bool any = r->steps > 0 && r->batch > 0;
        KV_FUZZ_CHECK(!any || (r->tokens != NULL && r->logits_hash != NULL && r->margins != NULL),
                      "runs[%" PRId64 "]: a run that ran lacks its arrays", i);
        KV_FUZZ_CHECK(!any || r->vocab == 0 || (r->topk > 0 ? r->topk_ids != NULL : r->logits != NULL),
                      "runs[%" PRId64 "]: no logits", i);
        for (int64_t p = 0; p < r->n_probes; p++) {
            KV_FUZZ_CHECK(r->probe_names != NULL && TERMINATED(r->probe_names[p]),
                          "runs[%" PRId64 "].probe_names[%" PRId64 "] is not terminated", i, p);
        }
    }
    for (int64_t k = 0; k < rep->n_comparisons; k++) {
        const KvComparison *c = &rep->comparisons[k];
        KV_FUZZ_CHECK(TERMINATED(c->message), "comparisons[%" PRId64 "]: message", k);
        KV_FUZZ_CHECK(c->run_a >= 0 && c->run_a < rep->n_runs && c->run_b >= 0 &&
                          c->run_b < rep->n_runs,
                      "comparisons[%" PRId64 "] names runs %" PRId64 " and %" PRId64 " of %" PRId64,
                      k, c->run_a, c->run_b, rep->n_runs);
    }
}

/* HDF5 1.10 cannot count dataspace or datatype identifiers from outside
 * (H5Inmembers refuses library types); what it can count is every object
 * still open in any file: none may be, once the reader has returned. */
static void check_ids(const char *when) {
    ssize_t open_objs = H5Fget_obj_count((hid_t)H5F_OBJ_ALL, H5F_OBJ_ALL);
    KV_FUZZ_CHECK(open_objs == 0, "%s: %zd HDF5 files or objects left open", when, open_objs);
}

/* Attribute name of obj read as int64 (HDF5 converts any integer type);
 * false when it is absent or cannot be read so. */
static bool attr_i64(hid_t obj, const char *name, int64_t *v) {
    if (H5Aexists(obj, name) <= 0) return false;
    hid_t a = H5Aopen(obj, name, H5P_DEFAULT);
    bool ok = a >= 0 && H5Aread(a, H5T_NATIVE_INT64, v) >= 0;
    if (a >= 0) H5Aclose(a);
    return ok;
}

/* The reader keeps what the file says: every integer attribute of a run,
 * read again straight from the file, equals the field it was read into
 * ("every field round-trips exactly", report_h5.h). A narrowing the range
 * checks let through shows here and nowhere else: the round trip is
 * self-consistent after it. */
static void check_fidelity(const char *path, const KvReport *rep) {
    hid_t file = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    KV_FUZZ_CHECK(file >= 0, "a report that read cannot be opened again");
    for (int64_t i = 0; i < rep->n_runs; i++) {
        const KvRun *r = &rep->runs[i];
        char name[32];
        snprintf(name, sizeof name, "/runs/%04" PRId64, i);
        hid_t g = H5Gopen2(file, name, H5P_DEFAULT);
        KV_FUZZ_CHECK(g >= 0, "%s: a run that read cannot be opened again", name);
        const struct {
            const char *attr;
            int64_t field;
            bool optional; /* absent in older files: read as 0 */
        } fields[] = {
            {"repeat", r->repeat, false},
            {"steps", r->steps, false},
            {"batch", r->batch, false},
            {"vocab", r->vocab, false},
            {"prompt_len", r->prompt_len, false},
            {"n_probes", r->n_probes, false},
            {"graphs_captured", r->graphs_captured, false},
            {"replays_checked", r->replays_checked, false},
            {"replay_mismatch_step", r->replay_mismatch_step, false},
            {"topk", r->topk, true},
            {"prefill_chunk", r->prefill_chunk, true},
        };
        for (size_t k = 0; k < sizeof fields / sizeof fields[0]; k++) {
            int64_t v = 0;
            bool have = attr_i64(g, fields[k].attr, &v);
            KV_FUZZ_CHECK(have || fields[k].optional, "%s: attribute %s read but not readable",
                          name, fields[k].attr);
            KV_FUZZ_CHECK(v == fields[k].field,
                          "%s: attribute %s: the file says %" PRId64 ", the report %" PRId64,
                          name, fields[k].attr, v, fields[k].field);
        }
        H5Gclose(g);
    }
    KV_FUZZ_CHECK(H5Fclose(file) >= 0, "cannot close a report opened again");
}

void kv_fuzz_check_report_file(const char *path, const char *copy, FILE *sink) {
    KvReport rep;
    KvError err = {{0}};
    KvStatus st = kv_report_read_h5(path, &rep, &err);
    kv_fuzz_check_status(st, &err, "kv_report_read_h5");
    check_ids("after kv_report_read_h5");
    if (st != KV_OK) {
        KV_FUZZ_CHECK(kv_fuzz_all_zero(&rep, sizeof rep), "a failed read left *out set");
        return;
    }
    check_report(&rep);
    check_fidelity(path, &rep);
    print_root(&rep, path, sink);
    KV_FUZZ_CHECK(kv_report_print_summary(&rep, sink) == KV_OK, "kv_report_print_summary failed");

    KvReport back;
    st = kv_report_write_h5(&rep, copy, &err);
    KV_FUZZ_CHECK(st == KV_OK, "a report that reads cannot be written back: %s", err.msg);
    st = kv_report_read_h5(copy, &back, &err);
    KV_FUZZ_CHECK(st == KV_OK, "a rewritten report does not read: %s", err.msg);
    char why[160];
    KV_FUZZ_CHECK(kv_fuzz_report_equal(&rep, &back, why, sizeof why),
                  "a rewritten report reads back different: %s", why);
    kv_report_free(&back);
    kv_report_free(&rep);
    check_ids("after the round trip");
}

void kv_fuzz_report_setup(void) {
    /* No limits on HDF5's free lists: each file open allocates a metadata
     * cache of over 512 KB, which the default limits hand back to malloc at
     * close; under ASan that is a fresh mmap and page faults every time
     * (3x slower). Kept blocks stay reachable, so LeakSanitizer is not
     * misled; what HDF5 loses for good on a damaged file is its own leak
     * (lsan.supp). */
    if (H5set_free_list_limits(-1, -1, -1, -1, -1, -1) < 0) {
        fprintf(stderr, "kvrepro fuzz: H5set_free_list_limits failed\n");
        abort();
    }
}
