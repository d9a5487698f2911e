/* test_math.c: unit tests of the CPU reference building blocks (reference/kvmath.h).
 *
 * Every expectation is computed here, independently of the code under test:
 * either by the documented formula in double precision (compared within a
 * named tolerance whose reason is given beside it), or, where kvmath.h
 * documents an exact F32 evaluation order (the kv_dot lane pattern, kv_matmul
 * being one kv_dot per element), by re-deriving that order in this file and
 * comparing bitwise. Inputs come from a fixed-seed generator local to this
 * file, and the seed is printed in every failure message. */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "attention.h"
#include "gemm.h"
#include "kvmath.h"

/* ---- deterministic inputs ---------------------------------------------- */

#define TEST_SEED 0x6b76726570726fULL /* "kvrepro" */

/* A 64-bit LCG (Knuth's MMIX constants). Kept local so the tests do not share
 * a generator with the fixtures they are meant to check independently. */
typedef struct {
    uint64_t s;
} TestRng;

static TestRng test_rng_seed(uint64_t seed) {
    TestRng g = {seed ^ 0x9E3779B97F4A7C15ULL};
    return g;
}

static uint64_t test_rng_next(TestRng *g) {
    g->s = g->s * 6364136223846793005ULL + 1442695040888963407ULL;
    return g->s;
}

/* Uniform in [-1, 1) with 24-bit resolution: exact in F32, so the double
 * expectation starts from the very same input values. */
static float test_rng_sym(TestRng *g) {
    uint32_t u = (uint32_t)(test_rng_next(g) >> 40); /* 24 bits */
    return (float)((double)u * (1.0 / 8388608.0) - 1.0);
}

/* Uniform integer in [lo, hi]. */
static int test_rng_int(TestRng *g, int lo, int hi) {
    uint64_t span = (uint64_t)(hi - lo + 1);
    return lo + (int)((test_rng_next(g) >> 33) % span);
}

/* Check's ck_assert_* records a mark point per passing assertion (a write to
 * the fork pipe), which is slow in the sweeps below; EXPECT only reaches
 * Check when the condition fails. */
#define EXPECT(cond, ...)                                                                          \
    do {                                                                                           \
        if (!(cond)) ck_abort_msg(__VA_ARGS__);                                                    \
    } while (0)

static float *test_alloc(int64_t n) {
    float *p = malloc((size_t)(n > 0 ? n : 1) * sizeof *p);
    ck_assert_ptr_nonnull(p);
    return p;
}

/* F32 unit roundoff: half an ULP of 1. */
#define U32 (1.0 / 16777216.0)

static uint32_t test_bits(float f) {
    uint32_t b;
    memcpy(&b, &f, sizeof b);
    return b;
}

/* ---- kv_dot ------------------------------------------------------------- */

/* Lengths around the 16-lane pattern: empty, tail only, one short of a full
 * block, exactly one block, one block plus tail, and longer mixes. */
static const int64_t DOT_LENGTHS[] = {0, 1, 15, 16, 17, 31, 33, 100, 1000};
#define N_DOT_LENGTHS ((int)(sizeof DOT_LENGTHS / sizeof DOT_LENGTHS[0]))

/* Floating-point error of an n-term F32 dot product: each product rounds once
 * (u) and each of at most n additions rounds once (u), so the error is at most
 * about (n + 1) u * sum|a_i b_i| (Higham, recursive summation bound; the lane
 * pattern has a shorter chain, so this is loose but never loose enough to hide
 * a dropped or doubled term, which costs a whole |a_i b_i|). The factor 2
 * covers the first-order bound's higher-order terms. */
static double dot_tol(int64_t n, double abs_sum) { return 2.0 * (double)(n + 1) * U32 * abs_sum; }

/* The documented lane pattern, re-derived from kvmath.h's comment. */
static float dot_pattern(const float *a, const float *b, int64_t n) {
    float lane[KV_DOT_LANES] = {0};
    int64_t n16 = n - n % KV_DOT_LANES;
    for (int64_t i = 0; i < n16; i++) lane[i % KV_DOT_LANES] = lane[i % KV_DOT_LANES] + a[i] * b[i];
    for (int step = KV_DOT_LANES / 2; step >= 1; step /= 2)
        for (int j = 0; j < step; j++) lane[j] = lane[j] + lane[j + step];
    float s = lane[0];
    for (int64_t i = n16; i < n; i++) s = s + a[i] * b[i];
    return s;
}

START_TEST(test_dot_vs_double) {
    int64_t n = DOT_LENGTHS[_i];
    uint64_t seed = TEST_SEED + (uint64_t)n;
    TestRng g = test_rng_seed(seed);
    float *a = test_alloc(n), *b = test_alloc(n);
    for (int64_t i = 0; i < n; i++) {
        a[i] = test_rng_sym(&g);
        b[i] = test_rng_sym(&g);
    }
    double exact = 0.0, abs_sum = 0.0;
    for (int64_t i = 0; i < n; i++) {
        exact += (double)a[i] * (double)b[i];
        abs_sum += fabs((double)a[i] * (double)b[i]);
    }
    float got = kv_dot(a, b, n);
    double tol = dot_tol(n, abs_sum);
    EXPECT(fabs((double)got - exact) <= tol,
                  "kv_dot n=%lld seed=%llu: got %.9g, double sum %.17g, |diff| %.3g > tol %.3g",
                  (long long)n, (unsigned long long)seed, (double)got, exact,
                  fabs((double)got - exact), tol);
    if (n == 0) EXPECT(got == 0.0f, "kv_dot n=0 must be 0, got %g", (double)got);
    free(a);
    free(b);
}
END_TEST

/* Small integers: every product (|.| <= 64) and every partial sum (|.| <=
 * 64000 < 2^24) is exact in F32, so any summation order gives exactly the
 * double result; a mismatch is a missing, repeated or misplaced term. */
START_TEST(test_dot_exact_integers) {
    int64_t n = DOT_LENGTHS[_i];
    uint64_t seed = TEST_SEED * 3 + (uint64_t)n;
    TestRng g = test_rng_seed(seed);
    float *a = test_alloc(n), *b = test_alloc(n);
    double exact = 0.0;
    for (int64_t i = 0; i < n; i++) {
        a[i] = (float)test_rng_int(&g, -8, 8);
        b[i] = (float)test_rng_int(&g, -8, 8);
        exact += (double)a[i] * (double)b[i];
    }
    float got = kv_dot(a, b, n);
    EXPECT((double)got == exact, "kv_dot exact integers n=%lld seed=%llu: got %.9g, want %.17g",
                  (long long)n, (unsigned long long)seed, (double)got, exact);
    free(a);
    free(b);
}
END_TEST

/* Position-tagged terms: a[i] = i + 1, b = e_k gives exactly k + 1, so a term
 * read from the wrong index (e.g. a tail that starts one late) is named. */
START_TEST(test_dot_each_index) {
    int64_t n = DOT_LENGTHS[_i];
    float *a = test_alloc(n), *b = test_alloc(n);
    for (int64_t i = 0; i < n; i++) a[i] = (float)(i + 1);
    for (int64_t k = 0; k < n; k++) {
        memset(b, 0, (size_t)n * sizeof *b);
        b[k] = 1.0f;
        float got = kv_dot(a, b, n);
        EXPECT(got == (float)(k + 1), "kv_dot n=%lld with b=e_%lld: got %g, want %lld",
                      (long long)n, (long long)k, (double)got, (long long)(k + 1));
    }
    free(a);
    free(b);
}
END_TEST

/* kvmath.h documents the exact F32 evaluation order (it is what makes the
 * reference bitwise reproducible); this re-derives it and requires equality. */
START_TEST(test_dot_lane_pattern_bitwise) {
    int64_t n = DOT_LENGTHS[_i];
    uint64_t seed = TEST_SEED * 5 + (uint64_t)n;
    TestRng g = test_rng_seed(seed);
    float *a = test_alloc(n), *b = test_alloc(n);
    for (int64_t i = 0; i < n; i++) {
        /* Mixed magnitudes make the rounding depend on the order. */
        a[i] = test_rng_sym(&g) * (float)(1 << test_rng_int(&g, 0, 12));
        b[i] = test_rng_sym(&g);
    }
    float want = dot_pattern(a, b, n);
    float got = kv_dot(a, b, n);
    EXPECT(test_bits(got) == test_bits(want),
                  "kv_dot n=%lld seed=%llu: got %.9g (0x%08x), documented lane pattern gives %.9g "
                  "(0x%08x)",
                  (long long)n, (unsigned long long)seed, (double)got, test_bits(got), (double)want,
                  test_bits(want));
    free(a);
    free(b);
}
END_TEST

