/* model.c: binding a config and a safetensors table into a KvModel.
 *
 * Every tensor the family needs is looked up by its Hugging Face name and
 * checked for dtype and shape against the config before anything is used;
 * then every tensor the checkpoint holds must have been bound or be on the
 * ignore list below. Matrices are used in place, as stored (F32, BF16 or
 * F16: the kernels widen them as they read, weight.h); only an unaligned F32
 * matrix is copied. The small vectors are F32: used in place when the file
 * holds aligned F32, else converted once into owned buffers, and the mapped
 * pages they came from released as each is converted (kv_st_release), so no
 * tensor stays resident twice. On any failure everything is released and
 * *out is left zeroed: no partial model. */
#include "model.h"

#include "bigalloc.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "prng.h"

/* Tensors per layer at most (4 norms + 7 matrices + 3 biases + 2 head norms). */
#define KV_TENSORS_PER_LAYER 24

/* ---- tensors a checkpoint may hold that the reference does not read ---- */

/* The ignore list: every entry is something exporters legitimately save and
 * transformers does not read either, so leaving it unread computes the same
 * model. Any other tensor the family does not bind is refused: the reference
 * would silently compute a different model than the checkpoint holds (a bias,
 * an extra norm, a layer the config does not count, another architecture's
 * weights under a model_type it borrowed). Entries match by name only; their
 * contents are never read. In a pattern, "{L}" is a layer index below
 * num_hidden_layers written as transformers writes it (decimal, no leading
 * zero): a buffer of a layer the config lacks is a layer the model lacks. */
typedef struct {
    const char *pattern;
    unsigned families; /* bit (1u << KvFamily) for each family it applies to */
    bool tied_only;    /* only with tie_word_embeddings */
} KvIgnoredTensor;

#define KV_FAMILY_BIT(f) (1u << (unsigned)(f))

static const KvIgnoredTensor kv_ignored_tensors[] = {
    /* Tied embeddings: transformers points lm_head at the embedding and
     * never reads a stored lm_head.weight (an exporter that writes every
     * parameter saves the tied copy too); the reference uses the embedding likewise, whatever the file
     * holds (the corpus case model_tied_lm_head_ignored). */
    {"lm_head.weight",
     KV_FAMILY_BIT(KV_FAMILY_GEMMA2) | KV_FAMILY_BIT(KV_FAMILY_MISTRAL) |
         KV_FAMILY_BIT(KV_FAMILY_QWEN2) | KV_FAMILY_BIT(KV_FAMILY_GEMMA3),
     true},
    /* RoPE inverse frequencies: Llama checkpoints written by transformers
     * before inv_freq became a non-persistent buffer (transformers PR
     * #24998, July 2023, released in 4.32) carry one per layer (llama-2's
     * among them). It is a function of rope_theta and head_dim only;
     * transformers recomputes it from the config and disregards any stored
     * rotary_emb.inv_freq (PR #35255), and the reference computes RoPE from
     * the config too. Gemma2 never saved it (non-persistent from its first
     * release), so it is not accepted there. */
    {"model.layers.{L}.self_attn.rotary_emb.inv_freq", KV_FAMILY_BIT(KV_FAMILY_MISTRAL), false},
};

/* name matches pattern, "{L}" standing for a layer index < num_layers. */
static bool ignored_match(const char *pattern, const char *name, int64_t num_layers) {
    const char *hole = strstr(pattern, "{L}");
    if (hole == NULL) return strcmp(pattern, name) == 0;
    size_t head = (size_t)(hole - pattern);
    if (strncmp(pattern, name, head) != 0) return false;
    const char *p = name + head;
    int64_t layer = 0;
    size_t digits = 0;
    while (p[digits] >= '0' && p[digits] <= '9') {
        if (digits >= 6) return false; /* beyond any KV_MAX_LAYERS */
        layer = layer * 10 + (p[digits] - '0');
        digits++;
    }
    if (digits == 0 || (digits > 1 && p[0] == '0') || layer >= num_layers) return false;
    return strcmp(p + digits, hole + 3) == 0;
}

static bool ignored_tensor(const KvConfig *c, const char *name) {
    for (size_t i = 0; i < sizeof kv_ignored_tensors / sizeof kv_ignored_tensors[0]; i++) {
        const KvIgnoredTensor *e = &kv_ignored_tensors[i];
        if ((e->families & KV_FAMILY_BIT(c->family)) == 0) continue;
        if (e->tied_only && !c->tie_word_embeddings) continue;
        if (ignored_match(e->pattern, name, c->num_layers)) return true;
    }
    return false;
}

/* ---- binding ------------------------------------------------------------ */

/* What binding reads: the checkpoint's files (the single model.safetensors,
 * or every shard) and which of their tensors have been bound. */
