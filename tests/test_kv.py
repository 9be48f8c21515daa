"""The KV pool (chapter L10.1, sections 2.2, 3 "where a key lands", 4; docs/formats/kv-block.md).

Unit tests named after the chapter's section-4 tests, plus a hypothesis state machine that drives
random operation sequences against a small pure-Python model of the pool.
"""

import os
import re
import struct
import subprocess
import sys
import zlib
from collections import deque

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from refusal import names_all, raises_naming
from tl_lab.errors import FormatError, KvError
from tl_lab.kv import (
    BlockState,
    KvCfg,
    KvPool,
    key_location,
    prefix_hash,
    prefix_hashes,
    slab_offset,
)


def f16(x: float) -> int:
    """The f16 bit pattern of x (numpy rounds to nearest even)."""
    return int(np.float16(x).view(np.uint16))


def snapshot(pool: KvPool):
    """Everything observable about a pool through the chapter's interface (a learner's pool has no
    private fields of ours), to prove a refused call changed nothing: each block's state, ref, fill
    and hash, the LRU and free orders, the counts (the index's size among them) and the data."""
    blocks = [(str(pool.state(b)), pool.ref(b), pool.fill(b), pool.hash_of(b)) for b in range(pool.n_blocks)]
    return blocks, pool.lru(), pool.free_list(), pool.stats(), pool.data.tobytes()


def refused(pool: KvPool, fn, exc=KvError, names=None):
    """fn() raises exc, its message names `names`, and the pool is exactly as it was."""
    before = snapshot(pool)
    with pytest.raises(exc) as info:
        fn()
    if names is not None:
        assert not names_all(str(info.value), str(names)), (names, str(info.value))
    assert snapshot(pool) == before
    return info.value


def small_pool(n_blocks=8, B=4, n_layers=2, H_kv=2, D=4, prefix_cache=True) -> KvPool:
    return KvPool(KvCfg(n_blocks, B, n_layers, H_kv, D), prefix_cache=prefix_cache)


def filled(pool: KvPool, n: int, fill=None) -> list[int]:
    ids = pool.alloc(n)
    for b in ids:
        pool.set_fill(b, pool.block_tokens if fill is None else fill)
    return ids


# ------------------------------------------------------------------ chapter section-4 tests


def test_kv_pool_bounds_and_cache_lifecycle():
    pool = small_pool(n_blocks=8)
    assert pool.data.shape == (8, 2, 2, 2, 4, 4) and pool.data.dtype == np.uint16
    assert pool.stats()["free"] == 8 and pool.available() == 8
    assert pool.alloc(0) == []

    # capacity is all or nothing
    refused(pool, lambda: pool.alloc(9), names=9)
    a = pool.alloc(5)
    assert a == [0, 1, 2, 3, 4]
    assert all(pool.state(b) == "in_use" and pool.ref(b) == 1 and pool.fill(b) == 0 for b in a)
    assert all(pool.hash_of(b) is None for b in a)
    refused(pool, lambda: pool.alloc(4), names=4)
    b = pool.alloc(3)
    assert b == [5, 6, 7] and pool.available() == 0
    refused(pool, lambda: pool.alloc(1))

    # references balance: two retains, three releases, then the block is free again
    pool.retain(6)
    pool.retain(6)
    assert pool.ref(6) == 3
    for want in (2, 1, 0):
        pool.release(6)
        assert pool.ref(6) == want
    assert pool.state(6) == BlockState.FREE and pool.free_list() == [6]
    refused(pool, lambda: pool.release(6), names=6)  # releasing a free block
    refused(pool, lambda: pool.retain(6), names=6)  # retaining a free block

    # full blocks register, partly filled ones do not
    h0, h1 = prefix_hashes(list(range(8)), 4)
    pool.set_fill(0, 3)
    refused(pool, lambda: pool.register(0, h0), names=0)
    pool.set_fill(0, 4)
    assert pool.register(0, h0) is True and pool.hash_of(0) == h0
    assert pool.register(0, h0) is True  # again, same hash: a no-op
    refused(pool, lambda: pool.register(0, h1), names=0)  # a second identity
    pool.set_fill(1, 4)
    assert pool.register(1, h0) is False and pool.hash_of(1) is None  # h0 is taken by block 0
    assert pool.register(1, h1) is True
    refused(pool, lambda: pool.set_fill(1, 2), names=1)  # a registered block stays full
    refused(pool, lambda: pool.set_fill(2, 5), names=5)
    refused(pool, lambda: pool.set_fill(2, -1), names=-1)

    # release caches a registered block, frees an unregistered one
    pool.release(1)
    pool.release(0)
    pool.release(2)
    assert pool.state(1) == pool.state(0) == "cached" and pool.lru() == [1, 0]
    assert pool.state(2) == "free" and pool.fill(2) == 0
    assert pool.fill(0) == 4 and pool.hash_of(0) == h0
    refused(pool, lambda: pool.retain(0), names=0)  # a cached block is reacquired by lookup
    refused(pool, lambda: pool.release(0), names=0)
    refused(pool, lambda: pool.set_fill(0, 4), names=0)
    s = pool.stats()
    assert (s["free"], s["in_use"], s["cached"], s["registered"]) == (2, 4, 2, 2)

    # lookup reacquires: a cached block leaves the LRU with ref 1, an in-use one gets ref + 1
    assert pool.lookup(h0) == 0
    assert pool.state(0) == "in_use" and pool.ref(0) == 1 and pool.lru() == [1]
    assert pool.lookup(h0) == 0 and pool.ref(0) == 2
    assert pool.lookup(prefix_hash(None, [9, 9, 9, 9])) is None
    s = pool.stats()
    assert (s["lookups"], s["hits"], s["misses"]) == (3, 2, 1)

    # bad ids and values name themselves
    for bad in (8, -1, 100):
        refused(pool, lambda: pool.retain(bad), names=bad)
        refused(pool, lambda: pool.release(bad), names=bad)
    for bad in (1.0, "3", None, True):
        refused(pool, lambda: pool.retain(bad), names=repr(bad))
    refused(pool, lambda: pool.alloc(-1), names=-1)
    refused(pool, lambda: pool.lookup(-5), names=-5)
    refused(pool, lambda: pool.lookup(2**64), names=2**64)
    assert pool.ref(np.int64(0)) == 2  # numpy ints are ints


