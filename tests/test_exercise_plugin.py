"""tl_lab/lab/exercise/plugin.py's hooks in this process (the graded pytest runs that load it are
test_exercises.py's): the tests kept, the origins held, each record, the per-test limit.
"""

import sys

import pytest

from tl_lab.lab.exercise.grading import pitfall_hint
from tl_lab.lab.exercise.registry import MODULES, graded


@pytest.fixture
def plugin(monkeypatch):
    """tl_lab.lab.exercise.plugin with its environment's values and its collected results its own."""
    from tl_lab.lab.exercise import plugin as p

    monkeypatch.setattr(p, "_results", [])
    monkeypatch.setattr(p, "_errors", [])
    monkeypatch.setattr(p, "_past_limit", "")
    monkeypatch.setattr(p, "_not_run", {})
    monkeypatch.setattr(p, "_rang", False)
    monkeypatch.setattr(p, "GRADE", "kv")
    monkeypatch.setattr(p, "REPORT", "")
    return p


def _item(nodeid):
    import types

    return types.SimpleNamespace(nodeid=nodeid)


def test_in_process_plugin_keeps_only_the_graded_modules_tests(plugin, monkeypatch):
    import types

    kv = [f"tests/test_kv.py::test_{g.name}" for g in graded("kv")]
    other = ["tests/test_kv.py::test_a_lab_test", f"tests/test_sample.py::test_{graded('sample')[0].name}"]
    items, dropped = [_item(n) for n in [other[0], *kv, other[1]]], []
    config = types.SimpleNamespace(hook=types.SimpleNamespace(pytest_deselected=lambda items: dropped.extend(items)))
    plugin.pytest_collection_modifyitems(None, config, items)
    assert [it.nodeid for it in items] == kv and [it.nodeid for it in dropped] == other
    items = [_item(n) for n in kv]
    plugin.pytest_collection_modifyitems(None, config, items)  # nothing to drop: no deselection
    assert len(items) == len(kv) and len(dropped) == 2
    monkeypatch.setattr(plugin, "GRADE", "")
    items = [_item(n) for n in other]
    plugin.pytest_collection_modifyitems(None, config, items)  # no module graded: the lab's own run
    assert [it.nodeid for it in items] == other


def test_in_process_plugin_stops_a_run_without_the_learners_code(plugin, tmp_path, monkeypatch):
    import json

    import tl_lab.kv  # the reference, imported before any finder below could serve another
    from tl_lab.lab.exercise import workspace as wsm

    report = tmp_path / "report.json"
    monkeypatch.setattr(plugin, "REPORT", str(report))
    monkeypatch.setattr(sys, "meta_path", [f for f in sys.meta_path if not isinstance(f, wsm.WorkspaceFinder)])
    with pytest.raises(pytest.exit.Exception) as stop:
        plugin.pytest_collection_finish(None)
    assert stop.value.returncode == 3 and str(stop.value.msg) == (
        "exercise: no workspace is active: tl_lab.kv would be the reference's")
    written = json.loads(report.read_text())
    assert written["grade"] == "kv" and written["errors"] == [
        {"kind": "origin", "message": "no workspace is active: tl_lab.kv would be the reference's"}]
    assert set(written["origins"]) == set(MODULES) and written["results"] == []
    monkeypatch.setattr(plugin, "GRADE", "")
    plugin.pytest_collection_finish(None)  # the lab's own run: nothing to hold to
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "kv.py").write_text("# mine\n", encoding="utf-8")
    origins = {"kv": wsm.Origin("kv", "learner", str(ws / "kv.py"), "the learner's file")}
    monkeypatch.setattr(sys, "meta_path", [wsm.WorkspaceFinder(ws, origins), *sys.meta_path])
    with pytest.raises(pytest.exit.Exception, match=f"tl_lab.kv was loaded from {tl_lab.kv.__file__}, not the "
                                                    f"learner's {ws / 'kv.py'}"):
        plugin.pytest_collection_finish(None)
    origins["kv"] = wsm.Origin("kv", "learner", tl_lab.kv.__file__, "as if it were")
    origins["quant"] = wsm.Origin("quant", "reference", "elsewhere", "not the learner's")
    plugin.pytest_collection_finish(None)  # the learner's module is where it was meant to be: no stop


