/* cuda_forward.cu: greedy decoding on the GPU (cuda_forward.h): the run
 * context, the forward pass as a sequence of launches on one stream, the
 * CUDA-graph runner, the replay check and the benchmark entry points.
 *
 * Design:
 *   - One stream and one cuBLAS handle per run. cublasSetStream, then
 *     cublasSetWorkspace with our own 32 MiB buffer (SetStream resets the
 *     workspace; a user workspace is what lets cuBLAS run under stream
 *     capture with the same kernels as eagerly), CUBLAS_PEDANTIC_MATH (fp32,
 *     no TF32; KV_FAULT_TF32 is the only way to get TF32),
 *     CUBLAS_ATOMICS_NOT_ALLOWED, pointer mode device (alpha, beta in device
 *     memory). Matmuls are cublasSgemm on row-major (out, in) weights.
 *   - Everything is allocated before the first step; positions, tokens and
 *     the fault clock live in device memory and are read by kernels at
 *     execution, so a captured step is replayable (DESIGN §4). The host keeps
 *     only what a framework keeps on the host: its count of filled slots
 *     (cat_shift's and roll's regime) and dynamic's filled count (a shape).
 *   - Graph mode mirrors kv_graph_runner_step (reference/forward.c): after
 *     the eager prefill, each one-token step computes a capture key (n, and
 *     per sliding layer the host regime and attended length); a new key
 *     re-captures the whole step (layers, lm_head, argmax writing the next
 *     token, position increment, probe hashes). A re-capture is applied to
 *     the existing executable with cudaGraphExecUpdate when the topology
 *     allows it, else instantiated anew; both are counted.
 *   - The replay check snapshots the persistent device state (D2D copies)
 *     and the host's dynamic counts, runs the step K times from it and
 *     compares the logits bytes.
 *   - Probes are FNV-1a 64 kernels inside the step writing a device buffer,
 *     with the CPU's names, order and byte definitions.
 *
 * Written on a machine without a GPU. Verified there by compilation only:
 * everything that needs real hardware: concurrency inside and across blocks
 * (the kernels are written race-free, but only a GPU can show it), cuBLAS's
 * real kernels and their behaviour under stream capture, the driver's rules
 * for cudaGraphExecUpdate, the legacy-stream vs non-blocking-stream ordering
 * of setup copies, device libm results, and all timings. What ran there: the
 * no-device path (KV_SKIP naming cudaGetDeviceCount) and the spec checks
 * before any CUDA call; and, outside the tree, tests/test_cuda_forward.c's
 * whole device suite against a CPU emulation of the CUDA runtime (kernels as
 * cooperative fibers with real __syncthreads barriers, graphs as recorded
 * launches with arguments frozen at capture, capture-unsafe calls refused,
 * cuBLAS as a plain loop), also under ASan + UBSan: the variants' bitwise
 * equality, graph = eager with the expected capture counts, the replay
 * check, teacher forcing, GPU-vs-CPU tolerance and the planted faults. */
#include "cuda_internal.cuh"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda_device.h"

extern "C" {
#include "forward.h"
#include "kvmath.h"
}

/* 32 MiB: NVIDIA's recommended cuBLAS workspace for Hopper (4 MiB suffices
 * before it); fixed, so cuBLAS's algorithm choice cannot depend on what the
 * default pool happens to have. */
#define KV_CUDA_BLAS_WS_BYTES ((size_t)32 << 20)
/* Weight tensors start on 256-byte boundaries in the arena (cuBLAS's
 * preferred alignment). */
#define KV_CUDA_ARENA_ALIGN_FLOATS 64
/* The replay check's default K, as decode.c. */
#define KV_CUDA_REPLAY_K 3

static const char *const k_variant_names[] = {"reference", "index_copy", "cat_shift", "roll",
                                              "always_roll", "ring", "dynamic"};

static double cuda_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- allocation ---- */

/* cudaMalloc of `bytes` (at least 256, so a zero-slot buffer is still a
 * valid distinct pointer), zeroed, recorded for cuda_ctx_destroy. */
static KvStatus cuda_alloc(KvCudaCtx *ctx, void **p, size_t bytes, KvError *err) {
    KvStatus st = KV_OK;
    void *d = NULL;
    if (bytes < 256) bytes = 256;
    if (ctx->n_allocs == ctx->cap_allocs) {
        const int64_t cap = ctx->cap_allocs > 0 ? 2 * ctx->cap_allocs : 64;
        void **grown = (void **)realloc(ctx->allocs, (size_t)cap * sizeof *grown);
        if (grown == NULL) return kv_error_set(err, KV_ERR_INTERNAL, "cuda: out of host memory");
        ctx->allocs = grown;
        ctx->cap_allocs = cap;
    }
    KV_CUDA_CHECK(cudaMalloc(&d, bytes));
    ctx->allocs[ctx->n_allocs++] = d;
    KV_CUDA_CHECK(cudaMemset(d, 0, bytes));
    *p = d;
cleanup:
    return st;
}

#define KV_ALLOC(ptr, bytes) KV_TRY(cuda_alloc(ctx, (void **)&(ptr), (size_t)(bytes), err))

/* ---- context ---- */

static void cuda_ctx_destroy(KvCudaCtx *ctx) {
    /* Nothing here can fix an earlier failure or must mask it: results are
     * ignored. */
    if (ctx->stream != NULL) (void)cudaStreamSynchronize(ctx->stream);
    for (int64_t i = 0; ctx->events != NULL && i < 2 * ctx->max_timed; i++) {
        if (ctx->events[i] != NULL) (void)cudaEventDestroy(ctx->events[i]);
    }
    free(ctx->events);
    if (ctx->blas != NULL) (void)cublasDestroy(ctx->blas);
    for (int64_t i = ctx->n_allocs - 1; i >= 0; i--) (void)cudaFree(ctx->allocs[i]);
    free(ctx->allocs);
    free(ctx->layers);
    free(ctx->kc);
    free(ctx->vc);
    free(ctx->snap_kc);
    free(ctx->snap_vc);
    free(ctx->caches);
    if (ctx->stream != NULL) (void)cudaStreamDestroy(ctx->stream);
    (void)cudaGetLastError(); /* leave no error behind for the next run */
    memset(ctx, 0, sizeof *ctx);
}

/* Stream, cuBLAS handle and its settings. Any failure here is "CUDA not
 * usable here" for the caller (KV_SKIP). */
static KvStatus cuda_ctx_setup(KvCudaCtx *ctx, KvError *err) {
    KvStatus st = KV_OK;
    const float one = 1.0f, zero = 0.0f;
    const cublasMath_t math =
        (ctx->faults & KV_FAULT_TF32) ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_PEDANTIC_MATH;
    KV_CUDA_CHECK(cudaSetDevice(0));
    /* Non-blocking: no implicit synchronisation with the legacy stream. */
    KV_CUDA_CHECK(cudaStreamCreateWithFlags(&ctx->stream, cudaStreamNonBlocking));
    KV_CUBLAS_CHECK(cublasCreate(&ctx->blas));
    KV_CUBLAS_CHECK(cublasSetStream(ctx->blas, ctx->stream));
    ctx->blas_ws_bytes = KV_CUDA_BLAS_WS_BYTES;
    KV_ALLOC(ctx->blas_ws, ctx->blas_ws_bytes);
    KV_CUBLAS_CHECK(cublasSetWorkspace(ctx->blas, ctx->blas_ws, ctx->blas_ws_bytes));
    KV_CUBLAS_CHECK(cublasSetMathMode(ctx->blas, math));
    KV_CUBLAS_CHECK(cublasSetAtomicsMode(ctx->blas, CUBLAS_ATOMICS_NOT_ALLOWED));
    KV_CUBLAS_CHECK(cublasSetPointerMode(ctx->blas, CUBLAS_POINTER_MODE_DEVICE));
    KV_ALLOC(ctx->one, sizeof(float));
    KV_ALLOC(ctx->zero, sizeof(float));
    KV_CUDA_CHECK(cudaMemcpy(ctx->one, &one, sizeof one, cudaMemcpyHostToDevice));
    KV_CUDA_CHECK(cudaMemcpy(ctx->zero, &zero, sizeof zero, cudaMemcpyHostToDevice));
cleanup:
    return st;
}

