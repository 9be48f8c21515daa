"""Tests for tl_lab/lab/widgets/blockmap.py: step the prefix-cache story, check the pool and the drawing."""

import html as html_module
import re

import numpy as np

from conftest import shown_text as plain, svg_outside
from tl_lab.kv import KvCfg, KvPool, prefix_hashes
from tl_lab.lab.widgets.blockmap import PROMPTS, STORY, BlockMap, key_value, short_hash


def drawn_blocks(bm: BlockMap) -> dict[int, dict]:
    """The grid's blocks as drawn: id -> state, ref, fill, short hash (from the SVG's data attributes)."""
    out = {}
    pat = (r"class='tl-block' data-block='(\d+)' data-state='(\w+)' data-ref='(\d+)' "
           r"data-fill='(\d+)' data-hash='([^']*)'")
    for b, st, ref, fill, h in re.findall(pat, bm.grid.value):
        out[int(b)] = {"state": st, "ref": int(ref), "fill": int(fill), "hash": h}
    return out


def drawn_tables(bm: BlockMap) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for seq, _i, b in re.findall(r"class='tl-entry' data-seq='([^']*)' data-index='(\d+)' data-block='(\d+)'",
                                 bm.grid.value):
        out.setdefault(seq, []).append(int(b))
    return out


def assert_drawing_matches_pool(bm: BlockMap):
    blocks = drawn_blocks(bm)
    assert sorted(blocks) == list(range(bm.pool.n_blocks))
    for b, d in blocks.items():
        assert d["state"] == bm.pool.state(b) and d["ref"] == bm.pool.ref(b) and d["fill"] == bm.pool.fill(b)
        assert d["hash"] == html_module.escape(short_hash(bm.pool.hash_of(b)))
    assert drawn_tables(bm) == bm.tables


def test_story_buttons_step_the_prefix_cache():
    bm = BlockMap()
    assert bm.step == 0 and bm.back_button.disabled and not bm.next_button.disabled
    assert bm.pool.stats()["free"] == 12 and bm.tables == {}
    assert "No sequence holds blocks" in plain(bm.where.value)
    assert_drawing_matches_pool(bm)

    bm.next_button.click()  # A prefills: 14 tokens, 4 blocks, 3 full ones registered
    assert bm.step == 1 and bm.tables == {"A": [0, 1, 2, 3]}
    hA = prefix_hashes(PROMPTS["A"], 4)
    assert [bm.pool.hash_of(b) for b in range(4)] == hA + [None]
    assert [bm.pool.fill(b) for b in range(4)] == [4, 4, 4, 2]
    assert_drawing_matches_pool(bm)
    assert "Request A prefills" in plain(bm.caption.value)

    bm.next_button.click()  # B finds the system prompt's two blocks by hash
    s = bm.pool.stats()
    assert bm.tables["B"] == [0, 1, 4, 5] and (s["lookups"], s["hits"]) == (4, 2)
    assert bm.pool.ref(0) == bm.pool.ref(1) == 2
    assert "lookup finds blocks 0, 1 by hash" in plain(bm.caption.value)
    assert_drawing_matches_pool(bm)

    bm.next_button.click()  # A finishes: block 2 (registered) cached, block 3 (partial) freed
    assert bm.pool.state(2) == "cached" and bm.pool.state(3) == "free" and bm.pool.lru() == [2]
    assert bm.pool.ref(0) == bm.pool.ref(1) == 1
    assert "LRU, oldest first (evicted first): 2" in plain(bm.grid.value)
    assert_drawing_matches_pool(bm)

    bm.next_button.click()  # B finishes, tail first
    assert bm.pool.lru() == [2, 4, 1, 0] and bm.tables == {}
    assert "LRU, oldest first (evicted first): 2 → 4 → 1 → 0" in plain(bm.grid.value)
    assert_drawing_matches_pool(bm)

    bm.next_button.click()  # C under pressure: hits 0, 1; evicts 2, the oldest cached block
    assert bm.step == len(STORY) - 1 and bm.next_button.disabled
    assert bm.pool.stats()["evictions"] == 1 and bm.pool.lru() == [4]
    assert bm.tables["C"][:2] == [0, 1] and bm.tables["C"][-1] == 2
    assert bm.pool.hash_of(2) == prefix_hashes(PROMPTS["C"], 4)[10]  # block 2 now holds C's last block
    assert "evicted: 2" in plain(bm.caption.value)
    assert "evictions 1" in plain(bm.grid.value)
    assert_drawing_matches_pool(bm)

    bm.next_button.click()  # at the end: stays
    assert bm.step == len(STORY) - 1
    bm.back_button.click()
    assert bm.step == 4 and bm.pool.lru() == [2, 4, 1, 0]
    bm.reset_button.click()
    assert bm.step == 0 and bm.pool.stats()["free"] == 12 and bm.tables == {}


