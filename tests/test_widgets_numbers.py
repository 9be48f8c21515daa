"""Tests for tl_lab/lab/widgets/numbers.py: typing a number shows its bits and its rounding."""

import re

import numpy as np

from conftest import in_workspace, joined_text as plain
from tl_lab.quant import f32_to_bf16, f32_to_f16
from tl_lab.lab.widgets.numbers import NumbersWidget


def test_typing_the_section_3_tie_shows_the_even_result():
    w = NumbersWidget("0.1")
    w.text.value = "1.00048828125"  # 1 + 2^-11: halfway between 0x3C00 and 0x3C01
    shown = plain(w.html.value)
    assert "0x3C00" in shown and "0x3F801000" in shown
    assert "tie -> even: the kept value is even, keep it" in shown
    assert "0 | 01111 | 0000000000" in shown  # f16 sign | exponent | mantissa
    assert "0 | 01111111 | 00000000001000000000000" in shown  # the f32 pattern
    assert "drop 1000000000000 (13 bits; halfway is 1000000000000)" in shown
    assert w.x == 1.00048828125 and w.narrowings["f16"].bits == f32_to_f16(w.x)

    w.text.value = "1.00146484375"  # 1 + 3 * 2^-11: the even neighbour is 0x3C02, above
    shown = plain(w.html.value)
    assert "0x3C02" in shown and "round up (+1) to the even one" in shown
    assert "0x%04X" % f32_to_bf16(1.00146484375) in shown


def test_values_errors_and_ranges_are_shown():
    w = NumbersWidget()
    w.text.value = "70000"
    shown = plain(w.html.value)
    assert "0x7C00" in shown and "overflow: infinity" in shown
    assert "beyond 65504, the largest finite f16" in shown
    assert "70144.0" in shown  # bf16 keeps the range: the nearest bf16 to 70000
    w.text.value = "0.1"
    shown = plain(w.html.value)
    assert "0x2E66" in shown and "0.0999755859375" in shown  # f16(0.1)
    assert "0.000244" in shown  # its relative error, below 2^-11
    assert "normal range: relative error at most 2^-11" in shown
    w.text.value = "1e-6"
    assert "f16 subnormal" in plain(w.html.value)
    w.text.value = "nan"
    assert "NaN stays NaN (quiet bit set)" in plain(w.html.value) and "0x7E00" in plain(w.html.value)


def test_bad_input_shows_a_message_not_a_traceback():
    w = NumbersWidget("1.5")
    w.text.value = "abc"
    assert "Not a number: 'abc'" in plain(w.html.value) and w.x is None
    w.text.value = "  "
    assert "Type a number" in plain(w.html.value)
    w.text.value = "2"
    assert "0x4000" in plain(w.html.value) and w.x == 2.0


def test_numbers_widget_shows_the_learners_bits_beside_the_reference(tmp_path):
    """Chapter "your turn": the learner's quant.py rounds x too; a truncating f32_to_f16 (s08) shows
    as a different pattern, a stub as the piece to write."""
    from tl_lab.lab.exercise.side import load
    from tl_lab.lab.exercise.stubs import reference_source, stub_source
    from tl_lab.lab.pitfalls import apply_edit, get
    from tl_lab.lab.widgets.numbers import NumbersWidget

    (tmp_path / "quant.py").write_text(reference_source("quant"))
    w = NumbersWidget("0.1", yours=load(tmp_path / "quant.py", "yours_quant_a"))
    assert w.yours_bits == {"f16": 0x2E66, "bf16": 0x3DCD} and "DIFFERENT" not in w.compare.value
    assert "f16 0x2E66 (the reference's) &middot; bf16 0x3DCD (the reference's)" in w.compare.value
    src = reference_source("quant")
    for e in get("s08").edits:
        src = apply_edit(src, e, "s08")
    (tmp_path / "quant.py").write_text(src)
    w = NumbersWidget("0.1", yours=load(tmp_path / "quant.py", "yours_quant_b"))
    w.text.value = "0.3"  # f16(0.3) = 0x34CD rounds up: truncating keeps 0x34CC
    assert w.yours_bits["f16"] == 0x34CC and "DIFFERENT: the reference's is 0x34CD" in w.compare.value
    (tmp_path / "quant.py").write_text(stub_source("quant"))
    w = NumbersWidget("0.1", yours=load(tmp_path / "quant.py", "yours_quant_c"))
    assert w.yours_bits == {} and "not written yet" in w.compare.value and w.narrowings
    assert re.search(r"your quant\.py raised at \S*quant\.py:\d+ in \S+: NotImplementedError: .*hint: .*exercise hint quant", w.compare.value)


