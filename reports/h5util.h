/* h5util.h: what the HDF5 report writer (report_h5_write.c) and reader
 * (report_h5_read.c) share. Private to reports/.
 *
 * Two things live here. The plumbing: failures that name the report's path
 * and end with the innermost HDF5 error, closing handles at one exit label,
 * HDF5's automatic error printing turned off for a call, string and
 * compound types, overflow-checked sizes. And the layout (SCHEMA.md), each
 * part listed once so that a field is added in one place and both sides
 * follow: the compound tables' columns, the root's and a run's attributes
 * and a run's datasets. The order of every list is the order in which the
 * writer creates the objects, so it is part of the file's bytes. */
#ifndef KV_H5UTIL_H
#define KV_H5UTIL_H

#include <hdf5.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "report_h5.h"

#define KV_H5_HEX_LEN 17    /* "%016" PRIx64 plus NUL */
#define KV_H5_VERDICT_LEN 8 /* "PASS", "FAIL", "SKIP" */
#define KV_H5_DIVERGENCE_LEN 512

/* Who a message is about: the path the caller gave (never the temporary);
 * when reading, what the file may still make the reader allocate. */
typedef struct {
    const char *path;
    KvError *err;
    uint64_t file_size; /* reading: the file's size in bytes */
    uint64_t budget;    /* reading: bytes still allowed (kv_limits_read_budget) */
    uint64_t allowed;   /* reading: the whole budget, for messages */
    /* reading: the runs read so far, and the shared datasets read, by
     * address (an open-addressing table of shared_cap slots, HADDR_UNDEF
     * when free, with the run that read each), so that a shared dataset is
     * decompressed once and then copied */
    const KvRun *runs;
    haddr_t *shared_addr;
    int64_t *shared_run;
    size_t shared_cap;
} ReportCtx;

/* ---- errors --------------------------------------------------------------- */

