"""Shared benchmark plumbing: timing, peak memory, the machine and its limits, a printed table and a
JSON result.

Benchmarks measure; they never assert. Each bench_*.py calls `report(name, rows)`, which records the
machine (`tl_lab.ops.machine.describe`: processor, LLVM's and numba's names for it, ISA features, cores,
caches) and its roofline measured in the same run (`roofline`: read bandwidth and sgemm rate at 1
and N threads), so a reader can tell which machine a figure describes and how near its limit it is.
"""

import json
import os
import platform
import resource
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from tl_lab.ops.machine import AVX2_ONLY
from tl_lab.ops.tuning import blas_core

RESULTS = Path(__file__).resolve().parent / "results"
STARTED = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M")
"""When this benchmark's process began (UTC): a run's name, the minute it started."""


def no_options(doc: str, argv: list[str] | None = None) -> None:
    """The command line of a benchmark that takes no options: --help prints its docstring's first
    paragraph and exits, anything else is refused (exit 2) before it measures or writes a result."""
    import argparse

    argparse.ArgumentParser(description=doc.strip().split("\n\n")[0]).parse_args(argv)


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
    """What the machine is (`tl_lab.ops.machine.describe`), its architecture, and how busy it was when
    the results were written: the load average over 1, 5 and 15 minutes (`os.getloadavg`; on a
    shared machine a figure means little without it), when the run began (`started`, UTC to the
    minute: the README's table names each column's run by it), and, in a run held to another
    processor's instructions (`held_to`), which."""
    from tl_lab.ops.machine import describe

    load = [round(v, 2) for v in os.getloadavg()] if hasattr(os, "getloadavg") else None
    held = {"held_to": held_to()} if held_to() else {}
    return {**describe(), "machine": platform.machine(), "load_avg_1_5_15min": load, "started": STARTED, **held}


AS = {"avx2": {**AVX2_ONLY, "OPENBLAS_CORETYPE": "Haswell", "ATEN_CPU_CAPABILITY": "avx2",
               "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"}}
"""`--as avx2`: the environment that holds every library of a run to the instructions of a processor
with AVX2 and no AVX-512 (processor D), on any host: numba compiles the kernels for it
(`tl_lab.ops.machine.AVX2_ONLY`), numpy's OpenBLAS runs its Haswell kernels, torch its AVX2 kernels (its
own, MKL's and oneDNN's). The host's memory, caches and cores stay its own, so such a run tells
whether the code that processor gets meets its goals against peers held to the same instructions,
not what that processor measures."""

HELD = "TL_BENCH_AS"
"""Set (to a key of AS) in a run held to another processor's instructions, and in its children."""


def held_to() -> str | None:
    """The instructions this run is held to (a key of AS), or None for the host's own."""
    return os.environ.get(HELD) or None


def hold_to(isa: str, argv: list[str]) -> None:
    """Start this benchmark again, argv and all, in AS[isa]'s environment (numba, OpenBLAS and torch
    read theirs once, at import), with numba's cache in a folder of its own; returns only when
    already held."""
    if held_to() == isa:
        return
    from tl_lab.ops.paths import cache_dir

    env = {**os.environ, **AS[isa], HELD: isa, "NUMBA_CACHE_DIR": str(cache_dir() / f"numba-as-{isa}")}
    os.execve(sys.executable, [sys.executable, *argv], env)


def check_held() -> None:
    """Refuse (SystemExit naming the library) a held run whose libraries do not run the instructions
    it is held to: numpy's OpenBLAS the kernels its OPENBLAS_CORETYPE names, torch (when installed)
    those its ATEN_CPU_CAPABILITY names."""
    if held_to() is None:
        return
    env = AS[held_to()]
    got = {"numpy's OpenBLAS": (blas_core(), env["OPENBLAS_CORETYPE"])}
    try:
        import torch

        got["torch"] = (torch.backends.cpu.get_cpu_capability(), env["ATEN_CPU_CAPABILITY"].upper())
    except ImportError:
        pass
    bad = [f"{lib} runs {have} kernels, not {want}" for lib, (have, want) in got.items() if have != want]
    if bad:
        raise SystemExit(f"--as {held_to()}: " + "; ".join(bad))


