/* junit.h: a gate run (KvReport) as JUnit XML, the format CI test reporters
 * render (Jenkins junit, GitLab artifacts:reports:junit, GitHub test-report
 * actions). One <testsuite> per (model, scenario), holding one <testcase> per
 * run and one per comparison; see kv_junit_write for the exact mapping. */
#ifndef KV_JUNIT_H
#define KV_JUNIT_H

#include "report.h"
#include "status.h"

/* The comparison kind as written in reports: "reference", "repeat",
 * "graph_vs_eager", "variant_vs_variant", "replay", "finite",
 * "compiled_vs_eager", "graph_budget"; "unknown" for a value outside
 * KvCompareKind. Never NULL. */
const char *kv_compare_kind_name(KvCompareKind kind);

/* Writes rep to path as JUnit XML (UTF-8).
 *
 * Layout: <testsuites name="kvrepro"> holds one <testsuite> per distinct
 * (model, scenario) pair, in order of first appearance in rep->runs. A suite
 * holds, in report order, one <testcase> per run of that pair, named
 * "variant/backend/mode/rN", classname "kvrepro.<model>.<scenario>", time the
 * run's seconds (%.3f); then one <testcase> per comparison whose run_b is in
 * that pair, named "<kind>: <run_a label> vs <run_b label>", time 0.
 *   - A run fails when any comparison with run_b == that run has verdict FAIL:
 *     <failure message=first failing comparison's message, type=its kind>,
 *     the body listing every failing comparison. A failure outranks a skip
 *     (a skipped run with a failing comparison is reported failed, so the
 *     inconsistency is seen rather than hidden).
 *   - Otherwise a skipped run gives <skipped message=skip_reason/>.
 *   - A comparison gives <failure> on FAIL, <skipped> on SKIP.
 * tests/failures/skipped on every <testsuite> count its testcases and the
 * <testsuites> totals are their sums; errors is always 0. The report's root
 * attributes (seeds, commit, device, tolerances) go in each suite's
 * <properties>. Text is escaped for XML 1.0: the five markup characters as
 * entities, tab/newline/CR as character references inside attributes, and
 * bytes XML cannot carry (other control characters, invalid UTF-8) as the
 * visible text "\xNN". Fixed-size name fields are read up to their size even
 * when not NUL-terminated. The same report always gives the same bytes
 * (nothing from the clock, host or environment is added).
 *
 * The file is written by kv_report_file_publish (report.h): an unnamed
 * temporary in path's directory, flushed to disk, then linked and renamed
 * over path, so path is either untouched or complete and a killed gate
 * leaves no temporary. kv_report_check_writable (report.h) checks path
 * before a long run.
 *
 * Returns KV_OK; KV_ERR_INPUT for a NULL argument, an inconsistent report (a
 * comparison's run index out of range, an unknown kind or verdict; checked
 * before anything is created), a path that cannot be created
 * ("<path>: cannot create: <strerror>") or written ("<path>: cannot write:
 * <strerror>", a full disk included); KV_ERR_INTERNAL only when out of
 * memory. On any failure no file and no temporary is left. */
KvStatus kv_junit_write(const KvReport *rep, const char *path, KvError *err);

#endif
