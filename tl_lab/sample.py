"""PCG32 and the bit-exact sampler (chapter L10.1, sections 2.6 and 3).

Two contracts live here, each pinned step by step in a spec:

- `docs/spec/pcg32.md`: the generator (`Pcg32`, `mix64`, `child_seed`, `stream`, `uniform_f64`).
- `docs/spec/sampling.md`: logits -> (token id, f64 logprob), the order of every stage and every sum.

Written to read like the spec: Python floats (IEEE f64), `math.exp` and `math.log`, one plain loop
per step, each step a function of its own. `sample` and `sample_trace` share one code path. The
given checks of every input live in `tl_lab.ops.sampler_checks`. The engine may run a vectorized
twin of this file (`tl_lab.ops.fast_sample`, held to it bit for bit) when this file is the reference.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from tl_lab.ops.sampler_checks import LOGIT_LIMIT, MASK64, check_call, check_params, range_error, u64

__all__ = [
    "GOLDEN_GAMMA",
    "LOGIT_LIMIT",
    "PURPOSE_SAMPLE",
    "Pcg32",
    "SampleTrace",
    "SamplingParams",
    "child_seed",
    "mix64",
    "sample",
    "sample_trace",
    "stream",
]

PCG_MULT = 6364136223846793005  # pcg-c-basic's 64-bit LCG multiplier
GOLDEN_GAMMA = 0x9E3779B97F4A7C15  # splitmix64's increment: 2^64 / golden ratio, odd
PURPOSE_SAMPLE = 4  # the purpose id of the per-request sampling stream (chapter 2.6)


# ---------------------------------------------------------------------------------------------------
# PCG32 (docs/spec/pcg32.md)


class Pcg32:
    """pcg32 of pcg-c-basic (XSH RR 64/32): 64-bit state, odd increment `inc`, 32-bit outputs.

    `Pcg32(seed, seq)` is pcg32_srandom_r(seed, seq): state = 0, inc = (seq << 1) | 1, one step,
    state += seed, one step. Chapter L10.1, section 2.6; docs/spec/pcg32.md.
    """

    __slots__ = ("state", "inc")

    def __init__(self, seed: int, seq: int):
        seed, seq = u64(seed, "seed"), u64(seq, "seq")
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
    z = u64(z, "z")
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def child_seed(seed: int, purpose: int) -> int:
    """mix64(seed + purpose * GOLDEN_GAMMA mod 2^64): one independent seed per purpose."""
    seed, purpose = u64(seed, "seed"), u64(purpose, "purpose")
    return mix64((seed + purpose * GOLDEN_GAMMA) & MASK64)


def stream(seed: int, purpose: int) -> Pcg32:
    """The generator for one purpose of one request: Pcg32(child_seed(seed, purpose), purpose).
    Sampling uses stream(seed, PURPOSE_SAMPLE)."""
    return Pcg32(child_seed(seed, purpose), u64(purpose, "purpose"))


# ---------------------------------------------------------------------------------------------------
# The sampler (docs/spec/sampling.md)


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
        check_params(self)  # given: tl_lab.ops.sampler_checks


@dataclass(frozen=True)
class SampleTrace:
    """Every stage of one `sample` call (docs/spec/sampling.md), as numpy arrays: (V,) float64 rows,
    int64 id sets in ascending id order, each `*_probs` the softmax over its set (aligned with it).
    A greedy call stops at step 4: scaled, weights, top_k, top_k_probs, nucleus_order, nucleus_cum,
    top_p, top_p_probs, min_p and u are None; kept is [token], probs and cdf are [1.0]. A filter that
    is off keeps its input: top_k (top_k 0) and top_p (top_p 1.0) hold every id they were given, and
    nucleus_order and nucleus_cum are None when top_p is 1.0."""

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
    t = sample_trace(logits, params, prompt, output, rng)
    return t.token, t.logprob


def sample_trace(logits, params: SamplingParams, prompt, output, rng: Pcg32 | None) -> SampleTrace:
    """`sample` with every stage recorded (SampleTrace). Steps 1 to 9 of docs/spec/sampling.md.

    logits: (V,) float16/32/64 array or a list of numbers; prompt, output: token ids (lists or int
    arrays, possibly empty); rng: a Pcg32, or None when greedy. The checks (step 1) are given:
    `check_call` -> (x (V,) f64 array, prompt ids, output ids), ValueError/TypeError naming what is
    wrong."""
    x, prompt_ids, output_ids = check_call(logits, params, prompt, output, rng)
    l = _penalise(x.tolist(), params, prompt_ids.tolist(), output_ids.tolist())
    M = max(l)
    log_Z = math.log(_lsum([math.exp(v - M) for v in l]))  # step 3: before temperature
    rec = dict(logits=x, penalised=_f64(l), logprobs=_f64([(v - M) - log_Z for v in l]))
    T = params.temperature
    if T == 0.0:  # step 4: the first id holding the maximum, no draw
        t = l.index(M)
        return SampleTrace(**rec, greedy=True, scaled=None, weights=None, top_k=None, top_k_probs=None,
                           nucleus_order=None, nucleus_cum=None, top_p=None, top_p_probs=None, min_p=None,
                           kept=_ids([t]), probs=_f64([1.0]), cdf=_f64([1.0]), u=None, token=t,
                           logprob=(l[t] - M) - log_Z)
    q = _scale(l, T)
    q_max = max(q)
    w = [math.exp(v - q_max) for v in q]
    kept = _top_k(q, params.top_k)
    rec.update(scaled=_f64(q), weights=_f64(w), top_k=_ids(kept), top_k_probs=_f64(_softmax(w, kept)))
    order = cum = None
    if params.top_p != 1.0:
        order, cum = _top_p(q, w, kept, params.top_p)
        kept = sorted(order)
    rec.update(nucleus_order=None if order is None else _ids(order), nucleus_cum=None if cum is None else _f64(cum),
               top_p=_ids(kept), top_p_probs=_f64(_softmax(w, kept)))
    kept = _min_p(w, kept, params.min_p)
    probs = _softmax(w, kept)
    u = rng.uniform_f64()
    t, cdf = _draw(kept, probs, u)
    return SampleTrace(**rec, greedy=False, min_p=_ids(kept), kept=_ids(kept), probs=_f64(probs), cdf=_f64(cdf), u=u,
                       token=t, logprob=(l[t] - M) - log_Z)


def _penalise(l: list, params: SamplingParams, prompt: list, output: list) -> list:
    """Step 2. l: the V logits as Python floats; prompt, output: token ids (lists of int).
    Repetition over the distinct ids of prompt AND output (in ascending id order): a positive logit
    divided by r, any other multiplied by r. Then presence and frequency over the OUTPUT only:
    l[i] - (frequency * count_i + presence), ids ascending. Then -0.0 -> +0.0. -> a new list.
    A result past LOGIT_LIMIT is refused with `range_error("the penalised logit", i, v)`."""
    l = list(l)
    r = params.repetition_penalty
    for i in sorted(set(prompt) | set(output)):
        l[i] = l[i] / r if l[i] > 0 else l[i] * r
    counts = {}
    for i in output:
        counts[i] = counts.get(i, 0) + 1
    for i in sorted(counts):
        l[i] = l[i] - (params.frequency_penalty * counts[i] + params.presence_penalty)
    l = [v + 0.0 for v in l]
    for i, v in enumerate(l):
        if not abs(v) <= LOGIT_LIMIT:
            raise range_error("the penalised logit", i, v)
    return l


def _scale(l: list, T: float) -> list:
    """Step 5: q_i = l_i / T; a q past LOGIT_LIMIT is refused, naming the first such id."""
    q = [v / T for v in l]
    for i, v in enumerate(q):
        if not abs(v) <= LOGIT_LIMIT:
            raise ValueError(f"temperature {T!r} is too small: the scaled logit of id {i} overflows")
    return q


def _by_q_desc(q: list, ids: list) -> list:
    """ids in (q descending, id ascending) order: the order every filter walks."""
    return sorted(ids, key=lambda i: (-q[i], i))


def _top_k(q: list, k: int) -> list:
    """Step 6: with 0 < k < V, the first k ids in (q desc, id asc) order, returned in ascending id
    order; else every id 0 .. V-1."""
    if 0 < k < len(q):
        return sorted(_by_q_desc(q, range(len(q)))[:k])
    return list(range(len(q)))


def _top_p(q: list, w: list, kept: list, p: float) -> tuple[list, list]:
    """Step 7, over the ascending ids `kept`: Z_k = the left-to-right sum of w over kept (ascending
    ids); walk kept in (q desc, id asc) order adding w_i / Z_k, keeping each id up to and INCLUDING
    the one where the running sum reaches p (>= p). -> (the walked ids in walk order, the running
    sum after each); the whole set when the sum never reaches p."""
    Z_k = _lsum([w[i] for i in kept])
    order, cum, c = [], [], 0.0
    for i in _by_q_desc(q, kept):
        c += w[i] / Z_k
        order.append(i)
        cum.append(c)
        if c >= p:
            break
    return order, cum


def _min_p(w: list, kept: list, m: float) -> list:
    """Step 8: the ids of `kept` (ascending) whose weight w_i (its probability relative to the top
    id's) is at least m; m = 0.0 is off and keeps them all."""
    if m == 0.0:
        return kept
    return [i for i in kept if w[i] >= m]


def _softmax(w: list, ids: list) -> list:
    """w_i / Z over `ids` in their order, Z the left-to-right sum of their w."""
    Z = _lsum([w[i] for i in ids])
    return [w[i] / Z for i in ids]


def _draw(kept: list, probs: list, u: float) -> tuple[int, list]:
    """Step 9: walk the running sum of `probs` in ASCENDING ID order (kept's order); the token is the
    first id with u < the sum. When rounding leaves the total at or below u, the last kept id with
    p > 0. -> (token, the running sums)."""
    cdf, c = [], 0.0
    for p in probs:
        c += p
        cdf.append(c)
    for j, c in enumerate(cdf):
        if u < c:
            return kept[j], cdf
    return [i for i, p in zip(kept, probs) if p > 0.0][-1], cdf


def _lsum(xs: list) -> float:
    """The left-to-right sum ((x0 + x1) + x2) + ... the spec asks for everywhere."""
    s = 0.0
    for x in xs:
        s += x
    return s


def _f64(xs) -> np.ndarray:
    return np.array(xs, dtype=np.float64)


def _ids(xs) -> np.ndarray:
    return np.array(xs, dtype=np.int64)
