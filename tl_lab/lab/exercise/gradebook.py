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
           *(f"{m}_{k}" for m in MODULES for k in ("state", "passed", "total", "digest")), "seconds", "when",
           "copies_reference"]


def reference_digests() -> dict[str, str]:
    """The sha256 of each reference module: a learner's file with the same digest is a copy of it."""
    import hashlib

    from tl_lab.lab.exercise.stubs import reference_path

    return {m: hashlib.sha256(Path(reference_path(m)).read_bytes()).hexdigest() for m in MODULES}


def graded_files() -> dict[str, str]:
    """The sha256 of every file the grade reads as given: the graded tests, their conftest, the golden data."""
    import hashlib

    from tl_lab.lab.exercise.workspace import REPO_ROOT

    files = [REPO_ROOT / "tests" / "conftest.py", *sorted({REPO_ROOT / g.file for m in MODULES for g in graded(m)})]
    golden = REPO_ROOT / "data" / "golden"
    if golden.is_dir():
        files += sorted(p for p in golden.rglob("*") if p.is_file() and not p.is_symlink())
    return {str(f): hashlib.sha256(f.read_bytes()).hexdigest() for f in files}


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
    refs = reference_digests()
    row["copies_reference"] = " ".join(m for m in MODULES if by[m].digest and by[m].digest == refs[m])
    return row


def error_row(workspace: Path, why: str, seconds: float) -> dict:
    """The row of a learner whose check could not run at all (the workspace removed, an OS error): failed."""
    row = {"workspace": str(workspace), "verdict": "failed", "passed": 0, "total": sum(len(graded(m)) for m in MODULES),
           "seconds": f"{seconds:.1f}", "when": time.strftime("%Y-%m-%d %H:%M:%S"), "copies_reference": ""}
    for m in MODULES:
        row.update({f"{m}_state": f"not checked: {why}"[:200], f"{m}_passed": 0, f"{m}_total": len(graded(m)),
                    f"{m}_digest": ""})
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
    sums = graded_files()
    done: list[dict] = []
    try:  # never through a link: a link named like the partial file is replaced, not written through
        if partial.is_symlink() or (partial.exists() and not partial.is_file()):
            partial.unlink()
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o644)
    except OSError as exc:
        raise ExerciseError(f"{partial}: {exc.strerror or exc}") from None
    with open(fd, "w", newline="", encoding="utf-8") as f:
        book = csv.DictWriter(f, COLUMNS)
        book.writeheader()
        for ws in found:
            t0 = time.perf_counter()
            now = graded_files()
            if now != sums:  # a test or golden file changed since the grade began: nobody after this is graded
                changed = sorted(k for k in set(now) | set(sums) if now.get(k) != sums.get(k))
                raise ExerciseError(f"{changed[0]} changed during the grade (before {ws}): the grade stops; "
                                    f"restore it (git checkout) and grade again")
            try:
                rows = check(ws, MODULES, ref_deps=ref_deps, timeout=timeout, named=True)
                done.append(gradebook_row(ws, rows, time.perf_counter() - t0))
            except (ExerciseError, OSError) as exc:  # one learner's trouble is their row, not the class's
                done.append(error_row(ws, str(exc), time.perf_counter() - t0))
            book.writerow(done[-1])
            f.flush()
            say(_line(done[-1]))
    partial.replace(out)
    return done
