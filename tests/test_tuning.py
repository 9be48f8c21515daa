"""tl_lab/ops/tuning.py: the process tuning the runner asks for at load (lab test, not graded)."""


def test_keep_freed_memory_tunes_glibc_and_only_glibc():
    """On glibc the runner asks malloc to keep large freed blocks (both mallopt calls accepted);
    elsewhere it says it did nothing, and nothing fails."""
    import platform

    from tl_lab.ops.tuning import keep_freed_memory

    assert keep_freed_memory() is (platform.libc_ver()[0] == "glibc")


def test_keep_freed_memory_without_mallopt_says_it_did_nothing(monkeypatch):
    """A C library without mallopt (musl, macOS), or none to open: False, and nothing raised."""
    from tl_lab.ops import tuning

    monkeypatch.setattr(tuning.ctypes, "CDLL", lambda name: object())  # no mallopt: AttributeError
    assert tuning.keep_freed_memory() is False

    def no_libc(name):
        raise OSError("no C library")

    monkeypatch.setattr(tuning.ctypes, "CDLL", no_libc)
    assert tuning.keep_freed_memory() is False


def test_keep_freed_memory_asks_for_both_thresholds(monkeypatch):
    """The two mallopt calls, each with its parameter's number and size: the mmap threshold (-3) at
    KEEP_FREED_BYTES, the trim threshold (-1) at twice that; -> True only when both are accepted."""
    from tl_lab.ops import tuning

    calls = []

    class Libc:
        def __init__(self, accept):
            self.accept = accept

        def mallopt(self, param, value):
            calls.append((param, value))
            return self.accept

    monkeypatch.setattr(tuning.ctypes, "CDLL", lambda name: Libc(1))
    assert tuning.keep_freed_memory() is True
    assert calls == [(-3, tuning.KEEP_FREED_BYTES), (-1, 2 * tuning.KEEP_FREED_BYTES)]
    calls.clear()
    monkeypatch.setattr(tuning.ctypes, "CDLL", lambda name: Libc(0))
    assert tuning.keep_freed_memory() is False and calls == [(-3, tuning.KEEP_FREED_BYTES)]


def test_blas_threads_are_set_and_read_back():
    from conftest import blas_threads_set
    from tl_lab.ops.tuning import blas_threads

    before = blas_threads()
    if before is None:
        import pytest

        pytest.fail("numpy's bundled OpenBLAS was not found (a numpy wheel from PyPI bundles it)")
    with blas_threads_set(1):
        assert blas_threads() == 1
    assert blas_threads() == before


def test_blas_threads_find_each_openblas_builds_names(monkeypatch):
    """numpy's OpenBLAS names its functions by build (scipy-openblas, 64-bit ints, plain): each is
    found; with no OpenBLAS, setting says False and reading None."""
    from tl_lab.ops import tuning

    class Fn:  # a ctypes function: argtypes and restype are set on it before the call
        def __init__(self, body):
            self.body = body

        def __call__(self, *args):
            return self.body(*args)

    names = [("scipy_openblas_set_num_threads64_", "scipy_openblas_get_num_threads64_"),
             ("openblas_set_num_threads64_", "openblas_get_num_threads64_"),
             ("openblas_set_num_threads", "openblas_get_num_threads")]
    for set_name, get_name in names:
        state = {}
        lib = type("Lib", (), {})()
        setattr(lib, set_name, Fn(lambda n: state.update(n=n)))
        setattr(lib, get_name, Fn(lambda: state["n"]))
        monkeypatch.setattr(tuning, "_openblas", lambda: lib)
        assert tuning.set_blas_threads(3) and tuning.blas_threads() == 3, set_name
    monkeypatch.setattr(tuning, "_openblas", lambda: None)
    assert tuning.set_blas_threads(3) is False and tuning.blas_threads() is None


def test_blas_core_names_the_kernels_openblas_runs(monkeypatch):
    """The core name OpenBLAS chose (this process's, a real name), the one OPENBLAS_CORETYPE asks for in
    a fresh process, each build's function name found, and None without OpenBLAS."""
    import os
    import subprocess
    import sys

    from tl_lab.ops import tuning

    assert tuning.blas_core() and tuning.blas_core().isalnum()
    code = "from tl_lab.ops.tuning import blas_core; print(blas_core())"
    run = subprocess.run([sys.executable, "-c", code], env={**os.environ, "OPENBLAS_CORETYPE": "Haswell"},
                         capture_output=True, text=True, check=True)
    assert run.stdout.strip() == "Haswell"
    for name in ("scipy_openblas_get_corename64_", "openblas_get_corename64_", "openblas_get_corename"):
        lib = type("Lib", (), {name: staticmethod(lambda: b"Zen")})()
        monkeypatch.setattr(tuning, "_openblas", lambda: lib)
        assert tuning.blas_core() == "Zen", name
    monkeypatch.setattr(tuning, "_openblas", lambda: None)
    assert tuning.blas_core() is None