typedef struct {
    KvModel *m;
    bool sharded;
    const KvSafetensors *files; /* (n_files) */
    size_t n_files;
    const char *label;          /* the checkpoint in messages: the file, or the index */
    size_t *first;              /* (n_files) index into used of each file's first tensor */
    bool *used;                 /* (tensors of all files) bound */
    bool *in_place;             /* (tensors of all files) bound and read from the mapping */
} ModelBinder;

/* The index of file's tensor t in used and in_place. */
static size_t binder_index(const ModelBinder *b, const KvSafetensors *file,
                           const KvTensorInfo *t) {
    return b->first[(size_t)(file - b->files)] + (size_t)(t - file->tensors);
}

/* The tensor called name and the file holding it: for a sharded checkpoint
 * the shard the weight_map names. Marks it used. */
static const KvTensorInfo *binder_find(ModelBinder *b, const char *name,
                                       const KvSafetensors **file) {
    const KvTensorInfo *t;
    if (b->sharded) {
        t = kv_shards_find(&b->m->shards, name, file);
    } else {
        *file = &b->m->st;
        t = kv_st_find(*file, name);
    }
    if (t != NULL) b->used[binder_index(b, *file, t)] = true;
    return t;
}

/* "[d0, d1, ...]" of t's shape into buf (NUL-terminated, truncated to n). */
static void shape_text(const KvTensorInfo *t, char *buf, size_t n) {
    size_t used = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < t->rank && used < n; i++) {
        used += (size_t)snprintf(buf + used, n - used, "%s%" PRId64, i ? ", " : "", t->shape[i]);
    }
    if (used < n) snprintf(buf + used, n - used, "]");
}

/* The tensor called name, checked for a weight dtype and the shape
 * [d0] (rank 1) or [d0, d1]; *file is the file holding it. */
static KvStatus bind_lookup(ModelBinder *b, const char *name, int rank, int64_t d0, int64_t d1,
                            const KvSafetensors **file, const KvTensorInfo **out, KvError *err) {
    const KvSafetensors *st = NULL;
    const KvTensorInfo *t = binder_find(b, name, &st);
    char want[64];
    if (rank == 1) {
        snprintf(want, sizeof want, "[%" PRId64 "]", d0);
    } else {
        snprintf(want, sizeof want, "[%" PRId64 ", %" PRId64 "]", d0, d1);
    }
    if (t == NULL) {
        return kv_error_set(err, KV_ERR_INPUT,
                            "%s: tensor '%s': expected shape %s, found no such tensor (missing)",
                            b->label, name, want);
    }
    if (!kv_dtype_loadable(t->dtype)) {
        return kv_error_set(err, KV_ERR_INPUT,
                            "%s: tensor '%s': expected dtype F32, F16 or BF16, found %s "
                            "(not supported for weights)",
                            st->label, name, kv_dtype_name(t->dtype));
    }
    bool ok = t->rank == rank && t->shape[0] == d0 && (rank == 1 || t->shape[1] == d1);
    if (!ok) {
        char found[160];
        shape_text(t, found, sizeof found);
        return kv_error_set(err, KV_ERR_INPUT, "%s: tensor '%s': expected shape %s, found %s",
                            st->label, name, want, found);
    }
    *file = st;
    *out = t;
    return KV_OK;
}

/* t's values as an owned F32 buffer; the file's pages it came from are
 * released (nothing reads them again: without this a converted tensor
 * stays resident twice, as file pages and as F32). */
static KvStatus bind_convert(ModelBinder *b, const KvSafetensors *st, const KvTensorInfo *t,
                             const char *name, size_t numel, float **dst, KvError *err) {
    KvModel *m = b->m;
    float *buf = kv_big_alloc(numel > 0 ? numel * sizeof(float) : 1);
    if (buf == NULL) {
        return kv_error_set(err, KV_ERR_INTERNAL,
                            "%s: tensor '%s': out of memory converting %zu values to F32",
                            st->label, name, numel);
    }
    kv_dtype_to_f32(t->dtype, st->data + t->begin, numel, buf);
    kv_st_release(st, t->begin, t->end);
    m->owned[m->n_owned++] = buf;
    *dst = buf;
    return KV_OK;
}

/* A vector (norm, bias, sinks) or the router as F32: in place when the file
 * holds aligned F32, else converted (they are small). Rank 1 uses only d0. */
static KvStatus bind_tensor(ModelBinder *b, const char *name, int rank, int64_t d0, int64_t d1,
                            const float **dst, KvError *err) {
    const KvSafetensors *st = NULL;
    const KvTensorInfo *t = NULL;
    KvStatus rc = bind_lookup(b, name, rank, d0, d1, &st, &t, err);
    if (rc != KV_OK) return rc;
    /* The config's size checks make numel * 4 representable. */
    size_t numel = (size_t)d0 * (size_t)(rank == 1 ? 1 : d1);
    const uint8_t *src = st->data + t->begin;
    if (t->dtype == KV_DTYPE_F32 && (uintptr_t)src % _Alignof(float) == 0) {
        *dst = (const float *)(const void *)src;
        b->in_place[binder_index(b, st, t)] = true;
        return KV_OK;
    }
    float *buf = NULL;
    rc = bind_convert(b, st, t, name, numel, &buf, err);
    if (rc == KV_OK) *dst = buf;
    return rc;
}

