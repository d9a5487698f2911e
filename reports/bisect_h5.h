/* bisect_h5.h: the /bisect group of a report (docs/SCHEMA.md): the full
 * values of the probe at which two runs first differ, and of its inputs,
 * from both reruns of `kvrepro bisect --rerun`. Each probe's group is named
 * by its index (/bisect/probe_NNNN), never by its name: a recorded name may
 * hold '/' or '.', or repeat, and must still give a valid, unique path. */
#ifndef KV_BISECT_H5_H
#define KV_BISECT_H5_H

#include <stdint.h>

#include "status.h"

typedef struct {
    int64_t index;        /* probe index into the runs' probe_names: the group name */
    const char *name;     /* probe name, e.g. "layer0.cache": an attribute, any text */
    const char *role;     /* "diverged" (the located probe) or "input" */
    int64_t batch;
    int64_t len_a, len_b; /* floats per row in each run */
    const float *a;       /* (batch, len_a) */
    const float *b;       /* (batch, len_b) */
} KvBisectTensorOut;

typedef struct {
    const char *label_a, *label_b; /* the runs, as "report:runs/NNNN model/scenario/..." */
    int64_t step, row, probe;      /* the first divergence the reruns' values show */
    const char *probe_name;
    const KvBisectTensorOut *tensors; /* (n_tensors) */
    int n_tensors;
    /* The point the recorded probe hashes named: step, row, probe above
     * unless the rerun walked back from it (kv_bisect_walk_back). */
    int64_t hash_step, hash_row, hash_probe;
    const char *hash_probe_name;
} KvBisectRecord;

/* Copies the report at src to dst with a /bisect group (replacing any
 * earlier one) holding rec. src may equal dst. The copy is built in memory
 * (HDF5's core driver over src's bytes) and written by
 * kv_report_file_publish (report.h), as the report writer writes a report:
 * dst is either untouched or complete, no link at dst or at the temporary's
 * name is followed, a dst that exists and is not a regular file is refused,
 * a killed writer leaves no temporary and temporaries of dead writers are
 * removed. Like the report writer, no object records a time, so the same
 * record on the same report gives the same bytes. KV_ERR_INPUT when a
 * tensor's index is negative or repeated (checked before anything is
 * written), when src cannot be read or is not HDF5, when its /bisect group
 * is damaged (kv_bisect_check_h5), or when dst cannot be created or
 * written, naming the file; KV_ERR_INTERNAL when HDF5 fails otherwise. */
KvStatus kv_bisect_write_h5(const char *src, const char *dst, const KvBisectRecord *rec,
                            KvError *err);

/* Checks that the report at src can take a new /bisect group: it is HDF5,
 * and any /bisect it has is one HDF5 can walk (every object under it
 * opens), since replacing it frees all of it. KV_ERR_INPUT "<src>: /bisect:
 * expected a group that bisect --rerun can replace, found a damaged one
 * (HDF5 ...)"; nothing is written. `bisect --rerun` calls it before the
 * rerun, kv_bisect_write_h5 again before changing anything. */
KvStatus kv_bisect_check_h5(const char *src, KvError *err);

#endif
