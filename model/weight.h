/* weight.h: a weight matrix as the checkpoint stores it (F32, BF16 or F16),
 * and its elements widened to F32 where a kernel reads them.
 *
 * Widening BF16 or F16 to F32 is exact (every such value is an F32), so a
 * kernel that widens its operands just before the arithmetic computes the
 * same bits as one that reads an F32 copy made at load; what changes is the
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

/* A row-major matrix (rows, cols) in one of kv_dtype_loadable()'s dtypes;
 * data NULL: absent. The shape lives with the user (the config says it). */
typedef struct {
    const void *data;
    KvDtype dtype; /* KV_DTYPE_F32, KV_DTYPE_BF16 or KV_DTYPE_F16 */
} KvMat;

/* An F32 matrix (p may be NULL: absent). */
static inline KvMat kv_mat_f32(const float *p) {
    KvMat m = {p, KV_DTYPE_F32};
    return m;
}

/* Bytes per element: 4 or 2. */
static inline size_t kv_mat_elem_size(KvMat m) {
    return m.dtype == KV_DTYPE_F32 ? 4u : 2u;
}

/* The same storage from element `elems` on (an expert's block, a row). */
static inline KvMat kv_mat_skip(KvMat m, int64_t elems) {
    KvMat r = {(const uint8_t *)m.data + (size_t)elems * kv_mat_elem_size(m), m.dtype};
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