/* One weight tensor to upload: n floats from host into *dst's arena slot. */
typedef struct {
    const float *host; /* (n) */
    size_t n;
    const float **dst;
} CudaUpload;

/* Appends a tensor to the upload list; a NULL host tensor (absent for the
 * family) is skipped and its device pointer stays NULL. */
static void cuda_upload_add(CudaUpload *up, size_t *n_up, const float *host, size_t n,
                            const float **dst) {
    if (host == NULL) return;
    up[*n_up].host = host;
    up[*n_up].n = n;
    up[*n_up].dst = dst;
    (*n_up)++;
}

static KvStatus cuda_ctx_upload(KvCudaCtx *ctx, KvError *err) {
    KvStatus st = KV_OK;
    const KvModel *m = ctx->model;
    const size_t hidden = (size_t)ctx->hidden, inter = (size_t)ctx->inter;
    const size_t q_dim = (size_t)ctx->q_dim, kv_dim = (size_t)ctx->kv_dim;
    const size_t vocab = (size_t)ctx->vocab;
    const bool tied = m->lm_head == m->embed;
    const size_t max_up = 3 + 11 * (size_t)ctx->n_layers;
    CudaUpload *up = (CudaUpload *)calloc(max_up, sizeof *up);
    size_t n_up = 0, total = 0, off = 0;
    if (up == NULL) return kv_error_set(err, KV_ERR_INTERNAL, "cuda: out of host memory");
    ctx->layers = (KvCudaLayer *)calloc((size_t)ctx->n_layers, sizeof *ctx->layers);
    if (ctx->layers == NULL) {
        st = kv_error_set(err, KV_ERR_INTERNAL, "cuda: out of host memory");
        goto cleanup;
    }
    cuda_upload_add(up, &n_up, m->embed, vocab * hidden, &ctx->w_embed);
    cuda_upload_add(up, &n_up, m->final_norm, hidden, &ctx->w_final_norm);
    if (!tied) cuda_upload_add(up, &n_up, m->lm_head, vocab * hidden, &ctx->w_lm_head);
    for (int64_t l = 0; l < ctx->n_layers; l++) {
        const KvLayerWeights *w = &m->layers[l];
        KvCudaLayer *d = &ctx->layers[l];
        cuda_upload_add(up, &n_up, w->input_norm, hidden, &d->input_norm);
        cuda_upload_add(up, &n_up, w->post_attn_norm, hidden, &d->post_attn_norm);
        /* gemma2 only; NULL for mistral */
        cuda_upload_add(up, &n_up, w->pre_ffw_norm, hidden, &d->pre_ffw_norm);
        cuda_upload_add(up, &n_up, w->post_ffw_norm, hidden, &d->post_ffw_norm);
        cuda_upload_add(up, &n_up, w->wq, q_dim * hidden, &d->wq);
        cuda_upload_add(up, &n_up, w->wk, kv_dim * hidden, &d->wk);
        cuda_upload_add(up, &n_up, w->wv, kv_dim * hidden, &d->wv);
        cuda_upload_add(up, &n_up, w->wo, hidden * q_dim, &d->wo);
        cuda_upload_add(up, &n_up, w->w_gate, inter * hidden, &d->w_gate);
        cuda_upload_add(up, &n_up, w->w_up, inter * hidden, &d->w_up);
        cuda_upload_add(up, &n_up, w->w_down, hidden * inter, &d->w_down);
    }
    for (size_t i = 0; i < n_up; i++) {
        total += (up[i].n + KV_CUDA_ARENA_ALIGN_FLOATS - 1) / KV_CUDA_ARENA_ALIGN_FLOATS *
                 KV_CUDA_ARENA_ALIGN_FLOATS;
    }
    ctx->w_arena_floats = total;
    KV_ALLOC(ctx->w_arena, total * sizeof(float));
    for (size_t i = 0; i < n_up; i++) {
        KV_CUDA_CHECK(cudaMemcpy(ctx->w_arena + off, up[i].host, up[i].n * sizeof(float),
                                 cudaMemcpyHostToDevice));
        *up[i].dst = ctx->w_arena + off;
        off += (up[i].n + KV_CUDA_ARENA_ALIGN_FLOATS - 1) / KV_CUDA_ARENA_ALIGN_FLOATS *
               KV_CUDA_ARENA_ALIGN_FLOATS;
    }
    if (tied) ctx->w_lm_head = ctx->w_embed;
cleanup:
    free(up);
    return st;
}

static KvStatus cuda_slots_alloc(KvCudaCtx *ctx, KvCudaSlots *s, int64_t slots, KvError *err) {
    KvStatus st = KV_OK;
    const size_t fbytes = (size_t)(ctx->B * slots * ctx->kv_dim) * sizeof(float);
    KV_ALLOC(s->k, fbytes);
    KV_ALLOC(s->v, fbytes);
    KV_ALLOC(s->real, (size_t)(ctx->B * slots));
    KV_ALLOC(s->pos, (size_t)slots * sizeof(int64_t));
cleanup:
    return st;
}

