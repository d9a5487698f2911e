/* cmd_gate.c: `kvrepro gate`: the CI gate (DESIGN §4-§8). Runs the matrix
 * of scenarios x variants x backends x modes x repeats for each model,
 * compares every run, prints the summary table, writes the HDF5 report and
 * JUnit XML when asked, then (only once they are written) the count line,
 * and exits 0 (all pass), 1 (a comparison failed), 2 (bad input or usage,
 * an output file that cannot be written included) or 3 (internal error). */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <inttypes.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backends.h"
#include "cache_registry.h"
#include "cli.h"
#include "compare.h"
#include "ensemble.h"
#include "fault.h"
#include "fixture.h"
#include "forward.h"
#include "gate_external.h"
#include "gate_output.h"
#include "gate_verdict.h"
#include "golden.h"
#include "kv_limits.h"
#include "matrix.h"
#include "model.h"
#include "mutation.h"
#include "prompts.h"
#include "rate.h"
#include "report.h"
#include "scenario.h"
#include "shard_env.h"

#ifdef _OPENMP
#include <omp.h>
#endif

#define KV_GATE_MAX_MODELS 8
/* config.json read again for its list of windows: transformers' configs are
 * a few KB; the loader's own bound is larger, and it has read the file. */
#define KV_GATE_CONFIG_MAX_BYTES (1 << 20)
/* Freed heap memory the gate keeps for its next runs (gate_tune_malloc). */
#define KV_GATE_HEAP_KEEP (256 << 20)
#define KV_GATE_MAX_LIST 16
/* --external files per gate: far more than one engine's modes and repeats
 * need (each file may hold many runs). */
#define KV_GATE_MAX_EXTERNAL 256

/* A decode longer than the report's step limit could not be written or read
 * back (kv_limits.h, one table for the gate, the writer and the reader). */
#define KV_GATE_MAX_NEW_TOKENS ((uint64_t)KV_REPORT_MAX_STEPS)

/* The run modes, in the order --modes indexes them (0 eager, 1 graph). */
static const char *const k_gate_modes[] = {"eager", "graph"};

/* Prints one option of the help: "  OPT  " then text, folded to the page at
 * column 20; a list (which >= 0) follows the text, then tail. Every list is
 * read from its registry (kv_cli_names), never typed here. */
static void gate_help_opt(FILE *f, const char *opt, const char *text, int which,
                          const char *last_sep, const char *tail) {
    int col = fprintf(f, "  %-16s  ", opt);
    kv_cli_print_text(f, &col, 20, text);
    if (which >= 0) kv_cli_print_list(f, &col, 20, (KvCliNames)which, last_sep);
    if (tail != NULL) kv_cli_print_text(f, &col, 20, tail);
    fputc('\n', f);
}

static void gate_usage(FILE *f) {
    char t[768];
    fprintf(f,
            "usage: kvrepro gate [--model DIR | --fixture NAME]... [--scenarios LIST]\n"
            "                    [--variants LIST] [--backends LIST] [--modes LIST]\n"
            "                    [--repeats N] [--report PATH.h5] [--junit PATH.xml]\n"
            "                    [--shard I/N|auto] [--tol NAME=VALUE]... [--prompts FILE\n"
            "                    --max-new-tokens N] [--seed N] [--prompt-seed N]\n"
            "                    [--replay-every N] [--plant LIST | --faults LIST|all\n"
            "                    [--first-catch]]\n"
            "                    [--timings] [--allow-large-work] [--no-calibrate]\n"
            "                    [--no-shared-prefill] [--table] [--summary-md FILE]\n"
            "                    [--summary-json FILE] [--quiet | --verbose]\n"
            "       kvrepro gate --model DIR --external RUN.h5 [--external RUN.h5]...\n"
            "                    [--report PATH.h5] [--junit PATH.xml] [--tol NAME=VALUE]...\n"
            "                    [--no-calibrate] [--quiet | --verbose]\n"
            "       kvrepro gate --model DIR --golden GOLDEN.h5 [--report PATH.h5]\n"
            "                    [--junit PATH.xml] [--tol NAME=VALUE]...\n"
            "                    [--quiet | --verbose]\n\n"
            "Runs the reference and every selected cache variant on every scenario, compares\n"
            "them (reference agreement within tolerances; repeats, graph vs eager, variant vs\n"
            "variant and replays bitwise), and prints the verdict on one screen: a model x\n"
            "scenario grid of runs passed/failed/skipped, each failure with the command that\n"
            "bisects it, the skipped runs grouped by reason, and a final\n"
            "'N passed, N failed, N skipped' line (runs).\n\n");
    gate_help_opt(f, "--model DIR", "a Hugging Face checkpoint directory whose config.json's "
                  "model_type is", KV_NAMES_MODEL_TYPES, "or",
                  " (llama is read as mistral)");
    gate_help_opt(f, "--fixture NAME", "a built-in fixture, built in memory:", KV_NAMES_FIXTURES,
                  NULL, NULL);
    gate_help_opt(f, "", "(default: the tiny ones:", KV_NAMES_FIXTURES_DEFAULT, NULL, ")");
    {
        /* the model_type spelling of the fixtures named by a short form */
        const char *alias[KV_CLI_MAX_NAMES];
        const int n_alias = kv_cli_names(KV_NAMES_FAMILY_ALIASES, alias, KV_CLI_MAX_NAMES);
        for (int k = 0; k < n_alias && k < KV_CLI_MAX_NAMES; k++) {
            int value = 0;
            if (!kv_cli_family(alias[k], &value)) continue;
            snprintf(t, sizeof t, "(%s-SIZE may be written %s-SIZE, the family's model_type)",
                     alias[k], kv_family_name((KvFamily)value));
            gate_help_opt(f, "", t, -1, NULL, NULL);
        }
    }
    gate_help_opt(f, "--scenarios LIST", "comma-separated, default:", KV_NAMES_SCENARIOS_DEFAULT,
                  NULL, ";");
    gate_help_opt(f, "", "`extended` adds", KV_NAMES_SCENARIOS_EXTENDED, "and",
                  " (--faults runs them too)");
    gate_help_opt(f, "--variants LIST", "default all:", KV_NAMES_VARIANTS, NULL, NULL);
    {
        /* the lane's names for the same layouts, each with its variant */
        int n_alias = 0;
        const KvCacheAlias *al = kv_cache_aliases(&n_alias);
        char t2[512] = "also the lane's names for the same layouts:";
        size_t used = strlen(t2);
        for (int k = 0; k < n_alias && used < sizeof t2; k++) {
            const int w = snprintf(t2 + used, sizeof t2 - used, "%s %s (%s)",
                                   k == 0 ? "" : k + 1 == n_alias ? " and" : ",", al[k].alias,
                                   al[k].ops->name);
            used += w > 0 ? (size_t)w : 0;
        }
        gate_help_opt(f, "", t2, -1, NULL, "; the report records the variant's own name");
    }
    gate_help_opt(f, "--backends LIST", "default every backend built:", KV_NAMES_BACKENDS, "and",
                  " (the runs of one that cannot run here are reported as skipped, with "
                  "the reason)");
    int col = fprintf(f, "  %-16s  default all:", "--modes LIST");
    kv_cli_print_names(f, &col, 20, k_gate_modes, 2, NULL);
    fputc('\n', f);
    gate_help_opt(f, "--repeats N", "runs per (variant, mode), compared bitwise (default 3)", -1,
                  NULL, NULL);
    gate_help_opt(f, "--report PATH", "write the HDF5 report (docs/SCHEMA.md)", -1, NULL, NULL);
    gate_help_opt(f, "--junit PATH", "write JUnit XML", -1, NULL, NULL);
    gate_help_opt(f, "--shard I/N", "run the I-th of N shards of the (model, scenario) units "
                  "(unit u when u % N == I - 1); `kvrepro merge` joins the N reports", -1, NULL,
                  NULL);
    gate_help_opt(f, "--goldens DIR", "where the transformers goldens are (default: this source "
                  "tree's fixtures/hf, or $KVREPRO_SOURCE_DIR/fixtures/hf)", -1, NULL, NULL);
    snprintf(t, sizeof t, "judge the reference on --model DIR against transformers' greedy "
             "decodes of it recorded in FILE (fixtures/hf/README.md's golden layout, e.g. "
             "written by fixtures/real/generate.py), instead of running the matrix: each "
             "batch teacher-forced with transformers' tokens, every logit of every row within "
             "max_rel_err (%g, or, where the golden records its own error against float64, "
             "%g x the sum of that and the reference's against its fp64 shadow, if larger) "
             "and tie_margin %g, unless --tol says otherwise; each row of a batch bitwise the "
             "row decoded alone", KV_GOLDEN_MAX_REL_ERR, KV_GOLDEN_BOUND_MULT,
             KV_GOLDEN_TIE_MARGIN);
    gate_help_opt(f, "--golden FILE", t, -1, NULL, NULL);
    gate_help_opt(f, "--no-goldens", "do not judge the reference against transformers' goldens "
                  "(by default each built-in fixture's family is)", -1, NULL, NULL);
    gate_help_opt(f, "--allow-empty", "accept a shard that holds no unit (exit 0, said so); "
                  "without it a gate that judged nothing fails", -1, NULL, NULL);
    gate_help_opt(f, "--shard auto", "take I/N from the environment, the first set of: "
                  "KVREPRO_SHARD=I/N; a Slurm array task (I = SLURM_ARRAY_TASK_ID - "
                  "SLURM_ARRAY_TASK_MIN + 1, N = SLURM_ARRAY_TASK_COUNT, or MAX - MIN + 1; no "
                  "step); a GitLab parallel job (I = CI_NODE_INDEX, N = CI_NODE_TOTAL). The log "
                  "names the variables used", -1, NULL, NULL);
    snprintf(t, sizeof t, "max_rel_err (default: calibrated per model and scenario, %d x the "
             "spread of the reference under %d other valid reduction orders), tie_margin "
             "(default %g); an explicit value overrides and is recorded", KV_CAL_SPREAD_MULT,
             KV_ENSEMBLE_SIZE, KV_TOL_TIE_MARGIN);
    gate_help_opt(f, "--tol NAME=VALUE", t, -1, NULL, NULL);
    snprintf(t, sizeof t, "no ensemble: max_rel_err is then %g unless --tol sets it",
             KV_TOL_MAX_REL_ERR);
    gate_help_opt(f, "--no-calibrate", t, -1, NULL, NULL);
    gate_help_opt(f, "--no-shared-prefill", "every CPU variant run computes its own first "
                  "prefill forward; by default each takes the reference's (the same "
                  "computation up to the variant's cache write, which still runs on its own "
                  "buffers)", -1, NULL, NULL);
    gate_help_opt(f, "--prompts FILE", "a JSON array of token-id arrays, or a {\"format\": "
                  "\"kvrepro-prompts\", ...} object with the texts (kvrepro-hf prompts writes "
                  "it), run as one left-padded batch instead of the scenarios; needs "
                  "--max-new-tokens N", -1, NULL, NULL);
    gate_help_opt(f, "--max-new-tokens N", "tokens each --prompts row decodes; with the "
                  "scenarios, the most each decodes (3 x W past the window at W <= 32, 8 past the "
                  "crossing above)", -1,
                  NULL, NULL);
    snprintf(t, sizeof t, "run a matrix above %.0f TFLOP of CPU work (the gate states the work "
             "before it starts and refuses more without this)", KV_GATE_MAX_WORK_FLOP / 1e12);
    gate_help_opt(f, "--allow-large-work", t, -1, NULL, NULL);
    gate_help_opt(f, "--table", "print the per-run table too (one line per run, before the "
                  "grid; kvrepro show REPORT.h5 prints it from a report)", -1, NULL, NULL);
    gate_help_opt(f, "--summary-md FILE", "the verdict (counts, grid, failures with their "
                  "bisect commands, skips) as Markdown, e.g. for $GITHUB_STEP_SUMMARY", -1, NULL,
                  NULL);
    gate_help_opt(f, "--summary-json FILE", "the same as JSON for scripts (docs/SCHEMA.md, "
                  "kvrepro-summary)", -1, NULL, NULL);
    gate_help_opt(f, "--quiet", "print only the failures and the final count line", -1, NULL,
                  NULL);
    snprintf(t, sizeof t, "fixture weight seed (default %llu)",
             (unsigned long long)KV_FIXTURE_DEFAULT_SEED);
    gate_help_opt(f, "--seed N", t, -1, NULL, NULL);
    snprintf(t, sizeof t, "scenario prompt seed (default %llu)",
             (unsigned long long)KV_FIXTURE_DEFAULT_SEED);
    gate_help_opt(f, "--prompt-seed N", t, -1, NULL, NULL);
    gate_help_opt(f, "--replay-every N", "replay-check every N-th decode step (default 5, 0 = "
                  "off)", -1, NULL, NULL);
    gate_help_opt(f, "--plant LIST", "plant these faults (comma-separated) in every candidate "
                  "run (the gate must then fail):", KV_NAMES_FAULTS, NULL,
                  "; --fault LIST is its older name");
    gate_help_opt(f, "--faults LIST|all", "mutation score: the matrix once clean and once per "
                  "fault, into one report; prints per fault whether and how the gate caught it, "
                  "'mutation score: C/P' and 'false alarms: N'; exits 1 unless every fault was "
                  "caught with no false alarm", -1, NULL, NULL);
    gate_help_opt(f, "--first-catch", "with --faults: each fault's pass stops at the first "
                  "comparison that catches it and takes the clean pass's per-model tolerance; "
                  "the clean pass still runs in full; the score is the same, 'by' names the "
                  "checks that caught it, and the runs not made are counted (the work line is "
                  "then a bound)", -1, NULL, NULL);
    gate_help_opt(f, "--external FILE", "judge the runs another engine recorded in FILE (report "
                  "schema, docs/SCHEMA.md; repeatable) instead of running the matrix: the CPU "
                  "reference decodes their prompts with --model DIR, and each run is compared "
                  "with it (within tolerances, tie-aware), with its repeat 0 (bitwise), its "
                  "eager mode (within tolerances) and its graph budget; max_rel_err is "
                  "calibrated per prompt batch as above (--tol, --no-calibrate apply); no "
                  "scenario, variant, backend, mode, repeat, prompts, fault or shard option may "
                  "be given with it", -1, NULL, NULL);
    gate_help_opt(f, "--timings", "keep the runs' wall times in the HDF5 report too (it is "
                  "then not byte-reproducible; JUnit always has them)", -1, NULL, NULL);
    snprintf(t, sizeof t, "above this vocabulary (default %d), and in planted-fault passes, "
             "the report keeps each row's top-%d logits and the hash of the full row, except "
             "for the reference runs and every run that failed a tolerance or finite "
             "comparison (full rows); comparisons always use the full logits",
             KV_FULL_LOGITS_MAX_VOCAB, KV_TOPK);
    gate_help_opt(f, "--full-logits-max-vocab N", t, -1, NULL, NULL);
    col = fprintf(f, "Comparisons, as the summary, the report and JUnit name them:");
    kv_cli_print_list(f, &col, 2, KV_NAMES_KINDS, NULL);
    fprintf(f, ".\n"
            "Exit codes: 0 pass, 1 gate failure, 2 bad input or usage, 3 internal error.\n"
            "A gate that judged no candidate run, or made fewer runs than it planned (other\n"
            "than runs skipped with a stated reason), fails (exit 1) and says so.\n");
}

