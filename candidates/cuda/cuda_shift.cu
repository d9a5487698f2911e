/* cuda_shift.cu: the context shift (DESIGN §5, backend.h's shift) on the
 * GPU: the persistent device state is copied to the host, shifted by the
 * same buffer-level steps as the CPU reference (engine/shift.h) and
 * copied back into the same device buffers.
 *
 * Why on the host: a shift happens once between two forwards (llama.cpp's
 * K-shift runs when the context fills, not every step), so its cost is a
 * copy of the cache each way, and the host steps are the ones the CPU
 * reference runs: the re-laid slots and the re-rotated keys (RoPE(-d) with
 * the host's F32 constants) are then the same bytes on both backends, and
 * every GPU variant still equals the GPU reference bitwise because all of
 * them shift through this one function. The buffers keep their addresses:
 * a captured graph holds them by value. */
#include "cuda_internal.cuh"

#include <stdlib.h>

extern "C" {
#include "shift.h"
}

/* Copies bytes device -> host (to_host) or host -> device on ctx's stream. */
static KvStatus shift_copy(KvCudaCtx *ctx, void *host, void *dev, size_t bytes, bool to_host,
                           KvError *err) {
    KvStatus st = KV_OK;
    KV_CUDA_CHECK(cudaMemcpyAsync(to_host ? host : dev, to_host ? dev : host, bytes,
                                  to_host ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice,
                                  ctx->stream));
    KV_CUDA_CHECK(cudaStreamSynchronize(ctx->stream));
cleanup:
    return st;
}

KvStatus kv_cuda_shift(KvCudaCtx *ctx, int64_t keep, int64_t drop, KvError *err) {
    KvStatus st = KV_OK;
    const KvConfig *c = ctx->c;
    const int64_t B = ctx->B, L = ctx->max_len, D = ctx->kv_dim, H = ctx->hd / 2;
    /* Host room for the largest of a static layer and a variant's slots. */
    int64_t rows = L;
    for (int64_t l = 0; l < ctx->n_layers; l++) {
        if (ctx->kc[l] == NULL && ctx->caches[l].slots > rows) rows = ctx->caches[l].slots;
    }
    const size_t static_floats = (size_t)(B * L * D);
    int64_t T = 0;
    float *inv = NULL;       /* (2, hd / 2) the global and the sliding layers' frequencies */
    uint8_t *real = NULL;    /* (B, max_len) */
    int64_t *n_real = NULL;  /* (B) */
    int64_t *dropped = NULL; /* (B) real tokens each row loses */
    float *k = NULL, *v = NULL; /* (B, rows, kv_dim): a static layer, or a variant's slots */
    uint8_t *sreal = NULL;   /* (B, rows) */
    int64_t *spos = NULL;    /* (rows) */
    KV_TRY(kv_shift_check(c, ctx->len, keep, drop, err));
    /* The memory side's count: it differs from the host's only under a
     * planted fault that freezes the count (stale_scalar), as on the CPU. */
    KV_TRY(shift_copy(ctx, &T, ctx->total, sizeof T, true, err));
    if (T < keep + drop) {
        ctx->len -= drop;
        goto cleanup;
    }
    inv = (float *)malloc((size_t)(2 * H > 0 ? 2 * H : 1) * sizeof *inv);
    real = (uint8_t *)malloc((size_t)(B * L));
    n_real = (int64_t *)malloc((size_t)B * sizeof *n_real);
    dropped = (int64_t *)calloc((size_t)B, sizeof *dropped);
    k = (float *)malloc((size_t)(B * rows * D) * sizeof *k);
    v = (float *)malloc((size_t)(B * rows * D) * sizeof *v);
    sreal = (uint8_t *)malloc((size_t)(B * rows));
    spos = (int64_t *)malloc((size_t)rows * sizeof *spos);
    if (!inv || !real || !n_real || !dropped || !k || !v || !sreal || !spos) {
        st = kv_error_set(err, KV_ERR_INTERNAL, "cuda context shift: out of host memory");
        goto cleanup;
    }
    /* The very frequencies the rope kernel reads. */
    KV_TRY(shift_copy(ctx, inv, ctx->inv_freq, (size_t)(2 * H) * sizeof *inv, true, err));
    KV_TRY(shift_copy(ctx, real, ctx->real, (size_t)(B * L), true, err));
    KV_TRY(shift_copy(ctx, n_real, ctx->n_real, (size_t)B * sizeof *n_real, true, err));
    kv_shift_real(real, n_real, B, L, keep, drop, T, dropped);
    for (int64_t l = 0; l < ctx->n_layers; l++) {
        const float *layer_inv = inv + (c->layer_sliding[l] ? H : 0);
        if (ctx->kc[l] != NULL) {
            const size_t bytes = static_floats * sizeof(float);
            KV_TRY(shift_copy(ctx, k, ctx->kc[l], bytes, true, err));
            KV_TRY(shift_copy(ctx, v, ctx->vc[l], bytes, true, err));
            kv_shift_static(k, v, B, L, c, layer_inv, keep, drop, T, dropped);
            KV_TRY(shift_copy(ctx, k, ctx->kc[l], bytes, false, err));
            KV_TRY(shift_copy(ctx, v, ctx->vc[l], bytes, false, err));
            continue;
        }
        KvCudaCache *cache = &ctx->caches[l];
        const int64_t S = cache->slots;
        const size_t fbytes = (size_t)(B * S * D) * sizeof(float);
        KV_TRY(shift_copy(ctx, k, cache->cur.k, fbytes, true, err));
        KV_TRY(shift_copy(ctx, v, cache->cur.v, fbytes, true, err));
        KV_TRY(shift_copy(ctx, sreal, cache->cur.real, (size_t)(B * S), true, err));
        KV_TRY(shift_copy(ctx, spos, cache->cur.pos, (size_t)S * sizeof *spos, true, err));
        const KvCacheState cs = {k, v, sreal, spos, NULL, B, S, D, 0};
        KV_TRY(kv_shift_slots(&cs, ctx->variant->layout, cache->window, c, layer_inv, drop, T,
                              dropped, ctx->faults, l, ctx->variant->name, err));
        KV_TRY(shift_copy(ctx, k, cache->cur.k, fbytes, false, err));
        KV_TRY(shift_copy(ctx, v, cache->cur.v, fbytes, false, err));
        KV_TRY(shift_copy(ctx, sreal, cache->cur.real, (size_t)(B * S), false, err));
        KV_TRY(shift_copy(ctx, spos, cache->cur.pos, (size_t)S * sizeof *spos, false, err));
    }
    KV_TRY(shift_copy(ctx, real, ctx->real, (size_t)(B * L), false, err));
    KV_TRY(shift_copy(ctx, n_real, ctx->n_real, (size_t)B * sizeof *n_real, false, err));
    T -= drop;
    KV_TRY(shift_copy(ctx, &T, ctx->total, sizeof T, false, err));
    ctx->len -= drop;
cleanup:
    free(inv);
    free(real);
    free(n_real);
    free(dropped);
    free(k);
    free(v);
    free(sreal);
    free(spos);
    return st;
}
