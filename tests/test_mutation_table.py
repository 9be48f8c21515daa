"""benchmarks/mutation_table.py: docs/dev/mutation.md's mutation table is results/mutation.json's runs, every
module measured has a row, and a mutant of the sample that was not tried is said, not dropped."""

import json

import pytest
from bench_module import load
from conftest import tool

table = load("table")  # first: mutation_table imports it, as a script beside it does
mt = load("mutation_table")


def _doc() -> dict:
    return json.loads(mt.MUTATION.read_text())


def test_readme_mutation_table_is_the_results_file():
    assert mt.section(_doc()) in mt.PAGE.read_text(), (
        "docs/dev/mutation.md's mutation table differs from benchmarks/results/mutation.json: "
        "run python benchmarks/mutation_table.py --write")


def test_every_module_measured_or_measurable_has_a_row():
    shown = {row[0] for row in mt.SHOWN}
    assert set(_doc()["summary"]) == shown
    assert set(tool("mutation").MODULES) | {"kernels (hand-written)"} == shown - set(mt.RETIRED)


def _run(killed, tried, no_tests=0, inside=255, not_run=0) -> dict:
    return {"killed": killed, "tried": tried, "no_tests": no_tests, "not_run": not_run, "other": 0,
            "mutants_in_module": inside}


def test_a_rerun_of_the_survivors_still_counts_the_mutants_no_test_reached(monkeypatch):
    doc = {"results": {"first": {"m": _run(6, 14, no_tests=26)},
                       "rerun": {"m": _run(14, 14, not_run=0)},
                       "whole": {"m": _run(38, 40)}}, "equivalent": []}
    monkeypatch.setattr(mt, "SHOWN", [("m", "a module", "first", "rerun", ""), ("m", "a module", "first", "whole", "n"),
                                      ("m", "a module", None, "whole", "")])
    rows = mt.table(doc).splitlines()[2:]
    assert rows[0] == "| `m` | a module | 40 of 255 | 6/14 (26 untried) | 14/14 (26 untried) |  |"
    assert rows[1] == "| `m` | a module | 40 of 255 | 6/14 (26 untried) | 38/40 | n |"
    assert rows[2] == "| `m` | a module | 40 of 255 | (one run) | 38/40 |  |"


def test_a_sample_of_every_mutant_and_the_hand_written_ones_are_named_so(monkeypatch):
    kernels = {"killed": 16, "tried": 17, "survived": 1}
    doc = {"results": {"a": {"m": _run(40, 40, inside=40), "kernels (hand-written)": kernels}}, "equivalent": []}
    monkeypatch.setattr(mt, "SHOWN", [("m", "x", None, "a", ""), ("kernels (hand-written)", "k", None, "a", "")])
    rows = mt.table(doc).splitlines()[2:]
    assert rows == ["| `m` | x | all 40 | (one run) | 40/40 |  |",
                    "| `kernels (hand-written)` | k | 17 hand-written | (one run) | 16/17 |  |"]


def test_a_row_naming_a_run_that_is_not_there_is_refused(monkeypatch):
    monkeypatch.setattr(mt, "SHOWN", [("m", "x", "gone", "a", "")])
    with pytest.raises(SystemExit, match="no run 'gone' of 'm'"):
        mt.table({"results": {"a": {"m": _run(1, 1)}}})


def test_write_puts_the_table_between_its_own_markers(tmp_path, monkeypatch):
    readme = tmp_path / "README.md"
    speed = f"{table.BEGIN}\nspeed\n{table.END}"
    readme.write_text(f"a\n{speed}\nb\n{mt.BEGIN}\nold\n{mt.END}\nc\n")
    monkeypatch.setattr(mt, "write_readme", lambda text, b, e, page: table.write_readme(text, b, e, readme=readme))
    assert mt.main(["--write"]) == 0
    assert readme.read_text() == f"a\n{speed}\nb\n{mt.section(_doc())}\nc\n"
