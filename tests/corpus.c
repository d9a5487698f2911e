/* corpus.c: the small valid base model and the malformed-input corpus (see
 * corpus.h). Test code: out-of-memory aborts instead of propagating. */
#include "corpus.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void *corpus_alloc(size_t n) {
    void *p = malloc(n > 0 ? n : 1);
    if (p == NULL) {
        fprintf(stderr, "corpus: out of memory (%zu bytes)\n", n);
        abort();
    }
    return p;
}

static void corpus_fail(const char *what, const char *name) {
    fprintf(stderr, "corpus: broken mutation: %s '%s'\n", what, name);
    abort();
}

/* ---- the base model ---------------------------------------------------- */

void corpus_config(KvFamily family, KvConfig *out) {
    KvConfig c;
    memset(&c, 0, sizeof c);
    c.family = family;
    c.vocab_size = CORPUS_VOCAB;
    c.hidden_size = CORPUS_HIDDEN;
    c.intermediate_size = CORPUS_INTER;
    c.num_layers = CORPUS_LAYERS;
    c.num_heads = CORPUS_HEADS;
    c.num_kv_heads = CORPUS_KV_HEADS;
    c.head_dim = CORPUS_HEAD_DIM;
    c.sliding_window = CORPUS_WINDOW;
    c.max_position_embeddings = 128;
    c.rms_norm_eps = 1e-6;
    c.rope_theta = 10000.0;
    if (family == KV_FAMILY_GEMMA2) {
        snprintf(c.model_type, sizeof c.model_type, "gemma2");
        c.query_pre_attn_scalar = 8.0;
        c.attn_logit_softcapping = 50.0;
        c.final_logit_softcapping = 30.0;
        c.tie_word_embeddings = true;
        for (int64_t i = 0; i < c.num_layers; i++) c.layer_sliding[i] = i % 2 == 0;
    } else if (family == KV_FAMILY_GEMMA3) {
        /* gemma2's base with q/k norms, a RoPE base per layer kind, no
         * attention softcap */
        snprintf(c.model_type, sizeof c.model_type, "gemma3_text");
        c.query_pre_attn_scalar = 8.0;
        c.final_logit_softcapping = 30.0;
        c.tie_word_embeddings = true;
        c.qk_norm = true;
        c.rope_theta = 1000000.0;
        c.rope_theta_local = 10000.0;
        for (int64_t i = 0; i < c.num_layers; i++) c.layer_sliding[i] = i % 2 == 0;
    } else if (family == KV_FAMILY_QWEN2) {
        /* layer 0 full, the rest sliding; q/k/v biases */
        snprintf(c.model_type, sizeof c.model_type, "qwen2");
        c.attn_qkv_bias = true;
        for (int64_t i = 0; i < c.num_layers; i++) c.layer_sliding[i] = i >= 1;
    } else {
        snprintf(c.model_type, sizeof c.model_type, "mistral");
        c.rms_norm_eps = 1e-5;
        c.tie_word_embeddings = false;
        for (int64_t i = 0; i < c.num_layers; i++) c.layer_sliding[i] = 1;
    }
    *out = c;
}

