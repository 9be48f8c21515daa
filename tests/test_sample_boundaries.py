"""tl_lab/sample.py's filters and checks at every limit (issue 62): top_k, top_p and min_p each tested
exactly at their edge, one under and one over, on logits whose weights are exact (ties: w = 1 for
every id at the top, so each running sum is a sum of exact quarters or eighths), and the parameter and
input ranges at their edges. What a filter keeps is read from `sample_trace` (the learner's file);
the engine's vectorized twin, tl_lab/ops/fast_sample.py, must give the same (compared here, and bit
for bit in tests/test_sample.py).

The comparisons (file:function: the comparison), each pinned by the test named after it:

    ops/sampler_checks.py:check_params: top_k >= 0                       test_parameters_at_their_edges
    ops/sampler_checks.py:check_params: temperature >= 0                 test_parameters_at_their_edges
    ops/sampler_checks.py:check_params: 0 < top_p <= 1                   test_parameters_at_their_edges
    ops/sampler_checks.py:check_params: 0 <= min_p <= 1                  test_parameters_at_their_edges
    ops/sampler_checks.py:check_params: repetition_penalty > 0           test_parameters_at_their_edges
    ops/sampler_checks.py:widen_logits: |x| <= LOGIT_LIMIT (2**1000)     test_logits_at_the_size_limit
    ops/sampler_checks.py:widen_logits: size == 0                        test_logits_at_the_size_limit
    ops/sampler_checks.py:token_ids: 0 <= id < V (prompt, output)        test_history_ids_at_the_vocabulary_edges
    sample.py:_top_k: 0 < k < V (top_k on)                               test_top_k_at_the_vocabulary_size
    fast_sample.py:_top_ids: n >= q.size; q >= edge (ties at the edge)   test_top_k_at_a_tie
    fast_sample.py:_top_k: cand.size == k                                test_top_k_at_a_tie
    sample.py:_top_p: c >= p (the id that reaches p is kept)             test_top_p_at_a_running_sum
    fast_sample.py:_nucleus: cum >= p                                    test_top_p_at_a_running_sum
    fast_sample.py:_nucleus: n = min(n_all, 64); cand.size == n_all      test_top_p_past_the_first_64_candidates
    sample.py:sample_trace: top_p != 1.0 (the step is skipped at 1)      test_top_p_at_a_running_sum
    sample.py:_min_p: w >= m (a weight equal to min_p is kept)           test_min_p_at_a_weight
    sample.py:_min_p: m == 0.0 (the step is skipped at 0)                test_min_p_at_a_weight
    sample.py:_draw: u < c_j picks j                                     test_the_draw_at_a_cdf_step
    sample.py:_draw: the total at or below u: last kept id with p > 0    test_the_draw_past_a_rounded_total

Three comparisons no test can tell apart, found equivalent (docs/dev/mutation.md): fast_sample's
`_top_ids` `n >= q.size` as `>` (at n == size the partition's edge is the minimum, and every id is kept
either way), `0 < k < V` as `<= V` (top_k = V keeps every id either way), and the nucleus's first look
of 64 candidates as any other count (the walk widens until it reaches p; the count is speed, not result).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from tl_lab.sample import LOGIT_LIMIT, Pcg32, SamplingParams, sample, sample_trace, stream
from tl_lab.ops.fast_sample import sample as fast_sample


def kept(logits, **params) -> list[int]:
    tr = sample_trace(np.asarray(logits, np.float32), SamplingParams(**params), [], [], stream(1, 4))
    return tr.kept.tolist()


DISTINCT = [5.0, 4.0, 3.0, 2.0, 1.0, 0.0]  # V = 6, id 0 the best


@pytest.mark.parametrize("k, want", [(0, 6), (1, 1), (5, 5), (6, 6), (7, 6)])
def test_top_k_at_the_vocabulary_size(k, want):
    """k = V - 1 keeps all but the worst; k = V and k = V + 1 keep all (the step is off); 0 is off."""
    assert kept(DISTINCT, top_k=k) == list(range(want))


@pytest.mark.parametrize("logits, k, want", [
    ([3, 2, 2, 2, 1], 1, [0]),
    ([3, 2, 2, 2, 1], 2, [0, 1]),        # a tie at the edge: the lowest id of the tie
    ([3, 2, 2, 2, 1], 3, [0, 1, 2]),
    ([3, 2, 2, 2, 1], 4, [0, 1, 2, 3]),  # the tie exactly filled
    ([2, 3, 2, 3, 1], 2, [1, 3]),        # the two best, tied
    ([2, 3, 2, 3, 1], 3, [0, 1, 3]),
])
def test_top_k_at_a_tie(logits, k, want):
    assert kept(logits, top_k=k) == want


# Four tied ids: w = 1 each, Z = 4, the running sums 0.25, 0.5, 0.75, 1.0 exactly.
TIES4 = [0.0, 0.0, 0.0, 0.0]
BELOW, ABOVE = math.nextafter(0.5, 0.0), math.nextafter(0.5, 1.0)


@pytest.mark.parametrize("p, want", [
    (0.25, 1),      # the first id reaches p exactly: kept alone
    (BELOW, 2),
    (0.5, 2),       # the second id reaches p exactly: two kept, not three
    (ABOVE, 3),     # one ulp over: the third id is needed
    (0.75, 3),
    (1.0, 4),       # off
])
def test_top_p_at_a_running_sum(p, want):
    assert kept(TIES4, top_p=p) == list(range(want))


def running_sums(x) -> list[float]:
    """The nucleus's running sums for distinct logits x in descending order (id order), as the spec
    computes them: w_i = exp(q_i - q_max), Z summed left to right in id order, then w_i / Z summed."""
    w = [math.exp(float(v) - float(x[0])) for v in x]
    Z = 0.0
    for v in w:
        Z += v
    out, c = [], 0.0
    for v in w:
        c += v / Z
        out.append(c)
    return out


def nucleus_rows():
    """(V, n, over, p): p the running sum of the first n of V distinct ids (one ulp over when `over`),
    for every n around the first look's 64 whose p is a valid top_p (a full sum may round above 1)."""
    rows = []
    for V in (65, 66):
        sums = running_sums(np.linspace(0.0, -0.5, V).astype(np.float32))
        for n in range(63, V + 1):
            for over in (False, True):
                p = math.nextafter(sums[n - 1], 2.0) if over else sums[n - 1]
                if p <= 1.0:
                    rows.append((V, n, over, p))
    return rows


