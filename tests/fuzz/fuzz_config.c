/* fuzz_config.c: libFuzzer target for config.json. The input is the file's
 * text.
 *
 * Each input goes through kv_config_parse and, through a real file,
 * kv_config_load (file_open.c); both must give the same status, message and
 * config. A config that is accepted must then:
 *  - satisfy the invariants the rest of the code relies on (config.h);
 *  - round-trip: kv_config_to_json, parsed again, gives the same config;
 *  - when its weights are small, load as a model: a checkpoint with exactly
 *    the tensors and shapes it implies (kv_fuzz_model_image) must be
 *    accepted by kv_model_load_memory. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"
#include "model.h"

/* Weights above this many floats are not built (the sizes are still parsed
 * and checked for overflow). */
#define KV_FUZZ_MAX_WEIGHTS (1u << 16)

static char g_path[4096];

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    kv_fuzz_path(g_path, sizeof g_path, "config.json");
    return 0;
}

static void check_same_config(const KvConfig *a, const KvConfig *b, const char *what) {
#define SAME(f) KV_FUZZ_CHECK(a->f == b->f, "%s: field " #f " differs", what)
    SAME(family);
    KV_FUZZ_CHECK(strncmp(a->model_type, b->model_type, sizeof a->model_type) == 0,
                  "%s: model_type '%.31s' vs '%.31s'", what, a->model_type, b->model_type);
    SAME(vocab_size);
    SAME(hidden_size);
    SAME(intermediate_size);
    SAME(num_layers);
    SAME(num_heads);
    SAME(num_kv_heads);
    SAME(head_dim);
    SAME(sliding_window);
    SAME(max_position_embeddings);
    SAME(tie_word_embeddings);
    SAME(attn_qkv_bias);
    SAME(qk_norm);
    SAME(attn_o_bias);
    SAME(attn_sinks);
    SAME(rope_yarn);
    SAME(rope_truncate);
    SAME(num_experts);
    SAME(experts_per_tok);
#undef SAME
    /* Doubles bitwise: a round trip must not move a value by an ulp. */
    const double da[] = {a->rms_norm_eps,          a->rope_theta,         a->rope_theta_local,
                         a->query_pre_attn_scalar, a->attn_logit_softcapping,
                         a->final_logit_softcapping, a->rope_factor,      a->rope_beta_fast,
                         a->rope_beta_slow,        a->rope_orig_max_pos,  a->rope_attention_factor,
                         a->swiglu_limit,          a->swiglu_alpha};
    const double db[] = {b->rms_norm_eps,          b->rope_theta,         b->rope_theta_local,
                         b->query_pre_attn_scalar, b->attn_logit_softcapping,
                         b->final_logit_softcapping, b->rope_factor,      b->rope_beta_fast,
                         b->rope_beta_slow,        b->rope_orig_max_pos,  b->rope_attention_factor,
                         b->swiglu_limit,          b->swiglu_alpha};
    static const char *const names[] = {
        "rms_norm_eps",  "rope_theta",        "rope_theta_local", "query_pre_attn_scalar",
        "attn_logit_softcapping", "final_logit_softcapping", "rope_factor", "rope_beta_fast",
        "rope_beta_slow", "rope_orig_max_pos", "rope_attention_factor", "swiglu_limit",
        "swiglu_alpha"};
    for (size_t i = 0; i < sizeof da / sizeof da[0]; i++) {
        KV_FUZZ_CHECK(memcmp(&da[i], &db[i], sizeof da[i]) == 0, "%s: field %s: %.17g vs %.17g",
                      what, names[i], da[i], db[i]);
    }
    KV_FUZZ_CHECK(memcmp(a->layer_sliding, b->layer_sliding, sizeof a->layer_sliding) == 0,
                  "%s: layer_sliding differs", what);
    /* layer_window as the layers see it: a list that names every window
     * and one that leaves them at sliding_window are the same model. */
    for (int64_t i = 0; i < KV_MAX_LAYERS; i++) {
        KV_FUZZ_CHECK(kv_config_layer_window(a, i) == kv_config_layer_window(b, i),
                      "%s: layer %lld's window %lld vs %lld", what, (long long)i,
                      (long long)kv_config_layer_window(a, i),
                      (long long)kv_config_layer_window(b, i));
    }
}

