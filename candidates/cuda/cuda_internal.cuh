/* cuda_internal.cuh: the run context, checked-call macros and kernel
 * launchers shared by cuda_forward.cu, cuda_kernels.cu and cuda_cache.cu.
 * Private to the .cu files of candidates/cuda; nothing in C includes it.
 *
 * Every CUDA runtime and cuBLAS call goes through KV_CUDA_CHECK /
 * KV_CUBLAS_CHECK, and every kernel launch through KV_LAUNCH (which checks
 * cudaGetLastError right after the launch). Each records the file, the line
 * and the statement text in the KvError and leaves through the calling
 * function's one `cleanup:` label with `st` set, so the functions that use
 * them need `KvStatus st`, `KvError *err` and `cleanup:` in scope. */
#ifndef KV_CUDA_INTERNAL_CUH
#define KV_CUDA_INTERNAL_CUH

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <stdint.h>

#include "cuda_forward.h"

extern "C" {
#include "backend_rows.h"
#include "config.h"
#include "fault.h"
}

/* Block sizes. Each reduction's order depends only on these constants and
 * the data's shape, never on the device or its SM count, so results are the
 * same on every run (DESIGN §2). */
#define KV_CUDA_NORM_THREADS 256   /* RMSNorm: one block per row */
#define KV_CUDA_ATTN_THREADS 128   /* attention: one block per (query row, head) */
#define KV_CUDA_GATHER_THREADS 256 /* key gather: one block per query row */
#define KV_CUDA_ARGMAX_THREADS 256 /* argmax: one block per batch row */
#define KV_CUDA_EW_THREADS 256     /* elementwise kernels */

/* Device error flags (KvCudaCtx.dev_err), set with integer atomicOr by
 * kernels that meet a broken invariant instead of writing out of bounds. */
enum {
    KV_CUDA_DERR_TOKEN = 1 << 0, /* a token id outside [0, vocab) reached the embedding */
    KV_CUDA_DERR_SLOT = 1 << 1,  /* a position at or past max_len */
    KV_CUDA_DERR_KEYS = 1 << 2,  /* more visible keys than the gather buffer holds */
};

/* Snapshot slots (backend.h: KV_SNAP_REPLAY = 0, KV_SNAP_PREFIX = 1). */
#define KV_CUDA_SNAP_SLOTS 2

/* One set of slot buffers on the device (cache_internal.h's KvCacheSlots). */
typedef struct {
    float *k;      /* (B, slots, kv_dim) */
    float *v;      /* (B, slots, kv_dim) */
    uint8_t *real; /* (B, slots) 1 when the token in the slot is real */
    int64_t *pos;  /* (slots) position held by each slot, -1 = empty */
} KvCudaSlots;

/* A sliding layer's variant cache on the device. */
typedef struct {
    int64_t window;  /* W */
    int64_t slots;   /* S: W, or W - 1 for dynamic */
    KvCudaSlots cur; /* the slots attention reads */
    KvCudaSlots tmp; /* the variant's temporary (gather target, cat result, roll output,
                      * always_roll's pre-roll copy); never read by attention */
    int64_t *indices; /* (W) index_copy's gather indices, computed on the device */
    int64_t filled;  /* dynamic: slots holding a position (the tensor's shape), a host
                      * value as in transformers; part of the snapshot */
    KvCudaSlots snap[KV_CUDA_SNAP_SLOTS]; /* snapshots of cur, per slot (backend.h's
                                           * KV_SNAP_REPLAY, KV_SNAP_PREFIX) */
    int64_t snap_filled[KV_CUDA_SNAP_SLOTS];
} KvCudaCache;

