"""8-bit floats for a KV cache: e4m3 and e5m2, rounded to nearest even. Chapter L10.1, "Going further".

The chapter's cache stores f16 (section 2.4); production engines go to fp8 with a scale per head:
half the bytes again, for a calibrated error. Two OCP formats, both 1 sign bit:

- e4m3 ("e4m3fn"): 4 exponent bits (bias 7), 3 mantissa bits. Largest finite 448, no infinity
  (1111 111 is NaN). Relative rounding error at most 2^-4 in the normal range (>= 2^-6).
- e5m2: 5 exponent bits (bias 15), 2 mantissa bits, f16's range (largest finite 57344, with infinities).
  Relative rounding error at most 2^-3.

A per-head scale (s = max|k| / 448) already puts the keys into e4m3's range, so e4m3's extra mantissa bit
is worth more than e5m2's extra exponent bit: that is why KV caches use e4m3 (notebook 12 measures both).

Conversion here saturates: a finite value beyond the largest finite rounds to it (what scaled KV caches
do); NaN stays NaN. Rounding is to nearest, ties to even, like `tl_lab.quant.f32_to_f16`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Fp8Format", "E4M3", "E5M2", "FORMATS", "fp8_round", "f32_to_fp8", "fp8_to_f32", "fp8_values"]


@dataclass(frozen=True)
class Fp8Format:
    """An 8-bit float: `exp_bits` + `man_bits` = 7, exponent `bias`; `ieee_specials`: the top exponent
    is infinity/NaN (e5m2); otherwise only the all-ones pattern is NaN (e4m3fn)."""

    name: str
    exp_bits: int
    man_bits: int
    bias: int
    ieee_specials: bool

    @property
    def min_exp(self) -> int:
        """Exponent of the smallest normal number, 1 - bias."""
        return 1 - self.bias

    @property
    def max_finite(self) -> float:
        top = (1 << self.exp_bits) - 1  # e4m3fn keeps the top exponent for numbers (but 111 mantissa)
        e, m = (top - 1, (1 << self.man_bits) - 1) if self.ieee_specials else (top, (1 << self.man_bits) - 2)
        return float((1 + m / (1 << self.man_bits)) * 2.0 ** (e - self.bias))


E4M3 = Fp8Format("e4m3", 4, 3, 7, False)
E5M2 = Fp8Format("e5m2", 5, 2, 15, True)
FORMATS = {"e4m3": E4M3, "e5m2": E5M2}


def _fmt(fmt) -> Fp8Format:
    if isinstance(fmt, Fp8Format):
        return fmt
    if fmt not in FORMATS:
        raise ValueError(f"fp8 format must be one of {sorted(FORMATS)}, got {fmt!r}")
    return FORMATS[fmt]


def fp8_round(x, fmt="e4m3") -> np.ndarray:
    """The nearest fp8 value to each element (ties to even, saturating), as float32, same shape as x.

    How: with |x| = f 2^E (np.frexp, f in [0.5, 1)), the spacing of fp8 numbers near x is
    ulp = 2^(max(E - 1, min_exp) - man_bits) (the max() is the subnormal range). |x| / ulp is exact in
    float64 (a power-of-two scaling), so np.rint of it, ties to even, picks the nearest multiple of ulp
    with an even last mantissa bit. Rounding up may reach the next binade (still representable).
    """
    f = _fmt(fmt)
    x = np.asarray(x, dtype=np.float64)
    a = np.abs(x)
    _, E = np.frexp(a)
    ulp = np.ldexp(1.0, np.maximum(E - 1, f.min_exp) - f.man_bits)
    r = np.minimum(np.rint(a / ulp) * ulp, f.max_finite)
    r = np.where(np.isnan(x), np.nan, r)
    return (np.copysign(r, x)).astype(np.float32)


def fp8_values(fmt="e4m3") -> np.ndarray:
    """The value of each of the 256 codes: float32 (256,), NaN (and e5m2's infinities) included."""
    f = _fmt(fmt)
    code = np.arange(256)
    sign = np.where(code >> 7, -1.0, 1.0)
    e = (code >> f.man_bits) & ((1 << f.exp_bits) - 1)
    m = code & ((1 << f.man_bits) - 1)
    frac = m / (1 << f.man_bits)
    mag = np.where(e == 0, frac * 2.0 ** f.min_exp, (1 + frac) * 2.0 ** (e.astype(np.float64) - f.bias))
    top = (1 << f.exp_bits) - 1
    if f.ieee_specials:
        mag = np.where(e == top, np.where(m == 0, np.inf, np.nan), mag)
    else:
        mag = np.where((e == top) & (m == (1 << f.man_bits) - 1), np.nan, mag)
    return (sign * mag).astype(np.float32)


def f32_to_fp8(x, fmt="e4m3") -> np.ndarray:
    """Round x to fp8 (`fp8_round`) and return the codes, uint8, same shape. NaN -> the format's NaN."""
    f = _fmt(fmt)
    r = fp8_round(x, f)
    values = fp8_values(f)[:128]  # the non-negative codes, increasing with the code up to the specials
    finite = int(np.count_nonzero(np.isfinite(values)))
    idx = np.searchsorted(values[:finite], np.abs(r))  # exact hits: r is one of the values
    nan_code = 0x7F if not f.ieee_specials else 0x7E
    codes = np.where(np.isnan(r), nan_code, np.minimum(idx, finite - 1))
    return (codes | np.where(np.signbit(r) & ~np.isnan(r), 0x80, 0)).astype(np.uint8)


def fp8_to_f32(codes, fmt="e4m3") -> np.ndarray:
    """Widen fp8 codes (uint8 array) to float32 (exact: every fp8 value is an f32)."""
    codes = np.asarray(codes)
    if codes.dtype != np.uint8:
        raise ValueError(f"fp8 codes must be uint8, got dtype {codes.dtype}")
    return fp8_values(fmt)[codes]
