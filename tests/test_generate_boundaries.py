"""tl_lab/engine/generate.py at every limit (issue 62): each capacity, length and count comparison of the engine
loop tested exactly at its limit, one under and one over, and the finish reasons and the scheduling as
tables, the expected outcome next to each row. On the byte bigram (no KV arithmetic, milliseconds a
request) with a small pool of B = 4 and, where the context matters, max_position_embeddings cut to 8.

The comparisons (file:function: the comparison), each pinned by the test named after it:

    generate.py:Request.__post_init__: max_tokens >= 1 (as_int lo=1)        test_max_tokens_at_its_floor
    generate.py:Request.__post_init__: 0 <= seed <= 2**64 - 1 (as_int lo, hi) test_seed_at_its_floor_and_ceiling
    generate.py:Engine.check: 0 <= t < vocab_size                           test_prompt_ids_at_the_vocabulary_edges
    generate.py:Engine.check: len(prompt) > max_position_embeddings         test_prompt_length_at_the_context
    generate.py:Engine.check: worst > pool.available()                      test_worst_case_at_the_pool_size
    generate.py:_Seq.worst_blocks: prompt + max_tokens - 1 positions        test_worst_case_at_the_pool_size
    generate.py:_Seq.worst_blocks: min(..., max_position_embeddings)        test_worst_case_capped_by_the_context
    generate.py:Engine._admit: len(running) < max_seqs                      test_admission_at_max_seqs
    generate.py:Engine._admit: worst > available - outstanding              test_admission_when_the_pool_is_exactly_full
    generate.py:Engine._rows: computed >= len(prompt) (decode / prefill)     test_scheduling_table
    generate.py:Engine._rows: chunk = min(prefill_chunk, max_batch_tokens)  test_scheduling_table
    generate.py:Engine._rows: min(chunk, len(tokens) - computed)            test_scheduling_table
    generate.py:Engine._rows: rows and n > budget (wait, never cut)         test_a_step_fills_its_budget_exactly

Two comparisons no test can reach, found equivalent (docs/dev/mutation.md): the decodes never outnumber
max_batch_tokens (a sequence becomes a decode only through a prompt chunk that fitted the budget with
the decodes of its step), so `budget = max(max_batch_tokens, len(decode))` is max_batch_tokens, and the
first row of a step always fits it (its chunk is at most max_batch_tokens), so `rows and` never decides.
    generate.py:Engine._step: computed == len(tokens) (sample)              test_scheduling_table
    generate.py:Engine._step: prompt_part = max(0, min(n, P - start))       test_scheduling_table (prefilled counts)
    generate.py:Engine._sample: 0 <= sampled id < len(row)                  test_a_sampled_id_at_the_vocabulary_edges
    generate.py:Engine._sample: tok in stop (first: a stop wins)            test_finish_reasons
    generate.py:Engine._sample: len(output) >= max_tokens                   test_finish_reasons
    generate.py:Engine._sample: len(tokens) > max_position_embeddings       test_finish_reasons
    blocks.py:cacheable: (P - 1) // B * B, through the engine               test_prefix_cache_hit_at_the_block_boundary
"""

from __future__ import annotations

import dataclasses

import pytest

from tl_lab.errors import KvError
from tl_lab.engine.generate import Engine, Request, RequestError
from tl_lab.model import load_weights
from tl_lab.ops.paths import DATA_DIR
from tl_lab.runner import EngineConfig, KvConfig, ModelRunner
from tl_lab.sample import SamplingParams

B = 4
GREEDY = SamplingParams(temperature=0.0)
BIGRAM = load_weights(DATA_DIR / "bigram")
A = [ord("a")]
# The bigram's greedy continuation of "a": b, c, d, space, a, b, c, d, ... (the first five distinct).
AFTER_A = [ord(c) for c in "bcd abcd"]


def engine(n_blocks=16, maxpos=None, **kw) -> Engine:
    w = BIGRAM
    if maxpos is not None:
        w = dataclasses.replace(w, config=dataclasses.replace(w.config, max_position_embeddings=maxpos))
    cfg = EngineConfig(kv=KvConfig(n_blocks=n_blocks, block_tokens=B), **kw)
    return Engine(ModelRunner(w, cfg), cfg=cfg)


def req(prompt, max_tokens=4, stop_ids=(), seed=0) -> Request:
    return Request(list(prompt), GREEDY, seed, max_tokens, list(stop_ids))


def idle(e: Engine) -> bool:
    return e.pool.stats()["in_use"] == 0


def steps(e: Engine, requests) -> list:
    records = []
    e.generate(requests, on_step=records.append)
    assert idle(e)
    return records


