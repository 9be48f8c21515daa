"""tl_lab/lab/exercise/cli.py in this process: each command through the real parser, its output and exit code,
the one-line refusals and the help (the same commands as processes are test_exercises.py's).
"""

import codecs
import sys

import pytest

from conftest import workspace
from tl_lab.lab.exercise import registry
from tl_lab.lab.exercise.registry import CATALOGUE
from tl_lab.lab.exercise.stubs import ExerciseError, reference_source, stub_source


def _in_process_cli(capsys, *argv):
    """`python -m tl_lab exercise ARGV` run in this process -> (exit code, stdout, stderr)."""
    import argparse

    from tl_lab.lab.exercise.cli import add_cli

    parser = argparse.ArgumentParser(prog="tl_lab")
    add_cli(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["exercise", *argv])
    code = args.run(args)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_in_process_cli_start_status_hint_reset_and_check(tmp_path, capsys):
    ws = tmp_path / "ws"
    code, out, _ = _in_process_cli(capsys, "start", "kv", "sample", "--workspace", str(ws))
    assert code == 0 and out.splitlines()[:2] == [f"{'wrote':<24} {ws / 'kv.py'}", f"{'wrote':<24} {ws / 'sample.py'}"]
    assert out.splitlines()[-1].startswith("next: python -m tl_lab exercise tests")
    assert sorted(p.name for p in ws.iterdir()) == ["kv.py", "sample.py"]
    code, out, _ = _in_process_cli(capsys, "start", "kv", "--workspace", str(ws))
    assert out.splitlines()[0] == f"{'left alone (it exists)':<24} {ws / 'kv.py'}"
    (ws / "quant.py").write_text(reference_source("quant"), encoding="utf-8")
    code, out, _ = _in_process_cli(capsys, "status", "--workspace", str(ws))
    lines = out.splitlines()
    n_kv, n_quant = len(registry.PIECES["kv"]), len(registry.PIECES["quant"])
    assert code == 0 and lines[0] == f"workspace {ws}"
    assert lines[1] == f"  kv       the stub   0/{n_kv:<2} pieces  last check: never checked"
    assert lines[2] == f"  quant    yours     {n_quant:>2}/{n_quant:<2} pieces  last check: never checked"
    assert lines[3].startswith("  model    no file    0/")
    (ws / "sample.py").write_bytes(codecs.BOM_UTF8 + stub_source("sample").replace("\n", "\r\n").encode())
    code, out, _ = _in_process_cli(capsys, "status", "--workspace", str(ws))  # the stub as Notepad saves it
    assert out.splitlines()[6].startswith("  sample   the stub ")
    code, out, _ = _in_process_cli(capsys, "hint", "kv", "--workspace", str(ws))
    lines = out.splitlines()
    assert lines[0] == f"kv: {registry.SECTIONS['kv']}; 0 of {n_kv} pieces written"
    first = registry.PIECES["kv"][0]
    assert lines[1].startswith(f"  [todo] {first.qualname:<28} section {first.section:<4} ~") and first.hint in lines[1]
    code, out, err = _in_process_cli(capsys, "check", "kv", "--workspace", str(ws))  # the stub: no test run
    assert code == 1 and "kv       not started" in out and out.splitlines()[-2] == "0 of 1 modules pass"
    assert err.split() == ["kv", "not", "started", "0.0", "s"]
    code, out, _ = _in_process_cli(capsys, "hint", "kv", "--workspace", str(ws))
    assert out.splitlines()[-1].startswith("last check (") and "): not started; kv.py is the stub" in out
    code, out, _ = _in_process_cli(capsys, "status", "--workspace", str(ws))
    assert "last check: not started 0/0 (" in out.splitlines()[1]
    (ws / "kv.py").write_text("# mine\n", encoding="utf-8")  # the verdict above is of the stub, not of this
    code, out, _ = _in_process_cli(capsys, "status", "--workspace", str(ws))
    assert out.splitlines()[1].endswith(", the file has changed since")
    code, out, _ = _in_process_cli(capsys, "hint", "kv", "--workspace", str(ws))
    assert "(your file has changed since): not started" in out.splitlines()[-1]
    code, out, _ = _in_process_cli(capsys, "reset", "kv", "--workspace", str(ws))
    backup = next(ws.glob("kv.py.bak-*"))
    assert code == 0 and out.splitlines() == [f"kept your file as {backup}", f"wrote a fresh stub {ws / 'kv.py'}"]
    assert backup.read_text() == "# mine\n" and (ws / "kv.py").read_text() == stub_source("kv")
    code, out, _ = _in_process_cli(capsys, "status", "--workspace", str(ws))  # the stub again: what was checked
    assert "last check: not started 0/0 (" in out.splitlines()[1] and "changed" not in out
    code, out, _ = _in_process_cli(capsys, "reset", "model", "--workspace", str(ws))
    assert out.splitlines()[0] == "there was no model.py"


