/* cmd_fixture.c: `kvrepro fixture`: writes a deterministic synthetic model
 * to a directory, loads it back through the file loader (so what was
 * written is known to be valid) and prints the smallest top-1 margin of the
 * default decode. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "decode.h"
#include "fixture.h"
#include "model.h"
#include "prng.h"
#include "scenario.h"

static void fixture_usage(FILE *f) {
    fprintf(f,
            "usage: kvrepro fixture --family gemma2|gemma3|gpt_oss|mistral|qwen2 --out DIR [--seed N] "
            "[--size tiny|medium|125m]\n\n"
            "Writes DIR/config.json and DIR/model.safetensors (F32), generated from the seed\n"
            "with kvrepro's own PRNG (SplitMix64 streams keyed by tensor name; see\n"
            "reference/prng.h), so the same seed gives the same bytes on every machine.\n"
            "  tiny:   vocab 512, hidden 128, 4 layers, 4 heads / 2 kv heads, head_dim 32,\n"
            "          window 16 (tests)\n"
            "  medium: about 100M parameters (benchmarks; ~400 MB, do not commit)\n"
            "  125m:   mistral only: hidden 768, 12 layers, vocab 32000, 124.7M parameters\n"
            "          (the long calibration check; ~500 MB, do not commit)\n"
            "  --seed N   weight seed (default %llu)\n"
            "Prints the smallest top-1 margin over the default decode.\n",
            (unsigned long long)KV_FIXTURE_DEFAULT_SEED);
}

/* Decodes the default scenario of m with the reference (prompts from
 * prompt_seed) and prints the scenario, the smallest top-1 margin and its
 * step (how near the fixture's greedy decode comes to a tie, where the gate's
 * reference comparison turns tie-aware) and the logits hash. */
static KvStatus fixture_print_decode(const KvModel *m, uint64_t prompt_seed, KvError *err) {
    KvScenario sc = {0};
    KvDecodeResult res = {0};
    KvStatus st = kv_scenario_default(&m->config, prompt_seed, &sc, err);
    if (st != KV_OK) goto cleanup;
    KvDecodeSpec spec = {
        .batch = sc.batch,
        .prompt_len = sc.prompt_len,
        .prompt = sc.prompt,
        .prompt_real = sc.real,
        .new_tokens = sc.new_tokens,
        .prefill_chunk = sc.prefill_chunk,
    };
    st = kv_decode_greedy(m, &spec, &res, err);
    if (st != KV_OK) goto cleanup;

    float best = INFINITY;
    int64_t best_step = -1;
    for (int64_t i = 0; i < res.steps * res.batch; i++) {
        if (res.margins[i] < best) {
            best = res.margins[i];
            best_step = i / res.batch;
        }
    }
    uint64_t h = kv_fnv1a(KV_FNV_OFFSET, res.logits,
                          (size_t)(res.steps * res.batch * res.vocab) * sizeof(float));
    printf("scenario: %s: batch %lld, prompt %lld tokens (prompt seed %llu), %lld new tokens, "
           "window %lld\n",
           sc.name, (long long)sc.batch, (long long)sc.prompt_len,
           (unsigned long long)sc.seed, (long long)sc.new_tokens,
           (long long)m->config.sliding_window);
    printf("min top-1 margin: %.6g (step %lld)\n", (double)best, (long long)best_step);
    printf("logits fnv1a64: 0x%016" PRIx64 "\n", h);

cleanup:
    kv_decode_result_free(&res);
    kv_scenario_free(&sc);
    return st;
}

int kv_cmd_fixture(int argc, char **argv) {
    const char *family_s = NULL;
    const char *out = NULL;
    const char *size_s = "tiny";
    uint64_t seed = KV_FIXTURE_DEFAULT_SEED;
    bool bad = false;
    for (int i = 1; i < argc && !bad; i++) {
        const char *v = NULL;
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            fixture_usage(stdout);
            return KV_EXIT_PASS;
        } else if (kv_cli_take(argc, argv, &i, "--family", &v, &bad)) {
            family_s = v;
        } else if (kv_cli_take(argc, argv, &i, "--out", &v, &bad)) {
            out = v;
        } else if (kv_cli_take(argc, argv, &i, "--size", &v, &bad)) {
            size_s = v;
        } else if (kv_cli_take(argc, argv, &i, "--seed", &v, &bad)) {
            bad = bad || !kv_cli_parse_u64("--seed", v, &seed);
        } else {
            fprintf(stderr, "kvrepro fixture: unknown option '%s'\n", argv[i]);
            bad = true;
        }
    }
    KvFamily family = KV_FAMILY_GEMMA2;
    KvFixtureSize size = KV_SIZE_TINY;
    if (!bad && (family_s == NULL || out == NULL)) {
        fprintf(stderr, "kvrepro fixture: --family and --out are required\n");
        bad = true;
    }
    if (!bad) {
        if (strcmp(family_s, "gemma2") == 0) family = KV_FAMILY_GEMMA2;
        else if (strcmp(family_s, "mistral") == 0) family = KV_FAMILY_MISTRAL;
        else if (strcmp(family_s, "qwen2") == 0) family = KV_FAMILY_QWEN2;
        else if (strcmp(family_s, "gemma3") == 0) family = KV_FAMILY_GEMMA3;
        else if (strcmp(family_s, "gpt_oss") == 0) family = KV_FAMILY_GPT_OSS;
        else {
            fprintf(stderr, "kvrepro fixture: --family: expected gemma2, gemma3, gpt_oss, "
                    "mistral or qwen2, found '%s'\n",
                    family_s);
            bad = true;
        }
    }
    if (!bad) {
        if (strcmp(size_s, "tiny") == 0) size = KV_SIZE_TINY;
        else if (strcmp(size_s, "medium") == 0) size = KV_SIZE_MEDIUM;
        else if (strcmp(size_s, "125m") == 0) size = KV_SIZE_125M;
        else {
            fprintf(stderr, "kvrepro fixture: --size: expected tiny, medium or 125m, found '%s'\n",
                    size_s);
            bad = true;
        }
    }
    if (bad) {
        fixture_usage(stderr);
        return KV_EXIT_USAGE;
    }

    KvError err = {{0}};
    KvConfig cfg;
    uint8_t *st_bytes = NULL;
    size_t st_len = 0;
    char *json = NULL;
    KvModel m = {0};
    KvStatus st = kv_fixture_config(family, size, &cfg, &err);
    if (st == KV_OK) st = kv_fixture_build(&cfg, seed, &st_bytes, &st_len, &json, &err);
    if (st == KV_OK) st = kv_fixture_write_dir(out, st_bytes, st_len, json, &err);
    if (st == KV_OK) {
        printf("wrote %s/config.json and %s/model.safetensors (%s %s, seed %llu, %zu bytes)\n",
               out, out, family_s, size_s, (unsigned long long)seed, st_len);
        st = kv_model_load_dir(out, &m, &err);
    }
    if (st == KV_OK) {
        printf("weights fnv1a64: 0x%016" PRIx64 "\n", kv_model_hash(&m));
        st = fixture_print_decode(&m, KV_FIXTURE_DEFAULT_SEED, &err);
    }
    kv_model_free(&m);
    free(st_bytes);
    free(json);
    if (st != KV_OK) {
        fprintf(stderr, "kvrepro fixture: %s\n", err.msg);
        return kv_cli_exit_code(st);
    }
    return KV_EXIT_PASS;
}
