"""Attention over the pool's blocks, given: what plays candle-nn's attention for the learner's forward.

Chapter L10.1, section 2.4 (attention over the visible keys, grouped-query heads). `PagedAttention`
runs the compiled kernel (`kernels.attend_paged`) over a step's block tables; `gather_kv` + `attend`
are the readable numpy attention the kernel is tested against; `F32Kv` is the float32 cache the f16
bound is measured against; `Recorder` collects a forward's internals for the notebooks. A step is
the forward's `Step` (tokens, pos, offsets, starts, tables; `rows(s)`), used by its fields only: ops
imports no learner module.
"""

from __future__ import annotations

import numpy as np

from tl_lab.ops.kernels import QUERY_TILE, attend_paged
from tl_lab.ops.lanes import LANES
from tl_lab.ops.paging import blocks_for
from tl_lab.ops.widening import F16_AS_F32

__all__ = ["gather_kv", "causal_mask", "softmax", "attend", "PagedAttention", "F32Kv", "attend_reference", "Recorder"]


def gather_kv(data: np.ndarray, layer: int, table: np.ndarray, L: int) -> tuple[np.ndarray, np.ndarray]:
    """K and V of positions 0 .. L-1 of one sequence, read back from its blocks and widened.

    -> K, V: (H_kv, L, D) float32, exactly the f16 values the pool holds (section 2.4's f16 bound).
    """
    B = data.shape[4]
    blocks = data[np.asarray(table)[: blocks_for(L, B)], layer]  # (nb, 2, H_kv, B, D)
    H_kv, D = blocks.shape[2], blocks.shape[4]
    kv = F16_AS_F32[blocks.transpose(1, 2, 0, 3, 4)]  # widened straight into (2, H_kv, nb, B, D) order
    kv = kv.reshape(2, H_kv, -1, D)[:, :, :L]
    return kv[0], kv[1]


def causal_mask(start: int, n: int, L: int) -> np.ndarray:
    """(n, L) bool, True where key j is visible to query t: j <= start + t (q_offset = start)."""
    return np.arange(L)[None, :] <= (start + np.arange(n))[:, None]


def softmax(s: np.ndarray) -> np.ndarray:
    """Softmax over the last axis in float32, the row maximum subtracted first (exp never
    overflows; a masked -inf score gives a weight of exactly 0)."""
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def attend(q: np.ndarray, K: np.ndarray, V: np.ndarray, start: int,
           return_weights: bool = False):
    """Grouped-query causal attention of one sequence's new tokens over its keys.

    q: (n, H, D) float32, the queries of positions start .. start+n-1 (after RoPE);
    K, V: (H_kv, L, D) float32 with L = start + n, positions 0 .. L-1;
    -> o: (n, H * D) float32 [, weights: (H, n, L) float32].

    Query head h reads KV head h // (H / H_kv). Query t weighs exactly the keys j <= pos(t) =
    start + t: the others get the score -inf and so the weight 0. A decode step (n = 1) has
    L = start + 1 keys, all visible.
    """
    n, H, D = q.shape
    H_kv, L, _ = K.shape
    rep = H // H_kv
    qg = q.transpose(1, 0, 2).reshape(H_kv, rep * n, D)  # head h = g * rep + r
    s = (qg @ K.transpose(0, 2, 1)) * np.float32(D ** -0.5)  # (H_kv, rep * n, L)
    s = s.reshape(H_kv, rep, n, L)
    s = np.where(causal_mask(start, n, L), s, np.float32(-np.inf))
    w = softmax(s)
    o = w.reshape(H_kv, rep * n, L) @ V  # (H_kv, rep * n, D)
    o = o.reshape(H, n, D).transpose(1, 0, 2).reshape(n, H * D)
    if return_weights:
        return o, w.reshape(H, n, L)
    return o


