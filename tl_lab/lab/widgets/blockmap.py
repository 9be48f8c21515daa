"""The KV block map: the pool as a grid of blocks, each sequence's block table pointing into it.

Chapter L10.1, section 2.2 (KvPool: references, the prefix hash index, LRU eviction) and section 3
("where a key lands"). Everything drawn is read from a real `tl_lab.kv.KvPool` through its read-only
views (`state`, `ref`, `fill`, `hash_of`, `lru`, `stats`, `slab`); the story drives the pool through
the engine's own block manager (`tl_lab.engine.blocks.BlockManager`: admit through the prefix cache,
reserve, mark written, release tail first), so it shows what `tl_lab.engine.generate.Engine` does.

    BlockMap()                        the prefix-cache story on a 12-block pool of B = 4
    BlockMap(yours=module)            the same story also on the learner's kv.py, its pool beside the reference's
    BlockMap.from_pool(pool, tables)  any pool and any sequences' block tables (no story buttons)
    show(pool, tables)                the same, displayed (snapshot=True: a copy frozen at that moment)
"""

from __future__ import annotations

import copy
import html
import math
from dataclasses import dataclass, field
from typing import Callable

import ipywidgets as widgets
import numpy as np
import traitlets

from tl_lab.engine.blocks import BlockManager, SeqBlocks, blocks_for, cacheable
from tl_lab.errors import KvError
from tl_lab.kv import KvCfg, KvPool, key_location, slab_offset
from tl_lab.quant import f16_to_f32, f32_to_f16
from tl_lab.lab.widgets.common import CellWidget, MONO, NOTE, digits_past_int, message, quoted

COLOURS = {"free": "#e5e7eb", "in_use": "#93c5fd", "cached": "#fcd34d"}
STROKE = {"free": "#9ca3af", "in_use": "#1d4ed8", "cached": "#b45309"}
SEQ_COLOURS = ["#2563eb", "#16a34a", "#9333ea", "#dc2626", "#0891b2", "#ca8a04"]
HIGHLIGHT = "#dc2626"
MAX_DRAWN = 256  # a bigger pool draws its first blocks and says how many more there are
CELL_W, CELL_H, GAP = 104, 70, 8


# ---------------------------------------------------------------- the prefix-cache story

SYSTEM = list(range(100, 108))  # a shared system prompt: two full blocks of B = 4
PROMPTS = {
    "A": SYSTEM + list(range(200, 206)),  # 14 tokens: 4 blocks, the last one half full
    "B": SYSTEM + list(range(300, 305)),  # 13 tokens: the first two blocks found by hash
    "C": SYSTEM + list(range(400, 436)),  # 44 tokens: 11 blocks, needs an eviction
}


def story_cfg(kv=None) -> KvCfg:
    """The story's pool: 12 blocks of B = 4, one layer, two kv heads of D = 4 (the KvCfg of module
    `kv`, default tl_lab.kv)."""
    cfg = KvCfg if kv is None else kv.KvCfg
    return cfg(n_blocks=12, block_tokens=4, n_layers=1, n_kv_heads=2, head_dim=4)


def story_pool(kv=None) -> KvPool:
    """A fresh story pool of module `kv` (default tl_lab.kv)."""
    return (KvPool if kv is None else kv.KvPool)(story_cfg(kv))


@dataclass
class StoryState:
    """What the story's engine knows besides the pool: each live sequence's blocks (tl_lab.engine.blocks)."""

    seqs: dict[str, SeqBlocks] = field(default_factory=dict)
    last: dict = field(default_factory=dict)  # what the last step did (hits, new blocks, evicted)

    @property
    def tables(self) -> dict[str, list[int]]:
        return {name: seq.table for name, seq in self.seqs.items()}

    @property
    def lengths(self) -> dict[str, int]:
        return {name: seq.written for name, seq in self.seqs.items()}


