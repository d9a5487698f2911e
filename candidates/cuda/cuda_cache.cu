/* cuda_cache.cu: the six sliding-window cache variants (DESIGN §3) on the
 * GPU, with the slot semantics of candidates/cache_*.c and real device data
 * movement:
 *   index_copy  - gather indices (i + shift) % W computed by a kernel from the
 *                 device position, a gather into the temporary, index_copy of
 *                 the new rows into it, a copy back (one graph: no host branch);
 *   cat_shift   - filling: index_copy at clamp(p, 0, W-1) in place; full:
 *                 cat(keys[1:], new) built in the temporary, copied back; the
 *                 regime is a host branch (graphs re-capture when it flips);
 *   roll        - filling as cat_shift; full: roll(-1) into a separate output
 *                 buffer, copied back, then the last slot written; host branch;
 *   always_roll - copy, roll left by min(n, W) from the copy, write the newest
 *                 rows rightmost: the same kernels every step, no branch;
 *   ring        - write slot p % W, nothing moves;
 *   dynamic     - W - 1 slots; attention reads them plus the new keys before
 *                 the update; the filled count (the attended length) is a host
 *                 value, so graphs re-capture per length until full.
 * Every position a kernel needs comes from *total in device memory; the
 * host's count (host_total) only picks cat_shift's and roll's regime, as
 * transformers' Python `is_full` does.
 *
 * Planted faults (fault.h) in their GPU form: KV_FAULT_INPLACE_SHIFT shifts
 * cat_shift's and roll's rows in place, the overlapping copy walked in the
 * wrong direction (positions stay right, as on the CPU); KV_FAULT_RACY_SHIFT
 * shifts them in place by many unordered blocks, a real race (upwards for
 * cat_shift, downwards for roll); KV_FAULT_PREFILL_FIRST_W makes
 * index_copy store the first W rows of a long prefill at the last W's slots;
 * KV_FAULT_RING_SLOT puts position p in ring slot (p + 1) % W (recorded
 * there); KV_FAULT_DYNAMIC_KEEPS_W gives dynamic W slots (cuda_ctx.cu);
 * KV_FAULT_STATIC_LAYER makes index_copy a static layer: identity gather
 * indices and writes at min(p, W - 1). */
#include "cuda_internal.cuh" /* first: it includes the C headers with C linkage */
#include "cache_registry.h"
#include "cuda_device.h"
#include "cuda_forward.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>

/* How a put kernel maps new row j (of n) to a slot. */
typedef enum {
    /* Slot p0 + j - first_new for the rows that stay in the window
     * (first_new = max(p0 + n - W, 0)); for n = 1 this is clamp(p0, 0, W-1):
     * index_copy, and cat_shift's and roll's filling regime. */
    KV_PUT_WINDOW_TAIL = 0,
    /* Row 0 into one given slot (n = 1): roll's and dynamic's fast paths. */
    KV_PUT_FIXED = 1,
    /* Slot (p0 + j) % W for the last min(n, W) rows: ring. */
    KV_PUT_RING = 2,
    /* The last m = min(n, W) rows into slots W - m ..: always_roll. */
    KV_PUT_RIGHT = 3,
    /* Slot min(p0 + j, W - 1), of the rows clamped to W - 1 the last one
     * only (no two threads write one slot): KV_FAULT_STATIC_LAYER's
     * StaticLayer of W slots. */
    KV_PUT_CLAMP = 4,
} KvPutMode;

/* How a roll kernel's shift is found. */
typedef enum {
    KV_ROLL_HOST = 0, /* the given shift (always_roll: min(n, W) % W; roll full: 1 % W) */
    KV_ROLL_SPAN = 1, /* roll's n > 1 update: first_new - first_old from the device position,
                       * 0 (no roll) unless 0 < shift < W */
} KvRollMode;

/* first_new - first_old of an update of n at p0 (cache_roll.c), or 0 when
 * the roll is skipped there. */
static __device__ __forceinline__ int64_t kv_dev_span_shift(int64_t p0, int64_t n, int64_t W) {
    const int64_t end = p0 + n;
    const int64_t first_old = p0 > W ? p0 - W : 0;
    const int64_t first_new = end > W ? end - W : 0;
    const int64_t shift = first_new - first_old;
    return shift > 0 && shift < W ? shift : 0;
}

/* index_copy's gather indices from the device position: (i + shift) % W with
 * shift = (p0 >= W) for one token (transformers' to_shift), and
 * (first_new - first_old) % W for n > 1. */
