/* fuzz_report_edit.c: structure-aware libFuzzer target for the HDF5 report
 * reader. The input is not a file but an edit script: its first byte picks
 * one of the tiny reports of fuzz_reports.h as the base, and the rest is a
 * list of edits made through the HDF5 API to a copy of that file:
 *
 *   set an attribute   on one of the schema's objects: any name of the
 *                      schema (or "extra"), any of 19 types (integers of
 *                      every width and byte order, floats, fixed strings of
 *                      several sizes, paddings and character sets,
 *                      variable-length strings, enum, bitfield, opaque,
 *                      array, compound), a null, scalar or 1-3-D space, and
 *                      bytes from the input as the value;
 *   delete an attribute;
 *   set a dataset      in any group under any name of the schema: type,
 *                      shape (up to 65536 elements; chunked and unwritten,
 *                      reading as fill values, when larger than the input),
 *                      contiguous, compact or chunked (with deflate), values
 *                      from the input;
 *   set a table        (/tolerances, /comparisons, /summary): each member
 *                      kept, dropped or given another type, an extra one,
 *                      any row count, rows from the input;
 *   delete a link; replace one by an empty group, a soft link (dangling or
 *   cyclic) or a hard link to another object.
 *
 * HDF5 writes every one of these correctly, so the reader sees well-formed
 * files with the wrong contents, and libhdf5's own fragility on damaged
 * files (fuzz_report, README.md) does not come into it. Each edited file
 * then goes through the same checks as fuzz_report
 * (kv_fuzz_check_report_file). An edit HDF5 refuses is skipped. */
#include <hdf5.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fuzz_common.h"
#include "fuzz_reports.h"
#include "report_h5.h"

#define MAX_EDITS 12
#define MAX_VALUE_BYTES 4096

static char g_input[4096], g_copy[4096];
static FILE *g_null;
static uint8_t *g_base[KV_FUZZ_REPORT_COUNT];
static size_t g_base_len[KV_FUZZ_REPORT_COUNT];

/* ---- the input as a byte source ----------------------------------------- */

typedef struct {
    const uint8_t *p;
    size_t n;
} Bytes;

static unsigned take(Bytes *b) {
    if (b->n == 0) return 0;
    b->n--;
    return *b->p++;
}

/* n bytes into dst; zeros once the input runs out. */
static void take_into(Bytes *b, void *dst, size_t n) {
    size_t k = n < b->n ? n : b->n;
    if (k > 0) memcpy(dst, b->p, k);
    if (n > k) memset((uint8_t *)dst + k, 0, n - k);
    b->p += k;
    b->n -= k;
}

#define PICK(b, table) ((table)[take(b) % (sizeof(table) / sizeof((table)[0]))])

/* ---- the schema's names ---------------------------------------------------- */

static const char *const kObjects[] = {"/",           "/runs",        "/runs/0000",
                                       "/runs/0001",  "/runs/0002",   "/tolerances",
                                       "/comparisons", "/summary",    "/runs/0000/logits",
                                       "/runs/0001/tokens"};
static const char *const kGroups[] = {"/", "/runs", "/runs/0000", "/runs/0001", "/runs/0002"};
static const char *const kAttrNames[] = {
    "schema_version", "tool_version", "git_commit", "host", "device", "math_mode",
    "weight_seed", "prompt_seed", "model_hash", "model_hash_hex", "shard", "model", "scenario",
    "variant", "backend", "mode", "repeat", "fault", "prefill_chunk", "topk", "skipped",
    "skip_reason", "steps", "batch", "vocab", "prompt_len", "n_probes", "graphs_captured",
    "replays_checked", "replay_mismatch_step", "seconds", "extra"};
static const char *const kLinkNames[] = {
    "prompt", "prompt_real", "tokens", "logits", "topk_ids", "topk_values", "logits_hash",
    "margins", "probe_names", "probe_hash", "runs", "tolerances", "comparisons", "summary",
    "0000", "0001", "0002", "0003", "00000", "bisect"};

/* Table columns as SCHEMA.md lists them: 'i' int32, 'l' int64, 'd' float64,
 * 's' fixed string of width bytes. */
typedef struct {
    const char *name;
    char kind;
    size_t width;
} Column;

static const Column kTolerances[] = {{"name", 's', 64}, {"value", 'd', 8}, {"reason", 's', 160}};
static const Column kComparisons[] = {
    {"kind", 'i', 4},        {"run_a", 'l', 8},        {"run_b", 'l', 8},
    {"verdict", 'i', 4},     {"message", 's', 512},    {"first_step", 'l', 8},
    {"first_row", 'l', 8},   {"first_probe", 'l', 8},  {"near_ties", 'l', 8},
    {"max_abs_err", 'd', 8}, {"max_rel_err", 'd', 8},  {"nmse", 'd', 8},
    {"kl", 'd', 8},          {"top1_agreement", 'd', 8}};
