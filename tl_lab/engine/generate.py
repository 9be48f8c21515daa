"""A small engine loop over ModelRunner: requests in, tokens streamed out (interface page, "Beyond the
chapter"; what chapter L10.1 hands to L10.2's scheduler, L10.4's block manager and L10.5's loop).

    engine = Engine.load("data/tiny-llama")
    for ev in engine.stream([Request(engine.encode("Hello"), SamplingParams(temperature=0), 0, 8)]):
        print(ev.text, end="", flush=True)

One step of `Engine.stream`:

1. admit waiting requests (first come, first served) while fewer than EngineConfig.max_seqs run
   and the pool can hold them (below); an admitted request first looks up its prompt's full blocks
   by chained `prefix_hash` (`BlockManager.admit`): those positions are not prefilled again;
2. build ONE ForwardBatch: a decode row (the last sampled token) for every sequence past its
   prompt, then the next prompt chunk of every sequence still prefilling, while the step has room
   (max_batch_tokens); allocate the blocks those positions need (`BlockManager.reserve`);
3. `runner.forward`; every block that became full is registered under its hash (`written`);
4. each sequence whose prompt is done samples with its own `stream(seed, PURPOSE_SAMPLE)`
   (`tl_lab.sample.sample`, prompt and output ids for the penalties), stops at a stop id (the
   config's eos_token_ids unless the request names its own) or at max_tokens, and its blocks are
   released (registered ones stay in the pool's cache for later requests).

Decisions:
- The last prompt token is always computed, because its logits pick the first new token. So the
  lookup covers at most the blocks that end before it: (P - 1) // B of a P-token prompt. When a
  whole prompt is cached and ends exactly on a block boundary, its final block is prefilled again
  (all B positions, into a new block) rather than copied and patched; vLLM does the same.
- Batch invariance: a sequence's chunks (prefill_chunk tokens, counted from its first uncached
  position) never depend on the other requests; a chunk that does not fit in the step's
  max_batch_tokens waits for the next step instead of being cut. With the runner's batch-invariant
  forward and a per-request generator, a request gives the same ids and logprobs, bit for bit,
  alone or batched. (The prefix cache changes the chunking of a prompt, so an output with cache
  hits equals one without only within the chapter's chunk-invariance tolerance.)
- Pool exhaustion: no preemption. A request is admitted only if the pool can hold its worst case
  (prompt + max_tokens - 1 positions) on top of the worst case of every running sequence, so a
  running sequence never finds the pool empty. A request that does not fit waits for running ones
  to finish. Every request is checked when `stream` is called, before anything runs: one that can
  never fit the pool is a KvError, a bad one a RequestError, each naming the request's index, and
  no request has run. Whatever ends the stream (the last request, an error, the consumer stopping
  early), every block is released.
- Settings: the scheduler's max_batch_tokens, max_seqs and prefill_chunk come from the EngineConfig
  given to `Engine` (or `Engine.load`), never from the runner's.
- `on_step`: an optional callback given one `StepRecord` per step, what the engine really did
  (who ran with how many tokens, prefix-cache hits, blocks allocated, evicted and released). With
  no callback nothing is recorded.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator

import numpy as np

from tl_lab.engine.blocks import BlockManager, SeqBlocks, blocks_for, cacheable
from tl_lab.ops.checks import as_int, is_int
from tl_lab.errors import BatchError, KvError
from tl_lab.runner import EngineConfig, ForwardBatch, ForwardSeq, ModelRunner
import tl_lab.sample as _sampler
from tl_lab.ops import fast_sample
from tl_lab.sample import PURPOSE_SAMPLE, SamplingParams, stream
from tl_lab.engine.tokenizer import ByteTokenizer, Tokenizer, load_tokenizer

__all__ = ["Request", "RequestError", "TokenEvent", "Result", "StepRow", "StepRecord", "Engine"]


def _sample_fn():
    """The sampler each token is drawn with: `tl_lab.sample.sample` in use (a learner's from a
    workspace, or one a pitfall edited, runs itself), or, when that is the reference's own file,
    its vectorized twin `ops.fast_sample.sample` (the same bits, tests/test_sample.py)."""
    return fast_sample.sample if fast_sample.is_reference(_sampler) else _sampler.sample


class SamplerAnswerError(RuntimeError):
    """The sampler in use returned what is not a token id of the vocabulary (a learner's sample.py under
    TL_LAB_WORKSPACE, most likely): the message names the sampler's file (the command line: exit 4)."""


