"""The int4 kernel's weight layout (given): the chapter's packing repacked once at load for the
compiled product (`kernels.product_q4`), and read back.

Chapter L10.1, section 2.5. Group-planar, offset-binary: byte b of a group holds column b of the
group in its low nibble and column b + group/2 in its high one, each stored as q + 8 (0 .. 15). So
the kernel reads a group (16 bytes for group 32) as one vector and unpacks it into two runs of 16
contiguous columns, matching two contiguous runs of x, with one mask or shift, one conversion and
one subtraction of 8 each: no sign fix per nibble, no shuffle.
"""

from __future__ import annotations

import numpy as np

__all__ = ["to_planar", "planar_values"]


def to_planar(qweight: np.ndarray, group: int) -> np.ndarray:
    """The chapter's int4 packing -> the kernel's: uint8 (out, inp // 2) -> uint8 (out, inp // 2).
    A nibble v holding q in two's complement holds q + 8 = v ^ 8 in offset binary."""
    out, half_inp = qweight.shape
    nibbles = np.stack([qweight & 0xF, qweight >> 4], axis=-1) ^ 8  # (out, inp // 2, 2): q + 8, columns in order
    n = nibbles.reshape(out, half_inp * 2 // group, 2, group // 2)
    return np.ascontiguousarray(n[:, :, 0, :] | (n[:, :, 1, :] << 4)).reshape(out, half_inp)


def planar_values(planar: np.ndarray, group: int) -> np.ndarray:
    """The kernel's layout -> the int4 values: uint8 (out, inp // 2) -> int8 (out, inp), columns in order."""
    out, half_inp = planar.shape
    g = planar.reshape(out, half_inp * 2 // group, group // 2)
    return (np.concatenate([g & 0xF, g >> 4], axis=2).astype(np.int8) - 8).reshape(out, half_inp * 2)
