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

const KvCacheOps *kv_cache_find(const char *name) {
    if (name == NULL) return NULL;
    for (int i = 0; i < KV_CACHE_COUNT; i++) {
        if (strcmp(kv_cache_table[i]->name, name) == 0) return kv_cache_table[i];
    }
    return NULL;
}
