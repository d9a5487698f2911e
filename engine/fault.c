/* fault.c: the planted-fault catalog (fault.h). */
#include "fault.h"

#include <stdio.h>
#include <string.h>

static const KvFaultInfo k_faults[KV_FAULT_COUNT] = {
    {KV_FAULT_STALE_SCALAR, "stale_scalar", "engine/cpu_state.c op_positions_planted", "cache",
     "the position is a kernel argument captured by value: graph replays reuse it"},
    {KV_FAULT_ATOMIC_REDUCTION, "atomic_reduction", "engine/cpu_state.c cpu_keys_descending", "attn",
     "attention's reduction order follows execution timing (float atomics)"},
    {KV_FAULT_INPLACE_SHIFT, "inplace_shift", "candidates/cache_cat_shift.c, cache_roll.c",
     "cache", "the window shift done in place, overlapping, in the wrong direction"},
    {KV_FAULT_WINDOW_OFF_BY_ONE, "window_off_by_one", "engine/cpu_state.c cpu_mask_window",
     "attn", "the mask admits q - W <= k: W + 1 keys"},
    {KV_FAULT_PREFILL_FIRST_W, "prefill_first_w", "candidates/cache_index_copy.c", "cache",
     "a prefill longer than W stores its first W rows instead of its last W"},
    {KV_FAULT_UNWRITTEN_SLOT, "unwritten_slot", "engine/cpu_attention.c op_attn_variant", "attn",
     "the mask ignores slot validity: never-written (NaN) slots are read"},
    {KV_FAULT_NO_RECAPTURE, "no_recapture", "engine/graph_runner.c kv_graph_runner_step",
     "cache", "a host-branch variant's graph is kept when its regime changes"},
    {KV_FAULT_TF32, "tf32", "engine/cpu_state.c cpu_matmul_tf32", "q",
     "TF32 matmuls: inputs rounded to 10 mantissa bits"},
    {KV_FAULT_RECAPTURE_EVERY_STEP, "recapture_every_step",
     "engine/graph_runner.c kv_graph_runner_step", NULL,
     "the decode graph re-captured every step (a recompile per step); outputs unchanged"},
    {KV_FAULT_RING_SLOT, "ring_slot", "candidates/cache_ring.c", "cache",
     "the ring writes position p to slot (p + 1) % W (recorded there), attention reads p % W"},
    {KV_FAULT_DYNAMIC_KEEPS_W, "dynamic_keeps_w", "candidates/cache_dynamic.c", "cache",
     "the dynamic cache keeps W slots instead of W - 1 (recorded right)"},
    {KV_FAULT_STATIC_LAYER, "static_layer", "candidates/cache_index_copy.c", "cache",
     "the sliding layer exported as a static layer of W slots: writes clamped at W - 1"},
    {KV_FAULT_PREFIX_ALIAS, "prefix_alias", "engine/backend_cpu.c cpu_snapshot_copy", "cache",
     "a reused prefix-cache entry aliases the live cyclic cache: its slots were overwritten"},
    {KV_FAULT_PAD_SLOTS, "pad_slots", "engine/cpu_state.c op_positions_planted", "cache",
     "right pads take slots and positions: they crowd real keys out of the window"},
    {KV_FAULT_SHIFT_CELLS, "shift_cells", "engine/shift.c kv_shift_slots", "cache",
     "a context shift keeps each sliding slot in its cell: the ring's p % W no longer holds"},
    {KV_FAULT_RACY_SHIFT, "racy_shift", "candidates/cache_cat_shift.c, cache_roll.c, cuda/cuda_cache.cu",
     "cache", "the shift in place by many unordered blocks: a GPU race (CPU: blocks in order)"},
};

const KvFaultInfo *kv_fault_all(int *count) {
    if (count != NULL) *count = KV_FAULT_COUNT;
    return k_faults;
}

const KvFaultInfo *kv_fault_find(const char *name) {
    for (int i = 0; name != NULL && i < KV_FAULT_COUNT; i++) {
        if (strcmp(k_faults[i].name, name) == 0) return &k_faults[i];
    }
    return NULL;
}

void kv_fault_names(unsigned faults, char *out, size_t n) {
    if (n == 0) return;
    out[0] = '\0';
    size_t used = 0;
    for (int i = 0; i < KV_FAULT_COUNT; i++) {
        if (!(faults & k_faults[i].bit)) continue;
        int w = snprintf(out + used, n - used, "%s%s", used > 0 ? "," : "", k_faults[i].name);
        if (w < 0 || (size_t)w >= n - used) return; /* truncated, still terminated */
        used += (size_t)w;
    }
}
