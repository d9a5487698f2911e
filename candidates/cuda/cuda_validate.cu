/* cuda_validate.cu: kv_cuda_validate_ops (cuda_validate.h), the per-op
 * validation of the CUDA launchers against the CPU reference: the run (one
 * context for the reference layout, then one per cache variant), the op
 * records and their log lines, guarded device buffers and the comparators.
 * The ops themselves are in cuda_validate_ops.cu and cuda_validate_attn.cu.
 *
 * Everything runs on the context's one stream with asynchronous copies and
 * an explicit stream synchronisation before the host reads a result: the
 * context's stream is non-blocking, so nothing on the legacy default stream
 * may be assumed ordered with it. */
#include "cuda_validate_internal.cuh"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "cache.h"
#include "cache_registry.h"
#include "prng.h"
}

/* ---- device buffers ---- */

KvStatus kv_val_buf_alloc(KvValRun *v, KvValBuf *b, const char *name, size_t bytes, int fill,
                          KvError *err) {
    KvStatus st = KV_OK;
    memset(b, 0, sizeof *b);
    b->name = name;
    b->bytes = bytes;
    KV_CUDA_CHECK(cudaMalloc((void **)&b->base, bytes + 2 * (size_t)KV_VAL_GUARD_BYTES));
    b->p = b->base + KV_VAL_GUARD_BYTES;
    KV_CUDA_CHECK(cudaMemsetAsync(b->base, KV_VAL_GUARD_BYTE, KV_VAL_GUARD_BYTES, v->ctx->stream));
    if (bytes > 0) KV_CUDA_CHECK(cudaMemsetAsync(b->p, fill, bytes, v->ctx->stream));
    KV_CUDA_CHECK(cudaMemsetAsync(b->base + KV_VAL_GUARD_BYTES + bytes, KV_VAL_GUARD_BYTE,
                                  KV_VAL_GUARD_BYTES, v->ctx->stream));
cleanup:
    return st;
}

void kv_val_buf_free(KvValBuf *b) {
    /* cudaFree waits for the device; its result cannot fix anything here. */
    if (b->base != NULL) (void)cudaFree(b->base);
    memset(b, 0, sizeof *b);
}

KvStatus kv_val_buf_check(KvValRun *v, KvCudaValidateOp *op, const KvValBuf *b, KvError *err) {
    KvStatus st = KV_OK;
    unsigned char guard[2][KV_VAL_GUARD_BYTES]; /* (before, after) */
    if (b->base == NULL) return KV_OK;
    KV_CUDA_CHECK(cudaMemcpyAsync(guard[0], b->base, KV_VAL_GUARD_BYTES, cudaMemcpyDeviceToHost,
                                  v->ctx->stream));
    KV_CUDA_CHECK(cudaMemcpyAsync(guard[1], b->base + KV_VAL_GUARD_BYTES + b->bytes,
                                  KV_VAL_GUARD_BYTES, cudaMemcpyDeviceToHost, v->ctx->stream));
    KV_CUDA_CHECK(cudaStreamSynchronize(v->ctx->stream));
    /* Each side is scanned from the body outwards: the nearest changed
     * byte is reported, as an overrun or underrun reaches it first. */
    for (int side = 0; side < 2; side++) {
        for (int64_t k = 0; k < KV_VAL_GUARD_BYTES; k++) {
            const int64_t i = side == 0 ? KV_VAL_GUARD_BYTES - 1 - k : k;
            if (guard[side][i] == KV_VAL_GUARD_BYTE) continue;
            kv_val_fail(op,
                        "%s: out-of-bounds write: buffer %s (%zu bytes): byte %lld %s is 0x%02x, "
                        "not the sentinel 0x%02x",
                        op->op, b->name, b->bytes, (long long)(k + 1),
                        side == 0 ? "before its start" : "past its end", (unsigned)guard[side][i],
                        (unsigned)KV_VAL_GUARD_BYTE);
            return KV_OK;
        }
    }
cleanup:
    return st;
}

