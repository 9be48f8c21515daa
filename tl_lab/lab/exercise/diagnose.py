"""Diagnosis by symptom: which mistake a failing case shows, said only when the output proves it.

Chapter L10.1, section 5 (the 22 pitfalls, `tl_lab.lab.pitfalls`). A pitfall is named ONLY when the
learner's output equals that pitfall's output: the failing case is run on the reference with each
candidate pitfall switched in (the pitfalls with an edit in that piece; a child process each side,
`tl_lab.lab.exercise.tries`), and the learner's observations are compared with each. Never for an error
raised in the learner's code (then: the file, the line, the error); never two pitfalls where one is
meant (two that fit the same output name neither). Otherwise, and that is the common case, since most
mistakes are not among the chapter's 22: the function, the first differing value (integers and bit
patterns in hex, floats as exact hex and decimal), the input that shows it, and the section to reread.

    explain(diff) -> list[str]      a check's failing case (a `Difference`) in words
    diagnose_try(result, ...)       the same for `exercise try`'s table
    from_calls(module, test, calls) `exercise check`'s failure: the test's first call whose answer differs from
                                    the reference's to the same call (what the proxy saw, `remote.Connection.record`)
    for_module(module, workspace)   the fallback, when no call was seen: every written piece tried, the first that differs
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tl_lab.lab.exercise.registry import PIECES, SECTIONS

__all__ = ["Difference", "explain", "diagnose_try", "from_calls", "for_module", "pitfall_line", "raised_line"]


@dataclass(frozen=True)
class Difference:
    """The first differing observation of a failing graded test (branch i61's verdict, computed outside
    the learner's code): `piece` ("quant.f32_to_f16", "kv.KvPool.alloc"), the `args` it was called
    with, what the `learner`'s code and the `reference` returned, and `raised`: None, or (type, message,
    file, line) when the learner's code raised. `encoded`: learner and reference are observations
    already (`tries.encode`), as the proxy's log and the reference child give them."""

    test: str
    piece: str
    args: tuple
    learner: object
    reference: object
    raised: tuple | None = None
    encoded: bool = False
    kwargs: dict | None = None


def _section(module: str, section: str | None = None) -> str:
    if not section:
        return f"reread {SECTIONS[module]}"
    spec = "; ".join(part for part in SECTIONS[module].split("; ")[1:])
    return f"reread section {section} of the chapter and section 4 ({module}.py)" + (f"; {spec}" if spec else "")


def pitfall_line(pid: str) -> str:
    from tl_lab.lab.pitfalls import get

    p = get(pid)
    return (f"this is pitfall {pid} (chapter section 5): {p.mistake[0].lower() + p.mistake[1:]}; its symptom: "
            f"{p.symptom}. Your output equals the reference's with {pid}'s edit, on every case")


def raised_line(piece: str, type_: str, message: str, file: str, line: int) -> str:
    where = f"{file}:{line}" if file else "your code"
    return f"{piece} raised {type_} at {where}: {message}"


def _matching(yours: list, pitfall_sides: dict[str, dict], reference: list, closes: list[float]) -> list[str]:
    """The pitfalls whose observations equal the learner's on every case (and differ from the reference's on one)."""
    from tl_lab.lab.exercise.tries import same

    out = []
    for pid, side in pitfall_sides.items():
        if side.get("import_error") or len(side["cases"]) != len(yours):
            continue
        theirs = side["cases"]
        if all(same(r, t, c) for r, t, c in zip(reference, theirs, closes)):
            continue  # these cases do not show this pitfall at all
        if all(y is not None and same(y, t, c) for y, t, c in zip(yours, theirs, closes)):
            out.append(pid)
    return out


def diagnose_try(result, piece, pitfall_sides: dict[str, dict]) -> list[str]:
    """Lines for a TryResult that does not pass: the learner's error, else the one pitfall whose output
    theirs is, else the first difference with its input and the section to reread."""
    name = f"{piece.module}.{piece.qualname}"
    bad = [c for c in result.cases if not c.ok]
    if not bad:
        return []
    for c in bad:  # an error in the learner's code: where, and what; no pitfall
        if c.yours is not None and c.yours[0] == "raised" and c.yours[3] == result.file:
            return [raised_line(name, c.yours[1], c.yours[2], c.yours[3], c.yours[4]),
                    f"the input: {c.label}", _section(piece.module, piece.section)]
    yours = [c.yours for c in result.cases]
    reference = [c.reference for c in result.cases]
    closes = [c.close for c in result.cases]
    fits = _matching(yours, pitfall_sides, reference, closes)
    if len(fits) == 1:
        return [pitfall_line(fits[0]), _section(piece.module, piece.section)]
    c = bad[0]
    return [f"{name} differs from the reference (no pitfall of the chapter gives your output): {c.difference()}",
            f"the input: {c.label}", _section(piece.module, piece.section)]


