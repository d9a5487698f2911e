/* config.c: reading, validating and writing a Hugging Face config.json.
 *
 * The semantics are those of transformers' Gemma2Config, MistralConfig and
 * LlamaConfig: a missing (or null) optional field takes the class default, so
 * a config that transformers loads gives the same model here. What kvrepro
 * does not implement (RoPE scaling, biases, other activations) is rejected
 * with a message rather than silently computed differently. */
#include "config.h"
#include "file_open.h"
#include "json_describe.h"

#include <cjson/cJSON.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A config.json is a few kilobytes; anything this large is not one. The
 * bound also caps what parsing allocates (the text copy, cJSON's tree). */
#define KV_CONFIG_MAX_BYTES (16u * 1024u * 1024u)

/* transformers' default window (Gemma2Config, MistralConfig) when the key is
 * absent. */
#define KV_CONFIG_DEFAULT_WINDOW 4096

typedef struct {
    const cJSON *root;
    const char *label;
    KvError *err;
} ConfigCtx;


static KvStatus field_error(const ConfigCtx *c, const char *field, const char *expected,
                            const cJSON *found) {
    char what[128];
    kv_json_describe(found, what, sizeof what);
    return kv_error_set(c->err, KV_ERR_INPUT, "%s: field '%s': expected %s, found %s", c->label,
                        field, expected, what);
}

/* The field, or NULL when it is missing or JSON null (both mean "default"
 * to transformers' config classes). */
static const cJSON *field_get(const ConfigCtx *c, const char *name) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(c->root, name);
    return cJSON_IsNull(it) ? NULL : it;
}

static bool json_is_int_in(const cJSON *it, double lo, double hi) {
    if (!cJSON_IsNumber(it)) return false;
    double d = it->valuedouble;
    return isfinite(d) && d == floor(d) && d >= lo && d <= hi;
}

/* An integer field in [lo, hi] (the bound is part of the message); missing or
 * null takes def, and def < 0 means required. */
static KvStatus field_int(const ConfigCtx *c, const char *name, int64_t lo, int64_t hi,
                          int64_t def, int64_t *out) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(c->root, name);
    char expected[64];
    snprintf(expected, sizeof expected, "an integer in [%" PRId64 ", %" PRId64 "]", lo, hi);
    if (it == NULL || cJSON_IsNull(it)) {
        if (def < 0) return field_error(c, name, expected, it);
        *out = def;
        return KV_OK;
    }
    if (!json_is_int_in(it, (double)lo, (double)hi)) return field_error(c, name, expected, it);
    *out = (int64_t)it->valuedouble;
    return KV_OK;
}

/* A finite number field; positive (> 0) or non-negative (>= 0). */
static KvStatus field_double(const ConfigCtx *c, const char *name, double def, bool positive,
                             double *out) {
    const cJSON *it = field_get(c, name);
    if (it == NULL) {
        *out = def;
        return KV_OK;
    }
    if (!cJSON_IsNumber(it) || !isfinite(it->valuedouble) ||
        (positive ? !(it->valuedouble > 0.0) : !(it->valuedouble >= 0.0))) {
        return field_error(c, name, positive ? "a finite number > 0" : "a finite number >= 0",
                           it);
    }
    *out = it->valuedouble;
    return KV_OK;
}

static KvStatus field_bool(const ConfigCtx *c, const char *name, bool def, bool *out) {
    const cJSON *it = field_get(c, name);
    if (it == NULL) {
        *out = def;
        return KV_OK;
    }
    if (!cJSON_IsBool(it)) return field_error(c, name, "true or false", it);
    *out = cJSON_IsTrue(it);
    return KV_OK;
}

/* A feature kvrepro does not compute must be off (false or absent). */
static KvStatus field_must_be_false(const ConfigCtx *c, const char *name, const char *why) {
    const cJSON *it = field_get(c, name);
    if (it == NULL || cJSON_IsFalse(it)) return KV_OK;
    char expected[96];
    snprintf(expected, sizeof expected, "false (%s)", why);
    return field_error(c, name, expected, it);
}

/* Softcap: missing = the class default, null = off (0). */
static KvStatus field_softcap(const ConfigCtx *c, const char *name, double def, double *out) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(c->root, name);
    if (it == NULL) {
        *out = def;
        return KV_OK;
    }
    if (cJSON_IsNull(it)) {
        *out = 0.0;
        return KV_OK;
    }
    const KvStatus st = field_double(c, name, def, false, out);
    /* 0 means "no softcap" whatever its sign: -0 is stored as +0, so the
     * config has one form for it (kv_config_to_json writes either as null;
     * found by fuzz_config's round trip, regressions/config/) */
    if (st == KV_OK && *out == 0.0) *out = 0.0;
    return st;
}

/* The activation: hidden_activation (gemma2's and gemma3's field) wins over
 * hidden_act. */
static KvStatus check_activation(const ConfigCtx *c, KvFamily family) {
    const bool gemma = family == KV_FAMILY_GEMMA2 || family == KV_FAMILY_GEMMA3;
    const char *want = gemma ? "gelu_pytorch_tanh" : "silu";
    const char *name = "hidden_act";
    const cJSON *it = NULL;
    if (gemma) {
        it = field_get(c, "hidden_activation");
        if (it != NULL) name = "hidden_activation";
    }
    if (it == NULL) it = field_get(c, "hidden_act");
    if (it == NULL) return KV_OK;
    if (cJSON_IsString(it) && strcmp(it->valuestring, want) == 0) return KV_OK;
    char expected[96];
    snprintf(expected, sizeof expected, "\"%s\" (the only activation supported for %s)", want,
             kv_family_name(family));
    return field_error(c, name, expected, it);
}

static KvStatus parse_rope(const ConfigCtx *c, double *theta) {
    KvStatus st;
    const cJSON *scaling = field_get(c, "rope_scaling");
    if (scaling != NULL) {
        return field_error(c, "rope_scaling", "null (RoPE scaling is not supported)", scaling);
    }
    double top = 10000.0;
    st = field_double(c, "rope_theta", 10000.0, true, &top);
    if (st != KV_OK) return st;
    *theta = top;

    /* transformers v5 moves rope_theta into rope_parameters. */
    const cJSON *params = field_get(c, "rope_parameters");
    if (params == NULL) return KV_OK;
    if (!cJSON_IsObject(params)) {
        return field_error(c, "rope_parameters", "an object {rope_type, rope_theta}", params);
    }
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(params, "rope_type");
    if (type != NULL && !cJSON_IsNull(type) &&
        !(cJSON_IsString(type) && strcmp(type->valuestring, "default") == 0)) {
        return field_error(c, "rope_parameters.rope_type",
                           "\"default\" (RoPE scaling is not supported)", type);
    }
    const cJSON *pt = cJSON_GetObjectItemCaseSensitive(params, "rope_theta");
    if (pt == NULL || cJSON_IsNull(pt)) return KV_OK;
    if (!cJSON_IsNumber(pt) || !isfinite(pt->valuedouble) || !(pt->valuedouble > 0.0)) {
        return field_error(c, "rope_parameters.rope_theta", "a finite number > 0", pt);
    }
    if (field_get(c, "rope_theta") != NULL && pt->valuedouble != top) {
        char expected[96];
        snprintf(expected, sizeof expected, "the same value as 'rope_theta' (%.17g)", top);
        return field_error(c, "rope_parameters.rope_theta", expected, pt);
    }
    *theta = pt->valuedouble;
    return KV_OK;
}

