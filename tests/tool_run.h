/* tool_run.h: running a program (the kvrepro binary) from a Check test and
 * reading back what it printed. */
#ifndef KV_TOOL_RUN_H
#define KV_TOOL_RUN_H

#include <stddef.h>

/* Runs argv[0] with the NULL-terminated argv, its stdout and stderr both
 * going to the file log; then reads up to n - 1 bytes of log into out
 * (NUL-terminated). Returns the exit status, or -1 when the program could
 * not be started or did not exit normally (a signal). With KV_TEST_SHOW set
 * in the environment, prints the command line and its output on stderr. */
int kv_tool_run(const char *const *argv, const char *log, char *out, size_t n);

#endif
