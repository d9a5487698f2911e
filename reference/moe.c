/* moe.c: gpt_oss's MoE block, one op of the reference forward (forward.c). */
#include "moe.h"

#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "kvmath.h"

/* gpt_oss's MoE block (GptOssMLP with experts_implementation "eager"),
 * s->xn (rows, hidden) into s->tmp (rows, hidden). Per token:
 *   router logits = W_r x + b_r; the experts_per_tok largest, by descending
 *   logit (ties to the lowest id: torch.topk leaves CPU ties unordered, so
 *   a tie at the cut is a coin toss there); their softmax weights in F32;
 *   then, over the chosen experts in ascending expert id (the eager loop's
 *   order, not the rank order), gu = W_gu x + b_gu with gate = gu[2j],
 *   up = gu[2j + 1], gate = min(gate, limit), up = clamp(up, -limit, limit),
 *   h = (up + 1) * gate * sigmoid(alpha * gate), out = W_d h + b_d, and
 *   acc = acc + out * weight, starting from 0.
 * Run expert by expert, as transformers' eager loop does: each expert's
 * weights are read once for every row that chose it (one matmul of the
 * gathered rows), and only chosen experts are read. Every element is
 * still one dot product of one row (kvmath.h), and each row's acc still
 * adds its experts in ascending id, so the bits are those of a token at a
 * time. */
typedef struct {
    KvRefState *s;
    const KvLayerWeights *w;
    int64_t rows;
    KvMatmulFn mm; /* NULL: kv_matmul_mat */
} ArgsMoe;

/* Row r's router: logits plus bias, its top experts and their weights. */
static void moe_route(KvRefState *s, const KvLayerWeights *w, const KvConfig *c, int64_t r) {
    const int64_t E = c->num_experts, K = c->experts_per_tok;
    float *logits = s->moe_logits + r * E; /* (E) */
    int64_t *pick = s->moe_pick + r * K;   /* (K) */
    float *weight = s->moe_weight + r * K; /* (K) */
    for (int64_t e = 0; e < E; e++) logits[e] = logits[e] + w->router_b[e];
    /* top-k by descending logit, ties to the lowest id */
    for (int64_t k = 0; k < K; k++) {
        int64_t best = -1;
        for (int64_t e = 0; e < E; e++) {
            bool taken = false;
            for (int64_t j = 0; j < k && !taken; j++) taken = pick[j] == e;
            if (!taken && (best < 0 || logits[e] > logits[best])) best = e;
        }
        pick[k] = best;
        weight[k] = logits[best];
    }
    kv_softmax(weight, K);
}

static void op_moe(const void *ap) {
    const ArgsMoe *a = ap;
    KvRefState *s = a->s;
    const KvConfig *c = &s->model->config;
    const KvLayerWeights *w = a->w;
    const int64_t H = c->hidden_size, I = c->intermediate_size, E = c->num_experts;
    const int64_t K = c->experts_per_tok;
    const float limit = (float)c->swiglu_limit, alpha = (float)c->swiglu_alpha;
    kv_ref_matmul(a->mm, s->xn, kv_mat_f32(w->router_w), a->rows, H, E, s->moe_logits);
    for (int64_t r = 0; r < a->rows; r++) moe_route(s, w, c, r);
    for (int64_t i = 0; i < a->rows * H; i++) s->tmp[i] = 0.0f;
    for (int64_t e = 0; e < E; e++) {
        /* the rows that chose e, ascending, their inputs gathered */
        int64_t n = 0;
        for (int64_t r = 0; r < a->rows; r++) {
            for (int64_t k = 0; k < K; k++) {
                if (s->moe_pick[r * K + k] != e) continue;
                s->moe_rows[n] = r * K + k; /* row and rank */
                memcpy(s->moe_x + n * H, s->xn + r * H, (size_t)H * sizeof(float));
                n++;
            }
        }
        if (n == 0) continue; /* chosen by no row: its weights are not read */
        kv_ref_matmul(a->mm, s->moe_x, kv_mat_skip(w->experts_gate_up, e * 2 * I * H), n, H,
                      2 * I, s->moe_gu);
        const float *bgu = w->experts_gate_up_b + e * 2 * I; /* (2I) */
        for (int64_t j = 0; j < n; j++) {
            const float *gu = s->moe_gu + j * 2 * I; /* (2I) */
            float *h = s->moe_h + j * I;             /* (I) */
            for (int64_t i = 0; i < I; i++) {
                float gate = gu[2 * i] + bgu[2 * i];
                float up = gu[2 * i + 1] + bgu[2 * i + 1];
                gate = gate > limit ? limit : gate;
                up = up > limit ? limit : (up < -limit ? -limit : up);
                const float glu = gate * (1.0f / (1.0f + expf(-(gate * alpha))));
                h[i] = (up + 1.0f) * glu;
            }
        }
        kv_ref_matmul(a->mm, s->moe_h, kv_mat_skip(w->experts_down, e * H * I), n, I, H,
                      s->moe_out);
        const float *bd = w->experts_down_b + e * H; /* (hidden) */
        for (int64_t j = 0; j < n; j++) {
            const int64_t r = s->moe_rows[j] / K;
            const float weight = s->moe_weight[s->moe_rows[j]];
            const float *out = s->moe_out + j * H; /* (hidden) */
            float *acc = s->tmp + r * H;           /* (hidden) */
            for (int64_t i = 0; i < H; i++) acc[i] = acc[i] + (out[i] + bd[i]) * weight;
        }
    }
}

void kv_ref_launch_moe(KvRefState *s, const KvLayerWeights *w, int64_t rows, KvMatmulFn mm) {
    const ArgsMoe a = {s, w, rows, mm};
    kv_stream_launch(&s->stream, op_moe, &a, sizeof a);
}
