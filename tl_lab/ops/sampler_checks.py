"""The sampler's input checks (docs/spec/sampling.md, "Inputs"): given code every sampler calls.

Chapter L10.1, section 2.6. What a logits row, a list of token ids, a seed and the parameters must
be, refused with ValueError or TypeError naming the field, the id or the position. The learner's
`tl_lab.sample` and the engine's vectorized `tl_lab.ops.fast_sample` both check their calls here, so
the two refuse the same calls with the same words. Duck-typed: ops imports no learner module.
"""

from __future__ import annotations

import numpy as np

from tl_lab.ops.checks import as_float, first_bool, is_int

__all__ = ["LOGIT_LIMIT", "MASK64", "u64", "check_params", "widen_logits", "token_ids", "check_call", "range_error"]

MASK64 = (1 << 64) - 1
LOGIT_LIMIT = 2.0**1000  # |penalised or scaled logit| above this is refused, so l - max never overflows
PARAM_FIELDS = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty")


def u64(value, name: str) -> int:
    """`value` as a Python int in [0, 2**64), or ValueError naming `name` in the spec's words."""
    if not is_int(value) or not 0 <= int(value) <= MASK64:
        raise ValueError(f"{name} must be an integer in [0, 2**64), got {value!r}")
    return int(value)


def check_params(params) -> None:
    """Normalise and check a frozen SamplingParams in place (its __post_init__ calls this): every
    field but top_k a finite float, top_k a non-negative int; ValueError naming the field."""
    for name in PARAM_FIELDS:
        if name != "top_k":
            object.__setattr__(params, name, as_float(getattr(params, name), name))  # 10**400: refused, named
    k = params.top_k
    if not is_int(k) or k < 0:
        raise ValueError(f"top_k must be a non-negative integer (0 = off), got {k!r}")
    object.__setattr__(params, "top_k", int(k))
    if params.temperature < 0:
        raise ValueError(f"temperature must be >= 0 (0 = greedy), got {params.temperature!r}")
    if not 0 < params.top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1] (1 = off), got {params.top_p!r}")
    if not 0 <= params.min_p <= 1:
        raise ValueError(f"min_p must be in [0, 1] (0 = off), got {params.min_p!r}")
    if params.repetition_penalty <= 0:
        raise ValueError(f"repetition_penalty must be > 0 (1 = off), got {params.repetition_penalty!r}")


def widen_logits(logits) -> np.ndarray:
    """Step 1: logits as a fresh float64 array (V,). float16/32/64 arrays widen exactly; a list or tuple
    of Python numbers is read as float64. Refuses other dtypes, other shapes, empty, non-finite."""
    if isinstance(logits, np.ndarray):
        if logits.dtype not in (np.float16, np.float32, np.float64):
            raise ValueError(f"logits have dtype {logits.dtype}; expected float32 (or float16/float64)")
        arr = logits
    elif isinstance(logits, (list, tuple)):
        try:
            arr = np.asarray(logits)
        except ValueError:
            raise ValueError("logits must be a 1-D sequence of numbers (got a ragged nesting)") from None
        if arr.dtype.kind not in "iuf":
            raise ValueError(f"logits must be numbers, got a sequence numpy reads as dtype {arr.dtype}")
        j = first_bool(logits)  # [True, 2.0] reads as floats: the list names the bool
        if j is not None:
            raise ValueError(f"logits must be numbers, got the bool {logits[j]!r} at id {j}")
    else:
        raise ValueError(f"logits must be a 1-D float array or a list of numbers, got {type(logits).__name__}")
    if arr.ndim != 1:
        raise ValueError(f"logits must be 1-D (vocab,), got shape {arr.shape}")
    if arr.size == 0:
        raise ValueError("logits are empty: the vocabulary needs at least one id")
    x = arr.astype(np.float64)  # always a copy
    bad = ~(np.abs(x) <= LOGIT_LIMIT)  # catches NaN and +-inf too
    if bad.any():
        i = int(np.argmax(bad))
        raise ValueError(f"logit of id {i} is {float(x[i])!r}: logits must be finite (and at most 2**1000 in size)")
    return x


def token_ids(ids, vocab: int, name: str) -> np.ndarray:
    """Token ids as an int64 array, each in [0, vocab), or ValueError naming the list and position."""
    if not isinstance(ids, np.ndarray):
        try:
            seq = list(ids)
        except TypeError:
            raise ValueError(f"{name} must be a sequence of token ids, got {type(ids).__name__}") from None
        try:
            ids = np.array(seq) if seq else np.zeros(0, np.int64)
        except (OverflowError, ValueError):
            ids = None
        if ids is None or ids.ndim != 1 or ids.dtype.kind not in "iu" or first_bool(seq) is not None:
            _explain_ids(seq, vocab, name)  # [True, 2] reads as ints: the list names the bool
    if ids.ndim != 1 or (ids.size and ids.dtype.kind not in "iu"):
        raise ValueError(f"{name} must be a 1-D array of integer token ids, got {ids.dtype} {ids.shape}")
    bad = (ids < 0) | (ids >= vocab)
    if bad.any():
        j = int(np.argmax(bad))
        raise ValueError(f"{name}[{j}] = {int(ids[j])} is outside the vocabulary [0, {vocab})")
    return ids.astype(np.int64)


def _explain_ids(seq: list, vocab: int, name: str) -> None:
    """Raise the ValueError that names the first element of `seq` that is not a token id."""
    for j, v in enumerate(seq):
        if not is_int(v):
            raise ValueError(f"{name}[{j}] = {v!r} is not an integer token id")
        if not 0 <= v < vocab:
            raise ValueError(f"{name}[{j}] = {int(v)} is outside the vocabulary [0, {vocab})")
    raise ValueError(f"{name} must be a flat sequence of integer token ids")


def check_call(logits, params, prompt, output, rng):
    """One sampler call's arguments -> (x (V,) f64, prompt ids (P,) int64, output ids (O,) int64).
    params: a SamplingParams (any object with its seven fields); rng: a Pcg32 (anything with
    `uniform_f64`), needed unless the temperature is 0."""
    if not all(hasattr(params, f) for f in PARAM_FIELDS):
        raise TypeError(f"params must be a SamplingParams, got {type(params).__name__}")
    x = widen_logits(logits)
    p_ids = token_ids(prompt, x.size, "prompt")
    o_ids = token_ids(output, x.size, "output")
    if params.temperature != 0.0 and not callable(getattr(rng, "uniform_f64", None)):
        raise TypeError(f"sampling with temperature > 0 needs a Pcg32 rng, got {type(rng).__name__}")
    return x, p_ids, o_ids


def range_error(what: str, i: int, v: float) -> ValueError:
    """The refusal of a penalised or scaled logit past LOGIT_LIMIT, naming its id."""
    return ValueError(f"{what} of id {i} is {v!r}, beyond the sampler's range of 2**1000")
