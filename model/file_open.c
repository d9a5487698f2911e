/* file_open.c: see file_open.h. */
#include "file_open.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- opening ----------------------------------------------------------- */

static const char *file_kind(mode_t mode) {
    if (S_ISFIFO(mode)) return "a FIFO";
    if (S_ISDIR(mode)) return "a directory";
    if (S_ISCHR(mode) || S_ISBLK(mode)) return "a device";
    if (S_ISSOCK(mode)) return "a socket";
    return "another kind of file";
}

static KvStatus refuse_kind(const char *path, mode_t mode, KvError *err) {
    return kv_error_set(err, KV_ERR_INPUT, "%s: expected a regular file, found %s", path,
                        file_kind(mode));
}

KvStatus kv_file_open_regular(const char *path, int *fd, struct stat *sb, KvError *err) {
    KvStatus st = KV_OK;
    /* O_NONBLOCK: opening a FIFO for reading blocks until a writer appears,
     * forever if none does. The type is then checked on the open descriptor
     * (fstat), so a path swapped after a stat() could not slip through.
     * O_NOCTTY: a terminal given as a path must not become ours. */
    *fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (*fd < 0) {
        /* A socket cannot be opened at all (ENXIO): say what it is. */
        int open_errno = errno;
        struct stat what;
        if (stat(path, &what) == 0 && !S_ISREG(what.st_mode)) {
            return refuse_kind(path, what.st_mode, err);
        }
        return kv_error_set(err, KV_ERR_INPUT, "%s: cannot open: %s", path, strerror(open_errno));
    }
    if (fstat(*fd, sb) != 0) {
        st = kv_error_set(err, KV_ERR_INPUT, "%s: cannot stat: %s", path, strerror(errno));
        goto cleanup;
    }
    if (!S_ISREG(sb->st_mode)) {
        st = refuse_kind(path, sb->st_mode, err);
        goto cleanup;
    }
    /* Back to ordinary blocking reads (O_NONBLOCK means nothing for a
     * regular file on Linux, but the descriptor should say what it is). */
    int flags = fcntl(*fd, F_GETFL);
    if (flags < 0 || fcntl(*fd, F_SETFL, flags & ~O_NONBLOCK) != 0) {
        st = kv_error_set(err, KV_ERR_INPUT, "%s: cannot clear O_NONBLOCK: %s", path,
                          strerror(errno));
        goto cleanup;
    }

cleanup:
    if (st != KV_OK) {
        close(*fd);
        *fd = -1;
    }
    return st;
}

/* ---- reading ----------------------------------------------------------- */

KvStatus kv_file_read_small(const char *path, size_t max_bytes, char **text, size_t *len,
                            KvError *err) {
    KvStatus st = KV_OK;
    struct stat sb;
    int fd = -1;
    char *buf = NULL;
    *text = NULL;
    *len = 0;

    st = kv_file_open_regular(path, &fd, &sb, err);
    if (st != KV_OK) goto cleanup;
    /* A regular file's st_size is never negative, so the unsigned compare
     * holds for any max_bytes (an off_t cast of a large one could wrap). */
    if ((uintmax_t)sb.st_size > (uintmax_t)max_bytes) {
        st = kv_error_set(err, KV_ERR_INPUT, "%s: expected at most %zu bytes, found %lld", path,
                          max_bytes, (long long)sb.st_size);
        goto cleanup;
    }
    size_t size = (size_t)sb.st_size;
    buf = malloc(size + 1);
    if (buf == NULL) {
        st = kv_error_set(err, KV_ERR_INTERNAL, "%s: out of memory", path);
        goto cleanup;
    }
    size_t got = 0;
    while (got < size) {
        ssize_t r = read(fd, buf + got, size - got);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            st = kv_error_set(err, KV_ERR_INPUT, "%s: cannot read: %s", path, strerror(errno));
            goto cleanup;
        }
        if (r == 0) break; /* shrank while reading: the caller gets what is there */
        got += (size_t)r;
    }
    buf[got] = '\0';
    *text = buf;
    *len = got;
    buf = NULL;

cleanup:
    free(buf);
    if (fd >= 0) close(fd);
    return st;
}

/* ---- JSON text --------------------------------------------------------- */

/* The length (1 to 4) of the well-formed UTF-8 sequence at p, avail bytes
 * readable, or 0 if there is none (RFC 3629, table 3-7 of the Unicode
 * standard: the second byte's range excludes overlong forms, surrogates and
 * code points above U+10FFFF). */
