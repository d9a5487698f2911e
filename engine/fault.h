/* fault.h: the planted-fault catalog (DESIGN §7).
 *
 * A planted fault is a deliberate bug of the kind sliding-window caches have
 * in the wild, selectable as a candidate (`kvrepro gate --fault NAME`, or
 * `--faults all` for the mutation score) and never part of a default run.
 * Each is implemented beside the code it corrupts (the cache variant, the
 * forward op or the graph runner); the CPU versions are the closest analog
 * of the GPU bug, and each says so where it is planted. The bits travel in
 * KvDecodeSpec.faults / KvBackendSetup.faults / KvCpuState.faults; 0 is a
 * clean run. */
#ifndef KV_FAULT_H
#define KV_FAULT_H

#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

enum {
    /* engine/cpu_state.c op_positions_planted: the step's position comes from a kernel
     * argument captured by value, so graph replays reuse the capture-time
     * position. */
    KV_FAULT_STALE_SCALAR = 1u << 0,
    /* engine/cpu_state.c cpu_keys_descending: the reduction order over the keys follows a
     * process-wide execution clock (as float atomics follow thread timing). */
    KV_FAULT_ATOMIC_REDUCTION = 1u << 1,
    /* cache_cat_shift.c / cache_roll.c: the shift done in place without a
     * temporary; on the CPU an overlapping copy in the wrong direction. */
    KV_FAULT_INPLACE_SHIFT = 1u << 2,
    /* engine/cpu_state.c cpu_mask_window: the attention mask admits q - W <= k (W + 1 keys). */
    KV_FAULT_WINDOW_OFF_BY_ONE = 1u << 3,
    /* cache_index_copy.c: a prefill longer than W stores its first W rows
     * instead of its last W. */
    KV_FAULT_PREFILL_FIRST_W = 1u << 4,
    /* engine/cpu_attention.c op_attn_variant: slot validity ignored, so never-written
     * slots (NaN-poisoned at reset) are read. */
    KV_FAULT_UNWRITTEN_SLOT = 1u << 5,
    /* graph_runner.c kv_graph_runner_step (policy ignore_regime): a
     * host-branch variant's graph is kept when its regime changes (filling
     * code replayed on a full cache). */
    KV_FAULT_NO_RECAPTURE = 1u << 6,
    /* engine/cpu_state.c cpu_matmul_tf32 (kvmath.c kv_matmul_tf32): TF32 in cuBLAS on the GPU; on the CPU every
     * matmul input rounded to 10 mantissa bits. */
    KV_FAULT_TF32 = 1u << 7,
    /* graph_runner.c kv_graph_runner_step (policy every_step): a graph captured before every
     * decode step although its capture key did not change, as a compiled
     * step recompiles each step when it guards on a scalar that changes
     * every step (the always-roll report). The outputs are bitwise the
     * clean ones; only the graph count (graph_budget) shows it. */
    KV_FAULT_RECAPTURE_EVERY_STEP = 1u << 8,
    /* cache_ring.c: position p written to slot (p + 1) % W instead of p % W,
     * and recorded there: the writer's bookkeeping is consistent, only the
     * layout rule attention reads by (layout.h) shows the mismatch. */
    KV_FAULT_RING_SLOT = 1u << 9,
    /* cache_dynamic.c: W slots kept instead of W - 1 (transformers' window
     * off by one in DynamicSlidingWindowLayer), positions recorded right. */
    KV_FAULT_DYNAMIC_KEEPS_W = 1u << 10,
    /* cache_index_copy.c: the sliding layer replaced by a static layer of W
     * slots (transformers' export path swaps StaticSlidingWindowLayer for
     * StaticLayer(max_cache_len), transformers #44181): no shift, position p written
     * to slot min(p, W - 1) and recorded there, so slots 0..W-2 keep the
     * first positions for ever and "generation beyond the window" reads
     * garbage from the first step past W. */
    KV_FAULT_STATIC_LAYER = 1u << 11,
    /* backend_cpu.c cpu_snapshot_load of KV_SNAP_PREFIX (CUDA: the same): the prefix-cache
     * entry aliases the live cyclic cache (TRT-LLM PR #2983), so restoring
     * it brings back the positions and the counts but not the sliding
     * layers' slots, which hold the first request's later tokens. */
    KV_FAULT_PREFIX_ALIAS = 1u << 12,
    /* engine/cpu_state.c op_positions_planted (CUDA: backend_rows.c feeds the pads): a
     * right-padded row's trailing pads take slots and positions, as a
     * static-shape loop that writes its whole padded chunk into the cache
     * and advances every row by the padded length (transformers #44742). The pads are
     * masked but fill the window, so a sliding layer sees fewer real keys
     * than the row run alone. */
    KV_FAULT_PAD_SLOTS = 1u << 13,
    /* shift.c kv_shift_slots (both backends): a context shift relabels and
     * re-rotates the cached keys but leaves every sliding slot where it
     * was, as an engine that takes the window by cell index (llama.cpp
     * #12357, the Gemma 3 gibberish after a context shift). Only a layout whose slot depends on
     * the absolute position (the ring's p % W) then reads the wrong keys. */
    KV_FAULT_SHIFT_CELLS = 1u << 14,
    /* cache_cat_shift.c / cache_roll.c, candidates/cuda/cuda_cache.cu: the
     * window's left shift done in place by one kernel over the whole
     * (B, W, kv_dim) cache, one element per thread, no staging buffer and
     * no ordering between blocks (pytorch #197829: an overlapping in-place
     * shift compiled into one kernel is right at small sizes and wrong,
     * differently each run, at large ones; pytorch #159855's class).
     * cat_shift's blocks walk the slots upwards, roll's downwards. On the
     * CPU the blocks run one after another in that order: deterministic,
     * right for cat_shift's walk, wrong at every slot for roll's. */
    KV_FAULT_RACY_SHIFT = 1u << 15,
};

#define KV_FAULT_COUNT 16

/* KV_FAULT_RACY_SHIFT's threads per block on the GPU, and the block its CPU
 * analog moves at a time: both cut the moved elements the same way. */
#define KV_RACY_SHIFT_BLOCK 256

/* The faults that change the forward's own computation (positions, the
 * reduction order, the mask, the slots gathered, the matmul precision)
 * rather than a variant's data movement or the graph rule: a run with one
 * planted computes its whole prefill, never the reference's shared one
 * (prefill_tape.h), as a real engine with such a bug would. */
#define KV_FAULTS_IN_FORWARD                                                                     \
    (KV_FAULT_STALE_SCALAR | KV_FAULT_ATOMIC_REDUCTION | KV_FAULT_WINDOW_OFF_BY_ONE |           \
     KV_FAULT_UNWRITTEN_SLOT | KV_FAULT_TF32)

typedef struct {
    unsigned bit;
    const char *name;      /* as on the command line */
    const char *where;     /* the file and function it is planted in */
    const char *acts_on;   /* the probe kind bisect should name ("cache", "attn", "q"); NULL
                            * when no probe differs (recapture_every_step: outputs unchanged) */
    const char *what;      /* one line: the bug it imitates */
} KvFaultInfo;

/* The catalog, in bit order; *count receives KV_FAULT_COUNT. */
const KvFaultInfo *kv_fault_all(int *count);
/* By name, or NULL. */
const KvFaultInfo *kv_fault_find(const char *name);
/* Writes the names of the bits in `faults`, comma-separated in catalog order
 * ("" for 0), NUL-terminated and truncated to n. */
void kv_fault_names(unsigned faults, char *out, size_t n);

#ifdef __cplusplus
}
#endif

#endif
