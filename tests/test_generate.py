"""tl_lab/engine/generate.py: the engine loop over ModelRunner, on data/tiny-llama and data/bigram (one test
on SmolLM2): prefix-cache hits, the last prompt token, no leaked blocks, batch invariance of whole
generations, stops, seeds, streaming, pool exhaustion."""

import json
import re
import shutil

import numpy as np
import pytest

from conftest import smollm2_path, write_sentencepiece_tokenizer
from tl_lab.engine.blocks import blocks_for
from tl_lab.errors import KvError
from tl_lab.engine.generate import Engine, Request, RequestError, Result
from tl_lab.kv import BlockState, prefix_hashes
from tl_lab.ops.paths import DATA_DIR
from tl_lab.runner import EngineConfig, KvConfig, ModelRunner
from tl_lab.sample import SamplingParams

TINY = DATA_DIR / "tiny-llama"
B = 16
GREEDY = SamplingParams(temperature=0.0)
SAMPLED = SamplingParams(temperature=0.9, top_k=60, top_p=0.95)
PENALISED = SamplingParams(temperature=0.7, min_p=0.05, repetition_penalty=1.3, presence_penalty=0.4,
                           frequency_penalty=0.2)
SYSTEM = "You are a careful assistant. Answer in one short sentence.\n"  # 59 bytes: 3 full blocks


def engine(n_blocks=64, prefix_cache=True, runner=None, **kw) -> Engine:
    cfg = EngineConfig(kv=KvConfig(n_blocks=n_blocks, block_tokens=B), prefix_cache=prefix_cache, **kw)
    if runner is not None:  # share the weights, a fresh pool; the scheduler's settings from cfg
        return Engine(ModelRunner(runner.weights, cfg), cfg=cfg)
    return Engine.load(TINY, cfg)


def req(text, params=GREEDY, seed=0, max_tokens=16, stop_ids=None) -> Request:
    return Request(list(text.encode()), params, seed, max_tokens, stop_ids)


def assert_pool_idle(pool):
    """Nothing in use: every block free or cached, every reference given back."""
    s = pool.stats()
    assert s["in_use"] == 0 and s["free"] + s["cached"] == s["n_blocks"], s
    assert all(pool.ref(b) == 0 for b in range(pool.n_blocks))
    assert all(pool.state(b) != BlockState.IN_USE for b in range(pool.n_blocks))


def same(a: Result, b: Result) -> bool:
    """Bit for bit: the same ids and the same f64 logprobs."""
    return a.output_ids == b.output_ids and a.logprobs == b.logprobs and a.finish == b.finish


# ------------------------------------------------------------------ the prefix cache


def test_prefix_cache_hits_on_a_shared_system_prompt():
    """A second request with the same system prompt finds its full blocks by hash and skips that
    prefill; its output equals a run with the prefix cache off (ids exactly, logprobs within float
    tolerance: the uncached suffix is prefilled as a chunk of its own, section 2.4's chunk invariance)."""
    e = engine()
    a, b = SYSTEM + "Q: what is a cache?", SYSTEM + "Q: what is a block?"
    common = len(SYSTEM + "Q: what is a ")  # 72 bytes: 4 full blocks
    first = e.generate([req(a, SAMPLED, seed=5, max_tokens=20)])[0]
    assert (first.cached_blocks, first.cached_tokens, first.prefilled_tokens) == (0, 0, len(a))
    lookups = e.pool.stats()["lookups"]
    second = e.generate([req(b, SAMPLED, seed=5, max_tokens=20)])[0]
    assert second.cached_blocks == common // B == 4 and second.cached_tokens == 64
    assert second.prefilled_tokens == len(b) - 64  # only the rest of the prompt ran
    s = e.pool.stats()
    assert s["lookups"] - lookups == 4 == s["hits"]  # blocks 0-3; block 4 holds the last prompt token

    off = engine(prefix_cache=False, runner=e.runner)
    alone = off.generate([req(b, SAMPLED, seed=5, max_tokens=20)])[0]
    assert alone.cached_blocks == 0 and alone.prefilled_tokens == len(b)
    assert second.output_ids == alone.output_ids
    assert np.max(np.abs(np.subtract(second.logprobs, alone.logprobs))) < 1e-4
    assert_pool_idle(e.pool)
    assert off.pool.stats()["cached"] == 0  # with the cache off, release frees


