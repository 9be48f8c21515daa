"""A small engine loop over ModelRunner: requests in, tokens streamed out (interface page, "Beyond the
chapter"; what chapter L10.1 hands to L10.2's scheduler, L10.4's block manager and L10.5's loop).

    engine = Engine.load("data/tiny-llama")
    for ev in engine.stream([Request(engine.encode("Hello"), SamplingParams(temperature=0), 0, 8)]):
        print(ev.text, end="", flush=True)

One step of `Engine.stream`:

1. admit waiting requests (first come, first served) while fewer than EngineConfig.max_seqs run
   and the pool can hold them (below); an admitted request first looks up its prompt's full blocks
   by chained `prefix_hash` (`pool.lookup`): those positions are not prefilled again;
2. build ONE ForwardBatch: a decode row (the last sampled token) for every sequence past its
   prompt, then the next prompt chunk of every sequence still prefilling, while the step has room
   (max_batch_tokens); allocate the blocks those positions need (`pool.alloc`);
3. `runner.forward`; every block that became full gets `set_fill` and `register` under its hash;
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
  to finish; one that cannot fit even in an idle pool raises KvError at admission. Whatever ends
  the stream (the last request, an error, the consumer stopping early), every block is released.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator

import numpy as np

from tl_lab.errors import KvError
from tl_lab.kv import prefix_hash, prefix_hashes
from tl_lab.runner import EngineConfig, ForwardBatch, ForwardSeq, ModelRunner
from tl_lab.sample import PURPOSE_SAMPLE, SamplingParams, sample, stream
from tl_lab.tokenizer import ByteTokenizer, Tokenizer, load_tokenizer

__all__ = ["Request", "TokenEvent", "Result", "Engine"]


@dataclass
class Request:
    """What to generate: prompt token ids, how to sample, the seed of its own generator, at most
    max_tokens new tokens; stop_ids None means the model's eos_token_ids."""

    prompt_ids: list[int]
    params: SamplingParams = field(default_factory=SamplingParams)
    seed: int = 0
    max_tokens: int = 16
    stop_ids: Iterable[int] | None = None

    def __post_init__(self):
        self.prompt_ids = [int(t) for t in self.prompt_ids]
        if not self.prompt_ids:
            raise ValueError("Request.prompt_ids is empty: a prompt needs at least one token")
        if not isinstance(self.params, SamplingParams):
            raise TypeError(f"Request.params must be a SamplingParams, got {type(self.params).__name__}")
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, (int, np.integer)) \
                or self.max_tokens < 1:
            raise ValueError(f"Request.max_tokens must be a positive integer, got {self.max_tokens!r}")
        if not isinstance(self.seed, (int, np.integer)) or isinstance(self.seed, bool) \
                or not 0 <= self.seed < 2**64:
            raise ValueError(f"Request.seed must be an integer in [0, 2**64), got {self.seed!r}")
        if self.stop_ids is not None:
            self.stop_ids = [int(t) for t in self.stop_ids]


