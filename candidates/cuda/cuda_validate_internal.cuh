/* cuda_validate_internal.cuh: what the per-op validation's .cu files share
 * (cuda_validate.cu: the run, the records, guarded device buffers and the
 * comparators; cuda_validate_ops.cu: the pointwise, norm, matmul, RoPE and
 * argmax ops; cuda_validate_attn.cu: gather, attention and the six cache
 * variants). Private to those files.
 *
 * How an op is validated: the launcher's output buffers (context fields or
 * arguments) are pointed at guarded device buffers owned by the op, the
 * context struct is saved first and restored after (the launchers read
 * every buffer through the context, so nothing in them changes), inputs are
 * drawn from the run's seed and uploaded, the launcher runs once on the
 * context's stream, results come back and are compared with the CPU op on
 * the same inputs, then the guards and the device error flags are
 * checked. */
#ifndef KV_CUDA_VALIDATE_INTERNAL_CUH
#define KV_CUDA_VALIDATE_INTERNAL_CUH

#include "cuda_internal.cuh"
#include "cuda_validate.h"

#include <float.h>
#include <stdint.h>
#include <stdio.h>

/* Unit roundoff of F32, 2^-24: every bound below is a multiple of it. One
 * ulp of a normal F32 value y is at most 2u|y|. */
#define KV_VAL_U 5.9604644775390625e-8

/* Device libm against glibc, in u relative to the result: CUDA's sinf,
 * cosf, expf and tanhf are within 2 ulp over their whole range without
 * -use_fast_math (CUDA C++ Programming Guide, Mathematical Functions),
 * glibc's within 2 (libm-test-ulps for x86_64: tanhf 2, sinf, cosf and
 * expf 1), so the two are at most 4 ulp = 8u apart. */
#define KV_VAL_LIBM_U 8.0

/* The absolute floor of every relative bound: the smallest normal F32, so
 * a result that is denormal on one side and 0 on the other still passes. */
#define KV_VAL_TINY FLT_MIN

/* Batch rows every op runs with: enough for the argmax cases (one per row)
 * and for rows with different left pads. */
#define KV_VAL_B 4
/* Slots of the static layout: above 256 (KV_CUDA_GATHER_THREADS), so a
 * full-attention query's gather runs more than one block-scan chunk. */
#define KV_VAL_MIN_MAX_LEN 300

/* Sentinel regions: 4 KiB before and after every buffer an op writes (a
 * multiple of 256, so the body keeps cudaMalloc's alignment for cuBLAS; a
 * row or two past either end of any buffer here lands in it). The pattern
 * is neither 0x00 (zero fills) nor 0xFF (the NaN poison of empty slots). */
#define KV_VAL_GUARD_BYTES 4096
#define KV_VAL_GUARD_BYTE 0xA5
/* Bodies of output buffers start as all-ones bytes: NaN as floats, -1 as
 * integers, so an element an op should write but does not fails the NaN
 * check or the bitwise comparison. */
#define KV_VAL_POISON_BYTE 0xFF

/* The run: one model, one context at a time. */
typedef struct {
    const KvModel *m;
    KvCudaCtx *ctx;             /* the context ops run on (reference layout or a variant) */
    uint64_t seed;
    FILE *log;                  /* may be NULL */
    KvCudaValidateReport *rep;
    int64_t max_len, max_chunk; /* the contexts' shapes */
    int64_t pad[KV_VAL_B];      /* left pad of each batch row, in positions */
    /* Each variant step's attention output hash, from the first variant
     * that matched the CPU throughout: every later variant must match it
     * bit for bit (on the GPU all variants are bitwise equal, DESIGN §2). */
    uint64_t *att_hash;         /* (steps of the variant schedule) */
    const char *att_hash_from;  /* that variant's name; NULL until one passed */
} KvValRun;

/* A guarded device buffer: guard | body | guard. */
typedef struct {
    const char *name;    /* the buffer as messages name it, e.g. "att (B*n, q_dim)" */
    unsigned char *base; /* device, bytes + 2 * KV_VAL_GUARD_BYTES */
    void *p;             /* device body: base + KV_VAL_GUARD_BYTES */
    size_t bytes;        /* body bytes */
} KvValBuf;

/* ---- device buffers (cuda_validate.cu) ---- */

/* cudaMalloc of a guarded buffer; guards get KV_VAL_GUARD_BYTE, the body
 * `fill` bytes (on the context's stream). */
KvStatus kv_val_buf_alloc(KvValRun *v, KvValBuf *b, const char *name, size_t bytes, int fill,
                          KvError *err);
/* NULL-safe; leaves b zeroed. */
void kv_val_buf_free(KvValBuf *b);
/* Reads both guards back; a changed byte fails op naming the buffer, the
 * side and the offset. KV_ERR_INTERNAL only when a CUDA call fails. */
