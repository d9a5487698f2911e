/* cuda_rows.cu: rows at their own positions on the GPU (DESIGN §2, seed
 * 002's right-padded static-shape loop, llama.cpp #14097's parallel
 * sequences), as one single-row kv_backend_cuda run per row.
 *
 * Why single-row runs and not per-row positions in every kernel: DESIGN §2
 * asks every row of a right-padded batch to be bitwise the row decoded
 * alone. Each forward feeds row b's run only the row's position-taking
 * tokens (left pads and real tokens; a trailing pad takes no slot and no
 * position), so row b's run performs exactly the launches of the row run
 * alone with the same chunks, and the property holds by construction for
 * every variant and mode, including on a GPU where cuBLAS picks its
 * kernels by the number of rows. The kernels keep one device count per
 * run. The cost is B launches of each op instead of one; the weights are
 * uploaded once (row 0's) and borrowed by the other rows.
 *
 * A row with no position-taking token in a forward (a chunk of only
 * trailing pads) does not run and keeps its outputs, as on the CPU. The
 * planted pad_slots (fault.h) feeds the trailing pads too, as pad slots. In
 * graph mode each row run captures and replays its own graph; a replay
 * whose rows feed other token counts than at capture is refused (a decode
 * step feeds every row one token, so this is only a forced script's). */
#include "cuda_internal.cuh"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "forward.h"
}

