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
 * Not a test and not run by ctest. --quick uses the tiny fixtures and a small
 * copy buffer so the whole program runs in about a second (a smoke test). */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "decode.h"
#include "fixture.h"
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
    int64_t prompt_len;
    int repeats;          /* timed runs of each kind; the best is reported */
    size_t copy_mib;
    uint64_t seed;        /* fixture weights */
    uint64_t prompt_seed; /* prompt token ids */
    int quick;
} BenchOptions;

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

static int bench_family(const char *fixture_name, const BenchOptions *o, double copy_bw) {
    KvFixtureModel fm;
    KvError err = {{0}};
    int rc = 1;
    int32_t *prompt = NULL;
    uint8_t *real = NULL;
    KvDecodeResult first;
    int have_first = 0, first_threads = 0;
    memset(&fm, 0, sizeof fm);
    memset(&first, 0, sizeof first);

    double t0 = bench_now();
    KvStatus st = kv_fixture_load(fixture_name, o->seed, &fm, &err);
    if (st != KV_OK) {
        fprintf(stderr, "bench_decode: kv_fixture_load(%s, seed %" PRIu64 ") failed (%d): %s\n",
                fixture_name, o->seed, (int)st, err.msg);
        return 1;
    }
    const KvModel *m = &fm.model;
    const KvConfig *c = &m->config;
    printf("\n%s: built and loaded in %.2f s; %" PRId64 " layers, hidden %" PRId64
           ", intermediate %" PRId64 ", heads %" PRId64 "/%" PRId64 " kv, head_dim %" PRId64
           ", vocab %" PRId64 ", window %" PRId64 "; weights read per token %" PRIu64
           " bytes (%.1fM F32 values)\n",
           fixture_name, bench_now() - t0, c->num_layers, c->hidden_size, c->intermediate_size,
           c->num_heads, c->num_kv_heads, c->head_dim, c->vocab_size, c->sliding_window,
           m->weight_bytes, (double)m->weight_bytes / 4e6);

    prompt = malloc((size_t)o->prompt_len * sizeof *prompt); /* (1, P) */
    real = malloc((size_t)o->prompt_len);                    /* (1, P) */
    if (prompt == NULL || real == NULL) {
        fprintf(stderr, "bench_decode: out of memory for the prompt\n");
        goto cleanup;
    }
    KvPrng g = kv_prng_seed(o->prompt_seed);
    for (int64_t i = 0; i < o->prompt_len; i++) {
        prompt[i] = (int32_t)kv_prng_below(&g, (uint32_t)c->vocab_size);
        real[i] = 1;
    }
    KvDecodeSpec prefill = {.batch = 1, .prompt_len = o->prompt_len, .prompt = prompt,
                            .prompt_real = real, .new_tokens = 1, .prefill_chunk = 0};
    KvDecodeSpec full = prefill;
    full.new_tokens = o->new_tokens;
    int64_t decode_steps = o->new_tokens - 1;

    for (int ti = 0; ti < o->n_threads; ti++) {
        int nt = o->threads[ti];
        if (!bench_set_threads(nt)) {
            printf("%s threads=%d: skipped (built without OpenMP)\n", fixture_name, nt);
            continue;
        }
        double tp, tf;
        KvDecodeResult res;
        memset(&res, 0, sizeof res);
        /* Warm-up: caches, page tables, OpenMP thread pool. */
        if (bench_decode_best(m, &prefill, 1, &tp, NULL) != 0) goto cleanup;
        if (bench_decode_best(m, &prefill, o->repeats, &tp, NULL) != 0) goto cleanup;
        if (bench_decode_best(m, &full, o->repeats, &tf, &res) != 0) goto cleanup;
        double dt = tf - tp;
        if (dt <= 0.0) {
            printf("%s threads=%d: prefill %.2f ms, full %.2f ms: decode time not measurable\n",
                   fixture_name, nt, tp * 1e3, tf * 1e3);
        } else {
            double tps = (double)decode_steps / dt;
            double wbw = (double)m->weight_bytes * tps;
            printf("%s threads=%d: prefill(%" PRId64 " tokens) %.2f ms, full %.2f ms -> decode %" PRId64
                   " steps %.2f ms: %.2f tokens/s, %.2f ms/token, weights %.2f GB/s, copy %.2f "
                   "GB/s, ratio %.3f\n",
                   fixture_name, nt, o->prompt_len, tp * 1e3, tf * 1e3, decode_steps, dt * 1e3, tps,
                   1e3 / tps, wbw / 1e9, copy_bw / 1e9, wbw / copy_bw);
        }
        /* DESIGN §4: the reference is bitwise the same for any thread count. */
        if (!have_first) {
            first = res;
            have_first = 1;
            first_threads = nt;
        } else {
            size_t nlog = (size_t)(res.steps * res.batch * res.vocab);
            int same = res.steps == first.steps &&
                       memcmp(res.tokens, first.tokens, (size_t)res.steps * sizeof *res.tokens) == 0 &&
                       memcmp(res.logits, first.logits, nlog * sizeof *res.logits) == 0;
            printf("%s threads=%d vs threads=%d: tokens and logits bitwise %s\n", fixture_name, nt,
                   first_threads, same ? "identical" : "DIFFERENT");
            kv_decode_result_free(&res);
            if (!same) {
                fprintf(stderr, "bench_decode: nondeterminism across thread counts in %s\n",
                        fixture_name);
                goto cleanup;
            }
        }
    }
    if (have_first) {
        printf("%s tokens:", fixture_name);
        for (int64_t s = 0; s < first.steps; s++) printf(" %" PRId32, first.tokens[s]);
        printf("\n");
    }
    rc = 0;

cleanup:
    if (have_first) kv_decode_result_free(&first);
    free(prompt);
    free(real);
    kv_fixture_free(&fm);
    return rc;
}

