"""tl_lab/lab/compare.py: the helpers that hold one model's run against another's."""

import math

import numpy as np

from tl_lab.lab.compare import first_divergence, kl_divergence, log_softmax


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
    from tl_lab.lab.compare import hf_golden_cases
    from tl_lab.model import ModelConfig
    from tl_lab.ops.paths import DATA_DIR

    vocab = ModelConfig.load(DATA_DIR / "tiny-llama").vocab_size
    cases = hf_golden_cases()
    assert len(cases) == 6 and all(c["z"].dtype == np.float32 and c["z"].shape == (vocab,) for c in cases)
    assert all(np.isfinite(c["z"]).all() and np.abs(c["z"]).max() > 1 for c in cases)


def test_against_hf_reports_each_cases_length_error_and_bound():
    """`against_hf` runs each case's tokens once and reports, per case, its length, the largest
    |z - z_HF| and the bound rel_bound * max |z_HF|, in the cases' order; by default over the golden
    file's cases."""
    from tl_lab.lab.compare import against_hf, hf_golden_cases

    class Runner:
        def __init__(self, shift):
            self.shift, self.seen = shift, []

        def run_once(self, tokens):
            self.seen.append(list(tokens))
            return None, np.asarray(self.z[len(self.seen) - 1]) + np.float32(self.shift)

    cases = [{"tokens": [1, 2, 3], "z": np.array([1.0, -4.0, 2.0], np.float32)},
             {"tokens": [5], "z": np.array([0.5, 8.0], np.float32)}]
    runner = Runner(0.25)
    runner.z = [c["z"] for c in cases]
    got = against_hf(runner, cases, rel_bound=0.01)
    assert runner.seen == [[1, 2, 3], [5]]
    assert got == {"lengths": [3, 1], "errors": [0.25, 0.25], "bounds": [0.04, 0.08]}
    golden = hf_golden_cases()
    runner = Runner(0.0)
    runner.z = [c["z"] for c in golden]
    got = against_hf(runner)  # the golden file's cases, the default bound 1e-3
    assert runner.seen == [list(c["tokens"]) for c in golden] and got["errors"] == [0.0] * len(golden)
    assert got["bounds"] == [1e-3 * float(np.abs(c["z"]).max()) for c in golden]
