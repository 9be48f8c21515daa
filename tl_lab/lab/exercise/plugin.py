"""The pytest plugin of `exercise check`: only the graded tests of one module, a time limit per
test, the origins verified, one JSON report.

The time limit's rule: the first test of the module that runs past it ends the module's check. The
tests before it keep their verdicts, the ones after it are "not run" (each saying which test ran past
the limit), so a module whose code never returns costs one limit, not one per test (six of sample's
at 120 s were twelve minutes), and a correct module, however slow, passes as long as each test does.
A test past the limit fails even when its code caught the time-out (TestTimeout) and then passed.

Loaded with `-p tl_lab.lab.exercise.plugin` by `tl_lab.lab.exercise.grading` in a pytest subprocess whose
environment names the workspace (TL_LAB_WORKSPACE), the learner's modules (TL_LAB_EXERCISE_USE),
the module graded (TL_LAB_EXERCISE_GRADE), the limit (TL_LAB_EXERCISE_TIMEOUT seconds) and the
report's path (TL_LAB_EXERCISE_REPORT). A module meant to be the learner's that was loaded from
anywhere else stops the run with exit code 3: the reference is never graded in the learner's place.
"""

from __future__ import annotations

import faulthandler
import json
import os
import sys

import pytest

from tl_lab.lab.exercise.alarm import time_limit
from tl_lab.lab.exercise.registry import match

GRADE = os.environ.get("TL_LAB_EXERCISE_GRADE", "")
TIMEOUT = float(os.environ.get("TL_LAB_EXERCISE_TIMEOUT", "0") or 0)
REPORT = os.environ.get("TL_LAB_EXERCISE_REPORT", "")
REMOTE = os.environ.get("TL_LAB_EXERCISE_REMOTE", "")  # the learner's workspace: its modules run in a sandboxed child
MESSAGE_CHARS = 2000  # of each failure in the report; the log file keeps all of it
COLLECT_FLOOR = 30.0  # seconds at least for the collection: importing the test files takes a few on a busy machine

_results: list[dict] = []
_errors: list[dict] = []
_past_limit = ""  # the nodeid of the first test that ran past the limit: the module's later tests are not run
_not_run: dict[str, str] = {}  # nodeid -> why it was not run
_rang = False  # the alarm went off in what `_limited` ran last (even if the learner's code caught its exception)


_conn = None
if REMOTE:  # before any test file imports tl_lab.<m>: each learner module is a RemoteModule of the child's
    from tl_lab.lab.exercise.remote import Connection, RemoteFinder

    _conn = Connection(REMOTE, [m for m in os.environ.get("TL_LAB_EXERCISE_USE", "").split(",") if m], GRADE, TIMEOUT or 120)
    sys.meta_path.insert(0, RemoteFinder(_conn))


class TestTimeout(Exception):
    """A graded test ran past the per-test limit (an infinite loop in the learner's code?)."""


def pytest_collection_modifyitems(session, config, items):
    """Keep the tests grading GRADE; the others are lab tests, not run here."""
    if not GRADE:
        return
    keep = [it for it in items if (g := match(it.nodeid)) is not None and g.module == GRADE]
    drop = [it for it in items if it not in keep]
    if drop:
        config.hook.pytest_deselected(items=drop)
    items[:] = keep


def pytest_collection_finish(session):
    """Every module meant to be the learner's is the learner's file (imported now, if not yet)."""
    from tl_lab.lab.exercise.workspace import active

    if getattr(session, "testsfailed", 0):  # a test file did not import: that error is the verdict, nothing runs
        return
    if _conn is not None:
        from tl_lab.lab.exercise.remote import RemoteModule

        for m in _conn.use:
            __import__(f"tl_lab.{m}")
            mod = sys.modules[f"tl_lab.{m}"]
            want = os.path.join(REMOTE, f"{m}.py")
            if not isinstance(mod, RemoteModule) or _conn.files.get(m) != want:
                _fail_origin(f"tl_lab.{m} was loaded from {_conn.files.get(m) or getattr(mod, '__file__', None)}, "
                             f"not the learner's {want}")
        return
    finder = active()
    if finder is None:
        if GRADE:
            _fail_origin(f"no workspace is active: tl_lab.{GRADE} would be the reference's")
        return
    for m, o in finder.origins.items():
        if o.origin != "learner":
            continue
        __import__(f"tl_lab.{m}")
        got = getattr(sys.modules[f"tl_lab.{m}"], "__file__", None)
        if got != o.file:
            _fail_origin(f"tl_lab.{m} was loaded from {got}, not the learner's {o.file}")


def _fail_origin(text: str) -> None:
    _errors.append({"kind": "origin", "message": text})
    _write()
    pytest.exit(f"exercise: {text}", returncode=3)


_doing: tuple[str, float | None] = ("the test", None)  # what runs under the limit, and the limit (None: TIMEOUT)


def _on_alarm(signum, frame):
    global _rang
    _rang = True
    doing, seconds = _doing
    raise TestTimeout(f"{doing} ran longer than {seconds or TIMEOUT:g} s (an infinite loop?)")


