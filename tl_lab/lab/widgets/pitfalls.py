"""The pitfall lab: pick one of the chapter's 22 mistakes, read its edit, run its test with it on.

Chapter L10.1, section 5. Everything shown comes from `tl_lab.lab.pitfalls`: the registry (mistake,
symptom, test), the edit as a diff of the real function, the verdict of the real test run in a
subprocess with TL_LAB_PITFALL set, and the pictures measured by the real (broken) code in a
subprocess (`probe`), drawn next to the correct code's.
"""

from __future__ import annotations

import html
import io

import ipywidgets as widgets
from matplotlib.figure import Figure

from tl_lab.lab import pitfalls as pf
from tl_lab.lab.widgets.common import CellWidget, MONO, NOTE, message

__all__ = ["PitfallLab", "ProbeFigure", "diff_html", "verdict_html", "draw_probe"]

RED, GREEN, GREY = "#fdecea", "#e8f6ec", "#f4f4f4"


def diff_html(pid: str) -> str:
    """The edits of pitfall `pid` as HTML: per edit, the file and function, then the function's lines
    around the change, the correct ones struck in red (-) and the buggy ones in green (+)."""
    blocks = []
    for d in pf.function_diff(pid):
        rows = []
        for line in d["diff"]:
            colour = {"-": RED, "+": GREEN}.get(line[:1], GREY)
            # pre-wrap: a long line wraps inside the widget instead of running past its edge, cut off
            rows.append(f"<div style='background:{colour}; white-space:pre-wrap; overflow-wrap:anywhere'>"
                        f"{html.escape(line)}</div>")
        blocks.append(f"<p><b>{html.escape(d['file'])}</b>, in <code>{html.escape(d['function'])}</code>:</p>"
                      f"<div class='tl-diff' style='{MONO}; font-size:12px'>{chr(10).join(rows)}</div>")
    return "".join(blocks)


def info_html(p: pf.Pitfall) -> str:
    """The chapter's row for `p`: mistake, symptom, the test that catches it, where a notebook shows it."""
    seen = (f"<br>also seen in <code>notebooks/{p.notebook}.ipynb</code>: {html.escape(p.cell)}"
            if p.notebook else "<br>no notebook cell shows it: its test is where it shows")
    return (f"<p><b>{p.id}: {html.escape(p.mistake)}</b><br>symptom: <i>{html.escape(p.symptom)}</i><br>"
            f"caught by the chapter's <code>{p.chapter_test}</code>, here <code>{html.escape(p.test)}</code>"
            f"{seen}</p>")


def verdict_html(run: pf.TestRun) -> str:
    """A test run in words: with the pitfall on, "caught" when the test failed; with it off, "passes"."""
    name = run.test.split("::")[-1]
    on = run.pitfall is not None
    if on and run.outcome == "failed":
        head, colour = f"CAUGHT: {name} FAILS with {run.pitfall} on", "#c0392b"
    elif on and run.outcome == "passed":
        head, colour = f"NOT caught: {name} passes with {run.pitfall} on", "#b9770e"
    elif not on and run.outcome == "passed":
        head, colour = f"{name} passes with the pitfall off (the correct code)", "#1e8449"
    else:
        head, colour = f"{name}: {run.outcome} with {run.pitfall or 'the pitfall off'}", "#b9770e"
    body = f"<pre class='tl-failure' style='{MONO}; font-size:11px'>{html.escape(run.message)}</pre>" \
        if run.message else ""
    return (f"<p class='tl-verdict' style='color:{colour}'><b>{html.escape(head)}</b> "
            f"({run.seconds:.1f} s, one pytest subprocess)</p>{body}")


# ---------------------------------------------------------------------------------------------
# Pictures: one small drawing per probe, the correct code's data beside the broken code's
# ---------------------------------------------------------------------------------------------


def _f16_drift(ax, off, on):
    for data, label, c in ((off, "round to nearest even", "#1e8449"), (on, "truncate (s08)", "#c0392b")):
        mids = [(a + b) / 2 for a, b in zip(data["edges"], data["edges"][1:])]
        ax.step(mids, data["counts"], where="mid", color=c, label=f"{label}: mean {data['mean_ulp']:+.3f} ulp")
    ax.set_xlabel("f16(x) - x, in ulps (x uniform in [1, 2))")
    ax.set_ylabel("values")


def _bf16_read(ax, off, on):
    ax.scatter(off["values"], on["values"], s=6, color="#c0392b")
    ax.set_xlabel("embedding value read as BF16 (right)")
    ax.set_ylabel("the same bits read as F16 (s12)")


FLOOR = 1e-9  # a log axis has no 0: an exact agreement is drawn here, and the axis says so (as 03's chart does)