/* ---- kv_matmul ---------------------------------------------------------- */

START_TEST(test_matmul) {
    /* Shapes: (rows, in, out) with a multi-row x, an `in` with a tail, and
     * one case exactly a multiple of 16. */
    static const int64_t shapes[][3] = {{1, 1, 1}, {3, 37, 19}, {4, 64, 8}, {2, 100, 33}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int64_t rows = shapes[s][0], in = shapes[s][1], out = shapes[s][2];
        uint64_t seed = TEST_SEED * 7 + s;
        TestRng g = test_rng_seed(seed);
        float *x = test_alloc(rows * in), *w = test_alloc(out * in), *y = test_alloc(rows * out);
        for (int64_t i = 0; i < rows * in; i++) x[i] = test_rng_sym(&g);
        for (int64_t i = 0; i < out * in; i++) w[i] = test_rng_sym(&g);
        kv_matmul(x, w, rows, in, out, y);
        for (int64_t r = 0; r < rows; r++) {
            for (int64_t o = 0; o < out; o++) {
                double exact = 0.0, abs_sum = 0.0;
                for (int64_t i = 0; i < in; i++) {
                    double p = (double)x[r * in + i] * (double)w[o * in + i];
                    exact += p;
                    abs_sum += fabs(p);
                }
                float got = y[r * out + o];
                double tol = dot_tol(in, abs_sum);
                EXPECT(fabs((double)got - exact) <= tol,
                              "kv_matmul (%lld,%lld,%lld) seed=%llu y[%lld,%lld]=%.9g, double %.17g, "
                              "tol %.3g",
                              (long long)rows, (long long)in, (long long)out,
                              (unsigned long long)seed, (long long)r, (long long)o, (double)got,
                              exact, tol);
                /* The contract: each element is one kv_dot of x's row and w's row. */
                float dot = kv_dot(x + r * in, w + o * in, in);
                EXPECT(test_bits(got) == test_bits(dot),
                              "kv_matmul (%lld,%lld,%lld) seed=%llu y[%lld,%lld]=%.9g is not bitwise "
                              "kv_dot = %.9g",
                              (long long)rows, (long long)in, (long long)out,
                              (unsigned long long)seed, (long long)r, (long long)o, (double)got,
                              (double)dot);
            }
        }
        free(x);
        free(w);
        free(y);
    }
}
END_TEST

/* The ensemble's sequential order (KV_ORDER_DOT_SEQUENTIAL): every output
 * bitwise one accumulator summed in ascending i, whatever the blocking
 * (rows not a multiple of 4, outputs not a multiple of 8, one row). */
START_TEST(test_matmul_sequential) {
    /* rows below 4 (a decode step's) take four blocks of outputs at once:
     * whole spans of 32 and a partial one */
    static const int64_t shapes[][3] = {{1, 1, 1},    {1, 37, 8},    {3, 37, 19},
                                        {4, 64, 8},   {5, 100, 33},  {9, 129, 17},
                                        {8, 640, 64}, {1, 37, 70},   {2, 129, 64},
                                        {3, 640, 96}, {2, 17, 33}};
    /* every path: the AVX-512 and AVX2 builds of the block kernel and the plain one */
    static const KvGemmPath paths[] = {KV_GEMM_AVX512, KV_GEMM_AVX2, KV_GEMM_PORTABLE};
    for (size_t t = 0; t < 3 * sizeof shapes / sizeof shapes[0]; t++) {
        const size_t s = t / 3;
        if (kv_gemm_set_path(paths[t % 3]) != KV_OK) continue; /* not on this CPU */
        const int64_t rows = shapes[s][0], in = shapes[s][1], out = shapes[s][2];
        TestRng g = test_rng_seed(TEST_SEED * 11 + s);
        float *x = test_alloc(rows * in), *w = test_alloc(out * in), *y = test_alloc(rows * out);
        for (int64_t i = 0; i < rows * in; i++) x[i] = test_rng_sym(&g);
        for (int64_t i = 0; i < out * in; i++) w[i] = test_rng_sym(&g);
        kv_matmul_sequential(x, kv_mat_f32(w), rows, in, out, y);
        kv_gemm_set_path(KV_GEMM_AUTO);
        for (int64_t r = 0; r < rows; r++) {
            for (int64_t o = 0; o < out; o++) {
                float acc = 0.0f;
                for (int64_t i = 0; i < in; i++) acc += x[r * in + i] * w[o * in + i];
                EXPECT(test_bits(y[r * out + o]) == test_bits(acc),
                       "kv_matmul_sequential (%lld,%lld,%lld) y[%lld,%lld]=%.9g, one accumulator "
                       "%.9g (%s)", (long long)rows, (long long)in, (long long)out,
                       (long long)r, (long long)o, (double)y[r * out + o], (double)acc,
                       kv_gemm_path_name(paths[t % 3]));
            }
        }
        free(x);
        free(w);
        free(y);
    }
}
END_TEST

/* ---- the blocked GEMM (gemm.h) ------------------------------------------ */

/* Shapes around the GEMM's blocking (gemm.c: 6 x 4 micro-tiles, 48-row by
 * 64-output jobs, 512-element passes over `in`): rows 1 (the decode kernel),
 * below, at and past one row block and one job; in below, at and past one
 * 16-lane block, with tails, and past several passes; out below, at and past
 * one tile and one job. */
static const int64_t GEMM_ROWS[] = {1, 2, 3, 5, 17, 64};
static const int64_t GEMM_INS[] = {1, 15, 16, 17, 31, 64, 257, 2304};
static const int64_t GEMM_OUTS[] = {1, 3, 7, 64, 130};
#define N_GEMM_ROWS ((int)(sizeof GEMM_ROWS / sizeof GEMM_ROWS[0]))
#define N_GEMM_INS ((int)(sizeof GEMM_INS / sizeof GEMM_INS[0]))
#define N_GEMM_OUTS ((int)(sizeof GEMM_OUTS / sizeof GEMM_OUTS[0]))

/* The paths every rows > 1 matmul can take, and the input kinds: plain
 * values of mixed magnitude (so rounding depends on the order), sparse
 * NaN / infinities / signed zeros / denormals, and x all denormal (denormal
 * products and lane sums, which DAZ/FTZ would flush). */
static const KvGemmPath GEMM_PATHS[] = {KV_GEMM_AVX512, KV_GEMM_AVX2, KV_GEMM_PORTABLE};
#define N_GEMM_PATHS 3
enum { VAL_PLAIN, VAL_SPECIAL, VAL_DENORMAL, N_VAL_KINDS };
static const char *const VAL_NAMES[] = {"plain", "special", "denormal"};

static float gemm_value(TestRng *g, int kind, int is_x) {
    const float plain = test_rng_sym(g) * (float)(1 << test_rng_int(g, 0, 12));
    if (kind == VAL_DENORMAL) {
        /* x in the denormal range (below 2^-126), w of order 1..2^8: the
         * products and lane sums are denormal or barely normal. */
        return is_x ? test_rng_sym(g) * 0x1p-127f * (float)(1 << test_rng_int(g, 0, 20)) : plain;
    }
    if (kind == VAL_SPECIAL) {
        switch (test_rng_int(g, 0, 63)) {
        case 0: return NAN;
        case 1: return INFINITY;
        case 2: return -INFINITY;
        case 3: return -0.0f;
        case 4: return 0x1p-140f;
        default: return plain;
        }
    }
    return plain;
}

/* Bitwise equality, except that any NaN matches any NaN: which NaN operand
 * an operation returns (sign, payload) is left open by IEEE 754 and by C
 * (GCC may commute x * w), and inf * 0 makes x86's negative default NaN. */
static int gemm_same(float a, float b) {
    return test_bits(a) == test_bits(b) || (isnan(a) && isnan(b));
}

/* One configuration (path, thread count, parallel threshold) over every
 * shape: kv_matmul and kv_matmul_multi (three matrices of one input, as
 * q/k/v), on F32 weights and on the same weights stored as BF16 and F16,
 * against kv_dot per element. y is poisoned first so a skipped
 * element is seen. */
