/* scenario.c: building the decode scenarios from a config and a seed. */
#include "scenario.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "decode.h"
#include "prng.h"

KvStatus kv_scenario_default(const KvConfig *cfg, uint64_t seed, KvScenario *out, KvError *err) {
    memset(out, 0, sizeof *out);
    int64_t w = cfg->sliding_window > 0 ? cfg->sliding_window : 16;
    int32_t toks[KV_SCENARIO_SHORT_PROMPT];
    KvPrng g = kv_prng_stream(seed, "scenario/short_past_window");
    /* Token 0 is kept for padding, so prompts draw from [1, vocab). */
    for (int i = 0; i < KV_SCENARIO_SHORT_PROMPT; i++) {
        toks[i] = 1 + (int32_t)kv_prng_below(&g, (uint32_t)(cfg->vocab_size - 1));
    }
    const int32_t *rows[1] = {toks};
    int64_t lens[1] = {KV_SCENARIO_SHORT_PROMPT};
    KvStatus st = kv_batch_left_pad(rows, lens, 1, 0, &out->prompt, &out->real, &out->prompt_len, err);
    if (st != KV_OK) return st;
    snprintf(out->name, sizeof out->name, "short_past_window");
    out->seed = seed;
    out->batch = 1;
    out->new_tokens = w + 3 * w;
    out->prefill_chunk = 0;
    return KV_OK;
}

void kv_scenario_free(KvScenario *s) {
    if (s == NULL) return;
    free(s->prompt);
    free(s->real);
    memset(s, 0, sizeof *s);
}
