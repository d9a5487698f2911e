/* bench_decode.c: how fast the CPU reference decodes, against what the
 * memory system allows.
 *
 * A batch-1 greedy decode reads every weight once per token, so its ceiling
 * is memory bandwidth. This program measures the machine's copy bandwidth
 * (STREAM-copy style: (read + write) bytes / s, best of several after a
 * warm-up, for 1 and 2 copying threads), then decodes with the medium fixtures
 * (~100M F32 parameters) at each requested thread count and reports decode
 * tokens/s, ms/token, the achieved weight bandwidth (weight_bytes * tokens/s)
 * and its ratio to the copy bandwidth. It also checks that the tokens and
 * logits are bitwise the same for every thread count (DESIGN §4).
 *
 * Decode time = best full run (prefill + new_tokens - 1 decode steps) minus
 * best prefill-only run (new_tokens = 1: step 0's token comes from the
 * prefill), so only the one-token decode steps are counted.
 *
 * Prefill: the best kv_decode_greedy with new_tokens = 1 over a longer prompt
 * (--prefill-len, default 512; 32 with --quick), i.e. state setup, the
 * prompt's forward pass and the last token's lm_head. It is reported as
 * tokens/s and GFLOP/s, counting 2 flops (one multiply, one add) per weight
 * of the matmuls each token goes through: every layer's q, k, v, o, gate, up
 * and down projections (the routed experts' share for MoE) per prompt token,
 * plus the lm_head once per sequence (only the last token's logits are
 * computed). Attention scores and values, norms, RoPE and the embedding
 * lookup are not counted. The figure is set against the machine's FMA-free
 * fp32 peak, measured here: a loop of independent vector multiplies and adds
 * held in registers (8 multiply and 8 add chains, AVX-512 when the CPU has
 * it, 6 + 6 of AVX2 when it has that, else 6 + 6 on SSE), on each thread count, with multiply and add each
 * counted as one flop per lane; the reference never uses FMA (DESIGN §4), so
 * this, not the FMA peak, is what it could reach. --matmul picks the rows > 1
 * matmul path (gemm.h) so the old and new prefill can be timed with one
 * binary; all paths give the same bits.
 *
 * --short-len S makes the batch the seed report's left-padded one: row 0
 * (every even row) the whole prompt, row 1 (every odd row) S real tokens
 * left-padded to the same length (pads: token 0, real 0), as
 * kv_batch_left_pad lays a batch out; both figures' prompts are padded alike.
 * --once times one full decode per thread count (prefill + new tokens, no
 * warm-up, no copy test, no prefill figure): at the seed's shape one run is
 * minutes (bench/seed-shape.sh). The peak resident set (getrusage ru_maxrss)
 * is printed after each model is loaded and at the end.
 *
 * Not a test and not run by ctest. --quick uses the tiny fixtures and a small
 * copy buffer so the whole program runs in about a second (a smoke test).
 *
 * --result-lines adds, beside the human lines (unchanged), one line per
 * figure for scripts (bench/vs_torch.py), each `RESULT` then space-separated
 * key=value pairs, values without spaces:
 *   RESULT phase=prompt batch= len= seed= vocab= fnv1a64=    (the prompt's int32
 *          ids, (batch, len) row-major, little-endian, FNV-1a 64)
 *   RESULT phase=prefill threads= batch= tokens= seconds= flops=
 *          matmul_weights_per_token= lm_head_weights= matmul=    (the rows > 1 path)
 *   RESULT phase=decode threads= batch= steps= prefill_seconds= full_seconds=
 *          seconds= flops_per_step=    (seconds <= 0: not measurable)
 *   RESULT phase=tokens threads= row= ids=a,b,...    (the greedy tokens of the
 *          first thread count, one line per batch row)
 * Times are seconds and counts are flops (not GFLOP), both with %.9e. */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define BENCH_X86 1
#else
#define BENCH_X86 0
#endif

#include "decode.h"
#include "fixture.h"
#include "gemm.h"
#include "kvmath.h"
#include "prng.h"

#define BENCH_MAX_THREADS 64
#define BENCH_COPY_MIB_DEFAULT 512
#define BENCH_COPY_MIB_QUICK 32
#define BENCH_COPY_REPS 5
#define BENCH_COPY_THREAD_COUNTS 2 /* copy bandwidth with 1 and 2 threads */

typedef struct {
    int families[2];      /* which of gemma2 (0) and mistral (1) to run */
    int threads[BENCH_MAX_THREADS];
    int n_threads;
    int64_t new_tokens;   /* tokens generated per run; decode steps = new_tokens - 1 */
    int64_t prompt_len;   /* the decode figure's prompt */
    int64_t prefill_len;  /* the prefill figure's prompt; 0: no prefill figure */
    int prefill_only;     /* no copy test, no decode figure: for whole-process timing */
    KvGemmPath matmul;    /* rows > 1 matmul path */
    const char *model_dir; /* --model: a checkpoint directory instead of the fixtures */
    int64_t batch;        /* prompts per run (both figures) */
    int64_t short_len;    /* > 0: odd rows hold this many real tokens, left-padded */
    int once;             /* one untimed-warm-up-free full decode per thread count */
    int repeats;          /* timed runs of each kind; the best is reported */
    size_t copy_mib;
    uint64_t seed;        /* fixture weights */
    uint64_t prompt_seed; /* prompt token ids */
    int quick;
    int result_lines;     /* --result-lines: also the RESULT lines (file comment) */
} BenchOptions;

/* The process's peak resident set so far, in bytes (Linux reports
 * ru_maxrss in KiB). */
static double bench_peak_rss(void) {
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0) return -1.0;
    return (double)ru.ru_maxrss * 1024.0;
}

static double bench_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- copy bandwidth ---------------------------------------------------- */

typedef struct {
    unsigned char *dst;
    const unsigned char *src;
    size_t n;
} BenchCopySlice;

static void *bench_copy_worker(void *arg) {
    BenchCopySlice *s = arg;
    memcpy(s->dst, s->src, s->n);
    return NULL;
}

/* One copy of `bytes` split into `nthreads` contiguous slices; seconds, or
 * a negative value when a thread could not be created. */
static double bench_copy_once(unsigned char *dst, const unsigned char *src, size_t bytes,
                              int nthreads) {
    pthread_t tid[BENCH_COPY_THREAD_COUNTS];
    BenchCopySlice sl[BENCH_COPY_THREAD_COUNTS];
    size_t per = bytes / (size_t)nthreads;
    double t0 = bench_now();
    for (int t = 0; t < nthreads; t++) {
        sl[t].dst = dst + (size_t)t * per;
        sl[t].src = src + (size_t)t * per;
        sl[t].n = t == nthreads - 1 ? bytes - (size_t)t * per : per;
        if (t > 0) {
            if (pthread_create(&tid[t], NULL, bench_copy_worker, &sl[t]) != 0) return -1.0;
        }
    }
    bench_copy_worker(&sl[0]); /* the calling thread copies slice 0 */
    for (int t = 1; t < nthreads; t++) pthread_join(tid[t], NULL);
    return bench_now() - t0;
}

/* Best copy bandwidth in bytes/s over 1..BENCH_COPY_THREAD_COUNTS threads,
 * counting read + write bytes as STREAM's copy does. */
