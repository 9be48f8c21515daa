"""Tests for tl_lab/lab/widgets/int4.py: type weights and a group size, check what the widget shows."""

import json
import re

import numpy as np
import pytest

from conftest import in_workspace, shown_text as plain, svg_outside
from tl_lab.ops.paths import REPO_ROOT
from tl_lab.quant import QLinear, unpack_int4
from tl_lab.lab.widgets.int4 import NIBBLE_ORDERS, PRESETS, SCALE_RULES, Int4Widget


def test_section_3_example_shows_the_stored_scale_and_the_engines_result():
    w = Int4Widget()  # the section-3 preset
    v = w.view
    assert w.error == "" and v.group == 4
    assert v.s_bits.tolist() == [0x3266] and float(v.s16[0]) == 0.199951171875
    assert v.q.tolist() == [4, -7, 0, 2]
    layer = QLinear.quantize(np.array([[0.7, -1.4, 0.0, 0.29995]], np.float32), 4)
    assert v.packed.tolist() == layer.qweight[0].tolist()
    assert np.array_equal(v.W_hat, layer.dequantize()[0])
    shown = plain(w.summary.value)
    assert "0x3266" in shown and "0.199951171875" in shown and "packed bytes: 0x94 0x20" in shown
    assert "within s/2" in shown and "MISTAKE" not in shown
    assert w.chart.value.count("class='err'") == 4 and w.chart.value.count("class='half'") == 1
    assert "3.50085" in plain(w.table.value)  # 0.7 / 0.19995, rounded half to even -> 4


def test_scale_mistake_s10_puts_a_weight_one_level_off():
    w = Int4Widget()
    w.scale_rule.value = SCALE_RULES[1]
    v = w.view
    assert v.q.tolist() == [4, -7, 0, 1]          # 0.29995 / 0.2 = 1.49975 -> 1
    assert v.q_correct.tolist() == [4, -7, 0, 2]
    assert v.broken.tolist() == [False, False, False, True]  # q s16 is then more than s/2 away
    shown = plain(w.summary.value)
    assert "MISTAKE s10" in shown and "1 of 4 weights get another q" in shown
    assert "1 of 4 weights break |W - W_hat| <= s/2" in shown
    assert "1.49975" in plain(w.table.value)
    w.scale_rule.value = SCALE_RULES[0]
    assert w.view.q.tolist() == [4, -7, 0, 2] and not w.view.broken.any()


def test_nibble_mistake_s09_swaps_every_pair_for_a_reader():
    w = Int4Widget()
    w.nibble_order.value = NIBBLE_ORDERS[1]
    v = w.view
    assert v.packed.tolist() == [0x49, 0x02]      # q = [4, -7, 0, 2]: -7 = 1001 low, 4 = 0100 high
    assert v.q_read.tolist() == [-7, 4, 2, 0]
    assert unpack_int4(v.packed).tolist() == v.q_read.tolist()
    assert v.broken.all()
    shown = plain(w.summary.value)
    assert "MISTAKE s09" in shown and "4 of 4 weights break" in shown
    assert w.chart.value.count("#c0392b") >= 4     # every bar drawn red


def test_presets_and_group_size_change_the_groups():
    w = Int4Widget()
    w.preset.value = "two groups of 4"
    assert w.view.s16.size == 2 and w.chart.value.count("class='half'") == 2
    w.group.value = "8"
    assert w.view.s16.size == 1 and w.preset.value == "typed"
    w.preset.value = "all zeros"
    assert w.view.s_bits.tolist() == [0] and w.view.q.tolist() == [0, 0, 0, 0] and not w.view.broken.any()
    for name, (text, g) in PRESETS.items():
        w.preset.value = name
        assert w.error == "" and w.weights_text.value == text and w.group.value == str(g)


@pytest.mark.parametrize("weights, group, words", [
    ("", "4", "Type some weights"),
    ("0.1, abc, 0.3, 0.4", "4", "not a number: 'abc'"),
    ("0.1, nan, 0.3, 0.4", "4", "finite"),
    ("0.1, 0.2, 0.3, 0.4, 0.5, 0.6", "4", "does not divide the 6 weights"),
    ("0.1, 0.2, 0.3", "3", "must be even"),
    ("0.1, 0.2, 0.3, 0.4", "0", "must be positive"),
    ("0.1, 0.2, 0.3, 0.4", "two", "whole number"),
    ("0.1, 0.2, 0.3, 0.4", "2.5", "whole number"),
    ("1e6, 0, 0, 0", "4", "too large for an f16 scale"),
    (", ".join(["0.1"] * 66), "2", "at most 64"),
])
def test_bad_input_gives_words_and_clears_the_pictures(weights, group, words):
    w = Int4Widget()
    assert w.chart.value and w.table.value
    w.weights_text.value, w.group.value = weights, group
    assert words in plain(w.summary.value) and words in w.error
    assert w.view is None and w.chart.value == "" and w.table.value == ""
    w.weights_text.value, w.group.value = "0.7, -1.4, 0, 0.29995", "4"
    assert w.error == "" and w.view.q.tolist() == [4, -7, 0, 2]


