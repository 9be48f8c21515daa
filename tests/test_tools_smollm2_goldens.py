"""tools/make_smollm2_goldens.py: transformers on the fetched SmolLM2 gives the committed golden file.

In the hf step (needs torch, transformers, accelerate and the fetched model); without them it fails with
the install command."""

import json

import numpy as np
import pytest

from conftest import need, smollm2_path, tool
from tl_lab.ops.paths import GOLDEN_DIR

pytestmark = [pytest.mark.hf, pytest.mark.smollm2]


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    need("torch")
    need("transformers")
    need("accelerate")
    out = tmp_path_factory.mktemp("golden") / "smollm2_hf.json"
    tool("make_smollm2_goldens").main(["--model", str(smollm2_path()), "--out", str(out)])
    return json.loads(out.read_text())


COMMITTED = json.loads((GOLDEN_DIR / "smollm2_hf.json").read_text())


def test_the_script_rederives_the_committed_tokenizer_and_chat_answers(made):
    assert made["tokenizer"] == COMMITTED["tokenizer"]
    assert made["chat"] == COMMITTED["chat"]


def test_the_script_rederives_the_committed_logits(made):
    """float32 on another CPU may differ in the last bits; on this one the file is reproduced exactly."""
    for m, c in zip(made["logits"], COMMITTED["logits"], strict=True):
        assert m["ids"] == c["ids"] and m["probe_ids"] == c["probe_ids"]
        np.testing.assert_allclose(m["probe_logits"], c["probe_logits"], rtol=0, atol=1e-4)
        for key in ("max_abs", "logsumexp", "mean", "std"):
            assert abs(m[key] - c[key]) <= 1e-4, key


def test_the_script_rederives_the_committed_greedy_tokens(made):
    for m, c in zip(made["greedy"], COMMITTED["greedy"], strict=True):
        assert m["ids"] == c["ids"]
        np.testing.assert_allclose(m["gap"], c["gap"], rtol=0, atol=1e-4)
        for i, (a, b) in enumerate(zip(m["greedy"], c["greedy"], strict=True)):
            if a != b:  # only a near-tie may flip across machines
                assert c["gap"][i] < 1e-3, f"greedy step {i}: {a} != {b}"
                break


def test_golden_file_format():
    """Plain JSON without torch: what the golden tests read, with every greedy step's gap and bound."""
    assert COMMITTED["rel_bound"] == 1e-3 and COMMITTED["greedy_steps"] == 32
    for c in COMMITTED["logits"]:
        assert len(c["probe_ids"]) == len(c["probe_logits"]) == 256 and c["max_abs"] > 0
    for c in COMMITTED["greedy"]:
        assert len(c["greedy"]) == len(c["gap"]) == len(c["bound"]) == 32 and min(c["gap"]) >= 0
    assert (GOLDEN_DIR / "smollm2_hf.json").stat().st_size < 100_000
