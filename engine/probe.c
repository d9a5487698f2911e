/* probe.c: the probes' names and records (probe.h, DESIGN §6): hashes, the
 * first non-finite value, the full-layer memo and the dump. The observer
 * that fills them during a CPU run is cpu_probe.c. */
#include "probe.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvmath.h"
#include "prng.h"

void kv_probe_dump_free(KvProbeDump *d) {
    if (d == NULL) return;
    for (int64_t p = 0; d->data != NULL && p < d->n_probes; p++) free(d->data[p]);
    free(d->data);
    free(d->len);
    free(d->cap);
    memset(d, 0, sizeof *d);
}

uint64_t kv_probe_fold(uint64_t h, uint64_t slice) {
    unsigned char le[8];
    for (int i = 0; i < 8; i++) le[i] = (unsigned char)(slice >> (8 * i));
    return kv_fnv1a(h, le, sizeof le);
}

/* Slices hashed per block: their hashes are folded in order after the
 * block, so the slices themselves can be hashed side by side and, in a
 * long row (a prefill's activations), across threads. */
#define HASH_BLOCK_SLICES 256
/* Slices below which the block stays on one thread (the fork costs more). */
#define HASH_PARALLEL_SLICES 32

/* The hashes e (nb) of the nb whole slices from p: four chains side by
 * side, and across threads in a long block. */
static void hash_block(const unsigned char *p, int64_t nb, uint64_t *e) {
    const int64_t groups = (nb + 3) / 4;
#pragma omp parallel for schedule(static) if (nb >= HASH_PARALLEL_SLICES)
    for (int64_t g = 0; g < groups; g++) {
        const int64_t i = 4 * g;
        if (i + 4 <= nb) {
            uint64_t hx[4] = {KV_FNV_OFFSET, KV_FNV_OFFSET, KV_FNV_OFFSET, KV_FNV_OFFSET};
            const void *px[4];
            for (int j = 0; j < 4; j++) px[j] = p + (size_t)(i + j) * KV_PROBE_CHUNK;
            kv_fnv1a_x4(hx, px, KV_PROBE_CHUNK);
            for (int j = 0; j < 4; j++) e[i + j] = hx[j];
        } else {
            for (int64_t j = i; j < nb; j++) {
                e[j] = kv_fnv1a(KV_FNV_OFFSET, p + (size_t)j * KV_PROBE_CHUNK, KV_PROBE_CHUNK);
            }
        }
    }
}

uint64_t kv_probe_hash_bytes(const void *data, size_t n) {
    const unsigned char *p = data;
    uint64_t h = KV_FNV_OFFSET;
    const int64_t full = (int64_t)(n / KV_PROBE_CHUNK); /* whole slices */
    uint64_t e[HASH_BLOCK_SLICES];                      /* (block) slice hashes */
    for (int64_t b0 = 0; b0 < full; b0 += HASH_BLOCK_SLICES) {
        const int64_t nb = full - b0 < HASH_BLOCK_SLICES ? full - b0 : HASH_BLOCK_SLICES;
        hash_block(p + (size_t)b0 * KV_PROBE_CHUNK, nb, e);
        for (int64_t j = 0; j < nb; j++) h = kv_probe_fold(h, e[j]);
    }
    const size_t at = (size_t)full * KV_PROBE_CHUNK;
    if (at < n) h = kv_probe_fold(h, kv_fnv1a(KV_FNV_OFFSET, p + at, n - at));
    return h;
}

/* Emits the prefixes from *next whose whole slices are the first `folded`
 * (h: those slices folded): h, then the hash of their remaining bytes. */
static void emit_prefixes(const unsigned char *p, uint64_t h, size_t folded, const size_t *prefix,
                          int64_t n_prefix, int64_t *next, uint64_t *out) {
    for (; *next < n_prefix && prefix[*next] / KV_PROBE_CHUNK == folded; ++*next) {
        const size_t at = folded * KV_PROBE_CHUNK;
        out[*next] = at < prefix[*next]
                         ? kv_probe_fold(h, kv_fnv1a(KV_FNV_OFFSET, p + at, prefix[*next] - at))
                         : h;
    }
}

