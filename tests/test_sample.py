"""tl_lab/sample.py: PCG32 and the sampler (chapter L10.1, sections 2.6, 3 and 4).

The chapter's tests (hand_example_sampling, pcg32_reference_vectors, sampler_matches_l81_golden,
greedy_takes_no_draw_and_sampling_takes_one,
top_p_keeps_the_crossing_token, penalties_follow_hf_and_openai_semantics,
seeded_sampling_matches_the_distribution), then the two implementations against each other, the
spec's edge rules and the refusals. Every sampler test runs BOTH `sample` (the learner-facing one,
written like the spec) and `tl_lab.ops.fast_sample.sample` (the engine's vectorized twin); the chapter's
tests grade the first only.
"""

import json
import math
import random

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tl_lab.ops.paths import GOLDEN_DIR
from tl_lab.ops import fast_sample as fs
from tl_lab.sample import (
    PURPOSE_SAMPLE,
    Pcg32,
    SamplingParams,
    child_seed,
    mix64,
    sample,
    sample_trace,
    stream,
)

SAMPLERS = [pytest.param(sample, id="spec"), pytest.param(fs.sample, id="fast")]
U_MAX = (2**53 - 1) / 2**53  # the largest uniform_f64 a Pcg32 can return


def same(a, b):
    """(id, logprob) pairs equal bit for bit."""
    return a[0] == b[0] and float(a[1]).hex() == float(b[1]).hex()


class FixedU(Pcg32):
    """A generator whose uniforms are given (to reach edge cases a seed search never would)."""

    def __init__(self, *us):
        super().__init__(0, 0)
        self.us = list(us)
        self.draws = 0

    def uniform_f64(self):
        self.draws += 1
        return self.us.pop(0)


# ---------------------------------------------------------------------------------------------------
# PCG32


def test_pcg32_reference_vectors():
    vec = json.loads((GOLDEN_DIR / "pcg32.vectors.json").read_text())
    # the chapter's facts, typed from pcg-c-basic's demo and section 3, not from our own output
    g = Pcg32(42, 54)
    assert [g.next_u32() for _ in range(6)] == [0xA15C02B7, 0x7B47F409, 0xBA1D3330, 0x83D2F293, 0xBFA4784B, 0xCBED606E]
    assert vec["demo"]["u32"] == ["0xa15c02b7", "0x7b47f409", "0xba1d3330", "0x83d2f293", "0xbfa4784b", "0xcbed606e"]
    assert child_seed(0, PURPOSE_SAMPLE) == 0xF88BB8A8724C81EC
    assert stream(0, PURPOSE_SAMPLE).uniform_f64() == 0.8020949661137535
    for e in vec["next_u32"]:
        g = Pcg32(int(e["seed"], 16), int(e["seq"], 16))
        assert [g.next_u32() for _ in e["u32"]] == [int(w, 16) for w in e["u32"]], e["seed"]
        assert g.state == int(e["state_after"], 16)
    for e in vec["uniform_f64"]:
        g = Pcg32(int(e["seed"], 16), int(e["seq"], 16))
        assert [g.uniform_f64() for _ in e["u"]] == [float.fromhex(u) for u in e["u"]]
    for e in vec["mix64"]:
        assert mix64(int(e["in"], 16)) == int(e["out"], 16)
    for e in vec["child_seed"]:
        assert child_seed(int(e["seed"], 16), int(e["purpose"], 16)) == int(e["child"], 16)
    for e in vec["stream"]:
        seed, purpose = int(e["seed"], 16), int(e["purpose"], 16)
        g = stream(seed, purpose)
        assert [g.next_u32() for _ in e["u32"]] == [int(w, 16) for w in e["u32"]]
        g = stream(seed, purpose)
        assert [g.uniform_f64() for _ in e["u"]] == [float.fromhex(u) for u in e["u"]]


def test_uniform_f64_uses_53_bits_a_first():
    g = Pcg32(7, 9)
    twin = g.copy()
    a, b = twin.next_u32(), twin.next_u32()
    u = g.uniform_f64()
    assert u == ((a >> 5) * 2**26 + (b >> 6)) / 2**53
    assert g == twin
    assert 0.0 <= u < 1.0 and (u * 2**53).is_integer()


def test_pcg32_seeds_are_validated():
    for bad in (-1, 2**64, 1.5, "3", None, True):
        with pytest.raises(ValueError, match="seed"):
            Pcg32(bad, 0)
        with pytest.raises(ValueError, match="seed"):
            child_seed(bad, 4)
    with pytest.raises(ValueError, match="seq"):
        Pcg32(0, -1)
    with pytest.raises(ValueError, match="purpose"):
        stream(0, 2**64)
    assert Pcg32(np.uint64(2**64 - 1), np.int64(3)) == Pcg32(2**64 - 1, 3)


