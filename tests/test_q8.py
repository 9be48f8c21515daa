"""Tests for tl_lab/ops/q8.py: the int4 model's int8 LM head (given engineering beside chapter L10.1, section 2.5)."""

import numpy as np
import pytest

from tl_lab.ops.q8 import Q8Linear
from tl_lab.quant import f16_to_f32, f32_to_f16


def test_q8_linear_is_within_half_a_step_with_the_stored_scale():
    """s = f16(max|w| / 127), q = clamp(rint(w / s), -127, 127) with the STORED s, W_hat = q s exact;
    an all-zero group is s = 0, q = 0; the product is x W_hat^T."""
    rng = np.random.default_rng(8)
    w = (rng.standard_normal((5, 64)) * [[0.01], [1.0], [30.0], [0.0], [1e-6]]).astype(np.float32)
    w[1, 3] = 0.0
    layer = Q8Linear.quantize(w, group=32)
    s = f16_to_f32(layer.scales)
    assert np.array_equal(layer.scales, f32_to_f16(np.abs(w.reshape(5, 2, 32)).max(axis=2) / np.float32(127)))
    assert layer.scales[3].tolist() == [0, 0] and not layer.q[3].any()  # a zero group
    W_hat = layer.dequantize()
    q = np.rint(w.reshape(5, 2, 32) / np.where(s > 0, s, 1)[:, :, None]).clip(-127, 127)
    assert np.array_equal(layer.q.reshape(5, 2, 32), q.astype(np.int8))
    assert np.array_equal(W_hat, (q * s[:, :, None]).reshape(5, 64).astype(np.float32))
    assert (np.abs(w - W_hat)[:4] <= np.repeat(s, 32, axis=1)[:4] / 2).all()
    assert layer.scales[4].tolist() == [0, 0] and not W_hat[4].any()  # max|w| / 127 under f16's least: s = 0, as for int4
    assert np.abs(layer.q).max() == 127 and layer.nbytes == 5 * 64 + 5 * 2 * 2
    x = rng.standard_normal((3, 64)).astype(np.float32)
    np.testing.assert_allclose(layer.forward(x), x.astype(np.float64) @ W_hat.T, rtol=1e-5, atol=1e-5)


def test_q8_linear_refuses_bad_input():
    w = np.ones((2, 64), dtype=np.float32)
    for group in (8, 24, 0, 48):
        with pytest.raises(ValueError, match="group must be a positive multiple of 16 dividing inp=64"):
            Q8Linear.quantize(w, group=group)
    with pytest.raises(ValueError, match="too large for an f16 scale"):
        Q8Linear.quantize(w * 1e8, group=32)
    bad = w.copy()
    bad[1, 2] = np.inf
    with pytest.raises(ValueError, match=r"finite, got w\[1, 2\] = inf"):
        Q8Linear.quantize(bad, group=32)
    q, sc = np.zeros((2, 64), np.int8), np.zeros((2, 2), np.uint16)
    with pytest.raises(ValueError, match="q must be int8"):
        Q8Linear(q.astype(np.uint8), sc, 32)
    with pytest.raises(ValueError, match="q must be a 2-D int8"):
        Q8Linear([[0] * 64], sc, 32)
    with pytest.raises(ValueError, match=r"scales must have shape \(2, 2\)"):
        Q8Linear(q, np.zeros((2, 4), np.uint16), 32)
    with pytest.raises(ValueError, match=r"finite non-negative f16, got 0xBC00 at scales\[0, 1\]"):
        Q8Linear(q, np.array([[0, 0xBC00], [0, 0]], np.uint16), 32)
    with pytest.raises(ValueError, match=r"x must be \(m, 64\)"):
        Q8Linear(q, sc, 32).forward(np.ones((1, 63), np.float32))


def test_q8_quantizes_every_block_of_rows_and_stays_float32():
    """More rows than Q8Linear.quantize takes at a time (Q8_ROWS): every row quantized; W_hat float32;
    an all-zero group (scale 0, its 0 / 0 masked) raises no warning."""
    import warnings

    from tl_lab.ops.q8 import Q8_ROWS

    rng = np.random.default_rng(3)
    w = rng.standard_normal((2 * Q8_ROWS + 3, 32)).astype(np.float32)  # three blocks, the last of 3 rows
    w[-1, :16] = 0.0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        layer = Q8Linear.quantize(w, group=16)
    w_hat = layer.dequantize()
    assert w_hat.dtype == np.float32 and np.all(w_hat[-1, :16] == 0)
    assert np.abs(w_hat - w).max() <= np.abs(w).max() / 127  # every row, the last block's too


def test_q8_refuses_weights_too_large_for_its_f16_scales_naming_the_bound():
    w = np.ones((2, 16), dtype=np.float32)
    w[1, 3] = 1e7
    with pytest.raises(ValueError, match=r"max\|w\| must stay below 8319008"):
        Q8Linear.quantize(w, group=16)
