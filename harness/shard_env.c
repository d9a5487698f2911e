/* shard_env.c: the shard a gate runs, from "I/N" or from the variables a
 * scheduler sets for each job of an array (shard_env.h). Every value is
 * checked strictly: a wrong shard is not a crash but a job that silently
 * runs another job's units and leaves its own untested. */
#include "shard_env.h"

#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* How much of a variable's value a message quotes: an environment variable
 * can hold anything, and the message must still fit one line. */
#define SHARD_SHOWN "%.40s"

/* Reads the decimal digits at *p (at least one; nothing else: no sign,
 * space or hex, which strtol would accept and no scheduler writes) into
 * *out, up to INT_MAX, and advances *p past them. */
static bool shard_read_digits(const char **p, int64_t *out) {
    const char *q = *p;
    int64_t v = 0;
    if (*q < '0' || *q > '9') return false;
    for (; *q >= '0' && *q <= '9'; q++) {
        v = v * 10 + (*q - '0');
        if (v > INT_MAX) return false;
    }
    *out = v;
    *p = q;
    return true;
}

/* A whole value that is a decimal integer 0..INT_MAX. */
static bool shard_parse_int(const char *text, int64_t *out) {
    const char *p = text;
    return shard_read_digits(&p, out) && *p == '\0';
}

bool kv_shard_parse(const char *text, int *index, int *count) {
    const char *p = text;
    int64_t i = 0, n = 0;
    if (!shard_read_digits(&p, &i) || *p++ != '/' || !shard_read_digits(&p, &n) || *p != '\0') {
        return false;
    }
    if (n < 1 || i < 1 || i > n) return false;
    *index = (int)i;
    *count = (int)n;
    return true;
}

/* The error for a variable whose value is not a decimal integer. */
static KvStatus shard_not_int(KvError *err, const char *name, const char *value) {
    return kv_error_set(err, KV_ERR_INPUT, "%s='" SHARD_SHOWN "': expected a non-negative "
                        "decimal integer", name, value);
}

/* 1. KVREPRO_SHARD=I/N. */
static KvStatus shard_from_explicit(const char *value, KvShard *s, KvError *err) {
    if (!kv_shard_parse(value, &s->index, &s->count)) {
        return kv_error_set(err, KV_ERR_INPUT, "KVREPRO_SHARD='" SHARD_SHOWN "': expected I/N "
                            "with 1 <= I <= N (the syntax of --shard I/N)", value);
    }
    snprintf(s->source, sizeof s->source, "KVREPRO_SHARD=" SHARD_SHOWN, value);
    return KV_OK;
}

/* 2. A Slurm array task. Arrays may start anywhere (--array=0-3, 1-4,
 * 100-103), so the index is the id's offset from the array's first id; a
 * step or a list leaves gaps between ids, which no offset can turn into
 * 1..N, so it is refused wherever the variables reveal it. */
