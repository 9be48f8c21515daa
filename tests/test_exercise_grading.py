"""tl_lab/lab/exercise/grading.py in this process: the order, a graded run's report read into a module's row
in each of its states, the hints, the saved status, the table (the pytest runs are test_exercises.py's).
"""

import pytest

from conftest import workspace
from tl_lab.lab.exercise import registry
from tl_lab.lab.exercise.grading import pitfall_hint
from tl_lab.lab.exercise.registry import MODULES, graded
from tl_lab.lab.exercise.stubs import ExerciseError


def _report(results=(), errors=(), loaded=None, module="kv"):
    """A report as the plugin writes it (tl_lab.lab.exercise.plugin): results, errors and origins."""
    return {"results": list(results), "errors": list(errors), "origins": {module: {"loaded": loaded}}}


def _result(name, outcome="passed", message="", params=""):
    return {"nodeid": f"tests/test_kv.py::test_{name}{params}", "chapter_test": name, "outcome": outcome,
            "message": message}


def test_in_process_grading_orders_the_modules_with_their_dependencies():
    from tl_lab.lab.exercise.grading import order

    assert order() == list(MODULES) and order([]) == list(MODULES)
    assert order(["forward"]) == ["kv", "quant", "model", "forward"]  # the chapter's order, not the asked one
    assert order(["sample", "model"]) == ["quant", "model", "sample"]
    with pytest.raises(ExerciseError):
        order(["kvv"])


def test_in_process_grading_reads_a_report_into_the_modules_row(tmp_path):
    from tl_lab.lab.exercise.grading import MESSAGE_LINES, MESSAGE_WIDTH, _row

    f, log, uses = tmp_path / "kv.py", tmp_path / "check-kv.log", {"kv": "learner"}
    names = [g.name for g in graded("kv")]
    row = _row("kv", f, uses, None, log, 1.04, 120)
    assert (row.state, row.message, row.seconds, row.log) == ("not run", f"pytest wrote no report; see {log}", 1.0,
                                                              str(log))
    row = _row("kv", f, uses, _report(errors=[{"kind": "origin", "message": "tl_lab.kv is the reference"}]), log, 1, 120)
    assert (row.state, row.message) == ("origin error", "tl_lab.kv is the reference") and "nothing was graded" in row.hint
    row = _row("kv", f, uses, _report(loaded="/elsewhere/kv.py"), log, 1, 120)
    assert (row.state, row.message) == ("origin error", f"tl_lab.kv ran from /elsewhere/kv.py, not {f}")
    text = f"{f}:3: in <module>\n    import x\n{f}:12: in f\nE   NameError: name 'x' is not defined\n\n"
    row = _row("kv", f, uses, _report(errors=[{"kind": "collect", "message": text}], loaded=str(f)), log, 1, 120)
    assert (row.state, row.message) == ("does not import", f"{f}:12: E   NameError: name 'x' is not defined")
    row = _row("kv", f, uses, _report(errors=[{"kind": "collect", "message": "E   boom\n" * 9}]), log, 1, 120)
    assert row.message == f"{f}: boom"  # no line of the file named: the file, then pytest's last error line
    passing = [_result(n) for n in names] + [_result(names[0], params="[1]")]
    row = _row("kv", f, uses, _report(passing, loaded=str(f)), log, 1, 120)
    assert (row.state, row.passed, row.total, row.ok) == ("passed", 4, 4, True)
    assert row.results == dict.fromkeys(names, "passed")
    row = _row("kv", f, uses, _report(passing[1:-1]), log, 1, 120)
    assert (row.state, row.message) == ("failed", f"only 3 of the 4 chapter tests ran; see {log}")
    long = "AssertionError: " + "x" * 300 + "\nline 2"
    failing = [_result(names[0]), _result(names[1], "failed", long), _result(names[2], "failed", "second")]
    row = _row("kv", f, uses, _report(failing + [_result(names[0], "failed", params="[2]")]), log, 1, 120)
    assert (row.state, row.passed, row.total, row.first_failure) == ("failed", 0, 3, names[1])
    assert row.results == {names[0]: "failed", names[1]: "failed", names[2]: "failed"}  # a node failing fails its test
    first, second = row.message.splitlines()
    assert first == f"test_{names[1]}: " + long[:MESSAGE_WIDTH] and second == "line 2"
    assert row.hint == pitfall_hint("kv", failing[1]["nodeid"], long, 120, f.parent)
    assert "s18" not in row.hint  # issue 60: no pitfall guessed from the failing test's name


