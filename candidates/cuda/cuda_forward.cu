/* cuda_forward.cu: the forward pass on the GPU as a sequence of launches on
 * one stream (reference/forward.c's op order, probes included), and its
 * capture into a CUDA graph. The same launch code runs eagerly and under
 * stream capture; when to re-capture is the graph runner's rule
 * (engine/graph_runner.c), the same for every backend.
 *
 * A re-capture is applied to the existing executable with
 * cudaGraphExecUpdate when the topology allows it, else instantiated anew;
 * both are counted.
 *
 * Verified where this was written (no GPU) by compilation only, and against
 * a CPU emulation of the CUDA runtime outside the tree (kernels as
 * cooperative fibers with real __syncthreads barriers, graphs as recorded
 * launches with arguments frozen at capture, capture-unsafe calls refused,
 * cuBLAS as a plain loop), also under ASan + UBSan. Concurrency on real
 * hardware, cuBLAS's real kernels under capture, the driver's rules for
 * cudaGraphExecUpdate and device libm results need a GPU run
 * (docs/gpu-runs/). */
#include "cuda_internal.cuh"

extern "C" {
#include "forward.h"
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
    const bool variant_layer = ctx->variant != NULL && cache->window > 0;
    /* The variant's order (cache.h): n == 1 may update, then attend over the
     * view alone; every n > 1 attends over the view plus the new keys first. */
    const bool after = variant_layer && n == 1 &&
                       ctx->variant->one_token_order == KV_ATTEND_AFTER_UPDATE;
    /* Host values baked into a captured step (the capture key covers them). */
    const int64_t host_total = ctx->len;
    const int64_t slots_before = kv_cuda_cache_n_slots(ctx, l, n, false);
    const int64_t slots_after = kv_cuda_cache_n_slots(ctx, l, n, true);

    KV_TRY(kv_cuda_rmsnorm(ctx, ctx->x, hidden, w->input_norm, ctx->xn, hidden, rows, err));
    KV_TRY(kv_cuda_gemm(ctx, ctx->xn, w->wq, ctx->q, rows, hidden, q_dim, err));
    KV_TRY(kv_cuda_gemm(ctx, ctx->xn, w->wk, ctx->kn, rows, hidden, kv_dim, err));
    KV_TRY(kv_cuda_gemm(ctx, ctx->xn, w->wv, ctx->vn, rows, hidden, kv_dim, err));
    if (w->bq != NULL) { /* qwen2's q/k/v biases */
        KV_TRY(kv_cuda_bias_rows(ctx, ctx->q, w->bq, rows, q_dim, err));
        KV_TRY(kv_cuda_bias_rows(ctx, ctx->kn, w->bk, rows, kv_dim, err));
        KV_TRY(kv_cuda_bias_rows(ctx, ctx->vn, w->bv, rows, kv_dim, err));
    }
    if (w->q_norm != NULL) { /* gemma3: per head, before RoPE */
        KV_TRY(kv_cuda_rmsnorm_heads(ctx, ctx->q, w->q_norm, rows * ctx->n_heads, ctx->hd, err));
        KV_TRY(kv_cuda_rmsnorm_heads(ctx, ctx->kn, w->k_norm, rows * ctx->n_kv_heads, ctx->hd,
                                     err));
    }
    KV_TRY(kv_cuda_rope(ctx, n, l, err));
    KV_TRY(kv_cuda_probe(ctx, kv_probe_index(l, KV_PROBE_Q), ctx->q, n * q_dim * fbytes, err));
    KV_TRY(kv_cuda_probe(ctx, kv_probe_index(l, KV_PROBE_K), ctx->kn, n * kv_dim * fbytes, err));
    KV_TRY(kv_cuda_probe(ctx, kv_probe_index(l, KV_PROBE_V), ctx->vn, n * kv_dim * fbytes, err));

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
    KV_TRY(kv_cuda_probe(ctx, kv_probe_index(l, KV_PROBE_ATTN), ctx->att, n * q_dim * fbytes, err));

    KV_TRY(kv_cuda_gemm(ctx, ctx->att, w->wo, ctx->tmp, rows, q_dim, hidden, err));
    if (w->bo != NULL) KV_TRY(kv_cuda_bias_rows(ctx, ctx->tmp, w->bo, rows, hidden, err));
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
    if (ctx->n_experts > 0) {
        KV_TRY(kv_cuda_moe(ctx, w, rows, err)); /* gpt_oss */
    } else {
        KV_TRY(kv_cuda_gemm(ctx, ctx->xn, w->w_gate, ctx->gate, rows, hidden, inter, err));
        KV_TRY(kv_cuda_gemm(ctx, ctx->xn, w->w_up, ctx->up, rows, hidden, inter, err));
        KV_TRY(kv_cuda_glu(ctx, rows * inter, err));
        KV_TRY(kv_cuda_gemm(ctx, ctx->gate, w->w_down, ctx->tmp, rows, inter, hidden, err));
    }
    if (ctx->gemma) {
        KV_TRY(kv_cuda_rmsnorm(ctx, ctx->tmp, hidden, w->post_ffw_norm, ctx->tmp, hidden, rows,
                               err));
    }
    KV_TRY(kv_cuda_probe(ctx, kv_probe_index(l, KV_PROBE_MLP), ctx->tmp, n * hidden * fbytes, err));
    KV_TRY(kv_cuda_add(ctx, ctx->x, ctx->tmp, rows * hidden, err));
    KV_TRY(kv_cuda_probe(ctx, kv_probe_index(l, KV_PROBE_RESIDUAL), ctx->x, n * hidden * fbytes, err));
cleanup:
    return st;
}

/* One forward of the n tokens already in tok_in/real_in (B, n): positions,
 * embedding, layers, final norm of each row's last token, lm_head, final
 * softcap, probes, argmax into tok_in (B, 1) and *total += n. Launches only:
 * the same code runs eagerly and under stream capture. */
KvStatus kv_cuda_launch_forward(KvCudaCtx *ctx, int64_t n, KvError *err) {
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

/* ---- graph capture ---- */

KvStatus kv_cuda_graph_capture(KvCudaGraph *r, KvCudaCtx *ctx, int64_t n, KvError *err) {
    KvStatus st = KV_OK;
    cudaGraph_t g = NULL;
    bool capturing = false;
    cudaGraphExecUpdateResultInfo info;
    cudaError_t e = cudaSuccess;

    /* Thread-local: an unsafe CUDA call from this thread while capturing is
     * an error instead of silently breaking the capture. */
    KV_CUDA_CHECK(cudaStreamBeginCapture(ctx->stream, cudaStreamCaptureModeThreadLocal));
    capturing = true;
    KV_TRY(kv_cuda_launch_forward(ctx, n, err));
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
    r->n = n;
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


void kv_cuda_graph_free(KvCudaGraph *r) {
    if (r->exec != NULL) (void)cudaGraphExecDestroy(r->exec);
    if (r->graph != NULL) (void)cudaGraphDestroy(r->graph);
    r->exec = NULL;
    r->graph = NULL;
}

KvStatus kv_cuda_graph_launch(KvCudaGraph *r, KvCudaCtx *ctx, KvError *err) {
    KvStatus st = KV_OK;
    if (r->exec == NULL) {
        return kv_error_set(err, KV_ERR_INTERNAL, "cuda graph: launch before any capture");
    }
    KV_CUDA_CHECK(cudaGraphLaunch(r->exec, ctx->stream));
    r->launches++;
cleanup:
    return st;
}