static void gemm_check_shape(int64_t rows, int64_t in, int64_t out, int kind, KvGemmPath path,
                             int threads, int64_t min_work) {
    const uint64_t seed = TEST_SEED * 11 + (uint64_t)(rows * 1000003 + in * 1009 + out) +
                          (uint64_t)kind;
    TestRng g = test_rng_seed(seed);
    const int64_t outs[3] = {out, out + 5, 3};
    float *x = test_alloc(rows * in); /* (rows, in) */
    float *w[3], *y[3], *want[3];    /* (outs[j], in), (rows, outs[j]) x 2 */
    /* The weights as stored 16-bit values (the F32 ones rounded to BF16;
     * the same bytes read as F16), each against kv_dot on its widened F32. */
    uint8_t *w16[3];                 /* (outs[j], in) 16-bit */
    float *want16[2][3];             /* [BF16, F16] (rows, outs[j]) */
    static const KvDtype dt16[2] = {KV_DTYPE_BF16, KV_DTYPE_F16};
    for (int64_t i = 0; i < rows * in; i++) x[i] = gemm_value(&g, kind, 1);
    for (int j = 0; j < 3; j++) {
        w[j] = test_alloc(outs[j] * in);
        y[j] = test_alloc(rows * outs[j]);
        want[j] = test_alloc(rows * outs[j]);
        for (int64_t i = 0; i < outs[j] * in; i++) w[j][i] = gemm_value(&g, kind, 0);
        for (int64_t r = 0; r < rows; r++)
            for (int64_t o = 0; o < outs[j]; o++)
                want[j][r * outs[j] + o] = kv_dot(x + r * in, w[j] + o * in, in);
        w16[j] = malloc((size_t)(outs[j] * in) * 2 + 1);
        ck_assert_ptr_nonnull(w16[j]);
        kv_f32_to_bf16(w[j], (size_t)(outs[j] * in), w16[j]);
        float *wide = test_alloc(outs[j] * in); /* (outs[j], in) */
        for (int d = 0; d < 2; d++) {
            kv_dtype_to_f32(dt16[d], w16[j], (size_t)(outs[j] * in), wide);
            want16[d][j] = test_alloc(rows * outs[j]);
            for (int64_t r = 0; r < rows; r++)
                for (int64_t o = 0; o < outs[j]; o++)
                    want16[d][j][r * outs[j] + o] = kv_dot(x + r * in, wide + o * in, in);
        }
        free(wide);
    }
    /* 0: kv_matmul, 1: kv_matmul_multi on F32, 2 and 3: on BF16 and F16 as stored */
    static const char *const mode_names[4] = {"kv_matmul", "kv_matmul_multi",
                                              "kv_matmul_multi (BF16 stored)",
                                              "kv_matmul_multi (F16 stored)"};
    for (int mode = 0; mode < 4; mode++) {
        const int count = mode == 0 ? 1 : 3;
        for (int j = 0; j < 3; j++)
            for (int64_t i = 0; i < rows * outs[j]; i++) y[j][i] = 12345.0f;
        KvMat ws[3];
        for (int j = 0; j < 3; j++) {
            ws[j] = kv_mat_f32(w[j]);
            if (mode >= 2) ws[j] = (KvMat){w16[j], dt16[mode - 2], NULL};
        }
        if (mode == 0) {
            kv_matmul(x, w[0], rows, in, out, y[0]);
        } else {
            kv_matmul_multi(x, rows, in, 3, ws, outs, y);
        }
        for (int j = 0; j < count; j++) {
            const float *wants = mode >= 2 ? want16[mode - 2][j] : want[j]; /* (rows, outs[j]) */
            for (int64_t r = 0; r < rows; r++) {
                for (int64_t o = 0; o < outs[j]; o++) {
                    const float got = y[j][r * outs[j] + o], dot = wants[r * outs[j] + o];
                    EXPECT(gemm_same(got, dot),
                           "%s (%lld,%lld,%lld) matrix %d, %s inputs, path %s, %d thread(s), "
                           "min_work %lld, seed=%llu: y[%lld,%lld]=%.9g (0x%08x) is not bitwise "
                           "kv_dot = %.9g (0x%08x)",
                           mode_names[mode], (long long)rows,
                           (long long)in, (long long)outs[j], j, VAL_NAMES[kind],
                           kv_gemm_path_name(path), threads, (long long)min_work,
                           (unsigned long long)seed, (long long)r, (long long)o, (double)got,
                           test_bits(got), (double)dot, test_bits(dot));
                }
            }
        }
    }
    free(x);
    for (int j = 0; j < 3; j++) {
        free(w[j]);
        free(w16[j]);
        free(y[j]);
        free(want[j]);
        free(want16[0][j]);
        free(want16[1][j]);
    }
}

/* loop index i: path = i / N_VAL_KINDS, input kind = i % N_VAL_KINDS. Every
 * shape, with 1 and 2 OpenMP threads, at the default parallel threshold (the
 * small shapes run serially) and at 0 (every region parallel). */
START_TEST(test_gemm_bitwise_kv_dot) {
    const KvGemmPath path = GEMM_PATHS[_i / N_VAL_KINDS];
    const int kind = _i % N_VAL_KINDS;
    if (!kv_gemm_path_supported(path)) {
        printf("test_gemm_bitwise_kv_dot: path %s skipped: this CPU or build cannot run it\n",
               kv_gemm_path_name(path));
        return;
    }
    ck_assert_int_eq(kv_gemm_set_path(path), KV_OK);
    ck_assert_int_eq(kv_gemm_path(), path);
#ifdef _OPENMP
    const int saved = omp_get_max_threads();
    const int thread_counts[] = {1, 2};
#else
    const int thread_counts[] = {1};
#endif
    const int64_t min_works[] = {KV_PARALLEL_MIN_WORK, 0};
    for (size_t t = 0; t < sizeof thread_counts / sizeof thread_counts[0]; t++) {
#ifdef _OPENMP
        omp_set_num_threads(thread_counts[t]);
#endif
        for (int m = 0; m < 2; m++) {
            kv_set_parallel_min_work(min_works[m]);
            for (int a = 0; a < N_GEMM_ROWS; a++)
                for (int b = 0; b < N_GEMM_INS; b++)
                    for (int c = 0; c < N_GEMM_OUTS; c++)
                        gemm_check_shape(GEMM_ROWS[a], GEMM_INS[b], GEMM_OUTS[c], kind, path,
                                         thread_counts[t], min_works[m]);
        }
    }
#ifdef _OPENMP
    omp_set_num_threads(saved);
#endif
    kv_set_parallel_min_work(KV_PARALLEL_MIN_WORK);
    ck_assert_int_eq(kv_gemm_set_path(KV_GEMM_AUTO), KV_OK);
}
END_TEST

/* The path setter: AUTO resolves to the fastest supported path (never
 * AUTO), a path the CPU cannot run and a value outside the enum are refused
 * and leave the path as it was. */
START_TEST(test_gemm_path_setter) {
    ck_assert_int_eq(kv_gemm_set_path(KV_GEMM_AUTO), KV_OK);
    const KvGemmPath autop = kv_gemm_path();
    ck_assert_int_ne(autop, KV_GEMM_AUTO);
    ck_assert_int_eq(autop, kv_gemm_path_supported(KV_GEMM_AVX512) ? KV_GEMM_AVX512
                            : kv_gemm_path_supported(KV_GEMM_AVX2) ? KV_GEMM_AVX2
                                                                    : KV_GEMM_PORTABLE);
    ck_assert_int_eq(kv_gemm_set_path(KV_GEMM_PORTABLE), KV_OK);
    ck_assert_int_eq(kv_gemm_path(), KV_GEMM_PORTABLE);
    ck_assert_int_eq(kv_gemm_set_path((KvGemmPath)99), KV_ERR_INPUT);
    ck_assert_int_eq(kv_gemm_path(), KV_GEMM_PORTABLE);
    if (!kv_gemm_path_supported(KV_GEMM_AVX512)) {
        ck_assert_int_eq(kv_gemm_set_path(KV_GEMM_AVX512), KV_ERR_INPUT);
        ck_assert_int_eq(kv_gemm_path(), KV_GEMM_PORTABLE);
    }
    if (!kv_gemm_path_supported(KV_GEMM_AVX2)) {
        ck_assert_int_eq(kv_gemm_set_path(KV_GEMM_AVX2), KV_ERR_INPUT);
        ck_assert_int_eq(kv_gemm_path(), KV_GEMM_PORTABLE);
    }
    ck_assert_str_eq(kv_gemm_path_name(KV_GEMM_AVX512), "avx512");
    ck_assert_str_eq(kv_gemm_path_name(KV_GEMM_AVX2), "avx2");
    ck_assert_str_eq(kv_gemm_path_name(KV_GEMM_PORTABLE), "portable");
    ck_assert_int_eq(kv_gemm_set_path(KV_GEMM_AUTO), KV_OK);
}
END_TEST

