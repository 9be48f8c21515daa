"""tl_lab/lab/pitfalls.py: the chapter's 22 pitfalls (section 5), switched on as real edits of the real code.

The registry and the hook are tested here; test_every_pitfall_is_caught runs the whole check (each
pitfall's test off and on, one pytest subprocess per run), the "Done means" of issue 9.
"""

import json
import os
import re
import subprocess
import sys
from dataclasses import replace

import pytest

from tl_lab.lab import pitfalls as pf
from tl_lab.__main__ import main
from tl_lab.ops.paths import REPO_ROOT

# The chapter's section-4 catalogue, in its order (kv_pool_bounds... and kv_pool_exports... are
# listed twice there): each must be a test of ours under its name, `test_<name>`.
SECTION_4 = [
    "hand_example_sampling", "pcg32_reference_vectors", "sampler_matches_l81_golden",
    "greedy_takes_no_draw_and_sampling_takes_one", "top_p_keeps_the_crossing_token",
    "penalties_follow_hf_and_openai_semantics", "seeded_sampling_matches_the_distribution",
    "kv_pool_bounds_and_cache_lifecycle", "kv_pool_evicts_the_oldest_cached_block",
    "kv_pool_rejects_zero_capacity", "kv_pool_exports_and_imports_rust_owned_blocks",
    "f16_rounds_to_nearest_even", "int4_hand_example", "q4_linear_matches_its_dequantized_weights",
    "safetensors_reader_rules", "config_refuses_what_the_engine_cannot_run", "bigram_checkpoint_still_serves",
    "tiny_llama_logits_match_hf", "tiny_llama_greedy_matches_hf", "incremental_decode_equals_full_prefill",
    "batched_forward_equals_single", "run_once_returns_its_blocks", "int4_runner_matches_its_dequantized_model",
    "forward_refuses_bad_batches",
]


def _test_defs() -> set[str]:
    names = set()
    for path in (REPO_ROOT / "tests").glob("test_*.py"):
        names |= set(re.findall(r"^def (test_\w+)\(", path.read_text(encoding="utf-8"), re.M))
    return names


def _run(args: list[str], pitfall: str | None) -> subprocess.CompletedProcess:
    """`python *args` in a subprocess with TL_LAB_PITFALL=pitfall (unset when None)."""
    env = {k: v for k, v in os.environ.items() if k != pf.ENV}
    env["PYTHONPATH"] = str(REPO_ROOT)
    if pitfall:
        env[pf.ENV] = pitfall
    return subprocess.run([sys.executable, *args], cwd=REPO_ROOT, env=env, capture_output=True,
                          text=True, timeout=120)


def _run_python(code: str, pitfall: str | None) -> subprocess.CompletedProcess:
    return _run(["-c", code], pitfall)


# ------------------------------------------------------------------ the registry


def test_the_registry_holds_the_chapters_22():
    assert list(pf.PITFALLS) == [f"s{i:02d}" for i in range(1, 23)]
    defs = _test_defs()
    for p in pf.PITFALLS.values():
        path, name = p.test.split("::")
        assert (REPO_ROOT / path).is_file(), p.id
        assert name in defs, f"{p.id}: {p.test} does not exist"
        assert name.startswith(f"test_{p.chapter_test}"), f"{p.id}: {name} is not the chapter's {p.chapter_test}"
        assert p.chapter_test in SECTION_4, p.id
        assert p.mistake and p.symptom and p.edits, p.id
        assert p.probe is None or p.probe in pf.PROBES, p.id
        if p.notebook:
            assert (REPO_ROOT / "notebooks" / f"{p.notebook}.ipynb").is_file(), p.id
            assert p.cell, p.id


def sections_named(cell: str) -> set[str]:
    """The section numbers a registry `cell` names: "8. Chunk invariance (and 2. One layer, ...)" -> {"8", "2"}."""
    return set(re.findall(r"(?:^|[;,(]\s*(?:and\s+)?)(\d+)\. ", cell))


