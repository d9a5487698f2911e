/* decode.c: greedy decoding of a left-padded batch with the reference
 * forward pass: prefill (whole or in chunks), then one token per step. */
#include "decode.h"

#include <stdlib.h>
#include <string.h>

#include "forward.h"
#include "kvmath.h"
#include "stream.h"

KvStatus kv_batch_left_pad(const int32_t *const *prompts, const int64_t *lens, int64_t batch,
                           int32_t pad_id, int32_t **prompt, uint8_t **real, int64_t *prompt_len,
                           KvError *err) {
    *prompt = NULL;
    *real = NULL;
    *prompt_len = 0;
    int64_t p = 0;
    for (int64_t b = 0; b < batch; b++) {
        if (lens[b] < 1) {
            return kv_error_set(err, KV_ERR_INPUT, "prompts: row %lld: expected >= 1 token, found %lld",
                                (long long)b, (long long)lens[b]);
        }
        p = lens[b] > p ? lens[b] : p;
    }
    int32_t *tok = malloc((size_t)(batch * p) * sizeof *tok); /* (B, P) */
    uint8_t *rl = malloc((size_t)(batch * p));                /* (B, P) */
    if (tok == NULL || rl == NULL) {
        free(tok);
        free(rl);
        return kv_error_set(err, KV_ERR_INTERNAL, "prompts: out of memory");
    }
    for (int64_t b = 0; b < batch; b++) {
        int64_t pad = p - lens[b];
        for (int64_t i = 0; i < p; i++) {
            tok[b * p + i] = i < pad ? pad_id : prompts[b][i - pad];
            rl[b * p + i] = i < pad ? 0 : 1;
        }
    }
    *prompt = tok;
    *real = rl;
    *prompt_len = p;
    return KV_OK;
}

void kv_decode_result_free(KvDecodeResult *r) {
    if (r == NULL) return;
    free(r->tokens);
    free(r->logits);
    free(r->margins);
    free(r->probe_hash);
    kv_probe_dump_free(&r->dump);
    memset(r, 0, sizeof *r);
}

/* Moves the state's non-finite probe record (the forward just run) into
 * the result when it is the first one, and clears it for the next. */
static void decode_note_nonfinite(KvRefState *s, int64_t step, KvDecodeResult *out) {
    if (s->nonfinite_probe >= 0 && out->nonfinite_step < 0) {
        out->nonfinite_step = step;
        out->nonfinite_probe = s->nonfinite_probe;
        out->nonfinite_row = s->nonfinite_row;
        out->nonfinite_index = s->nonfinite_index;
        out->nonfinite_value = s->nonfinite_value;
    }
    kv_ref_nonfinite_reset(s);
}

static KvStatus decode_check_spec(const KvModel *m, const KvDecodeSpec *sp, KvError *err) {
    if (sp->batch < 1 || sp->prompt_len < 1 || sp->new_tokens < 1 || sp->prefill_chunk < 0) {
        return kv_error_set(err, KV_ERR_INPUT,
                            "decode: expected batch >= 1, prompt length >= 1, new tokens >= 1, "
                            "prefill chunk >= 0; found %lld, %lld, %lld, %lld",
                            (long long)sp->batch, (long long)sp->prompt_len,
                            (long long)sp->new_tokens, (long long)sp->prefill_chunk);
    }
    for (int64_t b = 0; b < sp->batch; b++) {
        /* Left padding puts every row's last prompt token in the last column,
         * whose logits start the decode. */
        if (!sp->prompt_real[b * sp->prompt_len + sp->prompt_len - 1]) {
            return kv_error_set(err, KV_ERR_INPUT,
                                "decode: prompt row %lld: expected a real token in the last "
                                "column (left padding), found a pad",
                                (long long)b);
        }
    }
    (void)m;
    return KV_OK;
}

