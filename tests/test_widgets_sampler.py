"""Tests for the sampler widgets (tl_lab/lab/widgets/sampler_playground.py, model_playground.py,
sampler_charts.py; imported through tl_lab/lab/widgets/sampler.py): set the controls, check what is shown."""

import html as html_module
import math
import re

import numpy as np
import pytest

from conftest import joined_text as plain, smollm2_path
from tl_lab.engine.generate import Engine, Request
from tl_lab.ops.paths import DATA_DIR
from tl_lab.runner import ModelRunner
from tl_lab.sample import SamplingParams, sample, sample_trace, stream
from tl_lab.engine.tokenizer import load_tokenizer
from tl_lab.lab.widgets.sampler import (
    GIVEN, MAX_DRAWS, PRESETS, SLIDERS, STAGES, ModelPlayground, SamplerPlayground, loaded_model, playground_model_dir,
)


def test_hand_example_reproduces_token_3():
    w = SamplerPlayground()  # the section-3 preset, seed 0
    assert w.logits_text.value == "1, 3, 2, 3, -1"
    w.top_k.value = 3
    w.top_p.value = 0.8
    w.seed.value = "0"
    line = plain(w.result.value)
    assert "token 3" in line and "logprob -0.92487" in line and "u = 0.80209" in line
    assert "kept 2 of 5: {1, 3}" in line
    assert w.trace.kept.tolist() == [1, 3] and w.trace.token == 3
    assert w.chart_data["after top-k"]["kept"] == [False, True, True, True, False]
    assert w.chart_data["after top-p"]["values"] == [0.0, 0.5, 0.0, 0.5, 0.0]
    assert w.chart_data["CDF walk"]["values"] == [0.0, 0.5, 0.0, 1.0, 0.0]
    assert w.chart_data["logprobs"]["values"][3] == w.trace.logprob
    assert set(w.chart_data) == set(STAGES)
    charts = w.charts.value
    assert charts.count("class='tl-chart'") == len(STAGES) and "u = 0.8021" in charts


def test_sliders_change_the_result():
    w = SamplerPlayground()
    w.temperature.value = 0.0
    assert "token 1" in plain(w.result.value) and "greedy: argmax, no draw" in plain(w.result.value)
    assert "after top-k" not in w.chart_data and "greedy" in plain(w.charts.value)
    w.temperature.value = 1.0
    w.top_k.value = 1
    assert w.trace.kept.tolist() == [1]
    w.top_k.value = 0
    w.min_p.value = 0.5  # weights e^-2, 1, e^-1, 1, e^-4: only ids 1 and 3 reach 0.5
    assert w.trace.kept.tolist() == [1, 3]
    assert w.chart_data["min-p: weight w = exp(q - max q)"]["kept"] == [False, True, False, True, False]
    w.min_p.value = 0.0
    w.draw.value = 1  # the second uniform of stream(0, 4)
    rng = stream(0, 4)
    rng.uniform_f64()
    assert w.trace.u == rng.uniform_f64()


def test_history_and_penalties_are_shown():
    w = SamplerPlayground()
    w.temperature.value = 0.0
    w.prompt_text.value = "1, 3"
    w.repetition_penalty.value = 2.0
    assert w.chart_data["penalised logits"]["values"] == [1.0, 1.5, 2.0, 1.5, -1.0]
    assert "token 2" in plain(w.result.value)
    w.output_text.value = "2"
    w.presence_penalty.value = 1.0  # id 2 (in the output): 2 / 2 - 1 = 0
    assert w.chart_data["penalised logits"]["values"] == [1.0, 1.5, 0.0, 1.5, -1.0]
    assert w.trace.token == 1


def test_the_widget_shows_what_sample_returns():
    g = np.random.default_rng(0)
    w = SamplerPlayground()
    for _ in range(15):
        x = np.round(g.standard_normal(int(g.integers(2, 12))) * 3, 2)
        w.preset.value = next(iter(PRESETS))
        w.logits_text.value = ", ".join(map(str, x))
        w.temperature.value, w.top_k.value = float(round(g.uniform(0.1, 2.5), 2)), int(g.integers(0, 5))
        w.top_p.value, w.min_p.value = float(round(g.uniform(0.3, 1), 2)), float(round(g.uniform(0, 0.4), 2))
        w.seed.value = str(g.integers(0, 1000))
        params = w.params()
        want = sample(x.astype(np.float32), params, [], [], stream(int(w.seed.value), 4))
        assert (w.trace.token, w.trace.logprob) == want
        assert f"token {want[0]}" in plain(w.result.value)


def test_presets_switch_the_vector():
    w = SamplerPlayground()
    w.preset.value = "probabilities 0.4 / 0.3 / 0.2 / 0.1"
    assert w.trace.penalised.size == 4
    assert w.chart_data["final probabilities"]["values"] == pytest.approx([0.4, 0.3, 0.2, 0.1], abs=1e-6)
    w.preset.value = "ties: four equal, one far below"
    w.top_p.value = 0.5
    assert w.trace.top_p.tolist() == [0, 1]  # the crossing id is kept