static KvStatus cuda_ctx_alloc_state(KvCudaCtx *ctx, KvError *err) {
    KvStatus st = KV_OK;
    const int64_t L = ctx->n_layers, B = ctx->B;
    const int64_t rows = B * ctx->max_chunk;
    const size_t static_bytes = (size_t)(B * ctx->max_len * ctx->kv_dim) * sizeof(float);
    float *inv = (float *)calloc((size_t)(ctx->hd / 2 > 0 ? ctx->hd / 2 : 1), sizeof *inv);
    ctx->kc = (float **)calloc((size_t)L, sizeof *ctx->kc);
    ctx->vc = (float **)calloc((size_t)L, sizeof *ctx->vc);
    ctx->snap_kc = (float **)calloc((size_t)L, sizeof *ctx->snap_kc);
    ctx->snap_vc = (float **)calloc((size_t)L, sizeof *ctx->snap_vc);
    ctx->caches = (KvCudaCache *)calloc((size_t)L, sizeof *ctx->caches);
    if (inv == NULL || ctx->kc == NULL || ctx->vc == NULL || ctx->snap_kc == NULL ||
        ctx->snap_vc == NULL || ctx->caches == NULL) {
        st = kv_error_set(err, KV_ERR_INTERNAL, "cuda: out of host memory");
        goto cleanup;
    }
    for (int64_t l = 0; l < L; l++) {
        const int64_t w = kv_config_layer_window(ctx->c, l);
        KvCudaCache *c = &ctx->caches[l];
        if (ctx->variant == KV_CUDA_REFERENCE || w == 0) {
            KV_ALLOC(ctx->kc[l], static_bytes);
            KV_ALLOC(ctx->vc[l], static_bytes);
            KV_ALLOC(ctx->snap_kc[l], static_bytes);
            KV_ALLOC(ctx->snap_vc[l], static_bytes);
            continue;
        }
        c->window = w;
        c->slots = ctx->variant == KV_CUDA_DYNAMIC ? w - 1 : w;
        KV_TRY(cuda_slots_alloc(ctx, &c->cur, c->slots, err));
        KV_TRY(cuda_slots_alloc(ctx, &c->tmp, c->slots, err));
        KV_TRY(cuda_slots_alloc(ctx, &c->snap, c->slots, err));
        KV_ALLOC(c->indices, (size_t)w * sizeof(int64_t));
    }
    KV_ALLOC(ctx->real, B * ctx->max_len);
    KV_ALLOC(ctx->n_real, B * (int64_t)sizeof(int64_t));
    KV_ALLOC(ctx->total, sizeof(int64_t));
    KV_ALLOC(ctx->tok_in, rows * (int64_t)sizeof(int32_t));
    KV_ALLOC(ctx->real_in, rows);
    KV_ALLOC(ctx->snap_real, B * ctx->max_len);
    KV_ALLOC(ctx->snap_n_real, B * (int64_t)sizeof(int64_t));
    KV_ALLOC(ctx->snap_total, sizeof(int64_t));
    KV_ALLOC(ctx->snap_tok_in, rows * (int64_t)sizeof(int32_t));
    KV_ALLOC(ctx->snap_real_in, rows);

    KV_ALLOC(ctx->inv_freq, (ctx->hd / 2) * (int64_t)sizeof(float));
    KV_ALLOC(ctx->x, rows * ctx->hidden * (int64_t)sizeof(float));
    KV_ALLOC(ctx->xn, rows * ctx->hidden * (int64_t)sizeof(float));
    KV_ALLOC(ctx->q, rows * ctx->q_dim * (int64_t)sizeof(float));
    KV_ALLOC(ctx->kn, rows * ctx->kv_dim * (int64_t)sizeof(float));
    KV_ALLOC(ctx->vn, rows * ctx->kv_dim * (int64_t)sizeof(float));
    KV_ALLOC(ctx->att, rows * ctx->q_dim * (int64_t)sizeof(float));
    KV_ALLOC(ctx->tmp, rows * ctx->hidden * (int64_t)sizeof(float));
    KV_ALLOC(ctx->gate, rows * ctx->inter * (int64_t)sizeof(float));
    KV_ALLOC(ctx->up, rows * ctx->inter * (int64_t)sizeof(float));
    KV_ALLOC(ctx->qpos, rows * (int64_t)sizeof(int64_t));
    KV_ALLOC(ctx->gidx, rows * ctx->max_keys * (int64_t)sizeof(int32_t));
    KV_ALLOC(ctx->nkeys, rows * (int64_t)sizeof(int32_t));
    KV_ALLOC(ctx->gtab, rows * (ctx->window + 1) * (int64_t)sizeof(int32_t));
    KV_ALLOC(ctx->probe_map, B * (ctx->window + 1) * (int64_t)sizeof(int32_t));
    KV_ALLOC(ctx->last, B * ctx->hidden * (int64_t)sizeof(float));
    KV_ALLOC(ctx->logits, B * ctx->vocab * (int64_t)sizeof(float));
    KV_ALLOC(ctx->next_tok, B * (int64_t)sizeof(int32_t));
    KV_ALLOC(ctx->margin, B * (int64_t)sizeof(float));
    KV_ALLOC(ctx->probe_hash, ctx->n_probes * B * (int64_t)sizeof(uint64_t));
    KV_ALLOC(ctx->dev_err, sizeof(int32_t));
    KV_ALLOC(ctx->fault_clock, sizeof(uint64_t));

    /* The host's inverse frequencies (kvmath.c), so both backends rotate by
     * the same F32 constants. */
    kv_rope_inv_freq(ctx->hd, ctx->c->rope_theta, inv);
    KV_CUDA_CHECK(cudaMemcpy(ctx->inv_freq, inv, (size_t)(ctx->hd / 2) * sizeof(float),
                             cudaMemcpyHostToDevice));
cleanup:
    free(inv);
    return st;
}

/* Empties the caches (K/V NaN-poisoned, as the CPU's reset: a read of a
 * never-written slot shows up in the logits; positions -1, real 0) and
 * zeroes positions and inputs. Synchronous. */
static KvStatus cuda_ctx_reset_state(KvCudaCtx *ctx, KvError *err) {
    KvStatus st = KV_OK;
    const int64_t B = ctx->B, D = ctx->kv_dim;
    const size_t static_bytes = (size_t)(B * ctx->max_len * D) * sizeof(float);
    for (int64_t l = 0; l < ctx->n_layers; l++) {
        KvCudaCache *c = &ctx->caches[l];
        if (ctx->kc[l] != NULL) {
            KV_TRY(kv_cuda_fill(ctx, ctx->kc[l], 0xFF, static_bytes, err)); /* NaN */
            KV_TRY(kv_cuda_fill(ctx, ctx->vc[l], 0xFF, static_bytes, err));
            continue;
        }
        KvCudaSlots *sets[2] = {&c->cur, &c->tmp};
        for (int i = 0; i < 2; i++) {
            const size_t fbytes = (size_t)(B * c->slots * D) * sizeof(float);
            KV_TRY(kv_cuda_fill(ctx, sets[i]->k, 0xFF, fbytes, err));
            KV_TRY(kv_cuda_fill(ctx, sets[i]->v, 0xFF, fbytes, err));
            KV_TRY(kv_cuda_fill(ctx, sets[i]->real, 0, (size_t)(B * c->slots), err));
            KV_TRY(kv_cuda_fill(ctx, sets[i]->pos, 0xFF, (size_t)c->slots * sizeof(int64_t), err));
        }
        c->filled = 0;
    }
    KV_TRY(kv_cuda_fill(ctx, ctx->real, 0, (size_t)(B * ctx->max_len), err));
    KV_TRY(kv_cuda_fill(ctx, ctx->n_real, 0, (size_t)B * sizeof(int64_t), err));
    KV_TRY(kv_cuda_fill(ctx, ctx->total, 0, sizeof(int64_t), err));
    KV_TRY(kv_cuda_fill(ctx, ctx->dev_err, 0, sizeof(int32_t), err));
    KV_TRY(kv_cuda_fill(ctx, ctx->fault_clock, 0, sizeof(uint64_t), err));
    KV_CUDA_CHECK(cudaStreamSynchronize(ctx->stream));
    ctx->len = 0;
cleanup:
    return st;
}

/* Fills the shapes and sets everything up. KV_SKIP (with CUDA's text) when
 * no device is usable or setup fails; on any failure ctx is destroyed. */