def test_selecting_a_position_shows_where_its_key_lands():
    bm = BlockMap()
    bm.goto(5)
    assert bm.seq.options == ("C",)
    bm.seq.value = "C"
    bm.position.value = 37  # C's table index 9 -> pool block 5, slot 1
    loc = bm.locate()
    table = bm.tables["C"]
    assert (loc["index"], loc["block"], loc["slot"]) == (9, table[9], 1)
    assert loc["offsets"] == [(0 * 4 + 1) * 4, (1 * 4 + 1) * 4]
    shown = plain(bm.where.value)
    assert f"block table index 37 // 4 = 9 → pool block {table[9]}, slot 37 % 4 = 1" in shown
    assert "(1 · 4 + 1) · 4 = 20" in shown
    token = PROMPTS["C"][37]
    assert f"{key_value(token, 1):g}" in shown and f"{-key_value(token, 1):g}" in shown  # read from the slab
    K = bm.pool.slab(table[9], 0, False).ravel()
    assert float(np.uint16(K[20]).view(np.float16)) == key_value(token, 1)
    assert f"data-block='{table[9]}' data-state='in_use'" in bm.grid.value
    assert "stroke='#dc2626' stroke-width='3'" in bm.grid.value  # the selected block is outlined

    for bad in (44, -1, 1000):
        bm.position.value = bad
        shown = plain(bm.where.value)
        assert f"Position {bad} is outside sequence C's block table" in shown
        assert "positions 0 to 43" in shown

    bm.goto(2)
    bm.seq.value = "B"
    bm.position.value = 13  # past B's 13 tokens, inside its last block
    assert bm.locate()["block"] == 5
    assert "Not written yet" in plain(bm.where.value)


def test_from_pool_draws_any_pool_and_the_chapter_example():
    pool = KvPool(KvCfg(n_blocks=12, block_tokens=16, n_layers=2, n_kv_heads=2, head_dim=8))
    pool.alloc(10)
    for b in (7, 2):
        pool.set_fill(b, 16)
    pool.set_fill(9, 6)
    bm = BlockMap.from_pool(pool, {"s": [7, 2, 9]}, layer=1)
    assert bm.next_button not in bm.children  # no story buttons
    assert bm.seq.value == "s"
    bm.position.value = 37
    loc = bm.locate()
    assert (loc["index"], loc["block"], loc["slot"]) == (2, 9, 5)
    assert loc["offsets"] == [(0 * 16 + 5) * 8, (1 * 16 + 5) * 8]
    shown = plain(bm.where.value)
    assert "pool block 9, slot 37 % 16 = 5" in shown and "(1 · 16 + 5) · 8 = 168" in shown
    assert "layer 1's K slab" in shown and "Not written yet" not in shown
    assert drawn_tables(bm) == {"s": [7, 2, 9]}
    assert drawn_blocks(bm)[11]["state"] == "free"
    # the caller changes the pool, then refreshes
    assert drawn_blocks(bm)[0]["state"] == "in_use"
    pool.release(0)
    bm.refresh()
    assert drawn_blocks(bm)[0]["state"] == "free"
    bm.position.value = 48
    assert "outside sequence s's block table" in plain(bm.where.value)
    bm.layer.value = 0
    bm.position.value = 5
    assert bm.locate()["block"] == 7 and "layer 0's K slab" in plain(bm.where.value)


