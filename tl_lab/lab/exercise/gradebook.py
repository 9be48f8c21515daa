"""`python -m tl_lab exercise grade WS [WS ...] --out FILE.csv`: `check` each learner's workspace in
turn (all six modules), one line each on stdout and one row each in a CSV gradebook.

For instructors (docs/exercise.md, "For instructors"). Every workspace and the output are checked
before the first one is graded; the rows go to FILE.csv.partial as each workspace is done and it
becomes FILE.csv only at the end, so an interrupted run loses nothing and never leaves half a
gradebook under the name asked for. Each workspace keeps its own logs and status.json (`check`).
"""

from __future__ import annotations

import csv
import os
import time
from pathlib import Path

from tl_lab.lab.exercise.grading import Row, check, need_tests
from tl_lab.lab.exercise.registry import MODULES, graded
from tl_lab.lab.exercise.stubs import ExerciseError
from tl_lab.lab.exercise.workspace import usable

__all__ = ["COLUMNS", "grade", "gradebook_row"]

COLUMNS = ["workspace", "verdict", "passed", "total",
           *(f"{m}_{k}" for m in MODULES for k in ("state", "passed", "total", "digest")), "seconds", "when"]


def gradebook_row(workspace: Path, rows: list[Row], seconds: float) -> dict:
    """One learner's CSV row from `check`'s rows: the verdict ("passed" only when all six pass), the chapter
    tests passed of all, and per module its state, tests passed of the chapter tests that grade it (the
    count `check` expects: kv 4, sample 7, ..., 24 in all) and the sha256 of the file graded."""
    by = {r.module: r for r in rows}
    totals = {m: len(graded(m)) for m in MODULES}
    row = {"workspace": str(workspace), "verdict": "passed" if all(by[m].ok for m in MODULES) else "failed",
           "passed": sum(by[m].passed for m in MODULES), "total": sum(totals.values()),
           "seconds": f"{seconds:.1f}", "when": time.strftime("%Y-%m-%d %H:%M:%S")}
    for m in MODULES:
        r = by[m]
        row.update({f"{m}_state": r.state, f"{m}_passed": r.passed, f"{m}_total": totals[m], f"{m}_digest": r.digest})
    return row


def _line(row: dict) -> str:
    """A learner on one line: `learner1  failed  19/24  kv passed 5/5 · quant failed 2/4 · ...`."""
    parts = [f"{m} {row[f'{m}_state']} {row[f'{m}_passed']}/{row[f'{m}_total']}" for m in MODULES]
    return f"{row['workspace']}  {row['verdict']}  {row['passed']}/{row['total']}  " + " · ".join(parts)


def _checked(workspaces, out: Path) -> list[Path]:
    """The workspaces, resolved, each one usable and named once, and `out` a file that can be written:
    an ExerciseError before anything is graded."""
    if not workspaces:
        raise ExerciseError("exercise grade needs at least one workspace")
    found: dict[Path, str] = {}
    for w in workspaces:
        ws = Path(w).resolve()
        usable(ws, write=True)  # check writes each one's logs and status.json
        if ws in found:
            raise ExerciseError(f"workspace {w} is named twice (also as {found[ws]})")
        found[ws] = w
    if out.suffix.lower() != ".csv":
        raise ExerciseError(f"--out must name a .csv file, got {out}")
    if out.is_dir() or not out.parent.is_dir() or not os.access(out.parent, os.W_OK):
        raise ExerciseError(f"--out {out}: not a file in a folder that can be written")
    return list(found)


def grade(workspaces, out, timeout: float, ref_deps: bool, say=print) -> list[dict]:
    """Check every workspace (all six modules), in the order given -> their gradebook rows, written to
    `out` (CSV) at the end and to `out`.partial as each is done; say(line) reports each learner."""
    out = Path(out)
    found = _checked(workspaces, out)
    need_tests(MODULES)
    partial = out.with_name(out.name + ".partial")
    done: list[dict] = []
    with open(partial, "w", newline="", encoding="utf-8") as f:
        book = csv.DictWriter(f, COLUMNS)
        book.writeheader()
        for ws in found:
            t0 = time.perf_counter()
            rows = check(ws, MODULES, ref_deps=ref_deps, timeout=timeout, named=True)
            done.append(gradebook_row(ws, rows, time.perf_counter() - t0))
            book.writerow(done[-1])
            f.flush()
            say(_line(done[-1]))
    partial.replace(out)
    return done
