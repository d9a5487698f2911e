/* test_junit.c: the "junit" suite: JUnit XML from a report (reports/junit.h).
 *
 * A synthetic KvReport (one model, two scenarios, a reference run, a passing
 * and a failing candidate, a skipped run, a run whose one comparison was
 * skipped, comparisons of every kind) is written and the file is read back
 * as text. A test case is a run, as the console counts them. Expected
 * counts are stated by hand from the report built here, are recounted from
 * the elements in the file (so a writer whose attributes disagree with its
 * own testcases fails even when the hand count happens to match), and are
 * compared with the console's count line (kv_report_print_counts) for this
 * report and for variants of it.
 *
 * Bytes: two writes of one report are identical, but the times are the
 * runs' measured wall times, which differ from gate to gate; so the file is
 * pinned with its time attributes normalised (test_times_only_differ): two
 * reports that differ only in their runs' seconds give files equal but for
 * time="...", and those carry the seconds. Well-formedness is checked
 * by xmllint when it is installed (and said to be SKIPPED when not) and always
 * by the small checker below, which is itself shown to reject bad input.
 * Writing shares kv_report_file_publish with the HDF5 report: a "full disk"
 * (RLIMIT_FSIZE in a child: write() fails the way ENOSPC makes it fail), a
 * FIFO in the way, and temporaries left by dead writers are checked here
 * too. */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "junit.h"
#include "report.h"

/* ---- scratch directory --------------------------------------------------- */

static char g_dir[64];

static void dir_setup(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/kvjunit-XXXXXX");
    ck_assert_msg(mkdtemp(g_dir) != NULL, "mkdtemp: %s", strerror(errno));
}

/* The directory is flat except for the one subdirectory a test makes. */
static void dir_remove(const char *dir) {
    DIR *d = opendir(dir);
    if (d == NULL) return;
    struct dirent *e;
    char p[512];
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        if (remove(p) != 0) dir_remove(p);
    }
    closedir(d);
    rmdir(dir);
}

static void dir_teardown(void) { dir_remove(g_dir); }

static void path_in_dir(char *out, size_t size, const char *name) {
    int n = snprintf(out, size, "%s/%s", g_dir, name);
    ck_assert(n > 0 && (size_t)n < size);
}

static int path_exists(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0;
}

static int dir_entry_count(const char *dir) {
    DIR *d = opendir(dir);
    ck_assert_msg(d != NULL, "%s: %s", dir, strerror(errno));
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) n++;
    }
    closedir(d);
    return n;
}

/* The whole file, NUL-terminated; fails the test on an embedded NUL. */
static char *read_text(const char *p, size_t *len_out) {
    FILE *f = fopen(p, "rb");
    ck_assert_msg(f != NULL, "%s: %s", p, strerror(errno));
    ck_assert(fseek(f, 0, SEEK_END) == 0);
    long sz = ftell(f);
    ck_assert(sz >= 0);
    rewind(f);
    char *s = malloc((size_t)sz + 1);
    ck_assert(s != NULL);
    ck_assert(fread(s, 1, (size_t)sz, f) == (size_t)sz);
    fclose(f);
    s[sz] = '\0';
    ck_assert_msg(strlen(s) == (size_t)sz, "%s: NUL byte at offset %zu", p, strlen(s));
    if (len_out != NULL) *len_out = (size_t)sz;
    return s;
}

/* ---- the synthetic report -------------------------------------------------- */

#define MSG_NASTY "step 3 row 1: token 5 <> 7 & \"logit\" 'x'\nsecond line"
#define MSG_NASTY_ATTR                                                                             \
    "step 3 row 1: token 5 &lt;&gt; 7 &amp; &quot;logit&quot; &apos;x&apos;&#10;second line"
#define MSG_NASTY_TEXT "step 3 row 1: token 5 &lt;&gt; 7 &amp; &quot;logit&quot; &apos;x&apos;\nsecond line"
/* a C0 control, invalid UTF-8, a tab, a CR and valid non-ASCII (U+0394) */
#define SKIP_NASTY "no CUDA device\x01\xff\tcr\r \xce\x94"
#define SKIP_NASTY_ATTR "no CUDA device\\x01\\xFF&#9;cr&#13; \xce\x94"

static void set_str(char *dst, size_t size, const char *src) {
    size_t n = strlen(src);
    ck_assert_msg(n < size, "test string too long: %s", src);
    memcpy(dst, src, n + 1);
}

#define SET(field, src) set_str((field), sizeof(field), (src))

static void set_run(KvRun *r, const char *scenario, const char *variant, const char *backend,
                    const char *mode, int repeat, double seconds) {
    SET(r->model, "tiny");
    SET(r->scenario, scenario);
    SET(r->variant, variant);
    SET(r->backend, backend);
    SET(r->mode, mode);
    r->repeat = repeat;
    r->seconds = seconds;
    r->replay_mismatch_step = -1;
}

static void set_cmp(KvComparison *c, KvCompareKind kind, int64_t a, int64_t b, KvVerdict v, const char *msg) {
    c->kind = kind;
    c->run_a = a;
    c->run_b = b;
    c->verdict = v;
    SET(c->message, msg);
    c->first_step = c->first_row = c->first_probe = -1;
}

/* Runs (model "tiny"):
 *   0 short reference/cpu/eager r0      pass
 *   1 short ring/cpu/eager r0           pass
 *   2 short roll/cpu/eager r0           FAIL (comparisons 1 and 2)
 *   3 short ring/cuda/graph r0          skipped (not run)
 *   4 long  reference/cpu/eager r0      pass
 *   5 long  ring/cpu/eager r0           pass
 *   6 long  ring/cpu/eager r1           pass
 *   7 long  ring/cpu/graph r0           pass
 *   8 long  ring/cuda/eager r0          skipped (ran; its one comparison skipped)
 * Comparisons:
 *   0 reference 0->1 PASS   1 reference 0->2 FAIL   2 variant 1->2 FAIL
 *   3 graph 1->3 SKIP       4 reference 4->5 PASS   5 repeat 5->6 PASS
 *   6 graph 5->7 PASS       7 replay 7->7 PASS      8 reference 4->8 SKIP
 * so short: 4 tests, 1 failure, 1 skipped; long: 5, 0, 1; as the console
 * counts them: "6 passed, 1 failed, 2 skipped". */