def test_a_big_vocabulary_with_labels_shows_the_top_20():
    g = np.random.default_rng(1)
    x = (g.standard_normal(49152) * 2).astype(np.float32)
    labels = [f" tok{i}" for i in range(49152)]
    w = SamplerPlayground(x, labels=labels)
    assert w.logits_text.disabled and "49152 logits given" in w.logits_text.value
    assert w.preset.value == "given logits"
    top20 = np.argsort(-x.astype(np.float64), kind="stable")[:20].tolist()
    assert set(top20) <= set(w.shown_ids) and w.trace.token in w.shown_ids and len(w.shown_ids) <= 21
    assert w.shown_ids == sorted(w.shown_ids)
    assert f"token {w.trace.token} {labels[w.trace.token]!r}" in plain(w.result.value)
    assert "Showing" in plain(w.charts.value) and "of 49152 ids" in plain(w.charts.value)
    assert (w.trace.token, w.trace.logprob) == sample(x, SamplingParams(), [], [], stream(0, 4))
    w.top_k.value = 5
    assert w.trace.kept.size <= 5
    w.preset.value = "peaked"  # a preset, then back to the given vector
    assert w.trace.penalised.size == 8 and not w.logits_text.disabled
    w.preset.value = "given logits"
    assert w.trace.penalised.size == 49152 and w.labels[3] == " tok3"
    w.set_logits(np.array([0.5, 1.5], np.float32), labels=["a", "b"], prompt=[1], output=[0])
    assert w.logits_text.value == "0.5, 1.5" and w.prompt_text.value == "1" and not w.logits_text.disabled
    with pytest.raises(ValueError, match="labels has 1 entries for 2 logits"):
        w.set_logits([0.0, 1.0], labels=["x"])


def test_bad_input_shows_a_message_not_a_traceback():
    w = SamplerPlayground()
    for field, text, msg in [
        ("logits_text", "1, abc, 2", "'abc' (number 2) is not a number"),
        ("logits_text", "1, 2, 3X", "'3X' (number 3) is not a number"),  # only brackets are taken off the ends
        ("logits_text", "1, nan, 2", "logit of id 1 is nan: logits must be finite"),
        ("logits_text", "1, inf", "logit of id 1 is inf"),
        ("logits_text", "", "type some logits"),
        ("prompt_text", "7", "prompt[0] = 7 is outside the vocabulary [0, 5)"),
        ("output_text", "x", "output ids must be whole numbers: 'x'"),
        ("seed", "-1", "seed must be an integer in [0, 2**64), got -1"),
        ("seed", "2.5", "seed must be an integer in [0, 2**64), got '2.5'"),
        ("seed", "18446744073709551616", "seed must be an integer in [0, 2**64), got 18446744073709551616"),
        ("seed", "9" * 5000, "seed must be an integer in [0, 2**64), got '999"),
        ("draw", -2, "draws before must be in [0, 100,000], got -2"),
        ("draw", 10**9, "draws before must be in [0, 100,000], got 1,000,000,000"),
    ]:
        w2 = SamplerPlayground()
        setattr(getattr(w2, field), "value", text)
        assert msg in plain(w2.result.value), (field, text, plain(w2.result.value))
        assert w2.trace is None and w2.charts.value == "" and w2.message
    w.logits_text.value = "1, abc"
    assert w.trace is None
    w.logits_text.value = "[2, 1]"  # recovers
    assert w.trace is not None and w.message == "" and "token" in plain(w.result.value)


def test_a_seed_above_2_53_draws_bit_for_bit():
    """The seed box holds text: 9007199254740993 (2^53 + 1) draws with exactly that seed, not with the
    ...992 a JavaScript number would round it to (issue 19); its neighbours give other uniforms."""
    w = SamplerPlayground()
    # the browser holds the box's value as its model's type: a string stays exact, a number (an IntText's
    # value) is a JavaScript double, which has no 2^53 + 1 (setting it from Python, below, cannot see that)
    assert isinstance(w.seed.value, str), type(w.seed)
    us = {}
    for seed in (2**53, 2**53 + 1, 2**64 - 1):
        w.seed.value = f" {seed} "
        us[seed] = w.trace.u
        assert w.trace.u == stream(seed, 4).uniform_f64() and w.message == ""
    assert len(set(us.values())) == 3


def test_greedy_trace_matches_the_library():
    x = [0.0, 2.0, 2.0]
    w = SamplerPlayground()
    w.logits_text.value = "0, 2, 2"
    w.temperature.value = 0.0
    tr = sample_trace(x, SamplingParams(temperature=0.0), [], [], None)
    Z = math.exp(0.0 - 2.0) + 1.0 + 1.0  # in id order, left to right
    assert (w.trace.token, w.trace.logprob) == (tr.token, tr.logprob) == (1, (2.0 - 2.0) - math.log(Z))


# ------------------------------------------------------------------ the playground on a model

TINY = DATA_DIR / "tiny-llama"


@pytest.fixture(scope="module")
def tiny_runner():
    return ModelRunner.load(TINY)


def tiny_playground(tiny_runner, prompt="Hello", **kw) -> ModelPlayground:
    return ModelPlayground(TINY, prompt, runner=tiny_runner, **kw)