KvStatus kv_val_upload(KvValRun *v, void *dst, const void *src, size_t bytes, KvError *err) {
    KvStatus st = KV_OK;
    if (bytes == 0) return KV_OK;
    KV_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, v->ctx->stream));
cleanup:
    return st;
}

KvStatus kv_val_download(KvValRun *v, void *dst, const void *src, size_t bytes, KvError *err) {
    KvStatus st = KV_OK;
    if (bytes > 0) {
        KV_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, v->ctx->stream));
    }
    KV_CUDA_CHECK(cudaStreamSynchronize(v->ctx->stream));
cleanup:
    return st;
}

KvStatus kv_val_dev_err(KvValRun *v, KvCudaValidateOp *op, const char *when, KvError *err) {
    KvStatus st = KV_OK;
    int32_t flags = 0;
    KV_TRY(kv_val_download(v, &flags, v->ctx->dev_err, sizeof flags, err));
    if (flags != 0) {
        KvError e = {{0}};
        (void)kv_cuda_dev_err_status(v->ctx, flags, when, 0, &e);
        kv_val_fail(op, "%s: %s", op->op, e.msg);
        KV_CUDA_CHECK(cudaMemsetAsync(v->ctx->dev_err, 0, sizeof(int32_t), v->ctx->stream));
    }
cleanup:
    return st;
}

KvStatus kv_val_set_total(KvValRun *v, int64_t len, KvError *err) {
    v->ctx->len = len;
    return kv_val_upload(v, v->ctx->total, &len, sizeof len, err);
}

/* ---- records ---- */

KvStatus kv_val_op_begin(KvValRun *v, const char *name, const char *tolerance, bool bitwise,
                         KvCudaValidateOp **out, KvError *err) {
    KvCudaValidateReport *r = v->rep;
    *out = NULL;
    if (r->n_ops >= KV_CUDA_VALIDATE_MAX_OPS) {
        return kv_error_set(err, KV_ERR_INTERNAL,
                            "cuda validate: more than KV_CUDA_VALIDATE_MAX_OPS (%d) op records "
                            "(at %s)",
                            KV_CUDA_VALIDATE_MAX_OPS, name);
    }
    KvCudaValidateOp *op = &r->ops[r->n_ops++];
    memset(op, 0, sizeof *op);
    snprintf(op->op, sizeof op->op, "%s", name);
    snprintf(op->tolerance, sizeof op->tolerance, "%s", bitwise ? "bitwise" : tolerance);
    op->bitwise = bitwise;
    op->passed = true;
    *out = op;
    return KV_OK;
}

void kv_val_op_shape(KvCudaValidateOp *op, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(op->shape, sizeof op->shape, fmt, ap);
    va_end(ap);
}

void kv_val_fail(KvCudaValidateOp *op, const char *fmt, ...) {
    if (!op->passed) return; /* the first failure is the one to debug */
    op->passed = false;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(op->failure, sizeof op->failure, fmt, ap);
    va_end(ap);
}

void kv_val_op_end(KvValRun *v, KvCudaValidateOp *op) {
    char errs[96];
    if (!op->passed) v->rep->n_failed++;
    if (v->log == NULL) return;
    if (op->bitwise) {
        snprintf(errs, sizeof errs, "%lld compared", (long long)op->compared);
    } else {
        snprintf(errs, sizeof errs, "max_abs %.2e max_rel %.2e bound_use %.3f (%lld)",
                 op->max_abs_err, op->max_rel_err, op->worst_ratio, (long long)op->compared);
    }
    fprintf(v->log, "cuda validate: %-24s %-40s %-22s %-46s %s%s\n", op->op, op->shape,
            op->tolerance, errs, op->passed ? "PASS" : "FAIL: ", op->passed ? "" : op->failure);
    fflush(v->log);
}

