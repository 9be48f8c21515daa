"""tl_lab/engine/blocks.py at every limit (issue 62): each count and capacity comparison of the block manager
tested exactly at its limit, one under and one over, on a pool of 1-layer, 1-head, D = 1 blocks of
B = 4 positions.

The comparisons (file:function: the comparison), each pinned by the test named after it:

    blocks.py:blocks_for: -(-n // B) (ceil)                             test_blocks_for_at_a_block_boundary
    blocks.py:cacheable: (P - 1) // B * B                               test_cacheable_at_a_block_boundary
    blocks.py:BlockManager.admit: tokens[:reuse], first miss ends       test_admit_takes_the_full_blocks_it_finds
    blocks.py:BlockManager.reserve: max(0, blocks_for(n) - len(table))  test_reserve_at_a_block_boundary
    blocks.py:BlockManager.fill: range(start // B, blocks_for(end))     test_fill_covers_exactly_the_blocks_written
    blocks.py:BlockManager.fill: want = min(B, end - j * B)             test_fill_covers_exactly_the_blocks_written
    blocks.py:BlockManager.fill: pool.fill(b) < want (never lowered)    test_fill_never_lowers_a_fill
    blocks.py:BlockManager.written: range(len(hashes), end // B)        test_written_registers_exactly_the_full_blocks
    blocks.py:BlockManager.temporary: max(1, blocks_for(n))             test_temporary_gives_an_empty_sequence_one_block
    blocks.py:BlockManager.temporary: sum(need) > pool.available()      test_temporary_at_the_pool_size

One comparison no test can tell apart (docs/dev/mutation.md): `pool.fill(b) < want` as `<=` sets a
fill to the value it already has.
"""

from __future__ import annotations

import pytest

from tl_lab.engine.blocks import BlockManager, blocks_for, cacheable
from tl_lab.errors import KvError
from tl_lab.kv import KvCfg, KvPool, prefix_hashes

B = 4


def manager(n_blocks=8, prefix_cache=True) -> BlockManager:
    return BlockManager(KvPool(KvCfg(n_blocks, B, 1, 1, 1), prefix_cache=prefix_cache))


@pytest.mark.parametrize("n, blocks", [(0, 0), (1, 1), (3, 1), (4, 1), (5, 2), (7, 2), (8, 2), (9, 3)])
def test_blocks_for_at_a_block_boundary(n, blocks):
    assert blocks_for(n, B) == blocks == manager().blocks_for(n)


@pytest.mark.parametrize("P, positions", [(1, 0), (3, 0), (4, 0), (5, 4), (7, 4), (8, 4), (9, 8)])
def test_cacheable_at_a_block_boundary(P, positions):
    """The full blocks before the last prompt token: a prompt ending on a boundary keeps its last block."""
    assert cacheable(P, B) == positions


def registered(m: BlockManager, tokens) -> list[int]:
    """Run `tokens` through a sequence (reserve, written) and release it: its full blocks are cached."""
    seq = m.admit(tokens, 0)
    m.reserve(seq, len(tokens))
    m.written(seq, tokens, len(tokens))
    table = list(seq.table)
    m.release(seq)
    return table


@pytest.mark.parametrize("reuse, hits", [(0, 0), (3, 0), (4, 1), (5, 1), (7, 1), (8, 2), (9, 2), (12, 2)])
def test_admit_takes_the_full_blocks_it_finds(reuse, hits):
    """8 tokens registered (2 blocks): admit finds min(reuse // B, 2) of them, allocates nothing (a reuse
    short of a boundary, which `cacheable` never gives, supplies only the full blocks inside it)."""
    m = manager()
    tokens = list(range(12))
    table = registered(m, tokens[:8])
    free = m.pool.stats()["free"]
    seq = m.admit(tokens, reuse)
    assert (seq.hits, seq.written, seq.table) == (hits, hits * B, table[:hits])
    assert m.pool.stats()["free"] == free


