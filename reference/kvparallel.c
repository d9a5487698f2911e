/* kvparallel.c: the parallel-region threshold (kvparallel.h). */
#include "kvparallel.h"

static int64_t g_parallel_min_work = KV_PARALLEL_MIN_WORK;

void kv_set_parallel_min_work(int64_t work) {
    g_parallel_min_work = work < 0 ? 0 : work;
}

int64_t kv_parallel_min_work(void) {
    return g_parallel_min_work;
}
