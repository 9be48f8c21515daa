"""The sampler playground: logits in, every stage of docs/spec/sampling.md drawn, one token out.

Chapter L10.1, sections 2.6 and 3. Pick a preset or type logits, move the sliders (temperature, top-k,
top-p, min-p, the three penalties, the seed), type a prompt / output history, and see one bar chart per
stage (penalised logits, logprobs, scaled logits, after top-k, after top-p, min-p's weights, the final
probabilities) and the CDF walk with u marked. Everything shown comes from `tl_lab.sample.sample_trace`,
the engine's own code path.

For a real model's next-token distribution: `SamplerPlayground(logits, labels=token_strings)`, or
`playground.set_logits(logits, labels)` later; only the ~20 ids with the largest penalised logits
(and the sampled one) are drawn.

`ModelPlayground(model_dir)` does that with a model: the learner types a prompt, the runner computes
the next-token logits (`ModelRunner.run_once`), the SamplerPlayground below shows them (token strings,
not ids) going through every stage, and a button appends the sampled token and computes again.
`playground_model_dir()` picks SmolLM2 when it has been fetched, else the bundled tiny Llama.
"""

from __future__ import annotations

import html
import math
import re
from pathlib import Path

import ipywidgets as widgets
import numpy as np

from tl_lab.errors import TlError
from tl_lab.sample import PURPOSE_SAMPLE, SampleTrace, SamplingParams, sample_trace, stream

PRESETS = {
    "section 3: [1, 3, 2, 3, -1]": [1.0, 3.0, 2.0, 3.0, -1.0],
    "probabilities 0.4 / 0.3 / 0.2 / 0.1": [math.log(0.4), math.log(0.3), math.log(0.2), math.log(0.1)],
    "ties: four equal, one far below": [5.0, 5.0, 5.0, 5.0, -100.0],
    "peaked": [8.0, 2.0, 1.0, 0.5, 0.0, -1.0, -2.0, -3.0],
    "flat with a long tail": [2.0, 1.9, 1.8, 1.7, 1.5, 1.2, 1.0, 0.5, 0.0, -0.5, -1.0, -2.0],
}
GIVEN = "given logits"
EDITABLE_MAX = 64  # longer vectors are not put in the text field
KEPT, DROPPED, TOKEN, LINE = "#2471a3", "#c8c8c8", "#c0392b", "#e67e22"
MONO = "font-family: monospace"


