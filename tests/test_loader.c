/* test_loader.c: the "loader" suite: config.json, safetensors and model
 * loading (model/config.h, safetensors.h, model.h).
 *
 * The malformed-input corpus (corpus.c) runs one loop test per entry: each
 * must fail with the stated status and a message naming the file, the
 * tensor or field and the expectation, and must leave no partial model.
 * Expected values are computed here by formula, independently of the code
 * under test (F16/BF16 decoding, shapes, byte counts). */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "corpus.h"
#include "file_open.h"
#include "fixture.h"
#include "kvmath.h"
#include "prng.h"

/* A regression that blocks (a FIFO opened for reading) or goes quadratic
 * must fail, not hang the suite: tests that could do either set an alarm
 * (SIGALRM ends the forked test, which Check reports as an error; without
 * fork it ends the run). These are generous upper bounds, not timings: the
 * FIFO test takes milliseconds, the 100k-key tests well under a second
 * (2-3 s under ASan on a loaded 2-core machine), and the quadratic
 * repeated-key scan they replace took 17 s on 1 MB. */
#define TEST_HANG_GUARD_S 3
#define TEST_SCALE_GUARD_S 10
/* Check's own per-test timeout for the scale tests, above the alarm. */
#define TEST_SCALE_TIMEOUT_S 30

/* Check records a mark per passing ck_assert (a pipe write); in the
 * element-by-element sweeps only a failing condition reaches Check. */
#define EXPECT(cond, ...)                                                                          \
    do {                                                                                           \
        if (!(cond)) ck_abort_msg(__VA_ARGS__);                                                    \
    } while (0)

static void *test_alloc(size_t n) {
    void *p = malloc(n > 0 ? n : 1);
    ck_assert_msg(p != NULL, "out of memory (%zu bytes)", n);
    return p;
}

/* A model struct full of garbage, so "zeroed on failure" is checked, not
 * assumed from a zero-initialised local. */
static void model_poison(KvModel *m) { memset(m, 0xA5, sizeof *m); }

static bool model_is_zero(const KvModel *m) {
    static const KvModel zero;
    return memcmp(m, &zero, sizeof zero) == 0;
}

static bool config_is_zero(const KvConfig *c) {
    static const KvConfig zero;
    return memcmp(c, &zero, sizeof zero) == 0;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- independent reference decoders ------------------------------------ */

static float ref_f16(uint16_t h) {
    int sign = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    double v;
    if (e == 0) {
        v = ldexp((double)m, -24);
    } else if (e == 31) {
        v = m != 0 ? NAN : INFINITY;
    } else {
        v = ldexp((double)(m + 1024), e - 25);
    }
    return (float)(sign ? -v : v);
}

static float ref_bf16(uint16_t h) {
    int sign = h >> 15, e = (h >> 7) & 255, m = h & 127;
    double v;
    if (e == 0) {
        v = ldexp((double)m, -133);
    } else if (e == 255) {
        v = m != 0 ? NAN : INFINITY;
    } else {
        v = ldexp((double)(m + 128), e - 134);
    }
    return (float)(sign ? -v : v);
}

/* Bitwise equality, any NaN equal to any NaN. */
static bool same_float(float a, float b) {
    if (isnan(a) || isnan(b)) return isnan(a) && isnan(b);
    return memcmp(&a, &b, sizeof a) == 0;
}

/* ---- naming a model's tensors (test side, independent of model.c) ------ */

typedef struct {
    char name[KV_ST_MAX_NAME];
    KvMat p;     /* as bound: a vector is F32 */
    bool matrix; /* kept as stored (model.h), not converted */
} NamedPtr;

static size_t model_named(const KvModel *m, NamedPtr *out) {
    size_t n = 0;
#define PUT_AS(mat, is_matrix, ...)                                                                \
    do {                                                                                           \
        snprintf(out[n].name, sizeof out[n].name, __VA_ARGS__);                                    \
        out[n].matrix = (is_matrix);                                                               \
        out[n++].p = (mat);                                                                        \
    } while (0)
#define PUT(vec, ...) PUT_AS(kv_mat_f32(vec), false, __VA_ARGS__)
#define PUT_MAT(mat, ...) PUT_AS(mat, true, __VA_ARGS__)
    PUT_MAT(m->embed, "model.embed_tokens.weight");
    for (int64_t l = 0; l < m->config.num_layers; l++) {
        const KvLayerWeights *L = &m->layers[l];
        const char *pre = "model.layers";
        long long i = (long long)l;
        PUT(L->input_norm, "%s.%lld.input_layernorm.weight", pre, i);
        PUT(L->post_attn_norm, "%s.%lld.post_attention_layernorm.weight", pre, i);
        if (m->config.family == KV_FAMILY_GEMMA2) {
            PUT(L->pre_ffw_norm, "%s.%lld.pre_feedforward_layernorm.weight", pre, i);
            PUT(L->post_ffw_norm, "%s.%lld.post_feedforward_layernorm.weight", pre, i);
        }
        PUT_MAT(L->wq, "%s.%lld.self_attn.q_proj.weight", pre, i);
        PUT_MAT(L->wk, "%s.%lld.self_attn.k_proj.weight", pre, i);
        PUT_MAT(L->wv, "%s.%lld.self_attn.v_proj.weight", pre, i);
        PUT_MAT(L->wo, "%s.%lld.self_attn.o_proj.weight", pre, i);
        PUT_MAT(L->w_gate, "%s.%lld.mlp.gate_proj.weight", pre, i);
        PUT_MAT(L->w_up, "%s.%lld.mlp.up_proj.weight", pre, i);
        PUT_MAT(L->w_down, "%s.%lld.mlp.down_proj.weight", pre, i);
    }
    PUT(m->final_norm, "model.norm.weight");
    if (!m->config.tie_word_embeddings) PUT_MAT(m->lm_head, "lm_head.weight");
#undef PUT_MAT
#undef PUT
#undef PUT_AS
    return n;
}

static const NamedPtr *named_find(const NamedPtr *np, size_t n, const char *name) {
    for (size_t i = 0; i < n; i++) {
        if (strcmp(np[i].name, name) == 0) return &np[i];
    }
    return NULL;
}

static bool inside(const void *p, const void *base, size_t len) {
    const uint8_t *q = p, *b = base;
    return q >= b && q < b + len;
}

/* Loads the corpus base of `family` stored as `enc`; image and config text
 * are returned so they outlive the model. */
static KvModel load_base(KvFamily family, CorpusEncoding enc, bool misalign, uint8_t **st,
                         size_t *st_len, char **cfg_text) {
    KvConfig cfg;
    corpus_config(family, &cfg);
    *cfg_text = kv_config_to_json(&cfg);
    ck_assert_ptr_nonnull(*cfg_text);
    corpus_image(&cfg, enc, misalign, st, st_len);
    KvModel m;
    KvError err = {{0}};
    model_poison(&m);
    KvStatus s = kv_model_load_memory(*cfg_text, strlen(*cfg_text), *st, *st_len, "base", &m, &err);
    ck_assert_msg(s == KV_OK, "base %s (encoding %d) failed to load: %s", kv_family_name(family),
                  (int)enc, err.msg);
    return m;
}

/* ---- the corpus -------------------------------------------------------- */

START_TEST(test_corpus_case) {
    const CorpusCase *c = &corpus_cases[_i];
    char *cfg;
    size_t cfg_len, st_len;
    uint8_t *st;
    corpus_case_build(c, &cfg, &cfg_len, &st, &st_len);
    /* Exact-size copies (config without a terminator) so any read past the
     * input is an ASan error in the sanitized build. */
    char *cfg_exact = test_alloc(cfg_len);
    memcpy(cfg_exact, cfg, cfg_len);
    uint8_t *st_exact = st_len > 0 ? test_alloc(st_len) : NULL;
    if (st_len > 0) memcpy(st_exact, st, st_len);
    free(cfg);
    free(st);

    KvModel m;
    KvError err;
    memset(&err, 0, sizeof err);
    model_poison(&m);
    KvStatus s = kv_model_load_memory(cfg_exact, cfg_len, st_exact, st_len, "corpus", &m, &err);
    ck_assert_msg(s == c->expect, "case %s: expected status %d, found %d (%s)", c->name,
                  (int)c->expect, (int)s, err.msg);
    if (c->expect == KV_OK) {
        ck_assert_ptr_nonnull(m.embed.data);
        ck_assert_ptr_nonnull(m.lm_head.data);
        ck_assert_ptr_nonnull(m.layers);
        kv_model_free(&m);
        ck_assert_msg(model_is_zero(&m), "case %s: kv_model_free left data behind", c->name);
    } else {
        ck_assert_msg(model_is_zero(&m), "case %s: failed load left a partial model", c->name);
        char file[64];
        snprintf(file, sizeof file, "corpus/%s: ", c->file);
        ck_assert_msg(strncmp(err.msg, file, strlen(file)) == 0,
                      "case %s: message should start with '%s': %s", c->name, file, err.msg);
        for (int k = 0; k < 3; k++) {
            if (c->substr[k] == NULL) continue;
            ck_assert_msg(strstr(err.msg, c->substr[k]) != NULL,
                          "case %s: message lacks \"%s\": %s", c->name, c->substr[k], err.msg);
        }
    }
    free(cfg_exact);
    free(st_exact);
}
END_TEST

/* ---- model loading ----------------------------------------------------- */

START_TEST(test_base_loads) {
    KvFamily family = _i == 0 ? KV_FAMILY_GEMMA2 : KV_FAMILY_MISTRAL;
    uint8_t *st;
    size_t st_len;
    char *cfg_text;
    KvModel m = load_base(family, CORPUS_F32, false, &st, &st_len, &cfg_text);
    ck_assert_int_eq(m.config.family, family);
    ck_assert_int_eq(m.config.num_layers, CORPUS_LAYERS);
    ck_assert_ptr_nonnull(m.layers);
    ck_assert_uint_eq(m.n_owned, 0); /* all F32 aligned: used in place */
    if (family == KV_FAMILY_GEMMA2) {
        ck_assert_ptr_eq(m.lm_head.data, m.embed.data);
    } else {
        ck_assert_ptr_ne(m.lm_head.data, m.embed.data);
        ck_assert_ptr_null(m.layers[0].pre_ffw_norm);
        ck_assert_ptr_null(m.layers[1].post_ffw_norm);
    }

    CorpusTensor ts[CORPUS_MAX_TENSORS];
    NamedPtr np[CORPUS_MAX_TENSORS];
    size_t nt = corpus_tensors(&m.config, ts);
    size_t nn = model_named(&m, np);
    ck_assert_uint_eq(nt, nn);
    uint64_t floats = 0;
    for (size_t t = 0; t < nt; t++) {
        const NamedPtr *np_t = named_find(np, nn, ts[t].name);
        ck_assert_msg(np_t != NULL, "tensor %s not bound", ts[t].name);
        ck_assert_int_eq(np_t->p.dtype, KV_DTYPE_F32);
        const float *p = np_t->p.data;
        ck_assert_msg(inside(p, st, st_len), "F32 tensor %s copied, not used in place",
                      ts[t].name);
        size_t numel = (size_t)ts[t].shape[0] * (size_t)(ts[t].rank == 2 ? ts[t].shape[1] : 1);
        /* untied, the embedding table is not streamed per step */
        if (m.config.tie_word_embeddings || strcmp(ts[t].name, "model.embed_tokens.weight") != 0)
            floats += numel;
        for (size_t i = 0; i < numel; i++) {
            EXPECT(p[i] == corpus_value(ts[t].name, i), "%s[%zu]: expected %g, found %g",
                   ts[t].name, i, (double)corpus_value(ts[t].name, i), (double)p[i]);
        }
    }
    /* What a decode step reads: layers, final norm, lm_head (tied: the
     * embedding, counted once). */
    ck_assert_uint_eq(m.weight_bytes, floats * 4);
    kv_model_free(&m);
    ck_assert(model_is_zero(&m));
    free(st);
    free(cfg_text);
}
END_TEST

/* Exact decoding of F16 / BF16 weights (specials, subnormals, NaN). */
START_TEST(test_half_models_exact) {
    KvFamily family = _i % 2 == 0 ? KV_FAMILY_GEMMA2 : KV_FAMILY_MISTRAL;
    CorpusEncoding enc = _i < 2 ? CORPUS_F16_BITS : CORPUS_BF16_BITS;
    uint8_t *st;
    size_t st_len;
    char *cfg_text;
    KvModel m = load_base(family, enc, false, &st, &st_len, &cfg_text);
    CorpusTensor ts[CORPUS_MAX_TENSORS];
    NamedPtr np[CORPUS_MAX_TENSORS];
    size_t nt = corpus_tensors(&m.config, ts);
    size_t nn = model_named(&m, np);
    size_t vectors = 0;
    for (size_t t = 0; t < nn; t++) vectors += !np[t].matrix;
    ck_assert_uint_eq(m.n_owned, vectors); /* every vector converted once, no matrix */
    const KvDtype half = enc == CORPUS_F16_BITS ? KV_DTYPE_F16 : KV_DTYPE_BF16;
    size_t specials_seen = 0;
    for (size_t t = 0; t < nt; t++) {
        const NamedPtr *np_t = named_find(np, nn, ts[t].name);
        ck_assert_ptr_nonnull(np_t);
        ck_assert_ptr_nonnull(np_t->p.data);
        if (np_t->matrix) {
            ck_assert_msg(inside(np_t->p.data, st, st_len) && np_t->p.dtype == half,
                          "%s: a half matrix must be kept as stored", ts[t].name);
        } else {
            ck_assert_msg(!inside(np_t->p.data, st, st_len) && np_t->p.dtype == KV_DTYPE_F32,
                          "%s: a half vector must be converted", ts[t].name);
        }
        size_t numel = (size_t)ts[t].shape[0] * (size_t)(ts[t].rank == 2 ? ts[t].shape[1] : 1);
        for (size_t i = 0; i < numel; i++) {
            uint16_t b = corpus_bits16(ts[t].name, i);
            float want = enc == CORPUS_F16_BITS ? ref_f16(b) : ref_bf16(b);
            const float got = kv_mat_at(np_t->p, (int64_t)i);
            EXPECT(same_float(got, want), "%s %s[%zu] bits 0x%04x: expected %a, found %a",
                   enc == CORPUS_F16_BITS ? "F16" : "BF16", ts[t].name, i, b, (double)want,
                   (double)got);
            if (fpclassify(want) == FP_SUBNORMAL || isinf(want) || isnan(want)) specials_seen++;
        }
    }
    ck_assert_uint_gt(specials_seen, 0);
    kv_model_free(&m);
    free(st);
    free(cfg_text);
}
END_TEST

/* An F32 tensor at an address that is not 4-byte aligned is copied, exactly. */
START_TEST(test_unaligned_f32) {
    KvFamily family = _i == 0 ? KV_FAMILY_GEMMA2 : KV_FAMILY_MISTRAL;
    uint8_t *st;
    size_t st_len;
    char *cfg_text;
    KvModel m = load_base(family, CORPUS_F32, true, &st, &st_len, &cfg_text);
    const KvTensorInfo *pad = kv_st_find(&m.st, corpus_pad_name(&m.config));
    ck_assert_ptr_nonnull(pad); /* an ignore-listed tensor: listed, never read */
    const KvTensorInfo *emb = kv_st_find(&m.st, "model.embed_tokens.weight");
    ck_assert_ptr_nonnull(emb);
    ck_assert_uint_eq((uintptr_t)(m.st.data + emb->begin) % 4, 2); /* really misaligned */

    CorpusTensor ts[CORPUS_MAX_TENSORS];
    NamedPtr np[CORPUS_MAX_TENSORS];
    size_t nt = corpus_tensors(&m.config, ts);
    size_t nn = model_named(&m, np);
    ck_assert_uint_eq(m.n_owned, nt);
    for (size_t t = 0; t < nt; t++) {
        const NamedPtr *np_t = named_find(np, nn, ts[t].name);
        ck_assert_ptr_nonnull(np_t);
        ck_assert_int_eq(np_t->p.dtype, KV_DTYPE_F32);
        const float *p = np_t->p.data;
        ck_assert_uint_eq((uintptr_t)p % 4, 0);
        ck_assert_msg(!inside(p, st, st_len), "%s: unaligned F32 used in place", ts[t].name);
        size_t numel = (size_t)ts[t].shape[0] * (size_t)(ts[t].rank == 2 ? ts[t].shape[1] : 1);
        for (size_t i = 0; i < numel; i++) {
            EXPECT(p[i] == corpus_value(ts[t].name, i), "%s[%zu]", ts[t].name, i);
        }
    }
    kv_model_free(&m);
    free(st);
    free(cfg_text);
}
END_TEST

START_TEST(test_model_hash) {
    uint8_t *st1, *st2, *st3;
    size_t len1, len2, len3;
    char *c1, *c2, *c3;
    KvModel a = load_base(KV_FAMILY_MISTRAL, CORPUS_F32, false, &st1, &len1, &c1);
    KvModel b = load_base(KV_FAMILY_MISTRAL, CORPUS_F16_VALUES, false, &st2, &len2, &c2);
    KvModel g = load_base(KV_FAMILY_GEMMA2, CORPUS_F32, false, &st3, &len3, &c3);
    uint64_t ha = kv_model_hash(&a);
    /* The same F32 values give the same hash whatever the file's dtype. */
    ck_assert_uint_eq(ha, kv_model_hash(&b));
    ck_assert_uint_ne(ha, kv_model_hash(&g));
    ck_assert_uint_ne(ha, KV_FNV_OFFSET);

    /* Flipping one weight bit (lm_head, hashed only when untied) changes it. */
    const KvTensorInfo *lm = kv_st_find(&a.st, "lm_head.weight");
    ck_assert_ptr_nonnull(lm);
    size_t at = (size_t)(a.st.data - st1) + (size_t)lm->begin + 40;
    kv_model_free(&a);
    st1[at] ^= 0x01;
    KvError err;
    ck_assert_int_eq(kv_model_load_memory(c1, strlen(c1), st1, len1, "x", &a, &err), KV_OK);
    ck_assert_uint_ne(ha, kv_model_hash(&a));
    st1[at] ^= 0x01;
    kv_model_free(&a);
    ck_assert_int_eq(kv_model_load_memory(c1, strlen(c1), st1, len1, "x", &a, &err), KV_OK);
    ck_assert_uint_eq(ha, kv_model_hash(&a));

    kv_model_free(&a);
    kv_model_free(&b);
    kv_model_free(&g);
    free(st1);
    free(st2);
    free(st3);
    free(c1);
    free(c2);
    free(c3);
}
END_TEST

/* The real tiny fixtures (fixtures/fixture.c) load through the loader. */
START_TEST(test_fixture_tiny_loads) {
    KvFamily family = _i == 0 ? KV_FAMILY_GEMMA2 : KV_FAMILY_MISTRAL;
    KvConfig cfg;
    KvError err = {{0}};
    ck_assert_int_eq(kv_fixture_config(family, KV_SIZE_TINY, &cfg, &err), KV_OK);
    uint8_t *st = NULL;
    size_t st_len = 0;
    char *json = NULL;
    KvStatus s = kv_fixture_build(&cfg, KV_FIXTURE_DEFAULT_SEED, &st, &st_len, &json, &err);
    ck_assert_msg(s == KV_OK, "fixture build: %s", err.msg);
    KvModel m;
    model_poison(&m);
    s = kv_model_load_memory(json, strlen(json), st, st_len, "tiny", &m, &err);
    ck_assert_msg(s == KV_OK, "fixture load: %s", err.msg);
    ck_assert_int_eq(m.config.family, family);
    ck_assert_int_eq(m.config.vocab_size, cfg.vocab_size);
    ck_assert_int_eq(m.config.hidden_size, cfg.hidden_size);
    ck_assert_int_eq(m.config.num_layers, cfg.num_layers);
    ck_assert_int_eq(m.config.num_kv_heads, cfg.num_kv_heads);
    ck_assert_int_eq(m.config.head_dim, cfg.head_dim);
    ck_assert_int_eq(m.config.sliding_window, cfg.sliding_window);
    ck_assert_int_eq(memcmp(m.config.layer_sliding, cfg.layer_sliding, KV_MAX_LAYERS), 0);
    ck_assert(m.config.tie_word_embeddings == cfg.tie_word_embeddings);
    NamedPtr *np = test_alloc((3 + (size_t)cfg.num_layers * 11) * sizeof *np);
    size_t nn = model_named(&m, np);
    for (size_t i = 0; i < nn; i++) {
        const KvTensorInfo *t = kv_st_find(&m.st, np[i].name);
        ck_assert_msg(t != NULL && np[i].p.data != NULL, "fixture tensor %s", np[i].name);
        ck_assert_ptr_eq(np[i].p.data, (const void *)(m.st.data + t->begin));
    }
    free(np);
    kv_model_free(&m);
    free(st);
    free(json);
}
END_TEST

/* ---- config.json ------------------------------------------------------- */

static KvConfig parse_ok(const char *json) {
    KvConfig c;
    KvError err = {{0}};
    KvStatus s = kv_config_parse(json, strlen(json), "t.json", &c, &err);
    ck_assert_msg(s == KV_OK, "expected %s to parse: %s", json, err.msg);
    return c;
}

static void parse_bad(const char *json, const char *want1, const char *want2) {
    KvConfig c;
    KvError err = {{0}};
    memset(&c, 0x5A, sizeof c);
    KvStatus s = kv_config_parse(json, strlen(json), "t.json", &c, &err);
    ck_assert_msg(s == KV_ERR_INPUT, "expected %s to fail, found %d", json, (int)s);
    ck_assert_msg(config_is_zero(&c), "failed parse left fields behind");
    ck_assert_msg(strncmp(err.msg, "t.json: ", 8) == 0, "no label: %s", err.msg);
    ck_assert_msg(strstr(err.msg, want1) != NULL, "message lacks \"%s\": %s", want1, err.msg);
    ck_assert_msg(strstr(err.msg, want2) != NULL, "message lacks \"%s\": %s", want2, err.msg);
}

/* 32 heads: every family's default num_key_value_heads (4, 8, 32 or
 * num_attention_heads) divides it, so each default is the one checked */
#define REQ_FIELDS                                                                                 \
    "\"vocab_size\": 100, \"hidden_size\": 256, \"intermediate_size\": 128, "                      \
    "\"num_hidden_layers\": 3, \"num_attention_heads\": 32"

START_TEST(test_config_defaults_gemma2) {
    KvConfig c = parse_ok("{\"model_type\": \"gemma2\", " REQ_FIELDS "}");
    ck_assert_int_eq(c.family, KV_FAMILY_GEMMA2);
    ck_assert_str_eq(c.model_type, "gemma2");
    ck_assert_int_eq(c.num_kv_heads, 4);
    ck_assert_int_eq(c.head_dim, 256);
    ck_assert_int_eq(c.max_position_embeddings, 8192);
    ck_assert(c.rms_norm_eps == 1e-6);
    ck_assert(c.rope_theta == 10000.0);
    ck_assert(c.query_pre_attn_scalar == 256.0);
    ck_assert(c.attn_logit_softcapping == 50.0);
    ck_assert(c.final_logit_softcapping == 30.0);
    ck_assert(c.tie_word_embeddings);
    ck_assert_int_eq(c.sliding_window, 4096);
    ck_assert_int_eq(c.layer_sliding[0], 1);
    ck_assert_int_eq(c.layer_sliding[1], 0);
    ck_assert_int_eq(c.layer_sliding[2], 1);
    ck_assert_int_eq(c.layer_sliding[3], 0); /* past num_layers: untouched zero */
    ck_assert_int_eq(kv_config_layer_window(&c, 0), 4096);
    ck_assert_int_eq(kv_config_layer_window(&c, 1), 0);
    ck_assert_int_eq(kv_config_layer_window(&c, 3), 0);
    ck_assert_int_eq(kv_config_layer_window(&c, -1), 0);
    ck_assert(kv_config_attn_scale(&c) == 0.0625f);

    /* null softcaps are off; layer_types given; hidden_act only */
    c = parse_ok("{\"model_type\": \"gemma2\", " REQ_FIELDS
                 ", \"attn_logit_softcapping\": null, \"final_logit_softcapping\": null,"
                 " \"hidden_act\": \"gelu_pytorch_tanh\", \"query_pre_attn_scalar\": 144,"
                 " \"layer_types\": [\"full_attention\", \"full_attention\", "
                 "\"sliding_attention\"], \"sliding_window\": 7}");
    ck_assert(c.attn_logit_softcapping == 0.0 && c.final_logit_softcapping == 0.0);
    ck_assert_int_eq(c.layer_sliding[0], 0);
    ck_assert_int_eq(c.layer_sliding[2], 1);
    ck_assert_int_eq(kv_config_layer_window(&c, 2), 7);
    ck_assert(kv_config_attn_scale(&c) == (float)(1.0 / 12.0));

    /* hidden_activation decides; a stale hidden_act beside it is ignored */
    c = parse_ok("{\"model_type\": \"gemma2\", " REQ_FIELDS
                 ", \"hidden_activation\": \"gelu_pytorch_tanh\", \"hidden_act\": \"gelu\"}");
    ck_assert_int_eq(c.family, KV_FAMILY_GEMMA2);

    /* all-full gemma2 needs no window */
    c = parse_ok("{\"model_type\": \"gemma2\", " REQ_FIELDS ", \"sliding_window\": null,"
                 " \"layer_types\": [\"full_attention\", \"full_attention\", "
                 "\"full_attention\"]}");
    ck_assert_int_eq(c.sliding_window, 0);
}
END_TEST

START_TEST(test_config_defaults_mistral_llama) {
    KvConfig c = parse_ok("{\"model_type\": \"mistral\", " REQ_FIELDS "}");
    ck_assert_int_eq(c.family, KV_FAMILY_MISTRAL);
    ck_assert_int_eq(c.num_kv_heads, 8); /* MistralConfig's default, not num_attention_heads */
    ck_assert_int_eq(c.head_dim, 8);
    ck_assert(c.rms_norm_eps == 1e-6);
    ck_assert_int_eq(c.max_position_embeddings, 131072);
    ck_assert(!c.tie_word_embeddings);
    ck_assert_int_eq(c.sliding_window, 4096);
    for (int i = 0; i < 3; i++) ck_assert_int_eq(kv_config_layer_window(&c, i), 4096);
    ck_assert(c.attn_logit_softcapping == 0.0 && c.final_logit_softcapping == 0.0);
    ck_assert(kv_config_attn_scale(&c) == (float)pow(8.0, -0.5));

    c = parse_ok("{\"model_type\": \"mistral\", " REQ_FIELDS ", \"sliding_window\": null,"
                 " \"head_dim\": 32, \"num_key_value_heads\": 2, \"rope_theta\": 1000000.0,"
                 " \"tie_word_embeddings\": true, \"hidden_act\": \"silu\","
                 " \"attention_bias\": false, \"rope_scaling\": null}");
    ck_assert_int_eq(c.sliding_window, 0);
    ck_assert_int_eq(c.layer_sliding[0], 0);
    ck_assert_int_eq(c.head_dim, 32);
    ck_assert(c.rope_theta == 1e6);
    ck_assert(c.tie_word_embeddings);
    ck_assert(kv_config_attn_scale(&c) == (float)pow(32.0, -0.5));

    /* llama: mistral math, never a window */
    c = parse_ok("{\"model_type\": \"llama\", " REQ_FIELDS ", \"sliding_window\": 64,"
                 " \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 500000}}");
    ck_assert_int_eq(c.family, KV_FAMILY_MISTRAL);
    ck_assert_str_eq(c.model_type, "llama");
    ck_assert_int_eq(c.sliding_window, 0);
    ck_assert_int_eq(c.max_position_embeddings, 2048);
    ck_assert_int_eq(c.num_kv_heads, 32); /* LlamaConfig: num_attention_heads */
    ck_assert_int_eq(kv_config_layer_window(&c, 0), 0);
    ck_assert(c.rope_theta == 500000.0);

    ck_assert_str_eq(kv_family_name(KV_FAMILY_GEMMA2), "gemma2");
    ck_assert_str_eq(kv_family_name(KV_FAMILY_MISTRAL), "mistral");
}
END_TEST

START_TEST(test_config_errors) {
    parse_bad("{\"model_type\": \"mistral\", " REQ_FIELDS ", \"sliding_window\": 0}",
              "'sliding_window'", "the number 0");
    parse_bad("{\"model_type\": \"gemma2\", " REQ_FIELDS ", \"head_dim\": 9}", "'head_dim'",
              "even");
    parse_bad("{\"model_type\": \"mistral\", \"vocab_size\": 100, \"hidden_size\": 64, "
              "\"intermediate_size\": 128, \"num_hidden_layers\": 3, "
              "\"num_attention_heads\": 6, \"num_key_value_heads\": 2}",
              "'head_dim'", "divisible");
    /* a family's default key/value heads that do not divide the heads:
     * refused, saying which default applied */
    parse_bad("{\"model_type\": \"mistral\", \"vocab_size\": 100, \"hidden_size\": 64, "
              "\"intermediate_size\": 128, \"num_hidden_layers\": 3, "
              "\"num_attention_heads\": 4}",
              "'num_key_value_heads': expected a divisor of num_attention_heads (4)",
              "missing: the mistral default is 8");
    /* gpt_oss: a given yarn object needs its factor, as in transformers */
    parse_bad("{\"model_type\": \"gpt_oss\", " REQ_FIELDS
              ", \"rope_parameters\": {\"rope_type\": \"yarn\"}}",
              "'rope_parameters.factor'", "required");
    parse_bad("{\"model_type\": \"gemma2\", " REQ_FIELDS ", \"vocab_size\": 1e400}",
              "'vocab_size'", "once");
    parse_bad("{\"model_type\": \"gemma2\", \"vocab_size\": 1e400, \"hidden_size\": 64, "
              "\"intermediate_size\": 128, \"num_hidden_layers\": 3, "
              "\"num_attention_heads\": 4}",
              "'vocab_size'", "integer");
    parse_bad("{\"model_type\": 2, " REQ_FIELDS "}", "'model_type'", "the number 2");
    parse_bad("{\"model_type\": \"gemma2\", " REQ_FIELDS ", \"rms_norm_eps\": \"1e-6\"}",
              "'rms_norm_eps'", "string");
    parse_bad("{\"model_type\": \"gemma2\", " REQ_FIELDS ", \"rope_parameters\": 3}",
              "'rope_parameters'", "object");
    parse_bad("{\"model_type\": \"gemma2\", " REQ_FIELDS ", \"final_logit_softcapping\": -2}",
              "'final_logit_softcapping'", ">= 0");
    parse_bad("\"gemma2\"", "JSON object", "string");
    parse_bad("{\"model_type\": \"gemma2\", " REQ_FIELDS "} x", "trailing", "byte");

    KvConfig c;
    KvError err = {{0}};
    memset(&c, 0x5A, sizeof c);
    ck_assert_int_eq(kv_config_parse(NULL, 0, "nothing.json", &c, &err), KV_ERR_INPUT);
    ck_assert(config_is_zero(&c));
    ck_assert_ptr_nonnull(strstr(err.msg, "nothing.json"));
    /* Embedded NUL: refused rather than silently truncated. */
    static const char nul_text[] = "{\"model_type\": \"gemma2\"\0}";
    ck_assert_int_eq(kv_config_parse(nul_text, sizeof nul_text - 1, "n.json", &c, &err),
                     KV_ERR_INPUT);
    ck_assert_ptr_nonnull(strstr(err.msg, "NUL"));

    /* Past the 16 MiB a config.json may have: refused before any copy. */
    size_t big = 16u * 1024u * 1024u + 1u;
    char *huge = calloc(big, 1); /* untouched zero pages: cheap */
    ck_assert_ptr_nonnull(huge);
    ck_assert_int_eq(kv_config_parse(huge, big, "big.json", &c, &err), KV_ERR_INPUT);
    ck_assert_msg(strstr(err.msg, "big.json: expected at most 16777216 bytes, found 16777217"),
                  "%s", err.msg);
    free(huge);

    /* mistral's default head_dim (hidden_size / num_attention_heads) is
     * bounded like a given one */
    parse_bad("{\"model_type\": \"mistral\", \"vocab_size\": 100, \"hidden_size\": 8192, "
              "\"intermediate_size\": 128, \"num_hidden_layers\": 3, "
              "\"num_attention_heads\": 1, \"num_key_value_heads\": 1}",
              "'head_dim': expected at most 4096", "found 8192 = 8192 / 1");
}
END_TEST

/* Each size field at and just outside its bound (config.h): the bound is
 * inclusive, and a refusal names the field, the bound and the value. */
typedef struct {
    const char *field;
    int64_t lo, hi;
    int64_t lo_ok; /* the smallest accepted value (head_dim must also be even) */
} FieldBound;

static const FieldBound field_bounds[] = {
    {"vocab_size", KV_CONFIG_MIN_VOCAB, KV_CONFIG_MAX_VOCAB, KV_CONFIG_MIN_VOCAB},
    {"hidden_size", 1, KV_CONFIG_MAX_HIDDEN, 1},
    {"intermediate_size", 1, KV_CONFIG_MAX_INTERMEDIATE, 1},
    {"num_hidden_layers", 1, KV_MAX_LAYERS, 1},
    {"num_attention_heads", 1, KV_CONFIG_MAX_HEADS, 1},
    {"num_key_value_heads", 1, KV_CONFIG_MAX_HEADS, 1},
    {"head_dim", 1, KV_CONFIG_MAX_HEAD_DIM, 2},
    {"sliding_window", 1, KV_CONFIG_MAX_WINDOW, 1},
    {"max_position_embeddings", 1, KV_CONFIG_MAX_POSITIONS, 1},
};

static int64_t config_field(const KvConfig *c, const char *field) {
    const struct {
        const char *name;
        int64_t value;
    } f[] = {
        {"vocab_size", c->vocab_size},
        {"hidden_size", c->hidden_size},
        {"intermediate_size", c->intermediate_size},
        {"num_hidden_layers", c->num_layers},
        {"num_attention_heads", c->num_heads},
        {"num_key_value_heads", c->num_kv_heads},
        {"head_dim", c->head_dim},
        {"sliding_window", c->sliding_window},
        {"max_position_embeddings", c->max_position_embeddings},
    };
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
        if (strcmp(f[i].name, field) == 0) return f[i].value;
    }
    ck_abort_msg("no field %s", field);
    return -1;
}