/* ---- kv_rmsnorm --------------------------------------------------------- */

/* The sum of squares carries the dot-product error (~n u relative, all terms
 * positive); rsqrt halves it and adds a few roundings; the final products add
 * two more. Relative to |expected|: (n + 16) u, times 2 for slack. */
static double rmsnorm_rel_tol(int64_t n) { return 2.0 * (double)(n + 16) * U32; }

static void rmsnorm_expect(const float *x, const float *w, int64_t n, float eps, int offset,
                           double *out) {
    double ss = 0.0;
    for (int64_t i = 0; i < n; i++) ss += (double)x[i] * (double)x[i];
    double r = 1.0 / sqrt(ss / (double)n + (double)eps);
    for (int64_t i = 0; i < n; i++) {
        double scale = offset ? 1.0 + (double)w[i] : (double)w[i];
        out[i] = (double)x[i] * r * scale;
    }
}

START_TEST(test_rmsnorm_forms) {
    static const int64_t lengths[] = {1, 16, 33, 128, 1000};
    const float eps = 1e-6f;
    for (size_t s = 0; s < sizeof lengths / sizeof lengths[0]; s++) {
        int64_t n = lengths[s];
        for (int offset = 0; offset <= 1; offset++) {
            uint64_t seed = TEST_SEED * 11 + s;
            TestRng g = test_rng_seed(seed);
            float *x = test_alloc(n), *w = test_alloc(n), *got = test_alloc(n);
            double *want = malloc((size_t)n * sizeof *want);
            ck_assert_ptr_nonnull(want);
            for (int64_t i = 0; i < n; i++) {
                x[i] = 3.0f * test_rng_sym(&g);
                w[i] = 0.5f * test_rng_sym(&g);
            }
            kv_rmsnorm(x, w, n, eps, offset != 0, got);
            rmsnorm_expect(x, w, n, eps, offset, want);
            double tol = rmsnorm_rel_tol(n);
            for (int64_t i = 0; i < n; i++) {
                EXPECT(fabs((double)got[i] - want[i]) <= tol * fabs(want[i]) + 1e-30,
                              "kv_rmsnorm %s n=%lld seed=%llu out[%lld]=%.9g, formula %.17g, rel "
                              "tol %.3g",
                              offset ? "gemma2 (1+w)" : "mistral (w)", (long long)n,
                              (unsigned long long)seed, (long long)i, (double)got[i], want[i], tol);
            }
            free(x);
            free(w);
            free(got);
            free(want);
        }
    }
}
END_TEST

/* With w = 0 the two forms are as far apart as they can be: gemma2's (1 + w)
 * gives the normalized x, mistral's w gives zeros. A swapped flag fails. */
START_TEST(test_rmsnorm_forms_differ) {
    enum { N = 24 };
    float x[N], w[N], g2[N], mi[N];
    TestRng g = test_rng_seed(TEST_SEED * 13);
    for (int i = 0; i < N; i++) {
        x[i] = test_rng_sym(&g) + 2.0f; /* in [1, 3): no zeros */
        w[i] = 0.0f;
    }
    kv_rmsnorm(x, w, N, 1e-6f, true, g2);
    kv_rmsnorm(x, w, N, 1e-6f, false, mi);
    double ref[N];
    rmsnorm_expect(x, w, N, 1e-6f, 1, ref);
    for (int i = 0; i < N; i++) {
        EXPECT(mi[i] == 0.0f, "mistral rmsnorm with w=0 must be 0, out[%d]=%g", i,
                      (double)mi[i]);
        EXPECT(fabs((double)g2[i] - ref[i]) <= rmsnorm_rel_tol(N) * fabs(ref[i]),
                      "gemma2 rmsnorm with w=0 must be x*rsqrt(mean(x^2)+eps): out[%d]=%.9g want %.9g",
                      i, (double)g2[i], ref[i]);
        EXPECT(g2[i] != mi[i], "gemma2 and mistral rmsnorm agree at %d", i);
    }
    /* And with random w they still differ (by x * rsqrt(...) in each element). */
    for (int i = 0; i < N; i++) w[i] = test_rng_sym(&g);
    kv_rmsnorm(x, w, N, 1e-6f, true, g2);
    kv_rmsnorm(x, w, N, 1e-6f, false, mi);
    for (int i = 0; i < N; i++) EXPECT(g2[i] != mi[i], "rmsnorm forms agree at %d", i);
}
END_TEST

/* All-zero input: eps keeps rsqrt finite and the output is exactly zero. */
START_TEST(test_rmsnorm_zero_input) {
    float x[8] = {0}, w[8] = {1, 1, 1, 1, 1, 1, 1, 1}, out[8];
    for (int offset = 0; offset <= 1; offset++) {
        kv_rmsnorm(x, w, 8, 1e-6f, offset != 0, out);
        for (int i = 0; i < 8; i++)
            EXPECT(out[i] == 0.0f, "rmsnorm of zeros (offset=%d) out[%d]=%g", offset, i,
                          (double)out[i]);
    }
}
END_TEST

/* ---- RoPE --------------------------------------------------------------- */

/* inv_freq as transformers computes it rounds the exponent 2i/d to F32 first
 * (relative error u, amplified by ln(theta) * exponent <= ln(theta) in the
 * result) and then pow and the division round (a few u). */
static double rope_inv_freq_rel_tol(double theta) { return (8.0 + 2.0 * log(theta)) * U32; }

START_TEST(test_rope_inv_freq) {
    static const int64_t dims[] = {2, 8, 32, 64, 128, 256};
    static const double thetas[] = {10000.0, 1000000.0, 500000.0};
    for (size_t t = 0; t < sizeof thetas / sizeof thetas[0]; t++) {
        for (size_t d = 0; d < sizeof dims / sizeof dims[0]; d++) {
            int64_t hd = dims[d];
            float *f = test_alloc(hd / 2);
            kv_rope_inv_freq(hd, thetas[t], f);
            double tol = rope_inv_freq_rel_tol(thetas[t]);
            for (int64_t i = 0; i < hd / 2; i++) {
                double want = 1.0 / pow(thetas[t], (double)(2 * i) / (double)hd);
                EXPECT(fabs((double)f[i] - want) <= tol * want,
                              "kv_rope_inv_freq d=%lld theta=%g i=%lld: got %.9g want %.17g (rel "
                              "tol %.3g)",
                              (long long)hd, thetas[t], (long long)i, (double)f[i], want, tol);
            }
            EXPECT(f[0] == 1.0f, "inv_freq[0] must be exactly 1, got %.9g", (double)f[0]);
            free(f);
        }
    }
}
END_TEST

/* Test-side inv_freq (double, rounded once) so kv_rope_apply is checked
 * against its own contract, not against kv_rope_inv_freq. */
static void rope_test_inv_freq(int64_t hd, double theta, float *f) {
    for (int64_t i = 0; i < hd / 2; i++) f[i] = (float)(1.0 / pow(theta, (double)(2 * i) / (double)hd));
}

/* The angle is formed in F32 exactly as documented ((float)pos * inv_freq);
 * from there cos/sin (a couple of ULP in F32 libm) and one product and one sum
 * each add a rounding. Absolute, relative to the pair's magnitude. */
#define ROPE_TOL (8.0 * U32)

