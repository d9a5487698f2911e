/* cuda_kernels.cu: the forward pass's kernels and their launchers
 * (cuda_internal.cuh): embedding, RMSNorm, RoPE, static-cache store, key
 * gather, attention, residual add, GeGLU/SwiGLU, softcap, argmax with the
 * position advance, and the FNV-1a probe hashes; plus the cuBLAS matmul.
 *
 * Determinism (DESIGN §2, §4): every output element is written by one thread
 * and every reduction runs in an order fixed by the block size constants and
 * the data's shape (a per-thread strided loop in ascending index, then a
 * fixed shared-memory tree). No floating-point atomics except in the planted
 * KV_FAULT_ATOMIC_REDUCTION path. Integer atomics (error flags, the gather
 * table's atomicMax/atomicMin) give the same value whatever their order.
 * Built with --fmad=false and without fast math, so a * b + c rounds twice
 * as written and expf/tanhf/sinf/cosf are the accurate library versions.
 *
 * Graph rule: everything that changes from one decode step to the next (the
 * position, the tokens, the RoPE positions, the fault clock) is read by the
 * kernels from device memory at execution; kernel arguments hold only
 * pointers and values fixed for a captured step. */
#include "cuda_internal.cuh"

#include <limits.h>
#include <math.h>
#include <stdio.h>

extern "C" {
#include "forward.h"
#include "prng.h"
}

#define KV_FNV_PRIME 0x100000001b3ULL

/* ---- small device helpers ---- */

/* DESIGN §2 (kv_window_visible): k <= q and (window == 0 or q - window < k). */
static __device__ __forceinline__ bool kv_dev_visible(int64_t q, int64_t k, int64_t window) {
    if (k > q) return false;
    return window == 0 || q - window < k;
}

/* Exclusive prefix sum of one int flag per thread over the block (blockDim.x
 * threads, sh holds blockDim.x ints); *total receives the block's sum. Every
 * thread must call it. Integer, so exact in any order. */
static __device__ int kv_dev_block_scan(int flag, int *sh, int *total) {
    const int tid = (int)threadIdx.x;
    sh[tid] = flag;
    __syncthreads();
    for (int off = 1; off < (int)blockDim.x; off <<= 1) {
        const int add = tid >= off ? sh[tid - off] : 0;
        __syncthreads();
        sh[tid] += add;
        __syncthreads();
    }
    const int inclusive = sh[tid];
    *total = sh[blockDim.x - 1];
    __syncthreads(); /* sh is reused by the next call */
    return inclusive - flag;
}

/* ---- errors and timing ---- */

KvStatus kv_cuda_fail_rt(KvError *err, KvStatus st, cudaError_t e, const char *stmt,
                         const char *file, int line) {
    if (err != NULL) {
        snprintf(err->msg, sizeof err->msg, "%s:%d: %s failed: %s: %s", file, line, stmt,
                 cudaGetErrorName(e), cudaGetErrorString(e));
    }
    return st;
}

KvStatus kv_cuda_fail_blas(KvError *err, KvStatus st, cublasStatus_t s, const char *stmt,
                           const char *file, int line) {
    if (err != NULL) {
        snprintf(err->msg, sizeof err->msg, "%s:%d: %s failed: %s: %s", file, line, stmt,
                 cublasGetStatusName(s), cublasGetStatusString(s));
    }
    return st;
}

cudaError_t kv_cuda_timer_begin(KvCudaCtx *ctx) {
    if (!ctx->timing || ctx->n_timed >= ctx->max_timed) return cudaSuccess;
    return cudaEventRecord(ctx->events[2 * ctx->n_timed], ctx->stream);
}

cudaError_t kv_cuda_timer_end(KvCudaCtx *ctx) {
    if (!ctx->timing || ctx->n_timed >= ctx->max_timed) return cudaSuccess;
    cudaError_t e = cudaEventRecord(ctx->events[2 * ctx->n_timed + 1], ctx->stream);
    ctx->n_timed++;
    return e;
}

/* ---- matmul ---- */

KvStatus kv_cuda_gemm(KvCudaCtx *ctx, const float *x, const float *w, float *y, int64_t rows,
                      int64_t in, int64_t out, KvError *err) {
    KvStatus st = KV_OK;
    if (rows > INT_MAX || in > INT_MAX || out > INT_MAX) {
        return kv_error_set(err, KV_ERR_INPUT,
                            "cuda gemm: (%lld x %lld) x (%lld x %lld)^T exceeds cuBLAS's int sizes",
                            (long long)rows, (long long)in, (long long)out, (long long)in);
    }
    /* Row-major y (rows, out) = x (rows, in) W^T is column-major
     * y^T (out, rows) = W (out, in) x^T: W's row-major storage is W^T in
     * column-major (in x out, ld in), hence op T on it; x's is x^T (in x
     * rows, ld in), op N. alpha and beta live in device memory (pointer
     * mode device), as a captured graph reads them. */
    KV_CUDA_CHECK(kv_cuda_timer_begin(ctx));
    KV_CUBLAS_CHECK(cublasSgemm(ctx->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)out, (int)rows, (int)in,
                                ctx->one, w, (int)in, x, (int)in, ctx->zero, y, (int)out));
    KV_CUDA_CHECK(kv_cuda_timer_end(ctx));
cleanup:
    return st;
}

KvStatus kv_cuda_fill(KvCudaCtx *ctx, void *p, int byte, size_t bytes, KvError *err) {
    KvStatus st = KV_OK;
    KV_CUDA_CHECK(kv_cuda_timer_begin(ctx));
    KV_CUDA_CHECK(cudaMemsetAsync(p, byte, bytes, ctx->stream));
    KV_CUDA_CHECK(kv_cuda_timer_end(ctx));
cleanup:
    return st;
}

/* ---- positions ---- */

/* One block. Per new token: whether its slot is real, and its RoPE position
 * (real tokens before it in the row; pads get 0), exactly as op_positions.
 * stale_len >= 0 plants KV_FAULT_STALE_SCALAR: the position comes from this
 * argument (frozen at capture) instead of memory. The fault clock ticks once
 * per forward (integer, never snapshotted). */
static __global__ void kv_positions_kernel(const uint8_t *__restrict__ real_in /* (B, n) */,
                                    uint8_t *__restrict__ real /* (B, max_len) */,
                                    int64_t *__restrict__ n_real /* (B) */,
                                    int64_t *__restrict__ qpos /* (B, n) */,
                                    int64_t *__restrict__ total /* (1) */, int64_t B, int64_t n,
                                    int64_t max_len, int64_t stale_len,
                                    uint64_t *__restrict__ fault_clock /* (1) */,
                                    int32_t *__restrict__ dev_err /* (1) */) {
    if (stale_len >= 0) { /* uniform across the block */
        if (threadIdx.x == 0) *total = stale_len;
        __syncthreads();
    }
    const int64_t len = *total;
    if (threadIdx.x == 0) *fault_clock += 1;
    for (int64_t b = threadIdx.x; b < B; b += blockDim.x) {
        int64_t seen = n_real[b];
        for (int64_t t = 0; t < n; t++) {
            const int64_t r = b * n + t;
            const uint8_t is_real = real_in[r] ? 1 : 0;
            if (len + t < 0 || len + t >= max_len) {
                atomicOr(dev_err, KV_CUDA_DERR_SLOT);
                qpos[r] = 0;
                continue;
            }
            real[b * max_len + len + t] = is_real;
            qpos[r] = is_real ? seen++ : 0;
        }
        n_real[b] = seen;
    }
}