static KvStatus shard_from_slurm(KvEnvLookup lookup, void *ctx, const char *id_text, KvShard *s,
                                 KvError *err) {
    const char *min_text = lookup("SLURM_ARRAY_TASK_MIN", ctx);
    const char *count_text = lookup("SLURM_ARRAY_TASK_COUNT", ctx);
    const char *max_text = lookup("SLURM_ARRAY_TASK_MAX", ctx);
    const char *step_text = lookup("SLURM_ARRAY_TASK_STEP", ctx);
    int64_t id = 0, min = 0, count = 0, max = 0, step = 1;
    if (!shard_parse_int(id_text, &id)) return shard_not_int(err, "SLURM_ARRAY_TASK_ID", id_text);
    if (min_text == NULL) {
        return kv_error_set(err, KV_ERR_INPUT, "SLURM_ARRAY_TASK_ID=" SHARD_SHOWN " is set but "
                            "SLURM_ARRAY_TASK_MIN is not: the shard index is ID - MIN + 1 "
                            "(Slurm sets both in an array job)", id_text);
    }
    if (!shard_parse_int(min_text, &min)) {
        return shard_not_int(err, "SLURM_ARRAY_TASK_MIN", min_text);
    }
    if (step_text != NULL && !shard_parse_int(step_text, &step)) {
        return shard_not_int(err, "SLURM_ARRAY_TASK_STEP", step_text);
    }
    if (step_text != NULL && step != 1) {
        return kv_error_set(err, KV_ERR_INPUT, "SLURM_ARRAY_TASK_STEP=" SHARD_SHOWN ": expected "
                            "1; the array's task ids are not contiguous (e.g. --array=0-9:2), so "
                            "ID - MIN + 1 is not a shard index: submit --array=MIN-MAX without a "
                            "step", step_text);
    }
    if (max_text != NULL && !shard_parse_int(max_text, &max)) {
        return shard_not_int(err, "SLURM_ARRAY_TASK_MAX", max_text);
    }
    if (max_text != NULL && max < min) {
        return kv_error_set(err, KV_ERR_INPUT, "SLURM_ARRAY_TASK_MAX=" SHARD_SHOWN ": expected "
                            ">= SLURM_ARRAY_TASK_MIN=" SHARD_SHOWN, max_text, min_text);
    }
    const char *count_name = "SLURM_ARRAY_TASK_COUNT";
    const char *count_shown = count_text;
    if (count_text != NULL) {
        if (!shard_parse_int(count_text, &count)) {
            return shard_not_int(err, "SLURM_ARRAY_TASK_COUNT", count_text);
        }
        if (count < 1) {
            return kv_error_set(err, KV_ERR_INPUT, "SLURM_ARRAY_TASK_COUNT=" SHARD_SHOWN
                                ": expected >= 1", count_text);
        }
        if (max_text != NULL && max - min + 1 != count) {
            return kv_error_set(err, KV_ERR_INPUT, "SLURM_ARRAY_TASK_COUNT=" SHARD_SHOWN
                                ", but SLURM_ARRAY_TASK_MIN=" SHARD_SHOWN " to "
                                "SLURM_ARRAY_TASK_MAX=" SHARD_SHOWN " spans %lld ids: the "
                                "array's task ids are not contiguous (e.g. --array=1,3,5), so "
                                "ID - MIN + 1 is not a shard index: submit --array=MIN-MAX",
                                count_text, min_text, max_text, (long long)(max - min + 1));
        }
    } else if (max_text != NULL) {
        /* Slurm releases before SLURM_ARRAY_TASK_COUNT: a contiguous array
         * has MAX - MIN + 1 tasks. */
        count = max - min + 1;
        count_name = "SLURM_ARRAY_TASK_MAX";
        count_shown = max_text;
        if (count > INT_MAX) {
            return kv_error_set(err, KV_ERR_INPUT, "SLURM_ARRAY_TASK_MAX=" SHARD_SHOWN " with "
                                "SLURM_ARRAY_TASK_MIN=" SHARD_SHOWN ": more than %d shards",
                                max_text, min_text, INT_MAX);
        }
    } else {
        return kv_error_set(err, KV_ERR_INPUT, "SLURM_ARRAY_TASK_ID=" SHARD_SHOWN " is set but "
                            "neither SLURM_ARRAY_TASK_COUNT nor SLURM_ARRAY_TASK_MAX is: the "
                            "number of shards is unknown", id_text);
    }
    if (id < min || id - min + 1 > count) {
        return kv_error_set(err, KV_ERR_INPUT, "SLURM_ARRAY_TASK_ID=" SHARD_SHOWN ": expected "
                            "%lld..%lld, the array's ids (SLURM_ARRAY_TASK_MIN=" SHARD_SHOWN
                            ", %s=" SHARD_SHOWN ")", id_text, (long long)min,
                            (long long)(min + count - 1), min_text, count_name, count_shown);
    }
    s->index = (int)(id - min + 1);
    s->count = (int)count;
    snprintf(s->source, sizeof s->source,
             "SLURM_ARRAY_TASK_ID=" SHARD_SHOWN ", SLURM_ARRAY_TASK_MIN=" SHARD_SHOWN
             ", %s=" SHARD_SHOWN, id_text, min_text, count_name, count_shown);
    return KV_OK;
}

