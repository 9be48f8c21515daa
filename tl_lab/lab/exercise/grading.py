"""`exercise check`: the chapter's graded tests on the learner's code, one pytest run per module.

Chapter L10.1, "How to work this chapter" (`ol check L10.1`, `--ref-deps`) and section 4. Modules
are checked in the chapter's order, each in a pytest subprocess (`tl_lab.lab.exercise.plugin`) with
the workspace active: the module checked is always the learner's file, a dependency the learner's
when it passed in this run, else the reference with --ref-deps, else the module is blocked by it.
Each module's row: where its modules came from, passed/total, the first failing chapter test and
its message, and a hint in the chapter's words (the pitfall it looks like, the section to reread).
The whole pytest output goes to <workspace>/.tl_lab/check-<module>.log; the rows are kept in
<workspace>/.tl_lab/status.json for `exercise status` and `exercise tests`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tl_lab.lab.exercise.workspace import command
from tl_lab.lab.exercise.files import SOURCE_LIMIT, STATUS_LIMIT, open_fresh, read_regular, write_atomic
from tl_lab.lab.exercise.registry import DEPS, HARNESS, MODULES, PIECES, SECTIONS, graded
from tl_lab.lab.exercise.stubs import NOT_WRITTEN, ExerciseError, check_module, stub_source
from tl_lab.lab.exercise.workspace import ENV, ENV_USE, REPO_ROOT, NotUtf8Error, read_source

__all__ = ["Row", "STATUS_DIR", "DEFAULT_TIMEOUT", "order", "need_tests", "check", "format_table", "load_status", "pitfall_hint"]

STATUS_DIR = ".tl_lab"  # inside the workspace: the logs and status.json
DEFAULT_TIMEOUT = 120.0  # seconds per test: the slowest graded test takes ~15 s here once numba's cache is warm
MESSAGE_LINES, MESSAGE_WIDTH = 6, 200  # of a failure in the table; the log keeps all of it
_WORSE = {"passed": 0, "not run": 1, "failed": 2}  # a chapter test is the worst of its nodes (a skip is a failure)


@dataclass
class Row:
    """One module's verdict. state: "passed", "failed", "not started", "blocked", "does not import",
    "origin error" or "not run" (pytest gave no report); `uses`: where each module its tests ran
    came from ({module: "learner" | "reference (--ref-deps)" | "reference (harness)"})."""

    module: str
    state: str
    file: str
    uses: dict[str, str] = field(default_factory=dict)
    passed: int = 0
    total: int = 0
    first_failure: str = ""
    message: str = ""
    hint: str = ""
    log: str = ""
    seconds: float = 0.0
    results: dict[str, str] = field(default_factory=dict)  # chapter test -> passed | failed | not run
    digest: str = ""  # of the file graded (`file_digest`), so a verdict is never shown for another text

    @property
    def ok(self) -> bool:
        return self.state == "passed"


def order(modules=None) -> list[str]:
    """The modules asked for with the dependencies they need, in the chapter's order."""
    asked = list(MODULES) if not modules else [check_module(m) for m in modules]
    need = set(asked)
    for m in asked:
        need.update(DEPS[m])
    return [m for m in MODULES if m in need]


def _shorten(text: str) -> str:
    lines = [s[:MESSAGE_WIDTH] for s in text.strip().splitlines()[:MESSAGE_LINES]]
    return "\n".join(lines)


