/* report_h5_read.c: HDF5 -> KvReport (docs/SCHEMA.md,
 * kv_report_read_h5 in report_h5.h). The layout comes from h5util.h.
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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "h5util.h"

/* ---- values --------------------------------------------------------------- */

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

/* What a table column holds, for messages. */
static const char *member_kind_text(ColumnKind k) {
    switch (k) {
    case COL_I32: return "an integer";
    case COL_I64: return "an integer";
    case COL_F64: return "a float";
    case COL_STR: return "a fixed-length string";
    }
    return "?";
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
        goto cleanup;
    }
    /* values 2-15 are reserved: HDF5 refuses them when asked to read in
     * them, which is the file's fault, not ours (fuzzing found it) */
    if (cset != H5T_CSET_ASCII && cset != H5T_CSET_UTF8) {
        st = h5_report_fail(c, KV_ERR_INPUT,
                            "%s: expected an ASCII or UTF-8 string, found "
                            "character set %d",
                            what, (int)cset);
        goto cleanup;
    }
    /* HDF5 does not convert between character sets: read in the file's */
    mem = H5Tcopy(H5T_C_S1);
    if (mem < 0 || H5Tset_cset(mem, cset) < 0 || H5Tset_strpad(mem, H5T_STR_NULLTERM) < 0) {
        st = h5_fail(c, KV_ERR_INTERNAL, "%s: cannot make a string type", what);
        goto cleanup;
    }
    if (is_vlen) {
        vls = calloc(n > 0 ? n : 1, sizeof *vls);
        if (vls == NULL || H5Tset_size(mem, H5T_VARIABLE) < 0) {
            st = vls == NULL ? h5_report_fail(c, KV_ERR_INTERNAL, "out of memory")
                             : h5_fail(c, KV_ERR_INTERNAL, "%s: cannot make a string type", what);
            goto cleanup;
        }
        if (n > 0 && h5_read_any(id, is_attr, mem, vls) < 0) {
            st = h5_fail(c, KV_ERR_INPUT, "%s: cannot read", what);
            goto cleanup;
        }
    } else {
        fsize = H5Tget_size(ftype);
        size_t bytes;
        /* the widest field is 512 bytes: a wider type is not ours, and its
         * size would size the buffer below */
        if (fsize == 0 || fsize > KV_REPORT_MAX_STRING_BYTES ||
            !h5_size_mul(n > 0 ? n : 1, fsize + 1, &bytes)) {
            st = h5_report_fail(c, KV_ERR_INPUT,
                                "%s: expected a string type of 1..%zu bytes, found size %zu", what,
                                KV_REPORT_MAX_STRING_BYTES, fsize);
            goto cleanup;
        }
        fixed = calloc(1, bytes);
        if (fixed == NULL || H5Tset_size(mem, fsize + 1) < 0) {
            st = fixed == NULL ? h5_report_fail(c, KV_ERR_INTERNAL, "out of memory")
                               : h5_fail(c, KV_ERR_INTERNAL, "%s: cannot make a string type", what);
            goto cleanup;
        }
        if (n > 0 && h5_read_any(id, is_attr, mem, fixed) < 0) {
            st = h5_fail(c, KV_ERR_INPUT, "%s: cannot read", what);
            goto cleanup;
        }
    }
    for (size_t k = 0; k < n; k++) {
        const char *s = is_vlen ? vls[k] : fixed + k * (fsize + 1);
        if (s == NULL) s = "";
        const size_t len = strlen(s);
        if (len >= width) {
            st = h5_report_fail(c, KV_ERR_INPUT,
                                "%s: expected a string of at most %zu bytes, found %zu bytes", what,
                                width - 1, len);
            goto cleanup;
        }
        memset(dst + k * width, 0, width);
        memcpy(dst + k * width, s, len);
    }
cleanup:
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
        return h5_report_fail(c, KV_ERR_INPUT, "%s: attribute %s: expected %s, found nothing",
                              objpath, name, class_text(cls));
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
        return h5_report_fail(c, KV_ERR_INPUT, "%s: attribute %s: expected %s, found %s", objpath,
                              name, class_text(cls), class_text(found));
    }
    if (npoints != 1) {
        return h5_report_fail(c, KV_ERR_INPUT, "%s: attribute %s: expected one value, found %lld",
                              objpath, name, (long long)npoints);
    }
    return KV_OK;
}

