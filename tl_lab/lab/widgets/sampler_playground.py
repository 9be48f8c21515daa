"""The sampler playground: logits in, every stage of docs/spec/sampling.md drawn, one token out.

Chapter L10.1, sections 2.6 and 3. Pick a preset or type logits, move the sliders (temperature, top-k,
top-p, min-p, the three penalties), set the seed and the draws already taken, type a prompt / output
history, and see every stage side by side (`sampler_charts`). Everything shown comes from
`tl_lab.sample.sample_trace`, the engine's own code path.

`SamplerPlayground(yours=module)` also runs the learner's sample.py (chapter "your turn":
`tl_lab.lab.exercise.side.yours("sample")`): its own SamplingParams, stream and sample on the same
inputs and draws, its token and logprob shown beside the reference's, bit for bit or not (`compare`).

For a real model's next-token distribution: `SamplerPlayground(logits, labels=token_strings)`, or
`playground.set_logits(logits, labels)` later; only the ~20 ids with the largest penalised logits
(and the sampled one) are drawn. `ModelPlayground` (model_playground.py) does that with a model.
"""

from __future__ import annotations

import html
import math
import re
from dataclasses import fields

import ipywidgets as widgets
import numpy as np

from tl_lab.sample import PURPOSE_SAMPLE, SampleTrace, SamplingParams
from tl_lab.lab.widgets.common import (MONO, CellWidget, Control, build_controls, digits_past_int, field_style, fits_f32,
                                   message, quoted, unsigned)
from tl_lab.lab.widgets.sampler_charts import render_charts, stage_data

PRESETS = {
    "section 3: [1, 3, 2, 3, -1]": [1.0, 3.0, 2.0, 3.0, -1.0],
    "probabilities 0.4 / 0.3 / 0.2 / 0.1": [math.log(0.4), math.log(0.3), math.log(0.2), math.log(0.1)],
    "ties: four equal, one far below": [5.0, 5.0, 5.0, 5.0, -100.0],
    "peaked": [8.0, 2.0, 1.0, 0.5, 0.0, -1.0, -2.0, -3.0],
    "flat with a long tail": [2.0, 1.9, 1.8, 1.7, 1.5, 1.2, 1.0, 0.5, 0.0, -0.5, -1.0, -2.0],
}
GIVEN = "given logits"   # offered once logits have been given (set_logits)
EDITABLE_MAX = 64        # longer vectors are not put in the text field
MAX_LOGITS = 1 << 20     # logits a playground takes (a real vocabulary is at most ~262k): more is refused unread
MAX_IDS = 100_000        # prompt or output ids a playground takes
MAX_DRAWS = 100_000      # skipping more uniforms would make every redraw slow

# One row per slider: the SamplingParams field it sets, its range and step, its label.
SLIDERS = [
    Control("temperature", widgets.FloatSlider, 0.0, 3.0, 0.05, "temperature (0 = greedy)"),
    Control("top_k", widgets.IntSlider, 0, 50, 1, "top-k (0 = off)"),
    Control("top_p", widgets.FloatSlider, 0.01, 1.0, 0.01, "top-p (1 = off)"),
    Control("min_p", widgets.FloatSlider, 0.0, 1.0, 0.01, "min-p (0 = off)"),
    Control("repetition_penalty", widgets.FloatSlider, 0.1, 3.0, 0.05, "repetition (1 = off)"),
    Control("presence_penalty", widgets.FloatSlider, -2.0, 2.0, 0.1, "presence (0 = off)"),
    Control("frequency_penalty", widgets.FloatSlider, -2.0, 2.0, 0.1, "frequency (0 = off)"),
]