/* sliding_window: missing = transformers' default (*missing set), null = no
 * window (0), else an integer in [1, KV_CONFIG_MAX_WINDOW]. */
static KvStatus parse_window(const ConfigCtx *c, int64_t *out, bool *missing) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(c->root, "sliding_window");
    *missing = it == NULL;
    if (it == NULL) {
        *out = KV_CONFIG_DEFAULT_WINDOW;
        return KV_OK;
    }
    if (cJSON_IsNull(it)) {
        *out = 0;
        return KV_OK;
    }
    if (!json_is_int_in(it, 1.0, (double)KV_CONFIG_MAX_WINDOW)) {
        char expected[64];
        snprintf(expected, sizeof expected, "an integer in [1, %d] or null",
                 KV_CONFIG_MAX_WINDOW);
        return field_error(c, "sliding_window", expected, it);
    }
    *out = (int64_t)it->valuedouble;
    return KV_OK;
}

/* mistral's list form of sliding_window (Mistral's interleaved-window
 * params, as vLLM reads them): entry i % len is layer i's window, an integer
 * in [1, KV_CONFIG_MAX_WINDOW], or null for a full-attention layer. Sets
 * layer_sliding, layer_window and sliding_window (the largest entry, 0 when
 * every entry is null). */
static KvStatus parse_window_list(const ConfigCtx *c, const cJSON *list, KvConfig *cfg) {
    const int n = cJSON_GetArraySize(list);
    if (n < 1 || n > cfg->num_layers) {
        char expected[96];
        snprintf(expected, sizeof expected, "an integer, null, or a list of 1 to %" PRId64
                 " windows (num_hidden_layers)", cfg->num_layers);
        return field_error(c, "sliding_window", expected, list);
    }
    int64_t wins[KV_MAX_LAYERS];
    for (int k = 0; k < n; k++) {
        const cJSON *it = cJSON_GetArrayItem(list, k);
        if (cJSON_IsNull(it)) {
            wins[k] = 0;
            continue;
        }
        if (!json_is_int_in(it, 1.0, (double)KV_CONFIG_MAX_WINDOW)) {
            char field[48], expected[64];
            snprintf(field, sizeof field, "sliding_window[%d]", k);
            snprintf(expected, sizeof expected, "an integer in [1, %d] or null (full attention)",
                     KV_CONFIG_MAX_WINDOW);
            return field_error(c, field, expected, it);
        }
        wins[k] = (int64_t)it->valuedouble;
    }
    cfg->sliding_window = 0;
    for (int64_t i = 0; i < cfg->num_layers; i++) {
        const int64_t w = wins[i % n];
        cfg->layer_sliding[i] = w > 0;
        cfg->layer_window[i] = w;
        if (w > cfg->sliding_window) cfg->sliding_window = w;
    }
    cfg->sliding_window_defaulted = false;
    return KV_OK;
}

/* layer_types into cfg->layer_sliding; *given false (and nothing set) when
 * the key is absent: the family's config class derives it then. */
static KvStatus parse_layer_types(const ConfigCtx *c, KvConfig *cfg, bool *given) {
    const cJSON *lt = field_get(c, "layer_types");
    *given = lt != NULL;
    if (lt == NULL) return KV_OK;
    if (!cJSON_IsArray(lt) || cJSON_GetArraySize(lt) != cfg->num_layers) {
        char expected[96];
        snprintf(expected, sizeof expected, "an array of %" PRId64 " strings (num_hidden_layers)",
                 cfg->num_layers);
        return field_error(c, "layer_types", expected, lt);
    }
    int64_t i = 0;
    for (const cJSON *it = lt->child; it != NULL; it = it->next, i++) {
        if (cJSON_IsString(it) && strcmp(it->valuestring, "sliding_attention") == 0) {
            cfg->layer_sliding[i] = 1;
        } else if (cJSON_IsString(it) && strcmp(it->valuestring, "full_attention") == 0) {
            cfg->layer_sliding[i] = 0;
        } else {
            char name[48];
            snprintf(name, sizeof name, "layer_types[%" PRId64 "]", i);
            return field_error(c, name, "\"sliding_attention\" or \"full_attention\"", it);
        }
    }
    return KV_OK;
}

/* Every weight count and byte count derived from the config must fit, so
 * later code can multiply sizes without checking. Within the KV_CONFIG_MAX_*
 * bounds the total is below 2^52 bytes, so this can only fail where size_t
 * is 32 bits; it stays as the statement of what later code relies on. */
static KvStatus check_sizes(const ConfigCtx *c, const KvConfig *cfg) {
    int64_t q_dim, kv_dim, embed, attn_q, attn_kv, mlp, layer, all, bytes;
    bool bad = __builtin_mul_overflow(cfg->num_heads, cfg->head_dim, &q_dim) ||
               __builtin_mul_overflow(cfg->num_kv_heads, cfg->head_dim, &kv_dim) ||
               __builtin_mul_overflow(cfg->vocab_size, cfg->hidden_size, &embed) ||
               __builtin_mul_overflow(q_dim, cfg->hidden_size, &attn_q) ||
               __builtin_mul_overflow(kv_dim, cfg->hidden_size, &attn_kv) ||
               __builtin_mul_overflow(cfg->intermediate_size, cfg->hidden_size, &mlp) ||
               /* gpt_oss: every expert holds a whole MLP */
               __builtin_mul_overflow(mlp, cfg->num_experts > 0 ? cfg->num_experts : 1, &mlp);
    /* q + k + v + o, gate + up + down, four norms. */
    if (!bad) {
        bad = __builtin_mul_overflow(attn_q, (int64_t)2, &layer) ||
              __builtin_add_overflow(layer, attn_kv, &layer) ||
              __builtin_add_overflow(layer, attn_kv, &layer) ||
              __builtin_add_overflow(layer, mlp, &layer) ||
              __builtin_add_overflow(layer, mlp, &layer) ||
              __builtin_add_overflow(layer, mlp, &layer) ||
              __builtin_add_overflow(layer, 4 * cfg->hidden_size, &layer) ||
              __builtin_mul_overflow(layer, cfg->num_layers, &all) ||
              __builtin_add_overflow(all, embed, &all) ||
              __builtin_add_overflow(all, embed, &all) ||
              __builtin_add_overflow(all, cfg->hidden_size, &all) ||
              __builtin_mul_overflow(all, (int64_t)sizeof(float), &bytes) ||
              (uint64_t)bytes > (uint64_t)SIZE_MAX;
    }
    if (bad) {
        return kv_error_set(c->err, KV_ERR_INPUT,
                            "%s: sizes: expected a model whose weight bytes fit in 64 bits and "
                            "size_t, found an overflow (vocab %" PRId64 ", hidden %" PRId64
                            ", intermediate %" PRId64 ", layers %" PRId64 ", heads %" PRId64
                            " x head_dim %" PRId64 ")",
                            c->label, cfg->vocab_size, cfg->hidden_size, cfg->intermediate_size,
                            cfg->num_layers, cfg->num_heads, cfg->head_dim);
    }
    return KV_OK;
}

