/* report_h5_write.c: KvReport -> HDF5 (docs/SCHEMA.md,
 * kv_report_write_h5 in report_h5.h). The layout comes from h5util.h.
 *
 * Reproducible bytes come from: v1.8 format bounds (low = high = V18, so a
 * newer library cannot pick newer object versions), no object timestamps
 * (H5Pset_obj_track_times(.., 0) on the root via the file creation list, on
 * every group and on every dataset), links and attributes kept compact in the
 * object headers (no fractal heaps), explicit zero fill values, fixed-length
 * strings copied into zeroed buffers, compound rows staged in calloc'd
 * memory, and a fixed creation order (the order of h5util.c's lists). The
 * file is built in memory and reaches the disk through
 * kv_report_file_publish (report.h). */
#include "report_h5.h"

#include <hdf5.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "h5util.h"

#define KV_H5_DEFLATE_LEVEL 4
/* Links and attributes stay in the object header up to this many (HDF5's
 * limit is 65535); dense storage would bring in fractal heaps and B-trees,
 * which buy nothing at our sizes and are more bytes to keep deterministic. */
#define KV_H5_MAX_COMPACT 65535
/* Except /runs in a report of more runs than this: a compact link is found
 * by a scan of the group's object header, so adding n of them costs n^2 (a
 * `gate --faults all` report, ~30000 runs, spent over half an hour in
 * H5O__alloc; the default gate's 2820 runs, 7 of its 39 s single-threaded).
 * Such a report's /runs keeps its links in dense storage (a B-tree; the same
 * bytes for the same report, the same contents as before). The group's
 * settings are part of its bytes, so a report of at most this many runs
 * keeps the bytes it had (test_gate_bytes). */
#define KV_H5_RUNS_DENSE_ABOVE 1024
/* The writer's in-memory file grows by this much at a time (the core
 * driver's increment): large enough that a gate report needs few
 * reallocations, small enough to waste little on a tiny one. */
#define KV_H5_CORE_INCREMENT ((size_t)1 << 20)
/* Appended to the path to name the writer's in-memory file (see
 * kv_report_write_h5). */
#define KV_H5_MEMORY_LABEL "/(kvrepro in-memory file)"

/* ---- the limits table (kv_limits.h) ------------------------------------- */

uint64_t kv_limits_read_budget(uint64_t file_size) {
    const uint64_t by_size = file_size > KV_REPORT_MAX_READ_BYTES / KV_REPORT_MAX_READ_RATIO
                                 ? KV_REPORT_MAX_READ_BYTES
                                 : file_size * KV_REPORT_MAX_READ_RATIO;
    const uint64_t b = by_size > KV_REPORT_READ_FLOOR_BYTES ? by_size : KV_REPORT_READ_FLOOR_BYTES;
    return b < KV_REPORT_MAX_READ_BYTES ? b : KV_REPORT_MAX_READ_BYTES;
}

KvStatus kv_limits_check_scenario(int64_t batch, int64_t prompt_len, int64_t max_new,
                                  const char *what, KvError *err) {
    const struct {
        const char *field;
        int64_t v, cap;
        const char *why;
    } sizes[] = {
        {"prompt rows", batch, KV_REPORT_MAX_BATCH, "KV_REPORT_MAX_BATCH, a run's batch"},
        {"prompt length", prompt_len, KV_REPORT_MAX_PROMPT_LEN,
         "KV_REPORT_MAX_PROMPT_LEN, tokens in the longest row"},
        {"new tokens", max_new, KV_REPORT_MAX_STEPS, "KV_REPORT_MAX_STEPS, a run's decode steps"},
    };
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        if (sizes[k].v >= 1 && sizes[k].v <= sizes[k].cap) continue;
        return kv_error_set(err, KV_ERR_INPUT,
                            "%s: %s: expected 1..%" PRId64 " (%s; kv_limits.h), found %" PRId64,
                            what != NULL ? what : "the scenario", sizes[k].field, sizes[k].cap,
                            sizes[k].why, sizes[k].v);
    }
    return KV_OK;
}