/* A matrix [d0, d1] as stored: in place from the mapping (BF16, F16, and
 * aligned F32, read through kv_mat_rows); only an unaligned F32 one is
 * copied (kernels load F32 rows as floats). */
static KvStatus bind_matrix(ModelBinder *b, const char *name, int64_t d0, int64_t d1, KvMat *dst,
                            KvError *err) {
    const KvSafetensors *st = NULL;
    const KvTensorInfo *t = NULL;
    KvStatus rc = bind_lookup(b, name, 2, d0, d1, &st, &t, err);
    if (rc != KV_OK) return rc;
    const uint8_t *src = st->data + t->begin;
    if (t->dtype != KV_DTYPE_F32 || (uintptr_t)src % _Alignof(float) == 0) {
        dst->data = src;
        dst->dtype = t->dtype;
        b->in_place[binder_index(b, st, t)] = true;
        return KV_OK;
    }
    float *buf = NULL;
    rc = bind_convert(b, st, t, name, (size_t)d0 * (size_t)d1, &buf, err);
    if (rc == KV_OK) *dst = kv_mat_f32(buf);
    return rc;
}

/* One MXFP4 tensor of bind_experts_mxfp4: U8, the given rank and dims. */
static KvStatus bind_mx_part(ModelBinder *b, const char *name, int rank, const int64_t *dims,
                             const uint8_t **out, KvError *err) {
    const KvSafetensors *st = NULL;
    const KvTensorInfo *t = binder_find(b, name, &st);
    char want[96];
    size_t used = (size_t)snprintf(want, sizeof want, "[");
    for (int i = 0; i < rank && used < sizeof want; i++) {
        used += (size_t)snprintf(want + used, sizeof want - used, "%s%" PRId64, i ? ", " : "",
                                 dims[i]);
    }
    if (used < sizeof want) snprintf(want + used, sizeof want - used, "]");
    if (t == NULL) {
        return kv_error_set(err, KV_ERR_INPUT,
                            "%s: tensor '%s': expected shape %s (MXFP4), found no such tensor "
                            "(missing)",
                            b->label, name, want);
    }
    if (t->dtype != KV_DTYPE_U8) {
        return kv_error_set(err, KV_ERR_INPUT,
                            "%s: tensor '%s': expected dtype U8 (MXFP4), found %s", st->label,
                            name, kv_dtype_name(t->dtype));
    }
    bool ok = t->rank == rank;
    for (int i = 0; ok && i < rank; i++) ok = t->shape[i] == dims[i];
    if (!ok) {
        char found[160];
        shape_text(t, found, sizeof found);
        return kv_error_set(err, KV_ERR_INPUT,
                            "%s: tensor '%s': expected shape %s (MXFP4), found %s", st->label,
                            name, want, found);
    }
    b->in_place[binder_index(b, st, t)] = true;
    *out = st->data + t->begin;
    return KV_OK;
}

/* An expert stack stored as gpt-oss ships it: NAME_blocks [E, d2, d1 / 32,
 * 16] (32 e2m1 values of a row per 16 bytes) and NAME_scales [E, d2, d1 /
 * 32] (their e8m0 exponents), read in place. That is already the (E, d2,
 * d1) layout the matmuls take: transformers' dequantizer produces it and
 * then transposes to [E, d1, d2]. */
static KvStatus bind_experts_mxfp4(ModelBinder *b, const char *name, int64_t E, int64_t d1,
                                   int64_t d2, KvMat *dst, KvError *err) {
    char blocks[KV_ST_MAX_NAME + 8], scales[KV_ST_MAX_NAME + 8];
    snprintf(blocks, sizeof blocks, "%s_blocks", name);
    snprintf(scales, sizeof scales, "%s_scales", name);
    if (d1 % 32 != 0) {
        return kv_error_set(err, KV_ERR_INPUT,
                            "%s: tensor '%s': MXFP4 blocks of 32 need an input dimension that "
                            "is a multiple of 32, found %" PRId64 " (the config's sizes)",
                            b->label, blocks, d1);
    }
    const int64_t bdims[4] = {E, d2, d1 / 32, 16}, sdims[3] = {E, d2, d1 / 32};
    const uint8_t *q = NULL, *e = NULL;
    KvStatus rc = bind_mx_part(b, blocks, 4, bdims, &q, err);
    if (rc == KV_OK) rc = bind_mx_part(b, scales, 3, sdims, &e, err);
    if (rc != KV_OK) return rc;
    dst->data = q;
    dst->dtype = KV_DTYPE_F4;
    dst->scales = e;
    return KV_OK;
}

