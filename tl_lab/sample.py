"""PCG32 and the bit-exact sampler (chapter L10.1, sections 2.6 and 3).

Two contracts live here, each pinned step by step in a spec:

- `docs/spec/pcg32.md`: the generator (`Pcg32`, `mix64`, `child_seed`, `stream`, `uniform_f64`).
- `docs/spec/sampling.md`: logits -> (token id, f64 logprob), the order of every stage and every sum.

The sampler exists twice and the two agree bit for bit (ids, logprobs and generator state):

- `sample` / `sample_trace` (here): the numpy path the engine uses, fast on a 49,152-token vocabulary;
- `tl_lab.sample_reference.sample_reference`: plain Python floats and loops, written to read like
  the spec (the lesson, given).

Where the spec says "a left-to-right sum", the numpy path uses `np.cumsum`, which for a 1-D float64
array is a sequential loop (`np.sum` is pairwise and would add in another order). Where the spec says
`exp`, it means Python's `math.exp` (the C library's); numpy's vectorized `exp`, or a compiled loop
calling the C library's, is used only after a self-check shows it returns the same bits on this
machine (see `exp_backend`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import numpy as np

from tl_lab.ops.checks import as_float, first_bool, is_int

__all__ = [
    "GOLDEN_GAMMA",
    "LOGIT_LIMIT",
    "PURPOSE_SAMPLE",
    "Pcg32",
    "SampleTrace",
    "SamplingParams",
    "child_seed",
    "exp_backend",
    "mix64",
    "sample",
    "sample_trace",
    "stream",
]

MASK64 = (1 << 64) - 1
PCG_MULT = 6364136223846793005  # pcg-c-basic's 64-bit LCG multiplier
GOLDEN_GAMMA = 0x9E3779B97F4A7C15  # splitmix64's increment: 2^64 / golden ratio, odd
PURPOSE_SAMPLE = 4  # the purpose id of the per-request sampling stream (chapter 2.6)
LOGIT_LIMIT = 2.0**1000  # |penalised or scaled logit| above this is refused, so l - max never overflows


# ---------------------------------------------------------------------------------------------------
# PCG32 (docs/spec/pcg32.md)


def _u64(value, name: str) -> int:
    """`value` as a Python int in [0, 2**64), or ValueError naming `name`.

    checks.as_int's rule, kept as its own function for the message: the spec's words for a 64-bit
    seed, "[0, 2**64)", which the sampler widget shows to the learner as they are."""
    if not is_int(value) or not 0 <= int(value) <= MASK64:
        raise ValueError(f"{name} must be an integer in [0, 2**64), got {value!r}")
    return int(value)


class Pcg32:
    """pcg32 of pcg-c-basic (XSH RR 64/32): 64-bit state, odd increment `inc`, 32-bit outputs.

    `Pcg32(seed, seq)` is pcg32_srandom_r(seed, seq): state = 0, inc = (seq << 1) | 1, one step,
    state += seed, one step. Chapter L10.1, section 2.6; docs/spec/pcg32.md.
    """

    __slots__ = ("state", "inc")

    def __init__(self, seed: int, seq: int):
        seed, seq = _u64(seed, "seed"), _u64(seq, "seq")
        self.state = 0
        self.inc = ((seq << 1) | 1) & MASK64
        self.next_u32()
        self.state = (self.state + seed) & MASK64
        self.next_u32()

    def next_u32(self) -> int:
        """Advance the LCG and return the XSH RR output of the OLD state, an int in [0, 2**32)."""
        old = self.state
        self.state = (old * PCG_MULT + self.inc) & MASK64
        xorshifted = (((old >> 18) ^ old) >> 27) & 0xFFFFFFFF
        rot = old >> 59
        return ((xorshifted >> rot) | (xorshifted << ((-rot) & 31))) & 0xFFFFFFFF

    def uniform_f64(self) -> float:
        """u in [0, 1) with 53 random bits from two outputs, a drawn first:
        u = ((a >> 5) * 2^26 + (b >> 6)) * 2^-53 (exact: the integer is below 2^53)."""
        a = self.next_u32()
        b = self.next_u32()
        return ((a >> 5) * 67108864 + (b >> 6)) * (1.0 / 9007199254740992.0)

    def copy(self) -> Pcg32:
        """An independent generator in the same state."""
        twin = object.__new__(Pcg32)
        twin.state, twin.inc = self.state, self.inc
        return twin

    def __eq__(self, other):
        if not isinstance(other, Pcg32):
            return NotImplemented
        return (self.state, self.inc) == (other.state, other.inc)

    __hash__ = None  # mutable

    def __repr__(self) -> str:
        return f"Pcg32(state=0x{self.state:016x}, inc=0x{self.inc:016x})"


def mix64(z: int) -> int:
    """The splitmix64 finalizer: a bijection on 64-bit ints that scrambles every input bit."""
    z = _u64(z, "z")
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def child_seed(seed: int, purpose: int) -> int:
    """mix64(seed + purpose * GOLDEN_GAMMA mod 2^64): one independent seed per purpose."""
    seed, purpose = _u64(seed, "seed"), _u64(purpose, "purpose")
    return mix64((seed + purpose * GOLDEN_GAMMA) & MASK64)


def stream(seed: int, purpose: int) -> Pcg32:
    """The generator for one purpose of one request: Pcg32(child_seed(seed, purpose), purpose).
    Sampling uses stream(seed, PURPOSE_SAMPLE)."""
    return Pcg32(child_seed(seed, purpose), _u64(purpose, "purpose"))


# ---------------------------------------------------------------------------------------------------
# Parameters and input checks (docs/spec/sampling.md, "Inputs")


@dataclass(frozen=True)
class SamplingParams:
    """What a request asks of the sampler. The "off" values: temperature 1.0 (no scaling; 0.0 means
    greedy), top_k 0, top_p 1.0, min_p 0.0, repetition_penalty 1.0, presence and frequency 0.0.
    Refused with ValueError naming the field: non-finite numbers, temperature < 0, top_k < 0 or not an
    integer, top_p outside (0, 1], min_p outside [0, 1], repetition_penalty <= 0."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0

    def __post_init__(self):
        for f in fields(self):
            if f.name == "top_k":
                continue
            object.__setattr__(self, f.name, as_float(getattr(self, f.name), f.name))  # 10**400: refused, named
        k = self.top_k
        if not is_int(k) or k < 0:
            raise ValueError(f"top_k must be a non-negative integer (0 = off), got {k!r}")
        object.__setattr__(self, "top_k", int(k))
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature!r}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1] (1 = off), got {self.top_p!r}")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1] (0 = off), got {self.min_p!r}")
        if self.repetition_penalty <= 0:
            raise ValueError(f"repetition_penalty must be > 0 (1 = off), got {self.repetition_penalty!r}")


