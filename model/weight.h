/* weight.h: a weight matrix as the checkpoint stores it (F32, BF16, F16, or
 * MXFP4 for gpt-oss's experts), and its elements widened to F32 where a
 * kernel reads them.
 *
 * Widening BF16 or F16 to F32 is exact (every such value is an F32), so a
 * kernel that widens its operands just before the arithmetic computes the
 * same bits as one that reads an F32 copy made at load (an MXFP4 value, an
 * e2m1 number times its block's power-of-two scale, is an F32 exactly,
 * computed as transformers' dequantizer computes it: the value times
 * 2^(scale - 127) as an F32); what changes is the
 * memory: a BF16 checkpoint stays BF16, half the bytes to hold and to stream
 * every decode step. Host byte order is little-endian, as safetensors'. */
#ifndef KV_WEIGHT_H
#define KV_WEIGHT_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "safetensors.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "weights are read in place from little-endian safetensors data"
#endif

/* A row-major matrix (rows, cols) in one of kv_dtype_loadable()'s dtypes,
 * or MXFP4; data NULL: absent. The shape lives with the user (the config
 * says it). */
typedef struct {
    const void *data; /* (rows, cols) values; MXFP4: (rows, cols / 2) bytes, element 2k in
                       * the low nibble of byte k and 2k + 1 in the high one */
    KvDtype dtype;    /* KV_DTYPE_F32, KV_DTYPE_BF16, KV_DTYPE_F16, or KV_DTYPE_F4: MXFP4 */
    const uint8_t *scales; /* MXFP4 only: (rows, cols / 32) e8m0 exponents, one per 32
                            * consecutive elements (cols % 32 == 0); NULL otherwise */
} KvMat;

/* The e2m1 values of the 16 nibbles (OCP MX: sign, 2 exponent bits, 1
 * mantissa bit), as transformers' FP4_VALUES. */
extern const float kv_e2m1_values[16];

/* An F32 matrix (p may be NULL: absent). */
static inline KvMat kv_mat_f32(const float *p) {
    KvMat m = {p, KV_DTYPE_F32, NULL};
    return m;
}

/* Bytes that `elems` elements take as stored (MXFP4: half a byte each,
 * plus a scale byte per 32; elems a multiple of 32). */
static inline uint64_t kv_mat_bytes(KvMat m, uint64_t elems) {
    switch (m.dtype) {
    case KV_DTYPE_F32:
        return elems * 4u;
    case KV_DTYPE_F4:
        return elems / 2u + elems / 32u;
    default:
        return elems * 2u;
    }
}

/* The same storage from element `elems` on (an expert's block, a row;
 * MXFP4: elems a multiple of 32). */
static inline KvMat kv_mat_skip(KvMat m, int64_t elems) {
    KvMat r = m;
    if (m.dtype == KV_DTYPE_F4) {
        r.data = (const uint8_t *)m.data + (size_t)elems / 2u;
        r.scales = m.scales + (size_t)elems / 32u;
    } else {
        r.data = (const uint8_t *)m.data + (size_t)elems * (m.dtype == KV_DTYPE_F32 ? 4u : 2u);
    }
    return r;
}

/* Element i widened to F32 (exact). For transposing and scalar loops; the
 * streamed kernels use kv_mat_rows. */
float kv_mat_at(KvMat m, int64_t i);

/* dst[0 .. n) = elements from .. from + n widened to F32 (exact). */
void kv_mat_widen(KvMat m, int64_t from, int64_t n, float *dst /* (n) */);

/* Rows row0 .. row0 + n of a matrix with `cols` columns as F32: a pointer
 * into the matrix itself when it is F32 (no copy), else the rows widened
 * into scratch (n * cols floats) and scratch returned. */
const float *kv_mat_rows(KvMat m, int64_t cols, int64_t row0, int64_t n,
                         float *scratch /* (n, cols) */);

#endif
