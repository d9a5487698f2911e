/* file_open.h: opening an input file that must be a regular file, with the
 * project's messages ("<path>: cannot open: ...", "expected a regular file,
 * found a directory"), shared by the config.json and safetensors loaders. */
#ifndef KV_FILE_OPEN_H
#define KV_FILE_OPEN_H

#include <sys/stat.h>

#include "status.h"

/* Opens path read-only into *fd and fills *sb. On failure *fd is -1, nothing
 * is left open, and the status is KV_ERR_INPUT naming the path. */
KvStatus kv_file_open_regular(const char *path, int *fd, struct stat *sb, KvError *err);

#endif
