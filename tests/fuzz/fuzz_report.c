/* fuzz_report.c: libFuzzer target for the HDF5 report reader. The input is
 * a report file; kv_report_read_h5 takes a path only, so each input is
 * written to this process's scratch directory first.
 *
 * Each input goes through kv_report_read_h5 and then what `kvrepro show`
 * does with a loaded report (the root lines and kv_report_print_summary,
 * printed to /dev/null). A report that reads must also:
 *  - keep the reader's promises (terminated strings, comparisons naming
 *    existing runs, every array of a run that ran);
 *  - round-trip: kv_report_write_h5 accepts it and reading that file back
 *    gives the same report (what `merge` and `bisect` rely on).
 * After every input, no HDF5 file or object may be left open.
 *
 * The mutations are libFuzzer's own, so a change to the superblock or an
 * object header (v2, checksummed) is refused by HDF5's checksum: the run
 * reaches our reader's handling of HDF5 errors, raw data (values, strings)
 * and the unchecksummed v1 B-trees. That is what CI runs. With
 * KV_FUZZ_H5_FIX_CHECKSUMS=1 a custom mutator recomputes the checksums after
 * each mutation (fuzz_h5fix.h; 1 in 16 keeps them broken), so damaged object
 * headers reach libhdf5's parser: that mode finds libhdf5 1.10.8's own
 * memory errors within seconds (README.md, findings) and is for hunting them
 * by hand. fuzz_report_edit covers our reader's handling of well-formed
 * files with the wrong contents. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fuzz_common.h"
#include "fuzz_h5fix.h"
#include "fuzz_reports.h"
#include "report.h"
#include "report_h5.h"

static char g_input[4096], g_copy[4096];
static FILE *g_null;
static bool g_fix_checksums;

static void self_test_fixer(const char *path) {
    FILE *f = fopen(path, "rb");
    static uint8_t buf[1 << 16], fixed[1 << 16];
    size_t n = f != NULL ? fread(buf, 1, sizeof buf, f) : 0;
    if (f == NULL || ferror(f) || !feof(f) || fclose(f) != 0) {
        fprintf(stderr, "kvrepro fuzz: cannot read back %s (or larger than %zu bytes)\n", path,
                sizeof buf);
        abort();
    }
    memcpy(fixed, buf, n);
    kv_fuzz_h5_fix_checksums(fixed, n);
    if (memcmp(fixed, buf, n) != 0) {
        fprintf(stderr, "kvrepro fuzz: the checksum fixer changed a valid file (%s)\n", path);
        abort();
    }
}

size_t LLVMFuzzerMutate(uint8_t *data, size_t size, size_t max_size);

size_t LLVMFuzzerCustomMutator(uint8_t *data, size_t size, size_t max_size, unsigned int seed) {
    size = LLVMFuzzerMutate(data, size, max_size);
    if (g_fix_checksums && seed % 16 != 0) kv_fuzz_h5_fix_checksums(data, size);
    return size;
}

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
    const char *fix = getenv("KV_FUZZ_H5_FIX_CHECKSUMS");
    g_fix_checksums = fix != NULL && strcmp(fix, "1") == 0;
    kv_fuzz_report_setup();
    /* Every seed kind must write and read back, and the checksum fixer
     * must leave a valid file as it is: the harness works. */
    for (int k = 0; k < KV_FUZZ_REPORT_COUNT; k++) {
        KvReport rep, back;
        KvError err = {{0}};
        kv_fuzz_tiny_report((KvFuzzReportKind)k, &rep);
        if (kv_report_write_h5(&rep, g_copy, &err) != KV_OK ||
            kv_report_read_h5(g_copy, &back, &err) != KV_OK) {
            fprintf(stderr, "kvrepro fuzz: warm-up report %d: %s\n", k, err.msg);
            abort();
        }
        kv_report_free(&rep);
        kv_report_free(&back);
        self_test_fixer(g_copy);
    }
    (void)unlink(g_copy);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    kv_fuzz_write_file(g_input, data, size);
    kv_fuzz_check_report_file(g_input, g_copy, g_null);
    return 0;
}