# ---------------------------------------------------------------------------------------------------
# The chapter's worked example and golden file


@pytest.mark.parametrize("fn", SAMPLERS)
def test_hand_example_sampling(fn):
    x = [1.0, 3.0, 2.0, 3.0, -1.0]
    params = SamplingParams(temperature=1.0, top_k=3, top_p=0.8)
    rng = stream(0, PURPOSE_SAMPLE)
    token, logprob = fn(np.array(x, np.float32), params, [], [], rng)
    assert token == 3
    assert logprob == pytest.approx(-0.92487, abs=5e-6)
    Z = 0.0
    for v in x:  # section 3: M = 3, Z = e^-2 + 1 + e^-1 + 1 + e^-4 in id order
        Z += math.exp(v - 3.0)
    assert Z == pytest.approx(2.52153, abs=5e-6)
    assert logprob == (3.0 - 3.0) - math.log(Z)
    rng = stream(0, PURPOSE_SAMPLE)
    assert rng.uniform_f64() == 0.8020949661137535  # the u of section 3, the one draw the token took


def test_trace_of_the_hand_example():
    """Section 3's stages, as the playground shows them (sample_trace: the lab's, not graded)."""
    x = [1.0, 3.0, 2.0, 3.0, -1.0]
    params = SamplingParams(temperature=1.0, top_k=3, top_p=0.8)
    token, logprob = sample(np.array(x, np.float32), params, [], [], stream(0, PURPOSE_SAMPLE))
    tr = sample_trace(x, params, [], [], stream(0, PURPOSE_SAMPLE))
    assert tr.top_k.tolist() == [1, 2, 3]
    assert tr.nucleus_order.tolist() == [1, 3]
    assert tr.nucleus_cum.tolist() == pytest.approx([0.42232, 0.84464], abs=5e-6)
    assert tr.top_p.tolist() == [1, 3] and tr.kept.tolist() == [1, 3]
    assert tr.probs.tolist() == [0.5, 0.5] and tr.cdf.tolist() == [0.5, 1.0]
    assert tr.u == 0.8020949661137535
    assert (tr.token, tr.logprob) == (token, logprob)


def _golden():
    g = json.loads((GOLDEN_DIR / "sampler.json").read_text())
    tables = {}
    for name, t in g["tables"].items():
        rows = [np.array([int(r[i : i + 8], 16) for i in range(0, len(r), 8)], np.uint32).view(np.float32) for r in t["rows"]]
        assert all(r.size == t["vocab"] for r in rows)
        tables[name] = rows
    return g, tables


def _params(case):
    p = {k: (v if k == "top_k" else float.fromhex(v)) for k, v in case["params_hex"].items()}
    return SamplingParams(**p)


@pytest.mark.parametrize("fn", SAMPLERS)
def test_sampler_matches_l81_golden(fn):
    g, tables = _golden()
    assert len(g["cases"]) == 12 and all(len(c["tokens"]) == 12 for c in g["cases"])
    assert max(len(t[0]) for t in tables.values()) == 49152
    for case in g["cases"]:
        rows, params, prompt = tables[case["table"]], _params(case), case["prompt"]
        rng = stream(int(case["seed"], 16), g["purpose"])
        output = []
        for step, (want, want_lp) in enumerate(zip(case["tokens"], case["logprobs"])):
            context = prompt + output
            got = fn(rows[context[-1] % len(rows)], params, prompt, output, rng)
            assert same(got, (want, float.fromhex(want_lp))), (case["name"], step, got, want, float.fromhex(want_lp))
            output.append(got[0])
        assert rng.state == int(case["state_after"], 16), case["name"]


# ---------------------------------------------------------------------------------------------------
# Draw accounting, the nucleus edge, penalties, the distribution


@pytest.mark.parametrize("fn", SAMPLERS)
def test_greedy_takes_no_draw_and_sampling_takes_one(fn):
    x = np.array([0.5, 2.0, 2.0, -1.0, 1.0], np.float32)
    rng = stream(5, PURPOSE_SAMPLE)
    before = rng.copy()
    assert fn(x, SamplingParams(temperature=0.0, top_k=2, top_p=0.5), [0], [4], rng)[0] == 1  # ties: lowest id
    assert rng == before
    assert fn(x, SamplingParams(temperature=0.0), [], [], None)[0] == 1  # greedy needs no generator at all
    for params in [SamplingParams(), SamplingParams(top_k=1), SamplingParams(min_p=1.0, temperature=0.01),
                   SamplingParams(top_p=0.01), SamplingParams(temperature=3.0, top_k=2, top_p=0.9, min_p=0.2)]:
        expect = rng.copy()
        expect.uniform_f64()  # exactly one uniform = two next_u32 outputs
        fn(x, params, [1], [2, 2], rng)
        assert rng == expect, params
    fixed = FixedU(0.25)
    fn(x, SamplingParams(top_k=1), [], [], fixed)  # a single kept id still takes its draw
    assert fixed.draws == 1


