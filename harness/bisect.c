/* bisect.c: first divergence from probe hashes, reruns with full dumps
 * (bisect.h). */
#include "bisect.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends.h"
#include "cache.h"
#include "cache_registry.h"
#include "fault.h"
#include "forward.h"
#include "prng.h"
#include "script.h"

/* "'name'" for probe p of run r, or "(none)" past its last probe. */
static const char *bisect_probe_quoted(const KvRun *r, int64_t p, char *buf, size_t n) {
    if (p >= r->n_probes) return "(none)";
    snprintf(buf, n, "'%.*s'", KV_NAME_LEN, r->probe_names[p]);
    return buf;
}

/* The first index at which run r's probe names differ from the forward's
 * for config c (the count included: an index one past the shorter list),
 * with the expected name (or "") in expected; -1 when they are the same. */
static int64_t bisect_layout_mismatch(const KvRun *r, const KvConfig *c,
                                      char expected[KV_NAME_LEN]) {
    const int64_t n = kv_probe_count(c);
    const int64_t common = r->n_probes < n ? r->n_probes : n;
    expected[0] = '\0';
    for (int64_t p = 0; p < common; p++) {
        kv_probe_name(c, p, expected, KV_NAME_LEN);
        if (strncmp(expected, r->probe_names[p], KV_NAME_LEN) != 0) return p;
    }
    if (r->n_probes == n) return -1;
    expected[0] = '\0';
    if (common < n) kv_probe_name(c, common, expected, KV_NAME_LEN);
    return common;
}

/* True when r's probes are the forward's layout for some layer count, so
 * kv_probe_layer and kv_probe_item describe them. */
static bool bisect_forward_layout(const KvRun *r) {
    const int64_t NP = r->n_probes;
    if (NP < 3 || (NP - 3) % KV_PROBE_PER_LAYER != 0) return false;
    KvConfig c;
    memset(&c, 0, sizeof c);
    c.num_layers = (NP - 3) / KV_PROBE_PER_LAYER; /* the layout depends on nothing else */
    char expected[KV_NAME_LEN];
    return bisect_layout_mismatch(r, &c, expected) < 0;
}

/* Every recorded token of r in [0, vocab); whose: the vocabulary's owner,
 * for messages. */
static KvStatus bisect_check_tokens(const KvRun *r, const char *name, int64_t vocab,
                                    const char *whose, KvError *err) {
    if (r->steps * r->batch > 0 && r->tokens == NULL) {
        return kv_error_set(err, KV_ERR_INPUT, "%s: tokens: expected (%lld, %lld), found none",
                            name, (long long)r->steps, (long long)r->batch);
    }
    for (int64_t i = 0; i < r->steps * r->batch; i++) {
        if (r->tokens[i] >= 0 && r->tokens[i] < vocab) continue;
        return kv_error_set(err, KV_ERR_INPUT, "%s: tokens[step %lld, row %lld]: expected a token "
                            "id in [0, %lld), the vocabulary of %s, found %d", name,
                            (long long)(i / r->batch), (long long)(i % r->batch), (long long)vocab,
                            whose, r->tokens[i]);
    }
    return KV_OK;
}

KvStatus kv_bisect_check_pair(const KvRun *a, const char *name_a, const KvRun *b,
                              const char *name_b, KvError *err) {
    if (a->skipped || b->skipped) {
        return kv_error_set(err, KV_ERR_INPUT, "%s was skipped: nothing recorded to bisect",
                            a->skipped ? name_a : name_b);
    }
    if (strncmp(a->model, b->model, KV_NAME_LEN) != 0) {
        return kv_error_set(err, KV_ERR_INPUT, "%s and %s cannot be compared: model '%.64s' vs "
                            "'%.64s'", name_a, name_b, a->model, b->model);
    }
    const struct {
        const char *field;
        int64_t a, b;
    } sizes[] = {
        {"steps", a->steps, b->steps},
        {"batch", a->batch, b->batch},
        {"vocab", a->vocab, b->vocab},
        {"prompt_len", a->prompt_len, b->prompt_len},
    };
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        if (sizes[k].a == sizes[k].b) continue;
        return kv_error_set(err, KV_ERR_INPUT, "%s and %s cannot be compared: %s %lld vs %lld",
                            name_a, name_b, sizes[k].field, (long long)sizes[k].a,
                            (long long)sizes[k].b);
    }
    /* A probe index is only meaningful if it names the same probe in both. */
    const int64_t common = a->n_probes < b->n_probes ? a->n_probes : b->n_probes;
    int64_t p = 0;
    while (p < common && strncmp(a->probe_names[p], b->probe_names[p], KV_NAME_LEN) == 0) p++;
    if (p < common || a->n_probes != b->n_probes) {
        char qa[KV_NAME_LEN + 3], qb[KV_NAME_LEN + 3];
        return kv_error_set(err, KV_ERR_INPUT, "%s and %s cannot be compared: the probe layouts "
                            "differ (%lld vs %lld probes; probe %lld: %s vs %s)", name_a, name_b,
                            (long long)a->n_probes, (long long)b->n_probes, (long long)p,
                            bisect_probe_quoted(a, p, qa, sizeof qa),
                            bisect_probe_quoted(b, p, qb, sizeof qb));
    }
    KvStatus st = bisect_check_tokens(a, name_a, a->vocab, "the run", err);
    if (st == KV_OK) st = bisect_check_tokens(b, name_b, b->vocab, "the run", err);
    return st;
}