static int bench_copy_bandwidth(size_t mib, double *best_out) {
    size_t bytes = mib << 20;
    unsigned char *src = malloc(bytes), *dst = malloc(bytes);
    if (src == NULL || dst == NULL) {
        fprintf(stderr, "bench_decode: cannot allocate 2 x %zu MiB for the copy test\n", mib);
        free(src);
        free(dst);
        return 1;
    }
    /* Touch every page so first-touch faults are not timed. */
    memset(src, 0x5A, bytes);
    memset(dst, 0, bytes);
    double best = 0.0;
    for (int nt = 1; nt <= BENCH_COPY_THREAD_COUNTS; nt++) {
        if (bench_copy_once(dst, src, bytes, nt) < 0.0) { /* warm-up */
            fprintf(stderr, "bench_decode: pthread_create failed\n");
            free(src);
            free(dst);
            return 1;
        }
        double tmin = 1e30;
        for (int r = 0; r < BENCH_COPY_REPS; r++) {
            double t = bench_copy_once(dst, src, bytes, nt);
            if (t > 0.0 && t < tmin) tmin = t;
        }
        double bw = 2.0 * (double)bytes / tmin;
        printf("copy: %zu MiB, %d thread%s: best of %d %.2f ms, %.2f GB/s (read+write)\n", mib, nt,
               nt == 1 ? "" : "s", BENCH_COPY_REPS, tmin * 1e3, bw / 1e9);
        if (bw > best) best = bw;
    }
    if (memcmp(dst, src, bytes) != 0) {
        fprintf(stderr, "bench_decode: the copy test's destination differs from its source\n");
        free(src);
        free(dst);
        return 1;
    }
    free(src);
    free(dst);
    *best_out = best;
    return 0;
}

/* ---- FMA-free fp32 peak ------------------------------------------------ */

#define BENCH_PEAK_ITERS 40000000 /* ~50 ms a run with AVX-512 */
#define BENCH_PEAK_ITERS_QUICK 2000000
#define BENCH_PEAK_REPS 5

/* Multiplying by one and adding zero keep every chain's value (no overflow,
 * no denormals); read from volatiles so the compiler cannot fold them. */
static volatile float g_bench_one = 1.0f, g_bench_zero = 0.0f;

#if BENCH_X86
/* 8 multiply chains and 8 add chains of __m512, independent so the pipes'
 * latency is covered: 256 flops an iteration. The empty asm statements make
 * every chain a live register each iteration (without them GCC merges the
 * identical chains). Returns a value that depends on every chain. */
__attribute__((target("avx512f"), noinline)) static float bench_peak_avx512(int64_t iters) {
    const __m512 one = _mm512_set1_ps(g_bench_one), zero = _mm512_set1_ps(g_bench_zero);
    __m512 m0 = _mm512_set1_ps(1.0f), m1 = _mm512_set1_ps(2.0f), m2 = _mm512_set1_ps(3.0f);
    __m512 m3 = _mm512_set1_ps(4.0f), m4 = _mm512_set1_ps(5.0f), m5 = _mm512_set1_ps(6.0f);
    __m512 m6 = _mm512_set1_ps(7.0f), m7 = _mm512_set1_ps(8.0f);
    __m512 a0 = m0, a1 = m1, a2 = m2, a3 = m3, a4 = m4, a5 = m5, a6 = m6, a7 = m7;
    for (int64_t i = 0; i < iters; i++) {
        m0 = _mm512_mul_ps(m0, one);
        a0 = _mm512_add_ps(a0, zero);
        m1 = _mm512_mul_ps(m1, one);
        a1 = _mm512_add_ps(a1, zero);
        m2 = _mm512_mul_ps(m2, one);
        a2 = _mm512_add_ps(a2, zero);
        m3 = _mm512_mul_ps(m3, one);
        a3 = _mm512_add_ps(a3, zero);
        m4 = _mm512_mul_ps(m4, one);
        a4 = _mm512_add_ps(a4, zero);
        m5 = _mm512_mul_ps(m5, one);
        a5 = _mm512_add_ps(a5, zero);
        m6 = _mm512_mul_ps(m6, one);
        a6 = _mm512_add_ps(a6, zero);
        m7 = _mm512_mul_ps(m7, one);
        a7 = _mm512_add_ps(a7, zero);
        __asm__ volatile("" : "+v"(m0), "+v"(m1), "+v"(m2), "+v"(m3), "+v"(m4), "+v"(m5),
                         "+v"(m6), "+v"(m7));
        __asm__ volatile("" : "+v"(a0), "+v"(a1), "+v"(a2), "+v"(a3), "+v"(a4), "+v"(a5),
                         "+v"(a6), "+v"(a7));
    }
    const __m512 m = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(m0, m1), _mm512_add_ps(m2, m3)),
                                   _mm512_add_ps(_mm512_add_ps(m4, m5), _mm512_add_ps(m6, m7)));
    const __m512 a = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),
                                   _mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(a6, a7)));
    float out[16];
    _mm512_storeu_ps(out, _mm512_add_ps(m, a));
    return out[0];
}

/* The same loop with fused multiply-adds: 16 independent chains of
 * _mm512_fmadd_ps (x * 1 + 0 keeps each value), 512 flops an iteration,
 * counting an FMA as two. The peak the reference would have if it allowed
 * contraction (DESIGN §4 says why it does not): on a CPU with separate
 * multiply and add pipes it equals the FMA-free peak, on one whose adds and
 * multiplies share the FMA pipes it is twice it. */
__attribute__((target("avx512f"), noinline)) static float bench_peak_fma_avx512(int64_t iters) {
    const __m512 one = _mm512_set1_ps(g_bench_one), zero = _mm512_set1_ps(g_bench_zero);
    __m512 c[16];
    for (int k = 0; k < 16; k++) c[k] = _mm512_set1_ps((float)(k + 1));
    __m512 c0 = c[0], c1 = c[1], c2 = c[2], c3 = c[3], c4 = c[4], c5 = c[5], c6 = c[6], c7 = c[7];
    __m512 c8 = c[8], c9 = c[9], c10 = c[10], c11 = c[11], c12 = c[12], c13 = c[13], c14 = c[14];
    __m512 c15 = c[15];
    for (int64_t i = 0; i < iters; i++) {
        c0 = _mm512_fmadd_ps(c0, one, zero);
        c1 = _mm512_fmadd_ps(c1, one, zero);
        c2 = _mm512_fmadd_ps(c2, one, zero);
        c3 = _mm512_fmadd_ps(c3, one, zero);
        c4 = _mm512_fmadd_ps(c4, one, zero);
        c5 = _mm512_fmadd_ps(c5, one, zero);
        c6 = _mm512_fmadd_ps(c6, one, zero);
        c7 = _mm512_fmadd_ps(c7, one, zero);
        c8 = _mm512_fmadd_ps(c8, one, zero);
        c9 = _mm512_fmadd_ps(c9, one, zero);
        c10 = _mm512_fmadd_ps(c10, one, zero);
        c11 = _mm512_fmadd_ps(c11, one, zero);
        c12 = _mm512_fmadd_ps(c12, one, zero);
        c13 = _mm512_fmadd_ps(c13, one, zero);
        c14 = _mm512_fmadd_ps(c14, one, zero);
        c15 = _mm512_fmadd_ps(c15, one, zero);
        __asm__ volatile("" : "+v"(c0), "+v"(c1), "+v"(c2), "+v"(c3), "+v"(c4), "+v"(c5),
                         "+v"(c6), "+v"(c7));
        __asm__ volatile("" : "+v"(c8), "+v"(c9), "+v"(c10), "+v"(c11), "+v"(c12), "+v"(c13),
                         "+v"(c14), "+v"(c15));
    }
    const __m512 a = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(c0, c1), _mm512_add_ps(c2, c3)),
                                   _mm512_add_ps(_mm512_add_ps(c4, c5), _mm512_add_ps(c6, c7)));
    const __m512 b = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(c8, c9), _mm512_add_ps(c10, c11)),
                                   _mm512_add_ps(_mm512_add_ps(c12, c13), _mm512_add_ps(c14, c15)));
    float out[16];
    _mm512_storeu_ps(out, _mm512_add_ps(a, b));
    return out[0];
}

