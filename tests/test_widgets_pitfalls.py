"""Tests for tl_lab/lab/widgets/pitfalls.py: pick a pitfall, read its edit, run its test, see the symptom."""

import functools
import re

import pytest

from conftest import joined_text as plain
from tl_lab.lab import pitfalls as pf
from tl_lab.lab.widgets.pitfalls import PitfallLab, diff_html, draw_probe


def test_the_lab_shows_the_chapters_row_and_the_edit():
    lab = PitfallLab()
    assert lab.pitfall.id == "s01" and len(lab.picker.options) == 22
    shown = plain(lab.info.value)
    assert "Swapping the shifts of the two draws" in shown and "uniforms that look fine" in shown
    assert "tests/test_sample.py::test_pcg32_reference_vectors" in shown and "07_sampler" in shown
    diff = plain(lab.diff.value)
    assert "tl_lab/sample.py" in diff and "Pcg32.uniform_f64" in diff
    assert "-        return ((a >> 5) * 67108864 + (b >> 6))" in diff
    assert "+        return ((a >> 6) * 67108864 + (b >> 5))" in diff
    assert "Not run yet" in plain(lab.verdict.value)
    lab.picker.value = "s13"  # the observer redraws for the new pick
    assert "RoPE positions relative to the step" in plain(lab.info.value)
    assert "+    cos, sin = rope_cos_sin(step.pos - np.repeat(" in plain(lab.diff.value)


def test_a_removed_check_shows_as_removed_lines():
    lines = plain(diff_html("s21")).splitlines()
    assert any(s.startswith("-        bad = np.flatnonzero((toks < 0)") for s in lines)
    assert not any(s.startswith("+") for s in lines)
    assert "tl_lab/quant.py" in plain(diff_html("s08")) and "explain_f32_to_f16" in plain(diff_html("s08"))


def test_run_shows_the_failing_verdict_with_the_pitfall_on_and_a_pass_with_it_off():
    lab = PitfallLab("s04")
    lab.run_button.click()
    assert lab.result.outcome == "failed" and lab.result.pitfall == "s04"
    shown = plain(lab.verdict.value)
    assert "CAUGHT: test_top_p_keeps_the_crossing_token FAILS with s04 on" in shown
    assert "assert" in shown and re.search(r"\(\d+\.\d s, one pytest subprocess\)", shown)
    lab.off_button.click()
    assert lab.result.outcome == "passed" and lab.result.pitfall is None
    assert "passes with the pitfall off" in plain(lab.verdict.value)
    # another pick clears the verdict: it never shows one pitfall's result under another
    lab.picker.value = "s18"
    assert lab.result is None and "Not run yet" in plain(lab.verdict.value)


def test_typing_an_id_picks_it_and_a_bad_one_says_so():
    lab = PitfallLab()
    lab.jump.value = "s99"
    assert "'s99' is not a pitfall" in plain(lab.note.value) and lab.picker.value == "s01"
    lab.jump.value = "S18"
    assert lab.picker.value == "s18" and lab.note.value == ""
    assert "Evicting the newest prefix" in plain(lab.info.value)


def test_draw_measures_the_symptom_from_the_broken_code():
    lab = PitfallLab("s18")
    lab.draw_button.click()
    data = lab.picture_data
    assert data["off"]["taken"] == [4, 5, 2, 0, 3, 1] and data["on"]["taken"] == [4, 5, 1, 3, 0, 2]
    assert lab.picture.value.startswith("<svg")
    lab.picker.value = "s08"
    assert lab.picture_data is None and lab.picture.value == ""
    lab.draw()
    off, on = lab.picture_data["off"], lab.picture_data["on"]
    assert abs(off["mean_ulp"]) < 0.01 and -0.5 <= off["min_ulp"] and off["max_ulp"] <= 0.5
    assert abs(on["mean_ulp"] + 0.5) < 0.02 and on["max_ulp"] <= 0.0  # truncation: always toward zero


def test_a_pitfall_without_a_picture_says_so():
    lab = PitfallLab("s09")
    assert pf.get("s09").probe is None and lab.draw_button.disabled
    assert lab.draw() is None and "No picture" in plain(lab.picture.value)


def test_a_probe_picture_displays_as_an_image():
    """display(draw_probe(...)) shows a PNG, not "<Figure size 750x320 with 1 Axes>" (issue 19: the nine
    pictures of 10_pitfalls section 3 were text), with or without pyplot's inline backend."""
    from IPython.core.formatters import format_display_data

    name = "lru_eviction"
    fig = draw_probe(name, pf.PROBES[name](), pf.PROBES[name](), "s18")
    data, _ = format_display_data(fig)
    png = data.get("image/png")
    assert png is not None, sorted(data)
    png = png if isinstance(png, bytes) else __import__("base64").b64decode(png)
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000


def test_diff_lines_wrap_instead_of_running_past_the_widget():
    rows = re.findall(r"<div style='([^']*)'>", diff_html("s13"))
    assert rows and all("white-space:pre-wrap" in r for r in rows)


def test_the_diff_sets_removed_and_added_lines_apart_from_the_context():
    rows = re.findall(r"<div style='background:([^;]+);[^']*'>([^<]*)</div>", diff_html("s01"))
    by_kind = {}
    for background, line in rows:
        by_kind.setdefault(line[:1] if line[:1] in ("-", "+") else " ", set()).add(background)
    assert sorted(by_kind) == [" ", "+", "-"] and all(len(b) == 1 for b in by_kind.values())
    assert len(set.union(*by_kind.values())) == 3  # three backgrounds, one per kind of line


