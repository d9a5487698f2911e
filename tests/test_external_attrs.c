/* test_external_attrs.c: `kvrepro gate --external` keeps the per-run
 * attributes kvrepro-hf capture records (docs/SCHEMA.md: attn_impl, dtype,
 * cache_layer, window, and on compiled runs probes_seen and
 * first_recompile): the plots read the window from the
 * gate's report, and the recompile reason is the one line that says why a
 * compiled decode recompiled.
 *
 * The recording is built as test_external.c builds one (the CPU reference's
 * decode of a left-padded batch on fixtures/hf/mistral, relabelled as runs
 * of another engine, written by the report writer), then the capture's
 * attributes are added with libhdf5 the way h5py writes them (variable-length
 * UTF-8 strings, a 64-bit window). The gate's report is read back with
 * libhdf5 too, attribute by attribute, so that the test says what the file
 * holds whatever the C structs carry. */
#include <check.h>
#include <hdf5.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "decode.h"
#include "model.h"
#include "prng.h"
#include "report.h"
#include "report_h5.h"
#include "tool_run.h"

#define ATTRS_MODEL_DIR KV_SOURCE_DIR "/fixtures/hf/mistral"
#define ATTRS_STEPS 6

/* The capture's attributes of one run ("" / -1: not recorded). */
typedef struct {
    const char *mode;
    int repeat;
    const char *attn_impl, *dtype, *cache_layer, *probes_seen, *first_recompile;
    int64_t window;
} RunAttrs;

/* One per run of the recording, in run order: an eager run, a compiled one
 * with its recompile reason (UTF-8 and long, as dynamo's guards are), and a
 * skipped one (attributes only, still kept). */
static const RunAttrs ATTRS[] = {
    {"eager", 0, "sdpa", "fp32", "static_sliding", "", "", 8},
    {"compile", 0, "sdpa", "fp32", "static_sliding",
     "layerN.cache and logits: a fullgraph compiled region runs no forward hooks",
     "tensor 'L['past_key_values'].layers[0].keys' size mismatch at index 2. expected 16, "
     "actual 17 \xe2\x80\x94 guard failed (dynamic shape)",
     8},
    {"reduce-overhead", 0, "sdpa", "fp32", "static_sliding", "", "", 8},
};
#define N_ATTRS ((int)(sizeof ATTRS / sizeof ATTRS[0]))

static char dir[256];

static void *dup_bytes(const void *src, size_t n) {
    void *p = malloc(n > 0 ? n : 1);
    ck_assert_ptr_nonnull(p);
    if (n > 0) memcpy(p, src, n);
    return p;
}