static KvStatus h5r_attr_value(hid_t obj, const char *objpath, const char *name, H5T_class_t cls,
                               hid_t mem_type, void *dst, ReportCtx *c) {
    hid_t attr = H5I_INVALID_HID, type = H5I_INVALID_HID, space = H5I_INVALID_HID;
    KvStatus st = h5r_attr_open(obj, objpath, name, cls, &attr, &type, &space, c);
    if (st != KV_OK) goto cleanup;
    if (H5Aread(attr, mem_type, dst) < 0) {
        st = h5_fail(c, KV_ERR_INPUT, "%s: attribute %s: cannot read as %s", objpath, name,
                     class_text(cls));
        goto cleanup;
    }
cleanup:
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
        return h5_report_fail(c, KV_ERR_INPUT,
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
    if (st != KV_OK) goto cleanup;
    st = h5r_strings(attr, true, type, space, 1, dst, width, what, c);
cleanup:
    h5_close(H5Sclose, space, name, &st, c);
    h5_close(H5Tclose, type, name, &st, c);
    h5_close(H5Aclose, attr, name, &st, c);
    return st;
}

/* Reads attribute f of an attribute table into the struct at base
 * (FIELD_HEX: the string into hex, KV_H5_HEX_LEN bytes, for the caller to
 * check), checking its range. */
static KvStatus h5r_attr_field(hid_t obj, const char *objpath, const AttrField *f, void *base,
                               char *hex, ReportCtx *c) {
    char *p = (char *)base + f->offset;
    int64_t v = 0, hi = f->hi;
    KvStatus st = KV_OK;
    switch (f->kind) {
    case FIELD_STR: return h5r_attr_string(obj, objpath, f->name, p, f->width, c);
    case FIELD_U64: return h5r_attr_u64(obj, objpath, f->name, (uint64_t *)p, c);
    case FIELD_F64:
        return h5r_attr_value(obj, objpath, f->name, H5T_FLOAT, H5T_NATIVE_DOUBLE, p, c);
    case FIELD_HEX: return h5r_attr_string(obj, objpath, f->name, hex, KV_H5_HEX_LEN, c);
    case FIELD_VERSION:
        st = h5r_attr_i64(obj, objpath, f->name, &v, c);
        if (st == KV_OK && v != f->lo) {
            st = h5_report_fail(c, KV_ERR_INPUT,
                                "%s: attribute %s: expected %" PRId64 ", found %" PRId64, objpath,
                                f->name, f->lo, v);
        }
        return st;
    case FIELD_I32:
    case FIELD_I64:
    case FIELD_BOOL: break;
    }
    int64_t lo = f->lo;
    (void)h5_attr_field_range(f, base, &lo, &hi); /* an integer kind: true */
    st = h5r_attr_range(obj, objpath, f->name, lo, hi, &v, c);
    if (st != KV_OK) return st;
    /* the range fits the field (h5util.c's tables) */
    if (f->kind == FIELD_I32) {
        *(int32_t *)p = (int32_t)v;
    } else if (f->kind == FIELD_BOOL) {
        *(bool *)p = v != 0;
    } else {
        *(int64_t *)p = v;
    }
    return KV_OK;
}

/* Reads the attributes of table t into the struct at base: the required
 * ones in table order, then the optional ones present (an absent one
 * leaves its field as it is). A FIELD_HEX attribute is compared with the
 * field it spells once all are read, so that a missing or mistyped
 * attribute is reported before a disagreement. */
static KvStatus h5r_attr_fields(hid_t obj, const char *objpath, const AttrTable *t, void *base,
                                ReportCtx *c) {
    char hex[KV_H5_HEX_LEN] = "";
    const AttrField *hex_field = NULL;
    for (int pass = 0; pass < 2; pass++) {
        const bool optional = pass == 1;
        for (size_t i = 0; i < t->n; i++) {
            const AttrField *f = &t->fields[i];
            if (f->optional != optional) continue;
            if (optional && H5Aexists(obj, f->name) <= 0) continue;
            if (f->kind == FIELD_HEX && hex_field != NULL) {
                return h5_report_fail(c, KV_ERR_INTERNAL,
                                      "%s: attributes %s and %s: expected one hex spelling per "
                                      "object (h5util.c), found two",
                                      objpath, hex_field->name, f->name);
            }
            if (f->kind == FIELD_HEX) hex_field = f;
            const KvStatus st = h5r_attr_field(obj, objpath, f, base, hex, c);
            if (st != KV_OK) return st;
        }
    }
    if (hex_field != NULL) {
        char want[KV_H5_HEX_LEN];
        snprintf(want, sizeof want, "%016" PRIx64,
                 *(const uint64_t *)((const char *)base + hex_field->offset));
        if (strcmp(hex, want) != 0) {
            return h5_report_fail(c, KV_ERR_INPUT,
                                  "%s: attribute %s: expected \"%s\" (%s), found \"%s\"", objpath,
                                  hex_field->name, want, hex_field->of, hex);
        }
    }
    return KV_OK;
}

/* ---- what the reader trusts ---------------------------------------------- */

/* Charges bytes about to be allocated for objpath to the report's budget
 * (kv_limits_read_budget of the file's size, for everything together; a
 * dataset that several runs share is charged to each, as each gets a
 * copy). h5_read_cost (h5util.h) counts these charges for the writer:
 * change them together. */
static KvStatus h5r_charge(ReportCtx *c, const char *objpath, uint64_t bytes) {
    if (bytes > c->budget) {
        return h5_report_fail(c, KV_ERR_INPUT,
                              "%s: expected a report that fits in %" PRIu64
                              " bytes of memory (%" PRIu64 " per byte of its %" PRIu64
                              "-byte file, at least %" PRIu64 ", at most %" PRIu64
                              "; kv_limits.h), found %" PRIu64
                              " more bytes needed here with %" PRIu64 " left",
                              objpath, c->allowed, KV_REPORT_MAX_READ_RATIO, c->file_size,
                              KV_REPORT_READ_FLOOR_BYTES, KV_REPORT_MAX_READ_BYTES, bytes,
                              c->budget);
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
    return h5_report_fail(c, KV_ERR_INPUT,
                          "%s: expected %s stored in this file, found %s%s (a report is one "
                          "self-contained file: links are refused, not followed)",
                          objpath, expect, kind, where);
}

/* Checks that `name` under parent is a hard link to an object of type want
 * (a group or a dataset), without following any other kind of link: "found
 * nothing" when absent. shared: more than one hard link may lead to it (a
 * run's logits, which the writer links from every run with the same
 * values); anything else the schema has once. */
static KvStatus h5r_check_object_info(hid_t parent, const char *objpath, const char *name,
                                      H5O_type_t want, bool shared, const char *expect,
                                      H5O_info_t *info, ReportCtx *c) {
    const htri_t exists = H5Lexists(parent, name, H5P_DEFAULT);
    if (exists < 0) return h5_fail(c, KV_ERR_INPUT, "%s: cannot look up", objpath);
    if (exists == 0) {
        return h5_report_fail(c, KV_ERR_INPUT, "%s: expected %s, found nothing", objpath, expect);
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
        return h5_report_fail(c, KV_ERR_INPUT, "%s: expected %s, found %s", objpath, expect,
                              object_type_text(oi.type));
    }
    if (!shared && oi.rc != 1) {
        return h5_report_fail(c, KV_ERR_INPUT,
                              "%s: expected %s of its own, found one that %u links share (only a "
                              "run's logits may be shared)",
                              objpath, expect, oi.rc);
    }
    if (info != NULL) *info = oi;
    return KV_OK;
}

static KvStatus h5r_check_object(hid_t parent, const char *objpath, const char *name,
                                 H5O_type_t want, bool shared, const char *expect, ReportCtx *c) {
    return h5r_check_object_info(parent, objpath, name, want, shared, expect, NULL, c);
}

/* The names a group may hold, for h5r_scan_group. */
typedef struct {
    const char *const *names; /* NULL-terminated; NULL: see run */
    const KvRun *run;         /* names NULL: the datasets run holds, or (run NULL too) run
                               * group names below n_runs */
    int64_t n_runs;
    const char *expect; /* what each link should lead to, for the message */
    char found[256];    /* the first name not allowed, or not a hard link */
    bool bad_link;
} LinkScan;

/* A canonical run group name ("0007", "12345") of an index below n. */
static bool is_run_name(const char *name, int64_t n) {
    const size_t len = strlen(name);
    if (len < 4 || len > 18 || strspn(name, "0123456789") != len) return false;
    int64_t v = 0;
    for (size_t k = 0; k < len; k++) v = v * 10 + (name[k] - '0');
    char canon[32];
    h5_run_group_name(v, canon, sizeof canon);
    return v < n && strcmp(canon, name) == 0;
}

static herr_t h5r_scan_link(hid_t g, const char *name, const H5L_info_t *info, void *data) {
    (void)g;
    LinkScan *s = data;
    bool allowed = false;
    if (s->names == NULL && s->run != NULL) {
        for (size_t k = 0; k < H5_RUN_DATASETS.n && !allowed; k++) {
            const RunDataset *d = &H5_RUN_DATASETS.sets[k];
            /* an optional array may be there or not: the reader asks the file */
            allowed = strcmp(d->name, name) == 0 &&
                      (d->held == HELD_IF_SET ? !s->run->skipped : h5_run_holds(s->run, d));
        }
        /* the row texts of a prompts file with texts (h5r_prompt_text) */
        allowed = allowed || (strcmp(name, "prompt_text") == 0 && !s->run->skipped);
    } else if (s->names == NULL) {
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
    return h5_report_fail(c, KV_ERR_INPUT, "%s: expected only %s, found '%s'", objpath, what,
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
        goto cleanup;
    }
    const H5D_layout_t layout = H5Pget_layout(dcpl);
    const int n_external = H5Pget_external_count(dcpl);
    const int n_filters = H5Pget_nfilters(dcpl);
    if (layout < 0 || n_external < 0 || n_filters < 0) {
        st = h5_fail(c, KV_ERR_INPUT, "%s: cannot inspect the storage", objpath);
        goto cleanup;
    }
    if (layout == H5D_VIRTUAL) {
        st = h5_report_fail(c, KV_ERR_INPUT,
                            "%s: expected data stored in this file, found a virtual dataset (data "
                            "mapped from other datasets or files)",
                            objpath);
        goto cleanup;
    }
    if (layout != H5D_COMPACT && layout != H5D_CONTIGUOUS && layout != H5D_CHUNKED) {
        st = h5_report_fail(c, KV_ERR_INPUT,
                            "%s: expected compact, contiguous or chunked storage, found layout %d",
                            objpath, (int)layout);
        goto cleanup;
    }
    if (n_external > 0) {
        st = h5_report_fail(c, KV_ERR_INPUT,
                            "%s: expected data stored in this file, found it in %d external file%s",
                            objpath, n_external, n_external == 1 ? "" : "s");
        goto cleanup;
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
            goto cleanup;
        }
        if (id == H5Z_FILTER_DEFLATE) {
            deflate = true;
        } else if (id != H5Z_FILTER_SHUFFLE && id != H5Z_FILTER_FLETCHER32) {
            /* the ratio bound below holds for deflate; another filter
             * (scale-offset, n-bit, szip, plugins) could claim any size */
            st =
                h5_report_fail(c, KV_ERR_INPUT,
                               "%s: expected no filters but shuffle, deflate and fletcher32, found "
                               "filter %d (%.60s)",
                               objpath, (int)id, name);
            goto cleanup;
        }
    }
    const size_t tsize = H5Tget_size(ftype);
    if (tsize == 0) {
        st = h5_fail(c, KV_ERR_INPUT, "%s: cannot size the type", objpath);
        goto cleanup;
    }
    uint64_t raw = 0;
    if ((uint64_t)count > UINT64_MAX / tsize) {
        st = h5_report_fail(c, KV_ERR_INPUT,
                            "%s: expected a size that fits in 64 bits, found %zu x %zu", objpath,
                            count, tsize);
        goto cleanup;
    }
    raw = (uint64_t)count * tsize;
    /* 0 both when nothing is allocated and on failure: either way no data */
    const uint64_t stored = H5Dget_storage_size(dset);
    if (stored > c->file_size) {
        st = h5_report_fail(c, KV_ERR_INPUT,
                            "%s: expected at most the file's %" PRIu64
                            " bytes stored, found %" PRIu64,
                            objpath, c->file_size, stored);
        goto cleanup;
    }
    if (!deflate && stored < raw) {
        st = h5_report_fail(c, KV_ERR_INPUT,
                            "%s: expected %" PRIu64
                            " bytes of data stored in the file, found %" PRIu64
                            " (unallocated or cut short)",
                            objpath, raw, stored);
        goto cleanup;
    }
    if (deflate && (raw - 1) / KV_REPORT_MAX_DEFLATE_RATIO >= stored) {
        st = h5_report_fail(
            c, KV_ERR_INPUT,
            "%s: expected at most %d bytes of data per stored byte (deflate's limit), "
            "found %" PRIu64 " bytes declared in %" PRIu64 " stored",
            objpath, KV_REPORT_MAX_DEFLATE_RATIO, raw, stored);
        goto cleanup;
    }
    if (layout == H5D_CHUNKED) {
        hsize_t chunk[H5S_MAX_RANK];
        const int crank = H5Pget_chunk(dcpl, H5S_MAX_RANK, chunk);
        if (crank < 0) {
            st = h5_fail(c, KV_ERR_INPUT, "%s: cannot read the chunk shape", objpath);
            goto cleanup;
        }
        if (crank != rank) {
            st = h5_report_fail(c, KV_ERR_INPUT, "%s: expected chunks of rank %d, found rank %d",
                                objpath, rank, crank);
            goto cleanup;
        }
        uint64_t expected = 1;
        for (int k = 0; k < rank; k++) {
            if (chunk[k] == 0 || chunk[k] > dims[k]) {
                char want[96], got[96];
                h5_shape_text(rank, dims, want, sizeof want);
                h5_shape_text(rank, chunk, got, sizeof got);
                st = h5_report_fail(c, KV_ERR_INPUT,
                                    "%s: expected chunks within the shape %s, found chunk shape %s",
                                    objpath, want, got);
                goto cleanup;
            }
            /* at most count chunks, so no overflow */
            expected *= (dims[k] + chunk[k] - 1) / chunk[k];
        }
        hsize_t n_chunks = 0;
        if (H5Dget_num_chunks(dset, space, &n_chunks) < 0) {
            st = h5_fail(c, KV_ERR_INPUT, "%s: cannot count the chunks", objpath);
            goto cleanup;
        }
        if (n_chunks != expected) {
            st =
                h5_report_fail(c, KV_ERR_INPUT,
                               "%s: expected all %" PRIu64 " chunks stored, found %llu (the others "
                               "would read as fill values)",
                               objpath, expected, (unsigned long long)n_chunks);
            goto cleanup;
        }
    }
cleanup:
    h5_close(H5Pclose, dcpl, objpath, &st, c);
    return st;
}

/* The slot of addr in the table of shared datasets read: where it is, or
 * the free slot where it goes (the table is never full: twice the runs). */
static size_t h5r_shared_slot(const ReportCtx *c, haddr_t addr) {
    size_t k = (size_t)((addr * 0x9e3779b97f4a7c15ull) >> 17) & (c->shared_cap - 1);
    while (c->shared_addr[k] != HADDR_UNDEF && c->shared_addr[k] != addr) {
        k = (k + 1) & (c->shared_cap - 1);
    }
    return k;
}

/* Reads dataset name of class cls and exactly shape dims into a new array
 * (NULL when it has no elements), after h5r_check_object (shared: see
 * there) and h5r_check_storage, and charged to the read budget. A shared
 * dataset (run's logits, run >= 0) that an earlier run already read is
 * copied from that run instead of being read again (decompressed once),
 * and only between runs of the same model and scenario: the writer links
 * identical logits of one (model, scenario) unit only. */
static KvStatus h5r_dataset(hid_t g, const char *gpath, const char *name, H5T_class_t cls,
                            hid_t mem_type, size_t elem, int rank, const hsize_t *dims, bool shared,
                            int64_t run, void **out, ReportCtx *c) {
    KvStatus st = KV_OK;
    hid_t dset = H5I_INVALID_HID, type = H5I_INVALID_HID, space = H5I_INVALID_HID;
    void *buf = NULL;
    char objpath[128], want[96], got[96], expect[160];
    snprintf(objpath, sizeof objpath, "%s/%s", gpath, name);
    h5_shape_text(rank, dims, want, sizeof want);
    snprintf(expect, sizeof expect, "%s dataset of shape %s", class_text(cls), want);
    *out = NULL;
    H5O_info_t oi;
    st = h5r_check_object_info(g, objpath, name, H5O_TYPE_DATASET, shared, expect, &oi, c);
    if (st != KV_OK) goto cleanup;
    int64_t owner = -1;
    if (shared && oi.rc > 1 && run >= 0 && c->shared_addr != NULL) {
        const size_t slot = h5r_shared_slot(c, oi.addr);
        owner = c->shared_addr[slot] == oi.addr ? c->shared_run[slot] : -1;
        const KvRun *a = owner >= 0 ? &c->runs[owner] : NULL, *b = &c->runs[run];
        if (a != NULL && (strncmp(a->model, b->model, KV_NAME_LEN) != 0 ||
                          strncmp(a->scenario, b->scenario, KV_NAME_LEN) != 0)) {
            char other[32];
            h5_run_group_name(owner, other, sizeof other);
            st = h5_report_fail(c, KV_ERR_INPUT,
                                "%s: expected %s of its own or shared with runs of the same "
                                "model and scenario (the writer links identical logits within "
                                "one unit only), found the dataset of /runs/%s/%s (model "
                                "'%.64s', scenario '%.64s'; this run: '%.64s', '%.64s')",
                                objpath, expect, other, name, a->model, a->scenario, b->model,
                                b->scenario);
            goto cleanup;
        }
        if (owner < 0) {
            c->shared_addr[slot] = oi.addr;
            c->shared_run[slot] = run;
        }
    }
    dset = H5Dopen2(g, name, H5P_DEFAULT);
    if (dset < 0) {
        st = h5_fail(c, KV_ERR_INPUT, "%s: expected %s, found one HDF5 cannot open", objpath,
                     expect);
        goto cleanup;
    }
    type = H5Dget_type(dset);
    space = H5Dget_space(dset);
    if (type < 0 || space < 0) {
        st = h5_fail(c, KV_ERR_INPUT, "%s: cannot inspect", objpath);
        goto cleanup;
    }
    const H5T_class_t found = H5Tget_class(type);
    const int frank = H5Sget_simple_extent_ndims(space);
    if (found < 0 || frank < 0) {
        st = h5_fail(c, KV_ERR_INPUT, "%s: cannot inspect", objpath);
        goto cleanup;
    }
    if (found != cls) {
        st = h5_report_fail(c, KV_ERR_INPUT, "%s: expected %s dataset, found %s dataset", objpath,
                            class_text(cls), class_text(found));
        goto cleanup;
    }
    hsize_t fdims[H5S_MAX_RANK];
    if (frank > H5S_MAX_RANK || H5Sget_simple_extent_dims(space, fdims, NULL) < 0) {
        st = h5_fail(c, KV_ERR_INPUT, "%s: cannot read the shape", objpath);
        goto cleanup;
    }
    bool same = frank == rank;
    for (int k = 0; same && k < rank; k++) same = fdims[k] == dims[k];
    if (!same) {
        h5_shape_text(frank, fdims, got, sizeof got);
        st = h5_report_fail(c, KV_ERR_INPUT, "%s: expected shape %s, found %s", objpath, want, got);
        goto cleanup;
    }
    size_t count = 0, bytes = 0;
    if (!h5_shape_count(rank, dims, &count) || !h5_size_mul(count, elem, &bytes)) {
        st = h5_report_fail(c, KV_ERR_INPUT, "%s: expected a shape that fits in memory, found %s",
                            objpath, want);
        goto cleanup;
    }
    if (count == 0) goto cleanup;
    /* a copy: the owner's read checked the storage (same object, same shape) */
    if ((owner < 0 &&
         (st = h5r_check_storage(dset, objpath, type, space, rank, dims, count, c)) != KV_OK) ||
        (st = h5r_charge(c, objpath, bytes)) != KV_OK) {
        goto cleanup;
    }
    buf = malloc(bytes);
    if (buf == NULL) {
        st = h5_report_fail(c, KV_ERR_INTERNAL, "%s: out of memory (%zu bytes)", objpath, bytes);
        goto cleanup;
    }
    /* out is the array's pointer in c->runs[run]: the owner's is at the
     * same offset in its run */
    const void *from = NULL;
    if (owner >= 0) {
        const size_t at = (size_t)((const char *)out - (const char *)&c->runs[run]);
        memcpy(&from, (const char *)&c->runs[owner] + at, sizeof from);
    }
    if (from != NULL) {
        memcpy(buf, from, bytes);
    } else if (cls == H5T_STRING) {
        st = h5r_strings(dset, false, type, space, count, buf, elem, objpath, c);
        if (st != KV_OK) goto cleanup;
    } else if (H5Dread(dset, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf) < 0) {
        st = h5_fail(c, KV_ERR_INPUT, "%s: cannot read", objpath);
        goto cleanup;
    }
    *out = buf;
    buf = NULL;
cleanup:
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
static KvStatus h5r_table_mem_type(hid_t ftype, const char *objpath, const ColumnTable *t,
                                   hid_t *out, ReportCtx *c) {
    KvStatus st = KV_OK;
    hid_t mem = H5I_INVALID_HID, mt = H5I_INVALID_HID, str = H5I_INVALID_HID;
    const Column *m = t->columns;
    *out = H5I_INVALID_HID;
    mem = H5Tcreate(H5T_COMPOUND, t->row_size);
    if (mem < 0) {
        st = h5_fail(c, KV_ERR_INTERNAL, "%s: cannot create a compound type", objpath);
        goto cleanup;
    }
    for (size_t i = 0; i < t->n_columns; i++) {
        const int idx = H5Tget_member_index(ftype, m[i].name);
        if (idx < 0) {
            /* a missing member is a lookup failure on HDF5's side */
            if (H5Eclear2(H5E_DEFAULT) < 0) {
                st = h5_fail(c, KV_ERR_INTERNAL, "cannot clear the HDF5 error stack");
                goto cleanup;
            }
            st = h5_report_fail(c, KV_ERR_INPUT, "%s: member %s: expected %s, found nothing",
                                objpath, m[i].name, member_kind_text(m[i].kind));
            goto cleanup;
        }
        const H5T_class_t want = m[i].kind == COL_F64   ? H5T_FLOAT
                                 : m[i].kind == COL_STR ? H5T_STRING
                                                        : H5T_INTEGER;
        const H5T_class_t found = H5Tget_member_class(ftype, (unsigned)idx);
        if (found < 0) {
            st = h5_fail(c, KV_ERR_INPUT, "%s: member %s: cannot inspect", objpath, m[i].name);
            goto cleanup;
        }
        if (found != want) {
            st = h5_report_fail(c, KV_ERR_INPUT, "%s: member %s: expected %s, found %s", objpath,
                                m[i].name, member_kind_text(m[i].kind), class_text(found));
            goto cleanup;
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
                goto cleanup;
            }
            if (cset != H5T_CSET_ASCII && cset != H5T_CSET_UTF8) {
                st = h5_report_fail(c, KV_ERR_INPUT,
                                    "%s: member %s: expected an ASCII or UTF-8 "
                                    "string, found character set %d",
                                    objpath, m[i].name, (int)cset);
                goto cleanup;
            }
            /* HDF5 converts fixed-length strings of any size (lengths are
             * checked after reading), not variable-length ones in a compound */
            if (vlen) {
                st = h5_report_fail(c, KV_ERR_INPUT,
                                    "%s: member %s: expected a fixed-length string of at most %zu "
                                    "bytes, found a variable-length string",
                                    objpath, m[i].name, m[i].width - 1);
                goto cleanup;
            }
            st = h5_string_type_pad(m[i].width, H5T_STR_NULLPAD, &str, c);
            if (st != KV_OK) goto cleanup;
            if (H5Tset_cset(str, cset) < 0) {
                st = h5_fail(c, KV_ERR_INTERNAL, "%s: member %s: cannot set the character set",
                             objpath, m[i].name);
                goto cleanup;
            }
            mem_member = str;
            break;
        }
        }
        if (H5Tinsert(mem, m[i].name, m[i].offset, mem_member) < 0) {
            st = h5_fail(c, KV_ERR_INTERNAL, "%s: cannot add member %s to a compound type", objpath,
                         m[i].name);
            goto cleanup;
        }
        h5_close(H5Tclose, str, objpath, &st, c);
        str = H5I_INVALID_HID;
        h5_close(H5Tclose, mt, objpath, &st, c);
        mt = H5I_INVALID_HID;
        if (st != KV_OK) goto cleanup;
    }
    *out = mem;
    mem = H5I_INVALID_HID;
cleanup:
    h5_close(H5Tclose, str, objpath, &st, c);
    h5_close(H5Tclose, mt, objpath, &st, c);
    h5_close(H5Tclose, mem, objpath, &st, c);
    return st;
}

/* Reads the 1-D compound table t (/name) into calloc'd staging rows: at
 * most max_rows, or exactly want_rows when that is >= 0, checked before any
 * row is read. */
static KvStatus h5r_table(hid_t file, const ColumnTable *t, int64_t max_rows, int64_t want_rows,
                          const char *rows_why, void **rows, int64_t *n_rows, ReportCtx *c) {
    KvStatus st = KV_OK;
    hid_t dset = H5I_INVALID_HID, ftype = H5I_INVALID_HID, space = H5I_INVALID_HID,
          mem = H5I_INVALID_HID;
    void *buf = NULL;
    const char *name = t->name;
    const Column *m = t->columns;
    const size_t nm = t->n_columns, row_size = t->row_size;
    char objpath[64];
    snprintf(objpath, sizeof objpath, "/%s", name);
    *rows = NULL;
    *n_rows = 0;
    st =
        h5r_check_object(file, objpath, name, H5O_TYPE_DATASET, false, "a 1-D compound dataset", c);
    if (st != KV_OK) goto cleanup;
    dset = H5Dopen2(file, name, H5P_DEFAULT);
    if (dset < 0) {
        st = h5_fail(c, KV_ERR_INPUT,
                     "%s: expected a 1-D compound dataset, found one HDF5 cannot open", objpath);
        goto cleanup;
    }
    ftype = H5Dget_type(dset);
    space = H5Dget_space(dset);
    if (ftype < 0 || space < 0) {
        st = h5_fail(c, KV_ERR_INPUT, "%s: cannot inspect", objpath);
        goto cleanup;
    }
    const H5T_class_t cls = H5Tget_class(ftype);
    const int rank = H5Sget_simple_extent_ndims(space);
    if (cls < 0 || rank < 0) {
        st = h5_fail(c, KV_ERR_INPUT, "%s: cannot inspect", objpath);
        goto cleanup;
    }
    if (cls != H5T_COMPOUND || rank != 1) {
        st = h5_report_fail(c, KV_ERR_INPUT,
                            "%s: expected a 1-D compound dataset, found %s of rank %d", objpath,
                            class_text(cls), rank);
        goto cleanup;
    }
    st = h5r_table_mem_type(ftype, objpath, t, &mem, c);
    if (st != KV_OK) goto cleanup;
    hsize_t dims[1];
    if (H5Sget_simple_extent_dims(space, dims, NULL) < 0) {
        st = h5_fail(c, KV_ERR_INPUT, "%s: cannot read the shape", objpath);
        goto cleanup;
    }
    if (want_rows >= 0 && dims[0] != (hsize_t)want_rows) {
        st = h5_report_fail(c, KV_ERR_INPUT, "%s: expected %" PRId64 " rows (%s), found %llu",
                            objpath, want_rows, rows_why, (unsigned long long)dims[0]);
        goto cleanup;
    }
    if (dims[0] > (hsize_t)max_rows) {
        st = h5_report_fail(c, KV_ERR_INPUT,
                            "%s: expected at most %" PRId64 " rows (%s), found %llu", objpath,
                            max_rows, rows_why, (unsigned long long)dims[0]);
        goto cleanup;
    }
    const size_t n = (size_t)dims[0];
    size_t bytes;
    if (!h5_size_mul(n > 0 ? n : 1, row_size, &bytes)) {
        st = h5_report_fail(c, KV_ERR_INPUT,
                            "%s: expected a row count that fits in memory, found %zu", objpath, n);
        goto cleanup;
    }
    if (n > 0) {
        const hsize_t shape[1] = {dims[0]};
        if ((st = h5r_check_storage(dset, objpath, ftype, space, 1, shape, n, c)) != KV_OK ||
            (st = h5r_charge(c, objpath, bytes)) != KV_OK) {
            goto cleanup;
        }
    }
    buf = calloc(1, bytes);
    if (buf == NULL) {
        st = h5_report_fail(c, KV_ERR_INTERNAL, "%s: out of memory", objpath);
        goto cleanup;
    }
    if (n > 0 && H5Dread(dset, mem, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf) < 0) {
        st = h5_fail(c, KV_ERR_INPUT, "%s: cannot read", objpath);
        goto cleanup;
    }
    /* NULLPAD reading: a string without a terminator did not fit */
    for (size_t r = 0; r < n; r++) {
        for (size_t i = 0; i < nm; i++) {
            if (m[i].kind != COL_STR) continue;
            const char *str = (const char *)buf + r * row_size + m[i].offset;
            if (strnlen(str, m[i].width) == m[i].width) {
                st = h5_report_fail(c, KV_ERR_INPUT,
                                    "%s[%zu]: member %s: expected a string of at most %zu bytes, "
                                    "found %zu or more",
                                    objpath, r, m[i].name, m[i].width - 1, m[i].width);
                goto cleanup;
            }
        }
    }
    *rows = buf;
    *n_rows = (int64_t)n;
    buf = NULL;
cleanup:
    free(buf);
    h5_close(H5Tclose, mem, objpath, &st, c);
    h5_close(H5Sclose, space, objpath, &st, c);
    h5_close(H5Tclose, ftype, objpath, &st, c);
    h5_close(H5Dclose, dset, objpath, &st, c);
    return st;
}

/* n staged rows of table t as a new array of its report structs in *out
 * (NULL when n is 0), charged to the read budget. */
static KvStatus h5r_table_copy(const ColumnTable *t, const void *rows, int64_t n, void **out,
                               ReportCtx *c) {
    char objpath[64];
    snprintf(objpath, sizeof objpath, "/%s", t->name);
    *out = NULL;
    if (n == 0) return KV_OK;
    KvStatus st = h5r_charge(c, objpath, (uint64_t)n * t->rep_size);
    if (st != KV_OK) return st;
    char *dst = calloc((size_t)n, t->rep_size);
    if (dst == NULL) return h5_report_fail(c, KV_ERR_INTERNAL, "%s: out of memory", objpath);
    for (int64_t k = 0; k < n; k++) {
        const char *s = (const char *)rows + (size_t)k * t->row_size;
        char *d = dst + (size_t)k * t->rep_size;
        /* strings: h5r_table checked their terminators */
        for (size_t i = 0; i < t->n_columns; i++) {
            const Column *m = &t->columns[i];
            memcpy(d + m->rep_offset, s + m->offset, m->width);
        }
    }
    *out = dst;
    return KV_OK;
}

static KvStatus h5r_tolerances(hid_t file, KvReport *rep, ReportCtx *c) {
    void *rows = NULL;
    int64_t n = 0;
    KvStatus st = h5r_table(file, &H5_TOLERANCES, KV_REPORT_MAX_TOLERANCES, -1,
                            "KV_REPORT_MAX_TOLERANCES", &rows, &n, c);
    if (st != KV_OK) goto cleanup;
    st = h5r_table_copy(&H5_TOLERANCES, rows, n, (void **)&rep->tolerances, c);
    if (st != KV_OK) goto cleanup;
    rep->n_tolerances = n;
cleanup:
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
    KvStatus st = h5r_table(file, &H5_COMPARISONS, KV_REPORT_MAX_COMPARISONS_PER_RUN * rep->n_runs,
                            -1, why, (void **)&rows, &n, c);
    if (st != KV_OK) goto cleanup;
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
                st = h5_report_fail(c, KV_ERR_INPUT,
                                    "/comparisons[%" PRId64 "]: member %s: expected %" PRId64
                                    "..%" PRId64 ", found %" PRId64,
                                    k, checks[j].name, checks[j].lo, checks[j].hi, checks[j].v);
                goto cleanup;
            }
        }
    }
    st = h5r_table_copy(&H5_COMPARISONS, rows, n, (void **)&rep->comparisons, c);
    if (st != KV_OK) goto cleanup;
    rep->n_comparisons = n;
