"""Each notebook as a learner runs it: Run All in a fresh kernel, then Run All again twice in the same one.

    nice python benchmarks/bench_notebooks.py [--only 05_forward,10_pitfalls]

Measured per notebook (nbclient, kernel python3, cwd notebooks/, the same driver as
tests/test_notebooks.py): the seconds of the first Run All (a fresh kernel: imports, numba's cached
kernels loaded, models read), of the second and third (the same kernel: what pressing Run All again
costs), and the kernel's memory after each of the three (psutil-free: /proc/self/statm read in the kernel):
resident, and live (after gc.collect() and glibc's malloc_trim(0), so freed pages malloc keeps for reuse
are not counted as growth). What the text of 00_start_here promises about these times comes from this file's results
(benchmarks/results/notebooks.json). CPU-heavy: about ten minutes on two shared cores; nice it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from _common import report  # noqa: E402
from notebook_kernel import NOTEBOOKS, NotebookKernel  # noqa: E402  (tests/ is a folder, not a package)

RUNS = 3


def measure(name: str) -> dict:
    """Three Run Alls of notebooks/`name` in one kernel: their seconds, and after each the RSS and the
    live memory (after a collect and a trim; measured after the RSS, so the next run starts trimmed)."""
    times, rss, live = [], [], []
    with NotebookKernel(name) as k:
        kernel = k.rss_mb()
        for _ in range(RUNS):
            times.append(k.run_all())
            rss.append(k.rss_mb())
            live.append(k.live_mb())
    return {"notebook": name.removesuffix(".ipynb"), "first_s": round(times[0], 1),
            "again_s": round(min(times[1:]), 1), "kernel_mb": round(kernel), "rss_mb": [round(m) for m in rss],
            "live_mb": [round(m, 1) for m in live], "growth_mb": round(live[-1] - live[-2], 1)}


def merged(rows: list[dict]) -> list[dict]:
    """`rows` in place of the same notebooks' rows of the results file, the others kept, in order."""
    import json

    from _common import RESULTS

    path = RESULTS / "notebooks.json"
    old = json.loads(path.read_text())["rows"] if path.exists() else []
    by_name = {r["notebook"]: r for r in old} | {r["notebook"]: r for r in rows}
    return [by_name[k] for k in sorted(by_name)]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="comma-separated notebook names, their rows replaced in the "
                    "results (default: every notebook)")
    args = ap.parse_args(argv)
    wanted = [n if n.endswith(".ipynb") else n + ".ipynb" for n in args.only.split(",") if n]
    names = [n for n in NOTEBOOKS if not wanted or n in wanted]
    rows = []
    for name in names:
        rows.append(measure(name))
        print(rows[-1], flush=True)
    if wanted:  # the other notebooks keep their rows from the last full run
        rows = merged(rows)
    report("notebooks", rows, notes=f"{RUNS} Run Alls per notebook in one kernel; first_s: the first (a fresh "
           "kernel), again_s: the faster of the next two; kernel_mb: the fresh kernel's resident memory before "
           "the first cell (the floor: python, IPython, ipykernel); rss_mb: the resident memory after each Run "
           "All, as a resource meter shows it; live_mb: after each, once gc.collect() and glibc's malloc_trim(0) "
           "ran (what the kernel still holds; rss_mb minus live_mb is freed memory malloc keeps for reuse); "
           "growth_mb: live after the third minus after the second, what one more Run All keeps")


if __name__ == "__main__":
    main()