#define CMP_SKIP_MSG "no logits to compare: the run stored none"
enum { N_RUNS = 9, N_CMPS = 9 };

static KvReport *make_report(void) {
    KvReport *rep = calloc(1, sizeof *rep);
    ck_assert(rep != NULL);
    SET(rep->tool_version, "0.1.0");
    SET(rep->git_commit, "0123456789ab");
    SET(rep->host, "ci-host");
    SET(rep->device, "cpu only");
    SET(rep->math_mode, "fp32, no TF32, -ffp-contract=off");
    rep->weight_seed = 1234;
    rep->prompt_seed = 5678;
    rep->model_hash = 0xdeadbeefULL;
    SET(rep->shard, "1/1");
    rep->n_tolerances = 1;
    rep->tolerances = calloc(1, sizeof *rep->tolerances);
    ck_assert(rep->tolerances != NULL);
    SET(rep->tolerances[0].name, "logits_max_abs");
    rep->tolerances[0].value = 1e-4;
    SET(rep->tolerances[0].reason, "fp32 reassociation across cache layouts");

    rep->n_runs = N_RUNS;
    rep->runs = calloc(N_RUNS, sizeof *rep->runs);
    ck_assert(rep->runs != NULL);
    set_run(&rep->runs[0], "short", "reference", "cpu", "eager", 0, 0.5);
    set_run(&rep->runs[1], "short", "ring", "cpu", "eager", 0, 0.25);
    set_run(&rep->runs[2], "short", "roll", "cpu", "eager", 0, 1.0);
    set_run(&rep->runs[3], "short", "ring", "cuda", "graph", 0, 0.0);
    rep->runs[3].skipped = true;
    SET(rep->runs[3].skip_reason, SKIP_NASTY);
    set_run(&rep->runs[4], "long", "reference", "cpu", "eager", 0, 2.0);
    set_run(&rep->runs[5], "long", "ring", "cpu", "eager", 0, 1.5);
    set_run(&rep->runs[6], "long", "ring", "cpu", "eager", 1, 1.5);
    set_run(&rep->runs[7], "long", "ring", "cpu", "graph", 0, 0.125);
    set_run(&rep->runs[8], "long", "ring", "cuda", "eager", 0, 0.25);

    rep->n_comparisons = N_CMPS;
    rep->comparisons = calloc(N_CMPS, sizeof *rep->comparisons);
    ck_assert(rep->comparisons != NULL);
    KvComparison *c = rep->comparisons;
    set_cmp(&c[0], KV_CMP_REFERENCE, 0, 1, KV_VERDICT_PASS, "");
    set_cmp(&c[1], KV_CMP_REFERENCE, 0, 2, KV_VERDICT_FAIL, MSG_NASTY);
    c[1].first_step = 3;
    c[1].first_row = 1;
    c[1].max_abs_err = 0.5;
    set_cmp(&c[2], KV_CMP_VARIANT, 1, 2, KV_VERDICT_FAIL, "variant diverged at step 2");
    set_cmp(&c[3], KV_CMP_GRAPH, 1, 3, KV_VERDICT_SKIP, "no CUDA device");
    set_cmp(&c[4], KV_CMP_REFERENCE, 4, 5, KV_VERDICT_PASS, "");
    set_cmp(&c[5], KV_CMP_REPEAT, 5, 6, KV_VERDICT_PASS, "");
    set_cmp(&c[6], KV_CMP_GRAPH, 5, 7, KV_VERDICT_PASS, "");
    set_cmp(&c[7], KV_CMP_REPLAY, 7, 7, KV_VERDICT_PASS, "");
    set_cmp(&c[8], KV_CMP_REFERENCE, 4, 8, KV_VERDICT_SKIP, CMP_SKIP_MSG);
    return rep;
}

/* reports/report.c (kv_report_free) is not part of this test's link: the
 * synthetic runs own no arrays, so the three allocations are all there is. */
static void free_report(KvReport *rep) {
    free(rep->tolerances);
    free(rep->runs);
    free(rep->comparisons);
    free(rep);
}

/* Writes the report to name in the scratch dir and returns the text. */
static char *write_and_read(const KvReport *rep, const char *name, char *path, size_t path_size) {
    path_in_dir(path, path_size, name);
    KvError err = {{0}};
    KvStatus st = kv_junit_write(rep, path, &err);
    ck_assert_msg(st == KV_OK, "kv_junit_write: status %d: %s", (int)st, err.msg);
    return read_text(path, NULL);
}

/* ---- reading the XML back ---------------------------------------------------- */

/* The value of attribute name in the tag starting at tag; fails if absent. */
static void tag_attr(const char *tag, const char *name, char *out, size_t size) {
    const char *end = strchr(tag, '>');
    ck_assert(end != NULL);
    char key[64];
    snprintf(key, sizeof key, " %s=\"", name);
    const char *p = strstr(tag, key);
    ck_assert_msg(p != NULL && p < end, "attribute %s missing in tag %.80s", name, tag);
    p += strlen(key);
    const char *q = strchr(p, '"');
    ck_assert(q != NULL && q < end);
    size_t n = (size_t)(q - p);
    ck_assert(n < size);
    memcpy(out, p, n);
    out[n] = '\0';
}

static long long tag_attr_int(const char *tag, const char *name) {
    char v[64];
    tag_attr(tag, name, v, sizeof v);
    char *e;
    long long x = strtoll(v, &e, 10);
    ck_assert_msg(*e == '\0' && e != v, "attribute %s=\"%s\" is not an integer", name, v);
    return x;
}

static int count_in(const char *from, const char *to, const char *needle) {
    int n = 0;
    size_t len = strlen(needle);
    for (const char *p = strstr(from, needle); p != NULL && p + len <= to; p = strstr(p + len, needle)) n++;
    return n;
}

