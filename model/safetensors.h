/* safetensors.h: reading and writing the safetensors container.
 *
 * Layout: 8-byte little-endian header length N, N bytes of JSON header
 * {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {...}},
 * then the data section; offsets are relative to the data section. The parser
 * validates everything before any tensor is used, by the format's own rules:
 * header length within the file and at most 100 MB, the header UTF-8 JSON
 * starting with '{' (trailing whitespace allowed) with no key twice, dtype
 * known, shape non-negative and consistent with the byte range, and the
 * tensors covering the data section exactly: no gap, no overlap, no trailing
 * bytes. */
#ifndef KV_SAFETENSORS_H
#define KV_SAFETENSORS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "status.h"

#define KV_ST_MAX_RANK 8
#define KV_ST_MAX_NAME 256

/* The first three are the weight dtypes the loader converts to F32. The rest
 * are the other dtypes safetensors knows: a file may list them (the table
 * keeps them, flagged by kv_dtype_loadable() == false) and the model loader
 * only fails if it needs such a tensor. An unknown dtype name is an error. */
typedef enum {
    KV_DTYPE_F32 = 0,
    KV_DTYPE_F16 = 1,
    KV_DTYPE_BF16 = 2,
    KV_DTYPE_BOOL,
    KV_DTYPE_U8,
    KV_DTYPE_I8,
    KV_DTYPE_I16,
    KV_DTYPE_U16,
    KV_DTYPE_I32,
    KV_DTYPE_U32,
    KV_DTYPE_I64,
    KV_DTYPE_U64,
    KV_DTYPE_F64,
    KV_DTYPE_C64,
    KV_DTYPE_F8_E4M3,
    KV_DTYPE_F8_E5M2,
    KV_DTYPE_F8_E8M0,
    KV_DTYPE_F6_E2M3,
    KV_DTYPE_F6_E3M2,
    KV_DTYPE_F4,
    KV_DTYPE_COUNT /* not a dtype: the number of them */
} KvDtype;

typedef struct {
    char name[KV_ST_MAX_NAME];
    KvDtype dtype;
    int rank;
    int64_t shape[KV_ST_MAX_RANK];
    uint64_t begin; /* byte offset into the data section */
    uint64_t end;   /* one past the last byte */
} KvTensorInfo;

typedef struct {
    const uint8_t *data;   /* (data_len) start of the data section */
    uint64_t data_len;
    KvTensorInfo *tensors; /* (n_tensors) sorted by name */
    size_t n_tensors;
    void *map;             /* mmap'd file when opened from a path, else NULL */
    size_t map_len;
    char label[256];       /* file name used in messages */
} KvSafetensors;

/* Parses an in-memory safetensors image. `bytes` must stay alive and
 * unchanged until kv_st_close(). */
KvStatus kv_st_parse(const uint8_t *bytes, size_t len, const char *label, KvSafetensors *out,
                     KvError *err);

/* Memory-maps the file at path and parses it. */
KvStatus kv_st_open(const char *path, KvSafetensors *out, KvError *err);

/* Releases the tensor table and the mapping (safe on a zeroed struct). */
void kv_st_close(KvSafetensors *st);

/* Returns the tensor called name, or NULL. */
const KvTensorInfo *kv_st_find(const KvSafetensors *st, const char *name);

/* The safetensors name ("F32", "BF16", ...); "?" for a value outside the enum. */
const char *kv_dtype_name(KvDtype dt);

/* Bytes per element; 0 for the sub-byte dtypes (F4, F6_*) and unknown values. */
size_t kv_dtype_size(KvDtype dt);

/* Bits per element (4 for F4, 6 for F6_*, 8 * size otherwise); 0 if unknown. */
size_t kv_dtype_bits(KvDtype dt);

/* True for the dtypes a weight may have: F32, F16, BF16. */
bool kv_dtype_loadable(KvDtype dt);

/* Looks up a safetensors dtype name; false when the name is unknown. */
bool kv_dtype_from_name(const char *name, KvDtype *out);

/* Converts n values of dtype dt at src (any alignment, little-endian) to F32
 * at dst, exactly (F16 subnormals, infinities and NaN payloads included).
 * Only for loadable dtypes; any other dtype fills dst with NaN. */
void kv_dtype_to_f32(KvDtype dt, const uint8_t *src, size_t n, float *dst);

/* Rounds n F32 values to BF16 (round to nearest, ties to even: what torch's
 * .to(torch.bfloat16) gives), written little-endian at dst (any alignment).
 * Infinities stay infinite, NaN stays NaN (quiet). */
void kv_f32_to_bf16(const float *src, size_t n, uint8_t *dst);

/* Tells the kernel that the bytes [begin, end) of st's data section will not
 * be read through the mapping again (converted into a buffer of their own):
 * their pages leave the process's resident set now instead of staying mapped
 * until kv_st_close. Only for a file opened with kv_st_open (a no-op for an
 * in-memory image, whose bytes are the caller's); the bytes stay readable
 * (they fault back in from the file), so a mistaken call costs time, not
 * data. A range outside the data section is ignored. */
void kv_st_release(const KvSafetensors *st, uint64_t begin, uint64_t end);

/* One tensor for the writer. */
typedef struct {
    const char *name;
    KvDtype dtype;
    int rank;
    int64_t shape[KV_ST_MAX_RANK];
    const void *data; /* (numel) values of dtype, native little-endian */
} KvStWriteTensor;

/* Serialises tensors (in the given order, contiguous, as safetensors requires:
 * no gaps) into a malloc'd image with "__metadata__": {"format": "pt"} (what
 * transformers expects). The header is padded with spaces so the data section
 * starts at a multiple of 8; a tensor is 4-byte aligned when the tensors
 * before it have a multiple of 4 bytes in all. Names must be unique and
 * shorter than KV_ST_MAX_NAME; dtypes whole-byte. */
KvStatus kv_st_serialize(const KvStWriteTensor *tensors, size_t n, uint8_t **out, size_t *out_len,
                         KvError *err);

/* The bytes kv_st_serialize would put before the data section (the 8-byte
 * header length, the JSON header, the padding) as a malloc'd *prefix, and
 * the data section's length: for a writer that streams each tensor's bytes
 * after it, in the given order (tensors' data may be NULL). The same checks
 * as kv_st_serialize but for the data pointers. */
KvStatus kv_st_header(const KvStWriteTensor *tensors, size_t n, uint8_t **prefix,
                      size_t *prefix_len, uint64_t *data_len, KvError *err);

#endif
