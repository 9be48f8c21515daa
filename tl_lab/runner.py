"""ModelRunner: load a model directory, own the KV pool, run one ForwardBatch per step.

Chapter L10.1, section 2.1 (the three layers) and section 4 (runner.rs), in Python.

    runner = ModelRunner.load("data/tiny-llama", EngineConfig(kv=KvConfig(n_blocks=64)))
    blocks = runner.pool.alloc(1)
    logits = runner.forward(ForwardBatch([ForwardSeq(b"Hello", 0, blocks)]))

The caller owns the blocks (the engine loop takes them through its block manager, tl_lab.engine.blocks);
`forward` writes each new token's K and V into the blocks its table names and reads them back.
A batch the runner cannot run is refused with BatchError before anything is written.

Decisions where the chapter is silent:
- Two sequences of one batch may list the same block only where both merely read it (a shared
  prefix from the prefix cache). A block that a sequence writes in this step (the blocks holding
  positions start .. start+n-1) must not appear in another sequence's used part of the table,
  nor twice in its own: two writers, or a reader racing a writer, is refused.
- A block table may be longer than the step needs; every id in it must be in use.
- After the write, `forward` raises each written block's fill to cover the slots written (a
  registered block is full already and keeps its fill).
- The bigram has no KV: its forward checks the tokens and positions as for a Llama, and accepts and
  ignores block tables (they may be empty). Its pool is a token one so an engine loop can allocate
  blocks the same way for both architectures.
- EngineConfig is the chapter's one config for the whole engine, checked when it is built. The
  runner reads kv, prefix_cache, quant, threads and product; max_batch_tokens, max_seqs and
  prefill_chunk are the scheduler's, read by tl_lab.engine.generate.Engine from the config it is given
  (never through the runner): forward runs whatever batch it is given.
- KvConfig (the user's choice: how many blocks of how many positions) and KvCfg (tl_lab.kv: the
  pool's whole shape) are the chapter's two names: KvConfig.pool_cfg completes the first into the
  second with the model's KV shape. KvCfg knows nothing of KvConfig.
- Each kind of weights brings its KV shape and its forward (`ARCHS`, looked up once at load; the
  bigram's pool has one layer, one head, D = 1).
- The blocks a sequence holds are `tl_lab.engine.blocks`' business: the runner only raises the fill of
  the blocks it wrote, and run_once / last_logits borrow temporary blocks from it after checking
  the tokens, so a refused call moves no block.
- EngineConfig.threads is handed to the given `set_threads` and `set_blas_threads` (tl_lab.ops) when
  the runner is built; the bits do not depend on it.
- A long prefill may run as two pipelined stages (`tl_lab.ops.pipeline`, engineering around this
  module: `_run_llama` stays the one call of the forward, and the stages run your `llama_forward`).
  The bits are the one step's.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from tl_lab.ops.checks import as_int, first_bool, is_int
from tl_lab.errors import BatchError
from tl_lab.forward import Step, bigram_forward, llama_forward
from tl_lab.ops.products import PRODUCTS, Scratch
from tl_lab.ops import pipeline
from tl_lab.ops.paging import blocks_for, fill_table, temporary_tables
from tl_lab.ops.kernels import set_threads, threads_for
from tl_lab.kv import BlockState, KvCfg, KvPool
from tl_lab.model import Int4, ModelConfig, load_weights
from tl_lab.ops.tuning import blas_threads, keep_freed_memory, set_blas_threads  # noqa: F401 (re-exported)

__all__ = ["Int4", "KvConfig", "EngineConfig", "ForwardSeq", "ForwardBatch", "Logits", "ModelRunner",
           "set_blas_threads", "blas_threads", "keep_freed_memory"]


MAX_THREADS = 1024  # the most EngineConfig.threads accepts: more is a typo


@dataclass(frozen=True)
class KvConfig:
    """The runner's KV pool size, as the user picks it: n_blocks blocks of block_tokens positions
    (B) each. `pool_cfg` completes it into the pool's KvCfg with the model's KV shape."""

    n_blocks: int = 256
    block_tokens: int = 16

    def __post_init__(self):
        # here, not when the pool is built: that is after the weights are loaded (seconds for SmolLM2)
        for name in ("n_blocks", "block_tokens"):
            as_int(getattr(self, name), f"KvConfig.{name}", lo=1)

    def pool_cfg(self, n_layers: int, n_kv_heads: int, head_dim: int) -> KvCfg:
        """The KvCfg of a pool of this size for a model with this KV shape (checked by KvPool)."""
        return KvCfg(self.n_blocks, self.block_tokens, n_layers, n_kv_heads, head_dim)


@dataclass(frozen=True)
class EngineConfig:
    """How to load and run a model (chapter section 4, EngineConfig).

    kv: the pool; prefix_cache: the pool keeps released registered blocks; quant: None (as
    stored) or Int4(group) to quantize a float checkpoint's layer linears at load; threads: the
    count given to `set_threads` and `set_blas_threads` (None: leave them as they are);
    product: "invariant" (the engine) or "plain" (``x @ W.T``, to measure what invariance costs).
    max_batch_tokens, max_seqs, prefill_chunk: the scheduler's (tl_lab.engine.generate.Engine reads them;
    the runner never does). A bad value is a ValueError here, naming the field, not a failure at the
    first step.
    """

    kv: KvConfig = field(default_factory=KvConfig)
    prefix_cache: bool = True
    quant: Int4 | None = None
    threads: int | None = None
    max_batch_tokens: int = 2048
    max_seqs: int = 16
    prefill_chunk: int = 512
    product: str = "invariant"

    def __post_init__(self):
        if not isinstance(self.kv, KvConfig):
            raise ValueError(f"EngineConfig.kv must be a KvConfig, got {type(self.kv).__name__}")
        if not isinstance(self.prefix_cache, (bool, np.bool_)):  # bool("no") is True: the cache stayed on
            raise ValueError(f"EngineConfig.prefix_cache must be True or False, got {self.prefix_cache!r}")
        if self.quant is not None and not isinstance(self.quant, Int4):
            raise ValueError(f"EngineConfig.quant must be None or Int4(group), got {self.quant!r}")
        if self.threads is not None:
            as_int(self.threads, "EngineConfig.threads", lo=1, hi=MAX_THREADS)
        for name in ("max_batch_tokens", "max_seqs", "prefill_chunk"):
            as_int(getattr(self, name), f"EngineConfig.{name}", lo=1)
        if self.product not in PRODUCTS:
            raise ValueError(f"EngineConfig.product must be one of {PRODUCTS}, got {self.product!r}")


@dataclass
class ForwardSeq:
    """One sequence of a step: its new tokens, the absolute position of the first, its block table."""

    tokens: object
    start: int
    blocks: object = ()


@dataclass
class ForwardBatch:
    seqs: list


@dataclass
class Logits:
    """One row of logits per sequence, for its last new token. data: (rows, vocab) float32."""

    vocab: int
    data: np.ndarray

    def rows(self) -> int:
        return self.data.shape[0]

    def row(self, i: int) -> np.ndarray:
        return self.data[i]

    def __len__(self) -> int:
        return self.rows()


@dataclass(frozen=True)
class Arch:
    """What one kind of weights brings to the runner (chapter section 2.1).

    kv_shape(config) -> (n_layers, n_kv_heads, head_dim) of its pool; has_kv: the forward writes and
    reads the pool (block tables are checked); run(runner, step, hidden) -> logits (S, V) float32, or
    (logits, hidden (N, d) float32) when hidden is True.
    """

    kv_shape: Callable[[ModelConfig], tuple[int, int, int]]
    has_kv: bool
    run: Callable


def _run_llama(runner: ModelRunner, step: Step, hidden: bool = False):
    """The one call of the Llama forward (section 2.4): the step's K and V go into the pool. The step runs
    inside the given `threads_for` (tl_lab.ops.kernels), which sets how its products run; the bits
    do not depend on it."""
    with threads_for(len(step.tokens), runner):
        return llama_forward(runner.weights, step, runner.pool.data, product=runner.product,
                             scratch=runner._scratch, return_hidden=hidden)


def _run_llama_step(runner: ModelRunner, step: Step, hidden: bool = False):
    """A Llama step (section 2.4): a long prefill as two pipelined stages (`tl_lab.ops.pipeline`, the
    engine's, not a piece of yours), any other step in the one call of `_run_llama`. Same bits
    either way."""
    return pipeline.run_step(runner, step, hidden, _run_llama, llama_forward)


def _run_bigram(runner: ModelRunner, step: Step, hidden: bool = False):
    """The byte bigram of L10.0: no KV, no hidden state (hidden is (N, 0))."""
    logits = bigram_forward(runner.weights.logits, step.tokens[step.last])
    return (logits, np.zeros((len(step.tokens), 0), dtype=np.float32)) if hidden else logits


ARCHS = {
    "llama": Arch(lambda c: (c.num_hidden_layers, c.num_key_value_heads, c.head_dim), True, _run_llama_step),
    "bigram": Arch(lambda c: (1, 1, 1), False, _run_bigram),
}


class ModelRunner:
    """Weights, the KV pool and the forward of one model (chapter section 2.1).

    cfg: the EngineConfig it was built with; arch: what its kind of weights brings (`ARCHS`);
    pool: the KvPool (the engine's block manager, tl_lab.engine.blocks, hands its blocks out).
    """

    def __init__(self, weights, cfg: EngineConfig):
        if not isinstance(cfg, EngineConfig):
            raise ValueError(f"ModelRunner needs an EngineConfig, got {type(cfg).__name__}")
        if cfg.threads is not None:
            set_blas_threads(cfg.threads)
            set_threads(cfg.threads)
        keep_freed_memory()
        self.weights = weights
        self.cfg = cfg
        self.product = cfg.product
        self.arch = ARCHS[weights.config.arch]
        kv = cfg.kv.pool_cfg(*self.arch.kv_shape(weights.config))
        self.pool = KvPool(kv, prefix_cache=cfg.prefix_cache)
        self._scratch = Scratch()

    @classmethod
    def load(cls, directory: str | os.PathLike, cfg: EngineConfig | None = None) -> ModelRunner:
        """Load `directory` (config.json + model.safetensors): f32, an int4 file, or f32 quantized
        at load when cfg.quant = Int4(group). The file's tensors are widened by the given widen_all
        (tl_lab.ops.widening, which the reader's SafeTensors.f32_into runs)."""
        cfg = EngineConfig() if cfg is None else cfg
        if not isinstance(cfg, EngineConfig):  # here, not after the weights: cfg.quant is read first
            raise ValueError(f"ModelRunner needs an EngineConfig, got {type(cfg).__name__}")
        return cls(load_weights(Path(directory), quant=cfg.quant), cfg)

    @property
    def config(self) -> ModelConfig:
        return self.weights.config

    @property
    def block_tokens(self) -> int:
        return self.pool.block_tokens

    @property
    def quant(self) -> Int4 | None:
        return getattr(self.weights, "quant", None)

    # ------------------------------------------------------------ checks

    def _check(self, batch, tables: bool = True) -> Step:
        """Refuse a batch the forward cannot run (BatchError naming the sequence and the value).
        tables=False checks everything but the block tables (before temporary blocks are taken)."""
        if not isinstance(batch, ForwardBatch):  # a bare list or ForwardSeq has no .seqs: not "empty"
            raise BatchError(f"forward needs a ForwardBatch, got {type(batch).__name__}")
        seqs = batch.seqs
        if not isinstance(seqs, (list, tuple)):
            raise BatchError(f"ForwardBatch.seqs must be a list of ForwardSeq, got {type(seqs).__name__}")
        if not seqs:
            raise BatchError("empty batch: a ForwardBatch needs at least one sequence")
        triples, writes, reads = [], {}, {}
        for i, seq in enumerate(seqs):
            if not isinstance(seq, ForwardSeq):
                raise BatchError(f"seq {i} is a {type(seq).__name__}, not a ForwardSeq")
            toks, start, end = self._check_tokens(i, seq)
            if isinstance(seq.blocks, (str, bytes)) or not hasattr(seq.blocks, "__iter__"):
                raise BatchError(f"seq {i}: blocks must be a sequence of block ids, got {type(seq.blocks).__name__}")
            table = list(seq.blocks)
            if tables and self.arch.has_kv:
                self._check_table(i, table, start, end, writes, reads)
            triples.append((toks, start, table))
        for blk, writers in writes.items():
            others = (writers | reads.get(blk, set())) - {min(writers)}
            if others:
                raise BatchError(f"block {blk} is written by seq {min(writers)} and also used by "
                                 f"seq {min(others)} in this batch (one writer, no readers, per step)")
        return Step.of(triples)

    def _check_tokens(self, i: int, seq) -> tuple[np.ndarray, int, int]:
        """seq i's tokens as a 1-D int array, its start, and its end position + 1; or BatchError."""
        c, raw = self.config, seq.tokens
        if isinstance(raw, str):
            raise BatchError(f"seq {i}: tokens must be token ids, got the text {raw[:20]!r} "
                             "(encode it with the tokenizer first)")
        try:
            toks = np.asarray(list(raw) if isinstance(raw, (bytes, bytearray)) else raw)
        except (ValueError, TypeError) as exc:  # ragged lists, objects numpy cannot make an array of
            raise BatchError(f"seq {i}: tokens must be a 1-D sequence of ids ({exc})") from None
        if toks.ndim != 1:
            raise BatchError(f"seq {i}: tokens must be a 1-D sequence of ids, got shape {toks.shape}")
        if toks.size == 0:
            raise BatchError(f"seq {i}: no tokens (a sequence brings at least one new token)")
        if toks.dtype.kind not in "iu":
            raise BatchError(f"seq {i}: token ids must be integers, got dtype {toks.dtype}")
        j = first_bool(raw)  # [True, 5] is an int array: look at the list itself
        if j is not None:
            raise BatchError(f"seq {i}: token {raw[j]!r} at index {j} is a bool, not a token id")
        bad = np.flatnonzero((toks < 0) | (toks >= c.vocab_size))  # every id inside the vocabulary
        if bad.size:
            raise BatchError(f"seq {i}: token {int(toks[bad[0]])} at index {int(bad[0])} "
                             f"is outside the vocabulary [0, {c.vocab_size})")
        start = as_int(seq.start, f"seq {i}: start", lo=0, error=BatchError)
        end = start + toks.size  # positions start .. end - 1
        if end > c.max_position_embeddings:
            raise BatchError(f"seq {i}: position {end - 1} is past the context "
                             f"(max_position_embeddings {c.max_position_embeddings})")
        return toks, start, end

    def _check_table(self, i, table, start, end, writes, reads) -> None:
        B = self.block_tokens
        need = blocks_for(end, B)
        if len(table) < need:
            raise BatchError(f"seq {i}: block table has {len(table)} blocks, positions up to "
                             f"{end - 1} need {need} (B = {B})")
        for j, blk in enumerate(table):
            if not is_int(blk) or not 0 <= blk < self.pool.n_blocks:
                raise BatchError(f"seq {i}: block table entry {j} = {blk!r} is not a block id "
                                 f"(n_blocks {self.pool.n_blocks})")
            if self.pool.state(int(blk)) != BlockState.IN_USE:
                raise BatchError(f"seq {i}: block {int(blk)} (table entry {j}) is "
                                 f"{self.pool.state(int(blk)).value}, not in use")
            held = min(B, start - j * B)  # positions before start this block must hold already
            if held > 0 and self.pool.fill(int(blk)) < held:  # else: attention reads whatever is there
                raise BatchError(f"seq {i}: start {start} is past what its blocks hold: block {int(blk)} "
                                 f"(table entry {j}) holds {self.pool.fill(int(blk))} of the {held} "
                                 "positions before it (a released block is empty again)")
        used = [int(b) for b in table[:need]]
        if len(set(used)) != len(used):
            dup = next(b for b in used if used.count(b) > 1)
            raise BatchError(f"seq {i}: block {dup} appears twice in the used part of its table")
        for j, blk in enumerate(used):
            if j >= start // B:  # holds a position this step writes
                writes.setdefault(blk, set()).add(i)
            else:
                reads.setdefault(blk, set()).add(i)

    # ------------------------------------------------------------ forward

    def forward(self, batch: ForwardBatch) -> Logits:
        """Logits (one row per sequence, its last new token). Writes K and V of the new tokens and
        raises the fill of the blocks written."""
        step = self._check(batch)
        logits = self.arch.run(self, step)
        if self.arch.has_kv:
            for s in range(step.n_seqs):
                end = int(step.starts[s]) + (step.rows(s).stop - step.rows(s).start)
                fill_table(self.pool, step.tables[s], int(step.starts[s]), end)
        return Logits(self.config.vocab_size, logits)

    def _run_temporary(self, prompts, hidden: bool):
        """Each prompt from position 0 in ONE step on temporary blocks, all given back (even on an
        error). The batch is checked before any block moves, so a refusal changes nothing."""
        seqs = [ForwardSeq(p, 0) for p in prompts]
        step = self._check(ForwardBatch(seqs), tables=False)
        lengths = np.diff(step.offsets).tolist() if self.arch.has_kv else []
        with temporary_tables(self.pool, lengths) as tables:
            for seq, table in zip(seqs, tables):
                seq.blocks = table
            return self.arch.run(self, self._check(ForwardBatch(seqs)), hidden)

    def last_logits(self, prompts) -> np.ndarray:
        """Every prompt's last-token logits from ONE step on temporary blocks, all given back.

        prompts: S token lists -> (S, V) float32. One pass over the weights for all of them, and by
        batch invariance each row is bit for bit that prompt run alone.
        """
        if isinstance(prompts, (str, bytes)) or not hasattr(prompts, "__iter__"):
            raise BatchError(f"last_logits takes a list of prompts (token lists), got {type(prompts).__name__}")
        prompts = list(prompts)
        if any(is_int(p) for p in prompts):  # else "seq 0: ... got shape ()", one per id
            raise BatchError("last_logits takes a list of prompts, got a list of token ids: one prompt is [ids]")
        return self._run_temporary(prompts, hidden=False)

    def run_once(self, tokens) -> tuple[np.ndarray, np.ndarray]:
        """One forward of `tokens` from position 0 on temporary blocks, all given back (even on error).

        -> (hidden (T, d) float32: the final-normed hidden state of every token, logits (V,) float32
        of the last token). The bigram has no hidden state: hidden is (T, 0).
        """
        logits, hidden = self._run_temporary([tokens], hidden=True)
        return hidden, logits[0]
