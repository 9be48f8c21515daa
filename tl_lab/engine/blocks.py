"""One owner for a sequence's KV blocks: the chapter's block manager (L10.4) in its smallest form.

Chapter L10.1, section 2.2 (the pool's blocks, references, the prefix hash index) and section 2.4
(position j of a sequence lives in block table[j // B]). The pool (`tl_lab.kv.KvPool`) knows blocks;
this module knows sequences: which blocks a sequence holds, which of them are full and under which
chained prefix hash, and how many positions hold K and V. The runner (`run_once`, `last_logits`, the
fill after a forward), the engine loop (`tl_lab.engine.generate`) and the block-map story
(`tl_lab.lab.widgets.blockmap`) all go through it, so the three tell one story.

    blocks = BlockManager(pool)
    seq = blocks.admit(prompt, reuse=cacheable(len(prompt), B))   # prefix-cache hits, no allocation
    blocks.reserve(seq, len(prompt))                                # the rest of the prompt's blocks
    ... the forward writes positions seq.written .. len(prompt) - 1 ...
    blocks.written(seq, prompt, len(prompt))                        # fill, then register full blocks
    blocks.release(seq)                                             # tail first

    with blocks.temporary([len(p) for p in prompts]) as tables:     # given back even on an error
        ...

Decisions (what nano-vllm's BlockManager does too):
- A sequence's table only grows while it runs; `release` gives every block back, tail first, so the
  LRU evicts a finished prompt's tail before its head (the head is what other requests share).
- The lookup is a chain: the first miss ends the shared prefix (block i's hash includes block i-1's).
- `written` sets the fill of every block it covers that is not registered yet, and registers each
  block that became full under its chained hash. `register` returning False (another block holds
  the same hash) leaves ours private; it is still released normally.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tl_lab.kv import KvPool, prefix_hash, prefix_hashes
from tl_lab.ops.paging import blocks_for, cacheable, fill_table, give_back, temporary_tables

__all__ = ["blocks_for", "cacheable", "SeqBlocks", "BlockManager"]


@dataclass
class SeqBlocks:
    """One sequence's blocks. table: pool block ids (position j in table[j // B]); hashes: the
    chained prefix hash of each full block so far (hashes[i] belongs to table[i]); written:
    positions 0 .. written-1 hold K and V; hits: how many leading blocks came from the prefix cache."""

    table: list[int] = field(default_factory=list)
    hashes: list[int] = field(default_factory=list)
    written: int = 0
    hits: int = 0


class BlockManager:
    """A sequence's way into the pool: admit, reserve, mark written, release (module docstring)."""

    def __init__(self, pool: KvPool):
        self.pool = pool
        self.B = pool.block_tokens

    def blocks_for(self, n_positions: int) -> int:
        return blocks_for(n_positions, self.B)

    def admit(self, tokens, reuse: int) -> SeqBlocks:
        """A new sequence holding the blocks of tokens[:reuse] found by prefix hash (one reference
        each, taken with `pool.lookup`); nothing allocated. reuse: positions the cache may supply,
        a multiple of B (`cacheable` for a prompt)."""
        seq = SeqBlocks()
        for h in prefix_hashes(tokens[:reuse], self.B):
            b = self.pool.lookup(h)
            if b is None:
                break  # a chain: the first miss ends the shared prefix
            seq.table.append(b)
            seq.hashes.append(h)
        seq.hits = len(seq.table)
        seq.written = seq.hits * self.B
        return seq

    def reserve(self, seq: SeqBlocks, n_positions: int) -> list[int]:
        """Allocate the blocks seq's table lacks to hold positions 0 .. n-1; -> the new block ids
        (all or nothing: KvError from `pool.alloc` and the table unchanged)."""
        new = self.pool.alloc(max(0, self.blocks_for(n_positions) - len(seq.table)))
        seq.table.extend(new)
        return new

    def fill(self, table, start: int, end: int) -> None:
        """Raise the fill of the blocks holding positions start .. end-1 (`ops.paging.fill_table`)."""
        fill_table(self.pool, table, start, end)

    def written(self, seq: SeqBlocks, tokens, end: int) -> None:
        """Positions 0 .. end-1 of seq now hold K and V (tokens: at least its first `end` ids):
        fill the blocks, and register each block that became full under its chained hash."""
        self.fill(seq.table, len(seq.hashes) * self.B, end)
        for j in range(len(seq.hashes), end // self.B):
            parent = seq.hashes[-1] if seq.hashes else None
            seq.hashes.append(prefix_hash(parent, tokens[j * self.B:(j + 1) * self.B]))
            self.pool.register(seq.table[j], seq.hashes[-1])  # False: another block holds it
        seq.written = max(seq.written, end)

    def release(self, seq: SeqBlocks) -> list[int]:
        """Give every block of seq back, tail first; -> the ids in the order released."""
        order = self.give_back(seq.table)
        seq.table, seq.hashes, seq.written = [], [], 0
        return order

    def give_back(self, table: list[int]) -> list[int]:
        """Release one reference to each block of `table`, tail first; -> that order."""
        return give_back(self.pool, table)

    def temporary(self, lengths):
        """Block tables for sequences of `lengths` positions, given back when the block ends
        (`ops.paging.temporary_tables`)."""
        return temporary_tables(self.pool, lengths)