/* The AVX2 forms (16 ymm registers): 6 + 6 chains of 8 lanes, 96 flops an
 * iteration; with FMA, 12 chains of _mm256_fmadd_ps, 192. */
__attribute__((target("avx2"), noinline)) static float bench_peak_avx2(int64_t iters) {
    const __m256 one = _mm256_set1_ps(g_bench_one), zero = _mm256_set1_ps(g_bench_zero);
    __m256 m0 = _mm256_set1_ps(1.0f), m1 = _mm256_set1_ps(2.0f), m2 = _mm256_set1_ps(3.0f);
    __m256 m3 = _mm256_set1_ps(4.0f), m4 = _mm256_set1_ps(5.0f), m5 = _mm256_set1_ps(6.0f);
    __m256 a0 = m0, a1 = m1, a2 = m2, a3 = m3, a4 = m4, a5 = m5;
    for (int64_t i = 0; i < iters; i++) {
        m0 = _mm256_mul_ps(m0, one);
        a0 = _mm256_add_ps(a0, zero);
        m1 = _mm256_mul_ps(m1, one);
        a1 = _mm256_add_ps(a1, zero);
        m2 = _mm256_mul_ps(m2, one);
        a2 = _mm256_add_ps(a2, zero);
        m3 = _mm256_mul_ps(m3, one);
        a3 = _mm256_add_ps(a3, zero);
        m4 = _mm256_mul_ps(m4, one);
        a4 = _mm256_add_ps(a4, zero);
        m5 = _mm256_mul_ps(m5, one);
        a5 = _mm256_add_ps(a5, zero);
        __asm__ volatile("" : "+x"(m0), "+x"(m1), "+x"(m2), "+x"(m3), "+x"(m4), "+x"(m5));
        __asm__ volatile("" : "+x"(a0), "+x"(a1), "+x"(a2), "+x"(a3), "+x"(a4), "+x"(a5));
    }
    const __m256 m = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(m0, m1), _mm256_add_ps(m2, m3)),
                                   _mm256_add_ps(m4, m5));
    const __m256 a = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)),
                                   _mm256_add_ps(a4, a5));
    float out[8];
    _mm256_storeu_ps(out, _mm256_add_ps(m, a));
    return out[0];
}

__attribute__((target("avx2,fma"), noinline)) static float bench_peak_fma_avx2(int64_t iters) {
    const __m256 one = _mm256_set1_ps(g_bench_one), zero = _mm256_set1_ps(g_bench_zero);
    __m256 c0 = _mm256_set1_ps(1.0f), c1 = _mm256_set1_ps(2.0f), c2 = _mm256_set1_ps(3.0f);
    __m256 c3 = _mm256_set1_ps(4.0f), c4 = _mm256_set1_ps(5.0f), c5 = _mm256_set1_ps(6.0f);
    __m256 c6 = _mm256_set1_ps(7.0f), c7 = _mm256_set1_ps(8.0f), c8 = _mm256_set1_ps(9.0f);
    __m256 c9 = _mm256_set1_ps(10.0f), c10 = _mm256_set1_ps(11.0f), c11 = _mm256_set1_ps(12.0f);
    for (int64_t i = 0; i < iters; i++) {
        c0 = _mm256_fmadd_ps(c0, one, zero);
        c1 = _mm256_fmadd_ps(c1, one, zero);
        c2 = _mm256_fmadd_ps(c2, one, zero);
        c3 = _mm256_fmadd_ps(c3, one, zero);
        c4 = _mm256_fmadd_ps(c4, one, zero);
        c5 = _mm256_fmadd_ps(c5, one, zero);
        c6 = _mm256_fmadd_ps(c6, one, zero);
        c7 = _mm256_fmadd_ps(c7, one, zero);
        c8 = _mm256_fmadd_ps(c8, one, zero);
        c9 = _mm256_fmadd_ps(c9, one, zero);
        c10 = _mm256_fmadd_ps(c10, one, zero);
        c11 = _mm256_fmadd_ps(c11, one, zero);
        __asm__ volatile("" : "+x"(c0), "+x"(c1), "+x"(c2), "+x"(c3), "+x"(c4), "+x"(c5));
        __asm__ volatile("" : "+x"(c6), "+x"(c7), "+x"(c8), "+x"(c9), "+x"(c10), "+x"(c11));
    }
    const __m256 a = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(c0, c1), _mm256_add_ps(c2, c3)),
                                   _mm256_add_ps(c4, c5));
    const __m256 b = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(c6, c7), _mm256_add_ps(c8, c9)),
                                   _mm256_add_ps(c10, c11));
    float out[8];
    _mm256_storeu_ps(out, _mm256_add_ps(a, b));
    return out[0];
}
#endif

typedef float BenchF4 __attribute__((vector_size(16)));

/* The SSE form (any x86-64): 6 + 6 chains of 4 lanes, 48 flops an
 * iteration, 12 of the 16 xmm registers. */
__attribute__((noinline)) static float bench_peak_sse(int64_t iters) {
    const BenchF4 one = {g_bench_one, g_bench_one, g_bench_one, g_bench_one};
    const BenchF4 zero = one - one + g_bench_zero;
    BenchF4 m0 = one * 1.0f, m1 = one * 2.0f, m2 = one * 3.0f, m3 = one * 4.0f;
    BenchF4 m4 = one * 5.0f, m5 = one * 6.0f;
    BenchF4 a0 = m0, a1 = m1, a2 = m2, a3 = m3, a4 = m4, a5 = m5;
    for (int64_t i = 0; i < iters; i++) {
        m0 = m0 * one;
        a0 = a0 + zero;
        m1 = m1 * one;
        a1 = a1 + zero;
        m2 = m2 * one;
        a2 = a2 + zero;
        m3 = m3 * one;
        a3 = a3 + zero;
        m4 = m4 * one;
        a4 = a4 + zero;
        m5 = m5 * one;
        a5 = a5 + zero;
#if BENCH_X86
        __asm__ volatile("" : "+x"(m0), "+x"(m1), "+x"(m2), "+x"(m3), "+x"(m4), "+x"(m5));
        __asm__ volatile("" : "+x"(a0), "+x"(a1), "+x"(a2), "+x"(a3), "+x"(a4), "+x"(a5));
#endif
    }
    const BenchF4 t = (m0 + m1) + (m2 + m3) + (m4 + m5) + (a0 + a1) + (a2 + a3) + (a4 + a5);
    return t[0];
}

