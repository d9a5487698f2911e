/* cpu_probe.c: the probes of a CPU run (probe.h, DESIGN §6), as the
 * observer installed in the reference's hooks (KvRefHooks.observe): each
 * named intermediate is hashed per row, checked for NaN and Inf and, on
 * request, kept whole; the cache probe reads the run's caches itself, by
 * each layer's layout rule. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_state.h"
#include "probe.h"
#include "prng.h"

/* Entries hashed side by side below this many (the fork costs more). */
#define ENTRY_PARALLEL_MIN 64

/* e = the position's slice: FNV-1a over p, then (only when the slot's
 * recorded position is not the rule's, the independent check: a correct
 * variant hashes exactly as the reference does) the record, then K and V.
 * Four entries at a time when none carries a record. */
static void probe_entries(KvProbeEntry *ent, int64_t n, size_t row_bytes) {
    const int64_t groups = (n + 3) / 4;
#pragma omp parallel for schedule(static) if (n >= ENTRY_PARALLEL_MIN)
    for (int64_t g = 0; g < groups; g++) {
        const int64_t i = 4 * g;
        bool plain = i + 4 <= n;
        for (int64_t j = i; plain && j < i + 4; j++) plain = ent[j].rec == ent[j].p;
        if (plain) {
            uint64_t hx[4] = {KV_FNV_OFFSET, KV_FNV_OFFSET, KV_FNV_OFFSET, KV_FNV_OFFSET};
            const void *px[4];
            for (int j = 0; j < 4; j++) px[j] = &ent[i + j].p;
            kv_fnv1a_x4(hx, px, sizeof ent[i].p);
            for (int j = 0; j < 4; j++) px[j] = ent[i + j].k;
            kv_fnv1a_x4(hx, px, row_bytes);
            for (int j = 0; j < 4; j++) px[j] = ent[i + j].v;
            kv_fnv1a_x4(hx, px, row_bytes);
            for (int j = 0; j < 4; j++) ent[i + j].e = hx[j];
            continue;
        }
        for (int64_t j = i; j < n && j < i + 4; j++) {
            uint64_t e = kv_fnv1a(KV_FNV_OFFSET, &ent[j].p, sizeof ent[j].p);
            if (ent[j].rec != ent[j].p) e = kv_fnv1a(e, &ent[j].rec, sizeof ent[j].rec);
            e = kv_fnv1a(e, ent[j].k, row_bytes);
            ent[j].e = kv_fnv1a(e, ent[j].v, row_bytes);
        }
    }
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
        KvProbeMemo *mm = NULL;
        const int64_t off0 = (layer * s->batch + b) * s->max_len * kv_dim;
        if (cache == NULL && window == 0 && dense == NULL) {
            mm = kv_probes_memo(pr, layer, b, kv_dim);
        }
        if (mm != NULL && mm->n > 0 && mm->n <= next && mm->finite &&
            memcmp(mm->real, s->real + b * s->max_len, (size_t)mm->n) == 0 &&
            memcmp(mm->k, s->k + off0, (size_t)(mm->n * kv_dim) * sizeof(float)) == 0 &&
            memcmp(mm->v, s->v + off0, (size_t)(mm->n * kv_dim) * sizeof(float)) == 0) {
            from = mm->n;
            h = mm->h;
        }
        /* Each position's entry (its slot's K and V, one slice) is hashed on
         * its own, so the entries are found first, hashed side by side
         * (probe_entries), and then folded in position order. */
        const int64_t count = next - from;
        int64_t nj = 0; /* entries found */
        KvProbeEntry *ent = pr->entries; /* (max_len >= next - from) */
        if (cache == NULL) {
            for (int64_t p = from; p < next; p++) {
                if (!s->real[b * s->max_len + p]) continue;
                const int64_t off = ((layer * s->batch + b) * s->max_len + p) * kv_dim;
                ent[nj++] = (KvProbeEntry){.k = s->k + off, .v = s->v + off, .p = p, .rec = p};
            }
        } else {
            /* the first slot (ascending) whose rule position is p, as
             * attention finds it: a slot per position, marked by one pass */
            for (int64_t j = 0; j < count; j++) ent[j].k = NULL;
            for (int64_t i = 0; i < view.n_slots; i++) {
                const int64_t p = kv_layout_position(rule, window, i, next);
                if (p < from || p >= next || ent[p - from].k != NULL ||
                    !view.real[vb * view.row_stride + i])
                    continue;
                ent[p - from] = (KvProbeEntry){.k = view.k + (vb * view.row_stride + i) * view.dim,
                                               .v = view.v + (vb * view.row_stride + i) * view.dim,
                                               .p = p, .rec = view.pos[i]};
            }
            /* missing from the cache: the hash shows it */
            for (int64_t j = 0; j < count; j++) {
                if (ent[j].k != NULL) ent[nj++] = ent[j];
            }
        }
        probe_entries(ent, nj, row_bytes);
        bool finite = true;
        for (int64_t j = 0; j < nj; j++) {
            const float *k = ent[j].k, *v = ent[j].v;
            const int64_t p = ent[j].p;
            h = kv_probe_fold(h, ent[j].e);
            /* Elements counted as in the dump: (p - lo, {K, V}, kv_dim). */
            kv_probes_check_finite(pr, idx, b, k, kv_dim, (p - lo) * 2 * kv_dim);
            kv_probes_check_finite(pr, idx, b, v, kv_dim, (p - lo) * 2 * kv_dim + kv_dim);
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

/* The probe index of a named intermediate. */
static int64_t probe_of_point(const KvProbes *pr, int64_t layer, KvPoint point) {
    switch (point) {
    case KV_POINT_EMBED: return 0;
    case KV_POINT_FINAL_NORM: return pr->n_probes - 2;
    case KV_POINT_LOGITS: return pr->n_probes - 1;
    default: return kv_probe_index(layer, (int)point - (int)KV_POINT_Q);
    }
}

/* The prefix cuts of probe idx (KvProbes.cut): its hash over each cut's
 * first tokens, and after the last layer the cut rows of the residual
 * stream. One row, cut_total tokens. */
static void probe_cut(KvProbes *pr, const KvRefState *s, int64_t layer, KvPoint point,
                      int64_t idx, const void *base, int64_t per_row) {
    if (point == KV_POINT_FINAL_NORM || point == KV_POINT_LOGITS) return;
    const size_t per_token = (size_t)per_row / (size_t)pr->cut_total;
    size_t bytes[KV_PROBE_CUT_MAX];
    uint64_t h[KV_PROBE_CUT_MAX];
    for (int64_t j = 0; j < pr->n_cut; j++) bytes[j] = (size_t)pr->cut[j] * per_token;
    kv_probe_hash_prefixes(base, (size_t)per_row, bytes, pr->n_cut, h);
    for (int64_t j = 0; j < pr->n_cut; j++) pr->cut_hash[j * pr->n_probes + idx] = h[j];
    if (point == KV_POINT_RESIDUAL && layer == pr->n_layers - 1) {
        const int64_t hidden = s->model->config.hidden_size;
        for (int64_t j = 0; j < pr->n_cut; j++) {
            memcpy(pr->cut_x + j * hidden, (const float *)base + (pr->cut[j] - 1) * hidden,
                   (size_t)hidden * sizeof(float));
        }
    }
}

static void cpu_probe_observe(void *ctx, KvRefState *s, int64_t layer, KvPoint point,
                          const void *base, int64_t per_row) {
    KvCpuState *cs = ctx;
    KvProbes *pr = &cs->probes;
    (void)s; /* cs->ref */
    if (point == KV_POINT_CACHE) {
        probe_cache(cs, layer);
        return;
    }
    /* probe_hash[idx, b] = the two-level hash of row b's per_row bytes */
    const int64_t idx = probe_of_point(pr, layer, point);
    kv_probes_dump_rows(&pr->dump, idx, base, per_row);
    for (int64_t b = 0; b < pr->batch; b++) {
        const unsigned char *row = (const unsigned char *)base + b * per_row;
        pr->hash[idx * pr->batch + b] = kv_probe_hash_bytes(row, (size_t)per_row);
        kv_probes_check_finite(pr, idx, b, (const float *)(const void *)row,
                           per_row / (int64_t)sizeof(float), 0);
    }
    if (pr->n_cut > 0 && pr->batch == 1) probe_cut(pr, s, layer, point, idx, base, per_row);
    if (point == KV_POINT_RESIDUAL && pr->on_layer != NULL) pr->on_layer(pr->on_layer_ctx, layer);
}

KvStatus kv_cpu_state_probe(KvCpuState *cs, bool dump, KvError *err) {
    cs->probes.on = true;
    cs->observer = cpu_probe_observe;
    kv_cpu_state_hooks_update(cs);
    return dump ? kv_probes_dump_enable(&cs->probes, &cs->ref.model->config, cs->ref.max_chunk,
                                        err)
                : KV_OK;
}
