/* fuzz_common.c: see fuzz_common.h. Harness code: an I/O failure of the
 * harness itself aborts with a message naming what failed. */
#define _XOPEN_SOURCE 700 /* nftw */
#include "fuzz_common.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

const char kv_fuzz_tiny_gemma2_json[] =
    "{\"model_type\": \"gemma2\", \"vocab_size\": 8, \"hidden_size\": 4, "
    "\"intermediate_size\": 4, \"num_hidden_layers\": 1, \"num_attention_heads\": 2, "
    "\"num_key_value_heads\": 1, \"head_dim\": 2, \"sliding_window\": 4, "
    "\"query_pre_attn_scalar\": 2, \"max_position_embeddings\": 64}\n";

const char kv_fuzz_tiny_mistral_json[] =
    "{\"model_type\": \"mistral\", \"vocab_size\": 8, \"hidden_size\": 4, "
    "\"intermediate_size\": 4, \"num_hidden_layers\": 1, \"num_attention_heads\": 2, "
    "\"num_key_value_heads\": 1, \"head_dim\": 2, \"sliding_window\": 4, "
    "\"tie_word_embeddings\": false, \"max_position_embeddings\": 64}\n";

static char g_tmpdir[4096];
static pid_t g_tmpdir_pid;

static void harness_die(const char *what, const char *path) {
    fprintf(stderr, "kvrepro fuzz: harness failure: %s %s: %s\n", what, path, strerror(errno));
    abort();
}

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}

static void tmpdir_cleanup(void) {
    /* A forked child (none today) must not remove its parent's files. */
    if (g_tmpdir[0] != '\0' && getpid() == g_tmpdir_pid) {
        (void)nftw(g_tmpdir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
    }
}

const char *kv_fuzz_tmpdir(void) {
    if (g_tmpdir[0] != '\0') return g_tmpdir;
    const char *base = getenv("KV_FUZZ_TMPDIR");
    struct stat sb;
    if (base == NULL || base[0] == '\0') {
        base = stat("/dev/shm", &sb) == 0 && S_ISDIR(sb.st_mode) ? "/dev/shm" : getenv("TMPDIR");
    }
    if (base == NULL || base[0] == '\0') base = "/tmp";
    (void)mkdir(base, 0700); /* the driver's directory may not exist yet */
    int w = snprintf(g_tmpdir, sizeof g_tmpdir, "%s/kvfuzz-XXXXXX", base);
    if (w < 0 || (size_t)w >= sizeof g_tmpdir - 64) {
        errno = ENAMETOOLONG;
        harness_die("scratch directory under", base);
    }
    if (mkdtemp(g_tmpdir) == NULL) harness_die("cannot create", g_tmpdir);
    g_tmpdir_pid = getpid();
    atexit(tmpdir_cleanup);
    return g_tmpdir;
}

void kv_fuzz_path(char *buf, size_t size, const char *name) {
    int w = snprintf(buf, size, "%s/%s", kv_fuzz_tmpdir(), name);
    if (w < 0 || (size_t)w >= size) {
        errno = ENAMETOOLONG;
        harness_die("path too long:", name);
    }
}

void kv_fuzz_write_file(const char *path, const uint8_t *data, size_t size) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) harness_die("cannot create", path);
    size_t done = 0;
    while (done < size) {
        ssize_t w = write(fd, data + done, size - done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) harness_die("cannot write", path);
        done += (size_t)w;
    }
    if (close(fd) != 0) harness_die("cannot close", path);
}

void kv_fuzz_fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "kvrepro fuzz: property violated: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    abort();
}

bool kv_fuzz_all_zero(const void *p, size_t n) {
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++) {
        if (b[i] != 0) return false;
    }
    return true;
}

void kv_fuzz_check_status(KvStatus st, const KvError *err, const char *what) {
    KV_FUZZ_CHECK(st == KV_OK || st == KV_ERR_INPUT, "%s: expected KV_OK or KV_ERR_INPUT, found %d: %s",
                  what, (int)st, err->msg);
    if (st != KV_OK) {
        KV_FUZZ_CHECK(memchr(err->msg, '\0', sizeof err->msg) != NULL && err->msg[0] != '\0',
                      "%s: failed without a message", what);
    }
}

/* ---- the tiny model ---------------------------------------------------- */