/* The widest vectors this CPU runs: 2 AVX-512, 1 AVX2 (with FMA), 0 SSE. */
static int bench_isa(void) {
#if BENCH_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) return 2;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return 1;
#endif
    return 0;
}

/* fp32 peak in flops/s on `nthreads` threads, each running the loop of
 * `isa`'s width (bench_isa): the best of BENCH_PEAK_REPS timed runs after a
 * warm-up, total flops over the wall time of the parallel region.
 * FMA-free, or with fused multiply-adds (fma; not on SSE). */
static double bench_fp32_peak(int nthreads, int64_t iters, int isa, bool fma) {
    static const double flops[3][2] = {{48.0, 48.0}, {96.0, 192.0}, {256.0, 512.0}};
    const double flops_per_iter = flops[isa][fma ? 1 : 0];
    double best = 1e30;
    float sink = 0.0f;
    for (int rep = 0; rep <= BENCH_PEAK_REPS; rep++) {
        double t0 = bench_now();
#ifdef _OPENMP
#pragma omp parallel num_threads(nthreads) reduction(+ : sink)
#endif
        {
#if BENCH_X86
            if (isa == 2) {
                sink += fma ? bench_peak_fma_avx512(iters) : bench_peak_avx512(iters);
            } else if (isa == 1) {
                sink += fma ? bench_peak_fma_avx2(iters) : bench_peak_avx2(iters);
            } else {
                sink += bench_peak_sse(iters);
            }
#else
            sink += bench_peak_sse(iters);
#endif
        }
        double t = bench_now() - t0;
        if (rep > 0 && t < best) best = t; /* rep 0 is the warm-up */
    }
    if (sink == 0.0f) printf("(peak checksum 0)\n"); /* keeps the results live */
#ifndef _OPENMP
    nthreads = 1;
#endif
    return (double)nthreads * (double)iters * flops_per_iter / best;
}

/* ---- decode ------------------------------------------------------------ */

static int bench_set_threads(int n) {
#ifdef _OPENMP
    omp_set_num_threads(n);
    return 1;
#else
    return n == 1; /* without OpenMP only one thread exists */
#endif
}

/* Runs kv_decode_greedy `repeats` times and keeps the best wall time; *keep
 * receives the last result (caller frees) when non-NULL. */
static int bench_decode_best(const KvModel *m, const KvDecodeSpec *spec, int repeats, double *best,
                             KvDecodeResult *keep) {
    *best = 1e30;
    for (int r = 0; r < repeats; r++) {
        KvDecodeResult res;
        KvError err = {{0}};
        memset(&res, 0, sizeof res);
        double t0 = bench_now();
        KvStatus st = kv_decode_greedy(m, spec, &res, &err);
        double t = bench_now() - t0;
        if (st != KV_OK) {
            fprintf(stderr, "bench_decode: kv_decode_greedy (new_tokens %" PRId64 ") failed (%d): %s\n",
                    spec->new_tokens, (int)st, err.msg);
            return 1;
        }
        if (t < *best) *best = t;
        if (keep != NULL && r == repeats - 1) {
            *keep = res;
        } else {
            kv_decode_result_free(&res);
        }
    }
    return 0;
}

/* Weights a prompt token goes through in the layers' matmuls (q, k, v, o
 * and the MLP's three projections, or the routed experts' and the router's
 * for MoE), and the lm_head's, which a prefill applies once per sequence. */
static void bench_matmul_params(const KvConfig *c, double *per_token, double *per_seq) {
    const double h = (double)c->hidden_size, inter = (double)c->intermediate_size;
    const double q = (double)(c->num_heads * c->head_dim);
    const double kv = (double)(c->num_kv_heads * c->head_dim);
    const double mlp = c->num_experts > 0
                           ? (double)c->experts_per_tok * 3.0 * h * inter + (double)c->num_experts * h
                           : 3.0 * h * inter;
    *per_token = (double)c->num_layers * (h * (q + 2.0 * kv) + q * h + mlp);
    *per_seq = (double)c->vocab_size * h;
}

/* The prefill's matmuls alone, as forward.c issues them for a chunk of
 * `rows` tokens: per layer q, k, v in one kv_matmul_multi, o, gate and up in
 * one, down; the model's own weights, calloc'd activations (as forward.c's)
 * holding fixed values. What the GEMM reaches without attention, norms and
 * allocation around it. Dense MLPs only: *seconds < 0 for MoE models. */
static int bench_prefill_matmuls(const KvModel *m, int64_t rows, int repeats, double *seconds) {
    const KvConfig *c = &m->config;
    *seconds = -1.0;
    if (c->num_experts > 0) return 0;
    const int64_t h = c->hidden_size, inter = c->intermediate_size;
    const int64_t q = c->num_heads * c->head_dim, kv = c->num_kv_heads * c->head_dim;
    int64_t widest = h > inter ? h : inter;
    widest = widest > q ? widest : q;
    float *x = calloc((size_t)(rows * widest), sizeof *x); /* (rows, widest) */
    float *ys[3];                                            /* (rows, widest) each */
    for (int j = 0; j < 3; j++) ys[j] = calloc((size_t)(rows * widest), sizeof *ys[j]);
    if (x == NULL || ys[0] == NULL || ys[1] == NULL || ys[2] == NULL) {
        fprintf(stderr, "bench_decode: out of memory for the matmul figure\n");
        free(x);
        for (int j = 0; j < 3; j++) free(ys[j]);
        return 1;
    }
    for (int64_t i = 0; i < rows * widest; i++) x[i] = (float)(i % 251) / 251.0f - 0.5f;
    double best = 1e30;
    for (int rep = 0; rep <= repeats; rep++) { /* rep 0 is the warm-up */
        double t0 = bench_now();
        for (int64_t l = 0; l < c->num_layers; l++) {
            const KvLayerWeights *w = &m->layers[l];
            const KvMat qkv[3] = {w->wq, w->wk, w->wv};
            const int64_t qkv_out[3] = {q, kv, kv};
            kv_matmul_multi(x, rows, h, 3, qkv, qkv_out, ys);
            kv_matmul_mat(x, w->wo, rows, q, h, ys[0]);
            const KvMat gu[2] = {w->w_gate, w->w_up};
            const int64_t gu_out[2] = {inter, inter};
            kv_matmul_multi(x, rows, h, 2, gu, gu_out, ys);
            kv_matmul_mat(x, w->w_down, rows, inter, h, ys[0]);
        }
        double t = bench_now() - t0;
        if (rep > 0 && t < best) best = t;
    }
    free(x);
    for (int j = 0; j < 3; j++) free(ys[j]);
    *seconds = best;
    return 0;
}

/* The prefill figure at the current thread count (see the file comment);
 * *keep receives the result (caller frees). */
