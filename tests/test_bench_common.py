"""benchmarks/_common.py: the machine's limits a benchmark divides by. The sgemm limit is the fastest
library's, each library's rates kept beside it; the best of several runs keeps, limit by limit,
the largest reading and the library that gave it; a results file lands beside the last run on the
same processor. Rates are the benchmark's to measure: these tests hand them in."""

import json
import os
import re
import subprocess
import sys
import types

import pytest

import tl_lab.ops.machine

from bench_module import load

common = load("_common")
SMALL, LARGE = common.SHAPE_KEYS


def _rates(by: str, small: float, large: float) -> dict:
    return {SMALL: small, LARGE: large, "best": max(small, large), "by": by}


def _fake_torch(threads: list) -> types.ModuleType:
    """A stand-in for torch: its thread count (recorded) and a version; no products."""
    torch = types.ModuleType("torch")
    torch.__version__, torch.from_numpy = "9.9", lambda a: a
    torch.get_num_threads, torch.set_num_threads = lambda: 4, threads.append
    return torch


def test_sgemm_limit_is_the_fastest_library_per_shape(monkeypatch):
    readings = iter([{SMALL: 90.0, LARGE: 120.0}, {SMALL: 200.0, LARGE: 110.0}])
    monkeypatch.setattr(common, "_sgemm_rates", lambda rounds, wrap=None: next(readings))
    monkeypatch.delenv("OPENBLAS_CORETYPE", raising=False)
    threads = []
    monkeypatch.setitem(sys.modules, "torch", _fake_torch(threads))
    out = common.sgemm_gflops(2, rounds=1)
    assert threads == [2, 4]  # torch measured at the count asked, its own count given back
    torch_name, numpy_name = list(out["by_library"])
    assert torch_name.startswith("torch ") and numpy_name.startswith("numpy ")
    assert (out[SMALL], out[LARGE]) == (200.0, 120.0)  # each shape its fastest library's rate
    assert out["by"] == numpy_name  # the library with the single fastest rate


