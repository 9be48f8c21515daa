"""ModelRunner: load a model directory, own the KV pool, run one ForwardBatch per step.

Chapter L10.1, section 2.1 (the three layers) and section 4 (runner.rs), in Python.

    runner = ModelRunner.load("data/tiny-llama", EngineConfig(kv=KvConfig(n_blocks=64)))
    blocks = runner.pool.alloc(1)
    logits = runner.forward(ForwardBatch([ForwardSeq(b"Hello", 0, blocks)]))

The caller owns the blocks (the engine loop allocates them from `runner.pool` and releases them);
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
  ignores block tables (they may be empty). Its pool is a token one (one layer, one head, D = 1) so
  an engine loop can allocate blocks the same way for both architectures.
- EngineConfig.max_batch_tokens, max_seqs and prefill_chunk are the scheduler's (tl_lab.generate):
  forward runs whatever batch it is given.
- EngineConfig.threads sets the thread count of the compiled kernels (numba's pool) and of BLAS for
  the whole process. The engine's products and attention are compiled loops whose bits do not
  depend on it; BLAS is left to the "plain" product and the numpy references.
"""

from __future__ import annotations

import ctypes
import glob
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tl_lab.errors import BatchError
from tl_lab.forward import PRODUCTS, Scratch, Step, bigram_forward, llama_forward
from tl_lab.kernels import set_threads
from tl_lab.kv import BlockState, KvCfg, KvPool
from tl_lab.model import Int4, ModelConfig, load_weights

__all__ = [
    "Int4",
    "KvConfig",
    "EngineConfig",
    "ForwardSeq",
    "ForwardBatch",
    "Logits",
    "ModelRunner",
    "set_blas_threads",
    "blas_threads",
]


@dataclass(frozen=True)
class KvConfig:
    """The runner's KV pool size: n_blocks blocks of block_tokens positions (B) each."""

    n_blocks: int = 256
    block_tokens: int = 16


@dataclass(frozen=True)
class EngineConfig:
    """How to load and run a model (chapter section 4, EngineConfig).

    kv: the pool; prefix_cache: the pool keeps released registered blocks; quant: None (as
    stored) or Int4(group) to quantize a float checkpoint's layer linears at load; threads: the
    compiled kernels' and BLAS's thread count (None: leave them; numba's default is every core);
    product: "invariant" (the engine) or "plain" (``x @ W.T``, to measure what invariance costs).
    max_batch_tokens, max_seqs, prefill_chunk: the scheduler's.
    """

    kv: KvConfig = field(default_factory=KvConfig)
    prefix_cache: bool = True
    quant: Int4 | None = None
    threads: int | None = None
    max_batch_tokens: int = 2048
    max_seqs: int = 16
    prefill_chunk: int = 512
    product: str = "invariant"


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


def _openblas():
    """numpy's bundled OpenBLAS (ctypes handle) or None."""
    import numpy

    pattern = os.path.join(os.path.dirname(numpy.__file__), "..", "numpy.libs", "*openblas*")
    for path in glob.glob(pattern):
        return ctypes.CDLL(path)
    return None


def _blas_fn(*names):
    lib = _openblas()
    for name in names:
        fn = getattr(lib, name, None) if lib is not None else None
        if fn is not None:
            return fn
    return None


def set_blas_threads(n: int) -> bool:
    """Set OpenBLAS's thread count for this process; False when numpy's OpenBLAS is not found."""
    fn = _blas_fn("scipy_openblas_set_num_threads64_", "openblas_set_num_threads64_", "openblas_set_num_threads")
    if fn is None:
        return False
    fn.argtypes = [ctypes.c_int]
    fn(int(n))
    return True


def blas_threads() -> int | None:
    """OpenBLAS's current thread count, or None when numpy's OpenBLAS is not found."""
    fn = _blas_fn("scipy_openblas_get_num_threads64_", "openblas_get_num_threads64_", "openblas_get_num_threads")
    if fn is None:
        return None
    fn.restype = ctypes.c_int
    return int(fn())


