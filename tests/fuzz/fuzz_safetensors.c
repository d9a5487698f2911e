/* fuzz_safetensors.c: libFuzzer target for the safetensors container and the
 * model loader. The input is a model.safetensors image; the config is fixed
 * (the tiny gemma2 and mistral models of fuzz_common.h), so an input that
 * names the right tensors with the right shapes reaches the weight binding
 * and conversion.
 *
 * Each input goes through:
 *  1. kv_st_parse alone; when it accepts, the table is checked against the
 *     header contract independently (ranges inside the data section, sizes
 *     consistent with shape and dtype, names sorted and unique, no overlap)
 *     and every byte of every tensor is read (ASan sees an out-of-range one);
 *  2. for each family, kv_model_load_memory and kv_model_load_dir on the same
 *     bytes, the second through a real directory (config.json +
 *     model.safetensors: kv_config_load, kv_st_open's mmap, file_open.c).
 *     Both paths must agree on the status and, when they load, on the
 *     weights (kv_model_hash reads every weight). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fuzz_common.h"
#include "model.h"
#include "safetensors.h"

typedef struct {
    const char *family;
    const char *json;
    char dir[4096];
} FamilyDir;

static FamilyDir g_families[2] = {
    {"gemma2", kv_fuzz_tiny_gemma2_json, ""},
    {"mistral", kv_fuzz_tiny_mistral_json, ""},
};
static char g_input[4096]; /* the shared model.safetensors both directories link to */

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    kv_fuzz_path(g_input, sizeof g_input, "input.safetensors");
    kv_fuzz_write_file(g_input, (const uint8_t *)"", 0);
    for (size_t f = 0; f < 2; f++) {
        FamilyDir *d = &g_families[f];
        char path[4200];
        kv_fuzz_path(d->dir, sizeof d->dir, d->family);
        if (mkdir(d->dir, 0700) != 0) {
            perror(d->dir);
            abort();
        }
        snprintf(path, sizeof path, "%s/config.json", d->dir);
        kv_fuzz_write_file(path, (const uint8_t *)d->json, strlen(d->json));
        snprintf(path, sizeof path, "%s/model.safetensors", d->dir);
        if (symlink("../input.safetensors", path) != 0) {
            perror(path);
            abort();
        }
    }
    return 0;
}