def test_kv_pool_evicts_the_oldest_cached_block():
    pool = small_pool(n_blocks=6)
    ids = filled(pool, 4)
    hs = [prefix_hash(None, [b] * 4) for b in ids]
    for b, h in zip(ids, hs):
        assert pool.register(b, h)
    for b in (2, 0, 3, 1):  # release order makes the LRU
        pool.release(b)
    assert pool.lru() == [2, 0, 3, 1]

    # free blocks go first: no eviction while a free block is left
    assert pool.alloc(2) == [4, 5] and pool.stats()["evictions"] == 0
    # then the least recently released cached block, and its hash leaves the index
    assert pool.alloc(1) == [2]
    assert pool.hash_of(2) is None and pool.fill(2) == 0 and pool.ref(2) == 1
    assert pool.lru() == [0, 3, 1] and pool.stats()["evictions"] == 1
    assert pool.lookup(hs[2]) is None
    # several at once, oldest first
    assert pool.alloc(2) == [0, 3]
    assert pool.lru() == [1] and pool.stats()["evictions"] == 3
    # the newest cached prefix survived and is still found
    assert pool.lookup(hs[1]) == 1 and pool.lru() == []

    # a lookup refreshes nothing in the LRU but takes the block out; re-releasing makes it newest
    pool2 = small_pool(n_blocks=3)
    ids = filled(pool2, 3)
    hs = [prefix_hash(None, [7, b, 7, b]) for b in ids]
    for b, h in zip(ids, hs):
        pool2.register(b, h)
        pool2.release(b)
    assert pool2.lru() == [0, 1, 2]
    assert pool2.lookup(hs[0]) == 0
    pool2.release(0)
    assert pool2.lru() == [1, 2, 0]
    assert pool2.alloc(1) == [1]


@pytest.mark.parametrize("field", ["n_blocks", "block_tokens", "n_layers", "n_kv_heads", "head_dim"])
@pytest.mark.parametrize("value", [0, -1, -16])
def test_kv_pool_rejects_zero_capacity(field, value):
    good = dict(n_blocks=4, block_tokens=4, n_layers=1, n_kv_heads=1, head_dim=4)
    KvPool(KvCfg(**good))
    with raises_naming(KvError, field):
        KvPool(KvCfg(**{**good, field: value}))


@pytest.mark.parametrize(
    "change",
    [{"n_blocks": 2.0}, {"head_dim": True}, {"block_tokens": "16"}, {"dtype": "bf16"}, {"dtype": "f32"},
     {"format": 2}, {"format": 0}],
)
def test_kv_pool_rejects_bad_dtype_format_and_types(change):
    good = dict(n_blocks=4, block_tokens=4, n_layers=1, n_kv_heads=1, head_dim=4)
    with raises_naming(KvError, next(iter(change))):
        KvPool(KvCfg(**{**good, **change}))
    with pytest.raises(KvError):
        KvPool({"n_blocks": 4})


def write_marks(pool: KvPool, ids):
    """A distinct f16 value at a distinct (layer, K/V, head, slot, d) of each block; returns them."""
    marks = []
    for i, b in enumerate(ids):
        for layer in range(pool.n_layers):
            for is_v in (False, True):
                x = 0.5 + i + 0.25 * layer + (0.125 if is_v else 0.0)
                h, slot, d = i % pool.H_kv, (i + layer) % pool.B, (i + 1) % pool.D
                pool.slab(b, layer, is_v)[h, slot, d] = f16(x)
                marks.append((i, layer, is_v, h, slot, d, x))
    return marks


