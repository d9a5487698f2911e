/* report.c: ownership of the in-memory report (kv_run_free, kv_report_free),
 * the summary table that `kvrepro show` and the gate print, and how report
 * files reach the disk (kv_report_file_publish, shared by the HDF5 and JUnit
 * writers). Nothing here touches HDF5, so the harness can print a summary
 * without the writer. */
/* O_TMPFILE and AT_EMPTY_PATH are Linux extensions */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "report.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

void kv_run_init(KvRun *r) {
    if (r == NULL) return;
    memset(r, 0, sizeof *r);
    r->replay_mismatch_step = -1;
    r->recompiles = -1;
    r->graph_budget = -1;
}

/* Whether s is well-formed UTF-8 (RFC 3629: no overlong forms, no
 * surrogates, nothing above U+10FFFF). */
bool kv_utf8_valid(const char *text) {
    const unsigned char *s = (const unsigned char *)text;
    while (*s != 0) {
        const unsigned c = *s;
        int more = 0;
        unsigned cp = 0, min = 0;
        if (c < 0x80) {
            s++;
            continue;
        } else if ((c & 0xE0) == 0xC0) {
            more = 1, cp = c & 0x1F, min = 0x80;
        } else if ((c & 0xF0) == 0xE0) {
            more = 2, cp = c & 0x0F, min = 0x800;
        } else if ((c & 0xF8) == 0xF0) {
            more = 3, cp = c & 0x07, min = 0x10000;
        } else {
            return false;
        }
        s++;
        for (int k = 0; k < more; k++, s++) {
            if ((*s & 0xC0) != 0x80) return false;
            cp = cp << 6 | (*s & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    }
    return true;
}

void kv_text_snippet(const char *text, int max_chars, char *out, size_t n) {
    size_t w = 0;
    int chars = 0;
    bool space = false;
    if (n == 0) return;
    for (const unsigned char *s = (const unsigned char *)text; *s != 0;) {
        if (*s == ' ' || *s == '\n' || *s == '\t' || *s == '\r' || *s == '\f' || *s == '\v') {
            space = w > 0; /* leading whitespace dropped, inner runs become one space */
            s++;
            continue;
        }
        size_t len = 1; /* a whole UTF-8 sequence, or one byte of a bad one */
        if ((*s & 0xE0) == 0xC0) len = 2;
        else if ((*s & 0xF0) == 0xE0) len = 3;
        else if ((*s & 0xF8) == 0xF0) len = 4;
        for (size_t k = 1; k < len; k++) {
            if ((s[k] & 0xC0) != 0x80) len = k;
        }
        const bool ctrl = *s < 0x20 || *s == 0x7F; /* never a raw control byte in a log */
        if (chars + (space ? 1 : 0) + 1 > max_chars || w + len + 5 >= n) {
            snprintf(out + w, n - w, "...");
            return;
        }
        if (space) {
            out[w++] = ' ';
            chars++;
            space = false;
        }
        if (ctrl) {
            out[w++] = '?';
        } else {
            memcpy(out + w, s, len);
            w += len;
        }
        chars++;
        s += len;
    }
    out[w] = '\0';
}

int64_t kv_run_row_ids(const KvRun *r, int64_t b) {
    int64_t n = 0;
    for (int64_t i = 0; r->prompt_real != NULL && i < r->prompt_len; i++) {
        n += r->prompt_real[b * r->prompt_len + i] != 0;
    }
    return n;
}

char **kv_prompt_text_copy(char *const *texts, int64_t n) {
    char **out = calloc((size_t)(n > 0 ? n : 0) + 1, sizeof *out);
    for (int64_t b = 0; out != NULL && b < n; b++) {
        out[b] = strdup(texts[b] != NULL ? texts[b] : "");
        if (out[b] == NULL) {
            kv_prompt_text_free(out);
            out = NULL;
        }
    }
    return out;
}

void kv_prompt_text_free(char **texts) {
    for (char **t = texts; t != NULL && *t != NULL; t++) free(*t);
    free(texts);
}

void kv_run_free(KvRun *r) {
    if (r == NULL) return;
    free(r->prompt);
    free(r->prompt_real);
    free(r->suffix);
    free(r->tokens);
    free(r->logits);
    free(r->topk_ids);
    free(r->topk_values);
    free(r->logits_hash);
    free(r->margins);
    free(r->probe_names);
    free(r->probe_hash);
    free(r->fp64_rel_err);
    kv_prompt_text_free(r->prompt_text);
    memset(r, 0, sizeof *r);
}

void kv_report_free(KvReport *rep) {
    if (rep == NULL) return;
    if (rep->runs != NULL) {
        for (int64_t i = 0; i < rep->n_runs; i++) kv_run_free(&rep->runs[i]);
    }
    free(rep->runs);
    free(rep->tolerances);
    free(rep->comparisons);
    memset(rep, 0, sizeof *rep);
}

/* ---- per-run verdicts ------------------------------------------------------
 * One accumulator gives every per-run answer, whether for one run (a pass
 * over all comparisons) or for all runs at once (one pass in total), so the
 * two can never disagree. */

static void run_summary_init(KvRunSummary *s) {
    s->verdict = KV_VERDICT_PASS;
    s->max_rel_err = NAN;
    s->n_comparisons = 0;
    s->n_reference = 0;
    s->first_fail = -1;
    s->first_skip = -1;
}

/* Comparison c (index k) names this run as its candidate. The largest
 * max_rel_err of the reference comparisons (the only ones that measure an
 * error: the others are bitwise or per-run checks) is kept, except that the
 * first NaN wins and stays: a NaN error is the worst possible and must not
 * be hidden by max(). */
static void run_summary_add(KvRunSummary *s, const KvComparison *c, int64_t k) {
    const double e = c->max_rel_err;
    if (c->kind == KV_CMP_REFERENCE) {
        if (s->n_reference == 0 || (!isnan(s->max_rel_err) && (isnan(e) || e > s->max_rel_err))) {
            s->max_rel_err = e;
        }
        s->n_reference++;
    }
    s->n_comparisons++;
    if (c->verdict == KV_VERDICT_FAIL && s->first_fail < 0) s->first_fail = k;
    if (c->verdict == KV_VERDICT_SKIP && s->first_skip < 0) s->first_skip = k;
}

/* A failure outranks a skip; a run that was not run is a skip. */
static void run_summary_finish(KvRunSummary *s, const KvRun *r) {
    if (s->first_fail >= 0) {
        s->verdict = KV_VERDICT_FAIL;
    } else if (r->skipped || s->first_skip >= 0) {
        s->verdict = KV_VERDICT_SKIP;
    } else {
        s->verdict = KV_VERDICT_PASS;
    }
}

/* The summary of run i by a pass over every comparison; false when i is
 * not a run of rep. */
static bool run_summary_one(const KvReport *rep, int64_t i, KvRunSummary *s) {
    run_summary_init(s);
    if (rep == NULL || rep->runs == NULL || i < 0 || i >= rep->n_runs) return false;
    if (rep->comparisons != NULL) {
        for (int64_t k = 0; k < rep->n_comparisons; k++) {
            if (rep->comparisons[k].run_b == i) run_summary_add(s, &rep->comparisons[k], k);
        }
    }
    run_summary_finish(s, &rep->runs[i]);
    return true;
}

KvStatus kv_report_summarize_runs(const KvReport *rep, KvRunSummary **out) {
    if (rep == NULL || out == NULL) return KV_ERR_INPUT;
    *out = NULL;
    if (rep->n_runs <= 0 || rep->runs == NULL) return KV_OK;
    if ((uint64_t)rep->n_runs > SIZE_MAX / sizeof(KvRunSummary)) return KV_ERR_INTERNAL;
    KvRunSummary *s = malloc((size_t)rep->n_runs * sizeof *s);
    if (s == NULL) return KV_ERR_INTERNAL;
    for (int64_t i = 0; i < rep->n_runs; i++) run_summary_init(&s[i]);
    if (rep->comparisons != NULL) {
        for (int64_t k = 0; k < rep->n_comparisons; k++) {
            const int64_t b = rep->comparisons[k].run_b;
            if (b >= 0 && b < rep->n_runs) run_summary_add(&s[b], &rep->comparisons[k], k);
        }
    }
    for (int64_t i = 0; i < rep->n_runs; i++) run_summary_finish(&s[i], &rep->runs[i]);
    *out = s;
    return KV_OK;
}

KvStatus kv_report_print_counts(const KvReport *rep, FILE *f) {
    if (rep == NULL || f == NULL) return KV_ERR_INTERNAL;
    KvRunSummary *sum = NULL;
    if (kv_report_summarize_runs(rep, &sum) != KV_OK) return KV_ERR_INTERNAL;
    int64_t passed = 0, failed = 0, skipped = 0;
    for (int64_t i = 0; i < rep->n_runs; i++) {
        const KvVerdict v = sum[i].verdict;
        passed += v == KV_VERDICT_PASS;
        failed += v == KV_VERDICT_FAIL;
        skipped += v == KV_VERDICT_SKIP;
    }
    free(sum);
    fprintf(f, "%" PRId64 " passed, %" PRId64 " failed, %" PRId64 " skipped\n", passed, failed,
            skipped);
    if (fflush(f) != 0 || ferror(f)) return KV_ERR_INTERNAL;
    return KV_OK;
}

KvVerdict kv_report_run_verdict(const KvReport *rep, int64_t i) {
    KvRunSummary s;
    return run_summary_one(rep, i, &s) ? s.verdict : KV_VERDICT_SKIP;
}

double kv_report_run_max_rel_err(const KvReport *rep, int64_t i) {
    KvRunSummary s;
    return run_summary_one(rep, i, &s) ? s.max_rel_err : NAN;
}

/* Text of a fixed-size name field, safe when it is not NUL-terminated. */
static int field_len(const char *s, size_t cap) { return (int)strnlen(s, cap); }

void kv_run_variant_label(const KvRun *r, char *out, size_t n) {
    const int fl = field_len(r->fault, sizeof r->fault);
    snprintf(out, n, "%.*s%s%.*s", field_len(r->variant, sizeof r->variant), r->variant,
             fl > 0 ? "+" : "", fl, r->fault);
}

void kv_report_run_divergence_of(const KvReport *rep, int64_t i, const KvRunSummary *s, char *buf,
                                 size_t n) {
    if (buf == NULL || n == 0) return;
    snprintf(buf, n, "-");
    if (rep == NULL || rep->runs == NULL || s == NULL || i < 0 || i >= rep->n_runs) return;
    const KvRun *run = &rep->runs[i];
    const bool have_cmp = rep->comparisons != NULL;
    if (have_cmp && s->first_fail >= 0 && s->first_fail < rep->n_comparisons) {
        const KvComparison *fail = &rep->comparisons[s->first_fail];
        const char *msg = fail->message;
        const int msg_len = field_len(msg, sizeof fail->message);
        if (fail->first_step < 0 || fail->run_a < 0 || fail->run_a >= rep->n_runs) {
            snprintf(buf, n, "%.*s", msg_len, msg);
            return;
        }
        const KvRun *a = &rep->runs[fail->run_a];
        char va[2 * KV_NAME_LEN + 2];
        kv_run_variant_label(a, va, sizeof va);
        char probe[KV_NAME_LEN + 16] = "";
        if (fail->first_probe >= 0 && fail->first_probe < run->n_probes &&
            run->probe_names != NULL) {
            snprintf(probe, sizeof probe, " probe %.*s",
                     field_len(run->probe_names[fail->first_probe], KV_NAME_LEN),
                     run->probe_names[fail->first_probe]);
        } else if (fail->first_probe >= 0) {
            snprintf(probe, sizeof probe, " probe #%" PRId64, fail->first_probe);
        }
        snprintf(buf, n, "step %" PRId64 " row %" PRId64 "%s vs %s/%.*s/%.*s/r%" PRId32,
                 fail->first_step, fail->first_row, probe, va,
                 field_len(a->backend, sizeof a->backend), a->backend,
                 field_len(a->mode, sizeof a->mode), a->mode, a->repeat);
        return;
    }
    if (run->skipped) {
        snprintf(buf, n, "skipped: %.*s", field_len(run->skip_reason, sizeof run->skip_reason),
                 run->skip_reason);
    } else if (have_cmp && s->first_skip >= 0 && s->first_skip < rep->n_comparisons) {
        const KvComparison *skip = &rep->comparisons[s->first_skip];
        snprintf(buf, n, "%.*s", field_len(skip->message, sizeof skip->message), skip->message);
    }
}

void kv_report_run_divergence(const KvReport *rep, int64_t i, char *buf, size_t n) {
    KvRunSummary s;
    if (!run_summary_one(rep, i, &s)) {
        if (buf != NULL && n > 0) snprintf(buf, n, "-");
        return;
    }
    kv_report_run_divergence_of(rep, i, &s, buf, n);
}

static const char *verdict_text(KvVerdict v) {
    switch (v) {
    case KV_VERDICT_PASS: return "PASS";
    case KV_VERDICT_FAIL: return "FAIL";
    case KV_VERDICT_SKIP: return "SKIP";
    }
    return "?";
}

/* The table's divergence column is cut to this many characters (the full
 * message is in the report and the JUnit XML): CUDA skip reasons are long. */
#define KV_SUMMARY_DIVERGENCE_MAX 60

static void summary_divergence(const KvReport *rep, int64_t i, const KvRunSummary *s, char *div,
                               size_t n) {
    kv_report_run_divergence_of(rep, i, s, div, n);
    if (strlen(div) > KV_SUMMARY_DIVERGENCE_MAX && n > KV_SUMMARY_DIVERGENCE_MAX) {
        memcpy(div + KV_SUMMARY_DIVERGENCE_MAX - 3, "...", 4);
    }
}

/* Column widths of the summary table: the widest entry or header. */
typedef struct {
    int index, model, scenario, variant, backend, mode, divergence;
} SummaryWidths;

static int max_int(int a, int b) { return a > b ? a : b; }

/* True when run r is skipped on one of the n_fold backends in fold. */
static bool summary_folded(const KvRun *r, const char *const *fold, int n_fold) {
    if (!r->skipped) return false;
    for (int k = 0; k < n_fold; k++) {
        if (strncmp(r->backend, fold[k], sizeof r->backend) == 0) return true;
    }
    return false;
}

KvStatus kv_report_print_summary(const KvReport *rep, FILE *f) {
    return kv_report_print_summary_folded(rep, NULL, 0, f);
}

KvStatus kv_report_print_summary_folded(const KvReport *rep, const char *const *fold, int n_fold,
                                        FILE *f) {
    const KvStatus st = kv_report_print_table_folded(rep, fold, n_fold, f);
    return st != KV_OK ? st : kv_report_print_counts(rep, f);
}

KvStatus kv_report_print_table_folded(const KvReport *rep, const char *const *fold, int n_fold,
                                      FILE *f) {
    if (rep == NULL || f == NULL) return KV_ERR_INTERNAL;
    KvRunSummary *sum = NULL;
    if (kv_report_summarize_runs(rep, &sum) != KV_OK) return KV_ERR_INTERNAL;
    char div[512];
    SummaryWidths w = {1, 5, 8, 7, 7, 4, 16}; /* the header words */
    char num[24];
    w.index = max_int(w.index, snprintf(num, sizeof num, "%" PRId64, rep->n_runs - 1));
    for (int64_t i = 0; i < rep->n_runs; i++) {
        const KvRun *r = &rep->runs[i];
        if (summary_folded(r, fold, n_fold)) continue;
        w.model = max_int(w.model, field_len(r->model, sizeof r->model));
        w.scenario = max_int(w.scenario, field_len(r->scenario, sizeof r->scenario));
        char vl[2 * KV_NAME_LEN + 2];
        kv_run_variant_label(r, vl, sizeof vl);
        w.variant = max_int(w.variant, (int)strlen(vl));
        w.backend = max_int(w.backend, field_len(r->backend, sizeof r->backend));
        w.mode = max_int(w.mode, field_len(r->mode, sizeof r->mode));
        summary_divergence(rep, i, &sum[i], div, sizeof div);
        w.divergence = max_int(w.divergence, (int)strlen(div));
    }
    /* "#" is the run index that diff and bisect take as --run (as does the
     * label MODEL/SCENARIO/VARIANT/BACKEND/MODE/rN from these columns) */
    fprintf(f, "%*s  %-*s  %-*s  %-*s  %-*s  %-*s  %6s  %-7s  %-*s  %11s  %6s\n", w.index, "#",
            w.model, "model", w.scenario, "scenario", w.variant, "variant", w.backend, "backend", w.mode, "mode",
            "repeat", "verdict", w.divergence, "first divergence", "max rel err", "graphs");
    for (int64_t i = 0; i < rep->n_runs; i++) {
        const KvRun *r = &rep->runs[i];
        if (summary_folded(r, fold, n_fold)) continue;
        const KvVerdict v = sum[i].verdict;
        summary_divergence(rep, i, &sum[i], div, sizeof div);
        char vl[2 * KV_NAME_LEN + 2];
        kv_run_variant_label(r, vl, sizeof vl);
        /* "-" when nothing measured an error; a NaN error prints as "nan" */
        char rel_text[32] = "-";
        if (sum[i].n_reference > 0) {
            snprintf(rel_text, sizeof rel_text, "%.3e", sum[i].max_rel_err);
        }
        fprintf(f,
                "%*" PRId64 "  %-*.*s  %-*.*s  %-*s  %-*.*s  %-*.*s  %6" PRId32
                "  %-7s  %-*s  %11s  %6" PRId64 "\n",
                w.index, i, w.model, field_len(r->model, sizeof r->model), r->model, w.scenario,
                field_len(r->scenario, sizeof r->scenario), r->scenario, w.variant, vl, w.backend,
                field_len(r->backend, sizeof r->backend), r->backend, w.mode,
                field_len(r->mode, sizeof r->mode), r->mode, r->repeat, verdict_text(v),
                w.divergence, div, rel_text, r->graphs_captured);
    }
    free(sum);
    /* flushed: the gate writes its files next, and an error doing so goes
     * to stderr after the table, not before it */
    if (fflush(f) != 0 || ferror(f)) return KV_ERR_INTERNAL;
    return KV_OK;
}

/* ---- report files ------------------------------------------------------- */

/* The temporary's suffix: "<path>.tmp-<pid>". */
#define KV_TMP_SUFFIX ".tmp-"
/* Room for KV_TMP_SUFFIX, a pid and the terminator. */
#define KV_TMP_EXTRA 32

/* The directory part of path into dir (NUL-terminated): "." for a bare
 * name, "/" for a name in the root. */
static void path_dir(const char *path, char *dir, size_t n) {
    const char *slash = strrchr(path, '/');
    if (slash == NULL) {
        snprintf(dir, n, ".");
    } else if (slash == path) {
        snprintf(dir, n, "/");
    } else {
        snprintf(dir, n, "%.*s", (int)(slash - path), path);
    }
}

static const char *path_base(const char *path) {
    const char *slash = strrchr(path, '/');
    return slash == NULL ? path : slash + 1;
}

/* A pid written in decimal: all digits, at least one, within pid_t. */
static bool parse_pid(const char *d, long *pid) {
    if (*d == '\0') return false;
    long v = 0;
    for (const char *q = d; *q != '\0'; q++) {
        if (*q < '0' || *q > '9' || v > ((long)INT_MAX - 9) / 10) return false;
        v = v * 10 + (*q - '0');
    }
    *pid = v;
    return true;
}

/* "NAME.tmp-DIGITS" with a non-empty NAME (the last ".tmp-" counts:
 * "a.tmp-1.tmp-2" is a temporary of "a.tmp-1"). */
static bool temp_name_pid(const char *name, long *pid) {
    const char *t = NULL;
    for (const char *p = strstr(name, KV_TMP_SUFFIX); p != NULL; p = strstr(p + 1, KV_TMP_SUFFIX)) {
        t = p;
    }
    return t != NULL && t != name && parse_pid(t + strlen(KV_TMP_SUFFIX), pid);
}

bool kv_report_is_temp_name(const char *path) {
    long pid = 0;
    return path != NULL && temp_name_pid(path_base(path), &pid);
}

/* Removes "<base>.tmp-<pid>" in dir for every pid that no longer exists:
 * what a writer killed between creating its temporary and the rename left.
 * Best effort: a leftover that cannot be removed must not stop this write.
 * kill(pid, 0) failing with ESRCH is "no such process"; EPERM means it
 * exists (another user's), so its file is kept. A pid reused since keeps its
 * stale file, which is harmless. Writers in another pid namespace sharing
 * the directory would look dead here; their named temporary exists only
 * between a link and a rename (kv_report_file_publish), so the window for
 * that is a few microseconds. */
static void remove_stale_temps(const char *dir, const char *base) {
    DIR *d = opendir(dir);
    if (d == NULL) return;
    const size_t blen = strlen(base), slen = strlen(KV_TMP_SUFFIX);
    const long self = (long)getpid();
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        long pid = 0;
        if (strncmp(e->d_name, base, blen) != 0 ||
            strncmp(e->d_name + blen, KV_TMP_SUFFIX, slen) != 0 ||
            !parse_pid(e->d_name + blen + slen, &pid) || pid <= 0) {
            continue;
        }
        /* our own pid: a leftover of an earlier process that had it */
        if (pid == self || (kill((pid_t)pid, 0) != 0 && errno == ESRCH)) {
            if (unlinkat(dirfd(d), e->d_name, 0) != 0) {
                /* best effort, see above */
            }
        }
    }
    closedir(d);
}

/* What stands at path must be replaceable by a rename: nothing, a regular
 * file or a symbolic link (replaced itself, not its target). A directory, a
 * device or a FIFO is refused before anything is written (renaming over
 * /dev/null as root would replace the device), as is a name of the form of
 * a writer's temporary. */
static KvStatus check_target(const char *path, KvError *err) {
    /* readers refuse such names (kv_report_is_temp_name), and the stale
     * temporaries a writer removes are named so */
    if (kv_report_is_temp_name(path)) {
        return kv_error_set(err, KV_ERR_INPUT,
                            "%s: cannot create: a name ending in " KV_TMP_SUFFIX
                            "DIGITS is a writer's temporary",
                            path);
    }
    struct stat sb;
    if (lstat(path, &sb) != 0) {
        if (errno == ENOENT) return KV_OK;
        return kv_error_set(err, KV_ERR_INPUT, "%s: cannot create: %s", path, strerror(errno));
    }
    if (S_ISREG(sb.st_mode) || S_ISLNK(sb.st_mode)) return KV_OK;
    if (S_ISDIR(sb.st_mode)) {
        return kv_error_set(err, KV_ERR_INPUT, "%s: cannot create: %s", path, strerror(EISDIR));
    }
    return kv_error_set(err, KV_ERR_INPUT,
                        "%s: cannot create: expected a regular file or a new name, found %s",
                        path,
                        S_ISCHR(sb.st_mode)    ? "a character device"
                        : S_ISBLK(sb.st_mode)  ? "a block device"
                        : S_ISFIFO(sb.st_mode) ? "a FIFO"
                        : S_ISSOCK(sb.st_mode) ? "a socket"
                                               : "something that is not a file");
}

/* open(dir, O_TMPFILE) failed with e: true when that means "this file
 * system (or kernel) has no unnamed files" rather than a real error. Old
 * kernels that do not know the flag see O_DIRECTORY and say EISDIR. */
static bool tmpfile_unsupported(int e) { return e == EOPNOTSUPP || e == EISDIR || e == EINVAL; }

/* An unnamed file in dir (O_TMPFILE), or -1 with errno. */
static int open_unnamed(const char *dir) {
#ifdef O_TMPFILE
    return open(dir, O_TMPFILE | O_WRONLY | O_CLOEXEC, 0666);
#else
    (void)dir;
    errno = EOPNOTSUPP;
    return -1;
#endif
}

static int write_all(int fd, const void *data, size_t len) {
    const unsigned char *p = data;
    while (len > 0) {
        const size_t chunk = len > (size_t)1 << 30 ? (size_t)1 << 30 : len;
        const ssize_t w = write(fd, p, chunk);
        if (w < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        if (w == 0) {
            errno = EIO;
            return -1;
        }
        p += w;
        len -= (size_t)w;
    }
    return 0;
}

/* fsync, where "not supported here" is not a failure. */
static int sync_fd(int fd) {
    if (fsync(fd) == 0 || errno == EINVAL || errno == ENOTSUP) return 0;
    return -1;
}

/* Gives the unnamed file fd the name tmp: through /proc (any user), else
 * AT_EMPTY_PATH (needs CAP_DAC_READ_SEARCH). -1 with errno when neither. */
static int link_unnamed(int fd, const char *tmp) {
#ifdef AT_SYMLINK_FOLLOW
    char proc[64];
    snprintf(proc, sizeof proc, "/proc/self/fd/%d", fd);
    if (linkat(AT_FDCWD, proc, AT_FDCWD, tmp, AT_SYMLINK_FOLLOW) == 0) return 0;
#endif
#ifdef AT_EMPTY_PATH
    if (linkat(fd, "", AT_FDCWD, tmp, AT_EMPTY_PATH) == 0) return 0;
#endif
    return -1;
}

/* Creates the named temporary tmp for writing: a new file, never through
 * a link. Something already at that name (a leftover of an earlier process
 * with this pid, or a symbolic link planted there so that the writer would
 * overwrite its target) is removed first: O_EXCL | O_NOFOLLOW refuses it,
 * then one retry after unlinking the name itself (a link, not its target).
 * -1 with errno when neither works. */
static int open_named_temp(const char *tmp) {
    const int flags = O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC;
    int fd = open(tmp, flags, 0666);
    if (fd < 0 && (errno == EEXIST || errno == ELOOP)) {
        if (unlink(tmp) != 0 && errno != ENOENT) return -1;
        fd = open(tmp, flags, 0666);
    }
    return fd;
}

KvStatus kv_report_check_writable(const char *path, KvError *err) {
    if (path == NULL || path[0] == '\0') {
        return kv_error_set(err, KV_ERR_INPUT,
                            "kv_report_check_writable: a non-empty path is required");
    }
    KvStatus st = check_target(path, err);
    if (st != KV_OK) return st;
    const size_t n = strlen(path) + KV_TMP_EXTRA;
    char *dir = malloc(n), *tmp = malloc(n);
    if (dir == NULL || tmp == NULL) {
        st = kv_error_set(err, KV_ERR_INTERNAL, "%s: out of memory", path);
        goto cleanup;
    }
    path_dir(path, dir, n);
    int fd = open_unnamed(dir);
    if (fd < 0 && tmpfile_unsupported(errno)) {
        snprintf(tmp, n, "%s" KV_TMP_SUFFIX "%ld", path, (long)getpid());
        fd = open_named_temp(tmp);
        if (fd >= 0 && unlink(tmp) != 0) {
            st = kv_error_set(err, KV_ERR_INPUT, "%s: cannot remove %s: %s", path, tmp,
                              strerror(errno));
        }
    }
    if (fd < 0) {
        st = kv_error_set(err, KV_ERR_INPUT, "%s: cannot create: %s", path, strerror(errno));
        goto cleanup;
    }
    if (close(fd) != 0 && st == KV_OK) {
        st = kv_error_set(err, KV_ERR_INPUT, "%s: cannot create: %s", path, strerror(errno));
    }
cleanup:
    free(tmp);
    free(dir);
    return st;
}

/* kv_report_file_publish's bytes, for kv_report_file_publish_with. */
typedef struct {
    const void *data;
    size_t len;
} PublishBytes;

static int fill_bytes(int fd, void *ctx) {
    const PublishBytes *b = ctx;
    return write_all(fd, b->data, b->len);
}

KvStatus kv_report_file_publish(const char *path, const void *data, size_t len, KvError *err) {
    if (path == NULL || path[0] == '\0' || (data == NULL && len > 0)) {
        return kv_error_set(err, KV_ERR_INPUT,
                            "kv_report_file_publish: a non-empty path and the data are required");
    }
    PublishBytes b = {data, len};
    return kv_report_file_publish_with(path, fill_bytes, &b, err);
}

KvStatus kv_report_file_publish_with(const char *path, int (*fill)(int fd, void *ctx), void *ctx,
                                     KvError *err) {
    if (path == NULL || path[0] == '\0' || fill == NULL) {
        return kv_error_set(err, KV_ERR_INPUT, "kv_report_file_publish_with: a non-empty path "
                            "and a fill function are required");
    }
    KvStatus st = check_target(path, err);
    if (st != KV_OK) return st;
    int fd = -1;
    bool named = false; /* tmp exists and is ours to remove */
    const size_t n = strlen(path) + KV_TMP_EXTRA;
    char *dir = malloc(n), *tmp = malloc(n);
    if (dir == NULL || tmp == NULL) {
        st = kv_error_set(err, KV_ERR_INTERNAL, "%s: out of memory", path);
        goto cleanup;
    }
    path_dir(path, dir, n);
    snprintf(tmp, n, "%s" KV_TMP_SUFFIX "%ld", path, (long)getpid());
    remove_stale_temps(dir, path_base(path));

    /* Unnamed first: a writer killed while writing leaves nothing. */
    fd = open_unnamed(dir);
    bool unnamed = fd >= 0;
    if (fd < 0 && !tmpfile_unsupported(errno)) {
        st = kv_error_set(err, KV_ERR_INPUT, "%s: cannot create: %s", path, strerror(errno));
        goto cleanup;
    }
    for (int attempt = 0; attempt < 2; attempt++) {
        if (!unnamed) {
            fd = open_named_temp(tmp);
            if (fd < 0) {
                st = kv_error_set(err, KV_ERR_INPUT, "%s: cannot create: %s", path,
                                  strerror(errno));
                goto cleanup;
            }
            named = true;
        }
        /* Every failure from here on is the destination's (a full disk, a
         * quota, an I/O error): bad input, like an unwritable directory. */
        errno = 0;
        if (fill(fd, ctx) != 0 || sync_fd(fd) != 0) {
            if (errno == 0) errno = EIO; /* a fill that failed without saying why */
            st = kv_error_set(err, KV_ERR_INPUT, "%s: cannot write: %s", path, strerror(errno));
            goto cleanup;
        }
        if (!unnamed) break;
        if (unlink(tmp) != 0 && errno != ENOENT) {
            st = kv_error_set(err, KV_ERR_INPUT, "%s: cannot create: %s", path, strerror(errno));
            goto cleanup;
        }
        if (link_unnamed(fd, tmp) == 0) {
            named = true;
            break;
        }
        /* No /proc and no CAP_DAC_READ_SEARCH: write it again, named. */
        if (close(fd) != 0) {
            fd = -1;
            st = kv_error_set(err, KV_ERR_INPUT, "%s: cannot write: %s", path, strerror(errno));
            goto cleanup;
        }
        fd = -1;
        unnamed = false;
    }
    const int rc = close(fd);
    fd = -1;
    if (rc != 0) {
        st = kv_error_set(err, KV_ERR_INPUT, "%s: cannot write: %s", path, strerror(errno));
        goto cleanup;
    }
    if (rename(tmp, path) != 0) {
        /* e.g. path became a directory since the check */
        st = kv_error_set(err, KV_ERR_INPUT, "%s: cannot create: %s", path, strerror(errno));
        goto cleanup;
    }
    named = false;
    /* The rename itself reaches the disk with the directory; best effort,
     * as the file is complete under its name either way. */
    const int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        const int synced = fsync(dfd);
        if (close(dfd) != 0 || synced != 0) {
            /* best effort, see above */
        }
    }
cleanup:
    if (fd >= 0 && close(fd) != 0) {
        /* already failing: the first error is the one reported */
    }
    if (named && unlink(tmp) != 0 && errno != ENOENT && st == KV_OK) {
        st = kv_error_set(err, KV_ERR_INPUT, "%s: cannot remove %s: %s", path, tmp,
                          strerror(errno));
    }
    free(tmp);
    free(dir);
    return st;
}
