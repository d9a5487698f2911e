/* h5util.c: the HDF5 plumbing and the report layout shared by the writer
 * and the reader (h5util.h).
 *
 * Written in the netCDF-C style: every HDF5 call is checked, handles start as
 * H5I_INVALID_HID and are closed in reverse order at one exit label, HDF5's
 * automatic error printing is off for the duration of a call and the
 * innermost entry of the error stack is copied into the KvError. */
#include "h5util.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

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

KvStatus h5_report_fail(ReportCtx *c, KvStatus st, const char *fmt, ...) {
    char what[900];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return kv_error_set(c->err, st, "%s: %s", c->path, what);
}

KvStatus h5_fail(ReportCtx *c, KvStatus st, const char *fmt, ...) {
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

void h5_close(herr_t (*close_fn)(hid_t), hid_t id, const char *what, KvStatus *st, ReportCtx *c) {
    if (id < 0) return;
    if (close_fn(id) < 0 && *st == KV_OK) {
        *st = h5_fail(c, KV_ERR_INTERNAL, "%s: cannot close", what);
    }
}

KvStatus h5_quiet_begin(QuietErrors *q, ReportCtx *c) {
    q->saved = false;
    if (H5Eget_auto2(H5E_DEFAULT, &q->func, &q->data) < 0) {
        return h5_report_fail(c, KV_ERR_INTERNAL, "cannot query HDF5 error printing");
    }
    q->saved = true;
    if (H5Eset_auto2(H5E_DEFAULT, NULL, NULL) < 0) {
        return h5_report_fail(c, KV_ERR_INTERNAL, "cannot turn HDF5 error printing off");
    }
    return KV_OK;
}

void h5_quiet_end(QuietErrors *q, KvStatus *st, ReportCtx *c) {
    if (!q->saved) return;
    if (H5Eset_auto2(H5E_DEFAULT, q->func, q->data) < 0 && *st == KV_OK) {
        *st = h5_report_fail(c, KV_ERR_INTERNAL, "cannot restore HDF5 error printing");
    }
}

/* ---- types ---------------------------------------------------------------- */

/* Tables are read through NULLPAD memory types: a file string that fills
 * its field then arrives without a terminator and is caught (NULLTERM
 * would cut it silently). */
KvStatus h5_string_type_pad(size_t width, H5T_str_t pad, hid_t *out, ReportCtx *c) {
    KvStatus st = KV_OK;
    hid_t t = H5I_INVALID_HID;
    *out = H5I_INVALID_HID;
    t = H5Tcopy(H5T_C_S1);
    if (t < 0 || H5Tset_size(t, width) < 0 || H5Tset_strpad(t, pad) < 0 ||
        H5Tset_cset(t, H5T_CSET_UTF8) < 0) {
        st = h5_fail(c, KV_ERR_INTERNAL, "cannot make a string type of %zu bytes", width);
        goto cleanup;
    }
    *out = t;
    t = H5I_INVALID_HID;
cleanup:
    h5_close(H5Tclose, t, "string type", &st, c);
    return st;
}

KvStatus h5_string_type(size_t width, hid_t *out, ReportCtx *c) {
    return h5_string_type_pad(width, H5T_STR_NULLTERM, out, c);
}

size_t h5_column_size(const Column *m) {
    switch (m->kind) {
    case COL_I32: return 4;
    case COL_I64: return 8;
    case COL_F64: return 8;
    case COL_STR: return m->width;
    }
    return 0;
}

KvStatus h5_compound_type(const ColumnTable *t, bool file, hid_t *out, ReportCtx *c) {
    KvStatus st = KV_OK;
    hid_t type = H5I_INVALID_HID, str = H5I_INVALID_HID;
    const Column *m = t->columns;
    *out = H5I_INVALID_HID;
    size_t size = t->row_size;
    if (file) {
        size = 0;
        for (size_t i = 0; i < t->n_columns; i++) size += h5_column_size(&m[i]);
    }
    type = H5Tcreate(H5T_COMPOUND, size);
    if (type < 0) {
        st = h5_fail(c, KV_ERR_INTERNAL, "cannot create a compound type");
        goto cleanup;
    }
    size_t off = 0;
    for (size_t i = 0; i < t->n_columns; i++) {
        hid_t mt = H5I_INVALID_HID;
        switch (m[i].kind) {
        case COL_I32: mt = file ? H5T_STD_I32LE : H5T_NATIVE_INT32; break;
        case COL_I64: mt = file ? H5T_STD_I64LE : H5T_NATIVE_INT64; break;
        case COL_F64: mt = file ? H5T_IEEE_F64LE : H5T_NATIVE_DOUBLE; break;
        case COL_STR:
            st = h5_string_type(m[i].width, &str, c);
            if (st != KV_OK) goto cleanup;
            mt = str;
            break;
        }
        if (H5Tinsert(type, m[i].name, file ? off : m[i].offset, mt) < 0) {
            st = h5_fail(c, KV_ERR_INTERNAL, "cannot add member %s to a compound type", m[i].name);
            goto cleanup;
        }
        off += h5_column_size(&m[i]);
        h5_close(H5Tclose, str, "string type", &st, c);
        str = H5I_INVALID_HID;
        if (st != KV_OK) goto cleanup;
    }
    *out = type;
    type = H5I_INVALID_HID;
cleanup:
    h5_close(H5Tclose, str, "string type", &st, c);
    h5_close(H5Tclose, type, "compound type", &st, c);
    return st;
}

_Static_assert(sizeof(int32_t) == 4 && sizeof(int64_t) == 8 && sizeof(double) == 8,
               "the file types assume 4- and 8-byte members");

/* ---- the compound tables -------------------------------------------------- */

/* 0, or a compile error when a and b differ in size: a row and its report
 * struct exchange a column's width bytes (an enum and int32_t included). */
#define SAME_SIZE(a, b) (0 * sizeof(char[sizeof(a) == sizeof(b) ? 1 : -1]))

/* Column f of staging struct Row, copied to and from field f of Rep. */
#define COLUMN(Row, Rep, f, k)                                                                     \
    {#f, k, offsetof(Row, f), sizeof(((Row *)0)->f) + SAME_SIZE(((Row *)0)->f, ((Rep *)0)->f),     \
     offsetof(Rep, f)}
/* Column f of a table computed by the writer. */
#define DERIVED(Row, f, k) {#f, k, offsetof(Row, f), sizeof(((Row *)0)->f), 0}

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

static const Column TOL_COLUMNS[] = {
    COLUMN(TolRow, KvTolerance, name, COL_STR),
    COLUMN(TolRow, KvTolerance, value, COL_F64),
    COLUMN(TolRow, KvTolerance, reason, COL_STR),
};

static const Column CMP_COLUMNS[] = {
    COLUMN(CmpRow, KvComparison, kind, COL_I32),
    COLUMN(CmpRow, KvComparison, run_a, COL_I64),
    COLUMN(CmpRow, KvComparison, run_b, COL_I64),
    COLUMN(CmpRow, KvComparison, verdict, COL_I32),
    COLUMN(CmpRow, KvComparison, message, COL_STR),
    COLUMN(CmpRow, KvComparison, first_step, COL_I64),
    COLUMN(CmpRow, KvComparison, first_row, COL_I64),
    COLUMN(CmpRow, KvComparison, first_probe, COL_I64),
    COLUMN(CmpRow, KvComparison, near_ties, COL_I64),
    COLUMN(CmpRow, KvComparison, max_abs_err, COL_F64),
    COLUMN(CmpRow, KvComparison, max_rel_err, COL_F64),
    COLUMN(CmpRow, KvComparison, nmse, COL_F64),
    COLUMN(CmpRow, KvComparison, kl, COL_F64),
    COLUMN(CmpRow, KvComparison, top1_agreement, COL_F64),
};

static const Column SUMMARY_COLUMNS[] = {
    DERIVED(SummaryRow, index, COL_I64),        DERIVED(SummaryRow, model, COL_STR),
    DERIVED(SummaryRow, scenario, COL_STR),     DERIVED(SummaryRow, variant, COL_STR),
    DERIVED(SummaryRow, backend, COL_STR),      DERIVED(SummaryRow, mode, COL_STR),
    DERIVED(SummaryRow, repeat, COL_I32),       DERIVED(SummaryRow, verdict, COL_I32),
    DERIVED(SummaryRow, verdict_name, COL_STR), DERIVED(SummaryRow, first_divergence, COL_STR),
    DERIVED(SummaryRow, max_rel_err, COL_F64),  DERIVED(SummaryRow, graphs_captured, COL_I64),
};

const ColumnTable H5_TOLERANCES = {"tolerances", TOL_COLUMNS, N_OF(TOL_COLUMNS), sizeof(TolRow),
                                   sizeof(KvTolerance)};
const ColumnTable H5_COMPARISONS = {"comparisons", CMP_COLUMNS, N_OF(CMP_COLUMNS), sizeof(CmpRow),
                                    sizeof(KvComparison)};
const ColumnTable H5_SUMMARY = {"summary", SUMMARY_COLUMNS, N_OF(SUMMARY_COLUMNS),
                                sizeof(SummaryRow), 0};

/* ---- attributes ----------------------------------------------------------- */

/* The kind of a struct field, from its C type (an array of char decays to
 * char *): a field of another type does not compile. */
#define FIELD_KIND(x)                                                                              \
    _Generic((x),                                                                                  \
        char *: FIELD_STR,                                                                         \
        int32_t: FIELD_I32,                                                                        \
        int64_t: FIELD_I64,                                                                        \
        uint64_t: FIELD_U64,                                                                       \
        bool: FIELD_BOOL,                                                                          \
        double: FIELD_F64)
#define FIELD(T, f)                                                                                \
    .name = #f, .kind = FIELD_KIND(((T *)0)->f), .offset = offsetof(T, f),                         \
    .width = sizeof(((T *)0)->f)

static const AttrField ROOT_FIELDS[] = {
    {.name = "schema_version",
     .kind = FIELD_VERSION,
     .lo = KV_REPORT_SCHEMA_VERSION,
     .hi = KV_REPORT_SCHEMA_VERSION},
    {FIELD(KvReport, tool_version)},
    {FIELD(KvReport, git_commit)},
    {FIELD(KvReport, host)},
    {FIELD(KvReport, device)},
    {FIELD(KvReport, math_mode)},
    {FIELD(KvReport, weight_seed)},
    {FIELD(KvReport, prompt_seed)},
    {FIELD(KvReport, model_hash)},
    {.name = "model_hash_hex",
     .kind = FIELD_HEX,
     .offset = offsetof(KvReport, model_hash),
     .width = KV_H5_HEX_LEN,
     .of = "model_hash"},
    {FIELD(KvReport, shard)},
};

static const AttrField RUN_FIELDS[] = {
    {FIELD(KvRun, model)},
    {FIELD(KvRun, scenario)},
    {FIELD(KvRun, variant)},
    {FIELD(KvRun, backend)},
    {FIELD(KvRun, mode)},
    /* counts are never negative: a negative repeat or graph count is no
     * run's (the external reader once took them) */
    {FIELD(KvRun, repeat), .lo = 0, .hi = INT32_MAX},
    /* topk, fault and prefill_chunk are absent from reports that always
     * stored full logits, and from those written before planted faults
     * were recorded (clean runs, whole-prompt prefill unknown: 0) */
    {FIELD(KvRun, topk), .lo = 0, .hi = KV_REPORT_MAX_TOPK, .optional = true, .capped = true,
     .cap_offset = offsetof(KvRun, vocab)},
    {FIELD(KvRun, fault), .optional = true},
    {FIELD(KvRun, prefill_chunk), .lo = 0, .hi = INT64_MAX, .optional = true},
    /* a prefix-reuse run's script, only when set (every other run keeps
     * the bytes it had) */
    {FIELD(KvRun, save_after), .lo = 0, .hi = KV_REPORT_MAX_PROMPT_LEN, .optional = true,
     .when_set = true, .unset = 0},
    {FIELD(KvRun, switch_step), .lo = 0, .hi = KV_REPORT_MAX_STEPS, .optional = true,
     .when_set = true, .unset = 0},
    {FIELD(KvRun, suffix_len), .lo = 0, .hi = KV_REPORT_MAX_PROMPT_LEN, .optional = true,
     .when_set = true, .unset = 0},
    /* a context-shift run's script, only when set */
    {FIELD(KvRun, shift_step), .lo = 0, .hi = KV_REPORT_MAX_STEPS, .optional = true,
     .when_set = true, .unset = 0},
    {FIELD(KvRun, shift_keep), .lo = 0, .hi = KV_REPORT_MAX_PROMPT_LEN + KV_REPORT_MAX_STEPS,
     .optional = true, .when_set = true, .unset = 0},
    {FIELD(KvRun, shift_drop), .lo = 0, .hi = KV_REPORT_MAX_PROMPT_LEN + KV_REPORT_MAX_STEPS,
     .optional = true, .when_set = true, .unset = 0},
    /* written by another engine (`gate --external`), and only when set, so
     * that the runs of kvrepro's own gate keep the bytes they had before
     * these existed */
    {FIELD(KvRun, engine), .optional = true, .when_set = true},
    {FIELD(KvRun, recompiles), .lo = -1, .hi = INT64_MAX, .optional = true, .when_set = true,
     .unset = -1},
    {FIELD(KvRun, graph_budget), .lo = -1, .hi = INT64_MAX, .optional = true, .when_set = true,
     .unset = -1},
    /* kvrepro-hf capture's own (docs/SCHEMA.md), only when set: `gate
     * --external` keeps what the recording says about the run */
    {FIELD(KvRun, attn_impl), .optional = true, .when_set = true},
    {FIELD(KvRun, dtype), .optional = true, .when_set = true},
    {FIELD(KvRun, cache_layer), .optional = true, .when_set = true},
    {FIELD(KvRun, window), .lo = 0, .hi = INT64_MAX, .optional = true, .when_set = true,
     .unset = 0},
    {FIELD(KvRun, probes_seen), .optional = true, .when_set = true},
    {FIELD(KvRun, first_recompile), .optional = true, .when_set = true},
    /* a run of a prompts file with texts, only when given */
    {FIELD(KvRun, tokenizer), .optional = true, .when_set = true},
    {FIELD(KvRun, skipped), .lo = 0, .hi = 1},
    {FIELD(KvRun, skip_reason)},
    /* the sizes are capped before their products are formed and before
     * any dataset is looked at (report_h5.h says why each cap) */
    {FIELD(KvRun, steps), .lo = 0, .hi = KV_REPORT_MAX_STEPS},
    {FIELD(KvRun, batch), .lo = 0, .hi = KV_REPORT_MAX_BATCH},
    {FIELD(KvRun, vocab), .lo = 0, .hi = KV_REPORT_MAX_VOCAB},
    {FIELD(KvRun, prompt_len), .lo = 0, .hi = KV_REPORT_MAX_PROMPT_LEN},
    {FIELD(KvRun, n_probes), .lo = 0, .hi = KV_REPORT_MAX_PROBES},
    {FIELD(KvRun, graphs_captured), .lo = 0, .hi = INT64_MAX},
    {FIELD(KvRun, replays_checked), .lo = 0, .hi = INT64_MAX},
    {FIELD(KvRun, replay_mismatch_step), .lo = -1, .hi = KV_REPORT_MAX_STEPS},
    {FIELD(KvRun, seconds)},
};

const AttrTable H5_ROOT_ATTRS = {ROOT_FIELDS, N_OF(ROOT_FIELDS)};
const AttrTable H5_RUN_ATTRS = {RUN_FIELDS, N_OF(RUN_FIELDS)};

bool h5_attr_is_set(const AttrField *f, const void *base) {
    if (!f->when_set) return true;
    const char *p = (const char *)base + f->offset;
    switch (f->kind) {
    case FIELD_STR: return p[0] != '\0';
    case FIELD_I32: return *(const int32_t *)p != f->unset;
    case FIELD_I64: return *(const int64_t *)p != f->unset;
    case FIELD_BOOL: return *(const bool *)p != (f->unset != 0);
    case FIELD_U64:
    case FIELD_F64:
    case FIELD_VERSION:
    case FIELD_HEX: break; /* no unset value: always written */
    }
    return true;
}

bool h5_attr_field_range(const AttrField *f, const void *base, int64_t *lo, int64_t *hi) {
    if (f->kind != FIELD_I32 && f->kind != FIELD_I64 && f->kind != FIELD_BOOL) return false;
    *lo = f->lo;
    *hi = f->hi;
    if (f->capped) {
        const int64_t cap = *(const int64_t *)((const char *)base + f->cap_offset);
        if (cap < *hi) *hi = cap;
    }
    return true;
}

bool h5_attr_field_value(const AttrField *f, const void *base, int64_t *v) {
    const char *p = (const char *)base + f->offset;
    switch (f->kind) {
    case FIELD_I32: *v = *(const int32_t *)p; return true;
    case FIELD_I64: *v = *(const int64_t *)p; return true;
    case FIELD_BOOL: *v = *(const bool *)p ? 1 : 0; return true;
    case FIELD_STR:
    case FIELD_U64:
    case FIELD_F64:
    case FIELD_VERSION:
    case FIELD_HEX: break;
    }
    return false;
}

void h5_attr_fields_unset(const AttrTable *t, void *base) {
    for (size_t i = 0; i < t->n; i++) {
        const AttrField *f = &t->fields[i];
        if (!f->when_set) continue;
        char *p = (char *)base + f->offset;
        switch (f->kind) {
        case FIELD_STR: memset(p, 0, f->width); break;
        case FIELD_I32: *(int32_t *)p = (int32_t)f->unset; break;
        case FIELD_I64: *(int64_t *)p = f->unset; break;
        case FIELD_BOOL: *(bool *)p = f->unset != 0; break;
        case FIELD_U64:
        case FIELD_F64:
        case FIELD_VERSION:
        case FIELD_HEX: break;
        }
    }
}

/* ---- a run's datasets ----------------------------------------------------- */

#define DATA_KIND(x)                                                                               \
    _Generic((x),                                                                                  \
        int32_t: DATA_I32,                                                                         \
        uint8_t: DATA_U8,                                                                          \
        uint64_t: DATA_U64,                                                                        \
        float: DATA_F32,                                                                           \
        double: DATA_F64,                                                                          \
        char *: DATA_NAME)
/* The array KvRun.f, its kind and element size from its type. */
#define DATASET(f)                                                                                 \
    .name = #f, .kind = DATA_KIND(*((KvRun *)0)->f), .offset = offsetof(KvRun, f),                 \
    .elem = sizeof(*((KvRun *)0)->f)

_Static_assert(sizeof(*((KvRun *)0)->probe_names) == KV_NAME_LEN,
               "probe names are stored as fixed-length strings of KV_NAME_LEN bytes");

/* Full logits, or (topk > 0) each row's top-k ids and values for large
 * vocabularies; the full logits are still identified by logits_hash. Clean
 * variants reproduce the reference exactly, so runs with the same logits
 * share one dataset (report_h5_write.c). */
static const RunDataset RUN_SETS[] = {
    {DATASET(prompt), .shape = SHAPE_PROMPT, .held = HELD_ALWAYS},
    {DATASET(prompt_real), .shape = SHAPE_PROMPT, .held = HELD_ALWAYS},
    {DATASET(tokens), .shape = SHAPE_ROWS, .held = HELD_ALWAYS},
    {DATASET(logits), .shape = SHAPE_LOGITS, .held = HELD_FULL_LOGITS, .chunked = true,
     .shared = true},
    {DATASET(topk_ids), .shape = SHAPE_TOPK, .held = HELD_TOPK, .chunked = true},
    {DATASET(topk_values), .shape = SHAPE_TOPK, .held = HELD_TOPK, .chunked = true},
    {DATASET(logits_hash), .shape = SHAPE_ROWS, .held = HELD_ALWAYS},
    {DATASET(margins), .shape = SHAPE_ROWS, .held = HELD_ALWAYS},
    {DATASET(probe_names), .shape = SHAPE_NAMES, .held = HELD_ALWAYS},
    {DATASET(probe_hash), .shape = SHAPE_PROBES, .held = HELD_ALWAYS},
    {DATASET(fp64_rel_err), .shape = SHAPE_STEPS, .held = HELD_IF_SET},
    {DATASET(suffix), .shape = SHAPE_SUFFIX, .held = HELD_IF_SET},
};

const RunDatasetTable H5_RUN_DATASETS = {RUN_SETS, N_OF(RUN_SETS)};

bool h5_run_script_ok(const KvRun *r) {
    /* a context shift: whole, alone, and inside the positions stored
     * before it (the decode's own rule, less the window it cannot see) */
    const bool shift = r->shift_step != 0 || r->shift_keep != 0 || r->shift_drop != 0;
    if (shift && (r->shift_step < 1 || r->shift_drop < 1 || r->shift_keep < 0 ||
                  r->switch_step != 0 ||
                  r->shift_keep + r->shift_drop > r->prompt_len + r->shift_step - 1)) {
        return false;
    }
    const bool any = r->save_after != 0 || r->switch_step != 0 || r->suffix_len != 0 ||
                     r->suffix != NULL;
    return !any || (r->save_after >= 1 && r->save_after < r->prompt_len && r->switch_step >= 1 &&
                    r->switch_step < r->steps && r->suffix_len >= 1 &&
                    r->suffix_len <= KV_REPORT_MAX_PROMPT_LEN &&
                    (r->suffix != NULL || r->skipped));
}

bool h5_run_holds(const KvRun *r, const RunDataset *d) {
    if (r->skipped) return false;
    switch (d->held) {
    case HELD_ALWAYS: return true;
    case HELD_FULL_LOGITS: return r->topk == 0;
    case HELD_TOPK: return r->topk > 0;
    case HELD_IF_SET: return *(void *const *)((const char *)r + d->offset) != NULL;
    }
    return false;
}

/* The first rank of d0, d1, d2 into dims; returns rank. */
static int h5_dims(hsize_t *dims, int rank, hsize_t d0, hsize_t d1, hsize_t d2) {
    const hsize_t d[3] = {d0, d1, d2};
    for (int k = 0; k < rank; k++) dims[k] = d[k];
    return rank;
}

int h5_run_shape(const KvRun *r, RunShape s, hsize_t *dims) {
    const hsize_t S = (hsize_t)r->steps, B = (hsize_t)r->batch, V = (hsize_t)r->vocab,
                  P = (hsize_t)r->prompt_len, NP = (hsize_t)r->n_probes, K = (hsize_t)r->topk;
    switch (s) {
    case SHAPE_PROMPT: return h5_dims(dims, 2, B, P, 0);
    case SHAPE_ROWS: return h5_dims(dims, 2, S, B, 0);
    case SHAPE_LOGITS: return h5_dims(dims, 3, S, B, V);
    case SHAPE_TOPK: return h5_dims(dims, 3, S, B, K);
    case SHAPE_NAMES: return h5_dims(dims, 1, NP, 0, 0);
    case SHAPE_PROBES: return h5_dims(dims, 3, S, NP, B);
    case SHAPE_STEPS: return h5_dims(dims, 1, S, 0, 0);
    case SHAPE_SUFFIX: return h5_dims(dims, 2, B, (hsize_t)r->suffix_len, 0);
    }
    return 0;
}

/* ---- sizes ---------------------------------------------------------------- */

void h5_run_group_name(int64_t i, char *buf, size_t n) { snprintf(buf, n, "%04" PRId64, i); }

bool h5_size_mul(size_t a, size_t b, size_t *out) {
    if (a != 0 && b > SIZE_MAX / a) return false;
    *out = a * b;
    return true;
}

bool h5_shape_count(int rank, const hsize_t *dims, size_t *out) {
    size_t n = 1;
    for (int k = 0; k < rank; k++) {
        if (dims[k] > (hsize_t)SIZE_MAX || !h5_size_mul(n, (size_t)dims[k], &n)) return false;
    }
    *out = n;
    return true;
}

void h5_shape_text(int rank, const hsize_t *dims, char *buf, size_t n) {
    size_t used = 0;
    used += (size_t)snprintf(buf, n, "(");
    for (int k = 0; k < rank && used < n; k++) {
        used += (size_t)snprintf(buf + used, n - used, "%s%llu", k > 0 ? ", " : "",
                                 (unsigned long long)dims[k]);
    }
    if (used < n) snprintf(buf + used, n - used, ")");
}

bool h5_run_counts(const KvRun *r, RunCounts *n) {
    if (r->steps < 0 || r->batch < 0 || r->vocab < 0 || r->prompt_len < 0 || r->n_probes < 0) {
        return false;
    }
    return h5_size_mul((size_t)r->batch, (size_t)r->prompt_len, &n->prompt) &&
           h5_size_mul((size_t)r->steps, (size_t)r->batch, &n->rows) &&
           h5_size_mul(n->rows, (size_t)r->vocab, &n->logits) &&
           h5_size_mul(n->rows, (size_t)r->n_probes, &n->probes) &&
           h5_size_mul(n->logits, sizeof(float), &(size_t){0}) &&
           h5_size_mul(n->probes, sizeof(uint64_t), &(size_t){0});
}

/* ---- a run's values ------------------------------------------------------ */

bool h5_run_is_foreign(const KvRun *r) {
    return r->engine[0] != '\0' || (strncmp(r->backend, "cpu", sizeof r->backend) != 0 &&
                                    strncmp(r->backend, "cuda", sizeof r->backend) != 0);
}

/* Whether any of n floats is NaN or infinite. */
static bool any_nonfinite(const float *x, int64_t n) {
    for (int64_t k = 0; k < n; k++) {
        if (!isfinite(x[k])) return true;
    }
    return false;
}

/* The ids of one top-k row: each a token id, none twice. A sorted copy
 * finds a repeat in K log K (K <= KV_REPORT_MAX_TOPK, a stack buffer). */
static int cmp_i32(const void *a, const void *b) {
    const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

static bool topk_row_ok(const KvRun *r, int64_t s, int64_t b, char *why, size_t n) {
    const int64_t K = r->topk;
    const int32_t *ids = r->topk_ids + (s * r->batch + b) * K;
    int32_t sorted[KV_REPORT_MAX_TOPK];
    for (int64_t j = 0; j < K; j++) {
        if (ids[j] < 0 || ids[j] >= r->vocab) {
            snprintf(why, n,
                     "topk_ids[step %" PRId64 ", row %" PRId64 ", %" PRId64
                     "]: expected a token id 0..%" PRId64 ", found %" PRId32,
                     s, b, j, r->vocab - 1, ids[j]);
            return false;
        }
        sorted[j] = ids[j];
    }
    qsort(sorted, (size_t)K, sizeof *sorted, cmp_i32);
    for (int64_t j = 1; j < K; j++) {
        if (sorted[j] != sorted[j - 1]) continue;
        snprintf(why, n,
                 "topk_ids[step %" PRId64 ", row %" PRId64
                 "]: expected %" PRId64 " distinct token ids (the row's largest logits), "
                 "found id %" PRId32 " more than once",
                 s, b, K, sorted[j]);
        return false;
    }
    return true;
}

/* A margin is the top-1 logit minus the runner-up: never negative, and
 * NaN only where the row has a non-finite logit (which the gate's finite
 * check then fails). A negative one would make any flip look like a
 * near-tie, a NaN one beside finite logits says nothing about the row. */
static bool margin_ok(const KvRun *r, int64_t s, int64_t b, char *why, size_t n) {
    const int64_t i = s * r->batch + b;
    const float m = r->margins[i];
    if (m >= 0.0f) return true;
    if (isnan(m)) {
        const bool full = r->topk == 0;
        const int64_t width = full ? r->vocab : r->topk;
        const float *row = (full ? r->logits : r->topk_values) + i * width;
        if (width > 0 && row != NULL && any_nonfinite(row, width)) return true;
        snprintf(why, n,
                 "margins[step %" PRId64 ", row %" PRId64
                 "]: expected a number (the top-1 logit minus the runner-up), found NaN beside "
                 "the row's finite %s",
                 s, b, full ? "logits" : "top-k values");
        return false;
    }
    snprintf(why, n,
             "margins[step %" PRId64 ", row %" PRId64
             "]: expected >= 0 (the top-1 logit minus the runner-up), found %g",
             s, b, (double)m);
    return false;
}

/* The skip reason of another engine's run: why it was skipped (empty when
 * it ran), and a run that failed says so with the marker, exactly, so the
 * gate fails it instead of skipping it. */
static bool skip_reason_ok(const KvRun *r, char *why, size_t n) {
    const char *s = r->skip_reason;
    if (!r->skipped) {
        if (s[0] == '\0') return true;
        snprintf(why, n,
                 "attribute skip_reason: expected an empty reason on a run that ran (skipped "
                 "0), found '%.80s'",
                 s);
        return false;
    }
    const size_t marker = strlen(KV_REPORT_FAILED_MARKER);
    const char *t = s;
    while (*t == ' ' || *t == '\t' || *t == '\n' || *t == '\r') t++;
    const bool says_failed = strncasecmp(t, "fail", 4) == 0;
    const bool marked = strncmp(s, KV_REPORT_FAILED_MARKER, marker) == 0;
    if (s[0] != '\0' && (!says_failed || (marked && s[marker] != '\0'))) return true;
    if (s[0] == '\0') {
        snprintf(why, n,
                 "attribute skip_reason: expected why the run was skipped, found an empty "
                 "reason");
    } else {
        snprintf(why, n,
                 "attribute skip_reason: expected a run that failed to start with the marker "
                 "'" KV_REPORT_FAILED_MARKER "' and say what failed (docs/SCHEMA.md; the gate "
                 "then fails it), found '%.80s'",
                 s);
    }
    return false;
}

bool h5_run_values_ok(const KvRun *r, char *why, size_t n) {
    const bool foreign = h5_run_is_foreign(r);
    if (foreign && !skip_reason_ok(r, why, n)) return false;
    if (r->skipped) return true;
    for (int64_t s = 0; s < r->steps; s++) {
        for (int64_t b = 0; b < r->batch; b++) {
            if (r->topk > 0 && !topk_row_ok(r, s, b, why, n)) return false;
            if (foreign && !margin_ok(r, s, b, why, n)) return false;
        }
    }
    return true;
}

/* ---- what a read allocates ------------------------------------------------ */

/* *acc += a * b; false on overflow. */
static bool cost_add(uint64_t *acc, uint64_t a, uint64_t b) {
    if (a != 0 && b > UINT64_MAX / a) return false;
    if (*acc > UINT64_MAX - a * b) return false;
    *acc += a * b;
    return true;
}

bool h5_read_cost(const KvReport *rep, uint64_t *out) {
    const uint64_t nr = (uint64_t)rep->n_runs, nt = (uint64_t)rep->n_tolerances,
                   nc = (uint64_t)rep->n_comparisons;
    uint64_t acc = 0;
    /* tables: staged rows, then (tolerances, comparisons) their copies */
    bool ok = cost_add(&acc, nt, sizeof(TolRow) + sizeof(KvTolerance)) &&
              cost_add(&acc, nc, sizeof(CmpRow) + sizeof(KvComparison)) &&
              cost_add(&acc, nr, sizeof(SummaryRow) + sizeof(KvRun));
    for (int64_t i = 0; ok && i < rep->n_runs; i++) {
        const KvRun *r = &rep->runs[i];
        for (size_t k = 0; ok && k < H5_RUN_DATASETS.n; k++) {
            const RunDataset *d = &H5_RUN_DATASETS.sets[k];
            if (!h5_run_holds(r, d)) continue;
            hsize_t dims[3];
            const int rank = h5_run_shape(r, d->shape, dims);
            size_t count = 0;
            ok = h5_shape_count(rank, dims, &count) && cost_add(&acc, count, d->elem);
        }
    }
    *out = acc;
    return ok;
}

bool h5_prompt_text_ok(const KvRun *r, char *why, size_t n) {
    if (r->prompt_text == NULL) return true;
    for (int64_t b = 0; b < r->batch; b++) {
        const char *t = r->prompt_text[b];
        if (t == NULL) {
            snprintf(why, n, "prompt_text: expected %" PRId64 " row texts, found %" PRId64,
                     r->batch, b);
            return false;
        }
        const size_t len = strnlen(t, KV_PROMPT_TEXT_MAX_BYTES);
        if (len >= KV_PROMPT_TEXT_MAX_BYTES) {
            snprintf(why, n, "prompt_text[%" PRId64 "]: expected at most %zu bytes, found more",
                     b, KV_PROMPT_TEXT_MAX_BYTES - 1);
            return false;
        }
        if (!kv_utf8_valid(t)) {
            snprintf(why, n, "prompt_text[%" PRId64 "]: expected UTF-8 text, found bytes that "
                     "are not", b);
            return false;
        }
    }
    if (r->prompt_text[r->batch] != NULL) {
        snprintf(why, n, "prompt_text: expected %" PRId64 " row texts, found more", r->batch);
        return false;
    }
    return true;
}
