"""The sampler as the spec reads, in plain Python: the readable twin of `tl_lab.sample.sample`.

Chapter L10.1, section 2.6 and docs/spec/sampling.md: Python floats (IEEE f64), math.exp / math.log,
explicit left-to-right loops. Given, not the learner's: `tl_lab.sample` is what the learner writes,
and the lab's tests hold its numpy path to this one bit for bit (ids, logprobs, generator state).
"""

from __future__ import annotations

import math

from tl_lab.sample import LOGIT_LIMIT, Pcg32, SamplingParams, _check_call, _range_error

__all__ = ["sample_reference"]


# ---------------------------------------------------------------------------------------------------
# The reference: plain Python, one loop per step of docs/spec/sampling.md


def sample_reference(logits, params: SamplingParams, prompt, output, rng: Pcg32 | None) -> tuple[int, float]:
    """The sampler as the spec reads: Python floats (IEEE f64), math.exp / math.log, explicit
    left-to-right loops. Returns (token id, logprob). Chapter L10.1, section 2.6."""
    x, prompt_ids, output_ids = _check_call(logits, params, prompt, output, rng)
    l = x.tolist()
    l = _ref_penalise(l, params, prompt_ids.tolist(), output_ids.tolist())
    V = len(l)

    # Step 3: the logprob normaliser over the whole vocabulary, before temperature.
    M = max(l)
    Z = 0.0
    for i in range(V):
        Z += math.exp(l[i] - M)
    log_Z = math.log(Z)

    # Step 4: greedy: the first id holding the maximum; no draw.
    T = params.temperature
    if T == 0.0:
        t = 0
        for i in range(1, V):
            if l[i] > l[t]:
                t = i
        return t, (l[t] - M) - log_Z

    # Step 5: temperature.
    q = [v / T for v in l]
    for i in range(V):
        if not abs(q[i]) <= LOGIT_LIMIT:
            raise ValueError(f"temperature {T!r} is too small: the scaled logit of id {i} overflows")
    q_max = max(q)
    w = {}  # w_i = exp(q_i - q_max), computed once per id that needs it

    def weight(i):
        if i not in w:
            w[i] = math.exp(q[i] - q_max)
        return w[i]

    def by_q_desc(ids):
        return sorted(ids, key=lambda i: (-q[i], i))

    # Step 6: top-k: the first k ids in (q desc, id asc) order.
    kept = list(range(V))
    k = params.top_k
    if 0 < k < V:
        kept = sorted(by_q_desc(kept)[:k])

    # Step 7: top-p over the top-k set: probabilities normalised over that set in ascending id order,
    # walked in (q desc, id asc) order, keeping up to and including the id where the sum reaches p.
    if params.top_p != 1.0:
        Z_k = 0.0
        for i in kept:
            Z_k += weight(i)
        nucleus = []
        c = 0.0
        for i in by_q_desc(kept):
            nucleus.append(i)
            c += weight(i) / Z_k
            if c >= params.top_p:
                break
        kept = nucleus

    # Step 8: min-p: keep ids whose weight (probability relative to the top id) is at least m.
    kept = sorted(kept)
    if params.min_p != 0.0:
        kept = [i for i in kept if weight(i) >= params.min_p]

    # Step 9: softmax over the kept ids in ascending id order, one draw, walk the cumulative sum.
    Z_f = 0.0
    for i in kept:
        Z_f += weight(i)
    p = [weight(i) / Z_f for i in kept]
    u = rng.uniform_f64()
    c = 0.0
    t = None
    for j, i in enumerate(kept):
        c += p[j]
        if u < c:
            t = i
            break
    if t is None:  # rounding left the total at or below u: the last kept id with p > 0
        t = [i for j, i in enumerate(kept) if p[j] > 0.0][-1]
    return t, (l[t] - M) - log_Z


def _ref_penalise(l: list, params: SamplingParams, prompt: list, output: list) -> list:
    """Step 2: repetition over distinct ids of prompt and output, then presence and frequency over
    the output only, then -0.0 -> +0.0."""
    r = params.repetition_penalty
    for i in sorted(set(prompt) | set(output)):
        if l[i] > 0:
            l[i] = l[i] / r
        else:
            l[i] = l[i] * r
    counts = {}
    for i in output:
        counts[i] = counts.get(i, 0) + 1
    for i in sorted(counts):
        l[i] = l[i] - (params.frequency_penalty * counts[i] + params.presence_penalty)
    l = [v + 0.0 for v in l]
    for i, v in enumerate(l):
        if not abs(v) <= LOGIT_LIMIT:
            raise _range_error("the penalised logit", i, v)
    return l
