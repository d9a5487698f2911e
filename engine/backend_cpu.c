/* backend_cpu.c: the CPU reference as a backend (backend.h): a CPU run
 * (cpu_state.h) on its emulated stream, its recorded graph, and the
 * snapshot the replay check restores. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "cpu_state.h"
#include "fault.h"
#include "prefill_tape.h"
#include "stream.h"

typedef struct {
    KvCpuState cs;
    KvGraph graph;       /* the captured forward */
    int64_t graph_n;     /* tokens per forward of the captured graph */
    unsigned char *snap[KV_SNAP_SLOTS]; /* (snap_bytes) persistent state per slot */
    size_t snap_bytes[KV_SNAP_SLOTS];
    int64_t snap_len[KV_SNAP_SLOTS];    /* the host count at the snapshot */
    bool prefix_slot;                   /* setup.prefix_slot */
    unsigned faults;                    /* planted (KV_FAULT_PREFIX_ALIAS acts here) */
    int64_t eager_forwards, launches;
} CpuRun;

static CpuRun *cpu_run(KvBackend *b) { return (CpuRun *)(void *)b; }
static const CpuRun *cpu_run_const(const KvBackend *b) { return (const CpuRun *)(const void *)b; }

static KvStatus cpu_query(char *device, size_t device_len, KvError *err) {
    (void)err;
    if (device != NULL && device_len > 0) snprintf(device, device_len, "cpu");
    return KV_OK;
}

static void cpu_destroy(KvBackend *b) {
    CpuRun *r = cpu_run(b);
    if (r == NULL) return;
    kv_graph_free(&r->graph);
    kv_cpu_state_free(&r->cs);
    for (int i = 0; i < KV_SNAP_SLOTS; i++) free(r->snap[i]);
    free(r);
}

static KvStatus cpu_create(const KvModel *m, const KvBackendSetup *setup, KvBackend **out,
                           KvError *err) {
    KvStatus st = KV_OK;
    CpuRun *r = calloc(1, sizeof *r);
    *out = NULL;
    if (r == NULL) return kv_error_set(err, KV_ERR_INTERNAL, "cpu backend: out of memory");
    st = kv_cpu_state_init(&r->cs, m, setup->batch, setup->max_len, setup->max_chunk,
                           setup->variant, err);
    if (st != KV_OK) goto cleanup;
    kv_cpu_state_plant(&r->cs, setup->faults);
    if (setup->per_row) {
        st = kv_cpu_state_set_per_row(&r->cs, err);
        if (st != KV_OK) goto cleanup;
    }
    r->faults = setup->faults;
    r->prefix_slot = setup->prefix_slot;
    kv_cpu_state_set_order(&r->cs, setup->order);
    if (setup->probes) {
        /* Before any capture: the probe ops record whether to dump. */
        st = kv_cpu_state_probe(&r->cs, setup->dump_probes, err);
        if (st != KV_OK) goto cleanup;
    }
    *out = (KvBackend *)(void *)r;
cleanup:
    if (st != KV_OK) cpu_destroy((KvBackend *)(void *)r);
    return st;
}

static KvStatus cpu_set_input(KvBackend *b, const int32_t *tokens, const uint8_t *real,
                              int64_t n, KvError *err) {
    KvRefState *s = &cpu_run(b)->cs.ref;
    /* The driver checked the tokens; the state checks its capacity. */
    KvStatus st = kv_ref_check_input(s, tokens, real, n, err);
    if (st != KV_OK) return st;
    memcpy(s->tok_in, tokens, (size_t)(s->batch * n) * sizeof *tokens);
    memcpy(s->real_in, real, (size_t)(s->batch * n));
    return KV_OK;
}

/* After a forward of n executed: the host count, then the caches' sentinels. */
static KvStatus cpu_advance(KvCpuState *cs, int64_t n, KvError *err) {
    cs->ref.len += n;
    return kv_cpu_check_sentinels(cs, n, err);
}

static KvStatus cpu_forward(KvBackend *b, int64_t n, KvError *err) {
    CpuRun *r = cpu_run(b);
    kv_ref_launch_forward(&r->cs.ref, n);
    r->eager_forwards++;
    return cpu_advance(&r->cs, n, err);
}

static KvStatus cpu_tape_save(KvBackend *b, const int32_t *tokens, const uint8_t *real,
                              int64_t n, KvPrefillTape *t, KvError *err) {
    return kv_cpu_tape_save(&cpu_run(b)->cs, tokens, real, n, t, err);
}

static KvStatus cpu_tape_load(KvBackend *b, int64_t n, const KvPrefillTape *t, bool *used,
                              KvError *err) {
    CpuRun *r = cpu_run(b);
    KvStatus st = kv_cpu_tape_load(&r->cs, n, t, used, err);
    return st == KV_OK && *used ? cpu_advance(&r->cs, n, err) : st;
}