KvStatus kv_limits_check_report(int64_t n_runs, int64_t steps, int64_t batch, int64_t vocab,
                                int64_t topk, int64_t n_probes, int64_t prompt_len,
                                const char *what, KvError *err) {
    const char *w = what != NULL ? what : "the report";
    KvStatus st = kv_limits_check_scenario(batch, prompt_len, steps, w, err);
    if (st != KV_OK) return st;
    if (n_runs < 0 || n_runs > KV_REPORT_MAX_RUNS || vocab < 1 || vocab > KV_REPORT_MAX_VOCAB ||
        topk < 0 || topk > KV_REPORT_MAX_TOPK || topk > vocab || n_probes < 0 ||
        n_probes > KV_REPORT_MAX_PROBES) {
        return kv_error_set(err, KV_ERR_INPUT,
                            "%s: expected 0..%" PRId64 " runs, vocab 1..%" PRId64
                            ", top-k 0..%" PRId64 " and 0..%" PRId64
                            " probes (kv_limits.h), found %" PRId64 ", %" PRId64 ", %" PRId64
                            " and %" PRId64,
                            w, KV_REPORT_MAX_RUNS, KV_REPORT_MAX_VOCAB, KV_REPORT_MAX_TOPK,
                            KV_REPORT_MAX_PROBES, n_runs, vocab, topk, n_probes);
    }
    /* one run as the reader holds it (h5_read_cost): the sizes are within
     * the table, so every product fits in 64 bits */
    KvRun r;
    kv_run_init(&r);
    r.steps = steps;
    r.batch = batch;
    r.vocab = vocab;
    r.topk = (int32_t)topk;
    r.n_probes = n_probes;
    r.prompt_len = prompt_len;
    const KvReport one = {.runs = &r, .n_runs = 1};
    uint64_t per_run = 0;
    (void)h5_read_cost(&one, &per_run);
    per_run += (uint64_t)steps * sizeof(double) /* fp64_rel_err, on a reference run */ +
               (uint64_t)KV_REPORT_MAX_COMPARISONS_PER_RUN *
                   (sizeof(CmpRow) + sizeof(KvComparison));
    if (n_runs == 0 || per_run <= KV_REPORT_MAX_READ_BYTES / (uint64_t)n_runs) return KV_OK;
    return kv_error_set(err, KV_ERR_INPUT,
                        "%s: a report of %" PRId64 " runs of %" PRId64 " steps x %" PRId64
                        " rows x %" PRId64 " %s needs ~%.3g GiB to hold, above the %.3g GiB its "
                        "reader takes (KV_REPORT_MAX_READ_BYTES; the gate holds it all while it "
                        "runs)",
                        w, n_runs, steps, batch, topk > 0 ? topk : vocab,
                        topk > 0 ? "top-k logits" : "logits",
                        (double)per_run * (double)n_runs / (double)((uint64_t)1 << 30),
                        (double)KV_REPORT_MAX_READ_BYTES / (double)((uint64_t)1 << 30));
}

/* ---- what the writer relies on -------------------------------------------- */

/* A string field is writable when it has a terminator inside its size. */
static KvStatus check_field(ReportCtx *c, const char *s, size_t width, const char *what, int64_t i,
                            const char *field) {
    if (strnlen(s, width) < width) return KV_OK;
    if (i < 0) {
        return h5_report_fail(
            c, KV_ERR_INPUT,
            "%s: expected a NUL-terminated string of at most %zu bytes, found %zu "
            "bytes without a terminator",
            field, width - 1, width);
    }
    return h5_report_fail(c, KV_ERR_INPUT,
                          "%s[%" PRId64 "].%s: expected a NUL-terminated string of at most %zu "
                          "bytes, found %zu bytes without a terminator",
                          what, i, field, width - 1, width);
}

