/* shards.c: reading model.safetensors.index.json and opening its shards (see
 * shards.h).
 *
 * The index is untrusted JSON like config.json and gets the same text checks
 * (UTF-8, no control characters, no \u0000, no repeated key) before any name
 * in it is used. The cross-check between the map and the shards walks both
 * sorted by tensor name, so its cost is O(n log n) in the tensors and the
 * first error it reports is the same on every run. */
#include "shards.h"
#include "file_open.h"
#include "json_describe.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* One weight_map entry as read: both strings point into the cJSON tree. */
typedef struct {
    const char *tensor;
    const char *shard;
    size_t file; /* index into the sorted shard names */
} IndexEntry;

/* One tensor of one shard. */
typedef struct {
    const KvTensorInfo *info;
    size_t file;
} ShardTensor;

static int cmp_entry_shard(const void *a, const void *b) {
    const IndexEntry *x = a, *y = b;
    int c = strcmp(x->shard, y->shard);
    return c != 0 ? c : strcmp(x->tensor, y->tensor);
}

static int cmp_entry_tensor(const void *a, const void *b) {
    return strcmp(((const IndexEntry *)a)->tensor, ((const IndexEntry *)b)->tensor);
}

static int cmp_shard_tensor(const void *a, const void *b) {
    const ShardTensor *x = a, *y = b;
    int c = strcmp(x->info->name, y->info->name);
    if (c != 0) return c;
    return x->file < y->file ? -1 : x->file > y->file;
}

/* dir + "/" + name into buf; false when it does not fit. */
static bool shards_path_join(char *buf, size_t size, const char *dir, const char *name) {
    size_t n = strlen(dir);
    const char *sep = (n > 0 && dir[n - 1] == '/') ? "" : "/";
    int w = snprintf(buf, size, "%s%s%s", dir, sep, name);
    return w >= 0 && (size_t)w < size;
}

/* Parses the index text into its root object, with every check config.json
 * gets: no NUL, UTF-8, no raw control character or \u0000, valid JSON, only
 * whitespace after it, an object, no key twice at any depth (Python's json,
 * which transformers reads the index with, keeps the last of two; cJSON the
 * first: a repeated tensor could name two shards). */
static KvStatus index_parse(char *text, size_t len, const char *lab, cJSON **root,
                            KvError *err) {
    char found[128];
    *root = NULL;
    const void *nul = memchr(text, 0, len);
    if (nul != NULL) {
        return kv_error_set(err, KV_ERR_INPUT, "%s: expected JSON text, found a NUL byte at %td",
                            lab, (const char *)nul - text);
    }
    KvStatus st = kv_file_check_json_text(text, len, lab, err);
    if (st != KV_OK) return st;
    const char *end = NULL;
    cJSON *r = cJSON_ParseWithOpts(text, &end, 0);
    if (r == NULL) {
        size_t at = end != NULL && end >= text ? (size_t)(end - text) : 0;
        return kv_error_set(err, KV_ERR_INPUT,
                            "%s: expected valid JSON, found a syntax error near byte %zu of %zu",
                            lab, at, len);
    }
    for (const char *p = end; *p; p++) {
        if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
            cJSON_Delete(r);
            return kv_error_set(err, KV_ERR_INPUT,
                                "%s: expected only whitespace after the JSON object, found "
                                "trailing data at byte %td",
                                lab, p - text);
        }
    }
    if (!cJSON_IsObject(r)) {
        kv_json_describe(r, found, sizeof found);
        cJSON_Delete(r);
        return kv_error_set(err, KV_ERR_INPUT, "%s: expected a JSON object, found %s", lab,
                            found);
    }
    st = kv_file_check_json_keys(r, lab, "key", err);
    if (st != KV_OK) {
        cJSON_Delete(r);
        return st;
    }
    *root = r;
    return KV_OK;
}

/* A shard name must stay inside the model directory: a plain file name. A
 * '/' anywhere (a subdirectory, an absolute path, "../x") and the names "."
 * and ".." are refused; transformers would join any of them to the
 * directory, and the reference will not read outside it. */
static bool shard_name_ok(const char *name) {
    return name[0] != '\0' && strchr(name, '/') == NULL && strcmp(name, ".") != 0 &&
           strcmp(name, "..") != 0;
}

/* The weight_map's entries into *out (malloc'd, n_out entries), each value
 * checked to be a string naming a file inside the directory. */
