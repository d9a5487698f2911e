/* cache_roll.c: the `roll` sliding-window cache variant (DESIGN §3), the
 * torch.roll formulation of transformers' sliding update with a host
 * `is_full` flag.
 *
 * Layout: W slots per row in ascending position (slot i holds i while
 * filling, total - W + i once full), the same as index_copy.
 *
 * Data movement for one new token, with the regime chosen on the host from
 * host_total (is_full = host_total >= W):
 *   - filling: index_copy of the new row into the cache at slot
 *     clamp(p, 0, W - 1), p read from *total;
 *   - full: roll(keys, -1) into a separate output buffer (out[i] =
 *     in[(i + 1) % W], done as the two contiguous block copies torch.roll
 *     makes), copied back over the cache, then the new row is written into
 *     the last slot (which the roll filled with the oldest row).
 * For n > 1 new tokens: roll left by the number of positions that leave the
 * window (through the same output buffer), then write the new rows that stay
 * at their slots; of a prefill longer than W only the last W rows.
 *
 * Why it exists: like cat_shift it is a host branch baked into a captured
 * graph, but its data movement wraps around: the slot that receives the new
 * row first holds the oldest row, so a skipped or stale write leaves a
 * plausible-looking but wrong key there instead of an empty slot. The bugs
 * this shape has in the wild: a graph not re-captured when is_full flips,
 * and a roll done in place. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cache_internal.h"
#include "cache_registry.h"
#include "fault.h"

struct KvSlidingCache {
    const KvCacheOps *ops; /* &kv_cache_roll: a handle given to another table is refused */
    int64_t window;        /* W */
    KvCacheSlots cur;      /* W slots per row, the ones attention reads */
    /* torch.roll's output tensor: never the input, so the roll cannot race. */
    KvCacheSlots out;      /* W slots per row, same shape as cur */
    unsigned faults;       /* planted: KV_FAULT_INPLACE_SHIFT, KV_FAULT_RACY_SHIFT or 0 */
};

static void roll_destroy(KvSlidingCache *c) {
    if (c == NULL) return;
    kv_slots_free(&c->cur);
    kv_slots_free(&c->out);
    free(c);
}

static void roll_reset(KvSlidingCache *c) {
    if (c == NULL || c->ops != &kv_cache_roll) return;
    kv_slots_clear(&c->cur);
    kv_slots_clear(&c->out);
}

static KvStatus roll_create(int64_t batch, int64_t window, int64_t dim, KvSlidingCache **out,
                            KvError *err) {
    KvStatus st = kv_slots_check_create("roll", batch, window, dim, out, err);
    if (st != KV_OK) return st;
    KvSlidingCache *c = calloc(1, sizeof *c);
    if (c == NULL) {
        st = kv_slots_oom_struct("roll", err);
        goto cleanup;
    }
    c->ops = &kv_cache_roll;
    c->window = window;
    if (!kv_slots_alloc(&c->cur, batch, window, dim) ||
        !kv_slots_alloc(&c->out, batch, window, dim)) {
        st = kv_slots_oom_buffers("roll", batch, window, dim, err);
        goto cleanup;
    }
    roll_reset(c);
    *out = c;
    c = NULL;
cleanup:
    roll_destroy(c);
    return st;
}

/* out = torch.roll(in, -shift, dims=slot) for `rows` rows of W elements of
 * elem_bytes each: out[r, i] = in[r, (i + shift) % W], as two contiguous
 * block copies per row (the tail moves to the front, the head wraps to the
 * back). 0 <= shift < W. */
static void roll_left_rows(const void *in, void *out, int64_t rows, int64_t W, size_t elem_bytes,
                           int64_t shift) {
    const unsigned char *src = in;
    unsigned char *dst = out;
    const size_t row_bytes = (size_t)W * elem_bytes;
    const size_t head = (size_t)shift * elem_bytes;
    for (int64_t r = 0; r < rows; r++) {
        const unsigned char *s = src + (size_t)r * row_bytes;
        unsigned char *d = dst + (size_t)r * row_bytes;
        memcpy(d, s + head, row_bytes - head);
        memcpy(d + (row_bytes - head), s, head);
    }
}