/* An expert stack [E, d1, d2] (gpt_oss's gate_up_proj, down_proj: x @ W
 * per expert) as an owned buffer (E, d2, d1) in the file's dtype: each
 * expert's matrix transposed to the (out, in) layout every matmul here
 * takes, element bytes moved, no value converted. */
static KvStatus bind_experts(ModelBinder *b, const char *name, int64_t E, int64_t d1, int64_t d2,
                             KvMat *dst, KvError *err) {
    KvModel *m = b->m;
    const KvSafetensors *st = NULL;
    const KvTensorInfo *t = binder_find(b, name, &st);
    if (t == NULL) {
        /* the released gpt-oss checkpoints store experts as MXFP4 blocks */
        char blocks[KV_ST_MAX_NAME + 8];
        snprintf(blocks, sizeof blocks, "%s_blocks", name);
        const KvSafetensors *bf = NULL;
        if (binder_find(b, blocks, &bf) != NULL) return bind_experts_mxfp4(b, name, E, d1, d2, dst, err);
        return kv_error_set(err, KV_ERR_INPUT,
                            "%s: tensor '%s': expected shape [%" PRId64 ", %" PRId64 ", %" PRId64
                            "] (or its MXFP4 form, '%s_blocks' and '%s_scales'), found no such "
                            "tensor (missing)",
                            b->label, name, E, d1, d2, name, name);
    }
    if (!kv_dtype_loadable(t->dtype)) {
        return kv_error_set(err, KV_ERR_INPUT,
                            "%s: tensor '%s': expected dtype F32, F16 or BF16 (or MXFP4 "
                            "'_blocks' and '_scales' tensors), found %s (not supported for "
                            "weights)",
                            st->label, name, kv_dtype_name(t->dtype));
    }
    if (t->rank != 3 || t->shape[0] != E || t->shape[1] != d1 || t->shape[2] != d2) {
        char found[160];
        shape_text(t, found, sizeof found);
        return kv_error_set(err, KV_ERR_INPUT,
                            "%s: tensor '%s': expected shape [%" PRId64 ", %" PRId64 ", %" PRId64
                            "], found %s",
                            st->label, name, E, d1, d2, found);
    }
    const size_t per = (size_t)d1 * (size_t)d2, numel = (size_t)E * per;
    const size_t es = t->dtype == KV_DTYPE_F32 ? 4u : 2u;
    uint8_t *buf = kv_big_alloc(numel > 0 ? numel * es : 1);
    if (buf == NULL) {
        return kv_error_set(err, KV_ERR_INTERNAL, "%s: tensor '%s': out of memory", st->label,
                            name);
    }
    const uint8_t *data = st->data + t->begin;
    for (int64_t e = 0; e < E; e++) {
        const uint8_t *src = data + (size_t)e * per * es; /* (d1, d2) */
        uint8_t *out = buf + (size_t)e * per * es;        /* (d2, d1) */
        for (int64_t i = 0; i < d1; i++) {
            for (int64_t j = 0; j < d2; j++) {
                memcpy(out + ((size_t)j * (size_t)d1 + (size_t)i) * es,
                       src + ((size_t)i * (size_t)d2 + (size_t)j) * es, es);
            }
        }
    }
    kv_st_release(st, t->begin, t->end); /* copied: see bind_convert */
    m->owned[m->n_owned++] = buf;
    dst->data = buf;
    dst->dtype = t->dtype;
    return KV_OK;
}