def test_typed_values_reach_the_engine_path():
    w = Int4Widget("0.5 -0.25 0.125 0.0625", 2)
    assert w.preset.value == "typed" and w.view.s16.size == 2
    layer = QLinear.quantize(np.array([[0.5, -0.25, 0.125, 0.0625]], np.float32), 2)
    assert np.array_equal(w.view.W_hat, layer.dequantize()[0])
    assert w.view.q.tolist() == unpack_int4(layer.qweight)[0].tolist()


def test_a_scale_that_underflows_to_f16_zero_is_explained_not_flagged():
    """1e-9 and 0 in a group of 2: max|W| / 7 = 1.4e-10 rounds to the f16 0, the group reads back as 0.
    That is the engine's correct result: said in words, nothing marked as breaking s/2 (issue 19)."""
    w = Int4Widget("1e-9, 0", 2)
    v = w.view
    assert v.s16.tolist() == [0.0] and v.s32[0] > 0 and v.W_hat.tolist() == [0.0, 0.0]
    assert v.underflow.all() and not v.broken.any()
    shown = plain(w.summary.value)
    assert "break" not in shown and "stored is 0" in shown and "correct result" in shown
    assert "s = 0 (underflow)" in plain(w.table.value) and "#c0392b" not in w.chart.value
    w = Int4Widget("1e-9, 0, 0.5, 0.25", 2)   # beside a group with a scale, that one is still checked
    assert w.view.underflow.tolist() == [True, True, False, False]
    assert "within s/2 of its original: |W - W_hat| <= s/2 holds for all 2 of the groups with a scale" in plain(
        w.summary.value)
    w = Int4Widget("0, 0", 2)                 # all zeros: s32 = 0, nothing underflowed, nothing to say
    assert not w.view.underflow.any() and "stored is 0" not in plain(w.summary.value)


def test_weights_print_as_the_float32_typed_and_headers_stand_apart():
    """W = 0.7 prints as 0.7 (its shortest float32 text), not 0.699999988079071; the tables space their cells."""
    w = Int4Widget()
    table, summary = plain(w.table.value), plain(w.summary.value)
    assert " 0.7 " in table and "0.699999988" not in table and "0.29995 " in table
    assert " 1.4 " in summary and "1.399999" not in summary
    assert "0.199951171875" in summary   # the stored f16 scale: its exact value, what the file means
    assert all("border-spacing:12px" in t for t in (w.table.value, w.summary.value))


def test_int4_widget_shows_the_learners_bytes_beside_the_reference(tmp_path):
    """Chapter "your turn": the learner's QLinear.quantize on the same row; the odd column in the low
    nibble (s09) shows as different bytes, a stub as the piece to write."""
    from tl_lab.lab.exercise.side import load
    from tl_lab.lab.exercise.stubs import reference_source, stub_source
    from tl_lab.lab.pitfalls import apply_edit, get
    from tl_lab.lab.widgets.int4 import Int4Widget

    (tmp_path / "quant.py").write_text(reference_source("quant"))
    w = Int4Widget(yours=load(tmp_path / "quant.py", "yours_quant_i4a"))
    assert w.yours_result is not None and "bit for bit" in w.compare.value
    src = reference_source("quant")
    for e in get("s09").edits:
        src = apply_edit(src, e, "s09")
    (tmp_path / "quant.py").write_text(src)
    w = Int4Widget(yours=load(tmp_path / "quant.py", "yours_quant_i4b"))
    assert "DIFFERENT" in w.compare.value
    (tmp_path / "quant.py").write_text(stub_source("quant"))
    w = Int4Widget(yours=load(tmp_path / "quant.py", "yours_quant_i4c"))
    assert w.yours_result is None and "not written yet" in w.compare.value and w.view is not None
    assert re.search(r"your quant\.py raised at \S*quant\.py:\d+ in \S+: NotImplementedError: .*hint: .*exercise hint quant", w.compare.value)


def test_the_chart_lies_inside_its_box_on_a_level_axis_and_the_table_colours_what_breaks():
    w = Int4Widget("0.7, -1.4, 0, 0.29995, 1e-9, 0, 0.5, 0.25", 4)
    w.scale_rule.value = SCALE_RULES[1]  # s10: the last weight of the first group breaks s/2
    svg = w.chart.value
    assert svg_outside(svg) == []
    (axis,) = re.findall(r"<line x1='48' x2='\d+' y1='([\d.]+)' y2='([\d.]+)' stroke='#888'/>", svg)
    assert axis[0] == axis[1]  # the zero line is level
    bars = [float(x) for x in re.findall(r"<rect class='err' x='([\d.]+)'", svg)]
    assert bars == sorted(bars) and len(set(bars)) == 8  # one bar a column, left to right
    bands = re.findall(r"<line class='half' x1='([\d.]+)' x2='([\d.]+)'", svg)
    assert [(float(a), float(b)) for a, b in bands] == [(bars[0], bars[3] + 18), (bars[4], bars[7] + 18)]  # each group's s/2
    labels = re.findall(r"<text x='[\d.]+' y='([\d.]+)' font-size='9' text-anchor='middle'>(\d+)</text>", svg)
    assert [int(j) for _, j in labels] == list(range(8)) and all(float(y) > float(axis[0]) for y, _ in labels)
    rows = re.findall(r"<tr style='color:([^']+)'>", w.table.value)
    assert w.view.broken.tolist()[:4] == [False, False, False, True] and not w.view.underflow.any()
    assert rows == ["#c0392b" if b else "inherit" for b in w.view.broken]  # red where |W - W_hat| > s/2
    w = Int4Widget("1e-9, 0", 2)  # a group whose scale underflows: its rows orange, its note grey
    assert re.findall(r"<tr style='color:([^']+)'>", w.table.value) == ["#e67e22"] * 2
    assert "<p class='tl-message' style='color:#555'><b>" in w.summary.value


