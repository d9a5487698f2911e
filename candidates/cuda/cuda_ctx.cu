/* cuda_ctx.cu: one CUDA run's context (cuda_internal.cuh): device setup,
 * the cuBLAS handle and its settings, the weight arena, the persistent state
 * and scratch (all allocated before the first step, so nothing is allocated
 * while a graph is captured), its reset, the replay check's snapshots and
 * the device error flags.
 *
 *   - One stream and one cuBLAS handle per run. cublasSetStream, then
 *     cublasSetWorkspace with our own 32 MiB buffer (SetStream resets the
 *     workspace; a user workspace is what lets cuBLAS run under stream
 *     capture with the same kernels as eagerly), CUBLAS_PEDANTIC_MATH (fp32,
 *     no TF32; KV_FAULT_TF32 is the only way to get TF32),
 *     CUBLAS_ATOMICS_NOT_ALLOWED, pointer mode device (alpha, beta in device
 *     memory). Matmuls are cublasSgemm on row-major (out, in) weights.
 *   - Positions, tokens and the fault clock live in device memory and are
 *     read by kernels at execution, so a captured step is replayable
 *     (DESIGN §4). The host keeps only what a framework keeps on the host:
 *     its count of filled slots (host-branch regimes) and dynamic's filled
 *     count (a shape).
 *   - The replay check snapshots the persistent device state (D2D copies)
 *     and the host's counts. */
#include "cuda_internal.cuh"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_device.h"

extern "C" {
#include "kvmath.h"
}

/* 32 MiB: NVIDIA's recommended cuBLAS workspace for Hopper (4 MiB suffices
 * before it); fixed, so cuBLAS's algorithm choice cannot depend on what the
 * default pool happens to have. */
#define KV_CUDA_BLAS_WS_BYTES ((size_t)32 << 20)
/* Weight tensors start on 256-byte boundaries in the arena (cuBLAS's
 * preferred alignment). */
#define KV_CUDA_ARENA_ALIGN_FLOATS 64

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

