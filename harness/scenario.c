/* scenario.c: building the default scenarios from a config and a seed. */
#include "scenario.h"

#include "report.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "decode.h"
#include "prng.h"

#define MAX_ROWS 4

/* A row's prompt length: w * W + half * (W / 2) + w32 * (W / 32) + add
 * tokens (a script adds its own: kv_scenario_build). */
typedef struct {
    int64_t w, half, w32, add;
} RowLen;

/* A scenario at both scales (kv_scenario_scale): `full` for small windows,
 * `real` above KV_SCENARIO_FULL_MAX_W, where a decode of 3 W past the
 * window would cost hours and each bug class needs only the crossing it
 * is about plus KV_SCENARIO_TAIL steps. An entry names what it sets; what
 * it leaves out is 0: no tokens, one prefill, no script, left padding, in
 * the default set. */
typedef struct {
    const char *name;
    int64_t batch;
    RowLen full[MAX_ROWS];
    RowLen real[MAX_ROWS];
    bool chunked; /* prefill in chunks of W / 2 + 1 */
    int script;   /* SCRIPT_*: a request switch judged against a fresh twin */
    bool right;   /* right-padded: rows at their own positions (DESIGN §2) */
    bool extended; /* in the extended set only (kv_scenario_all_names) */
} ScenarioDef;

enum {
    SCRIPT_NONE = 0,
    SCRIPT_PREFIX_REUSE = 1, /* prefix reuse after wrap (kv_scenario_fresh) */
    SCRIPT_SPECULATIVE = 2,  /* speculative verification and rollback past W */
    SCRIPT_CONTEXT_SHIFT = 3, /* a context shift mid-decode (kv_scenario_shift_fresh) */
};

/* The largest layer window (16 without one), and the receptive field of
 * the stack below the last layer: how many positions back a key of the
 * last layer still depends on, sum of (w_l - 1) over the other layers,
 * when every layer slides; 0 when one is full (the field is unbounded and
 * a shift is not judged against a fresh run, kv_scenario_shift_judged). */
static int64_t shift_window(const KvConfig *cfg) {
    const int64_t w_max = kv_config_max_window(cfg);
    return w_max > 0 ? w_max : 16;
}

static int64_t shift_receptive(const KvConfig *cfg) {
    int64_t field = 0;
    for (int64_t l = 0; l < cfg->num_layers; l++) {
        const int64_t w = kv_config_layer_window(cfg, l);
        if (w == 0) return 0;
        if (l + 1 < cfg->num_layers) field += w - 1;
    }
    return field;
}

bool kv_scenario_shift_judged(const KvConfig *cfg, char *why, size_t why_len) {
    for (int64_t l = 0; l < cfg->num_layers; l++) {
        if (kv_config_layer_window(cfg, l) == 0) {
            snprintf(why, why_len, "not judged against a fresh run: layer %lld attends the whole "
                     "context, so the kept tokens' states still hold what the dropped ones "
                     "contributed (a shift approximates a fresh run there by design)",
                     (long long)l);
            return false;
        }
    }
    if (why_len > 0) why[0] = '\0';
    return true;
}

/* Draft tokens a speculative step verifies at once: W/4 + 1, at most 9
 * (engines draft a handful), so that at least two are rejected. */
static int64_t spec_drafts(int64_t w) { return w / 4 + 1 < 9 ? w / 4 + 1 : 9; }