def _widen(logits) -> np.ndarray:
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


def _ids(ids, vocab: int, name: str) -> np.ndarray:
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


def _check_call(logits, params, prompt, output, rng):
    if not isinstance(params, SamplingParams):
        raise TypeError(f"params must be a SamplingParams, got {type(params).__name__}")
    x = _widen(logits)
    p_ids = _ids(prompt, x.size, "prompt")
    o_ids = _ids(output, x.size, "output")
    if params.temperature != 0.0 and not isinstance(rng, Pcg32):
        raise TypeError(f"sampling with temperature > 0 needs a Pcg32 rng, got {type(rng).__name__}")
    return x, p_ids, o_ids


def _range_error(what: str, i: int, v: float) -> ValueError:
    return ValueError(f"{what} of id {i} is {v!r}, beyond the sampler's range of 2**1000")


# ---------------------------------------------------------------------------------------------------
# The numpy path: same steps, same sums, vectorized


_EXP_BACKEND: str | None = None  # exp_backend's answer, once a process


def _exp_battery() -> np.ndarray:
    """Deterministic arguments covering what the sampler feeds exp: (-745.2, 0]."""
    k = np.arange(1, 6001, dtype=np.float64)
    frac = (k * 0.6180339887498949) % 1.0
    spans = [1.0, 4.0, 20.0, 100.0, 745.2]
    special = [0.0, -0.0, -5e-324, -1e-300, -1e-16, -0.5, -0.6931471805599453, -708.39, -745.13, -745.2, -800.0]
    return np.concatenate([-frac * s for s in spans] + [np.array(special)])


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return bool(np.array_equal(a.view(np.uint64), b.view(np.uint64)))


def exp_backend() -> str:
    """Which exp the fast path calls, the first that returns math.exp's bits on the self-check
    battery: "numpy" (np.exp calls the C library here), "compiled" (numpy has its own SIMD exp on
    this CPU; `tl_lab.ops.kernels.exp_f64` calls the C library's in a compiled loop), else "math"
    (math.exp per element, a few ms on 49,152 ids)."""
    global _EXP_BACKEND
    if _EXP_BACKEND is None:
        x = _exp_battery()
        ref = _math_exp(x)
        if _same_bits(np.exp(x), ref):
            _EXP_BACKEND = "numpy"
        elif _same_bits(_compiled_exp(x), ref):
            _EXP_BACKEND = "compiled"
        else:
            _EXP_BACKEND = "math"
    return _EXP_BACKEND