#define CHECK_FIELD(obj, field, what, i)                                                           \
    do {                                                                                           \
        KvStatus cs_ = check_field(c, (obj)->field, sizeof((obj)->field), what, i, #field);        \
        if (cs_ != KV_OK) return cs_;                                                              \
    } while (0)

/* The array a run's dataset d holds (its pointer in KvRun). */
static const void *run_array(const KvRun *r, const RunDataset *d) {
    const void *p;
    memcpy(&p, (const char *)r + d->offset, sizeof p);
    return p;
}

/* Elements of shape s for run r, from its counts n (h5_run_counts). */
static size_t run_shape_count(const KvRun *r, const RunCounts *n, RunShape s) {
    switch (s) {
    case SHAPE_PROMPT: return n->prompt;
    case SHAPE_ROWS: return n->rows;
    case SHAPE_LOGITS: return n->logits;
    case SHAPE_TOPK: return n->rows * (size_t)r->topk; /* topk <= vocab: at most n->logits */
    case SHAPE_NAMES: return (size_t)r->n_probes;
    case SHAPE_PROBES: return n->probes;
    case SHAPE_STEPS: return (size_t)r->steps;
    case SHAPE_SUFFIX: return (size_t)r->batch * (size_t)r->suffix_len; /* checked: validate */
    }
    return 0;
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
        return h5_report_fail(c, KV_ERR_INPUT,
                              "report: expected counts >= 0 with their arrays, found %" PRId64
                              " tolerances, %" PRId64 " runs, %" PRId64 " comparisons",
                              rep->n_tolerances, rep->n_runs, rep->n_comparisons);
    }
    /* the reader's caps on the tables (kv_limits.h) */
    if (rep->n_runs > KV_REPORT_MAX_RUNS || rep->n_tolerances > KV_REPORT_MAX_TOLERANCES ||
        rep->n_comparisons > KV_REPORT_MAX_COMPARISONS_PER_RUN * rep->n_runs) {
        return h5_report_fail(c, KV_ERR_INPUT,
                              "report: expected at most %" PRId64 " runs, %" PRId64
                              " tolerances and %d comparisons per run (kv_limits.h), found %" PRId64
                              ", %" PRId64 " and %" PRId64,
                              KV_REPORT_MAX_RUNS, KV_REPORT_MAX_TOLERANCES,
                              KV_REPORT_MAX_COMPARISONS_PER_RUN, rep->n_runs, rep->n_tolerances,
                              rep->n_comparisons);
    }
    for (int64_t t = 0; t < rep->n_tolerances; t++) {
        CHECK_FIELD(&rep->tolerances[t], name, "tolerances", t);
        CHECK_FIELD(&rep->tolerances[t], reason, "tolerances", t);
    }
    for (int64_t i = 0; i < rep->n_runs; i++) {
        const KvRun *r = &rep->runs[i];
        /* every string attribute of the table, so that one added there (the
         * capture's attn_impl, first_recompile, ...) is checked too */
        for (size_t a = 0; a < H5_RUN_ATTRS.n; a++) {
            const AttrField *f = &H5_RUN_ATTRS.fields[a];
            if (f->kind != FIELD_STR) continue;
            const KvStatus cs = check_field(c, (const char *)r + f->offset, f->width, "runs", i,
                                            f->name);
            if (cs != KV_OK) return cs;
        }
        RunCounts n;
        if (!h5_run_counts(r, &n)) {
            return h5_report_fail(c, KV_ERR_INPUT,
                                  "runs[%" PRId64 "]: expected sizes >= 0 whose products fit in "
                                  "memory, found steps %" PRId64 ", batch %" PRId64
                                  ", vocab %" PRId64 ", prompt_len %" PRId64 ", n_probes %" PRId64,
                                  i, r->steps, r->batch, r->vocab, r->prompt_len, r->n_probes);
        }
        /* every integer attribute in the range the reader accepts (the
         * sizes first: the caps of the others depend on them) */
        for (size_t a = 0; a < H5_RUN_ATTRS.n; a++) {
            const AttrField *f = &H5_RUN_ATTRS.fields[a];
            int64_t v = 0, lo = 0, hi = 0;
            if (!h5_attr_field_value(f, r, &v) || !h5_attr_field_range(f, r, &lo, &hi) ||
                !h5_attr_is_set(f, r) || (v >= lo && v <= hi)) {
                continue;
            }
            return h5_report_fail(c, KV_ERR_INPUT,
                                  "runs[%" PRId64 "].%s: expected %" PRId64 "..%" PRId64
                                  " (what the reader accepts; kv_limits.h), found %" PRId64,
                                  i, f->name, lo, hi, v);
        }
        /* a prefix-reuse script is whole or absent: its suffix held by the
         * run, the switch and the saved prefix inside its sizes */
        if (!h5_run_script_ok(r)) {
            return h5_report_fail(c, KV_ERR_INPUT,
                                  "runs[%" PRId64 "]: a prefix-reuse script expects 1 <= "
                                  "save_after < prompt_len (%" PRId64 "), 1 <= switch_step < "
                                  "steps (%" PRId64 ") and a suffix, a context shift "
                                  "shift_step >= 1, shift_drop >= 1, no switch and keep + drop "
                                  "<= prompt_len + shift_step - 1; found %" PRId64 ", %" PRId64
                                  ", %" PRId64 " tokens%s, shift %" PRId64 "/%" PRId64 "/%" PRId64,
                                  i, r->prompt_len, r->steps, r->save_after, r->switch_step,
                                  r->suffix_len, r->suffix == NULL ? ", none held" : "",
                                  r->shift_step, r->shift_keep, r->shift_drop);
        }
        if (r->skipped) continue;
        char why[160];
        if (!h5_prompt_text_ok(r, why, sizeof why)) {
            return h5_report_fail(c, KV_ERR_INPUT, "runs[%" PRId64 "].%s", i, why);
        }
        for (size_t a = 0; a < H5_RUN_DATASETS.n; a++) {
            const RunDataset *d = &H5_RUN_DATASETS.sets[a];
            const size_t count = h5_run_holds(r, d) ? run_shape_count(r, &n, d->shape) : 0;
            if (count > 0 && run_array(r, d) == NULL) {
                return h5_report_fail(c, KV_ERR_INPUT,
                                      "runs[%" PRId64 "].%s: expected %zu elements, found NULL", i,
                                      d->name, count);
            }
        }
        for (int64_t p = 0; p < r->n_probes; p++) {
            if (strnlen(r->probe_names[p], KV_NAME_LEN) == KV_NAME_LEN) {
                return h5_report_fail(c, KV_ERR_INPUT,
                                      "runs[%" PRId64 "].probe_names[%" PRId64
                                      "]: expected a NUL-terminated string of at most %d bytes, "
                                      "found %d bytes without a terminator",
                                      i, p, KV_NAME_LEN - 1, KV_NAME_LEN);
            }
        }
    }
    /* what the reader checks in the arrays (h5_run_values_ok), skipped runs
     * included (their reason), once every array is known to be there */
    for (int64_t i = 0; i < rep->n_runs; i++) {
        char why[320];
        if (!h5_run_values_ok(&rep->runs[i], why, sizeof why)) {
            return h5_report_fail(c, KV_ERR_INPUT, "runs[%" PRId64 "].%s", i, why);
        }
    }
    /* a report its reader could not hold, whatever the file's size */
    uint64_t cost = 0;
    if (!h5_read_cost(rep, &cost) || cost > KV_REPORT_MAX_READ_BYTES) {
        return h5_report_fail(c, KV_ERR_INPUT,
                              "report: expected at most %" PRIu64
                              " bytes for a reader to hold (KV_REPORT_MAX_READ_BYTES), found %s",
                              KV_REPORT_MAX_READ_BYTES,
                              cost > KV_REPORT_MAX_READ_BYTES ? "more" : "a size beyond 64 bits");
    }
    for (int64_t k = 0; k < rep->n_comparisons; k++) {
        const KvComparison *cmp = &rep->comparisons[k];
        CHECK_FIELD(cmp, message, "comparisons", k);
        if ((int)cmp->kind < KV_CMP_REFERENCE || (int)cmp->kind > KV_CMP_LAST ||
            (int)cmp->verdict < KV_VERDICT_PASS || (int)cmp->verdict > KV_VERDICT_SKIP ||
            cmp->run_a < 0 || cmp->run_a >= rep->n_runs || cmp->run_b < 0 ||
            cmp->run_b >= rep->n_runs) {
            return h5_report_fail(
                c, KV_ERR_INPUT,
                "comparisons[%" PRId64 "]: expected kind 0..%d, verdict 0..2 and "
                "runs 0..%" PRId64 ", found kind %d, verdict %d, runs %" PRId64 " and %" PRId64,
                k, (int)KV_CMP_LAST, rep->n_runs - 1, (int)cmp->kind, (int)cmp->verdict, cmp->run_a, cmp->run_b);
        }
    }
    return KV_OK;
}

