"""Reading operator-supplied files safely: regular files only, never more than a stated size.

Flag files, plans, data files and checkpoints are named by the operator, so a path may be a
named pipe (opening or reading it blocks forever), a device such as ``/dev/zero`` (endless) or
a symlink to one; ``stat().st_size`` is 0 for all of those, so a size check alone lets them
through. :func:`read_regular` opens without blocking, checks with ``fstat`` on the opened file
that it is a regular file, and reads at most ``limit + 1`` bytes; :func:`check_regular` does the
first two for files another library reads itself (CSV, Parquet, safetensors).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path


class FileProblem(ValueError):
    """A file cannot be read as asked; the message is one line, without the path."""


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a named pipe (FIFO)"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def _open(path: str | Path) -> int:
    try:
        return os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise FileProblem(f"cannot read ({exc.strerror})") from None


def _check(fd: int) -> os.stat_result:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise FileProblem(f"not a regular file ({_kind(st.st_mode)})")
    return st


def check_regular(path: str | Path) -> int:
    """Refuse anything but a readable regular file (symlinks are followed); returns its size."""
    fd = _open(path)
    try:
        return int(_check(fd).st_size)
    finally:
        os.close(fd)


def read_regular(path: str | Path, limit: int) -> bytes:
    """The bytes of the regular file ``path``, refused beyond ``limit`` bytes."""
    fd = _open(path)
    try:
        st = _check(fd)
        if st.st_size > limit:
            raise FileProblem(f"file is {st.st_size} bytes, larger than the limit of {limit}")
        os.set_blocking(fd, True)
        chunks, total = [], 0
        while total <= limit:
            try:
                chunk = os.read(fd, min(1 << 20, limit + 1 - total))
            except OSError as exc:
                raise FileProblem(f"cannot read ({exc.strerror})") from None
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        if total > limit:
            raise FileProblem(f"file is more than {limit} bytes, larger than the limit of {limit}")
        return b"".join(chunks)
    finally:
        os.close(fd)
