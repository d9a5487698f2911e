/* gate_output.c: the root attributes, failure lines and output files every
 * gate shares (gate_output.h). */
/* realpath is XSI */
#define _XOPEN_SOURCE 700
#include "gate_output.h"

#include <dirent.h>
#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "compare.h"
#include "junit.h"
#include "report_h5.h"

void kv_gate_fill_root(KvReport *rep, uint64_t weight_seed, uint64_t prompt_seed, int shard_i,
                       int shard_n) {
    snprintf(rep->tool_version, sizeof rep->tool_version, "%s", KV_VERSION);
    snprintf(rep->git_commit, sizeof rep->git_commit, "%s", KV_GIT_COMMIT);
    if (gethostname(rep->host, sizeof rep->host) != 0) snprintf(rep->host, sizeof rep->host, "unknown");
    rep->host[sizeof rep->host - 1] = '\0';
    snprintf(rep->math_mode, sizeof rep->math_mode, "fp32, -ffp-contract=off, no fast-math");
    rep->weight_seed = weight_seed;
    rep->prompt_seed = prompt_seed;
    snprintf(rep->shard, sizeof rep->shard, "%d/%d", shard_i, shard_n);
}

KvStatus kv_gate_check_outputs(const char *report_path, const char *junit_path, KvError *err) {
    KvStatus st = KV_OK;
    if (report_path != NULL) st = kv_report_check_writable(report_path, err);
    if (st == KV_OK && junit_path != NULL) st = kv_report_check_writable(junit_path, err);
    return st;
}

/* Whether paths a and b name one file: by device and inode when both
 * exist (links followed), else by their directories resolved and the same
 * last component. */
static bool gate_same_file(const char *a, const char *b) {
    struct stat sa, sb;
    const bool ea = stat(a, &sa) == 0, eb = stat(b, &sb) == 0;
    if (ea && eb) return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
    if (ea != eb) return false;
    char ca[PATH_MAX], cb[PATH_MAX], ra[PATH_MAX], rb[PATH_MAX];
    snprintf(ca, sizeof ca, "%s", a);
    snprintf(cb, sizeof cb, "%s", b);
    if (realpath(dirname(ca), ra) == NULL || realpath(dirname(cb), rb) == NULL) {
        return strcmp(a, b) == 0;
    }
    snprintf(ca, sizeof ca, "%s", a);
    snprintf(cb, sizeof cb, "%s", b);
    return strcmp(ra, rb) == 0 && strcmp(basename(ca), basename(cb)) == 0;
}

/* The checkpoint file of dir that `out` is, if any (a .json or
 * .safetensors file directly in dir), into hit. */
static bool gate_is_checkpoint_file(const char *out, const char *dir, char *hit, size_t n) {
    struct stat so;
    if (stat(out, &so) != 0) return false; /* a file to be created reads nothing */
    DIR *d = opendir(dir);
    if (d == NULL) return false;
    bool found = false;
    for (struct dirent *e = readdir(d); e != NULL && !found; e = readdir(d)) {
        const size_t len = strlen(e->d_name);
        const bool json = len > 5 && strcmp(e->d_name + len - 5, ".json") == 0;
        const bool st = len > 12 && strcmp(e->d_name + len - 12, ".safetensors") == 0;
        if (!json && !st) continue;
        snprintf(hit, n, "%s/%s", dir, e->d_name);
        struct stat si;
        found = stat(hit, &si) == 0 && si.st_dev == so.st_dev && si.st_ino == so.st_ino;
    }
    closedir(d);
    return found;
}

KvStatus kv_gate_check_outputs_apart(const char *report_path, const char *junit_path,
                                     const char *const *inputs, int n_inputs,
                                     const char *const *model_dirs, int n_dirs, KvError *err) {
    if (report_path != NULL && junit_path != NULL && gate_same_file(report_path, junit_path)) {
        return kv_error_set(err, KV_ERR_INPUT, "--report %s and --junit %s name the same file",
                            report_path, junit_path);
    }
    const char *outs[2] = {report_path, junit_path};
    const char *opts[2] = {"--report", "--junit"};
    for (int k = 0; k < 2; k++) {
        if (outs[k] == NULL) continue;
        for (int i = 0; i < n_inputs; i++) {
            if (inputs[i] != NULL && gate_same_file(outs[k], inputs[i])) {
                return kv_error_set(err, KV_ERR_INPUT, "%s %s is %s, an input of this gate: it "
                                    "would be overwritten", opts[k], outs[k], inputs[i]);
            }
        }
        for (int i = 0; i < n_dirs; i++) {
            char hit[PATH_MAX + 256];
            if (gate_is_checkpoint_file(outs[k], model_dirs[i], hit, sizeof hit)) {
                return kv_error_set(err, KV_ERR_INPUT, "%s %s is %s, a file of the checkpoint "
                                    "this gate reads: it would be overwritten", opts[k], outs[k],
                                    hit);
            }
        }
    }
    return KV_OK;
}

/* Writes rep to path with every run's seconds 0: a shallow copy of the
 * run table (the runs' arrays are shared, only read). */
static KvStatus gate_write_untimed(const KvReport *rep, const char *path, KvError *err) {
    KvReport copy = *rep;
    KvRun *runs = NULL;
    if (rep->n_runs > 0) {
        runs = malloc((size_t)rep->n_runs * sizeof *runs);
        if (runs == NULL) {
            return kv_error_set(err, KV_ERR_INTERNAL, "%s: out of memory for %lld runs", path,
                                (long long)rep->n_runs);
        }
        memcpy(runs, rep->runs, (size_t)rep->n_runs * sizeof *runs);
        for (int64_t i = 0; i < rep->n_runs; i++) runs[i].seconds = 0.0;
        copy.runs = runs;
    }
    const KvStatus st = kv_report_write_h5(&copy, path, err);
    free(runs);
    return st;
}

KvStatus kv_gate_write_outputs(const KvReport *rep, const char *report_path,
                               const char *junit_path, bool timings, bool quiet,
                               const char *gate_fail, KvError *err) {
    if (report_path != NULL) {
        KvStatus st = timings ? kv_report_write_h5(rep, report_path, err)
                              : gate_write_untimed(rep, report_path, err);
        if (st != KV_OK) return st;
        if (!quiet) printf("report: %s\n", report_path);
    }
    if (junit_path != NULL) {
        KvStatus st = kv_junit_write_verdict(rep, gate_fail, junit_path, err);
        if (st != KV_OK) return st;
        if (!quiet) printf("junit: %s\n", junit_path);
    }
    return KV_OK;
}
