/* fuzz_common.h: what the libFuzzer targets in tests/fuzz/ share: a
 * per-process scratch directory for the loaders that only take paths, file
 * writing, a property check that aborts (so libFuzzer records the input), and
 * the tiny model the safetensors target and the seed generator agree on. */
#ifndef KV_FUZZ_COMMON_H
#define KV_FUZZ_COMMON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "safetensors.h"
#include "status.h"

/* The scratch directory of this process, created on first use: a fresh
 * mkdtemp() directory under $KV_FUZZ_TMPDIR when set (the ctest driver points
 * it at a directory it removes afterwards), else /dev/shm when present, else
 * $TMPDIR or /tmp. Removed with its files at a normal exit; a crash leaves
 * it behind. Aborts when it cannot be created (a harness failure, not a
 * finding). */
const char *kv_fuzz_tmpdir(void);

/* tmpdir + "/" + name into buf (aborts when it does not fit). */
void kv_fuzz_path(char *buf, size_t size, const char *name);

/* Writes size bytes to path, replacing it; aborts on any I/O error. */
void kv_fuzz_write_file(const char *path, const uint8_t *data, size_t size);

/* A property of the code under test failed: prints "kvrepro fuzz: property
 * violated: <message>" and aborts, which libFuzzer reports as a crash. */
void kv_fuzz_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

#define KV_FUZZ_CHECK(cond, ...)                                                                   \
    do {                                                                                           \
        if (!(cond)) kv_fuzz_fail(__VA_ARGS__);                                                    \
    } while (0)

/* True when every byte of the n bytes at p is zero ("*out is left zeroed"). */
bool kv_fuzz_all_zero(const void *p, size_t n);

/* A status a loader may return for bad input: KV_OK or KV_ERR_INPUT. Inputs
 * are capped by -max_len, so KV_ERR_INTERNAL (out of memory) means a bug. */
void kv_fuzz_check_status(KvStatus st, const KvError *err, const char *what);

/* ---- the tiny model ------------------------------------------------------
 * One layer, vocab 8, hidden 4, 2 heads of head_dim 2 sharing 1 KV head,
 * intermediate 4, window 4: a whole checkpoint is a few kilobytes, small
 * enough to mutate. gemma2 is tied (no lm_head), mistral untied. */
extern const char kv_fuzz_tiny_gemma2_json[];
extern const char kv_fuzz_tiny_mistral_json[];

/* Up to this many tensors for a config of num_layers layers: per layer 4
 * norms, 4 projections, 4 biases, 2 head norms, sinks and 6 MoE tensors. */
#define KV_FUZZ_MAX_TENSORS(num_layers) (3 + 21 * (size_t)(num_layers))

typedef struct {
    char name[KV_ST_MAX_NAME];
    int rank;
    int64_t shape[3]; /* (rank) */
} KvFuzzTensor;

/* The tensors model.c binds for cfg, with the shapes it expects, in Hugging
 * Face order (embed, each layer, final norm, lm_head when untied), for every
 * family: gemma2/3's extra norms, gemma3's q/k norms, qwen2's and gpt_oss's
 * biases, gpt_oss's sinks, router and expert stacks. Written
 * independently of model.c: a config that parses plus these tensors must
 * load. Returns the count; out holds KV_FUZZ_MAX_TENSORS(num_layers). */
size_t kv_fuzz_model_tensors(const KvConfig *cfg, KvFuzzTensor *out);

/* Serialises the tensors of cfg (F32 unless dtype says otherwise; values
 * from a fixed pattern that is exact in F16 and BF16) with kv_st_serialize.
 * Returns KV_OK or the writer's status; *img is malloc'd. */
KvStatus kv_fuzz_model_image(const KvConfig *cfg, KvDtype dtype, uint8_t **img, size_t *len,
                             KvError *err);

#endif
