/* decode.c: the one decode driver: greedy decoding of a left-padded (or,
 * with per-row positions, right-padded) batch on any backend (backend.h):
 * prefill (whole or in chunks), then one token per step, eager or through
 * the graph runner, with teacher forcing, the replay check and the
 * recording of every step. What a scenario does besides (a request switch,
 * a context shift) is the harness's script, called at fixed points. */
#include "decode.h"

#include <stdlib.h>
#include <string.h>

#include "fault.h"
#include "probe.h"
#include "shadow64.h"

KvStatus kv_batch_left_pad(const int32_t *const *prompts, const int64_t *lens, int64_t batch,
                           int32_t pad_id, int32_t **prompt, uint8_t **real, int64_t *prompt_len,
                           KvError *err) {
    return kv_batch_pad(prompts, lens, batch, pad_id, false, prompt, real, prompt_len, err);
}

KvStatus kv_batch_pad(const int32_t *const *prompts, const int64_t *lens, int64_t batch,
                      int32_t pad_id, bool right, int32_t **prompt, uint8_t **real,
                      int64_t *prompt_len, KvError *err) {
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
        /* the row's tokens start at column first */
        const int64_t first = right ? 0 : p - lens[b];
        for (int64_t i = 0; i < p; i++) {
            const bool is_real = i >= first && i < first + lens[b];
            tok[b * p + i] = is_real ? prompts[b][i - first] : pad_id;
            rl[b * p + i] = is_real ? 1 : 0;
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

bool kv_decode_right_padded(const uint8_t *real, int64_t batch, int64_t n) {
    for (int64_t b = 0; b < batch; b++) {
        bool seen_real = false;
        for (int64_t t = 0; t < n; t++) {
            if (real[b * n + t]) {
                seen_real = true;
            } else if (seen_real) {
                return true;
            }
        }
    }
    return false;
}

KvStatus kv_decode_check_tokens(int64_t vocab, const int32_t *tokens, const uint8_t *real,
                                int64_t batch, int64_t n, int64_t pos0, bool right,
                                KvError *err) {
    for (int64_t b = 0; b < batch; b++) {
        bool seen_real = false, trailing = false;
        for (int64_t t = 0; t < n; t++) {
            const int32_t tok = tokens[b * n + t];
            if (tok < 0 || tok >= vocab) {
                return kv_error_set(err, KV_ERR_INPUT,
                                    "tokens: row %lld position %lld: expected a token id in "
                                    "[0, %lld), found %d",
                                    (long long)b, (long long)(pos0 + t), (long long)vocab, tok);
            }
            if (real[b * n + t]) {
                if (trailing) {
                    return kv_error_set(err, KV_ERR_INPUT,
                                        "tokens: row %lld column %lld: a real token after a "
                                        "trailing pad (a right-padded row is left pads, real "
                                        "tokens, then pads)",
                                        (long long)b, (long long)(pos0 + t));
                }
                seen_real = true;
            } else if (seen_real && right) {
                trailing = true;
            } else if (seen_real) {
                return kv_error_set(err, KV_ERR_INPUT,
                                    "tokens: row %lld position %lld: a pad after a real token "
                                    "(batches must be left-padded)",
                                    (long long)b, (long long)(pos0 + t));
            }
        }
    }
    return KV_OK;
}

KvStatus kv_decode_check_spec(const KvModel *m, const KvDecodeSpec *sp, KvError *err) {
    if (sp->batch < 1 || sp->prompt_len < 1 || sp->new_tokens < 1 || sp->prefill_chunk < 0 ||
        sp->prompt == NULL || sp->prompt_real == NULL) {
        return kv_error_set(err, KV_ERR_INPUT,
                            "decode: expected batch >= 1, prompt length >= 1, new tokens >= 1, "
                            "prefill chunk >= 0 and a prompt; found %lld, %lld, %lld, %lld, %s",
                            (long long)sp->batch, (long long)sp->prompt_len,
                            (long long)sp->new_tokens, (long long)sp->prefill_chunk,
                            sp->prompt == NULL || sp->prompt_real == NULL ? "none" : "given");
    }
    /* Right padding (per-row positions): each row's logits start the decode
     * from its own last real token, wherever its prompt ends. */
    const bool right = kv_decode_right_padded(sp->prompt_real, sp->batch, sp->prompt_len);
    for (int64_t b = 0; b < sp->batch; b++) {
        bool any = false;
        for (int64_t t = 0; t < sp->prompt_len; t++) any = any || sp->prompt_real[b * sp->prompt_len + t];
        /* Left padding puts every row's last prompt token in the last column,
         * whose logits start the decode. */
        if (!any || (!right && !sp->prompt_real[b * sp->prompt_len + sp->prompt_len - 1])) {
            return kv_error_set(err, KV_ERR_INPUT,
                                "decode: prompt row %lld: expected %s, found %s",
                                (long long)b,
                                right ? "at least one real token"
                                      : "a real token in the last column (left padding)",
                                any ? "a pad" : "only pads");
        }
    }
    return kv_decode_check_tokens(m->config.vocab_size, sp->prompt, sp->prompt_real, sp->batch,
                                  sp->prompt_len, 0, right, err);
}

/* Moves the backend's non-finite probe record (the forward just run) into
 * the result when it is the first one. */
static void decode_note_nonfinite(const KvBackendOps *ops, KvBackend *b, int64_t step,
                                  KvDecodeResult *out) {
    KvNonfinite nf;
    if (!kv_backend_take_nonfinite(ops, b, &nf)) return;
    if (out->nonfinite_step >= 0) return;
    out->nonfinite_step = step;
    out->nonfinite_probe = nf.probe;
    out->nonfinite_row = nf.row;
    out->nonfinite_index = nf.index;
    out->nonfinite_value = nf.value;
}

/* Copies the last forward's outputs into step `step` of the result. */
static KvStatus decode_record_step(const KvBackendOps *ops, KvBackend *b, int64_t step,
                                   KvDecodeResult *out, KvError *err) {
    const int64_t B = out->batch, V = out->vocab;
    KvBackendStep v;
    KvStatus st = ops->read_step(b, &v, err);
    if (st != KV_OK) return st;
    memcpy(out->logits + step * B * V, v.logits, (size_t)(B * V) * sizeof(float));
    memcpy(out->tokens + step * B, v.tokens, (size_t)B * sizeof(int32_t));
    memcpy(out->margins + step * B, v.margins, (size_t)B * sizeof(float));
    if (out->probe_hash != NULL) {
        if (v.probe_hash == NULL) {
            return kv_error_set(err, KV_ERR_INTERNAL, "decode: %s backend recorded no probes",
                                ops->name);
        }
        memcpy(out->probe_hash + step * out->n_probes * B, v.probe_hash,
               (size_t)(out->n_probes * B) * sizeof(uint64_t));
    }
    return KV_OK;
}

/* Hands step `step`'s full probe values to the spec's callback, if any. */
static void decode_step_dump(const KvBackendOps *ops, const KvBackend *b,
                             const KvDecodeSpec *sp, int64_t step) {
    if (!sp->record_probes || !sp->dump_probes || sp->on_step_dump == NULL) return;
    const KvProbeDump *d = kv_backend_peek_dump(ops, b);
    if (d != NULL) sp->on_step_dump(sp->on_step_dump_ctx, step, d);
}

/* One decode step after the prefill: forced input when given, then one
 * forward per run (replay_k runs from one snapshot when the step is
 * replay-checked, the logits of every run compared bitwise). */
static KvStatus decode_step(const KvBackendOps *ops, KvBackend *b, const KvModel *m,
                            const KvDecodeSpec *sp, int64_t step, KvGraphRunner *runner,
                            int32_t *tok, uint8_t *real, float *first_logits,
                            KvDecodeResult *out, KvError *err) {
    KvStatus st = KV_OK;
    const int64_t B = sp->batch, V = m->config.vocab_size;
    if (sp->forced != NULL) {
        for (int64_t b = 0; b < B; b++) {
            tok[b] = sp->forced[(step - 1) * B + b];
            real[b] = 1;
        }
        st = kv_decode_check_tokens(V, tok, real, B, 1, sp->prompt_len + step - 1, false, err);
        if (st == KV_OK) st = ops->set_input(b, tok, real, 1, err);
        if (st != KV_OK) return st;
    }
    /* A decode shorter than the interval replay-checks its last step, so a
     * short decode (--max-new-tokens 5) is still checked, not skipped. */
    const bool last_unchecked = step == sp->new_tokens - 1 && out->replays_checked == 0;
    const bool check = sp->replay_every > 0 && (step % sp->replay_every == 0 || last_unchecked);
    const int64_t runs = check ? (sp->replay_k > 0 ? sp->replay_k : KV_REPLAY_K) : 1;
    if (check) {
        st = ops->snapshot_save(b, KV_SNAP_REPLAY, err);
        if (st != KV_OK) return st;
        out->replays_checked++;
    }
    for (int64_t run = 0; run < runs; run++) {
        if (run > 0) {
            st = ops->snapshot_load(b, KV_SNAP_REPLAY, err);
            if (st != KV_OK) return st;
        }
        st = sp->mode == KV_MODE_GRAPH
                 ? kv_graph_runner_step(runner, ops, b, m->config.num_layers, 1, err)
                 : ops->forward(b, 1, err);
        if (st != KV_OK) return st;
        decode_note_nonfinite(ops, b, step, out);
        if (!check) continue;
        KvBackendStep v;
        st = ops->read_step(b, &v, err);
        if (st != KV_OK) return st;
        if (run == 0) {
            memcpy(first_logits, v.logits, (size_t)(B * V) * sizeof(float));
        } else if (out->replay_mismatch_step < 0 &&
                   memcmp(first_logits, v.logits, (size_t)(B * V) * sizeof(float)) != 0) {
            out->replay_mismatch_step = step;
        }
    }
    return KV_OK;
}

/* The chunk a prefill forwards at once. */
static int64_t decode_chunk(const KvDecodeSpec *sp) {
    return sp->prefill_chunk > 0 && sp->prefill_chunk < sp->prompt_len ? sp->prefill_chunk
                                                                         : sp->prompt_len;
}

KvStatus kv_decode_prefill(const KvBackendOps *ops, KvBackend *b, const KvDecodeSpec *sp,
                           KvDecodeResult *out, KvError *err) {
    KvStatus st = KV_OK;
    const int64_t B = sp->batch, P = sp->prompt_len, chunk = decode_chunk(sp);
    /* A script's pause (a prefix-cache entry saved after its column): the
     * chunks stop there and start again after it (as a serving engine's
     * prefix does). */
    const KvDecodeScript *sc = sp->script;
    const int64_t pause = sc != NULL && sc->prefill_pause < P ? sc->prefill_pause : 0;
    int32_t *tok = malloc((size_t)(B * chunk) * sizeof *tok); /* (B, chunk) */
    uint8_t *real = malloc((size_t)(B * chunk));               /* (B, chunk) */
    if (tok == NULL || real == NULL) {
        st = kv_error_set(err, KV_ERR_INTERNAL, "decode: out of memory for the prefill");
        goto cleanup;
    }
    for (int64_t off = 0; off < P;) {
        const int64_t end = pause > off ? pause : P;
        const int64_t n = end - off < chunk ? end - off : chunk;
        for (int64_t row = 0; row < B; row++) {
            memcpy(tok + row * n, sp->prompt + row * P + off, (size_t)n * sizeof *tok);
            memcpy(real + row * n, sp->prompt_real + row * P + off, (size_t)n);
        }
        st = ops->set_input(b, tok, real, n, err);
        /* The first forward from the tape when it fits (prefill_tape.h). */
        bool taped = false;
        if (st == KV_OK && off == 0 && sp->tape_play != NULL && ops->tape_load != NULL) {
            st = ops->tape_load(b, n, sp->tape_play, &taped, err);
        }
        if (st == KV_OK && !taped) st = ops->forward(b, n, err);
        if (st == KV_OK && off == 0 && sp->tape_record != NULL && ops->tape_save != NULL) {
            st = ops->tape_save(b, tok, real, n, sp->tape_record, err);
        }
        if (st != KV_OK) goto cleanup;
        if (taped && out != NULL) out->prefill_taped = true;
        if (sp->on_progress != NULL) sp->on_progress(sp->on_progress_ctx, off + n, 0);
        if (out != NULL) decode_note_nonfinite(ops, b, 0, out);
        off += n;
        if (off == pause && sc->at_pause != NULL) {
            st = sc->at_pause(sc->ctx, ops, b, err);
            if (st != KV_OK) goto cleanup;
        }
    }
cleanup:
    free(tok);
    free(real);
    return st;
}

KvStatus kv_decode_run(const KvBackendOps *ops, const KvModel *m, const KvDecodeSpec *sp,
                       KvDecodeResult *out, KvBackendStats *stats, KvError *err) {
    KvStatus st = KV_OK;
    KvBackend *b = NULL;
    KvGraphRunner runner = {0};
    int32_t *chunk_tok = NULL;  /* (B) a forced step's tokens */
    uint8_t *chunk_real = NULL; /* (B) */
    float *first_logits = NULL; /* (B, V) the first run of a replay-checked step */
    memset(out, 0, sizeof *out);
    if (stats != NULL) memset(stats, 0, sizeof *stats);
    out->nonfinite_step = out->nonfinite_probe = out->nonfinite_row = out->nonfinite_index = -1;
    out->replay_mismatch_step = -1;

    st = kv_decode_check_spec(m, sp, err);
    if (st != KV_OK) goto cleanup;
    const int64_t B = sp->batch;
    const int64_t P = sp->prompt_len;
    const int64_t V = m->config.vocab_size;
    const int64_t chunk = decode_chunk(sp);
    /* The last generated token is never fed back, so P + new_tokens - 1
     * slots suffice, unless a script feeds more (a second request). */
    const KvDecodeScript *script = sp->script;
    int64_t max_len = P + sp->new_tokens - 1, max_chunk = chunk;
    if (script != NULL) {
        max_len = script->max_len > max_len ? script->max_len : max_len;
        max_chunk = script->max_chunk > max_chunk ? script->max_chunk : max_chunk;
    }
    const KvBackendSetup setup = {
        .batch = B,
        .max_len = max_len,
        .max_chunk = max_chunk,
        .prefix_slot = script != NULL && script->prefix_slot,
        .variant = sp->variant,
        .faults = sp->faults,
        .order = sp->order,
        .probes = sp->record_probes,
        .dump_probes = sp->record_probes && sp->dump_probes,
        .per_row = kv_decode_right_padded(sp->prompt_real, B, P),
    };
    if (script != NULL && script->shifts && !kv_backend_can_shift(ops)) {
        st = kv_backend_refuse_shift(ops, err);
        goto cleanup;
    }
    if (setup.per_row && !ops->per_row) {
        st = kv_error_set(err, KV_ERR_INPUT,
                          "decode: a right-padded prompt needs per-row positions, which the %s "
                          "backend does not have",
                          ops->name);
        goto cleanup;
    }
    st = ops->create(m, &setup, &b, err);
    if (st != KV_OK) goto cleanup;

    out->steps = sp->new_tokens;
    out->batch = B;
    out->vocab = V;
    out->tokens = calloc((size_t)(sp->new_tokens * B), sizeof *out->tokens);
    out->logits = calloc((size_t)(sp->new_tokens * B * V), sizeof *out->logits);
    out->margins = calloc((size_t)(sp->new_tokens * B), sizeof *out->margins);
    if (sp->record_probes) {
        out->n_probes = kv_probe_count(&m->config);
        out->probe_hash = calloc((size_t)(sp->new_tokens * out->n_probes * B),
                                 sizeof *out->probe_hash);
    }
    chunk_tok = malloc((size_t)B * sizeof *chunk_tok);
    chunk_real = malloc((size_t)B);
    first_logits = malloc((size_t)(B * V) * sizeof *first_logits);
    if (!out->tokens || !out->logits || !out->margins || (sp->record_probes && !out->probe_hash) ||
        !chunk_tok || !chunk_real || !first_logits) {
        st = kv_error_set(err, KV_ERR_INTERNAL,
                          "decode: out of memory (%lld steps x %lld rows x %lld vocab)",
                          (long long)sp->new_tokens, (long long)B, (long long)V);
        goto cleanup;
    }
    /* The recapture rule's planted faults (fault.h), as the runner's policy. */
    const KvRecapturePolicy policy = {(sp->faults & KV_FAULT_NO_RECAPTURE) != 0,
                                      (sp->faults & KV_FAULT_RECAPTURE_EVERY_STEP) != 0};
    st = kv_graph_runner_init(&runner, m->config.num_layers, policy, err);
    if (st != KV_OK) goto cleanup;

    /* Step 0's logits come from the prefill's last chunk. */
    st = kv_decode_prefill(ops, b, sp, out, err);
    if (st != KV_OK) goto cleanup;
    out->nonfinite_checked = sp->record_probes && kv_backend_checks_nonfinite(ops);
    st = decode_record_step(ops, b, 0, out, err);
    if (st != KV_OK) goto cleanup;
    decode_step_dump(ops, b, sp, 0);

    /* Each later step feeds one token per row: the greedy token the last
     * forward wrote into the backend's input, or the forced one copied over
     * it (a host-to-memory copy, as before a graph replay). */
    for (int64_t step = 1; step < sp->new_tokens; step++) {
        bool fed = false; /* the script ran this step's forward */
        if (script != NULL && script->before_step != NULL) {
            st = script->before_step(script->ctx, ops, b, step, &fed, err);
            if (st != KV_OK) goto cleanup;
        }
        if (fed) {
            decode_note_nonfinite(ops, b, step, out);
        } else {
            st = decode_step(ops, b, m, sp, step, &runner, chunk_tok, chunk_real, first_logits,
                             out, err);
        }
        if (st == KV_OK) st = decode_record_step(ops, b, step, out, err);
        if (st != KV_OK) goto cleanup;
        decode_step_dump(ops, b, sp, step);
        if (sp->on_progress != NULL) sp->on_progress(sp->on_progress_ctx, P, step);
    }
    if (sp->record_probes && sp->dump_probes) kv_backend_take_dump(ops, b, &out->dump);

cleanup:
    out->graphs_captured = runner.captures;
    if (stats != NULL && b != NULL) {
        kv_backend_stats(ops, b, stats);
        stats->graphs_captured = runner.captures;
        stats->exec_update_used = stats->exec_updates > 0;
    }
    kv_graph_runner_free(&runner);
    if (b != NULL) ops->destroy(b);
    free(first_logits);
    free(chunk_tok);
    free(chunk_real);
    if (st != KV_OK) kv_decode_result_free(out);
    return st;
}

KvStatus kv_decode_greedy(const KvModel *m, const KvDecodeSpec *spec, KvDecodeResult *out,
                          KvError *err) {
    return kv_decode_run(&kv_backend_cpu, m, spec, out, NULL, err);
}

KvStatus kv_shadow64_decode_rel_error(const KvModel *m, const KvDecodeSpec *spec,
                                      const KvDecodeResult *result, double *per_step,
                                      double *max_rel, KvError *err) {
    if (m == NULL || spec == NULL || result == NULL || result->tokens == NULL ||
        result->logits == NULL) {
        return kv_error_set(err, KV_ERR_INPUT, "shadow64: expected a model, a decode spec and "
                                               "a decode result, found a NULL pointer");
    }
    if (result->steps != spec->new_tokens || result->batch != spec->batch ||
        result->vocab != m->config.vocab_size) {
        return kv_error_set(err, KV_ERR_INPUT,
                            "shadow64: decode result: expected (steps, batch, vocab) = "
                            "(%lld, %lld, %lld) as the spec and model say, found (%lld, %lld, "
                            "%lld)",
                            (long long)spec->new_tokens, (long long)spec->batch,
                            (long long)m->config.vocab_size, (long long)result->steps,
                            (long long)result->batch, (long long)result->vocab);
    }
    /* Step s > 0 fed forced[s - 1] under teacher forcing, else the greedy
     * token of step s - 1 (decode.h). */
    const int32_t *fed = spec->forced != NULL ? spec->forced : result->tokens;
    return kv_shadow64_rel_error(m, spec->batch, spec->prompt_len, spec->prompt, spec->prompt_real,
                                 result->steps, fed, result->logits, per_step, max_rel, err);
}
