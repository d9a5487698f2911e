/* no_device.c: re-running a CUDA test as its no-device child (no_device.h). */
#include "no_device.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cuda_device.h"

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

int kv_test_cuda_main(int argc, char **argv, const KvCudaTest *t) {
    int want_no_device = 1, want_device = 1, rc = EXIT_SUCCESS;
    if (argc == 2 && strcmp(argv[1], KV_NO_DEVICE_CHILD_FLAG) == 0) {
        rc = t->run_no_device() == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
        if (t->cleanup != NULL) t->cleanup();
        return rc;
    }
    if (argc == 2 && strcmp(argv[1], "--no-device-only") == 0) {
        want_device = 0;
    } else if (argc == 2 && strcmp(argv[1], "--device-only") == 0) {
        want_no_device = 0;
    } else if (argc != 1) {
        fprintf(stderr, "usage: %s [--no-device-only | --device-only]\n", argv[0]);
        return 2;
    }
    printf("%s: build: %s\n", t->name, kv_cuda_build_info());
    /* No-device first, before this process initialises CUDA. */
    if (want_no_device && !kv_test_no_device_child(argv[0], t->name, t->passed)) {
        return EXIT_FAILURE;
    }
    if (!want_device) return EXIT_SUCCESS;
    KvCudaInfo info;
    KvError err = {{0}};
    const KvStatus st = kv_cuda_query(&info, &err);
    if (st == KV_SKIP) {
        printf("%s: SKIPPED: no CUDA device: %s\n", t->name, err.msg);
        return 77;
    }
    if (st != KV_OK) {
        fprintf(stderr, "%s: FAIL: kv_cuda_query returned %d: %s\n", t->name, (int)st, err.msg);
        return EXIT_FAILURE;
    }
    printf("%s: device %s (sm_%d%d, %d SMs)\n", t->name, info.name, info.cc_major, info.cc_minor,
           info.sm_count);
    rc = t->run_device() == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
    if (t->cleanup != NULL) t->cleanup();
    return rc;
}