/* Planted KV_FAULT_INPLACE_SHIFT (fault.h): the roll written straight into
 * the cache, no output buffer. On a GPU the blocks race; the CPU analog is
 * the overlapping copy in the wrong direction: slot i takes slot i + shift
 * walking down from the top, so it reads rows this pass already overwrote,
 * and the wrapped head reads overwritten rows too. Positions are bookkeeping
 * and roll correctly through the output buffer, so the cache looks right. */
static void roll_shift_left_inplace(KvSlidingCache *c, int64_t shift) {
    KvCacheSlots *cur = &c->cur;
    const int64_t B = cur->batch, W = c->window, D = cur->dim;
    const size_t row_bytes = (size_t)D * sizeof(float);
    for (int64_t b = 0; b < B; b++) {
        for (int64_t i = W - 1; i >= 0; i--) {
            const int64_t src = b * W + (i + shift) % W;
            const int64_t dst = b * W + i;
            memcpy(cur->k + dst * D, cur->k + src * D, row_bytes);
            memcpy(cur->v + dst * D, cur->v + src * D, row_bytes);
            cur->real[dst] = cur->real[src];
        }
    }
    roll_left_rows(cur->pos, c->out.pos, 1, W, sizeof(int64_t), shift);
    memcpy(cur->pos, c->out.pos, (size_t)W * sizeof(int64_t));
}

/* keys = roll(keys, -shift) through the output buffers, then copied back (a
 * copy, not a swap: the view's pointers stay fixed for a captured graph). */
static void roll_shift_left(KvSlidingCache *c, int64_t shift) {
    if (c->faults & KV_FAULT_INPLACE_SHIFT) {
        roll_shift_left_inplace(c, shift);
        return;
    }
    if (c->faults & KV_FAULT_RACY_SHIFT) {
        /* Planted KV_FAULT_RACY_SHIFT (fault.h): the roll in place by blocks
         * walking downwards, in order (cache_racy_shift.c); positions roll
         * right through the output buffer. */
        kv_slots_shift_blocks(&c->cur, c->window, c->window, shift, true);
        roll_left_rows(c->cur.pos, c->out.pos, 1, c->window, sizeof(int64_t), shift);
        memcpy(c->cur.pos, c->out.pos, (size_t)c->window * sizeof(int64_t));
        return;
    }
    const KvCacheSlots *cur = &c->cur;
    KvCacheSlots *out = &c->out;
    const int64_t B = cur->batch, W = c->window;
    const size_t fslot = (size_t)cur->dim * sizeof(float);
    roll_left_rows(cur->k, out->k, B, W, fslot, shift);
    roll_left_rows(cur->v, out->v, B, W, fslot, shift);
    roll_left_rows(cur->real, out->real, B, W, 1, shift);
    roll_left_rows(cur->pos, out->pos, 1, W, sizeof(int64_t), shift);
    kv_slots_copy(&c->cur, out);
}

/* keys[:, slot] = new[:, j]. k_new, v_new: (B, n, dim); real_new: (B, n). */
static void roll_write_slot(KvSlidingCache *c, int64_t slot, const float *k_new,
                            const float *v_new, const uint8_t *real_new, int64_t n, int64_t j,
                            int64_t position) {
    KvCacheSlots *cur = &c->cur;
    const int64_t W = c->window, D = cur->dim;
    const size_t row_bytes = (size_t)D * sizeof(float);
    for (int64_t b = 0; b < cur->batch; b++) {
        memcpy(cur->k + (b * W + slot) * D, k_new + (b * n + j) * D, row_bytes);
        memcpy(cur->v + (b * W + slot) * D, v_new + (b * n + j) * D, row_bytes);
        cur->real[b * W + slot] = real_new[b * n + j];
    }
    cur->pos[slot] = position;
}