def test_sgemm_limit_without_torch_is_numpys(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch raises ImportError
    monkeypatch.delenv("OPENBLAS_CORETYPE", raising=False)
    monkeypatch.setattr(common, "_sgemm_rates", lambda rounds, wrap=None: {SMALL: 50.0, LARGE: 70.0})
    out = common.sgemm_gflops(1, rounds=1)
    assert list(out["by_library"]) == [out["by"]] and out["by"].startswith("numpy ")
    assert (out[SMALL], out[LARGE]) == (50.0, 70.0)


def test_best_roofline_keeps_each_largest_reading_and_who_gave_it():
    runs = [{"read_GBps": {"1": 20.0, "2": 18.0}, "sgemm_GFLOPs": {"1": _rates("torch", 90, 100), "2": _rates("torch", 150, 140)}},
            {"read_GBps": {"1": 25.0, "2": 30.0}, "sgemm_GFLOPs": {"1": _rates("numpy", 200, 80), "2": _rates("numpy", 120, 130)}}]
    best = common.best_roofline(runs)
    assert best["read_GBps"] == {"1": 25.0, "2": 30.0}
    one, two = best["sgemm_GFLOPs"]["1"], best["sgemm_GFLOPs"]["2"]
    assert (one[SMALL], one[LARGE], one["best"], one["by"]) == (200, 100, 200, "numpy")
    # two threads: at least one thread's limit (a thread can idle), the second run never better here
    assert (two[SMALL], two[LARGE], two["best"]) == (200, 140, 200) and two["by"] == "numpy on 1 thread"


def test_best_roofline_keeps_the_largest_fma_peak_at_least_one_threads_and_none_where_runs_have_none():
    runs = [{"read_GBps": {"1": 20.0, "2": 18.0}, "fma_GFLOPs": {"1": 110.0, "2": 100.0},
             "sgemm_GFLOPs": {"1": _rates("torch", 90, 100), "2": _rates("torch", 150, 140)}},
            {"read_GBps": {"1": 25.0, "2": 30.0}, "fma_GFLOPs": {"1": 116.0, "2": 90.0},
             "sgemm_GFLOPs": {"1": _rates("numpy", 200, 80), "2": _rates("numpy", 120, 130)}}]
    assert common.best_roofline(runs)["fma_GFLOPs"] == {"1": 116.0, "2": 116.0}
    for r in runs:
        del r["fma_GFLOPs"]  # a run from before the peak was measured
    assert common.best_roofline(runs)["fma_GFLOPs"] == {}


def test_best_roofline_names_the_library_of_the_best_rate_not_of_a_better_shape():
    runs = [{"read_GBps": {"1": 20.0}, "sgemm_GFLOPs": {"1": _rates("torch", 100, 150)}},
            {"read_GBps": {"1": 20.0}, "sgemm_GFLOPs": {"1": _rates("numpy", 120, 90)}}]
    one = common.best_roofline(runs)["sgemm_GFLOPs"]["1"]
    assert (one[SMALL], one[LARGE], one["best"], one["by"]) == (120, 150, 150, "torch")


def test_best_roofline_keeps_each_librarys_best_of_the_runs():
    runs = [{"read_GBps": {"1": 1.0}, "sgemm_GFLOPs": {"1": {**_rates("torch", 90, 100), "by_library": {
                "torch": {SMALL: 90, LARGE: 100}, "numpy": {"error": "it died"}}}}},
            {"read_GBps": {"1": 1.0}, "sgemm_GFLOPs": {"1": {**_rates("numpy", 95, 200), "by_library": {
                "torch": {SMALL: 95, LARGE: 80}, "numpy": {SMALL: 50, LARGE: 200}}}}}]
    libs = common.best_roofline(runs)["sgemm_GFLOPs"]["1"]["by_library"]
    assert libs == {"torch": {SMALL: 95, LARGE: 100}, "numpy": {SMALL: 50, LARGE: 200}}
    assert runs[0]["sgemm_GFLOPs"]["1"]["by_library"]["torch"] == {SMALL: 90, LARGE: 100}  # the runs unchanged


def test_report_writes_the_latest_and_the_processors_own_file(tmp_path, monkeypatch):
    monkeypatch.setattr(common, "RESULTS", tmp_path)
    monkeypatch.setattr(common, "machine", lambda: {"llvm_host_cpu": "somecpu"})
    out = common.report("demo", [{"x": 1}], "n", {"read_GBps": {"1": 1.0}, "sgemm_GFLOPs": {"1": {"best": 2.0}}},
                        extra={"profile": [3]})
    data = json.loads(out.read_text())
    assert out == tmp_path / "demo.json" and data["profile"] == [3] and data["rows"] == [{"x": 1}]
    assert json.loads((tmp_path / "machines" / "demo.somecpu.json").read_text()) == data


def test_sgemm_limit_also_asks_openblas_without_a_core_type_the_host_set(monkeypatch):
    # OpenBLAS reads OPENBLAS_CORETYPE once, at load: its own choice of kernels needs a fresh process
    monkeypatch.setitem(sys.modules, "torch", None)
    monkeypatch.setenv("OPENBLAS_CORETYPE", "Haswell")
    monkeypatch.setattr(common, "_sgemm_rates", lambda rounds, wrap=None: {SMALL: 1.0, LARGE: 1.0})
    out = common.sgemm_gflops(1, rounds=1)
    as_set, own = list(out["by_library"])
    assert as_set.endswith("(OPENBLAS_CORETYPE=Haswell)") and own.endswith("(its own kernels)")
    measured = out["by_library"][own]  # the fresh process measured for real
    assert set(measured) == {SMALL, LARGE} and min(measured.values()) > 1.0
    assert out["by"] == own and out[SMALL] == measured[SMALL]


def test_the_machine_record_says_when_the_run_began():
    """The README's table names a column by it: the minute, UTC, the benchmark's process began."""
    started = common.machine()["started"]
    assert started == common.STARTED
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d", started), started


def test_a_held_run_writes_its_own_file_beside_the_hosts_and_says_so(tmp_path, monkeypatch):
    monkeypatch.setattr(common, "RESULTS", tmp_path)
    monkeypatch.setenv(common.HELD, "avx2")
    monkeypatch.setattr(tl_lab.ops.machine, "describe", lambda: {"llvm_host_cpu": "somecpu"})
    (tmp_path / "machines").mkdir()
    host = tmp_path / "machines" / "demo.somecpu.json"
    host.write_text("the host's own run")
    out = common.report("demo", [{"x": 1}], measure_limits=False)
    data = json.loads(out.read_text())
    assert out == tmp_path / "demo-as-avx2.json" and data["name"] == "demo-as-avx2"
    assert data["machine"]["held_to"] == "avx2"
    assert json.loads((tmp_path / "machines" / "demo-as-avx2.somecpu.json").read_text()) == data
    assert host.read_text() == "the host's own run" and not (tmp_path / "demo.json").exists()


def test_a_held_run_measures_openblas_as_it_set_it_only(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)
    monkeypatch.setenv("OPENBLAS_CORETYPE", "Haswell")
    monkeypatch.setenv(common.HELD, "avx2")
    monkeypatch.setattr(common, "_sgemm_rates", lambda rounds, wrap=None: {SMALL: 1.0, LARGE: 2.0})
    out = common.sgemm_gflops(1, rounds=1)
    assert list(out["by_library"]) == [out["by"]] and out["by"].endswith("(OPENBLAS_CORETYPE=Haswell)")


def test_a_held_run_refuses_libraries_on_other_instructions(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)
    monkeypatch.setenv(common.HELD, "avx2")
    monkeypatch.setattr(common, "blas_core", lambda: "SkylakeX")
    with pytest.raises(SystemExit, match="--as avx2: numpy's OpenBLAS runs SkylakeX kernels, not Haswell"):
        common.check_held()
    monkeypatch.setattr(common, "blas_core", lambda: "Haswell")
    common.check_held()  # held as it should be
    monkeypatch.delenv(common.HELD)
    monkeypatch.setattr(common, "blas_core", lambda: "SkylakeX")
    common.check_held()  # the host's own run asks nothing


def test_the_held_environment_reaches_every_library():
    env = common.AS["avx2"]
    assert "avx512" not in env["NUMBA_CPU_FEATURES"] and "+avx2" in env["NUMBA_CPU_FEATURES"]
    assert env["OPENBLAS_CORETYPE"] == "Haswell" and env["ATEN_CPU_CAPABILITY"] == "avx2"
    code = "import _common; _common.check_held(); print(_common.blas_core())"  # torch too, where installed
    run = subprocess.run([sys.executable, "-c", code], cwd=common.RESULTS.parent, capture_output=True, text=True,
                         env={**os.environ, **env, common.HELD: "avx2"}, check=False)
    assert run.returncode == 0 and run.stdout.split() == ["Haswell"], run.stderr


def test_every_benchmark_answers_help_and_refuses_a_wrong_option_before_measuring():
    """`--help` prints what a benchmark does; an option it does not take is refused (exit 2). Neither
    measures nor writes a result (three benchmarks had ignored their arguments and run in full)."""
    results = common.RESULTS
    before = {p: p.stat().st_mtime_ns for p in results.rglob("*")}
    for script in sorted(results.parent.glob("bench_*.py")):
        for arg, code, stream in (("--help", 0, "stdout"), ("--no-such-option", 2, "stderr")):
            run = subprocess.run([sys.executable, str(script), arg], cwd=results.parent, capture_output=True,
                                 text=True, timeout=60)
            assert run.returncode == code, (script.name, arg, run.stderr[-500:])
            assert "usage:" in getattr(run, stream), (script.name, arg)
    assert {p: p.stat().st_mtime_ns for p in results.rglob("*")} == before