def check_marks(pool: KvPool, ids, marks):
    for i, layer, is_v, h, slot, d, x in marks:
        flat = pool.slab(ids[i], layer, is_v).ravel()
        bits = flat[slab_offset(h, slot, pool.B, pool.D) + d]
        assert bits == f16(x) and float(np.uint16(bits).view(np.float16)) == x


def test_kv_pool_exports_and_imports_rust_owned_blocks():
    src = small_pool(n_blocks=6)
    ids = src.alloc(3)
    rng = np.random.default_rng(0)
    src.data[ids] = rng.integers(0, 0x7BFF, size=(3, *src.cfg.block_shape), dtype=np.uint16)
    marks = write_marks(src, ids)
    hs = prefix_hashes(list(range(8)), 4)
    src.set_fill(ids[0], 4)
    src.set_fill(ids[1], 4)
    src.set_fill(ids[2], 2)
    assert src.register(ids[0], hs[0]) and src.register(ids[1], hs[1])
    env = src.export(ids)

    # the envelope, byte by byte (docs/formats/kv-block.md)
    n, block_bytes = 3, 2 * 2 * 2 * 4 * 4 * 2
    assert len(env) == 40 + n * (16 + block_bytes) + 4
    assert env[:8] == b"TLKVBLK\x00"
    assert struct.unpack_from("<8I", env, 8) == (1, 4, 2, 2, 4, 1, 1, 3)
    assert struct.unpack_from("<IIQ", env, 40) == (4, 1, hs[0])
    assert struct.unpack_from("<IIQ", env, 56) == (4, 1, hs[1])
    assert struct.unpack_from("<IIQ", env, 72) == (2, 0, 0)
    assert env[88:-4] == src.data[ids].astype("<u2").tobytes()
    assert struct.unpack("<I", env[-4:])[0] == zlib.crc32(env[:-4])

    # into a fresh pool
    dst = small_pool(n_blocks=6)
    got = dst.import_(env)
    assert got == [0, 1, 2]
    assert [dst.fill(b) for b in got] == [4, 4, 2] and [dst.ref(b) for b in got] == [1, 1, 1]
    assert [dst.hash_of(b) for b in got] == [hs[0], hs[1], None]
    assert np.array_equal(dst.data[got], src.data[ids])
    check_marks(dst, got, marks)
    dst.release(got[0])
    assert dst.lookup(hs[0]) == got[0]

    # into a pool with other blocks in use, one of which already holds hs[1]
    busy = small_pool(n_blocks=8)
    other = filled(busy, 4)
    busy.slab(other[0], 1, True)[:] = f16(-3.0)
    assert busy.register(other[2], hs[1])
    before_other = busy.data[other].copy()
    got = busy.import_(env)
    assert got == [4, 5, 6]
    check_marks(busy, got, marks)
    assert np.array_equal(busy.data[other], before_other)  # nobody else's KV moved
    assert busy.hash_of(got[0]) == hs[0]
    assert busy.hash_of(got[1]) is None and busy.hash_of(other[2]) == hs[1]  # the index keeps its block
    assert busy.fill(got[1]) == 4

    # into a pool that must evict cached blocks to make room
    tight = small_pool(n_blocks=4)
    for b in filled(tight, 4):
        tight.register(b, prefix_hash(None, [100 + b] * 4))
        tight.release(b)
    got = tight.import_(env)
    assert got == [0, 1, 2] and tight.stats()["evictions"] == 3 and tight.lru() == [3]
    check_marks(tight, got, marks)

    # an empty export is a valid envelope
    assert small_pool().import_(src.export([])) == []


def reseal(env: bytes) -> bytes:
    """The same body with a recomputed CRC, so only the field we changed is wrong."""
    return env[:-4] + struct.pack("<I", zlib.crc32(env[:-4]))


def patched(env: bytes, offset: int, fmt: str, value) -> bytes:
    b = bytearray(env)
    struct.pack_into(fmt, b, offset, value)
    return reseal(bytes(b))


