/* cli.h: the kvrepro subcommands (cmd_*.c), and what they share on the
 * command line (cli.c): the option parser, the version, the exit codes. */
#ifndef KV_CLI_H
#define KV_CLI_H

#include <stdbool.h>
#include <stdint.h>

#include "status.h"

/* Exit codes (DESIGN §8). */
enum { KV_EXIT_PASS = 0, KV_EXIT_GATE_FAIL = 1, KV_EXIT_USAGE = 2, KV_EXIT_INTERNAL = 3 };

int kv_cmd_fixture(int argc, char **argv);
int kv_cmd_gate(int argc, char **argv);
int kv_cmd_show(int argc, char **argv);
int kv_cmd_diff(int argc, char **argv);
int kv_cmd_merge(int argc, char **argv);
int kv_cmd_bisect(int argc, char **argv);

/* If argv[*i] is "--name VALUE" or "--name=VALUE", stores VALUE, advances *i
 * past it and returns true. A missing value, or a separate VALUE that starts
 * with "--" (an option: its value was forgotten), prints an error and sets
 * *bad. */
bool kv_cli_take(int argc, char **argv, int *i, const char *name, const char **value, bool *bad);

/* Refuses an option given twice (every argument starting with "--",
 * "--name=V" counting as --name), but those listed in repeatable
 * (NULL-terminated): silently letting the last one win hides a mistake.
 * Prints "kvrepro CMD: option X is given twice ..." and returns false. */
bool kv_cli_check_repeats(const char *cmd, int argc, char **argv, const char *const *repeatable);

/* Parses a non-negative decimal integer; prints "<opt>: ..." and returns
 * false when it is not one. */
bool kv_cli_parse_u64(const char *opt, const char *text, uint64_t *out);

/* "kvrepro VERSION (commit C)": the first line of `kvrepro version`, of the
 * usage text and of a gate log. */
const char *kv_cli_version(void);

/* The exit code a command returns for a status other than KV_OK:
 * KV_ERR_INPUT -> KV_EXIT_USAGE (2), anything else -> KV_EXIT_INTERNAL (3). */
int kv_cli_exit_code(KvStatus st);

#endif
