/* safetensors.c: parsing, validating and writing the safetensors container.
 *
 * Every check happens before a tensor is handed out, so the model loader and
 * everything after it can trust the table. The rules are the format's own
 * (the safetensors README and its reference reader): header length inside the
 * file and at most 100 MB; the header UTF-8 JSON text starting with '{',
 * possibly padded with whitespace, no key twice in any object; each tensor's
 * dtype known, shape non-negative, byte range consistent with the shape; and
 * the tensors, sorted by offset, tile the data section exactly: no gap, no
 * overlap, no trailing byte. A malformed file is KV_ERR_INPUT with a message
 * naming the file, the tensor and the field; nothing is allocated on failure. */
#define _DEFAULT_SOURCE /* madvise, MADV_DONTNEED */
#include "safetensors.h"
#include "file_open.h"
#include "json_describe.h"

#include "bigalloc.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "kvrepro reads safetensors data in place and assumes a little-endian host"
#endif

/* The safetensors reference implementation refuses larger headers; so do we,
 * which also bounds the copy made for the JSON parser. */
#define KV_ST_MAX_HEADER 100000000ULL

/* Offsets and shape entries arrive as JSON numbers (doubles); above 2^53 a
 * double no longer names one integer, so such values are rejected. */
#define KV_ST_MAX_EXACT 9007199254740992.0 /* 2^53 */

typedef struct {
    const char *name;
    size_t bits;
} KvDtypeDesc;

/* Indexed by KvDtype. */
static const KvDtypeDesc kv_dtype_table[KV_DTYPE_COUNT] = {
    [KV_DTYPE_F32] = {"F32", 32},        [KV_DTYPE_F16] = {"F16", 16},
    [KV_DTYPE_BF16] = {"BF16", 16},      [KV_DTYPE_BOOL] = {"BOOL", 8},
    [KV_DTYPE_U8] = {"U8", 8},           [KV_DTYPE_I8] = {"I8", 8},
    [KV_DTYPE_I16] = {"I16", 16},        [KV_DTYPE_U16] = {"U16", 16},
    [KV_DTYPE_I32] = {"I32", 32},        [KV_DTYPE_U32] = {"U32", 32},
    [KV_DTYPE_I64] = {"I64", 64},        [KV_DTYPE_U64] = {"U64", 64},
    [KV_DTYPE_F64] = {"F64", 64},        [KV_DTYPE_C64] = {"C64", 64},
    [KV_DTYPE_F8_E4M3] = {"F8_E4M3", 8}, [KV_DTYPE_F8_E5M2] = {"F8_E5M2", 8},
    [KV_DTYPE_F8_E8M0] = {"F8_E8M0", 8}, [KV_DTYPE_F6_E2M3] = {"F6_E2M3", 6},
    [KV_DTYPE_F6_E3M2] = {"F6_E3M2", 6}, [KV_DTYPE_F4] = {"F4", 4},
};

static bool dtype_valid(KvDtype dt) { return (int)dt >= 0 && dt < KV_DTYPE_COUNT; }

const char *kv_dtype_name(KvDtype dt) { return dtype_valid(dt) ? kv_dtype_table[dt].name : "?"; }

size_t kv_dtype_bits(KvDtype dt) { return dtype_valid(dt) ? kv_dtype_table[dt].bits : 0; }

size_t kv_dtype_size(KvDtype dt) {
    size_t bits = kv_dtype_bits(dt);
    return bits % 8 == 0 ? bits / 8 : 0;
}

bool kv_dtype_loadable(KvDtype dt) {
    return dt == KV_DTYPE_F32 || dt == KV_DTYPE_F16 || dt == KV_DTYPE_BF16;
}

bool kv_dtype_from_name(const char *name, KvDtype *out) {
    if (name == NULL) return false;
    for (int i = 0; i < KV_DTYPE_COUNT; i++) {
        if (strcmp(name, kv_dtype_table[i].name) == 0) {
            *out = (KvDtype)i;
            return true;
        }
    }
    return false;
}

static float f32_from_bits(uint32_t bits) {
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* IEEE binary16 -> binary32 is exact: every half value is a float. Written
 * out bit by bit rather than through _Float16 so it does not depend on
 * compiler support and keeps NaN payloads. */
static float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    if (exp == 0x1fu) return f32_from_bits(sign | 0x7f800000u | (mant << 13)); /* inf, NaN */
    if (exp != 0) return f32_from_bits(sign | ((exp + 112u) << 23) | (mant << 13));
    if (mant == 0) return f32_from_bits(sign); /* signed zero */
    /* Subnormal half mant * 2^-24 is a normal float: shift the leading one
     * up to the implicit bit, lowering the exponent (2^-14 has field 113). */
    uint32_t e = 113u;
    while ((mant & 0x400u) == 0) {
        mant <<= 1;
        e--;
    }
    return f32_from_bits(sign | (e << 23) | ((mant & 0x3ffu) << 13));
}

