/* cuda_backend.cu: the GPU as a backend (engine/backend.h): the table the
 * one decode driver (engine/decode.c) and the graph runner run. Each
 * entry is a thin step over the run context (cuda_ctx.cu) and the forward
 * (cuda_forward.cu); what a decode does with them is the driver's. */
#include "cuda_internal.cuh"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_device.h"

static KvCudaRun *cuda_run(KvBackend *b) { return (KvCudaRun *)(void *)b; }
static const KvCudaRun *cuda_run_const(const KvBackend *b) {
    return (const KvCudaRun *)(const void *)b;
}

/* The report's device text, or KV_SKIP with why there is none. */
static KvStatus cuda_query(char *device, size_t device_len, KvError *err) {
    KvCudaInfo info;
    KvError qerr = {{0}};
    const KvStatus st = kv_cuda_query(&info, &qerr);
    if (st != KV_OK) {
        /* KV_SKIP: no GPU here; anything else is a GPU this build cannot use. */
        return kv_error_set(err, st == KV_SKIP ? KV_SKIP : KV_ERR_INTERNAL, "%s", qerr.msg);
    }
    if (device != NULL && device_len > 0) {
        snprintf(device, device_len, "%.200s (sm_%d%d), driver %d, runtime %d", info.name,
                 info.cc_major, info.cc_minor, info.driver_version, info.runtime_version);
    }
    return KV_OK;
}

static void cuda_destroy(KvBackend *b) {
    KvCudaRun *r = cuda_run(b);
    if (r == NULL) return;
    kv_rows_destroy(r->rows);
    kv_cuda_graph_free(&r->graph);
    if (r->ctx.stream != NULL) kv_cuda_ctx_destroy(&r->ctx);
    free(r->logits);
    free(r->tokens);
    free(r->margins);
    free(r->probe_hash);
    free(r->nf_index);
    free(r->nf_value);
    free(r);
}

/* Row b's run of a per-row batch (backend_rows.h): rows after the first
 * borrow its device weights. */
static KvStatus cuda_create_row(const KvModel *m, const KvBackendSetup *one, KvBackend *first,
                                KvBackend **out, KvError *err) {
    KvCudaRun *r = NULL;
    const KvStatus st =
        kv_cuda_run_create(m, one, first != NULL ? &cuda_run(first)->ctx : NULL, &r, err);
    *out = (KvBackend *)(void *)r;
    return st;
}

KvStatus kv_cuda_run_create(const KvModel *m, const KvBackendSetup *setup,
                            const KvCudaCtx *weights, KvCudaRun **out, KvError *err) {
    KvStatus st = KV_OK;
    KvCudaRun *r = NULL;
    const int64_t B = setup->batch, V = m->config.vocab_size;
    *out = NULL;
    /* A variant with no GPU form is the caller's mistake on any machine:
     * refused before any CUDA call. */
    if (setup->variant != NULL && !kv_cuda_cache_supports(setup->variant)) {
        return kv_error_set(err, KV_ERR_INPUT,
                            "cuda decode: variant '%s' has no GPU implementation (expected "
                            "index_copy, cat_shift, roll, always_roll, ring or dynamic)",
                            setup->variant->name != NULL ? setup->variant->name : "(null)");
    }
    /* Ensemble orders calibrate tolerances on the CPU reference alone. */
    if (setup->order != 0) {
        return kv_error_set(err, KV_ERR_INPUT,
                            "cuda decode: reduction-order ensembles (order %u) run on the cpu "
                            "reference only", setup->order);
    }
    r = (KvCudaRun *)calloc(1, sizeof *r);
    if (r == NULL) return kv_error_set(err, KV_ERR_INTERNAL, "cuda: out of host memory");
    if (setup->per_row) {
        /* Rows at their own positions: one single-row run per row. */
        st = kv_rows_create(&kv_backend_cuda, cuda_create_row, m, setup, &r->rows, err);
        if (st != KV_OK) goto cleanup;
    } else {
        st = kv_cuda_ctx_create(&r->ctx, m, B, setup->max_len, setup->max_chunk, setup->variant,
                                setup->faults, setup->probes, weights, r->device,
                                sizeof r->device, err);
        if (st != KV_OK) goto cleanup;
    }
    snprintf(r->math_mode, sizeof r->math_mode, "%s",
             (setup->faults & KV_FAULT_TF32) ? "TF32 tensor ops (planted fault tf32)"
                                             : "pedantic fp32 (no TF32)");
    if (r->rows != NULL) goto cleanup; /* outputs live in the row runs */
    r->logits = (float *)malloc((size_t)(B * V) * sizeof *r->logits);
    r->tokens = (int32_t *)malloc((size_t)B * sizeof *r->tokens);
    r->margins = (float *)malloc((size_t)B * sizeof *r->margins);
    if (setup->probes) {
        r->probe_hash = (uint64_t *)malloc((size_t)(r->ctx.n_probes * B) * sizeof *r->probe_hash);
        r->nf_index = (int64_t *)malloc((size_t)(r->ctx.n_probes * B) * sizeof *r->nf_index);
        r->nf_value = (float *)malloc((size_t)(r->ctx.n_probes * B) * sizeof *r->nf_value);
    }
    if (!r->logits || !r->tokens || !r->margins ||
        (setup->probes && (!r->probe_hash || !r->nf_index || !r->nf_value))) {
        st = kv_error_set(err, KV_ERR_INTERNAL, "cuda: out of host memory");
        goto cleanup;
    }
cleanup:
    if (st != KV_OK) {
        cuda_destroy((KvBackend *)(void *)r);
    } else {
        *out = r;
    }
    return st;
}

