/* test_atomic_write.c: the "atomic_write" suite: a report file is the
 * previous one or the complete new one, whatever stops its writer
 * (docs/SCHEMA.md, "Writing and reading").
 *
 * Both writers (kv_report_write_h5, kv_junit_write) go through
 * kv_report_file_publish. Each test runs for both, on this file system
 * (unnamed files, O_TMPFILE) and as on one without them (open(O_TMPFILE)
 * refused, so the bytes go to "<path>.tmp-<pid>" directly). A previous
 * report is at the path; the writer is stopped while writing a new one:
 *   - faults: the write is recorded once as the system calls it makes
 *     (write_faults.h: the linker routes them through the test), then made
 *     again failing at each of those calls in turn (a short write followed
 *     by ENOSPC at the write, EIO at fsync, at the link, at the rename ...);
 *   - kills at each call: a child writer stops itself before, midway
 *     through (a write) or after each call; the parent looks at the
 *     directory while it is stopped, kills it with SIGKILL and looks again;
 *   - timed kills: a child writing a large report is killed with SIGKILL at
 *     moments spread over its whole run, and at delays after it starts
 *     writing the bytes, with nothing injected (where such a kill lands is
 *     up to the scheduler; the stops above are what reaches every call).
 * Each time: (a) the path holds the previous report byte for byte, or the
 * complete new one once the rename was made; (b) so no partial file has the
 * final name; (c) nothing else is in the directory, except exactly
 * "<path>.tmp-<pid>" after a kill between the moment the temporary got its
 * name and the rename, or when the failing call was that temporary's own
 * removal; the next write must remove it (checked every time). An error
 * names the path and is bad input (exit 2). The recorded calls must also
 * show the publish SCHEMA.md describes (the bytes to a file that is not the
 * path, fsync, rename over the path): a writer that writes the path in
 * place fails there, and (tried, with that check removed) the fault and
 * kill tests on their own. */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "junit.h"
#include "kv_limits.h"
#include "report.h"
#include "report_h5.h"
#include "write_faults.h"

/* The small report: (steps, batch, vocab), prompt length, probes. */
#define T_STEPS 3
#define T_BATCH 2
#define T_VOCAB 5
#define T_PLEN 4
#define T_PROBES 3
/* The large new report of the timed kills: the candidate's probe_hash
 * (steps, probes, batch) of uint64 is 8 MiB stored as it is (no filter),
 * and the failing comparisons make about 7 MiB of JUnit XML, so that each
 * writer's write and fsync take milliseconds. */
#define T_BIG_STEPS 128
#define T_BIG_PROBES 4096
#define T_BIG_COMPARISONS 6000
/* The timed kills: this many spread over a whole write, and these delays
 * (microseconds) after the child starts writing the bytes. */
#define T_SPREAD_KILLS 6
static const long k_write_delays_us[] = {0, 300, 1000, 3000, 10000};
/* A child writer that neither stops nor finishes by then is a failure. */
#define T_CHILD_SECONDS 30

/* ---- the writers ------------------------------------------------------------ */

typedef KvStatus (*WriteFn)(const KvReport *rep, const char *path, KvError *err);

typedef struct {
    const char *name;
    const char *file; /* the report's name in the scratch directory */
    WriteFn write;
} Writer;

static const Writer k_writers[] = {
    {"hdf5", "r.h5", kv_report_write_h5},
    {"junit", "r.xml", kv_junit_write},
};

/* Loop index i: writer i / 2; i % 2 == 1 is "a file system without
 * unnamed files". */
#define T_LOOPS 4

/* ---- scratch directory -------------------------------------------------------- */

static char g_dir[PATH_MAX];

static void remove_dir(const char *dir) {
    DIR *d = opendir(dir);
    if (d == NULL) return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        char p[PATH_MAX + 260];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        unlink(p);
    }
    closedir(d);
    rmdir(dir);
}

/* The child writer not yet reaped (0: none). A failed check exits the test
 * process (Check's fork mode) while a child may be stopped: it is killed
 * then, not left stopped. */
static pid_t g_child;

static void kill_child_at_exit(void) {
    if (g_child > 0) kill(g_child, SIGKILL);
}

static void setup(void) {
    g_child = 0;
    ck_assert(atexit(kill_child_at_exit) == 0);
    const char *tmp = getenv("TMPDIR");
    snprintf(g_dir, sizeof g_dir, "%s/kvrepro-test-atomic-XXXXXX",
             tmp != NULL && tmp[0] != '\0' ? tmp : "/tmp");
    ck_assert_msg(mkdtemp(g_dir) != NULL, "mkdtemp %s: %s", g_dir, strerror(errno));
}

static void teardown(void) {
    wf_disarm();
    wf_set_no_tmpfile(false);
    remove_dir(g_dir);
}