def test_underflow_infinity_and_the_kept_bits_of_each_format_are_named():
    w = NumbersWidget()
    assert w.text.value == "0.1" and w.x == np.float32(0.1) and w.text.description == "x ="
    assert w.compare.value == "" and w.yours_bits == {}  # no learner's quant.py: no line for it
    w.text.value = "1.0"
    shown = plain(w.html.value)
    assert "f32 → f16: keep (significand, implicit 1 included) 10000000000 drop 0000000000000 (13 bits" in shown
    assert "f32 → bf16: keep (exponent and mantissa) 011111110000000 drop 0000000000000000 (16 bits" in shown
    w.text.value = "1e-8"  # below f16's smallest subnormal: every kept bit is gone
    shown = plain(w.html.value)
    assert "keep (significand, implicit 1 included) (none) drop every bit" in shown and "0x0000" in shown
    assert "below f16's normal range (6.1e-05): underflow to zero;" in shown and "f16 subnormal" not in shown
    w.text.value = "1e-6"
    assert "below f16's normal range (6.1e-05): f16 subnormal;" in plain(w.html.value)
    w.text.value = "inf"
    assert w.html.value.count(": infinity stays infinity</p>") == 2 and w.html.value.count(">0 (infinity)<") == 3
    w.text.value = "70000"
    assert w.html.value.count(">overflow: infinity<") == 1  # f16's row; bf16 keeps the range
    assert "<th>hex</th><th>value stored</th><th>relative error</th></tr>" in w.html.value


def test_beside_the_learners_quant_the_values_stored_are_the_references_with_a_workspace_active(tmp_path):
    """Notebook 03 activates the workspace, so tl_lab.quant is the learner's file. With a learner's
    f16_to_f32 that doubles (its f32_to_f16 right), NumbersWidget("0.1", yours=...) showed f16 0x2E66
    with "value stored 0.199951171875, relative error 1" in the reference's display, above "yours:
    f16 0x2E66 (the reference's)". The values stored are now read back by the reference's file too."""
    from tl_lab.lab.exercise.stubs import reference_source

    (tmp_path / "quant.py").write_text(reference_source("quant") + (
        "\n\n_right = f16_to_f32\n\n\ndef f16_to_f32(bits):\n    return _right(bits) * 2\n"))
    shown = in_workspace(tmp_path, "from tl_lab.lab.widgets.numbers import NumbersWidget\n"
                                   "w = NumbersWidget('0.1', yours=exercise.side.yours_or_none('quant'))\n"
                                   "print('0.199951171875' in w.html.value, '0.0999755859375' in w.html.value)\n")
    assert shown == "False True"


def test_below_2_to_the_minus_26_the_f16_explanation_is_at_the_true_scale():
    """Was: for |x| < 2^-26 the line read "drop <the 25-bit significand> (25 bits; halfway is 1 and 24
    zeros)": explain_f32_to_f16 caps its shift at 25 (enough for the bits: a 24-bit significand is then
    below half), so for 1e-9 it implied 0.268 of f16's smallest step, where x is 0.0168 of it. The line
    now gives the true fraction; from 2^-26 up the dropped bits are at scale and are shown as before."""
    from tl_lab.quant import explain_f32_to_f16, f32_from_bits

    w = NumbersWidget("1e-9")
    shown = plain(w.html.value)
    x32 = f32_from_bits(w.narrowings["f16"].x_bits)
    assert f"{x32 / 2**-24:.3g}" == "0.0168" and "0.268" not in shown
    assert ("drop every bit: |x| = 1e-09 is 0.0168 of f16's smallest step 2^-24 = 5.96e-08, below half of it "
            "(2^-25 = 2.98e-08), so it rounds to zero (to drop it at its scale takes a shift of 29 bits; "
            "the code shifts by 25") in shown
    assert "(25 bits; halfway is" not in shown and "0x0000" in shown and "underflow to zero" in shown
    for x in (2.0**-26, 1.5 * 2.0**-26, 2.0**-25, 1.5 * 2.0**-25, 1e-6):  # the shift is not capped: bits at scale
        w.text.value = repr(x)
        r = explain_f32_to_f16(x).rounding
        assert r.n_dropped <= 25 and f"({r.n_dropped} bits; halfway is" in plain(w.html.value), x
        assert "drop every bit" not in plain(w.html.value)
        x32 = f32_from_bits(explain_f32_to_f16(x).x_bits)
        assert r.dropped / 2**r.n_dropped + r.kept == x32 / 2**-24  # the bits shown are x in steps, exactly
    for x in ("-1e-30", "1e-40", str(2.0**-26 * 0.999)):  # a negative, an f32 subnormal, just below 2^-26
        w.text.value = x
        assert "drop every bit" in plain(w.html.value) and "rounds to zero" in plain(w.html.value), x


def test_a_pasted_page_is_quoted_in_one_short_line():
    """A pasted vector of 2,000 numbers was quoted whole in the message, 20,000 characters of it."""
    w = NumbersWidget()
    pasted = "[" + ", ".join(["0.1234567"] * 2000) + "]"
    w.text.value = pasted
    assert w.x is None and plain(w.html.value) == (
        f"Not a number: {pasted[:40]!r}... ({len(pasted):,} characters). Try a decimal such as 0.1, "
        "1.00048828125, -3.5e-6, 70000 or nan.")
