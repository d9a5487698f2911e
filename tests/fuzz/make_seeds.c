/* make_seeds.c: writes the generated part of the seed corpus
 * (tests/fuzz/corpus/<target>/gen-*). Run by tests/fuzz/regenerate-seeds.sh;
 * the output is committed, so this runs only when the seeds should change.
 *
 *   fuzz_make_seeds OUT_DIR   writes OUT_DIR/{config,safetensors,report,report_edit}/gen-*
 *
 * Valid inputs come from the project's own writers (kv_config_to_json,
 * kv_st_serialize, kv_report_write_h5) on the tiny model and tiny reports;
 * malformed ones are small hand-made edits of them, one defect each.
 *
 * No report seed has a variable-length string (h5py's str attributes):
 * libhdf5 1.10.8 hangs or crashes on damaged global heaps within seconds
 * of fuzzing from one (README.md, findings), which would leave little of a
 * CI run for our own code. The reproducers in found/report/ are such files. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz_common.h"
#include "fuzz_reports.h"
#include "report_h5.h"

static const char *g_out;

static void die(const char *what, const char *detail) {
    fprintf(stderr, "fuzz_make_seeds: %s: %s\n", what, detail);
    exit(1);
}

static void out_path(char *buf, size_t n, const char *target, const char *name) {
    snprintf(buf, n, "%s/%s/gen-%s", g_out, target, name);
}

static void put(const char *target, const char *name, const void *data, size_t len) {
    char path[4096];
    out_path(path, sizeof path, target, name);
    kv_fuzz_write_file(path, data, len);
}

static void put_text(const char *target, const char *name, const char *text) {
    put(target, name, text, strlen(text));
}

/* ---- config.json ------------------------------------------------------- */

