/* moe.h: gpt_oss's mixture-of-experts MLP as one op of the reference. */
#ifndef KV_MOE_H
#define KV_MOE_H

#include <stdint.h>

#include "state.h"

/* Launches the MoE block over s->xn (rows, hidden) into s->tmp (rows,
 * hidden); mm: the matmul (NULL: kv_matmul). */
void kv_ref_launch_moe(KvRefState *s, const KvLayerWeights *w, int64_t rows, KvMatmulFn mm);

#endif
