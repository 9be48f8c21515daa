"""Compiled kernels of the engine path: the products and the attention. Chapter L10.1, sections 2.4 and 2.5.

Why our product gives the same bits whatever the batch (section 2.4, batch invariance). Every
output element y[m, n] is summed by ONE thread, in the order `tl_lab.ops.lanes` writes out: sixteen
lanes, lane l adding the terms k = l, l + 16, ... one fused multiply-add at a time, then the lanes
folded in a fixed tree. Nothing decided at run time changes that order: not how many rows share
the call, not where a row sits among them, not how many threads there are (a thread takes whole
output features, never a piece of a sum), not which kernel runs. numpy's ``x @ W.T`` gives the
order to OpenBLAS, which picks it from the shape.

Four f32 kernels, one order. `matvec_f32` takes one row at a time, four output features per pass,
and `matvec1_f32` one feature a pass (whichever reads memory faster here, `one_row`): a lone row
does no wasted work, which is what a batch-1 decode step (bound by reading the weights) wants.
`matmul_f32` works on blocks of 3 rows x 8 features (x padded with zero rows to a multiple of 3,
`padded_rows`): each x vector loaded serves eight products and each weight vector three, which is
what a long prefill (bound by arithmetic) wants; 6 rows x 4 features where eight weight rows are too
long for the L1 cache. `matmul8_f32` works on blocks of 8 rows x 2 features, in one pass over the
weight, which is what a batch of eight decodes (bound by both) wants. All build every sum from the
same `lanes` pieces, so they give the same bits (tested), and `product_f32` picks one by the batch's
shape (and, for a lone row, the machine) alone. They ask for the weight rows a little ahead of the
arithmetic (`lanes.prefetch`): without that, a kernel busy with arithmetic let the memory sit idle,
and a batch of 8 cost twice what it needs to. The int4 kernels (`matvec_q4` for a lone row,
`matmul8_q4` for a batch of eight, `matmul_q4`'s tiles for the rest) turn the stored nibbles into
W_hat = n s - 8 s, exactly, and add x W_hat into the same lanes: an int4 product is the f32 product
on W_hat, bit for bit. The int4 model's LM head is int8 (`q8.Q8Linear`): `matvec_q8` (or
`matvec1_q8`) and `matmul8_q8` make W_hat = q s (exact) sixteen at a time as they read it, the same
way. Every kernel takes C-contiguous arrays only.

What depends on the machine, and where it comes from (the same code must be fast on every
processor it lands on; a constant tuned on one host was 40% of another's bandwidth). Read from the
system or measured while running:

- threads for a step: a one-row step (a batch-1 decode) runs on 1 thread, or on 1 thread but for
  the products that read more than the L2 cache (`BIG`, read from the system), or wholly on the
  count in force: whichever of these plans its own recent steps ran fastest under, measured per
  runner as it decodes and probed again every `LoneRowThreads.PROBE` steps (a busy core turns the
  splits off); larger steps use the count in force;
- the one-row kernels: `matvec_f32` (four features a pass) or `matvec1_f32` (one, the weight read
  as one stream), and the same for the int8 head (`matvec_q8`, `matvec1_q8`), whichever reads
  faster here, timed once a process (`one_row`): on processor E one feature a pass read twice as
  fast, on B four had;
- how far ahead a streaming kernel asks for its weight into the L2 cache (`AHEAD`: not at all,
  16 or 32 KB), timed with the kernel once a process (`one_row`, `eight_rows_f32`) on weights read
  as a step reads them, a decoder layer's in turn (`_stream_probe`), the nearer distance kept unless
  a farther one is faster by more than the probe can tell (`TIE`): on processor E
  `matmul8_f32` read 11 GB/s asking one block ahead into L1 only and 18-20 GB/s asking 16 KB ahead
  into L2 as well (now a line a step, `_prefetch_rows`), while the f32 one-row pass read fastest
  asking nothing ahead, and the int8 head's four-feature pass, asking 16 or 32 KB ahead, overtook
  its one-feature pass (2.2 -> 1.9 ms at 1 thread, 1.5 -> 1.2 at 2). Both are timed at the first
  weight of at least `UNPROBED` bytes (this core's L2 cache); a smaller one, which no step reads
  from memory, runs the first candidate untimed (a tiny model's chat: 231 -> 167 MB at its peak);
- the pages the f32 weights lie in: 2 MiB where the OS has them (`widening.Arena` asks for them,
  madvise; the system's transparent_hugepage setting decides), else 4 KB. On processor E
  `matvec1_f32` read a weight at 24.4 GB/s in 4 KB pages and 30.7 in 2 MiB ones at 1 thread (31.0
  and 33.7 at 2), and the machine's read probe (`machine.read_gbps`) runs in 2 MiB pages too;
- the kernel for a batch size: one row `matvec_*`, five to eight rows `matmul8_*` when eight rows of
  x fit `X_IN_L2` (below), else `matmul_*`;
- how many rows of x `matmul_*` pass over a block of weight rows at a time: `X_IN_L2` bytes, a
  quarter of the L2 cache, read the same way;
- how many columns `matmul8_f32` reads in a pass (`x_cols`): all of them while x's eight rows fit
  the L1 data cache (`L1_BYTES`, read from the system), else equal passes of at most `X_IN_L1`
  bytes of x (SmolLM2's down projection, K = 1536: 3 passes of 512 columns on processor E's 32 KB
  L1, 2 of 768 on a 48 KB one);
- `matmul_f32`'s block: 3 rows x 8 features when eight weight rows fit `X_IN_L1`, half the L1
  data cache, read from the system (`machine.cache_bytes`, sysfs), else 6 x 4 (four
  rows: SmolLM2's down projection, K = 1536);
- how many sums a kernel keeps side by side: `WIDE`, read from the target numba compiles for
  (`lanes.wide_registers`). AVX-512's 32 registers of 16 floats hold the blocks of 24 sums (3 x 8,
  6 x 4) and of 16 (8 x 2). Where a register holds eight floats (AVX2's 16 registers; NEON) those
  blocks need twice the registers there are and spill on every step, so there the products add
  each block's sums in halves (lanes 0 .. 7 over every step, then lanes 8 .. 15: `lanes.vload8`;
  each lane's chain is unchanged, so are the bits) in blocks of 3 x 4 (`_block34`; in passes of
  columns where a block's seven rows overflow three quarters of L1, `cols34`), a batch of five
  to eight rows goes through `matmul8_f32` four rows by two features at a time (`_quad2h`) and through
  `matmul_q4` for int4 (whose 3-row blocks reuse the weight rows in L1, one pass over memory),
  the one-row int4 pass takes two features (`_q4_pair`), the int8 head's batch of eight one
  feature in halves (`_q8_rows8`), and attention 16 keys or values at a time instead of 64;
- vector width: not a choice. The 16 lanes are part of the order of every sum (`lanes`), so they
  are the same on every machine: one AVX-512 register where there is one, two AVX2 halves where
  not; only `lanes.vhat` picks its instructions by the target's features (the same bits either way).

Fixed, each measured on processor B (the 8 x 2 blocks also on A, the spin also on C) with its figures next to it: how
long the threads spin before they sleep (GOMP_SPINCOUNT, the gap between a step's parallel loops), the
prefetch distances (`_prefetch_rows`, `Q4_AHEAD`, `Q8_AHEAD`), the 3 x 8, 6 x 4 and 8 x 2 blocks,
attention's `QUERY_TILE` and its 3 heads x 64 keys of scores, and the fractions of the caches above. The blocks and distances depend on the cache line (64 bytes)
and the register count (32 with AVX-512), not on a cache size; the spin on how long our own Python
runs between two parallel loops. How: microbenchmarks of the kernel at SmolLM2's shapes, the
candidates interleaved round by round in one process and the best of several rounds kept (the
machine is shared, the best round is the least disturbed one), every candidate checked for the same
bits first; `benchmarks/bench_targets.py` runs the kernels compiled for other processors' tuning
(NUMBA_CPU_NAME) to check the code another machine gets is not the slow one.

Compiled with numba, ``cache=True``: the first process compiles (about 9 s for the tiny model's f32
and int4 forwards), later ones load the machine code from ``__pycache__`` (0.2 s). No kernel uses a
fast-math flag: `lanes` writes the vector code of the products and of attention (q . k_j is one
chain of fused multiply-adds over the head dimension, d = 0, 1, ..., sixteen keys side by side in
the lanes, so no score pays a fold; keys and values are widened from f16 once per sequence and KV
head for a prefill's tiles, once per task for a decode's, the keys transposed sixteen by sixteen;
the softmax's sum is a `lanes` sum over the keys; and sum_j p_j v_j adds the values in key order,
64 of them for each of three heads held in registers across the keys). It was
not always so: with `reassoc`, numba compiled a sum inside a parallel loop one way in the process
that compiled the kernel and another way in the processes that loaded it from the cache (numba issue
#10617), so the first run after a change gave other bits than every later one;
`test_kernels_give_the_same_bits_compiled_or_cached` holds every kernel to the same bits both ways.
"""

from __future__ import annotations

import hashlib
import math
import os
import statistics
import threading
import weakref
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

# numba runs prange loops on an OpenMP pool (GNU libgomp on Linux) whose idle threads spin for
# 300 000 rounds by default. On a machine where another process holds a core (a learner's laptop
# always has one), a spinning thread and a descheduled one turn every one of a step's ~240 parallel
# loops into a wait: batch-1 decode at 2 threads fell from 30 to under 2 tokens/s, measured. So the
# threads wait passively, and spin only GOMP_SPINCOUNT rounds first: 3 000 rounds, about 30 us on
# processor B. An empty parallel loop at 2 threads after a gap of up to 20 us then takes 3.5 us (1.9 to
# 2.8 on one thread), 9 us after 50-200 us and 28 after 1 ms, against 17, 17 to 28 and 45 with no spin
# (1 000 rounds: 3 up to 5 us, 8 to 10 after; 10 000: 2.5 up to 50 us). The gaps
# are where Python runs the norms, RoPE and the KV write between a step's parallel loops; a thread
# asleep through each made a second thread pay for itself only in the products over the L2 cache.
# SmolLM2 at 2 threads on processor B, medians of 2 to 6 interleaved runs on a noisy host, no spin ->
# 3 000: int4 batch 1 77 -> 88 tokens/s, batch 8 195 -> 238; with a busy loop holding one core, int4
# batch 1 52 -> 68 and batch 8 160 -> 113 (the spin takes the busy core's time: the one case it
# costs). 10 000 rounds cost batch 8 half its speed with the busy core and gained nothing more quiet.
# On processor C (AMD EPYC, znver5) 3 000, 30 000 and 300 000 rounds gave the same int4 batch-1 step at
# 2 threads within the host's noise (5.8-7.0 ms, two alternations of the three), so 3 000 stays.
# A lone row still splits only where its own steps say it pays (`threads_for`). How long a round
# takes is the processor's (a pause instruction); read once, when numba first starts the pool (GNU
# OpenMP only; other threading layers ignore it); a value set by the user wins. The two values live in
# `machine.POOL_DEFAULTS`, so a results file can record them without importing this module.
from tl_lab.ops.machine import POOL_DEFAULTS, cache_bytes, threads_in_pool  # noqa: E402 (numpy only: numba's pool has not started)

for _name, _value in POOL_DEFAULTS.items():
    os.environ.setdefault(_name, _value)

import numpy as np  # noqa: E402
from numba import njit, prange, types  # noqa: E402
from numba.extending import overload  # noqa: E402

from tl_lab.ops import lanes  # noqa: E402
from tl_lab.ops.lanes import (HALF, LANES, prefetch, prefetch_l2, vexp, vfma, vfma8, vhat, vjoin, vload, vload8, vload_f16,  # noqa: E402
                          vload_f16_part, vload_part, vmax, vmul, vq8, vsplat, vstore, vstore_few, vstore_part, vstore_sums82, vsum, vsum4, vtop,
                          vtranspose16, vq8h, vsplat8, vzero, vzero8, wide_registers)

__all__ = ["ROWS", "padded_rows", "lanes_ready", "matmul_f32", "matmul8_f32", "matmul_q4", "matmul8_q4",
           "cols34", "matvec_f32", "matvec1_f32", "matvec1_q8", "one_row", "eight_rows_f32", "AHEAD", "Choice", "faster_of", "attend_paged", "QUERY_TILE",
           "product_f32", "rows_f32", "head_f32",
           "product_q4", "matvec_q4", "matvec_q8", "matmul8_q8", "product_q8", "set_threads", "threads_for", "SERIAL_ROWS",
           "LoneRowThreads", "ALONE", "BIG", "ALL", "exp_f64"]

ROWS = 3
"""Batch rows per block of the product kernels (and the multiple every x is padded to)."""


