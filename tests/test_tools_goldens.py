"""tools/make_goldens.py: Hugging Face's own forward of data/tiny-llama gives the committed golden file.

Needs the hf extra (torch, transformers); without it the test fails with the install command.
"""

import base64
import json

import numpy as np
import pytest

from conftest import need, tool
from tl_lab.ops.paths import DATA_DIR, GOLDEN_DIR

pytestmark = pytest.mark.hf

TINY = DATA_DIR / "tiny-llama"


def _f32(s):
    return np.frombuffer(base64.b64decode(s), dtype="<f4")


def test_goldens_rederive_from_transformers(tmp_path, capsys):
    need("torch")
    need("transformers")
    make = tool("make_goldens")
    out = tmp_path / "tiny_llama_hf.json"
    make.main(["--model", str(TINY), "--out", str(out)])
    assert "wrote" in capsys.readouterr().out
    made = json.loads(out.read_text())
    committed = json.loads((GOLDEN_DIR / "tiny_llama_hf.json").read_text())
    assert len(made["cases"]) == len(committed["cases"]) == len(make.LENGTHS)
    for m, c in zip(made["cases"], committed["cases"]):
        n = len(c["tokens"])
        assert m["tokens"] == c["tokens"] and m["prompt"] == c["prompt"]
        # float32 on another CPU may differ in the last bits; on this one the file is reproduced exactly
        np.testing.assert_allclose(_f32(m["logits"]), _f32(c["logits"]), rtol=0, atol=1e-5,
                                   err_msg=f"{n}-token prompt: logits differ, rerun tools/make_goldens.py")
        np.testing.assert_allclose(m["gap"], c["gap"], rtol=0, atol=1e-4)
        for i, (a, b) in enumerate(zip(m["greedy"], c["greedy"])):
            if a != b:  # only a near-tie may flip across machines
                assert c["gap"][i] < 1e-4, f"{n}-token prompt, greedy step {i}: {a} != {b}"
                break
    assert sorted(len(c["tokens"]) for c in committed["cases"])[-1] > 64  # several KV blocks


def test_golden_file_format():
    """Plain JSON the tests read without torch: exact float32 logits, 32 greedy steps with gaps."""
    data = json.loads((GOLDEN_DIR / "tiny_llama_hf.json").read_text())
    assert data["greedy_steps"] == 32
    for c in data["cases"]:
        assert _f32(c["logits"]).shape == (256,)
        assert len(c["greedy"]) == len(c["gap"]) == 32 and min(c["gap"]) >= 0
        assert bytes(c["tokens"]).decode("ascii") == c["prompt"]


def test_untied_goldens_rederive_from_transformers(tmp_path):
    """tools/make_goldens.py --untied: HF's forward of data/tiny-llama-untied gives the committed
    data/golden/tiny_llama_untied_hf.json (issue 62)."""
    need("torch")
    need("transformers")
    make = tool("make_goldens")
    out = tmp_path / "untied.json"
    make.main(["--untied", "--out", str(out)])
    made = json.loads(out.read_text())
    committed = json.loads((GOLDEN_DIR / "tiny_llama_untied_hf.json").read_text())
    assert made["model"] == committed["model"] == "data/tiny-llama-untied"
    assert len(made["cases"]) == len(committed["cases"]) == len(make.LENGTHS)
    for m, c in zip(made["cases"], committed["cases"]):
        assert m["tokens"] == c["tokens"]
        np.testing.assert_allclose(_f32(m["logits"]), _f32(c["logits"]), rtol=0, atol=1e-5)
        for i, (a, b) in enumerate(zip(m["greedy"], c["greedy"])):
            if a != b:
                assert c["gap"][i] < 1e-4, f"{len(c['tokens'])}-token prompt, greedy step {i}: {a} != {b}"
                break