/* Parses a comma-separated list of names, each exactly one of known[0..n_known)
 * and none twice, into picked[] (indices into known, in the order given;
 * *n_picked of them). An empty list, an empty item, an unknown name or a
 * repeat prints "kvrepro gate: OPT: ..." with the known names and returns
 * false: a selection that runs nothing, or something other than what was
 * asked, must never pass the gate. */
static bool gate_parse_names(const char *opt, const char *text, const char *const *known,
                             int n_known, int *picked, int *n_picked) {
    *n_picked = 0;
    const char *p = text;
    char why[160] = "";
    for (;;) {
        const char *end = strchr(p, ',');
        const size_t len = end != NULL ? (size_t)(end - p) : strlen(p);
        int k = 0;
        while (k < n_known && !(strlen(known[k]) == len && strncmp(known[k], p, len) == 0)) k++;
        if (len == 0) {
            snprintf(why, sizeof why, "an empty name");
        } else if (k == n_known) {
            snprintf(why, sizeof why, "unknown name '%.*s'", (int)(len < 64 ? len : 64), p);
        } else {
            for (int j = 0; j < *n_picked && why[0] == '\0'; j++) {
                if (picked[j] == k) snprintf(why, sizeof why, "'%s' given twice", known[k]);
            }
        }
        if (why[0] != '\0') break;
        picked[(*n_picked)++] = k;
        if (end == NULL) return true;
        p = end + 1;
    }
    int col = fprintf(stderr, "kvrepro gate: %s '%s': %s; expected a comma-separated list of:",
                      opt, text, why);
    kv_cli_print_names(stderr, &col, -1, known, n_known, NULL);
    /* --scenarios also takes `extended`, alone */
    fprintf(stderr, "%s\n", strcmp(opt, "--scenarios") == 0 ? ", or extended" : "");
    return false;
}

/* --variants: a comma-separated list of variant names or aliases
 * (kv_cache_find_typed: the lane's names for the same layout), none naming
 * a variant twice, into picked[] (the variants, in the order given). An
 * empty list or item, an unknown name or a variant named twice (also by an
 * alias and its variant) prints the error with the names and aliases and
 * returns false, as gate_parse_names. */
static bool gate_parse_variants(const char *text, const KvCacheOps **picked, int *n_picked) {
    *n_picked = 0;
    char why[200] = "";
    for (const char *p = text;;) {
        const char *end = strchr(p, ',');
        const size_t len = end != NULL ? (size_t)(end - p) : strlen(p);
        char name[KV_NAME_LEN];
        snprintf(name, sizeof name, "%.*s", (int)(len < sizeof name - 1 ? len : sizeof name - 1), p);
        const KvCacheAlias *alias = NULL;
        const KvCacheOps *ops = len < sizeof name ? kv_cache_find_typed(name, &alias) : NULL;
        if (len == 0) {
            snprintf(why, sizeof why, "an empty name");
        } else if (ops == NULL) {
            snprintf(why, sizeof why, "unknown name '%.*s'", (int)(len < 64 ? len : 64), p);
        } else if (*n_picked == KV_GATE_MAX_LIST) {
            snprintf(why, sizeof why, "more names than there are variants");
        } else {
            for (int j = 0; j < *n_picked && why[0] == '\0'; j++) {
                if (picked[j] != ops) continue;
                if (alias != NULL) {
                    snprintf(why, sizeof why, "'%s' given twice ('%s' is %s)", ops->name, name, ops->name);
                } else {
                    snprintf(why, sizeof why, "'%s' given twice", name);
                }
            }
        }
        if (why[0] != '\0') break;
        picked[(*n_picked)++] = ops;
        if (end == NULL) return true;
        p = end + 1;
    }
    int col = fprintf(stderr, "kvrepro gate: --variants '%s': %s; expected a comma-separated list "
                      "of:", text, why);
    kv_cli_print_list(stderr, &col, -1, KV_NAMES_VARIANTS, NULL);
    int n_alias = 0;
    const KvCacheAlias *al = kv_cache_aliases(&n_alias);
    fprintf(stderr, " (or the lane's names for the same layouts:");
    for (int k = 0; k < n_alias; k++) {
        fprintf(stderr, "%s %s = %s", k > 0 ? "," : "", al[k].alias, al[k].ops->name);
    }
    fprintf(stderr, ")\n");
    return false;
}

/* Parses an integer option in [lo, hi]; prints the bound when outside. */
static bool gate_parse_bounded(const char *opt, const char *text, uint64_t lo, uint64_t hi,
                               const char *why, uint64_t *out) {
    if (!kv_cli_parse_u64(opt, text, out)) return false;
    if (*out < lo || *out > hi) {
        fprintf(stderr, "kvrepro gate: %s: expected %llu..%llu (%s), found %s\n", opt,
                (unsigned long long)lo, (unsigned long long)hi, why, text);
        return false;
    }
    return true;
}

/* Parses a comma-separated list of fault names ("all" alone too when
 * allow_all): ORs them into *bits (when bits is not NULL), else appends
 * each fault's bit to list (*count entries, at most KV_FAULT_COUNT). An
 * empty list or item, an unknown name or a name given twice prints the
 * error and returns false: a fault list that is not what was meant must not
 * run quietly as something else. */
static bool gate_parse_faults(const char *opt, const char *text, bool allow_all, unsigned *bits,
                              unsigned *list, int *count) {
    int n_all = 0;
    const KvFaultInfo *all = kv_fault_all(&n_all);
    char why[160] = "";
    unsigned seen = 0, given[32];
    int n_given = 0;
    const bool every = allow_all && strcmp(text, "all") == 0;
    for (const char *p = text; !every && why[0] == '\0';) {
        const char *end = strchr(p, ',');
        const size_t len = end != NULL ? (size_t)(end - p) : strlen(p);
        char name[64];
        snprintf(name, sizeof name, "%.*s", (int)(len < 63 ? len : 63), p);
        const KvFaultInfo *f = len > 0 && len < 63 ? kv_fault_find(name) : NULL;
        if (len == 0) {
            snprintf(why, sizeof why, "an empty name");
        } else if (f == NULL) {
            snprintf(why, sizeof why, "unknown name '%s'%s", name,
                     allow_all && strcmp(name, "all") == 0 ? " (all stands alone)" : "");
        } else if (seen & f->bit) {
            snprintf(why, sizeof why, "'%s' given twice", name);
        } else if (n_given == 32) {
            snprintf(why, sizeof why, "more names than there are faults");
        } else {
            seen |= f->bit;
            given[n_given++] = f->bit;
        }
        if (end == NULL) break;
        p = end + 1;
    }
    if (why[0] != '\0') {
        /* every name of the catalog, however many: no buffer to outgrow */
        int col = fprintf(stderr, "kvrepro gate: %s '%s': %s; expected a comma-separated list of",
                          opt, text, why);
        kv_cli_print_list(stderr, &col, -1, KV_NAMES_FAULTS, NULL);
        fprintf(stderr, "%s\n", allow_all ? ", or all" : "");
        return false;
    }
    /* the faults in the order given (all: the table's) */
    for (int k = 0; every && k < n_all; k++) given[n_given++] = all[k].bit;
    for (int k = 0; k < n_given; k++) {
        if (bits != NULL) *bits |= given[k];
        else list[(*count)++] = given[k];
    }
    return true;
}