def test_in_process_cli_refuses_in_one_line(tmp_path, capsys):
    ws = tmp_path / "ws"
    code, out, err = _in_process_cli(capsys, "status", "--workspace", str(ws))
    assert (code, out) == (2, "") and err == f"error: workspace {ws} does not exist: python -m tl_lab exercise start --workspace {ws} writes it\n"
    ws.mkdir()
    code, _, err = _in_process_cli(capsys, "parity", "dice", "--workspace", str(ws))
    assert code == 2 and err == "error: unknown parity suite 'dice': the suites are sampler, rng\n"
    code, _, err = _in_process_cli(capsys, "parity", "--workspace", str(ws))
    assert code == 2 and err == f"error: no {ws / 'sample.py'}: python -m tl_lab exercise start sample --workspace {ws}\n"
    code, _, err = _in_process_cli(capsys, "hint", "kvv", "--workspace", str(ws))
    assert code == 2 and err.startswith("error: ") and "kvv" in err and len(err.splitlines()) == 1


def test_in_process_cli_tests_lists_the_last_results(tmp_path, capsys):
    from tl_lab.lab.exercise.grading import Row, _save

    ws = tmp_path / "ws"
    ws.mkdir()
    first = next(g for g in CATALOGUE if g.module == "kv")
    _save(ws, [Row("kv", "failed", "kv.py", results={first.name: "failed"})])
    code, out, _ = _in_process_cli(capsys, "tests", "--workspace", str(ws))
    assert code == 0 and out.splitlines()[-1].startswith(f"{len(CATALOGUE)} tests; you write no graded tests here (rung R0). ")
    lines = out.splitlines()
    for g in CATALOGUE:
        head = f"{g.name:<46} {g.kind:<20} {g.module:<8} "
        row = next(line for line in lines if line.startswith(head))
        assert row[len(head):].split()[0] == ("failed" if g == first else "-"), g.name


def test_in_process_cli_parity_runs_the_learners_sample(tmp_path, capsys):
    """`exercise parity`: the workspace's sample.py is the one held to the golden files (in a child, so this
    process never imports it), and one that does not import (or parse) is named at its line."""
    ws = workspace(tmp_path, "reference", ["sample"])
    code, out, _ = _in_process_cli(capsys, "parity", "rng", "rng", "--workspace", str(ws))
    assert code == 0 and out.splitlines()[0] == f"your {ws / 'sample.py'}"
    assert len(out.splitlines()) == 2  # the suite once, naming the golden file it reads
    assert out.splitlines()[1].startswith("parity rng (against data/golden/pcg32.vectors.json): ")
    assert sys.modules.get("tl_lab.sample") is None or sys.modules["tl_lab.sample"].__file__ != str(ws / "sample.py")

    other = tmp_path / "broken"
    other.mkdir()
    (other / "sample.py").write_text("import numpy\n\nx = undefined_name\n", encoding="utf-8")
    code, out, _ = _in_process_cli(capsys, "parity", "--workspace", str(other))
    assert code == 1 and out == f"parity: {other / 'sample.py'}:3: NameError: name 'undefined_name' is not defined\n"
    (other / "sample.py").write_text("import numpy\n\ndef f(:\n", encoding="utf-8")  # was: no :3, no frame of it
    code, out, _ = _in_process_cli(capsys, "parity", "--workspace", str(other))
    assert code == 1 and out.startswith(f"parity: {other / 'sample.py'}:3: SyntaxError: ") and out.count("\n") == 1


def test_in_process_cli_knows_which_commands_need_the_workspace(tmp_path, capsys, monkeypatch):
    from tl_lab.lab.exercise import cli as cli_module, workspace as wsm

    missing = tmp_path / "not-yet"
    monkeypatch.delenv(wsm.ENV, raising=False)
    monkeypatch.setattr(cli_module, "resolve", lambda given: missing if given is None else wsm.resolve(given))
    assert _in_process_cli(capsys, "tests")[0] == 0  # the catalogue, before start
    assert _in_process_cli(capsys, "hint", "kv")[0] == 0
    code, _, err = _in_process_cli(capsys, "status")  # needs the workspace, even the default one
    assert code == 2 and err == (f"error: workspace {missing} does not exist: python -m tl_lab exercise start "
                                 f"--workspace {missing} writes it\n")
    code, _, err = _in_process_cli(capsys, "tests", "--workspace", str(missing))  # a named one must exist
    assert code == 2 and "does not exist" in err


