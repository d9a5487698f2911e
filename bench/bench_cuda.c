/* bench_cuda.c: how fast the CUDA backend decodes, eager vs CUDA graphs, for
 * every cache variant, against two floors.
 *
 * Validate, then time (llm.c's dev/cuda rule): before anything of a fixture
 * is timed, every CUDA op is checked against its CPU op on that fixture
 * (candidates/cuda/cuda_validate.h, one line per op); if any op fails, the
 * bench prints why and times nothing.
 *
 * Per fixture and variant (the GPU reference layout first, then the six
 * variants): the mean and best wall time of a one-token decode step run
 * eagerly (every op launched, host sync per step) and replayed from a CUDA
 * graph (steps that re-captured are timed apart), and the graphs captured /
 * instantiated / updated in place. The floors, per fixture:
 *   kernels: the sum of CUDA-event times around each kernel, cuBLAS call and
 *            copy of one eager step (what the step costs with no launch gaps);
 *   memory:  weight bytes read per token / the device's copy bandwidth,
 *            measured with cudaMemcpy device-to-device and counted as
 *            (read + write) bytes / s (a batch-1 decode reads every weight
 *            once per token).
 *
 * Columns: eager_ms / eager_min (mean / best eager step), graph_ms /
 * graph_min (mean / best replayed step), speedup (eager_ms / graph_ms), capt /
 * inst / upd (graphs captured / instantiated / applied with
 * cudaGraphExecUpdate), kernel_ms and ops (the kernel floor and the number
 * of timed ops), capt_ms (wall time of the steps that captured).
 *
 * Usage: bench_cuda [--quick] [--fixtures LIST] [--variants LIST]
 *                   [--prompt-len P] [--steps N] [--seed S]
 *   --quick        tiny fixtures, short decode, 64 MiB copy probe (a smoke test)
 *   --fixtures     comma-separated (default gemma2-medium,mistral-medium)
 *   --variants     comma-separated, "reference" for the static layout
 *                  (default: reference and all six variants)
 *   --prompt-len   prompt tokens (default 16: decode crosses the window)
 *   --steps        timed decode steps per mode (default 192; --quick 48)
 *   --seed         fixture seed (default KV_FIXTURE_DEFAULT_SEED); prompts use seed 7
 * Exit codes: 0 measured, 2 bad usage or a failed run, 3 an op failed its
 * validation (nothing timed), 77 skipped (no usable CUDA device, or built
 * without CUDA; the reason is printed). 77 rather than 0 so that a script
 * can tell "no numbers" from numbers.
 * Not a test: ctest does not run it. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache.h"
#include "cache_registry.h"
#include "cuda_device.h"
#include "cuda_forward.h"
#include "cuda_validate.h"
#include "decode.h"
#include "fixture.h"
#include "prng.h"

#define BENCH_EXIT_SKIP 77
#define BENCH_EXIT_USAGE 2
#define BENCH_EXIT_INVALID 3
#define BENCH_PROMPT_SEED 7ULL
#define BENCH_MAX_LIST 16
#define BENCH_COPY_MIB 1024
#define BENCH_COPY_MIB_QUICK 64

typedef struct {
    const char *fixtures[BENCH_MAX_LIST];
    int n_fixtures;
    const char *variants[BENCH_MAX_LIST]; /* "reference" or a cache variant name */
    int n_variants;
    int64_t prompt_len;
    int64_t steps;
    uint64_t seed;
    int quick;
} BenchOptions;

static void bench_usage(const char *argv0) {
    fprintf(stderr,
            "usage: %s [--quick] [--fixtures LIST] [--variants LIST] [--prompt-len P] "
            "[--steps N] [--seed S]\n"
            "exit codes: 0 measured, 2 bad usage or failed run, 3 an op failed validation "
            "(nothing timed), 77 skipped (no CUDA device)\n",
            argv0);
}

/* Splits a comma-separated list in place into out (at most BENCH_MAX_LIST). */
static int bench_split(char *s, const char **out, int *n) {
    *n = 0;
    for (char *tok = strtok(s, ","); tok != NULL; tok = strtok(NULL, ",")) {
        if (*n == BENCH_MAX_LIST) return 0;
        out[(*n)++] = tok;
    }
    return *n > 0;
}

