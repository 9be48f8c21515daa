"""The numbers widget: type a float, see its f32, f16 and bf16 bits and how each was rounded.

Chapter L10.1, section 2.3 (the widening formulas, rounding to nearest even) and section 3 (the f16
ties). Everything shown comes from `tl_lab.quant`'s scalar reference (`explain_f32_to_f16`,
`explain_f32_to_bf16`), the same code path that converts values, never a copy of it.

`NumbersWidget(yours=module)` (chapter "your turn": `tl_lab.lab.exercise.side.yours("quant")`) also
rounds x with the learner's quant.py and shows their f16 and bf16 bits beside the reference's
(`compare`); the fields are then drawn from the reference's own file.
"""

from __future__ import annotations

import html
import math

import ipywidgets as widgets

from tl_lab.quant import (
    F16_MAX,
    Narrowing,
    bf16_to_f32,
    explain_f32_to_bf16,
    explain_f32_to_f16,
    f16_to_f32,
    f32_from_bits,
)
from tl_lab.lab.widgets.common import CellWidget, ERROR, MONO, message, quoted

# (total bits, exponent bits, mantissa bits, relative error bound in the normal range)
FORMATS = {"f32": (32, 8, 23, 2.0**-24), "f16": (16, 5, 10, 2.0**-11), "bf16": (16, 8, 7, 2.0**-8)}
COLOURS = {"sign": ERROR, "exponent": "#2471a3", "mantissa": "#1e8449", "dropped": "#999999"}


class NumbersWidget(CellWidget):
    """Type a number in `text`; `html` shows its bit fields, the rounding decisions and the errors.

    After each change `x` holds the parsed value (None when the text is not a number) and
    `narrowings` the f16 and bf16 `Narrowing` records behind the display.
    """

    def __init__(self, value: str = "0.1", yours=None):
        self.text = widgets.Text(value=value, description="x =", placeholder="a float, e.g. 0.1")
        self.html = widgets.HTML()
        self.compare = widgets.HTML()  # yours beside the reference's (empty without `yours`)
        self.x: float | None = None
        self.narrowings: dict[str, Narrowing] = {}
        self.yours = yours  # the learner's quant module, or None
        self.yours_bits: dict[str, int] = {}  # fmt -> the learner's pattern for x ({} if none or it raised)
        self._explain = {"f16": explain_f32_to_f16, "bf16": explain_f32_to_bf16}
        self._widen = WIDEN  # reading the bits back for "value stored"
        if yours is not None:
            from tl_lab.lab.exercise.side import reference

            ref = reference("quant")
            self._explain = {"f16": ref.explain_f32_to_f16, "bf16": ref.explain_f32_to_bf16}
            # the stored values too: with a workspace active tl_lab.quant's f16_to_f32 is the learner's
            self._widen = {"f16": ref.f16_to_f32, "bf16": ref.bf16_to_f32}
        super().__init__([self.text, self.html, self.compare])
        self.text.observe(self._on_text, names="value")
        self.refresh()

    def _on_text(self, change) -> None:
        self.refresh()

    def refresh(self) -> None:
        """Parse the text and redraw."""
        raw = self.text.value.strip()
        try:
            self.x = float(raw)
        except ValueError:
            self.x, self.narrowings, self.yours_bits = None, {}, {}
            self.html.value, self.compare.value = not_a_number(raw), ""
            return
        self.narrowings = {fmt: explain(self.x) for fmt, explain in self._explain.items()}
        self.html.value = render(self.x, self.narrowings, self._widen)
        self.compare.value = self._yours_line()

    def _yours_line(self) -> str:
        """The learner's f32_to_f16 and f32_to_bf16 of x beside the reference's bits."""
        self.yours_bits = {}
        if self.yours is None:
            return ""
        try:
            self.yours_bits = {"f16": int(self.yours.f32_to_f16(self.x)), "bf16": int(self.yours.f32_to_bf16(self.x))}
        except Exception as exc:  # noqa: BLE001: the learner's code; its error is what to show
            from tl_lab.lab.exercise.side import raised

            self.yours_bits = {}
            return message(raised(exc, self.yours, "quant"))
        parts = []
        for fmt, bits in self.yours_bits.items():
            want = self.narrowings[fmt].bits
            parts.append(f"{fmt} 0x{bits:04X} " + ("(the reference's)" if bits == want else f"(DIFFERENT: the reference's is 0x{want:04X})"))
        return f"<p class='tl-yours' style='{MONO}'><b>yours:</b> " + " &middot; ".join(parts) + "</p>"


def not_a_number(raw: str) -> str:
    """The message for text that is not a float, with values worth trying."""
    shown = quoted(raw) + (f" ({len(raw):,} characters)" if len(raw) > 40 else "")
    what = "Type a number" if not raw else f"Not a number: {shown}"
    return message(f"{what}. Try a decimal such as 0.1, 1.00048828125, -3.5e-6, 70000 or nan.")


def render(x: float, narrowings: dict[str, Narrowing], widen: dict | None = None) -> str:
    """The whole display for the typed value x (a Python float) as HTML. `widen`: fmt -> the function
    reading its bits back as a value (default tl_lab.quant's f16_to_f32 and bf16_to_f32)."""
    x32 = narrowings["f16"].x_bits
    rows = [_row("f32", x32, f32_from_bits(x32), x)]
    rows += [_row(fmt, n.bits, (widen or WIDEN)[fmt](n.bits), x) for fmt, n in narrowings.items()]
    table = (
        f"<table style='{MONO}'><tr><th>format</th><th>sign | exponent | mantissa</th>"
        "<th>hex</th><th>value stored</th><th>relative error</th></tr>" + "".join(rows) + "</table>"
    )
    steps = "".join(_rounding_block(n) for n in narrowings.values())
    return f"<div><p>x = {html.escape(repr(x))} (typed; f32 first, then narrowed)</p>{table}{steps}</div>"


