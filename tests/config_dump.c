/* config_dump.c: loads one config.json with kv_config_load and prints the
 * configuration the reference computes with, every default resolved, as one
 * JSON object on stdout. python/tests/test_config_defaults.py compares it
 * with what transformers' config classes resolve from the same file.
 *
 * Usage: config_dump CONFIG_JSON. Exit 0 with the object, 2 with the
 * loader's message on stderr when the file is refused, 1 on misuse. */
#include <inttypes.h>
#include <stdio.h>

#include "config.h"
#include "kvmath.h"

/* %.17g reads back to the same double; JSON has no inf or nan, and a
 * loaded config holds none. */
static void put_double(const char *name, double v) { printf(",\n  \"%s\": %.17g", name, v); }

static void put_int(const char *name, int64_t v) { printf(",\n  \"%s\": %" PRId64, name, v); }

static void put_bool(const char *name, bool v) {
    printf(",\n  \"%s\": %s", name, v ? "true" : "false");
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: config_dump CONFIG_JSON\n");
        return 1;
    }
    KvConfig c;
    KvError err = {0};
    if (kv_config_load(argv[1], &c, &err) != KV_OK) {
        fprintf(stderr, "config_dump: %s\n", err.msg);
        return 2;
    }
    printf("{\n  \"family\": \"%s\"", kv_family_name(c.family));
    put_int("vocab_size", c.vocab_size);
    put_int("hidden_size", c.hidden_size);
    put_int("intermediate_size", c.intermediate_size);
    put_int("num_hidden_layers", c.num_layers);
    put_int("num_attention_heads", c.num_heads);
    put_int("num_key_value_heads", c.num_kv_heads);
    put_int("head_dim", c.head_dim);
    put_int("max_position_embeddings", c.max_position_embeddings);
    put_double("rms_norm_eps", c.rms_norm_eps);
    put_double("attn_scale", (double)kv_config_attn_scale(&c));
    put_double("query_pre_attn_scalar", c.query_pre_attn_scalar);
    put_double("attn_logit_softcapping", c.attn_logit_softcapping);
    put_double("final_logit_softcapping", c.final_logit_softcapping);
    put_bool("tie_word_embeddings", c.tie_word_embeddings);
    put_bool("attn_qkv_bias", c.attn_qkv_bias);
    put_bool("attn_o_bias", c.attn_o_bias);
    put_bool("qk_norm", c.qk_norm);
    put_bool("attn_sinks", c.attn_sinks);
    put_int("num_experts", c.num_experts);
    put_int("experts_per_tok", c.experts_per_tok);
    put_double("swiglu_limit", c.swiglu_limit);
    put_double("swiglu_alpha", c.swiglu_alpha);
    put_bool("rope_yarn", c.rope_yarn);
    put_double("rope_factor", c.rope_factor);
    put_double("rope_beta_fast", c.rope_beta_fast);
    put_double("rope_beta_slow", c.rope_beta_slow);
    put_double("rope_orig_max_pos", c.rope_orig_max_pos);
    put_bool("rope_truncate", c.rope_truncate);
    put_double("rope_attention_factor", c.rope_attention_factor);
    /* Per layer: the window (0 = full attention), the RoPE base, and the
     * first inverse frequencies the reference rotates with. */
    printf(",\n  \"layers\": [");
    for (int64_t l = 0; l < c.num_layers; l++) {
        float inv[KV_CONFIG_MAX_HEAD_DIM / 2];
        kv_rope_layer_inv_freq(&c, l, inv);
        printf("%s\n    {\"window\": %" PRId64 ", \"rope_theta\": %.17g, \"inv_freq\": [",
               l > 0 ? "," : "", kv_config_layer_window(&c, l), kv_config_layer_rope_theta(&c, l));
        for (int64_t i = 0; i < c.head_dim / 2; i++) {
            printf("%s%.9g", i > 0 ? ", " : "", (double)inv[i]);
        }
        printf("]}");
    }
    printf("\n  ]\n}\n");
    return 0;
}
