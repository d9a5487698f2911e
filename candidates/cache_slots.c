/* cache_slots.c: the slot buffers and create-time checks shared by the six
 * cache variants (cache_internal.h). Nothing here moves data between slots;
 * each variant's update, in its own file, does that. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "cache_internal.h"

/* True when B * W * dim floats (and the same count of any other element up
 * to 8 bytes) fit a size_t with room for the guards. */
static bool slots_shape_fits(int64_t batch, int64_t window, int64_t dim) {
    const uint64_t limit = (uint64_t)(SIZE_MAX / 16);
    uint64_t n = (uint64_t)batch;
    if ((uint64_t)window > limit / n) return false;
    n *= (uint64_t)window;
    return (uint64_t)dim <= limit / n;
}

KvStatus kv_slots_check_create(const char *variant, int64_t batch, int64_t window, int64_t dim,
                               KvSlidingCache **out, KvError *err) {
    if (out == NULL) return kv_error_set(err, KV_ERR_INPUT, "%s: create: out is NULL", variant);
    *out = NULL;
    if (batch < 1 || window < 1 || dim < 1) {
        return kv_error_set(err, KV_ERR_INPUT,
                            "%s: create: batch, window and dim must be >= 1, "
                            "got batch %lld, window %lld, dim %lld",
                            variant, (long long)batch, (long long)window, (long long)dim);
    }
    if (!slots_shape_fits(batch, window, dim)) {
        return kv_error_set(err, KV_ERR_INPUT,
                            "%s: create: batch %lld x window %lld x dim %lld "
                            "does not fit in memory sizes",
                            variant, (long long)batch, (long long)window, (long long)dim);
    }
    return KV_OK;
}

KvStatus kv_slots_oom_struct(const char *variant, KvError *err) {
    return kv_error_set(err, KV_ERR_INTERNAL, "%s: create: out of memory (cache struct)",
                        variant);
}

KvStatus kv_slots_oom_buffers(const char *variant, int64_t batch, int64_t window, int64_t dim,
                              KvError *err) {
    return kv_error_set(err, KV_ERR_INTERNAL,
                        "%s: create: out of memory for batch %lld x window %lld x dim %lld",
                        variant, (long long)batch, (long long)window, (long long)dim);
}

bool kv_slots_alloc(KvCacheSlots *s, int64_t batch, int64_t slots, int64_t dim) {
    s->batch = batch;
    s->slots = slots;
    s->dim = dim;
    const size_t n = (size_t)batch * (size_t)slots;
    const size_t fbytes = n * (size_t)dim * sizeof(float);
    s->k = kv_guard_alloc(fbytes);
    s->v = kv_guard_alloc(fbytes);
    s->real = kv_guard_alloc(n);
    s->pos = kv_guard_alloc((size_t)slots * sizeof(int64_t));
    return s->k != NULL && s->v != NULL && s->real != NULL && s->pos != NULL;
}

void kv_slots_free(KvCacheSlots *s) {
    kv_guard_free(s->k);
    kv_guard_free(s->v);
    kv_guard_free(s->real);
    kv_guard_free(s->pos);
    s->k = NULL;
    s->v = NULL;
    s->real = NULL;
    s->pos = NULL;
}

void kv_slots_clear(KvCacheSlots *s) {
    const int64_t n = s->batch * s->slots;
    const int64_t floats = n * s->dim;
    for (int64_t i = 0; i < floats; i++) {
        s->k[i] = NAN;
        s->v[i] = NAN;
    }
    memset(s->real, 0, (size_t)n);
    for (int64_t i = 0; i < s->slots; i++) s->pos[i] = -1;
}

bool kv_slots_ok(const KvCacheSlots *s) {
    return kv_guard_ok(s->k) && kv_guard_ok(s->v) && kv_guard_ok(s->real) && kv_guard_ok(s->pos);
}

void kv_slots_copy(KvCacheSlots *dst, const KvCacheSlots *src) {
    const size_t n = (size_t)src->batch * (size_t)src->slots;
    const size_t fbytes = n * (size_t)src->dim * sizeof(float);
    memcpy(dst->k, src->k, fbytes);
    memcpy(dst->v, src->v, fbytes);
    memcpy(dst->real, src->real, n);
    memcpy(dst->pos, src->pos, (size_t)src->slots * sizeof(int64_t));
}

KvCacheView kv_slots_view(const KvCacheSlots *s, int64_t n_slots) {
    return (KvCacheView){.n_slots = n_slots, .row_stride = s->slots, .dim = s->dim,
                         .k = s->k, .v = s->v, .pos = s->pos, .real = s->real};
}

KvCacheState kv_slots_state(KvCacheSlots *s, int64_t *counters, int64_t n_counters) {
    return (KvCacheState){.k = s->k, .v = s->v, .real = s->real, .pos = s->pos,
                          .counters = counters, .batch = s->batch, .slots = s->slots,
                          .dim = s->dim, .n_counters = n_counters};
}
