/* cuda_bench.cu: decode timings for bench/bench_cuda.c, over the CUDA
 * backend (cuda_backend.cu) and the graph runner every backend shares:
 * eager and replayed steps as a decode runs them (host sync per step), the
 * replay floor (the step graph back to back, device time only), the step
 * graph's nodes, and one step timed op by op. */
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

/* Steps before the floor so that its replays start on a filled window:
 * from there a host-branch variant's regime and dynamic's attended length
 * stay put, so one captured graph is right for every replay. At least one,
 * so the runner has checked the capture key at the floor's first position. */
static int64_t bench_settle_steps(const KvModel *m, int64_t len_after_steps) {
    const int64_t W = kv_config_max_window(&m->config);
    const int64_t need = W + 1 - len_after_steps; /* the last settle step starts at len >= W */
    return need > 1 ? need : 1;
}

/* Node types of a captured graph, child graphs expanded (cuBLAS may nest
 * one under capture). */
static KvStatus bench_count_nodes(cudaGraph_t g, int depth, KvCudaBenchResult *out,
                                  KvError *err) {
    KvStatus st = KV_OK;
    size_t n = 0;
    cudaGraphNode_t *nodes = NULL; /* (n) */
    KV_CUDA_CHECK(cudaGraphGetNodes(g, NULL, &n));
    if (n == 0) goto cleanup;
    nodes = (cudaGraphNode_t *)calloc(n, sizeof *nodes);
    if (nodes == NULL) {
        st = kv_error_set(err, KV_ERR_INTERNAL, "cuda bench: out of host memory");
        goto cleanup;
    }
    KV_CUDA_CHECK(cudaGraphGetNodes(g, nodes, &n));
    for (size_t i = 0; i < n; i++) {
        cudaGraphNodeType type = cudaGraphNodeTypeEmpty;
        KV_CUDA_CHECK(cudaGraphNodeGetType(nodes[i], &type));
        if (type == cudaGraphNodeTypeGraph && depth < 4) {
            cudaGraph_t child = NULL; /* owned by the node */
            KV_CUDA_CHECK(cudaGraphChildGraphNodeGetGraph(nodes[i], &child));
            KV_TRY(bench_count_nodes(child, depth + 1, out, err));
            continue;
        }
        out->graph_nodes++;
        if (type == cudaGraphNodeTypeKernel) {
            out->graph_kernel_nodes++;
        } else if (type == cudaGraphNodeTypeMemcpy) {
            out->graph_memcpy_nodes++;
        } else if (type == cudaGraphNodeTypeMemset) {
            out->graph_memset_nodes++;
        } else {
            out->graph_other_nodes++;
        }
    }
cleanup:
    free(nodes);
    return st;
}

/* The replay floor, continuing the graph decode: settle steps (runner,
 * synchronised, untimed), one replay left running so that the device is
 * busy when the first event is recorded, then reps replays back to back
 * between one event pair, then one more runner step that checks the
 * capture key did not change across them. The timed replays go through the
 * backend's replay (the captured graph as it is, the host count advancing
 * with each) and not through the runner, so no capture can fall inside the
 * timed span. */
static KvStatus bench_floor(KvBackend *b, KvCudaRun *run, KvGraphRunner *runner, int64_t settle,
                            int64_t reps, KvCudaBenchResult *out, KvError *err) {
    KvStatus st = KV_OK;
    KvCudaCtx *ctx = &run->ctx;
    cudaEvent_t ev[2] = {NULL, NULL};
    float ms = 0.0f;
    KV_CUDA_CHECK(cudaEventCreate(&ev[0]));
    KV_CUDA_CHECK(cudaEventCreate(&ev[1]));
    for (int64_t s = 0; s < settle; s++) {
        KV_TRY(kv_graph_runner_step(runner, &kv_backend_cuda, b, ctx->n_layers, 1, err));
        KV_CUDA_CHECK(cudaStreamSynchronize(ctx->stream));
    }
    KV_TRY(kv_cuda_check_dev_err(ctx, "floor settle step", ctx->len, err));
    {
        const int64_t captures = runner->captures;
        KV_TRY(kv_backend_cuda.replay(b, err));
        KV_CUDA_CHECK(cudaEventRecord(ev[0], ctx->stream));
        const double t0 = cuda_now();
        for (int64_t k = 0; k < reps; k++) KV_TRY(kv_backend_cuda.replay(b, err));
        const double t1 = cuda_now();
        KV_CUDA_CHECK(cudaEventRecord(ev[1], ctx->stream));
        KV_CUDA_CHECK(cudaEventSynchronize(ev[1]));
        KV_CUDA_CHECK(cudaEventElapsedTime(&ms, ev[0], ev[1]));
        out->floor_ms_per_step = (double)ms / (double)reps;
        out->floor_host_ms_per_step = (t1 - t0) * 1e3 / (double)reps;
        out->floor_reps = reps;
        KV_TRY(kv_cuda_check_dev_err(ctx, "floor replay", ctx->len, err));
        /* The key only moves one way (a regime flips once, an attended
         * length grows to its cap), so the same key after the replays as
         * before means every replay ran the right graph. */
        KV_TRY(kv_graph_runner_step(runner, &kv_backend_cuda, b, ctx->n_layers, 1, err));
        KV_TRY(kv_cuda_check_dev_err(ctx, "floor check step", ctx->len, err));
        out->floor_stale = runner->captures != captures;
    }
cleanup:
    if (ev[1] != NULL) (void)cudaEventDestroy(ev[1]);
    if (ev[0] != NULL) (void)cudaEventDestroy(ev[0]);
    return st;
}

