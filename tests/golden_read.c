/* golden_read.c: a transformers golden scenario read (golden_read.h). */
#include "golden_read.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void kv_golden_free(KvGolden *g) {
    free(g->input_ids);
    free(g->mask);
    free(g->tokens);
    free(g->logits);
    free(g->margins);
    memset(g, 0, sizeof *g);
}

/* Reads dataset `name` of group gid with rank `rank` into a malloc'd buffer
 * of mem_type; dims receives the shape. */
static void *golden_read_dataset(hid_t gid, const char *name, hid_t mem_type, size_t elem,
                                 int rank, hsize_t *dims) {
    hid_t d = H5Dopen2(gid, name, H5P_DEFAULT);
    ck_assert_msg(d >= 0, "golden: dataset '%s' missing", name);
    hid_t sp = H5Dget_space(d);
    ck_assert_int_eq(H5Sget_simple_extent_ndims(sp), rank);
    H5Sget_simple_extent_dims(sp, dims, NULL);
    size_t n = 1;
    for (int i = 0; i < rank; i++) n *= (size_t)dims[i];
    void *buf = malloc(n * elem);
    ck_assert_ptr_nonnull(buf);
    ck_assert_msg(H5Dread(d, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf) >= 0,
                  "golden: reading '%s' failed", name);
    H5Sclose(sp);
    H5Dclose(d);
    return buf;
}

void kv_golden_read(hid_t file, const char *scenario, KvGolden *g) {
    char path[128];
    snprintf(path, sizeof path, "/scenarios/%.100s", scenario);
    hid_t gid = H5Gopen2(file, path, H5P_DEFAULT);
    ck_assert_msg(gid >= 0, "golden: group %s missing", path);
    hsize_t d2[2], d3[3], dt[2], dm[2], dmg[2];
    memset(g, 0, sizeof *g);
    snprintf(g->name, sizeof g->name, "%.63s", scenario);
    g->input_ids = golden_read_dataset(gid, "input_ids", H5T_NATIVE_INT32, 4, 2, d2);
    g->mask = golden_read_dataset(gid, "attention_mask", H5T_NATIVE_UINT8, 1, 2, dm);
    g->tokens = golden_read_dataset(gid, "tokens", H5T_NATIVE_INT32, 4, 2, dt);
    g->logits = golden_read_dataset(gid, "logits", H5T_NATIVE_FLOAT, 4, 3, d3);
    g->margins = golden_read_dataset(gid, "margins", H5T_NATIVE_FLOAT, 4, 2, dmg);
    H5Gclose(gid);
    g->batch = (int64_t)d2[0];
    g->prompt_len = (int64_t)d2[1];
    g->steps = (int64_t)d3[0];
    g->vocab = (int64_t)d3[2];
    ck_assert(dm[0] == d2[0] && dm[1] == d2[1]);
    ck_assert(dt[0] == d3[0] && dt[1] == d2[0] && d3[1] == d2[0]);
    ck_assert(dmg[0] == d3[0] && dmg[1] == d2[0]);
}

/* H5Literate callback: each link name into the first empty slot of op
 * (char[16][64]); stops the iteration (-1) when all 16 are taken. */
static herr_t golden_collect_name(hid_t g, const char *name, const H5L_info_t *info, void *op) {
    (void)g;
    (void)info;
    char (*names)[64] = op;
    for (int i = 0; i < 16; i++) {
        if (names[i][0] == '\0') {
            snprintf(names[i], 64, "%.63s", name);
            return 0;
        }
    }
    return -1;
}

hid_t kv_golden_open(const char *h5path, char names[16][64]) {
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    hid_t f = H5Fopen(h5path, H5F_ACC_RDONLY, H5P_DEFAULT);
    ck_assert_msg(f >= 0, "cannot open %s", h5path);
    memset(names, 0, 16 * sizeof names[0]);
    hid_t sg = H5Gopen2(f, "/scenarios", H5P_DEFAULT);
    ck_assert_msg(sg >= 0, "%s: no /scenarios group", h5path);
    ck_assert(H5Literate(sg, H5_INDEX_NAME, H5_ITER_INC, NULL, golden_collect_name, names) >= 0);
    H5Gclose(sg);
    return f;
}
