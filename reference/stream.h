/* stream.h: the CPU emulation of a CUDA stream and CUDA graphs (DESIGN §4).
 *
 * The forward pass is written as a sequence of ops launched on a stream:
 * each op is a function plus an argument struct. An eager stream runs each op
 * at once. A capturing stream copies the argument struct (by value, as
 * cudaGraph capture freezes kernel arguments) into a graph and does not run
 * it; replaying the graph runs the recorded ops in order. Buffers are passed
 * by pointer, so values that live in memory are read at replay time, while
 * any scalar passed in the argument struct is frozen at capture: exactly the
 * property that makes "host scalar frozen into a captured graph" bugs
 * reproducible without a GPU. */
#ifndef KV_STREAM_H
#define KV_STREAM_H

#include <stdbool.h>
#include <stddef.h>

#include "status.h"

typedef void (*KvOpFn)(const void *args);

typedef struct {
    KvOpFn fn;
    size_t offset; /* of the argument copy in KvGraph.args */
    size_t size;
} KvGraphOp;

typedef struct {
    KvGraphOp *ops;    /* (n_ops) */
    size_t n_ops, cap_ops;
    unsigned char *args; /* (args_len) argument copies, 16-byte aligned each */
    size_t args_len, cap_args;
} KvGraph;

typedef struct {
    KvGraph *capture; /* non-NULL while capturing */
    bool failed;      /* an allocation failed during capture */
} KvStream;

/* Runs fn(args) now (eager) or records it (capturing). The argument struct
 * is copied; it must not contain pointers into itself. */
void kv_stream_launch(KvStream *s, KvOpFn fn, const void *args, size_t size);

/* Starts recording into g (emptied first). */
void kv_stream_begin_capture(KvStream *s, KvGraph *g);
/* Stops recording; KV_ERR_INTERNAL if an allocation failed meanwhile. */
KvStatus kv_stream_end_capture(KvStream *s, KvError *err);

/* Runs the recorded ops in order. */
void kv_graph_replay(const KvGraph *g);
void kv_graph_clear(KvGraph *g);
void kv_graph_free(KvGraph *g);

#endif