SGEMM_SHAPES = ((512, 576, 1536), (2048, 2048, 2048))
"""(M, K, N) of the sgemm limit: a 512-token prefill's product with SmolLM2's gate projection, and a
large square one; the larger rate of the two is the machine's arithmetic limit."""
SHAPE_KEYS = tuple(f"{M}x{K}x{N}" for M, K, N in SGEMM_SHAPES)


def sgemm_gflops(threads: int, rounds: int = 3) -> dict:
    """GFLOP/s of the fastest float32 matrix product this machine has, per shape of SGEMM_SHAPES (best
    of `rounds`), at `threads`: the larger of torch's (when installed), numpy's OpenBLAS as this
    process has it, and, where OPENBLAS_CORETYPE is set, OpenBLAS choosing its kernels itself (a fresh
    process without the variable: OpenBLAS reads it once, at load). -> {"MxKxN": rate, "by": the
    fastest library's name, "by_library": {name: {"MxKxN": rate} or {"error": ...}}}.

    Why every library: the limit is the machine's, not one library's. On processor C (AMD EPYC, LLVM
    znver5) torch's sgemm ran 90 GFLOP/s on one thread where OpenBLAS's AVX-512 kernels ran 205, and
    the host sets OPENBLAS_CORETYPE=Haswell (AVX2 kernels: 107)."""
    libs = {}
    try:
        import torch
    except ImportError:
        torch = None
    if torch:
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            libs[f"torch {torch.__version__}"] = _sgemm_rates(rounds, torch.from_numpy)
        finally:
            torch.set_num_threads(before)
    from tl_lab.ops.tuning import blas_threads, set_blas_threads

    before = blas_threads()
    set_blas_threads(threads)
    try:
        core = os.environ.get("OPENBLAS_CORETYPE")
        libs[f"numpy {np.__version__} OpenBLAS" + (f" (OPENBLAS_CORETYPE={core})" if core else "")] = \
            _sgemm_rates(rounds)
    finally:
        if before is not None:
            set_blas_threads(before)
    if "OPENBLAS_CORETYPE" in os.environ and not held_to():  # a held run set it itself
        env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_CORETYPE"}
        env["OPENBLAS_NUM_THREADS"] = str(threads)
        code = f"import json, _common; print(json.dumps(_common._sgemm_rates({rounds})))"
        run = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).parent, env=env,
                             capture_output=True, text=True, timeout=600)
        name = f"numpy {np.__version__} OpenBLAS (its own kernels)"
        libs[name] = json.loads(run.stdout) if run.returncode == 0 else {"error": run.stderr.strip()[-300:]}
    rated = {n: r for n, r in libs.items() if "error" not in r}
    fastest = max(rated, key=lambda n: max(rated[n].values()))
    return {**{shape: max(r[shape] for r in rated.values()) for shape in rated[fastest]}, "by": fastest,
            "by_library": libs}


def _sgemm_rates(rounds: int, wrap=None) -> dict:
    """{"MxKxN": GFLOP/s} of a @ b on random float32 operands (numpy's, or those of the library
    whose tensors `wrap` makes of numpy arrays), best of `rounds`."""
    rng = np.random.default_rng(0)
    out = {}
    for M, K, N in SGEMM_SHAPES:
        a = rng.standard_normal((M, K), dtype=np.float32)
        b = rng.standard_normal((K, N), dtype=np.float32)
        if wrap is not None:
            a, b = wrap(a), wrap(b)
        seconds = timeit(lambda: a @ b, repeat=rounds, min_time=0.1)
        out[f"{M}x{K}x{N}"] = 2 * M * K * N / seconds / 1e9
    return out


def roofline(threads: list[int] | None = None, rounds: int = 3) -> dict:
    """The machine's limits measured now, at each thread count (default: 1 and every core): read
    bandwidth (`tl_lab.ops.machine.read_gbps`, GB/s), the sgemm rate (`sgemm_gflops`, GFLOP/s, the
    fastest library's; "best": the larger of its shapes) and the vector units' peak
    (`tl_lab.ops.machine.fma_gflops`, GFLOP/s: multiply-adds alone, no product reaches it)."""
    from tl_lab.ops.machine import describe, fma_gflops, read_gbps

    threads = threads or sorted({1, describe()["cores"]})
    out = {"read_GBps": {}, "sgemm_GFLOPs": {}, "fma_GFLOPs": {}}
    for t in threads:
        out["read_GBps"][str(t)] = read_gbps(t, rounds)
        out["fma_GFLOPs"][str(t)] = fma_gflops(t)
        rates = sgemm_gflops(t, rounds)
        rates["best"] = max(rates[k] for k in SHAPE_KEYS)
        out["sgemm_GFLOPs"][str(t)] = rates
    return out