def test_kv_pool_import_refuses_bad_envelopes_allocating_nothing():
    src = small_pool(n_blocks=4)
    ids = filled(src, 2)
    src.register(ids[0], prefix_hash(None, [1, 2, 3, 4]))
    src.set_fill(ids[1], 2)  # records: (4, 1, h) at offset 40, (2, 0, 0) at offset 56
    write_marks(src, ids)
    env = src.export(ids)

    dst = small_pool(n_blocks=6)
    dst.alloc(1)  # something in use, so "nothing allocated" is not "the pool is empty"
    for cut in (0, 7, 43, 44, 60, 88, len(env) - 5, len(env) - 1):
        refused(dst, lambda: dst.import_(env[:cut]), FormatError, names="truncated")
    refused(dst, lambda: dst.import_(env + b"\x00"), FormatError, names="trailing")
    for i in (50, 88, 100, len(env) - 10):  # a flipped bit in a record, the payload
        bad = bytearray(env)
        bad[i] ^= 0x10
        refused(dst, lambda: dst.import_(bytes(bad)), FormatError, names="corrupted")
    bad = bytearray(env)
    bad[-1] ^= 1  # the checksum itself
    refused(dst, lambda: dst.import_(bytes(bad)), FormatError, names="corrupted")
    refused(dst, lambda: dst.import_(patched(env, 0, "<8s", b"TLKVBLK\x01")), FormatError, names="magic")
    refused(dst, lambda: dst.import_(patched(env, 8, "<I", 2)), FormatError, names="version 2")
    refused(dst, lambda: dst.import_(patched(env, 28, "<I", 2)), FormatError, names="dtype")
    refused(dst, lambda: dst.import_(patched(env, 32, "<I", 2)), FormatError, names="format")
    refused(dst, lambda: dst.import_(patched(env, 36, "<I", 10**6)), FormatError, names="truncated")
    refused(dst, lambda: dst.import_(patched(env, 40, "<I", 5)), FormatError, names="fill 5")
    refused(dst, lambda: dst.import_(patched(env, 60, "<I", 1)), FormatError, names="block 1")  # hash, partial
    refused(dst, lambda: dst.import_(patched(env, 64, "<Q", 7)), FormatError, names="block 1")  # hash, no flag
    refused(dst, lambda: dst.import_(patched(env, 44, "<I", 2)), FormatError, names="has_hash 2")
    refused(dst, lambda: dst.import_("not bytes"), FormatError)

    # a shape that does not match the pool, each field named
    for field, cfg in {
        "block_tokens": KvCfg(6, 8, 2, 2, 4),
        "n_layers": KvCfg(6, 4, 1, 2, 4),
        "n_kv_heads": KvCfg(6, 4, 2, 1, 4),
        "head_dim": KvCfg(6, 4, 2, 2, 8),
    }.items():
        other = KvPool(cfg)
        refused(other, lambda: other.import_(env), FormatError, names=field)

    # not enough room is a KvError, also allocating nothing
    room = small_pool(n_blocks=3)
    room.alloc(2)
    refused(room, lambda: room.import_(env), KvError, names="2 blocks")

    # export refuses what nobody owns
    src.release(ids[0])  # registered: cached
    refused(src, lambda: src.export([ids[0]]), KvError, names=ids[0])
    refused(src, lambda: src.export([3]), KvError, names=3)  # free
    refused(src, lambda: src.export([ids[1], ids[1]]), KvError, names="twice")
    refused(src, lambda: src.export([9]), KvError, names=9)


def test_kv_pool_slabs_are_views_where_a_key_lands():
    """Chapter section 3: table [7, 2, 9], B = 16, position 37 -> index 2, block 9, slot 5."""
    pool = KvPool(KvCfg(n_blocks=12, block_tokens=16, n_layers=2, n_kv_heads=2, head_dim=8))
    ids = pool.alloc(10)
    assert {7, 2, 9} <= set(ids)
    table = [7, 2, 9]
    assert key_location(table, 37, 16) == (2, 9, 5)
    index, block, slot = key_location(table, 37, 16)
    D = 8
    for layer in range(2):
        for h in range(2):
            k = pool.slab(block, layer, False)
            assert k.shape == (2, 16, D) and np.shares_memory(k, pool.data)
            k[h, slot, :] = f16(37 + 0.5 * h + 0.25 * layer)
            assert slab_offset(h, slot, 16, D) == (h * 16 + 5) * D
            flat = pool.slab(block, layer, False).ravel()
            assert np.shares_memory(flat, pool.data)  # a slab is contiguous: ravel is a view
            off = (h * 16 + 5) * D
            assert (flat[off:off + D] == f16(37 + 0.5 * h + 0.25 * layer)).all()
            assert flat[off - 1] == 0 and flat[off + D] == 0
            assert (pool.data[table, layer, 0][index, h, slot] == flat[off:off + D]).all()
    assert (pool.slab(block, 0, True) == 0).all()  # V untouched
    for bad in (-1, 48, 100):
        with raises_naming(KvError, str(bad)):
            key_location(table, bad, 16)
    assert np.shares_memory(pool.slab(9, 1, 1), pool.data[9, 1, 1]) and pool.available() == 2
    for bad_v in (2, -1, 0.0, "K", None):
        with raises_naming(KvError, "is_v"):
            pool.slab(9, 0, bad_v)
    with raises_naming(KvError, "layer"):
        pool.slab(9, 2, False)
    with raises_naming(KvError, "12"):
        pool.slab(12, 0, False)