def words(fig) -> str:
    """Every word of a picture: its axes' labels, tick labels, texts and legend."""
    ax = fig.axes[0]
    texts = [ax.get_xlabel(), ax.get_ylabel(), *(t.get_text() for t in ax.get_yticklabels() + ax.texts)]
    legend = ax.get_legend()
    return " ".join(texts + ([t.get_text() for t in legend.get_texts()] if legend else []))


# decode_vs_prefill's probe runs the model (seconds): its data's shape is enough for the picture
PROBE_DATA = {"decode_vs_prefill": lambda: {"positions": [9, 10, 11], "gaps": [0.0, 1e-4, 3e-3], "n_prompt": 10}}


@functools.cache
def probe_data(name: str) -> dict:
    """A probe's data from the correct code, measured once (three pitfalls share hf_logits')."""
    return PROBE_DATA.get(name, pf.PROBES[name])()


WORDS_ONLY = ("zero_pool", "bad_token")  # symptoms that are messages: a picture in words, no axes


@pytest.mark.parametrize("pid", [p.id for p in pf.PITFALLS.values() if p.probe])
def test_each_probes_picture_names_the_pitfall_and_its_axes(pid):
    """Every pitfall with a picture: it draws from the probe's data, says which part is the pitfall, and
    what each axis measures (the LRU picture names its two rows by their ticks instead)."""
    name = pf.get(pid).probe
    data = probe_data(name)
    fig = draw_probe(name, data, data, pid)
    assert pid in words(fig)
    ax = fig.axes[0]
    if name not in WORDS_ONLY:
        assert ax.get_xlabel() and (ax.get_ylabel() or name == "lru_eviction"), name


def curves(fig) -> dict:
    """label -> (x, y) of each line a legend names."""
    return {l.get_label(): (list(l.get_xdata()), list(l.get_ydata())) for l in fig.axes[0].get_lines()
            if not l.get_label().startswith("_")}


def test_the_decode_picture_plots_each_codes_gaps_and_marks_where_the_prompt_ends():
    off = {"positions": [9, 10, 11], "gaps": [0.0, 0.0, 0.0], "n_prompt": 10}
    on = {"positions": [9, 10, 11], "gaps": [0.0, 1e-4, 3e-3], "n_prompt": 10}
    fig = draw_probe("decode_vs_prefill", off, on, "s13")
    for label, data in (("correct", off), ("s13", on)):
        x, y = curves(fig)[label]
        assert x == data["positions"] and y == pytest.approx(data["gaps"], abs=1e-8)  # a floor for the log scale
    (edge,) = [l.get_xdata()[0] for l in fig.axes[0].get_lines() if l.get_linestyle() == ":"]
    assert 9 < edge < 10  # between the prompt's last position and the first decoded one


def test_the_decode_picture_says_where_it_draws_the_exact_zeros():
    """A log axis has no 0: the correct code's gaps are exactly 0 (and s13's at the prompt), drawn at 1e-9.
    Was: drawn at 1e-9 (gap + 1e-9) with nothing saying so, read as a gap of 1e-9; now the axis says
    "exact: drawn at 1e-9", as 03's chart does, the zeros sit exactly there and the other gaps are drawn
    as they are. Without a zero (or a gap below 1e-9) there is nothing to say."""
    off = {"positions": [9, 10, 11], "gaps": [0.0, 0.0, 0.0], "n_prompt": 10}
    on = {"positions": [9, 10, 11], "gaps": [0.0, 2e-9, 3e-3], "n_prompt": 10}
    fig = draw_probe("decode_vs_prefill", off, on, "s13")
    assert fig.axes[0].get_ylabel() == "max |logits - full prefill|\n(exact: drawn at 1e-9)"
    got = curves(fig)
    assert got["correct"][1] == [1e-9] * 3 and got["s13"][1] == [1e-9, 2e-9, 3e-3]  # zeros at the floor, the rest as is
    on = {**on, "gaps": [5e-10, 1.0, 2.0]}
    assert "(exact or below 1e-9: drawn at 1e-9)" in draw_probe("decode_vs_prefill", off, on, "s13").axes[0].get_ylabel()
    off = {**off, "gaps": [1e-6, 1e-5, 1e-6]}
    assert draw_probe("decode_vs_prefill", off, {**on, "gaps": [1e-6, 1.0, 2.0]}, "s13").axes[0].get_ylabel() == \
        "max |logits - full prefill|"


def test_the_rope_picture_plots_both_codes_frequencies():
    off = pf.PROBES["rope_freqs"]()
    on = {**off, "inv_freq": [f / 2 for f in off["inv_freq"]]}
    got = curves(draw_probe("rope_freqs", off, on, "s20"))
    assert got["correct"][1] == pytest.approx(off["inv_freq"]) and got["s20"][1] == pytest.approx(on["inv_freq"])


def test_the_lru_picture_shows_both_rows_of_blocks_inside_it():
    data = pf.PROBES["lru_eviction"]()
    ax = draw_probe("lru_eviction", data, data, "s18").axes[0]
    (x0, x1), (y0, y1) = ax.get_xlim(), ax.get_ylim()
    assert [t.get_text() for t in ax.texts] == [str(b) for b in data["taken"] * 2]
    assert all(x0 < t.get_position()[0] < x1 and y0 < t.get_position()[1] < y1 for t in ax.texts)
