/* config.h: the model configuration read from a Hugging Face config.json.
 *
 * Four families (DESIGN §1): gemma2, gemma3_text (gemma2's layer with
 * q_norm/k_norm, a RoPE base of its own on sliding layers, no attention
 * softcap), mistral (llama is accepted as mistral without a sliding window)
 * and qwen2 (mistral's layer with q/k/v biases; the layers at index >=
 * max_window_layers slide when use_sliding_window). Every field is validated on load; a bad field
 * gives KV_ERR_INPUT with a message naming the file and the field. Every size
 * has a stated bound (below) that admits every real checkpoint, so nothing is
 * sized from an absurd value. */
#ifndef KV_CONFIG_H
#define KV_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "status.h"

/* Bounds on the sizes read from config.json, checked where each field is read
 * (the message names the file, the field, the bound and the value). Each
 * admits every real checkpoint of the families kvrepro reads or plans to
 * (DESIGN §1) with a margin, and refuses what only a corrupt or hostile file
 * holds, before anything is sized from it. Within them all the weights
 * of a dense model are below 2^52 bytes, so every size product fits in
 * int64; gpt_oss's experts multiply the MLP by up to KV_CONFIG_MAX_EXPERTS,
 * and the loader's size check refuses any product that would overflow. */

/* Layers (the size of layer_sliding): real models have up to ~128
 * (llama-3.1-405B: 126). */
#define KV_MAX_LAYERS 512
/* Token ids: gemma-3 has 262144, gpt-oss 201088, llama-3 128256; 4x the
 * largest. At least 2: a greedy decode over one id is meaningless, and the
 * harness draws prompt ids from [1, vocab_size). */
#define KV_CONFIG_MIN_VOCAB 2
#define KV_CONFIG_MAX_VOCAB 1048576
/* Residual width: 16384 in the widest public decoders (llama-3.1-405B); 4x. */
#define KV_CONFIG_MAX_HIDDEN 65536
/* MLP width: 53248 (llama-3.1-405B), ~100k in the widest; 2.5x that. */
#define KV_CONFIG_MAX_INTERMEDIATE 262144
/* Attention heads: 128 in the largest models (llama-3.1-405B, deepseek-v3);
 * 8x. num_key_value_heads divides num_attention_heads, so it is bounded too. */
#define KV_CONFIG_MAX_HEADS 1024
/* Per-head width: 64-256 in practice, 512 in the widest; 8x. Also applies to
 * the mistral default, hidden_size / num_attention_heads. */
#define KV_CONFIG_MAX_HEAD_DIM 4096
/* Sliding window in positions: 4096 (gemma2, mistral), 131072 in qwen2
 * configs; 8x. A sliding layer caches W rows per sequence, and the harness's
 * scenarios decode about 3W steps past prompts of up to 3W, so a larger
 * window could not be run anyway. */
#define KV_CONFIG_MAX_WINDOW 1048576
/* Context length: 131072 (gpt-oss, llama-3.1), 1010000 (qwen2.5-1M),
 * 10485760 (llama-4-scout); 1.6x the largest. Nothing is sized from it. */
#define KV_CONFIG_MAX_POSITIONS 16777216

typedef enum {
    KV_FAMILY_GEMMA2 = 0,
    KV_FAMILY_MISTRAL = 1,
    KV_FAMILY_QWEN2 = 2,
    KV_FAMILY_GEMMA3 = 3, /* model_type gemma3_text (Gemma3ForCausalLM) */
    KV_FAMILY_GPT_OSS = 4, /* model_type gpt_oss (GptOssForCausalLM) */
} KvFamily;

/* Most experts a gpt_oss layer may have, and may pick per token. */
#define KV_CONFIG_MAX_EXPERTS 4096

