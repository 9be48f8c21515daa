"""tl_lab.model: config.json, the safetensors reader, the weights (chapter L10.1, section 2.3).

The chapter's tests: safetensors_reader_rules, config_refuses_what_the_engine_cannot_run; plus a
fuzz test and a memory test of the reader, the int4 file against quantize-at-load, load_weights.
The `safetensors` library is the oracle for valid files; the rules are docs/formats/safetensors.md.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import os
import re
import struct
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from safetensors.numpy import load as lib_load
from safetensors.numpy import save as lib_save
from safetensors.numpy import save_file as lib_save_file

from refusal import names_all, raises_naming
from tl_lab.errors import ConfigError, FormatError
from tl_lab.model import (
    MAX_HEADER_BYTES,
    BigramWeights,
    Int4,
    LAYER_LINEARS,
    Linear,
    LlamaWeights,
    ModelConfig,
    SafeTensors,
    config_schema,
    load_weights,
    parse_layout,
    tensor_shapes,
)
from tl_lab.ops.paths import DATA_DIR
from tl_lab.quant import QLinear

from conftest import need

TINY = DATA_DIR / "tiny-llama"
TINY_INT4 = DATA_DIR / "tiny-llama-int4"
BIGRAM = DATA_DIR / "bigram"


# ---------------------------------------------------------------------------------------------
# Helpers: files written by the library, and hand-made files for the malformed cases
# ---------------------------------------------------------------------------------------------


def craft(header: dict, data: bytes, *, header_len: int | None = None, raw_header: bytes | None = None) -> bytes:
    """A safetensors file by hand: u64 LE length, the JSON (space-padded to header_len), data."""
    h = raw_header if raw_header is not None else json.dumps(header).encode()
    if header_len is not None:
        assert len(h) <= header_len
        h = h + b" " * (header_len - len(h))
    return struct.pack("<Q", len(h)) + h + data


def entry(dtype: str, shape: list, begin: int, end: int) -> dict:
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


def both_ways(buf: bytes, tmp_path: Path) -> list:
    """Parse buf with parse_layout and through a file with SafeTensors.open; return both results."""
    p = tmp_path / "f.safetensors"
    p.write_bytes(buf)
    out = [parse_layout(buf), parse_layout(memoryview(buf))]
    with SafeTensors.open(p) as f:
        out.append(f.layout)
    return out


def refused(buf: bytes, tmp_path: Path, words: list[str]) -> None:
    """buf is refused with FormatError, by parse_layout and by SafeTensors.open, naming `words`."""
    with pytest.raises(FormatError) as e1:
        parse_layout(buf)
    p = tmp_path / "bad.safetensors"
    p.write_bytes(buf)
    with pytest.raises(FormatError) as e2:
        SafeTensors.open(p)
    for e in (e1, e2):
        for w in words:
            assert not names_all(str(e.value), w, "model"), f"{w!r} not named in {str(e.value)!r}"


VALID_TENSORS = {
    "w32": np.arange(12, dtype=np.float32).reshape(3, 4) / 7,
    "h16": np.array([[1.5, -2.0], [65504.0, 6.1e-5]], dtype=np.float16),
    "bytes": np.arange(10, dtype=np.uint8),
    "ints": np.array([-3, 7, 2**31 - 1], dtype=np.int32),
    "longs": np.array([-(2**62), 5], dtype=np.int64),
    "i8": np.array([-128, 127], dtype=np.int8),
    "u16": np.array([0, 65535], dtype=np.uint16),
    "f64": np.array([np.pi], dtype=np.float64),
    "empty": np.zeros((0, 3), dtype=np.float32),
    "empty_u8": np.zeros((4, 0), dtype=np.uint8),
    "scalar": np.array(2.5, dtype=np.float32),
    "scalar_h": np.array(-0.25, dtype=np.float16),
}


# ---------------------------------------------------------------------------------------------
# safetensors_reader_rules: valid files equal the library
# ---------------------------------------------------------------------------------------------


def test_safetensors_refuses_to_read_a_file_cut_short_after_open(tmp_path):
    """A file truncated (or being rewritten in place, open(p, "wb")) after SafeTensors.open killed the
    process with SIGBUS at the first read of a page past its new end: a notebook's kernel died. Now
    the read is a FormatError saying so. A file replaced by a rename, or grown, still reads."""
    a = np.arange(1 << 14, dtype=np.float32)
    buf = craft({"a": entry("F32", [a.size], 0, a.nbytes)}, a.tobytes())
    p = tmp_path / "f.safetensors"
    p.write_bytes(buf)
    with SafeTensors.open(p) as f:
        os.truncate(p, 100)
        for read in (f.f32, f.raw):
            with raises_naming(FormatError, r"is 100 bytes now, \d+ when it was opened \(truncated", "model"):
                read("a")
    p.write_bytes(buf)
    with SafeTensors.open(p) as f:
        p.with_name("new").write_bytes(craft({}, b""))
        os.replace(p.with_name("new"), p)  # another inode: the map keeps the old file's pages
        np.testing.assert_array_equal(f.f32("a"), a)
    p.write_bytes(buf)
    with SafeTensors.open(p) as f:
        with open(p, "ab") as grow:
            grow.write(b"more")
        np.testing.assert_array_equal(f.f32("a"), a)


def test_safetensors_names_a_tensor_name_or_shape_of_the_wrong_type():
    """f32(["model.norm.weight"]) raised "TypeError: unhashable type: 'list'", f32(name, shape=64)
    "TypeError: 'int' object is not iterable"; now a ValueError naming the argument."""
    with SafeTensors.open(TINY / "model.safetensors") as f:
        for call, words in ((lambda: f.f32(["model.norm.weight"]), "a tensor name is a str, got list"),
                            (lambda: f.raw(5), "a tensor name is a str, got int 5"),
                            (lambda: f.f32("model.norm.weight", shape=64), "shape must be a tuple of ints, got int 64")):
            with raises_naming(ValueError, f"^{re.escape(words)}", "model"):
                call()
        assert f.f32("model.norm.weight", shape=[64]).shape == (64,)


def test_safetensors_reader_rules_valid_files_equal_the_library(tmp_path):
    meta = {"format": "np", "quant": "none", "note": "é ünïcode"}
    buf = lib_save(VALID_TENSORS, metadata=meta)
    oracle = lib_load(buf)
    for layout in both_ways(buf, tmp_path):
        assert layout.metadata == meta
        assert set(layout.tensors) == set(VALID_TENSORS)
        assert layout.file_size == len(buf)
    with SafeTensors.open(tmp_path / "f.safetensors") as f:
        assert sorted(f.names()) == sorted(VALID_TENSORS)
        for name, want in oracle.items():
            raw = f.raw(name)
            assert raw.shape == want.shape
            if want.dtype == np.float16:  # F16 is handed out as its bit patterns
                assert raw.dtype == np.uint16
                np.testing.assert_array_equal(raw, want.view(np.uint16))
            else:
                assert raw.dtype == want.dtype
                np.testing.assert_array_equal(raw, want)
            if want.dtype in (np.float32, np.float16):
                got = f.f32(name, shape=want.shape)
                assert got.dtype == np.float32 and got.shape == want.shape
                np.testing.assert_array_equal(got, want.astype(np.float32))
            else:
                with raises_naming(FormatError, name, "model"):
                    f.f32(name)


def test_safetensors_reader_rules_bf16_and_f16_each_read_as_itself(tmp_path):
    # Values exactly representable in BF16: their BF16 bits are the top half of their f32 bits.
    values = np.array([1.0, -2.5, 0.15625, 2.0**127, -(2.0**-126), 96.0, 0.0], dtype=np.float32)
    bf16_bits = (values.view(np.uint32) >> 16).astype(np.uint16)
    assert np.array_equal((bf16_bits.astype(np.uint32) << 16).view(np.float32), values)
    f16_values = np.array([1.0, -2.5, 0.15625, 65504.0, 6.0e-8, 96.0, 0.0], dtype=np.float16)
    n = len(values) * 2
    header = {"b": entry("BF16", [len(values)], 0, n), "h": entry("F16", [len(values)], n, 2 * n)}
    buf = craft(header, bf16_bits.tobytes() + f16_values.tobytes())
    p = tmp_path / "mixed.safetensors"
    p.write_bytes(buf)
    with SafeTensors.open(p) as f:
        np.testing.assert_array_equal(f.f32("b"), values)
        np.testing.assert_array_equal(f.f32("h"), f16_values.astype(np.float32))
        np.testing.assert_array_equal(f.raw("b"), bf16_bits)
        # The pitfall (s12): the same BF16 bits read as F16 are not slightly off but wildly off.
        with np.errstate(invalid="ignore"):
            as_f16 = f.raw("b").view(np.float16).astype(np.float32)
        assert f.raw("b")[0] == 0x3F80 and as_f16[0] == 1.875  # BF16 1.0 read as F16
        assert as_f16[2] == 1.53125 and values[2] == 0.15625  # exponent bits land in the mantissa
        assert not np.isfinite(as_f16[3]) and values[3] == 2.0**127


@pytest.mark.hf
def test_safetensors_reader_rules_bf16_against_the_library():
    """The bundled tiny Llama is BF16 written by safetensors.torch: the torch loader is the oracle."""
    torch = need("torch")
    from safetensors.torch import load_file

    oracle = load_file(str(TINY / "model.safetensors"))
    with SafeTensors.open(TINY / "model.safetensors") as f:
        assert sorted(f.names()) == sorted(oracle)
        for name, t in oracle.items():
            assert f.layout.tensors[name].dtype == "BF16" and t.dtype == torch.bfloat16
            np.testing.assert_array_equal(f.f32(name), t.to(torch.float32).numpy())


def test_safetensors_reader_rules_offsets_count_from_the_data_buffer(tmp_path):
    """A file whose offsets are right relative to the data buffer but would read header bytes from
    the start of the file: the values prove the reader adds 8 + N (pitfall s11)."""
    a = np.array([1.0, 2.0, 3.0, 4.0], dtype=np.float32)
    b = np.array([-7.0, 8.5], dtype=np.float32)
    buf = lib_save({"a": a, "b": b})
    p = tmp_path / "ab.safetensors"
    p.write_bytes(buf)
    with SafeTensors.open(p) as f:
        assert f.layout.data_start == 8 + struct.unpack("<Q", buf[:8])[0]
        np.testing.assert_array_equal(f.f32("a"), a)
        np.testing.assert_array_equal(f.f32("b"), b)


def test_safetensors_reader_rules_header_padding_and_empty_files(tmp_path):
    data = np.arange(4, dtype=np.float32).tobytes()
    padded = craft({"x": entry("F32", [4], 0, 16)}, data, header_len=200)  # trailing spaces: fine
    for layout in both_ways(padded, tmp_path):
        assert layout.data_start == 208 and layout.tensors["x"].shape == (4,)
    no_tensors = craft({"__metadata__": {"a": "b"}}, b"")
    for layout in both_ways(no_tensors, tmp_path):
        assert layout.tensors == {} and layout.metadata == {"a": "b"}
    only_empty = craft({"e": entry("F16", [0], 0, 0), "f": entry("I64", [3, 0, 2], 0, 0)}, b"")
    for layout in both_ways(only_empty, tmp_path):
        assert set(layout.tensors) == {"e", "f"}
    with SafeTensors.open(tmp_path / "f.safetensors") as f:
        assert f.raw("f").shape == (3, 0, 2) and f.f32("e").shape == (0,)


# ---------------------------------------------------------------------------------------------
# safetensors_reader_rules: each malformed file is refused with FormatError
# ---------------------------------------------------------------------------------------------

F4 = np.arange(4, dtype=np.float32).tobytes()  # 16 bytes


def _file_start_offsets() -> bytes:
    """Offsets counted from the start of the file (the writer's version of pitfall s11)."""
    H = 200
    start = 8 + H
    header = {"a": entry("F32", [4], start + 0, start + 16), "b": entry("F32", [4], start + 16, start + 32)}
    return craft(header, F4 + F4, header_len=H)


def _valid() -> bytes:
    return lib_save({"a": np.ones(4, np.float32), "b": np.arange(6, dtype=np.uint8)})


MALFORMED = {
    "offsets_from_the_start_of_the_file": (_file_start_offsets(), ["start of the file"]),
    "gap": (craft({"a": entry("F32", [2], 0, 8), "b": entry("F32", [2], 12, 20)}, bytes(20)), ["gap", "'b'"]),
    "gap_at_the_start": (craft({"a": entry("F32", [4], 4, 20)}, bytes(20)), ["gap", "'a'"]),
    "overlap": (craft({"a": entry("F32", [2], 0, 8), "b": entry("F32", [2], 4, 12)}, bytes(12)), ["overlap", "'b'", "'a'"]),
    "same_range_twice": (craft({"a": entry("F32", [2], 0, 8), "b": entry("F32", [2], 0, 8)}, bytes(8)), ["overlap"]),
    "trailing_bytes": (_valid() + b"\0\0\0\0", ["trailing"]),
    "length_disagrees_with_shape": (craft({"a": entry("F32", [2, 2], 0, 12)}, bytes(12)), ["'a'", "needs", "16"]),
    "length_disagrees_with_itemsize": (craft({"a": entry("F16", [4], 0, 16)}, bytes(16)), ["'a'", "needs", "8"]),
    "header_length_past_the_end": (struct.pack("<Q", 1000) + b"{}" + bytes(10), ["past the end of the file"]),
    "header_length_over_100MB": (struct.pack("<Q", MAX_HEADER_BYTES + 1) + b"{}", ["100 MB"]),
    "header_length_absurd": (b"\xff" * 8 + b"{}", ["100 MB"]),
    "truncated_in_the_data": (_valid()[:-3], ["truncated", "'b'"]),
    "truncated_in_the_header": (_valid()[:20], ["past the end of the file"]),
    "shorter_than_8_bytes": (b"\x02\0\0", ["shorter"]),
    "empty_file": (b"", ["shorter"]),
    "bad_json": (craft({}, b"", raw_header=b'{"a": {"dtype": "F32",'), ["not valid JSON: Expecting", "char 22"]),  # where
    "not_utf8": (craft({}, b"", raw_header=b'{"\xff\xfe": 1}'), ["not valid JSON: 'utf-8' codec can't decode byte 0xff"]),
    "not_an_object": (craft({}, b"", raw_header=b"[1, 2, 3]"), ["JSON object"]),
    "leading_whitespace": (craft({}, b"", raw_header=b" {}"), ["JSON object"]),
    "garbage_after_the_object": (craft({}, b"", raw_header=b"{}  xx"), ["not spaces"]),
    "nan_in_the_header": (craft({}, b"", raw_header=b'{"__metadata__": {"a": NaN}}'), ["not valid JSON"]),
    "absurd_nesting": (craft({}, b"", raw_header=b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"), ["not valid JSON"]),
    "unknown_dtype": (craft({"a": entry("F8_E4M3", [4], 0, 4)}, bytes(4)), ["unknown dtype", "F8_E4M3"]),
    "dtype_not_a_string": (craft({"a": entry(4, [4], 0, 4)}, bytes(4)), ["unknown dtype"]),
    "negative_shape": (craft({"a": entry("U8", [-2, -2], 0, 4)}, bytes(4)), ["'a'", "shape"]),
    "float_shape": (craft({"a": entry("U8", [2.0, 2], 0, 4)}, bytes(4)), ["'a'", "shape"]),
    "string_shape": (craft({"a": entry("U8", ["4"], 0, 4)}, bytes(4)), ["'a'", "shape"]),
    "bool_shape": (craft({"a": entry("U8", [True], 0, 1)}, bytes(1)), ["'a'", "shape"]),
    "shape_not_a_list": (craft({"a": entry("U8", 4, 0, 4)}, bytes(4)), ["'a'", "shape"]),
    "huge_shape": (craft({"a": entry("F32", [2**40, 2**40], 0, 16)}, bytes(16)), ["'a'", "needs"]),
    "negative_offset": (craft({"a": entry("U8", [4], -4, 0)}, bytes(4)), ["'a'", "data_offsets"]),
    "offsets_end_before_begin": (craft({"a": entry("U8", [0], 4, 0)}, bytes(4)), ["'a'", "end before"]),
    "offsets_three_numbers": (craft({"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 2, 4]}}, bytes(4)), ["'a'", "data_offsets"]),
    "entry_missing_a_key": (craft({"a": {"dtype": "U8", "shape": [4]}}, bytes(4)), ["'a'", "exactly", "got ['dtype', 'shape']"]),
    "entry_with_an_extra_key": (craft({"a": {**entry("U8", [4], 0, 4), "x": 1}}, bytes(4)), ["'a'", "exactly", "'x']"]),
    "entry_not_an_object": (craft({"a": [1, 2]}, b""), ["'a'", "exactly", "got list"]),
    "metadata_not_strings": (craft({"__metadata__": {"quant": 4}}, b""), ["__metadata__"]),
    "empty_name": (craft({"": entry("U8", [4], 0, 4)}, bytes(4)), ["empty name"]),
    "duplicate_name": (
        craft({}, bytes(8), raw_header=b'{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, '
                                       b'"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}'),
        ["repeats the key 'a'"],
    ),
    "duplicate_key_in_an_entry": (
        craft({}, bytes(4), raw_header=b'{"a": {"dtype": "F32", "dtype": "U8", "shape": [1], "data_offsets": [0, 4]}}'),
        ["repeats the key 'dtype'"],
    ),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_safetensors_reader_rules_refusals(case, tmp_path):
    buf, words = MALFORMED[case]
    refused(buf, tmp_path, words)


def test_safetensors_reader_rules_malformed_cases_are_otherwise_valid():
    """Each hand-made refusal differs from a valid file in its one rule: the fixed versions parse."""
    fixed = {
        "offsets_from_the_start_of_the_file": craft(
            {"a": entry("F32", [4], 0, 16), "b": entry("F32", [4], 16, 32)}, F4 + F4, header_len=200),
        "gap": craft({"a": entry("F32", [2], 0, 8), "b": entry("F32", [2], 8, 16)}, bytes(16)),
        "overlap": craft({"a": entry("F32", [2], 0, 8), "b": entry("F32", [2], 8, 16)}, bytes(16)),
        "trailing_bytes": _valid(),
        "length_disagrees_with_shape": craft({"a": entry("F32", [3], 0, 12)}, bytes(12)),
    }
    for case, buf in fixed.items():
        assert parse_layout(buf).tensors, case
    # the library agrees with the file-start-offsets refusal
    with pytest.raises(Exception):
        lib_load(MALFORMED["offsets_from_the_start_of_the_file"][0])


def test_safetensors_reader_reads_only_what_it_is_asked(tmp_path):
    buf = lib_save({"a": np.ones((2, 3), np.float32)})
    p = tmp_path / "a.safetensors"
    p.write_bytes(buf)
    f = SafeTensors.open(p)
    with raises_naming(FormatError, "'nope'", "model"):
        f.f32("nope")
    with raises_naming(FormatError, r"shape \(2, 3\), expected \(3, 2\)", "model"):
        f.f32("a", shape=(3, 2))
    view = f.raw("a")
    assert not view.flags.writeable and not view.flags.owndata  # a view into the map
    copy_ = f.f32("a")
    assert copy_.flags.owndata or copy_.base is not None and copy_.base.flags.owndata
    f.close()
    assert np.array_equal(view, np.ones((2, 3)))  # a live view keeps the map alive
    np.testing.assert_array_equal(copy_, np.ones((2, 3), np.float32))
    with raises_naming(ValueError, "closed", "model"):
        f.raw("a")
    with SafeTensors.open(p) as g:
        assert repr(g) == f"SafeTensors({str(p)!r}, 1 tensors)"
    assert repr(g) == f"SafeTensors({str(p)!r}, closed)"  # what the refusal of a closed file names


# ---------------------------------------------------------------------------------------------
# Fuzz: random byte changes and truncations either load correctly or raise FormatError
# ---------------------------------------------------------------------------------------------

FUZZ_SEED_FILE = lib_save(
    {"w": np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4), "h": np.array([1.0, -0.5], np.float16),
     "q": np.arange(6, dtype=np.uint8).reshape(2, 3), "i": np.array([7], np.int32), "e": np.zeros((0,), np.float32)},
    metadata={"quant": "int4-g32-sym"},
)
ALLOC_BUDGET = 1_000_000  # bytes: the fuzzed files are ~500 bytes; a reader trusting a bad shape allocates GBs


def _load_everything(buf: bytes) -> dict | None:
    """Read every tensor of buf the way the engine would; None when refused with FormatError."""
    try:
        layout = parse_layout(buf)
    except FormatError:
        return None
    f = SafeTensors(Path("fuzz.safetensors"), buf, layout)
    out = {}
    for name, t in layout.tensors.items():
        out[name] = f.raw(name)
        assert out[name].shape == t.shape
        if t.dtype in ("F32", "F16", "BF16"):
            assert f.f32(name).shape == t.shape
    return out


def _check_fuzzed(buf: bytes, tmp: Path) -> None:
    tracemalloc.start()
    try:
        got = _load_everything(buf)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < ALLOC_BUDGET + 10 * len(buf), f"allocated {peak} bytes for a {len(buf)}-byte file"
    p = tmp / "fuzz.safetensors"
    p.write_bytes(buf)
    try:
        with SafeTensors.open(p) as f:
            assert got is not None, "SafeTensors.open accepted what parse_layout refused"
            assert f.names() == list(got)
    except FormatError:
        assert got is None, "SafeTensors.open refused what parse_layout accepted"
    if got is not None:  # accepted: the library must read the same thing
        oracle = lib_load(buf)
        assert set(oracle) == set(got)
        for name, want in oracle.items():
            np.testing.assert_array_equal(got[name], want.view(np.uint16) if want.dtype == np.float16 else want)


@pytest.fixture(scope="module")
def fuzz_dir():
    with tempfile.TemporaryDirectory() as d:
        yield Path(d)


@settings(max_examples=150, deadline=2000, suppress_health_check=[HealthCheck.too_slow])
@given(
    changes=st.lists(st.tuples(st.integers(0, len(FUZZ_SEED_FILE) - 1), st.integers(0, 255)), max_size=6),
    cut=st.one_of(st.none(), st.integers(0, len(FUZZ_SEED_FILE))),
)
@example(changes=[], cut=0)  # the hard cases, every run (issue 62): an empty file,
@example(changes=[], cut=8)  # the length word alone,
@example(changes=[], cut=9)  # one byte of the header,
@example(changes=[(7, 255)], cut=None)  # a header length near 2^64,
@example(changes=[(0, 0), (1, 0)], cut=None)  # a zero header length
def test_safetensors_reader_survives_random_bytes(fuzz_dir, changes, cut):
    buf = bytearray(FUZZ_SEED_FILE)
    for pos, value in changes:
        buf[pos] = value
    if cut is not None:
        buf = buf[:cut]
    _check_fuzzed(bytes(buf), fuzz_dir)


JSONISH = st.one_of(
    st.integers(-(2**70), 2**70), st.integers(-2, 64), st.floats(allow_nan=False), st.text(max_size=4),
    st.booleans(), st.none(),
)


@settings(max_examples=100, deadline=2000)
@given(
    dtype=st.one_of(st.sampled_from(["F32", "F16", "BF16", "U8", "I64", "F8_E5M2", "f32", ""]), st.integers()),
    shape=st.one_of(st.lists(st.one_of(st.integers(-1, 5), JSONISH), max_size=4), JSONISH),
    offsets=st.one_of(st.lists(st.one_of(st.integers(-1, 40), JSONISH), max_size=3), JSONISH),
    data_len=st.integers(0, 40),
)
@example(dtype="F32", shape=[0], offsets=[0, 0], data_len=0)  # zero-size tensor (issue 62's hard cases)
@example(dtype="F32", shape=[], offsets=[0, 4], data_len=4)  # a scalar
@example(dtype="F32", shape=[1], offsets=[0, 3], data_len=3)  # one byte short
@example(dtype="F32", shape=[-1], offsets=[0, 4], data_len=4)  # a negative dimension
@example(dtype="F32", shape=[1], offsets=[4, 0], data_len=4)  # offsets reversed
@example(dtype="U8", shape=[2**62, 4], offsets=[0, 0], data_len=0)  # a numel that overflows
def test_safetensors_reader_survives_random_headers(fuzz_dir, dtype, shape, offsets, data_len):
    header = {"t": {"dtype": dtype, "shape": shape, "data_offsets": offsets}}
    try:
        buf = craft(header, bytes(range(data_len)))
    except (ValueError, OverflowError):  # json.dumps refuses some floats; nothing to test
        return
    got = _load_everything(buf)
    if got is not None:
        t = parse_layout(buf).tensors["t"]
        assert t.data_offsets == (0, data_len) and t.nbytes == t.numel * {"F32": 4, "F16": 2, "BF16": 2, "U8": 1, "I64": 8}[t.dtype]


# ---------------------------------------------------------------------------------------------
# Memory: a 1 GB tensor is mapped, not read
# ---------------------------------------------------------------------------------------------


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def test_safetensors_reader_maps_a_1gb_file_without_reading_it(tmp_path):
    big = 2**30
    header = {"small": entry("F32", [4], 0, 16), "big": entry("F32", [big // 4], 16, 16 + big)}
    head = craft(header, np.array([1, 2, 3, 4], np.float32).tobytes())
    p = tmp_path / "sparse.safetensors"
    with open(p, "wb") as f:
        f.write(head)
        f.truncate(len(head) + big)  # a sparse file: 1 GB long, a few KB on disk
    assert p.stat().st_size > big
    before = _rss_bytes()
    with SafeTensors.open(p) as st_:
        np.testing.assert_array_equal(st_.f32("small"), [1, 2, 3, 4])
        first = float(st_.raw("big")[0])  # touches one page of the big tensor
        grown = _rss_bytes() - before
    assert first == 0.0
    assert grown < 64 * 2**20, f"resident memory grew by {grown / 2**20:.0f} MiB"


# ---------------------------------------------------------------------------------------------
# config_refuses_what_the_engine_cannot_run
# ---------------------------------------------------------------------------------------------

TINY_CONFIG = json.loads((TINY / "config.json").read_text())

# Public config.json files of Llama-family models (shape fields as published on the Hub), without
# the tl_ keys a converted model directory adds.
SMOLLM2_135M = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 0, "eos_token_id": 0, "hidden_act": "silu", "hidden_size": 576,
    "initializer_range": 0.041666666666666664, "intermediate_size": 1536, "is_llama_config": True,
    "max_position_embeddings": 8192, "model_type": "llama", "num_attention_heads": 9,
    "num_hidden_layers": 30, "num_key_value_heads": 3, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
    "rope_interleaved": False, "rope_scaling": None, "rope_theta": 100000, "tie_word_embeddings": True,
    "torch_dtype": "bfloat16", "transformers_version": "4.40.1", "use_cache": True, "vocab_size": 49152,
}
TINYLLAMA_1_1B = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "bos_token_id": 1, "eos_token_id": 2,
    "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 5632,
    "max_position_embeddings": 2048, "model_type": "llama", "num_attention_heads": 32,
    "num_hidden_layers": 22, "num_key_value_heads": 4, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
    "rope_scaling": None, "rope_theta": 10000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "transformers_version": "4.35.0", "use_cache": True, "vocab_size": 32000,
}
LLAMA_3_2_1B = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": 128001, "head_dim": 64, "hidden_act": "silu",
    "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 8192,
    "max_position_embeddings": 131072, "mlp_bias": False, "model_type": "llama",
    "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8, "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
    "transformers_version": "4.45.0.dev0", "use_cache": True, "vocab_size": 128256,
}
TL_KEYS = {"tl_arch": "llama", "tl_tokenizer": "bpe"}


def _without(cfg: dict, key: str) -> dict:
    return {k: v for k, v in cfg.items() if k != key}


def _with(**changes) -> dict:
    return {**copy.deepcopy(TINY_CONFIG), **changes}


# case -> (config text, words the message must contain)
REFUSALS = {
    "missing_tl_arch": (_without(TINY_CONFIG, "tl_arch"), ["tl_arch", "missing"]),
    "unknown_tl_arch": (_with(tl_arch="gpt2"), ["tl_arch", "gpt2"]),
    "missing_tl_tokenizer": (_without(TINY_CONFIG, "tl_tokenizer"), ["tl_tokenizer", "missing"]),
    "unknown_tl_tokenizer": (_with(tl_tokenizer="sentencepiece"), ["tl_tokenizer"]),
    "rope_scaling_llama3": (_with(rope_scaling=LLAMA_3_2_1B["rope_scaling"]), ["rope_scaling.rope_type", '"llama3"', "scaled RoPE"]),
    "rope_scaling_linear_old_key": (_with(rope_scaling={"type": "linear", "factor": 2.0}), ["rope_scaling.type", '"linear"']),
    "rope_scaling_without_a_type": (_with(rope_scaling={"factor": 2.0}), ["rope_scaling"]),
    "rope_parameters_yarn": (_with(rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}), ["rope_parameters.rope_type", '"yarn"']),
    "partial_rotary_factor": (_with(partial_rotary_factor=0.5), ["partial_rotary_factor"]),
    "rope_interleaved": (_with(rope_interleaved=True), ["rope_interleaved"]),
    "rope_theta_disagrees": (_with(rope_parameters={"rope_type": "default", "rope_theta": 5e5}), ["rope_theta", "disagrees"]),
    "rope_theta_zero": (_with(rope_theta=0), ["rope_theta"]),
    "sliding_window": (_with(sliding_window=4096), ["sliding_window", "4096"]),
    "use_sliding_window": (_with(use_sliding_window=True), ["use_sliding_window"]),
    "attention_bias": (_with(attention_bias=True), ["attention_bias", "true"]),
    "mlp_bias": (_with(mlp_bias=True), ["mlp_bias", "true"]),
    "hidden_act_gelu": (_with(hidden_act="gelu"), ["hidden_act", '"gelu"']),
    "heads_do_not_divide_hidden": (_with(hidden_size=66, head_dim=None), ["hidden_size 66", "num_attention_heads 4"]),
    "kv_heads_do_not_divide_heads": (_with(num_key_value_heads=3), ["num_key_value_heads", "not divisible"]),
    "more_kv_heads_than_heads": (_with(num_key_value_heads=8), ["num_key_value_heads"]),
    "head_dim_contradicts": (_with(head_dim=32), ["head_dim", "32", "64 / 4 = 16"]),
    "head_dim_odd": (_with(hidden_size=36, head_dim=None, num_attention_heads=4, num_key_value_heads=2), ["head_dim", "even"]),
    "hidden_size_zero": (_with(hidden_size=0), ["hidden_size", "minimum"]),
    "negative_vocab": (_with(vocab_size=-1), ["vocab_size"]),
    "no_layers": (_with(num_hidden_layers=0), ["num_hidden_layers"]),
    "size_as_a_string": (_with(intermediate_size="128"), ["intermediate_size", "integer"]),
    "size_as_a_fraction": (_with(intermediate_size=127.5), ["intermediate_size", "integer"]),
    "missing_hidden_size": (_without(TINY_CONFIG, "hidden_size"), ["hidden_size", "missing"]),
    "eps_negative": (_with(rms_norm_eps=-1e-5), ["rms_norm_eps"]),
    "eps_infinite_in_float32": (_with(rms_norm_eps=1e300), ["rms_norm_eps", "1e+300", "float32"]),
    "eps_zero_in_float32": (_with(rms_norm_eps=1e-50), ["rms_norm_eps", "float32"]),
    "rope_theta_zero_in_float32": (_with(rope_theta=1e-300), ["rope_theta", "1e-300", "float32"]),
    "rope_theta_subnormal_in_float32": (_with(rope_theta=1e-40), ["rope_theta", "float32",
                                                                   "; RoPE takes its powers in float32 and inverts them"]),
    "eos_outside_vocab": (_with(eos_token_id=[3, 300]), ["eos_token_id", "300"]),
    "eos_negative": (_with(eos_token_id=-1), ["eos_token_id"]),
    "bos_outside_vocab": (_with(bos_token_id=256), ["bos_token_id", "256"]),
    "byte_tokenizer_small_vocab": (_with(vocab_size=100, eos_token_id=3), ["vocab_size", "byte"]),
    "not_llama_model_type": (_with(model_type="qwen2"), ["model_type", '"qwen2"']),
    "max_positions_zero": (_with(max_position_embeddings=0), ["max_position_embeddings"]),
    "tl_quant_unknown": (_with(tl_quant="int8"), ["tl_quant"]),
    "chat_template_not_text": (_with(tl_chat_template=5), ["tl_chat_template"]),
    "not_an_object": ([1, 2], ["(the whole file)"]),
}
BAD_TEXT = {
    "bad_json": ('{"tl_arch": "llama",', ["not valid JSON"]),
    "nan": (json.dumps(TINY_CONFIG)[:-1] + ', "rms_norm_eps": NaN}', ["not valid JSON"]),
    "duplicate_key": ('{"tl_arch": "llama", "tl_arch": "bigram", "tl_tokenizer": "byte"}', ["repeats the key 'tl_arch'"]),
    "not_utf8": (b'{"tl_arch": "\xff"}', ["not valid JSON"]),
}


def test_config_json_that_is_too_big_is_refused_unread(tmp_path):
    from tl_lab.model import MAX_CONFIG_BYTES

    (tmp_path / "config.json").write_bytes(b" " * (MAX_CONFIG_BYTES + 1))
    with raises_naming(ConfigError, "over the 10,000,000-byte limit", "model"):
        ModelConfig.load(tmp_path)


@pytest.mark.parametrize("field, value", [("num_hidden_layers", True), ("vocab_size", 256.0), ("hidden_size", "64"),
                                          ("rope_theta", "1e4"), ("rms_norm_eps", float("nan"))])
def test_a_config_built_in_code_checks_its_field_types(field, value):
    good = ModelConfig.from_json(json.dumps(TINY_CONFIG))
    with raises_naming(ConfigError, field, "model"):
        dataclasses.replace(good, **{field: value})
    assert type(dataclasses.replace(good, vocab_size=np.int64(256)).vocab_size) is int


@pytest.mark.parametrize("field, value, words", [
    ("tie_word_embeddings", "no", "tie_word_embeddings must be true or false, got 'no'"),
    ("tie_word_embeddings", 1, "tie_word_embeddings must be true or false, got 1"),
    ("bos_token_id", 1.5, "bos_token_id must be an integer, got float 1.5"),
    ("bos_token_id", True, "bos_token_id must be an integer, got bool True"),
    ("eos_token_ids", [2.5], "eos_token_ids[0] must be an integer, got float 2.5"),
    ("eos_token_ids", [1, True], "eos_token_ids[1] must be an integer, got bool True"),
    ("eos_token_ids", 2, "eos_token_ids must be a list of token ids, got int"),
    ("eos_token_ids", "ab", "eos_token_ids must be a list of token ids, got str"),
    ("chat_template", 5, "chat_template must be a string or null, got int"),
])
def test_a_config_built_in_code_checks_its_bool_id_and_text_fields(field, value, words):
    """ModelConfig built in code (dataclasses.replace, a notebook) took tie_word_embeddings="no" as
    true (the head tied), bos_token_id=1.5 and eos_token_ids=[2.5] or [True] as ids, and
    eos_token_ids=2 was "TypeError: 'int' object is not iterable"; now each is a ConfigError naming it."""
    good = ModelConfig.from_json(json.dumps(TINY_CONFIG))
    with raises_naming(ConfigError, f"^{re.escape(words)}$", "model"):
        dataclasses.replace(good, **{field: value})
    ok = dataclasses.replace(good, tie_word_embeddings=np.bool_(True), bos_token_id=np.int64(1), eos_token_ids=(2,))
    assert ok.tie_word_embeddings is True and type(ok.bos_token_id) is int and ok.eos_token_ids == [2]


@pytest.mark.parametrize("field", ["hidden_size", "num_attention_heads", "head_dim"])
def test_a_config_built_in_code_with_a_zero_size_names_it(field):
    """The schema refuses 0 in a file; a config built in code meets __post_init__'s own check, whose
    message must name the field and the value (mutation testing, issue 20: a broken message was a
    TypeError, exit 4, and no test saw it)."""
    good = ModelConfig.from_json(json.dumps(TINY_CONFIG))
    with raises_naming(ConfigError, rf"^{field}: must be positive, got 0$", "model"):
        dataclasses.replace(good, **{field: 0})


def test_names_are_in_file_order_not_name_order(tmp_path):
    """`names()` lists tensors by data offset (the checkpoint widget draws them so), whatever their
    names sort as (mutation testing, issue 20: sorting by name went unnoticed)."""
    header = {"b": entry("F32", [1], 0, 4), "a": entry("F32", [2], 4, 12), "c": entry("F32", [0], 12, 12)}
    p = tmp_path / "order.safetensors"
    p.write_bytes(craft(header, bytes(12)))
    with SafeTensors.open(p) as f:
        assert f.names() == ["b", "a", "c"]


def test_param_count_does_not_grow_with_the_layer_count():
    good = ModelConfig.from_json(json.dumps(TINY_CONFIG))
    table = {}
    for layers in (1, 2, 5):
        c = dataclasses.replace(good, num_hidden_layers=layers)
        table[layers] = sum(math.prod(s) for s in tensor_shapes(c).values())
        assert c.param_count() == table[layers]
    huge = dataclasses.replace(good, num_hidden_layers=10**9)  # a table of 9e9 names would never finish
    assert huge.param_count() == table[1] + (10**9 - 1) * (table[2] - table[1])


@pytest.mark.parametrize("case", list(REFUSALS) + list(BAD_TEXT))
def test_config_refuses_what_the_engine_cannot_run(case, tmp_path):
    if case in REFUSALS:
        cfg, words = REFUSALS[case]
        text = json.dumps(cfg)
    else:
        text, words = BAD_TEXT[case]
    with pytest.raises(ConfigError) as e:
        ModelConfig.from_json(text)
    for w in words:
        assert not names_all(str(e.value), w, "model"), f"{w!r} not named in {str(e.value)!r}"
    # ModelConfig.load and load_weights refuse it the same way
    (tmp_path / "config.json").write_bytes(text.encode() if isinstance(text, str) else text)
    with pytest.raises(ConfigError):
        ModelConfig.load(tmp_path)
    with pytest.raises(ConfigError):
        load_weights(tmp_path)


def test_config_refuses_real_models_without_the_tl_keys():
    for cfg in (SMOLLM2_135M, TINYLLAMA_1_1B):
        with raises_naming(ConfigError, "tl_arch is missing.*tl_tokenizer is missing", "model"):
            ModelConfig.from_json(json.dumps(cfg))


def test_config_of_real_llama_family_models():
    smol = ModelConfig.from_json(json.dumps({**SMOLLM2_135M, **TL_KEYS}))
    assert (smol.hidden_size, smol.num_attention_heads, smol.num_key_value_heads, smol.head_dim) == (576, 9, 3, 64)
    assert smol.rope_theta == 100000.0 and smol.tie_word_embeddings and smol.eos_token_ids == [0]
    assert smol.param_count() == 134_515_008  # SmolLM2-135M's published parameter count
    tl = ModelConfig.from_json(json.dumps({**TINYLLAMA_1_1B, **TL_KEYS}))
    assert (tl.head_dim, tl.n_rep, tl.tie_word_embeddings, tl.rope_theta) == (64, 8, False, 10000.0)
    assert tl.param_count() == 1_100_048_384  # TinyLlama-1.1B
    # Llama-3.2-1B: a scaled RoPE (rope_type llama3) is refused, in either transformers layout...
    with raises_naming(ConfigError, r"rope_scaling\.rope_type must be \"default\", got \"llama3\"", "model"):
        ModelConfig.from_json(json.dumps({**LLAMA_3_2_1B, **TL_KEYS}))
    v5 = {**_without(_without(LLAMA_3_2_1B, "rope_scaling"), "rope_theta"), **TL_KEYS,
          "rope_parameters": {**LLAMA_3_2_1B["rope_scaling"], "rope_theta": 500000.0}}
    with raises_naming(ConfigError, r"rope_parameters\.rope_type must be \"default\", got \"llama3\"", "model"):
        ModelConfig.from_json(json.dumps(v5))
    # ...and it is the only reason: without the scaling the same shapes parse.
    plain = ModelConfig.from_json(json.dumps({**LLAMA_3_2_1B, **TL_KEYS, "rope_scaling": None}))
    assert (plain.head_dim, plain.rope_theta, plain.eos_token_ids) == (64, 500000.0, [128001])
    assert plain.param_count() == 1_235_814_400  # Llama-3.2-1B


def test_config_reads_both_huggingface_layouts():
    base = _without(TINY_CONFIG, "rope_theta")
    v4 = ModelConfig.from_json(json.dumps({**base, "rope_theta": 500000.0, "rope_scaling": None}))
    v5 = ModelConfig.from_json(json.dumps({**_without(base, "rope_scaling"),
                                           "rope_parameters": {"rope_theta": 500000.0, "rope_type": "default"}}))
    both = ModelConfig.from_json(json.dumps({**base, "rope_theta": 500000,
                                             "rope_parameters": {"rope_theta": 500000.0, "rope_type": "default"}}))
    assert v4 == v5 == both and v4.rope_theta == 500000.0
    default = ModelConfig.from_json(json.dumps(_without(base, "rope_scaling")))
    assert default.rope_theta == 10000.0
    assert ModelConfig.from_json(json.dumps({**base, "rope_scaling": {"rope_type": "default"}})).rope_theta == 10000.0


def test_config_defaults_and_optional_fields():
    c = ModelConfig.load(TINY)
    assert (c.arch, c.tokenizer, c.vocab_size, c.hidden_size, c.num_hidden_layers) == ("llama", "byte", 256, 64, 2)
    assert (c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.n_rep) == (4, 2, 16, 2)
    assert c.tie_word_embeddings and c.bos_token_id == 2 and c.eos_token_ids == [3] and c.chat_template is None
    lean = {k: v for k, v in TINY_CONFIG.items() if k not in ("head_dim", "num_key_value_heads", "eos_token_id", "bos_token_id")}
    d = ModelConfig.from_json(json.dumps(lean))
    assert (d.head_dim, d.num_key_value_heads, d.eos_token_ids, d.bos_token_id) == (16, 4, [], None)
    listed = ModelConfig.from_json(json.dumps(_with(eos_token_id=[3, 0], tl_chat_template="{{ x }}", head_dim=None)))
    assert listed.eos_token_ids == [3, 0] and listed.chat_template == "{{ x }}" and listed.head_dim == 16
    b = ModelConfig.load(BIGRAM)
    assert (b.arch, b.vocab_size, b.num_hidden_layers, b.eos_token_ids) == ("bigram", 256, 0, [3])
    assert b.param_count() == 256 * 256
    q = ModelConfig.load(TINY_INT4)
    assert q.quant == "int4-g32-sym" and q.param_count() == c.param_count()
    with raises_naming(ConfigError, "head_dim", "model"):
        ModelConfig("llama", "byte", 256, 64, 128, 2, 4, 2, 32)  # direct construction is checked too


def test_config_schema_is_a_real_json_schema():
    from jsonschema import Draft202012Validator

    schema = config_schema()
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    Draft202012Validator.check_schema(schema)  # the load no longer does (model._schema_validator)
    # no "format" keyword anywhere: loading may leave jsonschema's format checkers out (_import_validator)
    assert '"format"' not in json.dumps(schema)
    v = Draft202012Validator(schema)
    for ok in (TINY_CONFIG, json.loads((BIGRAM / "config.json").read_text()), {**SMOLLM2_135M, **TL_KEYS}):
        assert not list(v.iter_errors(ok))
    assert list(v.iter_errors({**LLAMA_3_2_1B, **TL_KEYS}))


# ---------------------------------------------------------------------------------------------
# Int4 files and quantize-at-load (section 2.5)
# ---------------------------------------------------------------------------------------------


def test_int4_file_equals_quantize_of_the_f32_weights():
    config = ModelConfig.load(TINY)
    with SafeTensors.open(TINY / "model.safetensors") as src, SafeTensors.open(TINY_INT4 / "model.safetensors") as q:
        assert q.metadata["quant"] == "int4-g32-sym"
        n = 0
        for name, (out, inp) in ((k, s) for k, s in tensor_shapes(config).items() if k.endswith("_proj.weight")):
            base = name[: -len(".weight")]
            assert q.layout.tensors[f"{base}.qweight"].dtype == "U8"
            assert q.layout.tensors[f"{base}.scales"].dtype == "F16"
            got = q.q4(base, out, inp, 32)
            want = QLinear.quantize(src.f32(name), 32)
            assert got.qweight.dtype == np.uint8 and got.scales.dtype == np.uint16
            np.testing.assert_array_equal(got.qweight, want.qweight)
            np.testing.assert_array_equal(got.scales, want.scales)
            n += 1
        assert n == 7 * config.num_hidden_layers


def test_q4_checks_the_metadata_and_the_tensors(tmp_path):
    with SafeTensors.open(TINY_INT4 / "model.safetensors") as q:
        with raises_naming(FormatError, "int4-g64-sym", "model"):
            q.q4("model.layers.0.self_attn.q_proj", 64, 64, 64)
        with raises_naming(FormatError, r"q_proj.qweight' is U8 \(64, 32\), expected U8 \(32, 32\)", "model"):
            q.q4("model.layers.0.self_attn.q_proj", 32, 64, 32)
        with raises_naming(FormatError, "'model.layers.9.mlp.up_proj.qweight'", "model"):
            q.q4("model.layers.9.mlp.up_proj", 128, 64, 32)
    with SafeTensors.open(TINY / "model.safetensors") as plain:
        with raises_naming(FormatError, "metadata quant is None", "model"):
            plain.q4("model.layers.0.self_attn.q_proj", 64, 64, 32)
    bad_dtype = lib_save({"l.qweight": np.zeros((2, 16), np.uint8), "l.scales": np.zeros((2, 1), np.uint16)},
                         metadata={"quant": "int4-g32-sym"})
    (tmp_path / "b.safetensors").write_bytes(bad_dtype)
    with SafeTensors.open(tmp_path / "b.safetensors") as f:
        with raises_naming(FormatError, r"'l.scales' is U16", "model"):
            f.q4("l", 2, 32, 32)


# ---------------------------------------------------------------------------------------------
# load_weights
# ---------------------------------------------------------------------------------------------


def test_load_weights_tiny_llama_tied_and_shaped():
    w = load_weights(TINY)
    c = w.config
    assert isinstance(w, LlamaWeights) and w.quant is None
    assert w.lm_head is None and w.head_weight is w.embed  # tied: the embedding is the LM head
    assert np.shares_memory(w.head.w, w.embed)
    assert w.embed.shape == (256, 64) and w.norm.shape == (64,) and len(w.layers) == 2
    shapes = tensor_shapes(c)
    with SafeTensors.open(TINY / "model.safetensors") as f:
        np.testing.assert_array_equal(w.embed, f.f32("model.embed_tokens.weight"))
        for i, layer in enumerate(w.layers):
            for field, module in LAYER_LINEARS:
                lin = getattr(layer, field)
                assert isinstance(lin, Linear) and lin.w.dtype == np.float32
                assert lin.w.shape == shapes[f"model.layers.{i}.{module}.weight"] == (lin.out, lin.inp)
                np.testing.assert_array_equal(lin.w, f.f32(f"model.layers.{i}.{module}.weight"))
            assert layer.input_layernorm.shape == layer.post_attention_layernorm.shape == (64,)
    assert layer.k_proj.out == c.num_key_value_heads * c.head_dim == 32  # GQA
    total = w.embed.size + w.norm.size + sum(
        l.input_layernorm.size + l.post_attention_layernorm.size + sum(x.w.size for x in l.linears().values())
        for l in w.layers)
    assert total == c.param_count()


def test_linear_forward_is_x_times_w_transposed():
    rng = np.random.default_rng(0)
    lin = Linear(rng.standard_normal((5, 8)).astype(np.float32))
    x = rng.standard_normal((3, 8)).astype(np.float32)
    rows = lin.forward(x)  # the compiled kernel: x @ w.T up to the order of the sum
    np.testing.assert_allclose(rows, x @ lin.w.T, rtol=1e-6, atol=1e-6)
    for i in range(3):
        np.testing.assert_array_equal(rows[i], lin.forward(x[i : i + 1])[0])
    with raises_naming(ValueError, r"\(m, 8\)", "model"):
        lin.forward(np.ones((3, 7), np.float32))
    with raises_naming(ValueError, "float32", "model"):
        Linear(np.ones((2, 2)))


def test_load_weights_bigram():
    w = load_weights(BIGRAM)
    assert isinstance(w, BigramWeights) and w.logits.shape == (256, 256) and w.logits.dtype == np.float32
    with raises_naming(ValueError, "bigram", "model"):
        load_weights(BIGRAM, quant=Int4(32))


def test_a_bigram_file_without_its_logits_is_refused_naming_the_tensor_and_the_count(tmp_path):
    import shutil

    shutil.copy(BIGRAM / "config.json", tmp_path / "config.json")
    lib_save_file({}, str(tmp_path / "model.safetensors"))
    with pytest.raises(FormatError) as refused:
        load_weights(tmp_path)
    assert not names_all(str(refused.value), "model.safetensors has no tensor 'bigram.logits' (config.json needs it): "
                                             "config.json needs 1 tensors (bigram.logits), the file holds 0", "model"), refused.value


def test_load_weights_int4_file_and_quantize_at_load_agree():
    f32 = load_weights(TINY)
    at_load = load_weights(TINY, quant=Int4(32))
    from_file = load_weights(TINY_INT4)
    for w in (at_load, from_file):
        assert w.quant == Int4(32) and w.lm_head is None
        np.testing.assert_array_equal(w.embed, f32.embed)
        np.testing.assert_array_equal(w.norm, f32.norm)
    for la, lb, lf in zip(at_load.layers, from_file.layers, f32.layers):
        np.testing.assert_array_equal(la.input_layernorm, lf.input_layernorm)
        for name, qa in la.linears().items():
            qb = lb.linears()[name]
            assert isinstance(qa, QLinear) and isinstance(qb, QLinear) and qa.group == 32
            np.testing.assert_array_equal(qa.qweight, qb.qweight)
            np.testing.assert_array_equal(qa.scales, qb.scales)
            W = lf.linears()[name].w
            s = np.repeat(qa.scales.view(np.float16).astype(np.float32), 32, axis=1)
            assert np.all(np.abs(qa.dequantize() - W) <= s / 2 * (1 + 1e-6))  # |W - W_hat| <= s / 2
    assert load_weights(TINY_INT4, quant=Int4(32)).quant == Int4(32)  # asking for what it is: fine
    with raises_naming(ValueError, "already int4-g32-sym", "model"):
        load_weights(TINY_INT4, quant=Int4(64))


def _write_llama(d: Path, cfg: dict, tensors: dict, metadata=None) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(cfg))
    lib_save_file(tensors, str(d / "model.safetensors"), metadata=metadata)
    return d


def _random_llama(layers=8, d=128, inter=256, tied=False, seed=0):
    cfg = {"tl_arch": "llama", "tl_tokenizer": "byte", "vocab_size": 256, "hidden_size": d,
           "intermediate_size": inter, "num_hidden_layers": layers, "num_attention_heads": 4,
           "num_key_value_heads": 2, "tie_word_embeddings": tied}
    rng = np.random.default_rng(seed)
    shapes = tensor_shapes(ModelConfig.from_json(json.dumps(cfg)))
    return cfg, {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}


def test_load_weights_int4_at_load_keeps_no_f32_linears(tmp_path):
    cfg, tensors = _random_llama()
    d = _write_llama(tmp_path / "m", cfg, tensors)
    f32_linears = sum(t.nbytes for k, t in tensors.items() if k.startswith("model.layers.") and k.endswith("_proj.weight"))
    largest = max(t.nbytes for k, t in tensors.items() if k.endswith("_proj.weight"))
    del tensors
    tracemalloc.start()
    try:
        w = load_weights(d, quant=Int4(32))
        current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert all(isinstance(x, QLinear) for l in w.layers for x in l.linears().values())
    assert isinstance(w.lm_head, Linear) and w.lm_head.w.dtype == np.float32  # untied head stays f32
    resident = sum(x.nbytes for l in w.layers for x in l.linears().values())
    assert resident < f32_linears / 6
    # The f32 linears (3.6 MB here) never coexist: the peak is the kept arrays plus a few copies of
    # the largest single linear (its f32 read and the quantizer's temporaries).
    kept = w.embed.nbytes + w.lm_head.w.nbytes + resident
    assert peak < kept + 8 * largest < f32_linears / 2, (peak, kept, largest, f32_linears)
    assert current < kept + largest


def test_load_weights_refuses_tensors_that_do_not_fit(tmp_path):
    cfg, tensors = _random_llama(layers=1, d=32, inter=64, tied=True)
    ok = _write_llama(tmp_path / "ok", cfg, tensors)
    assert load_weights(ok).lm_head is None
    missing = {k: v for k, v in tensors.items() if k != "model.layers.0.mlp.down_proj.weight"}
    with raises_naming(FormatError, "no tensor 'model.layers.0.mlp.down_proj.weight'", "model"):
        load_weights(_write_llama(tmp_path / "missing", cfg, missing))
    wrong = {**tensors, "model.norm.weight": np.ones(31, np.float32)}
    with raises_naming(FormatError, r"'model.norm.weight' has shape \(31,\), config.json needs \(32,\)", "model"):
        load_weights(_write_llama(tmp_path / "wrong", cfg, wrong))
    bias = {**tensors, "model.layers.0.self_attn.q_proj.bias": np.zeros(32, np.float32)}
    with raises_naming(FormatError, "does not know: 'model.layers.0.self_attn.q_proj.bias'", "model"):
        load_weights(_write_llama(tmp_path / "bias", cfg, bias))
    not_float = {**tensors, "model.norm.weight": np.ones(32, np.int32)}
    with raises_naming(FormatError, "'model.norm.weight' is I32", "model"):
        load_weights(_write_llama(tmp_path / "int", cfg, not_float))
    # Tolerated, as Hugging Face tolerates them: a stored head of a tied model, old inv_freq buffers.
    extra = {**tensors, "lm_head.weight": np.zeros((256, 32), np.float32),
             "model.layers.0.self_attn.rotary_emb.inv_freq": np.ones(4, np.float32)}
    w = load_weights(_write_llama(tmp_path / "extra", cfg, extra))
    assert w.lm_head is None and np.array_equal(w.head_weight, tensors["model.embed_tokens.weight"])
    # An int4 note in config.json that the file does not back up
    with raises_naming(FormatError, "tl_quant", "model"):
        load_weights(_write_llama(tmp_path / "note", {**cfg, "tl_quant": "int4-g32-sym"}, tensors))
    with raises_naming(FormatError, "int4-g33-sym", "model"):
        load_weights(_write_llama(tmp_path / "odd", cfg, tensors, metadata={"quant": "int4-g33-sym"}))
    with raises_naming(ValueError, "Int4", "model"):
        load_weights(ok, quant="int4")
    with raises_naming(ValueError, "positive even", "model"):
        Int4(3)


def test_load_weights_refuses_a_directory_without_model_safetensors(tmp_path):
    import shutil

    from tl_lab.ops.paths import DATA_DIR

    shutil.copy(DATA_DIR / "tiny-llama" / "config.json", tmp_path / "config.json")
    with raises_naming(FormatError, "no such file", "model"):
        load_weights(tmp_path)


def test_f32_reads_every_f16_and_bf16_bit_pattern_exactly(tmp_path, monkeypatch):
    """The reader widens what is stored, exactly (section 2.3; issue 20: it used to refuse any
    tensor holding an inf or a NaN, so a valid file with a -inf attention mask could not be read).
    All 65,536 F16 and BF16 patterns, infinities, NaN payloads, subnormals and -0 included, come
    back bit for bit: bf16 h as the f32 bits h << 16, f16 as numpy's (exact) widening; F32 specials
    are copied bit for bit. Cut into pieces on three threads, as a load widens."""
    _small_pieces(monkeypatch)
    h = np.arange(2**16, dtype=np.uint16)
    f32_bits = np.array([0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00001, 0x7F800001, 0x7FBFFFFF,
                         0x80000000, 0x00000001, 0x807FFFFF, 0x3F800000], np.uint32)
    parts = {"f16": ("F16", h), "bf16": ("BF16", h), "f32": ("F32", f32_bits)}
    header, data = {}, b""
    for name, (dtype, a) in parts.items():
        header[name] = entry(dtype, [a.size], len(data), len(data) + a.nbytes)
        data += a.tobytes()
    p = tmp_path / "specials.safetensors"
    p.write_bytes(craft(header, data))
    with SafeTensors.open(p) as f:
        assert np.array_equal(f.f32("f16").view(np.uint32), h.view(np.float16).astype(np.float32).view(np.uint32))
        assert np.array_equal(f.f32("bf16").view(np.uint32), h.astype(np.uint32) << 16)
        assert np.array_equal(f.f32("f32").view(np.uint32), f32_bits)
        assert f.f32("f16")[0x7C00] == np.inf and f.f32("f16")[0xFC00] == -np.inf
        out = np.empty(2**16, np.float32)
        assert f.f32("bf16", out=out) is out and np.isnan(out[0x7FC0])


@pytest.mark.parametrize("dtype", ["F32", "F16", "BF16"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_load_refuses_non_finite_weights(tmp_path, dtype, bad):
    """A NaN or an infinite weight is refused when a model's weights load, naming the tensor and the
    flat index (issue 12), in every stored dtype and on every path: a bigram's logits, a llama's
    resident weights, a linear quantized at load."""
    def stored(w):
        return {"F32": w, "F16": w.astype(np.float16), "BF16": (w.view(np.uint32) >> 16).astype(np.uint16)}[dtype]

    def write(d, cfg, tensors):
        header, data = {}, b""
        for name, w in tensors.items():
            a = stored(w)
            header[name] = entry(dtype, list(a.shape), len(data), len(data) + a.nbytes)
            data += a.tobytes()
        d.mkdir()
        (d / "config.json").write_text(json.dumps(cfg))
        (d / "model.safetensors").write_bytes(craft(header, data))

    logits = np.zeros((256, 256), np.float32)
    logits.reshape(-1)[11] = bad
    write(tmp_path / "bigram", json.loads((BIGRAM / "config.json").read_text()), {"bigram.logits": logits})
    with raises_naming(FormatError, r"tensor 'bigram.logits' holds a non-finite weight .* at flat index 11$", "model"):
        load_weights(tmp_path / "bigram")
    cfg, tensors = _random_llama(layers=1, d=64, inter=128)
    for name in ("model.norm.weight", "model.layers.0.mlp.up_proj.weight"):
        t = {k: v.copy() for k, v in tensors.items()}
        t[name].reshape(-1)[11] = bad
        d = tmp_path / name
        write(d, cfg, t)
        for quant in (None, Int4(32)):
            with raises_naming(FormatError, rf"tensor '{name}' holds a non-finite weight .* at flat index 11$", "model"):
                load_weights(d, quant=quant)


def test_widening_makes_no_full_size_temporary(tmp_path):
    """Widening a 32 MiB BF16 (or F16) tensor allocates the 64 MiB result and chunk-sized
    temporaries only (issue 12: bf16_to_f32 used to make a full-size uint32 copy first)."""
    import tracemalloc

    from tl_lab.ops.widening import WIDEN_CHUNK, widen_threads

    n = 16 * 2**20
    bits = np.full(n, 0x3F80, np.uint16)  # 1.0 in bf16
    for dtype, want in (("BF16", 1.0), ("F16", 1.875)):
        p = tmp_path / f"{dtype}.safetensors"
        p.write_bytes(craft({"t": entry(dtype, [n], 0, 2 * n)}, bits.tobytes()))
        with SafeTensors.open(p) as f:
            tracemalloc.start()
            try:
                out = f.f32("t")
                peak = tracemalloc.get_traced_memory()[1]
            finally:
                tracemalloc.stop()
        assert out.dtype == np.float32 and out[0] == out[-1] == want
        # piece-sized temporaries in each widening thread: the f16 lookup's indices as intp (8 bytes
        # each), isfinite's mask; a full-size copy would be 32 or 64 MiB more
        assert peak <= out.nbytes + widen_threads() * 3 * WIDEN_CHUNK * 4, f"{dtype}: peak {peak / 2**20:.1f} MiB"


@pytest.mark.skipif(not Path("/proc/self/smaps").is_file(), reason="2 MiB pages are asked for on Linux only")
def test_the_arena_asks_for_2_mib_pages():
    """The weights' arena is advised huge pages (VmFlags "hg" on its mapping), which a decode step reads
    faster (`widening.Arena`), whatever the OS then finds to back it."""
    from tl_lab.ops.widening import Arena

    arena = Arena(1 << 20)
    start = arena.buf.__array_interface__["data"][0]
    flags = None
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0] if line else ""
        if "-" in head and ":" not in head:
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo <= start < hi
        elif inside and line.startswith("VmFlags:"):
            flags = line.split()[1:]
            break
    assert flags is not None, "the arena's mapping is not in /proc/self/smaps"
    assert "hg" in flags, f"the arena's mapping is not advised huge pages: VmFlags {flags}"


def test_loading_a_config_imports_no_format_checker(tmp_path):
    """jsonschema's format-only packages (rfc3987_syntax alone took 0.75 s) stay out of a load, and
    stay importable afterwards (the config.schema.json test above shows no format is checked)."""
    import subprocess
    import sys

    code = (
        "import sys, importlib\n"
        "from tl_lab.model import ModelConfig\n"
        "from tl_lab.ops.schema import _FORMAT_ONLY_PACKAGES\n"
        f"ModelConfig.load({str(TINY)!r})\n"
        "print(sorted(m for m in _FORMAT_ONLY_PACKAGES if sys.modules.get(m) is not None))\n"
        "print(all(sys.modules.get(m, 1) is not None for m in _FORMAT_ONLY_PACKAGES))\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split("\n")[:2] == ["[]", "True"]  # none imported, none left blocked


def _write_bf16_llama(d: Path, cfg: dict, tensors: dict) -> dict[str, np.ndarray]:
    """A BF16 checkpoint of `tensors` (f32, truncated to their top halves), stored in reverse model
    order so the file's order is not the load's. -> the stored bits by name."""
    bits = {k: (v.view(np.uint32) >> 16).astype(np.uint16) for k, v in tensors.items()}
    header, data = {}, b""
    for name in reversed(list(bits)):
        header[name] = entry("BF16", list(bits[name].shape), len(data), len(data) + bits[name].nbytes)
        data += bits[name].tobytes()
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(cfg))
    (d / "model.safetensors").write_bytes(craft(header, data))
    return bits


def _small_pieces(monkeypatch, threads: int = 3) -> None:
    """Widen in pieces of 1000 elements on `threads` threads: every tensor but the norms is split,
    and pieces of one tensor go to different threads."""
    import tl_lab.ops.widening as widening

    monkeypatch.setattr(widening, "WIDEN_CHUNK", 1000)
    monkeypatch.setattr(widening, "widen_threads", lambda: threads)


@pytest.mark.parametrize("threads", [1, 3])
def test_load_weights_widens_bf16_bit_for_bit_and_stacks_without_a_copy(tmp_path, monkeypatch, threads):
    """Section 2.3: the parallel widening gives every weight exactly the f32 whose bits are its BF16
    bits << 16 (a plain numpy widening of the file), whatever the pieces and the threads; q, k, v and
    gate, up come out stacked, each linear a view of its stack's rows."""
    _small_pieces(monkeypatch, threads)
    cfg, tensors = _random_llama(layers=3, d=64, inter=128)
    bits = _write_bf16_llama(tmp_path / "m", cfg, tensors)
    w = load_weights(tmp_path / "m")

    def plain(name: str) -> np.ndarray:
        return (bits[name].astype(np.uint32) << 16).view(np.float32)

    def same(a: np.ndarray, name: str) -> bool:
        return a.dtype == np.float32 and np.array_equal(a.view(np.uint32), plain(name).view(np.uint32))

    assert same(w.embed, "model.embed_tokens.weight") and same(w.norm, "model.norm.weight")
    assert same(w.lm_head.w, "lm_head.weight")
    for i, layer in enumerate(w.layers):
        p = f"model.layers.{i}"
        assert same(layer.input_layernorm, f"{p}.input_layernorm.weight")
        assert same(layer.post_attention_layernorm, f"{p}.post_attention_layernorm.weight")
        for field, module in LAYER_LINEARS:
            assert same(getattr(layer, field).w, f"{p}.{module}.weight"), (i, field)
        for stack, parts in ((layer.qkv, ("q_proj", "k_proj", "v_proj")), (layer.gate_up, ("gate_proj", "up_proj"))):
            assert np.array_equal(stack.w, np.concatenate([getattr(layer, f).w for f in parts]))
            assert all(np.shares_memory(stack.w, getattr(layer, f).w) for f in parts)  # views, no copy


def test_load_refuses_a_non_finite_weight_in_any_piece(tmp_path, monkeypatch):
    """A non-finite weight deep inside a tensor (its sixth piece) is refused; with two bad tensors the
    error names the first in model order, wherever the file stores it and whichever thread saw it."""
    _small_pieces(monkeypatch)
    cfg, tensors = _random_llama(layers=3, d=64, inter=128)
    tensors["model.layers.1.mlp.up_proj.weight"].reshape(-1)[5321] = np.inf
    tensors["model.layers.2.mlp.down_proj.weight"].reshape(-1)[7] = np.nan
    _write_bf16_llama(tmp_path / "m", cfg, tensors)
    with pytest.raises(FormatError, match=r"tensor 'model.layers.1.mlp.up_proj.weight' holds a non-finite "
                                          r"weight inf at flat index 5321"):
        load_weights(tmp_path / "m")


def test_widening_raises_what_a_widening_thread_raised(tmp_path, monkeypatch):
    """An error inside any widening thread reaches the caller (not lost with the thread), and stops
    the other threads at their next piece instead of widening the rest of the file."""
    import tl_lab.model as model

    _small_pieces(monkeypatch, threads=3)
    n = 50_000  # 50 pieces
    p = tmp_path / "t.safetensors"
    p.write_bytes(craft({"t": entry("BF16", [n], 0, 2 * n)}, np.full(n, 0x3F80, np.uint16).tobytes()))
    calls = []

    def fail_first(bits, out):  # the first piece fails at once; every other one takes 10 ms
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("disk gone")
        time.sleep(0.01)
        return model.bf16_to_f32(bits, out=out)

    monkeypatch.setitem(model._WIDEN, "BF16", fail_first)
    with SafeTensors.open(p) as f, raises_naming(RuntimeError, "disk gone", "model"):
        f.f32("t")
    assert len(calls) <= 2 * 3, len(calls)  # each thread: at most the piece it had begun and one more, not 50


def test_a_file_that_cannot_be_read_is_named_in_the_refusal(tmp_path):
    """A model.safetensors that opens but cannot be mapped (/proc/self/mem; a dying disk), or is a
    FIFO: one FormatError naming the file and what it is (mutation testing: the messages went unseen
    outside the command-line tests)."""
    import os

    (tmp_path / "mem.safetensors").symlink_to("/proc/self/mem")
    os.mkfifo(tmp_path / "fifo.safetensors")
    with raises_naming(FormatError, f"^safetensors file: cannot read {tmp_path}/mem.safetensors: Input/output error$", "model"):
        SafeTensors.open(tmp_path / "mem.safetensors")
    with raises_naming(FormatError, r"^safetensors file: .*fifo.safetensors is a named pipe \(FIFO\), not a regular file$", "model"):
        SafeTensors.open(tmp_path / "fifo.safetensors")