static void cpu_layer_key(const KvBackend *b, int64_t layer, int64_t n, int64_t *regime,
                          int64_t *slots) {
    const KvCpuState *cs = &cpu_run_const(b)->cs;
    (void)n; /* a variant's view before the update is the attended length */
    *regime = 0;
    *slots = 0;
    /* With per-row positions each row's cache has its own regime and
     * length; both only grow during a decode, so their sums change exactly
     * when one of them does. */
    for (int64_t r = 0; r < (cs->per_row ? cs->ref.batch : 1); r++) {
        const KvSlidingCache *c = kv_cpu_cache(cs, layer, r, NULL);
        if (c == NULL) continue;
        *regime += cs->variant->regime(c, cs->ref.len - cs->ref.lag[r]);
        *slots += cs->variant->view(c).n_slots;
    }
}

static KvStatus cpu_capture(KvBackend *b, int64_t n, KvError *err) {
    CpuRun *r = cpu_run(b);
    kv_stream_begin_capture(&r->cs.ref.stream, &r->graph);
    kv_ref_launch_forward(&r->cs.ref, n);
    r->graph_n = n;
    return kv_stream_end_capture(&r->cs.ref.stream, err);
}

static KvStatus cpu_replay(KvBackend *b, KvError *err) {
    CpuRun *r = cpu_run(b);
    kv_graph_replay(&r->graph);
    r->launches++;
    return cpu_advance(&r->cs, r->graph_n, err);
}

static KvStatus cpu_shift(KvBackend *b, int64_t keep, int64_t drop, KvError *err) {
    KvCpuState *cs = &cpu_run(b)->cs;
    KvStatus st = kv_cpu_shift(cs, keep, drop, err);
    return st == KV_OK ? kv_cpu_check_sentinels(cs, 0, err) : st;
}

/* ---- snapshots: the persistent parts of the state, then each cache ---- */

typedef struct {
    void *ptr;
    size_t bytes;
} SnapPart;

static size_t cpu_snapshot_parts(KvRefState *s, SnapPart *parts) {
    const KvConfig *c = &s->model->config;
    const size_t kv = (size_t)(c->num_layers * s->batch * s->max_len * c->num_kv_heads *
                               c->head_dim) * sizeof(float);
    const size_t rows = (size_t)(s->batch * s->max_chunk);
    size_t n = 0;
    parts[n++] = (SnapPart){s->k, kv};
    parts[n++] = (SnapPart){s->v, kv};
    parts[n++] = (SnapPart){s->real, (size_t)(s->batch * s->max_len)};
    parts[n++] = (SnapPart){s->n_real, (size_t)s->batch * sizeof(int64_t)};
    parts[n++] = (SnapPart){&s->total_mem, sizeof s->total_mem};
    parts[n++] = (SnapPart){s->lag, (size_t)s->batch * sizeof(int64_t)};
    parts[n++] = (SnapPart){s->tok_in, rows * sizeof(int32_t)};
    parts[n++] = (SnapPart){s->real_in, rows};
    return n;
}

/* save: state -> r->snap[slot]; else r->snap[slot] -> state. alias (a
 * load under KV_FAULT_PREFIX_ALIAS): the sliding caches' slots stay as they
 * are, everything else is restored. */
static void cpu_snapshot_copy(CpuRun *r, int slot, bool save, bool alias) {
    KvCpuState *s = &r->cs;
    SnapPart parts[9];
    const size_t n = cpu_snapshot_parts(&s->ref, parts);
    unsigned char *at = r->snap[slot];
    for (size_t i = 0; i < n; i++) {
        if (save) {
            memcpy(at, parts[i].ptr, parts[i].bytes);
        } else {
            memcpy(parts[i].ptr, at, parts[i].bytes);
        }
        at += parts[i].bytes;
    }
    for (int64_t i = 0; s->caches != NULL && i < s->n_caches; i++) {
        if (s->caches[i] == NULL) continue;
        if (save) {
            kv_cache_snapshot_save(s->variant, s->caches[i], at);
        } else if (alias) {
            kv_cache_snapshot_load_counters(s->variant, s->caches[i], at);
        } else {
            kv_cache_snapshot_load(s->variant, s->caches[i], at);
        }
        at += kv_cache_snapshot_bytes(s->variant, s->caches[i]);
    }
}

/* A slot this run may use: the replay check's always, the prefix entry's
 * when the setup asked for it. */
static KvStatus cpu_snapshot_slot(const CpuRun *r, int slot, KvError *err) {
    if (slot == KV_SNAP_REPLAY || (slot == KV_SNAP_PREFIX && r->prefix_slot)) return KV_OK;
    return kv_error_set(err, KV_ERR_INTERNAL, "snapshot: slot %d not set up for this run", slot);
}

