/* bench_cuda.c: how fast the CUDA backend decodes, eager vs CUDA graphs, for
 * every cache variant, against its floors.
 *
 * Validate, then time (llm.c's dev/cuda rule): before anything of a fixture
 * is timed, every CUDA op is checked against its CPU op on that fixture
 * (candidates/cuda/cuda_validate.h, one line per op); if any op fails, the
 * bench prints why and times nothing. The validation's CPU side grows with
 * the square of the window (a schedule of about W one-token updates, each
 * checked against the CPU's attention over up to W keys, and a W + 5 token
 * prefill), so at gemma-2's W 4096 it would outlast the timing many times
 * over: a fixture whose window is above --validate-window is validated on
 * the same model with its windows lowered to that value (every op, head
 * count, head_dim and softcap as the fixture's; W is a kernel argument, no
 * code path depends on its size), and the header line says so.
 *
 * Per fixture and variant (the GPU reference layout first, then the six
 * variants), a decode of B rows (--batch; with --short-len the rows after
 * the first are left-padded to that many real tokens, as the seed's batch):
 *   eager:  mean and best wall time of a one-token decode step run eagerly
 *           (every op launched, host sync per step);
 *   graph:  the same replayed from a CUDA graph (steps that re-captured are
 *           timed apart), and the graphs captured / instantiated / updated
 *           in place;
 *   floor:  the decode-step graph replayed KV_CUDA_BENCH_FLOOR_REPS times
 *           back to back with no host sync, one CUDA event pair around them
 *           all: device time per step without the host round trip. Each
 *           replay is the next decode step (the device position moves on),
 *           so the decode first runs until its window has filled and the
 *           graph stays the right one (settle steps); floor_host_ms is the
 *           host's time to enqueue one replay (well below floor_ms, the
 *           device never waited on the host; near it, it may have, or a full
 *           launch queue held the host back). ratio = graph_ms / floor_ms;
 *   nodes:  the decode-step graph's nodes, kernels among them: what one
 *           token launches;
 *   evsum:  one eager step with a CUDA event pair around every kernel,
 *           cuBLAS call and copy, summed. Not a floor: every pair adds its
 *           own overhead to the op it times.
 * Per fixture, the memory floor: the bytes one step must read (every weight
 * once, and every row's visible K and V at the end of the timed decode) /
 * the device's copy bandwidth (cudaMemcpy device-to-device, counted as
 * (read + write) bytes / s).
 *
 * Each variant also prints one line for scripts:
 *   BENCH fixture=F variant=V batch=B prompt=P short=N steps=S eager_ms=..
 *     replay_ms=.. floor_ms=.. ratio=.. floor_host_ms=.. floor_k=..
 *     floor_stale=0|1 settle=.. nodes=.. kernels=.. memcpy=.. memset=..
 *     other_nodes=.. captures=.. inst=.. upd=.. evsum_ms=.. ops=..
 * (short=0: every row holds P real tokens; times in ms per decode step;
 * floor_stale=1: the capture key changed across the floor, which a filled
 * window never does).
 *
 * Usage: bench_cuda [--quick] [--fixtures LIST] [--variants LIST]
 *                   [--prompt-len P] [--steps N] [--batch B] [--short-len N]
 *                   [--validate-window W] [--seed S]
 *   --quick            tiny fixtures, short decode, 64 MiB copy probe (a smoke test)
 *   --fixtures         comma-separated (default gemma2-medium,mistral-medium)
 *   --variants         comma-separated, "reference" for the static layout
 *                      (default: reference and all six variants)
 *   --prompt-len       prompt tokens per row (default 16: decode crosses the window)
 *   --steps            timed decode steps per mode (default 192; --quick 48)
 *   --batch            rows (default 1)
 *   --short-len        rows after the first hold this many real tokens, left-padded
 *                      to the prompt length (default 0: every row full; needs B >= 2)
 *   --validate-window  the highest window the op validation runs at (default
 *                      128; 0: the fixture's own, however long that takes)
 *   --seed             fixture seed (default KV_FIXTURE_DEFAULT_SEED); prompts use seed 7
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
#define BENCH_PAD_ID 0
#define BENCH_MAX_LIST 16
#define BENCH_COPY_MIB 1024
#define BENCH_COPY_MIB_QUICK 64
/* The op validation's default window cap: above the tiny and medium
 * fixtures' windows, so they validate at their own as before, and small
 * enough that the CPU side stays short at gemma-2's head_dim 256. */
