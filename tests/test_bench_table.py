"""benchmarks/table.py: docs/speed.md's speed table and issue 21's goals are the results files' figures,
a goal is called missed exactly when a figure falls below its bar, and a default-count run the host
disturbed is void rather than read as the engine's speed."""

import copy
import json

import pytest
from bench_module import load

table = load("table")


def _engine(b1: float, b8: float, **fractions) -> dict:
    return {"decode_b1_tok_s": b1, "decode_b8_tok_s": b8, **fractions}


def _doc(cpu="znver4", started="2026-12-05 15:34") -> dict:
    """A run that meets every goal, each figure just at or above its bar."""
    rows = []
    for t in (1, 2):
        rows += [
            {"engine": "tl_lab", "weights": "f32", "threads": t, "prefill / sgemm": 0.6,
             "decode_b1 / bandwidth": 0.8, **_engine(40.0, 200.0)},
            {"engine": "tl_lab", "weights": "int4 g32", "threads": t, **_engine(80.0, 400.0)},
            {"engine": "tl_lab f32 / transformers", "weights": "ratio", "threads": t,
             "decode_b1_tok_s": 1.5, "prefill_tok_s": 1.0},
            {"engine": "tl_lab int4 g32 / llama.cpp", "weights": "ratio", "threads": t, "decode_b1_tok_s": 1.0},
        ]
    rows += [
        {"engine": "tl_lab", "weights": "f32, quiet", "threads": "default", "decode_b1 / bandwidth": 0.7,
         **_engine(40.0, 200.0)},
        {"engine": "busy / quiet", "weights": "ratio", "threads": "default", "decode_b1_tok_s": 0.5},
    ]
    machine = {"cpu_model": "Intel(R) Xeon(R) Processor", "llvm_host_cpu": cpu, "started": started,
               "isa": ["avx2", "avx512f", "amx_tile"]}
    limits = {"read_GBps": {"1": 30.0, "2": 40.0}, "sgemm_GFLOPs": {"1": {"best": 100.0}, "2": {"best": 200.0}}}
    return {"machine": machine, "roofline": limits, "rows": rows}


def _row(doc: dict, engine: str, weights: str, threads) -> dict:
    return next(r for r in doc["rows"] if (r["engine"], r["weights"], r["threads"]) == (engine, weights, threads))


def test_readme_speed_table_is_the_results_files():
    readme = table.PAGE.read_text()
    assert table.section(table.load_runs()) in readme, (
        "docs/speed.md's speed table differs from benchmarks/results/machines/: run python benchmarks/table.py --write")


def test_a_run_at_every_bar_meets_every_goal():
    assert table.misses(table.Run(_doc())) == []
    assert table.goals([table.Run(_doc())]) == "- E: every goal met."


@pytest.mark.parametrize("engine, weights, threads, key, value, missed", [
    ("tl_lab f32 / transformers", "ratio", 2, "decode_b1_tok_s", 1.49, "f32 batch 1, 1.5x transformers (2t 1.49x)"),
    ("tl_lab int4 g32 / llama.cpp", "ratio", 1, "decode_b1_tok_s", 0.98, "int4 batch 1, llama.cpp's speed (1t 0.98x)"),
    ("tl_lab f32 / transformers", "ratio", 1, "prefill_tok_s", 0.9, "prefill, transformers' speed (1t 0.90x)"),
    ("tl_lab", "f32", 2, "prefill / sgemm", 0.596, "prefill, 60% of sgemm (2t 59.6%)"),
    ("tl_lab", "f32", 1, "decode_b8_tok_s", 196.0, "f32 batch 8, 5x batch 1 (1t 4.90x)"),
    ("tl_lab", "int4 g32", 2, "decode_b8_tok_s", 360.0, "int4 batch 8, 5x batch 1 (2t 4.50x)"),
    ("tl_lab", "f32, quiet", "default", "decode_b1 / bandwidth", 0.65,
     "f32 batch 1, 70% of the read bandwidth at the default count (65.0%)"),
    ("busy / quiet", "ratio", "default", "decode_b1_tok_s", 0.45,
     "batch 1 beside a busy core, half its quiet speed (0.45)"),
])
def test_a_figure_below_its_bar_is_the_goal_missed_with_that_figure(engine, weights, threads, key, value, missed):
    doc = _doc()
    _row(doc, engine, weights, threads)[key] = value
    assert table.misses(table.Run(doc)) == [missed]


def test_a_batch_8_miss_says_where_even_the_fma_peak_falls_short_of_5x():
    doc = _doc()
    for t, b8, peak in ((1, 200.0, 4.66), (2, 240.0, 6.3)):
        row = _row(doc, "tl_lab", "int4 g32", t)
        row["decode_b8_tok_s"], row["decode_b8 / b1 at the FMA peak"] = b8, peak
    assert table.misses(table.Run(doc)) == [
        "int4 batch 8, 5x batch 1 (1t 2.50x of at most 4.66x at the FMA peak, 2t 3.00x)"]


def test_batch_8_over_batch_1_is_the_recorded_ratio_where_the_run_kept_one():
    doc = _doc()
    _row(doc, "tl_lab", "f32", 1)["decode_b8 / b1"] = 4.0  # the bench's own division, preferred
    assert table.Run(doc).b8_over_b1("f32", 1) == 4.0
    assert table.Run(doc).b8_over_b1("f32", 2) == 5.0


