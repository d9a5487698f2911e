/* writes_craft.c: inputs for lies_writes_cli.cmake.
 *
 *   writes_craft shard IN.h5 OUT.h5 LABEL
 *     OUT.h5: IN.h5 with its root "shard" attribute set to LABEL, through
 *     the project's reader and writer (a valid report otherwise).
 *   writes_craft damage IN.h5 OUT.h5
 *     OUT.h5: a byte copy of IN.h5 whose first dataset under /bisect has
 *     four bytes of its object header overwritten (its checksum then fails):
 *     a damaged /bisect group in an otherwise readable report.
 *
 * Exit 0 on success, 2 on bad usage or input. */
#include <hdf5.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "report.h"
#include "report_h5.h"

static int craft_shard(const char *in, const char *out, const char *label) {
    KvReport rep;
    KvError err = {{0}};
    if (kv_report_read_h5(in, &rep, &err) != KV_OK) {
        fprintf(stderr, "writes_craft: %s\n", err.msg);
        return 2;
    }
    snprintf(rep.shard, sizeof rep.shard, "%s", label);
    const KvStatus st = kv_report_write_h5(&rep, out, &err);
    kv_report_free(&rep);
    if (st != KV_OK) {
        fprintf(stderr, "writes_craft: %s\n", err.msg);
        return 2;
    }
    return 0;
}

/* The address of the first dataset /bisect/<group>/<name> (by name order). */
static herr_t first_dataset(hid_t g, const char *name, const H5O_info_t *info, void *data) {
    (void)g;
    (void)name;
    haddr_t *addr = data;
    if (info->type == H5O_TYPE_DATASET) {
        *addr = info->addr;
        return 1;
    }
    return 0;
}

static int craft_damage(const char *in, const char *out) {
    hid_t f = H5Fopen(in, H5F_ACC_RDONLY, H5P_DEFAULT);
    haddr_t addr = HADDR_UNDEF;
    if (f < 0 || H5Ovisit_by_name2(f, "bisect", H5_INDEX_NAME, H5_ITER_INC, first_dataset, &addr,
                                   H5O_INFO_BASIC, H5P_DEFAULT) < 0 || addr == HADDR_UNDEF) {
        fprintf(stderr, "writes_craft: %s: no dataset under /bisect\n", in);
        if (f >= 0) H5Fclose(f);
        return 2;
    }
    H5Fclose(f);
    FILE *src = fopen(in, "rb");
    if (src == NULL) return 2;
    fseek(src, 0, SEEK_END);
    const long n = ftell(src);
    rewind(src);
    unsigned char *buf = malloc((size_t)n);
    if (buf == NULL || fread(buf, 1, (size_t)n, src) != (size_t)n || (long)addr + 14 > n) {
        fclose(src);
        free(buf);
        return 2;
    }
    fclose(src);
    memset(buf + addr + 10, 0xff, 4); /* inside the header: its checksum no longer matches */
    FILE *dst = fopen(out, "wb");
    const int ok = dst != NULL && fwrite(buf, 1, (size_t)n, dst) == (size_t)n;
    if (dst != NULL && fclose(dst) != 0) return 2;
    free(buf);
    return ok ? 0 : 2;
}

int main(int argc, char **argv) {
    if (argc == 5 && strcmp(argv[1], "shard") == 0) return craft_shard(argv[2], argv[3], argv[4]);
    if (argc == 4 && strcmp(argv[1], "damage") == 0) return craft_damage(argv[2], argv[3]);
    fprintf(stderr, "usage: writes_craft shard IN.h5 OUT.h5 LABEL | damage IN.h5 OUT.h5\n");
    return 2;
}