def test_in_process_cli_suggests_commands_that_carry_the_workspace(tmp_path, capsys, monkeypatch):
    """Every command the output suggests (start's next steps, a row's hint, hint's last check, parity's
    refusal, the notebook guard's) names the workspace, quoted for the shell, when it was given by
    --workspace or is not the default: an instructor grading --workspace learner1 who copies one acts on
    learner1, never on their own work/L10.1. The default work/L10.1 alone is left unsaid."""
    import shlex

    from tl_lab.lab.exercise import cli as cli_module, guard, workspace as wsm

    default = tmp_path / "work" / "L10.1"
    monkeypatch.setattr(wsm, "default_workspace", lambda: default)
    monkeypatch.delenv(wsm.ENV, raising=False)
    ws = tmp_path / "learner 1"  # a space: quoted
    opt = f"--workspace {shlex.quote(str(ws))}"
    assert opt == f"--workspace '{ws}'"
    code, out, _ = _in_process_cli(capsys, "start", "kv", "--workspace", str(ws))
    assert code == 0 and out.splitlines()[-1] == (f"next: python -m tl_lab exercise tests {opt}   (the catalogue), then "
                                                  f"write a module and python -m tl_lab exercise check MODULE {opt}")
    code, out, _ = _in_process_cli(capsys, "check", "kv", "quant", "--workspace", str(ws))
    assert code == 1 and f"hint: kv.py is the stub: write its pieces ({registry.SECTIONS['kv']}); " \
                         f"python -m tl_lab exercise hint kv {opt}\n" in out
    assert f"hint: no quant.py yet: python -m tl_lab exercise start quant {opt}\n" in out
    code, out, _ = _in_process_cli(capsys, "hint", "kv", "--workspace", str(ws))
    assert out.splitlines()[-1].endswith(f"python -m tl_lab exercise hint kv {opt}")
    code, _, err = _in_process_cli(capsys, "parity", "--workspace", str(ws))
    assert code == 2 and err.endswith(f": python -m tl_lab exercise start sample {opt}\n")
    monkeypatch.setenv(wsm.ENV, str(ws))  # not the default, though not given by --workspace
    code, out, _ = _in_process_cli(capsys, "check", "kv")
    assert f"python -m tl_lab exercise hint kv {opt}\n" in out
    fault = guard.blame(ValueError("x"), ws, "kv")  # a notebook's first cell, `generate` under TL_LAB_WORKSPACE
    assert fault.hint.endswith(f"; python -m tl_lab exercise hint kv {opt}")
    assert fault.lines()[-1] == f"   fix it (python -m tl_lab exercise check kv {opt} says more), then restart the kernel"

    monkeypatch.delenv(wsm.ENV)  # the default work/L10.1, not named: the commands as the chapter writes them
    code, out, _ = _in_process_cli(capsys, "start", "kv")
    assert (default / "kv.py").is_file() and out.splitlines()[-1] == (
        "next: python -m tl_lab exercise tests   (the catalogue), then write a module and "
        "python -m tl_lab exercise check MODULE")
    code, out, _ = _in_process_cli(capsys, "check", "kv")
    assert "; python -m tl_lab exercise hint kv\n" in out
    assert guard.blame(ValueError("x"), default, "kv").hint.endswith("; python -m tl_lab exercise hint kv")
    code, out, _ = _in_process_cli(capsys, "check", "kv", "--workspace", str(default))  # named: said, even the default
    assert f"; python -m tl_lab exercise hint kv --workspace {default}\n" in out
    assert cli_module.command("check", "kv", workspace=default) == "python -m tl_lab exercise check kv"


def test_in_process_cli_check_says_where_the_logs_and_status_are_pass_or_fail(tmp_path, capsys):
    """The table's last line names the logs and status.json, once, on a pass too (was: a pass said only
    "4/4", and only a failed row named its log)."""
    ws = workspace(tmp_path, "ref", ["kv"]).resolve()
    d = ws / ".tl_lab"
    where = f"logs: {d / 'check-<module>.log'} (each module run); verdicts: {d / 'status.json'}"
    code, out, _ = _in_process_cli(capsys, "check", "kv", "--workspace", str(ws))
    assert code == 0 and out.splitlines()[-2:] == ["1 of 1 modules pass", where], out
    assert out.count("status.json") == 1 and (d / "check-kv.log").is_file() and (d / "status.json").is_file()
    (ws / "kv.py").write_text(stub_source("kv"), encoding="utf-8")
    code, out, _ = _in_process_cli(capsys, "check", "kv", "--workspace", str(ws))
    assert code == 1 and out.splitlines()[-2:] == ["0 of 1 modules pass", where], out
    assert out.count("status.json") == 1