/* A gemma2 config with every size given, `field` set to v. The head counts
 * move together (kv heads must divide heads) unless v is out of range. */
static void bounds_json(const char *field, int64_t v, char *buf, size_t size) {
    static const char *names[] = {"vocab_size", "hidden_size", "intermediate_size",
                                  "num_hidden_layers", "num_attention_heads",
                                  "num_key_value_heads", "head_dim", "sliding_window",
                                  "max_position_embeddings"};
    int64_t vals[] = {100, 64, 128, 3, 4, 4, 16, 8, 256};
    bool heads = strcmp(field, "num_attention_heads") == 0 ||
                 strcmp(field, "num_key_value_heads") == 0;
    if (heads && v >= 1 && v <= KV_CONFIG_MAX_HEADS) vals[4] = vals[5] = v;
    size_t used = (size_t)snprintf(buf, size, "{\"model_type\": \"gemma2\"");
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        int64_t x = strcmp(names[i], field) == 0 ? v : vals[i];
        used += (size_t)snprintf(buf + used, size - used, ", \"%s\": %" PRId64, names[i], x);
    }
    snprintf(buf + used, size - used, "}");
}

START_TEST(test_config_bounds) {
    const FieldBound *b = &field_bounds[_i];
    char json[512];
    KvConfig c;
    KvError err = {{0}};
    int64_t ok_vals[2] = {b->lo_ok, b->hi};
    for (int k = 0; k < 2; k++) {
        bounds_json(b->field, ok_vals[k], json, sizeof json);
        KvStatus s = kv_config_parse(json, strlen(json), "b.json", &c, &err);
        ck_assert_msg(s == KV_OK, "%s = %" PRId64 " should be accepted: %s", b->field,
                      ok_vals[k], err.msg);
    }
    ck_assert_int_eq(config_field(&c, b->field), b->hi);
    int64_t bad_vals[2] = {b->lo - 1, b->hi + 1};
    for (int k = 0; k < 2; k++) {
        bounds_json(b->field, bad_vals[k], json, sizeof json);
        memset(&c, 0x5A, sizeof c);
        KvStatus s = kv_config_parse(json, strlen(json), "b.json", &c, &err);
        ck_assert_msg(s == KV_ERR_INPUT, "%s = %" PRId64 " should be refused, found %d",
                      b->field, bad_vals[k], (int)s);
        ck_assert(config_is_zero(&c));
        char want[160];
        snprintf(want, sizeof want,
                 "b.json: field '%s': expected an integer in [%" PRId64 ", %" PRId64 "]",
                 b->field, b->lo, b->hi);
        ck_assert_msg(strstr(err.msg, want) != NULL, "message lacks \"%s\": %s", want, err.msg);
        snprintf(want, sizeof want, "found the number %" PRId64, bad_vals[k]);
        ck_assert_msg(strstr(err.msg, want) != NULL, "message lacks \"%s\": %s", want, err.msg);
    }
}
END_TEST