def test_kv_pool_without_prefix_cache_frees_every_block():
    pool = small_pool(n_blocks=4, prefix_cache=False)
    ids = filled(pool, 2)
    h = prefix_hash(None, [1, 2, 3, 4])
    assert pool.register(ids[0], h) is False and pool.hash_of(ids[0]) is None
    pool.set_fill(ids[1], 2)
    refused(pool, lambda: pool.register(ids[1], h), names=ids[1])  # misuse is still misuse
    assert pool.lookup(h) is None
    for b in ids:
        pool.release(b)
    assert pool.lru() == [] and pool.stats()["free"] == 4
    # an envelope with hashes imports without registering them
    src = small_pool(n_blocks=2)
    b = filled(src, 1)[0]
    src.register(b, h)
    got = pool.import_(src.export([b]))
    assert pool.hash_of(got[0]) is None and pool.fill(got[0]) == 4


# ------------------------------------------------------------------ prefix_hash

# computed ONCE by prefix_hash and frozen here: a change of encoding must show up as a failure
ROOT_1234 = 0x4E1E8EB0731815C5
CHILD_5678 = 0x1B7380F01DFF3800


def test_prefix_hash_is_stable_and_chains():
    a = prefix_hash(None, [1, 2, 3, 4])
    assert a == ROOT_1234
    assert prefix_hash(a, [5, 6, 7, 8]) == CHILD_5678
    assert prefix_hash(None, np.array([1, 2, 3, 4], dtype=np.int64)) == a
    assert prefix_hashes([1, 2, 3, 4, 5, 6, 7, 8, 9], 4) == [ROOT_1234, CHILD_5678]
    assert 0 <= a < 2**64
    # chaining: the same tokens after different parents differ, and differ from the root
    t = [5, 6, 7, 8]
    outs = {prefix_hash(None, t), prefix_hash(0, t), prefix_hash(a, t), prefix_hash(a + 1, t)}
    assert len(outs) == 4
    assert prefix_hash(None, [1, 2, 3, 4]) != prefix_hash(None, [4, 3, 2, 1])
    assert prefix_hash(None, [1, 2]) != prefix_hash(None, [1, 2, 0])
    for bad_parent in (-1, 2**64, 1.5):
        with pytest.raises(ValueError):
            prefix_hash(bad_parent, t)
    for bad_tokens in ([-1], [2**32], [1.5]):
        with pytest.raises(ValueError):
            prefix_hash(None, bad_tokens)


def test_prefix_hash_refuses_bools_and_prefix_hashes_a_block_size_that_is_not_positive():
    """prefix_hash(None, [True, False]) hashed [1, 0] (struct packs a bool as an int) and
    prefix_hashes(tokens, 0) raised ZeroDivisionError; now each is a ValueError naming the argument."""
    for tokens in ([True, False], [1, np.bool_(True)]):
        with raises_naming(ValueError, "^prefix_hash: token ids must be ints in u32"):
            prefix_hash(None, tokens)
    for B in (0, -4, True, 4.0):
        with raises_naming(ValueError, "^prefix_hashes: block_tokens must be"):
            prefix_hashes([1, 2, 3, 4], B)


def test_prefix_hash_is_the_same_in_another_process():
    code = (
        "from tl_lab.kv import prefix_hash\n"
        "a = prefix_hash(None, [1, 2, 3, 4])\n"
        "print(a, prefix_hash(a, [5, 6, 7, 8]))\n"
    )
    for seed in ("0", "12345"):  # Python's own hash() would change with this
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        assert out.stdout.split() == [str(ROOT_1234), str(CHILD_5678)]


# ------------------------------------------------------------------ the state machine

N, B = 4, 2
HASHES = [11, 12, 13, 14, 2**64 - 1]  # few, so collisions and reuse happen often
BAD_HASHES = [-1, 2**64]