static const ScenarioDef k_defs[] = {
    /* A short prompt whose decode fills the cache token by token and
     * crosses W; at real scale the prompt is W - 8 (the crossing is what
     * the class needs, not W one-token steps). */
    {.name = "short_prompt_crosses_window", .batch = 1, .full = {{.add = 5}},
     .real = {{.w = 1, .add = -8}}},
    {.name = "prompt_w_minus_1", .batch = 1, .full = {{.w = 1, .add = -1}},
     .real = {{.w = 1, .add = -1}}},
    {.name = "prompt_w", .batch = 1, .full = {{.w = 1}}, .real = {{.w = 1}}},
    {.name = "prompt_w_plus_1", .batch = 1, .full = {{.w = 1, .add = 1}},
     .real = {{.w = 1, .add = 1}}},
    /* 1.5 W + 3 at real scale: past W, not a multiple of it */
    {.name = "prefill_longer_than_window", .batch = 1, .full = {{.w = 3}},
     .real = {{.w = 1, .half = 1, .add = 3}}},
    /* At real scale pytorch #159855's batch: a ~1.03 W prompt (W + W/32:
     * 4224 tokens at W 4096, the test's 4200) beside one of 10, left-padded. */
    {.name = "left_padded_batch", .batch = 2, .full = {{.w = 3}, {.add = 3}},
     .real = {{.w = 1, .w32 = 1}, {.add = 10}}},
    /* chunks of W / 2 + 1, the third crossing W; at real scale W + 3
     * tokens in chunks of W - KV_SCENARIO_LEAD: the first (shared,
     * prefill_tape.h) fills the cache, the second's 11 tokens cross W
     * inside one forward that reads it. */
    {.name = "chunked_prefill", .batch = 1, .full = {{.w = 3}},
     .real = {{.w = 1, .add = 3}}, .chunked = true},
    /* TRT-LLM PR #2983: a prefix-cache entry of a request's first W/2 + 1
     * tokens (a shared system prompt) is reused by a second request after
     * the first request's sliding cache has wrapped (its prompt is 1.5 W, and
     * it decodes W/2 tokens before the switch; W + KV_SCENARIO_LEAD and 2
     * at real scale, whose positions past W still overwrite the entry's
     * first slots). The second
     * request's suffix of W/2 + 2 tokens crosses the window inside one
     * forward. At real scale the entry is the first W - KV_SCENARIO_LEAD
     * tokens and the suffix 2 x KV_SCENARIO_LEAD, so the forwards every
     * variant computes itself are short. An engine whose entry aliases the live cyclic cache
     * (planted: prefix_alias) reads the first request's later keys there. */
    {.name = "prefix_reuse_after_wrap", .batch = 1, .full = {{.w = 1, .half = 1}},
     .real = {{.w = 1, .add = KV_SCENARIO_LEAD}}, .script = SCRIPT_PREFIX_REUSE},
    /* flashinfer #3864: speculative decoding past the window. At position
     * 1.5 W (every sliding cache wrapped) k = spec_drafts(W) draft tokens
     * are verified in one forward, which writes their keys over the oldest
     * k slots of a cyclic cache; then the sequence rolls back to the first
     * k / 2 drafts (the accepted prefix: scripted, not judged from the
     * verification's per-position tokens) and decodes 3 W + 1 more (the
     * tail at real scale). The
     * rollback restores the state saved before the verification and feeds
     * the accepted drafts again; an engine that only truncates positions
     * (planted: prefix_alias) keeps the rejected drafts' keys in slots the
     * window still needs. The decode after the rollback must equal the
     * accepted context decoded from scratch. */
    {.name = "speculative_rollback_past_window", .batch = 1, .full = {{.w = 1, .half = 1}},
     .real = {{.w = 1, .half = 1}}, .script = SCRIPT_SPECULATIVE},
    /* transformers #44742's static-shape loop: a batch right-padded to a fixed length
     * (a whole number of chunks), prefilled in chunks of one fixed shape
     * (W / 2 + 1; a row whose prompt has ended feeds a chunk of pads), then
     * a fixed-count decode. Each row writes at its own position (prompt
     * length + step), so the rows' sliding caches wrap at different steps;
     * every row must equal the row run alone. An engine that stores the
     * right pads as positions (planted: pad_slots) pushes real keys out of
     * the window. Real scale: rows of W + 3, W - 2 and W - 5 tokens. */
    {.name = "right_padded_static_loop", .batch = 3,
     .full = {{.w = 1, .add = 3}, {.half = 1, .add = 1}, {.add = 2}},
     .real = {{.w = 1, .add = 3}, {.w = 1, .add = -2}, {.w = 1, .add = -5}}, .chunked = true,
     .right = true, .extended = true},
    /* llama.cpp #14097: parallel sequences at different positions in one
     * batch: prompts of 2 W + 3, W - 1, W / 2 and 1 tokens (right-padded,
     * one prefill), so the rows cross the window at decode steps 1, W / 2
     * and W - 1 while the first is long past it (real scale: 1.5 W + 3, W - 1,
     * W - 3 and W - 6 tokens, crossing at steps 1, 3 and 6). */
    {.name = "parallel_positions", .batch = 4,
     .full = {{.w = 2, .add = 3}, {.w = 1, .add = -1}, {.half = 1}, {.add = 1}},
     .real = {{.w = 1, .half = 1, .add = 3}, {.w = 1, .add = -1}, {.w = 1, .add = -3},
              {.w = 1, .add = -6}},
     .right = true, .extended = true},
    /* llama.cpp #12357 (Gemma 3 gibberish after a context shift): at
     * decode step W/2 + 1 the context is shifted as an engine does when it
     * is full: the first W/4 positions are kept (a system prompt), the next
     * 1.5 W + 1 dropped (not a multiple of any window, so a ring's slots
     * must move), the rest moved down with their keys re-rotated; then
     * 3 W + 1 more steps (real scale: at step 2, then the tail). The context
     * before the shift is long enough that the dropped span lies beyond
     * the receptive field of every key still read when every layer slides,
     * so the decode after the shift must match the shifted context run from
     * scratch within the shift's tolerance; every variant must match the reference's shift bitwise.
     * An engine that leaves each slot in its cell (planted: shift_cells)
     * reads the wrong keys through the ring's p % W. */
    {.name = "context_shift", .batch = 1, .script = SCRIPT_CONTEXT_SHIFT, .extended = true},
};
#define N_DEFS (int)(sizeof k_defs / sizeof k_defs[0])

