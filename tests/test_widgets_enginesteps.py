"""Tests for tl_lab/lab/widgets/enginesteps.py: the engine's step records drawn, stepped with the controls."""

import re

import pytest

from conftest import shown_text as plain
from tl_lab.engine.generate import Engine, Request
from tl_lab.ops.paths import DATA_DIR
from tl_lab.runner import EngineConfig, KvConfig
from tl_lab.sample import SamplingParams
from tl_lab.lab.widgets.enginesteps import CELL_H, CELL_W, DECODE, HIT, LEFT, PREFILL, TOP, EngineSteps

SYSTEM = "You are a careful assistant. Answer in one short sentence.\n"  # 3 full blocks of 16


def cells(bm: EngineSteps) -> list[tuple[int, int, int]]:
    """The timeline's cells as drawn: (step, request, new tokens)."""
    pat = r"class='tl-cell' data-step='(\d+)' data-request='(\d+)' data-n='(\d+)'"
    return [tuple(map(int, m)) for m in re.findall(pat, bm.timeline.value)]


def run():
    cfg = EngineConfig(kv=KvConfig(n_blocks=12, block_tokens=16), max_seqs=2, prefill_chunk=32, max_batch_tokens=40)
    engine = Engine.load(DATA_DIR / "tiny-llama", cfg)
    engine.generate([Request(list((SYSTEM + "zero").encode()), SamplingParams(temperature=0), 0, 2)])
    reqs = [Request(list((SYSTEM + t).encode()), SamplingParams(temperature=0), 0, 3) for t in ("one", "two")]
    reqs.append(Request(list(b"x" * 40), SamplingParams(temperature=0), 0, 2))
    return EngineSteps.run(engine, reqs), engine


def test_the_timeline_is_the_engines_records():
    (w, results), engine = run()
    assert len(w.records) == engine.stats["steps"] - 3  # the warm-up request's steps are not in it
    want = [(rec.index, r.request, r.n) for rec in w.records for r in rec.rows]
    assert cells(w) == want
    first = w.records[0]
    assert first.admitted == [(0, 3), (1, 3)]  # both find the warm-up's system-prompt blocks
    assert sum(n for s, r, n in cells(w) if r == 0) == len(results[0].prompt_ids) - 48 + 2  # 3 output, last not fed
    assert w.timeline.value.count("class='tl-hit'") == 2


def test_the_hit_bar_is_the_colour_notebook_12_names():
    """12_where_next names the prefix-cache-hit marker by its colour; was: "a gold bar", drawn dark orange
    (#b45309). The bars and the legend's swatch are HIT, and the notebook's words are that colour's."""
    import json

    from tl_lab.ops.paths import REPO_ROOT

    (w, _), _ = run()
    assert HIT == "#b45309" and w.timeline.value.count(f"fill='{HIT}'") == 2
    assert f"border-left:3px solid {HIT}" in w.timeline.value
    nb = json.loads((REPO_ROOT / "notebooks" / "12_where_next.ipynb").read_text(encoding="utf-8"))
    text = " ".join(" ".join("".join(c["source"]).split()) for c in nb["cells"] if c["cell_type"] == "markdown")
    assert "dark orange bar marks prefix-cache hits" in text and "gold" not in text


def test_buttons_and_slider_walk_the_steps():
    (w, results), _ = run()
    assert w.slider.value == 0 and w.back_button.disabled and not w.next_button.disabled
    shown = plain(w.detail.value)
    assert "Step 0" in shown and "req 0 admitted, 3 block(s) found by prefix hash" in shown
    assert f"{w.records[0].waiting} request(s) still waiting" in shown
    w.next_button.click()
    assert w.slider.value == 1 and "Step 1" in plain(w.detail.value)
    last = len(w.records) - 1
    w.slider.value = last
    assert w.next_button.disabled and "Step " + str(last) in plain(w.detail.value)
    fin = w.records[last].finished
    assert fin and all(f"finished ({why})" in plain(w.detail.value) for _, why in fin)
    w.next_button.click()  # at the end: stays
    assert w.slider.value == last
    w.show(-5)
    assert w.slider.value == 0
    assert f"stroke='#dc2626'" in w.timeline.value


