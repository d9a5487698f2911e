/* status.h: status codes and the error message carrier used by every module.
 *
 * Library code never exits: it returns a KvStatus and, on failure, fills a
 * KvError with a message that names the file, the tensor or field, what was
 * expected and what was found. Only main() turns a status into an exit code,
 * and the numeric values are chosen to be those exit codes (DESIGN §8). */
#ifndef KV_STATUS_H
#define KV_STATUS_H

#ifdef __cplusplus
extern "C" { /* shared with the CUDA (.cu, compiled as C++) side */
#endif

typedef enum {
    KV_OK = 0,
    KV_ERR_INPUT = 2,    /* bad input or usage: malformed file, wrong shape, missing file */
    KV_ERR_INTERNAL = 3, /* out of memory, failed write, a broken invariant */
    KV_SKIP = 77,        /* the thing cannot run here (no GPU); never a pass */
} KvStatus;

typedef struct {
    char msg[1024];
} KvError;

/* Sets err->msg from a printf-style format (err may be NULL) and returns st,
 * so call sites read `return kv_error_set(err, KV_ERR_INPUT, "...", ...);`. */
KvStatus kv_error_set(KvError *err, KvStatus st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Prepends "prefix: " to an existing message (used to add the file name when a
 * lower layer only knew the field). */
void kv_error_prefix(KvError *err, const char *prefix);

#ifdef __cplusplus
}
#endif

#endif