/* 3. A GitLab job: CI_NODE_INDEX is 1-based already. GitLab sets
 * CI_NODE_TOTAL=1 and no CI_NODE_INDEX in a job without `parallel`, which
 * is then the whole gate. */
static KvStatus shard_from_gitlab(const char *index_text, const char *total_text, KvShard *s,
                                  KvError *err) {
    int64_t index = 1, total = 0;
    if (total_text == NULL) {
        return kv_error_set(err, KV_ERR_INPUT, "CI_NODE_INDEX=" SHARD_SHOWN " is set but "
                            "CI_NODE_TOTAL is not: the number of shards is unknown", index_text);
    }
    if (!shard_parse_int(total_text, &total)) return shard_not_int(err, "CI_NODE_TOTAL", total_text);
    if (total < 1) {
        return kv_error_set(err, KV_ERR_INPUT, "CI_NODE_TOTAL=" SHARD_SHOWN ": expected >= 1",
                            total_text);
    }
    if (index_text == NULL) {
        if (total != 1) {
            return kv_error_set(err, KV_ERR_INPUT, "CI_NODE_TOTAL=" SHARD_SHOWN " is set but "
                                "CI_NODE_INDEX is not (GitLab sets both in a job with "
                                "parallel: N)", total_text);
        }
        s->index = s->count = 1;
        snprintf(s->source, sizeof s->source, "CI_NODE_TOTAL=" SHARD_SHOWN ", no CI_NODE_INDEX: "
                 "a GitLab job without parallel", total_text);
        return KV_OK;
    }
    if (!shard_parse_int(index_text, &index)) return shard_not_int(err, "CI_NODE_INDEX", index_text);
    if (index < 1 || index > total) {
        return kv_error_set(err, KV_ERR_INPUT, "CI_NODE_INDEX=" SHARD_SHOWN ": expected "
                            "1..CI_NODE_TOTAL=" SHARD_SHOWN " (GitLab's index is 1-based)",
                            index_text, total_text);
    }
    s->index = (int)index;
    s->count = (int)total;
    snprintf(s->source, sizeof s->source, "CI_NODE_INDEX=" SHARD_SHOWN ", CI_NODE_TOTAL="
             SHARD_SHOWN, index_text, total_text);
    return KV_OK;
}

KvStatus kv_shard_from_env(KvEnvLookup lookup, void *ctx, KvShard *out, KvError *err) {
    KvShard s;
    memset(&s, 0, sizeof s);
    KvStatus st = KV_OK;
    const char *explicit_shard = lookup("KVREPRO_SHARD", ctx);
    const char *slurm_id = lookup("SLURM_ARRAY_TASK_ID", ctx);
    const char *ci_index = lookup("CI_NODE_INDEX", ctx);
    const char *ci_total = lookup("CI_NODE_TOTAL", ctx);
    if (explicit_shard != NULL) {
        st = shard_from_explicit(explicit_shard, &s, err);
    } else if (slurm_id != NULL) {
        st = shard_from_slurm(lookup, ctx, slurm_id, &s, err);
    } else if (ci_index != NULL || ci_total != NULL) {
        st = shard_from_gitlab(ci_index, ci_total, &s, err);
    } else {
        st = kv_error_set(err, KV_ERR_INPUT, "found none of KVREPRO_SHARD, "
                          "SLURM_ARRAY_TASK_ID/COUNT, CI_NODE_INDEX/TOTAL: set KVREPRO_SHARD=I/N, "
                          "run it as a Slurm array task or a GitLab parallel job, or give "
                          "--shard I/N");
    }
    if (st == KV_OK) *out = s;
    return st;
}