def test_a_big_pool_is_drawn_in_part():
    pool = KvPool(KvCfg(n_blocks=1000, block_tokens=4, n_layers=1, n_kv_heads=1, head_dim=2))
    ids = pool.alloc(3)
    bm = BlockMap.from_pool(pool, {"x": ids})
    assert len(drawn_blocks(bm)) == 256 and "744 more blocks, not drawn" in plain(bm.grid.value)
    assert BlockMap.from_pool(pool).where.value.count("No sequence") == 1


def test_the_position_box_answers_in_words():
    """Issue 11 item 9: "abc", an empty box and "3.7" get a sentence, never a silent 37 or no change."""
    bm = BlockMap()
    bm.goto(5)
    bm.seq.value = "C"
    for typed, words in [("abc", "'abc' is not a whole number"), ("", "Type a position"),
                         ("3.7", "'3.7' is not a whole number")]:
        bm.position.value = typed
        shown = plain(bm.where.value)
        assert words in shown, (typed, shown)
        assert "pool block" not in shown and "stroke-width='3'" not in bm.grid.value  # nothing selected
    bm.position.value = " 37 "
    assert bm.locate()["index"] == 9 and "pool block" in plain(bm.where.value)
    bm.position.value = 5  # Python may set an int
    assert bm.position.value == "5" and bm.locate()["slot"] == 1


def test_no_sequence_is_a_note_and_story_steps_keep_the_position_inside():
    """Issue 11 item 5: "no sequence" is a normal state (grey note, not red), and a story step never
    leaves the position box pointing outside the selected sequence."""
    from tl_lab.lab.widgets.common import ERROR, NOTE

    bm = BlockMap()
    assert f"color:{NOTE}" in bm.where.value and ERROR not in bm.where.value
    bm.goto(5)
    bm.seq.value, bm.position.value = "C", 37
    bm.reset_button.click()
    assert bm.step == 0 and f"color:{NOTE}" in bm.where.value
    bm.position.value = 37
    for step in range(1, 5):
        bm.next_button.click()
        shown = plain(bm.where.value)
        assert "outside" not in shown and ERROR not in bm.where.value, (step, shown)
        if bm.tables:
            seq = bm.seq.value
            assert int(bm.position.value) < len(bm.tables[seq]) * 4
    bm.next_button.click()  # C: the kept position is inside, so it stays where it was
    assert bm.step == 5 and "pool block" in plain(bm.where.value)


def test_a_snapshot_map_stays_as_it_was():
    """Issue 11 item 3: a map drawn mid-request from a snapshot does not jump when the request ends."""
    pool = KvPool(KvCfg(n_blocks=6, block_tokens=4, n_layers=1, n_kv_heads=1, head_dim=2))
    ids = pool.alloc(2)
    pool.set_fill(ids[0], 4)
    pool.set_fill(ids[1], 1)
    bm = BlockMap.from_pool(pool, {"req 0": ids}, lengths={"req 0": 5}, snapshot=True)
    for b in ids:
        pool.release(b)  # the request finishes after the map was drawn
    bm.position.value = 4
    assert bm.pool.state(ids[0]) == "in_use" and drawn_tables(bm) == {"req 0": ids}
    assert "Not written yet" not in plain(bm.where.value) and "pool block" in plain(bm.where.value)
    live = BlockMap.from_pool(pool, {"req 0": ids})
    assert drawn_blocks(live)[ids[0]]["state"] == "free"  # without the snapshot: the pool as it is now