START_TEST(test_rope_apply_formula) {
    static const int64_t dims[] = {2, 8, 32, 128};
    static const int64_t positions[] = {0, 1, 2, 15, 16, 17, 100, 4097, 100003};
    for (size_t d = 0; d < sizeof dims / sizeof dims[0]; d++) {
        int64_t hd = dims[d], h = hd / 2;
        float *f = test_alloc(h), *x = test_alloc(hd), *y = test_alloc(hd);
        rope_test_inv_freq(hd, 10000.0, f);
        for (size_t p = 0; p < sizeof positions / sizeof positions[0]; p++) {
            int64_t pos = positions[p];
            uint64_t seed = TEST_SEED * 17 + d * 100 + p;
            TestRng g = test_rng_seed(seed);
            for (int64_t i = 0; i < hd; i++) x[i] = 2.0f * test_rng_sym(&g);
            memcpy(y, x, (size_t)hd * sizeof *y);
            kv_rope_apply(y, hd, f, pos);
            for (int64_t i = 0; i < h; i++) {
                float angle_f = (float)pos * f[i];
                double c = cos((double)angle_f), s = sin((double)angle_f);
                double lo = (double)x[i] * c - (double)x[i + h] * s;
                double hi = (double)x[i + h] * c + (double)x[i] * s;
                double mag = fabs((double)x[i]) + fabs((double)x[i + h]);
                double tol = ROPE_TOL * mag + 1e-30;
                EXPECT(fabs((double)y[i] - lo) <= tol && fabs((double)y[i + h] - hi) <= tol,
                              "kv_rope_apply d=%lld pos=%lld seed=%llu pair (%lld,%lld): got "
                              "(%.9g, %.9g), rotate_half formula (%.9g, %.9g), tol %.3g",
                              (long long)hd, (long long)pos, (unsigned long long)seed, (long long)i,
                              (long long)(i + h), (double)y[i], (double)y[i + h], lo, hi, tol);
                /* A rotation preserves each (i, i+h) pair's norm. */
                double n0 = (double)x[i] * x[i] + (double)x[i + h] * x[i + h];
                double n1 = (double)y[i] * y[i] + (double)y[i + h] * y[i + h];
                EXPECT(fabs(n1 - n0) <= 8.0 * ROPE_TOL * (n0 + 1e-30),
                              "kv_rope_apply d=%lld pos=%lld pair %lld norm^2 %.9g -> %.9g",
                              (long long)hd, (long long)pos, (long long)i, n0, n1);
            }
            if (pos == 0) {
                for (int64_t i = 0; i < hd; i++)
                    EXPECT(y[i] == x[i], "kv_rope_apply at position 0 must be the identity: "
                                  "x[%lld] %.9g -> %.9g", (long long)i, (double)x[i], (double)y[i]);
            }
        }
        free(f);
        free(x);
        free(y);
    }
}
END_TEST

/* rotate_half (non-interleaved, transformers' Llama/Gemma/Mistral), not the
 * interleaved GPT-J pairing (2i, 2i+1): rotating e_0 must move weight into
 * index h = d/2 and leave index 1 at zero. */
START_TEST(test_rope_not_interleaved) {
    enum { D = 8, H = D / 2 };
    float f[H], x[D] = {1, 0, 0, 0, 0, 0, 0, 0};
    rope_test_inv_freq(D, 10000.0, f);
    kv_rope_apply(x, D, f, 1); /* angle_0 = 1 rad: cos 0.54, sin 0.84 */
    EXPECT(fabs((double)x[0] - cos(1.0)) <= ROPE_TOL, "x[0]=%.9g want cos(1)", (double)x[0]);
    EXPECT(fabs((double)x[H] - sin(1.0)) <= ROPE_TOL,
                  "rotate_half: e_0 at position 1 must put sin(1) at index h=%d, got %.9g", H,
                  (double)x[H]);
    EXPECT(x[1] == 0.0f,
                  "index 1 is %.9g: this is the interleaved (GPT-J) convention, not rotate_half",
                  (double)x[1]);
    for (int i = 0; i < D; i++)
        if (i != 0 && i != H) EXPECT(x[i] == 0.0f, "x[%d]=%g must stay 0", i, (double)x[i]);
}
END_TEST

/* ---- element-wise functions --------------------------------------------- */

/* F32 libm tanh/exp are within a couple of ULP; the surrounding divisions and
 * products add one rounding each. Relative to the result's magnitude. */
#define ELEMENTWISE_REL_TOL (8.0 * U32)

START_TEST(test_softcap) {
    static const float caps[] = {50.0f, 30.0f, 1.0f};
    TestRng g = test_rng_seed(TEST_SEED * 19);
    for (size_t c = 0; c < sizeof caps / sizeof caps[0]; c++) {
        float cap = caps[c];
        for (int k = 0; k < 500; k++) {
            float x = test_rng_sym(&g) * 4.0f * cap;
            double want = (double)cap * tanh((double)x / (double)cap);
            float got = kv_softcap(x, cap);
            EXPECT(fabs((double)got - want) <= ELEMENTWISE_REL_TOL * fabs(want) + 1e-30,
                          "kv_softcap(%.9g, %g) = %.9g, c*tanh(x/c) = %.17g (seed %llu)", (double)x,
                          (double)cap, (double)got, want, (unsigned long long)(TEST_SEED * 19));
            EXPECT(fabsf(got) <= cap, "kv_softcap(%g, %g) = %g exceeds the cap", (double)x,
                          (double)cap, (double)got);
        }
        /* Far past the knee tanh rounds to 1 in F32: the cap is reached exactly. */
        EXPECT(kv_softcap(1e4f * cap, cap) == cap, "kv_softcap(1e4*c, c) = %.9g, want %g",
                      (double)kv_softcap(1e4f * cap, cap), (double)cap);
        EXPECT(kv_softcap(-1e4f * cap, cap) == -cap, "kv_softcap(-1e4*c, c) = %.9g, want %g",
                      (double)kv_softcap(-1e4f * cap, cap), (double)-cap);
    }
    /* cap <= 0 means "no softcap": the value passes through unchanged. */
    static const float xs[] = {0.0f, 1.5f, -7.25f, 1e30f, -3e-20f};
    for (size_t i = 0; i < sizeof xs / sizeof xs[0]; i++) {
        EXPECT(test_bits(kv_softcap(xs[i], 0.0f)) == test_bits(xs[i]),
                      "kv_softcap(%g, 0) must be the identity, got %g", (double)xs[i],
                      (double)kv_softcap(xs[i], 0.0f));
        EXPECT(test_bits(kv_softcap(xs[i], -1.0f)) == test_bits(xs[i]),
                      "kv_softcap(%g, -1) must be the identity, got %g", (double)xs[i],
                      (double)kv_softcap(xs[i], -1.0f));
    }
}
END_TEST

static double gelu_tanh_formula(double x) {
    const double pi = 3.14159265358979323846;
    const double k = sqrt(2.0 / pi);
    return 0.5 * x * (1.0 + tanh(k * (x + 0.044715 * x * x * x)));
}

/* For negative x, 1 + tanh(...) cancels: an F32 implementation loses the
 * absolute accuracy of tanh (~u) times |x| / 2, so the bound is absolute in
 * |x| as well as relative to the result. */
static double gelu_tol(double x, double want) {
    return ELEMENTWISE_REL_TOL * (fabs(want) + fabs(x));
}

START_TEST(test_gelu_tanh) {
    TestRng g = test_rng_seed(TEST_SEED * 23);
    for (int k = 0; k < 2000; k++) {
        float x = 6.0f * test_rng_sym(&g);
        double want = gelu_tanh_formula((double)x);
        float got = kv_gelu_tanh(x);
        EXPECT(fabs((double)got - want) <= gelu_tol(x, want),
                      "kv_gelu_tanh(%.9g) = %.9g, formula %.17g (seed %llu)", (double)x, (double)got,
                      want, (unsigned long long)(TEST_SEED * 23));
    }
    EXPECT(kv_gelu_tanh(0.0f) == 0.0f, "gelu(0) = %g", (double)kv_gelu_tanh(0.0f));
    /* The tanh approximation, not the exact erf gelu: at x = 1 they differ by
     * 1.5e-4, far above the tolerance, so an erf implementation fails here. */
    double erf_gelu_1 = 0.5 * (1.0 + erf(1.0 / sqrt(2.0)));
    double tanh_gelu_1 = gelu_tanh_formula(1.0);
    float got1 = kv_gelu_tanh(1.0f);
    EXPECT(fabs((double)got1 - tanh_gelu_1) <= gelu_tol(1.0, tanh_gelu_1),
                  "kv_gelu_tanh(1) = %.9g, want %.9g", (double)got1, tanh_gelu_1);
    EXPECT(fabs((double)got1 - erf_gelu_1) > 100.0 * gelu_tol(1.0, erf_gelu_1),
                  "kv_gelu_tanh(1) = %.9g is the erf gelu (%.9g), not the tanh approximation",
                  (double)got1, erf_gelu_1);
}
END_TEST

