"""The engine loop, step by step: which requests ran in each step, with how many new tokens, what
the prefix cache supplied and which blocks were allocated, evicted and released.

Chapter L10.1, section 2.1 (the runner inside an engine loop) and what L10.2 (the scheduler), L10.3
(chunked prefill), L10.4 (the block manager) and L10.5 (the loop) build on it. Everything drawn is a
`tl_lab.engine.generate.StepRecord` that the real `Engine` emitted through `on_step` while it generated:
the widget replays records, it never simulates a step.

    steps = EngineSteps.run(engine, requests)    # generate, recording every step
    steps                                        # a timeline and the selected step's details
"""

from __future__ import annotations

import html

import ipywidgets as widgets

from tl_lab.engine.generate import Engine, Request, StepRecord
from tl_lab.lab.widgets.common import CellWidget, MONO, NOTE, message

PREFILL, DECODE, SELECT = "#93c5fd", "#86efac", "#dc2626"
HIT = "#b45309"  # dark orange: the prefix-cache-hit bar (notebook 12 calls it so)
CELL_W, CELL_H, LEFT, TOP = 26, 22, 64, 22
MAX_DRAWN = 120  # steps drawn in the timeline; the slider still reaches every step


class EngineSteps(CellWidget):
    """A timeline of the records (`timeline.value`: an SVG, one row per request, one column per step,
    a cell per sequence that ran: blue a prompt chunk, green a decode token, the number its new tokens)
    and the details of step `slider.value` (`detail.value`). `back_button` / `next_button` step."""

    def __init__(self, records: list[StepRecord], labels: dict[int, str] | None = None):
        self.message = _bad_records(records)  # said in the widget, never raised (issue #61)
        self.records = [] if self.message else list(records)
        n_req = 1 + max((r.request for rec in self.records for r in rec.rows), default=-1)
        self.labels = {i: f"req {i}" for i in range(n_req)} | dict(labels or {})
        self.timeline, self.detail = widgets.HTML(), widgets.HTML()
        last = max(len(self.records) - 1, 0)
        self.slider = widgets.IntSlider(value=0, min=0, max=last, description="step",
                                        layout=widgets.Layout(width="420px"))
        self.back_button = widgets.Button(description="◀ back", layout=widgets.Layout(width="90px"))
        self.next_button = widgets.Button(description="next ▶", button_style="primary",
                                          layout=widgets.Layout(width="90px"))
        self.back_button.on_click(lambda _: self.show(self.slider.value - 1))
        self.next_button.on_click(lambda _: self.show(self.slider.value + 1))
        self.slider.observe(lambda _: self._redraw(), names="value")
        controls = widgets.HBox([self.back_button, self.next_button, self.slider])
        super().__init__([controls, self.timeline, self.detail])
        self._redraw()

    @classmethod
    def run(cls, engine: Engine, requests: list[Request], labels: dict[int, str] | None = None):
        """Generate `requests` on `engine`, recording each step; -> (the widget, the Results)."""
        records: list[StepRecord] = []
        results = engine.generate(requests, on_step=records.append)
        return cls(records, labels), results

    def show(self, k: int) -> None:
        """Select step k (clamped to the steps recorded)."""
        self.slider.value = max(self.slider.min, min(int(k), self.slider.max))

    def _redraw(self) -> None:
        k = self.slider.value
        self.back_button.disabled = k == 0
        self.next_button.disabled = k >= len(self.records) - 1
        self.timeline.value = timeline(self.records, self.labels, k)
        if self.message:
            self.detail.value = message(self.message)
            return
        if not self.records:
            self.detail.value = message("No steps recorded: the engine ran no request.", NOTE)
            return
        self.detail.value = describe(self.records[k], self.labels)


def _bad_records(records) -> str:
    """What is wrong with EngineSteps' records in one line ("" when nothing): a list of StepRecords."""
    if isinstance(records, (str, bytes)) or not hasattr(records, "__iter__") or hasattr(records, "shape"):
        return f"records must be a list of StepRecords (Engine.generate(..., on_step=records.append)), not {type(records).__name__}"
    try:
        records = list(records)
    except Exception as exc:  # noqa: BLE001: anything given: its error is the message
        return f"records could not be read: {type(exc).__name__}: {str(exc)[:100]}"
    for i, r in enumerate(records):
        if not isinstance(r, StepRecord):
            return f"records[{i}] is {type(r).__name__} {str(r)[:40]!r}, not a StepRecord"
    return ""