/* A run of "another engine" made of the reference decode d. */
static KvRun attrs_run(const KvDecodeResult *d, const int32_t *prompt, const uint8_t *real,
                       int64_t prompt_len, const RunAttrs *a) {
    KvRun r;
    kv_run_init(&r);
    snprintf(r.model, sizeof r.model, "mistral");
    snprintf(r.scenario, sizeof r.scenario, "short");
    snprintf(r.variant, sizeof r.variant, "hf:%s:%s:%s", a->cache_layer, a->attn_impl, a->dtype);
    snprintf(r.backend, sizeof r.backend, "torch-cpu");
    snprintf(r.mode, sizeof r.mode, "%s", a->mode);
    snprintf(r.engine, sizeof r.engine, "transformers 5.23.0, torch 2.15.0, attn sdpa, fp32");
    r.repeat = a->repeat;
    r.vocab = d->vocab;
    r.replay_mismatch_step = -1;
    if (strcmp(a->mode, "reduce-overhead") == 0) {
        r.skipped = true;
        snprintf(r.skip_reason, sizeof r.skip_reason, "reduce-overhead captures CUDA graphs");
        return r;
    }
    const int64_t S = d->steps, B = d->batch, V = d->vocab, P = prompt_len;
    r.steps = S;
    r.batch = B;
    r.prompt_len = P;
    r.prompt = dup_bytes(prompt, (size_t)(B * P) * sizeof *r.prompt);
    r.prompt_real = dup_bytes(real, (size_t)(B * P));
    r.tokens = dup_bytes(d->tokens, (size_t)(S * B) * sizeof *r.tokens);
    r.logits = dup_bytes(d->logits, (size_t)(S * B * V) * sizeof *r.logits);
    r.margins = dup_bytes(d->margins, (size_t)(S * B) * sizeof *r.margins);
    r.logits_hash = malloc((size_t)(S * B) * sizeof *r.logits_hash);
    ck_assert_ptr_nonnull(r.logits_hash);
    for (int64_t i = 0; i < S * B; i++) {
        r.logits_hash[i] = kv_fnv1a(KV_FNV_OFFSET, r.logits + i * V, (size_t)V * sizeof(float));
    }
    r.n_probes = 1;
    r.probe_names = calloc(1, sizeof *r.probe_names);
    ck_assert_ptr_nonnull(r.probe_names);
    snprintf(r.probe_names[0], KV_NAME_LEN, "logits");
    r.probe_hash = dup_bytes(r.logits_hash, (size_t)(S * B) * sizeof *r.probe_hash);
    const bool compiled = strcmp(a->mode, "eager") != 0;
    r.graphs_captured = compiled ? 2 : 0;
    r.recompiles = compiled ? 1 : -1;
    r.graph_budget = compiled ? 2 : -1;
    return r;
}

/* Adds a string attribute as h5py writes a str: variable-length UTF-8. */
static void put_string(hid_t g, const char *name, const char *value) {
    const hid_t t = H5Tcopy(H5T_C_S1);
    ck_assert(t >= 0 && H5Tset_size(t, H5T_VARIABLE) >= 0 && H5Tset_cset(t, H5T_CSET_UTF8) >= 0);
    const hid_t s = H5Screate(H5S_SCALAR);
    const hid_t a = H5Acreate2(g, name, t, s, H5P_DEFAULT, H5P_DEFAULT);
    ck_assert_msg(a >= 0 && H5Awrite(a, t, &value) >= 0, "cannot write attribute %s", name);
    H5Aclose(a);
    H5Sclose(s);
    H5Tclose(t);
}

static void put_i64(hid_t g, const char *name, int64_t v) {
    const hid_t s = H5Screate(H5S_SCALAR);
    const hid_t a = H5Acreate2(g, name, H5T_STD_I64LE, s, H5P_DEFAULT, H5P_DEFAULT);
    ck_assert_msg(a >= 0 && H5Awrite(a, H5T_NATIVE_INT64, &v) >= 0, "cannot write %s", name);
    H5Aclose(a);
    H5Sclose(s);
}

/* Attribute name of group g as a string (fixed- or variable-length) into
 * out; false when g has no such attribute. */
static bool get_string(hid_t g, const char *name, char *out, size_t n) {
    if (H5Aexists(g, name) <= 0) return false;
    const hid_t a = H5Aopen(g, name, H5P_DEFAULT);
    const hid_t ft = H5Aget_type(a);
    ck_assert_int_eq(H5Tget_class(ft), H5T_STRING);
    const hid_t mt = H5Tcopy(H5T_C_S1);
    H5Tset_cset(mt, H5Tget_cset(ft));
    if (H5Tis_variable_str(ft) > 0) {
        char *v = NULL;
        H5Tset_size(mt, H5T_VARIABLE);
        ck_assert(H5Aread(a, mt, &v) >= 0);
        snprintf(out, n, "%s", v != NULL ? v : "");
        H5free_memory(v);
    } else {
        const size_t w = H5Tget_size(ft);
        char *buf = calloc(1, w + 1);
        ck_assert_ptr_nonnull(buf);
        H5Tset_size(mt, w + 1);
        H5Tset_strpad(mt, H5T_STR_NULLTERM);
        ck_assert(H5Aread(a, mt, buf) >= 0);
        snprintf(out, n, "%s", buf);
        free(buf);
    }
    H5Tclose(mt);
    H5Tclose(ft);
    H5Aclose(a);
    return true;
}