KvStatus kv_bisect_check_model(const KvRun *run, const char *name, const KvModel *m,
                               const char *model_name, KvError *err) {
    const int64_t V = m->config.vocab_size;
    if (run->skipped) {
        return kv_error_set(err, KV_ERR_INPUT, "%s was skipped: nothing recorded to re-run", name);
    }
    if (run->vocab != V) {
        return kv_error_set(err, KV_ERR_INPUT, "%s: vocab %lld, %s has %lld; the report does not "
                            "match this model", name, (long long)run->vocab, model_name,
                            (long long)V);
    }
    for (int64_t i = 0; i < run->batch * run->prompt_len; i++) {
        if (run->prompt[i] >= 0 && run->prompt[i] < V) continue;
        return kv_error_set(err, KV_ERR_INPUT, "%s: prompt[row %lld, position %lld]: expected a "
                            "token id in [0, %lld), the vocabulary of %s, found %d; the report "
                            "does not match this model", name, (long long)(i / run->prompt_len),
                            (long long)(i % run->prompt_len), (long long)V, model_name,
                            run->prompt[i]);
    }
    KvStatus st = bisect_check_tokens(run, name, V, model_name, err);
    if (st != KV_OK) return st;
    /* The rerun's probes are indexed with the recording's indices: the
     * layouts must be the same, name for name. */
    char expected[KV_NAME_LEN], quoted[KV_NAME_LEN + 3];
    const int64_t p = bisect_layout_mismatch(run, &m->config, expected);
    if (p >= 0) {
        char model_q[KV_NAME_LEN + 3] = "(none)";
        if (expected[0] != '\0') snprintf(model_q, sizeof model_q, "'%s'", expected);
        return kv_error_set(err, KV_ERR_INPUT, "%s records %lld probes, %s has %lld (probe %lld: "
                            "recorded %s, model %s); the report does not match this model",
                            name, (long long)run->n_probes, model_name,
                            (long long)kv_probe_count(&m->config), (long long)p,
                            bisect_probe_quoted(run, p, quoted, sizeof quoted), model_q);
    }
    return KV_OK;
}

KvStatus kv_bisect_check_rerunnable(const KvRun *run, const char *name, KvError *err) {
    char backend[sizeof run->backend + 1];
    memcpy(backend, run->backend, sizeof run->backend);
    backend[sizeof run->backend] = '\0';
    if (kv_backend_find(backend) != NULL && run->engine[0] == '\0') return KV_OK;
    char engine[KV_ENGINE_LEN + 16] = "";
    if (run->engine[0] != '\0') {
        snprintf(engine, sizeof engine, ", engine '%.*s'", KV_ENGINE_LEN - 1, run->engine);
    }
    return kv_error_set(err, KV_ERR_INPUT, "--rerun: %s was recorded by another engine (backend "
                        "'%s'%s): kvrepro cannot re-execute it; bisect without --rerun names "
                        "the first differing probe from the recorded hashes", name, backend,
                        engine);
}

