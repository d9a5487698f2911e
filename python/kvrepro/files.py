"""Reading input files and publishing output files as the C side does.

Inputs (model/file_open.c kv_file_open_regular): opened with O_NONBLOCK,
so that a FIFO cannot block the open, then checked on the open descriptor to
be a regular file of at most a stated size, so that /dev/zero cannot be read
until memory runs out.

Outputs (reports/report.c kv_report_check_writable, kv_report_file_publish),
the same rules:
  - what stands at the path must be nothing, a regular file or a symbolic
    link; a link is replaced itself (the rename replaces it), its target is
    never written. A directory, a device, a FIFO or a socket is refused
    (renaming over /dev/null as root would replace the device), and so is a
    name of the form of a writer's temporary, NAME.tmp-DIGITS;
  - the bytes go to an unnamed file in the path's directory (O_TMPFILE),
    which is then linked as "<path>.tmp-<pid>" and renamed over the path;
    where the file system has no unnamed files, to "<path>.tmp-<pid>"
    created with O_EXCL|O_NOFOLLOW (a link planted at that name is never
    followed: the create fails), then renamed. A failure removes the
    temporary, and first the "<path>.tmp-<pid>" files of processes that no
    longer exist (left by a killed writer) are removed;
  - every failure of the destination (a full disk included) is bad input.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable
from typing import BinaryIO

from .errors import InputError

TMP_SUFFIX = ".tmp-"


def file_kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    return "something that is not a file"


def _why(e: OSError) -> str:
    return e.strerror or str(e)


def open_regular(path: str, what: str) -> int:
    """A read-only descriptor of path, which must be a regular file (what
    names the argument for an empty path)."""
    if not path:
        raise InputError(f"{what}: expected a file name, found an empty string")
    try:
        # O_NONBLOCK: opening a FIFO for reading blocks until a writer appears
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError as e:
        try:
            st = os.stat(path)   # a socket cannot be opened (ENXIO): say what it is
        except OSError:
            st = None
        if st is not None and not stat.S_ISREG(st.st_mode):
            raise InputError(f"{path}: expected a regular file, found {file_kind(st.st_mode)}") from None
        raise InputError(f"{path}: cannot open: {_why(e)}") from None
    try:
        st = os.fstat(fd)   # checked on the descriptor: a path swapped since cannot slip through
        if not stat.S_ISREG(st.st_mode):
            raise InputError(f"{path}: expected a regular file, found {file_kind(st.st_mode)}")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_regular(path: str, max_bytes: int, what: str) -> bytes:
    """The whole of path, a regular file of at most max_bytes bytes."""
    fd = open_regular(path, what)
    try:
        size = os.fstat(fd).st_size
        if size > max_bytes:
            raise InputError(f"{path}: {size} bytes, above the {max_bytes >> 20} MiB a {what} file may have")
        chunks, got = [], 0
        while got <= max_bytes:   # a file growing while read is bounded too
            b = os.read(fd, min(1 << 20, max_bytes + 1 - got))
            if not b:
                break
            chunks.append(b)
            got += len(b)
        if got > max_bytes:
            raise InputError(f"{path}: more than the {max_bytes >> 20} MiB a {what} file may have")
        return b"".join(chunks)
    except OSError as e:
        raise InputError(f"{path}: cannot read: {_why(e)}") from None
    finally:
        os.close(fd)


def is_temp_name(path: str) -> bool:
    """NAME.tmp-DIGITS with a non-empty NAME (reports/report.c
    kv_report_is_temp_name): a writer's temporary, which readers refuse."""
    base = os.path.basename(path)
    i = base.rfind(TMP_SUFFIX)
    digits = base[i + len(TMP_SUFFIX):] if i > 0 else ""
    return digits.isascii() and digits.isdigit()


def _split(path: str) -> tuple[str, str]:
    d, base = os.path.split(path)
    return d or ".", base


def check_target(path: str, what: str) -> None:
    """What stands at path can be replaced by a rename: nothing, a regular
    file or a symbolic link (the link itself is replaced)."""
    if not path:
        raise InputError(f"{what}: expected a file name, found an empty string")
    if is_temp_name(path):
        raise InputError(f"{path}: cannot create: a name ending in {TMP_SUFFIX}DIGITS is a writer's temporary")
    if not _split(path)[1]:
        raise InputError(f"{path}: cannot create: {os.strerror(errno.EISDIR)}")
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as e:
        raise InputError(f"{path}: cannot create: {_why(e)}") from None
    if stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode):
        return
    if stat.S_ISDIR(st.st_mode):
        raise InputError(f"{path}: cannot create: {os.strerror(errno.EISDIR)}")
    raise InputError(f"{path}: cannot create: expected a regular file or a new name, "
                     f"found {file_kind(st.st_mode)}")


def _tmpfile_unsupported(e: OSError) -> bool:
    # old kernels that do not know O_TMPFILE see O_DIRECTORY: EISDIR
    return e.errno in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL)


def _open_unnamed(directory: str) -> int | None:
    """An unnamed file in directory (O_TMPFILE), or None where the file
    system has none."""
    flag = getattr(os, "O_TMPFILE", 0)
    if not flag:
        return None
    try:
        return os.open(directory, flag | os.O_RDWR | os.O_CLOEXEC, 0o666)
    except OSError as e:
        if _tmpfile_unsupported(e):
            return None
        raise