static bool get_i64(hid_t g, const char *name, int64_t *v) {
    if (H5Aexists(g, name) <= 0) return false;
    const hid_t a = H5Aopen(g, name, H5P_DEFAULT);
    ck_assert(H5Aread(a, H5T_NATIVE_INT64, v) >= 0);
    H5Aclose(a);
    return true;
}

/* Writes the recording at path: the report writer's runs, then the
 * capture's attributes on each. */
static void write_recording(const char *path) {
    KvModel m;
    KvError err = {{0}};
    ck_assert_msg(kv_model_load_dir(ATTRS_MODEL_DIR, &m, &err) == KV_OK, "%s", err.msg);
    static const int32_t row0[] = {5, 17, 42, 7, 99, 3, 8, 1, 2, 3};
    static const int32_t row1[] = {11, 12, 13, 14};
    const int32_t *rows[] = {row0, row1};
    const int64_t lens[] = {10, 4};
    int32_t *prompt = NULL;
    uint8_t *real = NULL;
    int64_t P = 0;
    ck_assert(kv_batch_left_pad(rows, lens, 2, 0, &prompt, &real, &P, &err) == KV_OK);
    const KvDecodeSpec spec = {.batch = 2, .prompt_len = P, .prompt = prompt, .prompt_real = real,
                               .new_tokens = ATTRS_STEPS};
    KvDecodeResult d;
    ck_assert_msg(kv_decode_greedy(&m, &spec, &d, &err) == KV_OK, "%s", err.msg);
    KvReport rep;
    memset(&rep, 0, sizeof rep);
    snprintf(rep.tool_version, sizeof rep.tool_version, "kvrepro-hf 0.1.0");
    snprintf(rep.git_commit, sizeof rep.git_commit, "none");
    snprintf(rep.host, sizeof rep.host, "test");
    snprintf(rep.device, sizeof rep.device, "cpu");
    snprintf(rep.math_mode, sizeof rep.math_mode, "fp32");
    snprintf(rep.shard, sizeof rep.shard, "1/1");
    rep.runs = calloc(N_ATTRS, sizeof *rep.runs);
    ck_assert_ptr_nonnull(rep.runs);
    for (int i = 0; i < N_ATTRS; i++) rep.runs[i] = attrs_run(&d, prompt, real, P, &ATTRS[i]);
    rep.n_runs = N_ATTRS;
    ck_assert_msg(kv_report_write_h5(&rep, path, &err) == KV_OK, "%s", err.msg);
    kv_report_free(&rep);
    kv_decode_result_free(&d);
    kv_model_free(&m);
    free(prompt);
    free(real);

    const hid_t f = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
    ck_assert(f >= 0);
    for (int i = 0; i < N_ATTRS; i++) {
        char name[32];
        snprintf(name, sizeof name, "runs/%04d", i);
        const hid_t g = H5Gopen2(f, name, H5P_DEFAULT);
        ck_assert(g >= 0);
        const RunAttrs *a = &ATTRS[i];
        put_string(g, "attn_impl", a->attn_impl);
        put_string(g, "dtype", a->dtype);
        put_string(g, "cache_layer", a->cache_layer);
        put_i64(g, "window", a->window);
        if (a->probes_seen[0] != '\0') put_string(g, "probes_seen", a->probes_seen);
        if (a->first_recompile[0] != '\0') put_string(g, "first_recompile", a->first_recompile);
        H5Gclose(g);
    }
    H5Fclose(f);
}

static void setup(void) {
    snprintf(dir, sizeof dir, "/tmp/kv_external_attrs_XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(dir));
}

static void teardown(void) {
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "test_external_attrs: could not remove %s\n", dir);
}