KvStatus kv_bisect_find(const KvRun *a, const KvRun *b, KvBisectPoint *out, KvError *err) {
    *out = (KvBisectPoint){-1, -1, -1, -1, false};
    KvStatus st = kv_bisect_check_pair(a, "run A", b, "run B", err);
    if (st != KV_OK) return st;
    const bool probes = a->n_probes > 0 && a->probe_hash != NULL && b->probe_hash != NULL;
    /* Layers are named only for the forward's layout: another engine's
     * probes say nothing about kvrepro's layer numbering. */
    const bool layers = probes && bisect_forward_layout(a);
    const int64_t B = a->batch, NP = a->n_probes;
    for (int64_t s = 0; s < a->steps; s++) {
        if (probes) {
            for (int64_t p = 0; p < NP; p++) {
                for (int64_t r = 0; r < B; r++) {
                    const int64_t i = (s * NP + p) * B + r;
                    if (a->probe_hash[i] == b->probe_hash[i]) continue;
                    *out = (KvBisectPoint){s, r, p, layers ? kv_probe_layer(NP, p) : -1, false};
                    return KV_OK;
                }
            }
        }
        /* Probes agree (or none): the chosen tokens and logits still may not. */
        for (int64_t r = 0; r < B; r++) {
            const int64_t i = s * B + r;
            const bool logits = a->logits_hash != NULL && b->logits_hash != NULL &&
                                a->logits_hash[i] != b->logits_hash[i];
            if (a->tokens[i] != b->tokens[i] || logits) {
                *out = (KvBisectPoint){s, r, -1, -1, true};
                return KV_OK;
            }
        }
    }
    return KV_OK;
}

int kv_bisect_inputs(int64_t n_probes, int64_t p, int64_t inputs[2]) {
    if (p <= 0 || p >= n_probes) return 0;
    if (p == n_probes - 1) {
        inputs[0] = n_probes - 2; /* logits <- final_norm */
        return 1;
    }
    if (p == n_probes - 2) {
        inputs[0] = n_probes - 3; /* final_norm <- last residual */
        return 1;
    }
    const int64_t l = kv_probe_layer(n_probes, p);
    const int64_t base = p - kv_probe_item(n_probes, p); /* layer l's q */
    const int64_t layer_in = l == 0 ? 0 : base - 1;       /* embed or previous residual */
    switch (kv_probe_item(n_probes, p)) {
    case KV_PROBE_Q: case KV_PROBE_K: case KV_PROBE_V:
        inputs[0] = layer_in;
        return 1;
    case KV_PROBE_CACHE: /* <- k, v */
        inputs[0] = base + KV_PROBE_K;
        inputs[1] = base + KV_PROBE_V;
        return 2;
    case KV_PROBE_ATTN: /* <- q, cache */
        inputs[0] = base + KV_PROBE_Q;
        inputs[1] = base + KV_PROBE_CACHE;
        return 2;
    case KV_PROBE_MLP: /* <- attn */
        inputs[0] = base + KV_PROBE_ATTN;
        return 1;
    default: /* residual <- layer input, mlp */
        inputs[0] = layer_in;
        inputs[1] = base + KV_PROBE_MLP;
        return 2;
    }
}

/* The fault bits named in a run's comma-separated fault field. */
static KvStatus bisect_parse_faults(const KvRun *run, unsigned *bits, KvError *err) {
    char names[KV_NAME_LEN + 1];
    memcpy(names, run->fault, KV_NAME_LEN);
    names[KV_NAME_LEN] = '\0';
    *bits = 0;
    char *save = NULL;
    for (char *tok = strtok_r(names, ",", &save); tok != NULL; tok = strtok_r(NULL, ",", &save)) {
        const KvFaultInfo *f = kv_fault_find(tok);
        if (f == NULL) {
            return kv_error_set(err, KV_ERR_INPUT, "run attribute 'fault': unknown fault '%s'",
                                tok);
        }
        *bits |= f->bit;
    }
    return KV_OK;
}

/* Where the decode driver's per-step callback writes each step's digests. */
typedef struct {
    uint64_t *digest;   /* (steps, n_probes, batch) */
    int64_t steps, n_probes, batch;
    int64_t filled;     /* steps digested so far, in order */
    bool bad;           /* a step out of order or a dump of another shape */
} BisectDigests;

/* on_step_dump: the FNV-1a 64 of each probe row's length and floats. The
 * walk back keeps 8 bytes per (step, probe, row) instead of every step's
 * tensors (a checkpoint's cache probes alone are steps x layers x window x
 * 2 x kv_dim floats); a collision would need 2^-64 luck, and the point it
 * finds is then compared element by element from the dumps themselves. */