@pytest.hookimpl(hookwrapper=True)
def pytest_collection(session):
    """A limit on the collection too (the test's, at least COLLECT_FLOOR), which imports the learner's modules:
    a loop at a module's top level is a collection error ("does not import"), not a run stopped at its budget."""
    yield from _limited("importing the modules", max(TIMEOUT, COLLECT_FLOOR))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    """The per-test limit (`_limited`); the first test past it is kept for `pytest_runtest_setup`."""
    global _past_limit
    yield from _limited("the test", TIMEOUT)
    if _rang and not _past_limit:
        _past_limit = item.nodeid


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """After a test past the limit, the module's others are not run (the rule in the module's docstring):
    code that never returned once will most likely not return for the next test either. Else the log of
    the test's calls of the learner's functions starts (the failure report's first difference)."""
    if _conn is not None:
        _conn.record(True)
    if _past_limit:
        why = f"not run: {_past_limit.split('::')[-1]} of this module ran past the {TIMEOUT:g} s limit"
        _not_run[item.nodeid] = why
        pytest.skip(why)


def _limited(doing: str, seconds: float):
    """SIGALRM raises in the running Python code after `seconds` (none when TIMEOUT is 0); when the code
    does not return to Python (a loop inside numpy), faulthandler ends the process a little later, with its stack."""
    global _doing, _rang
    if TIMEOUT <= 0:
        yield
        return
    _doing, _rang = (doing, seconds), False
    faulthandler.dump_traceback_later(seconds + 30, exit=True)
    try:
        with time_limit(seconds, _on_alarm):
            yield
    finally:
        faulthandler.cancel_dump_traceback_later()
        _doing = ("the test", None)


def pytest_runtest_logreport(report):
    if report.when == "call" or not report.passed:  # a failed setup counts too
        g = match(report.nodeid)
        _results.append({
            "nodeid": report.nodeid,
            "chapter_test": g.name if g else None,
            "when": report.when,
            "outcome": "not run" if report.nodeid in _not_run else report.outcome,
            "message": _not_run.get(report.nodeid) or _message(report),
            **({"at": report.learner_at} if getattr(report, "learner_at", "") else {}),  # raised in the learner's code
            "seconds": round(report.duration, 3),
        })


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failure raised inside the learner's code: where, for the row (the message alone does not say).
    A test the alarm rang in that passed all the same (its code caught the TestTimeout) fails: it ran past
    the limit, and the module's later tests are not run because of it, so it cannot be the module's pass."""
    outcome = yield
    report = outcome.get_result()
    if _conn is not None and call.when == "call":
        calls = _conn.record(False)
        if call.excinfo is not None and not _calls_kept:
            _calls_kept[item.nodeid] = _kept(calls)
    if call.excinfo is not None:
        report.learner_at = getattr(call.excinfo.value, "learner_at", "") or _learner_at(call.excinfo.tb)
    if call.when == "call" and _rang and report.passed:
        report.outcome = "failed"
        report.longrepr = caught_message(TIMEOUT)


_calls_kept: dict[str, list] = {}  # the first failing test's calls of the learner's functions
CALLS_BYTES = 32 << 20  # of them in the report


def _kept(calls: list[dict]) -> list[dict]:
    """The calls as JSON (arguments pickled, base64), at most CALLS_BYTES of them."""
    import base64

    out, total = [], 0
    for c in calls:
        a = base64.b64encode(c["args"]).decode()
        total += len(a)
        if total > CALLS_BYTES:
            break
        out.append({"piece": c["piece"], "args": a, "learner": c["learner"]})
    return out


def caught_message(seconds: float) -> str:
    """The failure of a test that ran past the limit of `seconds` and passed anyway."""
    return f"TestTimeout: the test ran past the {seconds:g} s limit (its code caught the time-out, then it passed)"


def _learner_at(tb) -> str:
    """"file:line in function" of the innermost frame of `tb` in one of the learner's files, else ""."""
    from tl_lab.lab.exercise.workspace import active

    finder = active()
    files = {o.file for o in finder.origins.values() if o.origin == "learner"} if finder else set()
    at = ""
    while tb is not None:
        code = tb.tb_frame.f_code
        if code.co_filename in files:
            at = f"{code.co_filename}:{tb.tb_lineno} in {code.co_qualname}"
        tb = tb.tb_next
    return at


def pytest_collectreport(report):
    if report.failed:
        _errors.append({"kind": "collect", "nodeid": report.nodeid, "message": str(report.longrepr)[-MESSAGE_CHARS:]})


def _message(report) -> str:
    if report.passed:
        return ""
    crash = getattr(report.longrepr, "reprcrash", None)
    text = crash.message if crash is not None else str(report.longrepr)
    return text[:MESSAGE_CHARS]


def _write() -> None:
    if not REPORT:
        return
    from tl_lab.lab.exercise.workspace import origins

    if _conn is not None:
        found = {m: {"origin": "learner", "file": os.path.join(REMOTE, f"{m}.py"), "loaded": _conn.files.get(m)}
                 for m in _conn.use}
        found.update({m: v for m, v in origins().items() if m not in found})
        extra = {"sandboxed": bool(_conn.sandboxed)}
    else:
        found, extra = origins(), {}
    with open(REPORT, "w", encoding="utf-8") as f:
        json.dump({"grade": GRADE, "results": _results, "errors": _errors, "origins": found, "calls": _calls_kept,
                   **extra}, f, indent=1)


def pytest_sessionfinish(session, exitstatus):
    _write()
    if _conn is not None:
        _conn.close()