static void tensor_add(KvFuzzTensor *ts, size_t *n, int rank, int64_t d0, int64_t d1,
                       int64_t d2, const char *fmt, ...) __attribute__((format(printf, 7, 8)));
static void tensor_add(KvFuzzTensor *ts, size_t *n, int rank, int64_t d0, int64_t d1,
                       int64_t d2, const char *fmt, ...) {
    KvFuzzTensor *t = &ts[(*n)++];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->name, sizeof t->name, fmt, ap);
    va_end(ap);
    t->rank = rank;
    t->shape[0] = d0;
    t->shape[1] = d1;
    t->shape[2] = d2;
}

size_t kv_fuzz_model_tensors(const KvConfig *cfg, KvFuzzTensor *out) {
    size_t n = 0;
    const int64_t h = cfg->hidden_size, in = cfg->intermediate_size, hd = cfg->head_dim;
    const int64_t q = cfg->num_heads * hd, kv = cfg->num_kv_heads * hd, e = cfg->num_experts;
    const bool gemma = cfg->family == KV_FAMILY_GEMMA2 || cfg->family == KV_FAMILY_GEMMA3;
    /* Which optional tensors each family has, from transformers' modeling
     * files (not from the parsed flags, so a flag set for the wrong family
     * shows up as a load failure). */
    const bool qkv_bias = cfg->family == KV_FAMILY_QWEN2 ||
                          (cfg->family == KV_FAMILY_GPT_OSS && cfg->attn_qkv_bias);
    const bool gpt_oss = cfg->family == KV_FAMILY_GPT_OSS;
    tensor_add(out, &n, 2, cfg->vocab_size, h, 0, "model.embed_tokens.weight");
    for (int64_t l = 0; l < cfg->num_layers; l++) {
        const char *p = "model.layers.";
        tensor_add(out, &n, 1, h, 0, 0, "%s%" PRId64 ".input_layernorm.weight", p, l);
        tensor_add(out, &n, 2, q, h, 0, "%s%" PRId64 ".self_attn.q_proj.weight", p, l);
        tensor_add(out, &n, 2, kv, h, 0, "%s%" PRId64 ".self_attn.k_proj.weight", p, l);
        tensor_add(out, &n, 2, kv, h, 0, "%s%" PRId64 ".self_attn.v_proj.weight", p, l);
        tensor_add(out, &n, 2, h, q, 0, "%s%" PRId64 ".self_attn.o_proj.weight", p, l);
        if (qkv_bias) {
            tensor_add(out, &n, 1, q, 0, 0, "%s%" PRId64 ".self_attn.q_proj.bias", p, l);
            tensor_add(out, &n, 1, kv, 0, 0, "%s%" PRId64 ".self_attn.k_proj.bias", p, l);
            tensor_add(out, &n, 1, kv, 0, 0, "%s%" PRId64 ".self_attn.v_proj.bias", p, l);
        }
        if (gpt_oss && cfg->attn_o_bias) {
            tensor_add(out, &n, 1, h, 0, 0, "%s%" PRId64 ".self_attn.o_proj.bias", p, l);
        }
        if (gpt_oss) tensor_add(out, &n, 1, cfg->num_heads, 0, 0, "%s%" PRId64 ".self_attn.sinks", p, l);
        if (cfg->family == KV_FAMILY_GEMMA3) {
            tensor_add(out, &n, 1, hd, 0, 0, "%s%" PRId64 ".self_attn.q_norm.weight", p, l);
            tensor_add(out, &n, 1, hd, 0, 0, "%s%" PRId64 ".self_attn.k_norm.weight", p, l);
        }
        tensor_add(out, &n, 1, h, 0, 0, "%s%" PRId64 ".post_attention_layernorm.weight", p, l);
        if (gemma) {
            tensor_add(out, &n, 1, h, 0, 0, "%s%" PRId64 ".pre_feedforward_layernorm.weight", p, l);
            tensor_add(out, &n, 1, h, 0, 0, "%s%" PRId64 ".post_feedforward_layernorm.weight", p, l);
        }
        if (gpt_oss) {
            /* GptOssMLP: router (E, h) + bias; experts stored (E, in, out) */
            tensor_add(out, &n, 2, e, h, 0, "%s%" PRId64 ".mlp.router.weight", p, l);
            tensor_add(out, &n, 1, e, 0, 0, "%s%" PRId64 ".mlp.router.bias", p, l);
            tensor_add(out, &n, 3, e, h, 2 * in, "%s%" PRId64 ".mlp.experts.gate_up_proj", p, l);
            tensor_add(out, &n, 2, e, 2 * in, 0, "%s%" PRId64 ".mlp.experts.gate_up_proj_bias", p, l);
            tensor_add(out, &n, 3, e, in, h, "%s%" PRId64 ".mlp.experts.down_proj", p, l);
            tensor_add(out, &n, 2, e, h, 0, "%s%" PRId64 ".mlp.experts.down_proj_bias", p, l);
        } else {
            tensor_add(out, &n, 2, in, h, 0, "%s%" PRId64 ".mlp.gate_proj.weight", p, l);
            tensor_add(out, &n, 2, in, h, 0, "%s%" PRId64 ".mlp.up_proj.weight", p, l);
            tensor_add(out, &n, 2, h, in, 0, "%s%" PRId64 ".mlp.down_proj.weight", p, l);
        }
    }
    tensor_add(out, &n, 1, h, 0, 0, "model.norm.weight");
    if (!cfg->tie_word_embeddings) tensor_add(out, &n, 2, cfg->vocab_size, h, 0, "lm_head.weight");
    return n;
}