static KvStatus cuda_ctx_create(KvCudaCtx *ctx, const KvModel *m, int64_t B, int64_t max_len,
                                int64_t max_chunk, KvCudaVariant variant, unsigned faults,
                                bool probes, char *device, size_t device_len, KvError *err) {
    KvStatus st = KV_OK;
    KvCudaInfo info;
    KvError qerr = {{0}};
    int blas_version = 0;
    const KvConfig *c = &m->config;

    memset(ctx, 0, sizeof *ctx);
    ctx->model = m;
    ctx->c = c;
    ctx->variant = variant;
    ctx->variant_name = k_variant_names[variant];
    ctx->faults = faults;
    ctx->probes = probes;
    ctx->B = B;
    ctx->max_len = max_len;
    ctx->max_chunk = max_chunk;
    ctx->window = c->sliding_window;
    /* Static layers gather at most max_len keys, variant layers at most
     * W (+ W never-written slots under KV_FAULT_UNWRITTEN_SLOT). */
    ctx->max_keys = max_len + c->sliding_window + 1;
    ctx->n_probes = kv_probe_count(c);
    ctx->hidden = c->hidden_size;
    ctx->hd = c->head_dim;
    ctx->n_heads = c->num_heads;
    ctx->n_kv_heads = c->num_kv_heads;
    ctx->q_dim = c->num_heads * c->head_dim;
    ctx->kv_dim = c->num_kv_heads * c->head_dim;
    ctx->inter = c->intermediate_size;
    ctx->vocab = c->vocab_size;
    ctx->n_layers = c->num_layers;
    ctx->gemma = c->family == KV_FAMILY_GEMMA2;
    ctx->eps = (float)c->rms_norm_eps;
    ctx->scale = kv_config_attn_scale(c);
    ctx->attn_cap = (float)c->attn_logit_softcapping;
    ctx->final_cap = (float)c->final_logit_softcapping;
    /* gemma2: sqrt(hidden) rounded to F32, as op_embed. */
    ctx->embed_scale = ctx->gemma ? (float)sqrt((double)c->hidden_size) : 1.0f;

    st = kv_cuda_query(&info, &qerr);
    if (st != KV_OK) {
        /* KV_SKIP: no GPU here (kv_cuda_query decides); anything else is a
         * GPU this build cannot use, an error. */
        st = kv_error_set(err, st == KV_SKIP ? KV_SKIP : KV_ERR_INTERNAL, "CUDA backend %s: %s",
                          st == KV_SKIP ? "unavailable" : "failed", qerr.msg);
        goto cleanup;
    }
    st = cuda_ctx_setup(ctx, err);
    if (st != KV_OK) {
        /* A device was found, so this is a broken setup (no memory for the
         * workspace, cuBLAS unable to start), never a skip: a gate that
         * reported it as skipped would pass with no GPU evidence. */
        char prefix[200];
        snprintf(prefix, sizeof prefix, "CUDA setup failed on %.160s", info.name);
        kv_error_prefix(err, prefix);
        st = KV_ERR_INTERNAL;
        goto cleanup;
    }
    if (cublasGetVersion(ctx->blas, &blas_version) != CUBLAS_STATUS_SUCCESS) blas_version = 0;
    if (device != NULL) {
        snprintf(device, device_len,
                 "%.160s (sm_%d%d, %d SMs), driver %d.%d, runtime %d.%d, cuBLAS %d", info.name,
                 info.cc_major, info.cc_minor, info.sm_count, info.driver_version / 1000,
                 (info.driver_version % 1000) / 10, info.runtime_version / 1000,
                 (info.runtime_version % 1000) / 10, blas_version);
    }
    KV_TRY(cuda_ctx_upload(ctx, err));
    KV_TRY(cuda_ctx_alloc_state(ctx, err));
    /* The uploads and zero-fills above ran on the legacy default stream
     * (cudaMemcpy from pageable memory and cudaMemset may return before
     * the device is done), which a non-blocking stream does not wait for. */
    KV_CUDA_CHECK(cudaDeviceSynchronize());
    KV_TRY(cuda_ctx_reset_state(ctx, err));
cleanup:
    if (st != KV_OK) cuda_ctx_destroy(ctx);
    return st;
}

/* ---- the forward pass ---- */

/* One layer for n new tokens per row, in reference/forward.c launch_layer's
 * op order (probes included). */
static KvStatus cuda_launch_layer(KvCudaCtx *ctx, int64_t l, int64_t n, KvError *err) {
    KvStatus st = KV_OK;
    const KvCudaLayer *w = &ctx->layers[l];
    KvCudaCache *cache = &ctx->caches[l];
    const int64_t rows = ctx->B * n;
    const int64_t hidden = ctx->hidden, q_dim = ctx->q_dim, kv_dim = ctx->kv_dim;
    const int64_t inter = ctx->inter;
    const int64_t fbytes = (int64_t)sizeof(float);
    const bool variant_layer = ctx->variant != KV_CUDA_REFERENCE && cache->window > 0;
    /* n == 1 fast path: update, then attend over the view alone; dynamic and
     * every n > 1 attend over the view plus the new keys first (cache.h). */
    const bool after = variant_layer && n == 1 && ctx->variant != KV_CUDA_DYNAMIC;
    /* Host values baked into a captured step (the capture key covers them). */
    const int64_t host_total = ctx->len;
    const int64_t slots_before = kv_cuda_cache_n_slots(ctx, l, n, false);
    const int64_t slots_after = kv_cuda_cache_n_slots(ctx, l, n, true);

    KV_TRY(kv_cuda_rmsnorm(ctx, ctx->x, hidden, w->input_norm, ctx->xn, hidden, rows, err));
    KV_TRY(kv_cuda_gemm(ctx, ctx->xn, w->wq, ctx->q, rows, hidden, q_dim, err));
    KV_TRY(kv_cuda_gemm(ctx, ctx->xn, w->wk, ctx->kn, rows, hidden, kv_dim, err));
    KV_TRY(kv_cuda_gemm(ctx, ctx->xn, w->wv, ctx->vn, rows, hidden, kv_dim, err));
    KV_TRY(kv_cuda_rope(ctx, n, err));
    KV_TRY(kv_cuda_probe(ctx, 1 + 7 * l + 0, ctx->q, n * q_dim * fbytes, err));
    KV_TRY(kv_cuda_probe(ctx, 1 + 7 * l + 1, ctx->kn, n * kv_dim * fbytes, err));
    KV_TRY(kv_cuda_probe(ctx, 1 + 7 * l + 2, ctx->vn, n * kv_dim * fbytes, err));

    if (variant_layer) {
        if (after) KV_TRY(kv_cuda_cache_update(ctx, l, n, host_total, err));
        KV_TRY(kv_cuda_gather_variant(ctx, l, n, after ? slots_after : slots_before, !after, err));
        KV_TRY(kv_cuda_attend(ctx, l, n, cache->cur.k, cache->cur.v, cache->slots, err));
        if (!after) KV_TRY(kv_cuda_cache_update(ctx, l, n, host_total, err));
    } else {
        KV_TRY(kv_cuda_store_static(ctx, l, n, err));
        KV_TRY(kv_cuda_gather_static(ctx, l, n, err));
        KV_TRY(kv_cuda_attend(ctx, l, n, ctx->kc[l], ctx->vc[l], ctx->max_len, err));
    }
    KV_TRY(kv_cuda_probe_cache(ctx, l, n, slots_after, err));
    KV_TRY(kv_cuda_probe(ctx, 1 + 7 * l + 4, ctx->att, n * q_dim * fbytes, err));

    KV_TRY(kv_cuda_gemm(ctx, ctx->att, w->wo, ctx->tmp, rows, q_dim, hidden, err));
    if (ctx->gemma) {
        /* h = x + post_attention_layernorm(attn(...)) */
        KV_TRY(kv_cuda_rmsnorm(ctx, ctx->tmp, hidden, w->post_attn_norm, ctx->tmp, hidden, rows,
                               err));
        KV_TRY(kv_cuda_add(ctx, ctx->x, ctx->tmp, rows * hidden, err));
        KV_TRY(kv_cuda_rmsnorm(ctx, ctx->x, hidden, w->pre_ffw_norm, ctx->xn, hidden, rows, err));
    } else {
        KV_TRY(kv_cuda_add(ctx, ctx->x, ctx->tmp, rows * hidden, err));
        KV_TRY(kv_cuda_rmsnorm(ctx, ctx->x, hidden, w->post_attn_norm, ctx->xn, hidden, rows, err));
    }
    KV_TRY(kv_cuda_gemm(ctx, ctx->xn, w->w_gate, ctx->gate, rows, hidden, inter, err));
    KV_TRY(kv_cuda_gemm(ctx, ctx->xn, w->w_up, ctx->up, rows, hidden, inter, err));
    KV_TRY(kv_cuda_glu(ctx, rows * inter, err));
    KV_TRY(kv_cuda_gemm(ctx, ctx->gate, w->w_down, ctx->tmp, rows, inter, hidden, err));
    if (ctx->gemma) {
        KV_TRY(kv_cuda_rmsnorm(ctx, ctx->tmp, hidden, w->post_ffw_norm, ctx->tmp, hidden, rows,
                               err));
    }
    KV_TRY(kv_cuda_probe(ctx, 1 + 7 * l + 5, ctx->tmp, n * hidden * fbytes, err));
    KV_TRY(kv_cuda_add(ctx, ctx->x, ctx->tmp, rows * hidden, err));
    KV_TRY(kv_cuda_probe(ctx, 1 + 7 * l + 6, ctx->x, n * hidden * fbytes, err));
cleanup:
    return st;
}

