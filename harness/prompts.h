/* prompts.h: a prompts file as a scenario. The file is a JSON array of
 * non-empty arrays of token ids, one per row, or the object {"format":
 * "kvrepro-prompts", "version": 1, "prompts": [the same array], "texts":
 * [one string per row] (optional), "tokenizer": {"name", "vocab_size",
 * "vocab_sha256", "add_special_tokens" (optional)} (optional)}, no other key;
 * the rows become one left-padded batch (kv_scenario_custom), named
 * "prompts", and the texts (with the tokenizer's identity) go to its
 * KvScenario.texts / .tokenizer. A bad object form is KV_ERR_INPUT naming
 * the file and the key. */
#ifndef KV_PROMPTS_H
#define KV_PROMPTS_H

#include <stdint.h>

#include "scenario.h"
#include "status.h"

/* Reads `path` (a regular file of at most KV_PROMPTS_MAX_BYTES, 64 MiB; a
 * FIFO or a device is refused before any read can block) into *out, each
 * row decoding new_tokens tokens. The file is one JSON value: anything but
 * whitespace after the array is refused. Its rows, its longest row and
 * new_tokens are checked against the limits table (kv_limits_check_scenario,
 * kv_limits.h) before any row is copied. Token ids are checked to be
 * integers in [0, 2^31); the vocabulary bound is the model's, so the caller
 * checks it. A file that cannot be opened or read, is too large, is not
 * such an array, has content after it, has more rows or longer rows than
 * the table allows, or holds an empty row or a bad id, and a new_tokens
 * outside 1..KV_REPORT_MAX_STEPS: KV_ERR_INPUT naming the file (and the
 * prompt and token); out of memory for the rows: KV_ERR_INTERNAL. Free
 * *out with kv_scenario_free. */
KvStatus kv_prompts_load(const char *path, int64_t new_tokens, KvScenario *out, KvError *err);

#endif
