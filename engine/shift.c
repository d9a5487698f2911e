/* shift.c: the context shift (cpu_state.h kv_cpu_shift, DESIGN §5): drop a
 * span of old positions, move the later ones down, re-rotate their keys.
 *
 * Why the keys are re-rotated and not recomputed: an engine's cache holds
 * keys after RoPE, and the tokens that produced them are gone from its
 * inputs; llama.cpp's K-shift applies RoPE(-d) to the stored keys. That is
 * RoPE(p) then RoPE(-d), which is not bitwise RoPE(p - d): a shifted run is
 * compared with a fresh run of the shifted context by a tolerance of its own
 * (comparison shifted_vs_fresh), while every variant must still equal the
 * reference's shifted run bitwise (both re-rotate the same keys the same
 * way). The buffer-level steps (shift.h) are shared with the CUDA backend. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_state.h"
#include "fault.h"
#include "kvmath.h"
#include "shift.h"

/* RoPE(-d) on every head of one stored key row. */
static void shift_rotate(float *k /* (kv_dim) */, const KvConfig *c, const float *inv_freq,
                         int64_t d) {
    for (int64_t h = 0; h < c->num_kv_heads; h++) {
        kv_rope_apply(k + h * c->head_dim, c->head_dim, inv_freq, -d);
    }
}

KvStatus kv_shift_check(const KvConfig *c, int64_t stored, int64_t keep, int64_t drop,
                        KvError *err) {
    const int64_t w_max = kv_config_max_window(c);
    if (keep < 0 || drop < 1 || keep + drop > stored - w_max) {
        return kv_error_set(err, KV_ERR_INPUT,
                            "context shift: expected keep >= 0, drop >= 1 and keep + drop <= "
                            "positions stored (%lld) - the largest window (%lld); found keep "
                            "%lld, drop %lld",
                            (long long)stored, (long long)w_max, (long long)keep, (long long)drop);
    }
    return KV_OK;
}

void kv_shift_real(uint8_t *real_all /* (B, L) */, int64_t *n_real /* (B) */, int64_t B,
                   int64_t L, int64_t keep, int64_t drop, int64_t T, int64_t *dropped /* (B) */) {
    for (int64_t b = 0; b < B; b++) {
        uint8_t *real = real_all + b * L; /* (L) */
        dropped[b] = 0;
        for (int64_t j = keep; j < keep + drop; j++) dropped[b] += real[j];
        memmove(real + keep, real + keep + drop, (size_t)(T - keep - drop));
        memset(real + T - drop, 0, (size_t)drop);
        n_real[b] -= dropped[b];
    }
}

void kv_shift_static(float *k_all /* (B, L, kv_dim) */, float *v_all /* (B, L, kv_dim) */,
                     int64_t B, int64_t L, const KvConfig *c, const float *inv_freq, int64_t keep,
                     int64_t drop, int64_t T, const int64_t *d /* (B) */) {
    const int64_t kvd = c->num_kv_heads * c->head_dim;
    for (int64_t b = 0; b < B; b++) {
        float *k = k_all + b * L * kvd; /* (L, kv_dim) */
        float *v = v_all + b * L * kvd; /* (L, kv_dim) */
        const int64_t moved = T - keep - drop;
        memmove(k + keep * kvd, k + (keep + drop) * kvd, (size_t)(moved * kvd) * sizeof *k);
        memmove(v + keep * kvd, v + (keep + drop) * kvd, (size_t)(moved * kvd) * sizeof *v);
        for (int64_t j = keep; j < T - drop && d[b] > 0; j++) {
            shift_rotate(k + j * kvd, c, inv_freq, d[b]);
        }
        memset(k + (T - drop) * kvd, 0, (size_t)(drop * kvd) * sizeof *k);
        memset(v + (T - drop) * kvd, 0, (size_t)(drop * kvd) * sizeof *v);
    }
}