/* One forward of the n tokens already in tok_in/real_in (B, n): positions,
 * embedding, layers, final norm of each row's last token, lm_head, final
 * softcap, probes, argmax into tok_in (B, 1) and *total += n. Launches only:
 * the same code runs eagerly and under stream capture. */
static KvStatus cuda_launch_forward(KvCudaCtx *ctx, int64_t n, KvError *err) {
    KvStatus st = KV_OK;
    const int64_t hidden = ctx->hidden;
    const int64_t fbytes = (int64_t)sizeof(float);
    KV_TRY(kv_cuda_positions(ctx, n, err));
    KV_TRY(kv_cuda_embed(ctx, n, err));
    KV_TRY(kv_cuda_probe(ctx, 0, ctx->x, n * hidden * fbytes, err));
    for (int64_t l = 0; l < ctx->n_layers; l++) KV_TRY(cuda_launch_layer(ctx, l, n, err));
    KV_TRY(kv_cuda_rmsnorm(ctx, ctx->x + (n - 1) * hidden, n * hidden, ctx->w_final_norm,
                           ctx->last, hidden, ctx->B, err));
    KV_TRY(kv_cuda_gemm(ctx, ctx->last, ctx->w_lm_head, ctx->logits, ctx->B, hidden, ctx->vocab,
                        err));
    if (ctx->final_cap > 0.0f) {
        KV_TRY(kv_cuda_softcap(ctx, ctx->logits, ctx->B * ctx->vocab, ctx->final_cap, err));
    }
    KV_TRY(kv_cuda_probe(ctx, ctx->n_probes - 2, ctx->last, hidden * fbytes, err));
    KV_TRY(kv_cuda_probe(ctx, ctx->n_probes - 1, ctx->logits, ctx->vocab * fbytes, err));
    KV_TRY(kv_cuda_argmax_advance(ctx, n, err));
cleanup:
    return st;
}

/* ---- graph mode ---- */

typedef struct {
    cudaGraph_t graph;     /* the last captured step */
    cudaGraphExec_t exec;  /* its executable */
    int64_t *key;          /* (1 + 2 * n_layers) key of the next step */
    int64_t *cur_key;      /* (1 + 2 * n_layers) key of the captured graph */
    int64_t key_len;
    int64_t captures, instantiations, exec_updates, launches;
} CudaGraphRunner;

static KvStatus cuda_runner_init(CudaGraphRunner *r, const KvCudaCtx *ctx, KvError *err) {
    memset(r, 0, sizeof *r);
    r->key_len = 1 + 2 * ctx->n_layers;
    r->key = (int64_t *)calloc((size_t)r->key_len, sizeof *r->key);
    r->cur_key = (int64_t *)calloc((size_t)r->key_len, sizeof *r->cur_key);
    if (r->key == NULL || r->cur_key == NULL) {
        return kv_error_set(err, KV_ERR_INTERNAL, "cuda graph runner: out of host memory");
    }
    return KV_OK;
}

static void cuda_runner_free(CudaGraphRunner *r) {
    if (r->exec != NULL) (void)cudaGraphExecDestroy(r->exec);
    if (r->graph != NULL) (void)cudaGraphDestroy(r->graph);
    free(r->key);
    free(r->cur_key);
    memset(r, 0, sizeof *r);
}

/* Captures the forward of n into a new graph and makes it the executable:
 * cudaGraphExecUpdate when an executable exists and accepts it (same
 * topology: e.g. dynamic's next attended length), else a new instantiation. */
static KvStatus cuda_runner_capture(CudaGraphRunner *r, KvCudaCtx *ctx, int64_t n, KvError *err) {
    KvStatus st = KV_OK;
    cudaGraph_t g = NULL;
    bool capturing = false;
    cudaGraphExecUpdateResultInfo info;
    cudaError_t e = cudaSuccess;

    /* Thread-local: an unsafe CUDA call from this thread while capturing is
     * an error instead of silently breaking the capture. */
    KV_CUDA_CHECK(cudaStreamBeginCapture(ctx->stream, cudaStreamCaptureModeThreadLocal));
    capturing = true;
    KV_TRY(cuda_launch_forward(ctx, n, err));
    capturing = false;
    KV_CUDA_CHECK(cudaStreamEndCapture(ctx->stream, &g));

    if (r->exec != NULL) {
        memset(&info, 0, sizeof info);
        e = cudaGraphExecUpdate(r->exec, g, &info);
        if (e == cudaSuccess) {
            r->exec_updates++;
        } else if (e == cudaErrorGraphExecUpdateFailure) {
            /* Not updatable (the topology changed, e.g. a regime flip):
             * clear the non-sticky error and instantiate anew. */
            (void)cudaGetLastError();
            (void)cudaGraphExecDestroy(r->exec);
            r->exec = NULL;
        } else {
            /* Any other error is real: report it here, under its own call
             * (the executable stays owned by r and is freed with it). */
            st = kv_cuda_fail_rt(err, KV_ERR_INTERNAL, e, "cudaGraphExecUpdate(r->exec, g, &info)",
                                 __FILE__, __LINE__);
            goto cleanup;
        }
    }
    if (r->exec == NULL) {
        KV_CUDA_CHECK(cudaGraphInstantiate(&r->exec, g, 0));
        r->instantiations++;
    }
    if (r->graph != NULL) (void)cudaGraphDestroy(r->graph);
    r->graph = g;
    g = NULL;
    r->captures++;
cleanup:
    if (capturing) {
        /* A launch failed mid-capture: end it so the stream is usable (and
         * destroyable) again; the partial graph is discarded. */
        cudaGraph_t partial = NULL;
        (void)cudaStreamEndCapture(ctx->stream, &partial);
        if (partial != NULL) (void)cudaGraphDestroy(partial);
        (void)cudaGetLastError();
    }
    if (g != NULL) (void)cudaGraphDestroy(g);
    return st;
}

/* One forward of n tokens through the graph, re-capturing when the key
 * changed: kv_graph_runner_step's rule. */
static KvStatus cuda_runner_step(CudaGraphRunner *r, KvCudaCtx *ctx, int64_t n, KvError *err) {
    KvStatus st = KV_OK;
    /* KV_FAULT_NO_RECAPTURE: the regime is left out of the key, so a
     * host-branch variant replays the graph of the regime it was captured in. */
    const bool keep = (ctx->faults & KV_FAULT_NO_RECAPTURE) != 0;
    const size_t bytes = (size_t)r->key_len * sizeof *r->key;
    r->key[0] = n;
    for (int64_t l = 0; l < ctx->n_layers; l++) {
        const bool sliding = ctx->variant != KV_CUDA_REFERENCE && ctx->caches[l].window > 0;
        r->key[1 + 2 * l] = sliding && !keep ? kv_cuda_cache_regime(ctx, l, ctx->len) : 0;
        r->key[2 + 2 * l] = sliding ? kv_cuda_cache_n_slots(ctx, l, n, false) : 0;
    }
    if (r->captures == 0 || memcmp(r->key, r->cur_key, bytes) != 0) {
        KV_TRY(cuda_runner_capture(r, ctx, n, err));
        memcpy(r->cur_key, r->key, bytes);
    }
    KV_CUDA_CHECK(cudaGraphLaunch(r->exec, ctx->stream));
    r->launches++;
cleanup:
    return st;
}

/* ---- replay-check snapshots ---- */