/* One layer's weights on the device. */
typedef struct {
    const float *input_norm;     /* (hidden) */
    const float *post_attn_norm; /* (hidden) */
    const float *pre_ffw_norm;   /* (hidden) gemma2 only, else NULL */
    const float *post_ffw_norm;  /* (hidden) gemma2 only, else NULL */
    const float *wq;             /* (q_dim, hidden) */
    const float *wk;             /* (kv_dim, hidden) */
    const float *wv;             /* (kv_dim, hidden) */
    const float *wo;             /* (hidden, q_dim) */
    const float *bq;             /* (q_dim) qwen2 only, else NULL */
    const float *bk;             /* (kv_dim) qwen2 only, else NULL */
    const float *bv;             /* (kv_dim) qwen2 only, else NULL */
    const float *q_norm;         /* (hd) gemma3 only, else NULL */
    const float *k_norm;         /* (hd) gemma3 only, else NULL */
    /* gpt_oss only, else NULL (layouts as KvLayerWeights): */
    const float *bo;             /* (hidden) */
    const float *sinks;          /* (n_heads) */
    const float *router_w;       /* (E, hidden) */
    const float *router_b;       /* (E) */
    const float *experts_gate_up; /* (E, 2 * inter, hidden) interleaved gate/up rows */
    const float *experts_gate_up_b; /* (E, 2 * inter) */
    const float *experts_down;   /* (E, hidden, inter) */
    const float *experts_down_b; /* (E, hidden) */
    const float *w_gate;         /* (inter, hidden) */
    const float *w_up;           /* (inter, hidden) */
    const float *w_down;         /* (hidden, inter) */
} KvCudaLayer;

/* Everything one run owns: the stream, the cuBLAS handle, the weights, the
 * persistent state and scratch, all allocated before the first step so that
 * nothing is allocated while a graph is being captured. */