/* One gemma3 rope_parameters entry (rope_parameters.KEY): rope_type
 * "default" (or absent), rope_theta a finite number > 0 (absent: *theta
 * kept). */
static KvStatus parse_rope_entry(const ConfigCtx *c, const cJSON *params, const char *key,
                                 double *theta) {
    char name[96];
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(params, key);
    if (e == NULL || cJSON_IsNull(e)) return KV_OK;
    snprintf(name, sizeof name, "rope_parameters.%s", key);
    if (!cJSON_IsObject(e)) return field_error(c, name, "an object {rope_type, rope_theta}", e);
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(e, "rope_type");
    if (type != NULL && !cJSON_IsNull(type) &&
        !(cJSON_IsString(type) && strcmp(type->valuestring, "default") == 0)) {
        snprintf(name, sizeof name, "rope_parameters.%s.rope_type", key);
        return field_error(c, name, "\"default\" (RoPE scaling is not supported)", type);
    }
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(e, "rope_theta");
    if (t == NULL || cJSON_IsNull(t)) return KV_OK;
    if (!cJSON_IsNumber(t) || !isfinite(t->valuedouble) || !(t->valuedouble > 0.0)) {
        snprintf(name, sizeof name, "rope_parameters.%s.rope_theta", key);
        return field_error(c, name, "a finite number > 0", t);
    }
    *theta = t->valuedouble;
    return KV_OK;
}

/* Gemma3TextConfig's RoPE: one base per layer type. The legacy fields
 * rope_theta (full_attention layers, default 1e6) and rope_local_base_freq
 * (sliding_attention layers, default 1e4), or transformers 5's nested
 * rope_parameters {"sliding_attention": {...}, "full_attention": {...}},
 * which wins where it gives a value. rope_scaling (e.g. Gemma-3 4B's linear
 * factor 8 on the full layers) is refused, not ignored. */
static KvStatus parse_gemma3_rope(const ConfigCtx *c, KvConfig *cfg) {
    const cJSON *scaling = field_get(c, "rope_scaling");
    if (scaling != NULL) {
        return field_error(c, "rope_scaling", "null (RoPE scaling is not supported)", scaling);
    }
    KvStatus st = field_double(c, "rope_theta", 1000000.0, true, &cfg->rope_theta);
    if (st == KV_OK) {
        st = field_double(c, "rope_local_base_freq", 10000.0, true, &cfg->rope_theta_local);
    }
    if (st != KV_OK) return st;
    const cJSON *params = field_get(c, "rope_parameters");
    if (params == NULL) return KV_OK;
    if (!cJSON_IsObject(params)) {
        return field_error(c, "rope_parameters",
                           "an object {sliding_attention: {...}, full_attention: {...}}", params);
    }
    for (const cJSON *it = params->child; it != NULL; it = it->next) {
        if (strcmp(it->string, "sliding_attention") != 0 &&
            strcmp(it->string, "full_attention") != 0) {
            char name[96];
            snprintf(name, sizeof name, "rope_parameters.%.60s", it->string);
            return field_error(c, name, "only the keys sliding_attention and full_attention", it);
        }
    }
    st = parse_rope_entry(c, params, "full_attention", &cfg->rope_theta);
    if (st != KV_OK) return st;
    return parse_rope_entry(c, params, "sliding_attention", &cfg->rope_theta_local);
}

/* A number field of a rope object (rope_parameters or rope_scaling): *out
 * kept when absent or null; otherwise finite and > 0. */
static KvStatus rope_number(const ConfigCtx *c, const cJSON *o, const char *obj, const char *key,
                            double *out) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, key);
    if (it == NULL || cJSON_IsNull(it)) return KV_OK;
    if (!cJSON_IsNumber(it) || !isfinite(it->valuedouble) || !(it->valuedouble > 0.0)) {
        char name[96];
        snprintf(name, sizeof name, "%s%s%s", obj, obj[0] != '\0' ? "." : "", key);
        return field_error(c, name, "a finite number > 0", it);
    }
    *out = it->valuedouble;
    return KV_OK;
}

/* GptOssConfig's RoPE: rope_parameters (transformers 5) or the legacy
 * rope_theta + rope_scaling, rope_type "yarn" (GptOssConfig's default when
 * neither is given: factor 32, beta_fast 32, beta_slow 1, truncate false,
 * original_max_position_embeddings 4096, theta 150000) or "default". YaRN's
 * attention factor is attention_factor when given, else 0.1 ln(factor) + 1
 * (factor > 1); mscale / mscale_all_dim are refused (no gpt_oss uses them).
 * A given rope object without "truncate" truncates: transformers reads it
 * with a default of true. */