static KvStatus cuda_snapshot(KvCudaCtx *ctx, bool save, KvError *err) {
    KvStatus st = KV_OK;
    const int64_t B = ctx->B, D = ctx->kv_dim;
    const int64_t rows = B * ctx->max_chunk;
    const size_t static_bytes = (size_t)(B * ctx->max_len * D) * sizeof(float);
#define KV_SNAP(live, copy, bytes)                                                                 \
    do {                                                                                           \
        if (save) {                                                                                \
            KV_COPY(ctx, (copy), (live), (bytes));                                                 \
        } else {                                                                                   \
            KV_COPY(ctx, (live), (copy), (bytes));                                                 \
        }                                                                                          \
    } while (0)
    for (int64_t l = 0; l < ctx->n_layers; l++) {
        KvCudaCache *c = &ctx->caches[l];
        if (ctx->kc[l] != NULL) {
            KV_SNAP(ctx->kc[l], ctx->snap_kc[l], static_bytes);
            KV_SNAP(ctx->vc[l], ctx->snap_vc[l], static_bytes);
            continue;
        }
        const size_t fbytes = (size_t)(B * c->slots * D) * sizeof(float);
        KV_SNAP(c->cur.k, c->snap.k, fbytes);
        KV_SNAP(c->cur.v, c->snap.v, fbytes);
        KV_SNAP(c->cur.real, c->snap.real, (size_t)(B * c->slots));
        KV_SNAP(c->cur.pos, c->snap.pos, (size_t)c->slots * sizeof(int64_t));
        if (save) {
            c->snap_filled = c->filled;
        } else {
            c->filled = c->snap_filled;
        }
    }
    KV_SNAP(ctx->real, ctx->snap_real, (size_t)(B * ctx->max_len));
    KV_SNAP(ctx->n_real, ctx->snap_n_real, (size_t)B * sizeof(int64_t));
    KV_SNAP(ctx->total, ctx->snap_total, sizeof(int64_t));
    KV_SNAP(ctx->tok_in, ctx->snap_tok_in, (size_t)rows * sizeof(int32_t));
    KV_SNAP(ctx->real_in, ctx->snap_real_in, (size_t)rows);
#undef KV_SNAP
    if (save) {
        ctx->snap_len = ctx->len;
    } else {
        ctx->len = ctx->snap_len;
    }
cleanup:
    return st;
}

/* ---- decoding ---- */

/* decode.c's checks plus the token and padding checks kv_ref_check_input
 * makes, all before any CUDA call; *variant receives the implementation. */
static KvStatus cuda_check_spec(const KvModel *m, const KvDecodeSpec *sp, KvCudaVariant *variant,
                                KvError *err) {
    const int64_t V = m->config.vocab_size;
    *variant = KV_CUDA_REFERENCE;
    if (sp->batch < 1 || sp->prompt_len < 1 || sp->new_tokens < 1 || sp->prefill_chunk < 0 ||
        sp->prompt == NULL || sp->prompt_real == NULL) {
        return kv_error_set(err, KV_ERR_INPUT,
                            "cuda decode: expected batch >= 1, prompt length >= 1, new tokens >= 1, "
                            "prefill chunk >= 0 and a prompt; found %lld, %lld, %lld, %lld, %s",
                            (long long)sp->batch, (long long)sp->prompt_len,
                            (long long)sp->new_tokens, (long long)sp->prefill_chunk,
                            sp->prompt == NULL || sp->prompt_real == NULL ? "none" : "given");
    }
    if (sp->variant != NULL) {
        int found = -1;
        for (int i = 1; i < (int)(sizeof k_variant_names / sizeof k_variant_names[0]); i++) {
            if (sp->variant->name != NULL && strcmp(sp->variant->name, k_variant_names[i]) == 0) {
                found = i;
            }
        }
        if (found < 0) {
            return kv_error_set(err, KV_ERR_INPUT,
                                "cuda decode: variant '%s' has no GPU implementation (expected "
                                "index_copy, cat_shift, roll, always_roll, ring or dynamic)",
                                sp->variant->name != NULL ? sp->variant->name : "(null)");
        }
        *variant = (KvCudaVariant)found;
    }
    for (int64_t b = 0; b < sp->batch; b++) {
        bool seen_real = false;
        if (!sp->prompt_real[b * sp->prompt_len + sp->prompt_len - 1]) {
            return kv_error_set(err, KV_ERR_INPUT,
                                "cuda decode: prompt row %lld: expected a real token in the last "
                                "column (left padding), found a pad",
                                (long long)b);
        }
        for (int64_t t = 0; t < sp->prompt_len; t++) {
            const int32_t tok = sp->prompt[b * sp->prompt_len + t];
            if (tok < 0 || tok >= V) {
                return kv_error_set(err, KV_ERR_INPUT,
                                    "tokens: row %lld position %lld: expected a token id in "
                                    "[0, %lld), found %d",
                                    (long long)b, (long long)t, (long long)V, tok);
            }
            if (sp->prompt_real[b * sp->prompt_len + t]) {
                seen_real = true;
            } else if (seen_real) {
                return kv_error_set(err, KV_ERR_INPUT,
                                    "tokens: row %lld position %lld: a pad after a real token "
                                    "(batches must be left-padded)",
                                    (long long)b, (long long)t);
            }
        }
    }
    return KV_OK;
}

/* Copies the prompt into tok_in/real_in chunk by chunk and runs each chunk
 * eagerly. chunk_tok, chunk_real: (B, chunk) host scratch. */
static KvStatus cuda_prefill(KvCudaCtx *ctx, const KvDecodeSpec *sp, int64_t chunk,
                             int32_t *chunk_tok, uint8_t *chunk_real, int64_t *eager_forwards,
                             KvError *err) {
    KvStatus st = KV_OK;
    const int64_t B = sp->batch, P = sp->prompt_len;
    for (int64_t off = 0; off < P; off += chunk) {
        const int64_t n = P - off < chunk ? P - off : chunk;
        for (int64_t b = 0; b < B; b++) {
            memcpy(chunk_tok + b * n, sp->prompt + b * P + off, (size_t)n * sizeof *chunk_tok);
            memcpy(chunk_real + b * n, sp->prompt_real + b * P + off, (size_t)n);
        }
        /* Synchronous copies from pageable memory: the host buffers are
         * reused by the next chunk. */
        KV_CUDA_CHECK(cudaMemcpyAsync(ctx->tok_in, chunk_tok, (size_t)(B * n) * sizeof(int32_t),
                                      cudaMemcpyHostToDevice, ctx->stream));
        KV_CUDA_CHECK(cudaMemcpyAsync(ctx->real_in, chunk_real, (size_t)(B * n),
                                      cudaMemcpyHostToDevice, ctx->stream));
        KV_CUDA_CHECK(cudaStreamSynchronize(ctx->stream));
        KV_TRY(cuda_launch_forward(ctx, n, err));
        kv_cuda_cache_advance(ctx, n);
        ctx->len += n;
        if (eager_forwards != NULL) (*eager_forwards)++;
    }
cleanup:
    return st;
}

/* The error for device error flags raised by `when` (e.g. "step" 12). */
static KvStatus cuda_dev_err_status(const KvCudaCtx *ctx, int32_t flags, const char *when,
                                    int64_t at, KvError *err) {
    return kv_error_set(err, KV_ERR_INTERNAL,
                        "cuda %s: a device invariant broke by %s %lld (flags 0x%x:%s%s%s)",
                        ctx->variant_name, when, (long long)at, (unsigned)flags,
                        (flags & KV_CUDA_DERR_TOKEN) ? " token id outside the vocabulary" : "",
                        (flags & KV_CUDA_DERR_SLOT) ? " position outside the state" : "",
                        (flags & KV_CUDA_DERR_KEYS) ? " more visible keys than gathered" : "");
}

/* Synchronises and checks the device error flags: the benchmark's phases
 * must not time a run that broke a device invariant. */