@pytest.mark.parametrize("fn", SAMPLERS)
def test_top_p_keeps_the_crossing_token(fn):
    # four equal logits: every weight is exp(0) = 1 exactly, every probability exactly 0.25
    x = np.array([5.0, 5.0, 5.0, 5.0, -100.0], np.float32)
    # dyadic probabilities 0.5, 0.25, 0.125, 0.125 (exp(log 2^-j) rounds back to 2^-j exactly)
    y = [0.0, math.log(0.5), math.log(0.25), math.log(0.25)]
    assert [math.exp(v) for v in y] == [1.0, 0.5, 0.25, 0.25]
    # the mass reaches p exactly at id 1: x keeps {0, 1} at 0.5 each (u < 0.5 draws 0), y keeps
    # {0, 1} at 2/3 and 1/3; the largest u still draws id 1, never an id past the crossing one
    for u, want in ((0.0, 0), (0.4999999999999999, 0), (0.5, 1), (U_MAX, 1)):
        assert fn(x, SamplingParams(top_p=0.5), [], [], FixedU(u))[0] == want, u
    for u, want in ((0.0, 0), (0.6, 0), (0.7, 1), (U_MAX, 1)):
        assert fn(y, SamplingParams(top_p=0.75), [], [], FixedU(u))[0] == want, u
    assert fn(x, SamplingParams(top_p=0.75), [], [], FixedU(U_MAX))[0] == 2  # three kept at 0.75
    for seed in range(150):  # the crossing id is drawn, nothing past it ever is
        assert fn(x, SamplingParams(top_p=0.5), [], [], stream(seed, 4))[0] in (0, 1)
        assert fn(y, SamplingParams(top_p=0.75), [], [], stream(seed, 4))[0] in (0, 1)
    assert {fn(x, SamplingParams(top_p=0.5), [], [], stream(s, 4))[0] for s in range(40)} == {0, 1}


def test_nucleus_trace_stops_at_the_crossing_token():
    """The top-p walk as the playground shows it (sample_trace: the lab's, not graded)."""
    x = np.array([5.0, 5.0, 5.0, 5.0, -100.0], np.float32)
    tr = sample_trace(x, SamplingParams(top_p=0.5), [], [], stream(0, 4))
    assert tr.nucleus_cum.tolist() == [0.25, 0.5]  # the mass reaches p exactly at id 1
    assert tr.top_p.tolist() == [0, 1]
    assert sample_trace(x, SamplingParams(top_p=0.75), [], [], stream(0, 4)).top_p.tolist() == [0, 1, 2]
    y = [0.0, math.log(0.5), math.log(0.25), math.log(0.25)]
    tr = sample_trace(y, SamplingParams(top_p=0.75), [], [], stream(0, 4))
    assert tr.nucleus_cum.tolist() == [0.5, 0.75] and tr.top_p.tolist() == [0, 1]


@pytest.mark.parametrize("fn", SAMPLERS)
def test_penalties_follow_hf_and_openai_semantics(fn):
    x = np.array([2.0, -2.0, 1.0, -1.0, 0.5], np.float32)
    prompt, output = [0, 1, 0], [2, 3, 3]
    params = SamplingParams(temperature=0.0, repetition_penalty=2.0, presence_penalty=0.5, frequency_penalty=0.25)
    expect = [
        2.0 / 2.0,  # prompt only, positive: divided once (it appears twice), no presence/frequency
        -2.0 * 2.0,  # prompt only, negative: multiplied, so it becomes LESS likely
        1.0 / 2.0 - (0.25 * 1 + 0.5),  # output once: repetition, then frequency x1 + presence
        -1.0 * 2.0 - (0.25 * 2 + 0.5),  # output twice: repetition once, frequency x2 + presence
        0.5,  # untouched
    ]
    assert expect == [1.0, -4.0, -0.25, -3.0, 0.5]
    # greedy after the penalties: the logprob is the penalised logit's; at T = 1 each id's weight
    # is exp(penalised), so a draw u lands where the penalised CDF says
    M, Z = 1.0, 0.0
    for v in expect:
        Z += math.exp(v - M)
    assert same(fn(x, params, prompt, output, None), (0, (1.0 - M) - math.log(Z)))
    # the history's order and the prompt's repeats do not matter; only output counts do
    assert same(fn(x, params, [1, 0], [3, 2, 3], None), fn(x, params, prompt, output, None))
    # a prompt token is not hit by presence/frequency: with no repetition penalty it stays the argmax
    only_pf = SamplingParams(temperature=0.0, presence_penalty=1.5, frequency_penalty=1.0)
    assert fn(x, only_pf, [0, 0, 0], [], None)[0] == 0
    assert fn(x, only_pf, [], [0], None)[0] == 2  # 2.0 - (1.0 + 1.5) = -0.5 < 1.0
    # every penalised value, through the logprobs of a sampled token at T = 1: log p(t) = l'_t - log Z
    t1 = SamplingParams(repetition_penalty=2.0, presence_penalty=0.5, frequency_penalty=0.25)
    for u in (0.0, 0.3, 0.6, 0.95):
        t, lp = fn(x, t1, prompt, output, FixedU(u))
        assert lp == (expect[t] - M) - math.log(Z), (u, t)