/* ---- reports ---------------------------------------------------------------------- */

static void *test_alloc(size_t n) {
    void *p = calloc(1, n > 0 ? n : 1);
    ck_assert_msg(p != NULL, "out of memory (%zu bytes)", n);
    return p;
}

/* A run of (steps, T_BATCH, T_VOCAB) with n_probes probes; salt varies every value. */
static void fill_run(KvRun *r, const char *variant, uint64_t salt, int64_t steps,
                     int64_t n_probes) {
    kv_run_init(r);
    snprintf(r->model, sizeof r->model, "fx-mistral");
    snprintf(r->scenario, sizeof r->scenario, "prompt_w");
    snprintf(r->variant, sizeof r->variant, "%s", variant);
    snprintf(r->backend, sizeof r->backend, "cpu");
    snprintf(r->mode, sizeof r->mode, "eager");
    r->steps = steps;
    r->batch = T_BATCH;
    r->vocab = T_VOCAB;
    r->prompt_len = T_PLEN;
    r->n_probes = n_probes;
    const size_t sb = (size_t)steps * T_BATCH;
    r->prompt = test_alloc(T_BATCH * T_PLEN * sizeof *r->prompt);           /* (B, P) */
    r->prompt_real = test_alloc(T_BATCH * T_PLEN * sizeof *r->prompt_real); /* (B, P) */
    for (int i = 0; i < T_BATCH * T_PLEN; i++) {
        r->prompt[i] = 100 + i;
        r->prompt_real[i] = 1;
    }
    r->tokens = test_alloc(sb * sizeof *r->tokens);                /* (S, B) */
    r->logits_hash = test_alloc(sb * sizeof *r->logits_hash);      /* (S, B) */
    r->margins = test_alloc(sb * sizeof *r->margins);              /* (S, B) */
    r->logits = test_alloc(sb * T_VOCAB * sizeof *r->logits);      /* (S, B, V) */
    for (size_t i = 0; i < sb; i++) {
        r->tokens[i] = (int32_t)((i + salt) % T_VOCAB);
        r->logits_hash[i] = 0xcbf29ce484222325ULL ^ (i + 31 * salt);
        r->margins[i] = 0.125f * (float)(i % 64 + 1);
    }
    for (size_t i = 0; i < sb * T_VOCAB; i++) r->logits[i] = 0.25f * (float)(i % 256 + salt);
    r->probe_names = test_alloc((size_t)n_probes * sizeof *r->probe_names);
    for (int64_t p = 0; p < n_probes; p++) {
        snprintf(r->probe_names[p], KV_NAME_LEN, "layer%lld.q", (long long)p);
    }
    const size_t nh = sb * (size_t)n_probes;
    r->probe_hash = test_alloc(nh * sizeof *r->probe_hash); /* (S, n_probes, B) */
    uint64_t x = 0x9e3779b97f4a7c15ULL * (salt + 1);
    for (size_t i = 0; i < nh; i++) { /* xorshift: nothing for a filter to shrink */
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        r->probe_hash[i] = x;
    }
}

/* Two runs (reference, ring) and their reference comparison; salt makes
 * the bytes differ (seeds, values, message). big: the candidate is large
 * (T_BIG_*) and there are T_BIG_COMPARISONS comparisons. */