static __global__ void kv_cache_indices_kernel(int64_t *__restrict__ indices /* (W) */, int64_t W,
                                        const int64_t *__restrict__ total, int64_t n,
                                        int static_layer) {
    const int64_t p0 = *total;
    int64_t shift;
    if (static_layer) {
        shift = 0; /* KV_FAULT_STATIC_LAYER: a static layer never shifts */
    } else if (n == 1) {
        shift = p0 >= W ? 1 : 0;
    } else {
        const int64_t end = p0 + n;
        const int64_t first_old = p0 > W ? p0 - W : 0;
        const int64_t first_new = end > W ? end - W : 0;
        shift = (first_new - first_old) % W;
    }
    for (int64_t i = threadIdx.x; i < W; i += blockDim.x) indices[i] = (i + shift) % W;
}

/* dst[:, i] = src[:, indices[i]] for K, V, real and pos: k_out = keys[:, :, indices].
 * dst and src are distinct buffers (a gather through a permutation cannot
 * run in place). */
static __global__ void kv_cache_gather_kernel(KvCudaSlots dst, KvCudaSlots src,
                                       const int64_t *__restrict__ indices /* (W) */, int64_t B,
                                       int64_t W, int64_t D) {
    const int64_t count = B * W * D;
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < count;
         e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t d = e % D, i = (e / D) % W, b = e / (W * D);
        const int64_t from = indices[i];
        dst.k[e] = src.k[(b * W + from) * D + d];
        dst.v[e] = src.v[(b * W + from) * D + d];
        if (d == 0) dst.real[b * W + i] = src.real[b * W + from];
        if (d == 0 && b == 0) dst.pos[i] = src.pos[from];
    }
}

/* dst[:, i] = src[:, (i + shift) % W] (torch.roll(src, -shift)), dst != src. */
static __global__ void kv_cache_roll_kernel(KvCudaSlots dst, KvCudaSlots src, int64_t B, int64_t W,
                                     int64_t D, int mode, int64_t host_shift,
                                     const int64_t *__restrict__ total, int64_t n) {
    const int64_t shift = mode == KV_ROLL_SPAN ? kv_dev_span_shift(*total, n, W) : host_shift;
    const int64_t count = B * W * D;
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < count;
         e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t d = e % D, i = (e / D) % W, b = e / (W * D);
        const int64_t from = (i + shift) % W;
        dst.k[e] = src.k[(b * W + from) * D + d];
        dst.v[e] = src.v[(b * W + from) * D + d];
        if (d == 0) dst.real[b * W + i] = src.real[b * W + from];
        if (d == 0 && b == 0) dst.pos[i] = src.pos[from];
    }
}

/* Planted KV_FAULT_INPLACE_SHIFT: cur[:, i] = cur[:, (i + shift) % W] for K,
 * V and real, in place, the overlapping copy run in the wrong direction: one
 * block per row walks the slots from the highest down, so slot i reads a slot
 * this pass has already overwritten (the CPU analog, cache_roll.c). The first
 * form, one block per (row, slot) racing each other, would rarely show on a
 * real GPU: with W blocks resident at once, every block reads before any
 * writes, and the gate could not be sure to catch it. Positions are
 * bookkeeping and are rolled correctly elsewhere, so the cache looks
 * plausible (as on the CPU). */
static __global__ void kv_cache_shift_inplace_kernel(KvCudaSlots cur, int64_t B, int64_t W, int64_t D,
                                              int mode, int64_t host_shift,
                                              const int64_t *__restrict__ total, int64_t n) {
    const int64_t shift = mode == KV_ROLL_SPAN ? kv_dev_span_shift(*total, n, W) : host_shift;
    const int64_t b = blockIdx.x;
    if (shift == 0 || b >= B) return; /* uniform across the block */
    for (int64_t i = W - 1; i >= 0; i--) {
        const int64_t from = (i + shift) % W;
        for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
            cur.k[(b * W + i) * D + d] = cur.k[(b * W + from) * D + d];
            cur.v[(b * W + i) * D + d] = cur.v[(b * W + from) * D + d];
        }
        if (threadIdx.x == 0) cur.real[b * W + i] = cur.real[b * W + from];
        /* Slot i is written before any thread reads it as a source. */
        __syncthreads();
    }
}

/* Planted KV_FAULT_RACY_SHIFT: cur[:, i] = cur[:, (i + shift) % W] for the
 * slots i < count of K, V and real, in place, one element of the flat
 * (B, count, D) range per thread, KV_RACY_SHIFT_BLOCK threads per block and
 * nothing ordering the blocks: an element whose source another block has
 * already overwritten copies the new value, so the result depends on which
 * blocks ran first (pytorch #197829's overlapping in-place shift). Block
 * blockIdx.x takes the range's blocks upwards, or downwards from the top
 * (downwards): the hardware starts low block indices first, so the two
 * walks race from opposite sides. Positions are rolled right elsewhere. The
 * CPU analog runs the blocks in order (candidates/cache_racy_shift.c). */