/* ---- comparators ---- */

static uint32_t val_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

void kv_val_check_floats(KvCudaValidateOp *op, const char *buf, const char *where,
                         const float *gpu, const float *cpu, const float *bound, int64_t n,
                         int64_t cols) {
    for (int64_t i = 0; i < n; i++) {
        const float g = gpu[i], c = cpu[i];
        const long long row = (long long)(cols > 0 ? i / cols : 0);
        const long long col = (long long)(cols > 0 ? i % cols : i);
        op->compared++;
        if (!isfinite(g)) {
            kv_val_fail(op, "%s: %s: %s element %lld (row %lld, col %lld) is not finite: gpu %.9g, "
                            "cpu %.9g",
                        op->op, where, buf, (long long)i, row, col, (double)g, (double)c);
            return;
        }
        if (!isfinite(c)) {
            kv_val_fail(op, "%s: %s: %s element %lld (row %lld, col %lld): the CPU reference is not "
                            "finite (%.9g): the inputs are out of the op's range",
                        op->op, where, buf, (long long)i, row, col, (double)c);
            return;
        }
        if (bound == NULL) {
            if (val_bits(g) != val_bits(c)) {
                kv_val_fail(op, "%s: %s: %s element %lld (row %lld, col %lld): gpu %.9g (0x%08x) != "
                                "cpu %.9g (0x%08x), must be bitwise equal",
                            op->op, where, buf, (long long)i, row, col, (double)g, val_bits(g),
                            (double)c, val_bits(c));
                return;
            }
            continue;
        }
        const double d = fabs((double)g - (double)c);
        if (d > op->max_abs_err) op->max_abs_err = d;
        if (c != 0.0f && d / fabs((double)c) > op->max_rel_err) op->max_rel_err = d / fabs((double)c);
        const double ratio = bound[i] > 0.0f ? d / (double)bound[i] : (d > 0.0 ? INFINITY : 0.0);
        if (ratio > op->worst_ratio) op->worst_ratio = ratio;
        if (d > (double)bound[i]) {
            kv_val_fail(op, "%s: %s: %s element %lld (row %lld, col %lld): gpu %.9g, cpu %.9g, "
                            "|gpu - cpu| %.3g > bound %.3g",
                        op->op, where, buf, (long long)i, row, col, (double)g, (double)c, d,
                        (double)bound[i]);
            return;
        }
    }
}

void kv_val_check_bits(KvCudaValidateOp *op, const char *buf, const char *where,
                       const float *gpu, const float *cpu, int64_t n, int64_t cols) {
    for (int64_t i = 0; i < n; i++) {
        op->compared++;
        if (val_bits(gpu[i]) != val_bits(cpu[i])) {
            kv_val_fail(op, "%s: %s: %s element %lld (row %lld, col %lld): gpu %.9g (0x%08x) != "
                            "cpu %.9g (0x%08x), must be bitwise equal",
                        op->op, where, buf, (long long)i, (long long)(cols > 0 ? i / cols : 0),
                        (long long)(cols > 0 ? i % cols : i), (double)gpu[i], val_bits(gpu[i]),
                        (double)cpu[i], val_bits(cpu[i]));
            return;
        }
    }
}

/* Element i of an integer array of elem_size bytes (1: unsigned, as the
 * realness flags; 4 and 8: signed). */
static long long val_int_at(const void *p, int64_t i, size_t elem_size) {
    if (elem_size == 1) return (long long)((const uint8_t *)p)[i];
    if (elem_size == 4) return (long long)((const int32_t *)p)[i];
    return (long long)((const int64_t *)p)[i];
}

