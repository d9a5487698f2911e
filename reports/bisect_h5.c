/* bisect_h5.c: writing the /bisect group into a copy of a report
 * (bisect_h5.h).
 *
 * The copy is made in memory, as the report writer makes a report
 * (report_h5_write.c): the source's bytes are opened with HDF5's core
 * driver (no backing store), the group is written there, and the finished
 * image reaches the disk through kv_report_file_publish (report.h). So no
 * file is ever opened by name for writing: a link planted at the
 * temporary's name or at the destination is never followed, a destination
 * that is not a regular file is refused, a killed bisect leaves no
 * temporary, and temporaries of killed writers are removed. */
#include "bisect_h5.h"

#include <errno.h>
#include <fcntl.h>
#include <hdf5.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "h5util.h"
#include "report.h"

/* The core driver's growth step, as the report writer's. */
#define BISECT_CORE_INCREMENT ((size_t)1 << 20)
/* Appended to the source's path to name the in-memory file: with a file
 * image the driver refuses a name that exists, and "<regular file>/..."
 * cannot. */
#define BISECT_MEMORY_LABEL "/(kvrepro in-memory copy)"

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

/* ---- the source in memory ------------------------------------------------ */

/* Reads the whole regular file src into a malloc'd buffer. */
static KvStatus bisect_read_file(const char *src, unsigned char **buf, size_t *len,
                                 KvError *err) {
    *buf = NULL;
    *len = 0;
    KvStatus st = KV_OK;
    const int fd = open(src, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return kv_error_set(err, KV_ERR_INPUT, "%s: cannot open: %s", src, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        st = kv_error_set(err, KV_ERR_INPUT, "%s: cannot read: %s", src, strerror(errno));
        goto cleanup;
    }
    if (!S_ISREG(sb.st_mode) || sb.st_size <= 0 || (uint64_t)sb.st_size > SIZE_MAX / 2) {
        st = kv_error_set(err, KV_ERR_INPUT, "%s: expected a non-empty regular file", src);
        goto cleanup;
    }
    const size_t n = (size_t)sb.st_size;
    unsigned char *b = malloc(n);
    if (b == NULL) {
        st = kv_error_set(err, KV_ERR_INTERNAL, "%s: out of memory (%zu bytes)", src, n);
        goto cleanup;
    }
    size_t got = 0;
    while (got < n) {
        const ssize_t r = read(fd, b + got, n - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            st = kv_error_set(err, KV_ERR_INPUT, "%s: cannot read: %s", src,
                              r == 0 ? "the file shrank while it was read" : strerror(errno));
            free(b);
            goto cleanup;
        }
        got += (size_t)r;
    }
    *buf = b;
    *len = n;
cleanup:
    close(fd);
    return st;
}

/* The core driver's buffer, kept when the driver lets go of it at close
 * (the report writer's CoreImage, for a file opened from an image): grown
 * memory is zeroed, so bytes HDF5 never writes are zero. */
typedef struct {
    unsigned char *buf;
    size_t size;
    bool closed; /* handed back at close: ours to publish and free */
} BisectImage;

static void *bisect_image_malloc(size_t size, H5FD_file_image_op_t op, void *udata) {
    BisectImage *im = udata;
    unsigned char *p = calloc(1, size > 0 ? size : 1);
    if (p != NULL && op == H5FD_FILE_IMAGE_OP_FILE_OPEN) {
        im->buf = p; /* the file's own buffer; the others are property lists' copies */
        im->size = size;
    }
    return p;
}

static void *bisect_image_memcpy(void *dest, const void *src, size_t size,
                                 H5FD_file_image_op_t op, void *udata) {
    (void)op;
    (void)udata;
    return memcpy(dest, src, size);
}

static void *bisect_image_realloc(void *ptr, size_t size, H5FD_file_image_op_t op, void *udata) {
    (void)op;
    BisectImage *im = udata;
    unsigned char *p = realloc(ptr, size > 0 ? size : 1);
    if (p == NULL || ptr != im->buf) return p;
    if (size > im->size) memset(p + im->size, 0, size - im->size);
    im->buf = p;
    im->size = size;
    return p;
}

static herr_t bisect_image_free(void *ptr, H5FD_file_image_op_t op, void *udata) {
    BisectImage *im = udata;
    if (ptr != NULL && ptr == im->buf) {
        im->closed = op == H5FD_FILE_IMAGE_OP_FILE_CLOSE;
        if (im->closed) return 0;
        im->buf = NULL;
        im->size = 0;
    }
    free(ptr);
    return 0;
}

static void *bisect_image_udata_copy(void *udata) { return udata; }
static herr_t bisect_image_udata_free(void *udata) {
    (void)udata;
    return 0;
}

static uint64_t bisect_le(const unsigned char *p, int n) {
    uint64_t v = 0;
    for (int k = n - 1; k >= 0; k--) v = v << 8 | p[k];
    return v;
}

/* The file's length: the end-of-file address its superblock records (the
 * driver's buffer grows in whole increments and is not cut at close). A
 * superblock at offset 0, of any version: 0 and 1 keep the address after
 * the base and free-space addresses, 2 and 3 after the base and extension
 * addresses. Where it cannot be read so, the whole buffer: HDF5 accepts
 * a file longer than its end-of-file address. */
static size_t bisect_image_length(const BisectImage *im) {
    static const unsigned char signature[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};
    const unsigned char *b = im->buf;
    if (im->size < 64 || memcmp(b, signature, sizeof signature) != 0) return im->size;
    const int version = b[8];
    size_t off = 0, at = 0;
    if (version == 0 || version == 1) {
        off = b[13];
        at = (version == 0 ? 24 : 28);
    } else if (version == 2 || version == 3) {
        off = b[9];
        at = 12;
    } else {
        return im->size;
    }
    if ((off != 4 && off != 8) || at + 3 * off > im->size) return im->size;
    const uint64_t base = bisect_le(b + at, (int)off);
    const uint64_t eof = bisect_le(b + at + 2 * off, (int)off);
    if (base != 0 || eof < 8 || eof > im->size) return im->size;
    return (size_t)eof;
}

/* ---- an existing /bisect group -------------------------------------------- */

/* How deep and how many objects the check of an old /bisect walks: the
 * writer's group is two levels and a few objects deep; a crafted one with
 * a hard-link cycle must still end. */
#define BISECT_CHECK_DEPTH 8
#define BISECT_CHECK_OBJECTS 4096

typedef struct {
    int depth;
    long objects;
    char path[512];  /* of the group being walked, "/bisect/..." */
    char where[600]; /* the first object that failed, "" when none */
    char why[400];   /* its innermost HDF5 error */
} BisectWalk;

static herr_t bisect_walk_innermost(unsigned n, const H5E_error2_t *e, void *data) {
    BisectWalk *w = data;
    if (n == 0 && e != NULL) {
        snprintf(w->why, sizeof w->why, " (HDF5 %s: %s)", e->func_name != NULL ? e->func_name : "?",
                 e->desc != NULL ? e->desc : "?");
    }
    return 0;
}

/* Records the first failure: the object and HDF5's innermost error. */
static herr_t bisect_walk_fail(BisectWalk *w, const char *name, const char *what) {
    if (w->where[0] == '\0') {
        snprintf(w->where, sizeof w->where, "%s/%s: %s", w->path, name, what);
        if (H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, bisect_walk_innermost, w) < 0) w->why[0] = '\0';
    }
    return -1;
}