class SamplerPlayground(widgets.VBox):
    """Controls: `preset` (Dropdown), `logits_text` (Text), `prompt_text`, `output_text` (ids),
    `temperature`, `top_k`, `top_p`, `min_p`, `repetition_penalty`, `presence_penalty`,
    `frequency_penalty` (sliders), `seed` and `draw` (IntText: draws already taken from
    stream(seed, 4)). Shown: `result` (HTML: the token line or a message) and `charts` (HTML with one SVG
    per stage). After every change `trace` holds the SampleTrace behind the display (None after a
    refusal), `message` the refusal text ("" when fine), `shown_ids` the ids drawn and `chart_data`
    stage -> {"ids", "values", "kept"}.
    """

    def __init__(self, logits=None, labels=None, prompt=(), output=(), *, params: SamplingParams | None = None,
                 seed: int = 0, show_top: int = 20):
        self.show_top = int(show_top)
        self._quiet = True
        self.trace: SampleTrace | None = None
        self.message = ""
        self.shown_ids: list[int] = []
        self.chart_data: dict[str, dict] = {}
        self._logits: np.ndarray | None = None
        self._given: tuple | None = None  # (logits, labels) of the last set_logits, for the GIVEN preset
        self.labels: list[str] | None = None
        p = params or SamplingParams()
        s = dict(continuous_update=False, style={"description_width": "140px"}, layout=widgets.Layout(width="420px"))
        self.preset = widgets.Dropdown(options=list(PRESETS) + [GIVEN], description="logits preset", **_style())
        self.logits_text = widgets.Text(description="logits", placeholder="numbers: 1, 3, 2, 3, -1", **_style())
        self.prompt_text = widgets.Text(description="prompt ids", placeholder="e.g. 0, 2", **_style())
        self.output_text = widgets.Text(description="output ids", placeholder="generated so far", **_style())
        self.temperature = widgets.FloatSlider(value=p.temperature, min=0.0, max=3.0, step=0.05,
                                               description="temperature (0 = greedy)", **s)
        self.top_k = widgets.IntSlider(value=p.top_k, min=0, max=50, description="top-k (0 = off)", **s)
        self.top_p = widgets.FloatSlider(value=p.top_p, min=0.01, max=1.0, step=0.01, description="top-p (1 = off)", **s)
        self.min_p = widgets.FloatSlider(value=p.min_p, min=0.0, max=1.0, step=0.01, description="min-p (0 = off)", **s)
        self.repetition_penalty = widgets.FloatSlider(value=p.repetition_penalty, min=0.1, max=3.0, step=0.05,
                                                      description="repetition (1 = off)", **s)
        self.presence_penalty = widgets.FloatSlider(value=p.presence_penalty, min=-2.0, max=2.0, step=0.1,
                                                    description="presence (0 = off)", **s)
        self.frequency_penalty = widgets.FloatSlider(value=p.frequency_penalty, min=-2.0, max=2.0, step=0.1,
                                                     description="frequency (0 = off)", **s)
        self.seed = widgets.IntText(value=seed, description="seed", **_style("220px"))
        self.draw = widgets.IntText(value=0, description="draws before", **_style("220px"))
        self.result = widgets.HTML()
        self.charts = widgets.HTML()
        left = widgets.VBox([self.preset, self.logits_text, self.prompt_text, self.output_text,
                             widgets.HBox([self.seed, self.draw])])
        right = widgets.VBox([self.temperature, self.top_k, self.top_p, self.min_p, self.repetition_penalty,
                              self.presence_penalty, self.frequency_penalty])
        super().__init__([widgets.HBox([left, right]), self.result, self.charts])
        self.preset.observe(self._on_preset, names="value")
        for w in (self.logits_text, self.prompt_text, self.output_text, self.temperature, self.top_k, self.top_p,
                  self.min_p, self.repetition_penalty, self.presence_penalty, self.frequency_penalty, self.seed,
                  self.draw):
            w.observe(lambda _: self.update(), names="value")
        self.prompt_text.value = _ids_text(prompt)
        self.output_text.value = _ids_text(output)
        self._quiet = False
        if logits is None:
            self.preset.value = next(iter(PRESETS))
            self._on_preset({"new": self.preset.value})
        else:
            self.set_logits(logits, labels)

    # ------------------------------------------------------------ inputs

    def set_logits(self, logits, labels=None, prompt=None, output=None) -> None:
        """Show a new logits vector (e.g. a model's next-token row), with optional token strings."""
        x = np.asarray(logits)
        if labels is not None and len(labels) != x.size:
            raise ValueError(f"labels has {len(labels)} entries for {x.size} logits")
        self._quiet = True
        try:
            self._logits = x
            self.labels = None if labels is None else [str(t) for t in labels]
            self._given = (x, self.labels)
            if prompt is not None:
                self.prompt_text.value = _ids_text(prompt)
            if output is not None:
                self.output_text.value = _ids_text(output)
            self.preset.value = GIVEN
            editable = x.ndim == 1 and x.size <= EDITABLE_MAX
            self.logits_text.disabled = not editable
            self.logits_text.value = _numbers_text(x) if editable else f"({x.size} logits given; not editable here)"
            self.top_k.max = max(1, min(200, x.size if x.ndim == 1 else 1))
        finally:
            self._quiet = False
        self.update()

    def _on_preset(self, change) -> None:
        name = change["new"]
        if self._quiet:
            return
        if name == GIVEN:
            if self._given is not None:
                self.set_logits(*self._given)
            return
        self._quiet = True
        try:
            self._logits, self.labels = None, None
            self.logits_text.disabled = False
            self.logits_text.value = _numbers_text(PRESETS[name])
            self.top_k.max = 50
        finally:
            self._quiet = False
        self.update()

    def params(self) -> SamplingParams:
        """The SamplingParams the sliders describe."""
        return SamplingParams(
            temperature=self.temperature.value, top_k=self.top_k.value, top_p=self.top_p.value,
            min_p=self.min_p.value, repetition_penalty=self.repetition_penalty.value,
            presence_penalty=self.presence_penalty.value, frequency_penalty=self.frequency_penalty.value,
        )

    def _read_logits(self):
        if self._logits is not None and self.logits_text.disabled:
            return self._logits
        raw = self.logits_text.value.strip()
        if not raw:
            raise ValueError("type some logits, e.g. 1, 3, 2, 3, -1")
        values = []
        for j, tok in enumerate(t for t in re.split(r"[,\s;]+", raw.strip("[]() ")) if t):
            try:
                values.append(float(tok))
            except ValueError:
                raise ValueError(f"could not read the logits: {tok!r} (number {j + 1}) is not a number") from None
        if self.labels is not None and len(values) != len(self.labels):
            self.labels = None  # the learner changed the vector: the token strings no longer apply
        return np.array(values, np.float32)

    # ------------------------------------------------------------ the one computation

    def update(self) -> None:
        """Read every control, run `sample_trace` once and redraw. Refusals become a message."""
        if self._quiet:
            return
        try:
            logits = self._read_logits()
            prompt = _read_ids(self.prompt_text.value, "prompt")
            output = _read_ids(self.output_text.value, "output")
            rng = stream(self.seed.value, PURPOSE_SAMPLE)
            if self.draw.value < 0:
                raise ValueError(f"draws before must be >= 0, got {self.draw.value}")
            for _ in range(min(self.draw.value, 100_000)):
                rng.uniform_f64()
            params = self.params()
            self.trace = sample_trace(logits, params, prompt, output, rng)
        except (ValueError, TypeError) as exc:
            self.trace, self.message, self.shown_ids, self.chart_data = None, str(exc), [], {}
            self.result.value = _message(str(exc))
            self.charts.value = ""
            return
        self.message = ""
        self.shown_ids = self._pick_ids(self.trace)
        self.chart_data = stage_data(self.trace, self.shown_ids, params)
        self.result.value = self.token_line()
        self.charts.value = render_charts(self.chart_data, self.trace, params, self._label_of, self.shown_ids)

    def _pick_ids(self, tr: SampleTrace) -> list[int]:
        """All ids of a small vocabulary; else the show_top ids with the largest penalised logits and the
        token, in ascending id order (the order of the CDF walk)."""
        V = tr.penalised.size
        if V <= self.show_top:
            return list(range(V))
        top = np.lexsort((np.arange(V), -tr.penalised))[: self.show_top]
        return sorted(set(top.tolist()) | {tr.token})

    def _label_of(self, i: int) -> str:
        return str(i) if self.labels is None else self.labels[i]

    def token_line(self) -> str:
        """The result as one HTML line: token, its label, logprob, u and the kept set."""
        tr = self.trace
        name = "" if self.labels is None else f" {html.escape(repr(self.labels[tr.token]))}"
        kept = tr.kept.tolist()
        kept_txt = "{" + ", ".join(map(str, kept[:30])) + (", ..." if len(kept) > 30 else "") + "}"
        draw = "greedy: argmax, no draw" if tr.greedy else f"u = {tr.u:.5f} (exactly {tr.u!r})"
        return (
            f"<p class='tl-token' style='{MONO}'><b>token {tr.token}</b>{name} &middot; logprob "
            f"{tr.logprob:.5f} (p = {math.exp(tr.logprob):.4f}) &middot; {draw} &middot; kept {len(kept)} "
            f"of {tr.penalised.size}: {kept_txt}</p>"
        )


