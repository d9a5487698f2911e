/* rate.c: the machine's rate for the reference's kernels (rate.h). */
#include "rate.h"

#include <stdbool.h>
#include <stdlib.h>
#include <time.h>

#include "kvmath.h"
#include "probe.h"

static double rate_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Seconds per call of mm(x, w, rows, in, out, y), repeated for at least
 * `budget` seconds (once at least). */
static double rate_time(void (*mm)(const float *, KvMat, int64_t, int64_t, int64_t, float *),
                        const float *x, const float *w, int64_t rows, int64_t in, int64_t out,
                        float *y, double budget) {
    const double t0 = rate_now();
    int64_t calls = 0;
    double t = t0;
    do {
        mm(x, kv_mat_f32(w), rows, in, out, y);
        calls++;
        t = rate_now();
    } while (t - t0 < budget);
    return (t - t0) / (double)calls;
}

/* Rows of a prefill-like matmul, and the weights a decode-like one streams
 * (well beyond the last-level caches of the machines this runs on). */
#define RATE_ROWS 64
#define RATE_STREAM_BYTES (64 << 20)
/* Keys of the attention timed: a window's worth for the real-scale models,
 * whose attention is what costs (a tiny model's is cheap whatever its
 * rate). */
#define RATE_KEYS 2048

/* Seconds per (query head, key) pair of kv_attend with cfg's head_dim and
 * softcap, over RATE_KEYS keys one kv_dim apart as in a cache. */
static double rate_attention(const KvConfig *cfg, float *buf /* (2, RATE_KEYS, kv_dim) */,
                             int64_t kv_dim, double budget) {
    const int64_t hd = cfg->head_dim;
    const float **k = malloc((size_t)RATE_KEYS * sizeof *k);      /* (RATE_KEYS) */
    const float **v = malloc((size_t)RATE_KEYS * sizeof *v);      /* (RATE_KEYS) */
    float *scores = malloc((size_t)RATE_KEYS * sizeof *scores);   /* (RATE_KEYS) */
    float *out = malloc((size_t)hd * sizeof *out);                /* (hd) */
    double per = 0.0;
    if (k != NULL && v != NULL && scores != NULL && out != NULL) {
        for (int64_t j = 0; j < RATE_KEYS; j++) {
            k[j] = buf + j * kv_dim;
            v[j] = buf + (RATE_KEYS + j) * kv_dim;
        }
        const double t0 = rate_now();
        int64_t calls = 0;
        double t = t0;
        do {
            kv_attend(buf + (calls % RATE_KEYS) * kv_dim, k, v, RATE_KEYS, hd,
                      1.0f / (float)hd, (float)cfg->attn_logit_softcapping, scores, out);
            calls++;
            t = rate_now();
        } while (t - t0 < budget);
        per = (t - t0) / ((double)calls * (double)RATE_KEYS);
    }
    free(k);
    free(v);
    free(scores);
    free(out);
    return per;
}