static herr_t bisect_check_link(hid_t g, const char *name, const H5L_info_t *li, void *udata);

/* Every object under group g, opened as removing the group frees it: its
 * header and attribute count, a group's links, a dataset's layout and
 * storage index. */
static herr_t bisect_check_members(hid_t g, const char *name, BisectWalk *w) {
    if (w->depth >= BISECT_CHECK_DEPTH) return bisect_walk_fail(w, name, "nested too deep");
    const size_t at = strlen(w->path);
    if (at + strlen(name) + 2 > sizeof w->path) return bisect_walk_fail(w, name, "path too long");
    snprintf(w->path + at, sizeof w->path - at, "/%s", name);
    w->depth++;
    hsize_t idx = 0;
    const herr_t rc = H5Literate(g, H5_INDEX_NAME, H5_ITER_INC, &idx, bisect_check_link, w);
    w->depth--;
    w->path[at] = '\0';
    if (rc < 0) return w->where[0] != '\0' ? -1 : bisect_walk_fail(w, name, "cannot list");
    return 0;
}

static herr_t bisect_check_link(hid_t g, const char *name, const H5L_info_t *li, void *udata) {
    BisectWalk *w = udata;
    if (li->type != H5L_TYPE_HARD) return 0; /* removed alone, nothing freed behind it */
    if (++w->objects > BISECT_CHECK_OBJECTS) return bisect_walk_fail(w, name, "too many objects");
    H5O_info_t info;
    if (H5Oget_info_by_name2(g, name, &info, H5O_INFO_ALL, H5P_DEFAULT) < 0) {
        return bisect_walk_fail(w, name, "cannot read its header");
    }
    herr_t rc = 0;
    if (info.type == H5O_TYPE_GROUP) {
        const hid_t sub = H5Gopen2(g, name, H5P_DEFAULT);
        if (sub < 0) return bisect_walk_fail(w, name, "cannot open the group");
        rc = bisect_check_members(sub, name, w);
        if (H5Gclose(sub) < 0) rc = bisect_walk_fail(w, name, "cannot close the group");
    } else if (info.type == H5O_TYPE_DATASET) {
        const hid_t d = H5Dopen2(g, name, H5P_DEFAULT);
        if (d < 0) return bisect_walk_fail(w, name, "cannot open the dataset");
        (void)H5Dget_storage_size(d); /* walks a chunked dataset's index; 0 is a size */
        if (H5Dclose(d) < 0) rc = bisect_walk_fail(w, name, "cannot close the dataset");
    }
    return rc;
}

