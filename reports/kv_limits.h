/* kv_limits.h (not limits.h: reports/ is on the include path of every
 * target that links the report library, and a "limits.h" there would
 * shadow the C library's <limits.h>): the one table of size limits that the report writer, the report
 * reader and the gate share. A size the gate accepts is one
 * its writer writes and its reader reads back: the gate checks a scenario
 * (kv_limits_check_scenario) before any work, the writer refuses a report
 * its reader would refuse (kv_report_write_h5), and the reader refuses
 * anything beyond these (kv_report_read_h5). python/kvrepro/names.py
 * mirrors the ones its command line bounds.
 *
 * Each cap is far above what a gate writes; the comments say how far. */
#ifndef KV_LIMITS_H
#define KV_LIMITS_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"

/* Runs in /runs. The default gate writes 1022 (2 fixtures x 7 scenarios x
 * (1 reference + 6 variants x 2 backends x 2 modes x 3 repeats)), with
 * --faults all 9 times that (9198). A KvRun costs about 1 KB before its
 * arrays, so the cap is about 270 MB of run records. */
#define KV_REPORT_MAX_RUNS ((int64_t)1 << 18)
/* Decode steps per run, so also the gate's --max-new-tokens: the scenarios
 * run a few windows (hundreds of steps), --max-new-tokens a few thousand; a
 * million is a long-context run (the longest contexts, Qwen2's, reach
 * 131072). */
#define KV_REPORT_MAX_STEPS ((int64_t)1 << 20)
/* Batch rows per run, so also the rows of a --prompts file: the scenarios
 * use 1 or 2, --prompts files a few dozen. */
#define KV_REPORT_MAX_BATCH ((int64_t)1 << 12)
/* Prompt length (padded, i.e. the longest row of a --prompts file): a
 * million tokens of context. Also a prefix-reuse suffix's length. */
#define KV_REPORT_MAX_PROMPT_LEN ((int64_t)1 << 20)
/* Vocabulary: the largest current tokenizers have about 256k entries (Gemma
 * 2: 256000); 4M leaves room without letting (S, B, V) run away. */
#define KV_REPORT_MAX_VOCAB ((int64_t)1 << 22)
/* Named probes per step: the forward pass records a handful per layer
 * (about 10 x 128 layers for the deepest models) plus embed and logits. */
#define KV_REPORT_MAX_PROBES ((int64_t)1 << 16)
/* Top-k logits kept per row when full logits are not stored: the gate keeps
 * 16. */
#define KV_REPORT_MAX_TOPK ((int64_t)1 << 10)
/* Named tolerances in /tolerances: the comparator's two (DESIGN §6), plus
 * three per calibrated unit (spread@, fp64_err@, max_rel_err@), and a
 * calibrated unit records at least four runs (the reference and the
 * ensemble), so a report within KV_REPORT_MAX_RUNS holds fewer than this. */
#define KV_REPORT_MAX_TOLERANCES ((int64_t)1 << 18)
/* Comparisons per run: the matrix compares a candidate run with at most 4
 * others (reference, replay, graph_vs_eager, variant_vs_variant; or repeat),
 * so /comparisons has at most 4 rows per run; the cap allows 16. */
#define KV_REPORT_MAX_COMPARISONS_PER_RUN 16
/* Bytes of data per stored byte in a deflated dataset: deflate's own limit
 * (a 258-byte match in 2 bits is 1032:1; zlib's headers only lower it). A
 * dataset claiming more is not deflate output but fill values or a crafted
 * size. A real bound rather than a guess: logits that compress extremely
 * well (all NaN from a broken candidate) must still be readable. */
#define KV_REPORT_MAX_DEFLATE_RATIO 1032
/* Bytes of fixed-length string per element (attribute or dataset): the
 * widest field the schema has is 512 bytes. */
#define KV_REPORT_MAX_STRING_BYTES ((size_t)1 << 16)
/* Memory the reader may allocate for one report, all arrays together: the
 * default gate's report needs a few MB; a report needing more than 16 GiB
 * could not be shown on the machines that run the gate, and is refused
 * rather than left to swap or to the OOM killer. */
#define KV_REPORT_MAX_READ_BYTES ((uint64_t)1 << 34)
/* ... and, per byte of the file, at most KV_REPORT_MAX_READ_RATIO bytes
 * (beyond a floor of KV_REPORT_READ_FLOOR_BYTES, which any file may use):
 * runs that share one logits dataset (the writer's hard links) each get a
 * copy, so without this a file of a few MB of hard links to one
 * well-compressed dataset asks for gigabytes. Deflate's own ratio: a file
 * without shared objects never needs more (every dataset is within it),
 * so the writer, which shares logits only to save space, stores each copy
 * itself when sharing would pass it (kv_report_write_h5). */
#define KV_REPORT_MAX_READ_RATIO ((uint64_t)KV_REPORT_MAX_DEFLATE_RATIO)
#define KV_REPORT_READ_FLOOR_BYTES ((uint64_t)64 << 20)

/* A --prompts file is token ids as JSON text (~6 bytes an id): 64 MiB is
 * ~10M tokens, more than a CPU reference decodes in a day. */
#define KV_PROMPTS_MAX_BYTES ((int64_t)64 << 20)

/* The bytes a reader of a file of file_size bytes may allocate:
 * max(KV_REPORT_READ_FLOOR_BYTES, KV_REPORT_MAX_READ_RATIO x file_size),
 * at most KV_REPORT_MAX_READ_BYTES. */
uint64_t kv_limits_read_budget(uint64_t file_size);

/* Checks a decode's sizes against the table before any work: 1 <= batch <=
 * KV_REPORT_MAX_BATCH (rows), 1 <= prompt_len <= KV_REPORT_MAX_PROMPT_LEN
 * (the padded length, i.e. the longest row) and 1 <= max_new <=
 * KV_REPORT_MAX_STEPS (decode steps, i.e. tokens each row decodes), so a
 * run of them is one the report writer writes and its reader reads. what
 * names the source for the message ("prompts.json", "--max-new-tokens");
 * NULL reads as "the scenario". KV_OK, or KV_ERR_INPUT "<what>: <field>:
 * expected 1..<cap> (<why>), found <n>" naming the first size out of range
 * (batch, then prompt length, then new tokens). */
KvStatus kv_limits_check_scenario(int64_t batch, int64_t prompt_len, int64_t max_new,
                                  const char *what, KvError *err);

/* Checks, before any work, that a report of n_runs runs of these sizes
 * (steps decode steps of batch rows, prompt_len padded prompt tokens,
 * n_probes probes a step; full logits of vocab entries, or topk > 0 kept a
 * row) is one its reader can hold: at most KV_REPORT_MAX_READ_BYTES, every
 * array of every run and the run records, with KV_REPORT_MAX_COMPARISONS_
 * PER_RUN comparisons a run (an upper bound). The gate holds all of it in
 * memory while it runs, so a matrix beyond it ends out of memory (exit 3)
 * or with a report nobody can read. KV_OK, or KV_ERR_INPUT "<what>: a
 * report of N runs of S steps x B rows x V logits needs ~X GiB to hold,
 * above the 16 GiB its reader takes (KV_REPORT_MAX_READ_BYTES)"; sizes
 * out of the table are refused as kv_limits_check_scenario does. */
KvStatus kv_limits_check_report(int64_t n_runs, int64_t steps, int64_t batch, int64_t vocab,
                                int64_t topk, int64_t n_probes, int64_t prompt_len,
                                const char *what, KvError *err);

#endif
