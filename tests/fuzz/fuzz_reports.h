/* fuzz_reports.h: what the two report targets share: small in-memory
 * reports (warm-up, seeds, edit bases), a field-by-field report comparison
 * and the checks run on every input. */
#ifndef KV_FUZZ_REPORTS_H
#define KV_FUZZ_REPORTS_H

#include <stdbool.h>
#include <stddef.h>

#include <stdio.h>

#include "report.h"

/* The kinds of tiny report kv_fuzz_tiny_report builds. */
typedef enum {
    KV_FUZZ_REPORT_PASS = 0,   /* reference + one variant, full logits, all passing */
    KV_FUZZ_REPORT_FAIL,       /* a failing comparison with a probe, a skipped cuda run, and
                                * two runs of another engine (top-k compiled; "failed: ...") */
    KV_FUZZ_REPORT_TOPK,       /* a planted-fault pass: topk runs, a fault, prefill_chunk */
    KV_FUZZ_REPORT_EMPTY,      /* no runs, no comparisons, no tolerances */
    KV_FUZZ_REPORT_COUNT
} KvFuzzReportKind;

/* Fills *rep (owned arrays; kv_report_free releases them) with a report of
 * the given kind: steps 2, batch 1, vocab 4, prompt 3, 2 probes. Aborts on
 * out-of-memory (harness code). */
void kv_fuzz_tiny_report(KvFuzzReportKind kind, KvReport *rep);

/* True when a and b hold the same report (strings, numbers bitwise, every
 * array); otherwise false with the first difference in why. */
bool kv_fuzz_report_equal(const KvReport *a, const KvReport *b, char *why, size_t n);

/* Sets up HDF5 for fuzzing (free lists without limits; see the comment in
 * fuzz_reports.c). Call once, before any report is read. */
void kv_fuzz_report_setup(void);

/* The report targets' check of one input file: kv_report_read_h5(path)
 * must return KV_OK or KV_ERR_INPUT, leave nothing open and, on failure,
 * *out zeroed; a report that reads must keep the reader's promises, print
 * like `kvrepro show` (to sink), be accepted by kv_report_write_h5 (to copy)
 * and read back equal. Aborts on any violation. */
void kv_fuzz_check_report_file(const char *path, const char *copy, FILE *sink);

#endif
