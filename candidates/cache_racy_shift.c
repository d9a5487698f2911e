/* cache_racy_shift.c: the CPU analog of the planted KV_FAULT_RACY_SHIFT
 * (fault.h), shared by the two variants that shift (cat_shift, roll). The
 * GPU form (cuda/cuda_cache.cu kv_cache_shift_racy_kernel) moves slot
 * (i + shift) % W to slot i in place, one element per thread, blocks of
 * KV_RACY_SHIFT_BLOCK threads with no ordering between them: a block whose
 * source slot another block has already overwritten reads the new value,
 * and which blocks ran first changes from run to run. Here the blocks run
 * one after another in the walk's order, each reading all of its sources
 * before it writes (as one block's threads do), so the result is fixed: an
 * upward walk is right, a downward one is wrong wherever a block's source
 * lies in a block written before it. */
#include "cache_internal.h"
#include "fault.h"

void kv_slots_shift_blocks(KvCacheSlots *s, int64_t window, int64_t count, int64_t shift,
                           bool downwards) {
    const int64_t B = s->batch, W = window, D = s->dim;
    const int64_t total = B * count * D; /* elements moved: (B, count, D) */
    const int64_t blocks = (total + KV_RACY_SHIFT_BLOCK - 1) / KV_RACY_SHIFT_BLOCK;
    float kb[KV_RACY_SHIFT_BLOCK], vb[KV_RACY_SHIFT_BLOCK];
    uint8_t rb[KV_RACY_SHIFT_BLOCK];
    for (int64_t k = 0; k < blocks; k++) {
        const int64_t blk = downwards ? blocks - 1 - k : k;
        const int64_t e0 = blk * KV_RACY_SHIFT_BLOCK;
        const int64_t n = total - e0 < KV_RACY_SHIFT_BLOCK ? total - e0 : KV_RACY_SHIFT_BLOCK;
        for (int pass = 0; pass < 2; pass++) { /* 0: every thread reads, 1: every thread writes */
            for (int64_t t = 0; t < n; t++) {
                const int64_t e = e0 + t;
                const int64_t b = e / (count * D), i = e / D % count, d = e % D;
                const int64_t dst = b * W + i, src = b * W + (i + shift) % W;
                if (pass == 0) {
                    kb[t] = s->k[src * D + d];
                    vb[t] = s->v[src * D + d];
                    rb[t] = s->real[src];
                } else {
                    s->k[dst * D + d] = kb[t];
                    s->v[dst * D + d] = vb[t];
                    if (d == 0) s->real[dst] = rb[t];
                }
            }
        }
    }
}
