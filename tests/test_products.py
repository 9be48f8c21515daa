"""tl_lab/ops/products.py: the numpy reference products and the evidence for the tile design (chapter
L10.1, section 2.4). Lab tests of given engineering, not graded."""

import numpy as np
import pytest

from tl_lab.ops.products import LONG_ROWS, TILE, matmul_rows, matvec_rows, plan_rows, product_rows

# (in, out) of every linear of the tiny test model and of SmolLM2-135M
TINY_SHAPES = [(64, 64), (64, 32), (64, 128), (128, 64), (64, 256)]
SMOL_SHAPES = [(576, 576), (576, 192), (576, 1536), (1536, 576)]
SMOL_HEAD = (576, 49152)


def weight(rng, K, N):
    """A random weight stored (out, in) = (N, K), as in a checkpoint."""
    return (rng.standard_normal((N, K)) * K ** -0.5).astype(np.float32)

@pytest.mark.parametrize("K,N", TINY_SHAPES + SMOL_SHAPES)
def test_plain_product_is_not_row_invariant(K, N):
    """numpy's x @ W.T: the same row changes bits with the number of rows in the call.

    This is why the runner needs matmul_rows. On this machine's OpenBLAS a lone row takes gemv
    and every batch of 2 to 64 rows gives row 0 other bits; the test asks for at least one.
    """
    rng = np.random.default_rng(K * 7 + N)
    W = weight(rng, K, N)
    X = rng.standard_normal((64, K)).astype(np.float32)
    alone = (X[:1] @ W.T)[0]
    changed = next((M for M in range(2, 65) if not np.array_equal((X[:M] @ W.T)[0], alone)), None)
    assert changed is not None, f"x @ W.T was row-invariant for ({K} -> {N}) at every batch size 1..64"


def test_plain_product_breaks_the_lm_head_shape():
    rng = np.random.default_rng(3)
    W = weight(rng, *SMOL_HEAD)
    X = rng.standard_normal((16, SMOL_HEAD[0])).astype(np.float32)
    alone = (X[:1] @ W.T)[0]
    assert any(not np.array_equal((X[:M] @ W.T)[0], alone) for M in (2, 8, 16))


def _garbage(rng, M, K, kind):
    if kind == "zeros":
        return np.zeros((M, K), np.float32)
    if kind == "huge":
        return (rng.standard_normal((M, K)) * 1e30).astype(np.float32)
    return rng.standard_normal((M, K)).astype(np.float32)


@pytest.mark.parametrize("K,N", TINY_SHAPES + SMOL_SHAPES)
def test_matmul_rows_is_row_invariant(K, N):
    """Every row of matmul_rows has the same bits alone and at any place in batches of 1..70
    rows, whatever the other rows hold (random, zeros, huge values)."""
    rng = np.random.default_rng(K * 11 + N)
    W = weight(rng, K, N)
    W_T = W.T
    probes = rng.standard_normal((5, K)).astype(np.float32)
    alone = np.stack([matmul_rows(p[None], W_T)[0] for p in probes])
    for M in list(range(1, 18)) + [23, 31, 32, 33, 47, 64, 70]:
        kind = ("random", "zeros", "huge")[M % 3]
        X = _garbage(rng, M, K, kind)
        where = rng.choice(M, size=min(M, len(probes)), replace=False)
        X[where] = probes[: len(where)]
        Y = matmul_rows(X, W_T)
        for i, r in enumerate(where):
            assert np.array_equal(Y[r], alone[i]), f"({K}->{N}) probe {i} at row {r} of {M} changed"