static KvStatus cuda_create(const KvModel *m, const KvBackendSetup *setup, KvBackend **out,
                            KvError *err) {
    KvCudaRun *r = NULL;
    const KvStatus st = kv_cuda_run_create(m, setup, NULL, &r, err);
    *out = (KvBackend *)(void *)r;
    return st;
}

static KvStatus cuda_set_input(KvBackend *b, const int32_t *tokens, const uint8_t *real,
                               int64_t n, KvError *err) {
    KvCudaRun *r = cuda_run(b);
    if (r->rows != NULL) return kv_rows_set_input(r->rows, tokens, real, n, err);
    KvStatus st = KV_OK;
    KvCudaCtx *ctx = &r->ctx;
    if (n < 1 || n > ctx->max_chunk || ctx->len + n > ctx->max_len) {
        return kv_error_set(err, KV_ERR_INPUT,
                            "cuda forward: %lld new tokens at slot %lld exceed the state "
                            "(max_chunk %lld, max_len %lld)",
                            (long long)n, (long long)ctx->len, (long long)ctx->max_chunk,
                            (long long)ctx->max_len);
    }
    /* Synchronous: the caller reuses its host buffers (pageable memory). */
    KV_CUDA_CHECK(cudaMemcpyAsync(ctx->tok_in, tokens, (size_t)(ctx->B * n) * sizeof(int32_t),
                                  cudaMemcpyHostToDevice, ctx->stream));
    KV_CUDA_CHECK(cudaMemcpyAsync(ctx->real_in, real, (size_t)(ctx->B * n),
                                  cudaMemcpyHostToDevice, ctx->stream));
    KV_CUDA_CHECK(cudaStreamSynchronize(ctx->stream));
cleanup:
    return st;
}

/* The host side of an executed forward of n: dynamic's shapes, the count. */
static void cuda_advance(KvCudaCtx *ctx, int64_t n) {
    kv_cuda_cache_advance(ctx, n);
    ctx->len += n;
}

static KvStatus cuda_forward(KvBackend *b, int64_t n, KvError *err) {
    KvCudaRun *r = cuda_run(b);
    if (r->rows != NULL) {
        r->eager_forwards++;
        return kv_rows_forward(r->rows, n, err);
    }
    const KvStatus st = kv_cuda_launch_forward(&r->ctx, n, err);
    if (st != KV_OK) return st;
    cuda_advance(&r->ctx, n);
    r->eager_forwards++;
    return KV_OK;
}