def explain(diff: Difference, workspace=None) -> list[str]:
    """A failing graded test's first differing observation in words (see the module's docstring).

    An error raised in the learner's code: where and what, never a pitfall. A plain function's case is
    run again on the reference with each pitfall of that piece switched in (`args` as given); a method
    (or, with `workspace`, any piece) is tried on its scripted cases (`exercise try`) and diagnosed there."""
    from tl_lab.lab.exercise.tries import encode, first_difference, piece_of

    piece = piece_of(diff.piece)
    name = f"{piece.module}.{piece.qualname}"
    if diff.raised is not None:
        type_, message, file, line = (list(diff.raised) + ["", "", "", 0])[:4]
        return [raised_line(name, type_, message, file, line), f"the input: {_args(diff.args, diff.kwargs)}",
                _section(piece.module, piece.section)]
    mine, ref = (diff.learner, diff.reference) if diff.encoded else (encode(diff.learner), encode(diff.reference))
    differs = first_difference(mine, ref)
    lines = []
    if "." not in piece.qualname:
        fits = _pitfalls_on_args(piece, diff.args, mine, diff.kwargs or {})
        if len(fits) == 1:
            return [pitfall_line(fits[0]), f"the input: {_args(diff.args, diff.kwargs)}", _section(piece.module, piece.section)]
    elif workspace is not None:
        tried = try_piece(name, workspace)
        if tried.diagnosis and tried.diagnosis[0].startswith("this is pitfall"):
            return tried.diagnosis
    lines.append(f"{name} differs from the reference (no pitfall of the chapter gives your output): {differs}")
    lines.append(f"the input: {_args(diff.args, diff.kwargs)}")
    lines.append(_section(piece.module, piece.section))
    return lines


def _args(args, kwargs=None) -> str:
    from tl_lab.lab.exercise.tries import encode, show

    try:
        return "(" + ", ".join([*(show(encode(a), 30) for a in args),
                                *(f"{k}={show(encode(v), 30)}" for k, v in (kwargs or {}).items())]) + ")"
    except TypeError:
        return repr(args)[:200]


def _pitfalls_on_args(piece, args, mine, kwargs=None) -> list[str]:
    """Run `piece(*args)` on the reference with each candidate pitfall's edit, in one child -> the ids
    whose output equals `mine` (and not the reference's)."""
    import pickle
    import subprocess
    import sys
    import tempfile

    from tl_lab.lab.exercise.tries import _env, same
    from tl_lab.ops.paths import REPO_ROOT

    pids = module_candidates(piece.module)  # the called piece may call the one the pitfall edits (a helper)
    if not pids:
        return []
    with tempfile.NamedTemporaryFile(suffix=".pkl", delete=False) as f:
        pickle.dump((piece.module, piece.qualname, tuple(args), pids, dict(kwargs or {})), f)
    code = ("import sys, json, pickle; from tl_lab.lab.exercise.diagnose import _call_child; "
            f"print('@@' + json.dumps(_call_child({f.name!r})))")
    try:
        done = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=_env(), capture_output=True, text=True,
                              timeout=60, start_new_session=True)
    except subprocess.TimeoutExpired:
        return []
    finally:
        Path(f.name).unlink(missing_ok=True)
    if "@@" not in done.stdout:
        return []
    import json

    got = json.loads(done.stdout.rsplit("@@", 1)[1])
    return [pid for pid in pids if not same(got["reference"], got[pid]) and same(mine, got[pid])]


def module_candidates(module: str) -> list[str]:
    """The chapter's pitfalls with an edit in `module` (any of its functions): a check's logged call
    (`sample_trace`) runs the helper a pitfall edits (`_penalise`)."""
    from tl_lab.lab.pitfalls import PITFALLS

    return [p.id for p in PITFALLS.values() if any(e.module == f"tl_lab.{module}" for e in p.edits)]


def _call_child(path: str) -> dict:
    """In a child: the piece called on the args with the reference and with each pitfall's edit."""
    import pickle

    from tl_lab.lab.exercise.stubs import reference_source
    from tl_lab.lab.exercise.tries import _fresh, encode, getattr_path, raised
    from tl_lab.lab.pitfalls import apply_edit, get

    module, qualname, args, pids, kwargs = pickle.loads(Path(path).read_bytes())
    out = {}
    for label in ["reference", *pids]:
        source = reference_source(module)
        if label != "reference":
            for e in get(label).edits:
                if e.module == f"tl_lab.{module}":
                    source = apply_edit(source, e, label)
        m = _fresh(module, compile(source, f"<{module} {label}>", "exec"), f"<{module} {label}>")
        try:
            out[label] = encode(getattr_path(m, qualname)(*args, **kwargs))
        except Exception as exc:  # noqa: BLE001
            out[label] = raised(exc)
    return out


def _reference_child(path: str) -> list:
    """In a child that imports the reference (TL_LAB_WORKSPACE off): each logged call made again -> its observation."""
    import base64
    import importlib
    import pickle

    from tl_lab.lab.exercise.tries import encode, getattr_path, raised

    out = []
    for piece, args in pickle.loads(Path(path).read_bytes()):
        module, qual = piece.split(".", 1)
        try:
            a, kw = pickle.loads(base64.b64decode(args))
            out.append(encode(getattr_path(importlib.import_module(f"tl_lab.{module}"), qual)(*a, **kw)))
        except Exception as exc:  # noqa: BLE001: the error is the observation
            out.append(raised(exc))
    return out


