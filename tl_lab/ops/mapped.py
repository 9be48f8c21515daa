"""A file mapped read-only (given): what plays memmap2 for the learner's `SafeTensors`.

Chapter L10.1, section 2.3: the operating system pages a mapped file's bytes in on first touch, so
a 270 MB checkpoint is not copied before the first request. `MappedFile` holds the map, closes it,
hands pages that were widened once back to the OS, and refuses to read a file that was cut short
since it was opened (touching a page past its new end kills the process with SIGBUS).
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path

from tl_lab.errors import FormatError
from tl_lab.ops.widening import drop_pages

__all__ = ["MappedFile", "inode"]


def inode(path: str) -> tuple[int, int] | None:
    """(device, inode) of `path`, None when it cannot be read."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


class MappedFile:
    """path: the file; mm: its read-only map (or the bytes of a file too short to map); size: its
    length when it was opened; data_start: where its data buffer begins (offsets count from there). Use as a context manager or call `close()`."""

    def __init__(self, path: Path, mm: mmap.mmap | bytes, size: int, data_start: int = 0):
        self.path, self._mm, self._size, self._data_start = path, mm, size, data_start
        self._where = os.path.abspath(path)  # a notebook's chdir must not make it another file
        self._inode = inode(self._where)

    def check_not_truncated(self) -> None:
        """FormatError when the mapped file was cut short since open (docs/cli.md). A file replaced by
        a rename is another inode and harmless: the map keeps the old one's pages."""
        try:
            st = os.stat(self._where)
        except OSError:
            return  # deleted: the map keeps the pages
        if (st.st_dev, st.st_ino) == self._inode and st.st_size < self._size:
            raise FormatError(f"{self.path}: the file is {st.st_size} bytes now, {self._size} when "
                              "it was opened (truncated or rewritten in place); open it again")

    def close(self) -> None:
        """Unmap the file. Views still alive keep the map until they are collected."""
        mm, self._mm = self._mm, None
        if isinstance(mm, mmap.mmap):
            try:
                mm.close()
            except BufferError:  # exported views: the map closes when the last one dies
                pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def drop_pages(self, begin: int, end: int) -> None:
        """Hand bytes [begin, end) of the data buffer back to the OS (`tl_lab.ops.widening.drop_pages`)."""
        drop_pages(self._mm, self._data_start + begin, self._data_start + end)
