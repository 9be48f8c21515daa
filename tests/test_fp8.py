"""tl_lab/ops/fp8.py: e4m3 and e5m2 rounding for the "Going further" fp8 KV cache (notebook 12)."""

import numpy as np
import pytest

from conftest import need
from tl_lab.ops.fp8 import E4M3, E5M2, f32_to_fp8, fp8_round, fp8_to_f32, fp8_values


@pytest.mark.parametrize("fmt", [E4M3, E5M2])
def test_every_finite_code_round_trips(fmt):
    values = fp8_values(fmt)
    finite = np.flatnonzero(np.isfinite(values))
    assert len(finite) == (254 if fmt is E4M3 else 248)  # e4m3fn: 2 NaNs; e5m2: 6 NaNs, 2 infinities
    assert np.array_equal(fp8_round(values[finite], fmt), values[finite])
    assert f32_to_fp8(values[finite], fmt).tolist() == finite.tolist()
    assert np.array_equal(fp8_to_f32(finite.astype(np.uint8), fmt), values[finite])


def test_the_formats_ranges():
    assert E4M3.max_finite == 448.0 and E5M2.max_finite == 57344.0
    assert fp8_values(E4M3)[1] == 2.0**-9 and fp8_values(E5M2)[1] == 2.0**-16  # smallest subnormals
    assert fp8_values(E4M3)[0x38] == 1.0 and fp8_values(E5M2)[0x3C] == 1.0


def test_ties_go_to_the_even_mantissa():
    # e4m3 has 3 mantissa bits: between 1 and 2 the step is 1/8
    assert fp8_round(1 + 1 / 16, "e4m3") == 1.0           # halfway 1 (000) and 1.125 (001): even is 1
    assert fp8_round(1 + 3 / 16, "e4m3") == 1.25          # halfway 1.125 (001) and 1.25 (010)
    assert fp8_round(1 + 1 / 16 + 1e-6, "e4m3") == 1.125  # just above half rounds up
    assert fp8_round(1 + 1 / 8, "e5m2") == 1.0            # e5m2: step 1/4, halfway 1 and 1.25
    assert fp8_round(2.0**-10, "e4m3") == 0.0             # halfway 0 and the smallest subnormal 2^-9
    assert fp8_round(3 * 2.0**-10, "e4m3") == 2.0**-8     # halfway 2^-9 (001) and 2^-8 (010)
    assert fp8_round(15.5, "e4m3") == 16.0                # rounding up into the next binade
    assert fp8_round(-1 - 3 / 16, "e4m3") == -1.25 and f32_to_fp8(-1.25, "e4m3") == 0x80 | 0x3A


def test_saturation_nan_and_signed_zero():
    assert fp8_round([1000.0, -1e30, np.inf], "e4m3").tolist() == [448.0, -448.0, 448.0]
    assert fp8_round(1e6, "e5m2") == 57344.0
    assert np.isnan(fp8_round(np.nan, "e4m3")) and np.isnan(fp8_to_f32(f32_to_fp8(np.nan, "e4m3"), "e4m3"))
    assert np.isnan(fp8_to_f32(f32_to_fp8(np.nan, "e5m2"), "e5m2"))
    assert f32_to_fp8(-0.0, "e4m3") == 0x80 and f32_to_fp8(0.0, "e4m3") == 0x00


@pytest.mark.parametrize("fmt, bound", [(E4M3, 2.0**-4), (E5M2, 2.0**-3)])
def test_relative_error_is_half_an_ulp_in_the_normal_range(fmt, bound):
    rng = np.random.default_rng(0)
    x = np.exp(rng.uniform(np.log(2.0**fmt.min_exp), np.log(fmt.max_finite), 100_000)) * rng.choice([-1, 1], 100_000)
    rel = np.abs(fp8_round(x, fmt) - x) / np.abs(x)
    worst = bound / (1 + bound)  # half an ulp, just above a power of two (x = 1 + bound rounds to 1)
    assert rel.max() <= worst * (1 + 1e-9) and rel.max() > worst * 0.99   # reached, never passed


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="e4m3"):
        fp8_round(1.0, "e3m4")
    with pytest.raises(ValueError, match="uint8"):
        fp8_to_f32(np.array([1, 2], np.int32))


@pytest.mark.hf
@pytest.mark.parametrize("fmt, dtype", [(E4M3, "float8_e4m3fn"), (E5M2, "float8_e5m2")])
def test_rounding_matches_torch(fmt, dtype):
    """Against torch's own float8 conversion, inside the finite range (torch does not saturate)."""
    torch = need("torch")
    rng = np.random.default_rng(1)
    values = fp8_values(fmt)
    pos = np.sort(values[np.isfinite(values) & (values >= 0)].astype(np.float64))
    mids = (pos[:-1] + pos[1:]) / 2                             # every tie
    x = np.concatenate([mids, -mids, np.nextafter(mids, 0), np.nextafter(mids, np.inf),
                        rng.uniform(-fmt.max_finite, fmt.max_finite, 50_000),
                        rng.standard_normal(50_000) * 2.0 ** rng.integers(-20, 8, 50_000)]).astype(np.float32)
    want = torch.from_numpy(x).to(getattr(torch, dtype)).view(torch.uint8).numpy()
    assert np.array_equal(f32_to_fp8(x, fmt), want)


def test_the_default_format_is_e4m3():
    """The notebook's calls leave the format out: e4m3, the KV cache's usual fp8."""
    x = np.array([0.3, -7.0, 300.0, 1e-3], np.float32)
    codes = f32_to_fp8(x, "e4m3")
    assert np.array_equal(f32_to_fp8(x), codes) and np.array_equal(fp8_round(x), fp8_round(x, E4M3))
    assert np.array_equal(fp8_to_f32(codes), fp8_to_f32(codes, "e4m3"))
    assert not np.array_equal(fp8_to_f32(codes), fp8_to_f32(codes, "e5m2"))