cleanup:
    free(rows);
    return st;
}

/* The summary is derived data: it must be there with one row per run, and
 * its members must have the documented types, but nothing is loaded. */
static KvStatus h5r_summary(hid_t file, const KvReport *rep, ReportCtx *c) {
    void *rows = NULL;
    int64_t n = 0;
    KvStatus st =
        h5r_table(file, &H5_SUMMARY, rep->n_runs, rep->n_runs, "one per run", &rows, &n, c);
    free(rows);
    return st;
}

/* The datasets of run r (h5_run_holds), each exactly of its shape. Only a
 * dataset marked shared (the full logits) may be linked from other runs
 * (the writer's hard links). */
static KvStatus h5r_run_datasets(hid_t g, const char *objpath, int64_t run, KvRun *r,
                                 ReportCtx *c) {
    for (size_t k = 0; k < H5_RUN_DATASETS.n; k++) {
        const RunDataset *d = &H5_RUN_DATASETS.sets[k];
        if (d->held == HELD_IF_SET) {
            if (r->skipped) continue;
            const htri_t there = H5Lexists(g, d->name, H5P_DEFAULT);
            if (there < 0) return h5_fail(c, KV_ERR_INPUT, "%s/%s: cannot look up", objpath,
                                          d->name);
            if (there == 0) continue; /* not recorded: stays NULL */
        } else if (!h5_run_holds(r, d)) {
            continue;
        }
        hsize_t dims[3];
        const int rank = h5_run_shape(r, d->shape, dims);
        H5T_class_t cls = H5T_NO_CLASS;
        hid_t mem_type = H5I_INVALID_HID;
        switch (d->kind) {
        case DATA_I32:
            cls = H5T_INTEGER;
            mem_type = H5T_NATIVE_INT32;
            break;
        case DATA_U8:
            cls = H5T_INTEGER;
            mem_type = H5T_NATIVE_UINT8;
            break;
        case DATA_U64:
            cls = H5T_INTEGER;
            mem_type = H5T_NATIVE_UINT64;
            break;
        case DATA_F32:
            cls = H5T_FLOAT;
            mem_type = H5T_NATIVE_FLOAT;
            break;
        case DATA_F64:
            cls = H5T_FLOAT;
            mem_type = H5T_NATIVE_DOUBLE;
            break;
        case DATA_NAME: cls = H5T_STRING; break; /* h5r_strings makes the memory type */
        }
        const KvStatus st = h5r_dataset(g, objpath, d->name, cls, mem_type, d->elem, rank, dims,
                                        d->shared, run, (void **)((char *)r + d->offset), c);
        if (st != KV_OK) return st;
    }
    return KV_OK;
}