void kv_val_check_ints(KvCudaValidateOp *op, const char *buf, const char *where, const void *gpu,
                       const void *cpu, int64_t n, size_t elem_size, int64_t cols) {
    for (int64_t i = 0; i < n; i++) {
        const long long g = val_int_at(gpu, i, elem_size), c = val_int_at(cpu, i, elem_size);
        op->compared++;
        if (g != c) {
            kv_val_fail(op, "%s: %s: %s element %lld (row %lld, col %lld): gpu %lld != cpu %lld",
                        op->op, where, buf, (long long)i, (long long)(cols > 0 ? i / cols : 0),
                        (long long)(cols > 0 ? i % cols : i), g, c);
            return;
        }
    }
}

/* ---- inputs ---- */

void kv_val_fill(const KvValRun *v, float *x, int64_t n, float lo, float hi, const char *stream) {
    KvPrng g = kv_prng_stream(v->seed, stream);
    for (int64_t i = 0; i < n; i++) x[i] = lo + (hi - lo) * kv_prng_uniform(&g);
}

void *kv_val_alloc(int64_t n, size_t size) {
    return calloc((size_t)(n > 0 ? n : 1), size);
}

bool kv_val_real(const KvValRun *v, int64_t b, int64_t p) {
    return p >= v->pad[b];
}

/* ---- the run ---- */

const KvCudaValidateOp *kv_cuda_validate_find(const KvCudaValidateReport *r, const char *op) {
    for (int i = 0; r != NULL && i < r->n_ops; i++) {
        if (strcmp(r->ops[i].op, op) == 0) return &r->ops[i];
    }
    return NULL;
}

/* The ops of the reference layout's context: everything but the variants.
 * sliding, full: the first layer of each kind, -1 when the model has none. */
static KvStatus val_reference_ops(KvValRun *v, int64_t sliding, int64_t full, KvError *err) {
    KvStatus st = KV_OK;
    KV_TRY(kv_val_positions(v, err));
    KV_TRY(kv_val_embed(v, err));
    /* Both RMSNorm forms and both activations on every model: the kernel
     * picks them by the context's family flag, which the ops set. */
    KV_TRY(kv_val_rmsnorm(v, true, err));
    KV_TRY(kv_val_rmsnorm(v, false, err));
    KV_TRY(kv_val_gemm(v, err));
    KV_TRY(kv_val_rope(v, err));
    if (sliding >= 0) KV_TRY(kv_val_attn_static(v, sliding, err));
    if (full >= 0) KV_TRY(kv_val_attn_static(v, full, err));
    KV_TRY(kv_val_softcap(v, err));
    KV_TRY(kv_val_glu(v, true, err));
    KV_TRY(kv_val_glu(v, false, err));
    KV_TRY(kv_val_add(v, err));
    KV_TRY(kv_val_argmax(v, err));
cleanup:
    return st;
}

