"""One rule for argument checks, shared by every module.

"An integer" means a Python or numpy integer and never a bool (``True`` is an ``int`` in Python, and
``ForwardSeq(tokens, start=True)`` must be refused, not read as position 1). "A real number" likewise
excludes bools. Each check raises the caller's error class with a message naming the argument.
"""

from __future__ import annotations

import math

import numpy as np


def is_int(v) -> bool:
    """True for a Python or numpy integer that is not a bool."""
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def first_bool(seq) -> int | None:
    """Index of the first bool in a list or tuple (None if none, or not a list): numpy reads
    [True, 5] as the integers [1, 5], so an array made of it can no longer tell."""
    if isinstance(seq, (list, tuple)) and not _BOOLS.isdisjoint(map(type, seq)):  # C speed: a sampler's
        return next(j for j, v in enumerate(seq) if type(v) in _BOOLS)            # prompt, every step
    return None


_BOOLS = frozenset({bool, np.bool_})


def as_int(v, name: str, *, lo: int | None = None, hi: int | None = None,
           error: type[Exception] = ValueError) -> int:
    """`v` as a Python int in [lo, hi] (either bound optional), or `error` naming `name`."""
    if not is_int(v):
        raise error(f"{name} must be an integer, got {type(v).__name__} {v!r}")
    v = int(v)
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        raise error(f"{name} must be in [{'-inf' if lo is None else lo}, "
                    f"{'inf' if hi is None else hi}], got {v}")
    return v


def as_float(v, name: str, *, finite: bool = True, error: type[Exception] = ValueError) -> float:
    """`v` as a Python float (finite unless `finite=False`), or `error` naming `name`."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise error(f"{name} must be a real number, got {type(v).__name__} {v!r}")
    try:
        f = float(v)
    except OverflowError:
        raise error(f"{name} is too large for a float: {v!r}") from None
    if finite and not math.isfinite(f):
        raise error(f"{name} must be finite, got {f!r}")
    return f


def rows_of(x, inp: int) -> np.ndarray:
    """x as float32 (m, inp), or ValueError naming the shape (a product's input)."""
    if type(x) is np.ndarray and x.dtype == np.float32 and x.ndim == 2 and x.shape[1] == inp:
        return x  # what every step of the forward passes: a microsecond less per product
    shape = np.shape(x)
    if len(shape) != 2 or shape[1] != inp:
        raise ValueError(f"x must be (m, {inp}), got shape {shape}")
    x = np.asarray(x)
    if x.dtype.kind not in "fiu":  # an object array's None became a NaN row, a string array numpy's error
        raise ValueError(f"x must hold real numbers, got dtype {x.dtype}")
    return x.astype(np.float32, copy=False)


def finite_matrix(w) -> np.ndarray:
    """w as float32 (out, inp) of finite real numbers, or ValueError naming the first bad entry."""
    W = np.asarray(w)
    if W.ndim != 2:
        raise ValueError(f"w must be 2D (out, inp), got shape {W.shape}")
    if W.dtype.kind not in "fiu":
        raise ValueError(f"w must hold real numbers, got dtype {W.dtype}")
    with np.errstate(over="ignore"):
        W = W.astype(np.float32, copy=False)
    finite = np.isfinite(W)
    if not finite.all():
        r, c = np.argwhere(~finite)[0]
        raise ValueError(f"w must be finite, got w[{r}, {c}] = {W[r, c]}")
    return W


def exact_array(name: str, a, dtype, shape: tuple) -> None:
    """Refuse with ValueError unless `a` is a numpy array of exactly `dtype` and `shape`."""
    if not isinstance(a, np.ndarray):
        raise ValueError(f"{name} must be a numpy array, got {type(a).__name__}")
    if a.dtype != dtype:
        raise ValueError(f"{name} must be {np.dtype(dtype)}, got dtype {a.dtype}")
    if a.shape != shape:
        raise ValueError(f"{name} must have shape {shape}, got {a.shape}")


def f16_scales(scales: np.ndarray) -> None:
    """Refuse with ValueError unless every f16 bit pattern of `scales` is finite and non-negative."""
    bad = ((scales & 0x7C00) == 0x7C00) | ((scales & 0x8000) != 0)
    if bad.any():
        r, g = np.argwhere(bad)[0]
        raise ValueError(f"scales must be finite non-negative f16, got 0x{int(scales[r, g]):04X} at scales[{r}, {g}]")
