/* cuda_bench.cu: decode timings for bench/bench_cuda.c, over the CUDA
 * backend (cuda_backend.cu) and the graph runner every backend shares. */
#include "cuda_internal.cuh"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda_device.h"

static double cuda_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Eager: each step launched op by op, synchronised (a decode hands its token
 * to the host every step). */
static KvStatus bench_eager(KvBackend *b, KvCudaCtx *ctx, int64_t steps, KvCudaBenchResult *out,
                            KvError *err) {
    KvStatus st = KV_OK;
    double sum = 0.0;
    KV_CUDA_CHECK(cudaStreamSynchronize(ctx->stream));
    for (int64_t s = 0; s < steps; s++) {
        const double t0 = cuda_now();
        KV_TRY(kv_backend_cuda.forward(b, 1, err));
        KV_CUDA_CHECK(cudaStreamSynchronize(ctx->stream));
        const double dt = (cuda_now() - t0) * 1e3;
        sum += dt;
        if (dt < out->eager_ms_best) out->eager_ms_best = dt;
    }
    out->eager_ms_per_step = sum / (double)steps;
    KV_TRY(kv_cuda_check_dev_err(ctx, "eager bench step", steps, err));
cleanup:
    return st;
}

/* Graph: capture steps are timed apart from replays. */
static KvStatus bench_graph(KvBackend *b, KvCudaCtx *ctx, KvGraphRunner *runner, int64_t steps,
                            KvCudaBenchResult *out, KvError *err) {
    KvStatus st = KV_OK;
    double sum = 0.0;
    int64_t replays = 0;
    KV_CUDA_CHECK(cudaStreamSynchronize(ctx->stream));
    for (int64_t s = 0; s < steps; s++) {
        const int64_t before = runner->captures;
        const double t0 = cuda_now();
        KV_TRY(kv_graph_runner_step(runner, &kv_backend_cuda, b, ctx->n_layers, 1, err));
        KV_CUDA_CHECK(cudaStreamSynchronize(ctx->stream));
        const double dt = (cuda_now() - t0) * 1e3;
        if (runner->captures != before) {
            out->capture_ms += dt;
            continue;
        }
        sum += dt;
        replays++;
        if (dt < out->graph_ms_best) out->graph_ms_best = dt;
    }
    out->graph_ms_per_step = replays > 0 ? sum / (double)replays : 0.0;
    if (replays == 0) out->graph_ms_best = 0.0;
    KV_TRY(kv_cuda_check_dev_err(ctx, "graph bench step", steps, err));
cleanup:
    return st;
}

/* The floor: one eager step with CUDA events around every op. */
static KvStatus bench_ops(KvCudaCtx *ctx, KvCudaBenchResult *out, KvError *err) {
    KvStatus st = KV_OK;
    float ms = 0.0f;
    ctx->max_timed = 64 + 64 * ctx->n_layers;
    ctx->events = (cudaEvent_t *)calloc((size_t)(2 * ctx->max_timed), sizeof *ctx->events);
    if (ctx->events == NULL) return kv_error_set(err, KV_ERR_INTERNAL, "cuda bench: out of host memory");
    for (int64_t i = 0; i < 2 * ctx->max_timed; i++) KV_CUDA_CHECK(cudaEventCreate(&ctx->events[i]));
    KV_CUDA_CHECK(cudaStreamSynchronize(ctx->stream));
    ctx->n_timed = 0;
    ctx->timing = true;
    st = kv_cuda_launch_forward(ctx, 1, err);
    ctx->timing = false;
    if (st != KV_OK) goto cleanup;
    KV_CUDA_CHECK(cudaStreamSynchronize(ctx->stream));
    for (int64_t i = 0; i < ctx->n_timed; i++) {
        KV_CUDA_CHECK(cudaEventElapsedTime(&ms, ctx->events[2 * i], ctx->events[2 * i + 1]));
        out->kernel_sum_ms += (double)ms;
    }
    out->ops_per_step = ctx->n_timed;
    KV_TRY(kv_cuda_check_dev_err(ctx, "timed bench step", 1, err));
cleanup:
    return st;
}

