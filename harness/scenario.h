/* scenario.h: the default decode scenarios (DESIGN §5), parameterised by
 * the window W of the model, each decoding at least 3 x W steps past the
 * window. Prompt tokens come from the prompt seed (kv_prng_stream keyed by
 * scenario and row), drawn from [1, vocab) so id 0 can pad. */
#ifndef KV_SCENARIO_H
#define KV_SCENARIO_H

#include <stdint.h>

#include "config.h"
#include "status.h"

typedef struct {
    char name[64];
    uint64_t seed;         /* prompt token seed (printed with every result) */
    int64_t batch;         /* B */
    int64_t prompt_len;    /* P, padded */
    int32_t *prompt;       /* (B, P) left-padded */
    uint8_t *real;         /* (B, P) */
    int64_t new_tokens;
    int64_t prefill_chunk; /* 0 = whole prompt */
} KvScenario;

/* Names of the default set, in order; *count receives their number. */
const char *const *kv_scenario_names(int *count);

/* Builds scenario `name` for cfg (W = the window, or 16 without one).
 * Unknown name: KV_ERR_INPUT listing the known ones. */
KvStatus kv_scenario_build(const KvConfig *cfg, const char *name, uint64_t seed, KvScenario *out,
                           KvError *err);

/* A custom scenario: `batch` prompts (any lengths >= 1, left-padded here)
 * decoding new_tokens tokens. */
KvStatus kv_scenario_custom(const char *name, const int32_t *const *prompts, const int64_t *lens,
                            int64_t batch, int64_t new_tokens, KvScenario *out, KvError *err);

/* The first scenario of the set: a short prompt whose decode crosses W. */
KvStatus kv_scenario_default(const KvConfig *cfg, uint64_t seed, KvScenario *out, KvError *err);

void kv_scenario_free(KvScenario *s);

#endif