def notebook_05_table() -> dict[str, set[str]]:
    """05_forward's own table, "Pitfalls of this section": pitfall id -> the sections whose cells fail."""
    nb = json.loads((REPO_ROOT / "notebooks" / "05_forward.ipynb").read_text(encoding="utf-8"))
    (table,) = ["".join(c["source"]) for c in nb["cells"]
                if c["cell_type"] == "markdown" and "".join(c["source"]).startswith("## Pitfalls of this section")]
    rows = re.findall(r"^\| (s\d\d) \|[^|\n]+\| ([^|\n]+) \|", table, re.M)
    return {pid: set(re.findall(r"\b(\d+) \(", where)) for pid, where in rows}


def test_the_registry_and_05s_pitfall_table_name_the_same_sections():
    """The lab (10_pitfalls' table, the pitfall lab's "also seen in") and 05_forward's own table say where
    each of the forward's pitfalls shows. Was: the registry left out 9 (the f16 bound) for s13, s14, s15,
    s17 and s20, and 2 (one layer) for s14, s15 and s22, and 6 for s14; 05's table was what running 05
    with each pitfall on fails (tests/test_notebooks.py runs it)."""
    table = notebook_05_table()
    in_05 = {p.id for p in pf.PITFALLS.values() if p.notebook == "05_forward"}
    assert set(table) == in_05 == {"s13", "s14", "s15", "s16", "s17", "s20", "s21", "s22"}
    for pid, sections in table.items():
        assert sections and sections_named(pf.get(pid).cell) == sections, (pid, pf.get(pid).cell, sorted(sections))


def test_every_section_4_test_exists_under_its_name():
    defs = _test_defs()
    # safetensors_reader_rules is a family, test_safetensors_reader_rules_<rule>; the others are one test
    missing = [n for n in SECTION_4 if f"test_{n}" not in defs
               and not any(d.startswith(f"test_{n}_") for d in defs)]
    assert missing == []


@pytest.mark.parametrize("pid", list(pf.PITFALLS))
def test_every_edit_is_found_exactly_once_and_compiles(pid):
    for module in pf.get(pid).modules:
        original = pf.module_path(module).read_text(encoding="utf-8")
        patched = pf.patched_source(module, [pid])
        assert patched != original
    diffs = pf.function_diff(pid)
    assert len(diffs) == len(pf.get(pid).edits)
    for d in diffs:
        assert any(s.startswith("-") for s in d["diff"]) or any(s.startswith("+") for s in d["diff"])
        assert d["file"].startswith("tl_lab/") and d["function"]


def test_ids_are_parsed_and_unknown_ones_refused():
    assert pf.parse_ids("s13, S20,s13") == ("s13", "s20")
    assert pf.parse_ids("") == ()
    for bad in ("s23", "13", "s13,x"):
        with pytest.raises(pf.PitfallError, match="unknown pitfall"):
            pf.parse_ids(bad)


def test_an_edit_not_found_exactly_once_is_refused_naming_the_pitfall(monkeypatch):
    src = "def f(x):\n    y = x + 1\n    return y + 1\n\n\ndef g():\n    return 1\n"
    ok = pf.Edit("tl_lab.sample", "f", "y = x + 1", "y = x - 1")
    assert pf.apply_edit(src, ok, "s01") == src.replace("y = x + 1", "y = x - 1")
    for edit, words in [
        (replace(ok, correct="+ 1"), ["s01", "found 2 times", "tl_lab.sample.f"]),  # twice in f
        (replace(ok, correct="return 1"), ["s01", "found 0 times"]),  # only in another function
        (replace(ok, function="h"), ["s01", "tl_lab.sample.h not found"]),
    ]:
        with pytest.raises(pf.PitfallError) as exc:
            pf.apply_edit(src, edit, "s01")
        for w in words:
            assert w in str(exc.value)
    # a registry entry gone stale (the code moved) refuses to switch on, naming the pitfall
    stale = replace(pf.get("s13"), edits=(replace(pf.get("s13").edits[0], correct="rope_cos_sin(step.pos, D)"),))
    monkeypatch.setitem(pf.PITFALLS, "s13", stale)
    with pytest.raises(pf.PitfallError, match="pitfall s13: the correct text"):
        pf.patched_source("tl_lab.forward", ["s13"])