static __global__ void kv_cache_shift_racy_kernel(KvCudaSlots cur, int64_t B, int64_t W, int64_t D,
                                                  int64_t count, int mode, int64_t host_shift,
                                                  const int64_t *__restrict__ total, int64_t n,
                                                  int downwards) {
    const int64_t shift = mode == KV_ROLL_SPAN ? kv_dev_span_shift(*total, n, W) : host_shift;
    if (shift == 0) return;
    const int64_t blk = downwards ? (int64_t)gridDim.x - 1 - blockIdx.x : (int64_t)blockIdx.x;
    const int64_t e = blk * blockDim.x + threadIdx.x;
    if (e >= B * count * D) return;
    const int64_t b = e / (count * D), i = e / D % count, d = e % D;
    const int64_t dst = b * W + i, src = b * W + (i + shift) % W;
    const float kv = cur.k[src * D + d], vv = cur.v[src * D + d];
    const uint8_t r = cur.real[src];
    cur.k[dst * D + d] = kv;
    cur.v[dst * D + d] = vv;
    if (d == 0) cur.real[dst] = r;
}

/* dst[i] = src[(i + shift) % W] for the positions alone (the in-place fault's
 * correct bookkeeping), dst != src. */
static __global__ void kv_cache_pos_roll_kernel(int64_t *__restrict__ dst /* (W) */,
                                         const int64_t *__restrict__ src /* (W) */, int64_t W,
                                         int mode, int64_t host_shift,
                                         const int64_t *__restrict__ total, int64_t n) {
    const int64_t shift = mode == KV_ROLL_SPAN ? kv_dev_span_shift(*total, n, W) : host_shift;
    for (int64_t i = threadIdx.x; i < W; i += blockDim.x) dst[i] = src[(i + shift) % W];
}

/* New rows into dst (S slots per row) by `mode`; positions p0 + j from the
 * device. fault, a planted fault of the mode: window-tail mode
 * (KV_FAULT_PREFILL_FIRST_W) takes the row data from j - j0 instead of j,
 * slots and positions right; ring mode (KV_FAULT_RING_SLOT) writes slot
 * (p + 1) % W and records p there. A slot outside [0, S) is a device error,
 * never a write. */
static __global__ void kv_cache_put_kernel(KvCudaSlots dst, int64_t B, int64_t S, int64_t W, int64_t D,
                                    const float *__restrict__ kn /* (B, n, D) */,
                                    const float *__restrict__ vn /* (B, n, D) */,
                                    const uint8_t *__restrict__ real_in /* (B, n) */, int64_t n,
                                    const int64_t *__restrict__ total, int mode,
                                    int64_t fixed_slot, int fault,
                                    int32_t *__restrict__ dev_err) {
    const int64_t p0 = *total;
    const int64_t end = p0 + n;
    const int64_t first_new = end > W ? end - W : 0;
    const int64_t j0 = first_new > p0 ? first_new - p0 : 0;
    const int64_t m = n < W ? n : W;
    const int64_t count = n * B * D;
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < count;
         e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t d = e % D, b = (e / D) % B, j = e / (B * D);
        int64_t slot, src = j;
        if (mode == KV_PUT_WINDOW_TAIL) {
            if (j < j0) continue;
            slot = p0 + j - first_new;
            if (fault) src = j - j0;
        } else if (mode == KV_PUT_FIXED) {
            if (j != 0) continue;
            slot = fixed_slot;
        } else if (mode == KV_PUT_RING) {
            if (j < n - m) continue;
            slot = (p0 + j + (fault ? 1 : 0)) % W;
        } else if (mode == KV_PUT_CLAMP) {
            if (p0 + j >= W - 1 && j != n - 1) continue;
            slot = p0 + j < W - 1 ? p0 + j : W - 1;
        } else { /* KV_PUT_RIGHT */
            if (j < n - m) continue;
            slot = W - n + j;
        }
        if (slot < 0 || slot >= S) {
            if (d == 0 && b == 0) atomicOr(dev_err, KV_CUDA_DERR_SLOT);
            continue;
        }
        dst.k[(b * S + slot) * D + d] = kn[(b * n + src) * D + d];
        dst.v[(b * S + slot) * D + d] = vn[(b * n + src) * D + d];
        if (d == 0) dst.real[b * S + slot] = real_in[b * n + src];
        if (d == 0 && b == 0) dst.pos[slot] = p0 + j;
    }
}

/* dst = the last keep = min(stored + n, S) entries of cat(src's first
 * `stored` slots, the n new rows) in slots 0 .. keep-1 (cat_shift's full
 * regime and n > 1, dynamic's full regime and n > 1). stored_host < 0:
 * stored = min(p0, W) from the device position (cat_shift). clear_rest:
 * slots keep .. S-1 become empty (NaN, real 0, pos -1), as cat_shift's CPU
 * update leaves them. dst != src. */