def test_penalised_logits_in_the_trace():
    """Step 2's output as the playground shows it (sample_trace: the lab's, not graded)."""
    x = np.array([2.0, -2.0, 1.0, -1.0, 0.5], np.float32)
    params = SamplingParams(temperature=0.0, repetition_penalty=2.0, presence_penalty=0.5, frequency_penalty=0.25)
    assert sample_trace(x, params, [0, 1, 0], [2, 3, 3], None).penalised.tolist() == [1.0, -4.0, -0.25, -3.0, 0.5]


@pytest.mark.parametrize("fn", SAMPLERS)
def test_seeded_sampling_matches_the_distribution(fn):
    probs = [0.4, 0.3, 0.2, 0.1]
    x = np.log(np.array(probs)).astype(np.float32)
    rng = stream(2024, PURPOSE_SAMPLE)
    ids = [fn(x, SamplingParams(), [], [], rng)[0] for _ in range(4000)]
    counts = np.bincount(ids, minlength=4)
    chi2 = sum((c - 4000 * p) ** 2 / (4000 * p) for c, p in zip(counts, probs))
    assert chi2 < 16.27, (counts, chi2)  # the 0.999 quantile of chi-square with 3 degrees of freedom
    rng = stream(2024, PURPOSE_SAMPLE)
    assert [fn(x, SamplingParams(), [], [], rng)[0] for _ in range(4000)] == ids  # a seed repeats
    rng = stream(2025, PURPOSE_SAMPLE)
    assert [fn(x, SamplingParams(), [], [], rng)[0] for _ in range(200)] != ids[:200]


# ---------------------------------------------------------------------------------------------------
# The spec's other rules


@pytest.mark.parametrize("fn", SAMPLERS)
def test_logprob_is_taken_before_temperature(fn):
    x = np.array([0.3, 1.7, -0.4, 1.1], np.float32)
    l = [float(v) for v in x]
    M, Z = max(l), 0.0
    for v in l:
        Z += math.exp(v - M)
    want = (l[1] - M) - math.log(Z)
    for T in (0.0, 0.25, 1.0, 2.5):
        assert same(fn(x, SamplingParams(temperature=T, top_k=1), [], [], stream(1, 4)), (1, want)), T


@pytest.mark.parametrize("fn", SAMPLERS)
def test_cdf_walks_in_ascending_id_order(fn):
    x = [0.0, 2.0, 1.0]  # p = 0.090, 0.665, 0.245: in probability order id 1 would come first
    assert fn(x, SamplingParams(), [], [], FixedU(0.05))[0] == 0
    assert fn(x, SamplingParams(), [], [], FixedU(0.10))[0] == 1
    assert fn(x, SamplingParams(), [], [], FixedU(0.90))[0] == 2
    tr = sample_trace(x, SamplingParams(), [], [], FixedU(0.90))
    assert tr.kept.tolist() == [0, 1, 2] and tr.cdf[0] == tr.probs[0] and tr.cdf[-1] == pytest.approx(1.0)


@pytest.mark.parametrize("fn", SAMPLERS)
def test_rounding_below_u_takes_the_last_kept_id_with_mass(fn):
    # the running sum of [0.0, -0.03]'s probabilities ends at 1 - 2^-53: the largest u is not below it
    x = [0.0, -0.03]
    tr = sample_trace(x, SamplingParams(), [], [], FixedU(U_MAX))
    assert tr.cdf[-1] == U_MAX
    assert fn(x, SamplingParams(), [], [], FixedU(U_MAX))[0] == 1
    # a kept id whose probability underflowed to 0 is never the answer
    y = [0.0, -0.03, -2000.0]
    tr = sample_trace(y, SamplingParams(), [], [], FixedU(U_MAX))
    assert tr.kept.tolist() == [0, 1, 2] and tr.probs[2] == 0.0 and tr.cdf[-1] == U_MAX
    assert fn(y, SamplingParams(), [], [], FixedU(U_MAX))[0] == 1
    assert fn(y, SamplingParams(), [], [], FixedU(0.5))[0] == 0
    # ten probabilities of 0.1 add up to 1 - 2^-53 too: the last of the ten, not any other
    # (mutation testing: the second one with mass went unnoticed)
    assert fn(np.zeros(10, np.float32), SamplingParams(), [], [], FixedU(U_MAX))[0] == 9


