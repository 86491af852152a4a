"""Result folders are data: how the analysis commands read and write files.

Reading (``read_bytes``): only regular files. The file is opened without blocking (a FIFO with no writer
never hangs the command) and checked with ``fstat`` on the open descriptor, so a FIFO, socket or device met
under any name (a symlink to one included) raises ``NotRegular``, which callers report as a skipped file.

Writing (``write_bytes``): a new regular file created beside the target (``O_EXCL``, never through a link)
and renamed over it, so bytes only ever land in a file the command created itself. A target that is a
symbolic link, or exists and is not a regular file, is refused (``RefusedWrite``), naming it; a hard link's
other names keep their content.
"""
from __future__ import annotations

import errno
import os
import stat
import tempfile
from pathlib import Path

MAX_BYTES = 1 << 28  # results.json, configs and event files are far smaller; a bigger one is not a result file


class NotRegular(ValueError):
    """The path is not a regular file (a FIFO, socket, device or directory, or a dangling link)."""


class RefusedWrite(ValueError):
    """An analysis command refused to write a file (a symbolic link or special file in its place)."""


def kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISDIR, "a directory"), (stat.S_ISLNK, "a symbolic link")):
        if test(mode):
            return name
    return "not a regular file"


def read_bytes(path) -> bytes:
    """The content of ``path`` if it is a regular file (after following links) of at most MAX_BYTES bytes;
    NotRegular naming it otherwise, OSError when it cannot be opened."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        if path.is_symlink():
            raise NotRegular(f"{path} is a dangling symbolic link (to {os.readlink(path)!r})") from None
        raise
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENXIO):  # a link loop; a socket
            raise NotRegular(f"{path} cannot be opened as a regular file ({e.strerror})") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegular(f"{path} is {kind(st.st_mode)}, not a regular file")
        if st.st_size > MAX_BYTES:
            raise ValueError(f"{path} is {st.st_size} bytes, more than a result file can be ({MAX_BYTES})")
        os.set_blocking(fd, True)
        chunks, total = [], 0
        while True:
            b = os.read(fd, 1 << 20)
            if not b:
                break
            total += len(b)
            if total > MAX_BYTES:
                raise ValueError(f"{path} grew past {MAX_BYTES} bytes while being read")
            chunks.append(b)
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_text(path) -> str:
    """``read_bytes`` decoded as UTF-8 (ValueError naming the file otherwise)."""
    data = read_bytes(path)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path} is not UTF-8 text ({e.reason} at byte {e.start})") from None


def is_regular(path) -> bool:
    """Whether ``path`` is a regular file after following links (no open: never blocks)."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except (OSError, ValueError):
        return False


def check_writable(path) -> Path:
    """``path`` if a new file may replace it: RefusedWrite when it is a symbolic link or a non-regular file."""
    path = Path(path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return path
    if stat.S_ISLNK(st.st_mode):
        raise RefusedWrite(f"refusing to write {path}: it is a symbolic link (to {os.readlink(path)!r}), and "
                           "this command never writes through a link; remove it or choose another path")
    if not stat.S_ISREG(st.st_mode):
        raise RefusedWrite(f"refusing to write {path}: it is {kind(st.st_mode)}, not a regular file")
    return path


def write_bytes(path, data: bytes) -> Path:
    """Write ``data`` to ``path`` as a new regular file (module docstring); its directory is created."""
    path = check_writable(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)  # mkstemp's 0600 would hide a plot from the group that shares the sweep
        check_writable(path)  # planted while we wrote: still refused (os.replace would not follow it anyway)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path

