/* moe.c: gpt_oss's MoE block, one op of the reference forward (forward.c). */
#include "moe.h"

#include <math.h>
#include <stdbool.h>

#include "kvmath.h"

/* gpt_oss's MoE block (GptOssMLP with experts_implementation "eager"),
 * s->xn (rows, hidden) into s->tmp (rows, hidden), one token at a time:
 *   router logits = W_r x + b_r; the experts_per_tok largest, by descending
 *   logit (ties to the lowest id: torch.topk leaves CPU ties unordered, so
 *   a tie at the cut is a coin toss there); their softmax weights in F32;
 *   then, over the chosen experts in ascending expert id (the eager loop's
 *   order, not the rank order), gu = W_gu x + b_gu with gate = gu[2j],
 *   up = gu[2j + 1], gate = min(gate, limit), up = clamp(up, -limit, limit),
 *   h = (up + 1) * gate * sigmoid(alpha * gate), out = W_d h + b_d, and
 *   acc = acc + out * weight, starting from 0. */
typedef struct {
    KvRefState *s;
    const KvLayerWeights *w;
    int64_t rows;
    KvMatmulFn mm; /* NULL: kv_matmul_mat */
} ArgsMoe;

static void op_moe(const void *ap) {
    const ArgsMoe *a = ap;
    KvRefState *s = a->s;
    const KvConfig *c = &s->model->config;
    const KvLayerWeights *w = a->w;
    const int64_t H = c->hidden_size, I = c->intermediate_size, E = c->num_experts;
    const int64_t K = c->experts_per_tok;
    const float limit = (float)c->swiglu_limit, alpha = (float)c->swiglu_alpha;
    for (int64_t r = 0; r < a->rows; r++) {
        const float *x = s->xn + r * H; /* (hidden) */
        float *acc = s->tmp + r * H;    /* (hidden) */
        kv_ref_matmul(a->mm, x, kv_mat_f32(w->router_w), 1, H, E, s->moe_logits);
        for (int64_t e = 0; e < E; e++) s->moe_logits[e] = s->moe_logits[e] + w->router_b[e];
        /* top-k by descending logit, ties to the lowest id */
        for (int64_t k = 0; k < K; k++) {
            int64_t best = -1;
            for (int64_t e = 0; e < E; e++) {
                bool taken = false;
                for (int64_t j = 0; j < k && !taken; j++) taken = s->moe_pick[j] == e;
                if (!taken && (best < 0 || s->moe_logits[e] > s->moe_logits[best])) best = e;
            }
            s->moe_pick[k] = best;
            s->moe_weight[k] = s->moe_logits[best];
        }
        kv_softmax(s->moe_weight, K);
        for (int64_t i = 0; i < H; i++) acc[i] = 0.0f;
        for (int64_t e = 0; e < E; e++) {
            int64_t rank = -1;
            for (int64_t k = 0; k < K; k++) {
                if (s->moe_pick[k] == e) rank = k;
            }
            if (rank < 0) continue; /* not chosen for this token */
            kv_ref_matmul(a->mm, x, kv_mat_skip(w->experts_gate_up, e * 2 * I * H), 1, H, 2 * I,
                          s->moe_gu);
            const float *bgu = w->experts_gate_up_b + e * 2 * I; /* (2I) */
            for (int64_t j = 0; j < I; j++) {
                float gate = s->moe_gu[2 * j] + bgu[2 * j];
                float up = s->moe_gu[2 * j + 1] + bgu[2 * j + 1];
                gate = gate > limit ? limit : gate;
                up = up > limit ? limit : (up < -limit ? -limit : up);
                const float glu = gate * (1.0f / (1.0f + expf(-(gate * alpha))));
                s->moe_h[j] = (up + 1.0f) * glu;
            }
            kv_ref_matmul(a->mm, s->moe_h, kv_mat_skip(w->experts_down, e * H * I), 1, I, H,
                          s->moe_out);
            const float *bd = w->experts_down_b + e * H; /* (hidden) */
            const float weight = s->moe_weight[rank];
            for (int64_t i = 0; i < H; i++) acc[i] = acc[i] + (s->moe_out[i] + bd[i]) * weight;
        }
    }
}

void kv_ref_launch_moe(KvRefState *s, const KvLayerWeights *w, int64_t rows, KvMatmulFn mm) {
    const ArgsMoe a = {s, w, rows, mm};
    kv_stream_launch(&s->stream, op_moe, &a, sizeof a);
}