class PagedAttention:
    """A step's attention over the pool in place: the block tables padded into one array, each row's
    sequence, each sequence's first row and the query tiles the kernel walks.

    data: the pool (n_blocks, n_layers, 2, H_kv, B, D) uint16; step: the forward's Step."""

    def __init__(self, data: np.ndarray, step) -> None:
        self.data, self.step = data, step
        width = max(len(t) for t in step.tables)
        self.tables = np.zeros((step.n_seqs, width), dtype=np.int64)  # padding is never visited
        for s, t in enumerate(step.tables):
            self.tables[s, : len(t)] = t
        self.seq_of = np.repeat(np.arange(step.n_seqs), np.diff(step.offsets))  # (N,)
        self.firsts = np.ascontiguousarray(step.offsets[:-1])  # (S,) first row of each sequence
        cuts = [np.arange(a, b, QUERY_TILE) for a, b in zip(step.offsets[:-1], step.offsets[1:])]
        self.tiles = np.append(np.concatenate(cuts), step.offsets[-1]).astype(np.int64)  # query tiles

    def attend(self, layer: int, q: np.ndarray) -> np.ndarray:
        """q: (N, H, D) float32 -> o: (N, H * D) float32, each query over its visible keys only."""
        N, H, D = q.shape
        o = np.empty((N, H * D), dtype=np.float32)
        attend_paged(np.ascontiguousarray(q, dtype=np.float32), self.data, layer, self.tables, self.seq_of,
                     self.step.starts, self.firsts, self.tiles, o, () if D % LANES == 0 else (0,))
        return o

    def read(self, layer: int, s: int) -> tuple[np.ndarray, np.ndarray]:
        """Sequence s's keys and values of positions 0 .. start + n - 1, (H_kv, L, D) float32 each."""
        r = self.step.rows(s)
        return gather_kv(self.data, layer, self.step.tables[s], int(self.step.starts[s]) + r.stop - r.start)


class F32Kv:
    """The float32 reference cache: nothing is rounded and nothing outlives the step, so every
    sequence attends over its own step's keys and must start at position 0."""

    def __init__(self, step) -> None:
        if np.any(step.starts != 0):
            raise ValueError("kv='f32' keeps no cache between steps: every sequence must start at 0")
        self.step, self.kv = step, {}

    def write(self, layer: int, k: np.ndarray, v: np.ndarray) -> None:
        self.kv[layer] = (k, v)

    def read(self, layer: int, s: int) -> tuple[np.ndarray, np.ndarray]:
        k, v = self.kv[layer]
        r = self.step.rows(s)
        return k[r].transpose(1, 0, 2), v[r].transpose(1, 0, 2)

    def attend(self, layer: int, q: np.ndarray) -> np.ndarray:
        return attend_reference(self, layer, q)


def attend_reference(cache, layer: int, q: np.ndarray, weights: list | None = None) -> np.ndarray:
    """Attention of every sequence through numpy (`gather_kv`, `attend` with its mask): the readable
    reference the kernel is tested against. q: (N, H, D) -> (N, H * D); `weights` collects each
    sequence's (H, n, L) attention weights when given."""
    step = cache.step
    o = np.empty((q.shape[0], q.shape[1] * q.shape[2]), dtype=np.float32)
    for s in range(step.n_seqs):
        r = step.rows(s)
        K, V = cache.read(layer, s)  # (H_kv, L, D) each
        if weights is None:
            o[r] = attend(q[r], K, V, int(step.starts[s]))
        else:
            o[r], w = attend(q[r], K, V, int(step.starts[s]), return_weights=True)
            weights.append(w)
    return o


# ---------------------------------------------------------------------------------------------
# The trace: what the notebook draws, recorded only when asked for
# ---------------------------------------------------------------------------------------------


class Recorder:
    """Collects the internals of a forward into a dict (the notebook's `trace`): x after the
    embedding and after each layer (N, d), q (N, H, D), k and v (N, H_kv, D) per layer, and per
    layer a list of each sequence's attention weights (H, n, L). Without a recorder the forward
    does none of this work."""

    def __init__(self, into: dict) -> None:
        self.d = into
        self.d.update(x=[], q=[], k=[], v=[], attn=[])

    def embed(self, x: np.ndarray) -> None:
        self.d["x"].append(x.copy())

    def layer(self, cache, l: int, q, k, v, x) -> None:
        weights = []
        attend_reference(cache, l, q, weights)
        for name, val in (("q", q), ("k", k), ("v", v), ("x", x)):
            self.d[name].append(val.copy())
        self.d["attn"].append(weights)