static KvStatus parse_gpt_oss_rope(const ConfigCtx *c, KvConfig *cfg) {
    KvStatus st = field_double(c, "rope_theta", 150000.0, true, &cfg->rope_theta);
    if (st != KV_OK) return st;
    const char *obj = "rope_scaling";
    const cJSON *p = field_get(c, obj);
    if (p == NULL) {
        obj = "rope_parameters";
        p = field_get(c, obj);
    }
    cfg->rope_yarn = true;
    cfg->rope_factor = 32.0;
    cfg->rope_beta_fast = 32.0;
    cfg->rope_beta_slow = 1.0;
    cfg->rope_truncate = false;
    cfg->rope_orig_max_pos = 4096.0;
    cfg->rope_attention_factor = 0.0;
    if (p != NULL) {
        if (!cJSON_IsObject(p)) return field_error(c, obj, "an object {rope_type, ...}", p);
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(p, "rope_type");
        if (type == NULL || cJSON_IsNull(type)) type = cJSON_GetObjectItemCaseSensitive(p, "type");
        char name[96];
        snprintf(name, sizeof name, "%s.rope_type", obj);
        if (!cJSON_IsString(type) || (strcmp(type->valuestring, "yarn") != 0 &&
                                      strcmp(type->valuestring, "default") != 0)) {
            return field_error(c, name, "\"yarn\" or \"default\"", type);
        }
        cfg->rope_yarn = strcmp(type->valuestring, "yarn") == 0;
        static const char *const refused[] = {"mscale", "mscale_all_dim"};
        for (int k = 0; k < 2; k++) {
            const cJSON *it = cJSON_GetObjectItemCaseSensitive(p, refused[k]);
            if (it != NULL && !cJSON_IsNull(it)) {
                snprintf(name, sizeof name, "%s.%s", obj, refused[k]);
                return field_error(c, name, "absent (not supported)", it);
            }
        }
        const cJSON *tr = cJSON_GetObjectItemCaseSensitive(p, "truncate");
        cfg->rope_truncate = true;
        if (tr != NULL && !cJSON_IsNull(tr)) {
            if (!cJSON_IsBool(tr)) {
                snprintf(name, sizeof name, "%s.truncate", obj);
                return field_error(c, name, "true or false", tr);
            }
            cfg->rope_truncate = cJSON_IsTrue(tr);
        }
        /* transformers requires factor in a given yarn object, and fills a
         * missing original_max_position_embeddings from
         * max_position_embeddings (0 here: resolved in parse_root, once
         * that is read) */
        const cJSON *factor = cJSON_GetObjectItemCaseSensitive(p, "factor");
        if (cfg->rope_yarn && factor == NULL) {
            snprintf(name, sizeof name, "%s.factor", obj);
            return field_error(c, name, "a finite number > 0 (required with rope_type \"yarn\")",
                               factor);
        }
        cfg->rope_orig_max_pos = 0.0;
        if ((st = rope_number(c, p, obj, "rope_theta", &cfg->rope_theta)) != KV_OK ||
            (st = rope_number(c, p, obj, "factor", &cfg->rope_factor)) != KV_OK ||
            (st = rope_number(c, p, obj, "beta_fast", &cfg->rope_beta_fast)) != KV_OK ||
            (st = rope_number(c, p, obj, "beta_slow", &cfg->rope_beta_slow)) != KV_OK ||
            (st = rope_number(c, p, obj, "original_max_position_embeddings",
                              &cfg->rope_orig_max_pos)) != KV_OK ||
            (st = rope_number(c, p, obj, "attention_factor", &cfg->rope_attention_factor)) !=
                KV_OK) {
            return st;
        }
    }
    if (!cfg->rope_yarn) {
        /* YaRN's parameters mean nothing here: one value for them, so that
         * a config written back (which leaves them out) reads the same */
        cfg->rope_attention_factor = 1.0;
        cfg->rope_factor = cfg->rope_beta_fast = cfg->rope_beta_slow = 0.0;
        cfg->rope_orig_max_pos = 0.0;
        cfg->rope_truncate = false;
    } else if (cfg->rope_attention_factor == 0.0) {
        cfg->rope_attention_factor =
            cfg->rope_factor <= 1.0 ? 1.0 : 0.1 * log(cfg->rope_factor) + 1.0;
    }
    return KV_OK;
}

/* GptOssConfig's MoE: num_local_experts (alias num_experts, default 128),
 * num_experts_per_tok (default 4, at most the experts), swiglu_limit (7),
 * swiglu_alpha (1.702). */
static KvStatus parse_gpt_oss_experts(const ConfigCtx *c, KvConfig *cfg) {
    const char *ne = field_get(c, "num_local_experts") != NULL ? "num_local_experts"
                                                                : "num_experts";
    KvStatus st = field_int(c, ne, 1, KV_CONFIG_MAX_EXPERTS, 128, &cfg->num_experts);
    if (st != KV_OK) return st;
    st = field_int(c, "num_experts_per_tok", 1, cfg->num_experts,
                   cfg->num_experts < 4 ? cfg->num_experts : 4, &cfg->experts_per_tok);
    if (st != KV_OK) return st;
    st = field_double(c, "swiglu_limit", 7.0, true, &cfg->swiglu_limit);
    if (st != KV_OK) return st;
    return field_double(c, "swiglu_alpha", 1.702, true, &cfg->swiglu_alpha);
}

/* Which qwen2 layers slide (Qwen2Config.__init__): sliding_window is kept
 * only when use_sliding_window (default false); without layer_types, the
 * layers at index >= max_window_layers (default 28) slide when there is a
 * window. An explicit layer_types wins, but a sliding_attention layer with
 * no window is refused (transformers builds that model and then fails in
 * its first forward). No sliding layer: sliding_window 0. */
static KvStatus parse_qwen2_layers(const ConfigCtx *c, KvConfig *cfg) {
    bool use = false, missing = false, given = false;
    int64_t max_window_layers = 28;
    KvStatus st = field_bool(c, "use_sliding_window", false, &use);
    if (st != KV_OK) return st;
    st = parse_window(c, &cfg->sliding_window, &missing);
    if (st != KV_OK) return st;
    st = field_int(c, "max_window_layers", 0, KV_CONFIG_MAX_POSITIONS, 28, &max_window_layers);
    if (st != KV_OK) return st;
    if (!use) cfg->sliding_window = 0;
    st = parse_layer_types(c, cfg, &given);
    if (st != KV_OK) return st;
    bool any = false;
    for (int64_t i = 0; i < cfg->num_layers; i++) {
        if (!given) cfg->layer_sliding[i] = cfg->sliding_window > 0 && i >= max_window_layers;
        if (cfg->layer_sliding[i] && cfg->sliding_window == 0) {
            char expected[160];
            snprintf(expected, sizeof expected,
                     "true with an integer sliding_window (layer_types[%" PRId64
                     "] is sliding_attention)", i);
            return field_error(c, "use_sliding_window", expected,
                               cJSON_GetObjectItemCaseSensitive(c->root, "use_sliding_window"));
        }
        any = any || cfg->layer_sliding[i];
    }
    if (!any) cfg->sliding_window = 0;
    cfg->sliding_window_defaulted = any && missing;
    return KV_OK;
}

/* num_key_value_heads when config.json leaves it out: the config class's
 * default (Gemma2Config, Gemma3TextConfig 4; GptOssConfig, MistralConfig 8;
 * Qwen2Config 32), num_attention_heads only for LlamaConfig. */
static int64_t default_kv_heads(KvFamily family, bool llama, int64_t num_heads) {
    switch (family) {
    case KV_FAMILY_GEMMA2:
    case KV_FAMILY_GEMMA3:
        return 4;
    case KV_FAMILY_GPT_OSS:
        return 8;
    case KV_FAMILY_MISTRAL:
        return llama ? num_heads : 8;
    case KV_FAMILY_QWEN2:
        return 32;
    }
    return num_heads;
}