# ---------------------------------------------------------------------------------------------------
# What each chart shows (data), then how (SVG)

STAGES = ["penalised logits", "logprobs", "scaled logits q = l / T", "after top-k", "after top-p",
          "min-p: weight w = exp(q - max q)", "final probabilities", "CDF walk"]


def stage_data(tr: SampleTrace, ids: list[int], params: SamplingParams) -> dict[str, dict]:
    """stage -> {"ids", "values", "kept"} for the shown ids, read from the trace."""
    out = {
        "penalised logits": _series(ids, tr.penalised, None),
        "logprobs": _series(ids, tr.logprobs, None),
    }
    if tr.greedy:
        out["final probabilities"] = _on_set(ids, tr.kept, tr.probs)
        return out
    out["scaled logits q = l / T"] = _series(ids, tr.scaled, None)
    out["after top-k"] = _on_set(ids, tr.top_k, tr.top_k_probs)
    out["after top-p"] = _on_set(ids, tr.top_p, tr.top_p_probs)
    kept_min_p = set(tr.min_p.tolist())
    in_top_p = set(tr.top_p.tolist())
    out["min-p: weight w = exp(q - max q)"] = {
        "ids": ids, "values": [float(tr.weights[i]) if i in in_top_p else 0.0 for i in ids],
        "kept": [i in kept_min_p for i in ids],
    }
    out["final probabilities"] = _on_set(ids, tr.kept, tr.probs)
    out["CDF walk"] = _on_set(ids, tr.kept, tr.cdf)
    return out