/* Asks every registered backend once whether it can run here. The report's
 * device is the first device backend that can ("cpu only (why not)" when
 * none can); a selected backend that cannot run gets its skip reason, so
 * its runs are recorded as skipped; one that is there but unusable (a GPU
 * this build cannot use) is an error. */
static KvStatus gate_query_backends(KvGateOptions *o, KvReport *rep, KvError *err) {
    int n_all = 0;
    const KvBackendOps *const *all = kv_backend_all(&n_all);
    char why_not[256] = "";
    rep->device[0] = '\0';
    for (int k = 0; k < n_all; k++) {
        char device[256] = "";
        KvError qerr = {{0}};
        const KvStatus st = all[k]->query(device, sizeof device, &qerr);
        KvGateBackend *gb = NULL;
        for (int i = 0; i < o->n_backends; i++) {
            if (o->backends[i].ops == all[k]) gb = &o->backends[i];
        }
        if (st != KV_OK && st != KV_SKIP && gb != NULL) {
            return kv_error_set(err, st, "%s backend: %s", all[k]->name, qerr.msg);
        }
        if (st != KV_OK && gb != NULL) snprintf(gb->skip, sizeof gb->skip, "%.250s", qerr.msg);
        if (all[k]->host) continue;
        if (st == KV_OK && rep->device[0] == '\0') {
            snprintf(rep->device, sizeof rep->device, "%s", device);
        } else if (st != KV_OK && why_not[0] == '\0') {
            snprintf(why_not, sizeof why_not, "%.250s", qerr.msg);
        }
    }
    if (rep->device[0] == '\0') {
        snprintf(rep->device, sizeof rep->device, "cpu only (%.200s)", why_not);
    }
    return KV_OK;
}

/* Everything the command line says, checked before anything runs. */
typedef struct {
    const char *models[KV_GATE_MAX_MODELS];
    bool model_is_dir[KV_GATE_MAX_MODELS];
    int n_models;
    const char *report_path, *junit_path, *prompts_path;
    const char *summary_md, *summary_json; /* --summary-md, --summary-json, or NULL */
    const char *plant_opt;     /* "--plant" or its older name "--fault", as typed; NULL:
                                * neither given */
    char fixture_names[KV_GATE_MAX_MODELS][KV_NAME_LEN]; /* a --fixture typed by an alias,
                                                         * under its own name */
    uint64_t seed, max_new;
    bool quiet, verbose, table, mutation, allow_large, allow_empty;
    bool no_goldens;           /* --no-goldens: the reference is not judged against
                                * transformers */
    const char *goldens_root;  /* --goldens DIR, or NULL: kv_golden_default_root */
    const char *golden_families[KV_GATE_MAX_MODELS]; /* the families of the built-in
                                                      * fixtures gated, each once */
    int n_golden;
    KvMutationPass passes[1 + KV_FAULT_COUNT];
    int n_passes;
    bool first_catch;          /* --first-catch: a fault's pass stops at its first catch */
    int64_t runs_stopped;      /* planned runs of this shard that fault passes did not make,
                                * having stopped (o->runs_stopped) */
    const char *scen_names[KV_GATE_MAX_LIST];
    const KvCacheOps *variants[KV_GATE_MAX_LIST];
    KvGateBackend backends[KV_GATE_MAX_LIST]; /* o->backends points here */
    const char *externals[KV_GATE_MAX_EXTERNAL]; /* --external files, in order */
    const char *golden_path;  /* --golden FILE: the reference judged against it alone */
    bool tie_margin_set;      /* --tol tie_margin=... given */
    int n_external;
    const char *matrix_opt;  /* the first option given that shapes the matrix (or picks a
                              * fixture): refused with --external, which runs none */
    char shard_source[sizeof ((KvShard *)0)->source]; /* the variables --shard auto took
                                                        * the shard from; "" otherwise */
} GateArgs;

/* Records opt as the first matrix option given (for the refusal with
 * --external). */
static void gate_note_matrix_opt(GateArgs *a, const char *opt) {
    if (a->matrix_opt == NULL) a->matrix_opt = opt;
}

/* --external judges recorded runs: the options that shape a matrix would
 * be silently ignored, so they are refused, and the runs need exactly the
 * one checkpoint they decoded. Prints the problem; false when refused. */
static bool gate_check_external_args(const GateArgs *a) {
    if (a->n_external == 0) return true;
    if (a->matrix_opt != NULL) {
        fprintf(stderr, "kvrepro gate: %s cannot be used with --external: the external gate runs "
                "no cache variants and no scenarios (it decodes the recorded prompts with the "
                "CPU reference)\n", a->matrix_opt);
        return false;
    }
    if (a->n_models != 1) {
        fprintf(stderr, "kvrepro gate: --external needs exactly one --model DIR, the checkpoint "
                "the external runs decoded; found %d\n", a->n_models);
        return false;
    }
    return true;
}

/* --golden judges the reference alone, on one checkpoint directory: the
 * options that shape a matrix would be silently ignored, so they are
 * refused, as with --external. Prints the problem; false when refused. */
static bool gate_check_golden_args(const GateArgs *a) {
    if (a->golden_path == NULL) return true;
    if (a->n_external > 0) {
        fprintf(stderr, "kvrepro gate: --golden and --external exclude each other\n");
        return false;
    }
    if (a->matrix_opt != NULL) {
        fprintf(stderr, "kvrepro gate: %s cannot be used with --golden: the golden gate runs no "
                "cache variants and no scenarios (it decodes the golden's prompts with the CPU "
                "reference)\n", a->matrix_opt);
        return false;
    }
    if (a->n_models != 1 || !a->model_is_dir[0]) {
        fprintf(stderr, "kvrepro gate: --golden needs exactly one --model DIR, the checkpoint "
                "the golden decoded\n");
        return false;
    }
    return true;
}

/* The process environment for kv_shard_from_env. */
static const char *gate_getenv(const char *name, void *ctx) {
    (void)ctx;
    return getenv(name);
}

/* Parses argv into a and o; prints the problem and returns false on bad
 * usage; *help is set for --help. */