static __global__ void kv_cache_cat_kernel(KvCudaSlots dst, KvCudaSlots src, int64_t B, int64_t S,
                                    int64_t W, int64_t D,
                                    const float *__restrict__ kn /* (B, n, D) */,
                                    const float *__restrict__ vn /* (B, n, D) */,
                                    const uint8_t *__restrict__ real_in /* (B, n) */, int64_t n,
                                    const int64_t *__restrict__ total, int64_t stored_host,
                                    int clear_rest) {
    const int64_t p0 = *total;
    const int64_t stored = stored_host >= 0 ? stored_host : (p0 < W ? p0 : W);
    const int64_t len = stored + n;
    const int64_t keep = len < S ? len : S;
    const int64_t start = len - keep;
    const int64_t count = B * S * D;
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < count;
         e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t d = e % D, i = (e / D) % S, b = e / (S * D);
        if (i < keep) {
            const int64_t s = start + i; /* index into cat(stored, new) */
            if (s < stored) {
                dst.k[e] = src.k[(b * S + s) * D + d];
                dst.v[e] = src.v[(b * S + s) * D + d];
                if (d == 0) dst.real[b * S + i] = src.real[b * S + s];
                if (d == 0 && b == 0) dst.pos[i] = src.pos[s];
            } else {
                const int64_t j = s - stored; /* new row */
                dst.k[e] = kn[(b * n + j) * D + d];
                dst.v[e] = vn[(b * n + j) * D + d];
                if (d == 0) dst.real[b * S + i] = real_in[b * n + j];
                if (d == 0 && b == 0) dst.pos[i] = p0 + j;
            }
        } else if (clear_rest) {
            dst.k[e] = nanf("");
            dst.v[e] = nanf("");
            if (d == 0) dst.real[b * S + i] = 0;
            if (d == 0 && b == 0) dst.pos[i] = -1;
        }
    }
}

/* ---- launch helpers ---- */

static KvStatus cache_put(KvCudaCtx *ctx, KvCudaSlots dst, int64_t S, int64_t W, int64_t n,
                          KvPutMode mode, int64_t fixed_slot, bool fault, KvError *err) {
    KvStatus st = KV_OK;
    const int64_t count = n * ctx->B * ctx->kv_dim;
    KV_LAUNCH(ctx, kv_cache_put_kernel, kv_cuda_blocks(count, KV_CUDA_EW_THREADS),
              KV_CUDA_EW_THREADS, 0, dst, ctx->B, S, W, ctx->kv_dim, ctx->kn, ctx->vn,
              ctx->real_in, n, ctx->total, (int)mode, fixed_slot, fault ? 1 : 0, ctx->dev_err);
cleanup:
    return st;
}

static KvStatus cache_roll(KvCudaCtx *ctx, KvCudaSlots dst, KvCudaSlots src, int64_t W, int64_t n,
                           KvRollMode mode, int64_t host_shift, KvError *err) {
    KvStatus st = KV_OK;
    const int64_t count = ctx->B * W * ctx->kv_dim;
    KV_LAUNCH(ctx, kv_cache_roll_kernel, kv_cuda_blocks(count, KV_CUDA_EW_THREADS),
              KV_CUDA_EW_THREADS, 0, dst, src, ctx->B, W, ctx->kv_dim, (int)mode, host_shift,
              ctx->total, n);
cleanup:
    return st;
}

static KvStatus cache_cat(KvCudaCtx *ctx, KvCudaCache *c, int64_t n, int64_t stored_host,
                          bool clear_rest, KvError *err) {
    KvStatus st = KV_OK;
    const int64_t count = ctx->B * c->slots * ctx->kv_dim;
    KV_LAUNCH(ctx, kv_cache_cat_kernel, kv_cuda_blocks(count, KV_CUDA_EW_THREADS),
              KV_CUDA_EW_THREADS, 0, c->tmp, c->cur, ctx->B, c->slots, c->window, ctx->kv_dim,
              ctx->kn, ctx->vn, ctx->real_in, n, ctx->total, stored_host, clear_rest ? 1 : 0);
cleanup:
    return st;
}

/* The in-place shift of KV_FAULT_INPLACE_SHIFT, with the positions rolled
 * correctly through the temporary. */
static KvStatus cache_shift_inplace(KvCudaCtx *ctx, KvCudaCache *c, int64_t n, KvRollMode mode,
                                    int64_t host_shift, KvError *err) {
    KvStatus st = KV_OK;
    const int64_t W = c->window;
    KV_LAUNCH(ctx, kv_cache_shift_inplace_kernel, (unsigned int)ctx->B, 64, 0, c->cur,
              ctx->B, W, ctx->kv_dim, (int)mode, host_shift, ctx->total, n);
    KV_LAUNCH(ctx, kv_cache_pos_roll_kernel, 1, 256, 0, c->tmp.pos, c->cur.pos, W, (int)mode,
              host_shift, ctx->total, n);
    KV_COPY(ctx, c->cur.pos, c->tmp.pos, (size_t)W * sizeof(int64_t));
cleanup:
    return st;
}

