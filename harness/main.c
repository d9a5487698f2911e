/* main.c: the kvrepro command-line entry point: the top-level usage and
 * version, and the choice of subcommand (cmd_*.c), whose exit code is the
 * program's. */
#include <hdf5.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"

/* The command list comes from the subcommand table (cli.c): a command
 * added there is listed and dispatched with no second edit here. */
static void main_usage(FILE *f) {
    fprintf(f,
            "%s\n"
            "Correctness and reproducibility harness for sliding-window KV caches.\n\n"
            "usage: kvrepro <command> [options]\n\n"
            "commands:\n",
            kv_cli_version());
    int n = 0;
    const KvCliCommand *c = kv_cli_commands(&n);
    for (int k = 0; k < n; k++) {
        int col = fprintf(f, "  %-9s ", c[k].name);
        kv_cli_print_text(f, &col, 12, c[k].summary);
        fputc('\n', f);
    }
    fprintf(f, "\nRun 'kvrepro <command> --help' for the options of a command.\n"
               "Exit codes: 0 pass, 1 gate failure, 2 bad input or usage, 3 internal error.\n");
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
    int n = 0;
    const KvCliCommand *c = kv_cli_commands(&n);
    for (int k = 0; k < n; k++) {
        if (c[k].run != NULL && strcmp(cmd, c[k].name) == 0) return c[k].run(argc - 1, argv + 1);
    }
    fprintf(stderr, "kvrepro: unknown command '%s'\n\n", cmd);
    main_usage(stderr);
    return KV_EXIT_USAGE;
}