/* A /bisect group that a rerun would replace must be one HDF5 can walk:
 * removing it frees every object under it, and a damaged one fails midway
 * with the in-memory file half changed (which libhdf5 then cannot close,
 * looping at exit). Checked before anything is changed. */
static KvStatus bisect_check_group(hid_t file, ReportCtx *c) {
    const htri_t exists = H5Lexists(file, "bisect", H5P_DEFAULT);
    if (exists == 0) return KV_OK;
    if (exists < 0) {
        return h5_fail(c, KV_ERR_INPUT, "/bisect: expected a group that bisect --rerun can "
                       "replace, found a damaged link");
    }
    H5L_info_t li;
    if (H5Lget_info(file, "bisect", &li, H5P_DEFAULT) < 0) {
        return h5_fail(c, KV_ERR_INPUT, "/bisect: expected a group that bisect --rerun can "
                       "replace, found a damaged link");
    }
    BisectWalk w = {.depth = 0, .objects = 0, .path = "", .where = "", .why = ""};
    if (bisect_check_link(file, "bisect", &li, &w) < 0) {
        H5Eclear2(H5E_DEFAULT);
        return kv_error_set(c->err, KV_ERR_INPUT, "%s: /bisect: expected a group that bisect "
                            "--rerun can replace, found a damaged one: %s%s; replacing the group "
                            "frees every object under it, so the rerun cannot write its dumps "
                            "(bisect without --rerun reads only the runs)", c->path, w.where,
                            w.why);
    }
    return KV_OK;
}

/* HDF5's error printing back on, after a success only: libhdf5 1.10 does
 * not release what a failed read of a damaged object header allocated, and
 * with its error printing on it then dumps "infinite loop closing library"
 * at exit over our own message (every failure here is already reported
 * through err). */
static void bisect_quiet_end(QuietErrors *q, KvStatus *st, ReportCtx *c) {
    if (*st == KV_OK) h5_quiet_end(q, st, c);
}

/* The source opened in memory (read-write, nothing reaches the disk):
 * *file and the access list *fapl, which the caller closes. */
static KvStatus bisect_open_image(const char *src, const unsigned char *img, size_t len,
                                  unsigned flags, BisectImage *im, hid_t *fapl, hid_t *file,
                                  ReportCtx *c) {
    const H5FD_file_image_callbacks_t callbacks = {
        .image_malloc = bisect_image_malloc,
        .image_memcpy = bisect_image_memcpy,
        .image_realloc = bisect_image_realloc,
        .image_free = bisect_image_free,
        .udata_copy = bisect_image_udata_copy,
        .udata_free = bisect_image_udata_free,
        .udata = im,
    };
    *fapl = H5Pcreate(H5P_FILE_ACCESS);
    if (*fapl < 0 || H5Pset_fapl_core(*fapl, BISECT_CORE_INCREMENT, 0) < 0 ||
        H5Pset_file_image_callbacks(*fapl, (H5FD_file_image_callbacks_t *)&callbacks) < 0 ||
        H5Pset_file_image(*fapl, (void *)img, len) < 0 ||
        H5Pset_libver_bounds(*fapl, H5F_LIBVER_V18, H5F_LIBVER_V18) < 0 ||
        H5Pset_fclose_degree(*fapl, H5F_CLOSE_STRONG) < 0) {
        return h5_fail(c, KV_ERR_INTERNAL, "cannot set up HDF5 file access in memory");
    }
    const size_t n = strlen(src) + sizeof BISECT_MEMORY_LABEL;
    char *label = malloc(n);
    if (label == NULL) return kv_error_set(c->err, KV_ERR_INTERNAL, "%s: out of memory", src);
    snprintf(label, n, "%s" BISECT_MEMORY_LABEL, src);
    *file = H5Fopen(label, flags, *fapl);
    free(label);
    if (*file < 0) return h5_fail(c, KV_ERR_INPUT, "not an HDF5 report");
    return KV_OK;
}

