"""Compiled kernels of the engine path: the products and the attention. Chapter L10.1, sections 2.4 and 2.5.

Why our product gives the same bits whatever the batch (section 2.4, batch invariance). Every
output element y[m, n] is summed by ONE thread in ONE compiled loop over k. The loop's order (how
LLVM splits it into vector lanes and adds the lanes up) is fixed when the kernel is compiled, so it
depends on nothing decided at run time: not on how many rows share the call, not on where a row
sits among them, not on how many threads there are (a thread takes whole output features, never a
piece of a sum). numpy's ``x @ W.T`` gives that order to OpenBLAS, which picks it from the shape.

The kernels work on blocks of ROWS x 4 (batch rows x output features): each weight value read
from memory serves ROWS rows, which is what makes a batch of 8 decodes cost little more than one.
A block always has ROWS rows: the caller pads x with zero rows (`padded_rows`), so a row alone runs
through the very same code as a row in a batch. Every kernel takes C-contiguous arrays only (numba
compiles a different loop for strided arrays, and that one may add in another order).

Compiled with numba, ``cache=True``: the first process compiles (seconds), later ones load the
machine code from ``__pycache__``. `FASTMATH` lets LLVM reorder a sum into vector lanes
(`reassoc`) and fuse multiply-adds (`contract`), and nothing else: no assumption that values are
finite, so an infinity or NaN still comes out as one.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

__all__ = ["ROWS", "FASTMATH", "padded_rows", "matmul_f32", "matmul_q4", "attend_paged", "product_f32",
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


@njit(parallel=True, fastmath=FASTMATH, cache=True)
def matmul_q4(x, xsum, P, S, f16, y):  # pragma: no cover (compiled)
    """y = x W_hat^T straight from the packed nibbles (section 2.5); no f32 weight is ever made.

    x: (M, K) float32, M a multiple of ROWS; xsum: (M, G) float32, the sum of each group of g = K / G
    columns of x; P: (N, K / 2) uint8 in the kernel layout of `quant.to_planar` (per group, byte b
    holds column b in its low nibble and column b + g/2 in its high one, each as q + 8); S: (N, G)
    uint16, the f16 scales; f16: (65536,) float32, every f16 widened; y: (M, N) float32, written.

    With n = q + 8, a group's share is s * (sum_c n_c x_c - 8 * sum_c x_c): the nibble is used as
    it is, and the -8 is one subtraction per group instead of a sign fix per weight.
    """
    M, K = x.shape
    N, G = S.shape
    half = K // G // 2
    for nb in prange((N + 3) // 4):
        n0 = nb * 4
        nn = min(4, N - n0)
        for m0 in range(0, M, ROWS):
            acc = np.zeros((ROWS, 4), dtype=np.float32)
            for g in range(G):
                c0 = g * 2 * half  # first column of the group
                part = np.zeros((ROWS, 4), dtype=np.float32)
                for b in range(half):
                    for j in range(4):
                        byte = P[n0 + min(j, nn - 1), g * half + b]  # a short block repeats its last feature
                        lo = np.float32(byte & 15)
                        hi = np.float32(byte >> 4)
                        for i in range(ROWS):
                            part[i, j] += lo * x[m0 + i, c0 + b] + hi * x[m0 + i, c0 + half + b]
                for j in range(4):
                    s = f16[S[n0 + min(j, nn - 1), g]]
                    for i in range(ROWS):
                        acc[i, j] += s * (part[i, j] - np.float32(8.0) * xsum[m0 + i, g])
            for i in range(ROWS):
                for j in range(nn):
                    y[m0 + i, n0 + j] = acc[i, j]


@njit(parallel=True, fastmath=FASTMATH, cache=True)
def attend_paged(q, data, layer, tables, seq_of, starts, firsts, f16, o):  # pragma: no cover (compiled)
    """Grouped-query causal attention read from the pool's blocks in place (section 2.4, "going
    further": PagedAttention). Nothing is gathered: key j of sequence s is read where it lives,
    block tables[s, j // B], slot j % B, and widened from f16 one element at a time.

    q: (N, H, D) float32, the step's queries after RoPE; data: the pool (n_blocks, n_layers, 2, H_kv,
    B, D) uint16; tables: (S, T) int64 block tables (padded); seq_of: (N,) the sequence of each row;
    starts: (S,) p_s; firsts: (S,) the first row of each sequence; f16: (65536,) float32;
    o: (N, H * D) float32, written.

    Query t (the i-th new token of s) visits exactly the keys j <= pos(t) = p_s + i; the rep = H / H_kv
    query heads of one KV head share each key read. Each (t, KV head) is one thread's loop.
    """
    N, H, D = q.shape
    H_kv, B = data.shape[3], data.shape[4]
    rep = H // H_kv
    scale = np.float32(1.0) / np.sqrt(np.float32(D))
    for task in prange(N * H_kv):
        t, g = task // H_kv, task % H_kv
        s = seq_of[t]
        last = starts[s] + (t - firsts[s])  # q_offset = p_s: query i of s sees keys 0 .. p_s + i
        w = np.empty((rep, last + 1), dtype=np.float32)
        for j in range(last + 1):
            K = data[tables[s, j // B], layer, 0, g, j % B]  # (D,) f16 bits of key j, in place
            for r in range(rep):
                dot = np.float32(0.0)
                for d in range(D):
                    dot += q[t, g * rep + r, d] * f16[K[d]]
                w[r, j] = dot * scale
        for r in range(rep):
            top = w[r, 0]
            for j in range(1, last + 1):
                top = max(top, w[r, j])
            total = np.float32(0.0)
            for j in range(last + 1):
                w[r, j] = np.exp(w[r, j] - top)
                total += w[r, j]
            for j in range(last + 1):
                w[r, j] /= total
        out = np.zeros((rep, D), dtype=np.float32)
        for j in range(last + 1):
            V = data[tables[s, j // B], layer, 1, g, j % B]  # (D,) f16 bits of value j, in place
            for d in range(D):
                v = f16[V[d]]
                for r in range(rep):
                    out[r, d] += w[r, j] * v
        for r in range(rep):
            for d in range(D):
                o[t, (g * rep + r) * D + d] = out[r, d]


# ---------------------------------------------------------------------------------------------
# Python entry points: pad, check the layout once, call the kernel
# ---------------------------------------------------------------------------------------------


def product_f32(x: np.ndarray, W: np.ndarray) -> np.ndarray:
    """y = x W^T with `matmul_f32`. x: (M, K) float32, W: (N, K) float32 C-contiguous -> (M, N) float32."""
    xp = padded_rows(x)
    y = np.empty((xp.shape[0], W.shape[0]), dtype=np.float32)
    matmul_f32(xp, _c(W), y)
    return y[: x.shape[0]]


def product_q4(x: np.ndarray, planar: np.ndarray, scales: np.ndarray, f16: np.ndarray) -> np.ndarray:
    """y = x W_hat^T with `matmul_q4`. x: (M, K) float32, planar: (N, K / 2) uint8, scales: (N, G)
    uint16 -> (M, N) float32."""
    xp = padded_rows(x)
    G = scales.shape[1]
    xsum = xp.reshape(xp.shape[0], G, -1).sum(axis=2, dtype=np.float32)  # (Mp, G), one per group
    y = np.empty((xp.shape[0], planar.shape[0]), dtype=np.float32)
    matmul_q4(xp, np.ascontiguousarray(xsum), _c(planar), _c(scales), f16, y)
    return y[: x.shape[0]]


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