/* A missing sliding_window takes transformers' default, 4096, and says so. */
START_TEST(test_config_window_defaulted) {
    KvConfig c = parse_ok("{\"model_type\": \"mistral\", " REQ_FIELDS "}");
    ck_assert_int_eq(c.sliding_window, 4096);
    ck_assert(c.sliding_window_defaulted);
    c = parse_ok("{\"model_type\": \"mistral\", " REQ_FIELDS ", \"sliding_window\": 4096}");
    ck_assert_int_eq(c.sliding_window, 4096);
    ck_assert(!c.sliding_window_defaulted);
    c = parse_ok("{\"model_type\": \"mistral\", " REQ_FIELDS ", \"sliding_window\": null}");
    ck_assert(c.sliding_window == 0 && !c.sliding_window_defaulted);
    c = parse_ok("{\"model_type\": \"llama\", " REQ_FIELDS "}");
    ck_assert(c.sliding_window == 0 && !c.sliding_window_defaulted);
    /* gemma2: the default layer_types has sliding layers */
    c = parse_ok("{\"model_type\": \"gemma2\", " REQ_FIELDS "}");
    ck_assert(c.sliding_window == 4096 && c.sliding_window_defaulted);
    c = parse_ok("{\"model_type\": \"gemma2\", " REQ_FIELDS ", \"sliding_window\": 8}");
    ck_assert(c.sliding_window == 8 && !c.sliding_window_defaulted);
    /* no layer slides: the default is never used, nothing to say */
    c = parse_ok("{\"model_type\": \"gemma2\", " REQ_FIELDS
                 ", \"layer_types\": [\"full_attention\", \"full_attention\", "
                 "\"full_attention\"]}");
    ck_assert(!c.sliding_window_defaulted);
    /* kv_config_to_json writes the window, so it is no longer a default */
    c = parse_ok("{\"model_type\": \"mistral\", " REQ_FIELDS "}");
    char *json = kv_config_to_json(&c);
    ck_assert_ptr_nonnull(json);
    KvConfig back = parse_ok(json);
    ck_assert(back.sliding_window == 4096 && !back.sliding_window_defaulted);
    free(json);
}
END_TEST

/* config.json text with `n` extra keys k000000.. before the real fields;
 * with dup >= 0, key number n-1 is named like key `dup`. */
static char *many_keys_json(size_t n, long dup) {
    size_t size = 64 + n * 24 + 512;
    char *buf = test_alloc(size);
    size_t used = (size_t)snprintf(buf, size, "{");
    for (size_t i = 0; i < n; i++) {
        long name = (dup >= 0 && i == n - 1) ? dup : (long)i;
        used += (size_t)snprintf(buf + used, size - used, "\"k%06ld\": %zu, ", name, i);
    }
    snprintf(buf + used, size - used, "\"model_type\": \"mistral\", " REQ_FIELDS "}");
    return buf;
}

/* 100k keys (a 1.9 MB config.json): the repeated-key check sorts, so this
 * takes milliseconds; the quadratic scan it replaced took 17 s at 1 MB. */
START_TEST(test_config_many_keys) {
    alarm(TEST_SCALE_GUARD_S);
    const size_t n = 100000;
    char *json = many_keys_json(n, -1);
    KvConfig c;
    KvError err = {{0}};
    KvStatus s = kv_config_parse(json, strlen(json), "many.json", &c, &err);
    ck_assert_msg(s == KV_OK, "%s", err.msg);
    ck_assert_int_eq(c.vocab_size, 100);
    ck_assert_int_eq(c.num_layers, 3);
    free(json);

    json = many_keys_json(n, 54321);
    s = kv_config_parse(json, strlen(json), "many.json", &c, &err);
    ck_assert_int_eq(s, KV_ERR_INPUT);
    ck_assert_msg(strstr(err.msg, "many.json: field 'k054321': expected once, found repeated"),
                  "%s", err.msg);
    free(json);
    alarm(0);
}
END_TEST

static void config_assert_equal(const KvConfig *a, const KvConfig *b) {
    ck_assert_int_eq(a->family, b->family);
    ck_assert_str_eq(a->model_type, b->model_type);
    ck_assert_int_eq(a->vocab_size, b->vocab_size);
    ck_assert_int_eq(a->hidden_size, b->hidden_size);
    ck_assert_int_eq(a->intermediate_size, b->intermediate_size);
    ck_assert_int_eq(a->num_layers, b->num_layers);
    ck_assert_int_eq(a->num_heads, b->num_heads);
    ck_assert_int_eq(a->num_kv_heads, b->num_kv_heads);
    ck_assert_int_eq(a->head_dim, b->head_dim);
    ck_assert_int_eq(a->sliding_window, b->sliding_window);
    ck_assert_int_eq(a->max_position_embeddings, b->max_position_embeddings);
    /* doubles: bitwise (memcmp), not approximately */
    ck_assert_msg(memcmp(&a->rms_norm_eps, &b->rms_norm_eps, sizeof(double)) == 0,
                  "eps %.17g vs %.17g", a->rms_norm_eps, b->rms_norm_eps);
    ck_assert_msg(memcmp(&a->rope_theta, &b->rope_theta, sizeof(double)) == 0,
                  "theta %.17g vs %.17g", a->rope_theta, b->rope_theta);
    ck_assert(memcmp(&a->query_pre_attn_scalar, &b->query_pre_attn_scalar, sizeof(double)) == 0);
    ck_assert(memcmp(&a->attn_logit_softcapping, &b->attn_logit_softcapping, sizeof(double)) == 0);
    ck_assert(memcmp(&a->final_logit_softcapping, &b->final_logit_softcapping, sizeof(double)) ==
              0);
    ck_assert(a->tie_word_embeddings == b->tie_word_embeddings);
    ck_assert_int_eq(memcmp(a->layer_sliding, b->layer_sliding, sizeof a->layer_sliding), 0);
}

static void roundtrip(const KvConfig *cfg) {
    char *json = kv_config_to_json(cfg);
    ck_assert_ptr_nonnull(json);
    KvConfig back;
    KvError err = {{0}};
    KvStatus s = kv_config_parse(json, strlen(json), "rt.json", &back, &err);
    ck_assert_msg(s == KV_OK, "round trip failed: %s\n%s", err.msg, json);
    config_assert_equal(cfg, &back);
    free(json);
}

START_TEST(test_config_roundtrip) {
    KvConfig c;
    corpus_config(KV_FAMILY_GEMMA2, &c);
    roundtrip(&c);
    /* doubles that need 17 digits, gemma2 without softcaps, odd layer pattern */
    c.rms_norm_eps = 0.1 + 0.2;
    c.rope_theta = 10000.000000000002;
    c.query_pre_attn_scalar = 1.0 / 3.0;
    c.attn_logit_softcapping = 0.0;
    c.final_logit_softcapping = 0.0;
    c.num_layers = 5;
    for (int i = 0; i < 5; i++) c.layer_sliding[i] = (i == 1 || i == 4);
    c.tie_word_embeddings = false;
    roundtrip(&c);
    /* gemma2 all-full, no window */
    for (int i = 0; i < 5; i++) c.layer_sliding[i] = 0;
    c.sliding_window = 0;
    roundtrip(&c);

    corpus_config(KV_FAMILY_MISTRAL, &c);
    roundtrip(&c);
    c.rms_norm_eps = 1e-5 * (1.0 + 1e-15);
    c.tie_word_embeddings = true;
    roundtrip(&c);
    c.sliding_window = 0;
    memset(c.layer_sliding, 0, sizeof c.layer_sliding);
    roundtrip(&c);
    snprintf(c.model_type, sizeof c.model_type, "llama");
    roundtrip(&c);
    /* max layer count */
    corpus_config(KV_FAMILY_GEMMA2, &c);
    c.num_layers = KV_MAX_LAYERS;
    for (int i = 0; i < KV_MAX_LAYERS; i++) c.layer_sliding[i] = (uint8_t)(i % 3 == 0);
    roundtrip(&c);

    /* the fixture configurations (fixtures/fixture.c) */
    for (int f = 0; f <= KV_FAMILY_GPT_OSS; f++) {
        for (int size = 0; size < 2; size++) {
            KvError err;
            ck_assert_int_eq(kv_fixture_config((KvFamily)f, (KvFixtureSize)size, &c, &err),
                             KV_OK);
            roundtrip(&c);
        }
    }
}
END_TEST

/* The JSON kv_config_to_json writes carries what transformers reads. */
/* mistral's list form of sliding_window (Mistral's interleaved windows, as
 * vLLM reads them): entry i % len is layer i's window, null a full layer;
 * sliding_window becomes the largest; the JSON round trip keeps it; bad
 * entries are exit-2 errors naming the entry. */
START_TEST(test_config_window_list) {
    static const char *const base =
        "{\"model_type\": \"mistral\", \"vocab_size\": 64, \"hidden_size\": 16, "
        "\"intermediate_size\": 32, \"num_hidden_layers\": 6, \"num_attention_heads\": 2, "
        "\"num_key_value_heads\": 1, "
        "\"head_dim\": 8, \"sliding_window\": %s}";
    char text[512];
    KvConfig c;
    KvError err = {{0}};
    snprintf(text, sizeof text, base, "[4, 16, null]");
    ck_assert_msg(kv_config_parse(text, strlen(text), "mixed.json", &c, &err) == KV_OK, "%s",
                  err.msg);
    static const int64_t want[6] = {4, 16, 0, 4, 16, 0};
    for (int64_t i = 0; i < 6; i++) {
        ck_assert_int_eq(kv_config_layer_window(&c, i), want[i]);
        ck_assert_int_eq(c.layer_sliding[i], want[i] > 0);
    }
    ck_assert_int_eq(c.sliding_window, 16);
    ck_assert(!c.sliding_window_defaulted && kv_config_mixed_windows(&c));
    char wt[64];
    kv_config_window_text(&c, wt, sizeof wt);
    ck_assert_str_eq(wt, "windows 4,16,0,4,16,0");
    char *json = kv_config_to_json(&c);
    ck_assert_ptr_nonnull(json);
    KvConfig back;
    ck_assert_msg(kv_config_parse(json, strlen(json), "back.json", &back, &err) == KV_OK, "%s",
                  err.msg);
    free(json);
    for (int64_t i = 0; i < 6; i++) {
        ck_assert_int_eq(kv_config_layer_window(&back, i), want[i]);
    }
    ck_assert_int_eq(back.sliding_window, 16);
    /* one window for every layer: not mixed, printed as before */
    snprintf(text, sizeof text, base, "[8]");
    ck_assert_msg(kv_config_parse(text, strlen(text), "one.json", &c, &err) == KV_OK, "%s",
                  err.msg);
    ck_assert(!kv_config_mixed_windows(&c) && c.sliding_window == 8);
    kv_config_window_text(&c, wt, sizeof wt);
    ck_assert_str_eq(wt, "window 8");
    /* refusals */
    static const struct {
        const char *list, *needle;
    } bad[] = {
        {"[4, 0]", "field 'sliding_window[1]': expected an integer in [1, "},
        {"[4, \"16\"]", "field 'sliding_window[1]'"},
        {"[4.5]", "field 'sliding_window[0]'"},
        {"[]", "field 'sliding_window': expected an integer, null, or a list of 1 to 6"},
        {"[1, 2, 3, 4, 5, 6, 7]", "a list of 1 to 6 windows"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        snprintf(text, sizeof text, base, bad[k].list);
        KvConfig z;
        ck_assert_int_eq(kv_config_parse(text, strlen(text), "bad.json", &z, &err), KV_ERR_INPUT);
        ck_assert_msg(strstr(err.msg, bad[k].needle) != NULL && strstr(err.msg, "bad.json"),
                      "%s: %s", bad[k].list, err.msg);
    }
    /* other families keep the integer form */
    static const char *const g2 =
        "{\"model_type\": \"gemma2\", \"vocab_size\": 64, \"hidden_size\": 16, "
        "\"intermediate_size\": 32, \"num_hidden_layers\": 2, \"num_attention_heads\": 2, "
        "\"num_key_value_heads\": 1, "
        "\"head_dim\": 8, \"sliding_window\": [4, 16]}";
    ck_assert_int_eq(kv_config_parse(g2, strlen(g2), "g2.json", &c, &err), KV_ERR_INPUT);
    ck_assert_msg(strstr(err.msg, "'sliding_window'") != NULL, "%s", err.msg);
}
END_TEST

/* What Gemma3TextConfig and Qwen2Config derive when config.json is
 * silent: gemma3's full layers every sliding_window_pattern-th (default 6),
 * its two RoPE bases from the legacy fields or the nested rope_parameters
 * (which wins), no attention softcap; qwen2's sliding layers from
 * max_window_layers only with use_sliding_window. */
START_TEST(test_config_family_defaults) {
    static const char *const g3 =
        "{\"model_type\": \"gemma3_text\", \"vocab_size\": 64, \"hidden_size\": 16, "
        "\"intermediate_size\": 32, \"num_hidden_layers\": 12, \"num_attention_heads\": 2, "
        "\"num_key_value_heads\": 1, "
        "\"head_dim\": 8, \"sliding_window\": 4}";
    KvConfig c;
    KvError err = {{0}};
    ck_assert_msg(kv_config_parse(g3, strlen(g3), "g3.json", &c, &err) == KV_OK, "%s", err.msg);
    for (int64_t i = 0; i < 12; i++) ck_assert_int_eq(c.layer_sliding[i], i % 6 != 5);
    ck_assert(c.rope_theta == 1e6 && c.rope_theta_local == 1e4 && c.qk_norm);
    ck_assert(kv_config_layer_rope_theta(&c, 0) == 1e4 && kv_config_layer_rope_theta(&c, 5) == 1e6);
    ck_assert(c.attn_logit_softcapping == 0.0 && c.final_logit_softcapping == 0.0);
    ck_assert(c.tie_word_embeddings && kv_config_gemma_style(&c));
    static const char *const g3n =
        "{\"model_type\": \"gemma3_text\", \"vocab_size\": 64, \"hidden_size\": 16, "
        "\"intermediate_size\": 32, \"num_hidden_layers\": 4, \"num_attention_heads\": 2, "
        "\"num_key_value_heads\": 1, "
        "\"head_dim\": 8, \"sliding_window\": 4, \"sliding_window_pattern\": 2, "
        "\"rope_theta\": 5e5, \"rope_parameters\": {\"sliding_attention\": {\"rope_type\": "
        "\"default\", \"rope_theta\": 2e4}, \"full_attention\": {\"rope_type\": \"default\", "
        "\"rope_theta\": 3e6}}}";
    ck_assert_msg(kv_config_parse(g3n, strlen(g3n), "g3n.json", &c, &err) == KV_OK, "%s",
                  err.msg);
    for (int64_t i = 0; i < 4; i++) ck_assert_int_eq(c.layer_sliding[i], i % 2 == 0);
    ck_assert(c.rope_theta == 3e6 && c.rope_theta_local == 2e4);
    /* the round trip keeps both bases and the layer kinds */
    char *json = kv_config_to_json(&c);
    KvConfig back;
    ck_assert_msg(kv_config_parse(json, strlen(json), "back.json", &back, &err) == KV_OK, "%s",
                  err.msg);
    ck_assert(back.rope_theta == 3e6 && back.rope_theta_local == 2e4 && back.qk_norm);
    ck_assert_mem_eq(back.layer_sliding, c.layer_sliding, 4);
    free(json);

    static const char *const q2 =
        "{\"model_type\": \"qwen2\", \"vocab_size\": 64, \"hidden_size\": 16, "
        "\"intermediate_size\": 32, \"num_hidden_layers\": 4, \"num_attention_heads\": 2, "
        "\"num_key_value_heads\": 1, "
        "\"sliding_window\": 4, \"max_window_layers\": 3%s}";
    char q2_text[512];
    snprintf(q2_text, sizeof q2_text, q2, "");
    ck_assert_msg(kv_config_parse(q2_text, strlen(q2_text), "q2.json", &c, &err) == KV_OK, "%s",
                  err.msg);
    ck_assert(c.sliding_window == 0 && c.attn_qkv_bias); /* use_sliding_window defaults false */
    for (int64_t i = 0; i < 4; i++) ck_assert_int_eq(c.layer_sliding[i], 0);
    snprintf(q2_text, sizeof q2_text, q2, ", \"use_sliding_window\": true");
    ck_assert_msg(kv_config_parse(q2_text, strlen(q2_text), "q2.json", &c, &err) == KV_OK, "%s",
                  err.msg);
    ck_assert_int_eq(c.sliding_window, 4);
    for (int64_t i = 0; i < 4; i++) ck_assert_int_eq(c.layer_sliding[i], i >= 3);

    /* gpt_oss: GptOssConfig's YaRN when no rope object is given (no
     * truncation), window 128 on the even layers, biases, sinks */
    static const char *const go =
        "{\"model_type\": \"gpt_oss\", \"vocab_size\": 64, \"hidden_size\": 64, "
        "\"intermediate_size\": 32, \"num_hidden_layers\": 4, \"num_attention_heads\": 8, "
        "\"num_local_experts\": 4%s}";
    char go_text[512];
    snprintf(go_text, sizeof go_text, go, "");
    ck_assert_msg(kv_config_parse(go_text, strlen(go_text), "go.json", &c, &err) == KV_OK, "%s",
                  err.msg);
    ck_assert(c.rope_yarn && c.rope_factor == 32.0 && !c.rope_truncate && c.rope_theta == 150000.0);
    ck_assert(fabs(c.rope_attention_factor - (0.1 * log(32.0) + 1.0)) < 1e-15);
    ck_assert(c.head_dim == 64 && c.sliding_window == 128 && c.experts_per_tok == 4);
    /* GptOssConfig's own defaults: 8 key/value heads, epsilon 1e-5 */
    ck_assert(c.num_kv_heads == 8 && c.rms_norm_eps == 1e-5);
    ck_assert(c.attn_qkv_bias && c.attn_o_bias && c.attn_sinks && !c.tie_word_embeddings);
    for (int64_t i = 0; i < 4; i++) ck_assert_int_eq(c.layer_sliding[i], i % 2 == 0);
    /* inv_freq as transformers 5.23 computes it for this config on this
     * machine (ROPE_INIT_FUNCTIONS["yarn"], printed to 9 digits); entries
     * 6 and 10 are left out: torch's vectorized powf is 1 ulp off there
     * (DESIGN §1) */
    static const double want[] = {1.0, 0.689044297, 0.47478205, 0.327145875, 0.225418001,
                                  0.155322984, -1, 0.0737445652, 0.0508132726, 0.0317056961};
    float inv[32];
    kv_rope_layer_inv_freq(&c, 0, inv);
    for (int i = 0; i < 10; i++) {
        if (want[i] < 0) continue;
        ck_assert_msg(fabs(inv[i] - want[i]) <= 1e-8 + 2e-7 * want[i], "inv_freq[%d] %.9g, "
                      "transformers %.9g", i, (double)inv[i], want[i]);
    }
    /* a given rope object without "truncate" truncates (transformers'
     * default there) */
    snprintf(go_text, sizeof go_text, go,
             ", \"rope_parameters\": {\"rope_type\": \"yarn\", \"factor\": 8.0}");
    ck_assert_msg(kv_config_parse(go_text, strlen(go_text), "go.json", &c, &err) == KV_OK, "%s",
                  err.msg);
    ck_assert(c.rope_truncate && c.rope_factor == 8.0);
}
END_TEST

START_TEST(test_config_json_fields) {
    KvConfig c;
    corpus_config(KV_FAMILY_GEMMA2, &c);
    c.attn_logit_softcapping = 0.0;
    char *json = kv_config_to_json(&c);
    ck_assert_ptr_nonnull(json);
    cJSON *o = cJSON_Parse(json);
    ck_assert_ptr_nonnull(o);
    ck_assert_str_eq(cJSON_GetArrayItem(cJSON_GetObjectItem(o, "architectures"), 0)->valuestring,
                     "Gemma2ForCausalLM");
    ck_assert_str_eq(cJSON_GetObjectItem(o, "hidden_activation")->valuestring,
                     "gelu_pytorch_tanh");
    ck_assert_str_eq(cJSON_GetObjectItem(o, "torch_dtype")->valuestring, "float32");
    ck_assert(cJSON_IsNull(cJSON_GetObjectItem(o, "attn_logit_softcapping")));
    ck_assert(cJSON_IsFalse(cJSON_GetObjectItem(o, "attention_bias")));
    ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(o, "layer_types")), CORPUS_LAYERS);
    ck_assert_str_eq(cJSON_GetArrayItem(cJSON_GetObjectItem(o, "layer_types"), 1)->valuestring,
                     "full_attention");
    cJSON_Delete(o);
    free(json);

    corpus_config(KV_FAMILY_MISTRAL, &c);
    c.sliding_window = 0;
    json = kv_config_to_json(&c);
    o = cJSON_Parse(json);
    ck_assert_ptr_nonnull(o);
    ck_assert_str_eq(cJSON_GetArrayItem(cJSON_GetObjectItem(o, "architectures"), 0)->valuestring,
                     "MistralForCausalLM");
    ck_assert_str_eq(cJSON_GetObjectItem(o, "hidden_act")->valuestring, "silu");
    ck_assert(cJSON_IsNull(cJSON_GetObjectItem(o, "sliding_window")));
    cJSON_Delete(o);
    free(json);
}
END_TEST

