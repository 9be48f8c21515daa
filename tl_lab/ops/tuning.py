"""Process tuning the runner asks for at load: BLAS threads and glibc's keeping of freed memory.

Chapter L10.1, section 2.1 (EngineConfig.threads). Given engineering, not the learner's: the runner
(`tl_lab.runner.ModelRunner.__init__`) calls `set_blas_threads` and `keep_freed_memory` once.
"""

from __future__ import annotations

import ctypes
import glob
import os

__all__ = ["KEEP_FREED_BYTES", "keep_freed_memory", "set_blas_threads", "blas_threads", "blas_core"]


def _openblas():
    """numpy's bundled OpenBLAS (ctypes handle) or None."""
    import numpy

    pattern = os.path.join(os.path.dirname(numpy.__file__), "..", "numpy.libs", "*openblas*")
    for path in glob.glob(pattern):
        return ctypes.CDLL(path)
    return None


def _blas_fn(*names):
    lib = _openblas()
    for name in names:
        fn = getattr(lib, name, None) if lib is not None else None
        if fn is not None:
            return fn
    return None


KEEP_FREED_BYTES = 32 << 20
"""Arrays up to this size come from, and go back to, the C heap that glibc keeps (`keep_freed_memory`)."""


def keep_freed_memory() -> bool:
    """Ask glibc's malloc to keep the memory of freed arrays up to KEEP_FREED_BYTES for the next
    ones, instead of handing every large block back to the kernel (Linux only; -> whether it did).

    Why: a step makes and drops a few dozen temporaries per layer (a 512-token prefill's gate and up
    projections alone are 6 MB), numpy takes each from malloc, and glibc serves a block that large
    with a fresh mmap and unmaps it on free, so every step faults all its temporaries' pages in again.
    Keeping them: SmolLM2 prefill of 512 tokens at 2 threads, 773 -> 640 ms (the silu alone 70 -> 27
    ms). This is what PyTorch's caching allocator does for its tensors. The cost: memory freed by a
    large step stays with the process for the next one (at most the largest step's temporaries).
    """
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc: nothing to tune
        return False
    M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
    return bool(mallopt(M_MMAP_THRESHOLD, KEEP_FREED_BYTES)) and bool(mallopt(M_TRIM_THRESHOLD, 2 * KEEP_FREED_BYTES))


def set_blas_threads(n: int) -> bool:
    """Set OpenBLAS's thread count for this process; False when numpy's OpenBLAS is not found."""
    fn = _blas_fn("scipy_openblas_set_num_threads64_", "openblas_set_num_threads64_", "openblas_set_num_threads")
    if fn is None:
        return False
    fn.argtypes = [ctypes.c_int]
    fn(int(n))
    return True


def blas_threads() -> int | None:
    """OpenBLAS's current thread count, or None when numpy's OpenBLAS is not found."""
    fn = _blas_fn("scipy_openblas_get_num_threads64_", "openblas_get_num_threads64_", "openblas_get_num_threads")
    if fn is None:
        return None
    fn.restype = ctypes.c_int
    return int(fn())


def blas_core() -> str | None:
    """The kernels numpy's OpenBLAS runs, by its core name ("Haswell", "SkylakeX", ...: chosen from the
    processor at load, or from OPENBLAS_CORETYPE), or None when numpy's OpenBLAS is not found."""
    fn = _blas_fn("scipy_openblas_get_corename64_", "openblas_get_corename64_", "openblas_get_corename")
    if fn is None:
        return None
    fn.restype = ctypes.c_char_p
    return fn().decode()