def test_off_values_are_exactly_off():
    # top_p = 1.0 skips the walk: a real walk would stop at id 1, where 0.5 + 0.5 rounds to 1.0
    x = [0.0, 0.0, -40.0]
    tr = sample_trace(x, SamplingParams(top_p=1.0), [], [], stream(0, 4))
    assert tr.top_p.tolist() == [0, 1, 2] and tr.nucleus_order is None
    assert sample_trace(x, SamplingParams(top_p=1 - 2**-53), [], [], stream(0, 4)).top_p.tolist() == [0, 1]
    big = np.linspace(-3, 3, 50).astype(np.float32)
    off = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, repetition_penalty=1.0,
                         presence_penalty=0.0, frequency_penalty=0.0)
    tr = sample_trace(big, off, [1, 2], [3, 3], stream(9, 4))
    assert tr.penalised.tolist() == big.astype(np.float64).tolist()
    assert tr.scaled.tolist() == tr.penalised.tolist()
    assert tr.kept.tolist() == list(range(50))
    assert same(sample(big, off, [1, 2], [3, 3], stream(9, 4)), sample(big, SamplingParams(top_k=50), [], [], stream(9, 4)))
    assert same(sample(big, off, [], [], stream(9, 4)), sample(big, SamplingParams(top_k=99), [], [], stream(9, 4)))


# ---------------------------------------------------------------------------------------------------
# The numpy path against the reference, bit for bit


def _agree(x, params, prompt, output, seed):
    a_rng, b_rng = stream(seed, 4), stream(seed, 4)
    a = sample(x, params, prompt, output, a_rng)
    b = fs.sample(x, params, prompt, output, b_rng)
    assert same(a, b), (params, a, b)
    assert a_rng == b_rng
    tr = sample_trace(x, params, prompt, output, stream(seed, 4))
    assert same((tr.token, tr.logprob), a)
    fast = fs.trace(x, params, prompt, output, stream(seed, 4))
    for name, v in fast.items():  # every stage, bit for bit (None where a stage is skipped)
        mine = getattr(tr, name)
        if isinstance(v, np.ndarray) or isinstance(mine, np.ndarray):
            assert mine is not None and v is not None and mine.dtype == v.dtype and mine.shape == v.shape, (name, mine, v)
            assert mine.tobytes() == v.tobytes(), (name, params)
        else:
            assert type(mine) is type(v) and (mine == v or float(mine).hex() == float(v).hex()), (name, mine, v)
    return tr


params_st = st.builds(
    SamplingParams,
    temperature=st.one_of(st.just(0.0), st.just(1.0), st.floats(1e-3, 4.0)),
    top_k=st.one_of(st.just(0), st.integers(1, 90)),
    top_p=st.one_of(st.just(1.0), st.floats(1e-3, 1.0)),
    min_p=st.one_of(st.just(0.0), st.just(1.0), st.floats(0.0, 1.0)),
    repetition_penalty=st.one_of(st.just(1.0), st.floats(0.25, 3.0)),
    presence_penalty=st.one_of(st.just(0.0), st.floats(-2.0, 2.0)),
    frequency_penalty=st.one_of(st.just(0.0), st.floats(-2.0, 2.0)),
)


@st.composite
def calls(draw):
    V = draw(st.integers(1, 80))
    kind = draw(st.sampled_from(["floats", "ints", "wide"]))
    if kind == "ints":  # many ties
        x = draw(st.lists(st.integers(-3, 3), min_size=V, max_size=V))
    else:
        bound = 50.0 if kind == "floats" else 3e4
        x = draw(st.lists(st.floats(-bound, bound, width=32), min_size=V, max_size=V))
    ids = st.lists(st.integers(0, V - 1), max_size=12)
    return np.array(x, np.float32), draw(params_st), draw(ids), draw(ids), draw(st.integers(0, 2**64 - 1))


# The hard cases of the sampler, run every time (issue 62): ties at every filter's edge, one id,
# the nucleus past its first 64 candidates, min_p exactly at a weight, the widest logits.
_TIES = np.array([1, 1, 1, 0, 0, -1], np.float32)
def examples(cases):
    """Each of `cases` as an explicit @example of a property test: the known hard cases run every time."""
    def wrap(test):
        for case in reversed(cases):
            test = example(case)(test)
        return test
    return wrap


