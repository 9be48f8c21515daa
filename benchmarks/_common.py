"""Shared benchmark plumbing: timing, peak memory, the machine and its limits, a printed table and a
JSON result.

Benchmarks measure; they never assert. Each bench_*.py calls `report(name, rows)`, which records the
machine (`tl_lab.machine.describe`: processor, LLVM's and numba's names for it, ISA features, cores,
caches) and its roofline measured in the same run (`roofline`: read bandwidth and sgemm rate at 1
and N threads), so a reader can tell which machine a figure describes and how near its limit it is.
"""

import json
import os
import platform
import resource
import time
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"


def timeit(fn, *, repeat: int = 5, min_time: float = 0.2) -> float:
    """Best-of-`repeat` seconds per call, each sample looping until `min_time` has passed."""
    fn()  # warm-up: page in weights, fill caches
    best = float("inf")
    for _ in range(repeat):
        n, t0 = 0, time.perf_counter()
        while True:
            fn()
            n += 1
            dt = time.perf_counter() - t0
            if dt >= min_time:
                break
        best = min(best, dt / n)
    return best


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far, in MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def current_rss_mb() -> float:
    """Resident set size now, in MiB, read from /proc."""
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * resource.getpagesize() / 2**20


def machine() -> dict:
    """What the machine is (`tl_lab.machine.describe`), its architecture, and how busy it was when
    the results were written: the load average over 1, 5 and 15 minutes (`os.getloadavg`; on a
    shared machine a figure means little without it)."""
    from tl_lab.machine import describe

    load = [round(v, 2) for v in os.getloadavg()] if hasattr(os, "getloadavg") else None
    return {**describe(), "machine": platform.machine(), "load_avg_1_5_15min": load}


SGEMM_SHAPES = ((512, 576, 1536), (2048, 2048, 2048))
"""(M, K, N) of the sgemm limit: a 512-token prefill's product with SmolLM2's gate projection, and a
large square one; the larger rate of the two is the machine's arithmetic limit."""


def sgemm_gflops(threads: int, rounds: int = 3) -> dict:
    """GFLOP/s of the best of `rounds` float32 matrix products per shape of SGEMM_SHAPES, by torch
    (set_num_threads) when installed, else numpy (OpenBLAS at `threads`), -> {"MxKxN": rate, "by": ...}."""
    rng = np.random.default_rng(0)
    try:
        import torch
    except ImportError:
        torch = None
    out = {"by": f"torch {torch.__version__}" if torch else f"numpy {np.__version__}"}
    if torch:
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
    else:
        from tl_lab.runner import set_blas_threads

        set_blas_threads(threads)
    try:
        for M, K, N in SGEMM_SHAPES:
            a = rng.standard_normal((M, K), dtype=np.float32)
            b = rng.standard_normal((K, N), dtype=np.float32)
            if torch:
                a, b = torch.from_numpy(a), torch.from_numpy(b)
            seconds = timeit(lambda: a @ b, repeat=rounds, min_time=0.1)
            out[f"{M}x{K}x{N}"] = 2 * M * K * N / seconds / 1e9
    finally:
        if torch:
            torch.set_num_threads(before)
    return out


def roofline(threads: list[int] | None = None, rounds: int = 3) -> dict:
    """The machine's limits measured now, at each thread count (default: 1 and every core): read
    bandwidth (`tl_lab.machine.read_gbps`, GB/s) and the sgemm rate (`sgemm_gflops`, GFLOP/s; "best":
    the larger of its shapes)."""
    from tl_lab.machine import describe, read_gbps

    threads = threads or sorted({1, describe()["cores"]})
    out = {"read_GBps": {}, "sgemm_GFLOPs": {}}
    for t in threads:
        out["read_GBps"][str(t)] = read_gbps(t, rounds)
        rates = sgemm_gflops(t, rounds)
        rates["best"] = max(v for k, v in rates.items() if k != "by")
        out["sgemm_GFLOPs"][str(t)] = rates
    return out


def best_roofline(runs: list[dict]) -> dict:
    """The best of several `roofline` runs, limit by limit (the least disturbed measurement), and at
    each thread count at least the limit of any smaller count (more threads can always leave some
    idle: on a busy host two threads measured less than one, which is the host, not the limit)."""
    out = {"read_GBps": {}, "sgemm_GFLOPs": {}}
    for r in runs:
        for t, v in r["read_GBps"].items():
            out["read_GBps"][t] = max(out["read_GBps"].get(t, 0.0), v)
        for t, rates in r["sgemm_GFLOPs"].items():
            have = out["sgemm_GFLOPs"].setdefault(t, dict(rates))
            for k, v in rates.items():
                if k != "by":
                    have[k] = max(have[k], v)
    counts = sorted(out["read_GBps"], key=int)
    for fewer, t in zip(counts, counts[1:]):
        out["read_GBps"][t] = max(out["read_GBps"][t], out["read_GBps"][fewer])
        for k, v in out["sgemm_GFLOPs"][fewer].items():
            if k != "by":
                out["sgemm_GFLOPs"][t][k] = max(out["sgemm_GFLOPs"][t][k], v)
    return out


def report(name: str, rows: list[dict], notes: str = "", limits: dict | None = None, *,
           measure_limits: bool = True, table: list[dict] | None = None) -> Path:
    """Print `rows` (or the shorter `table` of them) and write benchmarks/results/<name>.json with the
    machine and its roofline (`limits`, measured by the caller in the same run, else measured here,
    now; none with measure_limits=False, for a benchmark no roofline bounds, such as the probes')."""
    print_table(name, table or rows)
    if notes:
        print(notes)
    if measure_limits:
        limits = limits or roofline()
        print(f"roofline: read GB/s {_rounded(limits['read_GBps'])}, sgemm GFLOP/s "
              f"{ {t: round(r['best']) for t, r in limits['sgemm_GFLOPs'].items()} }")
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"{name}.json"
    out.write_text(json.dumps({"name": name, "machine": machine(), "roofline": limits, "rows": rows, "notes": notes},
                              indent=2))
    return out


def _rounded(d: dict) -> dict:
    return {k: round(v, 1) for k, v in d.items()}


def print_table(title: str, rows: list[dict], cols: list[str] | None = None) -> None:
    """Print `rows` (dicts) as a text table under `## title`; `cols` picks and orders the columns."""
    cols = cols or list(dict.fromkeys(k for r in rows for k in r))
    cells = [[_fmt(r.get(c, "")) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    print(f"\n## {title}")
    print(" | ".join(c.ljust(w) for c, w in zip(cols, widths)))
    print("-+-".join("-" * w for w in widths))
    for row in cells:
        print(" | ".join(v.ljust(w) for v, w in zip(row, widths)))


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)
