/* cpu_tape.c: the prefill tape of a CPU run (prefill_tape.h): recorded
 * from the reference's first forward, taken by a variant's run in place of
 * its own, with the variant's update writing the keys and values. */
#include <stdlib.h>
#include <string.h>

#include "cpu_state.h"
#include "fault.h"
#include "prefill_tape.h"
#include "probe.h"

void kv_prefill_tape_free(KvPrefillTape *t) {
    if (t == NULL) return;
    free(t->tokens);
    free(t->real);
    free(t->k);
    free(t->v);
    free(t->logits);
    free(t->next_tok);
    free(t->margin);
    free(t->probe_hash);
    memset(t, 0, sizeof *t);
}

KvStatus kv_prefill_tape_alloc(KvPrefillTape *t, const KvModel *m, int64_t batch, int64_t n,
                               bool probes, KvError *err) {
    const KvConfig *c = &m->config;
    const int64_t B = batch, kv_dim = c->num_kv_heads * c->head_dim, L = c->num_layers;
    const int64_t V = c->vocab_size;
    KvPrefillTape r = {0};
    r.model = m;
    r.batch = B;
    r.n = n;
    r.kv_dim = kv_dim;
    r.n_layers = L;
    r.vocab = V;
    r.tokens = malloc((size_t)(B * n) * sizeof *r.tokens);
    r.real = malloc((size_t)(B * n));
    r.k = malloc((size_t)(L * B * n * kv_dim) * sizeof *r.k);
    r.v = malloc((size_t)(L * B * n * kv_dim) * sizeof *r.v);
    r.logits = malloc((size_t)(B * V) * sizeof *r.logits);
    r.next_tok = malloc((size_t)B * sizeof *r.next_tok);
    r.margin = malloc((size_t)B * sizeof *r.margin);
    if (probes) {
        r.n_probes = kv_probe_count(c);
        r.probe_hash = malloc((size_t)(r.n_probes * B) * sizeof *r.probe_hash);
    }
    r.nonfinite_probe = r.nonfinite_row = r.nonfinite_index = -1;
    *t = r;
    if (!r.tokens || !r.real || !r.k || !r.v || !r.logits || !r.next_tok || !r.margin ||
        (probes && !r.probe_hash)) {
        kv_prefill_tape_free(t);
        return kv_error_set(err, KV_ERR_INTERNAL, "prefill tape: out of memory (%lld layers x "
                            "%lld rows x %lld tokens)", (long long)L, (long long)B, (long long)n);
    }
    return KV_OK;
}

/* Row (layer, b, slot) of the static cache (num_layers, B, max_len, kv_dim). */
static size_t static_row(const KvRefState *s, int64_t layer, int64_t b, int64_t slot,
                         int64_t kv_dim) {
    return (size_t)(((layer * s->batch + b) * s->max_len + slot) * kv_dim);
}

KvStatus kv_cpu_tape_save(const KvCpuState *cs, const int32_t *tokens, const uint8_t *real,
                          int64_t n, KvPrefillTape *t, KvError *err) {
    const KvRefState *s = &cs->ref;
    const KvConfig *c = &s->model->config;
    /* Only a clean reference's first forward from an empty state: the
     * static cache then holds every layer's keys. */
    if (t->filled || cs->variant != NULL || cs->per_row || cs->order != 0 || cs->faults != 0 ||
        s->len != n) {
        return KV_OK;
    }
    const int64_t B = s->batch, kv_dim = c->num_kv_heads * c->head_dim, L = c->num_layers;
    const int64_t V = c->vocab_size;
    KvPrefillTape r;
    KvStatus st = kv_prefill_tape_alloc(&r, s->model, B, n, cs->probes.on, err);
    if (st != KV_OK) return st;
    memcpy(r.tokens, tokens, (size_t)(B * n) * sizeof *tokens);
    memcpy(r.real, real, (size_t)(B * n));
    const size_t row_bytes = (size_t)kv_dim * sizeof(float);
    for (int64_t l = 0; l < L; l++) {
        for (int64_t b = 0; b < B; b++) {
            const size_t at = (size_t)(((l * B + b) * n) * kv_dim);
            memcpy(r.k + at, s->k + static_row(s, l, b, 0, kv_dim), (size_t)n * row_bytes);
            memcpy(r.v + at, s->v + static_row(s, l, b, 0, kv_dim), (size_t)n * row_bytes);
        }
    }
    memcpy(r.logits, s->logits, (size_t)(B * V) * sizeof *r.logits);
    memcpy(r.next_tok, s->next_tok, (size_t)B * sizeof *r.next_tok);
    memcpy(r.margin, s->margin, (size_t)B * sizeof *r.margin);
    if (r.probe_hash != NULL) {
        memcpy(r.probe_hash, cs->probes.hash, (size_t)(r.n_probes * B) * sizeof *r.probe_hash);
    }
    r.nonfinite_probe = cs->probes.on ? cs->probes.nonfinite_probe : -1;
    r.nonfinite_row = cs->probes.on ? cs->probes.nonfinite_row : -1;
    r.nonfinite_index = cs->probes.on ? cs->probes.nonfinite_index : -1;
    r.nonfinite_value = cs->probes.on ? cs->probes.nonfinite_value : 0.0f;
    r.filled = true;
    *t = r;
    return KV_OK;
}

