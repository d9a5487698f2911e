/* cuda_validate.h: per-op validation of the CUDA backend against the CPU
 * reference, llm.c's dev/cuda pattern: every launcher of cuda_internal.cuh
 * is run once on seeded inputs, its outputs copied back and compared with
 * the CPU op (reference/kvmath.h, the forward's op logic, the CPU cache
 * variants) before anything is timed or decoded.
 *
 * What is compared, and how:
 *   - bitwise: integer and data-movement results (positions, the embedding
 *     lookup, the residual add, argmax token and margin, the static cache's
 *     store, the gather indices, every variant cache update's slot contents,
 *     realness and positions against the CPU variant's state after the same
 *     update);
 *   - within a bound derived from the op's error analysis (not set by eye):
 *     everything that rounds differently on the device (cuBLAS's summation
 *     order, RMSNorm's and attention's reduction trees, the device libm's
 *     sinf/cosf/expf/tanhf). cuda_validate.cu states each bound beside its
 *     constant, with the reason.
 * Every buffer an op writes is a guarded copy (sentinel regions before and
 * after, checked after the op: an out-of-bounds write fails the op naming
 * the buffer), every float output is checked for NaN/Inf, and the device
 * error flags are checked after every op.
 *
 * C11-includable; the no-CUDA build (cuda_validate_none.c) implements the
 * same API as KV_SKIP "built without CUDA". */
#ifndef KV_CUDA_VALIDATE_H
#define KV_CUDA_VALIDATE_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
/* model.h and status.h are C headers without their own linkage block. */
extern "C" {
#endif

#include "model.h"
#include "status.h"

/* Room for every op line of one model (about 30 are recorded). */
#define KV_CUDA_VALIDATE_MAX_OPS 64

/* One validated op (one line of the log). */
typedef struct {
    char op[48];         /* e.g. "rmsnorm[gemma2]", "cache_update[ring]" */
    char shape[128];     /* the shapes it ran on */
    char tolerance[96];  /* "bitwise", or the bound, e.g. "16u(|a|+|b|)" (u = 2^-24) */
    bool bitwise;        /* compared bit for bit */
    int64_t compared;    /* output elements compared, over all its cases */
    double max_abs_err;  /* max |gpu - cpu| over float outputs (0 when bitwise) */
    double max_rel_err;  /* max |gpu - cpu| / |cpu| over float outputs with cpu != 0 */
    double worst_ratio;  /* max |gpu - cpu| / bound over float outputs: <= 1 passes */
    bool passed;
    char failure[512];   /* the first failure: op, buffer, element, values; "" when passed */
} KvCudaValidateOp;

typedef struct {
    char device[256];    /* "NAME (sm_XY, N SMs), driver ..., cuBLAS ..." */
    uint64_t seed;       /* the input seed (model/prng.h streams) */
    unsigned faults;     /* KV_FAULT_* bits planted in the contexts (fault.h) */
    int n_ops;
    int n_failed;
    KvCudaValidateOp ops[KV_CUDA_VALIDATE_MAX_OPS];
} KvCudaValidateReport;

/* Validates every CUDA op for model m on device 0 with inputs drawn from
 * seed; faults (0 for a real validation) are KV_FAULT_* bits planted in the
 * CUDA contexts only, the CPU side stays clean, so a test can prove that the
 * validation catches them. Prints one line per op to log (may be NULL): op,
 * shape, tolerance, max abs / rel error, verdict.
 * Returns KV_OK when every op passed; KV_SKIP when no device is visible (err
 * carries CUDA's call and error text, *out has no ops); KV_ERR_INTERNAL when
 * an op failed (err names the first failing op, element and values; *out
 * has every op's verdict) or a CUDA call failed (err names it). out may be
 * NULL. Ops keep running after a mismatch, so one run shows every failing
 * op; a failed CUDA call stops the run. */
KvStatus kv_cuda_validate_ops(const KvModel *m, uint64_t seed, unsigned faults, FILE *log,
                              KvCudaValidateReport *out, KvError *err);

/* The op record named `op` in r, or NULL. */
const KvCudaValidateOp *kv_cuda_validate_find(const KvCudaValidateReport *r, const char *op);

#ifdef __cplusplus
}
#endif

#endif