def prefill(pool: KvPool, st: StoryState, name: str, tokens: list[int]) -> None:
    """Admit a sequence exactly as the engine does (tl_lab.engine.blocks: `admit` through the prefix cache,
    `reserve` the rest, `written` to fill and register), with K and V written by `write_tokens`."""
    blocks, B = BlockManager(pool), pool.block_tokens
    cached_before = pool.lru()
    seq = blocks.admit(tokens, cacheable(len(tokens), B))
    new = blocks.reserve(seq, len(tokens))
    for j, b in enumerate(seq.table[seq.hits:], start=seq.hits):
        write_tokens(pool, b, tokens[j * B:(j + 1) * B])
    blocks.written(seq, tokens, len(tokens))
    st.seqs[name] = seq
    st.last = {"hits": seq.table[:seq.hits], "new": new,
               "evicted": [b for b in new if b in cached_before]}


def write_tokens(pool: KvPool, b: int, chunk: list[int]) -> None:
    """Write K = key_value(token, h) and V = -K (as f16) for each token into its slot of block b."""
    for layer in range(pool.n_layers):
        K, V = pool.slab(b, layer, False), pool.slab(b, layer, True)
        for slot, t in enumerate(chunk):
            for h in range(pool.H_kv):
                K[h, slot, :] = f32_to_f16(key_value(t, h))
                V[h, slot, :] = f32_to_f16(-key_value(t, h))


def finish(pool: KvPool, st: StoryState, name: str) -> None:
    """A sequence ends: release its blocks as the engine does (`BlockManager.release`, tail first,
    so the tail is evicted before the shared head)."""
    released = BlockManager(pool).release(st.seqs.pop(name))
    by = {k: [b for b in released if pool.state(b) == k] for k in ("free", "cached", "in_use")}
    st.last = {"released": released, **by}


@dataclass(frozen=True)
class StoryStep:
    """One step of the prefix-cache story: its title, what it does to the pool, what it says."""

    title: str
    run: Callable[[KvPool, StoryState], None]
    say: Callable[[KvPool, StoryState], str]


def _blocks(ids) -> str:
    return ", ".join(str(b) for b in ids) if ids else "none"


STORY = [
    StoryStep(
        "An empty pool",
        lambda p, s: None,
        lambda p, s: f"{p.n_blocks} free blocks of B = {p.block_tokens} positions. Nothing in use, "
        "nothing cached, the hash index is empty.",
    ),
    StoryStep(
        "Request A prefills",
        lambda p, s: prefill(p, s, "A", PROMPTS["A"]),
        lambda p, s: f"A has {s.lengths['A']} tokens: an 8-token system prompt and its own 6. Its first "
        f"lookup misses, so it allocates blocks {_blocks(s.last['new'])}, writes K and V, and registers "
        "its three full blocks under their chained prefix hashes. The last block is half full: no hash.",
    ),
    StoryStep(
        "Request B shares the system prompt",
        lambda p, s: prefill(p, s, "B", PROMPTS["B"]),
        lambda p, s: f"B starts with the same 8 tokens. lookup finds blocks {_blocks(s.last['hits'])} "
        "by hash (two hits: their reference counts go to 2, nothing is recomputed); its third block's "
        f"hash differs, a miss. B allocates {_blocks(s.last['new'])} for the rest.",
    ),
    StoryStep(
        "A finishes: a release that caches",
        lambda p, s: finish(p, s, "A"),
        lambda p, s: f"A releases {_blocks(s.last['released'])}, tail first. Block {_blocks(s.last['free'])} "
        f"was never full, so it is free again; block {_blocks(s.last['cached'])} is registered, so at ref 0 "
        "it is cached (it keeps its K, V and hash). Blocks "
        f"{_blocks(s.last['in_use'])} drop to ref 1: B still uses them.",
    ),
    StoryStep(
        "B finishes",
        lambda p, s: finish(p, s, "B"),
        lambda p, s: f"B releases {_blocks(s.last['released'])}: {_blocks(s.last['free'])} is freed, the "
        f"registered {_blocks(s.last['cached'])} join the LRU as the most recent, so oldest first it is now "
        f"{_blocks(p.lru())}. Released tail first, the shared system prompt is the newest and will be "
        "evicted last.",
    ),
    StoryStep(
        "Request C under pressure: the oldest cached block is evicted",
        lambda p, s: prefill(p, s, "C", PROMPTS["C"]),
        lambda p, s: f"C needs 11 blocks. Its system prompt is found by hash (blocks "
        f"{_blocks(s.last['hits'])} leave the LRU with ref 1); it allocates "
        f"{len(s.last['new'])} more: every free block first, then the least recently released cached "
        f"block, evicted: {_blocks(s.last['evicted'])}. Its hash leaves the index; the newer cached "
        f"block {_blocks(p.lru())} survives.",
    ),
]