/* KV_FAULT_RACY_SHIFT's shift of slots 0 .. count-1, with the positions
 * rolled correctly through the temporary (cat_shift's pos[W - 1] is the new
 * row's and is written after). */
static KvStatus cache_shift_racy(KvCudaCtx *ctx, KvCudaCache *c, int64_t count, int64_t n,
                                 KvRollMode mode, int64_t host_shift, bool downwards,
                                 KvError *err) {
    KvStatus st = KV_OK;
    const int64_t W = c->window;
    const int64_t elems = ctx->B * count * ctx->kv_dim;
    /* one thread per element, not a grid-stride loop (kv_cuda_blocks caps the
     * grid): every block's place in the walk is its index */
    const int64_t blocks = (elems + KV_RACY_SHIFT_BLOCK - 1) / KV_RACY_SHIFT_BLOCK;
    if (elems == 0) return KV_OK;
    if (blocks > INT_MAX) {
        return kv_error_set(err, KV_ERR_INPUT, "racy_shift: %lld blocks exceed a grid",
                            (long long)blocks);
    }
    KV_LAUNCH(ctx, kv_cache_shift_racy_kernel, (unsigned int)blocks,
              KV_RACY_SHIFT_BLOCK, 0, c->cur, ctx->B, W, ctx->kv_dim, count, (int)mode,
              host_shift, ctx->total, n, downwards ? 1 : 0);
    KV_LAUNCH(ctx, kv_cache_pos_roll_kernel, 1, 256, 0, c->tmp.pos, c->cur.pos, W, (int)mode,
              host_shift, ctx->total, n);
    KV_COPY(ctx, c->cur.pos, c->tmp.pos, (size_t)W * sizeof(int64_t));
cleanup:
    return st;
}

/* cur <- tmp for the first `count` slots of every row (the whole buffers
 * when count == S). A copy, not a pointer swap: a captured graph keeps the
 * buffer addresses it was recorded with. */
static KvStatus cache_commit(KvCudaCtx *ctx, KvCudaCache *c, int64_t count, KvError *err) {
    KvStatus st = KV_OK;
    const int64_t S = c->slots, D = ctx->kv_dim, B = ctx->B;
    if (count <= 0) return KV_OK;
    if (count == S) {
        KV_COPY(ctx, c->cur.k, c->tmp.k, (size_t)(B * S * D) * sizeof(float));
        KV_COPY(ctx, c->cur.v, c->tmp.v, (size_t)(B * S * D) * sizeof(float));
        KV_COPY(ctx, c->cur.real, c->tmp.real, (size_t)(B * S));
    } else {
        /* Rows are S slots apart: a pitched copy of `count` slots per row. */
        const size_t fpitch = (size_t)(S * D) * sizeof(float);
        const size_t fwidth = (size_t)(count * D) * sizeof(float);
        KV_CUDA_CHECK(kv_cuda_timer_begin(ctx));
        KV_CUDA_CHECK(cudaMemcpy2DAsync(c->cur.k, fpitch, c->tmp.k, fpitch, fwidth, (size_t)B,
                                        cudaMemcpyDeviceToDevice, ctx->stream));
        KV_CUDA_CHECK(cudaMemcpy2DAsync(c->cur.v, fpitch, c->tmp.v, fpitch, fwidth, (size_t)B,
                                        cudaMemcpyDeviceToDevice, ctx->stream));
        KV_CUDA_CHECK(cudaMemcpy2DAsync(c->cur.real, (size_t)S, c->tmp.real, (size_t)S,
                                        (size_t)count, (size_t)B, cudaMemcpyDeviceToDevice,
                                        ctx->stream));
        KV_CUDA_CHECK(kv_cuda_timer_end(ctx));
    }
    KV_COPY(ctx, c->cur.pos, c->tmp.pos, (size_t)count * sizeof(int64_t));
cleanup:
    return st;
}

/* ---- the variants ----
 * Each is a GPU form of its candidates/cache_*.c namesake, found through the
 * KvCacheOps the run was given; the order (one_token_order), the host
 * regime (host_branch) and the attended length (host_shape) are read from
 * that table, so the two implementations cannot disagree about them. */

int kv_cuda_cache_regime(const KvCudaCtx *ctx, int64_t layer, int64_t host_total) {
    const KvCudaCache *c = &ctx->caches[layer];
    if (c->window == 0 || ctx->variant == NULL) return 0; /* no variant cache */
    if (!ctx->variant->host_branch) return 0;
    return host_total >= c->window ? 1 : 0;
}

