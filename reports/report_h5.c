/* report_h5.c: KvReport <-> HDF5 (reports/SCHEMA.md).
 *
 * Written in the netCDF-C style: every HDF5 call is checked, handles start as
 * H5I_INVALID_HID and are closed in reverse order at one exit label, HDF5's
 * automatic error printing is off for the duration of a call and the
 * innermost entry of the error stack is copied into the KvError.
 *
 * Reproducible bytes come from: v1.8 format bounds (low = high = V18, so a
 * newer library cannot pick newer object versions), no object timestamps
 * (H5Pset_obj_track_times(.., 0) on the root via the file creation list, on
 * every group and on every dataset), links and attributes kept compact in the
 * object headers (no fractal heaps), explicit zero fill values, fixed-length
 * strings copied into zeroed buffers, compound rows staged in calloc'd
 * memory, and a fixed creation order. The file is built in memory and
 * reaches the disk through kv_report_file_publish (report.h).
 *
 * The reader treats the file as hostile input: no size is used before it is
 * checked against the caps (report_h5.h), the other sizes and the file's
 * stored bytes, no link but a hard link is taken, and every object it walks
 * must be one the schema names. */
#include "report_h5.h"

#include <errno.h>
#include <fcntl.h>
#include <hdf5.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define KV_H5_DEFLATE_LEVEL 4
#define KV_H5_HEX_LEN 17    /* "%016" PRIx64 plus NUL */
#define KV_H5_VERDICT_LEN 8 /* "PASS", "FAIL", "SKIP" */
#define KV_H5_DIVERGENCE_LEN 512
/* Links and attributes stay in the object header up to this many (HDF5's
 * limit is 65535); dense storage would bring in fractal heaps and B-trees,
 * which buy nothing at our sizes and are more bytes to keep deterministic. */
#define KV_H5_MAX_COMPACT 65535
/* The writer's in-memory file grows by this much at a time (the core
 * driver's increment): large enough that a gate report needs few
 * reallocations, small enough to waste little on a tiny one. */
#define KV_H5_CORE_INCREMENT ((size_t)1 << 20)
/* Appended to the path to name the writer's in-memory file (see
 * kv_report_write_h5). */
#define KV_H5_MEMORY_LABEL "/(kvrepro in-memory file)"

/* Who a message is about: the path the caller gave (never the temporary);
 * when reading, what the file may still make the reader allocate. */
typedef struct {
    const char *path;
    KvError *err;
    uint64_t file_size; /* reading: the file's size in bytes */
    uint64_t budget;    /* reading: bytes still allowed (KV_REPORT_MAX_READ_BYTES) */
} ReportCtx;

/* ---- errors --------------------------------------------------------------- */

typedef struct {
    char func[64];
    char desc[320];
    bool have;
} InnermostError;

/* H5E_WALK_UPWARD starts at the most specific entry (n == 0): the one that
 * says "truncated file" rather than "unable to open file". */
static herr_t h5_walk_innermost(unsigned n, const H5E_error2_t *e, void *data) {
    InnermostError *in = data;
    if (n == 0 && e != NULL) {
        snprintf(in->func, sizeof in->func, "%s", e->func_name != NULL ? e->func_name : "?");
        snprintf(in->desc, sizeof in->desc, "%s", e->desc != NULL ? e->desc : "?");
        in->have = true;
    }
    return 0;
}

