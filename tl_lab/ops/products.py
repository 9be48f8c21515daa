"""The numpy reference products: batch-invariant tiles in plain numpy, and int4 widened to f32.

Chapter L10.1, section 2.4 (batch invariance). Given, not the learner's: the engine's products are
the compiled kernels (`tl_lab.ops.kernels`, in Candle's role); these numpy pieces are the readable
reference the kernels are tested against, and the lesson of why numpy's plain ``x @ W.T`` is not
invariant (product="plain" runs it, for the notebook and the benchmarks).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


__all__ = ["TILE", "LONG_ROWS", "PRODUCTS", "HEAD_CHUNK", "matmul_rows", "matvec_rows", "RowPlan", "plan_rows",
           "product_rows", "weight_t", "Scratch"]

# ---------------------------------------------------------------------------------------------
# The batch-invariant product
# ---------------------------------------------------------------------------------------------

TILE = 8
"""Rows per tile of `matmul_rows`, chosen by measurement on numpy's OpenBLAS 0.3.31 (Haswell
kernels on this x86-64, 1 or 2 threads). A tile always has 8 rows, so numpy never takes the
gemv path for it. With 8-row tiles a row's bits are the same at every place in the tile for every
shape tried (the tiny model's and SmolLM2's, LM head included); with 12, 16, 24, 32, 48 or 64 rows
they depend on the place (rows past the eighth take another code path); 2 and 4 also hold but a
batch of 8 then pays for 4 or 2 weight passes (4: 1.43x the plain product at batch 8, 8: 1.03x).
The price of 8 is batch 1: a lone row costs a full 8-row gemm, 2.3x a gemv per weight (1 thread)."""

LONG_ROWS = 32
"""A sequence with at least this many new tokens in a step gets a product of its own (see
`product_rows`): one (n_s, K) x (K, N) gemm, as fast as the plain product for a long prefill."""

HEAD_CHUNK = 2048
"""Vocabulary rows per chunk of `matvec_rows` (the LM head): 2048 x 576 float32 = 4.7 MB stays in
the L3 cache while every row of the step reads it."""

PRODUCTS = ("invariant", "plain")


def matmul_rows(x: np.ndarray, W_T: np.ndarray) -> np.ndarray:
    """y = x W_T, computed so that each row's result does not depend on the other rows.

    x: (M, K) float32, W_T: (K, N) float32 (a weight stored (out, in), passed as its .T view)
    -> y: (M, N) float32.

    Why: numpy hands ``x @ W_T`` to OpenBLAS, which picks its code path from the shape. One row
    goes to a matrix-vector kernel (gemv) and more rows to the blocked gemm kernel, which sums in
    another order; inside gemm, the row count decides how the work is split between threads and
    which register tile handles a row, and some of those add in a different order too. So the
    same row comes out a few ulps apart depending on how many rows share the call (the test
    `test_plain_product_is_not_row_invariant` shows it for every batch size 2 to 64).

    How: pad the rows with zeros to a multiple of TILE and run every tile through its own
    same-shaped (TILE, K) x (K, N) product. Every row then always meets the same kernel, the
    same K blocking and the same thread split, whatever the batch: its bits depend only on the
    row itself (and on the weight, the shape and the BLAS thread count, which are fixed for a
    run). The chapter's `matmul_rows` sends every row alone through a (1, K) product instead,
    which reads the whole weight once per row; a tile reads it once per 8 rows, so a batch of 8
    decodes costs about as much as one.
    """
    M, K = x.shape
    N = W_T.shape[1]
    n_tiles = -(-M // TILE)
    xp = np.zeros((n_tiles * TILE, K), dtype=np.float32)
    xp[:M] = x
    y = np.empty((n_tiles * TILE, N), dtype=np.float32)
    for i in range(0, n_tiles * TILE, TILE):  # one BLAS call per tile, never one merged call
        np.matmul(xp[i : i + TILE], W_T, out=y[i : i + TILE])
    return y[:M]


def matvec_rows(x: np.ndarray, W_T: np.ndarray, chunk: int = HEAD_CHUNK) -> np.ndarray:
    """y = x W_T with every row alone through (1, K) x (K, chunk) matrix-vector products.

    x: (M, K) float32, W_T: (K, N) float32 -> (M, N) float32. Used for the LM head, which only
    sees each sequence's last token (M = S, a handful of rows) but is the largest weight
    (49,152 x 576 for SmolLM2, 113 MB, more than the L3 cache). A row alone takes gemv, the
    cheapest product for one row, and gemv per row is row-invariant by construction: each row is
    its own call with the same shapes whatever the batch. The weight is walked in chunks of
    `chunk` columns and every row reads a chunk before the next one is touched, so the weight
    comes from memory once per step and from the cache for the other rows. (An 8-row tile costs
    as much as 8 rows even for one: 2.8x a gemv for a batch-1 decode, measured.)
    """
    M, N = x.shape[0], W_T.shape[1]
    y = np.empty((M, N), dtype=np.float32)
    for a in range(0, N, chunk):
        W_c = W_T[:, a : a + chunk]
        for i in range(M):
            np.matmul(x[i : i + 1], W_c, out=y[i : i + 1, a : a + chunk])
    return y


@dataclass(frozen=True)
class RowPlan:
    """How a step's rows meet the weights (built once per step by `plan_rows`).

    short: row indices of the sequences with fewer than LONG_ROWS new tokens, all sent together
    through `matmul_rows` (decode rows and short chunks share tiles);
    spans: (begin, end) row ranges of the longer sequences, each its own product.
    """

    n_rows: int
    short: np.ndarray
    spans: tuple[tuple[int, int], ...]


def plan_rows(lengths) -> RowPlan:
    """The RowPlan for sequences of `lengths` new tokens, in batch order."""
    short, spans, a = [], [], 0
    for n in lengths:
        if n >= LONG_ROWS:
            spans.append((a, a + n))
        else:
            short.extend(range(a, a + n))
        a += n
    return RowPlan(a, np.asarray(short, dtype=np.intp), tuple(spans))


def product_rows(x: np.ndarray, W_T: np.ndarray, plan: RowPlan | None = None,
                 product: str = "invariant") -> np.ndarray:
    """y = x W_T for a step's rows x: (N, K) float32 -> (N, N_out) float32.

    product="invariant" (the runner's): rows of short sequences go through `matmul_rows` tiles;
    a sequence of LONG_ROWS or more new tokens is one plain gemm of its own rows, (n_s, K) x
    (K, N_out). That gemm's rows do depend on each other, but only on rows of the same sequence,
    so the sequence's result still does not depend on its batch, and a long prefill runs at the
    plain product's speed instead of paying for 8-row tiles. plan=None: every row is tiled.
    product="plain": ``x @ W_T`` in one call, the fast but batch-dependent baseline.
    """
    if product == "plain":
        return x @ W_T
    if product != "invariant":
        raise ValueError(f"product must be one of {PRODUCTS}, got {product!r}")
    if plan is None:
        return matmul_rows(x, W_T)
    y = np.empty((x.shape[0], W_T.shape[1]), dtype=np.float32)
    if plan.short.size:
        y[plan.short] = matmul_rows(x[plan.short], W_T)
    for a, b in plan.spans:
        np.matmul(x[a:b], W_T, out=y[a:b])
    return y


class Scratch:
    """Reusable float32 buffers for widening int4 weights, one per weight shape (section 2.5).

    An int4 linear is widened into the buffer of its shape just before its product and the buffer
    is overwritten by the next linear of that shape, so at most one f32 copy per shape is ever
    resident, never the whole dequantized model.
    """

    def __init__(self) -> None:
        self._bufs: dict[tuple[int, int], np.ndarray] = {}

    def get(self, shape: tuple[int, int]) -> np.ndarray:
        if shape not in self._bufs:
            self._bufs[shape] = np.empty(shape, dtype=np.float32)
        return self._bufs[shape]

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self._bufs.values())


def weight_t(lin, scratch: Scratch | None = None) -> np.ndarray:
    """The (in, out) operand of a linear's product: W.T, a view of the stored (out, in) weight.

    A float32 Linear gives a view (no copy). An int4 QLinear is widened to W_hat = q s (exact in
    f32) into `scratch`'s buffer (or a new array) and its view is returned: the product of an int4
    model is then bit for bit the product of the f32 model holding W_hat.
    """
    # by what the linear holds, not its class: ops imports no learner module (model.Linear, quant.QLinear)
    if isinstance(getattr(lin, "w", None), np.ndarray):
        return lin.w.T
    if hasattr(lin, "qweight") and hasattr(lin, "dequantize"):
        buf = None if scratch is None else scratch.get((lin.out, lin.inp))
        return lin.dequantize(out=buf).T
    raise TypeError(f"expected a Linear or QLinear, got {type(lin).__name__}")
