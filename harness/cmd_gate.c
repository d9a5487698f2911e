/* cmd_gate.c: `kvrepro gate`. Until the run matrix and comparisons land
 * (issue: harness), the gate decodes the default scenario with the CPU
 * reference on each selected model and prints the tokens, the smallest top-1
 * margin and a hash of all logits, and reports whether CUDA runs could run
 * here. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cuda_device.h"
#include "decode.h"
#include "fixture.h"
#include "model.h"
#include "prng.h"
#include "scenario.h"

#ifdef _OPENMP
#include <omp.h>
#endif

static void gate_usage(FILE *f) {
    fprintf(f,
            "usage: kvrepro gate [--model DIR | --fixture NAME] [--seed N] [--prompt-seed N]\n\n"
            "Decodes the default scenario (a %d-token prompt, window + 3 x window new tokens)\n"
            "with the CPU reference and prints the tokens, the smallest top-1 margin and the\n"
            "FNV-1a 64 hash of all logits.\n\n"
            "  --model DIR       a Hugging Face checkpoint directory (config.json +\n"
            "                    model.safetensors) of a supported family (gemma2, mistral, llama)\n"
            "  --fixture NAME    a built-in fixture: gemma2-tiny, mistral-tiny, gemma2-medium,\n"
            "                    mistral-medium (default: gemma2-tiny and mistral-tiny)\n"
            "  --seed N          fixture weight seed (default %llu)\n"
            "  --prompt-seed N   seed of the scenario's prompt tokens (default %llu)\n"
            "Exit codes: 0 pass, 1 gate failure, 2 bad input or usage, 3 internal error.\n",
            KV_SCENARIO_SHORT_PROMPT, (unsigned long long)KV_FIXTURE_DEFAULT_SEED,
            (unsigned long long)KV_FIXTURE_DEFAULT_SEED);
}

int kv_gate_exit_code(KvStatus st) {
    return st == KV_ERR_INPUT ? KV_EXIT_USAGE : KV_EXIT_INTERNAL;
}

KvStatus kv_gate_decode_print(const KvModel *m, uint64_t prompt_seed, bool print_tokens,
                              float *min_margin, KvError *err) {
    KvScenario sc = {0};
    KvDecodeResult res = {0};
    KvStatus st = kv_scenario_default(&m->config, prompt_seed, &sc, err);
    if (st != KV_OK) goto exit;
    KvDecodeSpec spec = {
        .batch = sc.batch,
        .prompt_len = sc.prompt_len,
        .prompt = sc.prompt,
        .prompt_real = sc.real,
        .new_tokens = sc.new_tokens,
        .prefill_chunk = sc.prefill_chunk,
    };
    st = kv_decode_greedy(m, &spec, &res, err);
    if (st != KV_OK) goto exit;

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
    if (print_tokens) {
        for (int64_t b = 0; b < res.batch; b++) {
            printf("prompt[%lld]:", (long long)b);
            for (int64_t i = 0; i < sc.prompt_len; i++) {
                if (sc.real[b * sc.prompt_len + i]) printf(" %d", sc.prompt[b * sc.prompt_len + i]);
            }
            printf("\ntokens[%lld]:", (long long)b);
            for (int64_t s = 0; s < res.steps; s++) printf(" %d", res.tokens[s * res.batch + b]);
            printf("\n");
        }
    }
    printf("min top-1 margin: %.6g (step %lld)\n", (double)best, (long long)best_step);
    printf("logits fnv1a64: 0x%016" PRIx64 "\n", h);
    if (min_margin != NULL) *min_margin = best;

exit:
    kv_decode_result_free(&res);
    kv_scenario_free(&sc);
    return st;
}

static void gate_print_cuda(void) {
    KvCudaInfo info;
    KvError err = {{0}};
    KvStatus st = kv_cuda_query(&info, &err);
    if (st == KV_OK) {
        printf("cuda: %s (sm_%d%d), driver %d, runtime %d; CUDA runs land with the CUDA backend\n",
               info.name, info.cc_major, info.cc_minor, info.driver_version,
               info.runtime_version);
    } else {
        printf("cuda: skipped: %s\n", err.msg);
    }
}

int kv_cmd_gate(int argc, char **argv) {
    const char *model_dir = NULL;
    const char *fixture = NULL;
    uint64_t seed = KV_FIXTURE_DEFAULT_SEED;
    uint64_t prompt_seed = KV_FIXTURE_DEFAULT_SEED;
    bool bad = false;
    for (int i = 1; i < argc && !bad; i++) {
        const char *v = NULL;
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            gate_usage(stdout);
            return KV_EXIT_PASS;
        } else if (kv_cli_take(argc, argv, &i, "--model", &v, &bad)) {
            model_dir = v;
        } else if (kv_cli_take(argc, argv, &i, "--fixture", &v, &bad)) {
            fixture = v;
        } else if (kv_cli_take(argc, argv, &i, "--seed", &v, &bad)) {
            bad = bad || !kv_cli_parse_u64("--seed", v, &seed);
        } else if (kv_cli_take(argc, argv, &i, "--prompt-seed", &v, &bad)) {
            bad = bad || !kv_cli_parse_u64("--prompt-seed", v, &prompt_seed);
        } else {
            fprintf(stderr, "kvrepro gate: unknown option '%s'\n", argv[i]);
            bad = true;
        }
    }
    if (!bad && model_dir != NULL && fixture != NULL) {
        fprintf(stderr, "kvrepro gate: --model and --fixture are exclusive\n");
        bad = true;
    }
    if (bad) {
        gate_usage(stderr);
        return KV_EXIT_USAGE;
    }

    printf("%s gate\n", kv_cli_version());
#ifdef _OPENMP
    printf("cpu: reference, %d OpenMP threads\n", omp_get_max_threads());
#else
    printf("cpu: reference, single-threaded (built without OpenMP)\n");
#endif
    const char *defaults[] = {"gemma2-tiny", "mistral-tiny"};
    const char *const *names = fixture != NULL ? &fixture : defaults;
    size_t n_models = model_dir != NULL ? 1 : (fixture != NULL ? 1 : 2);
    KvError err = {{0}};
    KvStatus st = KV_OK;
    for (size_t i = 0; i < n_models && st == KV_OK; i++) {
        if (model_dir != NULL) {
            KvModel m = {0};
            st = kv_model_load_dir(model_dir, &m, &err);
            if (st != KV_OK) break;
            printf("\nmodel: %s (%s, %lld layers), weights fnv1a64 0x%016" PRIx64 "\n", model_dir,
                   m.config.model_type, (long long)m.config.num_layers, kv_model_hash(&m));
            st = kv_gate_decode_print(&m, prompt_seed, true, NULL, &err);
            kv_model_free(&m);
        } else {
            KvFixtureModel f = {0};
            st = kv_fixture_load(names[i], seed, &f, &err);
            if (st != KV_OK) break;
            printf("\nmodel: fixture %s (seed %llu), weights fnv1a64 0x%016" PRIx64 "\n", f.name,
                   (unsigned long long)f.seed, kv_model_hash(&f.model));
            st = kv_gate_decode_print(&f.model, prompt_seed, true, NULL, &err);
            kv_fixture_free(&f);
        }
    }
    if (st != KV_OK) {
        fprintf(stderr, "kvrepro gate: %s\n", err.msg);
        return kv_gate_exit_code(st);
    }
    printf("\n");
    gate_print_cuda();
    return KV_EXIT_PASS;
}