/* The extended scenarios follow the default ones in k_defs. */
const char *const *kv_scenario_names(int *count) {
    static const char *names[N_DEFS];
    int n = 0;
    for (int i = 0; i < N_DEFS; i++) {
        if (!k_defs[i].extended) names[n++] = k_defs[i].name;
    }
    *count = n;
    return names;
}

const char *const *kv_scenario_all_names(int *count) {
    static const char *names[N_DEFS];
    for (int i = 0; i < N_DEFS; i++) names[i] = k_defs[i].name;
    *count = N_DEFS;
    return names;
}

KvStatus kv_scenario_custom(const char *name, const int32_t *const *prompts, const int64_t *lens,
                            int64_t batch, int64_t new_tokens, KvScenario *out, KvError *err) {
    return kv_scenario_custom_padded(name, prompts, lens, batch, new_tokens, false, 0, out, err);
}

KvStatus kv_scenario_custom_padded(const char *name, const int32_t *const *prompts,
                                   const int64_t *lens, int64_t batch, int64_t new_tokens,
                                   bool right, int64_t pad_to, KvScenario *out, KvError *err) {
    memset(out, 0, sizeof *out);
    KvStatus st = kv_batch_pad(prompts, lens, batch, 0, right, &out->prompt, &out->real,
                               &out->prompt_len, err);
    if (st != KV_OK) return st;
    if (right && pad_to > 1 && out->prompt_len % pad_to != 0) {
        /* A static shape: pads to a whole number of chunks. */
        const int64_t P = out->prompt_len, L = (P + pad_to - 1) / pad_to * pad_to;
        int32_t *tok = calloc((size_t)(batch * L), sizeof *tok); /* (B, L), pad id 0 */
        uint8_t *real = calloc((size_t)(batch * L), 1);           /* (B, L) */
        if (tok == NULL || real == NULL) {
            free(tok);
            free(real);
            kv_scenario_free(out);
            return kv_error_set(err, KV_ERR_INTERNAL, "scenario %s: out of memory", name);
        }
        for (int64_t b = 0; b < batch; b++) {
            memcpy(tok + b * L, out->prompt + b * P, (size_t)P * sizeof *tok);
            memcpy(real + b * L, out->real + b * P, (size_t)P);
        }
        free(out->prompt);
        free(out->real);
        out->prompt = tok;
        out->real = real;
        out->prompt_len = L;
    }
    snprintf(out->name, sizeof out->name, "%s", name);
    out->batch = batch;
    out->new_tokens = new_tokens;
    return KV_OK;
}

void kv_scenario_stream(const KvConfig *cfg, uint64_t seed, int64_t n, int32_t *out) {
    KvPrng g = kv_prng_stream(seed, "scenario/real-stream/row0");
    for (int64_t i = 0; i < n; i++) {
        out[i] = 1 + (int32_t)kv_prng_below(&g, (uint32_t)(cfg->vocab_size - 1));
    }
}