def test_install_refuses_a_module_already_imported():
    import tl_lab.kv  # noqa: F401  (imported: an edit could no longer reach it)

    before = list(sys.meta_path)
    with pytest.raises(pf.PitfallError, match="tl_lab.kv is already imported"):
        pf.install("s18")
    assert sys.meta_path == before and pf.active() == ()


# ------------------------------------------------------------------ the hook, in subprocesses


def test_the_env_var_switches_the_real_module_in_a_subprocess():
    code = ("import json, os, inspect, tl_lab.lab.pitfalls as p, tl_lab.kv as kv;"
            "print(json.dumps([p.active(), os.environ.get('NUMBA_CACHE_DIR'), kv.__file__,"
            " 'last=True' in inspect.getsource(kv.KvPool.alloc)]))")
    on = _run_python(code, "s18,s14")
    assert on.returncode == 0, on.stderr
    ids, numba_dir, path, buggy = json.loads(on.stdout)
    assert ids == ["s18", "s14"] and buggy
    assert path == str(REPO_ROOT / "tl_lab" / "kv.py")  # compiled under its real filename
    # s14 edits a compiled kernel: its machine code is cached apart from the correct kernel's
    assert "numba-pitfalls" in numba_dir and "s18-s14-" in numba_dir
    no_kernel = _run_python(code, "s18,s13")  # no kernel edited: the normal cache is the right code
    assert no_kernel.returncode == 0, no_kernel.stderr
    assert json.loads(no_kernel.stdout)[:2] == [["s18", "s13"], None]
    off = _run_python(code, None)
    assert json.loads(off.stdout)[0] == [] and json.loads(off.stdout)[3] is False
    # a bad id stops the first import of a tl_lab module, naming it (`import tl_lab` keeps the error
    # so that the command line can say it in one line: tests/test_hardening.py)
    bad = _run_python("import tl_lab.kv", "s99")
    assert bad.returncode != 0 and "PitfallError" in bad.stderr and "s99" in bad.stderr


def test_a_patched_module_really_behaves_differently():
    off, on = pf.probe("lru_eviction"), pf.probe("lru_eviction", "s18")
    assert off["lru"] == on["lru"] == [2, 0, 3, 1]
    assert off["taken"] == [4, 5, 2, 0, 3, 1]  # free blocks first, then the oldest released
    assert on["taken"] == [4, 5, 1, 3, 0, 2]  # the newest released goes first


def test_generate_on_the_command_line_runs_the_broken_code():
    args = ["-m", "tl_lab", "generate", "--model", "tiny-llama", "--prompt", "The KV cache",
            "--temperature", "0", "--max-tokens", "16"]
    off, again, on = _run(args, None), _run(args, None), _run(args, "s20")
    assert off.returncode == again.returncode == on.returncode == 0, on.stderr
    assert off.stdout == again.stdout  # greedy: the same text every time ...
    assert on.stdout != off.stdout  # ... except with RoPE's frequencies reversed


def test_run_test_reports_pass_fail_and_errors_apart():
    test = pf.get("s18").test
    caught = pf.run_test(test, "s18")
    assert caught.outcome == "failed" and caught.pitfall == "s18"
    assert "assert" in caught.message and caught.seconds > 0
    # a pitfall another test cannot see: that test passes with it on (not caught by it)
    assert pf.run_test(pf.get("s19").test, "s18").outcome == "passed"
    # a node that does not exist is no verdict at all, never "failed"
    assert pf.run_test("tests/test_kv.py::test_no_such_test", "s18").outcome in ("error", "not run")