void kv_cuda_ctx_destroy(KvCudaCtx *ctx) {
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
    for (int i = 0; i < KV_CUDA_SNAP_SLOTS; i++) {
        free(ctx->snap_kc[i]);
        free(ctx->snap_vc[i]);
    }
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
/* Elements widened per host-to-device copy of a BF16/F16 weight. */
#define KV_CUDA_UPLOAD_CHUNK ((size_t)1 << 20)

typedef struct {
    KvMat host; /* (n) as stored: widened to F32 on the way up */
    size_t n;
    const float **dst;
} CudaUpload;

/* Appends a tensor to the upload list; a NULL host tensor (absent for the
 * family) is skipped and its device pointer stays NULL. */
static void cuda_upload_add(CudaUpload *up, size_t *n_up, KvMat host, size_t n,
                            const float **dst) {
    if (host.data == NULL) return;
    up[*n_up].host = host;
    up[*n_up].n = n;
    up[*n_up].dst = dst;
    (*n_up)++;
}

/* Borrows owner's device weights (same model): the layer pointers and the
 * arena, which owner frees (it is not in this context's allocations), so
 * owner must outlive ctx. */
static KvStatus cuda_ctx_borrow(KvCudaCtx *ctx, const KvCudaCtx *owner, KvError *err) {
    if (owner->model != ctx->model || owner->layers == NULL) {
        return kv_error_set(err, KV_ERR_INTERNAL, "cuda: shared weights from another model");
    }
    ctx->layers = (KvCudaLayer *)malloc((size_t)ctx->n_layers * sizeof *ctx->layers);
    if (ctx->layers == NULL) return kv_error_set(err, KV_ERR_INTERNAL, "cuda: out of host memory");
    memcpy(ctx->layers, owner->layers, (size_t)ctx->n_layers * sizeof *ctx->layers);
    ctx->w_arena = owner->w_arena;
    ctx->w_arena_floats = owner->w_arena_floats;
    ctx->w_embed = owner->w_embed;
    ctx->w_final_norm = owner->w_final_norm;
    ctx->w_lm_head = owner->w_lm_head;
    return KV_OK;
}

static KvStatus cuda_ctx_upload(KvCudaCtx *ctx, KvError *err) {
    KvStatus st = KV_OK;
    const KvModel *m = ctx->model;
    const size_t hidden = (size_t)ctx->hidden, inter = (size_t)ctx->inter;
    const size_t q_dim = (size_t)ctx->q_dim, kv_dim = (size_t)ctx->kv_dim;
    const size_t vocab = (size_t)ctx->vocab;
    const bool tied = m->lm_head.data == m->embed.data;
    const size_t max_up = 3 + 24 * (size_t)ctx->n_layers; /* KvCudaLayer's 24 arrays */
    CudaUpload *up = (CudaUpload *)calloc(max_up, sizeof *up);
    size_t n_up = 0, total = 0, off = 0;
    float *chunk = NULL; /* (KV_CUDA_UPLOAD_CHUNK) widened weights on their way up */
    if (up == NULL) return kv_error_set(err, KV_ERR_INTERNAL, "cuda: out of host memory");
    ctx->layers = (KvCudaLayer *)calloc((size_t)ctx->n_layers, sizeof *ctx->layers);
    if (ctx->layers == NULL) {
        st = kv_error_set(err, KV_ERR_INTERNAL, "cuda: out of host memory");
        goto cleanup;
    }
    cuda_upload_add(up, &n_up, m->embed, vocab * hidden, &ctx->w_embed);
    cuda_upload_add(up, &n_up, kv_mat_f32(m->final_norm), hidden, &ctx->w_final_norm);
    if (!tied) cuda_upload_add(up, &n_up, m->lm_head, vocab * hidden, &ctx->w_lm_head);
    for (int64_t l = 0; l < ctx->n_layers; l++) {
        const KvLayerWeights *w = &m->layers[l];
        KvCudaLayer *d = &ctx->layers[l];
        cuda_upload_add(up, &n_up, kv_mat_f32(w->input_norm), hidden, &d->input_norm);
        cuda_upload_add(up, &n_up, kv_mat_f32(w->post_attn_norm), hidden, &d->post_attn_norm);
        /* gemma2 only; NULL for mistral */
        cuda_upload_add(up, &n_up, kv_mat_f32(w->pre_ffw_norm), hidden, &d->pre_ffw_norm);
        cuda_upload_add(up, &n_up, kv_mat_f32(w->post_ffw_norm), hidden, &d->post_ffw_norm);
        cuda_upload_add(up, &n_up, w->wq, q_dim * hidden, &d->wq);
        cuda_upload_add(up, &n_up, w->wk, kv_dim * hidden, &d->wk);
        cuda_upload_add(up, &n_up, w->wv, kv_dim * hidden, &d->wv);
        cuda_upload_add(up, &n_up, w->wo, hidden * q_dim, &d->wo);
        /* qwen2 only; NULL otherwise */
        cuda_upload_add(up, &n_up, kv_mat_f32(w->bq), q_dim, &d->bq);
        cuda_upload_add(up, &n_up, kv_mat_f32(w->bk), kv_dim, &d->bk);
        cuda_upload_add(up, &n_up, kv_mat_f32(w->bv), kv_dim, &d->bv);
        /* gemma3 only; NULL otherwise */
        cuda_upload_add(up, &n_up, kv_mat_f32(w->q_norm), (size_t)ctx->hd, &d->q_norm);
        cuda_upload_add(up, &n_up, kv_mat_f32(w->k_norm), (size_t)ctx->hd, &d->k_norm);
        /* gpt_oss only; NULL otherwise */
        const size_t E = (size_t)ctx->n_experts;
        cuda_upload_add(up, &n_up, kv_mat_f32(w->bo), hidden, &d->bo);
        cuda_upload_add(up, &n_up, kv_mat_f32(w->sinks), (size_t)ctx->n_heads, &d->sinks);
        cuda_upload_add(up, &n_up, kv_mat_f32(w->router_w), E * hidden, &d->router_w);
        cuda_upload_add(up, &n_up, kv_mat_f32(w->router_b), E, &d->router_b);
        cuda_upload_add(up, &n_up, w->experts_gate_up, E * 2 * inter * hidden, &d->experts_gate_up);
        cuda_upload_add(up, &n_up, kv_mat_f32(w->experts_gate_up_b), E * 2 * inter, &d->experts_gate_up_b);
        cuda_upload_add(up, &n_up, w->experts_down, E * hidden * inter, &d->experts_down);
        cuda_upload_add(up, &n_up, kv_mat_f32(w->experts_down_b), E * hidden, &d->experts_down_b);
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
        if (up[i].host.dtype == KV_DTYPE_F32) {
            KV_CUDA_CHECK(cudaMemcpy(ctx->w_arena + off, up[i].host.data, up[i].n * sizeof(float),
                                     cudaMemcpyHostToDevice));
        } else {
            /* BF16/F16 kept as stored on the host: widened (exact) a chunk at
             * a time; the device holds F32 */
            if (chunk == NULL) chunk = (float *)malloc(KV_CUDA_UPLOAD_CHUNK * sizeof(float));
            if (chunk == NULL) {
                st = kv_error_set(err, KV_ERR_INTERNAL, "cuda: out of host memory");
                goto cleanup;
            }
            for (size_t k = 0; k < up[i].n; k += KV_CUDA_UPLOAD_CHUNK) {
                const size_t len =
                    up[i].n - k < KV_CUDA_UPLOAD_CHUNK ? up[i].n - k : KV_CUDA_UPLOAD_CHUNK;
                kv_mat_widen(up[i].host, (int64_t)k, (int64_t)len, chunk);
                KV_CUDA_CHECK(cudaMemcpy(ctx->w_arena + off + k, chunk, len * sizeof(float),
                                         cudaMemcpyHostToDevice));
            }
        }
        *up[i].dst = ctx->w_arena + off;
        off += (up[i].n + KV_CUDA_ARENA_ALIGN_FLOATS - 1) / KV_CUDA_ARENA_ALIGN_FLOATS *
               KV_CUDA_ARENA_ALIGN_FLOATS;
    }
    if (tied) ctx->w_lm_head = ctx->w_embed;
cleanup:
    free(chunk);
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

/* The buffers of snapshot slot `slot`: a copy of every persistent device
 * buffer. */
static KvStatus cuda_snap_alloc(KvCudaCtx *ctx, int slot, KvError *err) {
    KvStatus st = KV_OK;
    const int64_t L = ctx->n_layers, B = ctx->B;
    const int64_t rows = B * ctx->max_chunk;
    const size_t static_bytes = (size_t)(B * ctx->max_len * ctx->kv_dim) * sizeof(float);
    if (ctx->snap_ready[slot]) return KV_OK;
    ctx->snap_kc[slot] = (float **)calloc((size_t)L, sizeof(float *));
    ctx->snap_vc[slot] = (float **)calloc((size_t)L, sizeof(float *));
    if (ctx->snap_kc[slot] == NULL || ctx->snap_vc[slot] == NULL) {
        return kv_error_set(err, KV_ERR_INTERNAL, "cuda: out of host memory");
    }
    for (int64_t l = 0; l < L; l++) {
        KvCudaCache *c = &ctx->caches[l];
        if (ctx->kc[l] != NULL) {
            KV_ALLOC(ctx->snap_kc[slot][l], static_bytes);
            KV_ALLOC(ctx->snap_vc[slot][l], static_bytes);
        } else {
            KV_TRY(cuda_slots_alloc(ctx, &c->snap[slot], c->slots, err));
        }
    }
    KV_ALLOC(ctx->snap_real[slot], B * ctx->max_len);
    KV_ALLOC(ctx->snap_n_real[slot], B * (int64_t)sizeof(int64_t));
    KV_ALLOC(ctx->snap_total[slot], sizeof(int64_t));
    KV_ALLOC(ctx->snap_tok_in[slot], rows * (int64_t)sizeof(int32_t));
    KV_ALLOC(ctx->snap_real_in[slot], rows);
    ctx->snap_ready[slot] = true;
cleanup:
    return st;
}

static KvStatus cuda_ctx_alloc_state(KvCudaCtx *ctx, KvError *err) {
    KvStatus st = KV_OK;
    const int64_t L = ctx->n_layers, B = ctx->B;
    const int64_t rows = B * ctx->max_chunk;
    const size_t static_bytes = (size_t)(B * ctx->max_len * ctx->kv_dim) * sizeof(float);
    /* (2, hd / 2): rope_theta's, then the sliding layers' */
    float *inv = (float *)calloc((size_t)(ctx->hd > 0 ? ctx->hd : 1), sizeof *inv);
    ctx->kc = (float **)calloc((size_t)L, sizeof *ctx->kc);
    ctx->vc = (float **)calloc((size_t)L, sizeof *ctx->vc);
    ctx->caches = (KvCudaCache *)calloc((size_t)L, sizeof *ctx->caches);
    if (inv == NULL || ctx->kc == NULL || ctx->vc == NULL || ctx->caches == NULL) {
        st = kv_error_set(err, KV_ERR_INTERNAL, "cuda: out of host memory");
        goto cleanup;
    }
    for (int64_t l = 0; l < L; l++) {
        const int64_t w = kv_config_layer_window(ctx->c, l);
        KvCudaCache *c = &ctx->caches[l];
        if (ctx->variant == NULL || w == 0) {
            KV_ALLOC(ctx->kc[l], static_bytes);
            KV_ALLOC(ctx->vc[l], static_bytes);
            continue;
        }
        c->window = w;
        /* dynamic keeps W - 1 (W under the planted KV_FAULT_DYNAMIC_KEEPS_W) */
        c->slots = ctx->variant->host_shape && !(ctx->faults & KV_FAULT_DYNAMIC_KEEPS_W) ? w - 1 : w;
        KV_TRY(cuda_slots_alloc(ctx, &c->cur, c->slots, err));
        KV_TRY(cuda_slots_alloc(ctx, &c->tmp, c->slots, err));
        KV_ALLOC(c->indices, (size_t)w * sizeof(int64_t));
    }
    KV_ALLOC(ctx->real, B * ctx->max_len);
    KV_ALLOC(ctx->n_real, B * (int64_t)sizeof(int64_t));
    KV_ALLOC(ctx->total, sizeof(int64_t));
    KV_ALLOC(ctx->tok_in, rows * (int64_t)sizeof(int32_t));
    KV_ALLOC(ctx->real_in, rows);
    KV_TRY(cuda_snap_alloc(ctx, KV_SNAP_REPLAY, err));

    KV_ALLOC(ctx->inv_freq, 2 * (ctx->hd / 2) * (int64_t)sizeof(float));
    KV_ALLOC(ctx->x, rows * ctx->hidden * (int64_t)sizeof(float));
    KV_ALLOC(ctx->xn, rows * ctx->hidden * (int64_t)sizeof(float));
    KV_ALLOC(ctx->q, rows * ctx->q_dim * (int64_t)sizeof(float));
    KV_ALLOC(ctx->kn, rows * ctx->kv_dim * (int64_t)sizeof(float));
    KV_ALLOC(ctx->vn, rows * ctx->kv_dim * (int64_t)sizeof(float));
    KV_ALLOC(ctx->att, rows * ctx->q_dim * (int64_t)sizeof(float));
    KV_ALLOC(ctx->tmp, rows * ctx->hidden * (int64_t)sizeof(float));
    KV_ALLOC(ctx->gate, rows * ctx->inter * (int64_t)sizeof(float));
    KV_ALLOC(ctx->up, rows * ctx->inter * (int64_t)sizeof(float));
    if (ctx->n_experts > 0) {
        KV_ALLOC(ctx->moe_logits, rows * ctx->n_experts * (int64_t)sizeof(float));
        KV_ALLOC(ctx->moe_weight, rows * ctx->n_experts * (int64_t)sizeof(float));
        KV_ALLOC(ctx->moe_chosen, rows * ctx->n_experts);
        KV_ALLOC(ctx->moe_gu, rows * 2 * ctx->inter * (int64_t)sizeof(float));
        KV_ALLOC(ctx->moe_h, rows * ctx->inter * (int64_t)sizeof(float));
        KV_ALLOC(ctx->moe_out, rows * ctx->hidden * (int64_t)sizeof(float));
    }
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
    if (ctx->probes) {
        KV_ALLOC(ctx->nf_index, ctx->n_probes * B * (int64_t)sizeof(int64_t));
        KV_ALLOC(ctx->nf_value, ctx->n_probes * B * (int64_t)sizeof(float));
        /* the widest probe row: a chunk of q or attn (q_dim), of the residual
         * stream (hidden), the logits; and a full layer's cache positions */
        int64_t widest = ctx->max_chunk * (ctx->q_dim > ctx->hidden ? ctx->q_dim : ctx->hidden);
        if (ctx->vocab > widest) widest = ctx->vocab;
        const int64_t chunks = (widest * (int64_t)sizeof(float) + KV_PROBE_CHUNK - 1) / KV_PROBE_CHUNK;
        ctx->probe_slices = chunks > ctx->max_len ? chunks : ctx->max_len;
        KV_ALLOC(ctx->slice_hash, B * ctx->probe_slices * (int64_t)sizeof(uint64_t));
        KV_ALLOC(ctx->slice_nf, B * ctx->probe_slices * (int64_t)sizeof(int64_t));
        KV_ALLOC(ctx->slice_nfv, B * ctx->probe_slices * (int64_t)sizeof(float));
    }
    KV_ALLOC(ctx->dev_err, sizeof(int32_t));
    KV_ALLOC(ctx->fault_clock, sizeof(uint64_t));

    /* The host's inverse frequencies (kvmath.c), so both backends rotate by
     * the same F32 constants. */
    kv_rope_layer_inv_freq(ctx->c, -1, inv); /* rope_theta's (gpt_oss: YaRN's) */
    if (ctx->c->rope_theta_local > 0.0) {
        kv_rope_inv_freq(ctx->hd, ctx->c->rope_theta_local, inv + ctx->hd / 2);
    } else {
        memcpy(inv + ctx->hd / 2, inv, (size_t)(ctx->hd / 2) * sizeof *inv);
    }
    KV_CUDA_CHECK(cudaMemcpy(ctx->inv_freq, inv, 2 * (size_t)(ctx->hd / 2) * sizeof(float),
                             cudaMemcpyHostToDevice));
cleanup:
    free(inv);
    return st;
}

/* Empties the caches (K/V NaN-poisoned, as the CPU's reset: a read of a
 * never-written slot shows up in the logits; positions -1, real 0) and
 * zeroes positions and inputs. Synchronous. */
KvStatus kv_cuda_ctx_reset_state(KvCudaCtx *ctx, KvError *err) {
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
    if (ctx->nf_index != NULL) {
        KV_TRY(kv_cuda_fill(ctx, ctx->nf_index, 0xFF,
                            (size_t)(ctx->n_probes * B) * sizeof(int64_t), err)); /* -1 */
    }
    KV_TRY(kv_cuda_fill(ctx, ctx->fault_clock, 0, sizeof(uint64_t), err));
    KV_CUDA_CHECK(cudaStreamSynchronize(ctx->stream));
    ctx->len = 0;
cleanup:
    return st;
}

KvStatus kv_cuda_ctx_create(KvCudaCtx *ctx, const KvModel *m, int64_t B, int64_t max_len,
                            int64_t max_chunk, const KvCacheOps *variant, unsigned faults,
                            bool probes, const KvCudaCtx *weights, char *device,
                            size_t device_len, KvError *err) {
    KvStatus st = KV_OK;
    KvCudaInfo info;
    KvError qerr = {{0}};
    int blas_version = 0;
    const KvConfig *c = &m->config;

    memset(ctx, 0, sizeof *ctx);
    ctx->model = m;
    ctx->c = c;
    ctx->variant = variant;
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
    ctx->gemma = kv_config_gemma_style(c);
    ctx->eps = (float)c->rms_norm_eps;
    ctx->scale = kv_config_attn_scale(c);
    ctx->rope_scale = kv_rope_scale(c);
    ctx->n_experts = c->num_experts;
    ctx->experts_per_tok = c->experts_per_tok;
    ctx->swiglu_limit = (float)c->swiglu_limit;
    ctx->swiglu_alpha = (float)c->swiglu_alpha;
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
    KV_TRY(weights != NULL ? cuda_ctx_borrow(ctx, weights, err) : cuda_ctx_upload(ctx, err));
    KV_TRY(cuda_ctx_alloc_state(ctx, err));
    /* The uploads and zero-fills above ran on the legacy default stream
     * (cudaMemcpy from pageable memory and cudaMemset may return before
     * the device is done), which a non-blocking stream does not wait for. */
    KV_CUDA_CHECK(cudaDeviceSynchronize());
    KV_TRY(kv_cuda_ctx_reset_state(ctx, err));
cleanup:
    if (st != KV_OK) kv_cuda_ctx_destroy(ctx);
    return st;
}


/* ---- replay-check snapshots ---- */

KvStatus kv_cuda_snapshot(KvCudaCtx *ctx, int slot, bool save, KvError *err) {
    KvStatus st = KV_OK;
    const int64_t B = ctx->B, D = ctx->kv_dim;
    const int64_t rows = B * ctx->max_chunk;
    const size_t static_bytes = (size_t)(B * ctx->max_len * D) * sizeof(float);
    if (slot < 0 || slot >= KV_CUDA_SNAP_SLOTS) {
        return kv_error_set(err, KV_ERR_INTERNAL, "cuda snapshot: no slot %d", slot);
    }
    if (!save && !ctx->snap_ready[slot]) {
        return kv_error_set(err, KV_ERR_INTERNAL, "cuda snapshot: slot %d: none saved", slot);
    }
    /* the planted prefix_alias: the entry shares the sliding layers' slots */
    const bool alias = !save && slot == KV_SNAP_PREFIX && (ctx->faults & KV_FAULT_PREFIX_ALIAS);
    KV_TRY(cuda_snap_alloc(ctx, slot, err));
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
            KV_SNAP(ctx->kc[l], ctx->snap_kc[slot][l], static_bytes);
            KV_SNAP(ctx->vc[l], ctx->snap_vc[slot][l], static_bytes);
            continue;
        }
        const size_t fbytes = (size_t)(B * c->slots * D) * sizeof(float);
        if (!alias) {
            KV_SNAP(c->cur.k, c->snap[slot].k, fbytes);
            KV_SNAP(c->cur.v, c->snap[slot].v, fbytes);
            KV_SNAP(c->cur.real, c->snap[slot].real, (size_t)(B * c->slots));
            KV_SNAP(c->cur.pos, c->snap[slot].pos, (size_t)c->slots * sizeof(int64_t));
        }
        if (save) {
            c->snap_filled[slot] = c->filled;
        } else {
            c->filled = c->snap_filled[slot];
        }
    }
    KV_SNAP(ctx->real, ctx->snap_real[slot], (size_t)(B * ctx->max_len));
    KV_SNAP(ctx->n_real, ctx->snap_n_real[slot], (size_t)B * sizeof(int64_t));
    KV_SNAP(ctx->total, ctx->snap_total[slot], sizeof(int64_t));
    KV_SNAP(ctx->tok_in, ctx->snap_tok_in[slot], (size_t)rows * sizeof(int32_t));
    KV_SNAP(ctx->real_in, ctx->snap_real_in[slot], (size_t)rows);
#undef KV_SNAP
    if (save) {
        ctx->snap_len[slot] = ctx->len;
    } else {
        ctx->len = ctx->snap_len[slot];
    }
cleanup:
    return st;
}

