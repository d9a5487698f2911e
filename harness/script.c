/* script.c: request switches and context shifts (script.h) over the
 * backend table, called by the engine's decode driver. */
#include "script.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* A context-shift script: whole, alone, on left padding, and within what
 * the sliding caches still hold when it happens (kv_cpu_shift's rule: the
 * positions stored then, less the largest window, cover keep + drop). */
static KvStatus script_check_shift(const KvConfig *c, const KvScript *s, int64_t prompt_len,
                                   bool right, KvError *err) {
    const int64_t w_max = kv_config_max_window(c);
    const int64_t stored = prompt_len + s->shift_step - 1; /* positions before the shift */
    if (right || s->switch_step != 0) {
        return kv_error_set(err, KV_ERR_INPUT,
                            "decode: a context shift with %s is not supported",
                            right ? "a right-padded prompt" : "a request switch");
    }
    if (s->shift_step < 1 || s->shift_keep < 0 || s->shift_drop < 1 ||
        s->shift_keep + s->shift_drop > stored - w_max) {
        return kv_error_set(err, KV_ERR_INPUT,
                            "decode: context shift: expected shift step >= 1, keep >= 0, drop >= "
                            "1 and keep + drop <= the %lld positions stored before the shift - "
                            "the largest window %lld; found step %lld, keep %lld, drop %lld",
                            (long long)stored, (long long)w_max, (long long)s->shift_step,
                            (long long)s->shift_keep, (long long)s->shift_drop);
    }
    return KV_OK;
}

/* A request switch: on left padding, its prefix ending on a real token,
 * its suffix real tokens of the vocabulary. */
static KvStatus script_check_switch(const KvModel *m, const KvScript *s, const KvDecodeSpec *sp,
                                    bool right, KvError *err) {
    if (right) {
        return kv_error_set(err, KV_ERR_INPUT,
                            "decode: a right-padded prompt with a request switch (prefix reuse "
                            "or speculative rollback) is not supported");
    }
    if (s->switch_step < 0 || s->save_after < 1 || s->save_after >= sp->prompt_len ||
        s->suffix_len < 1 || s->suffix == NULL) {
        return kv_error_set(err, KV_ERR_INPUT,
                            "decode: prefix reuse: expected switch step >= 1, 1 <= save_after < "
                            "prompt length %lld and a suffix of >= 1 tokens; found %lld, %lld, "
                            "%lld tokens",
                            (long long)sp->prompt_len, (long long)s->switch_step,
                            (long long)s->save_after, (long long)s->suffix_len);
    }
    /* the suffix is all real: the prefix ended on a real token (left padding) */
    for (int64_t b = 0; b < sp->batch; b++) {
        if (!sp->prompt_real[b * sp->prompt_len + s->save_after - 1]) {
            return kv_error_set(err, KV_ERR_INPUT,
                                "decode: prefix reuse: row %lld: the prefix's last column %lld is "
                                "a pad, so the suffix would follow a pad",
                                (long long)b, (long long)(s->save_after - 1));
        }
    }
    uint8_t *real = malloc((size_t)(sp->batch * s->suffix_len));
    if (real == NULL) return kv_error_set(err, KV_ERR_INTERNAL, "decode: out of memory");
    memset(real, 1, (size_t)(sp->batch * s->suffix_len));
    KvStatus st = kv_decode_check_tokens(m->config.vocab_size, s->suffix, real, sp->batch,
                                         s->suffix_len, s->save_after, false, err);
    free(real);
    return st;
}

/* The prefill's pause: the prefix-cache entry saved. */
static KvStatus script_save_prefix(void *ctx, const KvBackendOps *ops, KvBackend *b,
                                   KvError *err) {
    (void)ctx;
    return ops->snapshot_save(b, KV_SNAP_PREFIX, err);
}

/* Before a decode step: the shift between two forwards (as an engine
 * shifts when its context is full; the step then feeds its token at the
 * new position), or the request switch: the prefix entry restored and the
 * suffix fed as one eager forward, which is the step. */