/* The contract of a table kv_st_parse accepted, checked from the outside. */
static void check_table(const KvSafetensors *st, const uint8_t *bytes, size_t len) {
    KV_FUZZ_CHECK(len >= 8 && st->data >= bytes + 8 && st->data + st->data_len == bytes + len,
                  "data section [%p, +%llu) is not the tail of the %zu-byte image at %p",
                  (const void *)st->data, (unsigned long long)st->data_len, len,
                  (const void *)bytes);
    KV_FUZZ_CHECK(st->n_tensors == 0 || st->tensors != NULL, "%zu tensors but no table",
                  st->n_tensors);
    for (size_t i = 0; i < st->n_tensors; i++) {
        const KvTensorInfo *t = &st->tensors[i];
        KV_FUZZ_CHECK(memchr(t->name, '\0', sizeof t->name) != NULL, "tensor %zu: unterminated name",
                      i);
        KV_FUZZ_CHECK(i == 0 || strcmp(st->tensors[i - 1].name, t->name) < 0,
                      "tensor '%s': table not sorted by unique name", t->name);
        KV_FUZZ_CHECK(kv_st_find(st, t->name) == t, "kv_st_find('%s') does not find it", t->name);
        KV_FUZZ_CHECK((int)t->dtype >= 0 && t->dtype < KV_DTYPE_COUNT, "tensor '%s': dtype %d",
                      t->name, (int)t->dtype);
        KV_FUZZ_CHECK(t->rank >= 0 && t->rank <= KV_ST_MAX_RANK, "tensor '%s': rank %d", t->name,
                      t->rank);
        KV_FUZZ_CHECK(t->begin <= t->end && t->end <= st->data_len,
                      "tensor '%s': range [%llu, %llu) outside the %llu-byte data section",
                      t->name, (unsigned long long)t->begin, (unsigned long long)t->end,
                      (unsigned long long)st->data_len);
        unsigned __int128 bits = kv_dtype_bits(t->dtype);
        for (int d = 0; d < t->rank; d++) {
            KV_FUZZ_CHECK(t->shape[d] >= 0, "tensor '%s': shape[%d] = %lld", t->name, d,
                          (long long)t->shape[d]);
            bits *= (unsigned __int128)t->shape[d];
            if (bits > ((unsigned __int128)1 << 100)) bits = (unsigned __int128)1 << 100;
        }
        KV_FUZZ_CHECK(bits == (unsigned __int128)(t->end - t->begin) * 8,
                      "tensor '%s': %llu bytes do not hold its shape of %s", t->name,
                      (unsigned long long)(t->end - t->begin), kv_dtype_name(t->dtype));
        for (size_t j = 0; j < i; j++) {
            const KvTensorInfo *u = &st->tensors[j];
            bool overlap = t->begin < t->end && u->begin < u->end && t->begin < u->end &&
                           u->begin < t->end;
            KV_FUZZ_CHECK(!overlap, "tensors '%s' and '%s' overlap", u->name, t->name);
        }
        /* Touch every byte: ASan reports a range that escapes the image. */
        size_t n = (size_t)(t->end - t->begin);
        const uint8_t *src = st->data + t->begin;
        if (kv_dtype_loadable(t->dtype) && kv_dtype_size(t->dtype) > 0) {
            size_t numel = n / kv_dtype_size(t->dtype);
            float *f = malloc(numel > 0 ? numel * sizeof *f : 1);
            KV_FUZZ_CHECK(f != NULL, "out of memory for %zu floats", numel);
            kv_dtype_to_f32(t->dtype, src, numel, f);
            free(f);
        } else {
            volatile uint8_t sum = 0;
            for (size_t k = 0; k < n; k++) sum ^= src[k];
            (void)sum;
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    KvError err = {{0}};
    KvSafetensors st;
    KvStatus rc = kv_st_parse(data, size, "fuzz/model.safetensors", &st, &err);
    kv_fuzz_check_status(rc, &err, "kv_st_parse");
    if (rc == KV_OK) {
        check_table(&st, data, size);
    } else {
        KV_FUZZ_CHECK(kv_fuzz_all_zero(&st, sizeof st), "kv_st_parse failed but left *out set");
    }
    kv_st_close(&st);

    kv_fuzz_write_file(g_input, data, size);
    for (size_t f = 0; f < 2; f++) {
        const FamilyDir *d = &g_families[f];
        KvModel mem, dir;
        KvError err_mem = {{0}}, err_dir = {{0}};
        /* The label is the directory, so both paths name the same files. */
        KvStatus rc_mem = kv_model_load_memory(d->json, strlen(d->json), data, size, d->dir, &mem,
                                               &err_mem);
        kv_fuzz_check_status(rc_mem, &err_mem, "kv_model_load_memory");
        KvStatus rc_dir = kv_model_load_dir(d->dir, &dir, &err_dir);
        kv_fuzz_check_status(rc_dir, &err_dir, "kv_model_load_dir");
        KV_FUZZ_CHECK(rc_mem == rc_dir,
                      "%s: memory and directory loads disagree: %d (%s) vs %d (%s)", d->family,
                      (int)rc_mem, err_mem.msg, (int)rc_dir, err_dir.msg);
        if (rc_mem == KV_OK) {
            KV_FUZZ_CHECK(rc == KV_OK, "%s: the model loaded but kv_st_parse rejected the file: %s",
                          d->family, err.msg);
            uint64_t h_mem = kv_model_hash(&mem), h_dir = kv_model_hash(&dir);
            KV_FUZZ_CHECK(h_mem == h_dir, "%s: memory and directory loads give other weights",
                          d->family);
        } else {
            KV_FUZZ_CHECK(kv_fuzz_all_zero(&mem, sizeof mem) && kv_fuzz_all_zero(&dir, sizeof dir),
                          "%s: the load failed but left a partial model", d->family);
        }
        kv_model_free(&mem);
        kv_model_free(&dir);
    }
    return 0;
}