static KvStatus cuda_check_dev_err(KvCudaCtx *ctx, const char *phase, int64_t steps,
                                   KvError *err) {
    KvStatus st = KV_OK;
    int32_t flags = 0;
    KV_CUDA_CHECK(cudaMemcpyAsync(&flags, ctx->dev_err, sizeof flags, cudaMemcpyDeviceToHost,
                                  ctx->stream));
    KV_CUDA_CHECK(cudaStreamSynchronize(ctx->stream));
    if (flags != 0) {
        st = cuda_dev_err_status(ctx, flags, phase, steps, err);
    }
cleanup:
    return st;
}

/* Reads the last forward's outputs for `step` into out and checks the device
 * error flags. */
static KvStatus cuda_read_step(KvCudaCtx *ctx, KvDecodeResult *out, int64_t step, KvError *err) {
    KvStatus st = KV_OK;
    const int64_t B = ctx->B, V = ctx->vocab;
    int32_t flags = 0;
    KV_CUDA_CHECK(cudaMemcpyAsync(out->logits + step * B * V, ctx->logits,
                                  (size_t)(B * V) * sizeof(float), cudaMemcpyDeviceToHost,
                                  ctx->stream));
    KV_CUDA_CHECK(cudaMemcpyAsync(out->tokens + step * B, ctx->next_tok,
                                  (size_t)B * sizeof(int32_t), cudaMemcpyDeviceToHost, ctx->stream));
    KV_CUDA_CHECK(cudaMemcpyAsync(out->margins + step * B, ctx->margin, (size_t)B * sizeof(float),
                                  cudaMemcpyDeviceToHost, ctx->stream));
    if (out->probe_hash != NULL) {
        KV_CUDA_CHECK(cudaMemcpyAsync(out->probe_hash + step * ctx->n_probes * B, ctx->probe_hash,
                                      (size_t)(ctx->n_probes * B) * sizeof(uint64_t),
                                      cudaMemcpyDeviceToHost, ctx->stream));
    }
    KV_CUDA_CHECK(cudaMemcpyAsync(&flags, ctx->dev_err, sizeof flags, cudaMemcpyDeviceToHost,
                                  ctx->stream));
    KV_CUDA_CHECK(cudaStreamSynchronize(ctx->stream));
    if (flags != 0) st = cuda_dev_err_status(ctx, flags, "step", step, err);
cleanup:
    return st;
}

extern "C" KvStatus kv_cuda_decode_greedy(const KvModel *m, const KvDecodeSpec *sp,
                                          KvDecodeResult *out, KvCudaRunStats *stats,
                                          KvError *err) {
    KvStatus st = KV_OK;
    KvCudaCtx ctx;
    CudaGraphRunner runner;
    KvCudaVariant variant = KV_CUDA_REFERENCE;
    KvCudaRunStats local_stats;
    KvCudaRunStats *rs = stats != NULL ? stats : &local_stats;
    int32_t *chunk_tok = NULL;   /* (B, chunk) */
    uint8_t *chunk_real = NULL;  /* (B, chunk) */
    float *first_logits = NULL;  /* (B, V) first run of a replay-checked step */
    float *run_logits = NULL;    /* (B, V) a later run */
    int64_t B = 0, P = 0, V = 0, chunk = 0;

    memset(&ctx, 0, sizeof ctx);
    memset(&runner, 0, sizeof runner);
    memset(out, 0, sizeof *out);
    memset(rs, 0, sizeof *rs);

    KV_TRY(cuda_check_spec(m, sp, &variant, err));
    B = sp->batch;
    P = sp->prompt_len;
    V = m->config.vocab_size;
    chunk = sp->prefill_chunk > 0 && sp->prefill_chunk < P ? sp->prefill_chunk : P;

    /* The last generated token is never fed back: P + new_tokens - 1 slots. */
    KV_TRY(cuda_ctx_create(&ctx, m, B, P + sp->new_tokens - 1, chunk, variant, sp->faults,
                           sp->record_probes, rs->device, sizeof rs->device, err));
    snprintf(rs->math_mode, sizeof rs->math_mode, "%s",
             (sp->faults & KV_FAULT_TF32) ? "TF32 tensor ops (planted fault tf32)"
                                          : "pedantic fp32 (no TF32)");

    out->steps = sp->new_tokens;
    out->batch = B;
    out->vocab = V;
    out->replay_mismatch_step = -1;
    out->tokens = (int32_t *)calloc((size_t)(sp->new_tokens * B), sizeof *out->tokens);
    out->logits = (float *)calloc((size_t)(sp->new_tokens * B * V), sizeof *out->logits);
    out->margins = (float *)calloc((size_t)(sp->new_tokens * B), sizeof *out->margins);
    if (sp->record_probes) {
        out->n_probes = ctx.n_probes;
        out->probe_hash =
            (uint64_t *)calloc((size_t)(sp->new_tokens * ctx.n_probes * B), sizeof *out->probe_hash);
    }
    chunk_tok = (int32_t *)malloc((size_t)(B * chunk) * sizeof *chunk_tok);
    chunk_real = (uint8_t *)malloc((size_t)(B * chunk));
    first_logits = (float *)malloc((size_t)(B * V) * sizeof *first_logits);
    run_logits = (float *)malloc((size_t)(B * V) * sizeof *run_logits);
    if (!out->tokens || !out->logits || !out->margins || (sp->record_probes && !out->probe_hash) ||
        !chunk_tok || !chunk_real || !first_logits || !run_logits) {
        st = kv_error_set(err, KV_ERR_INTERNAL,
                          "cuda decode: out of memory (%lld steps x %lld rows x %lld vocab)",
                          (long long)sp->new_tokens, (long long)B, (long long)V);
        goto cleanup;
    }
    KV_TRY(cuda_runner_init(&runner, &ctx, err));

    KV_TRY(cuda_prefill(&ctx, sp, chunk, chunk_tok, chunk_real, &rs->eager_forwards, err));
    KV_TRY(cuda_read_step(&ctx, out, 0, err));

    /* Step 0 came from the prefill; each later step feeds one token per row:
     * the greedy token the argmax kernel wrote into tok_in, or the forced one
     * copied over it before the step (as before a graph replay). */
    for (int64_t step = 1; step < sp->new_tokens; step++) {
        const bool check = sp->replay_every > 0 && step % sp->replay_every == 0;
        const int64_t runs = check ? (sp->replay_k > 0 ? sp->replay_k : KV_CUDA_REPLAY_K) : 1;
        if (sp->forced != NULL) {
            for (int64_t b = 0; b < B; b++) {
                const int32_t tok = sp->forced[(step - 1) * B + b];
                if (tok < 0 || tok >= V) {
                    st = kv_error_set(err, KV_ERR_INPUT,
                                      "forced tokens: step %lld row %lld: expected a token id in "
                                      "[0, %lld), found %d",
                                      (long long)step, (long long)b, (long long)V, tok);
                    goto cleanup;
                }
                chunk_tok[b] = tok;
                chunk_real[b] = 1;
            }
            KV_CUDA_CHECK(cudaMemcpyAsync(ctx.tok_in, chunk_tok, (size_t)B * sizeof(int32_t),
                                          cudaMemcpyHostToDevice, ctx.stream));
            KV_CUDA_CHECK(cudaMemcpyAsync(ctx.real_in, chunk_real, (size_t)B,
                                          cudaMemcpyHostToDevice, ctx.stream));
            KV_CUDA_CHECK(cudaStreamSynchronize(ctx.stream));
        }
        if (ctx.len + 1 > ctx.max_len) {
            st = kv_error_set(err, KV_ERR_INTERNAL, "cuda decode: state full at step %lld",
                              (long long)step);
            goto cleanup;
        }
        if (check) {
            KV_TRY(cuda_snapshot(&ctx, true, err));
            out->replays_checked++;
        }
        for (int64_t run = 0; run < runs; run++) {
            if (run > 0) KV_TRY(cuda_snapshot(&ctx, false, err));
            if (sp->mode == KV_MODE_GRAPH) {
                KV_TRY(cuda_runner_step(&runner, &ctx, 1, err));
            } else {
                KV_TRY(cuda_launch_forward(&ctx, 1, err));
                rs->eager_forwards++;
            }
            kv_cuda_cache_advance(&ctx, 1);
            if (!check) continue;
            KV_CUDA_CHECK(cudaMemcpyAsync(run == 0 ? first_logits : run_logits, ctx.logits,
                                          (size_t)(B * V) * sizeof(float), cudaMemcpyDeviceToHost,
                                          ctx.stream));
            KV_CUDA_CHECK(cudaStreamSynchronize(ctx.stream));
            if (run > 0 && out->replay_mismatch_step < 0 &&
                memcmp(first_logits, run_logits, (size_t)(B * V) * sizeof(float)) != 0) {
                out->replay_mismatch_step = step;
            }
        }
        ctx.len += 1;
        KV_TRY(cuda_read_step(&ctx, out, step, err));
    }

cleanup:
    out->graphs_captured = runner.captures;
    rs->graphs_captured = runner.captures;
    rs->graph_instantiations = runner.instantiations;
    rs->exec_updates = runner.exec_updates;
    rs->exec_update_used = runner.exec_updates > 0;
    rs->graph_launches = runner.launches;
    cuda_runner_free(&runner);
    if (ctx.stream != NULL) cuda_ctx_destroy(&ctx);
    free(chunk_tok);
    free(chunk_real);
    free(first_logits);
    free(run_logits);
    if (st != KV_OK) kv_decode_result_free(out);
    return st;
}

