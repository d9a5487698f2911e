/* cmd_gate.c: `kvrepro gate`: the CI gate (DESIGN §4-§8). Runs the matrix
 * of scenarios x variants x backends x modes x repeats for each model,
 * compares every run, prints the summary table, writes the HDF5 report and
 * JUnit XML when asked, and exits 0 (all pass), 1 (a comparison failed),
 * 2 (bad input or usage) or 3 (internal error). */
#include <cjson/cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "compare.h"
#include "cuda_device.h"
#include "decode.h"
#include "fault.h"
#include "fixture.h"
#include "forward.h"
#include "junit.h"
#include "matrix.h"
#include "model.h"
#include "mutation.h"
#include "prng.h"
#include "report.h"
#include "report_h5.h"
#include "scenario.h"

#ifdef _OPENMP
#include <omp.h>
#endif

#define KV_GATE_MAX_MODELS 8
#define KV_GATE_MAX_LIST 16

static void gate_usage(FILE *f) {
    fprintf(f,
            "usage: kvrepro gate [--model DIR | --fixture NAME]... [--scenarios LIST]\n"
            "                    [--variants LIST] [--backends cpu,cuda] [--modes eager,graph]\n"
            "                    [--repeats N] [--report PATH.h5] [--junit PATH.xml]\n"
            "                    [--shard I/N] [--tol NAME=VALUE]... [--prompts FILE\n"
            "                    --max-new-tokens N] [--seed N] [--prompt-seed N]\n"
            "                    [--replay-every N] [--fault LIST | --faults LIST|all]\n"
            "                    [--timings]\n"
            "                    [--quiet | --verbose]\n\n"
            "Runs the reference and every selected cache variant on every scenario, compares\n"
            "them (reference agreement within tolerances; repeats, graph vs eager, variant vs\n"
            "variant and replays bitwise), prints one line per run and a final\n"
            "'N passed, N failed, N skipped' line.\n\n"
            "  --model DIR       a Hugging Face checkpoint directory (gemma2, mistral, llama)\n"
            "  --fixture NAME    gemma2-tiny, mistral-tiny, gemma2-medium, mistral-medium\n"
            "                    (default: gemma2-tiny and mistral-tiny)\n"
            "  --scenarios LIST  comma-separated, default all: short_prompt_crosses_window,\n"
            "                    prompt_w_minus_1, prompt_w, prompt_w_plus_1,\n"
            "                    prefill_longer_than_window, left_padded_batch, chunked_prefill\n"
            "  --variants LIST   default all: index_copy, cat_shift, roll, always_roll, ring,\n"
            "                    dynamic\n"
            "  --backends LIST   default every backend built: cpu and cuda (cuda runs are\n"
            "                    reported as skipped, with the reason, when they cannot run)\n"
            "  --modes LIST      default eager,graph\n"
            "  --repeats N       runs per (variant, mode), compared bitwise (default 3)\n"
            "  --report PATH     write the HDF5 report (reports/SCHEMA.md)\n"
            "  --junit PATH      write JUnit XML\n"
            "  --shard I/N       run the I-th of N shards of the (model, scenario) units\n"
            "  --tol NAME=VALUE  max_rel_err (default %g), tie_margin (default %g)\n"
            "  --prompts FILE    a JSON array of token-id arrays, run as one left-padded batch\n"
            "                    instead of the scenarios; needs --max-new-tokens N\n"
            "  --seed N          fixture weight seed (default %llu)\n"
            "  --prompt-seed N   scenario prompt seed (default %llu)\n"
            "  --replay-every N  replay-check every N-th decode step (default 5, 0 = off)\n"
            "  --fault LIST      plant these faults (comma-separated) in every candidate run:\n"
            "                    stale_scalar, atomic_reduction, inplace_shift,\n"
            "                    window_off_by_one, prefill_first_w, unwritten_slot,\n"
            "                    no_recapture, tf32 (the gate must then fail)\n"
            "  --faults LIST|all mutation score: the matrix once clean and once per fault,\n"
            "                    into one report; prints per fault whether and how the gate\n"
            "                    caught it, 'mutation score: C/P' and 'false alarms: N'; exits\n"
            "                    1 unless every fault was caught with no false alarm\n"
            "  --timings         record wall times (the report is then not byte-reproducible)\n"
            "  --full-logits-max-vocab N\n"
            "                    above this vocabulary the report keeps each row's top-%d logits\n"
            "                    and the hash of the full row (default %d); comparisons always\n"
            "                    use the full logits\n"
            "Exit codes: 0 pass, 1 gate failure, 2 bad input or usage, 3 internal error.\n",
            KV_TOL_MAX_REL_ERR, KV_TOL_TIE_MARGIN, (unsigned long long)KV_FIXTURE_DEFAULT_SEED,
            (unsigned long long)KV_FIXTURE_DEFAULT_SEED, KV_TOPK, KV_FULL_LOGITS_MAX_VOCAB);
}