def test_a_request_admitted_later_hits_blocks_of_a_running_one():
    """max_seqs=1: the second request is admitted when the first finishes and reuses its blocks;
    admitted together, neither finds the other's blocks (they are registered after the prefill)."""
    e = engine(max_seqs=1)
    out = e.generate([req(SYSTEM + "one"), req(SYSTEM + "two")])
    assert [r.cached_blocks for r in out] == [0, 3]
    e = engine(max_seqs=2)
    out = e.generate([req(SYSTEM + "one"), req(SYSTEM + "two")])
    assert [r.cached_blocks for r in out] == [0, 0]


def test_tables_show_the_running_requests_blocks():
    """engine.tables() / lengths(): what the block map draws while a stream runs."""
    e = engine()
    e.generate([req(SYSTEM + "one")])
    it = e.stream([req(SYSTEM + "two", max_tokens=4)])
    next(it)  # the prompt is in the pool, the first token sampled
    ((name, table),) = e.tables().items()
    P = len(SYSTEM + "two")
    assert name == "req 0" and e.lengths() == {"req 0": P} and len(table) == blocks_for(P, B)
    want = prefix_hashes(list((SYSTEM + "two").encode()), B)
    assert [e.pool.hash_of(b) for b in table[:3]] == want[:3]  # the three blocks found by hash
    assert all(e.pool.state(b) == BlockState.IN_USE for b in table)
    list(it)
    assert e.tables() == {} and e.lengths() == {}


@pytest.mark.parametrize("n", [47, 48, 49])
def test_the_last_prompt_token_is_always_computed(n):
    """The same prompt twice: the lookup stops before the block holding the last prompt token, whose
    logits pick the first new token. A prompt of exactly 3 blocks reuses 2 and prefills the third again."""
    e = engine()
    prompt = (SYSTEM * 2)[:n]
    first = e.generate([req(prompt, SAMPLED, seed=1)])[0]
    again = e.generate([req(prompt, SAMPLED, seed=1)])[0]
    assert again.cached_blocks == (n - 1) // B == {47: 2, 48: 2, 49: 3}[n]
    assert again.prefilled_tokens == n - again.cached_tokens >= 1
    assert again.output_ids == first.output_ids
    assert np.max(np.abs(np.subtract(again.logprobs, first.logprobs))) < 1e-4
    assert_pool_idle(e.pool)


# ------------------------------------------------------------------ blocks come back


def test_no_block_leaked_after_many_requests():
    """40 requests of many lengths through a small pool (evictions happen), batched 4 at a time:
    afterwards nothing is in use and every block is free or cached."""
    e = engine(n_blocks=24, max_seqs=4)
    rng = np.random.default_rng(0)
    reqs = []
    for i in range(40):
        n = int(rng.integers(1, 60))
        prompt = (SYSTEM * 2)[:n] if i % 3 else bytes(rng.integers(32, 127, n).tolist()).decode()
        reqs.append(req(prompt, [GREEDY, SAMPLED, PENALISED][i % 3], seed=i, max_tokens=int(rng.integers(1, 25))))
    out = e.generate(reqs)
    assert all(r.finish in ("stop", "length") for r in out)
    assert all(1 <= len(r.output_ids) <= q.max_tokens for r, q in zip(out, reqs))
    assert_pool_idle(e.pool)
    s = e.pool.stats()
    assert s["evictions"] > 0 and s["hits"] > 0  # the pool was under pressure and the cache was used


def test_blocks_come_back_when_the_stream_stops_early_or_fails(monkeypatch):
    e = engine()
    it = e.stream([req(SYSTEM, SAMPLED, max_tokens=50), req("hello", max_tokens=50)])
    for _ in range(5):
        next(it)
    assert e.pool.stats()["in_use"] > 0
    with pytest.raises(RuntimeError, match="already streaming"):
        e.generate([req("x")])  # one stream at a time: admission reserves blocks per stream
    it.close()  # the consumer stops listening: the generator's finally releases everything
    assert_pool_idle(e.pool)
    assert e.tables() == {}

    def broken_sampler(*args):
        raise RuntimeError("boom")

    monkeypatch.setattr("tl_lab.engine.generate._sample_fn", lambda: broken_sampler)
    with pytest.raises(RuntimeError, match="boom"):
        e.generate([req(SYSTEM), req("x")])
    assert_pool_idle(e.pool)


