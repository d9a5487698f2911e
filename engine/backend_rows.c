/* backend_rows.c: rows at their own positions over any backend, one
 * single-row run per row (backend_rows.h has the why and the rules). */
#include "backend_rows.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fault.h"
#include "probe.h"

struct KvRows {
    const KvBackendOps *inner;
    int64_t B, V, n_probes, max_chunk;
    bool pad_slots;    /* planted KV_FAULT_PAD_SLOTS: trailing pads are fed as slots */
    KvBackend **run;   /* (B) row b alone: a single-row run of inner */
    /* The next forward's input, from set_input; without one (the greedy
     * (B, 1) input argmax wrote) every row feeds all n tokens. Part of the
     * snapshot (the replay check restores the input with the state). */
    bool pending;
    int64_t *row_n;    /* (B) position-taking tokens of row b */
    uint8_t *row_real; /* (B) 1 when they include a real token */
    uint8_t *started;  /* (B) row b has fed a real token: a pad after it is trailing */
    bool snap_pending[KV_SNAP_SLOTS];
    int64_t *snap_row_n[KV_SNAP_SLOTS];     /* (B) each */
    uint8_t *snap_row_real[KV_SNAP_SLOTS];  /* (B) each */
    uint8_t *snap_started[KV_SNAP_SLOTS];   /* (B) each */
    bool captured;
    int64_t *cap_n;    /* (B) tokens of row b in its captured graph; 0: none captured */
    uint8_t *has_out;  /* (B) row b has run a forward: its run holds outputs */
    /* read_step's outputs */
    float *logits;        /* (B, V) */
    int32_t *tokens;      /* (B) */
    float *margins;       /* (B) */
    uint64_t *probe_hash; /* (n_probes, B), NULL without probes */
    int32_t *tok;         /* (max_chunk) one row's input */
    uint8_t *real;        /* (max_chunk) */
};

/* Tokens row b feeds a forward of n. */
static int64_t row_tokens(const KvRows *rows, int64_t b, int64_t n) {
    return rows->pending ? rows->row_n[b] : n;
}

/* After a forward of the pending input (or the greedy one) ran. */
static void rows_ran(KvRows *rows, int64_t b) {
    rows->has_out[b] = 1;
    if (!rows->pending || rows->row_real[b]) rows->started[b] = 1;
}

void kv_rows_destroy(KvRows *rows) {
    if (rows == NULL) return;
    /* row 0 may own parts the others borrow (KvRowsCreateRow): destroyed last */
    for (int64_t b = rows->B - 1; b >= 0 && rows->run != NULL; b--) {
        if (rows->run[b] != NULL) rows->inner->destroy(rows->run[b]);
    }
    free(rows->run);
    free(rows->row_n);
    free(rows->row_real);
    free(rows->started);
    for (int i = 0; i < KV_SNAP_SLOTS; i++) {
        free(rows->snap_row_n[i]);
        free(rows->snap_row_real[i]);
        free(rows->snap_started[i]);
    }
    free(rows->cap_n);
    free(rows->has_out);
    free(rows->logits);
    free(rows->tokens);
    free(rows->margins);
    free(rows->probe_hash);
    free(rows->tok);
    free(rows->real);
    free(rows);
}

KvStatus kv_rows_create(const KvBackendOps *inner, KvRowsCreateRow create_row, const KvModel *m,
                        const KvBackendSetup *setup, KvRows **out, KvError *err) {
    KvStatus st = KV_OK;
    const int64_t B = setup->batch;
    KvRows *rows = calloc(1, sizeof *rows);
    *out = NULL;
    if (rows == NULL) return kv_error_set(err, KV_ERR_INTERNAL, "rows: out of memory");
    rows->inner = inner;
    rows->B = B;
    rows->V = m->config.vocab_size;
    rows->n_probes = setup->probes ? kv_probe_count(&m->config) : 0;
    rows->max_chunk = setup->max_chunk;
    rows->pad_slots = (setup->faults & KV_FAULT_PAD_SLOTS) != 0;
    const size_t nb = (size_t)(B > 0 ? B : 1);
    rows->run = calloc(nb, sizeof *rows->run);
    rows->row_n = calloc(nb, sizeof *rows->row_n);
    rows->row_real = calloc(nb, 1);
    rows->started = calloc(nb, 1);
    rows->cap_n = calloc(nb, sizeof *rows->cap_n);
    rows->has_out = calloc(nb, 1);
    rows->logits = calloc(nb * (size_t)rows->V, sizeof *rows->logits);
    rows->tokens = calloc(nb, sizeof *rows->tokens);
    rows->margins = calloc(nb, sizeof *rows->margins);
    rows->tok = calloc((size_t)(setup->max_chunk > 0 ? setup->max_chunk : 1), sizeof *rows->tok);
    rows->real = calloc((size_t)(setup->max_chunk > 0 ? setup->max_chunk : 1), 1);
    bool ok = rows->run && rows->row_n && rows->row_real && rows->started && rows->cap_n &&
              rows->has_out && rows->logits && rows->tokens && rows->margins && rows->tok &&
              rows->real;
    if (setup->probes) {
        rows->probe_hash = calloc((size_t)rows->n_probes * nb, sizeof(uint64_t));
        ok = ok && rows->probe_hash != NULL;
    }
    for (int i = 0; i < KV_SNAP_SLOTS; i++) {
        rows->snap_row_n[i] = calloc(nb, sizeof(int64_t));
        rows->snap_row_real[i] = calloc(nb, 1);
        rows->snap_started[i] = calloc(nb, 1);
        ok = ok && rows->snap_row_n[i] && rows->snap_row_real[i] && rows->snap_started[i];
    }
    if (!ok) {
        st = kv_error_set(err, KV_ERR_INTERNAL, "rows: out of memory");
        goto cleanup;
    }
    for (int64_t b = 0; b < B; b++) {
        KvBackendSetup one = *setup;
        one.batch = 1;
        one.per_row = false;
        KvBackend *first = b == 0 ? NULL : rows->run[0];
        st = create_row != NULL ? create_row(m, &one, first, &rows->run[b], err)
                                : inner->create(m, &one, &rows->run[b], err);
        if (st != KV_OK) goto cleanup;
    }
    *out = rows;
cleanup:
    if (st != KV_OK) kv_rows_destroy(rows);
    return st;
}