/* ---- benchmarks ---- */

extern "C" KvStatus kv_cuda_bench_decode(const KvModel *m, const KvDecodeSpec *sp,
                                         KvCudaBenchResult *out, KvError *err) {
    KvStatus st = KV_OK;
    KvCudaCtx ctx;
    CudaGraphRunner runner;
    KvCudaVariant variant = KV_CUDA_REFERENCE;
    int32_t *chunk_tok = NULL;  /* (B, chunk) */
    uint8_t *chunk_real = NULL; /* (B, chunk) */
    int64_t B = 0, P = 0, chunk = 0, steps = 0;
    double eager_sum = 0.0, graph_sum = 0.0;
    int64_t graph_steps = 0;
    float ms = 0.0f;

    memset(&ctx, 0, sizeof ctx);
    memset(&runner, 0, sizeof runner);
    memset(out, 0, sizeof *out);
    KV_TRY(cuda_check_spec(m, sp, &variant, err));
    if (sp->new_tokens < 2) {
        st = kv_error_set(err, KV_ERR_INPUT, "cuda bench: expected new_tokens >= 2 (a decode step "
                                             "to time), found %lld",
                          (long long)sp->new_tokens);
        goto cleanup;
    }
    B = sp->batch;
    P = sp->prompt_len;
    chunk = sp->prefill_chunk > 0 && sp->prefill_chunk < P ? sp->prefill_chunk : P;
    steps = sp->new_tokens - 1;
    KV_TRY(cuda_ctx_create(&ctx, m, B, P + sp->new_tokens - 1, chunk, variant, sp->faults, false,
                           out->device, sizeof out->device, err));
    chunk_tok = (int32_t *)malloc((size_t)(B * chunk) * sizeof *chunk_tok);
    chunk_real = (uint8_t *)malloc((size_t)(B * chunk));
    if (chunk_tok == NULL || chunk_real == NULL) {
        st = kv_error_set(err, KV_ERR_INTERNAL, "cuda bench: out of host memory");
        goto cleanup;
    }
    out->steps = steps;
    out->eager_ms_best = 1e30;
    out->graph_ms_best = 1e30;

    /* Eager: each step launched op by op, synchronised (a decode hands its
     * token to the host every step). */
    KV_TRY(cuda_prefill(&ctx, sp, chunk, chunk_tok, chunk_real, NULL, err));
    KV_CUDA_CHECK(cudaStreamSynchronize(ctx.stream));
    for (int64_t s = 0; s < steps; s++) {
        const double t0 = cuda_now();
        KV_TRY(cuda_launch_forward(&ctx, 1, err));
        kv_cuda_cache_advance(&ctx, 1);
        ctx.len += 1;
        KV_CUDA_CHECK(cudaStreamSynchronize(ctx.stream));
        const double dt = (cuda_now() - t0) * 1e3;
        eager_sum += dt;
        if (dt < out->eager_ms_best) out->eager_ms_best = dt;
    }
    out->eager_ms_per_step = eager_sum / (double)steps;
    KV_TRY(cuda_check_dev_err(&ctx, "eager bench step", steps, err));

    /* Graph: the same decode from a fresh state; capture steps are timed
     * apart from replays. */
    KV_TRY(cuda_ctx_reset_state(&ctx, err));
    KV_TRY(cuda_runner_init(&runner, &ctx, err));
    KV_TRY(cuda_prefill(&ctx, sp, chunk, chunk_tok, chunk_real, NULL, err));
    KV_CUDA_CHECK(cudaStreamSynchronize(ctx.stream));
    for (int64_t s = 0; s < steps; s++) {
        const int64_t before = runner.captures;
        const double t0 = cuda_now();
        KV_TRY(cuda_runner_step(&runner, &ctx, 1, err));
        kv_cuda_cache_advance(&ctx, 1);
        ctx.len += 1;
        KV_CUDA_CHECK(cudaStreamSynchronize(ctx.stream));
        const double dt = (cuda_now() - t0) * 1e3;
        if (runner.captures != before) {
            out->capture_ms += dt;
            continue;
        }
        graph_sum += dt;
        graph_steps++;
        if (dt < out->graph_ms_best) out->graph_ms_best = dt;
    }
    out->graph_ms_per_step = graph_steps > 0 ? graph_sum / (double)graph_steps : 0.0;
    KV_TRY(cuda_check_dev_err(&ctx, "graph bench step", steps, err));
    if (graph_steps == 0) out->graph_ms_best = 0.0;
    out->graphs_captured = runner.captures;
    out->graph_instantiations = runner.instantiations;
    out->exec_updates = runner.exec_updates;

    /* The floor: one eager step with CUDA events around every op. */
    KV_TRY(cuda_ctx_reset_state(&ctx, err));
    KV_TRY(cuda_prefill(&ctx, sp, chunk, chunk_tok, chunk_real, NULL, err));
    ctx.max_timed = 64 + 64 * ctx.n_layers;
    ctx.events = (cudaEvent_t *)calloc((size_t)(2 * ctx.max_timed), sizeof *ctx.events);
    if (ctx.events == NULL) {
        st = kv_error_set(err, KV_ERR_INTERNAL, "cuda bench: out of host memory");
        goto cleanup;
    }
    for (int64_t i = 0; i < 2 * ctx.max_timed; i++) KV_CUDA_CHECK(cudaEventCreate(&ctx.events[i]));
    KV_CUDA_CHECK(cudaStreamSynchronize(ctx.stream));
    ctx.n_timed = 0;
    ctx.timing = true;
    st = cuda_launch_forward(&ctx, 1, err);
    ctx.timing = false;
    if (st != KV_OK) goto cleanup;
    KV_CUDA_CHECK(cudaStreamSynchronize(ctx.stream));
    for (int64_t i = 0; i < ctx.n_timed; i++) {
        KV_CUDA_CHECK(cudaEventElapsedTime(&ms, ctx.events[2 * i], ctx.events[2 * i + 1]));
        out->kernel_sum_ms += (double)ms;
    }
    out->ops_per_step = ctx.n_timed;
    KV_TRY(cuda_check_dev_err(&ctx, "timed bench step", 1, err));

cleanup:
    cuda_runner_free(&runner);
    if (ctx.stream != NULL) cuda_ctx_destroy(&ctx);
    free(chunk_tok);
    free(chunk_real);
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
