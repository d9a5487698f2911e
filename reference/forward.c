/* forward.c: the reference forward pass (DESIGN §1, §2), written as ops on a
 * stream (stream.h) so that the same code runs eagerly or is captured into a
 * graph and replayed (DESIGN §4, graph mode on the CPU).
 *
 * Graph rule: everything that changes from one decode step to the next (the
 * position, the input tokens, the RoPE positions) is read by the ops from
 * state memory at execution time; op arguments hold only pointers and values
 * that are fixed for the captured step (n, layer index, sizes). The one
 * deliberate exception is `host_total` for cache updates: host-branch
 * variants choose their regime from it, and graph mode re-captures when that
 * regime changes, as a framework does.
 *
 * Determinism: every reduction is a kv_dot (fixed 16-lane pattern) or a
 * kv_attend over visible keys in ascending position; OpenMP splits only
 * independent outputs, so results are bitwise the same for any thread count.
 * With a cache variant, sliding layers keep K/V in the variant's slots and
 * attention gathers the variant's view by its layout rule (layout.h), sorted
 * by position, so every correct variant is bitwise equal to the reference
 * and a variant that writes where its rule does not read is not. */
#include "forward.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "ensemble.h"
#include "kvmath.h"
#include "prng.h"

static void *kv_alloc_floats(int64_t n) {
    return calloc((size_t)(n > 0 ? n : 1), sizeof(float));
}

static void ref_free_caches(KvRefState *s) {
    if (s->caches != NULL) {
        for (int64_t i = 0; i < s->n_caches; i++) {
            if (s->caches[i] != NULL) s->variant->destroy(s->caches[i]);
        }
        free(s->caches);
    }
    s->caches = NULL;
    s->n_caches = 0;
}

/* Creates every sliding layer's cache(s) for s->variant: one of B rows per
 * layer, or with per_row one single-row cache per row (each row then keeps
 * its own count of stored positions). Full layers keep the static cache. */
static void probe_memo_free(KvRefState *s);

static KvStatus ref_create_caches(KvRefState *s, KvError *err) {
    const KvConfig *c = &s->model->config;
    const int64_t kv_dim = c->num_kv_heads * c->head_dim;
    s->cache_rows = s->per_row ? s->batch : 1;
    s->caches = calloc((size_t)(c->num_layers * s->cache_rows), sizeof *s->caches);
    if (s->caches == NULL) {
        return kv_error_set(err, KV_ERR_INTERNAL, "reference state: out of memory");
    }
    s->n_caches = c->num_layers * s->cache_rows;
    for (int64_t l = 0; l < c->num_layers; l++) {
        const int64_t w = kv_config_layer_window(c, l);
        if (w == 0) continue; /* full layers keep the static cache */
        for (int64_t r = 0; r < s->cache_rows; r++) {
            KvSlidingCache **slot = &s->caches[l * s->cache_rows + r];
            KvStatus st = s->variant->create(s->per_row ? 1 : s->batch, w, kv_dim, slot, err);
            if (st != KV_OK) {
                kv_error_prefix(err, s->variant->name);
                return st;
            }
            s->variant->reset(*slot);
        }
    }
    return KV_OK;
}

KvSlidingCache *kv_ref_cache(const KvRefState *s, int64_t layer, int64_t b, int64_t *view_row) {
    if (view_row != NULL) *view_row = s->per_row ? 0 : b;
    if (s->caches == NULL || layer < 0 || layer >= s->n_layers) return NULL;
    return s->caches[layer * s->cache_rows + (s->per_row ? b : 0)];
}

KvStatus kv_ref_state_set_per_row(KvRefState *s, KvError *err) {
    if (s->batch > KV_PER_ROW_MAX || s->len != 0) {
        return kv_error_set(err, KV_ERR_INPUT,
                            "per-row positions: expected at most %d rows before the first "
                            "forward, found %lld rows after %lld slots",
                            KV_PER_ROW_MAX, (long long)s->batch, (long long)s->len);
    }
    if (s->per_row) return KV_OK;
    s->per_row = true;
    if (s->variant == NULL) return KV_OK;
    ref_free_caches(s);
    KvStatus st = ref_create_caches(s, err);
    if (st == KV_OK) kv_ref_state_plant(s, s->faults);
    return st;
}

void kv_ref_state_free(KvRefState *s) {
    if (s == NULL) return;
    free(s->k);
    free(s->v);
    free(s->real);
    free(s->n_real);
    free(s->inv_freq);
    free(s->inv_freq_local);
    free(s->moe_logits);
    free(s->moe_pick);
    free(s->moe_weight);
    free(s->moe_gu);
    free(s->moe_h);
    free(s->moe_out);
    free(s->x);
    free(s->xn);
    free(s->q);
    free(s->kn);
    free(s->vn);
    free(s->att);
    free(s->tmp);
    free(s->gate);
    free(s->up);
    free(s->qpos);
    free(s->last);
    free(s->scores);
    free(s->gk);
    free(s->gv);
    free(s->gpos);
    free(s->tok_in);
    free(s->real_in);
    free(s->logits);
    free(s->next_tok);
    free(s->margin);
    free(s->probe_hash);
    probe_memo_free(s);
    kv_probe_dump_free(&s->dump);
    free(s->lag);
    free(s->row_pos);
    free(s->row_n);
    ref_free_caches(s);
    memset(s, 0, sizeof *s);
}

