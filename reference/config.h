/* config.h: the model configuration read from a Hugging Face config.json.
 *
 * Two families (DESIGN §1): gemma2 and mistral (llama is accepted as mistral
 * without a sliding window). Every field is validated on load; a bad field
 * gives KV_ERR_INPUT with a message naming the file and the field. */
#ifndef KV_CONFIG_H
#define KV_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "status.h"

#define KV_MAX_LAYERS 512

typedef enum { KV_FAMILY_GEMMA2 = 0, KV_FAMILY_MISTRAL = 1 } KvFamily;

typedef struct {
    KvFamily family;
    char model_type[32];          /* as written: "gemma2", "mistral" or "llama" */
    int64_t vocab_size;
    int64_t hidden_size;
    int64_t intermediate_size;
    int64_t num_layers;           /* num_hidden_layers */
    int64_t num_heads;            /* num_attention_heads */
    int64_t num_kv_heads;         /* num_key_value_heads; defaults to num_heads */
    int64_t head_dim;             /* defaults to hidden_size / num_heads; even (RoPE) */
    int64_t sliding_window;       /* W; 0 when no layer slides */
    int64_t max_position_embeddings;
    double rms_norm_eps;
    double rope_theta;            /* rope_theta or rope_parameters.rope_theta */
    double query_pre_attn_scalar; /* gemma2: scores scaled by this^-0.5 */
    double attn_logit_softcapping;  /* gemma2; 0 = off */
    double final_logit_softcapping; /* gemma2; 0 = off */
    bool tie_word_embeddings;
    uint8_t layer_sliding[KV_MAX_LAYERS]; /* (num_layers) 1 = sliding_attention */
} KvConfig;

/* Parses config.json text (len bytes, need not be NUL-terminated). `label` is
 * the file name used in messages. On failure *out is left zeroed. */
KvStatus kv_config_parse(const char *text, size_t len, const char *label, KvConfig *out,
                         KvError *err);

/* Reads and parses the file at path. */
KvStatus kv_config_load(const char *path, KvConfig *out, KvError *err);

/* Serialises cfg as a Hugging Face style config.json (what transformers would
 * read back to the same model). Returns a malloc'd NUL-terminated string or
 * NULL on out-of-memory. */
char *kv_config_to_json(const KvConfig *cfg);

/* The attention score scale: query_pre_attn_scalar^-0.5 (gemma2) or
 * head_dim^-0.5 (mistral), rounded to float as torch applies it. */
float kv_config_attn_scale(const KvConfig *cfg);

/* The window of layer `layer`: cfg->sliding_window for sliding layers, 0 (no
 * window) for full-attention layers. */
int64_t kv_config_layer_window(const KvConfig *cfg, int64_t layer);

const char *kv_family_name(KvFamily f);

#endif
