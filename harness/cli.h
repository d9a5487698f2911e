/* cli.h: the kvrepro subcommands and the small option parser they share. */
#ifndef KV_CLI_H
#define KV_CLI_H

#include <stdbool.h>
#include <stdint.h>

#include "model.h"
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
 * past it and returns true. A missing value prints an error and sets *bad. */
bool kv_cli_take(int argc, char **argv, int *i, const char *name, const char **value, bool *bad);

/* Parses a non-negative decimal integer; prints "<opt>: ..." and returns
 * false when it is not one. */
bool kv_cli_parse_u64(const char *opt, const char *text, uint64_t *out);

const char *kv_cli_version(void);

/* Shared by gate and fixture: decodes the default scenario with the
 * reference, prints tokens (when asked), the smallest top-1 margin and the
 * logits hash; *min_margin (may be NULL) receives the margin. */
KvStatus kv_gate_decode_print(const KvModel *m, uint64_t prompt_seed, bool print_tokens,
                              float *min_margin, KvError *err);

/* KV_ERR_INPUT -> 2, anything else -> 3. */
int kv_gate_exit_code(KvStatus st);

#endif