/* Row b's part of an input of n: how many leading tokens take a position
 * (left pads and real tokens; a trailing pad takes none) and whether one of
 * them is real. KV_ERR_INPUT for a real token after a trailing pad. */
static KvStatus row_take(const KvRows *rows, int64_t b, const uint8_t *rl /* (n) */, int64_t n,
                         int64_t *take, bool *any_real, KvError *err) {
    bool trailing = false;
    *take = 0;
    *any_real = false;
    for (int64_t j = 0; j < n; j++) {
        if (rl[j]) {
            if (trailing) {
                return kv_error_set(err, KV_ERR_INPUT,
                                    "tokens: row %lld column %lld: a real token after a trailing "
                                    "pad (a right-padded row is left pads, real tokens, then pads)",
                                    (long long)b, (long long)j);
            }
            *any_real = true;
            *take = j + 1;
        } else if ((rows->started[b] || *any_real) && !rows->pad_slots) {
            trailing = true; /* no slot, no position */
        } else {
            *take = j + 1; /* a left pad (or a planted pad_slots pad) takes a slot */
        }
    }
    return KV_OK;
}

KvStatus kv_rows_set_input(KvRows *rows, const int32_t *tokens, const uint8_t *real, int64_t n,
                           KvError *err) {
    int64_t take = 0;
    bool any_real = false;
    if (n < 1 || n > rows->max_chunk) {
        return kv_error_set(err, KV_ERR_INPUT,
                            "rows forward: %lld new tokens exceed the state (max_chunk %lld)",
                            (long long)n, (long long)rows->max_chunk);
    }
    /* Every row is checked before anything changes: nothing half-applied. */
    for (int64_t b = 0; b < rows->B; b++) {
        const KvStatus st = row_take(rows, b, real + b * n, n, &take, &any_real, err);
        if (st != KV_OK) return st;
    }
    for (int64_t b = 0; b < rows->B; b++) {
        (void)row_take(rows, b, real + b * n, n, &take, &any_real, err);
        rows->row_n[b] = take;
        rows->row_real[b] = any_real ? 1 : 0;
        if (take == 0) continue;
        memcpy(rows->tok, tokens + b * n, (size_t)take * sizeof *rows->tok);
        memcpy(rows->real, real + b * n, (size_t)take);
        const KvStatus st = rows->inner->set_input(rows->run[b], rows->tok, rows->real, take, err);
        if (st != KV_OK) return st;
    }
    rows->pending = true;
    return KV_OK;
}

KvStatus kv_rows_forward(KvRows *rows, int64_t n, KvError *err) {
    for (int64_t b = 0; b < rows->B; b++) {
        const int64_t nb = row_tokens(rows, b, n);
        if (nb == 0) continue; /* only trailing pads: the row keeps its outputs */
        const KvStatus st = rows->inner->forward(rows->run[b], nb, err);
        if (st != KV_OK) return st;
        rows_ran(rows, b);
    }
    rows->pending = false;
    return KV_OK;
}

/* The rows' keys summed, as the CPU's per-row key (each row's regime and
 * attended length only grow in a decode, so the sum changes exactly when
 * one of them does). */
void kv_rows_layer_key(const KvRows *rows, int64_t layer, int64_t n, int64_t *regime,
                       int64_t *slots) {
    *regime = 0;
    *slots = 0;
    for (int64_t b = 0; b < rows->B; b++) {
        const int64_t nb = row_tokens(rows, b, n);
        int64_t r = 0, s = 0;
        rows->inner->layer_key(rows->run[b], layer, nb > 0 ? nb : n, &r, &s);
        *regime += r;
        *slots += s;
    }
}