/* The <testcase> element named name (opening tag through its end) in the
 * <testsuite> named suite, copied into a fresh string. */
static char *testcase_text(const char *doc, const char *suite, const char *name) {
    char key[256];
    snprintf(key, sizeof key, "<testsuite name=\"%s\"", suite);
    const char *ts = strstr(doc, key);
    ck_assert_msg(ts != NULL, "no testsuite named %s", suite);
    const char *ts_end = strstr(ts, "</testsuite>");
    ck_assert(ts_end != NULL);
    snprintf(key, sizeof key, "<testcase name=\"%s\"", name);
    const char *tc = strstr(ts, key);
    ck_assert_msg(tc != NULL && tc < ts_end, "no testcase named %s in suite %s", name, suite);
    const char *again = strstr(tc + 1, key);
    ck_assert_msg(again == NULL || again > ts_end, "two testcases named %s in suite %s", name, suite);
    const char *gt = strchr(tc, '>');
    ck_assert(gt != NULL);
    const char *end;
    if (gt[-1] == '/') {
        end = gt + 1;
    } else {
        end = strstr(tc, "</testcase>");
        ck_assert(end != NULL && end < ts_end);
        end += strlen("</testcase>");
    }
    size_t n = (size_t)(end - tc);
    char *s = malloc(n + 1);
    ck_assert(s != NULL);
    memcpy(s, tc, n);
    s[n] = '\0';
    return s;
}

/* ---- an independent well-formedness check ------------------------------------ */

/* Enough of XML 1.0 for what a JUnit writer may produce: the declaration,
 * one root, nested elements with double-quoted attributes, text, the five
 * predefined entities and numeric character references. Anything else
 * (comments, CDATA, DTDs) is reported, as the writer never emits it. Returns
 * NULL when well-formed, else what is wrong and where. */
static const char *xml_problem(const char *s, size_t n) {
    static char why[160];
    static const char decl[] = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
    char stack[16][48];
    int depth = 0, roots = 0;
    size_t i;
#define BAD(...)                                                                                   \
    do {                                                                                           \
        snprintf(why, sizeof why, __VA_ARGS__);                                                    \
        return why;                                                                                \
    } while (0)
    if (strncmp(s, decl, sizeof decl - 1) != 0) BAD("no XML declaration at the start");
    /* characters: valid UTF-8, no C0 controls but tab/LF/CR */
    for (i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x80) {
            if (c < 0x20 && c != '\t' && c != '\n' && c != '\r') BAD("control byte 0x%02X at %zu", c, i);
            i++;
            continue;
        }
        size_t len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 ? 2 : 0;
        if (len == 0 || c > 0xF4 || i + len > n) BAD("invalid UTF-8 lead 0x%02X at %zu", c, i);
        for (size_t k = 1; k < len; k++) {
            if (((unsigned char)s[i + k] & 0xC0) != 0x80) BAD("invalid UTF-8 at %zu", i + k);
        }
        i += len;
    }
    if (strstr(s, "]]>") != NULL) BAD("]]> in text");
    for (i = sizeof decl - 1; i < n;) {
        char c = s[i];
        if (c == '<') {
            i++;
            int closing = 0;
            if (s[i] == '/') {
                closing = 1;
                i++;
            }
            size_t start = i;
            while (i < n && (s[i] == '_' || s[i] == '-' || s[i] == '.' || (s[i] >= 'a' && s[i] <= 'z') ||
                             (s[i] >= 'A' && s[i] <= 'Z') || (i > start && s[i] >= '0' && s[i] <= '9'))) {
                i++;
            }
            size_t nl = i - start;
            if (nl == 0 || nl >= sizeof stack[0]) BAD("bad element name at %zu", start);
            if (closing) {
                if (depth == 0 || strlen(stack[depth - 1]) != nl || memcmp(stack[depth - 1], s + start, nl) != 0)
                    BAD("unmatched </%.*s> at %zu", (int)nl, s + start, start);
                if (s[i] != '>') BAD("junk in end tag at %zu", i);
                i++;
                depth--;
                continue;
            }
            if (depth == 0 && roots++ > 0) BAD("second root element at %zu", start);
            for (;;) {
                size_t ws = i;
                while (s[i] == ' ' || s[i] == '\n' || s[i] == '\t') i++;
                if (s[i] == '>' || (s[i] == '/' && s[i + 1] == '>')) break;
                if (i == ws) BAD("no space before attribute at %zu", i);
                size_t an = i;
                while ((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') || s[i] == '_') i++;
                if (i == an || s[i] != '=' || s[i + 1] != '"') BAD("bad attribute at %zu", an);
                i += 2;
                while (i < n && s[i] != '"') {
                    if (s[i] == '<') BAD("raw < in attribute at %zu", i);
                    if (s[i] == '&') {
                        const char *semi = strchr(s + i, ';');
                        if (semi == NULL) BAD("unterminated reference at %zu", i);
                        i = (size_t)(semi - s);
                    }
                    i++;
                }
                if (i >= n) BAD("unterminated attribute value");
                i++;
            }
            if (s[i] == '/') {
                i += 2;
            } else {
                if (depth == (int)(sizeof stack / sizeof stack[0])) BAD("nesting too deep");
                memcpy(stack[depth], s + start, nl);
                stack[depth][nl] = '\0';
                depth++;
                i++;
            }
        } else if (c == '&') {
            static const char *const ents[] = {"&amp;", "&lt;", "&gt;", "&quot;", "&apos;"};
            int ok = 0;
            for (size_t k = 0; k < 5; k++) {
                if (strncmp(s + i, ents[k], strlen(ents[k])) == 0) {
                    ok = 1;
                    i += strlen(ents[k]);
                    break;
                }
            }
            if (!ok && s[i + 1] == '#') {
                size_t k = i + 2;
                int hex = s[k] == 'x';
                if (hex) k++;
                size_t d = k;
                while ((s[k] >= '0' && s[k] <= '9') || (hex && ((s[k] >= 'a' && s[k] <= 'f') || (s[k] >= 'A' && s[k] <= 'F'))))
                    k++;
                if (k > d && s[k] == ';') {
                    ok = 1;
                    i = k + 1;
                }
            }
            if (!ok) BAD("bad reference at %zu: %.8s", i, s + i);
        } else {
            if (depth == 0 && c != '\n' && c != ' ') BAD("text outside the root at %zu", i);
            i++;
        }
    }
    if (depth != 0) BAD("%d unclosed elements at the end", depth);
    if (roots != 1) BAD("%d root elements", roots);
#undef BAD
    return NULL;
}

/* The attribute-reference scan above skips to ';' without validating; the
 * attributes are also checked entity by entity here. */
static void assert_attr_refs_valid(const char *doc) {
    for (const char *p = strchr(doc, '&'); p != NULL; p = strchr(p + 1, '&')) {
        ck_assert_msg(strncmp(p, "&amp;", 5) == 0 || strncmp(p, "&lt;", 4) == 0 || strncmp(p, "&gt;", 4) == 0 ||
                          strncmp(p, "&quot;", 6) == 0 || strncmp(p, "&apos;", 6) == 0 ||
                          strncmp(p, "&#", 2) == 0,
                      "bad reference at offset %td: %.10s", p - doc, p);
    }
}

static int have_xmllint(void) { return system("command -v xmllint >/dev/null 2>&1") == 0; }

static int xmllint_ok(const char *path, int quiet) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "xmllint --noout '%s'%s", path, quiet ? " >/dev/null 2>&1" : " 2>&1");
    return system(cmd) == 0;
}

