/* bisect_h5.c: writing the /bisect group into a copy of a report
 * (bisect_h5.h). */
#include "bisect_h5.h"

#include <errno.h>
#include <fcntl.h>
#include <hdf5.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Copies src to dst byte for byte. */
static KvStatus bisect_copy_file(const char *src, const char *dst, KvError *err) {
    KvStatus st = KV_OK;
    char buf[1 << 16];
    FILE *in = fopen(src, "rb");
    FILE *out = NULL;
    if (in == NULL) return kv_error_set(err, KV_ERR_INPUT, "%s: cannot open: %s", src, strerror(errno));
    out = fopen(dst, "wb");
    if (out == NULL) {
        st = kv_error_set(err, KV_ERR_INPUT, "%s: cannot create: %s", dst, strerror(errno));
        goto cleanup;
    }
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, in)) > 0) {
        if (fwrite(buf, 1, n, out) != n) {
            st = kv_error_set(err, KV_ERR_INPUT, "%s: cannot write: %s", dst, strerror(errno));
            goto cleanup;
        }
    }
    if (ferror(in)) st = kv_error_set(err, KV_ERR_INPUT, "%s: cannot read: %s", src, strerror(errno));
cleanup:
    if (out != NULL && fclose(out) != 0 && st == KV_OK) {
        st = kv_error_set(err, KV_ERR_INPUT, "%s: cannot write: %s", dst, strerror(errno));
    }
    fclose(in);
    return st;
}

static herr_t bisect_attr_string(hid_t obj, const char *name, const char *value) {
    const size_t len = strlen(value) + 1;
    hid_t t = H5Tcopy(H5T_C_S1), sp = H5Screate(H5S_SCALAR), a = H5I_INVALID_HID;
    herr_t rc = -1;
    if (t >= 0 && sp >= 0 && H5Tset_size(t, len) >= 0 && H5Tset_strpad(t, H5T_STR_NULLTERM) >= 0 &&
        H5Tset_cset(t, H5T_CSET_UTF8) >= 0) {
        a = H5Acreate2(obj, name, t, sp, H5P_DEFAULT, H5P_DEFAULT);
        if (a >= 0) rc = H5Awrite(a, t, value);
    }
    if (a >= 0) H5Aclose(a);
    if (sp >= 0) H5Sclose(sp);
    if (t >= 0) H5Tclose(t);
    return rc;
}

static herr_t bisect_attr_i64(hid_t obj, const char *name, int64_t v) {
    hid_t sp = H5Screate(H5S_SCALAR), a = H5I_INVALID_HID;
    herr_t rc = -1;
    if (sp >= 0) a = H5Acreate2(obj, name, H5T_STD_I64LE, sp, H5P_DEFAULT, H5P_DEFAULT);
    if (a >= 0) rc = H5Awrite(a, H5T_NATIVE_INT64, &v);
    if (a >= 0) H5Aclose(a);
    if (sp >= 0) H5Sclose(sp);
    return rc;
}

/* Object-creation settings matching the report writer's (docs/SCHEMA.md,
 * Reproducibility): no object records a time, so the same dumps give the
 * same bytes, and links and attributes stay compact in the object header. */
#define BISECT_MAX_COMPACT 65535

static hid_t bisect_gcpl(void) {
    hid_t p = H5Pcreate(H5P_GROUP_CREATE);
    if (p >= 0 && (H5Pset_obj_track_times(p, 0) < 0 ||
                   H5Pset_link_phase_change(p, BISECT_MAX_COMPACT, BISECT_MAX_COMPACT) < 0 ||
                   H5Pset_attr_phase_change(p, BISECT_MAX_COMPACT, BISECT_MAX_COMPACT) < 0)) {
        H5Pclose(p);
        p = H5I_INVALID_HID;
    }
    return p;
}

