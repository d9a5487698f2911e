/* report_h5.h: the HDF5 form of a gate report (DESIGN §8). The layout, the
 * types and the reproducibility rules are documented in docs/SCHEMA.md;
 * this header states the contracts. */
#ifndef KV_REPORT_H5_H
#define KV_REPORT_H5_H

#include "kv_limits.h"
#include "report.h"
#include "status.h"

/* ---- what the reader accepts ---------------------------------------------
 * A report is input. Every size it declares is checked against the caps of
 * kv_limits.h (shared with the writer and the gate), against the other sizes
 * it must agree with, and against the file's own size before anything is
 * allocated, so a damaged or crafted file is refused (KV_ERR_INPUT) instead
 * of exhausting memory or time. */

/* The start of the skip_reason of another engine's run that could not
 * complete (docs/SCHEMA.md): such a run fails the gate's finite check, a
 * crash is never a pass. harness/compare.h KV_RUN_FAILED_PREFIX is the
 * same text. */
#define KV_REPORT_FAILED_MARKER "failed: "

/* Writes rep to path in schema KV_REPORT_SCHEMA_VERSION.
 *
 * The file is built in memory (HDF5's core driver) and written by
 * kv_report_file_publish (report.h): an unnamed temporary in path's
 * directory, flushed to disk, linked and renamed over path, so path is
 * either untouched or complete, and a killed writer leaves no temporary
 * behind ("<path>.tmp-<pid>" files of dead writers are removed). The same
 * report always gives the same bytes: no timestamps (object time tracking is
 * off on every group and dataset), fixed format version bounds (v1.8 objects
 * only), fixed creation order, fixed fill values, and strings copied into
 * zeroed fixed-length buffers so bytes after a terminator never reach the
 * file. Run.seconds is stored as given; the harness zeroes it unless timings
 * were asked for. kv_report_check_writable (report.h) checks path before a
 * long run.
 *
 * Skipped runs are stored as attributes only (no datasets). A run that is not
 * skipped must have every array its shape calls for (NULL is fine only for a
 * zero-sized array).
 *
 * Identical full logits of runs of one model and scenario are stored once
 * and hard-linked, unless the links would make the file ask its reader for
 * more than kv_limits_read_budget of its size: then each run stores its
 * own (only such extreme reports; the others keep their bytes).
 *
 * Returns KV_OK; KV_ERR_INPUT for a NULL argument, an inconsistent report
 * (a string field without a terminator, a negative size, a missing array, a
 * comparison naming a run out of range, an unknown kind or verdict, and
 * whatever its reader would refuse: a size or count outside the limits
 * table, a repeated top-k id, another engine's bad margin or skip reason, a
 * report of more than KV_REPORT_MAX_READ_BYTES to hold; all checked before
 * anything is created), a path that cannot be created
 * ("<path>: cannot create: <strerror>") or written ("<path>: cannot write:
 * <strerror>": a full disk, a quota, an I/O error); KV_ERR_INTERNAL when out
 * of memory or HDF5 fails while building the file in memory (the message
 * ends with the innermost HDF5 error). */
KvStatus kv_report_write_h5(const KvReport *rep, const char *path, KvError *err);

/* Reads a report written by kv_report_write_h5 (or by another tool in the
 * same schema) into *out, which is overwritten without being freed first.
 * Every field round-trips exactly. Strings may be stored fixed- or
 * variable-length (h5py writes str attributes variable-length); numbers are
 * converted from any integer or float type of the right class.
 *
 * Nothing the file declares is trusted before it is checked: sizes against
 * the caps above and against each other (every dataset's shape is exactly
 * the one its run's attributes give; /summary has one row per run,
 * /comparisons at most KV_REPORT_MAX_COMPARISONS_PER_RUN per run and names
 * existing runs), and every dataset's data against what the file stores
 * (all of it allocated in this file: no external raw data, no virtual
 * dataset, no filter but shuffle, deflate and fletcher32, no more than
 * KV_REPORT_MAX_DEFLATE_RATIO bytes per stored byte), all before the
 * allocation; the total, a copy per run of a shared dataset included, stays
 * within kv_limits_read_budget of the file's size (at most
 * KV_REPORT_MAX_READ_BYTES). Every link the reader walks (the root group,
 * /runs, each run group) must be a hard link to an object of the type the
 * schema gives, with no names the schema does not have; a soft or external
 * link is refused, never followed. Only a run's logits may be shared with
 * other runs, and only of the same model and scenario (the writer's hard
 * links); a shared dataset is decompressed once and copied. What the
 * arrays say is checked too (h5util.h h5_run_values_ok): top-k rows of
 * distinct ids in the vocabulary; on another engine's run, margins >= 0
 * (NaN only beside a non-finite logit) and a skip reason that is empty on
 * a run that ran and, on a skipped one, says why, a failure starting with
 * KV_REPORT_FAILED_MARKER. Counts (repeat, graphs_captured,
 * replays_checked) are never negative.
 *
 * Returns KV_OK, or KV_ERR_INPUT for a missing or unreadable file, a file
 * that is not HDF5, a truncated file, a writer's temporary
 * ("NAME.tmp-DIGITS"), another schema_version, a missing group, dataset or
 * attribute, a wrong type class, a string too long for its field, shapes
 * that disagree with the run's size attributes, and everything refused
 * above; the message reads "<path>: <object>: expected ..., found ...".
 * KV_ERR_INTERNAL only when memory runs out for a report within the caps.
 * On failure *out is all zero and nothing is left allocated. */
KvStatus kv_report_read_h5(const char *path, KvReport *out, KvError *err);

#endif
