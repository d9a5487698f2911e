/* file_open.c: see file_open.h. */
#include "file_open.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

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
        goto exit;
    }
    if (!S_ISREG(sb->st_mode)) {
        st = refuse_kind(path, sb->st_mode, err);
        goto exit;
    }
    /* Back to ordinary blocking reads (O_NONBLOCK means nothing for a
     * regular file on Linux, but the descriptor should say what it is). */
    int flags = fcntl(*fd, F_GETFL);
    if (flags < 0 || fcntl(*fd, F_SETFL, flags & ~O_NONBLOCK) != 0) {
        st = kv_error_set(err, KV_ERR_INPUT, "%s: cannot clear O_NONBLOCK: %s", path,
                          strerror(errno));
        goto exit;
    }

exit:
    if (st != KV_OK) {
        close(*fd);
        *fd = -1;
    }
    return st;
}
