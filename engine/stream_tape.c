/* stream_tape.c: the long prefill and its cuts (stream_tape.h). */
#include "stream_tape.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_state.h"
#include "kvmath.h"

void kv_stream_tape_free(KvStreamTape *t) {
    if (t == NULL) return;
    free(t->tokens);
    free(t->k);
    free(t->v);
    free(t->cut_hash);
    free(t->cut_logits);
    memset(t, 0, sizeof *t);
}

static bool all_finite(const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(x[i])) return false;
    }
    return true;
}

KvStatus kv_stream_tape_record(const KvModel *m, const int32_t *tokens, int64_t n,
                               const int64_t *cut, int64_t n_cut,
                               void (*on_layer)(void *ctx, int64_t layer), void *ctx,
                               KvStreamTape *t, KvError *err) {
    const KvConfig *c = &m->config;
    memset(t, 0, sizeof *t);
    if (n_cut < 1 || n_cut > KV_PROBE_CUT_MAX) {
        return kv_error_set(err, KV_ERR_INTERNAL, "stream tape: %lld cuts (1..%d)",
                            (long long)n_cut, KV_PROBE_CUT_MAX);
    }
    for (int64_t j = 0; j < n_cut; j++) {
        if (cut[j] < 1 || cut[j] > n || (j > 0 && cut[j] <= cut[j - 1])) {
            return kv_error_set(err, KV_ERR_INTERNAL, "stream tape: cut %lld of %lld tokens "
                                "is not ascending in 1..%lld", (long long)j,
                                (long long)cut[j], (long long)n);
        }
    }
    const int64_t kv_dim = c->num_kv_heads * c->head_dim, L = c->num_layers;
    const int64_t V = c->vocab_size, H = c->hidden_size;
    KvStatus st = KV_OK;
    KvCpuState cs;
    bool cs_init = false;
    uint8_t *real = malloc((size_t)n);            /* (n) */
    float *cut_x = malloc((size_t)(n_cut * H) * sizeof *cut_x); /* (n_cut, hidden) */
    float *last = malloc((size_t)H * sizeof *last);             /* (hidden) */
    t->model = m;
    t->n = n;
    t->kv_dim = kv_dim;
    t->n_layers = L;
    t->vocab = V;
    t->n_probes = kv_probe_count(c);
    t->n_cut = n_cut;
    memcpy(t->cut, cut, (size_t)n_cut * sizeof *cut);
    t->tokens = malloc((size_t)n * sizeof *t->tokens);
    t->k = malloc((size_t)(L * n * kv_dim) * sizeof *t->k);
    t->v = malloc((size_t)(L * n * kv_dim) * sizeof *t->v);
    t->cut_hash = calloc((size_t)(n_cut * t->n_probes), sizeof *t->cut_hash);
    t->cut_logits = malloc((size_t)(n_cut * V) * sizeof *t->cut_logits);
    if (!real || !cut_x || !last || !t->tokens || !t->k || !t->v || !t->cut_hash ||
        !t->cut_logits) {
        st = kv_error_set(err, KV_ERR_INTERNAL, "stream tape: out of memory (%lld layers x %lld "
                          "tokens)", (long long)L, (long long)n);
        goto cleanup;
    }
    memcpy(t->tokens, tokens, (size_t)n * sizeof *tokens);
    memset(real, 1, (size_t)n);
    st = kv_cpu_state_init(&cs, m, 1, n, n, NULL, err);
    if (st != KV_OK) goto cleanup;
    cs_init = true;
    st = kv_cpu_state_probe(&cs, false, err);
    if (st != KV_OK) goto cleanup;
    cs.probes.n_cut = n_cut;
    cs.probes.cut_total = n;
    cs.probes.cut = t->cut;
    cs.probes.cut_hash = t->cut_hash;
    cs.probes.cut_x = cut_x;
    cs.probes.on_layer = on_layer;
    cs.probes.on_layer_ctx = ctx;
    st = kv_cpu_forward(&cs, tokens, real, n, NULL, err);
    if (st != KV_OK) goto cleanup;
    if (cs.probes.nonfinite_probe >= 0) goto cleanup; /* unfilled: runs compute their own */
    /* the static cache (num_layers, 1, max_len = n, kv_dim) is the layout kept */
    memcpy(t->k, cs.ref.k, (size_t)(L * n * kv_dim) * sizeof *t->k);
    memcpy(t->v, cs.ref.v, (size_t)(L * n * kv_dim) * sizeof *t->v);
    const int64_t norm = t->n_probes - 2, logits = t->n_probes - 1;
    for (int64_t j = 0; j < n_cut; j++) {
        float *lg = t->cut_logits + j * V; /* (vocab) */
        kv_ref_final_row(&cs.ref, cut_x + j * H, last, lg);
        if (!all_finite(last, H) || !all_finite(lg, V)) goto cleanup;
        t->cut_hash[j * t->n_probes + norm] = kv_probe_hash_bytes(last, (size_t)H * sizeof *last);
        t->cut_hash[j * t->n_probes + logits] = kv_probe_hash_bytes(lg, (size_t)V * sizeof *lg);
        t->cut_tok[j] = kv_argmax(lg, V, &t->cut_margin[j]);
    }
    t->filled = true;
cleanup:
    if (cs_init) kv_cpu_state_free(&cs);
    free(real);
    free(cut_x);
    free(last);
    if (st != KV_OK) kv_stream_tape_free(t);
    return st;
}