def _not_started(module: str, f: Path, named: bool = False) -> Row | None:
    """The row of `module`'s file `f` when it is not run: missing, the stub, not UTF-8 or not Python; `named`:
    the workspace was given by --workspace (the commands suggested carry it, `cli.command`)."""
    if f.is_symlink() or (os.path.lexists(f) and not f.is_file()):
        return Row(module, "does not import", str(f), message=f"{f}: not a regular file (a link, a FIFO, a device or "
                                                               f"a folder): the check reads only regular files",
                   hint=f"make {f.name} a plain file (cp, not ln -s); the other modules are still checked")
    if not f.is_file():
        return Row(module, "not started", str(f),
                   hint=f"no {f.name} yet: {command('start', module, workspace=f.parent, named=named)}")
    try:
        text = read_source(f)
    except OSError as exc:  # too large, or replaced by a FIFO since: never read, never a hang
        return Row(module, "does not import", str(f), message=f"{f}: {exc.strerror or exc}",
                   hint=f"make {f.name} a plain Python file; the other modules are still checked")
    except NotUtf8Error as exc:  # said here with its own hint, not as the collection's SyntaxError
        where = f"{f}:{exc.lineno}"
        return Row(module, "does not import", str(f), message=f"{where}: {exc.msg}",
                   hint=f"save {f.name} as UTF-8 (the character at {where}); the other modules are still checked")
    if text == stub_source(module):
        return Row(module, "not started", str(f), hint=f"{f.name} is the stub: write its pieces ({SECTIONS[module]}); "
                                                       f"{command('hint', module, workspace=f.parent, named=named)}")
    try:
        compile(text, str(f), "exec", dont_inherit=True)
    except SyntaxError as exc:
        where = f"{exc.filename}:{exc.lineno}"
        return Row(module, "does not import", str(f), message=f"{where}: SyntaxError: {exc.msg}",
                   hint=f"fix the syntax at {where}; the other modules are still checked")
    return None


def pitfall_hint(module: str, nodeid: str, message: str, timeout: float = DEFAULT_TIMEOUT, workspace=None,
                 calls=None) -> str:
    """The hint for a failure of test `nodeid` in `module`: the piece not written yet, the time limit,
    or, with the learner's `workspace`, the diagnosis by symptom (`tl_lab.lab.exercise.diagnose`: each
    written piece tried alone against the reference; a pitfall named only when the learner's output is
    that pitfall's), then the section to reread. Never a pitfall guessed from the test's name. `calls`: the
    test's calls of the learner's functions as the proxy saw them (the plugin's report): the first whose
    answer differs from the reference's is the diagnosis; the pieces tried alone only when there is none."""
    m = re.search(r"NotImplementedError: (\S+): " + NOT_WRITTEN + r" \(section ([^:]+): (.*)\)", message)
    if m:
        return f"{m.group(1)} is not written yet: reread section {m.group(2)} ({m.group(3)})"
    if "TestTimeout" in message or "ran longer than" in message:
        return f"{nodeid.split('::')[-1]} ran past the {timeout:g} s limit: a loop that never ends?"
    where = f"reread {SECTIONS[module]}"
    if workspace is None:
        return where
    from tl_lab.lab.exercise.diagnose import for_module, from_calls

    try:
        lines = from_calls(module, nodeid.split("::")[-1], calls or [], workspace) or for_module(module, workspace)
    except ExerciseError as exc:
        lines = [f"(no diagnosis: {exc})"]
    return "; ".join(lines) if lines else f"each piece agrees with the reference on its own cases: {where}"


