/* tool_run.c: a program run from a test, its output captured (tool_run.h). */
#include "tool_run.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

int kv_tool_run(const char *const *argv, const char *log, char *out, size_t n) {
    out[0] = '\0';
    const pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        const int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0 || dup2(fd, 1) < 0 || dup2(fd, 2) < 0) _exit(127);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    int status = 0;
    if (waitpid(pid, &status, 0) != pid) return -1;
    FILE *f = fopen(log, "r");
    if (f != NULL) {
        out[fread(out, 1, n - 1, f)] = '\0';
        fclose(f);
    }
    /* KV_TEST_SHOW=1 prints every command's output (to read the messages) */
    if (getenv("KV_TEST_SHOW") != NULL) {
        fprintf(stderr, "$");
        for (int k = 0; argv[k] != NULL; k++) fprintf(stderr, " %s", argv[k]);
        fprintf(stderr, "  [status %d]\n%s\n", status, out);
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}