class KvPoolMachine(RuleBasedStateMachine):
    """Random alloc/retain/release/set_fill/register/lookup/write/export/import against a model."""

    PREFIX_CACHE = True

    def __init__(self):
        super().__init__()
        self.pool = KvPool(KvCfg(N, B, 1, 1, 2), prefix_cache=self.PREFIX_CACHE)
        self.ref = [0] * N
        self.fill = [0] * N
        self.hash: list = [None] * N
        self.free = deque(range(N))
        self.lru: list[int] = []  # oldest first
        self.index: dict[int, int] = {}
        self.mark = [0] * N  # the model of data[b, 0, 0, 0, 0, 0]
        self.evictions = 0
        self.envelopes: list[tuple[bytes, list]] = []  # (bytes, [(fill, hash, mark)])

    # -- the model's own alloc, shared by alloc and import_
    def model_alloc(self, n: int) -> list[int]:
        out = [self.free.popleft() for _ in range(min(n, len(self.free)))]
        while len(out) < n:
            b = self.lru.pop(0)
            del self.index[self.hash[b]]
            self.hash[b] = None
            self.evictions += 1
            out.append(b)
        for b in out:
            self.ref[b], self.fill[b] = 1, 0
        return out

    def in_use(self, b) -> bool:
        return 0 <= b < N and self.ref[b] > 0

    @rule(n=st.integers(0, N + 1))
    def alloc(self, n):
        if n > len(self.free) + len(self.lru):
            refused(self.pool, lambda: self.pool.alloc(n), names=n)
            return
        assert self.pool.alloc(n) == self.model_alloc(n)

    @precondition(lambda self: self.lru)
    @rule(extra=st.integers(1, N))
    def alloc_under_pressure(self, extra):
        """Every free block and `extra` more: the cached ones must go oldest first."""
        self.alloc(len(self.free) + extra)

    def pick(self, data, live_only=False) -> int:
        """A block id: mostly an in-use one (the interesting paths), sometimes anything, out of range too."""
        live = [b for b in range(N) if self.ref[b] > 0]
        if live and (live_only or data.draw(st.integers(0, 3), label="live?") > 0):
            return data.draw(st.sampled_from(live), label="id")
        return data.draw(st.integers(-1, N), label="id")

    @rule(data=st.data())
    def retain(self, data):
        b = self.pick(data)
        if not self.in_use(b):
            refused(self.pool, lambda: self.pool.retain(b), names=b)
            return
        self.pool.retain(b)
        self.ref[b] += 1

    @rule(data=st.data())
    def release(self, data):
        self.do_release(self.pick(data))

    def do_release(self, b):
        if not self.in_use(b):
            refused(self.pool, lambda: self.pool.release(b), names=b)
            return
        self.pool.release(b)
        self.ref[b] -= 1
        if self.ref[b] == 0:
            if self.hash[b] is not None:
                self.lru.append(b)
            else:
                self.fill[b] = 0
                self.free.append(b)

    @rule(data=st.data(), n=st.integers(-1, B + 1))
    def set_fill(self, data, n):
        b = self.pick(data)
        if not self.in_use(b) or not 0 <= n <= B or (self.hash[b] is not None and n != B):
            refused(self.pool, lambda: self.pool.set_fill(b, n))
            return
        self.pool.set_fill(b, n)
        self.fill[b] = n

    @rule(data=st.data(), h=st.sampled_from(HASHES + BAD_HASHES))
    def register(self, data, h):
        self.do_register(self.pick(data), h)

    @precondition(lambda self: any(self.ref))
    @rule(data=st.data(), h=st.sampled_from(HASHES))
    def fill_and_register(self, data, h):
        """The common path: a block gets its B-th token, then its hash."""
        b = self.pick(data, live_only=True)
        if self.hash[b] is None:
            self.pool.set_fill(b, B)
            self.fill[b] = B
        self.do_register(b, h)

    @precondition(lambda self: any(self.ref))
    @rule(data=st.data(), h=st.sampled_from(HASHES))
    def finish(self, data, h):
        """A sequence ends: its block gets a hash (when free to take) and drops every reference."""
        b = self.pick(data, live_only=True)
        if self.hash[b] is None:
            self.pool.set_fill(b, B)
            self.fill[b] = B
            self.do_register(b, h)
        while self.ref[b]:
            self.do_release(b)

    def do_register(self, b, h):
        if (not self.in_use(b) or self.fill[b] != B or h in BAD_HASHES
                or self.hash[b] not in (None, h)):
            refused(self.pool, lambda: self.pool.register(b, h))
            return
        if self.hash[b] == h:
            want = True
        elif not self.PREFIX_CACHE or h in self.index:
            want = False
        else:
            self.index[h], self.hash[b], want = b, h, True
        assert self.pool.register(b, h) is want

    @rule(h=st.sampled_from(HASHES + BAD_HASHES))
    def lookup(self, h):
        if h in BAD_HASHES:
            refused(self.pool, lambda: self.pool.lookup(h), names=h)
            return
        want = self.index.get(h)
        assert self.pool.lookup(h) == want
        if want is not None:
            if self.ref[want] == 0:
                self.lru.remove(want)
            self.ref[want] += 1

    @rule(b=st.integers(0, N - 1), v=st.integers(0, 0xFFFF))
    def write(self, b, v):
        self.pool.slab(b, 0, False)[0, 0, 0] = v
        self.mark[b] = v

    @rule(data=st.data())
    def export(self, data):
        live = [b for b in range(N) if self.ref[b] > 0]
        ids = data.draw(st.lists(st.sampled_from(live), unique=True) if live else st.just([]))
        env = self.pool.export(ids)
        self.envelopes.append((env, [(self.fill[b], self.hash[b], self.mark[b]) for b in ids]))

    @rule(data=st.data())
    def export_refused(self, data):
        b = self.pick(data)
        if not self.in_use(b):
            refused(self.pool, lambda: self.pool.export([b]), names=b)
        else:
            refused(self.pool, lambda: self.pool.export([b, b]), names="twice")

    @precondition(lambda self: self.envelopes)
    @rule(data=st.data())
    def import_(self, data):
        env, recs = data.draw(st.sampled_from(self.envelopes))
        if len(recs) > len(self.free) + len(self.lru):
            refused(self.pool, lambda: self.pool.import_(env), KvError)
            return
        got = self.pool.import_(env)
        want = self.model_alloc(len(recs))
        assert got == want
        for b, (fill, h, mark) in zip(want, recs):
            self.fill[b], self.mark[b] = fill, mark
            if h is not None and self.PREFIX_CACHE and h not in self.index:
                self.index[h], self.hash[b] = b, h

    @precondition(lambda self: self.envelopes)
    @rule(data=st.data())
    def import_damaged(self, data):
        env, _ = data.draw(st.sampled_from(self.envelopes))
        if data.draw(st.booleans()):
            bad = env[: data.draw(st.integers(0, len(env) - 1))]
        else:
            i = data.draw(st.integers(0, len(env) - 1))
            bad = env[:i] + bytes([env[i] ^ data.draw(st.integers(1, 255))]) + env[i + 1:]
        refused(self.pool, lambda: self.pool.import_(bad), FormatError)

    @invariant()
    def matches_the_model(self):
        pool = self.pool
        free, cached = set(self.free), set(self.lru)
        in_use = {b for b in range(N) if self.ref[b] > 0}
        # each block in exactly one state, no negative reference
        assert not (free & cached) and not (free & in_use) and not (cached & in_use)
        assert free | cached | in_use == set(range(N))
        for b in range(N):
            want = "in_use" if b in in_use else "cached" if b in cached else "free"
            assert pool.state(b) == want, (b, pool.state(b), want)
            assert pool.ref(b) == self.ref[b] >= 0
            assert pool.fill(b) == self.fill[b]
            assert pool.hash_of(b) == self.hash[b]
            assert int(pool.data[b, 0, 0, 0, 0, 0]) == self.mark[b]
        s = pool.stats()
        assert s["free"] + s["in_use"] + s["cached"] == N
        assert (s["free"], s["in_use"], s["cached"]) == (len(free), len(in_use), len(cached))
        # the LRU order (eviction takes its head: checked by alloc's result) and the free order
        assert pool.lru() == self.lru
        assert pool.free_list() == list(self.free)
        # the hash index holds exactly the registered live blocks
        assert pool._index == self.index
        assert all(b not in free for b in self.index.values())
        assert {pool.hash_of(b): b for b in range(N) if pool.hash_of(b) is not None} == self.index
        assert s["evictions"] == self.evictions
        if not self.PREFIX_CACHE:
            assert not self.index and not cached


