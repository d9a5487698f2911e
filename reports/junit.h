/* junit.h: a gate run (KvReport) as JUnit XML, the format CI test reporters
 * render (Jenkins junit, GitLab artifacts:reports:junit, GitHub test-report
 * actions). One <testsuite> per (model, scenario), one <testcase> per run
 * with the console's verdict; see kv_junit_write for the exact mapping. */
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
 * The unit is the run, as the gate's console counts them: the root's and
 * every suite's tests/failures/skipped are the runs that
 * kv_report_print_counts counts as run, failed and skipped (both read
 * kv_report_summarize_runs), so the file's totals are the count line's.
 *
 * Layout: <testsuites name="kvrepro"> holds one <testsuite> per distinct
 * (model, scenario) pair, named "model/scenario", in order of first
 * appearance in rep->runs. A suite holds, in report order, one <testcase>
 * per run of that pair, named "model/scenario/variant[+fault]/backend/mode
 * rN", classname "kvrepro.<model>.<scenario>", time the run's seconds
 * (%.3f; the suites' and the root's time their sums).
 *   - A run fails when any comparison with run_b == that run has verdict
 *     FAIL: <failure message="<kind>: <message>" of the first failing
 *     comparison (" (and N more)" when there are), type=its kind>, the body
 *     listing every failing comparison ("<kind>: <a> vs <b>: <message>",
 *     where it first differs, the errors of a tolerance comparison) and the
 *     seeds. A failure outranks a skip.
 *   - Otherwise a run that was skipped, or one of whose comparisons was,
 *     gives <skipped message=its skip_reason, or that comparison's message>.
 *   - A run with comparisons lists them all in <system-out>, one line each:
 *     "<kind>: <a> vs <b>: pass|FAIL|skipped[: <message>]" ("<kind>: <run>"
 *     for a check of one run), runs of the case's own suite by their label
 *     "variant/backend/mode rN", others by their whole name.
 * errors is always 0. The report's root attributes (seeds, commit, device,
 * tolerances) go in each suite's <properties>. Text is escaped for XML
 * 1.0: the five markup characters as entities, tab/newline/CR as character
 * references inside attributes, and bytes XML cannot carry (other control
 * characters, invalid UTF-8) as the visible text "\xNN". Fixed-size name
 * fields are read up to their size even when not NUL-terminated. Nothing
 * from the clock, host or environment is added: the same report always
 * gives the same bytes, but a gate's runs carry the wall times it measured
 * (the HDF5 report keeps them only with --timings), so two gates' files
 * differ in their time attributes.
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

/* kv_junit_write for a gate whose own verdict failed beyond its runs
 * (gate_fail: the reason it prints after "FAIL: ", e.g. it judged too
 * little; NULL: none): one more suite, "kvrepro/gate", with one failed test
 * case "gate: judged enough" carrying the reason, counted in the totals. */
KvStatus kv_junit_write_verdict(const KvReport *rep, const char *gate_fail, const char *path,
                                KvError *err);

#endif