static void tensor_add(CorpusTensor *ts, size_t *n, const char *name, int rank, int64_t d0,
                       int64_t d1) {
    CorpusTensor *t = &ts[(*n)++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->rank = rank;
    t->shape[0] = d0;
    t->shape[1] = d1;
}

size_t corpus_tensors(const KvConfig *cfg, CorpusTensor *out) {
    size_t n = 0;
    int64_t h = cfg->hidden_size, in = cfg->intermediate_size;
    int64_t q = cfg->num_heads * cfg->head_dim, kv = cfg->num_kv_heads * cfg->head_dim;
    char name[KV_ST_MAX_NAME];
    tensor_add(out, &n, "model.embed_tokens.weight", 2, cfg->vocab_size, h);
    for (int64_t l = 0; l < cfg->num_layers; l++) {
#define LNAME(s) (snprintf(name, sizeof name, "model.layers.%lld.%s", (long long)l, s), name)
        tensor_add(out, &n, LNAME("input_layernorm.weight"), 1, h, 0);
        tensor_add(out, &n, LNAME("self_attn.q_proj.weight"), 2, q, h);
        tensor_add(out, &n, LNAME("self_attn.k_proj.weight"), 2, kv, h);
        tensor_add(out, &n, LNAME("self_attn.v_proj.weight"), 2, kv, h);
        tensor_add(out, &n, LNAME("self_attn.o_proj.weight"), 2, h, q);
        if (cfg->attn_qkv_bias) {
            tensor_add(out, &n, LNAME("self_attn.q_proj.bias"), 1, q, 0);
            tensor_add(out, &n, LNAME("self_attn.k_proj.bias"), 1, kv, 0);
            tensor_add(out, &n, LNAME("self_attn.v_proj.bias"), 1, kv, 0);
        }
        tensor_add(out, &n, LNAME("post_attention_layernorm.weight"), 1, h, 0);
        if (cfg->qk_norm) {
            tensor_add(out, &n, LNAME("self_attn.q_norm.weight"), 1, cfg->head_dim, 0);
            tensor_add(out, &n, LNAME("self_attn.k_norm.weight"), 1, cfg->head_dim, 0);
        }
        if (kv_config_gemma_style(cfg)) {
            tensor_add(out, &n, LNAME("pre_feedforward_layernorm.weight"), 1, h, 0);
            tensor_add(out, &n, LNAME("post_feedforward_layernorm.weight"), 1, h, 0);
        }
        tensor_add(out, &n, LNAME("mlp.gate_proj.weight"), 2, in, h);
        tensor_add(out, &n, LNAME("mlp.up_proj.weight"), 2, in, h);
        tensor_add(out, &n, LNAME("mlp.down_proj.weight"), 2, h, in);
#undef LNAME
    }
    tensor_add(out, &n, "model.norm.weight", 1, h, 0);
    if (!cfg->tie_word_embeddings) tensor_add(out, &n, "lm_head.weight", 2, cfg->vocab_size, h);
    return n;
}

static uint32_t name_hash(const char *name) {
    uint32_t h = 2166136261u; /* FNV-1a 32, local so the corpus needs no other module */
    for (const char *p = name; *p; p++) h = (h ^ (uint8_t)*p) * 16777619u;
    return h;
}

float corpus_value(const char *name, size_t i) {
    uint32_t k = (name_hash(name) + (uint32_t)i * 7u) % 17u;
    return ((float)k - 8.0f) / 16.0f;
}

uint16_t corpus_bits16(const char *name, size_t i) {
    /* Zeros, smallest/largest subnormal, smallest normal, one, largest
     * finite, infinities, NaNs (F16 view; as BF16 they are other values). */
    static const uint16_t special[] = {0x0000, 0x8000, 0x0001, 0x8001, 0x03ff, 0x0400, 0x3c00,
                                       0x7bff, 0x7c00, 0xfc00, 0x7e00, 0x7c01, 0xffff, 0x0080,
                                       0x007f, 0x7f80, 0x7f7f, 0x3f80};
    if (i < sizeof special / sizeof special[0]) return special[i];
    uint32_t x = name_hash(name) + (uint32_t)i * 2654435761u;
    x ^= x >> 15;
    x *= 0x2c1b3c6du;
    x ^= x >> 12;
    return (uint16_t)x;
}

/* Exact F16 encoding of corpus_value()s (multiples of 1/16, |v| <= 0.5). */
static uint16_t f16_from_value(float v) {
    if (v == 0.0f) return 0;
    uint32_t b;
    memcpy(&b, &v, sizeof b);
    uint32_t sign = (b >> 16) & 0x8000u;
    int32_t e = (int32_t)((b >> 23) & 0xff) - 127 + 15;
    return (uint16_t)(sign | ((uint32_t)e << 10) | ((b & 0x7fffffu) >> 13));
}

const char *corpus_pad_name(const KvConfig *cfg) {
    return cfg->tie_word_embeddings ? "lm_head.weight"
                                    : "model.layers.0.self_attn.rotary_emb.inv_freq";
}

void corpus_image(const KvConfig *cfg, CorpusEncoding enc, bool misalign, uint8_t **st,
                  size_t *st_len) {
    CorpusTensor ts[CORPUS_MAX_TENSORS + 8];
    KvStWriteTensor wt[CORPUS_MAX_TENSORS + 9];
    void *bufs[CORPUS_MAX_TENSORS + 8];
    if ((size_t)cfg->num_layers * 11 + 3 > CORPUS_MAX_TENSORS + 8) corpus_fail("too many layers", "");
    size_t n = corpus_tensors(cfg, ts);
    size_t w = 0;
    static const uint16_t pad_value = 0x3c00;
    if (misalign) {
        memset(&wt[w], 0, sizeof wt[w]);
        wt[w].name = corpus_pad_name(cfg);
        wt[w].dtype = KV_DTYPE_F16;
        wt[w].rank = 1;
        wt[w].shape[0] = 1;
        wt[w].data = &pad_value;
        w++;
    }
    for (size_t t = 0; t < n; t++) {
        size_t numel = (size_t)ts[t].shape[0] * (size_t)(ts[t].rank == 2 ? ts[t].shape[1] : 1);
        memset(&wt[w], 0, sizeof wt[w]);
        wt[w].name = ts[t].name;
        wt[w].rank = ts[t].rank;
        wt[w].shape[0] = ts[t].shape[0];
        wt[w].shape[1] = ts[t].shape[1];
        if (enc == CORPUS_F32) {
            float *f = corpus_alloc(numel * sizeof *f);
            for (size_t i = 0; i < numel; i++) f[i] = corpus_value(ts[t].name, i);
            wt[w].dtype = KV_DTYPE_F32;
            bufs[t] = f;
        } else {
            uint16_t *u = corpus_alloc(numel * sizeof *u);
            for (size_t i = 0; i < numel; i++) {
                u[i] = enc == CORPUS_F16_VALUES ? f16_from_value(corpus_value(ts[t].name, i))
                                                : corpus_bits16(ts[t].name, i);
            }
            wt[w].dtype = enc == CORPUS_BF16_BITS ? KV_DTYPE_BF16 : KV_DTYPE_F16;
            bufs[t] = u;
        }
        wt[w].data = bufs[t];
        w++;
    }
    KvError err;
    KvStatus s = kv_st_serialize(wt, w, st, st_len, &err);
    for (size_t t = 0; t < n; t++) free(bufs[t]);
    if (s != KV_OK) corpus_fail("kv_st_serialize failed", err.msg);
}

/* ---- mutation helpers -------------------------------------------------- */

static uint64_t read_u64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

static void write_u64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* Header tree + data section -> image (header padded to 8 like the writer). */
static void image_from_tree(const cJSON *header, const uint8_t *data, size_t data_len,
                            uint8_t **out, size_t *out_len) {
    char *h = cJSON_PrintUnformatted(header);
    if (h == NULL) corpus_fail("print", "header");
    size_t hl = strlen(h);
    size_t pad = (8 - (8 + hl) % 8) % 8;
    size_t len = 8 + hl + pad + data_len;
    uint8_t *img = corpus_alloc(len);
    write_u64(img, hl + pad);
    memcpy(img + 8, h, hl);
    memset(img + 8 + hl, ' ', pad);
    if (data_len > 0) memcpy(img + 8 + hl + pad, data, data_len);
    free(h);
    *out = img;
    *out_len = len;
}

/* The image as it stands now, into in->raw, for byte-level edits. */
static void make_raw(CorpusInput *in) {
    free(in->raw);
    image_from_tree(in->header, in->data, in->data_len, &in->raw, &in->raw_len);
}

/* Raw header text (space padded to 8) followed by the unchanged data section. */
static void raw_header_text(CorpusInput *in, const char *text) {
    size_t hl = strlen(text);
    size_t pad = (8 - (8 + hl) % 8) % 8;
    free(in->raw);
    in->raw_len = 8 + hl + pad + in->data_len;
    in->raw = corpus_alloc(in->raw_len);
    write_u64(in->raw, hl + pad);
    memcpy(in->raw + 8, text, hl);
    memset(in->raw + 8 + hl, ' ', pad);
    memcpy(in->raw + 8 + hl + pad, in->data, in->data_len);
}

static void obj_set_raw(cJSON *obj, const char *key, const char *json) {
    cJSON *v = cJSON_CreateRaw(json);
    if (v == NULL) corpus_fail("create", key);
    if (cJSON_GetObjectItemCaseSensitive(obj, key) != NULL) {
        cJSON_ReplaceItemInObjectCaseSensitive(obj, key, v);
    } else {
        cJSON_AddItemToObject(obj, key, v);
    }
}

static void obj_remove(cJSON *obj, const char *key) {
    if (cJSON_GetObjectItemCaseSensitive(obj, key) == NULL) corpus_fail("no such key", key);
    cJSON_DeleteItemFromObjectCaseSensitive(obj, key);
}

static cJSON *tensor(CorpusInput *in, const char *name) {
    cJSON *t = cJSON_GetObjectItemCaseSensitive(in->header, name);
    if (t == NULL) corpus_fail("no such tensor", name);
    return t;
}

static void tensor_set(CorpusInput *in, const char *name, const char *field, const char *json) {
    obj_set_raw(tensor(in, name), field, json);
}

static void tensor_offsets(CorpusInput *in, const char *name, uint64_t *begin, uint64_t *end) {
    cJSON *o = cJSON_GetObjectItemCaseSensitive(tensor(in, name), "data_offsets");
    *begin = (uint64_t)cJSON_GetArrayItem(o, 0)->valuedouble;
    *end = (uint64_t)cJSON_GetArrayItem(o, 1)->valuedouble;
}

static void tensor_set_offsets(CorpusInput *in, const char *name, uint64_t begin, uint64_t end) {
    char buf[64];
    snprintf(buf, sizeof buf, "[%llu, %llu]", (unsigned long long)begin, (unsigned long long)end);
    tensor_set(in, name, "data_offsets", buf);
}

/* Grows the data section by n zero bytes; returns where they start. */
static uint64_t data_append(CorpusInput *in, size_t n) {
    uint8_t *d = realloc(in->data, in->data_len + n);
    if (d == NULL) corpus_fail("realloc", "data");
    memset(d + in->data_len, 0, n);
    in->data = d;
    uint64_t at = in->data_len;
    in->data_len += n;
    return at;
}

/* Adds a tensor entry (appending n_bytes of data) from dtype/shape JSON. If
 * the name exists a second key is added: cJSON keeps both. */
static void tensor_add_new(CorpusInput *in, const char *name, const char *dtype,
                           const char *shape, size_t n_bytes) {
    uint64_t at = data_append(in, n_bytes);
    char json[512];
    snprintf(json, sizeof json, "{\"dtype\":\"%s\",\"shape\":%s,\"data_offsets\":[%llu,%llu]}",
             dtype, shape, (unsigned long long)at, (unsigned long long)(at + n_bytes));
    cJSON_AddItemToObject(in->header, name, cJSON_CreateRaw(json));
}

/* Adds an entry with explicit offsets (no data added): for overlaps. */
static void tensor_add_at(CorpusInput *in, const char *name, const char *dtype, const char *shape,
                          uint64_t begin, uint64_t end) {
    char json[512];
    snprintf(json, sizeof json, "{\"dtype\":\"%s\",\"shape\":%s,\"data_offsets\":[%llu,%llu]}",
             dtype, shape, (unsigned long long)begin, (unsigned long long)end);
    cJSON_AddItemToObject(in->header, name, cJSON_CreateRaw(json));
}

/* Moves every tensor entry that begins at or after `from` by delta bytes. */
static void entries_shift(CorpusInput *in, uint64_t from, int64_t delta) {
    for (cJSON *t = in->header->child; t != NULL; t = t->next) {
        if (strcmp(t->string, "__metadata__") == 0) continue;
        if (!cJSON_IsObject(t)) corpus_fail("cannot shift a raw entry", t->string);
        uint64_t b, e;
        tensor_offsets(in, t->string, &b, &e);
        if (b >= from) tensor_set_offsets(in, t->string, b + (uint64_t)delta, e + (uint64_t)delta);
    }
}

/* Inserts n zero bytes into the data section at `at`; the entries from there
 * on move up, leaving a gap of n bytes before them. */
static void data_insert(CorpusInput *in, uint64_t at, size_t n) {
    data_append(in, n);
    memmove(in->data + at + n, in->data + at, in->data_len - n - (size_t)at);
    memset(in->data + at, 0, n);
    entries_shift(in, at, (int64_t)n);
}

/* Removes tensor `name` and its bytes; later entries move down, so the
 * tensors still tile the data section (a missing tensor, not a gap). */
static void tensor_drop(CorpusInput *in, const char *name) {
    uint64_t b, e;
    tensor_offsets(in, name, &b, &e);
    obj_remove(in->header, name);
    memmove(in->data + b, in->data + e, in->data_len - (size_t)e);
    in->data_len -= (size_t)(e - b);
    entries_shift(in, e, -(int64_t)(e - b));
}

/* A malloc'd copy of s with the first `from` replaced by `to`. */
static char *text_replace(const char *s, const char *from, const char *to) {
    const char *at = strstr(s, from);
    if (at == NULL) corpus_fail("no such text", from);
    size_t head = (size_t)(at - s), fl = strlen(from), tl = strlen(to);
    char *out = corpus_alloc(strlen(s) - fl + tl + 1);
    memcpy(out, s, head);
    memcpy(out + head, to, tl);
    strcpy(out + head + tl, at + fl);
    return out;
}

/* The header as printed with one edit a cJSON tree cannot hold (a \u0000
 * escape, a raw control character, a leading space). */
static void header_replace(CorpusInput *in, const char *from, const char *to) {
    char *h = cJSON_PrintUnformatted(in->header);
    if (h == NULL) corpus_fail("print", "header");
    char *t = text_replace(h, from, to);
    raw_header_text(in, t);
    free(t);
    free(h);
}

/* The header as printed followed by `pad` (before the 8-byte alignment). */
static void header_pad(CorpusInput *in, const char *pad) {
    char *h = cJSON_PrintUnformatted(in->header);
    if (h == NULL) corpus_fail("print", "header");
    char *t = corpus_alloc(strlen(h) + strlen(pad) + 1);
    strcpy(t, h);
    strcat(t, pad);
    raw_header_text(in, t);
    free(t);
    free(h);
}

static void config_set(CorpusInput *in, const char *key, const char *json) {
    obj_set_raw(in->config, key, json);
}

static void config_text(CorpusInput *in, const char *text) {
    free(in->raw_config);
    in->raw_config = corpus_alloc(strlen(text) + 1);
    memcpy(in->raw_config, text, strlen(text) + 1);
}

/* The config as printed with one edit a cJSON tree cannot hold. */
static void config_replace(CorpusInput *in, const char *from, const char *to) {
    char *c = cJSON_Print(in->config);
    if (c == NULL) corpus_fail("print", "config");
    free(in->raw_config);
    in->raw_config = text_replace(c, from, to);
    free(c);
}

#define NORM "model.norm.weight"
#define Q0 "model.layers.0.self_attn.q_proj.weight"
#define K0 "model.layers.0.self_attn.k_proj.weight"
#define V0 "model.layers.0.self_attn.v_proj.weight"

/* ---- safetensors: raw bytes -------------------------------------------- */

static void m_st_empty(CorpusInput *in) {
    make_raw(in);
    in->raw_len = 0;
}
static void m_st_short(CorpusInput *in) {
    make_raw(in);
    in->raw_len = 5;
}
static void m_st_truncated_header(CorpusInput *in) {
    make_raw(in);
    in->raw_len = 8 + (size_t)read_u64(in->raw) / 2;
}
static void m_st_hlen_past_eof(CorpusInput *in) {
    make_raw(in);
    write_u64(in->raw, (uint64_t)in->raw_len - 8 + 1);
}
static void m_st_hlen_2p63(CorpusInput *in) {
    make_raw(in);
    write_u64(in->raw, 1ULL << 63);
}
static void m_st_hlen_max(CorpusInput *in) {
    make_raw(in);
    write_u64(in->raw, UINT64_MAX);
}
static void m_st_hlen_zero(CorpusInput *in) {
    make_raw(in);
    write_u64(in->raw, 0);
}
static void m_st_not_json(CorpusInput *in) { raw_header_text(in, "{\"model.norm.weight\": {dtype"); }
static void m_st_not_object(CorpusInput *in) { raw_header_text(in, "[1, 2, 3]"); }
static void m_st_trailing(CorpusInput *in) {
    char *h = cJSON_PrintUnformatted(in->header);
    char *t = corpus_alloc(strlen(h) + 8);
    snprintf(t, strlen(h) + 8, "%s}junk", h);
    raw_header_text(in, t);
    free(t);
    free(h);
}
static void m_st_nul(CorpusInput *in) {
    make_raw(in);
    in->raw[8 + 3] = 0;
}

/* ---- safetensors: header entries --------------------------------------- */

static void m_st_entry_not_object(CorpusInput *in) { obj_set_raw(in->header, NORM, "[0, 64]"); }
static void m_st_missing_dtype(CorpusInput *in) { obj_remove(tensor(in, NORM), "dtype"); }
static void m_st_dtype_number(CorpusInput *in) { tensor_set(in, NORM, "dtype", "32"); }
static void m_st_unknown_dtype(CorpusInput *in) { tensor_set(in, NORM, "dtype", "\"Q4_K\""); }
static void m_st_i64_required(CorpusInput *in) {
    /* 16 F32 = 64 bytes = 8 I64: a valid table entry the loader cannot use. */
    tensor_set(in, NORM, "dtype", "\"I64\"");
    tensor_set(in, NORM, "shape", "[8]");
}
static void m_st_i64_extra(CorpusInput *in) { tensor_add_new(in, "extra.step", "I64", "[3]", 24); }
static void m_st_f4_extra(CorpusInput *in) { tensor_add_new(in, "extra.f4", "F4", "[6]", 3); }
static void m_st_shape_not_array(CorpusInput *in) { tensor_set(in, NORM, "shape", "16"); }
static void m_st_shape_negative(CorpusInput *in) { tensor_set(in, NORM, "shape", "[-16]"); }
static void m_st_shape_fraction(CorpusInput *in) { tensor_set(in, NORM, "shape", "[15.5]"); }
static void m_st_shape_string(CorpusInput *in) { tensor_set(in, NORM, "shape", "[\"16\"]"); }
static void m_st_rank9(CorpusInput *in) {
    tensor_set(in, NORM, "shape", "[16, 1, 1, 1, 1, 1, 1, 1, 1]");
}
static void m_st_rank_mismatch(CorpusInput *in) { tensor_set(in, NORM, "shape", "[4, 4]"); }
static void m_st_wrong_shape(CorpusInput *in) { tensor_set(in, Q0, "shape", "[8, 32]"); }
static void m_st_offsets_oob(CorpusInput *in) {
    uint64_t b, e;
    tensor_offsets(in, NORM, &b, &e);
    uint64_t end = in->data_len + 4;
    tensor_set_offsets(in, NORM, end - (e - b), end);
}
static void m_st_begin_gt_end(CorpusInput *in) {
    uint64_t b, e;
    tensor_offsets(in, NORM, &b, &e);
    tensor_set_offsets(in, NORM, e, b);
}
static void m_st_size_mismatch(CorpusInput *in) { tensor_set(in, NORM, "shape", "[15]"); }
static void m_st_f16_size_mismatch(CorpusInput *in) { tensor_set(in, NORM, "dtype", "\"F16\""); }
static void m_st_overlap(CorpusInput *in) {
    uint64_t b, e;
    tensor_offsets(in, K0, &b, &e);
    tensor_set_offsets(in, V0, b + 4, e + 4);
}
static void m_st_duplicate(CorpusInput *in) { tensor_add_new(in, NORM, "F32", "[16]", 64); }
static void m_st_offsets_fraction(CorpusInput *in) {
    tensor_set(in, NORM, "data_offsets", "[0.5, 64.5]");
}
static void m_st_offsets_huge(CorpusInput *in) {
    /* 2^54 + 64: past 2^53 a double no longer names one integer. */
    tensor_set(in, NORM, "data_offsets", "[18014398509481984, 18014398509482048]");
}
static void m_st_offsets_one(CorpusInput *in) { tensor_set(in, NORM, "data_offsets", "[0]"); }
static void m_st_offsets_negative(CorpusInput *in) {
    tensor_set(in, NORM, "data_offsets", "[-64, 0]");
}
static void m_st_metadata_number(CorpusInput *in) {
    obj_set_raw(in->header, "__metadata__", "{\"format\": 1}");
}
static void m_st_metadata_array(CorpusInput *in) {
    obj_set_raw(in->header, "__metadata__", "[\"pt\"]");
}
static void m_st_missing_required(CorpusInput *in) {
    tensor_drop(in, "model.layers.1.mlp.down_proj.weight");
}
static void m_st_missing_lm_head(CorpusInput *in) { tensor_drop(in, "lm_head.weight"); }
static void m_st_missing_pre_ffw(CorpusInput *in) {
    tensor_drop(in, "model.layers.0.pre_feedforward_layernorm.weight");
}
static void m_st_missing_embed(CorpusInput *in) { tensor_drop(in, "model.embed_tokens.weight"); }
static void m_st_tied_lm_head_ignored(CorpusInput *in) {
    /* Tied: an lm_head.weight in the file is ignored, even a wrong one. */
    tensor_add_new(in, "lm_head.weight", "F32", "[3]", 12);
}
/* Tensors no family here binds: a qwen2-style bias, a gemma3 q_norm, a layer
 * past num_hidden_layers. */
#define Q0_BIAS "model.layers.0.self_attn.q_proj.bias"
static void m_st_unused_bias(CorpusInput *in) { tensor_add_new(in, Q0_BIAS, "F32", "[16]", 64); }
static void m_st_unused_q_norm(CorpusInput *in) {
    tensor_add_new(in, "model.layers.1.self_attn.q_norm.weight", "F32", "[8]", 32);
}
static void m_st_unused_layer(CorpusInput *in) {
    tensor_add_new(in, "model.layers.2.input_layernorm.weight", "F32", "[16]", 64);
}
/* Saved rotary buffers (head_dim / 2 = 4 values): ignored for the mistral
 * family within num_hidden_layers, refused elsewhere. */
static void m_st_inv_freq_ok(CorpusInput *in) {
    tensor_add_new(in, "model.layers.0.self_attn.rotary_emb.inv_freq", "F32", "[4]", 16);
    tensor_add_new(in, "model.layers.1.self_attn.rotary_emb.inv_freq", "F32", "[4]", 16);
}
static void m_st_inv_freq_llama_ok(CorpusInput *in) {
    config_set(in, "model_type", "\"llama\"");
    m_st_inv_freq_ok(in);
}
static void m_st_inv_freq_beyond(CorpusInput *in) {
    m_st_inv_freq_ok(in);
    tensor_add_new(in, "model.layers.2.self_attn.rotary_emb.inv_freq", "F32", "[4]", 16);
}
static void m_st_inv_freq_zero(CorpusInput *in) {
    tensor_add_new(in, "model.layers.01.self_attn.rotary_emb.inv_freq", "F32", "[4]", 16);
}
static void m_st_inv_freq_gemma2(CorpusInput *in) {
    tensor_add_new(in, "model.layers.0.self_attn.rotary_emb.inv_freq", "F32", "[4]", 16);
}
/* Tied mistral: the stored lm_head.weight is not read (the tied entry of the
 * ignore list holds for both families). */
static void m_st_tied_mistral_lm_head(CorpusInput *in) {
    config_set(in, "tie_word_embeddings", "true");
}
static void m_st_name_too_long(CorpusInput *in) {
    char name[301];
    memset(name, 'x', 300);
    name[300] = '\0';
    tensor_add_new(in, name, "F32", "[1]", 4);
}
static void m_st_empty_header(CorpusInput *in) {
    in->data_len = 0; /* no tensors, no bytes: a valid, empty file */
    raw_header_text(in, "{}");
}

/* ---- safetensors: tiling of the data section ---------------------------- */

static void m_st_trailing_bytes(CorpusInput *in) { data_append(in, 4); }
static void m_st_no_tensors_trailing(CorpusInput *in) { raw_header_text(in, "{}"); }
static void m_st_gap_between(CorpusInput *in) {
    uint64_t b, e;
    tensor_offsets(in, NORM, &b, &e);
    data_insert(in, b, 4);
}
static void m_st_gap_at_start(CorpusInput *in) { data_insert(in, 0, 8); }
static void m_st_overlap_alias(CorpusInput *in) {
    /* A second name for model.norm.weight's bytes. */
    uint64_t b, e;
    tensor_offsets(in, NORM, &b, &e);
    tensor_add_at(in, "alias.norm", "F32", "[16]", b, e);
}
static void m_st_overlap_inside(CorpusInput *in) {
    uint64_t b, e;
    tensor_offsets(in, "model.embed_tokens.weight", &b, &e);
    tensor_add_at(in, "inner", "F32", "[4]", b + 8, b + 24);
}
static void m_st_empty_inside(CorpusInput *in) {
    uint64_t b, e;
    tensor_offsets(in, "model.embed_tokens.weight", &b, &e);
    tensor_add_at(in, "empty.inside", "F32", "[0]", b + 8, b + 8);
}
static void m_st_empty_at_end(CorpusInput *in) {
    tensor_add_new(in, "extra.empty", "F32", "[0, 4]", 0);
}
static void m_st_empty_at_start(CorpusInput *in) {
    tensor_add_at(in, "extra.empty", "BF16", "[4, 0]", 0, 0);
}

/* ---- safetensors: header text -------------------------------------------- */

static void m_st_utf8_invalid(CorpusInput *in) { tensor_add_new(in, "extra.\xff", "U8", "[1]", 1); }
static void m_st_utf8_overlong(CorpusInput *in) {
    tensor_add_new(in, "extra.\xc0\xae", "U8", "[1]", 1); /* '.' in two bytes */
}
static void m_st_utf8_surrogate(CorpusInput *in) {
    obj_set_raw(in->header, "__metadata__", "{\"format\": \"pt\xed\xa0\x80\"}"); /* U+D800 */
}
static void m_st_utf8_truncated(CorpusInput *in) {
    tensor_add_new(in, "extra.\xe2\x82", "U8", "[1]", 1); /* first two bytes of U+20AC */
}
static void m_st_utf8_name(CorpusInput *in) {
    /* u-umlaut, euro sign, an emoji: 2, 3 and 4-byte sequences. */
    tensor_add_new(in, "extra.\xc3\xbc\xe2\x82\xac\xf0\x9f\x98\x80", "U8", "[1]", 1);
}
static void m_st_name_nul_escape(CorpusInput *in) {
    /* cJSON would read "model.norm.weight\u0000" as model.norm.weight. */
    tensor_add_new(in, NORM "NULMARK", "F32", "[16]", 64);
    header_replace(in, "NULMARK", "\\u0000");
}
static void m_st_dtype_nul_escape(CorpusInput *in) {
    tensor_set(in, NORM, "dtype", "\"F32\\u0000x\"");
}
static void m_st_name_escaped_backslash(CorpusInput *in) {
    /* The name is extra.\u0000 with a real backslash: written "\\u0000". */
    tensor_add_new(in, "extra.\\u0000", "U8", "[1]", 1);
}
static void m_st_name_control_char(CorpusInput *in) {
    tensor_add_new(in, "extra.CTLMARK", "U8", "[1]", 1);
    header_replace(in, "CTLMARK", "\t");
}
static void m_st_duplicate_metadata(CorpusInput *in) {
    cJSON_AddItemToObject(in->header, "__metadata__", cJSON_CreateRaw("{\"format\":\"np\"}"));
}
static void m_st_duplicate_field(CorpusInput *in) {
    /* serde refuses a repeated field; cJSON would read the first dtype. */
    cJSON_AddItemToObject(tensor(in, NORM), "dtype", cJSON_CreateRaw("\"F16\""));
}
static void m_st_duplicate_metadata_key(CorpusInput *in) {
    obj_set_raw(in->header, "__metadata__", "{\"format\":\"pt\",\"format\":\"np\"}");
}
static void m_st_leading_space(CorpusInput *in) { header_replace(in, "{", " {"); }
static void m_st_trailing_spaces_ok(CorpusInput *in) { header_pad(in, "                "); }
static void m_st_trailing_whitespace_ok(CorpusInput *in) {
    /* The reference reader (serde_json) accepts any JSON whitespace here. */
    header_pad(in, "\r\n\t ");
}

/* ---- config.json ------------------------------------------------------- */

static void m_cfg_not_json(CorpusInput *in) { config_text(in, "{\"model_type\": \"gemma2\","); }
static void m_cfg_not_object(CorpusInput *in) { config_text(in, "[\"gemma2\"]"); }
static void m_cfg_empty(CorpusInput *in) { config_text(in, ""); }
static void m_cfg_trailing(CorpusInput *in) {
    char *t = cJSON_PrintUnformatted(in->config);
    char *u = corpus_alloc(strlen(t) + 4);
    snprintf(u, strlen(t) + 4, "%s{}", t);
    config_text(in, u);
    free(u);
    free(t);
}
static void m_cfg_missing_model_type(CorpusInput *in) { obj_remove(in->config, "model_type"); }
static void m_cfg_unknown_model_type(CorpusInput *in) { config_set(in, "model_type", "\"bert\""); }
static void m_cfg_string_field(CorpusInput *in) { config_set(in, "hidden_size", "\"128\""); }
static void m_cfg_fraction(CorpusInput *in) { config_set(in, "intermediate_size", "32.5"); }
static void m_cfg_negative(CorpusInput *in) { config_set(in, "vocab_size", "-64"); }
static void m_cfg_zero(CorpusInput *in) { config_set(in, "num_hidden_layers", "0"); }
static void m_cfg_bool_field(CorpusInput *in) { config_set(in, "num_attention_heads", "true"); }
static void m_cfg_missing_vocab(CorpusInput *in) { obj_remove(in->config, "vocab_size"); }
static void m_cfg_too_big(CorpusInput *in) { config_set(in, "hidden_size", "2147483648"); }
static void m_cfg_window_zero(CorpusInput *in) { config_set(in, "sliding_window", "0"); }
static void m_cfg_window_negative(CorpusInput *in) { config_set(in, "sliding_window", "-4"); }
static void m_cfg_window_null_sliding(CorpusInput *in) {
    config_set(in, "sliding_window", "null");
}
static void m_cfg_kv_not_dividing(CorpusInput *in) { config_set(in, "num_key_value_heads", "3"); }
static void m_cfg_layer_types_len(CorpusInput *in) {
    config_set(in, "layer_types",
               "[\"sliding_attention\", \"full_attention\", \"sliding_attention\"]");
}
static void m_cfg_layer_types_bad(CorpusInput *in) {
    config_set(in, "layer_types", "[\"sliding_attention\", \"local_attention\"]");
}
static void m_cfg_layer_types_not_array(CorpusInput *in) {
    config_set(in, "layer_types", "\"sliding_attention\"");
}
static void m_cfg_rope_scaling(CorpusInput *in) {
    config_set(in, "rope_scaling", "{\"rope_type\": \"linear\", \"factor\": 2.0}");
}
static void m_cfg_rope_type(CorpusInput *in) {
    config_set(in, "rope_parameters", "{\"rope_type\": \"yarn\", \"rope_theta\": 10000}");
}
static void m_cfg_rope_theta_conflict(CorpusInput *in) {
    config_set(in, "rope_parameters", "{\"rope_type\": \"default\", \"rope_theta\": 500000}");
}
static void m_cfg_rope_theta_zero(CorpusInput *in) { config_set(in, "rope_theta", "0"); }
static void m_cfg_head_dim_odd(CorpusInput *in) { config_set(in, "head_dim", "7"); }
static void m_cfg_head_dim_shape(CorpusInput *in) {
    /* A valid config that no longer matches the tensors. */
    config_set(in, "head_dim", "4");
}
static void m_cfg_head_dim_inexact(CorpusInput *in) {
    obj_remove(in->config, "head_dim");
    config_set(in, "num_attention_heads", "3");
}
/* qwen2: a sliding layer named without use_sliding_window (transformers
 * builds it and fails in the first forward); a missing bias. */
static void m_cfg_qwen2_sliding_without_window(CorpusInput *in) {
    config_set(in, "use_sliding_window", "false");
}
static void m_st_qwen2_missing_bias(CorpusInput *in) {
    tensor_drop(in, "model.layers.1.self_attn.k_proj.bias");
}
/* gemma3: an attention softcap transformers would not apply; a RoPE
 * scaling; an unknown layer kind in rope_parameters; a missing k_norm. */
static void m_cfg_gemma3_attn_softcap(CorpusInput *in) {
    config_set(in, "attn_logit_softcapping", "50.0");
}
static void m_cfg_gemma3_rope_scaling(CorpusInput *in) {
    config_set(in, "rope_scaling", "{\"rope_type\": \"linear\", \"factor\": 8.0}");
}
static void m_cfg_gemma3_rope_params_key(CorpusInput *in) {
    config_set(in, "rope_parameters", "{\"chunked_attention\": {\"rope_theta\": 10000.0}}");
}
static void m_st_gemma3_missing_k_norm(CorpusInput *in) {
    tensor_drop(in, "model.layers.1.self_attn.k_norm.weight");
}
static void m_cfg_attention_bias(CorpusInput *in) { config_set(in, "attention_bias", "true"); }
static void m_cfg_mlp_bias(CorpusInput *in) { config_set(in, "mlp_bias", "true"); }
static void m_cfg_gemma_activation(CorpusInput *in) {
    config_set(in, "hidden_activation", "\"gelu\"");
}
static void m_cfg_gemma_hidden_act_only(CorpusInput *in) {
    obj_remove(in->config, "hidden_activation");
    config_set(in, "hidden_act", "\"relu\"");
}
static void m_cfg_mistral_activation(CorpusInput *in) { config_set(in, "hidden_act", "\"gelu\""); }
static void m_cfg_eps_zero(CorpusInput *in) { config_set(in, "rms_norm_eps", "0"); }
static void m_cfg_softcap_negative(CorpusInput *in) {
    config_set(in, "attn_logit_softcapping", "-1");
}
static void m_cfg_qpas_zero(CorpusInput *in) { config_set(in, "query_pre_attn_scalar", "0"); }
static void m_cfg_too_many_layers(CorpusInput *in) { config_set(in, "num_hidden_layers", "513"); }
static void m_cfg_vocab_one(CorpusInput *in) { config_set(in, "vocab_size", "1"); }
static void m_cfg_vocab_big(CorpusInput *in) { config_set(in, "vocab_size", "1048577"); }
static void m_cfg_hidden_big(CorpusInput *in) { config_set(in, "hidden_size", "65537"); }
static void m_cfg_inter_big(CorpusInput *in) { config_set(in, "intermediate_size", "262145"); }
static void m_cfg_heads_big(CorpusInput *in) { config_set(in, "num_attention_heads", "1025"); }
static void m_cfg_kv_heads_big(CorpusInput *in) { config_set(in, "num_key_value_heads", "1025"); }
static void m_cfg_head_dim_big(CorpusInput *in) { config_set(in, "head_dim", "4098"); }
static void m_cfg_window_big(CorpusInput *in) { config_set(in, "sliding_window", "10000000"); }
static void m_cfg_window_at_bound_ok(CorpusInput *in) {
    config_set(in, "sliding_window", "1048576");
}
static void m_cfg_positions_big(CorpusInput *in) {
    config_set(in, "max_position_embeddings", "16777217");
}
static void m_cfg_window_missing_ok(CorpusInput *in) { obj_remove(in->config, "sliding_window"); }
static void m_cfg_duplicate_nested(CorpusInput *in) {
    config_set(in, "rope_parameters",
               "{\"rope_type\": \"default\", \"rope_theta\": 10000, \"rope_theta\": 500000}");
}
static void m_cfg_key_nul_escape(CorpusInput *in) {
    /* cJSON would read this key as sliding_window = 2; transformers sees no
     * sliding_window key and takes 4096. */
    obj_remove(in->config, "sliding_window");
    config_set(in, "sliding_windowNULMARK", "2");
    config_replace(in, "NULMARK", "\\u0000");
}
static void m_cfg_utf8_invalid(CorpusInput *in) { config_set(in, "torch_dtype", "\"float32\xff\""); }
static void m_cfg_control_char(CorpusInput *in) { config_replace(in, "float32", "float\t32"); }
static void m_cfg_overflow(CorpusInput *in) {
    config_set(in, "vocab_size", "2147483647");
    config_set(in, "hidden_size", "2147483647");
    config_set(in, "intermediate_size", "2147483647");
}
static void m_cfg_duplicate_key(CorpusInput *in) {
    cJSON_AddItemToObject(in->config, "hidden_size", cJSON_CreateRaw("32"));
}
static void m_cfg_tie_string(CorpusInput *in) { config_set(in, "tie_word_embeddings", "\"yes\""); }
static void m_cfg_llama_ok(CorpusInput *in) {
    /* llama: same tensors as mistral, no window whatever the file says. */
    config_set(in, "model_type", "\"llama\"");
}
static void m_cfg_nulls_ok(CorpusInput *in) {
    /* null = the class default for optional fields. */
    config_set(in, "num_key_value_heads", "null");
    config_set(in, "num_attention_heads", "2");
    config_set(in, "num_key_value_heads", "1");
    config_set(in, "max_position_embeddings", "null");
    config_set(in, "rms_norm_eps", "null");
    config_set(in, "rope_theta", "null");
    config_set(in, "attn_logit_softcapping", "null");
    config_set(in, "layer_types", "null");
}

#define ST "model.safetensors"
#define CF "config.json"
#define G KV_FAMILY_GEMMA2
#define Q KV_FAMILY_QWEN2
#define G3 KV_FAMILY_GEMMA3
#define M KV_FAMILY_MISTRAL
#define BAD KV_ERR_INPUT
/* A tensor the model does not bind: the file parsed (the format allows it)
 * and the model refused it, so the message is the model's. */
#define UNUSED_G "is not used by family gemma2"
#define UNUSED_M "is not used by family mistral"

const CorpusCase corpus_cases[] = {
    /* safetensors framing */
    {"st_empty_file", G, m_st_empty, BAD, ST, {"0 bytes", "at least 8"}},
    {"st_shorter_than_8", M, m_st_short, BAD, ST, {"5 bytes", "at least 8"}},
    {"st_truncated_header", G, m_st_truncated_header, BAD, ST, {"header length", "past the end"}},
    {"st_header_len_past_eof", G, m_st_hlen_past_eof, BAD, ST, {"header length", "past the end"}},
    {"st_header_len_2p63", G, m_st_hlen_2p63, BAD, ST, {"header length 9223372036854775808", "expected at most"}},
    {"st_header_len_u64_max", M, m_st_hlen_max, BAD, ST, {"header length 18446744073709551615", "expected at most"}},
    {"st_header_len_zero", G, m_st_hlen_zero, BAD, ST, {"header", "starting with '{'", "an empty header"}},
    {"st_header_not_json", G, m_st_not_json, BAD, ST, {"header", "valid JSON", "syntax error"}},
    {"st_header_not_object", G, m_st_not_object, BAD, ST, {"header", "starting with '{'", "found '['"}},
    {"st_header_leading_space", G, m_st_leading_space, BAD, ST, {"header", "starting with '{'", "found ' '"}},
    {"st_header_trailing_spaces_ok", M, m_st_trailing_spaces_ok, KV_OK, NULL, {NULL}},
    {"st_header_trailing_whitespace_ok", G, m_st_trailing_whitespace_ok, KV_OK, NULL, {NULL}},
    {"st_header_trailing_data", G, m_st_trailing, BAD, ST, {"header", "trailing"}},
    {"st_header_nul_byte", M, m_st_nul, BAD, ST, {"header", "NUL"}},
    {"st_header_empty_object", G, m_st_empty_header, BAD, ST, {"model.embed_tokens.weight", "missing"}},
    /* safetensors header text: what cJSON lets through */
    {"st_header_utf8_invalid", G, m_st_utf8_invalid, BAD, ST, {"header", "UTF-8", "0xff"}},
    {"st_header_utf8_overlong", M, m_st_utf8_overlong, BAD, ST, {"header", "UTF-8", "0xc0"}},
    {"st_header_utf8_surrogate", G, m_st_utf8_surrogate, BAD, ST, {"header", "UTF-8", "0xed"}},
    {"st_header_utf8_truncated", M, m_st_utf8_truncated, BAD, ST, {"header", "UTF-8", "0xe2"}},
    {"st_header_utf8_name_parsed", M, m_st_utf8_name, BAD, ST, {"tensor 'extra.\xc3\xbc\xe2\x82\xac\xf0\x9f\x98\x80'", UNUSED_M}},
    {"st_name_nul_escape", G, m_st_name_nul_escape, BAD, ST, {"key \"model.norm.weight\\u0000\"", "no NUL character", "cut"}},
    {"st_dtype_nul_escape", M, m_st_dtype_nul_escape, BAD, ST, {"string \"F32\\u0000x\"", "no NUL character"}},
    {"st_name_escaped_backslash_parsed", G, m_st_name_escaped_backslash, BAD, ST, {"tensor 'extra.\\u0000'", UNUSED_G}},
    {"st_name_control_char", M, m_st_name_control_char, BAD, ST, {"key \"extra.?\"", "control character 0x09"}},
    {"st_duplicate_metadata", G, m_st_duplicate_metadata, BAD, ST, {"key '__metadata__'", "once", "repeated"}},
    {"st_duplicate_field_in_entry", M, m_st_duplicate_field, BAD, ST, {"key 'model.norm.weight.dtype'", "repeated"}},
    {"st_duplicate_metadata_key", G, m_st_duplicate_metadata_key, BAD, ST, {"key '__metadata__.format'", "repeated"}},
    /* safetensors data section: the tensors must tile it exactly */
    {"st_trailing_bytes", G, m_st_trailing_bytes, BAD, ST, {"data section", "4 trailing bytes", "'model.norm.weight'"}},
    {"st_no_tensors_trailing_bytes", M, m_st_no_tensors_trailing, BAD, ST, {"data section", "expected 0 bytes", "trailing bytes"}},
    {"st_gap_between_tensors", M, m_st_gap_between, BAD, ST, {"'model.norm.weight'", "gap of 4 bytes", "'model.layers.1.mlp.down_proj.weight'"}},
    {"st_gap_at_start", G, m_st_gap_at_start, BAD, ST, {"'model.embed_tokens.weight'", "start of the data section", "gap of 8 bytes"}},
    {"st_overlap_alias", G, m_st_overlap_alias, BAD, ST, {"'model.norm.weight'", "overlap", "'alias.norm'"}},
    {"st_overlap_inside", M, m_st_overlap_inside, BAD, ST, {"'inner'", "overlap", "'model.embed_tokens.weight'"}},
    {"st_empty_tensor_inside_another", G, m_st_empty_inside, BAD, ST, {"'empty.inside'", "overlap", "'model.embed_tokens.weight'"}},
    {"st_empty_tensor_at_end_parsed", M, m_st_empty_at_end, BAD, ST, {"tensor 'extra.empty'", UNUSED_M}},
    {"st_empty_tensor_at_start_parsed", G, m_st_empty_at_start, BAD, ST, {"tensor 'extra.empty'", UNUSED_G}},
    /* safetensors entries */
    {"st_entry_not_object", G, m_st_entry_not_object, BAD, ST, {"'model.norm.weight'", "expected an object", "array"}},
    {"st_missing_dtype", G, m_st_missing_dtype, BAD, ST, {"'model.norm.weight'", "'dtype'", "missing"}},
    {"st_dtype_not_string", G, m_st_dtype_number, BAD, ST, {"'model.norm.weight'", "'dtype'", "expected a string"}},
    {"st_unknown_dtype", G, m_st_unknown_dtype, BAD, ST, {"'model.norm.weight'", "unknown", "Q4_K"}},
    {"st_i64_required_tensor", G, m_st_i64_required, BAD, ST, {"'model.norm.weight'", "F32, F16 or BF16", "I64"}},
    {"st_i64_extra_tensor_parsed", G, m_st_i64_extra, BAD, ST, {"tensor 'extra.step'", UNUSED_G}},
    {"st_f4_extra_tensor_parsed", M, m_st_f4_extra, BAD, ST, {"tensor 'extra.f4'", UNUSED_M}},
    {"st_shape_not_array", G, m_st_shape_not_array, BAD, ST, {"'model.norm.weight'", "'shape'", "expected an array"}},
    {"st_shape_negative", G, m_st_shape_negative, BAD, ST, {"'model.norm.weight'", "shape[0]", "-16"}},
    {"st_shape_fraction", M, m_st_shape_fraction, BAD, ST, {"'model.norm.weight'", "shape[0]", "15.5"}},
    {"st_shape_string", G, m_st_shape_string, BAD, ST, {"shape[0]", "integer >= 0", "string"}},
    {"st_shape_rank_9", G, m_st_rank9, BAD, ST, {"'model.norm.weight'", "at most 8", "found 9"}},
    {"st_rank_mismatch", G, m_st_rank_mismatch, BAD, ST, {"'model.norm.weight'", "expected shape [16]", "found [4, 4]"}},
    {"st_wrong_shape", M, m_st_wrong_shape, BAD, ST, {"'" Q0 "'", "expected shape [16, 16]", "found [8, 32]"}},
    {"st_offsets_out_of_bounds", G, m_st_offsets_oob, BAD, ST, {"'model.norm.weight'", "data_offsets", "out of bounds"}},
    {"st_offsets_begin_after_end", G, m_st_begin_gt_end, BAD, ST, {"'model.norm.weight'", "begin <= end"}},
    {"st_bytes_not_matching_shape", G, m_st_size_mismatch, BAD, ST, {"'model.norm.weight'", "expected 60 bytes", "64 bytes"}},
    {"st_f16_bytes_not_matching", M, m_st_f16_size_mismatch, BAD, ST, {"'model.norm.weight'", "expected 32 bytes", "F16"}},
    {"st_offsets_overlap", G, m_st_overlap, BAD, ST, {"'" V0 "'", "overlap", "'" K0 "'"}},
    {"st_duplicate_name", G, m_st_duplicate, BAD, ST, {"key 'model.norm.weight'", "once", "repeated"}},
    {"st_offsets_fraction", G, m_st_offsets_fraction, BAD, ST, {"'model.norm.weight'", "data_offsets[0]", "0.5"}},
    {"st_offsets_above_2p53", M, m_st_offsets_huge, BAD, ST, {"'model.norm.weight'", "data_offsets[0]", "2^53"}},
    {"st_offsets_one_entry", G, m_st_offsets_one, BAD, ST, {"'model.norm.weight'", "[begin, end]", "array of 1"}},
    {"st_offsets_negative", G, m_st_offsets_negative, BAD, ST, {"'model.norm.weight'", "data_offsets[0]", "-64"}},
    {"st_metadata_not_strings", G, m_st_metadata_number, BAD, ST, {"__metadata__", "expected a string", "number 1"}},
    {"st_metadata_not_object", M, m_st_metadata_array, BAD, ST, {"__metadata__", "object of strings", "array"}},
    {"st_name_too_long", G, m_st_name_too_long, BAD, ST, {"xxxxxxxx", "fewer than 256", "300"}},
    /* model binding */
    {"model_missing_required", G, m_st_missing_required, BAD, ST, {"'model.layers.1.mlp.down_proj.weight'", "missing", "[16, 32]"}},
    {"model_missing_lm_head_untied", M, m_st_missing_lm_head, BAD, ST, {"'lm_head.weight'", "missing", "[64, 16]"}},
    {"model_missing_gemma2_norm", G, m_st_missing_pre_ffw, BAD, ST, {"'model.layers.0.pre_feedforward_layernorm.weight'", "missing"}},
    {"model_missing_embed", M, m_st_missing_embed, BAD, ST, {"'model.embed_tokens.weight'", "missing"}},
    {"model_tied_lm_head_ignored", G, m_st_tied_lm_head_ignored, KV_OK, NULL, {NULL}},
    /* tensors the family does not use: refused unless ignore-listed (model.c) */
    {"model_unused_bias", M, m_st_unused_bias, BAD, ST, {"tensor '" Q0_BIAS "'", UNUSED_M, "silently drop it"}},
    {"model_unused_gemma2_q_norm", G, m_st_unused_q_norm, BAD, ST, {"tensor 'model.layers.1.self_attn.q_norm.weight'", UNUSED_G}},
    {"model_unused_layer_beyond_config", M, m_st_unused_layer, BAD, ST, {"tensor 'model.layers.2.input_layernorm.weight'", UNUSED_M}},
    {"model_inv_freq_ignored_ok", M, m_st_inv_freq_ok, KV_OK, NULL, {NULL}},
    {"model_inv_freq_llama_ignored_ok", M, m_st_inv_freq_llama_ok, KV_OK, NULL, {NULL}},
    {"model_inv_freq_beyond_layers", M, m_st_inv_freq_beyond, BAD, ST, {"tensor 'model.layers.2.self_attn.rotary_emb.inv_freq'", UNUSED_M}},
    {"model_inv_freq_leading_zero", M, m_st_inv_freq_zero, BAD, ST, {"tensor 'model.layers.01.self_attn.rotary_emb.inv_freq'", UNUSED_M}},
    {"model_inv_freq_gemma2", G, m_st_inv_freq_gemma2, BAD, ST, {"tensor 'model.layers.0.self_attn.rotary_emb.inv_freq'", UNUSED_G}},
    {"model_unused_lm_head_tied_mistral", M, m_st_tied_mistral_lm_head, KV_OK, NULL, {NULL}},
    /* config.json */
    {"cfg_not_json", G, m_cfg_not_json, BAD, CF, {"valid JSON", "syntax error"}},
    {"cfg_not_object", G, m_cfg_not_object, BAD, CF, {"JSON object", "array"}},
    {"cfg_empty", M, m_cfg_empty, BAD, CF, {"valid JSON"}},
    {"cfg_trailing_data", G, m_cfg_trailing, BAD, CF, {"trailing"}},
    {"cfg_missing_model_type", G, m_cfg_missing_model_type, BAD, CF, {"'model_type'", "missing"}},
    {"cfg_unknown_model_type", M, m_cfg_unknown_model_type, BAD, CF, {"'model_type'", "\"gemma2\", \"gemma3_text\", \"gpt_oss\", \"mistral\", \"llama\" or \"qwen2\"", "\"bert\""}},
    {"cfg_string_field", G, m_cfg_string_field, BAD, CF, {"'hidden_size'", "integer", "the string \"128\""}},
    {"cfg_fractional_field", G, m_cfg_fraction, BAD, CF, {"'intermediate_size'", "integer", "32.5"}},
    {"cfg_negative_size", M, m_cfg_negative, BAD, CF, {"'vocab_size'", "integer in [2,", "-64"}},
    {"cfg_zero_size", G, m_cfg_zero, BAD, CF, {"'num_hidden_layers'", "integer in [1,", "the number 0"}},
    {"cfg_bool_as_int", G, m_cfg_bool_field, BAD, CF, {"'num_attention_heads'", "integer", "true"}},
    {"cfg_missing_required", M, m_cfg_missing_vocab, BAD, CF, {"'vocab_size'", "integer", "missing"}},
    {"cfg_int_above_2p31", G, m_cfg_too_big, BAD, CF, {"'hidden_size'", "[1, 65536]", "2147483648"}},
    {"cfg_window_zero", G, m_cfg_window_zero, BAD, CF, {"'sliding_window'", "integer in [1,", "the number 0"}},
    {"cfg_window_negative", M, m_cfg_window_negative, BAD, CF, {"'sliding_window'", "integer in [1,", "-4"}},
    {"cfg_gemma2_window_null_sliding", G, m_cfg_window_null_sliding, BAD, CF, {"'sliding_window'", "layer 0 is sliding", "null"}},
    {"cfg_kv_heads_not_dividing", G, m_cfg_kv_not_dividing, BAD, CF, {"'num_key_value_heads'", "divisor", "3"}},
    {"cfg_layer_types_length", G, m_cfg_layer_types_len, BAD, CF, {"'layer_types'", "array of 2", "array of 3"}},
    {"cfg_layer_types_bad_string", G, m_cfg_layer_types_bad, BAD, CF, {"'layer_types[1]'", "sliding_attention", "local_attention"}},
    {"cfg_layer_types_not_array", G, m_cfg_layer_types_not_array, BAD, CF, {"'layer_types'", "array of 2", "string"}},
    {"cfg_rope_scaling", M, m_cfg_rope_scaling, BAD, CF, {"'rope_scaling'", "not supported", "object"}},
    {"cfg_rope_type_yarn", G, m_cfg_rope_type, BAD, CF, {"'rope_parameters.rope_type'", "default", "yarn"}},
    {"cfg_rope_theta_conflict", G, m_cfg_rope_theta_conflict, BAD, CF, {"'rope_parameters.rope_theta'", "same value", "500000"}},
    {"cfg_rope_theta_zero", M, m_cfg_rope_theta_zero, BAD, CF, {"'rope_theta'", "> 0", "the number 0"}},
    {"cfg_head_dim_odd", G, m_cfg_head_dim_odd, BAD, CF, {"'head_dim'", "even", "7"}},
    {"cfg_head_dim_vs_tensors", G, m_cfg_head_dim_shape, BAD, ST, {"'" Q0 "'", "expected shape [8, 16]", "found [16, 16]"}},
    {"cfg_head_dim_inexact_default", M, m_cfg_head_dim_inexact, BAD, CF, {"'head_dim'", "divisible", "(3)"}},
    {"cfg_attention_bias", G, m_cfg_attention_bias, BAD, CF, {"'attention_bias'", "false", "true"}},
    {"cfg_qwen2_sliding_without_window", Q, m_cfg_qwen2_sliding_without_window, BAD, CF, {"'use_sliding_window'", "layer_types[1] is sliding_attention", "false"}},
    {"model_qwen2_missing_bias", Q, m_st_qwen2_missing_bias, BAD, ST, {"model.layers.1.self_attn.k_proj.bias"}},
    {"cfg_gemma3_attn_softcap", G3, m_cfg_gemma3_attn_softcap, BAD, CF, {"'attn_logit_softcapping'", "does not apply it", "50"}},
    {"cfg_gemma3_rope_scaling", G3, m_cfg_gemma3_rope_scaling, BAD, CF, {"'rope_scaling'", "not supported"}},
    {"cfg_gemma3_rope_parameters_key", G3, m_cfg_gemma3_rope_params_key, BAD, CF, {"'rope_parameters.chunked_attention'", "sliding_attention and full_attention"}},
    {"model_gemma3_missing_k_norm", G3, m_st_gemma3_missing_k_norm, BAD, ST, {"model.layers.1.self_attn.k_norm.weight"}},
    {"cfg_mlp_bias", M, m_cfg_mlp_bias, BAD, CF, {"'mlp_bias'", "false", "true"}},
    {"cfg_gemma2_activation", G, m_cfg_gemma_activation, BAD, CF, {"'hidden_activation'", "gelu_pytorch_tanh", "\"gelu\""}},
    {"cfg_gemma2_hidden_act_fallback", G, m_cfg_gemma_hidden_act_only, BAD, CF, {"'hidden_act'", "gelu_pytorch_tanh", "\"relu\""}},
    {"cfg_mistral_activation", M, m_cfg_mistral_activation, BAD, CF, {"'hidden_act'", "\"silu\"", "\"gelu\""}},
    {"cfg_eps_zero", G, m_cfg_eps_zero, BAD, CF, {"'rms_norm_eps'", "> 0", "the number 0"}},
    {"cfg_softcap_negative", G, m_cfg_softcap_negative, BAD, CF, {"'attn_logit_softcapping'", ">= 0", "-1"}},
    {"cfg_query_scalar_zero", G, m_cfg_qpas_zero, BAD, CF, {"'query_pre_attn_scalar'", "> 0", "the number 0"}},
    {"cfg_too_many_layers", M, m_cfg_too_many_layers, BAD, CF, {"'num_hidden_layers'", "[1, 512]", "513"}},
    {"cfg_vocab_one", M, m_cfg_vocab_one, BAD, CF, {"'vocab_size'", "[2, 1048576]", "the number 1"}},
    {"cfg_vocab_above_bound", G, m_cfg_vocab_big, BAD, CF, {"'vocab_size'", "[2, 1048576]", "1048577"}},
    {"cfg_hidden_above_bound", M, m_cfg_hidden_big, BAD, CF, {"'hidden_size'", "[1, 65536]", "65537"}},
    {"cfg_intermediate_above_bound", G, m_cfg_inter_big, BAD, CF, {"'intermediate_size'", "[1, 262144]", "262145"}},
    {"cfg_heads_above_bound", M, m_cfg_heads_big, BAD, CF, {"'num_attention_heads'", "[1, 1024]", "1025"}},
    {"cfg_kv_heads_above_bound", G, m_cfg_kv_heads_big, BAD, CF, {"'num_key_value_heads'", "[1, 1024]", "1025"}},
    {"cfg_head_dim_above_bound", M, m_cfg_head_dim_big, BAD, CF, {"'head_dim'", "[1, 4096]", "4098"}},
    {"cfg_window_above_bound", M, m_cfg_window_big, BAD, CF, {"'sliding_window'", "[1, 1048576] or null", "10000000"}},
    {"cfg_window_at_bound_ok", M, m_cfg_window_at_bound_ok, KV_OK, NULL, {NULL}},
    {"cfg_window_missing_ok", M, m_cfg_window_missing_ok, KV_OK, NULL, {NULL}},
    {"cfg_positions_above_bound", G, m_cfg_positions_big, BAD, CF, {"'max_position_embeddings'", "[1, 16777216]", "16777217"}},
    {"cfg_all_sizes_huge", G, m_cfg_overflow, BAD, CF, {"'vocab_size'", "[2, 1048576]", "2147483647"}},
    {"cfg_duplicate_key", G, m_cfg_duplicate_key, BAD, CF, {"'hidden_size'", "once", "repeated"}},
    {"cfg_duplicate_nested_key", G, m_cfg_duplicate_nested, BAD, CF, {"'rope_parameters.rope_theta'", "once", "repeated"}},
    {"cfg_key_nul_escape", M, m_cfg_key_nul_escape, BAD, CF, {"key \"sliding_window\\u0000\"", "no NUL character", "cut"}},
    {"cfg_utf8_invalid", G, m_cfg_utf8_invalid, BAD, CF, {"UTF-8", "0xff"}},
    {"cfg_control_char", M, m_cfg_control_char, BAD, CF, {"string \"float?32\"", "control character 0x09"}},
    {"cfg_tie_not_bool", M, m_cfg_tie_string, BAD, CF, {"'tie_word_embeddings'", "true or false", "\"yes\""}},
    {"cfg_llama_ok", M, m_cfg_llama_ok, KV_OK, NULL, {NULL}},
    {"cfg_nulls_take_defaults_ok", G, m_cfg_nulls_ok, KV_OK, NULL, {NULL}},
};

const size_t corpus_n_cases = sizeof corpus_cases / sizeof corpus_cases[0];

void corpus_case_build(const CorpusCase *c, char **config, size_t *config_len, uint8_t **st,
                       size_t *st_len) {
    KvConfig cfg;
    CorpusInput in;
    memset(&in, 0, sizeof in);
    corpus_config(c->family, &cfg);

    char *json = kv_config_to_json(&cfg);
    if (json == NULL) corpus_fail("kv_config_to_json", c->name);
    in.config = cJSON_Parse(json);
    free(json);
    if (in.config == NULL) corpus_fail("config tree", c->name);

    uint8_t *img;
    size_t img_len;
    corpus_image(&cfg, CORPUS_F32, false, &img, &img_len);
    uint64_t hl = read_u64(img);
    in.header = cJSON_ParseWithLength((const char *)img + 8, (size_t)hl);
    if (in.header == NULL) corpus_fail("header tree", c->name);
    in.data_len = img_len - 8 - (size_t)hl;
    in.data = corpus_alloc(in.data_len);
    memcpy(in.data, img + 8 + hl, in.data_len);
    free(img);

    c->mutate(&in);

    if (in.raw_config != NULL) {
        *config = in.raw_config;
    } else {
        *config = cJSON_Print(in.config);
        if (*config == NULL) corpus_fail("print config", c->name);
    }
    *config_len = strlen(*config);
    if (in.raw != NULL) {
        *st = in.raw;
        *st_len = in.raw_len;
    } else {
        image_from_tree(in.header, in.data, in.data_len, st, st_len);
    }
    cJSON_Delete(in.config);
    cJSON_Delete(in.header);
    free(in.data);
}
