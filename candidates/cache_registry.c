/* cache_registry.c: the list of cache-update variants (DESIGN §3) and lookup
 * by name, so the CLI, the run matrix and the tests iterate one table instead
 * of naming the variants in several places. Reports and test loop indices
 * rely on the table's order: append, never reorder. */
#include <stddef.h>
#include <string.h>

#include "cache.h"
#include "cache_registry.h"

/* The count follows the table: a new variant is one line here (the CLI's
 * help and messages list the names from kv_cache_all). */
static const KvCacheOps *const kv_cache_table[] = {
    &kv_cache_index_copy, &kv_cache_cat_shift, &kv_cache_roll,
    &kv_cache_always_roll, &kv_cache_ring, &kv_cache_dynamic,
};
#define KV_CACHE_COUNT ((int)(sizeof kv_cache_table / sizeof kv_cache_table[0]))

const KvCacheOps *const *kv_cache_all(int *count) {
    if (count != NULL) *count = KV_CACHE_COUNT;
    return kv_cache_table;
}

/* transformers' layers as installed by the pinned transformers 5.23
 * (python/requirements.txt), read in its cache_utils.py:
 * StaticSlidingWindowLayer.update index_copies while filling and, once
 * full, rolls left by one and writes the last slot, keeping W slots
 * left-aligned (slot i holds total - W + i): roll's layout and movement; DynamicSlidingWindowLayer keeps the last W - 1 rows and
 * returns cat(cache, new): dynamic's. The lane's dynamic_sliding_md is that
 * same layer with mark_dynamic before each compiled step (transformers PR
 * #40328), a compile setting, not a layout. */
static const KvCacheAlias kv_cache_alias_table[] = {
    {"static_sliding", &kv_cache_roll,
     "transformers' StaticSlidingWindowLayer: index_copy while filling, roll(-1) and write the "
     "last slot once full"},
    {"dynamic_sliding", &kv_cache_dynamic,
     "transformers' DynamicSlidingWindowLayer: the last W - 1 rows, attention over "
     "cat(cache, new)"},
    {"dynamic_sliding_md", &kv_cache_dynamic,
     "the same DynamicSlidingWindowLayer, its growing dimensions marked dynamic for "
     "torch.compile (a compile setting, not a layout)"},
};
#define KV_CACHE_ALIAS_COUNT ((int)(sizeof kv_cache_alias_table / sizeof kv_cache_alias_table[0]))

const KvCacheAlias *kv_cache_aliases(int *count) {
    if (count != NULL) *count = KV_CACHE_ALIAS_COUNT;
    return kv_cache_alias_table;
}

const KvCacheOps *kv_cache_find(const char *name) {
    if (name == NULL) return NULL;
    for (int i = 0; i < KV_CACHE_COUNT; i++) {
        if (strcmp(kv_cache_table[i]->name, name) == 0) return kv_cache_table[i];
    }
    return NULL;
}

const KvCacheOps *kv_cache_find_typed(const char *name, const KvCacheAlias **alias_of) {
    if (alias_of != NULL) *alias_of = NULL;
    const KvCacheOps *ops = kv_cache_find(name);
    if (ops != NULL || name == NULL) return ops;
    for (int i = 0; i < KV_CACHE_ALIAS_COUNT; i++) {
        if (strcmp(kv_cache_alias_table[i].alias, name) == 0) {
            if (alias_of != NULL) *alias_of = &kv_cache_alias_table[i];
            return kv_cache_alias_table[i].ops;
        }
    }
    return NULL;
}
