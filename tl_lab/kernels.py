"""Compiled kernels of the engine path: the products and the attention. Chapter L10.1, sections 2.4 and 2.5.

Why our product gives the same bits whatever the batch (section 2.4, batch invariance). Every
output element y[m, n] is summed by ONE thread in ONE compiled loop over k. The loop's order (how
LLVM splits it into vector lanes and adds the lanes up) is fixed when the kernel is compiled, so it
depends on nothing decided at run time: not on how many rows share the call, not on where a row
sits among them, not on how many threads there are (a thread takes whole output features, never a
piece of a sum). numpy's ``x @ W.T`` gives that order to OpenBLAS, which picks it from the shape.

Two f32 kernels, each row-invariant on its own. `matvec_f32` takes one row at a time through one
loop over four output features, the rows taking turns while those four weight rows sit in the cache:
the weight comes from memory once per step and a lone row does no wasted work, which is what a
decode step (bound by reading the weights) wants; it runs decode rows, short chunks and the LM head
(`rows_f32`, `head_f32`). `matmul_f32` works on blocks of ROWS x 4 (batch rows x output features):
each x value and weight value loaded serves several products, which is what a long prefill (bound
by arithmetic) wants; a block always has ROWS rows (the caller pads x with zero rows,
`padded_rows`), so a row runs the same code wherever it sits. The two add in different orders, so
the forward picks one by the row's own sequence (`forward.linear_rows`), never by the batch. The
int4 kernel runs `matvec_f32`'s loop on a widened tile. Every kernel takes C-contiguous arrays
only (numba compiles a different loop for strided arrays, and that one may add in another order).

Compiled with numba, ``cache=True``: the first process compiles (seconds), later ones load the
machine code from ``__pycache__``. `FASTMATH` lets LLVM reorder a sum into vector lanes
(`reassoc`), fuse multiply-adds (`contract`), ignore the sign of a zero (`nsz`) and turn a division
into a multiplication by the reciprocal (`arcp`, attention's normalisation), and nothing else: no
assumption that values are finite (no `nnan`, `ninf`), so an infinity or NaN still comes out as one.
Every flag is fixed at compile time, so none of them makes the bits depend on the batch. One sum
is kept out of `reassoc`'s reach (`ORDERED`, `_exp_sum`): inside a parallel loop, numba compiled
it one way in the process that compiled the kernel and another way in the processes that loaded
it from the cache.
"""

from __future__ import annotations

import os

# numba runs prange loops on an OpenMP pool whose idle threads spin by default. On a machine where
# another process holds a core (a learner's laptop always has one), a spinning thread and a
# descheduled one turn every one of a step's ~240 parallel loops into a wait: batch-1 decode at 2
# threads fell from 30 to under 2 tokens/s, measured. Sleeping idle threads cost a wake-up per loop
# instead. Read once, when numba first starts the pool; a value set by the user wins. A short spin
# before sleeping (GOMP_SPINCOUNT=10000) was tried: batch-1 decode at 2 threads 49 -> 80 tokens/s
# on a quiet machine, but 27 -> 12 with one core busy, so the threads sleep at once.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402
from numba import njit, prange  # noqa: E402

__all__ = ["ROWS", "FASTMATH", "ORDERED", "padded_rows", "matmul_f32", "matmul_q4", "matvec_f32", "attend_paged", "QUERY_TILE", "product_f32", "rows_f32", "head_f32",
           "product_q4", "set_threads"]

ROWS = 4
"""Batch rows per block of the product kernels (and the multiple every x is padded to)."""

FASTMATH = {"reassoc", "contract", "nsz", "arcp"}