@dataclass(frozen=True)
class TokenEvent:
    """One generated token of request `request` (its index in the list given to `stream`).

    text: what to print now: the new part of the decoded output (empty while a UTF-8 character is
    still incomplete, and for the stop token); piece: the token on its own, for display.
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


class _Seq:
    """A running request: its tokens, block table and how many positions are in the pool."""

    def __init__(self, index: int, req: Request, stop_ids: list[int]):
        self.index, self.req, self.stop = index, req, set(stop_ids)
        self.tokens = list(req.prompt_ids)  # prompt + output
        self.rng = stream(req.seed, PURPOSE_SAMPLE)
        self.table: list[int] = []
        self.hashes: list[int] = []  # chained hashes of the full blocks so far
        self.computed = 0  # positions 0 .. computed-1 hold K and V
        self.unprinted: list[int] = []  # ids whose text is not out yet (an incomplete character)
        self.result = Result(index, list(req.prompt_ids))

    def worst_blocks(self, B: int, max_pos: int) -> int:
        """Blocks this sequence can ever need: every prompt position and each new token but the last."""
        return -(-min(len(self.req.prompt_ids) + self.req.max_tokens - 1, max_pos) // B)


class Engine:
    """The engine loop over one ModelRunner (and its pool). See the module docstring."""

    def __init__(self, runner: ModelRunner, tokenizer: Tokenizer | None = None):
        c = runner.config
        if tokenizer is None and c.tokenizer == "byte":
            tokenizer = ByteTokenizer(eos_ids=c.eos_token_ids, bos_id=c.bos_token_id)
        self.runner, self.tokenizer = runner, tokenizer
        self.results: list[Result] = []  # of the last stream(), filled as requests finish
        self._running: list[_Seq] = []
        self._streaming = False  # one stream at a time: the admission reserves blocks per stream
        self.stats = {"steps": 0, "prefill_tokens": 0, "decode_tokens": 0, "cached_tokens": 0,
                      "forward_s": 0.0, "sample_s": 0.0}

    @classmethod
    def load(cls, directory, cfg: EngineConfig | None = None) -> Engine:
        """A runner for `directory` and the tokenizer its config.json names."""
        runner = ModelRunner.load(directory, cfg)
        return cls(runner, load_tokenizer(Path(directory), runner.config))

    @property
    def pool(self):
        return self.runner.pool

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text)

    def tables(self) -> dict[str, list[int]]:
        """The running requests' block tables ("req i" -> pool block ids), e.g. for the block map
        (tl_lab.widgets.blockmap.show(engine.pool, engine.tables(), lengths=engine.lengths()))."""
        return {f"req {s.index}": list(s.table) for s in self._running}

    def lengths(self) -> dict[str, int]:
        """The running requests' positions held in the pool ("req i" -> count)."""
        return {f"req {s.index}": s.computed for s in self._running}

    # ------------------------------------------------------------ the loop

    def generate(self, requests: list[Request], on_token: Callable[[TokenEvent], None] | None = None
                 ) -> list[Result]:
        """Run `requests` to the end; on_token(event) for each token as it comes. -> their Results."""
        for ev in self.stream(requests):
            if on_token is not None:
                on_token(ev)
        return self.results

    def stream(self, requests: list[Request]) -> Iterator[TokenEvent]:
        """Generate for every request, several in one batch per step; yield each token as it comes.
        One stream at a time per engine (RuntimeError otherwise): its pool reservations assume it."""
        if self._streaming:
            raise RuntimeError("this Engine is already streaming; finish or close that stream first")
        requests = list(requests)
        c, eng = self.runner.config, self.runner.engine
        for i, r in enumerate(requests):
            if not isinstance(r, Request):
                raise TypeError(f"request {i} is a {type(r).__name__}, not a Request")
            bad = [t for t in r.prompt_ids if not 0 <= t < c.vocab_size]
            if bad:
                raise ValueError(f"request {i}: token id {bad[0]} is outside the vocabulary [0, {c.vocab_size})")
            if len(r.prompt_ids) > c.max_position_embeddings:
                raise ValueError(f"request {i}: a {len(r.prompt_ids)}-token prompt is longer than the "
                                 f"context (max_position_embeddings {c.max_position_embeddings})")
        self.results = [Result(i, list(r.prompt_ids)) for i, r in enumerate(requests)]
        waiting = [_Seq(i, r, c.eos_token_ids if r.stop_ids is None else r.stop_ids)
                   for i, r in enumerate(requests)]
        waiting.reverse()  # pop() takes the first request
        running: list[_Seq] = []
        self._running, self._streaming = running, True
        try:
            while waiting or running:
                self._admit(waiting, running, max(1, eng.max_seqs))
                yield from self._step(running, min(eng.prefill_chunk, eng.max_batch_tokens))  # a list
                for s in [s for s in running if s.result.finish]:
                    self._finish(s, running)
        finally:  # the last request, an error, or the consumer closing the generator early
            for s in running:
                self._release(s)
            running.clear()
            self._streaming = False

    def _admit(self, waiting: list[_Seq], running: list[_Seq], max_seqs: int) -> None:
        """Admit waiting requests in order while they fit (module docstring: pool exhaustion)."""
        pool, B, max_pos = self.pool, self.runner.block_tokens, self.runner.config.max_position_embeddings
        while waiting and len(running) < max_seqs:
            s = waiting[-1]
            outstanding = sum(r.worst_blocks(B, max_pos) - len(r.table) for r in running)
            worst = s.worst_blocks(B, max_pos)
            if worst > pool.available() - outstanding:  # counted as if nothing were cached
                if running:
                    return  # wait for a running request to finish and give its blocks back
                raise KvError(
                    f"request {s.index} needs up to {worst} KV blocks ({len(s.req.prompt_ids)} prompt tokens "
                    f"+ max_tokens {s.req.max_tokens}, B = {B}) but the pool has only {pool.available()} "
                    f"available of {pool.n_blocks}; raise KvConfig.n_blocks or lower max_tokens "
                    "(this engine does not preempt)")
            waiting.pop()
            # Prefix cache: reuse full prompt blocks, never the one holding the last prompt token.
            P = len(s.tokens)
            for h in prefix_hashes(s.tokens[: (P - 1) // B * B], B):
                b = pool.lookup(h)
                if b is None:
                    break  # a chain: the first miss ends the shared prefix
                s.table.append(b)
                s.hashes.append(h)
            s.computed = len(s.table) * B
            s.result.cached_blocks, s.result.cached_tokens = len(s.table), s.computed
            self.stats["cached_tokens"] += s.computed
            running.append(s)

    def _step(self, running: list[_Seq], chunk: int) -> list[TokenEvent]:
        """One ForwardBatch over the running sequences, then sampling; -> the new tokens."""
        eng, B = self.runner.engine, self.runner.block_tokens
        decode = [s for s in running if s.computed >= len(s.req.prompt_ids)]
        prefill = [s for s in running if s.computed < len(s.req.prompt_ids)]
        rows, budget = [], max(eng.max_batch_tokens, len(decode))
        for s in decode + prefill:
            n = 1 if s in decode else min(chunk, len(s.tokens) - s.computed)
            if rows and n > budget:
                continue  # this chunk waits for a later step; it is never cut to fit
            rows.append((s, s.tokens[s.computed:s.computed + n]))
            budget -= n
        for s, toks in rows:  # the blocks the new positions land in (admission reserved them)
            need = -(-(s.computed + len(toks)) // B) - len(s.table)
            if need > 0:
                s.table.extend(self.pool.alloc(need))
        t0 = time.perf_counter()
        logits = self.runner.forward(ForwardBatch([ForwardSeq(t, s.computed, s.table) for s, t in rows]))
        t1 = time.perf_counter()
        self.stats["forward_s"] += t1 - t0
        self.stats["steps"] += 1
        events = []
        for i, (s, toks) in enumerate(rows):
            prompt_part = max(0, min(len(toks), len(s.req.prompt_ids) - s.computed))
            self.stats["prefill_tokens"] += prompt_part
            self.stats["decode_tokens"] += len(toks) - prompt_part
            s.result.prefilled_tokens += prompt_part
            s.computed += len(toks)
            self._fill_and_register(s)
            if s.computed == len(s.tokens):  # its last token's logits: sample the next one
                events.append(self._sample(s, logits.row(i)))
        self.stats["sample_s"] += time.perf_counter() - t1
        return events

    def _fill_and_register(self, s: _Seq) -> None:
        """Mark the written blocks' fill; register each block that just became full under its hash."""
        pool, B = self.pool, self.runner.block_tokens
        for j in range(len(s.hashes), -(-s.computed // B)):
            n = min(B, s.computed - j * B)
            pool.set_fill(s.table[j], n)  # the runner does it for a Llama; the bigram writes no KV
            if n == B:
                parent = s.hashes[-1] if s.hashes else None
                s.hashes.append(prefix_hash(parent, s.tokens[j * B:(j + 1) * B]))
                pool.register(s.table[j], s.hashes[-1])  # False: another block holds it; ours stays private

    def _sample(self, s: _Seq, row: np.ndarray) -> TokenEvent:
        req, r = s.req, s.result
        tok, lp = sample(row, req.params, req.prompt_ids, r.output_ids, s.rng)
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
            text = self.tokenizer.decode(s.unprinted) if s.unprinted else ""
            if text.endswith("\ufffd") and r.finish is None:
                text = ""  # most likely half of a UTF-8 character: wait for the rest
            else:
                s.unprinted = []
        r.text += text
        piece = self.tokenizer.token_str(tok) if self.tokenizer is not None else ""
        return TokenEvent(s.index, tok, text, lp, piece, len(s.tokens) - 1, r.finish)

    def _finish(self, s: _Seq, running: list[_Seq]) -> None:
        running.remove(s)
        self._release(s)
        self.results[s.index] = s.result

    def _release(self, s: _Seq) -> None:
        """Give the blocks back, tail first: the LRU then evicts a prompt's tail before its head."""
        for b in reversed(s.table):
            self.pool.release(b)
        s.table = []
