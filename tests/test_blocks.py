"""tl_lab/engine/blocks.py: one owner for a sequence's blocks (admit through the prefix cache, reserve,
fill, written, release, temporary), on small pools."""

import pytest

from tl_lab.engine.blocks import BlockManager, SeqBlocks, blocks_for, cacheable
from tl_lab.errors import KvError
from tl_lab.kv import KvCfg, KvPool, prefix_hashes

B = 4


def manager(n_blocks=8, prefix_cache=True) -> BlockManager:
    return BlockManager(KvPool(KvCfg(n_blocks, B, 1, 1, 2), prefix_cache=prefix_cache))


def state(pool: KvPool):
    return (pool.stats(), pool.free_list(), pool.lru(),
            [(pool.ref(b), pool.fill(b), pool.hash_of(b)) for b in range(pool.n_blocks)])


def run(blocks: BlockManager, tokens, reuse=None) -> SeqBlocks:
    """What the engine does for a whole prompt in one step: admit, reserve, (forward), written."""
    seq = blocks.admit(tokens, cacheable(len(tokens), B) if reuse is None else reuse)
    blocks.reserve(seq, len(tokens))
    blocks.written(seq, tokens, len(tokens))
    return seq


def test_blocks_for_and_cacheable():
    assert [blocks_for(n, 4) for n in (0, 1, 4, 5, 8, 9)] == [0, 1, 1, 2, 2, 3]
    # the block holding the last prompt token is never looked up
    assert [cacheable(n, 4) for n in (1, 4, 5, 8, 9, 14)] == [0, 0, 4, 4, 8, 12]


def test_written_fills_and_registers_full_blocks_under_chained_hashes():
    blocks = manager()
    pool, tokens = blocks.pool, list(range(10, 24))  # 14 tokens: 3 full blocks and 2 positions
    seq = run(blocks, tokens)
    assert len(seq.table) == 4 and seq.hits == 0 and seq.written == 14
    assert seq.hashes == prefix_hashes(tokens, B)
    assert [pool.fill(b) for b in seq.table] == [4, 4, 4, 2]
    assert [pool.hash_of(b) for b in seq.table] == seq.hashes + [None]
    # a decode step: position 14 written, then 15 completes the last block, which registers
    tokens += [99, 98]
    blocks.written(seq, tokens, 15)
    assert pool.fill(seq.table[3]) == 3 and pool.hash_of(seq.table[3]) is None
    blocks.written(seq, tokens, 16)
    assert pool.hash_of(seq.table[3]) == prefix_hashes(tokens, B)[3] == seq.hashes[3]


def test_admit_finds_a_shared_prefix_and_stops_at_the_first_miss():
    blocks = manager()
    pool = blocks.pool
    first = run(blocks, list(range(12)) + [1])  # 13 tokens: 3 full blocks registered
    first_table = list(first.table)
    blocks.release(first)
    assert pool.stats()["cached"] == 3
    other = list(range(8)) + [50, 51, 52, 53, 54]  # shares 2 blocks, then differs
    seq = blocks.admit(other, cacheable(len(other), B))
    assert seq.table == first_table[:2] and seq.hits == 2 and seq.written == 8
    assert pool.stats()["hits"] == 2 and pool.stats()["lookups"] == 1 + 3  # first's miss, then hit, hit, miss
    assert all(pool.ref(b) == 1 for b in seq.table)
    new = blocks.reserve(seq, len(other))
    assert len(new) == 2 and seq.table[2:] == new


def test_blocks_written_after_a_cache_hit_chain_to_the_hit():
    """A sequence admitted with a hit on block 0 then writes block 1: it registers under the hash
    chained to block 0's, never under the hash of a first block (mutation testing, issue 20: admit
    forgetting the hit's hash went unnoticed, and then a prompt starting with block 1's tokens would
    get K and V computed at positions 4 .. 7 as if they were 0 .. 3)."""
    blocks = manager()
    pool = blocks.pool
    x, y = [1, 2, 3, 4], [5, 6, 7, 8]
    blocks.release(run(blocks, x + [0]))  # block x registered and cached
    seq = run(blocks, x + y + [0])
    assert seq.hits == 1 and seq.hashes == prefix_hashes(x + y, B)
    assert pool.hash_of(seq.table[1]) == prefix_hashes(x + y, B)[1]
    before = pool.stats()["hits"]
    assert blocks.admit(y + [0], B).hits == 0 and pool.stats()["hits"] == before  # y alone is not cached


def test_reserve_is_all_or_nothing():
    blocks = manager(n_blocks=3)
    seq = blocks.admit([1, 2, 3], 0)
    before = state(blocks.pool)
    with pytest.raises(KvError, match="alloc"):
        blocks.reserve(seq, 13)  # 4 blocks of 3
    assert state(blocks.pool) == before and seq.table == []
    assert blocks.reserve(seq, 12) == [0, 1, 2] and blocks.reserve(seq, 12) == []


def test_release_gives_everything_back_tail_first():
    blocks = manager()
    seq = run(blocks, list(range(9)))
    table = list(seq.table)
    assert blocks.release(seq) == table[::-1]
    assert seq.table == [] and seq.hashes == [] and seq.written == 0
    assert blocks.pool.lru() == table[:2][::-1]  # the head released last: the newest in the LRU
    assert blocks.pool.stats()["in_use"] == 0


def test_a_hash_held_by_another_block_leaves_ours_private():
    blocks = manager()
    a = run(blocks, list(range(5)))
    b = run(blocks, list(range(5)), reuse=0)  # admitted without lookup: its first block duplicates a's
    assert blocks.pool.hash_of(b.table[0]) is None and b.hashes == a.hashes
    blocks.release(a)
    blocks.release(b)
    assert blocks.pool.stats()["in_use"] == 0 and blocks.pool.stats()["cached"] == 1


def test_temporary_blocks_come_back_even_on_an_error_and_a_refusal_changes_nothing():
    blocks = manager(n_blocks=6)
    pool = blocks.pool
    with blocks.temporary([5, 1, 0]) as tables:
        assert [len(t) for t in tables] == [2, 1, 1]  # at least one block each
        assert sorted(sum(tables, [])) == [0, 1, 2, 3] and pool.stats()["in_use"] == 4
    assert pool.stats()["in_use"] == 0 and pool.stats()["free"] == 6
    with pytest.raises(RuntimeError, match="boom"):
        with blocks.temporary([8]):
            raise RuntimeError("boom")
    assert pool.stats()["in_use"] == 0
    before = state(pool)
    with pytest.raises(KvError, match=r"25 positions need 7 KV blocks of B = 4; the pool has 6 available of 6"):
        with blocks.temporary([20, 5]):
            pass
    assert state(pool) == before  # nothing allocated, the free list not rotated
