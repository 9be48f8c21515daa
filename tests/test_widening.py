"""tl_lab/ops/widening.py: the load's parallel widening (section 2.3, loading), engineering around the
learner's reader: how many threads, that they all work, each piece's bytes told to `drop`, the
pages given back, the checks of a destination, and the arena the float32 weights live in."""

import mmap
import os
import threading

import numpy as np
import pytest

from tl_lab.ops import widening
from tl_lab.errors import FormatError
from tl_lab.ops.widening import (MAX_WIDEN_THREADS, Arena, Widening, drop_pages, f32_out, parallel_for, widen_all,
                              widen_threads)


def test_widen_threads_are_the_cores_this_process_may_run_on_capped(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 2, 5}, raising=False)
    assert widen_threads() == 3  # the affinity, not the machine's count
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(40)), raising=False)
    assert widen_threads() == MAX_WIDEN_THREADS
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)  # macOS: no affinity, the count
    assert widen_threads() == MAX_WIDEN_THREADS
    monkeypatch.setattr(os, "cpu_count", lambda: 3)
    assert widen_threads() == 3
    monkeypatch.setattr(os, "cpu_count", lambda: None)
    assert widen_threads() == 1


def test_parallel_for_runs_every_item_once_on_n_threads_at_once():
    """Each item waits for a second thread at a barrier: with fewer than two working threads the
    barrier breaks (its timeout) and parallel_for raises that."""
    meet, done, names = threading.Barrier(2, timeout=20), [], set()

    def work(item):
        meet.wait()
        names.add(threading.current_thread().name)
        done.append(item)

    parallel_for(work, range(6), 2)
    assert sorted(done) == list(range(6))
    assert names == {threading.current_thread().name, "tl_lab-widen-1"}


def test_parallel_for_raises_the_first_error_after_every_thread_stopped():
    def work(item):
        if item == 3:
            raise KeyError(item)

    with pytest.raises(KeyError):
        parallel_for(work, range(50), 2)
    assert not [t for t in threading.enumerate() if t.name.startswith("tl_lab-widen-")]


def _jobs(sizes, begin=1000):
    out = []
    for k, n in enumerate(sizes):
        bits = (np.arange(n) + 0.5).astype(np.float16)
        out.append(Widening(f"t{k}", begin + 10_000 * k, bits, np.empty(n, np.float32),
                            lambda b, out: (np.copyto(out, b), out)[1]))
    return out


def test_widen_all_widens_every_piece_and_tells_drop_each_pieces_bytes(monkeypatch):
    monkeypatch.setattr(widening, "WIDEN_CHUNK", 4)
    jobs, told = _jobs([10, 3]), []
    widen_all(jobs, lambda a, b: told.append((a, b)))
    for job in jobs:
        assert np.array_equal(job.out, job.bits.astype(np.float32))
    # f16: 2 bytes an element; pieces of 4 elements, each told once, from where the tensor begins
    assert sorted(told) == [(1000, 1008), (1008, 1016), (1016, 1020), (11000, 11006)]


def test_widen_all_checks_finite_weights_only_when_asked(monkeypatch):
    monkeypatch.setattr(widening, "WIDEN_CHUNK", 4)
    jobs = _jobs([10])
    jobs[0].bits[6] = np.nan
    widen_all(jobs, lambda a, b: None)  # the default: what the file holds, NaN included
    assert np.isnan(jobs[0].out[6])
    with pytest.raises(FormatError, match=r"'t0' holds a non-finite weight nan at flat index 6"):
        widen_all(jobs, lambda a, b: None, finite=True)


class _Recorded(mmap.mmap):
    """A real anonymous map whose madvise calls are recorded, not made."""

    def madvise(self, *args):
        self.calls = [*getattr(self, "calls", []), args]


@pytest.mark.skipif(not hasattr(mmap, "MADV_DONTNEED"), reason="madvise(MADV_DONTNEED) is Linux's (and macOS's)")
def test_drop_pages_gives_back_the_whole_pages_of_a_range():
    mm = _Recorded(-1, 16 * mmap.PAGESIZE)
    drop_pages(mm, mmap.PAGESIZE + 5, 3 * mmap.PAGESIZE + 7)
    assert mm.calls == [(mmap.MADV_DONTNEED, mmap.PAGESIZE, 2 * mmap.PAGESIZE + 7)]
    drop_pages(mm, 50, 50)  # an empty range: nothing
    drop_pages(bytearray(10), 0, 5)  # not a map (a test's buffer): nothing
    assert len(mm.calls) == 1


def test_f32_out_takes_only_a_c_contiguous_float32_array_of_the_shape():
    good = np.empty((2, 3), np.float32)
    assert f32_out(good, (2, 3), "w") is good
    fresh = f32_out(None, (2, 3), "w")
    assert fresh.shape == (2, 3) and fresh.dtype == np.float32
    for bad in (np.empty((3, 2), np.float32), np.empty((2, 3), np.float64), np.empty((3, 2), np.float32).T):
        with pytest.raises(ValueError, match=r"out for tensor 'w' must be C-contiguous float32 \(2, 3\)"):
            f32_out(bad, (2, 3), "w")


def test_the_arena_hands_out_its_floats_in_order_and_refuses_past_its_size():
    arena = Arena(10)
    a, b = arena.take((2, 3)), arena.take((4,))
    a[...], b[...] = 1.0, 2.0
    assert arena.buf.tolist() == [1.0] * 6 + [2.0] * 4 and arena.used == 10
    with pytest.raises(ValueError, match=r"arena of 10 floats exhausted asking for \(1,\)"):
        arena.take((1,))