def test_in_process_grading_of_a_row_after_a_test_past_the_limit_says_what_was_not_run(tmp_path):
    from tl_lab.lab.exercise.grading import _row

    f, log = tmp_path / "kv.py", tmp_path / "check-kv.log"
    a, b, c, d = (g.name for g in graded("kv"))
    why = f"not run: test_{b} of this module ran past the 2 s limit"
    results = [_result(a), _result(b, "failed", "TestTimeout: the test ran longer than 2 s"),
               _result(b, "not run", why, params="[2]"), _result(c, "not run", why), _result(d, "not run", why)]
    row = _row("kv", f, {"kv": "learner"}, _report(results), log, 1, 2)
    assert row.results == {a: "passed", b: "failed", c: "not run", d: "not run"}  # b's second node: still failed
    assert (row.state, row.passed, row.total, row.first_failure) == ("failed", 1, 4, b)
    assert row.message.splitlines() == [f"test_{b}: TestTimeout: the test ran longer than 2 s", "not run after it: "
                                        "2 of its chapter tests (a module's first test past the limit ends its check)"]
    assert row.hint.startswith(f"test_{b} ran past the 2 s limit")
    caught_it = "TestTimeout: the test ran past the 2 s limit (its code caught the time-out, then it passed)"
    caught = [_result(a), _result(b, "failed", caught_it), _result(c, "not run", why), _result(d, "not run", why)]
    row = _row("kv", f, {"kv": "learner"}, _report(caught), log, 1, 2)  # the learner's code caught the alarm's error
    assert (row.state, row.passed, row.first_failure) == ("failed", 1, b)  # the plugin failed b: as any time-out
    assert row.message.splitlines() == [f"test_{b}: {caught_it}", "not run after it: "
                                        "2 of its chapter tests (a module's first test past the limit ends its check)"]
    assert row.hint == f"test_{b} ran past the 2 s limit: a loop that never ends?"
    unfailed = [_result(a), _result(b), _result(c, "not run", why), _result(d, "not run", why)]
    row = _row("kv", f, {"kv": "learner"}, _report(unfailed), log, 1, 2)  # no report the plugin writes: not a pass
    assert (row.state, row.passed, row.message) == ("failed", 2, f"only 2 of the 4 chapter tests ran; see {log}")


def test_in_process_grading_hints_in_the_chapters_words():
    from tl_lab.lab.exercise.grading import pitfall_hint
    from tl_lab.lab.exercise.stubs import NOT_WRITTEN

    msg = f"NotImplementedError: KvPool.alloc: {NOT_WRITTEN} (section 2.2: hand out free blocks)"
    assert pitfall_hint("kv", "tests/test_kv.py::test_x", msg) == (
        "KvPool.alloc is not written yet: reread section 2.2 (hand out free blocks)")
    assert pitfall_hint("kv", "tests/test_kv.py::test_slow[3]", "TestTimeout: ...", timeout=2.5) == (
        "test_slow[3] ran past the 2.5 s limit: a loop that never ends?")
    assert "ran past the 120 s limit" in pitfall_hint("kv", "t.py::test_y", "it ran longer than allowed")
    where = f"reread {registry.SECTIONS['kv']}"
    # issue 60: a pitfall is named by the learner's output (diagnose.for_module, with the workspace), never
    # guessed from the failing test's name: without a workspace, the section to reread
    assert pitfall_hint("kv", "tests/test_kv.py::test_kv_pool_rejects_zero_capacity[0]", "AssertionError") == where
    assert pitfall_hint("kv", "tests/test_kv.py::test_something_else", "AssertionError") == where