class SamplerPlayground(CellWidget):
    """Controls: `preset` (Dropdown), `logits_text` (Text), `prompt_text`, `output_text` (ids), one
    slider per row of SLIDERS (`temperature`, `top_k`, `top_p`, `min_p`, `repetition_penalty`,
    `presence_penalty`, `frequency_penalty`), `seed` (Text: the exact integer typed) and `draw` (IntText:
    draws already taken from stream(seed, 4), at most MAX_DRAWS). Shown: `result` (HTML: the token line or a message) and
    `charts` (HTML: one SVG column per stage beside the id labels). After every change `trace` holds
    the SampleTrace behind the display (None after a refusal), `message` the refusal text ("" when
    fine), `shown_ids` the ids drawn and `chart_data` stage -> {"ids", "values", "kept"}.
    """

    def __init__(self, logits=None, labels=None, prompt=(), output=(), *, params: SamplingParams | None = None,
                 seed: int = 0, show_top: int = 20, yours=None):
        self.show_top = int(show_top)
        self.yours = yours  # the learner's sample module (SamplingParams, stream, sample), or None
        # what the charts show: tl_lab.sample, or beside the learner's the reference's own file (in a
        # kernel whose workspace is active, tl_lab.sample is the learner's)
        self.engine = _sample_module() if yours is None else _reference()
        self.yours_result: tuple | None = None  # (token, logprob) of the learner's sample, None if none or it raised
        self._quiet = True
        self.trace: SampleTrace | None = None
        self.message = ""
        self.shown_ids: list[int] = []
        self.chart_data: dict[str, dict] = {}
        self._logits: np.ndarray | None = None
        self._given: tuple | None = None  # (logits, labels) of the last set_logits, for the GIVEN preset
        self._withdrawn = ""  # why the given logits were withdrawn (`withdraw`), "" while they stand
        self.labels: list[str] | None = None
        self._build(params or SamplingParams(), seed)
        refused = ""  # a bad argument is said in the widget, never raised out of it (issue #61)
        for box, ids, name in ((self.prompt_text, prompt, "prompt"), (self.output_text, output, "output")):
            try:
                box.value = _ids_text(ids, name)
            except ValueError as exc:
                refused = refused or str(exc)
        self._quiet = False
        if logits is not None and not refused:
            try:
                self.set_logits(logits, labels)
            except (ValueError, TypeError) as exc:
                refused = str(exc)
        if logits is None or refused:
            self._on_preset({"new": self.preset.value})
        if refused:
            self.message = refused
            self.result.value = message(refused)

    def _build(self, p: SamplingParams, seed: int) -> None:
        """The controls (sliders from the SLIDERS table), the layout and the observers."""
        self.sliders = build_controls(SLIDERS, {c.name: getattr(p, c.name) for c in SLIDERS})
        for name, w in self.sliders.items():
            setattr(self, name, w)
        self.preset = widgets.Dropdown(options=list(PRESETS), description="logits preset", **field_style())
        self.logits_text = widgets.Text(description="logits", placeholder="numbers: 1, 3, 2, 3, -1", **field_style())
        self.prompt_text = widgets.Text(description="prompt ids", placeholder="e.g. 0, 2", **field_style())
        self.output_text = widgets.Text(description="output ids", placeholder="generated so far", **field_style())
        # a Text box, not IntText: the browser holds an IntText's value as a JavaScript number, which
        # rounds seeds above 2^53 (9007199254740993 would draw as ...992); the text reaches the kernel as typed
        self.seed = widgets.Text(value=str(seed), description="seed", **field_style("270px", "90px"))  # 20 digits
        self.draw = widgets.IntText(value=0, description="draws before", **field_style("200px", "90px"))
        self.result = widgets.HTML()
        self.compare = widgets.HTML()  # yours beside the reference's (empty without `yours`)
        self.charts = widgets.HTML()
        left = widgets.VBox([self.preset, self.logits_text, self.prompt_text, self.output_text,
                             widgets.HBox([self.seed, self.draw])])
        right = widgets.VBox(list(self.sliders.values()))
        super().__init__([widgets.HBox([left, right], layout=widgets.Layout(flex_flow="row wrap")),
                          self.result, self.compare, self.charts])
        self.add_class("tl-sampler")
        self.preset.observe(self._on_preset, names="value")
        for w in (self.logits_text, self.prompt_text, self.output_text, self.seed, self.draw,
                  *self.sliders.values()):
            w.observe(lambda _: self.update(), names="value")
        self._top_k_asked = self.top_k.value  # what the learner set, kept through a smaller vector's range
        self.top_k.observe(self._remember_top_k, names="value")

    # ------------------------------------------------------------ inputs

    def set_logits(self, logits, labels=None, prompt=None, output=None) -> None:
        """Show a new logits vector (e.g. a model's next-token row), with optional token strings."""
        size = getattr(logits, "size", None)
        if size is None:
            try:
                size = len(logits)
            except TypeError:
                size = None
        if isinstance(size, int) and size > MAX_LOGITS:  # before anything is allocated (was: 50 million took 13 GB)
            raise ValueError(f"{size:,} logits are more than this playground takes ({MAX_LOGITS:,}): give one row "
                             f"of a vocabulary")
        x = np.asarray(logits)
        if x.dtype.kind not in "iuf":  # checked before anything changes: a refusal leaves the widget as it was
            raise ValueError(f"logits must be real numbers, got an array of dtype {x.dtype}")
        if labels is not None and len(labels) != x.size:
            raise ValueError(f"labels has {len(labels)} entries for {x.size} logits")
        texts = [(box, _ids_text(ids, name)) for box, ids, name in ((self.prompt_text, prompt, "prompt"),
                                                                     (self.output_text, output, "output"))
                 if ids is not None]
        self._quiet = True
        try:
            self._logits = x
            self.labels = None if labels is None else [str(t) for t in labels]
            self._given, self._withdrawn = (x, self.labels), ""
            for box, text in texts:
                box.value = text
            if GIVEN not in self.preset.options:
                self.preset.options = list(PRESETS) + [GIVEN]
            self.preset.value = GIVEN
            editable = x.ndim == 1 and x.size <= EDITABLE_MAX
            self.logits_text.disabled = not editable
            self.logits_text.value = _numbers_text(x) if editable else f"({x.size} logits given; not editable here)"
            self._top_k_range(max(1, min(200, x.size if x.ndim == 1 else 1)))
        finally:
            self._quiet = False
        self.update()

    def withdraw(self, text: str) -> None:
        """The given logits no longer describe anything (e.g. the model playground's prompt was refused):
        drop them and the given prompt and output ids, and refuse with `text` while 'given logits' is
        chosen, until set_logits gives new ones. Nothing of the previous row stays on screen, and no
        slider moved afterwards can draw it again."""
        self._quiet = True
        try:
            self._logits, self.labels, self._given, self._withdrawn = None, None, None, text
            self.prompt_text.value = self.output_text.value = ""
            if self.preset.value == GIVEN:
                self.logits_text.disabled, self.logits_text.value = True, ""
        finally:
            self._quiet = False
        self.update()

    def _remember_top_k(self, change) -> None:
        if not self._quiet:  # the learner moved it (a range change below clamps it quietly)
            self._top_k_asked = change["new"]

    def _top_k_range(self, top: int) -> None:
        """The top-k slider's range for a vector: a smaller one clamps the value, a larger one gives back
        what the learner set (was: top-k 10, a 5-id vector, a 12-id preset again -> top-k 5)."""
        self.top_k.max = top
        self.top_k.value = min(self._top_k_asked, top)

    def _on_preset(self, change) -> None:
        name = change["new"]
        if self._quiet:
            return
        if name == GIVEN:
            if self._given is not None:
                self.set_logits(*self._given)
                return
            self._quiet = True  # withdrawn: nothing given to show
            try:
                self._logits, self.labels = None, None
                self.logits_text.disabled, self.logits_text.value = True, ""
            finally:
                self._quiet = False
            self.update()
            return
        self._quiet = True
        try:
            self._logits, self.labels = None, None
            self.logits_text.disabled = False
            self.logits_text.value = _numbers_text(PRESETS[name])
            self._top_k_range(50)
        finally:
            self._quiet = False
        self.update()

    def params(self) -> SamplingParams:
        """The SamplingParams the sliders describe."""
        return self.engine.SamplingParams(**{name: w.value for name, w in self.sliders.items()})

    def _read_logits(self):
        if self.preset.value == GIVEN and self._given is None:
            raise ValueError(self._withdrawn or "no logits given")
        if self._logits is not None and (self.logits_text.disabled or self._given_text_unchanged()):
            self.labels = self._given[1]
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
            if math.isfinite(values[-1]) and not fits_f32(values[-1]):  # else inf, a RuntimeWarning, "is inf"
                raise ValueError(f"could not read the logits: {tok!r} (number {j + 1}) is beyond float32's "
                                 f"largest, {np.finfo(np.float32).max:.8g} (typed logits are float32)")
        # the given token strings name the ids of a vector of their length; recomputed from the given ones
        # each time (cleared for good, a detour through a shorter vector lost them for the same text)
        given = self._given[1] if self._logits is not None else None
        self.labels = given if given is not None and len(values) == len(given) else None
        return np.array(values, np.float32)

    def _given_text_unchanged(self) -> bool:
        """The box still holds the text set_logits put there: sample the given vector itself (read back
        as float32, float64 logits such as [0.1, 0.2] would draw another logprob than sample() of them)."""
        return self.logits_text.value == _numbers_text(self._logits)

    def _rng(self):
        """stream(seed, 4) with `draw` uniforms already taken; refuses a count it would not honour."""
        n = self.draw.value
        if not 0 <= n <= MAX_DRAWS:
            raise ValueError(f"draws before must be in [0, {MAX_DRAWS:,}], got {n:,}")
        rng = self.engine.stream(read_seed(self.seed.value), PURPOSE_SAMPLE)
        for _ in range(n):
            rng.uniform_f64()
        return rng

    # ------------------------------------------------------------ the one computation

    def update(self) -> None:
        """Read every control, run `sample_trace` once and redraw. Refusals become a message."""
        if self._quiet:
            return
        try:
            logits = self._read_logits()
            prompt = _read_ids(self.prompt_text.value, "prompt")
            output = _read_ids(self.output_text.value, "output")
            params = self.params()
            self.trace = self.engine.sample_trace(logits, params, prompt, output, self._rng())
        except (ValueError, TypeError) as exc:
            self.show_refusal(str(exc))
            return
        self.message = ""
        self.shown_ids = self._pick_ids(self.trace)
        self.chart_data = stage_data(self.trace, self.shown_ids, params)
        self.result.value = self.token_line()
        self.compare.value = self._yours_line(logits, params, prompt, output)
        self.charts.value = render_charts(self.chart_data, self.trace, params, self.labels, self.shown_ids)

    def _yours_line(self, logits, params, prompt, output) -> str:
        """The learner's sample on the same inputs and the same draws: one line, same bits or not."""
        self.yours_result = None
        if self.yours is None:
            return ""
        mod = self.yours
        try:
            p = mod.SamplingParams(**{f.name: getattr(params, f.name) for f in fields(params)})
            rng = mod.stream(read_seed(self.seed.value), PURPOSE_SAMPLE)
            for _ in range(self.draw.value):
                rng.uniform_f64()
            got = mod.sample(logits, p, prompt, output, rng)
            self.yours_result = (int(got[0]), float(got[1]))
        except Exception as exc:  # noqa: BLE001: the learner's code; its error is what to show
            from tl_lab.lab.exercise.side import raised

            return message(raised(exc, mod, "sample"))
        tok, lp = self.yours_result
        same = tok == self.trace.token and lp.hex() == float(self.trace.logprob).hex()
        verdict = "the same bits as the reference" if same else (
            f"DIFFERENT from the reference's token {self.trace.token}, logprob {self.trace.logprob!r}")
        return (f"<p class='tl-yours' style='{MONO}'><b>yours: token {tok}</b> &middot; logprob {lp!r} "
                f"&middot; {verdict}</p>")

    def show_refusal(self, text: str) -> None:
        """No token: the message in words, no charts (nothing stale left on screen)."""
        self.trace, self.message, self.shown_ids, self.chart_data = None, text, [], {}
        self.result.value = message(text)
        self.compare.value, self.yours_result = "", None
        self.charts.value = ""

    def _pick_ids(self, tr: SampleTrace) -> list[int]:
        """All ids of a small vocabulary; else the show_top ids with the largest penalised logits and the
        token, in ascending id order (the order of the CDF walk)."""
        V = tr.penalised.size
        if V <= self.show_top:
            return list(range(V))
        top = np.lexsort((np.arange(V), -tr.penalised))[: self.show_top]
        return sorted(set(top.tolist()) | {tr.token})

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


