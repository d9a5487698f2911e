/* corpus.h: the malformed-input corpus for the loader tests.
 *
 * A small hand-made model (vocab 64, hidden 16, 2 layers, 2 heads / 1 kv
 * head, head_dim 8, intermediate 32, window 4) is built here with
 * kv_config_to_json + kv_st_serialize, independent of fixtures/. Each corpus
 * case takes that valid base, applies one mutation (to the config.json tree,
 * the safetensors header tree, the data section or the raw bytes) and states
 * the status and the message substrings the loader must produce. */
#ifndef KV_TEST_CORPUS_H
#define KV_TEST_CORPUS_H

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "model.h"
#include "safetensors.h"
#include "status.h"

/* Base model dimensions. */
#define CORPUS_VOCAB 64
#define CORPUS_HIDDEN 16
#define CORPUS_INTER 32
#define CORPUS_LAYERS 2
#define CORPUS_HEADS 2
#define CORPUS_KV_HEADS 1
#define CORPUS_HEAD_DIM 8
#define CORPUS_WINDOW 4
#define CORPUS_MAX_TENSORS (3 + CORPUS_LAYERS * 11)

/* How the base's weights are stored. */
typedef enum {
    CORPUS_F32,        /* corpus_value(), F32 */
    CORPUS_F16_BITS,   /* corpus_bits16() patterns as F16 (specials, subnormals) */
    CORPUS_BF16_BITS,  /* corpus_bits16() patterns as BF16 */
    CORPUS_F16_VALUES, /* corpus_value() encoded exactly as F16 */
} CorpusEncoding;

typedef struct {
    char name[KV_ST_MAX_NAME];
    int rank;
    int64_t shape[2];
} CorpusTensor;

/* The base configuration of a family (gemma2 hybrid + tied, mistral all
 * sliding + untied). */
void corpus_config(KvFamily family, KvConfig *out);

/* The tensors cfg needs, in HF order: embed, layers, norm, lm_head (untied).
 * Returns the count (at most 3 + 11 * num_layers entries written). */
size_t corpus_tensors(const KvConfig *cfg, CorpusTensor *out);

/* Element i of tensor `name`: multiples of 1/16 in [-0.5, 0.5], exact in
 * F32, F16 and BF16. */
float corpus_value(const char *name, size_t i);

/* A 16-bit pattern for element i of `name`: the first elements are special
 * values (zeros, subnormals, max, infinities, NaN), the rest scrambled. */
uint16_t corpus_bits16(const char *name, size_t i);

/* The name of the misaligning tensor of corpus_image: one the model's ignore
 * list admits (model/model.c), so the base still loads: the stored
 * lm_head.weight when tied (gemma2), a saved rotary inv_freq (mistral). */
const char *corpus_pad_name(const KvConfig *cfg);

/* Builds a safetensors image of cfg's tensors. With misalign, a 1-element F16
 * tensor corpus_pad_name(cfg) is written first so every later tensor is 2
 * bytes off 4-byte alignment. Aborts on out-of-memory (test code). */
void corpus_image(const KvConfig *cfg, CorpusEncoding enc, bool misalign, uint8_t **st,
                  size_t *st_len);

/* What a mutation works on. */
typedef struct {
    cJSON *config;      /* config.json tree */
    cJSON *header;      /* safetensors header tree */
    uint8_t *data;      /* (data_len) data section, malloc'd */
    size_t data_len;
    uint8_t *raw;       /* set by a mutation: the final image, used as is (malloc'd) */
    size_t raw_len;
    char *raw_config;   /* set by a mutation: the final config text (malloc'd) */
} CorpusInput;

typedef void (*CorpusMutate)(CorpusInput *in);

typedef struct {
    const char *name;
    KvFamily family;     /* which base */
    CorpusMutate mutate;
    KvStatus expect;
    const char *file;    /* "config.json" or "model.safetensors" (in the message); NULL if OK */
    const char *substr[3]; /* every non-NULL one must appear in the message */
} CorpusCase;

extern const CorpusCase corpus_cases[];
extern const size_t corpus_n_cases;

/* The inputs of case c: config text and safetensors image, both malloc'd. */
void corpus_case_build(const CorpusCase *c, char **config, size_t *config_len, uint8_t **st,
                       size_t *st_len);

#endif