SAMPLER_HARD_CASES = [
    (_TIES, SamplingParams(top_k=2), [], [], 7),  # a tie at the top-k edge: the lower ids win
    (_TIES, SamplingParams(top_k=3, top_p=2 / 3), [], [], 11),  # cum reaches p exactly at the 2nd id
    (_TIES, SamplingParams(min_p=1.0), [], [], 3),  # min_p 1: only the (tied) best ids
    (np.array([0.0], np.float32), SamplingParams(top_k=1, top_p=0.5, min_p=1.0), [], [], 1),  # V = 1
    (np.zeros(80, np.float32), SamplingParams(top_p=0.999), [], [], 5),  # 80 ties: > 64 candidates
    (np.linspace(-1, 1, 65).astype(np.float32), SamplingParams(top_k=65, top_p=0.99), [], [], 2),  # k = V
    (np.linspace(-1, 1, 65).astype(np.float32), SamplingParams(top_k=64), [], [], 2),  # k = V - 1
    (np.array([3e4, -3e4, 3e4], np.float32), SamplingParams(temperature=0.25), [0], [2, 2], 9),
    (np.array([2, 2, 1], np.float32), SamplingParams(temperature=0.0, repetition_penalty=2.0), [0], [], 0),
]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(calls())
@examples(SAMPLER_HARD_CASES)
def test_fast_path_matches_reference_bit_for_bit(call):
    _agree(*call)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(calls())
@examples([SAMPLER_HARD_CASES[i] for i in (0, 1, 2, 3, 4, 7)])
def test_trace_properties(call):
    x, params, prompt, output, seed = call
    tr = sample_trace(x, params, prompt, output, stream(seed, 4))
    assert tr.kept.size >= 1 and tr.token in tr.kept.tolist()
    assert tr.probs[tr.kept.tolist().index(tr.token)] > 0
    assert abs(float(tr.probs.sum()) - 1.0) <= 1e-12 and abs(tr.cdf[-1] - 1.0) <= 1e-12
    assert np.all(np.diff(tr.cdf) >= 0)
    assert tr.logprobs[tr.token] == tr.logprob and tr.logprob <= 0.0
    if not tr.greedy:
        assert set(tr.kept.tolist()) <= set(tr.top_p.tolist()) <= set(tr.top_k.tolist())
        assert int(np.argmax(tr.scaled)) in tr.kept.tolist()  # the top id survives every filter
        for s in (tr.top_k_probs, tr.top_p_probs):
            assert abs(float(s.sum()) - 1.0) <= 1e-12
        # what the playground's charts draw: a weight for every id, and the ids min-p kept
        assert tr.weights.shape == tr.scaled.shape == x.shape
        assert set(tr.kept.tolist()) <= set(tr.min_p.tolist()) <= set(tr.top_p.tolist())


BIG_PARAMS = [
    SamplingParams(),
    SamplingParams(temperature=0.0, repetition_penalty=1.3),
    SamplingParams(temperature=0.7),
    SamplingParams(temperature=1.2, top_p=0.95),
    SamplingParams(temperature=0.05, top_p=0.5),
    SamplingParams(temperature=1.5, min_p=0.05),
    SamplingParams(top_k=40, top_p=0.9, min_p=0.02, repetition_penalty=1.2, presence_penalty=0.4, frequency_penalty=0.3),
    SamplingParams(temperature=3.0, top_p=0.999),  # a nucleus of thousands of ids
    SamplingParams(temperature=2.0),  # a power of two: q = l / T exactly, no special case but T = 1
]


def test_the_scaled_logits_are_l_over_T_at_every_temperature():
    """q = l / T, also where T is a round number (mutation testing: `q = l if T == 2.0` went unseen)."""
    x = np.array([0.5, -1.0, 3.0, 2.25], np.float32)
    for T in (0.5, 1.0, 2.0, 3.0):
        tr = sample_trace(x, SamplingParams(temperature=T), [], [], stream(0, 4))
        assert np.array_equal(tr.scaled, x.astype(np.float64) / T), T


def test_an_id_list_that_is_not_a_sequence_names_its_type():
    with pytest.raises(ValueError, match="^prompt must be a sequence of token ids, got int$"):  # mutation testing
        sample(np.zeros(4, np.float32), SamplingParams(), 5, [], stream(0, 4))


@pytest.mark.parametrize("i", range(len(BIG_PARAMS)))
def test_fast_path_matches_reference_on_a_49152_vocabulary(i):
    g = np.random.default_rng(100 + i)
    x = (g.standard_normal(49152) * 2.5).astype(np.float32)
    x[g.integers(0, 49152, 30)] += 9.0
    if i % 2:
        x = np.round(x).astype(np.float32)  # ties everywhere
    prompt, output = g.integers(0, 49152, 40).tolist(), g.integers(0, 49152, 25).tolist()
    for seed in (i, 2**64 - 1 - i):
        _agree(x, BIG_PARAMS[i], prompt, output, seed)