def _open_named(tmp: str) -> int:
    """The named temporary, new, never through a link (reports/report.c
    open_named_temp): O_EXCL|O_NOFOLLOW refuse whatever is at the name (a
    leftover of an earlier process with this pid, or a link planted so that
    the writer would overwrite its target); the name itself (the link, not
    its target) is then removed and the create tried once more."""
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        return os.open(tmp, flags, 0o666)
    except OSError as e:
        if e.errno not in (errno.EEXIST, errno.ELOOP):
            raise
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass
    return os.open(tmp, flags, 0o666)


def check_writable(path: str, what: str) -> None:
    """Before a long run: path can be published later (check_target, and a
    file can be created in its directory). Leaves nothing behind."""
    check_target(path, what)
    directory, base = _split(path)
    try:
        fd = _open_unnamed(directory)
        if fd is None:
            tmp = os.path.join(directory, f"{base}{TMP_SUFFIX}{os.getpid()}")
            fd = _open_named(tmp)
            os.unlink(tmp)
        os.close(fd)
    except OSError as e:
        raise InputError(f"{path}: cannot create: {_why(e)}") from None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:   # EPERM: it exists (another user's)
        return True
    return True


def remove_stale_temps(directory: str, base: str) -> None:
    """Removes "<base>.tmp-<pid>" in directory for every pid that no longer
    exists, and this process's own (an earlier process with this pid left
    it). Best effort: a leftover that cannot be removed must not stop the
    write. unlink removes a link itself, never its target."""
    prefix = base + TMP_SUFFIX
    try:
        names = os.listdir(directory)
    except OSError:
        return
    me = os.getpid()
    for name in names:
        digits = name[len(prefix):]
        if not name.startswith(prefix) or not (digits.isascii() and digits.isdigit()):
            continue
        pid = int(digits)
        if pid <= 0 or pid > 2**31 - 1:
            continue
        if pid == me or not _pid_alive(pid):
            try:
                os.unlink(os.path.join(directory, name))
            except OSError:
                pass


def _fsync_dir(directory: str) -> None:
    # best effort: the file is complete under its name either way
    try:
        dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        os.fsync(dfd)
    except OSError:
        pass
    finally:
        os.close(dfd)


def _write_fd(fd: int, write: Callable[[BinaryIO], None]) -> None:
    """write(f) on a file object over fd (readable too: HDF5 reads back what
    it wrote), flushed and synced; fd stays open."""
    f = os.fdopen(fd, "w+b", closefd=False)
    try:
        write(f)
        f.flush()
    finally:
        f.close()
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.ENOTSUP):
            raise


def publish(path: str, write: Callable[[BinaryIO], None], what: str) -> None:
    """Writes path through write(f) so that path is either untouched or
    complete, never through a link, and no temporary outlives the call.
    Every failure of the destination raises InputError naming path; an
    exception from write itself propagates after the cleanup."""
    check_target(path, what)
    directory, base = _split(path)
    tmp = os.path.join(directory, f"{base}{TMP_SUFFIX}{os.getpid()}")
    remove_stale_temps(directory, base)
    fd, named = -1, False
    try:
        try:
            fd = _open_unnamed(directory)   # a writer killed while writing leaves nothing
        except OSError as e:
            raise InputError(f"{path}: cannot create: {_why(e)}") from None
        if fd is not None:
            _write_fd(fd, write)
            try:
                # give it the temporary name; link never writes through
                # what is at tmp (EEXIST), so clear the name first
                try:
                    os.unlink(tmp)
                except FileNotFoundError:
                    pass
                os.link(f"/proc/self/fd/{fd}", tmp, follow_symlinks=True)
                named = True
            except OSError:
                # no /proc: write it again, named
                os.close(fd)
                fd = -1
        if not named:
            try:
                fd = _open_named(tmp)
            except OSError as e:
                raise InputError(f"{path}: cannot create: {_why(e)}") from None
            named = True
            _write_fd(fd, write)
        os.close(fd)
        fd = -1
        try:
            os.replace(tmp, path)   # replaces a link at path itself, not its target
        except OSError as e:
            # e.g. path became a directory since the check
            raise InputError(f"{path}: cannot create: {_why(e)}") from None
        named = False
        _fsync_dir(directory)
    except OSError as e:   # the destination's: a full disk, a quota, an I/O error
        raise InputError(f"{path}: cannot write: {_why(e)}") from None
    finally:
        if fd is not None and fd >= 0:
            os.close(fd)
        if named:
            try:
                os.unlink(tmp)
            except OSError:
                pass


def check_out_dir(out_dir: str, names: tuple[str, ...], what: str) -> None:
    """out_dir is a directory, or a new name (created later), and if it
    exists each of names in it can be published (check_target). Creates
    nothing."""
    if not out_dir:
        raise InputError(f"{what}: expected a directory name, found an empty string")
    try:
        st = os.stat(out_dir)   # a link to a directory is that directory
    except FileNotFoundError:
        return
    except OSError as e:
        raise InputError(f"{out_dir}: cannot create: {_why(e)}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise InputError(f"{out_dir}: cannot create: not a directory (found {file_kind(st.st_mode)})")
    for name in names:
        check_target(os.path.join(out_dir, name), what)


def same_file(out: str, src: str) -> bool:
    """Publishing out would replace the file src names: out's own directory
    entry (a link at out is replaced itself, lstat) is src's file or src's
    link."""
    try:
        o = os.lstat(out)
    except OSError:
        return False
    ids = set()
    for f in (os.stat, os.lstat):
        try:
            s = f(src)
        except OSError:
            continue
        ids.add((s.st_dev, s.st_ino))
    return (o.st_dev, o.st_ino) in ids