def reference_answers(calls: list[dict], seconds: float = 60.0) -> list | None:
    """The reference's answers to the logged `calls` (a child of the grader's side, not sandboxed: it runs
    the tests' arguments on the reference) -> observations, or None when the child gave no verdict."""
    import json
    import pickle
    import subprocess
    import sys
    import tempfile

    from tl_lab.lab.exercise.tries import _env
    from tl_lab.ops.paths import REPO_ROOT

    with tempfile.NamedTemporaryFile(suffix=".pkl", delete=False) as f:
        pickle.dump([(c["piece"], c["args"]) for c in calls], f)
    code = ("import json; from tl_lab.lab.exercise.diagnose import _reference_child; "
            f"print('@@' + json.dumps(_reference_child({f.name!r})))")
    try:
        done = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=_env(), capture_output=True, text=True,
                              timeout=seconds, start_new_session=True)
    except subprocess.TimeoutExpired:
        return None
    finally:
        Path(f.name).unlink(missing_ok=True)
    if "@@" not in done.stdout:
        return None
    return json.loads(done.stdout.rsplit("@@", 1)[1])


def first_differing(test: str, calls: list[dict], answers: list) -> Difference | None:
    """The first logged call whose learner's answer is not the reference's (two errors of one type agree:
    the sentence may be the learner's) -> its Difference, or None."""
    import base64
    import pickle

    from tl_lab.lab.exercise.tries import piece_of, same

    for c, ref in zip(calls, answers):
        try:
            piece_of(c["piece"])
        except Exception:  # noqa: BLE001: not one of the chapter's pieces (a helper): not diagnosed
            continue
        mine = c["learner"]
        if same(mine, ref):
            continue
        args, kw = pickle.loads(base64.b64decode(c["args"]))
        learner_raised = mine[0] == "raised" and bool(mine[3])  # raised in the learner's file
        return Difference(test, c["piece"], tuple(args), mine, ref,
                          raised=tuple(mine[1:5]) if learner_raised else None, encoded=True, kwargs=dict(kw))
    return None


def from_calls(module: str, test: str, calls: list[dict], workspace=None) -> list[str]:
    """`exercise check`'s failure of `test` by symptom, from the calls the proxy logged: the first whose
    answer differs from the reference's, explained (`explain`); [] when every logged call agrees."""
    if not calls:
        return []
    answers = reference_answers(calls)
    if answers is None:
        return []
    diff = first_differing(test, calls, answers)
    return explain(diff, workspace) if diff is not None else []


def for_module(module: str, workspace, seconds: float = 60.0) -> list[str]:
    """`exercise check`'s failure of `module`, by symptom: every piece the learner wrote is tried alone
    against the reference (one child for the learner's pieces, one for the reference's and the pitfalls'
    of each), and the first piece, in the chapter's order, whose output differs is diagnosed. [] when
    every written piece agrees on its cases (the graded test saw what these cases do not)."""
    from tl_lab.lab.exercise.stubs import written
    from tl_lab.lab.exercise.tries import CaseResult, TryResult, candidates, cases_for, run_sides

    ws = Path(workspace)
    done = [q for q, ok in written(ws, module).items() if ok]
    if not done:
        return []
    pids = {q: candidates(module, q) for q in done}
    sides, err = run_sides(module, done, str(ws / f"{module}.py"), pids, seconds)
    if err:
        return [f"trying each piece of your {module}.py alone: {err}"]
    for q in done:
        mine, ref = sides[f"yours:{q}"], sides[f"reference:{q}"]
        if mine["import_error"]:
            e = mine["import_error"]
            return [f"your {module}.py does not import: {e[3]}:{e[4]}: {e[1]}: {e[2]}"]
        cases = cases_for(module, q)
        res = TryResult(f"{module}.{q}", str(ws / f"{module}.py"),
                        [CaseResult(c.label, y, r, c.close, c.given) for c, y, r in zip(cases, mine["cases"], ref["cases"])])
        if not res.passed and not res.not_written:
            piece = next(p for p in PIECES[module] if p.qualname == q)
            from tl_lab.lab.exercise.workspace import command

            return diagnose_try(res, piece, {p: sides[f"{p}:{q}"] for p in pids[q]}) + [
                f"see every case: {command('try', f'{module}.{q}', workspace=ws)}"]
    return []


def try_piece(name: str, workspace=None, seconds: float | None = None, diagnose: bool = True):
    """`exercise try PIECE`: the piece against the reference on its cases (`tries.try_piece`), and when
    a case differs, the diagnosis by symptom (`diagnose_try`)."""
    from tl_lab.lab.exercise import tries

    return tries.try_piece(name, workspace, tries.CHILD_SECONDS if seconds is None else seconds,
                           explain=diagnose_try if diagnose else None)

