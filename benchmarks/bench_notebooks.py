"""Each notebook as a learner runs it: Run All in a fresh kernel, then Run All again twice in the same one.

    nice python benchmarks/bench_notebooks.py [--only 05_forward,10_pitfalls]
    nice python benchmarks/bench_notebooks.py --first-run      # a fresh clone's first runs (issue 59)

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
GENERATE = ["-m", "tl_lab", "generate", "--model", "smollm2", "--template", "--prompt",
            "Explain in two sentences why a KV cache makes text generation faster.", "--max-tokens", "30", "--seed", "2"]


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


def first_run(lab_command: bool) -> dict:
    """A fresh clone of this repository's HEAD (no numba cache: nothing compiled yet), as a learner meets
    it: with `lab_command`, the kernels are first compiled as `bash tools/quickstart.sh lab` does
    (python -m tl_lab.lab.warm, `warm_s`), then `generate` runs twice, each a new process, as typed in a
    terminal (`generate_first_s`, `generate_second_s`); then 01_why_now's Run All, twice in one kernel
    (`first_s`, `again_s`). Without, 01 runs first, compiling as it goes (the cold first run)."""
    import os
    import subprocess
    import tempfile
    import time

    from notebook_kernel import ROOT

    out: dict = {"lab_command": lab_command}
    with tempfile.TemporaryDirectory(prefix="tl_lab-fresh-") as tmp:
        clone = Path(tmp) / "clone"
        subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(ROOT), str(clone)], check=True)
        env = dict(os.environ, PYTHONPATH=str(clone))
        if lab_command:
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-m", "tl_lab.lab.warm"], env=env, cwd=clone, check=True)
            out["warm_s"] = round(time.perf_counter() - t0, 1)
            for key in ("generate_first_s", "generate_second_s"):
                t0 = time.perf_counter()
                subprocess.run([sys.executable, *GENERATE], env=env, cwd=clone, check=True, capture_output=True)
                out[key] = round(time.perf_counter() - t0, 1)
        before = os.environ.get("PYTHONPATH")
        os.environ["PYTHONPATH"] = str(clone)  # the kernel imports the clone's tl_lab (and its numba cache)
        try:
            with NotebookKernel("01_why_now.ipynb") as k:
                out["first_s"] = round(k.run_all(), 1)
                out["again_s"] = round(k.run_all(), 1)
        finally:
            os.environ.pop("PYTHONPATH") if before is None else os.environ.__setitem__("PYTHONPATH", before)
    return out


def merged(rows: list[dict]) -> list[dict]:
    """`rows` in place of the same notebooks' rows of the results file, the others kept, in order."""
    import json

    from _common import RESULTS

    path = RESULTS / "notebooks.json"
    old = json.loads(path.read_text())["rows"] if path.exists() else []
    by_name = {r["notebook"]: r for r in old} | {r["notebook"]: r for r in rows}
    return [by_name[k] for k in sorted(by_name)]


FIRST_RUN_NOTES = ("first_run: a fresh clone of HEAD, no numba cache. lab_command false: 01_why_now's first Run All "
                   "compiles the kernels as it goes (first_s), again_s its second in the same kernel. lab_command true: "
                   "python -m tl_lab.lab.warm first (warm_s, what bash tools/quickstart.sh lab runs), then generate twice "
                   "as new processes (SmolLM2, 30 tokens), then 01's two Run Alls. Goals (issue 59): first_s <= 2 x "
                   "again_s after the lab command; generate_first_s <= 2 x generate_second_s + 5")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="comma-separated notebook names, their rows replaced in the "
                    "results (default: every notebook)")
    ap.add_argument("--first-run", action="store_true", help="only a fresh clone's first runs (01 and generate, "
                    "cold and after the lab command's compile), kept beside the notebooks' rows")
    args = ap.parse_args(argv)
    if args.first_run:
        import json

        from _common import RESULTS

        old = json.loads((RESULTS / "notebooks.json").read_text())
        runs = [first_run(lab_command=False), first_run(lab_command=True)]
        for r in runs:
            print(r, flush=True)
        report("notebooks", old["rows"], notes=old["notes"], limits=old.get("roofline"), measure_limits=False,
               extra={"first_run": {"runs": runs, "notes": FIRST_RUN_NOTES}})
        return
    wanted = [n if n.endswith(".ipynb") else n + ".ipynb" for n in args.only.split(",") if n]
    names = [n for n in NOTEBOOKS if not wanted or n in wanted]
    rows = []
    for name in names:
        rows.append(measure(name))
        print(rows[-1], flush=True)
    if wanted:  # the other notebooks keep their rows from the last full run
        rows = merged(rows)
    import json

    from _common import RESULTS

    path = RESULTS / "notebooks.json"
    kept = {k: v for k, v in (json.loads(path.read_text()) if path.exists() else {}).items() if k == "first_run"}
    report("notebooks", rows, extra=kept, notes=f"{RUNS} Run Alls per notebook in one kernel; first_s: the first (a fresh "
           "kernel), again_s: the faster of the next two; kernel_mb: the fresh kernel's resident memory before "
           "the first cell (the floor: python, IPython, ipykernel); rss_mb: the resident memory after each Run "
           "All, as a resource meter shows it; live_mb: after each, once gc.collect() and glibc's malloc_trim(0) "
           "ran (what the kernel still holds; rss_mb minus live_mb is freed memory malloc keeps for reuse); "
           "growth_mb: live after the third minus after the second, what one more Run All keeps")


if __name__ == "__main__":
    main()
