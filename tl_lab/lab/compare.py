"""Comparing two runs of a model: where greedy paths part, and how far two logit rows are apart.

Used wherever tl_lab holds one model against another (int4 against f32 in chapter L10.1,
section 2.5; tl_lab against Hugging Face): the tests, the benchmarks and notebook 09.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np

__all__ = ["INT4_QUESTIONS", "first_divergence", "log_softmax", "kl_divergence", "hf_golden_cases", "against_hf"]

INT4_QUESTIONS = (
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain what a KV cache is in one paragraph.",
    "List three prime numbers and say why they are prime.",
    "Translate 'good morning' into Spanish and German.",
    "Write a Python function that reverses a string.",
)
"""The chat questions int4 is held against f32 on (tests/test_smollm2_int4.py's floors, bench_smollm2
and notebook 09 all measure these six)."""


def first_divergence(a: list[int], b: list[int]) -> int | None:
    """The first index where two token paths differ, None when they are equal.

    A path that ends earlier differs where it ends (a stop at EOS is a choice too).
    """
    for i in range(max(len(a), len(b))):
        if i >= len(a) or i >= len(b) or a[i] != b[i]:
            return i
    return None


def log_softmax(x: np.ndarray) -> np.ndarray:
    """x: (V,) logits -> (V,) float64 log-probabilities (the maximum subtracted first)."""
    x = np.asarray(x, dtype=np.float64)
    m = x.max()
    return x - m - np.log(np.exp(x - m).sum())


def kl_divergence(p_logits: np.ndarray, q_logits: np.ndarray) -> float:
    """KL(p || q) in nats between the next-token distributions of two logit rows (V,)."""
    lp, lq = log_softmax(p_logits), log_softmax(q_logits)
    return float((np.exp(lp) * (lp - lq)).sum())


def hf_golden_cases(path: Path | None = None) -> list[dict]:
    """The cases of Hugging Face's golden file (default data/golden/tiny_llama_hf.json, written by
    tools/make_goldens.py), each with its last-token logits decoded: case["z"] (V,) float32."""
    from tl_lab.ops.paths import GOLDEN_DIR

    cases = json.loads(Path(path or GOLDEN_DIR / "tiny_llama_hf.json").read_text())["cases"]
    for case in cases:
        case["z"] = np.frombuffer(base64.b64decode(case["logits"]), dtype="<f4").astype(np.float32)
    return cases


def against_hf(runner, cases: list[dict] | None = None, rel_bound: float = 1e-3) -> dict:
    """The chapter's central claim (section 2.4), measured: for each golden prompt, the runner's
    last-token logits (`run_once`) against HF's float32 ones. -> {"lengths", "errors" (max |z - z_HF|),
    "bounds" (rel_bound of the largest HF logit)}, one entry per case."""
    cases = hf_golden_cases() if cases is None else cases
    out = {"lengths": [], "errors": [], "bounds": []}
    for case in cases:
        _, z = runner.run_once(case["tokens"])
        out["lengths"].append(len(case["tokens"]))
        out["errors"].append(float(np.abs(z - case["z"]).max()))
        out["bounds"].append(rel_bound * float(np.abs(case["z"]).max()))
    return out