KvStatus kv_ref_state_init(KvRefState *s, const KvModel *m, int64_t batch, int64_t max_len,
                           int64_t max_chunk, const KvCacheOps *variant, KvError *err) {
    const KvConfig *c = &m->config;
    memset(s, 0, sizeof *s);
    if (batch < 1 || max_len < 1 || max_chunk < 1 || max_chunk > max_len) {
        return kv_error_set(err, KV_ERR_INPUT,
                            "reference state: expected batch >= 1, 1 <= max_chunk <= max_len, "
                            "found batch %lld, max_len %lld, max_chunk %lld",
                            (long long)batch, (long long)max_len, (long long)max_chunk);
    }
    const int64_t kv_dim = c->num_kv_heads * c->head_dim;
    const int64_t q_dim = c->num_heads * c->head_dim;
    const int64_t rows = batch * max_chunk;
    s->model = m;
    s->batch = batch;
    s->max_len = max_len;
    s->max_chunk = max_chunk;
    s->n_layers = c->num_layers;
    s->k = kv_alloc_floats(c->num_layers * batch * max_len * kv_dim);
    s->v = kv_alloc_floats(c->num_layers * batch * max_len * kv_dim);
    s->real = calloc((size_t)(batch * max_len), 1);
    s->n_real = calloc((size_t)batch, sizeof(int64_t));
    s->lag = calloc((size_t)batch, sizeof(int64_t));
    s->row_pos = calloc((size_t)batch, sizeof(int64_t));
    s->row_n = calloc((size_t)batch, sizeof(int64_t));
    s->inv_freq = kv_alloc_floats(c->head_dim / 2);
    if (c->num_experts > 0) {
        s->moe_logits = kv_alloc_floats(c->num_experts);
        s->moe_pick = calloc((size_t)c->experts_per_tok, sizeof *s->moe_pick);
        s->moe_weight = kv_alloc_floats(c->experts_per_tok);
        s->moe_gu = kv_alloc_floats(2 * c->intermediate_size);
        s->moe_h = kv_alloc_floats(c->intermediate_size);
        s->moe_out = kv_alloc_floats(c->hidden_size);
        if (!s->moe_logits || !s->moe_pick || !s->moe_weight || !s->moe_gu || !s->moe_h ||
            !s->moe_out) {
            kv_ref_state_free(s);
            return kv_error_set(err, KV_ERR_INTERNAL, "reference state: out of memory (experts)");
        }
    }
    s->x = kv_alloc_floats(rows * c->hidden_size);
    s->xn = kv_alloc_floats(rows * c->hidden_size);
    s->q = kv_alloc_floats(rows * q_dim);
    s->kn = kv_alloc_floats(rows * kv_dim);
    s->vn = kv_alloc_floats(rows * kv_dim);
    s->att = kv_alloc_floats(rows * q_dim);
    s->tmp = kv_alloc_floats(rows * c->hidden_size);
    s->gate = kv_alloc_floats(rows * c->intermediate_size);
    s->up = kv_alloc_floats(rows * c->intermediate_size);
    s->qpos = calloc((size_t)rows, sizeof(int64_t));
    s->last = kv_alloc_floats(batch * c->hidden_size);
    s->max_keys = max_len + c->sliding_window;
    s->n_scratch = c->num_heads;
#ifdef _OPENMP
    /* Enough slots for every thread at init; attention runs on at most
     * n_scratch threads if the count grows later. */
    if (omp_get_max_threads() > s->n_scratch) s->n_scratch = omp_get_max_threads();
#endif
    s->scores = kv_alloc_floats(s->n_scratch * s->max_keys);
    s->gk = calloc((size_t)(s->n_scratch * s->max_keys), sizeof *s->gk);
    s->gv = calloc((size_t)(s->n_scratch * s->max_keys), sizeof *s->gv);
    s->gpos = calloc((size_t)(s->n_scratch * s->max_keys), sizeof *s->gpos);
    s->tok_in = calloc((size_t)rows, sizeof *s->tok_in);
    s->real_in = calloc((size_t)rows, 1);
    s->logits = kv_alloc_floats(batch * c->vocab_size);
    s->next_tok = calloc((size_t)batch, sizeof *s->next_tok);
    s->margin = kv_alloc_floats(batch);
    s->n_probes = kv_probe_count(c);
    kv_ref_nonfinite_reset(s);
    s->probe_hash = calloc((size_t)(s->n_probes * batch), sizeof *s->probe_hash);
    if (!s->k || !s->v || !s->real || !s->n_real || !s->inv_freq || !s->x || !s->xn || !s->q ||
        !s->kn || !s->vn || !s->att || !s->tmp || !s->gate || !s->up || !s->qpos || !s->last ||
        !s->scores || !s->gk || !s->gv || !s->gpos || !s->tok_in || !s->real_in || !s->logits ||
        !s->next_tok || !s->margin || !s->probe_hash || !s->lag || !s->row_pos || !s->row_n) {
        kv_ref_state_free(s);
        return kv_error_set(err, KV_ERR_INTERNAL,
                            "reference state: out of memory (batch %lld, max_len %lld)",
                            (long long)batch, (long long)max_len);
    }
    kv_rope_layer_inv_freq(c, -1, s->inv_freq); /* rope_theta's (YaRN's for gpt_oss) */
    s->rope_scale = kv_rope_scale(c);
    if (c->rope_theta_local > 0.0) {
        /* gemma3: the sliding layers' own base */
        s->inv_freq_local = kv_alloc_floats(c->head_dim / 2);
        if (s->inv_freq_local == NULL) {
            kv_ref_state_free(s);
            return kv_error_set(err, KV_ERR_INTERNAL, "reference state: out of memory");
        }
        kv_rope_inv_freq(c->head_dim, c->rope_theta_local, s->inv_freq_local);
    }
    if (variant != NULL) {
        s->variant = variant;
        KvStatus st = ref_create_caches(s, err);
        if (st != KV_OK) {
            kv_ref_state_free(s);
            return st;
        }
    }
    return KV_OK;
}

void kv_ref_state_plant(KvRefState *s, unsigned faults) {
    s->faults = faults;
    for (int64_t i = 0; s->caches != NULL && i < s->n_caches; i++) {
        if (s->caches[i] != NULL && s->variant->plant != NULL) {
            s->variant->plant(s->caches[i], faults);
        }
    }
}

/* ---- planted faults in attention (fault.h) ---- */

/* KV_FAULT_ATOMIC_REDUCTION's clock: one tick per attention op execution
 * anywhere in the process, never part of a snapshot, so the same step gives
 * different bits in a repeat, a replay or another mode, as the summation
 * order of float atomics follows thread timing. Integer atomics only. */
static _Atomic uint64_t g_fault_clock;

/* True when this attention execution sums its keys in reverse: a hashed bit
 * of the clock (a plain alternation would line up between runs whose
 * attention counts are even). */
static bool fault_clock_reversed(void) {
    uint64_t z = ++g_fault_clock;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return ((z ^ (z >> 31)) & 1u) != 0;
}

/* The window the mask applies: W, or W + 1 under KV_FAULT_WINDOW_OFF_BY_ONE
 * (admits q - W <= k). Full layers (0) stay full. */
static int64_t fault_mask_window(const KvRefState *s, int64_t window) {
    return window > 0 && (s->faults & KV_FAULT_WINDOW_OFF_BY_ONE) ? window + 1 : window;
}

/* kv_attend over nk gathered keys in ascending position, or, when reversed
 * (ensemble order KV_ORDER_KEYS_REVERSED, or the planted
 * KV_FAULT_ATOMIC_REDUCTION), the same keys summed in descending order. */
static void attend_keys(const float *q, const float **gk, const float **gv, int64_t nk,
                        int64_t hd, float scale, float cap, const float *sink, float *scores,
                        float *out, bool reversed) {
    for (int64_t i = 0; reversed && i < nk / 2; i++) {
        const float *tk = gk[i], *tv = gv[i];
        gk[i] = gk[nk - 1 - i];
        gv[i] = gv[nk - 1 - i];
        gk[nk - 1 - i] = tk;
        gv[nk - 1 - i] = tv;
    }
    if (sink != NULL) {
        kv_attend_sink(q, gk, gv, nk, hd, scale, *sink, scores, out); /* gpt_oss */
    } else {
        kv_attend(q, gk, gv, nk, hd, scale, cap, scores, out);
    }
}

/* ---- probes ---- */

void kv_probe_dump_free(KvProbeDump *d) {
    if (d == NULL) return;
    for (int64_t p = 0; d->data != NULL && p < d->n_probes; p++) free(d->data[p]);
    free(d->data);
    free(d->len);
    free(d->cap);
    memset(d, 0, sizeof *d);
}

KvStatus kv_ref_dump_enable(KvRefState *s, KvError *err) {
    const KvConfig *c = &s->model->config;
    const int64_t kv_dim = c->num_kv_heads * c->head_dim;
    const int64_t q_dim = c->num_heads * c->head_dim;
    int64_t widest = c->hidden_size > q_dim ? c->hidden_size : q_dim;
    KvProbeDump *d = &s->dump;
    kv_probe_dump_free(d);
    d->n_probes = s->n_probes;
    d->batch = s->batch;
    d->data = calloc((size_t)s->n_probes, sizeof *d->data);
    d->len = calloc((size_t)s->n_probes, sizeof *d->len);
    d->cap = calloc((size_t)s->n_probes, sizeof *d->cap);
    bool ok = d->data != NULL && d->len != NULL && d->cap != NULL;
    for (int64_t p = 0; ok && p < s->n_probes; p++) {
        /* Per row: n tokens of the probed width; logits one row of the
         * vocabulary; a cache probe up to every slot, K and V. */
        int64_t cap = s->max_chunk * widest;
        if (p == s->n_probes - 1) cap = c->vocab_size;
        if (kv_probe_item(s->n_probes, p) == KV_PROBE_CACHE) cap = s->max_len * 2 * kv_dim;
        d->cap[p] = cap;
        d->data[p] = calloc((size_t)(s->batch * cap), sizeof(float));
        ok = d->data[p] != NULL;
    }
    if (!ok) {
        kv_probe_dump_free(d);
        return kv_error_set(err, KV_ERR_INTERNAL, "probe dump: out of memory");
    }
    return KV_OK;
}

/* Keeps a probe's full values: per_row bytes of floats for each row. */
static void dump_probe(KvRefState *s, int64_t idx, const void *base, int64_t per_row) {
    KvProbeDump *d = &s->dump;
    if (d->data == NULL) return;
    const int64_t floats = per_row / (int64_t)sizeof(float);
    if (floats > d->cap[idx]) return; /* cannot happen: cap is the widest tensor */
    d->len[idx] = floats;
    for (int64_t b = 0; b < s->batch; b++) {
        memcpy(d->data[idx] + b * floats, (const unsigned char *)base + b * per_row,
               (size_t)per_row);
    }
}

/* Arguments of the per-layer ops that need only the layer and n. */
typedef struct {
    KvRefState *s;
    int64_t layer, n;
} ArgsLayerN;

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