KvScenarioScale kv_scenario_scale(const KvConfig *cfg) {
    const int64_t w = cfg->sliding_window > 0 ? cfg->sliding_window : 16;
    return w <= KV_SCENARIO_FULL_MAX_W ? KV_SCALE_FULL : KV_SCALE_REAL;
}

KvStatus kv_scenario_build(const KvConfig *cfg, const char *name, uint64_t seed, KvScenario *out,
                           KvError *err) {
    return kv_scenario_build_at(cfg, name, seed, kv_scenario_scale(cfg), out, err);
}

KvStatus kv_scenario_build_at(const KvConfig *cfg, const char *name, uint64_t seed,
                              KvScenarioScale scale, KvScenario *out, KvError *err) {
    memset(out, 0, sizeof *out);
    const ScenarioDef *d = NULL;
    for (int i = 0; i < N_DEFS; i++) {
        if (strcmp(k_defs[i].name, name) == 0) d = &k_defs[i];
    }
    if (d == NULL) {
        /* the names from the table, so a new scenario is listed here too */
        char names[1024] = "";
        size_t used = 0;
        for (int i = 0; i < N_DEFS; i++) {
            const int w = snprintf(names + used, sizeof names - used, "%s%s", i > 0 ? ", " : "",
                                   k_defs[i].name);
            if (w < 0 || (size_t)w >= sizeof names - used) break; /* truncated, terminated */
            used += (size_t)w;
        }
        return kv_error_set(err, KV_ERR_INPUT, "scenario '%s': unknown; expected one of %s", name,
                            names);
    }
    const int64_t w = cfg->sliding_window > 0 ? cfg->sliding_window : 16;
    const bool full = scale == KV_SCALE_FULL;
    /* Steps decoded past the scenario's last crossing or scripted event. */
    const int64_t tail = full ? 3 * w + 1 : KV_SCENARIO_TAIL;
    /* A context shift's keep, drop and step, and the positions stored
     * before it: keep + drop + the largest window + the receptive field. */
    const int64_t ws = shift_window(cfg);
    const int64_t sh_keep = ws / 4 > 0 ? ws / 4 : 1, sh_drop = ws + ws / 2 + 1;
    const int64_t sh_step = full ? ws / 2 + 1 : 2;
    const int64_t sh_stored = sh_keep + sh_drop + ws + shift_receptive(cfg);
    int32_t *rows[MAX_ROWS] = {NULL};
    int64_t lens[MAX_ROWS] = {0};
    KvStatus st = KV_OK;
    for (int64_t b = 0; b < d->batch; b++) {
        const RowLen *rl = full ? &d->full[b] : &d->real[b];
        lens[b] = rl->w * w + rl->half * (w / 2) + rl->w32 * (w / 32) + rl->add +
                  (d->script == SCRIPT_SPECULATIVE ? spec_drafts(w) : 0);
        if (d->script == SCRIPT_CONTEXT_SHIFT) lens[b] = sh_stored - (sh_step - 1);
        if (lens[b] < 1) lens[b] = 1;
        rows[b] = malloc((size_t)lens[b] * sizeof(int32_t));
        if (rows[b] == NULL) {
            st = kv_error_set(err, KV_ERR_INTERNAL, "scenario %s: out of memory", name);
            goto cleanup;
        }
        if (!full && b == 0) {
            /* at real scale every first row is a prefix of one stream, so
             * the references' first rows share one forward
             * (stream_tape.h) */
            kv_scenario_stream(cfg, seed, lens[b], rows[b]);
            continue;
        }
        char stream[96];
        snprintf(stream, sizeof stream, "scenario/%s/row%lld", name, (long long)b);
        KvPrng g = kv_prng_stream(seed, stream);
        for (int64_t i = 0; i < lens[b]; i++) {
            rows[b][i] = 1 + (int32_t)kv_prng_below(&g, (uint32_t)(cfg->vocab_size - 1));
        }
    }
    {
        /* Cross the window if the prompt does not, then `tail` more steps.
         * Right-padded rows sit at their own positions and cross at their
         * own steps: at real scale the tail follows the last of them (the
         * full set's 3 W + 1 already covers every row). */
        int64_t longest = 0, cross = 0;
        for (int64_t b = 0; b < d->batch; b++) {
            longest = lens[b] > longest ? lens[b] : longest;
            if (d->right && !full && w - lens[b] > cross) cross = w - lens[b];
        }
        if (longest < w && w - longest > cross) cross = w - longest;
        /* a right-padded batch keeps W / 2 + 1 (its static shape pads
         * every row to a whole number of chunks) */
        const int64_t chunk = !d->chunked               ? 0
                              : full || d->right        ? w / 2 + 1
                                                        : w - KV_SCENARIO_LEAD;
        st = kv_scenario_custom_padded(name, (const int32_t *const *)rows, lens, d->batch,
                                       cross + tail, d->right, d->right ? chunk : 0, out, err);
        if (st != KV_OK) goto cleanup;
        out->seed = seed;
        out->prefill_chunk = chunk;
    }
    if (d->script == SCRIPT_CONTEXT_SHIFT) {
        out->shift_step = sh_step;
        out->shift_keep = sh_keep;
        out->shift_drop = sh_drop;
        out->new_tokens = sh_step + (full ? 3 * ws + 1 : KV_SCENARIO_TAIL);
    } else if (d->script != SCRIPT_NONE) {
        const bool reuse = d->script == SCRIPT_PREFIX_REUSE;
        /* Prefix reuse: the first request decodes W/2 tokens (at real
         * scale 2: its W + KV_SCENARIO_LEAD prompt has wrapped every
         * sliding cache already), the second `tail` after the switch. Speculative: the
         * prompt's last k tokens are the drafts, the prefill saves the
         * state before them and verifies them in one forward (step 0);
         * step 1 rolls back and feeds the accepted k / 2 again, as one
         * forward. */
        const int64_t k = spec_drafts(w);
        const int64_t entry = full ? w / 2 + 1 : w - KV_SCENARIO_LEAD;
        out->save_after = reuse ? entry : out->prompt_len - k;
        out->switch_step = reuse ? (full ? w / 2 : 2) : 1;
        out->new_tokens = out->switch_step + tail;
        out->suffix_len = reuse ? (full ? w / 2 + 2 : 2 * KV_SCENARIO_LEAD) : k / 2;
        out->suffix = malloc((size_t)(d->batch * out->suffix_len) * sizeof *out->suffix);
        if (out->suffix == NULL) {
            st = kv_error_set(err, KV_ERR_INTERNAL, "scenario %s: out of memory", name);
            kv_scenario_free(out);
            goto cleanup;
        }
        for (int64_t b = 0; b < d->batch; b++) {
            int32_t *suffix = out->suffix + b * out->suffix_len; /* (suffix_len) */
            if (!reuse) { /* the accepted drafts */
                memcpy(suffix, out->prompt + b * out->prompt_len + out->save_after,
                       (size_t)out->suffix_len * sizeof *suffix);
                continue;
            }
            char stream[96];
            snprintf(stream, sizeof stream, "scenario/%s/suffix%lld", name, (long long)b);
            KvPrng g = kv_prng_stream(seed, stream);
            for (int64_t i = 0; i < out->suffix_len; i++) {
                suffix[i] = 1 + (int32_t)kv_prng_below(&g, (uint32_t)(cfg->vocab_size - 1));
            }
        }
    }
cleanup:
    for (int b = 0; b < MAX_ROWS; b++) free(rows[b]);
    return st;
}