/* ---- tests --------------------------------------------------------------------- */

START_TEST(test_kind_names) {
    ck_assert_str_eq(kv_compare_kind_name(KV_CMP_REFERENCE), "reference");
    ck_assert_str_eq(kv_compare_kind_name(KV_CMP_REPEAT), "repeat");
    ck_assert_str_eq(kv_compare_kind_name(KV_CMP_GRAPH), "graph_vs_eager");
    ck_assert_str_eq(kv_compare_kind_name(KV_CMP_VARIANT), "variant_vs_variant");
    ck_assert_str_eq(kv_compare_kind_name(KV_CMP_REPLAY), "replay");
    ck_assert_str_eq(kv_compare_kind_name(KV_CMP_FINITE), "finite");
    ck_assert_str_eq(kv_compare_kind_name((KvCompareKind)(KV_CMP_LAST + 1)), "unknown");
    ck_assert_str_eq(kv_compare_kind_name((KvCompareKind)-1), "unknown");
}
END_TEST

/* The checker must be able to fail, or "well-formed" proves nothing. */
START_TEST(test_checker_rejects_bad_xml) {
    static const char *const bad[] = {
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<a>&</a>\n",
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<a>x < y</a>\n",
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<a b=\"<\"/>\n",
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<a><b></a></b>\n",
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<a>\x01</a>\n",
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<a>\xff</a>\n",
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<a/><b/>\n",
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<a>\n",
        "<a/>\n",
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        ck_assert_msg(xml_problem(bad[k], strlen(bad[k])) != NULL, "checker accepted bad input %zu", k);
    }
    static const char good[] = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<a x=\"&lt;&#10;\"><b/>t &amp; &#x41;</a>\n";
    const char *why = xml_problem(good, strlen(good));
    ck_assert_msg(why == NULL, "checker rejected good input: %s", why);

    if (!have_xmllint()) {
        printf("test_junit: SKIPPED: xmllint self-check (xmllint not installed: add libxml2-utils)\n");
        return;
    }
    char path[128];
    path_in_dir(path, sizeof path, "bad.xml");
    FILE *f = fopen(path, "wb");
    ck_assert(f != NULL);
    fputs(bad[0], f);
    fclose(f);
    ck_assert_msg(!xmllint_ok(path, 1), "xmllint accepted %s", bad[0]);
}
END_TEST

START_TEST(test_wellformed) {
    KvReport *rep = make_report();
    char path[128];
    size_t len;
    path_in_dir(path, sizeof path, "out.xml");
    KvError err = {{0}};
    ck_assert_msg(kv_junit_write(rep, path, &err) == KV_OK, "%s", err.msg);
    char *doc = read_text(path, &len);
    const char *why = xml_problem(doc, len);
    ck_assert_msg(why == NULL, "not well-formed: %s\n%s", why, doc);
    assert_attr_refs_valid(doc);
    if (have_xmllint()) {
        ck_assert_msg(xmllint_ok(path, 0), "xmllint --noout rejected the file:\n%s", doc);
    } else {
        printf("test_junit: SKIPPED: xmllint --noout well-formedness check (xmllint not installed: "
               "add libxml2-utils); the built-in checker passed\n");
    }
    free(doc);
    free_report(rep);
}
END_TEST