typedef struct {
    const KvModel *model;
    const KvConfig *c;
    const KvCacheOps *variant; /* NULL: the reference layout (every layer static); else the
                                * CPU variant whose GPU form the sliding layers run */
    unsigned faults;          /* KV_FAULT_* bits planted (fault.h); 0 in clean runs */
    bool probes;              /* record probe hashes */

    /* Shapes (64-bit, as every count and offset in this project). */
    int64_t B, max_len, max_chunk, max_keys, n_probes;
    int64_t hidden, q_dim, kv_dim, inter, vocab, hd, n_heads, n_kv_heads, n_layers;
    int64_t window;  /* the config's sliding window W (0: none) */
    float eps, scale, attn_cap, final_cap, embed_scale;
    float rope_scale;        /* on cos and sin: YaRN's attention factor (gpt_oss), else 1 */
    bool gemma;
    /* gpt_oss's MoE (n_experts > 0): the router's picks and the experts'
     * work, for every row at once */
    int64_t n_experts, experts_per_tok;
    float swiglu_limit, swiglu_alpha;

    /* Host mirror of what the host may know (DESIGN §4): its own count of
     * slots filled (regime choice only) and dynamic's shapes. */
    int64_t len;
    int64_t snap_len[KV_CUDA_SNAP_SLOTS];

    cudaStream_t stream;
    cublasHandle_t blas;
    void *blas_ws;           /* cuBLAS workspace, set after cublasSetStream */
    size_t blas_ws_bytes;
    float *one, *zero;       /* (1) each: alpha and beta in device memory */

    /* Weights: one device arena; pointers into it. */
    float *w_arena;          /* (w_arena_floats) */
    size_t w_arena_floats;
    const float *w_embed;    /* (vocab, hidden) */
    const float *w_final_norm; /* (hidden) */
    const float *w_lm_head;  /* (vocab, hidden), == w_embed when tied */
    KvCudaLayer *layers;     /* (n_layers) host array of device pointers */

    /* Persistent state (snapshotted by the replay check). */
    float **kc;              /* (n_layers) -> (B, max_len, kv_dim) static K, NULL on variant layers */
    float **vc;              /* (n_layers) -> (B, max_len, kv_dim) static V */
    uint8_t *real;           /* (B, max_len) slot holds a real token */
    int64_t *n_real;         /* (B) real tokens seen = next RoPE position */
    int64_t *total;          /* (1) positions stored so far, read by kernels at execution */
    int32_t *tok_in;         /* (B, max_chunk) next forward's tokens; argmax writes (B, 1) */
    uint8_t *real_in;        /* (B, max_chunk) 0 marks a pad */
    KvCudaCache *caches;     /* (n_layers) variant caches; slots == 0 on full layers */

    /* Snapshot copies of the persistent device state above, per slot: the
     * replay check's allocated with the state, the prefix entry's at its
     * first save (never inside a capture). */
    float **snap_kc[KV_CUDA_SNAP_SLOTS], **snap_vc[KV_CUDA_SNAP_SLOTS]; /* (n_layers) */
    uint8_t *snap_real[KV_CUDA_SNAP_SLOTS];
    int64_t *snap_n_real[KV_CUDA_SNAP_SLOTS], *snap_total[KV_CUDA_SNAP_SLOTS];
    int32_t *snap_tok_in[KV_CUDA_SNAP_SLOTS];
    uint8_t *snap_real_in[KV_CUDA_SNAP_SLOTS];
    bool snap_ready[KV_CUDA_SNAP_SLOTS]; /* the slot's buffers are allocated */

    /* Scratch, sized for max_chunk tokens per row. */
    float *inv_freq;         /* (2, hd / 2) [0] rope_theta's, [1] the sliding layers' (gemma3's
                              * rope_theta_local; else the same values) */
    float *x;                /* (B * max_chunk, hidden) residual stream */
    float *xn;               /* (B * max_chunk, hidden) */
    float *q;                /* (B * max_chunk, q_dim) */
    float *kn;               /* (B * max_chunk, kv_dim) new keys */
    float *vn;               /* (B * max_chunk, kv_dim) new values */
    float *att;              /* (B * max_chunk, q_dim) */
    float *tmp;              /* (B * max_chunk, hidden) */
    float *gate;             /* (B * max_chunk, inter) */
    float *up;               /* (B * max_chunk, inter) */
    float *moe_logits;       /* (B * max_chunk, E) router logits; NULL without experts */
    float *moe_weight;       /* (B * max_chunk, E) an expert's softmax weight, where chosen */
    uint8_t *moe_chosen;     /* (B * max_chunk, E) 1 where the row chose the expert */
    float *moe_gu;           /* (B * max_chunk, 2 * inter) one expert's gate/up */
    float *moe_h;            /* (B * max_chunk, inter) its gated activation */
    float *moe_out;          /* (B * max_chunk, hidden) one expert's output */
    int64_t *qpos;           /* (B * max_chunk) RoPE position per new token */
    int32_t *gidx;           /* (B * max_chunk, max_keys) visible keys per query, ascending
                              * position: >= 0 a cache slot, < 0 new token -(code + 1) */
    int32_t *nkeys;          /* (B * max_chunk) */
    int32_t *gtab;           /* (B * max_chunk, W + 1) position-indexed gather table */
    int32_t *probe_map;      /* (B, W + 1) cache probe: slot per window position */
    float *last;             /* (B, hidden) final-normed last token per row */
    float *logits;           /* (B, vocab) */
    int32_t *next_tok;       /* (B) */
    float *margin;           /* (B) */
    uint64_t *probe_hash;    /* (n_probes, B) */
    /* The first non-finite element of each probe row since the last take
     * (the backend's take_nonfinite), written by the probe kernels: one
     * thread owns a probe row, so no atomics. -1: none. NULL without probes. */
    int64_t *nf_index;       /* (n_probes, B) */
    float *nf_value;         /* (n_probes, B) */
    /* The probe hashes' slices (probe.h: a KV_PROBE_CHUNK-byte chunk of a
     * probe row, or one cache probe position's entry), hashed one thread
     * each, then folded in order by one thread per row. NULL without probes. */
    int64_t probe_slices;    /* slices per row allocated */
    uint64_t *slice_hash;    /* (B, probe_slices) */
    int64_t *slice_nf;       /* (B, probe_slices) the slice's first non-finite element (its
                              * index in the probe row), -1 none, -2 an absent cache position */
    float *slice_nfv;        /* (B, probe_slices) that element's value */
    int32_t *dev_err;        /* (1) KV_CUDA_DERR_* bits */
    uint64_t *fault_clock;   /* (1) KV_FAULT_ATOMIC_REDUCTION's clock, never snapshotted */

    /* Every cudaMalloc of the run, freed in reverse at destroy. */
    void **allocs;
    int64_t n_allocs, cap_allocs;

    /* Op timing (bench only): CUDA events around each op of an eager step. */
    bool timing;
    cudaEvent_t *events;     /* (2 * max_timed) */
    int64_t max_timed, n_timed;
} KvCudaCtx;