def padded_rows(x: np.ndarray) -> np.ndarray:
    """x: (M, K) -> C-contiguous float32 (ceil(M / ROWS) * ROWS, K), zero rows appended (no copy when
    x already fits)."""
    M, K = x.shape
    Mp = -(-M // ROWS) * ROWS
    if Mp == M and x.dtype == np.float32 and x.flags.c_contiguous:
        return x
    xp = np.zeros((Mp, K), dtype=np.float32)
    xp[:M] = x
    return xp


@njit(parallel=True, fastmath=FASTMATH, cache=True)
def matmul_f32(x, W, y):  # pragma: no cover (compiled)
    """y = x W^T. x: (M, K) float32 with M a multiple of ROWS; W: (N, K) float32, stored [out, in];
    y: (M, N) float32, written. Threads split the output features n (prange), 4 at a time; every
    y[m, n] is one fixed loop over k."""
    M, K = x.shape
    N = W.shape[0]
    for nb in prange((N + 3) // 4):
        n0 = nb * 4
        nn = min(4, N - n0)  # the last block of a weight may have fewer features
        for m0 in range(0, M, ROWS):
            acc = np.zeros((ROWS, 4), dtype=np.float32)
            for k in range(K):
                for i in range(ROWS):
                    xv = x[m0 + i, k]
                    for j in range(4):
                        acc[i, j] += xv * W[n0 + min(j, nn - 1), k]  # a short block repeats its last feature
            for i in range(ROWS):
                for j in range(nn):
                    y[m0 + i, n0 + j] = acc[i, j]


@njit(inline="always", cache=True)
def _four_features(nb, N):  # pragma: no cover (compiled)
    """Block nb of four output features: (n0, r0, r1, r2, r3), the weight rows to read; the last
    block of a weight whose N is not a multiple of 4 repeats its last feature (never stored)."""
    n0 = nb * 4
    last = N - 1
    return n0, n0, min(n0 + 1, last), min(n0 + 2, last), min(n0 + 3, last)


@njit(inline="always", cache=True)
def _store_four(y, m, n0, N, a0, a1, a2, a3):  # pragma: no cover (compiled)
    """y[m, n0 .. n0 + 3] = a0 .. a3, the features that exist."""
    for j, a in enumerate((a0, a1, a2, a3)):
        if n0 + j < N:
            y[m, n0 + j] = a


@njit(parallel=True, fastmath=FASTMATH, cache=True)
def matvec_f32(x, W, y):  # pragma: no cover (compiled)
    """y = x W^T one row at a time: x: (M, K) float32 (any M), W: (N, K) float32, y: (M, N) float32.

    For the LM head, which sees one row per sequence: four output features per iteration share
    each x value, and the rows take turns over the four weight rows while they sit in the cache,
    so the weight comes from memory once per step. Every row runs the same loop (no padding).
    """
    M, K = x.shape
    N = W.shape[0]
    for nb in prange((N + 3) // 4):
        n0, r0, r1, r2, r3 = _four_features(nb, N)
        for m in range(M):
            a0 = a1 = a2 = a3 = np.float32(0.0)
            for k in range(K):
                xv = x[m, k]
                a0 += xv * W[r0, k]
                a1 += xv * W[r1, k]
                a2 += xv * W[r2, k]
                a3 += xv * W[r3, k]
            _store_four(y, m, n0, N, a0, a1, a2, a3)


@njit(parallel=True, fastmath=FASTMATH, cache=True)
def matmul_q4(x, P, S, f16, y):  # pragma: no cover (compiled)
    """y = x W_hat^T straight from the packed nibbles (section 2.5); no f32 weight is ever made.

    x: (M, K) float32 (any M); P: (N, K / 2) uint8 in the kernel layout of `quant.to_planar` (per
    group of g columns, byte b holds column b in its low nibble and column b + g/2 in its high one,
    each as q + 8); S: (N, G) uint16, the f16 scales; f16: (65536,) float32, every f16 widened;
    y: (M, N) float32, written.

    Per block of four output features, the thread widens their W_hat = (n - 8) s into a 4 x K tile
    that stays in its cache (exact: a 4-bit q times an f16 s fits in f32), every row of the step
    reads the tile, and the next block overwrites it: nothing larger than four rows of W_hat ever
    exists. Each row then runs the loop of `matvec_f32`, so the int4 product of a row is bit for
    bit `matvec_f32` on W_hat, whatever the batch or the thread count.
    """
    M, K = x.shape
    N, G = S.shape
    half = K // G // 2
    for nb in prange((N + 3) // 4):
        n0, r0, r1, r2, r3 = _four_features(nb, N)
        tile = np.empty((4, K), dtype=np.float32)
        for j, r in enumerate((r0, r1, r2, r3)):
            for g in range(G):
                s = f16[S[r, g]]
                c0 = g * 2 * half  # first column of the group
                for b in range(half):
                    n = P[r, g * half + b]
                    tile[j, c0 + b] = np.float32((n & 15) - 8) * s  # offset binary: q = n - 8
                    tile[j, c0 + half + b] = np.float32((n >> 4) - 8) * s
        for m in range(M):
            a0 = a1 = a2 = a3 = np.float32(0.0)
            for k in range(K):
                xv = x[m, k]
                a0 += xv * tile[0, k]
                a1 += xv * tile[1, k]
                a2 += xv * tile[2, k]
                a3 += xv * tile[3, k]
            _store_four(y, m, n0, N, a0, a1, a2, a3)


@njit(inline="always", cache=True)
def _widen_slot(bits, f16, out):  # pragma: no cover (compiled)
    """out[:] = the f16 values `bits` (D,) uint16 (one key or value, where it lives in the pool)."""
    for d in range(bits.size):
        out[d] = f16[bits[d]]


ORDERED = {"contract", "nsz", "arcp"}
"""FASTMATH without `reassoc`: every sum adds in the order the loop is written."""


@njit(inline="always", cache=True)
def _softmax(w):  # pragma: no cover (compiled)
    """w (L,) float32 -> softmax(w) in place, the maximum subtracted first (a maximum is the
    same in any order, so only the sum needs `_exp_sum`)."""
    top = w[0]
    for j in range(1, w.size):
        top = max(top, w[j])
    inv = np.float32(1.0) / _exp_sum(w, top)
    for j in range(w.size):
        w[j] *= inv


@njit(fastmath=ORDERED, cache=True)
def _exp_sum(w, top):  # pragma: no cover (compiled)
    """w[j] = exp(w[j] - top) in place -> their sum, added in key order j = 0, 1, ...

    Why its own compiled function, without `reassoc`: numba optimizes a parallel kernel loaded
    from its cache differently from one it has just compiled (numba issue #10617). Inlined into
    `attend_paged` with `reassoc`, this sum was split into vector lanes one way in the process
    that compiled the kernel and another way in every later process that loaded it, so the first
    run after a change gave other bits than all the runs after it
    (`test_kernels_give_the_same_bits_compiled_or_cached`). A sum whose order is written in the
    code cannot be rearranged by either. The products keep `reassoc` (their lanes are what makes
    them fast), and the same test holds them to it.
    """
    total = np.float32(0.0)
    for j in range(w.size):
        w[j] = np.exp(w[j] - top)
        total += w[j]
    return total


QUERY_TILE = 16
"""Queries of one sequence per attention task: each key read from the pool (and widened from f16)
serves up to QUERY_TILE x rep queries, instead of being read again for every query of a prefill."""


@njit(parallel=True, fastmath=FASTMATH, cache=True)
def attend_paged(q, data, layer, tables, seq_of, starts, firsts, tiles, f16, o):  # pragma: no cover
    """Grouped-query causal attention read from the pool's blocks in place (section 2.4, "going
    further": PagedAttention). Nothing is gathered: key j of sequence s is read where it lives,
    block tables[s, j // B], slot j % B, widened from f16 once per tile of queries.

    q: (N, H, D) float32, the step's queries after RoPE; data: the pool (n_blocks, n_layers, 2, H_kv,
    B, D) uint16; tables: (S, T) int64 block tables (padded); seq_of: (N,) the sequence of each row;
    starts: (S,) p_s; firsts: (S,) the first row of each sequence; tiles: (n_tiles + 1,) row
    boundaries of the query tiles (a tile never spans two sequences); f16: (65536,) float32;
    o: (N, H * D) float32, written.

    Query t (the i-th new token of s) visits exactly the keys j <= pos(t) = p_s + i. Each (tile, KV
    head) is one thread's task; inside it every query runs the same loops in the same order
    whatever its tile, so a query's bits depend only on its own sequence.
    """
    N, H, D = q.shape
    H_kv, B = data.shape[3], data.shape[4]
    rep = H // H_kv
    scale = np.float32(1.0) / np.sqrt(np.float32(D))
    n_tiles = tiles.size - 1
    for task in prange(n_tiles * H_kv):
        tile, g = task // H_kv, task % H_kv
        t0, nq = tiles[tile], tiles[tile + 1] - tiles[tile]
        s = seq_of[t0]
        last = np.empty(nq, dtype=np.int64)
        for i in range(nq):
            last[i] = starts[s] + (t0 + i - firsts[s])  # q_offset = p_s: the i-th new token sees keys 0 .. p_s + i
        L = last[nq - 1] + 1  # the tile's last query sees the most keys
        w = np.zeros((nq, rep, L), dtype=np.float32)
        kv = np.empty(D, dtype=np.float32)
        for j in range(L):
            _widen_slot(data[tables[s, j // B], layer, 0, g, j % B], f16, kv)  # key j, read in place
            for i in range(nq):
                if j <= last[i]:
                    for r in range(rep):
                        dot = np.float32(0.0)
                        for d in range(D):
                            dot += q[t0 + i, g * rep + r, d] * kv[d]
                        w[i, r, j] = dot * scale
        for i in range(nq):
            for r in range(rep):
                _softmax(w[i, r, : last[i] + 1])
        out = np.zeros((nq, rep, D), dtype=np.float32)
        for j in range(L):
            _widen_slot(data[tables[s, j // B], layer, 1, g, j % B], f16, kv)  # value j, read in place
            for i in range(nq):
                if j <= last[i]:
                    for r in range(rep):
                        p = w[i, r, j]
                        for d in range(D):
                            out[i, r, d] += p * kv[d]
        for i in range(nq):
            for r in range(rep):
                for d in range(D):
                    o[t0 + i, (g * rep + r) * D + d] = out[i, r, d]


# ---------------------------------------------------------------------------------------------
# Python entry points: pad, check the layout once, call the kernel
# ---------------------------------------------------------------------------------------------


def product_f32(x: np.ndarray, W: np.ndarray) -> np.ndarray:
    """y = x W^T with `matmul_f32`. x: (M, K) float32, W: (N, K) float32 C-contiguous -> (M, N) float32."""
    xp = padded_rows(x)
    y = np.empty((xp.shape[0], W.shape[0]), dtype=np.float32)
    matmul_f32(xp, _c(W), y)
    return y[: x.shape[0]]


def rows_f32(x: np.ndarray, W: np.ndarray) -> np.ndarray:
    """y = x W^T with `matvec_f32`, every row through the same one-row loop (no padding): the
    product of decode rows and short chunks. x: (M, K), W: (N, K) float32 -> (M, N) float32.

    Why not `matmul_f32` there: a decode step is bound by reading the weights, and a lone row padded
    to a block of ROWS does ROWS times the arithmetic for the same bytes (SmolLM2's layer linears,
    1 thread, interleaved: 21 ms padded against 13 ms one row at a time)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    y = np.empty((x.shape[0], W.shape[0]), dtype=np.float32)
    matvec_f32(x, _c(W), y)
    return y


def head_f32(x: np.ndarray, W: np.ndarray) -> np.ndarray:
    """The LM head, y = x W^T by `rows_f32`: x (S, d), W (V, d) -> (S, V) float32 (a name of its
    own so a profile can tell the head from the layers' products)."""
    return rows_f32(x, W)


def product_q4(x: np.ndarray, planar: np.ndarray, scales: np.ndarray, f16: np.ndarray) -> np.ndarray:
    """y = x W_hat^T with `matmul_q4`. x: (M, K) float32, planar: (N, K / 2) uint8, scales: (N, G)
    uint16 -> (M, N) float32."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    y = np.empty((x.shape[0], planar.shape[0]), dtype=np.float32)
    matmul_q4(x, _c(planar), _c(scales), f16, y)
    return y


def set_threads(n: int) -> int:
    """Threads of the kernels (numba's pool), capped at the pool's size; -> the count in force.
    The bits of every kernel are the same at any count."""
    import numba

    numba.set_num_threads(max(1, min(int(n), numba.config.NUMBA_NUM_THREADS)))
    return numba.get_num_threads()


def _c(a: np.ndarray) -> np.ndarray:
    if not a.flags.c_contiguous:
        raise ValueError(f"the kernels take C-contiguous arrays only, got strides {a.strides} for shape {a.shape}")
    return a