def test_in_process_grading_of_a_workspace_not_started_saves_every_row(tmp_path):
    from tl_lab.lab.exercise.grading import STATUS_DIR, check, format_table, load_status

    ws = workspace(tmp_path, modules=["quant"])
    (ws / "sample.py").write_text("def sample(:\n", encoding="utf-8")
    seen = []
    rows = check(ws, progress=seen.append)
    assert [r.module for r in rows] == list(MODULES) and seen == rows
    states = {r.module: r.state for r in rows}
    assert states == {"kv": "not started", "quant": "not started", "model": "not started",
                      "forward": "not started", "runner": "not started", "sample": "does not import"}
    by = {r.module: r for r in rows}
    assert by["kv"].hint == f"no kv.py yet: python -m tl_lab exercise start kv --workspace {ws}"  # not the default
    assert by["quant"].hint.startswith("quant.py is the stub: write its pieces (sections 2.5")
    assert by["sample"].message.startswith(f"{ws / 'sample.py'}:1: SyntaxError: ")
    assert by["sample"].hint == f"fix the syntax at {ws / 'sample.py'}:1; the other modules are still checked"
    assert (by["quant"].file, by["sample"].file) == (str(ws / "quant.py"), str(ws / "sample.py"))
    status = load_status(ws)
    assert set(status) == set(MODULES) and status["sample"]["state"] == "does not import" and status["kv"]["when"]
    assert sorted(p.name for p in (ws / STATUS_DIR).iterdir()) == ["status.json"]  # no temporary left
    table = format_table(rows).splitlines()
    assert table[0].split() == ["module", "state", "tests", "from"] and table[-1] == "0 of 6 modules pass"
    assert "kv       not started          -  -" in table
    (ws / STATUS_DIR / "status.json").write_text("{not json", encoding="utf-8")
    assert load_status(ws) == {}


def test_in_process_grading_table_says_where_each_module_came_from():
    from tl_lab.lab.exercise.grading import Row, format_table

    rows = [Row("kv", "passed", "kv.py", {"kv": "learner"}, passed=4, total=4),
            Row("model", "failed", "model.py", {"model": "learner", "quant": "reference (--ref-deps)"}, passed=1,
                total=2, first_failure="model_loads", message="AssertionError\nline 2", hint="reread it")]
    assert format_table(rows).splitlines()[2:] == [
        "kv       passed             4/4  learner's file",
        "model    failed             1/2  learner's file; quant: reference (--ref-deps)",
        "         first failing: model_loads",
        "         AssertionError",
        "         line 2",
        "         hint: reread it",
        "1 of 2 modules pass"]


def test_in_process_grading_needs_the_clones_tests(tmp_path, monkeypatch):
    from tl_lab.lab.exercise import grading

    grading.need_tests(MODULES)  # the clone has them
    monkeypatch.setattr(grading, "REPO_ROOT", tmp_path)
    with pytest.raises(ExerciseError, match=r"^exercise check runs the chapter's tests from a clone .* has no "
                                            r"tests/conftest\.py: clone it"):
        grading.need_tests(["kv"])


def test_in_process_grading_of_a_row_names_each_test_and_passes_the_limit(tmp_path):
    from tl_lab.lab.exercise.grading import _row, pitfall_hint
    from tl_lab.lab.pitfalls import PITFALLS

    f, log = tmp_path / "kv.py", tmp_path / "check-kv.log"
    unnamed = {"nodeid": "tests/test_kv.py::test_helper", "chapter_test": None, "outcome": "failed",
               "message": "TestTimeout: ran longer than 2.5 s"}
    row = _row("kv", f, {"kv": "learner"}, _report([unnamed]), log, 1, 2.5)
    assert row.results == {"tests/test_kv.py::test_helper": "failed"} and row.uses == {"kv": "learner"}
    assert row.first_failure == "tests/test_kv.py::test_helper" and "ran past the 2.5 s limit" in row.hint
    text = "E   ImportError: nope"
    row = _row("kv", f, {}, _report(errors=[{"kind": "collect", "message": text}]), log, 1, 120)
    assert row.hint == "the module fails when imported; the other modules are still checked"
    # issue 60: never "s06 or s07" from the test's name; the diagnosis by symptom names one or none
    hint = pitfall_hint("sample", "tests/test_sample.py::test_penalties_follow_hf_and_openai_semantics", "x")
    assert not any(pid in hint for pid in PITFALLS) and hint.startswith("reread section 2.6")