void kv_probe_hash_prefixes(const void *data, size_t n, const size_t *prefix, int64_t n_prefix,
                            uint64_t *out) {
    const unsigned char *p = data;
    uint64_t h = KV_FNV_OFFSET;
    int64_t next = 0; /* the next prefix to emit */
    const size_t last = n_prefix > 0 ? prefix[n_prefix - 1] : 0;
    const int64_t full = (int64_t)((last < n ? last : n) / KV_PROBE_CHUNK);
    uint64_t e[HASH_BLOCK_SLICES]; /* (block) slice hashes */
    emit_prefixes(p, h, 0, prefix, n_prefix, &next, out);
    for (int64_t b0 = 0; b0 < full; b0 += HASH_BLOCK_SLICES) {
        const int64_t nb = full - b0 < HASH_BLOCK_SLICES ? full - b0 : HASH_BLOCK_SLICES;
        hash_block(p + (size_t)b0 * KV_PROBE_CHUNK, nb, e);
        for (int64_t j = 0; j < nb; j++) {
            h = kv_probe_fold(h, e[j]);
            emit_prefixes(p, h, (size_t)(b0 + j + 1), prefix, n_prefix, &next, out);
        }
    }
}

int64_t kv_probe_count(const KvConfig *c) {
    return 3 + KV_PROBE_PER_LAYER * c->num_layers;
}

void kv_probe_name(const KvConfig *c, int64_t index, char *out, size_t out_len) {
    static const char *const k_layer[KV_PROBE_PER_LAYER] = {"q",    "k",   "v",       "cache",
                                                             "attn", "mlp", "residual"};
    const int64_t n = kv_probe_count(c);
    const int item = kv_probe_item(n, index);
    if (index == 0) {
        snprintf(out, out_len, "embed");
    } else if (index == n - 2) {
        snprintf(out, out_len, "final_norm");
    } else if (index == n - 1) {
        snprintf(out, out_len, "logits");
    } else if (item < 0) {
        snprintf(out, out_len, "probe%lld", (long long)index); /* out of range */
    } else {
        snprintf(out, out_len, "layer%lld.%s", (long long)kv_probe_layer(n, index), k_layer[item]);
    }
}

int64_t kv_probe_index(int64_t layer, int item) {
    return 1 + KV_PROBE_PER_LAYER * layer + item;
}

int64_t kv_probe_layer(int64_t n_probes, int64_t idx) {
    return idx > 0 && idx < n_probes - 2 ? (idx - 1) / KV_PROBE_PER_LAYER : -1;
}

int kv_probe_item(int64_t n_probes, int64_t idx) {
    return idx > 0 && idx < n_probes - 2 ? (int)((idx - 1) % KV_PROBE_PER_LAYER) : -1;
}

void kv_probes_nonfinite_reset(KvProbes *p) {
    p->nonfinite_probe = p->nonfinite_row = p->nonfinite_index = -1;
    p->nonfinite_value = 0.0f;
}

/* Records the first non-finite value among `count` floats of probe idx, row
 * b, at element offset `first`, unless an earlier (probe, row, element) is
 * already recorded. A NaN or Inf anywhere in the forward is a failure in its
 * own right (a NaN compares false with every tolerance), so every probe is
 * scanned, not only the logits. */
void kv_probes_check_finite(KvProbes *s, int64_t idx, int64_t b, const float *v,
                               int64_t count, int64_t first) {
    if (s->nonfinite_probe >= 0 && (s->nonfinite_probe < idx ||
                                    (s->nonfinite_probe == idx && s->nonfinite_row <= b))) {
        return;
    }
    for (int64_t i = 0; i < count; i++) {
        if (!isfinite(v[i])) {
            s->nonfinite_probe = idx;
            s->nonfinite_row = b;
            s->nonfinite_index = first + i;
            s->nonfinite_value = v[i];
            return;
        }
    }
}

static void probe_memo_free(KvProbes *s) {
    for (int64_t i = 0; s->memo != NULL && i < s->n_layers * s->batch; i++) {
        free(s->memo[i].k);
        free(s->memo[i].v);
        free(s->memo[i].real);
    }
    free(s->memo);
    s->memo = NULL;
}

/* Row b of full layer l's memo, allocated on first use; NULL when it cannot
 * be (the probe then hashes in full, as without one). */