def test_the_story_admits_through_the_engines_block_manager(monkeypatch):
    """The story has no admission of its own: it calls tl_lab.engine.blocks, as the engine does."""
    import tl_lab.engine.blocks as blocks

    calls = []
    for name in ("admit", "reserve", "written", "release"):
        real = getattr(blocks.BlockManager, name)
        monkeypatch.setattr(blocks.BlockManager, name,
                            lambda self, *a, _n=name, _f=real, **k: (calls.append(_n), _f(self, *a, **k))[1])
    BlockMap().goto(5)
    assert calls.count("admit") == 3 and calls.count("release") == 2 and "written" in calls


def test_block_map_shows_the_learners_pool_beside_the_reference(tmp_path):
    """Chapter "your turn": the story also runs on the learner's kv.py, its pool drawn beside the
    reference's after the same steps. A copy of the reference agrees at every step; evicting the
    newest cached block (s18) differs at the step that evicts; a piece still the stub is its error
    with the learner's file and line, and the reference's map still works."""
    from tl_lab.lab.exercise.side import load
    from tl_lab.lab.exercise.stubs import reference_source, stub_source
    from tl_lab.lab.pitfalls import apply_edit, get

    (tmp_path / "kv.py").write_text(reference_source("kv"))
    bm = BlockMap(yours=load(tmp_path / "kv.py", "yours_kv_a"))
    assert bm.pool.__class__.__module__ == "tl_lab.lab.exercise.side.reference_kv"  # the reference file's pool
    for k in range(len(STORY)):
        bm.goto(k)
        assert bm.yours_differences == [] and bm.compare.value.endswith(
            f"after step {k} your pool is the reference's: the same states, refs, fills, hashes, LRU, free list and counts</p>"), k
        assert bm.yours_grid.value.replace("yours_kv_a", "") == bm.grid.value  # drawn alike, block for block

    src = reference_source("kv")
    for e in get("s18").edits:
        src = apply_edit(src, e, "s18")
    (tmp_path / "kv.py").write_text(src)
    bm = BlockMap(yours=load(tmp_path / "kv.py", "yours_kv_b"))
    bm.goto(4)
    assert bm.yours_differences == []  # nothing evicted yet: the mistake does not show
    bm.goto(5)
    text = plain(bm.compare.value)
    assert "DIFFERENT" in text and "lru(): yours [2], the reference's [4]" in text, text
    assert bm.yours_pool.lru() == [2] and bm.pool.lru() == [4]

    (tmp_path / "kv.py").write_text(stub_source("kv"))
    bm = BlockMap(yours=load(tmp_path / "kv.py", "yours_kv_c"))
    line = stub_source("kv").splitlines().index(next(s for s in stub_source("kv").splitlines()
                                                      if "KvPool.__init__: not written yet" in s)) + 1
    text = plain(bm.compare.value)
    assert f"your kv.py raised at {tmp_path / 'kv.py'}:{line} in KvPool.__init__: NotImplementedError" in text, text
    assert "hint: a piece still the stub" in text
    assert bm.yours_pool is None and bm.yours_grid.value == ""
    bm.goto(5)
    assert bm.pool.lru() == [4] and "KvPool.__init__" in plain(bm.compare.value)


def test_a_map_of_any_pool_takes_no_learners_pool():
    pool = KvPool(KvCfg(n_blocks=2, block_tokens=4, n_layers=1, n_kv_heads=1, head_dim=2))
    bm = BlockMap.from_pool(pool, {"s": []})
    assert bm.yours is None and bm.compare.value == ""


def test_every_pools_drawing_lies_inside_its_box_and_an_empty_lru_says_so():
    """Each size's grid (one row, 6, 8 and 16 columns) with hashes, fills and a table below it."""
    for n, cols in ((5, 5), (8, 8), (12, 6), (40, 8), (100, 16)):
        pool = KvPool(KvCfg(n_blocks=n, block_tokens=4, n_layers=1, n_kv_heads=1, head_dim=2))
        assert "LRU, oldest first (evicted first): empty" in plain(BlockMap.from_pool(pool).grid.value)
        ids = pool.alloc(min(n, 9))
        for b in ids:
            pool.set_fill(b, 3)
        pool.set_fill(ids[0], 4)
        pool.register(ids[0], 12345)  # a full block with its prefix hash drawn
        pool.release(ids[0])  # and cached: its place in the LRU drawn in its cell
        grid = BlockMap.from_pool(pool, {"a much longer name": ids}).grid.value
        assert svg_outside(grid) == [], n
        columns = {int(x) for x in re.findall(r"<g class='tl-block'[^>]*>\s*<rect x='(\d+)'", grid)}
        assert len(columns) == cols, (n, sorted(columns))