static void build_report(KvReport *rep, uint64_t salt, bool big) {
    memset(rep, 0, sizeof *rep);
    snprintf(rep->tool_version, sizeof rep->tool_version, "0.1.0");
    snprintf(rep->git_commit, sizeof rep->git_commit, "0123456789ab");
    snprintf(rep->host, sizeof rep->host, "test-host");
    snprintf(rep->device, sizeof rep->device, "cpu only");
    snprintf(rep->math_mode, sizeof rep->math_mode, "fp32, -ffp-contract=off, no fast-math");
    snprintf(rep->shard, sizeof rep->shard, "1/1");
    rep->weight_seed = salt;
    rep->prompt_seed = 1000 + salt;
    rep->model_hash = 0x8000000000000000ULL | salt;
    rep->n_tolerances = 1;
    rep->tolerances = test_alloc(sizeof *rep->tolerances);
    snprintf(rep->tolerances[0].name, KV_NAME_LEN, "max_rel_err");
    rep->tolerances[0].value = 0.0001220703125;
    snprintf(rep->tolerances[0].reason, sizeof rep->tolerances[0].reason, "test tolerance");
    /* big: small repeats of the candidate carry the comparisons too, at
     * most KV_REPORT_MAX_COMPARISONS_PER_RUN each (a writer refuses what its
     * reader would) */
    const int64_t cands = big ? (T_BIG_COMPARISONS + KV_REPORT_MAX_COMPARISONS_PER_RUN - 1) /
                                    KV_REPORT_MAX_COMPARISONS_PER_RUN
                              : 1;
    rep->n_runs = 1 + cands;
    rep->runs = test_alloc((size_t)rep->n_runs * sizeof *rep->runs);
    fill_run(&rep->runs[0], "reference", salt, T_STEPS, T_PROBES);
    fill_run(&rep->runs[1], "ring", salt + 7, big ? T_BIG_STEPS : T_STEPS,
             big ? T_BIG_PROBES : T_PROBES);
    for (int64_t i = 2; i < rep->n_runs; i++) {
        fill_run(&rep->runs[i], "ring", salt + 7 + (uint64_t)i, T_STEPS, T_PROBES);
        rep->runs[i].repeat = (int32_t)(i - 1);
    }
    rep->n_comparisons = big ? T_BIG_COMPARISONS : 1;
    rep->comparisons = test_alloc((size_t)rep->n_comparisons * sizeof *rep->comparisons);
    for (int64_t c = 0; c < rep->n_comparisons; c++) {
        KvComparison *cmp = &rep->comparisons[c];
        cmp->kind = KV_CMP_REFERENCE;
        cmp->run_a = 0;
        cmp->run_b = 1 + c % cands;
        cmp->verdict = KV_VERDICT_FAIL;
        snprintf(cmp->message, sizeof cmp->message,
                 "comparison %lld of report %llu: max_rel_err 0.0625 > 0.000122 at step 1 row 0, "
                 "probe layer0.k; a long message, as a real one can be, so that the file is "
                 "large: 0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
                 "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
                 (long long)c, (unsigned long long)salt);
        cmp->first_step = 1;
        cmp->first_row = 0;
        cmp->first_probe = 2;
        cmp->max_abs_err = 0.125;
        cmp->max_rel_err = 0.0625;
        cmp->top1_agreement = 0.75;
    }
}

/* ---- files -------------------------------------------------------------------- */

typedef struct {
    unsigned char *p; /* NULL: no such file */
    size_t n;
} Bytes;

static Bytes slurp(const char *path) {
    Bytes b = {NULL, 0};
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        ck_assert_msg(errno == ENOENT, "open %s: %s", path, strerror(errno));
        return b;
    }
    ck_assert(fseek(f, 0, SEEK_END) == 0);
    const long len = ftell(f);
    ck_assert(len >= 0 && fseek(f, 0, SEEK_SET) == 0);
    b.p = test_alloc((size_t)len);
    b.n = (size_t)len;
    ck_assert_msg(fread(b.p, 1, b.n, f) == b.n, "read %s", path);
    fclose(f);
    return b;
}

static bool same_bytes(const Bytes *a, const Bytes *b) {
    return a->p != NULL && b->p != NULL && a->n == b->n && memcmp(a->p, b->p, a->n) == 0;
}

/* ---- one test's reports at one path ---------------------------------------------- */

/* Two previous reports, A and B, take turns at the path (each write that
 * checks the cleanup after a stopped writer replaces one by the other), and
 * the new one is the report being written when the writer is stopped. */
enum { PREV_A = 0, NEW = 1, PREV_B = 2 };
static const char *const k_which[] = {"previous report A", "new report", "previous report B"};

typedef struct {
    const Writer *w;
    bool no_tmpfile;
    char label[64];       /* "hdf5 (O_TMPFILE)" */
    char path[PATH_MAX];  /* the report's path */
    KvReport rep[3];      /* PREV_A, NEW, PREV_B */
    Bytes bytes[3];       /* what each writes, complete */
    int cur;              /* the previous report now at the path: PREV_A or PREV_B */
} Case;

/* Writes report `which` at the path, unarmed; it must succeed. */
static void case_write(Case *k, int which) {
    KvError err = {{0}};
    const KvStatus st = k->w->write(&k->rep[which], k->path, &err);
    ck_assert_msg(st == KV_OK, "%s: writing the %s report: status %d: %s", k->label,
                  k_which[which], st, err.msg);
}

/* Names what the path holds: one of the reports, nothing, or other bytes
 * (a partial or damaged file). */
static void describe(const Case *k, const Bytes *b, char *buf, size_t n) {
    if (b->p == NULL) {
        snprintf(buf, n, "no file");
        return;
    }
    for (int i = 0; i < 3; i++) {
        if (same_bytes(b, &k->bytes[i])) {
            snprintf(buf, n, "the %s", k_which[i]);
            return;
        }
    }
    snprintf(buf, n, "%zu bytes that are none of the reports (the previous has %zu, the new %zu): "
             "a partial or damaged file", b->n, k->bytes[k->cur].n, k->bytes[NEW].n);
}

/* The path holds one of the reports in the mask any_of (bit i: report i),
 * byte for byte, and the directory holds nothing else but leftover (a
 * name, or NULL). */