START_TEST(test_counts) {
    KvReport *rep = make_report();
    char path[128];
    char *doc = write_and_read(rep, "out.xml", path, sizeof path);

    static const struct {
        const char *name;
        int tests, failures, skipped;
        const char *time;
    } want[] = {{"tiny/short", 4, 1, 1, "1.750"}, {"tiny/long", 5, 0, 1, "5.375"}};
    const char *root = strstr(doc, "<testsuites ");
    ck_assert(root != NULL);
    int sum_tests = 0, sum_fail = 0, sum_skip = 0;
    const char *prev = root;
    for (size_t k = 0; k < 2; k++) {
        char key[64];
        snprintf(key, sizeof key, "<testsuite name=\"%s\"", want[k].name);
        const char *ts = strstr(doc, key);
        ck_assert_msg(ts != NULL, "no testsuite %s", want[k].name);
        ck_assert_msg(ts > prev, "testsuite %s out of report order", want[k].name);
        prev = ts;
        const char *end = strstr(ts, "</testsuite>");
        ck_assert(end != NULL);
        int tests = (int)tag_attr_int(ts, "tests");
        int failures = (int)tag_attr_int(ts, "failures");
        int skipped = (int)tag_attr_int(ts, "skipped");
        ck_assert_int_eq(tag_attr_int(ts, "errors"), 0);
        /* against the hand count */
        ck_assert_int_eq(tests, want[k].tests);
        ck_assert_int_eq(failures, want[k].failures);
        ck_assert_int_eq(skipped, want[k].skipped);
        /* against the elements actually written */
        ck_assert_int_eq(count_in(ts, end, "<testcase "), tests);
        ck_assert_int_eq(count_in(ts, end, "<failure "), failures);
        ck_assert_int_eq(count_in(ts, end, "<skipped "), skipped);
        ck_assert_int_eq(count_in(ts, end, "<error"), 0);
        char t[32];
        tag_attr(ts, "time", t, sizeof t);
        ck_assert_str_eq(t, want[k].time);
        sum_tests += tests;
        sum_fail += failures;
        sum_skip += skipped;
    }
    ck_assert_int_eq(count_in(doc, doc + strlen(doc), "<testsuite "), 2);
    ck_assert_int_eq(count_in(doc, doc + strlen(doc), "<testsuites "), 1);
    char v[64];
    tag_attr(root, "name", v, sizeof v);
    ck_assert_str_eq(v, "kvrepro");
    ck_assert_int_eq(tag_attr_int(root, "tests"), N_RUNS);
    ck_assert_int_eq(tag_attr_int(root, "failures"), 1);
    ck_assert_int_eq(tag_attr_int(root, "skipped"), 2);
    ck_assert_int_eq(tag_attr_int(root, "errors"), 0);
    ck_assert_int_eq(tag_attr_int(root, "tests"), sum_tests);
    ck_assert_int_eq(tag_attr_int(root, "failures"), sum_fail);
    ck_assert_int_eq(tag_attr_int(root, "skipped"), sum_skip);
    tag_attr(root, "time", v, sizeof v);
    ck_assert_str_eq(v, "7.125");
    free(doc);
    free_report(rep);
}
END_TEST

/* The root's totals against the console's "N passed, N failed, N skipped"
 * (kv_report_print_counts) for rep: passed = tests - failures - skipped. */
static void assert_counts_match_console(const KvReport *rep, const char *what) {
    char path[128];
    char *doc = write_and_read(rep, "console.xml", path, sizeof path);
    const char *root = strstr(doc, "<testsuites ");
    ck_assert(root != NULL);
    const long long tests = tag_attr_int(root, "tests"), failures = tag_attr_int(root, "failures"),
                    skipped = tag_attr_int(root, "skipped");
    char *line = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&line, &len);
    ck_assert(m != NULL);
    ck_assert_int_eq(kv_report_print_counts(rep, m), KV_OK);
    ck_assert_int_eq(fclose(m), 0);
    char want[128];
    snprintf(want, sizeof want, "%lld passed, %lld failed, %lld skipped\n", tests - failures - skipped,
             failures, skipped);
    ck_assert_msg(strcmp(line, want) == 0, "%s: the console says '%s', JUnit's totals say '%s'", what, line,
                  want);
    free(line);
    free(doc);
}

/* JUnit counts what the console counts: the report above, and variants
 * that move runs between the verdicts in the ways that once made the two
 * disagree (a skipped run with a failing comparison, a run that ran but
 * whose comparison was skipped, a run failing several comparisons). */
START_TEST(test_counts_match_console) {
    KvReport *rep = make_report();
    assert_counts_match_console(rep, "the synthetic report");
    rep->comparisons[3].verdict = KV_VERDICT_FAIL; /* skipped run 3 now also fails */
    assert_counts_match_console(rep, "a skipped run with a failing comparison");
    rep->comparisons[5].verdict = KV_VERDICT_SKIP;
    rep->comparisons[6].verdict = KV_VERDICT_FAIL;
    rep->comparisons[7].verdict = KV_VERDICT_FAIL;
    assert_counts_match_console(rep, "skips and failures moved");
    for (int64_t k = 0; k < rep->n_comparisons; k++) rep->comparisons[k].verdict = KV_VERDICT_PASS;
    rep->runs[3].skipped = false;
    assert_counts_match_console(rep, "everything passing");
    free_report(rep);
}
END_TEST

START_TEST(test_failing_run) {
    KvReport *rep = make_report();
    char path[128];
    char *doc = write_and_read(rep, "out.xml", path, sizeof path);

    char *tc = testcase_text(doc, "tiny/short", "tiny/short/roll/cpu/eager r0");
    ck_assert_msg(strstr(tc, " classname=\"kvrepro.tiny.short\"") != NULL, "%s", tc);
    ck_assert_msg(strstr(tc, " time=\"1.000\"") != NULL, "%s", tc);
    /* message = the first failing comparison's kind and message, type = its kind */
    ck_assert_msg(strstr(tc, "<failure message=\"reference: " MSG_NASTY_ATTR " (and 1 more)\" "
                             "type=\"reference\">") != NULL,
                  "%s", tc);
    /* the body: every failing comparison of this run, where it differs */
    ck_assert_msg(strstr(tc, ">reference: reference/cpu/eager r0 vs roll/cpu/eager r0: " MSG_NASTY_TEXT "\n"
                             "  first_step=3 first_row=1 first_probe=-1\n  max_abs_err=0.5 ") != NULL,
                  "%s", tc);
    ck_assert_msg(strstr(tc, "\nvariant_vs_variant: ring/cpu/eager r0 vs roll/cpu/eager r0: variant diverged at "
                             "step 2\n") != NULL,
                  "%s", tc);
    ck_assert_msg(strstr(tc, "weight_seed=1234 prompt_seed=5678\n</failure>") != NULL, "%s", tc);
    ck_assert_int_eq(count_in(tc, tc + strlen(tc), "<failure "), 1);
    /* and what judged it, with the verdicts */
    ck_assert_msg(strstr(tc, "<system-out>reference: reference/cpu/eager r0 vs roll/cpu/eager r0: FAIL: ") != NULL,
                  "%s", tc);
    ck_assert_msg(strstr(tc, "\nvariant_vs_variant: ring/cpu/eager r0 vs roll/cpu/eager r0: FAIL: variant "
                             "diverged at step 2\n</system-out>\n    </testcase>") != NULL,
                  "%s", tc);
    free(tc);

    /* one test case per run, named so it reads alone; none per comparison */
    ck_assert_int_eq(count_in(doc, doc + strlen(doc), "<testcase "), N_RUNS);
    ck_assert_msg(strstr(doc, "<testcase name=\"reference:") == NULL, "%s", doc);

    /* a run no comparison names: no child elements at all */
    ck_assert_msg(strstr(doc, "<testcase name=\"tiny/short/reference/cpu/eager r0\" classname=\"kvrepro.tiny.short\" "
                              "time=\"0.500\"/>") != NULL,
                  "%s", doc);
    /* passing runs: no failure, no skip; their comparisons in system-out */
    tc = testcase_text(doc, "tiny/long", "tiny/long/ring/cpu/graph r0");
    ck_assert_msg(strstr(tc, "<testcase name=\"tiny/long/ring/cpu/graph r0\" classname=\"kvrepro.tiny.long\" "
                             "time=\"0.125\">\n      <system-out>graph_vs_eager: ring/cpu/eager r0 vs "
                             "ring/cpu/graph r0: pass\nreplay: ring/cpu/graph r0: pass\n</system-out>\n"
                             "    </testcase>") == tc,
                  "%s", tc);
    free(tc);
    static const struct {
        const char *suite, *name;
    } passing[] = {
        {"tiny/short", "tiny/short/ring/cpu/eager r0"},
        {"tiny/long", "tiny/long/reference/cpu/eager r0"},
        {"tiny/long", "tiny/long/ring/cpu/eager r0"},
        {"tiny/long", "tiny/long/ring/cpu/eager r1"},
    };
    for (size_t k = 0; k < sizeof passing / sizeof passing[0]; k++) {
        tc = testcase_text(doc, passing[k].suite, passing[k].name);
        ck_assert_msg(strstr(tc, "<failure") == NULL && strstr(tc, "<skipped") == NULL, "passing run: %s", tc);
        free(tc);
    }
    free(doc);
    free_report(rep);
}
END_TEST