/* bisect_check_group on src's bytes, opened read-only in memory: a failed
 * read of a damaged object then leaves nothing half changed to flush. */
static KvStatus bisect_check_image(const char *src, const unsigned char *img, size_t len,
                                   ReportCtx *c) {
    BisectImage im = {NULL, 0, false};
    hid_t fapl = H5I_INVALID_HID, file = H5I_INVALID_HID;
    KvStatus st = bisect_open_image(src, img, len, H5F_ACC_RDONLY, &im, &fapl, &file, c);
    if (st == KV_OK) st = bisect_check_group(file, c);
    if (file >= 0 && H5Fclose(file) < 0 && st == KV_OK) {
        st = h5_fail(c, KV_ERR_INTERNAL, "cannot close the copy in memory");
    }
    if (fapl >= 0) H5Pclose(fapl);
    if (im.closed) free(im.buf); /* else still the driver's (a close that failed) */
    return st;
}

KvStatus kv_bisect_check_h5(const char *src, KvError *err) {
    if (src == NULL) return kv_error_set(err, KV_ERR_INPUT, "kv_bisect_check_h5: NULL path");
    ReportCtx c = {.path = src, .err = err};
    QuietErrors quiet = {.saved = false};
    unsigned char *img = NULL;
    size_t len = 0;
    KvStatus st = bisect_read_file(src, &img, &len, err);
    if (st != KV_OK) return st;
    st = h5_quiet_begin(&quiet, &c);
    if (st == KV_OK) st = bisect_check_image(src, img, len, &c);
    bisect_quiet_end(&quiet, &st, &c);
    free(img);
    return st;
}

KvStatus kv_bisect_write_h5(const char *src, const char *dst, const KvBisectRecord *rec,
                            KvError *err) {
    if (src == NULL || dst == NULL || rec == NULL) {
        return kv_error_set(err, KV_ERR_INPUT, "kv_bisect_write_h5: NULL argument");
    }
    KvStatus st = bisect_check_record(dst, rec, err);
    if (st != KV_OK) return st;
    /* an unusable destination (a directory, a device, a FIFO) is refused
     * before anything is built */
    st = kv_report_check_writable(dst, err);
    if (st != KV_OK) return st;
    ReportCtx c = {.path = src, .err = err};
    QuietErrors quiet = {.saved = false};
    BisectImage im = {NULL, 0, false};
    unsigned char *img = NULL;
    size_t len = 0;
    hid_t fapl = H5I_INVALID_HID, file = H5I_INVALID_HID;
    st = bisect_read_file(src, &img, &len, err);
    if (st != KV_OK) return st;
    st = h5_quiet_begin(&quiet, &c);
    if (st == KV_OK) st = bisect_check_image(src, img, len, &c);
    if (st == KV_OK) {
        st = bisect_open_image(src, img, len, H5F_ACC_RDWR, &im, &fapl, &file, &c);
    }
    free(img);
    img = NULL;
    if (st != KV_OK) goto cleanup;
    c.path = dst;
    if (bisect_write_group(file, rec) < 0) {
        st = h5_fail(&c, KV_ERR_INTERNAL, "cannot write the /bisect group");
        goto cleanup;
    }
    const herr_t closed = H5Fclose(file);
    file = H5I_INVALID_HID;
    if (closed < 0 || !im.closed || im.buf == NULL) {
        st = h5_fail(&c, KV_ERR_INTERNAL, "cannot finish the copy in memory");
        goto cleanup;
    }
    st = kv_report_file_publish(dst, im.buf, bisect_image_length(&im), err);
cleanup:
    if (file >= 0) H5Fclose(file);
    if (fapl >= 0) H5Pclose(fapl);
    bisect_quiet_end(&quiet, &st, &c);
    if (im.closed) free(im.buf); /* else still the driver's (a close that failed) */
    return st;
}