#define BENCH_VALIDATE_WINDOW 128

typedef struct {
    const char *fixtures[BENCH_MAX_LIST];
    int n_fixtures;
    const char *variants[BENCH_MAX_LIST]; /* "reference" or a cache variant name */
    int n_variants;
    int64_t prompt_len;
    int64_t steps;
    int64_t batch;
    int64_t short_len;       /* real tokens of rows 1.. (left-padded); 0: all full */
    int64_t validate_window; /* cap on the validation's window; 0: none */
    uint64_t seed;
    int quick;
} BenchOptions;

static void bench_usage(const char *argv0) {
    fprintf(stderr,
            "usage: %s [--quick] [--fixtures LIST] [--variants LIST] [--prompt-len P] "
            "[--steps N] [--batch B] [--short-len N] [--validate-window W] [--seed S]\n"
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

/* A whole decimal integer, or 0 (and *ok cleared) for anything else. */
static int64_t bench_int(const char *s, int *ok) {
    char *end = NULL;
    const long long v = strtoll(s, &end, 10);
    if (end == s || *end != '\0') *ok = 0;
    return (int64_t)v;
}

static int bench_parse(int argc, char **argv, BenchOptions *o) {
    int ok = 1;
    memset(o, 0, sizeof *o);
    o->prompt_len = 16;
    o->steps = -1;
    o->batch = 1;
    o->validate_window = BENCH_VALIDATE_WINDOW;
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
            o->prompt_len = bench_int(argv[++i], &ok);
        } else if (strcmp(a, "--steps") == 0 && v != NULL) {
            o->steps = bench_int(argv[++i], &ok);
        } else if (strcmp(a, "--batch") == 0 && v != NULL) {
            o->batch = bench_int(argv[++i], &ok);
        } else if (strcmp(a, "--short-len") == 0 && v != NULL) {
            o->short_len = bench_int(argv[++i], &ok);
        } else if (strcmp(a, "--validate-window") == 0 && v != NULL) {
            o->validate_window = bench_int(argv[++i], &ok);
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
    if (o->short_len != 0 && (o->batch < 2 || o->short_len < 1 || o->short_len > o->prompt_len)) {
        fprintf(stderr, "bench_cuda: --short-len %" PRId64 " needs --batch >= 2 and 1 <= N <= "
                        "the prompt length %" PRId64 "\n",
                o->short_len, o->prompt_len);
        return 0;
    }
    return ok && o->prompt_len >= 1 && o->steps >= 1 && o->batch >= 1 && o->validate_window >= 0;
}

/* m with every window above cap lowered to cap (weights shared: not to be
 * freed); *lowered says whether any was. */
static KvModel bench_validation_model(const KvModel *m, int64_t cap, int *lowered) {
    KvModel v = *m;
    *lowered = 0;
    if (cap <= 0) return v;
    if (v.config.sliding_window > cap) {
        v.config.sliding_window = cap;
        *lowered = 1;
    }
    for (int64_t l = 0; l < v.config.num_layers && l < KV_MAX_LAYERS; l++) {
        if (v.config.layer_window[l] > cap) {
            v.config.layer_window[l] = cap;
            *lowered = 1;
        }
    }
    return v;
}

/* Bytes one decode step at position P + steps must read: every weight once
 * and each row's visible keys and values in every layer (a left-padded
 * row's pads are never read). */
static double bench_step_bytes(const KvModel *m, const BenchOptions *o) {
    const KvConfig *c = &m->config;
    const int64_t kv_dim = c->num_kv_heads * c->head_dim;
    double bytes = (double)m->weight_bytes;
    for (int64_t b = 0; b < o->batch; b++) {
        const int64_t real = (b > 0 && o->short_len > 0 ? o->short_len : o->prompt_len) + o->steps;
        for (int64_t l = 0; l < c->num_layers; l++) {
            const int64_t w = kv_config_layer_window(c, l);
            const int64_t keys = w > 0 && w < real ? w : real;
            bytes += 2.0 * (double)keys * (double)kv_dim * (double)sizeof(float);
        }
    }
    return bytes;
}

/* The batch's prompt: tokens 1 .. vocab - 1 from BENCH_PROMPT_SEED, row
 * after row; rows after the first left-padded to short_len real tokens
 * when set. prompt (B, P), real (B, P). */
static void bench_prompt(const BenchOptions *o, int64_t vocab, int32_t *prompt, uint8_t *real) {
    const int64_t B = o->batch, P = o->prompt_len;
    KvPrng g = kv_prng_seed(BENCH_PROMPT_SEED);
    for (int64_t b = 0; b < B; b++) {
        const int64_t pads = b > 0 && o->short_len > 0 ? P - o->short_len : 0;
        for (int64_t i = 0; i < P; i++) {
            const int is_real = i >= pads;
            prompt[b * P + i] =
                is_real ? 1 + (int32_t)kv_prng_below(&g, (uint32_t)(vocab - 1)) : BENCH_PAD_ID;
            real[b * P + i] = (uint8_t)is_real;
        }
    }
}

/* One fixture: its op validation, then every variant. Returns 0,
 * BENCH_EXIT_USAGE, BENCH_EXIT_INVALID or BENCH_EXIT_SKIP. */
static int bench_fixture(const char *name, const BenchOptions *o, double copy_bw) {
    KvFixtureModel fm;
    KvError err = {{0}};
    int32_t *prompt = NULL;              /* (B, P) */
    uint8_t *real = NULL;                /* (B, P) 0 on the left pads */
    KvCudaValidateReport *valid = NULL;  /* the fixture's op validation */
    int rc = 0;
    const int64_t B = o->batch, P = o->prompt_len;
    memset(&fm, 0, sizeof fm);

    KvStatus st = kv_fixture_load(name, o->seed, &fm, &err);
    if (st != KV_OK) {
        fprintf(stderr, "bench_cuda: kv_fixture_load(%s, seed %" PRIu64 ") failed (%d): %s\n", name,
                o->seed, (int)st, err.msg);
        return BENCH_EXIT_USAGE;
    }
    const KvModel *m = &fm.model;
    const KvConfig *c = &m->config;
    prompt = malloc((size_t)(B * P) * sizeof *prompt);
    real = malloc((size_t)(B * P));
    valid = malloc(sizeof *valid);
    if (prompt == NULL || real == NULL || valid == NULL) {
        fprintf(stderr, "bench_cuda: out of memory\n");
        rc = BENCH_EXIT_USAGE;
        goto exit;
    }
    /* Inputs drawn from the fixture seed, printed in the header line. */
    int lowered = 0;
    const KvModel vm = bench_validation_model(m, o->validate_window, &lowered);
    if (lowered) {
        printf("\n%s: op validation (seed %" PRIu64 ") at window %" PRId64 " in place of the "
               "fixture's %" PRId64 " (--validate-window; every other dimension the fixture's)\n",
               name, o->seed, vm.config.sliding_window, c->sliding_window);
    } else {
        printf("\n%s: op validation (seed %" PRIu64 ")\n", name, o->seed);
    }
    fflush(stdout);
    st = kv_cuda_validate_ops(&vm, o->seed, 0, stdout, valid, &err);
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
    bench_prompt(o, c->vocab_size, prompt, real);
    const double step_bytes = bench_step_bytes(m, o);
    const double floor_ms = copy_bw > 0.0 ? step_bytes / copy_bw * 1e3 : 0.0;
    printf("\n%s (seed %" PRIu64 "): %" PRId64 " layers, hidden %" PRId64 ", heads %" PRId64
           "/%" PRId64 " x %" PRId64 ", vocab %" PRId64 ", window %" PRId64 "; batch %" PRId64
           ", prompt %" PRId64,
           name, o->seed, c->num_layers, c->hidden_size, c->num_heads, c->num_kv_heads,
           c->head_dim, c->vocab_size, c->sliding_window, B, P);
    if (o->short_len > 0) {
        printf(" (row 0 full, rows 1..%" PRId64 " left-padded to %" PRId64 " real tokens)",
               B - 1, o->short_len);
    } else if (B > 1) {
        printf(" (every row full length)");
    }
    printf(", prefill in one chunk; %" PRId64 " timed steps per mode; floor over %d replays\n",
           o->steps, KV_CUDA_BENCH_FLOOR_REPS);
    printf("memory floor: %.0f bytes per step (%" PRIu64 " weight bytes + K/V read at position "
           "%" PRId64 ") / %.1f GB/s = %.4f ms/step\n",
           step_bytes, m->weight_bytes, P + o->steps, copy_bw / 1e9, floor_ms);
    fflush(stdout);

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
        KvDecodeSpec spec = {.batch = B, .prompt_len = P, .prompt = prompt,
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
        const double speedup = r.graph_ms_per_step > 0.0 ? r.eager_ms_per_step / r.graph_ms_per_step
                                                         : 0.0;
        const double ratio = r.floor_ms_per_step > 0.0 ? r.graph_ms_per_step / r.floor_ms_per_step
                                                       : 0.0;
        if (v == 0) {
            printf("device: %s\n", r.device);
            printf("%-12s %9s %9s %9s %9s %7s %9s %9s %6s %5s %5s %4s %4s %4s %9s %4s %8s\n",
                   "variant", "eager_ms", "eager_min", "graph_ms", "graph_min", "speedup",
                   "floor_ms", "host_ms", "ratio", "nodes", "kern", "capt", "inst", "upd",
                   "evsum_ms", "ops", "capt_ms");
        }
        printf("%-12s %9.4f %9.4f %9.4f %9.4f %6.2fx %9.4f %9.4f %5.2fx %5" PRId64 " %5" PRId64
               " %4" PRId64 " %4" PRId64 " %4" PRId64 " %9.4f %4" PRId64 " %8.2f%s\n",
               o->variants[v], r.eager_ms_per_step, r.eager_ms_best, r.graph_ms_per_step,
               r.graph_ms_best, speedup, r.floor_ms_per_step, r.floor_host_ms_per_step, ratio,
               r.graph_nodes, r.graph_kernel_nodes, r.graphs_captured, r.graph_instantiations,
               r.exec_updates, r.event_sum_ms, r.ops_per_step, r.capture_ms,
               r.floor_stale ? "  (floor stale: the capture key moved)" : "");
        printf("BENCH fixture=%s variant=%s batch=%" PRId64 " prompt=%" PRId64 " short=%" PRId64
               " steps=%" PRId64 " eager_ms=%.4f replay_ms=%.4f floor_ms=%.4f ratio=%.3f"
               " floor_host_ms=%.4f floor_k=%" PRId64 " floor_stale=%d settle=%" PRId64
               " nodes=%" PRId64 " kernels=%" PRId64 " memcpy=%" PRId64 " memset=%" PRId64
               " other_nodes=%" PRId64 " captures=%" PRId64 " inst=%" PRId64 " upd=%" PRId64
               " evsum_ms=%.4f ops=%" PRId64 "\n",
               name, o->variants[v], B, P, o->short_len, r.steps, r.eager_ms_per_step,
               r.graph_ms_per_step, r.floor_ms_per_step, ratio, r.floor_host_ms_per_step,
               r.floor_reps, r.floor_stale ? 1 : 0, r.floor_settle_steps, r.graph_nodes,
               r.graph_kernel_nodes, r.graph_memcpy_nodes, r.graph_memset_nodes,
               r.graph_other_nodes, r.graphs_captured, r.graph_instantiations, r.exec_updates,
               r.event_sum_ms, r.ops_per_step);
        fflush(stdout);
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
