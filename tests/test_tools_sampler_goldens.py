"""tools/make_sampler_goldens.py: it reproduces the committed golden files byte for byte, and it
refuses to write anything when the numpy sampler and the reference disagree."""


import pytest

import tl_lab.sample as ts
from conftest import tool
from tl_lab.ops.paths import GOLDEN_DIR


def test_tool_reproduces_the_committed_golden_files(tmp_path, capsys):
    make = tool("make_sampler_goldens")
    assert make.main(["--out", str(tmp_path)]) == 0
    for name in ("pcg32.vectors.json", "sampler.json"):
        made, committed = (tmp_path / name).read_bytes(), (GOLDEN_DIR / name).read_bytes()
        assert made == committed, f"{name} differs from data/golden: rerun tools/make_sampler_goldens.py"
    assert "wrote" in capsys.readouterr().out


def test_tool_refuses_when_the_two_samplers_disagree(tmp_path, monkeypatch, capsys):
    make = tool("make_sampler_goldens")
    real = ts.sample

    def off_by_one_ulp(logits, params, prompt, output, rng):
        token, logprob = real(logits, params, prompt, output, rng)
        return token, logprob - abs(logprob) * 2**-52 - 5e-324

    monkeypatch.setattr(ts, "sample", off_by_one_ulp)
    assert make.main(["--out", str(tmp_path / "out")]) == 1
    assert "refusing to write" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
    with pytest.raises(make.GoldenMismatch, match="case 'greedy' step 0"):
        make.build_sampler_cases()


def test_tool_refuses_a_different_token_or_draw_count(monkeypatch):
    make = tool("make_sampler_goldens")
    real = ts.sample

    def extra_draw(logits, params, prompt, output, rng):
        out = real(logits, params, prompt, output, rng)
        if rng is not None and params.temperature != 0.0:
            rng.next_u32()
        return out

    monkeypatch.setattr(ts, "sample", extra_draw)
    with pytest.raises(make.GoldenMismatch, match="generator states"):
        make.build_sampler_cases()


def test_logits_rows_round_trip_exactly():
    import numpy as np

    make = tool("make_sampler_goldens")
    row = np.array([0.0, -0.0, 1.5, -3.25e-40, np.float32(0.1), 3.4e38], np.float32)
    text = make.encode_row(row)
    assert len(text) == 8 * row.size and text.startswith("0000000080000000")
    assert make.decode_row(text).view(np.uint32).tolist() == row.view(np.uint32).tolist()