def read_seed(text) -> int:
    """The seed box's text as the exact integer typed (any size: stream() then refuses one outside
    [0, 2**64) in the spec's words); ValueError in words for anything else."""
    raw = str(text).strip()
    digits = unsigned(raw)  # was: "+5" refused
    if not (digits.isascii() and digits.isdigit()) or len(digits) > 40:  # 2**64 has 20 digits
        raise ValueError(f"seed must be an integer in [0, 2**64), got {quoted(raw)}")
    return int(raw)


def _sample_module():
    import tl_lab.sample

    return tl_lab.sample


def _reference():
    from tl_lab.lab.exercise.side import reference

    return reference("sample")


def _ids_text(ids, name: str = "prompt") -> str:
    """Token ids as the text box shows them; ValueError (one line) for what is not a list of whole numbers
    (was: "abc" an int() error out of the widget, [1.7] taken as 1)."""
    if isinstance(ids, (str, bytes)) or not hasattr(ids, "__iter__"):
        raise ValueError(f"{name} must be a list of token ids, not {type(ids).__name__} {quoted(str(ids))}")
    if hasattr(ids, "__len__") and len(ids) > MAX_IDS:
        raise ValueError(f"{name} has {len(ids):,} ids, more than this playground takes ({MAX_IDS:,})")
    out = []
    for i in ids:
        if isinstance(i, (bool, np.bool_)) or not isinstance(i, (int, np.integer)) and not (
                isinstance(i, (float, np.floating)) and float(i).is_integer()):
            raise ValueError(f"{name} ids must be whole numbers: {quoted(str(i))} is not one")
        out.append(str(int(i)))
        if len(out) > MAX_IDS:
            raise ValueError(f"{name} has more than {MAX_IDS:,} ids, more than this playground takes")
    return ", ".join(out)


def _numbers_text(values) -> str:
    return ", ".join(repr(float(v)) if not float(v).is_integer() else str(int(v)) for v in values)


def _read_ids(text: str, name: str) -> list[int]:
    ids = []
    for tok in (t for t in re.split(r"[,\s;]+", text.strip("[]() ")) if t):
        try:
            ids.append(int(tok))
        except ValueError:
            if n := digits_past_int(tok):
                raise ValueError(f"{name} id {quoted(tok)} ({n:,} digits) is outside the vocabulary") from None
            raise ValueError(f"{name} ids must be whole numbers: {quoted(tok)} is not one") from None
    return ids


def show(logits=None, labels=None, **kw) -> SamplerPlayground:
    """Display a playground in the notebook and return it."""
    from IPython.display import display

    w = SamplerPlayground(logits, labels, **kw)
    display(w)
    return w
