"""The machine the kernels run on: what it is, read from the system, and how fast it reads memory,
measured. Chapter L10.1, section 2.4 (what bounds a step: a batch-1 decode reads every weight once,
so its limit is the machine's read bandwidth; a prefill multiplies, so its limit is the machine's
arithmetic).

A speed means something only next to the machine's own limits: the same code ran f32 batch-1
decode at 40% of one processor's bandwidth and near all of another's. So the benchmarks record
`describe()` and the limits measured in the same run (`read_gbps`) with every result, and the
kernels size what depends on the cache from `cache_bytes` (`kernels.X_IN_L1`).

- ``describe()`` -> the processor's model name, the name numba's LLVM gives it and the name numba
  compiles for (``NUMBA_CPU_NAME`` may set another), the vector ISA features that matter here, the
  cores this process may use, the cache sizes per level, and how the kernels' threads wait
  (`pool_settings`: what a process started from this one runs with, default or set);
- ``cache_bytes(level, kind)`` -> one cache's size in bytes (None when the system does not say);
- ``read_gbps(threads)`` -> GB/s of a compiled kernel reading a buffer larger than the last cache
  level, split over `threads` threads as the kernels split a weight;
- ``fma_gflops(threads)`` -> GFLOP/s of fused multiply-adds alone on `threads` threads: what the
  cores' vector units can do at most, above any product's rate (the sgemm rate is what a library
  reaches).
"""

from __future__ import annotations

import os
import platform
import time
from pathlib import Path

import numpy as np

__all__ = ["describe", "cores", "AVX2_ONLY", "cache_bytes", "read_gbps", "fma_gflops", "threads_in_pool", "FEATURES",
           "POOL_DEFAULTS", "pool_settings"]

POOL_DEFAULTS = {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "3000"}
"""How the kernels' OpenMP threads wait between parallel loops, unless the user's environment says
otherwise: `tl_lab.ops.kernels` sets these (why, and the figures behind 3 000 rounds, are at its top).
Kept here, where the kernels' import does not have to happen, so `describe` can say what a
process running the kernels uses without starting numba's pool."""


def pool_settings() -> dict[str, str]:
    """The wait settings the kernels' pool runs with in a process started from this one's
    environment: the user's value of each where set, else the kernels' default."""
    return {k: os.environ.get(k, v) for k, v in POOL_DEFAULTS.items()}

FEATURES = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
            "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8", "asimd", "sve")
"""The instruction-set flags `describe` reports, when the processor has them (Linux's names)."""

AVX2_ONLY = {"NUMBA_CPU_NAME": "haswell",
             "NUMBA_CPU_FEATURES": "+64bit,+avx,+avx2,+fma,+f16c,+sse4.2,+popcnt,+bmi,+bmi2,+lzcnt,+movbe"}
"""numba's environment for the code a processor of AVX2 and no AVX-512 gets (processor D), on any
host: what the tests hold to the same bits as the host's own code and `bench_targets.py` times."""

_CACHE = Path("/sys/devices/system/cpu/cpu0/cache")


def _cpuinfo() -> dict[str, str]:
    """The first processor's block of /proc/cpuinfo (empty where there is none)."""
    try:
        return _first_processor(Path("/proc/cpuinfo").read_text())
    except OSError:
        return {}


def _first_processor(text: str) -> dict[str, str]:
    """/proc/cpuinfo's text -> the keys and values of its first block (one block per processor)."""
    out = {}
    for line in text.split("\n\n")[0].splitlines():
        key, _, value = line.partition(":")
        out[key.strip()] = value.strip()
    return out


def _size(text: str) -> int:
    """'48K' -> 49152 (sysfs's cache sizes)."""
    units = {"K": 1024, "M": 1024**2, "G": 1024**3}
    text = text.strip()
    return int(text[:-1]) * units[text[-1]] if text[-1:] in units else int(text)


def caches() -> list[dict]:
    """The first core's caches: [{level, type, bytes, shared_by}] from sysfs (empty where unreadable)."""
    out = []
    for d in sorted(_CACHE.glob("index*")):
        try:
            shared = (d / "shared_cpu_list").read_text().strip()
            out.append({"level": int((d / "level").read_text()), "type": (d / "type").read_text().strip(),
                        "bytes": _size((d / "size").read_text()),
                        "shared_by": sum(len(range(int(a), int(b or a) + 1))
                                         for a, _, b in (p.partition("-") for p in shared.split(",")))})
        except (OSError, ValueError):
            continue
    return out


def cache_bytes(level: int, kind: str = "Data") -> int | None:
    """Bytes of the first core's cache at `level` of `kind` ("Data" or "Unified", either matches a
    level-2 or -3 cache); None when the system does not say."""
    for c in caches():
        if c["level"] == level and (c["type"] == kind or c["type"] == "Unified"):
            return c["bytes"]
    return None