static const Column kSummary[] = {
    {"index", 'l', 8},        {"model", 's', 64},   {"scenario", 's', 64},
    {"variant", 's', 64},     {"backend", 's', 16}, {"mode", 's', 16},
    {"repeat", 'i', 4},       {"verdict", 'i', 4},  {"verdict_name", 's', 8},
    {"first_divergence", 's', 512}, {"max_rel_err", 'd', 8}, {"graphs_captured", 'l', 8}};

typedef struct {
    const char *name;
    const Column *cols;
    size_t n;
} Table;

static const Table kTables[] = {{"tolerances", kTolerances, 3},
                                {"comparisons", kComparisons, 14},
                                {"summary", kSummary, 12}};

/* ---- types and spaces ------------------------------------------------------- */

typedef struct {
    hid_t type;  /* to close */
    bool vlen;   /* a variable-length string: values are char * */
} Type;

static hid_t string_type(size_t size, unsigned pad, unsigned cset) {
    hid_t t = H5Tcopy(H5T_C_S1);
    static const H5T_str_t pads[] = {H5T_STR_NULLTERM, H5T_STR_NULLPAD, H5T_STR_SPACEPAD};
    if (t < 0) return t;
    if (H5Tset_size(t, size) < 0 || H5Tset_strpad(t, pads[pad % 3]) < 0 ||
        H5Tset_cset(t, cset % 2 ? H5T_CSET_UTF8 : H5T_CSET_ASCII) < 0) {
        H5Tclose(t);
        return H5I_INVALID_HID;
    }
    return t;
}

/* One of 19 types, chosen and parameterised by the input. */
static Type make_type(Bytes *b) {
    static const size_t str_sizes[] = {1, 2, 8, 16, 17, 32, 63, 64, 65, 128, 160, 256, 511, 512,
                                       513};
    Type t = {H5I_INVALID_HID, false};
    unsigned k = take(b) % 19;
    switch (k) {
    case 0: t.type = H5Tcopy(H5T_STD_I8LE); break;
    case 1: t.type = H5Tcopy(H5T_STD_U8LE); break;
    case 2: t.type = H5Tcopy(H5T_STD_I16LE); break;
    case 3: t.type = H5Tcopy(H5T_STD_I32LE); break;
    case 4: t.type = H5Tcopy(H5T_STD_U32LE); break;
    case 5: t.type = H5Tcopy(H5T_STD_I64LE); break;
    case 6: t.type = H5Tcopy(H5T_STD_U64LE); break;
    case 7: t.type = H5Tcopy(H5T_STD_I32BE); break;
    case 8: t.type = H5Tcopy(H5T_STD_I64BE); break;
    case 9: t.type = H5Tcopy(H5T_IEEE_F32LE); break;
    case 10: t.type = H5Tcopy(H5T_IEEE_F64LE); break;
    case 11: t.type = H5Tcopy(H5T_IEEE_F64BE); break;
    case 12: {
        size_t size = PICK(b, str_sizes);
        unsigned pad = take(b), cset = take(b);
        t.type = string_type(size, pad, cset);
        break;
    }
    case 13:
        t.type = H5Tcopy(H5T_C_S1);
        if (t.type >= 0 && (H5Tset_size(t.type, H5T_VARIABLE) < 0 ||
                            H5Tset_cset(t.type, take(b) % 2 ? H5T_CSET_UTF8 : H5T_CSET_ASCII) < 0)) {
            H5Tclose(t.type);
            t.type = H5I_INVALID_HID;
        }
        t.vlen = true;
        break;
    case 14: {
        t.type = H5Tenum_create(H5T_NATIVE_INT32);
        int32_t v0 = 0, v1 = 1;
        if (t.type >= 0 && (H5Tenum_insert(t.type, "FALSE", &v0) < 0 ||
                            H5Tenum_insert(t.type, "TRUE", &v1) < 0)) {
            H5Tclose(t.type);
            t.type = H5I_INVALID_HID;
        }
        break;
    }
    case 15: t.type = H5Tcopy(H5T_STD_B8LE); break;
    case 16:
        t.type = H5Tcreate(H5T_OPAQUE, 4);
        if (t.type >= 0 && H5Tset_tag(t.type, "kvfuzz") < 0) {
            H5Tclose(t.type);
            t.type = H5I_INVALID_HID;
        }
        break;
    case 17: {
        hsize_t n = 2;
        t.type = H5Tarray_create2(H5T_STD_I64LE, 1, &n);
        break;
    }
    default: {
        t.type = H5Tcreate(H5T_COMPOUND, 8);
        if (t.type >= 0 && H5Tinsert(t.type, "x", 0, H5T_STD_I64LE) < 0) {
            H5Tclose(t.type);
            t.type = H5I_INVALID_HID;
        }
        break;
    }
    }
    return t;
}

