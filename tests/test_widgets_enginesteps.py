"""Tests for tl_lab/widgets/enginesteps.py: the engine's step records drawn, stepped with the controls."""

import html as html_module
import re

from tl_lab.generate import Engine, Request
from tl_lab.paths import DATA_DIR
from tl_lab.runner import EngineConfig, KvConfig
from tl_lab.sample import SamplingParams
from tl_lab.widgets.enginesteps import EngineSteps

SYSTEM = "You are a careful assistant. Answer in one short sentence.\n"  # 3 full blocks of 16


def plain(html: str) -> str:
    return " ".join(html_module.unescape(re.sub(r"<[^>]+>", " ", re.sub(r"</?b>", "", html))).split())


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
    from tl_lab.widgets.common import NOTE

    w = EngineSteps([])
    assert "No steps recorded" in plain(w.detail.value) and f"color:{NOTE}" in w.detail.value