def test_the_check_runs_the_reference_whatever_the_callers_workspace(tmp_path, monkeypatch, capsys):
    """TL_LAB_WORKSPACE naming a workspace whose kv.py has s18 in it: `pitfalls --check s18` still checks the
    reference (was: that kv.py ran off and on, "s18 NOT caught: off failed, on failed"). The runs' environment
    is the caller's with TL_LAB_WORKSPACE off, TL_LAB_PITFALL, colour and PYTHONPATH set, nothing else."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "kv.py").write_text(pf.patched_source("tl_lab.kv", ["s18"]), encoding="utf-8")
    monkeypatch.setenv("TL_LAB_WORKSPACE", str(ws))
    monkeypatch.setenv("FORCE_COLOR", "1")
    env = pf._env(("s18",))
    assert env["TL_LAB_WORKSPACE"] == "off" and env["TL_LAB_PITFALL"] == "s18"
    changed = {k for k in env.keys() | os.environ.keys() if env.get(k) != os.environ.get(k)}
    assert changed <= {"TL_LAB_WORKSPACE", "TL_LAB_PITFALL", "FORCE_COLOR", "PY_COLORS", "PYTHONPATH"}, changed
    assert main(["pitfalls", "--check", "s18", "--jobs", "1"]) == 0
    assert "1 of 1 caught" in capsys.readouterr().out


def test_cli_lists_the_22(capsys):
    assert main(["pitfalls"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 22
    assert lines[12].startswith("s13") and "tl_lab.forward" in lines[12]
    assert "test_incremental_decode_equals_full_prefill" in lines[12]
    # an unknown id is a usage error (was exit 1, the code of a pitfall not caught), said in one line
    assert main(["pitfalls", "--check", "s18", "s99"]) == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err == (f"error: --check: unknown pitfall 's99': the chapter's are "
                                         f"{', '.join(f's{i:02d}' for i in range(1, 23))}\n")
    # an empty id (an unset shell variable) is a usage error, never all 22 checked (was: 95 s of runs)
    assert main(["pitfalls", "--check", ""]) == 2
    assert capsys.readouterr().err.startswith("error: --check: no pitfall id in ''")
    assert main(["pitfalls", "--check", "s18", "--jobs", "1"]) == 0
    out = capsys.readouterr().out
    assert "s18  test_kv_pool_evicts_the_oldest_cached_block" in out and "passed  failed" in out
    assert "1 of 1 caught" in out


def test_every_pitfall_is_caught(record_property):
    """The check over all 22: each test passes with its pitfall off and fails with it on. The table ends
    the run's output (tests/conftest.py)."""
    rows = pf.check(jobs=2)
    table = pf.format_table(rows)
    record_property("summary", table)
    assert len(rows) == 22
    assert [r.id for r in rows if not r.caught] == [], table
    assert table.endswith("22 of 22 caught")