@pytest.mark.parametrize("backend", ["math", "compiled"])
def test_fast_path_matches_reference_with_each_exp_backend(monkeypatch, backend):
    if backend == "compiled" and not _compiled_exp_is_exact():
        pytest.skip("the compiled exp is not the C library's on this machine, so the sampler never calls it here")
    monkeypatch.setattr(fs, "_EXP_BACKEND", backend)
    assert fs.exp_backend() == backend
    g = np.random.default_rng(7)
    x = (g.standard_normal(49152) * 3).astype(np.float32)
    for params in (SamplingParams(temperature=0.8), SamplingParams(top_p=0.9, min_p=0.01)):
        _agree(x, params, [1, 2], [3], 17)
    for k in range(30):
        x = (g.standard_normal(int(g.integers(1, 60))) * 10).astype(np.float32)
        _agree(x, SamplingParams(temperature=float(g.uniform(0.1, 2)), top_p=0.9, min_p=0.05), [], [0], k)


def test_numpy_cumsum_is_a_left_to_right_sum():
    """The fast path's sums lean on this; np.sum (pairwise) would not do."""
    g = np.random.default_rng(3)
    sum_differs = 0
    for n in (10, 1000, 49152):
        x = np.exp(g.uniform(-30, 0, n))
        z = 0.0
        for v in x.tolist():
            z += v
        assert float(np.cumsum(x)[-1]).hex() == z.hex()
        sum_differs += float(np.sum(x)) != z
    assert sum_differs  # so the check above would notice a pairwise sum


def _math_exp(x: np.ndarray) -> np.ndarray:
    return np.array([math.exp(v) for v in x.tolist()])


def _compiled_exp_is_exact() -> bool:
    """Whether the compiled exp gives math.exp's bits on the self-check battery (as exp_backend asks)."""
    x = fs._exp_battery()
    return fs._same_bits(fs._compiled_exp(x), _math_exp(x))


def test_exp_backend_admits_only_an_exp_with_math_exps_bits(monkeypatch):
    """numpy's exp one ulp off: the check passes over it to the compiled loop, or to math.exp where
    the compiled loop is off as well; whichever it picks, _exp gives math.exp's bits."""
    x = -np.random.default_rng(5).uniform(0, 745, 5000)
    exact = np.exp
    monkeypatch.setattr(fs, "_EXP_BACKEND", None)
    monkeypatch.setattr(np, "exp", lambda a: np.nextafter(exact(a), np.inf))
    assert fs.exp_backend() == ("compiled" if _compiled_exp_is_exact() else "math")
    assert fs._same_bits(fs._exp(x), _math_exp(x))
    monkeypatch.setattr(fs, "_EXP_BACKEND", None)
    monkeypatch.setattr(fs, "_compiled_exp", lambda a: np.nextafter(exact(a), -np.inf))
    assert fs.exp_backend() == "math"
    assert fs._same_bits(fs._exp(x), _math_exp(x))


def test_exp_backend_self_check():
    backend = fs.exp_backend()
    assert backend in ("numpy", "compiled", "math")
    x = -np.random.default_rng(4).uniform(0, 745, 20000)
    got = fs._exp(x)
    assert [v.hex() for v in got.tolist()] == [math.exp(v).hex() for v in x.tolist()]


# ---------------------------------------------------------------------------------------------------
# Refusals


@pytest.mark.parametrize("fn", SAMPLERS)
def test_bad_logits_are_refused(fn):
    p = SamplingParams()
    cases = [
        (np.array([0.0, 1.0, np.nan], np.float32), r"id 2 is nan.*finite"),
        (np.array([np.inf, 1.0], np.float32), r"id 0 is inf"),
        ([0.0, -math.inf], r"id 1 is -inf"),
        (np.zeros(0, np.float32), "empty"),
        (np.zeros((2, 3), np.float32), r"1-D.*\(2, 3\)"),
        (np.array([1, 2, 3]), "dtype int64"),
        (np.array([True, False]), "dtype bool"),
        (["a", "b"], "numbers"),
        ([[1.0], [2.0]], "1-D"),
        (None, "NoneType"),
        (np.array([1e302, 0.0]), "id 0"),
        ([0.5, True], "the bool True at id 1"),  # numpy reads [0.5, True] as floats
    ]
    for logits, msg in cases:
        rng = stream(0, 4)
        with pytest.raises(ValueError, match=msg):
            fn(logits, p, [], [], rng)
        assert rng == stream(0, 4)  # a refused call takes no draw