def test_in_process_grading_blocks_a_module_whose_dependencies_do_not_pass(tmp_path, monkeypatch):
    from tl_lab.lab.exercise import grading

    ws = workspace(tmp_path, "reference", ["forward", "kv"])
    ran = []

    def run(workspace, module, use, timeout, tests=None, first_failure=False):
        ran.append((module, use))
        passing = [{"nodeid": f"x::test_{g.name}", "chapter_test": g.name, "outcome": "passed", "message": ""}
                   for g in graded(module)]
        return _report(passing, module=module, loaded=str(workspace / f"{module}.py")), workspace / "log", 0.5

    monkeypatch.setattr(grading, "_run", run)  # the pytest subprocess, as its report
    rows = {r.module: r for r in grading.check(ws, ["forward"])}
    assert ran == [("kv", ["kv"])] and rows["kv"].ok and rows["kv"].uses == {"kv": "learner"}
    fw = rows["forward"]
    assert (fw.state, fw.message) == ("blocked", "blocked by quant, model (not passing)")
    assert fw.uses == {"forward": "learner", "quant": "blocked", "kv": "learner", "model": "blocked",
                       "runner": "reference (harness)"}
    assert fw.hint == "pass quant, model first, or check with --ref-deps to borrow the reference"
    rows = {r.module: r for r in grading.check(ws, ["forward"], ref_deps=True)}
    assert ran[-1] == ("forward", ["forward", "kv"]) and rows["forward"].ok
    assert rows["forward"].uses == {"forward": "learner", "quant": "reference (--ref-deps)", "kv": "learner",
                                    "model": "reference (--ref-deps)", "runner": "reference (harness)"}


def test_in_process_grading_reads_a_byte_order_mark_and_names_the_line_of_a_cr_file(tmp_path):
    """Before any pytest run (`_not_started`): a stub saved with a byte order mark and CRLF lines is "not
    started"; the reference so saved compiles (nothing to say: it goes to its tests); a Latin-1 file with CR
    lines names the line of its bad byte."""
    import codecs

    from tl_lab.lab.exercise.grading import _not_started
    from tl_lab.lab.exercise.stubs import reference_source, stub_source

    f = tmp_path / "kv.py"
    f.write_bytes(codecs.BOM_UTF8 + stub_source("kv").replace("\n", "\r\n").encode())
    assert _not_started("kv", f).state == "not started"
    f.write_bytes(codecs.BOM_UTF8 + reference_source("kv").encode())
    assert _not_started("kv", f) is None
    f.write_bytes(reference_source("kv").replace("\n", "\r").encode() + "# café\r".encode("latin-1"))
    n = reference_source("kv").count("\n") + 1
    row = _not_started("kv", f)
    assert (row.state, row.message) == ("does not import", f"{f}:{n}: not UTF-8 text (invalid continuation byte)")


def test_in_process_grading_names_a_file_that_is_not_utf8(tmp_path):
    """A kv.py saved in Latin-1 (the workspace hook reads UTF-8 only): "does not import" at its line,
    never an origin error ("no workspace is active"), and no pytest run."""
    from tl_lab.lab.exercise.grading import check
    from tl_lab.lab.exercise.stubs import reference_source

    ws = tmp_path / "ws"
    ws.mkdir()
    f = ws / "kv.py"
    f.write_bytes(reference_source("kv").encode() + "# café\n".encode("latin-1"))
    (row,) = check(ws, ["kv"])
    n = reference_source("kv").count("\n") + 1
    assert (row.state, row.message) == ("does not import", f"{f}:{n}: not UTF-8 text (invalid continuation byte)")
    assert row.hint.startswith("save kv.py as UTF-8") and row.log == ""



def test_in_process_grading_names_a_loop_at_a_modules_top_level(tmp_path):
    """The collection ended at its limit (tl_lab.lab.exercise.plugin) inside the learner's file: "does not
    import" at the loop's line, and the hint says what never ended."""
    from tl_lab.lab.exercise.grading import _row

    f = tmp_path / "quant.py"
    text = (f"tests/test_quant.py:9: in <module>\n    from tl_lab.quant import (\n{f}:547: in <module>\n    while i < 10:\n"
            "E   tl_lab.lab.exercise.plugin.TestTimeout: importing the modules ran longer than 30 s (an infinite loop?)\n")
    row = _row("quant", f, {"quant": "learner"}, _report(errors=[{"kind": "collect", "message": text}], module="quant"), f, 31, 5)
    assert (row.state, row.message) == ("does not import", f"{f}:547: E   tl_lab.lab.exercise.plugin.TestTimeout: importing "
                                                           "the modules ran longer than 30 s (an infinite loop?)")
    assert row.hint == "importing quant.py never ended (a loop at its top level?); the other modules are still checked"