def _series(ids, values, kept) -> dict:
    return {"ids": ids, "values": [float(values[i]) for i in ids], "kept": [True] * len(ids) if kept is None else kept}


def _on_set(ids, kept_ids: np.ndarray, values: np.ndarray) -> dict:
    """Values given over a kept set (aligned with its ascending ids), read at the shown ids (0 if dropped)."""
    kept_ids = np.asarray(kept_ids)
    if kept_ids.size == 0:
        return {"ids": ids, "values": [0.0] * len(ids), "kept": [False] * len(ids)}
    order = np.argsort(kept_ids, kind="stable")  # a search, not a dict: kept sets can hold 49,152 ids
    j = np.minimum(np.searchsorted(kept_ids[order], ids), kept_ids.size - 1)
    found = kept_ids[order][j] == np.asarray(ids)
    at = order[j]
    return {"ids": ids, "values": [float(values[a]) if f else 0.0 for a, f in zip(at.tolist(), found.tolist())],
            "kept": found.tolist()}


def render_charts(data: dict, tr: SampleTrace, params: SamplingParams, label_of, ids) -> str:
    labels = [label_of(i) for i in ids]
    notes = {
        "penalised logits": "outline: the logits before penalties",
        "logprobs": "log softmax of the penalised logits, before temperature: the logprob returned",
        "after top-k": f"top_k = {params.top_k}" + (" (off)" if params.top_k == 0 else ""),
        "after top-p": _walk_note(tr, params),
        "min-p: weight w = exp(q - max q)": f"kept when w >= min_p = {params.min_p:g}"
        + (" (off)" if params.min_p == 0 else ""),
        "final probabilities": "softmax over the kept ids, in ascending id order",
        "CDF walk": "" if tr.greedy else f"the first kept id with u < c; u = {tr.u:.5f}",
    }
    svgs = []
    for stage in STAGES:
        if stage not in data:
            continue
        d = data[stage]
        ghosts = [float(tr.logits[i]) for i in ids] if stage == "penalised logits" else None
        line = tr.u if stage == "CDF walk" else (params.min_p if stage.startswith("min-p") and params.min_p else None)
        svgs.append(bar_svg(stage, labels, d["values"], d["kept"], token_index=ids.index(tr.token),
                            line=line, line_label="u" if stage == "CDF walk" else "min_p", ghosts=ghosts,
                            note=notes.get(stage, "")))
    if tr.greedy:
        svgs.append("<p><i>temperature 0: greedy, the first id with the largest penalised logit; top-k, top-p "
                    "and min-p are not evaluated and the generator is not touched.</i></p>")
    head = "" if len(ids) == tr.penalised.size else (
        f"<p><i>Showing {len(ids)} of {tr.penalised.size} ids: the largest penalised logits and the token, "
        "in ascending id order.</i></p>")
    return head + "<div style='display:flex; flex-wrap:wrap; gap:8px'>" + "".join(svgs) + "</div>"


def _walk_note(tr: SampleTrace, params: SamplingParams) -> str:
    if tr.nucleus_order is None:
        return "top_p = 1 (off)"
    steps = ", ".join(f"{i}: {c:.4f}" for i, c in zip(tr.nucleus_order.tolist()[:8], tr.nucleus_cum.tolist()[:8]))
    more = ", ..." if tr.nucleus_order.size > 8 else ""
    return f"walk (q desc): {steps}{more}; stop at >= {params.top_p:g}"