def best_roofline(runs: list[dict]) -> dict:
    """The best of several `roofline` runs, limit by limit (the least disturbed measurement), and at
    each thread count at least the limit of any smaller count (more threads can always leave some
    idle: on a busy host two threads measured less than one, which is the host, not the limit)."""
    out = {"read_GBps": {}, "sgemm_GFLOPs": {}, "fma_GFLOPs": {}}
    for r in runs:
        for key in ("read_GBps", "fma_GFLOPs"):  # the FMA peak: runs before it have none
            for t, v in r.get(key, {}).items():
                out[key][t] = max(out[key].get(t, 0.0), v)
        for t, rates in r["sgemm_GFLOPs"].items():
            have = out["sgemm_GFLOPs"].setdefault(t, {**rates, "by_library": {}})
            if rates["best"] > have["best"]:  # "by" names the library of the best rate kept
                have["by"] = rates["by"]
            for k in (*SHAPE_KEYS, "best"):
                have[k] = max(have[k], rates[k])
            for lib, got in rates.get("by_library", {}).items():  # each library's best of the runs too
                kept = have["by_library"].get(lib)
                if kept is None or "error" in kept:
                    have["by_library"][lib] = dict(got)
                elif "error" not in got:
                    for k, v in got.items():
                        kept[k] = max(kept[k], v)
    counts = sorted(out["read_GBps"], key=int)
    for fewer, t in zip(counts, counts[1:]):
        out["read_GBps"][t] = max(out["read_GBps"][t], out["read_GBps"][fewer])
        if fewer in out["fma_GFLOPs"] and t in out["fma_GFLOPs"]:
            out["fma_GFLOPs"][t] = max(out["fma_GFLOPs"][t], out["fma_GFLOPs"][fewer])
        have, less = out["sgemm_GFLOPs"][t], out["sgemm_GFLOPs"][fewer]
        if less["best"] > have["best"]:
            have["by"] = f"{less['by']} on {fewer} thread{'s' * (fewer != '1')}"
        for k in (*SHAPE_KEYS, "best"):
            have[k] = max(have[k], less[k])
    return out


def report(name: str, rows: list[dict], notes: str = "", limits: dict | None = None, *,
           measure_limits: bool = True, table: list[dict] | None = None, extra: dict | None = None) -> Path:
    """Print `rows` (or the shorter `table` of them) and write benchmarks/results/<name>.json with the
    machine, its roofline (`limits`, measured by the caller in the same run, else measured here, now;
    none with measure_limits=False, for a benchmark no roofline bounds, such as the probes') and
    `extra`'s sections after the rows; the same file also as results/machines/<name>.<LLVM's CPU
    name>.json, so the last run on each processor stays beside the latest run. A run held to another
    processor's instructions (`hold_to`) writes <name>-as-<isa> instead, beside the host's own."""
    print_table(name, table or rows)
    if notes:
        print(notes)
    if measure_limits:
        limits = limits or roofline()
        print(f"roofline: read GB/s {_rounded(limits['read_GBps'])}, sgemm GFLOP/s "
              f"{ {t: round(r['best']) for t, r in limits['sgemm_GFLOPs'].items()} }, FMA peak GFLOP/s "
              f"{_rounded(limits.get('fma_GFLOPs', {}))}")
    here = machine()
    name = f"{name}-as-{held_to()}" if held_to() else name  # never in place of the host's own figures
    text = json.dumps({"name": name, "machine": here, "roofline": limits, "rows": rows, "notes": notes,
                       **(extra or {})}, indent=2)
    out = RESULTS / f"{name}.json"
    for path in (out, RESULTS / "machines" / f"{name}.{here['llvm_host_cpu']}.json"):
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
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
