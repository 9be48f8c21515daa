"""tl_lab/ops/kernels.py: the compiled products and the paged attention (chapter L10.1, sections 2.4, 2.5).

Each kernel is held against the readable numpy reference within float tolerance, and for bit-exact
invariance on its own: a row alone and in any batch, at any place in it, at 1 and 2 threads.
"""

import math

import numpy as np
import pytest

from tl_lab.forward import PoolKv, Step, attend_reference, write_kv
from tl_lab.ops.kernels import (QUERY_TILE, ROWS, faster_of, head_f32, lanes_ready, matmul8_f32, matvec1_f32, matvec_f32,
                            product_f32, rows_f32, set_threads)
from tl_lab.ops.machine import AVX2_ONLY
from tl_lab.ops.q8 import Q8Linear
from tl_lab.quant import QLinear, f32_to_f16

SHAPES = [(64, 32), (576, 192), (576, 1536), (1536, 576), (64, 7), (36, 5), (17, 3)]  # (K, N); N % 4, K % 16 != 0 included


def _threads(n):
    import numba

    if numba.config.NUMBA_NUM_THREADS < n:
        pytest.fail(f"this test needs {n} cores for numba's pool (NUMBA_NUM_THREADS={numba.config.NUMBA_NUM_THREADS})")
    return set_threads(n)


