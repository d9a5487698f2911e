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
 * earlier one) holding rec. src may equal dst: the copy is built as
 * "<dst>.tmp-<pid>", flushed and renamed, so dst is either untouched or
 * complete. Like the report writer, no object records a time, so the same
 * record on the same report gives the same bytes. KV_ERR_INPUT when a
 * tensor's index is negative or repeated (checked before anything is
 * written), or when src cannot be read or dst created, naming the file;
 * KV_ERR_INTERNAL when HDF5 fails. */
KvStatus kv_bisect_write_h5(const char *src, const char *dst, const KvBisectRecord *rec,
                            KvError *err);

#endif