KvStatus kv_cuda_positions(KvCudaCtx *ctx, int64_t n, KvError *err) {
    KvStatus st = KV_OK;
    const int64_t stale = (ctx->faults & KV_FAULT_STALE_SCALAR) ? ctx->len : -1;
    KV_LAUNCH(ctx, kv_positions_kernel, 1, 64, 0, ctx->real_in, ctx->real, ctx->n_real, ctx->qpos,
              ctx->total, ctx->B, n, ctx->max_len, stale, ctx->fault_clock, ctx->dev_err);
cleanup:
    return st;
}

/* ---- embedding ---- */

/* x[r, :] = embed[tok[r], :] (gemma2: times sqrt(hidden) rounded to F32). A
 * token outside the vocabulary gives NaN and a device error flag rather
 * than an out-of-bounds read. */
static __global__ void kv_embed_kernel(const int32_t *__restrict__ tok /* (rows) */,
                                const float *__restrict__ embed /* (vocab, hidden) */,
                                float *__restrict__ x /* (rows, hidden) */, int64_t rows,
                                int64_t hidden, int64_t vocab, int gemma, float scale,
                                int32_t *__restrict__ dev_err) {
    const int64_t count = rows * hidden;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < count;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = i / hidden, d = i % hidden;
        const int32_t t = tok[r];
        if (t < 0 || t >= vocab) {
            if (d == 0) atomicOr(dev_err, KV_CUDA_DERR_TOKEN);
            x[i] = nanf("");
            continue;
        }
        const float e = embed[(int64_t)t * hidden + d];
        x[i] = gemma ? e * scale : e;
    }
}

KvStatus kv_cuda_embed(KvCudaCtx *ctx, int64_t n, KvError *err) {
    KvStatus st = KV_OK;
    const int64_t rows = ctx->B * n;
    KV_LAUNCH(ctx, kv_embed_kernel, kv_cuda_blocks(rows * ctx->hidden, KV_CUDA_EW_THREADS),
              KV_CUDA_EW_THREADS, 0, ctx->tok_in, ctx->w_embed, ctx->x, rows, ctx->hidden,
              ctx->vocab, ctx->gemma ? 1 : 0, ctx->embed_scale, ctx->dev_err);
cleanup:
    return st;
}

/* ---- RMSNorm ---- */

/* One block of KV_CUDA_NORM_THREADS per row: thread t sums x[i]^2 for
 * i = t, t + T, ... ascending, then a fixed tree; mean = sum / n in F32,
 * r = 1 / sqrtf(mean + eps) (IEEE division and square root without fast
 * math). gemma2: x * r * (1 + w); mistral: w * (x * r). out may equal in:
 * each element is read and written by the same thread after the reduction. */
static __global__ void kv_rmsnorm_kernel(const float *in /* (rows, in_stride) */, int64_t in_stride,
                                  const float *__restrict__ w /* (n) */,
                                  float *out /* (rows, out_stride) */, int64_t out_stride,
                                  int64_t n, float eps, int offset) {
    __shared__ float red[KV_CUDA_NORM_THREADS];
    const float *x = in + blockIdx.x * in_stride;
    float *y = out + blockIdx.x * out_stride;
    float acc = 0.0f;
    for (int64_t i = threadIdx.x; i < n; i += KV_CUDA_NORM_THREADS) acc = acc + x[i] * x[i];
    red[threadIdx.x] = acc;
    __syncthreads();
    for (int off = KV_CUDA_NORM_THREADS / 2; off > 0; off >>= 1) {
        if ((int)threadIdx.x < off) red[threadIdx.x] = red[threadIdx.x] + red[threadIdx.x + off];
        __syncthreads();
    }
    const float mean = red[0] / (float)n;
    const float r = 1.0f / sqrtf(mean + eps);
    for (int64_t i = threadIdx.x; i < n; i += KV_CUDA_NORM_THREADS) {
        const float xn = x[i] * r;
        y[i] = offset ? xn * (1.0f + w[i]) : w[i] * xn;
    }
}

KvStatus kv_cuda_rmsnorm(KvCudaCtx *ctx, const float *in, int64_t in_stride, const float *w,
                         float *out, int64_t out_stride, int64_t rows, KvError *err) {
    KvStatus st = KV_OK;
    KV_LAUNCH(ctx, kv_rmsnorm_kernel, (unsigned int)rows, KV_CUDA_NORM_THREADS, 0, in, in_stride,
              w, out, out_stride, ctx->hidden, ctx->eps, ctx->gemma ? 1 : 0);
cleanup:
    return st;
}

KvStatus kv_cuda_rmsnorm_heads(KvCudaCtx *ctx, float *x, const float *w, int64_t rows,
                               int64_t width, KvError *err) {
    KvStatus st = KV_OK;
    /* each block reads its row whole before it writes it: in place is safe */
    KV_LAUNCH(ctx, kv_rmsnorm_kernel, (unsigned int)rows, KV_CUDA_NORM_THREADS, 0, x, width, w, x,
              width, width, ctx->eps, 1);
cleanup:
    return st;
}

/* ---- RoPE ---- */

/* kv_rope_apply on every head of q and of the new keys: non-interleaved
 * (rotate_half), angle = (float)pos * inv_freq[i] in F32. */
static __global__ void kv_rope_kernel(float *__restrict__ q /* (rows, n_heads * hd) */,
                               float *__restrict__ k /* (rows, n_kv_heads * hd) */,
                               const int64_t *__restrict__ qpos /* (rows) */,
                               const float *__restrict__ inv_freq /* (hd / 2) */, int64_t rows,
                               int64_t n_heads, int64_t n_kv_heads, int64_t hd,
                               float rope_scale) {
    const int64_t half = hd / 2;
    const int64_t heads = n_heads + n_kv_heads;
    const int64_t count = rows * heads * half;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < count;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = i / (heads * half);
        const int64_t h = (i / half) % heads;
        const int64_t j = i % half;
        float *x = h < n_heads ? q + (r * n_heads + h) * hd : k + (r * n_kv_heads + h - n_heads) * hd;
        const float angle = (float)qpos[r] * inv_freq[j];
        /* YaRN's attention factor on cos and sin (x 1 is exact) */
        const float c = cosf(angle) * rope_scale;
        const float s = sinf(angle) * rope_scale;
        const float a = x[j];
        const float b = x[j + half];
        x[j] = a * c - b * s;
        x[j + half] = b * c + a * s;
    }
}

KvStatus kv_cuda_rope(KvCudaCtx *ctx, int64_t n, int64_t layer, KvError *err) {
    KvStatus st = KV_OK;
    const int64_t rows = ctx->B * n;
    const int64_t count = rows * (ctx->n_heads + ctx->n_kv_heads) * (ctx->hd / 2);
    const bool sliding = layer >= 0 && layer < ctx->n_layers && ctx->c->layer_sliding[layer];
    const float *inv_freq = ctx->inv_freq + (sliding ? ctx->hd / 2 : 0);
    KV_LAUNCH(ctx, kv_rope_kernel, kv_cuda_blocks(count, KV_CUDA_EW_THREADS), KV_CUDA_EW_THREADS,
              0, ctx->q, ctx->kn, ctx->qpos, inv_freq, rows, ctx->n_heads, ctx->n_kv_heads,
              ctx->hd, ctx->rope_scale);
cleanup:
    return st;
}

/* ---- static cache ---- */

/* Static cache: the new K/V rows at slot = position (*total + t), pads too
 * (their slots are never visible: real = 0). */
