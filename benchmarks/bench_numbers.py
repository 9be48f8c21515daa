"""The numbers of chapter L10.1 (sections 2.3 and 2.5): conversions and the int4 linear layer.

Times per million conversions (the scalar f16 reference is measured on fewer values and scaled),
and QLinear.quantize / dequantize / forward on a SmolLM2-sized 1536 x 576 matrix in groups of 32
(and Q8Linear.forward, the int8 grid of an int4 model's LM head, on the same matrix).

    python benchmarks/bench_numbers.py
"""

import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import current_rss_mb, no_options, report, timeit  # noqa: E402

from tl_lab.ops.q8 import Q8Linear  # noqa: E402
from tl_lab.quant import QLinear, bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16  # noqa: E402

MILLION = 1_000_000
SCALAR_N = 20_000


def conversion_rows(rng) -> list[dict]:
    x = (rng.standard_normal(MILLION) * 10).astype(np.float32)
    h16, hbf = f32_to_f16(x), f32_to_bf16(x)
    few = [float(v) for v in x[:SCALAR_N]]
    cases = [
        ("f32_to_f16 (vector)", MILLION, lambda: f32_to_f16(x)),
        ("f32_to_f16 (scalar reference)", SCALAR_N, lambda: [f32_to_f16(v) for v in few]),
        ("f16_to_f32 (vector)", MILLION, lambda: f16_to_f32(h16)),
        ("f32_to_bf16 (vector)", MILLION, lambda: f32_to_bf16(x)),
        ("bf16_to_f32 (vector)", MILLION, lambda: bf16_to_f32(hbf)),
    ]
    rows = []
    for name, n, fn in cases:
        seconds = timeit(fn, repeat=3)
        rows.append({"case": name, "measured_on": n, "ms_per_million": seconds * MILLION / n * 1e3})
    return rows


def qlinear_rows(rng) -> list[dict]:
    out, inp, group = 1536, 576, 32
    w = (rng.standard_normal((out, inp)) * 0.02).astype(np.float32)
    layer, head = QLinear.quantize(w, group), Q8Linear.quantize(w, group)
    scratch = np.empty((out, inp), dtype=np.float32)
    x1, x8 = (rng.standard_normal((m, inp)).astype(np.float32) for m in (1, 8))
    shape = f"{out}x{inp} g{group}"
    cases = [
        ("QLinear.quantize", lambda: QLinear.quantize(w, group)),
        ("QLinear.dequantize", lambda: layer.dequantize()),
        ("QLinear.dequantize(out=scratch)", lambda: layer.dequantize(out=scratch)),
        ("QLinear.forward m=1", lambda: layer.forward(x1)),
        ("QLinear.forward m=8", lambda: layer.forward(x8)),
        ("Q8Linear.forward m=1 (int8, the int4 model's head)", lambda: head.forward(x1)),
        ("Q8Linear.forward m=8", lambda: head.forward(x8)),
        ("f32 x @ W.T m=8 (reference)", lambda: x8 @ w.T),
    ]
    rows = [{"case": name, "shape": shape, "ms": timeit(fn, repeat=3) * 1e3} for name, fn in cases]
    rows.append({"case": "resident bytes int4 / f32", "shape": shape, "ratio": layer.nbytes / w.nbytes})
    return rows


def main() -> None:
    no_options(__doc__)
    rng = np.random.default_rng(0)
    rows = conversion_rows(rng) + qlinear_rows(rng)
    notes = (
        f"Best of 3 (timeit). Scalar f16 reference measured on {SCALAR_N} values, scaled to a million. "
        f"RSS at the end: {current_rss_mb():.0f} MiB. "
        f"OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS', 'unset')} (on a busy shared machine "
        "threaded BLAS spins: set it to 1 for stable figures). Compare within a run."
    )
    report("numbers", rows, notes)


if __name__ == "__main__":
    main()
