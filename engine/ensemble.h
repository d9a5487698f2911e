/* ensemble.h: reduction orders for tolerance calibration (DESIGN §6,
 * "Calibrated tolerances").
 *
 * The reference fixes one reduction order so that it is bitwise
 * reproducible; other implementations (cuBLAS, torch, another engine) sum in
 * other, equally valid orders and land a few ulps away. How far apart valid
 * orders land depends on the model (width, depth, logit scale) and the
 * prompts, so a fixed tolerance is either loose on tiny models or raises
 * false alarms on real ones. The gate therefore runs the reference again
 * under each order below (the ensemble, after the climate-model consistency
 * test) and measures the spread; the tolerance comes from it (compare.h).
 *
 * Each order is a legitimate implementation choice, never a bug: keys read
 * newest first, matmul outputs summed by one sequential accumulator, or
 * both. They are not planted faults, and runs carrying them are reported
 * as "reference~ORDER". */
#ifndef KV_ENSEMBLE_H
#define KV_ENSEMBLE_H

#include <stddef.h>

enum {
    /* attention reduces over the visible keys in descending position (a
     * kernel walking the cache newest first) */
    KV_ORDER_KEYS_REVERSED = 1u << 0,
    /* every projection and the lm_head as kv_matmul_sequential: one
     * accumulator per output in ascending index (a naive kernel) */
    KV_ORDER_DOT_SEQUENTIAL = 1u << 1,
};

/* The ensemble members, in the order the gate runs them. */
#define KV_ENSEMBLE_SIZE 3
static inline unsigned kv_ensemble_member(int i) {
    return i == 0 ? KV_ORDER_KEYS_REVERSED
           : i == 1 ? KV_ORDER_DOT_SEQUENTIAL
                    : KV_ORDER_KEYS_REVERSED | KV_ORDER_DOT_SEQUENTIAL;
}

/* "keys_reversed", "dot_sequential", "keys_reversed+dot_sequential"; "" for
 * 0. Writes at most n bytes, NUL-terminated. */
static inline void kv_order_name(unsigned order, char *out, size_t n) {
    if (n == 0) return;
    const char *name = "";
    if (order == KV_ORDER_KEYS_REVERSED) name = "keys_reversed";
    if (order == KV_ORDER_DOT_SEQUENTIAL) name = "dot_sequential";
    if (order == (KV_ORDER_KEYS_REVERSED | KV_ORDER_DOT_SEQUENTIAL)) {
        name = "keys_reversed+dot_sequential";
    }
    size_t i = 0;
    for (; name[i] != '\0' && i + 1 < n; i++) out[i] = name[i];
    out[i] = '\0';
}

#endif