static void config_seeds(void) {
    put_text("config", "tiny-gemma2.json", kv_fuzz_tiny_gemma2_json);
    put_text("config", "tiny-mistral.json", kv_fuzz_tiny_mistral_json);
    /* What kv_config_to_json writes (every field explicit). */
    /* The families added after gemma2 and mistral, small enough that the
     * target builds and loads their checkpoints: the seeds that reach their
     * tensor lists and flags at once. */
    static const char qwen2[] =
        "{\"model_type\": \"qwen2\", \"vocab_size\": 8, \"hidden_size\": 4, "
        "\"intermediate_size\": 4, \"num_hidden_layers\": 2, \"num_attention_heads\": 2, "
        "\"num_key_value_heads\": 1, \"sliding_window\": 4, \"use_sliding_window\": true, "
        "\"max_window_layers\": 1, \"tie_word_embeddings\": true}";
    static const char gemma3[] =
        "{\"model_type\": \"gemma3_text\", \"vocab_size\": 8, \"hidden_size\": 4, "
        "\"intermediate_size\": 4, \"num_hidden_layers\": 2, \"num_attention_heads\": 2, "
        "\"num_key_value_heads\": 1, \"head_dim\": 2, \"sliding_window\": 4, "
        "\"layer_types\": [\"sliding_attention\", \"full_attention\"], "
        "\"rope_local_base_freq\": 10000.0, \"rope_theta\": 1000000.0, "
        "\"query_pre_attn_scalar\": 2, \"final_logit_softcapping\": null}";
    static const char gpt_oss[] =
        "{\"model_type\": \"gpt_oss\", \"vocab_size\": 8, \"hidden_size\": 4, "
        "\"intermediate_size\": 2, \"num_hidden_layers\": 2, \"num_attention_heads\": 2, "
        "\"num_key_value_heads\": 1, \"head_dim\": 2, \"sliding_window\": 4, "
        "\"layer_types\": [\"sliding_attention\", \"full_attention\"], "
        "\"num_local_experts\": 3, \"num_experts_per_tok\": 2, \"attention_bias\": true, "
        "\"rope_parameters\": {\"rope_type\": \"yarn\", \"rope_theta\": 150000.0, "
        "\"factor\": 32.0, \"beta_fast\": 32.0, \"beta_slow\": 1.0, "
        "\"original_max_position_embeddings\": 4096, \"truncate\": false}, "
        "\"tie_word_embeddings\": false}";
    static const char mistral_mixed[] =
        "{\"model_type\": \"mistral\", \"vocab_size\": 8, \"hidden_size\": 4, "
        "\"intermediate_size\": 4, \"num_hidden_layers\": 3, \"num_attention_heads\": 2, "
        "\"num_key_value_heads\": 1, \"head_dim\": 2, \"sliding_window\": [2, 4, null]}";
    put_text("config", "tiny-qwen2.json", qwen2);
    put_text("config", "tiny-gemma3.json", gemma3);
    put_text("config", "tiny-gpt_oss.json", gpt_oss);
    put_text("config", "tiny-mistral-mixed.json", mistral_mixed);
    const char *families[] = {kv_fuzz_tiny_gemma2_json, kv_fuzz_tiny_mistral_json, qwen2,
                              gemma3, gpt_oss, mistral_mixed};
    const char *names[] = {"written-gemma2.json", "written-mistral.json", "written-qwen2.json",
                           "written-gemma3.json", "written-gpt_oss.json",
                           "written-mistral-mixed.json"};
    for (int f = 0; f < 6; f++) {
        KvConfig cfg;
        KvError err = {{0}};
        if (kv_config_parse(families[f], strlen(families[f]), "seed", &cfg, &err) != KV_OK) {
            die("tiny config", err.msg);
        }
        char *json = kv_config_to_json(&cfg);
        if (json == NULL) die("kv_config_to_json", "out of memory");
        put_text("config", names[f], json);
        free(json);
    }
    put_text("config", "llama.json",
             "{\"model_type\": \"llama\", \"vocab_size\": 8, \"hidden_size\": 4, "
             "\"intermediate_size\": 4, \"num_hidden_layers\": 2, \"num_attention_heads\": 2, "
             "\"hidden_act\": \"silu\", \"mlp_bias\": false, \"attention_bias\": false, "
             "\"rope_scaling\": null, \"rms_norm_eps\": 1e-5, \"tie_word_embeddings\": true}");
    put_text("config", "gemma2-v5.json",
             "{\"model_type\": \"gemma2\", \"vocab_size\": 8, \"hidden_size\": 4, "
             "\"intermediate_size\": 4, \"num_hidden_layers\": 3, \"num_attention_heads\": 2, "
             "\"num_key_value_heads\": 2, \"head_dim\": 4, \"sliding_window\": 2, "
             "\"layer_types\": [\"full_attention\", \"sliding_attention\", \"full_attention\"], "
             "\"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 500.5}, "
             "\"hidden_activation\": \"gelu_pytorch_tanh\", \"attn_logit_softcapping\": null, "
             "\"final_logit_softcapping\": 7.25, \"query_pre_attn_scalar\": 0.5, "
             "\"tie_word_embeddings\": false, \"max_position_embeddings\": null}");
    put_text("config", "mistral-nowindow.json",
             "{\"model_type\": \"mistral\", \"vocab_size\": 6, \"hidden_size\": 6, "
             "\"intermediate_size\": 2, \"num_hidden_layers\": 1, \"num_attention_heads\": 3, "
             "\"num_key_value_heads\": 1, \"sliding_window\": null, \"rope_theta\": 1e6, "
             "\"rope_parameters\": {\"rope_theta\": 1e6}}");
    /* One defect each. */
    put_text("config", "bad-duplicate-key.json",
             "{\"model_type\": \"mistral\", \"vocab_size\": 8, \"vocab_size\": 9}");
    put_text("config", "bad-rope-scaling.json",
             "{\"model_type\": \"llama\", \"rope_scaling\": {\"type\": \"linear\", \"factor\": 2}}");
    put_text("config", "bad-layer-types.json",
             "{\"model_type\": \"gemma2\", \"vocab_size\": 8, \"hidden_size\": 4, "
             "\"intermediate_size\": 4, \"num_hidden_layers\": 2, \"num_attention_heads\": 2, "
             "\"layer_types\": [\"sliding_attention\", 7]}");
    put_text("config", "bad-overflow.json",
             "{\"model_type\": \"mistral\", \"vocab_size\": 2147483647, \"hidden_size\": "
             "2147483647, \"intermediate_size\": 2147483647, \"num_hidden_layers\": 512, "
             "\"num_attention_heads\": 2147483647, \"num_key_value_heads\": 1, \"head_dim\": "
             "2147483646}");
    put_text("config", "bad-trailing.json", "{\"model_type\": \"gemma2\"} x");
    put_text("config", "bad-not-object.json", "[1, 2.5e308, \"\\u0000\", null, true]");
}