static KvStatus parse_root(const ConfigCtx *c, KvConfig *cfg) {
    KvStatus st;
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(c->root, "model_type");
    if (!cJSON_IsString(mt)) {
        return field_error(c, "model_type",
                           "a string (\"gemma2\", \"gemma3_text\", \"gpt_oss\", \"mistral\", "
                           "\"llama\" or \"qwen2\")", mt);
    }
    bool llama = false;
    if (strcmp(mt->valuestring, "gemma2") == 0) {
        cfg->family = KV_FAMILY_GEMMA2;
    } else if (strcmp(mt->valuestring, "mistral") == 0) {
        cfg->family = KV_FAMILY_MISTRAL;
    } else if (strcmp(mt->valuestring, "llama") == 0) {
        cfg->family = KV_FAMILY_MISTRAL;
        llama = true;
    } else if (strcmp(mt->valuestring, "qwen2") == 0) {
        cfg->family = KV_FAMILY_QWEN2;
        cfg->attn_qkv_bias = true; /* Qwen2Attention: q/k/v with bias, o_proj without */
    } else if (strcmp(mt->valuestring, "gemma3_text") == 0) {
        cfg->family = KV_FAMILY_GEMMA3;
        cfg->qk_norm = true; /* Gemma3Attention: q_norm, k_norm before RoPE */
    } else if (strcmp(mt->valuestring, "gpt_oss") == 0) {
        cfg->family = KV_FAMILY_GPT_OSS;
        cfg->attn_sinks = true;
    } else {
        return field_error(c, "model_type",
                           "\"gemma2\", \"gemma3_text\", \"gpt_oss\", \"mistral\", \"llama\" or "
                           "\"qwen2\"", mt);
    }
    snprintf(cfg->model_type, sizeof cfg->model_type, "%s", mt->valuestring);
    bool gemma = kv_config_gemma_style(cfg);
    const bool gemma3 = cfg->family == KV_FAMILY_GEMMA3;

    const bool gpt_oss = cfg->family == KV_FAMILY_GPT_OSS;
    cfg->rope_attention_factor = 1.0;
    st = gemma3    ? parse_gemma3_rope(c, cfg)
         : gpt_oss ? parse_gpt_oss_rope(c, cfg)
                   : parse_rope(c, &cfg->rope_theta);
    if (st != KV_OK) return st;
    if (gpt_oss) {
        /* GptOssConfig.attention_bias (default true): q, k, v and o */
        bool bias = true;
        st = field_bool(c, "attention_bias", true, &bias);
        if (st == KV_OK) st = parse_gpt_oss_experts(c, cfg);
        cfg->attn_qkv_bias = cfg->attn_o_bias = bias;
    } else {
        st = field_must_be_false(c, "attention_bias", "attention biases are not supported");
    }
    if (st != KV_OK) return st;
    st = field_must_be_false(c, "mlp_bias", "MLP biases are not supported");
    if (st != KV_OK) return st;
    st = check_activation(c, cfg->family);
    if (st != KV_OK) return st;

    if ((st = field_int(c, "vocab_size", KV_CONFIG_MIN_VOCAB, KV_CONFIG_MAX_VOCAB, -1,
                        &cfg->vocab_size)) != KV_OK ||
        (st = field_int(c, "hidden_size", 1, KV_CONFIG_MAX_HIDDEN, -1, &cfg->hidden_size)) !=
            KV_OK ||
        (st = field_int(c, "intermediate_size", 1, KV_CONFIG_MAX_INTERMEDIATE, -1,
                        &cfg->intermediate_size)) != KV_OK ||
        (st = field_int(c, "num_hidden_layers", 1, KV_MAX_LAYERS, -1, &cfg->num_layers)) !=
            KV_OK ||
        (st = field_int(c, "num_attention_heads", 1, KV_CONFIG_MAX_HEADS, -1, &cfg->num_heads)) !=
            KV_OK ||
        (st = field_int(c, "num_key_value_heads", 1, KV_CONFIG_MAX_HEADS,
                        default_kv_heads(cfg->family, llama, cfg->num_heads),
                        &cfg->num_kv_heads)) != KV_OK) {
        return st;
    }
    if (cfg->num_heads % cfg->num_kv_heads != 0) {
        char expected[96];
        snprintf(expected, sizeof expected, "a divisor of num_attention_heads (%" PRId64 ")",
                 cfg->num_heads);
        if (field_get(c, "num_key_value_heads") == NULL) {
            /* the class default does not fit these heads: say which one
             * applied (transformers builds the model and fails later) */
            return kv_error_set(c->err, KV_ERR_INPUT,
                                "%s: field 'num_key_value_heads': expected %s, found nothing "
                                "(missing: the %s default is %" PRId64 ")",
                                c->label, expected, cfg->model_type, cfg->num_kv_heads);
        }
        return field_error(c, "num_key_value_heads", expected,
                           cJSON_GetObjectItemCaseSensitive(c->root, "num_key_value_heads"));
    }

    const cJSON *hd = field_get(c, "head_dim");
    if (hd == NULL && !gemma && !gpt_oss) {
        /* MistralConfig/LlamaConfig: hidden_size // num_attention_heads; an
         * inexact split would leave part of hidden_size unused, so refuse. */
        if (cfg->hidden_size % cfg->num_heads != 0) {
            return kv_error_set(c->err, KV_ERR_INPUT,
                                "%s: field 'head_dim': expected it given, or hidden_size (%" PRId64
                                ") divisible by num_attention_heads (%" PRId64 "), found neither",
                                c->label, cfg->hidden_size, cfg->num_heads);
        }
        cfg->head_dim = cfg->hidden_size / cfg->num_heads;
        if (cfg->head_dim > KV_CONFIG_MAX_HEAD_DIM) {
            return kv_error_set(c->err, KV_ERR_INPUT,
                                "%s: field 'head_dim': expected at most %d (given, or hidden_size "
                                "/ num_attention_heads), found %" PRId64 " = %" PRId64
                                " / %" PRId64,
                                c->label, KV_CONFIG_MAX_HEAD_DIM, cfg->head_dim,
                                cfg->hidden_size, cfg->num_heads);
        }
    } else {
        st = field_int(c, "head_dim", 1, KV_CONFIG_MAX_HEAD_DIM, gpt_oss ? 64 : 256,
                       &cfg->head_dim);
        if (st != KV_OK) return st;
    }
    if (cfg->head_dim % 2 != 0) {
        /* RoPE rotates pairs (i, i + head_dim/2). */
        char found[48];
        snprintf(found, sizeof found, "%" PRId64, cfg->head_dim);
        return kv_error_set(c->err, KV_ERR_INPUT,
                            "%s: field 'head_dim': expected an even integer (RoPE), found %s",
                            c->label, found);
    }

    const bool qwen2 = cfg->family == KV_FAMILY_QWEN2;
    int64_t def_pos = gemma3 ? 131072 : gemma ? 8192 : (llama ? 2048 : (qwen2 ? 32768 : 131072));
    st = field_int(c, "max_position_embeddings", 1, KV_CONFIG_MAX_POSITIONS, def_pos,
                   &cfg->max_position_embeddings);
    if (st != KV_OK) return st;
    if (gpt_oss && cfg->rope_yarn) {
        /* PreTrainedConfig.standardize_rope_params: a top-level
         * original_max_position_embeddings wins over the rope object's (and
         * GptOssConfig's default 4096); a given object without one takes
         * max_position_embeddings */
        st = rope_number(c, c->root, "", "original_max_position_embeddings",
                         &cfg->rope_orig_max_pos);
        if (st != KV_OK) return st;
        if (cfg->rope_orig_max_pos == 0.0) {
            cfg->rope_orig_max_pos = (double)cfg->max_position_embeddings;
        }
    }
    /* GptOssConfig's default is 1e-5, every other family's 1e-6 */
    st = field_double(c, "rms_norm_eps", gpt_oss ? 1e-5 : 1e-6, true, &cfg->rms_norm_eps);
    if (st != KV_OK) return st;
    st = field_bool(c, "tie_word_embeddings", gemma, &cfg->tie_word_embeddings);
    if (st != KV_OK) return st;

    if (gemma) {
        st = field_double(c, "query_pre_attn_scalar", 256.0, true, &cfg->query_pre_attn_scalar);
        if (st != KV_OK) return st;
        if (gemma3) {
            /* Gemma3Attention stores attn_logit_softcapping but never passes
             * it to the attention (transformers 5.23, modeling_gemma3.py):
             * a value here would be ignored there, so it is refused rather
             * than guessed at. */
            st = field_must_be_false(c, "attn_logit_softcapping",
                                     "transformers' Gemma3 attention does not apply it");
            if (st != KV_OK) return st;
            st = field_must_be_false(c, "use_bidirectional_attention",
                                     "bidirectional attention is not a causal decoder");
            if (st != KV_OK) return st;
        } else {
            st = field_softcap(c, "attn_logit_softcapping", 50.0, &cfg->attn_logit_softcapping);
            if (st != KV_OK) return st;
        }
        st = field_softcap(c, "final_logit_softcapping", gemma3 ? 0.0 : 30.0,
                           &cfg->final_logit_softcapping);
        if (st != KV_OK) return st;
        bool missing = false;
        st = parse_window(c, &cfg->sliding_window, &missing);
        if (st != KV_OK) return st;
        bool given = false;
        st = parse_layer_types(c, cfg, &given);
        if (st != KV_OK) return st;
        int64_t pattern = 6;
        if (gemma3) {
            st = field_int(c, "sliding_window_pattern", 1, KV_MAX_LAYERS, 6, &pattern);
            if (st != KV_OK) return st;
        }
        for (int64_t i = 0; i < cfg->num_layers && !given; i++) {
            /* Gemma2Config: sliding on even layers, full on odd; Gemma3TextConfig:
             * every sliding_window_pattern-th layer full, the rest sliding */
            cfg->layer_sliding[i] = gemma3 ? (i + 1) % pattern != 0 : i % 2 == 0;
        }
        for (int64_t i = 0; i < cfg->num_layers; i++) {
            if (cfg->layer_sliding[i]) cfg->sliding_window_defaulted = missing;
            if (cfg->layer_sliding[i] && cfg->sliding_window == 0) {
                char expected[96];
                snprintf(expected, sizeof expected,
                         "an integer >= 1 (layer %" PRId64 " is sliding_attention)", i);
                return field_error(c, "sliding_window", expected,
                                   cJSON_GetObjectItemCaseSensitive(c->root, "sliding_window"));
            }
        }
    } else if (cfg->family == KV_FAMILY_QWEN2) {
        st = parse_qwen2_layers(c, cfg);
        if (st != KV_OK) return st;
    } else if (gpt_oss) {
        /* GptOssConfig: window 128, even layers sliding, odd full */
        bool missing = false, given = false;
        st = parse_window(c, &cfg->sliding_window, &missing);
        if (st == KV_OK && missing) cfg->sliding_window = 128;
        if (st == KV_OK) st = parse_layer_types(c, cfg, &given);
        if (st != KV_OK) return st;
        for (int64_t i = 0; i < cfg->num_layers; i++) {
            if (!given) cfg->layer_sliding[i] = i % 2 == 0;
            if (cfg->layer_sliding[i] && cfg->sliding_window == 0) {
                return field_error(c, "sliding_window", "an integer >= 1 (a layer slides)",
                                   cJSON_GetObjectItemCaseSensitive(c->root, "sliding_window"));
            }
            if (cfg->layer_sliding[i]) cfg->sliding_window_defaulted = missing;
        }
    } else {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(c->root, "sliding_window");
        if (llama) {
            cfg->sliding_window = 0; /* LlamaConfig has no window */
        } else if (cJSON_IsArray(list)) {
            st = parse_window_list(c, list, cfg);
            return st != KV_OK ? st : check_sizes(c, cfg);
        } else {
            bool missing = false;
            st = parse_window(c, &cfg->sliding_window, &missing);
            if (st != KV_OK) return st;
            cfg->sliding_window_defaulted = missing; /* every layer slides */
        }
        for (int64_t i = 0; i < cfg->num_layers; i++) {
            cfg->layer_sliding[i] = cfg->sliding_window > 0;
        }
    }
    return check_sizes(c, cfg);
}