class RequestError(BatchError, ValueError):
    """A request refused before anything runs (a bad field, an id outside the vocabulary, a prompt
    longer than the context). A TlError and a ValueError; the message names the request."""


def _token_ids(ids, what: str) -> list[int]:
    """ids as a list of Python ints, or RequestError naming `what` (text and floats are refused)."""
    if isinstance(ids, str):
        raise RequestError(f"{what} must be token ids, got the text {ids[:20]!r} (encode it first)")
    try:
        ids = list(ids)
    except TypeError:
        raise RequestError(f"{what} must be a sequence of token ids, got {type(ids).__name__}") from None
    bad = next((j for j, t in enumerate(ids) if not is_int(t)), None)
    if bad is not None:
        raise RequestError(f"{what}[{bad}] = {ids[bad]!r} is not an integer token id")
    return [int(t) for t in ids]


def _check_callback(f, name: str) -> None:
    """TypeError naming `name` unless f is None or callable (checked before anything runs)."""
    if f is not None and not callable(f):
        raise TypeError(f"{name} must be a function (or None), got {type(f).__name__} {f!r}")


@dataclass
class Request:
    """What to generate: prompt token ids, how to sample, the seed of its own generator, at most
    max_tokens new tokens; stop_ids None means the model's eos_token_ids. Checked when built
    (RequestError, also a ValueError)."""

    prompt_ids: list[int]
    params: SamplingParams = field(default_factory=SamplingParams)
    seed: int = 0
    max_tokens: int = 16
    stop_ids: Iterable[int] | None = None

    def __post_init__(self):
        self.prompt_ids = _token_ids(self.prompt_ids, "Request.prompt_ids")
        if not self.prompt_ids:
            raise RequestError("Request.prompt_ids is empty: a prompt needs at least one token")
        if not isinstance(self.params, SamplingParams):
            raise TypeError(f"Request.params must be a SamplingParams, got {type(self.params).__name__}")
        self.max_tokens = as_int(self.max_tokens, "Request.max_tokens", lo=1, error=RequestError)
        self.seed = as_int(self.seed, "Request.seed", lo=0, hi=2**64 - 1, error=RequestError)
        if self.stop_ids is not None:
            self.stop_ids = _token_ids(self.stop_ids, "Request.stop_ids")


# The ids already out that a new token's text is decoded after: enough for a SentencePiece word's space
# and a UTF-8 character's bytes (vLLM's detokenizer keeps a window of the same kind).
SHOWN_IDS = 6


@dataclass(frozen=True)
class TokenEvent:
    """One generated token of request `request` (its index in the list given to `stream`).

    text: what to print now: the new part of the decoded text after the prompt (empty while a UTF-8
    character is still incomplete, and for the stop token); piece: the token on its own, for display.
    finish: None, or "stop" (a stop id, which is not part of `text`) or "length" on the last token.
    """

    request: int
    token: int
    text: str
    logprob: float
    piece: str
    position: int
    finish: str | None = None


@dataclass
class Result:
    """A finished request. cached_blocks / cached_tokens: prompt blocks found by prefix hash (their
    prefill skipped); prefilled_tokens: prompt tokens the runner computed."""

    request: int
    prompt_ids: list[int]
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    text: str = ""
    finish: str | None = None
    cached_blocks: int = 0
    cached_tokens: int = 0
    prefilled_tokens: int = 0