KvStatus kv_scenario_default(const KvConfig *cfg, uint64_t seed, KvScenario *out, KvError *err) {
    return kv_scenario_build(cfg, k_defs[0].name, seed, out, err);
}

bool kv_scenario_shifts(const KvScenario *sc) {
    return sc->shift_step > 0 && sc->shift_step < sc->new_tokens && sc->shift_drop > 0;
}

KvStatus kv_scenario_shift_fresh(const KvScenario *sc, const int32_t *tokens, KvScenario *out,
                                 int32_t **forced, KvError *err) {
    memset(out, 0, sizeof *out);
    *forced = NULL;
    if (!kv_scenario_shifts(sc)) {
        return kv_error_set(err, KV_ERR_INPUT, "scenario %s: no context shift inside its %lld "
                            "decode steps, so no fresh twin", sc->name, (long long)sc->new_tokens);
    }
    const int64_t B = sc->batch, P = sc->prompt_len, s0 = sc->shift_step;
    const int64_t K = sc->shift_keep, D = sc->shift_drop;
    const int64_t T = P + s0 - 1; /* positions stored before the shift */
    const int64_t L = T - D + 1;  /* the context after it, with the token step s0 feeds */
    const int64_t S = sc->new_tokens - s0;
    if (K + D > T) {
        return kv_error_set(err, KV_ERR_INPUT, "scenario %s: keep %lld + drop %lld exceed the "
                            "%lld positions stored before the shift", sc->name, (long long)K,
                            (long long)D, (long long)T);
    }
    out->prompt = malloc((size_t)(B * L) * sizeof *out->prompt); /* (B, L) */
    out->real = malloc((size_t)(B * L));                          /* (B, L) */
    *forced = malloc((size_t)(B * S) * sizeof **forced);          /* (S, B) */
    if (out->prompt == NULL || out->real == NULL || *forced == NULL) {
        kv_scenario_free(out);
        free(*forced);
        *forced = NULL;
        return kv_error_set(err, KV_ERR_INTERNAL, "scenario %s: out of memory", sc->name);
    }
    for (int64_t b = 0; b < B; b++) {
        int64_t j = 0;
        /* context column t: the prompt, then the token step t - P + 1 fed
         * (the greedy token of step t - P) */
        for (int64_t t = 0; t <= T; t++) {
            if (t >= K && t < K + D) continue;
            out->prompt[b * L + j] = t < P ? sc->prompt[b * P + t] : tokens[(t - P) * B + b];
            out->real[b * L + j] = t < P ? sc->real[b * P + t] : 1;
            j++;
        }
    }
    for (int64_t i = 0; i < S * B; i++) (*forced)[i] = tokens[s0 * B + i];
    snprintf(out->name, sizeof out->name, "%.56s.fresh", sc->name);
    out->seed = sc->seed;
    out->batch = B;
    out->prompt_len = L;
    out->new_tokens = S;
    return KV_OK;
}

