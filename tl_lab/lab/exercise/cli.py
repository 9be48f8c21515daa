"""`python -m tl_lab exercise ...`: start, tests, check, parity, hint, status, reset; grade.

Chapter L10.1, "How to work this chapter". Every command takes --workspace DIR (else
TL_LAB_WORKSPACE, else work/L10.1 in the clone); grade, the instructors' command, takes many
(`tl_lab.lab.exercise.gradebook`). Exit codes: 0 done (check, parity and grade: everything asked for
passes), 1 a check, parity or grade that does not pass, 2 bad input (an unknown module, a
missing or unwritable workspace) and every OS error (naming its file), each error one line "error: ..." on
stderr, names with their control characters escaped. Nothing of the
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
    from tl_lab.lab.exercise.files import EscapingStream

    out, err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = EscapingStream(out), EscapingStream(err)  # names shown escaped (issue #61)
    try:
        return COMMANDS[args.exercise_command](args)
    except ExerciseError as exc:
        print(f"error: {one_line(str(exc))}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:  # `... | head`: the entry point ends quietly
        raise
    except OSError as exc:  # every OS error names its file, one line, exit 2 (was: a bare strerror, exit 1)
        print(f"error: {os_error(exc)}", file=sys.stderr)
        return EXIT_USAGE
    finally:
        if isinstance(sys.stdout, EscapingStream):
            sys.stdout = out
        if isinstance(sys.stderr, EscapingStream):
            sys.stderr = err


def os_error(exc: OSError) -> str:
    """An OSError in one line that names its file(s): "FILE: what" (FILE -> OTHER for a rename or a link)."""
    what = exc.strerror or str(exc) or type(exc).__name__
    files = " -> ".join(str(f) for f in (exc.filename, exc.filename2) if f is not None)
    return one_line(f"{files}: {what}" if files else f"{what} ({type(exc).__name__})")


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
        from tl_lab.lab.exercise.workspace import inside_repo

        inside_repo(ws)  # before anything is made
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
    """Write `text` to `f` only if nothing is there (a dangling link included): under a unique temporary name,
    then linked in one step (`files.write_new`; was: the fixed name .kv.py.new, which a folder or a second
    `start` at once could hold)."""
    from tl_lab.lab.exercise.files import write_new

    return write_new(f, text.encode("utf-8"))


def reset(ws: Path, module: str) -> tuple[Path | None, Path]:
    """A fresh stub of `module` in `ws`, all or nothing; the old file (or link) kept as
    <module>.py.bak-<time> (never replacing another backup). -> (backup or None, the new file)."""
    from tl_lab.lab.exercise.files import replace_keeping
    from tl_lab.lab.exercise.workspace import inside_repo

    f = ws / f"{check_module(module)}.py"
    inside_repo(ws)  # refused before anything moves (was: the package's kv.py moved to a backup, then an error)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    backup = replace_keeping(f, stub_source(module).encode("utf-8"),
                             lambda i: f.with_name(f"{f.name}.bak-{stamp}" + (f"-{i}" if i else "")))
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
    from tl_lab.lab.exercise.parity import SUITES, in_child

    bad = [s for s in args.suites if s not in SUITES]
    if bad:
        raise ExerciseError(f"unknown parity suite {bad[0]!r}: the suites are {', '.join(SUITES)}")
    ws = _workspace(args)
    f = ws / "sample.py"
    if not f.is_file():
        raise ExerciseError(f"no {f}: {command('start', 'sample', workspace=ws, named=args.workspace is not None)}")
    # in a child (issue #61): the learner's SystemExit, os._exit or a loop at import is a failure here, never exit 0
    code, lines = in_child(ws, list(dict.fromkeys(args.suites)))
    if code == EXIT_USAGE:
        raise ExerciseError(lines[-1].removeprefix("parity: ") if lines else "parity could not run")
    for line in lines:
        print(line)
    return code


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