KvStatus kv_val_buf_check(KvValRun *v, KvCudaValidateOp *op, const KvValBuf *b, KvError *err);
/* Host -> device on the context's stream (the host buffer may be reused on return). */
KvStatus kv_val_upload(KvValRun *v, void *dst, const void *src, size_t bytes, KvError *err);
/* Device -> host on the context's stream, then synchronises it. */
KvStatus kv_val_download(KvValRun *v, void *dst, const void *src, size_t bytes, KvError *err);
/* Reads the device error flags (synchronising); flags set fail op with the
 * flags named, and are cleared for the next op. */
KvStatus kv_val_dev_err(KvValRun *v, KvCudaValidateOp *op, const char *when, KvError *err);
/* Sets the device's position scalar (*ctx->total) and the host's count
 * (ctx->len) to len, as a decode at that point has them. */
KvStatus kv_val_set_total(KvValRun *v, int64_t len, KvError *err);

/* ---- records (cuda_validate.cu) ---- */

/* Appends an op record (passed until a check fails). KV_ERR_INTERNAL when
 * the report is full. */
KvStatus kv_val_op_begin(KvValRun *v, const char *name, const char *tolerance, bool bitwise,
                         KvCudaValidateOp **out, KvError *err);
void kv_val_op_shape(KvCudaValidateOp *op, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Records a failure; only the first one of an op is kept. */
void kv_val_fail(KvCudaValidateOp *op, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Counts the verdict and prints the op's line. */
void kv_val_op_end(KvValRun *v, KvCudaValidateOp *op);

/* ---- comparators (cuda_validate.cu) ---- */

/* n floats of one output, rows of `cols`: every gpu value must be finite,
 * then |gpu - cpu| <= bound[i], or bit for bit when bound is NULL. Updates
 * the op's error statistics; the first failure names buf, where (the case,
 * e.g. "step 4 (n 1, total 12)"), the element, its row and column, and both
 * values. */
void kv_val_check_floats(KvCudaValidateOp *op, const char *buf, const char *where,
                         const float *gpu /* (n) */, const float *cpu /* (n) */,
                         const float *bound /* (n) or NULL */, int64_t n, int64_t cols);
/* n floats bit for bit, NaN included: buffers whose untouched parts hold
 * the NaN poison on purpose (a static cache's unstored slots). */
void kv_val_check_bits(KvCudaValidateOp *op, const char *buf, const char *where,
                       const float *gpu /* (n) */, const float *cpu /* (n) */, int64_t n,
                       int64_t cols);
/* n integers of elem_size bytes (1, 4 or 8, signed), bit for bit. */
void kv_val_check_ints(KvCudaValidateOp *op, const char *buf, const char *where,
                       const void *gpu /* (n) */, const void *cpu /* (n) */, int64_t n,
                       size_t elem_size, int64_t cols);

/* ---- inputs ---- */

/* x[i] uniform in [lo, hi) from the named stream of the run's seed. */
void kv_val_fill(const KvValRun *v, float *x /* (n) */, int64_t n, float lo, float hi,
                 const char *stream);
/* calloc of n elements of size bytes (at least one), NULL on failure. */
void *kv_val_alloc(int64_t n, size_t size);
/* Whether position p of batch row b holds a real token (left padding). */
bool kv_val_real(const KvValRun *v, int64_t b, int64_t p);

/* ---- the ops (cuda_validate_ops.cu, cuda_validate_attn.cu) ----
 * Each appends its record(s) and returns KV_OK unless a CUDA call failed. */

KvStatus kv_val_positions(KvValRun *v, KvError *err);
KvStatus kv_val_embed(KvValRun *v, KvError *err);
KvStatus kv_val_rmsnorm(KvValRun *v, bool offset, KvError *err);
KvStatus kv_val_gemm(KvValRun *v, KvError *err);
KvStatus kv_val_rope(KvValRun *v, KvError *err);
KvStatus kv_val_softcap(KvValRun *v, KvError *err);
KvStatus kv_val_glu(KvValRun *v, bool gelu, KvError *err);
KvStatus kv_val_add(KvValRun *v, KvError *err);
KvStatus kv_val_argmax(KvValRun *v, KvError *err);
/* Gather and attention over the static layout of one layer (window 0: a
 * full-attention layer). */
KvStatus kv_val_attn_static(KvValRun *v, int64_t layer, KvError *err);
/* One variant's cache updates, gathers and attention on a sliding layer;
 * v->ctx must have been created with that variant. */
KvStatus kv_val_variant(KvValRun *v, int64_t layer, KvError *err);

#endif
