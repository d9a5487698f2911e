/* file_open.c: see file_open.h. */
#include "file_open.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

KvStatus kv_file_open_regular(const char *path, int *fd, struct stat *sb, KvError *err) {
    KvStatus st = KV_OK;
    *fd = open(path, O_RDONLY | O_CLOEXEC);
    if (*fd < 0) {
        return kv_error_set(err, KV_ERR_INPUT, "%s: cannot open: %s", path, strerror(errno));
    }
    if (fstat(*fd, sb) != 0) {
        st = kv_error_set(err, KV_ERR_INPUT, "%s: cannot stat: %s", path, strerror(errno));
    } else if (!S_ISREG(sb->st_mode)) {
        st = kv_error_set(err, KV_ERR_INPUT, "%s: expected a regular file, found %s", path,
                          S_ISDIR(sb->st_mode) ? "a directory" : "another kind of file");
    }
    if (st != KV_OK) {
        close(*fd);
        *fd = -1;
    }
    return st;
}
