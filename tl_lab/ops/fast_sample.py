"""The sampler, vectorized: what the engine runs on a 49,152-id vocabulary when the sampler in use is
the reference's (`tl_lab.engine.generate`). Given code, not a piece of the learner's.

Chapter L10.1, section 2.6, and docs/spec/sampling.md: the same steps, the same sums in the same
order, the same draw as `tl_lab.sample.sample`, which is written to read like the spec (plain Python
floats and loops). tests/test_sample.py holds the two equal bit for bit: ids, logprobs, every stage
of a trace and the generator's state. Where the spec says "a left-to-right sum", this path uses
`np.cumsum`, a sequential loop for a 1-D float64 array (`np.sum` is pairwise and would add in another
order). Where the spec says `exp`, it means Python's `math.exp` (the C library's); numpy's vectorized
`exp`, or a compiled loop calling the C library's, is used only after a self-check shows it returns
the same bits on this machine (`exp_backend`).
"""

from __future__ import annotations

import math

import numpy as np

from tl_lab.ops.sampler_checks import LOGIT_LIMIT, check_call, range_error

__all__ = ["exp_backend", "sample", "trace", "is_reference"]


def sample(logits, params, prompt, output, rng) -> tuple[int, float]:
    """`tl_lab.sample.sample`'s (token id, f64 logprob), bit for bit, vectorized."""
    return _run(logits, params, prompt, output, rng, trace=False)


def trace(logits, params, prompt, output, rng) -> dict:
    """`tl_lab.sample.sample_trace`'s fields as a dict, bit for bit, vectorized."""
    return _run(logits, params, prompt, output, rng, trace=True)


def is_reference(module) -> bool:
    """Whether `module` (the `tl_lab.sample` in use) is the reference's own file, unedited: only then
    may the engine run this path in its place (a learner's sampler, or one a pitfall edited, runs
    itself)."""
    from importlib.machinery import SourceFileLoader
    from pathlib import Path

    from tl_lab.ops.paths import PACKAGE_DIR

    spec = getattr(module, "__spec__", None)
    return (spec is not None and type(spec.loader) is SourceFileLoader
            and Path(spec.origin or "").resolve() == PACKAGE_DIR / "sample.py")


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


def _penalise(x: np.ndarray, params: SamplingParams, prompt: np.ndarray, output: np.ndarray) -> np.ndarray:
    """Step 2, vectorized: the same one operation per touched id as `tl_lab.sample._penalise`."""
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
        raise range_error("the penalised logit", i, float(l[i]))
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
    """The whole sampler; trace: every stage as a dict of SampleTrace's fields, else (id, logprob)."""
    x, prompt_ids, output_ids = check_call(logits, params, prompt, output, rng)
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
        return dict(**rec, greedy=True, scaled=None, weights=None, top_k=None, top_k_probs=None,
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
    return dict(**rec, greedy=False, min_p=_all(kept, V), kept=_all(kept, V), probs=probs, cdf=cdf,
                       u=u, token=t, logprob=logprob)


def _all(kept: np.ndarray | None, V: int) -> np.ndarray:
    return np.arange(V) if kept is None else kept
