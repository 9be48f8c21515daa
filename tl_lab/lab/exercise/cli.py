"""`python -m tl_lab exercise ...`: start, tests, check, parity, hint, status, reset; grade.

Chapter L10.1, "How to work this chapter". Every command takes --workspace DIR (else
TL_LAB_WORKSPACE, else work/L10.1 in the clone); grade, the instructors' command, takes many
(`tl_lab.lab.exercise.gradebook`). Exit codes: 0 done (check, parity and grade: everything asked for
passes), 1 a check, parity or grade that does not pass, 2 bad input (an unknown module, a
missing or unwritable workspace), each error one line "error: ..." on stderr. Nothing of the
learner's is ever overwritten or deleted: start skips existing files, reset keeps a backup.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from tl_lab.errors import one_line
from tl_lab.lab.exercise.registry import CATALOGUE, MODULES, PIECES, SECTIONS
from tl_lab.lab.exercise.stubs import ExerciseError, check_module, learner_lines, stub_source, written
from tl_lab.lab.exercise.workspace import ENV, OFF, command, is_stub, resolve, usable

__all__ = ["add_cli", "cli", "command", "start", "reset", "written"]

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def add_cli(sub) -> None:
    p = sub.add_parser("exercise", help="your turn: write the six modules, the chapter's tests grade them",
                       description=__doc__.split("\n\n")[0] + " Chapter L10.1: the learner writes kv, quant, model, "
                       "forward, runner and sample; the chapter's 24 tests are the verdict.")
    cmds = p.add_subparsers(dest="exercise_command", required=True, metavar="command")

    def add(name, help_text):
        c = cmds.add_parser(name, help=help_text, description=help_text)
        c.add_argument("--workspace", metavar="DIR", help="the workspace (default: $TL_LAB_WORKSPACE, else work/L10.1)")
        return c

    add("start", "write the stubs of MODULE (default: all six); an existing file is left alone").add_argument(
        "modules", nargs="*", metavar="MODULE")
    add("tests", "the chapter's test catalogue with our test names and your last results")
    c = add("check", "run the graded tests on your code; exit 0 only when every one asked for passes")
    c.add_argument("modules", nargs="*", metavar="MODULE")
    c.add_argument("--ref-deps", action="store_true", help="the reference stands in for a dependency not passing yet")
    c.add_argument("--timeout", type=float, default=None, metavar="S", help="seconds per test (default 120); a module's "
                   "first test past it ends that module's check: its later tests are not run")
    add("parity", "your sample.py against the golden files (suites: sampler, rng)").add_argument(
        "suites", nargs="*", metavar="SUITE", default=["sampler", "rng"])
    add("hint", "what to write in MODULE, piece by piece, with what is still missing").add_argument("module")
    add("try", "run one PIECE of your module (e.g. quant.f32_to_f16) on its cases against the reference").add_argument(
        "piece", metavar="PIECE")
    add("status", "your progress: each module's file, pieces written, last check")
    add("reset", "a fresh stub of MODULE; your file is kept as a backup beside it").add_argument("module")
    g = cmds.add_parser("grade", help="for instructors: check each workspace in turn, a CSV row each",
                        description="for instructors: check each WS in turn (all six modules), one line each here and "
                        "a row each in --out; exit 0 only when every workspace passes")
    g.add_argument("workspaces", nargs="+", metavar="WS")
    g.add_argument("--out", required=True, metavar="FILE.csv", help="the gradebook (written as FILE.csv.partial "
                   "while the run lasts)")
    g.add_argument("--ref-deps", action="store_true", help="as in check")
    g.add_argument("--timeout", type=float, default=None, metavar="S", help="as in check (default 120)")
    p.set_defaults(run=cli)


def cli(args) -> int:
    from tl_lab.lab.exercise.workspace import lift_refusal

    if getattr(args, "workspace", None) is not None or args.exercise_command == "grade":
        lift_refusal()  # --workspace (or grade's own) wins over a bad TL_LAB_WORKSPACE
    try:
        return COMMANDS[args.exercise_command](args)
    except ExerciseError as exc:
        print(f"error: {one_line(str(exc))}", file=sys.stderr)
        return EXIT_USAGE


def _workspace(args, must_exist: bool = True, write: bool = False) -> Path:
    """The workspace of `args` (--workspace, TL_LAB_WORKSPACE, else work/L10.1), checked by `usable`;
    when not `must_exist`, a missing default (before `start`) is allowed, a named one is not."""
    ws = resolve(args.workspace)
    named = args.workspace is not None or os.environ.get(ENV, "").strip().lower() not in OFF
    if must_exist or named or ws.exists():
        usable(ws, write)
    return ws


def _modules(names) -> list[str]:
    return [check_module(m) for m in names] if names else list(MODULES)


def start(ws: Path, modules) -> list[tuple[str, str]]:
    """Write the stubs of `modules` into `ws` (made when missing) -> [(file name, "wrote" | "left alone")].
    A file that exists is never touched; a new one is written whole or not at all."""
    if ws.exists():
        usable(ws, write=True)
    else:
        try:
            ws.mkdir(parents=True)
        except OSError as exc:
            raise ExerciseError(f"cannot make the workspace {ws}: {exc.strerror or exc}") from None
    out = []
    for m in modules:
        f = ws / f"{m}.py"
        out.append((f.name, "wrote" if _write_new(f, stub_source(m)) else "left alone (it exists)"))
    return out


def _write_new(f: Path, text: str) -> bool:
    """Write `text` to `f` only if no such file exists (checked and created in one step, "x")."""
    tmp = f.with_name(f".{f.name}.new")
    tmp.write_text(text, encoding="utf-8")
    try:
        os.link(tmp, f)  # fails if f exists: never overwrites, and f appears whole
        return True
    except FileExistsError:
        return False
    finally:
        tmp.unlink()


def reset(ws: Path, module: str) -> tuple[Path | None, Path]:
    """A fresh stub of `module` in `ws`; the old file renamed to <module>.py.bak-<time> (never replacing
    another backup). -> (backup or None, the new file)."""
    f = ws / f"{check_module(module)}.py"
    backup = None
    if f.exists():
        stamp = time.strftime("%Y%m%d-%H%M%S")
        for i in range(1000):
            cand = f.with_name(f"{f.name}.bak-{stamp}" + (f"-{i}" if i else ""))
            try:
                os.link(f, cand)  # fails if cand exists
                backup = cand
                break
            except FileExistsError:
                continue
        else:
            raise ExerciseError(f"no free backup name for {f}")
        f.unlink()
    _write_new(f, stub_source(module))
    return backup, f




def _start(args) -> int:
    ws = resolve(args.workspace)  # start makes it (and refuses a file or an unwritable parent)
    for name, what in start(ws, _modules(args.modules)):
        print(f"{what:<24} {ws / name}")
    named = args.workspace is not None
    print(f"next: {command('tests', workspace=ws, named=named)}   (the catalogue), then write a module and "
          f"{command('check', 'MODULE', workspace=ws, named=named)}")
    return EXIT_OK


def _tests(args) -> int:
    from tl_lab.lab.exercise.grading import changed_since, load_status

    ws = _workspace(args, must_exist=False)
    status = load_status(ws) if ws.is_dir() else {}
    changed = {m for m, last in status.items() if changed_since(last, ws / f"{m}.py")}
    print(f"{'chapter test':<46} {'kind':<20} {'module':<8} {'last':<8} our test")
    for g in CATALOGUE:
        last = status.get(g.module, {}).get("results", {}).get(g.name, "-")
        last += " (old)" if g.module in changed and last != "-" else ""
        print(f"{g.name:<46} {g.kind:<20} {g.module:<8} {last:<8} {g.file}::test_{g.name}")
        print(f"{'':<46} checks: {g.checks}")
        print(f"{'':<46} why: {g.why}")
        if g.also:
            print(f"{'':<46} with: {', '.join(g.also)}")
    print(f"{len(CATALOGUE)} tests; you write no graded tests here (rung R0). Our test of each is the pytest function "
          f"named, with its variants test_<name>_<case> when it has some")
    if changed:
        print(f"(old): a result of an earlier text of {', '.join(f'{m}.py' for m in MODULES if m in changed)}, "
              f"changed since its last check")
    return EXIT_OK


def _timeout(args) -> float:
    from tl_lab.lab.exercise.grading import DEFAULT_TIMEOUT

    timeout = DEFAULT_TIMEOUT if args.timeout is None else args.timeout
    if not 0 < timeout <= 86400:  # a negative, NaN or huge limit (1e10 overflows the alarm) would fail a correct module
        raise ExerciseError(f"--timeout must be a number of seconds, more than 0 and at most a day (86400), "
                            f"got {args.timeout!r}")
    return timeout


def _check(args) -> int:
    from tl_lab.lab.exercise.grading import check, format_table

    ws = _workspace(args, write=True)  # the logs and status.json go inside
    modules = _modules(args.modules)
    timeout = _timeout(args)

    def progress(row) -> None:
        print(f"  {row.module:<8} {row.state:<16} {row.seconds:6.1f} s", file=sys.stderr, flush=True)

    rows = check(ws, modules, ref_deps=args.ref_deps, timeout=timeout, progress=progress,
                 named=args.workspace is not None)
    print(format_table(rows, ws))
    asked = [r for r in rows if r.module in modules]
    return EXIT_OK if all(r.ok for r in asked) else EXIT_FAILED


def _grade(args) -> int:
    from tl_lab.lab.exercise.gradebook import grade

    rows = grade(args.workspaces, Path(args.out), _timeout(args), args.ref_deps, say=lambda line: print(line, flush=True))
    print(f"{sum(r['verdict'] == 'passed' for r in rows)} of {len(rows)} workspaces pass; gradebook: {args.out}")
    return EXIT_OK if all(r["verdict"] == "passed" for r in rows) else EXIT_FAILED


def _parity(args) -> int:
    from tl_lab.lab.exercise.guard import blame
    from tl_lab.lab.exercise.parity import SUITES, limited, run
    from tl_lab.lab.exercise.workspace import active, install

    bad = [s for s in args.suites if s not in SUITES]
    if bad:
        raise ExerciseError(f"unknown parity suite {bad[0]!r}: the suites are {', '.join(SUITES)}")
    ws = _workspace(args)
    f = ws / "sample.py"
    if not f.is_file():
        raise ExerciseError(f"no {f}: {command('start', 'sample', workspace=ws, named=args.workspace is not None)}")
    if "tl_lab.sample" in sys.modules:
        raise ExerciseError("tl_lab.sample is already imported in this process: run parity in a fresh one")
    if (finder := active()) is not None:  # TL_LAB_WORKSPACE's, from `import tl_lab`: its plan takes an untouched
        sys.meta_path.remove(finder)       # stub for the reference, and --workspace may name another folder
    install(ws, use={"sample"})
    try:
        with limited():  # a loop at the top level of sample.py too
            import tl_lab.sample as ts
    except Exception as exc:  # noqa: BLE001: the learner's module does not import
        # blame's place: a SyntaxError has no frame in sample.py, its line is the error's own (was: no line)
        print(f"parity: {blame(exc, ws, 'sample').at}: {type(exc).__name__}: {exc}")
        return EXIT_FAILED
    if ts.__file__ != str(f):  # never the reference held to the golden files in the learner's place
        raise ExerciseError(f"tl_lab.sample was loaded from {ts.__file__}, not your {f}: run parity in a fresh process")
    verdicts = run(ts, list(dict.fromkeys(args.suites)))
    print(f"your {ts.__file__}")
    for v in verdicts:
        print(v.line())
    return EXIT_OK if all(v.ok for v in verdicts) else EXIT_FAILED


def _hint(args) -> int:
    from tl_lab.lab.exercise.grading import changed_since, load_status

    module = check_module(args.module)
    ws = _workspace(args, must_exist=False)
    done = written(ws, module)
    lines = learner_lines(module)
    print(f"{module}: {SECTIONS[module]}; {sum(done.values())} of {len(done)} pieces written")
    for p in PIECES[module]:
        mark = "done" if done[p.qualname] else "todo"
        print(f"  [{mark}] {p.qualname:<28} section {p.section:<4} ~{lines[p.qualname]:>3} lines  {p.hint}")
    last = load_status(ws).get(module) if ws.is_dir() else None
    if last and last.get("hint"):
        since = " (your file has changed since)" if changed_since(last, ws / f"{module}.py") else ""
        print(f"last check ({last['when']}){since}: {last['state']}; {last['hint']}")
    return EXIT_OK


def _status(args) -> int:
    from tl_lab.lab.exercise.grading import changed_since, load_status

    ws = _workspace(args)
    status = load_status(ws)
    print(f"workspace {ws}")
    for m in MODULES:
        f = ws / f"{m}.py"
        done = written(ws, m)
        if not f.is_file():
            state = "no file"
        elif is_stub(f, m):  # as the hook reads it: a byte order mark or CRLF lines do not make it yours
            state = "the stub"
        else:
            state = "yours"
        last = status.get(m)
        verdict = f"{last['state']} {last['passed']}/{last['total']} ({last['when']})" if last else "never checked"
        if last and changed_since(last, f):  # after a reset too: "passed" is not said of a fresh stub
            verdict += ", the file has changed since"
        print(f"  {m:<8} {state:<9} {sum(done.values()):>2}/{len(done):<2} pieces  last check: {verdict}")
    return EXIT_OK


def _reset(args) -> int:
    ws = _workspace(args, write=True)
    backup, f = reset(ws, args.module)
    print(f"kept your file as {backup}" if backup else f"there was no {f.name}")
    print(f"wrote a fresh stub {f}")
    return EXIT_OK


def _try(args) -> int:
    from tl_lab.lab.exercise.diagnose import try_piece

    result = try_piece(args.piece, args.workspace)
    print(result)
    return EXIT_OK if result.passed else EXIT_FAILED


COMMANDS = {"try": _try, "start": _start, "tests": _tests, "check": _check, "parity": _parity, "hint": _hint, "status": _status,
            "reset": _reset, "grade": _grade}