static void bisect_digest_step(void *ctx, int64_t step, const KvProbeDump *d) {
    BisectDigests *g = ctx;
    if (g->bad || step != g->filled || step >= g->steps || d->n_probes != g->n_probes ||
        d->batch != g->batch) {
        g->bad = true;
        return;
    }
    for (int64_t p = 0; p < g->n_probes; p++) {
        const int64_t len = d->len[p];
        for (int64_t r = 0; r < g->batch; r++) {
            uint64_t h = kv_fnv1a(KV_FNV_OFFSET, &len, sizeof len);
            h = kv_fnv1a(h, d->data[p] + r * len, (size_t)len * sizeof(float));
            g->digest[(step * g->n_probes + p) * g->batch + r] = h;
        }
    }
    g->filled++;
}

KvStatus kv_bisect_rerun(const KvModel *m, const KvRun *run, int64_t step, KvDecodeResult *out,
                         KvError *err) {
    return kv_bisect_rerun_digests(m, run, step, out, NULL, err);
}

KvStatus kv_bisect_rerun_digests(const KvModel *m, const KvRun *run, int64_t step,
                                 KvDecodeResult *out, uint64_t **digest, KvError *err) {
    memset(out, 0, sizeof *out);
    if (digest != NULL) *digest = NULL;
    KvStatus st = kv_bisect_check_model(run, "the run", m, "the model", err);
    if (st != KV_OK) return st;
    const KvCacheOps *variant = NULL;
    if (strncmp(run->variant, "reference", KV_NAME_LEN) != 0) {
        char name[KV_NAME_LEN + 1];
        memcpy(name, run->variant, KV_NAME_LEN);
        name[KV_NAME_LEN] = '\0';
        variant = kv_cache_find(name);
        if (variant == NULL) {
            return kv_error_set(err, KV_ERR_INPUT, "run attribute 'variant': unknown variant '%s'",
                                name);
        }
    }
    char backend[sizeof run->backend + 1];
    memcpy(backend, run->backend, sizeof run->backend);
    backend[sizeof run->backend] = '\0';
    const KvBackendOps *ops = kv_backend_find(backend);
    if (ops == NULL) {
        return kv_error_set(err, KV_ERR_INPUT, "run attribute 'backend': unknown backend '%s'",
                            backend);
    }
    unsigned faults = 0;
    st = bisect_parse_faults(run, &faults, err);
    if (st != KV_OK) return st;
    if (step < 0 || step >= run->steps) {
        return kv_error_set(err, KV_ERR_INPUT, "step %lld outside the run's %lld steps",
                            (long long)step, (long long)run->steps);
    }
    KvScript script = {
        .save_after = run->save_after,
        .switch_step = run->switch_step,
        .suffix_len = run->suffix_len,
        .suffix = run->suffix,
        .shift_step = run->shift_step,
        .shift_keep = run->shift_keep,
        .shift_drop = run->shift_drop,
    };
    KvDecodeSpec spec = {
        .batch = run->batch,
        .prompt_len = run->prompt_len,
        .prompt = run->prompt,
        .prompt_real = run->prompt_real,
        .new_tokens = step + 1,
        .prefill_chunk = run->prefill_chunk,
        .variant = variant,
        .mode = strncmp(run->mode, "graph", sizeof run->mode) == 0 ? KV_MODE_GRAPH : KV_MODE_EAGER,
        .faults = faults,
        .record_probes = true,
        .dump_probes = true,
    };
    BisectDigests dg = {NULL, step + 1, run->n_probes, run->batch, 0, false};
    if (digest != NULL && kv_backend_keeps_dumps(ops)) {
        dg.digest = malloc((size_t)(dg.steps * dg.n_probes * dg.batch) * sizeof *dg.digest);
        if (dg.digest == NULL) {
            return kv_error_set(err, KV_ERR_INTERNAL, "rerun: out of memory for %lld steps x "
                                "%lld probes x %lld rows of digests", (long long)dg.steps,
                                (long long)dg.n_probes, (long long)dg.batch);
        }
        spec.on_step_dump = bisect_digest_step;
        spec.on_step_dump_ctx = &dg;
    }
    st = kv_script_bind(&script, m, &spec, err);
    if (st == KV_OK) st = kv_decode_run(ops, m, &spec, out, NULL, err);
    if (st == KV_SKIP) {
        free(dg.digest);
        return kv_error_set(err, KV_ERR_INPUT, "--rerun: the %s backend cannot run here: %s",
                            ops->name, err->msg);
    }
    if (st != KV_OK) {
        free(dg.digest);
        return st;
    }
    /* Callers index the rerun with the recording's indices. A backend that
     * keeps no dumps (take_dump NULL) gives the hashes alone. */
    const bool dumps = kv_backend_keeps_dumps(ops);
    if (out->steps != step + 1 || out->batch != run->batch || out->n_probes != run->n_probes ||
        out->probe_hash == NULL ||
        (dumps && (out->dump.data == NULL || out->dump.n_probes != run->n_probes))) {
        st = kv_error_set(err, KV_ERR_INTERNAL, "rerun: expected %lld steps x %lld rows x %lld "
                          "probes with dumps, found %lld x %lld x %lld%s", (long long)(step + 1),
                          (long long)run->batch, (long long)run->n_probes, (long long)out->steps,
                          (long long)out->batch, (long long)out->n_probes,
                          out->dump.data == NULL ? " without dumps" : "");
    } else if (dg.digest != NULL && (dg.bad || dg.filled != dg.steps)) {
        st = kv_error_set(err, KV_ERR_INTERNAL, "rerun: expected full probe values of %lld steps "
                          "x %lld probes x %lld rows, digested %lld steps%s", (long long)dg.steps,
                          (long long)dg.n_probes, (long long)dg.batch, (long long)dg.filled,
                          dg.bad ? " (a step out of order or a dump of another shape)" : "");
    }
    if (st != KV_OK) {
        kv_decode_result_free(out);
        free(dg.digest);
        return st;
    }
    if (digest != NULL) *digest = dg.digest;
    return KV_OK;
}

