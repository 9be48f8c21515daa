"""benchmarks/bench_smollm2.py's fractions: each speed row over its limit at its thread count, and batch 8's
bounds over the row's own batch 1, at the sgemm rate and at the FMA peak where the run measured one."""

import pytest
from bench_module import load

bench = load("bench_smollm2")

COSTS = {"prefill_flop_per_token": 1e9, "decode_flop_per_token": 2.5e8}


def _row(threads="1") -> dict:
    return {"engine": "tl_lab", "weights": "int4 g32", "threads": int(threads) if threads != "default" else threads,
            "weights_MB": 100.0, "prefill_tok_s": 50.0, "decode_b1_tok_s": 100.0, "decode_b8_tok_s": 300.0}


def test_batch_8_is_bounded_by_the_longer_of_reading_and_its_arithmetic_at_the_sgemm_rate_and_at_the_peak():
    limits = {"read_GBps": {"1": 20.0}, "sgemm_GFLOPs": {"1": {"best": 100.0}}, "fma_GFLOPs": {"1": 125.0}}
    r = _row()
    bench.add_fractions([r], limits, COSTS, cores=1)
    assert r["decode_b1 / bandwidth"] == pytest.approx(100 * 100 * 2**20 / 20e9)
    assert r["prefill / sgemm"] == pytest.approx(50 * 1e9 / 100e9)
    assert r["decode_b8 / b1"] == 3.0
    # 8 tokens' 2e9 operations: 20 ms at 100 GFLOP/s, 16 ms at 125 (the read, 5.2 ms, is shorter)
    assert r["decode_b8 / b1 ceiling"] == pytest.approx(8 / 100 / 0.020)
    assert r["decode_b8 / b1 at the FMA peak"] == pytest.approx(8 / 100 / 0.016)


def test_a_run_without_the_peak_gets_no_bound_at_it_and_the_read_bounds_where_it_is_longer():
    limits = {"read_GBps": {"2": 1.0}, "sgemm_GFLOPs": {"2": {"best": 100.0}}}
    r = _row("2")
    bench.add_fractions([r], limits, COSTS, cores=2)
    assert "decode_b8 / b1 at the FMA peak" not in r
    assert r["decode_b8 / b1 ceiling"] == pytest.approx(8 / 100 / (100 * 2**20 / 1e9))  # 105 ms of reading
