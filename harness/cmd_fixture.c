/* cmd_fixture.c: `kvrepro fixture`: writes a deterministic synthetic model
 * to a directory, loads it back through the file loader (so what was
 * written is known to be valid) and prints the smallest top-1 margin of the
 * default decode. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "decode.h"
#include "fixture.h"
#include "model.h"
#include "prng.h"
#include "report.h"
#include "scenario.h"

/* Prints the words of list which as "a|b|c" (the synopsis's form), folded
 * at indent. */
static void fixture_print_choices(FILE *f, int *col, KvCliNames which, int indent) {
    const char *names[KV_CLI_MAX_NAMES];
    const int n = kv_cli_names(which, names, KV_CLI_MAX_NAMES);
    char text[256] = " "; /* a space before, or a fold */
    size_t used = 1;
    for (int k = 0; k < n && k < KV_CLI_MAX_NAMES && used < sizeof text; k++) {
        const int w = snprintf(text + used, sizeof text - used, "%s%s", k > 0 ? "|" : "",
                               names[k]);
        used += w > 0 ? (size_t)w : 0;
    }
    kv_cli_print_text(f, col, indent, text);
}

static void fixture_usage(FILE *f) {
    fprintf(f, "usage: kvrepro fixture --family FAMILY --out DIR [--size SIZE] [--seed N]\n"
               "%23s[--dtype f32|bf16|mxfp4] [--sliding-window N]\n", "");
    int col = fprintf(f, "  FAMILY:");
    fixture_print_choices(f, &col, KV_NAMES_FIXTURE_FAMILIES, 10);
    kv_cli_print_text(f, &col, 10, " (config.json's model_type; the short form the fixtures' "
                      "names use is taken too:");
    kv_cli_print_list(f, &col, 10, KV_NAMES_FAMILY_ALIASES, "and");
    kv_cli_print_text(f, &col, 10, ")");
    col = fprintf(f, "\n  SIZE:  ");
    fixture_print_choices(f, &col, KV_NAMES_FIXTURE_SIZES, 10);
    kv_cli_print_text(f, &col, 10, " (default tiny)");
    fprintf(f,
            "\n\n"
            "Writes DIR/config.json and DIR/model.safetensors, generated from the seed\n"
            "with kvrepro's own PRNG (SplitMix64 streams keyed by tensor name; see\n"
            "model/prng.h), so the same seed gives the same bytes on every machine.\n"
            "The file is written tensor by tensor (never held whole) to a temporary that\n"
            "is renamed into place; a full disk or an unwritable DIR leaves nothing behind\n"
            "(DIR is removed again when this command made it). A name in DIR that is not a\n"
            "regular file (a directory, a device, a FIFO) is refused.\n"
            "  tiny:   vocab 512, hidden 128, 4 layers, 4 heads / 2 kv heads, head_dim 32,\n"
            "          window 16 (tests)\n"
            "  medium: about 100M parameters (benchmarks; ~400 MB, do not commit)\n"
            "  125m:   mistral only: hidden 768, 12 layers, vocab 32000, 124.7M parameters\n"
            "          (the long calibration check; ~500 MB, do not commit)\n"
            "  2b:     gemma2 only: google/gemma-2-2b's shape (vocab 256000, hidden 2304,\n"
            "          26 layers, 8 heads / 4 kv heads, head_dim 256, window 4096), random\n"
            "          weights: 2.6B parameters, 5.2 GB in BF16 (pytorch #159855's test\n"
            "          shape, bench/seed-shape.sh; never commit). Loaded back and hashed,\n"
            "          not decoded, as the two below\n"
            "  20b:    gpt_oss only: openai/gpt-oss-20b's shape (24 layers, hidden 2880,\n"
            "          64 heads / 8 kv heads, 32 experts, 4 per token, window 128), MXFP4\n"
            "          experts: ~13.8 GB (transformers #44609's model; never commit)\n"
            "  8b:     mistral only: Ministral-8B-Instruct-2410's shape (36 layers, hidden\n"
            "          4096, 32 heads / 8 kv heads, window 32768): 16 GB in BF16\n"
            "  --dtype    f32, bf16 or mxfp4 (default f32; bf16 for 2b and 8b, mxfp4 for\n"
            "             20b): the stored tensors; bf16 rounds each drawn F32 value to\n"
            "             nearest even;\n"
            "             mxfp4 (gpt_oss): the experts as gpt-oss ships them (_blocks of\n"
            "             random e2m1 pairs, _scales of e8m0 exponents), the rest bf16\n"
            "  --seed N   weight seed (default %llu)\n"
            "  --sliding-window N\n"
            "             the window W instead of the size's (1 .. max positions / 4): a\n"
            "             tiny model at a real model's W runs the gate's real-scale\n"
            "             scenarios in seconds (not with the mixed-window family)\n"
            "Prints the smallest top-1 margin over the default decode.\n",
            (unsigned long long)KV_FIXTURE_DEFAULT_SEED);
}

/* Looks word up as a family (kv_cli_family: a model_type or its short
 * form) or a size (the kv_fixture_sizes table): its value, or false after
 * printing "kvrepro fixture: OPT: expected a, b or c, found 'WORD'" from
 * the same registries. */
