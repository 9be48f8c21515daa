"""tools/mutation.py, the mutation-testing driver (issue 20): its pieces that need no mutmut run.

The run itself takes minutes per module (tools/mutation.sh); here: every hand-written kernel mutant
still applies (its text found exactly once, as a pitfall's edit must be), the mutmut configuration a
module gets, and how mutmut's exit codes are scored.
"""

import json

import pytest

from conftest import tool
from tl_lab.ops.paths import REPO_ROOT

mutation = tool("mutation")


@pytest.mark.parametrize("name, file, old, new", mutation.KERNEL_MUTANTS, ids=[m[0] for m in mutation.KERNEL_MUTANTS])
def test_every_kernel_mutant_applies_once_and_changes_the_text(name, file, old, new):
    assert (REPO_ROOT / file).read_text().count(old) == 1, f"{name}: the kernel moved; update KERNEL_MUTANTS"
    assert old != new


def test_each_module_is_mutated_alone_with_its_own_tests():
    for module, selection in mutation.MODULES.items():
        assert (REPO_ROOT / mutation._source(module)).is_file() and (REPO_ROOT / selection[0]).is_file()
        cfg = mutation._setup_cfg(module, selection)
        assert f"only_mutate = {mutation._source(module)}\n" in cfg and f"    {selection[0]}\n" in cfg
    assert mutation._source("kv") == "tl_lab/kv.py"
    assert mutation._source("widgets.int4") == "tl_lab/lab/widgets/int4.py"  # a module of a subpackage


def test_mutmut_exit_codes_are_scored():
    assert [mutation._status(c) for c in (None, 2, 0, 1, 33, 5, -24, 152, 34)] == \
        ["not run", "not run", "survived", "killed", "no tests", "no tests", "killed", "killed", "other"]


def test_the_summary_has_every_labels_score_per_module():
    results = {"before": {"fetch": {"score": 0.5, "killed": 1, "tried": 2}},
               "after": {"fetch": {"score": 1.0, "killed": 2, "tried": 2}, "runner": {"score": None, "killed": 0, "tried": 0}}}
    assert mutation.summary(results) == {
        "fetch": {"after": 1.0, "after_killed_of_tried": "2/2", "before": 0.5, "before_killed_of_tried": "1/2"},
        "runner": {"after": None, "after_killed_of_tried": "0/0"}}


def test_every_module_runs_its_mutants_on_a_fork_safe_threading_layer(tmp_path, monkeypatch):
    """GNU OpenMP hangs a forked run at its first parallel kernel: every module gets workqueue, or TBB
    where its tests launch kernels from two Python threads at two kernel threads (the pipeline), and a
    missing TBB is named with what to install."""
    for module in mutation.MODULES:
        env = mutation._mutmut_env(module) if module != "pipeline" else mutation.FORK_SAFE[module]
        assert env["NUMBA_THREADING_LAYER"] in ("workqueue", "tbb"), module
    assert mutation.FORK_SAFE["pipeline"]["NUMBA_THREADING_LAYER"] == "tbb"
    monkeypatch.setattr(mutation, "TBB_LIB", tmp_path)
    with pytest.raises(SystemExit, match="pip install 'tbb<2023'"):
        mutation._mutmut_env("pipeline")
    (tmp_path / "libtbb.so.12").touch()
    monkeypatch.setenv("LD_LIBRARY_PATH", "/elsewhere")  # set after import: the run still keeps it, after TBB's
    env = mutation._mutmut_env("pipeline")
    assert env["NUMBA_THREADING_LAYER"] == "tbb" and env["LD_LIBRARY_PATH"] == f"{tmp_path}:/elsewhere"
    monkeypatch.delenv("LD_LIBRARY_PATH")
    assert mutation._mutmut_env("pipeline")["LD_LIBRARY_PATH"] == str(tmp_path)


def _no_runs(monkeypatch, ran: list, machine: dict) -> None:
    """main() with mutmut's runs replaced by a note of the module asked for, on `machine`."""
    monkeypatch.setattr(mutation, "_machine", lambda: machine)
    monkeypatch.setattr(mutation, "run_module", lambda module, *a: ran.append(module) or
                        {"killed": 0, "tried": 0, "score": None, "mutants_in_module": 0, "seconds": 0})


def test_all_mutates_every_module_of_the_table(tmp_path, monkeypatch):
    """tools/mutation.sh passes `all`: the module list lives in MODULES alone."""
    ran = []
    _no_runs(monkeypatch, ran, {})
    assert mutation.main(["all", "--label", "t", "--out", str(tmp_path / "m.json")]) == 0
    assert ran == list(mutation.MODULES)
    assert "tools/mutation.py \"${args[@]}\" --kernels all" in (REPO_ROOT / "tools" / "mutation.sh").read_text()


def test_each_label_keeps_the_machine_it_ran_on(tmp_path, monkeypatch):
    """A later run on another machine used to overwrite the one machine of the file: an older label's
    scores then claimed the newer machine. Each label has its own; `machine` is the last run's."""
    out = tmp_path / "m.json"
    for label, cpu in (("first", "processor A"), ("second", "processor B")):
        _no_runs(monkeypatch, [], {"processor": cpu})
        mutation.main(["kv", "--label", label, "--out", str(out)])
    doc = json.loads(out.read_text())
    assert doc["machines"] == {"first": {"processor": "processor A"}, "second": {"processor": "processor B"}}
    assert doc["machine"] == {"processor": "processor B"}