def test_switched_on_changes_the_engine_in_process_and_puts_it_back():
    import importlib
    import inspect

    import numpy as np

    import tl_lab
    import tl_lab.kv as kv_before
    import tl_lab.runner as runner_before
    from tl_lab.ops.paths import DATA_DIR

    off = pf.PROBES["lru_eviction"]()
    z_off = runner_before.ModelRunner.load(DATA_DIR / "tiny-llama").run_once([1, 2, 3])[1]
    with pf.switched_on("s18,s20") as ids:
        assert ids == ("s18", "s20") and pf.active() == ids
        on = pf.PROBES["lru_eviction"]()  # imports tl_lab.kv inside the block: the patched one
        runner_in = importlib.import_module("tl_lab.runner")
        assert runner_in is not runner_before
        # the runner is bound to the patched forward, not to the one imported before the block
        assert runner_in.llama_forward is sys.modules["tl_lab.forward"].llama_forward
        assert runner_in.llama_forward is not runner_before.llama_forward
        z_on = runner_in.ModelRunner.load(DATA_DIR / "tiny-llama").run_once([1, 2, 3])[1]
        with pytest.raises(pf.PitfallError, match="already on"):
            with pf.switched_on("s01"):
                pass
    assert off["taken"] == [4, 5, 2, 0, 3, 1] and on["taken"] == [4, 5, 1, 3, 0, 2]
    assert np.abs(z_on - z_off).max() > 0.1  # RoPE reversed: the engine path really changed
    # afterwards: the very same module objects, the correct code, nothing left switched on
    assert pf.active() == () and sys.modules["tl_lab.kv"] is kv_before and tl_lab.kv is kv_before
    assert importlib.import_module("tl_lab.runner") is runner_before
    assert pf.PROBES["lru_eviction"]() == off
    assert "last=False" in inspect.getsource(kv_before.KvPool.alloc)  # no broken text left in linecache
    z_after = runner_before.ModelRunner.load(DATA_DIR / "tiny-llama").run_once([1, 2, 3])[1]
    assert np.array_equal(z_after, z_off)


def test_a_verdict_is_plain_text_even_when_the_kernel_forces_colour(monkeypatch):
    """A notebook kernel sets FORCE_COLOR; pytest would then colour its report, and the lab would show
    escape codes on the page (seen in the README's picture before this was fixed)."""
    monkeypatch.setenv("FORCE_COLOR", "1")
    run = pf.run_test(pf.get("s18").test, "s18")
    assert run.outcome == "failed", run
    assert "x1B" not in run.message and "\x1b" not in run.message, run.message


# ------------------------------------------------------------------ the probes the pitfall lab draws


def _bf16_widened(values) -> bool:
    """Every value a BF16 widened to f32: its low 16 bits zero."""
    import numpy as np

    return not (np.asarray(values, np.float32).view(np.uint32) & 0xFFFF).any()


def _within_hf(m) -> bool:
    return all(e <= b for e, b in zip(m["errors"], m["bounds"], strict=True))


def _beyond_hf(m) -> bool:
    return all(e > 10 * b for e, b in zip(m["errors"], m["bounds"], strict=True))


# pitfall -> (the correct code's measurement, the broken code's): what the lab's picture shows
SYMPTOMS = {
    "s04": (lambda m: m["kept"] == [0, 1] and m["cum"][-1] == 0.5 and min(m["counts"][:2]) > 150
            and sum(m["counts"][2:]) == 0,
            lambda m: len(m["kept"]) == 3 and m["counts"][2] > 0),
    # the histogram's 40 bins span -1 .. 1 ulp and hold every value, rounded or truncated
    "s08": (lambda m: abs(m["mean_ulp"]) < 0.01 and -0.5 <= m["min_ulp"] and m["max_ulp"] <= 0.5
            and m["edges"][0] == -1.0 and m["edges"][-1] == 1.0 and len(m["counts"]) == 40
            and sum(m["counts"]) == 20_000,
            lambda m: m["mean_ulp"] < -0.45 and m["max_ulp"] <= 0.0 and m["min_ulp"] < -0.9),
    "s12": (lambda m: m["non_finite"] == 0 and _bf16_widened(m["values"]) and m["max_abs"] < 1.2,
            lambda m: not _bf16_widened(m["values"])),
    "s13": (lambda m: len(m["gaps"]) == 15 and max(m["gaps"]) < 1e-4,
            lambda m: m["gaps"][0] < 1e-4 and min(m["gaps"][1:]) > 1.0),
    "s15": (_within_hf, _beyond_hf),
    "s16": (_within_hf, _beyond_hf),
    "s17": (lambda m: m["free"] == [32] * 11,
            lambda m: all(b < a for a, b in zip(m["free"], m["free"][1:])) and m["free"][0] == 32),
    "s18": (lambda m: m["taken"] == [4, 5, *m["lru"]] and m["lru"] == [2, 0, 3, 1],
            lambda m: m["taken"][:2] == [4, 5] and m["taken"][2:] != m["lru"]),
    "s19": (lambda m: m["refused_at"].startswith("KvPool(") and "n_blocks" in m["error"],
            lambda m: m["refused_at"] == "pool.alloc(1), later"),
    "s20": (lambda m: m["inv_freq"][0] == 1.0 and m["inv_freq"] == sorted(m["inv_freq"], reverse=True),
            lambda m: m["inv_freq"][-1] == 1.0 and m["inv_freq"] == sorted(m["inv_freq"])),
    "s21": (lambda m: all(r["raised"] == "BatchError" and "outside the vocabulary" in r["error"] for r in m.values()),
            lambda m: all(r["raised"] != "BatchError" for r in m.values()) and m["[5, -1]"]["raised"] is None
            and m["[5, -1]"]["error"].startswith("ran: ")),  # the lab's words for a forward that ran
    "s22": (_within_hf, _beyond_hf),
}