# ------------------------------------------------------------------ batch invariance of generations


@pytest.mark.parametrize("kw", [{}, {"max_seqs": 2, "prefill_chunk": 16, "max_batch_tokens": 40}])
def test_same_output_alone_and_batched(kw):
    """Each request alone (a fresh engine) and among others (prefill rows and decode rows mixed in
    one ForwardBatch per step): the same ids and the same f64 logprobs, bit for bit."""
    reqs = [
        req(SYSTEM + "Tell me about caches.", SAMPLED, seed=3, max_tokens=24),
        req("Hi", PENALISED, seed=4, max_tokens=30),
        req("x" * 70, GREEDY, seed=0, max_tokens=12),  # a long prefill (its own product, LONG_ROWS)
        req("The quick brown fox", SAMPLED, seed=5, max_tokens=8),
    ]
    shared = engine(prefix_cache=False, **kw)
    together = shared.generate(reqs)
    assert shared.stats["steps"] < sum(len(r.output_ids) for r in together)  # they did share steps
    for i, r in enumerate(reqs):
        alone = engine(prefix_cache=False, runner=shared.runner, **kw).generate([r])[0]
        assert same(alone, together[i]), i
    mixed = engine(prefix_cache=False, runner=shared.runner, **kw).generate(reqs[::-1])[::-1]
    assert all(same(a, b) for a, b in zip(mixed, together))


def test_seeded_sampling_repeats_and_seeds_differ():
    e = engine()
    p = SamplingParams(temperature=1.0)
    a, b, c = e.generate([req("Once upon", p, seed=11, max_tokens=24), req("Once upon", p, seed=11, max_tokens=24),
                          req("Once upon", p, seed=12, max_tokens=24)])
    assert same(a, b)
    assert a.output_ids != c.output_ids
    again = engine(runner=e.runner).generate([req("Once upon", p, seed=11, max_tokens=24)])[0]
    assert same(again, a)


# ------------------------------------------------------------------ stops


def test_length_stop():
    e = engine()
    (r,) = e.generate([req("abc", SAMPLED, max_tokens=7)])
    assert r.finish == "length" and len(r.output_ids) == 7 == len(r.logprobs)
    # the context: a 510-token prompt on a 512-position model yields 3 tokens; the last is never fed
    (r,) = e.generate([Request([65] * 510, GREEDY, 0, 100)])
    assert r.finish == "length" and len(r.output_ids) == 3
    assert_pool_idle(e.pool)


def test_stop_at_a_request_stop_id():
    e = engine()
    (free,) = e.generate([req("Hello", GREEDY, max_tokens=20)])
    k = 4
    t = free.output_ids[k]
    first = free.output_ids.index(t)
    events = []
    (r,) = e.generate([req("Hello", GREEDY, max_tokens=20, stop_ids=[t])], on_token=events.append)
    assert r.finish == "stop" and r.output_ids == free.output_ids[: first + 1]
    assert r.text == e.tokenizer.decode(r.output_ids[:-1])  # the stop token is not in the text
    assert events[-1].token == t and "".join(ev.text for ev in events) == r.text  # a held byte flushed at the end
    whole = next(u for u in free.output_ids if not e.tokenizer.decode(free.output_ids[: free.output_ids.index(u)])
                 .endswith("\ufffd"))  # a stop with nothing held back: its event has no text
    events.clear()
    (r,) = e.generate([req("Hello", GREEDY, max_tokens=20, stop_ids=[whole])], on_token=events.append)
    assert r.finish == "stop" and events[-1].text == "" and "".join(ev.text for ev in events) == r.text


