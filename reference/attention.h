/* attention.h: the reference's attention over its static cache (slot =
 * position), and the pieces every attention op shares (forward.h declares
 * those for the engine's cache-variant attention). */
#ifndef KV_ATTENTION_H
#define KV_ATTENTION_H

#include <stdint.h>

#include "forward.h"

/* Launches layer l's store of the n new keys and values at their slots and
 * its attention over the static cache. */
void kv_ref_launch_static_attention(KvRefState *s, int64_t layer, int64_t n);

#endif
