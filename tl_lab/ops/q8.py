"""The int4 model's LM head as int8 (`Q8Linear`): given engineering around chapter L10.1, section 2.5
(the chapter quantizes the layers to int4; this is the grid llama.cpp's own file keeps the head in)."""

from __future__ import annotations

import numpy as np

from tl_lab.ops.checks import exact_array, f16_scales, finite_matrix, is_int, rows_of
from tl_lab.ops.lazy_kernels import product_q8  # the compiler is imported at the first product
from tl_lab.ops.widening import F16_AS_F32

# numpy's float16 casts round to nearest, ties to even, as the chapter's f16 does (tests/test_q8.py
# holds them to tl_lab.quant's); the ops layer uses numpy's, never a learner module's
F16_MAX, F16_INF = 65504.0, 0x7C00


def f32_to_f16(x: np.ndarray) -> np.ndarray:
    """x float32 (any shape) -> uint16 f16 bits, rounded to nearest even."""
    with np.errstate(over="ignore"):
        return np.asarray(x, dtype=np.float32).astype(np.float16).view(np.uint16)


def f16_to_f32(h: np.ndarray) -> np.ndarray:
    """h uint16 f16 bits (any shape) -> float32, exact."""
    return F16_AS_F32[np.asarray(h, dtype=np.uint16)]

__all__ = ["INT8_MAX", "Q8Linear"]

INT8_MAX = 127  # symmetric int8: -127 .. 127, as llama.cpp's Q8_0
Q8_ROWS = 2048  # rows Q8Linear.quantize takes at a time (4.5 MB of a 576-column f32 weight)


class Q8Linear:
    """y = x W_hat^T with W_hat = q s: int8 weights in groups of `group` columns, one f16 scale each.

    Not the chapter's scheme for the layers (section 2.5 is int4): the int4 model's LM head. A tied
    head is the embedding, 49152 x 576 for SmolLM2, and kept float32 it was 113 of the 165 MB an int4
    decode step reads. llama.cpp's own Q4_1 file of this model stores it as Q8_0 (int8 in blocks of
    32, an f16 scale each); this is the same grid with section 2.5's rules (s = f16(max|w| / 127),
    q = clamp(rint(w / s), -127, 127) with the stored s), 34/128 of the f32 bytes. Measured on
    SmolLM2: the int4 model's teacher-forced agreement with f32 stays 0.705 (an int4 head: 0.622).
    The embedding lookup still reads the float32 rows (`LlamaWeights.embed`): only the product
    is int8.

    q: int8 (out, inp); scales: uint16 (out, inp // group), f16 bits; group a multiple of 16
    (`kernels.matvec_q8` reads sixteen columns a step, never across a group).
    """

    def __init__(self, q: np.ndarray, scales: np.ndarray, group: int) -> None:
        if not isinstance(q, np.ndarray) or q.ndim != 2:
            raise ValueError(f"q must be a 2-D int8 numpy array (out, inp), got {type(q).__name__} {np.shape(q)}")
        out, inp = q.shape
        _check_q8_group(inp, group)
        exact_array("q", q, np.int8, (out, inp))
        exact_array("scales", scales, np.uint16, (out, inp // group))
        f16_scales(scales)
        self.out, self.inp, self.group = int(out), int(inp), int(group)
        self.q, self.scales = np.ascontiguousarray(q), np.ascontiguousarray(scales)

    def __repr__(self) -> str:
        return f"Q8Linear(out={self.out}, inp={self.inp}, group={self.group})"

    @property
    def nbytes(self) -> int:
        """Bytes held resident: the int8 weights and the scales."""
        return self.q.nbytes + self.scales.nbytes

    @classmethod
    def quantize(cls, w, group: int) -> Q8Linear:
        """Quantize w: float32 (out, inp) in groups of `group` columns, s = f16(max|w| / 127) divided
        in float32, q = clamp(rint(w / s), -127, 127) with w / s in float32 and the stored s."""
        W = finite_matrix(w)
        out, inp = W.shape
        _check_q8_group(inp, group)
        q, s_bits = np.empty((out, inp), np.int8), np.empty((out, inp // group), np.uint16)
        for r in range(0, out, Q8_ROWS):  # a block of rows at a time: the temporaries stay a few MB
            Wg = W[r : r + Q8_ROWS].reshape(-1, inp // group, group)
            s_bits[r : r + Q8_ROWS] = f32_to_f16(np.abs(Wg).max(axis=2) / np.float32(INT8_MAX))
            if (s_bits[r : r + Q8_ROWS] == F16_INF).any():
                raise ValueError(f"weights too large for an f16 scale: max|w| must stay below {F16_MAX * INT8_MAX}")
            s = f16_to_f32(s_bits[r : r + Q8_ROWS])[:, :, None]
            with np.errstate(divide="ignore", invalid="ignore"):
                qg = np.where(s == 0, 0, np.clip(np.rint(Wg / s), -INT8_MAX, INT8_MAX))  # 0/0 in an all-zero group
            q[r : r + Q8_ROWS] = qg.reshape(-1, inp)
        return cls(q, s_bits, group)

    def dequantize(self) -> np.ndarray:
        """W_hat = q s: float32 (out, inp), exact (an 8-bit q times an 11-bit s fits in f32)."""
        groups = self.q.reshape(self.out, -1, self.group).astype(np.float32)
        return (groups * f16_to_f32(self.scales)[:, :, None]).reshape(self.out, self.inp)

    def forward(self, x) -> np.ndarray:
        """y = x W_hat^T. x: float32 (m, inp) -> y: float32 (m, out), by `kernels.product_q8`: the bits of
        `kernels.product_f32` on W_hat, whatever m."""
        return product_q8(rows_of(x, self.inp), self.q, self.scales, F16_AS_F32)


def _check_q8_group(inp: int, group) -> None:
    if not is_int(group) or group <= 0 or group % 16 or inp % group:
        raise ValueError(f"group must be a positive multiple of 16 dividing inp={inp}, got {group!r}")
