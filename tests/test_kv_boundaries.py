"""tl_lab/kv.py at every limit (issue 62): each range, count and capacity comparison of the pool tested
exactly at its limit, one under and one over, on small pools (B = 4, 2 layers, 1 KV head, D = 2).

The comparisons (file:function: the comparison), each pinned by the test named after it:

    kv.py:KvCfg.validate: n_blocks, B, layers, heads, D >= 1 (lo=1)     test_pool_dimensions_at_their_floor
    kv.py:KvCfg.validate: pool_bytes > memory_bytes()                    test_pool_size_at_the_machines_memory
    kv.py:prefix_hash: 0 <= parent < 2**64                              test_prefix_hash_parent_at_the_u64_edges
    kv.py:prefix_hash: 0 <= token < 2**32 (list and array)              test_prefix_hash_tokens_at_the_u32_edges
    kv.py:prefix_hashes: len(tokens) // B full blocks                   test_prefix_hashes_at_a_block_boundary
    kv.py:key_location: 0 <= position < len(table) * B (int, array)     test_key_location_at_the_tables_edges
    kv.py:KvPool._check_id: 0 <= id < n_blocks                          test_block_ids_at_the_pools_edges
    kv.py:KvPool.slab: 0 <= layer < n_layers; is_v in (0, 1)            test_slab_layer_and_is_v_at_their_edges
    kv.py:KvPool.alloc: n > available()                                 test_alloc_at_what_is_available
    kv.py:KvPool.alloc: min(n, free), then evict (len(out) < n)         test_alloc_evicts_only_past_the_free_blocks
    kv.py:KvPool.release: ref reaching 0                                test_release_frees_at_the_last_reference
    kv.py:KvPool.set_fill: 0 <= n <= B                                  test_set_fill_at_its_edges
    kv.py:KvPool.register: fill != B; 0 <= h < 2**64                    test_register_at_a_full_block_and_the_u64_edge
    kv.py:KvPool.lookup: 0 <= h < 2**64                                 test_register_at_a_full_block_and_the_u64_edge
    kv.py:KvPool.import_: n > available()                               test_import_at_what_is_available
    kv.py:KvPool._parse: len(buf) < header + CRC                        test_envelope_length_at_its_edges
    kv.py:KvPool._parse: len(buf) != expected                           test_envelope_length_at_its_edges
    kv.py:KvPool._parse: fill > B in a block record                     test_envelope_fill_at_its_edge
"""

from __future__ import annotations

import struct
import zlib

import numpy as np
import pytest

import tl_lab.kv as kv
from refusal import names_all, raises_naming
from tl_lab.errors import FormatError, KvError
from tl_lab.kv import KvCfg, KvPool, key_location, prefix_hash, prefix_hashes

B = 4
U64, U32 = 2**64, 2**32


def pool(n_blocks=4, prefix_cache=True) -> KvPool:
    return KvPool(KvCfg(n_blocks, B, 2, 1, 2), prefix_cache=prefix_cache)


@pytest.mark.parametrize("field", ["n_blocks", "block_tokens", "n_layers", "n_kv_heads", "head_dim"])
@pytest.mark.parametrize("value, ok", [(0, False), (1, True), (2, True)])
def test_pool_dimensions_at_their_floor(field, value, ok):
    dims = dict(n_blocks=2, block_tokens=2, n_layers=1, n_kv_heads=1, head_dim=1)
    cfg = KvCfg(**{**dims, field: value})
    if ok:
        assert KvPool(cfg).cfg == cfg
    else:
        with raises_naming(KvError, rf"KvCfg\.{field}"):
            KvPool(cfg)


@pytest.mark.parametrize("spare, ok", [(-1, False), (0, True), (1, True)])
def test_pool_size_at_the_machines_memory(monkeypatch, spare, ok):
    """A pool exactly the size of the machine's memory is allowed; one byte more is refused."""
    cfg = KvCfg(3, B, 2, 1, 2)
    monkeypatch.setattr(kv, "memory_bytes", lambda: cfg.pool_bytes + spare)
    if ok:
        cfg.validate()
    else:
        with raises_naming(KvError, "more than this machine's"):
            cfg.validate()


