"""Loading engineering the chapter's reader stands on: the parallel widening, the dropped pages, the arena.

Chapter L10.1, section 2.3 (loading). What the reader does is `tl_lab.model`'s (which tensor, which
dtype, which widening rule: the learner's part). How a load of 540 MB runs in a fraction of a second
is here, given: every tensor cut into pieces that threads widen in parallel straight into their
destinations (`widen_all`), each piece's file pages handed back to the OS once read (`drop_pages`),
and the destinations carved out of one anonymous map of 2 MiB pages (`Arena`).
"""

from __future__ import annotations

import math
import mmap
import threading
from dataclasses import dataclass
from typing import Callable

import numpy as np

from tl_lab.errors import FormatError
from tl_lab.ops.machine import cores

# Every f16 widened once, by numpy's exact cast: a 256 KB table that stays in cache. Looking a bit
# pattern up is about 3x faster than casting it again (the KV read-back widens on every step), and
# the int4 and int8 kernels widen their f16 scales through it. Given here, once, for both heads and
# for quant.py, which may be a learner's stub.
F16_AS_F32 = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)

__all__ = ["WIDEN_CHUNK", "MAX_WIDEN_THREADS", "Widening", "widen_threads", "parallel_for", "f32_out",
           "widen_all", "drop_pages", "Arena"]

WIDEN_CHUNK = 1 << 18  # elements per widening piece: 1 MB of f32; a thread's temporaries are piece-sized
MAX_WIDEN_THREADS = 8  # widening is bound by memory and page faults: more threads than this add nothing


def widen_threads() -> int:
    """Threads that widen a file's tensors: every core this process may run on (at most
    MAX_WIDEN_THREADS), whatever EngineConfig.threads says for the kernels. Why (section 2.3,
    loading): the first write to each fresh page of the weights costs a page fault in which the
    kernel zeroes the page, and those faults, not the arithmetic, are most of a load; they run in
    parallel on every core as transformers' loader runs them. Widening is elementwise, so the bits
    do not depend on the count."""
    return max(1, min(cores(), MAX_WIDEN_THREADS))


def parallel_for(work, items, n: int) -> None:
    """Call work(item) for every item, on n threads at once (the calling thread is one of them), each
    taking the next item when done with its last. The first exception (a Ctrl-C too) stops the others
    at their next item and is raised here once all have stopped."""
    pending, errors = iter(items), []

    def loop() -> None:
        try:
            for item in pending:  # next() on a list iterator is atomic under the GIL: no item runs twice
                if errors:
                    return
                work(item)
        except BaseException as exc:  # re-raised in the calling thread below
            errors.append(exc)

    helpers = [threading.Thread(target=loop, name=f"tl_lab-widen-{i}") for i in range(1, n)]
    for t in helpers:
        t.start()
    loop()
    for t in helpers:
        t.join()
    if errors:
        raise errors[0]


@dataclass(frozen=True)
class Widening:
    """One tensor to widen: its stored bits and its float32 destination, both flat (numel,); begin:
    where its bytes start in the file's data buffer (for `drop`)."""

    name: str
    begin: int
    bits: np.ndarray
    out: np.ndarray
    widen: Callable[..., np.ndarray]  # the reader's rule for the stored dtype: widen(bits, out=out) -> out


def f32_out(out: np.ndarray | None, shape: tuple, name: str) -> np.ndarray:
    """The array a tensor is widened into: `out` checked, or a new one."""
    if out is None:
        return np.empty(shape, dtype=np.float32)
    if out.dtype != np.float32 or out.shape != shape or not out.flags.c_contiguous:
        raise ValueError(f"out for tensor {name!r} must be C-contiguous float32 {shape}, got {out.dtype} {out.shape}")
    return out