def test_in_process_cli_workspace_option_lifts_a_bad_environment(tmp_path, capsys, monkeypatch):
    from tl_lab.lab.exercise import workspace as wsm

    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    wsm.refuse_from_env(ExerciseError("no such folder"))
    _in_process_cli(capsys, "tests")
    assert wsm.env_error() is not None  # no --workspace: the refusal stays for the command line to report
    _in_process_cli(capsys, "tests", "--workspace", str(tmp_path))
    assert wsm.env_error() is None


def test_in_process_cli_help_names_every_command_and_argument(capsys):
    import argparse

    from tl_lab.lab.exercise.cli import COMMANDS, add_cli

    parser = argparse.ArgumentParser(prog="tl_lab")
    add_cli(parser.add_subparsers(dest="command"))
    with pytest.raises(SystemExit):
        parser.parse_args(["exercise", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "your turn: write the six modules, the chapter's tests grade them" in text or "Chapter L10.1" in text
    for name in COMMANDS:
        assert f" {name} " in text, name
    assert "run the graded tests on your code; exit 0 only when every one asked for passes" in text
    with pytest.raises(SystemExit):
        parser.parse_args(["exercise", "parity", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "[SUITE ...]" in text and "--workspace DIR" in text and "else work/L10.1" in text
    with pytest.raises(SystemExit):
        parser.parse_args(["exercise", "check", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--timeout S" in text and "a module's first test past it ends that module's check" in text
    assert parser.parse_args(["exercise", "parity"]).suites == ["sampler", "rng"]
    with pytest.raises(SystemExit):
        parser.parse_args(["--help"])
    assert "your turn: write the six modules, the chapter's tests grade them" in " ".join(capsys.readouterr().out.split())


def test_a_refusal_that_quotes_a_line_break_is_one_line(tmp_path, capsys):
    """Was: a --workspace holding a newline made the refusal two lines (the second "error: b ...")."""
    code, out, err = _in_process_cli(capsys, "status", "--workspace", str(tmp_path / "a\nerror: b"))
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("error: workspace ") and "a\\nerror: b does not exist" in err


def test_in_process_cli_written_counts_a_piece_whose_name_ends_another_ones(tmp_path):
    """One piece written, the rest still the stub: that piece alone is done, in every module (the
    stub's message of f16_to_f32 is the tail of bf16_to_f32's, f32_to_f16's of explain_f32_to_f16's)."""
    from tl_lab.lab.exercise.cli import written
    from tl_lab.lab.exercise.stubs import _header, blank

    ws = tmp_path / "ws"
    ws.mkdir()
    for module, pieces in registry.PIECES.items():
        names = [p.qualname for p in pieces]
        for q in names:
            rest = set(names) - {q}
            (ws / f"{module}.py").write_text(_header(module) + blank(reference_source(module), module, rest))
            assert [k for k, v in written(ws, module).items() if v] == [q], (module, q)


@pytest.mark.parametrize("value", ["-5", "0", "nan", "inf"])
def test_in_process_cli_check_refuses_a_time_limit_that_is_not_positive(tmp_path, capsys, value):
    """--timeout -5 had every test "ran longer" or the run "not run" (a correct module failing): now refused."""
    ws = workspace(tmp_path, "reference", ["sample"])
    code, out, err = _in_process_cli(capsys, "check", "sample", "--timeout", value, "--workspace", str(ws))
    assert (code, out) == (2, "") and err == f"error: --timeout must be a number of seconds, more than 0 and at most a day (86400), got {float(value)!r}\n"
    assert not (ws / ".tl_lab").exists()  # nothing was run


def test_in_process_cli_parity_holds_the_stub_even_when_TL_LAB_WORKSPACE_installed_it(tmp_path, capsys, monkeypatch):
    """An untouched stub of TL_LAB_WORKSPACE is the learner's in parity (was: the reference held to the
    golden files, 12/12, exit 0, in its place). And --workspace naming another folder wins over TL_LAB_WORKSPACE's."""
    from tl_lab.lab.exercise import workspace as wsm

    stub = workspace(tmp_path / "a", "stub", ["sample"])
    monkeypatch.setenv(wsm.ENV, str(stub))
    code, out, _ = _in_process_cli(capsys, "parity", "rng")
    assert code == 1 and out.splitlines()[0].startswith(f"your {stub / 'sample.py'}")
    assert "raised NotImplementedError: Pcg32.__init__: not written yet" in out

    mine = workspace(tmp_path / "b", "reference", ["sample"])
    code, out, _ = _in_process_cli(capsys, "parity", "rng", "--workspace", str(mine))
    assert code == 0 and out.splitlines()[0].startswith(f"your {mine / 'sample.py'}")


def test_in_process_cli_tests_marks_the_results_of_a_file_changed_since(tmp_path, capsys):
    """The catalogue's last column is of the text the check graded: once sample.py changes, its
    results say "(old)" and a line says which file (was: "passed" beside a file reset to the stub)."""
    import json

    from tl_lab.lab.exercise.grading import STATUS_DIR, file_digest

    ws = tmp_path / "ws"
    (ws / STATUS_DIR).mkdir(parents=True)
    (ws / "sample.py").write_text(reference_source("sample"), encoding="utf-8")
    name = next(g.name for g in CATALOGUE if g.module == "sample")
    entry = {"state": "passed", "passed": 1, "total": 1, "when": "then", "results": {name: "passed"},
             "digest": file_digest(ws / "sample.py")}
    (ws / STATUS_DIR / "status.json").write_text(json.dumps({"sample": entry}), encoding="utf-8")
    row = lambda out: next(line for line in out.splitlines() if line.startswith(name))  # noqa: E731
    code, out, _ = _in_process_cli(capsys, "tests", "--workspace", str(ws))
    assert code == 0 and row(out).split()[3] == "passed" and "changed since" not in out
    (ws / "sample.py").write_text(stub_source("sample"), encoding="utf-8")
    code, out, _ = _in_process_cli(capsys, "tests", "--workspace", str(ws))
    assert row(out).split()[3:5] == ["passed", "(old)"] and "*" not in out
    assert out.splitlines()[-1] == "(old): a result of an earlier text of sample.py, changed since its last check"


def _grade_workspaces(tmp_path):
    """Two learners: one who only ran start, one whose kv and sample are the reference's."""
    from tl_lab.lab.exercise.cli import start

    start(tmp_path / "ann", ["kv"])
    (tmp_path / "bob").mkdir()
    for m in ("kv", "sample"):
        (tmp_path / "bob" / f"{m}.py").write_text(reference_source(m), encoding="utf-8")
    return tmp_path / "ann", tmp_path / "bob"


def test_in_process_cli_grade_checks_each_workspace_and_writes_a_gradebook(tmp_path, capsys):
    """One line a learner on stdout and one CSV row each: the verdict, the chapter tests passed of 24, each
    module's state, tests and the sha256 of the file graded; each workspace keeps its own status.json."""
    import csv
    import hashlib

    from tl_lab.lab.exercise.gradebook import COLUMNS

    ann, bob = _grade_workspaces(tmp_path)
    book = tmp_path / "grades.csv"
    code, out, err = _in_process_cli(capsys, "grade", str(ann), str(bob), "--out", str(book))
    assert code == 1 and err == "", err
    lines = out.splitlines()
    assert lines[0].startswith(f"{ann}  failed  0/24  kv not started 0/4 · quant not started 0/3")
    assert lines[1].startswith(f"{bob}  failed  11/24  kv passed 4/4 · quant not started 0/3") and "sample passed 7/7" in lines[1]
    assert lines[2] == f"0 of 2 workspaces pass; gradebook: {book}"
    with open(book, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == COLUMNS and [r["workspace"] for r in rows] == [str(ann), str(bob)]
    assert [(r["verdict"], r["passed"], r["total"]) for r in rows] == [("failed", "0", "24"), ("failed", "11", "24")]
    assert rows[1]["kv_digest"] == hashlib.sha256((bob / "kv.py").read_bytes()).hexdigest() and rows[1]["quant_digest"] == ""
    assert (bob / ".tl_lab" / "status.json").is_file() and not (tmp_path / "grades.csv.partial").exists()


@pytest.mark.parametrize("argv, says", [
    (["@ann", "@ann/../ann"], "is named twice"),
    (["@ann", "@nobody"], "does not exist"),
    (["@ann", "--out", "@grades.txt"], "--out must name a .csv file"),
    (["@ann", "--out", "@no/such/folder/grades.csv"], "not a file in a folder that can be written"),
    (["@ann", "--out", "@ann"], "--out must name a .csv file"),
    (["@ann", "--out", "@folder.csv"], "not a file in a folder that can be written"),
    (["@ann", "@bob", "--out", "@grades.csv", "--unwritable", "@bob"], "is not writable"),
    (["@ann", "--timeout", "0"], "--timeout must be a number of seconds, more than 0"),
])
def test_in_process_cli_grade_refuses_bad_input_before_grading_anyone(tmp_path, capsys, monkeypatch, argv, says):
    """Each refusal exit 2 in one line with nobody graded and nothing written. Permissions through
    os.access (these tests may run as root, who writes anything)."""
    import os

    ann, bob = _grade_workspaces(tmp_path)
    (tmp_path / "folder.csv").mkdir()
    argv = [a.replace("@", f"{tmp_path}/") for a in argv]
    if "--unwritable" in argv:
        i = argv.index("--unwritable")
        locked, real = argv[i + 1], os.access
        del argv[i:i + 2]
        monkeypatch.setattr(os, "access", lambda path, mode: not (str(path) == locked and mode & os.W_OK) and real(path, mode))
    if "--out" not in argv:
        argv += ["--out", str(tmp_path / "grades.csv")]
    code, out, err = _in_process_cli(capsys, "grade", *argv)
    assert code == 2 and out == "" and err.startswith("error: ") and says in err and err.count("\n") == 1, err
    assert not (ann / ".tl_lab").exists() and not (bob / ".tl_lab").exists() and not list(tmp_path.glob("grades*"))


def test_in_process_grade_interrupted_keeps_the_rows_done_and_the_old_gradebook(tmp_path, monkeypatch):
    """Stopped after the first learner (Ctrl-C): the row done is in grades.csv.partial, and the gradebook
    of an earlier run is still whole under its name."""
    from tl_lab.lab.exercise import gradebook

    ann, bob = _grade_workspaces(tmp_path)
    book = tmp_path / "grades.csv"
    book.write_text("an earlier gradebook\n")
    real = gradebook.check

    def check(ws, *a, **k):
        if ws == bob:
            raise KeyboardInterrupt
        return real(ws, *a, **k)

    monkeypatch.setattr(gradebook, "check", check)
    with pytest.raises(KeyboardInterrupt):
        gradebook.grade([ann, bob], book, timeout=60, ref_deps=False, say=lambda line: None)
    assert book.read_text() == "an earlier gradebook\n"
    partial = (tmp_path / "grades.csv.partial").read_text().splitlines()
    assert len(partial) == 2 and partial[1].startswith(f"{ann},failed,0,24,")


def test_in_process_gradebook_row_passes_only_when_all_six_modules_pass(tmp_path):
    """The verdict and the sums from check's rows (a learner who passes everything takes a minute's check:
    rows stand in for it here); `when` is the local time as status.json writes it."""
    import re

    from tl_lab.lab.exercise.grading import Row
    from tl_lab.lab.exercise.gradebook import gradebook_row
    from tl_lab.lab.exercise.registry import MODULES, graded

    rows = [Row(m, "passed", f"{m}.py", passed=len(graded(m)), digest=m * 2) for m in MODULES]
    row = gradebook_row(tmp_path, rows, 61.04)
    assert (row["verdict"], row["passed"], row["total"], row["seconds"]) == ("passed", 24, 24, "61.0")
    assert (row["sample_state"], row["sample_passed"], row["sample_total"], row["sample_digest"]) == ("passed", 7, 7, "samplesample")
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", row["when"]), row["when"]
    rows[-1] = Row("sample", "failed", "sample.py", passed=6)
    failed = gradebook_row(tmp_path, rows, 1.0)
    assert (failed["verdict"], failed["passed"]) == ("failed", 23)


def test_in_process_grade_checks_all_six_with_the_options_given(tmp_path, monkeypatch):
    """Each workspace is checked as `check --workspace WS --ref-deps --timeout S` would: all six modules,
    the options passed on, and the hints' commands carrying the workspace (named)."""
    from tl_lab.lab.exercise import gradebook
    from tl_lab.lab.exercise.grading import Row
    from tl_lab.lab.exercise.registry import MODULES

    ann, bob = _grade_workspaces(tmp_path)
    calls = []

    def check(ws, modules=None, **kw):
        calls.append((ws, list(modules), kw))
        return [Row(m, "passed", f"{m}.py") for m in MODULES]

    monkeypatch.setattr(gradebook, "check", check)
    rows = gradebook.grade([bob, ann], tmp_path / "g.csv", timeout=7.5, ref_deps=True, say=lambda line: None)
    assert calls == [(w, list(MODULES), {"ref_deps": True, "timeout": 7.5, "named": True}) for w in (bob, ann)]
    assert [r["verdict"] for r in rows] == ["passed", "passed"]


def test_reset_and_start_are_all_or_nothing_with_unique_temporary_names(tmp_path, capsys, monkeypatch):
    """Issue #61: a folder named .kv.py.new made reset move kv.py to the backup and then fail (no kv.py); a
    dangling-link kv.py was "wrote a fresh stub" with none written; two `start kv` at once collided on
    .kv.py.new; a kv.py that is a folder was a bare "error: Is a directory", exit 1. Now: the stub is written
    under a unique name first, the old file kept, then renamed over; every OS error names its file, exit 2."""
    import os
    from concurrent.futures import ThreadPoolExecutor

    from tl_lab.lab.exercise import workspace as wsm
    from tl_lab.lab.exercise.cli import reset, start

    ws = tmp_path / "ws"
    start(ws, ["kv"])
    (ws / "kv.py").write_text("mine\n", encoding="utf-8")
    (ws / ".kv.py.new").mkdir()
    code, out, err = _in_process_cli(capsys, "reset", "kv", "--workspace", str(ws))
    assert code == 0 and (ws / "kv.py").read_text(encoding="utf-8") == stub_source("kv")
    backup = next(ws.glob("kv.py.bak-*"))
    assert backup.read_text(encoding="utf-8") == "mine\n" and (ws / ".kv.py.new").is_dir()
    (ws / "kv.py").unlink()
    (ws / "kv.py").symlink_to(tmp_path / "nowhere")  # dangling: kept as the backup, the stub written
    code, out, err = _in_process_cli(capsys, "reset", "kv", "--workspace", str(ws))
    assert code == 0 and not (ws / "kv.py").is_symlink() and (ws / "kv.py").read_text(encoding="utf-8") == stub_source("kv")
    assert any(b.is_symlink() for b in ws.glob("kv.py.bak-*"))
    (ws / "kv.py").unlink()
    (ws / "kv.py").mkdir()
    code, out, err = _in_process_cli(capsys, "reset", "kv", "--workspace", str(ws))
    assert (code, out) == (2, "") and err == f"error: {ws / 'kv.py'}: a folder, not a file: move it away first\n"
    assert (ws / "kv.py").is_dir() and len(list(ws.glob("kv.py.bak-*"))) == 2  # nothing moved
    assert not [p for p in os.listdir(ws) if p.endswith(".new") and p != ".kv.py.new"]  # no temporary left

    two = tmp_path / "two"
    two.mkdir()
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda _: start(two, ["kv"]), range(24)))
    assert sum(r == [("kv.py", "wrote")] for r in results) == 1  # one wrote, the others saw it
    assert (two / "kv.py").read_text(encoding="utf-8") == stub_source("kv") and os.listdir(two) == ["kv.py"]

    repo = tmp_path / "repo"
    (repo / "tl_lab").mkdir(parents=True)
    (repo / "tl_lab" / "kv.py").write_text("the reference\n", encoding="utf-8")
    monkeypatch.setattr(wsm, "REPO_ROOT", repo)
    with pytest.raises(ExerciseError, match="inside the repository"):
        reset(repo / "tl_lab", "kv")
    assert os.listdir(repo / "tl_lab") == ["kv.py"]


def test_names_with_terminal_escapes_are_shown_escaped_and_a_null_byte_has_its_line(tmp_path, capsys):
    from tl_lab.lab.exercise import guard
    from tl_lab.lab.exercise.workspace import NotUtf8Error, read_source

    ws = tmp_path / "w\x1b[2J\x07"
    code, out, err = _in_process_cli(capsys, "status", "--workspace", str(ws))
    assert code == 2 and "\x1b" not in err and "\x07" not in err and "w\\x1b[2J\\x07" in err
    ws.mkdir()
    (ws / "kv.py").write_bytes(b"x = 1\r\ny = 2\n\x00\n")
    with pytest.raises(NotUtf8Error) as got:
        read_source(ws / "kv.py")
    fault = guard.blame(got.value, ws, "kv")
    assert fault.at == f"{ws / 'kv.py'}:3" and "null byte" in fault.error and "remove the null byte at line 3" in fault.hint


def test_status_and_hint_read_a_huge_learner_file_bounded(tmp_path, capsys, monkeypatch):
    """Issue #61: a 100 MB kv.py was read whole and parsed (26-38 s) by status and hint."""
    import ast

    from tl_lab.lab.exercise.stubs import written

    ws = tmp_path / "ws"
    ws.mkdir()
    with open(ws / "kv.py", "wb") as f:
        f.truncate(100 << 20)  # sparse: 100 MB
    real = ast.parse
    monkeypatch.setattr(ast, "parse", lambda src, *a, **k: pytest.fail("parsed the learner's file")
                        if len(src) > 1 << 20 else real(src, *a, **k))
    assert not any(written(ws, "kv").values())
    for argv in (["status"], ["hint", "kv"]):
        code, out, err = _in_process_cli(capsys, *argv, "--workspace", str(ws))
        assert code == 0 and err == "", argv


def test_in_process_grade_writes_a_row_for_each_learner_whatever_happens_to_another(tmp_path, monkeypatch):
    """Issue #61: a workspace removed during the grade (or any error of one learner's check) aborted the
    whole class; it is now that learner's row, and the next learner is graded."""
    import shutil

    from tl_lab.lab.exercise import gradebook
    from tl_lab.lab.exercise.grading import Row
    from tl_lab.lab.exercise.registry import MODULES

    ann, bob = _grade_workspaces(tmp_path)

    def check(ws, modules=None, **kw):
        if ws == ann:
            shutil.rmtree(ann)  # removed while it is graded: whatever check raises then
            raise RuntimeError("the workspace went away")
        return [Row(m, "passed", f"{m}.py") for m in MODULES]

    monkeypatch.setattr(gradebook, "check", check)
    rows = gradebook.grade([ann, bob], tmp_path / "g.csv", timeout=60, ref_deps=False, say=lambda line: None)
    assert [(r["workspace"], r["verdict"]) for r in rows] == [(str(ann), "failed"), (str(bob), "passed")]
    assert len((tmp_path / "g.csv").read_text().splitlines()) == 3


def _sample_raising(ws, body: str):
    """The workspace's sample.py (the reference) with `sample()` replaced by `body`'s lines -> (file, the
    line number of body's first line)."""
    f = ws / "sample.py"
    ref = reference_source("sample")
    head = "def sample(*a, **k):\n"
    text = ref.replace("def sample(", head + "".join(f"    {s}\n" for s in body.splitlines()) + "\n\ndef _was_sample(", 1)
    f.write_text(text, encoding="utf-8")
    return f, text[: text.index(head)].count("\n") + 2


def test_generate_takes_a_learners_keyboard_interrupt_as_their_error_and_a_real_ctrl_c_as_130(tmp_path):
    """Issue #61: a `raise KeyboardInterrupt` in the learner's sample() under TL_LAB_WORKSPACE was "interrupted",
    exit 130, as if the user had pressed Ctrl-C. It is their error now (exit 4, their file and line); a real
    Ctrl-C (SIGINT) while their code runs still stops the command with 130."""
    import os
    import signal
    import subprocess
    import time

    from tl_lab.lab.exercise.workspace import REPO_ROOT

    ws = workspace(tmp_path, "reference", ["sample"])
    f, line = _sample_raising(ws, "raise KeyboardInterrupt('mine')")
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "TL_LAB_WORKSPACE": str(ws)}
    argv = [sys.executable, "-m", "tl_lab", "generate", "--model", "bigram", "--prompt", "ab", "--max-tokens", "2"]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 4 and len(p.stderr.splitlines()) == 1, p.stderr
    assert f"raised at {f}:{line} in sample: KeyboardInterrupt: mine" in p.stderr, p.stderr
    ready = tmp_path / "ready"
    _sample_raising(ws, f"import pathlib, time\npathlib.Path({str(ready)!r}).touch()\ntime.sleep(60)")
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        t0 = time.monotonic()
        while not ready.exists() and time.monotonic() - t0 < 60:
            time.sleep(0.05)
        p.send_signal(signal.SIGINT)  # the user's Ctrl-C, landing in the learner's code
        _, err = p.communicate(timeout=60)
    finally:
        p.kill()
    assert p.returncode == 130 and err == "interrupted\n", err


def test_try_takes_a_learners_keyboard_interrupt_as_the_cases_error(tmp_path):
    """Issue #61: a KeyboardInterrupt (or SystemExit) the learner's piece raised ended `exercise try`'s child:
    "ran longer than 60 s or crashed: the run ended without a verdict (exit code 130)". Each case now says
    it raised, at the learner's file and line, as any error."""
    from tl_lab.lab.exercise.tries import try_piece

    ws = workspace(tmp_path, "reference", ["sample"])
    f, line = _sample_raising(ws, "raise KeyboardInterrupt('mine')")
    res = try_piece("sample.sample", ws)
    assert not res.passed and res.note == "", res.note
    mine = [c for c in res.cases if c.yours[:5] == ["raised", "KeyboardInterrupt", "mine", str(f), line]]
    assert mine and all(not c.ok for c in mine) and "yours raised KeyboardInterrupt" in mine[0].difference()
    f.write_text(reference_source("sample") + "\nraise KeyboardInterrupt('at import')\n", encoding="utf-8")
    n = f.read_text().count("\n")
    res = try_piece("sample.sample", ws)
    assert res.note == f"your sample.py does not import: {f}:{n}: KeyboardInterrupt: at import", res.note
