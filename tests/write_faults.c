/* write_faults.c: the --wrap side of write_faults.h. Each __wrap_X records
 * the call while armed, applies the armed action when its index comes, and
 * otherwise calls __real_X (the C library's X). Unarmed, every wrapper is a
 * plain pass-through, so the Check framework (linked statically, and so
 * wrapped too) and the test's own file handling are unaffected. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* O_TMPFILE */
#endif
#include "write_faults.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

int __real_open(const char *path, int flags, ...);
ssize_t __real_write(int fd, const void *buf, size_t n);
int __real_fsync(int fd);
int __real_close(int fd);
int __real_linkat(int olddirfd, const char *oldpath, int newdirfd, const char *newpath, int flags);
int __real_rename(const char *oldpath, const char *newpath);
int __real_unlink(const char *path);
int __real_unlinkat(int dirfd, const char *path, int flags);

int __wrap_open(const char *path, int flags, ...);
ssize_t __wrap_write(int fd, const void *buf, size_t n);
int __wrap_fsync(int fd);
int __wrap_close(int fd);
int __wrap_linkat(int olddirfd, const char *oldpath, int newdirfd, const char *newpath, int flags);
int __wrap_rename(const char *oldpath, const char *newpath);
int __wrap_unlink(const char *path);
int __wrap_unlinkat(int dirfd, const char *path, int flags);

static struct {
    bool armed;
    bool no_tmpfile;
    int at;
    WfAction action;
    int errnum;
    int notify_fd;
    bool fired;
    int fail_next_write; /* WF_SHORT_FAIL: the errno for the next write, 0 = none */
    int n;
    bool overflow;
    WfCall calls[WF_MAX_CALLS];
} g_wf;

void wf_arm(int at, WfAction action, int errnum, int fd) {
    memset(&g_wf.calls, 0, sizeof g_wf.calls);
    g_wf.n = 0;
    g_wf.overflow = false;
    g_wf.at = at;
    g_wf.action = action;
    g_wf.errnum = errnum;
    g_wf.notify_fd = fd;
    g_wf.fired = false;
    g_wf.fail_next_write = 0;
    g_wf.armed = true;
}

void wf_disarm(void) {
    g_wf.armed = false;
    g_wf.fail_next_write = 0;
}

void wf_set_no_tmpfile(bool on) { g_wf.no_tmpfile = on; }

bool wf_fired(void) { return g_wf.fired; }

const WfCall *wf_trace(int *n) {
    *n = g_wf.n;
    return g_wf.calls;
}

bool wf_overflow(void) { return g_wf.overflow; }

const char *wf_op_name(WfOp op) {
    static const char *const names[WF_N_OPS] = {
        [WF_OPEN] = "open",     [WF_OPEN_TMP] = "open(O_TMPFILE)", [WF_WRITE] = "write",
        [WF_FSYNC] = "fsync",   [WF_CLOSE] = "close",              [WF_LINKAT] = "linkat",
        [WF_RENAME] = "rename", [WF_UNLINK] = "unlink",            [WF_UNLINKAT] = "unlinkat",
    };
    return (int)op >= 0 && op < WF_N_OPS ? names[op] : "?";
}

void wf_call_text(const WfCall *c, char *buf, size_t n) {
    switch (c->op) {
    case WF_WRITE:
        snprintf(buf, n, "write(%d, %zu bytes) = %ld", c->fd, c->len, c->result);
        break;
    case WF_FSYNC:
    case WF_CLOSE:
        snprintf(buf, n, "%s(%d) = %ld", wf_op_name(c->op), c->fd, c->result);
        break;
    case WF_LINKAT:
    case WF_RENAME:
        snprintf(buf, n, "%s(%s, %s) = %ld", wf_op_name(c->op), c->path, c->path2, c->result);
        break;
    default:
        snprintf(buf, n, "%s(%s) = %ld", wf_op_name(c->op), c->path, c->result);
        break;
    }
    if (c->result < 0) {
        const size_t used = strlen(buf);
        snprintf(buf + used, n - used, " %s", strerror(c->err));
    }
}

/* A new trace entry for this call, or NULL when not armed or full. */
static WfCall *wf_record(WfOp op, const char *path, const char *path2) {
    if (!g_wf.armed) return NULL;
    if (g_wf.n >= WF_MAX_CALLS) {
        g_wf.overflow = true;
        return NULL;
    }
    WfCall *c = &g_wf.calls[g_wf.n++];
    c->op = op;
    c->fd = -1;
    if (path != NULL) snprintf(c->path, sizeof c->path, "%s", path);
    if (path2 != NULL) snprintf(c->path2, sizeof c->path2, "%s", path2);
    return c;
}

/* One byte, the call's op, to the armed descriptor (none: -1). */
static void wf_tell(const WfCall *c) {
    const unsigned char byte = (unsigned char)c->op;
    if (g_wf.notify_fd >= 0 && __real_write(g_wf.notify_fd, &byte, 1) != 1) {
        /* the parent is gone; nothing to tell */
    }
}

/* The action for the call just recorded (WF_RECORD when none). */
static WfAction wf_action(const WfCall *c) {
    if (c == NULL || (int)(c - g_wf.calls) != g_wf.at) return WF_RECORD;
    g_wf.fired = true;
    if (g_wf.action == WF_NOTIFY) wf_tell(c);
    return g_wf.action;
}