def test_in_process_grading_says_where_the_learners_code_raised_and_where_the_log_is(tmp_path):
    from tl_lab.lab.exercise.grading import _row, format_table

    f, log = tmp_path / "kv.py", tmp_path / "check-kv.log"
    failing = {**_result(graded("kv")[0].name, "failed", "ValueError: wrong exception"), "at": f"{f}:7 in KvPool.alloc"}
    row = _row("kv", f, {"kv": "learner"}, _report([failing], loaded=str(f)), log, 1, 120)
    assert row.message.splitlines() == [f"test_{graded('kv')[0].name}: ValueError: wrong exception",
                                        f"raised at {f}:7 in KvPool.alloc"]
    table = format_table([row]).splitlines()
    assert table[-2] == f"         the whole output: {log}" and table[-3].startswith("         hint: ")
    row = _row("kv", f, {"kv": "learner"}, _report([{**failing, "at": ""}], loaded=str(f)), log, 1, 120)
    assert "raised at" not in row.message  # an assertion in the test: the learner's function returned


def test_in_process_grading_of_a_relative_workspace_is_the_one_here(tmp_path, monkeypatch):
    """check(Path("ws")) from another folder (a CheckPanel in a notebook's folder): the workspace under
    this folder is graded, not one under the clone where the pytest run starts."""
    from pathlib import Path

    from tl_lab.lab.exercise.grading import check

    ws = workspace(tmp_path, "reference", ["sample"])
    monkeypatch.chdir(tmp_path)
    (row,) = check(Path("ws"), ["sample"])
    assert (row.state, row.passed, row.file) == ("passed", 7, str(ws / "sample.py"))


def test_in_process_grading_reads_the_learners_syntax_as_the_import_does(tmp_path):
    """grading.py's own `from __future__ import annotations` is not the learner's: a named expression in
    an annotation, which that future refuses, imports from a file without it, so it is no "does not
    import" row."""
    from tl_lab.lab.exercise.grading import _not_started

    f = tmp_path / "kv.py"
    f.write_text("limit: (n := 1) = 2\n", encoding="utf-8")
    assert _not_started("kv", f) is None
    f.write_text("from __future__ import annotations\n\nlimit: (n := 1) = 2\n", encoding="utf-8")
    assert _not_started("kv", f).state == "does not import"  # the file's own future refuses it, as its import


def test_in_process_grading_runs_pytest_with_the_clone_first_on_the_learners_path(tmp_path, monkeypatch):
    import os

    from tl_lab.lab.exercise.grading import _env
    from tl_lab.ops.paths import REPO_ROOT

    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "mine"))
    env = _env(tmp_path, "kv", ["kv"], tmp_path / "report.json", 2.5)
    assert env["PYTHONPATH"].split(os.pathsep) == [str(REPO_ROOT), str(tmp_path / "mine")]
    monkeypatch.delenv("PYTHONPATH")
    assert _env(tmp_path, "kv", ["kv"], tmp_path / "report.json", 2.5)["PYTHONPATH"] == str(REPO_ROOT)


def test_in_process_grading_ends_a_run_that_never_ends_past_every_tests_limit(tmp_path, monkeypatch):
    """The pytest process of a graded run stands for one that hangs: it is given a deadline (else the
    command would wait forever), one no honest run reaches, each of its tests at its limit; the log says so."""
    import subprocess

    from tl_lab.lab.exercise import grading

    deadlines = []

    def hangs(cmd, timeout=None, stdout=None, **kw):
        if timeout is None:
            raise AssertionError("no deadline: a hung pytest would never return")
        deadlines.append(timeout)
        raise subprocess.TimeoutExpired(cmd, timeout)

    monkeypatch.setattr(grading.subprocess, "run", hangs)
    data, log, _ = grading._run(tmp_path, "sample", ["sample"], 2.0)
    (deadline,) = deadlines
    assert data is None and deadline > 2.0 * len(graded("sample"))
    assert log.read_text(encoding="utf-8").endswith(f"exercise: pytest gave no verdict within {deadline:.0f} s; stopped\n")