@dataclass(frozen=True)
class StepRow:
    """One sequence's part of a step: request index, first position, new tokens, how many of them
    are prompt tokens (a prefill chunk) and the token sampled after them (None mid-prompt)."""

    request: int
    start: int
    n: int
    prompt: int
    token: int | None


@dataclass
class StepRecord:
    """What one step of `Engine.stream` did (given to `on_step`; costs nothing when absent).

    index: the step of this stream, from 0; admitted: (request, blocks found by prefix hash) of each request
    admitted before the forward; rows: the ForwardBatch, one StepRow per sequence, in batch order;
    allocated / released: request -> block ids (released tail first, at the step's end); evicted:
    cached blocks taken back by those allocations; finished: (request, "stop" | "length");
    tables: request -> block table after the forward; waiting: requests not admitted yet;
    pool: `pool.stats()` at the step's end.
    """

    index: int
    admitted: list[tuple[int, int]] = field(default_factory=list)
    rows: list[StepRow] = field(default_factory=list)
    allocated: dict[int, list[int]] = field(default_factory=dict)
    evicted: list[int] = field(default_factory=list)
    released: dict[int, list[int]] = field(default_factory=dict)
    finished: list[tuple[int, str]] = field(default_factory=list)
    tables: dict[int, list[int]] = field(default_factory=dict)
    waiting: int = 0
    pool: dict = field(default_factory=dict)


class _Seq:
    """A running request: its tokens, its blocks (tl_lab.engine.blocks.SeqBlocks) and its generator."""

    def __init__(self, index: int, req: Request, stop_ids: list[int]):
        self.index, self.req, self.stop = index, req, set(stop_ids)
        self.tokens = list(req.prompt_ids)  # prompt + output
        self.prompt = np.asarray(req.prompt_ids, dtype=np.int64)  # for the sampler: a list is checked each step
        self.rng = stream(req.seed, PURPOSE_SAMPLE)
        self.blocks = SeqBlocks()
        self.unprinted: list[int] = []  # ids whose text is not out yet (an incomplete character)
        self.shown = list(req.prompt_ids[-SHOWN_IDS:])  # the last ids whose text is out (Tokenizer.decode_after)
        self.result = Result(index, list(req.prompt_ids))

    @property
    def computed(self) -> int:
        """Positions 0 .. computed-1 hold K and V."""
        return self.blocks.written

    def worst_blocks(self, B: int, max_pos: int) -> int:
        """Blocks this sequence can ever need: every prompt position and each new token but the last."""
        return blocks_for(min(len(self.req.prompt_ids) + self.req.max_tokens - 1, max_pos), B)