KvStatus kv_config_parse(const char *text, size_t len, const char *label, KvConfig *out,
                         KvError *err) {
    const char *lab = label != NULL ? label : "config.json";
    KvStatus st = KV_OK;
    cJSON *root = NULL;
    char *copy = NULL;
    KvConfig cfg;
    memset(&cfg, 0, sizeof cfg);
    memset(out, 0, sizeof *out);

    if (text == NULL) len = 0;
    if (len > KV_CONFIG_MAX_BYTES) {
        st = kv_error_set(err, KV_ERR_INPUT, "%s: expected at most %u bytes, found %zu", lab,
                          KV_CONFIG_MAX_BYTES, len);
        goto cleanup;
    }
    const void *nul = len > 0 ? memchr(text, 0, len) : NULL;
    if (nul != NULL) {
        st = kv_error_set(err, KV_ERR_INPUT, "%s: expected JSON text, found a NUL byte at %td",
                          lab, (const char *)nul - text);
        goto cleanup;
    }
    /* What cJSON lets through and Python's json would not read the same:
     * non-UTF-8 bytes, raw control characters, \u0000 cutting a key short. */
    st = kv_file_check_json_text(text, len, lab, err);
    if (st != KV_OK) goto cleanup;
    /* A terminated copy: the parser then cannot read past the caller's
     * bytes whatever they hold (they need not be terminated). */
    copy = malloc(len + 1);
    if (copy == NULL) {
        st = kv_error_set(err, KV_ERR_INTERNAL, "%s: out of memory", lab);
        goto cleanup;
    }
    if (len > 0) memcpy(copy, text, len);
    copy[len] = '\0';
    const char *end = NULL;
    root = cJSON_ParseWithOpts(copy, &end, 0);
    if (root == NULL) {
        size_t at = end != NULL && end >= copy ? (size_t)(end - copy) : 0;
        st = kv_error_set(err, KV_ERR_INPUT,
                          "%s: expected valid JSON, found a syntax error near byte %zu of %zu",
                          lab, at, len);
        goto cleanup;
    }
    for (const char *p = end; *p; p++) {
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
            st = kv_error_set(err, KV_ERR_INPUT,
                              "%s: expected only whitespace after the JSON object, found "
                              "trailing data at byte %td",
                              lab, p - copy);
            goto cleanup;
        }
    }
    if (!cJSON_IsObject(root)) {
        char found[128];
        kv_json_describe(root, found, sizeof found);
        st = kv_error_set(err, KV_ERR_INPUT, "%s: expected a JSON object, found %s", lab, found);
        goto cleanup;
    }
    /* Python's json keeps the last of repeated keys and cJSON the first:
     * refuse them (at any depth) rather than read a different model than
     * transformers would. */
    st = kv_file_check_json_keys(root, lab, "field", err);
    if (st != KV_OK) goto cleanup;
    ConfigCtx c = {.root = root, .label = lab, .err = err};
    st = parse_root(&c, &cfg);
    if (st != KV_OK) goto cleanup;
    *out = cfg;

cleanup:
    cJSON_Delete(root);
    free(copy);
    return st;
}