def cores() -> int:
    """The cores this process may run on: its CPU affinity where the system keeps one (Linux; a
    container or `taskset` may give fewer than the machine has), else every core the system counts."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def describe() -> dict:
    """What the machine is: processor, LLVM's and numba's names for it, ISA features, cores, caches."""
    import numba
    from llvmlite import binding

    info = _cpuinfo()
    flags = set(info.get("flags", info.get("Features", "")).split())
    return {
        "cpu_model": info.get("model name") or platform.processor() or platform.machine(),
        "cpu_family_model": f"{info.get('cpu family', '?')}/{info.get('model', '?')}",
        "llvm_host_cpu": binding.get_host_cpu_name(),
        "numba_target_cpu": numba.config.CPU_NAME or binding.get_host_cpu_name(),
        "isa": [f for f in FEATURES if f in flags],
        "cores": cores(),
        "caches": {f"L{c['level']}{c['type'][0].lower() if c['type'] != 'Unified' else ''}":
                   f"{c['bytes'] // 1024} KB" + (f" shared by {c['shared_by']}" if c["shared_by"] > 1 else "")
                   for c in caches()},
        "numba": numba.__version__, "numpy": np.__version__, "python": platform.python_version(),
        "env": {k: os.environ[k] for k in ("NUMBA_CPU_NAME", "NUMBA_CPU_FEATURES", "OPENBLAS_CORETYPE",
                                           "OMP_WAIT_POLICY", "GOMP_SPINCOUNT") if k in os.environ},
        "kernel_pool": pool_settings(),
    }


def _read_kernel():
    """The compiled read: every 16-float step of a (R, C) float32 buffer into one sum per row,
    rows split over the threads (prange) as the kernels split a weight's rows. Built on first use."""
    from numba import njit, prange

    from tl_lab.ops.lanes import LANES, vfma, vload, vsum, vzero

    @njit(parallel=True, cache=True)
    def read_rows(a, out):  # pragma: no cover (compiled)
        for r in prange(a.shape[0]):
            acc = vzero()
            for k in range(0, a.shape[1], LANES):
                v = vload(a, r, k)
                acc = vfma(v, v, acc)
            out[r] = vsum(acc)

    return read_rows


_READ = []


def read_megabytes(last: int) -> int:
    """The size `read_gbps` reads by default, in MB: twice the last cache level (`last` bytes), at
    least 256 and at most 1024."""
    return min(1024, max(256, 2 * last // 2**20))


def read_gbps(threads: int, rounds: int = 3, megabytes: int | None = None) -> float:
    """GB/s (10^9 bytes) of the best of `rounds` passes reading a float32 buffer on `threads` threads.

    The buffer is twice the last cache level and at least 256 MB (at most 1 GB), so it comes from
    memory (a machine whose last level is shared reports the whole level; it still fits)."""
    if not _READ:
        _READ.append(_read_kernel())
    mb = megabytes or read_megabytes(max((c["bytes"] for c in caches()), default=0))
    buf = np.ones((mb * 2**20 // 4096, 1024), dtype=np.float32)
    out = np.empty(buf.shape[0], dtype=np.float32)
    return buf.nbytes / _best_seconds(threads, rounds, lambda: _READ[0](buf, out)) / 1e9


def threads_in_pool(threads: int) -> int:
    """`threads` as numba's pool can run them: at least 1, at most the pool's size."""
    import numba

    return max(1, min(int(threads), numba.config.NUMBA_NUM_THREADS))


def _best_seconds(threads: int, rounds: int, call) -> float:
    """The shortest of `rounds` timed calls of `call` on `threads` threads, after one untimed call
    (compiling or loading the kernel). The thread count in force is restored after."""
    import numba

    before = numba.get_num_threads()
    numba.set_num_threads(threads_in_pool(threads))
    try:
        call()
        best = np.inf
        for _ in range(rounds):
            t0 = time.perf_counter()
            call()
            best = min(best, time.perf_counter() - t0)
    finally:
        numba.set_num_threads(before)
    return best


def _fma_kernel():
    """The compiled peak: per thread, CHAINS (twelve) independent chains of LANES-float fused
    multiply-adds on registers (no loads, no stores). Twelve, so neither the adds' latency (4
    cycles) nor two multiply-add units a core leave a unit idle. Built on first use."""
    from numba import njit, prange

    from tl_lab.ops.lanes import LANES, vfma, vload, vsum, vzero

    @njit(parallel=True, cache=True)
    def fma_chains(x, steps, out):  # pragma: no cover (compiled)
        for t in prange(out.shape[0]):
            u, v = vload(x, 0, 0), vload(x, 1, 0)
            a0, a1, a2, a3, a4, a5 = vzero(), vzero(), vzero(), vzero(), vzero(), vzero()
            a6, a7, a8, a9, a10, a11 = vzero(), vzero(), vzero(), vzero(), vzero(), vzero()
            for _ in range(steps):
                a0, a1, a2, a3 = vfma(u, v, a0), vfma(u, v, a1), vfma(u, v, a2), vfma(u, v, a3)
                a4, a5, a6, a7 = vfma(u, v, a4), vfma(u, v, a5), vfma(u, v, a6), vfma(u, v, a7)
                a8, a9, a10, a11 = vfma(u, v, a8), vfma(u, v, a9), vfma(u, v, a10), vfma(u, v, a11)
            out[t] = (vsum(a0) + vsum(a1) + vsum(a2) + vsum(a3) + vsum(a4) + vsum(a5)
                      + vsum(a6) + vsum(a7) + vsum(a8) + vsum(a9) + vsum(a10) + vsum(a11))

    return fma_chains


_FMA = []
CHAINS = 12
"""The independent multiply-add chains `_fma_kernel` runs on each thread."""


def fma_gflops(threads: int, rounds: int = 5, steps: int = 8_000_000) -> float:
    """GFLOP/s (10^9) of the best of `rounds` runs of `steps` steps of `_fma_kernel`'s chains on each
    of `threads` threads (each step: CHAINS multiply-adds of LANES floats, 2 operations a float)."""
    from tl_lab.ops.lanes import LANES

    if not _FMA:
        _FMA.append(_fma_kernel())
    threads = threads_in_pool(threads)
    x = np.full((2, LANES), 1e-9, dtype=np.float32)  # tiny: the sums stay finite and normal
    out = np.empty(threads, dtype=np.float32)
    seconds = _best_seconds(threads, rounds, lambda: _FMA[0](x, steps, out))
    return CHAINS * LANES * 2 * steps * threads / seconds / 1e9