static __global__ void kv_store_static_kernel(float *__restrict__ kc /* (B, max_len, kv_dim) */,
                                       float *__restrict__ vc /* (B, max_len, kv_dim) */,
                                       const float *__restrict__ kn /* (B, n, kv_dim) */,
                                       const float *__restrict__ vn /* (B, n, kv_dim) */,
                                       const int64_t *__restrict__ total, int64_t B, int64_t n,
                                       int64_t max_len, int64_t kv_dim,
                                       int32_t *__restrict__ dev_err) {
    const int64_t len = *total;
    const int64_t count = B * n * kv_dim;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < count;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t e = i % kv_dim, bt = i / kv_dim;
        const int64_t t = bt % n, b = bt / n;
        const int64_t slot = len + t;
        if (slot < 0 || slot >= max_len) {
            if (e == 0) atomicOr(dev_err, KV_CUDA_DERR_SLOT);
            continue;
        }
        kc[(b * max_len + slot) * kv_dim + e] = kn[i];
        vc[(b * max_len + slot) * kv_dim + e] = vn[i];
    }
}

KvStatus kv_cuda_store_static(KvCudaCtx *ctx, int64_t layer, int64_t n, KvError *err) {
    KvStatus st = KV_OK;
    const int64_t count = ctx->B * n * ctx->kv_dim;
    KV_LAUNCH(ctx, kv_store_static_kernel, kv_cuda_blocks(count, KV_CUDA_EW_THREADS),
              KV_CUDA_EW_THREADS, 0, ctx->kc[layer], ctx->vc[layer], ctx->kn, ctx->vn, ctx->total,
              ctx->B, n, ctx->max_len, ctx->kv_dim, ctx->dev_err);
cleanup:
    return st;
}

/* ---- key gather: the canonical key order (DESIGN §2) ---- */

/* The mask window: W, or W + 1 under KV_FAULT_WINDOW_OFF_BY_ONE (admits
 * q - W <= k); full layers (0) stay full. */
static int64_t kv_cuda_mask_window(const KvCudaCtx *ctx, int64_t layer) {
    const int64_t w = kv_config_layer_window(ctx->c, layer);
    return w > 0 && (ctx->faults & KV_FAULT_WINDOW_OFF_BY_ONE) ? w + 1 : w;
}

/* Static cache, one block per query row r = b * n + t at slot qs = *total + t:
 * the real slots k in (qs - window, qs] in ascending slot order, which is
 * ascending position; compacted with a block scan (integer, exact). A pad
 * query gets no keys (its output is 0 and never used), as op_attn_static. */
static __global__ void kv_gather_static_kernel(const uint8_t *__restrict__ real /* (B, max_len) */,
                                        const int64_t *__restrict__ total, int64_t n,
                                        int64_t max_len, int64_t window,
                                        int32_t *__restrict__ gidx /* (rows, max_keys) */,
                                        int32_t *__restrict__ nkeys /* (rows) */,
                                        int64_t max_keys, int32_t *__restrict__ dev_err) {
    __shared__ int sh[KV_CUDA_GATHER_THREADS];
    const int64_t r = blockIdx.x;
    const int64_t b = r / n, t = r % n;
    const int64_t qs = *total + t;
    if (qs < 0 || qs >= max_len) { /* uniform across the block */
        if (threadIdx.x == 0) {
            atomicOr(dev_err, KV_CUDA_DERR_SLOT);
            nkeys[r] = 0;
        }
        return;
    }
    if (!real[b * max_len + qs]) {
        if (threadIdx.x == 0) nkeys[r] = 0;
        return;
    }
    int64_t lo = window > 0 ? qs - window + 1 : 0;
    if (lo < 0) lo = 0;
    int64_t count = 0;
    for (int64_t base = lo; base <= qs; base += KV_CUDA_GATHER_THREADS) {
        const int64_t k = base + threadIdx.x;
        const int flag = k <= qs && real[b * max_len + k] ? 1 : 0;
        int tot = 0;
        const int excl = kv_dev_block_scan(flag, sh, &tot);
        if (flag) {
            const int64_t at = count + excl;
            if (at < max_keys) {
                gidx[r * max_keys + at] = (int32_t)k;
            } else {
                atomicOr(dev_err, KV_CUDA_DERR_KEYS);
            }
        }
        count += tot;
    }
    if (threadIdx.x == 0) nkeys[r] = (int32_t)(count < max_keys ? count : max_keys);
}

KvStatus kv_cuda_gather_static(KvCudaCtx *ctx, int64_t layer, int64_t n, KvError *err) {
    KvStatus st = KV_OK;
    KV_LAUNCH(ctx, kv_gather_static_kernel, (unsigned int)(ctx->B * n), KV_CUDA_GATHER_THREADS, 0,
              ctx->real, ctx->total, n, ctx->max_len, kv_cuda_mask_window(ctx, layer), ctx->gidx,
              ctx->nkeys, ctx->max_keys, ctx->dev_err);
cleanup:
    return st;
}

/* A variant's view (n_slots slots whose positions may come in any order:
 * ring, always_roll) plus, when include_new, the row's new keys u <= t.
 * Slot i's position is the variant's layout rule (layout.h) with the
 * positions stored so far (*total, plus n when the update ran first), as an
 * engine's kernel derives it: the recorded pos[] is not read here.
 * Visible positions lie in (qs - window, qs], so each has a unique entry
 * p - (qs - window + 1) in a table of `window` entries: candidates are
 * dropped into it (atomicMax: the same winner whatever the order, should a
 * broken cache hold a position twice; a slot code >= 0 beats a new-key code
 * < 0), then the table is compacted in ascending position. The order never
 * depends on the slot that holds a key.
 * unwritten (KV_FAULT_UNWRITTEN_SLOT): empty slots (position -1) are
 * gathered too, first and in slot order, as op_attn_variant's sort puts
 * them. */
static __global__ void kv_gather_variant_kernel(int rule, int64_t cache_w,
                                         const uint8_t *__restrict__ sreal /* (B, S) */,
                                         int64_t S, int64_t n_slots,
                                         const uint8_t *__restrict__ real_in /* (B, n) */,
                                         const int64_t *__restrict__ total, int64_t n,
                                         int64_t window, int include_new, int unwritten,
                                         int32_t *__restrict__ gtab /* (rows, tab_w) */,
                                         int64_t tab_w,
                                         int32_t *__restrict__ gidx /* (rows, max_keys) */,
                                         int32_t *__restrict__ nkeys /* (rows) */,
                                         int64_t max_keys, int32_t *__restrict__ dev_err) {
    __shared__ int sh[KV_CUDA_GATHER_THREADS];
    const int64_t r = blockIdx.x;
    const int64_t b = r / n, t = r % n;
    const int64_t len = *total;
    const int64_t qs = len + t;
    const int64_t stored = include_new ? len : len + n;
    if (!real_in[r] || window > tab_w) { /* uniform across the block */
        if (threadIdx.x == 0) {
            if (window > tab_w) atomicOr(dev_err, KV_CUDA_DERR_KEYS);
            nkeys[r] = 0;
        }
        return;
    }
    int64_t count = 0;
    if (unwritten) {
        for (int64_t base = 0; base < n_slots; base += KV_CUDA_GATHER_THREADS) {
            const int64_t i = base + threadIdx.x;
            const int flag =
                i < n_slots && kv_layout_position((KvLayoutRule)rule, cache_w, i, stored) < 0 ? 1 : 0;
            int tot = 0;
            const int excl = kv_dev_block_scan(flag, sh, &tot);
            if (flag) {
                const int64_t at = count + excl;
                if (at < max_keys) {
                    gidx[r * max_keys + at] = (int32_t)i;
                } else {
                    atomicOr(dev_err, KV_CUDA_DERR_KEYS);
                }
            }
            count += tot;
        }
    }
    int32_t *tab = gtab + r * tab_w; /* (window) used of (tab_w) */
    const int64_t lo = qs - window + 1;
    for (int64_t i = threadIdx.x; i < window; i += blockDim.x) tab[i] = INT_MIN;
    __syncthreads();
    for (int64_t i = threadIdx.x; i < n_slots; i += blockDim.x) {
        const int64_t p = kv_layout_position((KvLayoutRule)rule, cache_w, i, stored);
        if (p < 0 || !sreal[b * S + i] || !kv_dev_visible(qs, p, window)) continue;
        atomicMax(&tab[p - lo], (int)i);
    }
    if (include_new) {
        for (int64_t u = threadIdx.x; u <= t; u += blockDim.x) {
            const int64_t p = len + u;
            if (!real_in[b * n + u] || !kv_dev_visible(qs, p, window)) continue;
            atomicMax(&tab[p - lo], -(int)(u + 1));
        }
    }
    __syncthreads(); /* the table's global writes are visible block-wide after this */
    for (int64_t base = 0; base < window; base += KV_CUDA_GATHER_THREADS) {
        const int64_t i = base + threadIdx.x;
        const int code = i < window ? tab[i] : INT_MIN;
        const int flag = code != INT_MIN ? 1 : 0;
        int tot = 0;
        const int excl = kv_dev_block_scan(flag, sh, &tot);
        if (flag) {
            const int64_t at = count + excl;
            if (at < max_keys) {
                gidx[r * max_keys + at] = code;
            } else {
                atomicOr(dev_err, KV_CUDA_DERR_KEYS);
            }
        }
        count += tot;
    }
    if (threadIdx.x == 0) nkeys[r] = (int32_t)(count < max_keys ? count : max_keys);
}