@pytest.mark.parametrize("fn", SAMPLERS)
def test_token_ids_outside_the_vocabulary_are_refused(fn):
    x = np.zeros(4, np.float32)
    for prompt, output, msg in [
        ([0, 4], [], r"prompt\[1\] = 4 is outside the vocabulary \[0, 4\)"),
        ([], [2, -1], r"output\[1\] = -1 is outside"),
        ([1.0], [], r"prompt\[0\] = 1.0 is not an integer"),
        ([], [True], r"output\[0\] = True"),
        (np.array([0, 9]), [], r"prompt\[1\] = 9"),
        (np.array([0.5]), [], "integer token ids"),
        (5, [], "sequence of token ids"),
        ([0, 1.5], [], r"prompt\[1\] = 1.5 is not an integer"),  # id 0 is a token (mutation testing, issue 20)
        ([4, 1.5], [], r"prompt\[0\] = 4 is outside the vocabulary \[0, 4\)"),  # so is not id V
        ([2, True], [], r"prompt\[1\] = True is not an integer"),  # was read as [2, 1] (numpy's ints)
        ([], (1, np.bool_(False)), r"output\[1\] = np.False_ is not an integer"),
    ]:
        with pytest.raises(ValueError, match=msg):
            fn(x, SamplingParams(), prompt, output, stream(0, 4))


def test_bad_params_are_refused():
    for kwargs, msg in [
        (dict(temperature=-0.1), "temperature"),
        (dict(temperature=math.nan), "temperature must be finite"),
        (dict(temperature=math.inf), "temperature"),
        (dict(top_k=-1), "top_k"),
        (dict(top_k=2.5), "top_k"),
        (dict(top_k=True), "top_k"),
        (dict(top_p=0.0), r"top_p must be in \(0, 1\]"),
        (dict(top_p=1.5), "top_p"),
        (dict(min_p=-0.1), r"min_p must be in \[0, 1\]"),
        (dict(min_p=1.01), "min_p"),
        (dict(repetition_penalty=0.0), "repetition_penalty must be > 0"),
        (dict(repetition_penalty=-1.0), "repetition_penalty"),
        (dict(presence_penalty=math.inf), "presence_penalty must be finite"),
        (dict(frequency_penalty=math.nan), "frequency_penalty"),
        (dict(frequency_penalty="0.1"), "frequency_penalty must be a real number"),
        (dict(temperature=10**400), "temperature is too large for a float"),  # was an OverflowError
        (dict(top_p=np.bool_(True)), "top_p must be a real number"),
    ]:
        with pytest.raises(ValueError, match=msg):
            SamplingParams(**kwargs)
    p = SamplingParams(temperature=1, top_k=np.int64(3), top_p=1)
    assert p.temperature == 1.0 and isinstance(p.temperature, float) and p.top_k == 3 and type(p.top_k) is int
    with pytest.raises(Exception):
        p.temperature = 2.0  # frozen


@pytest.mark.parametrize("fn", SAMPLERS)
def test_a_scaled_logit_exactly_at_the_limit_is_sampled(fn):
    """LOGIT_LIMIT bounds |q| from above, inclusive: 2**100 / 2**-900 = 2**1000 exactly is a number the
    sampler takes (mutation testing, issue 20: '<' for '<=' went unnoticed)."""
    t, logprob = fn(np.array([0.0, 2.0**100], np.float32), SamplingParams(temperature=2.0**-900), [], [], stream(0, 4))
    assert t == 1 and logprob == 0.0


@pytest.mark.parametrize("fn", SAMPLERS)
def test_out_of_range_arithmetic_is_refused(fn):
    with pytest.raises(ValueError, match=r"\btemperature 1e-300\b.*\b1\b"):
        fn(np.array([0.0, 1e30], np.float32), SamplingParams(temperature=1e-300), [], [], stream(0, 4))
    with pytest.raises(ValueError, match=r"(?i)\bid 1\b.*\binf\b.*2\*\*1000"):
        fn(np.array([0.0, 1e30], np.float32), SamplingParams(repetition_penalty=1e-300), [1], [], stream(0, 4))
    with pytest.raises(ValueError, match=r"^z must be an integer in \[0, 2\*\*64\), got -1$"):  # mutation testing
        mix64(-1)
    with pytest.raises(TypeError, match="needs a Pcg32 rng, got NoneType"):
        fn([0.0, 1.0], SamplingParams(), [], [], None)
    with pytest.raises(TypeError, match="needs a Pcg32 rng, got Random$"):  # names what was given (mutation testing)
        fn([0.0, 1.0], SamplingParams(), [], [], random.Random(0))
    with pytest.raises(TypeError, match="SamplingParams"):
        fn([0.0, 1.0], {"temperature": 0.0}, [], [], None)