/* One eager step with CUDA events around every op; the sum of their times
 * (not a floor: each pair adds its own overhead). Launches the forward
 * directly, so the host count stays where it was: the last forward of the
 * run. */
static KvStatus bench_ops(KvCudaCtx *ctx, KvCudaBenchResult *out, KvError *err) {
    KvStatus st = KV_OK;
    float ms = 0.0f;
    ctx->max_timed = 64 + 64 * ctx->n_layers;
    ctx->events = (cudaEvent_t *)calloc((size_t)(2 * ctx->max_timed), sizeof *ctx->events);
    if (ctx->events == NULL) {
        return kv_error_set(err, KV_ERR_INTERNAL, "cuda bench: out of host memory");
    }
    for (int64_t i = 0; i < 2 * ctx->max_timed; i++) {
        KV_CUDA_CHECK(cudaEventCreate(&ctx->events[i]));
    }
    KV_CUDA_CHECK(cudaStreamSynchronize(ctx->stream));
    ctx->n_timed = 0;
    ctx->timing = true;
    st = kv_cuda_launch_forward(ctx, 1, err);
    ctx->timing = false;
    if (st != KV_OK) goto cleanup;
    KV_CUDA_CHECK(cudaStreamSynchronize(ctx->stream));
    for (int64_t i = 0; i < ctx->n_timed; i++) {
        KV_CUDA_CHECK(cudaEventElapsedTime(&ms, ctx->events[2 * i], ctx->events[2 * i + 1]));
        out->event_sum_ms += (double)ms;
    }
    out->ops_per_step = ctx->n_timed;
    KV_TRY(kv_cuda_check_dev_err(ctx, "timed bench step", ctx->len, err));
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
    int64_t steps = 0, settle = 0;
    memset(&runner, 0, sizeof runner);
    memset(out, 0, sizeof *out);
    KV_TRY(kv_decode_check_spec(m, sp, err));
    if (sp->new_tokens < 2) {
        st = kv_error_set(err, KV_ERR_INPUT, "cuda bench: expected new_tokens >= 2 (a decode step "
                                             "to time), found %lld",
                          (long long)sp->new_tokens);
        goto cleanup;
    }
    steps = sp->new_tokens - 1;
    {
        const int64_t P = sp->prompt_len;
        settle = bench_settle_steps(m, P + steps);
        /* Forwards after the prefill: the timed steps (eager, then graph
         * from a fresh state), then on from the graph steps: settle, one
         * replay before the floor's first event, the floor, its check
         * step, and the op-timed step. */
        const int64_t max_len = P + steps + settle + 1 + KV_CUDA_BENCH_FLOOR_REPS + 1 + 1;
        const KvBackendSetup setup = {
            sp->batch, max_len,
            sp->prefill_chunk > 0 && sp->prefill_chunk < P ? sp->prefill_chunk : P,
            sp->variant, sp->faults, sp->order, false, false, false, false,
        };
        KV_TRY(ops->create(m, &setup, &b, err));
    }
    run = (KvCudaRun *)(void *)b;
    snprintf(out->device, sizeof out->device, "%s", run->device);
    out->steps = steps;
    out->eager_ms_best = 1e30;
    out->graph_ms_best = 1e30;
    out->floor_settle_steps = settle;

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

    KV_TRY(bench_floor(b, run, &runner, settle, KV_CUDA_BENCH_FLOOR_REPS, out, err));
    if (run->graph.graph == NULL) {
        st = kv_error_set(err, KV_ERR_INTERNAL, "cuda bench: no decode graph was captured");
        goto cleanup;
    }
    KV_TRY(bench_count_nodes(run->graph.graph, 0, out, err));

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