def replay(k: int, kv=None) -> tuple[KvPool, StoryState]:
    """A fresh story pool of module `kv` taken through steps 1..k."""
    pool, state = story_pool(kv), StoryState()
    for step in STORY[1:k + 1]:
        step.run(pool, state)
    return pool, state


def pool_differences(ref: KvPool, mine: KvPool) -> list[str]:
    """Where pool `mine` differs from `ref`, read through the public interface only (a learner's pool
    has no private fields of ours): per block its state, ref, fill and hash; the LRU, the free list
    and the counts. [] when they agree."""
    out = []
    for b in range(ref.n_blocks):
        a = (str(ref.state(b)), ref.ref(b), ref.fill(b), ref.hash_of(b))
        m = (str(mine.state(b)), mine.ref(b), mine.fill(b), mine.hash_of(b))
        if a != m:
            out.append(f"block {b}: yours {_block_text(m)}, the reference's {_block_text(a)}")
    for what in ("lru", "free_list", "stats"):
        a, m = getattr(ref, what)(), getattr(mine, what)()
        same = dict(a) == dict(m) if what == "stats" else list(a) == list(m)
        if not same:
            out.append(f"{what}(): yours {m}, the reference's {a}")
    return out


def _block_text(t) -> str:
    state, ref, fill, h = t
    return f"{state} ref {ref} fill {fill} h {short_hash(h)}"


def key_value(token: int, h: int) -> float:
    """What the story writes as K of `token` at kv head h: recognisable in the slab (V is minus it)."""
    return token + h / 4



# ---------------------------------------------------------------- the widget


class PositionBox(widgets.Text):
    """The position box: text, so that "abc", "" and "3.7" reach the widget and get an answer in
    words (an IntText drops them in the browser, or reads "3.7" as 37). Python may set an int."""

    value = traitlets.CUnicode("0", help="the position typed").tag(sync=True)


def parse_position(text: str) -> tuple[int | None, str | None]:
    """(the position, None) for a whole number typed, else (None, what is wrong in words)."""
    t = str(text).strip()
    if not t:
        return None, "Type a position: a whole number such as 37."
    try:
        return int(t), None
    except ValueError:
        if n := digits_past_int(t):
            return None, f"Position {quoted(t)} ({n:,} digits) is outside every block table: type one such as 37."
        return None, f"Position {quoted(t)} is not a whole number: type one such as 37."


def _bad_tables(tables, lengths, pool) -> str:
    """What is wrong with BlockMap's tables or lengths in one line ("" when nothing): tables a dict of
    name -> list of the pool's block ids, lengths a dict of name -> a count of tokens."""
    n = getattr(pool, "n_blocks", None)
    if tables is not None:
        if not isinstance(tables, dict):
            return f"tables must be a dict of name -> list of block ids, not {type(tables).__name__}"
        for name, t in tables.items():
            if isinstance(t, (str, bytes)) or not isinstance(t, (list, tuple, np.ndarray)):
                return f"tables[{str(name)[:30]!r}] must be a list of block ids, not {type(t).__name__} {str(t)[:30]!r}"
            for b in t:
                if isinstance(b, bool) or not isinstance(b, (int, np.integer)):  # one outside the pool is said in words
                    return (f"tables[{str(name)[:30]!r}] holds {str(b)[:30]!r}: a block id is a whole number "
                            f"0 .. {n - 1 if n else '?'}")
    if lengths is not None:
        if not isinstance(lengths, dict):
            return f"lengths must be a dict of name -> tokens, not {type(lengths).__name__}"
        for name, v in lengths.items():
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
                return f"lengths[{str(name)[:30]!r}] must be a count of tokens (0 or more), not {str(v)[:30]!r}"
    return ""