def _decode_vs_prefill(ax, off, on, pid="the pitfall"):
    gaps = [*off["gaps"], *on["gaps"]]
    ax.semilogy(off["positions"], [max(g, FLOOR) for g in off["gaps"]], "o-", color="#1e8449", label="correct")
    ax.semilogy(on["positions"], [max(g, FLOOR) for g in on["gaps"]], "o-", color="#c0392b", label=pid)
    ax.axvline(on["n_prompt"] - 0.5, color="#888", ls=":")
    ax.set_xlabel("position (the prompt ends at the dotted line; then one token per step)")
    below = [g for g in gaps if g < FLOOR]
    note = "" if not below else ("\n(exact: drawn at 1e-9)" if not any(below) else "\n(exact or below 1e-9: drawn at 1e-9)")
    ax.set_ylabel("max |logits - full prefill|" + note)


def _hf_logits(ax, off, on, pid="the pitfall"):
    ax.semilogy(off["lengths"], off["errors"], "o", color="#1e8449", label="correct")
    ax.semilogy(on["lengths"], on["errors"], "o", color="#c0392b", label=pid)
    ax.semilogy(off["lengths"], off["bounds"], "_", color="#555", ms=14, label="the chapter's bound")
    ax.set_xlabel("prompt length (golden prompts)")
    ax.set_ylabel("max |z - z_HF|")


def _pool_drain(ax, off, on):
    ax.plot(off["free"], "o-", color="#1e8449", label="correct")
    ax.plot(on["free"], "o-", color="#c0392b", label="s17")
    ax.set_xlabel("run_once calls (20 tokens, 2 blocks each)")
    ax.set_ylabel(f"free blocks of {off['n_blocks']}")
    ax.set_ylim(-1, off["n_blocks"] + 1)


def _lru_eviction(ax, off, on):
    for row, (data, c) in enumerate(((off, "#1e8449"), (on, "#c0392b"))):
        for k, b in enumerate(data["taken"]):
            ax.text(k, 1 - row, str(b), ha="center", va="center", color="white", fontsize=12,
                    bbox=dict(boxstyle="round", fc=c))
    ax.set_xlim(-0.5, len(off["taken"]) - 0.5)
    ax.set_ylim(-0.7, 1.7)
    ax.set_yticks([1, 0], ["correct", "s18"])
    ax.set_xlabel(f"alloc(1) calls in turn: the block each one takes (LRU oldest first: {off['lru']})")


def _rope_freqs(ax, off, on):
    ax.semilogy(off["inv_freq"], "o-", color="#1e8449", label="correct")
    ax.semilogy(on["inv_freq"], "o-", color="#c0392b", label="s20")
    ax.set_xlabel("pair i of the head (i, i + D/2)")
    ax.set_ylabel("inv_freq_i (radians per position)")


def _nucleus_edge(ax, off, on):
    ids = range(len(off["counts"]))
    ax.bar([i - 0.2 for i in ids], off["counts"], width=0.4, color="#1e8449", label=f"correct: keeps {off['kept']}")
    ax.bar([i + 0.2 for i in ids], on["counts"], width=0.4, color="#c0392b", label=f"s04: keeps {on['kept']}")
    ax.set_xlabel("token id (four equal logits, top_p = 0.5)")
    ax.set_ylabel("draws of 400 seeds")


def _words(ax, lines):
    """A picture in words: (label, text, colour) lines, for symptoms that are messages, not numbers."""
    ax.axis("off")
    for k, (label, text, colour) in enumerate(lines):
        ax.text(0.0, 1.0 - 0.2 * k, f"{label}: {text}", color=colour, fontsize=9, va="top", family="monospace",
                transform=ax.transAxes)


def _zero_pool(ax, off, on):
    _words(ax, [("correct", f"refused at {off['refused_at']}", "#1e8449"), ("  ", off["error"][:90], "#1e8449"),
                ("s19", f"refused at {on['refused_at']}", "#c0392b"), ("  ", on["error"][:90], "#c0392b")])


def _bad_token(ax, off, on):
    lines = []
    for name in off:
        for label, data, colour in (("correct", off[name], "#1e8449"), ("s21", on[name], "#c0392b")):
            lines.append((f"{name} {label}", f"{data['raised'] or 'no error'}: {data['error'][:70]}", colour))
    _words(ax, lines)


DRAW = {"f16_drift": _f16_drift, "bf16_read": _bf16_read, "decode_vs_prefill": _decode_vs_prefill,
        "hf_logits": _hf_logits, "pool_drain": _pool_drain, "lru_eviction": _lru_eviction,
        "rope_freqs": _rope_freqs, "nucleus_edge": _nucleus_edge, "zero_pool": _zero_pool, "bad_token": _bad_token}
_LABELLED = ("decode_vs_prefill", "hf_logits")  # shared by several pitfalls: the legend names the one on


class ProbeFigure(Figure):
    """A Figure that shows as a picture when a notebook displays it. Made without pyplot (so nothing
    keeps it alive once dropped, and there is nothing to close), it would otherwise display as its text
    form, "<Figure size 750x320 with 1 Axes>": the PNG display hook is registered by pyplot's inline
    backend, which a notebook that never imports pyplot does not have."""

    def _repr_png_(self) -> bytes:
        buf = io.BytesIO()
        self.savefig(buf, format="png")
        return buf.getvalue()