static KvStatus cpu_snapshot_save(KvBackend *b, int slot, KvError *err) {
    CpuRun *r = cpu_run(b);
    KvStatus st = cpu_snapshot_slot(r, slot, err);
    if (st != KV_OK) return st;
    KvCpuState *s = &r->cs;
    SnapPart parts[9];
    const size_t n = cpu_snapshot_parts(&s->ref, parts);
    size_t need = 0;
    for (size_t i = 0; i < n; i++) need += parts[i].bytes;
    for (int64_t i = 0; s->caches != NULL && i < s->n_caches; i++) {
        if (s->caches[i] != NULL) need += kv_cache_snapshot_bytes(s->variant, s->caches[i]);
    }
    if (r->snap[slot] == NULL || r->snap_bytes[slot] != need) {
        free(r->snap[slot]);
        r->snap[slot] = malloc(need > 0 ? need : 1);
        r->snap_bytes[slot] = r->snap[slot] != NULL ? need : 0;
        if (r->snap[slot] == NULL) {
            return kv_error_set(err, KV_ERR_INTERNAL, "snapshot: out of memory (%zu bytes)", need);
        }
    }
    cpu_snapshot_copy(r, slot, true, false);
    r->snap_len[slot] = s->ref.len;
    return KV_OK;
}

static KvStatus cpu_snapshot_load(KvBackend *b, int slot, KvError *err) {
    CpuRun *r = cpu_run(b);
    KvStatus st = cpu_snapshot_slot(r, slot, err);
    if (st != KV_OK) return st;
    if (r->snap[slot] == NULL) return kv_error_set(err, KV_ERR_INTERNAL, "snapshot: none saved");
    const bool alias = slot == KV_SNAP_PREFIX && (r->faults & KV_FAULT_PREFIX_ALIAS);
    cpu_snapshot_copy(r, slot, false, alias);
    r->cs.ref.len = r->snap_len[slot];
    return KV_OK;
}

static KvStatus cpu_read_step(KvBackend *b, KvBackendStep *out, KvError *err) {
    const KvCpuState *cs = &cpu_run(b)->cs;
    (void)err; /* sentinels were checked as each forward finished */
    out->logits = cs->ref.logits;
    out->tokens = cs->ref.next_tok;
    out->margins = cs->ref.margin;
    out->probe_hash = cs->probes.on ? cs->probes.hash : NULL;
    return KV_OK;
}

static bool cpu_take_nonfinite(KvBackend *b, KvNonfinite *out) {
    KvProbes *s = &cpu_run(b)->cs.probes;
    const bool found = s->nonfinite_probe >= 0;
    if (found) {
        out->probe = s->nonfinite_probe;
        out->row = s->nonfinite_row;
        out->index = s->nonfinite_index;
        out->value = s->nonfinite_value;
    }
    kv_probes_nonfinite_reset(s);
    return found;
}

static void cpu_take_dump(KvBackend *b, KvProbeDump *out) {
    KvProbes *s = &cpu_run(b)->cs.probes;
    kv_probe_dump_free(out);
    *out = s->dump;
    memset(&s->dump, 0, sizeof s->dump);
}

static const KvProbeDump *cpu_peek_dump(const KvBackend *b) {
    const KvProbeDump *d = &cpu_run_const(b)->cs.probes.dump;
    return d->data != NULL ? d : NULL;
}

static void cpu_stats(const KvBackend *b, KvBackendStats *out) {
    const CpuRun *r = cpu_run_const(b);
    out->eager_forwards = r->eager_forwards;
    out->graph_launches = r->launches;
    snprintf(out->device, sizeof out->device, "cpu");
    snprintf(out->math_mode, sizeof out->math_mode, "fp32, -ffp-contract=off, no fast-math");
}

const KvBackendOps kv_backend_cpu = {
    .name = "cpu",
    .host = true,
    .per_row = true,
    .query = cpu_query,
    .create = cpu_create,
    .destroy = cpu_destroy,
    .set_input = cpu_set_input,
    .forward = cpu_forward,
    .layer_key = cpu_layer_key,
    .capture = cpu_capture,
    .replay = cpu_replay,
    .snapshot_save = cpu_snapshot_save,
    .snapshot_load = cpu_snapshot_load,
    .read_step = cpu_read_step,
    .shift = cpu_shift,
    .take_nonfinite = cpu_take_nonfinite,
    .take_dump = cpu_take_dump,
    .peek_dump = cpu_peek_dump,
    .stats = cpu_stats,
    .tape_save = cpu_tape_save,
    .tape_load = cpu_tape_load,
};
