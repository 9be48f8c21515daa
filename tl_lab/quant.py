"""The numbers of the model runner: f16, bf16 and int4 (chapter L10.1, sections 2.3 and 2.5).

Two kinds of code live here, on purpose:

* a scalar reference that does the bit work the chapter teaches (`explain_f32_to_f16`,
  `f16_to_f32_scalar`, ...), one Python int at a time, readable line by line;
* the engine path (`f32_to_f16` on arrays, `QLinear`), vectorized with numpy.

The tests hold the two against each other and against numpy's own float16 cast.

Bit layouts (sign | exponent | mantissa):

    f32   1 | 8 (bias 127) | 23
    f16   1 | 5 (bias 15)  | 10
    bf16  1 | 8 (bias 127) | 7      (the top half of an f32)
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from tl_lab.ops.checks import as_int, exact_array, f16_scales, finite_matrix, rows_of
from tl_lab.ops.lazy_kernels import product_q4  # the compiler is imported at the first product, not to read a file
from tl_lab.ops.int4_layout import planar_values, to_planar
from tl_lab.ops.numbers import (any_float, bits16, bits_int, check_bits, check_int4_dims, check_out, f32_bits,
                                f32_from_bits, floats32)
from tl_lab.ops.widening import F16_AS_F32

F16_MAX = 65504.0
F16_INF = 0x7C00
F16_QUIET = 0x0200  # the top mantissa bit: set, a NaN is quiet
BF16_QUIET = 0x0040
INT4_MIN, INT4_MAX = -8, 7

__all__ = ["F16_MAX", "Rounding", "Narrowing", "round_half_even", "f32_bits", "f32_from_bits", "explain_f32_to_f16",
           "explain_f32_to_bf16", "f32_to_f16_scalar", "f32_to_bf16_scalar", "f16_to_f32_scalar", "bf16_to_f32_scalar",
           "f16_to_f32", "f32_to_f16", "bf16_to_f32", "f32_to_bf16", "pack_int4", "unpack_int4", "QLinear"]


# ---------------------------------------------------------------------------------------------
# The rounding decision (section 2.3): keep the top bits, look at the dropped ones.
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rounding:
    """One round-to-nearest-even decision on an integer significand.

    `kept` are the high bits kept, `dropped` the `n_dropped` low bits thrown away, `half` the
    dropped-bits pattern of the exact halfway point (a 1 followed by zeros). `verdict` is
    "exact", "below half", "tie" or "above half"; `round_up` says whether one was added to
    `kept`, which happens above half, or at a tie when `kept` is odd (ties go to the even one).
    """

    kept: int
    dropped: int
    n_dropped: int
    verdict: str
    round_up: bool

    @property
    def half(self) -> int:
        return 1 << (self.n_dropped - 1) if self.n_dropped else 0

    @property
    def result(self) -> int:
        return self.kept + self.round_up


def round_half_even(sig: int, n_drop: int) -> Rounding:
    """Drop the low `n_drop` bits of the non-negative integer `sig`, rounding to nearest, ties to even.

    Chapter L10.1, section 2.3: "keep the top bits, and add one when the dropped bits are above
    half, or exactly half with the kept value odd". This is the one rounding step of the scalar
    f16 and bf16 conversions and of the numbers widget.
    """
    kept = sig >> n_drop
    dropped = sig & ((1 << n_drop) - 1)
    half = 1 << (n_drop - 1) if n_drop else 0
    if dropped == 0:
        verdict = "exact"
    elif dropped < half:
        verdict = "below half"
    elif dropped == half:
        verdict = "tie"
    else:
        verdict = "above half"
    round_up = verdict == "above half" or (verdict == "tie" and kept & 1 == 1)
    return Rounding(kept, dropped, n_drop, verdict, round_up)


# ---------------------------------------------------------------------------------------------
# Scalar reference: f32 -> f16 / bf16 with integer operations on the bit pattern.
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Narrowing:
    """How one f32 became an f16 or bf16 pattern: the result and the rounding that made it.

    `rounding` is None for infinities and NaN (nothing is rounded). `subnormal` is True when the
    result lies in the target's subnormal range (exponent field 0, fewer significant bits),
    `overflow` when a finite f32 rounded to infinity.
    """

    fmt: str
    x_bits: int
    bits: int
    rounding: Rounding | None
    subnormal: bool = False
    overflow: bool = False


def explain_f32_to_f16(x: float) -> Narrowing:
    """f32 -> f16 bits, round to nearest, ties to even, step by step (chapter section 2.3).

    The f32 significand (24 bits with the implicit 1) keeps its top 10 mantissa bits after the
    implicit one; below 2^-14 the f16 result is subnormal (value m * 2^-24) and more bits are
    dropped. A carry out of the mantissa moves into the exponent by plain addition, which also
    turns the largest values into infinity (65520 and above). NaN stays NaN, made quiet.
    """
    bits = f32_bits(x)
    sign = (bits >> 31) << 15
    exp = (bits >> 23) & 0xFF
    man = bits & 0x7FFFFF
    if exp == 0xFF:  # infinity or NaN: nothing to round
        nan = (F16_QUIET | (man >> 13)) if man else 0
        return Narrowing("f16", bits, sign | F16_INF | nan, None)
    e = max(exp, 1) - 127  # unbiased exponent; f32 subnormals share exponent -126
    sig = (1 << 23 | man) if exp else man  # value = sig * 2^(e - 23)
    if e >= -14:  # f16 normal range: keep 11 significant bits (implicit 1 + 10)
        n_drop, field = 13, (e + 14) << 10  # e + 15 - 1: the implicit bit adds the last 1
    else:  # f16 subnormal: value m * 2^-24, so shift further right
        n_drop, field = min(13 + (-14 - e), 25), 0
    r = round_half_even(sig, n_drop)
    h = field + r.result
    overflow = h >= F16_INF
    h = min(h, F16_INF)
    return Narrowing("f16", bits, sign | h, r, subnormal=h < 0x0400 and h != 0, overflow=overflow)


def explain_f32_to_bf16(x: float) -> Narrowing:
    """f32 -> bf16 bits: keep the top 16 bits, rounding the dropped low 16 to nearest even.

    bf16 shares f32's exponent, so there is no range to fix: the same 16-bit drop works for
    normals and subnormals, and a carry out of the top mantissa value reaches infinity by itself.
    """
    bits = f32_bits(x)
    sign = (bits >> 31) << 15
    mag = bits & 0x7FFFFFFF
    if mag > 0x7F800000:  # NaN: keep its top payload, make it quiet
        return Narrowing("bf16", bits, sign | (mag >> 16) | BF16_QUIET, None)
    if mag == 0x7F800000:
        return Narrowing("bf16", bits, sign | 0x7F80, None)
    r = round_half_even(mag, 16)
    h = r.result
    return Narrowing(
        "bf16", bits, sign | h, r, subnormal=0 < h < 0x0080, overflow=h == 0x7F80
    )


def f32_to_f16_scalar(x: float) -> int:
    """f32 -> f16 bits for one value: the scalar reference (see `explain_f32_to_f16`)."""
    return explain_f32_to_f16(x).bits


def f32_to_bf16_scalar(x: float) -> int:
    """f32 -> bf16 bits for one value: the scalar reference (see `explain_f32_to_bf16`)."""
    return explain_f32_to_bf16(x).bits


def f16_to_f32_scalar(h: int) -> float:
    """f16 bits -> its value, by the chapter's formula (section 2.3).

    (-1)^s 2^(e-15) (1 + m/1024) for 0 < e < 31; subnormals (-1)^s 2^-14 (m/1024) for e = 0;
    e = 31 is infinity (m = 0) or NaN. Every f16 is exact in f32 (and in a Python float).
    """
    check_bits(h, "h")
    s, e, m = h >> 15, (h >> 10) & 0x1F, h & 0x3FF
    if e == 31:
        magnitude = float("nan") if m else float("inf")
    elif e == 0:
        magnitude = 2.0**-14 * (m / 1024)
    else:
        magnitude = 2.0 ** (e - 15) * (1 + m / 1024)
    return math.copysign(magnitude, -1.0 if s else 1.0)


def bf16_to_f32_scalar(h: int) -> float:
    """bf16 bits -> its value: the f32 whose bits are h << 16 (section 2.3)."""
    check_bits(h, "h")
    return f32_from_bits(h << 16)


# ---------------------------------------------------------------------------------------------
# The public conversions: a Python number in -> a Python number out; an array in -> an array out.
# ---------------------------------------------------------------------------------------------


_F16_TABLE = F16_AS_F32  # every f16's f32 value, by numpy's exact cast (tl_lab.ops.widening)


def f16_to_f32(h, out: np.ndarray | None = None):
    """f16 bits -> value. int -> float; uint16 array -> float32 array of the same shape (into `out`,
    a float32 array of that shape, when given: no other full-size array is made)."""
    if not isinstance(h, np.ndarray):
        return f16_to_f32_scalar(bits_int(h, "h"))
    check_out(out, h.shape)
    # mode="clip": every uint16 is a valid index, and "raise" would buffer `out` in a copy
    return np.asarray(np.take(_F16_TABLE, bits16(h, "h"), out=out, mode="clip"))  # a 0-d input stays 0-d


def bf16_to_f32(h, out: np.ndarray | None = None):
    """bf16 bits -> value. int -> float; uint16 array -> float32 array of the same shape (into `out`,
    a float32 array of that shape, when given).

    The f32 whose bits are h << 16, shifted straight into the result's bits: numpy widens the
    uint16 input to uint32 in small internal buffers, so no full-size temporary is made.
    """
    if not isinstance(h, np.ndarray):
        return bf16_to_f32_scalar(bits_int(h, "h"))
    check_out(out, h.shape)
    out = np.empty(h.shape, dtype=np.float32) if out is None else out
    np.left_shift(bits16(h, "h"), np.uint32(16), out=out.view(np.uint32))
    return out


def f32_to_f16(x):
    """float32 -> f16 bits, round to nearest, ties to even; overflow -> inf; NaN -> quiet NaN.

    float -> int (the scalar reference); float array -> uint16 array of the same shape (numpy's
    cast, which rounds the same way; NaNs get the scalar path's quiet pattern). Values are
    taken as float32 first: a Python float or a float64 array is rounded to f32, then to f16.
    A 0-d array gives a 0-d uint16 array (not an int), an empty one an empty one; the graded
    tests pass both, and NaN, +-inf and the largest and smallest values.
    """
    if not isinstance(x, np.ndarray):
        return f32_to_f16_scalar(any_float(x))
    x = floats32(x)
    with np.errstate(over="ignore", invalid="ignore"):
        h = x.astype(np.float16).view(np.uint16)
    nan = np.isnan(x)
    if nan.any():  # numpy keeps signalling NaNs signalling; make them quiet like the scalar path
        u = x[nan].view(np.uint32)
        h[nan] = ((u >> 16) & 0x8000) | F16_INF | F16_QUIET | ((u >> 13) & 0x3FF)
    return h


def f32_to_bf16(x):
    """float32 -> bf16 bits, round to nearest, ties to even; overflow -> inf; NaN -> quiet NaN.

    float -> int; float array -> uint16 array of the same shape (a 0-d array, a NaN one too, gives a
    0-d uint16 array; an empty one an empty one). The vector path adds 0x7FFF + (bit 16) to the
    pattern and keeps the top half: below half never carries, above half always does, and a tie
    carries exactly when the kept part is odd.
    """
    if not isinstance(x, np.ndarray):
        return f32_to_bf16_scalar(any_float(x))
    x = floats32(x)
    u = x.reshape(-1).view(np.uint32)  # flat, so 0-d input works with in-place updates too
    carry = (u >> 16) & 1  # the lowest kept bit: 1 when the kept part is odd
    carry += 0x7FFF
    carry += u  # in place: no overflow for finite values, NaNs are replaced below
    h = (carry >> 16).astype(np.uint16)
    nan = np.isnan(u.view(np.float32))
    if nan.any():
        h[nan] = (u[nan] >> 16) | BF16_QUIET
    return h.reshape(x.shape)


# ---------------------------------------------------------------------------------------------
# Int4 packing (section 2.5): two values per byte, column 2b low nibble, 2b + 1 high nibble.
# ---------------------------------------------------------------------------------------------


def pack_int4(q, rows: int, cols: int) -> np.ndarray:
    """Pack int4 values into bytes. q: rows * cols integers in [-8, 7] -> uint8 (rows, cols // 2).

    Chapter L10.1, section 2.5: column 2b goes into the low nibble and 2b + 1 into the high one,
    each in 4-bit two's complement (-8 is 1000, -1 is 1111). q may be flat or (rows, cols);
    rows = 0 gives a (0, cols // 2) array. Refused with ValueError: odd cols, a size that is not
    rows * cols, a value outside [-8, 7] (the message names it: q[r, c] = v), a non-integer q.
    """
    rows, cols = as_int(rows, "rows"), as_int(cols, "cols")  # 1.0 and "2" are refused by name
    if rows < 0 or cols < 0:
        raise ValueError(f"rows and cols must be non-negative, got rows={rows}, cols={cols}")
    if cols % 2:
        raise ValueError(f"int4 packing needs an even column count, got cols={cols}")
    q = np.asarray(q)
    if q.size != rows * cols:
        raise ValueError(f"size mismatch: q has {q.size} values, rows * cols = {rows * cols}")
    if q.dtype.kind not in "iu":
        if q.size:
            raise ValueError(f"int4 values must be integers, got dtype {q.dtype}")
        q = q.astype(np.int8)  # np.asarray([]) is float64: nothing to pack, but & needs integers
    q = q.reshape(rows, cols)
    bad = (q < INT4_MIN) | (q > INT4_MAX)
    if bad.any():
        r, c = np.argwhere(bad)[0]
        raise ValueError(f"int4 value out of range [-8, 7]: q[{r}, {c}] = {q[r, c]}")
    nibbles = (q & 0xF).astype(np.uint8)  # two's complement: -1 & 0xF = 1111
    return nibbles[:, 0::2] | (nibbles[:, 1::2] << 4)


def unpack_int4(packed) -> np.ndarray:
    """Unpack bytes into int4 values: uint8 (rows, n) -> int8 (rows, 2n); 1D (n,) -> (2n,).

    `packed` is a uint8 array, or bytes (also bytearray, memoryview: a graded test passes
    bytes([0x78, 0xF1])), read as a 1-D uint8 array. Another dtype or a 3-D array is a ValueError.
    The inverse of `pack_int4`: the low nibble is the even column, the high nibble the odd one;
    (v ^ 8) - 8 sign-extends a 4-bit two's complement value.
    """
    if isinstance(packed, (bytes, bytearray, memoryview)):
        packed = np.frombuffer(packed, dtype=np.uint8)
    packed = np.asarray(packed)
    if packed.dtype != np.uint8:
        raise ValueError(f"packed int4 must be uint8 bytes, got dtype {packed.dtype}")
    if packed.ndim not in (1, 2):
        raise ValueError(f"packed int4 must be 1D or 2D, got shape {packed.shape}")
    pairs = _int4_pairs(np.int8)[packed]  # (..., n, 2): low nibble value, high nibble value
    return pairs.reshape(*packed.shape[:-1], 2 * packed.shape[-1])


def _int4_pair_table(dtype) -> np.ndarray:
    """(256, 2) table: byte -> (value of its low nibble, value of its high nibble)."""
    byte = np.arange(256)
    lo, hi = byte & 0xF, byte >> 4
    return np.stack([(lo ^ 8) - 8, (hi ^ 8) - 8], axis=1).astype(dtype)


@functools.cache
def _int4_pairs(dtype) -> np.ndarray:
    """`_int4_pair_table(dtype)`, built once per dtype (the first unpack), read-only."""
    table = _int4_pair_table(dtype)
    table.flags.writeable = False
    return table


# ---------------------------------------------------------------------------------------------
# QLinear (section 2.5): a linear layer with int4 weights in groups and one f16 scale per group.
# ---------------------------------------------------------------------------------------------


class QLinear:
    """y = x W_hat^T with W_hat = q s: int4 weights in groups of `group` columns (section 2.5).

    qweight: uint8 (out, inp // 2), two int4 values per byte (see `pack_int4`): the chapter's layout,
             the file's.
    scales:  uint16 (out, inp // group), the f16 bit pattern of each group's scale.

    At construction the nibbles are repacked ONCE into the kernel's layout, `planar` (see
    `to_planar`), and only that and the scales stay resident (0.5625 bytes per weight for group 32,
    9/64 of f32). `forward` reads the nibbles where they are (`kernels.matmul_q4`): no f32 copy of
    the weight is made. `qweight` gives the chapter's layout back, computed on demand.
    """

    def __init__(self, out: int, inp: int, group: int, qweight: np.ndarray, scales: np.ndarray) -> None:
        check_int4_dims(out, inp, group)
        exact_array("qweight", qweight, np.uint8, (out, inp // 2))
        exact_array("scales", scales, np.uint16, (out, inp // group))
        f16_scales(scales)
        self.out, self.inp, self.group = int(out), int(inp), int(group)
        self.planar = to_planar(qweight, group)
        self.scales = np.ascontiguousarray(scales)

    def __repr__(self) -> str:
        return f"QLinear(out={self.out}, inp={self.inp}, group={self.group})"

    @property
    def qweight(self) -> np.ndarray:
        """The chapter's packing (column 2b low nibble, 2b + 1 high, two's complement), a new array."""
        return pack_int4(planar_values(self.planar, self.group), self.out, self.inp)

    @property
    def nbytes(self) -> int:
        """Bytes held resident: the packed weights and the scales."""
        return self.planar.nbytes + self.scales.nbytes

    @classmethod
    def quantize(cls, w, group: int) -> QLinear:
        """Quantize w: float32 (out, inp) in groups of `group` columns (chapter section 2.5).

        Per group, s = f16(max|w| / 7) with the division in float32, and
        q = clamp(rint(w / s), -8, 7) with w / s in float32 and s the f16 value actually stored
        (the stored-scale rule: rounding with the unrounded scale would put some weights one
        level off). np.rint rounds half to even. An all-zero group gets s = 0 and q = 0.
        """
        W = finite_matrix(w)
        out, inp = W.shape
        check_int4_dims(out, inp, group)
        Wg = W.reshape(out, inp // group, group)
        s_bits = _group_scales(Wg)
        s = f16_to_f32(s_bits)[:, :, None]  # the stored value, widened back
        with np.errstate(divide="ignore", invalid="ignore"):
            q = np.clip(np.rint(Wg / s), INT4_MIN, INT4_MAX)
        q = np.where(s == 0, 0, q).astype(np.int8)  # 0/0 in an all-zero group
        return cls(out, inp, group, pack_int4(q, out, inp), s_bits)

    def dequantize(self, out: np.ndarray | None = None) -> np.ndarray:
        """W_hat = q s: float32 (out, inp), exact (a 4-bit q times an 11-bit s fits in f32).

        For the lesson and the reference product only (the engine never widens an int4 weight).
        `out`, a float32 (out, inp) C-contiguous array, is filled and returned instead of a new array.
        """
        if out is None:
            out = np.empty((self.out, self.inp), dtype=np.float32)
        else:
            exact_array("out", out, np.float32, (self.out, self.inp))
            if not out.flags.c_contiguous:
                raise ValueError("out must be C-contiguous")
        pairs = out.reshape(self.out, self.inp // 2, 2)
        np.take(_int4_pairs(np.float32), self.qweight, axis=0, out=pairs)
        groups = out.reshape(self.out, self.inp // self.group, self.group)
        groups *= f16_to_f32(self.scales)[:, :, None]
        return out

    @classmethod
    def _of_planar(cls, group: int, planar: np.ndarray, scales: np.ndarray) -> QLinear:
        """A QLinear holding `planar` and `scales` as they are (kernel layout, no repacking, no copy)."""
        lin = cls.__new__(cls)
        lin.out, lin.inp, lin.group = planar.shape[0], planar.shape[1] * 2, int(group)
        lin.planar, lin.scales = planar, scales
        return lin

    @classmethod
    def stack(cls, parts: list[QLinear]) -> tuple[QLinear, list[QLinear]]:
        """Stack linears of one input size and group along their outputs, ONCE at load (section 2.5):
        -> (the stacked QLinear (sum out, inp), each part again as a view of its rows). One product
        of the stack gives every part's outputs, each element the same loop as the part's own."""
        if len({(p.inp, p.group) for p in parts}) != 1:
            raise ValueError(f"stacked int4 linears need one input size and group, got {parts}")
        planar = np.concatenate([p.planar for p in parts])
        scales = np.concatenate([p.scales for p in parts])
        bounds = np.cumsum([0] + [p.out for p in parts])
        views = [cls._of_planar(parts[0].group, planar[a:b], scales[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]
        return cls._of_planar(parts[0].group, planar, scales), views

    def forward(self, x) -> np.ndarray:
        """y = x W_hat^T. x: float32 (m, inp), or one row (inp,) -> y: float32 (m, out) (or (out,)).

        Given helpers (imported above): `rows_of(x, inp)` checks x and gives it as float32 rows (m, inp)
        (a ValueError naming x for another width); `product_q4(x, planar, scales, f16_table)` (from
        tl_lab.ops.lazy_kernels) is the product: x the rows, `planar` this layer's nibbles in the
        kernel's order (`self.planar`, see `to_planar`), `scales` the f16 BITS of the scales
        (`self.scales`, uint16 (out, inp // group)), `f16_table` the float32 value of every one of the
        65536 f16 patterns (`_F16_TABLE`), which the kernel looks each scale up in. Equal to
        x @ dequantize().T within float tolerance (another order of the same sum), and row-invariant:
        a row's bits do not depend on the other rows. x with no rows gives (0, out).
        """
        return product_q4(rows_of(x, self.inp), self.planar, self.scales, _F16_TABLE)


def _group_scales(Wg: np.ndarray) -> np.ndarray:
    """Wg: float32 (out, G, g) -> uint16 (out, G): f16(max|w| / 7), divided in float32."""
    amax = np.abs(Wg).max(axis=2)
    s_bits = f32_to_f16(amax / np.float32(7))
    too_big = s_bits == F16_INF
    if too_big.any():
        r, g = np.argwhere(too_big)[0]
        raise ValueError(
            f"weights too large for an f16 scale: max|w| = {amax[r, g]} in row {r}, group {g} "
            f"(f16 holds scales up to {F16_MAX}, so max|w| must stay below {F16_MAX * 7})"
        )
    return s_bits