@pytest.mark.parametrize("parent, ok", [(-1, False), (0, True), (U64 - 1, True), (U64, False)])
def test_prefix_hash_parent_at_the_u64_edges(parent, ok):
    if ok:
        assert 0 <= prefix_hash(parent, [1, 2]) < U64
    else:
        with raises_naming(ValueError, "parent must be None or a u64"):
            prefix_hash(parent, [1, 2])


@pytest.mark.parametrize("token, ok", [(-1, False), (0, True), (U32 - 1, True), (U32, False)])
@pytest.mark.parametrize("as_array", [False, True])
def test_prefix_hash_tokens_at_the_u32_edges(token, ok, as_array):
    tokens = np.array([5, token], dtype=np.int64) if as_array else [5, token]
    if ok:
        assert prefix_hash(None, tokens) == prefix_hash(None, [5, token])
    else:
        with raises_naming(ValueError, "u32"):
            prefix_hash(None, tokens)


@pytest.mark.parametrize("n, full", [(0, 0), (3, 0), (4, 1), (5, 1), (7, 1), (8, 2), (9, 2)])
def test_prefix_hashes_at_a_block_boundary(n, full):
    hashes = prefix_hashes(list(range(n)), B)
    assert len(hashes) == full
    if full:
        assert hashes[-1] == prefix_hash(hashes[-2] if full > 1 else None, list(range((full - 1) * B, full * B)))


