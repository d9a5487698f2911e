/* cache_snapshot.c: snapshots of a cache variant's persistent state, for the
 * replay check (DESIGN §4): the same step replayed K times from one
 * snapshot must give bitwise identical outputs. */
#include <string.h>

#include "cache.h"

static size_t snapshot_part_bytes(const KvCacheState *st, int part) {
    const size_t rows = (size_t)(st->batch * st->slots);
    switch (part) {
    case 0: /* k */
    case 1: /* v */
        return rows * (size_t)st->dim * sizeof(float);
    case 2:
        return rows; /* real */
    case 3:
        return (size_t)st->slots * sizeof(int64_t); /* pos */
    default:
        return (size_t)st->n_counters * sizeof(int64_t); /* counters */
    }
}

static void *snapshot_part_ptr(const KvCacheState *st, int part) {
    void *parts[5] = {st->k, st->v, st->real, st->pos, st->counters};
    return parts[part];
}

size_t kv_cache_snapshot_bytes(const KvCacheOps *ops, KvSlidingCache *c) {
    const KvCacheState st = ops->state(c);
    size_t n = 0;
    for (int part = 0; part < 5; part++) n += snapshot_part_bytes(&st, part);
    return n;
}

void kv_cache_snapshot_save(const KvCacheOps *ops, KvSlidingCache *c, void *dst) {
    const KvCacheState st = ops->state(c);
    unsigned char *out = dst;
    for (int part = 0; part < 5; part++) {
        const size_t n = snapshot_part_bytes(&st, part);
        if (n > 0) memcpy(out, snapshot_part_ptr(&st, part), n);
        out += n;
    }
}

void kv_cache_snapshot_load(const KvCacheOps *ops, KvSlidingCache *c, const void *src) {
    const KvCacheState st = ops->state(c);
    const unsigned char *in = src;
    for (int part = 0; part < 5; part++) {
        const size_t n = snapshot_part_bytes(&st, part);
        if (n > 0) memcpy(snapshot_part_ptr(&st, part), in, n);
        in += n;
    }
}

void kv_cache_snapshot_load_counters(const KvCacheOps *ops, KvSlidingCache *c, const void *src) {
    const KvCacheState st = ops->state(c);
    const unsigned char *in = src;
    for (int part = 0; part < 4; part++) in += snapshot_part_bytes(&st, part);
    const size_t n = snapshot_part_bytes(&st, 4);
    if (n > 0) memcpy(snapshot_part_ptr(&st, 4), in, n);
}
