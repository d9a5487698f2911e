/* cli.c: what the kvrepro subcommands share on the command line: taking an
 * option's value, parsing a number, the version string, turning a status
 * into an exit code (only the command layer maps statuses to exit codes; the
 * libraries below it return statuses), the subcommand table, and the lists
 * of names a user sees, read from their registries and folded to the page. */
#include "cli.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends.h"
#include "cache.h"
#include "cache_registry.h"
#include "config.h"
#include "fault.h"
#include "fixture.h"
#include "junit.h"
#include "scenario.h"

const char *kv_cli_version(void) {
    return "kvrepro " KV_VERSION " (commit " KV_GIT_COMMIT ")";
}

bool kv_cli_take(int argc, char **argv, int *i, const char *name, const char **value, bool *bad) {
    const char *a = argv[*i];
    size_t n = strlen(name);
    if (strncmp(a, name, n) != 0) return false;
    if (a[n] == '=') {
        *value = a + n + 1;
        return true;
    }
    if (a[n] != '\0') return false;
    if (*i + 1 >= argc) {
        fprintf(stderr, "kvrepro: option %s needs a value\n", name);
        *bad = true;
        return true;
    }
    /* "--report --quiet" is a forgotten value, not a file named --quiet;
     * "--report=--quiet" says it is meant. */
    if (strncmp(argv[*i + 1], "--", 2) == 0) {
        fprintf(stderr, "kvrepro: option %s needs a value, found the option '%s' (write "
                "%s=%s if that is the value)\n", name, argv[*i + 1], name, argv[*i + 1]);
        *bad = true;
        return true;
    }
    *value = argv[++*i];
    return true;
}

bool kv_cli_check_repeats(const char *cmd, int argc, char **argv, const char *const *repeatable) {
    for (int i = 1; i < argc; i++) {
        if (strncmp(argv[i], "--", 2) != 0) continue;
        const size_t n = strcspn(argv[i], "=");
        bool may = false;
        for (int r = 0; repeatable[r] != NULL && !may; r++) {
            may = strlen(repeatable[r]) == n && strncmp(repeatable[r], argv[i], n) == 0;
        }
        for (int j = 1; j < i && !may; j++) {
            if (strncmp(argv[j], argv[i], n) == 0 && (argv[j][n] == '\0' || argv[j][n] == '=')) {
                fprintf(stderr, "kvrepro %s: option %.*s is given twice (arguments %d and %d); "
                        "give it once\n", cmd, (int)n, argv[i], j, i);
                return false;
            }
        }
    }
    return true;
}