KvStatus kv_config_load(const char *path, KvConfig *out, KvError *err) {
    KvStatus st = KV_OK;
    char *buf = NULL;
    size_t len = 0;

    memset(out, 0, sizeof *out);
    st = kv_file_read_small(path, KV_CONFIG_MAX_BYTES, &buf, &len, err);
    if (st != KV_OK) goto cleanup;
    st = kv_config_parse(buf, len, path, out, err);

cleanup:
    free(buf);
    return st;
}

/* The shortest decimal that strtod reads back to exactly d. cJSON's own
 * number printing only round-trips approximately. An integral value keeps
 * a ".0" (as Python's json writes floats): transformers 5 types fields such
 * as final_logit_softcapping as float and refuses a config that writes 30. */
static cJSON *json_exact_double(double d) {
    char buf[40];
    for (int prec = 15; prec <= 17; prec++) {
        snprintf(buf, sizeof buf, "%.*g", prec, d);
        if (strtod(buf, NULL) == d) break;
    }
    if (strpbrk(buf, ".eEn") == NULL) strcat(buf, ".0"); /* at most 25 chars before */
    return cJSON_CreateRaw(buf);
}

static bool add_int(cJSON *o, const char *name, int64_t v) {
    char buf[32];
    snprintf(buf, sizeof buf, "%" PRId64, v);
    return cJSON_AddRawToObject(o, name, buf) != NULL;
}

static bool add_double(cJSON *o, const char *name, double v) {
    cJSON *it = json_exact_double(v);
    if (it == NULL) return false;
    if (!cJSON_AddItemToObject(o, name, it)) {
        cJSON_Delete(it);
        return false;
    }
    return true;
}

/* A non-negative value that is 0 when the feature is off: written as null. */
static bool add_double_or_null(cJSON *o, const char *name, double v) {
    if (v == 0.0) return cJSON_AddNullToObject(o, name) != NULL;
    return add_double(o, name, v);
}

/* "layer_types": one "sliding_attention" / "full_attention" per layer. */
static bool add_layer_types(cJSON *o, const KvConfig *cfg) {
    cJSON *lt = cJSON_AddArrayToObject(o, "layer_types");
    bool ok = lt != NULL;
    for (int64_t i = 0; ok && i < cfg->num_layers && i < KV_MAX_LAYERS; i++) {
        cJSON *s = cJSON_CreateString(cfg->layer_sliding[i] ? "sliding_attention"
                                                             : "full_attention");
        ok = s != NULL && cJSON_AddItemToArray(lt, s);
        if (!ok) cJSON_Delete(s);
    }
    return ok;
}

/* Whether a mistral config needs sliding_window's list form: a layer with
 * its own window, or layers that do not all slide alike. */
static bool needs_window_list(const KvConfig *cfg) {
    for (int64_t i = 0; i < cfg->num_layers && i < KV_MAX_LAYERS; i++) {
        if (cfg->layer_window[i] > 0 || cfg->layer_sliding[i] != cfg->layer_sliding[0]) return true;
    }
    return false;
}

/* sliding_window as one entry per layer: its window, or null (full). */
static bool add_window_list(cJSON *o, const KvConfig *cfg) {
    cJSON *l = cJSON_AddArrayToObject(o, "sliding_window");
    bool ok = l != NULL;
    for (int64_t i = 0; ok && i < cfg->num_layers && i < KV_MAX_LAYERS; i++) {
        const int64_t w = kv_config_layer_window(cfg, i);
        cJSON *e = w > 0 ? cJSON_CreateNumber((double)w) : cJSON_CreateNull();
        ok = e != NULL && cJSON_AddItemToArray(l, e);
        if (!ok) cJSON_Delete(e);
    }
    return ok;
}