def test_matmul_rows_is_row_invariant_for_the_lm_head():
    rng = np.random.default_rng(5)
    W = weight(rng, *SMOL_HEAD)
    p = rng.standard_normal(SMOL_HEAD[0]).astype(np.float32)
    alone = matmul_rows(p[None], W.T)[0]
    for M in (2, 7, 8, 9, 16):
        X = rng.standard_normal((M, SMOL_HEAD[0])).astype(np.float32)
        X[M // 2] = p
        assert np.array_equal(matmul_rows(X, W.T)[M // 2], alone), f"batch {M}"


def test_matmul_rows_is_row_invariant_with_one_blas_thread():
    """The tiles hold for another thread count too (the bits differ between thread counts, which
    is why EngineConfig.threads is fixed for a run)."""
    from tl_lab.ops.tuning import blas_threads, set_blas_threads

    before = blas_threads()
    assert before is not None, "numpy's OpenBLAS was not found"
    rng = np.random.default_rng(13)
    W_T = weight(rng, 576, 1536).T
    p = rng.standard_normal(576).astype(np.float32)
    try:
        set_blas_threads(1)
        assert blas_threads() == 1
        alone = matmul_rows(p[None], W_T)[0]
        for M in (2, 8, 9, 33):
            X = rng.standard_normal((M, 576)).astype(np.float32)
            X[M - 1] = p
            assert np.array_equal(matmul_rows(X, W_T)[M - 1], alone), f"batch {M}, one thread"
    finally:
        set_blas_threads(before)
    assert blas_threads() == before


def test_matmul_rows_is_row_invariant_while_another_thread_uses_blas():
    """OpenBLAS's thread count is fixed for the process: a concurrent BLAS user (another Python
    thread here; other processes on the machine likewise) does not change a tile's bits."""
    import threading

    rng = np.random.default_rng(14)
    W_T = weight(rng, 576, 1536).T
    p = rng.standard_normal(576).astype(np.float32)
    alone = matmul_rows(p[None], W_T)[0]
    stop = threading.Event()

    def hammer():
        a = np.ones((500, 500), np.float32)
        while not stop.is_set():
            a @ a

    t = threading.Thread(target=hammer)
    t.start()
    try:
        for M in (1, 3, 8, 9, 20):
            X = rng.standard_normal((M, 576)).astype(np.float32)
            X[M // 2] = p
            assert np.array_equal(matmul_rows(X, W_T)[M // 2], alone), f"batch {M} under load"
    finally:
        stop.set()
        t.join()


def _misaligned(a: np.ndarray) -> np.ndarray:
    """A copy of float32 `a` whose data starts 4 bytes past a 64-byte boundary."""
    buf = np.empty(a.nbytes + 128, dtype=np.uint8)
    start = (-buf.ctypes.data) % 64 + 4
    out = buf[start : start + a.nbytes].view(np.float32).reshape(a.shape)
    out[...] = a
    return out


@pytest.mark.parametrize("K,N", [(64, 256), SMOL_HEAD])
def test_matvec_rows_is_row_invariant(K, N):
    """The LM head's product: each row alone through gemv, so a row's bits never depend on the
    others, nor on where its row sits in memory."""
    rng = np.random.default_rng(K + N)
    W = weight(rng, K, N)
    p = rng.standard_normal(K).astype(np.float32)
    alone = matvec_rows(p[None], W.T)[0]
    np.testing.assert_allclose(alone, W @ p, rtol=1e-4, atol=1e-4)
    for M in (2, 5, 8, 9, 16):
        X = rng.standard_normal((M, K)).astype(np.float32)
        r = int(rng.integers(M))
        X[r] = p
        assert np.array_equal(matvec_rows(X, W.T)[r], alone), f"batch {M}, row {r}"
        assert np.array_equal(matvec_rows(_misaligned(X), W.T)[r], alone), f"batch {M}, misaligned"


def test_matmul_rows_does_not_care_where_a_row_sits_in_memory():
    rng = np.random.default_rng(15)
    W_T = weight(rng, 576, 576).T
    X = rng.standard_normal((11, 576)).astype(np.float32)
    assert np.array_equal(matmul_rows(_misaligned(X), W_T), matmul_rows(X, W_T))


def test_matmul_rows_equals_the_product_within_float_tolerance():
    rng = np.random.default_rng(6)
    W = weight(rng, 64, 96)
    X = rng.standard_normal((21, 64)).astype(np.float32)
    Y = matmul_rows(X, W.T)
    assert Y.shape == (21, 96) and Y.dtype == np.float32
    np.testing.assert_allclose(Y, X.astype(np.float64) @ W.T.astype(np.float64), rtol=1e-5, atol=1e-5)


def test_tile_size_is_one_that_works():
    """The 8-row tile: a probe row gives the same bits at each of the 8 places of a tile."""
    assert TILE == 8
    rng = np.random.default_rng(8)
    for K, N in [(64, 64), (576, 1536)]:
        W_T = weight(rng, K, N).T
        p = rng.standard_normal(K).astype(np.float32)
        outs = []
        for place in range(TILE):
            X = rng.standard_normal((TILE, K)).astype(np.float32)
            X[place] = p
            outs.append(matmul_rows(X, W_T)[place])
        assert all(np.array_equal(outs[0], o) for o in outs)


def test_product_rows_keeps_each_sequence_to_itself():
    """Short sequences share tiles, a long one (>= LONG_ROWS new tokens) gets its own gemm: each
    sequence's rows come out the same alone and in a shuffled batch."""
    rng = np.random.default_rng(9)
    W_T = weight(rng, 64, 128).T
    lengths = [1, 3, LONG_ROWS, 1, LONG_ROWS + 17, 9, 1]
    seqs = [rng.standard_normal((n, 64)).astype(np.float32) for n in lengths]
    alone = [product_rows(s, W_T, plan_rows([len(s)])) for s in seqs]
    for trial in range(4):
        order = rng.permutation(len(seqs))
        X = np.concatenate([seqs[i] for i in order])
        Y = product_rows(X, W_T, plan_rows([lengths[i] for i in order]))
        a = 0
        for i in order:
            assert np.array_equal(Y[a : a + lengths[i]], alone[i]), f"seq {i} (n={lengths[i]})"
            a += lengths[i]


def test_product_rows_plain_is_x_at_w():
    rng = np.random.default_rng(10)
    W_T = weight(rng, 64, 32).T
    X = rng.standard_normal((5, 64)).astype(np.float32)
    assert np.array_equal(product_rows(X, W_T, None, "plain"), X @ W_T)
    with pytest.raises(ValueError, match="product"):
        product_rows(X, W_T, None, "fast")


def test_plan_rows_splits_short_and_long():
    plan = plan_rows([1, LONG_ROWS, 2])
    assert plan.n_rows == LONG_ROWS + 3
    assert plan.short.tolist() == [0, LONG_ROWS + 1, LONG_ROWS + 2]
    assert plan.spans == ((1, LONG_ROWS + 1),)


def test_the_tiled_products_are_float32_tile_by_tile():
    """matmul_rows: each row the float32 product of its zero-padded 8-row tile (one BLAS call per
    tile, nothing widened to float64); matvec_rows and product_rows without a plan: float32 too."""
    rng = np.random.default_rng(11)
    x = rng.standard_normal((11, 24)).astype(np.float32)
    W_T = rng.standard_normal((24, 40)).astype(np.float32)
    tiles = np.zeros((2 * TILE, 24), dtype=np.float32)
    tiles[:11] = x
    want = np.concatenate([tiles[i : i + TILE] @ W_T for i in range(0, 2 * TILE, TILE)])[:11]
    got = matmul_rows(x, W_T)
    assert got.dtype == np.float32 and np.array_equal(got, want)
    assert np.array_equal(product_rows(x, W_T), want)  # plan=None: every row tiled
    assert matvec_rows(x, W_T).dtype == np.float32


def test_a_plan_of_long_sequences_only_has_an_integer_empty_short_list():
    plan = plan_rows([LONG_ROWS, LONG_ROWS + 2])
    assert plan.short.size == 0 and plan.short.dtype == np.intp


def test_weight_t_is_a_view_of_w_or_of_w_hat_in_one_buffer_per_shape():
    """`weight_t`: a float32 linear's W.T is a view (no copy); an int4 linear's is W_hat = q s widened
    into `Scratch`'s one buffer of its shape, which the next linear of that shape overwrites (at most
    one f32 copy per shape resident), or into a new array without a scratch."""
    from tl_lab.model import Linear
    from tl_lab.ops.products import Scratch, weight_t
    from tl_lab.quant import QLinear

    rng = np.random.default_rng(3)
    w = rng.standard_normal((6, 64)).astype(np.float32)
    lin = Linear(w)
    assert weight_t(lin).base is w and np.array_equal(weight_t(lin), w.T)
    q1, q2 = (QLinear.quantize(rng.standard_normal((6, 64)).astype(np.float32), 32) for _ in range(2))
    q3 = QLinear.quantize(rng.standard_normal((4, 64)).astype(np.float32), 32)
    scratch = Scratch()
    t1 = weight_t(q1, scratch)
    assert t1.shape == (64, 6) and np.array_equal(t1, q1.dequantize().T)
    t2 = weight_t(q2, scratch)
    assert np.shares_memory(t1, t2) and np.array_equal(t2, q2.dequantize().T)  # the same buffer, overwritten
    t3 = weight_t(q3, scratch)
    assert not np.shares_memory(t3, t2) and t3.shape == (64, 4)
    assert scratch.nbytes == (6 * 64 + 4 * 64) * 4  # one buffer per shape
    fresh = weight_t(q1)
    assert not np.shares_memory(fresh, t2) and np.array_equal(fresh, q1.dequantize().T)
    with pytest.raises(TypeError, match="expected a Linear or QLinear, got ndarray"):
        weight_t(w)