static int64_t cut_index(const KvStreamTape *t, int64_t n) {
    for (int64_t j = 0; j < t->n_cut; j++) {
        if (t->cut[j] == n) return j;
    }
    return -1;
}

bool kv_stream_tape_fits(const KvStreamTape *t, const int32_t *tokens, int64_t n) {
    return t != NULL && t->filled && cut_index(t, n) >= 0 &&
           memcmp(t->tokens, tokens, (size_t)n * sizeof *tokens) == 0;
}

KvStatus kv_stream_tape_cut(const KvStreamTape *t, int64_t n, KvPrefillTape *out,
                            KvError *err) {
    memset(out, 0, sizeof *out);
    const int64_t j = cut_index(t, n);
    if (!t->filled || j < 0) {
        return kv_error_set(err, KV_ERR_INTERNAL, "stream tape: no cut of %lld tokens",
                            (long long)n);
    }
    const int64_t L = t->n_layers, kv_dim = t->kv_dim, V = t->vocab;
    KvPrefillTape r;
    KvStatus st = kv_prefill_tape_alloc(&r, t->model, 1, n, true, err);
    if (st != KV_OK) return st;
    memcpy(r.tokens, t->tokens, (size_t)n * sizeof *r.tokens);
    memset(r.real, 1, (size_t)n);
    for (int64_t l = 0; l < L; l++) {
        const size_t from = (size_t)(l * t->n * kv_dim), to = (size_t)(l * n * kv_dim);
        memcpy(r.k + to, t->k + from, (size_t)(n * kv_dim) * sizeof *r.k);
        memcpy(r.v + to, t->v + from, (size_t)(n * kv_dim) * sizeof *r.v);
    }
    memcpy(r.logits, t->cut_logits + j * V, (size_t)V * sizeof *r.logits);
    r.next_tok[0] = t->cut_tok[j];
    r.margin[0] = t->cut_margin[j];
    memcpy(r.probe_hash, t->cut_hash + j * t->n_probes, (size_t)t->n_probes * sizeof *r.probe_hash);
    r.filled = true;
    *out = r;
    return KV_OK;
}

/* Row b's one-row prefill tape: a cut of the stream when the row is one,
 * else its own forward, computed here with probes (a row of a batch is its
 * own computation: each row's matmuls, norms and attention read only its
 * own columns, so its bits do not depend on the rows beside it). */