/* ---- model.safetensors ------------------------------------------------- */

static void image_for(const char *json, KvDtype dt, uint8_t **img, size_t *len) {
    KvConfig cfg;
    KvError err = {{0}};
    if (kv_config_parse(json, strlen(json), "seed", &cfg, &err) != KV_OK) die("tiny config", err.msg);
    if (kv_fuzz_model_image(&cfg, dt, img, len, &err) != KV_OK) die("image", err.msg);
}

/* A safetensors image from a header text and a data section. */
static void put_raw_st(const char *name, const char *header, const void *data, size_t data_len) {
    size_t hlen = strlen(header);
    uint8_t *img = malloc(8 + hlen + data_len + 1);
    if (img == NULL) die("image", "out of memory");
    for (int b = 0; b < 8; b++) img[b] = (uint8_t)((uint64_t)hlen >> (8 * b));
    memcpy(img + 8, header, hlen);
    if (data_len > 0) memcpy(img + 8 + hlen, data, data_len);
    put("safetensors", name, img, 8 + hlen + data_len);
    free(img);
}

static void safetensors_seeds(void) {
    const struct {
        const char *name;
        const char *json;
        KvDtype dt;
    } valid[] = {
        {"gemma2-f32.safetensors", kv_fuzz_tiny_gemma2_json, KV_DTYPE_F32},
        {"gemma2-f16.safetensors", kv_fuzz_tiny_gemma2_json, KV_DTYPE_F16},
        {"mistral-f32.safetensors", kv_fuzz_tiny_mistral_json, KV_DTYPE_F32},
        {"mistral-bf16.safetensors", kv_fuzz_tiny_mistral_json, KV_DTYPE_BF16},
    };
    for (size_t i = 0; i < sizeof valid / sizeof valid[0]; i++) {
        uint8_t *img;
        size_t len;
        image_for(valid[i].json, valid[i].dt, &img, &len);
        put("safetensors", valid[i].name, img, len);
        free(img);
    }
    /* Misaligned F32 weights (converted, not used in place), other dtypes
     * listed but unused, metadata. */
    {
        uint8_t *img;
        size_t len;
        image_for(kv_fuzz_tiny_gemma2_json, KV_DTYPE_F32, &img, &len);
        uint64_t hlen = 0;
        for (int b = 7; b >= 0; b--) hlen = (hlen << 8) | img[b];
        /* Rebuild: shift every tensor by 2 bytes behind a 1-element F16. */
        char *header = malloc((size_t)hlen + 1);
        if (header == NULL) die("image", "out of memory");
        memcpy(header, img + 8, (size_t)hlen);
        header[hlen] = '\0';
        cJSON *root = cJSON_Parse(header);
        if (root == NULL) die("image", "header does not parse");
        for (cJSON *t = root->child; t != NULL; t = t->next) {
            cJSON *offs = cJSON_GetObjectItemCaseSensitive(t, "data_offsets");
            if (offs == NULL) continue;
            for (cJSON *o = offs->child; o != NULL; o = o->next) cJSON_SetNumberValue(o, o->valuedouble + 2);
        }
        cJSON *pad = cJSON_AddObjectToObject(root, "aaa.pad");
        cJSON_AddStringToObject(pad, "dtype", "F16");
        cJSON *shape = cJSON_AddArrayToObject(pad, "shape");
        cJSON_AddItemToArray(shape, cJSON_CreateNumber(1));
        cJSON *offs = cJSON_AddArrayToObject(pad, "data_offsets");
        cJSON_AddItemToArray(offs, cJSON_CreateNumber(0));
        cJSON_AddItemToArray(offs, cJSON_CreateNumber(2));
        cJSON *extra = cJSON_AddObjectToObject(root, "zzz.step");
        cJSON_AddStringToObject(extra, "dtype", "I64");
        cJSON_AddArrayToObject(extra, "shape");
        cJSON *eo = cJSON_AddArrayToObject(extra, "data_offsets");
        cJSON_AddItemToArray(eo, cJSON_CreateNumber(0));
        cJSON_AddItemToArray(eo, cJSON_CreateNumber(0));
        cJSON *meta = cJSON_GetObjectItemCaseSensitive(root, "__metadata__");
        cJSON_AddStringToObject(meta, "source", "fuzz seed");
        char *text = cJSON_PrintUnformatted(root);
        size_t data_len = len - 8 - (size_t)hlen;
        uint8_t *data = calloc(data_len + 2, 1);
        if (text == NULL || data == NULL) die("image", "out of memory");
        data[0] = 0x00;
        data[1] = 0x3c; /* F16 1.0 */
        memcpy(data + 2, img + 8 + hlen, data_len);
        put_raw_st("gemma2-misaligned.safetensors", text, data, data_len + 2);
        free(data);
        free(text);
        cJSON_Delete(root);
        free(header);
        free(img);
    }
    /* Standalone containers and one defect each. */
    static const uint8_t four[4] = {0, 0, 128, 63};
    put_raw_st("empty-header.safetensors", "{}", NULL, 0);
    put_raw_st("metadata-only.safetensors", "{\"__metadata__\": {\"format\": \"pt\"}}  ", NULL, 0);
    put_raw_st("scalar.safetensors",
               "{\"x\": {\"dtype\": \"F32\", \"shape\": [], \"data_offsets\": [0, 4]}}", four, 4);
    put_raw_st("f4-odd.safetensors",
               "{\"x\": {\"dtype\": \"F4\", \"shape\": [3], \"data_offsets\": [0, 2]}}", four, 2);
    put_raw_st("bad-overlap.safetensors",
               "{\"a\": {\"dtype\": \"U8\", \"shape\": [3], \"data_offsets\": [0, 3]}, "
               "\"b\": {\"dtype\": \"U8\", \"shape\": [2], \"data_offsets\": [2, 4]}}",
               four, 4);
    put_raw_st("bad-duplicate.safetensors",
               "{\"a\": {\"dtype\": \"U8\", \"shape\": [2], \"data_offsets\": [0, 2]}, "
               "\"a\": {\"dtype\": \"U8\", \"shape\": [2], \"data_offsets\": [2, 4]}}",
               four, 4);
    put_raw_st("bad-range.safetensors",
               "{\"a\": {\"dtype\": \"BF16\", \"shape\": [9007199254740991, 2], "
               "\"data_offsets\": [0, 18446744073709551615]}}",
               four, 4);
    put_raw_st("bad-dtype.safetensors",
               "{\"a\": {\"dtype\": \"Q4_K\", \"shape\": [1], \"data_offsets\": [0, 1]}}", four, 1);
    static const uint8_t short_len[8] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
    put("safetensors", "bad-length.safetensors", short_len, sizeof short_len);
}