class KvPoolNoCacheMachine(KvPoolMachine):
    PREFIX_CACHE = False


TestKvPoolStateMachine = KvPoolMachine.TestCase
TestKvPoolStateMachine.settings = settings(max_examples=75, stateful_step_count=40, deadline=None)
TestKvPoolNoCacheStateMachine = KvPoolNoCacheMachine.TestCase
TestKvPoolNoCacheStateMachine.settings = settings(max_examples=30, stateful_step_count=30, deadline=None)


def test_kv_pool_is_bounded_by_memory_before_allocating():
    """Issue 12: a pool larger than this machine's memory is a KvError naming the figures, raised
    before anything is allocated (was a MemoryError traceback, or gigabytes of bookkeeping)."""
    from tl_lab.kv import memory_bytes

    have = memory_bytes()
    assert have is not None and have > 0
    cfg = KvCfg(n_blocks=1, block_tokens=16, n_layers=1, n_kv_heads=1, head_dim=1)  # the bigram's pool
    n = have // cfg.pool_bytes + 1
    with pytest.raises(KvError) as info:
        KvPool(KvCfg(n, 16, 1, 1, 1))
    assert str(n) in str(info.value) and "GiB" in str(info.value) and "memory" in str(info.value)
    with raises_naming(KvError, "100000000 blocks"):
        KvCfg(10**8, 16, 30, 3, 64).validate()  # SmolLM2's shape: 34 TiB
    assert KvPool(KvCfg(64, 16, 1, 1, 1)).n_blocks == 64


