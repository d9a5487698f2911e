/* status.c: formatting of KvError messages. */
#include "status.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

KvStatus kv_error_set(KvError *err, KvStatus st, const char *fmt, ...) {
    if (err != NULL) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
    }
    return st;
}

void kv_error_prefix(KvError *err, const char *prefix) {
    if (err == NULL || prefix == NULL) return;
    /* Shift the message right and write "prefix: " in front, truncating the
     * tail when the whole does not fit. */
    const size_t cap = sizeof err->msg - 1;
    size_t pl = strlen(prefix) + 2;
    if (pl > cap) pl = cap;
    size_t ml = strlen(err->msg);
    if (ml > cap - pl) ml = cap - pl;
    memmove(err->msg + pl, err->msg, ml);
    err->msg[pl + ml] = '\0';
    for (size_t i = 0; i + 2 < pl; i++) err->msg[i] = prefix[i];
    if (pl >= 2) {
        err->msg[pl - 2] = ':';
        err->msg[pl - 1] = ' ';
    }
}