def skipped(seed: int, n: int):
    rng = stream(seed, 4)
    for _ in range(n):
        rng.uniform_f64()
    return rng


def test_model_playground_shows_the_models_row_with_token_strings(tiny_runner):
    w = tiny_playground(tiny_runner, "Hello")
    assert w.prompt_ids == list(b"Hello") and w.chat.disabled and not w.chat.value
    _, want = tiny_runner.run_once(list(b"Hello"))
    assert np.array_equal(w.logits, want)
    assert w.sampler.trace.penalised.tolist() == want.astype(np.float64).tolist()
    assert w.sampler.labels[72] == "H" and w.sampler.labels[10] == "\\x0a" and len(w.sampler.labels) == 256
    assert w.sampler.prompt_text.value == "72, 101, 108, 108, 111" and w.sampler.output_text.value == ""
    assert f"token {w.sampler.trace.token} {w.labels[w.sampler.trace.token]!r}" in plain(w.sampler.result.value)
    assert "tiny-llama" in plain(w.info.value) and "5 prompt tokens + 0 appended" in plain(w.context_html.value)
    w.prompt.value = "Hi"
    assert w.prompt_ids == [72, 105] and np.array_equal(w.logits, tiny_runner.run_once([72, 105])[1])


def test_model_playground_button_samples_appends_and_recomputes(tiny_runner):
    w = tiny_playground(tiny_runner, "Hello", seed=5)
    w.sampler.temperature.value, w.sampler.top_k.value = 0.9, 20
    before = w.logits.copy()
    charts_before, data_before = w.sampler.charts.value, w.sampler.chart_data
    params = w.sampler.params()
    want = sample(before, params, list(b"Hello"), [], stream(5, 4))
    shown = w.sampler.trace.token
    w.sample_button.click()
    assert w.output_ids == [want[0]] == [shown] and w.output_logprobs == [want[1]]
    assert w.sampler.draw.value == 1  # one uniform taken
    assert "appended" in plain(w.status.value) and f"id {want[0]}" in plain(w.status.value)
    # the row is the model's after prompt + token, and the charts follow it
    context = list(b"Hello") + [want[0]]
    assert np.array_equal(w.logits, tiny_runner.run_once(context)[1]) and not np.array_equal(w.logits, before)
    assert w.sampler.output_text.value == str(want[0]) and w.sampler.prompt_text.value == "72, 101, 108, 108, 111"
    assert w.sampler.charts.value != charts_before
    assert w.sampler.chart_data["penalised logits"] != data_before["penalised logits"]
    assert "class='tl-out'" in w.context_html.value and "5 prompt tokens + 1 appended" in plain(w.context_html.value)
    # the second token: uniform 1 of the stream, the first token now in the output history
    want2 = sample(w.logits, params, list(b"Hello"), [want[0]], skipped(5, 1))
    w.sample_button.click()
    assert w.output_ids == [want[0], want2[0]] and w.sampler.draw.value == 2
    # greedy takes no draw
    w.sampler.temperature.value = 0.0
    g = int(np.argmax(w.logits))
    w.sample_button.click()
    assert w.output_ids[-1] == g and w.sampler.draw.value == 2 and "greedy, no draw" in plain(w.status.value)
    # clearing, or editing the prompt, starts a new request
    w.reset_button.click()
    assert w.output_ids == [] and w.sampler.draw.value == 0 and np.array_equal(w.logits, before)


def test_model_playground_presses_equal_the_engine_loop(tiny_runner):
    """Eight presses give the tokens Engine.generate gives for the same request and seed. The logprobs
    agree within float tolerance: the playground recomputes the whole context each time (run_once),
    the engine decodes one token per step on its KV cache (chunk invariance, section 2.4)."""
    w = tiny_playground(tiny_runner, "Once upon", seed=11)
    w.sampler.temperature.value, w.sampler.top_p.value, w.sampler.frequency_penalty.value = 0.8, 0.95, 0.5
    for _ in range(8):
        w.sample_button.click()
    engine = Engine(tiny_runner, load_tokenizer(TINY))
    (res,) = engine.generate([Request(list(b"Once upon"), w.sampler.params(), 11, 8, stop_ids=[])])
    assert w.output_ids == res.output_ids
    assert w.output_logprobs == pytest.approx(res.logprobs, rel=1e-5, abs=1e-5)
    assert w.sampler.draw.value == 8