def test_in_process_plugin_reports_each_test_and_each_collection_error(plugin):
    import types

    name = graded("kv")[0].name

    def report(nodeid, when, outcome, longrepr=None, duration=0.12345):
        return types.SimpleNamespace(nodeid=nodeid, when=when, outcome=outcome, passed=outcome == "passed",
                                     failed=outcome == "failed", longrepr=longrepr, duration=duration)

    crash = types.SimpleNamespace(reprcrash=types.SimpleNamespace(message="AssertionError: 1 != 2"))
    plugin.pytest_runtest_logreport(report(f"tests/test_kv.py::test_{name}", "setup", "passed"))  # not kept
    plugin.pytest_runtest_logreport(report(f"tests/test_kv.py::test_{name}[3]", "call", "passed"))
    plugin.pytest_runtest_logreport(report(f"tests/test_kv.py::test_{name}[4]", "call", "failed", crash))
    plugin.pytest_runtest_logreport(report("tests/test_kv.py::test_lab", "setup", "failed", "x" * 3000))
    assert plugin._results == [
        {"nodeid": f"tests/test_kv.py::test_{name}[3]", "chapter_test": name, "when": "call", "outcome": "passed",
         "message": "", "seconds": 0.123},
        {"nodeid": f"tests/test_kv.py::test_{name}[4]", "chapter_test": name, "when": "call", "outcome": "failed",
         "message": "AssertionError: 1 != 2", "seconds": 0.123},
        {"nodeid": "tests/test_kv.py::test_lab", "chapter_test": None, "when": "setup", "outcome": "failed",
         "message": "x" * plugin.MESSAGE_CHARS, "seconds": 0.123}]
    plugin.pytest_collectreport(report("tests/test_kv.py", "collect", "passed"))
    plugin.pytest_collectreport(report("tests/test_kv.py", "collect", "failed", "a" * 10 + "b" * plugin.MESSAGE_CHARS))
    assert plugin._errors == [{"kind": "collect", "nodeid": "tests/test_kv.py", "message": "b" * plugin.MESSAGE_CHARS}]
    plugin._write()  # no report asked for: nothing written, nothing raised


def test_in_process_plugin_limits_each_test(plugin, monkeypatch):
    import signal

    with pytest.raises(plugin.TestTimeout, match=r"^the test ran longer than 2\.5 s \(an infinite loop\?\)$"):
        monkeypatch.setattr(plugin, "TIMEOUT", 2.5)
        plugin._on_alarm(signal.SIGALRM, None)
    before = signal.getsignal(signal.SIGALRM)
    wrapper = plugin.pytest_runtest_call(None)
    next(wrapper)  # the test runs here
    assert signal.getsignal(signal.SIGALRM) == plugin._on_alarm and 2.0 < signal.getitimer(signal.ITIMER_REAL)[0] <= 2.5
    with pytest.raises(StopIteration):
        next(wrapper)
    assert signal.getsignal(signal.SIGALRM) == before and signal.getitimer(signal.ITIMER_REAL)[0] == 0
    monkeypatch.setattr(plugin, "TIMEOUT", 0)
    wrapper = plugin.pytest_runtest_call(None)
    next(wrapper)
    assert signal.getsignal(signal.SIGALRM) == before and signal.getitimer(signal.ITIMER_REAL)[0] == 0  # no limit
    with pytest.raises(StopIteration):
        next(wrapper)