extern "C" KvStatus kv_cuda_bench_decode(const KvModel *m, const KvDecodeSpec *sp,
                                         KvCudaBenchResult *out, KvError *err) {
    KvStatus st = KV_OK;
    const KvBackendOps *ops = &kv_backend_cuda;
    KvBackend *b = NULL;
    KvCudaRun *run = NULL;
    KvGraphRunner runner;
    memset(&runner, 0, sizeof runner);
    memset(out, 0, sizeof *out);
    KV_TRY(kv_decode_check_spec(m, sp, err));
    if (sp->new_tokens < 2) {
        st = kv_error_set(err, KV_ERR_INPUT, "cuda bench: expected new_tokens >= 2 (a decode step "
                                             "to time), found %lld",
                          (long long)sp->new_tokens);
        goto cleanup;
    }
    {
        const int64_t P = sp->prompt_len;
        const KvBackendSetup setup = {
            sp->batch, P + sp->new_tokens - 1,
            sp->prefill_chunk > 0 && sp->prefill_chunk < P ? sp->prefill_chunk : P,
            sp->variant, sp->faults, sp->order, false, false, false, false,
        };
        KV_TRY(ops->create(m, &setup, &b, err));
    }
    run = (KvCudaRun *)(void *)b;
    snprintf(out->device, sizeof out->device, "%s", run->device);
    out->steps = sp->new_tokens - 1;
    out->eager_ms_best = 1e30;
    out->graph_ms_best = 1e30;

    KV_TRY(kv_decode_prefill(ops, b, sp, NULL, err));
    KV_TRY(bench_eager(b, &run->ctx, out->steps, out, err));

    /* The same decode from a fresh state. */
    KV_TRY(kv_cuda_ctx_reset_state(&run->ctx, err));
    KvRecapturePolicy policy;
    policy.ignore_regime = (run->ctx.faults & KV_FAULT_NO_RECAPTURE) != 0;
    policy.every_step = (run->ctx.faults & KV_FAULT_RECAPTURE_EVERY_STEP) != 0;
    KV_TRY(kv_graph_runner_init(&runner, run->ctx.n_layers, policy, err));
    KV_TRY(kv_decode_prefill(ops, b, sp, NULL, err));
    KV_TRY(bench_graph(b, &run->ctx, &runner, out->steps, out, err));
    out->graphs_captured = runner.captures;
    out->graph_instantiations = run->graph.instantiations;
    out->exec_updates = run->graph.exec_updates;

    KV_TRY(kv_cuda_ctx_reset_state(&run->ctx, err));
    KV_TRY(kv_decode_prefill(ops, b, sp, NULL, err));
    KV_TRY(bench_ops(&run->ctx, out, err));
cleanup:
    kv_graph_runner_free(&runner);
    if (b != NULL) ops->destroy(b);
    return st;
}

extern "C" KvStatus kv_cuda_bench_bandwidth(size_t bytes, double *bytes_per_s, KvError *err) {
    KvStatus st = KV_OK;
    KvCudaInfo info;
    KvError qerr = {{0}};
    cudaStream_t stream = NULL;
    cudaEvent_t ev[2] = {NULL, NULL};
    void *src = NULL, *dst = NULL;
    float ms = 0.0f, best = 1e30f;

    *bytes_per_s = 0.0;
    st = kv_cuda_query(&info, &qerr);
    if (st != KV_OK) return kv_error_set(err, KV_SKIP, "CUDA backend unavailable: %s", qerr.msg);
    KV_CUDA_CHECK(cudaSetDevice(0));
    KV_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    KV_CUDA_CHECK(cudaEventCreate(&ev[0]));
    KV_CUDA_CHECK(cudaEventCreate(&ev[1]));
    KV_CUDA_CHECK(cudaMalloc(&src, bytes));
    KV_CUDA_CHECK(cudaMalloc(&dst, bytes));
    KV_CUDA_CHECK(cudaMemsetAsync(src, 0x5A, bytes, stream));
    KV_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, stream));
    /* A warm-up copy, then the best of several. */
    KV_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream));
    for (int rep = 0; rep < 5; rep++) {
        KV_CUDA_CHECK(cudaEventRecord(ev[0], stream));
        KV_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream));
        KV_CUDA_CHECK(cudaEventRecord(ev[1], stream));
        KV_CUDA_CHECK(cudaEventSynchronize(ev[1]));
        KV_CUDA_CHECK(cudaEventElapsedTime(&ms, ev[0], ev[1]));
        if (ms > 0.0f && ms < best) best = ms;
    }
    *bytes_per_s = 2.0 * (double)bytes / ((double)best * 1e-3);
cleanup:
    if (stream != NULL) (void)cudaStreamSynchronize(stream);
    (void)cudaFree(dst);
    (void)cudaFree(src);
    if (ev[1] != NULL) (void)cudaEventDestroy(ev[1]);
    if (ev[0] != NULL) (void)cudaEventDestroy(ev[0]);
    if (stream != NULL) (void)cudaStreamDestroy(stream);
    return st;
}