static void cuda_layer_key(const KvBackend *b, int64_t layer, int64_t n, int64_t *regime,
                           int64_t *slots) {
    if (cuda_run_const(b)->rows != NULL) {
        kv_rows_layer_key(cuda_run_const(b)->rows, layer, n, regime, slots);
        return;
    }
    const KvCudaCtx *ctx = &cuda_run_const(b)->ctx;
    *regime = kv_cuda_cache_regime(ctx, layer, ctx->len);
    *slots = kv_cuda_cache_n_slots(ctx, layer, n, false);
}

static KvStatus cuda_capture(KvBackend *b, int64_t n, KvError *err) {
    KvCudaRun *r = cuda_run(b);
    if (r->rows != NULL) return kv_rows_capture(r->rows, n, err);
    return kv_cuda_graph_capture(&r->graph, &r->ctx, n, err);
}

static KvStatus cuda_replay(KvBackend *b, KvError *err) {
    KvCudaRun *r = cuda_run(b);
    if (r->rows != NULL) {
        r->graph.launches++;
        return kv_rows_replay(r->rows, err);
    }
    const KvStatus st = kv_cuda_graph_launch(&r->graph, &r->ctx, err);
    if (st != KV_OK) return st;
    cuda_advance(&r->ctx, r->graph.n);
    return KV_OK;
}

static KvStatus cuda_snapshot_save(KvBackend *b, int slot, KvError *err) {
    if (cuda_run(b)->rows != NULL) return kv_rows_snapshot(cuda_run(b)->rows, slot, true, err);
    return kv_cuda_snapshot(&cuda_run(b)->ctx, slot, true, err);
}

static KvStatus cuda_snapshot_load(KvBackend *b, int slot, KvError *err) {
    if (cuda_run(b)->rows != NULL) return kv_rows_snapshot(cuda_run(b)->rows, slot, false, err);
    return kv_cuda_snapshot(&cuda_run(b)->ctx, slot, false, err);
}

static KvStatus cuda_shift(KvBackend *b, int64_t keep, int64_t drop, KvError *err) {
    if (cuda_run(b)->rows != NULL) {
        /* as the CPU reference (kv_cpu_shift) */
        return kv_error_set(err, KV_ERR_INPUT, "context shift: rows at their own positions "
                            "(right padding) are not shifted");
    }
    return kv_cuda_shift(&cuda_run(b)->ctx, keep, drop, err);
}

/* Copies the last forward's outputs to the host and checks the device error
 * flags. */
static KvStatus cuda_read_step(KvBackend *b, KvBackendStep *out, KvError *err) {
    KvCudaRun *r = cuda_run(b);
    if (r->rows != NULL) return kv_rows_read_step(r->rows, out, err);
    if (r->nf_error[0] != '\0') {
        return kv_error_set(err, KV_ERR_INTERNAL, "cuda: reading the probes' finite check: %s",
                            r->nf_error);
    }
    KvStatus st = KV_OK;
    KvCudaCtx *ctx = &r->ctx;
    const int64_t B = ctx->B, V = ctx->vocab;
    int32_t flags = 0;
    KV_CUDA_CHECK(cudaMemcpyAsync(r->logits, ctx->logits, (size_t)(B * V) * sizeof(float),
                                  cudaMemcpyDeviceToHost, ctx->stream));
    KV_CUDA_CHECK(cudaMemcpyAsync(r->tokens, ctx->next_tok, (size_t)B * sizeof(int32_t),
                                  cudaMemcpyDeviceToHost, ctx->stream));
    KV_CUDA_CHECK(cudaMemcpyAsync(r->margins, ctx->margin, (size_t)B * sizeof(float),
                                  cudaMemcpyDeviceToHost, ctx->stream));
    if (r->probe_hash != NULL) {
        KV_CUDA_CHECK(cudaMemcpyAsync(r->probe_hash, ctx->probe_hash,
                                      (size_t)(ctx->n_probes * B) * sizeof(uint64_t),
                                      cudaMemcpyDeviceToHost, ctx->stream));
    }
    KV_CUDA_CHECK(cudaMemcpyAsync(&flags, ctx->dev_err, sizeof flags, cudaMemcpyDeviceToHost,
                                  ctx->stream));
    KV_CUDA_CHECK(cudaStreamSynchronize(ctx->stream));
    if (flags != 0) {
        st = kv_cuda_dev_err_status(ctx, flags, "position", ctx->len - 1, err);
        goto cleanup;
    }
    out->logits = r->logits;
    out->tokens = r->tokens;
    out->margins = r->margins;
    out->probe_hash = r->probe_hash;
cleanup:
    return st;
}