bool kv_cli_parse_u64(const char *opt, const char *text, uint64_t *out) {
    char *end = NULL;
    errno = 0;
    if (text[0] < '0' || text[0] > '9') goto bad;
    unsigned long long v = strtoull(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0') goto bad;
    *out = (uint64_t)v;
    return true;
bad:
    fprintf(stderr, "kvrepro: %s: expected a non-negative integer, found '%s'\n", opt, text);
    return false;
}

int kv_cli_exit_code(KvStatus st) {
    return st == KV_ERR_INPUT ? KV_EXIT_USAGE : KV_EXIT_INTERNAL;
}

static const KvCliCommand k_commands[] = {
    {"fixture", "write a deterministic synthetic model (config.json + model.safetensors)",
     kv_cmd_fixture},
    {"gate", "run the gate: reference vs every cache variant, eager and graph", kv_cmd_gate},
    {"show", "print the summary of an HDF5 report", kv_cmd_show},
    {"diff", "compare two recorded runs and print the first divergence", kv_cmd_diff},
    {"merge", "join shard reports into one", kv_cmd_merge},
    {"bisect", "find the first step, row, layer and probe where two runs part", kv_cmd_bisect},
    {"version", "print the version and commit", NULL},
};

const KvCliCommand *kv_cli_commands(int *count) {
    if (count != NULL) *count = (int)(sizeof k_commands / sizeof k_commands[0]);
    return k_commands;
}

int kv_cli_names(KvCliNames which, const char **names, int max) {
    int n = 0;
    switch (which) {
    case KV_NAMES_COMMANDS: {
        const KvCliCommand *c = kv_cli_commands(&n);
        for (int k = 0; k < n && k < max; k++) names[k] = c[k].name;
        break;
    }
    case KV_NAMES_MODEL_TYPES:
        /* KvFamily counts up from 0; kv_family_name names each one */
        for (; strcmp(kv_family_name((KvFamily)n), "unknown") != 0; n++) {
            if (n < max) names[n] = kv_family_name((KvFamily)n);
        }
        break;
    case KV_NAMES_FIXTURES:
    case KV_NAMES_FIXTURES_DEFAULT: {
        int all = 0;
        const KvFixtureInfo *f = kv_fixture_all(&all);
        for (int k = 0; k < all; k++) {
            const bool tiny = f[k].size == KV_SIZE_TINY || f[k].size == KV_SIZE_TINY_MIXED;
            if (which == KV_NAMES_FIXTURES_DEFAULT && !tiny) continue;
            if (n < max) names[n] = f[k].name;
            n++;
        }
        break;
    }
    case KV_NAMES_FIXTURE_FAMILIES: {
        const KvFixtureWord *w = kv_fixture_families(&n);
        for (int k = 0; k < n && k < max; k++) names[k] = kv_family_name((KvFamily)w[k].value);
        break;
    }
    case KV_NAMES_FAMILY_ALIASES: {
        int all = 0;
        const KvFixtureWord *w = kv_fixture_families(&all);
        for (int k = 0; k < all; k++) {
            if (strcmp(w[k].word, kv_family_name((KvFamily)w[k].value)) == 0) continue;
            if (n < max) names[n] = w[k].word;
            n++;
        }
        break;
    }
    case KV_NAMES_FIXTURE_SIZES: {
        const KvFixtureWord *w = kv_fixture_sizes(&n);
        for (int k = 0; k < n && k < max; k++) names[k] = w[k].word;
        break;
    }
    case KV_NAMES_VARIANTS: {
        const KvCacheOps *const *v = kv_cache_all(&n);
        for (int k = 0; k < n && k < max; k++) names[k] = v[k]->name;
        break;
    }
    case KV_NAMES_VARIANT_ALIASES: {
        const KvCacheAlias *al = kv_cache_aliases(&n);
        for (int k = 0; k < n && k < max; k++) names[k] = al[k].alias;
        break;
    }
    case KV_NAMES_SCENARIOS:
    case KV_NAMES_SCENARIOS_DEFAULT:
    case KV_NAMES_SCENARIOS_EXTENDED: {
        /* kv_scenario_all_names: the default set, then the extended ones */
        int n_default = 0, n_all = 0;
        (void)kv_scenario_names(&n_default);
        const char *const *all = kv_scenario_all_names(&n_all);
        const int from = which == KV_NAMES_SCENARIOS_EXTENDED ? n_default : 0;
        const int to = which == KV_NAMES_SCENARIOS_DEFAULT ? n_default : n_all;
        for (int k = from; k < to; k++, n++) {
            if (n < max) names[n] = all[k];
        }
        break;
    }
    case KV_NAMES_FAULTS: {
        const KvFaultInfo *f = kv_fault_all(&n);
        for (int k = 0; k < n && k < max; k++) names[k] = f[k].name;
        break;
    }
    case KV_NAMES_BACKENDS: {
        const KvBackendOps *const *b = kv_backend_all(&n);
        for (int k = 0; k < n && k < max; k++) names[k] = b[k]->name;
        break;
    }
    case KV_NAMES_KINDS:
        for (n = 0; n <= (int)KV_CMP_LAST; n++) {
            if (n < max) names[n] = kv_compare_kind_name((KvCompareKind)n);
        }
        break;
    }
    return n;
}

bool kv_cli_family(const char *word, int *value) {
    int n = 0;
    const KvFixtureWord *w = kv_fixture_families(&n);
    for (int k = 0; k < n; k++) {
        if (strcmp(word, kv_family_name((KvFamily)w[k].value)) == 0 || strcmp(word, w[k].word) == 0) {
            *value = w[k].value;
            return true;
        }
    }
    return false;
}

const char *kv_cli_fixture_name(const char *typed, char *buf, size_t n) {
    int n_words = 0, n_fixtures = 0;
    const KvFixtureWord *w = kv_fixture_families(&n_words);
    const KvFixtureInfo *f = kv_fixture_all(&n_fixtures);
    for (int k = 0; k < n_words; k++) {
        const char *type = kv_family_name((KvFamily)w[k].value);
        const size_t len = strlen(type);
        if (strcmp(type, w[k].word) == 0 || strncmp(typed, type, len) != 0 || typed[len] != '-') {
            continue;
        }
        /* the same fixture under its own name, when there is one */
        snprintf(buf, n, "%s%s", w[k].word, typed + len);
        for (int i = 0; i < n_fixtures; i++) {
            if (strcmp(f[i].name, buf) == 0) return buf;
        }
    }
    return typed;
}

/* Prints one word of len bytes, after a space when space is set, or at the
 * start of a new line of indent spaces when it would pass KV_CLI_WIDTH
 * (unless the line holds only its indent: a word wider than the page is
 * printed anyway; never with indent < 0). */
static void cli_word(FILE *f, int *col, int indent, const char *w, size_t len, bool space) {
    const size_t end = (size_t)*col + (space ? 1 : 0) + len;
    if (indent >= 0 && *col > indent && end > KV_CLI_WIDTH) {
        fprintf(f, "\n%*s", indent, "");
        *col = indent;
    } else if (space) {
        fputc(' ', f);
        *col += 1;
    }
    fprintf(f, "%.*s", (int)len, w);
    *col += (int)len;
}

void kv_cli_print_names(FILE *f, int *col, int indent, const char *const *names, int n,
                        const char *last_sep) {
    for (int k = 0; k < n; k++) {
        /* "a, b, c" or "a, b or c": the comma stays on the line before a fold */
        char word[160];
        const bool comma = k + 2 < n || (k + 2 == n && last_sep == NULL);
        snprintf(word, sizeof word, "%s%s", names[k], comma ? "," : "");
        cli_word(f, col, indent, word, strlen(word), k > 0 || *col > indent);
        if (k + 2 == n && last_sep != NULL) {
            cli_word(f, col, indent, last_sep, strlen(last_sep), true);
        }
    }
}

void kv_cli_print_list(FILE *f, int *col, int indent, KvCliNames which, const char *last_sep) {
    const char *names[KV_CLI_MAX_NAMES];
    int n = kv_cli_names(which, names, KV_CLI_MAX_NAMES);
    kv_cli_print_names(f, col, indent, names, n < KV_CLI_MAX_NAMES ? n : KV_CLI_MAX_NAMES,
                       last_sep);
}

void kv_cli_print_text(FILE *f, int *col, int indent, const char *text) {
    bool space = false;
    for (const char *p = text; *p != '\0';) {
        if (*p == '\n') {
            fprintf(f, "\n%*s", indent, "");
            *col = indent;
            space = false;
            p++;
        } else if (*p == ' ') {
            space = true;
            p++;
        } else {
            const size_t len = strcspn(p, " \n");
            cli_word(f, col, indent, p, len, space);
            space = false;
            p += len;
        }
    }
    /* a trailing space is dropped: what follows decides (a list always
     * starts with a space or a fold), so no line ends in one */
}

/* Levenshtein distance of a and b, capped: at most `cap` + 1. */
static size_t cli_distance(const char *a, const char *b, size_t cap) {
    const size_t na = strlen(a), nb = strlen(b);
    if (na > 64 || nb > 64) return cap + 1;
    size_t row[65];
    for (size_t j = 0; j <= nb; j++) row[j] = j;
    for (size_t i = 1; i <= na; i++) {
        size_t diag = row[0], best = i;
        row[0] = i;
        for (size_t j = 1; j <= nb; j++) {
            const size_t up = row[j];
            size_t v = diag + (a[i - 1] != b[j - 1]);
            v = up + 1 < v ? up + 1 : v;
            v = row[j - 1] + 1 < v ? row[j - 1] + 1 : v;
            row[j] = v;
            diag = up;
            best = v < best ? v : best;
        }
        if (best > cap) return cap + 1;
    }
    return row[nb];
}

bool kv_cli_nearest_option(void (*usage)(FILE *), const char *typed, char *out, size_t n) {
    char *text = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&text, &len);
    if (m == NULL) return false;
    usage(m);
    if (fclose(m) != 0 || text == NULL) {
        free(text);
        return false;
    }
    /* the name as typed, without "=VALUE" */
    char name[80];
    snprintf(name, sizeof name, "%.*s", (int)strcspn(typed, "="), typed);
    const size_t cap = strlen(name) / 3 + 1; /* a slip, not another word */
    size_t best = cap + 1;
    for (const char *p = strstr(text, "--"); p != NULL; p = strstr(p + 2, "--")) {
        if (p > text && p[-1] != ' ' && p[-1] != '[' && p[-1] != '|' && p[-1] != '\n') continue;
        const size_t k = strspn(p + 2, "abcdefghijklmnopqrstuvwxyz0123456789-") + 2;
        if (k <= 2 || k >= 64) continue;
        char cand[64];
        memcpy(cand, p, k);
        cand[k] = '\0';
        const size_t d = cli_distance(name, cand, cap);
        if (d < best) {
            best = d;
            snprintf(out, n, "%s", cand);
        }
    }
    free(text);
    return best <= cap;
}