def padded_rows(x: np.ndarray, rows: int = ROWS) -> np.ndarray:
    """x: (M, K) -> C-contiguous float32 (ceil(M / rows) * rows, K) starting on a 64-byte line, zero
    rows appended (no copy when x already fits). Why the line: numpy starts a large array 16 bytes
    past one, and then every 64-byte vector load of x straddles two lines; the 3 x 8 blocks ran
    117 GFLOP/s on aligned rows against 88 on such rows, measured on processor B."""
    M, K = x.shape
    Mp = -(-M // rows) * rows
    if Mp == M and x.dtype == np.float32 and x.flags.c_contiguous and x.ctypes.data % 64 == 0:
        return x
    xp = aligned_zeros((Mp, K))
    xp[:M] = x
    return xp


def aligned_zeros(shape: tuple[int, int]) -> np.ndarray:
    """A C-contiguous float32 array of zeros whose first element starts a 64-byte cache line."""
    n = shape[0] * shape[1]
    buf = np.zeros(n + 16, dtype=np.float32)
    first = (-buf.ctypes.data % 64) // 4
    return buf[first : first + n].reshape(shape)


@njit(inline="always", cache=True)
def _four_features(nb, N):  # pragma: no cover (compiled)
    """Block nb of four output features: (n0, r0, r1, r2, r3), the weight rows to read; the last
    block of a weight whose N is not a multiple of 4 repeats its last feature (never stored)."""
    n0 = nb * 4
    last = N - 1
    return n0, n0, min(n0 + 1, last), min(n0 + 2, last), min(n0 + 3, last)


@njit(inline="always", cache=True)
def _store_lanes(y, m, n0, N, a0, a1, a2, a3):  # pragma: no cover (compiled)
    """y[m, n0 .. n0 + 3] = the folded lanes of a0 .. a3 (`lanes.vsum4`, the same bits as four
    `vsum`s in a third of the instructions), the features that exist: one masked store where there
    are mask registers, else a scalar store each (`lanes.vstore_few`; on processor D, 1 thread,
    old and new interleaved in one process: `matmul_f32`'s 3 x 4 blocks at 513 rows 1.13-1.14x
    faster for K = 576, 1.05x for K = 1536; a 512-token prefill 160-176 -> 187-206 tok/s with the
    softmax's stores below)."""
    sums, n = vsum4(a0, a1, a2, a3), min(4, N - n0)
    if WIDE:
        vstore_part(y, m, n0, n, sums)
    else:
        vstore_few(y, m, n0, n, sums)


@njit(inline="always", cache=True)
def _prefetch_rows(W, p, n, k, l2=False):  # pragma: no cover (compiled)
    """Ask for W[p .. p + n - 1, k .. k + 15] into L1 (into L2 with l2): the rows of the next block
    of features, sixteen columns ahead of where this block reads. One block ahead is the measured
    best into L1: 32 KB ahead was 8% slower at batch 8, because beside x's eight rows the rows asked
    for no longer fit the 48 KB L1 cache with the ones in use. Rows far ahead go into L2
    (`matmul8_f32`'s `far`)."""
    last = W.shape[0] - 1
    for j in range(n):
        if l2:
            prefetch_l2(W, min(p + j, last), k)
        else:
            prefetch(W, min(p + j, last), k)


F32_AHEAD = 16
"""Weight rows ahead of the block in use that `matvec_f32` asks for (four blocks, 37 KB for K = 576).
A batch-1 decode reads the weights from memory once; on processor D (AMD EPYC, Zen 3), whose one
thread read memory at 8-10 GB/s of its 12 unaided, 60 weights of 3072 x 576 in turn, 3 interleaved
rounds: 1 thread 7.7-9.8 GB/s without, 8.7-12.2 with 16 rows ahead (8: 9.6-10.5; 32 and 64 no
better); 2 threads 13-19 -> 15-21."""


@njit(inline="always", cache=True)
def _ask_far(W, r, far):  # pragma: no cover (compiled)
    """Ask for row r + far of W into the L2 cache, a cache line at a time (far = 0: nothing). The
    rows a kernel asks for one block ahead (`_prefetch_rows`, into L1) arrive in time only if
    memory is already busy with them; these keep it busy."""
    if far > 0:
        row = min(r + far, W.shape[0] - 1)
        for k in range(0, W.shape[1], 64 // W.itemsize):
            prefetch_l2(W, row, k)


@njit(parallel=True, nogil=True, cache=True)
def matvec_f32(x, W, y, far=0):  # pragma: no cover (compiled)
    """y = x W^T one row at a time. x: (M, K) float32 (any M); W: (N, K) float32, stored [out, in];
    y: (M, N) float32, written.

    The kernel of a lone row (a batch-1 decode step, the LM head of one sequence). Its cost is
    reading the weight: one pass, four weight rows at a time, each x value loaded once for the four.
    Threads split the output features (prange); every y[m, n] is one sum in `lanes` order."""
    M, K = x.shape
    N = W.shape[0]
    for nb in prange((N + 3) // 4):
        n0, r0, r1, r2, r3 = _four_features(nb, N)
        for j in range(4):
            _ask_far(W, n0 + j, far)
        for m in range(M):
            a0, a1, a2, a3 = vzero(), vzero(), vzero(), vzero()
            for k in range(0, K, LANES):
                _prefetch_rows(W, n0 + F32_AHEAD, 4, k)
                xv = vload(x, m, k)
                a0 = vfma(xv, vload(W, r0, k), a0)
                a1 = vfma(xv, vload(W, r1, k), a1)
                a2 = vfma(xv, vload(W, r2, k), a2)
                a3 = vfma(xv, vload(W, r3, k), a3)
            _store_lanes(y, m, n0, N, a0, a1, a2, a3)


@njit(parallel=True, nogil=True, cache=True)
def matvec1_f32(x, W, y, far=0):  # pragma: no cover (compiled)
    """`matvec_f32` one output feature a pass: y = x W^T, x: (M, K) float32, W: (N, K) float32, y:
    (M, N) float32, written. Each y[m, n] the same chain in `lanes` order, folded by `vsum` (the
    bits of `vsum4`'s fold, tested), so the same bits as `matvec_f32`; the weight read as one
    stream, row after row, as `machine.read_gbps` reads memory.

    Why two one-row kernels (`one_row` picks, by timing both): which reads faster is the
    processor's. SmolLM2's head (49152 x 576) and a layer's seven products, 1 thread, best of 7
    interleaved rounds: on processor E (AMD EPYC, Zen 4) four features a pass read 12.2 and 12.8 GB/s
    and one feature 25.2 and 21.7 (the plain read: 28.9, 22.4); at 2 threads 22.9 / 25.6 against
    31.7 / 33.2. On processor B four features a pass had read more than the plain read."""
    M, K = x.shape
    for n in prange(W.shape[0]):
        _ask_far(W, n, far)
        for m in range(M):
            a = vzero()
            for k in range(0, K, LANES):
                a = vfma(vload(x, m, k), vload(W, n, k), a)
            y[m, n] = vsum(a)


@njit(inline="always", cache=True)
def _block38(x, m0, W, w0, y, n0, p, ahead):  # pragma: no cover (compiled)
    """y[m0 .. m0 + 2, n0 .. n0 + 7] = x[m0 .. m0 + 2] W[w0 .. w0 + 7]^T (a row past W's last reads the
    last again: its features are never stored): 24 sums side by side in `lanes` order, each x
    vector loaded serving eight features and each weight vector three rows (24 accumulators, three
    x vectors and four weight vectors: 31 of AVX-512's 32 registers). With `ahead`, the weight rows
    p .. p + 7 (the next block's) are asked for as the block goes."""
    N, K, last = y.shape[1], x.shape[1], W.shape[0] - 1
    lo0, lo1, lo2 = _zeros4(), _zeros4(), _zeros4()  # lo_i: row m0 + i, features n0 .. n0 + 3
    hi0, hi1, hi2 = _zeros4(), _zeros4(), _zeros4()  # hi_i: row m0 + i, features n0 + 4 .. n0 + 7
    for k in range(0, K, LANES):
        if ahead:
            _prefetch_rows(W, p, 8, k)
        x0, x1, x2 = vload(x, m0, k), vload(x, m0 + 1, k), vload(x, m0 + 2, k)
        w = _load4(W, w0, last, k)
        lo0, lo1, lo2 = _fma4(x0, w, lo0), _fma4(x1, w, lo1), _fma4(x2, w, lo2)
        w = _load4(W, min(w0 + 4, last), last, k)
        hi0, hi1, hi2 = _fma4(x0, w, hi0), _fma4(x1, w, hi1), _fma4(x2, w, hi2)
    for i, (lo, hi) in enumerate(((lo0, hi0), (lo1, hi1), (lo2, hi2))):
        _store_lanes(y, m0 + i, n0, N, lo[0], lo[1], lo[2], lo[3])  # features past N: no lanes, nothing written
        _store_lanes(y, m0 + i, n0 + 4, N, hi[0], hi[1], hi[2], hi[3])


@njit(inline="always", cache=True)
def _zeros4():  # pragma: no cover (compiled)
    return (vzero(), vzero(), vzero(), vzero())


@njit(inline="always", cache=True)
def _load4(W, r, last, k):  # pragma: no cover (compiled)
    """W[r .. r + 3, k : k + 16] (rows past `last` read `last` again)."""
    return (vload(W, r, k), vload(W, min(r + 1, last), k), vload(W, min(r + 2, last), k), vload(W, min(r + 3, last), k))


@njit(inline="always", cache=True)
def _fma4(xv, w, a):  # pragma: no cover (compiled)
    """a[j] += xv w[j] in lanes for the four features j: one x vector against four weight vectors."""
    return vfma(xv, w[0], a[0]), vfma(xv, w[1], a[1]), vfma(xv, w[2], a[2]), vfma(xv, w[3], a[3])


WIDE = wide_registers()
"""Whether this process's kernels may use AVX-512's 32 registers of 16 floats (`lanes.wide_registers`,
read from the target numba compiles for): the blocks of 24 sums (`_block38`, `_block64`) and of 16
(`_block82`, `matmul8_*`) fit there. Where a register holds eight floats (AVX2, NEON) the same
blocks need twice the registers there are and spill on every step, so the products add their sums
in halves instead (`_block34`, `_quad2h`): on processor D (AMD EPYC, Zen 3, AVX2 only) SmolLM2's layer
products at 512 rows ran 22-29 GFLOP/s at 1 thread in the wide blocks."""


@njit(inline="always", cache=True)
def _half34(x, m0, W, r0, r1, r2, r3, h, p, ahead, k0, k1, a, b, c):  # pragma: no cover (compiled)
    """Lanes h .. h + 7 (h = 0 or HALF) of the steps k0 .. k1 of the 12 sums x[m0 + i] . W[r_j] (i < 3,
    j < 4), added on to a, b, c: ((a_00, .., a_03), (a_10, ..), (a_20, ..)), eight lanes each. Twelve
    accumulators, three x halves and one weight half: 16 registers of eight floats, AVX2's number.
    With `ahead`, the weight rows p .. p + 3 (the next block's) are asked for as it goes, a line a
    step."""
    a0, a1, a2, a3 = a
    b0, b1, b2, b3 = b
    c0, c1, c2, c3 = c
    for k in range(k0 + h, k1, LANES):
        if ahead:
            _prefetch_rows(W, p, 4, k - h)
        x0, x1, x2 = vload8(x, m0, k), vload8(x, m0 + 1, k), vload8(x, m0 + 2, k)
        w = vload8(W, r0, k)
        a0, b0, c0 = vfma8(x0, w, a0), vfma8(x1, w, b0), vfma8(x2, w, c0)
        w = vload8(W, r1, k)
        a1, b1, c1 = vfma8(x0, w, a1), vfma8(x1, w, b1), vfma8(x2, w, c1)
        w = vload8(W, r2, k)
        a2, b2, c2 = vfma8(x0, w, a2), vfma8(x1, w, b2), vfma8(x2, w, c2)
        w = vload8(W, r3, k)
        a3, b3, c3 = vfma8(x0, w, a3), vfma8(x1, w, b3), vfma8(x2, w, c3)
    return (a0, a1, a2, a3), (b0, b1, b2, b3), (c0, c1, c2, c3)


@njit(inline="always", cache=True)
def _zeros4h():  # pragma: no cover (compiled)
    return (vzero8(), vzero8(), vzero8(), vzero8())


@njit(inline="always", cache=True)
def _rows34(W, w0):  # pragma: no cover (compiled)
    """The weight rows of the block at w0 (a row past W's last reads the last again)."""
    last = W.shape[0] - 1
    return w0, min(w0 + 1, last), min(w0 + 2, last), min(w0 + 3, last)


@njit(inline="always", cache=True)
def _store34(y, m0, n0, lo, hi):  # pragma: no cover (compiled)
    """y[m0 + i, n0 + j] = the sum whose lanes 0 .. 7 are lo[i][j] and 8 .. 15 hi[i][j], folded as `lanes`
    folds, the features that exist."""
    N = y.shape[1]
    for i in range(3):
        a, b = lo[i], hi[i]
        _store_lanes(y, m0 + i, n0, N, vjoin(a[0], b[0]), vjoin(a[1], b[1]), vjoin(a[2], b[2]), vjoin(a[3], b[3]))


@njit(inline="always", cache=True)
def _block34(x, m0, W, w0, y, n0, p, ahead, k0, k1, part, i):  # pragma: no cover (compiled)
    """y[m0 .. m0 + 2, n0 .. n0 + 3] = x[m0 .. m0 + 2] W[w0 .. w0 + 3]^T over the columns k0 .. k1, the
    features that exist: the low halves of the 12 sums over those steps, then the high halves
    (`_half34`). They start from part[i .. i + 11] (lanes 0 .. 7 the low halves) unless k0 is the
    first column, and go back there unless k1 is past the last, where they are joined and folded
    into y as `lanes` folds (the same bits as `_block38`'s: each lane's chain runs on in order).
    With `ahead`, the low halves' pass asks for the weight rows p .. p + 3 (the next block's; the
    high halves read the same lines, in L1 by then)."""
    K, (r0, r1, r2, r3) = x.shape[1], _rows34(W, w0)
    lo = _half34(x, m0, W, r0, r1, r2, r3, 0, p, ahead, k0, k1, _kept4h(part, i, 0, k0), _kept4h(part, i + 4, 0, k0),
                 _kept4h(part, i + 8, 0, k0))
    hi = _half34(x, m0, W, r0, r1, r2, r3, HALF, p, False, k0, k1, _kept4h(part, i, HALF, k0),
                 _kept4h(part, i + 4, HALF, k0), _kept4h(part, i + 8, HALF, k0))
    if k1 < K:
        _keep34(part, i, lo, hi)
    else:
        _store34(y, m0, n0, lo, hi)


@njit(inline="always", cache=True)
def _keep34(part, i, lo, hi):  # pragma: no cover (compiled)
    """part[i .. i + 11] = `_block34`'s 12 sums between passes, halves joined in lanes order (what `_kept4h` reads back)."""
    for r in range(3):
        for j in range(4):
            vstore(part, i + 4 * r + j, 0, vjoin(lo[r][j], hi[r][j]))


@njit(inline="always", cache=True)
def _kept4h(part, i, h, k0):  # pragma: no cover (compiled)
    """Lanes h .. h + 7 of the four sums `_block34` keeps at part[i .. i + 3]; zeros at the first column."""
    if k0 == 0:
        return _zeros4h()
    return vload8(part, i, h), vload8(part, i + 1, h), vload8(part, i + 2, h), vload8(part, i + 3, h)


def cols34(K: int) -> int:
    """Columns a pass of `matmul_f32`'s and `matmul_q4`'s halves (`_block34`): all K (0) where a
    block's seven rows (three of x, four of W) fit three quarters of this machine's L1 data cache,
    else the fewest equal passes, whole steps of 16, that do."""
    fits = 3 * L1_BYTES // 4 // (7 * 4)
    if K <= fits:
        return 0
    passes = -(-K // fits)
    return -(-K // passes // LANES) * LANES


@njit(parallel=True, nogil=True, cache=True)
def matmul_f32(x, W, y, cols=0):  # pragma: no cover (compiled)
    """y = x W^T in blocks of 3 rows by 8 features, or 6 rows by 4 where eight weight rows do not
    fit `X_IN_L1`. x: (M, K) float32 with M a multiple of 3 (`padded_rows`); W: (N, K) float32; y:
    (M, N) float32, written.

    The kernel of a long batch (a prefill): 24 sums side by side (`_block38`, `_block64`), so each
    multiply-add costs under half a load, and the weight rows of a block (eight: 18 KB for K = 576)
    stay in the L1 cache while every block of rows passes over them (4 x 4 blocks, this kernel's
    first form, ran 68 GFLOP/s on one thread against 96 for 3 x 8, SmolLM2's layer shapes at 512
    rows, measured on processor B; torch's sgemm 131). Where eight rows do not fit (SmolLM2's down
    projection, K = 1536: 49 KB against a 48 KB L1), every block of rows read them from L2 again;
    four rows (24.6 KB) do, and six rows of x share them (512 x 1536 -> 576 at 1 thread, processor
    B, best of 15 and of 40 interleaved rounds on a busy host: 74 -> 95 and 62 -> 78 GFLOP/s).
    Each sum is added in `lanes` order, so every y[m, n] has the same bits as `matvec_f32`'s: the
    engine picks either by the batch alone. The first block of rows asks for the next block's
    weight rows as it goes; the others find the rows it read in the cache.

    cols: columns a pass where registers hold eight floats (`cols34`, which `product_f32` gives;
    0: all K). There a block's seven rows of SmolLM2's down projection (K = 1536: 42 KB) overflow
    processor D's 32 KB L1, and each block of rows read them from L2 again; in two passes of 768
    columns, each block's 12 sums waiting in `part` between passes in `lanes` order (the same
    bits), 1 thread on processor D: the weight in L2, 513 rows 38 -> 59-60 GFLOP/s and 9 rows (a
    batch of 8) 39 -> 52; 30 weights from memory at 9 rows, 458-480 -> 385-389 us a call (passes
    of 512 columns: 54-57 GFLOP/s in L2; of 384: 38-54). There a few rows from memory cost the
    reading plus the arithmetic, not the larger of the two: 3, 6, 9 rows of a 1536 x 576 weight
    from memory 306, 400, 475 us, each block of rows adding its time in L2; asking for the next
    rows spread over the passes, two blocks ahead, into L2 or for half the lines changed nothing."""
    M, K = x.shape
    N = W.shape[0]
    if not WIDE:  # halves: 3 rows x 4 features (`_block34`), in passes of `cols` columns
        rows, blocks = _rows_in_l2(K), (N + 3) // 4
        cols = cols or K
        part = np.empty((rows // ROWS * blocks * 12 if cols < K else 1, LANES), dtype=np.float32)
        for mc in range(0, M, rows):
            for k0 in range(0, K, cols):
                for nb in prange(blocks):
                    for m0 in range(mc, min(mc + rows, M), ROWS):
                        i = ((m0 - mc) // ROWS * blocks + nb) * 12  # this block's 12 sums in `part`
                        _block34(x, m0, W, nb * 4, y, nb * 4, nb * 4 + 4, m0 == mc, k0, min(k0 + cols, K), part, i)
        return
    if 8 * 4 * K <= X_IN_L1:
        rows = _rows_in_l2(K)
        for mc in range(0, M, rows):  # a chunk of x's rows stays in the L2 cache while every block reads it
            for nb in prange((N + 7) // 8):
                n0 = nb * 8
                p = min(n0 + 8, N - 1)
                for m0 in range(mc, min(mc + rows, M), ROWS):
                    _block38(x, m0, W, n0, y, n0, p, m0 == mc)
        return
    rows = max(6, _rows_in_l2(K) // 6 * 6)
    for mc in range(0, M, rows):
        for nb in prange((N + 3) // 4):
            n0 = nb * 4
            p = min(n0 + 4, N - 1)
            for m0 in range(mc, min(mc + rows, M), 6):
                _block64(x, m0, W, n0, y, n0, p, m0 == mc)


@njit(inline="always", cache=True)
def _block64(x, m0, W, w0, y, n0, p, ahead):  # pragma: no cover (compiled)
    """y[m0 .. m0 + 5, n0 .. n0 + 3] = x[m0 .. m0 + 5] W[w0 .. w0 + 3]^T, the rows and features that
    exist (a row past x's last reads the last again and is never stored, as a feature past W's):
    `_block38`'s 24 sums in `lanes` order, each weight vector serving six rows and each x vector four
    features. With `ahead`, the weight rows p .. p + 3 (the next block's) are asked for as it goes."""
    M, N, K, last = x.shape[0], y.shape[1], x.shape[1], W.shape[0] - 1
    r3, r4, r5 = min(m0 + 3, M - 1), min(m0 + 4, M - 1), min(m0 + 5, M - 1)  # M is a multiple of 3
    a0, a1, a2 = _zeros4(), _zeros4(), _zeros4()  # a_i: row m0 + i, features n0 .. n0 + 3
    a3, a4, a5 = _zeros4(), _zeros4(), _zeros4()
    for k in range(0, K, LANES):
        if ahead:
            _prefetch_rows(W, p, 4, k)
        w = _load4(W, w0, last, k)
        a0, a1, a2 = _fma4(vload(x, m0, k), w, a0), _fma4(vload(x, m0 + 1, k), w, a1), _fma4(vload(x, m0 + 2, k), w, a2)
        a3, a4, a5 = _fma4(vload(x, r3, k), w, a3), _fma4(vload(x, r4, k), w, a4), _fma4(vload(x, r5, k), w, a5)
    for i, a in enumerate((a0, a1, a2, a3, a4, a5)):
        if m0 + i < M:
            _store_lanes(y, m0 + i, n0, N, a[0], a[1], a[2], a[3])


X_IN_L2 = (cache_bytes(2) or 2 << 20) // 4
"""Bytes of x's rows that `matmul_f32` and `matmul_q4` pass over a block of weight rows at a time:
a quarter of this machine's L2 cache (`machine.cache_bytes`; 512 KB of 2 MB on processor B). A
512-token prefill's x is 1.2 MB (K = 576) to 3.1 MB (K = 1536): taken whole, every block of eight
weight rows streamed it from the L3 cache. In chunks that stay in L2 (225 and 84 rows), SmolLM2's
gate and up projections ran 107 -> 118 GFLOP/s and the down projection 71 -> 78 at 1 thread
(processor B, best of 14 interleaved rounds; 256 KB and 1 MB chunks were slower)."""


@njit(inline="always", cache=True)
def _rows_in_l2(K):  # pragma: no cover (compiled)
    """Rows of K float32 columns in X_IN_L2 bytes, a multiple of ROWS (at least ROWS)."""
    return max(ROWS, X_IN_L2 // (4 * K) // ROWS * ROWS)


L1_BYTES = cache_bytes(1) or 48 * 1024
"""This machine's L1 data cache per core, read once (`machine.cache_bytes`; 48 KB where the system
does not say)."""

X_IN_L1 = L1_BYTES // 2
"""Bytes of x that `matmul8_f32` keeps in the L1 cache beside the weight rows: half of this machine's
L1 data cache (read from the system, `machine.cache_bytes`; 48 KB on processors A and B). Up to
this, eight rows of x are read from L1 for every pair of features; past it, `matmul_f32`'s blocks
win (SmolLM2's down projection, K = 1536, on a 48 KB L1: 4.8 against 5.5 ms)."""


@njit(inline="always", cache=True)
def _fma8(x, k, w, a):  # pragma: no cover (compiled)
    """One step of sixteen columns k .. k + 15 for x's eight rows against one weight vector w:
    a[m] += x[m, k : k + 16] w in lanes, a: eight accumulators -> a."""
    return (vfma(vload(x, 0, k), w, a[0]), vfma(vload(x, 1, k), w, a[1]), vfma(vload(x, 2, k), w, a[2]),
            vfma(vload(x, 3, k), w, a[3]), vfma(vload(x, 4, k), w, a[4]), vfma(vload(x, 5, k), w, a[5]),
            vfma(vload(x, 6, k), w, a[6]), vfma(vload(x, 7, k), w, a[7]))


@njit(inline="always", cache=True)
def _zeros8():  # pragma: no cover (compiled)
    return (vzero(), vzero(), vzero(), vzero(), vzero(), vzero(), vzero(), vzero())


@njit(inline="always", cache=True)
def _store82(y, n0, a, b):  # pragma: no cover (compiled)
    """y[m, n0] = vsum(a[m]), y[m, n0 + 1] = vsum(b[m]) for m = 0 .. 7, the features that exist.
    The sixteen folds side by side (`lanes.vstore_sums82`, the same bits) rather than one `vsum`
    after another: batch 8, 1 thread, processor E, the weight in L2 (best of 6 interleaved
    processes on a noisy host), int4 256 x 576 34.6 -> 32.9 us, 576 x 576 77.9 -> 65.9, f32
    576 x 576 68.8 -> 65.0; SmolLM2's weights from memory, 30 of each shape: within the noise (the
    store is once a block, its share shrinks as K grows)."""
    if n0 + 1 < y.shape[1]:
        vstore_sums82(y, n0, a, b)
        return
    for m in range(8):  # an odd N's last block: its one feature
        y[m, n0] = vsum(a[m])


@njit(inline="always", cache=True)
def _kept8(part, i):  # pragma: no cover (compiled)
    """Eight lanes vectors kept in part rows i .. i + 7 (part: (16, 16) float32)."""
    return (vload(part, i, 0), vload(part, i + 1, 0), vload(part, i + 2, 0), vload(part, i + 3, 0),
            vload(part, i + 4, 0), vload(part, i + 5, 0), vload(part, i + 6, 0), vload(part, i + 7, 0))


@njit(inline="always", cache=True)
def _keep8(part, i, a):  # pragma: no cover (compiled)
    """Keep the eight lanes vectors a in part rows i .. i + 7 (`_kept8` reads them back)."""
    for m in range(8):
        vstore(part, i + m, 0, a[m])


@njit(inline="always", cache=True)
def _keep_or_store82(part, nb, y, n0, a, b, keep):  # pragma: no cover (compiled)
    """Block nb's 16 sums: kept in part[nb] for the next pass (`_keep8`), or, after the last, stored."""
    if keep:
        _keep8(part[nb], 0, a)
        _keep8(part[nb], 8, b)
    else:
        _store82(y, n0, a, b)


@njit(inline="always", cache=True)
def _block82(x, W, r0, r1, n0, far, c0, c1, a, b):  # pragma: no cover (compiled)
    """Columns c0 .. c1 - 1 of the 16 sums x W[r0, r1]^T, added into their lanes a, b (a[m]: row m,
    feature n0; b[m]: row m, feature n0 + 1) in `lanes` order -> (a, b). Each weight vector serves
    x's eight rows; as the block goes, the next block's two rows are asked for into L1 and the rows
    far ahead of this block's into L2, a line of each a step."""
    for k in range(c0, c1, LANES):
        _prefetch_rows(W, n0 + 2, 2, k)
        if far > 0:
            _prefetch_rows(W, n0 + far, 2, k, True)
        a, b = _fma8(x, k, vload(W, r0, k), a), _fma8(x, k, vload(W, r1, k), b)  # x's loads shared
    return a, b


@njit(inline="always", cache=True)
def _quad2h(x0, x1, x2, x3, W, r0, r1, h, p, f, c0, c1, acc):  # pragma: no cover (compiled)
    """Lanes h .. h + 7 (h = 0 or HALF) of the steps c0 .. c1 of the eight sums x[m] . W[r0] and
    x[m] . W[r1] (m: the four rows x0 .. x3, each a (1, K) view, `_rows8`), added on to acc
    (a0 .. a3 for r0, b0 .. b3 for r1, eight lanes each) -> acc. Eight accumulators, two weight
    halves and an x half: 11 of AVX2's 16 registers, and six loads for eight multiply-adds. Row p
    (p >= 0) is asked for into L1 and row f (f >= 0) into L2, a line a step, as `_block82` asks."""
    a0, a1, a2, a3, b0, b1, b2, b3 = acc
    for k in range(c0 + h, c1, LANES):
        if p >= 0:
            _prefetch_rows(W, p, 1, k - h)
        if f >= 0:
            _prefetch_rows(W, f, 1, k - h, True)
        v, w = vload8(W, r0, k), vload8(W, r1, k)
        x = vload8(x0, 0, k)
        a0, b0 = vfma8(x, v, a0), vfma8(x, w, b0)
        x = vload8(x1, 0, k)
        a1, b1 = vfma8(x, v, a1), vfma8(x, w, b1)
        x = vload8(x2, 0, k)
        a2, b2 = vfma8(x, v, a2), vfma8(x, w, b2)
        x = vload8(x3, 0, k)
        a3, b3 = vfma8(x, v, a3), vfma8(x, w, b3)
    return a0, a1, a2, a3, b0, b1, b2, b3


@njit(inline="always", cache=True)
def _rows8(x):  # pragma: no cover (compiled)
    """x's eight rows as eight (1, K) views: each load is then its row's own pointer plus the column,
    where x[m, k] had the compiler rebuild the eight addresses from one every step (processor E
    running the AVX2 code, SmolLM2's layers at batch 8 from memory: 27.5-28.1 -> 25.8-26.3 ms at
    1 thread, 15.0-15.3 -> 14.3-14.7 at 2; a row-interleaved copy of x was between the two)."""
    return x[0:1], x[1:2], x[2:3], x[3:4], x[4:5], x[5:6], x[6:7], x[7:8]


@njit(inline="always", cache=True)
def _zeros8h():  # pragma: no cover (compiled)
    return (vzero8(), vzero8(), vzero8(), vzero8(), vzero8(), vzero8(), vzero8(), vzero8())


@njit(inline="always", cache=True)
def _kept42h(part, nb, i, h, c0):  # pragma: no cover (compiled)
    """Lanes h .. h + 7 of the sums of x's rows i .. i + 3 with block nb's two features, kept in
    part[nb] (`_keep8`: rows 0 .. 7 the first feature's, 8 .. 15 the second's); zeros at the first
    column (where a single pass has no part[nb]), else each feature's four read by `_kept4h`."""
    if c0 == 0:
        return _zeros8h()
    kept = part[nb]
    return _kept4h(kept, i, h, c0) + _kept4h(kept, i + 8, h, c0)


@njit(inline="always", cache=True)
def _block82h(x, W, y, n0, r1, far, c0, c1, part, nb):  # pragma: no cover (compiled)
    """`_block82` where registers hold eight floats: columns c0 .. c1 - 1 of the 16 sums of block nb
    (features n0 and r1), going on from part[nb] unless c0 is the first column, in four passes over
    the two rows (`_quad2h`: rows 0 .. 3, then 4 .. 7, low lanes, then high; the rows in L1 after
    the first), then kept or stored (`_keep_or_store82`). Each lane's chain runs on in order: the
    same bits."""
    x0, x1, x2, x3, x4, x5, x6, x7 = _rows8(x)
    f = n0 + far if far > 0 else -1  # the first of the two rows far ahead asked into L2 (none when far is 0)
    f1 = f + 1 if f >= 0 else -1
    lo0 = _quad2h(x0, x1, x2, x3, W, n0, r1, 0, n0 + 2, f, c0, c1, _kept42h(part, nb, 0, 0, c0))  # rows 0 .. 3
    lo4 = _quad2h(x4, x5, x6, x7, W, n0, r1, 0, n0 + 3, f1, c0, c1, _kept42h(part, nb, 4, 0, c0))  # rows 4 .. 7
    hi0 = _quad2h(x0, x1, x2, x3, W, n0, r1, HALF, -1, -1, c0, c1, _kept42h(part, nb, 0, HALF, c0))
    hi4 = _quad2h(x4, x5, x6, x7, W, n0, r1, HALF, -1, -1, c0, c1, _kept42h(part, nb, 4, HALF, c0))
    a = (vjoin(lo0[0], hi0[0]), vjoin(lo0[1], hi0[1]), vjoin(lo0[2], hi0[2]), vjoin(lo0[3], hi0[3]),
         vjoin(lo4[0], hi4[0]), vjoin(lo4[1], hi4[1]), vjoin(lo4[2], hi4[2]), vjoin(lo4[3], hi4[3]))
    b = (vjoin(lo0[4], hi0[4]), vjoin(lo0[5], hi0[5]), vjoin(lo0[6], hi0[6]), vjoin(lo0[7], hi0[7]),
         vjoin(lo4[4], hi4[4]), vjoin(lo4[5], hi4[5]), vjoin(lo4[6], hi4[6]), vjoin(lo4[7], hi4[7]))
    _keep_or_store82(part, nb, y, n0, a, b, c1 < W.shape[1])


@njit(parallel=True, nogil=True, cache=True)
def matmul8_f32(x, W, y, far=0, cols=0):  # pragma: no cover (compiled)
    """y = x W^T for a batch of eight rows in blocks of 8 rows x 2 features (`_block82`). x: (8, K)
    float32 (`padded_rows(x, 8)`); W: (N, K) float32; y: (8, N) float32, written.

    The kernel of a batch of 8 decodes: one pass over the weight, each weight vector serving all
    eight rows while the rows of the next block stream in, so memory and arithmetic overlap
    (SmolLM2 at batch 8, 1 thread: the layers' products 18.6 -> 16.0 ms a step against
    `matmul_f32`'s two passes of four rows, whose second pass left the memory idle). The same
    `lanes` sums as every other kernel, so the same bits. `product_f32` sends it five to eight rows
    while their eight rows of x fit `X_IN_L2`: on processor E (32 KB L1, so SmolLM2's 18 KB of x is
    over `X_IN_L1`) 8 of SmolLM2's layers at batch 8 took 16.2 ms through `matmul_f32` and 12.0
    through this kernel at 1 thread, 9.7 and 7.3 at 2 (best of 7 interleaved rounds); on processor
    B the gate made no difference (1.00x, 1.01x). Why two features a block, not three (24 of the 32
    registers): on processor E, SmolLM2's layers' weights from memory at batch 8, three ran 14.0 ms
    against 13.9 at 2 threads and half as fast at 1.

    far: weight rows ahead to ask into L2 as well (`_prefetch_rows`; how many is measured,
    `eight_rows_f32`), a line a step rather than a row at a block's start: on processor E, 1
    thread, 30 weights from memory, 576 columns 67 -> 78 GFLOP/s, 1536 columns 45 -> 53; SmolLM2
    f32 at batch 8, 190 -> 213 tok/s (best of 5 interleaved rounds; asking whole rows had taken it
    from 113 to 158-174 against asking nothing ahead).

    cols: columns a pass (0: all K; `x_cols`). Where x's eight rows overflow the L1 cache, each
    pair of weight rows would find x's columns gone from L1 again; in passes of `cols` columns x's
    share stays there while every pair reads it, and each pair's 16 sums wait in `part` between
    passes, still in `lanes` order, so the same bits (SmolLM2's down projection, K = 1536, in 3
    passes of 512 columns on processor E, 1 thread, 30 weights from memory: 56 -> 64-66 GFLOP/s;
    in the model, with the asks a line a step, 296 -> 190 us a call). far then counts in passes'
    rows: the same bytes ahead.

    Where registers hold eight floats (AVX2, `WIDE` False) the 16 sums of a block do not fit: they
    go in four passes over the block's two rows instead (`_block82h`), each eight half-sums of four
    rows of x, lanes 0 .. 7 over the pass, then 8 .. 15, the rows in L1 after the first; each
    lane's chain unchanged, so the same bits. Measured on processor E under the code an AVX2
    processor gets (NUMBA_CPU_NAME znver3, AVX2 features only, `benchmarks/bench_targets.py`'s
    way), SmolLM2's layers' weights from memory at batch 8:
      - before, through `matmul_f32`'s 3-row blocks (nine rows, three blocks over each weight row):
        45.4 ms at 1 thread, 23.6 at 2; the whole f32 step 71.7 and 42.2-45.8 ms;
      - one feature's eight half-sums a pass (nine loads for eight multiply-adds): 27.8 and 15.7 ms
        (asking 16 KB ahead into L2 is most of it: 43.3 ms without);
      - four rows by two features a pass (`_quad2h`: six loads for eight), in cache 50-69 -> 63-79
        GFLOP/s on SmolLM2's shapes at 1 thread; the f32 step 43.5-43.7 -> 40.9-41.9 ms at 1
        thread (best of 5 rounds, two interleaved processes each), the same at 2 (25.6-27.7 ms).
        Three features a pass (twelve sums, all 16 registers) ran 56-59 GFLOP/s in cache."""
    N, K = W.shape
    cols = cols or K
    far = far * K // cols
    part = np.empty(((N + 1) // 2 if cols < K else 1, 16, LANES), dtype=np.float32)
    for c0 in range(0, K, cols):
        c1 = min(c0 + cols, K)
        for nb in prange((N + 1) // 2):
            n0 = nb * 2  # an odd N's last block repeats its feature (never stored)
            r1 = min(n0 + 1, N - 1)
            if not WIDE:  # registers of eight floats: the block's sums in halves
                _block82h(x, W, y, n0, r1, far, c0, c1, part, nb)
                continue
            if c0 == 0:
                a, b = _zeros8(), _zeros8()
            else:
                a, b = _kept8(part[nb], 0), _kept8(part[nb], 8)
            a, b = _block82(x, W, n0, r1, n0, far, c0, c1, a, b)
            _keep_or_store82(part, nb, y, n0, a, b, c1 < K)


def x_cols(K: int) -> int:
    """Columns of x's eight rows `matmul8_f32` reads in a pass: all K (0) where they fit this
    machine's L1 data cache (`L1_BYTES`) with room beside them, else the fewest equal
    passes, whole steps of 16, of at most `X_IN_L1` bytes each."""
    if 8 * 4 * K < L1_BYTES:
        return 0
    passes = -(-8 * 4 * K // X_IN_L1)
    return -(-K // passes // LANES) * LANES


def _eight_rows(M: int, K: int) -> bool:
    """Whether a batch of M rows of K columns goes through an eight-row kernel (`matmul8_*`, x
    padded to 8 rows): five to eight rows, whose eight rows of x fit `X_IN_L2`."""
    return 4 < M <= 8 and 8 * 4 * K <= X_IN_L2


@njit(inline="always", cache=True)
def _scale(f16, S, r, grp):  # pragma: no cover (compiled)
    """The scale s of row r's group grp in all 16 lanes."""
    return vsplat(f16[S[r, grp]])


@njit(inline="always", cache=True)
def _nibble_of(grp, half, c):  # pragma: no cover (compiled)
    """Where column c of group grp lies in `quant.to_planar`'s layout (half = group / 2): (byte,
    shift), the shift 0 for a byte's low nibble (c < half), 4 for its high one."""
    if c >= half:
        return grp * half + c - half, 4
    return grp * half + c, 0


@njit(inline="always", cache=True)
def _q4_step(x, m, k, P, b, shift, r0, r1, r2, r3, s0, s1, s2, s3, a0, a1, a2, a3):  # pragma: no cover
    """One step of sixteen columns k .. k + 15 for four features: W_hat = (n - 8) s (exact,
    `lanes.vhat`) from the nibbles of bytes b .. b + 15 of rows r0 .. r3, added into their lanes
    -> (a0, a1, a2, a3)."""
    xv = vload(x, m, k)
    return (vfma(xv, vhat(P, r0, b, shift, s0), a0), vfma(xv, vhat(P, r1, b, shift, s1), a1),
            vfma(xv, vhat(P, r2, b, shift, s2), a2), vfma(xv, vhat(P, r3, b, shift, s3), a3))


Q4_AHEAD = 8
"""Weight rows ahead of the block in use that `matvec_q4` asks for (two blocks, 2.3 KB for K = 576).
Without it the one-row int4 product waited for memory between its bursts of arithmetic: SmolLM2's
30 layers at 1 thread on processor B, 10.3 ms without, 6.9 with 8 rows ahead (4: 8.5, 16: 8.0,
32: 11.2; with the weights in the L2 cache, 6.1): the arithmetic now hides the reading."""


@njit(parallel=True, nogil=True, cache=True)
def matvec_q4(x, P, S, f16, y):  # pragma: no cover (compiled)
    """y = x W_hat^T one row at a time, straight from the packed nibbles (section 2.5): the int4
    twin of `matvec_f32`, for a group size that is a multiple of 32.

    x: (M, K) float32; P: (N, K / 2) uint8 in the kernel layout of `quant.to_planar`; S: (N, G)
    uint16, the f16 scales; f16: (65536,) float32, every f16 widened; y: (M, N) float32, written.

    Each step turns sixteen stored nibbles n into W_hat = n s - 8 s with one fused multiply-add
    (exact: n s and 8 s fit a float32, and so does q s, their difference) and adds x W_hat into
    the same lanes as `matvec_f32` would: the int4 product of a row is the float32 product on
    W_hat, bit for bit, while reading a seventh of its bytes. Nothing is widened into memory."""
    M, K = x.shape
    N, G = S.shape
    g = K // G
    half = g // 2
    if not WIDE:  # registers of eight floats: two features a pass (`_q4_pair`)
        for nb in prange((N + 1) // 2):
            n0 = nb * 2
            for m in range(M):
                a0, a1 = _q4_pair(x, m, P, S, f16, n0, min(n0 + 1, N - 1))
                vstore_few(y, m, n0, min(2, N - n0), vsum4(a0, a1, a0, a1))
        return
    for nb in prange((N + 3) // 4):
        n0, r0, r1, r2, r3 = _four_features(nb, N)
        for m in range(M):
            a0, a1, a2, a3 = vzero(), vzero(), vzero(), vzero()
            for grp in range(G):
                _prefetch_rows(P, n0 + Q4_AHEAD, 4, grp * half)
                s0 = _scale(f16, S, r0, grp)
                s1 = _scale(f16, S, r1, grp)
                s2 = _scale(f16, S, r2, grp)
                s3 = _scale(f16, S, r3, grp)
                if half == LANES:  # groups of 32: one run of 16 bytes, its low nibbles then its high ones
                    b, k = grp * half, grp * g  # (written out so the compiler loads the bytes once for both)
                    a0, a1, a2, a3 = _q4_step(x, m, k, P, b, 0, r0, r1, r2, r3, s0, s1, s2, s3,
                                              a0, a1, a2, a3)
                    a0, a1, a2, a3 = _q4_step(x, m, k + LANES, P, b, 4, r0, r1, r2, r3, s0, s1, s2, s3,
                                              a0, a1, a2, a3)
                    continue
                for c in range(0, g, LANES):  # the group's columns in order: low nibbles, then high
                    b, shift = _nibble_of(grp, half, c)  # of the step's first column
                    a0, a1, a2, a3 = _q4_step(x, m, grp * g + c, P, b, shift, r0, r1, r2, r3,
                                              s0, s1, s2, s3, a0, a1, a2, a3)
            _store_lanes(y, m, n0, N, a0, a1, a2, a3)


@njit(inline="always", cache=True)
def _q4_pair(x, m, P, S, f16, r0, r1):  # pragma: no cover (compiled)
    """Row m of x against the int4 rows r0, r1 (groups of a multiple of 32): their two sums in lanes,
    not yet folded, as `matvec_q4`'s four-feature pass adds them. Four features hold 8 sums, 8
    scales and 8 unpacked nibble vectors of eight floats, twice AVX2's 16 registers: on processor D
    (Zen 3) that pass spilled on every step; two do not. The rows Q4_AHEAD past r0 asked for.
    There, 1 thread, SmolLM2's shapes run 9-12 G weights/s, as fast from memory as from L2: bound
    by its instructions (about 3.7 weights a cycle). Three or four rows a pass, the nibbles split
    on bytes before widening, or n - 8 made from exponent bits (exact) instead of a convert, each
    tried with the same bits, were no faster (best of 200 calls, interleaved)."""
    G = S.shape[1]
    half = x.shape[1] // G // 2
    a0, a1 = vzero(), vzero()
    for grp in range(G):
        _prefetch_rows(P, r0 + Q4_AHEAD, 2, grp * half)
        s0, s1 = _scale(f16, S, r0, grp), _scale(f16, S, r1, grp)
        if half == LANES:  # groups of 32: one run of 16 bytes, low nibbles then high (its bytes loaded once)
            b, k = grp * half, grp * 2 * half
            xv = vload(x, m, k)
            a0, a1 = vfma(xv, vhat(P, r0, b, 0, s0), a0), vfma(xv, vhat(P, r1, b, 0, s1), a1)
            xv = vload(x, m, k + LANES)
            a0, a1 = vfma(xv, vhat(P, r0, b, 4, s0), a0), vfma(xv, vhat(P, r1, b, 4, s1), a1)
            continue
        for c in range(0, half, LANES):  # the group's columns in order: the low nibbles, then the high
            b, k = grp * half + c, grp * 2 * half + c
            xv = vload(x, m, k)
            a0, a1 = vfma(xv, vhat(P, r0, b, 0, s0), a0), vfma(xv, vhat(P, r1, b, 0, s1), a1)
        for c in range(0, half, LANES):
            b, k = grp * half + c, grp * 2 * half + half + c
            xv = vload(x, m, k)
            a0, a1 = vfma(xv, vhat(P, r0, b, 4, s0), a0), vfma(xv, vhat(P, r1, b, 4, s1), a1)
    return a0, a1


@njit(parallel=True, nogil=True, cache=True)
def matmul8_q4(x, P, S, f16, y):  # pragma: no cover (compiled)
    """y = x W_hat^T for a batch of eight rows, straight from the nibbles: `matmul8_f32`'s blocks of
    8 rows x 2 features, each step's sixteen values of W_hat made by `matvec_q4`'s fused multiply-add
    as they are read and used by all eight rows, never stored. The same sums, so the same bits as
    the float32 product on W_hat. x: (8, K) float32 (`padded_rows(x, 8)`); P, S, f16 as in
    `matvec_q4` (a group size that is a multiple of 32); y: (8, N) float32, written.

    The rows two and three blocks ahead are asked for as a block goes: SmolLM2's 30 layers at batch
    8, 1 thread, processor B, best of 12 interleaved rounds: 39.5 ms without, 37.5 asking 4 rows
    ahead (16 rows ahead: 40.5).

    It takes eight rows of x up to `X_IN_L2`, not `X_IN_L1` as `matmul8_f32` then did: unpacking the
    nibbles leaves time to read x from L2, and the tiles `matmul_q4` would widen instead miss L1 as
    well. SmolLM2's down projection (K = 1536, x 48 KB) at batch 8, processor B: 299 -> 216 us at 1
    thread, 169 -> 121 at 2 (30 weights in turn, best of 10); the whole model at batch 8, medians of
    10 interleaved rounds, 59.2 -> 47.6 ms a step at 1 thread and 45.0 -> 41.4 at 2, the same bits.
    (The f32 model was unchanged by the same move on B, 1.00x and 1.01x; on processor E, with a 32 KB
    L1 that eight rows of SmolLM2's x (18 KB) overflow, it made the f32 products faster, so every
    eight-row kernel now takes this gate: `_eight_rows`.)"""
    K = x.shape[1]
    N, G = S.shape
    g = K // G
    half = g // 2
    for nb in prange((N + 1) // 2):
        n0 = nb * 2
        r1 = min(n0 + 1, N - 1)  # an odd N's last block repeats its feature (never stored)
        a, b = _zeros8(), _zeros8()
        for grp in range(G):
            _prefetch_rows(P, n0 + 4, 4, grp * half)  # rows two and three blocks ahead
            s0 = _scale(f16, S, n0, grp)
            s1 = _scale(f16, S, r1, grp)
            for c in range(0, g, 2 * LANES if half == LANES else LANES):  # the group's columns in order
                (byte, shift), k = _nibble_of(grp, half, c), grp * g + c
                a = _fma8(x, k, vhat(P, n0, byte, shift, s0), a)
                b = _fma8(x, k, vhat(P, r1, byte, shift, s1), b)
                if half == LANES:  # groups of 32: the high nibbles of the same 16 bytes, loaded once
                    a = _fma8(x, k + LANES, vhat(P, n0, byte, 4, s0), a)
                    b = _fma8(x, k + LANES, vhat(P, r1, byte, 4, s1), b)
        _store82(y, n0, a, b)


Q8_AHEAD = 8
"""Weight rows ahead of the block in use that `matvec_q8` asks for (two blocks, 4.6 KB for K = 576).
SmolLM2's int8 head (49152 x 576), one row, 1 thread, processor B, best of 12 interleaved rounds:
12.1 ms without asking, 2.15 with 4 rows ahead, 1.89 with 8, 1.92 with 16, 1.88 with 32."""


@njit(parallel=True, nogil=True, cache=True)
def matvec_q8(x, Q, S, f16, y, far=0):  # pragma: no cover (compiled)
    """y = x W_hat^T straight from int8 weights, W_hat = q s per group of g columns (`q8.Q8Linear`,
    the int4 model's LM head): `matvec_f32`'s four features a pass, each step's sixteen W_hat made by
    `lanes.vq8` (exact) as they are read. So y has the bits of the float32 product on W_hat.

    x: (M, K) float32 (any M: every row in turn against the four rows in the L1 cache); Q: (N, K)
    int8; S: (N, G) uint16, the f16 scales, K / G a multiple of 16; f16: (65536,) float32, every f16
    widened; y: (M, N) float32, written; far: rows ahead asked for into L2 (`_ask_far`, `AHEAD`).

    Asking 16 or 32 KB ahead took SmolLM2's int8 head (49152 x 576) from 3.2 to 1.9 ms at 1 thread
    on processor E (1.5 -> 1.2 at 2; best of 10 interleaved rounds, three runs): the four rows'
    interleaved reads left the hardware's own prefetcher behind, and the L1 look-ahead alone
    (`Q8_AHEAD`) comes too late to hide memory. Held in L2, the same pass takes 2.0 ms: now bound
    by arithmetic."""
    N = Q.shape[0]
    for nb in prange((N + 3) // 4):
        n0, r0, r1, r2, r3 = _four_features(nb, N)
        for j in range(4):
            _ask_far(Q, n0 + j, far)
        for m in range(x.shape[0]):
            a0, a1, a2, a3 = _q8_four(x, m, Q, S, f16, n0, r0, r1, r2, r3)
            _store_lanes(y, m, n0, N, a0, a1, a2, a3)


@njit(inline="always", cache=True)
def _q8_four(x, m, Q, S, f16, n0, r0, r1, r2, r3):  # pragma: no cover (compiled)
    """Row m of x against the int8 rows r0 .. r3: their four sums in lanes, not yet folded; the rows
    Q8_AHEAD past n0 asked for as the pass goes."""
    G = S.shape[1]
    g = x.shape[1] // G
    a0, a1, a2, a3 = vzero(), vzero(), vzero(), vzero()
    for grp in range(G):
        _prefetch_rows(Q, n0 + Q8_AHEAD, 4, grp * g)
        s0, s1 = _scale(f16, S, r0, grp), _scale(f16, S, r1, grp)
        s2, s3 = _scale(f16, S, r2, grp), _scale(f16, S, r3, grp)
        for k in range(grp * g, grp * g + g, LANES):
            xv = vload(x, m, k)
            a0, a1 = vfma(xv, vq8(Q, r0, k, s0), a0), vfma(xv, vq8(Q, r1, k, s1), a1)
            a2, a3 = vfma(xv, vq8(Q, r2, k, s2), a2), vfma(xv, vq8(Q, r3, k, s3), a3)
    return a0, a1, a2, a3


@njit(parallel=True, nogil=True, cache=True)
def matvec1_q8(x, Q, S, f16, y, far=0):  # pragma: no cover (compiled)
    """`matvec_q8` one output feature a pass (`matvec1_f32`'s way, `one_row` picks): the same
    arguments, the same sums, so the same bits (tested). SmolLM2's int8 head on processor E, best of
    9 interleaved rounds: 3.61 -> 2.48 ms at 1 thread, 1.75 -> 1.57 at 2."""
    G = S.shape[1]
    g = x.shape[1] // G
    for n in prange(Q.shape[0]):
        _ask_far(Q, n, far)
        for m in range(x.shape[0]):
            a = vzero()
            for grp in range(G):
                s = _scale(f16, S, n, grp)
                for k in range(grp * g, grp * g + g, LANES):
                    a = vfma(vload(x, m, k), vq8(Q, n, k, s), a)
            y[m, n] = vsum(a)


@njit(inline="always", cache=True)
def _q8_rows8(x, Q, S, f16, r, h):  # pragma: no cover (compiled)
    """Lanes h .. h + 7 (h = 0 or HALF) of every step of x's eight rows against int8 row r: eight
    halves, each W_hat half (`lanes.vq8h`) made once for the eight rows."""
    G = S.shape[1]
    g = x.shape[1] // G
    a0, a1, a2, a3, a4, a5, a6, a7 = _zeros8h()
    for grp in range(G):
        s = vsplat8(f16[S[r, grp]])
        for k in range(grp * g + h, grp * g + g, LANES):
            w = vq8h(Q, r, k, s)
            a0, a1 = vfma8(vload8(x, 0, k), w, a0), vfma8(vload8(x, 1, k), w, a1)
            a2, a3 = vfma8(vload8(x, 2, k), w, a2), vfma8(vload8(x, 3, k), w, a3)
            a4, a5 = vfma8(vload8(x, 4, k), w, a4), vfma8(vload8(x, 5, k), w, a5)
            a6, a7 = vfma8(vload8(x, 6, k), w, a6), vfma8(vload8(x, 7, k), w, a7)
    return a0, a1, a2, a3, a4, a5, a6, a7


@njit(parallel=True, nogil=True, cache=True)
def matmul8_q8(x, Q, S, f16, y):  # pragma: no cover (compiled)
    """y = x W_hat^T for a batch of eight rows from int8 weights: `matmul8_f32`'s blocks of 8 rows x 2
    features, each W_hat vector (`lanes.vq8`) made once and used by all eight rows. The same sums, so
    the same bits as `matvec_q8`. x: (8, K) float32 (`padded_rows(x, 8)`); Q, S, f16 as in
    `matvec_q8`; y: (8, N) float32, written."""
    K = x.shape[1]
    N, G = S.shape
    g = K // G
    if not WIDE:  # registers of eight floats: one feature at a time, in halves (`_q8_rows8`)
        for n in prange(N):
            for k in range(0, K, 64):  # the row four ahead, a cache line at a time
                prefetch(Q, min(n + 4, N - 1), k)
            lo, hi = _q8_rows8(x, Q, S, f16, n, 0), _q8_rows8(x, Q, S, f16, n, HALF)
            for m in range(8):
                y[m, n] = vsum(vjoin(lo[m], hi[m]))
        return
    for nb in prange((N + 1) // 2):
        n0 = nb * 2
        r1 = min(n0 + 1, N - 1)  # an odd N's last block repeats its feature (never stored)
        a, b = _zeros8(), _zeros8()
        for grp in range(G):
            _prefetch_rows(Q, n0 + 4, 4, grp * g)  # the next two blocks
            s0, s1 = _scale(f16, S, n0, grp), _scale(f16, S, r1, grp)
            for k in range(grp * g, grp * g + g, LANES):
                a, b = _fma8(x, k, vq8(Q, n0, k, s0), a), _fma8(x, k, vq8(Q, r1, k, s1), b)
        _store82(y, n0, a, b)


@njit(inline="always", cache=True)
def _widen_tile(P, S, f16, n0, tile):  # pragma: no cover (compiled)
    """tile[j, :K] = W_hat[n0 + j] (exact), tile: (J, K16) float32 whose columns past K stay 0."""
    N, G = S.shape
    K = P.shape[1] * 2
    g = K // G
    half = g // 2
    for j in range(tile.shape[0]):
        r = n0 + j
        if g % (2 * LANES) == 0:
            for grp in range(G):
                s = _scale(f16, S, r, grp)
                for c in range(0, half, LANES):  # a run of 16 bytes: columns c .. (low), c + half .. (high)
                    b, k = grp * half + c, grp * g + c
                    vstore(tile, j, k, vhat(P, r, b, 0, s))
                    vstore(tile, j, k + half, vhat(P, r, b, 4, s))
        else:  # a group smaller than two steps (the tests' toy sizes): one nibble at a time
            for grp in range(G):
                s = f16[S[r, grp]]
                for b in range(half):
                    n = P[r, grp * half + b]
                    tile[j, grp * g + b] = np.float32((n & 15) - 8) * s
                    tile[j, grp * g + half + b] = np.float32((n >> 4) - 8) * s


@njit(parallel=True, nogil=True, cache=True)
def matmul_q4(x, P, S, f16, y, cols=0):  # pragma: no cover (compiled)
    """y = x W_hat^T for a batch: per block of eight output features, W_hat of the eight is widened
    into an 8 x K tile that stays in the thread's cache (nothing larger than eight rows of W_hat
    ever exists), then every block of 3 rows runs `matmul_f32`'s sums on it (`_block38`): the same
    bits as `matvec_q4`, and as the float32 product on W_hat. x: (M, K16) float32 with M a multiple
    of 3 and K16 the columns rounded up to 16 (`lanes_ready`); P, S, f16 as in `matvec_q4` (any group
    size); y: (M, N) float32, written. A batch of eight with groups of 32 goes through `matmul8_q4`
    instead (8-row blocks on a tile were tried first: 24.8 against 22.4 ms a pass at batch 8).
    Where registers hold eight floats the tile's blocks run in passes of `cols` columns (`cols34`,
    which `product_q4` gives), as `matmul_f32`'s do: SmolLM2's int4 down projection at 513 rows,
    1 thread, processor D, 28.5-29.1 -> 21.7-22.1 ms a call (31-32 -> 41-42 GFLOP/s)."""
    M, K16 = x.shape
    N = S.shape[0]
    rows = _rows_in_l2(K16)
    cols = cols or K16
    for mc in range(0, M, rows):  # as in `matmul_f32` (a tile is widened again for each chunk: 1/rows of its work)
        for nb in prange((N + 7) // 8):
            n0 = nb * 8
            tile = np.zeros((min(8, N - n0), K16), dtype=np.float32)
            _widen_tile(P, S, f16, n0, tile)
            if WIDE:
                for m0 in range(mc, min(mc + rows, M), ROWS):
                    _block38(x, m0, tile, 0, y, n0, 0, False)
                continue
            # halves: the tile's two blocks of four features (`_block34`), in passes of `cols` columns
            part = np.empty((rows // ROWS * 24 if cols < K16 else 1, LANES), dtype=np.float32)
            for k0 in range(0, K16, cols):
                k1 = min(k0 + cols, K16)
                for m0 in range(mc, min(mc + rows, M), ROWS):
                    i = (m0 - mc) // ROWS * 24  # the two blocks' 12 sums each in `part`
                    _block34(x, m0, tile, 0, y, n0, 0, False, k0, k1, part, i)
                    _block34(x, m0, tile, 4, y, n0 + 4, 0, False, k0, k1, part, i + 12)


@njit(inline="always", cache=True)
def _softmax(w, a, n):  # pragma: no cover (compiled)
    """w[a, :n] (float32) -> its softmax in place, the maximum subtracted first: the maximum and
    the exponentials sixteen at a time (`lanes.vmax`, `lanes.vexp`), their sum in `lanes` order like
    every other sum here (one chain of n scalar additions had made the softmax a quarter of a
    decode step's attention), and the division by it sixteen at a time too (the same bits as one
    value at a time: one float32 multiply each)."""
    if n >= LANES:  # the last step overlaps the one before it: a maximum does not mind
        tv = vload(w, a, 0)
        for j in range(LANES, n, LANES):
            tv = vmax(tv, vload(w, a, min(j, n - LANES)))
        top = vtop(tv)
    else:
        top = w[a, 0]
        for j in range(1, n):
            top = max(top, w[a, j])
    one, shift, total = vsplat(np.float32(1.0)), vsplat(-top), vzero()
    whole = n - n % LANES
    for j in range(0, whole, LANES):
        e = vexp(vfma(vload(w, a, j), one, shift))  # exp(w - top)
        vstore(w, a, j, e)
        total = vfma(one, e, total)  # + exp(w - top), rounded once
    if whole < n:  # the last, partial step: lanes past n read as 0, are never written, add 0
        m = n - whole
        vstore_part(w, a, whole, m, vexp(vfma(vload_part(w, a, whole, m), one, shift)))
        total = vfma(one, vload_part(w, a, whole, m), total)
    inv = vsplat(np.float32(1.0) / vsum(total))
    for j in range(0, whole, LANES):  # whole steps unmasked: a masked store is slow without AVX-512 (`_store`)
        vstore(w, a, j, vmul(vload(w, a, j), inv))
    if whole < n:
        m = n - whole
        vstore_part(w, a, whole, m, vmul(vload_part(w, a, whole, m), inv))


QUERY_TILE = 16
"""Queries of one sequence per attention task: each key read from the pool serves up to
QUERY_TILE x rep queries while it sits in the cache."""


@njit(inline="always", cache=True)
def _prefetch_block(rows, l2=False):  # pragma: no cover (compiled)
    """Ask for a block's keys or values, rows: (B, D) uint16, one request per 64-byte line, into
    L1 (into L2 with l2): a block sits far from the next one in the pool (every layer's slabs lie
    between), so the hardware's stream prefetcher does not see it coming."""
    B, D = rows.shape
    for jj in range(B):
        for d in range(0, D, 32):
            if l2:
                prefetch_l2(rows, jj, d)
            else:
                prefetch(rows, jj, d)


@njit(inline="always", cache=True)
def _ask_task(data, layer, tables, starts, task):  # pragma: no cover (compiled)
    """Ask for decode task `task`'s keys and values (`_attend_decode`) into the L2 cache."""
    H_kv, B = data.shape[3], data.shape[4]
    s, g = task // H_kv, task % H_kv
    for blk in range(starts[s] // B + 1):
        _prefetch_block(data[tables[s, blk], layer, 0, g], True)
        _prefetch_block(data[tables[s, blk], layer, 1, g], True)


def _load(a, i, d, tail):  # pragma: no cover (compiled through `_load_as`)
    """a[i, d : d + 16] as float32, masked to the row's end when `tail` says D is not whole steps: an f32
    array's values as they are, an f16 one's (uint16 bits, as the pool holds them) widened."""
    raise NotImplementedError("_load runs compiled only (`_load_as`)")


@overload(_load, inline="always")
def _load_as(a, i, d, tail):
    """`_load` for the array type numba has: the one masked load, with the f32 or the f16 lanes."""
    whole, part = (vload_f16, vload_f16_part) if a.dtype == types.uint16 else (vload, vload_part)

    def load(a, i, d, tail):  # pragma: no cover (compiled)
        if len(tail) == 0:
            return whole(a, i, d)
        return part(a, i, d, min(LANES, a.shape[1] - d))

    return load


@njit(inline="always", cache=True)
def _store(a, i, d, tail, v):  # pragma: no cover (compiled)
    """a[i, d : d + 16] = v, masked to the row's end as `_load` reads. A masked store where none is
    needed costs little where registers hold 16 floats and much where they hold eight (no mask
    registers: processor D's `_widen_seq` took 331 us a layer at batch 8 with them, 97 without)."""
    if len(tail) == 0:
        vstore(a, i, d, v)
    else:
        vstore_part(a, i, d, min(LANES, a.shape[1] - d), v)


@njit(inline="always", cache=True)
def _steps(n):  # pragma: no cover (compiled)
    """n rounded up to whole steps of LANES."""
    return (n + LANES - 1) // LANES * LANES


class _Gate(threading.local):
    """The hook of a pipelined prefill (`pipeline.pipelined`, section 2.4): `before(layer)` runs just
    before a step's attention of `layer` reads the pool, in the Python thread that set it; None
    elsewhere. Stage A's says its keys of that layer are written, stage B's waits for them. Here,
    not in `forward`, so that the learner's `llama_layer` stays the code that runs."""

    before = None


GATE = _Gate()


def attend_paged(q, data, layer, tables, seq_of, starts, firsts, tiles, o, tail) -> None:
    """Grouped-query causal attention read from the pool's blocks in place (section 2.4, "going
    further": PagedAttention). Nothing is gathered: key j of sequence s is read where it lives,
    block tables[s, j // B], slot j % B, and widened from f16 sixteen values at a time as it is read
    (`_widen_seq`). Arguments as `_attend_tiles` takes them.

    A step of decodes only (one row a sequence) goes through `_attend_decode`, any other through
    `_attend_tiles`; both run every query through `_attend_tile`, so a query's bits are the same
    either way. Why two: a decode's attention runs between weight products that push it out of the
    caches (one layer's took 40 us in a loop, 130 after 32 MB were read, and reading its keys and
    values first won back only 5 to 30 of those), and the smaller kernel, without the prefill's
    shared widening, costs less of that. SmolLM2's attention a step, 128 keys, processor B,
    medians of 6 to 12 interleaved rounds: int4 batch 1 1.95 -> 1.46 ms at 2 threads (the step
    1.06x faster) and 1.93 -> 1.70 at 1; batch 8 5.95 -> 4.82; f32 batch 1 2.33 -> 1.86."""
    if GATE.before is not None:  # a stage of a pipelined prefill (`_Gate`)
        GATE.before(layer)
    if q.shape[0] == starts.size == tiles.size - 1:  # a tile per sequence, a row per sequence
        _attend_decode(q, data, layer, tables, starts, o, tail)
    else:
        _attend_tiles(q, data, layer, tables, seq_of, starts, firsts, tiles, o, tail)


@njit(parallel=True, nogil=True, cache=True)
def _attend_decode(q, data, layer, tables, starts, o, tail):  # pragma: no cover (compiled)
    """`attend_paged` for a step of decodes: row s is sequence s's one new token, at position
    starts[s], and sees keys 0 .. starts[s]. Each (sequence, KV head) is one task: widen its keys
    and values, then `_attend_tile` on a tile of one query.

    Each task first asks for the next two tasks' keys and values into L2 (`_ask_task`): between
    weight products they come from memory, and one block ahead (`_widen_seq`) left the widening
    waiting on it. SmolLM2 at batch 8 on processor E, attention's ms a step (best and median of 4
    interleaved rounds): 1 thread 6.4 / 6.7 -> 5.0 / 5.2, 2 threads 4.6 / 5.0 -> 3.8 / 4.1."""
    N, H, D = q.shape
    H_kv = data.shape[3]
    scale = np.float32(1.0) / np.sqrt(np.float32(D))
    for task in prange(N * H_kv):
        s, g = task // H_kv, task % H_kv
        for ahead in range(task + 1, min(task + 3, N * H_kv)):
            _ask_task(data, layer, tables, starts, ahead)
        last = np.empty(1, dtype=np.int64)
        last[0] = starts[s]  # q_offset = p_s: the new token sees keys 0 .. p_s
        kT, vals = _widened(data, layer, tables[s], g, last[0] + 1, tail)
        _attend_tile(q, kT, 0, 0, vals, 0, g, H // H_kv, s, last, scale, o, tail)


@njit(parallel=True, nogil=True, cache=True)
def _attend_tiles(q, data, layer, tables, seq_of, starts, firsts, tiles, o, tail):  # pragma: no cover
    """`attend_paged` for any step, in query tiles: a sequence of several tiles (a prefill) has its
    keys and values widened once per KV head for all its tiles.

    q: (N, H, D) float32, the step's queries after RoPE; data: the pool (n_blocks, n_layers, 2, H_kv,
    B, D) uint16; tables: (S, T) int64 block tables (padded); seq_of: (N,) the sequence of each row;
    starts: (S,) p_s; firsts: (S,) the first row of each sequence; tiles: (n_tiles + 1,) row
    boundaries of the query tiles (a tile never spans two sequences); o: (N, H * D) float32,
    written; tail: () when D is a multiple of 16 (every real model), (0,) when its last step of 16
    lanes is partial (a tuple's length is part of its numba type: each case is its own machine
    code, and the whole-step one carries no masks, which cost attention half its speed).

    Query t (the i-th new token of s) visits exactly the keys j <= pos(t) = p_s + i. Each (tile, KV
    head) is one thread's task, in three passes: the scores of every query of the tile against every
    key it sees (`_scores`), their softmax row by row (`_softmax`), the weighted sum of the values
    row by row (`_weighted_values`): `_attend_tile`. Inside a task every query runs the same loops in
    the same order whatever its tile, so a query's bits depend only on its own sequence.
    """
    N, H, D = q.shape
    H_kv = data.shape[3]
    scale = np.float32(1.0) / np.sqrt(np.float32(D))
    n_tasks = (tiles.size - 1) * H_kv
    # A sequence of more than one tile (a prefill) has its keys and values widened once, before
    # the tiles, instead of once per tile: a 512-token prefill's 32 tiles had widened 16 times its
    # keys. A one-tile sequence (a decode) widens its own inside its task, so the buffer below holds
    # only what several tasks share.
    S = starts.size
    cols = np.zeros(S + 1, dtype=np.int64)  # sequence s's columns of keysT: cols[s] .. cols[s + 1] - 1
    for s in range(S):
        n_s = _end_of(firsts, s, N) - firsts[s]
        cols[s + 1] = cols[s] + (_steps(starts[s] + n_s) if n_s > QUERY_TILE else 0)
    width = cols[S]
    keysT = np.empty((H_kv * D, width), dtype=np.float32)  # row g * D + d: dimension d of KV head g's keys
    values = np.empty((H_kv * width, D), dtype=np.float32)  # row g * width + cols[s] + j: value j
    if width > 0:  # a step of decodes only has nothing shared to widen: no parallel loop to wake the threads for
        for sg in prange(S * H_kv):
            s, g = sg // H_kv, sg % H_kv
            if cols[s + 1] > cols[s]:
                _widen_seq(data, layer, tables[s], g, starts[s] + _end_of(firsts, s, N) - firsts[s],
                           keysT, g * D, cols[s], values, g * width + cols[s], tail)
    # A prefill's last tile sees every key, its first tile a few, and numba hands each thread one
    # contiguous share of the range: taken in the order first, last, second, second to last, ...,
    # every share holds light and heavy tasks alike (a prefill of 512 tokens at 2 threads: 256 ms of
    # attention in contiguous shares). Which thread runs a task never changes its bits.
    for zigzag in prange(n_tasks):
        task = zigzag // 2 if zigzag % 2 == 0 else n_tasks - 1 - zigzag // 2
        tile, g = task // H_kv, task % H_kv
        t0, nq = tiles[tile], tiles[tile + 1] - tiles[tile]
        s = seq_of[t0]
        last = np.empty(nq, dtype=np.int64)
        for i in range(nq):
            last[i] = starts[s] + (t0 + i - firsts[s])  # q_offset = p_s: the i-th new token sees keys 0 .. p_s + i
        L = last[nq - 1] + 1  # the tile's last query sees the most keys
        if cols[s + 1] > cols[s]:  # widened above, for all of s's tiles
            kT, k0, c0, vals, v0 = keysT, g * D, cols[s], values, g * width + cols[s]
        else:
            kT, vals = _widened(data, layer, tables[s], g, L, tail)
            k0, c0, v0 = 0, 0, 0
        _attend_tile(q, kT, k0, c0, vals, v0, g, H // H_kv, t0, last, scale, o, tail)


@njit(inline="always", cache=True)
def _attend_tile(q, kT, k0, c0, vals, v0, g, rep, t0, last, scale, o, tail):  # pragma: no cover (compiled)
    """Queries t0 .. t0 + nq - 1 (query t0 + i sees keys 0 .. last[i]) of KV head g's rep heads,
    against keys widened into kT (`_widen_seq`: dimension d of key j at kT[k0 + d, c0 + j]) and
    values vals[v0 + j]: scores, softmax, weighted sum into o's columns of each head."""
    nq, D = last.size, q.shape[2]
    w = np.empty((nq * rep, _steps(last[nq - 1] + 1)), dtype=np.float32)  # row i * rep + r: scores, then weights
    _scores(q, kT, k0, c0, g, t0, last, scale, w)
    for i in range(nq):
        for r in range(rep):
            _softmax(w, i * rep + r, last[i] + 1)
    for i in range(nq):
        for r in range(0, rep, 3):  # three heads of the group at a time (the last repeated where rep % 3)
            r1, r2 = min(r + 1, rep - 1), min(r + 2, rep - 1)
            _weighted_values(w, i * rep + r, i * rep + r1, i * rep + r2, last[i] + 1, vals, v0, o, t0 + i,
                             (g * rep + r) * D, (g * rep + r1) * D, (g * rep + r2) * D, tail)


@njit(inline="always", cache=True)
def _end_of(firsts, s, N):  # pragma: no cover (compiled)
    """The row after sequence s's last one (N rows in all)."""
    return firsts[s + 1] if s + 1 < firsts.size else N


@njit(inline="always", cache=True)
def _widened(data, layer, table, g, L, tail):  # pragma: no cover (compiled)
    """Keys and values 0 .. L - 1 of KV head g widened into a task's own buffers (`_widen_seq`)
    -> kT: (D, L rounded up to whole steps), the keys transposed; vals: (L, D)."""
    D = data.shape[5]
    kT, vals = np.empty((D, _steps(L)), dtype=np.float32), np.empty((L, D), dtype=np.float32)
    _widen_seq(data, layer, table, g, L, kT, 0, 0, vals, 0, tail)
    return kT, vals


@njit(inline="always", cache=True)
def _widen_seq(data, layer, table, g, L, kT, k0, c0, vals, v0, tail):  # pragma: no cover (compiled)
    """Keys and values 0 .. L - 1 of KV head g, widened from the pool's f16 (exact): value j into
    vals[v0 + j] (a row, as the weighted sum reads it), key j into column c0 + j of kT's rows
    k0 .. k0 + D - 1 (transposed, as `_scores` reads it: sixteen keys' dimension d in one vector).
    Two passes: the values block by block, the next block's keys and values asked for while one
    block's values are widened; then the keys, which those asks have brought into the caches.

    The keys go sixteen at a time: straight from their block into kT where the sixteen lie in one
    block and D is whole steps (`vtranspose16` widens them as it loads), else through sixteen rows of
    their own, the rows past L zeros (scored, never used: zeros keep them ordinary numbers). Every
    key widened into rows first and transposed after had passed through a buffer the size of kT,
    out of the L1 cache."""
    D = vals.shape[1]
    B = data.shape[4]
    for blk in range((L + B - 1) // B):
        vb = data[table[blk], layer, 1, g]  # (B, D) f16 bits, in place
        if (blk + 1) * B < L:  # a block sits far from the next one: ask for the next now
            _prefetch_block(data[table[blk + 1], layer, 0, g])
            _prefetch_block(data[table[blk + 1], layer, 1, g])
        for jj in range(min(B, L - blk * B)):
            for d in range(0, D, LANES):
                _store(vals, v0 + blk * B + jj, d, tail, _load(vb, jj, d, tail))
    rows = np.empty((LANES, D), dtype=np.float32)
    for j0 in range(0, L, LANES):
        slot = j0 % B
        if len(tail) == 0 and j0 + LANES <= L and slot + LANES <= B:  # sixteen keys of one block
            keys = data[table[j0 // B], layer, 0, g]
            for d in range(0, D, LANES):
                vtranspose16(keys, slot, d, kT, k0 + d, c0 + j0)
            continue
        for jj in range(LANES):
            j = j0 + jj
            if j >= L:
                rows[jj] = 0.0
                continue
            keys = data[table[j // B], layer, 0, g]
            for d in range(0, D, LANES):
                _store(rows, jj, d, tail, _load(keys, j % B, d, tail))
        _transpose(rows, kT, k0, c0 + j0, tail)


@njit(inline="always", cache=True)
def _transpose(rows, kT, k0, c0, tail):  # pragma: no cover (compiled)
    """kT[k0 + d, c0 + j] = rows[j, d] (rows: (J, D) float32, J whole steps): 16 x 16 blocks at a
    time (`lanes.vtranspose16`) where D is whole steps too, else one value at a time. A decode
    step widens every key of its sequence again: one value at a time, its attention took 1.8 times
    as long as with the blocks."""
    J, D = rows.shape
    if len(tail) == 0:
        for j in range(0, J, LANES):
            for d in range(0, D, LANES):
                vtranspose16(rows, j, d, kT, k0 + d, c0 + j)
        return
    for j in range(J):
        for d in range(D):
            kT[k0 + d, c0 + j] = rows[j, d]


@njit(inline="always", cache=True)
def _scores(q, kT, k0, c0, g, t0, last, scale, w):  # pragma: no cover (compiled)
    """w[i * rep + r, j] = scale * q[t0 + i, g * rep + r] . k_j for the keys j <= last[i] each query
    sees (kT: the keys transposed, dimension d of key j at kT[k0 + d, c0 + j], `_widen_seq`).

    Each dot product is ONE chain of fused multiply-adds over d = 0, 1, ..., D - 1, with sixteen keys
    side by side in the lanes: no fold at the end, so its bits do not depend on how many keys or
    heads run together. The lanes-over-d sums of the products had spent as much on folding each
    score's 16 lanes (four steps of 16 for D = 64) as on its multiply-adds. Three heads of the
    group by 64 keys at a time (12 accumulators, each key vector serving three heads), 16 keys at a
    time for a query's last keys, and for all of them where registers hold eight floats (`WIDE`):
    there 32 at a time, six chains in twelve registers, left the compiler short of registers for
    the keys and the query's values, and it spilled and shuffled them on every step (processor E
    running the AVX2 code, SmolLM2's 141 keys, three heads: 1.42 -> 0.64 us a task by 16); columns
    past last[i] of w are written and never read."""
    nq = last.size
    D = q.shape[2]
    rep = w.shape[0] // nq
    s16 = vsplat(scale)
    for i in range(nq):
        seen, t = last[i] + 1, t0 + i
        for r in range(0, rep, 3):  # three heads at a time (the last repeated where rep % 3)
            r1, r2 = min(r + 1, rep - 1), min(r + 2, rep - 1)
            h0, h1, h2 = g * rep + r, g * rep + r1, g * rep + r2
            a0, a1, a2 = i * rep + r, i * rep + r1, i * rep + r2
            j = 0
            while WIDE and j + 4 * LANES <= seen:
                _scores64(q, t, h0, h1, h2, kT, k0, c0 + j, D, w, a0, a1, a2, j, s16)
                j += 4 * LANES
            while j < seen:
                _scores16(q, t, h0, h1, h2, kT, k0, c0 + j, D, w, a0, a1, a2, j, s16)
                j += LANES


@njit(inline="always", cache=True)
def _scores64(q, t, h0, h1, h2, kT, k0, c, D, w, a0, a1, a2, j, s16):  # pragma: no cover (compiled)
    """Scores of query t's heads h0, h1, h2 against the 64 keys at columns c .. c + 63 of kT, into
    w[a0], w[a1], w[a2] at columns j .. j + 63: `_scores`'s chains, twelve side by side."""
    x0, x1, x2, x3 = vzero(), vzero(), vzero(), vzero()
    y0, y1, y2, y3 = vzero(), vzero(), vzero(), vzero()
    z0, z1, z2, z3 = vzero(), vzero(), vzero(), vzero()
    for d in range(D):
        k_0, k_1 = vload(kT, k0 + d, c), vload(kT, k0 + d, c + LANES)
        k_2, k_3 = vload(kT, k0 + d, c + 2 * LANES), vload(kT, k0 + d, c + 3 * LANES)
        p = vsplat(q[t, h0, d])
        x0, x1, x2, x3 = vfma(p, k_0, x0), vfma(p, k_1, x1), vfma(p, k_2, x2), vfma(p, k_3, x3)
        p = vsplat(q[t, h1, d])
        y0, y1, y2, y3 = vfma(p, k_0, y0), vfma(p, k_1, y1), vfma(p, k_2, y2), vfma(p, k_3, y3)
        p = vsplat(q[t, h2, d])
        z0, z1, z2, z3 = vfma(p, k_0, z0), vfma(p, k_1, z1), vfma(p, k_2, z2), vfma(p, k_3, z3)
    for k, (u, v, x) in enumerate(((x0, y0, z0), (x1, y1, z1), (x2, y2, z2), (x3, y3, z3))):
        vstore(w, a0, j + k * LANES, vmul(s16, u))
        vstore(w, a1, j + k * LANES, vmul(s16, v))
        vstore(w, a2, j + k * LANES, vmul(s16, x))


@njit(inline="always", cache=True)
def _scores16(q, t, h0, h1, h2, kT, k0, c, D, w, a0, a1, a2, j, s16):  # pragma: no cover (compiled)
    """`_scores64` for the 16 keys at columns c .. c + 15: the same chains, three side by side."""
    x, y, z = vzero(), vzero(), vzero()
    for d in range(D):
        k_ = vload(kT, k0 + d, c)
        x, y, z = vfma(vsplat(q[t, h0, d]), k_, x), vfma(vsplat(q[t, h1, d]), k_, y), vfma(vsplat(q[t, h2, d]), k_, z)
    vstore(w, a0, j, vmul(s16, x))
    vstore(w, a1, j, vmul(s16, y))
    vstore(w, a2, j, vmul(s16, z))


@njit(inline="always", cache=True)
def _weighted_values(w, a, b, c, n, values, v0, o, t, ca, cb, cc, tail):  # pragma: no cover (compiled)
    """o[t, ca : ca + D] = sum_j w[a, j] v_j over j = 0 .. n - 1 (v_j = values[v0 + j], `_widen_seq`),
    and the same for rows b, c of w into columns cb, cc (three heads that share the KV head), added
    in key order: each output value is one chain of fused multiply-adds, so its bits do not depend
    on how many are computed side by side. Sixty-four values (four steps) of each of the three rows
    at a time, twelve chains held in registers across the whole pass over the keys: each value
    vector read serves three heads, and twelve chains keep the multiply-adds busy where four waited
    on each other's latency (a 512-token prefill's attention, one layer, 1 thread, processor B:
    11.2-12.6 ms -> 8.8-10.4)."""
    D = values.shape[1]
    chunk = 4 * LANES if WIDE else LANES  # where registers hold eight floats: 16 values, three chains
    for d0 in range(0, D, chunk):
        if len(tail) == 0 and d0 + chunk <= D and not WIDE:
            _values16(w, a, b, c, n, values, v0, o, t, ca + d0, cb + d0, cc + d0, d0)
            continue
        if len(tail) == 0 and d0 + chunk <= D:
            a0, a1, a2, a3 = vzero(), vzero(), vzero(), vzero()
            b0, b1, b2, b3 = vzero(), vzero(), vzero(), vzero()
            c0, c1, c2, c3 = vzero(), vzero(), vzero(), vzero()
            for j in range(n):
                r = v0 + j
                v_0, v_1 = vload(values, r, d0), vload(values, r, d0 + LANES)
                v_2, v_3 = vload(values, r, d0 + 2 * LANES), vload(values, r, d0 + 3 * LANES)
                p = vsplat(w[a, j])
                a0, a1, a2, a3 = vfma(p, v_0, a0), vfma(p, v_1, a1), vfma(p, v_2, a2), vfma(p, v_3, a3)
                p = vsplat(w[b, j])
                b0, b1, b2, b3 = vfma(p, v_0, b0), vfma(p, v_1, b1), vfma(p, v_2, b2), vfma(p, v_3, b3)
                p = vsplat(w[c, j])
                c0, c1, c2, c3 = vfma(p, v_0, c0), vfma(p, v_1, c1), vfma(p, v_2, c2), vfma(p, v_3, c3)
            for k, (va, vb, vc) in enumerate(((a0, b0, c0), (a1, b1, c1), (a2, b2, c2), (a3, b3, c3))):
                vstore(o, t, ca + d0 + k * LANES, va)
                vstore(o, t, cb + d0 + k * LANES, vb)
                vstore(o, t, cc + d0 + k * LANES, vc)
            continue
        for row, col in ((a, ca), (b, cb), (c, cc)):  # a chunk short of 64 values: a step at a time
            for d in range(d0, min(d0 + chunk, D), LANES):
                acc = vzero()
                for j in range(n):
                    acc = vfma(vsplat(w[row, j]), _load(values, v0 + j, d, tail), acc)
                vstore_part(o, t, col + d, min(LANES, D - d), acc)  # a head's row may end inside a step


@njit(inline="always", cache=True)
def _values16(w, a, b, c, n, values, v0, o, t, ca, cb, cc, d0):  # pragma: no cover (compiled)
    """`_weighted_values` for the 16 values d0 .. d0 + 15 of rows a, b, c into o[t, ca ..], o[t, cb ..],
    o[t, cc ..], where registers hold eight floats: the same chains in key order, three side by side.
    Six, over 32 values, spilled there as `_scores`' 32 keys did (processor E running the AVX2 code,
    141 keys: 1.05 -> 0.62 us a task)."""
    x, y, z = vzero(), vzero(), vzero()
    for j in range(n):
        v = vload(values, v0 + j, d0)
        x = vfma(vsplat(w[a, j]), v, x)
        y = vfma(vsplat(w[b, j]), v, y)
        z = vfma(vsplat(w[c, j]), v, z)
    vstore(o, t, ca, x)
    vstore(o, t, cb, y)
    vstore(o, t, cc, z)


class _Split(threading.local):
    """Inside a lone-row step whose plan is BIG (`threads_for`): the step runs on one thread, and a
    product reading at least `bytes` of weight runs on `threads` instead. Elsewhere bytes is inf:
    every kernel runs on the count in force. Per Python thread, like numba's thread count."""

    bytes = math.inf
    threads = 1

    def set(self, nbytes: float, threads: int) -> None:
        self.bytes, self.threads = nbytes, threads


_SPLIT = _Split()


def _split(kernel, nbytes: int, *args) -> None:
    """kernel(*args), on the step's `_SPLIT` threads when it reads at least its bytes (one
    product of a BIG step: the count goes up for the call and back to 1 after), else as it is."""
    if nbytes < _SPLIT.bytes:
        kernel(*args)
        return
    import numba

    numba.set_num_threads(_SPLIT.threads)
    try:
        kernel(*args)
    finally:
        numba.set_num_threads(1)


# ---------------------------------------------------------------------------------------------
# Python entry points: pad, check the layout once, call the kernel
# ---------------------------------------------------------------------------------------------


def lanes_ready(x: np.ndarray, W: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x: (M, K), W: (N, K) -> C-contiguous float32 (M, K16), (N, K16) with K16 the next multiple
    of `lanes.LANES`: the columns added are zeros, so every sum is unchanged (no copy when K is a
    multiple already, as in every real model; the toy shapes of the tests pay a copy)."""
    return _whole_steps(np.ascontiguousarray(x, dtype=np.float32)), _whole_steps(_c(W))


def _whole_steps(a: np.ndarray) -> np.ndarray:
    """a: (R, K) -> (R, K16), zero columns appended up to a multiple of `lanes.LANES` (a itself when
    K already is one)."""
    K = a.shape[1]
    return a if K % LANES == 0 else np.pad(a, ((0, 0), (0, LANES - K % LANES)))


def product_f32(x: np.ndarray, W: np.ndarray) -> np.ndarray:
    """y = x W^T, the engine's float32 product. x: (M, K) float32, W: (N, K) float32 C-contiguous
    -> (M, N) float32.

    A lone row goes through `matvec_f32` (a decode step is bound by reading the weight, and a row
    padded to a block of 4 would do 4 times the arithmetic for the same bytes); five to eight rows
    through `matmul8_f32` (`_eight_rows`); the rest through `matmul_f32`'s blocks. All add every
    sum in `lanes` order, so which one runs changes the speed, never the bits: a row's result is
    the same alone, in any batch, at any thread count.
    """
    M = x.shape[0]
    if M == 1:
        return rows_f32(x, W)
    eight = _eight_rows(M, x.shape[1])
    xp, Wp = lanes_ready(padded_rows(x, 8 if eight else ROWS), W)
    y = np.empty((xp.shape[0], W.shape[0]), dtype=np.float32)
    if eight:
        eight_rows_f32(Wp.nbytes)(xp, Wp, y, cols=x_cols(x.shape[1]))
    else:
        matmul_f32(xp, Wp, y, cols=0 if WIDE else cols34(xp.shape[1]))
    return y[:M]


def rows_f32(x: np.ndarray, W: np.ndarray) -> np.ndarray:
    """y = x W^T with `matvec_f32`, every row through the one-row loop (no padding).
    x: (M, K), W: (N, K) float32 -> (M, N) float32."""
    x, W = lanes_ready(x, W)
    y = np.empty((x.shape[0], W.shape[0]), dtype=np.float32)
    _split(one_row("f32", W.nbytes), W.nbytes, x, W, y)
    return y


AHEAD = (0, 16 << 10, 32 << 10)
"""How far ahead, in bytes, a streaming kernel (f32, and the int8 head's) may ask for its weight into
the L2 cache (`_ask_far`; 0: not at all, only its rows one block ahead into L1). Which it uses is measured, with
the kernel (`one_row`, `eight_rows_f32`): on processor E, SmolLM2's weights at batch 8 and 1 thread
(8 layers' products, best of 5 interleaved rounds, the same bits) took 11.4 ms asking one block
ahead only, 6.4 with 16 rows (37 KB) ahead into L2 as well, 6.5 with 8 and 7.1 with 64. The one-row
pass is the other way round on the same processor, and only a probe shaped like the model shows
it (`_stream_probe`): reading a layer's four weights in turn, `matvec1_f32` ran 30.7 GB/s asking
nothing ahead and 22.4 asking 16 KB (SmolLM2 f32 at batch 1, 1 thread, one process, 8 interleaved
rounds: 23.4 against 30.1 ms a step), while over one 63 MB weight the two were level (35.2, 35.4
GB/s), so a probe of one long weight picked either by chance. The int8 head's four-feature pass
(`matvec_q8`) needs it on the same processor: 3.2 -> 1.9 ms."""


class Choice(NamedTuple):
    """A kernel and how many bytes ahead it asks for its weight into L2 (`AHEAD`), called as the
    kernel is: choice(x, W, ..., y)."""
    kernel: object
    ahead: int = 0

    def __call__(self, *args, **more) -> None:
        if not self.ahead:
            return self.kernel(*args, **more)
        W = args[1]
        return self.kernel(*args, max(1, self.ahead // (W.shape[1] * W.itemsize)), **more)

    def __str__(self) -> str:
        return f"{self.kernel.__name__}, {self.ahead >> 10} KB ahead" if self.ahead else self.kernel.__name__


_CHOSEN: dict = {}  # kind -> the Choice `_measured` timed fastest, once a process


UNPROBED = cache_bytes(2) or 1 << 20
"""Weights under this many bytes (this core's L2 cache, `machine.cache_bytes`) are multiplied with
each kind's first candidate while nothing is chosen yet, and never start the probe: it times
reading from memory, which a weight that fits the L2 cache is not, and it costs its weights,
twice the last-level cache (a tiny model's first step on processor E took 119 MB and 0.6 s for
a few KB of weights). SmolLM2's weights are all larger (its stacked q, k, v, the first product a
step makes, 2.2 MB in float32), so its choices are timed as before."""


def _measured(kind: str, nbytes: float = math.inf) -> Choice:
    """The fastest Choice of `kind` on this machine, timed once a process (`faster_of`) on reads from
    memory (`_stream_probe`) and kept: "f32" and "q8" one row, "f32x8" eight rows. For a weight of
    nbytes under `UNPROBED` with nothing kept yet: the first candidate, untimed."""
    if kind in _CHOSEN:  # every product after the first: nothing more to do
        return _CHOSEN[kind]
    kernels = {"f32": (matvec_f32, matvec1_f32), "q8": (matvec_q8, matvec1_q8), "f32x8": (matmul8_f32,)}[kind]
    if nbytes < UNPROBED:
        return Choice(kernels[0])
    _CHOSEN[kind] = faster_of([Choice(k, a) for k in kernels for a in AHEAD], _stream_probe(kind))
    return _CHOSEN[kind]


def one_row(kind: str, nbytes: float = math.inf) -> Choice:
    """The one-row kernel this machine reads a weight of nbytes fastest with, of `kind`, and how far
    ahead it asks for the weight (`AHEAD`): "f32", `matvec_f32` (four features a pass) or
    `matvec1_f32` (one); "q8", `matvec_q8` or `matvec1_q8`. Timed on the first call of a process
    with a weight of at least `UNPROBED` bytes (`faster_of`, on weights twice the last-level cache,
    16 to 96 MB, read as a step reads them (`_stream_probe`), at 1 thread: the three kinds 0.6 s on
    processor E) and kept. The same bits either way."""
    return _measured(kind, nbytes)


def eight_rows_f32(nbytes: float = math.inf) -> Choice:
    """`matmul8_f32` and how far ahead it asks for a weight of nbytes (`AHEAD`), timed as `one_row` is."""
    return _measured("f32x8", nbytes)


LAYER = ((960, 576), (576, 576), (3072, 576), (576, 1536))
"""A decoder layer's weights (N, K) as the f32 probes read them: SmolLM2-135M's stacked q/k/v, o,
stacked gate/up and down projections."""


TIE = 0.03
"""How much faster a later candidate of `faster_of` must be to be chosen over an earlier one. The
candidates come kernel by kernel, each kernel's distances nearest first (`_measured`), and asking
farther ahead costs what a probe of the kernel alone does not see: in a step the rest of the work
shares the caches. On processor E,
`matmul8_f32` read the probe's layers level asking 16 or 32 KB ahead (2 threads: 35.5 and 36.0 GB/s,
1 thread: 17.8 and 18.0), so it picked either from one process to the next; in the model, SmolLM2
f32 at batch 8, 2 threads, one process, interleaved rounds, a step took 24.8 and 25.7 ms (best of
two runs) asking 16 KB ahead against 27.2 and 26.7 asking 32 (1 thread: 34.8 against 35.5)."""


def _stream_probe(kind: str) -> list[tuple[tuple, dict]]:
    """The calls (arguments, keywords) a kernel of `kind` (`_measured`) is timed on, reading from memory:
    weights twice the last-level cache in bytes (16 to 96 MB), every page written (untouched pages
    of zeros would all read the one zero page, from the cache). "f32" and "f32x8": as many decoder
    layers as make that size (`LAYER`), each weight read in turn as a step reads them, x (1, K) or
    (8, K) and the model's column passes (`x_cols`); "q8": one weight of 576 columns, as the LM head
    is one long weight."""
    last = max(cache_bytes(3) or 0, cache_bytes(2) or 0)
    size = min(96 << 20, max(16 << 20, 2 * last))
    if kind == "q8":
        from tl_lab.ops.widening import F16_AS_F32

        Q = np.ones((size // 576, 576), dtype=np.int8)
        scales = np.full((Q.shape[0], 576 // 32), 0x3C00, dtype=np.uint16)  # f16 1.0, groups of 32
        x, y = np.ones((1, 576), dtype=np.float32), np.empty((1, Q.shape[0]), dtype=np.float32)
        return [((x, Q, scales, F16_AS_F32, y), {})]
    rows = 8 if kind == "f32x8" else 1
    layers = -(-size // (4 * sum(N * K for N, K in LAYER)))
    return [((np.ones((rows, K), dtype=np.float32), np.full((N, K), 0.5, dtype=np.float32),
              np.empty((rows, N), dtype=np.float32)), {"cols": x_cols(K)} if rows == 8 else {})
            for _ in range(layers) for N, K in LAYER]


def faster_of(kernels, calls, rounds: int = 4, clock=None, tie: float = TIE):
    """The first kernel of `kernels` whose fastest of `rounds` rounds is within `tie` of the
    shortest, a round being kernel(*args, **keywords) for each call of `calls` in turn; the rounds
    interleaved kernel by kernel (a disturbed round costs every kernel alike) after one round each
    (compiled or loaded); at 1 thread, the count restored after."""
    import time

    import numba

    clock = clock or time.perf_counter
    before = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        best = [math.inf] * len(kernels)
        for k in kernels:
            for args, kw in calls:
                k(*args, **kw)
        for _ in range(rounds):
            for i, k in enumerate(kernels):
                t0 = clock()
                for args, kw in calls:
                    k(*args, **kw)
                best[i] = min(best[i], clock() - t0)
    finally:
        numba.set_num_threads(before)
    return next(k for k, b in zip(kernels, best) if b <= min(best) * (1 + tie))


def head_f32(x: np.ndarray, W: np.ndarray) -> np.ndarray:
    """The LM head, y = x W^T by `product_f32`: x (S, d), W (V, d) -> (S, V) float32 (a name of its
    own so a profile can tell the head from the layers' products)."""
    return product_f32(x, W)


def product_q4(x: np.ndarray, planar: np.ndarray, scales: np.ndarray, f16: np.ndarray) -> np.ndarray:
    """y = x W_hat^T, the engine's int4 product. x: (M, K) float32, planar: (N, K / 2) uint8,
    scales: (N, G) uint16 -> (M, N) float32. A lone row through `matvec_q4` when the group size is
    a multiple of 32, five to eight rows through `matmul8_q4` (while eight rows of x fit `X_IN_L2`),
    anything else through `matmul_q4`'s tiles; the same bits either way."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    M, K = x.shape
    N, G = scales.shape
    if M == 1 and (K // G) % (2 * LANES) == 0:
        y = np.empty((1, N), dtype=np.float32)
        _split(matvec_q4, planar.nbytes + scales.nbytes, x, _c(planar), _c(scales), f16, y)
        return y
    if WIDE and _eight_rows(M, K) and (K // G) % (2 * LANES) == 0:
        xp = padded_rows(x, 8)
        y = np.empty((8, N), dtype=np.float32)
        matmul8_q4(xp, _c(planar), _c(scales), f16, y)
        return y[:M]
    xp = _whole_steps(padded_rows(x))
    y = np.empty((xp.shape[0], N), dtype=np.float32)
    matmul_q4(xp, _c(planar), _c(scales), f16, y, cols=0 if WIDE else cols34(xp.shape[1]))
    return y[:M]


def product_q8(x: np.ndarray, Q: np.ndarray, scales: np.ndarray, f16: np.ndarray) -> np.ndarray:
    """y = x W_hat^T from int8 weights (the int4 model's LM head). x: (M, K) float32, Q: (N, K)
    int8, scales: (N, G) uint16 with K / G a multiple of 16 -> (M, N) float32. Five to eight rows
    through `matmul8_q8` while eight rows of x fit `X_IN_L2` (SmolLM2's int8 head at batch 8, 1
    thread: processor D, in halves, 23 ms by `matvec_q8` -> 10.7; processor E, whose 32 KB L1 the
    18 KB of x overflow, the int4 model at batch 8, 5 interleaved rounds, same bits: 136 -> 177
    tok/s, 222 -> 262 at 2 threads), any other count through `one_row("q8")`; the same bits
    either way, those of `product_f32` on W_hat."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    M, K = x.shape
    eight = _eight_rows(M, K)
    xp = padded_rows(x, 8) if eight else x
    y = np.empty((xp.shape[0], Q.shape[0]), dtype=np.float32)
    if eight:
        matmul8_q8(xp, _c(Q), _c(scales), f16, y)
    else:
        nbytes = Q.nbytes + scales.nbytes
        _split(one_row("q8", nbytes), nbytes, xp, _c(Q), _c(scales), f16, y)
    return y[:M]


SERIAL_ROWS = 1
"""Steps of at most this many rows get their plan from `LoneRowThreads`; larger ones run every
kernel on the count in force."""

ALONE, ALL = math.inf, 0
BIG = cache_bytes(2) or 2 << 20
"""The plans of a lone-row step, each the least bytes a product reads to run on the count in force
(`_SPLIT`), the others running on one thread: ALONE (the whole step on one thread); BIG (the
products reading at least this machine's L2 cache, from memory every step: the int4 model's LM head,
and in float32 every product but W_o); ALL (every product and attention on the count in force)."""
PLAN_NAMES = {ALONE: "ALONE", BIG: "BIG", ALL: "ALL"}


class LoneRowThreads:
    """How a one-row step (a batch-1 decode) uses the threads in force: which of its products split
    their output features over the threads and which run on the calling thread alone (the plans
    ALONE, BIG, ALL), chosen by timing the steps themselves.

    Why measured, and measured all along: a lone row is bound by reading the weights, and a second
    thread helps a product only where the half of the work it takes over is worth more than waking
    it: it sleeps between the ~150 parallel loops of a step once its spin runs out, and a loop that
    finds it asleep costs several times one that finds it spinning (GOMP_SPINCOUNT, the top of this
    module, gives both, measured on processor B). Whether a second thread
    helps depends on the machine and on the moment. On processor A one core read memory as fast as
    two (SmolLM2 int4, 2 threads: 66 tokens/s against 80 on one); on processor B one thread reads
    15-18 GB/s and two 31, so f32 batch 1 on one thread stopped at 40% of the machine's bandwidth.
    And with a core busy (a learner's laptop always has one) the second thread waits for its core on
    every loop. So the first steps try each plan, the fastest wins, and every PROBE-th step runs
    another plan once, in turn: a busy core that makes the splits slower turns them off within a few
    probes, and they come back when the core frees. BIG is for a step whose small loops do not pay
    for the wakes: only its big products (the int4 head: 30 MB) split. The bits do not depend on the
    plan (every kernel adds the same sums in the same order at any thread count, tested)."""

    PROBE = 16
    KEEP = 5  # recent times per plan; their median is the plan's speed
    TRIES = 3  # times per plan before the medians decide: the median of three drops one outlier, such as
    # the first lone-row step of a runner, which loads its one-row kernels from numba's cache (about a second)
    PLANS = (ALONE, BIG, ALL)

    def __init__(self) -> None:
        self.times: dict[float, list[float]] = {}
        self.steps = 0

    def pick(self, full: int) -> float:
        """The plan for the next one-row step, given the count in force (`full`): ALONE at 1 thread."""
        if full == 1:
            return ALONE
        self.steps += 1
        timed = {p: len(self.times.get(p, ())) for p in self.PLANS}
        if min(timed.values()) < self.TRIES:  # too few times yet: try the plan with fewest
            return min(timed, key=timed.get)
        best = min(self.PLANS, key=self._median)
        if self.steps % self.PROBE:
            return best
        others = [p for p in self.PLANS if p != best]
        return others[(self.steps // self.PROBE) % len(others)]

    def record(self, plan: float, seconds: float) -> None:
        """A one-row step took `seconds` under `plan`."""
        t = self.times.setdefault(plan, [])
        t.append(seconds)
        del t[: -self.KEEP]

    def _median(self, plan: float) -> float:
        return statistics.median(self.times[plan])  # of at most KEEP floats: np.median took 12 us a call, three a step

    def best(self) -> str | None:
        """The name of the plan the recent steps ran fastest under (None before every plan was timed),
        for a benchmark to record: "ALONE", "BIG" or "ALL"."""
        if any(len(self.times.get(p, ())) < self.TRIES for p in self.PLANS):
            return None
        return PLAN_NAMES[min(self.PLANS, key=self._median)]

    def medians_ms(self) -> dict[str, float]:
        """Each timed plan's name -> the median of its recent step times, in milliseconds."""
        return {PLAN_NAMES[p]: 1e3 * self._median(p) for p in self.PLANS if self.times.get(p)}


_LONE_ROW = weakref.WeakKeyDictionary()  # owner (a runner) -> its LoneRowThreads: one model's steps, timed together


@contextmanager
def threads_for(rows: int, owner=None):
    """Run the block (one step's forward) with the kernels split as the step should: for a step of
    at most SERIAL_ROWS rows the plan the owner's `LoneRowThreads` picks (the block is timed for it;
    owner: what runs the steps, a runner, so that two models' times never mix: ALONE and BIG run
    the step on 1 thread, BIG its big products on the count in force, ALL everything on it),
    otherwise every kernel on the count in force. The count is restored after. The bits do not
    depend on the plan."""
    import time

    import numba

    before = numba.get_num_threads()
    if rows > SERIAL_ROWS or before == 1:
        yield
        return
    chooser = _LONE_ROW.setdefault(owner if owner is not None else threads_for, LoneRowThreads())
    plan = chooser.pick(before)
    if plan != ALL:
        numba.set_num_threads(1)
        _SPLIT.set(plan, before)
    t0 = time.perf_counter()
    try:
        yield
    finally:
        chooser.record(plan, time.perf_counter() - t0)
        _SPLIT.set(math.inf, 1)
        numba.set_num_threads(before)


def set_threads(n: int) -> int:
    """Threads of the kernels (numba's pool), capped at the pool's size; -> the count in force.
    The bits of every kernel are the same at any count."""
    import numba

    numba.set_num_threads(threads_in_pool(n))
    return numba.get_num_threads()


def _c(a: np.ndarray) -> np.ndarray:
    if not a.flags.c_contiguous:
        raise ValueError(f"the kernels take C-contiguous arrays only, got strides {a.strides} for shape {a.shape}")
    return a


@njit(nogil=True, cache=True)
def exp_f64(x, out):  # pragma: no cover (compiled)
    """out[i] = exp(x[i]) for x, out: (n,) float64, each through the C library's exp, the function
    Python's math.exp calls (LLVM's exp, with no vector library to swap in): the sampler's exp
    where numpy's is not the C library's (`sample.exp_backend`, which admits it only after the same
    bit check). 49,152 ids on processor E: 0.21 ms, against 2.3 ms for math.exp called from Python."""
    for i in range(x.size):
        out[i] = math.exp(x[i])


def drop_cache_of_other_lanes(cache_dir: Path, lanes_source: bytes) -> bool:
    """Drop the kernels' cached machine code if it was built from another lanes.py; -> True if dropped.

    numba keys a cached kernel on kernels.py's own timestamp, but every kernel compiles lanes.py's
    functions into itself: after an edit of lanes.py alone, numba would load the old lanes' code
    (same source, other bits). So the cache directory keeps the sha256 of the lanes.py its kernels
    were built from, and files of kernels built from another are removed (numba compiles them again).
    A cache numba cannot write is left as it is."""
    stamp = cache_dir / "kernels.lanes.sha256"
    digest = hashlib.sha256(lanes_source).hexdigest()
    try:
        if stamp.is_file() and stamp.read_text() == digest:
            return False
        for f in [*cache_dir.glob("kernels.*.nbi"), *cache_dir.glob("kernels.*.nbc")]:
            f.unlink(missing_ok=True)
        tmp = cache_dir / f"kernels.lanes.{os.getpid()}.tmp"
        tmp.write_text(digest)
        os.replace(tmp, stamp)
    except OSError:
        return False
    return True


def _check_cache() -> None:
    cache = getattr(matvec_f32, "_cache", None)  # numba's FunctionCache: where this process's kernels are cached
    path = getattr(cache, "_cache_path", None)
    if path is not None and Path(path).is_dir():
        drop_cache_of_other_lanes(Path(path), Path(lanes.__file__).read_bytes())


_check_cache()