def draw_probe(name: str, off: dict, on: dict, pid: str | None = None) -> ProbeFigure:
    """The picture of probe `name`: the correct code's data `off` beside the broken code's `on`
    (display() it in a notebook: it shows as a PNG)."""
    fig = ProbeFigure(figsize=(7.5, 3.2))
    ax = fig.add_subplot()
    if name in _LABELLED:
        DRAW[name](ax, off, on, pid or "the pitfall")
    else:
        DRAW[name](ax, off, on)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def svg(fig: Figure) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg")
    text = buf.getvalue()
    return text[text.find("<svg"):]


# ---------------------------------------------------------------------------------------------
# The lab
# ---------------------------------------------------------------------------------------------


class PitfallLab(CellWidget):
    """Pick a pitfall (`picker`, or type its id in `jump`); `info` and `diff` show it; `run_button`
    runs its test with it on in a subprocess (`off_button` with it off) and `verdict` says what
    happened; `draw_button` draws the symptom from the broken code next to the correct code's.

    State after each action: `pitfall` (the id shown), `result` (the last TestRun, always of the
    pitfall shown, else None), `picture_data` ({"off": ..., "on": ...} of the probe drawn, else None).
    """

    def __init__(self, pid: str = "s01"):
        options = [(f"{p.id} · {p.mistake}", p.id) for p in pf.PITFALLS.values()]
        self.picker = widgets.Dropdown(options=options, value=pf.get(pid).id, description="pitfall",
                                       layout=widgets.Layout(width="640px"))
        self.jump = widgets.Text(placeholder="or type an id: s13", layout=widgets.Layout(width="180px"))
        self.note = widgets.HTML()
        self.info = widgets.HTML()
        self.diff = widgets.HTML()
        self.run_button = widgets.Button(description="Run its test with the pitfall on", button_style="danger",
                                         layout=widgets.Layout(width="280px"))
        self.off_button = widgets.Button(description="... with it off", layout=widgets.Layout(width="140px"))
        self.draw_button = widgets.Button(description="Draw the symptom", layout=widgets.Layout(width="160px"))
        self.verdict = widgets.HTML().add_class("tl-verdict-box")  # a stable handle for the browser test
        self.picture = widgets.HTML()
        self.result: pf.TestRun | None = None
        self.picture_data: dict | None = None
        self._off_probes: dict[str, dict] = {}
        super().__init__([widgets.HBox([self.picker, self.jump]), self.note, self.info, self.diff,
                          widgets.HBox([self.run_button, self.off_button, self.draw_button]),
                          self.verdict, self.picture])
        self.picker.observe(lambda change: self.show(), names="value")
        self.jump.observe(self._on_jump, names="value")
        self.run_button.on_click(lambda _: self.run(on=True))
        self.off_button.on_click(lambda _: self.run(on=False))
        self.draw_button.on_click(lambda _: self.draw())
        self.show()

    @property
    def pitfall(self) -> pf.Pitfall:
        return pf.get(self.picker.value)

    def _on_jump(self, change) -> None:
        text = change["new"].strip().lower()
        if not text:
            self.note.value = ""
            return
        if text not in pf.PITFALLS:
            self.note.value = message(f"{text!r} is not a pitfall: the chapter's are s01 to s22")
            return
        self.note.value = ""
        self.picker.value = text

    def show(self) -> None:
        """Redraw for the pitfall picked; a verdict or picture of another pitfall is cleared."""
        p = self.pitfall
        self.info.value = info_html(p)
        self.diff.value = diff_html(p.id)
        self.result = self.picture_data = None
        self.verdict.value = message("Not run yet: press the red button to run its test with the pitfall on.", NOTE)
        self.draw_button.disabled = p.probe is None
        self.picture.value = "" if p.probe else message(
            "No picture for this one: its test's failure message says it best.", NOTE)

    def run(self, on: bool = True) -> pf.TestRun:
        """Run the pitfall's test in a subprocess, with it on (or off) and show the verdict."""
        p = self.pitfall
        self.verdict.value = message(f"running {p.test} with {p.id if on else 'the pitfall off'} ...", NOTE)
        result = pf.run_test(p.test, p.id if on else None)
        if self.picker.value == p.id:  # still the pitfall shown
            self.result = result
            self.verdict.value = verdict_html(result)
        return result

    def draw(self) -> dict | None:
        """Measure the symptom with the pitfall on (subprocess) and off, and draw both."""
        p = self.pitfall
        if p.probe is None:
            return None
        if p.probe not in self._off_probes:
            self._off_probes[p.probe] = pf.probe(p.probe)
        data = {"off": self._off_probes[p.probe], "on": pf.probe(p.probe, p.id)}
        if self.picker.value == p.id:
            self.picture_data = data
            self.picture.value = svg(draw_probe(p.probe, data["off"], data["on"], p.id))
        return data