/* ---- safetensors ------------------------------------------------------- */

START_TEST(test_f16_bf16_exhaustive) {
    uint8_t *src = test_alloc(65536 * 2 + 1);
    float *dst = test_alloc(65536 * sizeof(float));
    /* src + 1: conversions must not assume alignment */
    for (uint32_t b = 0; b < 65536; b++) {
        src[1 + 2 * b] = (uint8_t)(b & 0xff);
        src[2 + 2 * b] = (uint8_t)(b >> 8);
    }
    kv_dtype_to_f32(KV_DTYPE_F16, src + 1, 65536, dst);
    for (uint32_t b = 0; b < 65536; b++) {
        EXPECT(same_float(dst[b], ref_f16((uint16_t)b)), "F16 0x%04x: expected %a, found %a", b,
               (double)ref_f16((uint16_t)b), (double)dst[b]);
    }
    ck_assert(dst[0x8000] == 0.0f && signbit(dst[0x8000]));
    ck_assert(dst[0x0001] == 5.9604644775390625e-08f);
    ck_assert(dst[0x7bff] == 65504.0f);
    kv_dtype_to_f32(KV_DTYPE_BF16, src + 1, 65536, dst);
    for (uint32_t b = 0; b < 65536; b++) {
        EXPECT(same_float(dst[b], ref_bf16((uint16_t)b)), "BF16 0x%04x: expected %a, found %a", b,
               (double)ref_bf16((uint16_t)b), (double)dst[b]);
    }
    ck_assert(dst[0x3f80] == 1.0f);
    float f32[3] = {1.5f, -0.0f, 3e-40f};
    memcpy(src + 1, f32, sizeof f32);
    kv_dtype_to_f32(KV_DTYPE_F32, src + 1, 3, dst);
    ck_assert_int_eq(memcmp(dst, f32, sizeof f32), 0);
    kv_dtype_to_f32(KV_DTYPE_I64, src, 2, dst);
    ck_assert(isnan(dst[0]) && isnan(dst[1]));
    free(src);
    free(dst);
}
END_TEST

START_TEST(test_dtype_table) {
    for (int i = 0; i < KV_DTYPE_COUNT; i++) {
        KvDtype dt;
        ck_assert(kv_dtype_from_name(kv_dtype_name((KvDtype)i), &dt));
        ck_assert_int_eq(dt, i);
        ck_assert_uint_gt(kv_dtype_bits((KvDtype)i), 0);
    }
    ck_assert_uint_eq(kv_dtype_size(KV_DTYPE_F32), 4);
    ck_assert_uint_eq(kv_dtype_size(KV_DTYPE_BF16), 2);
    ck_assert_uint_eq(kv_dtype_size(KV_DTYPE_I64), 8);
    ck_assert_uint_eq(kv_dtype_size(KV_DTYPE_F8_E4M3), 1);
    ck_assert_uint_eq(kv_dtype_size(KV_DTYPE_F4), 0);
    ck_assert_uint_eq(kv_dtype_bits(KV_DTYPE_F6_E2M3), 6);
    ck_assert(kv_dtype_loadable(KV_DTYPE_F16) && !kv_dtype_loadable(KV_DTYPE_U8));
    KvDtype dt;
    ck_assert(!kv_dtype_from_name("f32", &dt));
    ck_assert(!kv_dtype_from_name("Q4_K", &dt));
    ck_assert_str_eq(kv_dtype_name((KvDtype)999), "?");
}
END_TEST

START_TEST(test_st_roundtrip) {
    float a[6] = {1, 2, 3, 4, 5, 6};
    uint16_t b[3] = {0x3c00, 0x4000, 0x4200};
    float s = 7.0f;
    KvStWriteTensor w[4] = {
        {.name = "zeta", .dtype = KV_DTYPE_F32, .rank = 2, .shape = {2, 3}, .data = a},
        {.name = "alpha", .dtype = KV_DTYPE_F16, .rank = 1, .shape = {3}, .data = b},
        {.name = "mid.scalar", .dtype = KV_DTYPE_F32, .rank = 0, .data = &s},
        {.name = "empty", .dtype = KV_DTYPE_F32, .rank = 2, .shape = {0, 5}, .data = NULL},
    };
    uint8_t *img;
    size_t len;
    KvError err = {{0}};
    ck_assert_int_eq(kv_st_serialize(w, 4, &img, &len, &err), KV_OK);
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = (hl << 8) | img[i];
    ck_assert_uint_eq((8 + hl) % 8, 0);
    ck_assert_uint_eq(len, 8 + hl + 24 + 6 + 4);
    char *hdr = test_alloc((size_t)hl + 1);
    memcpy(hdr, img + 8, (size_t)hl);
    hdr[hl] = '\0';
    ck_assert_ptr_nonnull(strstr(hdr, "\"__metadata__\":{\"format\":\"pt\"}"));
    free(hdr);

    KvSafetensors st;
    memset(&st, 0x77, sizeof st);
    ck_assert_int_eq(kv_st_parse(img, len, "rt.safetensors", &st, &err), KV_OK);
    ck_assert_uint_eq(st.n_tensors, 4);
    ck_assert_str_eq(st.label, "rt.safetensors");
    ck_assert_ptr_null(st.map);
    const char *sorted[4] = {"alpha", "empty", "mid.scalar", "zeta"};
    for (int i = 0; i < 4; i++) {
        ck_assert_str_eq(st.tensors[i].name, sorted[i]);
        ck_assert_ptr_eq(kv_st_find(&st, sorted[i]), &st.tensors[i]);
    }
    ck_assert_ptr_null(kv_st_find(&st, "beta"));
    ck_assert_ptr_null(kv_st_find(&st, ""));
    const KvTensorInfo *z = kv_st_find(&st, "zeta");
    ck_assert_int_eq(z->rank, 2);
    ck_assert_int_eq(z->shape[0], 2);
    ck_assert_int_eq(z->shape[1], 3);
    ck_assert_uint_eq(z->begin, 0);
    ck_assert_uint_eq(z->end, 24);
    ck_assert_int_eq(memcmp(st.data + z->begin, a, sizeof a), 0);
    const KvTensorInfo *al = kv_st_find(&st, "alpha");
    ck_assert_int_eq(al->dtype, KV_DTYPE_F16);
    float f[3];
    kv_dtype_to_f32(al->dtype, st.data + al->begin, 3, f);
    ck_assert(f[0] == 1.0f && f[1] == 2.0f && f[2] == 3.0f);
    const KvTensorInfo *sc = kv_st_find(&st, "mid.scalar");
    ck_assert_int_eq(sc->rank, 0);
    ck_assert_uint_eq(sc->end - sc->begin, 4);
    const KvTensorInfo *em = kv_st_find(&st, "empty");
    ck_assert_uint_eq(em->end, em->begin);
    kv_st_close(&st);
    KvSafetensors zero;
    memset(&zero, 0, sizeof zero);
    ck_assert_int_eq(memcmp(&st, &zero, sizeof st), 0);
    kv_st_close(&st); /* twice: safe on a zeroed struct */
    free(img);

    /* writer refuses duplicate and over-long names */
    KvStWriteTensor dup[2] = {w[0], w[0]};
    img = (uint8_t *)&s;
    ck_assert_int_eq(kv_st_serialize(dup, 2, &img, &len, &err), KV_ERR_INPUT);
    ck_assert_ptr_null(img);
    ck_assert_ptr_nonnull(strstr(err.msg, "duplicate"));
    char longname[KV_ST_MAX_NAME + 1];
    memset(longname, 'n', KV_ST_MAX_NAME);
    longname[KV_ST_MAX_NAME] = '\0';
    KvStWriteTensor lw = w[0];
    lw.name = longname;
    ck_assert_int_eq(kv_st_serialize(&lw, 1, &img, &len, &err), KV_ERR_INPUT);
    /* an empty table is a valid file */
    ck_assert_int_eq(kv_st_serialize(NULL, 0, &img, &len, &err), KV_OK);
    ck_assert_int_eq(kv_st_parse(img, len, "e", &st, &err), KV_OK);
    ck_assert_uint_eq(st.n_tensors, 0);
    ck_assert_ptr_null(kv_st_find(&st, "x"));
    kv_st_close(&st);
    free(img);
}
END_TEST

/* The 100 MB header cap (the safetensors reference limit) holds even when
 * the file is long enough to contain the claimed header. */
START_TEST(test_st_header_cap) {
    size_t len = 100000000 + 16;
    uint8_t *img = calloc(len, 1); /* untouched zero pages: cheap */
    ck_assert_ptr_nonnull(img);
    uint64_t hl = 100000001;
    for (int i = 0; i < 8; i++) img[i] = (uint8_t)(hl >> (8 * i));
    KvSafetensors st;
    KvError err = {{0}};
    ck_assert_int_eq(kv_st_parse(img, len, "big", &st, &err), KV_ERR_INPUT);
    ck_assert_ptr_nonnull(strstr(err.msg, "big: header length 100000001"));
    ck_assert_ptr_nonnull(strstr(err.msg, "at most 100000000"));
    ck_assert_ptr_null(st.tensors);
    free(img);
}
END_TEST

/* A safetensors image of n one-byte U8 tensors t000000.. at offsets 0..n-1;
 * with dup >= 0 the last is named like tensor `dup`. */
