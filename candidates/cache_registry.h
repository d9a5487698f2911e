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

/* Another surface's name for a variant's layout: transformers' cache layers
 * as the transformers lane names them (kvrepro-hf capture --cache), each
 * the same layout and data movement as one variant here, so `gate
 * --variants` takes them for that variant (docs/cli.md, "Names"). */
typedef struct {
    const char *alias;      /* e.g. "static_sliding" */
    const KvCacheOps *ops;  /* the variant it names */
    const char *why;        /* what makes it the same layout, one clause */
} KvCacheAlias;

/* The aliases, in the order help texts list them; *count receives their
 * number. */
const KvCacheAlias *kv_cache_aliases(int *count);

/* By name, or NULL. Only the variants' own names (KvCacheOps.name): what a
 * report records and the registry's tests iterate. */
const KvCacheOps *kv_cache_find(const char *name);

/* By a name a user typed: a variant's own name or an alias; NULL when it
 * is neither. *alias_of is set to the alias entry when name is one (NULL
 * otherwise; alias_of may be NULL). */
const KvCacheOps *kv_cache_find_typed(const char *name, const KvCacheAlias **alias_of);

#ifdef __cplusplus
}
#endif

#endif