static void assert_state_mask(const Case *k, unsigned any_of, const char *leftover,
                              const char *when) {
    Bytes b = slurp(k->path);
    bool ok = false;
    for (int i = 0; i < 3; i++) ok = ok || ((any_of >> i & 1u) && same_bytes(&b, &k->bytes[i]));
    if (!ok) {
        char have[300], want[128] = "";
        describe(k, &b, have, sizeof have);
        for (int i = 0; i < 3; i++) {
            if ((any_of >> i & 1u) == 0) continue;
            const size_t used = strlen(want);
            snprintf(want + used, sizeof want - used, "%sthe %s", used > 0 ? " or " : "",
                     k_which[i]);
        }
        ck_abort_msg("%s: %s: %s holds %s, expected %s, complete and intact", k->label, when,
                     k->path, have, want);
    }
    free(b.p);
    DIR *d = opendir(g_dir);
    ck_assert_msg(d != NULL, "opendir %s: %s", g_dir, strerror(errno));
    bool seen_leftover = false;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0 ||
            strcmp(e->d_name, k->w->file) == 0) {
            continue;
        }
        if (leftover != NULL && strcmp(e->d_name, leftover) == 0) {
            seen_leftover = true;
            continue;
        }
        char name[300];
        snprintf(name, sizeof name, "%s", e->d_name);
        closedir(d);
        ck_abort_msg("%s: %s: %s left in %s (expected only %s%s%s)", k->label, when, name, g_dir,
                     k->w->file, leftover != NULL ? " and " : "", leftover != NULL ? leftover : "");
    }
    closedir(d);
    ck_assert_msg(leftover == NULL || seen_leftover,
                  "%s: %s: expected the stopped writer's named temporary %s, found none",
                  k->label, when, leftover);
}

static void assert_state(const Case *k, int which, const char *leftover, const char *when) {
    assert_state_mask(k, 1u << which, leftover, when);
}

/* Sets up loop _i's case: the writer, the file system kind, three reports
 * (their complete bytes taken from writes of each) and the previous report
 * at the path. big: the new report (the one killed) is large. */
static void case_init(Case *k, int i, bool big) {
    memset(k, 0, sizeof *k);
    k->w = &k_writers[i / 2];
    k->no_tmpfile = i % 2 == 1;
    wf_set_no_tmpfile(k->no_tmpfile);
    snprintf(k->label, sizeof k->label, "%s (%s)", k->w->name,
             k->no_tmpfile ? "no unnamed files" : "O_TMPFILE");
    const int w = snprintf(k->path, sizeof k->path, "%s/%s", g_dir, k->w->file);
    ck_assert(w > 0 && (size_t)w < sizeof k->path);
    for (int r = 0; r < 3; r++) {
        build_report(&k->rep[r], (uint64_t)(r + 1), big && r == NEW);
        case_write(k, r);
        k->bytes[r] = slurp(k->path);
        ck_assert_msg(k->bytes[r].p != NULL && k->bytes[r].n > 0, "%s: empty report", k->label);
        for (int q = 0; q < r; q++) {
            ck_assert_msg(!same_bytes(&k->bytes[q], &k->bytes[r]),
                          "%s: the %s and %s reports have the same bytes", k->label, k_which[q],
                          k_which[r]);
        }
    }
    k->cur = PREV_A;
    case_write(k, k->cur);
    assert_state(k, k->cur, NULL, "set up");
}

static void case_free(Case *k) {
    for (int r = 0; r < 3; r++) {
        kv_report_free(&k->rep[r]);
        free(k->bytes[r].p);
    }
    wf_set_no_tmpfile(false);
}

/* ---- the recorded write -------------------------------------------------------- */

typedef struct {
    WfCall calls[WF_MAX_CALLS];
    int n;
    char tmp[PATH_MAX + 32]; /* "<path>.tmp-<pid>" of the recording process */
    /* indices: the write of the whole file, its fsync, the link naming it
     * (-1 without unnamed files), the rename over the path */
    int write, fsync, link, rename;
} Trace;

static void trace_text(const Trace *t, char *buf, size_t n) {
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; i < t->n && used + 1 < n; i++) {
        char one[2 * WF_PATH_MAX + 64];
        wf_call_text(&t->calls[i], one, sizeof one);
        used += (size_t)snprintf(buf + used, n - used, "\n  %2d %s", i, one);
    }
}

/* The first successful call of op at or after index from that match
 * accepts (NULL: any); -1 when none. */
static int find_call(const Trace *t, int from, WfOp op, bool (*match)(const WfCall *, const void *),
                     const void *arg) {
    for (int i = from < 0 ? 0 : from; i < t->n; i++) {
        const WfCall *c = &t->calls[i];
        if (c->op == op && c->result >= 0 && (match == NULL || match(c, arg))) {
            return i;
        }
    }
    return -1;
}