class Engine:
    """The engine loop over one ModelRunner (and its pool). See the module docstring.

    cfg: where the scheduler's settings come from (max_batch_tokens, max_seqs, prefill_chunk);
    default EngineConfig(). `Engine.load` passes the same config to the runner and the engine.
    """

    def __init__(self, runner: ModelRunner, tokenizer: Tokenizer | None = None, cfg: EngineConfig | None = None):
        c = runner.config
        if tokenizer is None and c.tokenizer == "byte":
            tokenizer = ByteTokenizer(eos_ids=c.eos_token_ids, bos_id=c.bos_token_id)
        if cfg is not None and not isinstance(cfg, EngineConfig):
            raise ValueError(f"Engine cfg must be an EngineConfig, got {type(cfg).__name__}")
        self.runner, self.tokenizer = runner, tokenizer
        self.cfg = EngineConfig() if cfg is None else cfg
        self.blocks = BlockManager(runner.pool)
        self.results: list[Result] = []  # of the last stream(), filled as requests finish
        self._running: list[_Seq] = []
        self._streaming = False  # one stream at a time: the admission reserves blocks per stream
        self.stats = {"steps": 0, "prefill_tokens": 0, "decode_tokens": 0, "cached_tokens": 0,
                      "forward_s": 0.0, "sample_s": 0.0}

    @classmethod
    def load(cls, directory, cfg: EngineConfig | None = None) -> Engine:
        """A runner for `directory` and the tokenizer its config.json names; cfg serves both."""
        cfg = EngineConfig() if cfg is None else cfg
        runner = ModelRunner.load(directory, cfg)
        return cls(runner, load_tokenizer(Path(directory), runner.config), cfg)

    @property
    def pool(self):
        return self.runner.pool

    def encode(self, text: str) -> list[int]:
        """The ids of prompt `text`, or a RequestError when they cannot fit the context: refused before it
        is encoded when its bytes alone prove it (`Tokenizer.fewest_tokens`; 10 MB of text took seconds and
        gigabytes to encode, only to be refused by `check`). For any text, `self.tokenizer.encode(text)`."""
        if self.tokenizer is None:
            raise RequestError("this engine has no tokenizer (Engine(runner, tokenizer)): give prompt ids")
        return self.tokenizer.encode_within(text, self.runner.config.max_position_embeddings, RequestError)

    def tables(self) -> dict[str, list[int]]:
        """The running requests' block tables ("req i" -> pool block ids), e.g. for the block map
        (tl_lab.lab.widgets.blockmap.show(engine.pool, engine.tables(), lengths=engine.lengths()))."""
        return {f"req {s.index}": list(s.blocks.table) for s in self._running}

    def lengths(self) -> dict[str, int]:
        """The running requests' positions held in the pool ("req i" -> count)."""
        return {f"req {s.index}": s.computed for s in self._running}

    # ------------------------------------------------------------ the loop

    def generate(self, requests: list[Request], on_token: Callable[[TokenEvent], None] | None = None,
                 on_step: Callable[[StepRecord], None] | None = None) -> list[Result]:
        """Run `requests` to the end; on_token(event) for each token as it comes, on_step(record)
        after each step. -> their Results."""
        _check_callback(on_token, "on_token")  # not after a step has run and a token been sampled
        for ev in self.stream(requests, on_step):
            if on_token is not None:
                on_token(ev)
        return self.results

    def stream(self, requests: list[Request], on_step: Callable[[StepRecord], None] | None = None
               ) -> Iterator[TokenEvent]:
        """Generate for every request, several in one batch per step; yield each token as it comes.
        One stream at a time per engine (RuntimeError otherwise): its pool reservations assume it.
        Every request is checked first (`check`): a refusal raises before anything runs."""
        self._idle()
        if isinstance(requests, Request) or not hasattr(requests, "__iter__"):  # list() would say "not iterable"
            hint = ": wrap one in a list, [request]" if isinstance(requests, Request) else ""
            raise RequestError(f"stream takes a list of Requests, got {type(requests).__name__}{hint}")
        requests = list(requests)
        self.check(requests)
        _check_callback(on_step, "on_step")
        return self._loop(requests, on_step)

    def _idle(self) -> None:
        if self._streaming:
            raise RuntimeError("this Engine is already streaming; finish or close that stream first")

    def check(self, requests: list[Request]) -> None:
        """Refuse, before anything runs, a request that is not a Request (RequestError), holds an id
        outside the vocabulary or a prompt longer than the context (RequestError), or can never fit
        the pool (KvError). Each message names the request's index; nothing changes."""
        c, B = self.runner.config, self.runner.block_tokens
        for i, r in enumerate(requests):
            if not isinstance(r, Request):
                raise RequestError(f"request {i} is a {type(r).__name__}, not a Request")
            bad = [t for t in r.prompt_ids if not 0 <= t < c.vocab_size]
            if bad:
                raise RequestError(f"request {i}: token id {bad[0]} is outside the vocabulary [0, {c.vocab_size})")
            if len(r.prompt_ids) > c.max_position_embeddings:
                raise RequestError(f"request {i}: a {len(r.prompt_ids)}-token prompt is longer than the "
                                   f"context (max_position_embeddings {c.max_position_embeddings})")
            worst = _Seq(i, r, []).worst_blocks(B, c.max_position_embeddings)
            if worst > self.pool.available():
                raise KvError(self._never_fits(i, r, worst))

    def _never_fits(self, i: int, r: Request, worst: int) -> str:
        return (f"request {i} needs up to {worst} KV blocks ({len(r.prompt_ids)} prompt tokens "
                f"+ max_tokens {r.max_tokens}, B = {self.runner.block_tokens}) but the pool has only "
                f"{self.pool.available()} available of {self.pool.n_blocks}; raise KvConfig.n_blocks or "
                "lower max_tokens (this engine does not preempt)")

    def _loop(self, requests: list[Request], on_step) -> Iterator[TokenEvent]:
        self._idle()  # again: another stream may have started between stream() and this first next()
        c = self.runner.config
        self.results = [Result(i, list(r.prompt_ids)) for i, r in enumerate(requests)]
        waiting = [_Seq(i, r, c.eos_token_ids if r.stop_ids is None else r.stop_ids)
                   for i, r in enumerate(requests)]
        waiting.reverse()  # pop() takes the first request
        running: list[_Seq] = []
        self._running, self._streaming = running, True
        try:
            index = 0  # this stream's steps
            while waiting or running:
                rec = None if on_step is None else StepRecord(index)
                self._admit(waiting, running, rec)
                yield from self._step(running, rec)  # a list
                for s in [s for s in running if s.result.finish]:
                    self._finish(s, running, rec)
                if rec is not None:
                    rec.waiting, rec.pool = len(waiting), self.pool.stats()
                    on_step(rec)
                index += 1
        finally:  # the last request, an error, or the consumer closing the generator early
            for s in running:
                self.blocks.release(s.blocks)
            running.clear()
            self._streaming = False

    def _admit(self, waiting: list[_Seq], running: list[_Seq], rec: StepRecord | None) -> None:
        """Admit waiting requests in order while they fit (module docstring: pool exhaustion)."""
        pool, B, max_pos = self.pool, self.runner.block_tokens, self.runner.config.max_position_embeddings
        while waiting and len(running) < self.cfg.max_seqs:
            s = waiting[-1]
            outstanding = sum(r.worst_blocks(B, max_pos) - len(r.blocks.table) for r in running)
            worst = s.worst_blocks(B, max_pos)
            if worst > pool.available() - outstanding:  # counted as if nothing were cached
                if running:
                    return  # wait for a running request to finish and give its blocks back
                raise KvError(self._never_fits(s.index, s.req, worst))  # the pool shrank under us
            waiting.pop()
            s.blocks = self.blocks.admit(s.tokens, cacheable(len(s.tokens), B))
            s.result.cached_blocks, s.result.cached_tokens = s.blocks.hits, s.computed
            self.stats["cached_tokens"] += s.computed
            running.append(s)
            if rec is not None:
                rec.admitted.append((s.index, s.blocks.hits))

    def _rows(self, running: list[_Seq]) -> list[tuple[_Seq, list[int]]]:
        """The step's batch: a decode row for each sequence past its prompt, then prompt chunks
        while max_batch_tokens has room (a chunk that does not fit waits, it is never cut)."""
        cfg = self.cfg
        chunk = min(cfg.prefill_chunk, cfg.max_batch_tokens)
        decode = [s for s in running if s.computed >= len(s.req.prompt_ids)]
        prefill = [s for s in running if s.computed < len(s.req.prompt_ids)]
        rows, budget = [], max(cfg.max_batch_tokens, len(decode))
        for s in decode + prefill:
            n = 1 if s in decode else min(chunk, len(s.tokens) - s.computed)
            if rows and n > budget:
                continue  # this chunk waits for a later step; it is never cut to fit
            rows.append((s, s.tokens[s.computed:s.computed + n]))
            budget -= n
        return rows

    def _step(self, running: list[_Seq], rec: StepRecord | None) -> list[TokenEvent]:
        """One ForwardBatch over the running sequences, then sampling; -> the new tokens."""
        rows = self._rows(running)
        self._reserve(rows, rec)
        t0 = time.perf_counter()
        logits = self.runner.forward(ForwardBatch([ForwardSeq(t, s.computed, s.blocks.table) for s, t in rows]))
        t1 = time.perf_counter()
        self.stats["forward_s"] += t1 - t0
        self.stats["steps"] += 1
        events = []
        for i, (s, toks) in enumerate(rows):
            start = s.computed
            prompt_part = max(0, min(len(toks), len(s.req.prompt_ids) - start))
            self.stats["prefill_tokens"] += prompt_part
            self.stats["decode_tokens"] += len(toks) - prompt_part
            s.result.prefilled_tokens += prompt_part
            self.blocks.written(s.blocks, s.tokens, start + len(toks))
            ev = None
            if s.computed == len(s.tokens):  # its last token's logits: sample the next one
                ev = self._sample(s, logits.row(i))
                events.append(ev)
            if rec is not None:
                rec.rows.append(StepRow(s.index, start, len(toks), prompt_part, ev.token if ev else None))
                rec.tables[s.index] = list(s.blocks.table)
        self.stats["sample_s"] += time.perf_counter() - t1
        return events

    def _reserve(self, rows: list[tuple[_Seq, list[int]]], rec: StepRecord | None) -> None:
        """The blocks the step's new positions land in (admission reserved room for them)."""
        cached = set(self.pool.lru()) if rec is not None else None
        for s, toks in rows:
            new = self.blocks.reserve(s.blocks, s.computed + len(toks))
            if rec is not None and new:
                rec.allocated[s.index] = new
                rec.evicted += [b for b in new if b in cached]

    def _sample(self, s: _Seq, row: np.ndarray) -> TokenEvent:
        req, r = s.req, s.result
        fn = _sample_fn()
        tok, lp = fn(row, req.params, s.prompt, r.output_ids, s.rng)
        if not is_int(tok) or not 0 <= int(tok) < len(row):  # was: blamed on the prompt, exit 2 (issue #61)
            where = getattr(getattr(fn, "__code__", None), "co_filename", getattr(fn, "__module__", "?"))
            raise SamplerAnswerError(f"sample() of {where} returned token id {tok!r}, outside the vocabulary "
                                     f"(0 .. {len(row) - 1})")
        tok = int(tok)
        s.tokens.append(tok)
        r.output_ids.append(tok)
        r.logprobs.append(lp)
        if tok in s.stop:
            r.finish = "stop"
        elif len(r.output_ids) >= req.max_tokens or len(s.tokens) > self.runner.config.max_position_embeddings:
            r.finish = "length"  # (the second: the new token could not be fed to the model)
        text = ""
        if r.finish != "stop":
            s.unprinted.append(tok)
        if self.tokenizer is not None:
            text = self.tokenizer.decode_after(s.shown, s.unprinted)
            if text.endswith("\ufffd") and r.finish is None:
                text = ""  # most likely half of a UTF-8 character: wait for the rest
            else:
                s.shown, s.unprinted = (s.shown + s.unprinted)[-SHOWN_IDS:], []
        r.text += text
        piece = self.tokenizer.token_str(tok) if self.tokenizer is not None else ""
        return TokenEvent(s.index, tok, text, lp, piece, len(s.tokens) - 1, r.finish)

    def _finish(self, s: _Seq, running: list[_Seq], rec: StepRecord | None) -> None:
        """A finished request leaves; its blocks go back tail first, so the LRU evicts a prompt's
        tail before its head."""
        running.remove(s)
        released = self.blocks.release(s.blocks)
        self.results[s.index] = s.result
        if rec is not None:
            rec.released[s.index] = released
            rec.finished.append((s.index, s.result.finish))
