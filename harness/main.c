/* main.c: the kvrepro command-line entry point: dispatches subcommands and
 * holds the shared option parsing. Only this layer turns statuses into exit
 * codes. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

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

static void main_usage(FILE *f) {
    fprintf(f,
            "%s\n"
            "Correctness and reproducibility harness for sliding-window KV caches.\n\n"
            "usage: kvrepro <command> [options]\n\n"
            "commands:\n"
            "  fixture   write a deterministic synthetic model (config.json + model.safetensors)\n"
            "  gate      run the gate: reference vs every cache variant, eager and graph\n"
            "  show      print the summary of an HDF5 report\n"
            "  diff      compare two recorded runs and print the first divergence\n"
            "  merge     join shard reports into one\n"
            "  bisect    find the first step, row, layer and probe where two runs part\n"
            "  version   print the version and commit\n\n"
            "Run 'kvrepro <command> --help' for the options of a command.\n"
            "Exit codes: 0 pass, 1 gate failure, 2 bad input or usage, 3 internal error.\n",
            kv_cli_version());
}

int main(int argc, char **argv) {
    if (argc < 2) {
        main_usage(stderr);
        return KV_EXIT_USAGE;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 || strcmp(cmd, "help") == 0) {
        main_usage(stdout);
        return KV_EXIT_PASS;
    }
    if (strcmp(cmd, "version") == 0 || strcmp(cmd, "--version") == 0) {
        printf("%s\n", kv_cli_version());
        return KV_EXIT_PASS;
    }
    if (strcmp(cmd, "fixture") == 0) return kv_cmd_fixture(argc - 1, argv + 1);
    if (strcmp(cmd, "gate") == 0) return kv_cmd_gate(argc - 1, argv + 1);
    if (strcmp(cmd, "show") == 0) return kv_cmd_show(argc - 1, argv + 1);
    if (strcmp(cmd, "diff") == 0) return kv_cmd_diff(argc - 1, argv + 1);
    if (strcmp(cmd, "bisect") == 0) return kv_cmd_bisect(argc - 1, argv + 1);
    if (strcmp(cmd, "merge") == 0) return kv_cmd_merge(argc - 1, argv + 1);
    fprintf(stderr, "kvrepro: unknown command '%s'\n\n", cmd);
    main_usage(stderr);
    return KV_EXIT_USAGE;
}