/* ---- errors ---- */

/* err->msg = "FILE:LINE: STATEMENT failed: NAME: TEXT"; returns st. */
KvStatus kv_cuda_fail_rt(KvError *err, KvStatus st, cudaError_t e, const char *stmt,
                         const char *file, int line);
KvStatus kv_cuda_fail_blas(KvError *err, KvStatus st, cublasStatus_t s, const char *stmt,
                           const char *file, int line);

#define KV_CUDA_CHECK(call)                                                                        \
    do {                                                                                           \
        cudaError_t kv_e_ = (call);                                                                \
        if (kv_e_ != cudaSuccess) {                                                                \
            st = kv_cuda_fail_rt(err, KV_ERR_INTERNAL, kv_e_, #call, __FILE__, __LINE__);          \
            goto cleanup;                                                                          \
        }                                                                                          \
    } while (0)

#define KV_CUBLAS_CHECK(call)                                                                      \
    do {                                                                                           \
        cublasStatus_t kv_s_ = (call);                                                             \
        if (kv_s_ != CUBLAS_STATUS_SUCCESS) {                                                      \
            st = kv_cuda_fail_blas(err, KV_ERR_INTERNAL, kv_s_, #call, __FILE__, __LINE__);        \
            goto cleanup;                                                                          \
        }                                                                                          \
    } while (0)

/* A KvStatus-returning call: propagate failure to this function's cleanup. */
#define KV_TRY(call)                                                                               \
    do {                                                                                           \
        st = (call);                                                                               \
        if (st != KV_OK) goto cleanup;                                                             \
    } while (0)

/* Op timing hooks (no-ops unless ctx->timing; never on while capturing). */
cudaError_t kv_cuda_timer_begin(KvCudaCtx *ctx);
cudaError_t kv_cuda_timer_end(KvCudaCtx *ctx);

/* Launches kernel on ctx's stream, then checks cudaGetLastError (a bad
 * configuration or a missing kernel image shows up there), naming the
 * launch. Timed as one op when ctx->timing. */
#define KV_LAUNCH(ctx, kernel, grid, block, smem, ...)                                             \
    do {                                                                                           \
        KV_CUDA_CHECK(kv_cuda_timer_begin(ctx));                                                   \
        kernel<<<(grid), (block), (smem), (ctx)->stream>>>(__VA_ARGS__);                           \
        cudaError_t kv_le_ = cudaGetLastError();                                                   \
        if (kv_le_ != cudaSuccess) {                                                               \
            st = kv_cuda_fail_rt(err, KV_ERR_INTERNAL, kv_le_,                                     \
                                 #kernel "<<<" #grid ", " #block ", " #smem ">>>(" #__VA_ARGS__ ")", \
                                 __FILE__, __LINE__);                                              \
            goto cleanup;                                                                          \
        }                                                                                          \
        KV_CUDA_CHECK(kv_cuda_timer_end(ctx));                                                     \
    } while (0)

/* An asynchronous copy on ctx's stream, timed as one op. */
#define KV_COPY(ctx, dst, src, bytes)                                                              \
    do {                                                                                           \
        KV_CUDA_CHECK(kv_cuda_timer_begin(ctx));                                                   \
        KV_CUDA_CHECK(cudaMemcpyAsync((dst), (src), (bytes), cudaMemcpyDeviceToDevice,             \
                                      (ctx)->stream));                                             \
        KV_CUDA_CHECK(kv_cuda_timer_end(ctx));                                                     \
    } while (0)

/* Blocks for a grid-stride loop over `count` elements. */
static inline unsigned int kv_cuda_blocks(int64_t count, int threads) {
    int64_t b = (count + threads - 1) / threads;
    if (b < 1) b = 1;
    if (b > 65535) b = 65535; /* grid-stride loops cover the rest */
    return (unsigned int)b;
}

/* ---- the run context (cuda_ctx.cu) ---- */

/* Fills the shapes and sets everything up for B rows of max_len slots,
 * max_chunk tokens per forward; variant NULL: the reference layout;
 * weights NULL: uploads the model's weights, else borrows those of
 * `weights` (a context of the same model that outlives this one).
 * device (may be NULL) receives "NAME (sm_XY, N SMs), driver A.B, runtime
 * C.D, cuBLAS V". KV_SKIP (with CUDA's text) when no device is visible,
 * KV_ERR_INTERNAL when one is but setup fails; on failure ctx is destroyed. */
KvStatus kv_cuda_ctx_create(KvCudaCtx *ctx, const KvModel *m, int64_t B, int64_t max_len,
                            int64_t max_chunk, const KvCacheOps *variant, unsigned faults,
                            bool probes, const KvCudaCtx *weights, char *device,
                            size_t device_len, KvError *err);
void kv_cuda_ctx_destroy(KvCudaCtx *ctx);
/* Empties the caches (K/V NaN-poisoned, positions -1, real 0), zeroes
 * positions, inputs and error flags; the host count goes back to 0.
 * Synchronous. */
KvStatus kv_cuda_ctx_reset_state(KvCudaCtx *ctx, KvError *err);
/* save: persistent device state and host counts -> snapshot slot `slot`'s
 * copies (allocated at its first save); else back (stream-ordered D2D
 * copies). A KV_SNAP_PREFIX load under KV_FAULT_PREFIX_ALIAS leaves the
 * sliding layers' slots as they are (an entry aliasing the live cache). */
KvStatus kv_cuda_snapshot(KvCudaCtx *ctx, int slot, bool save, KvError *err);
/* The context shift (backend.h's shift, engine/shift.h) of the
 * persistent device state: copied to the host, shifted by the CPU
 * reference's steps, copied back into the same buffers; the host count and
 * *total go down by drop. Synchronous (cuda_shift.cu). */
KvStatus kv_cuda_shift(KvCudaCtx *ctx, int64_t keep, int64_t drop, KvError *err);
/* The error for device error flags raised by `when` (e.g. "position" 12). */
KvStatus kv_cuda_dev_err_status(const KvCudaCtx *ctx, int32_t flags, const char *when,
                                int64_t at, KvError *err);
/* Synchronises and checks the device error flags. */
KvStatus kv_cuda_check_dev_err(KvCudaCtx *ctx, const char *when, int64_t at, KvError *err);

/* ---- the forward pass and its graph (cuda_forward.cu) ---- */

/* One forward of the n tokens already in tok_in/real_in (B, n): positions,
 * embedding, layers, final norm of each row's last token, lm_head, final
 * softcap, probes, argmax into tok_in (B, 1) and *total += n. Launches only:
 * the same code runs eagerly and under stream capture. */
KvStatus kv_cuda_launch_forward(KvCudaCtx *ctx, int64_t n, KvError *err);

/* The captured forward and its executable. */
typedef struct {
    cudaGraph_t graph;     /* the last captured forward */
    cudaGraphExec_t exec;  /* its executable */
    int64_t n;             /* tokens per forward it runs */
    int64_t instantiations, exec_updates, launches;
} KvCudaGraph;

/* Captures a forward of n into a new graph and makes it the executable:
 * cudaGraphExecUpdate when an executable exists and accepts it (same
 * topology: e.g. dynamic's next attended length), else a new instantiation. */
KvStatus kv_cuda_graph_capture(KvCudaGraph *g, KvCudaCtx *ctx, int64_t n, KvError *err);
/* Launches the executable on ctx's stream. */
KvStatus kv_cuda_graph_launch(KvCudaGraph *g, KvCudaCtx *ctx, KvError *err);
void kv_cuda_graph_free(KvCudaGraph *g);

/* ---- the backend (cuda_backend.cu) ---- */

/* One run of the CUDA backend (the KvBackend behind kv_backend_cuda). */
typedef struct {
    /* Rows at their own positions (setup.per_row): every entry runs on
     * these single-row runs (engine/backend_rows.h) and ctx, graph and
     * the outputs below are unused; NULL otherwise. */
    KvRows *rows;
    KvCudaCtx ctx;
    KvCudaGraph graph;
    int64_t eager_forwards;
    char device[256];
    char math_mode[64];
    /* Host copies of the last forward's outputs (read_step). */
    float *logits;        /* (B, vocab) */
    int32_t *tokens;      /* (B) */
    float *margins;       /* (B) */
    uint64_t *probe_hash; /* (n_probes, B), NULL without probes */
    int64_t *nf_index;    /* (n_probes, B) host copy of ctx.nf_index, NULL without probes */
    float *nf_value;      /* (n_probes, B) */
    /* A CUDA error met by take_nonfinite (which returns a bool): the next
     * read_step reports it, so it cannot pass unseen. "" when none. */
    char nf_error[512];
} KvCudaRun;

/* Creates one run (kv_backend_cuda's create); weights as kv_cuda_ctx_create
 * (a single-row run of a per-row batch borrows row 0's). */
KvStatus kv_cuda_run_create(const KvModel *m, const KvBackendSetup *setup,
                            const KvCudaCtx *weights, KvCudaRun **out, KvError *err);

/* ---- launchers (cuda_kernels.cu) ---- */

/* y (rows, out) = x (rows, in) W^T with W (out, in) row-major, on cuBLAS. */
KvStatus kv_cuda_gemm(KvCudaCtx *ctx, const float *x, const float *w, float *y, int64_t rows,
                      int64_t in, int64_t out, KvError *err);
/* Positions: slot realness, RoPE positions, stale-scalar fault, fault clock. */
KvStatus kv_cuda_positions(KvCudaCtx *ctx, int64_t n, KvError *err);
KvStatus kv_cuda_embed(KvCudaCtx *ctx, int64_t n, KvError *err);
/* out (rows, hidden) rows spaced by out_stride = RMSNorm of in rows spaced by
 * in_stride (floats); out may equal in. */
KvStatus kv_cuda_rmsnorm(KvCudaCtx *ctx, const float *in, int64_t in_stride, const float *w,
                         float *out, int64_t out_stride, int64_t rows, KvError *err);
/* RoPE on q and the new keys with layer `layer`'s inverse frequencies. */
KvStatus kv_cuda_rope(KvCudaCtx *ctx, int64_t n, int64_t layer, KvError *err);
/* gemma3's q_norm / k_norm: a (1 + w) RMSNorm of each of `rows` vectors of
 * `width` (= hd) floats, in place. */
KvStatus kv_cuda_rmsnorm_heads(KvCudaCtx *ctx, float *x /* (rows, width) */,
                               const float *w /* (width) */, int64_t rows, int64_t width,
                               KvError *err);
KvStatus kv_cuda_store_static(KvCudaCtx *ctx, int64_t layer, int64_t n, KvError *err);
/* Visible keys of each new query in ascending position into gidx/nkeys. */
KvStatus kv_cuda_gather_static(KvCudaCtx *ctx, int64_t layer, int64_t n, KvError *err);
KvStatus kv_cuda_gather_variant(KvCudaCtx *ctx, int64_t layer, int64_t n, int64_t n_slots,
                                bool include_new, KvError *err);
/* Attention over the gathered keys: kbase/vbase (B, row_stride, kv_dim). */
KvStatus kv_cuda_attend(KvCudaCtx *ctx, int64_t layer, int64_t n, const float *kbase,
                        const float *vbase, int64_t row_stride, KvError *err);
KvStatus kv_cuda_add(KvCudaCtx *ctx, float *x, const float *y, int64_t count, KvError *err);
/* y[r, :] += b for rows r < rows: a projection's bias after its GEMM (one
 * rounding, as op_bias_rows). */
KvStatus kv_cuda_bias_rows(KvCudaCtx *ctx, float *y /* (rows, out) */,
                           const float *b /* (out) */, int64_t rows, int64_t out, KvError *err);
KvStatus kv_cuda_glu(KvCudaCtx *ctx, int64_t count, KvError *err);
/* gpt_oss's MoE block, ctx->xn (rows, hidden) into ctx->tmp, as op_moe:
 * the router GEMM and bias, per row the top experts_per_tok (ties to the
 * lowest id) and their F32 softmax, then every expert in ascending id
 * over all rows (GEMMs), its clamped SwiGLU, and out + bias added times the
 * weight into the rows that chose it. */
KvStatus kv_cuda_moe(KvCudaCtx *ctx, const KvCudaLayer *w, int64_t rows, KvError *err);
KvStatus kv_cuda_softcap(KvCudaCtx *ctx, float *x, int64_t count, float cap, KvError *err);
KvStatus kv_cuda_argmax_advance(KvCudaCtx *ctx, int64_t n, KvError *err);
/* probe_hash[idx, b] = fnv1a(base + b * per_row, per_row). */
KvStatus kv_cuda_probe(KvCudaCtx *ctx, int64_t idx, const void *base, int64_t per_row,
                       KvError *err);
/* The layout-independent cache probe of layer l after a forward of n. */
KvStatus kv_cuda_probe_cache(KvCudaCtx *ctx, int64_t layer, int64_t n, int64_t n_slots,
                             KvError *err);
/* Fills bytes at p with `byte` on ctx's stream (cudaMemsetAsync, timed). */
KvStatus kv_cuda_fill(KvCudaCtx *ctx, void *p, int byte, size_t bytes, KvError *err);

/* ---- cache variants (cuda_cache.cu) ---- */

/* The variant's update of a sliding layer for n new tokens (kn, vn,
 * real_in), positions from ctx->total on the device; host_total only picks
 * host-branch regimes. Advances nothing on the host (kv_cuda_cache_advance
 * does, once per executed forward). */
KvStatus kv_cuda_cache_update(KvCudaCtx *ctx, int64_t layer, int64_t n, int64_t host_total,
                              KvError *err);
/* The slots attention reads before (after_update false) or after an update
 * of n tokens: W, or dynamic's filled count. */
int64_t kv_cuda_cache_n_slots(const KvCudaCtx *ctx, int64_t layer, int64_t n, bool after_update);
/* True when the variant has a GPU form here. */
bool kv_cuda_cache_supports(const KvCacheOps *ops);
/* Host regime (host-branch variants: host_total >= W; else 0), as cache.h's regime. */
int kv_cuda_cache_regime(const KvCudaCtx *ctx, int64_t layer, int64_t host_total);
/* Host side of an executed forward of n tokens: dynamic's filled count. */
void kv_cuda_cache_advance(KvCudaCtx *ctx, int64_t n);

#endif