void kv_ref_nonfinite_reset(KvRefState *s) {
    s->nonfinite_probe = s->nonfinite_row = s->nonfinite_index = -1;
    s->nonfinite_value = 0.0f;
}

/* Records the first non-finite value among `count` floats of probe idx, row
 * b, at element offset `first`, unless an earlier (probe, row, element) is
 * already recorded. A NaN or Inf anywhere in the forward is a failure in its
 * own right (a NaN compares false with every tolerance), so every probe is
 * scanned, not only the logits. */
static void probe_check_finite(KvRefState *s, int64_t idx, int64_t b, const float *v,
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

/* Hash of a buffer holding `per_row` bytes for each batch row, rows
 * consecutive: probe_hash[idx, b] = fnv1a(base + b * per_row, per_row). */
typedef struct {
    KvRefState *s;
    int64_t idx;
    const void *base;
    int64_t per_row; /* bytes */
} ArgsProbe;

static void op_probe(const void *ap) {
    const ArgsProbe *a = ap;
    KvRefState *s = a->s;
    dump_probe(s, a->idx, a->base, a->per_row);
    for (int64_t b = 0; b < s->batch; b++) {
        const unsigned char *row = (const unsigned char *)a->base + b * a->per_row;
        s->probe_hash[a->idx * s->batch + b] = kv_fnv1a(KV_FNV_OFFSET, row, (size_t)a->per_row);
        probe_check_finite(s, a->idx, b, (const float *)(const void *)row,
                           a->per_row / (int64_t)sizeof(float), 0);
    }
}

static void launch_probe(KvRefState *s, int64_t idx, const void *base, int64_t per_row) {
    if (!s->probes) return;
    ArgsProbe a = {s, idx, base, per_row};
    kv_stream_launch(&s->stream, op_probe, &a, sizeof a);
}

/* One full layer's cache-probe memo for one row (KvRefState.probe_memo). */
struct KvProbeMemo {
    int64_t n;        /* positions 0 .. n - 1 hashed into h (0: nothing memoised) */
    uint64_t h;       /* the FNV state after them */
    bool finite;      /* every value of theirs was finite (their finite check is done) */
    bool off;         /* allocation failed: always hash in full */
    float *k, *v;     /* (max_len, kv_dim) copies of the static cache's rows 0 .. n - 1 */
    uint8_t *real;    /* (max_len) copy of the row's real flags */
};

static void probe_memo_free(KvRefState *s) {
    for (int64_t i = 0; s->probe_memo != NULL && i < s->n_layers * s->batch; i++) {
        free(s->probe_memo[i].k);
        free(s->probe_memo[i].v);
        free(s->probe_memo[i].real);
    }
    free(s->probe_memo);
    s->probe_memo = NULL;
}

/* Row b of full layer l's memo, allocated on first use; NULL when it cannot
 * be (the probe then hashes in full, as without one). */
static struct KvProbeMemo *probe_memo_get(KvRefState *s, int64_t layer, int64_t b,
                                          int64_t kv_dim) {
    if (s->probe_memo == NULL) {
        s->probe_memo = calloc((size_t)(s->n_layers * s->batch), sizeof *s->probe_memo);
        if (s->probe_memo == NULL) return NULL;
    }
    struct KvProbeMemo *mm = &s->probe_memo[layer * s->batch + b];
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
static void op_probe_cache(const void *ap) {
    const ArgsLayerN *a = ap;
    KvRefState *s = a->s;
    const KvConfig *c = &s->model->config;
    const int64_t kv_dim = c->num_kv_heads * c->head_dim;
    const int64_t window = kv_config_layer_window(c, a->layer);
    const size_t row_bytes = (size_t)kv_dim * sizeof(float);
    /* Slots are found by the layout rule with every position up to next
     * stored (the probe runs after the update), as attention finds them. */
    const KvLayoutRule rule = s->variant != NULL ? s->variant->layout : KV_LAYOUT_LEFT_ALIGNED;
    const int64_t idx = kv_probe_index(a->layer, KV_PROBE_CACHE);
    /* The widest row's span (rows differ with per-row positions). */
    int64_t span = 0;
    for (int64_t b = 0; b < s->batch; b++) {
        const int64_t next = s->row_pos[b] + s->row_n[b];
        const int64_t lo = window > 0 && next - window + 1 > 0 ? next - window + 1 : 0;
        if (next - lo > span) span = next - lo;
    }
    float *dense = NULL; /* (B, span, 2, kv_dim) for the dump, NaN = not held */
    if (s->dump.data != NULL && span * 2 * kv_dim <= s->dump.cap[idx]) {
        s->dump.len[idx] = span * 2 * kv_dim;
        dense = s->dump.data[idx];
        for (int64_t i = 0; i < s->batch * s->dump.len[idx]; i++) dense[i] = NAN;
    }
    for (int64_t b = 0; b < s->batch; b++) {
        const int64_t next = s->row_pos[b] + s->row_n[b]; /* the row's next query position */
        const int64_t lo = window > 0 && next - window + 1 > 0 ? next - window + 1 : 0;
        int64_t vb = b; /* the row inside the cache's view */
        KvSlidingCache *cache = kv_ref_cache(s, a->layer, b, &vb);
        KvCacheView view = {0};
        if (cache != NULL) view = s->variant->view(cache);
        uint64_t h = KV_FNV_OFFSET;
        int64_t from = lo;
        /* A full layer's positions only grow from 0: continue last step's
         * hash when the bytes it covered are unchanged (a shift, a restored
         * snapshot or a faulted write changes them, and then the row is
         * hashed in full). Not while dumping (the dump wants every row). */
        struct KvProbeMemo *mm = NULL;
        const int64_t off0 = (a->layer * s->batch + b) * s->max_len * kv_dim;
        if (cache == NULL && window == 0 && dense == NULL) {
            mm = probe_memo_get(s, a->layer, b, kv_dim);
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
                const int64_t off = ((a->layer * s->batch + b) * s->max_len + p) * kv_dim;
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
            probe_check_finite(s, idx, b, k, kv_dim, (p - lo) * 2 * kv_dim);
            probe_check_finite(s, idx, b, v, kv_dim, (p - lo) * 2 * kv_dim + kv_dim);
            for (int64_t i = 0; mm != NULL && i < kv_dim; i++) {
                finite = finite && isfinite(k[i]) && isfinite(v[i]);
            }
            if (dense != NULL) {
                float *row = dense + b * s->dump.len[idx] + (p - lo) * 2 * kv_dim;
                memcpy(row, k, row_bytes);
                memcpy(row + kv_dim, v, row_bytes);
            }
        }
        s->probe_hash[idx * s->batch + b] = h;
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

/* ---- ops: each takes one argument struct, copied by value at launch ---- */

/* Per new token: record whether its slot is real and give it its RoPE
 * position (real tokens seen so far in the row). Reads the slot from memory. */
typedef struct {
    KvRefState *s;
    int64_t n;
    int64_t host_len; /* the host's count at launch: only the stale_scalar fault reads it */
} ArgsPositions;

static void op_positions(const void *ap) {
    const ArgsPositions *a = ap;
    KvRefState *s = a->s;
    if (s->faults & KV_FAULT_STALE_SCALAR) {
        /* Planted: the step's position comes from a kernel argument captured
         * by value, not from memory; every later op of the step reads it. */
        s->total_mem = a->host_len;
    }
    const int64_t len = s->total_mem;
    /* Planted KV_FAULT_PAD_SLOTS: trailing pads are stored like left pads. */
    const bool pad_slots = (s->faults & KV_FAULT_PAD_SLOTS) != 0;
    for (int64_t b = 0; b < s->batch; b++) {
        const int64_t pos = len - s->lag[b]; /* the row's positions so far */
        bool seen = s->n_real[b] > 0;
        int64_t m = 0; /* tokens that take a position */
        s->row_pos[b] = pos;
        for (int64_t t = 0; t < a->n; t++) {
            const int64_t r = b * a->n + t;
            const uint8_t is_real = s->real_in[r] ? 1 : 0;
            if (!is_real && seen && !pad_slots) {
                /* A trailing pad: static-shape filler, no slot, no position
                 * (only real tokens precede it in this forward, and none
                 * follows: kv_ref_check_input). */
                s->qpos[r] = 0;
                continue;
            }
            seen = seen || is_real;
            s->real[b * s->max_len + pos + m] = is_real;
            s->qpos[r] = is_real ? s->n_real[b]++ : 0;
            m++;
        }
        s->row_n[b] = m;
    }
}

/* Arguments of the ops that need only the state and the token count. */
typedef struct {
    KvRefState *s;
    int64_t n;
} ArgsStepN;

static void op_embed(const void *ap) {
    const ArgsStepN *a = ap;
    KvRefState *s = a->s;
    const KvConfig *c = &s->model->config;
    const int64_t hidden = c->hidden_size;
    const bool gemma = kv_config_gemma_style(c);
    /* gemma2/3 scale embeddings by sqrt(hidden) rounded to the activation
     * dtype (F32), as torch.tensor(hidden**0.5, dtype=...) does. */
    const float normalizer = gemma ? (float)sqrt((double)hidden) : 1.0f;
    for (int64_t r = 0; r < s->batch * a->n; r++) {
        const float *e = s->model->embed + (int64_t)s->tok_in[r] * hidden; /* (hidden) */
        for (int64_t i = 0; i < hidden; i++) {
            s->x[r * hidden + i] = gemma ? e[i] * normalizer : e[i];
        }
    }
}

typedef struct {
    const KvConfig *c;
    const float *in;  /* (rows, hidden) */
    const float *w;   /* (hidden) */
    float *out;       /* (rows, hidden); may equal in */
    int64_t rows;
} ArgsNorm;

static void op_norm_rows(const void *ap) {
    const ArgsNorm *a = ap;
    const bool offset = kv_config_gemma_style(a->c);
    const int64_t h = a->c->hidden_size;
    for (int64_t r = 0; r < a->rows; r++) {
        kv_rmsnorm(a->in + r * h, a->w, h, (float)a->c->rms_norm_eps, offset, a->out + r * h);
    }
}

typedef struct {
    const float *x; /* (rows, in) */
    const float *w; /* (out, in) */
    float *y;       /* (rows, out) */
    int64_t rows, in, out;
    int kind;       /* MM_* below */
    /* (rows) the chunk's real mask, rows = B * n, when pad rows may be
     * skipped (pad_skip_mask); NULL: every row is computed. */
    const uint8_t *real;
    int64_t n;
} ArgsMatmul;

/* Left padding: the pad rows of a prefill chunk feed nothing a real token
 * reads (attention skips pad keys and pad queries; each row's matmuls,
 * norms and activations are its own), so their matmuls can be skipped
 * without changing a real token's bits. Not while probes are recorded:
 * a probe hashes every row of the chunk, pads too, and reports keep their
 * bytes. Returns the mask to pass (real_in) or NULL. */
static const uint8_t *pad_skip_mask(const KvRefState *s, int64_t n) {
    return s->probes || n == 1 ? NULL : s->real_in;
}

/* The first real row of batch row b's chunk (n when it is all pad): every
 * real row of the chunk is in [first, n) (kv_ref_check_input: left pads
 * before, with per-row positions trailing pads after, which are computed
 * and never read). */
static int64_t chunk_first_real(const uint8_t *real /* (B * n) */, int64_t b, int64_t n) {
    int64_t f = 0;
    while (f < n && !real[b * n + f]) f++;
    return f;
}

/* How a matmul sums: the canonical pattern, TF32 inputs (planted
 * KV_FAULT_TF32) or one sequential accumulator (ensemble order
 * KV_ORDER_DOT_SEQUENTIAL). */
enum { MM_CANONICAL = 0, MM_TF32 = 1, MM_SEQUENTIAL = 2 };

static int matmul_kind(const KvRefState *s) {
    if (s->faults & KV_FAULT_TF32) return MM_TF32;
    return (s->order & KV_ORDER_DOT_SEQUENTIAL) ? MM_SEQUENTIAL : MM_CANONICAL;
}

/* y = x w^T by `kind` (TF32 out of memory for its scratch: NaN outputs, so
 * the failure cannot pass unseen). */
static void matmul_by(const float *x, const float *w, int64_t rows, int64_t in, int64_t out,
                      float *y, int kind) {
    if (kind == MM_SEQUENTIAL) {
        kv_matmul_sequential(x, w, rows, in, out, y);
    } else if (kind != MM_TF32) {
        kv_matmul(x, w, rows, in, out, y);
    } else if (kv_matmul_tf32(x, w, rows, in, out, y) != KV_OK) {
        for (int64_t i = 0; i < rows * out; i++) y[i] = NAN;
    }
}

static void op_matmul(const void *ap) {
    const ArgsMatmul *a = ap;
    if (a->real == NULL) {
        matmul_by(a->x, a->w, a->rows, a->in, a->out, a->y, a->kind);
        return;
    }
    /* Per batch row, its real rows only; pad rows of y are zeroed so that
     * what reads them (norms, the cache's pad slots) sees finite values. */
    for (int64_t r0 = 0; r0 < a->rows; r0 += a->n) {
        const int64_t f = chunk_first_real(a->real, r0 / a->n, a->n);
        memset(a->y + r0 * a->out, 0, (size_t)(f * a->out) * sizeof(float));
        if (f < a->n) {
            matmul_by(a->x + (r0 + f) * a->in, a->w, a->n - f, a->in, a->out,
                      a->y + (r0 + f) * a->out, a->kind);
        }
    }
}

/* Up to three projections of one input in one parallel region. */
typedef struct {
    const float *x;     /* (rows, in) */
    const float *w[3];  /* (out[j], in) */
    float *y[3];        /* (rows, out[j]) */
    int64_t out[3];
    int64_t rows, in;
    int count;
    int kind;           /* MM_* */
    const uint8_t *real; /* (rows) as in ArgsMatmul, or NULL */
    int64_t n;
} ArgsMatmulMulti;

static void matmul_multi_rows(const ArgsMatmulMulti *a, int64_t r0, int64_t rows) {
    const float *x = a->x + r0 * a->in; /* (rows, in) */
    if (a->kind == MM_CANONICAL) {
        float *y[3] = {NULL, NULL, NULL};
        for (int j = 0; j < a->count; j++) y[j] = a->y[j] + r0 * a->out[j];
        kv_matmul_multi(x, rows, a->in, a->count, a->w, a->out, y);
        return;
    }
    for (int j = 0; j < a->count; j++) {
        matmul_by(x, a->w[j], rows, a->in, a->out[j], a->y[j] + r0 * a->out[j], a->kind);
    }
}

static void op_matmul_multi(const void *ap) {
    const ArgsMatmulMulti *a = ap;
    if (a->real == NULL) {
        matmul_multi_rows(a, 0, a->rows);
        return;
    }
    for (int64_t r0 = 0; r0 < a->rows; r0 += a->n) { /* as op_matmul */
        const int64_t f = chunk_first_real(a->real, r0 / a->n, a->n);
        for (int j = 0; j < a->count; j++) {
            memset(a->y[j] + r0 * a->out[j], 0, (size_t)(f * a->out[j]) * sizeof(float));
        }
        if (f < a->n) matmul_multi_rows(a, r0 + f, a->n - f);
    }
}


/* y[r, :] += b for every row: a projection's bias (qwen2's q/k/v), added
 * after the matmul, as torch's linear adds it to the finished product. */
typedef struct {
    float *y;       /* (rows, out) */
    const float *b; /* (out) */
    int64_t rows, out;
} ArgsBias;

static void op_bias_rows(const void *ap) {
    const ArgsBias *a = ap;
    for (int64_t r = 0; r < a->rows; r++) {
        for (int64_t i = 0; i < a->out; i++) a->y[r * a->out + i] += a->b[i];
    }
}

/* gemma3's q_norm / k_norm: a (1 + w) RMSNorm over each head's head_dim
 * values of q and of the new keys, in place, before RoPE. */
typedef struct {
    KvRefState *s;
    int64_t n;
    const float *q_norm; /* (head_dim) */
    const float *k_norm; /* (head_dim) */
} ArgsQkNorm;

static void op_qk_norm(const void *ap) {
    const ArgsQkNorm *a = ap;
    KvRefState *s = a->s;
    const KvConfig *c = &s->model->config;
    const int64_t hd = c->head_dim;
    const float eps = (float)c->rms_norm_eps;
    for (int64_t r = 0; r < s->batch * a->n; r++) {
        for (int64_t h = 0; h < c->num_heads; h++) {
            float *x = s->q + (r * c->num_heads + h) * hd; /* (head_dim) */
            kv_rmsnorm(x, a->q_norm, hd, eps, true, x);
        }
        for (int64_t h = 0; h < c->num_kv_heads; h++) {
            float *x = s->kn + (r * c->num_kv_heads + h) * hd; /* (head_dim) */
            kv_rmsnorm(x, a->k_norm, hd, eps, true, x);
        }
    }
}

typedef struct {
    KvRefState *s;
    int64_t n;
    const float *inv_freq; /* (head_dim / 2) the layer's: gemma3's sliding layers have their own */
    float scale;           /* on cos and sin: YaRN's attention factor, else 1 */
} ArgsRope;

static void op_rope(const void *ap) {
    const ArgsRope *a = ap;
    KvRefState *s = a->s;
    const KvConfig *c = &s->model->config;
    const int64_t hd = c->head_dim;
    const int64_t q_dim = c->num_heads * hd;
    const int64_t kv_dim = c->num_kv_heads * hd;
    for (int64_t r = 0; r < s->batch * a->n; r++) {
        for (int64_t h = 0; h < c->num_heads; h++) {
            kv_rope_apply_scaled(s->q + r * q_dim + h * hd, hd, a->inv_freq, s->qpos[r], a->scale);
        }
        for (int64_t h = 0; h < c->num_kv_heads; h++) {
            kv_rope_apply_scaled(s->kn + r * kv_dim + h * hd, hd, a->inv_freq, s->qpos[r],
                                 a->scale);
        }
    }
}

/* Threads for an attention op of about `work` flops: 1 below the parallel
 * threshold, else the team, at most one per scratch slot. */
static int attn_threads(const KvRefState *s, int64_t work) {
#ifdef _OPENMP
    if (work < kv_parallel_min_work()) return 1;
    int nt = omp_get_max_threads();
    return nt > s->n_scratch ? (int)s->n_scratch : nt;
#else
    (void)s;
    (void)work;
    return 1;
#endif
}

/* This thread's attention scratch slot. */
static int64_t attn_slot(void) {
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}

/* Full (static) cache: store the new K/V at slot = position. */
static void op_store_static(const void *ap) {
    const ArgsLayerN *a = ap;
    KvRefState *s = a->s;
    const KvConfig *c = &s->model->config;
    const int64_t kv_dim = c->num_kv_heads * c->head_dim;
    float *kc = s->k + a->layer * s->batch * s->max_len * kv_dim; /* (B, max_len, kv_dim) */
    float *vc = s->v + a->layer * s->batch * s->max_len * kv_dim; /* (B, max_len, kv_dim) */
    for (int64_t b = 0; b < s->batch; b++) {
        for (int64_t t = 0; t < s->row_n[b]; t++) {
            const int64_t slot = s->row_pos[b] + t;
            memcpy(kc + (b * s->max_len + slot) * kv_dim, s->kn + (b * a->n + t) * kv_dim,
                   (size_t)kv_dim * sizeof(float));
            memcpy(vc + (b * s->max_len + slot) * kv_dim, s->vn + (b * a->n + t) * kv_dim,
                   (size_t)kv_dim * sizeof(float));
        }
    }
}

/* Attention over the static cache (slot = position), which already holds the
 * new keys: keys are visited in ascending slot order, i.e. ascending
 * position, the canonical key order. */
static void op_attn_static(const void *ap) {
    const ArgsLayerN *a = ap;
    KvRefState *s = a->s;
    const KvConfig *c = &s->model->config;
    const int64_t hd = c->head_dim;
    const int64_t kv_dim = c->num_kv_heads * hd;
    const int64_t q_dim = c->num_heads * hd;
    const int64_t window = fault_mask_window(s, kv_config_layer_window(c, a->layer));
    const float *sinks = s->model->layers[a->layer].sinks; /* (num_heads) gpt_oss, else NULL */
    const float scale = kv_config_attn_scale(c);
    const float cap = (float)c->attn_logit_softcapping;
    /* Descending key order: the ensemble order KV_ORDER_KEYS_REVERSED, or
     * the planted atomic_reduction fault at the clock's whim. */
    const bool reversed = (s->order & KV_ORDER_KEYS_REVERSED) != 0 ||
                          ((s->faults & KV_FAULT_ATOMIC_REDUCTION) && fault_clock_reversed());
    const float *kc = s->k + a->layer * s->batch * s->max_len * kv_dim; /* (B, max_len, kv_dim) */
    const float *vc = s->v + a->layer * s->batch * s->max_len * kv_dim; /* (B, max_len, kv_dim) */
    const int64_t len = s->total_mem;
    const int64_t n = a->n;
    const int64_t items = s->batch * n * c->num_heads;
    const int nt = attn_threads(s, 2 * items * (len + n) * hd);

    /* One item per (row, query, head), in any thread: each item's keys and
     * sums are its own, so the bits do not depend on who runs it. Dynamic
     * schedule: a later query sees more keys. */
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        const int64_t slot = attn_slot();
        const float **gk = s->gk + slot * s->max_keys; /* (max_keys) */
        const float **gv = s->gv + slot * s->max_keys; /* (max_keys) */
        float *scores = s->scores + slot * s->max_keys; /* (max_keys) */
#pragma omp for schedule(dynamic, 1)
        for (int64_t it = 0; it < items; it++) {
            const int64_t h = it % c->num_heads;
            const int64_t r = it / c->num_heads; /* b * n + t */
            const int64_t b = r / n, t = r % n;
            const uint8_t *real = s->real + b * s->max_len; /* (max_len) */
            const int64_t qs = s->row_pos[b] + t; /* the query's slot (= cache position) */
            const int64_t kvh = kv_gqa_kv_head(h, c->num_heads, c->num_kv_heads);
            int64_t nk = 0;
            /* A pad query (left or trailing) sees nothing; its output is
             * never used. */
            const bool q_real = t < s->row_n[b] && real[qs];
            for (int64_t k = 0; q_real && k <= qs; k++) {
                if (!real[k] || !kv_window_visible(qs, k, window)) continue;
                gk[nk] = kc + (b * s->max_len + k) * kv_dim + kvh * hd;
                gv[nk] = vc + (b * s->max_len + k) * kv_dim + kvh * hd;
                nk++;
            }
            attend_keys(s->q + r * q_dim + h * hd, gk, gv, nk, hd, scale, cap,
                        sinks != NULL ? &sinks[h] : NULL, scores, s->att + r * q_dim + h * hd,
                        reversed);
        }
    }
}

/* A variant's cache update. host_total is frozen at capture on purpose (see
 * the file comment); positions come from memory through &total_mem. */
typedef struct {
    KvRefState *s;
    int64_t layer, n, host_total;
    /* per_row: each row's host count (positions stored), frozen likewise */
    int64_t host_rows[KV_PER_ROW_MAX];
} ArgsCacheUpdate;

static void op_cache_update(const void *ap) {
    const ArgsCacheUpdate *a = ap;
    KvRefState *s = a->s;
    if (!s->per_row) {
        s->variant->update(s->caches[a->layer], s->kn, s->vn, s->real_in, a->n, &s->total_mem,
                           a->host_total);
        return;
    }
    /* Each row's own cache takes the row's tokens that take positions (its
     * first row_n), at the row's own position from memory. */
    const int64_t kv_dim = s->model->config.num_kv_heads * s->model->config.head_dim;
    for (int64_t b = 0; b < s->batch; b++) {
        if (s->row_n[b] < 1) continue;
        s->variant->update(kv_ref_cache(s, a->layer, b, NULL), s->kn + b * a->n * kv_dim,
                           s->vn + b * a->n * kv_dim, s->real_in + b * a->n, s->row_n[b],
                           &s->row_pos[b], a->host_rows[b]);
    }
}

/* Attention over a variant's view of a sliding layer plus (include_new) the
 * new keys. n_slots is the attended length frozen at capture (the "shape"
 * baked into a graph; the dynamic variant re-captures when it grows). Slots
 * may hold positions in any order (ring, always_roll): each slot's position
 * comes from the layout rule, keys are gathered and sorted by it, so the
 * reduction order is the reference's. */
typedef struct {
    KvRefState *s;
    int64_t layer, n, n_slots;
    bool include_new;
} ArgsAttnVariant;

static void op_attn_variant(const void *ap) {
    const ArgsAttnVariant *a = ap;
    KvRefState *s = a->s;
    const KvConfig *c = &s->model->config;
    const int64_t hd = c->head_dim;
    const int64_t kv_dim = c->num_kv_heads * hd;
    const int64_t q_dim = c->num_heads * hd;
    const int64_t window = fault_mask_window(s, kv_config_layer_window(c, a->layer));
    const float *sinks = s->model->layers[a->layer].sinks; /* (num_heads) gpt_oss, else NULL */
    const float scale = kv_config_attn_scale(c);
    const float cap = (float)c->attn_logit_softcapping;
    /* Descending key order: the ensemble order KV_ORDER_KEYS_REVERSED, or
     * the planted atomic_reduction fault at the clock's whim. */
    const bool reversed = (s->order & KV_ORDER_KEYS_REVERSED) != 0 ||
                          ((s->faults & KV_FAULT_ATOMIC_REDUCTION) && fault_clock_reversed());
    /* KV_FAULT_UNWRITTEN_SLOT: the mask forgets slot validity, so an empty
     * slot (position -1, NaN since reset) is gathered like a key. */
    const bool unwritten = (s->faults & KV_FAULT_UNWRITTEN_SLOT) != 0;
    /* Each row's view: the layer's one cache, or the row's own (per_row). */
    KvCacheView views[KV_PER_ROW_MAX];
    const int64_t n_views = s->per_row ? s->batch : 1;
    for (int64_t i = 0; i < n_views; i++) {
        views[i] = s->variant->view(kv_ref_cache(s, a->layer, i, NULL));
    }
    const int64_t n = a->n;
    /* Slot i's position by the variant's layout rule (layout.h), as a real
     * kernel finds it: positions stored so far are len, plus this step's n
     * when the update ran first. view.pos is the writer's record and is not
     * read here; the cache probe checks it. */
    const KvLayoutRule rule = s->variant->layout;
    const int64_t cache_w = kv_config_layer_window(c, a->layer);

    const int64_t items = s->batch * n * c->num_heads;
    const int nt = attn_threads(s, 2 * items * (a->n_slots + n) * hd);

    /* One item per (row, query, head), in any thread (see op_attn_static). */
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
        const int64_t slot = attn_slot();
        const float **gk = s->gk + slot * s->max_keys; /* (max_keys) */
        const float **gv = s->gv + slot * s->max_keys; /* (max_keys) */
        int64_t *gp = s->gpos + slot * s->max_keys;    /* (max_keys) */
        float *scores = s->scores + slot * s->max_keys; /* (max_keys) */
#pragma omp for schedule(dynamic, 1)
        for (int64_t it = 0; it < items; it++) {
            const int64_t h = it % c->num_heads;
            const int64_t r = it / c->num_heads; /* b * n + t */
            const int64_t b = r / n, t = r % n;
            const int64_t len = s->row_pos[b]; /* the row's positions before this forward */
            const int64_t stored = a->include_new ? len : len + s->row_n[b];
            const KvCacheView *view = &views[s->per_row ? b : 0];
            const int64_t vb = s->per_row ? 0 : b; /* the row inside the view */
            /* n_slots is baked at capture (the widest row's with per_row:
             * a shorter row's extra slots are empty by its rule) */
            const int64_t n_slots = a->n_slots < view->row_stride ? a->n_slots : view->row_stride;
            const int64_t qs = len + t;
            const bool q_real = s->real_in[r] != 0 && t < s->row_n[b];
            const int64_t kvh = kv_gqa_kv_head(h, c->num_heads, c->num_kv_heads);
            int64_t nk = 0;
            for (int64_t i = 0; q_real && i < n_slots; i++) {
                const int64_t p = kv_layout_position(rule, cache_w, i, stored);
                if (!(p < 0 && unwritten)) {
                    if (p < 0 || !view->real[vb * view->row_stride + i]) continue;
                    if (!kv_window_visible(qs, p, window)) continue;
                }
                gk[nk] = view->k + (vb * view->row_stride + i) * view->dim + kvh * hd;
                gv[nk] = view->v + (vb * view->row_stride + i) * view->dim + kvh * hd;
                gp[nk] = p;
                nk++;
            }
            for (int64_t u = 0; q_real && a->include_new && u <= t; u++) {
                if (!s->real_in[b * n + u] || !kv_window_visible(qs, len + u, window)) continue;
                gk[nk] = s->kn + (b * n + u) * kv_dim + kvh * hd;
                gv[nk] = s->vn + (b * n + u) * kv_dim + kvh * hd;
                gp[nk] = len + u;
                nk++;
            }
            /* Insertion sort by position (distinct): canonical key order. */
            for (int64_t i = 1; i < nk; i++) {
                const float *ki = gk[i];
                const float *vi = gv[i];
                const int64_t pi = gp[i];
                int64_t j = i - 1;
                for (; j >= 0 && gp[j] > pi; j--) {
                    gk[j + 1] = gk[j];
                    gv[j + 1] = gv[j];
                    gp[j + 1] = gp[j];
                }
                gk[j + 1] = ki;
                gv[j + 1] = vi;
                gp[j + 1] = pi;
            }
            attend_keys(s->q + r * q_dim + h * hd, gk, gv, nk, hd, scale, cap,
                        sinks != NULL ? &sinks[h] : NULL, scores, s->att + r * q_dim + h * hd,
                        reversed);
        }
    }
}

typedef struct {
    float *x;       /* (count) */
    const float *y; /* (count) */
    int64_t count;
} ArgsAdd;

static void op_add(const void *ap) {
    const ArgsAdd *a = ap;
    for (int64_t i = 0; i < a->count; i++) a->x[i] = a->x[i] + a->y[i];
}

typedef struct {
    float *gate;     /* (count) in: gate projection, out: act(gate) * up */
    const float *up; /* (count) */
    int64_t count;
    bool gelu;       /* gemma2/3 GeGLU (tanh gelu); else SwiGLU (silu) */
} ArgsGlu;

/* A transcendental (tanh, exp) costs about as much as this many
 * multiply-adds: elementwise loops weigh their work by it against the
 * parallel threshold. */
#define KV_TRANSCENDENTAL_WORK 128

static void op_glu(const void *ap) {
    const ArgsGlu *a = ap;
    /* Elementwise: no reduction, so threads cannot change any bit. */
#pragma omp parallel for schedule(static) \
    if (a->count * KV_TRANSCENDENTAL_WORK >= kv_parallel_min_work())
    for (int64_t i = 0; i < a->count; i++) {
        const float act = a->gelu ? kv_gelu_tanh(a->gate[i]) : kv_silu(a->gate[i]);
        a->gate[i] = act * a->up[i];
    }
}

/* Final norm of each row's last token, lm_head, final softcap. */
static void op_final(const void *ap) {
    const ArgsStepN *a = ap;
    KvRefState *s = a->s;
    const KvModel *m = s->model;
    const KvConfig *c = &m->config;
    const int64_t hidden = c->hidden_size;
    for (int64_t b = 0; b < s->batch; b++) {
        /* The row's last token that took a position; a row of only trailing
         * pads keeps its last one (and so its logits). */
        if (s->row_n[b] < 1) continue;
        kv_rmsnorm(s->x + (b * a->n + s->row_n[b] - 1) * hidden, m->final_norm, hidden,
                   (float)c->rms_norm_eps, kv_config_gemma_style(c), s->last + b * hidden);
    }
    matmul_by(s->last, m->lm_head, s->batch, hidden, c->vocab_size, s->logits, matmul_kind(s));
    if (c->final_logit_softcapping > 0.0) {
        const float cap = (float)c->final_logit_softcapping;
        const int64_t count = s->batch * c->vocab_size;
#pragma omp parallel for schedule(static) \
    if (count * KV_TRANSCENDENTAL_WORK >= kv_parallel_min_work())
        for (int64_t i = 0; i < count; i++) {
            s->logits[i] = kv_softcap(s->logits[i], cap);
        }
    }
}

/* Greedy argmax into the next step's input (ties to the lowest id), then
 * the position advances by n: the last ops of a captured decode step. */

static void op_argmax_advance(const void *ap) {
    const ArgsStepN *a = ap;
    KvRefState *s = a->s;
    const int64_t vocab = s->model->config.vocab_size;
    for (int64_t b = 0; b < s->batch; b++) {
        s->next_tok[b] = kv_argmax(s->logits + b * vocab, vocab, &s->margin[b]);
        s->tok_in[b] = s->next_tok[b]; /* the next step's (B, 1) input */
        s->real_in[b] = 1;
        s->lag[b] += a->n - s->row_n[b]; /* trailing pads take no position */
    }
    s->total_mem += a->n;
}

/* ---- one forward of n tokens as a sequence of ops ---- */

/* gpt_oss's MoE block (GptOssMLP with experts_implementation "eager"),
 * s->xn (rows, hidden) into s->tmp (rows, hidden), one token at a time:
 *   router logits = W_r x + b_r; the experts_per_tok largest, by descending
 *   logit (ties to the lowest id: torch.topk leaves CPU ties unordered, so
 *   a tie at the cut is a coin toss there); their softmax weights in F32;
 *   then, over the chosen experts in ascending expert id (the eager loop's
 *   order, not the rank order), gu = W_gu x + b_gu with gate = gu[2j],
 *   up = gu[2j + 1], gate = min(gate, limit), up = clamp(up, -limit, limit),
 *   h = (up + 1) * gate * sigmoid(alpha * gate), out = W_d h + b_d, and
 *   acc = acc + out * weight, starting from 0. */
typedef struct {
    KvRefState *s;
    const KvLayerWeights *w;
    int64_t rows;
    int kind; /* MM_* */
} ArgsMoe;

static void op_moe(const void *ap) {
    const ArgsMoe *a = ap;
    KvRefState *s = a->s;
    const KvConfig *c = &s->model->config;
    const KvLayerWeights *w = a->w;
    const int64_t H = c->hidden_size, I = c->intermediate_size, E = c->num_experts;
    const int64_t K = c->experts_per_tok;
    const float limit = (float)c->swiglu_limit, alpha = (float)c->swiglu_alpha;
    for (int64_t r = 0; r < a->rows; r++) {
        const float *x = s->xn + r * H; /* (hidden) */
        float *acc = s->tmp + r * H;    /* (hidden) */
        matmul_by(x, w->router_w, 1, H, E, s->moe_logits, a->kind);
        for (int64_t e = 0; e < E; e++) s->moe_logits[e] = s->moe_logits[e] + w->router_b[e];
        /* top-k by descending logit, ties to the lowest id */
        for (int64_t k = 0; k < K; k++) {
            int64_t best = -1;
            for (int64_t e = 0; e < E; e++) {
                bool taken = false;
                for (int64_t j = 0; j < k && !taken; j++) taken = s->moe_pick[j] == e;
                if (!taken && (best < 0 || s->moe_logits[e] > s->moe_logits[best])) best = e;
            }
            s->moe_pick[k] = best;
            s->moe_weight[k] = s->moe_logits[best];
        }
        kv_softmax(s->moe_weight, K);
        for (int64_t i = 0; i < H; i++) acc[i] = 0.0f;
        for (int64_t e = 0; e < E; e++) {
            int64_t rank = -1;
            for (int64_t k = 0; k < K; k++) {
                if (s->moe_pick[k] == e) rank = k;
            }
            if (rank < 0) continue; /* not chosen for this token */
            matmul_by(x, w->experts_gate_up + e * 2 * I * H, 1, H, 2 * I, s->moe_gu, a->kind);
            const float *bgu = w->experts_gate_up_b + e * 2 * I; /* (2I) */
            for (int64_t j = 0; j < I; j++) {
                float gate = s->moe_gu[2 * j] + bgu[2 * j];
                float up = s->moe_gu[2 * j + 1] + bgu[2 * j + 1];
                gate = gate > limit ? limit : gate;
                up = up > limit ? limit : (up < -limit ? -limit : up);
                const float glu = gate * (1.0f / (1.0f + expf(-(gate * alpha))));
                s->moe_h[j] = (up + 1.0f) * glu;
            }
            matmul_by(s->moe_h, w->experts_down + e * H * I, 1, I, H, s->moe_out, a->kind);
            const float *bd = w->experts_down_b + e * H; /* (hidden) */
            const float weight = s->moe_weight[rank];
            for (int64_t i = 0; i < H; i++) acc[i] = acc[i] + (s->moe_out[i] + bd[i]) * weight;
        }
    }
}

static void launch_layer(KvRefState *s, int64_t layer, int64_t n) {
    const KvModel *m = s->model;
    const KvConfig *c = &m->config;
    const KvLayerWeights *w = &m->layers[layer];
    const int64_t rows = s->batch * n;
    const int64_t hd = c->head_dim;
    const int64_t kv_dim = c->num_kv_heads * hd;
    const int64_t q_dim = c->num_heads * hd;
    const int64_t hidden = c->hidden_size;
    const int64_t inter = c->intermediate_size;
    const bool gemma = kv_config_gemma_style(c);
    KvStream *st = &s->stream;

    ArgsNorm norm_in = {c, s->x, w->input_norm, s->xn, rows};
    kv_stream_launch(st, op_norm_rows, &norm_in, sizeof norm_in);
    const int mm = matmul_kind(s); /* MM_*: canonical, TF32 fault or ensemble order */
    const uint8_t *skip = pad_skip_mask(s, n); /* (rows) or NULL */
    ArgsMatmulMulti qkv = {s->xn, {w->wq, w->wk, w->wv}, {s->q, s->kn, s->vn},
                           {q_dim, kv_dim, kv_dim}, rows, hidden, 3, mm, skip, n};
    kv_stream_launch(st, op_matmul_multi, &qkv, sizeof qkv);
    if (c->attn_qkv_bias) {
        const ArgsBias bias[3] = {{s->q, w->bq, rows, q_dim},
                                  {s->kn, w->bk, rows, kv_dim},
                                  {s->vn, w->bv, rows, kv_dim}};
        for (int j = 0; j < 3; j++) kv_stream_launch(st, op_bias_rows, &bias[j], sizeof bias[j]);
    }
    if (c->qk_norm) {
        const ArgsQkNorm qk = {s, n, w->q_norm, w->k_norm};
        kv_stream_launch(st, op_qk_norm, &qk, sizeof qk);
    }
    const bool local = s->inv_freq_local != NULL && c->layer_sliding[layer];
    ArgsRope rope = {s, n, local ? s->inv_freq_local : s->inv_freq, s->rope_scale};
    kv_stream_launch(st, op_rope, &rope, sizeof rope);
    launch_probe(s, kv_probe_index(layer, KV_PROBE_Q), s->q, n * q_dim * (int64_t)sizeof(float));
    launch_probe(s, kv_probe_index(layer, KV_PROBE_K), s->kn, n * kv_dim * (int64_t)sizeof(float));
    launch_probe(s, kv_probe_index(layer, KV_PROBE_V), s->vn, n * kv_dim * (int64_t)sizeof(float));

    KvSlidingCache *cache = kv_ref_cache(s, layer, 0, NULL);
    if (cache != NULL) {
        /* A variant's sliding layer: its own update and view (DESIGN §3).
         * n == 1 takes the variant's fast path; n > 1 attends over the
         * cached keys plus the new ones, then stores the last min(W, seen). */
        const KvCacheOps *ops = s->variant;
        const bool after = n == 1 && ops->one_token_order == KV_ATTEND_AFTER_UPDATE;
        ArgsCacheUpdate up = {s, layer, n, s->len, {0}};
        /* The attended length is read now, at launch: a graph bakes it in.
         * Fixed-size variants always expose W slots; dynamic attends before
         * its update, so this is the length the step really attends over
         * (with per-row positions the widest row's). */
        int64_t n_slots = 0;
        for (int64_t b = 0; b < (s->per_row ? s->batch : 1); b++) {
            const int64_t v = ops->view(kv_ref_cache(s, layer, b, NULL)).n_slots;
            if (v > n_slots) n_slots = v;
            /* the host's own count of the row's positions */
            if (s->per_row) up.host_rows[b] = s->len - s->lag[b];
        }
        if (after) kv_stream_launch(st, op_cache_update, &up, sizeof up);
        ArgsAttnVariant att = {s, layer, n, n_slots, !after};
        kv_stream_launch(st, op_attn_variant, &att, sizeof att);
        if (!after) kv_stream_launch(st, op_cache_update, &up, sizeof up);
    } else {
        ArgsLayerN ln = {s, layer, n};
        kv_stream_launch(st, op_store_static, &ln, sizeof ln);
        kv_stream_launch(st, op_attn_static, &ln, sizeof ln);
    }
    if (s->probes) {
        ArgsLayerN pc = {s, layer, n};
        kv_stream_launch(st, op_probe_cache, &pc, sizeof pc);
    }
    launch_probe(s, kv_probe_index(layer, KV_PROBE_ATTN), s->att, n * q_dim * (int64_t)sizeof(float));

    ArgsMatmul mo = {s->att, w->wo, s->tmp, rows, q_dim, hidden, mm, skip, n};
    kv_stream_launch(st, op_matmul, &mo, sizeof mo);
    if (c->attn_o_bias) {
        const ArgsBias bo = {s->tmp, w->bo, rows, hidden};
        kv_stream_launch(st, op_bias_rows, &bo, sizeof bo);
    }
    ArgsAdd add = {s->x, s->tmp, rows * hidden};
    if (gemma) {
        /* h = x + post_attention_layernorm(attn(...)) */
        ArgsNorm post = {c, s->tmp, w->post_attn_norm, s->tmp, rows};
        kv_stream_launch(st, op_norm_rows, &post, sizeof post);
        kv_stream_launch(st, op_add, &add, sizeof add);
        ArgsNorm pre = {c, s->x, w->pre_ffw_norm, s->xn, rows};
        kv_stream_launch(st, op_norm_rows, &pre, sizeof pre);
    } else {
        kv_stream_launch(st, op_add, &add, sizeof add);
        ArgsNorm post = {c, s->x, w->post_attn_norm, s->xn, rows};
        kv_stream_launch(st, op_norm_rows, &post, sizeof post);
    }
    if (c->num_experts > 0) {
        const ArgsMoe moe = {s, w, rows, mm};
        kv_stream_launch(st, op_moe, &moe, sizeof moe);
    } else {
        ArgsMatmulMulti gu = {s->xn, {w->w_gate, w->w_up, NULL}, {s->gate, s->up, NULL},
                              {inter, inter, 0}, rows, hidden, 2, mm, skip, n};
        kv_stream_launch(st, op_matmul_multi, &gu, sizeof gu);
        ArgsGlu glu = {s->gate, s->up, rows * inter, gemma};
        kv_stream_launch(st, op_glu, &glu, sizeof glu);
        ArgsMatmul md = {s->gate, w->w_down, s->tmp, rows, inter, hidden, mm, skip, n};
        kv_stream_launch(st, op_matmul, &md, sizeof md);
    }
    if (gemma) {
        ArgsNorm post = {c, s->tmp, w->post_ffw_norm, s->tmp, rows};
        kv_stream_launch(st, op_norm_rows, &post, sizeof post);
    }
    launch_probe(s, kv_probe_index(layer, KV_PROBE_MLP), s->tmp, n * hidden * (int64_t)sizeof(float));
    kv_stream_launch(st, op_add, &add, sizeof add);
    launch_probe(s, kv_probe_index(layer, KV_PROBE_RESIDUAL), s->x, n * hidden * (int64_t)sizeof(float));
}

void kv_ref_launch_forward(KvRefState *s, int64_t n) {
    ArgsPositions pos = {s, n, s->len};
    kv_stream_launch(&s->stream, op_positions, &pos, sizeof pos);
    ArgsStepN emb = {s, n};
    const KvConfig *c = &s->model->config;
    kv_stream_launch(&s->stream, op_embed, &emb, sizeof emb);
    launch_probe(s, 0, s->x, n * c->hidden_size * (int64_t)sizeof(float));
    for (int64_t l = 0; l < c->num_layers; l++) launch_layer(s, l, n);
    kv_stream_launch(&s->stream, op_final, &emb, sizeof emb);
    launch_probe(s, s->n_probes - 2, s->last, c->hidden_size * (int64_t)sizeof(float));
    launch_probe(s, s->n_probes - 1, s->logits, c->vocab_size * (int64_t)sizeof(float));
    ArgsStepN adv = {s, n};
    kv_stream_launch(&s->stream, op_argmax_advance, &adv, sizeof adv);
}

KvStatus kv_ref_check_input(const KvRefState *s, const int32_t *tokens, const uint8_t *real,
                            int64_t n, KvError *err) {
    const KvConfig *c = &s->model->config;
    if (n < 1 || n > s->max_chunk || s->len + n > s->max_len) {
        return kv_error_set(err, KV_ERR_INPUT,
                            "reference forward: %lld new tokens at slot %lld exceed the state "
                            "(max_chunk %lld, max_len %lld)",
                            (long long)n, (long long)s->len, (long long)s->max_chunk,
                            (long long)s->max_len);
    }
    for (int64_t b = 0; b < s->batch; b++) {
        bool seen_real = s->n_real[b] > 0;
        bool trailing = false; /* a trailing pad seen in this forward (per_row) */
        for (int64_t t = 0; t < n; t++) {
            const int32_t tok = tokens[b * n + t];
            if (tok < 0 || tok >= c->vocab_size) {
                return kv_error_set(err, KV_ERR_INPUT,
                                    "tokens: row %lld position %lld: expected a token id in "
                                    "[0, %lld), found %d",
                                    (long long)b, (long long)(s->len + t),
                                    (long long)c->vocab_size, tok);
            }
            if (real[b * n + t]) {
                if (trailing) {
                    return kv_error_set(err, KV_ERR_INPUT,
                                        "tokens: row %lld column %lld: a real token after a "
                                        "trailing pad in one forward (a right-padded row ends "
                                        "its forward in pads)",
                                        (long long)b, (long long)(s->len + t));
                }
                seen_real = true;
            } else if (seen_real && s->per_row) {
                trailing = true;
            } else if (seen_real) {
                return kv_error_set(err, KV_ERR_INPUT,
                                    "tokens: row %lld position %lld: a pad after a real token "
                                    "(batches must be left-padded; right padding needs "
                                    "per-row positions)",
                                    (long long)b, (long long)(s->len + t));
            }
        }
    }
    return KV_OK;
}

KvStatus kv_ref_check_sentinels(const KvRefState *s, int64_t n, KvError *err) {
    if (s->caches == NULL) return KV_OK;
    for (int64_t i = 0; i < s->n_caches; i++) {
        const int64_t l = i / s->cache_rows;
        if (s->caches[i] != NULL && !s->variant->sentinels_ok(s->caches[i])) {
            return kv_error_set(err, KV_ERR_INTERNAL,
                                "%s: layer %lld: a cache sentinel region was overwritten while "
                                "storing positions %lld..%lld (out-of-bounds write)",
                                s->variant->name, (long long)l, (long long)(s->len - n),
                                (long long)(s->len - 1));
        }
    }
    return KV_OK;
}

KvStatus kv_ref_forward(const KvModel *m, KvRefState *s, const int32_t *tokens,
                        const uint8_t *real, int64_t n, float *logits, KvError *err) {
    (void)m; /* the state carries its model */
    /* Validate everything before touching the state, so a bad call leaves
     * the cache as it was. */
    KvStatus st = kv_ref_check_input(s, tokens, real, n, err);
    if (st != KV_OK) return st;
    memcpy(s->tok_in, tokens, (size_t)(s->batch * n) * sizeof *tokens);
    memcpy(s->real_in, real, (size_t)(s->batch * n));
    kv_ref_launch_forward(s, n);
    s->len += n;
    st = kv_ref_check_sentinels(s, n, err);
    if (st != KV_OK) return st;
    if (logits != NULL) {
        memcpy(logits, s->logits, (size_t)(s->batch * s->model->config.vocab_size) * sizeof(float));
    }
    return KV_OK;
}
