"""The notebooks' figures laid out as a reader needs them, checked through the plot helpers
(tl_lab.lab.widgets.plots) that draw them: the notebooks keep only the facts they teach (issue 59).
Each test draws the figure from numbers like the notebook's and checks boxes on the laid-out canvas."""

from __future__ import annotations

import numpy as np
import pytest

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.transforms  # noqa: E402

from tl_lab.lab.widgets import plots  # noqa: E402


@pytest.fixture(autouse=True)
def _close():
    yield
    plt.close("all")


def test_00s_step_map_keeps_every_label_inside_its_box():
    fig, boxes, texts = plots.step_map()
    fig.canvas.draw()
    for patch, text in zip(boxes, texts):
        b, t = patch.get_window_extent(), text.get_window_extent()
        assert b.x0 <= t.x0 and t.x1 <= b.x1 and b.y0 <= t.y0 and t.y1 <= b.y1, text.get_text()


def test_03s_underflow_note_sits_on_no_point_and_no_other_note():
    from tl_lab.quant import bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16

    x = np.logspace(-9, 6, 30_001).astype(np.float32)
    x64 = x.astype(np.float64)
    with np.errstate(invalid="ignore"):
        rel16 = np.abs(f16_to_f32(f32_to_f16(x)).astype(np.float64) - x64) / x64
        relbf = np.abs(bf16_to_f32(f32_to_bf16(x)).astype(np.float64) - x64) / x64
    fig, top, note = plots.relative_error(x, rel16, relbf, np.isinf(f16_to_f32(f32_to_f16(x))))
    fig.canvas.draw()
    words = matplotlib.text.Text.get_window_extent(note).padded(2)  # the words only, not the arrow
    assert words.count_contains(top.transData.transform(top.lines[0].get_xydata())) == 0
    assert not any(words.overlaps(t.get_window_extent()) for t in top.texts if t is not note)


def test_05s_rope_labels_sit_clear_of_every_dot():
    from tl_lab.forward import rope, rope_inv_freq

    D, theta = 16, 10000.0
    fig = plots.rope_pairs(rope, rope_inv_freq(D, theta), D, theta)
    fig.canvas.draw()
    for ax in fig.axes:
        dots = ax.collections[0]
        reach = np.sqrt(dots.get_sizes()[0]) / 2 * fig.dpi / 72
        centres = ax.transData.transform(dots.get_offsets())
        assert all(label.get_window_extent().padded(reach).count_contains(centres) == 0 for label in ax.texts)


def test_05s_f16_legend_hides_no_line():
    fig = plots.f16_error(np.geomspace(1e-5, 1e-3, 400), 2e-2, 20.0)
    fig.canvas.draw()
    ax = fig.axes[0]
    assert not ax.get_legend().get_window_extent().overlaps(ax.get_window_extent())


def test_05s_invariance_says_a_zero_inside_the_chart_and_keeps_the_legend_off_the_bars():
    batch = {"plain": [3, 0, 17, 0, 250, 8, 0, 1], "invariant": [0] * 8}
    ways = ["one step", "50 + 50", "16 x 6 + 4", "31 + 1 + 68", "token by token"]
    chunk = {"plain": dict(zip(ways, [0, 40, 90, 12, 200])), "invariant": dict.fromkeys(ways, 0)}
    fig = plots.invariance(batch, chunk, 256)
    fig.canvas.draw()
    for ax in fig.axes:
        said = [t for t in ax.texts if t.get_text() == "0 bits differ"]
        assert said and all(plots.on_chart(ax, t) for t in said)
    legend = fig.axes[1].get_legend()
    assert not any(legend.get_window_extent().overlaps(bar.get_window_extent()) for ax in fig.axes for bar in ax.patches)


def test_06s_legends_stand_beside_the_columns_and_the_error_bars_are_visible():
    rng = np.random.default_rng(6)
    group = rng.standard_normal(32).astype(np.float32) * 0.05
    s = float(np.abs(group).max() / 7)
    W_hat = np.clip(np.rint(group / s), -8, 7) * s
    fig, ax, ax_err = plots.int4_group(group, W_hat, s)
    fig.canvas.draw()
    cols = np.arange(32)
    for a in (ax, ax_err):
        frame, x_px = a.get_window_extent(), a.transData.transform(np.c_[cols, np.zeros(32)])[:, 0]
        band = matplotlib.transforms.Bbox.from_extents(x_px.min(), frame.y0, x_px.max(), frame.y1)
        assert not a.get_legend().get_window_extent().overlaps(band)
    heights = np.array([bar.get_window_extent().height for bar in ax_err.patches])
    assert np.median(heights) > 5 and heights.max() > 20, heights  # visible, not a hairline


def test_12s_histograms_hide_neither_and_the_legend_hides_no_value():
    rng = np.random.default_rng(0)
    rtn, gptq = rng.uniform(0, 0.5, 5000), np.abs(rng.normal(0, 0.4, 5000))
    res = {"RTN (the chapter's)": (0.05, 0.06), "GPTQ": (0.03, 0.04)}
    fig, ax1, ax2 = plots.rtn_vs_gptq(rtn, gptq, res, 2048, 2048, "test")
    fig.canvas.draw()
    assert not any(ax2.get_legend().get_window_extent().overlaps(t.get_window_extent()) for t in ax2.texts)
    # outlines, not filled bars: the RTN histogram stays visible under GPTQ's (was: GPTQ's filled bars hid it)
    assert all(not p.get_fill() for p in ax1.patches)