static int bench_prefill(const char *name, const KvModel *m, const BenchOptions *o, int nt,
                         const int32_t *prompt /* (batch, prefill_len) */,
                         const uint8_t *real /* (batch, prefill_len) */, double peak,
                         KvDecodeResult *keep) {
    KvDecodeSpec spec = {.batch = o->batch, .prompt_len = o->prefill_len, .prompt = prompt,
                         .prompt_real = real, .new_tokens = 1, .prefill_chunk = 0};
    const int64_t tokens = o->batch * o->prefill_len;
    double t;
    if (bench_decode_best(m, &spec, 1, &t, NULL) != 0) return 1; /* warm-up */
    if (bench_decode_best(m, &spec, o->repeats, &t, keep) != 0) return 1;
    double per_token, per_seq;
    bench_matmul_params(&m->config, &per_token, &per_seq);
    const double flops = 2.0 * (per_token * (double)tokens + per_seq * (double)o->batch);
    printf("%s threads=%d: prefill(%" PRId64 " tokens, matmul %s) %.2f ms: %.1f tokens/s, "
           "%.2f GFLOP/s (2 x %.1fM matmul weights x tokens + 2 x %.1fM lm_head x sequences), "
           "FMA-free peak %.1f GFLOP/s, ratio %.3f\n",
           name, nt, tokens, kv_gemm_path_name(kv_gemm_path()), t * 1e3, (double)tokens / t,
           flops / t / 1e9, per_token / 1e6, per_seq / 1e6, peak / 1e9, flops / t / peak);
    if (o->result_lines) {
        printf("RESULT phase=prefill threads=%d batch=%" PRId64 " tokens=%" PRId64
               " seconds=%.9e flops=%.9e matmul_weights_per_token=%.0f lm_head_weights=%.0f"
               " matmul=%s\n",
               nt, o->batch, tokens, t, flops, per_token, per_seq, kv_gemm_path_name(kv_gemm_path()));
    }
    double tm;
    if (bench_prefill_matmuls(m, tokens, o->repeats, &tm) != 0) return 1;
    if (tm > 0.0) {
        const double mflops = 2.0 * per_token * (double)tokens;
        printf("%s threads=%d: prefill's matmuls alone (%" PRId64 " rows, no lm_head) %.2f ms: "
               "%.2f GFLOP/s, ratio to the FMA-free peak %.3f; the rest of the prefill %.2f ms\n",
               name, nt, tokens, tm * 1e3, mflops / tm / 1e9, mflops / tm / peak, (t - tm) * 1e3);
    }
    return 0;
}

/* `batch` prompts of `len` pseudo-random tokens: prompt and real are
 * (batch, len), malloc'd (caller frees). short_len > 0: every odd row keeps
 * only its last short_len tokens, the rest pads (token 0, real 0: a
 * left-padded batch as kv_batch_left_pad builds it); else no padding. 0 on
 * out of memory. */
static int bench_make_prompt(int64_t batch, int64_t len, int64_t short_len, uint64_t seed,
                             int64_t vocab, int32_t **prompt, uint8_t **real) {
    *prompt = malloc((size_t)(batch * len) * sizeof **prompt);
    *real = malloc((size_t)(batch * len));
    if (*prompt == NULL || *real == NULL) {
        fprintf(stderr, "bench_decode: out of memory for a (%" PRId64 ", %" PRId64 ") prompt\n",
                batch, len);
        return 0;
    }
    KvPrng g = kv_prng_seed(seed);
    for (int64_t i = 0; i < batch * len; i++) {
        (*prompt)[i] = (int32_t)kv_prng_below(&g, (uint32_t)vocab);
        (*real)[i] = 1;
    }
    for (int64_t b = 1; short_len > 0 && b < batch; b += 2) {
        for (int64_t i = 0; i < len - short_len; i++) {
            (*prompt)[b * len + i] = 0;
            (*real)[b * len + i] = 0;
        }
    }
    return 1;
}

/* The decode figure at the current thread count: a warm-up, the best
 * prefill-only run and the best full run; the decode steps' time is their
 * difference. *res receives the last full run's result (caller frees). */
static int bench_decode_figure(const char *name, const KvModel *m, const BenchOptions *o, int nt,
                               const KvDecodeSpec *prefill, const KvDecodeSpec *full,
                               double copy_bw, double peak, KvDecodeResult *res) {
    double tp, tf;
    const int64_t decode_steps = o->new_tokens - 1;
    double per_token, per_seq;
    bench_matmul_params(&m->config, &per_token, &per_seq);
    /* Warm-up: caches, page tables, OpenMP thread pool. */
    if (bench_decode_best(m, prefill, 1, &tp, NULL) != 0) return 1;
    if (bench_decode_best(m, prefill, o->repeats, &tp, NULL) != 0) return 1;
    if (bench_decode_best(m, full, o->repeats, &tf, res) != 0) return 1;
    double dt = tf - tp;
    if (o->result_lines) {
        printf("RESULT phase=decode threads=%d batch=%" PRId64 " steps=%" PRId64
               " prefill_seconds=%.9e full_seconds=%.9e seconds=%.9e flops_per_step=%.9e\n",
               nt, o->batch, decode_steps, tp, tf, dt,
               2.0 * (double)o->batch * (per_token + per_seq));
    }
    if (dt <= 0.0) {
        printf("%s threads=%d: prefill %.2f ms, full %.2f ms: decode time not measurable\n",
               name, nt, tp * 1e3, tf * 1e3);
    } else {
        /* A step reads every weight once whatever the batch, and each of
         * the batch's rows goes through every matmul and the lm_head. */
        double sps = (double)decode_steps / dt;
        double wbw = (double)m->weight_bytes * sps;
        double dflops = 2.0 * (double)o->batch * (per_token + per_seq) * sps;
        char batch_note[48] = "";
        if (o->batch > 1) snprintf(batch_note, sizeof batch_note, " (batch %" PRId64 ")", o->batch);
        printf("%s threads=%d: prefill(%" PRId64 " tokens) %.2f ms, full %.2f ms -> decode %" PRId64
               " steps %.2f ms: %.2f tokens/s%s, %.2f ms/%s, weights %.2f GB/s, copy %.2f "
               "GB/s, ratio %.3f; %.2f GFLOP/s, ratio to the FMA-free peak %.3f\n",
               name, nt, o->prompt_len * o->batch, tp * 1e3, tf * 1e3, decode_steps, dt * 1e3,
               sps * (double)o->batch, batch_note, 1e3 / sps, o->batch > 1 ? "step" : "token",
               wbw / 1e9, copy_bw / 1e9, wbw / copy_bw, dflops / 1e9, dflops / peak);
    }
    return 0;
}

