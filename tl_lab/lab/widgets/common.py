"""What every widget shares: the monospace style, the way a widget says something in words, controls
built from a table, and the SVG pieces of a bar chart.

The bar pieces draw one chart as a column of horizontal bars, one row per item, so several charts set
side by side share their rows (the sampler playground puts every stage of section 2.6 next to the
token labels, on one screen with the sliders that change them).
"""

from __future__ import annotations

import html
import sys
from dataclasses import dataclass

import ipywidgets as widgets
import numpy as np

MONO = "font-family: ui-monospace, monospace"
ERROR = "#c0392b"   # a refusal or an input out of range
NOTE = "#555"       # a normal state worth a sentence ("no sequence holds blocks now")
KEPT, DROPPED, HIGHLIGHT, LINE = "#2471a3", "#c8c8c8", "#c0392b", "#e67e22"


class CellWidget(widgets.VBox):
    """The base of every tl_lab widget: a VBox that is closed, with every widget inside it, when the
    notebook cell that made it runs again.

    A cell run again replaces its output, so the widgets of the old output are gone from the page; but
    ipywidgets keeps every widget alive until it is closed, and with it whatever it holds (a block map's
    copy of a pool, a playground's model, their observers): each Run All grew the kernel by them."""

    def __init__(self, children=(), **kwargs):
        super().__init__(children, **kwargs)
        _one_per_cell(self)

    def close(self) -> None:
        """Close this widget and every widget it holds: its children, their layouts and styles, and the
        controls kept as attributes but not shown (a closed box's parts stay registered otherwise, and
        their observers hold the box, and the box what it shows)."""
        _close_parts(self, {id(self)})
        super().close()


def _close_parts(w: widgets.Widget, seen: set) -> None:
    for part in _parts(w):
        if id(part) in seen:
            continue
        seen.add(id(part))
        if isinstance(part, CellWidget):
            part.close()  # its own close: a playground lets go of its model
        else:
            _close_parts(part, seen)
            part.close()


def _parts(w: widgets.Widget) -> list[widgets.Widget]:
    """The widgets `w` refers to: trait values (children, layout, style) and plain attributes."""
    values = [*getattr(w, "_trait_values", {}).values(), *vars(w).values()]
    flat = [x for v in values for x in (v if isinstance(v, (list, tuple)) else (v,))]
    return [x for x in flat if isinstance(x, widgets.Widget) and x is not w]


_MADE: dict[str, tuple[int, list]] = {}  # cell -> (the execution count of its last run, the widgets it made)


def _one_per_cell(w: widgets.Widget) -> None:
    """Remember `w` as made by the running cell; close what that cell made when it last ran."""
    cell = _running_cell()
    if cell is None:
        return
    key, count = cell
    made_in, old = _MADE.get(key, (None, []))
    if made_in != count:
        for widget in old:
            widget.close()
        _forget_outputs(old)
        _MADE[key] = (count, old := [])
    old.append(w)


def _forget_outputs(closed: list) -> None:
    """Drop the `closed` widgets from IPython's output history (Out[n], _n, and _, __, ___ when they
    are one): a closed widget shows nothing, and the history kept each run's widget, and what it holds,
    alive for the session (07: a playground's 49,152 labels and its stage arrays, about 20 MB a Run All)."""
    from IPython import get_ipython

    ip = get_ipython()
    if ip is None:  # a test driving _one_per_cell by hand
        return
    gone = {id(w) for w in closed}
    out = ip.user_ns.get("Out", {})
    numbers = [n for n, value in out.items() if id(value) in gone]
    for n in numbers:
        del out[n]
    # the displayhook pushes _n, _, __, ___ into user_ns and, as not the learner's, into user_ns_hidden
    for ns in (ip.user_ns, getattr(ip, "user_ns_hidden", {})):
        for n in numbers:
            if id(ns.get(f"_{n}")) in gone:
                del ns[f"_{n}"]
        for name in ("_", "__", "___"):
            if id(ns.get(name)) in gone:
                ns[name] = ""  # what IPython's displayhook.flush() leaves there
    hook = getattr(ip, "displayhook", None)  # keeps its own _, __, ___ and pushes them again at the next output
    for name in ("_", "__", "___"):
        if id(getattr(hook, name, None)) in gone:
            setattr(hook, name, "")


