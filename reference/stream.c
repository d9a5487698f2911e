/* stream.c: eager execution and capture/replay of op sequences. */
#include "stream.h"

#include <stdlib.h>
#include <string.h>

static size_t stream_align16(size_t n) {
    return (n + 15u) & ~(size_t)15u;
}

static bool graph_record(KvGraph *g, KvOpFn fn, const void *args, size_t size) {
    if (g->n_ops == g->cap_ops) {
        size_t cap = g->cap_ops ? 2 * g->cap_ops : 64;
        KvGraphOp *ops = realloc(g->ops, cap * sizeof *ops);
        if (ops == NULL) return false;
        g->ops = ops;
        g->cap_ops = cap;
    }
    size_t need = stream_align16(g->args_len) + stream_align16(size);
    if (need > g->cap_args) {
        size_t cap = g->cap_args ? 2 * g->cap_args : 4096;
        while (cap < need) cap *= 2;
        /* Argument structs hold pointers and int64s: malloc's alignment
         * (16 on x86-64) plus 16-byte offsets keeps every copy aligned. */
        unsigned char *a = realloc(g->args, cap);
        if (a == NULL) return false;
        g->args = a;
        g->cap_args = cap;
    }
    size_t off = stream_align16(g->args_len);
    memcpy(g->args + off, args, size);
    g->ops[g->n_ops++] = (KvGraphOp){fn, off, size};
    g->args_len = off + size;
    return true;
}

void kv_stream_launch(KvStream *s, KvOpFn fn, const void *args, size_t size) {
    if (s->capture == NULL) {
        fn(args);
        return;
    }
    if (!graph_record(s->capture, fn, args, size)) s->failed = true;
}

void kv_stream_begin_capture(KvStream *s, KvGraph *g) {
    kv_graph_clear(g);
    s->capture = g;
    s->failed = false;
}

KvStatus kv_stream_end_capture(KvStream *s, KvError *err) {
    bool failed = s->failed;
    s->capture = NULL;
    s->failed = false;
    if (failed) return kv_error_set(err, KV_ERR_INTERNAL, "graph capture: out of memory");
    return KV_OK;
}

void kv_graph_replay(const KvGraph *g) {
    for (size_t i = 0; i < g->n_ops; i++) g->ops[i].fn(g->args + g->ops[i].offset);
}

void kv_graph_clear(KvGraph *g) {
    g->n_ops = 0;
    g->args_len = 0;
}

void kv_graph_free(KvGraph *g) {
    free(g->ops);
    free(g->args);
    memset(g, 0, sizeof *g);
}
