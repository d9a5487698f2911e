/* test_cuda_device.c: checks CUDA device discovery and the self-test kernel
 * (candidates/cuda/cuda_device.h), and that a machine without a usable GPU is
 * reported as skipped with a reason, never as passed (DESIGN §4).
 *
 * Two parts:
 *   no-device: always runs. The program re-executes itself with
 *     CUDA_VISIBLE_DEVICES="" (the runtime reads it once, at initialisation,
 *     so it must be set before the process starts) and the child requires
 *     KV_SKIP with a reason that names the failing CUDA call.
 *   device: kv_cuda_query; on KV_SKIP prints "SKIPPED" with the reason and
 *     exits 77 (ctest's SKIP_RETURN_CODE); on KV_OK checks the fields and
 *     requires kv_cuda_selftest to pass, twice.
 * Usage: test_cuda_device [--no-device-only | --device-only]; the default
 * runs both (no-device first). Exit 0 pass, 1 failure, 77 skipped.
 * Plain C, no Check: CUDA must not be initialised in a process that forks
 * test children, and there is only a handful of assertions. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cuda_device.h"
#include "no_device.h"

#define EXIT_SKIP 77
#define CHILD_FLAG KV_NO_DEVICE_CHILD_FLAG

#ifndef KV_HAVE_CUDA
#define KV_HAVE_CUDA 0
#endif

static int g_failures;

static void expect(int cond, const char *what, const char *detail) {
    if (!cond) {
        fprintf(stderr, "cuda_device: FAIL: %s%s%s\n", what, detail ? ": " : "", detail ? detail : "");
        g_failures++;
    }
}

/* A skip reason must say why: with CUDA it names the runtime call that
 * failed; in a no-CUDA build it says CUDA was not built in. */
static int skip_reason_ok(const KvError *e) {
    if (e->msg[0] == '\0') return 0;
    if (KV_HAVE_CUDA) return strstr(e->msg, "cudaGetDeviceCount") != NULL;
    return strstr(e->msg, "without CUDA") != NULL;
}

/* Runs in the re-executed child with CUDA_VISIBLE_DEVICES="". */
static int no_device_child(void) {
    KvCudaInfo info;
    KvError err = {{0}};
    memset(&info, 0xAB, sizeof info);
    KvStatus st = kv_cuda_query(&info, &err);
    printf("cuda_device: no-device child (CUDA_VISIBLE_DEVICES=\"%s\"): kv_cuda_query -> %d: %s\n",
           getenv("CUDA_VISIBLE_DEVICES") ? getenv("CUDA_VISIBLE_DEVICES") : "(unset)", (int)st,
           err.msg);
    expect(st == KV_SKIP,
           "kv_cuda_query with no visible device must return KV_SKIP (77); with a device it means "
           "CUDA_VISIBLE_DEVICES=\"\" did not hide it",
           err.msg);
    expect(skip_reason_ok(&err),
           KV_HAVE_CUDA ? "the skip reason must name the CUDA call (cudaGetDeviceCount)"
                        : "the skip reason must say CUDA was not built in",
           err.msg);
    expect(info.device_count == 0 && info.name[0] == '\0', "kv_cuda_query must zero *out on skip",
           NULL);

    KvError err2 = {{0}};
    st = kv_cuda_selftest(&err2);
    printf("cuda_device: no-device child: kv_cuda_selftest -> %d: %s\n", (int)st, err2.msg);
    expect(st == KV_SKIP, "kv_cuda_selftest with no visible device must return KV_SKIP", err2.msg);
    expect(err2.msg[0] != '\0', "kv_cuda_selftest must give a skip reason", NULL);
    return g_failures == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}

/* The real device, if any. Returns the exit code of this part. */
static int device_check(void) {
    KvCudaInfo info;
    KvError err = {{0}};
    KvStatus st = kv_cuda_query(&info, &err);
    if (st == KV_SKIP) {
        expect(skip_reason_ok(&err), "a skip must give a reason that names the CUDA call", err.msg);
        if (g_failures > 0) return EXIT_FAILURE;
        printf("cuda_device: SKIPPED: no CUDA device: %s\n", err.msg);
        return EXIT_SKIP;
    }
    if (st != KV_OK) {
        fprintf(stderr, "cuda_device: FAIL: kv_cuda_query returned %d: %s\n", (int)st, err.msg);
        return EXIT_FAILURE;
    }
    printf("cuda_device: device %d of %d: %s, sm_%d%d, %d SMs, %.1f GiB, driver %d.%d, runtime "
           "%d.%d\n",
           info.device, info.device_count, info.name, info.cc_major, info.cc_minor, info.sm_count,
           (double)info.total_mem / (1024.0 * 1024.0 * 1024.0), info.driver_version / 1000,
           (info.driver_version % 1000) / 10, info.runtime_version / 1000,
           (info.runtime_version % 1000) / 10);
    expect(info.device_count >= 1, "device_count >= 1", NULL);
    expect(info.device == 0, "device == 0", NULL);
    expect(info.name[0] != '\0', "the device name is non-empty", NULL);
    /* The build targets sm_80 and sm_90; Volta (7.x) is the oldest the
     * current toolkits still know, so anything lower is a broken query. */
    expect(info.cc_major >= 7, "cc_major >= 7", NULL);
    expect(info.driver_version > 0, "driver_version > 0", NULL);
    expect(info.runtime_version > 0, "runtime_version > 0", NULL);
    expect(info.sm_count > 0, "sm_count > 0", NULL);
    expect(info.total_mem > 0, "total_mem > 0", NULL);

    /* Twice: the second run must pass too (no state left behind). */
    for (int run = 0; run < 2; run++) {
        KvError e2 = {{0}};
        st = kv_cuda_selftest(&e2);
        if (st == KV_OK) {
            printf("cuda_device: self-test %d: %s\n", run + 1, e2.msg);
        } else {
            fprintf(stderr, "cuda_device: FAIL: kv_cuda_selftest run %d returned %d: %s\n", run + 1,
                    (int)st, e2.msg);
            g_failures++;
        }
    }
    return g_failures == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}

int main(int argc, char **argv) {
    int want_no_device = 1, want_device = 1;
    if (argc == 2 && strcmp(argv[1], CHILD_FLAG) == 0) return no_device_child();
    if (argc == 2 && strcmp(argv[1], "--no-device-only") == 0) {
        want_device = 0;
    } else if (argc == 2 && strcmp(argv[1], "--device-only") == 0) {
        want_no_device = 0;
    } else if (argc != 1) {
        fprintf(stderr, "usage: %s [--no-device-only | --device-only]\n", argv[0]);
        return 2;
    }
    printf("cuda_device: build: %s\n", kv_cuda_build_info());

    /* No-device first, before this process initialises CUDA. */
    if (want_no_device &&
        !kv_test_no_device_child(argv[0], "cuda_device", "(reported as skipped with a reason)")) {
        return EXIT_FAILURE;
    }
    if (!want_device) return EXIT_SUCCESS;
    return device_check();
}