static uint8_t *many_tensors_image(size_t n, long dup, size_t *len) {
    size_t cap = 64 + n * 80;
    char *h = test_alloc(cap);
    size_t used = (size_t)snprintf(h, cap, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (size_t i = 0; i < n; i++) {
        long name = (dup >= 0 && i == n - 1) ? dup : (long)i;
        used += (size_t)snprintf(h + used, cap - used,
                                 ",\"t%06ld\":{\"dtype\":\"U8\",\"shape\":[1],"
                                 "\"data_offsets\":[%zu,%zu]}",
                                 name, i, i + 1);
    }
    used += (size_t)snprintf(h + used, cap - used, "}");
    *len = 8 + used + n;
    uint8_t *img = test_alloc(*len);
    for (int b = 0; b < 8; b++) img[b] = (uint8_t)((uint64_t)used >> (8 * b));
    memcpy(img + 8, h, used);
    for (size_t i = 0; i < n; i++) img[8 + used + i] = (uint8_t)i;
    free(h);
    return img;
}

/* 100k tensor names (a 5 MB header): names are checked for repeats by
 * sorting, in well under a second. */
START_TEST(test_st_many_tensors) {
    alarm(TEST_SCALE_GUARD_S);
    const size_t n = 100000;
    size_t len;
    uint8_t *img = many_tensors_image(n, -1, &len);
    KvSafetensors st;
    KvError err = {{0}};
    ck_assert_msg(kv_st_parse(img, len, "many.safetensors", &st, &err) == KV_OK, "%s", err.msg);
    ck_assert_uint_eq(st.n_tensors, n);
    const KvTensorInfo *t = kv_st_find(&st, "t054321");
    ck_assert_ptr_nonnull(t);
    ck_assert_uint_eq(t->begin, 54321);
    ck_assert_uint_eq(st.data[t->begin], (uint8_t)54321);
    kv_st_close(&st);
    free(img);

    img = many_tensors_image(n, 54321, &len);
    ck_assert_int_eq(kv_st_parse(img, len, "many.safetensors", &st, &err), KV_ERR_INPUT);
    ck_assert_msg(strstr(err.msg, "many.safetensors: header: key 't054321': expected once, "
                                  "found repeated"),
                  "%s", err.msg);
    ck_assert_ptr_null(st.tensors);
    free(img);
    alarm(0);
}
END_TEST

/* The JSON text checks directly: every class of ill-formed UTF-8, and \u0000
 * told apart from an escaped backslash followed by "u0000". */
START_TEST(test_json_text_checks) {
    static const struct {
        const char *text;
        const char *want; /* NULL: accepted */
    } cases[] = {
        {"{\"a\": \"plain\"}", NULL},
        {"{\"\xc3\xbc\": \"\xe2\x82\xac \xf0\x9f\x98\x80 \xf4\x8f\xbf\xbf \xed\x9f\xbf\"}", NULL},
        {"{\"a\": \"\\\\u0000\"}", NULL},     /* \\u0000: a backslash, then text */
        {"{\"a\": \"\\u0001\\n\\\"\"}", NULL}, /* other escapes are fine */
        {"{\"a\": \"\x80\"}", "0x80 at byte 7"},     /* a lone continuation byte */
        {"{\"a\": \"\xc1\xbf\"}", "0xc1"},           /* overlong 2-byte */
        {"{\"a\": \"\xe0\x9f\xbf\"}", "0xe0"},       /* overlong 3-byte */
        {"{\"a\": \"\xf0\x8f\xbf\xbf\"}", "0xf0"},   /* overlong 4-byte */
        {"{\"a\": \"\xed\xbf\xbf\"}", "0xed"},       /* surrogate U+DFFF */
        {"{\"a\": \"\xf4\x90\x80\x80\"}", "0xf4"},   /* U+110000 */
        {"{\"a\": \"\xf5\x80\x80\x80\"}", "0xf5"},
        {"{\"a\": \"\xe2\x82\"}", "0xe2"},           /* truncated */
        {"{\"a\": \"x\xc3", "0xc3"},                  /* truncated at the end of the text */
        {"{\"a\\u0000b\": 1}", "key \"a\\u0000b\" at byte 1: expected no NUL character, found "
                                "the escape \\u0000 at byte 3"},
        {"{\"a\": \"\\u00000\"}", "string \"\\u00000\""},
        {"{\"a\"  :\"\\u0000\"}", "string"},
        {"{\"a\\u0000\"\n :1}", "key"},
        {"{\"a\": \"x\\u0000", "string \"x\\u0000\""}, /* unterminated, at the end */
        {"{\"a\": \"tab\there\"}", "string \"tab?here\" at byte 6: expected control characters escaped (JSON), found a raw control character 0x09 at byte 10"},
        {"{\"a\nb\": 1}", "key \"a?b\""},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        KvError err = {{0}};
        const char *t = cases[i].text;
        KvStatus s = kv_file_check_json_text(t, strlen(t), "w", &err);
        if (cases[i].want == NULL) {
            ck_assert_msg(s == KV_OK, "case %zu should pass: %s", i, err.msg);
        } else {
            ck_assert_msg(s == KV_ERR_INPUT, "case %zu should fail", i);
            ck_assert_msg(strncmp(err.msg, "w: ", 3) == 0, "case %zu: %s", i, err.msg);
            ck_assert_msg(strstr(err.msg, cases[i].want) != NULL, "case %zu: lacks \"%s\": %s", i,
                          cases[i].want, err.msg);
        }
    }
    /* The scan stops at len: a \u0000 cut off by len is not there. */
    KvError err = {{0}};
    const char *cut = "{\"a\": \"\\u0000\"}";
    ck_assert_int_eq(kv_file_check_json_text(cut, 9, "w", &err), KV_OK);
}
END_TEST

/* Repeated keys at any depth, with their path; the same key in two sibling
 * objects is fine. */
START_TEST(test_json_keys) {
    static const struct {
        const char *text;
        const char *want;
    } cases[] = {
        {"{\"a\": {\"x\": 1}, \"b\": {\"x\": 2}, \"c\": [{\"x\": 1}, {\"x\": 2}]}", NULL},
        {"{\"b\": 1, \"a\": 2, \"b\": 3}", "f 'b': expected once"},
        {"{\"a\": {\"y\": 1, \"x\": 1, \"y\": 2}}", "f 'a.y'"},
        {"{\"a\": [1, {\"x\": 1}, [{\"z\": 1, \"z\": 1}]]}", "f 'a[2][0].z'"},
        {"[{\"q\": 1, \"q\": 2}]", "f '[0].q'"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cJSON *root = cJSON_Parse(cases[i].text);
        ck_assert_ptr_nonnull(root);
        KvError err = {{0}};
        KvStatus s = kv_file_check_json_keys(root, "w", "f", &err);
        if (cases[i].want == NULL) {
            ck_assert_msg(s == KV_OK, "case %zu: %s", i, err.msg);
        } else {
            ck_assert_msg(s == KV_ERR_INPUT, "case %zu should fail", i);
            ck_assert_msg(strstr(err.msg, cases[i].want) != NULL, "case %zu: lacks \"%s\": %s", i,
                          cases[i].want, err.msg);
        }
        cJSON_Delete(root);
    }
}
END_TEST

/* ---- files on disk ----------------------------------------------------- */

typedef struct {
    char dir[256];
} TempDir;

static void temp_make(TempDir *t) {
    const char *base = getenv("TMPDIR");
    snprintf(t->dir, sizeof t->dir, "%s/kvloader.XXXXXX", base != NULL && *base ? base : "/tmp");
    ck_assert_msg(mkdtemp(t->dir) != NULL, "mkdtemp %s: %s", t->dir, strerror(errno));
}

static void temp_path(const TempDir *t, const char *name, char *out, size_t size) {
    snprintf(out, size, "%s/%s", t->dir, name);
}

static void temp_write(const TempDir *t, const char *name, const void *data, size_t len) {
    char p[512];
    temp_path(t, name, p, sizeof p);
    FILE *f = fopen(p, "wb");
    ck_assert_msg(f != NULL, "%s: %s", p, strerror(errno));
    ck_assert_uint_eq(fwrite(data, 1, len, f), len);
    ck_assert_int_eq(fclose(f), 0);
}

static void temp_remove(const TempDir *t) {
    static const char *names[] = {"config.json", "model.safetensors", "sub", "sock"};
    char p[512];
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        temp_path(t, names[i], p, sizeof p);
        if (unlink(p) != 0) rmdir(p);
    }
    rmdir(t->dir);
}

/* Writes the mistral base into t; returns the image (caller frees). */
static uint8_t *temp_base(const TempDir *t, size_t *len) {
    KvConfig cfg;
    corpus_config(KV_FAMILY_MISTRAL, &cfg);
    char *json = kv_config_to_json(&cfg);
    ck_assert_ptr_nonnull(json);
    uint8_t *img;
    corpus_image(&cfg, CORPUS_F32, false, &img, len);
    temp_write(t, "config.json", json, strlen(json));
    temp_write(t, "model.safetensors", img, *len);
    free(json);
    return img;
}

/* Loads dir expecting KV_ERR_INPUT naming `path` and containing `word`. */
static void dir_bad(const char *dir, const char *path, const char *word) {
    KvModel m;
    KvError err = {{0}};
    model_poison(&m);
    KvStatus s = kv_model_load_dir(dir, &m, &err);
    ck_assert_msg(s == KV_ERR_INPUT, "%s: expected KV_ERR_INPUT, found %d (%s)", dir, (int)s,
                  err.msg);
    ck_assert_msg(model_is_zero(&m), "%s: failed load left a partial model", dir);
    ck_assert_msg(strstr(err.msg, path) != NULL, "message lacks path %s: %s", path, err.msg);
    ck_assert_msg(strstr(err.msg, word) != NULL, "message lacks \"%s\": %s", word, err.msg);
}

/* A checkpoint larger than the memory limit is refused before loading,
 * with both figures; one byte more of limit loads it. */
START_TEST(test_dir_over_memory_limit) {
    TempDir t;
    temp_make(&t);
    size_t len;
    uint8_t *img = temp_base(&t, &len);
    KvSafetensors st;
    KvError err = {{0}};
    ck_assert_int_eq(kv_st_parse(img, len, "base", &st, &err), KV_OK);
    const uint64_t data = st.data_len; /* the weights as stored */
    kv_st_close(&st);
    char limit[32];
    snprintf(limit, sizeof limit, "%" PRIu64, data - 1);
    ck_assert_int_eq(setenv("KVREPRO_MEMORY_LIMIT", limit, 1), 0);
    ck_assert_uint_eq(kv_model_memory_limit(), data - 1);
    dir_bad(t.dir, t.dir, "KVREPRO_MEMORY_LIMIT");
    snprintf(limit, sizeof limit, "%" PRIu64, data);
    ck_assert_int_eq(setenv("KVREPRO_MEMORY_LIMIT", limit, 1), 0);
    KvModel m;
    ck_assert_msg(kv_model_load_dir(t.dir, &m, &err) == KV_OK, "%s", err.msg);
    kv_model_free(&m);
    ck_assert_int_eq(unsetenv("KVREPRO_MEMORY_LIMIT"), 0);
    ck_assert_uint_gt(kv_model_memory_limit(), data); /* the machine's own */
    free(img);
    temp_remove(&t);
}
END_TEST

START_TEST(test_dir_loads) {
    TempDir t;
    temp_make(&t);
    size_t len;
    uint8_t *img = temp_base(&t, &len);
    KvModel m;
    KvError err = {{0}};
    model_poison(&m);
    KvStatus s = kv_model_load_dir(t.dir, &m, &err);
    ck_assert_msg(s == KV_OK, "%s", err.msg);
    ck_assert_ptr_nonnull(m.st.map);
    ck_assert_uint_eq(m.st.map_len, len);
    ck_assert(inside(m.embed.data, m.st.map, m.st.map_len)); /* mapped, used in place */
    ck_assert(inside(m.lm_head.data, m.st.map, m.st.map_len));
    ck_assert_uint_eq(m.n_owned, 0);
    ck_assert(kv_mat_at(m.layers[1].w_down, 5) ==
              corpus_value("model.layers.1.mlp.down_proj.weight", 5));
    char p[512];
    temp_path(&t, "model.safetensors", p, sizeof p);
    ck_assert_str_eq(m.st.label, p);
    kv_model_free(&m);
    ck_assert(model_is_zero(&m));
    /* a trailing slash on the directory is fine */
    char slash[300];
    snprintf(slash, sizeof slash, "%s/", t.dir);
    ck_assert_int_eq(kv_model_load_dir(slash, &m, &err), KV_OK);
    kv_model_free(&m);
    free(img);
    temp_remove(&t);
}
END_TEST

START_TEST(test_dir_errors) {
    TempDir t;
    temp_make(&t);
    char p[512], q[512];

    /* missing directory */
    temp_path(&t, "nope", p, sizeof p);
    dir_bad(p, p, "No such file");
    /* empty directory: config.json missing */
    temp_path(&t, "config.json", p, sizeof p);
    dir_bad(t.dir, p, "cannot open");

    size_t len;
    uint8_t *img = temp_base(&t, &len);
    /* the directory given is a file */
    temp_path(&t, "config.json", p, sizeof p);
    dir_bad(p, p, "directory");

    /* model.safetensors missing */
    temp_path(&t, "model.safetensors", q, sizeof q);
    ck_assert_int_eq(unlink(q), 0);
    dir_bad(t.dir, q, "cannot open");
    /* truncated on disk: the header length runs past the end */
    temp_write(&t, "model.safetensors", img, 100);
    dir_bad(t.dir, q, "header length");
    /* truncated inside the data section */
    temp_write(&t, "model.safetensors", img, len - 4);
    dir_bad(t.dir, q, "out of bounds");
    /* empty and 5-byte files: format errors, not mmap failures */
    temp_write(&t, "model.safetensors", img, 0);
    dir_bad(t.dir, q, "0 bytes");
    temp_write(&t, "model.safetensors", img, 5);
    dir_bad(t.dir, q, "5 bytes");
    /* a directory where the file should be */
    ck_assert_int_eq(unlink(q), 0);
    ck_assert_int_eq(mkdir(q, 0700), 0);
    dir_bad(t.dir, q, "regular file");
    ck_assert_int_eq(rmdir(q), 0);
    temp_write(&t, "model.safetensors", img, len);

    /* config.json present but malformed: named by path */
    temp_write(&t, "config.json", "{\"model_type\": \"mistral\"", 24);
    dir_bad(t.dir, p, "valid JSON");
    temp_write(&t, "config.json", "", 0);
    dir_bad(t.dir, p, "valid JSON");

    /* kv_config_load and kv_st_open directly */
    KvConfig c;
    KvError err = {{0}};
    memset(&c, 0x33, sizeof c);
    temp_path(&t, "missing.json", p, sizeof p);
    ck_assert_int_eq(kv_config_load(p, &c, &err), KV_ERR_INPUT);
    ck_assert(config_is_zero(&c));
    ck_assert_ptr_nonnull(strstr(err.msg, p));
    ck_assert_ptr_nonnull(strstr(err.msg, "cannot open"));
    KvSafetensors st;
    memset(&st, 0x33, sizeof st);
    ck_assert_int_eq(kv_st_open(p, &st, &err), KV_ERR_INPUT);
    ck_assert_ptr_null(st.tensors);
    ck_assert_ptr_null(st.map);

    free(img);
    temp_remove(&t);
}
END_TEST

/* Loads dir expecting a refusal of `path` as a non-regular file of `kind`,
 * quickly: opening a FIFO must not wait for a writer. */
static void dir_refuses_kind(const char *dir, const char *path, const char *kind) {
    char want[640];
    snprintf(want, sizeof want, "%s: expected a regular file, found %s", path, kind);
    double t0 = now_s();
    dir_bad(dir, path, want);
    double dt = now_s() - t0;
    ck_assert_msg(dt < 1.0, "%s: refusing %s took %.3f s", path, kind, dt);
}

START_TEST(test_nonregular_inputs) {
    alarm(TEST_HANG_GUARD_S); /* a FIFO opened without O_NONBLOCK blocks for ever */
    TempDir t;
    temp_make(&t);
    size_t len;
    uint8_t *img = temp_base(&t, &len);
    char cfg[512], st[512];
    temp_path(&t, "config.json", cfg, sizeof cfg);
    temp_path(&t, "model.safetensors", st, sizeof st);

    /* config.json a FIFO with no writer */
    ck_assert_int_eq(unlink(cfg), 0);
    ck_assert_msg(mkfifo(cfg, 0600) == 0, "mkfifo %s: %s", cfg, strerror(errno));
    dir_refuses_kind(t.dir, cfg, "a FIFO");
    KvConfig c;
    KvError err = {{0}};
    memset(&c, 0x33, sizeof c);
    ck_assert_int_eq(kv_config_load(cfg, &c, &err), KV_ERR_INPUT);
    ck_assert(config_is_zero(&c));
    /* ... a directory */
    ck_assert_int_eq(unlink(cfg), 0);
    ck_assert_int_eq(mkdir(cfg, 0700), 0);
    dir_refuses_kind(t.dir, cfg, "a directory");
    ck_assert_int_eq(rmdir(cfg), 0);
    /* ... a socket */
    struct sockaddr_un addr;
    memset(&addr, 0, sizeof addr);
    addr.sun_family = AF_UNIX;
    int n = snprintf(addr.sun_path, sizeof addr.sun_path, "%s/sock", t.dir);
    if (n > 0 && (size_t)n < sizeof addr.sun_path) { /* TMPDIR may be too long for one */
        int fd = socket(AF_UNIX, SOCK_STREAM, 0);
        ck_assert_int_ge(fd, 0);
        ck_assert_int_eq(bind(fd, (const struct sockaddr *)&addr, sizeof addr), 0);
        ck_assert_int_eq(kv_config_load(addr.sun_path, &c, &err), KV_ERR_INPUT);
        ck_assert_msg(strstr(err.msg, "expected a regular file, found a socket"), "%s", err.msg);
        close(fd);
    }
    /* ... a device (character devices stream for ever) */
    ck_assert_int_eq(kv_config_load("/dev/zero", &c, &err), KV_ERR_INPUT);
    ck_assert_str_eq(err.msg, "/dev/zero: expected a regular file, found a device");

    /* model.safetensors a FIFO, config.json fine again */
    KvConfig base;
    corpus_config(KV_FAMILY_MISTRAL, &base);
    char *json = kv_config_to_json(&base);
    ck_assert_ptr_nonnull(json);
    temp_write(&t, "config.json", json, strlen(json));
    free(json);
    ck_assert_int_eq(unlink(st), 0);
    ck_assert_msg(mkfifo(st, 0600) == 0, "mkfifo %s: %s", st, strerror(errno));
    dir_refuses_kind(t.dir, st, "a FIFO");
    KvSafetensors tab;
    memset(&tab, 0x33, sizeof tab);
    ck_assert_int_eq(kv_st_open(st, &tab, &err), KV_ERR_INPUT);
    ck_assert_ptr_null(tab.tensors);
    ck_assert_ptr_null(tab.map);
    ck_assert_int_eq(kv_st_open("/dev/zero", &tab, &err), KV_ERR_INPUT);
    ck_assert_str_eq(err.msg, "/dev/zero: expected a regular file, found a device");

    /* and a regular file still loads after all that */
    ck_assert_int_eq(unlink(st), 0);
    temp_write(&t, "model.safetensors", img, len);
    KvModel m;
    ck_assert_int_eq(kv_model_load_dir(t.dir, &m, &err), KV_OK);
    kv_model_free(&m);
    free(img);
    temp_remove(&t);
    alarm(0);
}
END_TEST

/* ---- sharded checkpoints ------------------------------------------------ */

/* Removes every entry of t's directory (files and empty subdirectories),
 * then the directory: the sharded tests write many names. */
static void temp_remove_all(const TempDir *t) {
    DIR *d = opendir(t->dir);
    if (d != NULL) {
        struct dirent *e;
        char p[512];
        while ((e = readdir(d)) != NULL) {
            if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
            temp_path(t, e->d_name, p, sizeof p);
            if (unlink(p) != 0) rmdir(p);
        }
        closedir(d);
    }
    rmdir(t->dir);
}

/* How shard_write splits an image. */
typedef struct {
    int n_shards;
    const char *extra;   /* one more tensor (F32 [1]) written into shard extra_shard */
    int extra_shard;
    bool extra_listed;   /* ... and listed in the weight_map (for extra_shard) */
    const char *drop;    /* a tensor left out of every shard and of the map */
    void (*edit)(cJSON *weight_map); /* the last change to the map before writing */
} ShardPlan;

static void shard_name(int k, int n, char *buf, size_t size) {
    snprintf(buf, size, "model-%05d-of-%05d.safetensors", k + 1, n);
}

/* The shard of tensor i of `total` (in name order) when split n ways. */
static int shard_of(size_t i, size_t total, int n) { return (int)(i * (size_t)n / total); }

/* Writes config.json and a sharded copy of the safetensors image img into t,
 * as save_pretrained lays one out: the tensors in name order split into
 * plan->n_shards runs, each run a shard file written by kv_st_serialize
 * (dtype, shape and bytes as in img), and model.safetensors.index.json
 * mapping every tensor to its shard. No model.safetensors. */
static void shard_write(const TempDir *t, const char *config_json, const uint8_t *img,
                        size_t len, const ShardPlan *plan) {
    KvSafetensors tab;
    KvError err = {{0}};
    ck_assert_msg(kv_st_parse(img, len, "img", &tab, &err) == KV_OK, "%s", err.msg);
    temp_write(t, "config.json", config_json, strlen(config_json));
    KvStWriteTensor *wt = test_alloc((tab.n_tensors + 1) * sizeof *wt);
    cJSON *index = cJSON_CreateObject();
    cJSON *meta = cJSON_AddObjectToObject(index, "metadata");
    cJSON *map = cJSON_AddObjectToObject(index, "weight_map");
    ck_assert_ptr_nonnull(map);
    static const float extra_value = 0.5f;
    uint64_t total_size = 0;
    char fname[64];
    for (int k = 0; k < plan->n_shards; k++) {
        size_t n = 0;
        shard_name(k, plan->n_shards, fname, sizeof fname);
        for (size_t i = 0; i < tab.n_tensors; i++) {
            const KvTensorInfo *ti = &tab.tensors[i];
            if (shard_of(i, tab.n_tensors, plan->n_shards) != k) continue;
            if (plan->drop != NULL && strcmp(plan->drop, ti->name) == 0) continue;
            memset(&wt[n], 0, sizeof wt[n]);
            wt[n].name = ti->name;
            wt[n].dtype = ti->dtype;
            wt[n].rank = ti->rank;
            memcpy(wt[n].shape, ti->shape, sizeof wt[n].shape);
            wt[n].data = tab.data + ti->begin;
            n++;
            cJSON_AddStringToObject(map, ti->name, fname);
            total_size += ti->end - ti->begin;
        }
        if (plan->extra != NULL && plan->extra_shard == k) {
            memset(&wt[n], 0, sizeof wt[n]);
            wt[n].name = plan->extra;
            wt[n].dtype = KV_DTYPE_F32;
            wt[n].rank = 1;
            wt[n].shape[0] = 1;
            wt[n].data = &extra_value;
            n++;
            if (plan->extra_listed) cJSON_AddStringToObject(map, plan->extra, fname);
        }
        uint8_t *shard;
        size_t shard_len;
        ck_assert_msg(kv_st_serialize(wt, n, &shard, &shard_len, &err) == KV_OK, "%s", err.msg);
        temp_write(t, fname, shard, shard_len);
        free(shard);
    }
    cJSON_AddNumberToObject(meta, "total_size", (double)total_size);
    if (plan->edit != NULL) plan->edit(map);
    char *text = cJSON_Print(index);
    ck_assert_ptr_nonnull(text);
    temp_write(t, KV_SHARDS_INDEX_NAME, text, strlen(text));
    free(text);
    cJSON_Delete(index);
    free(wt);
    kv_st_close(&tab);
}

/* A tiny fixture (fixtures/fixture.c) of family f: config text and image. */
static void fixture_tiny(KvFamily f, char **json, uint8_t **st, size_t *st_len) {
    KvConfig cfg;
    KvError err = {{0}};
    ck_assert_int_eq(kv_fixture_config(f, KV_SIZE_TINY, &cfg, &err), KV_OK);
    KvStatus s = kv_fixture_build(&cfg, KV_FIXTURE_DEFAULT_SEED, st, st_len, json, &err);
    ck_assert_msg(s == KV_OK, "fixture build: %s", err.msg);
}

/* The mistral corpus base: config text and image. */
static void corpus_base(char **json, uint8_t **st, size_t *st_len) {
    KvConfig cfg;
    corpus_config(KV_FAMILY_MISTRAL, &cfg);
    *json = kv_config_to_json(&cfg);
    ck_assert_ptr_nonnull(*json);
    corpus_image(&cfg, CORPUS_F32, false, st, st_len);
}

/* True when p lies inside one of the shards' mappings. */
static bool inside_shards(const KvShards *s, const void *p) {
    for (size_t f = 0; f < s->n_files; f++) {
        if (inside(p, s->files[f].map, s->files[f].map_len)) return true;
    }
    return false;
}

/* A sharded copy of each tiny fixture is the same model as the single file:
 * the same kv_model_hash, every weight used in place from a shard mapping
 * (F32, aligned), and everything released on free. Loops: (family, number
 * of shards) in (gemma2, 3), (mistral, 3), (mistral, 1). */
START_TEST(test_sharded_loads) {
    KvFamily family = _i == 0 ? KV_FAMILY_GEMMA2 : KV_FAMILY_MISTRAL;
    int n_shards = _i == 2 ? 1 : 3;
    char *json;
    uint8_t *img;
    size_t len;
    fixture_tiny(family, &json, &img, &len);
    KvModel single, sharded;
    KvError err = {{0}};
    ck_assert_int_eq(kv_model_load_memory(json, strlen(json), img, len, "tiny", &single, &err),
                     KV_OK);

    TempDir t;
    temp_make(&t);
    ShardPlan plan = {.n_shards = n_shards};
    shard_write(&t, json, img, len, &plan);
    model_poison(&sharded);
    KvStatus s = kv_model_load_dir(t.dir, &sharded, &err);
    ck_assert_msg(s == KV_OK, "sharded %s: %s", kv_family_name(family), err.msg);
    ck_assert_uint_eq(kv_model_hash(&sharded), kv_model_hash(&single));
    ck_assert_uint_eq(sharded.weight_bytes, single.weight_bytes);
    ck_assert_int_eq(memcmp(&sharded.config, &single.config, sizeof single.config), 0);
    ck_assert_ptr_null(sharded.st.map); /* no single file */
    ck_assert_uint_eq(sharded.shards.n_files, (size_t)n_shards);
    char p[512];
    temp_path(&t, KV_SHARDS_INDEX_NAME, p, sizeof p);
    ck_assert_str_eq(sharded.shards.label, p);
    ck_assert_uint_eq(sharded.n_owned, 0);
    NamedPtr *np = test_alloc((3 + (size_t)single.config.num_layers * 11) * sizeof *np);
    size_t nn = model_named(&sharded, np);
    for (size_t i = 0; i < nn; i++) {
        ck_assert_msg(inside_shards(&sharded.shards, np[i].p.data), "%s not used in place from a shard",
                      np[i].name);
    }
    free(np);
    kv_model_free(&sharded);
    ck_assert(model_is_zero(&sharded));
    kv_model_free(&single);
    temp_remove_all(&t);
    free(img);
    free(json);
}
END_TEST

/* With both model.safetensors and an index the single file is read, as
 * transformers does, and the index not at all (here it is not even JSON). */
START_TEST(test_sharded_both_present) {
    char *json;
    uint8_t *img;
    size_t len;
    corpus_base(&json, &img, &len);
    TempDir t;
    temp_make(&t);
    ShardPlan plan = {.n_shards = 2};
    shard_write(&t, json, img, len, &plan);
    temp_write(&t, "model.safetensors", img, len);
    KvModel m;
    KvError err = {{0}};
    ck_assert_msg(kv_model_load_dir(t.dir, &m, &err) == KV_OK, "%s", err.msg);
    ck_assert_ptr_nonnull(m.st.map);
    ck_assert_uint_eq(m.shards.n_files, 0);
    uint64_t h = kv_model_hash(&m);
    kv_model_free(&m);
    temp_write(&t, KV_SHARDS_INDEX_NAME, "{\"weight_map\": ", 15);
    ck_assert_msg(kv_model_load_dir(t.dir, &m, &err) == KV_OK, "%s", err.msg);
    ck_assert_ptr_nonnull(m.st.map);
    ck_assert_uint_eq(kv_model_hash(&m), h);
    kv_model_free(&m);
    temp_remove_all(&t);
    free(img);
    free(json);
}
END_TEST

/* Index edits (the weight_map object is passed in). */
static void edit_value_number(cJSON *map) {
    cJSON_ReplaceItemInObjectCaseSensitive(map, "model.norm.weight", cJSON_CreateNumber(2));
}
static const char *g_escape; /* the shard name edit_escape writes */
static void edit_escape(cJSON *map) {
    cJSON_ReplaceItemInObjectCaseSensitive(map, "model.norm.weight", cJSON_CreateString(g_escape));
}
static void edit_ghost(cJSON *map) {
    cJSON_AddStringToObject(map, "ghost.weight", "model-00001-of-00002.safetensors");
}
static void edit_wrong_shard(cJSON *map) {
    /* model.norm.weight sorts last: it is in the second shard */
    cJSON_ReplaceItemInObjectCaseSensitive(map, "model.norm.weight",
                                           cJSON_CreateString("model-00001-of-00002.safetensors"));
}
/* Loads t expecting KV_ERR_INPUT, a zeroed model, and a message holding
 * every non-NULL word (file names, tensor names, the reason). */
static void sharded_bad(const TempDir *t, const char *w1, const char *w2, const char *w3,
                        const char *w4) {
    KvModel m;
    KvError err = {{0}};
    model_poison(&m);
    KvStatus s = kv_model_load_dir(t->dir, &m, &err);
    ck_assert_msg(s == KV_ERR_INPUT, "expected KV_ERR_INPUT, found %d (%s)", (int)s, err.msg);
    ck_assert_msg(model_is_zero(&m), "failed load left a partial model: %s", err.msg);
    const char *words[] = {w1, w2, w3, w4};
    for (int k = 0; k < 4; k++) {
        if (words[k] == NULL) continue;
        ck_assert_msg(strstr(err.msg, words[k]) != NULL, "message lacks \"%s\": %s", words[k],
                      err.msg);
    }
}

START_TEST(test_sharded_errors) {
    char *json;
    uint8_t *img;
    size_t len;
    corpus_base(&json, &img, &len);
    TempDir t;
    temp_make(&t);
    char index[512], s1[512], s2[512];
    temp_path(&t, KV_SHARDS_INDEX_NAME, index, sizeof index);
    temp_path(&t, "model-00001-of-00002.safetensors", s1, sizeof s1);
    temp_path(&t, "model-00002-of-00002.safetensors", s2, sizeof s2);
    const char *q_bias = "model.layers.0.self_attn.q_proj.bias";

    /* the index: not JSON, not an object, no weight_map, weight_map not an
     * object, a value not a string, a tensor listed twice */
    ShardPlan ok = {.n_shards = 2};
    shard_write(&t, json, img, len, &ok);
    temp_write(&t, KV_SHARDS_INDEX_NAME, "{\"weight_map\": {", 16);
    sharded_bad(&t, index, "valid JSON", NULL, NULL);
    temp_write(&t, KV_SHARDS_INDEX_NAME, "[]", 2);
    sharded_bad(&t, index, "expected a JSON object", NULL, NULL);
    temp_write(&t, KV_SHARDS_INDEX_NAME, "{\"metadata\": {}}", 16);
    sharded_bad(&t, index, "'weight_map'", "missing", NULL);
    temp_write(&t, KV_SHARDS_INDEX_NAME, "{\"weight_map\": []}", 18);
    sharded_bad(&t, index, "'weight_map'", "an array", NULL);
    ShardPlan plan = {.n_shards = 2, .edit = edit_value_number};
    shard_write(&t, json, img, len, &plan);
    sharded_bad(&t, index, "tensor 'model.norm.weight'", "a shard file name (a string)",
                "number 2");
    const char *dup = "{\"weight_map\": {"
                      "\"model.norm.weight\": \"model-00002-of-00002.safetensors\", "
                      "\"model.norm.weight\": \"model-00001-of-00002.safetensors\"}}";
    temp_write(&t, KV_SHARDS_INDEX_NAME, dup, strlen(dup));
    sharded_bad(&t, index, "'weight_map.model.norm.weight'", "repeated", NULL);

    /* shard names that would leave the directory; refused before opening */
    static const char *escapes[] = {"../model-00002-of-00002.safetensors", "..", ".", "",
                                    "sub/model-00002-of-00002.safetensors",
                                    "/etc/passwd"};
    for (size_t i = 0; i < sizeof escapes / sizeof escapes[0]; i++) {
        g_escape = escapes[i];
        plan = (ShardPlan){.n_shards = 2, .edit = edit_escape};
        shard_write(&t, json, img, len, &plan);
        sharded_bad(&t, index, "tensor 'model.norm.weight'", "no '/', not '.' or '..'", escapes[i]);
    }

    /* a shard the map names is missing: the message names the index, the
     * first tensor (by name) mapped to it, and its path */
    shard_write(&t, json, img, len, &ok);
    KvSafetensors tab;
    KvError err = {{0}};
    ck_assert_int_eq(kv_st_parse(img, len, "img", &tab, &err), KV_OK);
    size_t first2 = 0;
    while (shard_of(first2, tab.n_tensors, 2) != 1) first2++;
    char first2_name[KV_ST_MAX_NAME + 16];
    snprintf(first2_name, sizeof first2_name, "tensor '%s'", tab.tensors[first2].name);
    kv_st_close(&tab);
    ck_assert_int_eq(unlink(s2), 0);
    sharded_bad(&t, index, first2_name, s2, "missing");
    /* ... or not a safetensors file: validated exactly like a single file */
    temp_write(&t, "model-00002-of-00002.safetensors", img, 100);
    sharded_bad(&t, s2, "header length", NULL, NULL);

    /* the map and the shards disagree */
    plan = (ShardPlan){.n_shards = 2, .edit = edit_ghost};
    shard_write(&t, json, img, len, &plan);
    sharded_bad(&t, s1, "tensor 'ghost.weight'", index, "missing");
    plan = (ShardPlan){.n_shards = 2, .edit = edit_wrong_shard};
    shard_write(&t, json, img, len, &plan);
    sharded_bad(&t, s1, "tensor 'model.norm.weight'", "missing", s2);
    plan = (ShardPlan){.n_shards = 2, .extra = q_bias, .extra_shard = 0};
    shard_write(&t, json, img, len, &plan);
    sharded_bad(&t, s1, "tensor 'model.layers.0.self_attn.q_proj.bias'", index,
                "expected an entry");
    plan = (ShardPlan){.n_shards = 2, .extra = "model.norm.weight", .extra_shard = 0};
    shard_write(&t, json, img, len, &plan);
    sharded_bad(&t, "tensor 'model.norm.weight'", "duplicated", s1, s2);

    /* a tensor the family needs is in no shard and not in the map */
    plan = (ShardPlan){.n_shards = 2, .drop = "model.norm.weight"};
    shard_write(&t, json, img, len, &plan);
    sharded_bad(&t, index, "tensor 'model.norm.weight'", "missing", "[16]");
    plan = (ShardPlan){.n_shards = 2, .drop = "lm_head.weight"};
    shard_write(&t, json, img, len, &plan);
    sharded_bad(&t, index, "tensor 'lm_head.weight'", "missing", NULL);

    /* listed and present, but not used by the family */
    plan = (ShardPlan){.n_shards = 2, .extra = q_bias, .extra_shard = 1, .extra_listed = true};
    shard_write(&t, json, img, len, &plan);
    sharded_bad(&t, s2, "tensor 'model.layers.0.self_attn.q_proj.bias'",
                "is not used by family mistral", "silently drop it");

    /* the index is a directory */
    ck_assert_int_eq(unlink(index), 0);
    ck_assert_int_eq(mkdir(index, 0700), 0);
    sharded_bad(&t, index, "expected a regular file, found a directory", NULL, NULL);
    ck_assert_int_eq(rmdir(index), 0);
    /* neither model.safetensors nor an index: named as before */
    char single[512];
    temp_path(&t, "model.safetensors", single, sizeof single);
    sharded_bad(&t, single, "cannot open", NULL, NULL);

    /* and the plain sharded copy still loads after all that */
    shard_write(&t, json, img, len, &ok);
    KvModel m;
    ck_assert_msg(kv_model_load_dir(t.dir, &m, &err) == KV_OK, "%s", err.msg);
    kv_model_free(&m);
    temp_remove_all(&t);
    free(img);
    free(json);
}
END_TEST

/* A tensor the family does not use, added to a tiny checkpoint on disk, is
 * refused naming the file, the tensor and the family; the ignore-listed ones
 * (saved rotary buffers for mistral, a stored lm_head.weight when tied) load
 * and leave the model unchanged. */
/* gpt_oss checkpoints stored as gpt-oss ships them (MXFP4 experts): each
 * malformed part is refused naming the file, the tensor and what was
 * expected (blocks of the wrong shape, scales missing, of the wrong length
 * or dtype, a float stack and its blocks both absent); a missing sink names
 * the sink. */
START_TEST(test_gpt_oss_checkpoint_refusals) {
    KvConfig cfg;
    KvError err = {{0}};
    ck_assert_int_eq(kv_fixture_config(KV_FAMILY_GPT_OSS, KV_SIZE_TINY, &cfg, &err), KV_OK);
    char *json;
    uint8_t *img;
    size_t len;
    ck_assert_int_eq(kv_fixture_build_dtype(&cfg, 3, KV_DTYPE_F4, &img, &len, &json, &err), KV_OK);
    KvModel ok;
    ck_assert_msg(kv_model_load_memory(json, strlen(json), img, len, "t", &ok, &err) == KV_OK,
                  "%s", err.msg);
    ck_assert_int_eq(ok.layers[1].experts_gate_up.dtype, KV_DTYPE_F4);
    ck_assert_ptr_nonnull(ok.layers[1].experts_gate_up.scales);
    kv_model_free(&ok);
    KvSafetensors tab;
    ck_assert_int_eq(kv_st_parse(img, len, "img", &tab, &err), KV_OK);
    static const char *const blocks = "model.layers.1.mlp.experts.gate_up_proj_blocks";
    static const char *const scales = "model.layers.1.mlp.experts.gate_up_proj_scales";
    static const char *const sink = "model.layers.2.self_attn.sinks";
    static const struct {
        const char *victim;
        int how; /* 0: drop, 1: one block fewer per row, 2: dtype I8 */
        const char *want[3];
    } cases[] = {
        {blocks, 1, {blocks, "expected shape [4, 512, 4, 16] (MXFP4), found [4, 512, 3, 16]", ""}},
        {scales, 0, {scales, "expected shape [4, 512, 4] (MXFP4), found no such tensor", ""}},
        {scales, 1, {scales, "expected shape [4, 512, 4] (MXFP4), found [4, 512, 3]", ""}},
        {scales, 2, {scales, "expected dtype U8 (MXFP4), found I8", ""}},
        {blocks, 0, {"model.layers.1.mlp.experts.gate_up_proj'", "_blocks' and", "missing"}},
        {sink, 0, {sink, "missing", ""}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        KvStWriteTensor *wt = test_alloc((tab.n_tensors + 1) * sizeof *wt);
        size_t n = 0;
        for (size_t i = 0; i < tab.n_tensors; i++) {
            const char *name = tab.tensors[i].name;
            const bool victim = strcmp(name, cases[c].victim) == 0;
            if (victim && cases[c].how == 0) continue;
            memset(&wt[n], 0, sizeof wt[n]);
            wt[n].name = name;
            wt[n].dtype = tab.tensors[i].dtype;
            wt[n].rank = tab.tensors[i].rank;
            memcpy(wt[n].shape, tab.tensors[i].shape, sizeof wt[n].shape);
            wt[n].data = tab.data + tab.tensors[i].begin;
            if (victim && cases[c].how == 1) wt[n].shape[2]--; /* reads a prefix of the data */
            if (victim && cases[c].how == 2) wt[n].dtype = KV_DTYPE_I8;
            n++;
        }
        uint8_t *ext;
        size_t ext_len;
        ck_assert_int_eq(kv_st_serialize(wt, n, &ext, &ext_len, &err), KV_OK);
        free(wt);
        KvModel m;
        model_poison(&m);
        ck_assert_int_eq(kv_model_load_memory(json, strlen(json), ext, ext_len, "t", &m, &err),
                         KV_ERR_INPUT);
        ck_assert_msg(model_is_zero(&m), "case %zu: a partial model", c);
        ck_assert_msg(strstr(err.msg, "t/model.safetensors") != NULL, "%s", err.msg);
        for (int k = 0; k < 3; k++) {
            ck_assert_msg(strstr(err.msg, cases[c].want[k]) != NULL, "case %zu: '%s' not in: %s",
                          c, cases[c].want[k], err.msg);
        }
        free(ext);
    }
    kv_st_close(&tab);
    free(json);
    free(img);
}
END_TEST

START_TEST(test_unused_tensors) {
    for (int f = 0; f < 2; f++) {
        KvFamily family = f == 0 ? KV_FAMILY_GEMMA2 : KV_FAMILY_MISTRAL;
        char *json;
        uint8_t *img;
        size_t len;
        fixture_tiny(family, &json, &img, &len);
        KvModel plain, m;
        KvError err = {{0}};
        ck_assert_int_eq(kv_model_load_memory(json, strlen(json), img, len, "t", &plain, &err),
                         KV_OK);
        KvSafetensors tab;
        ck_assert_int_eq(kv_st_parse(img, len, "img", &tab, &err), KV_OK);

        /* the image again with one or more extra tensors, written as a
         * single model.safetensors */
        const char *bias[] = {"model.layers.0.self_attn.q_proj.bias"};
        const char *inv_freq[] = {"model.layers.0.self_attn.rotary_emb.inv_freq",
                                  "model.layers.1.self_attn.rotary_emb.inv_freq",
                                  "model.layers.2.self_attn.rotary_emb.inv_freq",
                                  "model.layers.3.self_attn.rotary_emb.inv_freq"};
        const char *lm_head[] = {"lm_head.weight"};
        struct {
            const char **names;
            size_t n;
            bool loads;
        } cases[] = {
            {bias, 1, false},
            {inv_freq, 4, family == KV_FAMILY_MISTRAL},
            {lm_head, 1, family == KV_FAMILY_GEMMA2}, /* gemma2 tied; mistral has one */
        };
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
            if (family == KV_FAMILY_MISTRAL && cases[c].names == lm_head) continue;
            KvStWriteTensor *wt = test_alloc((tab.n_tensors + 4) * sizeof *wt);
            static const float vals[16] = {1.0f};
            size_t n = 0;
            for (size_t i = 0; i < tab.n_tensors; i++, n++) {
                memset(&wt[n], 0, sizeof wt[n]);
                wt[n].name = tab.tensors[i].name;
                wt[n].dtype = tab.tensors[i].dtype;
                wt[n].rank = tab.tensors[i].rank;
                memcpy(wt[n].shape, tab.tensors[i].shape, sizeof wt[n].shape);
                wt[n].data = tab.data + tab.tensors[i].begin;
            }
            for (size_t k = 0; k < cases[c].n; k++, n++) {
                memset(&wt[n], 0, sizeof wt[n]);
                wt[n].name = cases[c].names[k];
                wt[n].dtype = KV_DTYPE_F32;
                wt[n].rank = 1;
                wt[n].shape[0] = 16; /* head_dim / 2 of the tiny fixtures */
                wt[n].data = vals;
            }
            uint8_t *ext;
            size_t ext_len;
            ck_assert_int_eq(kv_st_serialize(wt, n, &ext, &ext_len, &err), KV_OK);
            free(wt);
            TempDir t;
            temp_make(&t);
            temp_write(&t, "config.json", json, strlen(json));
            temp_write(&t, "model.safetensors", ext, ext_len);
            if (cases[c].loads) {
                ck_assert_msg(kv_model_load_dir(t.dir, &m, &err) == KV_OK, "%s %s: %s",
                              kv_family_name(family), cases[c].names[0], err.msg);
                ck_assert_uint_eq(kv_model_hash(&m), kv_model_hash(&plain));
                kv_model_free(&m);
            } else {
                char file[512], tensor[KV_ST_MAX_NAME + 16], fam[64];
                temp_path(&t, "model.safetensors", file, sizeof file);
                snprintf(tensor, sizeof tensor, "tensor '%s'", cases[c].names[0]);
                snprintf(fam, sizeof fam, "is not used by family %s", kv_family_name(family));
                sharded_bad(&t, file, tensor, fam, "(the reference would silently drop it)");
            }
            temp_remove_all(&t);
            free(ext);
        }
        kv_st_close(&tab);
        kv_model_free(&plain);
        free(img);
        free(json);
    }
}
END_TEST

/* ---- fixtures streamed to disk ----------------------------------------- */

/* x rounded to BF16 bits, by distance: the two BF16 neighbours of x (its
 * bits truncated, and one unit further out) and the nearer in double
 * arithmetic, the one with an even last bit on a tie. Independent of
 * kv_f32_to_bf16's integer trick. Finite x only. */
static uint16_t ref_round_bf16(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    const uint32_t lo = u & 0xffff0000u, hi = lo + 0x10000u;
    float flo, fhi;
    memcpy(&flo, &lo, sizeof flo);
    if ((hi & 0x7f800000u) == 0x7f800000u) {
        fhi = x < 0 ? -INFINITY : INFINITY; /* one past the largest: infinity */
    } else {
        memcpy(&fhi, &hi, sizeof fhi);
    }
    const double dlo = fabs((double)x - (double)flo);
    /* beyond the largest BF16, the distance to "infinity" is to 2^128, as
     * IEEE rounding counts it */
    const double dhi = isinf(fhi) ? fabs(ldexp(x < 0 ? -1.0 : 1.0, 128) - (double)x)
                                  : fabs((double)fhi - (double)x);
    if (dlo < dhi) return (uint16_t)(lo >> 16);
    if (dhi < dlo) return (uint16_t)(hi >> 16);
    return (uint16_t)(((lo >> 16) & 1u) == 0 ? lo >> 16 : hi >> 16);
}

START_TEST(test_f32_to_bf16) {
    uint8_t out[2 * 8];
    /* every BF16 value comes back as itself; NaNs stay NaN */
    for (uint32_t b = 0; b < 65536; b++) {
        const float f = ref_bf16((uint16_t)b);
        kv_f32_to_bf16(&f, 1, out + 1); /* odd address: any alignment */
        const uint16_t got = (uint16_t)(out[1] | (out[2] << 8));
        if (isnan(f)) {
            EXPECT(isnan(ref_bf16(got)), "BF16 NaN 0x%04x became 0x%04x", b, got);
        } else {
            EXPECT(got == b, "BF16 0x%04x: round trip gave 0x%04x", b, got);
        }
    }
    /* ties to even, and the nearest otherwise */
    static const uint32_t bits[] = {
        0x3f808000u, /* 1 + 2^-8: tie, 1.0's last bit even -> 0x3f80 */
        0x3f818000u, /* tie between 0x3f81 and 0x3f82 -> 0x3f82 */
        0x3f808001u, /* just above the tie -> 0x3f81 */
        0xbf807fffu, /* just below the tie, negative -> 0xbf80 */
        0x7f7fffffu, /* the largest float: past the largest BF16 -> inf */
        0x00008000u, /* subnormal tie -> 0 */
        0x00018000u, /* subnormal tie -> 0x0002 */
        0x7f7f7fffu, /* just below the largest BF16's upper tie -> 0x7f7f */
    };
    static const uint16_t want[] = {0x3f80, 0x3f82, 0x3f81, 0xbf80, 0x7f80, 0x0000, 0x0002,
                                    0x7f7f};
    float f[8];
    memcpy(f, bits, sizeof f);
    kv_f32_to_bf16(f, 8, out);
    for (int i = 0; i < 8; i++) {
        const uint16_t got = (uint16_t)(out[2 * i] | (out[2 * i + 1] << 8));
        ck_assert_msg(got == want[i] && got == ref_round_bf16(f[i]),
                      "0x%08x: expected 0x%04x (reference 0x%04x), found 0x%04x", bits[i],
                      want[i], ref_round_bf16(f[i]), got);
    }
    /* pseudo-random finite floats of every exponent */
    KvPrng g = kv_prng_seed(17);
    for (int i = 0; i < 200000; i++) {
        uint32_t u = (uint32_t)kv_prng_next(&g);
        if ((u & 0x7f800000u) == 0x7f800000u) continue;
        float x;
        memcpy(&x, &u, sizeof x);
        kv_f32_to_bf16(&x, 1, out);
        const uint16_t got = (uint16_t)(out[0] | (out[1] << 8));
        EXPECT(got == ref_round_bf16(x), "0x%08x: expected 0x%04x, found 0x%04x", u,
               ref_round_bf16(x), got);
    }
    const float inf = INFINITY, ninf = -INFINITY;
    kv_f32_to_bf16(&inf, 1, out);
    ck_assert(out[0] == 0x80 && out[1] == 0x7f);
    kv_f32_to_bf16(&ninf, 1, out);
    ck_assert(out[0] == 0x80 && out[1] == 0xff);
}
END_TEST

/* The whole of a file (caller frees); *len its size. */
static uint8_t *read_whole(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    ck_assert_msg(f != NULL, "%s: %s", path, strerror(errno));
    ck_assert_int_eq(fseek(f, 0, SEEK_END), 0);
    long n = ftell(f);
    ck_assert_int_ge(n, 0);
    ck_assert_int_eq(fseek(f, 0, SEEK_SET), 0);
    uint8_t *buf = test_alloc((size_t)n);
    ck_assert_uint_eq(fread(buf, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *len = (size_t)n;
    return buf;
}

static bool path_exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0;
}

/* The tiny fixtures of every family, each in F32 and BF16. */
static const struct {
    KvFamily family;
    KvFixtureSize size;
} k_stream_fixtures[] = {
    {KV_FAMILY_GEMMA2, KV_SIZE_TINY},  {KV_FAMILY_MISTRAL, KV_SIZE_TINY},
    {KV_FAMILY_QWEN2, KV_SIZE_TINY},   {KV_FAMILY_GEMMA3, KV_SIZE_TINY},
    {KV_FAMILY_GPT_OSS, KV_SIZE_TINY}, {KV_FAMILY_MISTRAL, KV_SIZE_TINY_MIXED},
};
#define K_STREAM_FIXTURES ((int)(sizeof k_stream_fixtures / sizeof k_stream_fixtures[0]))
/* each fixture in F32 and BF16, and gpt_oss's with MXFP4 experts */
#define K_STREAM_CASES (2 * K_STREAM_FIXTURES + 1)

/* The streaming writer's files are byte for byte the in-memory builder's
 * image and config.json (the big fixtures can only be streamed, so what
 * the tiny ones show here is what stands for them); the BF16 file holds
 * each F32 value rounded to nearest even, and nothing is left beside. */
START_TEST(test_fixture_streamed_bytes) {
    const bool mx = _i == 2 * K_STREAM_FIXTURES;
    const KvFamily family = mx ? KV_FAMILY_GPT_OSS : k_stream_fixtures[_i / 2].family;
    const KvFixtureSize size = mx ? KV_SIZE_TINY : k_stream_fixtures[_i / 2].size;
    const KvDtype dtype = mx ? KV_DTYPE_F4 : _i % 2 == 0 ? KV_DTYPE_F32 : KV_DTYPE_BF16;
    KvConfig cfg;
    KvError err = {{0}};
    ck_assert_int_eq(kv_fixture_config(family, size, &cfg, &err), KV_OK);
    uint8_t *img = NULL;
    size_t img_len = 0;
    char *json = NULL;
    const uint64_t seed = 1234567 + (uint64_t)_i;
    ck_assert_msg(kv_fixture_build_dtype(&cfg, seed, dtype, &img, &img_len, &json, &err) == KV_OK,
                  "%s", err.msg);

    TempDir t;
    temp_make(&t);
    uint64_t file_bytes = 0;
    KvStatus s = kv_fixture_write_streamed(t.dir, &cfg, seed, dtype, &file_bytes, &err);
    ck_assert_msg(s == KV_OK, "%s", err.msg);
    ck_assert_uint_eq(file_bytes, img_len);
    char p[512];
    size_t len = 0;
    temp_path(&t, "model.safetensors", p, sizeof p);
    uint8_t *disk = read_whole(p, &len);
    ck_assert_uint_eq(len, img_len);
    size_t first = 0;
    while (first < len && disk[first] == img[first]) first++;
    ck_assert_msg(first == len, "%s %s %s: streamed file differs from the in-memory image at byte "
                  "%zu of %zu", kv_family_name(family), size == KV_SIZE_TINY ? "tiny" : "mixed",
                  kv_dtype_name(dtype), first, len);
    free(disk);
    temp_path(&t, "config.json", p, sizeof p);
    uint8_t *cj = read_whole(p, &len);
    ck_assert_uint_eq(len, strlen(json));
    ck_assert_int_eq(memcmp(cj, json, len), 0);
    free(cj);
    temp_path(&t, ".model.safetensors.tmp", p, sizeof p);
    ck_assert_msg(!path_exists(p), "%s left behind", p);
    temp_path(&t, ".config.json.tmp", p, sizeof p);
    ck_assert_msg(!path_exists(p), "%s left behind", p);

    if (dtype == KV_DTYPE_BF16) {
        /* the stored values are the F32 fixture's, rounded */
        KvModel mb, mf;
        uint8_t *fimg = NULL;
        size_t fimg_len = 0;
        char *fjson = NULL;
        ck_assert_int_eq(kv_fixture_build(&cfg, seed, &fimg, &fimg_len, &fjson, &err), KV_OK);
        ck_assert_msg(kv_model_load_memory(fjson, strlen(fjson), fimg, fimg_len, "f32", &mf,
                                           &err) == KV_OK, "%s", err.msg);
        ck_assert_msg(kv_model_load_dir(t.dir, &mb, &err) == KV_OK, "%s", err.msg);
        const int64_t n = cfg.vocab_size * cfg.hidden_size;
        for (int64_t i = 0; i < n; i++) {
            const float f = kv_mat_at(mf.embed, i), b = kv_mat_at(mb.embed, i);
            const uint16_t want = ref_round_bf16(f);
            EXPECT(same_float(b, ref_bf16(want)), "embed[%" PRId64 "]: %a -> %a, expected %a", i,
                   (double)f, (double)b, (double)ref_bf16(want));
        }
        for (int64_t i = 0; i < cfg.hidden_size; i++) {
            EXPECT(same_float(mb.final_norm[i], ref_bf16(ref_round_bf16(mf.final_norm[i]))),
                   "final_norm[%" PRId64 "]", i);
        }
        ck_assert(same_float(kv_mat_at(mb.layers[1].wv, 7),
                             ref_bf16(ref_round_bf16(kv_mat_at(mf.layers[1].wv, 7)))));
        kv_model_free(&mb);
        kv_model_free(&mf);
        free(fimg);
        free(fjson);
    }
    temp_remove(&t);
    free(img);
    free(json);
}
END_TEST

/* Refusals of the streaming writer and of the 2b size: an unwritable
 * directory, a dtype it does not write, a file that cannot grow (a full
 * disk, as RLIMIT_FSIZE makes it) with the previous fixture left intact and
 * no temporary; 2b for any family but gemma2, and as an in-memory name. */
START_TEST(test_fixture_stream_refusals) {
    KvConfig cfg;
    KvError err = {{0}};
    ck_assert_int_eq(kv_fixture_config(KV_FAMILY_GEMMA2, KV_SIZE_TINY, &cfg, &err), KV_OK);
    TempDir t;
    temp_make(&t);
    char p[512], q[600];

    /* a directory below a regular file */
    temp_write(&t, "config.json", "{}", 2);
    temp_path(&t, "config.json", p, sizeof p);
    snprintf(q, sizeof q, "%s/sub", p);
    ck_assert_int_eq(kv_fixture_write_streamed(q, &cfg, 1, KV_DTYPE_F32, NULL, &err),
                     KV_ERR_INPUT);
    ck_assert_msg(strstr(err.msg, q) != NULL && strstr(err.msg, "cannot create directory"),
                  "%s", err.msg);
    ck_assert_int_eq(kv_fixture_write_streamed(p, &cfg, 1, KV_DTYPE_F32, NULL, &err),
                     KV_ERR_INPUT);
    ck_assert_msg(strstr(err.msg, "not a directory") != NULL, "%s", err.msg);
    unlink(p);

    /* only F32, BF16, and MXFP4 for a model with experts */
    ck_assert_int_eq(kv_fixture_write_streamed(t.dir, &cfg, 1, KV_DTYPE_F16, NULL, &err),
                     KV_ERR_INPUT);
    ck_assert_msg(strstr(err.msg, "expected F32, BF16 or MXFP4 (gpt_oss's experts only), found "
                                  "F16") != NULL, "%s", err.msg);
    ck_assert_int_eq(kv_fixture_write_streamed(t.dir, &cfg, 1, KV_DTYPE_F4, NULL, &err),
                     KV_ERR_INPUT);
    ck_assert_msg(strstr(err.msg, "MXFP4 for a model without experts") != NULL, "%s", err.msg);
    uint8_t *img = NULL;
    size_t img_len = 0;
    char *json = NULL;
    ck_assert_int_eq(kv_fixture_build_dtype(&cfg, 1, KV_DTYPE_I32, &img, &img_len, &json, &err),
                     KV_ERR_INPUT);
    ck_assert_ptr_null(img);

    /* a full disk midway: the previous fixture stays, byte for byte */
    uint64_t before_len = 0;
    ck_assert_int_eq(kv_fixture_write_streamed(t.dir, &cfg, 1, KV_DTYPE_F32, &before_len, &err),
                     KV_OK);
    temp_path(&t, "model.safetensors", p, sizeof p);
    size_t len = 0;
    uint8_t *before = read_whole(p, &len);
    struct rlimit old;
    ck_assert_int_eq(getrlimit(RLIMIT_FSIZE, &old), 0);
    struct rlimit small = old;
    small.rlim_cur = 100000; /* the tiny file is 2.6 MB */
    void (*old_xfsz)(int) = signal(SIGXFSZ, SIG_IGN); /* write() fails with EFBIG instead */
    ck_assert_int_eq(setrlimit(RLIMIT_FSIZE, &small), 0);
    KvStatus s = kv_fixture_write_streamed(t.dir, &cfg, 2, KV_DTYPE_F32, NULL, &err);
    ck_assert_int_eq(setrlimit(RLIMIT_FSIZE, &old), 0);
    signal(SIGXFSZ, old_xfsz);
    ck_assert_int_eq(s, KV_ERR_INPUT);
    ck_assert_msg(strstr(err.msg, p) != NULL && strstr(err.msg, "cannot write: File too large"),
                  "%s", err.msg);
    size_t after_len = 0;
    uint8_t *after = read_whole(p, &after_len);
    ck_assert_uint_eq(after_len, len);
    ck_assert_int_eq(memcmp(before, after, len), 0);
    temp_path(&t, ".model.safetensors.tmp", q, sizeof q);
    ck_assert_msg(!path_exists(q), "%s left behind", q);
    free(before);
    free(after);
    temp_remove(&t);

    /* 2b: gemma2 only, and never built in memory */
    for (int f = 0; f <= KV_FAMILY_GPT_OSS; f++) {
        if (f == KV_FAMILY_GEMMA2) continue;
        ck_assert_int_eq(kv_fixture_config((KvFamily)f, KV_SIZE_2B, &cfg, &err), KV_ERR_INPUT);
        ck_assert_msg(strstr(err.msg, "2b size") != NULL && strstr(err.msg, "gemma2 only"),
                      "%s", err.msg);
    }
    KvFamily fam;
    KvFixtureSize size;
    ck_assert_int_eq(kv_fixture_lookup("gemma2-2b", &fam, &size, &err), KV_ERR_INPUT);
    ck_assert_msg(strstr(err.msg, "--size 2b") != NULL && strstr(err.msg, "--model DIR"), "%s",
                  err.msg);
}
END_TEST

/* 2b is google/gemma-2-2b's Gemma2Config, and survives config.json. */
START_TEST(test_fixture_2b_config) {
    KvConfig c, back;
    KvError err = {{0}};
    ck_assert_int_eq(kv_fixture_config(KV_FAMILY_GEMMA2, KV_SIZE_2B, &c, &err), KV_OK);
    ck_assert_int_eq(c.vocab_size, 256000);
    ck_assert_int_eq(c.hidden_size, 2304);
    ck_assert_int_eq(c.intermediate_size, 9216);
    ck_assert_int_eq(c.num_layers, 26);
    ck_assert_int_eq(c.num_heads, 8);
    ck_assert_int_eq(c.num_kv_heads, 4);
    ck_assert_int_eq(c.head_dim, 256);
    ck_assert_int_eq(c.sliding_window, 4096);
    ck_assert_int_eq(c.max_position_embeddings, 8192);
    ck_assert(c.query_pre_attn_scalar == 256.0);
    ck_assert(c.attn_logit_softcapping == 50.0 && c.final_logit_softcapping == 30.0);
    ck_assert(c.rms_norm_eps == 1e-6 && c.rope_theta == 10000.0);
    ck_assert(c.tie_word_embeddings);
    for (int64_t i = 0; i < c.num_layers; i++) {
        ck_assert_int_eq(c.layer_sliding[i], i % 2 == 0); /* sliding, full, sliding, ... */
    }
    /* gemma-2-2b's parameter count: embedding + 26 layers + final norm */
    const int64_t h = 2304, layer = 2048 * h * 2 + 1024 * h * 2 + 3 * 9216 * h + 4 * h;
    ck_assert_int_eq(256000 * h + 26 * layer + h, 2614341888LL);
    ck_assert_int_eq(kv_fixture_default_dtype(KV_SIZE_2B), KV_DTYPE_BF16);
    ck_assert_int_eq(kv_fixture_default_dtype(KV_SIZE_MEDIUM), KV_DTYPE_F32);
    ck_assert_int_eq(kv_fixture_default_dtype(KV_SIZE_TINY), KV_DTYPE_F32);
    char *json = kv_config_to_json(&c);
    ck_assert_ptr_nonnull(json);
    ck_assert_msg(kv_config_parse(json, strlen(json), "2b/config.json", &back, &err) == KV_OK,
                  "%s", err.msg);
    ck_assert_int_eq(back.sliding_window, 4096);
    ck_assert_int_eq(memcmp(back.layer_sliding, c.layer_sliding, sizeof c.layer_sliding), 0);
    ck_assert(back.attn_logit_softcapping == 50.0 && back.final_logit_softcapping == 30.0);
    ck_assert(back.query_pre_attn_scalar == 256.0);
    ck_assert_int_eq(back.vocab_size, 256000);
    ck_assert_int_eq(back.max_position_embeddings, 8192);
    free(json);
}
END_TEST

/* attn2b keeps gemma-2-2b's attention and cache exactly (the 2b size's
 * numbers) on 2 layers, gemma2 only, and is built in memory. */
START_TEST(test_fixture_attn2b_config) {
    KvConfig c, big;
    KvError err = {{0}};
    ck_assert_int_eq(kv_fixture_config(KV_FAMILY_GEMMA2, KV_SIZE_ATTN2B, &c, &err), KV_OK);
    ck_assert_int_eq(kv_fixture_config(KV_FAMILY_GEMMA2, KV_SIZE_2B, &big, &err), KV_OK);
    ck_assert_int_eq(c.num_heads, big.num_heads);
    ck_assert_int_eq(c.num_kv_heads, big.num_kv_heads);
    ck_assert_int_eq(c.head_dim, big.head_dim);
    ck_assert_int_eq(c.sliding_window, big.sliding_window);
    ck_assert(c.query_pre_attn_scalar == big.query_pre_attn_scalar);
    ck_assert(c.attn_logit_softcapping == big.attn_logit_softcapping &&
              c.final_logit_softcapping == big.final_logit_softcapping);
    ck_assert_int_eq(c.num_layers, 2);
    ck_assert_int_eq(c.layer_sliding[0], 1);
    ck_assert_int_eq(c.layer_sliding[1], 0);
    /* the seed's per-layer cache, batch 2: at least 2M floats */
    ck_assert_int_ge(2 * c.num_kv_heads * c.sliding_window * c.head_dim, 2 * 1024 * 1024);
    ck_assert(!kv_fixture_size_big(KV_SIZE_ATTN2B));
    ck_assert_int_eq(kv_fixture_config(KV_FAMILY_MISTRAL, KV_SIZE_ATTN2B, &c, &err),
                     KV_ERR_INPUT);
    ck_assert_msg(strstr(err.msg, "attn2b size") != NULL && strstr(err.msg, "gemma2 only"),
                  "%s", err.msg);
    KvFamily fam;
    KvFixtureSize size;
    ck_assert_int_eq(kv_fixture_lookup("gemma2-attn2b", &fam, &size, &err), KV_OK);
    ck_assert_int_eq(fam, KV_FAMILY_GEMMA2);
    ck_assert_int_eq(size, KV_SIZE_ATTN2B);
}
END_TEST

/* Resident bytes of the mappings overlapping [p, p + len), as
 * /proc/self/smaps counts them (pages mapped into this process); -1 when it
 * cannot be read (not Linux). */
static int64_t mapped_rss(const void *p, size_t len) {
    FILE *f = fopen("/proc/self/smaps", "r");
    if (f == NULL) return -1;
    const uintptr_t lo = (uintptr_t)p, hi = lo + len;
    char line[1024];
    bool in = false, seen = false;
    int64_t kib = 0;
    while (fgets(line, sizeof line, f) != NULL) {
        unsigned long a, b;
        char perms[8];
        long v;
        if (sscanf(line, "%lx-%lx %7s", &a, &b, perms) == 3) {
            in = a < hi && b > lo;
            seen = seen || in;
        } else if (in && sscanf(line, "Rss: %ld kB", &v) == 1) {
            kib += v;
        }
    }
    fclose(f);
    return seen ? kib * 1024 : -1;
}

/* A BF16 checkpoint's matrices are read in place, as stored (no F32 copy
 * beside the file): after the load and a read of every weight, the mapping
 * holds them resident and only the small vectors were converted; an F32
 * one, used in place and read whole, keeps every page likewise. */
START_TEST(test_stored_in_place) {
    KvConfig cfg;
    KvError err = {{0}};
    ck_assert_int_eq(kv_fixture_config(KV_FAMILY_GEMMA2, KV_SIZE_TINY, &cfg, &err), KV_OK);
    for (int k = 0; k < 2; k++) {
        const KvDtype dtype = k == 0 ? KV_DTYPE_BF16 : KV_DTYPE_F32;
        TempDir t;
        temp_make(&t);
        uint64_t bytes = 0;
        ck_assert_msg(kv_fixture_write_streamed(t.dir, &cfg, 3, dtype, &bytes, &err) == KV_OK,
                      "%s", err.msg);
        KvModel m;
        ck_assert_msg(kv_model_load_dir(t.dir, &m, &err) == KV_OK, "%s", err.msg);
        ck_assert_ptr_nonnull(m.st.map);
        (void)kv_model_hash(&m); /* reads every weight */
        const int64_t rss = mapped_rss(m.st.map, m.st.map_len);
        NamedPtr *np = test_alloc((3 + (size_t)cfg.num_layers * 11) * sizeof *np);
        const size_t nn = model_named(&m, np);
        size_t vectors = 0;
        uint64_t matrix_bytes = 0;
        for (size_t i = 0; i < nn; i++) {
            const KvTensorInfo *ti = kv_st_find(&m.st, np[i].name);
            ck_assert_ptr_nonnull(ti);
            if (np[i].matrix) {
                ck_assert_msg(np[i].p.dtype == dtype &&
                                  np[i].p.data == (const void *)(m.st.data + ti->begin),
                              "%s: a %s matrix is not read in place as stored", np[i].name,
                              kv_dtype_name(dtype));
                matrix_bytes += ti->end - ti->begin;
            } else {
                vectors++;
            }
        }
        free(np);
        /* BF16: every vector converted once (final norm, 4 norms a layer) */
        ck_assert_uint_eq(m.n_owned, dtype == KV_DTYPE_BF16 ? vectors : 0);
        ck_assert_uint_eq(vectors, 1 + (size_t)cfg.num_layers * 4);
        if (rss < 0) {
            printf("loader: stored_in_place: skipped the RSS check, /proc/self/smaps "
                   "unreadable\n");
        } else {
            ck_assert_msg(rss >= (int64_t)matrix_bytes - 4096 && rss <= (int64_t)bytes + 4096,
                          "%s: %" PRId64 " bytes of the mapping resident; the matrices hold "
                          "%" PRIu64 ", the file %" PRIu64, kv_dtype_name(dtype), rss,
                          matrix_bytes, bytes);
        }
        kv_model_free(&m);
        temp_remove(&t);
    }
}
END_TEST

/* ---- leniencies of the JSON readers ------------------------------------ */

/* config.json with a UTF-8 byte-order mark: Python's json.loads refuses it
 * ("Unexpected UTF-8 BOM"), so transformers cannot load it; cJSON skips it.
 * Refused by kv_config_parse, kv_config_load (the message names the file)
 * and, in an index, by the sharded loader. */
START_TEST(test_config_bom) {
    static const char bom_cfg[] = "\xef\xbb\xbf{\"model_type\": \"gemma2\", " REQ_FIELDS "}";
    parse_bad(bom_cfg, "byte-order mark", "t.json");
    TempDir t;
    temp_make(&t);
    temp_write(&t, "config.json", bom_cfg, strlen(bom_cfg));
    char path[512];
    temp_path(&t, "config.json", path, sizeof path);
    KvConfig c;
    KvError err = {{0}};
    memset(&c, 0x5A, sizeof c);
    ck_assert_int_eq(kv_config_load(path, &c, &err), KV_ERR_INPUT);
    ck_assert_msg(strstr(err.msg, path) != NULL && strstr(err.msg, "byte-order mark") != NULL,
                  "%s", err.msg);
    ck_assert(config_is_zero(&c));
    /* the text without the mark loads */
    temp_write(&t, "config.json", bom_cfg + 3, strlen(bom_cfg) - 3);
    ck_assert_msg(kv_config_load(path, &c, &err) == KV_OK, "%s", err.msg);
    temp_remove_all(&t);
    /* the check itself: the mark anywhere but at the start is a character
     * like any other (inside a string) */
    ck_assert_int_eq(kv_file_check_json_text("{\"a\": \"\xef\xbb\xbf\"}", 12, "w", &err), KV_OK);
    ck_assert_int_eq(kv_file_check_json_text("\xef\xbb\xbf{}", 5, "w", &err), KV_ERR_INPUT);
    ck_assert_msg(strstr(err.msg, "w: expected JSON text without a UTF-8 byte-order mark") != NULL,
                  "%s", err.msg);
}
END_TEST

/* A safetensors image whose header is `hdr` (padded with spaces to a
 * multiple of 8) followed by data_len bytes 0, 1, 2, ... */
static uint8_t *st_image(const char *hdr, size_t data_len, size_t *len) {
    size_t h = strlen(hdr), hp = (h + 7) / 8 * 8;
    *len = 8 + hp + data_len;
    uint8_t *img = test_alloc(*len);
    for (int b = 0; b < 8; b++) img[b] = (uint8_t)((uint64_t)hp >> (8 * b));
    memcpy(img + 8, hdr, h);
    memset(img + 8 + h, ' ', hp - h);
    for (size_t i = 0; i < data_len; i++) img[8 + hp + i] = (uint8_t)i;
    return img;
}

/* Shapes and data_offsets are integers to the safetensors reference reader
 * (serde_json into usize): 2.0, 2e0, 0.0 and -0 are floats there and the
 * file is refused. cJSON reads them as doubles equal to integers; the
 * reference refuses them too, naming the file, the tensor and the field. */
START_TEST(test_st_float_numbers) {
    static const struct {
        const char *shape, *offsets, *want;
    } cases[] = {
        {"[2.0,3]", "[0,24]", "tensor 'w': field 'shape[0]': expected an integer"},
        {"[2,3.0]", "[0,24]", "field 'shape[1]'"},
        {"[2,3]", "[0.0,24]", "tensor 'w': field 'data_offsets[0]': expected an integer"},
        {"[2,3]", "[0,24.0]", "field 'data_offsets[1]'"},
        {"[2,3]", "[0,2.4e1]", "found 2.4e1"},
        {"[2e0,3]", "[0,24]", "found 2e0"},
        {"[2,3]", "[0,24E0]", "found 24E0"},
        {"[-0,3]", "[0,0]", "found -0"},
        {"[2,3]", "[-0,24]", "found -0"},
        {"[2,3]", "[0,24]", NULL},
        {"[ 2 , 3 ]", "[ 0 , 24 ]", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char hdr[256];
        /* numbers elsewhere (metadata strings, other tensors) do not shift
         * which token is checked */
        snprintf(hdr, sizeof hdr,
                 "{\"__metadata__\":{\"n\":\"1.5\"},\"a\":{\"dtype\":\"F32\",\"shape\":[1],"
                 "\"data_offsets\":[24,28]},\"w\":{\"dtype\":\"F32\",\"shape\":%s,"
                 "\"data_offsets\":%s}}",
                 cases[i].shape, cases[i].offsets);
        size_t len;
        uint8_t *img = st_image(hdr, 28, &len);
        KvSafetensors st;
        KvError err = {{0}};
        KvStatus s = kv_st_parse(img, len, "f.safetensors", &st, &err);
        if (cases[i].want == NULL) {
            ck_assert_msg(s == KV_OK, "case %zu: %s", i, err.msg);
            kv_st_close(&st);
        } else {
            ck_assert_msg(s == KV_ERR_INPUT, "case %zu (shape %s, data_offsets %s) accepted", i,
                          cases[i].shape, cases[i].offsets);
            ck_assert_msg(strstr(err.msg, "f.safetensors: ") == err.msg &&
                              strstr(err.msg, cases[i].want) != NULL,
                          "case %zu: %s", i, err.msg);
            ck_assert_ptr_null(st.tensors);
        }
        free(img);
    }
}
END_TEST

/* Content after the JSON value: refused in config.json and in the shard
 * index (Python's json.loads refuses "Extra data"); whitespace is fine. */
START_TEST(test_trailing_content) {
    static const char *const tails[] = {" {\"model_type\": \"gemma2\"}", " x", "{}", "\n0",
                                        " null", "]"};
    char text[512];
    for (size_t i = 0; i < sizeof tails / sizeof tails[0]; i++) {
        snprintf(text, sizeof text, "{\"model_type\": \"gemma2\", " REQ_FIELDS "}%s", tails[i]);
        parse_bad(text, "t.json: expected only whitespace after the JSON object", "trailing");
    }
    snprintf(text, sizeof text, "{\"model_type\": \"gemma2\", " REQ_FIELDS "} \t\r\n ");
    (void)parse_ok(text);

    char *json;
    uint8_t *img;
    size_t len;
    corpus_base(&json, &img, &len);
    TempDir t;
    temp_make(&t);
    char index[512];
    temp_path(&t, KV_SHARDS_INDEX_NAME, index, sizeof index);
    ShardPlan ok = {.n_shards = 2};
    shard_write(&t, json, img, len, &ok);
    size_t ilen;
    uint8_t *itext = read_whole(index, &ilen);
    for (size_t i = 0; i < sizeof tails / sizeof tails[0]; i++) {
        char *edited = test_alloc(ilen + strlen(tails[i]) + 1);
        memcpy(edited, itext, ilen);
        memcpy(edited + ilen, tails[i], strlen(tails[i]) + 1);
        temp_write(&t, KV_SHARDS_INDEX_NAME, edited, strlen(edited));
        sharded_bad(&t, index, "expected only whitespace after the JSON object", "trailing",
                    NULL);
        free(edited);
    }
    /* the index as written, and with whitespace after it, loads */
    char *padded = test_alloc(ilen + 8);
    memcpy(padded, itext, ilen);
    memcpy(padded + ilen, " \n\t\r\n", 6);
    temp_write(&t, KV_SHARDS_INDEX_NAME, padded, ilen + 5);
    KvModel m;
    KvError err = {{0}};
    ck_assert_msg(kv_model_load_dir(t.dir, &m, &err) == KV_OK, "%s", err.msg);
    kv_model_free(&m);
    /* an index with a byte-order mark: refused like config.json */
    memcpy(padded, "\xef\xbb\xbf", 3);
    memcpy(padded + 3, itext, ilen);
    temp_write(&t, KV_SHARDS_INDEX_NAME, padded, ilen + 3);
    sharded_bad(&t, index, "byte-order mark", NULL, NULL);
    free(padded);
    free(itext);
    temp_remove_all(&t);
    free(json);
    free(img);
}
END_TEST

static Suite *loader_suite(void) {
    Suite *s = suite_create("loader");
    TCase *tc = tcase_create("corpus");
    tcase_add_loop_test(tc, test_corpus_case, 0, (int)corpus_n_cases);
    suite_add_tcase(s, tc);

    tc = tcase_create("model");
    tcase_add_loop_test(tc, test_base_loads, 0, 2);
    tcase_add_loop_test(tc, test_half_models_exact, 0, 4);
    tcase_add_loop_test(tc, test_unaligned_f32, 0, 2);
    tcase_add_test(tc, test_model_hash);
    tcase_add_loop_test(tc, test_fixture_tiny_loads, 0, 2);
    suite_add_tcase(s, tc);

    tc = tcase_create("config");
    tcase_add_test(tc, test_config_defaults_gemma2);
    tcase_add_test(tc, test_config_defaults_mistral_llama);
    tcase_add_test(tc, test_config_errors);
    tcase_add_loop_test(tc, test_config_bounds, 0,
                        (int)(sizeof field_bounds / sizeof field_bounds[0]));
    tcase_add_test(tc, test_config_window_defaulted);
    tcase_add_test(tc, test_json_text_checks);
    tcase_add_test(tc, test_json_keys);
    tcase_add_test(tc, test_config_roundtrip);
    tcase_add_test(tc, test_config_json_fields);
    tcase_add_test(tc, test_config_family_defaults);
    tcase_add_test(tc, test_config_window_list);
    tcase_add_test(tc, test_config_bom);
    tcase_add_test(tc, test_trailing_content);
    suite_add_tcase(s, tc);

    tc = tcase_create("safetensors");
    tcase_add_test(tc, test_f16_bf16_exhaustive);
    tcase_add_test(tc, test_dtype_table);
    tcase_add_test(tc, test_st_roundtrip);
    tcase_add_test(tc, test_st_header_cap);
    tcase_add_test(tc, test_st_float_numbers);
    suite_add_tcase(s, tc);

    tc = tcase_create("scale");
    tcase_set_timeout(tc, TEST_SCALE_TIMEOUT_S);
    tcase_add_test(tc, test_config_many_keys);
    tcase_add_test(tc, test_st_many_tensors);
    suite_add_tcase(s, tc);

    tc = tcase_create("files");
    tcase_add_test(tc, test_dir_loads);
    tcase_add_test(tc, test_dir_over_memory_limit);
    tcase_add_test(tc, test_dir_errors);
    tcase_add_test(tc, test_nonregular_inputs);
    tcase_add_test(tc, test_stored_in_place);
    suite_add_tcase(s, tc);

    tc = tcase_create("fixtures");
    tcase_add_test(tc, test_f32_to_bf16);
    tcase_add_loop_test(tc, test_fixture_streamed_bytes, 0, K_STREAM_CASES);
    tcase_add_test(tc, test_fixture_stream_refusals);
    tcase_add_test(tc, test_fixture_2b_config);
    tcase_add_test(tc, test_fixture_attn2b_config);
    suite_add_tcase(s, tc);

    tc = tcase_create("shards");
    tcase_add_loop_test(tc, test_sharded_loads, 0, 3);
    tcase_add_test(tc, test_sharded_both_present);
    tcase_add_test(tc, test_sharded_errors);
    tcase_add_test(tc, test_unused_tensors);
    tcase_add_test(tc, test_gpt_oss_checkpoint_refusals);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    SRunner *sr = srunner_create(loader_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    printf("loader: %zu corpus entries\n", corpus_n_cases);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
