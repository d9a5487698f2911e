/* rate.h: how fast this machine runs the reference's kernels, measured in
 * a fraction of a second before a gate starts, so that the gate can state
 * its wall time up front (the work line) and its ETA as it goes. A decode
 * is three kinds of work: prefill positions, many rows through each weight
 * (compute-bound); decode steps, a few rows through every weight (bound by
 * streaming the weights from memory); and the attention, each query head
 * over the keys it sees, which a long prompt at a large window makes the
 * biggest of the three (gemma-2-2b's 4096-token window, head_dim 256). */
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
    double pair_s;    /* seconds per (query head, key) pair of the attention (kv_attend at the
                       * model's head_dim over keys spaced as in its cache) */
    double hash_byte_s; /* seconds per byte of the probe hash (kv_probe_hash_bytes): a run
                         * hashes every layer's cache at every step */
} KvRate;

/* The weights of one layer of cfg's model (q, k, v, o and the MLP) with
 * `experts` of its experts (1 for a dense model): the multiply-adds a token
 * does there with the experts it runs, the parameters with all of them. */
double kv_rate_layer_weights(const KvConfig *cfg, double experts);

/* Measures *r with matmuls of cfg's hidden and intermediate sizes. */
KvStatus kv_rate_measure(const KvConfig *cfg, KvRate *r, KvError *err);

/* The cost of one decode of cfg's model on the CPU, in seconds at rate r:
 * `prefill` positions (rows x columns, all rows' columns of every prefill
 * forward) and `steps` one-token forwards of `batch` rows, attending
 * `keys` (query, key) pairs summed over the rows, the layers and the
 * decode (each pair once per query head); seq: in the sequential order (a
 * calibration member). */
double kv_rate_decode_seconds(const KvConfig *cfg, const KvRate *r, int64_t prefill,
                              int64_t steps, int64_t batch, double keys, bool seq);

#endif