def bar_svg(title: str, labels: list[str], values: list[float], kept: list[bool], *, token_index: int,
            line: float | None = None, line_label: str = "", ghosts: list[float] | None = None,
            note: str = "") -> str:
    """One bar chart as an SVG: kept bars blue, dropped grey, the token's bar red, an optional
    horizontal line (u or min-p) and outline bars (`ghosts`)."""
    n = len(values)
    notes = _wrap(note, 48)
    bw, gap, left, h = 26, 6, 8, 110
    top = 22 + 12 * len(notes)
    rotate = any(len(_short(t, 10)) > 4 for t in labels)
    bottom = 62 if rotate else 30
    width = max(left * 2 + n * (bw + gap), 8 * len(title) + 16, 6 * max(map(len, notes), default=0) + 16, 240)
    pool = values + (ghosts or []) + ([line] if line is not None else [])
    lo, hi = min(0.0, *pool), max(0.0, *pool)
    span = (hi - lo) or 1.0

    def y(v):
        return top + (hi - v) / span * h

    parts = [f"<text x='{left}' y='14' font-size='12' font-weight='bold'>{html.escape(title)}</text>"]
    parts += [f"<text x='{left}' y='{27 + 12 * k}' font-size='10' fill='#555'>{html.escape(t)}</text>"
              for k, t in enumerate(notes)]
    parts += [f"<line x1='{left}' x2='{width - left}' y1='{y(0):.1f}' y2='{y(0):.1f}' stroke='#888'/>"]
    for j, v in enumerate(values):
        x = left + j * (bw + gap)
        if not kept[j]:
            parts.append(f"<text x='{x + bw / 2}' y='{y(0) + 4:.1f}' font-size='12' fill='#999' "
                         f"text-anchor='middle'>&#x2715;<title>{html.escape(labels[j])}: dropped</title></text>")
        colour = TOKEN if j == token_index and kept[j] else (KEPT if kept[j] else DROPPED)
        y0, y1 = sorted((y(0), y(v)))
        parts.append(f"<rect x='{x}' y='{y0:.1f}' width='{bw}' height='{max(y1 - y0, 0.5):.1f}' fill='{colour}'>"
                     f"<title>{html.escape(labels[j])}: {v!r}</title></rect>")
        if ghosts is not None and ghosts[j] != v:
            g0, g1 = sorted((y(0), y(ghosts[j])))
            parts.append(f"<rect x='{x}' y='{g0:.1f}' width='{bw}' height='{max(g1 - g0, 0.5):.1f}' "
                         "fill='none' stroke='#333' stroke-dasharray='2,2'/>")
        parts.append(f"<text x='{x + bw / 2}' y='{top + h + 11}' font-size='8' fill='#555' text-anchor='middle'>"
                     f"{'' if not kept[j] else _num(v)}</text>")
        if rotate:
            parts.append(f"<text x='{x + bw / 2}' y='{top + h + 20}' font-size='9' text-anchor='end' "
                         f"transform='rotate(-55 {x + bw / 2} {top + h + 20})'>{html.escape(_short(labels[j], 10))}</text>")
        else:
            parts.append(f"<text x='{x + bw / 2}' y='{top + h + 22}' font-size='9' text-anchor='middle'>"
                         f"{html.escape(_short(labels[j], 5))}</text>")
    if line is not None:
        parts.append(f"<line x1='{left}' x2='{width - left}' y1='{y(line):.1f}' y2='{y(line):.1f}' "
                     f"stroke='{LINE}' stroke-width='1.5'/>")
        parts.append(f"<text x='{width - left}' y='{y(line) - 3:.1f}' font-size='10' fill='{LINE}' "
                     f"text-anchor='end'>{html.escape(line_label)} = {line:.4g}</text>")
    return (f"<svg class='tl-chart' data-stage='{html.escape(title)}' width='{width}' "
            f"height='{top + h + bottom}' style='{MONO}'>" + "".join(parts) + "</svg>")


def _wrap(text: str, width: int) -> list[str]:
    lines, cur = [], ""
    for word in text.split():
        if cur and len(cur) + 1 + len(word) > width:
            lines.append(cur)
            cur = word
        else:
            cur = f"{cur} {word}" if cur else word
    return lines + ([cur] if cur else [])