KvStatus kv_rows_capture(KvRows *rows, int64_t n, KvError *err) {
    for (int64_t b = 0; b < rows->B; b++) {
        const int64_t nb = row_tokens(rows, b, n);
        rows->cap_n[b] = nb;
        if (nb == 0) continue;
        const KvStatus st = rows->inner->capture(rows->run[b], nb, err);
        if (st != KV_OK) return st;
    }
    rows->captured = true;
    return KV_OK;
}

KvStatus kv_rows_replay(KvRows *rows, KvError *err) {
    if (!rows->captured) {
        return kv_error_set(err, KV_ERR_INTERNAL, "rows replay: no graph captured");
    }
    for (int64_t b = 0; b < rows->B; b++) {
        if (rows->pending && rows->row_n[b] != rows->cap_n[b]) {
            return kv_error_set(err, KV_ERR_INPUT,
                                "graph replay: row %lld feeds %lld position-taking tokens, "
                                "its captured graph %lld (rows at their own positions replay "
                                "the counts they were captured with)",
                                (long long)b, (long long)rows->row_n[b],
                                (long long)rows->cap_n[b]);
        }
    }
    for (int64_t b = 0; b < rows->B; b++) {
        if (rows->cap_n[b] == 0) continue;
        const KvStatus st = rows->inner->replay(rows->run[b], err);
        if (st != KV_OK) return st;
        rows_ran(rows, b);
    }
    rows->pending = false;
    return KV_OK;
}

KvStatus kv_rows_snapshot(KvRows *rows, int slot, bool save, KvError *err) {
    if (slot < 0 || slot >= KV_SNAP_SLOTS) {
        return kv_error_set(err, KV_ERR_INTERNAL, "rows snapshot: no slot %d", slot);
    }
    for (int64_t b = 0; b < rows->B; b++) {
        const KvStatus st = save ? rows->inner->snapshot_save(rows->run[b], slot, err)
                                 : rows->inner->snapshot_load(rows->run[b], slot, err);
        if (st != KV_OK) return st;
    }
    const size_t B = (size_t)rows->B;
    if (save) {
        rows->snap_pending[slot] = rows->pending;
        memcpy(rows->snap_row_n[slot], rows->row_n, B * sizeof *rows->row_n);
        memcpy(rows->snap_row_real[slot], rows->row_real, B);
        memcpy(rows->snap_started[slot], rows->started, B);
    } else {
        rows->pending = rows->snap_pending[slot];
        memcpy(rows->row_n, rows->snap_row_n[slot], B * sizeof *rows->row_n);
        memcpy(rows->row_real, rows->snap_row_real[slot], B);
        memcpy(rows->started, rows->snap_started[slot], B);
    }
    return KV_OK;
}

/* Each row's outputs of its last forward (a row that has not run: zeros). */
KvStatus kv_rows_read_step(KvRows *rows, KvBackendStep *out, KvError *err) {
    const int64_t B = rows->B, V = rows->V;
    for (int64_t b = 0; b < B; b++) {
        if (!rows->has_out[b]) continue;
        KvBackendStep v;
        const KvStatus st = rows->inner->read_step(rows->run[b], &v, err);
        if (st != KV_OK) return st;
        memcpy(rows->logits + b * V, v.logits, (size_t)V * sizeof *rows->logits);
        rows->tokens[b] = v.tokens[0];
        rows->margins[b] = v.margins[0];
        for (int64_t i = 0; rows->probe_hash != NULL && i < rows->n_probes; i++) {
            rows->probe_hash[i * B + b] = v.probe_hash[i];
        }
    }
    out->logits = rows->logits;
    out->tokens = rows->tokens;
    out->margins = rows->margins;
    out->probe_hash = rows->probe_hash;
    return KV_OK;
}

bool kv_rows_take_nonfinite(KvRows *rows, KvNonfinite *out) {
    bool found = false;
    for (int64_t b = 0; b < rows->B; b++) {
        KvNonfinite nf;
        if (!kv_backend_take_nonfinite(rows->inner, rows->run[b], &nf)) continue;
        if (!found || nf.probe < out->probe) { /* rows ascend: a tie keeps the lower row */
            *out = nf;
            out->row = b;
            found = true;
        }
    }
    return found;
}

void kv_rows_stats(const KvRows *rows, KvBackendStats *out) {
    memset(out, 0, sizeof *out);
    for (int64_t b = 0; b < rows->B; b++) {
        KvBackendStats one;
        memset(&one, 0, sizeof one);
        kv_backend_stats(rows->inner, rows->run[b], &one);
        out->graph_instantiations += one.graph_instantiations;
        out->exec_updates += one.exec_updates;
        if (b == 0) {
            memcpy(out->device, one.device, sizeof out->device);
            memcpy(out->math_mode, one.math_mode, sizeof out->math_mode);
        }
    }
}
