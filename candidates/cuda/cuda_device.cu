/* cuda_device.cu: CUDA device discovery and the self-test kernel behind
 * cuda_device.h, on the CUDA runtime.
 *
 * Every runtime call goes through KV_CUDA_CHECK, which records the file, the
 * line, the statement and CUDA's error name and text, and leaves through the
 * function's one cleanup label. "No device / no driver" is KV_SKIP (DESIGN §4:
 * a GPU run with no GPU is skipped with the reason, never passed); a machine
 * with an NVIDIA driver and device whose runtime cannot start, and anything
 * else that fails, is KV_ERR_INTERNAL. Built with --fmad=false, the device
 * side of -ffp-contract=off; no floating-point atomics. */
#include "cuda_device.h"

#include <cuda_runtime.h>

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* Self-test shape: 256 threads, each reducing a 4096-element array. */
#define KV_SELFTEST_BLOCKS 4
#define KV_SELFTEST_THREADS 64
#define KV_SELFTEST_OUT (KV_SELFTEST_BLOCKS * KV_SELFTEST_THREADS)
#define KV_SELFTEST_N 4096
/* Floats after the outputs that the kernel must leave alone. */
#define KV_SELFTEST_GUARD 64
/* All-ones bytes: a NaN pattern no correct result can have. */
#define KV_SELFTEST_GUARD_BITS 0xFFFFFFFFu
/* Multiplier of the F32 chain: not a power of two, so every step rounds. */
#define KV_SELFTEST_DECAY 0.999f

/* Errors that can mean "no usable GPU here" rather than "this code is
 * broken": no device, no or stub driver library, a driver older than this
 * runtime, devices busy. */
static bool kv_cuda_is_absent(cudaError_t e) {
    switch (e) {
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorStubLibrary:
    case cudaErrorSystemDriverMismatch:
    case cudaErrorCompatNotSupportedOnDevice:
    case cudaErrorDevicesUnavailable:
    case cudaErrorInitializationError:
        return true;
    default:
        return false;
    }
}

/* Whether this machine gives us an NVIDIA GPU: the kernel driver is loaded
 * (/proc/driver/nvidia/version, whose first line goes to `line`) and its
 * control device is present (/dev/nvidiactl; a container without GPU access
 * sees the host's module but not the device). Then a runtime that cannot
 * start (a driver too old for this CUDA, devices busy) is a broken GPU
 * setup, and calling it "skipped" would let a gate pass with no GPU run. */
static bool kv_cuda_gpu_expected(char *line, size_t len) {
    line[0] = '\0';
    FILE *dev = fopen("/dev/nvidiactl", "r");
    if (dev == NULL) return false;
    fclose(dev);
    FILE *f = fopen("/proc/driver/nvidia/version", "r");
    if (f == NULL) return false;
    if (fgets(line, (int)len, f) == NULL) line[0] = '\0';
    fclose(f);
    line[strcspn(line, "\n")] = '\0';
    return true;
}

static KvStatus kv_cuda_fail(KvError *err, KvStatus st, cudaError_t e, const char *call,
                             const char *file, int line) {
    return kv_error_set(err, st, "%s:%d: %s failed: %s: %s", file, line, call,
                             cudaGetErrorName(e), cudaGetErrorString(e));
}