def test_model_playground_bad_input_gives_a_message(tiny_runner):
    w = tiny_playground(tiny_runner, "Hello")
    w.prompt.value = "   "
    assert "type a prompt first" in plain(w.status.value) and w.logits is None and w.sampler.trace is None
    assert w.context_html.value == ""  # no context drawn for a prompt refused
    w.sample_button.click()
    assert "Nothing to sample: type a prompt first" in plain(w.status.value) and w.output_ids == []
    w.prompt.value = "x" * 600
    assert "the context is at least 600 tokens, more than this model and pool take (512)" in plain(w.status.value)
    w.prompt.value = "ok"
    assert w.message == "" and w.logits is not None and "tl-message" not in w.status.value
    w.chat.value = True  # disabled in the UI; set from Python anyway
    assert "no chat template" in plain(w.status.value) and w.logits is None
    w.chat.value = False
    w.sampler.seed.value = "-1"  # the sampler refuses: nothing to append
    w.sample_button.click()
    assert "Nothing to sample: seed must be an integer" in plain(w.status.value) and w.output_ids == []
    w.sampler.seed.value = "0"
    w.sampler.preset.value = "peaked"  # the sampler now shows a preset, not the model
    w.sample_button.click()
    assert "shows a preset" in plain(w.status.value) and w.output_ids == []
    w.sampler.preset.value = "given logits"
    w.sample_button.click()
    assert len(w.output_ids) == 1


def test_model_playground_refusal_leaves_nothing_of_the_previous_request(tiny_runner):
    """Was: after the prompt box was cleared ("type a prompt first") the sampler's prompt ids and output
    ids boxes still showed the previous request's ids beside draws before 0, `prompt_ids` kept them, and
    a slider moved afterwards drew the previous row's charts and token again. Every refusal of the
    prompt (empty, too long for the pool, no chat template) now withdraws the row and its ids."""
    w = tiny_playground(tiny_runner, "Hello")
    s = w.sampler
    refusals = [("prompt", "   ", "type a prompt first"),
                ("prompt", "x" * 600, "the context is at least 600 tokens"),
                ("chat", True, "no chat template")]
    for box, value, says in refusals:
        w.prompt.value, w.chat.value = "Hello", False
        w.sample_button.click()
        w.sample_button.click()
        assert s.prompt_text.value == "72, 101, 108, 108, 111" and len(s.output_text.value.split(",")) == 2
        setattr(getattr(w, box), "value", value)
        assert says in plain(w.status.value) and w.logits is None and s.trace is None, box
        assert w.prompt_ids == []  # none encoded
        assert (s.prompt_text.value, s.output_text.value, s.logits_text.value) == ("", "", ""), says
        assert s.draw.value == 0 and w.output_ids == [] and w.context_html.value == "" and s.charts.value == ""
        # any order of clicks afterwards: nothing draws the previous row again
        s.temperature.value = 0.5
        s.draw.value = 3
        assert s.trace is None and s.charts.value == "" and says in plain(s.result.value)
        s.preset.value = "peaked"
        assert s.trace is not None  # a preset is its own vector
        s.preset.value = GIVEN
        assert s.trace is None and s.charts.value == "" and says in plain(s.result.value) and s.logits_text.disabled
        w.sample_button.click()
        assert "Nothing to sample" in plain(w.status.value) and w.output_ids == []
        s.temperature.value, s.draw.value = 1.0, 0
    w.chat.value, w.prompt.value = False, "Hi"  # a prompt it takes brings the row back
    assert w.prompt_ids == [72, 105] and s.prompt_text.value == "72, 105" and s.trace is not None
    assert np.array_equal(s._logits, tiny_runner.run_once([72, 105])[1]) and s.charts.value != ""


def test_model_playground_bad_draws_value_keeps_the_current_request(tiny_runner):
    """A refused draws value is the sampler's: the prompt, its ids and the context are still the current
    request's and stay; no token or chart is shown, and a press is refused."""
    w = tiny_playground(tiny_runner, "Hello")
    w.sample_button.click()
    out = w.sampler.output_text.value
    w.sampler.draw.value = -1
    assert "draws before must be in [0, 100,000], got -1" in plain(w.sampler.result.value)
    assert w.sampler.trace is None and w.sampler.charts.value == ""
    assert w.sampler.prompt_text.value == "72, 101, 108, 108, 111" and w.sampler.output_text.value == out
    assert "5 prompt tokens + 1 appended" in plain(w.context_html.value)
    w.sample_button.click()
    assert "Nothing to sample: draws before must be" in plain(w.status.value) and len(w.output_ids) == 1


def test_model_playground_full_context_is_refused(tiny_runner):
    w = tiny_playground(tiny_runner, "y" * 512)
    assert w.logits is not None  # exactly the context
    w.sample_button.click()
    assert "The context is full (512 tokens)" in plain(w.status.value) and w.output_ids == []


def test_model_playground_refuses_a_prompt_its_bytes_prove_too_long_before_encoding_it(tiny_runner, monkeypatch):
    """Was: a pasted text of megabytes was encoded (seconds, gigabytes with a BPE) before its count was refused."""
    w = tiny_playground(tiny_runner, "Hello")
    monkeypatch.setattr(w.tokenizer, "encode", lambda text: pytest.fail(f"encoded {len(text)} characters"))
    w.prompt.value = "x" * 10_000_000
    assert "the context is at least 10000000 tokens" in plain(w.status.value) and w.logits is None


def test_model_playground_on_the_bigram():
    w = ModelPlayground(DATA_DIR / "bigram", "ab")
    assert "bigram: bigram, 0 layers, vocabulary 256." in plain(w.info.value) and w.logits.shape == (256,)
    w.sampler.temperature.value = 0.0
    w.sample_button.click()
    assert w.output_ids == [int(np.argmax(ModelRunner.load(DATA_DIR / "bigram").run_once(b"ab")[1]))]


