/* file_open.h: opening an input file that must be a regular file, without
 * blocking on a FIFO or a device, with the project's messages ("<path>:
 * cannot open: ...", "expected a regular file, found a FIFO"), shared by the
 * config.json and safetensors loaders. */
#ifndef KV_FILE_OPEN_H
#define KV_FILE_OPEN_H

#include <sys/stat.h>

#include "status.h"

/* Opens path read-only into *fd and fills *sb. Only a regular file is opened
 * for reading: a FIFO, directory, device or socket is refused with
 * "<path>: expected a regular file, found a FIFO" (directory, device, socket),
 * without blocking (a FIFO with no writer would otherwise hang the open, and a
 * device could stream forever). On failure *fd is -1, nothing is left open,
 * and the status is KV_ERR_INPUT naming the path. */
KvStatus kv_file_open_regular(const char *path, int *fd, struct stat *sb, KvError *err);

#endif