KvProbeMemo *kv_probes_memo(KvProbes *s, int64_t layer, int64_t b,
                                          int64_t kv_dim) {
    if (s->memo == NULL) {
        s->memo = calloc((size_t)(s->n_layers * s->batch), sizeof *s->memo);
        if (s->memo == NULL) return NULL;
    }
    struct KvProbeMemo *mm = &s->memo[layer * s->batch + b];
    if (mm->off) return NULL;
    if (mm->k == NULL) {
        mm->k = malloc((size_t)(s->max_len * kv_dim) * sizeof *mm->k);
        mm->v = malloc((size_t)(s->max_len * kv_dim) * sizeof *mm->v);
        mm->real = malloc((size_t)s->max_len);
        if (mm->k == NULL || mm->v == NULL || mm->real == NULL) {
            free(mm->k);
            free(mm->v);
            free(mm->real);
            mm->k = mm->v = NULL;
            mm->real = NULL;
            mm->off = true;
            return NULL;
        }
    }
    return mm;
}


KvStatus kv_probes_init(KvProbes *p, const KvConfig *c, int64_t batch, int64_t max_len,
                        KvError *err) {
    memset(p, 0, sizeof *p);
    p->n_probes = kv_probe_count(c);
    p->batch = batch;
    p->max_len = max_len;
    p->n_layers = c->num_layers;
    kv_probes_nonfinite_reset(p);
    p->hash = calloc((size_t)(p->n_probes * batch), sizeof *p->hash);
    p->entries = malloc((size_t)(max_len > 0 ? max_len : 1) * sizeof *p->entries);
    if (p->hash == NULL || p->entries == NULL) return kv_error_set(err, KV_ERR_INTERNAL, "probes: out of memory");
    return KV_OK;
}

void kv_probes_free(KvProbes *p) {
    if (p == NULL) return;
    free(p->hash);
    free(p->entries);
    probe_memo_free(p);
    kv_probe_dump_free(&p->dump);
    memset(p, 0, sizeof *p);
}

KvStatus kv_probes_dump_enable(KvProbes *p, const KvConfig *c, int64_t max_chunk, KvError *err) {
    const int64_t kv_dim = c->num_kv_heads * c->head_dim;
    const int64_t q_dim = c->num_heads * c->head_dim;
    int64_t widest = c->hidden_size > q_dim ? c->hidden_size : q_dim;
    KvProbeDump *d = &p->dump;
    kv_probe_dump_free(d);
    d->n_probes = p->n_probes;
    d->batch = p->batch;
    d->data = calloc((size_t)p->n_probes, sizeof *d->data);
    d->len = calloc((size_t)p->n_probes, sizeof *d->len);
    d->cap = calloc((size_t)p->n_probes, sizeof *d->cap);
    bool ok = d->data != NULL && d->len != NULL && d->cap != NULL;
    for (int64_t i = 0; ok && i < p->n_probes; i++) {
        /* Per row: n tokens of the probed width; logits one row of the
         * vocabulary; a cache probe up to every slot, K and V. */
        int64_t cap = max_chunk * widest;
        if (i == p->n_probes - 1) cap = c->vocab_size;
        if (kv_probe_item(p->n_probes, i) == KV_PROBE_CACHE) cap = p->max_len * 2 * kv_dim;
        d->cap[i] = cap;
        d->data[i] = calloc((size_t)(p->batch * cap), sizeof(float));
        ok = d->data[i] != NULL;
    }
    if (!ok) {
        kv_probe_dump_free(d);
        return kv_error_set(err, KV_ERR_INTERNAL, "probe dump: out of memory");
    }
    return KV_OK;
}

/* Keeps a probe's full values: per_row bytes of floats for each row. */
void kv_probes_dump_rows(KvProbeDump *d, int64_t idx, const void *base, int64_t per_row) {
    if (d->data == NULL) return;
    const int64_t floats = per_row / (int64_t)sizeof(float);
    if (floats > d->cap[idx]) return; /* cannot happen: cap is the widest tensor */
    d->len[idx] = floats;
    for (int64_t b = 0; b < d->batch; b++) {
        memcpy(d->data[idx] + b * floats, (const unsigned char *)base + b * per_row,
               (size_t)per_row);
    }
}