/* The optional (batch,) dataset prompt_text of a run that ran: each row's
 * text, variable-length ASCII or UTF-8 strings, into r->prompt_text
 * (h5_prompt_text_ok says what each must be). Absent: stays NULL. */
static KvStatus h5r_prompt_text(hid_t g, const char *gpath, KvRun *r, ReportCtx *c) {
    KvStatus st = KV_OK;
    hid_t dset = H5I_INVALID_HID, type = H5I_INVALID_HID, space = H5I_INVALID_HID;
    hid_t mem = H5I_INVALID_HID;
    char **vls = NULL;
    char objpath[128], expect[96], why[160];
    snprintf(objpath, sizeof objpath, "%s/prompt_text", gpath);
    snprintf(expect, sizeof expect, "a (%" PRId64 ",) variable-length string dataset", r->batch);
    const htri_t there = H5Lexists(g, "prompt_text", H5P_DEFAULT);
    if (there < 0) return h5_fail(c, KV_ERR_INPUT, "%s: cannot look up", objpath);
    if (there == 0 || r->skipped) return KV_OK;
    H5O_info_t oi;
    st = h5r_check_object_info(g, objpath, "prompt_text", H5O_TYPE_DATASET, false, expect, &oi, c);
    if (st != KV_OK) goto cleanup;
    dset = H5Dopen2(g, "prompt_text", H5P_DEFAULT);
    type = dset < 0 ? H5I_INVALID_HID : H5Dget_type(dset);
    space = dset < 0 ? H5I_INVALID_HID : H5Dget_space(dset);
    if (dset < 0 || type < 0 || space < 0) {
        st = h5_fail(c, KV_ERR_INPUT, "%s: expected %s, found one HDF5 cannot open", objpath,
                     expect);
        goto cleanup;
    }
    hsize_t dims[H5S_MAX_RANK];
    const int rank = H5Sget_simple_extent_ndims(space);
    const H5T_cset_t cset = H5Tget_cset(type);
    if (H5Tget_class(type) != H5T_STRING || H5Tis_variable_str(type) <= 0 || rank != 1 ||
        H5Sget_simple_extent_dims(space, dims, NULL) < 0 || dims[0] != (hsize_t)r->batch ||
        (cset != H5T_CSET_ASCII && cset != H5T_CSET_UTF8)) {
        st = h5_report_fail(c, KV_ERR_INPUT, "%s: expected %s of ASCII or UTF-8 text", objpath,
                            expect);
        goto cleanup;
    }
    mem = H5Tcopy(H5T_C_S1);
    if (mem < 0 || H5Tset_size(mem, H5T_VARIABLE) < 0 || H5Tset_cset(mem, cset) < 0) {
        st = h5_fail(c, KV_ERR_INTERNAL, "%s: cannot make a string type", objpath);
        goto cleanup;
    }
    vls = calloc((size_t)r->batch + 1, sizeof *vls);
    if (vls == NULL) {
        st = h5_report_fail(c, KV_ERR_INTERNAL, "out of memory");
        goto cleanup;
    }
    if (r->batch > 0 && H5Dread(dset, mem, H5S_ALL, H5S_ALL, H5P_DEFAULT, vls) < 0) {
        st = h5_fail(c, KV_ERR_INPUT, "%s: cannot read", objpath);
        goto cleanup;
    }
    uint64_t bytes = 0;
    for (int64_t b = 0; b < r->batch; b++) {
        if (vls[b] == NULL) {
            st = h5_report_fail(c, KV_ERR_INPUT, "%s: row %" PRId64 ": expected a string, found "
                                "none", objpath, b);
            goto cleanup;
        }
        bytes += strnlen(vls[b], KV_PROMPT_TEXT_MAX_BYTES) + 1;
    }
    st = h5r_charge(c, objpath, bytes);
    if (st != KV_OK) goto cleanup;
    /* HDF5's strings are released with its own call: the run keeps copies */
    r->prompt_text = kv_prompt_text_copy(vls, r->batch);
    if (r->prompt_text == NULL) {
        st = h5_report_fail(c, KV_ERR_INTERNAL, "out of memory");
        goto cleanup;
    }
    if (!h5_prompt_text_ok(r, why, sizeof why)) {
        st = h5_report_fail(c, KV_ERR_INPUT, "%s: %s", gpath, why);
    }
cleanup:
    if (vls != NULL && r->batch > 0 && mem >= 0 &&
        H5Dvlen_reclaim(mem, space, H5P_DEFAULT, vls) < 0 && st == KV_OK) {
        st = h5_fail(c, KV_ERR_INTERNAL, "%s: cannot release variable-length strings", objpath);
    }
    free(vls);
    h5_close(H5Tclose, mem, objpath, &st, c);
    h5_close(H5Sclose, space, objpath, &st, c);
    h5_close(H5Tclose, type, objpath, &st, c);
    h5_close(H5Dclose, dset, objpath, &st, c);
    return st;
}