def test_in_process_plugin_runs_none_of_a_modules_tests_after_one_past_the_limit(plugin, monkeypatch):
    """The first test the alarm stops ends the module's check: each later test is "not run", naming it;
    a test before it that returned with no alarm stops nothing; a later alarm does not change the test named."""
    import signal
    import types

    monkeypatch.setattr(plugin, "TIMEOUT", 2.5)
    quick, looping, later = (_item(f"tests/test_kv.py::test_{g.name}") for g in graded("kv")[:3])

    def run(item, alarm):
        wrapper = plugin.pytest_runtest_call(item)
        next(wrapper)  # the test runs here
        if alarm:
            with pytest.raises(plugin.TestTimeout):
                plugin._on_alarm(signal.SIGALRM, None)
        with pytest.raises(StopIteration):
            wrapper.send(None)

    plugin.pytest_runtest_setup(quick)
    run(quick, alarm=False)
    plugin.pytest_runtest_setup(looping)  # the test before returned in time: this one runs
    run(looping, alarm=True)
    why = f"not run: {looping.nodeid.split('::')[-1]} of this module ran past the 2.5 s limit"
    with pytest.raises(pytest.skip.Exception, match=f"^{why}$"):
        plugin.pytest_runtest_setup(later)
    skipped = types.SimpleNamespace(nodeid=later.nodeid, when="setup", outcome="skipped", passed=False,
                                    longrepr=("tests/test_kv.py", 1, f"Skipped: {why}"), duration=0.0)
    plugin.pytest_runtest_logreport(skipped)
    assert plugin._results == [{"nodeid": later.nodeid, "chapter_test": graded("kv")[2].name, "when": "setup",
                                "outcome": "not run", "message": why, "seconds": 0.0}]
    run(later, alarm=True)  # were it run: the first test past the limit is still the one named
    assert plugin._past_limit == looping.nodeid


def test_in_process_plugin_fails_a_test_that_caught_the_time_out_and_passed(plugin, monkeypatch):
    """The alarm rang in a test whose code (the learner's) caught its TestTimeout and went on to pass: the
    test fails, saying it ran past the limit (it is the one the module's later tests are "not run" for);
    its teardown's report, and a test the alarm never rang in, are left as they are."""
    import signal
    import types

    monkeypatch.setattr(plugin, "TIMEOUT", 2.5)
    names = [g.name for g in graded("kv")[:2]]
    caught, quick = (_item(f"tests/test_kv.py::test_{n}") for n in names)

    def run(item, alarm):
        wrapper = plugin.pytest_runtest_call(item)
        next(wrapper)  # the test runs here
        if alarm:
            try:
                plugin._on_alarm(signal.SIGALRM, None)
            except Exception:  # the learner's `except Exception`
                pass
        with pytest.raises(StopIteration):
            wrapper.send(None)

    def report(item, when, outcome="passed"):
        rep = pytest.TestReport(item.nodeid, ("tests/test_kv.py", 0, item.nodeid), {}, outcome, None, when, duration=0.5)
        wrapper = plugin.pytest_runtest_makereport(item, types.SimpleNamespace(when=when, excinfo=None))
        next(wrapper)
        with pytest.raises(StopIteration):
            wrapper.send(types.SimpleNamespace(get_result=lambda: rep))
        plugin.pytest_runtest_logreport(rep)
        return rep

    run(quick, alarm=False)
    assert report(quick, "call").passed
    run(caught, alarm=True)
    got = report(caught, "call")
    message = "TestTimeout: the test ran past the 2.5 s limit (its code caught the time-out, then it passed)"
    assert (got.outcome, got.longrepr) == ("failed", message) and plugin.caught_message(2.5) == message
    assert report(caught, "teardown").passed  # the limit is the call's
    assert plugin._results == [
        {"nodeid": quick.nodeid, "chapter_test": names[1], "when": "call", "outcome": "passed", "message": "",
         "seconds": 0.5},
        {"nodeid": caught.nodeid, "chapter_test": names[0], "when": "call", "outcome": "failed", "message": message,
         "seconds": 0.5}]
    assert plugin._past_limit == caught.nodeid
    assert pitfall_hint("kv", caught.nodeid, message, 2.5) == f"test_{names[0]} ran past the 2.5 s limit: a loop that never ends?"