KvStatus kv_cuda_gather_variant(KvCudaCtx *ctx, int64_t layer, int64_t n, int64_t n_slots,
                                bool include_new, KvError *err) {
    KvStatus st = KV_OK;
    const KvCudaCache *c = &ctx->caches[layer];
    KV_LAUNCH(ctx, kv_gather_variant_kernel, (unsigned int)(ctx->B * n), KV_CUDA_GATHER_THREADS, 0,
              (int)ctx->variant->layout, c->window, c->cur.real, c->slots, n_slots, ctx->real_in,
              ctx->total, n,
              kv_cuda_mask_window(ctx, layer), include_new ? 1 : 0,
              (ctx->faults & KV_FAULT_UNWRITTEN_SLOT) ? 1 : 0, ctx->gtab, ctx->window + 1,
              ctx->gidx, ctx->nkeys, ctx->max_keys, ctx->dev_err);
cleanup:
    return st;
}

/* ---- attention ---- */

/* Key row of gathered code `code` for row b: a cache slot (>= 0) or a new
 * token -(code + 1) of this forward. */
static __device__ __forceinline__ const float *kv_dev_key_row(int32_t code, const float *cache,
                                                       const float *fresh, int64_t b,
                                                       int64_t row_stride, int64_t n,
                                                       int64_t kv_dim) {
    if (code >= 0) return cache + (b * row_stride + code) * kv_dim;
    return fresh + (b * n + (-(int64_t)code - 1)) * kv_dim;
}

/* s_j = softcap(dot(q, k_j) * scale, cap), the dot in ascending d. The same
 * instructions every time it is called, so recomputing a score gives the
 * same bits. */
static __device__ __forceinline__ float kv_dev_score(const float *qh /* (hd) shared */,
                                              const float *k /* (hd) */, int64_t hd, float scale,
                                              float cap) {
    float dot = 0.0f;
    for (int64_t d = 0; d < hd; d++) dot = dot + qh[d] * k[d];
    float s = dot * scale;
    if (cap > 0.0f) s = tanhf(s / cap) * cap;
    return s;
}

/* One block of KV_CUDA_ATTN_THREADS per (query row r, head h), over the
 * row's gathered keys j = 0 .. nk-1 (ascending position):
 *   pass 1: mx = max_j s_j (exact in any order);
 *   pass 2: sum = sum_j expf(s_j - mx): thread-strided partials in ascending
 *           j, then a fixed tree;
 *   pass 3: in tiles of T keys, p_j = expf(s_j - mx) / sum into shared
 *           memory, then out[d] += p_j * v_j[d] in ascending j, one thread
 *           per d, as kv_attend accumulates.
 * Scores are recomputed per pass instead of stored, so no scratch grows with
 * the context. nk == 0 (a pad query) gives 0.
 * clock (KV_FAULT_ATOMIC_REDUCTION, else NULL): pass 3 adds the tile's terms
 * with shared-memory float atomics from a thread order rotated by the fault
 * clock, so the summation order follows execution, never the data. */
static __global__ void kv_attend_kernel(const float *__restrict__ q /* (rows, n_heads * hd) */,
                                 const float *__restrict__ kbase /* (B, row_stride, kv_dim) */,
                                 const float *__restrict__ vbase /* (B, row_stride, kv_dim) */,
                                 int64_t row_stride,
                                 const float *__restrict__ kn /* (rows, kv_dim) */,
                                 const float *__restrict__ vn /* (rows, kv_dim) */,
                                 const int32_t *__restrict__ gidx /* (rows, max_keys) */,
                                 const int32_t *__restrict__ nkeys /* (rows) */,
                                 int64_t max_keys, float *__restrict__ out /* (rows, n_heads*hd) */,
                                 int64_t n, int64_t n_heads, int64_t n_kv_heads, int64_t hd,
                                 float scale, float cap,
                                 const uint64_t *__restrict__ clock /* (1) or NULL */,
                                 int64_t layer,
                                 const float *__restrict__ sinks /* (n_heads) or NULL */) {
    extern __shared__ float smem[]; /* qh (hd), acc (hd), red (T), pt (T) */
    __shared__ const float *vrow[KV_CUDA_ATTN_THREADS];
    float *qh = smem;
    float *acc = qh + hd;
    float *red = acc + hd;
    float *pt = red + KV_CUDA_ATTN_THREADS;
    const int tid = (int)threadIdx.x;
    const int64_t r = blockIdx.x / n_heads, h = blockIdx.x % n_heads;
    const int64_t b = r / n;
    const int64_t kv_dim = n_kv_heads * hd;
    const int64_t kvh = h / (n_heads / n_kv_heads); /* transformers' repeat_kv */
    const int32_t *codes = gidx + r * max_keys;
    const int64_t nk = nkeys[r];

    for (int64_t d = tid; d < hd; d += KV_CUDA_ATTN_THREADS) {
        qh[d] = q[(r * n_heads + h) * hd + d];
        acc[d] = 0.0f;
    }
    __syncthreads();

    float mx = -INFINITY;
    for (int64_t j = tid; j < nk; j += KV_CUDA_ATTN_THREADS) {
        const float *k = kv_dev_key_row(codes[j], kbase, kn, b, row_stride, n, kv_dim) + kvh * hd;
        const float s = kv_dev_score(qh, k, hd, scale, cap);
        mx = s > mx ? s : mx;
    }
    red[tid] = mx;
    __syncthreads();
    for (int off = KV_CUDA_ATTN_THREADS / 2; off > 0; off >>= 1) {
        if (tid < off) red[tid] = red[tid + off] > red[tid] ? red[tid + off] : red[tid];
        __syncthreads();
    }
    mx = red[0];
    /* gpt_oss: the sink joins the max (kv_attend_sink) */
    if (sinks != NULL) mx = sinks[h] > mx ? sinks[h] : mx;
    __syncthreads();

    float sum = 0.0f;
    for (int64_t j = tid; j < nk; j += KV_CUDA_ATTN_THREADS) {
        const float *k = kv_dev_key_row(codes[j], kbase, kn, b, row_stride, n, kv_dim) + kvh * hd;
        sum = sum + expf(kv_dev_score(qh, k, hd, scale, cap) - mx);
    }
    red[tid] = sum;
    __syncthreads();
    for (int off = KV_CUDA_ATTN_THREADS / 2; off > 0; off >>= 1) {
        if (tid < off) red[tid] = red[tid] + red[tid + off];
        __syncthreads();
    }
    sum = red[0];
    /* ... and the sum, after the keys; its share is dropped */
    if (sinks != NULL) sum = sum + expf(sinks[h] - mx);
    __syncthreads();

    for (int64_t j0 = 0; j0 < nk; j0 += KV_CUDA_ATTN_THREADS) {
        const int64_t j = j0 + tid;
        if (j < nk) {
            const int32_t code = codes[j];
            const float *k = kv_dev_key_row(code, kbase, kn, b, row_stride, n, kv_dim) + kvh * hd;
            pt[tid] = expf(kv_dev_score(qh, k, hd, scale, cap) - mx) / sum;
            vrow[tid] = kv_dev_key_row(code, vbase, vn, b, row_stride, n, kv_dim) + kvh * hd;
        }
        __syncthreads();
        const int64_t cnt = nk - j0 < KV_CUDA_ATTN_THREADS ? nk - j0 : KV_CUDA_ATTN_THREADS;
        if (clock == NULL) {
            for (int64_t d = tid; d < hd; d += KV_CUDA_ATTN_THREADS) {
                float a = acc[d];
                for (int64_t jj = 0; jj < cnt; jj++) a = a + pt[jj] * vrow[jj][d];
                acc[d] = a;
            }
        } else if (tid < cnt) {
            /* Planted KV_FAULT_ATOMIC_REDUCTION: float atomics, order by timing. */
            const int64_t jj = (tid + (int64_t)((*clock + (uint64_t)layer) % (uint64_t)cnt)) % cnt;
            for (int64_t d = 0; d < hd; d++) atomicAdd(&acc[d], pt[jj] * vrow[jj][d]);
        }
        __syncthreads();
    }
    for (int64_t d = tid; d < hd; d += KV_CUDA_ATTN_THREADS) out[(r * n_heads + h) * hd + d] = acc[d];
}