KvStatus kv_shift_slots(const KvCacheState *cs, KvLayoutRule rule, int64_t w, const KvConfig *c,
                        const float *inv_freq, int64_t drop, int64_t T,
                        const int64_t *d /* (B) */, unsigned faults, int64_t layer,
                        const char *variant, KvError *err) {
    const int64_t B = cs->batch, S = cs->slots, D = cs->dim;
    KvStatus st = KV_OK;
    float *k = malloc((size_t)(B * S * D > 0 ? B * S * D : 1) * sizeof *k);  /* (B, S, D) */
    float *v = malloc((size_t)(B * S * D > 0 ? B * S * D : 1) * sizeof *v);  /* (B, S, D) */
    uint8_t *real = calloc((size_t)(B * S > 0 ? B * S : 1), 1);               /* (B, S) */
    int64_t *pos = malloc((size_t)(S > 0 ? S : 1) * sizeof *pos);             /* (S) */
    int64_t *slot_of = malloc((size_t)(w > 0 ? w : 1) * sizeof *slot_of);     /* (w) */
    if (!k || !v || !real || !pos || !slot_of) {
        st = kv_error_set(err, KV_ERR_INTERNAL, "context shift: out of memory");
        goto cleanup;
    }
    for (int64_t i = 0; i < B * S * D; i++) k[i] = v[i] = NAN;
    for (int64_t i = 0; i < S; i++) pos[i] = -1;
    /* Where the rule puts each position of the new window [lo, lo + w). */
    const int64_t lo = T - drop - w;
    for (int64_t p = 0; p < w; p++) slot_of[p] = -1;
    for (int64_t j = 0; j < S; j++) {
        const int64_t p = kv_layout_position(rule, w, j, T - drop);
        if (p >= lo && p < lo + w) slot_of[p - lo] = j;
    }
    for (int64_t i = 0; i < S; i++) {
        const int64_t p = kv_layout_position(rule, w, i, T);
        if (p < 0) continue;
        const int64_t np = p - drop;
        const int64_t j = (faults & KV_FAULT_SHIFT_CELLS)                    ? i
                          : np >= lo && np < lo + w && slot_of[np - lo] >= 0 ? slot_of[np - lo]
                                                                             : -1;
        if (j < 0 && faults != 0) continue; /* a faulted count (stale_scalar): freed */
        if (j < 0) {
            st = kv_error_set(err, KV_ERR_INTERNAL,
                              "context shift: layer %lld (%s): no slot for position %lld after "
                              "the shift",
                              (long long)layer, variant, (long long)np);
            goto cleanup;
        }
        pos[j] = np;
        for (int64_t b = 0; b < B; b++) {
            memcpy(k + (b * S + j) * D, cs->k + (b * S + i) * D, (size_t)D * sizeof *k);
            memcpy(v + (b * S + j) * D, cs->v + (b * S + i) * D, (size_t)D * sizeof *v);
            real[b * S + j] = cs->real[b * S + i];
            if (d[b] > 0) shift_rotate(k + (b * S + j) * D, c, inv_freq, d[b]);
        }
    }
    memcpy(cs->k, k, (size_t)(B * S * D) * sizeof *k);
    memcpy(cs->v, v, (size_t)(B * S * D) * sizeof *v);
    memcpy(cs->real, real, (size_t)(B * S));
    memcpy(cs->pos, pos, (size_t)S * sizeof *pos);
cleanup:
    free(k);
    free(v);
    free(real);
    free(pos);
    free(slot_of);
    return st;
}

KvStatus kv_cpu_shift(KvCpuState *cs, int64_t keep, int64_t drop, KvError *err) {
    KvRefState *s = &cs->ref;
    const KvConfig *c = &s->model->config;
    /* The memory side shifts what memory holds (total_mem); the host
     * checked its own count (len). They differ only under a planted fault
     * that freezes the count into a graph (stale_scalar). */
    const int64_t T = s->total_mem, B = s->batch;
    if (cs->per_row) {
        return kv_error_set(err, KV_ERR_INPUT, "context shift: rows at their own positions "
                            "(right padding) are not shifted");
    }
    KvStatus st = kv_shift_check(c, s->len, keep, drop, err);
    if (st != KV_OK) return st;
    if (T < keep + drop) {
        /* Only under a planted fault: memory holds too few positions to
         * shift, so the memory side finds nothing to move. */
        s->len -= drop;
        return KV_OK;
    }
    int64_t *dropped = calloc((size_t)B, sizeof *dropped); /* (B) real tokens dropped per row */
    if (dropped == NULL) return kv_error_set(err, KV_ERR_INTERNAL, "context shift: out of memory");
    kv_shift_real(s->real, s->n_real, B, s->max_len, keep, drop, T, dropped);
    for (int64_t l = 0; l < c->num_layers && st == KV_OK; l++) {
        const int64_t w = kv_config_layer_window(c, l);
        KvSlidingCache *cache = kv_cpu_cache(cs, l, 0, NULL);
        if (cache != NULL) {
            const KvCacheState state = cs->variant->state(cache);
            st = kv_shift_slots(&state, cs->variant->layout, w, c, kv_ref_layer_inv_freq(s, l),
                                drop, T, dropped, cs->faults, l, cs->variant->name, err);
        } else {
            const int64_t kvd = c->num_kv_heads * c->head_dim;
            kv_shift_static(s->k + l * B * s->max_len * kvd, s->v + l * B * s->max_len * kvd, B,
                            s->max_len, c, kv_ref_layer_inv_freq(s, l), keep, drop, T, dropped);
        }
    }
    free(dropped);
    if (st != KV_OK) return st;
    s->len -= drop;
    s->total_mem -= drop;
    return KV_OK;
}