def _compiled_exp(x: np.ndarray) -> np.ndarray:
    from tl_lab.ops.lazy_kernels import exp_f64  # numba is imported here, on the first sample, and only if needed

    return exp_f64(x)


def _exp(x: np.ndarray) -> np.ndarray:
    """Elementwise exp with math.exp's bits."""
    backend = exp_backend()
    if backend == "numpy":
        return np.exp(x)
    if backend == "compiled":
        return _compiled_exp(x)
    return _math_exp(x)


def _math_exp(x: np.ndarray) -> np.ndarray:
    """math.exp of each element, one Python call each: the bits every backend must give."""
    return np.fromiter(map(math.exp, x.tolist()), dtype=np.float64, count=x.size)


def _lsum(x: np.ndarray) -> float:
    """The left-to-right sum ((x0 + x1) + x2) + ... : cumsum is sequential for 1-D float64."""
    return float(np.cumsum(x)[-1])


@dataclass(frozen=True)
class SampleTrace:
    """Every stage of one `sample` call (docs/spec/sampling.md). Kept sets are int64 id arrays in
    ascending id order; each `*_probs` is the softmax over that set (aligned with it). Stages that a
    greedy call never reaches are None."""

    logits: np.ndarray  # (V,) f64, the widened input
    penalised: np.ndarray  # (V,) f64, after step 2
    logprobs: np.ndarray  # (V,) f64, log_softmax(penalised)
    greedy: bool
    scaled: np.ndarray | None  # (V,) q = l / T
    weights: np.ndarray | None  # (V,) w = exp(q - max q)
    top_k: np.ndarray | None
    top_k_probs: np.ndarray | None
    nucleus_order: np.ndarray | None  # top-p walk: ids in (q desc, id asc) order up to the stop
    nucleus_cum: np.ndarray | None  # the running sum at each id of the walk
    top_p: np.ndarray | None
    top_p_probs: np.ndarray | None
    min_p: np.ndarray | None
    kept: np.ndarray  # the final kept set (greedy: just the token)
    probs: np.ndarray  # final probabilities over `kept`
    cdf: np.ndarray  # running sum of `probs` in ascending id order
    u: float | None  # the one draw (None when greedy)
    token: int
    logprob: float


def sample(logits, params: SamplingParams, prompt, output, rng: Pcg32 | None) -> tuple[int, float]:
    """Logits (V,) float32 -> (token id, f64 logprob), exactly docs/spec/sampling.md. Greedy
    (temperature 0) takes no draw; any other call takes exactly one `rng.uniform_f64()`."""
    return _run(logits, params, prompt, output, rng, trace=False)


def sample_trace(logits, params: SamplingParams, prompt, output, rng: Pcg32 | None) -> SampleTrace:
    """`sample` with every stage recorded (for the playground). Same code path, same draw."""
    return _run(logits, params, prompt, output, rng, trace=True)


def _penalise(x: np.ndarray, params: SamplingParams, prompt: np.ndarray, output: np.ndarray) -> np.ndarray:
    """Step 2, vectorized: the same one operation per touched id as `_ref_penalise`."""
    l = x
    r = params.repetition_penalty
    seen = np.unique(np.concatenate([prompt, output]))
    with np.errstate(over="ignore"):  # an overflow is refused just below, by id
        if seen.size:
            v = l[seen]
            l[seen] = np.where(v > 0, v / r, v * r)
        if output.size:
            ids, counts = np.unique(output, return_counts=True)
            l[ids] = l[ids] - (params.frequency_penalty * counts.astype(np.float64) + params.presence_penalty)
    l += 0.0  # -0.0 -> +0.0
    bad = ~(np.abs(l) <= LOGIT_LIMIT)
    if bad.any():
        i = int(np.argmax(bad))
        raise _range_error("the penalised logit", i, float(l[i]))
    return l


def _top_ids(q: np.ndarray, n: int) -> np.ndarray:
    """Ascending ids of every value >= the n-th largest of q (ties at the edge included)."""
    if n >= q.size:
        return np.arange(q.size)
    edge = np.partition(q, q.size - n)[q.size - n]
    return np.flatnonzero(q >= edge)


