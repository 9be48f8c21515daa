"""A safetensors header, read without trusting it (given): what the learner's `parse_layout` calls
before and around `json` (docs/formats/safetensors.md, "Limits").

Chapter L10.1, section 2.3. A header is counted in its raw bytes before it is copied or parsed, so
a hostile file (a 95 MB name, 1.7 million entries, a 4,300-digit integer, a repeated key) is refused
with a FormatError and never becomes a huge allocation: the limits below, the pieces a map is read
in (each handed back to the OS once read), the parse's memory bound, the JSON hooks.
"""

from __future__ import annotations

import mmap
import sys
from typing import Iterator

import numpy as np

from tl_lab.errors import FormatError, clip

__all__ = ["MAX_HEADER_BYTES", "MAX_TENSORS", "MAX_HEADER_VALUES", "MAX_PARSE_BYTES", "TENSOR_KEY", "header_pieces",
           "header_bytes", "check_parse_cost", "header_text", "DuplicateKey", "no_duplicate_keys", "no_constants",
           "HugeInt", "json_int", "quoted", "is_count"]

MAX_HEADER_BYTES = 100_000_000  # 100 MB: no real header comes close (SmolLM2's is ~30 KB)
# Counted in the raw header before its JSON is parsed (the parse of 1.7 million entries takes 1.7 GB);
# a real shard holds hundreds to a few thousand tensors.
MAX_TENSORS = 100_000
# JSON values in the header (counted as its commas, colons, '{' and '['), also before the parse: a real
# entry has about 12 ("name": {"dtype": .., "shape": [a, b], "data_offsets": [x, y]}), so this is
# MAX_TENSORS of them; 7.5 million metadata entries or a shape of 40 million dimensions are not.
MAX_HEADER_VALUES = 16 * MAX_TENSORS
# What parsing a header may hold at once: its text as Python keeps it (1, 2 or 4 bytes a character)
# beside the bytes it was decoded from, then beside the names and values built from it. Counted in
# the raw bytes before the header is copied (`_check_parse_cost`): a 95 MB name held 2 x 95 MB, and
# a few non-ASCII characters make Python keep all the text at 2 or 4 bytes a character. A real
# header is under 1 MB.
MAX_PARSE_BYTES = 128 * 2**20


class DuplicateKey(ValueError):
    pass


def no_duplicate_keys(pairs: list) -> dict:
    out = {}
    for k, v in pairs:
        if k in out:
            raise DuplicateKey(k)
        out[k] = v
    return out


def no_constants(name: str):
    raise ValueError(f"{name} is not JSON")


class HugeInt(ValueError):
    pass


def json_int(text: str) -> int:
    """An integer literal of a JSON file. Python reads at most sys.get_int_max_str_digits() digits
    (4,300); a longer one is valid JSON but no number any field takes, and is said to be that."""
    digits = len(text.lstrip("-"))
    limit = sys.get_int_max_str_digits() or digits
    if digits > limit:
        raise HugeInt(f"an integer of {digits:,} digits (no field takes one of more than {limit:,})")
    return int(text)


# ---------------------------------------------------------------------------------------------
# The safetensors layout (section 2.3, docs/formats/safetensors.md)
# ---------------------------------------------------------------------------------------------

# dtype -> (numpy dtype of `.raw`, bytes per element). F16 and BF16 are kept as their bit patterns.


TENSOR_KEY = b'"data_offsets"'  # once in every entry


def header_pieces(buf, N: int, overlap: int = 0, step: int = 1 << 22) -> Iterator[bytes]:
    """Bytes [8, 8 + N) of buf, the header, in pieces of `step` bytes (each with up to `overlap`
    bytes of the next one after it). A map's pages are handed back as each piece is read, so the
    header is never held twice (in the map and in a copy)."""
    for a in range(0, N, step):
        b = min(a + step, N)
        yield bytes(buf[8 + a : 8 + min(b + overlap, N)])
        if isinstance(buf, mmap.mmap) and hasattr(mmap, "MADV_DONTNEED"):
            lo, hi = (8 + a) - (8 + a) % mmap.PAGESIZE, (8 + b) - (8 + b) % mmap.PAGESIZE
            if hi > lo:
                buf.madvise(mmap.MADV_DONTNEED, lo, hi - lo)


def header_bytes(buf, N: int) -> bytearray:
    """The header, copied once (see `header_pieces`), after `check_parse_cost`."""
    check_parse_cost(buf, N)
    raw = bytearray(N)
    for k, piece in enumerate(header_pieces(buf, N)):
        raw[k << 22 : (k << 22) + len(piece)] = piece
    return raw


def check_parse_cost(buf, N: int) -> None:
    """Refuse a header whose parse would hold more than MAX_PARSE_BYTES, counted in its UTF-8 bytes a
    piece at a time: the characters (bytes that are not continuation bytes 0b10xxxxxx), the widest
    one (Python keeps a whole str at the width of its widest character), and whether a \\u escape
    can make a built string wider than the text. An upper bound: the text beside the raw bytes, or
    beside the strings built from it."""
    chars, top, escapes = 0, 0, False
    for piece in header_pieces(buf, N, overlap=1):  # the overlap: a \u split between two pieces
        a = np.frombuffer(piece, np.uint8, min(len(piece), 1 << 22))
        chars += a.size - int(np.count_nonzero((a & 0xC0) == 0x80))
        top = max(top, int(a.max(initial=0)))
        escapes = escapes or b"\\u" in piece
    width = 4 if top >= 0xF0 else 2 if top >= 0xC4 else 1  # lead bytes of U+10000, U+0100
    need = chars * width + max(N, chars * (4 if escapes else width))
    if need > MAX_PARSE_BYTES:
        raise FormatError(
            f"parsing this header would hold up to {need / 2**20:,.0f} MB (its {N:,} bytes as Python text at "
            f"{width} byte{'s' * (width > 1)} a character, beside the names and values built from it), over "
            f"tl_lab's {MAX_PARSE_BYTES >> 20} MB for a header (a real one is under 1 MB); refused before parsing it"
        )


def header_text(raw: bytes | bytearray) -> str:
    if not raw.startswith(b"{"):
        raise FormatError(f"the header must be a JSON object starting with '{{', got {bytes(raw[:16])!r}")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FormatError(f"the header is not valid JSON: {str(exc)[:200]}") from None


def quoted(name: str) -> str:
    """A tensor name for a message: quoted, and clipped before it is quoted (a name can be 95 MB)."""
    return repr(clip(name, 200))


def is_count(v) -> bool:
    return type(v) is int and v >= 0  # not bool, not 2.0, not "2"
