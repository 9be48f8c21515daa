"""The KV pool: fixed-size f16 blocks, references, a prefix hash index and LRU eviction.

Chapter L10.1, sections 2.2 (Rust-owned state), 2.4 (where the forward writes K and V) and 3
("where a key lands"); the export envelope is docs/formats/kv-block.md.

One preallocated uint16 buffer holds every block:

    data: (n_blocks, n_layers, 2, H_kv, B, D) uint16 f16 bits, index 0 of axis 2 is K, 1 is V

so position j of a sequence with block table `table` lives in pool block table[j // B], slot j % B,
and the K of kv head h starts at flat element (h * B + slot) * D of that block's K slab for that layer.

A block is in exactly one state:

    free     ref 0, no hash, on the free list
    in_use   ref >= 1 (fill and, once full, a hash)
    cached   ref 0, registered under a hash, in the LRU (oldest released first)

alloc takes free blocks first, then evicts cached blocks oldest first. Every operation costs O(1)
or O(blocks it touches), never O(pool size): a free list that holds only released ids (the never
used ones are a counter), an OrderedDict for the LRU, dicts for the hash index and each block's hash,
dicts for ref and fill (0 for a block never used). Like the buffer (calloc), the bookkeeping of a block costs memory
only once the block is used, so a large pool is cheap until it fills; KvCfg refuses a pool that
this machine could not hold full.

Decisions where the chapter is silent (also in docs/formats/kv-block.md and the notebook):
- prefix_cache=False: nothing is ever indexed. register checks its arguments as usual, then returns
  False; lookup always misses; release at ref 0 frees every block.
- register on a block that already holds a hash: the same hash is a no-op returning True, another
  hash is a KvError (a block's contents have one identity).
- set_fill on a registered block may only keep it full (its hashed contents are frozen).
- alloc does not zero a block: fill says which slots hold data; the forward writes before it reads.
- slab(id, ...) works for a block in any state (the block map reads cached blocks); only the id,
  layer and is_v (a bool, or 0 / 1) are checked.
- export takes in-use blocks only (a cached block has no owner: lookup it first), no duplicates.
- import_ registers an imported block's hash when no live block holds it yet; otherwise the block
  comes back unregistered (its data is still restored). With prefix_cache=False nothing registers.
"""

from __future__ import annotations

import enum
import hashlib
import math
import os
import struct
import zlib
from collections import OrderedDict, deque
from dataclasses import dataclass

import numpy as np

from tl_lab.ops.checks import as_int, first_bool, is_int
from tl_lab.errors import FormatError, KvError

__all__ = ["KvCfg", "KvPool", "BlockState", "prefix_hash", "prefix_hashes", "key_location", "memory_bytes",
           "slab_offset", "MAGIC", "VERSION"]

MAGIC = b"TLKVBLK\x00"
VERSION = 1
DTYPE_CODES = {"f16": 1}  # the envelope's dtype field
FORMATS = (1,)  # format 1: f16 K and V slabs, (H_kv, B, D) per layer
HASH_BITS = 64
BOOKKEEPING_BYTES = 320  # per block of a full pool, every block cached: ref, fill, hash, index, LRU
_HEADER = struct.Struct("<8sIIIIIIII")  # magic, version, B, n_layers, H_kv, D, dtype, format, n
_BLOCK = struct.Struct("<IIQ")  # fill, has_hash, hash
_CRC = struct.Struct("<I")
_ROOT = b"\x00"  # prefix_hash of a first block: no parent
_CHILD = b"\x01"