def _short(label: str, n: int) -> str:
    """A token string for an axis: whitespace and control characters made visible, at most n chars."""
    s = label if label.isprintable() and label.strip() == label and label else repr(label)[1:-1]
    s = s.replace("\\x20", "␣") if s != label else s
    if label.startswith(" ") and label.isprintable():
        s = "␣" + label[1:]
    return s if len(s) <= n else s[: n - 1] + "…"


def _num(v: float) -> str:
    return f"{v:.2g}" if abs(v) < 10 else f"{v:.0f}"


def _message(text: str) -> str:
    return f"<p class='tl-message' style='color:{TOKEN}'><b>{html.escape(text)}</b></p>"


def _style(width: str = "420px") -> dict:
    return {"style": {"description_width": "140px" if width == "420px" else "90px"},
            "layout": widgets.Layout(width=width)}


def _ids_text(ids) -> str:
    return ", ".join(str(int(i)) for i in ids)


def _numbers_text(values) -> str:
    return ", ".join(repr(float(v)) if not float(v).is_integer() else str(int(v)) for v in values)


def _read_ids(text: str, name: str) -> list[int]:
    ids = []
    for tok in (t for t in re.split(r"[,\s;]+", text.strip("[]() ")) if t):
        try:
            ids.append(int(tok))
        except ValueError:
            raise ValueError(f"{name} ids must be whole numbers: {tok!r} is not one") from None
    return ids


def show(logits=None, labels=None, **kw) -> SamplerPlayground:
    """Display a playground in the notebook and return it."""
    from IPython.display import display

    w = SamplerPlayground(logits, labels, **kw)
    display(w)
    return w


# ---------------------------------------------------------------------------------------------------
# The playground on a model: prompt -> runner -> next-token logits -> the stages above -> append


def playground_model_dir() -> tuple[Path, str]:
    """(model directory, note): SmolLM2 when it has been fetched, else the bundled data/tiny-llama, with
    a note saying how to fetch SmolLM2 ("" when SmolLM2 is there)."""
    from tl_lab.fetch import FETCH_HINT, smollm2_dir
    from tl_lab.paths import DATA_DIR

    path = smollm2_dir(quiet=True)
    if path is not None:
        return path, ""
    return DATA_DIR / "tiny-llama", (
        "SmolLM2 has not been fetched, so this is data/tiny-llama: random weights over 256 byte tokens, "
        f"its distributions are noise. For a real model, {FETCH_HINT} (in a notebook: "
        "!python -m tl_lab fetch smollm2, about 10 s), then create the playground again.")