KvStatus kv_cpu_tape_load(KvCpuState *cs, int64_t n, const KvPrefillTape *t, bool *used,
                          KvError *err) {
    KvRefState *s = &cs->ref;
    (void)err;
    *used = false;
    /* A tape fits a run of the same model and input from an empty state, in
     * the canonical order (a calibration member computes its own), with no
     * planted fault that changes the forward's computation, without per-row
     * positions, and keeping no full probe values (bisect's --rerun wants
     * every value computed). */
    if (t == NULL || !t->filled || t->model != s->model || t->batch != s->batch || t->n != n ||
        s->len != 0 || cs->per_row || cs->order != 0 || (cs->faults & KV_FAULTS_IN_FORWARD) ||
        cs->probes.dump.data != NULL ||
        (cs->probes.on && t->probe_hash == NULL) ||
        memcmp(t->tokens, s->tok_in, (size_t)(s->batch * n) * sizeof *t->tokens) != 0 ||
        memcmp(t->real, s->real_in, (size_t)(s->batch * n)) != 0) {
        return KV_OK;
    }
    const int64_t B = s->batch, kv_dim = t->kv_dim, V = t->vocab;
    const size_t row_bytes = (size_t)kv_dim * sizeof(float);
    /* The forward's first op: slots, real flags and RoPE positions (no
     * planted positions fault acts on an empty state). */
    kv_ref_place_tokens(s, n, false);
    if (cs->probes.on) {
        memcpy(cs->probes.hash, t->probe_hash, (size_t)(t->n_probes * B) * sizeof(uint64_t));
        cs->probes.nonfinite_probe = t->nonfinite_probe;
        cs->probes.nonfinite_row = t->nonfinite_row;
        cs->probes.nonfinite_index = t->nonfinite_index;
        cs->probes.nonfinite_value = t->nonfinite_value;
    }
    for (int64_t l = 0; l < t->n_layers; l++) {
        const float *tk = t->k + (size_t)(l * B * n * kv_dim); /* (B, n, kv_dim) */
        const float *tv = t->v + (size_t)(l * B * n * kv_dim); /* (B, n, kv_dim) */
        KvSlidingCache *cache = kv_cpu_cache(cs, l, 0, NULL);
        if (cache == NULL) {
            /* the static cache's store (slot = position) */
            for (int64_t b = 0; b < B; b++) {
                for (int64_t i = 0; i < s->n_new[b]; i++) {
                    const int64_t slot = s->pos0[b] + i;
                    memcpy(s->k + static_row(s, l, b, slot, kv_dim), tk + (b * n + i) * kv_dim,
                           row_bytes);
                    memcpy(s->v + static_row(s, l, b, slot, kv_dim), tv + (b * n + i) * kv_dim,
                           row_bytes);
                }
            }
        } else {
            /* the variant's own update, as its forward would call it */
            memcpy(s->kn, tk, (size_t)(B * n) * row_bytes);
            memcpy(s->vn, tv, (size_t)(B * n) * row_bytes);
            cs->variant->update(cache, s->kn, s->vn, s->real_in, n, &s->total_mem, s->len);
        }
        if (cs->probes.on) cs->observer(cs, s, l, KV_POINT_CACHE, NULL, 0);
    }
    memcpy(s->logits, t->logits, (size_t)(B * V) * sizeof *s->logits);
    memcpy(s->next_tok, t->next_tok, (size_t)B * sizeof *s->next_tok);
    memcpy(s->margin, t->margin, (size_t)B * sizeof *s->margin);
    /* the forward's last op: the next input, then the count in memory */
    for (int64_t b = 0; b < B; b++) {
        s->tok_in[b] = s->next_tok[b];
        s->real_in[b] = 1;
        s->lag[b] += n - s->n_new[b];
    }
    s->total_mem += n;
    *used = true;
    return KV_OK;
}