/* Requires `KvStatus st` and a `cleanup:` label in the calling function. */
#define KV_CUDA_CHECK(call)                                                                        \
    do {                                                                                           \
        cudaError_t kv_e_ = (call);                                                                \
        if (kv_e_ != cudaSuccess) {                                                                \
            st = kv_cuda_fail(err, KV_ERR_INTERNAL, kv_e_, #call, __FILE__, __LINE__);             \
            goto cleanup;                                                                          \
        }                                                                                          \
    } while (0)

#define KV_STR2(...) #__VA_ARGS__
#define KV_STR(...) KV_STR2(__VA_ARGS__)

#ifdef __CUDA_ARCH_LIST__
#define KV_ARCH_LIST_TEXT KV_STR(__CUDA_ARCH_LIST__)
#else
#define KV_ARCH_LIST_TEXT "unknown"
#endif

/* KV_CUDA_ARCHS (optional, from CMake) is the list as configured, real vs PTX
 * included; __CUDA_ARCH_LIST__ is nvcc's own list of virtual architectures. */
extern "C" const char *kv_cuda_build_info(void) {
    return "CUDA " KV_STR(__CUDACC_VER_MAJOR__) "." KV_STR(__CUDACC_VER_MINOR__) " (nvcc), runtime "
           "headers " KV_STR(CUDART_VERSION) ", archs "
#ifdef KV_CUDA_ARCHS
           KV_CUDA_ARCHS " "
#endif
           "(virtual " KV_ARCH_LIST_TEXT ")";
}

extern "C" KvStatus kv_cuda_query(KvCudaInfo *out, KvError *err) {
    KvStatus st = KV_OK;
    int count = 0, driver = 0, runtime = 0;
    cudaDeviceProp prop;
    cudaError_t e;

    memset(out, 0, sizeof *out);
    /* Neither needs a driver: driver 0 means none was found, which makes the
     * reason below self-explanatory. */
    cudaDriverGetVersion(&driver);
    cudaRuntimeGetVersion(&runtime);

    e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
        /* Clears the (non-sticky) error so a later query starts clean. */
        (void)cudaGetLastError();
        /* No device (CUDA_VISIBLE_DEVICES="" included) and a stub library
         * are always an absent GPU; the others only where the machine has
         * no NVIDIA driver and device at all. */
        char drv[160];
        const bool expected = e != cudaErrorNoDevice && e != cudaErrorStubLibrary &&
                              kv_cuda_gpu_expected(drv, sizeof drv);
        const bool absent = kv_cuda_is_absent(e) && !expected;
        return kv_error_set(err, absent ? KV_SKIP : KV_ERR_INTERNAL,
                                 "%s:%d: cudaGetDeviceCount(&count) failed: %s: %s (driver version "
                                 "%d, runtime version %d)%s%s",
                                 __FILE__, __LINE__, cudaGetErrorName(e), cudaGetErrorString(e),
                                 driver, runtime,
                                 expected ? "; an NVIDIA driver and /dev/nvidiactl are present, so "
                                            "this GPU setup is broken, not absent: "
                                          : "",
                                 expected ? drv : "");
    }
    if (count <= 0) {
        return kv_error_set(err, KV_SKIP,
                                 "%s:%d: cudaGetDeviceCount(&count) returned %d devices (driver "
                                 "version %d, runtime version %d)",
                                 __FILE__, __LINE__, count, driver, runtime);
    }
    KV_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));

    out->device_count = count;
    out->device = 0;
    snprintf(out->name, sizeof out->name, "%s", prop.name);
    out->cc_major = prop.major;
    out->cc_minor = prop.minor;
    out->driver_version = driver;
    out->runtime_version = runtime;
    out->total_mem = prop.totalGlobalMem;
    out->sm_count = prop.multiProcessorCount;

cleanup:
    return st;
}

/* Each thread t reduces the whole array in ascending i, one thread per
 * output, so nothing depends on scheduling:
 *   exact[t] = sum_i ints[(i + t) % N] * (((i + 3t) % 7) - 3)
 *     every term and partial sum is an integer below 2^24, so exact in F32;
 *   chain[t] = acc <- acc * DECAY + fracs[(i + t) % N], from acc = 0
 *     rounds at every step; equals the host's value only without FMA. */
__global__ void kv_selftest_kernel(const float *__restrict__ ints /* (N) */,
                                   const float *__restrict__ fracs /* (N) */,
                                   float *__restrict__ exact /* (OUT) */,
                                   float *__restrict__ chain /* (OUT) */) {
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= KV_SELFTEST_OUT) return;
    float s = 0.0f, acc = 0.0f;
    for (int i = 0; i < KV_SELFTEST_N; i++) {
        int j = (i + t) % KV_SELFTEST_N;
        s = s + ints[j] * (float)(((i + 3 * t) % 7) - 3);
        acc = acc * KV_SELFTEST_DECAY + fracs[j];
    }
    exact[t] = s;
    chain[t] = acc;
}

static uint32_t kv_float_bits(float f) {
    uint32_t b;
    memcpy(&b, &f, sizeof b);
    return b;
}