/* Checks string attribute name of the gate's run g against the
 * recording's value (absent when the recording had none). */
static void expect_string(hid_t g, const char *label, const char *name, const char *want) {
    char got[2048];
    const bool has = get_string(g, name, got, sizeof got);
    if (want[0] == '\0') {
        ck_assert_msg(!has, "%s: %s: expected no attribute (the recording has none), found '%s'",
                      label, name, got);
        return;
    }
    ck_assert_msg(has, "%s: %s: the gate's report dropped it (recorded '%s')", label, name, want);
    ck_assert_msg(strcmp(got, want) == 0, "%s: %s: expected '%s', found '%s'", label, name, want,
                  got);
}

START_TEST(test_gate_keeps_capture_attributes) {
    char ext[512], report[512], log[512];
    snprintf(ext, sizeof ext, "%s/ext.h5", dir);
    snprintf(report, sizeof report, "%s/r.h5", dir);
    snprintf(log, sizeof log, "%s/kvrepro.log", dir);
    write_recording(ext);
    const char *argv[] = {KVREPRO, "gate", "--model", ATTRS_MODEL_DIR, "--no-calibrate",
                          "--external", ext, "--report", report, NULL};
    static char out[1 << 16];
    ck_assert_int_eq(kv_tool_run(argv, log, out, sizeof out), 0);

    const hid_t f = H5Fopen(report, H5F_ACC_RDONLY, H5P_DEFAULT);
    ck_assert(f >= 0);
    hsize_t n_runs = 0;
    const hid_t runs = H5Gopen2(f, "runs", H5P_DEFAULT);
    ck_assert(runs >= 0 && H5Gget_num_objs(runs, &n_runs) >= 0);
    int found = 0;
    for (hsize_t k = 0; k < n_runs; k++) {
        char name[32], variant[128], mode[64];
        snprintf(name, sizeof name, "%04llu", (unsigned long long)k);
        const hid_t g = H5Gopen2(runs, name, H5P_DEFAULT);
        ck_assert(g >= 0);
        ck_assert(get_string(g, "variant", variant, sizeof variant));
        ck_assert(get_string(g, "mode", mode, sizeof mode));
        if (strncmp(variant, "hf:", 3) != 0) {
            /* the gate's own reference runs have none of them */
            ck_assert_msg(H5Aexists(g, "window") == 0 && H5Aexists(g, "attn_impl") == 0,
                          "runs/%s (%s): the reference run got a capture attribute", name,
                          variant);
            H5Gclose(g);
            continue;
        }
        const RunAttrs *a = NULL;
        for (int i = 0; i < N_ATTRS; i++) {
            if (strcmp(ATTRS[i].mode, mode) == 0) a = &ATTRS[i];
        }
        ck_assert_msg(a != NULL, "runs/%s: unexpected mode %s", name, mode);
        char label[400];
        snprintf(label, sizeof label, "runs/%s (%s/%s)", name, variant, mode);
        expect_string(g, label, "attn_impl", a->attn_impl);
        expect_string(g, label, "dtype", a->dtype);
        expect_string(g, label, "cache_layer", a->cache_layer);
        expect_string(g, label, "probes_seen", a->probes_seen);
        expect_string(g, label, "first_recompile", a->first_recompile);
        int64_t window = -1;
        ck_assert_msg(get_i64(g, "window", &window), "%s: window: the gate's report dropped it "
                      "(recorded %lld)", label, (long long)a->window);
        ck_assert_msg(window == a->window, "%s: window: expected %lld, found %lld", label,
                      (long long)a->window, (long long)window);
        found++;
        H5Gclose(g);
    }
    H5Gclose(runs);
    H5Fclose(f);
    ck_assert_int_eq(found, N_ATTRS);
}
END_TEST

int main(void) {
    Suite *s = suite_create("external_attrs");
    TCase *tc = tcase_create("keeps");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_gate_keeps_capture_attributes);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    const int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
