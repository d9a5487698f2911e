/* cpu_state.c: a CPU run (cpu_state.h): the reference's state, the variant
 * caches, and the hook table that plugs caches, probes, planted faults and
 * calibration orders into the reference. The faults that emulate engine
 * bugs in the forward (fault.h: stale_scalar, atomic_reduction,
 * window_off_by_one, tf32, pad_slots) are planted here, as hooks. */
#include "cpu_state.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ensemble.h"
#include "fault.h"
#include "kvmath.h"

/* ---- planted faults and calibration orders, as hooks ---- */

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

/* Descending key order: the calibration order KV_ORDER_KEYS_REVERSED, or
 * the planted atomic_reduction at the clock's whim. */
static bool cpu_keys_descending(void *ctx) {
    const KvCpuState *cs = ctx;
    return (cs->order & KV_ORDER_KEYS_REVERSED) != 0 ||
           ((cs->faults & KV_FAULT_ATOMIC_REDUCTION) && fault_clock_reversed());
}

/* KV_FAULT_WINDOW_OFF_BY_ONE: the mask admits q - W <= k (W + 1 keys); full
 * layers (0) stay full. */
static int64_t cpu_mask_window(void *ctx, int64_t window) {
    (void)ctx;
    return window > 0 ? window + 1 : window;
}

/* KV_FAULT_TF32: every matmul input rounded to TF32 (out of memory for its
 * scratch: NaN outputs, so the failure cannot pass unseen). */
static void cpu_matmul_tf32(const float *x, KvMat w, int64_t rows, int64_t in, int64_t out,
                            float *y) {
    if (kv_matmul_tf32(x, w, rows, in, out, y) != KV_OK) {
        for (int64_t i = 0; i < rows * out; i++) y[i] = NAN;
    }
}

typedef struct {
    KvRefState *s;
    int64_t n;
    int64_t host_len; /* the host's count at launch, frozen into a graph */
    bool stale;       /* KV_FAULT_STALE_SCALAR */
    bool pad_slots;   /* KV_FAULT_PAD_SLOTS */
} ArgsPositions;

/* The positions op under a planted fault. KV_FAULT_STALE_SCALAR: the step's
 * position comes from a kernel argument captured by value, not from memory;
 * every later op of the step reads it. KV_FAULT_PAD_SLOTS: trailing pads
 * are stored like left pads (seed 002, transformers #44742). */
static void op_positions_planted(const void *ap) {
    const ArgsPositions *a = ap;
    if (a->stale) a->s->total_mem = a->host_len;
    kv_ref_place_tokens(a->s, a->n, a->pad_slots);
}

static bool cpu_launch_positions(void *ctx, KvRefState *s, int64_t n) {
    const KvCpuState *cs = ctx;
    const ArgsPositions a = {s, n, s->len, (cs->faults & KV_FAULT_STALE_SCALAR) != 0,
                             (cs->faults & KV_FAULT_PAD_SLOTS) != 0};
    kv_stream_launch(&s->stream, op_positions_planted, &a, sizeof a);
    return true;
}

/* The hook table for the run's variant, probes, faults and order. */
void kv_cpu_state_hooks_update(KvCpuState *cs) {
    KvRefHooks *h = &cs->hooks;
    memset(h, 0, sizeof *h);
    h->ctx = cs;
    h->observe = cs->observer;
    if (cs->faults & KV_FAULT_TF32) {
        h->matmul = cpu_matmul_tf32;
    } else if (cs->order & KV_ORDER_DOT_SEQUENTIAL) {
        h->matmul = kv_matmul_sequential;
    }
    if ((cs->order & KV_ORDER_KEYS_REVERSED) || (cs->faults & KV_FAULT_ATOMIC_REDUCTION)) {
        h->keys_descending = cpu_keys_descending;
    }
    if (cs->faults & KV_FAULT_WINDOW_OFF_BY_ONE) h->mask_window = cpu_mask_window;
    if (cs->variant != NULL) h->launch_attention = kv_cpu_launch_attention;
    if (cs->faults & (KV_FAULT_STALE_SCALAR | KV_FAULT_PAD_SLOTS)) {
        h->launch_positions = cpu_launch_positions;
    }
    cs->ref.hooks = h;
}

/* ---- the variant caches ---- */

static void cpu_free_caches(KvCpuState *cs) {
    if (cs->caches != NULL) {
        for (int64_t i = 0; i < cs->n_caches; i++) {
            if (cs->caches[i] != NULL) cs->variant->destroy(cs->caches[i]);
        }
        free(cs->caches);
    }
    cs->caches = NULL;
    cs->n_caches = 0;
}

/* Creates every sliding layer's cache(s) for cs->variant: one of B rows per
 * layer, or with per_row one single-row cache per row (each row then keeps
 * its own count of stored positions). Full layers keep the static cache. */