KvStatus kv_cuda_validate_ops(const KvModel *m, uint64_t seed, unsigned faults, FILE *log,
                              KvCudaValidateReport *out, KvError *err) {
    KvStatus st = KV_OK;
    KvError local = {{0}};
    KvCudaCtx ctx;
    bool have_ctx = false;
    KvValRun v;
    KvCudaValidateReport *rep = out;
    const KvConfig *c = &m->config;
    const int64_t W = c->sliding_window;
    int64_t sliding = -1, full = -1;
    int n_variants = 0;
    const KvCacheOps *const *variants = kv_cache_all(&n_variants);

    if (err == NULL) err = &local;
    memset(&ctx, 0, sizeof ctx);
    memset(&v, 0, sizeof v);
    if (rep == NULL) {
        rep = (KvCudaValidateReport *)calloc(1, sizeof *rep);
        if (rep == NULL) return kv_error_set(err, KV_ERR_INTERNAL, "cuda validate: out of host memory");
    }
    memset(rep, 0, sizeof *rep);
    rep->seed = seed;
    rep->faults = faults;

    v.m = m;
    v.ctx = &ctx;
    v.seed = seed;
    v.log = log;
    v.rep = rep;
    /* Chunks up to W + 5 tokens: a prefill longer than the window. The
     * static layout gets room for that plus the variants' schedule (2W + 16
     * positions) and at least KV_VAL_MIN_MAX_LEN slots. */
    v.max_chunk = W + 5;
    v.max_len = 2 * W + 16 + v.max_chunk;
    if (v.max_len < KV_VAL_MIN_MAX_LEN) v.max_len = KV_VAL_MIN_MAX_LEN;
    /* Left pads: none, a few, more than the window (a row whose window
     * holds only pads for a while), one. */
    v.pad[0] = 0;
    v.pad[1] = 3;
    v.pad[2] = W + 2;
    v.pad[3] = 1;
    for (int64_t l = 0; l < c->num_layers; l++) {
        if (kv_config_layer_window(c, l) > 0 && sliding < 0) sliding = l;
        if (kv_config_layer_window(c, l) == 0 && full < 0) full = l;
    }

    st = kv_cuda_ctx_create(&ctx, m, KV_VAL_B, v.max_len, v.max_chunk, NULL, faults, false, NULL,
                            rep->device, sizeof rep->device, err);
    if (st != KV_OK) {
        /* KV_SKIP (no device, with CUDA's call and error text) or a setup
         * failure, as kv_cuda_ctx_create decided. */
        kv_error_prefix(err, "cuda validate");
        goto cleanup;
    }
    have_ctx = true;
    if (log != NULL) {
        fprintf(log,
                "cuda validate: %s, seed %llu, faults 0x%x, on %s: B %d, max_len %lld, max_chunk "
                "%lld, window %lld; u = 2^-24\n",
                kv_family_name(c->family), (unsigned long long)seed, faults, rep->device, KV_VAL_B,
                (long long)v.max_len, (long long)v.max_chunk, (long long)W);
    }
    KV_TRY(val_reference_ops(&v, sliding, full, err));
    kv_cuda_ctx_destroy(&ctx);
    have_ctx = false;

    for (int i = 0; sliding >= 0 && i < n_variants; i++) {
        if (!kv_cuda_cache_supports(variants[i])) {
            st = kv_error_set(err, KV_ERR_INTERNAL, "cuda validate: variant %s has no GPU form",
                              variants[i]->name);
            goto cleanup;
        }
        st = kv_cuda_ctx_create(&ctx, m, KV_VAL_B, v.max_len, v.max_chunk, variants[i], faults,
                                false, NULL, NULL, 0, err);
        if (st != KV_OK) {
            kv_error_prefix(err, "cuda validate");
            goto cleanup;
        }
        have_ctx = true;
        KV_TRY(kv_val_variant(&v, sliding, err));
        kv_cuda_ctx_destroy(&ctx);
        have_ctx = false;
    }
    if (sliding < 0 && log != NULL) {
        fprintf(log, "cuda validate: no sliding layer: the cache variants do not apply\n");
    }

    if (rep->n_failed > 0) {
        const KvCudaValidateOp *first = NULL;
        for (int i = 0; i < rep->n_ops && first == NULL; i++) {
            if (!rep->ops[i].passed) first = &rep->ops[i];
        }
        st = kv_error_set(err, KV_ERR_INTERNAL, "cuda validate: %d of %d ops failed (seed %llu); "
                                                "first: %s",
                          rep->n_failed, rep->n_ops, (unsigned long long)seed,
                          first != NULL ? first->failure : "?");
    }
    if (log != NULL) {
        fprintf(log, "cuda validate: %s: %d ops, %d failed\n", kv_family_name(c->family),
                rep->n_ops, rep->n_failed);
        fflush(log);
    }
cleanup:
    if (have_ctx) kv_cuda_ctx_destroy(&ctx);
    free(v.att_hash);
    if (st == KV_SKIP) {
        /* Nothing ran: no op may look validated. */
        memset(rep, 0, sizeof *rep);
        rep->seed = seed;
        rep->faults = faults;
    }
    if (rep != out) free(rep);
    return st;
}