KvStatus kv_cuda_attend(KvCudaCtx *ctx, int64_t layer, int64_t n, const float *kbase,
                        const float *vbase, int64_t row_stride, KvError *err) {
    KvStatus st = KV_OK;
    const size_t smem = (size_t)(2 * ctx->hd + 2 * KV_CUDA_ATTN_THREADS) * sizeof(float);
    const uint64_t *clock = (ctx->faults & KV_FAULT_ATOMIC_REDUCTION) ? ctx->fault_clock : NULL;
    KV_LAUNCH(ctx, kv_attend_kernel, (unsigned int)(ctx->B * n * ctx->n_heads),
              KV_CUDA_ATTN_THREADS, smem, ctx->q, kbase, vbase, row_stride, ctx->kn, ctx->vn,
              ctx->gidx, ctx->nkeys, ctx->max_keys, ctx->att, n, ctx->n_heads, ctx->n_kv_heads,
              ctx->hd, ctx->scale, ctx->attn_cap, clock, layer, ctx->layers[layer].sinks);
cleanup:
    return st;
}

/* ---- elementwise ---- */

static __global__ void kv_add_kernel(float *__restrict__ x /* (count) */,
                              const float *__restrict__ y /* (count) */, int64_t count) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < count;
         i += (int64_t)gridDim.x * blockDim.x) {
        x[i] = x[i] + y[i];
    }
}

KvStatus kv_cuda_add(KvCudaCtx *ctx, float *x, const float *y, int64_t count, KvError *err) {
    KvStatus st = KV_OK;
    KV_LAUNCH(ctx, kv_add_kernel, kv_cuda_blocks(count, KV_CUDA_EW_THREADS), KV_CUDA_EW_THREADS, 0,
              x, y, count);
cleanup:
    return st;
}

static __global__ void kv_bias_rows_kernel(float *__restrict__ y /* (rows, out) */,
                                           const float *__restrict__ b /* (out) */,
                                           int64_t count, int64_t out) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < count;
         i += (int64_t)gridDim.x * blockDim.x) {
        y[i] = y[i] + b[i % out];
    }
}

KvStatus kv_cuda_bias_rows(KvCudaCtx *ctx, float *y, const float *b, int64_t rows, int64_t out,
                           KvError *err) {
    KvStatus st = KV_OK;
    const int64_t count = rows * out;
    KV_LAUNCH(ctx, kv_bias_rows_kernel, kv_cuda_blocks(count, KV_CUDA_EW_THREADS),
              KV_CUDA_EW_THREADS, 0, y, b, count, out);
cleanup:
    return st;
}

/* ---- gpt_oss's MoE block ---- */

/* One thread per row: the top K router logits (ties to the lowest id),
 * their softmax in F32 summed in rank order (kv_softmax), into
 * weight/chosen (rows, E); acc (rows, hidden) zeroed. */
static __global__ void kv_moe_route_kernel(const float *__restrict__ logits /* (rows, E) */,
                                           float *__restrict__ weight /* (rows, E) */,
                                           uint8_t *__restrict__ chosen /* (rows, E) */,
                                           float *__restrict__ acc /* (rows, hidden) */,
                                           int64_t rows, int64_t E, int64_t K, int64_t hidden) {
    const int64_t r = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (r >= rows) return;
    const float *lg = logits + r * E;
    uint8_t *ch = chosen + r * E;
    float *wt = weight + r * E;
    for (int64_t e = 0; e < E; e++) ch[e] = 0;
    for (int64_t i = 0; i < hidden; i++) acc[r * hidden + i] = 0.0f;
    /* pass 1: the picks, by descending logit; the top value is the max */
    float mx = -INFINITY;
    for (int64_t k = 0; k < K; k++) {
        int64_t best = -1;
        for (int64_t e = 0; e < E; e++) {
            if (!ch[e] && (best < 0 || lg[e] > lg[best])) best = e;
        }
        ch[best] = (uint8_t)(k + 1); /* rank + 1 */
        mx = k == 0 ? lg[best] : mx;
    }
    /* pass 2: exponentials and their sum in rank order */
    float sum = 0.0f;
    for (int64_t k = 1; k <= K; k++) {
        for (int64_t e = 0; e < E; e++) {
            if (ch[e] == (uint8_t)k) {
                wt[e] = expf(lg[e] - mx);
                sum = sum + wt[e];
            }
        }
    }
    for (int64_t e = 0; e < E; e++) {
        if (ch[e]) wt[e] = wt[e] / sum;
    }
}

/* h = (up + 1) * gate * sigmoid(alpha * gate) from one expert's
 * interleaved gu (rows, 2I) plus its bias: gate = even column, up = odd,
 * gate clamped above at limit, up to [-limit, limit] (op_moe's order). */
static __global__ void kv_moe_glu_kernel(const float *__restrict__ gu /* (rows, 2I) */,
                                         const float *__restrict__ b /* (2I) */,
                                         float *__restrict__ h /* (rows, I) */, int64_t rows,
                                         int64_t I, float limit, float alpha) {
    const int64_t count = rows * I;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < count;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = i / I, j = i % I;
        float gate = gu[r * 2 * I + 2 * j] + b[2 * j];
        float up = gu[r * 2 * I + 2 * j + 1] + b[2 * j + 1];
        gate = gate > limit ? limit : gate;
        up = up > limit ? limit : (up < -limit ? -limit : up);
        const float glu = gate * (1.0f / (1.0f + expf(-(gate * alpha))));
        h[i] = (up + 1.0f) * glu;
    }
}