class BlockState(str, enum.Enum):
    """The three states of a block; compares equal to the strings "free", "in_use", "cached"."""

    FREE = "free"
    IN_USE = "in_use"
    CACHED = "cached"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class KvCfg:
    """The pool's shape (chapter section 4, KvCfg). Checked when a KvPool is built.

    n_blocks: blocks in the pool; block_tokens: B, positions per block; n_layers; n_kv_heads: H_kv;
    head_dim: D; dtype: "f16" (the only one of format 1); format: the block layout, 1.
    """

    n_blocks: int
    block_tokens: int
    n_layers: int
    n_kv_heads: int
    head_dim: int
    dtype: str = "f16"
    format: int = 1

    def validate(self) -> None:
        """Raise KvError naming the first dimension that is not a positive int, a bad dtype/format,
        or a pool larger than this machine's memory."""
        as_int(self.n_blocks, "KvCfg.n_blocks", lo=1, error=KvError)  # a pool of no blocks is refused here
        for name in ("block_tokens", "n_layers", "n_kv_heads", "head_dim"):
            as_int(getattr(self, name), f"KvCfg.{name}", lo=1, error=KvError)
        if not isinstance(self.dtype, str) or self.dtype not in DTYPE_CODES:  # a list is unhashable
            raise KvError(f"KvCfg.dtype must be 'f16', got {self.dtype!r}")
        if not is_int(self.format) or self.format not in FORMATS:
            raise KvError(f"KvCfg.format {self.format!r} is unknown (known: {list(FORMATS)})")
        need, have = self.pool_bytes, memory_bytes()
        if have is not None and need > have:
            raise KvError(f"KvCfg asks for {self.n_blocks} blocks of {self.block_bytes} bytes: about "
                          f"{need / 2**30:.1f} GiB with the bookkeeping, more than this machine's "
                          f"{have / 2**30:.1f} GiB of memory; lower "
                          + ("n_blocks" if self.block_bytes < have else "the block's dimensions (one block is too large)"))

    @property
    def block_shape(self) -> tuple[int, int, int, int, int]:
        """One block's part of the buffer: (n_layers, 2, H_kv, B, D)."""
        return (int(self.n_layers), 2, int(self.n_kv_heads), int(self.block_tokens), int(self.head_dim))

    @property
    def block_bytes(self) -> int:
        """Bytes of one block (every layer's K and V slab), 2 bytes per f16."""
        return 2 * math.prod(self.block_shape)  # Python ints: np.prod wraps at 2**64 (0 or negative bytes)

    @property
    def pool_bytes(self) -> int:
        """What a KvPool of this shape holds in memory: the buffer plus the per-block bookkeeping."""
        return int(self.n_blocks) * (self.block_bytes + BOOKKEEPING_BYTES)