/* Element i of a tensor: a multiple of 1/16 in [-0.5, 0.5], exact in F32,
 * F16 and BF16. */
static float pattern_value(size_t t, size_t i) {
    return (float)((int)((t * 7 + i * 5) % 17) - 8) / 16.0f;
}

static uint16_t f16_bits_exact(float v) {
    uint32_t b;
    memcpy(&b, &v, sizeof b);
    uint16_t sign = (uint16_t)((b >> 16) & 0x8000u);
    if ((b & 0x7fffffffu) == 0) return sign;
    uint32_t e = ((b >> 23) & 0xffu) - 127u + 15u; /* normal in half for the pattern */
    return (uint16_t)(sign | (e << 10) | ((b >> 13) & 0x3ffu));
}

KvStatus kv_fuzz_model_image(const KvConfig *cfg, KvDtype dtype, uint8_t **img, size_t *len,
                             KvError *err) {
    KvStatus st = KV_OK;
    size_t cap = KV_FUZZ_MAX_TENSORS(cfg->num_layers);
    KvFuzzTensor *ts = calloc(cap, sizeof *ts);
    KvStWriteTensor *w = calloc(cap, sizeof *w);
    void **bufs = calloc(cap, sizeof *bufs);
    size_t n = 0;
    *img = NULL;
    *len = 0;
    if (ts == NULL || w == NULL || bufs == NULL) {
        st = kv_error_set(err, KV_ERR_INTERNAL, "fuzz: out of memory");
        goto exit;
    }
    n = kv_fuzz_model_tensors(cfg, ts);
    const size_t esize = kv_dtype_size(dtype);
    for (size_t t = 0; t < n; t++) {
        size_t numel = 1;
        for (int d = 0; d < ts[t].rank; d++) numel *= (size_t)ts[t].shape[d];
        uint8_t *b = malloc(numel * esize + 1);
        if (b == NULL) {
            st = kv_error_set(err, KV_ERR_INTERNAL, "fuzz: out of memory");
            goto exit;
        }
        bufs[t] = b;
        for (size_t i = 0; i < numel; i++) {
            float v = pattern_value(t, i);
            uint32_t f;
            memcpy(&f, &v, sizeof f);
            if (dtype == KV_DTYPE_F16) {
                uint16_t h = f16_bits_exact(v);
                memcpy(b + 2 * i, &h, 2);
            } else if (dtype == KV_DTYPE_BF16) {
                uint16_t h = (uint16_t)(f >> 16);
                memcpy(b + 2 * i, &h, 2);
            } else {
                memcpy(b + 4 * i, &f, 4);
            }
        }
        w[t].name = ts[t].name;
        w[t].dtype = dtype;
        w[t].rank = ts[t].rank;
        for (int d = 0; d < ts[t].rank; d++) w[t].shape[d] = ts[t].shape[d];
        w[t].data = b;
    }
    st = kv_st_serialize(w, n, img, len, err);
exit:
    for (size_t t = 0; bufs != NULL && t < n; t++) free(bufs[t]);
    free(bufs);
    free(w);
    free(ts);
    return st;
}