KvStatus kv_rate_measure(const KvConfig *cfg, KvRate *r, KvError *err) {
    const int64_t in = cfg->hidden_size > 0 && cfg->hidden_size <= 16384 ? cfg->hidden_size : 4096;
    const int64_t big = RATE_STREAM_BYTES / (int64_t)sizeof(float) / in; /* stream rows */
    /* the model's MLP width, its weights at most the streamed size */
    int64_t out = cfg->intermediate_size > 0 ? cfg->intermediate_size : 4 * in;
    if (out > big) out = big;
    const int64_t wn = (out > big ? out : big) * in;
    float *x = malloc((size_t)(RATE_ROWS * in) * sizeof *x);   /* (RATE_ROWS, in) */
    float *w = malloc((size_t)wn * sizeof *w);                 /* (max(out, big), in) */
    float *y = malloc((size_t)(RATE_ROWS * (out > big ? out : big)) * sizeof *y);
    if (x == NULL || w == NULL || y == NULL) {
        free(x);
        free(w);
        free(y);
        return kv_error_set(err, KV_ERR_INTERNAL, "rate: out of memory");
    }
    for (int64_t i = 0; i < RATE_ROWS * in; i++) x[i] = (float)(i % 7) * 0.125f - 0.375f;
    for (int64_t i = 0; i < wn; i++) w[i] = (float)(i % 5) * 0.0625f - 0.125f;
    const double macs = (double)RATE_ROWS * (double)in * (double)out;
    r->mac_s = rate_time(kv_matmul_mat, x, w, RATE_ROWS, in, out, y, 0.1) / macs;
    r->seq_mac_s = rate_time(kv_matmul_sequential, x, w, RATE_ROWS, in, out, y, 0.1) / macs;
    r->byte_s = rate_time(kv_matmul_mat, x, w, 1, in, big, y, 0.1) /
                ((double)big * (double)in * (double)sizeof(float));
    /* the attention over the streamed buffer (its values are as good as
     * any: the time does not depend on them) */
    const int64_t kv_dim = cfg->num_kv_heads > 0 && cfg->head_dim > 0
                               ? cfg->num_kv_heads * cfg->head_dim
                               : 0;
    r->pair_s = 0.0;
    if (kv_dim > 0 && 2 * RATE_KEYS * kv_dim <= wn) {
        r->pair_s = rate_attention(cfg, w, kv_dim, 0.05);
    }
    if (r->pair_s <= 0.0) r->pair_s = 4.0 * (double)cfg->head_dim * r->mac_s; /* QK and PV */
    {
        const size_t n = (size_t)8 << 20; /* bytes, within the streamed buffer */
        const double t0 = rate_now();
        int64_t calls = 0;
        volatile uint64_t sink = 0; /* the hash is used: not optimised away */
        double t = t0;
        do {
            sink = sink ^ kv_probe_hash_bytes(w, n);
            calls++;
            t = rate_now();
        } while (t - t0 < 0.03);
        r->hash_byte_s = (t - t0) / ((double)calls * (double)n);
    }
    free(x);
    free(w);
    free(y);
    return KV_OK;
}

double kv_rate_layer_weights(const KvConfig *cfg, double experts) {
    const double H = (double)cfg->hidden_size, I = (double)cfg->intermediate_size;
    const double qd = (double)(cfg->num_heads * cfg->head_dim);
    const double kvd = (double)(cfg->num_kv_heads * cfg->head_dim);
    return H * (qd + 2.0 * kvd) + qd * H + experts * 3.0 * H * I;
}

double kv_rate_decode_seconds(const KvConfig *cfg, const KvRate *r, int64_t prefill,
                              int64_t steps, int64_t batch, double keys, bool seq) {
    const double H = (double)cfg->hidden_size;
    const double kvd = (double)(cfg->num_kv_heads * cfg->head_dim);
    const double L = (double)cfg->num_layers, V = (double)cfg->vocab_size;
    /* multiply-adds per token of every layer (a MoE runs its
     * experts_per_tok experts), and the weights one step reads */
    const double experts = cfg->num_experts > 0 ? (double)cfg->experts_per_tok : 1.0;
    const double layer_mac = kv_rate_layer_weights(cfg, experts);
    const double mac_s = seq ? r->seq_mac_s : r->mac_s;
    const double head = H * V; /* the lm_head, once per row per forward */
    const double step_bytes = 4.0 * (L * layer_mac + head);
    const double pre = (double)prefill * L * layer_mac * mac_s;
    const double per_step = (double)batch * (L * layer_mac + head) * mac_s;
    const double stream = step_bytes * r->byte_s;
    /* attention: each query head over the keys its query sees */
    const double att = (double)cfg->num_heads * keys * r->pair_s;
    /* the probes: every layer's cache (its window's keys and values) hashed
     * at every step, and a prefill's activations (about ten hidden-sized
     * rows per position per layer) */
    const double win = cfg->sliding_window > 0 ? (double)cfg->sliding_window : 4096.0;
    const double probe = ((double)steps * (double)batch * L * win * 2.0 * kvd +
                          (double)prefill * L * 10.0 * H) * 4.0 * r->hash_byte_s;
    return pre + (double)steps * (per_step > stream ? per_step : stream) + att + probe;
}