def widen_all(jobs: list[Widening], drop: Callable[[int, int], None], finite: bool = False) -> None:
    """Widen every job, cut into pieces of WIDEN_CHUNK elements that `widen_threads()` threads widen
    in parallel (numpy releases the GIL inside each piece), each piece straight into its destination.
    With `finite` every piece is checked finite: a NaN or infinite weight is a FormatError naming the
    first such tensor (in the order of `jobs`) and its flat index. drop(begin, end) is told each
    piece's bytes of the data buffer once they are read."""
    pieces = [(k, a) for k, job in enumerate(jobs) for a in range(0, job.out.size, WIDEN_CHUNK)]
    bad: list[tuple[int, int]] = []  # (k, flat index) of non-finite weights in jobs[k]; list.append is atomic

    def piece(item: tuple[int, int]) -> None:
        k, a = item
        job = jobs[k]
        b = min(a + WIDEN_CHUNK, job.out.size)
        chunk = job.widen(job.bits[a:b], out=job.out[a:b])
        if finite:
            ok = np.isfinite(chunk)
            if not ok.all():
                bad.append((k, a + int(np.argmin(ok))))
        size = job.bits.itemsize
        drop(job.begin + a * size, job.begin + b * size)

    parallel_for(piece, pieces, widen_threads())
    if bad:
        k, i = min(bad)
        raise FormatError(f"tensor {jobs[k].name!r} holds a non-finite weight {jobs[k].out[i]} at flat index {i}")


def drop_pages(mm, begin: int, end: int) -> None:
    """Tell the OS this process is done with bytes [begin, end) of the map `mm` (MADV_DONTNEED on a
    read-only map): they leave this process's resident set. A page another piece still reads is
    paged in again from the page cache, so dropping one early costs time, never a wrong value."""
    if not isinstance(mm, mmap.mmap) or not hasattr(mmap, "MADV_DONTNEED") or end <= begin:
        return
    begin -= begin % mmap.PAGESIZE
    mm.madvise(mmap.MADV_DONTNEED, begin, end - begin)


class Arena:
    """One float32 buffer for all of a model's resident float32 weights, handed out in order.

    Why an anonymous map of its own and not np.empty (section 2.3, loading): nothing touches its pages
    before the widening writes them, so the kernel zeroes each page at that first write, in the
    widening thread that writes it, and the faults run on every core (faulting the whole map in
    first, MAP_POPULATE, took 0.16 s on one core, half of the load). Its size is exactly the
    weights', so loading holds nothing else at full size.

    Why 2 MiB pages (madvise hugepage, where the OS has them; numpy asks the same for any array of
    4 MB or more): a decode step reads every weight once, and in 4 KB pages it reads them slower.
    `kernels.matvec1_f32` over a 226 MB weight on processor E (AMD EPYC, Zen 4), best of 8
    interleaved passes: 24.4 -> 30.7 GB/s at 1 thread, 31.0 -> 33.7 at 2 (the machine's read probe,
    `machine.read_gbps`, runs in 2 MiB pages too). SmolLM2 f32 at batch 1, the same weights
    collapsed into 2 MiB pages, 16 interleaved rounds: 35.7 -> 29.9 ms a step at 1 thread, 24.9 ->
    19.1 (best) and 26.8 -> 24.7 (median) at 2. The price is at load, on a VM whose host takes
    back free memory: a fresh 2 MiB page is such memory, handed over again at its first touch
    (512 MB touched in 0.05 to 1.6 s from one process to the next, against about 0.21 s in 4 KB
    pages; /proc/vmstat counted no compaction stall). SmolLM2's load took 0.20-0.88 s against
    0.27-0.31 in 4 KB pages. A load happens once, its steps all along.
    """

    def __init__(self, n: int) -> None:
        flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
        mm = mmap.mmap(-1, max(4 * n, 1), flags=flags)
        try:  # Linux; elsewhere, or a kernel without transparent huge pages, the OS's own page size
            mm.madvise(mmap.MADV_HUGEPAGE)
        except (AttributeError, OSError):
            pass
        self.buf = np.frombuffer(mm, dtype=np.float32, count=n)
        self.used = 0

    def take(self, shape: tuple[int, ...]) -> np.ndarray:
        n = math.prod(shape)
        if self.used + n > self.buf.size:
            raise ValueError(f"arena of {self.buf.size} floats exhausted asking for {shape}")
        a = self.buf[self.used : self.used + n].reshape(shape)
        self.used += n
        return a
