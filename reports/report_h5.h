/* report_h5.h: the HDF5 form of a gate report (DESIGN §8). The layout, the
 * types and the reproducibility rules are documented in reports/SCHEMA.md;
 * this header states the contracts. */
#ifndef KV_REPORT_H5_H
#define KV_REPORT_H5_H

#include "report.h"
#include "status.h"

/* Writes rep to path in schema KV_REPORT_SCHEMA_VERSION.
 *
 * The file is built as "<path>.tmp-<pid>" in the same directory, flushed to
 * disk and renamed over path, so path is either untouched or complete; on
 * any failure the temporary is removed. The same report always gives the
 * same bytes: no timestamps (object time tracking is off on every group and
 * dataset), fixed format version bounds (v1.8 objects only), fixed creation
 * order, fixed fill values, and strings copied into zeroed fixed-length
 * buffers so bytes after a terminator never reach the file. Run.seconds is
 * stored as given; the harness zeroes it unless timings were asked for.
 *
 * Skipped runs are stored as attributes only (no datasets). A run that is not
 * skipped must have every array its shape calls for (NULL is fine only for a
 * zero-sized array).
 *
 * Returns KV_OK; KV_ERR_INPUT for a NULL argument, an inconsistent report
 * (a string field without a terminator, a negative size, a missing array, a
 * comparison naming a run out of range, an unknown kind or verdict; all
 * checked before anything is created) or a path that cannot be created
 * ("<path>: cannot create: <strerror>"); KV_ERR_INTERNAL when out of memory or
 * HDF5 fails while writing (the message ends with the innermost HDF5 error). */
KvStatus kv_report_write_h5(const KvReport *rep, const char *path, KvError *err);

/* Reads a report written by kv_report_write_h5 (or by another tool in the
 * same schema) into *out, which is overwritten without being freed first.
 * Every field round-trips exactly. Strings may be stored fixed- or
 * variable-length (h5py writes str attributes variable-length); numbers are
 * converted from any integer or float type of the right class.
 *
 * Returns KV_OK, or KV_ERR_INPUT for a missing or unreadable file, a file
 * that is not HDF5, a truncated file, another schema_version, a missing
 * group, dataset or attribute, a wrong type class, a string too long for its
 * field, or shapes that disagree with the run's size attributes; the message
 * reads "<path>: <object>: expected ..., found ...". KV_ERR_INTERNAL when out
 * of memory. On failure *out is all zero and nothing is left allocated. */
KvStatus kv_report_read_h5(const char *path, KvReport *out, KvError *err);

#endif
