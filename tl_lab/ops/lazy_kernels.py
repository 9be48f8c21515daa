"""The compiled products for the modules that read checkpoints (`model`, `quant`), and the sampler's
compiled exp (`sample`), imported at the first call. Chapter L10.1, section 2.4 (the kernels); issue 20 (a refusal is prompt).

Why not at import: `tl_lab.ops.kernels` imports numba and llvmlite, about 0.4 s and 75 MB here (2 to
4 s on a busy host) before anything else can happen, and reading, checking and refusing a
checkpoint (config.json, a safetensors header, a non-finite weight) needs neither. So `model` and
`quant` call the kernels through these two functions, and the command line imports the engine
(`runner`, `forward`, which import the kernels as usual) only once the model's files were accepted
(`tl_lab.__main__._engine`): a refused file costs a fraction of a second
(benchmarks/results/probes.json). The call costs one more Python call, ~0.1 us, against the
microseconds to milliseconds of the product.
"""

from __future__ import annotations

import numpy as np

_kernels = None


def _module():
    """tl_lab.ops.kernels, imported on the first call (then held here)."""
    global _kernels
    if _kernels is None:
        from tl_lab.ops import kernels

        _kernels = kernels
    return _kernels


def product_f32(x: np.ndarray, W: np.ndarray) -> np.ndarray:
    """`kernels.product_f32`: x: (M, K) float32, W: (N, K) float32 -> x W^T (M, N) float32."""
    return _module().product_f32(x, W)


def product_q4(x: np.ndarray, planar: np.ndarray, scales: np.ndarray, f16: np.ndarray) -> np.ndarray:
    """`kernels.product_q4`: x: (M, K) float32 times the int4 weight (planar nibbles, f16 scales) -> (M, N) float32."""
    return _module().product_q4(x, planar, scales, f16)


def product_q8(x: np.ndarray, Q: np.ndarray, scales: np.ndarray, f16: np.ndarray) -> np.ndarray:
    """`kernels.product_q8`: x: (M, K) float32 times the int8 head (int8 q, f16 scales) -> (M, N) float32."""
    return _module().product_q8(x, Q, scales, f16)


def exp_f64(x: np.ndarray) -> np.ndarray:
    """`kernels.exp_f64`: x: float64 array -> exp of each, the C library's bits, a new array of its shape."""
    x = np.ascontiguousarray(x, dtype=np.float64)
    out = np.empty_like(x)
    _module().exp_f64(x.reshape(-1), out.reshape(-1))  # views: out is written in place
    return out