void kv_dtype_to_f32(KvDtype dt, const uint8_t *src, size_t n, float *dst) {
    switch (dt) {
    case KV_DTYPE_F32:
        memcpy(dst, src, n * sizeof(float)); /* memcpy: src may be unaligned */
        return;
    case KV_DTYPE_F16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h = (uint16_t)(src[2 * i] | (src[2 * i + 1] << 8));
            dst[i] = f16_to_f32(h);
        }
        return;
    case KV_DTYPE_BF16:
        /* bfloat16 is the top half of a binary32: exact by construction. */
        for (size_t i = 0; i < n; i++) {
            uint32_t b = (uint32_t)src[2 * i] | ((uint32_t)src[2 * i + 1] << 8);
            dst[i] = f32_from_bits(b << 16);
        }
        return;
    default:
        for (size_t i = 0; i < n; i++) dst[i] = NAN;
        return;
    }
}

void kv_f32_to_bf16(const float *src, size_t n, uint8_t *dst) {
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &src[i], sizeof u);
        uint32_t b;
        if ((u & 0x7fffffffu) > 0x7f800000u) {
            b = (u >> 16) | 0x0040u; /* NaN stays NaN: quiet, sign and top payload kept */
        } else {
            /* round to nearest, ties to even, as torch's .to(torch.bfloat16);
             * a finite value past the largest bfloat16 rounds to infinity */
            b = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
        }
        dst[2 * i] = (uint8_t)(b & 0xffu);
        dst[2 * i + 1] = (uint8_t)(b >> 8);
    }
}

void kv_st_release(const KvSafetensors *st, uint64_t begin, uint64_t end) {
    if (st == NULL || st->map == NULL || begin >= end || end > st->data_len) return;
    const long page_l = sysconf(_SC_PAGESIZE);
    const uintptr_t page = page_l > 0 ? (uintptr_t)page_l : 4096u;
    const uintptr_t map_lo = (uintptr_t)st->map, map_hi = map_lo + st->map_len;
    /* Outward to whole pages: the map is a read-only private file mapping
     * that is never written, so a dropped page holds no private data and a
     * neighbouring tensor still used in place only faults back in from the
     * page cache. */
    uintptr_t lo = ((uintptr_t)(st->data + begin)) & ~(page - 1);
    uintptr_t hi = ((uintptr_t)(st->data + end) + page - 1) & ~(page - 1);
    if (lo < map_lo) lo = map_lo;
    if (hi > map_hi) hi = map_hi;
    if (hi > lo) (void)madvise((void *)lo, hi - lo, MADV_DONTNEED); /* advice only */
}


/* An exact non-negative integer below 2^53. */
static bool json_exact_u64(const cJSON *it, uint64_t *out) {
    if (!cJSON_IsNumber(it)) return false;
    double d = it->valuedouble;
    if (!isfinite(d) || d < 0.0 || d >= KV_ST_MAX_EXACT || d != floor(d)) return false;
    *out = (uint64_t)d;
    return true;
}