/* The figures for one loaded model (a fixture or --model DIR). */
static int bench_model(const char *name, const KvModel *m, const BenchOptions *o, double copy_bw,
                       const double *peaks /* (n_threads) */, double load_s) {
    int rc = 1;
    int32_t *prompt = NULL;  /* (batch, prompt_len) */
    uint8_t *real = NULL;    /* (batch, prompt_len) */
    int32_t *pprompt = NULL; /* (batch, prefill_len) */
    uint8_t *preal = NULL;   /* (batch, prefill_len) */
    KvDecodeResult first, pfirst;
    int have_first = 0, first_threads = 0, have_pfirst = 0, pfirst_threads = 0;
    memset(&first, 0, sizeof first);
    memset(&pfirst, 0, sizeof pfirst);
    const KvConfig *c = &m->config;
    printf("\n%s: loaded in %.2f s; %" PRId64 " layers, hidden %" PRId64
           ", intermediate %" PRId64 ", heads %" PRId64 "/%" PRId64 " kv, head_dim %" PRId64
           ", vocab %" PRId64 ", window %" PRId64 "; weights read per token %" PRIu64
           " bytes as stored (%s matrices; every expert counted)\n",
           name, load_s, c->num_layers, c->hidden_size, c->intermediate_size,
           c->num_heads, c->num_kv_heads, c->head_dim, c->vocab_size, c->sliding_window,
           m->weight_bytes, kv_dtype_name(m->layers[0].wq.dtype));
    printf("%s: peak RSS after loading %.2f GiB (getrusage ru_maxrss)\n", name,
           bench_peak_rss() / 1073741824.0);

    if (!bench_make_prompt(o->batch, o->prompt_len, o->short_len, o->prompt_seed, c->vocab_size,
                           &prompt, &real)) {
        goto cleanup;
    }
    if (o->prefill_len > 0 &&
        !bench_make_prompt(o->batch, o->prefill_len, o->short_len, o->prompt_seed, c->vocab_size,
                           &pprompt, &preal)) {
        goto cleanup;
    }
    KvDecodeSpec prefill = {.batch = o->batch, .prompt_len = o->prompt_len, .prompt = prompt,
                            .prompt_real = real, .new_tokens = 1, .prefill_chunk = 0};
    KvDecodeSpec full = prefill;
    full.new_tokens = o->new_tokens;
    if (o->result_lines) {
        /* What a script needs to check it built the same prompt. */
        uint64_t ph = kv_fnv1a(KV_FNV_OFFSET, prompt,
                               (size_t)(o->batch * o->prompt_len) * sizeof *prompt);
        printf("RESULT phase=prompt batch=%" PRId64 " len=%" PRId64 " seed=%" PRIu64
               " vocab=%" PRId64 " fnv1a64=0x%016" PRIx64 "\n",
               o->batch, o->prompt_len, o->prompt_seed, c->vocab_size, ph);
    }

    for (int ti = 0; ti < o->n_threads; ti++) {
        int nt = o->threads[ti];
        if (!bench_set_threads(nt)) {
            printf("%s threads=%d: skipped (built without OpenMP)\n", name, nt);
            continue;
        }
        if (o->prefill_len > 0) {
            KvDecodeResult pres;
            memset(&pres, 0, sizeof pres);
            if (bench_prefill(name, m, o, nt, pprompt, preal, peaks[ti], &pres) != 0) {
                goto cleanup;
            }
            /* DESIGN §4 for the rows > 1 path: the prefill's logits too. */
            if (!have_pfirst) {
                pfirst = pres;
                have_pfirst = 1;
                pfirst_threads = nt;
            } else {
                size_t nlog = (size_t)(pres.steps * pres.batch * pres.vocab);
                int same = pres.steps == pfirst.steps &&
                           memcmp(pres.logits, pfirst.logits, nlog * sizeof *pres.logits) == 0;
                printf("%s threads=%d vs threads=%d: prefill logits bitwise %s\n", name, nt,
                       pfirst_threads, same ? "identical" : "DIFFERENT");
                kv_decode_result_free(&pres);
                if (!same) {
                    fprintf(stderr, "bench_decode: nondeterminism across thread counts in %s\n",
                            name);
                    goto cleanup;
                }
            }
        }
        if (o->prefill_only) continue;
        double tf;
        KvDecodeResult res;
        memset(&res, 0, sizeof res);
        if (o->once) {
            /* one run, cold: what a user of the reference waits for */
            if (bench_decode_best(m, &full, 1, &tf, &res) != 0) goto cleanup;
            printf("%s threads=%d: one full decode (batch %" PRId64 " x prompt %" PRId64
                   " tokens + %" PRId64 " new tokens, no warm-up) %.2f s\n",
                   name, nt, o->batch, o->prompt_len, o->new_tokens, tf);
        } else if (bench_decode_figure(name, m, o, nt, &prefill, &full, copy_bw, peaks[ti],
                                       &res) != 0) {
            goto cleanup;
        }
        /* DESIGN §4: the reference is bitwise the same for any thread count. */
        if (!have_first) {
            first = res;
            have_first = 1;
            first_threads = nt;
        } else {
            size_t nlog = (size_t)(res.steps * res.batch * res.vocab);
            size_t ntok = (size_t)(res.steps * res.batch);
            int same = res.steps == first.steps &&
                       memcmp(res.tokens, first.tokens, ntok * sizeof *res.tokens) == 0 &&
                       memcmp(res.logits, first.logits, nlog * sizeof *res.logits) == 0;
            printf("%s threads=%d vs threads=%d: tokens and logits bitwise %s\n", name, nt,
                   first_threads, same ? "identical" : "DIFFERENT");
            kv_decode_result_free(&res);
            if (!same) {
                fprintf(stderr, "bench_decode: nondeterminism across thread counts in %s\n", name);
                goto cleanup;
            }
        }
    }
    if (have_first) {
        printf("%s tokens%s:", name, first.batch > 1 ? " (row 0)" : "");
        for (int64_t s = 0; s < first.steps; s++) printf(" %" PRId32, first.tokens[s * first.batch]);
        printf("\n");
        if (o->short_len > 0 && first.batch > 1) { /* the left-padded row */
            printf("%s tokens (row 1, %" PRId64 " real prompt tokens):", name, o->short_len);
            for (int64_t s = 0; s < first.steps; s++) {
                printf(" %" PRId32, first.tokens[s * first.batch + 1]);
            }
            printf("\n");
        }
        /* every logit's bytes, so two builds or two storages of one model
         * can be compared bit for bit from their output */
        printf("%s logits fnv1a: 0x%016" PRIx64 " (%" PRId64 " steps x %" PRId64 " rows x %" PRId64
               " ids)\n",
               name,
               kv_fnv1a(KV_FNV_OFFSET, first.logits,
                        (size_t)(first.steps * first.batch * first.vocab) * sizeof(float)),
               first.steps, first.batch, first.vocab);
        for (int64_t b = 0; o->result_lines && b < first.batch; b++) {
            printf("RESULT phase=tokens threads=%d row=%" PRId64 " ids=", first_threads, b);
            for (int64_t s = 0; s < first.steps; s++) {
                printf("%s%" PRId32, s ? "," : "", first.tokens[s * first.batch + b]);
            }
            printf("\n");
        }
    }
    rc = 0;

cleanup:
    if (have_first) kv_decode_result_free(&first);
    if (have_pfirst) kv_decode_result_free(&pfirst);
    free(prompt);
    free(real);
    free(pprompt);
    free(preal);
    return rc;
}

static int bench_family(const char *fixture_name, const BenchOptions *o, double copy_bw,
                        const double *peaks /* (n_threads) */) {
    KvFixtureModel fm;
    KvError err = {{0}};
    memset(&fm, 0, sizeof fm);
    double t0 = bench_now();
    KvStatus st = kv_fixture_load(fixture_name, o->seed, &fm, &err);
    if (st != KV_OK) {
        fprintf(stderr, "bench_decode: kv_fixture_load(%s, seed %" PRIu64 ") failed (%d): %s\n",
                fixture_name, o->seed, (int)st, err.msg);
        return 1;
    }
    int rc = bench_model(fixture_name, &fm.model, o, copy_bw, peaks, bench_now() - t0);
    kv_fixture_free(&fm);
    return rc;
}