void kv_bisect_walk_back(const uint64_t *da, const uint64_t *db, int64_t n_probes, int64_t batch,
                         const KvBisectPoint *named, KvBisectPoint *out) {
    *out = (KvBisectPoint){-1, -1, -1, -1, false};
    for (int64_t s = 0; s <= named->step; s++) {
        const int64_t last = s < named->step ? n_probes - 1 : named->probe;
        for (int64_t p = 0; p <= last; p++) {
            /* At the named probe itself, rows up to the named one: the walk
             * only ever goes back. */
            const int64_t rows = s == named->step && p == last ? named->row + 1 : batch;
            for (int64_t r = 0; r < rows; r++) {
                const int64_t i = (s * n_probes + p) * batch + r;
                if (da[i] == db[i]) continue;
                *out = (KvBisectPoint){s, r, p, kv_probe_layer(n_probes, p), false};
                return;
            }
        }
    }
}

/* Float bits as integers ordered like the floats (-0 and +0 both 0). */
static int64_t bisect_ordered(float f) {
    int32_t i;
    memcpy(&i, &f, sizeof i);
    return i < 0 ? (int64_t)INT32_MIN - (int64_t)i : (int64_t)i;
}

void kv_bisect_diff(const float *a, int64_t len_a, const float *b, int64_t len_b, int64_t batch,
                    int64_t row, KvBisectDiff *out) {
    *out = (KvBisectDiff){.len = len_a, .first_index = -1, .ulp = -1};
    if (len_a != len_b) {
        out->shape_differs = true;
        out->differs = true;
        return;
    }
    for (int64_t r = 0; r < batch; r++) {
        for (int64_t i = 0; i < len_a; i++) {
            const float x = a[r * len_a + i], y = b[r * len_a + i];
            if (memcmp(&x, &y, sizeof x) == 0) continue;
            out->differs = true;
            const bool nan_x = isnan(x), nan_y = isnan(y);
            const double d = nan_x && nan_y ? 0.0 : nan_x || nan_y ? INFINITY
                                                                   : fabs((double)x - (double)y);
            if (d > out->max_abs_diff) out->max_abs_diff = d;
            if (r == row && out->first_index < 0) {
                out->first_index = i;
                out->value_a = x;
                out->value_b = y;
                if (!nan_x && !nan_y) {
                    const int64_t u = bisect_ordered(x) - bisect_ordered(y);
                    out->ulp = u < 0 ? -u : u;
                }
            }
        }
    }
}