/* The first non-finite probe value since the last take, by the CPU's order
 * (lowest probe, then row, then element), and forgets every record. A CUDA
 * error here cannot be returned: it is kept in nf_error for the next
 * read_step, and nothing is claimed. */
static bool cuda_take_nonfinite(KvBackend *b, KvNonfinite *out) {
    KvCudaRun *r = cuda_run(b);
    if (r->rows != NULL) return kv_rows_take_nonfinite(r->rows, out);
    KvCudaCtx *ctx = &r->ctx;
    if (r->nf_index == NULL || ctx->nf_index == NULL) return false;
    const int64_t n = ctx->n_probes * ctx->B;
    cudaError_t e = cudaMemcpyAsync(r->nf_index, ctx->nf_index, (size_t)n * sizeof(int64_t),
                                    cudaMemcpyDeviceToHost, ctx->stream);
    if (e == cudaSuccess) {
        e = cudaMemcpyAsync(r->nf_value, ctx->nf_value, (size_t)n * sizeof(float),
                            cudaMemcpyDeviceToHost, ctx->stream);
    }
    if (e == cudaSuccess) {
        e = cudaMemsetAsync(ctx->nf_index, 0xFF, (size_t)n * sizeof(int64_t), ctx->stream);
    }
    if (e == cudaSuccess) e = cudaStreamSynchronize(ctx->stream);
    if (e != cudaSuccess) {
        snprintf(r->nf_error, sizeof r->nf_error, "%s: %s", cudaGetErrorName(e),
                 cudaGetErrorString(e));
        return false;
    }
    for (int64_t i = 0; i < n; i++) { /* (n_probes, B): probe-major, then row */
        if (r->nf_index[i] < 0) continue;
        out->probe = i / ctx->B;
        out->row = i % ctx->B;
        out->index = r->nf_index[i];
        out->value = r->nf_value[i];
        return true;
    }
    return false;
}

static void cuda_stats(const KvBackend *b, KvBackendStats *out) {
    const KvCudaRun *r = cuda_run_const(b);
    out->graph_instantiations = r->graph.instantiations;
    out->exec_updates = r->graph.exec_updates;
    out->graph_launches = r->graph.launches;
    out->eager_forwards = r->eager_forwards;
    snprintf(out->device, sizeof out->device, "%s", r->device);
    snprintf(out->math_mode, sizeof out->math_mode, "%s", r->math_mode);
    if (r->rows != NULL) {
        /* per-row: each capture instantiates one graph per row */
        KvBackendStats rs;
        kv_rows_stats(r->rows, &rs);
        out->graph_instantiations = rs.graph_instantiations;
        out->exec_updates = rs.exec_updates;
        snprintf(out->device, sizeof out->device, "%s", rs.device);
    }
}

/* Probes are hashed and checked for NaN and Inf on the device (take_nonfinite);
 * full probe values are not kept (take_dump, peek_dump NULL). */
extern "C" const KvBackendOps kv_backend_cuda = {
    /* .name = */ "cuda",
    /* .host = */ false,
    /* .per_row = */ true, /* as one single-row run per row (backend_rows.h) */
    /* .query = */ cuda_query,
    /* .create = */ cuda_create,
    /* .destroy = */ cuda_destroy,
    /* .set_input = */ cuda_set_input,
    /* .forward = */ cuda_forward,
    /* .layer_key = */ cuda_layer_key,
    /* .capture = */ cuda_capture,
    /* .replay = */ cuda_replay,
    /* .snapshot_save = */ cuda_snapshot_save,
    /* .snapshot_load = */ cuda_snapshot_load,
    /* .read_step = */ cuda_read_step,
    /* .shift = */ cuda_shift,
    /* .take_nonfinite = */ cuda_take_nonfinite,
    /* .take_dump = */ NULL,
    /* .peek_dump = */ NULL,
    /* .stats = */ cuda_stats,
    /* .tape_save = */ NULL, /* the prefill tape is the CPU backend's (prefill_tape.h) */
    /* .tape_load = */ NULL,
};