static bool fixture_parse_word(const char *opt, const char *word, bool families, int *value) {
    if (families && kv_cli_family(word, value)) return true;
    int n = 0;
    const KvFixtureWord *w = families ? NULL : kv_fixture_sizes(&n);
    for (int k = 0; k < n; k++) {
        if (strcmp(w[k].word, word) == 0) {
            *value = w[k].value;
            return true;
        }
    }
    int col = fprintf(stderr, "kvrepro fixture: %s: expected", opt);
    kv_cli_print_list(stderr, &col, -1,
                      families ? KV_NAMES_FIXTURE_FAMILIES : KV_NAMES_FIXTURE_SIZES, "or");
    if (families) {
        col += fprintf(stderr, " (or the short form");
        kv_cli_print_list(stderr, &col, -1, KV_NAMES_FAMILY_ALIASES, "or");
        fprintf(stderr, ")");
    }
    fprintf(stderr, ", found '%s'\n", word);
    return false;
}

static double fixture_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
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
    const char *dtype_s = NULL;
    uint64_t window = 0; /* 0: the size's */
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
        } else if (kv_cli_take(argc, argv, &i, "--dtype", &v, &bad)) {
            dtype_s = v;
        } else if (kv_cli_take(argc, argv, &i, "--sliding-window", &v, &bad)) {
            bad = bad || !kv_cli_parse_u64("--sliding-window", v, &window);
            if (!bad && window == 0) {
                fprintf(stderr, "kvrepro fixture: --sliding-window: expected at least 1\n");
                bad = true;
            }
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
    int value = 0;
    if (!bad) {
        bad = !fixture_parse_word("--family", family_s, true, &value);
        family = (KvFamily)value;
    }
    if (!bad) {
        bad = !fixture_parse_word("--size", size_s, false, &value);
        size = (KvFixtureSize)value;
    }
    KvDtype dtype = kv_fixture_default_dtype(size);
    if (!bad && dtype_s != NULL) {
        if (strcmp(dtype_s, "f32") == 0) dtype = KV_DTYPE_F32;
        else if (strcmp(dtype_s, "bf16") == 0) dtype = KV_DTYPE_BF16;
        else if (strcmp(dtype_s, "mxfp4") == 0) dtype = KV_DTYPE_F4;
        else {
            fprintf(stderr, "kvrepro fixture: --dtype: expected f32, bf16 or mxfp4, found '%s'\n",
                    dtype_s);
            bad = true;
        }
    }
    if (bad) {
        fixture_usage(stderr);
        return KV_EXIT_USAGE;
    }

    KvError err = {{0}};
    KvConfig cfg;
    uint64_t file_bytes = 0;
    KvModel m = {0};
    KvStatus st = kv_fixture_config(family, size, &cfg, &err);
    if (st == KV_OK && window > 0) {
        if (kv_config_mixed_windows(&cfg)) {
            st = kv_error_set(&err, KV_ERR_INPUT, "--sliding-window: %s has windows of its own "
                              "per layer; use another family", family_s);
        } else if (window > (uint64_t)cfg.max_position_embeddings / 4) {
            st = kv_error_set(&err, KV_ERR_INPUT, "--sliding-window %llu: above %lld, a quarter "
                              "of the model's %lld positions (the scenarios need room past W)",
                              (unsigned long long)window,
                              (long long)(cfg.max_position_embeddings / 4),
                              (long long)cfg.max_position_embeddings);
        } else {
            cfg.sliding_window = (int64_t)window;
        }
    }
    double t0 = fixture_now();
    /* each file through the reports' publish path: an unnamed temporary
     * (or one created new, never through a link), fsync, rename */
    if (st == KV_OK) {
        st = kv_fixture_write_streamed_with(out, &cfg, seed, dtype, kv_report_file_publish_with,
                                            &file_bytes, &err);
    }
    if (st == KV_OK) {
        printf("wrote %s/config.json and %s/model.safetensors (%s %s, %s, seed %llu, %" PRIu64
               " bytes, %.1f s)\n",
               out, out, family_s, size_s, kv_dtype_name(dtype), (unsigned long long)seed,
               file_bytes, fixture_now() - t0);
        t0 = fixture_now();
        st = kv_model_load_dir(out, &m, &err);
    }
    if (st == KV_OK) {
        printf("weights fnv1a64: 0x%016" PRIx64 "\n", kv_model_hash(&m));
        if (kv_fixture_size_big(size)) {
            /* the default scenario crosses W with billions of parameters:
             * far beyond a smoke check; bench/seed-shape.sh and
             * bench_decode run these models */
            printf("loaded back and hashed in %.1f s; default decode skipped at size %s "
                   "(window %lld: a bench's work, not a smoke check's)\n",
                   fixture_now() - t0, size_s, (long long)m.config.sliding_window);
        } else {
            st = fixture_print_decode(&m, KV_FIXTURE_DEFAULT_SEED, &err);
        }
    }
    kv_model_free(&m);
    if (st != KV_OK) {
        fprintf(stderr, "kvrepro fixture: %s\n", err.msg);
        return kv_cli_exit_code(st);
    }
    return KV_EXIT_PASS;
}
