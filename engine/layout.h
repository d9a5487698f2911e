/* layout.h: each cache variant's layout rule (DESIGN §3): which absolute
 * position a slot holds, computed the way a real kernel computes it, from the
 * variant's own rule and the number of positions stored, never from a side
 * table.
 *
 * Why a rule and not the recorded pos[]: attention that gathers keys by the
 * positions the writer itself recorded agrees with any writer, right or
 * wrong. A ring writing slot (p + 1) % W records pos[(p + 1) % W] = p and
 * attention finds p there, so outputs stay bitwise correct and only a unit
 * test sees the bug. Engines (and the CUDA kernels here) do not keep such a
 * table: ring attention reads slot p % W, always-roll attention takes slot i
 * as total - W + i. Reading through the rule makes a writer/reader mismatch
 * change the attended keys, which the gate sees and bisect locates; the
 * recorded pos[] stays as an independent check (the cache probe hashes it
 * wherever it disagrees with the rule).
 *
 * Plain C, no state: the CPU forward and the CUDA kernels include it
 * (KV_LAYOUT_FN marks it __host__ __device__ under nvcc). */
#ifndef KV_LAYOUT_H
#define KV_LAYOUT_H

#include <stdint.h>

#ifdef __CUDACC__
#define KV_LAYOUT_FN static inline __host__ __device__
#else
#define KV_LAYOUT_FN static inline
#endif

typedef enum {
    /* index_copy, cat_shift, roll: W slots in ascending position, left
     * aligned: slot i holds i while filling, total - W + i once full. */
    KV_LAYOUT_LEFT_ALIGNED = 0,
    /* always_roll: right aligned, slot i holds total - W + i, empty while
     * that is negative. */
    KV_LAYOUT_RIGHT_ALIGNED = 1,
    /* ring: position p in slot p % W, for the last min(total, W) positions. */
    KV_LAYOUT_RING = 2,
    /* dynamic: W - 1 slots, the filled ones (min(total, W - 1)) holding the
     * newest positions in ascending order from slot 0. */
    KV_LAYOUT_GROWING = 3,
} KvLayoutRule;

/* The position slot `slot` holds by `rule` once `total` positions (padded
 * slots included, DESIGN §2) are stored in a cache of window `window`, or -1
 * when the rule says the slot is empty (or is outside the rule's capacity:
 * slot >= W, or >= W - 1 for dynamic). */
KV_LAYOUT_FN int64_t kv_layout_position(KvLayoutRule rule, int64_t window, int64_t slot,
                                        int64_t total) {
    if (slot < 0 || window < 1 || total < 1) return -1;
    switch (rule) {
    case KV_LAYOUT_LEFT_ALIGNED:
        if (slot >= window) return -1;
        if (total <= window) return slot < total ? slot : -1;
        return total - window + slot;
    case KV_LAYOUT_RIGHT_ALIGNED: {
        if (slot >= window) return -1;
        const int64_t p = total - window + slot;
        return p >= 0 ? p : -1;
    }
    case KV_LAYOUT_RING:
        if (slot >= window || slot >= total) return -1;
        /* the newest p < total with p % W == slot */
        return slot + window * ((total - 1 - slot) / window);
    case KV_LAYOUT_GROWING: {
        const int64_t cap = window - 1;
        const int64_t filled = total < cap ? total : cap;
        if (slot >= filled) return -1;
        return total - filled + slot;
    }
    }
    return -1;
}

#endif