class ModelPlayground(widgets.VBox):
    """A model's real next-token distribution in the sampler playground (chapter L10.1, section 2.6).

    Controls: `prompt` (Textarea), `chat` (Checkbox: render the prompt as a user turn with the model's
    chat template; disabled when the model has none), `sample_button` (samples the token the playground
    shows and appends it), `reset_button` (drops the appended tokens); and every control of `sampler`,
    the SamplerPlayground that draws the stages (temperature, top-k, ..., `seed`, `draw`).
    Shown: `info` (the model; how to fetch SmolLM2 when it is missing), `context_html` (the tokens of
    the prompt and, highlighted, the appended ones), `status` (what the last press did, or a message).

    model_dir None: `playground_model_dir()`. cfg: the EngineConfig to load it with (e.g. threads=1);
    runner (+ tokenizer): an already loaded model instead.

    State: `prompt_ids` (the encoded prompt), `output_ids` and `output_logprobs` (the appended tokens,
    the sampler's `output` history for the penalties), `logits` (the context's next-token row, or None
    after a refusal), `message` ("" when fine), `labels` (the token string of every id).

    Draw accounting as in the engine (section 2.6): token n of a request takes uniform n of
    stream(seed, PURPOSE_SAMPLE), and a greedy token takes none. The sampler's `draw` control holds the
    uniforms already taken; a press takes the token the sampler shows (drawn with that many skipped)
    and advances `draw` by one unless it was greedy. Editing the prompt starts over (no output, draw 0).
    """

    def __init__(self, model_dir=None, prompt: str | None = None, *, cfg=None, runner=None, tokenizer=None,
                 chat: bool | None = None, params: SamplingParams | None = None, seed: int = 0,
                 show_top: int = 20):
        from tl_lab.runner import ModelRunner
        from tl_lab.tokenizer import load_tokenizer

        note = ""
        if model_dir is None and runner is None:
            model_dir, note = playground_model_dir()
        if runner is None:
            runner = ModelRunner.load(model_dir, cfg)
        self.model_dir = None if model_dir is None else Path(model_dir)
        self.runner = runner
        if tokenizer is None:
            if self.model_dir is None:
                raise ValueError("ModelPlayground(runner=...) needs tokenizer=... or model_dir=...")
            tokenizer = load_tokenizer(self.model_dir, runner.config)
        self.tokenizer = tokenizer
        c = runner.config
        self.labels = [tokenizer.token_str(i) for i in range(c.vocab_size)]
        self.max_context = min(c.max_position_embeddings, runner.pool.n_blocks * runner.block_tokens)
        has_template = bool(getattr(tokenizer, "chat_template", None))
        self.prompt_ids: list[int] = []
        self.output_ids: list[int] = []
        self.output_logprobs: list[float] = []
        self.logits: np.ndarray | None = None
        self.message = ""
        self._busy = True

        self.sampler = SamplerPlayground(params=params, seed=seed, show_top=show_top)
        default = "What is the capital of France?" if has_template else "Hello, world"
        self.prompt = widgets.Textarea(value=default if prompt is None else prompt, description="prompt",
                                       continuous_update=False, layout=widgets.Layout(width="640px", height="64px"),
                                       style={"description_width": "60px"})
        self.chat = widgets.Checkbox(value=has_template if chat is None else bool(chat), disabled=not has_template,
                                     description="chat template (the prompt as a user turn)", indent=False)
        self.sample_button = widgets.Button(description="sample and append", button_style="primary",
                                            tooltip="append the token shown in red below and compute the next row")
        self.reset_button = widgets.Button(description="clear appended tokens")
        self.info = widgets.HTML(self._info_html(note))
        self.context_html = widgets.HTML()
        self.status = widgets.HTML()
        super().__init__([self.info, self.prompt, widgets.HBox([self.chat, self.sample_button, self.reset_button]),
                          self.status, self.context_html, self.sampler])
        self.prompt.observe(lambda _: self.restart(), names="value")
        self.chat.observe(lambda _: self.restart(), names="value")
        self.sample_button.on_click(lambda _: self.sample_and_append())
        self.reset_button.on_click(lambda _: self.restart())
        self._busy = False
        self.restart()

    # ------------------------------------------------------------ actions

    def restart(self) -> None:
        """Encode the prompt again, drop the appended tokens, draw 0, and compute the next-token row."""
        if self._busy:
            return
        self.output_ids, self.output_logprobs = [], []
        self._set_draw(0)
        self.recompute()

    def sample_and_append(self) -> int | None:
        """Append the token the sampler shows, advance the draws, compute again. -> the id (None: refused)."""
        tr = self.sampler.trace
        if self.logits is None:
            self._say(f"Nothing to sample: {self.message}", error=True)
            return None
        if self.sampler.preset.value != GIVEN or self.sampler._logits is not self.logits:
            self._say("The sampler shows a preset, not the model's row: set 'logits preset' back to "
                      f"'{GIVEN}' to sample from the model.", error=True)
            return None
        if tr is None:
            self._say(f"Nothing to sample: {self.sampler.message or 'the sampler has no token'}", error=True)
            return None
        if len(self.prompt_ids) + len(self.output_ids) + 1 > self.max_context:
            self._say(f"The context is full ({self.max_context} tokens): clear the appended tokens or "
                      "shorten the prompt.", error=True)
            return None
        token, logprob = int(tr.token), float(tr.logprob)
        self.output_ids.append(token)
        self.output_logprobs.append(logprob)
        self._set_draw(self.sampler.draw.value + (0 if tr.greedy else 1))
        self.recompute()
        if self.message:  # the new context was refused: keep the message
            return token
        how = "greedy, no draw" if tr.greedy else f"u = {tr.u:.5f}, uniform {self.sampler.draw.value - 1}"
        eos = (" &middot; <b>an end-of-sequence token</b>: a generate loop would stop here"
               if token in self.runner.config.eos_token_ids else "")
        self._say(f"appended <b>{html.escape(repr(self.labels[token]))}</b> (id {token}, logprob {logprob:.4f}, "
                  f"{how}){eos}")
        return token

    def recompute(self) -> None:
        """Run the model on prompt + appended tokens and hand the last row to the sampler. Refusals
        (an empty prompt, no chat template, a context too long) become a message."""
        try:
            self.prompt_ids = self._encode()
            context = self.prompt_ids + self.output_ids
            if len(context) > self.max_context:
                raise ValueError(f"the context is {len(context)} tokens, more than this model and pool take "
                                 f"({self.max_context}); shorten the prompt")
            _, logits = self.runner.run_once(context)
        except (ValueError, TlError) as exc:
            self.logits, self.message = None, str(exc)
            self._say(str(exc), error=True)
            self.context_html.value = ""
            self.sampler.trace = None
            self.sampler.result.value = _message("no logits: " + str(exc))
            self.sampler.charts.value = ""
            return
        self.logits, self.message = logits, ""
        if self.status.value.startswith("<p class='tl-message'"):
            self.status.value = ""
        self.context_html.value = self._context_html()
        self.sampler.set_logits(logits, self.labels, prompt=self.prompt_ids, output=self.output_ids)

    # ------------------------------------------------------------ helpers

    def _encode(self) -> list[int]:
        text = self.prompt.value
        if not text.strip():
            raise ValueError("type a prompt first")
        if self.chat.value:
            text = self.tokenizer.apply_chat_template([{"role": "user", "content": text}])
        ids = self.tokenizer.encode(text)
        if not ids:
            raise ValueError("the prompt encodes to no tokens")
        return ids

    def _set_draw(self, n: int) -> None:
        self.sampler._quiet = True  # the row is recomputed next; no need to redraw the old one
        try:
            self.sampler.draw.value = int(n)
        finally:
            self.sampler._quiet = False

    def _say(self, text: str, error: bool = False) -> None:
        self.status.value = _message(text) if error else f"<p class='tl-status' style='{MONO}'>{text}</p>"

    def _info_html(self, note: str) -> str:
        c = self.runner.config
        where = self.model_dir.name if self.model_dir is not None else "a given runner"
        quant = self.runner.quant
        what = (f"<b>{html.escape(where)}</b>: {c.arch}, {c.num_hidden_layers if c.arch == 'llama' else 0} "
                f"layers, vocabulary {c.vocab_size}{', int4 g' + str(quant.group) if quant else ''}. "
                "The charts show the model's next-token distribution after the prompt (and the appended tokens).")
        extra = f"<br><span class='tl-fetch' style='color:#a04000'>{html.escape(note)}</span>" if note else ""
        return f"<p>{what}{extra}</p>"

    def _context_html(self, last: int = 160) -> str:
        ids = self.prompt_ids + self.output_ids
        start = max(0, len(ids) - last)
        spans = ["<span style='color:#888'>&hellip; </span>"] if start else []
        for j in range(start, len(ids)):
            out = j >= len(self.prompt_ids)
            text = html.escape(self.labels[ids[j]]).replace("\n", "&#x21b5;\n")
            bg = "#aed6f1" if out else ("#f2f3f4" if j % 2 else "#e5e7e9")
            tip = f"id {ids[j]}" + (f", logprob {self.output_logprobs[j - len(self.prompt_ids)]:.4f}" if out else "")
            cls = "tl-out" if out else "tl-in"
            spans.append(f"<span class='{cls}' title='{tip}' style='background:{bg}; white-space:pre-wrap'>{text}</span>")
        head = (f"<p style='margin:2px 0'><i>context: {len(self.prompt_ids)} prompt tokens"
                f" + {len(self.output_ids)} appended (blue); hover a token for its id</i></p>")
        return head + f"<div style='{MONO}; font-size:12px; line-height:1.6'>" + "".join(spans) + "</div>"


def show_model(model_dir=None, prompt: str | None = None, **kw) -> ModelPlayground:
    """Display a ModelPlayground in the notebook and return it."""
    from IPython.display import display

    w = ModelPlayground(model_dir, prompt, **kw)
    display(w)
    return w


__all__ = ["SamplerPlayground", "ModelPlayground", "playground_model_dir", "PRESETS", "STAGES", "stage_data",
           "bar_svg", "show", "show_model"]