static bool call_fd_is(const WfCall *c, const void *arg) { return c->fd == *(const int *)arg; }
static bool call_len_is(const WfCall *c, const void *arg) { return c->len == *(const size_t *)arg; }
static bool call_path2_is(const WfCall *c, const void *arg) {
    return strcmp(c->path2, (const char *)arg) == 0;
}
static bool call_path_is(const WfCall *c, const void *arg) {
    return strcmp(c->path, (const char *)arg) == 0;
}

/* Writes the new report recorded (it must succeed and leave only the new
 * report), checks that the calls are the publish docs/SCHEMA.md describes,
 * and puts the previous report back. */
static void case_record(Case *k, Trace *t) {
    memset(t, 0, sizeof *t);
    wf_arm(-1, WF_RECORD, 0, -1);
    KvError err = {{0}};
    const KvStatus st = k->w->write(&k->rep[NEW], k->path, &err);
    wf_disarm();
    ck_assert_msg(st == KV_OK, "%s: recorded write: %s", k->label, err.msg);
    ck_assert_msg(!wf_overflow(), "%s: more than %d calls recorded", k->label, WF_MAX_CALLS);
    const WfCall *calls = wf_trace(&t->n);
    memcpy(t->calls, calls, (size_t)t->n * sizeof *calls);
    assert_state(k, NEW, NULL, "after an undisturbed write");
    snprintf(t->tmp, sizeof t->tmp, "%s.tmp-%ld", k->path, (long)getpid());

    char text[8192];
    trace_text(t, text, sizeof text);
    /* the whole file in one write, to a descriptor from an open ... */
    t->write = find_call(t, 0, WF_WRITE, call_len_is, &k->bytes[NEW].n);
    ck_assert_msg(t->write >= 0, "%s: no write() of the whole report (%zu bytes) among:%s",
                  k->label, k->bytes[NEW].n, text);
    const int fd = t->calls[t->write].fd;
    int open_at = -1;
    for (int i = 0; i < t->write; i++) {
        const WfOp op = t->calls[i].op;
        if ((op == WF_OPEN || op == WF_OPEN_TMP) && t->calls[i].fd == fd) open_at = i;
    }
    ck_assert_msg(open_at >= 0, "%s: the report's bytes go to descriptor %d, opened nowhere:%s",
                  k->label, fd, text);
    const WfCall *o = &t->calls[open_at];
    /* ... that is not the path itself: a writer writing in place fails here */
    ck_assert_msg(!(o->op == WF_OPEN && strcmp(o->path, k->path) == 0),
                  "%s: the report is written in place (open(%s) then write): a writer stopped "
                  "midway leaves a partial report under the final name:%s",
                  k->label, k->path, text);
    if (k->no_tmpfile) {
        ck_assert_msg(o->op == WF_OPEN && strcmp(o->path, t->tmp) == 0,
                      "%s: expected the bytes written to %s, found them going to %s:%s", k->label,
                      t->tmp, o->path, text);
    } else {
        ck_assert_msg(o->op == WF_OPEN_TMP,
                      "%s: expected the bytes written to an unnamed file (O_TMPFILE), found %s:%s",
                      k->label, o->path, text);
    }
    /* fsync'ed before it is named or renamed */
    t->fsync = find_call(t, t->write + 1, WF_FSYNC, call_fd_is, &fd);
    ck_assert_msg(t->fsync >= 0, "%s: the report's descriptor %d is never fsync'ed:%s", k->label,
                  fd, text);
    t->link = -1;
    if (!k->no_tmpfile) {
        t->link = find_call(t, t->fsync + 1, WF_LINKAT, call_path2_is, t->tmp);
        ck_assert_msg(t->link >= 0, "%s: the unnamed file is never linked as %s after its fsync:%s",
                      k->label, t->tmp, text);
    }
    t->rename = find_call(t, (t->link >= 0 ? t->link : t->fsync) + 1, WF_RENAME, call_path_is,
                          t->tmp);
    ck_assert_msg(t->rename >= 0 && strcmp(t->calls[t->rename].path2, k->path) == 0,
                  "%s: %s is never renamed over %s after its fsync:%s", k->label, t->tmp, k->path,
                  text);
    case_write(k, k->cur);
    assert_state(k, k->cur, NULL, "the previous report put back");
}

/* "<path>.tmp-DIGITS" (any writer's temporary of this path). */
static bool is_temp_of(const char *name, const char *path) {
    const size_t n = strlen(path);
    if (strncmp(name, path, n) != 0 || strncmp(name + n, ".tmp-", 5) != 0) return false;
    const char *d = name + n + 5;
    if (*d == '\0') return false;
    for (; *d != '\0'; d++) {
        if (*d < '0' || *d > '9') return false;
    }
    return true;
}

/* Whether, after the first `done` calls of t (made by any process), a
 * temporary of the path has a name, and whether the path was replaced. */