START_TEST(test_skipped) {
    KvReport *rep = make_report();
    char path[128];
    char *doc = write_and_read(rep, "out.xml", path, sizeof path);
    /* not run: the run's own reason */
    char *tc = testcase_text(doc, "tiny/short", "tiny/short/ring/cuda/graph r0");
    ck_assert_msg(strstr(tc, "<skipped message=\"" SKIP_NASTY_ATTR "\"/>") != NULL, "%s", tc);
    ck_assert_msg(strstr(tc, "<failure") == NULL, "%s", tc);
    ck_assert_msg(strstr(tc, "graph_vs_eager: ring/cpu/eager r0 vs ring/cuda/graph r0: skipped: no CUDA device\n") !=
                      NULL,
                  "%s", tc);
    free(tc);
    /* ran, but its comparison was skipped: that comparison's reason, as the
     * console's skip lines give it */
    tc = testcase_text(doc, "tiny/long", "tiny/long/ring/cuda/eager r0");
    ck_assert_msg(strstr(tc, "<skipped message=\"" CMP_SKIP_MSG "\"/>") != NULL, "%s", tc);
    free(tc);
    free(doc);
    free_report(rep);
}
END_TEST

/* A run of another (model, scenario) is named whole in a case's text: the
 * case's own suite is not where it is. */
START_TEST(test_other_suite_named_whole) {
    KvReport *rep = make_report();
    rep->comparisons[8].run_a = 0; /* long's run 8 against short's reference */
    char path[128];
    char *doc = write_and_read(rep, "out.xml", path, sizeof path);
    char *tc = testcase_text(doc, "tiny/long", "tiny/long/ring/cuda/eager r0");
    ck_assert_msg(strstr(tc, "reference: tiny/short/reference/cpu/eager r0 vs ring/cuda/eager r0: skipped: ") != NULL,
                  "%s", tc);
    free(tc);
    free(doc);
    free_report(rep);
}
END_TEST

START_TEST(test_escaping) {
    KvReport *rep = make_report();
    char path[128];
    size_t len;
    path_in_dir(path, sizeof path, "out.xml");
    KvError err = {{0}};
    ck_assert_msg(kv_junit_write(rep, path, &err) == KV_OK, "%s", err.msg);
    char *doc = read_text(path, &len);
    /* nothing of the raw message survives unescaped */
    ck_assert(strstr(doc, "<> 7") == NULL);
    ck_assert(strstr(doc, "7 & ") == NULL);
    ck_assert(strstr(doc, "\"logit\"") == NULL);
    ck_assert(strstr(doc, "'x'") == NULL);
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)doc[i];
        ck_assert_msg(c >= 0x20 ? c != 0x7F && c != 0xFF : c == '\n', "byte 0x%02X at %zu", c, i);
    }
    /* valid non-ASCII passes through as UTF-8 */
    ck_assert(strstr(doc, "\xce\x94") != NULL);
    free(doc);

    /* name fields filled to the brim (no NUL) and markup in names */
    memset(rep->runs[0].variant, 'v', sizeof rep->runs[0].variant);
    SET(rep->runs[4].variant, "a<b>&\"c\"");
    ck_assert_msg(kv_junit_write(rep, path, &err) == KV_OK, "%s", err.msg);
    doc = read_text(path, &len);
    char want[KV_NAME_LEN + 32];
    memset(want, 'v', KV_NAME_LEN);
    strcpy(want + KV_NAME_LEN, "/cpu/eager r0\"");
    ck_assert_msg(strstr(doc, want) != NULL, "%s", doc);
    ck_assert_msg(strstr(doc, "<testcase name=\"tiny/long/a&lt;b&gt;&amp;&quot;c&quot;/cpu/eager r0\"") != NULL,
                  "%s", doc);
    const char *why = xml_problem(doc, len);
    ck_assert_msg(why == NULL, "not well-formed: %s", why);
    free(doc);
    free_report(rep);
}
END_TEST