def _env(workspace: Path, module: str, use: list[str], report: Path, timeout: float) -> dict:
    env = dict(os.environ)
    for k in ("TL_LAB_PITFALL", "FORCE_COLOR"):
        env.pop(k, None)
    # the tests' process never imports the learner's code: ENV off there, and TL_LAB_EXERCISE_REMOTE names the
    # workspace whose modules a sandboxed child holds (tl_lab.lab.exercise.remote)
    env.update({ENV: "off", "TL_LAB_EXERCISE_REMOTE": str(workspace), ENV_USE: ",".join(use), "TL_LAB_EXERCISE_GRADE": module,
                "TL_LAB_EXERCISE_REPORT": str(report), "TL_LAB_EXERCISE_TIMEOUT": str(timeout), "PY_COLORS": "0",
                "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), *filter(None, [env.get("PYTHONPATH")])])})
    return env


def _run(workspace: Path, module: str, use: list[str], timeout: float, tests=None,
         first_failure: bool = False) -> tuple[dict | None, Path, float]:
    """pytest on `module`'s graded tests (or the nodes `tests`) -> (the plugin's report or None, the
    log file, seconds); first_failure: stop at the first failing test (pytest -x)."""
    from tl_lab.lab.pitfalls import _QUIET_PLUGINS

    logs = workspace / STATUS_DIR
    logs.mkdir(exist_ok=True)
    log = logs / f"check-{module}.log"
    files = list(tests) if tests else sorted({g.file for g in graded(module)})
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="tl-exercise-") as tmp:
        report = Path(tmp) / "report.json"
        # the hf-marked variants compare with torch, which a learner's lab does not install
        basetemp = Path(tmp) / "tests" / "pytest"  # the tests' tmp_path, readable (only) to the learner's sandboxed process
        cmd = [sys.executable, "-m", "pytest", *files, "-m", "not hf", "-p", "tl_lab.lab.exercise.plugin", "-q",
               f"--basetemp={basetemp}",
               "--tb=short", "-rfEs", *(["-x"] if first_failure else []), *_QUIET_PLUGINS]
        budget = timeout * (len(PIECES[module]) + 10) + 120  # far beyond any honest run; a hung process ends
        with open_fresh(log) as out:
            try:
                output = logs / f"check-{module}.output.log"  # the learner's own prints, 1 MB at most
                env = {**_env(workspace, module, use, report, timeout), "TL_LAB_EXERCISE_BASETEMP": str(basetemp),
                       "TL_LAB_EXERCISE_OUTPUT": str(output)}
                subprocess.run(cmd, cwd=REPO_ROOT, env=env,
                               stdout=out, stderr=subprocess.STDOUT, timeout=budget, check=False)
            except subprocess.TimeoutExpired:
                out.write(f"\nexercise: pytest gave no verdict within {budget:.0f} s; stopped\n")
        data = json.loads(report.read_text(encoding="utf-8")) if report.is_file() else None
    return data, log, time.perf_counter() - t0


def _row(module: str, f: Path, uses: dict, data: dict | None, log: Path, seconds: float, timeout: float) -> Row:
    row = Row(module, "failed", str(f), uses, log=str(log), seconds=round(seconds, 1))
    if data is None:
        row.state, row.message = "not run", f"pytest wrote no report; see {log}"
        return row
    origin = next((e for e in data["errors"] if e["kind"] == "origin"), None)
    if origin:
        row.state, row.message = "origin error", origin["message"]
        row.hint = "the reference was loaded where the learner's file was meant to run: nothing was graded"
        return row
    loaded = data["origins"][module]["loaded"]
    if loaded not in (None, str(f)):
        row.state, row.message = "origin error", f"tl_lab.{module} ran from {loaded}, not {f}"
        return row
    collect = [e for e in data["errors"] if e["kind"] == "collect"]
    if collect:
        text = collect[0]["message"]
        at = re.findall(re.escape(str(f)) + r":(\d+)", text)
        row.state = "does not import"
        last = [s for s in text.strip().splitlines() if s.strip()][-1]
        errors = [s[1:].strip() for s in text.splitlines() if s.startswith("E ")]  # pytest's own lines, not its boilerplate
        said = re.sub(r"^ImportError: tl_lab\.\w+ raised at import: ", "", errors[-1]) if errors else last.strip()
        # the proxy's ImportError names the place already ("FILE:LINE in (import): tl_lab.kv raised at import: ")
        last = re.sub(r"^(E\s+)ImportError: \S+:\d+ in [^:]+: tl_lab\.\w+ raised at import: ", r"\1", last.strip())
        row.message = f"{f}:{at[-1]}: {last}" if at else f"{f}: {said}" if errors else _shorten(text)
        row.hint = "the module fails when imported; the other modules are still checked"
        if "TestTimeout" in text:  # the collection's limit (tl_lab.lab.exercise.plugin)
            row.hint = f"importing {f.name} never ended (a loop at its top level?); the other modules are still checked"
        return row
    results = data["results"]
    by_test: dict[str, str] = {}
    for r in results:
        name = r["chapter_test"] or r["nodeid"]
        outcome = r["outcome"] if r["outcome"] in _WORSE else "failed"
        by_test[name] = max(by_test.get(name, "passed"), outcome, key=_WORSE.get)
    row.results = by_test
    row.total = len(by_test)
    row.passed = sum(v == "passed" for v in by_test.values())
    not_run = sum(v == "not run" for v in by_test.values())
    failing = next((r for r in results if r["outcome"] not in ("passed", "not run")), None)
    expected = len(graded(module))
    if failing is None and not not_run and row.total == expected:
        row.state = "passed"
        return row
    if failing is None:  # a test past the limit fails even when its code caught the time-out (the plugin)
        row.message = f"only {row.total - not_run} of the {expected} chapter tests ran; see {log}"
        return row
    row.first_failure = failing["chapter_test"] or failing["nodeid"]
    row.message = f"{failing['nodeid'].split('::')[-1]}: {_shorten(failing['message'])}"
    if failing.get("at"):  # raised inside the learner's code, or stopped there at the limit (tl_lab.lab.exercise.plugin)
        how = "stopped" if "TestTimeout" in failing["message"] else "raised"
        row.message += f"\n{how} at {failing['at']}"
    if not_run:
        row.message += (f"\nnot run after it: {not_run} of its chapter tests "
                        f"(a module's first test past the limit ends its check)")
    row.hint = pitfall_hint(module, failing["nodeid"], failing["message"], timeout, f.parent,
                            (data.get("calls") or {}).get(failing["nodeid"]))
    return row


def need_tests(modules, workspace: Path | None = None, named: bool = False) -> None:
    """The graded tests live in the clone's tests/ (with its conftest and pytest, hypothesis): an
    ExerciseError naming what is missing and how to get it, before any module is checked. A tl_lab
    installed with pip has no tests/ (the graded tests read the repository's golden files and helpers
    too): the README's install is a clone."""
    import importlib.util

    files = ["tests/conftest.py", *sorted({g.file for m in modules for g in graded(m)})]
    missing = [f for f in files if not (REPO_ROOT / f).is_file()]
    if missing:
        raise ExerciseError(f"exercise check runs the chapter's tests from a clone of the repository, and this tl_lab "
                            f"({REPO_ROOT / 'tl_lab'}) has no {missing[0]}: clone it (README, Install), then run "
                            f"{command('check', workspace=workspace, named=named)} from the clone")
    lacking = [m for m in ("pytest", "hypothesis") if importlib.util.find_spec(m) is None]
    if lacking:
        raise ExerciseError(f"exercise check needs {' and '.join(lacking)}: pip install -e '.[dev]' in the clone")


def check(workspace: Path, modules=None, ref_deps: bool = False, timeout: float = DEFAULT_TIMEOUT,
          progress=None, named: bool = False) -> list[Row]:
    """Check `modules` (default: all six) of `workspace`, with their dependencies, in the chapter's
    order. progress: called with each Row as it is done; named: the workspace was given by --workspace
    (the commands the hints suggest carry it, as they do for a workspace that is not the default)."""
    workspace = Path(workspace).resolve()  # the pytest runs start in the clone: a relative path would be another folder
    need_tests(order(modules), workspace, named)
    rows: dict[str, Row] = {}
    for m in order(modules):
        f = workspace / f"{m}.py"
        digest = file_digest(f)  # before the run: the file may be edited while it is graded
        row = _not_started(m, f, named)
        if row is None:
            uses = {m: "learner"}
            for d in DEPS[m]:
                uses[d] = "learner" if rows[d].ok else ("reference (--ref-deps)" if ref_deps else "blocked")
            for h in HARNESS.get(m, ()):
                uses[h] = "reference (harness)"
            blocked = [d for d, how in uses.items() if how == "blocked"]
            if blocked:
                row = Row(m, "blocked", str(f), uses, message=f"blocked by {', '.join(blocked)} (not passing)",
                          hint=f"pass {', '.join(blocked)} first, or check with --ref-deps to borrow the reference")
            else:
                from tl_lab.lab.exercise.sandbox import say_unsandboxed

                say_unsandboxed()  # here, once: the pytest run's own note goes to its log
                data, log, seconds = _run(workspace, m, [d for d, how in uses.items() if how == "learner"], timeout)
                row = _row(m, f, uses, data, log, seconds, timeout)
        row.digest = digest
        rows[m] = row
        if progress is not None:
            progress(row)
    _save(workspace, rows.values())
    return list(rows.values())


def _save(workspace: Path, rows) -> None:
    path = workspace / STATUS_DIR / "status.json"
    path.parent.mkdir(exist_ok=True)
    status = load_status(workspace)
    for r in rows:
        status[r.module] = {**asdict(r), "when": time.strftime("%Y-%m-%d %H:%M:%S")}
    write_atomic(path, json.dumps(status, indent=1).encode("utf-8"))  # a unique temporary file, then a rename


def file_digest(f: Path) -> str:
    """The sha256 of a learner's file ("" when there is none)."""
    try:
        return hashlib.sha256(read_regular(f, SOURCE_LIMIT)).hexdigest()
    except OSError:
        return ""


def changed_since(last: dict, f: Path) -> bool:
    """Whether `f` is no longer the text its last check (`last`, from status.json) graded: edited, or
    reset to the stub. An entry saved before digests were kept says nothing."""
    return bool(last.get("digest")) and last["digest"] != file_digest(f)


def load_status(workspace: Path) -> dict:
    path = workspace / STATUS_DIR / "status.json"
    try:
        data = json.loads(read_regular(path, STATUS_LIMIT).decode("utf-8"))
    except (OSError, ValueError, RecursionError):  # missing, a FIFO or a link, too large, not JSON: no status
        return {}
    if not isinstance(data, dict):
        return {}
    return {m: v for m, v in data.items() if isinstance(m, str) and isinstance(v, dict)}


def _uses(row: Row) -> str:
    others = [f"{d}: {how}" for d, how in row.uses.items() if d != row.module and how != "learner"]
    return "learner's file" + (f"; {', '.join(others)}" if others else "")


def format_table(rows: list[Row], workspace: Path | None = None) -> str:
    """The check as text: one line per module (state, passed/total, where its code came from), then
    under it the first failing chapter test, its message and the hint; with `workspace`, a last line
    saying where the logs and status.json are, pass or fail."""
    head = f"{'module':<8} {'state':<16} {'tests':>5}  from"
    lines = [head, "-" * 78]
    for r in rows:
        tests = f"{r.passed}/{r.total}" if r.total else "-"
        src = _uses(r) if r.uses else "-"
        lines.append(f"{r.module:<8} {r.state:<16} {tests:>5}  {src}")
        if r.first_failure:
            lines.append(f"         first failing: {r.first_failure}")
        for s in r.message.splitlines():
            lines.append(f"         {s}")
        if r.hint:
            lines.append(f"         hint: {r.hint}")
        if r.state == "failed" and r.log and r.log not in r.message:  # the whole traceback of every failure
            lines.append(f"         the whole output: {r.log}")
    n_ok = sum(r.ok for r in rows)
    lines.append(f"{n_ok} of {len(rows)} modules pass")
    if workspace is not None:
        d = Path(workspace) / STATUS_DIR
        lines.append(f"logs: {d / 'check-<module>.log'} (each module run); verdicts: {d / 'status.json'}")
    return "\n".join(lines)