static int bench_parse(int argc, char **argv, BenchOptions *o) {
    memset(o, 0, sizeof *o);
    o->prompt_len = 16;
    o->steps = -1;
    o->seed = KV_FIXTURE_DEFAULT_SEED;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--quick") == 0) {
            o->quick = 1;
        } else if (strcmp(a, "--fixtures") == 0 && v != NULL) {
            if (!bench_split(argv[++i], o->fixtures, &o->n_fixtures)) return 0;
        } else if (strcmp(a, "--variants") == 0 && v != NULL) {
            if (!bench_split(argv[++i], o->variants, &o->n_variants)) return 0;
        } else if (strcmp(a, "--prompt-len") == 0 && v != NULL) {
            o->prompt_len = strtoll(argv[++i], NULL, 10);
        } else if (strcmp(a, "--steps") == 0 && v != NULL) {
            o->steps = strtoll(argv[++i], NULL, 10);
        } else if (strcmp(a, "--seed") == 0 && v != NULL) {
            o->seed = strtoull(argv[++i], NULL, 10);
        } else {
            return 0;
        }
    }
    if (o->n_fixtures == 0) {
        if (o->quick) {
            o->fixtures[0] = "gemma2-tiny";
            o->fixtures[1] = "mistral-tiny";
        } else {
            o->fixtures[0] = "gemma2-medium";
            o->fixtures[1] = "mistral-medium";
        }
        o->n_fixtures = 2;
    }
    if (o->n_variants == 0) {
        int count = 0;
        const KvCacheOps *const *all = kv_cache_all(&count);
        o->variants[o->n_variants++] = "reference";
        for (int i = 0; i < count && o->n_variants < BENCH_MAX_LIST; i++) {
            o->variants[o->n_variants++] = all[i]->name;
        }
    }
    if (o->steps < 0) o->steps = o->quick ? 48 : 192;
    if (o->quick && o->prompt_len == 16) o->prompt_len = 5;
    return o->prompt_len >= 1 && o->steps >= 1;
}

/* One fixture: its op validation, then every variant. Returns 0,
 * BENCH_EXIT_USAGE, BENCH_EXIT_INVALID or BENCH_EXIT_SKIP. */