/* data: (batch, len) float32 as dataset `name` of group g. */
static herr_t bisect_dataset(hid_t g, const char *name, const float *data, int64_t batch,
                             int64_t len) {
    const hsize_t dims[2] = {(hsize_t)batch, (hsize_t)len};
    const float zero = 0.0f;
    hid_t sp = H5Screate_simple(2, dims, NULL), dcpl = H5Pcreate(H5P_DATASET_CREATE);
    hid_t d = H5I_INVALID_HID;
    herr_t rc = -1;
    if (sp >= 0 && dcpl >= 0 && H5Pset_obj_track_times(dcpl, 0) >= 0 &&
        H5Pset_fill_value(dcpl, H5T_NATIVE_FLOAT, &zero) >= 0) {
        d = H5Dcreate2(g, name, H5T_IEEE_F32LE, sp, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    }
    if (d >= 0) rc = batch * len > 0 ? H5Dwrite(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) : 0;
    if (d >= 0) H5Dclose(d);
    if (dcpl >= 0) H5Pclose(dcpl);
    if (sp >= 0) H5Sclose(sp);
    return rc;
}

static herr_t bisect_write_group(hid_t file, const KvBisectRecord *rec) {
    if (H5Lexists(file, "bisect", H5P_DEFAULT) > 0 && H5Ldelete(file, "bisect", H5P_DEFAULT) < 0) {
        return -1;
    }
    hid_t gcpl = bisect_gcpl();
    if (gcpl < 0) return -1;
    hid_t g = H5Gcreate2(file, "bisect", H5P_DEFAULT, gcpl, H5P_DEFAULT);
    herr_t rc = g >= 0 ? 0 : -1;
    if (rc >= 0 &&
        (bisect_attr_string(g, "run_a", rec->label_a) < 0 ||
         bisect_attr_string(g, "run_b", rec->label_b) < 0 ||
         bisect_attr_i64(g, "step", rec->step) < 0 || bisect_attr_i64(g, "row", rec->row) < 0 ||
         bisect_attr_i64(g, "probe", rec->probe) < 0 ||
         bisect_attr_string(g, "probe_name", rec->probe_name) < 0 ||
         bisect_attr_i64(g, "hash_step", rec->hash_step) < 0 ||
         bisect_attr_i64(g, "hash_row", rec->hash_row) < 0 ||
         bisect_attr_i64(g, "hash_probe", rec->hash_probe) < 0 ||
         bisect_attr_string(g, "hash_probe_name", rec->hash_probe_name) < 0)) {
        rc = -1;
    }
    for (int i = 0; rc >= 0 && i < rec->n_tensors; i++) {
        const KvBisectTensorOut *t = &rec->tensors[i];
        /* Named by index, as /runs/NNNN: a probe name is recorded text and
         * may hold '/', or repeat. */
        char gname[32];
        snprintf(gname, sizeof gname, "probe_%04" PRId64, t->index);
        hid_t tg = H5Gcreate2(g, gname, H5P_DEFAULT, gcpl, H5P_DEFAULT);
        if (tg < 0 || bisect_attr_i64(tg, "index", t->index) < 0 ||
            bisect_attr_string(tg, "name", t->name) < 0 ||
            bisect_attr_string(tg, "role", t->role) < 0 ||
            bisect_dataset(tg, "a", t->a, t->batch, t->len_a) < 0 ||
            bisect_dataset(tg, "b", t->b, t->batch, t->len_b) < 0) {
            rc = -1;
        }
        if (tg >= 0) H5Gclose(tg);
    }
    if (g >= 0) H5Gclose(g);
    H5Pclose(gcpl);
    return rc;
}

/* Each tensor's group name comes from its index, so indices must be
 * distinct and non-negative. */
static KvStatus bisect_check_record(const char *dst, const KvBisectRecord *rec, KvError *err) {
    for (int i = 0; i < rec->n_tensors; i++) {
        const int64_t idx = rec->tensors[i].index;
        if (idx < 0) {
            return kv_error_set(err, KV_ERR_INPUT, "%s: /bisect: tensor %d ('%s'): expected a "
                                "probe index >= 0, found %" PRId64, dst, i, rec->tensors[i].name,
                                idx);
        }
        for (int k = 0; k < i; k++) {
            if (rec->tensors[k].index == idx) {
                return kv_error_set(err, KV_ERR_INPUT, "%s: /bisect: probe %" PRId64 " dumped "
                                    "twice (tensors %d and %d); expected one group per probe",
                                    dst, idx, k, i);
            }
        }
    }
    return KV_OK;
}

KvStatus kv_bisect_write_h5(const char *src, const char *dst, const KvBisectRecord *rec,
                            KvError *err) {
    KvStatus st = bisect_check_record(dst, rec, err);
    if (st != KV_OK) return st;
    hid_t fapl = H5I_INVALID_HID, file = H5I_INVALID_HID;
    bool created = false;
    const size_t tmp_len = strlen(dst) + 32;
    char *tmp = malloc(tmp_len);
    if (tmp == NULL) return kv_error_set(err, KV_ERR_INTERNAL, "%s: out of memory", dst);
    snprintf(tmp, tmp_len, "%s.tmp-%ld", dst, (long)getpid());
    H5E_auto2_t old_func = NULL;
    void *old_data = NULL;
    H5Eget_auto2(H5E_DEFAULT, &old_func, &old_data);
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);

    st = bisect_copy_file(src, tmp, err);
    created = true;
    if (st != KV_OK) goto cleanup;
    fapl = H5Pcreate(H5P_FILE_ACCESS);
    if (fapl < 0 || H5Pset_libver_bounds(fapl, H5F_LIBVER_V18, H5F_LIBVER_V18) < 0) {
        st = kv_error_set(err, KV_ERR_INTERNAL, "%s: cannot set up HDF5 file access", dst);
        goto cleanup;
    }
    file = H5Fopen(tmp, H5F_ACC_RDWR, fapl);
    if (file < 0) {
        st = kv_error_set(err, KV_ERR_INPUT, "%s: not an HDF5 report", src);
        goto cleanup;
    }
    if (bisect_write_group(file, rec) < 0) {
        st = kv_error_set(err, KV_ERR_INTERNAL, "%s: cannot write the /bisect group", dst);
        goto cleanup;
    }
    herr_t closed = H5Fclose(file);
    file = H5I_INVALID_HID;
    if (closed < 0) {
        st = kv_error_set(err, KV_ERR_INTERNAL, "%s: cannot finish writing %s", dst, tmp);
        goto cleanup;
    }
    int fd = open(tmp, O_RDONLY | O_CLOEXEC);
    if (fd < 0 || fsync(fd) != 0) {
        st = kv_error_set(err, KV_ERR_INTERNAL, "%s: cannot flush: %s", tmp, strerror(errno));
        if (fd >= 0) close(fd);
        goto cleanup;
    }
    close(fd);
    if (rename(tmp, dst) != 0) {
        st = kv_error_set(err, KV_ERR_INPUT, "%s: cannot create: %s", dst, strerror(errno));
        goto cleanup;
    }
    created = false;
cleanup:
    if (file >= 0) H5Fclose(file);
    if (fapl >= 0) H5Pclose(fapl);
    H5Eset_auto2(H5E_DEFAULT, old_func, old_data);
    if (created) unlink(tmp);
    free(tmp);
    return st;
}