def timeline(records: list[StepRecord], labels: dict[int, str], selected: int) -> str:
    """The SVG: request rows, step columns, a cell where a request ran (its new-token count)."""
    drawn = records[:MAX_DRAWN]
    width = LEFT + len(drawn) * CELL_W + 8
    height = TOP + len(labels) * CELL_H + 8
    parts = [f"<text x='{LEFT + i * CELL_W + CELL_W / 2}' y='14' font-size='10' text-anchor='middle'>{i}</text>"
             for i in range(0, len(drawn), 5)]
    for r, name in labels.items():
        parts.append(f"<text x='4' y='{TOP + r * CELL_H + 15}' font-size='12'>{html.escape(name)}</text>")
    for rec in drawn:
        x = LEFT + rec.index * CELL_W
        for row in rec.rows:
            y = TOP + row.request * CELL_H
            colour = PREFILL if row.prompt else DECODE
            parts.append(
                f"<g class='tl-cell' data-step='{rec.index}' data-request='{row.request}' data-n='{row.n}'>"
                f"<rect x='{x + 1}' y='{y + 1}' width='{CELL_W - 2}' height='{CELL_H - 2}' fill='{colour}'/>"
                f"<text x='{x + CELL_W / 2}' y='{y + 15}' font-size='10' text-anchor='middle'>{row.n}</text></g>")
        for req, hits in rec.admitted:
            if hits:  # prefix-cache hits: a dark orange bar (HIT) on the left of the admission step's cell
                parts.append(f"<rect class='tl-hit' x='{x}' y='{TOP + req * CELL_H + 1}' width='3' "
                             f"height='{CELL_H - 2}' fill='{HIT}'/>")
    if selected < len(drawn):
        parts.append(f"<rect x='{LEFT + selected * CELL_W}' y='{TOP - 2}' width='{CELL_W}' "
                     f"height='{len(labels) * CELL_H + 4}' fill='none' stroke='{SELECT}' stroke-width='2'/>")
    more = (f"<p>Steps {MAX_DRAWN} to {len(records) - 1} are not drawn; the slider reaches them.</p>"
            if len(records) > MAX_DRAWN else "")
    legend = (f"<span style='background:{PREFILL};padding:0 6px'>prompt chunk</span> "
              f"<span style='background:{DECODE};padding:0 6px'>decode</span> "
              f"<span style='border-left:3px solid {HIT};padding:0 6px'>prefix-cache hits at admission</span>")
    return (f"<div class='tl-steps' style='{MONO}'><p>{legend} (the number: new tokens in that step)</p>"
            f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' "
            f"style='font-family: sans-serif'>{''.join(parts)}</svg>{more}</div>")


def _ids(ids) -> str:
    return ", ".join(str(b) for b in ids) if ids else "none"


def describe(rec: StepRecord, labels: dict[int, str]) -> str:
    """What step `rec` did, in words and a table (one line per sequence of its ForwardBatch)."""
    lines = []
    for r in rec.rows:
        what = (f"prompt chunk of {r.n}" if r.prompt == r.n else
                "decode" if r.prompt == 0 else f"{r.prompt} prompt + {r.n - r.prompt} output")
        sampled = "—" if r.token is None else str(r.token)
        lines.append(f"<tr><td>{html.escape(labels[r.request])}</td><td>{what}</td>"
                     f"<td>{r.start} … {r.start + r.n - 1}</td><td>{sampled}</td>"
                     f"<td>{_ids(rec.allocated.get(r.request, []))}</td>"
                     f"<td>{_ids(rec.tables.get(r.request, []))}</td></tr>")
    events = []
    for req, hits in rec.admitted:
        events.append(f"{labels[req]} admitted, {hits} block(s) found by prefix hash")
    if rec.evicted:
        events.append(f"cached block(s) {_ids(rec.evicted)} evicted to make room")
    for req, why in rec.finished:
        events.append(f"{labels[req]} finished ({why}), released {_ids(rec.released[req])} tail first")
    p = rec.pool
    n_tokens = sum(r.n for r in rec.rows)
    return (
        f"<div class='tl-step' data-step='{rec.index}' style='{MONO}'>"
        f"<p><b>Step {rec.index}</b>: one ForwardBatch of {len(rec.rows)} sequence(s), {n_tokens} new "
        f"token(s); {rec.waiting} request(s) still waiting.</p>"
        + "".join(f"<p class='tl-event'>{html.escape(e)}.</p>" for e in events)
        + "<table style='border-spacing: 12px 2px'><tr><th>request</th><th>rows</th><th>positions</th>"
        f"<th>sampled id</th><th>blocks allocated</th><th>block table</th></tr>{''.join(lines)}</table>"
        f"<p class='tl-pool'>pool after the step: free {p['free']} · in use {p['in_use']} · cached "
        f"{p['cached']} · evictions so far {p['evictions']} · lookups {p['lookups']} (hits {p['hits']})</p></div>"
    )
