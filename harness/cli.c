/* cli.c: what the kvrepro subcommands share on the command line: taking an
 * option's value, parsing a number, the version string, and turning a status
 * into an exit code. Only the command layer maps statuses to exit codes; the
 * libraries below it return statuses. */
#include "cli.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