/* Datasets hold at most this many elements. The reader sizes its buffers by
 * what a file declares (finding F1, known-open.txt): a tiny file declaring a
 * million-row table costs it gigabytes and seconds, which fuzz_report already
 * shows; kept below that here so this target's runs stay about everything
 * else. */
#define MAX_ELEMENTS 65536

/* A dimension: mostly small, sometimes large (stored chunked and unwritten
 * when its values would not fit the input: it reads as fill values). */
static hsize_t take_dim(Bytes *b) {
    static const hsize_t dims[] = {0, 1, 2, 3, 4, 5, 7, 8, 16, 255, 4096, MAX_ELEMENTS};
    unsigned k = take(b);
    return k < 192 ? (hsize_t)(k % 6) : dims[k % (sizeof dims / sizeof dims[0])];
}

/* A dataspace: null, scalar, or rank 1..3 with dims from the input, at most
 * MAX_ELEMENTS elements; *count gets the element count, *rank the rank (-1
 * for null). */
static hid_t make_space(Bytes *b, bool allow_big, hsize_t *count, int *rank, hsize_t *dims) {
    unsigned k = take(b) % 5;
    *count = 1;
    if (k == 0) {
        *rank = -1;
        *count = 0;
        return H5Screate(H5S_NULL);
    }
    if (k == 1) {
        *rank = 0;
        return H5Screate(H5S_SCALAR);
    }
    *rank = (int)k - 1;
    for (int i = 0; i < *rank; i++) {
        dims[i] = allow_big ? take_dim(b) : (hsize_t)(take(b) % 4);
        if (dims[i] != 0 && *count > MAX_ELEMENTS / dims[i]) dims[i] = 1;
        *count *= dims[i];
    }
    return H5Screate_simple(*rank, dims, NULL);
}

/* A value buffer of count elements of t from the input; NULL when too large. */
static void *make_values(Bytes *b, const Type *t, hsize_t count, char ***vlen_out) {
    *vlen_out = NULL;
    if (t->vlen) {
        if (count > 64) return NULL;
        char **strs = calloc(count > 0 ? (size_t)count : 1, sizeof *strs);
        if (strs == NULL) return NULL;
        for (hsize_t i = 0; i < count; i++) {
            size_t len = take(b) % 80;
            strs[i] = calloc(len + 1, 1);
            if (strs[i] != NULL) take_into(b, strs[i], len);
        }
        *vlen_out = strs;
        return strs;
    }
    size_t size = H5Tget_size(t->type);
    if (size == 0 || count > MAX_VALUE_BYTES / size) return NULL;
    size_t bytes = (size_t)count * size;
    void *buf = calloc(bytes > 0 ? bytes : 1, 1);
    if (buf != NULL) take_into(b, buf, bytes);
    return buf;
}

static void free_values(void *buf, char **vlen, hsize_t count) {
    if (vlen != NULL) {
        for (hsize_t i = 0; i < count; i++) free(vlen[i]);
    }
    free(buf);
}

/* Replaces link `name` of group g (whatever it was) by nothing. */
static void unlink_name(hid_t g, const char *name) {
    if (H5Lexists(g, name, H5P_DEFAULT) > 0) (void)H5Ldelete(g, name, H5P_DEFAULT);
}

/* ---- the edits ----------------------------------------------------------------- */

static void edit_set_attr(hid_t file, Bytes *b) {
    const char *path = PICK(b, kObjects), *name = PICK(b, kAttrNames);
    hid_t obj = H5Oopen(file, path, H5P_DEFAULT);
    Type t = make_type(b);
    hsize_t count, dims[3];
    int rank;
    hid_t space = make_space(b, false, &count, &rank, dims);
    char **vlen = NULL;
    void *buf = NULL;
    if (obj >= 0 && t.type >= 0 && space >= 0) {
        if (H5Aexists(obj, name) > 0) (void)H5Adelete(obj, name);
        hid_t a = H5Acreate2(obj, name, t.type, space, H5P_DEFAULT, H5P_DEFAULT);
        buf = make_values(b, &t, count, &vlen);
        if (a >= 0 && buf != NULL && count > 0) (void)H5Awrite(a, t.type, buf);
        if (a >= 0) H5Aclose(a);
    }
    free_values(buf, vlen, count);
    if (space >= 0) H5Sclose(space);
    if (t.type >= 0) H5Tclose(t.type);
    if (obj >= 0) H5Oclose(obj);
}

