"""Shared benchmark plumbing: timing, peak memory, a printed table and a JSON result.

Benchmarks measure; they never assert. Each bench_*.py calls `report(name, rows)`.
"""

import json
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
    return {
        "python": platform.python_version(),
        "numpy": np.__version__,
        "machine": platform.machine(),
        "processor": platform.processor(),
    }


def report(name: str, rows: list[dict], notes: str = "") -> Path:
    """Print `rows` as a table and write benchmarks/results/<name>.json."""
    print_table(name, rows)
    if notes:
        print(notes)
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"{name}.json"
    out.write_text(json.dumps({"name": name, "machine": machine(), "rows": rows, "notes": notes}, indent=2))
    return out


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