def test_key_location_is_one_rule_for_scalars_and_arrays():
    table = [7, 2, 9]
    pos = np.array([37, 0, 16, 47])
    index, block, slot = key_location(table, pos, 16)
    assert index.tolist() == [2, 0, 1, 2] and block.tolist() == [9, 7, 2, 9] and slot.tolist() == [5, 0, 0, 15]
    for p in pos.tolist():
        assert key_location(table, p, 16) == (p // 16, table[p // 16], p % 16)
    for bad in (np.array([3, 48]), np.array([-1]), np.array([1.5]), "abc", 2.0, True):
        with pytest.raises(KvError):
            key_location(table, bad, 16)


def test_a_large_pool_costs_memory_only_as_it_is_used():
    """Issue 12: --kv-blocks 100000000 on the bigram was a MemoryError traceback (5e7: 3.2 GB of
    bookkeeping). The buffer and the bookkeeping are paged in on first use; the free list keeps
    its order (never used ids ascending, then released ones)."""
    import resource

    from tl_lab.kv import memory_bytes

    n = 10**8
    if KvCfg(n, 16, 1, 1, 1).pool_bytes > memory_bytes():
        n = memory_bytes() // KvCfg(1, 16, 1, 1, 1).pool_bytes  # a smaller machine: the largest it accepts
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    pool = KvPool(KvCfg(n, 16, 1, 1, 1))
    a = pool.alloc(3)
    pool.release(a[1])
    grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024  # ru_maxrss is KiB
    assert grown < 100 * 2**20, f"a {n}-block pool took {grown / 2**20:.0f} MiB before use"
    assert a == [0, 1, 2] and pool.stats()["free"] == n - 2
    assert pool.alloc(2) == [3, 4]  # never used ids first; the released one comes after them
    small = KvPool(KvCfg(4, 16, 1, 1, 1))
    b = small.alloc(2)
    small.release(b[0])
    assert small.free_list() == [2, 3, 0] and small.alloc(3) == [2, 3, 0]


@pytest.mark.parametrize("dims, words", [
    (dict(n_layers=2**32), "4 blocks of 35184372088832 bytes: about 131072.0 GiB"),  # np.prod wrapped: 0 bytes
    (dict(block_tokens=2**62), "4 blocks of 4722366482869645213696 bytes"),  # -18446744073709551616 bytes
    (dict(dtype=["f16"]), "KvCfg.dtype must be 'f16', got ['f16']"),  # a TypeError (unhashable)
])
def test_kv_cfg_of_huge_dimensions_or_a_wrong_dtype_type_is_refused_in_words(dims, words):
    """Issue 20: the block size is computed in Python ints, so a pool larger than memory is refused
    naming its real size (and that one block is too large), and a list as dtype is a KvError."""
    cfg = KvCfg(**{**dict(n_blocks=4, block_tokens=16, n_layers=2, n_kv_heads=2, head_dim=64), **dims})
    with pytest.raises(KvError) as exc:
        KvPool(cfg)
    assert not names_all(str(exc.value), words), (words, str(exc.value))
    if "dtype" not in dims:
        assert cfg.block_bytes > 0 and "one block is too large" in str(exc.value)


@pytest.mark.parametrize("value", ["no", "False", None, 0, 1])
def test_kv_pool_prefix_cache_must_be_a_bool(value):
    """KvPool(cfg, prefix_cache="no") ran with the prefix cache on (bool("no") is True); now a KvError."""
    with raises_naming(KvError, f"^KvPool prefix_cache must be True or False, got {re.escape(repr(value))}$"):
        KvPool(KvCfg(n_blocks=4, block_tokens=16, n_layers=1, n_kv_heads=1, head_dim=16), prefix_cache=value)
    assert KvPool(KvCfg(4, 16, 1, 1, 16), prefix_cache=np.bool_(False)).prefix_cache is False


def test_export_of_one_id_not_in_a_list_is_named():
    """pool.export(3) raised Python's "TypeError: 'int' object is not iterable"; now a KvError."""
    pool = KvPool(KvCfg(n_blocks=4, block_tokens=16, n_layers=1, n_kv_heads=1, head_dim=16))
    b = pool.alloc(1)[0]
    for ids in (b, None):
        with raises_naming(KvError, f"^export needs a list of block ids, got {type(ids).__name__} {ids!r}$"):
            pool.export(ids)
    (c,) = pool.import_(pool.export([b]))  # a list of one still exports: the block comes back, as it was
    assert pool.export([c]) == pool.export([b])


def test_a_refused_call_names_itself():
    """Each misuse names the call it was (mutation testing, issue 20, found set_fill's name unchecked)."""
    pool = KvPool(KvCfg(n_blocks=4, block_tokens=16, n_layers=1, n_kv_heads=1, head_dim=16))
    with raises_naming(KvError, r"^set_fill\(0\): block 0 is free, not in use$"):
        pool.set_fill(0, 1)
    b = pool.alloc(1)[0]
    pool.set_fill(b, 16)
    pool.register(b, prefix_hash(None, list(range(16))))
    pool.release(b)
    with raises_naming(KvError, rf"^set_fill\({b}\): block {b} is cached \(ref 0; reacquire it with lookup\), not in use$"):
        pool.set_fill(b, 16)