static KvStatus index_entries(const cJSON *root, const char *lab, IndexEntry **out, size_t *n_out,
                              KvError *err) {
    char found[128];
    *out = NULL;
    *n_out = 0;
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    if (!cJSON_IsObject(wm)) {
        kv_json_describe(wm, found, sizeof found);
        return kv_error_set(err, KV_ERR_INPUT,
                            "%s: field 'weight_map': expected an object {tensor name: shard "
                            "file name}, found %s",
                            lab, found);
    }
    size_t n = 0;
    for (const cJSON *it = wm->child; it != NULL; it = it->next) n++;
    IndexEntry *e = calloc(n > 0 ? n : 1, sizeof *e);
    if (e == NULL) {
        return kv_error_set(err, KV_ERR_INTERNAL, "%s: out of memory for %zu weight_map entries",
                            lab, n);
    }
    size_t i = 0;
    for (const cJSON *it = wm->child; it != NULL; it = it->next, i++) {
        size_t name_len = strlen(it->string);
        if (name_len >= KV_ST_MAX_NAME) {
            free(e);
            return kv_error_set(err, KV_ERR_INPUT,
                                "%s: weight_map: tensor '%.64s...': name: expected fewer than %d "
                                "bytes (as in a safetensors header), found %zu",
                                lab, it->string, KV_ST_MAX_NAME, name_len);
        }
        if (!cJSON_IsString(it)) {
            kv_json_describe(it, found, sizeof found);
            free(e);
            return kv_error_set(err, KV_ERR_INPUT,
                                "%s: weight_map: tensor '%s': expected a shard file name (a "
                                "string), found %s",
                                lab, it->string, found);
        }
        if (!shard_name_ok(it->valuestring)) {
            kv_json_describe(it, found, sizeof found);
            free(e);
            return kv_error_set(err, KV_ERR_INPUT,
                                "%s: weight_map: tensor '%s': expected a file name inside the "
                                "model directory (no '/', not '.' or '..'), found %s",
                                lab, it->string, found);
        }
        e[i].tensor = it->string;
        e[i].shard = it->valuestring;
    }
    *out = e;
    *n_out = n;
    return KV_OK;
}

/* Opens every distinct shard of e (sorted by shard name on return, file
 * indices set) into s->files. */
static KvStatus shards_open_files(const char *dir, IndexEntry *e, size_t n, KvShards *s,
                                  KvError *err) {
    qsort(e, n, sizeof *e, cmp_entry_shard);
    size_t n_files = 0;
    for (size_t i = 0; i < n; i++) {
        if (i == 0 || strcmp(e[i].shard, e[i - 1].shard) != 0) n_files++;
        e[i].file = n_files - 1;
    }
    if (n_files > KV_SHARDS_MAX_FILES) {
        return kv_error_set(err, KV_ERR_INPUT,
                            "%s: weight_map: expected at most %d shard files, found %zu", s->label,
                            KV_SHARDS_MAX_FILES, n_files);
    }
    s->files = calloc(n_files > 0 ? n_files : 1, sizeof *s->files);
    if (s->files == NULL) {
        return kv_error_set(err, KV_ERR_INTERNAL, "%s: out of memory for %zu shards", s->label,
                            n_files);
    }
    for (size_t i = 0; i < n; i++) {
        if (i > 0 && e[i].file == e[i - 1].file) continue;
        char path[4096];
        struct stat sb;
        if (!shards_path_join(path, sizeof path, dir, e[i].shard)) {
            return kv_error_set(err, KV_ERR_INPUT,
                                "%s: weight_map: tensor '%s': shard '%s': path too long",
                                s->label, e[i].tensor, e[i].shard);
        }
        /* A shard the map names but the directory lacks is the index's
         * error: say which entry names it (the first by tensor name). */
        if (stat(path, &sb) != 0 && errno == ENOENT) {
            return kv_error_set(err, KV_ERR_INPUT,
                                "%s: weight_map: tensor '%s': expected its shard file %s, found "
                                "no such file (missing)",
                                s->label, e[i].tensor, path);
        }
        KvStatus st = kv_st_open(path, &s->files[e[i].file], err);
        if (st != KV_OK) return st;
        s->n_files++;
    }
    return KV_OK;
}

/* The shards and the map agree: walks the map's entries and every shard's
 * tensors together in name order; fills s->map. */