static bool gate_parse_args(int argc, char **argv, GateArgs *a, KvGateOptions *o, bool *help) {
    int n_known = 0, n_all = 0, picked[KV_GATE_MAX_LIST], n_picked = 0;
    /* Any scenario may be named; the default is the default set, and
     * `extended` (or --faults without --scenarios) adds the extended ones. */
    int n_default = 0;
    const char *const *defaults = kv_scenario_names(&n_default);
    const char *const *known = kv_scenario_all_names(&n_known);
    bool scen_given = false;
    const KvCacheOps *const *all = kv_cache_all(&n_all);
    for (int k = 0; k < n_default && k < KV_GATE_MAX_LIST; k++) a->scen_names[k] = defaults[k];
    o->n_scenarios = n_default;
    for (int k = 0; k < n_all && k < KV_GATE_MAX_LIST; k++) a->variants[k] = all[k];
    o->n_variants = n_all;
    int n_be = 0;
    const KvBackendOps *const *be = kv_backend_all(&n_be);
    const char *backend_names[KV_GATE_MAX_LIST];
    for (int k = 0; k < n_be && k < KV_GATE_MAX_LIST; k++) {
        backend_names[k] = be[k]->name;
        a->backends[k] = (KvGateBackend){be[k], ""};
    }
    o->backends = a->backends;
    o->n_backends = n_be; /* default: every backend built */
    uint64_t u = 0;
    bool bad = false;
    for (int i = 1; i < argc && !bad; i++) {
        const char *v = NULL;
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            *help = true;
            return true;
        } else if (strcmp(argv[i], "--quiet") == 0) {
            a->quiet = true;
        } else if (strcmp(argv[i], "--verbose") == 0) {
            a->verbose = true;
        } else if (strcmp(argv[i], "--table") == 0) {
            a->table = true;
        } else if (kv_cli_take(argc, argv, &i, "--summary-md", &v, &bad)) {
            if (bad) break;
            a->summary_md = v;
        } else if (kv_cli_take(argc, argv, &i, "--summary-json", &v, &bad)) {
            if (bad) break;
            a->summary_json = v;
        } else if (strcmp(argv[i], "--timings") == 0) {
            o->timings = true;
        } else if (strcmp(argv[i], "--no-calibrate") == 0) {
            o->calibrate = false;
        } else if (strcmp(argv[i], "--first-catch") == 0) {
            a->first_catch = true;
            o->stop_at_catch = true;
        } else if (strcmp(argv[i], "--no-shared-prefill") == 0) {
            o->share_prefill = false;
            gate_note_matrix_opt(a, "--no-shared-prefill");
        } else if (strcmp(argv[i], "--no-goldens") == 0) {
            a->no_goldens = true;
            gate_note_matrix_opt(a, "--no-goldens");
        } else if (kv_cli_take(argc, argv, &i, "--golden", &v, &bad)) {
            if (bad) break;
            a->golden_path = v;
        } else if (kv_cli_take(argc, argv, &i, "--goldens", &v, &bad)) {
            if (bad) break;
            a->goldens_root = v;
            gate_note_matrix_opt(a, "--goldens");
        } else if (strcmp(argv[i], "--allow-empty") == 0) {
            a->allow_empty = true;
            gate_note_matrix_opt(a, "--allow-empty");
        } else if (strcmp(argv[i], "--allow-large-work") == 0) {
            a->allow_large = true;
        } else if (kv_cli_take(argc, argv, &i, "--model", &v, &bad) ||
                   kv_cli_take(argc, argv, &i, "--fixture", &v, &bad)) {
            if (bad) break;
            if (a->n_models == KV_GATE_MAX_MODELS) {
                fprintf(stderr, "kvrepro gate: at most %d models\n", KV_GATE_MAX_MODELS);
                bad = true;
                break;
            }
            /* kv_cli_take consumed "--model DIR" or "--model=DIR": look at
             * the option word it matched, not at the value. */
            const char *opt = argv[i] == v ? argv[i - 1] : argv[i];
            a->model_is_dir[a->n_models] = strncmp(opt, "--model", 7) == 0;
            if (!a->model_is_dir[a->n_models]) {
                gate_note_matrix_opt(a, "--fixture");
                /* gemma3_text-tiny is gemma3-tiny: the report keeps the fixture's name */
                v = kv_cli_fixture_name(v, a->fixture_names[a->n_models], KV_NAME_LEN);
            }
            a->models[a->n_models++] = v;
        } else if (kv_cli_take(argc, argv, &i, "--external", &v, &bad)) {
            if (bad) break;
            if (a->n_external == KV_GATE_MAX_EXTERNAL) {
                fprintf(stderr, "kvrepro gate: at most %d --external files\n",
                        KV_GATE_MAX_EXTERNAL);
                bad = true;
                break;
            }
            a->externals[a->n_external++] = v;
        } else if (kv_cli_take(argc, argv, &i, "--scenarios", &v, &bad)) {
            gate_note_matrix_opt(a, "--scenarios");
            scen_given = true;
            if (!bad && strcmp(v, "extended") == 0) {
                for (int k = 0; k < n_known && k < KV_GATE_MAX_LIST; k++) {
                    a->scen_names[k] = known[k];
                }
                o->n_scenarios = n_known;
                continue;
            }
            bad = bad || !gate_parse_names("--scenarios", v, known, n_known, picked, &n_picked);
            for (int k = 0; k < n_picked && !bad; k++) a->scen_names[k] = known[picked[k]];
            if (!bad) o->n_scenarios = n_picked;
        } else if (kv_cli_take(argc, argv, &i, "--variants", &v, &bad)) {
            gate_note_matrix_opt(a, "--variants");
            bad = bad || !gate_parse_variants(v, a->variants, &n_picked);
            if (!bad) o->n_variants = n_picked;
        } else if (kv_cli_take(argc, argv, &i, "--backends", &v, &bad)) {
            gate_note_matrix_opt(a, "--backends");
            bad = bad || !gate_parse_names("--backends", v, backend_names, n_be, picked, &n_picked);
            for (int k = 0; k < n_picked && !bad; k++) a->backends[k] = (KvGateBackend){be[picked[k]], ""};
            if (!bad) o->n_backends = n_picked;
        } else if (kv_cli_take(argc, argv, &i, "--modes", &v, &bad)) {
            gate_note_matrix_opt(a, "--modes");
            bad = bad || !gate_parse_names("--modes", v, k_gate_modes, 2, picked, &n_picked);
            o->eager = o->graph = false;
            for (int k = 0; k < n_picked && !bad; k++) *(picked[k] == 0 ? &o->eager : &o->graph) = true;
        } else if (kv_cli_take(argc, argv, &i, "--repeats", &v, &bad)) {
            gate_note_matrix_opt(a, "--repeats");
            bad = bad || !gate_parse_bounded("--repeats", v, 1, 100, "runs per variant and mode", &u);
            o->repeats = (int)u;
        } else if (kv_cli_take(argc, argv, &i, "--replay-every", &v, &bad)) {
            gate_note_matrix_opt(a, "--replay-every");
            bad = bad || !gate_parse_bounded("--replay-every", v, 0, KV_GATE_MAX_NEW_TOKENS,
                                             "decode steps; 0 = off", &u);
            o->replay_every = (int64_t)u;
        } else if (kv_cli_take(argc, argv, &i, "--full-logits-max-vocab", &v, &bad)) {
            bad = bad || !gate_parse_bounded("--full-logits-max-vocab", v, 0, INT64_MAX,
                                             "a vocabulary size", &u);
            o->full_logits_max_vocab = (int64_t)u;
        } else if (kv_cli_take(argc, argv, &i, "--report", &v, &bad)) {
            a->report_path = v;
        } else if (kv_cli_take(argc, argv, &i, "--junit", &v, &bad)) {
            a->junit_path = v;
        } else if (kv_cli_take(argc, argv, &i, "--prompts", &v, &bad)) {
            gate_note_matrix_opt(a, "--prompts");
            a->prompts_path = v;
        } else if (kv_cli_take(argc, argv, &i, "--max-new-tokens", &v, &bad)) {
            gate_note_matrix_opt(a, "--max-new-tokens");
            bad = bad || !gate_parse_bounded("--max-new-tokens", v, 1, KV_GATE_MAX_NEW_TOKENS,
                                             "longer than any model's context", &a->max_new);
        } else if (kv_cli_take(argc, argv, &i, "--seed", &v, &bad)) {
            bad = bad || !kv_cli_parse_u64("--seed", v, &a->seed);
        } else if (kv_cli_take(argc, argv, &i, "--prompt-seed", &v, &bad)) {
            bad = bad || !kv_cli_parse_u64("--prompt-seed", v, &o->prompt_seed);
        } else if (kv_cli_take(argc, argv, &i, "--tol", &v, &bad)) {
            KvError err = {{0}};
            if (!bad && kv_tolerances_set(&o->tol, v, &err) != KV_OK) {
                fprintf(stderr, "kvrepro gate: %s\n", err.msg);
                bad = true;
            }
            if (!bad && strncmp(v, "max_rel_err=", strlen("max_rel_err=")) == 0) {
                o->tol_max_rel_err_set = true; /* overrides the calibrated value */
            }
            if (!bad && strncmp(v, "tie_margin=", strlen("tie_margin=")) == 0) {
                a->tie_margin_set = true;
            }
        } else if (kv_cli_take(argc, argv, &i, "--shard", &v, &bad)) {
            gate_note_matrix_opt(a, "--shard");
            if (bad) break;
            a->shard_source[0] = '\0'; /* the last --shard given wins */
            KvShard shard;
            KvError serr = {{0}};
            if (strcmp(v, "auto") == 0) {
                if (kv_shard_from_env(gate_getenv, NULL, &shard, &serr) != KV_OK) {
                    fprintf(stderr, "kvrepro gate: --shard auto: %s\n", serr.msg);
                    bad = true;
                    break;
                }
                snprintf(a->shard_source, sizeof a->shard_source, "%s", shard.source);
            } else if (!kv_shard_parse(v, &shard.index, &shard.count)) {
                fprintf(stderr, "kvrepro gate: --shard: expected I/N with 1 <= I <= N, or auto, "
                        "found '%s'\n", v);
                bad = true;
                break;
            }
            o->shard_i = shard.index;
            o->shard_n = shard.count;
        } else if (kv_cli_take(argc, argv, &i, "--plant", &v, &bad) ||
                   kv_cli_take(argc, argv, &i, "--fault", &v, &bad)) {
            /* --fault: --plant's older name, kept; messages name the one typed */
            const char *opt = argv[i] == v ? argv[i - 1] : argv[i];
            opt = strncmp(opt, "--plant", 7) == 0 ? "--plant" : "--fault";
            gate_note_matrix_opt(a, opt);
            if (bad) break;
            if (a->plant_opt != NULL) {
                fprintf(stderr, "kvrepro gate: %s is given twice (as %s and %s; --fault is "
                        "--plant's older name); give it once\n", "--plant", a->plant_opt, opt);
                bad = true;
                break;
            }
            a->plant_opt = opt;
            bad = !gate_parse_faults(opt, v, false, &o->faults, NULL, NULL);
        } else if (kv_cli_take(argc, argv, &i, "--faults", &v, &bad)) {
            gate_note_matrix_opt(a, "--faults");
            if (bad) break;
            a->mutation = true;
            o->mutation = true;
            unsigned list[KV_FAULT_COUNT];
            int n_list = 0;
            bad = !gate_parse_faults("--faults", v, true, NULL, list, &n_list);
            a->n_passes = 1 + n_list; /* passes[0] is the clean pass */
            for (int k = 0; k < n_list; k++) a->passes[1 + k].faults = list[k];
        } else {
            char near[64];
            if (kv_cli_nearest_option(gate_usage, argv[i], near, sizeof near)) {
                fprintf(stderr, "kvrepro gate: unknown option '%s'; did you mean '%s'?\n",
                        argv[i], near);
            } else {
                fprintf(stderr, "kvrepro gate: unknown option '%s'\n", argv[i]);
            }
            bad = true;
        }
    }
    if (!bad && a->mutation && o->faults != 0) {
        fprintf(stderr, "kvrepro gate: %s and --faults exclude each other (%s plants faults "
                "in one gate; --faults scores the gate against each in turn)\n", a->plant_opt,
                a->plant_opt);
        bad = true;
    }
    if (!bad && a->first_catch && !a->mutation) {
        fprintf(stderr, "kvrepro gate: --first-catch stops each planted fault's pass of --faults "
                "at its first catch; give it with --faults LIST|all\n");
        bad = true;
    }
    if (!bad && a->mutation && a->junit_path != NULL) {
        fprintf(stderr, "kvrepro gate: --junit describes one gate, not a mutation score; drop it "
                "or run the gate without --faults\n");
        bad = true;
    }
    if (!bad && a->prompts_path != NULL && a->max_new == 0) {
        fprintf(stderr, "kvrepro gate: --prompts needs --max-new-tokens N (N >= 1)\n");
        bad = true;
    }
    if (!bad && !gate_check_external_args(a)) bad = true;
    if (!bad && !gate_check_golden_args(a)) bad = true;
    if (!bad && a->mutation && !scen_given) {
        /* The mutation score covers every planted fault: pad_slots acts
         * only on the extended right-padded scenarios, shift_cells only on
         * context_shift. */
        for (int k = 0; k < n_known && k < KV_GATE_MAX_LIST; k++) a->scen_names[k] = known[k];
        o->n_scenarios = n_known;
    }
    o->scenarios = a->scen_names;
    o->variants = a->variants;
    o->max_new_tokens = (int64_t)a->max_new;
    return !bad;
}

/* The configuration of model i (a fixture, or DIR/config.json), for the
 * work estimate before any weights are loaded. */
static KvStatus gate_model_config(const GateArgs *a, int i, KvConfig *cfg, KvError *err) {
    if (!a->model_is_dir[i]) {
        KvFamily fam;
        KvFixtureSize size;
        KvStatus st = kv_fixture_lookup(a->models[i], &fam, &size, err);
        return st != KV_OK ? st : kv_fixture_config(fam, size, cfg, err);
    }
    char path[4096];
    if ((size_t)snprintf(path, sizeof path, "%s/config.json", a->models[i]) >= sizeof path) {
        return kv_error_set(err, KV_ERR_INPUT, "%.200s...: model directory path too long",
                            a->models[i]);
    }
    return kv_config_load(path, cfg, err);
}

/* The bytes model i's weights take in memory: a directory's safetensors
 * files as stored (the loader maps them), a built-in fixture's F32 tensors
 * (built in memory). */
static double gate_weights_bytes(const GateArgs *a, int i, const KvConfig *cfg) {
    if (a->model_is_dir[i]) {
        double bytes = 0.0;
        DIR *d = opendir(a->models[i]);
        if (d == NULL) return 0.0; /* the loader names the problem */
        const struct dirent *e;
        while ((e = readdir(d)) != NULL) {
            const size_t n = strlen(e->d_name);
            const char *ext = ".safetensors";
            if (n <= strlen(ext) || strcmp(e->d_name + n - strlen(ext), ext) != 0) continue;
            char path[4096];
            struct stat sb;
            if ((size_t)snprintf(path, sizeof path, "%s/%s", a->models[i], e->d_name) <
                    sizeof path &&
                stat(path, &sb) == 0) {
                bytes += (double)sb.st_size;
            }
        }
        closedir(d);
        return bytes;
    }
    const double layer =
        kv_rate_layer_weights(cfg, cfg->num_experts > 0 ? (double)cfg->num_experts : 1.0);
    return 4.0 * (2.0 * (double)cfg->vocab_size * (double)cfg->hidden_size +
                  (double)cfg->num_layers * layer);
}

/* The bytes this process holds before any model is loaded (its code and
 * libraries: /proc/self/status VmRSS), 0 where that cannot be read. */
static double gate_process_bytes(void) {
    FILE *f = fopen("/proc/self/status", "r");
    if (f == NULL) return 0.0;
    char line[256];
    double kib = 0.0;
    while (fgets(line, sizeof line, f) != NULL) {
        if (strncmp(line, "VmRSS:", 6) == 0) {
            kib = strtod(line + 6, NULL);
            break;
        }
    }
    fclose(f);
    return kib * 1024.0;
}

