/* scenario.h: decode scenarios (DESIGN §5). For now the default scenario: a
 * short prompt whose decode crosses the window and runs at least 3 x W
 * steps past it. The full scenario set lands with the harness. */
#ifndef KV_SCENARIO_H
#define KV_SCENARIO_H

#include <stdint.h>

#include "config.h"
#include "status.h"

typedef struct {
    char name[64];
    uint64_t seed;        /* prompt token seed (printed with every result) */
    int64_t batch;        /* B */
    int64_t prompt_len;   /* P, padded */
    int32_t *prompt;      /* (B, P) left-padded */
    uint8_t *real;        /* (B, P) */
    int64_t new_tokens;
    int64_t prefill_chunk; /* 0 = whole prompt */
} KvScenario;

/* Prompt length of the default scenario: short, so the decode crosses W. */
#define KV_SCENARIO_SHORT_PROMPT 5

/* The default scenario for cfg: one row, KV_SCENARIO_SHORT_PROMPT tokens
 * drawn from `seed`, W + 3W new tokens (W = the window, or 16 without one). */
KvStatus kv_scenario_default(const KvConfig *cfg, uint64_t seed, KvScenario *out, KvError *err);
void kv_scenario_free(KvScenario *s);

#endif