static KvStatus h5r_run(hid_t runs, int64_t i, int64_t n_runs, KvRun *r, ReportCtx *c) {
    KvStatus st = KV_OK;
    hid_t g = H5I_INVALID_HID;
    char name[32], objpath[48], expect[96];
    h5_run_group_name(i, name, sizeof name);
    snprintf(objpath, sizeof objpath, "/runs/%s", name);
    snprintf(expect, sizeof expect, "a group (runs are numbered 0000..%04" PRId64 ")", n_runs - 1);
    st = h5r_check_object(runs, objpath, name, H5O_TYPE_GROUP, false, expect, c);
    if (st != KV_OK) goto cleanup;
    g = H5Gopen2(runs, name, H5P_DEFAULT);
    if (g < 0) {
        st = h5_fail(c, KV_ERR_INPUT, "%s: expected a group, found one HDF5 cannot open", objpath);
        goto cleanup;
    }
    /* an attribute written only when set reads, when absent, as unset */
    h5_attr_fields_unset(&H5_RUN_ATTRS, r);
    st = h5r_attr_fields(g, objpath, &H5_RUN_ATTRS, r, c);
    if (st != KV_OK) goto cleanup;
    RunCounts n;
    if (!h5_run_counts(r, &n)) {
        st = h5_report_fail(c, KV_ERR_INPUT,
                            "%s: expected sizes whose products fit in memory, found steps %" PRId64
                            ", batch %" PRId64 ", vocab %" PRId64 ", prompt_len %" PRId64
                            ", n_probes %" PRId64,
                            objpath, r->steps, r->batch, r->vocab, r->prompt_len, r->n_probes);
        goto cleanup;
    }
    /* A skipped run with datasets is a damaged report (its skipped flag
     * would hide a result), as is any object the schema does not name. */
    LinkScan scan = {.names = NULL,
                     .run = r,
                     .n_runs = 0,
                     .expect = "a dataset",
                     .found = "",
                     .bad_link = false};
    st = h5r_scan_group(g, objpath, &scan,
                        r->skipped    ? "attributes (the run is skipped)"
                        : r->topk > 0 ? "the datasets of a top-k run (SCHEMA.md)"
                                      : "the datasets of a run (SCHEMA.md)",
                        c);
    if (st != KV_OK) goto cleanup;
    st = h5r_run_datasets(g, objpath, i, r, c); /* none when skipped */
    if (st == KV_OK) st = h5r_prompt_text(g, objpath, r, c);
    if (st != KV_OK) goto cleanup;
    /* a prefix-reuse script is whole: its three attributes within the
     * run's sizes and its suffix there (a run without one has none) */
    if (!h5_run_script_ok(r)) {
        st = h5_report_fail(c, KV_ERR_INPUT,
                            "%s: a prefix-reuse script expects 1 <= save_after < prompt_len "
                            "(%lld), 1 <= switch_step < steps (%lld) and a suffix dataset, a "
                            "context shift shift_step >= 1, shift_drop >= 1, no switch and "
                            "shift_keep + shift_drop <= prompt_len + shift_step - 1; found "
                            "%lld, %lld, suffix_len %lld%s, shift %lld/%lld/%lld",
                            objpath, (long long)r->prompt_len, (long long)r->steps,
                            (long long)r->save_after, (long long)r->switch_step,
                            (long long)r->suffix_len, r->suffix == NULL ? ", no suffix" : "",
                            (long long)r->shift_step, (long long)r->shift_keep,
                            (long long)r->shift_drop);
        goto cleanup;
    }
    /* what the arrays say: top-k ids, another engine's margins and skip
     * reason (h5util.h) */
    char why[320];
    if (!h5_run_values_ok(r, why, sizeof why)) {
        char label[KV_NAME_LEN * 4];
        kv_run_variant_label(r, label, sizeof label);
        st = h5_report_fail(c, KV_ERR_INPUT, "%s (%.64s/%.64s/%.64s/%.16s/%.16s/r%d): %s", objpath,
                            r->model, r->scenario, label, r->backend, r->mode, (int)r->repeat,
                            why);
    }
cleanup:
    h5_close(H5Gclose, g, objpath, &st, c);
    return st;
}

