/* prompts.c: reading a prompts file (`kvrepro gate --prompts FILE`) into a
 * custom scenario, in place of the default set. */
#include "prompts.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "file_open.h"
#include "kv_limits.h"
#include "report.h"

/* Whether text[0..n) is JSON whitespace only (RFC 8259: space, tab, line
 * feed, carriage return). */
static bool prompts_only_blank(const char *text, size_t n) {
    for (size_t k = 0; k < n; k++) {
        if (text[k] != ' ' && text[k] != '\t' && text[k] != '\n' && text[k] != '\r') return false;
    }
    return true;
}

/* The keys of the object form, in the order messages list them. */
static const char *const k_prompts_keys[] = {"format", "version", "prompts", "texts", "tokenizer"};
static const char *const k_tokenizer_keys[] = {"name", "vocab_size", "vocab_sha256",
                                               "add_special_tokens"};

/* Whether name is one of the n keys. */
static bool prompts_key_known(const char *name, const char *const *keys, size_t n) {
    for (size_t k = 0; k < n; k++) {
        if (name != NULL && strcmp(name, keys[k]) == 0) return true;
    }
    return false;
}

/* The tokenizer object of the object form into tok ("<name> vocab=<V>
 * sha256=<first 16 hex>"): name, vocab_size and vocab_sha256 required,
 * add_special_tokens optional (a bool), no other key. */
static KvStatus prompts_tokenizer(const char *path, const cJSON *t, char *tok, size_t n,
                                  KvError *err) {
    if (!cJSON_IsObject(t)) {
        return kv_error_set(err, KV_ERR_INPUT, "%s: key 'tokenizer': expected an object with "
                            "name, vocab_size, vocab_sha256 and add_special_tokens", path);
    }
    for (const cJSON *k = t->child; k != NULL; k = k->next) {
        if (!prompts_key_known(k->string, k_tokenizer_keys, 4)) {
            return kv_error_set(err, KV_ERR_INPUT, "%s: key 'tokenizer.%.64s': unknown (expected "
                                "name, vocab_size, vocab_sha256, add_special_tokens)", path,
                                k->string != NULL ? k->string : "");
        }
    }
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(t, "name");
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(t, "vocab_size");
    const cJSON *sha = cJSON_GetObjectItemCaseSensitive(t, "vocab_sha256");
    const cJSON *special = cJSON_GetObjectItemCaseSensitive(t, "add_special_tokens");
    if (!cJSON_IsString(name) || name->valuestring[0] == '\0' ||
        strlen(name->valuestring) > 160 || !kv_utf8_valid(name->valuestring)) {
        return kv_error_set(err, KV_ERR_INPUT, "%s: key 'tokenizer.name': expected a non-empty "
                            "string of at most 160 bytes", path);
    }
    if (!cJSON_IsNumber(vocab) || vocab->valuedouble < 1.0 ||
        vocab->valuedouble > (double)KV_REPORT_MAX_VOCAB ||
        vocab->valuedouble != floor(vocab->valuedouble)) {
        return kv_error_set(err, KV_ERR_INPUT, "%s: key 'tokenizer.vocab_size': expected an "
                            "integer in 1..%lld", path, (long long)KV_REPORT_MAX_VOCAB);
    }
    const char *hex = cJSON_IsString(sha) ? sha->valuestring : "";
    if (strlen(hex) != 64 || strspn(hex, "0123456789abcdef") != 64) {
        return kv_error_set(err, KV_ERR_INPUT, "%s: key 'tokenizer.vocab_sha256': expected 64 "
                            "lowercase hex digits", path);
    }
    if (special != NULL && !cJSON_IsBool(special)) {
        return kv_error_set(err, KV_ERR_INPUT, "%s: key 'tokenizer.add_special_tokens': "
                            "expected true or false", path);
    }
    snprintf(tok, n, "%s vocab=%lld sha256=%.16s", name->valuestring,
             (long long)vocab->valuedouble, hex);
    return KV_OK;
}

/* The object form {"format": "kvrepro-prompts", "version": 1, "prompts":
 * [...], "texts": [...], "tokenizer": {...}}: *rows_node becomes its
 * prompts array; texts (one string per row) into *texts (then a NULL),
 * the tokenizer's identity into tok. */
