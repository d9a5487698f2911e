/* main.c: the kvrepro command-line entry point: the top-level usage and
 * version, and the choice of subcommand (cmd_*.c), whose exit code is the
 * program's. */
#include <hdf5.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"

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
    /* Every HDF5 failure reaches the user through kvrepro's own message
     * naming the file and object; libhdf5's own stack dump (and its
     * "infinite loop closing library" at exit after a damaged header)
     * would bury it. */
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
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