/* ---- options ----------------------------------------------------------- */

static void bench_usage(FILE *f) {
    fprintf(f,
            "usage: bench_decode [--family gemma2|mistral|both] [--threads LIST] [--new-tokens N]\n"
            "                    [--prompt-len P] [--repeats R] [--copy-mib M] [--seed S]\n"
            "                    [--prompt-seed S] [--quick]\n"
            "  --threads LIST   comma-separated OpenMP thread counts (default 1,2)\n"
            "  --new-tokens N   tokens per run, >= 2 (default 32: 31 timed decode steps)\n"
            "  --quick          tiny fixtures, %d MiB copy test: a smoke test\n",
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
    const char *size = o.quick ? "tiny" : "medium";
    printf("bench_decode: fixtures %s, weight seed %" PRIu64 ", prompt seed %" PRIu64
           ", batch 1, prompt %" PRId64 " tokens, new tokens %" PRId64 " (%" PRId64
           " timed decode steps), best of %d, threads",
           size, o.seed, o.prompt_seed, o.prompt_len, o.new_tokens, o.new_tokens - 1, o.repeats);
    for (int i = 0; i < o.n_threads; i++) printf("%s%d", i ? "," : " ", o.threads[i]);
#ifdef _OPENMP
    printf(", OpenMP %d (max threads %d)", _OPENMP, omp_get_max_threads());
#else
    printf(", no OpenMP");
#endif
    printf(", %ld online CPUs\n", sysconf(_SC_NPROCESSORS_ONLN));

    double copy_bw = 0.0;
    if (bench_copy_bandwidth(o.copy_mib, &copy_bw) != 0) return 1;
    printf("copy bandwidth (best): %.2f GB/s\n", copy_bw / 1e9);

    static const char *families[2] = {"gemma2", "mistral"};
    for (int f = 0; f < 2; f++) {
        if (!o.families[f]) continue;
        char name[64];
        snprintf(name, sizeof name, "%s-%s", families[f], size);
        if (bench_family(name, &o, copy_bw) != 0) return 1;
    }
    return 0;
}