def _by_q_desc(q: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """ids ordered by (q desc, id asc)."""
    return ids[np.lexsort((ids, -q[ids]))]


def _top_k(q: np.ndarray, k: int) -> np.ndarray:
    """Step 6: the k ids first in (q desc, id asc) order, ascending."""
    cand = _top_ids(q, k)
    if cand.size == k:
        return cand
    return np.sort(_by_q_desc(q, cand)[:k])


def _nucleus(q, w, kept, p):
    """Step 7. kept: ascending ids (None = all). Returns (walked ids in order, running sums)."""
    Z_k = _lsum(w if kept is None else w[kept])
    n_all = q.size if kept is None else kept.size
    n = min(n_all, 64)
    while True:
        # the top-n candidates (plus ties) sorted are exactly the first ids of the full walk order
        if kept is None:
            cand = _top_ids(q, n)
        else:
            cand = kept if n >= kept.size else kept[_top_ids(q[kept], n)]
        order = _by_q_desc(q, cand)
        cum = np.cumsum(w[order] / Z_k)
        hit = cum >= p
        if hit.any():
            j = int(np.argmax(hit)) + 1
            return order[:j], cum[:j]
        if cand.size == n_all:  # the sum never reached p: keep the whole set
            return order, cum
        n *= 8


def _weights(q: np.ndarray, q_max: float, ids: np.ndarray | None, reuse: np.ndarray | None) -> np.ndarray:
    """(V,) array holding w_i = exp(q_i - q_max) at `ids` (all when None). Unneeded slots hold 0."""
    if reuse is not None:
        return reuse
    if ids is None:
        return _exp(q - q_max)
    w = np.zeros(q.size)
    w[ids] = _exp(q[ids] - q_max)
    return w


def _softmax_over(w: np.ndarray, ids: np.ndarray | None) -> np.ndarray:
    wk = w if ids is None else w[ids]
    return wk / _lsum(wk)


def _run(logits, params, prompt, output, rng, trace):
    x, prompt_ids, output_ids = _check_call(logits, params, prompt, output, rng)
    l = _penalise(x.copy() if trace else x, params, prompt_ids, output_ids)
    M = float(l.max())
    e = _exp(l - M)
    log_Z = math.log(_lsum(e))
    rec = {}
    if trace:
        rec.update(logits=x, penalised=l, logprobs=(l - M) - log_Z)

    T = params.temperature
    if T == 0.0:
        t = int(np.argmax(l))  # the first maximum
        logprob = (float(l[t]) - M) - log_Z
        if not trace:
            return t, logprob
        one = np.array([t])
        return SampleTrace(**rec, greedy=True, scaled=None, weights=None, top_k=None, top_k_probs=None,
                           nucleus_order=None, nucleus_cum=None, top_p=None, top_p_probs=None, min_p=None,
                           kept=one, probs=np.ones(1), cdf=np.ones(1), u=None, token=t, logprob=logprob)

    if not float(np.abs(l).max()) / T <= LOGIT_LIMIT:  # division is monotone: max |q| = max |l| / T
        with np.errstate(over="ignore"):
            i = int(np.argmax(~(np.abs(l / T) <= LOGIT_LIMIT)))
        raise ValueError(f"temperature {T!r} is too small: the scaled logit of id {i} overflows")
    q = l if T == 1.0 else l / T
    q_max = float(q.max())
    k, V = params.top_k, l.size
    kept = _top_k(q, k) if 0 < k < V else None  # None: every id
    # w = e when T == 1 (q = l, q_max = M); in a trace, weights of every id for the charts
    w = _weights(q, q_max, None if trace else kept, e if T == 1.0 else None)
    if trace:
        rec.update(scaled=q, weights=w, top_k=_all(kept, V), top_k_probs=_softmax_over(w, kept))

    order = cum = None
    if params.top_p != 1.0:
        order, cum = _nucleus(q, w, kept, params.top_p)
        kept = np.sort(order)
    if trace:
        rec.update(nucleus_order=order, nucleus_cum=cum, top_p=_all(kept, V), top_p_probs=_softmax_over(w, kept))

    if params.min_p != 0.0:
        kept = np.flatnonzero(w >= params.min_p) if kept is None else kept[w[kept] >= params.min_p]

    probs = _softmax_over(w, kept)
    cdf = np.cumsum(probs)
    u = rng.uniform_f64()
    j = int(np.searchsorted(cdf, u, side="right"))  # the first position with u < c
    if j == cdf.size:  # rounding left the total at or below u: the last kept id with p > 0
        j = int(np.flatnonzero(probs > 0.0)[-1])
    t = j if kept is None else int(kept[j])
    logprob = (float(l[t]) - M) - log_Z
    if not trace:
        return t, logprob
    return SampleTrace(**rec, greedy=False, min_p=_all(kept, V), kept=_all(kept, V), probs=probs, cdf=cdf,
                       u=u, token=t, logprob=logprob)


def _all(kept: np.ndarray | None, V: int) -> np.ndarray:
    return np.arange(V) if kept is None else kept


def __getattr__(name: str):
    # `from tl_lab.sample import sample_reference` as before the readable twin had a module of its own
    if name == "sample_reference":
        from tl_lab.sample_reference import sample_reference

        return sample_reference
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