def test_every_probe_but_the_kernels_has_its_symptom_here():
    """All but s14, which edits a compiled kernel: switched on in this process it would compile every
    kernel into a cache of its own (a minute). Its probe is s13's; its test catches it in
    test_every_pitfall_is_caught, and the lab draws it from a subprocess."""
    probed = {p.id for p in pf.PITFALLS.values() if p.probe}
    assert probed - set(SYMPTOMS) == {"s14"} and set(SYMPTOMS) <= probed


@pytest.mark.parametrize("pid", sorted(SYMPTOMS))
def test_each_probe_shows_its_symptom_only_with_its_pitfall_on(pid):
    """The lab's picture measures the code it runs: the correct code shows no symptom, the pitfall's
    code shows the one the chapter names (measured in this process, `switched_on`)."""
    name = pf.get(pid).probe
    healthy, broken = SYMPTOMS[pid]
    off = pf.PROBES[name]()
    with pf.switched_on(pid):
        on = pf.PROBES[name]()
    assert healthy(off) and not healthy(on), (off, on)
    assert broken(on) and not broken(off), (off, on)


# ------------------------------------------------------------------ a verdict, the check's workers, install


def _junit(tmp_path, *cases: str):
    """A junit report of these <testcase> bodies ("" for a pass)."""
    path = tmp_path / "report.xml"
    body = "".join(f'<testcase name="t{i}">{c}</testcase>' for i, c in enumerate(cases))
    path.write_text(f'<testsuites><testsuite name="pytest">{body}</testsuite></testsuites>')
    return path


@pytest.mark.parametrize("cases, verdict", [
    (("",), ("passed", "")),
    (('<skipped message="needs SmolLM2">skip text</skipped>',), ("skipped", "needs SmolLM2\nskip text")),
    (('<failure message="assert 1 == 2">tb</failure>',), ("failed", "assert 1 == 2\ntb")),
    (('<error message="fixture broke"/>',), ("error", "fixture broke")),
    # the worst of several cases (a parametrized node): a failure outranks a skip and a pass
    (("", '<skipped message="s"/>', '<failure message="f"/>'), ("failed", "f")),
    (('<skipped message="s"/>', ""), ("skipped", "s")),
])
def test_a_verdict_is_the_worst_case_of_the_report(tmp_path, cases, verdict):
    assert pf._outcome(_junit(tmp_path, *cases)) == verdict