/* acc[r, :] = acc[r, :] + (out[r, :] + b) * weight[r, e] where row r chose
 * expert e (experts taken in ascending id by the caller). */
static __global__ void kv_moe_accumulate_kernel(float *__restrict__ acc /* (rows, hidden) */,
                                                const float *__restrict__ out /* (rows, hidden) */,
                                                const float *__restrict__ b /* (hidden) */,
                                                const float *__restrict__ weight /* (rows, E) */,
                                                const uint8_t *__restrict__ chosen /* (rows, E) */,
                                                int64_t rows, int64_t hidden, int64_t E,
                                                int64_t e) {
    const int64_t count = rows * hidden;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < count;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = i / hidden;
        if (!chosen[r * E + e]) continue;
        acc[i] = acc[i] + (out[i] + b[i % hidden]) * weight[r * E + e];
    }
}

KvStatus kv_cuda_moe(KvCudaCtx *ctx, const KvCudaLayer *w, int64_t rows, KvError *err) {
    KvStatus st = KV_OK;
    const int64_t H = ctx->hidden, I = ctx->inter, E = ctx->n_experts;
    KV_TRY(kv_cuda_gemm(ctx, ctx->xn, w->router_w, ctx->moe_logits, rows, H, E, err));
    KV_TRY(kv_cuda_bias_rows(ctx, ctx->moe_logits, w->router_b, rows, E, err));
    KV_LAUNCH(ctx, kv_moe_route_kernel, kv_cuda_blocks(rows, KV_CUDA_EW_THREADS),
              KV_CUDA_EW_THREADS, 0, ctx->moe_logits, ctx->moe_weight, ctx->moe_chosen, ctx->tmp,
              rows, E, ctx->experts_per_tok, H);
    /* every expert over every row, in ascending id; rows that did not
     * choose it take nothing from it */
    for (int64_t e = 0; e < E; e++) {
        KV_TRY(kv_cuda_gemm(ctx, ctx->xn, w->experts_gate_up + e * 2 * I * H, ctx->moe_gu, rows, H,
                            2 * I, err));
        KV_LAUNCH(ctx, kv_moe_glu_kernel, kv_cuda_blocks(rows * I, KV_CUDA_EW_THREADS),
                  KV_CUDA_EW_THREADS, 0, ctx->moe_gu, w->experts_gate_up_b + e * 2 * I,
                  ctx->moe_h, rows, I, ctx->swiglu_limit, ctx->swiglu_alpha);
        KV_TRY(kv_cuda_gemm(ctx, ctx->moe_h, w->experts_down + e * H * I, ctx->moe_out, rows, I, H,
                            err));
        KV_LAUNCH(ctx, kv_moe_accumulate_kernel, kv_cuda_blocks(rows * H, KV_CUDA_EW_THREADS),
                  KV_CUDA_EW_THREADS, 0, ctx->tmp, ctx->moe_out, w->experts_down_b + e * H,
                  ctx->moe_weight, ctx->moe_chosen, rows, H, E, e);
    }
cleanup:
    return st;
}

/* gate = act(gate) * up: gemma2 GeGLU with the tanh gelu
 * (0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))), mistral SwiGLU
 * (x / (1 + exp(-x))), the constants and operation order of kvmath.c. */
static __global__ void kv_glu_kernel(float *__restrict__ gate /* (count) */,
                              const float *__restrict__ up /* (count) */, int64_t count,
                              int gelu) {
    const float k_beta = 0.7978845608028654f; /* sqrt(2 / pi) */
    const float k_kappa = 0.044715f;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < count;
         i += (int64_t)gridDim.x * blockDim.x) {
        const float x = gate[i];
        float act;
        if (gelu) {
            const float inner = k_beta * (x + k_kappa * x * x * x);
            act = 0.5f * x * (1.0f + tanhf(inner));
        } else {
            act = x / (1.0f + expf(-x));
        }
        gate[i] = act * up[i];
    }
}

KvStatus kv_cuda_glu(KvCudaCtx *ctx, int64_t count, KvError *err) {
    KvStatus st = KV_OK;
    KV_LAUNCH(ctx, kv_glu_kernel, kv_cuda_blocks(count, KV_CUDA_EW_THREADS), KV_CUDA_EW_THREADS, 0,
              ctx->gate, ctx->up, count, ctx->gemma ? 1 : 0);
cleanup:
    return st;
}

/* x = cap * tanh(x / cap), kv_softcap's order. */
static __global__ void kv_softcap_kernel(float *__restrict__ x /* (count) */, int64_t count, float cap) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < count;
         i += (int64_t)gridDim.x * blockDim.x) {
        x[i] = tanhf(x[i] / cap) * cap;
    }
}

KvStatus kv_cuda_softcap(KvCudaCtx *ctx, float *x, int64_t count, float cap, KvError *err) {
    KvStatus st = KV_OK;
    KV_LAUNCH(ctx, kv_softcap_kernel, kv_cuda_blocks(count, KV_CUDA_EW_THREADS),
              KV_CUDA_EW_THREADS, 0, x, count, cap);
cleanup:
    return st;
}

/* ---- argmax and the position advance ---- */

/* (vb, ib) is a better argmax candidate than (va, ia): a larger value, or
 * the same value at a lower id (ties to the lowest id); -1 is no candidate. */
static __device__ __forceinline__ bool kv_dev_better(float vb, int64_t ib, float va, int64_t ia) {
    if (ib < 0) return false;
    if (ia < 0) return true;
    return vb > va || (vb == va && ib < ia);
}

/* One block per batch row: the greedy token (lowest id on ties) and its
 * margin (top-1 minus the best other logit; +inf for a one-token
 * vocabulary), written as the next step's (B, 1) input; then block 0 moves
 * the position on by n. Last kernel of a step, so nothing after it in the
 * step reads *total. */
static __global__ void kv_argmax_kernel(const float *__restrict__ logits /* (B, vocab) */, int64_t vocab,
                                 int32_t *__restrict__ next_tok /* (B) */,
                                 float *__restrict__ margin /* (B) */,
                                 int32_t *__restrict__ tok_in /* (B, 1) */,
                                 uint8_t *__restrict__ real_in /* (B, 1) */,
                                 int64_t *__restrict__ total /* (1) */, int64_t n) {
    __shared__ float rv[KV_CUDA_ARGMAX_THREADS];
    __shared__ int64_t ri[KV_CUDA_ARGMAX_THREADS];
    const int tid = (int)threadIdx.x;
    const int64_t b = blockIdx.x;
    const float *x = logits + b * vocab;
    float bv = 0.0f;
    int64_t bi = -1;
    for (int64_t i = tid; i < vocab; i += KV_CUDA_ARGMAX_THREADS) {
        if (kv_dev_better(x[i], i, bv, bi)) {
            bv = x[i];
            bi = i;
        }
    }
    rv[tid] = bv;
    ri[tid] = bi;
    __syncthreads();
    for (int off = KV_CUDA_ARGMAX_THREADS / 2; off > 0; off >>= 1) {
        if (tid < off && kv_dev_better(rv[tid + off], ri[tid + off], rv[tid], ri[tid])) {
            rv[tid] = rv[tid + off];
            ri[tid] = ri[tid + off];
        }
        __syncthreads();
    }
    const int64_t best = ri[0] < 0 ? 0 : ri[0];
    __syncthreads();
    float second = -INFINITY;
    for (int64_t i = tid; i < vocab; i += KV_CUDA_ARGMAX_THREADS) {
        if (i != best && x[i] > second) second = x[i];
    }
    rv[tid] = second;
    __syncthreads();
    for (int off = KV_CUDA_ARGMAX_THREADS / 2; off > 0; off >>= 1) {
        if (tid < off && rv[tid + off] > rv[tid]) rv[tid] = rv[tid + off];
        __syncthreads();
    }
    if (tid == 0) {
        next_tok[b] = (int32_t)best;
        margin[b] = vocab > 1 ? x[best] - rv[0] : INFINITY;
        tok_in[b] = (int32_t)best;
        real_in[b] = 1;
        if (b == 0) *total += n;
    }
}