def test_the_bigram_continuation_this_file_relies_on():
    (r,) = engine().generate([req(A, max_tokens=8)])
    assert r.output_ids == AFTER_A and r.finish == "length"


# ------------------------------------------------------------------ request checks


@pytest.mark.parametrize("max_tokens, ok", [(0, False), (1, True), (2, True)])
def test_max_tokens_at_its_floor(max_tokens, ok):
    if not ok:
        with pytest.raises(RequestError, match="max_tokens"):
            req(A, max_tokens=max_tokens)
        return
    (r,) = engine().generate([req(A, max_tokens=max_tokens)])
    assert len(r.output_ids) == max_tokens and r.finish == "length"


@pytest.mark.parametrize("seed, ok", [(-1, False), (0, True), (2**64 - 2, True), (2**64 - 1, True), (2**64, False)])
def test_seed_at_its_floor_and_ceiling(seed, ok):
    """A seed is a u64 (docs/spec/sampling.md): 0 and 2**64 - 1 are seeds, -1 and 2**64 are refused."""
    if not ok:
        with pytest.raises(RequestError, match="seed"):
            req(A, seed=seed)
        return
    assert req(A, seed=seed).seed == seed


@pytest.mark.parametrize("token, ok", [(-1, False), (0, True), (255, True), (256, False)])
def test_a_sampled_id_at_the_vocabulary_edges(token, ok, monkeypatch):
    """A sampler (a learner's sample.py) that answers an id outside [0, 256) is refused by name, at the
    first token; 0 and 255 are tokens and come out as they were sampled."""
    import tl_lab.engine.generate as gen

    def sampler(row, params, prompt, output, rng):
        return token, 0.0

    monkeypatch.setattr(gen, "_sample_fn", lambda: sampler)
    e = engine()
    if ok:
        (r,) = e.generate([req(A, max_tokens=2)])
        assert r.output_ids == [token, token]
    else:
        with pytest.raises(gen.SamplerAnswerError, match=rf"returned token id {token}, outside the vocabulary \(0 \.\. 255\)"):
            e.generate([req(A)])


@pytest.mark.parametrize("token, ok", [(-1, False), (0, True), (255, True), (256, False)])
def test_prompt_ids_at_the_vocabulary_edges(token, ok):
    """vocab_size 256: ids 0 and 255 are tokens, -1 and 256 are refused before anything runs."""
    e = engine()
    if ok:
        (r,) = e.generate([req([token], max_tokens=1)])
        assert len(r.output_ids) == 1
    else:
        with pytest.raises(RequestError, match=rf"request 0: token id {token} is outside the vocabulary \[0, 256\)"):
            e.generate([req([token])])
        assert e.stats["steps"] == 0


@pytest.mark.parametrize("P, outcome", [
    (7, (2, "length")),   # one under the context: two tokens (positions 7 and 8 - the second not fed)
    (8, (1, "length")),   # exactly the context: accepted, one token, and it cannot be fed
    (9, RequestError),    # one over: refused
])
def test_prompt_length_at_the_context(P, outcome):
    e = engine(maxpos=8)
    if outcome is RequestError:
        with pytest.raises(RequestError, match=r"a 9-token prompt is longer than the context \(max_position_embeddings 8\)"):
            e.generate([req(A * P, max_tokens=5)])
        return
    (r,) = e.generate([req(A * P, max_tokens=5)])
    assert (len(r.output_ids), r.finish) == outcome
    assert idle(e)


@pytest.mark.parametrize("M, fits", [
    (4, True),    # 4 + 4 - 1 = 7 positions: 2 blocks of the 2
    (5, True),    # 8 positions: the pool exactly (the last token is never fed)
    (6, False),   # 9 positions: 3 blocks
])
def test_worst_case_at_the_pool_size(M, fits):
    """A 4-token prompt in a pool of 2 blocks of 4: it can ever need prompt + max_tokens - 1 positions."""
    e = engine(n_blocks=2)
    r = req(A * 4, max_tokens=M)
    if fits:
        (out,) = e.generate([r])
        assert len(out.output_ids) == M and out.finish == "length"
        assert idle(e)
    else:
        with pytest.raises(KvError, match=r"request 0 needs up to 3 KV blocks \(4 prompt tokens \+ max_tokens 6, B = 4\) "
                                          r"but the pool has only 2 available of 2"):
            e.generate([r])
        assert e.stats["steps"] == 0