START_TEST(test_silu) {
    TestRng g = test_rng_seed(TEST_SEED * 29);
    for (int k = 0; k < 2000; k++) {
        float x = 20.0f * test_rng_sym(&g);
        double want = (double)x / (1.0 + exp(-(double)x));
        float got = kv_silu(x);
        EXPECT(fabs((double)got - want) <= ELEMENTWISE_REL_TOL * fabs(want) + 1e-30,
                      "kv_silu(%.9g) = %.9g, x/(1+exp(-x)) = %.17g (seed %llu)", (double)x,
                      (double)got, want, (unsigned long long)(TEST_SEED * 29));
    }
    EXPECT(kv_silu(0.0f) == 0.0f, "silu(0) = %g", (double)kv_silu(0.0f));
    EXPECT(kv_silu(100.0f) == 100.0f, "silu(100) = %.9g", (double)kv_silu(100.0f));
    /* exp(100) overflows F32: the result must be a (signed) zero-ish value, not NaN. */
    float neg = kv_silu(-100.0f);
    EXPECT(isfinite(neg) && fabsf(neg) <= 1e-30f, "silu(-100) = %g", (double)neg);
}
END_TEST

/* ---- kv_softmax --------------------------------------------------------- */

/* Per element: x - max rounds with absolute error <= u * spread, which exp
 * turns into that much relative error; expf adds a couple of ULP; the n-term
 * positive sum adds n u relative; the division one more. */
static double softmax_rel_tol(int64_t n, double spread) {
    return 2.0 * ((double)n + 2.0 * spread + 8.0) * U32;
}

START_TEST(test_softmax_vs_double) {
    static const int64_t lengths[] = {1, 2, 16, 17, 100, 1000};
    for (size_t s = 0; s < sizeof lengths / sizeof lengths[0]; s++) {
        int64_t n = lengths[s];
        uint64_t seed = TEST_SEED * 31 + s;
        TestRng g = test_rng_seed(seed);
        float *x = test_alloc(n);
        double *want = malloc((size_t)n * sizeof *want);
        ck_assert_ptr_nonnull(want);
        for (int64_t i = 0; i < n; i++) x[i] = 10.0f * test_rng_sym(&g);
        double mx = -INFINITY, mn = INFINITY, sum = 0.0;
        for (int64_t i = 0; i < n; i++) {
            mx = fmax(mx, (double)x[i]);
            mn = fmin(mn, (double)x[i]);
        }
        for (int64_t i = 0; i < n; i++) sum += (want[i] = exp((double)x[i] - mx));
        for (int64_t i = 0; i < n; i++) want[i] /= sum;
        kv_softmax(x, n);
        double tol = softmax_rel_tol(n, mx - mn), total = 0.0;
        for (int64_t i = 0; i < n; i++) {
            EXPECT(fabs((double)x[i] - want[i]) <= tol * want[i] + 1e-37,
                          "kv_softmax n=%lld seed=%llu p[%lld] = %.9g, double %.17g, rel tol %.3g",
                          (long long)n, (unsigned long long)seed, (long long)i, (double)x[i],
                          want[i], tol);
            total += (double)x[i];
        }
        EXPECT(fabs(total - 1.0) <= 2.0 * (double)(n + 8) * U32,
                      "kv_softmax n=%lld seed=%llu sums to %.17g", (long long)n,
                      (unsigned long long)seed, total);
        free(x);
        free(want);
    }
}
END_TEST

START_TEST(test_softmax_edges) {
    /* Without max subtraction exp(1000) overflows to inf and gives NaN. */
    float big[2] = {1000.0f, 1001.0f};
    kv_softmax(big, 2);
    double p1 = 1.0 / (1.0 + exp(-1.0)), p0 = 1.0 - p1;
    EXPECT(fabs((double)big[0] - p0) <= softmax_rel_tol(2, 1.0) * p0 &&
                      fabs((double)big[1] - p1) <= softmax_rel_tol(2, 1.0) * p1,
                  "softmax(1000, 1001) = (%.9g, %.9g), want (%.9g, %.9g)", (double)big[0],
                  (double)big[1], p0, p1);
    float one[1] = {-123.5f};
    kv_softmax(one, 1);
    EXPECT(one[0] == 1.0f, "softmax of one value must be exactly 1, got %.9g", (double)one[0]);
    /* n = 0 is a no-op: the buffer is not touched. */
    float sentinel[1] = {42.0f};
    kv_softmax(sentinel, 0);
    EXPECT(sentinel[0] == 42.0f, "softmax n=0 wrote %g", (double)sentinel[0]);
    /* Equal inputs give exactly 1/n where 1/n is exact. */
    float eq[4] = {3.0f, 3.0f, 3.0f, 3.0f};
    kv_softmax(eq, 4);
    for (int i = 0; i < 4; i++) EXPECT(eq[i] == 0.25f, "softmax of 4 equal values: p[%d]=%.9g", i, (double)eq[i]);
}
END_TEST

/* ---- GQA and the window ------------------------------------------------- */

START_TEST(test_gqa_kv_head) {
    for (int64_t h = 0; h < 8; h++) {
        int64_t want = h < 4 ? 0 : 1;
        EXPECT(kv_gqa_kv_head(h, 8, 2) == want, "heads 8 kv 2: head %lld -> %lld, want %lld",
                      (long long)h, (long long)kv_gqa_kv_head(h, 8, 2), (long long)want);
        EXPECT(kv_gqa_kv_head(h, 8, 8) == h, "kv == heads must be the identity: %lld -> %lld",
                      (long long)h, (long long)kv_gqa_kv_head(h, 8, 8));
        EXPECT(kv_gqa_kv_head(h, 8, 1) == 0, "kv 1: head %lld -> %lld", (long long)h,
                      (long long)kv_gqa_kv_head(h, 8, 1));
    }
    /* repeat_kv groups consecutive heads: 12 heads over 4 kv heads = groups of 3. */
    for (int64_t h = 0; h < 12; h++)
        EXPECT(kv_gqa_kv_head(h, 12, 4) == h / 3, "heads 12 kv 4: head %lld -> %lld",
                      (long long)h, (long long)kv_gqa_kv_head(h, 12, 4));
}
END_TEST

START_TEST(test_window_visible_example) {
    /* DESIGN §2: q - W < k <= q; W keys including the query itself. */
    const int64_t W = 16, q = 40;
    EXPECT(!kv_window_visible(q, 24, W), "W=16 q=40: k=24 (q-W) must NOT be visible");
    EXPECT(kv_window_visible(q, 25, W), "W=16 q=40: k=25 (q-W+1) must be visible");
    EXPECT(kv_window_visible(q, 40, W), "W=16 q=40: k=40 (the query) must be visible");
    EXPECT(!kv_window_visible(q, 41, W), "W=16 q=40: k=41 (future) must NOT be visible");
    int64_t count = 0;
    for (int64_t k = 0; k <= 60; k++) {
        bool want = k > q - W && k <= q;
        EXPECT(kv_window_visible(q, k, W) == want, "W=16 q=40 k=%lld: got %d want %d",
                      (long long)k, kv_window_visible(q, k, W), want);
        count += kv_window_visible(q, k, W);
    }
    EXPECT(count == W, "W=16 q=40 sees %lld keys, want exactly W=16", (long long)count);
}
END_TEST

START_TEST(test_window_visible_edges) {
    static const int64_t windows[] = {1, 2, 4, 16, 4096};
    for (size_t w = 0; w < sizeof windows / sizeof windows[0]; w++) {
        int64_t W = windows[w];
        for (int64_t q = 0; q < 3 * W + 5 && q < 10000; q++) {
            /* Distances W-1 (the oldest visible), W and W+1 (gone). */
            if (q - (W - 1) >= 0)
                EXPECT(kv_window_visible(q, q - (W - 1), W), "W=%lld q=%lld k=q-W+1 must be visible",
                              (long long)W, (long long)q);
            if (q - W >= 0)
                EXPECT(!kv_window_visible(q, q - W, W), "W=%lld q=%lld k=q-W must NOT be visible",
                              (long long)W, (long long)q);
            if (q - W - 1 >= 0)
                EXPECT(!kv_window_visible(q, q - W - 1, W),
                              "W=%lld q=%lld k=q-W-1 must NOT be visible", (long long)W, (long long)q);
            EXPECT(kv_window_visible(q, q, W), "W=%lld q=%lld: a query must see itself",
                          (long long)W, (long long)q);
            EXPECT(!kv_window_visible(q, q + 1, W), "W=%lld q=%lld: k=q+1 is the future",
                          (long long)W, (long long)q);
            int64_t count = 0;
            for (int64_t k = 0; k <= q + 2; k++) count += kv_window_visible(q, k, W);
            int64_t want = q + 1 < W ? q + 1 : W;
            EXPECT(count == want, "W=%lld q=%lld sees %lld keys among 0..q+2, want %lld",
                          (long long)W, (long long)q, (long long)count, (long long)want);
        }
    }
    /* window 0 = full causal attention: every k <= q, nothing after. */
    for (int64_t q = 0; q < 100; q++) {
        for (int64_t k = 0; k <= q + 3; k++)
            EXPECT(kv_window_visible(q, k, 0) == (k <= q), "window 0 q=%lld k=%lld: got %d",
                          (long long)q, (long long)k, kv_window_visible(q, k, 0));
    }
}
END_TEST

