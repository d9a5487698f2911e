/* shard_env.h: which shard of the gate this process runs, for
 * `kvrepro gate --shard I/N` and `--shard auto`. `auto` reads the
 * index and count a scheduler already gives each job, so one job script
 * serves every shard; the environment is read through a lookup callback, so
 * the unit test passes a table instead of racing on setenv. */
#ifndef KV_SHARD_ENV_H
#define KV_SHARD_ENV_H

#include <stdbool.h>

#include "status.h"

/* Returns the value of the environment variable name, or NULL when it is
 * not set; ctx is the caller's (NULL for a getenv wrapper). */
typedef const char *(*KvEnvLookup)(const char *name, void *ctx);

/* A resolved shard: run the units u with u % count == index - 1. */
typedef struct {
    int index; /* 1-based, 1..count */
    int count; /* >= 1 */
    /* The variables it came from, as "NAME=VALUE, ..." (e.g.
     * "SLURM_ARRAY_TASK_ID=1, SLURM_ARRAY_TASK_MIN=0, SLURM_ARRAY_TASK_COUNT=4"),
     * for the gate log: a CI log must show why this job ran these units. */
    char source[320];
} KvShard;

/* Parses "I/N" (decimal digits only, 1 <= I <= N <= INT_MAX, nothing
 * around it: the syntax of --shard and of KVREPRO_SHARD) into *index and
 * *count. Returns false, leaving them unchanged, for anything else. */
bool kv_shard_parse(const char *text, int *index, int *count);

/* Resolves `--shard auto` from the environment, the first source set in
 * this order:
 *   1. KVREPRO_SHARD=I/N (an explicit choice beats any scheduler's);
 *   2. a Slurm array job: SLURM_ARRAY_TASK_ID (set) with
 *      SLURM_ARRAY_TASK_MIN, and SLURM_ARRAY_TASK_COUNT or, without it,
 *      SLURM_ARRAY_TASK_MAX: index = ID - MIN + 1, count = COUNT (or
 *      MAX - MIN + 1);
 *   3. a GitLab parallel job: CI_NODE_INDEX (1-based) and CI_NODE_TOTAL;
 *      CI_NODE_TOTAL=1 alone (GitLab's value in a job without `parallel`)
 *      is shard 1/1.
 * A source counts as set when its first variable is set, even to "": an
 * empty or malformed value is an error, never a fall-through to the next
 * source (which would run some other job's units). Errors (KV_ERR_INPUT,
 * the message naming the variable and its value): a value that is not a
 * non-negative decimal integer, an index outside 1..count, a missing
 * companion variable, and a Slurm array whose task ids are not contiguous
 * as far as the variables show it (SLURM_ARRAY_TASK_STEP > 1, or a COUNT
 * that is not MAX - MIN + 1, as --array=1,3,5 gives). None set at all is
 * KV_ERR_INPUT too. On error *out is left unchanged. */
KvStatus kv_shard_from_env(KvEnvLookup lookup, void *ctx, KvShard *out, KvError *err);

#endif