int64_t kv_cuda_cache_n_slots(const KvCudaCtx *ctx, int64_t layer, int64_t n, bool after_update) {
    const KvCudaCache *c = &ctx->caches[layer];
    if (ctx->variant == NULL || c->window == 0) return 0;
    if (!ctx->variant->host_shape) return c->window;
    if (!after_update) return c->filled;
    return c->filled + n < c->slots ? c->filled + n : c->slots;
}

void kv_cuda_cache_advance(KvCudaCtx *ctx, int64_t n) {
    if (ctx->variant == NULL || !ctx->variant->host_shape) return;
    for (int64_t l = 0; l < ctx->n_layers; l++) {
        KvCudaCache *c = &ctx->caches[l];
        if (c->window == 0) continue;
        c->filled = c->filled + n < c->slots ? c->filled + n : c->slots;
    }
}

/* One variant's update of cache c for n new tokens; full: the host regime
 * (host-branch variants); inplace: KV_FAULT_INPLACE_SHIFT planted. */
typedef KvStatus (*CudaCacheUpdate)(KvCudaCtx *ctx, KvCudaCache *c, int64_t n, bool full,
                                    bool inplace, KvError *err);

static KvStatus cuda_update_index_copy(KvCudaCtx *ctx, KvCudaCache *c, int64_t n, bool full,
                                       bool inplace, KvError *err) {
    KvStatus st = KV_OK;
    const int64_t W = c->window, S = c->slots;
    (void)full;
    (void)inplace;
    const bool static_layer = (ctx->faults & KV_FAULT_STATIC_LAYER) != 0;
    KV_LAUNCH(ctx, kv_cache_indices_kernel, 1, 256, 0, c->indices, W, ctx->total, n,
              static_layer ? 1 : 0);
    KV_LAUNCH(ctx, kv_cache_gather_kernel,
              kv_cuda_blocks(ctx->B * W * ctx->kv_dim, KV_CUDA_EW_THREADS), KV_CUDA_EW_THREADS, 0,
              c->tmp, c->cur, c->indices, ctx->B, W, ctx->kv_dim);
    KV_TRY(cache_put(ctx, c->tmp, S, W, n, static_layer ? KV_PUT_CLAMP : KV_PUT_WINDOW_TAIL, 0,
                     (ctx->faults & KV_FAULT_PREFILL_FIRST_W) != 0, err));
    KV_TRY(cache_commit(ctx, c, S, err));
cleanup:
    return st;
}

static KvStatus cuda_update_cat_shift(KvCudaCtx *ctx, KvCudaCache *c, int64_t n, bool full,
                                      bool inplace, KvError *err) {
    KvStatus st = KV_OK;
    const int64_t W = c->window, S = c->slots;
    if (n == 1 && !full) {
        KV_TRY(cache_put(ctx, c->cur, S, W, 1, KV_PUT_WINDOW_TAIL, 0, false, err));
    } else if (n == 1 && (ctx->faults & KV_FAULT_RACY_SHIFT)) {
        /* keys[:, :-1] = keys[:, 1:] in place by unordered blocks walking
         * upwards; slot W-1 then takes the new row. */
        KV_TRY(cache_shift_racy(ctx, c, W - 1, 1, KV_ROLL_HOST, 1 % W, false, err));
        KV_TRY(cache_put(ctx, c->cur, S, W, 1, KV_PUT_FIXED, W - 1, false, err));
    } else if (n == 1 && inplace) {
        /* keys[:, :-1] = keys[:, 1:] with no temporary; slot W-1 then takes
         * the new row. */
        KV_TRY(cache_shift_inplace(ctx, c, 1, KV_ROLL_HOST, 1 % W, err));
        KV_TRY(cache_put(ctx, c->cur, S, W, 1, KV_PUT_FIXED, W - 1, false, err));
    } else if (n == 1) {
        KV_TRY(cache_cat(ctx, c, 1, W, false, err));
        KV_TRY(cache_commit(ctx, c, S, err));
    } else {
        KV_TRY(cache_cat(ctx, c, n, -1, true, err));
        KV_TRY(cache_commit(ctx, c, S, err));
    }
cleanup:
    return st;
}

static KvStatus cuda_update_roll(KvCudaCtx *ctx, KvCudaCache *c, int64_t n, bool full,
                                 bool inplace, KvError *err) {
    KvStatus st = KV_OK;
    const int64_t W = c->window, S = c->slots;
    if (n == 1 && !full) {
        KV_TRY(cache_put(ctx, c->cur, S, W, 1, KV_PUT_WINDOW_TAIL, 0, false, err));
        goto cleanup;
    }
    {
        const KvRollMode mode = n == 1 ? KV_ROLL_HOST : KV_ROLL_SPAN;
        if (inplace) {
            KV_TRY(cache_shift_inplace(ctx, c, n, mode, 1 % W, err));
        } else if (ctx->faults & KV_FAULT_RACY_SHIFT) {
            /* the roll in place by unordered blocks walking downwards */
            KV_TRY(cache_shift_racy(ctx, c, W, n, mode, 1 % W, true, err));
        } else {
            KV_TRY(cache_roll(ctx, c->tmp, c->cur, W, n, mode, 1 % W, err));
            KV_TRY(cache_commit(ctx, c, S, err));
        }
    }
    if (n == 1) {
        KV_TRY(cache_put(ctx, c->cur, S, W, 1, KV_PUT_FIXED, W - 1, false, err));
    } else {
        KV_TRY(cache_put(ctx, c->cur, S, W, n, KV_PUT_WINDOW_TAIL, 0, false, err));
    }
cleanup:
    return st;
}