static uint64_t read_u64_le(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

static void shape_format(const int64_t *shape, int rank, char *buf, size_t size) {
    size_t used = 0;
    used += (size_t)snprintf(buf, size, "[");
    for (int i = 0; i < rank && used < size; i++) {
        used += (size_t)snprintf(buf + used, size - used, "%s%" PRId64, i ? ", " : "", shape[i]);
    }
    if (used < size) snprintf(buf + used, size - used, "]");
}

static int cmp_info_name(const void *a, const void *b) {
    return strcmp(((const KvTensorInfo *)a)->name, ((const KvTensorInfo *)b)->name);
}

static int cmp_info_begin(const void *a, const void *b) {
    const KvTensorInfo *x = *(const KvTensorInfo *const *)a;
    const KvTensorInfo *y = *(const KvTensorInfo *const *)b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* ---- numbers as written ------------------------------------------------ */

/* The next number token at or after *p, in JSON text that cJSON accepted:
 * outside strings only a number starts with '-' or a digit, and it runs
 * over [0-9+-.eE] (where strtod would stop earlier cJSON refuses the
 * text). *p moves past it; *len is 0 at the end of the text. */
static const char *json_next_number(const char **p, size_t *len) {
    const char *q = *p;
    while (*q != '\0' && *q != '-' && !(*q >= '0' && *q <= '9')) {
        if (*q == '"') {
            for (q++; *q != '\0' && *q != '"'; q++) {
                if (*q == '\\' && q[1] != '\0') q++;
            }
            if (*q == '\0') break;
        }
        q++;
    }
    const char *start = q;
    while (*q != '\0' && strchr("0123456789+-.eE", *q) != NULL) q++;
    *len = (size_t)(q - start);
    *p = q;
    return start;
}

typedef struct {
    const char *cursor; /* the header text after the last number visited */
    const char *lab;
    KvError *err;
} NumberWalk;

/* Visits the numbers under node in document order, which is the order of
 * the text's number tokens (cJSON keeps members in the order read), and
 * refuses a tensor's shape or data_offsets entry written as a float: 2.0,
 * 2e0 or -0 is a double equal to an integer to cJSON, but the reference
 * reader (serde_json into usize) refuses the file. depth: 0 the header, 1 a
 * tensor entry, 2 its field, 3 an entry of it. */
static KvStatus st_walk_numbers(NumberWalk *w, const cJSON *node, int depth, const char *tensor,
                                const char *field, int index) {
    if (cJSON_IsNumber(node)) {
        size_t n;
        const char *tok = json_next_number(&w->cursor, &n);
        const bool is_float = strcspn(tok, ".eE") < n || (tok[0] == '-' && node->valuedouble == 0.0);
        if (depth == 3 && field != NULL && is_float) {
            return kv_error_set(w->err, KV_ERR_INPUT,
                                "%s: tensor '%s': field '%s[%d]': expected an integer written "
                                "without a fraction or exponent (safetensors reads shapes and "
                                "offsets as integers), found %.*s",
                                w->lab, tensor, field, index, (int)(n > 40 ? 40 : n), tok);
        }
        return KV_OK;
    }
    int k = 0;
    for (const cJSON *c = node->child; c != NULL; c = c->next, k++) {
        const char *t = depth == 0 ? c->string : tensor;
        const char *f = field;
        if (depth == 1) {
            const bool listed = t != NULL && strcmp(t, "__metadata__") != 0 && c->string != NULL &&
                                (strcmp(c->string, "shape") == 0 ||
                                 strcmp(c->string, "data_offsets") == 0);
            f = listed ? c->string : NULL;
        }
        KvStatus st = st_walk_numbers(w, c, depth + 1, t, f, k);
        if (st != KV_OK) return st;
    }
    return KV_OK;
}

/* Validates one tensor entry and fills *info; data_len bounds the offsets. */
static KvStatus parse_tensor(const cJSON *entry, const char *lab, uint64_t data_len,
                             KvTensorInfo *info, KvError *err) {
    const char *name = entry->string;
    char found[128];
    size_t name_len = strlen(name);
    if (name_len >= KV_ST_MAX_NAME) {
        return kv_error_set(err, KV_ERR_INPUT,
                            "%s: tensor '%.64s...': name: expected fewer than %d bytes, found %zu",
                            lab, name, KV_ST_MAX_NAME, name_len);
    }
    memcpy(info->name, name, name_len + 1);
    if (!cJSON_IsObject(entry)) {
        kv_json_describe(entry, found, sizeof found);
        return kv_error_set(err, KV_ERR_INPUT,
                            "%s: tensor '%s': expected an object {dtype, shape, data_offsets}, "
                            "found %s",
                            lab, name, found);
    }

    const cJSON *dtype = cJSON_GetObjectItemCaseSensitive(entry, "dtype");
    if (!cJSON_IsString(dtype)) {
        kv_json_describe(dtype, found, sizeof found);
        return kv_error_set(err, KV_ERR_INPUT,
                            "%s: tensor '%s': field 'dtype': expected a string, found %s", lab,
                            name, found);
    }
    if (!kv_dtype_from_name(dtype->valuestring, &info->dtype)) {
        kv_json_describe(dtype, found, sizeof found);
        return kv_error_set(err, KV_ERR_INPUT,
                            "%s: tensor '%s': field 'dtype': expected a safetensors dtype "
                            "(F32, F16, BF16, I64, ...), found %s, an unknown name",
                            lab, name, found);
    }

    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(entry, "shape");
    if (!cJSON_IsArray(shape)) {
        kv_json_describe(shape, found, sizeof found);
        return kv_error_set(err, KV_ERR_INPUT,
                            "%s: tensor '%s': field 'shape': expected an array, found %s", lab,
                            name, found);
    }
    int rank = cJSON_GetArraySize(shape);
    if (rank > KV_ST_MAX_RANK) {
        return kv_error_set(err, KV_ERR_INPUT,
                            "%s: tensor '%s': field 'shape': expected at most %d dimensions, "
                            "found %d",
                            lab, name, KV_ST_MAX_RANK, rank);
    }
    info->rank = rank;
    uint64_t numel = 1;
    bool numel_overflow = false;
    int d = 0;
    for (const cJSON *dim = shape->child; dim != NULL; dim = dim->next, d++) {
        uint64_t v;
        if (!json_exact_u64(dim, &v)) {
            kv_json_describe(dim, found, sizeof found);
            return kv_error_set(err, KV_ERR_INPUT,
                                "%s: tensor '%s': field 'shape[%d]': expected an integer >= 0 "
                                "(and < 2^53), found %s",
                                lab, name, d, found);
        }
        info->shape[d] = (int64_t)v;
        if (__builtin_mul_overflow(numel, v, &numel)) numel_overflow = true;
    }

    const cJSON *offs = cJSON_GetObjectItemCaseSensitive(entry, "data_offsets");
    if (!cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2) {
        kv_json_describe(offs, found, sizeof found);
        return kv_error_set(err, KV_ERR_INPUT,
                            "%s: tensor '%s': field 'data_offsets': expected an array "
                            "[begin, end], found %s",
                            lab, name, found);
    }
    for (int i = 0; i < 2; i++) {
        const cJSON *o = cJSON_GetArrayItem(offs, i);
        uint64_t v;
        if (!json_exact_u64(o, &v)) {
            kv_json_describe(o, found, sizeof found);
            return kv_error_set(err, KV_ERR_INPUT,
                                "%s: tensor '%s': field 'data_offsets[%d]': expected an integer "
                                ">= 0 (and < 2^53), found %s",
                                lab, name, i, found);
        }
        if (i == 0) {
            info->begin = v;
        } else {
            info->end = v;
        }
    }
    if (info->begin > info->end) {
        return kv_error_set(err, KV_ERR_INPUT,
                            "%s: tensor '%s': field 'data_offsets': expected begin <= end, "
                            "found [%" PRIu64 ", %" PRIu64 "]",
                            lab, name, info->begin, info->end);
    }
    if (info->end > data_len) {
        return kv_error_set(err, KV_ERR_INPUT,
                            "%s: tensor '%s': field 'data_offsets': expected end <= %" PRIu64
                            " (the data section), found [%" PRIu64 ", %" PRIu64 "] out of bounds",
                            lab, name, data_len, info->begin, info->end);
    }

    char shp[160];
    shape_format(info->shape, info->rank, shp, sizeof shp);
    uint64_t bits = kv_dtype_bits(info->dtype);
    uint64_t total_bits;
    if (numel_overflow || __builtin_mul_overflow(numel, bits, &total_bits)) {
        return kv_error_set(err, KV_ERR_INPUT,
                            "%s: tensor '%s': field 'shape': expected a size that fits in 64 "
                            "bits, found %s of %s",
                            lab, name, shp, kv_dtype_name(info->dtype));
    }
    if (total_bits % 8 != 0) {
        return kv_error_set(err, KV_ERR_INPUT,
                            "%s: tensor '%s': field 'shape': expected a whole number of bytes, "
                            "found %s of %s (%" PRIu64 " bits)",
                            lab, name, shp, kv_dtype_name(info->dtype), total_bits);
    }
    uint64_t want = total_bits / 8;
    if (info->end - info->begin != want) {
        return kv_error_set(err, KV_ERR_INPUT,
                            "%s: tensor '%s': field 'data_offsets': expected %" PRIu64
                            " bytes (shape %s of %s), found [%" PRIu64 ", %" PRIu64 "] = %" PRIu64
                            " bytes",
                            lab, name, want, shp, kv_dtype_name(info->dtype), info->begin,
                            info->end, info->end - info->begin);
    }
    return KV_OK;
}

static KvStatus parse_metadata(const cJSON *meta, const char *lab, KvError *err) {
    char found[128];
    if (!cJSON_IsObject(meta)) {
        kv_json_describe(meta, found, sizeof found);
        return kv_error_set(err, KV_ERR_INPUT,
                            "%s: field '__metadata__': expected an object of strings, found %s",
                            lab, found);
    }
    for (const cJSON *it = meta->child; it != NULL; it = it->next) {
        if (!cJSON_IsString(it)) {
            kv_json_describe(it, found, sizeof found);
            return kv_error_set(err, KV_ERR_INPUT,
                                "%s: field '__metadata__.%.64s': expected a string, found %s", lab,
                                it->string, found);
        }
    }
    return KV_OK;
}

KvStatus kv_st_parse(const uint8_t *bytes, size_t len, const char *label, KvSafetensors *out,
                     KvError *err) {
    const char *lab = label != NULL ? label : "safetensors";
    KvStatus st = KV_OK;
    char *text = NULL;
    cJSON *root = NULL;
    KvTensorInfo *tab = NULL;
    KvTensorInfo **by_begin = NULL;
    char found[128];

    memset(out, 0, sizeof *out);
    if (bytes == NULL) len = 0;
    if (len < 8) {
        st = kv_error_set(err, KV_ERR_INPUT,
                          "%s: file is %zu bytes, expected at least 8 (the header length)", lab,
                          len);
        goto cleanup;
    }
    uint64_t hlen = read_u64_le(bytes);
    uint64_t avail = (uint64_t)len - 8; /* compare against this: hlen + 8 may wrap */
    if (hlen > avail) {
        st = kv_error_set(err, KV_ERR_INPUT,
                          "%s: header length %" PRIu64 ": expected at most %" PRIu64
                          " (the bytes after the 8-byte prefix), found past the end of file",
                          lab, hlen, avail);
        goto cleanup;
    }
    if (hlen > KV_ST_MAX_HEADER) {
        st = kv_error_set(err, KV_ERR_INPUT,
                          "%s: header length %" PRIu64 ": expected at most %llu, found too large",
                          lab, hlen, KV_ST_MAX_HEADER);
        goto cleanup;
    }
    const uint8_t *hdr = bytes + 8;
    const void *nul = memchr(hdr, 0, (size_t)hlen);
    if (nul != NULL) {
        st = kv_error_set(err, KV_ERR_INPUT,
                          "%s: header: expected JSON text, found a NUL byte at offset %td", lab,
                          (const uint8_t *)nul - hdr);
        goto cleanup;
    }
    /* The format's README: the header MUST begin with '{'; whitespace is
     * allowed only after the object, as padding. (The reference reader does
     * not enforce this yet: its check waits for format version 0.4.) */
    if (hlen == 0 || hdr[0] != '{') {
        char first[32];
        if (hlen == 0) {
            snprintf(first, sizeof first, "an empty header");
        } else if (hdr[0] >= 0x20 && hdr[0] < 0x7f) {
            snprintf(first, sizeof first, "'%c'", hdr[0]);
        } else {
            snprintf(first, sizeof first, "the byte 0x%02x", hdr[0]);
        }
        st = kv_error_set(err, KV_ERR_INPUT,
                          "%s: header: expected a JSON object starting with '{' at its first "
                          "byte, found %s",
                          lab, first);
        goto cleanup;
    }
    char where[320];
    snprintf(where, sizeof where, "%s: header", lab);
    st = kv_file_check_json_text((const char *)hdr, (size_t)hlen, where, err);
    if (st != KV_OK) goto cleanup;
    /* cJSON wants a terminated string; the copy also keeps the parser from
     * ever reading past the header, whatever the input. */
    text = malloc((size_t)hlen + 1);
    if (text == NULL) {
        st = kv_error_set(err, KV_ERR_INTERNAL, "%s: out of memory for a %" PRIu64 "-byte header",
                          lab, hlen);
        goto cleanup;
    }
    memcpy(text, hdr, (size_t)hlen);
    text[hlen] = '\0';
    const char *end = NULL;
    root = cJSON_ParseWithOpts(text, &end, 0);
    if (root == NULL) {
        size_t at = end != NULL && end >= text ? (size_t)(end - text) : 0;
        st = kv_error_set(err, KV_ERR_INPUT,
                          "%s: header: expected valid JSON, found a syntax error near byte %zu "
                          "of %" PRIu64,
                          lab, at, hlen);
        goto cleanup;
    }
    for (const char *p = end; *p; p++) {
        /* Only whitespace may follow: writers pad the header with spaces to
         * align the data section, and the reference reader (serde_json)
         * accepts any JSON whitespace there. */
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
            st = kv_error_set(err, KV_ERR_INPUT,
                              "%s: header: expected only whitespace after the JSON object, "
                              "found trailing data at byte %td",
                              lab, p - text);
            goto cleanup;
        }
    }
    if (!cJSON_IsObject(root)) {
        kv_json_describe(root, found, sizeof found);
        st = kv_error_set(err, KV_ERR_INPUT, "%s: header: expected a JSON object, found %s", lab,
                          found);
        goto cleanup;
    }

    /* No key twice at any level: the tensor names (one name, one tensor),
     * "__metadata__", and each entry's fields (serde refuses a repeated
     * "dtype"; cJSON would read the first). */
    st = kv_file_check_json_keys(root, where, "key", err);
    if (st != KV_OK) goto cleanup;
    NumberWalk walk = {.cursor = text, .lab = lab, .err = err};
    st = st_walk_numbers(&walk, root, 0, NULL, NULL, 0);
    if (st != KV_OK) goto cleanup;

    uint64_t data_len = avail - hlen;
    /* n is bounded by the header: an entry takes at least ~40 bytes of
     * KV_ST_MAX_HEADER, so the table is at most a few hundred MB, less than
     * cJSON's own tree of the same header. */
    size_t n = 0;
    for (const cJSON *it = root->child; it != NULL; it = it->next) {
        if (strcmp(it->string, "__metadata__") == 0) {
            st = parse_metadata(it, lab, err);
            if (st != KV_OK) goto cleanup;
        } else {
            n++;
        }
    }
    tab = calloc(n > 0 ? n : 1, sizeof *tab);
    by_begin = calloc(n > 0 ? n : 1, sizeof *by_begin);
    if (tab == NULL || by_begin == NULL) {
        st = kv_error_set(err, KV_ERR_INTERNAL, "%s: out of memory for %zu tensors", lab, n);
        goto cleanup;
    }
    size_t i = 0;
    for (const cJSON *it = root->child; it != NULL; it = it->next) {
        if (strcmp(it->string, "__metadata__") == 0) continue;
        st = parse_tensor(it, lab, data_len, &tab[i], err);
        if (st != KV_OK) goto cleanup;
        i++;
    }

    /* Names are unique (checked above); sorted for kv_st_find. */
    qsort(tab, n, sizeof *tab, cmp_info_name);

    /* The format's rule (the reference reader's Metadata::validate): sorted
     * by (begin, end), each tensor begins where the previous one ended, and
     * the last ends at the end of the file. So no overlap (two names for the
     * same bytes), no hole and no trailing bytes (room for a second file
     * inside this one, a polyglot), and an empty tensor sits at a boundary. */
    for (i = 0; i < n; i++) by_begin[i] = &tab[i];
    qsort(by_begin, n, sizeof *by_begin, cmp_info_begin);
    const KvTensorInfo *prev = NULL;
    uint64_t covered = 0; /* the data section is tiled up to here */
    for (i = 0; i < n; i++) {
        const KvTensorInfo *t = by_begin[i];
        if (t->begin < covered) {
            st = kv_error_set(err, KV_ERR_INPUT,
                              "%s: tensor '%s': field 'data_offsets': expected no overlap with "
                              "other tensors, found [%" PRIu64 ", %" PRIu64
                              "] overlapping tensor '%s' [%" PRIu64 ", %" PRIu64 "]",
                              lab, t->name, t->begin, t->end, prev->name, prev->begin, prev->end);
            goto cleanup;
        }
        if (t->begin > covered) {
            char after[KV_ST_MAX_NAME + 32];
            if (prev == NULL) {
                snprintf(after, sizeof after, "the start of the data section");
            } else {
                snprintf(after, sizeof after, "the end of tensor '%s'", prev->name);
            }
            st = kv_error_set(err, KV_ERR_INPUT,
                              "%s: tensor '%s': field 'data_offsets': expected to begin at %" PRIu64
                              " (%s: the tensors must cover the data section without gaps), "
                              "found [%" PRIu64 ", %" PRIu64 "], a gap of %" PRIu64 " bytes",
                              lab, t->name, covered, after, t->begin, t->end, t->begin - covered);
            goto cleanup;
        }
        covered = t->end;
        prev = t;
    }
    if (covered != data_len) {
        char last[KV_ST_MAX_NAME + 48];
        if (prev == NULL) {
            snprintf(last, sizeof last, "there are no tensors");
        } else {
            snprintf(last, sizeof last, "the end of the last tensor, '%s'", prev->name);
        }
        st = kv_error_set(err, KV_ERR_INPUT,
                          "%s: data section: expected %" PRIu64 " bytes (%s), found %" PRIu64
                          ": %" PRIu64 " trailing bytes that no tensor covers",
                          lab, covered, last, data_len, data_len - covered);
        goto cleanup;
    }

    out->data = bytes + 8 + hlen;
    out->data_len = data_len;
    out->tensors = tab;
    out->n_tensors = n;
    snprintf(out->label, sizeof out->label, "%s", lab);
    tab = NULL;

cleanup:
    free(by_begin);
    free(tab);
    cJSON_Delete(root);
    free(text);
    if (st != KV_OK) memset(out, 0, sizeof *out);
    return st;
}

KvStatus kv_st_open(const char *path, KvSafetensors *out, KvError *err) {
    KvStatus st = KV_OK;
    int fd = -1;
    void *map = NULL;
    size_t map_len = 0;
    struct stat sb;

    memset(out, 0, sizeof *out);
    st = kv_file_open_regular(path, &fd, &sb, err);
    if (st != KV_OK) goto cleanup;
    /* mmap of 0 bytes fails and a shorter file cannot hold the length
     * prefix: report it here as a format error, not a mapping error. */
    if (sb.st_size < 8) {
        st = kv_error_set(err, KV_ERR_INPUT,
                          "%s: file is %lld bytes, expected at least 8 (the header length)", path,
                          (long long)sb.st_size);
        goto cleanup;
    }
    if ((uint64_t)sb.st_size > (uint64_t)SIZE_MAX) {
        st = kv_error_set(err, KV_ERR_INPUT, "%s: file is %lld bytes, too large to map", path,
                          (long long)sb.st_size);
        goto cleanup;
    }
    map_len = (size_t)sb.st_size;
    map = mmap(NULL, map_len, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) {
        map = NULL;
        st = kv_error_set(err, KV_ERR_INPUT, "%s: cannot map: %s", path, strerror(errno));
        goto cleanup;
    }
    st = kv_st_parse(map, map_len, path, out, err);
    if (st != KV_OK) goto cleanup;
    out->map = map;
    out->map_len = map_len;
    map = NULL;

cleanup:
    if (map != NULL) munmap(map, map_len);
    if (fd >= 0) close(fd);
    if (st != KV_OK) memset(out, 0, sizeof *out);
    return st;
}

void kv_st_close(KvSafetensors *st) {
    if (st == NULL) return;
    free(st->tensors);
    if (st->map != NULL) munmap(st->map, st->map_len);
    memset(st, 0, sizeof *st);
}

const KvTensorInfo *kv_st_find(const KvSafetensors *st, const char *name) {
    if (st == NULL || name == NULL) return NULL;
    size_t lo = 0, hi = st->n_tensors;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(name, st->tensors[mid].name);
        if (c == 0) return &st->tensors[mid];
        if (c < 0) {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    return NULL;
}

static int cmp_cstr_ptr(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* A JSON number written from the exact integer, bypassing cJSON's double
 * printing (which switches to exponent form for large values). */
static cJSON *json_raw_u64(uint64_t v) {
    char buf[32];
    snprintf(buf, sizeof buf, "%" PRIu64, v);
    return cJSON_CreateRaw(buf);
}

/* The header of a safetensors file for tensors (in the given order): the
 * 8-byte length, the JSON text and the spaces that put the data section at a
 * multiple of 8, as one malloc'd prefix. need_data: a tensor with bytes must
 * have its data pointer (the in-memory serialiser copies from it; a streaming
 * writer produces the bytes itself). */
static KvStatus st_header_build(const KvStWriteTensor *tensors, size_t n, bool need_data,
                                uint8_t **prefix_out, size_t *prefix_len, uint64_t *data_len_out,
                                uint64_t *nbytes_out /* (n) or NULL */, KvError *err) {
    KvStatus st = KV_OK;
    uint64_t *nbytes = NULL;
    const char **names = NULL;
    cJSON *root = NULL;
    char *header = NULL;
    uint8_t *prefix = NULL;

    *prefix_out = NULL;
    *prefix_len = 0;
    *data_len_out = 0;
    nbytes = calloc(n > 0 ? n : 1, sizeof *nbytes);
    names = calloc(n > 0 ? n : 1, sizeof *names);
    root = cJSON_CreateObject();
    if (nbytes == NULL || names == NULL || root == NULL) goto oom;

    uint64_t data_len = 0;
    for (size_t i = 0; i < n; i++) {
        const KvStWriteTensor *t = &tensors[i];
        if (t->name == NULL || strlen(t->name) >= KV_ST_MAX_NAME ||
            strcmp(t->name, "__metadata__") == 0) {
            st = kv_error_set(err, KV_ERR_INPUT,
                              "safetensors writer: tensor %zu: expected a name shorter than %d "
                              "bytes (not __metadata__), found %s",
                              i, KV_ST_MAX_NAME, t->name == NULL ? "NULL" : "a bad name");
            goto cleanup;
        }
        size_t esize = kv_dtype_size(t->dtype);
        if (esize == 0) {
            st = kv_error_set(err, KV_ERR_INPUT,
                              "safetensors writer: tensor '%s': expected a whole-byte dtype, "
                              "found %s",
                              t->name, kv_dtype_name(t->dtype));
            goto cleanup;
        }
        if (t->rank < 0 || t->rank > KV_ST_MAX_RANK) {
            st = kv_error_set(err, KV_ERR_INPUT,
                              "safetensors writer: tensor '%s': expected rank 0..%d, found %d",
                              t->name, KV_ST_MAX_RANK, t->rank);
            goto cleanup;
        }
        uint64_t numel = 1;
        for (int d = 0; d < t->rank; d++) {
            if (t->shape[d] < 0 || (double)t->shape[d] >= KV_ST_MAX_EXACT ||
                __builtin_mul_overflow(numel, (uint64_t)t->shape[d], &numel)) {
                st = kv_error_set(err, KV_ERR_INPUT,
                                  "safetensors writer: tensor '%s': shape[%d]: expected an "
                                  "integer in [0, 2^53) with a representable size, found %" PRId64,
                                  t->name, d, t->shape[d]);
                goto cleanup;
            }
        }
        if (__builtin_mul_overflow(numel, (uint64_t)esize, &nbytes[i]) ||
            __builtin_add_overflow(data_len, nbytes[i], &data_len) ||
            (double)data_len >= KV_ST_MAX_EXACT) {
            st = kv_error_set(err, KV_ERR_INPUT,
                              "safetensors writer: tensor '%s': expected a total size below "
                              "2^53 bytes, found more",
                              t->name);
            goto cleanup;
        }
        if (need_data && nbytes[i] > 0 && t->data == NULL) {
            st = kv_error_set(err, KV_ERR_INPUT,
                              "safetensors writer: tensor '%s': expected data, found NULL",
                              t->name);
            goto cleanup;
        }
        names[i] = t->name;
    }
    qsort(names, n, sizeof *names, cmp_cstr_ptr);
    for (size_t i = 1; i < n; i++) {
        if (strcmp(names[i - 1], names[i]) == 0) {
            st = kv_error_set(err, KV_ERR_INPUT,
                              "safetensors writer: tensor '%s': expected a unique name, found a "
                              "duplicate",
                              names[i]);
            goto cleanup;
        }
    }

    cJSON *meta = cJSON_AddObjectToObject(root, "__metadata__");
    if (meta == NULL || cJSON_AddStringToObject(meta, "format", "pt") == NULL) goto oom;
    uint64_t off = 0;
    for (size_t i = 0; i < n; i++) {
        const KvStWriteTensor *t = &tensors[i];
        cJSON *e = cJSON_AddObjectToObject(root, t->name);
        if (e == NULL || cJSON_AddStringToObject(e, "dtype", kv_dtype_name(t->dtype)) == NULL)
            goto oom;
        cJSON *shape = cJSON_AddArrayToObject(e, "shape");
        cJSON *offs = cJSON_AddArrayToObject(e, "data_offsets");
        if (shape == NULL || offs == NULL) goto oom;
        for (int d = 0; d < t->rank; d++) {
            cJSON *v = json_raw_u64((uint64_t)t->shape[d]);
            if (v == NULL || !cJSON_AddItemToArray(shape, v)) {
                cJSON_Delete(v);
                goto oom;
            }
        }
        uint64_t pair[2] = {off, off + nbytes[i]};
        for (int k = 0; k < 2; k++) {
            cJSON *v = json_raw_u64(pair[k]);
            if (v == NULL || !cJSON_AddItemToArray(offs, v)) {
                cJSON_Delete(v);
                goto oom;
            }
        }
        off += nbytes[i];
    }
    header = cJSON_PrintUnformatted(root);
    if (header == NULL) goto oom;

    size_t hlen = strlen(header);
    size_t pad = (8 - (8 + hlen) % 8) % 8; /* data section starts 8-aligned */
    size_t plen = 8 + hlen + pad;
    prefix = malloc(plen);
    if (prefix == NULL) goto oom;
    uint64_t n_hdr = hlen + pad;
    for (int b = 0; b < 8; b++) prefix[b] = (uint8_t)(n_hdr >> (8 * b));
    memcpy(prefix + 8, header, hlen);
    memset(prefix + 8 + hlen, ' ', pad);
    if (nbytes_out != NULL && n > 0) memcpy(nbytes_out, nbytes, n * sizeof *nbytes);
    *prefix_out = prefix;
    *prefix_len = plen;
    *data_len_out = data_len;
    prefix = NULL;
    goto cleanup;

oom:
    st = kv_error_set(err, KV_ERR_INTERNAL, "safetensors writer: out of memory");
cleanup:
    free(prefix);
    free(header);
    cJSON_Delete(root);
    free(names);
    free(nbytes);
    return st;
}

KvStatus kv_st_header(const KvStWriteTensor *tensors, size_t n, uint8_t **prefix,
                      size_t *prefix_len, uint64_t *data_len, KvError *err) {
    return st_header_build(tensors, n, false, prefix, prefix_len, data_len, NULL, err);
}

KvStatus kv_st_serialize(const KvStWriteTensor *tensors, size_t n, uint8_t **out, size_t *out_len,
                         KvError *err) {
    KvStatus st = KV_OK;
    uint64_t *nbytes = NULL;
    uint8_t *prefix = NULL;
    uint8_t *img = NULL;
    size_t plen = 0;
    uint64_t data_len = 0;

    *out = NULL;
    *out_len = 0;
    nbytes = calloc(n > 0 ? n : 1, sizeof *nbytes);
    if (nbytes == NULL) goto oom;
    st = st_header_build(tensors, n, true, &prefix, &plen, &data_len, nbytes, err);
    if (st != KV_OK) goto cleanup;
    uint64_t total = (uint64_t)plen + data_len;
    if (total > (uint64_t)SIZE_MAX) goto oom;
    img = kv_big_alloc((size_t)total); /* weights are streamed every decode step */
    if (img == NULL) goto oom;
    memcpy(img, prefix, plen);
    uint8_t *dst = img + plen;
    for (size_t i = 0; i < n; i++) {
        if (nbytes[i] > 0) memcpy(dst, tensors[i].data, (size_t)nbytes[i]);
        dst += nbytes[i];
    }
    *out = img;
    *out_len = (size_t)total;
    img = NULL;
    goto cleanup;

oom:
    st = kv_error_set(err, KV_ERR_INTERNAL, "safetensors writer: out of memory");
cleanup:
    free(img);
    free(prefix);
    free(nbytes);
    return st;
}