/* A failure with no HDF5 error behind it: "<path>: <what>". Returns st. */
KvStatus h5_report_fail(ReportCtx *c, KvStatus st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* A failed HDF5 call: "<path>: <what> (HDF5 <func>: <desc>)", the innermost
 * entry of the error stack, which is then cleared. KV_ERR_INTERNAL also
 * prints the whole stack on stderr. Returns st. */
KvStatus h5_fail(ReportCtx *c, KvStatus st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Closes id with close_fn when id is valid; a failed close sets *st only
 * when nothing failed before it (the first failure is the one worth
 * reporting). */
void h5_close(herr_t (*close_fn)(hid_t), hid_t id, const char *what, KvStatus *st, ReportCtx *c);

/* HDF5's automatic stack printing, off between h5_quiet_begin and
 * h5_quiet_end (which restores it, and may be called after a failed
 * begin). */
typedef struct {
    H5E_auto2_t func;
    void *data;
    bool saved;
} QuietErrors;

KvStatus h5_quiet_begin(QuietErrors *q, ReportCtx *c);
void h5_quiet_end(QuietErrors *q, KvStatus *st, ReportCtx *c);

/* ---- types ---------------------------------------------------------------- */

/* A fixed-length string type of width bytes, UTF-8, with padding pad, into
 * *out (the caller closes it). */
KvStatus h5_string_type_pad(size_t width, H5T_str_t pad, hid_t *out, ReportCtx *c);
/* The same, NUL-terminated: the type every string is written with. */
KvStatus h5_string_type(size_t width, hid_t *out, ReportCtx *c);

/* ---- compound tables ------------------------------------------------------
 * Each table is staged in rows of a fixed-width struct (TolRow, ...),
 * calloc'd so padding bytes are zero. One column list gives the memory
 * type (native, at the staging struct's offsets), the file type
 * (little-endian, packed) and, where the table stores report structs
 * (KvTolerance, KvComparison), the copy between a row and its struct. */
typedef enum { COL_I32, COL_I64, COL_F64, COL_STR } ColumnKind;

typedef struct {
    const char *name;
    ColumnKind kind;
    size_t offset;     /* in the staging row */
    size_t width;      /* bytes; COL_STR: including the terminator */
    size_t rep_offset; /* of the field of the same name and width in the
                        * report's struct; unused when the table has none */
} Column;

typedef struct {
    const char *name;      /* the dataset under the root ("tolerances") */
    const Column *columns; /* in file order */
    size_t n_columns;
    size_t row_size; /* of the staging struct */
    size_t rep_size; /* of the report's struct the rows copy; 0: derived rows (the summary) */
} ColumnTable;

/* Staging rows: fixed-width fields. */
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

extern const ColumnTable H5_TOLERANCES;  /* TolRow <-> KvTolerance */
extern const ColumnTable H5_COMPARISONS; /* CmpRow <-> KvComparison */
extern const ColumnTable H5_SUMMARY;     /* SummaryRow, derived from the runs */

/* Bytes of a column in the file (and in its staging row). */
size_t h5_column_size(const Column *m);

/* The compound type of t's rows: the memory type (file false) or the file
 * type (file true), into *out (the caller closes it). */
KvStatus h5_compound_type(const ColumnTable *t, bool file, hid_t *out, ReportCtx *c);

/* ---- attributes ------------------------------------------------------------
 * The scalar attributes of the root (KvReport) and of a run group (KvRun):
 * the writer writes them in table order; the reader reads the required ones
 * in table order, then the optional ones present, checking each against
 * its range. */
typedef enum {
    FIELD_STR,     /* char[width]: a fixed-length string */
    FIELD_I32,     /* int32_t */
    FIELD_I64,     /* int64_t */
    FIELD_U64,     /* uint64_t (no range) */
    FIELD_BOOL,    /* bool, stored as an unsigned 8-bit 0 or 1 */
    FIELD_F64,     /* double (no range) */
    FIELD_VERSION, /* no field: the 32-bit constant lo (= hi), which the reader requires */
    FIELD_HEX,     /* the uint64_t at offset as 16 lower-case hex digits; the reader
                    * requires that they agree (docs/SCHEMA.md) */
} FieldKind;

typedef struct {
    const char *name;
    FieldKind kind;
    size_t offset;  /* in the struct */
    size_t width;   /* bytes of the field (FIELD_HEX: of the string) */
    int64_t lo, hi; /* reader: the accepted values (integer kinds but FIELD_U64) */
    bool optional;  /* reader: absent from older reports (the field stays 0, or unset
                     * when when_set) */
    bool when_set;  /* writer: written only when the field is set, i.e. not "" (FIELD_STR)
                     * or not `unset` (integer kinds), so that reports of runs that never
                     * set it keep their bytes; reader: optional, absent = unset
                     * (h5_attr_fields_unset) */
    int64_t unset;  /* when_set integer kinds: the value that means "not recorded" */
    bool capped;    /* reader: hi is also at most the int64_t at cap_offset (a
                     * required field, so read before any optional one) */
    size_t cap_offset;
    const char *of; /* FIELD_HEX: the name of the field it spells, for messages */
} AttrField;

typedef struct {
    const AttrField *fields;
    size_t n;
} AttrTable;

extern const AttrTable H5_ROOT_ATTRS; /* of KvReport */
extern const AttrTable H5_RUN_ATTRS;  /* of KvRun */

/* Whether field f of the struct at base is to be written (always, unless
 * f->when_set and the field holds its unset value). */
bool h5_attr_is_set(const AttrField *f, const void *base);

/* The accepted values of integer field f (FIELD_I32, FIELD_I64, FIELD_BOOL)
 * of the struct at base, its cap applied (capped: at most the int64_t at
 * cap_offset): what the reader accepts and the writer writes. False for
 * a field of another kind. */
bool h5_attr_field_range(const AttrField *f, const void *base, int64_t *lo, int64_t *hi);

/* The value of integer field f of the struct at base into *v; false for a
 * field of another kind. */
bool h5_attr_field_value(const AttrField *f, const void *base, int64_t *v);

/* Sets every when_set field of table t in the struct at base to its unset
 * value: what an absent attribute reads as. */
void h5_attr_fields_unset(const AttrTable *t, void *base);

/* ---- a run's datasets -------------------------------------------------- */

/* Shapes (DESIGN §6), by the run's sizes S = steps, B = batch, V = vocab,
 * P = prompt_len, NP = n_probes, K = topk. */
typedef enum {
    SHAPE_PROMPT, /* (B, P) */
    SHAPE_ROWS,   /* (S, B) */
    SHAPE_LOGITS, /* (S, B, V) */
    SHAPE_TOPK,   /* (S, B, K) */
    SHAPE_NAMES,  /* (NP) */
    SHAPE_PROBES, /* (S, NP, B) */
    SHAPE_STEPS,  /* (S) */
    SHAPE_SUFFIX, /* (B, suffix_len) */
} RunShape;

typedef enum {
    DATA_I32,  /* int32_t */
    DATA_U8,   /* uint8_t */
    DATA_U64,  /* uint64_t */
    DATA_F32,  /* float */
    DATA_F64,  /* double */
    DATA_NAME, /* char[KV_NAME_LEN]: a fixed-length string */
} DataKind;

/* Which runs store a dataset; a skipped run stores none. HELD_IF_SET: an
 * optional array, written when the run has it (pointer not NULL) and read
 * when the file has it (absent: NULL). */
typedef enum { HELD_ALWAYS, HELD_FULL_LOGITS, HELD_TOPK, HELD_IF_SET } RunHeld;

typedef struct {
    const char *name;
    DataKind kind;
    RunShape shape;
    size_t offset; /* of the array's pointer in KvRun */
    size_t elem;   /* bytes per element in memory */
    RunHeld held;
    bool chunked; /* writer: chunked by step and deflated (the large arrays) */
    bool shared;  /* may be a hard link shared with other runs (logits with
                   * the same values); every other object has one link */
} RunDataset;

typedef struct {
    const RunDataset *sets;
    size_t n;
} RunDatasetTable;

extern const RunDatasetTable H5_RUN_DATASETS;

/* Whether run r stores dataset d (HELD_IF_SET: whether r has the array,
 * so a reader asks the file instead). */
bool h5_run_holds(const KvRun *r, const RunDataset *d);

/* A context-shift script (shift_step, shift_keep, shift_drop) is absent or
 * whole: shift_step >= 1, shift_drop >= 1, no request switch and keep +
 * drop within the prompt_len + shift_step - 1 positions stored before it.
 * A prefix-reuse script (save_after, switch_step, suffix_len, suffix) is
 * absent or whole: 1 <= save_after < prompt_len, 1 <= switch_step < steps,
 * 1 <= suffix_len <= KV_REPORT_MAX_PROMPT_LEN and, on a run that ran, its
 * suffix held. The writer and the reader both refuse anything else. */
bool h5_run_script_ok(const KvRun *r);

/* Shape s for run r's sizes into dims (room for 3); returns the rank. The
 * sizes are converted as they are: the caller has checked them. */
int h5_run_shape(const KvRun *r, RunShape s, hsize_t *dims);

/* ---- sizes ---------------------------------------------------------------- */

/* Run group name: the index zero-padded to 4 digits ("0000"), wider past
 * 9999. */
void h5_run_group_name(int64_t i, char *buf, size_t n);

/* a * b into *out; false on overflow of size_t. */
bool h5_size_mul(size_t a, size_t b, size_t *out);

/* Element count of a shape into *out; false when it overflows size_t. */
bool h5_shape_count(int rank, const hsize_t *dims, size_t *out);

/* "(d0, d1, ...)" into buf (NUL-terminated, truncated to n). */
void h5_shape_text(int rank, const hsize_t *dims, char *buf, size_t n);

/* Element counts of a run's arrays (DESIGN §6 shapes). */
typedef struct {
    size_t prompt; /* batch * prompt_len */
    size_t rows;   /* steps * batch */
    size_t logits; /* steps * batch * vocab */
    size_t probes; /* steps * n_probes * batch */
} RunCounts;

/* Fills *n; false when a size is negative or a product (or its bytes)
 * overflows size_t. */
bool h5_run_counts(const KvRun *r, RunCounts *n);

/* ---- a run's values ---------------------------------------------------- */

/* A run of another engine (docs/SCHEMA.md, `gate --external`): a backend
 * that is not kvrepro's ("cpu", "cuda"), or an engine recorded. */
bool h5_run_is_foreign(const KvRun *r);

/* What a run's arrays must say beyond their shapes, checked by the writer
 * before it writes and by the reader after it reads (sizes in range and
 * arrays held, which both check first):
 *   - every run that ran: each top-k row holds K distinct token ids, each
 *     in 0..vocab-1;
 *   - a run of another engine (h5_run_is_foreign): every margin >= 0, or
 *     NaN where the row's stored logits (top-k values) hold a non-finite
 *     value; skip_reason empty when the run ran, not empty when it was
 *     skipped, and a reason that says the run failed ("fail..." in any
 *     case, after blanks) starts with KV_REPORT_FAILED_MARKER exactly and
 *     says what failed.
 * kvrepro's own runs keep margins and reasons unchecked: a NaN margin of a
 * top-k run may come from a logit the top-k left out, and their skip
 * reasons are kvrepro's own text. False with the first problem in why
 * ("<field>[...]: expected ..., found ..."). */
bool h5_run_values_ok(const KvRun *r, char *why, size_t n);

/* The row texts of a run (KvRun.prompt_text, written only when set, as the
 * (batch,) variable-length UTF-8 dataset prompt_text): NULL, or exactly
 * batch strings (then a NULL), each valid UTF-8 of fewer than
 * KV_PROMPT_TEXT_MAX_BYTES bytes. False with why naming the row otherwise. */
bool h5_prompt_text_ok(const KvRun *r, char *why, size_t n);

/* ---- what a read allocates ---------------------------------------------- */

/* The bytes kv_report_read_h5 charges to its budget (kv_limits_read_budget)
 * reading rep back: the run records, the tables' staged rows and copies,
 * and every array each run holds, counted once per run (a shared logits
 * dataset is copied into each run). False on overflow. The reader's
 * h5r_charge calls are what this counts: change them together. */
bool h5_read_cost(const KvReport *rep, uint64_t *out);

#endif