static void edit_delete_attr(hid_t file, Bytes *b) {
    const char *path = PICK(b, kObjects), *name = PICK(b, kAttrNames);
    hid_t obj = H5Oopen(file, path, H5P_DEFAULT);
    if (obj < 0) return;
    if (H5Aexists(obj, name) > 0) (void)H5Adelete(obj, name);
    H5Oclose(obj);
}

/* Creates dataset name in g with type t and space; layout 0 contiguous, 1
 * compact, 2 chunked, 3 chunked + deflate. Data is written unless the
 * space is too large for a value buffer (then it reads as fill values). */
static void create_dataset(hid_t g, const char *name, const Type *t, hid_t space, int rank,
                           const hsize_t *dims, hsize_t count, unsigned layout, Bytes *b) {
    hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    char **vlen = NULL;
    void *buf = NULL;
    if (dcpl < 0) return;
    size_t esize = t->vlen ? sizeof(char *) : H5Tget_size(t->type);
    bool big = esize == 0 || count > MAX_VALUE_BYTES / esize;
    if (rank > 0 && (layout >= 2 || big)) {
        hsize_t chunk[3];
        for (int i = 0; i < rank; i++) chunk[i] = dims[i] == 0 ? 1 : (dims[i] < 64 ? dims[i] : 64);
        (void)H5Pset_chunk(dcpl, rank, chunk);
        if (layout == 3) (void)H5Pset_deflate(dcpl, 1);
    } else if (layout == 1 && !big) {
        (void)H5Pset_layout(dcpl, H5D_COMPACT);
    }
    unlink_name(g, name);
    hid_t d = H5Dcreate2(g, name, t->type, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    if (d >= 0 && !big) {
        buf = make_values(b, t, count, &vlen);
        if (buf != NULL && count > 0) (void)H5Dwrite(d, t->type, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf);
    }
    free_values(buf, vlen, count);
    if (d >= 0) H5Dclose(d);
    H5Pclose(dcpl);
}

static void edit_set_dataset(hid_t file, Bytes *b) {
    const char *gpath = PICK(b, kGroups), *name = PICK(b, kLinkNames);
    hid_t g = H5Gopen2(file, gpath, H5P_DEFAULT);
    Type t = make_type(b);
    hsize_t count, dims[3];
    int rank;
    hid_t space = make_space(b, true, &count, &rank, dims);
    unsigned layout = take(b) % 4;
    if (g >= 0 && t.type >= 0 && space >= 0) {
        create_dataset(g, name, &t, space, rank, dims, count, layout, b);
    }
    if (space >= 0) H5Sclose(space);
    if (t.type >= 0) H5Tclose(t.type);
    if (g >= 0) H5Gclose(g);
}

/* A table with the schema's members, each kept, dropped or retyped, maybe
 * an extra one, and a row count from the input. */
static void edit_set_table(hid_t file, Bytes *b) {
    const Table *tab = &kTables[take(b) % 3];
    hid_t members[16];
    size_t offsets[16], n = 0, size = 0;
    const char *names[16];
    for (size_t i = 0; i < tab->n + 1 && n < 16; i++) {
        unsigned action = take(b) % 8;
        const Column *col = i < tab->n ? &tab->cols[i] : NULL;
        if (col == NULL && action != 7) break; /* the extra member: 1 in 8 */
        if (action == 6) continue;             /* dropped */
        hid_t mt;
        if (action == 7 || col == NULL) {
            Type t = make_type(b);
            if (t.vlen && t.type >= 0) {
                H5Tclose(t.type); /* a vlen string in a compound: keep it fixed */
                t.type = string_type(8, 0, 0);
            }
            mt = t.type;
        } else if (col->kind == 's') {
            mt = string_type(col->width, 0, 1);
        } else {
            mt = H5Tcopy(col->kind == 'i' ? H5T_STD_I32LE
                         : col->kind == 'l' ? H5T_STD_I64LE
                                            : H5T_IEEE_F64LE);
        }
        if (mt < 0) continue;
        members[n] = mt;
        names[n] = col != NULL ? col->name : "extra";
        offsets[n] = size;
        size += H5Tget_size(mt);
        n++;
    }
    hid_t ct = size > 0 ? H5Tcreate(H5T_COMPOUND, size) : H5I_INVALID_HID;
    for (size_t i = 0; ct >= 0 && i < n; i++) {
        if (H5Tinsert(ct, names[i], offsets[i], members[i]) < 0) {
            H5Tclose(ct);
            ct = H5I_INVALID_HID;
        }
    }
    for (size_t i = 0; i < n; i++) H5Tclose(members[i]);
    if (ct < 0) return;
    hsize_t rows = take_dim(b);
    hid_t space = H5Screate_simple(1, &rows, NULL);
    hid_t root = H5Gopen2(file, "/", H5P_DEFAULT);
    if (space >= 0 && root >= 0) {
        Type t = {ct, false};
        create_dataset(root, tab->name, &t, space, 1, &rows, rows, take(b) % 4, b);
    }
    if (root >= 0) H5Gclose(root);
    if (space >= 0) H5Sclose(space);
    H5Tclose(ct);
}

static void edit_relink(hid_t file, Bytes *b) {
    unsigned how = take(b) % 4;
    const char *gpath = PICK(b, kGroups), *name = PICK(b, kLinkNames);
    const char *target = PICK(b, kObjects);
    hid_t g = H5Gopen2(file, gpath, H5P_DEFAULT);
    if (g < 0) return;
    unlink_name(g, name);
    if (how == 1) {
        hid_t ng = H5Gcreate2(g, name, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
        if (ng >= 0) H5Gclose(ng);
    } else if (how == 2) {
        (void)H5Lcreate_soft(take(b) % 4 == 0 ? "/nowhere" : target, g, name, H5P_DEFAULT,
                             H5P_DEFAULT);
    } else if (how == 3) {
        (void)H5Lcreate_hard(file, target, g, name, H5P_DEFAULT, H5P_DEFAULT);
    }
    H5Gclose(g);
}

/* ---- libFuzzer ------------------------------------------------------------------ */

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    kv_fuzz_path(g_input, sizeof g_input, "input.h5");
    kv_fuzz_path(g_copy, sizeof g_copy, "copy.h5");
    g_null = fopen("/dev/null", "w");
    if (g_null == NULL) {
        perror("/dev/null");
        abort();
    }
    kv_fuzz_report_setup();
    if (H5Eset_auto2(H5E_DEFAULT, NULL, NULL) < 0) abort(); /* refused edits are skipped */
    for (int k = 0; k < KV_FUZZ_REPORT_COUNT; k++) {
        KvReport rep;
        KvError err = {{0}};
        kv_fuzz_tiny_report((KvFuzzReportKind)k, &rep);
        if (kv_report_write_h5(&rep, g_input, &err) != KV_OK) {
            fprintf(stderr, "kvrepro fuzz: base report %d: %s\n", k, err.msg);
            abort();
        }
        kv_report_free(&rep);
        FILE *f = fopen(g_input, "rb");
        long len = -1;
        if (f != NULL && fseek(f, 0, SEEK_END) == 0) len = ftell(f);
        if (len <= 0 || fseek(f, 0, SEEK_SET) != 0 || (g_base[k] = malloc((size_t)len)) == NULL ||
            fread(g_base[k], 1, (size_t)len, f) != (size_t)len) {
            fprintf(stderr, "kvrepro fuzz: cannot read back base report %d\n", k);
            abort();
        }
        fclose(f);
        g_base_len[k] = (size_t)len;
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    Bytes b = {data, size};
    unsigned base = take(&b) % KV_FUZZ_REPORT_COUNT;
    kv_fuzz_write_file(g_input, g_base[base], g_base_len[base]);
    hid_t file = H5Fopen(g_input, H5F_ACC_RDWR, H5P_DEFAULT);
    KV_FUZZ_CHECK(file >= 0, "cannot open the base report %u for editing", base);
    for (int e = 0; e < MAX_EDITS && b.n > 0; e++) {
        switch (take(&b) % 6) {
        case 0: edit_set_attr(file, &b); break;
        case 1: edit_delete_attr(file, &b); break;
        case 2: edit_set_dataset(file, &b); break;
        case 3: edit_set_table(file, &b); break;
        default: edit_relink(file, &b); break;
        }
    }
    KV_FUZZ_CHECK(H5Fget_obj_count(file, H5F_OBJ_ALL) == 1, "the edits left objects open");
    KV_FUZZ_CHECK(H5Fclose(file) >= 0, "cannot close the edited report");
    kv_fuzz_check_report_file(g_input, g_copy, g_null);
    return 0;
}
