/* prompts.c: reading a prompts file (`kvrepro gate --prompts FILE`) into a
 * custom scenario, in place of the default set. */
#include "prompts.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "file_open.h"

/* A prompts file is token ids as JSON text (~6 bytes an id): 64 MiB is ~10M
 * tokens, more than a CPU reference decodes in a day. */
#define KV_PROMPTS_MAX_BYTES (64 << 20)

KvStatus kv_prompts_load(const char *path, int64_t new_tokens, KvScenario *out, KvError *err) {
    KvStatus st = KV_OK;
    char *text = NULL;
    cJSON *root = NULL;
    int32_t **rows = NULL;
    int64_t *lens = NULL;
    int64_t batch = 0;
    int fd = -1;
    struct stat sb;
    /* a FIFO or device is refused before any read can block */
    st = kv_file_open_regular(path, &fd, &sb, err);
    if (st != KV_OK) return st;
    if (sb.st_size > KV_PROMPTS_MAX_BYTES) {
        close(fd);
        return kv_error_set(err, KV_ERR_INPUT, "%s: %lld bytes, above the %d MiB a prompts file "
                            "may have", path, (long long)sb.st_size,
                            KV_PROMPTS_MAX_BYTES >> 20);
    }
    const size_t size = (size_t)sb.st_size;
    text = malloc(size + 1);
    size_t got = 0;
    while (text != NULL && got < size) {
        const ssize_t r = read(fd, text + got, size - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        got += (size_t)r;
    }
    close(fd);
    if (text == NULL || got != size) {
        st = kv_error_set(err, KV_ERR_INPUT, "%s: cannot read: %s", path,
                          text == NULL ? "out of memory" : "short read");
        goto cleanup;
    }
    text[size] = '\0';
    root = cJSON_ParseWithLength(text, size);
    if (root == NULL || !cJSON_IsArray(root) || cJSON_GetArraySize(root) < 1) {
        st = kv_error_set(err, KV_ERR_INPUT, "%s: expected a non-empty JSON array of token-id "
                          "arrays", path);
        goto cleanup;
    }
    batch = cJSON_GetArraySize(root);
    rows = calloc((size_t)batch, sizeof *rows);
    lens = calloc((size_t)batch, sizeof *lens);
    if (rows == NULL || lens == NULL) {
        st = kv_error_set(err, KV_ERR_INTERNAL, "out of memory");
        goto cleanup;
    }
    /* children walked in order: cJSON_GetArrayItem(i) is a list walk, so
     * indexing would be quadratic in a long prompt */
    const cJSON *row = root->child;
    for (int64_t b = 0; b < batch; b++, row = row->next) {
        if (!cJSON_IsArray(row) || cJSON_GetArraySize(row) < 1) {
            st = kv_error_set(err, KV_ERR_INPUT, "%s: prompt %lld: expected a non-empty array of "
                              "token ids", path, (long long)b);
            goto cleanup;
        }
        lens[b] = cJSON_GetArraySize(row);
        rows[b] = malloc((size_t)lens[b] * sizeof(int32_t));
        if (rows[b] == NULL) {
            st = kv_error_set(err, KV_ERR_INTERNAL, "out of memory");
            goto cleanup;
        }
        const cJSON *t = row->child;
        for (int64_t i = 0; i < lens[b]; i++, t = t->next) {
            const double v = cJSON_IsNumber(t) ? t->valuedouble : -1.0;
            if (!cJSON_IsNumber(t) || v < 0.0 || v > 2147483647.0 || v != floor(v)) {
                st = kv_error_set(err, KV_ERR_INPUT, "%s: prompt %lld token %lld: expected a "
                                  "non-negative integer token id", path, (long long)b, (long long)i);
                goto cleanup;
            }
            rows[b][i] = (int32_t)v;
        }
    }
    st = kv_scenario_custom("prompts", (const int32_t *const *)rows, lens, batch, new_tokens, out,
                            err);
cleanup:
    for (int64_t b = 0; rows != NULL && b < batch; b++) free(rows[b]);
    free(rows);
    free(lens);
    cJSON_Delete(root);
    free(text);
    return st;
}
