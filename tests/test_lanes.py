"""tl_lab/ops/lanes.py: the pieces every kernel builds its sums from (chapter L10.1, section 2.4)."""

import numpy as np
import pytest
from numba import njit

from tl_lab.ops.lanes import (HALF, LANES, vexp, vfma, vfma8, vjoin, vload, vload8, vload_f16_part, vload_part, vmax, vhat,
                          vq8, vsplat, vstore_few, vstore_part, vstore_sums82, vsum, vsum4, vtop, vtranspose16, vzero, vzero8)
from tl_lab.ops.machine import AVX2_ONLY


@njit(cache=True)
def _map_exp(a, out):
    n = a.shape[1]
    for j in range(0, n, LANES):
        m = min(LANES, n - j)
        vstore_part(out, 0, j, m, vexp(vload_part(a, 0, j, m)))


@njit(cache=True)
def _dot(x, w):
    acc = vzero()
    for k in range(0, x.shape[1], LANES):
        acc = vfma(vload(x, 0, k), vload(w, 0, k), acc)
    return vsum(acc)


def test_vexp_is_within_one_ulp_of_exp_and_keeps_the_specials():
    x = np.linspace(-87.33, 88.37, 200_001, dtype=np.float32)[None, :]
    y = np.empty_like(x)
    _map_exp(x, y)
    exact = np.exp(x.astype(np.float64))
    ulps = np.abs(y - exact) / np.spacing(exact.astype(np.float32)).astype(np.float64)
    assert ulps.max() <= 1.0, f"vexp is {ulps.max():.2f} ulp off somewhere"
    specials = np.array([[0.0, -0.0, -np.inf, np.inf, np.nan, -100.0, 100.0]], np.float32)
    out = np.empty_like(specials)
    _map_exp(specials, out)
    assert out[0, :4].tolist() == [1.0, 1.0, 0.0, np.inf] and np.isnan(out[0, 4])
    assert out[0, 5] == 0.0 and out[0, 6] == np.inf  # below float32's normals: 0; above its range: inf


@njit(cache=True)
def _transpose_at(src, i, k, dst, r, c):
    vtranspose16(src, i, k, dst, r, c)


def test_transpose16_moves_one_block_transposed_and_nothing_else():
    src = np.arange(40 * 50, dtype=np.float32).reshape(40, 50)
    dst = np.full((30, 60), -1.0, np.float32)
    _transpose_at(src, 3, 7, dst, 5, 11)
    want = np.full_like(dst, -1.0)
    want[5:21, 11:27] = src[3:19, 7:23].T
    assert np.array_equal(dst, want)


def test_transpose16_of_f16_bits_widens_them_exactly_as_it_moves_them():
    """A uint16 source is f16 bits (the KV pool's keys): the block lands transposed and widened,
    every f16 exactly its float32, the specials included; other dtypes are refused when compiled."""
    rng = np.random.default_rng(3)
    half = rng.standard_normal((40, 50)).astype(np.float16)
    half[4, 9], half[10, 8], half[17, 20] = np.inf, -0.0, np.float16(6e-8)  # inf, -0 and a subnormal inside the block
    dst = np.full((30, 60), -1.0, np.float32)
    _transpose_at(half.view(np.uint16), 3, 7, dst, 5, 11)
    want = np.full_like(dst, -1.0)
    want[5:21, 11:27] = half[3:19, 7:23].astype(np.float32).T
    assert np.array_equal(dst.view(np.uint32), want.view(np.uint32))
    with pytest.raises(TypeError, match="float32 or f16 bits"):
        _transpose_at(np.zeros((16, 16), np.int32), 0, 0, dst, 0, 0)


def test_a_dot_product_adds_in_lanes_then_folds_in_halves():
    """Lane l adds x[k] w[k] for k = l, l + 16, ... one fused multiply-add at a time; the lanes
    fold l + 8 onto l, then l + 4, l + 2, l + 1. Emulated here with numpy (each product exact in
    float64, each step rounded to float32 once, as a fused multiply-add does), it gives the same bits."""
    rng = np.random.default_rng(0)
    for K in (16, 64, 576):
        x = rng.standard_normal((1, K)).astype(np.float32)
        w = rng.standard_normal((1, K)).astype(np.float32)
        lanes = np.zeros(LANES, np.float32)
        for k in range(0, K, LANES):
            lanes = (x[0, k:k + LANES].astype(np.float64) * w[0, k:k + LANES] + lanes).astype(np.float32)
        n = LANES
        while n > 1:
            n //= 2
            lanes = (lanes[:n] + lanes[n:2 * n]).astype(np.float32)
        assert _dot(x, w) == lanes[0], f"K={K}"