class BlockMap(CellWidget):
    """The pool as a grid (`grid.value`, HTML with an SVG), the story's caption and buttons, and the
    "where a key lands" panel (`where.value`) driven by `seq` (a Dropdown) and `position` (text).

    Story mode (the default) owns its pool: `next_button`, `back_button`, `reset_button` step through
    STORY (`step` is the index shown). `from_pool(pool, tables)` draws any pool; call `refresh()`
    after changing the pool or `tables` (name -> list of pool block ids), or pass snapshot=True to
    draw a copy that stays as it was when the map was made.
    """

    def __init__(self, pool: KvPool | None = None, tables: dict | None = None, *,
                 lengths: dict | None = None, layer: int = 0, story: bool | None = None, yours=None):
        self.story = pool is None if story is None else story
        # the learner's kv module (chapter "your turn"): the story also runs on its pool, drawn beside
        # the reference's (which is then the reference file's, whatever tl_lab.kv is in this process)
        self.yours = yours if self.story else None
        self.kv = None if self.yours is None else _reference_kv()
        self.yours_pool, self.yours_differences = None, []  # after each step; None if none or it raised
        self.yours_tables: dict[str, list[int]] = {}
        self.yours_grid, self.compare = widgets.HTML(), widgets.HTML()
        self.pool = pool if pool is not None else story_pool(self.kv)
        self.state = StoryState()
        self.message = _bad_tables(tables, lengths, self.pool)  # said in the map, never raised (issue #61)
        self._tables, self._lengths = ({}, {}) if self.message else (dict(tables or {}), dict(lengths or {}))
        self.step = 0
        self._quiet = False
        self.grid = widgets.HTML()
        self.caption = widgets.HTML()
        self.where = widgets.HTML()
        self.back_button = widgets.Button(description="◀ back", layout=widgets.Layout(width="90px"))
        self.next_button = widgets.Button(description="next ▶", button_style="primary",
                                          layout=widgets.Layout(width="90px"))
        self.reset_button = widgets.Button(description="reset", layout=widgets.Layout(width="90px"))
        self.seq = widgets.Dropdown(description="sequence", layout=widgets.Layout(width="200px"))
        self.position = PositionBox(description="position", layout=widgets.Layout(width="180px"))
        self.layer = widgets.Dropdown(options=list(range(self.pool.n_layers)), value=layer,
                                      description="layer", layout=widgets.Layout(width="150px"))
        self.back_button.on_click(lambda _: self.goto(self.step - 1))
        self.next_button.on_click(lambda _: self.goto(self.step + 1))
        self.reset_button.on_click(lambda _: self.goto(0))
        for w in (self.seq, self.position, self.layer):
            w.observe(lambda _: self._redraw(), names="value")
        # attributes, shown or not: closing the map closes them (CellWidget), else a hidden row of buttons
        # would stay registered and its callbacks keep the map, and its copy of a pool, alive
        self.buttons = widgets.HBox([self.back_button, self.next_button, self.reset_button])
        self.picker = widgets.HBox([self.seq, self.position, self.layer])
        top = [self.buttons, self.caption] if self.story else []
        grids = [self.grid] if self.yours is None else [self.compare, widgets.HBox([
            widgets.VBox([widgets.HTML("<b>the reference's pool</b>"), self.grid]),
            widgets.VBox([widgets.HTML("<b>your pool</b>"), self.yours_grid])])]
        super().__init__(top + grids + [self.picker, self.where])
        if self.story:
            self.goto(0)
        else:
            self.refresh()
        if self.message:
            self.grid.value = message(self.message) + self.grid.value

    @classmethod
    def from_pool(cls, pool: KvPool, tables: dict | None = None, *, lengths: dict | None = None,
                  layer: int = 0, snapshot: bool = False) -> "BlockMap":
        """A map of `pool` with `tables` (sequence name -> block table); `lengths` (name -> tokens)
        marks positions past a sequence's length as not written yet. snapshot=True draws a copy of
        the pool and tables taken now, so later changes (a request finishing) do not redraw it."""
        if snapshot:
            pool, tables = copy.deepcopy(pool), copy.deepcopy(tables)
        return cls(pool, tables, lengths=lengths, layer=layer, story=False)

    @property
    def tables(self) -> dict[str, list[int]]:
        return self.state.tables if self.story else self._tables

    @property
    def lengths(self) -> dict[str, int]:
        return self.state.lengths if self.story else self._lengths

    # ------------------------------------------------------------ the story

    def goto(self, k: int) -> None:
        """Show story step k (clamped to the story): a fresh pool replayed through steps 1..k; a k that is not
        a whole number (nan, "2", 1.5) is a message in the caption, the step shown unchanged."""
        if isinstance(k, bool) or not isinstance(k, (int, float, np.integer, np.floating)) or not math.isfinite(k) \
                or k != int(k):
            self.message = f"goto needs a step number 0 .. {len(STORY) - 1}, not {str(k)[:40]!r}"
            self.caption.value = message(self.message)
            return
        k = max(0, min(int(k), len(STORY) - 1))
        self.pool, self.state = replay(k, self.kv)
        self.step = k
        self._yours_at(k)
        step = STORY[k]
        self.caption.value = (
            f"<p><b>Step {k} of {len(STORY) - 1}: {html.escape(step.title)}</b><br>"
            f"{html.escape(step.say(self.pool, self.state))}</p>"
        )
        self.back_button.disabled = k == 0
        self.next_button.disabled = k == len(STORY) - 1
        self.refresh(fit=True)

    def _yours_at(self, k: int) -> None:
        """The same steps on the learner's pool: drawn beside, and where it differs said in words."""
        if self.yours is None:
            return
        self.yours_pool, self.yours_differences = None, []
        try:
            pool, state = replay(k, self.yours)
            self.yours_differences = pool_differences(self.pool, pool)
            render(pool, state.tables)  # drawing reads every view the map needs: an error shows here
            self.yours_pool, self.yours_tables = pool, state.tables
        except Exception as exc:  # noqa: BLE001: the learner's code; its error is what to show
            from tl_lab.lab.exercise.side import raised

            self.yours_grid.value = ""
            self.compare.value = message(f"step {k}: {raised(exc, self.yours, 'kv')}")
            return
        self.compare.value = (
            f"<p class='tl-yours' style='{MONO}'><b>yours:</b> after step {k} your pool is the reference's: the same "
            "states, refs, fills, hashes, LRU, free list and counts</p>" if not self.yours_differences else
            f"<p class='tl-yours' style='{MONO}'><b>yours after step {k}: DIFFERENT</b><br>"
            + "<br>".join(html.escape(d) for d in self.yours_differences) + "</p>")

    # ------------------------------------------------------------ drawing

    def refresh(self, fit: bool = False) -> None:
        """Re-read the pool and the tables; keep the selected sequence when it still exists.
        fit: move a position outside the selected sequence to its last written one (a story step
        changed the sequences under the controls; the learner did not type it)."""
        names = list(self.tables)
        keep = self.seq.value if self.seq.value in names else (names[-1] if names else None)
        self._quiet = True  # one redraw below, not one per trait change
        try:
            self.seq.options = names
            self.seq.value = keep
            if fit and keep is not None:
                self._fit_position(keep)
        finally:
            self._quiet = False
        self._redraw()

    def _fit_position(self, seq: str) -> None:
        pos, _ = parse_position(self.position.value)
        held = len(self.tables[seq]) * self.pool.block_tokens
        if pos is None or not 0 <= pos < held:
            self.position.value = str(max(0, self.lengths.get(seq, held) - 1))

    def _redraw(self) -> None:
        if self._quiet:
            return
        loc = self.locate()
        self.where.value = loc["html"]
        self.grid.value = render(self.pool, self.tables, loc.get("block"), loc.get("slot"), loc.get("seq"))
        if self.yours_pool is not None:  # the same selection on the learner's pool
            self.yours_grid.value = render(self.yours_pool, self.yours_tables, loc.get("block"), loc.get("slot"),
                                           loc.get("seq"))

    def locate(self, seq: str | None = None, position: int | None = None) -> dict:
        """Where the key of `position` of sequence `seq` (default: the controls) lands.

        A dict with `html` (what the panel shows) and, when the position is inside the table,
        `index`, `block`, `slot` and `offsets` (one flat K-slab element offset per kv head).
        """
        seq = self.seq.value if seq is None else seq
        if seq is None or seq not in self.tables:
            return {"html": message("No sequence holds blocks now: step the story, or give tables.", NOTE)}
        pos, problem = parse_position(self.position.value if position is None else position)
        if problem:
            return {"html": message(problem)}
        table, B, D = self.tables[seq], self.pool.block_tokens, self.pool.D
        try:
            index, block, slot = key_location(table, pos, B)
        except KvError:
            held = f"positions 0 to {len(table) * B - 1}" if table else "no position"  # not "0 to -1"
            return {"html": message(
                f"Position {pos} is outside sequence {seq}'s block table: {len(table)} blocks of "
                f"B = {B} hold {held}.")}
        if not 0 <= block < self.pool.n_blocks:  # any tables are drawn (the grid marks such an entry free)
            return {"html": message(
                f"Position {pos} of sequence {seq} is in entry {index} of its block table, block {block}: "
                f"not a block of this pool, whose blocks are 0 to {self.pool.n_blocks - 1}.")}
        layer = self.layer.value
        offsets = [slab_offset(h, slot, B, D) for h in range(self.pool.H_kv)]
        written = pos < self.lengths[seq] if seq in self.lengths else slot < self.pool.fill(block)
        out = _where_html(self.pool, seq, pos, (index, block, slot), layer, offsets, written)
        return {"html": out, "seq": seq, "index": index, "block": block, "slot": slot, "offsets": offsets}