@pytest.mark.parametrize("position, ok", [(-1, False), (0, True), (11, True), (12, False)])
def test_key_location_at_the_tables_edges(position, ok):
    """A table of 3 blocks holds positions 0 .. 11."""
    table = [7, 2, 9]
    if ok:
        want = (position // B, table[position // B], position % B)
        assert key_location(table, position, B) == want
        index, block, slot = key_location(table, np.array([0, position]), B)
        assert (int(index[1]), int(block[1]), int(slot[1])) == want
    else:
        with raises_naming(KvError, "outside the block table's 12 positions"):
            key_location(table, position, B)
        with raises_naming(KvError, "inside the block table's 12 positions"):
            key_location(table, np.array([0, position]), B)


@pytest.mark.parametrize("id, ok", [(-1, False), (0, True), (3, True), (4, False)])
def test_block_ids_at_the_pools_edges(id, ok):
    p = pool()
    if ok:
        assert p.ref(id) == 0 and p.state(id) == "free"
    else:
        with raises_naming(KvError, rf"block id {id} is out of range \(n_blocks 4\)"):
            p.ref(id)


@pytest.mark.parametrize("layer, ok", [(-1, False), (0, True), (1, True), (2, False)])
@pytest.mark.parametrize("is_v", [0, 1, True])
def test_slab_layer_and_is_v_at_their_edges(layer, ok, is_v):
    p = pool()
    if ok:
        assert p.slab(0, layer, is_v).shape == (1, B, 2)
    else:
        with raises_naming(KvError, r"layer .* is out of range \(n_layers 2\)"):
            p.slab(0, layer, is_v)


@pytest.mark.parametrize("is_v", [-1, 2])
def test_slab_is_v_past_its_edges(is_v):
    with raises_naming(KvError, "is_v must be a bool"):
        pool().slab(0, 0, is_v)


@pytest.mark.parametrize("n, ok", [(2, True), (3, True), (4, False)])
def test_alloc_at_what_is_available(n, ok):
    """4 blocks, one in use: 3 available. All or nothing."""
    p = pool()
    p.alloc(1)
    if ok:
        assert len(p.alloc(n)) == n and p.available() == 3 - n
    else:
        with raises_naming(KvError, r"alloc\(4\): only 3 blocks available"):
            p.alloc(n)
        assert p.available() == 3 and p.stats()["in_use"] == 1


@pytest.mark.parametrize("n, evicted", [(1, 0), (2, 0), (3, 1), (4, 2)])
def test_alloc_evicts_only_past_the_free_blocks(n, evicted):
    """2 blocks cached (registered, released), 2 free: the free ones go first, then the oldest cached."""
    p = pool()
    a, b = p.alloc(2)
    for blk, h in ((a, 11), (b, 22)):
        p.set_fill(blk, B)
        p.register(blk, h)
    p.release(a)
    p.release(b)
    got = p.alloc(n)
    assert p.stats()["evictions"] == evicted
    assert got[2:] == [a, b][:evicted]  # oldest released first
    assert p.lookup(11) is (None if evicted >= 1 else a)


@pytest.mark.parametrize("refs", [1, 2, 3])
def test_release_frees_at_the_last_reference(refs):
    p = pool()
    (b,) = p.alloc(1)
    for _ in range(refs - 1):
        p.retain(b)
    for left in range(refs - 1, -1, -1):
        p.release(b)
        assert p.ref(b) == left and p.state(b) == ("in_use" if left else "free")
        assert (b in p.free_list()) is (left == 0) and p.available() == (3 if left else 4)


@pytest.mark.parametrize("n, ok", [(-1, False), (0, True), (B, True), (B + 1, False)])
def test_set_fill_at_its_edges(n, ok):
    p = pool()
    (b,) = p.alloc(1)
    if ok:
        p.set_fill(b, n)
        assert p.fill(b) == n
    else:
        with raises_naming(KvError, rf"fill must be an int in 0\.\.{B}"):
            p.set_fill(b, n)
        assert p.fill(b) == 0


@pytest.mark.parametrize("fill, h, ok", [(B - 1, 5, False), (B, 5, True), (B, 0, True), (B, U64 - 1, True),
                                         (B, U64, False), (B, -1, False)])
def test_register_at_a_full_block_and_the_u64_edge(fill, h, ok):
    p = pool()
    (b,) = p.alloc(1)
    p.set_fill(b, fill)
    if ok:
        assert p.register(b, h) is True and p.lookup(h) == b
    else:
        with raises_naming(KvError, "not full" if fill < B else "the hash must be a u64"):
            p.register(b, h)
        assert p.hash_of(b) is None
        if fill == B:
            with raises_naming(KvError, "the hash must be a u64"):
                p.lookup(h)


def envelope(n_blocks: int) -> bytes:
    src = pool(n_blocks=8)
    ids = src.alloc(n_blocks)
    for i, b in enumerate(ids):
        src.set_fill(b, B)
        src.register(b, 100 + i)
    return src.export(ids)


@pytest.mark.parametrize("n, ok", [(2, True), (3, True), (4, False)])
def test_import_at_what_is_available(n, ok):
    p = pool()
    p.alloc(1)  # 3 available
    buf = envelope(n)
    if ok:
        assert len(p.import_(buf)) == n
    else:
        with raises_naming(KvError, r"the envelope holds 4 blocks, only 3 available"):
            p.import_(buf)
        assert p.available() == 3


def test_envelope_length_at_its_edges():
    good = envelope(1)
    assert len(pool().import_(good)) == 1
    with raises_naming(FormatError, "truncated"):
        pool().import_(good[:-1])
    with raises_naming(FormatError, "has trailing bytes"):
        pool().import_(good + b"\0")
    empty = envelope(0)
    assert len(empty) == kv._HEADER.size + kv._CRC.size and pool().import_(empty) == []
    with raises_naming(FormatError, "the header alone is"):
        pool().import_(empty[:-1])


@pytest.mark.parametrize("fill, ok", [(B - 1, True), (B, True), (B + 1, False)])
def test_envelope_fill_at_its_edge(fill, ok):
    """A block record's fill may be B at most (an unregistered record: has_hash 0, hash 0)."""
    buf = bytearray(envelope(1))
    kv._BLOCK.pack_into(buf, kv._HEADER.size, fill, 0, 0)
    struct.pack_into("<I", buf, len(buf) - 4, zlib.crc32(bytes(buf[:-4])))
    if ok:
        p = pool()
        (b,) = p.import_(bytes(buf))
        assert p.fill(b) == fill and p.hash_of(b) is None
    else:
        with raises_naming(FormatError, f"fill {fill}"):
            pool().import_(bytes(buf))
