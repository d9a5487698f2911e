/* prompts.c: reading a prompts file (`kvrepro gate --prompts FILE`) into a
 * custom scenario, in place of the default set. */
#include "prompts.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "file_open.h"
#include "kv_limits.h"

/* Whether text[0..n) is JSON whitespace only (RFC 8259: space, tab, line
 * feed, carriage return). */
static bool prompts_only_blank(const char *text, size_t n) {
    for (size_t k = 0; k < n; k++) {
        if (text[k] != ' ' && text[k] != '\t' && text[k] != '\n' && text[k] != '\r') return false;
    }
    return true;
}

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
        return kv_error_set(err, KV_ERR_INPUT, "%s: %lld bytes, above the %lld MiB a prompts "
                            "file may have", path, (long long)sb.st_size,
                            (long long)(KV_PROMPTS_MAX_BYTES >> 20));
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
    const char *end = NULL;
    root = cJSON_ParseWithLengthOpts(text, size, &end, false);
    if (root == NULL || !cJSON_IsArray(root) || cJSON_GetArraySize(root) < 1) {
        st = kv_error_set(err, KV_ERR_INPUT, "%s: expected a non-empty JSON array of token-id "
                          "arrays", path);
        goto cleanup;
    }
    /* one JSON value: anything after it (a second array, a stray bracket)
     * would otherwise be dropped without a word */
    if (end == NULL || end < text || end > text + size ||
        !prompts_only_blank(end, size - (size_t)(end - text))) {
        const size_t at = end != NULL && end >= text && end <= text + size
                              ? (size_t)(end - text) : 0;
        st = kv_error_set(err, KV_ERR_INPUT, "%s: byte %zu: expected the end of the file after "
                          "the prompts array (one JSON value), found more content", path, at);
        goto cleanup;
    }
    batch = cJSON_GetArraySize(root);
    /* the table's bounds before any row is copied: a batch, a row and a
     * decode the report writer writes and its reader reads back */
    int64_t longest = 0;
    for (const cJSON *r = root->child; r != NULL; r = r->next) {
        const int64_t len = cJSON_IsArray(r) ? cJSON_GetArraySize(r) : 0;
        longest = len > longest ? len : longest;
    }
    st = kv_limits_check_scenario(batch, longest > 0 ? longest : 1, new_tokens, path, err);
    if (st != KV_OK) goto cleanup;
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
