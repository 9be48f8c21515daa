"""tl_lab/ops/checks.py: the one rule for argument checks every module's errors go through. Each check
names the argument, the value and what was wanted, and never copies what it passes through."""

import numpy as np
import pytest

from tl_lab.ops.checks import as_float, as_int, exact_array, f16_scales, finite_matrix, first_bool, is_int, rows_of


def test_an_integer_is_a_python_or_numpy_integer_never_a_bool():
    assert is_int(3) and is_int(np.int64(3)) and is_int(np.uint8(3))
    assert not any(is_int(v) for v in (True, np.bool_(True), 3.0, "3", None))


def test_first_bool_finds_a_bool_that_numpy_would_read_as_an_integer():
    assert np.asarray([5, True]).dtype.kind == "i"  # why the list itself is looked at
    assert first_bool([5, True]) == 1 and first_bool((np.bool_(False),)) == 0
    assert first_bool([1, 2]) is None and first_bool(np.array([True])) is None and first_bool([]) is None


def test_as_int_names_the_argument_the_type_and_the_range():
    assert as_int(np.int32(5), "n", lo=0, hi=9) == 5 and type(as_int(np.int32(5), "n")) is int
    assert as_int(3, "n", lo=3, hi=3) == 3  # the range is closed: both bounds are in it
    with pytest.raises(ValueError, match=r"^n must be an integer, got bool True$"):
        as_int(True, "n")
    with pytest.raises(ValueError, match=r"^n must be in \[0, 3\], got 5$"):
        as_int(5, "n", lo=0, hi=3)
    with pytest.raises(ValueError, match=r"^n must be in \[-inf, 3\], got 5$"):
        as_int(5, "n", hi=3)
    with pytest.raises(KeyError, match=r"n must be in \[2, inf\], got 1"):
        as_int(1, "n", lo=2, error=KeyError)


def test_as_float_names_the_argument_the_type_and_the_value():
    assert as_float(np.float16(0.5), "t") == 0.5 and as_float(2, "t") == 2.0
    with pytest.raises(ValueError, match=r"^t must be a real number, got str 'x'$"):
        as_float("x", "t")
    with pytest.raises(ValueError, match=r"^t must be a real number, got bool False$"):
        as_float(False, "t")
    with pytest.raises(ValueError, match=r"^t is too large for a float"):
        as_float(10 ** 400, "t")
    with pytest.raises(ValueError, match=r"^t must be finite, got nan$"):
        as_float(float("nan"), "t")
    assert as_float(float("inf"), "t", finite=False) == float("inf")


def test_rows_of_passes_float32_rows_through_and_names_a_wrong_shape():
    x = np.ones((2, 4), np.float32)
    assert rows_of(x, 4) is x
    assert rows_of([[1, 2, 3, 4]], 4).dtype == np.float32
    with pytest.raises(ValueError, match=r"x must be \(m, 4\), got shape \(4,\)"):
        rows_of(np.ones(4, np.float32), 4)


def test_rows_of_refuses_rows_that_are_not_real_numbers():
    """QLinear.forward(np.array([[1, 2, 3, None]])) returned a row of NaN (None became NaN), a string
    array was numpy's "could not convert string to float"; now a ValueError naming x's dtype. Integer
    rows are still products' inputs (widened to float32)."""
    from tl_lab.model import Linear
    from tl_lab.quant import QLinear

    for x in (np.array([[1.0, 2.0, 3.0, None]]), np.array([["1", "2", "3", "4"]]), np.ones((1, 4), bool)):
        with pytest.raises(ValueError, match=f"^x must hold real numbers, got dtype {x.dtype}$"):
            rows_of(x, 4)
        for lin in (QLinear.quantize(np.ones((2, 4), np.float32), 2), Linear(np.ones((2, 4), np.float32))):
            with pytest.raises(ValueError, match="x must hold real numbers"):
                lin.forward(x)
    assert rows_of(np.ones((1, 4), np.int64), 4).dtype == np.float32


def test_finite_matrix_keeps_a_float32_weight_uncopied_and_names_the_first_bad_entry():
    w = np.ones((3, 4), np.float32)
    assert finite_matrix(w) is w  # a model's weight is never copied to be checked
    assert finite_matrix(np.ones((2, 2), np.int64)).dtype == np.float32
    w[1, 2] = np.inf
    with pytest.raises(ValueError, match=r"w must be finite, got w\[1, 2\] = inf"):
        finite_matrix(w)
    with pytest.raises(ValueError, match=r"w must be 2D \(out, inp\), got shape \(4,\)"):
        finite_matrix(np.ones(4))


def test_finite_matrix_names_a_value_beyond_float32_without_numpys_overflow_warning():
    """A float64 weight past float32's largest becomes inf in the cast: the refusal names it, and
    numpy's "overflow encountered in cast" is not shown besides."""
    import warnings

    w = np.ones((2, 2))
    w[0, 1] = 1e300
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a warning would end the call before the refusal
        with pytest.raises(ValueError, match=r"^w must be finite, got w\[0, 1\] = inf$"):
            finite_matrix(w)


def test_exact_array_names_what_differs():
    exact_array("q", np.zeros((2, 3), np.uint8), np.uint8, (2, 3))
    with pytest.raises(ValueError, match=r"q must be uint8, got dtype int8"):
        exact_array("q", np.zeros((2, 3), np.int8), np.uint8, (2, 3))
    with pytest.raises(ValueError, match=r"q must have shape \(2, 3\), got \(3, 2\)"):
        exact_array("q", np.zeros((3, 2), np.uint8), np.uint8, (2, 3))


@pytest.mark.parametrize("bits", [0x7C00, 0x7C01, 0x7E00, 0x7FFF, 0x8000, 0x8001, 0xFC00])
def test_f16_scales_refuse_infinities_nans_and_negatives_naming_the_place(bits):
    scales = np.full((2, 3), 0x3C00, np.uint16)
    scales[1, 2] = bits
    with pytest.raises(ValueError, match=rf"got 0x{bits:04X} at scales\[1, 2\]"):
        f16_scales(scales)


def test_f16_scales_take_zero_subnormals_and_the_largest_finite():
    f16_scales(np.array([[0x0000, 0x0001, 0x03FF, 0x3C00, 0x7BFF]], np.uint16))