bool kv_scenario_switches(const KvScenario *sc) {
    return sc->switch_step > 0 && sc->switch_step < sc->new_tokens && sc->suffix != NULL;
}

KvStatus kv_scenario_fresh(const KvScenario *sc, KvScenario *out, KvError *err) {
    memset(out, 0, sizeof *out);
    if (!kv_scenario_switches(sc)) {
        return kv_error_set(err, KV_ERR_INPUT, "scenario %s: no request switch inside its %lld "
                            "decode steps, so no fresh twin", sc->name, (long long)sc->new_tokens);
    }
    const int64_t B = sc->batch, P = sc->prompt_len, K = sc->save_after, S = sc->suffix_len;
    const int64_t L = K + S;
    out->prompt = malloc((size_t)(B * L) * sizeof *out->prompt); /* (B, L) */
    out->real = malloc((size_t)(B * L));                          /* (B, L) */
    if (out->prompt == NULL || out->real == NULL) {
        kv_scenario_free(out);
        return kv_error_set(err, KV_ERR_INTERNAL, "scenario %s: out of memory", sc->name);
    }
    for (int64_t b = 0; b < B; b++) {
        memcpy(out->prompt + b * L, sc->prompt + b * P, (size_t)K * sizeof *out->prompt);
        memcpy(out->real + b * L, sc->real + b * P, (size_t)K);
        memcpy(out->prompt + b * L + K, sc->suffix + b * S, (size_t)S * sizeof *out->prompt);
        memset(out->real + b * L + K, 1, (size_t)S);
    }
    snprintf(out->name, sizeof out->name, "%.56s.fresh", sc->name);
    out->seed = sc->seed;
    out->batch = B;
    out->prompt_len = L;
    out->new_tokens = sc->new_tokens - sc->switch_step;
    return KV_OK;
}

void kv_scenario_free(KvScenario *s) {
    if (s == NULL) return;
    free(s->prompt);
    free(s->real);
    free(s->suffix);
    kv_prompt_text_free(s->texts);
    memset(s, 0, sizeof *s);
}
