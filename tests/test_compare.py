"""tl_lab/compare.py: the helpers that hold one model's run against another's."""

import math

import numpy as np

from tl_lab.compare import first_divergence, kl_divergence, log_softmax


def test_first_divergence_finds_where_paths_part():
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 2]) == first_divergence([1, 2], [1, 2, 3]) == 2  # one ends first
    assert first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert first_divergence([1, 2], [1, 2, 3]) == 2  # stopping early is a choice too
    assert first_divergence([], [7]) == 0


def test_log_softmax_and_kl():
    x = np.array([1.0, 3.0, 2.0, 3.0, -1.0], np.float32)  # the chapter's section-3 logits
    lp = log_softmax(x)
    assert math.isclose(lp[1], -0.92487, abs_tol=5e-6) and math.isclose(np.exp(lp).sum(), 1.0, rel_tol=1e-12)
    assert kl_divergence(x, x) == 0.0
    y = x[::-1].copy()
    assert kl_divergence(x, y) > 0 and kl_divergence(x, x + 5.0) < 1e-12  # a shift changes nothing


def test_hf_golden_cases_decode_each_prompts_logits():
    """The golden file's base64 logits come back as float32 rows of the tiny Llama's vocabulary."""
    from tl_lab.compare import hf_golden_cases
    from tl_lab.model import ModelConfig
    from tl_lab.paths import DATA_DIR

    vocab = ModelConfig.load(DATA_DIR / "tiny-llama").vocab_size
    cases = hf_golden_cases()
    assert len(cases) == 6 and all(c["z"].dtype == np.float32 and c["z"].shape == (vocab,) for c in cases)
    assert all(np.isfinite(c["z"]).all() and np.abs(c["z"]).max() > 1 for c in cases)