def test_in_process_plugin_limits_the_collection_too(plugin, monkeypatch):
    """The collection imports the learner's modules: a loop at a module's top level ends at the limit,
    named as the import; after a test file that did not import, the modules are not imported again."""
    import signal
    import types

    from tl_lab.lab.exercise import workspace as wsm

    monkeypatch.setattr(plugin, "TIMEOUT", 2.5)
    wrapper = plugin.pytest_collection(None)
    next(wrapper)  # the collection runs here
    limit = plugin.COLLECT_FLOOR  # a small --timeout is not the collection's: importing takes seconds
    assert signal.getsignal(signal.SIGALRM) == plugin._on_alarm and limit - 1 < signal.getitimer(signal.ITIMER_REAL)[0] <= limit
    with pytest.raises(plugin.TestTimeout, match=rf"^importing the modules ran longer than {limit:g} s \(an infinite loop\?\)$"):
        plugin._on_alarm(signal.SIGALRM, None)
    with pytest.raises(StopIteration):
        next(wrapper)
    assert signal.getitimer(signal.ITIMER_REAL)[0] == 0
    with pytest.raises(plugin.TestTimeout, match=r"^the test ran longer than 2\.5 s"):
        plugin._on_alarm(signal.SIGALRM, None)
    monkeypatch.setattr(sys, "meta_path", [f for f in sys.meta_path if not isinstance(f, wsm.WorkspaceFinder)])
    plugin.pytest_collection_finish(types.SimpleNamespace(testsfailed=1))  # no stop: the collection error is the verdict
    assert plugin._errors == []


def test_in_process_plugin_says_where_in_the_learners_code_a_failure_was_raised(plugin, tmp_path, monkeypatch):
    """The innermost frame in a learner's file ("file:line in function"), none for an assertion in the test."""
    import types

    from tl_lab.lab.exercise import workspace as wsm

    f = tmp_path / "kv.py"
    source = "def inner():\n    raise ValueError('wrong exception')\n\n\ndef outer():\n    inner()\n"
    code = compile(source, str(f), "exec")
    space = {}
    exec(code, space)
    origins = {"kv": wsm.Origin("kv", "learner", str(f), "the learner's file")}
    monkeypatch.setattr(sys, "meta_path", [wsm.WorkspaceFinder.__new__(wsm.WorkspaceFinder), *sys.meta_path])
    sys.meta_path[0].origins, sys.meta_path[0].workspace = origins, tmp_path
    with pytest.raises(ValueError) as raised:
        space["outer"]()
    assert plugin._learner_at(raised.tb) == f"{f}:2 in inner"
    with pytest.raises(AssertionError) as failed:
        assert 1 == 2
    assert plugin._learner_at(failed.tb) == ""

    report = types.SimpleNamespace()
    wrapper = plugin.pytest_runtest_makereport(None, types.SimpleNamespace(when="call", excinfo=raised))
    next(wrapper)
    with pytest.raises(StopIteration):
        wrapper.send(types.SimpleNamespace(get_result=lambda: report))
    assert report.learner_at == f"{f}:2 in inner"
    name = graded("kv")[0].name
    report.__dict__.update(nodeid=f"tests/test_kv.py::test_{name}", when="call", outcome="failed", passed=False,
                           longrepr="ValueError: wrong exception", duration=0.5)
    plugin.pytest_runtest_logreport(report)
    assert plugin._results[-1]["at"] == f"{f}:2 in inner"


def test_in_process_plugin_names_no_learners_line_when_no_workspace_is_active(plugin, monkeypatch):
    """A failure in a run with no workspace finder (the lab's own run) is recorded without a place,
    not turned into an error inside the report hook."""
    from tl_lab.lab.exercise import workspace as wsm

    monkeypatch.setattr(sys, "meta_path", [f for f in sys.meta_path if not isinstance(f, wsm.WorkspaceFinder)])
    with pytest.raises(ValueError) as raised:
        raise ValueError("in the reference")
    assert plugin._learner_at(raised.tb) == ""