/* States the CPU work up front, and refuses (KV_ERR_INPUT) work beyond
 * KV_GATE_MAX_WORK_FLOP unless --allow-large-work was given, and a matrix
 * whose largest unit would not fit in this machine's memory beside its
 * model's weights (kv_model_memory_limit) in any case. */
static KvStatus gate_check_work(const GateArgs *a, const KvGateOptions *o, KvRate *rate_out,
                                double *seconds_out, KvError *err) {
    KvGateWork w;
    memset(&w, 0, sizeof w);
    int unit = 0;
    char windows[512] = "";
    int64_t max_vocab = 0, max_probes = 0;
    /* The machine's rate, measured once with the widest model's shapes
     * (a fraction of a second), for the estimated wall time. */
    KvRate rate;
    bool have_rate = false;
    if (!a->quiet) {
        KvConfig widest;
        int64_t best = -1;
        for (int i = 0; i < a->n_models; i++) {
            KvConfig cfg;
            KvStatus st = gate_model_config(a, i, &cfg, err);
            if (st != KV_OK) return st;
            if (cfg.hidden_size * cfg.intermediate_size > best) {
                best = cfg.hidden_size * cfg.intermediate_size;
                widest = cfg;
            }
        }
        have_rate = best >= 0 && kv_rate_measure(&widest, &rate, err) == KV_OK;
        if (have_rate) *rate_out = rate;
    }
    double peak = 0.0, peak_weights = 0.0, peak_unit = 0.0; /* bytes */
    char peak_what[400] = "";
    for (int i = 0; i < a->n_models; i++) {
        KvConfig cfg;
        KvStatus st = gate_model_config(a, i, &cfg, err);
        if (st != KV_OK) return st;
        w.unit_bytes = 0.0; /* this model's largest unit */
        w.stream_bytes = 0.0;
        st = kv_gate_work_add(&cfg, o, have_rate ? &rate : NULL, &unit, &w, err);
        if (st != KV_OK) return st;
        const double weights = gate_weights_bytes(a, i, &cfg);
        if (weights + w.unit_bytes + w.stream_bytes + w.report_bytes > peak) {
            peak = weights + w.unit_bytes + w.stream_bytes + w.report_bytes;
            peak_weights = weights;
            peak_unit = w.unit_bytes + w.stream_bytes + w.report_bytes;
            snprintf(peak_what, sizeof peak_what, "%.200s's %.160s", a->models[i], w.unit_name);
        }
        if (cfg.vocab_size > max_vocab) max_vocab = cfg.vocab_size;
        if (kv_probe_count(&cfg) > max_probes) max_probes = kv_probe_count(&cfg);
        const size_t used = strlen(windows);
        char wt[96];
        kv_config_window_text(&cfg, wt, sizeof wt);
        snprintf(windows + used, sizeof windows - used, "%s%.40s %s%s", i > 0 ? ", " : "",
                 a->models[i], wt,
                 cfg.sliding_window_defaulted ? " (no sliding_window in config.json: "
                                                "transformers' default)" : "");
    }
    const int passes = a->mutation ? a->n_passes : 1;
    w.decodes *= passes;
    w.references *= passes;
    w.twins *= passes;
    w.members *= passes;
    w.shadows *= passes;
    w.candidates *= passes;
    w.streams *= passes;
    w.tokens *= passes;
    w.flop *= passes;
    w.seconds *= passes;
    *seconds_out = have_rate ? w.seconds : 0.0;
    /* the process itself, and the freed heap it keeps for the next runs */
    const double base = gate_process_bytes() + (double)KV_GATE_HEAP_KEEP;
    peak += base;
    if (!a->quiet) {
        char est[160] = "";
        if (w.seconds > 0.0) {
            /* whole seconds first: 59.6 s must read "1 min 00 s", not "0 min 60 s" */
            const long long secs = llround(w.seconds);
            snprintf(est, sizeof est, "; estimated %lld min %02lld s and ~%.1f GiB of memory on "
                     "this machine", secs / 60, secs % 60, peak / 1073741824.0);
        }
        char streams[160] = "";
        if (w.streams > 0) {
            snprintf(streams, sizeof streams, ", %lld shared prefill stream%s (the "
                     "references' first rows, cut from it)", (long long)w.streams,
                     w.streams == 1 ? "" : "s");
        }
        printf("work: %lld cpu decodes (%lld reference, %lld fresh twin, %lld calibration "
               "member, %lld fp64 shadow, %lld candidate%s%s), %lld token positions, ~%.3g "
               "GFLOP%s (%s)\n",
               (long long)w.decodes, (long long)w.references, (long long)w.twins,
               (long long)w.members, (long long)w.shadows, (long long)w.candidates,
               o->share_prefill ? " taking the reference's first prefill forward" : "", streams,
               (long long)w.tokens, w.flop / 1e9, est, windows);
        if (a->first_catch) {
            printf("work: at most the above: each fault's pass stops at its first catch "
                   "(--first-catch)\n");
        }
        for (int i = 0; i < a->n_models; i++) {
            KvConfig cfg;
            bool needed = true;
            KvStatus st = gate_model_config(a, i, &cfg, err);
            if (st == KV_OK) st = kv_gate_members_needed(&cfg, o, &needed, err);
            if (st != KV_OK) return st;
            if (kv_gate_calibrates_per_model(&cfg, o) && !needed) {
                printf("calibration: %s: the %d reduction-order members are not run: no "
                       "comparison of this gate is judged by a tolerance (CPU runs only, held "
                       "bitwise to the reference; no judged context shift); its fp64 shadow "
                       "still judges the reference\n", a->models[i], KV_ENSEMBLE_SIZE);
            }
        }
        fflush(stdout); /* a CI log shows it before the matrix starts */
    }
    const double limit = (double)kv_model_memory_limit();
    if (peak > limit) {
        return kv_error_set(err, KV_ERR_INPUT,
                            "the selected matrix needs ~%.1f GiB of memory at its peak, more than "
                            "this machine's %.1f GiB (%s): %.1f GiB of weights, %.1f GiB for "
                            "the largest unit and the report (%s: its runs' caches over every "
                            "position, activations and the shared prefill; the runs' logits "
                            "until the report is written), %.1f GiB for the process and its "
                            "heap. Narrow it with --scenarios, --max-new-tokens N or a shorter "
                            "--prompts batch, or run it on a machine with more memory",
                            peak / 1073741824.0, limit / 1073741824.0,
                            getenv("KVREPRO_MEMORY_LIMIT") != NULL ? "KVREPRO_MEMORY_LIMIT"
                                                                   : "physical memory",
                            peak_weights / 1073741824.0, peak_unit / 1073741824.0, peak_what,
                            base / 1073741824.0);
    }
    if (w.flop > KV_GATE_MAX_WORK_FLOP && !a->allow_large) {
        return kv_error_set(err, KV_ERR_INPUT,
                            "the selected matrix is ~%.3g TFLOP of CPU work (%lld decodes, %lld "
                            "token positions; %s), above the %.3g TFLOP that runs without "
                            "asking (hours on a CI machine; even at real scale the scenarios' "
                            "prompts are about the window long). Narrow it with --scenarios, --variants, --modes, "
                            "--repeats or --max-new-tokens N, or pass --allow-large-work",
                            w.flop / 1e12, (long long)w.decodes, (long long)w.tokens, windows,
                            KV_GATE_MAX_WORK_FLOP / 1e12);
    }
    /* the report these runs make must be one its reader reads back: every
     * run at the largest unit's sizes, with full logits (references and
     * failing runs keep theirs at any vocabulary, kv_gate_trim_logits),
     * bounds it from above */
    if (w.runs <= 0) return KV_OK;
    if (max_vocab <= o->full_logits_max_vocab && o->faults == 0 && !a->mutation) {
        return kv_limits_check_report(w.runs * passes, w.max_steps, w.max_batch, max_vocab, 0,
                                      max_probes, w.max_prompt_len, "the matrix", err);
    }
    /* Trimmed (kv_gate_trim_logits): per unit the reference, a fresh twin
     * and at most KV_FAILING_FULL_MAX failing runs keep their full logits,
     * every other run its top-k; each part must fit. Above the full-logits
     * vocabulary a planted-fault pass keeps none (only the clean pass's
     * units count). */
    const bool big = max_vocab > o->full_logits_max_vocab;
    const int64_t units = big && a->mutation ? w.references / passes /* the clean pass's */
                                             : w.references; /* every pass's: counted once, above */
    const int64_t full = units * (2 + KV_FAILING_FULL_MAX);
    KvStatus st = kv_limits_check_report(full < w.runs * passes ? full : w.runs * passes,
                                         w.max_steps, w.max_batch, max_vocab, 0, max_probes,
                                         w.max_prompt_len, "the matrix's full-logit runs", err);
    if (st != KV_OK) return st;
    const int64_t topk = max_vocab < KV_TOPK ? max_vocab : KV_TOPK;
    return kv_limits_check_report(w.runs * passes, w.max_steps, w.max_batch, max_vocab, topk,
                                  max_probes, w.max_prompt_len, "the matrix", err);
}

/* The reference reads a config as it was written (DESIGN §6, the
 * reference judged too): a loader bug (a list of windows read as its first
 * entry, a default taken over the value written) changes every run alike,
 * the fp64 shadow included (it reads the same parsed config), so no
 * comparison can see it. Checked before any work:
 *  - a built-in fixture's config is written as config.json by
 *    kv_config_to_json and read back by kv_config_parse, the route of
 *    kv_fixture_load: what is read must be what was written, field for field
 *    and layer window for layer window;
 *  - a --model DIR's list-form sliding_window is read again here, apart
 *    from the loader: entry l % len is layer l's window, null a full layer.
 * Returns false with why (a gate failure, exit 1) when they differ;
 * KV_ERR_* in *st for a config that cannot be read at all. */