def test_no_records_is_a_note():
    from tl_lab.lab.widgets.common import NOTE

    w = EngineSteps([])
    assert "No steps recorded" in plain(w.detail.value) and f"color:{NOTE}" in w.detail.value


@pytest.fixture(scope="module")
def records():
    """One recorded run (the engine's steps are the same each time: greedy); each test makes its widget."""
    (w, _), _ = run()
    return w.records


def drawn_cells(svg: str) -> list[dict]:
    pat = (r"<g class='tl-cell' data-step='(\d+)' data-request='(\d+)' data-n='\d+'>"
           r"<rect x='(\d+)' y='(\d+)' width='(\d+)' height='(\d+)' fill='([^']+)'/>")
    return [dict(step=int(s), req=int(r), x=int(x), y=int(y), w=int(w), h=int(h), fill=f)
            for s, r, x, y, w, h, f in re.findall(pat, svg)]


def test_each_cell_is_in_its_steps_column_and_its_requests_row_coloured_by_kind(records):
    """Blue a prompt chunk, green a decode token, as the legend says; every cell inside the drawing."""
    svg = EngineSteps(records).timeline.value
    width, height = map(int, re.search(r"<svg [^>]*width='(\d+)' height='(\d+)'", svg).groups())
    prompt = {(rec.index, r.request): r.prompt > 0 for rec in records for r in rec.rows}
    cells = drawn_cells(svg)
    assert len(cells) == len(prompt) and {c["fill"] for c in cells} == {PREFILL, DECODE}
    for c in cells:
        column, row = LEFT + c["step"] * CELL_W, TOP + c["req"] * CELL_H
        assert column <= c["x"] and c["x"] + c["w"] <= column + CELL_W, c
        assert row <= c["y"] and c["y"] + c["h"] <= row + CELL_H, c
        assert c["fill"] == (PREFILL if prompt[c["step"], c["req"]] else DECODE), c
        assert c["x"] + c["w"] <= width and c["y"] + c["h"] <= height
    legend = plain(svg)
    assert "prompt chunk" in legend and "decode" in legend and "prefix-cache hits at admission" in legend


def test_the_steps_are_numbered_every_five_and_the_selected_one_is_framed(records):
    w = EngineSteps(records)
    numbers = re.findall(r"<text x='([\d.]+)' y='14'[^>]*>(\d+)</text>", w.timeline.value)
    assert [int(n) for _, n in numbers] == list(range(0, len(records), 5)) == [0, 5]
    for x, n in numbers:  # centred over its column
        assert float(x) == LEFT + int(n) * CELL_W + CELL_W / 2
    for k in (0, 4):
        w.show(k)
        frame = re.search(r"<rect x='(\d+)' y='(-?\d+)' width='(\d+)' height='(\d+)' fill='none'", w.timeline.value)
        x, y, fw, fh = map(int, frame.groups())
        assert (x, fw) == (LEFT + k * CELL_W, CELL_W) and y <= TOP and y + fh >= TOP + len(w.labels) * CELL_H


def test_the_details_say_what_each_row_did_and_sampled(records):
    """A prompt chunk samples nothing ('—') unless it ends the prompt; a decode row samples one id."""
    w = EngineSteps(records)
    shown = plain(w.detail.value)
    assert "one ForwardBatch of 2 sequence(s), 28 new token(s)" in shown
    assert ("req 0 admitted, 3 block(s) found by prefix hash. req 1 admitted, 3 block(s) found by prefix hash. "
            "request rows") in shown
    for r in records[0].rows:  # both end their prompts: each samples its first token
        assert f"req {r.request} prompt chunk of 14 48 … 61 {r.token}" in shown
    w.show(1)
    assert f"req 0 decode 62 … 62 {records[1].rows[0].token} " in plain(w.detail.value)
    w.show(3)
    assert "req 2 prompt chunk of 32 0 … 31 — " in plain(w.detail.value) and records[3].rows[0].token is None