char *kv_config_to_json(const KvConfig *cfg) {
    char *text = NULL;
    cJSON *o = cJSON_CreateObject();
    if (o == NULL) return NULL;
    bool gemma = kv_config_gemma_style(cfg);
    const bool qwen2 = cfg->family == KV_FAMILY_QWEN2;
    const bool gemma3 = cfg->family == KV_FAMILY_GEMMA3;
    const bool gpt_oss = cfg->family == KV_FAMILY_GPT_OSS;
    /* model_type as written, unless it does not fit the family (a config
     * built in code), or llama was given a window llama cannot express. */
    const char *mt = gemma3    ? "gemma3_text"
                     : gemma   ? "gemma2"
                     : gpt_oss ? "gpt_oss"
                               : (qwen2 ? "qwen2" : "mistral");
    if (!gemma && !qwen2 && !gpt_oss && strcmp(cfg->model_type, "llama") == 0 && cfg->sliding_window == 0) {
        mt = "llama";
    }
    const char *arch = gemma3    ? "Gemma3ForCausalLM"
                       : gpt_oss ? "GptOssForCausalLM"
                       : gemma ? "Gemma2ForCausalLM"
                       : qwen2 ? "Qwen2ForCausalLM"
                               : (strcmp(mt, "llama") == 0 ? "LlamaForCausalLM"
                                                           : "MistralForCausalLM");
    cJSON *archs = cJSON_AddArrayToObject(o, "architectures");
    cJSON *arch_s = cJSON_CreateString(arch);
    bool ok = archs != NULL && arch_s != NULL && cJSON_AddItemToArray(archs, arch_s);
    if (!ok) cJSON_Delete(arch_s);
    ok = ok && cJSON_AddStringToObject(o, "model_type", mt) != NULL;
    ok = ok && add_int(o, "vocab_size", cfg->vocab_size);
    ok = ok && add_int(o, "hidden_size", cfg->hidden_size);
    ok = ok && add_int(o, "intermediate_size", cfg->intermediate_size);
    ok = ok && add_int(o, "num_hidden_layers", cfg->num_layers);
    ok = ok && add_int(o, "num_attention_heads", cfg->num_heads);
    ok = ok && add_int(o, "num_key_value_heads", cfg->num_kv_heads);
    ok = ok && add_int(o, "head_dim", cfg->head_dim);
    ok = ok && add_int(o, "max_position_embeddings", cfg->max_position_embeddings);
    ok = ok && add_double(o, "rms_norm_eps", cfg->rms_norm_eps);
    ok = ok && add_double(o, "rope_theta", cfg->rope_theta);
    ok = ok && cJSON_AddBoolToObject(o, "tie_word_embeddings", cfg->tie_word_embeddings) != NULL;
    if (gpt_oss) {
        ok = ok && cJSON_AddBoolToObject(o, "attention_bias", cfg->attn_o_bias) != NULL;
    } else if (!qwen2) {
        ok = ok && cJSON_AddFalseToObject(o, "attention_bias") != NULL;
    }
    ok = ok && cJSON_AddNullToObject(o, "rope_scaling") != NULL;
    if (gemma) {
        ok = ok && cJSON_AddStringToObject(o, "hidden_activation", "gelu_pytorch_tanh") != NULL;
        ok = ok && cJSON_AddStringToObject(o, "hidden_act", "gelu_pytorch_tanh") != NULL;
        /* Gemma2Config/Gemma3TextConfig type it int (transformers 5 refuses
         * 32.0); a fractional one (our parser takes it) stays a float */
        const double qp = cfg->query_pre_attn_scalar;
        ok = ok && (qp == floor(qp) && qp <= 9007199254740992.0
                        ? add_int(o, "query_pre_attn_scalar", (int64_t)qp)
                        : add_double(o, "query_pre_attn_scalar", qp));
        if (gemma3) {
            /* the legacy fields: rope_theta is the full layers' base */
            ok = ok && add_double(o, "rope_local_base_freq",
                                  cfg->rope_theta_local > 0.0 ? cfg->rope_theta_local
                                                              : cfg->rope_theta);
        }
        ok = ok && add_double_or_null(o, "attn_logit_softcapping", cfg->attn_logit_softcapping);
        ok = ok && add_double_or_null(o, "final_logit_softcapping", cfg->final_logit_softcapping);
        ok = ok && (cfg->sliding_window > 0 ? add_int(o, "sliding_window", cfg->sliding_window)
                                            : cJSON_AddNullToObject(o, "sliding_window") != NULL);
        ok = ok && add_layer_types(o, cfg);
    } else {
        ok = ok && cJSON_AddStringToObject(o, "hidden_act", "silu") != NULL;
        ok = ok && cJSON_AddFalseToObject(o, "mlp_bias") != NULL;
        if (strcmp(mt, "mistral") == 0 && needs_window_list(cfg)) {
            ok = ok && add_window_list(o, cfg);
        } else if ((strcmp(mt, "mistral") == 0 || qwen2) && !gpt_oss) {
            ok = ok &&
                 (cfg->sliding_window > 0 ? add_int(o, "sliding_window", cfg->sliding_window)
                                          : cJSON_AddNullToObject(o, "sliding_window") != NULL);
        }
        if (gpt_oss) {
            ok = ok && add_int(o, "num_local_experts", cfg->num_experts);
            ok = ok && add_int(o, "num_experts_per_tok", cfg->experts_per_tok);
            ok = ok && add_double(o, "swiglu_limit", cfg->swiglu_limit);
            ok = ok && add_double(o, "swiglu_alpha", cfg->swiglu_alpha);
            ok = ok && (cfg->sliding_window > 0
                            ? add_int(o, "sliding_window", cfg->sliding_window)
                            : cJSON_AddNullToObject(o, "sliding_window") != NULL);
            ok = ok && add_layer_types(o, cfg);
            cJSON *rp = ok ? cJSON_AddObjectToObject(o, "rope_parameters") : NULL;
            ok = rp != NULL &&
                 cJSON_AddStringToObject(rp, "rope_type", cfg->rope_yarn ? "yarn" : "default");
            ok = ok && add_double(rp, "rope_theta", cfg->rope_theta);
            if (cfg->rope_yarn) {
                ok = ok && add_double(rp, "factor", cfg->rope_factor);
                ok = ok && add_double(rp, "beta_fast", cfg->rope_beta_fast);
                ok = ok && add_double(rp, "beta_slow", cfg->rope_beta_slow);
                ok = ok && cJSON_AddBoolToObject(rp, "truncate", cfg->rope_truncate) != NULL;
                ok = ok && add_double(rp, "original_max_position_embeddings",
                                      cfg->rope_orig_max_pos);
                ok = ok && add_double(rp, "attention_factor", cfg->rope_attention_factor);
            }
        }
        if (qwen2) {
            /* the layers as they are: layer_types wins over max_window_layers */
            ok = ok &&
                 cJSON_AddBoolToObject(o, "use_sliding_window", cfg->sliding_window > 0) != NULL;
            ok = ok && add_int(o, "max_window_layers", cfg->num_layers);
            ok = ok && add_layer_types(o, cfg);
        }
    }
    ok = ok && cJSON_AddStringToObject(o, "torch_dtype", "float32") != NULL;
    if (ok) text = cJSON_Print(o);
    cJSON_Delete(o);
    return text;
}

float kv_config_attn_scale(const KvConfig *cfg) {
    /* transformers computes the scale as a Python float (double) and torch
     * rounds it to float32 when it multiplies the scores. */
    double base = kv_config_gemma_style(cfg) ? cfg->query_pre_attn_scalar
                                             : (double)cfg->head_dim;
    return (float)pow(base, -0.5);
}

bool kv_config_gemma_style(const KvConfig *cfg) {
    return cfg->family == KV_FAMILY_GEMMA2 || cfg->family == KV_FAMILY_GEMMA3;
}

double kv_config_layer_rope_theta(const KvConfig *cfg, int64_t layer) {
    const bool sliding = layer >= 0 && layer < cfg->num_layers && layer < KV_MAX_LAYERS &&
                         cfg->layer_sliding[layer];
    return sliding && cfg->rope_theta_local > 0.0 ? cfg->rope_theta_local : cfg->rope_theta;
}

int64_t kv_config_layer_window(const KvConfig *cfg, int64_t layer) {
    if (layer < 0 || layer >= cfg->num_layers || layer >= KV_MAX_LAYERS) return 0;
    if (!cfg->layer_sliding[layer]) return 0;
    return cfg->layer_window[layer] > 0 ? cfg->layer_window[layer] : cfg->sliding_window;
}

int64_t kv_config_max_window(const KvConfig *cfg) {
    int64_t w_max = 0;
    for (int64_t l = 0; l < cfg->num_layers; l++) {
        const int64_t w = kv_config_layer_window(cfg, l);
        w_max = w > w_max ? w : w_max;
    }
    return w_max;
}

void kv_config_window_text(const KvConfig *cfg, char *out, size_t n) {
    if (n == 0) return;
    if (!kv_config_mixed_windows(cfg)) {
        snprintf(out, n, "window %" PRId64, cfg->sliding_window);
        return;
    }
    int w = snprintf(out, n, "windows ");
    size_t used = w > 0 ? (size_t)w : 0;
    for (int64_t i = 0; i < cfg->num_layers && i < KV_MAX_LAYERS && used < n; i++) {
        w = snprintf(out + used, n - used, "%s%" PRId64, i > 0 ? "," : "",
                     kv_config_layer_window(cfg, i));
        if (w < 0) return;
        used += (size_t)w;
    }
}

bool kv_config_mixed_windows(const KvConfig *cfg) {
    for (int64_t i = 0; i < cfg->num_layers && i < KV_MAX_LAYERS; i++) {
        if (cfg->layer_sliding[i] && cfg->layer_window[i] > 0 &&
            cfg->layer_window[i] != cfg->sliding_window) {
            return true;
        }
    }
    return false;
}

const char *kv_family_name(KvFamily f) {
    switch (f) {
    case KV_FAMILY_GEMMA2:
        return "gemma2";
    case KV_FAMILY_MISTRAL:
        return "mistral";
    case KV_FAMILY_QWEN2:
        return "qwen2";
    case KV_FAMILY_GEMMA3:
        return "gemma3_text";
    case KV_FAMILY_GPT_OSS:
        return "gpt_oss";
    }
    return "unknown";
}
