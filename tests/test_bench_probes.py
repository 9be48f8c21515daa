"""benchmarks/bench_probes.py: issue 20's probes, each run again as a fresh `python -m tl_lab` (or
`python -c`) process, give the right exit code and stderr lines and change nothing. Times and
memory are the benchmark's to measure (benchmarks/results/probes.json), never asserted here."""

import pytest
from bench_module import load

bench = load("bench_probes")


def _marks(probe):
    return [pytest.mark.smollm2] if probe.needs_smollm2 else []


@pytest.mark.parametrize("probe", [pytest.param(p, id=p.name, marks=_marks(p)) for p in bench.PROBES])
def test_each_probe_of_issue_20_gives_its_exit_code_and_lines_and_changes_nothing(tmp_path, probe):
    if probe.needs_smollm2 and not bench.smollm2_cached():
        pytest.fail("SmolLM2 is not in the cache; run: python -m tl_lab fetch smollm2", pytrace=False)
    row = bench.run_probe(probe, tmp_path)
    assert row["ok"], (row["problems"], row["stderr"])


def test_every_item_of_the_issue_has_a_probe():
    """Each of the issue's 17 items (bench.ITEMS) has a probe, and every probe is of one of them."""
    assert len(bench.ITEMS) == len(set(bench.ITEMS)) == 17
    assert {p.item for p in bench.PROBES} == set(bench.ITEMS)
    assert all(p.exit in (0, 1, 2, 3) and p.lines >= 0 for p in bench.PROBES)


def test_a_wrong_answer_is_reported(tmp_path):
    """The runner itself can fail a probe: a wrong exit code, an extra line, a missing word, a changed file."""
    probe = bench.Probe("self-test", "writes a file", code="open('@WORK@/x', 'w').write('x')", exit=1,
                        lines=1, words=("nope",))
    row = bench.run_probe(probe, tmp_path)
    assert not row["ok"]
    assert row["problems"][:3] == ["exit 0, expected 1", "0 stderr lines, expected 1", "stderr lacks ['nope']"]
    assert row["problems"][3].startswith("changed ['x']"), row["problems"]


@pytest.mark.parametrize("out", ["/tmp/elsewhere.json", "probes.json", "sub/probes", ""])
def test_out_is_a_results_name_and_a_path_is_refused_before_any_probe_runs(out, capsys):
    """--out names results/<name>.json; a path had been joined onto results/ as it came (an absolute
    one written outside it, as <path>.json)."""
    with pytest.raises(SystemExit) as stop:
        bench.main(["--out", out, "--only", "no probe is called this"])
    assert stop.value.code == 2 and "--out takes a name" in capsys.readouterr().err
