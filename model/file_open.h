/* file_open.h: what the config.json and safetensors loaders share about their
 * input files: opening a file that must be a regular file (without blocking on
 * a FIFO or a device), reading a small one (config.json, the shard index)
 * whole, and the checks on JSON text that cJSON does not make but Python's
 * json (transformers) and serde_json (safetensors) do, so that kvrepro never
 * reads a file differently from them. */
#ifndef KV_FILE_OPEN_H
#define KV_FILE_OPEN_H

#include <stddef.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "status.h"

/* Opens path read-only into *fd and fills *sb. Only a regular file is opened
 * for reading: a FIFO, directory, device or socket is refused with
 * "<path>: expected a regular file, found a FIFO" (directory, device, socket),
 * without blocking (a FIFO with no writer would otherwise hang the open, and a
 * device could stream forever). On failure *fd is -1, nothing is left open,
 * and the status is KV_ERR_INPUT naming the path. */
KvStatus kv_file_open_regular(const char *path, int *fd, struct stat *sb, KvError *err);

/* Reads the whole of the regular file at path (opened as kv_file_open_regular
 * does) into *text, malloc'd and NUL-terminated, its length in *len (the NUL
 * not counted). A file above max_bytes is refused before anything is read:
 * KV_ERR_INPUT "<path>: expected at most <max_bytes> bytes, found <size>".
 * A file that shrinks while being read gives what was there (*len < the size
 * stat saw); one that grows gives the size stat saw. Out of memory is
 * KV_ERR_INTERNAL "<path>: out of memory", a failed read KV_ERR_INPUT
 * "<path>: cannot read: <strerror>". On failure *text is NULL and *len 0. */
KvStatus kv_file_read_small(const char *path, size_t max_bytes, char **text, size_t *len,
                            KvError *err);

/* Checks len bytes of JSON text for what cJSON accepts but the reference
 * readers refuse or read differently:
 * - a UTF-8 byte-order mark at the start (cJSON skips it, Python's json
 *   refuses it);
 * - bytes that are not UTF-8 (RFC 3629: no overlong forms, no surrogates,
 *   nothing above U+10FFFF, no truncated sequence);
 * - a raw control character (below 0x20) inside a string;
 * - the escape \u0000 inside a string or key: cJSON decodes it to a NUL and
 *   cuts the string there, so the key "w\u0000x" would be read as "w".
 * NUL bytes must have been refused by the caller (the text is scanned to len,
 * not to a terminator). Messages start with `where` ("config.json",
 * "model.safetensors: header") and give the byte offset. */
KvStatus kv_file_check_json_text(const char *text, size_t len, const char *where,
                                 KvError *err);

/* Checks that no object anywhere under root has the same key twice: cJSON
 * keeps every copy and finds the first, Python's json keeps the last, serde
 * refuses. Each object's keys are sorted and neighbours compared, so the cost
 * is O(n log n) in the number of keys. A repeat is KV_ERR_INPUT
 * "<where>: <noun> '<path>': expected once, found repeated", with the dotted
 * path of the key ("rope_parameters.rope_theta", "model.norm.weight.dtype").
 * KV_ERR_INTERNAL on out of memory. */
KvStatus kv_file_check_json_keys(const cJSON *root, const char *where, const char *noun,
                                 KvError *err);

#endif
