/* scenario.h: the default decode scenarios (DESIGN §5), parameterised by
 * the window W of the model: at the full scale each decodes 3 W + 1 steps
 * past the window, at real scale (large W) KV_SCENARIO_TAIL steps past the
 * crossing or scripted event it is about. Prompt tokens come from the prompt seed (kv_prng_stream keyed by
 * scenario and row), drawn from [1, vocab) so id 0 can pad. */
#ifndef KV_SCENARIO_H
#define KV_SCENARIO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "status.h"

typedef struct {
    char name[64];
    uint64_t seed;         /* prompt token seed (printed with every result) */
    int64_t batch;         /* B */
    int64_t prompt_len;    /* P, padded */
    int32_t *prompt;       /* (B, P) left-padded, or right-padded (per-row positions) */
    uint8_t *real;         /* (B, P) */
    int64_t new_tokens;
    int64_t prefill_chunk; /* 0 = whole prompt */
    /* Prefix reuse (DESIGN §5, prefix_reuse_after_wrap); all 0 / NULL
     * otherwise. The prefill saves a prefix-cache entry after its first
     * save_after columns; at decode step switch_step a second request
     * restores that entry and feeds its own suffix as one forward (step
     * switch_step's logits are its last token's), then decodes on. */
    int64_t save_after;
    int64_t switch_step;
    int64_t suffix_len;
    int32_t *suffix;       /* (B, suffix_len) real tokens */
    /* Context shift (DESIGN §5, context_shift); all 0 otherwise: before
     * decode step shift_step's forward, positions shift_keep .. shift_keep
     * + shift_drop - 1 are dropped and the later ones move down, keys
     * re-rotated (kv_cpu_shift). */
    int64_t shift_step;
    int64_t shift_keep;
    int64_t shift_drop;
    /* A prompts file with texts (kv_prompts_load; NULL / "" otherwise): each
     * row's text ((batch + 1) entries, a NULL after the last) and the
     * tokenizer that made the ids, as KvRun.prompt_text and .tokenizer. */
    char **texts;
    char tokenizer[256];
} KvScenario;

/* Windows up to this get the full set: every scenario decodes 3 W + 1
 * steps past its crossing (cheap at W 16, and several wraps of every
 * cache). Above it the real-scale set: the same scenarios and bug classes,
 * prompts sized to cross W (pytorch #159855's ~1.03 W batch among them),
 * and KV_SCENARIO_TAIL steps past the crossing: 3 W steps at W 512 would be
 * ~1500 decode steps of the whole model per run. */
#define KV_SCENARIO_FULL_MAX_W 32
#define KV_SCENARIO_TAIL 8
/* At real scale a forward that must cross W inside itself (a chunk, a
 * reused prefix's suffix) starts this many positions before W: the long
 * history before it is one forward, which every CPU variant takes from the
 * shared prefill tape, and the forward each variant computes itself is
 * short. */
#define KV_SCENARIO_LEAD 8

typedef enum { KV_SCALE_FULL = 0, KV_SCALE_REAL = 1 } KvScenarioScale;

/* The scale of cfg's scenarios: full when its window (16 without one) is
 * at most KV_SCENARIO_FULL_MAX_W, else real. */
KvScenarioScale kv_scenario_scale(const KvConfig *cfg);

/* Names of the default set, in order; *count receives their number. */
const char *const *kv_scenario_names(int *count);

/* The default set followed by the extended scenarios (`--scenarios
 * extended`): the right-padded ones (DESIGN §5), kept out of the default
 * gate for its time. *count receives their number. */
const char *const *kv_scenario_all_names(int *count);

/* Builds scenario `name` for cfg (W = the window, or 16 without one) at
 * kv_scenario_scale(cfg). Unknown name: KV_ERR_INPUT listing the known
 * ones. */
/* The real-scale token stream of prompt seed `seed` (its first n tokens
 * into out (n)): every real-scale scenario's first row is a prefix of it,
 * so their reference prefills are cut from one forward (stream_tape.h). */
void kv_scenario_stream(const KvConfig *cfg, uint64_t seed, int64_t n, int32_t *out);

KvStatus kv_scenario_build(const KvConfig *cfg, const char *name, uint64_t seed, KvScenario *out,
                           KvError *err);

/* The same at a given scale. */
KvStatus kv_scenario_build_at(const KvConfig *cfg, const char *name, uint64_t seed,
                              KvScenarioScale scale, KvScenario *out, KvError *err);

/* A custom scenario: `batch` prompts (any lengths >= 1, left-padded here)
 * decoding new_tokens tokens. */
KvStatus kv_scenario_custom(const char *name, const int32_t *const *prompts, const int64_t *lens,
                            int64_t batch, int64_t new_tokens, KvScenario *out, KvError *err);

/* The same, left- or (right) right-padded; a right-padded batch is padded
 * further to a multiple of pad_to columns when pad_to > 1 (a static shape
 * of whole chunks). */
KvStatus kv_scenario_custom_padded(const char *name, const int32_t *const *prompts,
                                   const int64_t *lens, int64_t batch, int64_t new_tokens,
                                   bool right, int64_t pad_to, KvScenario *out, KvError *err);

/* The first scenario of the set: a short prompt whose decode crosses W. */
KvStatus kv_scenario_default(const KvConfig *cfg, uint64_t seed, KvScenario *out, KvError *err);

/* The fresh twin of a prefix-reuse scenario: the second request run from
 * scratch, its prompt the first save_after columns of sc's prompt plus the
 * suffix, decoding the new_tokens - switch_step tokens that follow the
 * switch, named "<name>.fresh". Its step j must equal sc's step
 * switch_step + j bitwise (DESIGN §5). KV_ERR_INPUT when sc has no switch
 * inside its decode (no script, or --max-new-tokens cut it off). */
KvStatus kv_scenario_fresh(const KvScenario *sc, KvScenario *out, KvError *err);

/* True when sc shifts its context inside its decode. */
bool kv_scenario_shifts(const KvScenario *sc);

/* The fresh twin of a context-shift scenario: the context as it stands
 * after the shift, run from scratch. Its prompt is the kept prefix, then
 * the context after the dropped span (sc's prompt followed by the tokens
 * its decode fed before the shift, from `tokens`, (sc->new_tokens, B): a
 * run's greedy tokens), then the token the shift step feeds; it decodes
 * the new_tokens - shift_step steps from there, and *forced
 * ((new_tokens - shift_step, B), malloc'd) feeds `tokens`' later steps so
 * the two stay comparable past a near-tie flip. Its step j is sc's step
 * shift_step + j (comparison shifted_vs_fresh, within a tolerance: RoPE
 * re-applied is not RoPE recomputed). Named "<name>.fresh". KV_ERR_INPUT
 * when sc does not shift inside its decode. */
KvStatus kv_scenario_shift_fresh(const KvScenario *sc, const int32_t *tokens, KvScenario *out,
                                 int32_t **forced, KvError *err);

/* Whether a context shift of cfg's model can be judged against a fresh run:
 * only when every layer slides, and only when the dropped span lies beyond
 * the receptive field of every key still read (the scenario is built so).
 * A full-attention layer's hidden states keep what the dropped tokens
 * contributed, so on such a model a shifted run is an approximation of the
 * fresh one by design, not by rounding; *why receives the reason. */
bool kv_scenario_shift_judged(const KvConfig *cfg, char *why, size_t why_len);

/* True when sc switches requests inside its decode (a fresh twin exists). */
bool kv_scenario_switches(const KvScenario *sc);

void kv_scenario_free(KvScenario *s);

#endif
