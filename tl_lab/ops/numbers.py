"""The number formats' given helpers: bit patterns and the argument checks of tl_lab.quant.

Chapter L10.1, sections 2.3 and 2.5. What the conversions and QLinear call that is not the lesson:
a float32's bit pattern and back, the refusals of a bit pattern, an `out` array or int4 sizes, and
the reading of a float array as float32. Each refusal raises ValueError naming the argument.
"""

from __future__ import annotations

import struct

import numpy as np

from tl_lab.ops.checks import as_float, exact_array, is_int

__all__ = ["f32_bits", "f32_from_bits", "check_bits", "bits_int", "check_out", "any_float", "bits16", "floats32",
           "check_int4_dims"]


def f32_bits(x: float) -> int:
    """The 32-bit pattern of `x` taken as float32 (a Python float is rounded to f32 first)."""
    with np.errstate(over="ignore"):
        return int(np.array(x, dtype=np.float32).view(np.uint32))


def f32_from_bits(bits: int) -> float:
    """The float32 whose pattern is `bits`, as a Python float (exact: every f32 is an f64)."""
    return struct.unpack("<f", struct.pack("<I", bits))[0]


def check_bits(h, name: str) -> None:
    if not 0 <= h <= 0xFFFF:
        raise ValueError(f"{name} must be a 16-bit pattern in [0, 0xFFFF], got {h!r}")


def bits_int(h, name: str) -> int:
    if not is_int(h):
        raise ValueError(f"{name} must be an integer bit pattern, got {type(h).__name__} {h!r}")
    return int(h)


def check_out(out, shape: tuple) -> None:
    """Refuse an `out` the widening cannot write (None is fine: a new array is made): numpy's own
    errors would be a broadcasting or casting message, or "WRITEBACKIFCOPY base is read-only"."""
    if out is not None:
        exact_array("out", out, np.float32, shape)
        if not out.flags.writeable:
            raise ValueError("out is read-only")


def any_float(x) -> float:
    return as_float(x, "x", finite=False)  # NaN and infinities are numbers f16 and bf16 hold too


def bits16(h: np.ndarray, name: str) -> np.ndarray:
    if h.dtype == np.uint16:
        return h
    if h.dtype.kind not in "iu":
        raise ValueError(f"{name} must hold uint16 bit patterns, got dtype {h.dtype}")
    if h.size and (h.min() < 0 or h.max() > 0xFFFF):
        raise ValueError(f"{name} holds values outside the 16-bit range [0, 0xFFFF]")
    return h.astype(np.uint16)


def floats32(x: np.ndarray) -> np.ndarray:
    # every array the engine rounds is one already: no errstate to enter (a microsecond or two a call)
    if type(x) is np.ndarray and x.dtype == np.float32:
        return x
    if x.dtype.kind != "f":
        raise ValueError(
            f"x must be a float array, got dtype {x.dtype} (for f32 bit patterns use .view(np.float32))"
        )
    with np.errstate(over="ignore"):
        return np.asarray(x, dtype=np.float32)


def check_int4_dims(out: int, inp: int, group: int) -> None:
    for name, v in (("out", out), ("inp", inp), ("group", group)):
        if not is_int(v) or v <= 0:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")
    if group % 2:
        raise ValueError(f"group must be even (two int4 values per byte), got group={group}")
    if inp % group:
        raise ValueError(f"inp={inp} is not divisible by group={group}")
