/* cli.h: the kvrepro subcommands (cmd_*.c), and what they share on the
 * command line (cli.c): the option parser, the version, the exit codes. */
#ifndef KV_CLI_H
#define KV_CLI_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

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

/* The option of a command's usage text (what usage(f) prints: every
 * "--name" in it) nearest to `typed` (its "=VALUE" dropped) by edit
 * distance, into out, when it is a slip (at most a third of its letters
 * plus one); false when none is that near. */
bool kv_cli_nearest_option(void (*usage)(FILE *), const char *typed, char *out, size_t n);

/* "kvrepro VERSION (commit C)": the first line of `kvrepro version`, of the
 * usage text and of a gate log. */
const char *kv_cli_version(void);

/* A subcommand: its name, its line in `kvrepro --help`, and what runs it
 * (NULL: main.c answers it, as `version`). */
typedef struct {
    const char *name;
    const char *summary;
    int (*run)(int argc, char **argv);
} KvCliCommand;

/* The subcommands, in the order `kvrepro --help` lists them. */
const KvCliCommand *kv_cli_commands(int *count);

/* Help text is folded to this many columns. */
#define KV_CLI_WIDTH 80
/* Room for any one registry's names (kv_cli_names). */
#define KV_CLI_MAX_NAMES 64

/* The lists of names a user sees, each read from its one registry (issue
 * 33: names listed once): help texts and "expected one of" messages print
 * them from here, never typed out. */
typedef enum {
    KV_NAMES_COMMANDS,          /* kvrepro's subcommands (main.c) */
    KV_NAMES_MODEL_TYPES,       /* config.json model_type per family (config.c) */
    KV_NAMES_FIXTURES,          /* built-in fixtures (fixtures/fixture.c) */
    KV_NAMES_FIXTURES_DEFAULT,  /* the tiny ones, the gate's default models */
    KV_NAMES_FIXTURE_FAMILIES,  /* `kvrepro fixture --family` names: each family's
                                 * config.json model_type (config.c) */
    KV_NAMES_FAMILY_ALIASES,    /* the short forms --family also takes, where the
                                 * fixtures' names differ from the model_type
                                 * (gemma3 for gemma3_text; fixtures/fixture.c) */
    KV_NAMES_FIXTURE_SIZES,     /* `kvrepro fixture --size` words */
    KV_NAMES_VARIANTS,          /* cache variants (candidates/cache_registry.c) */
    KV_NAMES_VARIANT_ALIASES,   /* the lane's names --variants also takes, each for the
                                 * variant of the same layout (cache_registry.c) */
    KV_NAMES_SCENARIOS,         /* every scenario (harness/scenario.c) */
    KV_NAMES_SCENARIOS_DEFAULT, /* the default set */
    KV_NAMES_SCENARIOS_EXTENDED, /* what `--scenarios extended` adds */
    KV_NAMES_FAULTS,            /* planted faults (engine/fault.c) */
    KV_NAMES_BACKENDS,          /* backends (harness/backends.c) */
    KV_NAMES_KINDS,             /* comparison kinds (reports/junit.c) */
} KvCliNames;

/* Stores the names of list `which` in names[0..max), in the registry's
 * order, and returns how many the registry holds (more than max: only max
 * stored). The strings are the registry's own, never freed. */
int kv_cli_names(KvCliNames which, const char **names, int max);

/* One vocabulary across surfaces (docs/cli.md, "Names"): a family is named
 * by its checkpoints' model_type wherever it is typed, and the short form
 * the fixtures' names use is accepted too. */

/* `kvrepro fixture --family WORD`: the family a model_type or a short form
 * names, as a KvFamily value into *value; false when WORD is neither. */
bool kv_cli_family(const char *word, int *value);

/* The built-in fixture a typed name means: typed itself, or, for
 * "<model_type>-<size>" of a family whose fixtures are named by its short
 * form ("gemma3_text-tiny"), the fixture's own name ("gemma3-tiny") in buf
 * (n bytes), which reports then record. Never NULL. */
const char *kv_cli_fixture_name(const char *typed, char *buf, size_t n);

/* Prints names[0..n) to f, ", "-separated, after a space unless at the
 * start of a line (so what comes before ends without one), each whole:
 * before a name that would
 * pass column KV_CLI_WIDTH it starts a new line of indent spaces (indent
 * < 0: never, for a one-line error message). *col is
 * the cursor's column, in and out. last_sep ("or", "and") joins the last
 * two; NULL: a comma. */
void kv_cli_print_names(FILE *f, int *col, int indent, const char *const *names, int n,
                        const char *last_sep);

/* As kv_cli_print_names, for registry list `which`. */
void kv_cli_print_list(FILE *f, int *col, int indent, KvCliNames which, const char *last_sep);

/* Prints text to f, folded at its spaces as kv_cli_print_names folds names
 * (a '\n' in text ends the line; the next starts at indent). A leading
 * space separates it from what is on the line; a trailing one is dropped. */
void kv_cli_print_text(FILE *f, int *col, int indent, const char *text);

/* The exit code a command returns for a status other than KV_OK:
 * KV_ERR_INPUT -> KV_EXIT_USAGE (2), anything else -> KV_EXIT_INTERNAL (3). */
int kv_cli_exit_code(KvStatus st);

#endif