static bool gate_configs_read_back(const GateArgs *a, char *why, size_t n, KvStatus *st,
                                   KvError *err) {
    *st = KV_OK;
    for (int i = 0; i < a->n_models; i++) {
        KvConfig want, got;
        if (!a->model_is_dir[i]) {
            *st = gate_model_config(a, i, &want, err);
            if (*st != KV_OK) return true;
            char *json = kv_config_to_json(&want);
            if (json == NULL) {
                *st = kv_error_set(err, KV_ERR_INTERNAL, "out of memory");
                return true;
            }
            *st = kv_config_parse(json, strlen(json), "config.json", &got, err);
            free(json);
            if (*st != KV_OK) return true;
#define KV_SAME(f)                                                                                \
    if ((double)want.f != (double)got.f) {                                                        \
        snprintf(why, n, "fixture %s: the loader read %s = %.17g from the config.json written "   \
                 "with %.17g: the reference reads configs wrongly", a->models[i], #f,            \
                 (double)got.f, (double)want.f);                                                  \
        return false;                                                                             \
    }
            KV_SAME(vocab_size) KV_SAME(hidden_size) KV_SAME(intermediate_size)
            KV_SAME(num_layers) KV_SAME(num_heads) KV_SAME(num_kv_heads) KV_SAME(head_dim)
            KV_SAME(sliding_window) KV_SAME(rms_norm_eps) KV_SAME(rope_theta)
            KV_SAME(rope_theta_local) KV_SAME(query_pre_attn_scalar)
            KV_SAME(attn_logit_softcapping) KV_SAME(final_logit_softcapping)
            KV_SAME(tie_word_embeddings) KV_SAME(attn_qkv_bias) KV_SAME(qk_norm)
            KV_SAME(attn_o_bias) KV_SAME(attn_sinks) KV_SAME(rope_yarn) KV_SAME(rope_factor)
            KV_SAME(rope_beta_fast) KV_SAME(rope_beta_slow) KV_SAME(rope_orig_max_pos)
            KV_SAME(rope_truncate) KV_SAME(num_experts) KV_SAME(experts_per_tok)
            KV_SAME(swiglu_limit) KV_SAME(swiglu_alpha)
            /* derived by the loader: 1 without YaRN, the in-memory config leaves it 0 */
            if (want.rope_yarn) KV_SAME(rope_attention_factor)
#undef KV_SAME
            for (int64_t l = 0; l < want.num_layers; l++) {
                const int64_t w = kv_config_layer_window(&want, l);
                const int64_t g = kv_config_layer_window(&got, l);
                if (w != g) {
                    snprintf(why, n, "fixture %s: the loader read layer %lld's window as %lld "
                             "from the config.json written with %lld: the reference reads "
                             "configs wrongly", a->models[i], (long long)l, (long long)g,
                             (long long)w);
                    return false;
                }
            }
            continue;
        }
        *st = gate_model_config(a, i, &got, err);
        if (*st != KV_OK) return true;
        char path[4096];
        snprintf(path, sizeof path, "%s/config.json", a->models[i]);
        FILE *f = fopen(path, "rb");
        if (f == NULL) continue; /* the loader just read it: nothing to re-read */
        char *text = malloc(KV_GATE_CONFIG_MAX_BYTES + 1);
        const size_t len = text != NULL ? fread(text, 1, KV_GATE_CONFIG_MAX_BYTES, f) : 0;
        fclose(f);
        cJSON *root = text != NULL ? cJSON_ParseWithLength(text, len) : NULL;
        free(text);
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(root, "sliding_window");
        const int n_list = cJSON_IsArray(list) ? cJSON_GetArraySize(list) : 0;
        bool same = true;
        for (int64_t l = 0; l < got.num_layers && n_list > 0 && same; l++) {
            const cJSON *e = cJSON_GetArrayItem(list, (int)(l % n_list));
            const int64_t w = cJSON_IsNumber(e) ? (int64_t)e->valuedouble : 0;
            const int64_t g = kv_config_layer_window(&got, l);
            if (w != g) {
                snprintf(why, n, "%.300s: layer %lld's window is sliding_window[%lld] = %lld, and "
                         "the loader read %lld: the reference reads configs wrongly", path,
                         (long long)l, (long long)(l % n_list), (long long)w, (long long)g);
                same = false;
            }
        }
        cJSON_Delete(root);
        if (!same) return false;
    }
    return true;
}

/* Loads model i (weights) and runs every pass of the matrix on it. */
static KvStatus gate_run_one_model(GateArgs *a, int i, KvGateOptions *o, int *unit, KvReport *rep,
                                   KvError *err) {
    KvModel dir_model = {0};
    KvFixtureModel fx = {0};
    const KvModel *m = NULL;
    const char *name = a->models[i];
    KvStatus st;
    if (a->model_is_dir[i]) {
        st = kv_model_load_dir(a->models[i], &dir_model, err);
        m = &dir_model;
        const char *slash = strrchr(a->models[i], '/');
        if (slash != NULL && slash[1] != '\0') name = slash + 1;
    } else {
        st = kv_fixture_load(a->models[i], a->seed, &fx, err);
        m = &fx.model;
    }
    if (st != KV_OK) goto cleanup;
    const uint64_t mh = kv_model_hash(m);
    if (i == 0) rep->model_hash = mh;
    if (!a->quiet) {
        char wt[96];
        kv_config_window_text(&m->config, wt, sizeof wt);
        printf("model %s: %s, %lld layers, %s, weights fnv1a64 0x%016" PRIx64 "\n", name,
               m->config.model_type, (long long)m->config.num_layers, wt, mh);
    }
    const KvScenario *custom = o->custom;
    for (int64_t k = 0; custom != NULL && k < custom->batch * custom->prompt_len; k++) {
        if (custom->prompt[k] >= m->config.vocab_size) {
            st = kv_error_set(err, KV_ERR_INPUT, "%s: token id %d is outside the vocabulary of "
                              "%s (%lld)", a->prompts_path, custom->prompt[k], a->models[i],
                              (long long)m->config.vocab_size);
            goto cleanup;
        }
    }
    /* Every pass runs the same (model, scenario) units, so a shard holds the
     * same units clean and faulty. */
    const int unit_base = *unit;
    KvTolerances model_tol_saved = o->tol; /* the clean pass's per-model tolerance */
    bool model_tol_set = false;
    for (int p = 0; p < a->n_passes && st == KV_OK; p++) {
        *unit = unit_base;
        o->faults = a->passes[p].faults;
        if (a->first_catch && p > 0 && a->passes[p].failed > 0) {
            /* caught on an earlier model: none of this model's units run */
            const int n = o->custom != NULL ? 1 : o->n_scenarios;
            for (int k = 0; k < n; k++) {
                if (kv_gate_unit_in_shard(o, unit_base + k)) {
                    a->runs_stopped += kv_gate_runs_planned_per_unit(o);
                }
            }
            *unit = unit_base + n;
            continue;
        }
        /* --first-catch: the fault passes take the clean pass's tolerance
         * (a per-model calibration is the same computation in every pass:
         * the reference and its members are not planted) */
        KvTolerances model_tol;
        o->model_tol_out = a->first_catch && p == 0 ? &model_tol : NULL;
        o->model_tol_in = a->first_catch && p > 0 && model_tol_set ? &model_tol_saved : NULL;
        const int64_t from = rep->n_comparisons;
        st = kv_gate_run_model(m, name, o, unit, rep, err);
        if (o->model_tol_out != NULL && kv_gate_calibrates_per_model(&m->config, o)) {
            model_tol_saved = model_tol;
            model_tol_set = true;
        }
        o->model_tol_out = NULL;
        o->model_tol_in = NULL;
        kv_mutation_account(&a->passes[p], rep, from, rep->n_comparisons);
    }
cleanup:
    kv_model_free(&dir_model);
    kv_fixture_free(&fx);
    return st;
}

/* Without --model or --fixture the gate runs the registry's tiny fixtures
 * (fixtures/fixture.c): the five families, and mistral with layers of
 * different windows. */
static void gate_default_models(GateArgs *a) {
    if (a->n_models != 0) return;
    const char *names[KV_CLI_MAX_NAMES];
    int n = kv_cli_names(KV_NAMES_FIXTURES_DEFAULT, names, KV_CLI_MAX_NAMES);
    if (n > KV_GATE_MAX_MODELS) n = KV_GATE_MAX_MODELS;
    for (int i = 0; i < n; i++) {
        a->models[i] = names[i];
        a->model_is_dir[i] = false;
    }
    a->n_models = n;
}

/* The lines a gate log opens with: the version, where it runs (and which
 * selected backends cannot), and the seeds and tolerances a rerun needs. */
static void gate_print_header(const GateArgs *a, const KvGateOptions *o, const KvReport *rep) {
    printf("%s gate\n", kv_cli_version());
    /* A device that cannot run is named once, on its backend's line. */
    const bool cpu_only = strncmp(rep->device, "cpu only", 8) == 0;
#ifdef _OPENMP
    printf("cpu: reference, %d OpenMP threads; device: %s\n", omp_get_max_threads(),
           cpu_only ? "none" : rep->device);
#else
    printf("cpu: reference, single-threaded; device: %s\n", cpu_only ? "none" : rep->device);
#endif
    for (int i = 0; i < o->n_backends; i++) {
        /* One line, not one SKIP row per run (the report lists them). */
        if (o->backends[i].skip[0] != '\0') {
            printf("%s: skipped, no device: %s\n", o->backends[i].ops->name, o->backends[i].skip);
        }
    }
    /* a model of the real-scale set calibrates once, on one unit */
    bool per_model = false;
    for (int i = 0; i < a->n_models; i++) {
        KvConfig cfg;
        KvError ignored = {{0}};
        per_model = per_model || (gate_model_config(a, i, &cfg, &ignored) == KV_OK &&
                                  kv_gate_calibrates_per_model(&cfg, o));
    }
    char rel[192];
    if (o->calibrate && !o->tol_max_rel_err_set) {
        snprintf(rel, sizeof rel, "calibrated per %s (max(%d x the %d-order spread, %d x the "
                 "fp64 error), >= %g)", per_model ? "model at real scale, on its unit with the "
                 "most token positions, else per unit" : "unit", KV_CAL_SPREAD_MULT,
                 KV_ENSEMBLE_SIZE, KV_CAL_FP64_MULT, KV_CAL_FLOOR);
    } else {
        snprintf(rel, sizeof rel, "%g", o->tol.max_rel_err);
    }
    printf("seeds: weights %llu, prompts %llu; tolerances: max_rel_err %s, tie_margin %g; "
           "shard %s",
           (unsigned long long)a->seed, (unsigned long long)o->prompt_seed, rel,
           o->tol.tie_margin, rep->shard);
    if (a->shard_source[0] != '\0') printf(" (from %s)", a->shard_source);
    printf("\n");
    /* What judges the reference itself, which every candidate shares. */
    bool dirs = false;
    for (int i = 0; i < a->n_models; i++) dirs = dirs || a->model_is_dir[i];
    const char *shadow = !o->calibrate ? "no fp64 shadow (--no-calibrate)"
                         : per_model ? "its fp64 shadow (within %g) in every calibrating unit "
                                       "(one per model at real scale)"
                                     : "its fp64 shadow (within %g) in every unit";
    char sh[128];
    snprintf(sh, sizeof sh, shadow, KV_FP64_MAX_REL_ERR);
    if (a->n_golden > 0) {
        printf("reference judged by: transformers goldens (%d famil%s) and %s%s\n", a->n_golden,
               a->n_golden == 1 ? "y" : "ies", sh,
               dirs ? "; a --model DIR has no golden: its reference by the shadow only" : "");
    } else {
        printf("reference judged by: %s; no transformers golden%s\n", sh,
               a->no_goldens ? " (--no-goldens)" : " exists for a --model DIR");
    }
}

/* The runs this shard will do over all passes: the progress total. */
static int64_t gate_count_runs(const GateArgs *a, const KvGateOptions *o) {
    /* Units (model, scenario) in this shard. */
    const int per_model = o->custom != NULL ? 1 : o->n_scenarios;
    int64_t units = 0;
    for (int64_t u = 0; u < (int64_t)a->n_models * per_model; u++) {
        units += kv_gate_unit_in_shard(o, u);
    }
    return units * kv_gate_runs_per_unit(o) * a->n_passes;
}

/* The units (model, scenario) of the whole gate, and those in this shard. */
static void gate_count_units(const GateArgs *a, const KvGateOptions *o, int64_t *all,
                             int64_t *mine) {
    const int per_model = o->custom != NULL ? 1 : o->n_scenarios;
    *all = (int64_t)a->n_models * per_model + a->n_golden;
    *mine = 0;
    for (int64_t u = 0; u < *all; u++) *mine += kv_gate_unit_in_shard(o, u);
}

/* A candidate run: a cache variant's, not the reference's, its reordered
 * members' or a scenario's fresh twin. */