@pytest.mark.parametrize("maxpos, outcome", [
    (7, (4, "length")),   # the context ends it first: positions 0..6, 4 tokens
    (8, (5, "length")),   # 8 positions: the pool exactly
    (9, KvError),         # 9 positions: 3 blocks, more than the pool
])
def test_worst_case_capped_by_the_context(maxpos, outcome):
    """max_tokens 100 could never run to its end: the worst case is capped at the context."""
    e = engine(n_blocks=2, maxpos=maxpos)
    if outcome is KvError:
        with pytest.raises(KvError, match="needs up to 3 KV blocks"):
            e.generate([req(A * 4, max_tokens=100)])
        return
    (r,) = e.generate([req(A * 4, max_tokens=100)])
    assert (len(r.output_ids), r.finish) == outcome
    assert idle(e)


# ------------------------------------------------------------------ admission


@pytest.mark.parametrize("max_seqs, admitted", [(2, 2), (3, 3), (4, 3)])
def test_admission_at_max_seqs(max_seqs, admitted):
    """Three requests: the first step admits max_seqs of them (all three when max_seqs is 3 or more)."""
    records = steps(engine(max_seqs=max_seqs), [req(A, 2), req(A, 2), req(A, 2)])
    assert len(records[0].admitted) == admitted
    assert max(len(r.rows) for r in records) == admitted


@pytest.mark.parametrize("n_blocks, together", [
    (3, False),   # 2 + 2 blocks of worst case in 3: the second waits for the first
    (4, True),    # exactly full: both run at once
    (5, True),
])
def test_admission_when_the_pool_is_exactly_full(n_blocks, together):
    """Each request can ever need 2 blocks (4 prompt tokens + max_tokens 4 - 1 = 7 positions)."""
    records = steps(engine(n_blocks=n_blocks), [req(A * 4, 4), req(A * 4, 4)])
    assert [i for i, _ in records[0].admitted] == ([0, 1] if together else [0])
    assert len(records) == (4 if together else 8)


# ------------------------------------------------------------------ scheduling


@pytest.mark.parametrize("budget, first_step", [
    (9, [(0, 5)]),              # 5 + 5 > 9: the second prompt waits (it is never cut)
    (10, [(0, 5), (1, 5)]),     # exactly the budget: both
    (11, [(0, 5), (1, 5)]),
])
def test_a_step_fills_its_budget_exactly(budget, first_step):
    records = steps(engine(max_batch_tokens=budget, prefill_chunk=8), [req(A * 5, 2), req(A * 5, 2)])
    assert [(r.request, r.n) for r in records[0].rows] == first_step


# Each row: requests (prompt length, max_tokens), the scheduler's settings, then what each of the
# first steps ran, as (request, first position, tokens, of which prompt, sampled?) per row.
SCHEDULES = [
    # a chunk that does not fit the step waits while a later one that fits runs (request 1 skipped)
    ("later chunk fits", [(1, 3), (6, 1), (2, 1)], dict(max_batch_tokens=4, prefill_chunk=6, max_seqs=3),
     [[(0, 0, 1, 1, True), (2, 0, 2, 2, True)],          # chunk min(6, 4): 1 + 4 > 4, request 1 waits; 1 + 2 fits
      [(0, 1, 1, 0, True)],                              # request 2 is done; 1 + 4 > 4 still
      [(0, 2, 1, 0, True)],
      [(1, 0, 4, 4, False)],                             # alone: chunk min(6, budget 4)
      [(1, 4, 2, 2, True)]]),
    # prefill_chunk above max_batch_tokens is cut to it; no token is sampled before the prompt's end
    ("chunk capped by budget", [(9, 1)], dict(max_batch_tokens=4, prefill_chunk=100),
     [[(0, 0, 4, 4, False)], [(0, 4, 4, 4, False)], [(0, 8, 1, 1, True)]]),
    # a prompt of exactly one chunk samples in its first step; one more token takes a second step
    ("exactly one chunk", [(4, 1)], dict(max_batch_tokens=8, prefill_chunk=4), [[(0, 0, 4, 4, True)]]),
    ("one over a chunk", [(5, 1)], dict(max_batch_tokens=8, prefill_chunk=4),
     [[(0, 0, 4, 4, False)], [(0, 4, 1, 1, True)]]),
    ("one under a chunk", [(3, 1)], dict(max_batch_tokens=8, prefill_chunk=4), [[(0, 0, 3, 3, True)]]),
    # decode rows come first and each takes one token of the budget: two decodes fill a budget of 2
    # and the third request waits for one to finish
    ("decodes fill the budget", [(1, 3), (1, 3), (1, 3)], dict(max_batch_tokens=2, prefill_chunk=1, max_seqs=3),
     [[(0, 0, 1, 1, True), (1, 0, 1, 1, True)],
      [(0, 1, 1, 0, True), (1, 1, 1, 0, True)],          # 2 decodes fill the budget: request 2 waits
      [(0, 2, 1, 0, True), (1, 2, 1, 0, True)],
      [(2, 0, 1, 1, True)]]),
]