/* ---- device error flags ---- */

KvStatus kv_cuda_dev_err_status(const KvCudaCtx *ctx, int32_t flags, const char *when,
                                int64_t at, KvError *err) {
    return kv_error_set(err, KV_ERR_INTERNAL,
                        "cuda %s: a device invariant broke by %s %lld (flags 0x%x:%s%s%s)",
                        ctx->variant != NULL ? ctx->variant->name : "reference", when,
                        (long long)at, (unsigned)flags,
                        (flags & KV_CUDA_DERR_TOKEN) ? " token id outside the vocabulary" : "",
                        (flags & KV_CUDA_DERR_SLOT) ? " position outside the state" : "",
                        (flags & KV_CUDA_DERR_KEYS) ? " more visible keys than gathered" : "");
}

KvStatus kv_cuda_check_dev_err(KvCudaCtx *ctx, const char *phase, int64_t at, KvError *err) {
    KvStatus st = KV_OK;
    int32_t flags = 0;
    KV_CUDA_CHECK(cudaMemcpyAsync(&flags, ctx->dev_err, sizeof flags, cudaMemcpyDeviceToHost,
                                  ctx->stream));
    KV_CUDA_CHECK(cudaStreamSynchronize(ctx->stream));
    if (flags != 0) {
        st = kv_cuda_dev_err_status(ctx, flags, phase, at, err);
    }
cleanup:
    return st;
}
