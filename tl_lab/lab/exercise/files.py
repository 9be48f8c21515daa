"""File hygiene for the exercise commands: only regular files are read, in bounded reads, never through a
link; writes go to a unique temporary file in the same folder, then a rename, so a link, a FIFO or a folder
planted under the name is replaced, never written through, and nothing is ever half-written (issue #61)."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

__all__ = ["NotRegular", "read_regular", "write_atomic", "open_fresh", "SOURCE_LIMIT", "STATUS_LIMIT"]

SOURCE_LIMIT = 4 << 20   # bytes of a learner's module (the largest reference module is ~60 KB)
STATUS_LIMIT = 16 << 20  # bytes of a status.json


class NotRegular(OSError):
    """A path that is a link, a FIFO, a device or a folder where a regular file was expected, or one too large."""


def read_regular(path, limit: int) -> bytes:
    """The bytes of regular file `path`, at most `limit` (NotRegular past it): a link, FIFO, device or folder is
    NotRegular, and never opened in a way that could block (O_NONBLOCK) or follow a link (O_NOFOLLOW)."""
    path = Path(path)
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if path.is_symlink():
            raise NotRegular(exc.errno or 40, "a link, not a file (links are not read)", str(path)) from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegular(21, "not a regular file (a FIFO, a device or a folder)", str(path))
        if st.st_size > limit:
            raise NotRegular(27, f"{st.st_size / 1e6:.1f} MB, past the {limit >> 20} MB limit", str(path))
        chunks, got = [], 0
        while got <= limit:
            b = os.read(fd, min(1 << 20, limit + 1 - got))
            if not b:
                break
            chunks.append(b)
            got += len(b)
        if got > limit:
            raise NotRegular(27, f"past the {limit >> 20} MB limit", str(path))
        return b"".join(chunks)
    finally:
        os.close(fd)


def write_atomic(path, data: bytes) -> None:
    """`data` into `path` through a unique temporary file in its folder, then a rename (never through a link)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def open_fresh(path):
    """A new regular file at `path` for writing (text, UTF-8): whatever was there (a link, a FIFO) is removed
    first, and the file is created exclusively, so nothing is written through a link."""
    path = Path(path)
    try:
        if path.is_symlink() or (path.exists() and not path.is_dir()):
            path.unlink()
    except OSError:
        pass
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
    return os.fdopen(fd, "w", encoding="utf-8", errors="replace")