static KvStatus cpu_create_caches(KvCpuState *cs, KvError *err) {
    const KvConfig *c = &cs->ref.model->config;
    const int64_t kv_dim = c->num_kv_heads * c->head_dim;
    const int64_t B = cs->ref.batch;
    cs->cache_rows = cs->per_row ? B : 1;
    cs->caches = calloc((size_t)(c->num_layers * cs->cache_rows), sizeof *cs->caches);
    if (cs->caches == NULL) {
        return kv_error_set(err, KV_ERR_INTERNAL, "reference state: out of memory");
    }
    cs->n_caches = c->num_layers * cs->cache_rows;
    for (int64_t l = 0; l < c->num_layers; l++) {
        const int64_t w = kv_config_layer_window(c, l);
        if (w == 0) continue; /* full layers keep the static cache */
        for (int64_t r = 0; r < cs->cache_rows; r++) {
            KvSlidingCache **slot = &cs->caches[l * cs->cache_rows + r];
            KvStatus st = cs->variant->create(cs->per_row ? 1 : B, w, kv_dim, slot, err);
            if (st != KV_OK) {
                kv_error_prefix(err, cs->variant->name);
                return st;
            }
            cs->variant->reset(*slot);
        }
    }
    return KV_OK;
}

KvSlidingCache *kv_cpu_cache(const KvCpuState *cs, int64_t layer, int64_t b, int64_t *view_row) {
    if (view_row != NULL) *view_row = cs->per_row ? 0 : b;
    if (cs->caches == NULL || layer < 0 || layer >= cs->n_layers) return NULL;
    return cs->caches[layer * cs->cache_rows + (cs->per_row ? b : 0)];
}

void kv_cpu_state_free(KvCpuState *cs) {
    if (cs == NULL) return;
    cpu_free_caches(cs);
    kv_probes_free(&cs->probes);
    kv_ref_state_free(&cs->ref);
    memset(cs, 0, sizeof *cs);
}

KvStatus kv_cpu_state_init(KvCpuState *cs, const KvModel *m, int64_t batch, int64_t max_len,
                           int64_t max_chunk, const KvCacheOps *variant, KvError *err) {
    memset(cs, 0, sizeof *cs);
    KvStatus st = kv_ref_state_init(&cs->ref, m, batch, max_len, max_chunk, err);
    if (st != KV_OK) return st;
    cs->n_layers = m->config.num_layers;
    st = kv_probes_init(&cs->probes, &m->config, batch, max_len, err);
    if (st == KV_OK && variant != NULL) {
        cs->variant = variant;
        st = cpu_create_caches(cs, err);
    }
    if (st != KV_OK) {
        kv_cpu_state_free(cs);
        return st;
    }
    kv_cpu_state_hooks_update(cs);
    return KV_OK;
}

KvStatus kv_cpu_state_set_per_row(KvCpuState *cs, KvError *err) {
    if (cs->ref.batch > KV_PER_ROW_MAX || cs->ref.len != 0) {
        return kv_error_set(err, KV_ERR_INPUT,
                            "per-row positions: expected at most %d rows before the first "
                            "forward, found %lld rows after %lld slots",
                            KV_PER_ROW_MAX, (long long)cs->ref.batch, (long long)cs->ref.len);
    }
    if (cs->per_row) return KV_OK;
    cs->per_row = true;
    cs->ref.trailing_pads = true;
    if (cs->variant == NULL) return KV_OK;
    cpu_free_caches(cs);
    KvStatus st = cpu_create_caches(cs, err);
    if (st == KV_OK) kv_cpu_state_plant(cs, cs->faults);
    return st;
}

void kv_cpu_state_plant(KvCpuState *cs, unsigned faults) {
    cs->faults = faults;
    for (int64_t i = 0; cs->caches != NULL && i < cs->n_caches; i++) {
        if (cs->caches[i] != NULL && cs->variant->plant != NULL) {
            cs->variant->plant(cs->caches[i], faults);
        }
    }
    kv_cpu_state_hooks_update(cs);
}

void kv_cpu_state_set_order(KvCpuState *cs, unsigned order) {
    cs->order = order;
    kv_cpu_state_hooks_update(cs);
}

KvStatus kv_cpu_check_sentinels(const KvCpuState *cs, int64_t n, KvError *err) {
    if (cs->caches == NULL) return KV_OK;
    for (int64_t i = 0; i < cs->n_caches; i++) {
        const int64_t l = i / cs->cache_rows;
        if (cs->caches[i] != NULL && !cs->variant->sentinels_ok(cs->caches[i])) {
            return kv_error_set(err, KV_ERR_INTERNAL,
                                "%s: layer %lld: a cache sentinel region was overwritten while "
                                "storing positions %lld..%lld (out-of-bounds write)",
                                cs->variant->name, (long long)l, (long long)(cs->ref.len - n),
                                (long long)(cs->ref.len - 1));
        }
    }
    return KV_OK;
}

KvStatus kv_cpu_forward(KvCpuState *cs, const int32_t *tokens, const uint8_t *real, int64_t n,
                        float *logits, KvError *err) {
    KvStatus st = kv_ref_forward(&cs->ref, tokens, real, n, NULL, err);
    if (st == KV_OK) st = kv_cpu_check_sentinels(cs, n, err);
    if (st == KV_OK && logits != NULL) {
        const KvRefState *s = &cs->ref;
        memcpy(logits, s->logits, (size_t)(s->batch * s->model->config.vocab_size) * sizeof(float));
    }
    return st;
}