extern "C" KvStatus kv_cuda_selftest(KvError *err) {
    KvStatus st = KV_OK;
    KvCudaInfo info;
    cudaFuncAttributes attr;
    const size_t in_bytes = KV_SELFTEST_N * sizeof(float);
    const size_t out_bytes = (KV_SELFTEST_OUT + KV_SELFTEST_GUARD) * sizeof(float);
    /* Host copies: (N) inputs and (OUT + GUARD) outputs each. */
    float h_ints[KV_SELFTEST_N], h_fracs[KV_SELFTEST_N];
    float h_exact[KV_SELFTEST_OUT + KV_SELFTEST_GUARD];
    float h_chain[KV_SELFTEST_OUT + KV_SELFTEST_GUARD];
    float *d_ints = NULL, *d_fracs = NULL, *d_exact = NULL, *d_chain = NULL;

    st = kv_cuda_query(&info, err);
    if (st != KV_OK) return st;

    /* Inputs: small integers in [-30, 30], and fractions 1/(i+3) rounded to
     * F32 (not exactly representable, so the chain rounds). */
    for (int i = 0; i < KV_SELFTEST_N; i++) {
        h_ints[i] = (float)((i * 37) % 61 - 30);
        h_fracs[i] = (float)(1.0 / (double)(i + 3));
    }

    KV_CUDA_CHECK(cudaSetDevice(0));
    KV_CUDA_CHECK(cudaFuncGetAttributes(&attr, kv_selftest_kernel));
    KV_CUDA_CHECK(cudaMalloc((void **)&d_ints, in_bytes));
    KV_CUDA_CHECK(cudaMalloc((void **)&d_fracs, in_bytes));
    KV_CUDA_CHECK(cudaMalloc((void **)&d_exact, out_bytes));
    KV_CUDA_CHECK(cudaMalloc((void **)&d_chain, out_bytes));
    KV_CUDA_CHECK(cudaMemcpy(d_ints, h_ints, in_bytes, cudaMemcpyHostToDevice));
    KV_CUDA_CHECK(cudaMemcpy(d_fracs, h_fracs, in_bytes, cudaMemcpyHostToDevice));
    KV_CUDA_CHECK(cudaMemset(d_exact, 0xFF, out_bytes));
    KV_CUDA_CHECK(cudaMemset(d_chain, 0xFF, out_bytes));

    kv_selftest_kernel<<<KV_SELFTEST_BLOCKS, KV_SELFTEST_THREADS>>>(d_ints, d_fracs, d_exact,
                                                                   d_chain);
    /* A missing kernel image for this architecture surfaces here. */
    KV_CUDA_CHECK(cudaGetLastError());
    KV_CUDA_CHECK(cudaDeviceSynchronize());
    KV_CUDA_CHECK(cudaMemcpy(h_exact, d_exact, out_bytes, cudaMemcpyDeviceToHost));
    KV_CUDA_CHECK(cudaMemcpy(h_chain, d_chain, out_bytes, cudaMemcpyDeviceToHost));

    for (int t = 0; t < KV_SELFTEST_OUT; t++) {
        long long want = 0;
        /* volatile: the host compiler must round the product before the add,
         * as --fmad=false makes the device do. */
        volatile float prod;
        float acc = 0.0f;
        for (int i = 0; i < KV_SELFTEST_N; i++) {
            int j = (i + t) % KV_SELFTEST_N;
            want += (long long)h_ints[j] * (long long)(((i + 3 * t) % 7) - 3);
            prod = acc * KV_SELFTEST_DECAY;
            acc = prod + h_fracs[j];
        }
        if (kv_float_bits(h_exact[t]) != kv_float_bits((float)want)) {
            st = kv_error_set(err, KV_ERR_INTERNAL,
                                   "CUDA self-test on %s (sm_%d%d): thread %d integer sum is %.9g, "
                                   "want exactly %lld",
                                   info.name, info.cc_major, info.cc_minor, t, (double)h_exact[t],
                                   want);
            goto cleanup;
        }
        if (kv_float_bits(h_chain[t]) != kv_float_bits(acc)) {
            st = kv_error_set(err, KV_ERR_INTERNAL,
                                   "CUDA self-test on %s (sm_%d%d): thread %d F32 multiply-add "
                                   "chain is %.9g (0x%08x), host gives %.9g (0x%08x): device F32 "
                                   "rounding differs from the host (built without --fmad=false?)",
                                   info.name, info.cc_major, info.cc_minor, t, (double)h_chain[t],
                                   kv_float_bits(h_chain[t]), (double)acc, kv_float_bits(acc));
            goto cleanup;
        }
    }
    for (int g = KV_SELFTEST_OUT; g < KV_SELFTEST_OUT + KV_SELFTEST_GUARD; g++) {
        if (kv_float_bits(h_exact[g]) != KV_SELFTEST_GUARD_BITS ||
            kv_float_bits(h_chain[g]) != KV_SELFTEST_GUARD_BITS) {
            st = kv_error_set(err, KV_ERR_INTERNAL,
                                   "CUDA self-test on %s: the kernel wrote past its %d outputs "
                                   "(guard float %d changed)",
                                   info.name, KV_SELFTEST_OUT, g - KV_SELFTEST_OUT);
            goto cleanup;
        }
    }
    kv_error_set(err, KV_OK,
                      "CUDA self-test passed on %s (sm_%d%d): %d threads bitwise equal to the host; "
                      "kernel binary version %d, PTX version %d",
                      info.name, info.cc_major, info.cc_minor, KV_SELFTEST_OUT, attr.binaryVersion,
                      attr.ptxVersion);

cleanup:
    /* Frees cannot fix a failure and must not mask it; NULL is a no-op. */
    cudaFree(d_chain);
    cudaFree(d_exact);
    cudaFree(d_fracs);
    cudaFree(d_ints);
    return st;
}