static void simulate(const Trace *t, int done, const char *path, const char *base, bool *named,
                     bool *replaced) {
    *named = false;
    *replaced = false;
    for (int i = 0; i < done && i < t->n; i++) {
        const WfCall *c = &t->calls[i];
        if (c->result < 0) continue;
        switch (c->op) {
        case WF_OPEN:
            if ((c->flags & O_CREAT) != 0 && is_temp_of(c->path, path)) *named = true;
            break;
        case WF_LINKAT:
            if (is_temp_of(c->path2, path)) *named = true;
            break;
        case WF_UNLINK:
            if (is_temp_of(c->path, path)) *named = false;
            break;
        case WF_UNLINKAT: /* relative to the directory */
            if (is_temp_of(c->path, base)) *named = false;
            break;
        case WF_RENAME:
            if (is_temp_of(c->path, path)) *named = false;
            if (strcmp(c->path2, path) == 0) *replaced = true;
            break;
        default:
            break;
        }
    }
}

static const char *action_name(WfAction a) {
    switch (a) {
    case WF_FAIL: return "failing";
    case WF_SHORT_FAIL: return "a short write then ENOSPC";
    case WF_STOP_BEFORE: return "killed before";
    case WF_STOP_MID: return "killed midway through";
    case WF_STOP_AFTER: return "killed after";
    default: return "?";
    }
}

/* The errno a failing call gets: what a full disk, a read-only directory
 * or a failing disk give. */
static int fault_errno(WfOp op) {
    switch (op) {
    case WF_OPEN:
    case WF_OPEN_TMP: return EACCES;
    case WF_WRITE: return ENOSPC;
    case WF_LINKAT: return EDQUOT;
    default: return EIO;
    }
}

/* The next write after a kill (or a failed removal) succeeds and removes
 * what the stopped writer left. It writes the other previous report, which
 * is then the one at the path. */
static void next_write_cleans(Case *k, const char *when) {
    char next[3 * WF_PATH_MAX + 64];
    snprintf(next, sizeof next, "the next write after %s", when);
    k->cur = k->cur == PREV_A ? PREV_B : PREV_A;
    case_write(k, k->cur);
    assert_state(k, k->cur, NULL, next);
}

/* ---- faults at every call ------------------------------------------------------- */

/* Each call of the write fails in turn (and each write also after a short
 * write). A write that returns success must have left the new report
 * complete; one that fails, the previous report intact, with an error
 * naming the path; and either way nothing else. A failing write of the
 * bytes, fsync or rename must fail the write. */
START_TEST(test_fault_at_every_call) {
    Case k;
    case_init(&k, _i, false);
    Trace t;
    case_record(&k, &t);
    char text[8192];
    trace_text(&t, text, sizeof text);
    int must_fail = 0;
    for (int at = 0; at < t.n; at++) {
        for (int a = 0; a < 2; a++) {
            const WfAction action = a == 0 ? WF_FAIL : WF_SHORT_FAIL;
            if (action == WF_SHORT_FAIL && t.calls[at].op != WF_WRITE) continue;
            char call[2 * WF_PATH_MAX + 64], when[3 * WF_PATH_MAX];
            wf_call_text(&t.calls[at], call, sizeof call);
            snprintf(when, sizeof when, "%s at call %d, %s", action_name(action), at, call);
            wf_arm(at, action, fault_errno(t.calls[at].op), -1);
            KvError err = {{0}};
            const KvStatus st = k.w->write(&k.rep[NEW], k.path, &err);
            wf_disarm();
            ck_assert_msg(wf_fired(), "%s: %s: the write did not make that call again:%s", k.label,
                          when, text);
            if (at == t.write || at == t.fsync || at == t.rename) {
                ck_assert_msg(st != KV_OK, "%s: %s: the write reported success", k.label, when);
                must_fail++;
            }
            /* A temporary whose own removal was the failing call keeps its
             * name (nothing else could remove it): it must be this
             * process's, and the next write must remove it. Any other
             * temporary left is a writer that did not clean up. */
            Trace inj;
            const WfCall *calls = wf_trace(&inj.n);
            memcpy(inj.calls, calls, (size_t)inj.n * sizeof *calls);
            bool named, replaced;
            simulate(&inj, inj.n, k.path, k.w->file, &named, &replaced);
            const WfOp op = t.calls[at].op;
            const bool removal_failed =
                (op == WF_UNLINK && is_temp_of(t.calls[at].path, k.path)) ||
                (op == WF_UNLINKAT && is_temp_of(t.calls[at].path, k.w->file));
            char leftover[300];
            snprintf(leftover, sizeof leftover, "%s.tmp-%ld", k.w->file, (long)getpid());
            const char *left = named && removal_failed ? leftover : NULL;
            if (st == KV_OK) {
                assert_state(&k, NEW, left, when);
                if (left != NULL) next_write_cleans(&k, when);
                else case_write(&k, k.cur);
                continue;
            }
            ck_assert_msg(st == KV_ERR_INPUT,
                          "%s: %s: expected bad input (exit 2), found status %d: %s", k.label,
                          when, st, err.msg);
            char want[PATH_MAX + 16];
            snprintf(want, sizeof want, "%s: cannot ", k.path);
            ck_assert_msg(strncmp(err.msg, want, strlen(want)) == 0,
                          "%s: %s: expected a message starting '%s', found '%s'", k.label, when,
                          want, err.msg);
            assert_state(&k, k.cur, left, when);
            if (left != NULL) next_write_cleans(&k, when);
        }
    }
    ck_assert_int_eq(must_fail, 4); /* the write twice, the fsync, the rename */
    case_free(&k);
}
END_TEST