static size_t utf8_sequence_len(const unsigned char *p, size_t avail) {
    unsigned char c = p[0];
    if (c < 0x80) return 1;
    size_t n;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) {
        n = 2;
    } else if (c == 0xE0) {
        n = 3;
        lo = 0xA0;
    } else if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF) {
        n = 3;
    } else if (c == 0xED) {
        n = 3;
        hi = 0x9F;
    } else if (c == 0xF0) {
        n = 4;
        lo = 0x90;
    } else if (c >= 0xF1 && c <= 0xF3) {
        n = 4;
    } else if (c == 0xF4) {
        n = 4;
        hi = 0x8F;
    } else {
        return 0; /* a continuation byte, C0/C1 (overlong), F5..FF */
    }
    if (avail < n || p[1] < lo || p[1] > hi) return 0;
    for (size_t k = 2; k < n; k++) {
        if (p[k] < 0x80 || p[k] > 0xBF) return 0;
    }
    return n;
}

/* The string token starting at its opening quote text[open], as written
 * (escapes shown as escapes), at most 64 bytes, control characters as '?'. */
static void string_excerpt(const char *text, size_t open, size_t close, char *buf, size_t size) {
    size_t n = close - open - 1;
    bool cut = n > 64;
    if (cut) n = 64;
    snprintf(buf, size, "%.*s%s", (int)n, text + open + 1, cut ? "..." : "");
    for (char *p = buf; *p; p++) {
        if ((unsigned char)*p < 0x20) *p = '?';
    }
}

KvStatus kv_file_check_json_text(const char *text, size_t len, const char *where,
                                 KvError *err) {
    const unsigned char *u = (const unsigned char *)text;
    /* cJSON skips a leading byte-order mark; Python's json.loads refuses it
     * ("Unexpected UTF-8 BOM"), so transformers cannot read such a file */
    if (len >= 3 && u[0] == 0xef && u[1] == 0xbb && u[2] == 0xbf) {
        return kv_error_set(err, KV_ERR_INPUT,
                            "%s: expected JSON text without a UTF-8 byte-order mark, found "
                            "the bytes EF BB BF at byte 0 (transformers refuses them too)",
                            where);
    }
    for (size_t i = 0; i < len;) {
        size_t n = utf8_sequence_len(u + i, len - i);
        if (n == 0) {
            return kv_error_set(err, KV_ERR_INPUT,
                                "%s: expected UTF-8 text, found the byte 0x%02x at byte %zu "
                                "(not part of a valid UTF-8 sequence)",
                                where, u[i], i);
        }
        i += n;
    }

    /* Outside strings valid JSON has no quote and no backslash, so every
     * quote seen here opens a string; in invalid JSON the parser fails
     * later whatever this scan concludes. */
    for (size_t i = 0; i < len; i++) {
        if (text[i] != '"') continue;
        size_t open = i++;
        size_t nul_at = SIZE_MAX, ctl_at = SIZE_MAX;
        while (i < len && text[i] != '"') {
            if (text[i] == '\\') {
                if (nul_at == SIZE_MAX && i + 5 < len && text[i + 1] == 'u' &&
                    memcmp(text + i + 2, "0000", 4) == 0) {
                    nul_at = i;
                }
                i += 2; /* the escaped character; \uXXXX's digits are plain */
                continue;
            }
            if (ctl_at == SIZE_MAX && u[i] < 0x20) ctl_at = i;
            i++;
        }
        if (i > len) i = len;
        if (nul_at == SIZE_MAX && ctl_at == SIZE_MAX) continue;

        size_t after = i + 1;
        while (after < len && (text[after] == ' ' || text[after] == '\t' ||
                               text[after] == '\n' || text[after] == '\r')) {
            after++;
        }
        const char *kind = after < len && text[after] == ':' ? "key" : "string";
        char excerpt[80];
        string_excerpt(text, open, i, excerpt, sizeof excerpt);
        if (nul_at != SIZE_MAX && (ctl_at == SIZE_MAX || nul_at < ctl_at)) {
            return kv_error_set(err, KV_ERR_INPUT,
                                "%s: %s \"%s\" at byte %zu: expected no NUL character, found the "
                                "escape \\u0000 at byte %zu (cJSON would cut the %s there)",
                                where, kind, excerpt, open, nul_at, kind);
        }
        return kv_error_set(err, KV_ERR_INPUT,
                            "%s: %s \"%s\" at byte %zu: expected control characters escaped "
                            "(JSON), found a raw control character 0x%02x at byte %zu",
                            where, kind, excerpt, open, u[ctl_at], ctl_at);
    }
    return KV_OK;
}

