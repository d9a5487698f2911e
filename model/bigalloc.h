/* bigalloc.h: allocation of large weight buffers. */
#ifndef KV_BIGALLOC_H
#define KV_BIGALLOC_H

#include <stddef.h>

/* Allocates `bytes` for a large, streamed-through buffer (weights). From
 * 32 MiB up the buffer is 2 MiB aligned and transparent huge pages are
 * requested (madvise) before first touch: a decode step streams every weight
 * once, and 4 KiB pages cost it TLB misses (measured: two-thread matvec 21 ->
 * 29 GB/s). Release with free(). NULL on failure. */
void *kv_big_alloc(size_t bytes);

#endif