/* ---- kills at every call -------------------------------------------------------- */

/* Forks a writer of the new report armed with action at call `at`; returns
 * its pid with the read end of its pipe in *rd. */
static pid_t spawn_writer(const Case *k, int at, WfAction action, int *rd) {
    int fds[2];
    ck_assert_msg(pipe(fds) == 0, "pipe: %s", strerror(errno));
    const pid_t pid = fork();
    ck_assert_msg(pid >= 0, "fork: %s", strerror(errno));
    if (pid == 0) {
        close(fds[0]);
        alarm(T_CHILD_SECONDS);
        if (at >= 0) wf_arm(at, action, 0, fds[1]);
        KvError err = {{0}};
        const KvStatus st = k->w->write(&k->rep[NEW], k->path, &err);
        _exit(st == KV_OK ? 0 : 10 + (int)st);
    }
    close(fds[1]);
    *rd = fds[0];
    g_child = pid;
    return pid;
}

/* Waits for the child to end (reaps it); its wait status. */
static int reap(pid_t pid) {
    int status = 0;
    ck_assert(waitpid(pid, &status, 0) == pid);
    g_child = 0;
    return status;
}

/* The writer stops itself before, midway through (a write) or after each
 * call in turn; the parent checks the directory while it is stopped, kills
 * it with SIGKILL, checks again, and checks that the next write cleans up. */
START_TEST(test_kill_at_every_call) {
    Case k;
    case_init(&k, _i, false);
    Trace t;
    case_record(&k, &t);
    int with_temp = 0, without = 0;
    for (int at = 0; at < t.n; at++) {
        for (int a = 0; a < 3; a++) {
            const WfAction action = a == 0 ? WF_STOP_BEFORE : a == 1 ? WF_STOP_MID : WF_STOP_AFTER;
            if (action == WF_STOP_MID && t.calls[at].op != WF_WRITE) continue;
            char call[2 * WF_PATH_MAX + 64], when[3 * WF_PATH_MAX];
            wf_call_text(&t.calls[at], call, sizeof call);
            snprintf(when, sizeof when, "%s call %d, %s", action_name(action), at, call);
            int rd = -1;
            const pid_t pid = spawn_writer(&k, at, action, &rd);
            int status = 0;
            ck_assert(waitpid(pid, &status, WUNTRACED) == pid);
            ck_assert_msg(WIFSTOPPED(status), "%s: %s: the writer did not get there (status 0x%x)",
                          k.label, when, (unsigned)status);
            unsigned char op = 0xff;
            ck_assert_msg(read(rd, &op, 1) == 1 && op == (unsigned char)t.calls[at].op,
                          "%s: %s: the writer stopped at %s instead", k.label, when,
                          wf_op_name((WfOp)op));
            close(rd);
            bool named, replaced;
            simulate(&t, at + (action == WF_STOP_AFTER), k.path, k.w->file, &named, &replaced);
            char leftover[300];
            snprintf(leftover, sizeof leftover, "%s.tmp-%ld", k.w->file, (long)pid);
            char stopped[3 * WF_PATH_MAX + 32];
            snprintf(stopped, sizeof stopped, "stopped, %s", when);
            assert_state(&k, replaced ? NEW : k.cur, named ? leftover : NULL, stopped);
            ck_assert(kill(pid, SIGKILL) == 0);
            status = reap(pid);
            ck_assert_msg(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL,
                          "%s: %s: status 0x%x", k.label, when, (unsigned)status);
            assert_state(&k, replaced ? NEW : k.cur, named ? leftover : NULL, when);
            if (named) with_temp++;
            else without++;
            next_write_cleans(&k, when);
        }
    }
    /* both kinds were met: a kill that must leave nothing, and one between
     * the naming and the rename whose temporary the next write removed */
    ck_assert_msg(with_temp > 0 && without > 0, "%s: %d kills left a temporary, %d none",
                  k.label, with_temp, without);
    case_free(&k);
}
END_TEST