class ModelRunner:
    """Weights, the KV pool and the forward of one model (chapter section 2.1)."""

    def __init__(self, weights, cfg: EngineConfig):
        if cfg.product not in PRODUCTS:
            raise ValueError(f"EngineConfig.product must be one of {PRODUCTS}, got {cfg.product!r}")
        if cfg.threads is not None:
            set_blas_threads(cfg.threads)
            set_threads(cfg.threads)  # the compiled kernels' pool: their bits do not depend on it
        self.weights = weights
        self.engine = cfg
        self.product = cfg.product
        c = weights.config
        if c.arch == "llama":
            shape = dict(n_layers=c.num_hidden_layers, n_kv_heads=c.num_key_value_heads, head_dim=c.head_dim)
        else:
            shape = dict(n_layers=1, n_kv_heads=1, head_dim=1)
        self.pool = KvPool(KvCfg(cfg.kv.n_blocks, cfg.kv.block_tokens, **shape), prefix_cache=cfg.prefix_cache)
        self._scratch = Scratch()

    @classmethod
    def load(cls, directory: str | os.PathLike, cfg: EngineConfig | None = None) -> ModelRunner:
        """Load `directory` (config.json + model.safetensors): f32, an int4 file, or f32 quantized
        at load when cfg.quant = Int4(group)."""
        cfg = EngineConfig() if cfg is None else cfg
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

    def _check(self, batch) -> Step:
        """Refuse a batch the forward cannot run (BatchError naming the sequence and the value)."""
        seqs = getattr(batch, "seqs", None)
        if seqs is None or len(seqs) == 0:
            raise BatchError("empty batch: a ForwardBatch needs at least one sequence")
        c = self.config
        llama = c.arch == "llama"
        triples, writes, reads = [], {}, {}
        for i, seq in enumerate(seqs):
            toks = np.asarray(seq.tokens if not isinstance(seq.tokens, (bytes, bytearray))
                              else list(seq.tokens))
            if toks.ndim != 1 or toks.size == 0:
                raise BatchError(f"seq {i}: no tokens (a sequence brings at least one new token)")
            if toks.dtype.kind not in "iu":
                raise BatchError(f"seq {i}: token ids must be integers, got dtype {toks.dtype}")
            bad = np.flatnonzero((toks < 0) | (toks >= c.vocab_size))
            if bad.size:
                raise BatchError(f"seq {i}: token {int(toks[bad[0]])} at index {int(bad[0])} "
                                 f"is outside the vocabulary [0, {c.vocab_size})")
            start = seq.start
            if isinstance(start, bool) or not isinstance(start, (int, np.integer)) or start < 0:
                raise BatchError(f"seq {i}: start {start!r} must be a non-negative integer")
            end = int(start) + toks.size  # positions start .. end - 1
            if end > c.max_position_embeddings:
                raise BatchError(f"seq {i}: position {end - 1} is past the context "
                                 f"(max_position_embeddings {c.max_position_embeddings})")
            table = list(seq.blocks)
            if llama:
                self._check_table(i, table, int(start), end, writes, reads)
            triples.append((toks, int(start), table))
        for blk, writers in writes.items():
            others = (writers | reads.get(blk, set())) - {min(writers)}
            if others:
                raise BatchError(f"block {blk} is written by seq {min(writers)} and also used by "
                                 f"seq {min(others)} in this batch (one writer, no readers, per step)")
        return Step.of(triples)

    def _check_table(self, i, table, start, end, writes, reads) -> None:
        B = self.block_tokens
        need = -(-end // B)
        if len(table) < need:
            raise BatchError(f"seq {i}: block table has {len(table)} blocks, positions up to "
                             f"{end - 1} need {need} (B = {B})")
        for j, blk in enumerate(table):
            if isinstance(blk, bool) or not isinstance(blk, (int, np.integer)) \
                    or not 0 <= blk < self.pool.n_blocks:
                raise BatchError(f"seq {i}: block table entry {j} = {blk!r} is not a block id "
                                 f"(n_blocks {self.pool.n_blocks})")
            if self.pool.state(int(blk)) != BlockState.IN_USE:
                raise BatchError(f"seq {i}: block {int(blk)} (table entry {j}) is "
                                 f"{self.pool.state(int(blk)).value}, not in use")
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
        """Logits (one row per sequence, its last new token). Writes K and V of the new tokens."""
        step = self._check(batch)
        c = self.config
        if c.arch == "bigram":
            return Logits(c.vocab_size, bigram_forward(self.weights.logits, step.tokens[step.last]))
        logits = llama_forward(self.weights, step, self.pool.data, product=self.product,
                               scratch=self._scratch)
        self._update_fill(step)
        return Logits(c.vocab_size, logits)

    def _update_fill(self, step: Step) -> None:
        B = self.block_tokens
        for s in range(step.n_seqs):
            end = int(step.pos[step.rows(s)][-1]) + 1
            for j in range(int(step.starts[s]) // B, -(-end // B)):
                blk = int(step.tables[s][j])
                want = min(B, end - j * B)
                if self.pool.hash_of(blk) is None and self.pool.fill(blk) < want:
                    self.pool.set_fill(blk, want)

    def last_logits(self, prompts) -> np.ndarray:
        """Every prompt's last-token logits from ONE step on temporary blocks, all given back.

        prompts: S token lists -> (S, V) float32. One pass over the weights for all of them, and by
        batch invariance each row is bit for bit that prompt run alone.
        """
        tables = []
        try:
            for p in prompts:
                tables.append(self.pool.alloc(max(1, -(-len(p) // self.block_tokens))))
            return self.forward(ForwardBatch([ForwardSeq(p, 0, t) for p, t in zip(prompts, tables)])).data
        finally:
            for t in tables:
                for b in t:
                    self.pool.release(b)

    def run_once(self, tokens) -> tuple[np.ndarray, np.ndarray]:
        """One forward of `tokens` from position 0 on temporary blocks, all given back (even on error).

        -> (hidden (T, d) float32: the final-normed hidden state of every token, logits (V,) float32
        of the last token). The bigram has no hidden state: hidden is (T, 0).
        """
        toks = list(tokens) if isinstance(tokens, (bytes, bytearray)) else tokens
        c = self.config
        if c.arch == "bigram":
            step = self._check(ForwardBatch([ForwardSeq(toks, 0, [])]))
            logits = bigram_forward(self.weights.logits, step.tokens[step.last])
            return np.zeros((len(step.tokens), 0), dtype=np.float32), logits[0]
        n = len(np.asarray(toks).reshape(-1)) if not isinstance(toks, list) else len(toks)
        blocks = self.pool.alloc(max(1, -(-n // self.block_tokens)))
        try:
            step = self._check(ForwardBatch([ForwardSeq(toks, 0, blocks)]))
            logits, hidden = llama_forward(self.weights, step, self.pool.data, product=self.product,
                                           scratch=self._scratch, return_hidden=True)
            return hidden, logits[0]
        finally:
            for b in blocks:
                self.pool.release(b)