static KvStatus prompts_object(const char *path, const cJSON *root, const cJSON **rows_node,
                               char ***texts, char *tok, size_t tok_len, KvError *err) {
    for (const cJSON *k = root->child; k != NULL; k = k->next) {
        if (!prompts_key_known(k->string, k_prompts_keys, 5)) {
            return kv_error_set(err, KV_ERR_INPUT, "%s: key '%.64s': unknown (expected format, "
                                "version, prompts, texts, tokenizer)", path,
                                k->string != NULL ? k->string : "");
        }
    }
    const cJSON *format = cJSON_GetObjectItemCaseSensitive(root, "format");
    const cJSON *version = cJSON_GetObjectItemCaseSensitive(root, "version");
    const cJSON *prompts = cJSON_GetObjectItemCaseSensitive(root, "prompts");
    const cJSON *tx = cJSON_GetObjectItemCaseSensitive(root, "texts");
    const cJSON *tk = cJSON_GetObjectItemCaseSensitive(root, "tokenizer");
    if (!cJSON_IsString(format) || strcmp(format->valuestring, "kvrepro-prompts") != 0) {
        return kv_error_set(err, KV_ERR_INPUT, "%s: key 'format': expected \"kvrepro-prompts\"",
                            path);
    }
    if (!cJSON_IsNumber(version) || version->valuedouble != 1.0) {
        return kv_error_set(err, KV_ERR_INPUT, "%s: key 'version': expected 1", path);
    }
    if (!cJSON_IsArray(prompts) || cJSON_GetArraySize(prompts) < 1) {
        return kv_error_set(err, KV_ERR_INPUT, "%s: key 'prompts': expected a non-empty array "
                            "of token-id arrays", path);
    }
    *rows_node = prompts;
    if (tk != NULL) {
        const KvStatus st = prompts_tokenizer(path, tk, tok, tok_len, err);
        if (st != KV_OK) return st;
    }
    if (tx == NULL) {
        tok[0] = '\0'; /* kept only beside texts (docs/SCHEMA.md) */
        return KV_OK;
    }
    const int64_t rows = cJSON_GetArraySize(prompts);
    if (!cJSON_IsArray(tx) || cJSON_GetArraySize(tx) != rows) {
        return kv_error_set(err, KV_ERR_INPUT, "%s: key 'texts': expected an array of %lld "
                            "strings, one per prompt row, found %s%d", path, (long long)rows,
                            cJSON_IsArray(tx) ? "" : "no array: ",
                            cJSON_IsArray(tx) ? cJSON_GetArraySize(tx) : 0);
    }
    char **t = calloc((size_t)rows + 1, sizeof *t); /* (rows + 1): a NULL after the last */
    *texts = t;
    if (t == NULL) return kv_error_set(err, KV_ERR_INTERNAL, "out of memory");
    int64_t b = 0;
    for (const cJSON *s = tx->child; s != NULL; s = s->next, b++) {
        if (!cJSON_IsString(s) || strlen(s->valuestring) >= KV_PROMPT_TEXT_MAX_BYTES ||
            !kv_utf8_valid(s->valuestring)) {
            return kv_error_set(err, KV_ERR_INPUT, "%s: key 'texts': entry %lld: expected a "
                                "UTF-8 string of at most %zu bytes", path, (long long)b,
                                KV_PROMPT_TEXT_MAX_BYTES - 1);
        }
        t[b] = strdup(s->valuestring);
        if (t[b] == NULL) return kv_error_set(err, KV_ERR_INTERNAL, "out of memory");
    }
    return KV_OK;
}

KvStatus kv_prompts_load(const char *path, int64_t new_tokens, KvScenario *out, KvError *err) {
    KvStatus st = KV_OK;
    char *text = NULL;
    cJSON *root = NULL;
    int32_t **rows = NULL;
    int64_t *lens = NULL;
    int64_t batch = 0;
    char **texts = NULL;     /* (batch + 1) the object form's row texts, or NULL */
    char tokenizer[256] = ""; /* its tokenizer's identity */
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
    const cJSON *list = root;
    if (root != NULL && cJSON_IsObject(root)) {
        st = prompts_object(path, root, &list, &texts, tokenizer, sizeof tokenizer, err);
        if (st != KV_OK) goto cleanup;
    } else if (root == NULL || !cJSON_IsArray(root) || cJSON_GetArraySize(root) < 1) {
        st = kv_error_set(err, KV_ERR_INPUT, "%s: expected a non-empty JSON array of token-id "
                          "arrays, or a {\"format\": \"kvrepro-prompts\", ...} object", path);
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
    batch = cJSON_GetArraySize(list);
    /* the table's bounds before any row is copied: a batch, a row and a
     * decode the report writer writes and its reader reads back */
    int64_t longest = 0;
    for (const cJSON *r = list->child; r != NULL; r = r->next) {
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
    const cJSON *row = list->child;
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
    if (st == KV_OK && texts != NULL) {
        out->texts = texts; /* the scenario owns them now */
        texts = NULL;
        snprintf(out->tokenizer, sizeof out->tokenizer, "%s", tokenizer);
    }
cleanup:
    kv_prompt_text_free(texts);
    for (int64_t b = 0; rows != NULL && b < batch; b++) free(rows[b]);
    free(rows);
    free(lens);
    cJSON_Delete(root);
    free(text);
    return st;
}