/* --model DIR: a checkpoint directory (config.json + safetensors, single or
 * sharded) through the project's loader. */
static int bench_model_dir(const BenchOptions *o, double copy_bw,
                           const double *peaks /* (n_threads) */) {
    KvModel m;
    KvError err = {{0}};
    double t0 = bench_now();
    KvStatus st = kv_model_load_dir(o->model_dir, &m, &err);
    if (st != KV_OK) {
        fprintf(stderr, "bench_decode: --model %s: cannot load (%d): %s\n", o->model_dir, (int)st,
                err.msg);
        return 1;
    }
    int rc = bench_model(o->model_dir, &m, o, copy_bw, peaks, bench_now() - t0);
    kv_model_free(&m);
    return rc;
}

/* ---- options ----------------------------------------------------------- */

static void bench_usage(FILE *f) {
    fprintf(f,
            "usage: bench_decode [--family gemma2|mistral|both] [--threads LIST] [--new-tokens N]\n"
            "                    [--prompt-len P] [--repeats R] [--copy-mib M] [--seed S]\n"
            "                    [--prompt-seed S] [--prefill-len L] [--prefill-only]\n"
            "                    [--matmul auto|portable|avx2|avx512] [--batch B] [--short-len S]\n"
            "                    [--once] [--quick] [--result-lines]\n"
            "       bench_decode --model DIR [--prompt-len L] [--batch B] [--new-tokens N] ...\n"
            "  --model DIR      a checkpoint directory (config.json + safetensors) instead of\n"
            "                   the medium fixtures; the prefill figure then uses --prompt-len\n"
            "  --batch B        prompts per run, for both figures (default 1)\n"
            "  --short-len S    a left-padded batch (the seed report's): odd rows hold S real\n"
            "                   tokens left-padded to the prompt length; needs --batch >= 2\n"
            "                   and S below both figures' prompt lengths\n"
            "  --once           one full decode per thread count, timed cold (no warm-up,\n"
            "                   no copy test, no prefill figure): for shapes where a run\n"
            "                   takes minutes\n"
            "  --threads LIST   comma-separated OpenMP thread counts (default 1,2)\n"
            "  --new-tokens N   tokens per run, >= 2 (default 32: 31 timed decode steps)\n"
            "  --prompt-len P   the decode figure's prompt (default 16)\n"
            "  --prefill-len L  the prefill figure's prompt (default 512, --quick 32; 0: none)\n"
            "  --prefill-only   the prefill figure alone: no copy test, no decode figure\n"
            "  --matmul PATH    the rows > 1 matmul (prefill): auto (default: the fastest\n"
            "                   this CPU runs), portable (the per-output SSE kernel, as\n"
            "                   before the GEMM), avx2 or avx512; every path gives the\n"
            "                   same bits\n"
            "  --quick          tiny fixtures, %d MiB copy test: a smoke test\n"
            "  --result-lines   also one machine-readable RESULT line per figure (see the\n"
            "                   file comment; bench/vs_torch.py reads them)\n",
            BENCH_COPY_MIB_QUICK);
}

static int bench_parse_i64(const char *s, int64_t lo, int64_t *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 0);
    if (errno != 0 || end == s || *end != '\0' || v < lo) return 0;
    *out = v;
    return 1;
}

static int bench_parse_threads(const char *s, BenchOptions *o) {
    o->n_threads = 0;
    const char *p = s;
    while (*p != '\0') {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (errno != 0 || end == p || v < 1 || v > 1024 || o->n_threads == BENCH_MAX_THREADS) return 0;
        o->threads[o->n_threads++] = (int)v;
        if (*end == ',') end++;
        else if (*end != '\0') return 0;
        p = end;
    }
    return o->n_threads > 0;
}

/* 1: options parsed; 2: help asked for; 0: bad usage (message printed). */
static int bench_parse(int argc, char **argv, BenchOptions *o) {
    memset(o, 0, sizeof *o);
    o->families[0] = o->families[1] = 1;
    o->threads[0] = 1;
    o->threads[1] = 2;
    o->n_threads = 2;
    o->new_tokens = 32;
    o->prompt_len = 16;
    o->prefill_len = -1; /* default set below, by --quick */
    o->matmul = KV_GEMM_AUTO;
    o->batch = 1;
    o->repeats = 3;
    o->copy_mib = BENCH_COPY_MIB_DEFAULT;
    o->seed = KV_FIXTURE_DEFAULT_SEED;
    o->prompt_seed = 0x62656e6368ULL; /* "bench" */
    int copy_set = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int64_t n;
        if (strcmp(a, "--quick") == 0) {
            o->quick = 1;
            continue;
        }
        if (strcmp(a, "--prefill-only") == 0) {
            o->prefill_only = 1;
            continue;
        }
        if (strcmp(a, "--result-lines") == 0) {
            o->result_lines = 1;
            continue;
        }
        if (strcmp(a, "--once") == 0) {
            o->once = 1;
            continue;
        }
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) return 2;
        if (v == NULL) {
            fprintf(stderr, "bench_decode: %s needs a value\n", a);
            return 0;
        }
        i++;
        if (strcmp(a, "--family") == 0) {
            if (strcmp(v, "gemma2") == 0) {
                o->families[0] = 1;
                o->families[1] = 0;
            } else if (strcmp(v, "mistral") == 0) {
                o->families[0] = 0;
                o->families[1] = 1;
            } else if (strcmp(v, "both") == 0) {
                o->families[0] = o->families[1] = 1;
            } else {
                fprintf(stderr, "bench_decode: --family: expected gemma2, mistral or both, got '%s'\n", v);
                return 0;
            }
        } else if (strcmp(a, "--threads") == 0) {
            if (!bench_parse_threads(v, o)) {
                fprintf(stderr, "bench_decode: --threads: expected a list like 1,2, got '%s'\n", v);
                return 0;
            }
        } else if (strcmp(a, "--new-tokens") == 0 && bench_parse_i64(v, 2, &n)) {
            o->new_tokens = n;
        } else if (strcmp(a, "--prompt-len") == 0 && bench_parse_i64(v, 1, &n)) {
            o->prompt_len = n;
        } else if (strcmp(a, "--model") == 0) {
            o->model_dir = v;
        } else if (strcmp(a, "--batch") == 0 && bench_parse_i64(v, 1, &n) && n <= 4096) {
            o->batch = n;
        } else if (strcmp(a, "--short-len") == 0 && bench_parse_i64(v, 1, &n)) {
            o->short_len = n;
        } else if (strcmp(a, "--prefill-len") == 0 && bench_parse_i64(v, 0, &n)) {
            o->prefill_len = n;
        } else if (strcmp(a, "--matmul") == 0) {
            if (strcmp(v, "auto") == 0) {
                o->matmul = KV_GEMM_AUTO;
            } else if (strcmp(v, "portable") == 0) {
                o->matmul = KV_GEMM_PORTABLE;
            } else if (strcmp(v, "avx512") == 0) {
                o->matmul = KV_GEMM_AVX512;
            } else if (strcmp(v, "avx2") == 0) {
                o->matmul = KV_GEMM_AVX2;
            } else {
                fprintf(stderr, "bench_decode: --matmul: expected auto, portable, avx2 or avx512, got '%s'\n", v);
                return 0;
            }
        } else if (strcmp(a, "--repeats") == 0 && bench_parse_i64(v, 1, &n) && n <= 1000) {
            o->repeats = (int)n;
        } else if (strcmp(a, "--copy-mib") == 0 && bench_parse_i64(v, 2, &n) && n <= 65536) {
            o->copy_mib = (size_t)n;
            copy_set = 1;
        } else if (strcmp(a, "--seed") == 0 && bench_parse_i64(v, 0, &n)) {
            o->seed = (uint64_t)n;
        } else if (strcmp(a, "--prompt-seed") == 0 && bench_parse_i64(v, 0, &n)) {
            o->prompt_seed = (uint64_t)n;
        } else {
            fprintf(stderr, "bench_decode: bad option or value: %s %s\n", a, v);
            return 0;
        }
    }
    if (o->quick && !copy_set) o->copy_mib = BENCH_COPY_MIB_QUICK;
    /* With --model the prefill figure is the decode's own prompt unless
     * asked otherwise. */
    if (o->prefill_len < 0) o->prefill_len = o->model_dir != NULL ? o->prompt_len : o->quick ? 32 : 512;
    if (o->once) o->prefill_len = 0; /* --once: the decode figure's one run only */
    if (o->prefill_only && o->prefill_len == 0) {
        fprintf(stderr, "bench_decode: --prefill-only needs --prefill-len > 0%s\n",
                o->once ? " and no --once" : "");
        return 0;
    }
    if (o->short_len > 0) {
        if (o->batch < 2) {
            fprintf(stderr, "bench_decode: --short-len %" PRId64 ": needs --batch 2 or more (odd "
                    "rows are the short prompts), found --batch %" PRId64 "\n",
                    o->short_len, o->batch);
            return 0;
        }
        const int64_t shortest = o->prefill_len > 0 && o->prefill_len < o->prompt_len
                                     ? o->prefill_len
                                     : o->prompt_len;
        if (o->short_len >= shortest) {
            fprintf(stderr, "bench_decode: --short-len %" PRId64 ": expected fewer tokens than "
                    "the %s (%" PRId64 "), so the short rows are left-padded\n",
                    o->short_len, shortest == o->prompt_len ? "--prompt-len" : "--prefill-len",
                    shortest);
            return 0;
        }
    }
    return 1;
}