static KvStatus cuda_update_always_roll(KvCudaCtx *ctx, KvCudaCache *c, int64_t n, bool full,
                                        bool inplace, KvError *err) {
    KvStatus st = KV_OK;
    const int64_t W = c->window, S = c->slots;
    const int64_t m = n < W ? n : W;
    (void)full;
    (void)inplace;
    /* The pre-roll copy is the roll's source: no slot is read after it was
     * written. */
    KV_COPY(ctx, c->tmp.k, c->cur.k, (size_t)(ctx->B * W * ctx->kv_dim) * sizeof(float));
    KV_COPY(ctx, c->tmp.v, c->cur.v, (size_t)(ctx->B * W * ctx->kv_dim) * sizeof(float));
    KV_COPY(ctx, c->tmp.real, c->cur.real, (size_t)(ctx->B * W));
    KV_COPY(ctx, c->tmp.pos, c->cur.pos, (size_t)W * sizeof(int64_t));
    KV_TRY(cache_roll(ctx, c->cur, c->tmp, W, n, KV_ROLL_HOST, m % W, err));
    KV_TRY(cache_put(ctx, c->cur, S, W, n, KV_PUT_RIGHT, 0, false, err));
cleanup:
    return st;
}

static KvStatus cuda_update_ring(KvCudaCtx *ctx, KvCudaCache *c, int64_t n, bool full,
                                 bool inplace, KvError *err) {
    (void)full;
    (void)inplace;
    return cache_put(ctx, c->cur, c->slots, c->window, n, KV_PUT_RING, 0,
                     (ctx->faults & KV_FAULT_RING_SLOT) != 0, err);
}

static KvStatus cuda_update_dynamic(KvCudaCtx *ctx, KvCudaCache *c, int64_t n, bool full,
                                    bool inplace, KvError *err) {
    KvStatus st = KV_OK;
    const int64_t W = c->window, S = c->slots;
    (void)full;
    (void)inplace;
    if (S == 0) goto cleanup; /* W = 1: the window is the new token alone */
    if (n == 1 && c->filled < S) {
        /* Growing: the cat appends one row; nothing stored moves. */
        KV_TRY(cache_put(ctx, c->cur, S, W, 1, KV_PUT_FIXED, c->filled, false, err));
    } else {
        const int64_t keep = c->filled + n < S ? c->filled + n : S;
        KV_TRY(cache_cat(ctx, c, n, c->filled, false, err));
        KV_TRY(cache_commit(ctx, c, keep, err));
    }
cleanup:
    return st;
}

/* The GPU implementation of each CPU variant (cache.h), keyed by its table. */
static const struct {
    const KvCacheOps *ops;
    CudaCacheUpdate update;
} k_cuda_caches[] = {
    {&kv_cache_index_copy, cuda_update_index_copy},
    {&kv_cache_cat_shift, cuda_update_cat_shift},
    {&kv_cache_roll, cuda_update_roll},
    {&kv_cache_always_roll, cuda_update_always_roll},
    {&kv_cache_ring, cuda_update_ring},
    {&kv_cache_dynamic, cuda_update_dynamic},
};

static CudaCacheUpdate cuda_cache_update_of(const KvCacheOps *ops) {
    for (size_t i = 0; i < sizeof k_cuda_caches / sizeof k_cuda_caches[0]; i++) {
        if (k_cuda_caches[i].ops == ops) return k_cuda_caches[i].update;
    }
    return NULL;
}

bool kv_cuda_cache_supports(const KvCacheOps *ops) { return cuda_cache_update_of(ops) != NULL; }

KvStatus kv_cuda_cache_update(KvCudaCtx *ctx, int64_t layer, int64_t n, int64_t host_total,
                              KvError *err) {
    KvCudaCache *c = &ctx->caches[layer];
    const CudaCacheUpdate update = cuda_cache_update_of(ctx->variant);
    if (update == NULL || c->window == 0) {
        return kv_error_set(err, KV_ERR_INTERNAL,
                            "cuda cache update: layer %lld has no variant cache", (long long)layer);
    }
    return update(ctx, c, n, kv_cuda_cache_regime(ctx, layer, host_total) == 1,
                  (ctx->faults & KV_FAULT_INPLACE_SHIFT) != 0, err);
}

