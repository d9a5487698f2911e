/* drop_reference_runs.c: test tool. Reads a gate report and writes it again
 * without its reference runs (variant "reference" or "reference~...") and
 * without comparisons or tolerances: what is left is a recording of
 * candidate runs, as another engine would write it, for `gate --external`.
 *
 *   drop_reference_runs IN.h5 OUT.h5
 *
 * Exit 0 done, 2 bad usage or input. */
#include <stdio.h>
#include <string.h>

#include "report.h"
#include "report_h5.h"

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: drop_reference_runs IN.h5 OUT.h5\n");
        return 2;
    }
    KvReport rep;
    KvError err = {{0}};
    if (kv_report_read_h5(argv[1], &rep, &err) != KV_OK) {
        fprintf(stderr, "drop_reference_runs: %s\n", err.msg);
        return 2;
    }
    int64_t kept = 0;
    for (int64_t i = 0; i < rep.n_runs; i++) {
        if (strncmp(rep.runs[i].variant, "reference", 9) == 0) {
            kv_run_free(&rep.runs[i]);
            continue;
        }
        rep.runs[kept++] = rep.runs[i];
    }
    rep.n_runs = kept;
    rep.n_comparisons = 0;
    rep.n_tolerances = 0;
    const KvStatus st = kv_report_write_h5(&rep, argv[2], &err);
    if (st != KV_OK) fprintf(stderr, "drop_reference_runs: %s\n", err.msg);
    kv_report_free(&rep);
    return st == KV_OK ? 0 : 2;
}