@pytest.mark.parametrize("V, n, over, p", nucleus_rows())
def test_top_p_past_the_first_64_candidates(V, n, over, p):
    """V distinct ids (each needed for p near 1). p set exactly to the running sum of the first n ids
    keeps n of them; one ulp over keeps n + 1. The walk looks at 64 candidates first, then 8 times
    more: n = 64 is its edge, and V = 65 leaves exactly one id outside the first look."""
    x = np.linspace(0.0, -0.5, V).astype(np.float32)
    want = min(n + over, V)  # past the last id's sum: the whole set
    assert kept(x, top_p=p) == list(range(want))
    a = sample(x, SamplingParams(top_p=p), [], [], stream(3, 4))
    assert a == fast_sample(x, SamplingParams(top_p=p), [], [], stream(3, 4))


E1 = math.exp(-1.0)  # the weight of logit -1 under a best of 0: exactly what the sampler computes


@pytest.mark.parametrize("m, want", [
    (0.0, [0, 1, 2, 3]),                        # off
    (math.nextafter(E1, 0.0), [0, 1, 2]),
    (E1, [0, 1, 2]),                             # a weight equal to min_p is kept
    (math.nextafter(E1, 1.0), [0, 1]),
    (1.0, [0, 1]),                               # min_p 1: the tied best only
])
def test_min_p_at_a_weight(m, want):
    logits = [0.0, 0.0, -1.0, -3.0]
    assert kept(logits, min_p=m) == want if m != 0.0 else kept(logits) == want
    assert kept(logits, min_p=m, top_k=3) == [i for i in want if i < 3]


class FixedDraw(Pcg32):
    """A generator whose uniform draws are the given values (the sampler takes one per call)."""

    def __init__(self, *u):
        super().__init__(0, 0)
        self.u = list(u)

    def uniform_f64(self) -> float:
        return self.u.pop(0)