extern "C" KvStatus kv_cuda_racy_shift_count(int64_t B, int64_t W, int64_t D, bool downwards,
                                             int64_t *wrong, KvError *err) {
    KvStatus st = KV_OK;
    KvCudaInfo info;
    KvError qerr = {{0}};
    const int64_t count = downwards ? W : W - 1; /* slots moved */
    const int64_t n = B * W * D, elems = B * count * D;
    const int64_t blocks = (elems + KV_RACY_SHIFT_BLOCK - 1) / KV_RACY_SHIFT_BLOCK;
    float *hk = NULL, *hv = NULL; /* (B, W, D) */
    uint8_t *hr = NULL;           /* (B, W) */
    KvCudaSlots dev = {NULL, NULL, NULL, NULL};
    cudaStream_t stream = NULL;
    *wrong = -1;
    /* the values are exact floats: element indices below 2^24 */
    if (B < 1 || W < 2 || D < 1 || n >= (1 << 24) || blocks > INT_MAX) {
        return kv_error_set(err, KV_ERR_INPUT, "racy shift count: B %lld, W %lld, D %lld out of "
                            "range (W >= 2, B * W * D < 2^24)", (long long)B, (long long)W,
                            (long long)D);
    }
    st = kv_cuda_query(&info, &qerr);
    if (st != KV_OK) return kv_error_set(err, KV_SKIP, "CUDA backend unavailable: %s", qerr.msg);
    hk = (float *)malloc((size_t)n * sizeof *hk);
    hv = (float *)malloc((size_t)n * sizeof *hv);
    hr = (uint8_t *)malloc((size_t)(B * W));
    if (hk == NULL || hv == NULL || hr == NULL) {
        st = kv_error_set(err, KV_ERR_INTERNAL, "racy shift count: out of host memory");
        goto cleanup;
    }
    for (int64_t e = 0; e < n; e++) {
        hk[e] = (float)e;
        hv[e] = -(float)e;
    }
    for (int64_t s = 0; s < B * W; s++) hr[s] = (uint8_t)(s % 3 == 0);
    KV_CUDA_CHECK(cudaSetDevice(0));
    KV_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    KV_CUDA_CHECK(cudaMalloc((void **)&dev.k, (size_t)n * sizeof(float)));
    KV_CUDA_CHECK(cudaMalloc((void **)&dev.v, (size_t)n * sizeof(float)));
    KV_CUDA_CHECK(cudaMalloc((void **)&dev.real, (size_t)(B * W)));
    KV_CUDA_CHECK(cudaMemcpyAsync(dev.k, hk, (size_t)n * sizeof(float), cudaMemcpyHostToDevice, stream));
    KV_CUDA_CHECK(cudaMemcpyAsync(dev.v, hv, (size_t)n * sizeof(float), cudaMemcpyHostToDevice, stream));
    KV_CUDA_CHECK(cudaMemcpyAsync(dev.real, hr, (size_t)(B * W), cudaMemcpyHostToDevice, stream));
    kv_cache_shift_racy_kernel<<<(unsigned int)blocks, KV_RACY_SHIFT_BLOCK, 0, stream>>>(
        dev, B, W, D, count, (int)KV_ROLL_HOST, 1, NULL, 1, downwards ? 1 : 0);
    KV_CUDA_CHECK(cudaGetLastError());
    KV_CUDA_CHECK(cudaMemcpyAsync(hk, dev.k, (size_t)n * sizeof(float), cudaMemcpyDeviceToHost, stream));
    KV_CUDA_CHECK(cudaMemcpyAsync(hv, dev.v, (size_t)n * sizeof(float), cudaMemcpyDeviceToHost, stream));
    KV_CUDA_CHECK(cudaMemcpyAsync(hr, dev.real, (size_t)(B * W), cudaMemcpyDeviceToHost, stream));
    KV_CUDA_CHECK(cudaStreamSynchronize(stream));
    *wrong = 0;
    for (int64_t b = 0; b < B; b++) {
        for (int64_t i = 0; i < W; i++) {
            const int64_t from = i < count ? (i + 1) % W : i; /* the right shift's source */
            for (int64_t d = 0; d < D; d++) {
                const float want = (float)((b * W + from) * D + d);
                *wrong += hk[(b * W + i) * D + d] != want;
                *wrong += hv[(b * W + i) * D + d] != -want;
            }
            *wrong += hr[b * W + i] != (uint8_t)((b * W + from) % 3 == 0);
        }
    }
cleanup:
    if (stream != NULL) (void)cudaStreamSynchronize(stream);
    (void)cudaFree(dev.k);
    (void)cudaFree(dev.v);
    (void)cudaFree(dev.real);
    if (stream != NULL) (void)cudaStreamDestroy(stream);
    free(hk);
    free(hv);
    free(hr);
    return st;
}
