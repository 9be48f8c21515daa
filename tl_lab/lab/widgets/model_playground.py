"""The sampler playground on a model: prompt -> runner -> next-token logits -> every stage -> append.

Chapter L10.1, section 2.6. The learner types a prompt, the runner computes the next-token logits
(`ModelRunner.run_once`), the SamplerPlayground below shows them (token strings, not ids) going
through every stage, and a button appends the sampled token and computes again.
`playground_model_dir()` picks SmolLM2 when it has been fetched, else the bundled tiny Llama.

A loaded model is kept (`loaded_model`) and handed to the next playground asked for the same directory
and EngineConfig: re-running a notebook cell must not load SmolLM2 (540 MB of f32 weights) again while
ipywidgets still holds the previous playground (widgets live until closed).
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from pathlib import Path

import ipywidgets as widgets
import numpy as np

from tl_lab.errors import TlError
from tl_lab.sample import SamplingParams
from tl_lab.lab.widgets.common import CellWidget, MONO, NOTE, message
from tl_lab.lab.widgets.sampler_playground import GIVEN, SamplerPlayground

PROMPT_CHAT = "What is the capital of France?"
PROMPT_PLAIN = "Hello, world"


def playground_model_dir() -> tuple[Path, str]:
    """(model directory, note): SmolLM2 when it has been fetched, else the bundled data/tiny-llama, with
    a note saying how to fetch SmolLM2 ("" when SmolLM2 is there)."""
    from tl_lab.engine.fetch import FETCH_HINT, smollm2_dir
    from tl_lab.ops.paths import DATA_DIR

    path = smollm2_dir(quiet=True)
    if path is not None:
        return path, ""
    return DATA_DIR / "tiny-llama", (
        "SmolLM2 has not been fetched, so this is data/tiny-llama: random weights over 256 byte tokens, "
        f"its distributions are noise. For a real model, {FETCH_HINT} (in a notebook: "
        "!python -m tl_lab fetch smollm2, about 10 s), then create the playground again.")


@dataclass
class LoadedModel:
    """A runner with its tokenizer and the token string of every id (49,152 strings for SmolLM2)."""

    key: tuple
    runner: object
    tokenizer: object
    labels: list[str]


_LOADED: dict[tuple, LoadedModel] = {}   # at most one entry: the model loaded last


def loaded_model(model_dir, cfg=None) -> LoadedModel:
    """The model at `model_dir` with `cfg`, loaded once: the same directory and config again returns
    the same runner. Loading another one drops the previous from this cache (one model at a time)."""
    from tl_lab.runner import ModelRunner
    from tl_lab.ops.tuning import set_blas_threads
    from tl_lab.engine.tokenizer import load_tokenizer

    key = (str(Path(model_dir).resolve()), cfg)
    hit = _LOADED.get(key)
    if hit is not None:
        if cfg is not None and cfg.threads is not None:
            set_blas_threads(cfg.threads)  # what loading would have done
        return hit
    _LOADED.clear()  # before loading: never two big models in memory because of this cache
    runner = ModelRunner.load(model_dir, cfg)
    tokenizer = load_tokenizer(Path(model_dir), runner.config)
    labels = [tokenizer.token_str(i) for i in range(runner.config.vocab_size)]
    _LOADED[key] = LoadedModel(key, runner, tokenizer, labels)
    return _LOADED[key]


class ModelPlayground(CellWidget):
    """A model's real next-token distribution in the sampler playground (chapter L10.1, section 2.6).

    Controls: `prompt` (Textarea), `chat` (Checkbox: render the prompt as a user turn with the model's
    chat template; disabled when the model has none), `sample_button` (samples the token the playground
    shows and appends it), `reset_button` (drops the appended tokens); and every control of `sampler`,
    the SamplerPlayground that draws the stages (temperature, top-k, ..., `seed`, `draw`).
    Shown: `info` (the model; how to fetch SmolLM2 when it is missing), `context_html` (the tokens of
    the prompt and, highlighted, the appended ones), `status` (what the last action did, or a message).

    model_dir None: `playground_model_dir()`, loaded through `loaded_model` (shared by playgrounds of
    the same directory and cfg). cfg: the EngineConfig to load it with (e.g. threads=1);
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
        note = ""
        if model_dir is None and runner is None:
            model_dir, note = playground_model_dir()
        self.model_dir = None if model_dir is None else Path(model_dir)
        self._attach(runner, tokenizer, cfg)
        has_template = bool(getattr(self.tokenizer, "chat_template", None))
        self.prompt_ids: list[int] = []
        self.output_ids: list[int] = []
        self.output_logprobs: list[float] = []
        self.logits: np.ndarray | None = None
        self.message = ""
        self._busy = True
        self.sampler = SamplerPlayground(params=params, seed=seed, show_top=show_top)
        default = PROMPT_CHAT if has_template else PROMPT_PLAIN
        refused = ""
        if prompt is not None and not isinstance(prompt, str):  # said in the widget, never a TraitError (issue #61)
            refused = f"prompt must be text (a str), not {type(prompt).__name__} {str(prompt)[:40]!r}: the default is shown"
            prompt = None
        self.prompt = widgets.Textarea(value=default if prompt is None else prompt, description="prompt",
                                       continuous_update=False, layout=widgets.Layout(width="640px", height="64px"),
                                       style={"description_width": "60px"})
        self.chat = widgets.Checkbox(value=has_template if chat is None else bool(chat), disabled=not has_template,
                                     description="chat template (the prompt as a user turn)", indent=False,
                                     layout=widgets.Layout(width="auto"))
        self.sample_button = widgets.Button(description="sample and append", button_style="primary",
                                            layout=widgets.Layout(width="auto"),
                                            tooltip="append the token shown in red below and compute the next row")
        self.reset_button = widgets.Button(description="clear appended tokens", layout=widgets.Layout(width="auto"))
        self.info = widgets.HTML(self._info_html(note))
        self.context_html = widgets.HTML()
        self.status = widgets.HTML()
        super().__init__([self.info, self.prompt, widgets.HBox([self.chat, self.sample_button, self.reset_button]),
                          self.status, self.context_html, self.sampler])
        self.add_class("tl-model-playground")
        self.prompt.observe(lambda _: self.restart("new prompt"), names="value")
        self.chat.observe(lambda _: self.restart("chat template " + ("on" if self.chat.value else "off")),
                          names="value")
        self.sample_button.on_click(lambda _: self.sample_and_append())
        self.reset_button.on_click(lambda _: self.restart("cleared the appended tokens"))
        self._busy = False
        self.restart()
        if refused:
            self.message = refused
            self.status.value = message(refused) + self.status.value

    def _attach(self, runner, tokenizer, cfg) -> None:
        """The runner, tokenizer and labels: given, or from the shared `loaded_model`."""
        if runner is None:
            m = loaded_model(self.model_dir, cfg)
            runner, tokenizer, self.labels = m.runner, tokenizer or m.tokenizer, m.labels
        else:
            if tokenizer is None:
                if self.model_dir is None:
                    raise ValueError("ModelPlayground(runner=...) needs tokenizer=... or model_dir=...")
                from tl_lab.engine.tokenizer import load_tokenizer

                tokenizer = load_tokenizer(self.model_dir, runner.config)
            self.labels = [tokenizer.token_str(i) for i in range(runner.config.vocab_size)]
        self.runner, self.tokenizer = runner, tokenizer
        c = runner.config
        self.max_context = min(c.max_position_embeddings, runner.pool.n_blocks * runner.block_tokens)

    def close(self) -> None:
        """Close the widget and its children and let go of the model (ipywidgets keeps a widget alive
        until it is closed)."""
        parts = ("sampler", "prompt", "chat", "sample_button", "reset_button", "info", "context_html", "status")
        for w in (*(getattr(self, name, None) for name in parts), *self.children):  # a refused __init__ made none
            if w is not None:
                w.close()
        self.runner = self.tokenizer = self.logits = None
        super().close()

    # ------------------------------------------------------------ actions

    def restart(self, why: str = "") -> None:
        """Encode the prompt again, drop the appended tokens, draw 0, and compute the next-token row.
        The status line says why (a line about an earlier press would describe another request)."""
        if self._busy:
            return
        self.output_ids, self.output_logprobs = [], []
        self._set_draw(0)
        self.recompute()
        if not self.message:
            self._say(f"{why + ': ' if why else ''}a new request of {len(self.prompt_ids)} prompt tokens, "
                      "nothing appended, draws before 0")

    def sample_and_append(self) -> int | None:
        """Append the token the sampler shows, advance the draws, compute again. -> the id (None: refused)."""
        refusal = self._why_not_sample()
        if refusal:
            self._say(refusal, error=True)
            return None
        tr = self.sampler.trace
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
                  f"{how}){eos}", escape=False)
        return token

    def _why_not_sample(self) -> str:
        """The reason a press cannot append now, or ""."""
        if self.logits is None:
            return f"Nothing to sample: {self.message}"
        if self.sampler.preset.value != GIVEN or self.sampler._logits is not self.logits:
            return ("The sampler shows a preset, not the model's row: set 'logits preset' back to "
                    f"'{GIVEN}' to sample from the model.")
        if self.sampler.trace is None:
            return f"Nothing to sample: {self.sampler.message or 'the sampler has no token'}"
        if len(self.prompt_ids) + len(self.output_ids) + 1 > self.max_context:
            return (f"The context is full ({self.max_context} tokens): clear the appended tokens or "
                    "shorten the prompt.")
        return ""

    def recompute(self) -> None:
        """Run the model on prompt + appended tokens and hand the last row to the sampler. Refusals
        (an empty prompt, no chat template, a context too long) become a message, and then nothing of
        the previous request stays on screen: `prompt_ids` is [] unless this prompt was encoded, the
        context is blank, and the sampler has withdrawn the previous row and its ids (`withdraw`)."""
        try:
            self.prompt_ids = []  # stays empty when the prompt is refused: the previous one's ids describe nothing
            self.prompt_ids = self._encode()
            context = self.prompt_ids + self.output_ids
            self._fits(len(context))
            _, logits = self.runner.run_once(context)
        except (ValueError, TlError) as exc:
            # nothing shown may describe the previous request: no prompt ids (none encoded), no context,
            # and the sampler lets go of the previous row and its ids (a slider moved later redrew it)
            self.logits, self.message = None, str(exc)
            self._say(str(exc), error=True)
            self.context_html.value = ""
            self.sampler.withdraw("no logits: " + str(exc))
            return
        self.logits, self.message = logits, ""
        self.context_html.value = self._context_html()
        self.sampler.set_logits(logits, self.labels, prompt=self.prompt_ids, output=self.output_ids)

    # ------------------------------------------------------------ helpers

    def _encode(self) -> list[int]:
        text = self.prompt.value
        if not text.strip():
            raise ValueError("type a prompt first")
        if self.chat.value:
            text = self.tokenizer.apply_chat_template([{"role": "user", "content": text}])
        # before encode spends seconds on a pasted book, when its bytes alone say it cannot fit
        self._fits(self.tokenizer.fewest_tokens(text) + len(self.output_ids), "at least ")
        ids = self.tokenizer.encode(text)
        if not ids:
            raise ValueError("the prompt encodes to no tokens")
        return ids

    def _fits(self, n: int, bound: str = "") -> None:
        """ValueError if a context of n tokens (`bound` "at least ": n is a lower bound) is over max_context."""
        if n > self.max_context:
            raise ValueError(f"the context is {bound}{n} tokens, more than this model and pool take "
                             f"({self.max_context}); shorten the prompt")

    def _set_draw(self, n: int) -> None:
        self.sampler._quiet = True  # the row is recomputed next; no need to redraw the old one
        try:
            self.sampler.draw.value = int(n)
        finally:
            self.sampler._quiet = False

    def _say(self, text: str, error: bool = False, escape: bool = True) -> None:
        if error:
            self.status.value = message(text)
            return
        body = html.escape(text) if escape else text
        self.status.value = f"<p class='tl-status' style='{MONO}; color:{NOTE}'>{body}</p>"

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
