"""Issue #61: every bad argument of a widget is a message in the widget, bounded in size; never a plain
AttributeError, TypeError or ValueError out of it, and never a huge allocation first."""

import pytest

from conftest import shown_text as plain


def test_yours_that_is_not_a_module_is_a_message_in_each_widget():
    from tl_lab.lab.widgets.blockmap import BlockMap
    from tl_lab.lab.widgets.int4 import Int4Widget
    from tl_lab.lab.widgets.numbers import NumbersWidget
    from tl_lab.lab.widgets.sampler_playground import SamplerPlayground

    for w, module in [(NumbersWidget(yours=object()), "quant"), (Int4Widget(yours=object()), "quant"),
                      (SamplerPlayground(yours=object()), "sample"), (BlockMap(yours=object()), "kv")]:
        text = plain(w.compare.value)  # was: AttributeError: 'object' object has no attribute '__file__'
        assert f"yours= must be your {module} module" in text and len(text) < 500, text


def test_engine_steps_and_block_map_refuse_bad_input_in_the_widget():
    from tl_lab.lab.widgets.blockmap import BlockMap, story_pool
    from tl_lab.lab.widgets.enginesteps import EngineSteps

    for records, says in [([None], "records[0] is NoneType"), ("abc", "records must be a list of StepRecords")]:
        w = EngineSteps(records)
        assert says in w.message and says in plain(w.detail.value)
    pool = story_pool(None)
    for tables, says in [({"a": None}, "must be a list of block ids"), ({"a": "01"}, "must be a list of block ids"),
                         ({"a": [None]}, "a block id is a whole number"), ({"a": ["01"]}, "a block id is a whole number")]:
        m = BlockMap.from_pool(pool, tables)
        assert says in m.message and says in plain(m.grid.value) and len(m.message) < 200
    m = BlockMap()
    m.goto(2)
    for k in (float("nan"), "2", 1.5, None):
        m.goto(k)
        assert "goto needs a step number" in plain(m.caption.value) and m.step == 2


def test_sampler_playground_refuses_bad_ids_and_huge_logits_before_allocating():
    import tracemalloc

    from tl_lab.lab.widgets.sampler_playground import SamplerPlayground

    for kwargs, says in [({"prompt": "abc"}, "prompt must be a list of token ids"),
                         ({"prompt": [1.7]}, "prompt ids must be whole numbers: '1.7'"),  # was: taken as 1
                         ({"output": [None]}, "output ids must be whole numbers")]:
        w = SamplerPlayground(**kwargs)
        assert says in w.message and says in plain(w.result.value)
    tracemalloc.start()
    w = SamplerPlayground(logits=range(50_000_000))  # was: 13 GB
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert "50,000,000 logits are more than this playground takes" in w.message and peak < 50 << 20
    with pytest.raises(ValueError, match="more than this playground takes"):
        w.set_logits(range(50_000_000))


def test_model_playground_prompt_that_is_not_text_is_a_message():
    """Was a TraitError out of the constructor (the Textarea takes a str only)."""
    from tl_lab.lab.widgets.model_playground import ModelPlayground
    from tl_lab.ops.paths import DATA_DIR

    w = ModelPlayground(DATA_DIR / "bigram", prompt=[1.7])
    assert "prompt must be text (a str), not list" in w.message and "prompt must be text" in plain(w.status.value)
    assert isinstance(w.prompt.value, str)
