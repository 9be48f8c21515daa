"""tl_lab/exercise, the graded runs that keep the grader honest: every piece a learner writes is graded
(blanked alone, a graded test fails), and every pitfall's edit in a workspace copy fails its test (the
learner's file is what ran). One pytest run per piece or pitfall (the `exercise_slow` tests): a file of
their own, so that the test command's workers share them out with tests/test_exercises.py.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import outcomes, workspace
from tl_lab.lab.exercise import registry
from tl_lab.lab.exercise.grading import STATUS_DIR, _run, pitfall_hint
from tl_lab.lab.exercise.registry import MODULES, PIECES, graded
from tl_lab.lab.exercise.stubs import blank, reference_source
from tl_lab.lab.pitfalls import PITFALLS, apply_edit


def _learner_pitfalls():
    """Pitfalls whose every edit lies in a learner module (s14 edits the kernels; s17 is the runner's own)."""
    return [p for p in PITFALLS.values() if all(e.module.split(".")[1] in MODULES for e in p.edits)]


def _graded(ws, m, kwargs):
    """The graded tests of module m run on workspace ws (`_run` with `kwargs`) -> the run's data."""
    return _run(ws, m, [m], timeout=300, **kwargs)[0]


def _two_at_a_time(runs):
    """`_graded` on prepared `(workspace, module, kwargs)` runs, two pytest subprocesses at a time;
    returns each run's data. Every workspace is written beforehand in the calling thread: CPython
    3.11's ast is not safe from two threads at once ("SystemError: AST constructor recursion depth
    mismatch"), and writing a workspace parses the reference."""
    with ThreadPoolExecutor(2) as pool:
        return list(pool.map(lambda r: _graded(*r), runs))


def _pitfall_workspace(tmp_path, p):
    """A workspace of reference copies whose module of pitfall `p` has the pitfall written in."""
    m = p.module.split(".")[1]
    ws = workspace(tmp_path / p.id, "ref", [m])
    src = reference_source(m)
    for e in p.edits:
        src = apply_edit(src, e, p.id)
    (ws / f"{m}.py").write_text(src)
    return ws, m, {"tests": [p.test]}


@pytest.mark.parametrize("pid", ["s04", "s08", "s18"])
def test_a_pitfall_in_the_workspace_copy_fails_its_test(tmp_path, pid):
    p = PITFALLS[pid]
    ws, m, run = _pitfall_workspace(tmp_path, p)
    data = _graded(ws, m, run)
    assert outcomes(data) and all(v == "failed" for v in outcomes(data).values()), data
    assert data["origins"][m]["loaded"].startswith(str(tmp_path))
    failing = data["results"][0]
    # by symptom: the learner's file tried piece by piece; the pitfall named alone, only from the workspace
    hint = pitfall_hint(m, failing["nodeid"], failing["message"], workspace=ws)
    assert f"this is pitfall {pid}" in hint and hint.count("this is pitfall") == 1, hint
    assert "this is pitfall" not in pitfall_hint(m, failing["nodeid"], failing["message"])  # no name from a test's name


@pytest.mark.exercise_slow
def test_every_learner_pitfall_in_the_workspace_copy_fails_its_test(tmp_path):
    ps = _learner_pitfalls()
    assert len(ps) == 21
    runs = _two_at_a_time([_pitfall_workspace(tmp_path, p) for p in ps])
    missed = [p.id for p, data in zip(ps, runs) if not outcomes(data) or "failed" not in outcomes(data).values()]
    assert not missed


def _blanked_workspace(tmp_path, m, qualname):
    """A workspace whose `m`.py is the reference with only `qualname`'s body blanked."""
    ws = tmp_path / f"{m}-{qualname}"
    ws.mkdir()
    (ws / f"{m}.py").write_text(blank(reference_source(m), m, {qualname}))
    return ws, m, {"first_failure": True}


@pytest.mark.exercise_slow
@pytest.mark.parametrize("module", MODULES)
def test_every_piece_blanked_alone_fails_a_graded_test(tmp_path, module, record_property):
    """Every piece a learner writes is graded: the reference with only that body blanked fails at
    least one of the module's graded tests (two pytest runs at a time, each stopping at its first
    failure)."""
    t0 = time.perf_counter()
    names = [p.qualname for p in PIECES[module]]
    runs = _two_at_a_time([_blanked_workspace(tmp_path, module, q) for q in names])
    record_property("seconds", round(time.perf_counter() - t0, 1))
    ungraded = [q for q, data in zip(names, runs) if data is None or "failed" not in outcomes(data).values()]
    assert not ungraded, f"{module}: blanked alone, these fail no graded test: {ungraded}"


def test_every_graded_test_fails_on_the_stubs(tmp_path):
    """No graded test passes on unwritten code: each module's stub (the others the reference); two
    pytest runs at a time, each module's log its own."""
    ws = workspace(tmp_path)
    for m, data in zip(MODULES, _two_at_a_time([(ws, m, {}) for m in MODULES])):
        got = outcomes(data)
        log = ws / STATUS_DIR / f"check-{m}.log"
        assert {registry.match(n).name for n in got} == {g.name for g in graded(m)}, (m, log.read_text()[-2000:])
        assert all(v != "passed" for v in got.values()), (m, [n for n, v in got.items() if v == "passed"])