@pytest.mark.parametrize("held, n, new", [(0, 0, 0), (0, 1, 1), (1, 3, 0), (1, 4, 0), (1, 5, 1), (2, 8, 0),
                                          (2, 9, 1), (2, 4, 0), (3, 4, 0)])
def test_reserve_at_a_block_boundary(held, n, new):
    """A table of `held` blocks reserved for n positions gets max(0, ceil(n / B) - held) new blocks."""
    m = manager()
    seq = m.admit([], 0)
    seq.table = m.pool.alloc(held)
    got = m.reserve(seq, n)
    assert len(got) == new and len(seq.table) == held + new


@pytest.mark.parametrize("start, end, fills", [
    (0, 3, [3, 0, 0]), (0, 4, [4, 0, 0]), (0, 5, [4, 1, 0]),
    (3, 4, [4, 0, 0]), (4, 5, [0, 1, 0]), (4, 8, [0, 4, 0]), (7, 9, [0, 4, 1]),
])
def test_fill_covers_exactly_the_blocks_written(start, end, fills):
    """Positions start .. end-1 written: each block holding one of them covers it; no other block moves.
    (Blocks before start // B are not touched, even when they hold nothing: the caller wrote them.)"""
    m = manager()
    table = m.pool.alloc(3)
    m.fill(table, start, end)
    assert [m.pool.fill(b) for b in table] == fills


def test_fill_never_lowers_a_fill():
    m = manager()
    table = m.pool.alloc(2)
    m.fill(table, 0, 7)
    m.fill(table, 4, 7)  # what the block holds already
    m.fill(table, 4, 6)  # one short of it
    m.fill(table, 4, 5)
    assert [m.pool.fill(b) for b in table] == [4, 3]


@pytest.mark.parametrize("end, full", [(3, 0), (4, 1), (5, 1), (7, 1), (8, 2), (9, 2)])
def test_written_registers_exactly_the_full_blocks(end, full):
    m = manager()
    tokens = list(range(12))
    seq = m.admit(tokens, 0)
    m.reserve(seq, end)
    m.written(seq, tokens, end)
    assert seq.hashes == prefix_hashes(tokens[:end], B)[:full] and len(seq.hashes) == full
    assert [m.pool.hash_of(b) is not None for b in seq.table] == [True] * full + [False] * (len(seq.table) - full)
    assert seq.written == end
    assert [m.pool.fill(b) for b in seq.table] == [min(B, end - j * B) for j in range(len(seq.table))]


def test_written_never_moves_the_written_mark_back():
    m = manager()
    tokens = list(range(12))
    seq = m.admit(tokens, 0)
    m.reserve(seq, 9)
    m.written(seq, tokens, 9)
    m.written(seq, tokens, 5)
    assert seq.written == 9 and len(seq.hashes) == 2


def test_temporary_gives_an_empty_sequence_one_block():
    m = manager(n_blocks=3)
    with m.temporary([0, 1, 4]) as tables:
        assert [len(t) for t in tables] == [1, 1, 1]
    assert m.pool.available() == 3


@pytest.mark.parametrize("lengths, fits", [
    ([8, 3], True),      # 2 + 1 blocks of the 4 available: one under
    ([8, 8], True),      # 4 blocks: exactly the pool
    ([8, 9], False),     # 5 blocks: one over
])
def test_temporary_at_the_pool_size(lengths, fits):
    """A pool of 5 blocks with 1 in use: 4 available."""
    m = manager(n_blocks=5)
    held = m.pool.alloc(1)
    if fits:
        with m.temporary(lengths) as tables:
            assert [len(t) for t in tables] == [blocks_for(n, B) for n in lengths]
    else:
        with pytest.raises(KvError, match=r"^17 positions need 5 KV blocks of B = 4; the pool has 4 available of 5$"):
            with m.temporary(lengths):
                pass
    assert m.pool.available() == 4 and m.pool.ref(held[0]) == 1
