/* no_device.c: re-running a CUDA test as its no-device child (no_device.h). */
#include "no_device.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

int kv_test_no_device_child(const char *argv0, const char *name, const char *passed) {
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "%s: FAIL: fork: %s\n", name, strerror(errno));
        return 0;
    }
    if (pid == 0) {
        if (setenv("CUDA_VISIBLE_DEVICES", "", 1) != 0) _exit(126);
        char *args[] = {(char *)argv0, (char *)KV_NO_DEVICE_CHILD_FLAG, NULL};
        execv("/proc/self/exe", args);
        execv(argv0, args); /* no /proc: fall back to the path we were run as */
        fprintf(stderr, "%s: execv %s: %s\n", name, argv0, strerror(errno));
        _exit(127);
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0) {
        if (errno != EINTR) {
            fprintf(stderr, "%s: FAIL: waitpid: %s\n", name, strerror(errno));
            return 0;
        }
    }
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
        printf("%s: no-device path: PASSED %s\n", name, passed);
        return 1;
    }
    if (WIFEXITED(status)) {
        fprintf(stderr, "%s: FAIL: no-device child exited with %d\n", name, WEXITSTATUS(status));
    } else {
        fprintf(stderr, "%s: FAIL: no-device child died (signal %d)\n", name,
                WIFSIGNALED(status) ? WTERMSIG(status) : -1);
    }
    return 0;
}