/* ---- repeated keys ----------------------------------------------------- */

/* Up to this many keys an object is checked pair by pair (at most 28
 * comparisons): a safetensors header has one small object per tensor, and
 * sorting each would cost an allocation apiece. */
#define KV_KEYS_PAIRWISE 8

typedef struct {
    char path[512]; /* dotted path of the node being visited, truncated to fit */
    size_t len;
    const char *where;
    const char *noun;
    KvError *err;
} KeyWalk;

static int cmp_item_key(const void *a, const void *b) {
    return strcmp((*(const cJSON *const *)a)->string, (*(const cJSON *const *)b)->string);
}

/* Appends ".key" (or "key" at the root) or "[i]" to the path; control
 * characters as '?' so the path can go into a message. */
static void path_push(KeyWalk *w, const cJSON *child, int index) {
    size_t room = sizeof w->path - w->len;
    if (child->string != NULL) {
        snprintf(w->path + w->len, room, "%s%s", w->len > 0 ? "." : "", child->string);
    } else {
        snprintf(w->path + w->len, room, "[%d]", index);
    }
    for (char *p = w->path + w->len; *p; p++) {
        if ((unsigned char)*p < 0x20) *p = '?';
    }
    w->len = strlen(w->path);
}

static KvStatus keys_walk(const cJSON *node, KeyWalk *w) {
    KvStatus st = KV_OK;
    const cJSON **keys = NULL;
    if (cJSON_IsObject(node)) {
        size_t n = 0;
        for (const cJSON *c = node->child; c != NULL; c = c->next) n++;
        if (n >= 2 && n <= KV_KEYS_PAIRWISE) {
            /* A small object (a tensor entry): pairwise, no allocation. */
            for (const cJSON *a = node->child; a != NULL; a = a->next) {
                for (const cJSON *b = a->next; b != NULL; b = b->next) {
                    if (strcmp(a->string, b->string) == 0) {
                        path_push(w, b, 0);
                        st = kv_error_set(w->err, KV_ERR_INPUT,
                                          "%s: %s '%s': expected once, found repeated", w->where,
                                          w->noun, w->path);
                        goto cleanup;
                    }
                }
            }
        } else if (n > KV_KEYS_PAIRWISE) {
            keys = malloc(n * sizeof *keys);
            if (keys == NULL) {
                st = kv_error_set(w->err, KV_ERR_INTERNAL, "%s: out of memory for %zu keys",
                                  w->where, n);
                goto cleanup;
            }
            size_t i = 0;
            for (const cJSON *c = node->child; c != NULL; c = c->next) keys[i++] = c;
            qsort(keys, n, sizeof *keys, cmp_item_key);
            for (i = 1; i < n; i++) {
                if (strcmp(keys[i - 1]->string, keys[i]->string) == 0) {
                    path_push(w, keys[i], 0);
                    st = kv_error_set(w->err, KV_ERR_INPUT,
                                      "%s: %s '%s': expected once, found repeated", w->where,
                                      w->noun, w->path);
                    goto cleanup;
                }
            }
        }
    }
    if (cJSON_IsObject(node) || cJSON_IsArray(node)) {
        /* Depth is bounded by cJSON's nesting limit (CJSON_NESTING_LIMIT). */
        int index = 0;
        for (const cJSON *c = node->child; c != NULL; c = c->next, index++) {
            if (!cJSON_IsObject(c) && !cJSON_IsArray(c)) continue;
            size_t saved = w->len;
            path_push(w, c, index);
            st = keys_walk(c, w);
            w->len = saved;
            w->path[saved] = '\0';
            if (st != KV_OK) goto cleanup;
        }
    }

cleanup:
    free(keys);
    return st;
}

KvStatus kv_file_check_json_keys(const cJSON *root, const char *where, const char *noun,
                                 KvError *err) {
    KeyWalk w = {.len = 0, .where = where, .noun = noun, .err = err};
    w.path[0] = '\0';
    return keys_walk(root, &w);
}