def _reference_kv():
    from tl_lab.lab.exercise.side import reference

    return reference("kv")


def _where_html(pool: KvPool, seq: str, pos: int, loc: tuple[int, int, int], layer: int,
                offsets: list[int], written: bool) -> str:
    """The panel for a position inside its table: the arithmetic, then K[0] and V[0] read from the
    slab at each kv head's offset, and a note when the position holds no key yet."""
    (index, block, slot), B, D = loc, pool.block_tokens, pool.D  # seq: any key of the tables, shown as str()
    K, V = pool.slab(block, layer, False).ravel(), pool.slab(block, layer, True).ravel()
    rows = "".join(
        f"<tr><td>{h}</td><td>({h} · {B} + {slot}) · {D} = <b>{off}</b></td>"
        f"<td>{_val(K[off])}</td><td>{_val(V[off])}</td></tr>"
        for h, off in enumerate(offsets)
    )
    note = "" if written else (
        f"<p style='color:{NOTE}'>Not written yet: the block holds {pool.fill(block)} of "
        f"{B} positions; the slab there holds whatever was left in it.</p>")
    return (
        f"<div class='tl-where' data-seq='{html.escape(str(seq))}' data-position='{pos}' "
        f"data-index='{index}' data-block='{block}' data-slot='{slot}' style='{MONO}'>"
        f"<p>Sequence {html.escape(str(seq))}, position {pos}: block table index {pos} // {B} = "
        f"<b>{index}</b> → pool block <b>{block}</b>, slot {pos} % {B} = <b>{slot}</b>.</p>"
        f"<table style='border-spacing: 14px 2px'><tr><th>kv head h</th><th>element of layer {layer}'s "
        f"K slab of block {block}</th><th>K[0] there</th><th>V[0] there</th></tr>{rows}</table>{note}</div>"
    )