KvStatus kv_cuda_argmax_advance(KvCudaCtx *ctx, int64_t n, KvError *err) {
    KvStatus st = KV_OK;
    KV_LAUNCH(ctx, kv_argmax_kernel, (unsigned int)ctx->B, KV_CUDA_ARGMAX_THREADS, 0, ctx->logits,
              ctx->vocab, ctx->next_tok, ctx->margin, ctx->tok_in, ctx->real_in, ctx->total, n);
cleanup:
    return st;
}

/* ---- probes (DESIGN §6), computed inside the step ---- */

/* FNV-1a 64 over n bytes, continuing from h: kv_fnv1a's byte order. Reads
 * 32-bit words (bytes in little-endian order, as memory holds them) when
 * aligned. */
static __device__ uint64_t kv_dev_fnv1a(uint64_t h, const unsigned char *p, int64_t n) {
    int64_t i = 0;
    if (((uintptr_t)p & 3u) == 0) {
        const uint32_t *w = (const uint32_t *)p;
        for (; i + 4 <= n; i += 4) {
            const uint32_t u = w[i / 4];
            h ^= (uint64_t)(u & 0xffu);
            h *= KV_FNV_PRIME;
            h ^= (uint64_t)((u >> 8) & 0xffu);
            h *= KV_FNV_PRIME;
            h ^= (uint64_t)((u >> 16) & 0xffu);
            h *= KV_FNV_PRIME;
            h ^= (uint64_t)(u >> 24);
            h *= KV_FNV_PRIME;
        }
    }
    for (; i < n; i++) {
        h ^= (uint64_t)p[i];
        h *= KV_FNV_PRIME;
    }
    return h;
}

/* FNV-1a 64 continued from h over the 8 little-endian bytes of a slice's
 * hash: probe.h's kv_probe_fold. */
static __device__ __forceinline__ uint64_t kv_dev_fold(uint64_t h, uint64_t slice) {
    for (int i = 0; i < 8; i++) {
        h ^= (slice >> (8 * i)) & 0xffu;
        h *= KV_FNV_PRIME;
    }
    return h;
}

/* The index (first + i) of the first non-finite of count floats v, its
 * value in *value; -1 when all are finite. */
static __device__ int64_t kv_dev_first_nonfinite(const float *v, int64_t count, int64_t first,
                                                 float *value) {
    for (int64_t i = 0; i < count; i++) {
        if (!isfinite(v[i])) {
            *value = v[i];
            return first + i;
        }
    }
    return -1;
}

/* A slice's non-finite slot that is not folded: an absent cache position. */
#define KV_SLICE_ABSENT ((int64_t)-2)

/* The slices of op_probe (probe.h): slice j of row b is bytes
 * [j * KV_PROBE_CHUNK, +KV_PROBE_CHUNK) of base + b * per_row; one thread
 * per slice hashes it and finds its first non-finite float (its index in
 * the probe row). */
static __global__ void kv_probe_slices_kernel(const unsigned char *__restrict__ base /* (B, per_row) */,
                                              int64_t per_row, int64_t B, int64_t n_slices,
                                              int64_t stride,
                                              uint64_t *__restrict__ sh /* (B, stride) */,
                                              int64_t *__restrict__ snf /* (B, stride) */,
                                              float *__restrict__ snfv /* (B, stride) */) {
    for (int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; t < B * n_slices;
         t += (int64_t)gridDim.x * blockDim.x) {
        const int64_t b = t / n_slices, j = t % n_slices;
        const int64_t at = j * KV_PROBE_CHUNK;
        const int64_t len = per_row - at < KV_PROBE_CHUNK ? per_row - at : KV_PROBE_CHUNK;
        const unsigned char *p = base + b * per_row + at;
        float value = 0.0f;
        sh[b * stride + j] = kv_dev_fnv1a(KV_FNV_OFFSET, p, len);
        snf[b * stride + j] = kv_dev_first_nonfinite((const float *)(const void *)p,
                                                     len / (int64_t)sizeof(float),
                                                     at / (int64_t)sizeof(float), &value);
        snfv[b * stride + j] = value;
    }
}

/* out[b] = the slices' hashes of row b folded in order from KV_FNV_OFFSET
 * (absent ones skipped), and the row's first non-finite element into
 * (nf_index[b], nf_value[b]) unless the row already holds one (the CPU's
 * probe_check_finite, forward.c): one thread per row, no atomics. */
static __global__ void kv_probe_fold_kernel(const uint64_t *__restrict__ sh /* (B, stride) */,
                                            const int64_t *__restrict__ snf /* (B, stride) */,
                                            const float *__restrict__ snfv /* (B, stride) */,
                                            int64_t B, int64_t n_slices, int64_t stride,
                                            uint64_t *__restrict__ out /* (B) */,
                                            int64_t *__restrict__ nf_index /* (B) */,
                                            float *__restrict__ nf_value /* (B) */) {
    for (int64_t b = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; b < B;
         b += (int64_t)gridDim.x * blockDim.x) {
        uint64_t h = KV_FNV_OFFSET;
        bool noted = nf_index[b] >= 0;
        for (int64_t j = 0; j < n_slices; j++) {
            const int64_t nf = snf[b * stride + j];
            if (nf == KV_SLICE_ABSENT) continue;
            h = kv_dev_fold(h, sh[b * stride + j]);
            if (!noted && nf >= 0) {
                nf_index[b] = nf;
                nf_value[b] = snfv[b * stride + j];
                noted = true;
            }
        }
        out[b] = h;
    }
}

/* Folds n_slices slices per row into probe idx's hashes. */
static KvStatus probe_fold(KvCudaCtx *ctx, int64_t idx, int64_t n_slices, KvError *err) {
    KvStatus st = KV_OK;
    KV_LAUNCH(ctx, kv_probe_fold_kernel, 1, 32, 0, ctx->slice_hash, ctx->slice_nf,
              ctx->slice_nfv, ctx->B, n_slices, ctx->probe_slices, ctx->probe_hash + idx * ctx->B,
              ctx->nf_index + idx * ctx->B, ctx->nf_value + idx * ctx->B);
cleanup:
    return st;
}

KvStatus kv_cuda_probe(KvCudaCtx *ctx, int64_t idx, const void *base, int64_t per_row,
                       KvError *err) {
    KvStatus st = KV_OK;
    if (!ctx->probes) return KV_OK;
    const int64_t n_slices = (per_row + KV_PROBE_CHUNK - 1) / KV_PROBE_CHUNK;
    if (n_slices > ctx->probe_slices) {
        return kv_error_set(err, KV_ERR_INTERNAL, "cuda probe %lld: %lld bytes per row need %lld "
                            "slices, %lld allocated", (long long)idx, (long long)per_row,
                            (long long)n_slices, (long long)ctx->probe_slices);
    }
    if (n_slices > 0) {
        KV_LAUNCH(ctx, kv_probe_slices_kernel, kv_cuda_blocks(ctx->B * n_slices, 128), 128, 0,
                  (const unsigned char *)base, per_row, ctx->B, n_slices, ctx->probe_slices,
                  ctx->slice_hash, ctx->slice_nf, ctx->slice_nfv);
    }
    KV_TRY(probe_fold(ctx, idx, n_slices, err));
cleanup:
    return st;
}