/* ---- kv_argmax ---------------------------------------------------------- */

START_TEST(test_argmax_cases) {
    float margin = -1.0f;
    float tie[4] = {1.0f, 3.0f, 3.0f, 2.0f};
    ck_assert_int_eq(kv_argmax(tie, 4, &margin), 1);
    EXPECT(margin == 0.0f, "tie: margin %g, want 0", (double)margin);

    float all_eq[5] = {-2.0f, -2.0f, -2.0f, -2.0f, -2.0f};
    ck_assert_int_eq(kv_argmax(all_eq, 5, &margin), 0);
    EXPECT(margin == 0.0f, "all equal: margin %g", (double)margin);

    /* Exact binary fractions: the margin 2.25 - 1.0 = 1.25 is exact. */
    float m[4] = {0.5f, -1.0f, 2.25f, 1.0f};
    ck_assert_int_eq(kv_argmax(m, 4, &margin), 2);
    EXPECT(margin == 1.25f, "margin %.9g, want 1.25", (double)margin);

    float last[3] = {-5.0f, -4.0f, -3.5f};
    ck_assert_int_eq(kv_argmax(last, 3, &margin), 2);
    EXPECT(margin == 0.5f, "max at the end: margin %.9g, want 0.5", (double)margin);

    /* The runner-up may come before the best. */
    float before[3] = {7.0f, 1.0f, 7.5f};
    ck_assert_int_eq(kv_argmax(before, 3, &margin), 2);
    EXPECT(margin == 0.5f, "runner-up first: margin %.9g, want 0.5", (double)margin);

    float one[1] = {-9.0f};
    ck_assert_int_eq(kv_argmax(one, 1, &margin), 0);
    EXPECT(isinf(margin) && margin > 0, "n=1: margin %g, want +inf", (double)margin);

    /* margin may be NULL. */
    ck_assert_int_eq(kv_argmax(m, 4, NULL), 2);
}
END_TEST

START_TEST(test_argmax_random) {
    TestRng g = test_rng_seed(TEST_SEED * 37);
    enum { N = 257 };
    float x[N];
    for (int trial = 0; trial < 200; trial++) {
        /* Coarse values (multiples of 1/8 in [-4, 4]) so ties are frequent. */
        for (int i = 0; i < N; i++) x[i] = (float)test_rng_int(&g, -32, 32) / 8.0f;
        int best = 0;
        for (int i = 1; i < N; i++)
            if (x[i] > x[best]) best = i;
        double second = -INFINITY;
        for (int i = 0; i < N; i++)
            if (i != best && (double)x[i] > second) second = (double)x[i];
        float want_margin = (float)((double)x[best] - second);
        float margin;
        int32_t got = kv_argmax(x, N, &margin);
        EXPECT(got == best, "kv_argmax trial %d seed %llu: got %d, want %d (lowest index of "
                      "the max)", trial, (unsigned long long)(TEST_SEED * 37), got, best);
        EXPECT(margin == want_margin, "kv_argmax trial %d seed %llu: margin %.9g, want %.9g",
                      trial, (unsigned long long)(TEST_SEED * 37), (double)margin,
                      (double)want_margin);
    }
}
END_TEST

/* kv_attend and kv_attend_sink give the contract's bits (kvmath.h: the
 * scores from kv_dot, the softmax, out[d] summed in key order from +0) on
 * every path: the portable loops and the AVX-512 ones (attend_simd.h), for
 * head sizes off the AVX-512 blocks (16, 64, 256) and key counts off the
 * dots' groups of four. Keys sit kv_dim apart as in a cache. */
static void attend_expected(const float *q, const float *const *k, const float *const *v,
                            int64_t nk, int64_t hd, float scale, float cap, const float *sink,
                            float *out /* (hd) */) {
    float *s = malloc((size_t)(nk + 1) * sizeof *s); /* (nk + 1) */
    for (int64_t j = 0; j < nk; j++) {
        s[j] = kv_dot(q, k[j], hd) * scale;
        if (sink == NULL) s[j] = kv_softcap(s[j], cap);
    }
    if (sink == NULL) {
        kv_softmax(s, nk);
    } else { /* as kvmath.h: the sink a last column in the max and the sum */
        float mx = *sink;
        for (int64_t j = 0; j < nk; j++) mx = s[j] > mx ? s[j] : mx;
        float sum = 0.0f;
        for (int64_t j = 0; j < nk; j++) {
            s[j] = expf(s[j] - mx);
            sum += s[j];
        }
        sum += expf(*sink - mx);
        for (int64_t j = 0; j < nk; j++) s[j] = s[j] / sum;
    }
    for (int64_t d = 0; d < hd; d++) {
        float acc = 0.0f;
        for (int64_t j = 0; j < nk; j++) acc = acc + s[j] * v[j][d];
        out[d] = nk > 0 ? acc : 0.0f;
    }
    free(s);
}

START_TEST(test_attend_paths_bitwise) {
    static const int64_t hds[] = {16, 24, 64, 80, 128, 256, 272, 336};
    static const int64_t nks[] = {0, 1, 3, 4, 5, 17, 300};
    static const KvGemmPath paths[] = {KV_GEMM_PORTABLE, KV_GEMM_AVX512};
    TestRng g = test_rng_seed(20261127);
    int checked = 0;
    for (size_t h = 0; h < sizeof hds / sizeof hds[0]; h++) {
        const int64_t hd = hds[h], kv_dim = 2 * hd + 16, nmax = 300;
        float *cache = malloc((size_t)(2 * nmax * kv_dim) * sizeof *cache); /* K then V */
        float *q = malloc((size_t)hd * sizeof *q);                           /* (hd) */
        const float **k = malloc((size_t)nmax * sizeof *k);                  /* (nmax) */
        const float **v = malloc((size_t)nmax * sizeof *v);                  /* (nmax) */
        float *scores = malloc((size_t)nmax * sizeof *scores);
        float *want = malloc((size_t)hd * sizeof *want), *got = malloc((size_t)hd * sizeof *got);
        for (int64_t i = 0; i < 2 * nmax * kv_dim; i++) cache[i] = test_rng_sym(&g);
        for (int64_t i = 0; i < hd; i++) q[i] = 4.0f * test_rng_sym(&g);
        for (int64_t j = 0; j < nmax; j++) {
            k[j] = cache + j * kv_dim + 8;
            v[j] = cache + (nmax + j) * kv_dim + hd;
        }
        for (size_t n = 0; n < sizeof nks / sizeof nks[0]; n++) {
            const int64_t nk = nks[n];
            for (int form = 0; form < 3; form++) { /* no cap, softcap 50, a sink */
                const float cap = form == 1 ? 50.0f : 0.0f, sink = 0.75f;
                const float scale = 1.0f / sqrtf((float)hd);
                attend_expected(q, k, v, nk, hd, scale, cap, form == 2 ? &sink : NULL, want);
                for (size_t p = 0; p < 2; p++) {
                    if (kv_gemm_set_path(paths[p]) != KV_OK) {
                        if (checked == 0) {
                            printf("test_attend_paths_bitwise: avx512 skipped: this CPU or "
                                   "build cannot run it\n");
                        }
                        continue;
                    }
                    if (form == 2) {
                        kv_attend_sink(q, k, v, nk, hd, scale, sink, scores, got);
                    } else {
                        kv_attend(q, k, v, nk, hd, scale, cap, scores, got);
                    }
                    ck_assert_msg(memcmp(got, want, (size_t)hd * sizeof *got) == 0,
                                  "attend (%s path, hd %lld, nk %lld, form %d): not the "
                                  "contract's bits",
                                  kv_gemm_path_name(paths[p]), (long long)hd, (long long)nk, form);
                    checked++;
                }
            }
        }
        free(cache);
        free(q);
        free(k);
        free(v);
        free(scores);
        free(want);
        free(got);
    }
    ck_assert_int_eq(kv_gemm_set_path(KV_GEMM_AUTO), KV_OK);
    ck_assert_int_gt(checked, 0);
}
END_TEST