/* Stops this process where a parent (which reads the call's op from the
 * armed descriptor, when there is one) can look at the files and kill it. */
static void wf_stop(const WfCall *c) {
    wf_tell(c);
    raise(SIGSTOP);
}

/* Records the outcome r of the call (errno as left by it). */
static long wf_done(WfCall *c, long r) {
    const int e = errno;
    if (c != NULL) {
        c->result = r;
        c->err = r < 0 ? e : 0;
    }
    errno = e;
    return r;
}

/* For the calls with no special case: fail, stop around, or pass. */
#define WF_SIMPLE(c, call)                                                                         \
    do {                                                                                           \
        const WfAction a_ = wf_action(c);                                                          \
        if (a_ == WF_FAIL) {                                                                       \
            errno = g_wf.errnum;                                                                   \
            return (int)wf_done((c), -1);                                                          \
        }                                                                                          \
        if (a_ == WF_STOP_BEFORE) wf_stop(c);                                                      \
        const int r_ = (int)wf_done((c), (call));                                                  \
        if (a_ == WF_STOP_AFTER) wf_stop(c);                                                       \
        return r_;                                                                                 \
    } while (0)

int __wrap_open(const char *path, int flags, ...) {
    mode_t mode = 0;
    const bool tmpfile = (flags & O_TMPFILE) == O_TMPFILE;
    if ((flags & O_CREAT) != 0 || tmpfile) {
        va_list ap;
        va_start(ap, flags);
        mode = (mode_t)va_arg(ap, int);
        va_end(ap);
    }
    WfCall *c = wf_record(tmpfile ? WF_OPEN_TMP : WF_OPEN, path, NULL);
    if (c != NULL) c->flags = flags;
    const WfAction a = wf_action(c);
    if (a == WF_FAIL) {
        errno = g_wf.errnum;
        return (int)wf_done(c, -1);
    }
    if (a == WF_STOP_BEFORE) wf_stop(c);
    int r;
    if (tmpfile && g_wf.no_tmpfile) {
        errno = EOPNOTSUPP;
        r = -1;
    } else {
        r = __real_open(path, flags, mode);
    }
    wf_done(c, r);
    if (c != NULL) c->fd = r;
    if (a == WF_STOP_AFTER) wf_stop(c);
    return r;
}

ssize_t __wrap_write(int fd, const void *buf, size_t n) {
    WfCall *c = wf_record(WF_WRITE, NULL, NULL);
    if (c != NULL) {
        c->fd = fd;
        c->len = n;
    }
    if (c != NULL && g_wf.fail_next_write != 0) {
        errno = g_wf.fail_next_write;
        g_wf.fail_next_write = 0;
        return (ssize_t)wf_done(c, -1);
    }
    const WfAction a = wf_action(c);
    if (a == WF_FAIL) {
        errno = g_wf.errnum;
        return (ssize_t)wf_done(c, -1);
    }
    if (a == WF_STOP_BEFORE) wf_stop(c);
    if ((a == WF_SHORT_FAIL || a == WF_STOP_MID) && n > 1) {
        const ssize_t r = __real_write(fd, buf, n / 2);
        wf_done(c, (long)r);
        if (a == WF_SHORT_FAIL) g_wf.fail_next_write = g_wf.errnum;
        if (a == WF_STOP_MID) wf_stop(c);
        return r;
    }
    const ssize_t r = __real_write(fd, buf, n);
    wf_done(c, (long)r);
    if (a == WF_STOP_AFTER || a == WF_STOP_MID) wf_stop(c);
    return r;
}

int __wrap_fsync(int fd) {
    WfCall *c = wf_record(WF_FSYNC, NULL, NULL);
    if (c != NULL) c->fd = fd;
    WF_SIMPLE(c, __real_fsync(fd));
}

int __wrap_close(int fd) {
    WfCall *c = wf_record(WF_CLOSE, NULL, NULL);
    if (c != NULL) c->fd = fd;
    const WfAction a = wf_action(c);
    if (a == WF_FAIL) {
        /* as on Linux after EIO from close: the descriptor is gone anyway */
        __real_close(fd);
        errno = g_wf.errnum;
        return (int)wf_done(c, -1);
    }
    if (a == WF_STOP_BEFORE) wf_stop(c);
    const int r = (int)wf_done(c, __real_close(fd));
    if (a == WF_STOP_AFTER) wf_stop(c);
    return r;
}

int __wrap_linkat(int olddirfd, const char *oldpath, int newdirfd, const char *newpath, int flags) {
    WfCall *c = wf_record(WF_LINKAT, oldpath, newpath);
    WF_SIMPLE(c, __real_linkat(olddirfd, oldpath, newdirfd, newpath, flags));
}

int __wrap_rename(const char *oldpath, const char *newpath) {
    WfCall *c = wf_record(WF_RENAME, oldpath, newpath);
    WF_SIMPLE(c, __real_rename(oldpath, newpath));
}

int __wrap_unlink(const char *path) {
    WfCall *c = wf_record(WF_UNLINK, path, NULL);
    WF_SIMPLE(c, __real_unlink(path));
}

int __wrap_unlinkat(int dirfd, const char *path, int flags) {
    WfCall *c = wf_record(WF_UNLINKAT, path, NULL);
    WF_SIMPLE(c, __real_unlinkat(dirfd, path, flags));
}
