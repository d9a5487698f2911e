/* model.h: a loaded model: configuration plus weight pointers.
 *
 * The matrices (KvMat) stay in the checkpoint's dtype, read in place from
 * the mapping (F32 when aligned, BF16 and F16 always): the kernels widen
 * them to F32 as they read, which is exact (weight.h). The small vectors
 * (norms, biases, sinks, the router) are F32, converted once at load where
 * the file holds another dtype; gpt_oss's expert stacks are transposed at
 * load into owned buffers of their own dtype. Every HF
 * tensor name the family needs must be present with the shape the config
 * implies, and every tensor the checkpoint holds must be one the family uses
 * or one on the ignore list (model.c); anything else is KV_ERR_INPUT and no
 * partial model is returned. */
#ifndef KV_MODEL_H
#define KV_MODEL_H

#include <stdint.h>

#include "config.h"
#include "safetensors.h"
#include "shards.h"
#include "status.h"
#include "weight.h"

typedef struct {
    const float *input_norm;     /* (hidden) input_layernorm */
    const float *post_attn_norm; /* (hidden) post_attention_layernorm */
    const float *pre_ffw_norm;   /* (hidden) gemma2/3 pre_feedforward_layernorm; else NULL */
    const float *post_ffw_norm;  /* (hidden) gemma2/3 post_feedforward_layernorm; else NULL */
    KvMat wq;                    /* (num_heads * head_dim, hidden) */
    KvMat wk;                    /* (num_kv_heads * head_dim, hidden) */
    KvMat wv;                    /* (num_kv_heads * head_dim, hidden) */
    KvMat wo;                    /* (hidden, num_heads * head_dim) */
    const float *bq;             /* (num_heads * head_dim) qwen2 q_proj.bias; NULL otherwise */
    const float *bk;             /* (num_kv_heads * head_dim) qwen2 k_proj.bias; NULL otherwise */
    const float *bv;             /* (num_kv_heads * head_dim) qwen2 v_proj.bias; NULL otherwise */
    const float *q_norm;         /* (head_dim) gemma3 self_attn.q_norm; NULL otherwise */
    const float *k_norm;         /* (head_dim) gemma3 self_attn.k_norm; NULL otherwise */
    /* gpt_oss only (NULL otherwise): */
    const float *bo;             /* (hidden) o_proj.bias */
    const float *sinks;          /* (num_heads) self_attn.sinks */
    const float *router_w;       /* (num_experts, hidden) mlp.router.weight */
    const float *router_b;       /* (num_experts) mlp.router.bias */
    KvMat experts_gate_up;       /* (num_experts, 2 * intermediate, hidden): the file's
                                  * gate_up_proj [E, hidden, 2I] transposed per expert, columns
                                  * still interleaved (row 2j gate j, row 2j + 1 up j) */
    const float *experts_gate_up_b; /* (num_experts, 2 * intermediate) */
    KvMat experts_down;          /* (num_experts, hidden, intermediate): down_proj [E, I, hidden]
                                  * transposed per expert */
    const float *experts_down_b; /* (num_experts, hidden) */
    KvMat w_gate;                /* (intermediate, hidden) */
    KvMat w_up;                  /* (intermediate, hidden) */
    KvMat w_down;                /* (hidden, intermediate) */
} KvLayerWeights;

typedef struct {
    KvConfig config;
    KvMat embed;             /* (vocab, hidden) model.embed_tokens.weight */
    const float *final_norm; /* (hidden) model.norm.weight */
    KvMat lm_head;           /* (vocab, hidden); == embed when tied */
    KvLayerWeights *layers;  /* (num_layers) */
    uint64_t weight_bytes;   /* bytes a decode step reads, as stored: every layer matrix and norm,
                              * final_norm and lm_head (vocab * hidden) once; an untied
                              * embedding (one row read per token) is not counted */
    KvSafetensors st;        /* keeps the mapping alive: the single model.safetensors;
                              * zeroed for a sharded checkpoint */
    KvShards shards;         /* a sharded checkpoint's index and shard mappings, kept alive;
                              * zeroed for a single file */
    void **owned;            /* (n_owned) converted or transposed buffers */
    size_t n_owned;
} KvModel;

/* Loads DIR/config.json and DIR/model.safetensors; messages name those paths.
 * Without DIR/model.safetensors, a DIR/model.safetensors.index.json makes it
 * a sharded checkpoint: the index's weight_map names the shard of each
 * tensor (shards.h). When both exist the single file is read and the index
 * is not (transformers' from_pretrained looks for model.safetensors first).
 * A tensor the family does not use is an error naming it and the family,
 * unless it is on the ignore list (model.c: lm_head.weight when tied, saved
 * rotary inv_freq buffers). On failure *out is zeroed and nothing stays
 * allocated. */
KvStatus kv_model_load_dir(const char *dir, KvModel *out, KvError *err);

/* Loads from memory. The st bytes must outlive the model (weights may point
 * into them). `label` names the source in messages (e.g. a fixture name):
 * "LABEL/config.json: ..." and "LABEL/model.safetensors: ..."; with a NULL or
 * empty label just "config.json: ..." and "model.safetensors: ...". The
 * checks on the tensors are kv_model_load_dir's. */
KvStatus kv_model_load_memory(const char *config_json, size_t config_len, const uint8_t *st,
                              size_t st_len, const char *label, KvModel *out, KvError *err);

/* The most weight bytes kv_model_load_dir accepts: the machine's physical
 * memory, or the environment's KVREPRO_MEMORY_LIMIT (bytes) where set (for
 * tests, and for a user sharing the machine). A checkpoint whose files hold
 * more is refused before loading, with both figures. */
uint64_t kv_model_memory_limit(void);

/* Releases everything (safe on a zeroed struct). */
void kv_model_free(KvModel *m);

/* FNV-1a 64-bit hash of the weights' F32 bytes (independent of the config
 * JSON text and of the file's dtype once converted): embed, then each layer's
 * tensors in KvLayerWeights order (NULL ones skipped), final_norm, and
 * lm_head when untied. Used to name a model in reports. */
uint64_t kv_model_hash(const KvModel *m);

#endif
