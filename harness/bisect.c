/* bisect.c: first divergence from probe hashes, reruns with full dumps
 * (bisect.h). */
#include "bisect.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cache.h"
#include "fault.h"
#include "forward.h"

KvStatus kv_bisect_find(const KvRun *a, const KvRun *b, KvBisectPoint *out, KvError *err) {
    *out = (KvBisectPoint){-1, -1, -1, -1, false};
    if (a->skipped || b->skipped) {
        return kv_error_set(err, KV_ERR_INPUT, "run %s was skipped: nothing recorded to bisect",
                            a->skipped ? "A" : "B");
    }
    if (a->steps != b->steps || a->batch != b->batch) {
        return kv_error_set(err, KV_ERR_INPUT,
                            "the runs cannot be compared: steps %lld vs %lld, batch %lld vs %lld",
                            (long long)a->steps, (long long)b->steps, (long long)a->batch,
                            (long long)b->batch);
    }
    const bool probes = a->n_probes > 0 && b->n_probes > 0 && a->probe_hash != NULL &&
                        b->probe_hash != NULL;
    if (probes && a->n_probes != b->n_probes) {
        return kv_error_set(err, KV_ERR_INPUT, "the runs cannot be compared: n_probes %lld vs %lld",
                            (long long)a->n_probes, (long long)b->n_probes);
    }
    for (int64_t p = 0; probes && p < a->n_probes; p++) {
        if (strncmp(a->probe_names[p], b->probe_names[p], KV_NAME_LEN) != 0) {
            return kv_error_set(err, KV_ERR_INPUT,
                                "the runs cannot be compared: probe %lld is '%.64s' vs '%.64s'",
                                (long long)p, a->probe_names[p], b->probe_names[p]);
        }
    }
    const int64_t B = a->batch, NP = a->n_probes;
    for (int64_t s = 0; s < a->steps; s++) {
        if (probes) {
            for (int64_t p = 0; p < NP; p++) {
                for (int64_t r = 0; r < B; r++) {
                    const int64_t i = (s * NP + p) * B + r;
                    if (a->probe_hash[i] == b->probe_hash[i]) continue;
                    *out = (KvBisectPoint){s, r, p, kv_probe_layer(NP, p), false};
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

KvStatus kv_bisect_rerun(const KvModel *m, const KvRun *run, int64_t step, KvDecodeResult *out,
                         KvError *err) {
    memset(out, 0, sizeof *out);
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
    if (strncmp(run->backend, "cpu", sizeof run->backend) != 0) {
        return kv_error_set(err, KV_ERR_INPUT, "--rerun: backend '%.16s' cannot be re-run here "
                            "(only cpu runs)", run->backend);
    }
    unsigned faults = 0;
    KvStatus st = bisect_parse_faults(run, &faults, err);
    if (st != KV_OK) return st;
    if (run->vocab != m->config.vocab_size) {
        return kv_error_set(err, KV_ERR_INPUT, "run attribute 'vocab': %lld, but the model has %lld",
                            (long long)run->vocab, (long long)m->config.vocab_size);
    }
    if (step < 0 || step >= run->steps) {
        return kv_error_set(err, KV_ERR_INPUT, "step %lld outside the run's %lld steps",
                            (long long)step, (long long)run->steps);
    }
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
    return kv_decode_greedy(m, &spec, out, err);
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