/* Binds every weight of m->config from the checkpoint's files. */
static KvStatus bind_all(ModelBinder *b, KvError *err) {
    KvModel *m = b->m;
    const KvConfig *c = &m->config;
    KvStatus st;
    int64_t h = c->hidden_size;
    int64_t q_dim = c->num_heads * c->head_dim;
    int64_t kv_dim = c->num_kv_heads * c->head_dim;
    bool gemma = kv_config_gemma_style(c);
    const bool moe = c->num_experts > 0;
    size_t max_owned = 3 + (size_t)c->num_layers * KV_TENSORS_PER_LAYER;

    m->owned = calloc(max_owned, sizeof *m->owned);
    m->layers = calloc((size_t)c->num_layers, sizeof *m->layers);
    if (m->owned == NULL || m->layers == NULL) {
        return kv_error_set(err, KV_ERR_INTERNAL, "%s: out of memory for the layer table",
                            b->label);
    }

    st = bind_matrix(b, "model.embed_tokens.weight", c->vocab_size, h, &m->embed, err);
    if (st != KV_OK) return st;
    for (int64_t i = 0; i < c->num_layers; i++) {
        KvLayerWeights *L = &m->layers[i];
        char n[KV_ST_MAX_NAME];
        /* Each entry: suffix, rank, dims, destination, and whether this
         * family has it (gemma2/3 extra norms, qwen2 q/k/v biases, gemma3 q/k norms). */
        struct {
            const char *suffix;
            int rank;
            int64_t d0, d1;
            const float **dst; /* a vector, or NULL: */
            KvMat *mat;        /* a matrix kept as stored */
            bool used;
        } spec[KV_TENSORS_PER_LAYER] = {
            {"input_layernorm.weight", 1, h, 0, &L->input_norm, NULL, true},
            {"post_attention_layernorm.weight", 1, h, 0, &L->post_attn_norm, NULL, true},
            {"self_attn.q_proj.weight", 2, q_dim, h, NULL, &L->wq, true},
            {"self_attn.k_proj.weight", 2, kv_dim, h, NULL, &L->wk, true},
            {"self_attn.v_proj.weight", 2, kv_dim, h, NULL, &L->wv, true},
            {"self_attn.o_proj.weight", 2, h, q_dim, NULL, &L->wo, true},
            {"mlp.gate_proj.weight", 2, c->intermediate_size, h, NULL, &L->w_gate, true},
            {"mlp.up_proj.weight", 2, c->intermediate_size, h, NULL, &L->w_up, true},
            {"mlp.down_proj.weight", 2, h, c->intermediate_size, NULL, &L->w_down, true},
            {"pre_feedforward_layernorm.weight", 1, h, 0, &L->pre_ffw_norm, NULL, gemma},
            {"post_feedforward_layernorm.weight", 1, h, 0, &L->post_ffw_norm, NULL, gemma},
            {"self_attn.q_proj.bias", 1, q_dim, 0, &L->bq, NULL, c->attn_qkv_bias},
            {"self_attn.k_proj.bias", 1, kv_dim, 0, &L->bk, NULL, c->attn_qkv_bias},
            {"self_attn.v_proj.bias", 1, kv_dim, 0, &L->bv, NULL, c->attn_qkv_bias},
            {"self_attn.q_norm.weight", 1, c->head_dim, 0, &L->q_norm, NULL, c->qk_norm},
            {"self_attn.k_norm.weight", 1, c->head_dim, 0, &L->k_norm, NULL, c->qk_norm},
            {"self_attn.o_proj.bias", 1, h, 0, &L->bo, NULL, c->attn_o_bias},
            {"self_attn.sinks", 1, c->num_heads, 0, &L->sinks, NULL, c->attn_sinks},
            {"mlp.router.weight", 2, c->num_experts, h, &L->router_w, NULL, moe},
            {"mlp.router.bias", 1, c->num_experts, 0, &L->router_b, NULL, moe},
            {"mlp.experts.gate_up_proj_bias", 2, c->num_experts, 2 * c->intermediate_size,
             &L->experts_gate_up_b, NULL, moe},
            {"mlp.experts.down_proj_bias", 2, c->num_experts, h, &L->experts_down_b, NULL, moe},
        };
        /* the dense MLP, or gpt_oss's experts instead */
        for (int k = 6; k <= 8; k++) spec[k].used = !moe;
        for (int k = 0; k < KV_TENSORS_PER_LAYER; k++) {
            if (!spec[k].used) continue;
            snprintf(n, sizeof n, "model.layers.%" PRId64 ".%s", i, spec[k].suffix);
            st = spec[k].mat != NULL
                     ? bind_matrix(b, n, spec[k].d0, spec[k].d1, spec[k].mat, err)
                     : bind_tensor(b, n, spec[k].rank, spec[k].d0, spec[k].d1, spec[k].dst, err);
            if (st != KV_OK) return st;
        }
        if (moe) {
            snprintf(n, sizeof n, "model.layers.%" PRId64 ".mlp.experts.gate_up_proj", i);
            st = bind_experts(b, n, c->num_experts, h, 2 * c->intermediate_size,
                              &L->experts_gate_up, err);
            if (st != KV_OK) return st;
            snprintf(n, sizeof n, "model.layers.%" PRId64 ".mlp.experts.down_proj", i);
            st = bind_experts(b, n, c->num_experts, c->intermediate_size, h, &L->experts_down,
                              err);
            if (st != KV_OK) return st;
        }
    }
    st = bind_tensor(b, "model.norm.weight", 1, h, 0, &m->final_norm, err);
    if (st != KV_OK) return st;
    if (c->tie_word_embeddings) {
        /* transformers ties lm_head to the embedding and ignores any
         * lm_head.weight in the file (the ignore list above). */
        m->lm_head = m->embed;
    } else {
        st = bind_matrix(b, "lm_head.weight", c->vocab_size, h, &m->lm_head, err);
        if (st != KV_OK) return st;
    }

    uint64_t norms = (uint64_t)(gemma ? 4 : 2) * (uint64_t)h +
                     (c->attn_qkv_bias ? (uint64_t)(q_dim + 2 * kv_dim) : 0) + /* biases */
                     (c->qk_norm ? 2 * (uint64_t)c->head_dim : 0);              /* q/k norms */
    const uint64_t qd = (uint64_t)q_dim, kvd = (uint64_t)kv_dim, hh = (uint64_t)h;
    const uint64_t inter = (uint64_t)c->intermediate_size, E = (uint64_t)c->num_experts;
    /* What one decode step streams, in stored bytes: every layer, the final
     * norm and the (vocab, hidden) lm_head. The embedding is read whole only
     * when it is the lm_head (tied); untied, a step reads one row of it, not
     * counted. gpt_oss: every expert counted, as a prefill reads them all. */
    uint64_t bytes = 0;
    for (int64_t i = 0; i < c->num_layers; i++) {
        const KvLayerWeights *L = &m->layers[i];
        bytes += norms * sizeof(float);
        bytes += kv_mat_bytes(L->wq, qd * hh) + kv_mat_bytes(L->wk, kvd * hh) +
                 kv_mat_bytes(L->wv, kvd * hh) + kv_mat_bytes(L->wo, hh * qd);
        if (moe) {
            bytes += kv_mat_bytes(L->experts_gate_up, E * 2 * inter * hh) +
                     kv_mat_bytes(L->experts_down, E * inter * hh);
        } else {
            bytes += kv_mat_bytes(L->w_gate, inter * hh) + kv_mat_bytes(L->w_up, inter * hh) +
                     kv_mat_bytes(L->w_down, inter * hh);
        }
    }
    bytes += hh * sizeof(float) + kv_mat_bytes(m->lm_head, (uint64_t)c->vocab_size * hh);
    m->weight_bytes = bytes;
    return KV_OK;
}