def memory_bytes() -> int | None:
    """This machine's physical memory in bytes (None where the OS does not say): the pool's bound."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


# ---------------------------------------------------------------- hashing and addressing


def prefix_hash(parent: int | None, tokens) -> int:
    """The 64-bit identity of a block's tokens given its parent block's hash (None for the first).

    blake2b with an 8-byte digest over a fixed little-endian encoding: b"\\x00" for no parent or
    b"\\x01" + parent as u64, then the token count as u32 and each token id as u32; the digest read
    as a little-endian u64. The same on every process and machine (never Python's hash()).
    Chaining the parent means the same tokens after a different prefix get a different hash.
    """
    h = hashlib.blake2b(digest_size=8)
    if parent is None:
        h.update(_ROOT)
    else:
        if not is_int(parent) or not 0 <= parent < 2**HASH_BITS:
            raise ValueError(f"prefix_hash: parent must be None or a u64, got {parent!r}")
        h.update(_CHILD + int(parent).to_bytes(8, "little"))
    if isinstance(tokens, np.ndarray):
        if tokens.ndim != 1 or (tokens.size and tokens.dtype.kind not in "iu"):
            raise ValueError(f"prefix_hash: tokens must be a 1-D array of ints, got {tokens!r}")
        if tokens.size and (tokens.min() < 0 or tokens.max() >= 2**32):
            raise ValueError(f"prefix_hash: token ids must fit in u32, got {tokens!r}")
        h.update(struct.pack("<I", tokens.size) + tokens.astype("<u4").tobytes())
    else:
        if first_bool(tokens) is not None:  # struct packs True as 1: the hash of [1, 0]
            raise ValueError(f"prefix_hash: token ids must be ints in u32, got {tokens!r}")
        try:  # struct refuses non-ints and values outside u32 for us
            h.update(struct.pack(f"<I{len(tokens)}I", len(tokens), *tokens))
        except (struct.error, TypeError):
            raise ValueError(f"prefix_hash: token ids must be ints in u32, got {tokens!r}") from None
    return int.from_bytes(h.digest(), "little")


def prefix_hashes(tokens, block_tokens: int) -> list[int]:
    """The chained hash of every FULL block of `tokens` (a trailing partial block has none)."""
    block_tokens = as_int(block_tokens, "prefix_hashes: block_tokens", lo=1)  # 0 was a ZeroDivisionError
    out: list[int] = []
    parent = None
    for i in range(len(tokens) // block_tokens):
        parent = prefix_hash(parent, tokens[i * block_tokens:(i + 1) * block_tokens])
        out.append(parent)
    return out


def key_location(table, position, block_tokens: int):
    """Where position j of a sequence lands: (block table index j // B, pool block, slot j % B).

    Chapter section 3: table [7, 2, 9], B = 16, position 37 -> (2, 9, 5). One rule for a single
    position (Python ints out) and for an array of positions (N,) (three (N,) int arrays out, what
    the forward writes through). KvError when a position is not an integer, negative, or past the
    table's last block.
    """
    n = len(table) * block_tokens
    if is_int(position):
        if not 0 <= position < n:
            raise KvError(f"position {position!r} is outside the block table's {n} positions")
        index, slot = divmod(int(position), block_tokens)
        return index, int(table[index]), slot
    pos = np.asarray(position)
    if pos.dtype.kind not in "iu" or (pos.size and not (0 <= pos.min() and pos.max() < n)):
        raise KvError(f"positions {position!r} are not all integers inside the block table's {n} positions")
    index = pos // block_tokens
    return index, np.asarray(table)[index], pos % block_tokens


def slab_offset(h: int, slot: int, block_tokens: int, head_dim: int) -> int:
    """Flat element where K (or V) of kv head h at `slot` starts in a layer's slab: (h * B + slot) * D."""
    return (h * block_tokens + slot) * head_dim


# ---------------------------------------------------------------- the pool's bookkeeping


class _Zeros(dict):
    """block -> count, 0 for a block never used (no memory per block until it is)."""

    def __missing__(self, b: int) -> int:
        return 0


class _Hashes(dict):
    """block -> hash of the registered blocks only; another block reads as None, and assigning None
    forgets the block (so `_hash[b]` reads like the list it replaces, at no memory per block)."""

    def __missing__(self, b: int) -> None:
        return None

    def __setitem__(self, b: int, h: int | None) -> None:
        if h is None:
            self.pop(b, None)
        else:
            super().__setitem__(b, h)


class _FreeList:
    """The free block ids in the order alloc takes them: the never used ones in ascending order (a
    counter, no memory each), then the released ones, first released first (a deque)."""

    def __init__(self, n: int):
        self._next, self._n, self._released = 0, n, deque()

    def popleft(self) -> int:
        if self._next < self._n:
            self._next += 1
            return self._next - 1
        return self._released.popleft()

    def append(self, b: int) -> None:
        self._released.append(b)

    def __len__(self) -> int:
        return self._n - self._next + len(self._released)

    def __iter__(self):
        yield from range(self._next, self._n)
        yield from self._released


# ---------------------------------------------------------------- the pool


class KvPool:
    """A bounded pool of f16 KV blocks (chapter section 2.2; interface page, kv.py).

    `data` is the one buffer, (n_blocks, n_layers, 2, H_kv, B, D) uint16; the forward writes into it
    and reads `data[blocks, layer, 0]` (K) and `data[blocks, layer, 1]` (V).
    Every refused call raises KvError (FormatError for a bad envelope) and changes nothing.
    """

    def __init__(self, cfg: KvCfg, prefix_cache: bool = True):
        if not isinstance(cfg, KvCfg):
            raise KvError(f"KvPool needs a KvCfg, got {type(cfg).__name__}")
        cfg.validate()
        if not isinstance(prefix_cache, (bool, np.bool_)):  # bool("no") is True: the cache stayed on
            raise KvError(f"KvPool prefix_cache must be True or False, got {prefix_cache!r}")
        self.cfg = cfg
        self.prefix_cache = bool(prefix_cache)
        n = int(cfg.n_blocks)
        self.B = int(cfg.block_tokens)
        self.D = int(cfg.head_dim)
        self.H_kv = int(cfg.n_kv_heads)
        self.n_layers = int(cfg.n_layers)
        try:
            # np.zeros is calloc: the OS pages the buffer in on first touch, so a big pool is cheap
            self._data = np.zeros((n, *cfg.block_shape), dtype=np.uint16)
        except (ValueError, MemoryError) as exc:
            raise KvError(f"KvCfg asks for {n} blocks of {cfg.block_bytes} bytes: {exc}") from None
        self._ref, self._fill = _Zeros(), _Zeros()  # an entry once a block is first used
        self._hash = _Hashes()
        self._free = _FreeList(n)  # alloc takes from the left, release appends
        self._lru: OrderedDict[int, None] = OrderedDict()  # first = least recently released
        self._index: dict[int, int] = {}  # hash -> block (in use or cached)
        self._evictions = 0
        self._lookups = 0
        self._hits = 0

    # ------------------------------------------------------------ sizes and views

    @property
    def n_blocks(self) -> int:
        return int(self.cfg.n_blocks)

    @property
    def block_tokens(self) -> int:
        return self.B

    @property
    def data(self) -> np.ndarray:
        """The whole buffer (n_blocks, n_layers, 2, H_kv, B, D) uint16, writable (no copy)."""
        return self._data

    def slab(self, id: int, layer: int, is_v: bool) -> np.ndarray:
        """A view (H_kv, B, D) uint16 of block `id`'s K (is_v False) or V slab of `layer`; no copy."""
        b = self._check_id(id)
        if not is_int(layer) or not 0 <= layer < self.n_layers:
            raise KvError(f"layer {layer!r} is out of range (n_layers {self.n_layers})")
        if not (isinstance(is_v, (bool, np.bool_)) or is_int(is_v)) or is_v not in (0, 1):
            raise KvError(f"is_v must be a bool (or 0 for K, 1 for V), got {is_v!r}")
        return self._data[b, int(layer), int(is_v)]

    def ref(self, id: int) -> int:
        return int(self._ref[self._check_id(id)])

    def fill(self, id: int) -> int:
        return int(self._fill[self._check_id(id)])

    def hash_of(self, id: int) -> int | None:
        return self._hash[self._check_id(id)]

    def state(self, id: int) -> BlockState:
        b = self._check_id(id)
        if self._ref[b] > 0:
            return BlockState.IN_USE
        return BlockState.CACHED if b in self._lru else BlockState.FREE

    def lru(self) -> list[int]:
        """Cached blocks, least recently released first (the next to be evicted)."""
        return list(self._lru)

    def free_list(self) -> list[int]:
        """Free blocks in the order alloc hands them out."""
        return list(self._free)

    def available(self) -> int:
        """Blocks alloc can hand out now: free plus cached."""
        return len(self._free) + len(self._lru)

    def stats(self) -> dict:
        free, cached = len(self._free), len(self._lru)
        return {
            "n_blocks": self.n_blocks,
            "free": free,
            "in_use": self.n_blocks - free - cached,
            "cached": cached,
            "registered": len(self._index),
            "evictions": self._evictions,
            "lookups": self._lookups,
            "hits": self._hits,
            "misses": self._lookups - self._hits,
        }

    def __repr__(self) -> str:
        s = self.stats()
        return (
            f"KvPool(n_blocks={s['n_blocks']}, B={self.B}, free={s['free']}, "
            f"in_use={s['in_use']}, cached={s['cached']})"
        )

    # ------------------------------------------------------------ checks (raise before any change)

    def _check_id(self, id) -> int:
        if not is_int(id):
            raise KvError(f"block id must be an int, got {id!r}")
        if not 0 <= id < self.n_blocks:
            raise KvError(f"block id {id} is out of range (n_blocks {self.n_blocks})")
        return int(id)

    def _check_in_use(self, id, what: str) -> int:
        b = self._check_id(id)
        if self._ref[b] == 0:
            st = "cached (ref 0; reacquire it with lookup)" if b in self._lru else "free"
            raise KvError(f"{what}({b}): block {b} is {st}, not in use")
        return b

    # ------------------------------------------------------------ transitions

    def alloc(self, n: int) -> list[int]:
        """n new blocks (ref 1, fill 0, no hash): free ones first, then evict cached, oldest first.

        All or nothing: KvError when fewer than n blocks are free or cached.
        """
        if not is_int(n) or n < 0:
            raise KvError(f"alloc: n must be a non-negative int, got {n!r}")
        n = int(n)
        if n > self.available():
            raise KvError(
                f"alloc({n}): only {self.available()} blocks available "
                f"({len(self._free)} free, {len(self._lru)} cached)"
            )
        out = [self._free.popleft() for _ in range(min(n, len(self._free)))]
        while len(out) < n:
            b, _ = self._lru.popitem(last=False)  # the least recently released
            del self._index[self._hash[b]]
            self._hash[b] = None
            self._evictions += 1
            out.append(b)
        for b in out:
            self._ref[b] = 1
            self._fill[b] = 0
        return out

    def retain(self, id: int) -> None:
        """One more reference to an in-use block (a cached one is reacquired with lookup)."""
        b = self._check_in_use(id, "retain")
        self._ref[b] += 1

    def release(self, id: int) -> None:
        """Drop one reference; at 0 a registered block is cached (newest in the LRU), others freed."""
        b = self._check_in_use(id, "release")
        self._ref[b] -= 1
        if self._ref[b]:
            return
        if self._hash[b] is not None:
            self._lru[b] = None
        else:
            self._fill[b] = 0
            self._free.append(b)

    def set_fill(self, id: int, n: int) -> None:
        """How many of the block's B slots hold keys (0 <= n <= B); in-use blocks only."""
        b = self._check_in_use(id, "set_fill")
        if not is_int(n) or not 0 <= n <= self.B:
            raise KvError(f"set_fill({b}, {n!r}): fill must be an int in 0..{self.B}")
        if self._hash[b] is not None and n != self.B:
            raise KvError(f"set_fill({b}, {n}): block {b} is registered, its fill stays {self.B}")
        self._fill[b] = int(n)

    def register(self, id: int, h: int) -> bool:
        """Enter a full in-use block into the hash index under h.

        True when the block now holds h (also when it already did); False when another block holds
        h or prefix_cache is off. KvError: not in use, not full, h not a u64, or the block already
        holds a different hash.
        """
        b = self._check_in_use(id, "register")
        if self._fill[b] != self.B:
            raise KvError(f"register({b}): block {b} holds {self.fill(b)} of {self.B} tokens, not full")
        if not is_int(h) or not 0 <= h < 2**HASH_BITS:
            raise KvError(f"register({b}, {h!r}): the hash must be a u64")
        h = int(h)
        if self._hash[b] is not None:
            if self._hash[b] == h:
                return True
            raise KvError(f"register({b}, {h:#x}): block {b} already holds hash {self._hash[b]:#x}")
        if not self.prefix_cache or h in self._index:
            return False
        self._index[h] = b
        self._hash[b] = h
        return True

    def lookup(self, h: int) -> int | None:
        """Reacquire the block registered under h: a cached one leaves the LRU with ref 1, an in-use
        one gets ref + 1. None (a miss) when no live block holds h."""
        if not is_int(h) or not 0 <= h < 2**HASH_BITS:
            raise KvError(f"lookup({h!r}): the hash must be a u64")
        self._lookups += 1
        b = self._index.get(int(h))
        if b is None:
            return None
        self._hits += 1
        if self._ref[b] == 0:
            del self._lru[b]
        self._ref[b] += 1
        return b

    # ------------------------------------------------------------ export / import

    def export(self, ids) -> bytes:
        """The envelope of docs/formats/kv-block.md for in-use blocks `ids`, in that order."""
        if is_int(ids) or not hasattr(ids, "__iter__"):  # export(5): "'int' object is not iterable"
            raise KvError(f"export needs a list of block ids, got {type(ids).__name__} {ids!r}")
        ids = list(ids)
        seen = set()
        for id in ids:
            b = self._check_in_use(id, "export")
            if b in seen:
                raise KvError(f"export: block {b} is listed twice")
            seen.add(b)
        blocks = [int(i) for i in ids]
        n, c = len(blocks), self.cfg
        start = _HEADER.size + n * _BLOCK.size
        total = start + n * c.block_bytes + _CRC.size
        out = bytearray(total)  # one buffer, written in place: no concatenation copies
        _HEADER.pack_into(out, 0, MAGIC, VERSION, self.B, self.n_layers, self.H_kv, self.D,
                          DTYPE_CODES[c.dtype], int(c.format), n)
        for i, b in enumerate(blocks):
            h = self._hash[b]
            _BLOCK.pack_into(out, _HEADER.size + i * _BLOCK.size, int(self._fill[b]), h is not None, h or 0)
        payload = np.frombuffer(out, dtype="<u2", count=n * c.block_bytes // 2, offset=start)
        payload = payload.reshape(n, *c.block_shape)
        if payload.dtype == self._data.dtype:  # a little-endian machine: gather straight into place
            np.take(self._data, blocks, axis=0, out=payload)
        else:
            payload[...] = self._data[blocks]
        _CRC.pack_into(out, total - _CRC.size, zlib.crc32(memoryview(out)[: total - _CRC.size]))
        return bytes(out)

    def import_(self, buf) -> list[int]:
        """Blocks from an envelope: allocated (ref 1), slabs and fill restored, hashes registered
        when free in the index. FormatError for a bad envelope, KvError when the pool lacks room;
        either way nothing is allocated."""
        try:
            view = memoryview(buf).cast("B")
        except TypeError:
            raise FormatError(f"import_ needs bytes, got {type(buf).__name__}") from None
        fills, hashes, payload = self._parse(view)
        n = len(fills)
        if n > self.available():
            raise KvError(f"import_: the envelope holds {n} blocks, only {self.available()} available")
        ids = self.alloc(n)
        if n:
            self._data[ids] = payload
        for b, f, h in zip(ids, fills, hashes):
            self._fill[b] = f
            if h is not None and self.prefix_cache and h not in self._index:
                self._index[h] = b
                self._hash[b] = h
        return ids

    def _parse(self, buf: memoryview):
        """Check an envelope against this pool; (fills, hashes, payload array) or FormatError."""
        if len(buf) < _HEADER.size + _CRC.size:
            raise FormatError(f"kv-block envelope truncated: {len(buf)} bytes, the header alone is "
                              f"{_HEADER.size + _CRC.size}")
        magic, version, B, L, H, D, dtype, fmt, n = _HEADER.unpack_from(buf, 0)
        if magic != MAGIC:
            raise FormatError(f"not a kv-block envelope: magic {bytes(magic)!r}, expected {MAGIC!r}")
        if version != VERSION:
            raise FormatError(f"kv-block envelope version {version}, this reader knows {VERSION}")
        if 0 in (B, L, H, D):
            raise FormatError(f"kv-block envelope has a zero dimension (B {B}, layers {L}, heads {H}, D {D})")
        block_bytes = 2 * 2 * L * H * B * D
        expected = _HEADER.size + n * (_BLOCK.size + block_bytes) + _CRC.size
        if len(buf) != expected:
            word = "truncated" if len(buf) < expected else "has trailing bytes"
            raise FormatError(f"kv-block envelope {word}: {len(buf)} bytes, its header says {expected}")
        (crc,) = _CRC.unpack_from(buf, expected - _CRC.size)
        if zlib.crc32(buf[: expected - _CRC.size]) != crc:
            raise FormatError("kv-block envelope corrupted: CRC32 mismatch")
        mine = {"block_tokens": self.B, "n_layers": self.n_layers, "n_kv_heads": self.H_kv,
                "head_dim": self.D, "dtype": DTYPE_CODES[self.cfg.dtype], "format": int(self.cfg.format)}
        theirs = {"block_tokens": B, "n_layers": L, "n_kv_heads": H, "head_dim": D,
                  "dtype": dtype, "format": fmt}
        for k in mine:
            if mine[k] != theirs[k]:
                raise FormatError(f"kv-block envelope {k} {theirs[k]} does not match the pool's {mine[k]}")
        fills, hashes = [], []
        for i in range(n):
            fill, has, h = _BLOCK.unpack_from(buf, _HEADER.size + i * _BLOCK.size)
            if fill > B or has not in (0, 1) or (has and fill != B) or (not has and h):
                raise FormatError(f"kv-block envelope block {i}: fill {fill}, has_hash {has}, "
                                  f"hash {h:#x} is not a valid block record")
            fills.append(fill)
            hashes.append(h if has else None)
        start = _HEADER.size + n * _BLOCK.size
        payload = np.frombuffer(buf, dtype="<u2", count=n * block_bytes // 2, offset=start)
        return fills, hashes, payload.reshape(n, *self.cfg.block_shape)