static bool gate_is_candidate(const KvRun *r) {
    return strncmp(r->variant, "reference", 9) != 0;
}

/* Nothing judged is a failure (DESIGN §8): the gate must have judged at
 * least one candidate run, and every run it planned (the progress total)
 * must have been made or recorded as skipped with its reason. A shard that
 * holds no unit is the one empty gate that may pass, and only with
 * --allow-empty. Returns true when the gate must fail, with why; failed:
 * it fails already. */
static bool gate_judged_too_little(const GateArgs *a, const KvGateOptions *o,
                                   const KvReport *rep, int64_t accounted, bool failed, char *why,
                                   size_t n) {
    int64_t units = 0, mine = 0;
    gate_count_units(a, o, &units, &mine);
    why[0] = '\0';
    if (mine == 0) {
        if (a->allow_empty) return false;
        snprintf(why, n, "this shard (%s) holds none of the gate's %lld (model, scenario) units: "
                 "nothing was judged; pass --allow-empty where an empty shard is expected",
                 rep->shard, (long long)units);
        return true;
    }
    int64_t golden_mine = 0;
    for (int g = 0; g < a->n_golden; g++) {
        golden_mine += kv_gate_unit_in_shard(o, units - a->n_golden + g);
    }
    /* --first-catch: the runs a caught fault's pass did not make are not owed */
    const int64_t planned =
        (mine - golden_mine) * kv_gate_runs_planned_per_unit(o) * a->n_passes - a->runs_stopped;
    if (accounted != planned) {
        snprintf(why, n, "the gate planned %lld runs but made or skipped with a stated reason "
                 "%lld: the difference was not judged", (long long)planned,
                 (long long)accounted);
        return true;
    }
    int64_t judged = 0;
    for (int64_t c = 0; c < rep->n_comparisons; c++) {
        const KvComparison *cmp = &rep->comparisons[c];
        if (cmp->verdict != KV_VERDICT_SKIP && gate_is_candidate(&rep->runs[cmp->run_b]) &&
            !rep->runs[cmp->run_b].skipped) {
            judged++;
        }
    }
    /* a gate that already fails (a reference that is not finite skips
     * every candidate behind it) needs no second verdict */
    if (judged == 0 && mine > golden_mine && !failed) {
        const char *reason = "";
        for (int64_t r = 0; r < rep->n_runs && reason[0] == '\0'; r++) {
            if (rep->runs[r].skipped) reason = rep->runs[r].skip_reason;
        }
        snprintf(why, n, "the gate judged no candidate run: every one was skipped%s%.200s",
                 reason[0] != '\0' ? " (" : "", reason);
        if (reason[0] != '\0') snprintf(why + strlen(why), n - strlen(why), ")");
        return true;
    }
    return false;
}

/* The families whose transformers goldens judge the reference: those of
 * the built-in fixtures gated, each once, in order (a --model DIR has no
 * golden; its reference is judged by its fp64 shadow alone). */
static KvStatus gate_pick_goldens(GateArgs *a, KvError *err) {
    a->n_golden = 0;
    for (int i = 0; i < a->n_models && !a->no_goldens; i++) {
        if (a->model_is_dir[i]) continue;
        KvFamily fam;
        KvFixtureSize size;
        KvStatus st = kv_fixture_lookup(a->models[i], &fam, &size, err);
        if (st != KV_OK) return st;
        const char *name = kv_family_name(fam);
        bool seen = false;
        for (int g = 0; g < a->n_golden; g++) seen = seen || strcmp(a->golden_families[g], name) == 0;
        if (!seen) a->golden_families[a->n_golden++] = name;
    }
    return KV_OK;
}

/* The golden units (numbered after every (model, scenario) unit, so the
 * matrix's shards keep their units), run first: a reference that disagrees
 * with transformers fails the gate before any candidate is held to it.
 * Their comparisons belong to the clean pass of a mutation run. */
static KvStatus gate_run_goldens(GateArgs *a, const KvGateOptions *o, KvReport *rep,
                                 KvError *err) {
    char root[1024];
    if (a->goldens_root != NULL) snprintf(root, sizeof root, "%s", a->goldens_root);
    else kv_golden_default_root(root, sizeof root);
    const int per_model = o->custom != NULL ? 1 : o->n_scenarios;
    const int64_t base = (int64_t)a->n_models * per_model;
    const int64_t from = rep->n_comparisons;
    KvStatus st = KV_OK;
    for (int g = 0; g < a->n_golden && st == KV_OK; g++) {
        if (!kv_gate_unit_in_shard(o, base + g)) continue;
        int64_t judged = 0;
        const int64_t unit_from = rep->n_comparisons;
        st = kv_gate_run_golden(root, a->golden_families[g], o, rep, &judged, err);
        if (st == KV_OK && !a->quiet) {
            /* every comparison of the unit: golden, row_alone and the
             * forced references' finite checks */
            int64_t failed = 0;
            for (int64_t c = unit_from; c < rep->n_comparisons; c++) {
                failed += rep->comparisons[c].verdict == KV_VERDICT_FAIL;
            }
            printf("reference vs transformers golden %s/%s: %lld comparisons, %s\n", root,
                   a->golden_families[g], (long long)judged,
                   failed == 0 ? "all agree" : "DISAGREES");
        }
    }
    kv_mutation_account(&a->passes[0], rep, from, rep->n_comparisons);
    return st;
}

/* --summary-md and --summary-json: writable, and neither names (as
 * written) the other, the report, the JUnit file or the prompts file: two
 * writers would leave one survivor, and an input would be overwritten. */
static KvStatus gate_check_summaries(const GateArgs *a, KvError *err) {
    const char *paths[5] = {a->summary_md, a->summary_json, a->report_path, a->junit_path,
                            a->prompts_path};
    const char *opts[5] = {"--summary-md", "--summary-json", "--report", "--junit", "--prompts"};
    for (int i = 0; i < 2; i++) {
        if (paths[i] == NULL) continue;
        KvStatus st = kv_report_check_writable(paths[i], err);
        if (st != KV_OK) return st;
        for (int j = i + 1; j < 5; j++) {
            if (paths[j] != NULL && strcmp(paths[i], paths[j]) == 0) {
                return kv_error_set(err, KV_ERR_INPUT, "%s %s and %s %s name the same file",
                                    opts[i], paths[i], opts[j], paths[j]);
            }
        }
    }
    return KV_OK;
}

/* Runs every pass of the matrix on every model into rep; the progress line
 * is closed whether or not a run failed. */
static KvStatus gate_run_all(GateArgs *a, KvGateOptions *o, KvReport *rep, KvError *err) {
    o->runs_total = gate_count_runs(a, o);
    o->started = kv_gate_now();
    *o->progress_last = o->started;
    if (!a->mutation) a->passes[0].faults = o->faults;
    for (int p = 0; p < a->n_passes; p++) a->passes[p].first_fail = -1;
    KvStatus st = gate_run_goldens(a, o, rep, err);
    int unit = 0;
    for (int i = 0; i < a->n_models && st == KV_OK; i++) {
        st = gate_run_one_model(a, i, o, &unit, rep, err);
    }
    kv_gate_progress_print(o, "", true);
    return st;
}

/* Prints what the gate found (the lines that say whether it passed come
 * from gate_print_verdict, once the output files are written). --quiet:
 * the failures only. A mutation run: the failures of its clean pass (its
 * per-run table, thousands of lines, with --verbose; the report and
 * `kvrepro show` have it). Otherwise the verdict on one screen: the
 * per-run table first when asked for (--table, --verbose), then the model
 * x scenario grid, each failure with the command that bisects it, and the
 * skipped runs grouped by reason. *failed says whether the gate fails. */
static KvStatus gate_print_findings(const KvReport *rep, const GateArgs *a,
                                    const KvGateOptions *o, bool *failed, KvError *err) {
    KvStatus st = KV_OK;
    if (a->mutation || a->quiet) {
        *failed = kv_gate_print_failures(rep, a->mutation, a->verbose, false, NULL, stdout);
        if (a->mutation && a->verbose) st = kv_report_print_table_folded(rep, NULL, 0, stdout);
        if (a->mutation) {
            *failed = kv_mutation_caught(a->passes, a->n_passes) < a->n_passes - 1 ||
                      a->passes[0].failed > 0;
        }
    } else {
        if (a->table || a->verbose) {
            /* Backends that could not run were named in one line up front. */
            const char *fold[KV_GATE_MAX_LIST];
            int n_fold = 0;
            for (int i = 0; i < o->n_backends; i++) {
                if (o->backends[i].skip[0] != '\0') fold[n_fold++] = o->backends[i].ops->name;
            }
            st = kv_report_print_table_folded(rep, fold, n_fold, stdout);
        }
        if (st == KV_OK) st = kv_gate_print_grid(rep, stdout);
        *failed = kv_gate_print_failures(rep, false, a->verbose, true, a->report_path, stdout);
        if (st == KV_OK) st = kv_gate_print_skips(rep, stdout);
    }
    if (st != KV_OK) return kv_error_set(err, st, "cannot print the summary table");
    return KV_OK;
}

/* The last lines, printed only once --report and --junit are written (a
 * gate whose files could not be written exits 2 without them): the count
 * line "N passed, N failed, N skipped", or for a mutation run the score
 * (after the count line with --verbose). */
static KvStatus gate_print_verdict(const KvReport *rep, const GateArgs *a, KvError *err) {
    KvStatus st = KV_OK;
    if (!a->mutation || a->verbose) st = kv_report_print_counts(rep, stdout);
    if (st == KV_OK && a->mutation) st = kv_mutation_print(a->passes, a->n_passes, rep, stdout);
    if (st == KV_OK && a->first_catch) {
        printf("first catch: each fault's pass stopped at the comparison that caught it; %lld "
               "planned runs of fault passes were not made\n", (long long)a->runs_stopped);
    }
    if (st != KV_OK) return kv_error_set(err, st, "cannot print the summary table");
    return KV_OK;
}

/* The gate creates and frees thousands of runs whose buffers (static
 * caches, scratch, snapshots) are the same few sizes. glibc's dynamic mmap
 * threshold hands such buffers back to the kernel on free and faults them
 * in again, zeroed, on the next run: ~2 s of the default gate's 31 s CPU
 * (measured, single-threaded). Keeping freed heap memory up to 256 MiB and
 * serving blocks under 64 MiB from the heap reuses the pages; larger
 * blocks (model weights, big caches) still come from mmap. Results do not
 * depend on it. */
static void gate_tune_malloc(void) {
#ifdef __GLIBC__
    mallopt(M_MMAP_THRESHOLD, 64 << 20);
    mallopt(M_TRIM_THRESHOLD, KV_GATE_HEAP_KEEP);
#endif
}

/* `gate --model DIR --golden FILE`: the reference on DIR judged against
 * transformers' decodes recorded in FILE, and nothing else. Exit 0 only
 * when something was judged and all of it agrees. */
