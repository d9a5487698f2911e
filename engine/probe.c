/* probe.c: the probes (probe.h, DESIGN §6) of a CPU run: the observer the
 * engine installs in the reference's hooks (KvRefHooks.observe), hashing
 * each named intermediate, checking it for NaN and Inf and, on request,
 * keeping its full values; the cache probe reads the run's caches itself. */
#include "probe.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_state.h"
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
static void probe_check_finite(KvProbes *s, int64_t idx, int64_t b, const float *v,
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

/* One full layer's cache-probe memo for one row (KvProbes.memo). */
struct KvProbeMemo {
    int64_t n;        /* positions 0 .. n - 1 hashed into h (0: nothing memoised) */
    uint64_t h;       /* the FNV state after them */
    bool finite;      /* every value of theirs was finite (their finite check is done) */
    bool off;         /* allocation failed: always hash in full */
    float *k, *v;     /* (max_len, kv_dim) copies of the static cache's rows 0 .. n - 1 */
    uint8_t *real;    /* (max_len) copy of the row's real flags */
};

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
static struct KvProbeMemo *probe_memo_get(KvProbes *s, int64_t layer, int64_t b,
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


/* The cache probe: per row, K then V of every real position the next query
 * (position len + n) will see, ascending: q - W < p <= q - 1 on a sliding
 * layer, every p < len + n on a full one. Layout-independent, so variants
 * compare with the reference and with each other: a variant's slot for p is
 * the one its layout rule puts p in (what attention reads), and a slot whose
 * recorded position disagrees with the rule changes the hash. */
static void probe_cache(KvCpuState *cs, int64_t layer) {
    KvRefState *s = &cs->ref;
    KvProbes *pr = &cs->probes;
    const KvConfig *c = &s->model->config;
    const int64_t kv_dim = c->num_kv_heads * c->head_dim;
    const int64_t window = kv_config_layer_window(c, layer);
    const size_t row_bytes = (size_t)kv_dim * sizeof(float);
    /* Slots are found by the layout rule with every position up to next
     * stored (the probe runs after the update), as attention finds them. */
    const KvLayoutRule rule = cs->variant != NULL ? cs->variant->layout : KV_LAYOUT_LEFT_ALIGNED;
    const int64_t idx = kv_probe_index(layer, KV_PROBE_CACHE);
    /* The widest row's span (rows differ with per-row positions). */
    int64_t span = 0;
    for (int64_t b = 0; b < s->batch; b++) {
        const int64_t next = s->pos0[b] + s->n_new[b];
        const int64_t lo = window > 0 && next - window + 1 > 0 ? next - window + 1 : 0;
        if (next - lo > span) span = next - lo;
    }
    float *dense = NULL; /* (B, span, 2, kv_dim) for the dump, NaN = not held */
    if (pr->dump.data != NULL && span * 2 * kv_dim <= pr->dump.cap[idx]) {
        pr->dump.len[idx] = span * 2 * kv_dim;
        dense = pr->dump.data[idx];
        for (int64_t i = 0; i < s->batch * pr->dump.len[idx]; i++) dense[i] = NAN;
    }
    for (int64_t b = 0; b < s->batch; b++) {
        const int64_t next = s->pos0[b] + s->n_new[b]; /* the row's next query position */
        const int64_t lo = window > 0 && next - window + 1 > 0 ? next - window + 1 : 0;
        int64_t vb = b; /* the row inside the cache's view */
        KvSlidingCache *cache = kv_cpu_cache(cs, layer, b, &vb);
        KvCacheView view = {0};
        if (cache != NULL) view = cs->variant->view(cache);
        uint64_t h = KV_FNV_OFFSET;
        int64_t from = lo;
        /* A full layer's positions only grow from 0: continue last step's
         * hash when the bytes it covered are unchanged (a shift, a restored
         * snapshot or a faulted write changes them, and then the row is
         * hashed in full). Not while dumping (the dump wants every row). */
        struct KvProbeMemo *mm = NULL;
        const int64_t off0 = (layer * s->batch + b) * s->max_len * kv_dim;
        if (cache == NULL && window == 0 && dense == NULL) {
            mm = probe_memo_get(pr, layer, b, kv_dim);
        }
        if (mm != NULL && mm->n > 0 && mm->n <= next && mm->finite &&
            memcmp(mm->real, s->real + b * s->max_len, (size_t)mm->n) == 0 &&
            memcmp(mm->k, s->k + off0, (size_t)(mm->n * kv_dim) * sizeof(float)) == 0 &&
            memcmp(mm->v, s->v + off0, (size_t)(mm->n * kv_dim) * sizeof(float)) == 0) {
            from = mm->n;
            h = mm->h;
        }
        bool finite = true;
        for (int64_t p = from; p < next; p++) {
            const float *k = NULL, *v = NULL;
            int64_t recorded = p; /* the writer's record for the slot read (cache != NULL) */
            if (cache == NULL) {
                if (!s->real[b * s->max_len + p]) continue;
                const int64_t off = ((layer * s->batch + b) * s->max_len + p) * kv_dim;
                k = s->k + off;
                v = s->v + off;
            } else {
                for (int64_t i = 0; i < view.n_slots; i++) {
                    if (kv_layout_position(rule, window, i, next) != p ||
                        !view.real[vb * view.row_stride + i])
                        continue;
                    k = view.k + (vb * view.row_stride + i) * view.dim;
                    v = view.v + (vb * view.row_stride + i) * view.dim;
                    recorded = view.pos[i];
                    break;
                }
                if (k == NULL) continue; /* missing from the cache: the hash shows it */
            }
            h = kv_fnv1a(h, &p, sizeof p);
            /* The independent check: a slot whose recorded position is not
             * the rule's adds the record to the hash (and only then, so a
             * correct variant hashes exactly as the reference does). */
            if (recorded != p) h = kv_fnv1a(h, &recorded, sizeof recorded);
            h = kv_fnv1a(h, k, row_bytes);
            h = kv_fnv1a(h, v, row_bytes);
            /* Elements counted as in the dump: (p - lo, {K, V}, kv_dim). */
            probe_check_finite(pr, idx, b, k, kv_dim, (p - lo) * 2 * kv_dim);
            probe_check_finite(pr, idx, b, v, kv_dim, (p - lo) * 2 * kv_dim + kv_dim);
            for (int64_t i = 0; mm != NULL && i < kv_dim; i++) {
                finite = finite && isfinite(k[i]) && isfinite(v[i]);
            }
            if (dense != NULL) {
                float *row = dense + b * pr->dump.len[idx] + (p - lo) * 2 * kv_dim;
                memcpy(row, k, row_bytes);
                memcpy(row + kv_dim, v, row_bytes);
            }
        }
        pr->hash[idx * s->batch + b] = h;
        if (mm != NULL) {
            /* remember what was hashed, from where this step began */
            const int64_t m0 = from == lo ? 0 : from;
            memcpy(mm->real + m0, s->real + b * s->max_len + m0, (size_t)(next - m0));
            memcpy(mm->k + m0 * kv_dim, s->k + off0 + m0 * kv_dim,
                   (size_t)((next - m0) * kv_dim) * sizeof(float));
            memcpy(mm->v + m0 * kv_dim, s->v + off0 + m0 * kv_dim,
                   (size_t)((next - m0) * kv_dim) * sizeof(float));
            mm->finite = (from == lo || mm->finite) && finite;
            mm->n = next;
            mm->h = h;
        }
    }
}

/* Keeps a probe's full values: per_row bytes of floats for each row. */
static void dump_probe(KvProbeDump *d, int64_t idx, const void *base, int64_t per_row) {
    if (d->data == NULL) return;
    const int64_t floats = per_row / (int64_t)sizeof(float);
    if (floats > d->cap[idx]) return; /* cannot happen: cap is the widest tensor */
    d->len[idx] = floats;
    for (int64_t b = 0; b < d->batch; b++) {
        memcpy(d->data[idx] + b * floats, (const unsigned char *)base + b * per_row,
               (size_t)per_row);
    }
}

/* The probe index of a named intermediate. */
static int64_t probe_of_point(const KvProbes *pr, int64_t layer, KvPoint point) {
    switch (point) {
    case KV_POINT_EMBED: return 0;
    case KV_POINT_FINAL_NORM: return pr->n_probes - 2;
    case KV_POINT_LOGITS: return pr->n_probes - 1;
    default: return kv_probe_index(layer, (int)point - (int)KV_POINT_Q);
    }
}

void kv_cpu_probe_observe(void *ctx, KvRefState *s, int64_t layer, KvPoint point,
                          const void *base, int64_t per_row) {
    KvCpuState *cs = ctx;
    KvProbes *pr = &cs->probes;
    (void)s; /* cs->ref */
    if (point == KV_POINT_CACHE) {
        probe_cache(cs, layer);
        return;
    }
    /* probe_hash[idx, b] = fnv1a(base + b * per_row, per_row) */
    const int64_t idx = probe_of_point(pr, layer, point);
    dump_probe(&pr->dump, idx, base, per_row);
    for (int64_t b = 0; b < pr->batch; b++) {
        const unsigned char *row = (const unsigned char *)base + b * per_row;
        pr->hash[idx * pr->batch + b] = kv_fnv1a(KV_FNV_OFFSET, row, (size_t)per_row);
        probe_check_finite(pr, idx, b, (const float *)(const void *)row,
                           per_row / (int64_t)sizeof(float), 0);
    }
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
    if (p->hash == NULL) return kv_error_set(err, KV_ERR_INTERNAL, "probes: out of memory");
    return KV_OK;
}

void kv_probes_free(KvProbes *p) {
    if (p == NULL) return;
    free(p->hash);
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