/* Every tensor of every file was bound or is on the ignore list. Files in
 * order, tensors by name: the first offender is the same on every run. */
static KvStatus check_unused(const ModelBinder *b, KvError *err) {
    const KvConfig *c = &b->m->config;
    for (size_t f = 0; f < b->n_files; f++) {
        const KvSafetensors *file = &b->files[f];
        for (size_t t = 0; t < file->n_tensors; t++) {
            const char *name = file->tensors[t].name;
            if (b->used[b->first[f] + t] || ignored_tensor(c, name)) continue;
            return kv_error_set(err, KV_ERR_INPUT,
                                "%s: tensor '%s' is not used by family %s (the reference would "
                                "silently drop it)",
                                file->label, name, kv_family_name(c->family));
        }
    }
    return KV_OK;
}

/* Binds the weights of m (config and files already in place), then refuses
 * any tensor left unused. */
static KvStatus model_bind(KvModel *m, KvError *err) {
    KvStatus rc = KV_OK;
    ModelBinder b = {.m = m, .sharded = m->shards.label[0] != '\0'};
    if (b.sharded) {
        b.files = m->shards.files;
        b.n_files = m->shards.n_files;
        b.label = m->shards.label;
    } else {
        b.files = &m->st;
        b.n_files = 1;
        b.label = m->st.label;
    }
    size_t total = 0;
    b.first = calloc(b.n_files > 0 ? b.n_files : 1, sizeof *b.first);
    if (b.first != NULL) {
        for (size_t f = 0; f < b.n_files; f++) {
            b.first[f] = total;
            total += b.files[f].n_tensors;
        }
        b.used = calloc(total > 0 ? total : 1, sizeof *b.used);
        b.in_place = calloc(total > 0 ? total : 1, sizeof *b.in_place);
    }
    if (b.first == NULL || b.used == NULL || b.in_place == NULL) {
        rc = kv_error_set(err, KV_ERR_INTERNAL, "%s: out of memory for %zu tensor marks",
                          b.label, total);
        goto cleanup;
    }
    /* Binding first: a missing or misshapen tensor the family needs is the
     * more basic error, and every needed tensor is converted before the
     * checkpoint is judged for what it holds besides. */
    rc = bind_all(&b, err);
    if (rc != KV_OK) goto cleanup;
    rc = check_unused(&b, err);
    if (rc != KV_OK) goto cleanup;
    /* Every byte no weight points into, released once more: converting one
     * tensor maps its neighbours' pages too (the kernel's fault-around and
     * readahead), and binding order is not file order, so pages of tensors
     * converted (and released) earlier come back. What the weights use in
     * place stays; a page shared with it only faults back in. */
    for (size_t f = 0; f < b.n_files; f++) {
        for (size_t t = 0; t < b.files[f].n_tensors; t++) {
            if (b.in_place[b.first[f] + t]) continue;
            kv_st_release(&b.files[f], b.files[f].tensors[t].begin, b.files[f].tensors[t].end);
        }
    }

cleanup:
    free(b.in_place);
    free(b.used);
    free(b.first);
    return rc;
}

/* Takes ownership of *st and *shards (one of them holds the checkpoint, the
 * other is zeroed; both closed on failure); *out is zeroed on failure. */
static KvStatus model_assemble(const KvConfig *cfg, KvSafetensors *st, KvShards *shards,
                               KvModel *out, KvError *err) {
    memset(out, 0, sizeof *out);
    out->config = *cfg;
    out->st = *st;
    memset(st, 0, sizeof *st);
    out->shards = *shards;
    memset(shards, 0, sizeof *shards);
    KvStatus rc = model_bind(out, err);
    if (rc != KV_OK) kv_model_free(out);
    return rc;
}