WIDEN = {"f16": f16_to_f32, "bf16": bf16_to_f32}


def _row(fmt: str, bits: int, stored: float, x: float) -> str:
    width = FORMATS[fmt][0]
    return (
        f"<tr><td>{fmt}</td><td>{fields_html(fmt, bits)}</td>"
        f"<td>0x{bits:0{width // 4}X}</td><td>{stored!r}</td><td>{relative_error(stored, x)}</td></tr>"
    )


def fields_html(fmt: str, bits: int) -> str:
    """The bit pattern as coloured sign | exponent | mantissa spans."""
    width, n_exp = FORMATS[fmt][:2]
    b = f"{bits:0{width}b}"
    parts = (("sign", b[0]), ("exponent", b[1 : 1 + n_exp]), ("mantissa", b[1 + n_exp :]))
    return " | ".join(f"<span style='color:{COLOURS[k]}'>{v}</span>" for k, v in parts)


def relative_error(stored: float, x: float) -> str:
    """|stored - x| / |x| as text, with the special cases spelled out."""
    if math.isnan(x) or math.isnan(stored):
        return "NaN stays NaN"
    if math.isinf(stored) and not math.isinf(x):
        return "overflow: infinity"
    if math.isinf(x):
        return "0 (infinity)"
    if x == 0:
        return "0" if stored == 0 else "inf"
    return f"{abs(stored - x) / abs(x):.3g}"


def _rounding_block(n: Narrowing) -> str:
    """How the f32 pattern was narrowed to `n.fmt`: kept and dropped bits, the halfway test."""
    title = f"<p><b>f32 &rarr; {n.fmt}</b>: "
    if n.rounding is None:
        nan = math.isnan(f32_from_bits(n.x_bits))
        return title + ("NaN stays NaN (quiet bit set)" if nan else "infinity stays infinity") + "</p>"
    r = n.rounding
    kept_width = (24 if n.fmt == "f16" else 31) - r.n_dropped
    kept = f"{r.kept:0{kept_width}b}" if kept_width > 0 else "(none)"
    dropped = f"{r.dropped:0{r.n_dropped}b}"
    half = f"{r.half:0{r.n_dropped}b}"
    what = "significand, implicit 1 included" if n.fmt == "f16" else "exponent and mantissa"
    drop = (f"drop <span style='{MONO}; color:{COLOURS['dropped']}'>{dropped}</span> "
            f"({r.n_dropped} bits; halfway is <span style='{MONO}'>{half}</span>)")
    shift = f16_shift(n.x_bits) if n.fmt == "f16" else r.n_dropped
    if shift > r.n_dropped:  # the code's shift stops short: its dropped bits are at the wrong scale
        x32, step = abs(f32_from_bits(n.x_bits)), 2.0**-24
        drop = (f"drop every bit: |x| = {x32:.3g} is {x32 / step:.3g} of f16's smallest step 2^-24 = {step:.3g}, "
                f"below half of it (2^-25 = {step / 2:.3g}), so it rounds to zero (to drop it at its scale takes a "
                f"shift of {shift} bits; the code shifts by {r.n_dropped}, which drops it all the same)")
    lines = [
        f"keep ({what}) <span style='{MONO}; color:{COLOURS['mantissa']}'>{kept}</span> {drop}",
        f"decision: {decision_text(r)}",
        _range_note(n),
    ]
    return title + "<br>".join(lines) + "</p>"


def f16_shift(x_bits: int) -> int:
    """The right shift that takes an f32 significand to f16's last kept place: 13 in f16's normal range,
    one more per binade below 2^-14 (f16 subnormal: one step is 2^-24), 125 for an f32 subnormal.
    explain_f32_to_f16 shifts by at most 25: below 2^-26 its dropped bits are not at this scale."""
    e = max((x_bits >> 23) & 0xFF, 1) - 127
    return 13 + max(0, -14 - e)


def _range_note(n: Narrowing) -> str:
    """Where the value sits in the target format's range, and what that means for the error."""
    bound = FORMATS[n.fmt][3]
    x32 = abs(f32_from_bits(n.x_bits))
    smallest_normal = 2.0**-14 if n.fmt == "f16" else 2.0**-126
    if n.overflow:
        limit = f"{F16_MAX:g}" if n.fmt == "f16" else "3.39e38"
        return f"overflow: beyond {limit}, the largest finite {n.fmt}, the result is infinity"
    if x32 == 0:
        return "zero is exact"
    if x32 < smallest_normal:
        fate = "underflow to zero" if n.bits & 0x7FFF == 0 else f"{n.fmt} subnormal"
        return (
            f"below {n.fmt}'s normal range ({smallest_normal:.3g}): {fate}; fewer significant bits, "
            f"so the relative error can exceed {bound:.3g}"
        )
    return f"normal range: relative error at most 2^{int(math.log2(bound))} = {bound:.3g}"


def decision_text(r) -> str:
    """One line naming the rounding decision: exact, below half, tie -> even, above half."""
    if r.verdict == "exact":
        return "exact: the dropped bits are all zero, keep"
    if r.verdict == "below half":
        return "below half: round down (keep)"
    if r.verdict == "above half":
        return "above half: round up (+1)"
    if r.round_up:
        return "tie -> even: the kept value is odd, round up (+1) to the even one"
    return "tie -> even: the kept value is even, keep it"


__all__ = ["NumbersWidget", "render", "fields_html", "relative_error", "decision_text"]