def test_the_storys_keys_read_as_the_token_plus_a_quarter_per_kv_head():
    """K = token + h / 4 (V its negative): exact in f16, so a learner finds 7.25 in head 1's slab for token 7."""
    assert [key_value(7, h) for h in range(3)] == [7.0, 7.25, 7.5]


def test_a_huge_position_is_refused_in_one_short_true_line():
    """A whole number of 5,000 digits (past int()'s 4300-digit limit) was answered "Position '9999...'
    is not a whole number", false, quoting all 5,000 digits; any text is quoted up to 40 characters."""
    bm = BlockMap()
    bm.goto(1)
    bm.position.value = "9" * 5000
    shown = plain(bm.where.value)
    assert shown == f"Position {'9' * 40!r}... (5,000 digits) is outside every block table: type one such as 37."
    bm.position.value = "x" * 5000
    assert plain(bm.where.value) == f"Position {'x' * 40!r}... is not a whole number: type one such as 37."
    for odd in ("--5", "\u00b2", "-" + "9" * 5):  # two signs, a superscript digit: not huge, not numbers
        bm.position.value = odd
        assert "whole number" in plain(bm.where.value) or "outside" in plain(bm.where.value), odd
        assert "digits)" not in plain(bm.where.value), odd
    bm.position.value = "3"
    assert bm.locate()["slot"] == 3


def test_a_table_entry_outside_the_pool_is_said_in_words_not_raised():
    """show(pool, tables) draws any tables; with the section-3 table edited to [7, 2, 99] on a 12-block
    pool, selecting position 37 raised "KvError: block id 99 is out of range" from the position box's
    observer and left the panel showing the previous position."""
    pool = KvPool(KvCfg(n_blocks=12, block_tokens=16, n_layers=1, n_kv_heads=2, head_dim=4))
    bm = BlockMap.from_pool(pool, {"seq": [7, 2, 99]})
    bm.position.value = 37
    assert plain(bm.where.value) == ("Position 37 of sequence seq is in entry 2 of its block table, block 99: "
                                     "not a block of this pool, whose blocks are 0 to 11.")
    assert "stroke-width='3'" not in bm.grid.value  # nothing selected
    bm.position.value = 20
    assert bm.locate()["block"] == 2 and "pool block" in plain(bm.where.value)


def test_tables_keyed_by_request_index_show_where_a_key_lands():
    """Tables keyed by ints (as a StepRecord's `tables`, request index -> table) are drawn with their
    names, but the position panel raised "AttributeError: 'int' object has no attribute 'replace'"
    (html.escape of the name) from the constructor."""
    pool = KvPool(KvCfg(n_blocks=12, block_tokens=16, n_layers=1, n_kv_heads=2, head_dim=4))
    bm = BlockMap.from_pool(pool, {0: [3], 1: [7, 2, 9]})
    bm.position.value = 37
    assert bm.locate()["block"] == 9 and "Sequence 1, position 37" in plain(bm.where.value)
    assert drawn_tables(bm) == {"0": [3], "1": [7, 2, 9]}


def test_an_empty_block_table_holds_no_position():
    """A sequence with an empty table was answered "0 blocks of B = 4 hold positions 0 to -1"."""
    pool = KvPool(KvCfg(n_blocks=4, block_tokens=4, n_layers=1, n_kv_heads=1, head_dim=2))
    bm = BlockMap.from_pool(pool, {"x": []})
    assert plain(bm.where.value) == "Position 0 is outside sequence x's block table: 0 blocks of B = 4 hold no position."
