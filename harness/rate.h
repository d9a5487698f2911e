/* rate.h: how fast this machine runs the reference's kernels, measured in
 * a fraction of a second before a gate starts, so that the gate can state
 * its wall time up front (the work line) and its ETA as it goes. A decode
 * is two kinds of work: prefill positions, many rows through each weight
 * (compute-bound), and decode steps, a few rows through every weight
 * (bound by streaming the weights from memory). */
#ifndef KV_RATE_H
#define KV_RATE_H

#include <stdbool.h>
#include <stdint.h>

#include "config.h"
#include "status.h"

typedef struct {
    double mac_s;     /* seconds per multiply-add of a many-row matmul (kv_matmul) */
    double seq_mac_s; /* the same in the sequential order (a calibration member's) */
    double byte_s;    /* seconds per weight byte of a one-row matmul over weights far larger
                       * than the caches (a decode step) */
} KvRate;

/* Measures *r with matmuls of cfg's hidden and intermediate sizes. */
KvStatus kv_rate_measure(const KvConfig *cfg, KvRate *r, KvError *err);

/* The cost of one decode of cfg's model on the CPU, in seconds at rate r:
 * `prefill` positions (rows x columns, all rows' columns of every prefill
 * forward) and `steps` one-token forwards of `batch` rows, attending
 * `keys` (query, key) pairs per layer summed over the decode; seq: in the
 * sequential order (a calibration member). */
double kv_rate_decode_seconds(const KvConfig *cfg, const KvRate *r, int64_t prefill,
                              int64_t steps, int64_t batch, double keys, bool seq);

#endif