static void check_invariants(const KvConfig *c) {
    KV_FUZZ_CHECK(c->family == KV_FAMILY_GEMMA2 || c->family == KV_FAMILY_MISTRAL ||
                      c->family == KV_FAMILY_QWEN2 || c->family == KV_FAMILY_GEMMA3 ||
                      c->family == KV_FAMILY_GPT_OSS,
                  "family %d", (int)c->family);
    /* The per-family flags: only the families that have them set them. */
    KV_FUZZ_CHECK(!c->qk_norm || c->family == KV_FAMILY_GEMMA3, "qk_norm outside gemma3");
    KV_FUZZ_CHECK(!c->attn_qkv_bias || c->family == KV_FAMILY_QWEN2 ||
                      c->family == KV_FAMILY_GPT_OSS,
                  "q/k/v biases outside qwen2 and gpt_oss");
    KV_FUZZ_CHECK(c->family != KV_FAMILY_QWEN2 || c->attn_qkv_bias, "qwen2 without q/k/v biases");
    KV_FUZZ_CHECK(c->attn_o_bias == (c->family == KV_FAMILY_GPT_OSS && c->attn_qkv_bias),
                  "o_proj bias %d", c->attn_o_bias);
    KV_FUZZ_CHECK(c->attn_sinks == (c->family == KV_FAMILY_GPT_OSS), "sinks %d", c->attn_sinks);
    if (c->family == KV_FAMILY_GPT_OSS) {
        KV_FUZZ_CHECK(c->num_experts >= 1 && c->num_experts <= KV_CONFIG_MAX_EXPERTS &&
                          c->experts_per_tok >= 1 && c->experts_per_tok <= c->num_experts,
                      "experts %lld, per token %lld", (long long)c->num_experts,
                      (long long)c->experts_per_tok);
        KV_FUZZ_CHECK(isfinite(c->swiglu_limit) && isfinite(c->swiglu_alpha), "swiglu %g %g",
                      c->swiglu_limit, c->swiglu_alpha);
    } else {
        KV_FUZZ_CHECK(c->num_experts == 0 && c->experts_per_tok == 0, "experts outside gpt_oss");
    }
    KV_FUZZ_CHECK(c->rope_theta_local == 0 || (c->family == KV_FAMILY_GEMMA3 &&
                                               isfinite(c->rope_theta_local) &&
                                               c->rope_theta_local > 0),
                  "rope_theta_local %g", c->rope_theta_local);
    KV_FUZZ_CHECK(isfinite(c->rope_attention_factor) &&
                      (c->rope_yarn || c->rope_attention_factor == 1.0),
                  "rope_attention_factor %g", c->rope_attention_factor);
    if (c->rope_yarn) {
        KV_FUZZ_CHECK(c->family == KV_FAMILY_GPT_OSS, "YaRN outside gpt_oss");
        KV_FUZZ_CHECK(isfinite(c->rope_factor) && isfinite(c->rope_beta_fast) &&
                          isfinite(c->rope_beta_slow) && isfinite(c->rope_orig_max_pos),
                      "YaRN parameters not finite");
    }
    KV_FUZZ_CHECK(memchr(c->model_type, '\0', sizeof c->model_type) != NULL,
                  "model_type unterminated");
    KV_FUZZ_CHECK(c->vocab_size >= 1 && c->hidden_size >= 1 && c->intermediate_size >= 1 &&
                      c->num_heads >= 1 && c->num_kv_heads >= 1 && c->head_dim >= 2,
                  "a size below 1");
    KV_FUZZ_CHECK(c->num_layers >= 1 && c->num_layers <= KV_MAX_LAYERS, "num_layers %lld",
                  (long long)c->num_layers);
    KV_FUZZ_CHECK(c->head_dim % 2 == 0, "odd head_dim %lld", (long long)c->head_dim);
    KV_FUZZ_CHECK(c->num_heads % c->num_kv_heads == 0, "kv heads do not divide heads");
    KV_FUZZ_CHECK(c->sliding_window >= 0 && c->max_position_embeddings >= 1, "window or positions");
    KV_FUZZ_CHECK(isfinite(c->rms_norm_eps) && c->rms_norm_eps > 0, "rms_norm_eps %g",
                  c->rms_norm_eps);
    KV_FUZZ_CHECK(isfinite(c->rope_theta) && c->rope_theta > 0, "rope_theta %g", c->rope_theta);
    KV_FUZZ_CHECK(isfinite(c->attn_logit_softcapping) && c->attn_logit_softcapping >= 0 &&
                      isfinite(c->final_logit_softcapping) && c->final_logit_softcapping >= 0,
                  "softcapping");
    if (c->family == KV_FAMILY_GEMMA2) {
        KV_FUZZ_CHECK(isfinite(c->query_pre_attn_scalar) && c->query_pre_attn_scalar > 0,
                      "query_pre_attn_scalar %g", c->query_pre_attn_scalar);
    }
    for (int64_t i = 0; i < KV_MAX_LAYERS; i++) {
        KV_FUZZ_CHECK(c->layer_sliding[i] <= 1, "layer_sliding[%lld] = %d", (long long)i,
                      c->layer_sliding[i]);
        KV_FUZZ_CHECK(i < c->num_layers || c->layer_sliding[i] == 0,
                      "layer_sliding set past num_layers");
        int64_t w = kv_config_layer_window(c, i);
        /* a sliding layer's own window (mistral's list form) or W; W is the largest */
        KV_FUZZ_CHECK(c->layer_window[i] >= 0 && c->layer_window[i] <= c->sliding_window &&
                          (c->layer_window[i] == 0 || (i < c->num_layers && c->layer_sliding[i])),
                      "layer_window[%lld] = %lld (W %lld)", (long long)i,
                      (long long)c->layer_window[i], (long long)c->sliding_window);
        const int64_t want = i < c->num_layers && c->layer_sliding[i]
                                 ? (c->layer_window[i] > 0 ? c->layer_window[i] : c->sliding_window)
                                 : 0;
        KV_FUZZ_CHECK(w == want, "kv_config_layer_window(%lld) = %lld", (long long)i,
                      (long long)w);
        KV_FUZZ_CHECK(i >= c->num_layers || !c->layer_sliding[i] || c->sliding_window > 0,
                      "layer %lld slides with no window", (long long)i);
    }
    KV_FUZZ_CHECK(kv_config_layer_window(c, -1) == 0, "a window for layer -1");
    float scale = kv_config_attn_scale(c);
    KV_FUZZ_CHECK(isfinite(scale) && scale >= 0, "attention scale %g", (double)scale);
    KV_FUZZ_CHECK(strcmp(kv_family_name(c->family), "unknown") != 0, "family name");
}