@pytest.mark.parametrize("style", ["llama2", "metaspace"])
def test_streamed_text_keeps_the_spaces_of_a_sentencepiece_tokenizer(tmp_path, style):
    """A SentencePiece decoder drops the space before the first word it decodes: token by token, the
    text had none ("▁hello" alone is "hello"). Each token's text is now decoded after the last ids out
    (`Tokenizer.decode_after`): the events add up to the text after the prompt, spaces and all."""
    d = tmp_path / "tiny"
    shutil.copytree(TINY, d)
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "tl_tokenizer": "bpe", "eos_token_id": 2, "bos_token_id": 1}))
    assert write_sentencepiece_tokenizer(d / "tokenizer.json", style, byte_fallback=False, fuse_unk=False,
                                         size=cfg["vocab_size"]) == cfg["vocab_size"]
    e = Engine.load(d, EngineConfig(kv=KvConfig(n_blocks=64, block_tokens=B)))
    prompt = e.tokenizer.encode("<s>hello world")
    events = []
    (r,) = e.generate([Request(prompt, SAMPLED, 3, 40, [])], on_token=events.append)
    whole = e.tokenizer.decode(prompt + r.output_ids)
    assert "".join(ev.text for ev in events) == r.text == whole[len(e.tokenizer.decode(prompt)):]
    spaces = sum(e.tokenizer.token_str(t).startswith("▁") for t in r.output_ids)
    assert spaces >= 20 and r.text.count(" ") >= spaces, (spaces, r.text)