@pytest.mark.parametrize("u, token", [
    (math.nextafter(0.25, 0.0), 0),
    (0.25, 1),                          # u = c_0 exactly: the first position with u < c is 1
    (math.nextafter(0.25, 1.0), 1),
    (0.5, 2),
    (math.nextafter(1.0, 0.0), 3),
    (0.0, 0),
])
def test_the_draw_at_a_cdf_step(u, token):
    """Four tied ids, cdf 0.25, 0.5, 0.75, 1.0: the draw u picks the first id whose c exceeds it."""
    params = SamplingParams()
    got = sample(np.zeros(4, np.float32), params, [], [], FixedDraw(u))
    ref = fast_sample(np.zeros(4, np.float32), params, [], [], FixedDraw(u))
    assert got[0] == token == ref[0]


def test_the_draw_past_a_rounded_total():
    """Ten tied ids and one whose weight underflows to 0 (logit -800): ten 0.1s sum to 0.999...9 < 1,
    so the largest draws fall past the cdf; they take the last kept id with p > 0 (id 9), never id 10."""
    x = np.array([0.0] * 10 + [-800.0], np.float32)
    tr = sample_trace(x, SamplingParams(), [], [], stream(1, 4))
    assert tr.probs[10] == 0.0 and tr.cdf[-1] < 1.0
    u = math.nextafter(1.0, 0.0)
    assert u >= tr.cdf[-1]  # the case this test is about
    for draw in (u, float(tr.cdf[-1]), float(tr.cdf[-2]), math.nextafter(float(tr.cdf[-2]), 0.0)):
        got = sample(x, SamplingParams(), [], [], FixedDraw(draw))
        assert got == fast_sample(x, SamplingParams(), [], [], FixedDraw(draw))
        assert got[0] == 9


TINY = 5e-324


@pytest.mark.parametrize("field, value, ok", [
    ("top_k", -1, False), ("top_k", 0, True), ("top_k", 1, True),
    ("temperature", -TINY, False), ("temperature", 0.0, True), ("temperature", TINY, True),
    ("top_p", 0.0, False), ("top_p", TINY, True), ("top_p", 1.0, True), ("top_p", math.nextafter(1.0, 2.0), False),
    ("min_p", -TINY, False), ("min_p", 0.0, True), ("min_p", 1.0, True), ("min_p", math.nextafter(1.0, 2.0), False),
    ("repetition_penalty", 0.0, False), ("repetition_penalty", TINY, True), ("repetition_penalty", -1.0, False),
])
def test_parameters_at_their_edges(field, value, ok):
    if ok:
        assert getattr(SamplingParams(**{field: value}), field) == value
    else:
        with pytest.raises(ValueError, match=field):
            SamplingParams(**{field: value})


@pytest.mark.parametrize("big, ok", [(math.nextafter(LOGIT_LIMIT, 0.0), True), (LOGIT_LIMIT, True),
                                     (math.nextafter(LOGIT_LIMIT, math.inf), False)])
def test_logits_at_the_size_limit(big, ok):
    x = np.array([0.0, -big, 1.0])  # float64: 2**1000 is not a float32
    if ok:
        assert sample(x, SamplingParams(temperature=0.0), [], [], None)[0] == 2
    else:
        with pytest.raises(ValueError, match="logit of id 1"):
            sample(x, SamplingParams(temperature=0.0), [], [], None)
    with pytest.raises(ValueError, match="empty"):
        sample(np.zeros(0, np.float32), SamplingParams(temperature=0.0), [], [], None)


@pytest.mark.parametrize("id, ok", [(-1, False), (0, True), (3, True), (4, False)])
@pytest.mark.parametrize("where", ["prompt", "output"])
def test_history_ids_at_the_vocabulary_edges(id, ok, where):
    hist = {"prompt": [], "output": [], where: [id]}
    x = np.zeros(4, np.float32)
    params = SamplingParams(temperature=0.0, repetition_penalty=2.0)
    if ok:
        sample(x, params, hist["prompt"], hist["output"], None)
    else:
        with pytest.raises(ValueError, match=where):
            sample(x, params, hist["prompt"], hist["output"], None)
