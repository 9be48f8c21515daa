"""Time one sample() call on a 49,152-token vocabulary: the scalar reference against the numpy path.

    python benchmarks/bench_sampler.py

Three settings: greedy, temperature only (the kept set is the whole vocabulary), and every filter and
penalty on. Each call gets a fresh copy of one generator, so both paths do identical work (and the
script checks they return identical results). Writes benchmarks/results/sampler.json.
"""

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import no_options, report, timeit  # noqa: E402

from tl_lab.ops.fast_sample import exp_backend, sample as fast_sample, trace as fast_trace  # noqa: E402
from tl_lab.sample import SamplingParams, sample, sample_trace, stream  # noqa: E402

V = 49152
SETTINGS = {
    "greedy": SamplingParams(temperature=0.0),
    "temperature only (T=0.8)": SamplingParams(temperature=0.8),
    "all filters + penalties": SamplingParams(temperature=0.8, top_k=50, top_p=0.9, min_p=0.02,
                                              repetition_penalty=1.2, presence_penalty=0.3, frequency_penalty=0.2),
    "top-p 0.95 without top-k": SamplingParams(temperature=1.0, top_p=0.95),
}


def logits_row(seed: int = 0) -> np.ndarray:
    """A language-model-like row: a broad body and a few dozen strong candidates."""
    g = np.random.default_rng(seed)
    x = g.standard_normal(V) * 2.0
    x[g.integers(0, V, 40)] += g.uniform(6, 16, 40)
    return x.astype(np.float32)


def main() -> None:
    no_options(__doc__)
    x = logits_row()
    g = np.random.default_rng(1)
    prompt, output = g.integers(0, V, 200).tolist(), g.integers(0, V, 100).tolist()
    base = stream(42, 4)
    rows = []
    for name, params in SETTINGS.items():
        a = fast_sample(x, params, prompt, output, base.copy())
        b = sample(x, params, prompt, output, base.copy())
        assert a[0] == b[0] and a[1].hex() == b[1].hex(), (name, a, b)
        t_np = timeit(lambda: fast_sample(x, params, prompt, output, base.copy()))
        t_trace = timeit(lambda: fast_trace(x, params, prompt, output, base.copy()))
        t_ref = timeit(lambda: sample_trace(x, params, prompt, output, base.copy()), repeat=3, min_time=0.5)
        rows.append({"setting": name, "vocab": V, "fast_ms": t_np * 1e3, "fast_trace_ms": t_trace * 1e3,
                     "spec_ms": t_ref * 1e3, "speedup": t_ref / t_np, "token": a[0]})
    report("sampler", rows, notes=f"history: 200 prompt + 100 output ids; exp backend: {exp_backend()}; "
                                  "best of repeats, ms per call")


if __name__ == "__main__":
    main()
