/* cache_registry.h: the cache variants (DESIGN §3), by name. The one list
 * is the table in cache_registry.c: a new variant is its own file plus its
 * line there; the names users see (help, errors) are read from it. */
#ifndef KV_CACHE_REGISTRY_H
#define KV_CACHE_REGISTRY_H

#include "cache.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The six variants of DESIGN §3 (a new one adds its line here). */
extern const KvCacheOps kv_cache_index_copy;
extern const KvCacheOps kv_cache_cat_shift;
extern const KvCacheOps kv_cache_roll;
extern const KvCacheOps kv_cache_always_roll;
extern const KvCacheOps kv_cache_ring;
extern const KvCacheOps kv_cache_dynamic;

/* All variants, in table order; *count receives their number. */
const KvCacheOps *const *kv_cache_all(int *count);
/* By name, or NULL. */
const KvCacheOps *kv_cache_find(const char *name);

#ifdef __cplusplus
}
#endif

#endif