def test_the_check_runs_no_more_tests_at_once_than_its_jobs(monkeypatch):
    import threading

    lock, now, most = threading.Lock(), [0], [0]

    def fake_run(test, pitfall=None, timeout=600.0):
        with lock:
            now[0] += 1
            most[0] = max(most[0], now[0])
        threading.Event().wait(0.05)  # long enough for a second worker to start, were there one
        with lock:
            now[0] -= 1
        return pf.TestRun(pitfall, test, "failed" if pitfall else "passed", "", 0.05)

    monkeypatch.setattr(pf, "run_test", fake_run)
    rows = pf.check(["s01", "s08", "s18"], jobs=1)
    assert most[0] == 1 and all(r.caught for r in rows) and [r.id for r in rows] == ["s01", "s08", "s18"]
    most[0] = 0
    pf.check(["s01", "s08", "s18"], jobs=2)
    assert most[0] == 2


def test_install_switches_the_pitfall_on_ahead_of_every_other_finder(monkeypatch):
    import importlib
    import inspect

    import tl_lab
    import tl_lab.kv

    # the process's import state as it was, whatever install does to it
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    monkeypatch.delitem(sys.modules, "tl_lab.kv")
    monkeypatch.setattr(tl_lab, "kv", tl_lab.kv)
    assert pf.install("s18") == ("s18",) and pf.active() == ("s18",)
    assert isinstance(sys.meta_path[0], pf.PitfallFinder)  # first: it serves the edited text, not the file's
    kv = importlib.import_module("tl_lab.kv")
    assert "last=True" in inspect.getsource(kv.KvPool.alloc) and kv.__file__ == str(pf.module_path("tl_lab.kv"))
    monkeypatch.delitem(sys.modules, "tl_lab.kv")  # the edited module goes with the test


def test_a_probe_measures_this_repository_from_any_working_directory(tmp_path, monkeypatch):
    """A folder named tl_lab where the caller stands (a learner's copy, say) must not be what it measures."""
    (tmp_path / "tl_lab").mkdir()
    (tmp_path / "tl_lab" / "__init__.py").write_text("raise ImportError('the wrong tl_lab')")
    monkeypatch.chdir(tmp_path)
    assert pf.probe("zero_pool")["refused_at"].startswith("KvPool(")


def test_a_kernel_pitfall_compiles_into_a_numba_cache_of_its_own_edits(monkeypatch):
    """numba keys its cache by file and function, not by the code: each set of pitfalls (and of their
    exact edits) gets its own folder under the lab's cache, never the normal one."""
    from tl_lab.ops.paths import cache_dir

    one, two = pf.numba_cache_dir(["s14"]), pf.numba_cache_dir(["s14", "s08"])
    assert one.parent == two.parent == cache_dir() / "numba-pitfalls"
    assert one.name.startswith("s14-") and two.name.startswith("s14-s08-") and one != two
    assert pf.numba_cache_dir(["s14"]) == one and len(one.name.split("-")[-1]) == 12  # the same edits, the same folder
    edited = replace(pf.get("s14"), edits=[*pf.get("s14").edits[:-1], ("x", "y", "z", "w")])
    monkeypatch.setattr(pf, "get", lambda i: edited if i == "s14" else pf.PITFALLS[i])
    assert pf.numba_cache_dir(["s14"]).name.startswith("s14-") and pf.numba_cache_dir(["s14"]) != one  # new edits


def test_a_bad_setting_refuses_every_later_tl_lab_import_but_the_command_lines(monkeypatch):
    from tl_lab.lab.switch import RefusingFinder

    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    error = pf.PitfallError("TL_LAB_PITFALL=s99: no such pitfall")
    pf.refuse_imports(error)
    finder = sys.meta_path[0]
    assert isinstance(finder, RefusingFinder) and pf.env_error() is error
    for name in ("tl_lab.kv", "tl_lab.lab.widgets.int4", "tl_lab.lab.exercise"):
        with pytest.raises(pf.PitfallError, match="^TL_LAB_PITFALL=s99: no such pitfall$"):
            finder.find_spec(name)
    for name in ("tl_lab.__main__", "tl_lab.errors", "numpy", "tl_lab"):
        assert finder.find_spec(name) is None, name