def _running_cell() -> tuple[str, int] | None:
    """(the cell's id, or its source where the front end sends none; this run's execution count) of the
    notebook cell running now, or None outside one (a script, a test, a widget's callback)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    ip = get_ipython()
    kernel = getattr(ip, "kernel", None)
    if kernel is None:
        return None
    parent = kernel.get_parent()
    if parent.get("header", {}).get("msg_type") != "execute_request":
        return None
    key = parent.get("metadata", {}).get("cellId") or parent.get("content", {}).get("code")
    return (key, ip.execution_count) if key else None


def message(text: str, colour: str = ERROR) -> str:
    """One line of HTML in words, escaped; red by default, `NOTE` grey for a normal state."""
    return f"<p class='tl-message' style='color:{colour}'><b>{html.escape(text)}</b></p>"


def quoted(text: str, limit: int = 40) -> str:
    """What a learner typed, for a message: its repr, cut to `limit` characters (a pasted page stays
    one short line)."""
    return repr(text[:limit]) + ("..." if len(text) > limit else "")


def unsigned(text: str) -> str:
    """`text` without one leading sign, as int() reads it ("+5" is 5; "--5" keeps a sign)."""
    return text[1:] if text[:1] in ("+", "-") else text


def digits_past_int(text: str) -> int:
    """How many digits a whole number int() refused has (past its limit of 4300 digits), else 0: such
    a number is out of every range a widget takes, not "not a whole number"."""
    digits = unsigned(text)
    return len(digits) if digits.isascii() and digits.isdigit() and len(digits) > sys.get_int_max_str_digits() else 0


def fits_f32(v: float) -> bool:
    """Whether float32 holds the finite v without becoming inf (np.float32 would warn and say inf)."""
    with np.errstate(over="ignore"):
        return bool(np.isfinite(np.float32(v)))


def left_table(head: list[str], rows: list[list[str]]) -> str:
    """An HTML table with every cell aligned left and spaced, for a notebook's display(HTML(...)):
    JupyterLab aligns rendered table cells right, which suits numbers, not sentences and code. `head`
    is text (escaped here); the cells of `rows` are HTML already."""
    cell = "text-align:left; vertical-align:top; padding:2px 10px"
    ths = "".join(f"<th style='{cell}'>{html.escape(h)}</th>" for h in head)
    trs = "".join("<tr>" + "".join(f"<td style='{cell}'>{c}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table class='tl-table'><tr>{ths}</tr>{trs}</table>"


def breakable(name: str) -> str:
    """`name` (a test node id, a path) as HTML that may wrap after its _ / and :: (a long identifier
    would otherwise widen its table column past the window)."""
    out = html.escape(name)
    for sep in ("_", "/", "::"):
        out = out.replace(sep, sep + "<wbr>")
    return out


# ---------------------------------------------------------------------------------------------------
# Controls from a table


@dataclass(frozen=True)
class Control:
    """One slider of a widget: the attribute `name`, its ipywidgets class, its range and step, its
    label. The default comes from the caller (e.g. a SamplingParams field of the same name)."""

    name: str
    kind: type
    lo: float
    hi: float
    step: float
    label: str


def build_controls(table: list[Control], defaults: dict, label_width: str = "190px",
                   width: str = "470px") -> dict[str, widgets.Widget]:
    """name -> slider, one per row of `table`, valued `defaults[name]`, updating on release only.

    The label column is wide enough for the longest label: a cut label ("temperature (0 = g...") hides
    what 0 means."""
    out = {}
    for c in table:
        extra = {} if c.kind is widgets.IntSlider else {"step": c.step}
        out[c.name] = c.kind(value=defaults[c.name], min=c.lo, max=c.hi, description=c.label,
                             continuous_update=False, style={"description_width": label_width},
                             layout=widgets.Layout(width=width), **extra)
    return out


def field_style(width: str = "470px", label_width: str = "190px") -> dict:
    """Keyword arguments that give a text box or dropdown the sliders' label column."""
    return {"style": {"description_width": label_width}, "layout": widgets.Layout(width=width)}


# ---------------------------------------------------------------------------------------------------
# SVG bars: a label column and one column of horizontal bars per chart, rows aligned

ROW_H, HEAD_H = 18, 46   # a row per item; room for a three-line title


def wrap(text: str, width: int) -> list[str]:
    """Words of `text` in lines of at most `width` characters (a longer word gets its own line)."""
    lines, cur = [], ""
    for word in text.split():
        if cur and len(cur) + 1 + len(word) > width:
            lines.append(cur)
            cur = word
        else:
            cur = f"{cur} {word}" if cur else word
    return lines + ([cur] if cur else [])


def short_label(label: str, n: int) -> str:
    """A token string for an axis: spaces as '␣', control characters escaped, at most n characters."""
    s = label.replace(" ", "␣")
    s = s if s.isprintable() else repr(s)[1:-1]
    return s if len(s) <= n else s[: n - 1] + "…"


def num(v: float) -> str:
    """A value printed beside its bar: two significant digits, whole numbers from 10 on."""
    return f"{v:.2g}" if abs(v) < 10 else f"{v:.0f}"