/* op_probe_cache's position -> slot map for a variant's view, one block per
 * row b: for each position p the next query (at *total + n) will see
 * (next - W < p < next on a sliding layer, p < next on a full one), the
 * lowest slot holding p as a real token by the layout rule (layout.h, with
 * next positions stored; atomicMin: order-free), INT_MAX where none does. */
static __global__ void kv_probe_cache_map_kernel(const uint8_t *__restrict__ sreal /* (B, row_stride) */,
                                                 int rule, int64_t cache_w, int64_t row_stride,
                                                 int64_t n_slots, const int64_t *__restrict__ total,
                                                 int64_t n, int64_t window,
                                                 int32_t *__restrict__ map /* (B, map_w) */,
                                                 int64_t map_w) {
    const int64_t b = blockIdx.x;
    const int64_t next = *total + n;
    int64_t lo = window > 0 ? next - window + 1 : 0;
    if (lo < 0) lo = 0;
    int32_t *m = map + b * map_w;
    for (int64_t i = threadIdx.x; i < map_w; i += blockDim.x) m[i] = INT_MAX;
    __syncthreads();
    for (int64_t i = threadIdx.x; i < n_slots; i += blockDim.x) {
        const int64_t p = kv_layout_position((KvLayoutRule)rule, cache_w, i, next);
        if (p < lo || p >= next || p - lo >= map_w || !sreal[b * row_stride + i]) continue;
        atomicMin(&m[p - lo], (int)i);
    }
}

/* op_probe_cache's slices, one thread per (row b, position lo + t), t <
 * bound: the position's entry (p as int64, the recorded pos[slot] where
 * the record disagrees with the rule: the independent check, then the K
 * row's bytes, then the V row's) hashed on its own; a position the row's
 * cache does not hold is absent (not folded). pos == NULL: the static
 * layout (slot = position, realness in sreal with row stride row_stride =
 * max_len), else a variant's view through the map. Non-finite elements are
 * counted as in the dump: (p - lo, {K, V}, kv_dim). */
static __global__ void kv_probe_cache_slices_kernel(const float *__restrict__ kc /* (B, row_stride, kv_dim) */,
                                                    const float *__restrict__ vc /* (B, row_stride, kv_dim) */,
                                                    const uint8_t *__restrict__ sreal /* (B, row_stride) */,
                                                    const int64_t *__restrict__ pos /* (n_slots) or NULL */,
                                                    int64_t row_stride,
                                                    const int64_t *__restrict__ total, int64_t n,
                                                    int64_t window, int64_t kv_dim,
                                                    const int32_t *__restrict__ map /* (B, map_w) */,
                                                    int64_t map_w, int64_t B, int64_t bound,
                                                    int64_t stride,
                                                    uint64_t *__restrict__ sh /* (B, stride) */,
                                                    int64_t *__restrict__ snf /* (B, stride) */,
                                                    float *__restrict__ snfv /* (B, stride) */) {
    const int64_t next = *total + n;
    int64_t lo = window > 0 ? next - window + 1 : 0;
    if (lo < 0) lo = 0;
    const int64_t row_bytes = kv_dim * (int64_t)sizeof(float);
    for (int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; t < B * bound;
         t += (int64_t)gridDim.x * blockDim.x) {
        const int64_t b = t / bound, i = t % bound, p = lo + i;
        const int64_t at = b * stride + i;
        snf[at] = KV_SLICE_ABSENT;
        if (p >= next) continue;
        int64_t slot;
        if (pos == NULL) {
            if (p >= row_stride || !sreal[b * row_stride + p]) continue;
            slot = p;
        } else {
            if (i >= map_w || map[b * map_w + i] == INT_MAX) continue;
            slot = map[b * map_w + i];
        }
        const float *k = kc + (b * row_stride + slot) * kv_dim;
        const float *v = vc + (b * row_stride + slot) * kv_dim;
        uint64_t e = kv_dev_fnv1a(KV_FNV_OFFSET, (const unsigned char *)&p, (int64_t)sizeof p);
        if (pos != NULL && pos[slot] != p) {
            const int64_t recorded = pos[slot];
            e = kv_dev_fnv1a(e, (const unsigned char *)&recorded, (int64_t)sizeof recorded);
        }
        e = kv_dev_fnv1a(e, (const unsigned char *)k, row_bytes);
        e = kv_dev_fnv1a(e, (const unsigned char *)v, row_bytes);
        sh[at] = e;
        float value = 0.0f;
        int64_t nf = kv_dev_first_nonfinite(k, kv_dim, i * 2 * kv_dim, &value);
        if (nf < 0) nf = kv_dev_first_nonfinite(v, kv_dim, i * 2 * kv_dim + kv_dim, &value);
        snf[at] = nf;
        snfv[at] = value;
    }
}

KvStatus kv_cuda_probe_cache(KvCudaCtx *ctx, int64_t layer, int64_t n, int64_t n_slots,
                             KvError *err) {
    KvStatus st = KV_OK;
    if (!ctx->probes) return KV_OK;
    const int64_t window = kv_config_layer_window(ctx->c, layer);
    const int64_t idx = kv_probe_index(layer, KV_PROBE_CACHE);
    /* positions a query can see: window - 1 on a sliding layer, all on a full one */
    const int64_t bound = window > 0 && window < ctx->max_len ? window : ctx->max_len;
    const int64_t map_w = ctx->window + 1;
    const KvCudaCache *c = &ctx->caches[layer];
    if (bound > ctx->probe_slices) {
        return kv_error_set(err, KV_ERR_INTERNAL, "cuda cache probe, layer %lld: %lld positions, "
                            "%lld slices allocated", (long long)layer, (long long)bound,
                            (long long)ctx->probe_slices);
    }
    if (c->slots > 0) {
        KV_LAUNCH(ctx, kv_probe_cache_map_kernel, (unsigned int)ctx->B, 64, 0, c->cur.real,
                  (int)ctx->variant->layout, c->window, c->slots, n_slots, ctx->total, n, window,
                  ctx->probe_map, map_w);
        KV_LAUNCH(ctx, kv_probe_cache_slices_kernel, kv_cuda_blocks(ctx->B * bound, 128), 128, 0,
                  c->cur.k, c->cur.v, c->cur.real, c->cur.pos, c->slots, ctx->total, n, window,
                  ctx->kv_dim, ctx->probe_map, map_w, ctx->B, bound, ctx->probe_slices,
                  ctx->slice_hash, ctx->slice_nf, ctx->slice_nfv);
    } else {
        KV_LAUNCH(ctx, kv_probe_cache_slices_kernel, kv_cuda_blocks(ctx->B * bound, 128), 128, 0,
                  ctx->kc[layer], ctx->vc[layer], ctx->real, (const int64_t *)NULL, ctx->max_len,
                  ctx->total, n, window, ctx->kv_dim, (const int32_t *)NULL, (int64_t)0, ctx->B,
                  bound, ctx->probe_slices, ctx->slice_hash, ctx->slice_nf, ctx->slice_nfv);
    }
    KV_TRY(probe_fold(ctx, idx, bound, err));
cleanup:
    return st;
}