/* doc with every time="..." value replaced by "T", in place. */
static void normalise_times(char *doc) {
    char *w = doc;
    for (const char *r = doc; *r != '\0';) {
        if (strncmp(r, " time=\"", 7) == 0) {
            const char *end = strchr(r + 7, '"'); /* before w can overwrite it */
            ck_assert(end != NULL && end - r >= 8);
            memcpy(w, " time=\"T\"", 9);
            w += 9;
            r = end + 1;
        } else {
            *w++ = *r++;
        }
    }
    *w = '\0';
}

/* The time attributes are the runs' seconds (measured wall times: they
 * differ from gate to gate), and nothing else in the file depends on them:
 * two reports that differ only in their runs' seconds give files equal
 * once the times are normalised, and different before. */
START_TEST(test_times_only_differ) {
    KvReport *rep = make_report();
    char p1[128], p2[128];
    char *a = write_and_read(rep, "one.xml", p1, sizeof p1);
    for (int64_t i = 0; i < rep->n_runs; i++) rep->runs[i].seconds = 0.001 * (double)(i * i + 7);
    rep->runs[2].seconds = NAN; /* never measured: written as 0 */
    char *b = write_and_read(rep, "two.xml", p2, sizeof p2);
    ck_assert_msg(strcmp(a, b) != 0, "the runs' seconds are not in the file");
    char *tc = testcase_text(b, "tiny/short", "tiny/short/ring/cpu/eager r0");
    ck_assert_msg(strstr(tc, " time=\"0.008\"") != NULL, "%s", tc);
    free(tc);
    tc = testcase_text(b, "tiny/short", "tiny/short/roll/cpu/eager r0");
    ck_assert_msg(strstr(tc, " time=\"0.000\"") != NULL, "%s", tc);
    free(tc);
    normalise_times(a);
    normalise_times(b);
    size_t at = 0;
    while (a[at] != '\0' && a[at] == b[at]) at++;
    ck_assert_msg(a[at] == b[at], "files differ in more than their times, at byte %zu: '%.60s' vs '%.60s'",
                  at, a + at, b + at);
    ck_assert_int_eq(count_in(a, a + strlen(a), " time=\"T\""), 1 + 2 + N_RUNS);
    free(a);
    free(b);
    free_report(rep);
}
END_TEST

START_TEST(test_deterministic) {
    KvReport *rep = make_report();
    char p1[128], p2[128];
    size_t n1, n2;
    char *a = write_and_read(rep, "one.xml", p1, sizeof p1);
    char *b = write_and_read(rep, "two.xml", p2, sizeof p2);
    n1 = strlen(a);
    n2 = strlen(b);
    ck_assert_msg(n1 == n2 && memcmp(a, b, n1) == 0, "Nondeterminism! two writes of one report differ");
    free(b);
    /* rewriting over an existing file gives the same bytes, fully replaced */
    FILE *f = fopen(p2, "wb");
    ck_assert(f != NULL);
    for (int k = 0; k < 4096; k++) fputs("junk ", f);
    fclose(f);
    b = write_and_read(rep, "two.xml", p2, sizeof p2);
    ck_assert_msg(strlen(b) == n1 && memcmp(a, b, n1) == 0, "Nondeterminism! rewrite over a file differs");
    ck_assert_int_eq(dir_entry_count(g_dir), 2); /* no temporaries left */
    free(a);
    free(b);
    free_report(rep);
}
END_TEST

START_TEST(test_unwritable) {
    KvReport *rep = make_report();
    char path[160], tmp[200];
    KvError err = {{0}};

    /* a directory that does not exist */
    path_in_dir(path, sizeof path, "no-such-dir/out.xml");
    KvStatus st = kv_junit_write(rep, path, &err);
    ck_assert_int_eq(st, KV_ERR_INPUT);
    char want[400];
    snprintf(want, sizeof want, "%s: cannot create: %s", path, strerror(ENOENT));
    ck_assert_str_eq(err.msg, want);
    ck_assert(!path_exists(path));
    ck_assert_int_eq(dir_entry_count(g_dir), 0);

    /* a path that is a directory: the temporary is made, the rename fails */
    path_in_dir(path, sizeof path, "adir");
    ck_assert(mkdir(path, 0755) == 0);
    err.msg[0] = '\0';
    st = kv_junit_write(rep, path, &err);
    ck_assert_int_eq(st, KV_ERR_INPUT);
    snprintf(want, sizeof want, "%s: cannot create: ", path);
    ck_assert_msg(strncmp(err.msg, want, strlen(want)) == 0, "message: %s", err.msg);
    snprintf(tmp, sizeof tmp, "%s.tmp-%ld", path, (long)getpid());
    ck_assert_msg(!path_exists(tmp), "temporary %s left behind", tmp);
    ck_assert_int_eq(dir_entry_count(g_dir), 1); /* just adir */
    ck_assert_int_eq(dir_entry_count(path), 0);
    free_report(rep);
}
END_TEST

/* A full disk is bad input naming the path (never an internal error); the
 * old file stays and no temporary is left. RLIMIT_FSIZE with SIGXFSZ
 * ignored makes write() fail with EFBIG: the path a full disk's ENOSPC
 * takes. */
START_TEST(test_disk_full) {
    KvReport *rep = make_report();
    char path[160];
    char *before = write_and_read(rep, "full.xml", path, sizeof path);
    int fds[2];
    ck_assert(pipe(fds) == 0);
    const pid_t pid = fork();
    ck_assert(pid >= 0);
    if (pid == 0) {
        close(fds[0]);
        alarm(20);
        signal(SIGXFSZ, SIG_IGN);
        const struct rlimit lim = {512, 512};
        if (setrlimit(RLIMIT_FSIZE, &lim) != 0) _exit(3);
        KvError err = {{0}};
        KvStatus st = kv_junit_write(rep, path, &err);
        if (write(fds[1], &st, sizeof st) != (ssize_t)sizeof st ||
            write(fds[1], err.msg, sizeof err.msg) != (ssize_t)sizeof err.msg) {
            _exit(4);
        }
        _exit(0);
    }
    close(fds[1]);
    KvStatus st = KV_OK;
    KvError err = {{0}};
    ck_assert(read(fds[0], &st, sizeof st) == (ssize_t)sizeof st);
    size_t got = 0;
    while (got < sizeof err.msg) {
        const ssize_t n = read(fds[0], err.msg + got, sizeof err.msg - got);
        if (n <= 0) break;
        got += (size_t)n;
    }
    close(fds[0]);
    int status = 0;
    ck_assert(waitpid(pid, &status, 0) == pid);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child status 0x%x",
                  (unsigned)status);
    ck_assert_int_eq(st, KV_ERR_INPUT);
    char want[400];
    snprintf(want, sizeof want, "%s: cannot write: %s", path, strerror(EFBIG));
    ck_assert_str_eq(err.msg, want);
    size_t len;
    char *after = read_text(path, &len);
    ck_assert_msg(strcmp(before, after) == 0, "the old file changed");
    ck_assert_int_eq(dir_entry_count(g_dir), 1);
    free(before);
    free(after);
    free_report(rep);
}
END_TEST