KvStatus kv_model_load_memory(const char *config_json, size_t config_len, const uint8_t *st,
                              size_t st_len, const char *label, KvModel *out, KvError *err) {
    KvStatus rc = KV_OK;
    KvConfig cfg;
    KvSafetensors tab;
    char cfg_label[512], st_label[512];
    memset(&tab, 0, sizeof tab);
    memset(out, 0, sizeof *out);

    if (label != NULL && label[0] != '\0') {
        snprintf(cfg_label, sizeof cfg_label, "%s/config.json", label);
        snprintf(st_label, sizeof st_label, "%s/model.safetensors", label);
    } else {
        snprintf(cfg_label, sizeof cfg_label, "config.json");
        snprintf(st_label, sizeof st_label, "model.safetensors");
    }
    rc = kv_config_parse(config_json, config_len, cfg_label, &cfg, err);
    if (rc != KV_OK) goto cleanup;
    rc = kv_st_parse(st, st_len, st_label, &tab, err);
    if (rc != KV_OK) goto cleanup;
    KvShards none;
    memset(&none, 0, sizeof none);
    rc = model_assemble(&cfg, &tab, &none, out, err);

cleanup:
    kv_st_close(&tab);
    return rc;
}

/* dir + "/" + name into buf; false when it does not fit. */
static bool path_join(char *buf, size_t size, const char *dir, const char *name) {
    size_t n = strlen(dir);
    const char *sep = (n > 0 && dir[n - 1] == '/') ? "" : "/";
    int w = snprintf(buf, size, "%s%s%s", dir, sep, name);
    return w >= 0 && (size_t)w < size;
}

/* True when path names nothing at all (stat: ENOENT); anything else, a
 * file of any kind or an error, counts as present, so the single-file path
 * reports it exactly as before. */
static bool path_absent(const char *path) {
    struct stat sb;
    return stat(path, &sb) != 0 && errno == ENOENT;
}

uint64_t kv_model_memory_limit(void) {
    const char *env = getenv("KVREPRO_MEMORY_LIMIT");
    if (env != NULL && env[0] != '\0') {
        char *end = NULL;
        errno = 0;
        const unsigned long long v = strtoull(env, &end, 10);
        if (errno == 0 && end != env && *end == '\0' && v > 0) return (uint64_t)v;
    }
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    return pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : UINT64_MAX;
}

/* Refuses, before anything is read or converted, a checkpoint whose weights
 * cannot stay resident: every decode step streams all of them, so one
 * larger than the machine's memory would be read from disk at every token.
 * The estimate is the files' data sections (the weights as stored; a
 * vector converted to F32 is small beside them). */
static KvStatus model_check_fits(const char *dir, const KvSafetensors *st, const KvShards *shards,
                                 KvError *err) {
    uint64_t bytes = st->data_len;
    for (size_t f = 0; f < shards->n_files; f++) bytes += shards->files[f].data_len;
    const uint64_t limit = kv_model_memory_limit();
    if (bytes <= limit) return KV_OK;
    return kv_error_set(err, KV_ERR_INPUT,
                        "%s: the weights need %.2f GiB resident (as stored), more than this "
                        "machine's %.2f GiB of memory (%s): every decode step reads them all; use "
                        "a machine with more memory, or a checkpoint stored in a narrower dtype "
                        "(BF16 is read as stored)",
                        dir, (double)bytes / 1073741824.0, (double)limit / 1073741824.0,
                        getenv("KVREPRO_MEMORY_LIMIT") != NULL ? "KVREPRO_MEMORY_LIMIT"
                                                               : "physical memory");
}

KvStatus kv_model_load_dir(const char *dir, KvModel *out, KvError *err) {
    KvStatus rc = KV_OK;
    KvConfig cfg;
    KvSafetensors tab;
    KvShards shards;
    char cfg_path[4096], st_path[4096], index_path[4096];
    struct stat sb;
    memset(&tab, 0, sizeof tab);
    memset(&shards, 0, sizeof shards);
    memset(out, 0, sizeof *out);

    if (stat(dir, &sb) != 0) {
        rc = kv_error_set(err, KV_ERR_INPUT, "%s: cannot open model directory: %s", dir,
                          strerror(errno));
        goto cleanup;
    }
    if (!S_ISDIR(sb.st_mode)) {
        rc = kv_error_set(err, KV_ERR_INPUT,
                          "%s: expected a model directory (config.json + model.safetensors), "
                          "found a file",
                          dir);
        goto cleanup;
    }
    if (!path_join(cfg_path, sizeof cfg_path, dir, "config.json") ||
        !path_join(st_path, sizeof st_path, dir, "model.safetensors") ||
        !path_join(index_path, sizeof index_path, dir, KV_SHARDS_INDEX_NAME)) {
        rc = kv_error_set(err, KV_ERR_INPUT, "%s: path too long", dir);
        goto cleanup;
    }
    rc = kv_config_load(cfg_path, &cfg, err);
    if (rc != KV_OK) goto cleanup;
    /* model.safetensors wins when both it and an index exist, as in
     * transformers' from_pretrained (SAFE_WEIGHTS_NAME is looked for before
     * SAFE_WEIGHTS_INDEX_NAME): the index is then not read at all, so a
     * directory loads as the same model here and there. Without either, the
     * message names model.safetensors as it always has. */
    if (path_absent(st_path) && !path_absent(index_path)) {
        rc = kv_shards_open(dir, index_path, &shards, err);
    } else {
        rc = kv_st_open(st_path, &tab, err);
    }
    if (rc != KV_OK) goto cleanup;
    rc = model_check_fits(dir, &tab, &shards, err);
    if (rc != KV_OK) goto cleanup;
    rc = model_assemble(&cfg, &tab, &shards, out, err);

cleanup:
    kv_shards_close(&shards);
    kv_st_close(&tab);
    return rc;
}

