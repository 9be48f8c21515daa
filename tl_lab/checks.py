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