/* The config's weight count when it is at most limit, else 0. */
static size_t small_weight_count(const KvConfig *c, size_t limit) {
    unsigned __int128 h = (unsigned __int128)c->hidden_size;
    unsigned __int128 q = (unsigned __int128)c->num_heads * (unsigned __int128)c->head_dim;
    unsigned __int128 kv = (unsigned __int128)c->num_kv_heads * (unsigned __int128)c->head_dim;
    const unsigned __int128 experts = c->num_experts > 0 ? (unsigned __int128)c->num_experts : 1;
    /* projections, MLP (every expert; router and biases), norms, biases, sinks */
    unsigned __int128 layer = 2 * q * h + 2 * kv * h +
                              experts * (3 * (unsigned __int128)c->intermediate_size * h +
                                         2 * (unsigned __int128)c->intermediate_size + 2 * h) +
                              4 * h + q + 2 * kv + h + (unsigned __int128)c->num_heads +
                              2 * (unsigned __int128)c->head_dim;
    unsigned __int128 all = layer * (unsigned __int128)c->num_layers +
                            2 * (unsigned __int128)c->vocab_size * h + h;
    return all <= limit ? (size_t)all : 0;
}

static void check_model_loads(const char *text, size_t len, const KvConfig *cfg) {
    if (small_weight_count(cfg, KV_FUZZ_MAX_WEIGHTS) == 0) return;
    static const KvDtype dtypes[] = {KV_DTYPE_F32, KV_DTYPE_BF16};
    KvDtype dt = dtypes[(size_t)(cfg->vocab_size + cfg->num_layers) % 2];
    uint8_t *img = NULL;
    size_t img_len = 0;
    KvError err = {{0}};
    KvStatus st = kv_fuzz_model_image(cfg, dt, &img, &img_len, &err);
    KV_FUZZ_CHECK(st == KV_OK, "cannot build a checkpoint for the config: %s", err.msg);
    KvModel m;
    st = kv_model_load_memory(text, len, img, img_len, "fuzz", &m, &err);
    KV_FUZZ_CHECK(st == KV_OK, "a config that parses, with exactly its tensors, does not load: %s",
                  err.msg);
    check_same_config(&m.config, cfg, "model config");
    KV_FUZZ_CHECK(m.embed.data != NULL && m.final_norm != NULL && m.lm_head.data != NULL &&
                      m.layers != NULL,
                  "a loaded model without weights");
    const bool tied = m.lm_head.data == m.embed.data;
    KV_FUZZ_CHECK(tied == cfg->tie_word_embeddings, "lm_head tied = %d, tie_word_embeddings = %d",
                  tied, cfg->tie_word_embeddings);
    (void)kv_model_hash(&m); /* reads every weight */
    kv_model_free(&m);
    free(img);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *text = (const char *)data;
    KvConfig cfg, from_file;
    KvError err = {{0}}, err_file = {{0}};
    /* The file's path as the label: the two messages must then be equal. */
    KvStatus st = kv_config_parse(text, size, g_path, &cfg, &err);
    kv_fuzz_check_status(st, &err, "kv_config_parse");
    kv_fuzz_write_file(g_path, data, size);
    KvStatus st_file = kv_config_load(g_path, &from_file, &err_file);
    kv_fuzz_check_status(st_file, &err_file, "kv_config_load");
    KV_FUZZ_CHECK(st == st_file, "parse and load disagree: %d (%s) vs %d (%s)", (int)st, err.msg,
                  (int)st_file, err_file.msg);
    if (st != KV_OK) {
        KV_FUZZ_CHECK(strcmp(err.msg, err_file.msg) == 0, "parse and load messages differ:\n%s\n%s",
                      err.msg, err_file.msg);
        KV_FUZZ_CHECK(kv_fuzz_all_zero(&cfg, sizeof cfg) &&
                          kv_fuzz_all_zero(&from_file, sizeof from_file),
                      "a failed parse left *out set");
        return 0;
    }
    check_same_config(&cfg, &from_file, "parse vs load");
    check_invariants(&cfg);

    char *json = kv_config_to_json(&cfg);
    KV_FUZZ_CHECK(json != NULL, "kv_config_to_json returned NULL");
    KvConfig again;
    st = kv_config_parse(json, strlen(json), "round trip", &again, &err);
    KV_FUZZ_CHECK(st == KV_OK, "kv_config_to_json output does not parse: %s\n%s", err.msg, json);
    check_same_config(&cfg, &again, "round trip");
    free(json);

    check_model_loads(text, size, &cfg);
    return 0;
}