/* ---- attributes, datasets and tables -------------------------------------- */

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
        goto cleanup;
    }
    attr = H5Acreate2(obj, name, file_type, space, H5P_DEFAULT, H5P_DEFAULT);
    if (attr < 0) {
        st = h5_fail(c, KV_ERR_INTERNAL, "%s: attribute %s: cannot create", objpath, name);
        goto cleanup;
    }
    if (H5Awrite(attr, mem_type, value) < 0) {
        st = h5_fail(c, KV_ERR_INTERNAL, "%s: attribute %s: cannot write", objpath, name);
        goto cleanup;
    }
cleanup:
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
        st = h5_report_fail(c, KV_ERR_INTERNAL, "out of memory");
        goto cleanup;
    }
    field_copy(buf, value, width);
    st = h5_string_type(width, &type, c);
    if (st != KV_OK) goto cleanup;
    st = h5w_attr(obj, objpath, name, type, type, buf, c);
cleanup:
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

/* The attributes of table t from the struct at base, in table order. */
static KvStatus h5w_attr_fields(hid_t obj, const char *objpath, const AttrTable *t,
                                const void *base, ReportCtx *c) {
    KvStatus st = KV_OK;
    for (size_t i = 0; i < t->n && st == KV_OK; i++) {
        const AttrField *f = &t->fields[i];
        const char *p = (const char *)base + f->offset;
        if (!h5_attr_is_set(f, base)) continue;
        switch (f->kind) {
        case FIELD_STR: st = h5w_attr_string(obj, objpath, f->name, p, f->width, c); break;
        case FIELD_I32: st = h5w_attr_i32(obj, objpath, f->name, *(const int32_t *)p, c); break;
        case FIELD_I64: st = h5w_attr_i64(obj, objpath, f->name, *(const int64_t *)p, c); break;
        case FIELD_U64: st = h5w_attr_u64(obj, objpath, f->name, *(const uint64_t *)p, c); break;
        case FIELD_BOOL: {
            const uint8_t v = *(const bool *)p ? 1 : 0;
            st = h5w_attr(obj, objpath, f->name, H5T_STD_U8LE, H5T_NATIVE_UINT8, &v, c);
            break;
        }
        case FIELD_F64:
            st = h5w_attr(obj, objpath, f->name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, p, c);
            break;
        case FIELD_VERSION: st = h5w_attr_i32(obj, objpath, f->name, (int32_t)f->lo, c); break;
        case FIELD_HEX: {
            char hex[KV_H5_HEX_LEN];
            snprintf(hex, sizeof hex, "%016" PRIx64, *(const uint64_t *)p);
            st = h5w_attr_string(obj, objpath, f->name, hex, sizeof hex, c);
            break;
        }
        }
    }
    return st;
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
    if (!h5_shape_count(rank, dims, &count)) {
        st = h5_report_fail(c, KV_ERR_INTERNAL, "%s/%s: shape overflows", objpath, name);
        goto cleanup;
    }
    const size_t elem = H5Tget_size(mem_type);
    if (elem == 0) {
        st = h5_fail(c, KV_ERR_INTERNAL, "%s/%s: cannot size the memory type", objpath, name);
        goto cleanup;
    }
    fill = calloc(1, elem);
    if (fill == NULL) {
        st = h5_report_fail(c, KV_ERR_INTERNAL, "out of memory");
        goto cleanup;
    }
    dcpl = H5Pcreate(H5P_DATASET_CREATE);
    if (dcpl < 0 || H5Pset_obj_track_times(dcpl, 0) < 0 ||
        H5Pset_fill_value(dcpl, mem_type, fill) < 0) {
        st = h5_fail(c, KV_ERR_INTERNAL, "%s/%s: cannot set up the creation properties", objpath,
                     name);
        goto cleanup;
    }
    if (chunk_steps && count > 0) {
        hsize_t chunk[H5S_MAX_RANK];
        chunk[0] = 1;
        for (int k = 1; k < rank; k++) chunk[k] = dims[k];
        if (H5Pset_chunk(dcpl, rank, chunk) < 0 || H5Pset_shuffle(dcpl) < 0 ||
            H5Pset_deflate(dcpl, KV_H5_DEFLATE_LEVEL) < 0) {
            st = h5_fail(c, KV_ERR_INTERNAL, "%s/%s: cannot set chunking and compression", objpath,
                         name);
            goto cleanup;
        }
    }
    space = H5Screate_simple(rank, dims, NULL);
    if (space < 0) {
        st = h5_fail(c, KV_ERR_INTERNAL, "%s/%s: cannot create a dataspace", objpath, name);
        goto cleanup;
    }
    dset = H5Dcreate2(group, name, file_type, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    if (dset < 0) {
        st = h5_fail(c, KV_ERR_INTERNAL, "%s/%s: cannot create", objpath, name);
        goto cleanup;
    }
    if (count > 0 && H5Dwrite(dset, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0) {
        st = h5_fail(c, KV_ERR_INTERNAL, "%s/%s: cannot write", objpath, name);
        goto cleanup;
    }
cleanup:
    h5_close(H5Dclose, dset, name, &st, c);
    h5_close(H5Sclose, space, name, &st, c);
    h5_close(H5Pclose, dcpl, name, &st, c);
    free(fill);
    return st;
}

/* A compound table from staged rows (n may be 0). */
static KvStatus h5w_table(hid_t file, const ColumnTable *t, const void *rows, int64_t n,
                          ReportCtx *c) {
    KvStatus st = KV_OK;
    hid_t mem = H5I_INVALID_HID, ftype = H5I_INVALID_HID;
    char objpath[80];
    snprintf(objpath, sizeof objpath, "/%s", t->name);
    st = h5_compound_type(t, false, &mem, c);
    if (st != KV_OK) goto cleanup;
    st = h5_compound_type(t, true, &ftype, c);
    if (st != KV_OK) goto cleanup;
    const hsize_t dims[1] = {(hsize_t)n};
    st = h5w_dataset(file, "", t->name, ftype, mem, 1, dims, rows, false, c);
cleanup:
    h5_close(H5Tclose, ftype, objpath, &st, c);
    h5_close(H5Tclose, mem, objpath, &st, c);
    return st;
}

/* The compound table t of the n report structs at src (KvTolerance,
 * KvComparison), each staged in a zeroed row column by column. */
static KvStatus h5w_table_of(hid_t file, const ColumnTable *t, const void *src, int64_t n,
                             ReportCtx *c) {
    char *rows = calloc(n > 0 ? (size_t)n : 1, t->row_size);
    if (rows == NULL) return h5_report_fail(c, KV_ERR_INTERNAL, "out of memory");
    for (int64_t k = 0; k < n; k++) {
        const char *s = (const char *)src + (size_t)k * t->rep_size;
        char *d = rows + (size_t)k * t->row_size;
        for (size_t i = 0; i < t->n_columns; i++) {
            const Column *m = &t->columns[i];
            if (m->kind == COL_STR) {
                field_copy(d + m->offset, s + m->rep_offset, m->width);
            } else {
                memcpy(d + m->offset, s + m->rep_offset, m->width);
            }
        }
    }
    KvStatus st = h5w_table(file, t, rows, n, c);
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
        return h5_report_fail(c, KV_ERR_INTERNAL, "out of memory");
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
    KvStatus st = h5w_table(file, &H5_SUMMARY, rows, rep->n_runs, c);
    free(sum);
    free(rows);
    return st;
}

/* ---- runs ------------------------------------------------------------------ */

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
    if (keys == NULL) return h5_report_fail(c, KV_ERR_INTERNAL, "out of memory");
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

/* n fixed-length strings of width bytes at src, each copied into a zeroed
 * field, as the dataset name of shape dims. */
static KvStatus h5w_strings(hid_t g, const char *objpath, const char *name, int rank,
                            const hsize_t *dims, const char *src, size_t width, size_t n,
                            ReportCtx *c) {
    KvStatus st = KV_OK;
    hid_t type = H5I_INVALID_HID;
    char *buf = calloc(n > 0 ? n : 1, width);
    if (buf == NULL) {
        st = h5_report_fail(c, KV_ERR_INTERNAL, "out of memory");
        goto cleanup;
    }
    for (size_t k = 0; k < n; k++) field_copy(buf + k * width, src + k * width, width);
    st = h5_string_type(width, &type, c);
    if (st != KV_OK) goto cleanup;
    st = h5w_dataset(g, objpath, name, type, type, rank, dims, buf, false, c);
cleanup:
    h5_close(H5Tclose, type, "string type", &st, c);
    free(buf);
    return st;
}

/* One dataset of run r (h5_run_holds), or (twin >= 0, a dataset that may
 * be shared) a hard link to the identical one of run `twin`. */
static KvStatus h5w_run_dataset(hid_t g, const char *objpath, const KvRun *r, const RunDataset *d,
                                int64_t twin, ReportCtx *c) {
    if (d->shared && twin >= 0) {
        char target[64];
        snprintf(target, sizeof target, "/runs/%04" PRId64 "/%s", twin, d->name);
        if (H5Lcreate_hard(g, target, g, d->name, H5P_DEFAULT, H5P_DEFAULT) < 0) {
            return h5_fail(c, KV_ERR_INTERNAL, "%s/%s: cannot link to %s", objpath, d->name,
                           target);
        }
        return KV_OK;
    }
    hsize_t dims[3];
    const int rank = h5_run_shape(r, d->shape, dims);
    const void *data = run_array(r, d);
    hid_t file_type = H5I_INVALID_HID, mem_type = H5I_INVALID_HID;
    switch (d->kind) {
    case DATA_I32:
        file_type = H5T_STD_I32LE;
        mem_type = H5T_NATIVE_INT32;
        break;
    case DATA_U8:
        file_type = H5T_STD_U8LE;
        mem_type = H5T_NATIVE_UINT8;
        break;
    case DATA_U64:
        file_type = H5T_STD_U64LE;
        mem_type = H5T_NATIVE_UINT64;
        break;
    case DATA_F32:
        file_type = H5T_IEEE_F32LE;
        mem_type = H5T_NATIVE_FLOAT;
        break;
    case DATA_F64:
        file_type = H5T_IEEE_F64LE;
        mem_type = H5T_NATIVE_DOUBLE;
        break;
    case DATA_NAME: /* (n_probes), which report_validate bounded */
        return h5w_strings(g, objpath, d->name, rank, dims, data, d->elem, (size_t)dims[0], c);
    }
    return h5w_dataset(g, objpath, d->name, file_type, mem_type, rank, dims, data, d->chunked, c);
}

/* A run's row texts (report_validate checked them) as the (batch,)
 * variable-length UTF-8 dataset prompt_text. */
static KvStatus h5w_prompt_text(hid_t g, const char *objpath, const KvRun *r, ReportCtx *c) {
    KvStatus st = KV_OK;
    hid_t type = H5Tcopy(H5T_C_S1);
    if (type < 0 || H5Tset_size(type, H5T_VARIABLE) < 0 || H5Tset_cset(type, H5T_CSET_UTF8) < 0) {
        st = h5_fail(c, KV_ERR_INTERNAL, "%s/prompt_text: cannot make a string type", objpath);
    } else {
        const hsize_t dims[1] = {(hsize_t)r->batch};
        st = h5w_dataset(g, objpath, "prompt_text", type, type, 1, dims, r->prompt_text, false, c);
    }
    h5_close(H5Tclose, type, "string type", &st, c);
    return st;
}

/* share: identical logits of one unit are one dataset (h5w_logits_twins);
 * otherwise every run stores its own. */
static KvStatus h5w_runs(hid_t file, hid_t gcpl, const KvReport *rep, bool share, ReportCtx *c) {
    KvStatus st = KV_OK;
    hid_t runs = H5I_INVALID_HID, g = H5I_INVALID_HID, runs_gcpl = H5I_INVALID_HID;
    int64_t *twin = calloc(rep->n_runs > 0 ? (size_t)rep->n_runs : 1, sizeof *twin);
    if (twin == NULL) return h5_report_fail(c, KV_ERR_INTERNAL, "out of memory");
    if (share) {
        st = h5w_logits_twins(rep, twin, c);
        if (st != KV_OK) goto cleanup;
    } else {
        for (int64_t i = 0; i < rep->n_runs; i++) twin[i] = -1;
    }
    runs_gcpl = H5Pcopy(gcpl);
    if (runs_gcpl < 0 ||
        (rep->n_runs > KV_H5_RUNS_DENSE_ABOVE &&
         H5Pset_link_phase_change(runs_gcpl, 8, 6) < 0)) { /* HDF5's defaults */
        st = h5_fail(c, KV_ERR_INTERNAL, "/runs: cannot set up its properties");
        goto cleanup;
    }
    runs = H5Gcreate2(file, "runs", H5P_DEFAULT, runs_gcpl, H5P_DEFAULT);
    if (runs < 0) {
        st = h5_fail(c, KV_ERR_INTERNAL, "/runs: cannot create");
        goto cleanup;
    }
    for (int64_t i = 0; i < rep->n_runs; i++) {
        char name[32], objpath[48];
        h5_run_group_name(i, name, sizeof name);
        snprintf(objpath, sizeof objpath, "/runs/%s", name);
        g = H5Gcreate2(runs, name, H5P_DEFAULT, gcpl, H5P_DEFAULT);
        if (g < 0) {
            st = h5_fail(c, KV_ERR_INTERNAL, "%s: cannot create", objpath);
            goto cleanup;
        }
        /* a skipped run holds no datasets (h5_run_holds) */
        st = h5w_attr_fields(g, objpath, &H5_RUN_ATTRS, &rep->runs[i], c);
        for (size_t k = 0; k < H5_RUN_DATASETS.n && st == KV_OK; k++) {
            const RunDataset *d = &H5_RUN_DATASETS.sets[k];
            if (h5_run_holds(&rep->runs[i], d)) {
                st = h5w_run_dataset(g, objpath, &rep->runs[i], d, twin[i], c);
            }
        }
        if (st == KV_OK && !rep->runs[i].skipped && rep->runs[i].prompt_text != NULL) {
            st = h5w_prompt_text(g, objpath, &rep->runs[i], c);
        }
        h5_close(H5Gclose, g, objpath, &st, c);
        g = H5I_INVALID_HID;
        if (st != KV_OK) goto cleanup;
    }
cleanup:
    h5_close(H5Gclose, g, "run group", &st, c);
    h5_close(H5Gclose, runs, "/runs", &st, c);
    h5_close(H5Pclose, runs_gcpl, "/runs properties", &st, c);
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
        return h5_report_fail(c, KV_ERR_INTERNAL,
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
        return h5_report_fail(
            c, KV_ERR_INTERNAL,
            "expected an end-of-file address within the %zu bytes in memory, found "
            "%" PRIu64 " (base %" PRIu64 ")",
            ci->size, eof, base);
    }
    *len = (size_t)eof;
    return KV_OK;
}

/* Builds the file of rep in memory into *img (the caller frees img->buf)
 * and its length into *len; share as in h5w_runs. */
static KvStatus h5w_build(const KvReport *rep, const char *path, bool share, CoreImage *img,
                          size_t *len, ReportCtx *c) {
    KvStatus st = KV_OK;
    hid_t fcpl = H5I_INVALID_HID, fapl = H5I_INVALID_HID, gcpl = H5I_INVALID_HID,
          file = H5I_INVALID_HID;
    char *label = NULL;
    const H5FD_file_image_callbacks_t callbacks = {
        .image_malloc = core_image_malloc,
        .image_memcpy = core_image_memcpy,
        .image_realloc = core_image_realloc,
        .image_free = core_image_free,
        .udata_copy = core_image_udata_copy,
        .udata_free = core_image_udata_free,
        .udata = img,
    };
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
        st = h5_fail(c, KV_ERR_INTERNAL, "cannot set up the file properties");
        goto cleanup;
    }
    /* With no backing store the name is a label, but the library first
     * tries to open it as an existing file, which the core driver would
     * read into memory: "<path>/" + a name cannot exist while path is a
     * regular file or absent (kv_report_check_writable above). */
    label = malloc(strlen(path) + sizeof KV_H5_MEMORY_LABEL);
    if (label == NULL) {
        st = h5_report_fail(c, KV_ERR_INTERNAL, "out of memory");
        goto cleanup;
    }
    snprintf(label, strlen(path) + sizeof KV_H5_MEMORY_LABEL, "%s" KV_H5_MEMORY_LABEL, path);
    file = H5Fcreate(label, H5F_ACC_TRUNC, fcpl, fapl);
    if (file < 0) {
        st = h5_fail(c, KV_ERR_INTERNAL, "cannot create the file in memory");
        goto cleanup;
    }
    if ((st = h5w_attr_fields(file, "/", &H5_ROOT_ATTRS, rep, c)) != KV_OK ||
        (st = h5w_table_of(file, &H5_TOLERANCES, rep->tolerances, rep->n_tolerances, c)) !=
            KV_OK ||
        (st = h5w_runs(file, gcpl, rep, share, c)) != KV_OK ||
        (st = h5w_table_of(file, &H5_COMPARISONS, rep->comparisons, rep->n_comparisons, c)) !=
            KV_OK ||
        (st = h5w_summary(file, rep, c)) != KV_OK) {
        goto cleanup;
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
        st = h5_fail(c, KV_ERR_INTERNAL, "cannot finish the file in memory");
        goto cleanup;
    }
    st = core_image_length(img, len, c);
cleanup:
    h5_close(H5Fclose, file, "file", &st, c);
    h5_close(H5Pclose, gcpl, "group properties", &st, c);
    h5_close(H5Pclose, fapl, "file access properties", &st, c);
    h5_close(H5Pclose, fcpl, "file creation properties", &st, c);
    free(label);
    return st;
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
    uint64_t cost = 0;
    (void)h5_read_cost(rep, &cost); /* report_validate: no overflow */

    QuietErrors quiet = {.saved = false};
    CoreImage img = {.buf = NULL, .size = 0, .closed = false};
    size_t image_len = 0;
    st = h5_quiet_begin(&quiet, &c);
    if (st != KV_OK) goto cleanup;
    if (H5Zfilter_avail(H5Z_FILTER_DEFLATE) <= 0 || H5Zfilter_avail(H5Z_FILTER_SHUFFLE) <= 0) {
        st = h5_fail(&c, KV_ERR_INTERNAL,
                     "expected an HDF5 library with the deflate and shuffle filters, found one "
                     "without");
        goto cleanup;
    }
    st = h5w_build(rep, path, true, &img, &image_len, &c);
    /* Shared logits are copied into every run that links them, so a small
     * file of many links asks the reader for more than its size allows
     * (kv_limits_read_budget): then every run stores its own logits, which
     * no reader budget refuses (each dataset within deflate's ratio). Only
     * such extreme reports change; the others keep their bytes. */
    if (st == KV_OK && cost > kv_limits_read_budget(image_len)) {
        free(img.buf);
        img = (CoreImage){.buf = NULL, .size = 0, .closed = false};
        st = h5w_build(rep, path, false, &img, &image_len, &c);
        if (st == KV_OK && cost > kv_limits_read_budget(image_len)) {
            st = h5_report_fail(&c, KV_ERR_INPUT,
                                "report: expected at most %" PRIu64
                                " bytes for a reader to hold in a %zu-byte file (kv_limits.h), "
                                "found %" PRIu64,
                                kv_limits_read_budget(image_len), image_len, cost);
        }
    }
    if (st == KV_OK) st = kv_report_file_publish(path, img.buf, image_len, err);
cleanup:
    h5_quiet_end(&quiet, &st, &c);
    free(img.buf);
    return st;
}