static KvStatus script_before_step(void *ctx, const KvBackendOps *ops, KvBackend *b,
                                   int64_t step, bool *fed, KvError *err) {
    const KvScript *s = ctx;
    *fed = false;
    if (s->hooks.shifts && step == s->shift_step) {
        return kv_backend_shift(ops, b, s->shift_keep, s->shift_drop, err);
    }
    if (s->switch_step <= 0 || s->switch_step >= s->new_tokens || step != s->switch_step) {
        return KV_OK;
    }
    const int64_t n = s->suffix_len;
    uint8_t *real = malloc((size_t)(s->batch * n)); /* (B, n) */
    if (real == NULL) return kv_error_set(err, KV_ERR_INTERNAL, "decode: out of memory");
    memset(real, 1, (size_t)(s->batch * n));
    KvStatus st = ops->snapshot_load(b, KV_SNAP_PREFIX, err);
    if (st == KV_OK) st = ops->set_input(b, s->suffix, real, n, err);
    if (st == KV_OK) st = ops->forward(b, n, err);
    free(real);
    *fed = st == KV_OK;
    return st;
}

KvScript kv_script_of_scenario(const KvScenario *sc) {
    return (KvScript){.save_after = sc->save_after,
                      .switch_step = sc->switch_step,
                      .suffix_len = sc->suffix_len,
                      .suffix = sc->suffix,
                      .shift_step = sc->shift_step,
                      .shift_keep = sc->shift_keep,
                      .shift_drop = sc->shift_drop};
}

KvStatus kv_script_bind(KvScript *s, const KvModel *m, KvDecodeSpec *spec, KvError *err) {
    spec->script = NULL;
    KvStatus st = kv_decode_check_spec(m, spec, err);
    if (st != KV_OK) return st;
    const bool right = kv_decode_right_padded(spec->prompt_real, spec->batch, spec->prompt_len);
    if (s->shift_step != 0 || s->shift_keep != 0 || s->shift_drop != 0) {
        st = script_check_shift(&m->config, s, spec->prompt_len, right, err);
        if (st != KV_OK) return st;
    }
    if (s->switch_step != 0) {
        st = script_check_switch(m, s, spec, right, err);
        if (st != KV_OK) return st;
    }
    s->batch = spec->batch;
    s->new_tokens = spec->new_tokens;
    memset(&s->hooks, 0, sizeof s->hooks);
    s->hooks.ctx = s;
    s->hooks.shifts = s->shift_step > 0 && s->shift_step < spec->new_tokens;
    /* The prefix entry is saved whenever there is a switch, also when the
     * decode stops before it, so that a shorter rerun of a recorded run
     * prefills in the same chunks. */
    if (s->switch_step > 0) {
        s->hooks.prefix_slot = true;
        s->hooks.prefill_pause = s->save_after;
        s->hooks.at_pause = script_save_prefix;
    }
    if (s->switch_step > 0 && s->switch_step < spec->new_tokens) {
        /* the second request: its prefix, its suffix and the steps after */
        s->hooks.max_len = s->save_after + s->suffix_len + spec->new_tokens - s->switch_step - 1;
        s->hooks.max_chunk = s->suffix_len;
    }
    if (s->hooks.shifts || s->switch_step > 0) {
        s->hooks.before_step = script_before_step;
        spec->script = &s->hooks;
    }
    return KV_OK;
}

KvStatus kv_script_decode(const KvBackendOps *ops, KvScript *s, const KvModel *m,
                          KvDecodeSpec *spec, KvDecodeResult *out, KvBackendStats *stats,
                          KvError *err) {
    memset(out, 0, sizeof *out);
    if (stats != NULL) memset(stats, 0, sizeof *stats);
    KvStatus st = kv_script_bind(s, m, spec, err);
    if (st != KV_OK) return st;
    return kv_decode_run(ops != NULL ? ops : &kv_backend_cpu, m, spec, out, stats, err);
}