/* A FIFO (like a device) is refused, not replaced; a temporary of a dead
 * writer is removed by the next write of the same path. */
START_TEST(test_fifo_and_stale_temporary) {
    KvReport *rep = make_report();
    char path[160], stale[200];
    KvError err = {{0}};
    path_in_dir(path, sizeof path, "pipe.xml");
    ck_assert(mkfifo(path, 0644) == 0);
    ck_assert_int_eq(kv_junit_write(rep, path, &err), KV_ERR_INPUT);
    ck_assert_msg(strstr(err.msg, "found a FIFO") != NULL && strstr(err.msg, path) == err.msg, "%s",
                  err.msg);
    struct stat sb;
    ck_assert(lstat(path, &sb) == 0 && S_ISFIFO(sb.st_mode));

    path_in_dir(path, sizeof path, "out.xml");
    const pid_t dead = fork();
    ck_assert(dead >= 0);
    if (dead == 0) _exit(0);
    ck_assert(waitpid(dead, NULL, 0) == dead);
    snprintf(stale, sizeof stale, "%s.tmp-%ld", path, (long)dead);
    FILE *f = fopen(stale, "w");
    ck_assert(f != NULL && fputs("<testsuites", f) >= 0 && fclose(f) == 0);
    ck_assert_msg(kv_junit_write(rep, path, &err) == KV_OK, "%s", err.msg);
    ck_assert_msg(!path_exists(stale), "stale temporary %s left", stale);
    ck_assert_int_eq(dir_entry_count(g_dir), 2); /* pipe.xml and out.xml */
    free_report(rep);
}
END_TEST

START_TEST(test_bad_report) {
    KvReport *rep = make_report();
    char path[128];
    KvError err = {{0}};
    path_in_dir(path, sizeof path, "out.xml");

    rep->comparisons[5].run_b = N_RUNS;
    ck_assert_int_eq(kv_junit_write(rep, path, &err), KV_ERR_INPUT);
    ck_assert_msg(strstr(err.msg, "comparison 5") != NULL && strstr(err.msg, path) == err.msg, "%s", err.msg);
    rep->comparisons[5].run_b = 6;
    rep->comparisons[2].verdict = (KvVerdict)7;
    ck_assert_int_eq(kv_junit_write(rep, path, &err), KV_ERR_INPUT);
    ck_assert_msg(strstr(err.msg, "comparison 2: verdict 7") != NULL, "%s", err.msg);
    rep->comparisons[2].verdict = KV_VERDICT_FAIL;
    rep->comparisons[0].kind = (KvCompareKind)(KV_CMP_LAST + 1);
    ck_assert_int_eq(kv_junit_write(rep, path, &err), KV_ERR_INPUT);
    char kind_msg[64];
    snprintf(kind_msg, sizeof kind_msg, "comparison 0: kind %d", (int)KV_CMP_LAST + 1);
    ck_assert_msg(strstr(err.msg, kind_msg) != NULL, "%s", err.msg);
    ck_assert_int_eq(dir_entry_count(g_dir), 0);

    ck_assert_int_eq(kv_junit_write(NULL, path, &err), KV_ERR_INPUT);
    ck_assert_int_eq(kv_junit_write(rep, NULL, &err), KV_ERR_INPUT);
    free_report(rep);
}
END_TEST

START_TEST(test_empty_report) {
    KvReport rep = {0};
    char path[128];
    size_t len;
    path_in_dir(path, sizeof path, "empty.xml");
    KvError err = {{0}};
    ck_assert_msg(kv_junit_write(&rep, path, &err) == KV_OK, "%s", err.msg);
    char *doc = read_text(path, &len);
    ck_assert_str_eq(doc, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
                          "<testsuites name=\"kvrepro\" tests=\"0\" failures=\"0\" errors=\"0\" skipped=\"0\" "
                          "time=\"0.000\">\n</testsuites>\n");
    const char *why = xml_problem(doc, len);
    ck_assert_msg(why == NULL, "%s", why);
    free(doc);
}
END_TEST

static Suite *junit_suite(void) {
    Suite *s = suite_create("junit");
    TCase *tc = tcase_create("junit");
    tcase_add_checked_fixture(tc, dir_setup, dir_teardown);
    tcase_add_test(tc, test_kind_names);
    tcase_add_test(tc, test_checker_rejects_bad_xml);
    tcase_add_test(tc, test_wellformed);
    tcase_add_test(tc, test_counts);
    tcase_add_test(tc, test_counts_match_console);
    tcase_add_test(tc, test_failing_run);
    tcase_add_test(tc, test_skipped);
    tcase_add_test(tc, test_other_suite_named_whole);
    tcase_add_test(tc, test_times_only_differ);
    tcase_add_test(tc, test_escaping);
    tcase_add_test(tc, test_deterministic);
    tcase_add_test(tc, test_unwritable);
    tcase_add_test(tc, test_disk_full);
    tcase_add_test(tc, test_fifo_and_stale_temporary);
    tcase_add_test(tc, test_bad_report);
    tcase_add_test(tc, test_empty_report);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    SRunner *sr = srunner_create(junit_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