static int gate_run_golden_only(const GateArgs *a, KvGateOptions *o) {
    KvReport rep;
    memset(&rep, 0, sizeof rep);
    KvError err = {{0}};
    int rc = KV_EXIT_PASS;
    bool failed = false;
    int64_t judged = 0;
    const char *dir = a->models[0];
    KvTolerances tol = {KV_GOLDEN_MAX_REL_ERR, KV_GOLDEN_TIE_MARGIN};
    if (o->tol_max_rel_err_set) tol.max_rel_err = o->tol.max_rel_err;
    if (a->tie_margin_set) tol.tie_margin = o->tol.tie_margin;
    o->tol = tol;
    /* the runs are named by the directory's last component */
    char path[1024], name[KV_NAME_LEN];
    snprintf(path, sizeof path, "%s", dir);
    for (size_t n = strlen(path); n > 1 && path[n - 1] == '/'; n--) path[n - 1] = '\0';
    const char *slash = strrchr(path, '/');
    snprintf(name, sizeof name, "%.63s", slash != NULL && slash[1] != '\0' ? slash + 1 : path);
    kv_gate_fill_root(&rep, a->seed, o->prompt_seed, 1, 1);
    snprintf(rep.device, sizeof rep.device, "cpu only (--golden: the CPU reference alone)");
    KvStatus st = kv_gate_record_tolerances(o, &rep, &err);
    if (st == KV_OK) {
        snprintf(rep.tolerances[0].reason, sizeof rep.tolerances[0].reason, "%s",
                 o->tol_max_rel_err_set ? "set by --tol" : "--golden: the floor of each "
                 "scenario's measured bound (max_rel_err@MODEL/SCENARIO)");
    }
    if (st == KV_OK) st = kv_gate_check_outputs(a->report_path, a->junit_path, &err);
    if (st == KV_OK) {
        const char *inputs[1] = {a->golden_path};
        st = kv_gate_check_outputs_apart(a->report_path, a->junit_path, inputs, 1, &dir, 1,
                                         &err);
    }
    if (st != KV_OK) goto cleanup;
    if (!a->quiet) {
        printf("%s gate\n", kv_cli_version());
        printf("reference judged by: transformers golden %s (teacher-forced with its tokens; "
               "every logit within max_rel_err %g%s, tie_margin %g; each row of a batch "
               "bitwise the row alone)\n", a->golden_path, tol.max_rel_err,
               o->tol_max_rel_err_set ? "" : ", or the bound measured against fp64 on both "
               "sides where the golden records its own", tol.tie_margin);
        fflush(stdout);
    }
    st = kv_gate_run_golden_at(dir, a->golden_path, name, o, &tol, &rep, &judged, &err);
    if (st != KV_OK) goto cleanup;
    failed = kv_gate_print_failures(&rep, false, a->verbose, false, NULL, stdout);
    if (!a->quiet && kv_report_print_table_folded(&rep, NULL, 0, stdout) != KV_OK) {
        st = kv_error_set(&err, KV_ERR_INTERNAL, "cannot print the summary table");
        goto cleanup;
    }
    char none[4200] = ""; /* a path and the reason */
    if (judged == 0) snprintf(none, sizeof none, "%s holds no decode to judge", a->golden_path);
    st = kv_gate_write_outputs(&rep, a->report_path, a->junit_path, o->timings, a->quiet,
                               judged == 0 ? none : NULL, &err);
    if (st == KV_OK && kv_report_print_counts(&rep, stdout) != KV_OK) {
        st = kv_error_set(&err, KV_ERR_INTERNAL, "cannot print the summary table");
    }
    if (st == KV_OK && judged == 0) {
        printf("FAIL: %s\n", none);
        failed = true;
    }
    if (st == KV_OK && failed) rc = KV_EXIT_GATE_FAIL;
cleanup:
    if (st != KV_OK) {
        fprintf(stderr, "kvrepro gate: %s\n", err.msg);
        rc = kv_cli_exit_code(st);
    }
    kv_report_free(&rep);
    return rc;
}

int kv_cmd_gate(int argc, char **argv) {
    GateArgs a;
    memset(&a, 0, sizeof a);
    gate_tune_malloc();
    a.seed = KV_FIXTURE_DEFAULT_SEED;
    a.n_passes = 1;
    KvError err = {{0}};
    KvGateOptions o = {
        .eager = true, .graph = true, .repeats = 3,
        .replay_every = 5, .tol = kv_tolerances_default(), .calibrate = true,
        .share_prefill = true, .prompt_seed = KV_FIXTURE_DEFAULT_SEED, .shard_i = 1, .shard_n = 1,
        .full_logits_max_vocab = KV_FULL_LOGITS_MAX_VOCAB,
    };
    bool help = false;
    static const char *const k_repeatable[] = {"--model", "--fixture", "--external", "--tol",
                                               NULL};
    if (!kv_cli_check_repeats("gate", argc, argv, k_repeatable) ||
        !gate_parse_args(argc, argv, &a, &o, &help)) {
        /* the line above says what is wrong; the whole usage would bury it */
        fprintf(stderr, "kvrepro gate: see 'kvrepro gate --help'\n");
        return KV_EXIT_USAGE;
    }
    if (help) {
        gate_usage(stdout);
        return KV_EXIT_PASS;
    }
    if (a.n_external > 0) {
        const KvExternalOptions x = {
            .model_dir = a.models[0], .paths = a.externals, .n_paths = a.n_external,
            .report_path = a.report_path, .junit_path = a.junit_path, .tol = o.tol,
            .tol_max_rel_err_set = o.tol_max_rel_err_set, .calibrate = o.calibrate,
            .weight_seed = a.seed, .prompt_seed = o.prompt_seed,
            .full_logits_max_vocab = o.full_logits_max_vocab, .quiet = a.quiet,
            .verbose = a.verbose, .timings = o.timings, .allow_large = a.allow_large,
        };
        return kv_gate_external(&x);
    }
    if (a.golden_path != NULL) return gate_run_golden_only(&a, &o);
    gate_default_models(&a);
    if (gate_pick_goldens(&a, &err) != KV_OK) {
        fprintf(stderr, "kvrepro gate: %s\n", err.msg);
        return KV_EXIT_USAGE;
    }
    int64_t runs_done = 0, runs_accounted = 0;
    double progress_last = 0.0;
    /* a log's progress interval: KVREPRO_PROGRESS_EVERY seconds (tests see a
     * line inside one short run), else KV_PROGRESS_EVERY_S */
    o.progress_every = KV_PROGRESS_EVERY_S;
    const char *every = getenv("KVREPRO_PROGRESS_EVERY");
    if (every != NULL) {
        char *end = NULL;
        const double v = strtod(every, &end);
        if (end == every || *end != '\0' || !(v >= 0.0 && v <= 3600.0)) {
            fprintf(stderr, "kvrepro gate: KVREPRO_PROGRESS_EVERY: expected seconds in 0..3600, "
                    "found '%s'\n", every);
            return KV_EXIT_USAGE;
        }
        o.progress_every = v;
    }
    o.progress = a.quiet ? KV_PROGRESS_OFF
                         : isatty(STDERR_FILENO) ? KV_PROGRESS_TTY : KV_PROGRESS_LINES;
    o.runs_done = &runs_done;
    o.runs_accounted = &runs_accounted;
    o.progress_last = &progress_last;

    KvReport rep;
    memset(&rep, 0, sizeof rep);
    KvScenario custom = {0};
    KvStatus st = KV_OK;
    int rc = KV_EXIT_PASS;
    bool failed = false;
    if (a.prompts_path != NULL) {
        st = kv_prompts_load(a.prompts_path, (int64_t)a.max_new, &custom, &err);
        if (st != KV_OK) goto cleanup;
        o.custom = &custom;
    }
    kv_gate_fill_root(&rep, a.seed, o.prompt_seed, o.shard_i, o.shard_n);
    st = gate_query_backends(&o, &rep, &err);
    if (st == KV_OK) st = kv_gate_record_tolerances(&o, &rep, &err);
    if (st != KV_OK) goto cleanup;
    if (!a.quiet) gate_print_header(&a, &o, &rep);
    /* --quiet prints no header, but a shard taken from the environment is
     * still named: the log of a job that ran the wrong units must say so. */
    if (a.quiet && a.shard_source[0] != '\0') {
        fprintf(stderr, "kvrepro gate: shard %s (from %s)\n", rep.shard, a.shard_source);
    }
    /* Everything that can be refused is refused before the first decode. */
    st = kv_gate_check_outputs(a.report_path, a.junit_path, &err);
    if (st == KV_OK) st = gate_check_summaries(&a, &err);
    if (st == KV_OK) {
        char why[512];
        if (!gate_configs_read_back(&a, why, sizeof why, &st, &err) && st == KV_OK) {
            printf("FAIL: %s\n", why);
            rc = KV_EXIT_GATE_FAIL;
            goto cleanup;
        }
    }
    if (st == KV_OK) {
        const char *dirs[KV_GATE_MAX_MODELS];
        int n_dirs = 0;
        for (int i = 0; i < a.n_models; i++) {
            if (a.model_is_dir[i]) dirs[n_dirs++] = a.models[i];
        }
        const char *inputs[1] = {a.prompts_path};
        st = kv_gate_check_outputs_apart(a.report_path, a.junit_path, inputs, 1, dirs, n_dirs,
                                         &err);
    }
    KvRate rate;
    double est_done = 0.0, est_running = 0.0;
    o.est_done = &est_done;
    o.est_running = &est_running;
    o.runs_stopped = &a.runs_stopped;
    if (st == KV_OK) st = gate_check_work(&a, &o, &rate, &o.est_total, &err);
    if (st == KV_OK && o.est_total > 0.0) o.rate = &rate;
    if (st == KV_OK) st = gate_run_all(&a, &o, &rep, &err);
    if (st == KV_OK) st = gate_print_findings(&rep, &a, &o, &failed, &err);
    /* the verdict comes last, after the files are safely written: a CI log
     * ending in "N passed" means the report is there */
    char why[512] = "";
    const bool too_little =
        st == KV_OK && gate_judged_too_little(&a, &o, &rep, runs_accounted, failed, why, sizeof why);
    if (st == KV_OK) {
        st = kv_gate_write_outputs(&rep, a.report_path, a.junit_path, o.timings, a.quiet,
                                   too_little ? why : NULL, &err);
    }
    if (st == KV_OK && a.summary_md != NULL) {
        st = kv_gate_write_summary_md(&rep, failed || too_little, too_little ? why : NULL,
                                      a.report_path, a.summary_md, &err);
        if (st == KV_OK && !a.quiet) printf("summary: %s\n", a.summary_md);
    }
    if (st == KV_OK && a.summary_json != NULL) {
        st = kv_gate_write_summary_json(&rep, failed || too_little, too_little ? why : NULL,
                                        a.report_path, a.summary_json, &err);
        if (st == KV_OK && !a.quiet) printf("summary: %s\n", a.summary_json);
    }
    if (st == KV_OK) st = gate_print_verdict(&rep, &a, &err);
    if (st == KV_OK) {
        if (too_little) {
            printf("FAIL: %s\n", why);
            failed = true;
        } else if (a.allow_empty && rep.n_runs == 0) {
            printf("empty shard %s: no unit to judge (accepted: --allow-empty)\n", rep.shard);
        }
    }
    if (st == KV_OK && failed) rc = KV_EXIT_GATE_FAIL;
cleanup:
    if (st != KV_OK) {
        fprintf(stderr, "kvrepro gate: %s\n", err.msg);
        rc = kv_cli_exit_code(st);
    }
    kv_scenario_free(&custom);
    kv_report_free(&rep);
    return rc;
}