def test_a_default_count_run_slower_than_one_thread_is_void_not_a_miss():
    doc = _doc()
    _row(doc, "tl_lab", "f32, quiet", "default")["decode_b1_tok_s"] = 31.9  # under 0.8 of the 1-thread 40
    _row(doc, "busy / quiet", "ratio", "default")["decode_b1_tok_s"] = 1.3  # over a disturbed quiet speed
    run = table.Run(doc)
    assert run.quiet_is_void()
    assert table.misses(run) == ["f32 batch 1, 70% of the read bandwidth at the default count (void)",
                                 "batch 1 beside a busy core, half its quiet speed (void)"]
    cells = dict((label, cell(run)) for label, cell in table.ROWS)
    assert cells["batch 1 with one core busy (kept of quiet speed)"] == "void"
    default = "f32 at the default thread count: batch 1's share of read bandwidth; batch 8 over batch 1"
    assert cells[default].startswith("void")
    _row(doc, "tl_lab", "f32, quiet", "default")["decode_b1_tok_s"] = 32.0
    assert not table.Run(doc).quiet_is_void()


def test_a_column_is_named_by_its_processor_letter_else_its_llvm_name_and_its_start():
    old, new = _doc("znver3", "2026-12-04 16:03"), _doc("sapphirerapids", "2026-12-06 05:00")
    head = table.table([table.Run(old), table.Run(new)])
    assert head.splitlines()[0] == ("| SmolLM2-135M | processor D, 2026-12-04 16:03 | "
                                    "processor sapphirerapids, 2026-12-06 05:00 |")


def test_load_runs_orders_newest_first(tmp_path):
    runs = (("znver3", "2026-12-04 16:03"), ("znver5", "2026-12-06 01:00"), ("znver4", "2026-12-05 15:34"))
    for cpu, started in runs:
        (tmp_path / f"smollm2.{cpu}.json").write_text(json.dumps(_doc(cpu, started)))
    (tmp_path / "targets.znver4.json").write_text("{}")  # another benchmark's file: not a column
    held = _doc("znver4", "2026-12-06 10:54")
    held["machine"]["held_to"] = "avx2"
    (tmp_path / "smollm2-as-avx2.znver4.json").write_text(json.dumps(held))
    assert [r.name for r in table.load_runs(tmp_path)] == ["C", "E", "D", "D's code on E"]  # held runs last


def test_the_cells_read_the_runs_figures():
    doc = copy.deepcopy(_doc())
    doc["machine"]["isa"] = ["avx2", "fma"]
    _row(doc, "tl_lab", "int4 g32", 1)["decode_b8 / b1 ceiling"] = 4.14
    _row(doc, "tl_lab", "int4 g32", 2)["decode_b8 / b1 ceiling"] = 5.27
    cells = dict((label, cell(table.Run(doc))) for label, cell in table.ROWS)
    assert cells["processor"] == "Intel Xeon, znver4, AVX2 only"
    limits = "limits, 1t / 2t: read; sgemm; FMA peak (runs since 2026-12-07)"
    assert cells[limits] == "30.0 / 40.0 GB/s; 100 / 200 GFLOP/s"  # a run from before the peak was measured
    doc["roofline"]["fma_GFLOPs"] = {"1": 116.4, "2": 235.0}
    assert dict(table.ROWS)[limits](table.Run(doc)) == "30.0 / 40.0 GB/s; 100 / 200 GFLOP/s; 116 / 235"
    assert cells["f32 decode batch 1 vs transformers (share of read bandwidth)"] == "1t 1.50x (80%), 2t 1.50x (80%)"
    assert cells["prefill 512 vs transformers (share of sgemm)"] == "1t 1.00x (60%), 2t 1.00x (60%)"
    assert cells["batch 8 over batch 1, int4 (the same)"] == "5.0x / 5.0x (4.1x / 5.3x)"
    assert cells["batch 8 over batch 1, f32 (1t / 2t; in brackets the most the run's limits allow)"] == (
        "5.0x / 5.0x (not computed in this run)")
    assert cells["batch 1 with one core busy (kept of quiet speed)"] == "0.50"
    doc["machine"]["held_to"] = "avx2"
    assert table.ROWS[0][1](table.Run(doc)) == "Intel Xeon, znver4, held to AVX2 only"


def test_write_replaces_only_what_lies_between_the_markers(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(f"before\n{table.BEGIN}\nold table\n{table.END}\nafter\n")
    table.write_readme(f"{table.BEGIN}\nnew\n{table.END}", readme=readme)
    assert readme.read_text() == f"before\n{table.BEGIN}\nnew\n{table.END}\nafter\n"
    assert [p.name for p in tmp_path.iterdir()] == ["README.md"]


def test_write_refuses_a_readme_without_the_markers_and_leaves_it_alone(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(f"{table.END}\nno table here\n{table.BEGIN}\n")
    with pytest.raises(SystemExit, match="are missing or out of order"):
        table.write_readme("anything", readme=readme)
    assert readme.read_text() == f"{table.END}\nno table here\n{table.BEGIN}\n"