static KvStatus shards_cross_check(IndexEntry *e, size_t n, KvShards *s, KvError *err) {
    KvStatus st = KV_OK;
    size_t total = 0;
    for (size_t f = 0; f < s->n_files; f++) total += s->files[f].n_tensors;
    ShardTensor *all = calloc(total > 0 ? total : 1, sizeof *all);
    s->map = calloc(n > 0 ? n : 1, sizeof *s->map);
    if (all == NULL || s->map == NULL) {
        st = kv_error_set(err, KV_ERR_INTERNAL, "%s: out of memory for %zu tensors", s->label,
                          total);
        goto cleanup;
    }
    size_t k = 0;
    for (size_t f = 0; f < s->n_files; f++) {
        for (size_t t = 0; t < s->files[f].n_tensors; t++) {
            all[k].info = &s->files[f].tensors[t];
            all[k].file = f;
            k++;
        }
    }
    qsort(all, total, sizeof *all, cmp_shard_tensor);
    qsort(e, n, sizeof *e, cmp_entry_tensor); /* keys are unique: index_parse */

    size_t i = 0, j = 0;
    while (i < n || j < total) {
        /* The next name in either list, and what each list says of it. */
        const char *name;
        if (i < n && j < total) {
            name = strcmp(e[i].tensor, all[j].info->name) <= 0 ? e[i].tensor : all[j].info->name;
        } else {
            name = i < n ? e[i].tensor : all[j].info->name;
        }
        const IndexEntry *entry = i < n && strcmp(e[i].tensor, name) == 0 ? &e[i] : NULL;
        size_t run = 0;
        while (j + run < total && strcmp(all[j + run].info->name, name) == 0) run++;

        if (run >= 2) {
            st = kv_error_set(err, KV_ERR_INPUT,
                              "%s: tensor '%s': expected in one shard only, found in %s too "
                              "(duplicated)",
                              s->files[all[j + 1].file].label, name,
                              s->files[all[j].file].label);
            goto cleanup;
        }
        if (entry != NULL && (run == 0 || all[j].file != entry->file)) {
            char elsewhere[300] = "";
            if (run == 1) {
                snprintf(elsewhere, sizeof elsewhere, "; it is in %s",
                         s->files[all[j].file].label);
            }
            st = kv_error_set(err, KV_ERR_INPUT,
                              "%s: tensor '%s': expected in this shard (%s's weight_map names "
                              "it), found no such tensor (missing)%s",
                              s->files[entry->file].label, name, s->label, elsewhere);
            goto cleanup;
        }
        if (entry == NULL) {
            st = kv_error_set(err, KV_ERR_INPUT,
                              "%s: tensor '%s': expected an entry in %s's weight_map, found none "
                              "(every tensor of every shard must be listed)",
                              s->files[all[j].file].label, name, s->label);
            goto cleanup;
        }
        s->map[s->n_map].info = all[j].info;
        s->map[s->n_map].file = all[j].file;
        s->n_map++;
        i++;
        j++;
    }

cleanup:
    free(all);
    return st;
}

KvStatus kv_shards_open(const char *dir, const char *index_path, KvShards *out, KvError *err) {
    KvStatus st = KV_OK;
    char *text = NULL;
    size_t len = 0;
    cJSON *root = NULL;
    IndexEntry *e = NULL;
    size_t n = 0;

    memset(out, 0, sizeof *out);
    snprintf(out->label, sizeof out->label, "%s", index_path);
    st = kv_file_read_small(index_path, KV_SHARDS_MAX_INDEX_BYTES, &text, &len, err);
    if (st != KV_OK) goto cleanup;
    st = index_parse(text, len, out->label, &root, err);
    if (st != KV_OK) goto cleanup;
    st = index_entries(root, out->label, &e, &n, err);
    if (st != KV_OK) goto cleanup;
    st = shards_open_files(dir, e, n, out, err);
    if (st != KV_OK) goto cleanup;
    st = shards_cross_check(e, n, out, err);

cleanup:
    free(e);
    cJSON_Delete(root);
    free(text);
    if (st != KV_OK) kv_shards_close(out);
    return st;
}

void kv_shards_close(KvShards *s) {
    if (s == NULL) return;
    for (size_t f = 0; s->files != NULL && f < s->n_files; f++) kv_st_close(&s->files[f]);
    free(s->files);
    free(s->map);
    memset(s, 0, sizeof *s);
}

const KvTensorInfo *kv_shards_find(const KvShards *s, const char *name,
                                   const KvSafetensors **file) {
    if (s == NULL || name == NULL) return NULL;
    size_t lo = 0, hi = s->n_map;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(name, s->map[mid].info->name);
        if (c == 0) {
            if (file != NULL) *file = &s->files[s->map[mid].file];
            return s->map[mid].info;
        }
        if (c < 0) {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    return NULL;
}