/* kv_ref_attend_rows (attention.h): rows that share one list of keys, each
 * over its own run of it, bitwise what kv_ref_attend gives the row over its
 * run alone. The runs: a sliding window moving one key per row (the shared
 * run in the middle, a row's own keys at both ends), causal runs from key 0,
 * runs with nothing in common, one key each. Head sizes from one 16-lane
 * block to past several, rows from one to a full block, the three forms
 * (no cap, softcap, a sink). */
START_TEST(test_attend_rows_bitwise) {
    static const int64_t hds[] = {16, 48, 64, 256};
    static const int64_t nrs[] = {1, 3, 4, 7, KV_ATTN_ROWS};
    enum { N_KEYS = 300, WINDOW = 37 };
    TestRng g = test_rng_seed(20261128);
    KvAttnParams p;
    memset(&p, 0, sizeof p);
    p.hd = 64;
    if (!kv_ref_attend_rows_ok(&p)) {
        printf("test_attend_rows_bitwise: skipped: this CPU or build has no AVX2 path\n");
        return;
    }
    p.descending = true; /* the reversed key order keeps the one-row loop */
    ck_assert(!kv_ref_attend_rows_ok(&p));
    p.descending = false;
    int checked = 0;
    for (size_t h = 0; h < sizeof hds / sizeof hds[0]; h++) {
        const int64_t hd = hds[h], kv_dim = 2 * hd + 16;
        float *cache = malloc((size_t)(2 * N_KEYS * kv_dim) * sizeof *cache); /* K then V */
        float *qs = malloc((size_t)(KV_ATTN_ROWS * hd) * sizeof *qs);       /* (ROWS, hd) */
        const float **k = malloc(N_KEYS * sizeof *k), **v = malloc(N_KEYS * sizeof *v);
        const float **k1 = malloc(N_KEYS * sizeof *k1), **v1 = malloc(N_KEYS * sizeof *v1);
        float *scores = malloc((size_t)(KV_ATTN_ROWS * N_KEYS) * sizeof *scores);
        float *got = malloc((size_t)(KV_ATTN_ROWS * hd) * sizeof *got);
        float *want = malloc((size_t)hd * sizeof *want);
        for (int64_t i = 0; i < 2 * N_KEYS * kv_dim; i++) cache[i] = test_rng_sym(&g);
        for (int64_t i = 0; i < KV_ATTN_ROWS * hd; i++) qs[i] = 4.0f * test_rng_sym(&g);
        for (int64_t j = 0; j < N_KEYS; j++) {
            k[j] = cache + j * kv_dim + 8;
            v[j] = cache + (N_KEYS + j) * kv_dim + hd;
        }
        float sinks[KV_ATTN_ROWS];
        for (int i = 0; i < KV_ATTN_ROWS; i++) sinks[i] = 0.25f * (float)i - 1.0f;
        for (size_t n = 0; n < sizeof nrs / sizeof nrs[0]; n++) {
            const int64_t nr = nrs[n];
            for (int runs = 0; runs < 4; runs++) {
                for (int form = 0; form < 3; form++) { /* no cap, softcap 50, a sink */
                    int64_t lo[KV_ATTN_ROWS], hi[KV_ATTN_ROWS], heads[KV_ATTN_ROWS];
                    const float *q[KV_ATTN_ROWS];
                    float *out[KV_ATTN_ROWS];
                    for (int64_t r = 0; r < nr; r++) {
                        switch (runs) {
                        case 0: lo[r] = 100 + r; hi[r] = 100 + WINDOW + r; break; /* sliding */
                        case 1: lo[r] = 0; hi[r] = 200 + r; break;                 /* causal */
                        case 2: lo[r] = 17 * r; hi[r] = 17 * r + 11; break;         /* apart */
                        default: lo[r] = 250 + r; hi[r] = 251 + r; break;           /* one key */
                        }
                        heads[r] = r % 3;
                        q[r] = qs + r * hd;
                        out[r] = got + r * hd;
                    }
                    p.hd = hd;
                    p.scale = 1.0f / sqrtf((float)hd);
                    p.cap = form == 1 ? 50.0f : 0.0f;
                    p.sinks = form == 2 ? sinks : NULL;
                    kv_ref_attend_rows(&p, nr, heads, q, lo, hi, k, v, scores, N_KEYS, out);
                    for (int64_t r = 0; r < nr; r++) {
                        const int64_t nk = hi[r] - lo[r];
                        memcpy(k1, k + lo[r], (size_t)nk * sizeof *k1);
                        memcpy(v1, v + lo[r], (size_t)nk * sizeof *v1);
                        kv_ref_attend(&p, heads[r], q[r], k1, v1, nk, scores, want);
                        ck_assert_msg(memcmp(out[r], want, (size_t)hd * sizeof *want) == 0,
                                      "attend_rows (hd %lld, %lld rows, runs %d, form %d): row "
                                      "%lld is not kv_ref_attend's bits",
                                      (long long)hd, (long long)nr, runs, form, (long long)r);
                        checked++;
                    }
                }
            }
        }
        free(cache);
        free(qs);
        free(k);
        free(v);
        free(k1);
        free(v1);
        free(scores);
        free(got);
        free(want);
    }
    ck_assert_int_gt(checked, 0);
}
END_TEST

/* ---- suite -------------------------------------------------------------- */

static Suite *math_suite(void) {
    Suite *s = suite_create("kvmath");

    TCase *dot = tcase_create("dot");
    tcase_add_loop_test(dot, test_dot_vs_double, 0, N_DOT_LENGTHS);
    tcase_add_loop_test(dot, test_dot_exact_integers, 0, N_DOT_LENGTHS);
    tcase_add_loop_test(dot, test_dot_each_index, 0, N_DOT_LENGTHS);
    tcase_add_loop_test(dot, test_dot_lane_pattern_bitwise, 0, N_DOT_LENGTHS);
    tcase_add_test(dot, test_matmul);
    tcase_add_test(dot, test_matmul_sequential);
    suite_add_tcase(s, dot);

    TCase *gemm = tcase_create("gemm");
    tcase_set_timeout(gemm, 120); /* 3 x 240 shapes x 8 configurations, up to 2304 x 130 */
    tcase_add_loop_test(gemm, test_gemm_bitwise_kv_dot, 0, N_GEMM_PATHS * N_VAL_KINDS);
    tcase_add_test(gemm, test_gemm_path_setter);
    suite_add_tcase(s, gemm);

    TCase *norm = tcase_create("rmsnorm");
    tcase_add_test(norm, test_rmsnorm_forms);
    tcase_add_test(norm, test_rmsnorm_forms_differ);
    tcase_add_test(norm, test_rmsnorm_zero_input);
    suite_add_tcase(s, norm);

    TCase *rope = tcase_create("rope");
    tcase_add_test(rope, test_rope_inv_freq);
    tcase_add_test(rope, test_rope_apply_formula);
    tcase_add_test(rope, test_rope_not_interleaved);
    suite_add_tcase(s, rope);

    TCase *elem = tcase_create("elementwise");
    tcase_add_test(elem, test_softcap);
    tcase_add_test(elem, test_gelu_tanh);
    tcase_add_test(elem, test_silu);
    tcase_add_test(elem, test_softmax_vs_double);
    tcase_add_test(elem, test_softmax_edges);
    suite_add_tcase(s, elem);

    TCase *attn = tcase_create("attention_indexing");
    tcase_add_test(attn, test_gqa_kv_head);
    tcase_add_test(attn, test_window_visible_example);
    tcase_add_test(attn, test_window_visible_edges);
    tcase_add_test(attn, test_attend_paths_bitwise);
    tcase_add_test(attn, test_attend_rows_bitwise);
    suite_add_tcase(s, attn);

    TCase *am = tcase_create("argmax");
    tcase_add_test(am, test_argmax_cases);
    tcase_add_test(am, test_argmax_random);
    suite_add_tcase(s, am);
    return s;
}

int main(void) {
    printf("test_math: seed %llu\n", (unsigned long long)TEST_SEED);
    SRunner *sr = srunner_create(math_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
