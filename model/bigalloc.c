/* bigalloc.c: huge-page-friendly allocation for weight buffers (Linux
 * madvise; elsewhere a plain aligned allocation). */
#define _DEFAULT_SOURCE /* MADV_HUGEPAGE */
#include "bigalloc.h"

#include <stdlib.h>
#include <sys/mman.h>

#define KV_BIG_MIN ((size_t)32 << 20)
#define KV_HUGE_PAGE ((size_t)2 << 20)

void *kv_big_alloc(size_t bytes) {
    if (bytes < KV_BIG_MIN) return malloc(bytes > 0 ? bytes : 1);
    void *p = NULL;
    if (posix_memalign(&p, KV_HUGE_PAGE, bytes) != 0) return NULL;
#ifdef MADV_HUGEPAGE
    /* Advice only: failure (THP disabled) leaves ordinary pages. */
    size_t whole = bytes & ~(KV_HUGE_PAGE - 1);
    if (whole > 0) (void)madvise(p, whole, MADV_HUGEPAGE);
#endif
    return p;
}