static KvStatus row_tape(const KvStreamTape *t, const int32_t *tokens, const uint8_t *real,
                         int64_t n, KvPrefillTape *out, KvError *err) {
    bool all_real = true;
    for (int64_t i = 0; i < n && all_real; i++) all_real = real[i] != 0;
    if (all_real && kv_stream_tape_fits(t, tokens, n)) return kv_stream_tape_cut(t, n, out, err);
    KvCpuState cs;
    KvStatus st = kv_cpu_state_init(&cs, t->model, 1, n, n, NULL, err);
    if (st != KV_OK) return st;
    st = kv_cpu_state_probe(&cs, false, err);
    if (st == KV_OK) st = kv_cpu_forward(&cs, tokens, real, n, NULL, err);
    if (st == KV_OK) st = kv_cpu_tape_save(&cs, tokens, real, n, out, err);
    kv_cpu_state_free(&cs);
    if (st == KV_OK && !out->filled) {
        st = kv_error_set(err, KV_ERR_INTERNAL, "stream tape: a row's own forward recorded "
                          "no tape");
    }
    return st;
}

KvStatus kv_stream_tape_rows(const KvStreamTape *t, const int32_t *tokens, const uint8_t *real,
                             int64_t batch, int64_t n, KvPrefillTape *out, KvError *err) {
    memset(out, 0, sizeof *out);
    bool any = false;
    for (int64_t b = 0; b < batch && !any; b++) {
        bool all_real = true;
        for (int64_t i = 0; i < n && all_real; i++) all_real = real[b * n + i] != 0;
        any = all_real && kv_stream_tape_fits(t, tokens + b * n, n);
    }
    if (!any) return KV_OK;
    /* one row that is a cut: the cut itself, not a copy of it */
    if (batch == 1) return kv_stream_tape_cut(t, n, out, err);
    const int64_t L = t->n_layers, kv_dim = t->kv_dim, V = t->vocab, NP = t->n_probes;
    KvPrefillTape r;
    KvStatus st = kv_prefill_tape_alloc(&r, t->model, batch, n, true, err);
    if (st != KV_OK) return st;
    memcpy(r.tokens, tokens, (size_t)(batch * n) * sizeof *tokens);
    memcpy(r.real, real, (size_t)(batch * n));
    for (int64_t b = 0; b < batch && st == KV_OK; b++) {
        KvPrefillTape one;
        st = row_tape(t, tokens + b * n, real + b * n, n, &one, err);
        if (st != KV_OK) break;
        const size_t rows = (size_t)(n * kv_dim);
        for (int64_t l = 0; l < L; l++) {
            const size_t to = (size_t)((l * batch + b) * n * kv_dim);
            memcpy(r.k + to, one.k + (size_t)l * rows, rows * sizeof *r.k);
            memcpy(r.v + to, one.v + (size_t)l * rows, rows * sizeof *r.v);
        }
        memcpy(r.logits + b * V, one.logits, (size_t)V * sizeof *r.logits);
        r.next_tok[b] = one.next_tok[0];
        r.margin[b] = one.margin[0];
        for (int64_t p = 0; p < NP; p++) r.probe_hash[p * batch + b] = one.probe_hash[p];
        /* the batch's first non-finite value: the lowest probe, then row */
        if (one.nonfinite_probe >= 0 &&
            (r.nonfinite_probe < 0 || one.nonfinite_probe < r.nonfinite_probe)) {
            r.nonfinite_probe = one.nonfinite_probe;
            r.nonfinite_row = b;
            r.nonfinite_index = one.nonfinite_index;
            r.nonfinite_value = one.nonfinite_value;
        }
        kv_prefill_tape_free(&one);
    }
    if (st != KV_OK) {
        kv_prefill_tape_free(&r);
        return st;
    }
    r.filled = true;
    *out = r;
    return KV_OK;
}