/* ---- timed kills ------------------------------------------------------------------ */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void sleep_s(double s) {
    if (s <= 0) return;
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* Kills the child pid with SIGKILL and checks what it left: the previous
 * report, or the complete new one when it finished (or got past the rename)
 * first; nothing else but its own temporary. Returns whether the kill
 * found it running. */
static bool kill_and_check(Case *k, pid_t pid, const char *when) {
    kill(pid, SIGKILL);
    const int status = reap(pid);
    char leftover[300];
    snprintf(leftover, sizeof leftover, "%s.tmp-%ld", k->w->file, (long)pid);
    char tmp[PATH_MAX + 300];
    snprintf(tmp, sizeof tmp, "%s/%s", g_dir, leftover);
    struct stat sb;
    const bool named = lstat(tmp, &sb) == 0;
    if (WIFEXITED(status)) {
        ck_assert_msg(WEXITSTATUS(status) == 0, "%s: %s: the writer failed (exit %d)", k->label,
                      when, WEXITSTATUS(status));
        assert_state(k, NEW, NULL, when);
    } else {
        ck_assert_msg(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL, "%s: %s: status 0x%x",
                      k->label, when, (unsigned)status);
        assert_state_mask(k, 1u << k->cur | 1u << NEW, named ? leftover : NULL, when);
    }
    next_write_cleans(k, when);
    return WIFSIGNALED(status);
}

/* A large report's writer killed with SIGKILL, nothing injected: at
 * T_SPREAD_KILLS moments spread over the time a whole write takes, and at
 * k_write_delays_us after it starts writing the bytes (it says so through
 * the pipe when it reaches the write; WF_NOTIFY only tells). */
START_TEST(test_kill_timed) {
    Case k;
    case_init(&k, _i, true);
    Trace t;
    case_record(&k, &t);
    /* how long a whole write takes in a child */
    double whole = 0.0;
    for (int r = 0; r < 2; r++) {
        int rd = -1;
        const double t0 = now_s();
        const pid_t pid = spawn_writer(&k, -1, WF_RECORD, &rd);
        const int status = reap(pid);
        const double dt = now_s() - t0;
        close(rd);
        ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "%s: status 0x%x", k.label,
                      (unsigned)status);
        whole = dt > whole ? dt : whole;
        assert_state(&k, NEW, NULL, "an undisturbed write in a child");
        case_write(&k, k.cur);
    }
    char when[256];
    for (int j = 0; j < T_SPREAD_KILLS; j++) {
        const double at = whole * (j + 0.5) / T_SPREAD_KILLS;
        snprintf(when, sizeof when, "killed %.1f ms into a %.1f ms write", 1e3 * at, 1e3 * whole);
        int rd = -1;
        const pid_t pid = spawn_writer(&k, -1, WF_RECORD, &rd);
        sleep_s(at);
        kill_and_check(&k, pid, when);
        close(rd);
    }
    int killed_writing = 0;
    const int n_delays = (int)(sizeof k_write_delays_us / sizeof k_write_delays_us[0]);
    for (int j = 0; j < n_delays; j++) {
        snprintf(when, sizeof when, "killed %ld us after it started writing %zu bytes",
                 k_write_delays_us[j], k.bytes[NEW].n);
        int rd = -1;
        const pid_t pid = spawn_writer(&k, t.write, WF_NOTIFY, &rd);
        unsigned char op = 0xff;
        ck_assert_msg(read(rd, &op, 1) == 1 && op == WF_WRITE,
                      "%s: %s: the writer never reached its write", k.label, when);
        sleep_s(1e-6 * (double)k_write_delays_us[j]);
        killed_writing += kill_and_check(&k, pid, when);
        close(rd);
    }
    /* at least one kill must have found the writer between its write and
     * its exit, or this part tested nothing */
    ck_assert_msg(killed_writing > 0, "%s: every writer finished before its kill", k.label);
    case_free(&k);
}
END_TEST

static Suite *atomic_suite(void) {
    Suite *s = suite_create("atomic_write");
    TCase *faults = tcase_create("faults");
    tcase_add_checked_fixture(faults, setup, teardown);
    tcase_set_timeout(faults, 60);
    tcase_add_loop_test(faults, test_fault_at_every_call, 0, T_LOOPS);
    suite_add_tcase(s, faults);
    TCase *kills = tcase_create("kills");
    tcase_add_checked_fixture(kills, setup, teardown);
    tcase_set_timeout(kills, 60);
    tcase_add_loop_test(kills, test_kill_at_every_call, 0, T_LOOPS);
    tcase_add_loop_test(kills, test_kill_timed, 0, T_LOOPS);
    suite_add_tcase(s, kills);
    return s;
}

int main(void) {
    SRunner *sr = srunner_create(atomic_suite());
    srunner_run_all(sr, CK_NORMAL);
    const int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