def labels_svg(labels: list[str], highlight: int | None, title: str = "token") -> str:
    """The row labels of a set of bar columns: large horizontal text, the highlighted row in red."""
    width = 12 + 8 * max(map(len, labels + [title]))  # 12 px monospace: about 7.3 px a character
    parts = [f"<text x='{width - 6}' y='{HEAD_H - 8}' font-size='11' font-weight='bold' "
             f"text-anchor='end'>{html.escape(title)}</text>"]
    for j, text in enumerate(labels):
        y = HEAD_H + j * ROW_H
        hot = j == highlight
        if hot:
            parts.append(f"<rect x='0' y='{y}' width='{width}' height='{ROW_H}' fill='#fdecea'/>")
        weight = "bold" if hot else "normal"
        parts.append(f"<text x='{width - 6}' y='{y + ROW_H - 5}' font-size='12' text-anchor='end' "
                     f"font-weight='{weight}' fill='{HIGHLIGHT if hot else '#222'}'>{html.escape(text)}</text>")
    return (f"<svg class='tl-labels' width='{width}' height='{HEAD_H + len(labels) * ROW_H + 4}' "
            f"style='{MONO}'>" + "".join(parts) + "</svg>")


def hbars_svg(title: str, values: list[float], kept: list[bool], *, highlight: int | None = None,
              names: list[str] | None = None, ghosts: list[float] | None = None, line: float | None = None,
              line_label: str = "", width: int = 98) -> str:
    """One chart as a column of horizontal bars, row j = values[j]: kept bars blue, dropped ones grey
    with a cross, the highlighted row red; optional dashed outlines (`ghosts`, e.g. the value before a
    penalty) and a vertical line (`line`, e.g. u on the CDF). `names` are tooltips."""
    pool = values + (ghosts or []) + ([line] if line is not None else [])
    lo, hi = min(0.0, *pool), max(0.0, *pool)
    left, bar_w = 4, width - 38   # 34 px at the right for the printed value
    scale = bar_w / ((hi - lo) or 1.0)

    def x(v):
        return left + (v - lo) * scale

    parts = [f"<text x='{left}' y='{12 + 12 * k}' font-size='10' font-weight='bold'>{html.escape(t)}</text>"
             for k, t in enumerate(wrap(title, (width - 4) // 6)[:3])]
    bottom = HEAD_H + len(values) * ROW_H
    parts.append(f"<line x1='{x(0):.1f}' x2='{x(0):.1f}' y1='{HEAD_H - 2}' y2='{bottom}' stroke='#888'/>")
    for j, v in enumerate(values):
        parts += _hbar_row(j, v, kept[j], j == highlight, x, width, names[j] if names else str(j),
                           None if ghosts is None else ghosts[j])
    if line is not None:
        parts.append(f"<line x1='{x(line):.1f}' x2='{x(line):.1f}' y1='{HEAD_H - 4}' y2='{bottom}' "
                     f"stroke='{LINE}' stroke-width='1.5'/>")
        parts.append(f"<text x='{width - 2}' y='{bottom + 12}' font-size='10' fill='{LINE}' "
                     f"text-anchor='end'>{html.escape(line_label)} = {line:.4g}</text>")
    return (f"<svg class='tl-chart' data-stage='{html.escape(title)}' width='{width}' height='{bottom + 16}' "
            f"style='{MONO}'>" + "".join(parts) + "</svg>")


def _hbar_row(j: int, v: float, kept: bool, hot: bool, x, width: int, name: str, ghost) -> list[str]:
    y = HEAD_H + j * ROW_H
    parts = [f"<rect x='0' y='{y}' width='{width}' height='{ROW_H}' fill='#fdecea'/>"] if hot else []
    if not kept:
        parts.append(f"<text x='{x(0) + 3:.1f}' y='{y + ROW_H - 5}' font-size='11' fill='#999'>&#x2715;"
                     f"<title>{html.escape(name)}: dropped</title></text>")
        return parts
    colour = HIGHLIGHT if hot else KEPT
    x0, x1 = sorted((x(0), x(v)))
    parts.append(f"<rect x='{x0:.1f}' y='{y + 3}' width='{max(x1 - x0, 0.5):.1f}' height='{ROW_H - 6}' "
                 f"fill='{colour}'><title>{html.escape(name)}: {v!r}</title></rect>")
    if ghost is not None and ghost != v:
        g0, g1 = sorted((x(0), x(ghost)))
        parts.append(f"<rect x='{g0:.1f}' y='{y + 3}' width='{max(g1 - g0, 0.5):.1f}' height='{ROW_H - 6}' "
                     "fill='none' stroke='#333' stroke-dasharray='2,2'/>")
    parts.append(f"<text x='{width - 2}' y='{y + ROW_H - 5}' font-size='9' fill='#555' "
                 f"text-anchor='end'>{num(v)}</text>")
    return parts