struct KvCudaRows {
    int64_t B, V, n_probes, max_chunk;
    bool pad_slots;    /* planted KV_FAULT_PAD_SLOTS: trailing pads are fed as slots */
    KvCudaRun **run;   /* (B) row b alone: a single-row kv_backend_cuda run */
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

static KvBackend *row_run(const KvCudaRows *rows, int64_t b) {
    return (KvBackend *)(void *)rows->run[b];
}

/* Tokens row b feeds a forward of n. */
static int64_t row_tokens(const KvCudaRows *rows, int64_t b, int64_t n) {
    return rows->pending ? rows->row_n[b] : n;
}

/* After a forward of the pending input (or the greedy one) ran. */
static void rows_ran(KvCudaRows *rows, int64_t b) {
    rows->has_out[b] = 1;
    if (!rows->pending || rows->row_real[b]) rows->started[b] = 1;
}

void kv_cuda_rows_destroy(KvCudaRows *rows) {
    if (rows == NULL) return;
    /* row 0 owns the weights the others borrow: destroyed last */
    for (int64_t b = rows->B - 1; b >= 0 && rows->run != NULL; b--) {
        kv_backend_cuda.destroy(row_run(rows, b));
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

KvStatus kv_cuda_rows_create(const KvModel *m, const KvBackendSetup *setup, KvCudaRows **out,
                             char *device, size_t device_len, KvError *err) {
    KvStatus st = KV_OK;
    const int64_t B = setup->batch;
    KvCudaRows *rows = (KvCudaRows *)calloc(1, sizeof *rows);
    *out = NULL;
    if (rows == NULL) return kv_error_set(err, KV_ERR_INTERNAL, "cuda: out of host memory");
    rows->B = B;
    rows->V = m->config.vocab_size;
    rows->n_probes = setup->probes ? kv_probe_count(&m->config) : 0;
    rows->max_chunk = setup->max_chunk;
    rows->pad_slots = (setup->faults & KV_FAULT_PAD_SLOTS) != 0;
    const size_t nb = (size_t)(B > 0 ? B : 1);
    rows->run = (KvCudaRun **)calloc(nb, sizeof *rows->run);
    rows->row_n = (int64_t *)calloc(nb, sizeof *rows->row_n);
    rows->row_real = (uint8_t *)calloc(nb, 1);
    rows->started = (uint8_t *)calloc(nb, 1);
    rows->cap_n = (int64_t *)calloc(nb, sizeof *rows->cap_n);
    rows->has_out = (uint8_t *)calloc(nb, 1);
    rows->logits = (float *)calloc(nb * (size_t)rows->V, sizeof *rows->logits);
    rows->tokens = (int32_t *)calloc(nb, sizeof *rows->tokens);
    rows->margins = (float *)calloc(nb, sizeof *rows->margins);
    rows->tok = (int32_t *)calloc((size_t)(setup->max_chunk > 0 ? setup->max_chunk : 1),
                                  sizeof *rows->tok);
    rows->real = (uint8_t *)calloc((size_t)(setup->max_chunk > 0 ? setup->max_chunk : 1), 1);
    bool ok = rows->run && rows->row_n && rows->row_real && rows->started && rows->cap_n &&
              rows->has_out && rows->logits && rows->tokens && rows->margins && rows->tok &&
              rows->real;
    if (setup->probes) {
        rows->probe_hash = (uint64_t *)calloc((size_t)rows->n_probes * nb, sizeof(uint64_t));
        ok = ok && rows->probe_hash != NULL;
    }
    for (int i = 0; i < KV_SNAP_SLOTS; i++) {
        rows->snap_row_n[i] = (int64_t *)calloc(nb, sizeof(int64_t));
        rows->snap_row_real[i] = (uint8_t *)calloc(nb, 1);
        rows->snap_started[i] = (uint8_t *)calloc(nb, 1);
        ok = ok && rows->snap_row_n[i] && rows->snap_row_real[i] && rows->snap_started[i];
    }
    if (!ok) {
        st = kv_error_set(err, KV_ERR_INTERNAL, "cuda: out of host memory");
        goto cleanup;
    }
    for (int64_t b = 0; b < B; b++) {
        KvBackendSetup one = *setup;
        one.batch = 1;
        one.per_row = false;
        st = kv_cuda_run_create(m, &one, b == 0 ? NULL : &rows->run[0]->ctx, &rows->run[b], err);
        if (st != KV_OK) goto cleanup;
    }
    if (device != NULL && device_len > 0 && B > 0) {
        snprintf(device, device_len, "%s", rows->run[0]->device);
    }
    *out = rows;
cleanup:
    if (st != KV_OK) kv_cuda_rows_destroy(rows);
    return st;
}

KvStatus kv_cuda_rows_set_input(KvCudaRows *rows, const int32_t *tokens, const uint8_t *real,
                                int64_t n, KvError *err) {
    KvStatus st = KV_OK;
    if (n < 1 || n > rows->max_chunk) {
        return kv_error_set(err, KV_ERR_INPUT,
                            "cuda forward: %lld new tokens exceed the state (max_chunk %lld)",
                            (long long)n, (long long)rows->max_chunk);
    }
    /* Every row is checked before any is copied: nothing half-applied. */
    for (int64_t b = 0; b < rows->B; b++) {
        const uint8_t *rl = real + b * n; /* (n) */
        int64_t take = 0;
        bool any_real = false, trailing = false;
        for (int64_t j = 0; j < n; j++) {
            if (rl[j]) {
                if (trailing) {
                    return kv_error_set(err, KV_ERR_INPUT,
                                        "tokens: row %lld column %lld: a real token after a "
                                        "trailing pad (a right-padded row is left pads, real "
                                        "tokens, then pads)",
                                        (long long)b, (long long)j);
                }
                any_real = true;
                take = j + 1;
            } else if ((rows->started[b] || any_real) && !rows->pad_slots) {
                trailing = true; /* no slot, no position */
            } else {
                take = j + 1; /* a left pad (or a planted pad_slots pad) takes a slot */
            }
        }
        rows->row_n[b] = take;
        rows->row_real[b] = any_real ? 1 : 0;
    }
    for (int64_t b = 0; b < rows->B; b++) {
        const int64_t take = rows->row_n[b];
        if (take == 0) continue;
        memcpy(rows->tok, tokens + b * n, (size_t)take * sizeof *rows->tok);
        memcpy(rows->real, real + b * n, (size_t)take);
        st = kv_backend_cuda.set_input(row_run(rows, b), rows->tok, rows->real, take, err);
        if (st != KV_OK) return st;
    }
    rows->pending = true;
    return KV_OK;
}

KvStatus kv_cuda_rows_forward(KvCudaRows *rows, int64_t n, KvError *err) {
    for (int64_t b = 0; b < rows->B; b++) {
        const int64_t nb = row_tokens(rows, b, n);
        if (nb == 0) continue; /* only trailing pads: the row keeps its outputs */
        const KvStatus st = kv_backend_cuda.forward(row_run(rows, b), nb, err);
        if (st != KV_OK) return st;
        rows_ran(rows, b);
    }
    rows->pending = false;
    return KV_OK;
}

/* The rows' keys summed, as the CPU's per-row key (each row's regime and
 * attended length only grow in a decode, so the sum changes exactly when
 * one of them does). */
void kv_cuda_rows_layer_key(const KvCudaRows *rows, int64_t layer, int64_t n, int64_t *regime,
                            int64_t *slots) {
    *regime = 0;
    *slots = 0;
    for (int64_t b = 0; b < rows->B; b++) {
        const int64_t nb = row_tokens(rows, b, n);
        int64_t r = 0, s = 0;
        kv_backend_cuda.layer_key(row_run(rows, b), layer, nb > 0 ? nb : n, &r, &s);
        *regime += r;
        *slots += s;
    }
}

KvStatus kv_cuda_rows_capture(KvCudaRows *rows, int64_t n, KvError *err) {
    for (int64_t b = 0; b < rows->B; b++) {
        const int64_t nb = row_tokens(rows, b, n);
        rows->cap_n[b] = nb;
        if (nb == 0) continue;
        const KvStatus st = kv_backend_cuda.capture(row_run(rows, b), nb, err);
        if (st != KV_OK) return st;
    }
    rows->captured = true;
    return KV_OK;
}

KvStatus kv_cuda_rows_replay(KvCudaRows *rows, KvError *err) {
    if (!rows->captured) {
        return kv_error_set(err, KV_ERR_INTERNAL, "cuda replay: no graph captured");
    }
    for (int64_t b = 0; b < rows->B; b++) {
        if (rows->pending && rows->row_n[b] != rows->cap_n[b]) {
            return kv_error_set(err, KV_ERR_INPUT,
                                "cuda graph replay: row %lld feeds %lld position-taking tokens, "
                                "its captured graph %lld (rows at their own positions replay "
                                "the counts they were captured with)",
                                (long long)b, (long long)rows->row_n[b],
                                (long long)rows->cap_n[b]);
        }
    }
    for (int64_t b = 0; b < rows->B; b++) {
        if (rows->cap_n[b] == 0) continue;
        const KvStatus st = kv_backend_cuda.replay(row_run(rows, b), err);
        if (st != KV_OK) return st;
        rows_ran(rows, b);
    }
    rows->pending = false;
    return KV_OK;
}

KvStatus kv_cuda_rows_snapshot(KvCudaRows *rows, int slot, bool save, KvError *err) {
    if (slot < 0 || slot >= KV_SNAP_SLOTS) {
        return kv_error_set(err, KV_ERR_INTERNAL, "cuda snapshot: no slot %d", slot);
    }
    for (int64_t b = 0; b < rows->B; b++) {
        const KvStatus st = save ? kv_backend_cuda.snapshot_save(row_run(rows, b), slot, err)
                                 : kv_backend_cuda.snapshot_load(row_run(rows, b), slot, err);
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
KvStatus kv_cuda_rows_read_step(KvCudaRows *rows, KvBackendStep *out, KvError *err) {
    const int64_t B = rows->B, V = rows->V;
    for (int64_t b = 0; b < B; b++) {
        if (!rows->has_out[b]) continue;
        KvBackendStep v;
        const KvStatus st = kv_backend_cuda.read_step(row_run(rows, b), &v, err);
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

void kv_cuda_rows_graph_counts(const KvCudaRows *rows, int64_t *instantiations,
                               int64_t *exec_updates) {
    *instantiations = 0;
    *exec_updates = 0;
    for (int64_t b = 0; b < rows->B; b++) {
        *instantiations += rows->run[b]->graph.instantiations;
        *exec_updates += rows->run[b]->graph.exec_updates;
    }
}
