"""tools/reword_messages.py: the reference with each raise's message reworded, its identifiers kept."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _tool():
    spec = importlib.util.spec_from_file_location("reword_messages", ROOT / "tools" / "reword_messages.py")
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


def test_the_sentence_is_reworded_and_the_fields_kept():
    t = _tool()
    src = ("def f(rows, cols, cfg):\n"
           "    if rows < 0:\n"
           "        raise ValueError(f'rows and cols must be non-negative, got rows={rows}')\n"
           "    raise KeyError('cfg.n_blocks must be at least 1')\n")
    out = t.reword(src)
    assert "f'rows AND cols MUST BE NON-NEGATIVE, GOT rows={rows}'" in out
    assert "'cfg.n_blocks MUST BE AT LEAST 1'" in out
    compile(out, "<reworded>", "exec")


def test_every_module_reworded_still_compiles_and_differs(tmp_path):
    t = _tool()
    assert t.main([str(tmp_path)]) == 0
    for m in t.MODULES:
        text = (tmp_path / f"{m}.py").read_text()
        compile(text, m, "exec")
        assert text != (ROOT / "tl_lab" / f"{m}.py").read_text()


def test_a_refusal_is_held_to_its_fields_not_its_sentence():
    """tests/refusal.py: the reworded sentence passes, a message that leaves out a field or value fails."""
    from refusal import names_all

    text = "alloc(4): only 3 blocks available"
    assert names_all("alloc(4): ONLY 3 blocks available", text) == []
    assert names_all("alloc: ONLY 3 blocks available", text) == ["alloc(4)"]
    assert names_all("block id 5 is out of range (n_blocks 4)", "block id 4 is out of range (n_blocks 4)") == []
    assert "n_blocks" in names_all("block 4 is out of range", "block id 4 is out of range (n_blocks 4)")