@pytest.mark.parametrize("K,N", SHAPES)
def test_f32_kernel_equals_the_product_within_float_tolerance(K, N):
    rng = np.random.default_rng(K + N)
    W = rng.standard_normal((N, K)).astype(np.float32)
    for M in (1, 3, ROWS, 9):
        X = rng.standard_normal((M, K)).astype(np.float32)
        Y = product_f32(X, W)
        assert Y.shape == (M, N) and Y.dtype == np.float32
        np.testing.assert_allclose(Y, X.astype(np.float64) @ W.T.astype(np.float64), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("product", [product_f32, head_f32])
@pytest.mark.parametrize("K,N", SHAPES)
def test_f32_kernels_are_row_invariant(K, N, product):
    """A probe row gives the same bits alone and at every place of batches of 1 to 17 rows, and
    each kernel equals the product within float tolerance."""
    rng = np.random.default_rng(1)
    W = rng.standard_normal((N, K)).astype(np.float32)
    probe = rng.standard_normal((1, K)).astype(np.float32)
    alone = product(probe, W)[0]
    np.testing.assert_allclose(alone, W.astype(np.float64) @ probe[0].astype(np.float64), rtol=1e-5, atol=1e-4)
    for M in range(1, 18):
        X = rng.standard_normal((M, K)).astype(np.float32)
        for r in {0, M // 2, M - 1}:
            X[r] = probe[0]
            assert np.array_equal(product(X, W)[r], alone), f"({K}->{N}) row {r} of {M}"


@pytest.mark.parametrize("K,N", SHAPES)
def test_one_row_kernel_and_the_blocks_give_the_same_bits(K, N):
    """`matvec_f32` (a lone row), `matmul_f32` (blocks of 4 rows) and `matmul8_f32` (8 rows in one
    pass) add every sum in `lanes` order, so they agree to the bit on every row of every batch: the
    engine may pick any by batch size."""
    rng = np.random.default_rng(K * N)
    W = rng.standard_normal((N, K)).astype(np.float32)
    for M in (2, 5, 8, 13):
        X = rng.standard_normal((M, K)).astype(np.float32)
        assert np.array_equal(product_f32(X, W).view(np.uint32), rows_f32(X, W).view(np.uint32)), f"M={M}"
    X, W16 = lanes_ready(rng.standard_normal((8, K)).astype(np.float32), W)  # the 8-row kernel, whatever K
    eight = _run(matmul8_f32, X, W16)
    assert np.array_equal(eight.view(np.uint32), rows_f32(X, W16).view(np.uint32)), "matmul8_f32"
    for one_row in (matvec_f32, matvec1_f32):  # whichever `one_row` measured faster here
        assert np.array_equal(_run(one_row, X, W16).view(np.uint32), eight.view(np.uint32)), one_row.__name__


def test_row_chunks_are_sized_from_the_machines_caches_and_keep_the_bits():
    """x's rows pass over the weight in chunks of X_IN_L2 bytes (a quarter of L2, read from the
    system, as X_IN_L1 is half of L1d); a batch of several chunks gives the bits of the one-row
    kernel on every row, f32 and int4."""
    from tl_lab.ops import kernels
    from tl_lab.ops.machine import cache_bytes

    assert kernels.X_IN_L1 == (cache_bytes(1) or 48 * 1024) // 2
    assert kernels.X_IN_L2 == (cache_bytes(2) or 2 << 20) // 4
    K = 1536
    rows = kernels._rows_in_l2(K)
    assert rows % ROWS == 0 and rows * 4 * K <= kernels.X_IN_L2 < (rows + ROWS) * 4 * K
    rng = np.random.default_rng(5)
    W = rng.standard_normal((20, K)).astype(np.float32)
    X = rng.standard_normal((2 * rows + 7, K)).astype(np.float32)  # three chunks, the last one short
    assert np.array_equal(product_f32(X, W).view(np.uint32), rows_f32(X, W).view(np.uint32))
    layer = QLinear.quantize(W * 0.05, group=32)
    assert np.array_equal(layer.forward(X).view(np.uint32), rows_f32(X, layer.dequantize()).view(np.uint32))


@pytest.mark.parametrize("cols", [0, 400, 768])
def test_matmul_f32_in_passes_of_columns_keeps_the_bits(cols):
    """Where registers hold eight floats `matmul_f32` reads a long K in passes of columns (`cols34`
    from the L1 size), each block's 12 sums waiting in lanes order between passes: the bits of the
    one-row kernel on every row, for passes that do not divide K, rows over several chunks and an
    odd N. (Where registers hold 16 floats `cols` is not used; the AVX2 run of
    `test_kernels_give_the_same_bits_in_halves_and_in_whole_lanes` covers the passes there.)"""
    from tl_lab.ops import kernels

    assert kernels.cols34(576) == 0 if 7 * 4 * 576 <= 3 * kernels.L1_BYTES // 4 else kernels.cols34(576) > 0
    for K in (1536, 4000):
        c = kernels.cols34(K)
        assert c % kernels.LANES == 0 and 7 * 4 * c <= 3 * kernels.L1_BYTES // 4 and c < K
    K = 1536
    rng = np.random.default_rng(6)
    W = rng.standard_normal((21, K)).astype(np.float32)
    X = rng.standard_normal((2 * kernels._rows_in_l2(K) + 3, K)).astype(np.float32)
    y = np.empty((X.shape[0], W.shape[0]), np.float32)
    kernels.matmul_f32(X, W, y, cols=cols)
    assert np.array_equal(y.view(np.uint32), rows_f32(X, W).view(np.uint32))


Q4_SHAPES = [(576, 200, 32), (1536, 9, 32), (64, 7, 64), (8, 5, 4)]  # (K, N, group); N % 4 != 0 included


@pytest.mark.parametrize("K,N,group", Q4_SHAPES)
def test_q4_kernel_equals_the_dequantized_product_within_float_tolerance(K, N, group):
    """The int4 kernel reads nibbles, never W_hat, yet gives x @ W_hat.T (W_hat widened here only to
    check it, in float64) up to float32 rounding."""
    rng = np.random.default_rng(K + N)
    layer = QLinear.quantize(rng.standard_normal((N, K)).astype(np.float32) * 0.05, group=group)
    for M in (1, 3, 8):
        X = rng.standard_normal((M, K)).astype(np.float32)
        Y = layer.forward(X)
        assert Y.shape == (M, N) and Y.dtype == np.float32
        np.testing.assert_allclose(Y, X.astype(np.float64) @ layer.dequantize().T.astype(np.float64),
                                   rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("K,N,group", Q4_SHAPES)
def test_q4_kernel_is_row_invariant(K, N, group, restore_threads):
    """A probe row gives the same bits alone and at the first, middle and last place of batches of
    2, 3 and 8 rows, at 1 and at 2 threads."""
    rng = np.random.default_rng(3)
    layer = QLinear.quantize(rng.standard_normal((N, K)).astype(np.float32) * 0.05, group=group)
    probe = rng.standard_normal((1, K)).astype(np.float32)
    _threads(1)
    alone = layer.forward(probe)[0]
    for n in (1, 2):
        _threads(n)
        assert np.array_equal(layer.forward(probe)[0], alone), f"alone, {n} threads"
        for M in (2, 3, 8):
            X = rng.standard_normal((M, K)).astype(np.float32)
            for r in {0, M // 2, M - 1}:
                X[r] = probe[0]
                assert np.array_equal(layer.forward(X)[r], alone), f"({K}->{N}, g{group}) row {r} of {M}, {n} threads"


@pytest.mark.parametrize("K,N,group", Q4_SHAPES)
def test_q4_kernel_is_the_f32_product_on_w_hat_bit_for_bit(K, N, group):
    """W_hat = n s - 8 s is exact, and the int4 kernels add x W_hat into the f32 kernels' lanes in
    their order: the int4 product of any batch is `product_f32` on the dequantized weight, bit for bit."""
    rng = np.random.default_rng(K + 7 * N)
    layer = QLinear.quantize(rng.standard_normal((N, K)).astype(np.float32) * 0.05, group=group)
    W_hat = layer.dequantize()
    for M in (1, 2, 6, 8, 11):
        X = rng.standard_normal((M, K)).astype(np.float32)
        assert np.array_equal(layer.forward(X).view(np.uint32), product_f32(X, W_hat).view(np.uint32)), f"M={M}"


@pytest.mark.parametrize("K,N,group", [(576, 201, 32), (64, 7, 16), (96, 9, 48)])
def test_q8_kernels_are_the_f32_product_on_w_hat_bit_for_bit_in_any_batch(K, N, group, restore_threads):
    """W_hat = q s is exact, and `matvec_q8` / `matmul8_q8` add x W_hat into the f32 kernels' lanes in
    their order: the int8 head's product of any batch is `product_f32` on the dequantized weight,
    bit for bit, and a probe row gives the same bits alone and at any place of a batch, at 1 and 2
    threads."""
    rng = np.random.default_rng(K + N)
    head = Q8Linear.quantize(rng.standard_normal((N, K)).astype(np.float32), group=group)
    W_hat = head.dequantize()
    probe = rng.standard_normal((1, K)).astype(np.float32)
    _threads(1)
    alone = head.forward(probe)[0]
    for n in (1, 2):
        _threads(n)
        for M in (1, 2, 5, 8, 9, 17):
            X = rng.standard_normal((M, K)).astype(np.float32)
            X[M // 2] = probe[0]
            Y = head.forward(X)
            assert np.array_equal(Y.view(np.uint32), product_f32(X, W_hat).view(np.uint32)), f"M={M}, {n} threads"
            assert np.array_equal(Y[M // 2], alone), f"row {M // 2} of {M}, {n} threads"


def test_kernels_refuse_a_strided_weight():
    W = np.ones((8, 16), np.float32)
    with pytest.raises(ValueError, match="C-contiguous"):
        product_f32(np.ones((1, 8), np.float32), W.T)


# ------------------------------------------------------------------ paged attention


def _pool(rng, n_blocks=12, n_layers=2, H_kv=2, B=4, D=8):
    """A pool full of random f16 keys and values."""
    vals = rng.standard_normal((n_blocks, n_layers, 2, H_kv, B, D)).astype(np.float32)
    return f32_to_f16(vals)


def _step(rng, data, seqs):
    """seqs: (start, n, table) -> a Step whose new tokens' k, v are already in the pool."""
    return Step.of([(rng.integers(0, 10, n).tolist(), start, table) for start, n, table in seqs])


SEQS = [(5, 1, [3, 7]), (0, 6, [0, 1]), (9, 3, [4, 2, 8]), (0, 1, [5]), (2, 5, [6, 9])]


LONG_SEQS = [(20, 1, [3, 7, 11]), (0, 19, [0, 1, 2]), (13, 6, [4, 9, 8]), (0, 1, [5]), (2, 9, [6, 10])]

DECODES = [(5, 1, [3, 7]), (0, 1, [5]), (9, 1, [4, 2, 8])]  # a step of decodes only: `_attend_decode`

LONG_DECODES = [(20, 1, [3, 7, 11]), (0, 1, [5]), (47, 1, [0, 1, 2, 4])]


@pytest.mark.parametrize("D, B, seqs", [(8, 4, SEQS), (32, 8, LONG_SEQS), (64, 16, LONG_SEQS), (80, 8, LONG_SEQS),
                                        (128, 16, LONG_SEQS), (72, 4, SEQS),
                                        (8, 4, DECODES), (72, 4, DECODES), (64, 16, LONG_DECODES)])
def test_paged_attention_equals_the_gather_and_mask_reference(D, B, seqs):
    """Every path of the kernel: head dimensions short of a step (8), short of the 64 values the
    weighted sum keeps in registers (32), one or two whole runs of 64 (64, 128), a run and a rest
    (80), a rest ending inside a step (72); keys four at a time and one at a time; steps of decodes
    only (`_attend_decode`) and steps with longer sequences in them (`_attend_tiles`)."""
    rng = np.random.default_rng(4)
    data = _pool(rng, B=B, D=D)
    step = _step(rng, data, seqs)
    cache = PoolKv(data, step)
    H = 6  # rep = 3 query heads per KV head
    q = rng.standard_normal((len(step.tokens), H, D)).astype(np.float32)
    for layer in (0, 1):
        o = cache.attend(layer, q)
        assert o.shape == (len(step.tokens), H * D) and o.dtype == np.float32
        np.testing.assert_allclose(o, attend_reference(cache, layer, q), rtol=1e-5, atol=1e-6)


def test_paged_attention_over_more_than_64_keys_equals_the_reference():
    """The scores' blocks of 64 keys (`_scores64`) and the 16-key rest, in a prefill of 150 tokens
    (ten query tiles, its keys widened once for all) and a decode step at position 140, against the
    gather-and-mask reference: the cases above see at most 21 keys."""
    rng = np.random.default_rng(5)
    data = _pool(rng, n_blocks=20, B=16, D=64)
    step = _step(rng, data, [(0, 150, list(range(10))), (140, 1, list(range(10, 19)))])
    cache = PoolKv(data, step)
    q = rng.standard_normal((len(step.tokens), 6, 64)).astype(np.float32)
    for layer in (0, 1):
        np.testing.assert_allclose(cache.attend(layer, q), attend_reference(cache, layer, q), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("D", [64, 72])  # whole steps of 16, and a head dimension ending inside one
def test_paged_attention_gives_a_query_the_same_bits_in_a_prefill_and_alone(D):
    """A query of a prefill (a sequence of several tiles: its keys widened once for all of them) and
    the same query alone in a decode step (one tile: widened inside its task) add the same sums in
    the same order: each score is one chain over d, whatever the tile, so the bits are equal."""
    rng = np.random.default_rng(12)
    data = _pool(rng, n_blocks=8, B=16, D=D)
    n = 3 * QUERY_TILE + 5  # four tiles
    table = list(range(4))
    prefill = Step.of([([1] * n, 0, table)])
    q = rng.standard_normal((n, 6, D)).astype(np.float32)
    o = PoolKv(data, prefill).attend(1, q)
    for t in (0, QUERY_TILE + 3, n - 1):
        alone = PoolKv(data, Step.of([([1], t, table)])).attend(1, q[t : t + 1])
        assert np.array_equal(alone[0], o[t]), f"query {t}, D={D}"


@pytest.mark.parametrize("D", [64, 72])
def test_a_step_of_decodes_gives_the_bits_of_the_tiles_kernel(D):
    """`attend_paged` sends a step of decodes only to `_attend_decode`; every query of it gets the
    bits `_attend_tiles` gives the same step (the same `_attend_tile` on the same widened keys)."""
    from tl_lab.ops import kernels

    rng = np.random.default_rng(13)
    data = _pool(rng, n_blocks=12, B=16, D=D)
    step = _step(rng, data, LONG_DECODES[:2] + [(9, 1, [4, 6, 8])])
    cache = PoolKv(data, step)
    paged = cache.paged
    q = rng.standard_normal((len(step.tokens), 6, D)).astype(np.float32)
    tiles = np.empty_like(cache.attend(1, q))
    kernels._attend_tiles(q, data, 1, paged.tables, paged.seq_of, step.starts, paged.firsts, paged.tiles, tiles,
                          () if D % 16 == 0 else (0,))
    assert np.array_equal(cache.attend(1, q), tiles)


def test_paged_attention_visits_only_the_visible_keys():
    """NaN in every slot a query may not see (past pos(t) = p_s + i) changes nothing: the kernel
    never reads them. (The gather-and-mask reference would: NaN * 0 is NaN.)"""
    rng = np.random.default_rng(5)
    data = _pool(rng)
    step = _step(rng, data, SEQS)
    q = rng.standard_normal((len(step.tokens), 6, 8)).astype(np.float32)
    clean = PoolKv(data, step).attend(1, q)
    B = data.shape[4]
    for s, (start, n, table) in enumerate(SEQS):
        for t in range(n):
            dirty = data.copy()
            for j in range(start + t + 1, len(table) * B):  # keys query t of s may not see
                dirty[table[j // B], 1, :, :, j % B, :] = 0x7E00  # f16 NaN, K and V
            row = int(step.offsets[s]) + t
            got = PoolKv(dirty, step).attend(1, q)[row]
            assert np.array_equal(got, clean[row]), f"seq {s}, query {t} read a key past pos(t)"


def test_paged_attention_reads_what_write_kv_wrote():
    rng = np.random.default_rng(6)
    data = np.zeros((4, 1, 2, 1, 4, 2), np.uint16)
    step = Step.of([([1, 2, 3], 0, [2])])
    k = rng.standard_normal((3, 1, 2)).astype(np.float32)
    v = rng.standard_normal((3, 1, 2)).astype(np.float32)
    cache = PoolKv(data, step)
    cache.write(0, k, v)
    q = np.zeros((3, 1, 2), np.float32)  # equal scores: each query averages its visible values
    o = cache.attend(0, q)
    v16 = f32_to_f16(v).view(np.float16).astype(np.float32)[:, 0]
    np.testing.assert_allclose(o, np.cumsum(v16, axis=0) / np.arange(1, 4)[:, None], rtol=1e-6)
    ref = np.zeros_like(data)
    write_kv(ref, 0, np.array([2, 2, 2]), np.arange(3), k, v)
    assert np.array_equal(data, ref)


# ------------------------------------------------------------------ threads


def test_kernels_give_the_same_bits_at_1_and_2_threads(restore_threads):
    rng = np.random.default_rng(7)
    W = rng.standard_normal((1536, 576)).astype(np.float32)
    layer = QLinear.quantize(W * 0.05, group=32)
    X = rng.standard_normal((9, 576)).astype(np.float32)
    data = _pool(rng)
    step = _step(rng, data, SEQS)
    q = rng.standard_normal((len(step.tokens), 6, 8)).astype(np.float32)
    head = Q8Linear.quantize(W, group=32)
    W_long, X_long = np.ascontiguousarray(W.T), rng.standard_normal((9, 1536)).astype(np.float32)  # K = 1536: 6 x 4 blocks
    outs = []
    for n in (1, 2, 1):
        assert _threads(n) == n
        outs.append((product_f32(X, W), product_f32(X_long, W_long), head_f32(X, W), layer.forward(X),
                     PoolKv(data, step).attend(0, q),
                     product_f32(X[:8], W), layer.forward(X[:8]),  # batches of 9 and of 8 (`matmul8_*`)
                     head.forward(X[:1]), head.forward(X[:8]), _run(matvec_f32, X, W), _run(matvec1_f32, X, W)))
    for a, b in zip(outs[0], outs[1]):
        assert np.array_equal(a, b)
    for a, b in zip(outs[0], outs[2]):
        assert np.array_equal(a, b)


def _run(kernel, X, W):
    """kernel(X, W, y) -> y: (M, N) float32."""
    y = np.empty((X.shape[0], W.shape[0]), np.float32)
    kernel(X, W, y)
    return y


def test_faster_of_keeps_the_kernel_with_the_shortest_best_round_and_restores_the_threads(restore_threads):
    """The chooser of `one_row`, on a clock it is handed: each kernel's best round counts (one
    slow round of the faster kernel does not lose it), the rounds interleave, and it runs at 1 thread."""
    import numba

    now, calls = [0.0], []

    def kernel(name, costs):  # each call advances the clock by its cost: the warm-up's, then a round's
        cost = iter(costs)

        def k():
            calls.append((name, numba.get_num_threads()))
            now[0] += next(cost)
        return k

    assert _threads(2) == 2
    a, b = kernel("a", [9, 5, 1, 5, 5]), kernel("b", [0, 2, 2, 2, 2])
    assert faster_of((a, b), [((), {})], rounds=4, clock=lambda: now[0]) is a
    assert [c for c, _ in calls] == ["a", "b"] * 5 and {t for _, t in calls} == {1}
    assert numba.get_num_threads() == 2
    a, b = kernel("a", [0, 5, 5, 5, 5]), kernel("b", [9, 2, 3, 2, 2])
    assert faster_of((a, b), [((), {})], rounds=4, clock=lambda: now[0]) is b
    # a round is every call in turn: a's first call alone is the shortest, b's rounds are
    a, b = kernel("a", [0, 0] + [1, 5] * 4), kernel("b", [0, 0] + [3, 2] * 4)
    assert faster_of((a, b), [((), {}), ((), {})], rounds=4, clock=lambda: now[0]) is b
    # a later kernel must be faster by more than the tie to be chosen over an earlier one
    a, b = kernel("a", [0, 102, 102, 102, 102]), kernel("b", [0, 100, 100, 100, 100])
    assert faster_of((a, b), [((), {})], rounds=4, clock=lambda: now[0], tie=0.03) is a
    a, b = kernel("a", [0, 104, 104, 104, 104]), kernel("b", [0, 100, 100, 100, 100])
    assert faster_of((a, b), [((), {})], rounds=4, clock=lambda: now[0], tie=0.03) is b


def test_the_measured_kernels_are_measured_once_and_are_each_kinds_kernels():
    import tl_lab.ops.kernels as K

    for kind, choose, kernels, rows in (("f32", lambda: K.one_row("f32"), (K.matvec_f32, K.matvec1_f32), 1),
                                        ("q8", lambda: K.one_row("q8"), (K.matvec_q8, K.matvec1_q8), 1),
                                        ("f32x8", K.eight_rows_f32, (K.matmul8_f32,), 8)):
        choice = choose()
        assert choice.kernel in kernels and choice.ahead in K.AHEAD
        assert choose() is choice
        calls = K._stream_probe(kind)
        for args, kw in calls:
            assert args[0].shape == (rows, args[1].shape[1]) and args[-1].shape == (rows, args[1].shape[0])
            assert kw == ({"cols": K.x_cols(args[1].shape[1])} if rows == 8 else {})
        size = sum(args[1].nbytes for args, _ in calls)
        assert 16 << 20 <= size <= (96 << 20) + 4 * sum(N * K for N, K in K.LAYER)
        if kind != "q8":  # read as a step reads them: a decoder layer's weights in turn
            assert [args[1].shape for args, _ in calls[:4]] == list(K.LAYER)


def test_a_weight_that_fits_the_l2_cache_starts_no_probe_and_a_larger_one_does(monkeypatch):
    """A tiny model's products run each kind's first candidate untimed (`UNPROBED`): the probe's
    weights, twice the last-level cache, had been most of a tiny chat's memory. The first weight
    of `UNPROBED` bytes or more starts it, as before; the bits are the same either way."""
    import tl_lab.ops.kernels as K

    probed = []

    def probe(kind):
        probed.append(kind)
        x, W = np.ones((8 if kind == "f32x8" else 1, 64), np.float32), np.ones((32, 64), np.float32)
        return [((x, W, np.empty((x.shape[0], 32), np.float32)), {})]  # f32 kinds only: no q8 weight is large here

    monkeypatch.setattr(K, "_CHOSEN", {})
    monkeypatch.setattr(K, "_stream_probe", probe)
    rng = np.random.default_rng(11)
    small = rng.standard_normal((64, 576)).astype(np.float32)
    assert small.nbytes < K.UNPROBED
    x8 = rng.standard_normal((8, 576)).astype(np.float32)
    x1 = x8[:1]
    head = Q8Linear.quantize(small, group=32)
    got = K.product_f32(x1, small), K.product_f32(x8, small), head.forward(x1)
    assert probed == [] and K._CHOSEN == {}
    assert np.array_equal(got[0], _run(matvec_f32, x1, small)) and np.array_equal(got[1][:1], got[0])
    assert np.array_equal(got[2], K.product_f32(x1, head.dequantize()))
    big = np.ones((K.UNPROBED // (4 * 576) + 1, 576), np.float32)
    K.product_f32(x1, big)
    K.product_f32(x8, big)
    assert probed == ["f32", "f32x8"] and set(K._CHOSEN) == {"f32", "f32x8"}


def test_a_choice_asks_its_bytes_ahead_in_whole_rows_and_never_changes_the_bits():
    """`Choice` hands the kernel its bytes ahead as weight rows (at least one); asking ahead moves
    no sum, so every distance gives the bits of the kernel asking nothing."""
    import tl_lab.ops.kernels as K

    rng = np.random.default_rng(5)
    W = rng.standard_normal((203, 576)).astype(np.float32)  # 2304-byte rows
    seen = []
    K.Choice(lambda *a: seen.append(a[3:]), 16 << 10)(None, W, None)
    K.Choice(lambda *a: seen.append(a[3:]), 1)(None, W, None)
    K.Choice(lambda *a: seen.append(a[3:]))(None, W, None)
    assert seen == [(7,), (1,), ()]
    X = rng.standard_normal((8, 576)).astype(np.float32)
    ref = _run(K.matvec_f32, X, W)
    for ahead in K.AHEAD + (W.nbytes,):
        for kernel in (K.matvec_f32, K.matvec1_f32):
            assert np.array_equal(_run(K.Choice(kernel, ahead), X[:1], W), ref[:1]), (kernel.__name__, ahead)
        assert np.array_equal(_run(K.Choice(K.matmul8_f32, ahead), X, W), ref), ahead


@pytest.mark.parametrize("threads", [1, 2])
def test_eight_rows_in_column_passes_give_the_same_bits(threads, restore_threads):
    """`matmul8_f32` in passes of any whole steps of columns (its partial sums kept between passes),
    asking anything ahead, with an odd N: the bits of the one pass, at 1 and 2 threads."""
    import tl_lab.ops.kernels as K

    _threads(threads)
    rng = np.random.default_rng(11)
    X, W = lanes_ready(rng.standard_normal((8, 1536)).astype(np.float32), rng.standard_normal((37, 1536)).astype(np.float32))
    ref = rows_f32(X, W)
    for cols in (16, 48, 512, 768, 1520, 1536):
        for ahead in K.AHEAD + (W.nbytes,):
            y = np.full((8, 37), np.nan, np.float32)
            K.Choice(K.matmul8_f32, ahead)(X, W, y, cols=cols)
            assert np.array_equal(y.view(np.uint32), ref.view(np.uint32)), (cols, ahead)


def test_eight_rows_pass_over_columns_that_fit_the_l1_cache():
    """`x_cols`: all columns (0) while x's eight rows fit the L1 data cache, else the fewest equal
    passes of whole steps, each at most `X_IN_L1` bytes of x, that cover K."""
    import tl_lab.ops.kernels as K

    for Kc in (16, 64, 576, 1536, 2048, 4096, 8192, 1000 * 16):
        cols = K.x_cols(Kc)
        if 8 * 4 * Kc < K.L1_BYTES:
            assert cols == 0, Kc
            continue
        passes = -(-Kc // cols)
        assert cols % 16 == 0 and 8 * 4 * cols <= K.X_IN_L1 + 8 * 4 * 15, (Kc, cols)
        assert passes == -(-8 * 4 * Kc // K.X_IN_L1), (Kc, cols)


def test_the_int8_one_row_kernels_give_the_same_bits():
    """`matvec_q8` (four features a pass) and `matvec1_q8` (one), on rows alone and several, a last
    block of features short of four, asking nothing or any distance ahead (`Choice`): the bits of
    `product_f32` on W_hat."""
    import tl_lab.ops.kernels as K
    from tl_lab.ops.widening import F16_AS_F32

    rng = np.random.default_rng(9)
    head = Q8Linear.quantize(rng.standard_normal((203, 576)).astype(np.float32), group=32)
    for M in (1, 3):
        x = rng.standard_normal((M, 576)).astype(np.float32)
        want = product_f32(x, head.dequantize())
        for kernel in (K.matvec_q8, K.matvec1_q8):
            for ahead in K.AHEAD + (head.q.nbytes,):
                y = np.empty((M, 203), np.float32)
                K.Choice(kernel, ahead)(x, head.q, head.scales, F16_AS_F32, y)
                assert np.array_equal(y.view(np.uint32), want.view(np.uint32)), (kernel.__name__, M, ahead)


_BITS_SCRIPT = r"""
import sys
import numpy as np
from tl_lab.forward import PoolKv, Step
import tl_lab.ops.kernels as K
from tl_lab.ops.kernels import head_f32, product_f32, rows_f32, set_threads
from tl_lab.ops.q8 import Q8Linear
from tl_lab.quant import QLinear, f32_to_f16


def run(kernel, X, W):
    y = np.empty((X.shape[0], W.shape[0]), np.float32)
    kernel(X, W, y)
    return y


def run_q8(kernel, X):
    from tl_lab.ops.widening import F16_AS_F32
    y = np.empty((X.shape[0], q8.q.shape[0]), np.float32)
    kernel(X, q8.q, q8.scales, F16_AS_F32, y)
    return y


rng = np.random.default_rng(11)
W = rng.standard_normal((1536, 576)).astype(np.float32)
X = rng.standard_normal((9, 576)).astype(np.float32)
X_long = rng.standard_normal((9, 1536)).astype(np.float32)  # K = 1536: matmul_f32's 6 x 4 blocks (in halves: passes)
q4, q8 = QLinear.quantize(W * 0.05, group=32), Q8Linear.quantize(W, group=32)
q4_long = QLinear.quantize(W.T * 0.05, group=32)  # K = 1536: in halves, in passes of columns
q4_odd = QLinear.quantize(W[:21] * 0.05, group=32)  # in halves: a last tile of 5 rows, its last pair one feature
B, D, H, H_kv, n = 16, 64, 9, 3, 512  # SmolLM2's heads; a 512-token prefill and a decode row
data = f32_to_f16(rng.standard_normal((52, 1, 2, H_kv, B, D)).astype(np.float32))
step = Step.of([([1] * n, 0, list(range(32))), ([1], 300, list(range(32, 51)))])
decodes = Step.of([([1], 300, list(range(32, 51))), ([1], 40, list(range(3)))])  # `_attend_decode`
q = rng.standard_normal((n + 1, H, D)).astype(np.float32)
out = {}
for t in (1, 2):
    set_threads(t)
    for name, y in (("matmul_f32", product_f32(X, W)), ("matmul_f32, 6 x 4", product_f32(X_long, W.T.copy())),
                    ("matmul_f32, passes of 400", run(lambda *a: K.matmul_f32(*a, cols=400), X_long, W.T.copy())),
                    ("matvec_f32", run(K.matvec_f32, X, W)), ("matvec1_f32", run(K.matvec1_f32, X, W)),
                    ("head", head_f32(X, W)),
                    ("matmul8_f32", product_f32(X[:8], W)),
                    ("matmul8_f32, passes of 400, odd N", run(lambda *a: K.matmul8_f32(*a, 3, 400), X_long[:8], W.T[:21].copy())),
                    ("matmul_q4", q4.forward(X)),
                    ("matmul_q4, K = 1536", q4_long.forward(X_long)),
                    ("matmul8_q4", q4.forward(X[:8])), ("matmul8_q4, K = 1536", q4_long.forward(X_long[:8])),
                    ("matmul8_q4, six rows, N = 21", q4_odd.forward(X[:6])),
                    ("attend_paged", PoolKv(data, step).attend(0, q)),
                    ("attend_paged, decodes", PoolKv(data, decodes).attend(0, q[:2])),
                    ("matvec_q8", q8.forward(X)), ("matmul8_q8", q8.forward(X[:8])),
                    ("matvec_q8, four features", run_q8(K.matvec_q8, X)), ("matvec1_q8", run_q8(K.matvec1_q8, X))):
        out[f"{name}, {t} thread(s)"] = y
np.savez(sys.argv[1], **out)
"""


@pytest.fixture(scope="module")
def bits_runs(tmp_path_factory):
    """`_BITS_SCRIPT`'s outputs in three fresh processes: "compiled", this host's target compiling into
    an empty cache of its own; "cached", the same target loading what that one left; "halves", the
    target forced to AVX2 (`machine.AVX2_ONLY`) compiling into another. The two that compile are mostly numba's
    compiler on one core each, so they run side by side (on processor E the two tests that use these
    runs took 173 s one process after another)."""
    import os
    import subprocess
    import sys

    where = tmp_path_factory.mktemp("bits")
    envs = {"compiled": {"NUMBA_CACHE_DIR": str(where / "numba")},
            "halves": {"NUMBA_CACHE_DIR": str(where / "numba-avx2"), **AVX2_ONLY}}
    envs["cached"] = envs["compiled"]

    def start(name):
        return subprocess.Popen([sys.executable, "-c", _BITS_SCRIPT, str(where / f"{name}.npz")],
                                env={**os.environ, **envs[name]}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True)

    def finish(name, proc):
        out, _ = proc.communicate(timeout=600)
        assert proc.returncode == 0, f"the {name} run of the kernels failed:\n{out[-3000:]}"
        return np.load(where / f"{name}.npz")

    side_by_side = {name: start(name) for name in ("compiled", "halves")}
    runs = {name: finish(name, proc) for name, proc in side_by_side.items()}
    assert any((where / "numba").rglob("*.nbi")), "the compiling run left nothing in numba's cache"
    runs["cached"] = finish("cached", start("cached"))
    return runs


def _differ(a, b) -> list[str]:
    return [k for k in a.files if not np.array_equal(a[k], b[k])]


def test_kernels_give_the_same_bits_compiled_or_cached(bits_runs):
    """The first process after a change compiles the kernels, every later one loads them from
    numba's cache, and both must give the same bits (numba optimizes the two differently, issue
    #10617). It broke twice: attention's softmax sum under `reassoc` and a version of `matmul_q4`
    whose fastmath sum crossed its loop over groups. Two fresh processes share an empty cache
    directory of their own: the first compiles, the second loads (`bits_runs`)."""
    differ = _differ(bits_runs["compiled"], bits_runs["cached"])
    assert not differ, f"compiled and cached kernels give different bits: {differ}"


def test_kernels_give_the_same_bits_in_halves_and_in_whole_lanes(bits_runs):
    """Where registers hold 16 floats (AVX-512) the products add 24 sums of whole 16-lane vectors
    side by side; where they hold eight (AVX2) the same sums in halves (`kernels.WIDE`,
    `_block34`, `_quad2h`) and attention 16 keys or values at a time: the same bits. This host's target
    against one forced to AVX2 through NUMBA_CPU_NAME / NUMBA_CPU_FEATURES, each in a process and
    cache of its own (on a host without AVX-512 both run in halves, and the test says which ran)."""
    from tl_lab.ops.kernels import WIDE

    differ = _differ(bits_runs["compiled"], bits_runs["halves"])
    assert not differ, f"{'whole lanes' if WIDE else 'halves on this host'} and halves give other bits: {differ}"


def test_threads_for_times_lone_rows_and_restores_the_count(restore_threads):
    """A step of one row runs on 1 thread or on the count in force (its owner's `LoneRowThreads`
    picks, and is told the step's time), a larger step on the count in force, and the count comes
    back after the block, also when it raises."""
    import numba

    from tl_lab.ops.kernels import _LONE_ROW, SERIAL_ROWS, threads_for

    owner = type("Owner", (), {})()
    assert _threads(2) == 2
    seen = set()
    for _ in range(8):
        with threads_for(SERIAL_ROWS, owner):
            seen.add(numba.get_num_threads())
        assert numba.get_num_threads() == 2
    assert seen == {1, 2}, "the first lone-row steps try both counts"
    assert sum(map(len, _LONE_ROW[owner].times.values())) == 8
    with threads_for(SERIAL_ROWS + 1, owner):
        assert numba.get_num_threads() == 2
    with pytest.raises(RuntimeError), threads_for(1, owner):
        raise RuntimeError("inside")
    assert numba.get_num_threads() == 2


def test_lone_row_threads_pick_the_faster_plan_and_leave_it_when_it_slows():
    """Splitting everything twice as fast as one thread, the big products alone in between: after
    trying each plan, ALL wins, with a probe of each other plan in turn every PROBE steps; then a
    core gets busy and every split takes four times as long: within a few probes one thread wins."""
    from tl_lab.ops.kernels import ALL, ALONE, BIG, LoneRowThreads

    chooser, cost = LoneRowThreads(), {ALONE: 20.0, BIG: 15.0, ALL: 10.0}
    picks = []
    for step in range(8 * LoneRowThreads.PROBE):
        if step == 4 * LoneRowThreads.PROBE:
            cost[BIG], cost[ALL] = 60.0, 40.0  # the busy core
        plan = chooser.pick(2)
        chooser.record(plan, cost[plan])
        picks.append(plan)
    quiet, busy = picks[LoneRowThreads.PROBE : 4 * LoneRowThreads.PROBE], picks[6 * LoneRowThreads.PROBE :]
    assert quiet.count(ALL) >= len(quiet) - 3 and quiet.count(ALONE) >= 1 and quiet.count(BIG) >= 1
    assert busy.count(ALONE) >= len(busy) - 2
    assert chooser.best() == "ALONE" and chooser.medians_ms() == {"ALONE": 20e3, "BIG": 60e3, "ALL": 40e3}
    assert LoneRowThreads().pick(1) == ALONE and LoneRowThreads().best() is None


def test_a_big_step_splits_only_the_products_that_read_more_than_l2(restore_threads):
    """Under BIG a lone row's step runs on one thread and a product reading at least BIG bytes on
    the count in force, then back to one; the bits are those of every other plan."""
    import numba

    import tl_lab.ops.kernels as K

    rng = np.random.default_rng(3)
    small, big = (rng.standard_normal((n, 576)).astype(np.float32) for n in (64, K.BIG // (4 * 576) + 1))
    x = rng.standard_normal((1, 576)).astype(np.float32)
    assert _threads(2) == 2
    ref = product_f32(x, small), product_f32(x, big)
    seen = []
    kernel = K.one_row("f32")
    try:
        K._CHOSEN["f32"] = lambda *a: (seen.append(numba.get_num_threads()), kernel(*a))
        numba.set_num_threads(1)
        K._SPLIT.set(K.BIG, 2)
        got = product_f32(x, small), product_f32(x, big)
        assert numba.get_num_threads() == 1
    finally:
        K._CHOSEN["f32"] = kernel
        K._SPLIT.set(math.inf, 1)
    assert seen == [1, 2]
    assert all(np.array_equal(a, b) for a, b in zip(ref, got))


def test_paged_attention_is_exact_where_exp_of_a_score_overflows():
    """Scores of several hundred (exp overflows float32 past 88.7): the softmax subtracts the maximum
    first, so the output is the reference's, finite. Mutation testing (issue 20): a softmax without
    the maximum subtracted passed every test, on scores of a few units."""
    rng = np.random.default_rng(5)
    data = _pool(rng, B=8, D=32)
    step = _step(rng, data, LONG_SEQS)
    cache = PoolKv(data, step)
    q = 200 * rng.standard_normal((len(step.tokens), 6, 32)).astype(np.float32)
    o = cache.attend(0, q)
    assert np.isfinite(o).all()  # without the maximum: inf / inf, NaN
    # scores of hundreds carry absolute rounding errors of 1e-5, which exp turns into relative ones
    np.testing.assert_allclose(o, attend_reference(cache, 0, q), rtol=1e-3, atol=1e-3)


def test_a_cache_built_from_another_lanes_is_dropped(tmp_path):
    """numba keys a cached kernel on kernels.py's timestamp only, not on lanes.py's, which the kernels
    compile into themselves: the cache remembers the lanes.py it was built from, and its kernels'
    files go when lanes.py changes (others' files stay)."""
    from tl_lab.ops.kernels import drop_cache_of_other_lanes

    def files():
        return sorted(p.name for p in tmp_path.iterdir())

    kept = ["kernels.lanes.sha256", "machine.f-1.py311.nbi"]
    (tmp_path / "machine.f-1.py311.nbi").write_bytes(b"m")
    assert drop_cache_of_other_lanes(tmp_path, b"lanes v1")  # no stamp yet: whatever is there is unknown
    for name in ("kernels.matvec_f32-147.py311.nbi", "kernels.matvec_f32-147.py311.1.nbc"):
        (tmp_path / name).write_bytes(b"k")
    assert not drop_cache_of_other_lanes(tmp_path, b"lanes v1") and len(files()) == 4
    assert drop_cache_of_other_lanes(tmp_path, b"lanes v2") and files() == kept
    assert not drop_cache_of_other_lanes(tmp_path, b"lanes v2")


def test_the_kernels_cache_knows_its_lanes():
    """The cache this process's kernels load from holds the sha256 of today's lanes.py."""
    import hashlib
    from pathlib import Path

    from tl_lab.ops import kernels, lanes

    stamp = Path(kernels.matvec_f32._cache._cache_path) / "kernels.lanes.sha256"
    assert stamp.read_text() == hashlib.sha256(Path(lanes.__file__).read_bytes()).hexdigest()