int main(int argc, char **argv) {
    BenchOptions o;
    int parsed = bench_parse(argc, argv, &o);
    if (parsed == 2) {
        bench_usage(stdout);
        return 0;
    }
    if (parsed == 0) {
        bench_usage(stderr);
        return 2;
    }
    if (kv_gemm_set_path(o.matmul) != KV_OK) {
        fprintf(stderr, "bench_decode: --matmul %s: this CPU or build cannot run it\n",
                kv_gemm_path_name(o.matmul));
        return 2;
    }
    const char *size = o.quick ? "tiny" : "medium";
    if (o.model_dir != NULL) {
        printf("bench_decode: model %s", o.model_dir);
    } else {
        printf("bench_decode: fixtures %s, weight seed %" PRIu64, size, o.seed);
    }
    printf(", prompt seed %" PRIu64 ", batch %" PRId64 ", prompt %" PRId64 " tokens, new tokens %" PRId64
           " (%" PRId64 " timed decode steps), best of %d, threads",
           o.prompt_seed, o.batch, o.prompt_len, o.new_tokens, o.new_tokens - 1,
           o.once ? 1 : o.repeats);
    for (int i = 0; i < o.n_threads; i++) printf("%s%d", i ? "," : " ", o.threads[i]);
#ifdef _OPENMP
    printf(", OpenMP %d (max threads %d)", _OPENMP, omp_get_max_threads());
#else
    printf(", no OpenMP");
#endif
    printf(", %ld online CPUs\n", sysconf(_SC_NPROCESSORS_ONLN));
    if (o.prefill_len > 0) {
        printf("prefill figure: prompt %" PRId64 " tokens, rows > 1 matmul path %s\n",
               o.prefill_len, kv_gemm_path_name(kv_gemm_path()));
    } else {
        printf("prefill figure: none; rows > 1 matmul path %s\n",
               kv_gemm_path_name(kv_gemm_path()));
    }

    if (o.short_len > 0) {
        printf("left-padded batch: even rows %" PRId64 " real tokens, odd rows %" PRId64
               " real tokens after %" PRId64 " pads\n",
               o.prompt_len, o.short_len, o.prompt_len - o.short_len);
    }

    double copy_bw = 0.0;
    if (!o.prefill_only && !o.once) {
        if (bench_copy_bandwidth(o.copy_mib, &copy_bw) != 0) return 1;
        printf("copy bandwidth (best): %.2f GB/s\n", copy_bw / 1e9);
    }

    double peaks[BENCH_MAX_THREADS] = {0};
    if (o.prefill_len > 0) {
        static const char *const isa_loop[3] = {"SSE: 6 + 6 4-lane", "AVX2: 6 + 6 8-lane",
                                                "AVX-512: 8 + 8 16-lane"};
        static const char *const fma_loop[3] = {"", "12 independent 8-lane",
                                                "16 independent 16-lane"};
        const int isa = bench_isa();
        const int64_t iters = o.quick ? BENCH_PEAK_ITERS_QUICK : BENCH_PEAK_ITERS;
        for (int i = 0; i < o.n_threads; i++) {
            peaks[i] = bench_fp32_peak(o.threads[i], iters, isa, false);
            printf("FMA-free fp32 peak, %d thread%s: %.1f GFLOP/s (%s independent multiply "
                   "and add chains in registers, %" PRId64 " iterations a thread, best of %d; "
                   "a multiply and an add are one flop a lane each)\n",
                   o.threads[i], o.threads[i] == 1 ? "" : "s", peaks[i] / 1e9, isa_loop[isa],
                   iters, BENCH_PEAK_REPS);
            if (isa > 0) {
                /* what contraction would give this CPU (DESIGN §4) */
                const double fma = bench_fp32_peak(o.threads[i], iters / 2, isa, true);
                printf("FMA fp32 peak, %d thread%s: %.1f GFLOP/s, %.2fx the FMA-free peak (%s "
                       "fused multiply-add chains, an FMA two flops a lane; not used by the "
                       "reference)\n",
                       o.threads[i], o.threads[i] == 1 ? "" : "s", fma / 1e9, fma / peaks[i],
                       fma_loop[isa]);
            }
        }
    }

    int rc = 0;
    if (o.model_dir != NULL) {
        rc = bench_model_dir(&o, copy_bw, peaks) != 0;
    } else {
        static const char *families[2] = {"gemma2", "mistral"};
        for (int f = 0; f < 2 && rc == 0; f++) {
            if (!o.families[f]) continue;
            char name[64];
            snprintf(name, sizeof name, "%s-%s", families[f], size);
            rc = bench_family(name, &o, copy_bw, peaks) != 0;
        }
    }
    /* Last, so a log's final line says what the whole run needed. */
    const double rss = bench_peak_rss();
    printf("peak RSS: %.2f GiB (%.0f KiB, getrusage ru_maxrss)\n", rss / 1073741824.0,
           rss / 1024.0);
    return rc;
}
