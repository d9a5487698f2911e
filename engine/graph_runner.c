/* graph_runner.c: graph mode for any backend (backend.h): the recapture
 * rule, written once. */
#include <stdlib.h>
#include <string.h>

#include "backend.h"

KvStatus kv_graph_runner_init(KvGraphRunner *r, int64_t num_layers, KvRecapturePolicy policy,
                              KvError *err) {
    memset(r, 0, sizeof *r);
    r->policy = policy;
    r->key_len = 1 + 2 * num_layers;
    r->key = calloc((size_t)r->key_len, sizeof *r->key);
    r->cur_key = calloc((size_t)r->key_len, sizeof *r->cur_key);
    if (r->key == NULL || r->cur_key == NULL) {
        kv_graph_runner_free(r);
        return kv_error_set(err, KV_ERR_INTERNAL, "graph runner: out of memory");
    }
    return KV_OK;
}

KvStatus kv_graph_runner_step(KvGraphRunner *r, const KvBackendOps *ops, KvBackend *b,
                              int64_t num_layers, int64_t n, KvError *err) {
    /* ignore_regime: a host-branch variant replays the graph of the regime
     * it was captured in after is_full flips. every_step: each graph is
     * still right for its step, so only the capture count shows it. */
    const bool keep = r->policy.ignore_regime;
    const bool every = r->policy.every_step;
    r->key[0] = n;
    for (int64_t l = 0; l < num_layers; l++) {
        int64_t regime = 0, slots = 0;
        ops->layer_key(b, l, n, &regime, &slots);
        r->key[1 + 2 * l] = keep ? 0 : regime;
        r->key[2 + 2 * l] = slots;
    }
    const size_t bytes = (size_t)r->key_len * sizeof *r->key;
    if (every || r->captures == 0 || memcmp(r->key, r->cur_key, bytes) != 0) {
        KvStatus st = ops->capture(b, n, err);
        if (st != KV_OK) return st;
        memcpy(r->cur_key, r->key, bytes);
        r->captures++;
    }
    return ops->replay(b, err);
}

void kv_graph_runner_free(KvGraphRunner *r) {
    free(r->key);
    free(r->cur_key);
    memset(r, 0, sizeof *r);
}
