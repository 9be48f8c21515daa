"""The int4 widget: type a group of weights and a group size, see every step of the int4 scheme.

Chapter L10.1, section 2.5 (s = f16(max|W| / 7), q = clamp(rint(W / s), -8, 7), W_hat = q s, two
values per byte) and the int4 part of section 3. Shown for each group: max|W|, the scale in f32 and
the f16 actually stored (bits and value); for each weight: W / s, q, its nibble, W_hat and
|W - W_hat| against s/2; the packed bytes; and a bar chart of |W - W_hat| with s/2 drawn.

The correct path is the engine's own: `QLinear.quantize`, `unpack_int4` of its `qweight` and
`QLinear.dequantize`. Two switches show the chapter's two int4 pitfalls, each computed here
explicitly and labelled as the mistake (switching the real code path is the pitfall lab's job):

- s10, "rounding with the f32 scale, storing the f16 one": q = rint(W / (max|W| / 7)) while the file
  keeps f16(max|W| / 7), so a reader computes q * s16; some weights land one level off.
- s09, "the odd column in the low nibble": the bytes are packed the other way round, and a reader
  that follows the format (`unpack_int4`) swaps every pair of columns.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import ipywidgets as widgets
import numpy as np

import tl_lab.quant
from tl_lab.quant import QLinear
from tl_lab.lab.widgets.common import CellWidget, MONO, NOTE, digits_past_int, fits_f32, message, quoted

PRESETS = {
    "section 3: [0.7, -1.4, 0, 0.29995]": ("0.7, -1.4, 0, 0.29995", 4),
    "two groups of 4": ("0.5, -0.25, 0.1, 0.03, 2.0, 1.0, -0.6, 0.07", 4),
    "one group of 16, small weights": ("0.012, -0.031, 0.044, 0.005, -0.018, 0.027, -0.009, 0.036, "
                                       "-0.041, 0.002, 0.019, -0.025, 0.033, -0.006, 0.014, -0.038", 16),
    "all zeros": ("0, 0, 0, 0", 4),
}
SCALE_RULES = ("stored f16 scale (correct)", "f32 scale, f16 stored (mistake s10)")
NIBBLE_ORDERS = ("even column in the low nibble (correct)", "odd column in the low nibble (mistake s09)")
MAX_WEIGHTS = 64
OK, BAD, HALF = "#2471a3", "#c0392b", "#e67e22"
F16_ZERO_BELOW = 2.0**-25  # half of f16's smallest subnormal 2^-24: a scale up to it rounds to 0 (ties to even)
# cells apart: monospace headers such as "W" and "W / s" would otherwise run together
TABLE = f"{MONO}; font-size:12px; border-collapse:separate; border-spacing:12px 2px"

__all__ = ["Int4Widget", "Int4View", "parse_weights", "int4_view", "PRESETS", "SCALE_RULES", "NIBBLE_ORDERS"]


@dataclass(frozen=True)
class Int4View:
    """Everything the widget shows for one group row W: (n,) float32 in groups of `group`.

    s32: (G,) max|W| / 7 in float32; s_bits: (G,) the f16 bits stored; s16: (G,) their value;
    s_round: (n,) the scale each q was rounded against (s16, or s32 under mistake s10);
    q: (n,) int8, the integers the writer chose; packed: (n // 2,) uint8, the bytes written;
    q_read: (n,) int8, what a reader following the format decodes from `packed`;
    W_hat: (n,) float32 = q_read * s16, what the file means; err: (n,) |W - W_hat| in float64;
    half: (n,) s16 / 2 of each weight's group; q_correct, W_hat_correct: the engine's own result.
    """

    W: np.ndarray
    group: int
    s32: np.ndarray
    s_bits: np.ndarray
    s16: np.ndarray
    s_round: np.ndarray
    q: np.ndarray
    packed: np.ndarray
    q_read: np.ndarray
    W_hat: np.ndarray
    err: np.ndarray
    half: np.ndarray
    q_correct: np.ndarray
    W_hat_correct: np.ndarray

    @property
    def underflow(self) -> np.ndarray:
        """(n,) bool: the weights of groups whose scale max|W| / 7 is not 0 but rounds to the f16 0
        (it is at most 2^-25, half of f16's smallest subnormal). Such a group is stored as s = 0 and
        reads back as zeros: correct, and the s/2 bound says nothing there (the error is |W| itself,
        at most 7 * 2^-25)."""
        return np.repeat((self.s16 == 0) & (self.s32 > 0), self.group)

    @property
    def broken(self) -> np.ndarray:
        """(n,) bool: the weights outside |W - W_hat| <= s/2 (an underflowed group's are not broken)."""
        return (self.err > self.half) & ~self.underflow


def parse_weights(text: str, group_text) -> tuple[np.ndarray, int]:
    """The typed weights and group size, or ValueError saying in words what is wrong."""
    parts = [p for p in re.split(r"[,\s]+", str(text).strip()) if p]
    if not parts:
        raise ValueError("Type some weights, e.g. 0.7, -1.4, 0, 0.29995")
    if len(parts) > MAX_WEIGHTS:
        raise ValueError(f"{len(parts)} weights: at most {MAX_WEIGHTS} fit on the page")
    values = []
    for p in parts:
        try:
            v = float(p)
        except ValueError:
            raise ValueError(f"not a number: {p!r}") from None
        if not math.isfinite(v):
            raise ValueError(f"weights must be finite, got {p!r}")
        if not fits_f32(v):  # else float32 makes it inf, with a RuntimeWarning and QLinear's "w[0, 0] = inf"
            raise ValueError(f"weights are float32: {p!r} is beyond its largest, {np.finfo(np.float32).max:.8g}")
        values.append(v)
    group = _group_size(group_text)
    n = len(values)
    if n % group:
        raise ValueError(f"group size {group} does not divide the {n} weights typed "
                         f"(groups tile a row exactly)")
    return np.asarray(values, dtype=np.float32), group


def _group_size(group_text) -> int:
    raw = str(group_text).strip()
    try:
        group = int(raw)
    except ValueError:
        if n := digits_past_int(raw):
            why = "must be positive" if raw.startswith("-") else f"is more than the {MAX_WEIGHTS} weights this widget takes"
            raise ValueError(f"group size {quoted(raw)} ({n:,} digits) {why}") from None
        raise ValueError(f"group size must be a whole number, got {quoted(raw)}") from None
    if group <= 0:
        raise ValueError(f"group size must be positive, got {group}")
    if group % 2:
        raise ValueError(f"group size must be even (two int4 values share a byte), got {group}")
    return group


def int4_view(W: np.ndarray, group: int, scale_mistake: bool = False, nibble_mistake: bool = False,
              quant=None) -> Int4View:
    """Quantize one row W in groups (the engine's QLinear), then, when asked, redo it with a mistake.
    `quant`: the module whose QLinear and int4 helpers are used (default tl_lab.quant).

    ValueError (from QLinear) when a weight is too large for an f16 scale.
    """
    qm = tl_lab.quant if quant is None else quant
    n = W.size
    layer = qm.QLinear.quantize(W.reshape(1, n), group)  # the engine's path
    s_bits = layer.scales[0]
    s16 = np.asarray(qm.f16_to_f32(s_bits), dtype=np.float32)
    q_correct = qm.unpack_int4(layer.qweight)[0]
    W_hat_correct = layer.dequantize()[0]
    Wg = W.reshape(-1, group)
    s32 = np.abs(Wg).max(axis=1) / np.float32(7)
    q = _q_with_f32_scale(Wg, s32) if scale_mistake else q_correct
    packed = _pack_odd_low(q) if nibble_mistake else _pack(q, layer, scale_mistake, qm)
    q_read = qm.unpack_int4(packed)  # a reader that follows the format
    s_each = np.repeat(s16, group)
    W_hat = (q_read * s_each).astype(np.float32)
    err = np.abs(W.astype(np.float64) - W_hat.astype(np.float64))
    s_round = np.repeat(s32 if scale_mistake else s16, group)
    return Int4View(W, group, s32, s_bits, s16, s_round, q, packed, q_read, W_hat, err, s_each.astype(np.float64) / 2,
                    q_correct, W_hat_correct)


def _q_with_f32_scale(Wg: np.ndarray, s32: np.ndarray) -> np.ndarray:
    """MISTAKE s10: q rounded against the unrounded f32 scale (the f16 one is what gets stored)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.clip(np.rint(Wg / s32[:, None]), -8, 7)
    return np.where(s32[:, None] == 0, 0, q).astype(np.int8).reshape(-1)


def _pack(q: np.ndarray, layer: QLinear, scale_mistake: bool, qm) -> np.ndarray:
    """The format's bytes: the engine's own qweight, or pack_int4 of the mistaken q."""
    if not scale_mistake:
        return layer.qweight[0]
    return qm.pack_int4(q, 1, q.size)[0]


def _pack_odd_low(q: np.ndarray) -> np.ndarray:
    """MISTAKE s09: column 2b + 1 in the low nibble, 2b in the high one (the format says the reverse)."""
    nib = (q.astype(np.int16) & 0xF).astype(np.uint8)
    return (nib[1::2] | (nib[0::2] << 4)).astype(np.uint8)


class Int4Widget(CellWidget):
    """Controls: `preset` (Dropdown), `weights_text` (Text), `group` (Text: the group size),
    `scale_rule` and `nibble_order` (RadioButtons: the correct rule or the labelled mistake).
    Shown: `summary` (HTML: scales, bytes and the verdict, or a message in words), `table` (HTML:
    one row per weight), `chart` (HTML: an SVG of |W - W_hat| against s/2). After every change `view`
    holds the Int4View behind the display (None after bad input) and `error` the message ("" when fine).
    """

    def __init__(self, weights: str | None = None, group: int | None = None, yours=None):
        first = next(iter(PRESETS))
        # the learner's quant module (chapter "your turn"): its bytes and W_hat beside the reference's
        self.yours, self.yours_result = yours, None
        # beside the learner's, the display is the reference file's: with a workspace active (06's first
        # cell), tl_lab.quant IS the learner's, and their bytes would show as the correct ones
        self.quant = None if yours is None else _reference_quant()
        self.compare = widgets.HTML()
        style = dict(style={"description_width": "110px"}, layout=widgets.Layout(width="560px"))
        self.preset = widgets.Dropdown(options=list(PRESETS) + ["typed"], value=first,
                                       description="weights preset", **style)
        self.weights_text = widgets.Text(value=PRESETS[first][0], description="weights W",
                                         placeholder="numbers: 0.7, -1.4, 0, 0.29995", **style)
        self.group = widgets.Text(value=str(PRESETS[first][1]), description="group size g",
                                  style={"description_width": "110px"}, layout=widgets.Layout(width="220px"))
        # radio buttons, not toggle buttons: their labels are never cut short
        radio = dict(style={"description_width": "110px"}, layout=widgets.Layout(width="auto"))
        self.scale_rule = widgets.RadioButtons(options=SCALE_RULES, description="round with", **radio)
        self.nibble_order = widgets.RadioButtons(options=NIBBLE_ORDERS, description="pack", **radio)
        self.summary, self.table, self.chart = widgets.HTML(), widgets.HTML(), widgets.HTML()
        self.view: Int4View | None = None
        self.error = ""
        self._quiet = False
        super().__init__([self.preset, self.weights_text, self.group, self.scale_rule, self.nibble_order,
                          self.summary, self.compare, self.chart, self.table])
        self.preset.observe(self._on_preset, names="value")
        for control in (self.weights_text, self.group, self.scale_rule, self.nibble_order):
            control.observe(self._on_change, names="value")
        if weights is not None or group is not None:
            self._quiet = True
            self.preset.value = "typed"
            self.weights_text.value = self.weights_text.value if weights is None else str(weights)
            self.group.value = self.group.value if group is None else str(group)
            self._quiet = False
        self.refresh()

    def _on_preset(self, change) -> None:
        if self._quiet or change["new"] not in PRESETS:
            return
        text, g = PRESETS[change["new"]]
        self._quiet = True
        try:
            self.weights_text.value, self.group.value = text, str(g)
        finally:
            self._quiet = False
        self.refresh()

    def _on_change(self, change) -> None:
        if self._quiet:
            return
        if change["owner"] in (self.weights_text, self.group) and self.preset.value != "typed":
            text, g = PRESETS[self.preset.value]
            if (self.weights_text.value, self.group.value) != (text, str(g)):
                self._quiet = True
                self.preset.value = "typed"
                self._quiet = False
        self.refresh()

    @property
    def scale_mistake(self) -> bool:
        return self.scale_rule.value == SCALE_RULES[1]

    @property
    def nibble_mistake(self) -> bool:
        return self.nibble_order.value == NIBBLE_ORDERS[1]

    def refresh(self) -> None:
        """Parse the inputs and redraw everything, or clear the pictures and say what is wrong."""
        try:
            W, group = parse_weights(self.weights_text.value, self.group.value)
            view = int4_view(W, group, self.scale_mistake, self.nibble_mistake, self.quant)
        except ValueError as exc:
            self.view, self.error = None, str(exc)
            self.summary.value = message(self.error)
            self.table.value = self.chart.value = self.compare.value = ""  # never stale bars beside a message
            return
        self.view, self.error = view, ""
        self.compare.value = self._yours_line(W, group)
        self.summary.value = summary_html(view, self.scale_mistake, self.nibble_mistake)
        self.table.value = table_html(view)
        self.chart.value = error_svg(view)


    def _yours_line(self, W: np.ndarray, group: int) -> str:
        """The learner's QLinear.quantize of W: its bytes and W_hat against the reference file's."""
        self.yours_result = None
        if self.yours is None:
            return ""
        from tl_lab.lab.exercise.side import reference

        ref = reference("quant").QLinear.quantize(W.reshape(1, -1), group)
        try:
            lin = self.yours.QLinear.quantize(W.reshape(1, -1), group)
            self.yours_result = (np.asarray(lin.qweight)[0], np.asarray(lin.dequantize())[0])
        except Exception as exc:  # noqa: BLE001: the learner's code; its error is what to show
            from tl_lab.lab.exercise.side import raised

            return message(raised(exc, self.yours, "quant"))
        got_b, got_w = self.yours_result
        same_b = np.array_equal(got_b, ref.qweight[0])
        same_w = np.array_equal(got_w.view(np.uint32), ref.dequantize()[0].view(np.uint32))
        text = " ".join(f"{int(b):02X}" for b in got_b)
        verdict = "the reference's bytes and W_hat, bit for bit" if same_b and same_w else (
            f"DIFFERENT from the reference's ({' '.join(f'{int(b):02X}' for b in ref.qweight[0])}"
            f"{'' if same_w else '; W_hat differs too'})")
        return f"<p class='tl-yours' style='{MONO}'><b>yours:</b> bytes {text} &middot; {verdict}</p>"


def _reference_quant():
    from tl_lab.lab.exercise.side import reference

    return reference("quant")


def f32(x) -> str:
    """A float32 as the shortest text that reads back to it: 0.7, not 0.699999988079071 (its exact
    value). For the values typed or computed in float32 (W, max|W| / 7); the f16 scale and W_hat are
    shown exactly, as the file means them."""
    return str(np.float32(x))


def summary_html(v: Int4View, scale_mistake: bool, nibble_mistake: bool) -> str:
    """Per group the scale (f32, stored f16), the packed bytes, and the verdict in words."""
    rows = "".join(
        f"<tr><td>{g}</td><td>{f32(np.abs(v.W.reshape(-1, v.group)[g]).max())}</td>"
        f"<td>{f32(v.s32[g])}</td><td>0x{int(v.s_bits[g]):04X}</td><td>{float(v.s16[g])!r}</td></tr>"
        for g in range(v.s16.size))
    scales = (f"<table style='{TABLE}'><tr><th>group</th><th>max|W|</th>"
              "<th>max|W| / 7 (f32)</th><th>stored f16 bits</th><th>s (stored value)</th></tr>"
              f"{rows}</table>")
    packed = " ".join(f"0x{int(b):02X}" for b in v.packed)
    parts = [scales, f"<p style='{MONO}'>packed bytes: {packed}</p>"]
    n_bad, n_q = int(v.broken.sum()), int((v.q_read != v.q_correct).sum())
    if scale_mistake:
        n_diff = int((v.q != v.q_correct).sum())
        parts.append(message(f"MISTAKE s10: q rounded with the f32 scale max|W| / 7, but the file stores "
                             f"the f16 one; {n_diff} of {v.W.size} weights get another q than the stored-scale rule"))
    if nibble_mistake:
        parts.append(message("MISTAKE s09: the odd column went into the low nibble; a reader following the "
                             "format swaps every pair of columns"))
    parts += [message(underflow_words(v, g), NOTE) for g in np.flatnonzero((v.s16 == 0) & (v.s32 > 0))]
    n_checked = v.W.size - int(v.underflow.sum())
    if n_bad:
        parts.append(message(f"{n_bad} of {v.W.size} weights break |W - W_hat| <= s/2 "
                             f"({n_q} decode to another q than the correct file's)"))
    elif n_checked:
        parts.append(message(f"every weight is within s/2 of its original: |W - W_hat| <= s/2 holds for all "
                             f"{n_checked}" + (" of the groups with a scale" if n_checked < v.W.size else ""), NOTE))
    return "".join(parts)


def underflow_words(v: Int4View, g: int) -> str:
    """Why group g reads back as zeros, and why that is the correct result."""
    top = float(np.abs(v.W.reshape(-1, v.group)[g]).max())
    return (f"group {g}: max|W| / 7 = {f32(v.s32[g])} is below 2^-25 = {F16_ZERO_BELOW:.3g} (half of f16's "
            f"smallest subnormal), so the f16 scale stored is 0 and every weight of the group reads back as 0. "
            f"That is the correct result, not a broken one: with s = 0 the s/2 bound says nothing, the error is "
            f"|W| itself, here at most {top:.3g} (never above 7 * 2^-25 = {7 * F16_ZERO_BELOW:.3g}).")


def table_html(v: Int4View) -> str:
    """One row per weight: W, W / s, q, its nibble, the q a reader decodes, W_hat, |W - W_hat|, s/2."""
    rows = []
    for j in range(v.W.size):
        s = v.s_round[j]
        ratio = "0 (s = 0)" if s == 0 else f"{float(v.W[j] / np.float32(s)):.5f}"
        colour = BAD if v.broken[j] else HALF if v.underflow[j] else "inherit"
        within = "s = 0 (underflow)" if v.underflow[j] else "no" if v.broken[j] else "yes"
        rows.append(
            f"<tr style='color:{colour}'><td>{j}</td><td>{j // v.group}</td><td>{f32(v.W[j])}</td>"
            f"<td>{ratio}</td><td>{int(v.q[j])}</td><td>{int(v.q[j]) & 0xF:04b}</td><td>{int(v.q_read[j])}</td>"
            f"<td>{float(v.W_hat[j])!r}</td><td>{v.err[j]:.6g}</td><td>{v.half[j]:.6g}</td>"
            f"<td>{within}</td></tr>")
    head = ("<tr><th>col</th><th>group</th><th>W</th><th>W / s (the s rounded with)</th><th>q written</th><th>nibble</th>"
            "<th>q read</th><th>W_hat = q s</th><th>|W - W_hat|</th><th>s/2</th><th>within s/2</th></tr>")
    return f"<table style='{TABLE}; text-align:right'>{head}{''.join(rows)}</table>"


def error_svg(v: Int4View) -> str:
    """Bars of |W - W_hat| per column (red when above s/2, orange in a group whose scale underflowed to
    0), each group's s/2 as an orange line."""
    n = v.W.size
    bw, gap, left, top, h = 18, 4, 48, 24, 120
    width = max(left + n * (bw + gap) + 16, 300)  # room for the title
    hi = max(float(v.err.max()), float(v.half.max()), 1e-30) * 1.1
    def y(val):
        return top + h - val / hi * h
    parts = [f"<text x='{left}' y='14' font-size='12' font-weight='bold'>|W - W_hat| per column, s/2 dashed</text>",
             f"<line x1='{left}' x2='{width - 8}' y1='{y(0):.1f}' y2='{y(0):.1f}' stroke='#888'/>",
             f"<text x='{left - 4}' y='{y(hi / 1.1) + 4:.1f}' font-size='9' text-anchor='end'>{hi / 1.1:.3g}</text>",
             f"<text x='{left - 4}' y='{y(0) + 4:.1f}' font-size='9' text-anchor='end'>0</text>"]
    for g in range(n // v.group):
        x0, x1 = left + g * v.group * (bw + gap), left + (g + 1) * v.group * (bw + gap) - gap
        parts.append(f"<line class='half' x1='{x0}' x2='{x1}' y1='{y(v.half[g * v.group]):.1f}' "
                     f"y2='{y(v.half[g * v.group]):.1f}' stroke='{HALF}' stroke-width='2' stroke-dasharray='4,2'/>")
    for j in range(n):
        x = left + j * (bw + gap)
        y0 = y(v.err[j])
        colour = BAD if v.broken[j] else HALF if v.underflow[j] else OK
        parts.append(f"<rect class='err' x='{x}' y='{y0:.1f}' width='{bw}' height='{max(y(0) - y0, 1.0):.1f}' "
                     f"fill='{colour}'><title>col {j}: |W - W_hat| = {v.err[j]:.6g}, s/2 = {v.half[j]:.6g}</title></rect>")
        parts.append(f"<text x='{x + bw / 2}' y='{top + h + 12}' font-size='9' text-anchor='middle'>{j}</text>")
    return (f"<svg class='tl-chart' width='{width}' height='{top + h + 20}' style='{MONO}'>"
            + "".join(parts) + "</svg>")


def show(weights: str | None = None, group: int | None = None) -> Int4Widget:
    """Build and display the widget (for a notebook cell)."""
    from IPython.display import display

    w = Int4Widget(weights, group)
    display(w)
    return w