void kv_model_free(KvModel *m) {
    if (m == NULL) return;
    if (m->owned != NULL) {
        for (size_t i = 0; i < m->n_owned; i++) free(m->owned[i]);
    }
    free(m->owned);
    free(m->layers);
    kv_st_close(&m->st);
    kv_shards_close(&m->shards);
    memset(m, 0, sizeof *m);
}

static uint64_t hash_floats(uint64_t h, const float *p, int64_t n) {
    return p != NULL ? kv_fnv1a(h, p, (size_t)n * sizeof(float)) : h;
}

/* A matrix hashed as its F32 values, whatever its stored dtype: widened a
 * chunk at a time (FNV-1a runs on, so the chunks give the whole's hash). */
static uint64_t hash_mat(uint64_t h, KvMat w, int64_t n) {
    if (w.data == NULL) return h;
    if (w.dtype == KV_DTYPE_F32) return hash_floats(h, w.data, n);
    float chunk[4096];
    for (int64_t i = 0; i < n; i += 4096) {
        const int64_t k = n - i < 4096 ? n - i : 4096;
        kv_mat_widen(w, i, k, chunk);
        h = hash_floats(h, chunk, k);
    }
    return h;
}

uint64_t kv_model_hash(const KvModel *m) {
    const KvConfig *c = &m->config;
    int64_t h = c->hidden_size;
    int64_t q_dim = c->num_heads * c->head_dim;
    int64_t kv_dim = c->num_kv_heads * c->head_dim;
    int64_t inter = c->intermediate_size;
    uint64_t x = KV_FNV_OFFSET;
    x = hash_mat(x, m->embed, c->vocab_size * h);
    for (int64_t i = 0; m->layers != NULL && i < c->num_layers; i++) {
        const KvLayerWeights *L = &m->layers[i];
        /* Struct order; the gemma2-only norms are NULL (skipped) for mistral. */
        x = hash_floats(x, L->input_norm, h);
        x = hash_floats(x, L->post_attn_norm, h);
        x = hash_floats(x, L->pre_ffw_norm, h);
        x = hash_floats(x, L->post_ffw_norm, h);
        x = hash_mat(x, L->wq, q_dim * h);
        x = hash_mat(x, L->wk, kv_dim * h);
        x = hash_mat(x, L->wv, kv_dim * h);
        x = hash_mat(x, L->wo, h * q_dim);
        x = hash_floats(x, L->bq, q_dim); /* qwen2's biases; NULL (skipped) otherwise */
        x = hash_floats(x, L->bk, kv_dim);
        x = hash_floats(x, L->bv, kv_dim);
        x = hash_floats(x, L->q_norm, c->head_dim); /* gemma3's; NULL (skipped) otherwise */
        x = hash_floats(x, L->k_norm, c->head_dim);
        /* gpt_oss's (NULL, skipped, otherwise; experts as stored here) */
        const int64_t E = c->num_experts;
        x = hash_floats(x, L->bo, h);
        x = hash_floats(x, L->sinks, c->num_heads);
        x = hash_floats(x, L->router_w, E * h);
        x = hash_floats(x, L->router_b, E);
        x = hash_mat(x, L->experts_gate_up, E * 2 * inter * h);
        x = hash_floats(x, L->experts_gate_up_b, E * 2 * inter);
        x = hash_mat(x, L->experts_down, E * h * inter);
        x = hash_floats(x, L->experts_down_b, E * h);
        x = hash_mat(x, L->w_gate, inter * h);
        x = hash_mat(x, L->w_up, inter * h);
        x = hash_mat(x, L->w_down, h * inter);
    }
    x = hash_floats(x, m->final_norm, h);
    if (!c->tie_word_embeddings) x = hash_mat(x, m->lm_head, c->vocab_size * h);
    return x;
}