static KvStatus h5r_runs(hid_t file, KvReport *rep, ReportCtx *c) {
    KvStatus st = KV_OK;
    hid_t runs = H5I_INVALID_HID;
    st = h5r_check_object(file, "/runs", "runs", H5O_TYPE_GROUP, false, "a group", c);
    if (st != KV_OK) goto cleanup;
    runs = H5Gopen2(file, "runs", H5P_DEFAULT);
    if (runs < 0) {
        st = h5_fail(c, KV_ERR_INPUT, "/runs: expected a group, found one HDF5 cannot open");
        goto cleanup;
    }
    H5G_info_t info;
    if (H5Gget_info(runs, &info) < 0) {
        st = h5_fail(c, KV_ERR_INPUT, "/runs: cannot list");
        goto cleanup;
    }
    if (info.nlinks > (hsize_t)KV_REPORT_MAX_RUNS) {
        st = h5_report_fail(c, KV_ERR_INPUT,
                            "/runs: expected at most %" PRId64
                            " runs (KV_REPORT_MAX_RUNS), found %llu",
                            KV_REPORT_MAX_RUNS, (unsigned long long)info.nlinks);
        goto cleanup;
    }
    const int64_t n = (int64_t)info.nlinks;
    /* every name a run group's; h5r_run then finds each of 0000..n-1, so
     * a gap is named as the run that is missing */
    LinkScan scan = {.names = NULL,
                     .run = NULL,
                     .n_runs = KV_REPORT_MAX_RUNS,
                     .expect = "a run group",
                     .found = "",
                     .bad_link = false};
    st = h5r_scan_group(runs, "/runs", &scan, "run groups named by their index (0000, 0001, ...)",
                        c);
    if (st != KV_OK) goto cleanup;
    if (n > 0) {
        st = h5r_charge(c, "/runs", (uint64_t)n * sizeof *rep->runs);
        if (st != KV_OK) goto cleanup;
        rep->runs = calloc((size_t)n, sizeof *rep->runs);
        if (rep->runs == NULL) {
            st = h5_report_fail(c, KV_ERR_INTERNAL, "/runs: out of memory");
            goto cleanup;
        }
    }
    rep->n_runs = n;
    if (n > 0) {
        /* at most one shared dataset a run: 2n slots keep probes short (32
         * bytes a run, within the run records' charge) */
        size_t cap = 2;
        while (cap < 2 * (size_t)n) cap *= 2;
        c->shared_addr = malloc(cap * sizeof *c->shared_addr);
        c->shared_run = malloc(cap * sizeof *c->shared_run);
        if (c->shared_addr == NULL || c->shared_run == NULL) {
            st = h5_report_fail(c, KV_ERR_INTERNAL, "/runs: out of memory");
            goto cleanup;
        }
        for (size_t k = 0; k < cap; k++) c->shared_addr[k] = HADDR_UNDEF;
        c->shared_cap = cap;
        c->runs = rep->runs;
    }
    for (int64_t i = 0; i < n; i++) {
        st = h5r_run(runs, i, n, &rep->runs[i], c);
        if (st != KV_OK) goto cleanup;
    }
cleanup:
    free(c->shared_addr);
    free(c->shared_run);
    c->shared_addr = NULL;
    c->shared_run = NULL;
    c->shared_cap = 0;
    c->runs = NULL;
    h5_close(H5Gclose, runs, "/runs", &st, c);
    return st;
}