static int roll_regime(const KvSlidingCache *c, int64_t host_total) {
    if (c == NULL) return 0;
    return host_total >= c->window ? 1 : 0;
}

/* Two graphs: one per side of the host is_full branch, which a graph bakes
 * in (transformers' one recompile when the window fills). A decode that
 * never crosses W needs only one; the budget is the design's most. */
static int64_t roll_graph_budget(int64_t window, int64_t prompt_len, int64_t decode_steps) {
    (void)window;
    (void)prompt_len;
    return decode_steps > 0 ? 2 : 0;
}

/* k_new, v_new: (B, n, dim); real_new: (B, n); *total: positions stored before
 * this call (the device scalar); host_total: the host's count. */
static void roll_update(KvSlidingCache *c, const float *k_new, const float *v_new,
                        const uint8_t *real_new, int64_t n, const int64_t *total,
                        int64_t host_total) {
    if (c == NULL || c->ops != &kv_cache_roll || total == NULL || n < 1) return;
    const int64_t W = c->window;
    /* Positions come from the device scalar; host_total only picks the regime. */
    const int64_t p0 = *total;
    if (p0 < 0) return; /* not a position: nothing sensible to store */

    if (n == 1) {
        if (roll_regime(c, host_total) == 0) {
            /* Filling: index_copy at the position (clamped as transformers
             * does, which keeps a stale regime in bounds). */
            roll_write_slot(c, p0 < W - 1 ? p0 : W - 1, k_new, v_new, real_new, 1, 0, p0);
        } else {
            /* Full: roll(-1) moves the oldest row into the last slot, which
             * the new row then replaces. */
            roll_shift_left(c, 1 % W);
            roll_write_slot(c, W - 1, k_new, v_new, real_new, 1, 0, p0);
        }
        return;
    }

    /* n > 1: slot i holds first + i before and first' + i after: roll left by
     * first' - first. When that is W or more nothing old survives and the new
     * rows cover every slot, so the roll is skipped. */
    const int64_t end = p0 + n;
    const int64_t first_old = p0 > W ? p0 - W : 0;
    const int64_t first_new = end > W ? end - W : 0;
    const int64_t shift = first_new - first_old;
    if (shift > 0 && shift < W) roll_shift_left(c, shift);
    const int64_t j0 = first_new > p0 ? first_new - p0 : 0;
    for (int64_t j = j0; j < n; j++) {
        roll_write_slot(c, p0 + j - first_new, k_new, v_new, real_new, n, j, p0 + j);
    }
}

static void roll_plant(KvSlidingCache *c, unsigned faults) {
    if (c == NULL || c->ops != &kv_cache_roll) return;
    c->faults = faults & (KV_FAULT_INPLACE_SHIFT | KV_FAULT_RACY_SHIFT);
}

static KvCacheView roll_view(const KvSlidingCache *c) {
    if (c == NULL || c->ops != &kv_cache_roll) return (KvCacheView){0};
    return kv_slots_view(&c->cur, c->window);
}

static bool roll_sentinels_ok(const KvSlidingCache *c) {
    if (c == NULL || c->ops != &kv_cache_roll) return false;
    return kv_slots_ok(&c->cur) && kv_slots_ok(&c->out);
}

/* The persistent state: the slots; temporaries are scratch. */
static KvCacheState roll_state(KvSlidingCache *c) {
    return kv_slots_state(&c->cur, NULL, 0);
}

const KvCacheOps kv_cache_roll = {
    .name = "roll",
    .one_token_order = KV_ATTEND_AFTER_UPDATE,
    .host_branch = true,
    .host_shape = false,
    .layout = KV_LAYOUT_LEFT_ALIGNED,
    .create = roll_create,
    .destroy = roll_destroy,
    .reset = roll_reset,
    .update = roll_update,
    .view = roll_view,
    .regime = roll_regime,
    .sentinels_ok = roll_sentinels_ok,
    .state = roll_state,
    .plant = roll_plant,
    .graph_budget = roll_graph_budget,
};