typedef struct {
    KvFamily family;
    char model_type[32];          /* as written: "gemma2", "gemma3_text", "mistral", "llama"
                                   * or "qwen2" */
    int64_t vocab_size;
    int64_t hidden_size;
    int64_t intermediate_size;
    int64_t num_layers;           /* num_hidden_layers */
    int64_t num_heads;            /* num_attention_heads */
    int64_t num_kv_heads;         /* num_key_value_heads; defaults to num_heads */
    int64_t head_dim;             /* defaults to hidden_size / num_heads; even (RoPE) */
    int64_t sliding_window;       /* W; 0 when no layer slides */
    bool sliding_window_defaulted; /* true when config.json has no sliding_window key and a
                                    * sliding layer uses transformers' class default (4096,
                                    * Gemma2Config and MistralConfig): the window was not
                                    * written down, so callers should say which one was used */
    int64_t max_position_embeddings;
    double rms_norm_eps;
    double rope_theta;            /* rope_theta or rope_parameters.rope_theta (gemma3: of the
                                   * full_attention layers) */
    double rope_theta_local;      /* gemma3: the sliding_attention layers' RoPE base
                                   * (rope_local_base_freq); 0 = rope_theta on every layer */
    double query_pre_attn_scalar; /* gemma2/3: scores scaled by this^-0.5 */
    double attn_logit_softcapping;  /* gemma2; 0 = off (always off for gemma3, whose attention
                                     * in transformers does not apply it) */
    double final_logit_softcapping; /* gemma2/3; 0 = off */
    bool tie_word_embeddings;
    bool attn_qkv_bias;           /* q/k/v projections add a bias (qwen2; o_proj has none) */
    bool qk_norm;                 /* gemma3: q_norm/k_norm, (1 + w) RMSNorm per head over
                                   * head_dim, after the projections and before RoPE */
    bool attn_o_bias;             /* gpt_oss: o_proj adds a bias too (attention_bias) */
    bool attn_sinks;              /* gpt_oss: a learned logit per query head joins each
                                   * softmax as an extra column, dropped after */
    /* YaRN RoPE (gpt_oss's rope_parameters, rope_type "yarn"): inv_freq
     * blends interpolated and extrapolated frequencies over a ramp, and cos,
     * sin are multiplied by rope_attention_factor. */
    bool rope_yarn;
    double rope_factor, rope_beta_fast, rope_beta_slow, rope_orig_max_pos;
    bool rope_truncate;
    double rope_attention_factor; /* 1 without YaRN */
    /* gpt_oss's MoE MLP (num_experts > 0): a router with bias picks
     * experts_per_tok experts per token, softmax over their logits; each
     * expert is a clamped SwiGLU with interleaved gate/up columns and biases;
     * intermediate_size is an expert's width. */
    int64_t num_experts;          /* num_local_experts; 0 = dense MLP */
    int64_t experts_per_tok;      /* num_experts_per_tok */
    double swiglu_limit, swiglu_alpha;
    uint8_t layer_sliding[KV_MAX_LAYERS]; /* (num_layers) 1 = sliding_attention */
    /* (num_layers) a sliding layer's own window, or 0: the layer takes
     * sliding_window. Set by mistral's list form of sliding_window (one
     * entry per layer, repeated over the layers; null = full attention),
     * Mistral's interleaved-window params and vLLM's reading of them; then
     * sliding_window is the largest entry, the size caches and scenarios are
     * planned for. */
    int64_t layer_window[KV_MAX_LAYERS];
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

/* Gemma-style layers (gemma2, gemma3): embeddings times sqrt(hidden),
 * RMSNorm with (1 + w), four norms per layer (post-attention and the
 * feed-forward pair around the MLP), GeGLU with the tanh gelu, scores
 * scaled by query_pre_attn_scalar^-0.5. */
bool kv_config_gemma_style(const KvConfig *cfg);

/* The RoPE base of layer `layer`: rope_theta_local on gemma3's sliding
 * layers (when set), rope_theta otherwise. */
double kv_config_layer_rope_theta(const KvConfig *cfg, int64_t layer);

/* The window of layer `layer`: its layer_window when set, else
 * cfg->sliding_window, for sliding layers; 0 (no window) for full-attention
 * layers. */
int64_t kv_config_layer_window(const KvConfig *cfg, int64_t layer);

/* The largest window of any layer (0 when none slides). */
int64_t kv_config_max_window(const KvConfig *cfg);

/* Whether some sliding layer's window differs from sliding_window (the
 * list form of sliding_window). */
bool kv_config_mixed_windows(const KvConfig *cfg);

/* "window W", or with mixed windows "windows W0,W1,..." per layer (0 = full
 * attention), NUL-terminated and truncated to n. */
void kv_config_window_text(const KvConfig *cfg, char *out, size_t n);

const char *kv_family_name(KvFamily f);

#endif