/* ---- the report ------------------------------------------------------------ */

/* What the root group may hold (SCHEMA.md, Layout). */
static const char *const ROOT_NAMES[] = {"tolerances", "runs",   "comparisons",
                                         "summary",    "bisect", NULL};

KvStatus kv_report_read_h5(const char *path, KvReport *out, KvError *err) {
    if (path == NULL || out == NULL) {
        return kv_error_set(err, KV_ERR_INPUT, "kv_report_read_h5: NULL %s",
                            path == NULL ? "path" : "output");
    }
    ReportCtx c = {.path = path,
                   .err = err,
                   .file_size = 0,
                   .budget = 0,
                   .allowed = 0,
                   .runs = NULL,
                   .shared_addr = NULL,
                   .shared_run = NULL,
                   .shared_cap = 0};
    KvReport rep;
    memset(&rep, 0, sizeof rep);
    KvStatus st = KV_OK;
    hid_t fapl = H5I_INVALID_HID, file = H5I_INVALID_HID;
    QuietErrors quiet = {.saved = false};

    /* A writer's temporary is never a report: the writer removes it, and
     * one left by a killed writer of an older version may be incomplete. */
    if (kv_report_is_temp_name(path)) {
        st = h5_report_fail(&c, KV_ERR_INPUT,
                            "expected a report, found a writer's temporary (NAME.tmp-PID, left by "
                            "an interrupted write; the report is NAME)");
        goto cleanup;
    }
    /* The OS says why a file cannot be opened better than HDF5 does. */
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        st = h5_report_fail(&c, KV_ERR_INPUT, "cannot open: %s", strerror(errno));
        goto cleanup;
    }
    struct stat sb;
    const int stat_rc = fstat(fd, &sb);
    const int stat_errno = errno;
    if (close(fd) != 0 || stat_rc != 0) {
        st = h5_report_fail(&c, KV_ERR_INPUT, "cannot open: %s",
                            strerror(stat_rc != 0 ? stat_errno : errno));
        goto cleanup;
    }
    if (!S_ISREG(sb.st_mode)) {
        st = h5_report_fail(&c, KV_ERR_INPUT, "expected an HDF5 file, found %s",
                            S_ISDIR(sb.st_mode) ? "a directory" : "something that is not a file");
        goto cleanup;
    }
    c.file_size = sb.st_size > 0 ? (uint64_t)sb.st_size : 0;
    c.allowed = kv_limits_read_budget(c.file_size);
    c.budget = c.allowed;
    st = h5_quiet_begin(&quiet, &c);
    if (st != KV_OK) goto cleanup;
    /* H5Fis_hdf5 is the 1.10 call (H5Fis_accessible from 1.12 on): it finds
     * the signature at 0, 512, 1024, ... so a user block is fine */
    const htri_t is_h5 = H5Fis_hdf5(path);
    if (is_h5 < 0) {
        st = h5_fail(&c, KV_ERR_INPUT, "expected an HDF5 file, found one that cannot be probed");
        goto cleanup;
    }
    if (is_h5 == 0) {
        st = h5_report_fail(&c, KV_ERR_INPUT,
                            "expected an HDF5 file, found %lld bytes without an HDF5 signature",
                            (long long)sb.st_size);
        goto cleanup;
    }
    fapl = H5Pcreate(H5P_FILE_ACCESS);
    if (fapl < 0 || H5Pset_fclose_degree(fapl, H5F_CLOSE_STRONG) < 0) {
        st = h5_fail(&c, KV_ERR_INTERNAL, "cannot set up the file access properties");
        goto cleanup;
    }
    file = H5Fopen(path, H5F_ACC_RDONLY, fapl);
    if (file < 0) {
        st = h5_fail(&c, KV_ERR_INPUT,
                     "expected a complete HDF5 file, found one HDF5 cannot open (%lld bytes; "
                     "truncated or damaged?)",
                     (long long)sb.st_size);
        goto cleanup;
    }
    LinkScan scan = {.names = ROOT_NAMES,
                     .run = NULL,
                     .n_runs = 0,
                     .expect = "an object",
                     .found = "",
                     .bad_link = false};
    if ((st = h5r_attr_fields(file, "/", &H5_ROOT_ATTRS, &rep, &c)) != KV_OK ||
        (st = h5r_scan_group(file, "/", &scan, "tolerances, runs, comparisons, summary and bisect",
                             &c)) != KV_OK ||
        (st = h5r_tolerances(file, &rep, &c)) != KV_OK ||
        (st = h5r_runs(file, &rep, &c)) != KV_OK ||
        (st = h5r_comparisons(file, &rep, &c)) != KV_OK ||
        (st = h5r_summary(file, &rep, &c)) != KV_OK) {
        goto cleanup;
    }
cleanup:
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