int kv_gate_exit_code(KvStatus st) {
    return st == KV_ERR_INPUT ? KV_EXIT_USAGE : KV_EXIT_INTERNAL;
}

/* Splits a comma-separated list in place into items (at most max). */
static int gate_split(char *list, char **items, int max) {
    int n = 0;
    for (char *tok = strtok(list, ","); tok != NULL && n < max; tok = strtok(NULL, ",")) {
        items[n++] = tok;
    }
    return n;
}

/* Parses --prompts FILE: a JSON array of non-empty arrays of token ids. */
static KvStatus gate_load_prompts(const char *path, int64_t new_tokens, KvScenario *out,
                                  KvError *err) {
    KvStatus st = KV_OK;
    char *text = NULL;
    cJSON *root = NULL;
    int32_t **rows = NULL;
    int64_t *lens = NULL;
    int64_t batch = 0;
    FILE *f = fopen(path, "rb");
    if (f == NULL) return kv_error_set(err, KV_ERR_INPUT, "%s: cannot open: %s", path, strerror(errno));
    if (fseek(f, 0, SEEK_END) != 0) goto read_fail;
    long size = ftell(f);
    if (size < 0 || fseek(f, 0, SEEK_SET) != 0) goto read_fail;
    text = malloc((size_t)size + 1);
    if (text == NULL || fread(text, 1, (size_t)size, f) != (size_t)size) goto read_fail;
    text[size] = '\0';
    fclose(f);
    f = NULL;
    root = cJSON_ParseWithLength(text, (size_t)size);
    if (root == NULL || !cJSON_IsArray(root) || cJSON_GetArraySize(root) < 1) {
        st = kv_error_set(err, KV_ERR_INPUT, "%s: expected a non-empty JSON array of token-id "
                          "arrays", path);
        goto exit;
    }
    batch = cJSON_GetArraySize(root);
    rows = calloc((size_t)batch, sizeof *rows);
    lens = calloc((size_t)batch, sizeof *lens);
    if (rows == NULL || lens == NULL) {
        st = kv_error_set(err, KV_ERR_INTERNAL, "out of memory");
        goto exit;
    }
    for (int64_t b = 0; b < batch; b++) {
        const cJSON *row = cJSON_GetArrayItem(root, (int)b);
        if (!cJSON_IsArray(row) || cJSON_GetArraySize(row) < 1) {
            st = kv_error_set(err, KV_ERR_INPUT, "%s: prompt %lld: expected a non-empty array of "
                              "token ids", path, (long long)b);
            goto exit;
        }
        lens[b] = cJSON_GetArraySize(row);
        rows[b] = malloc((size_t)lens[b] * sizeof(int32_t));
        if (rows[b] == NULL) {
            st = kv_error_set(err, KV_ERR_INTERNAL, "out of memory");
            goto exit;
        }
        for (int64_t i = 0; i < lens[b]; i++) {
            const cJSON *t = cJSON_GetArrayItem(row, (int)i);
            const double v = cJSON_IsNumber(t) ? t->valuedouble : -1.0;
            if (!cJSON_IsNumber(t) || v < 0.0 || v > 2147483647.0 || v != floor(v)) {
                st = kv_error_set(err, KV_ERR_INPUT, "%s: prompt %lld token %lld: expected a "
                                  "non-negative integer token id", path, (long long)b, (long long)i);
                goto exit;
            }
            rows[b][i] = (int32_t)v;
        }
    }
    st = kv_scenario_custom("prompts", (const int32_t *const *)rows, lens, batch, new_tokens, out,
                            err);
    goto exit;
read_fail:
    st = kv_error_set(err, KV_ERR_INPUT, "%s: cannot read: %s", path, strerror(errno));
exit:
    if (f != NULL) fclose(f);
    for (int64_t b = 0; rows != NULL && b < batch; b++) free(rows[b]);
    free(rows);
    free(lens);
    cJSON_Delete(root);
    free(text);
    return st;
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

/* Parses a comma-separated list of fault names ("all" too when allow_all):
 * ORs them into *bits (when bits is not NULL), else appends each distinct
 * fault's bit to list (*count entries, at most KV_FAULT_COUNT). Prints the
 * error and returns false on an unknown name or an empty list. */
static bool gate_parse_faults(const char *opt, const char *text, bool allow_all, unsigned *bits,
                              unsigned *list, int *count) {
    int n_all = 0;
    const KvFaultInfo *all = kv_fault_all(&n_all);
    char *copy = strdup(text);
    bool ok = copy != NULL && text[0] != '\0';
    for (char *tok = ok ? strtok(copy, ",") : NULL; ok && tok != NULL; tok = strtok(NULL, ",")) {
        const bool every = allow_all && strcmp(tok, "all") == 0;
        const KvFaultInfo *f = kv_fault_find(tok);
        if (!every && f == NULL) {
            ok = false;
            break;
        }
        for (int k = 0; k < n_all; k++) {
            if (!every && all[k].bit != f->bit) continue;
            if (bits != NULL) {
                *bits |= all[k].bit;
                continue;
            }
            bool seen = false;
            for (int j = 0; j < *count; j++) seen = seen || list[j] == all[k].bit;
            if (!seen) list[(*count)++] = all[k].bit;
        }
    }
    if (!ok) {
        char names[256];
        kv_fault_names(~0u, names, sizeof names);
        fprintf(stderr, "kvrepro gate: %s: expected a comma-separated list of %s%s, found '%s'\n",
                opt, names, allow_all ? " or all" : "", text);
    }
    free(copy);
    return ok;
}

/* Fills the report's root attributes (DESIGN §8). */
static void gate_report_root(KvReport *rep, const KvGateOptions *o, uint64_t seed) {
    snprintf(rep->tool_version, sizeof rep->tool_version, "%s", KV_VERSION);
    snprintf(rep->git_commit, sizeof rep->git_commit, "%s", KV_GIT_COMMIT);
    if (gethostname(rep->host, sizeof rep->host) != 0) snprintf(rep->host, sizeof rep->host, "unknown");
    rep->host[sizeof rep->host - 1] = '\0';
    KvCudaInfo info;
    KvError cerr = {{0}};
    if (kv_cuda_query(&info, &cerr) == KV_OK) {
        snprintf(rep->device, sizeof rep->device, "%.200s (sm_%d%d), driver %d, runtime %d",
                 info.name, info.cc_major, info.cc_minor, info.driver_version, info.runtime_version);
    } else {
        snprintf(rep->device, sizeof rep->device, "cpu only (%.200s)", cerr.msg);
    }
    snprintf(rep->math_mode, sizeof rep->math_mode, "fp32, -ffp-contract=off, no fast-math");
    rep->weight_seed = seed;
    rep->prompt_seed = o->prompt_seed;
    snprintf(rep->shard, sizeof rep->shard, "%d/%d", o->shard_i, o->shard_n);
}

int kv_cmd_gate(int argc, char **argv) {
    const char *models[KV_GATE_MAX_MODELS];
    bool model_is_dir[KV_GATE_MAX_MODELS];
    int n_models = 0;
    char *scen_items[KV_GATE_MAX_LIST], *var_items[KV_GATE_MAX_LIST];
    char *list_buf[4] = {NULL, NULL, NULL, NULL};
    int n_scen_items = -1, n_var_items = -1;
    const char *report_path = NULL, *junit_path = NULL, *prompts_path = NULL;
    uint64_t seed = KV_FIXTURE_DEFAULT_SEED, max_new = 0, u = 0;
    bool quiet = false, verbose = false, bad = false, mutation = false;
    KvMutationPass passes[1 + KV_FAULT_COUNT];
    int n_passes = 1;
    memset(passes, 0, sizeof passes);
    KvError err = {{0}};
    KvGateOptions o = {
        .cpu = true, .cuda = true, .eager = true, .graph = true, .repeats = 3,
        .replay_every = 5, .tol = kv_tolerances_default(),
        .prompt_seed = KV_FIXTURE_DEFAULT_SEED, .shard_i = 1, .shard_n = 1,
        .full_logits_max_vocab = KV_FULL_LOGITS_MAX_VOCAB,
    };
    for (int i = 1; i < argc && !bad; i++) {
        const char *v = NULL;
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            gate_usage(stdout);
            return KV_EXIT_PASS;
        } else if (strcmp(argv[i], "--quiet") == 0) {
            quiet = true;
        } else if (strcmp(argv[i], "--verbose") == 0) {
            verbose = true;
        } else if (strcmp(argv[i], "--timings") == 0) {
            o.timings = true;
        } else if (kv_cli_take(argc, argv, &i, "--model", &v, &bad) ||
                   kv_cli_take(argc, argv, &i, "--fixture", &v, &bad)) {
            if (bad) break;
            if (n_models == KV_GATE_MAX_MODELS) {
                fprintf(stderr, "kvrepro gate: at most %d models\n", KV_GATE_MAX_MODELS);
                bad = true;
                break;
            }
            /* kv_cli_take consumed "--model DIR" or "--model=DIR": look at
             * the option word it matched, not at the value. */
            const char *opt = argv[i] == v ? argv[i - 1] : argv[i];
            model_is_dir[n_models] = strncmp(opt, "--model", 7) == 0;
            models[n_models++] = v;
        } else if (kv_cli_take(argc, argv, &i, "--scenarios", &v, &bad)) {
            if (bad) break;
            free(list_buf[0]);
            list_buf[0] = strdup(v);
            n_scen_items = list_buf[0] ? gate_split(list_buf[0], scen_items, KV_GATE_MAX_LIST) : 0;
        } else if (kv_cli_take(argc, argv, &i, "--variants", &v, &bad)) {
            if (bad) break;
            free(list_buf[1]);
            list_buf[1] = strdup(v);
            n_var_items = list_buf[1] ? gate_split(list_buf[1], var_items, KV_GATE_MAX_LIST) : 0;
        } else if (kv_cli_take(argc, argv, &i, "--backends", &v, &bad)) {
            if (bad) break;
            o.cpu = strstr(v, "cpu") != NULL;
            o.cuda = strstr(v, "cuda") != NULL;
            if (!o.cpu && !o.cuda) {
                fprintf(stderr, "kvrepro gate: --backends: expected cpu and/or cuda, found '%s'\n", v);
                bad = true;
            }
        } else if (kv_cli_take(argc, argv, &i, "--modes", &v, &bad)) {
            if (bad) break;
            o.eager = strstr(v, "eager") != NULL;
            o.graph = strstr(v, "graph") != NULL;
            if (!o.eager && !o.graph) {
                fprintf(stderr, "kvrepro gate: --modes: expected eager and/or graph, found '%s'\n", v);
                bad = true;
            }
        } else if (kv_cli_take(argc, argv, &i, "--repeats", &v, &bad)) {
            bad = bad || !kv_cli_parse_u64("--repeats", v, &u);
            if (!bad && (u < 1 || u > 100)) {
                fprintf(stderr, "kvrepro gate: --repeats: expected 1..100, found %s\n", v);
                bad = true;
            }
            o.repeats = (int)u;
        } else if (kv_cli_take(argc, argv, &i, "--replay-every", &v, &bad)) {
            bad = bad || !kv_cli_parse_u64("--replay-every", v, &u);
            o.replay_every = (int64_t)u;
        } else if (kv_cli_take(argc, argv, &i, "--full-logits-max-vocab", &v, &bad)) {
            bad = bad || !kv_cli_parse_u64("--full-logits-max-vocab", v, &u);
            o.full_logits_max_vocab = (int64_t)u;
        } else if (kv_cli_take(argc, argv, &i, "--report", &v, &bad)) {
            report_path = v;
        } else if (kv_cli_take(argc, argv, &i, "--junit", &v, &bad)) {
            junit_path = v;
        } else if (kv_cli_take(argc, argv, &i, "--prompts", &v, &bad)) {
            prompts_path = v;
        } else if (kv_cli_take(argc, argv, &i, "--max-new-tokens", &v, &bad)) {
            bad = bad || !kv_cli_parse_u64("--max-new-tokens", v, &max_new);
        } else if (kv_cli_take(argc, argv, &i, "--seed", &v, &bad)) {
            bad = bad || !kv_cli_parse_u64("--seed", v, &seed);
        } else if (kv_cli_take(argc, argv, &i, "--prompt-seed", &v, &bad)) {
            bad = bad || !kv_cli_parse_u64("--prompt-seed", v, &o.prompt_seed);
        } else if (kv_cli_take(argc, argv, &i, "--tol", &v, &bad)) {
            if (!bad && kv_tolerances_set(&o.tol, v, &err) != KV_OK) {
                fprintf(stderr, "kvrepro gate: %s\n", err.msg);
                bad = true;
            }
        } else if (kv_cli_take(argc, argv, &i, "--shard", &v, &bad)) {
            int si = 0, sn = 0;
            char tail = 0;
            if (!bad && (sscanf(v, "%d/%d%c", &si, &sn, &tail) != 2 || sn < 1 || si < 1 || si > sn)) {
                fprintf(stderr, "kvrepro gate: --shard: expected I/N with 1 <= I <= N, found '%s'\n", v);
                bad = true;
            }
            o.shard_i = si;
            o.shard_n = sn;
        } else if (kv_cli_take(argc, argv, &i, "--fault", &v, &bad)) {
            if (bad) break;
            bad = !gate_parse_faults("--fault", v, false, &o.faults, NULL, NULL);
        } else if (kv_cli_take(argc, argv, &i, "--faults", &v, &bad)) {
            if (bad) break;
            mutation = true;
            unsigned list[KV_FAULT_COUNT];
            int n_list = 0;
            bad = !gate_parse_faults("--faults", v, true, NULL, list, &n_list);
            n_passes = 1 + n_list; /* passes[0] is the clean pass */
            for (int k = 0; k < n_list; k++) passes[1 + k].faults = list[k];
        } else {
            fprintf(stderr, "kvrepro gate: unknown option '%s'\n", argv[i]);
            bad = true;
        }
    }
    if (!bad && mutation && o.faults != 0) {
        fprintf(stderr, "kvrepro gate: --fault and --faults exclude each other\n");
        bad = true;
    }
    if (!bad && mutation && junit_path != NULL) {
        fprintf(stderr, "kvrepro gate: --junit describes one gate, not a mutation score; drop it "
                "or run the gate without --faults\n");
        bad = true;
    }
    if (!bad && prompts_path != NULL && max_new == 0) {
        fprintf(stderr, "kvrepro gate: --prompts needs --max-new-tokens N (N >= 1)\n");
        bad = true;
    }

    /* Scenario and variant names are checked before anything runs. */
    const char *scen_names[KV_GATE_MAX_LIST];
    const KvCacheOps *variants[KV_GATE_MAX_LIST];
    int n_known = 0;
    const char *const *known = kv_scenario_names(&n_known);
    if (!bad) {
        if (n_scen_items < 0) {
            for (int i = 0; i < n_known; i++) scen_names[i] = known[i];
            o.n_scenarios = n_known;
        } else {
            for (int i = 0; i < n_scen_items && !bad; i++) {
                bool ok = false;
                for (int k = 0; k < n_known; k++) ok = ok || strcmp(known[k], scen_items[i]) == 0;
                if (!ok) {
                    fprintf(stderr, "kvrepro gate: --scenarios: unknown scenario '%s'\n", scen_items[i]);
                    bad = true;
                }
                scen_names[i] = scen_items[i];
            }
            o.n_scenarios = n_scen_items;
        }
        o.scenarios = scen_names;
        int n_all = 0;
        const KvCacheOps *const *all = kv_cache_all(&n_all);
        if (n_var_items < 0) {
            for (int i = 0; i < n_all; i++) variants[i] = all[i];
            o.n_variants = n_all;
        } else {
            for (int i = 0; i < n_var_items && !bad; i++) {
                variants[i] = kv_cache_find(var_items[i]);
                if (variants[i] == NULL) {
                    fprintf(stderr, "kvrepro gate: --variants: unknown variant '%s'; expected "
                            "index_copy, cat_shift, roll, always_roll, ring or dynamic\n", var_items[i]);
                    bad = true;
                }
            }
            o.n_variants = n_var_items;
        }
        o.variants = variants;
    }
    if (bad) {
        free(list_buf[0]);
        free(list_buf[1]);
        gate_usage(stderr);
        return KV_EXIT_USAGE;
    }
    o.progress = !quiet && isatty(STDERR_FILENO);
    int64_t runs_done = 0;
    o.runs_done = &runs_done;
    o.started = kv_gate_now();

    KvReport rep;
    memset(&rep, 0, sizeof rep);
    KvScenario custom = {0};
    KvStatus st = KV_OK;
    int rc = KV_EXIT_PASS;
    if (prompts_path != NULL) {
        st = gate_load_prompts(prompts_path, (int64_t)max_new, &custom, &err);
        if (st != KV_OK) goto done;
        o.custom = &custom;
    }
    gate_report_root(&rep, &o, seed);
    st = kv_tolerances_record(&o.tol, &rep, &err);
    if (st != KV_OK) goto done;
    if (!quiet) {
        printf("%s gate\n", kv_cli_version());
#ifdef _OPENMP
        printf("cpu: reference, %d OpenMP threads; device: %s\n", omp_get_max_threads(), rep.device);
#else
        printf("cpu: reference, single-threaded; device: %s\n", rep.device);
#endif
        printf("seeds: weights %llu, prompts %llu; tolerances: max_rel_err %g, tie_margin %g; "
               "shard %s\n",
               (unsigned long long)seed, (unsigned long long)o.prompt_seed, o.tol.max_rel_err,
               o.tol.tie_margin, rep.shard);
    }
    static const char *const k_default_models[] = {"gemma2-tiny", "mistral-tiny"};
    if (n_models == 0) {
        models[0] = k_default_models[0];
        models[1] = k_default_models[1];
        model_is_dir[0] = model_is_dir[1] = false;
        n_models = 2;
    }
    {
        /* Units (model, scenario) in this shard, for the progress total. */
        const int per_model = o.custom != NULL ? 1 : o.n_scenarios;
        int64_t units = 0;
        for (int u = 0; u < n_models * per_model; u++) units += u % o.shard_n == o.shard_i - 1;
        o.runs_total = units * kv_gate_runs_per_unit(&o) * n_passes;
    }
    if (!mutation) passes[0].faults = o.faults;
    for (int p = 0; p < n_passes; p++) passes[p].first_fail = -1;
    int unit = 0;
    for (int i = 0; i < n_models && st == KV_OK; i++) {
        KvModel dir_model = {0};
        KvFixtureModel fx = {0};
        const KvModel *m = NULL;
        const char *name = models[i];
        if (model_is_dir[i]) {
            st = kv_model_load_dir(models[i], &dir_model, &err);
            m = &dir_model;
            const char *slash = strrchr(models[i], '/');
            if (slash != NULL && slash[1] != '\0') name = slash + 1;
        } else {
            st = kv_fixture_load(models[i], seed, &fx, &err);
            m = &fx.model;
        }
        if (st == KV_OK) {
            const uint64_t mh = kv_model_hash(m);
            if (i == 0) rep.model_hash = mh;
            if (!quiet) {
                printf("model %s: %s, %lld layers, window %lld, weights fnv1a64 0x%016" PRIx64 "\n",
                       name, m->config.model_type, (long long)m->config.num_layers,
                       (long long)m->config.sliding_window, mh);
            }
            if (o.custom != NULL) {
                for (int64_t k = 0; k < custom.batch * custom.prompt_len && st == KV_OK; k++) {
                    if (custom.prompt[k] >= m->config.vocab_size) {
                        st = kv_error_set(&err, KV_ERR_INPUT, "%s: token id %d is outside the "
                                          "vocabulary of %s (%lld)", prompts_path, custom.prompt[k],
                                          models[i], (long long)m->config.vocab_size);
                    }
                }
            }
            /* Every pass runs the same (model, scenario) units, so a shard
             * holds the same units clean and faulty. */
            const int unit_base = unit;
            for (int p = 0; p < n_passes && st == KV_OK; p++) {
                unit = unit_base;
                o.faults = passes[p].faults;
                const int64_t from = rep.n_comparisons;
                st = kv_gate_run_model(m, name, &o, &unit, &rep, &err);
                kv_mutation_account(&passes[p], &rep, from, rep.n_comparisons);
            }
        }
        kv_model_free(&dir_model);
        kv_fixture_free(&fx);
    }
    if (st != KV_OK) goto done;

    bool failed = false;
    for (int64_t c = 0; c < rep.n_comparisons; c++) {
        /* In a mutation run the faulty passes are meant to fail: only the
         * clean runs' failures (false alarms) are listed unless --verbose. */
        const bool planted = mutation && rep.runs[rep.comparisons[c].run_b].fault[0] != '\0';
        failed = failed || rep.comparisons[c].verdict == KV_VERDICT_FAIL;
        if (verbose || (!quiet && !planted && rep.comparisons[c].verdict == KV_VERDICT_FAIL)) {
            const KvComparison *cmp = &rep.comparisons[c];
            char la[96], lb[96], pair[200];
            kv_run_label(&rep.runs[cmp->run_a], la, sizeof la);
            kv_run_label(&rep.runs[cmp->run_b], lb, sizeof lb);
            /* a per-run check (finite, replay) names its one run */
            if (cmp->run_a == cmp->run_b) snprintf(pair, sizeof pair, "%s", lb);
            else snprintf(pair, sizeof pair, "%s vs %s", la, lb);
            printf("%s %s %s: %s %s: %s\n", cmp->verdict == KV_VERDICT_FAIL ? "FAIL" : "ok  ",
                   rep.runs[cmp->run_b].model, rep.runs[cmp->run_b].scenario, pair,
                   kv_compare_kind_name(cmp->kind), cmp->message);
        }
    }
    if (mutation) {
        /* The per-run table of a mutation run is thousands of lines: the
         * report and `kvrepro show` have it; --verbose prints it. */
        st = verbose ? kv_report_print_summary(&rep, stdout) : KV_OK;
        if (st == KV_OK) st = kv_mutation_print(passes, n_passes, &rep, stdout);
        failed = kv_mutation_caught(passes, n_passes) < n_passes - 1 || passes[0].failed > 0;
    } else {
        st = kv_report_print_summary(&rep, stdout);
    }
    if (st != KV_OK) {
        kv_error_set(&err, st, "cannot print the summary table");
        goto done;
    }
    if (report_path != NULL) {
        st = kv_report_write_h5(&rep, report_path, &err);
        if (st != KV_OK) goto done;
        if (!quiet) printf("report: %s\n", report_path);
    }
    if (junit_path != NULL) {
        st = kv_junit_write(&rep, junit_path, &err);
        if (st != KV_OK) goto done;
        if (!quiet) printf("junit: %s\n", junit_path);
    }
    rc = failed ? KV_EXIT_GATE_FAIL : KV_EXIT_PASS;
done:
    if (st != KV_OK) {
        fprintf(stderr, "kvrepro gate: %s\n", err.msg);
        rc = kv_gate_exit_code(st);
    }
    kv_scenario_free(&custom);
    kv_report_free(&rep);
    free(list_buf[0]);
    free(list_buf[1]);
    return rc;
}