@pytest.mark.parametrize("name, shapes, settings, expected", SCHEDULES, ids=[s[0] for s in SCHEDULES])
def test_scheduling_table(name, shapes, settings, expected):
    e = engine(**settings)
    records = steps(e, [req(A * P, M) for P, M in shapes])
    got = [[(r.request, r.start, r.n, r.prompt, r.token is not None) for r in rec.rows] for rec in records]
    assert got[:len(expected)] == expected
    results = e.results
    assert [r.prefilled_tokens for r in results] == [P for P, _ in shapes]  # every prompt token once
    assert [len(r.output_ids) for r in results] == [M for _, M in shapes]


# ------------------------------------------------------------------ finish reasons

# The k-th greedy token of "a" is AFTER_A[k - 1]; stop k = 0: no stop id. The context is cut to maxpos:
# after a 1-token prompt the n-th new token is at position n, fed only while n < maxpos, so the context
# ends the request at n = maxpos. Expected: (tokens out, finish).
FINISHES = [
    # stop  max_tokens  maxpos   expected         what coincides
    (3,     9,          9,       (3, "stop")),    # stop alone
    (0,     3,          9,       (3, "length")),  # max_tokens alone
    (0,     9,          4,       (4, "length")),  # the context alone
    (3,     3,          9,       (3, "stop")),    # stop = max_tokens: the stop wins
    (4,     9,          4,       (4, "stop")),    # stop = context: the stop wins
    (0,     4,          4,       (4, "length")),  # max_tokens = context
    (4,     4,          4,       (4, "stop")),    # all three at once: the stop wins
    (4,     3,          9,       (3, "length")),  # the stop one after max_tokens: never sampled
    (2,     3,          9,       (2, "stop")),    # the stop one before max_tokens
    (0,     3,          4,       (3, "length")),  # max_tokens one under the context
    (0,     5,          4,       (4, "length")),  # max_tokens one over the context
    (5,     9,          4,       (4, "length")),  # the stop one after the context
    (0,     1,          9,       (1, "length")),  # max_tokens 1
]


@pytest.mark.parametrize("stop_k, max_tokens, maxpos, expected", FINISHES)
def test_finish_reasons(stop_k, max_tokens, maxpos, expected):
    stop = [AFTER_A[stop_k - 1]] if stop_k else []
    assert not stop or stop[0] not in AFTER_A[:stop_k - 1]  # the row's stop id first appears there
    e = engine(maxpos=maxpos)
    events = list(e.stream([req(A, max_tokens, stop)]))
    (r,) = e.results
    assert (len(r.output_ids), r.finish) == expected
    assert r.output_ids == AFTER_A[:expected[0]]
    assert [ev.finish for ev in events] == [None] * (expected[0] - 1) + [expected[1]]
    shown = AFTER_A[:expected[0] - (expected[1] == "stop")]  # a stop id is not part of the text
    assert r.text == bytes(shown).decode()
    assert idle(e)


# ------------------------------------------------------------------ the prefix cache at a block boundary

# A first request runs an 8-token prompt (blocks 0 and 1 full and registered); a second prompt shares
# its first tokens. The cache may supply the full blocks before the second's LAST token: (P - 1) // B.
CACHE_HITS = [
    # second prompt            hits  prefilled   why
    (list(b"abcdefgh")[:4],    0,    4),         # 4 tokens, one block: its last token is in block 0
    (list(b"abcdefgh")[:5],    1,    1),         # one past the boundary: block 0 from the cache
    (list(b"abcdefgh")[:7],    1,    3),
    (list(b"abcdefgh"),        1,    4),         # the whole cached prompt, ending on the boundary:
    #                                              its last block is prefilled again
    (list(b"abcdefgh") + [97], 2,    1),         # one past the second boundary: both blocks
    (list(b"abcdefgX"),        1,    4),         # block 1 differs: block 0 only
    (list(b"abcXefgh") + [97], 0,    9),         # block 0 differs: the chain misses at once
]


@pytest.mark.parametrize("prompt, hits, prefilled", CACHE_HITS)
def test_prefix_cache_hit_at_the_block_boundary(prompt, hits, prefilled):
    e = engine()
    (first,) = e.generate([req(b"abcdefgh", 1)])
    assert first.cached_blocks == 0 and first.prefilled_tokens == 8
    assert e.pool.stats()["cached"] == 2  # blocks 0 and 1 registered, released into the cache
    (second,) = e.generate([req(prompt, 3)])
    assert (second.cached_blocks, second.cached_tokens, second.prefilled_tokens) == (hits, hits * B, prefilled)
    alone = engine(prefix_cache=False).generate([req(prompt, 3)])[0]
    assert second.output_ids == alone.output_ids and second.logprobs == alone.logprobs
    assert idle(e)