def test_stop_at_the_config_eos(tmp_path):
    """stop_ids None: the model's eos_token_ids. A copy of the tiny Llama whose EOS is the token the
    greedy stream produces at step 5."""
    e = engine()
    (free,) = e.generate([req("Hello", GREEDY, max_tokens=20)])
    eos = free.output_ids[5]
    d = tmp_path / "tiny"
    shutil.copytree(TINY, d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["eos_token_id"] = [eos, 3]
    (d / "config.json").write_text(json.dumps(cfg))
    e2 = Engine.load(d, EngineConfig(kv=KvConfig(n_blocks=64, block_tokens=B)))
    (r,) = e2.generate([req("Hello", GREEDY, max_tokens=20)])
    assert r.finish == "stop" and r.output_ids == free.output_ids[: free.output_ids.index(eos) + 1]
    (r,) = e2.generate([req("Hello", GREEDY, max_tokens=20, stop_ids=[])])  # no stop ids at all
    assert r.finish == "length" and r.output_ids == free.output_ids


# ------------------------------------------------------------------ streaming


def test_events_stream_every_token_with_its_logprob():
    e = engine()
    reqs = [req("Hello", SAMPLED, seed=1, max_tokens=12), req(SYSTEM, PENALISED, seed=2, max_tokens=9)]
    events = list(e.stream(reqs))
    for i, r in enumerate(e.results):
        mine = [ev for ev in events if ev.request == i]
        assert [ev.token for ev in mine] == r.output_ids
        assert [ev.logprob for ev in mine] == r.logprobs
        assert [ev.position for ev in mine] == list(range(len(reqs[i].prompt_ids), len(reqs[i].prompt_ids) + len(mine)))
        assert [ev.finish for ev in mine] == [None] * (len(mine) - 1) + ["length"]
        # text deltas hold back an incomplete UTF-8 character, and add up to the decoded output
        assert "".join(ev.text for ev in mine) == r.text == e.tokenizer.decode(r.output_ids)
        assert [ev.piece for ev in mine] == [e.tokenizer.token_str(t) for t in r.output_ids]
        assert all(lp <= 0 for lp in r.logprobs)
    # the two requests were interleaved: one step yields a token of each
    assert [ev.request for ev in events[:4]] == [0, 1, 0, 1]


def test_utf8_characters_are_printed_whole():
    """A token that ends inside a UTF-8 character prints nothing until the character is complete."""
    from tl_lab.engine.generate import _Seq

    e = engine()
    seq = _Seq(0, Request([65], GREEDY, 0, 8), [])
    texts = []
    for b in "añ€".encode():
        row = np.full(256, -10.0, dtype=np.float32)
        row[b] = 10.0
        texts.append(e._sample(seq, row).text)
    assert texts == ["a", "", "ñ", "", "", "€"]


def test_bigram_generation():
    e = Engine.load(DATA_DIR / "bigram")
    (r,) = e.generate([req("a", GREEDY, max_tokens=8)])
    assert r.text.startswith("bcd") and r.finish == "length"
    assert_pool_idle(e.pool)


# ------------------------------------------------------------------ refusals


def test_pool_exhaustion_is_a_clear_error_and_a_full_pool_waits():
    e = engine(n_blocks=4)
    with pytest.raises(KvError, match=r"needs up to 5 KV blocks .* only 4 available.*n_blocks"):
        e.generate([req("y" * 40, max_tokens=40)])  # 79 positions: 5 blocks of 16
    assert e.pool.stats()["free"] == 4
    # two requests of 3 blocks each in a 4-block pool: the second waits for the first, nothing fails
    reqs = [req("y" * 30, SAMPLED, seed=1, max_tokens=12), req("z" * 30, SAMPLED, seed=2, max_tokens=12)]
    out = e.generate(reqs)
    assert all(len(r.output_ids) == 12 for r in out)
    assert e.stats["steps"] == 24  # one after the other
    big = engine(runner=e.runner)
    assert all(same(a, b) for a, b in zip(out, big.generate(reqs)))
    assert_pool_idle(e.pool)


def test_bad_requests_are_refused():
    e = engine()
    for make, match in [
        (lambda: Request([], GREEDY, 0, 4), "empty"),
        (lambda: Request([65], GREEDY, 0, 0), "max_tokens"),
        (lambda: Request([65], GREEDY, -1, 4), "seed"),
    ]:
        with pytest.raises(ValueError, match=match):
            make()
    with pytest.raises(ValueError, match="outside the vocabulary"):
        e.generate([Request([65, 256], GREEDY, 0, 4)])
    with pytest.raises(ValueError, match="longer than the context"):
        e.generate([Request([65] * 513, GREEDY, 0, 4)])
    assert_pool_idle(e.pool)


# ------------------------------------------------------------------ SmolLM2


@pytest.mark.smollm2
def test_smollm2_shared_system_prompt_and_batching(one_blas_thread):
    """On the real model: a chat with the same system prompt hits its blocks, and the answer equals
    the cache-off run's; a request batched with another is bit for bit the request alone."""
    from tl_lab.engine.tokenizer import load_tokenizer

    path = smollm2_path()
    cfg = EngineConfig(kv=KvConfig(n_blocks=64, block_tokens=B))
    e = Engine(ModelRunner.load(path, cfg), load_tokenizer(path))
    tok = e.tokenizer
    system = {"role": "system", "content": "You are a concise assistant for a course on inference engines. "
              "You answer every question with one short, friendly sentence and never use lists."}

    def chat(q):
        return tok.encode(tok.apply_chat_template([system, {"role": "user", "content": q}]))

    a, b = chat("What is the capital of France?"), chat("What colour is the sky?")
    e.generate([Request(a, GREEDY, 0, 4)])
    (second,) = e.generate([Request(b, GREEDY, 0, 10)])
    assert second.cached_blocks == 2 and second.cached_tokens == 32  # the system turn's full blocks
    off = Engine(ModelRunner(e.runner.weights, EngineConfig(kv=KvConfig(64, B), prefix_cache=False)), tok)
    (plain,) = off.generate([Request(b, GREEDY, 0, 10)])
    assert second.output_ids == plain.output_ids and second.text.strip()
    (other, batched) = off.generate([Request(a, SAMPLED, 7, 6), Request(b, GREEDY, 0, 10)])
    assert same(batched, plain)
    assert_pool_idle(e.pool)
    assert_pool_idle(off.pool)


# ------------------------------------------------------------------ issue 12: refused before anything runs


def pool_state(e: Engine):
    p = e.pool
    return (p.stats(), p.free_list(), p.lru(), [(p.ref(b), p.fill(b), p.hash_of(b)) for b in range(p.n_blocks)],
            p.data.tobytes(), dict(e.stats))


def test_every_request_is_checked_before_anything_runs():
    """A request that can never fit, or a bad one, anywhere in the list: a TlError naming its index,
    raised by generate/stream before any request has run; the pool and the stats are as they were."""
    from tl_lab.errors import TlError
    from tl_lab.engine.generate import RequestError

    e = engine(n_blocks=4)
    e.generate([req(SYSTEM, max_tokens=2)])  # something cached, so "nothing changed" means something
    ok = req("fine", max_tokens=4)
    for bad, exc, words in [
        (req("y" * 40, max_tokens=40), KvError, ["request 2", "5 KV blocks", "4 available"]),
        (Request([65, 256], GREEDY, 0, 4), RequestError, ["request 2", "256", "vocabulary"]),
        (Request([65] * 513, GREEDY, 0, 4), RequestError, ["request 2", "513", "context"]),
        ("hello", RequestError, ["request 2", "str"]),
    ]:
        before = pool_state(e)
        with pytest.raises(exc) as info:
            e.generate([ok, ok, bad])
        assert isinstance(info.value, TlError)
        assert all(w in str(info.value) for w in words), (words, str(info.value))
        assert pool_state(e) == before
        with pytest.raises(exc):
            e.stream([bad])  # refused when stream is called, not at the first next()
        assert not e._streaming and pool_state(e) == before


def test_a_callback_that_is_not_a_function_is_refused_before_anything_runs():
    """generate([...], on_step=5) ran a step, then failed with Python's "'int' object is not callable"
    (on_token="print" after two steps); now a TypeError naming the argument before any step runs."""
    e = engine(n_blocks=4)
    before = pool_state(e)
    for kw, words in ((dict(on_step=5), "on_step must be a function (or None), got int 5"),
                      (dict(on_token="print"), "on_token must be a function (or None), got str 'print'")):
        with pytest.raises(TypeError, match=f"^{re.escape(words)}$"):
            e.generate([req("hi", max_tokens=2)], **kw)
        assert e.stats["steps"] == 0 and not e._streaming and pool_state(e) == before
    with pytest.raises(TypeError, match="on_step must be a function"):
        e.stream([req("hi", max_tokens=2)], on_step=5)


def test_a_request_not_in_a_list_is_named():
    """engine.generate(Request(...)) (one request, no list) raised Python's "TypeError: 'Request'
    object is not iterable", and generate(None) the same for NoneType; now a RequestError naming what
    was given, before anything runs."""
    from tl_lab.engine.generate import RequestError

    e = engine(n_blocks=4)
    before = pool_state(e)
    for bad, words in ((req("hi", max_tokens=2), "got Request: wrap one in a list, [request]"), (None, "got NoneType"),
                       (5, "got int")):
        for call in (e.generate, e.stream):
            with pytest.raises(RequestError, match=re.escape(f"stream takes a list of Requests, {words}")):
                call(bad)
    assert not e._streaming and pool_state(e) == before
    assert len(e.generate([req("hi", max_tokens=2)])) == 1


@pytest.mark.parametrize("make, words", [
    (lambda: Request([1.7, 2.2]), ["prompt_ids[0]", "1.7", "not an integer"]),
    (lambda: Request("hello"), ["text", "'hello'", "encode"]),
    (lambda: Request(5), ["sequence of token ids", "int"]),
    (lambda: Request([65], max_tokens=2.0), ["max_tokens"]),
    (lambda: Request([65], seed=True), ["seed"]),
    (lambda: Request([65], seed=2**64), ["seed"]),
    (lambda: Request([65], stop_ids=[1.5]), ["stop_ids[0]"]),
])
def test_requests_with_bad_fields_are_refused_in_words(make, words):
    from tl_lab.engine.generate import RequestError

    with pytest.raises(RequestError) as info:
        make()
    assert isinstance(info.value, ValueError)
    assert all(w in str(info.value) for w in words), (words, str(info.value))


def test_a_request_of_text_or_of_nothing_is_refused_in_these_words():
    with pytest.raises(RequestError, match=r"^Request.prompt_ids must be token ids, got the text "
                                           r"'abcdefghijklmnopqrst' \(encode it first\)$"):
        Request("abcdefghijklmnopqrstuvwxyz")
    with pytest.raises(RequestError, match="^Request.prompt_ids is empty: a prompt needs at least one token$"):
        Request([])


# ------------------------------------------------------------------ the step record


def test_on_step_records_what_the_engine_did():
    """One StepRecord per step, from the real loop: rows, chunked prefill, hits, blocks allocated,
    evicted and released; with no callback the same results (recording changes nothing)."""
    reqs = [req(SYSTEM + "one", max_tokens=3), req(SYSTEM + "two", max_tokens=3), req("x" * 40, max_tokens=2)]
    e = engine(n_blocks=12, max_seqs=2, prefill_chunk=32, max_batch_tokens=40)
    records = []
    out = e.generate(reqs, on_step=records.append)
    assert [r.index for r in records] == list(range(len(records))) and len(records) == e.stats["steps"]
    first = records[0]
    assert first.admitted == [(0, 0), (1, 0)] and first.waiting == 1
    assert [(r.request, r.start, r.n, r.prompt) for r in first.rows] == [(0, 0, 32, 32)]  # 32 + 32 > 40
    assert first.allocated == {0: first.tables[0]} and len(first.tables[0]) == 2
    # every prompt token and every fed output token is in exactly one row
    for i, r in enumerate(reqs):
        rows = [row for rec in records for row in rec.rows if row.request == i]
        assert sum(row.prompt for row in rows) == out[i].prefilled_tokens == len(r.prompt_ids) - out[i].cached_tokens
        assert [row.token for row in rows if row.token is not None] == out[i].output_ids
        assert [row.start for row in rows] == sorted(row.start for row in rows)
    # blocks: the table is the prefix-cache hits then the blocks allocated, released tail first at the end
    for i in range(3):
        got = [b for rec in records for b in rec.allocated.get(i, [])]
        table = [rec.tables[i] for rec in records if i in rec.tables][-1]
        assert table[out[i].cached_blocks:] == got
        ((step, released),) = [(rec.index, rec.released[i]) for rec in records if i in rec.released]
        assert released == table[::-1] and (i, out[i].finish) in records[step].finished
    assert records[-1].pool == e.pool.stats() and records[-1].waiting == 0
    again = engine(runner=e.runner, n_blocks=12, max_seqs=2, prefill_chunk=32, max_batch_tokens=40).generate(reqs)
    assert all(same(a, b) for a, b in zip(again, out))


def test_on_step_shows_hits_and_evictions():
    e = engine(n_blocks=6, max_seqs=1)
    records = []
    e.generate([req(SYSTEM, max_tokens=2), req(SYSTEM, max_tokens=2), req("z" * 80, max_tokens=2)],
               on_step=records.append)
    admitted = dict(a for rec in records for a in rec.admitted)
    assert admitted == {0: 0, 1: 3, 2: 0}  # the second finds the system prompt's 3 full blocks
    evicted = [b for rec in records for b in rec.evicted]
    assert evicted and e.pool.stats()["evictions"] == len(evicted)  # the third needs 5 blocks of 6


def test_two_streams_made_before_either_runs_cannot_both_run():
    e = engine()
    a, b = e.stream([req("one", max_tokens=3)]), e.stream([req("two", max_tokens=3)])
    next(a)
    with pytest.raises(RuntimeError, match="^this Engine is already streaming; finish or close that stream first$"):
        next(b)
    list(a)
    assert_pool_idle(e.pool)


# ------------------------------------------------------------------ defaults, callbacks, counts


def test_an_engine_on_a_byte_model_needs_no_config_and_no_tokenizer():
    """Engine(runner) alone: the default EngineConfig and, for a byte model, its ByteTokenizer (the
    text comes back decoded); a cfg of another type is refused naming it."""
    runner = ModelRunner.load(TINY, EngineConfig(kv=KvConfig(n_blocks=16, block_tokens=B)))
    e = Engine(runner)
    assert e.cfg == EngineConfig() and e.tokenizer is not None
    assert (e.tokenizer.eos_ids, e.tokenizer.bos_id) == (runner.config.eos_token_ids, runner.config.bos_token_id)
    (r,) = e.generate([req("Hello", max_tokens=6)])
    assert r.text == e.tokenizer.decode(r.output_ids) and len(r.output_ids) == 6
    with pytest.raises(ValueError, match="Engine cfg must be an EngineConfig, got int"):
        Engine(runner, cfg=5)


def test_encode_refuses_a_prompt_over_the_context_as_a_request_error_before_encoding(monkeypatch):
    """A byte model's context of 512: 512 bytes are its ids, 513 a RequestError, with the tokenizer's
    encode never called (the bytes prove it); an engine with no tokenizer says to give ids."""
    runner = ModelRunner.load(TINY, EngineConfig(kv=KvConfig(n_blocks=16, block_tokens=B)))
    e = Engine(runner)
    assert runner.config.max_position_embeddings == 512 and e.encode("a" * 512) == [97] * 512
    monkeypatch.setattr(type(e.tokenizer), "encode", lambda self, text: pytest.fail("encoded"))
    with pytest.raises(RequestError, match=r"^a prompt of 513 bytes is at least 513 tokens, longer than the "
                                           r"context \(max_position_embeddings 512\)$"):
        e.encode("a" * 513)
    e.tokenizer = None
    with pytest.raises(RequestError, match="this engine has no tokenizer"):
        e.encode("a")


def test_without_a_tokenizer_events_carry_no_text():
    """A model whose tokenizer is not bytes, given none: ids and logprobs, empty text and pieces."""
    from test_runner import smollm2_shaped

    cfg = EngineConfig(kv=KvConfig(n_blocks=8, block_tokens=B))
    e = Engine(ModelRunner(smollm2_shaped(n_layers=1), cfg), cfg=cfg)
    assert e.tokenizer is None
    events = list(e.stream([Request([5, 6, 7], GREEDY, 0, 3)]))
    assert [ev.token for ev in events] == e.results[0].output_ids and len(events) == 3
    assert all(ev.text == "" and ev.piece == "" for ev in events) and e.results[0].text == ""


def test_on_token_sees_every_event_and_results_hold_their_prompts():
    e = engine()
    reqs = [req("Hello", max_tokens=5), req(SYSTEM, max_tokens=4)]
    seen = []
    out = e.generate(reqs, on_token=seen.append)
    assert [(ev.request, ev.token) for ev in seen] == [(ev.request, ev.token) for ev in e.stream(reqs)]
    assert sorted((ev.request, ev.token) for ev in seen) == sorted((r.request, t) for r in out for t in r.output_ids)
    assert [r.prompt_ids for r in out] == [q.prompt_ids for q in reqs]
    stream = e.stream(reqs)
    next(stream)
    stream.close()  # stopped early: the unfinished requests' results still name their prompts
    assert [r.prompt_ids for r in e.results] == [q.prompt_ids for q in reqs]
    assert_pool_idle(e.pool)


def test_stats_count_prompt_and_fed_output_tokens():
    """prefill_tokens: the prompt tokens computed; decode_tokens: the sampled tokens fed back, every
    output token but each request's last."""
    e = engine(prefix_cache=False)
    reqs = [req("Hello", max_tokens=5), req("a longer prompt of some forty bytes or so!", max_tokens=3)]
    out = e.generate(reqs)
    assert e.stats["prefill_tokens"] == sum(len(q.prompt_ids) for q in reqs)
    assert e.stats["decode_tokens"] == sum(len(r.output_ids) - 1 for r in out)


def test_a_decode_row_takes_one_token_of_the_step_budget():
    """max_batch_tokens 33: a running decode (1 token) and a 32-token prompt chunk share a step."""
    e = engine(max_seqs=2, prefill_chunk=32, max_batch_tokens=33)
    records = []
    e.generate([req("short", max_tokens=4), req("y" * 40, max_tokens=2)], on_step=records.append)
    assert [(r.request, r.n) for r in records[0].rows] == [(0, 5)]  # 5 + 32 > 33: the chunk waits
    assert [(r.request, r.n) for r in records[1].rows] == [(0, 1), (1, 32)]


def test_a_pool_taken_by_someone_else_between_requests_is_a_clear_error():
    """The pool shrank under the engine (blocks taken outside it) while nothing of its own runs: the
    waiting request is refused naming its sizes, instead of waiting forever."""
    e = engine(n_blocks=6, max_seqs=1)
    taken = []

    def grab(rec):
        if rec.finished and not taken:
            taken.extend(e.pool.alloc(e.pool.available()))

    with pytest.raises(KvError, match=r"request 1 needs up to 2 KV blocks \(20 prompt tokens \+ max_tokens 3"):
        e.generate([req("x" * 10, max_tokens=2), req("z" * 20, max_tokens=3)], on_step=grab)
    for b in taken:
        e.pool.release(b)
    assert_pool_idle(e.pool)