/* ---- reports ----------------------------------------------------------- */

static void report_seeds(void) {
    static const char *names[KV_FUZZ_REPORT_COUNT] = {"pass.h5", "fail-skip.h5", "topk-fault.h5",
                                                      "empty.h5"};
    char path[4096];
    for (int k = 0; k < KV_FUZZ_REPORT_COUNT; k++) {
        KvReport rep;
        KvError err = {{0}};
        kv_fuzz_tiny_report((KvFuzzReportKind)k, &rep);
        out_path(path, sizeof path, "report", names[k]);
        if (kv_report_write_h5(&rep, path, &err) != KV_OK) die("report", err.msg);
        kv_report_free(&rep);
    }
}

/* ---- report edit scripts ----------------------------------------------- */

/* fuzz_report_edit's inputs: the first byte picks the base report, the rest
 * are edits. The bare bases; the fuzzer finds the edits. */
static void report_edit_seeds(void) {
    static const char *names[KV_FUZZ_REPORT_COUNT] = {"base-pass", "base-fail-skip",
                                                      "base-topk-fault", "base-empty"};
    for (int k = 0; k < KV_FUZZ_REPORT_COUNT; k++) {
        uint8_t b = (uint8_t)k;
        put("report_edit", names[k], &b, 1);
    }
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: fuzz_make_seeds OUT_DIR\n");
        return 2;
    }
    g_out = argv[1];
    const char *dirs[] = {"config", "safetensors", "report", "report_edit"};
    for (int i = 0; i < 4; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", g_out, dirs[i]);
        (void)mkdir(g_out, 0755);
        (void)mkdir(path, 0755);
    }
    config_seeds();
    safetensors_seeds();
    report_seeds();
    report_edit_seeds();
    return 0;
}
