"""The int4 product alone: `kernels.product_q4` over SmolLM2-135M's layer linears, against tl_lab's own
f32 product (`kernels.product_f32`) on the same shapes. Chapter L10.1, section 2.5.

Per layer: stacked q/k/v (960, 576), o (576, 576), stacked gate/up (3072, 576), down (576, 1536), 30
layers with DISTINCT random weights, so one pass reads every byte from memory as a decode step does
(int4: 60 MB, f32: 425 MB; neither fits in the caches). For M = 1 (a batch-1 decode step) and M = 8,
at 1 and 2 threads, rounds interleaved (the machine's speed drifts), best of the rounds.

Run it under the shared lock: `flock /tmp/tl_bench.lock env OPENBLAS_CORETYPE=Haswell python
benchmarks/bench_q4.py`. Writes results/q4.json.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from _common import report

from tl_lab.ops.kernels import LAYER, product_f32, product_q4, set_threads
from tl_lab.quant import _F16_TABLE, QLinear

SHAPES = LAYER  # (N, K) of one SmolLM2 layer
LAYERS = 30
GROUP = 32


def int4_layers(rng) -> list[QLinear]:
    """Random nibbles and f16 scales in [2^-9, 2^-6) (SmolLM2's range), laid out as the kernel reads them."""
    out = []
    for _ in range(LAYERS):
        for N, K in SHAPES:
            planar = rng.integers(0, 256, (N, K // 2), dtype=np.uint8)
            scales = rng.integers(0x1800, 0x2400, (N, K // GROUP), dtype=np.uint16)
            out.append(QLinear._of_planar(GROUP, planar, scales))
    return out


def f32_layers(rng) -> list[np.ndarray]:
    return [rng.standard_normal((N, K), dtype=np.float32) * 0.02 for _ in range(LAYERS) for N, K in SHAPES]


def one_pass(kind, weights, xs):
    """Every linear of a step once: x (M, K) per input size."""
    if kind == "int4":
        for lin in weights:
            product_q4(xs[lin.inp], lin.planar, lin.scales, _F16_TABLE)
    else:
        for W in weights:
            product_f32(xs[W.shape[1]], W)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rows", default="1,8")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    weights = {"int4": int4_layers(rng), "f32": f32_layers(rng)}
    rows = []
    for t in [int(v) for v in args.threads.split(",")]:
        set_threads(t)
        for M in [int(v) for v in args.rows.split(",")]:
            xs = {K: rng.standard_normal((M, K), dtype=np.float32) for K in (576, 1536)}
            best = {k: float("inf") for k in weights}
            for k in weights:  # warm-up: compile, page in
                one_pass(k, weights[k], xs)
            for _ in range(args.rounds):
                for k, w in weights.items():
                    t0 = time.perf_counter()
                    one_pass(k, w, xs)
                    best[k] = min(best[k], time.perf_counter() - t0)
            rows.append({"threads": t, "M": M, "int4_ms": best["int4"] * 1e3, "f32_ms": best["f32"] * 1e3,
                         "f32 / int4": best["f32"] / best["int4"]})
    report("q4", rows, notes="ms per pass over the 30 layers' linears (a step's products, without the head)")


if __name__ == "__main__":
    main()