def show(pool: KvPool, tables: dict | None = None, **kw) -> BlockMap:
    """Display a block map of `pool` and `tables` in the notebook and return it."""
    from IPython.display import display

    bm = BlockMap.from_pool(pool, tables, **kw)  # snapshot=True: a copy frozen at this moment
    display(bm)
    return bm


def _val(bits) -> str:
    return f"{f16_to_f32(int(bits)):g}"


def short_hash(h: int | None) -> str:
    """The first 6 hex digits of a 64-bit hash, or a dash."""
    return "—" if h is None else f"{h:016x}"[:6]


BOX_W, ROW_H, TABLE_X = 34, 34, 60  # a block-table entry, a table's row, where entries start


def render(pool: KvPool, tables: dict, sel_block=None, sel_slot=None, sel_seq=None) -> str:
    """The grid, the tables pointing into it, the LRU order and the counts, as HTML with an SVG."""
    n = pool.n_blocks
    drawn = min(n, MAX_DRAWN)
    cols = n if n <= 8 else 6 if n <= 12 else 8 if n <= 64 else 16
    grid_h = GAP + blocks_for(drawn, cols) * (CELL_H + GAP)  # rows of `cols` cells
    lru_rank = {b: i + 1 for i, b in enumerate(pool.lru())}
    where = {b: (GAP + (b % cols) * (CELL_W + GAP), GAP + (b // cols) * (CELL_H + GAP)) for b in range(drawn)}
    parts = [_cell(pool, b, x, y, lru_rank.get(b), b == sel_block, sel_slot) for b, (x, y) in where.items()]
    y0 = grid_h + 40
    lines, entries = _tables_svg(pool, tables, where, y0, sel_block, sel_seq)
    table_w = TABLE_X + max((len(t) for t in tables.values()), default=0) * (BOX_W + 4)
    width = max(GAP + cols * (CELL_W + GAP), table_w + GAP)
    height = y0 + len(tables) * ROW_H + GAP if tables else grid_h
    svg = (f"<svg class='tl-blockmap' xmlns='http://www.w3.org/2000/svg' width='{width}' "
           f"height='{height}' style='font-family: sans-serif'>{''.join(lines + parts + entries)}</svg>")
    more = f"<p>… and {n - drawn} more blocks, not drawn.</p>" if n > drawn else ""
    return _frame(pool, svg + more)


def _tables_svg(pool: KvPool, tables: dict, where: dict, y0: int, sel_block, sel_seq) -> tuple[list, list]:
    """Each table as a row of entries below the grid, a faint line from each entry up to its block."""
    lines, parts = [], []
    for r, (name, table) in enumerate(tables.items()):
        colour = SEQ_COLOURS[r % len(SEQ_COLOURS)]
        y = y0 + r * ROW_H
        parts.append(f"<text x='{GAP}' y='{y + 21}' font-size='14' font-weight='bold' fill='{colour}'>"
                     f"{html.escape(str(name))}</text>")
        for i, b in enumerate(table):
            x = TABLE_X + i * (BOX_W + 4)
            if b in where:  # a line from the table entry up to the block it points at
                bx, by = where[b]
                lines.append(f"<line x1='{x + BOX_W / 2}' y1='{y}' x2='{bx + CELL_W / 2}' "
                             f"y2='{by + CELL_H}' stroke='{colour}' stroke-opacity='0.35'/>")
            sel = name == sel_seq and b == sel_block
            st = str(pool.state(b)) if 0 <= b < pool.n_blocks else "free"
            parts.append(
                f"<g class='tl-entry' data-seq='{html.escape(str(name))}' data-index='{i}' data-block='{b}'>"
                f"<rect x='{x}' y='{y + 4}' width='{BOX_W}' height='24' rx='3' fill='{COLOURS[st]}' "
                f"stroke='{HIGHLIGHT if sel else colour}' stroke-width='{3 if sel else 1.5}'/>"
                f"<text x='{x + BOX_W / 2}' y='{y + 21}' font-size='12' text-anchor='middle'>{b}</text></g>")
    if tables:
        parts.append(f"<text x='{GAP}' y='{y0 - 12}' font-size='12' fill='#374151'>block tables "
                     "(entry i holds positions i·B to i·B + B − 1):</text>")
    return lines, parts


def _frame(pool: KvPool, body: str) -> str:
    """The legend above the drawing, the LRU order and the pool's counts below it."""
    s, lru = pool.stats(), pool.lru()
    legend = " ".join(
        f"<span style='background:{COLOURS[k]};border:1px solid {STROKE[k]};padding:0 6px'>{k}</span>"
        for k in COLOURS)
    lru_text = " → ".join(str(b) for b in lru) if lru else "empty"
    return (
        f"<div class='tl-blockmap' style='{MONO}'><p>{legend} &nbsp; B = {pool.block_tokens}, "
        f"{pool.n_layers} layer(s), {pool.H_kv} kv head(s) of D = {pool.D}</p>{body}"
        f"<p class='tl-lru'>LRU, oldest first (evicted first): <b>{lru_text}</b></p>"
        f"<p class='tl-stats'>free {s['free']} · in use {s['in_use']} · cached {s['cached']} · "
        f"registered {s['registered']} · lookups {s['lookups']} (hits {s['hits']}) · "
        f"evictions {s['evictions']}</p></div>"
    )


def _cell(pool: KvPool, b: int, x: int, y: int, lru_rank, selected: bool, sel_slot) -> str:
    st, ref, fill, h = str(pool.state(b)), pool.ref(b), pool.fill(b), pool.hash_of(b)
    B = pool.block_tokens
    stroke = HIGHLIGHT if selected else STROKE[st]
    out = [
        f"<g class='tl-block' data-block='{b}' data-state='{st}' data-ref='{ref}' data-fill='{fill}' "
        f"data-hash='{short_hash(h)}'>",
        f"<rect x='{x}' y='{y}' width='{CELL_W}' height='{CELL_H}' rx='5' fill='{COLOURS[st]}' "
        f"stroke='{stroke}' stroke-width='{3 if selected else 1}'/>",
        f"<text x='{x + 6}' y='{y + 15}' font-size='13' font-weight='bold'>#{b}</text>",
        f"<text x='{x + CELL_W - 6}' y='{y + 15}' font-size='11' text-anchor='end'>ref {ref}</text>",
        f"<text x='{x + 6}' y='{y + 31}' font-size='11'>fill {fill}/{B}</text>",
        f"<text x='{x + 6}' y='{y + 46}' font-size='11' font-family='monospace'>h {short_hash(h)}</text>",
    ]
    if lru_rank is not None:
        out.append(f"<text x='{x + CELL_W - 6}' y='{y + 31}' font-size='11' text-anchor='end' "
                   f"fill='{STROKE['cached']}'>LRU {lru_rank}</text>")
    w = (CELL_W - 12) / max(B, 1)
    for j in range(B):  # one square per slot, dark where a key is written
        sel = selected and j == sel_slot
        fill_c = HIGHLIGHT if sel else ("#374151" if j < fill else "#ffffff")
        out.append(f"<rect x='{x + 6 + j * w:.1f}' y='{y + 54}' width='{max(w - 1, 1):.1f}' height='9' "
                   f"fill='{fill_c}' stroke='#6b7280' stroke-width='0.5'/>")
    out.append("</g>")
    return "".join(out)
