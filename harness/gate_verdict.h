/* gate_verdict.h: the gate's verdict on one screen. The per-run table is
 * thousands of lines on the default gate, nearly all PASS; what a reader
 * needs first is where it failed, what was not judged and why, and the
 * command that looks closer. Part of the kvrepro command layer. */
#ifndef KV_GATE_VERDICT_H
#define KV_GATE_VERDICT_H

#include <stdbool.h>
#include <stdio.h>

#include "report.h"
#include "status.h"

/* Prints to f the failing comparisons (every comparison with verbose), one line
 * each: "FAIL MODEL SCENARIO: A vs B KIND: MESSAGE" (a per-run check names
 * its one run). mutation: runs with a planted fault are meant to fail, so
 * only the clean runs' failures (false alarms) are listed unless verbose.
 * next: after each of the first KV_GATE_NEXT_MAX failures between two runs,
 * the command that bisects it (kv_gate_print_next, on report_path).
 * Returns whether any comparison failed. */
#define KV_GATE_NEXT_MAX 8
bool kv_gate_print_failures(const KvReport *rep, bool mutation, bool verbose, bool next,
                            const char *report_path, FILE *f);

/* A model x scenario grid of run verdicts: a row per scenario (in the
 * order first seen), a column per model, each cell "passed/failed/skipped"
 * runs of that unit ("." where the model has no such unit), failed cells
 * marked with '!', and a legend line. KV_ERR_INTERNAL when out of memory or
 * when writing f fails. */
KvStatus kv_gate_print_grid(const KvReport *rep, FILE *f);

/* The skipped runs grouped by backend and reason, one line per group with
 * its count ("648 runs skipped on cuda: no device: ..."), in the order
 * first seen; nothing when no run was skipped. A run that ran but whose
 * every comparison was skipped counts under its first skipped comparison's
 * message. KV_ERR_INTERNAL as above. */
KvStatus kv_gate_print_skips(const KvReport *rep, FILE *f);

/* The command that bisects failing comparison c of rep (two runs that
 * both ran): "     next: kvrepro bisect REPORT --run A --run B --rerun"
 * with report_path, or REPORT.h5 and a note when the gate writes none.
 * Nothing for a per-run check (finite, replay) or a skipped run. Returns
 * whether it printed. */
bool kv_gate_print_next(const KvReport *rep, const KvComparison *c, const char *report_path,
                        FILE *f);

/* The verdict as a file for CI (--summary-md: a job summary such as
 * GitHub's $GITHUB_STEP_SUMMARY) or for scripts (--summary-json). The
 * Markdown is a heading with the verdict and the count line, then the
 * console's grid, failures (with their bisect commands) and skips in one
 * text block. The JSON (docs/SCHEMA.md, "kvrepro-summary" version 1):
 * verdict, the counts, the grid's cells, each failing comparison with its
 * runs, kind, message and bisect command, and the skip groups. Written
 * whole or not at all (kv_report_file_publish); KV_ERR_INPUT naming the
 * path when it cannot be. failed: the gate's verdict, which may rest on
 * more than its comparisons: fail_why (or NULL) is the gate's own FAIL
 * line then (the planned-run account, a gate that judged nothing). */
KvStatus kv_gate_write_summary_md(const KvReport *rep, bool failed, const char *fail_why,
                                  const char *report_path, const char *path, KvError *err);
KvStatus kv_gate_write_summary_json(const KvReport *rep, bool failed, const char *fail_why,
                                    const char *report_path, const char *path, KvError *err);

#endif