def test_the_controls_carry_the_names_notebook_06_calls_them():
    w = Int4Widget()
    labels = [c.description for c in (w.preset, w.weights_text, w.group, w.scale_rule, w.nibble_order)]
    assert labels == ["weights preset", "weights W", "group size g", "round with", "pack"]
    text = " ".join("".join(c["source"]) for c in json.loads((REPO_ROOT / "notebooks" / "06_int4.ipynb").read_text())["cells"]
                    if c["cell_type"] == "markdown")
    assert "pack" in text and "group size" in text


def test_the_tables_headers_are_one_row_of_cells_and_nothing_else():
    """Text between a table's tags is drawn above the table by the browser: a header holds cells only."""
    w = Int4Widget()
    assert re.search(r"<table[^>]*><tr><th>col</th><th>group</th>.*<th>within s/2</th></tr><tr style=", w.table.value)
    assert re.search(r"<table[^>]*><tr><th>group</th><th>max\|W\|</th><th>max\|W\| / 7 \(f32\)</th>"
                     r"<th>stored f16 bits</th><th>s \(stored value\)</th></tr><tr><td>0</td>", w.summary.value)


def test_show_displays_the_widget_it_returns(monkeypatch):
    import IPython.display

    from tl_lab.lab.widgets import int4

    shown = []
    monkeypatch.setattr(IPython.display, "display", shown.append)
    w = int4.show("0.5 -0.25 0.125 0.0625", 2)
    assert shown == [w] and isinstance(w, int4.Int4Widget)
    assert (w.weights_text.value, w.group.value) == ("0.5 -0.25 0.125 0.0625", "2")  # what it was given


def test_a_weight_beyond_float32_is_refused_in_words_without_a_warning():
    """Typing "-1e39, 1, 2, 3" printed "RuntimeWarning: overflow encountered in cast" into the output and
    refused with QLinear's "w must be finite, got w[0, 0] = -inf": the learner typed a finite number."""
    import warnings

    w = Int4Widget()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        w.weights_text.value = "-1e39, 1, 2, 3"
    assert w.error == "weights are float32: '-1e39' is beyond its largest, 3.4028235e+38"
    assert w.view is None and w.chart.value == "" and plain(w.summary.value) == w.error
    w.weights_text.value = "3.4028235e38, 1, 2, 3"  # float32's largest itself is read (then too large for f16)
    assert "too large for an f16 scale" in w.error


def test_a_huge_group_size_is_refused_in_one_short_true_line():
    """A group size of 5,000 digits (past int()'s 4300-digit limit) was refused as "group size must be a
    whole number, got '9999...'", false, quoting all 5,000 digits; any text is quoted up to 40 characters."""
    w = Int4Widget()
    w.group.value = "9" * 5000
    assert w.error == f"group size {'9' * 40!r}... (5,000 digits) is more than the 64 weights this widget takes"
    w.group.value = "x" * 5000
    assert w.error == f"group size must be a whole number, got {'x' * 40!r}..."
    for odd in ("--5", "\u00b2"):  # two signs, a superscript digit: not a huge number
        w.group.value = odd
        assert w.error == f"group size must be a whole number, got {odd!r}"
    w.group.value = "4"
    assert w.error == "" and w.view.q.tolist() == [4, -7, 0, 2]


def test_beside_the_learners_quant_the_display_is_the_references_with_a_workspace_active(tmp_path):
    """Notebook 06 activates the workspace, so tl_lab.quant is the learner's file: Int4Widget(yours=...)
    drew the learner's s09 bytes 0x49 0x02 as the correct scheme's ('every weight is within s/2') right
    above "yours: bytes 49 02 · DIFFERENT from the reference's (94 20)". The display is now the
    reference file's, as the numbers widget, the block map and the sampler playground do."""
    from tl_lab.lab.exercise.stubs import reference_source
    from tl_lab.lab.pitfalls import apply_edit, get

    src = reference_source("quant")
    for e in get("s09").edits:
        src = apply_edit(src, e, "s09")
    (tmp_path / "quant.py").write_text(src)
    shown = in_workspace(tmp_path, "import re\n"
                                   "from tl_lab.lab.widgets.int4 import Int4Widget\n"
                                   "w = Int4Widget(yours=exercise.side.yours_or_none('quant'))\n"
                                   "print(re.search(r'packed bytes: ([^<]*)', w.summary.value).group(1))\n")
    assert shown == "0x94 0x20"