@njit(cache=True)
def _dot_in_halves(x, w):
    """`_dot` with lanes 0 .. 7 added over every step first, then lanes 8 .. 15 (`lanes.vload8`)."""
    lo, hi = vzero8(), vzero8()
    for k in range(0, x.shape[1], LANES):
        lo = vfma8(vload8(x, 0, k), vload8(w, 0, k), lo)
    for k in range(HALF, x.shape[1], LANES):
        hi = vfma8(vload8(x, 0, k), vload8(w, 0, k), hi)
    return vsum(vjoin(lo, hi))


def test_a_dot_product_added_in_halves_has_the_bits_of_the_whole_lanes():
    """Each lane's chain is the same whichever half runs first, so the sums have the same bits
    (values spread over seven decades, so that another order of any lane's terms would show)."""
    rng = np.random.default_rng(1)
    for K in (16, 48, 576, 1536):
        for _ in range(20):
            x = (rng.standard_normal((1, K)) * 10.0 ** rng.integers(-3, 4, (1, K))).astype(np.float32)
            w = rng.standard_normal((1, K)).astype(np.float32)
            assert _dot_in_halves(x, w) == _dot(x, w), f"K={K}"


@njit(cache=True)
def _folds(a, four, one, top):
    """Row by row of a (R, 16): vsum (one), vsum4 of rows 4r .. 4r + 3 (four), and vtop of the
    rows' lane-by-lane maximum (top)."""
    m = vload(a, 0, 0)
    for r in range(a.shape[0]):
        one[r] = vsum(vload(a, r, 0))
        m = vmax(m, vload(a, r, 0))
    for r in range(0, a.shape[0], 4):
        vstore_part(four, r // 4, 0, 4, vsum4(vload(a, r, 0), vload(a, r + 1, 0), vload(a, r + 2, 0), vload(a, r + 3, 0)))
    top[0] = vtop(m)


def test_four_folds_at_once_give_the_bits_of_four_and_the_maximum_is_exact():
    """vsum4 shares its shuffles between four vectors but adds the very same pairs: its lanes are
    four vsums, bit for bit (values spread over 40 binades, where any other pairing would show)."""
    rng = np.random.default_rng(3)
    a = (rng.standard_normal((4000, LANES)) * np.exp2(rng.integers(-20, 20, (4000, LANES)))).astype(np.float32)
    four, one, top = np.empty((1000, 4), np.float32), np.empty(4000, np.float32), np.empty(1, np.float32)
    _folds(a, four, one, top)
    assert np.array_equal(four.reshape(-1).view(np.uint32), one.view(np.uint32))
    assert top[0] == a.max()


@njit(cache=True)
def _sixteen_folds(a, y, one):
    """Blocks of 16 rows of a (R, 16) as `vstore_sums82` takes them (rows 16 j .. + 7 the a side,
    + 8 .. + 15 the b side) into y (8, R / 8), and every row's vsum into one."""
    for r in range(a.shape[0]):
        one[r] = vsum(vload(a, r, 0))
    for j in range(a.shape[0] // 16):
        r = 16 * j
        lo = (vload(a, r, 0), vload(a, r + 1, 0), vload(a, r + 2, 0), vload(a, r + 3, 0),
              vload(a, r + 4, 0), vload(a, r + 5, 0), vload(a, r + 6, 0), vload(a, r + 7, 0))
        hi = (vload(a, r + 8, 0), vload(a, r + 9, 0), vload(a, r + 10, 0), vload(a, r + 11, 0),
              vload(a, r + 12, 0), vload(a, r + 13, 0), vload(a, r + 14, 0), vload(a, r + 15, 0))
        vstore_sums82(y, 2 * j, lo, hi)


def test_sixteen_folds_side_by_side_give_the_bits_of_sixteen():
    """The 8 x 2 blocks' store folds sixteen vectors at once and must add the very same pairs as
    vsum: y[m, 2 j] is row 16 j + m's vsum and y[m, 2 j + 1] row 16 j + 8 + m's, bit for bit (values
    over 40 binades), and nothing outside those columns is written."""
    rng = np.random.default_rng(5)
    a = (rng.standard_normal((1600, LANES)) * np.exp2(rng.integers(-20, 20, (1600, LANES)))).astype(np.float32)
    y, one = np.full((8, 201), np.nan, np.float32), np.empty(1600, np.float32)
    _sixteen_folds(a, y, one)
    blocks = one.reshape(100, 2, 8)  # (j, side, m)
    assert np.array_equal(y[:, :200].view(np.uint32), blocks.transpose(2, 0, 1).reshape(8, 200).view(np.uint32))
    assert np.isnan(y[:, 200]).all()


@njit(cache=True)
def _part(a, n, out):
    vstore_part(out, 0, 0, n, vload_part(a, 0, 0, n))


@njit(cache=True)
def _few(a, k, n, out):
    vstore_few(out, 0, k, n, vload(a, 0, 0))


@njit(cache=True)
def _part_f16(bits, n, out):
    vstore_part(out, 0, 0, n, vload_f16_part(bits, 0, 0, n))


@njit(cache=True)
def _hat(P, shift, s, out):
    for i in range(P.shape[0]):
        vstore_part(out, i, 0, LANES, vhat(P, i, 0, shift, vsplat(s)))


def test_masked_steps_read_and_write_only_their_lanes():
    a = np.arange(1, 17, dtype=np.float32)[None, :]
    for n in (1, 5, 16):
        out = np.full((1, LANES), -1.0, np.float32)
        _part(a, n, out)
        assert out[0, :n].tolist() == a[0, :n].tolist() and (out[0, n:] == -1.0).all()
    halves = np.array([[0.5, -2.0, 65504.0, 6e-8, np.inf, 1.0, 3.0]], np.float16)
    out = np.full((1, LANES), -1.0, np.float32)
    _part_f16(halves.view(np.uint16), 7, out)
    assert out[0, :7].tolist() == halves[0].astype(np.float32).tolist() and (out[0, 7:] == -1.0).all()
    for n in range(5):  # the few sums a store of `vstore_few` writes, from column 3 on
        out = np.full((1, 2 * LANES), -1.0, np.float32)
        _few(a, 3, n, out)
        assert out[0, 3:3 + n].tolist() == a[0, :n].tolist() and (np.delete(out[0], range(3, 3 + n)) == -1.0).all()


_HAT_SCRIPT = """
import sys
import numpy as np
from numba import njit
from tl_lab.ops.lanes import LANES, vhat, vsplat, vstore_part

@njit
def hat(P, shift, s, out):
    for i in range(P.shape[0]):
        vstore_part(out, i, 0, LANES, vhat(P, i, 0, shift, vsplat(s)))

P = np.arange(256, dtype=np.uint8).reshape(16, 16)
out = np.empty((2, 16, 16), np.float32)
for shift in (0, 4):
    hat(P, shift, np.float32(float(sys.argv[1])), out[shift // 4])
np.save(sys.argv[2], out)
"""


@pytest.mark.parametrize("s", [0.0078125, 1.5 * 2.0**-9, 65504.0, -0.375])
def test_hat_is_the_stored_nibble_minus_8_times_the_scale(s):
    """Every byte value, both nibbles: W_hat = (n - 8) s exactly, n = the low or high nibble."""
    P = np.arange(256, dtype=np.uint8).reshape(16, 16)
    for shift, nib in ((0, P & 15), (4, P >> 4)):
        out = np.empty((16, LANES), np.float32)
        _hat(P, shift, np.float32(s), out)
        assert np.array_equal(out, (nib.astype(np.float32) - 8) * np.float32(s)), f"shift {shift}"


def test_hat_gives_the_same_bits_without_avx512(tmp_path):
    """`vhat` picks each nibble's lane of a table with AVX-512 and computes (n - 8) s without: the
    two machine codes give the same bits (a target without AVX-512 forced through numba's
    NUMBA_CPU_NAME / NUMBA_CPU_FEATURES, in a process and cache of its own)."""
    import os
    import subprocess
    import sys

    outs = []
    for name, target in (("native", {}), ("avx2", AVX2_ONLY)):
        env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / f"numba-{name}"), **target}
        out = tmp_path / f"{name}.npy"
        subprocess.run([sys.executable, "-c", _HAT_SCRIPT, "0.01171875", str(out)], env=env, check=True, timeout=300)
        outs.append(np.load(out))
    P = np.arange(256, dtype=np.uint8).reshape(16, 16)
    want = (np.stack([(P & 15), (P >> 4)]).astype(np.float32) - 8) * np.float32(0.01171875)
    assert np.array_equal(outs[0], want) and np.array_equal(outs[0], outs[1])


@njit(cache=True)
def _q8(Q, s, out):
    for i in range(Q.shape[0]):
        vstore_part(out, i, 0, LANES, vq8(Q, i, 0, vsplat(s)))


@pytest.mark.parametrize("s", [0.0078125, 1.5 * 2.0**-9, 65504.0 / 128, -0.375])
def test_q8_is_the_stored_int8_times_the_scale(s):
    """Every int8 value: W_hat = q s exactly (q's 8 bits times an f16's 11 fit a float32)."""
    Q = np.arange(-128, 128, dtype=np.int8).reshape(16, 16)
    out = np.empty((16, LANES), np.float32)
    _q8(Q, np.float32(s), out)
    assert np.array_equal(out, Q.astype(np.float64) * s) and np.array_equal(out, Q.astype(np.float32) * np.float32(s))