/* A failure with no HDF5 error behind it: "<path>: <what>". */
static KvStatus report_fail(ReportCtx *c, KvStatus st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static KvStatus report_fail(ReportCtx *c, KvStatus st, const char *fmt, ...) {
    char what[900];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return kv_error_set(c->err, st, "%s: %s", c->path, what);
}

/* A failed HDF5 call: "<path>: <what> (HDF5 <func>: <desc>)". Unexpected
 * (internal) failures also get the whole stack on stderr. */
static KvStatus h5_fail(ReportCtx *c, KvStatus st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static KvStatus h5_fail(ReportCtx *c, KvStatus st, const char *fmt, ...) {
    char what[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    InnermostError in = {.have = false};
    if (H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, h5_walk_innermost, &in) < 0) in.have = false;
    if (in.have) {
        kv_error_set(c->err, st, "%s: %s (HDF5 %s: %s)", c->path, what, in.func, in.desc);
    } else {
        kv_error_set(c->err, st, "%s: %s", c->path, what);
    }
    if (st == KV_ERR_INTERNAL && H5Eprint2(H5E_DEFAULT, stderr) < 0) {
        fprintf(stderr, "kvrepro: (the HDF5 error stack could not be printed)\n");
    }
    if (H5Eclear2(H5E_DEFAULT) < 0) {
        /* stale entries could only precede the next failure's own; the
         * message above is already complete */
    }
    return st;
}

/* Closes id when valid; a failed close is an error only if nothing failed
 * before it (the first failure is the one worth reporting). */
static void h5_close(herr_t (*close_fn)(hid_t), hid_t id, const char *what, KvStatus *st,
                     ReportCtx *c) {
    if (id < 0) return;
    if (close_fn(id) < 0 && *st == KV_OK) {
        *st = h5_fail(c, KV_ERR_INTERNAL, "%s: cannot close", what);
    }
}

/* HDF5's automatic stack printing, off between begin and end. */
typedef struct {
    H5E_auto2_t func;
    void *data;
    bool saved;
} QuietErrors;

static KvStatus h5_quiet_begin(QuietErrors *q, ReportCtx *c) {
    q->saved = false;
    if (H5Eget_auto2(H5E_DEFAULT, &q->func, &q->data) < 0) {
        return report_fail(c, KV_ERR_INTERNAL, "cannot query HDF5 error printing");
    }
    q->saved = true;
    if (H5Eset_auto2(H5E_DEFAULT, NULL, NULL) < 0) {
        return report_fail(c, KV_ERR_INTERNAL, "cannot turn HDF5 error printing off");
    }
    return KV_OK;
}

static void h5_quiet_end(QuietErrors *q, KvStatus *st, ReportCtx *c) {
    if (!q->saved) return;
    if (H5Eset_auto2(H5E_DEFAULT, q->func, q->data) < 0 && *st == KV_OK) {
        *st = report_fail(c, KV_ERR_INTERNAL, "cannot restore HDF5 error printing");
    }
}

/* ---- shared layout -------------------------------------------------------- */

/* Fixed-length string type: width bytes, UTF-8, NUL-terminated in the file.
 * Tables are read through NULLPAD memory types: a file string that fills its
 * field then arrives without a terminator and is caught (NULLTERM would cut
 * it silently). */
static KvStatus h5_string_type_pad(size_t width, H5T_str_t pad, hid_t *out, ReportCtx *c) {
    KvStatus st = KV_OK;
    hid_t t = H5I_INVALID_HID;
    *out = H5I_INVALID_HID;
    t = H5Tcopy(H5T_C_S1);
    if (t < 0 || H5Tset_size(t, width) < 0 || H5Tset_strpad(t, pad) < 0 ||
        H5Tset_cset(t, H5T_CSET_UTF8) < 0) {
        st = h5_fail(c, KV_ERR_INTERNAL, "cannot make a string type of %zu bytes", width);
        goto exit;
    }
    *out = t;
    t = H5I_INVALID_HID;
exit:
    h5_close(H5Tclose, t, "string type", &st, c);
    return st;
}

static KvStatus h5_string_type(size_t width, hid_t *out, ReportCtx *c) {
    return h5_string_type_pad(width, H5T_STR_NULLTERM, out, c);
}

/* Compound tables: one member list gives the memory type (native, at the
 * staging struct's offsets) and the file type (little-endian, packed). */
typedef enum { COL_I32, COL_I64, COL_F64, COL_STR } ColumnKind;

typedef struct {
    const char *name;
    ColumnKind kind;
    size_t offset; /* in the staging struct */
    size_t width;  /* COL_STR: bytes including the terminator */
} Column;

static size_t member_file_size(const Column *m) {
    switch (m->kind) {
    case COL_I32: return 4;
    case COL_I64: return 8;
    case COL_F64: return 8;
    case COL_STR: return m->width;
    }
    return 0;
}

static const char *member_kind_text(ColumnKind k) {
    switch (k) {
    case COL_I32: return "an integer";
    case COL_I64: return "an integer";
    case COL_F64: return "a float";
    case COL_STR: return "a fixed-length string";
    }
    return "?";
}

static KvStatus h5_compound_type(const Column *m, size_t n, size_t row_size, bool file, hid_t *out,
                                 ReportCtx *c) {
    KvStatus st = KV_OK;
    hid_t t = H5I_INVALID_HID, str = H5I_INVALID_HID;
    *out = H5I_INVALID_HID;
    size_t size = row_size;
    if (file) {
        size = 0;
        for (size_t i = 0; i < n; i++) size += member_file_size(&m[i]);
    }
    t = H5Tcreate(H5T_COMPOUND, size);
    if (t < 0) {
        st = h5_fail(c, KV_ERR_INTERNAL, "cannot create a compound type");
        goto exit;
    }
    size_t off = 0;
    for (size_t i = 0; i < n; i++) {
        hid_t mt = H5I_INVALID_HID;
        switch (m[i].kind) {
        case COL_I32: mt = file ? H5T_STD_I32LE : H5T_NATIVE_INT32; break;
        case COL_I64: mt = file ? H5T_STD_I64LE : H5T_NATIVE_INT64; break;
        case COL_F64: mt = file ? H5T_IEEE_F64LE : H5T_NATIVE_DOUBLE; break;
        case COL_STR:
            st = h5_string_type(m[i].width, &str, c);
            if (st != KV_OK) goto exit;
            mt = str;
            break;
        }
        if (H5Tinsert(t, m[i].name, file ? off : m[i].offset, mt) < 0) {
            st = h5_fail(c, KV_ERR_INTERNAL, "cannot add member %s to a compound type", m[i].name);
            goto exit;
        }
        off += member_file_size(&m[i]);
        h5_close(H5Tclose, str, "string type", &st, c);
        str = H5I_INVALID_HID;
        if (st != KV_OK) goto exit;
    }
    *out = t;
    t = H5I_INVALID_HID;
exit:
    h5_close(H5Tclose, str, "string type", &st, c);
    h5_close(H5Tclose, t, "compound type", &st, c);
    return st;
}

/* Staging rows: fixed-width fields, calloc'd so padding bytes are zero. */
typedef struct {
    char name[KV_NAME_LEN];
    double value;
    char reason[160];
} TolRow;

typedef struct {
    int32_t kind;
    int64_t run_a, run_b;
    int32_t verdict;
    char message[512];
    int64_t first_step, first_row, first_probe, near_ties;
    double max_abs_err, max_rel_err, nmse, kl, top1_agreement;
} CmpRow;

typedef struct {
    int64_t index;
    char model[KV_NAME_LEN];
    char scenario[KV_NAME_LEN];
    char variant[KV_NAME_LEN];
    char backend[16];
    char mode[16];
    int32_t repeat;
    int32_t verdict;
    char verdict_name[KV_H5_VERDICT_LEN];
    char first_divergence[KV_H5_DIVERGENCE_LEN];
    double max_rel_err;
    int64_t graphs_captured;
} SummaryRow;

#define MEMBER(T, f, k)                                                                            \
    { #f, k, offsetof(T, f), sizeof(((T *)0)->f) }

static const Column TOL_MEMBERS[] = {
    MEMBER(TolRow, name, COL_STR),
    MEMBER(TolRow, value, COL_F64),
    MEMBER(TolRow, reason, COL_STR),
};

static const Column CMP_MEMBERS[] = {
    MEMBER(CmpRow, kind, COL_I32),        MEMBER(CmpRow, run_a, COL_I64),
    MEMBER(CmpRow, run_b, COL_I64),       MEMBER(CmpRow, verdict, COL_I32),
    MEMBER(CmpRow, message, COL_STR),     MEMBER(CmpRow, first_step, COL_I64),
    MEMBER(CmpRow, first_row, COL_I64),   MEMBER(CmpRow, first_probe, COL_I64),
    MEMBER(CmpRow, near_ties, COL_I64),   MEMBER(CmpRow, max_abs_err, COL_F64),
    MEMBER(CmpRow, max_rel_err, COL_F64), MEMBER(CmpRow, nmse, COL_F64),
    MEMBER(CmpRow, kl, COL_F64),          MEMBER(CmpRow, top1_agreement, COL_F64),
};

static const Column SUMMARY_MEMBERS[] = {
    MEMBER(SummaryRow, index, COL_I64),        MEMBER(SummaryRow, model, COL_STR),
    MEMBER(SummaryRow, scenario, COL_STR),     MEMBER(SummaryRow, variant, COL_STR),
    MEMBER(SummaryRow, backend, COL_STR),      MEMBER(SummaryRow, mode, COL_STR),
    MEMBER(SummaryRow, repeat, COL_I32),       MEMBER(SummaryRow, verdict, COL_I32),
    MEMBER(SummaryRow, verdict_name, COL_STR), MEMBER(SummaryRow, first_divergence, COL_STR),
    MEMBER(SummaryRow, max_rel_err, COL_F64),  MEMBER(SummaryRow, graphs_captured, COL_I64),
};

#define N_MEMBERS(a) (sizeof(a) / sizeof((a)[0]))

_Static_assert(sizeof(int32_t) == 4 && sizeof(int64_t) == 8 && sizeof(double) == 8,
               "the file types assume 4- and 8-byte members");

/* Run group name: the index zero-padded to 4 digits ("0000"), wider past 9999. */
static void run_group_name(int64_t i, char *buf, size_t n) { snprintf(buf, n, "%04" PRId64, i); }

/* a * b into *out; false on overflow of size_t. */
static bool size_mul(size_t a, size_t b, size_t *out) {
    if (a != 0 && b > SIZE_MAX / a) return false;
    *out = a * b;
    return true;
}

/* Element count of a shape; false when it overflows size_t. */
static bool shape_count(int rank, const hsize_t *dims, size_t *out) {
    size_t n = 1;
    for (int k = 0; k < rank; k++) {
        if (dims[k] > (hsize_t)SIZE_MAX || !size_mul(n, (size_t)dims[k], &n)) return false;
    }
    *out = n;
    return true;
}

static void shape_text(int rank, const hsize_t *dims, char *buf, size_t n) {
    size_t used = 0;
    used += (size_t)snprintf(buf, n, "(");
    for (int k = 0; k < rank && used < n; k++) {
        used += (size_t)snprintf(buf + used, n - used, "%s%llu", k > 0 ? ", " : "",
                                 (unsigned long long)dims[k]);
    }
    if (used < n) snprintf(buf + used, n - used, ")");
}

/* ---- writing -------------------------------------------------------------- */

/* A string field is writable when it has a terminator inside its size. */
static KvStatus check_field(ReportCtx *c, const char *s, size_t width, const char *what, int64_t i,
                            const char *field) {
    if (strnlen(s, width) < width) return KV_OK;
    if (i < 0) {
        return report_fail(c, KV_ERR_INPUT,
                           "%s: expected a NUL-terminated string of at most %zu bytes, found %zu "
                           "bytes without a terminator",
                           field, width - 1, width);
    }
    return report_fail(c, KV_ERR_INPUT,
                       "%s[%" PRId64 "].%s: expected a NUL-terminated string of at most %zu "
                       "bytes, found %zu bytes without a terminator",
                       what, i, field, width - 1, width);
}

#define CHECK_FIELD(obj, field, what, i)                                                           \
    do {                                                                                           \
        KvStatus cs_ = check_field(c, (obj)->field, sizeof((obj)->field), what, i, #field);        \
        if (cs_ != KV_OK) return cs_;                                                              \
    } while (0)

/* Element counts of a run's arrays (DESIGN §6 shapes). */
typedef struct {
    size_t prompt; /* batch * prompt_len */
    size_t rows;   /* steps * batch */
    size_t logits; /* steps * batch * vocab */
    size_t probes; /* steps * n_probes * batch */
} RunCounts;

static bool run_counts(const KvRun *r, RunCounts *n) {
    if (r->steps < 0 || r->batch < 0 || r->vocab < 0 || r->prompt_len < 0 || r->n_probes < 0) {
        return false;
    }
    return size_mul((size_t)r->batch, (size_t)r->prompt_len, &n->prompt) &&
           size_mul((size_t)r->steps, (size_t)r->batch, &n->rows) &&
           size_mul(n->rows, (size_t)r->vocab, &n->logits) &&
           size_mul(n->rows, (size_t)r->n_probes, &n->probes) &&
           size_mul(n->logits, sizeof(float), &(size_t){0}) &&
           size_mul(n->probes, sizeof(uint64_t), &(size_t){0});
}

/* Everything the writer relies on, checked before a file is created. */
static KvStatus report_validate(const KvReport *rep, ReportCtx *c) {
    CHECK_FIELD(rep, tool_version, "", -1);
    CHECK_FIELD(rep, git_commit, "", -1);
    CHECK_FIELD(rep, host, "", -1);
    CHECK_FIELD(rep, device, "", -1);
    CHECK_FIELD(rep, math_mode, "", -1);
    CHECK_FIELD(rep, shard, "", -1);
    if (rep->n_tolerances < 0 || rep->n_runs < 0 || rep->n_comparisons < 0 ||
        (rep->n_tolerances > 0 && rep->tolerances == NULL) ||
        (rep->n_runs > 0 && rep->runs == NULL) ||
        (rep->n_comparisons > 0 && rep->comparisons == NULL)) {
        return report_fail(c, KV_ERR_INPUT,
                           "report: expected counts >= 0 with their arrays, found %" PRId64
                           " tolerances, %" PRId64 " runs, %" PRId64 " comparisons",
                           rep->n_tolerances, rep->n_runs, rep->n_comparisons);
    }
    for (int64_t t = 0; t < rep->n_tolerances; t++) {
        CHECK_FIELD(&rep->tolerances[t], name, "tolerances", t);
        CHECK_FIELD(&rep->tolerances[t], reason, "tolerances", t);
    }
    for (int64_t i = 0; i < rep->n_runs; i++) {
        const KvRun *r = &rep->runs[i];
        CHECK_FIELD(r, model, "runs", i);
        CHECK_FIELD(r, scenario, "runs", i);
        CHECK_FIELD(r, variant, "runs", i);
        CHECK_FIELD(r, backend, "runs", i);
        CHECK_FIELD(r, mode, "runs", i);
        CHECK_FIELD(r, skip_reason, "runs", i);
        RunCounts n;
        if (!run_counts(r, &n)) {
            return report_fail(c, KV_ERR_INPUT,
                               "runs[%" PRId64 "]: expected sizes >= 0 whose products fit in "
                               "memory, found steps %" PRId64 ", batch %" PRId64 ", vocab %" PRId64
                               ", prompt_len %" PRId64 ", n_probes %" PRId64,
                               i, r->steps, r->batch, r->vocab, r->prompt_len, r->n_probes);
        }
        if (r->topk < 0 || r->topk > r->vocab) {
            return report_fail(c, KV_ERR_INPUT,
                               "runs[%" PRId64 "].topk: expected 0..vocab (%" PRId64 "), found %d",
                               i, r->vocab, (int)r->topk);
        }
        if (r->skipped) continue;
        const struct {
            const char *name;
            const void *p;
            size_t n;
        } arrays[] = {
            {"prompt", r->prompt, n.prompt},
            {"prompt_real", r->prompt_real, n.prompt},
            {"tokens", r->tokens, n.rows},
            {"logits", r->logits, r->topk > 0 ? 0 : n.logits},
            {"topk_ids", r->topk_ids, r->topk > 0 ? n.rows * (size_t)r->topk : 0},
            {"topk_values", r->topk_values, r->topk > 0 ? n.rows * (size_t)r->topk : 0},
            {"logits_hash", r->logits_hash, n.rows},
            {"margins", r->margins, n.rows},
            {"probe_names", r->probe_names, (size_t)r->n_probes},
            {"probe_hash", r->probe_hash, n.probes},
        };
        for (size_t a = 0; a < sizeof arrays / sizeof arrays[0]; a++) {
            if (arrays[a].n > 0 && arrays[a].p == NULL) {
                return report_fail(c, KV_ERR_INPUT,
                                   "runs[%" PRId64 "].%s: expected %zu elements, found NULL", i,
                                   arrays[a].name, arrays[a].n);
            }
        }
        for (int64_t p = 0; p < r->n_probes; p++) {
            if (strnlen(r->probe_names[p], KV_NAME_LEN) == KV_NAME_LEN) {
                return report_fail(c, KV_ERR_INPUT,
                                   "runs[%" PRId64 "].probe_names[%" PRId64
                                   "]: expected a NUL-terminated string of at most %d bytes, "
                                   "found %d bytes without a terminator",
                                   i, p, KV_NAME_LEN - 1, KV_NAME_LEN);
            }
        }
    }
    for (int64_t k = 0; k < rep->n_comparisons; k++) {
        const KvComparison *cmp = &rep->comparisons[k];
        CHECK_FIELD(cmp, message, "comparisons", k);
        if ((int)cmp->kind < KV_CMP_REFERENCE || (int)cmp->kind > KV_CMP_LAST ||
            (int)cmp->verdict < KV_VERDICT_PASS || (int)cmp->verdict > KV_VERDICT_SKIP ||
            cmp->run_a < 0 || cmp->run_a >= rep->n_runs || cmp->run_b < 0 ||
            cmp->run_b >= rep->n_runs) {
            return report_fail(
                c, KV_ERR_INPUT,
                "comparisons[%" PRId64 "]: expected kind 0..4, verdict 0..2 and "
                "runs 0..%" PRId64 ", found kind %d, verdict %d, runs %" PRId64 " and %" PRId64,
                k, rep->n_runs - 1, (int)cmp->kind, (int)cmp->verdict, cmp->run_a, cmp->run_b);
        }
    }
    return KV_OK;
}

/* Copies a (validated) string field into a zeroed buffer of its width. */
static void field_copy(char *dst, const char *src, size_t width) {
    memset(dst, 0, width);
    memcpy(dst, src, strnlen(src, width - 1));
}

static KvStatus h5w_attr(hid_t obj, const char *objpath, const char *name, hid_t file_type,
                         hid_t mem_type, const void *value, ReportCtx *c) {
    KvStatus st = KV_OK;
    hid_t space = H5I_INVALID_HID, attr = H5I_INVALID_HID;
    space = H5Screate(H5S_SCALAR);
    if (space < 0) {
        st = h5_fail(c, KV_ERR_INTERNAL, "%s: attribute %s: cannot create a dataspace", objpath,
                     name);
        goto exit;
    }
    attr = H5Acreate2(obj, name, file_type, space, H5P_DEFAULT, H5P_DEFAULT);
    if (attr < 0) {
        st = h5_fail(c, KV_ERR_INTERNAL, "%s: attribute %s: cannot create", objpath, name);
        goto exit;
    }
    if (H5Awrite(attr, mem_type, value) < 0) {
        st = h5_fail(c, KV_ERR_INTERNAL, "%s: attribute %s: cannot write", objpath, name);
        goto exit;
    }
exit:
    h5_close(H5Aclose, attr, name, &st, c);
    h5_close(H5Sclose, space, name, &st, c);
    return st;
}

static KvStatus h5w_attr_string(hid_t obj, const char *objpath, const char *name, const char *value,
                                size_t width, ReportCtx *c) {
    KvStatus st = KV_OK;
    hid_t type = H5I_INVALID_HID;
    char *buf = calloc(1, width);
    if (buf == NULL) {
        st = report_fail(c, KV_ERR_INTERNAL, "out of memory");
        goto exit;
    }
    field_copy(buf, value, width);
    st = h5_string_type(width, &type, c);
    if (st != KV_OK) goto exit;
    st = h5w_attr(obj, objpath, name, type, type, buf, c);
exit:
    h5_close(H5Tclose, type, "string type", &st, c);
    free(buf);
    return st;
}

static KvStatus h5w_attr_i32(hid_t obj, const char *objpath, const char *name, int32_t v,
                             ReportCtx *c) {
    return h5w_attr(obj, objpath, name, H5T_STD_I32LE, H5T_NATIVE_INT32, &v, c);
}

static KvStatus h5w_attr_i64(hid_t obj, const char *objpath, const char *name, int64_t v,
                             ReportCtx *c) {
    return h5w_attr(obj, objpath, name, H5T_STD_I64LE, H5T_NATIVE_INT64, &v, c);
}

static KvStatus h5w_attr_u64(hid_t obj, const char *objpath, const char *name, uint64_t v,
                             ReportCtx *c) {
    return h5w_attr(obj, objpath, name, H5T_STD_U64LE, H5T_NATIVE_UINT64, &v, c);
}

/* Creates and fills one dataset. chunk_steps: chunk by one leading index
 * (1, d1, ...) with shuffle + deflate, when every dimension is > 0 (a chunk
 * cannot have a zero dimension; an empty dataset is stored contiguous). */
static KvStatus h5w_dataset(hid_t group, const char *objpath, const char *name, hid_t file_type,
                            hid_t mem_type, int rank, const hsize_t *dims, const void *data,
                            bool chunk_steps, ReportCtx *c) {
    KvStatus st = KV_OK;
    hid_t dcpl = H5I_INVALID_HID, space = H5I_INVALID_HID, dset = H5I_INVALID_HID;
    void *fill = NULL;
    size_t count = 0;
    if (!shape_count(rank, dims, &count)) {
        st = report_fail(c, KV_ERR_INTERNAL, "%s/%s: shape overflows", objpath, name);
        goto exit;
    }
    const size_t elem = H5Tget_size(mem_type);
    if (elem == 0) {
        st = h5_fail(c, KV_ERR_INTERNAL, "%s/%s: cannot size the memory type", objpath, name);
        goto exit;
    }
    fill = calloc(1, elem);
    if (fill == NULL) {
        st = report_fail(c, KV_ERR_INTERNAL, "out of memory");
        goto exit;
    }
    dcpl = H5Pcreate(H5P_DATASET_CREATE);
    if (dcpl < 0 || H5Pset_obj_track_times(dcpl, 0) < 0 ||
        H5Pset_fill_value(dcpl, mem_type, fill) < 0) {
        st = h5_fail(c, KV_ERR_INTERNAL, "%s/%s: cannot set up the creation properties", objpath,
                     name);
        goto exit;
    }
    if (chunk_steps && count > 0) {
        hsize_t chunk[H5S_MAX_RANK];
        chunk[0] = 1;
        for (int k = 1; k < rank; k++) chunk[k] = dims[k];
        if (H5Pset_chunk(dcpl, rank, chunk) < 0 || H5Pset_shuffle(dcpl) < 0 ||
            H5Pset_deflate(dcpl, KV_H5_DEFLATE_LEVEL) < 0) {
            st = h5_fail(c, KV_ERR_INTERNAL, "%s/%s: cannot set chunking and compression", objpath,
                         name);
            goto exit;
        }
    }
    space = H5Screate_simple(rank, dims, NULL);
    if (space < 0) {
        st = h5_fail(c, KV_ERR_INTERNAL, "%s/%s: cannot create a dataspace", objpath, name);
        goto exit;
    }
    dset = H5Dcreate2(group, name, file_type, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    if (dset < 0) {
        st = h5_fail(c, KV_ERR_INTERNAL, "%s/%s: cannot create", objpath, name);
        goto exit;
    }
    if (count > 0 && H5Dwrite(dset, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0) {
        st = h5_fail(c, KV_ERR_INTERNAL, "%s/%s: cannot write", objpath, name);
        goto exit;
    }
exit:
    h5_close(H5Dclose, dset, name, &st, c);
    h5_close(H5Sclose, space, name, &st, c);
    h5_close(H5Pclose, dcpl, name, &st, c);
    free(fill);
    return st;
}

/* A compound table from staged rows (n may be 0). */
static KvStatus h5w_table(hid_t file, const char *name, const Column *m, size_t nm, size_t row_size,
                          const void *rows, int64_t n, ReportCtx *c) {
    KvStatus st = KV_OK;
    hid_t mem = H5I_INVALID_HID, ftype = H5I_INVALID_HID;
    char objpath[80];
    snprintf(objpath, sizeof objpath, "/%s", name);
    st = h5_compound_type(m, nm, row_size, false, &mem, c);
    if (st != KV_OK) goto exit;
    st = h5_compound_type(m, nm, row_size, true, &ftype, c);
    if (st != KV_OK) goto exit;
    const hsize_t dims[1] = {(hsize_t)n};
    st = h5w_dataset(file, "", name, ftype, mem, 1, dims, rows, false, c);
exit:
    h5_close(H5Tclose, ftype, objpath, &st, c);
    h5_close(H5Tclose, mem, objpath, &st, c);
    return st;
}

static KvStatus h5w_root_attrs(hid_t file, const KvReport *rep, ReportCtx *c) {
    KvStatus st;
    char hex[KV_H5_HEX_LEN];
    snprintf(hex, sizeof hex, "%016" PRIx64, rep->model_hash);
    if ((st = h5w_attr_i32(file, "/", "schema_version", KV_REPORT_SCHEMA_VERSION, c)) != KV_OK ||
        (st = h5w_attr_string(file, "/", "tool_version", rep->tool_version,
                              sizeof rep->tool_version, c)) != KV_OK ||
        (st = h5w_attr_string(file, "/", "git_commit", rep->git_commit, sizeof rep->git_commit,
                              c)) != KV_OK ||
        (st = h5w_attr_string(file, "/", "host", rep->host, sizeof rep->host, c)) != KV_OK ||
        (st = h5w_attr_string(file, "/", "device", rep->device, sizeof rep->device, c)) != KV_OK ||
        (st = h5w_attr_string(file, "/", "math_mode", rep->math_mode, sizeof rep->math_mode, c)) !=
            KV_OK ||
        (st = h5w_attr_u64(file, "/", "weight_seed", rep->weight_seed, c)) != KV_OK ||
        (st = h5w_attr_u64(file, "/", "prompt_seed", rep->prompt_seed, c)) != KV_OK ||
        (st = h5w_attr_u64(file, "/", "model_hash", rep->model_hash, c)) != KV_OK ||
        (st = h5w_attr_string(file, "/", "model_hash_hex", hex, sizeof hex, c)) != KV_OK ||
        (st = h5w_attr_string(file, "/", "shard", rep->shard, sizeof rep->shard, c)) != KV_OK) {
        return st;
    }
    return KV_OK;
}

static KvStatus h5w_tolerances(hid_t file, const KvReport *rep, ReportCtx *c) {
    TolRow *rows = calloc(rep->n_tolerances > 0 ? (size_t)rep->n_tolerances : 1, sizeof *rows);
    if (rows == NULL) return report_fail(c, KV_ERR_INTERNAL, "out of memory");
    for (int64_t t = 0; t < rep->n_tolerances; t++) {
        field_copy(rows[t].name, rep->tolerances[t].name, sizeof rows[t].name);
        rows[t].value = rep->tolerances[t].value;
        field_copy(rows[t].reason, rep->tolerances[t].reason, sizeof rows[t].reason);
    }
    KvStatus st = h5w_table(file, "tolerances", TOL_MEMBERS, N_MEMBERS(TOL_MEMBERS), sizeof *rows,
                            rows, rep->n_tolerances, c);
    free(rows);
    return st;
}

static KvStatus h5w_comparisons(hid_t file, const KvReport *rep, ReportCtx *c) {
    CmpRow *rows = calloc(rep->n_comparisons > 0 ? (size_t)rep->n_comparisons : 1, sizeof *rows);
    if (rows == NULL) return report_fail(c, KV_ERR_INTERNAL, "out of memory");
    for (int64_t k = 0; k < rep->n_comparisons; k++) {
        const KvComparison *s = &rep->comparisons[k];
        CmpRow *d = &rows[k];
        d->kind = (int32_t)s->kind;
        d->run_a = s->run_a;
        d->run_b = s->run_b;
        d->verdict = (int32_t)s->verdict;
        field_copy(d->message, s->message, sizeof d->message);
        d->first_step = s->first_step;
        d->first_row = s->first_row;
        d->first_probe = s->first_probe;
        d->near_ties = s->near_ties;
        d->max_abs_err = s->max_abs_err;
        d->max_rel_err = s->max_rel_err;
        d->nmse = s->nmse;
        d->kl = s->kl;
        d->top1_agreement = s->top1_agreement;
    }
    KvStatus st = h5w_table(file, "comparisons", CMP_MEMBERS, N_MEMBERS(CMP_MEMBERS), sizeof *rows,
                            rows, rep->n_comparisons, c);
    free(rows);
    return st;
}

static const char *verdict_name(KvVerdict v) {
    switch (v) {
    case KV_VERDICT_PASS: return "PASS";
    case KV_VERDICT_FAIL: return "FAIL";
    case KV_VERDICT_SKIP: return "SKIP";
    }
    return "?";
}

static KvStatus h5w_summary(hid_t file, const KvReport *rep, ReportCtx *c) {
    KvRunSummary *sum = NULL;
    SummaryRow *rows = calloc(rep->n_runs > 0 ? (size_t)rep->n_runs : 1, sizeof *rows);
    /* one pass over the comparisons for all runs: a pass per run is
     * quadratic, minutes for a large merge */
    if (rows == NULL || kv_report_summarize_runs(rep, &sum) != KV_OK) {
        free(rows);
        return report_fail(c, KV_ERR_INTERNAL, "out of memory");
    }
    for (int64_t i = 0; i < rep->n_runs; i++) {
        const KvRun *r = &rep->runs[i];
        SummaryRow *d = &rows[i];
        const KvVerdict v = sum[i].verdict;
        d->index = i;
        field_copy(d->model, r->model, sizeof d->model);
        field_copy(d->scenario, r->scenario, sizeof d->scenario);
        char vl[2 * KV_NAME_LEN + 2];
        kv_run_variant_label(r, vl, sizeof vl);
        field_copy(d->variant, vl, sizeof d->variant);
        field_copy(d->backend, r->backend, sizeof d->backend);
        field_copy(d->mode, r->mode, sizeof d->mode);
        d->repeat = r->repeat;
        d->verdict = (int32_t)v;
        field_copy(d->verdict_name, verdict_name(v), sizeof d->verdict_name);
        kv_report_run_divergence_of(rep, i, &sum[i], d->first_divergence,
                                    sizeof d->first_divergence);
        d->max_rel_err = sum[i].max_rel_err;
        /* one NaN bit pattern for "no comparison", whatever the helper returned */
        if (isnan(d->max_rel_err)) d->max_rel_err = NAN;
        d->graphs_captured = r->graphs_captured;
    }
    KvStatus st = h5w_table(file, "summary", SUMMARY_MEMBERS, N_MEMBERS(SUMMARY_MEMBERS),
                            sizeof *rows, rows, rep->n_runs, c);
    free(sum);
    free(rows);
    return st;
}

static KvStatus h5w_run_attrs(hid_t g, const char *objpath, const KvRun *r, ReportCtx *c) {
    KvStatus st;
    const uint8_t skipped = r->skipped ? 1 : 0;
    if ((st = h5w_attr_string(g, objpath, "model", r->model, sizeof r->model, c)) != KV_OK ||
        (st = h5w_attr_string(g, objpath, "scenario", r->scenario, sizeof r->scenario, c)) !=
            KV_OK ||
        (st = h5w_attr_string(g, objpath, "variant", r->variant, sizeof r->variant, c)) != KV_OK ||
        (st = h5w_attr_string(g, objpath, "backend", r->backend, sizeof r->backend, c)) != KV_OK ||
        (st = h5w_attr_string(g, objpath, "mode", r->mode, sizeof r->mode, c)) != KV_OK ||
        (st = h5w_attr_i32(g, objpath, "repeat", r->repeat, c)) != KV_OK ||
        (st = h5w_attr_i32(g, objpath, "topk", r->topk, c)) != KV_OK ||
        (st = h5w_attr_string(g, objpath, "fault", r->fault, sizeof r->fault, c)) != KV_OK ||
        (st = h5w_attr_i64(g, objpath, "prefill_chunk", r->prefill_chunk, c)) != KV_OK ||
        (st = h5w_attr(g, objpath, "skipped", H5T_STD_U8LE, H5T_NATIVE_UINT8, &skipped, c)) !=
            KV_OK ||
        (st = h5w_attr_string(g, objpath, "skip_reason", r->skip_reason, sizeof r->skip_reason,
                              c)) != KV_OK ||
        (st = h5w_attr_i64(g, objpath, "steps", r->steps, c)) != KV_OK ||
        (st = h5w_attr_i64(g, objpath, "batch", r->batch, c)) != KV_OK ||
        (st = h5w_attr_i64(g, objpath, "vocab", r->vocab, c)) != KV_OK ||
        (st = h5w_attr_i64(g, objpath, "prompt_len", r->prompt_len, c)) != KV_OK ||
        (st = h5w_attr_i64(g, objpath, "n_probes", r->n_probes, c)) != KV_OK ||
        (st = h5w_attr_i64(g, objpath, "graphs_captured", r->graphs_captured, c)) != KV_OK ||
        (st = h5w_attr_i64(g, objpath, "replays_checked", r->replays_checked, c)) != KV_OK ||
        (st = h5w_attr_i64(g, objpath, "replay_mismatch_step", r->replay_mismatch_step, c)) !=
            KV_OK ||
        (st = h5w_attr(g, objpath, "seconds", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &r->seconds, c)) !=
            KV_OK) {
        return st;
    }
    return KV_OK;
}

/* The logits dataset of a run, or a hard link to the identical dataset of
 * run `twin` (twin >= 0). */
static KvStatus h5w_logits(hid_t g, const char *objpath, const KvRun *r, int64_t twin,
                           const hsize_t *d_logits, ReportCtx *c) {
    if (r->topk > 0) {
        /* Large vocabulary: each row's top-k ids and values; the full
         * logits are still identified by logits_hash. */
        const hsize_t d_topk[3] = {d_logits[0], d_logits[1], (hsize_t)r->topk};
        KvStatus st = h5w_dataset(g, objpath, "topk_ids", H5T_STD_I32LE, H5T_NATIVE_INT32, 3,
                                  d_topk, r->topk_ids, true, c);
        if (st != KV_OK) return st;
        return h5w_dataset(g, objpath, "topk_values", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, 3, d_topk,
                           r->topk_values, true, c);
    }
    if (twin < 0) {
        return h5w_dataset(g, objpath, "logits", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, 3, d_logits,
                           r->logits, true, c);
    }
    char target[64];
    snprintf(target, sizeof target, "/runs/%04" PRId64 "/logits", twin);
    if (H5Lcreate_hard(g, target, g, "logits", H5P_DEFAULT, H5P_DEFAULT) < 0) {
        return h5_fail(c, KV_ERR_INTERNAL, "%s/logits: cannot link to %s", objpath, target);
    }
    return KV_OK;
}

/* FNV-1a 64 of a run's logits bytes. */
static uint64_t logits_fingerprint(const KvRun *r) {
    uint64_t h = 0xcbf29ce484222325ULL;
    const unsigned char *p = (const unsigned char *)r->logits;
    const size_t n = (size_t)(r->steps * r->batch * r->vocab) * sizeof(float);
    for (size_t k = 0; k < n; k++) {
        h ^= p[k];
        h *= 0x100000001b3ULL;
    }
    return h;
}

typedef struct {
    uint64_t fp;
    int64_t run;
} TwinKey;

/* By fingerprint, then by run index: a total order, so the result does not
 * depend on how qsort orders equal keys. */
static int twin_key_cmp(const void *x, const void *y) {
    const TwinKey *a = x, *b = y;
    if (a->fp != b->fp) return a->fp < b->fp ? -1 : 1;
    return (a->run > b->run) - (a->run < b->run);
}

/* twin[i]: the earlier run of the same model and scenario, with the same
 * shape, whose logits are bitwise the same as run i's and which stores them
 * itself; -1 when none (and for skipped and top-k runs, which have no full
 * logits to share). Clean variants reproduce the reference exactly, so most
 * runs share one logits dataset (a hard link): the report stays small while
 * every run still has a "logits" dataset for any reader. Candidates are
 * only compared within a group of equal fingerprints, in run order, so
 * finding the twins is linear in the logits bytes (comparing every pair is
 * quadratic in runs, and for logits that differ only at the end in bytes:
 * minutes for a large merge); the twin found is the same as by comparing
 * every earlier run, since equal logits have equal fingerprints. */
static KvStatus h5w_logits_twins(const KvReport *rep, int64_t *twin, ReportCtx *c) {
    TwinKey *keys = calloc(rep->n_runs > 0 ? (size_t)rep->n_runs : 1, sizeof *keys);
    if (keys == NULL) return report_fail(c, KV_ERR_INTERNAL, "out of memory");
    size_t m = 0;
    for (int64_t i = 0; i < rep->n_runs; i++) {
        const KvRun *r = &rep->runs[i];
        twin[i] = -1;
        if (!r->skipped && r->topk == 0) keys[m++] = (TwinKey){logits_fingerprint(r), i};
    }
    qsort(keys, m, sizeof *keys, twin_key_cmp);
    for (size_t g0 = 0, g1 = 0; g0 < m; g0 = g1) {
        for (g1 = g0 + 1; g1 < m && keys[g1].fp == keys[g0].fp;) g1++;
        for (size_t a = g0 + 1; a < g1; a++) {
            const KvRun *r = &rep->runs[keys[a].run];
            const size_t n = (size_t)(r->steps * r->batch * r->vocab) * sizeof(float);
            for (size_t b = g0; b < a; b++) {
                const KvRun *q = &rep->runs[keys[b].run];
                if (twin[keys[b].run] >= 0 || q->steps != r->steps || q->batch != r->batch ||
                    q->vocab != r->vocab || strncmp(q->model, r->model, KV_NAME_LEN) != 0 ||
                    strncmp(q->scenario, r->scenario, KV_NAME_LEN) != 0 ||
                    (n > 0 && memcmp(q->logits, r->logits, n) != 0)) {
                    continue;
                }
                twin[keys[a].run] = keys[b].run;
                break;
            }
        }
    }
    free(keys);
    return KV_OK;
}

static KvStatus h5w_run_datasets(hid_t g, const char *objpath, const KvRun *r, int64_t twin,
                                 ReportCtx *c) {
    KvStatus st = KV_OK;
    hid_t name_type = H5I_INVALID_HID;
    char(*names)[KV_NAME_LEN] = NULL;
    const hsize_t S = (hsize_t)r->steps, B = (hsize_t)r->batch, V = (hsize_t)r->vocab,
                  P = (hsize_t)r->prompt_len, NP = (hsize_t)r->n_probes;
    const hsize_t d_prompt[2] = {B, P};     /* (batch, prompt_len) */
    const hsize_t d_rows[2] = {S, B};       /* (steps, batch) */
    const hsize_t d_logits[3] = {S, B, V};  /* (steps, batch, vocab) */
    const hsize_t d_names[1] = {NP};        /* (n_probes) */
    const hsize_t d_probes[3] = {S, NP, B}; /* (steps, n_probes, batch) */
    if ((st = h5w_dataset(g, objpath, "prompt", H5T_STD_I32LE, H5T_NATIVE_INT32, 2, d_prompt,
                          r->prompt, false, c)) != KV_OK ||
        (st = h5w_dataset(g, objpath, "prompt_real", H5T_STD_U8LE, H5T_NATIVE_UINT8, 2, d_prompt,
                          r->prompt_real, false, c)) != KV_OK ||
        (st = h5w_dataset(g, objpath, "tokens", H5T_STD_I32LE, H5T_NATIVE_INT32, 2, d_rows,
                          r->tokens, false, c)) != KV_OK ||
        (st = h5w_logits(g, objpath, r, twin, d_logits, c)) != KV_OK ||
        (st = h5w_dataset(g, objpath, "logits_hash", H5T_STD_U64LE, H5T_NATIVE_UINT64, 2, d_rows,
                          r->logits_hash, false, c)) != KV_OK ||
        (st = h5w_dataset(g, objpath, "margins", H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, 2, d_rows,
                          r->margins, false, c)) != KV_OK) {
        goto exit;
    }
    names = calloc(r->n_probes > 0 ? (size_t)r->n_probes : 1, sizeof *names);
    if (names == NULL) {
        st = report_fail(c, KV_ERR_INTERNAL, "out of memory");
        goto exit;
    }
    for (int64_t p = 0; p < r->n_probes; p++) {
        field_copy(names[p], r->probe_names[p], KV_NAME_LEN);
    }
    if ((st = h5_string_type(KV_NAME_LEN, &name_type, c)) != KV_OK ||
        (st = h5w_dataset(g, objpath, "probe_names", name_type, name_type, 1, d_names, names, false,
                          c)) != KV_OK ||
        (st = h5w_dataset(g, objpath, "probe_hash", H5T_STD_U64LE, H5T_NATIVE_UINT64, 3, d_probes,
                          r->probe_hash, false, c)) != KV_OK) {
        goto exit;
    }
exit:
    h5_close(H5Tclose, name_type, "string type", &st, c);
    free(names);
    return st;
}

static KvStatus h5w_runs(hid_t file, hid_t gcpl, const KvReport *rep, ReportCtx *c) {
    KvStatus st = KV_OK;
    hid_t runs = H5I_INVALID_HID, g = H5I_INVALID_HID;
    int64_t *twin = calloc(rep->n_runs > 0 ? (size_t)rep->n_runs : 1, sizeof *twin);
    if (twin == NULL) return report_fail(c, KV_ERR_INTERNAL, "out of memory");
    st = h5w_logits_twins(rep, twin, c);
    if (st != KV_OK) goto exit;
    runs = H5Gcreate2(file, "runs", H5P_DEFAULT, gcpl, H5P_DEFAULT);
    if (runs < 0) {
        st = h5_fail(c, KV_ERR_INTERNAL, "/runs: cannot create");
        goto exit;
    }
    for (int64_t i = 0; i < rep->n_runs; i++) {
        char name[32], objpath[48];
        run_group_name(i, name, sizeof name);
        snprintf(objpath, sizeof objpath, "/runs/%s", name);
        g = H5Gcreate2(runs, name, H5P_DEFAULT, gcpl, H5P_DEFAULT);
        if (g < 0) {
            st = h5_fail(c, KV_ERR_INTERNAL, "%s: cannot create", objpath);
            goto exit;
        }
        st = h5w_run_attrs(g, objpath, &rep->runs[i], c);
        if (st == KV_OK && !rep->runs[i].skipped) {
            st = h5w_run_datasets(g, objpath, &rep->runs[i], twin[i], c);
        }
        h5_close(H5Gclose, g, objpath, &st, c);
        g = H5I_INVALID_HID;
        if (st != KV_OK) goto exit;
    }
exit:
    h5_close(H5Gclose, g, "run group", &st, c);
    h5_close(H5Gclose, runs, "/runs", &st, c);
    free(twin);
    return st;
}

/* Object-creation settings shared by the root (through the file creation
 * list, which is a group creation list) and every group. */
static herr_t h5_group_props(hid_t plist) {
    if (H5Pset_obj_track_times(plist, 0) < 0) return -1;
    if (H5Pset_link_phase_change(plist, KV_H5_MAX_COMPACT, KV_H5_MAX_COMPACT) < 0) return -1;
    if (H5Pset_attr_phase_change(plist, KV_H5_MAX_COMPACT, KV_H5_MAX_COMPACT) < 0) return -1;
    return 0;
}

/* The writer's file in memory: the core driver's buffer, grown through
 * these callbacks so that bytes HDF5 never writes are zero (as in a sparse
 * file on disk; the driver leaves grown memory uninitialised), and kept when
 * the driver lets go of it at close. */
typedef struct {
    unsigned char *buf;
    size_t size;
    bool closed; /* the driver handed buf back at close: it is ours */
} CoreImage;

/* Only used to load an existing image, which the writer never asks for. */
static void *core_image_malloc(size_t size, H5FD_file_image_op_t op, void *udata) {
    (void)op;
    (void)udata;
    return calloc(1, size > 0 ? size : 1);
}

static void *core_image_memcpy(void *dest, const void *src, size_t size, H5FD_file_image_op_t op,
                               void *udata) {
    (void)op;
    (void)udata;
    return memcpy(dest, src, size);
}

static void *core_image_realloc(void *ptr, size_t size, H5FD_file_image_op_t op, void *udata) {
    (void)op;
    CoreImage *ci = udata;
    if (ptr != ci->buf) return realloc(ptr, size > 0 ? size : 1); /* not the file's buffer */
    unsigned char *p = realloc(ptr, size > 0 ? size : 1);
    if (p == NULL) return NULL;
    if (size > ci->size) memset(p + ci->size, 0, size - ci->size);
    ci->buf = p;
    ci->size = size;
    return p;
}

static herr_t core_image_free(void *ptr, H5FD_file_image_op_t op, void *udata) {
    CoreImage *ci = udata;
    if (ptr != NULL && ptr == ci->buf) {
        ci->closed = op == H5FD_FILE_IMAGE_OP_FILE_CLOSE;
        if (!ci->closed) {
            free(ci->buf);
            ci->buf = NULL;
            ci->size = 0;
        }
        return 0;
    }
    free(ptr);
    return 0;
}

/* The CoreImage is the writer's own (a stack object outliving the file);
 * every copy of the access list refers to it. */
static void *core_image_udata_copy(void *udata) { return udata; }
static herr_t core_image_udata_free(void *udata) {
    (void)udata;
    return 0;
}

/* The file's length: the end-of-file address in its superblock. The core
 * driver's buffer grows in whole increments; the sec2 driver truncates the
 * file to this address at close. The layout of a version 2 superblock
 * (pinned by the V18 bounds): signature (8 bytes), version (1), sizes of
 * offsets and lengths (1 + 1), flags (1), base address, extension address,
 * end-of-file address, root object header address (8 each with 8-byte
 * offsets), checksum (4). */
static KvStatus core_image_length(const CoreImage *ci, size_t *len, ReportCtx *c) {
    static const unsigned char signature[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};
    enum { SB_VERSION = 8, SB_OFFSET_SIZE = 9, SB_BASE = 12, SB_EOF = 28, SB_LEN = 48 };
    if (!ci->closed || ci->buf == NULL || ci->size < SB_LEN ||
        memcmp(ci->buf, signature, sizeof signature) != 0 || ci->buf[SB_VERSION] != 2 ||
        ci->buf[SB_OFFSET_SIZE] != 8) {
        return report_fail(c, KV_ERR_INTERNAL,
                           "expected a finished file with a version 2 superblock in memory, "
                           "found %zu bytes%s",
                           ci->size, ci->closed ? "" : " not handed back at close");
    }
    uint64_t base = 0, eof = 0;
    for (int k = 7; k >= 0; k--) {
        base = base << 8 | ci->buf[SB_BASE + k];
        eof = eof << 8 | ci->buf[SB_EOF + k];
    }
    if (base != 0 || eof < SB_LEN || eof > ci->size) {
        return report_fail(c, KV_ERR_INTERNAL,
                           "expected an end-of-file address within the %zu bytes in memory, found "
                           "%" PRIu64 " (base %" PRIu64 ")",
                           ci->size, eof, base);
    }
    *len = (size_t)eof;
    return KV_OK;
}

KvStatus kv_report_write_h5(const KvReport *rep, const char *path, KvError *err) {
    if (rep == NULL || path == NULL) {
        return kv_error_set(err, KV_ERR_INPUT, "kv_report_write_h5: NULL %s",
                            rep == NULL ? "report" : "path");
    }
    ReportCtx c = {.path = path, .err = err};
    KvStatus st = report_validate(rep, &c);
    if (st != KV_OK) return st;
    /* an unusable destination is found before the file is built */
    st = kv_report_check_writable(path, err);
    if (st != KV_OK) return st;

    hid_t fcpl = H5I_INVALID_HID, fapl = H5I_INVALID_HID, gcpl = H5I_INVALID_HID,
          file = H5I_INVALID_HID;
    QuietErrors quiet = {.saved = false};
    CoreImage img = {.buf = NULL, .size = 0, .closed = false};
    size_t image_len = 0;
    char *label = NULL;
    const H5FD_file_image_callbacks_t callbacks = {
        .image_malloc = core_image_malloc,
        .image_memcpy = core_image_memcpy,
        .image_realloc = core_image_realloc,
        .image_free = core_image_free,
        .udata_copy = core_image_udata_copy,
        .udata_free = core_image_udata_free,
        .udata = &img,
    };

    st = h5_quiet_begin(&quiet, &c);
    if (st != KV_OK) goto exit;
    if (H5Zfilter_avail(H5Z_FILTER_DEFLATE) <= 0 || H5Zfilter_avail(H5Z_FILTER_SHUFFLE) <= 0) {
        st = h5_fail(&c, KV_ERR_INTERNAL,
                     "expected an HDF5 library with the deflate and shuffle filters, found one "
                     "without");
        goto exit;
    }
    /* The file is built in memory (the core driver, no backing store) and
     * only its finished image reaches the disk, through
     * kv_report_file_publish: a killed writer leaves no temporary, and
     * every disk failure (a full disk included) is a failed write of path,
     * not an HDF5 error. The library lays the file out the same way for
     * any driver, so the image holds the bytes the sec2 driver wrote
     * before (checked against reports written that way). */
    fcpl = H5Pcreate(H5P_FILE_CREATE);
    fapl = H5Pcreate(H5P_FILE_ACCESS);
    gcpl = H5Pcreate(H5P_GROUP_CREATE);
    if (fcpl < 0 || fapl < 0 || gcpl < 0 || h5_group_props(fcpl) < 0 || h5_group_props(gcpl) < 0 ||
        H5Pset_fapl_core(fapl, KV_H5_CORE_INCREMENT, 0) < 0 ||
        H5Pset_file_image_callbacks(fapl, (H5FD_file_image_callbacks_t *)&callbacks) < 0 ||
        H5Pset_libver_bounds(fapl, H5F_LIBVER_V18, H5F_LIBVER_V18) < 0 ||
        H5Pset_fclose_degree(fapl, H5F_CLOSE_STRONG) < 0) {
        st = h5_fail(&c, KV_ERR_INTERNAL, "cannot set up the file properties");
        goto exit;
    }
    /* With no backing store the name is a label, but the library first
     * tries to open it as an existing file, which the core driver would
     * read into memory: "<path>/" + a name cannot exist while path is a
     * regular file or absent (kv_report_check_writable above). */
    label = malloc(strlen(path) + sizeof KV_H5_MEMORY_LABEL);
    if (label == NULL) {
        st = report_fail(&c, KV_ERR_INTERNAL, "out of memory");
        goto exit;
    }
    snprintf(label, strlen(path) + sizeof KV_H5_MEMORY_LABEL, "%s" KV_H5_MEMORY_LABEL, path);
    file = H5Fcreate(label, H5F_ACC_TRUNC, fcpl, fapl);
    if (file < 0) {
        st = h5_fail(&c, KV_ERR_INTERNAL, "cannot create the file in memory");
        goto exit;
    }
    if ((st = h5w_root_attrs(file, rep, &c)) != KV_OK ||
        (st = h5w_tolerances(file, rep, &c)) != KV_OK ||
        (st = h5w_runs(file, gcpl, rep, &c)) != KV_OK ||
        (st = h5w_comparisons(file, rep, &c)) != KV_OK ||
        (st = h5w_summary(file, rep, &c)) != KV_OK) {
        goto exit;
    }
    /* Closing finishes the file (the superblock's final end-of-file address,
     * flags and checksum are written last); the core driver then hands its
     * buffer to core_image_free, which keeps it. H5Fget_file_image before
     * the close is no substitute: 1.10 clears the superblock's write flag in
     * its copy without updating the checksum, so that image cannot be
     * opened. */
    herr_t closed = H5Fclose(file);
    file = H5I_INVALID_HID;
    if (closed < 0) {
        st = h5_fail(&c, KV_ERR_INTERNAL, "cannot finish the file in memory");
        goto exit;
    }
    st = core_image_length(&img, &image_len, &c);
    if (st != KV_OK) goto exit;
    st = kv_report_file_publish(path, img.buf, image_len, err);
exit:
    h5_close(H5Fclose, file, "file", &st, &c);
    h5_close(H5Pclose, gcpl, "group properties", &st, &c);
    h5_close(H5Pclose, fapl, "file access properties", &st, &c);
    h5_close(H5Pclose, fcpl, "file creation properties", &st, &c);
    h5_quiet_end(&quiet, &st, &c);
    free(img.buf);
    free(label);
    return st;
}

/* ---- reading -------------------------------------------------------------- */

static const char *class_text(H5T_class_t cls) {
    switch (cls) {
    case H5T_INTEGER: return "an integer";
    case H5T_FLOAT: return "a float";
    case H5T_STRING: return "a string";
    case H5T_COMPOUND: return "a compound";
    case H5T_ENUM: return "an enum";
    case H5T_ARRAY: return "an array";
    case H5T_VLEN: return "a variable-length sequence";
    case H5T_OPAQUE: return "an opaque value";
    case H5T_BITFIELD: return "a bitfield";
    case H5T_REFERENCE: return "a reference";
    case H5T_TIME: return "a time";
    default: return "an unknown type";
    }
}

/* Reads from an attribute or a dataset with the same call. */
static herr_t h5_read_any(hid_t id, bool is_attr, hid_t mem, void *buf) {
    return is_attr ? H5Aread(id, mem, buf) : H5Dread(id, mem, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf);
}

/* n strings of type ftype (fixed- or variable-length) into dst, n rows of
 * width bytes each, NUL-terminated; a string of width bytes or more is an
 * error (it would not round-trip). */
static KvStatus h5r_strings(hid_t id, bool is_attr, hid_t ftype, hid_t space, size_t n, char *dst,
                            size_t width, const char *what, ReportCtx *c) {
    KvStatus st = KV_OK;
    hid_t mem = H5I_INVALID_HID;
    char **vls = NULL;
    char *fixed = NULL;
    size_t fsize = 0;
    const htri_t is_vlen = H5Tis_variable_str(ftype);
    const H5T_cset_t cset = H5Tget_cset(ftype);
    if (is_vlen < 0 || cset < 0) {
        st = h5_fail(c, KV_ERR_INPUT, "%s: cannot inspect the string type", what);
        goto exit;
    }
    /* values 2-15 are reserved: HDF5 refuses them when asked to read in
     * them, which is the file's fault, not ours (fuzzing found it) */
    if (cset != H5T_CSET_ASCII && cset != H5T_CSET_UTF8) {
        st = report_fail(c, KV_ERR_INPUT, "%s: expected an ASCII or UTF-8 string, found "
                         "character set %d", what, (int)cset);
        goto exit;
    }
    /* HDF5 does not convert between character sets: read in the file's */
    mem = H5Tcopy(H5T_C_S1);
    if (mem < 0 || H5Tset_cset(mem, cset) < 0 || H5Tset_strpad(mem, H5T_STR_NULLTERM) < 0) {
        st = h5_fail(c, KV_ERR_INTERNAL, "%s: cannot make a string type", what);
        goto exit;
    }
    if (is_vlen) {
        vls = calloc(n > 0 ? n : 1, sizeof *vls);
        if (vls == NULL || H5Tset_size(mem, H5T_VARIABLE) < 0) {
            st = vls == NULL ? report_fail(c, KV_ERR_INTERNAL, "out of memory")
                             : h5_fail(c, KV_ERR_INTERNAL, "%s: cannot make a string type", what);
            goto exit;
        }
        if (n > 0 && h5_read_any(id, is_attr, mem, vls) < 0) {
            st = h5_fail(c, KV_ERR_INPUT, "%s: cannot read", what);
            goto exit;
        }
    } else {
        fsize = H5Tget_size(ftype);
        size_t bytes;
        /* the widest field is 512 bytes: a wider type is not ours, and its
         * size would size the buffer below */
        if (fsize == 0 || fsize > KV_REPORT_MAX_STRING_BYTES ||
            !size_mul(n > 0 ? n : 1, fsize + 1, &bytes)) {
            st = report_fail(c, KV_ERR_INPUT,
                             "%s: expected a string type of 1..%zu bytes, found size %zu", what,
                             KV_REPORT_MAX_STRING_BYTES, fsize);
            goto exit;
        }
        fixed = calloc(1, bytes);
        if (fixed == NULL || H5Tset_size(mem, fsize + 1) < 0) {
            st = fixed == NULL ? report_fail(c, KV_ERR_INTERNAL, "out of memory")
                               : h5_fail(c, KV_ERR_INTERNAL, "%s: cannot make a string type", what);
            goto exit;
        }
        if (n > 0 && h5_read_any(id, is_attr, mem, fixed) < 0) {
            st = h5_fail(c, KV_ERR_INPUT, "%s: cannot read", what);
            goto exit;
        }
    }
    for (size_t k = 0; k < n; k++) {
        const char *s = is_vlen ? vls[k] : fixed + k * (fsize + 1);
        if (s == NULL) s = "";
        const size_t len = strlen(s);
        if (len >= width) {
            st = report_fail(c, KV_ERR_INPUT,
                             "%s: expected a string of at most %zu bytes, found %zu bytes", what,
                             width - 1, len);
            goto exit;
        }
        memset(dst + k * width, 0, width);
        memcpy(dst + k * width, s, len);
    }
exit:
    /* H5Dvlen_reclaim is the 1.10 name (H5Treclaim from 1.12 on) */
    if (vls != NULL && n > 0 && H5Dvlen_reclaim(mem, space, H5P_DEFAULT, vls) < 0 && st == KV_OK) {
        st = h5_fail(c, KV_ERR_INTERNAL, "%s: cannot release variable-length strings", what);
    }
    h5_close(H5Tclose, mem, what, &st, c);
    free(vls);
    free(fixed);
    return st;
}

/* Opens a scalar (or one-element) attribute of class cls; the handles come
 * back open in *attr, *type and *space. */
static KvStatus h5r_attr_open(hid_t obj, const char *objpath, const char *name, H5T_class_t cls,
                              hid_t *attr, hid_t *type, hid_t *space, ReportCtx *c) {
    const htri_t exists = H5Aexists(obj, name);
    if (exists < 0) {
        return h5_fail(c, KV_ERR_INPUT, "%s: attribute %s: cannot look up", objpath, name);
    }
    if (exists == 0) {
        return report_fail(c, KV_ERR_INPUT, "%s: attribute %s: expected %s, found nothing", objpath,
                           name, class_text(cls));
    }
    *attr = H5Aopen(obj, name, H5P_DEFAULT);
    if (*attr < 0) return h5_fail(c, KV_ERR_INPUT, "%s: attribute %s: cannot open", objpath, name);
    *type = H5Aget_type(*attr);
    *space = H5Aget_space(*attr);
    if (*type < 0 || *space < 0) {
        return h5_fail(c, KV_ERR_INPUT, "%s: attribute %s: cannot inspect", objpath, name);
    }
    const H5T_class_t found = H5Tget_class(*type);
    const hssize_t npoints = H5Sget_simple_extent_npoints(*space);
    if (found < 0 || npoints < 0) {
        return h5_fail(c, KV_ERR_INPUT, "%s: attribute %s: cannot inspect", objpath, name);
    }
    if (found != cls) {
        return report_fail(c, KV_ERR_INPUT, "%s: attribute %s: expected %s, found %s", objpath,
                           name, class_text(cls), class_text(found));
    }
    if (npoints != 1) {
        return report_fail(c, KV_ERR_INPUT, "%s: attribute %s: expected one value, found %lld",
                           objpath, name, (long long)npoints);
    }
    return KV_OK;
}

static KvStatus h5r_attr_value(hid_t obj, const char *objpath, const char *name, H5T_class_t cls,
                               hid_t mem_type, void *dst, ReportCtx *c) {
    hid_t attr = H5I_INVALID_HID, type = H5I_INVALID_HID, space = H5I_INVALID_HID;
    KvStatus st = h5r_attr_open(obj, objpath, name, cls, &attr, &type, &space, c);
    if (st != KV_OK) goto exit;
    if (H5Aread(attr, mem_type, dst) < 0) {
        st = h5_fail(c, KV_ERR_INPUT, "%s: attribute %s: cannot read as %s", objpath, name,
                     class_text(cls));
        goto exit;
    }
exit:
    h5_close(H5Sclose, space, name, &st, c);
    h5_close(H5Tclose, type, name, &st, c);
    h5_close(H5Aclose, attr, name, &st, c);
    return st;
}

static KvStatus h5r_attr_i64(hid_t obj, const char *objpath, const char *name, int64_t *v,
                             ReportCtx *c) {
    return h5r_attr_value(obj, objpath, name, H5T_INTEGER, H5T_NATIVE_INT64, v, c);
}

static KvStatus h5r_attr_u64(hid_t obj, const char *objpath, const char *name, uint64_t *v,
                             ReportCtx *c) {
    return h5r_attr_value(obj, objpath, name, H5T_INTEGER, H5T_NATIVE_UINT64, v, c);
}

/* An int64 attribute that must lie in [lo, hi]. */
static KvStatus h5r_attr_range(hid_t obj, const char *objpath, const char *name, int64_t lo,
                               int64_t hi, int64_t *v, ReportCtx *c) {
    KvStatus st = h5r_attr_i64(obj, objpath, name, v, c);
    if (st != KV_OK) return st;
    if (*v < lo || *v > hi) {
        return report_fail(c, KV_ERR_INPUT,
                           "%s: attribute %s: expected %" PRId64 "..%" PRId64 ", found %" PRId64,
                           objpath, name, lo, hi, *v);
    }
    return KV_OK;
}

static KvStatus h5r_attr_string(hid_t obj, const char *objpath, const char *name, char *dst,
                                size_t width, ReportCtx *c) {
    hid_t attr = H5I_INVALID_HID, type = H5I_INVALID_HID, space = H5I_INVALID_HID;
    char what[160];
    snprintf(what, sizeof what, "%s: attribute %s", objpath, name);
    KvStatus st = h5r_attr_open(obj, objpath, name, H5T_STRING, &attr, &type, &space, c);
    if (st != KV_OK) goto exit;
    st = h5r_strings(attr, true, type, space, 1, dst, width, what, c);
exit:
    h5_close(H5Sclose, space, name, &st, c);
    h5_close(H5Tclose, type, name, &st, c);
    h5_close(H5Aclose, attr, name, &st, c);
    return st;
}

/* ---- what the reader trusts ---------------------------------------------- */

/* Charges bytes about to be allocated for objpath to the report's budget
 * (KV_REPORT_MAX_READ_BYTES for all arrays together). */
static KvStatus h5r_charge(ReportCtx *c, const char *objpath, uint64_t bytes) {
    if (bytes > c->budget) {
        return report_fail(c, KV_ERR_INPUT,
                           "%s: expected a report that fits in %" PRIu64
                           " bytes of memory (KV_REPORT_MAX_READ_BYTES), found %" PRIu64
                           " more bytes needed here with %" PRIu64 " left",
                           objpath, (uint64_t)KV_REPORT_MAX_READ_BYTES, bytes, c->budget);
    }
    c->budget -= bytes;
    return KV_OK;
}

static const char *object_type_text(H5O_type_t t) {
    switch (t) {
    case H5O_TYPE_GROUP: return "a group";
    case H5O_TYPE_DATASET: return "a dataset";
    case H5O_TYPE_NAMED_DATATYPE: return "a named datatype";
    default: return "an object of unknown type";
    }
}

/* The refusal of a link that is not a hard link, saying where it points:
 * "<objpath>: expected <expect> stored in this file, found a soft link to
 * '/x'". Links are never followed: an external link would pull data from
 * another file, a soft link another object of this one. */
static KvStatus h5r_refuse_link(hid_t parent, const char *objpath, const char *name,
                                const H5L_info_t *li, const char *expect, ReportCtx *c) {
    char where[320] = "";
    if (li->type == H5L_TYPE_SOFT || li->type == H5L_TYPE_EXTERNAL) {
        /* the value is stored in the link message, so its size is bounded
         * by the file; anything larger than the message needs is cut */
        const size_t n = li->u.val_size < 4096 ? li->u.val_size : 4096;
        char *val = n > 0 ? calloc(1, n + 1) : NULL;
        if (val != NULL && H5Lget_val(parent, name, val, n, H5P_DEFAULT) >= 0) {
            const char *file = NULL, *obj = NULL;
            unsigned flags = 0;
            if (li->type == H5L_TYPE_SOFT) {
                snprintf(where, sizeof where, " to '%.250s'", val);
            } else if (n == li->u.val_size &&
                       H5Lunpack_elink_val(val, n, &flags, &file, &obj) >= 0 && file != NULL &&
                       obj != NULL) {
                snprintf(where, sizeof where, " to '%.150s:%.150s'", file, obj);
            }
        }
        free(val);
        if (H5Eclear2(H5E_DEFAULT) < 0) {
            /* only the details of the message are lost */
        }
    }
    const char *kind = li->type == H5L_TYPE_SOFT       ? "a soft link"
                       : li->type == H5L_TYPE_EXTERNAL ? "an external link"
                                                       : "a user-defined link";
    return report_fail(c, KV_ERR_INPUT,
                       "%s: expected %s stored in this file, found %s%s (a report is one "
                       "self-contained file: links are refused, not followed)",
                       objpath, expect, kind, where);
}

/* Checks that `name` under parent is a hard link to an object of type want
 * (a group or a dataset), without following any other kind of link: "found
 * nothing" when absent. shared: more than one hard link may lead to it (a
 * run's logits, which the writer links from every run with the same
 * values); anything else the schema has once. */
static KvStatus h5r_check_object(hid_t parent, const char *objpath, const char *name,
                                 H5O_type_t want, bool shared, const char *expect, ReportCtx *c) {
    const htri_t exists = H5Lexists(parent, name, H5P_DEFAULT);
    if (exists < 0) return h5_fail(c, KV_ERR_INPUT, "%s: cannot look up", objpath);
    if (exists == 0) {
        return report_fail(c, KV_ERR_INPUT, "%s: expected %s, found nothing", objpath, expect);
    }
    H5L_info_t li;
    if (H5Lget_info(parent, name, &li, H5P_DEFAULT) < 0) {
        return h5_fail(c, KV_ERR_INPUT, "%s: cannot look up the link", objpath);
    }
    if (li.type != H5L_TYPE_HARD) return h5r_refuse_link(parent, objpath, name, &li, expect, c);
    H5O_info_t oi;
    if (H5Oget_info_by_name2(parent, name, &oi, H5O_INFO_BASIC, H5P_DEFAULT) < 0) {
        return h5_fail(c, KV_ERR_INPUT, "%s: cannot inspect", objpath);
    }
    if (oi.type != want) {
        return report_fail(c, KV_ERR_INPUT, "%s: expected %s, found %s", objpath, expect,
                           object_type_text(oi.type));
    }
    if (!shared && oi.rc != 1) {
        return report_fail(c, KV_ERR_INPUT,
                           "%s: expected %s of its own, found one that %u links share (only a "
                           "run's logits may be shared)",
                           objpath, expect, oi.rc);
    }
    return KV_OK;
}

/* The names a group may hold, for h5r_scan_group. */
typedef struct {
    const char *const *names; /* NULL-terminated; NULL: run group names below n_runs */
    int64_t n_runs;
    const char *expect; /* what each link should lead to, for the message */
    char found[256]; /* the first name not allowed, or not a hard link */
    bool bad_link;
} LinkScan;

/* A canonical run group name ("0007", "12345") of an index below n. */
static bool is_run_name(const char *name, int64_t n) {
    const size_t len = strlen(name);
    if (len < 4 || len > 18 || strspn(name, "0123456789") != len) return false;
    int64_t v = 0;
    for (size_t k = 0; k < len; k++) v = v * 10 + (name[k] - '0');
    char canon[32];
    run_group_name(v, canon, sizeof canon);
    return v < n && strcmp(canon, name) == 0;
}

static herr_t h5r_scan_link(hid_t g, const char *name, const H5L_info_t *info, void *data) {
    (void)g;
    LinkScan *s = data;
    bool allowed = false;
    if (s->names == NULL) {
        allowed = is_run_name(name, s->n_runs);
    } else {
        for (const char *const *n = s->names; *n != NULL && !allowed; n++) {
            allowed = strcmp(*n, name) == 0;
        }
    }
    if (allowed && info->type == H5L_TYPE_HARD) return 0;
    snprintf(s->found, sizeof s->found, "%s", name);
    s->bad_link = allowed;
    return 1; /* stop: the first offender is reported */
}

/* Every link in group g (objpath) must be a hard link with a name the
 * schema gives there (scan->names, or run group names): an unexpected
 * object would otherwise go unnoticed (a run marked skipped that still has
 * datasets is a damaged report, not a skipped run), and a soft or external
 * link is refused wherever it is. what: the names, for the message. */
static KvStatus h5r_scan_group(hid_t g, const char *objpath, LinkScan *scan, const char *what,
                               ReportCtx *c) {
    hsize_t idx = 0;
    const herr_t rc = H5Literate(g, H5_INDEX_NAME, H5_ITER_INC, &idx, h5r_scan_link, scan);
    if (rc < 0) return h5_fail(c, KV_ERR_INPUT, "%s: cannot list", objpath);
    if (rc == 0) return KV_OK;
    char child[512];
    snprintf(child, sizeof child, "%s%s%s", objpath, strcmp(objpath, "/") == 0 ? "" : "/",
             scan->found);
    if (scan->bad_link) {
        H5L_info_t li;
        if (H5Lget_info(g, scan->found, &li, H5P_DEFAULT) < 0) {
            return h5_fail(c, KV_ERR_INPUT, "%s: cannot look up the link", child);
        }
        return h5r_refuse_link(g, child, scan->found, &li, scan->expect, c);
    }
    return report_fail(c, KV_ERR_INPUT, "%s: expected only %s, found '%s'", objpath, what,
                       scan->found);
}

/* Where a dataset's data is and how much of it the file holds, before
 * anything is allocated for it: stored in this file (no external raw data
 * files, no virtual dataset mapping other files), with no filter but
 * shuffle, deflate and fletcher32, every chunk allocated (a missing chunk
 * reads as fill values: a size the file does not back), and no more data
 * than the stored bytes can hold (equal without deflate, at most
 * KV_REPORT_MAX_DEFLATE_RATIO times with it). count: elements, > 0. */
static KvStatus h5r_check_storage(hid_t dset, const char *objpath, hid_t ftype, hid_t space,
                                  int rank, const hsize_t *dims, size_t count, ReportCtx *c) {
    KvStatus st = KV_OK;
    hid_t dcpl = H5Dget_create_plist(dset);
    if (dcpl < 0) {
        st = h5_fail(c, KV_ERR_INPUT, "%s: cannot inspect the storage", objpath);
        goto exit;
    }
    const H5D_layout_t layout = H5Pget_layout(dcpl);
    const int n_external = H5Pget_external_count(dcpl);
    const int n_filters = H5Pget_nfilters(dcpl);
    if (layout < 0 || n_external < 0 || n_filters < 0) {
        st = h5_fail(c, KV_ERR_INPUT, "%s: cannot inspect the storage", objpath);
        goto exit;
    }
    if (layout == H5D_VIRTUAL) {
        st = report_fail(c, KV_ERR_INPUT,
                         "%s: expected data stored in this file, found a virtual dataset (data "
                         "mapped from other datasets or files)",
                         objpath);
        goto exit;
    }
    if (layout != H5D_COMPACT && layout != H5D_CONTIGUOUS && layout != H5D_CHUNKED) {
        st = report_fail(c, KV_ERR_INPUT,
                         "%s: expected compact, contiguous or chunked storage, found layout %d",
                         objpath, (int)layout);
        goto exit;
    }
    if (n_external > 0) {
        st = report_fail(c, KV_ERR_INPUT,
                         "%s: expected data stored in this file, found it in %d external file%s",
                         objpath, n_external, n_external == 1 ? "" : "s");
        goto exit;
    }
    bool deflate = false;
    for (int f = 0; f < n_filters; f++) {
        unsigned flags = 0, config = 0;
        size_t n_values = 0;
        char name[64] = "";
        const H5Z_filter_t id =
            H5Pget_filter2(dcpl, (unsigned)f, &flags, &n_values, NULL, sizeof name, name, &config);
        if (id < 0) {
            st = h5_fail(c, KV_ERR_INPUT, "%s: cannot inspect filter %d", objpath, f);
            goto exit;
        }
        if (id == H5Z_FILTER_DEFLATE) {
            deflate = true;
        } else if (id != H5Z_FILTER_SHUFFLE && id != H5Z_FILTER_FLETCHER32) {
            /* the ratio bound below holds for deflate; another filter
             * (scale-offset, n-bit, szip, plugins) could claim any size */
            st = report_fail(c, KV_ERR_INPUT,
                             "%s: expected no filters but shuffle, deflate and fletcher32, found "
                             "filter %d (%.60s)",
                             objpath, (int)id, name);
            goto exit;
        }
    }
    const size_t tsize = H5Tget_size(ftype);
    if (tsize == 0) {
        st = h5_fail(c, KV_ERR_INPUT, "%s: cannot size the type", objpath);
        goto exit;
    }
    uint64_t raw = 0;
    if ((uint64_t)count > UINT64_MAX / tsize) {
        st = report_fail(c, KV_ERR_INPUT,
                         "%s: expected a size that fits in 64 bits, found %zu x %zu", objpath,
                         count, tsize);
        goto exit;
    }
    raw = (uint64_t)count * tsize;
    /* 0 both when nothing is allocated and on failure: either way no data */
    const uint64_t stored = H5Dget_storage_size(dset);
    if (stored > c->file_size) {
        st = report_fail(c, KV_ERR_INPUT,
                         "%s: expected at most the file's %" PRIu64 " bytes stored, found %" PRIu64,
                         objpath, c->file_size, stored);
        goto exit;
    }
    if (!deflate && stored < raw) {
        st = report_fail(c, KV_ERR_INPUT,
                         "%s: expected %" PRIu64 " bytes of data stored in the file, found %" PRIu64
                         " (unallocated or cut short)",
                         objpath, raw, stored);
        goto exit;
    }
    if (deflate && (raw - 1) / KV_REPORT_MAX_DEFLATE_RATIO >= stored) {
        st = report_fail(c, KV_ERR_INPUT,
                         "%s: expected at most %d bytes of data per stored byte (deflate's limit), "
                         "found %" PRIu64 " bytes declared in %" PRIu64 " stored",
                         objpath, KV_REPORT_MAX_DEFLATE_RATIO, raw, stored);
        goto exit;
    }
    if (layout == H5D_CHUNKED) {
        hsize_t chunk[H5S_MAX_RANK];
        const int crank = H5Pget_chunk(dcpl, H5S_MAX_RANK, chunk);
        if (crank < 0) {
            st = h5_fail(c, KV_ERR_INPUT, "%s: cannot read the chunk shape", objpath);
            goto exit;
        }
        if (crank != rank) {
            st = report_fail(c, KV_ERR_INPUT, "%s: expected chunks of rank %d, found rank %d",
                             objpath, rank, crank);
            goto exit;
        }
        uint64_t expected = 1;
        for (int k = 0; k < rank; k++) {
            if (chunk[k] == 0 || chunk[k] > dims[k]) {
                char want[96], got[96];
                shape_text(rank, dims, want, sizeof want);
                shape_text(rank, chunk, got, sizeof got);
                st = report_fail(c, KV_ERR_INPUT,
                                 "%s: expected chunks within the shape %s, found chunk shape %s",
                                 objpath, want, got);
                goto exit;
            }
            /* at most count chunks, so no overflow */
            expected *= (dims[k] + chunk[k] - 1) / chunk[k];
        }
        hsize_t n_chunks = 0;
        if (H5Dget_num_chunks(dset, space, &n_chunks) < 0) {
            st = h5_fail(c, KV_ERR_INPUT, "%s: cannot count the chunks", objpath);
            goto exit;
        }
        if (n_chunks != expected) {
            st = report_fail(c, KV_ERR_INPUT,
                             "%s: expected all %" PRIu64 " chunks stored, found %llu (the others "
                             "would read as fill values)",
                             objpath, expected, (unsigned long long)n_chunks);
            goto exit;
        }
    }
exit:
    h5_close(H5Pclose, dcpl, objpath, &st, c);
    return st;
}

/* Reads dataset name of class cls and exactly shape dims into a new array
 * (NULL when it has no elements), after h5r_check_object (shared: see
 * there) and h5r_check_storage, and charged to the read budget. */
static KvStatus h5r_dataset(hid_t g, const char *gpath, const char *name, H5T_class_t cls,
                            hid_t mem_type, size_t elem, int rank, const hsize_t *dims, bool shared,
                            void **out, ReportCtx *c) {
    KvStatus st = KV_OK;
    hid_t dset = H5I_INVALID_HID, type = H5I_INVALID_HID, space = H5I_INVALID_HID;
    void *buf = NULL;
    char objpath[128], want[96], got[96], expect[160];
    snprintf(objpath, sizeof objpath, "%s/%s", gpath, name);
    shape_text(rank, dims, want, sizeof want);
    snprintf(expect, sizeof expect, "%s dataset of shape %s", class_text(cls), want);
    *out = NULL;
    st = h5r_check_object(g, objpath, name, H5O_TYPE_DATASET, shared, expect, c);
    if (st != KV_OK) goto exit;
    dset = H5Dopen2(g, name, H5P_DEFAULT);
    if (dset < 0) {
        st = h5_fail(c, KV_ERR_INPUT, "%s: expected %s, found one HDF5 cannot open", objpath,
                     expect);
        goto exit;
    }
    type = H5Dget_type(dset);
    space = H5Dget_space(dset);
    if (type < 0 || space < 0) {
        st = h5_fail(c, KV_ERR_INPUT, "%s: cannot inspect", objpath);
        goto exit;
    }
    const H5T_class_t found = H5Tget_class(type);
    const int frank = H5Sget_simple_extent_ndims(space);
    if (found < 0 || frank < 0) {
        st = h5_fail(c, KV_ERR_INPUT, "%s: cannot inspect", objpath);
        goto exit;
    }
    if (found != cls) {
        st = report_fail(c, KV_ERR_INPUT, "%s: expected %s dataset, found %s dataset", objpath,
                         class_text(cls), class_text(found));
        goto exit;
    }
    hsize_t fdims[H5S_MAX_RANK];
    if (frank > H5S_MAX_RANK || H5Sget_simple_extent_dims(space, fdims, NULL) < 0) {
        st = h5_fail(c, KV_ERR_INPUT, "%s: cannot read the shape", objpath);
        goto exit;
    }
    bool same = frank == rank;
    for (int k = 0; same && k < rank; k++) same = fdims[k] == dims[k];
    if (!same) {
        shape_text(frank, fdims, got, sizeof got);
        st = report_fail(c, KV_ERR_INPUT, "%s: expected shape %s, found %s", objpath, want, got);
        goto exit;
    }
    size_t count = 0, bytes = 0;
    if (!shape_count(rank, dims, &count) || !size_mul(count, elem, &bytes)) {
        st = report_fail(c, KV_ERR_INPUT, "%s: expected a shape that fits in memory, found %s",
                         objpath, want);
        goto exit;
    }
    if (count == 0) goto exit;
    if ((st = h5r_check_storage(dset, objpath, type, space, rank, dims, count, c)) != KV_OK ||
        (st = h5r_charge(c, objpath, bytes)) != KV_OK) {
        goto exit;
    }
    buf = malloc(bytes);
    if (buf == NULL) {
        st = report_fail(c, KV_ERR_INTERNAL, "%s: out of memory (%zu bytes)", objpath, bytes);
        goto exit;
    }
    if (cls == H5T_STRING) {
        st = h5r_strings(dset, false, type, space, count, buf, elem, objpath, c);
        if (st != KV_OK) goto exit;
    } else if (H5Dread(dset, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf) < 0) {
        st = h5_fail(c, KV_ERR_INPUT, "%s: cannot read", objpath);
        goto exit;
    }
    *out = buf;
    buf = NULL;
exit:
    free(buf);
    h5_close(H5Sclose, space, objpath, &st, c);
    h5_close(H5Tclose, type, objpath, &st, c);
    h5_close(H5Dclose, dset, objpath, &st, c);
    return st;
}

/* The memory type for reading a table: checks that the file type has every
 * member with the right class, and takes each string member's character set
 * from the file (HDF5 does not convert between ASCII and UTF-8; h5py writes
 * numpy "S" fields as ASCII). */
static KvStatus h5r_table_mem_type(hid_t ftype, const char *objpath, const Column *m, size_t nm,
                                   size_t row_size, hid_t *out, ReportCtx *c) {
    KvStatus st = KV_OK;
    hid_t mem = H5I_INVALID_HID, mt = H5I_INVALID_HID, str = H5I_INVALID_HID;
    *out = H5I_INVALID_HID;
    mem = H5Tcreate(H5T_COMPOUND, row_size);
    if (mem < 0) {
        st = h5_fail(c, KV_ERR_INTERNAL, "%s: cannot create a compound type", objpath);
        goto exit;
    }
    for (size_t i = 0; i < nm; i++) {
        const int idx = H5Tget_member_index(ftype, m[i].name);
        if (idx < 0) {
            /* a missing member is a lookup failure on HDF5's side */
            if (H5Eclear2(H5E_DEFAULT) < 0) {
                st = h5_fail(c, KV_ERR_INTERNAL, "cannot clear the HDF5 error stack");
                goto exit;
            }
            st = report_fail(c, KV_ERR_INPUT, "%s: member %s: expected %s, found nothing", objpath,
                             m[i].name, member_kind_text(m[i].kind));
            goto exit;
        }
        const H5T_class_t want = m[i].kind == COL_F64   ? H5T_FLOAT
                                 : m[i].kind == COL_STR ? H5T_STRING
                                                        : H5T_INTEGER;
        const H5T_class_t found = H5Tget_member_class(ftype, (unsigned)idx);
        if (found < 0) {
            st = h5_fail(c, KV_ERR_INPUT, "%s: member %s: cannot inspect", objpath, m[i].name);
            goto exit;
        }
        if (found != want) {
            st = report_fail(c, KV_ERR_INPUT, "%s: member %s: expected %s, found %s", objpath,
                             m[i].name, member_kind_text(m[i].kind), class_text(found));
            goto exit;
        }
        hid_t mem_member = H5I_INVALID_HID;
        switch (m[i].kind) {
        case COL_I32: mem_member = H5T_NATIVE_INT32; break;
        case COL_I64: mem_member = H5T_NATIVE_INT64; break;
        case COL_F64: mem_member = H5T_NATIVE_DOUBLE; break;
        case COL_STR: {
            mt = H5Tget_member_type(ftype, (unsigned)idx);
            const htri_t vlen = mt < 0 ? -1 : H5Tis_variable_str(mt);
            const H5T_cset_t cset = mt < 0 ? H5T_CSET_ERROR : H5Tget_cset(mt);
            if (vlen < 0 || cset < 0) {
                st = h5_fail(c, KV_ERR_INPUT, "%s: member %s: cannot inspect", objpath, m[i].name);
                goto exit;
            }
            if (cset != H5T_CSET_ASCII && cset != H5T_CSET_UTF8) {
                st = report_fail(c, KV_ERR_INPUT, "%s: member %s: expected an ASCII or UTF-8 "
                                 "string, found character set %d", objpath, m[i].name, (int)cset);
                goto exit;
            }
            /* HDF5 converts fixed-length strings of any size (lengths are
             * checked after reading), not variable-length ones in a compound */
            if (vlen) {
                st = report_fail(c, KV_ERR_INPUT,
                                 "%s: member %s: expected a fixed-length string of at most %zu "
                                 "bytes, found a variable-length string",
                                 objpath, m[i].name, m[i].width - 1);
                goto exit;
            }
            st = h5_string_type_pad(m[i].width, H5T_STR_NULLPAD, &str, c);
            if (st != KV_OK) goto exit;
            if (H5Tset_cset(str, cset) < 0) {
                st = h5_fail(c, KV_ERR_INTERNAL, "%s: member %s: cannot set the character set",
                             objpath, m[i].name);
                goto exit;
            }
            mem_member = str;
            break;
        }
        }
        if (H5Tinsert(mem, m[i].name, m[i].offset, mem_member) < 0) {
            st = h5_fail(c, KV_ERR_INTERNAL, "%s: cannot add member %s to a compound type", objpath,
                         m[i].name);
            goto exit;
        }
        h5_close(H5Tclose, str, objpath, &st, c);
        str = H5I_INVALID_HID;
        h5_close(H5Tclose, mt, objpath, &st, c);
        mt = H5I_INVALID_HID;
        if (st != KV_OK) goto exit;
    }
    *out = mem;
    mem = H5I_INVALID_HID;
exit:
    h5_close(H5Tclose, str, objpath, &st, c);
    h5_close(H5Tclose, mt, objpath, &st, c);
    h5_close(H5Tclose, mem, objpath, &st, c);
    return st;
}

/* Reads the 1-D compound table /name into calloc'd staging rows: at most
 * max_rows, or exactly want_rows when that is >= 0, checked before any row
 * is read. */
static KvStatus h5r_table(hid_t file, const char *name, const Column *m, size_t nm, size_t row_size,
                          int64_t max_rows, int64_t want_rows, const char *rows_why, void **rows,
                          int64_t *n_rows, ReportCtx *c) {
    KvStatus st = KV_OK;
    hid_t dset = H5I_INVALID_HID, ftype = H5I_INVALID_HID, space = H5I_INVALID_HID,
          mem = H5I_INVALID_HID;
    void *buf = NULL;
    char objpath[64];
    snprintf(objpath, sizeof objpath, "/%s", name);
    *rows = NULL;
    *n_rows = 0;
    st = h5r_check_object(file, objpath, name, H5O_TYPE_DATASET, false, "a 1-D compound dataset",
                          c);
    if (st != KV_OK) goto exit;
    dset = H5Dopen2(file, name, H5P_DEFAULT);
    if (dset < 0) {
        st = h5_fail(c, KV_ERR_INPUT,
                     "%s: expected a 1-D compound dataset, found one HDF5 cannot open", objpath);
        goto exit;
    }
    ftype = H5Dget_type(dset);
    space = H5Dget_space(dset);
    if (ftype < 0 || space < 0) {
        st = h5_fail(c, KV_ERR_INPUT, "%s: cannot inspect", objpath);
        goto exit;
    }
    const H5T_class_t cls = H5Tget_class(ftype);
    const int rank = H5Sget_simple_extent_ndims(space);
    if (cls < 0 || rank < 0) {
        st = h5_fail(c, KV_ERR_INPUT, "%s: cannot inspect", objpath);
        goto exit;
    }
    if (cls != H5T_COMPOUND || rank != 1) {
        st =
            report_fail(c, KV_ERR_INPUT, "%s: expected a 1-D compound dataset, found %s of rank %d",
                        objpath, class_text(cls), rank);
        goto exit;
    }
    st = h5r_table_mem_type(ftype, objpath, m, nm, row_size, &mem, c);
    if (st != KV_OK) goto exit;
    hsize_t dims[1];
    if (H5Sget_simple_extent_dims(space, dims, NULL) < 0) {
        st = h5_fail(c, KV_ERR_INPUT, "%s: cannot read the shape", objpath);
        goto exit;
    }
    if (want_rows >= 0 && dims[0] != (hsize_t)want_rows) {
        st = report_fail(c, KV_ERR_INPUT, "%s: expected %" PRId64 " rows (%s), found %llu",
                         objpath, want_rows, rows_why, (unsigned long long)dims[0]);
        goto exit;
    }
    if (dims[0] > (hsize_t)max_rows) {
        st = report_fail(c, KV_ERR_INPUT, "%s: expected at most %" PRId64 " rows (%s), found %llu",
                         objpath, max_rows, rows_why, (unsigned long long)dims[0]);
        goto exit;
    }
    const size_t n = (size_t)dims[0];
    size_t bytes;
    if (!size_mul(n > 0 ? n : 1, row_size, &bytes)) {
        st = report_fail(c, KV_ERR_INPUT, "%s: expected a row count that fits in memory, found %zu",
                         objpath, n);
        goto exit;
    }
    if (n > 0) {
        const hsize_t shape[1] = {dims[0]};
        if ((st = h5r_check_storage(dset, objpath, ftype, space, 1, shape, n, c)) != KV_OK ||
            (st = h5r_charge(c, objpath, bytes)) != KV_OK) {
            goto exit;
        }
    }
    buf = calloc(1, bytes);
    if (buf == NULL) {
        st = report_fail(c, KV_ERR_INTERNAL, "%s: out of memory", objpath);
        goto exit;
    }
    if (n > 0 && H5Dread(dset, mem, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf) < 0) {
        st = h5_fail(c, KV_ERR_INPUT, "%s: cannot read", objpath);
        goto exit;
    }
    /* NULLPAD reading: a string without a terminator did not fit */
    for (size_t r = 0; r < n; r++) {
        for (size_t i = 0; i < nm; i++) {
            if (m[i].kind != COL_STR) continue;
            const char *str = (const char *)buf + r * row_size + m[i].offset;
            if (strnlen(str, m[i].width) == m[i].width) {
                st = report_fail(c, KV_ERR_INPUT,
                                 "%s[%zu]: member %s: expected a string of at most %zu bytes, "
                                 "found %zu or more",
                                 objpath, r, m[i].name, m[i].width - 1, m[i].width);
                goto exit;
            }
        }
    }
    *rows = buf;
    *n_rows = (int64_t)n;
    buf = NULL;
exit:
    free(buf);
    h5_close(H5Tclose, mem, objpath, &st, c);
    h5_close(H5Sclose, space, objpath, &st, c);
    h5_close(H5Tclose, ftype, objpath, &st, c);
    h5_close(H5Dclose, dset, objpath, &st, c);
    return st;
}

static KvStatus h5r_root_attrs(hid_t file, KvReport *rep, ReportCtx *c) {
    KvStatus st;
    int64_t version = 0;
    char hex[KV_H5_HEX_LEN], want[KV_H5_HEX_LEN];
    if ((st = h5r_attr_i64(file, "/", "schema_version", &version, c)) != KV_OK) return st;
    if (version != KV_REPORT_SCHEMA_VERSION) {
        return report_fail(c, KV_ERR_INPUT,
                           "/: attribute schema_version: expected %d, found %" PRId64,
                           KV_REPORT_SCHEMA_VERSION, version);
    }
    if ((st = h5r_attr_string(file, "/", "tool_version", rep->tool_version,
                              sizeof rep->tool_version, c)) != KV_OK ||
        (st = h5r_attr_string(file, "/", "git_commit", rep->git_commit, sizeof rep->git_commit,
                              c)) != KV_OK ||
        (st = h5r_attr_string(file, "/", "host", rep->host, sizeof rep->host, c)) != KV_OK ||
        (st = h5r_attr_string(file, "/", "device", rep->device, sizeof rep->device, c)) != KV_OK ||
        (st = h5r_attr_string(file, "/", "math_mode", rep->math_mode, sizeof rep->math_mode, c)) !=
            KV_OK ||
        (st = h5r_attr_u64(file, "/", "weight_seed", &rep->weight_seed, c)) != KV_OK ||
        (st = h5r_attr_u64(file, "/", "prompt_seed", &rep->prompt_seed, c)) != KV_OK ||
        (st = h5r_attr_u64(file, "/", "model_hash", &rep->model_hash, c)) != KV_OK ||
        (st = h5r_attr_string(file, "/", "model_hash_hex", hex, sizeof hex, c)) != KV_OK ||
        (st = h5r_attr_string(file, "/", "shard", rep->shard, sizeof rep->shard, c)) != KV_OK) {
        return st;
    }
    snprintf(want, sizeof want, "%016" PRIx64, rep->model_hash);
    if (strcmp(hex, want) != 0) {
        return report_fail(
            c, KV_ERR_INPUT,
            "/: attribute model_hash_hex: expected \"%s\" (model_hash), found \"%s\"", want, hex);
    }
    return KV_OK;
}

static KvStatus h5r_tolerances(hid_t file, KvReport *rep, ReportCtx *c) {
    TolRow *rows = NULL;
    int64_t n = 0;
    KvStatus st = h5r_table(file, "tolerances", TOL_MEMBERS, N_MEMBERS(TOL_MEMBERS), sizeof *rows,
                            KV_REPORT_MAX_TOLERANCES, -1, "KV_REPORT_MAX_TOLERANCES",
                            (void **)&rows, &n, c);
    if (st != KV_OK) goto exit;
    if (n > 0) {
        st = h5r_charge(c, "/tolerances", (uint64_t)n * sizeof *rep->tolerances);
        if (st != KV_OK) goto exit;
        rep->tolerances = calloc((size_t)n, sizeof *rep->tolerances);
        if (rep->tolerances == NULL) {
            st = report_fail(c, KV_ERR_INTERNAL, "/tolerances: out of memory");
            goto exit;
        }
    }
    rep->n_tolerances = n;
    for (int64_t t = 0; t < n; t++) {
        memcpy(rep->tolerances[t].name, rows[t].name, sizeof rows[t].name);
        rep->tolerances[t].value = rows[t].value;
        memcpy(rep->tolerances[t].reason, rows[t].reason, sizeof rows[t].reason);
    }
exit:
    free(rows);
    return st;
}

static KvStatus h5r_comparisons(hid_t file, KvReport *rep, ReportCtx *c) {
    CmpRow *rows = NULL;
    int64_t n = 0;
    /* a run is the candidate of a few comparisons, so their count follows
     * the run count (checked before any row is read) */
    char why[96];
    snprintf(why, sizeof why, "%d per run, %" PRId64 " runs", KV_REPORT_MAX_COMPARISONS_PER_RUN,
             rep->n_runs);
    KvStatus st = h5r_table(file, "comparisons", CMP_MEMBERS, N_MEMBERS(CMP_MEMBERS), sizeof *rows,
                            KV_REPORT_MAX_COMPARISONS_PER_RUN * rep->n_runs, -1, why,
                            (void **)&rows, &n, c);
    if (st != KV_OK) goto exit;
    for (int64_t k = 0; k < n; k++) {
        const CmpRow *s = &rows[k];
        const struct {
            const char *name;
            int64_t v, lo, hi;
        } checks[] = {
            {"kind", s->kind, KV_CMP_REFERENCE, KV_CMP_LAST},
            {"verdict", s->verdict, KV_VERDICT_PASS, KV_VERDICT_SKIP},
            {"run_a", s->run_a, 0, rep->n_runs - 1},
            {"run_b", s->run_b, 0, rep->n_runs - 1},
        };
        for (size_t j = 0; j < sizeof checks / sizeof checks[0]; j++) {
            if (checks[j].v < checks[j].lo || checks[j].v > checks[j].hi) {
                st = report_fail(c, KV_ERR_INPUT,
                                 "/comparisons[%" PRId64 "]: member %s: expected %" PRId64
                                 "..%" PRId64 ", found %" PRId64,
                                 k, checks[j].name, checks[j].lo, checks[j].hi, checks[j].v);
                goto exit;
            }
        }
    }
    if (n > 0) {
        st = h5r_charge(c, "/comparisons", (uint64_t)n * sizeof *rep->comparisons);
        if (st != KV_OK) goto exit;
        rep->comparisons = calloc((size_t)n, sizeof *rep->comparisons);
        if (rep->comparisons == NULL) {
            st = report_fail(c, KV_ERR_INTERNAL, "/comparisons: out of memory");
            goto exit;
        }
    }
    rep->n_comparisons = n;
    for (int64_t k = 0; k < n; k++) {
        const CmpRow *s = &rows[k];
        KvComparison *d = &rep->comparisons[k];
        d->kind = (KvCompareKind)s->kind;
        d->run_a = s->run_a;
        d->run_b = s->run_b;
        d->verdict = (KvVerdict)s->verdict;
        memcpy(d->message, s->message, sizeof d->message);
        d->first_step = s->first_step;
        d->first_row = s->first_row;
        d->first_probe = s->first_probe;
        d->near_ties = s->near_ties;
        d->max_abs_err = s->max_abs_err;
        d->max_rel_err = s->max_rel_err;
        d->nmse = s->nmse;
        d->kl = s->kl;
        d->top1_agreement = s->top1_agreement;
    }
exit:
    free(rows);
    return st;
}

/* The summary is derived data: it must be there with one row per run, and
 * its members must have the documented types, but nothing is loaded. */
static KvStatus h5r_summary(hid_t file, const KvReport *rep, ReportCtx *c) {
    SummaryRow *rows = NULL;
    int64_t n = 0;
    KvStatus st = h5r_table(file, "summary", SUMMARY_MEMBERS, N_MEMBERS(SUMMARY_MEMBERS),
                            sizeof *rows, rep->n_runs, rep->n_runs, "one per run", (void **)&rows,
                            &n, c);
    free(rows);
    return st;
}

/* Full logits, or (topk > 0) the top-k ids and values. Only the full logits
 * may be shared with other runs (the writer's hard links). */
static KvStatus h5r_logits(hid_t g, const char *objpath, KvRun *r, const hsize_t *d_logits,
                           ReportCtx *c) {
    if (r->topk == 0) {
        return h5r_dataset(g, objpath, "logits", H5T_FLOAT, H5T_NATIVE_FLOAT, sizeof(float), 3,
                           d_logits, true, (void **)&r->logits, c);
    }
    const hsize_t d_topk[3] = {d_logits[0], d_logits[1], (hsize_t)r->topk};
    KvStatus st = h5r_dataset(g, objpath, "topk_ids", H5T_INTEGER, H5T_NATIVE_INT32,
                              sizeof(int32_t), 3, d_topk, false, (void **)&r->topk_ids, c);
    if (st != KV_OK) return st;
    return h5r_dataset(g, objpath, "topk_values", H5T_FLOAT, H5T_NATIVE_FLOAT, sizeof(float), 3,
                       d_topk, false, (void **)&r->topk_values, c);
}

static KvStatus h5r_run_datasets(hid_t g, const char *objpath, KvRun *r, ReportCtx *c) {
    KvStatus st;
    const hsize_t S = (hsize_t)r->steps, B = (hsize_t)r->batch, V = (hsize_t)r->vocab,
                  P = (hsize_t)r->prompt_len, NP = (hsize_t)r->n_probes;
    const hsize_t d_prompt[2] = {B, P};
    const hsize_t d_rows[2] = {S, B};
    const hsize_t d_logits[3] = {S, B, V};
    const hsize_t d_names[1] = {NP};
    const hsize_t d_probes[3] = {S, NP, B};
    if ((st = h5r_dataset(g, objpath, "prompt", H5T_INTEGER, H5T_NATIVE_INT32, sizeof(int32_t), 2,
                          d_prompt, false, (void **)&r->prompt, c)) != KV_OK ||
        (st = h5r_dataset(g, objpath, "prompt_real", H5T_INTEGER, H5T_NATIVE_UINT8, sizeof(uint8_t),
                          2, d_prompt, false, (void **)&r->prompt_real, c)) != KV_OK ||
        (st = h5r_dataset(g, objpath, "tokens", H5T_INTEGER, H5T_NATIVE_INT32, sizeof(int32_t), 2,
                          d_rows, false, (void **)&r->tokens, c)) != KV_OK ||
        (st = h5r_logits(g, objpath, r, d_logits, c)) != KV_OK ||
        (st = h5r_dataset(g, objpath, "logits_hash", H5T_INTEGER, H5T_NATIVE_UINT64,
                          sizeof(uint64_t), 2, d_rows, false, (void **)&r->logits_hash, c)) !=
            KV_OK ||
        (st = h5r_dataset(g, objpath, "margins", H5T_FLOAT, H5T_NATIVE_FLOAT, sizeof(float), 2,
                          d_rows, false, (void **)&r->margins, c)) != KV_OK ||
        (st = h5r_dataset(g, objpath, "probe_names", H5T_STRING, H5I_INVALID_HID, KV_NAME_LEN, 1,
                          d_names, false, (void **)&r->probe_names, c)) != KV_OK ||
        (st = h5r_dataset(g, objpath, "probe_hash", H5T_INTEGER, H5T_NATIVE_UINT64,
                          sizeof(uint64_t), 3, d_probes, false, (void **)&r->probe_hash, c)) !=
            KV_OK) {
        return st;
    }
    return KV_OK;
}

/* The datasets a run group holds (SCHEMA.md): none when skipped. */
static const char *const RUN_NAMES_FULL[] = {"prompt",      "prompt_real", "tokens",
                                             "logits",      "logits_hash", "margins",
                                             "probe_names", "probe_hash",  NULL};
static const char *const RUN_NAMES_TOPK[] = {
    "prompt",      "prompt_real", "tokens",      "topk_ids",   "topk_values",
    "logits_hash", "margins",     "probe_names", "probe_hash", NULL};
static const char *const RUN_NAMES_SKIPPED[] = {NULL};

static KvStatus h5r_run(hid_t runs, int64_t i, int64_t n_runs, KvRun *r, ReportCtx *c) {
    KvStatus st = KV_OK;
    hid_t g = H5I_INVALID_HID;
    char name[32], objpath[48], expect[96];
    run_group_name(i, name, sizeof name);
    snprintf(objpath, sizeof objpath, "/runs/%s", name);
    snprintf(expect, sizeof expect, "a group (runs are numbered 0000..%04" PRId64 ")", n_runs - 1);
    st = h5r_check_object(runs, objpath, name, H5O_TYPE_GROUP, false, expect, c);
    if (st != KV_OK) goto exit;
    g = H5Gopen2(runs, name, H5P_DEFAULT);
    if (g < 0) {
        st = h5_fail(c, KV_ERR_INPUT, "%s: expected a group, found one HDF5 cannot open", objpath);
        goto exit;
    }
    /* The sizes are capped here, before their products are formed and
     * before any dataset is looked at (report_h5.h says why each cap). */
    int64_t repeat = 0, skipped = 0;
    if ((st = h5r_attr_string(g, objpath, "model", r->model, sizeof r->model, c)) != KV_OK ||
        (st = h5r_attr_string(g, objpath, "scenario", r->scenario, sizeof r->scenario, c)) !=
            KV_OK ||
        (st = h5r_attr_string(g, objpath, "variant", r->variant, sizeof r->variant, c)) != KV_OK ||
        (st = h5r_attr_string(g, objpath, "backend", r->backend, sizeof r->backend, c)) != KV_OK ||
        (st = h5r_attr_string(g, objpath, "mode", r->mode, sizeof r->mode, c)) != KV_OK ||
        (st = h5r_attr_range(g, objpath, "repeat", INT32_MIN, INT32_MAX, &repeat, c)) != KV_OK ||
        (st = h5r_attr_range(g, objpath, "skipped", 0, 1, &skipped, c)) != KV_OK ||
        (st = h5r_attr_string(g, objpath, "skip_reason", r->skip_reason, sizeof r->skip_reason,
                              c)) != KV_OK ||
        (st = h5r_attr_range(g, objpath, "steps", 0, KV_REPORT_MAX_STEPS, &r->steps, c)) != KV_OK ||
        (st = h5r_attr_range(g, objpath, "batch", 0, KV_REPORT_MAX_BATCH, &r->batch, c)) != KV_OK ||
        (st = h5r_attr_range(g, objpath, "vocab", 0, KV_REPORT_MAX_VOCAB, &r->vocab, c)) != KV_OK ||
        (st = h5r_attr_range(g, objpath, "prompt_len", 0, KV_REPORT_MAX_PROMPT_LEN, &r->prompt_len,
                             c)) != KV_OK ||
        (st = h5r_attr_range(g, objpath, "n_probes", 0, KV_REPORT_MAX_PROBES, &r->n_probes, c)) !=
            KV_OK ||
        (st = h5r_attr_i64(g, objpath, "graphs_captured", &r->graphs_captured, c)) != KV_OK ||
        (st = h5r_attr_i64(g, objpath, "replays_checked", &r->replays_checked, c)) != KV_OK ||
        (st = h5r_attr_i64(g, objpath, "replay_mismatch_step", &r->replay_mismatch_step, c)) !=
            KV_OK ||
        (st = h5r_attr_value(g, objpath, "seconds", H5T_FLOAT, H5T_NATIVE_DOUBLE, &r->seconds,
                             c)) != KV_OK) {
        goto exit;
    }
    r->repeat = (int32_t)repeat;
    r->skipped = skipped != 0;
    /* topk: absent in reports that always stored full logits. */
    if (H5Aexists(g, "topk") > 0) {
        int64_t topk = 0;
        const int64_t hi = r->vocab < KV_REPORT_MAX_TOPK ? r->vocab : KV_REPORT_MAX_TOPK;
        st = h5r_attr_range(g, objpath, "topk", 0, hi, &topk, c);
        if (st != KV_OK) goto exit;
        r->topk = (int32_t)topk;
    }
    /* fault and prefill_chunk: absent in reports from before planted faults
     * were recorded (clean runs, whole-prompt prefill unknown: 0). */
    if (H5Aexists(g, "fault") > 0) {
        st = h5r_attr_string(g, objpath, "fault", r->fault, sizeof r->fault, c);
        if (st != KV_OK) goto exit;
    }
    if (H5Aexists(g, "prefill_chunk") > 0) {
        st = h5r_attr_range(g, objpath, "prefill_chunk", 0, INT64_MAX, &r->prefill_chunk, c);
        if (st != KV_OK) goto exit;
    }
    RunCounts n;
    if (!run_counts(r, &n)) {
        st = report_fail(c, KV_ERR_INPUT,
                         "%s: expected sizes whose products fit in memory, found steps %" PRId64
                         ", batch %" PRId64 ", vocab %" PRId64 ", prompt_len %" PRId64
                         ", n_probes %" PRId64,
                         objpath, r->steps, r->batch, r->vocab, r->prompt_len, r->n_probes);
        goto exit;
    }
    /* A skipped run with datasets is a damaged report (its skipped flag
     * would hide a result), as is any object the schema does not name. */
    LinkScan scan = {.names = r->skipped   ? RUN_NAMES_SKIPPED
                              : r->topk > 0 ? RUN_NAMES_TOPK
                                            : RUN_NAMES_FULL,
                     .n_runs = 0,
                     .expect = "a dataset",
                     .found = "",
                     .bad_link = false};
    st = h5r_scan_group(g, objpath, &scan,
                        r->skipped    ? "attributes (the run is skipped)"
                        : r->topk > 0 ? "the datasets of a top-k run (SCHEMA.md)"
                                      : "the datasets of a run (SCHEMA.md)",
                        c);
    if (st != KV_OK) goto exit;
    if (!r->skipped) st = h5r_run_datasets(g, objpath, r, c);
exit:
    h5_close(H5Gclose, g, objpath, &st, c);
    return st;
}

static KvStatus h5r_runs(hid_t file, KvReport *rep, ReportCtx *c) {
    KvStatus st = KV_OK;
    hid_t runs = H5I_INVALID_HID;
    st = h5r_check_object(file, "/runs", "runs", H5O_TYPE_GROUP, false, "a group", c);
    if (st != KV_OK) goto exit;
    runs = H5Gopen2(file, "runs", H5P_DEFAULT);
    if (runs < 0) {
        st = h5_fail(c, KV_ERR_INPUT, "/runs: expected a group, found one HDF5 cannot open");
        goto exit;
    }
    H5G_info_t info;
    if (H5Gget_info(runs, &info) < 0) {
        st = h5_fail(c, KV_ERR_INPUT, "/runs: cannot list");
        goto exit;
    }
    if (info.nlinks > (hsize_t)KV_REPORT_MAX_RUNS) {
        st = report_fail(c, KV_ERR_INPUT,
                         "/runs: expected at most %" PRId64
                         " runs (KV_REPORT_MAX_RUNS), found %llu",
                         KV_REPORT_MAX_RUNS, (unsigned long long)info.nlinks);
        goto exit;
    }
    const int64_t n = (int64_t)info.nlinks;
    /* every name a run group's; h5r_run then finds each of 0000..n-1, so
     * a gap is named as the run that is missing */
    LinkScan scan = {.names = NULL,
                     .n_runs = KV_REPORT_MAX_RUNS,
                     .expect = "a run group",
                     .found = "",
                     .bad_link = false};
    st = h5r_scan_group(runs, "/runs", &scan, "run groups named by their index (0000, 0001, ...)",
                        c);
    if (st != KV_OK) goto exit;
    if (n > 0) {
        st = h5r_charge(c, "/runs", (uint64_t)n * sizeof *rep->runs);
        if (st != KV_OK) goto exit;
        rep->runs = calloc((size_t)n, sizeof *rep->runs);
        if (rep->runs == NULL) {
            st = report_fail(c, KV_ERR_INTERNAL, "/runs: out of memory");
            goto exit;
        }
    }
    rep->n_runs = n;
    for (int64_t i = 0; i < n; i++) {
        st = h5r_run(runs, i, n, &rep->runs[i], c);
        if (st != KV_OK) goto exit;
    }
exit:
    h5_close(H5Gclose, runs, "/runs", &st, c);
    return st;
}

/* What the root group may hold (SCHEMA.md, Layout). */
static const char *const ROOT_NAMES[] = {"tolerances", "runs", "comparisons", "summary", "bisect",
                                         NULL};

KvStatus kv_report_read_h5(const char *path, KvReport *out, KvError *err) {
    if (path == NULL || out == NULL) {
        return kv_error_set(err, KV_ERR_INPUT, "kv_report_read_h5: NULL %s",
                            path == NULL ? "path" : "output");
    }
    ReportCtx c = {.path = path, .err = err, .file_size = 0, .budget = KV_REPORT_MAX_READ_BYTES};
    KvReport rep;
    memset(&rep, 0, sizeof rep);
    KvStatus st = KV_OK;
    hid_t fapl = H5I_INVALID_HID, file = H5I_INVALID_HID;
    QuietErrors quiet = {.saved = false};

    /* A writer's temporary is never a report: the writer removes it, and
     * one left by a killed writer of an older version may be incomplete. */
    if (kv_report_is_temp_name(path)) {
        st = report_fail(&c, KV_ERR_INPUT,
                         "expected a report, found a writer's temporary (NAME.tmp-PID, left by "
                         "an interrupted write; the report is NAME)");
        goto exit;
    }
    /* The OS says why a file cannot be opened better than HDF5 does. */
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        st = report_fail(&c, KV_ERR_INPUT, "cannot open: %s", strerror(errno));
        goto exit;
    }
    struct stat sb;
    const int stat_rc = fstat(fd, &sb);
    const int stat_errno = errno;
    if (close(fd) != 0 || stat_rc != 0) {
        st = report_fail(&c, KV_ERR_INPUT, "cannot open: %s",
                         strerror(stat_rc != 0 ? stat_errno : errno));
        goto exit;
    }
    if (!S_ISREG(sb.st_mode)) {
        st = report_fail(&c, KV_ERR_INPUT, "expected an HDF5 file, found %s",
                         S_ISDIR(sb.st_mode) ? "a directory" : "something that is not a file");
        goto exit;
    }
    c.file_size = sb.st_size > 0 ? (uint64_t)sb.st_size : 0;
    st = h5_quiet_begin(&quiet, &c);
    if (st != KV_OK) goto exit;
    /* H5Fis_hdf5 is the 1.10 call (H5Fis_accessible from 1.12 on): it finds
     * the signature at 0, 512, 1024, ... so a user block is fine */
    const htri_t is_h5 = H5Fis_hdf5(path);
    if (is_h5 < 0) {
        st = h5_fail(&c, KV_ERR_INPUT, "expected an HDF5 file, found one that cannot be probed");
        goto exit;
    }
    if (is_h5 == 0) {
        st = report_fail(&c, KV_ERR_INPUT,
                         "expected an HDF5 file, found %lld bytes without an HDF5 signature",
                         (long long)sb.st_size);
        goto exit;
    }
    fapl = H5Pcreate(H5P_FILE_ACCESS);
    if (fapl < 0 || H5Pset_fclose_degree(fapl, H5F_CLOSE_STRONG) < 0) {
        st = h5_fail(&c, KV_ERR_INTERNAL, "cannot set up the file access properties");
        goto exit;
    }
    file = H5Fopen(path, H5F_ACC_RDONLY, fapl);
    if (file < 0) {
        st = h5_fail(&c, KV_ERR_INPUT,
                     "expected a complete HDF5 file, found one HDF5 cannot open (%lld bytes; "
                     "truncated or damaged?)",
                     (long long)sb.st_size);
        goto exit;
    }
    LinkScan scan = {
        .names = ROOT_NAMES, .n_runs = 0, .expect = "an object", .found = "", .bad_link = false};
    if ((st = h5r_root_attrs(file, &rep, &c)) != KV_OK ||
        (st = h5r_scan_group(file, "/", &scan, "tolerances, runs, comparisons, summary and bisect",
                             &c)) != KV_OK ||
        (st = h5r_tolerances(file, &rep, &c)) != KV_OK ||
        (st = h5r_runs(file, &rep, &c)) != KV_OK ||
        (st = h5r_comparisons(file, &rep, &c)) != KV_OK ||
        (st = h5r_summary(file, &rep, &c)) != KV_OK) {
        goto exit;
    }
exit:
    h5_close(H5Fclose, file, "file", &st, &c);
    h5_close(H5Pclose, fapl, "file access properties", &st, &c);
    h5_quiet_end(&quiet, &st, &c);
    if (st == KV_OK) {
        *out = rep;
    } else {
        kv_report_free(&rep);
        memset(out, 0, sizeof *out);
    }
    return st;
}