static int bench_fixture(const char *name, const BenchOptions *o, double copy_bw) {
    KvFixtureModel fm;
    KvError err = {{0}};
    int32_t *prompt = NULL;              /* (1, P) */
    uint8_t *real = NULL;                /* (1, P) */
    KvCudaValidateReport *valid = NULL;  /* the fixture's op validation */
    int rc = 0;
    memset(&fm, 0, sizeof fm);

    KvStatus st = kv_fixture_load(name, o->seed, &fm, &err);
    if (st != KV_OK) {
        fprintf(stderr, "bench_cuda: kv_fixture_load(%s, seed %" PRIu64 ") failed (%d): %s\n", name,
                o->seed, (int)st, err.msg);
        return BENCH_EXIT_USAGE;
    }
    const KvModel *m = &fm.model;
    const KvConfig *c = &m->config;
    prompt = malloc((size_t)o->prompt_len * sizeof *prompt);
    real = malloc((size_t)o->prompt_len);
    valid = malloc(sizeof *valid);
    if (prompt == NULL || real == NULL || valid == NULL) {
        fprintf(stderr, "bench_cuda: out of memory\n");
        rc = BENCH_EXIT_USAGE;
        goto exit;
    }
    /* Inputs drawn from the fixture seed, printed in the header line. */
    printf("\n%s: op validation (seed %" PRIu64 ")\n", name, o->seed);
    st = kv_cuda_validate_ops(m, o->seed, 0, stdout, valid, &err);
    if (st == KV_SKIP) {
        printf("bench_cuda: SKIPPED: %s\n", err.msg);
        rc = BENCH_EXIT_SKIP;
        goto exit;
    }
    if (st != KV_OK) {
        fprintf(stderr, "bench_cuda: %s: not timing: the op validation failed (%d): %s\n", name,
                (int)st, err.msg);
        rc = BENCH_EXIT_INVALID;
        goto exit;
    }
    KvPrng g = kv_prng_seed(BENCH_PROMPT_SEED);
    for (int64_t i = 0; i < o->prompt_len; i++) {
        prompt[i] = 1 + (int32_t)kv_prng_below(&g, (uint32_t)(c->vocab_size - 1));
        real[i] = 1;
    }
    const double floor_ms = copy_bw > 0.0 ? (double)m->weight_bytes / copy_bw * 1e3 : 0.0;
    printf("\n%s (seed %" PRIu64 "): %" PRId64 " layers, hidden %" PRId64 ", vocab %" PRId64
           ", window %" PRId64 "; prompt %" PRId64 ", %" PRId64 " timed steps per mode\n",
           name, o->seed, c->num_layers, c->hidden_size, c->vocab_size, c->sliding_window,
           o->prompt_len, o->steps);
    printf("memory floor: %" PRIu64 " weight bytes / %.1f GB/s = %.4f ms/token\n", m->weight_bytes,
           copy_bw / 1e9, floor_ms);

    for (int v = 0; v < o->n_variants; v++) {
        const KvCacheOps *variant = NULL;
        if (strcmp(o->variants[v], "reference") != 0) {
            variant = kv_cache_find(o->variants[v]);
            if (variant == NULL) {
                fprintf(stderr, "bench_cuda: unknown variant '%s'\n", o->variants[v]);
                rc = BENCH_EXIT_USAGE;
                goto exit;
            }
        }
        KvDecodeSpec spec = {.batch = 1, .prompt_len = o->prompt_len, .prompt = prompt,
                             .prompt_real = real, .new_tokens = o->steps + 1, .variant = variant,
                             .mode = KV_MODE_EAGER};
        KvCudaBenchResult r;
        st = kv_cuda_bench_decode(m, &spec, &r, &err);
        if (st == KV_SKIP) {
            printf("bench_cuda: SKIPPED: %s\n", err.msg);
            rc = BENCH_EXIT_SKIP;
            goto exit;
        }
        if (st != KV_OK) {
            fprintf(stderr, "bench_cuda: %s %s failed (%d): %s\n", name, o->variants[v], (int)st,
                    err.msg);
            rc = BENCH_EXIT_USAGE;
            goto exit;
        }
        if (v == 0) {
            printf("device: %s\n", r.device);
            printf("%-12s %10s %10s %10s %10s %8s %5s %5s %5s %10s %6s %9s\n", "variant",
                   "eager_ms", "eager_min", "graph_ms", "graph_min", "speedup", "capt", "inst",
                   "upd", "kernel_ms", "ops", "capt_ms");
        }
        printf("%-12s %10.4f %10.4f %10.4f %10.4f %7.2fx %5" PRId64 " %5" PRId64 " %5" PRId64
               " %10.4f %6" PRId64 " %9.2f\n",
               o->variants[v], r.eager_ms_per_step, r.eager_ms_best, r.graph_ms_per_step,
               r.graph_ms_best,
               r.graph_ms_per_step > 0.0 ? r.eager_ms_per_step / r.graph_ms_per_step : 0.0,
               r.graphs_captured, r.graph_instantiations, r.exec_updates, r.kernel_sum_ms,
               r.ops_per_step, r.capture_ms);
    }
exit:
    free(prompt);
    free(real);
    free(valid);
    kv_fixture_free(&fm);
    return rc;
}

int main(int argc, char **argv) {
    BenchOptions o;
    KvError err = {{0}};
    double copy_bw = 0.0;
    if (!bench_parse(argc, argv, &o)) {
        bench_usage(argv[0]);
        return BENCH_EXIT_USAGE;
    }
    printf("bench_cuda: build: %s\n", kv_cuda_build_info());
    const size_t copy_bytes = (size_t)(o.quick ? BENCH_COPY_MIB_QUICK : BENCH_COPY_MIB) << 20;
    KvStatus st = kv_cuda_bench_bandwidth(copy_bytes, &copy_bw, &err);
    if (st == KV_SKIP) {
        printf("bench_cuda: SKIPPED: %s\n", err.msg);
        return BENCH_EXIT_SKIP;
    }
    if (st != KV_OK) {
        fprintf(stderr, "bench_cuda: bandwidth probe failed (%d): %s\n", (int)st, err.msg);
        return BENCH_EXIT_USAGE;
    }
    printf("copy bandwidth (cudaMemcpy D2D, %zu MiB, best of 5): %.1f GB/s (read + write)\n",
           copy_bytes >> 20, copy_bw / 1e9);
    for (int f = 0; f < o.n_fixtures; f++) {
        int rc = bench_fixture(o.fixtures[f], &o, copy_bw);
        if (rc != 0) return rc;
    }
    return 0;
}