KvStatus kv_decode_greedy(const KvModel *m, const KvDecodeSpec *sp, KvDecodeResult *out,
                          KvError *err) {
    KvStatus st = KV_OK;
    KvRefState s = {0};
    int32_t *chunk_tok = NULL; /* (B, chunk) */
    uint8_t *chunk_real = NULL; /* (B, chunk) */
    KvGraphRunner runner = {0};
    KvRefSnapshot snap = {0};
    float *first_logits = NULL; /* (B, V) the first run of a replay-checked step */
    memset(out, 0, sizeof *out);
    out->nonfinite_step = out->nonfinite_probe = out->nonfinite_row = out->nonfinite_index = -1;

    st = decode_check_spec(m, sp, err);
    if (st != KV_OK) goto exit;

    const int64_t B = sp->batch;
    const int64_t P = sp->prompt_len;
    const int64_t V = m->config.vocab_size;
    const int64_t chunk = sp->prefill_chunk > 0 && sp->prefill_chunk < P ? sp->prefill_chunk : P;
    /* The last generated token is never fed back, so P + new_tokens - 1
     * slots suffice. */
    st = kv_ref_state_init(&s, m, B, P + sp->new_tokens - 1, chunk, sp->variant, err);
    if (st != KV_OK) goto exit;
    kv_ref_state_plant(&s, sp->faults);
    s.probes = sp->record_probes;
    if (sp->record_probes && sp->dump_probes) {
        st = kv_ref_dump_enable(&s, err);
        if (st != KV_OK) goto exit;
    }
    if (sp->record_probes) {
        out->n_probes = s.n_probes;
        out->probe_hash = calloc((size_t)(sp->new_tokens * s.n_probes * B), sizeof *out->probe_hash);
        if (out->probe_hash == NULL) {
            st = kv_error_set(err, KV_ERR_INTERNAL, "decode: out of memory for probe hashes");
            goto exit;
        }
    }

    out->steps = sp->new_tokens;
    out->batch = B;
    out->vocab = V;
    out->tokens = calloc((size_t)(sp->new_tokens * B), sizeof *out->tokens);
    out->logits = calloc((size_t)(sp->new_tokens * B * V), sizeof *out->logits);
    out->margins = calloc((size_t)(sp->new_tokens * B), sizeof *out->margins);
    chunk_tok = malloc((size_t)(B * chunk) * sizeof *chunk_tok);
    chunk_real = malloc((size_t)(B * chunk));
    st = kv_graph_runner_init(&runner, &s, err);
    if (st != KV_OK) goto exit;
    first_logits = malloc((size_t)(B * V) * sizeof *first_logits);
    out->replay_mismatch_step = -1;
    if (!out->tokens || !out->logits || !out->margins || !chunk_tok || !chunk_real ||
        !first_logits) {
        st = kv_error_set(err, KV_ERR_INTERNAL, "decode: out of memory (%lld steps x %lld rows x %lld vocab)",
                          (long long)sp->new_tokens, (long long)B, (long long)V);
        goto exit;
    }

    for (int64_t off = 0; off < P; off += chunk) {
        int64_t n = P - off < chunk ? P - off : chunk;
        for (int64_t b = 0; b < B; b++) {
            memcpy(chunk_tok + b * n, sp->prompt + b * P + off, (size_t)n * sizeof *chunk_tok);
            memcpy(chunk_real + b * n, sp->prompt_real + b * P + off, (size_t)n);
        }
        st = kv_ref_forward(m, &s, chunk_tok, chunk_real, n, NULL, err);
        if (st != KV_OK) goto exit;
        decode_note_nonfinite(&s, 0, out);
    }
    out->nonfinite_checked = sp->record_probes;

    /* Step 0 comes from the prefill; each later step feeds one token per
     * row: the greedy token the last forward wrote into tok_in, or the
     * forced one written over it (a host-to-memory copy, as before a graph
     * replay). */
    for (int64_t step = 0; step < sp->new_tokens; step++) {
        if (step > 0) {
            if (sp->forced != NULL) {
                for (int64_t b = 0; b < B; b++) {
                    chunk_tok[b] = sp->forced[(step - 1) * B + b];
                    chunk_real[b] = 1;
                }
                st = kv_ref_check_input(&s, chunk_tok, chunk_real, 1, err);
                if (st != KV_OK) goto exit;
                memcpy(s.tok_in, chunk_tok, (size_t)B * sizeof *chunk_tok);
                memcpy(s.real_in, chunk_real, (size_t)B);
            } else if (s.len + 1 > s.max_len) {
                st = kv_error_set(err, KV_ERR_INTERNAL, "decode: state full at step %lld",
                                  (long long)step);
                goto exit;
            }
            const bool check = sp->replay_every > 0 && step % sp->replay_every == 0;
            const int64_t runs = check ? (sp->replay_k > 0 ? sp->replay_k : 3) : 1;
            if (check) {
                st = kv_ref_snapshot_save(&s, &snap, err);
                if (st != KV_OK) goto exit;
                out->replays_checked++;
            }
            for (int64_t run = 0; run < runs; run++) {
                if (run > 0) kv_ref_snapshot_load(&s, &snap);
                if (sp->mode == KV_MODE_GRAPH) {
                    st = kv_graph_runner_step(&runner, &s, 1, err);
                    if (st != KV_OK) goto exit;
                } else {
                    kv_ref_launch_forward(&s, 1);
                }
                decode_note_nonfinite(&s, step, out);
                if (!check) continue;
                if (run == 0) {
                    memcpy(first_logits, s.logits, (size_t)(B * V) * sizeof(float));
                } else if (out->replay_mismatch_step < 0 &&
                           memcmp(first_logits, s.logits, (size_t)(B * V) * sizeof(float)) != 0) {
                    out->replay_mismatch_step = step;
                }
            }
            s.len += 1;
            st = kv_ref_check_sentinels(&s, 1, err);
            if (st != KV_OK) goto exit;
        }
        memcpy(out->logits + step * B * V, s.logits, (size_t)(B * V) * sizeof(float));
        memcpy(out->tokens + step * B, s.next_tok, (size_t)B * sizeof(int32_t));
        memcpy(out->margins + step * B, s.margin, (size_t)B * sizeof(float));
        if (out->probe_hash != NULL) {
            memcpy(out->probe_hash + step * s.n_probes * B, s.probe_hash,
                   (size_t)(s.n_probes * B) * sizeof(uint64_t));
        }
    }

    if (s.dump.data != NULL) {
        /* The state's dump (the last step's values) moves to the result. */
        out->dump = s.dump;
        memset(&s.dump, 0, sizeof s.dump);
    }

exit:
    out->graphs_captured = runner.captures;
    kv_graph_runner_free(&runner);
    kv_ref_snapshot_free(&snap);
    free(first_logits);
    free(chunk_tok);
    free(chunk_real);
    kv_ref_state_free(&s);
    if (st != KV_OK) kv_decode_result_free(out);
    return st;
}
