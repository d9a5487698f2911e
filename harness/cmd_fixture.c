/* cmd_fixture.c: `kvrepro fixture`: writes a deterministic synthetic model
 * to a directory, loads it back through the file loader (so what was
 * written is known to be valid) and prints the smallest top-1 margin of the
 * default decode. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "fixture.h"
#include "model.h"

static void fixture_usage(FILE *f) {
    fprintf(f,
            "usage: kvrepro fixture --family gemma2|mistral --out DIR [--seed N] "
            "[--size tiny|medium]\n\n"
            "Writes DIR/config.json and DIR/model.safetensors (F32), generated from the seed\n"
            "with kvrepro's own PRNG (SplitMix64 streams keyed by tensor name; see\n"
            "reference/prng.h), so the same seed gives the same bytes on every machine.\n"
            "  tiny:   vocab 512, hidden 128, 4 layers, 4 heads / 2 kv heads, head_dim 32,\n"
            "          window 16 (tests)\n"
            "  medium: about 100M parameters (benchmarks; ~400 MB, do not commit)\n"
            "  --seed N   weight seed (default %llu)\n"
            "Prints the smallest top-1 margin over the default decode.\n",
            (unsigned long long)KV_FIXTURE_DEFAULT_SEED);
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
        else {
            fprintf(stderr, "kvrepro fixture: --family: expected gemma2 or mistral, found '%s'\n",
                    family_s);
            bad = true;
        }
    }
    if (!bad) {
        if (strcmp(size_s, "tiny") == 0) size = KV_SIZE_TINY;
        else if (strcmp(size_s, "medium") == 0) size = KV_SIZE_MEDIUM;
        else {
            fprintf(stderr, "kvrepro fixture: --size: expected tiny or medium, found '%s'\n",
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
    float margin = 0.0f;
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
        st = kv_gate_decode_print(&m, KV_FIXTURE_DEFAULT_SEED, false, &margin, &err);
    }
    kv_model_free(&m);
    free(st_bytes);
    free(json);
    if (st != KV_OK) {
        fprintf(stderr, "kvrepro fixture: %s\n", err.msg);
        return kv_gate_exit_code(st);
    }
    return KV_EXIT_PASS;
}
