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
    *value = argv[++*i];
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