def test_playground_model_dir_falls_back_to_the_tiny_llama(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TL_LAB_CACHE", str(tmp_path))  # an empty cache: no SmolLM2
    path, note = playground_model_dir()
    assert path == TINY and "python -m tl_lab fetch smollm2" in note
    w = ModelPlayground()
    assert w.model_dir == TINY and "python -m tl_lab fetch smollm2" in plain(w.info.value)
    assert w.prompt_ids == list(b"Hello, world")
    assert capsys.readouterr().out == ""  # the widget says it once, in its info, not again in the cell's output


@pytest.mark.smollm2
def test_model_playground_on_smollm2():
    path = smollm2_path()
    assert playground_model_dir() == (path, "")
    first = ModelPlayground()  # a model with a chat template starts with the prompt as a user turn
    assert first.chat.value and not first.chat.disabled and first.prompt.value == "What is the capital of France?"
    assert first.prompt_ids[0] == 1  # <|im_start|>
    w = ModelPlayground(path, "The capital of France is", chat=False)
    assert "SmolLM2" in plain(w.info.value) and "fetch" not in plain(w.info.value)
    w.sampler.temperature.value = 0.0
    assert "token 7042 ' Paris'" in plain(w.sampler.result.value)
    assert " Paris" in [w.labels[i] for i in w.sampler.shown_ids] and len(w.sampler.labels) == 49152
    w.sample_button.click()
    assert w.output_ids == [7042] and w.tokenizer.decode(w.prompt_ids + w.output_ids).endswith("France is Paris")
    w.chat.value = True  # a user turn in the chat template: a new request
    chat = w.tokenizer.apply_chat_template([{"role": "user", "content": "The capital of France is"}])
    assert w.output_ids == [] and w.prompt_ids == w.tokenizer.encode(chat) and w.prompt_ids[0] == 1  # <|im_start|>
    assert "<|im_start|>" in plain(w.context_html.value)


# ------------------------------------------------------------------ issue 11: widgets that stay true


def test_given_logits_is_offered_only_once_logits_are_given():
    w = SamplerPlayground()
    assert GIVEN not in w.preset.options  # nothing given: picking it would keep the previous preset's bars
    w.set_logits([0.0, 1.0], labels=["a", "b"])
    assert w.preset.options[-1] == GIVEN and w.preset.value == GIVEN
    w.preset.value = "peaked"
    w.preset.value = GIVEN
    assert w.trace.penalised.tolist() == [0.0, 1.0] and w.labels == ["a", "b"]


def test_draws_before_out_of_range_is_refused_not_capped():
    w = SamplerPlayground()
    w.draw.value = MAX_DRAWS  # the largest count honoured
    assert w.trace is not None
    w.draw.value = MAX_DRAWS + 1
    assert w.trace is None and f"got {MAX_DRAWS + 1:,}" in plain(w.result.value) and w.charts.value == ""


def test_stages_are_columns_with_one_row_per_shown_id():
    """Every stage is drawn beside the id labels with the same rows, so an id reads across (item 6),
    and the top-p walk names tokens as the rows do, not raw ids."""
    labels = ["a", ",", ".", " Paris", "\n"]
    w = SamplerPlayground([1.0, 3.0, 2.0, 3.0, -1.0], labels=labels)
    w.top_p.value = 0.8
    charts = w.charts.value
    heights = set(re.findall(r"<svg class='tl-chart' data-stage='[^']*' width='\d+' height='(\d+)'", charts))
    assert len(heights) == 1 and charts.count("class='tl-chart'") == len(STAGES)
    rows = re.search(r"<svg class='tl-labels'.*?</svg>", charts).group(0)
    assert [plain(t) for t in re.findall(r"<text[^>]*>[^<]*</text>", rows)][1:] == [
        "0 'a'", "1 ','", "2 '.'", "3 '␣Paris'", "4 '\\n'"]
    assert "walk (q desc): 1 ',': 0.3966, 3 '␣Paris': 0.7932, 2 '.': 0.9391" in plain(charts)


def test_slider_labels_fit_their_label_column():
    """'temperature (0 = g...' hid what 0 means (item 7): every label fits its column at 7.5 px a character (13 px text)."""
    w = SamplerPlayground()
    for c in SLIDERS:
        slider = getattr(w, c.name)
        assert slider.description == c.label
        assert 7.5 * len(c.label) <= int(slider.style.description_width.removesuffix("px")), c.label


def test_model_playground_status_describes_the_new_request(tiny_runner):
    """After clear or a new prompt the status line no longer reports the last press (item 8)."""
    w = tiny_playground(tiny_runner, "Hello")
    w.sample_button.click()
    assert "appended" in plain(w.status.value)
    w.reset_button.click()
    assert "cleared the appended tokens: a new request of 5 prompt tokens" in plain(w.status.value)
    w.sample_button.click()
    w.prompt.value = "Hi"
    assert "new prompt: a new request of 2 prompt tokens" in plain(w.status.value)
    assert "appended '" not in plain(w.status.value)
    for button in (w.sample_button, w.reset_button):
        assert button.layout.width == "auto"  # "sample and appe..." was cut (item 7)


def test_model_playgrounds_share_one_loaded_model():
    """Re-running the notebook cell must not load the model again (item 2): the same directory and
    EngineConfig give the same runner; close() lets go of it."""
    from tl_lab.runner import EngineConfig

    cfg = EngineConfig(threads=1)
    a = ModelPlayground(TINY, "Hi", cfg=cfg)
    b = ModelPlayground(TINY, "Hi", cfg=cfg)
    assert b.runner is a.runner and b.labels is a.labels and loaded_model(TINY, cfg).runner is a.runner
    assert np.array_equal(a.logits, b.logits)
    a.close()
    assert a.runner is None and b.runner is loaded_model(TINY, cfg).runner
    other = loaded_model(DATA_DIR / "bigram")
    assert other.runner is not b.runner and loaded_model(TINY, cfg).runner is not b.runner  # one at a time


def test_playground_shows_the_learners_sampler_beside_the_reference(tmp_path):
    """Chapter "your turn": the learner's sample.py on the same inputs and draws, its token and
    logprob beside the reference's; a pitfall in it shows as a difference, a stub as what to write."""
    from tl_lab.lab.exercise.side import load
    from tl_lab.lab.exercise.stubs import reference_source, stub_source
    from tl_lab.lab.pitfalls import apply_edit, get

    (tmp_path / "sample.py").write_text(reference_source("sample"))
    pg = SamplerPlayground(yours=load(tmp_path / "sample.py", "yours_sample_a"))
    assert pg.yours_result == (pg.trace.token, pg.trace.logprob) and "the same bits" in pg.compare.value
    src = reference_source("sample")
    for e in get("s03").edits:  # the logprob after temperature
        src = apply_edit(src, e, "s03")
    (tmp_path / "sample.py").write_text(src)
    pg = SamplerPlayground(yours=load(tmp_path / "sample.py", "yours_sample_b"))
    pg.temperature.value = 0.5
    assert pg.yours_result[1] != pg.trace.logprob and "DIFFERENT" in pg.compare.value
    (tmp_path / "sample.py").write_text(stub_source("sample"))
    pg = SamplerPlayground(yours=load(tmp_path / "sample.py", "yours_sample_c"))
    assert pg.yours_result is None and "not written yet" in pg.compare.value and pg.trace is not None
    assert re.search(r"your sample\.py raised at \S*sample\.py:\d+ in \S+: NotImplementedError: .*hint: .*exercise hint sample", pg.compare.value)


# ------------------------------------------------------------------ what each column of the charts marks

def charts_by_stage(html: str) -> dict[str, str]:
    """stage -> its chart's SVG, entities decoded."""
    found = re.findall(r"(<svg class='tl-chart' data-stage='([^']*)'.*?</svg>)", html, re.S)
    return {html_module.unescape(stage): html_module.unescape(svg) for svg, stage in found}


def test_each_column_marks_only_what_its_stage_has():
    """The dashed logits before the penalties on the penalised column alone, the line of u on the CDF's
    and of min_p on min-p's, and every bar's tooltip naming its row as the row labels do."""
    w = SamplerPlayground([1.0, 3.0, 2.0, 3.0, -1.0], labels=["a", ",", ".", " Paris", "\n"], prompt=[1])
    w.repetition_penalty.value, w.min_p.value, w.top_p.value = 2.0, 0.1, 0.8
    charts = charts_by_stage(w.charts.value)
    assert list(charts) == STAGES
    rows = [f"{i} '{t}'" for i, t in enumerate(["a", ",", ".", "␣Paris", "\\n"])]
    for stage, svg in charts.items():
        assert ("stroke-dasharray" in svg) == (stage == "penalised logits"), stage
        assert ("stroke-width='1.5'" in svg) == (stage in ("CDF walk", STAGES[5])), stage
        tips = re.findall(r"<title>(.*?): ", svg)
        assert len(tips) == 5 and all(t in rows for t in tips), (stage, tips)
        assert w.chart_data[stage]["ids"] == w.shown_ids == [0, 1, 2, 3, 4]
    assert "u = 0.8021" in charts["CDF walk"] and "min_p = 0.1" in charts[STAGES[5]]


def test_min_p_weighs_only_the_ids_top_p_kept():
    w = SamplerPlayground()
    w.preset.value = "ties: four equal, one far below"
    w.top_p.value = 0.5  # keeps ids 0 and 1: min-p never sees 2 and 3, whose weights would be 1 too
    assert w.chart_data[STAGES[5]]["values"] == [1.0, 1.0, 0.0, 0.0, 0.0]


def test_a_vocabulary_shown_whole_has_no_note_above_its_charts():
    assert SamplerPlayground().charts.value.startswith("<div class='tl-stages'")


def test_the_walk_note_says_more_only_past_eight_steps():
    w = SamplerPlayground()
    for n, top_p, more in ((9, 0.9, False), (9, 0.99, True)):  # walks of 8 and of 9 steps
        w.logits_text.value = ", ".join(str(-0.1 * i) for i in range(n))
        w.top_p.value = top_p
        assert w.trace.nucleus_order.size == n - 1 + more
        assert ("..." in re.search(r"walk \(q desc\): [^<]*", w.charts.value).group(0)) == more


# ------------------------------------------------------------------ the playground's inputs

def test_logits_given_without_labels_are_shown_by_id():
    w = SamplerPlayground(np.array([0.5, 2.0, 1.0], np.float32))
    assert w.labels is None and w.preset.value == GIVEN and w.trace.penalised.tolist() == [0.5, 2.0, 1.0]
    rows = re.search(r"<svg class='tl-labels'.*?</svg>", w.charts.value).group(0)
    assert [plain(t) for t in re.findall(r"<text[^>]*>[^<]*</text>", rows)] == ["id", "0", "1", "2"]
    assert re.match(rf"token {w.trace.token} · logprob", plain(w.result.value))


def test_logits_that_are_not_numbers_are_refused_and_leave_the_widget_as_it_was():
    w = SamplerPlayground()
    before = w.trace
    with pytest.raises(ValueError, match="logits must be real numbers, got an array of dtype <U1"):
        w.set_logits(["a", "b"])
    assert w.trace is before and w.logits_text.value == "1, 3, 2, 3, -1"


def test_a_refused_seed_is_quoted_whole_up_to_40_characters():
    w = SamplerPlayground()
    for typed, shown in (("x" * 40, repr("x" * 40)), ("x" * 41, repr("x" * 40) + "...")):
        w.seed.value = typed
        assert plain(w.result.value).endswith(f"got {shown}")


def test_the_playground_carries_the_class_the_browser_test_finds_it_by():
    """tests/test_browser.py measures every `.tl-sampler` on the page: a playground without it is not checked."""
    assert "tl-sampler" in SamplerPlayground()._dom_classes


def test_model_playground_shows_its_top_ids_and_each_tokens_id_on_hover(tiny_runner):
    w = tiny_playground(tiny_runner, "Hi", show_top=5)
    assert len(w.sampler.shown_ids) in (5, 6) and w.sampler.trace.token in w.sampler.shown_ids  # 5 and the token
    w.sample_button.click()
    tips = re.findall(r"<span class='(tl-in|tl-out)' title='([^']*)'", w.context_html.value)
    assert tips == [("tl-in", "id 72"), ("tl-in", "id 105"),
                    ("tl-out", f"id {w.output_ids[0]}, logprob {w.output_logprobs[0]:.4f}")]


def test_model_playground_on_an_int4_model_names_its_group():
    w = ModelPlayground(DATA_DIR / "tiny-llama-int4", "Hi")
    assert "llama, 2 layers, vocabulary 256, int4 g32." in plain(w.info.value)


def test_the_playgrounds_show_displays_the_widget_it_returns(monkeypatch):
    import IPython.display

    from tl_lab.lab.widgets import sampler_playground

    shown = []
    monkeypatch.setattr(IPython.display, "display", shown.append)
    w = sampler_playground.show([1.0, 3.0, 2.0], ["a", "b", "c"], seed=3)
    assert shown == [w] and isinstance(w, sampler_playground.SamplerPlayground)
    assert w.labels == ["a", "b", "c"] and w._given[0].tolist() == [1.0, 3.0, 2.0]  # what it was given


def test_show_model_displays_the_playground_it_returns(monkeypatch):
    import IPython.display

    from tl_lab.lab.widgets import model_playground

    shown = []
    monkeypatch.setattr(IPython.display, "display", shown.append)
    w = model_playground.show_model(DATA_DIR / "bigram", "ab", seed=5)
    assert shown == [w] and isinstance(w, ModelPlayground)
    assert w.model_dir == DATA_DIR / "bigram" and w.prompt.value == "ab" and w.sampler.seed.value == "5"  # as given


def test_given_float64_logits_are_sampled_as_given_not_read_back_as_float32():
    """SamplerPlayground(np.array([0.1, 0.2, 0.3, 1/3])) showed logprob -1.290410735054671, the one of the
    float32 rounding of its text, while sample() of the logits given returns -1.2904107380403718."""
    x = np.array([0.1, 0.2, 0.3, 1 / 3])
    w = SamplerPlayground(x)
    assert (w.trace.token, w.trace.logprob) == sample(x, SamplingParams(), [], [], stream(0, 4))
    w.logits_text.value = "0.1, 0.2, 0.3, 0.5"  # edited: the text is what is sampled, as float32
    want = sample(np.array([0.1, 0.2, 0.3, 0.5], np.float32), SamplingParams(), [], [], stream(0, 4))
    assert (w.trace.token, w.trace.logprob) == want


def test_a_typed_logit_beyond_float32_is_refused_in_words_without_a_warning():
    """Typing "1e39, 0" printed "RuntimeWarning: overflow encountered in cast" into the output and said
    "logit of id 0 is inf: logits must be finite (and at most 2**1000 in size)": 1e39 is finite and
    far below 2**1000; it is float32 that cannot hold it."""
    import warnings

    w = SamplerPlayground()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        w.logits_text.value = "1e39, 0"
    assert w.message == ("could not read the logits: '1e39' (number 1) is beyond float32's largest, "
                         "3.4028235e+38 (typed logits are float32)")
    assert w.trace is None and w.charts.value == ""
    w.logits_text.value = "nan, 0"  # not finite: the sampler's own words, as before
    assert "logits must be finite" in w.message


def test_a_huge_id_is_refused_in_one_short_true_line():
    """An output id of 5,000 digits (past int()'s 4300-digit limit) was refused as "output ids must be
    whole numbers: '9999...' is not one", false, quoting all 5,000 digits."""
    w = SamplerPlayground()
    w.output_text.value = "1, " + "9" * 5000
    assert w.message == f"output id {'9' * 40!r}... (5,000 digits) is outside the vocabulary"
    w.output_text.value = "x" * 5000
    assert w.message == f"output ids must be whole numbers: {'x' * 40!r}... is not one"
    for odd in ("--2", "\u00b2"):  # two signs, a superscript digit: not a huge number
        w.output_text.value = "1, " + odd
        assert w.message == f"output ids must be whole numbers: {odd!r} is not one"
    w.output_text.value = "1"
    assert w.message == "" and w.trace is not None


def test_the_given_labels_depend_on_the_vector_shown_not_on_the_path_to_it():
    """Given 4 logits with labels, typing 3 logits and then 4 again (or the given text itself) showed
    ids without their token strings: the labels were cleared for good by the detour, while the same
    text typed directly keeps them."""
    w = SamplerPlayground(np.array([0.5, 1.5, 1.0, 0.2], np.float32), labels=["a", "b", "c", "d"])
    w.logits_text.value = "0.5, 1.5, 1.0, 0.3"
    assert w.labels == ["a", "b", "c", "d"]
    w.logits_text.value = "0.5, 1.5, 1.0"
    assert w.labels is None and "'c'" not in plain(w.result.value)
    w.logits_text.value = "0.5, 1.5, 1.0, 0.3"
    assert w.labels == ["a", "b", "c", "d"]
    w.logits_text.value = "0.5, 1.5, 1.0, 0.2"  # the given text: the given vector, and its labels
    assert w.labels == ["a", "b", "c", "d"] and f"token {w.trace.token} 'c'" in plain(w.result.value)
    w.preset.value = "peaked"  # a preset has no token strings
    w.logits_text.value = "1, 2, 3, 4"
    assert w.labels is None


def test_a_seed_with_a_plus_sign_is_the_integer_it_says():
    """"+5" was refused with "seed must be an integer in [0, 2**64), got '+5'", which it is (the other
    boxes of the widgets, read by int(), take it)."""
    w = SamplerPlayground()
    w.seed.value = "+5"
    assert w.message == "" and (w.trace.token, w.trace.logprob) == sample(
        np.array([1, 3, 2, 3, -1], np.float32), SamplingParams(), [], [], stream(5, 4))
    for typed in ("+-5", "+", "-", "++5"):
        w.seed.value = typed
        assert w.message == f"seed must be an integer in [0, 2**64), got {typed!r}"


def test_top_k_comes_back_after_a_smaller_vector_clamped_it():
    """top-k 10 on the 12-id preset, then the 5 given logits (the slider's range becomes 1..5, the value
    5), then the 12-id preset again: top-k stayed 5 and the chart kept 5 ids, a setting the learner
    never made. The learner's value comes back where the range allows it."""
    w = SamplerPlayground(np.array([0.5, 1.5, 1.0, 0.2, 0.1], np.float32))
    w.preset.value = "flat with a long tail"
    w.top_k.value = 10
    assert w.trace.top_k.size == 10
    w.preset.value = GIVEN
    assert (w.top_k.max, w.top_k.value) == (5, 5)
    w.preset.value = "flat with a long tail"
    assert (w.top_k.max, w.top_k.value) == (50, 10) and w.trace.top_k.size == 10
    w.preset.value = GIVEN
    w.top_k.value = 2  # moved by the learner while the range is small: that is what comes back
    w.preset.value = "peaked"
    assert w.top_k.value == 2


def test_the_top_k_slider_ends_at_the_size_of_a_given_vector():
    w = SamplerPlayground(np.array([0.5, 1.5], np.float32))
    assert w.top_k.max == 2
    w.set_logits(np.array([0.5], np.float32))  # one id: top-k 1 keeps every id there is
    assert w.top_k.max == 1 and w.trace.token == 0


def test_every_input_and_slider_of_the_playground_is_on_screen():
    """The boxes and sliders are in the widget's displayed tree, not only attributes of it."""
    import ipywidgets as widgets

    w = SamplerPlayground()
    shown, todo = [], list(w.children)
    while todo:
        x = todo.pop()
        shown.append(x)
        todo.extend(getattr(x, "children", ()))
    inputs = [w.preset, w.logits_text, w.prompt_text, w.output_text, w.seed, w.draw, *w.sliders.values()]
    assert all(any(x is i for x in shown) for i in inputs)
    assert all(isinstance(i, widgets.ValueWidget) for i in inputs)
