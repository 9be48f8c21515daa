"""The model directory: config.json, model.safetensors (memory-mapped) and the weights.

Chapter L10.1, section 2.3 (and 2.5 for int4 files). A model directory holds

* ``config.json``: Hugging Face's Llama config plus ``tl_arch`` and ``tl_tokenizer``. Anything the
  engine cannot run correctly is refused at load (`ModelConfig`), never served wrong. The rules are
  the JSON Schema ``docs/formats/config.schema.json`` (checked with ``jsonschema``) plus the
  cross-field checks a schema cannot say (`ModelConfig.__post_init__`).
* ``model.safetensors``: read by a hand-written reader (`parse_layout`, `SafeTensors`) whose rules
  are ``docs/formats/safetensors.md``. The file is memory-mapped; opening it reads only the header.

`load_weights` turns a directory into `BigramWeights` or `LlamaWeights`, with each linear a
`Linear` (float32) or a `tl_lab.quant.QLinear` (int4, from an int4 file or quantized at load).
"""

from __future__ import annotations

import json
import math
import mmap
import os
import re
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Iterator, Union

import numpy as np

from tl_lab.errors import ConfigError, FormatError, clip
from tl_lab.ops.checks import as_float, as_int, is_int, rows_of
from tl_lab.ops.header import (MAX_HEADER_BYTES, MAX_HEADER_VALUES, MAX_TENSORS, TENSOR_KEY, DuplicateKey, HugeInt,
                               header_bytes, header_pieces, header_text, is_count, json_int, no_constants,
                               no_duplicate_keys, quoted)
from tl_lab.ops.mapped import MappedFile
from tl_lab.ops.lazy_kernels import product_f32  # the compiler is imported at the first product, not to read a file
from tl_lab.ops.paths import open_regular, read_regular
from tl_lab.ops.schema import CONFIG_SCHEMA_PATH, config_schema, validate_config
from tl_lab.ops.q8 import Q8Linear
from tl_lab.quant import QLinear, bf16_to_f32, f16_to_f32
from tl_lab.ops.widening import Arena, Widening, f32_out, widen_all

__all__ = ["CONFIG_SCHEMA_PATH", "MAX_HEADER_BYTES", "DTYPES", "Int4", "ModelConfig", "TensorInfo", "Layout",
           "parse_layout", "SafeTensors", "Linear", "LlamaLayer", "LlamaWeights", "BigramWeights", "Weights",
           "LAYER_NORMS", "LAYER_LINEARS", "tensor_shapes", "file_quant", "config_schema", "load_weights"]

MAX_CONFIG_BYTES = 10_000_000  # config.json: SmolLM2's, chat template included, is 4 KB


# ---------------------------------------------------------------------------------------------
# Int4: how to quantize at load (section 2.5). The runner re-exports it for EngineConfig.quant.
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Int4:
    """Quantize every layer linear to int4 in groups of `group` columns (chapter section 2.5)."""

    group: int = 32

    def __post_init__(self) -> None:
        g = self.group
        if not is_int(g) or g <= 0 or g % 2:
            raise ValueError(f"Int4.group must be a positive even integer, got {g!r}")

    @property
    def tag(self) -> str:
        """The metadata string of an int4 file made with this group: "int4-g<group>-sym"."""
        return f"int4-g{self.group}-sym"

    @staticmethod
    def from_tag(tag: str) -> Int4:
        """Int4 from a file's metadata `quant` value; FormatError if it is not "int4-g<g>-sym"."""
        m = re.fullmatch(r"int4-g([1-9][0-9]{0,8})-sym", tag)
        if not m or int(m.group(1)) % 2:
            raise FormatError(
                f"metadata quant = {tag!r} is not an int4 scheme this engine reads "
                f"(expected 'int4-g<even group>-sym', e.g. 'int4-g32-sym')"
            )
        return Int4(int(m.group(1)))


# ---------------------------------------------------------------------------------------------
# config.json (section 2.3)
# ---------------------------------------------------------------------------------------------

ARCHES = ("bigram", "llama")
TOKENIZERS = ("byte", "bpe")
BYTE_VOCAB = 256


@dataclass(frozen=True)
class ModelConfig:
    """What config.json says to build. Chapter L10.1, section 2.3.

    For ``arch="llama"`` the fields are Hugging Face's Llama fields (``eos_token_ids`` is always a
    list; ``rope_theta`` comes from either config layout). For ``arch="bigram"`` only
    ``vocab_size``, ``max_position_embeddings`` and the token ids mean anything; the Llama shape
    fields are 0 (no layers, no heads). Constructing one checks the cross-field rules and raises
    `ConfigError`; `from_json` also checks the JSON Schema.
    """

    arch: str
    tokenizer: str
    vocab_size: int = BYTE_VOCAB
    hidden_size: int = 0
    intermediate_size: int = 0
    num_hidden_layers: int = 0
    num_attention_heads: int = 0
    num_key_value_heads: int = 0
    head_dim: int = 0
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    bos_token_id: int | None = None
    eos_token_ids: list[int] = field(default_factory=list)
    chat_template: str | None = None
    quant: str | None = None  # config.json's tl_quant note; the file's metadata must agree

    def __post_init__(self) -> None:
        self._check_types()
        if self.arch not in ARCHES:
            raise ConfigError(f"tl_arch: {self.arch!r} is not one of {list(ARCHES)}")
        if self.tokenizer not in TOKENIZERS:
            raise ConfigError(f"tl_tokenizer: {self.tokenizer!r} is not one of {list(TOKENIZERS)}")
        if self.vocab_size < 1:
            raise ConfigError(f"vocab_size: must be positive, got {self.vocab_size}")
        if self.tokenizer == "byte" and self.vocab_size != BYTE_VOCAB:  # an id >= 256 would not decode
            raise ConfigError(
                f"vocab_size: the byte tokenizer has exactly {BYTE_VOCAB} ids (one per byte value), got "
                f"{self.vocab_size}"
            )
        if self.max_position_embeddings < 1:
            raise ConfigError(
                f"max_position_embeddings: must be positive, got {self.max_position_embeddings}"
            )
        ids = [("eos_token_id", t) for t in self.eos_token_ids]
        if self.bos_token_id is not None:
            ids.insert(0, ("bos_token_id", self.bos_token_id))
        for name, tid in ids:
            if not 0 <= tid < self.vocab_size:
                raise ConfigError(f"{name}: id {tid} is outside the vocabulary [0, {self.vocab_size})")
        if self.arch == "llama":
            self._check_llama()

    def _check_types(self) -> None:
        """Each field holds its annotated type, stored as a plain Python value: integers (not bools, not
        2.0), real numbers, true or false (not "no"), lists of integer ids, strings; from_json's schema
        says the same for a file."""
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type == "int" or (f.type == "int | None" and value is not None):
                object.__setattr__(self, f.name, as_int(value, f.name, error=ConfigError))
            elif f.type == "float":
                object.__setattr__(self, f.name, as_float(value, f.name, error=ConfigError))
            elif f.type == "bool":  # "no" is true to Python: tie_word_embeddings="no" tied the head
                if not isinstance(value, (bool, np.bool_)):
                    raise ConfigError(f"{f.name} must be true or false, got {value!r}")
                object.__setattr__(self, f.name, bool(value))
            elif f.type == "list[int]":  # [2.5] or [True] passed the vocabulary check
                if not isinstance(value, (list, tuple)):
                    raise ConfigError(f"{f.name} must be a list of token ids, got {type(value).__name__}")
                ids = [as_int(v, f"{f.name}[{i}]", error=ConfigError) for i, v in enumerate(value)]
                object.__setattr__(self, f.name, ids)
            elif f.type == "str | None" and value is not None and not isinstance(value, str):
                raise ConfigError(f"{f.name} must be a string or null, got {type(value).__name__}")

    def _check_llama(self) -> None:
        for name in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                     "num_key_value_heads", "head_dim"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name}: must be positive, got {getattr(self, name)}")
        _check_f32("rms_norm_eps", self.rms_norm_eps, "the RMSNorm adds it in float32")
        _check_f32("rope_theta", self.rope_theta, "RoPE takes its powers in float32 and inverts them")
        d, H, H_kv, D = self.hidden_size, self.num_attention_heads, self.num_key_value_heads, self.head_dim
        if d % H:
            raise ConfigError(
                f"num_attention_heads: hidden_size {d} is not divisible by num_attention_heads {H}"
            )
        if H % H_kv:
            raise ConfigError(
                f"num_key_value_heads: num_attention_heads {H} is not divisible by "
                f"num_key_value_heads {H_kv} (each KV head must serve a whole group of query heads)"
            )
        if D != d // H:
            raise ConfigError(
                f"head_dim: {D} contradicts hidden_size / num_attention_heads = {d} / {H} = {d // H}"
            )
        if D % 2:
            raise ConfigError(f"head_dim: RoPE rotates pairs (i, i + D/2), so D must be even, got {D}")

    # -- reading ------------------------------------------------------------------------------

    @classmethod
    def from_json(cls, text: str | bytes) -> ModelConfig:
        """Parse and check config.json text. Refusals raise ConfigError naming the field."""
        try:
            raw = json.loads(text, object_pairs_hook=no_duplicate_keys, parse_constant=no_constants,
                             parse_int=json_int)
        except DuplicateKey as exc:
            raise ConfigError(f"config.json repeats the key {exc.args[0]!r}") from None
        except HugeInt as exc:
            raise ConfigError(f"config.json holds {exc}") from None
        except (ValueError, RecursionError) as exc:  # JSONDecodeError, bad UTF-8, NaN/Infinity
            raise ConfigError(f"config.json is not valid JSON: {exc}") from None
        validate_config(raw)
        return cls._from_checked_dict(raw)

    @classmethod
    def load(cls, directory: str | os.PathLike) -> ModelConfig:
        """Read `<directory>/config.json` (see `from_json`)."""
        path = Path(directory) / "config.json"
        return cls.from_json(read_regular(path, "config.json", ConfigError, MAX_CONFIG_BYTES))

    @classmethod
    def _from_checked_dict(cls, c: dict) -> ModelConfig:
        arch, tokenizer = c["tl_arch"], c["tl_tokenizer"]
        eos = c.get("eos_token_id")
        eos_ids = [] if eos is None else [int(e) for e in (eos if isinstance(eos, list) else [eos])]
        bos = c.get("bos_token_id")
        common = dict(
            arch=arch,
            tokenizer=tokenizer,
            vocab_size=int(c.get("vocab_size", BYTE_VOCAB)),
            max_position_embeddings=int(c.get("max_position_embeddings", 2048)),
            bos_token_id=None if bos is None else int(bos),
            eos_token_ids=eos_ids,
            chat_template=c.get("tl_chat_template"),
            quant=c.get("tl_quant"),
        )
        if arch == "bigram":
            return cls(**common)
        d, H = int(c["hidden_size"]), int(c["num_attention_heads"])
        if d % H:  # say it before head_dim's default turns it into a head_dim complaint
            raise ConfigError(
                f"num_attention_heads: hidden_size {d} is not divisible by num_attention_heads {H}"
            )
        H_kv = c.get("num_key_value_heads")
        D = c.get("head_dim")
        return cls(
            **common,
            hidden_size=d,
            intermediate_size=int(c["intermediate_size"]),
            num_hidden_layers=int(c["num_hidden_layers"]),
            num_attention_heads=H,
            num_key_value_heads=H if H_kv is None else int(H_kv),
            head_dim=d // H if D is None else int(D),
            rms_norm_eps=float(c.get("rms_norm_eps", 1e-6)),
            rope_theta=_rope_theta(c),
            tie_word_embeddings=bool(c.get("tie_word_embeddings", False)),
        )

    # -- derived --------------------------------------------------------------------------------

    @property
    def n_rep(self) -> int:
        """Query heads per KV head (grouped-query attention): H / H_kv."""
        return self.num_attention_heads // self.num_key_value_heads

    def param_count(self) -> int:
        """Parameters of the model this config describes (an int4 weight counts as one).

        O(1) in the layer count: the table of a 1- and a 2-layer twin gives the top-level and the
        per-layer counts, so num_hidden_layers = 10**7 costs no more than 2 (a widget calls this on
        whatever config.json a learner opens)."""
        if self.arch != "llama":
            return sum(math.prod(s) for s in tensor_shapes(self).values())
        one, two = (sum(math.prod(s) for s in tensor_shapes(replace(self, num_hidden_layers=n)).values())
                    for n in (1, 2))
        per_layer = two - one
        return one - per_layer + per_layer * self.num_hidden_layers


def _check_f32(name: str, value: float, why: str) -> None:
    """A config float is used as float32: it must be a positive, finite, normal float32 there, so
    1e-300 (0 in float32) and 1e300 (inf) are refused instead of turning into NaN logits or garbage."""
    tiny, top = float(np.finfo(np.float32).tiny), float(np.finfo(np.float32).max)
    if not (math.isfinite(value) and tiny <= value <= top):
        raise ConfigError(
            f"{name}: {value!r} is not a positive normal float32 (between {tiny:.3g} and {top:.3g}); {why}"
        )


def _rope_theta(c: dict) -> float:
    """rope_theta from the 4.x layout (top level) or the 5.x one (rope_parameters); both must agree."""
    top = c.get("rope_theta")
    params = c.get("rope_parameters") or {}
    nested = params.get("rope_theta")
    if top is not None and nested is not None and float(top) != float(nested):
        raise ConfigError(
            f"rope_theta: the top-level value {top} disagrees with rope_parameters.rope_theta {nested}"
        )
    value = nested if nested is not None else top
    return 10000.0 if value is None else float(value)  # Hugging Face's Llama default


DTYPES: dict[str, tuple[str, int]] = {
    "F64": ("<f8", 8),
    "F32": ("<f4", 4),
    "F16": ("<u2", 2),
    "BF16": ("<u2", 2),
    "I64": ("<i8", 8),
    "I32": ("<i4", 4),
    "I16": ("<i2", 2),
    "I8": ("i1", 1),
    "U64": ("<u8", 8),
    "U32": ("<u4", 4),
    "U16": ("<u2", 2),
    "U8": ("u1", 1),
    "BOOL": ("?", 1),
}
FLOAT_DTYPES = ("F32", "F16", "BF16")  # what `.f32` widens


def _copy_f32(bits: np.ndarray, out: np.ndarray) -> np.ndarray:
    out[...] = bits
    return out


# How `.f32` widens each stored dtype (section 2.3): bf16(h) is the f32 with bits h << 16, f16 has
# its own exponent bias and subnormals.
_WIDEN = {"F32": _copy_f32, "F16": f16_to_f32, "BF16": bf16_to_f32}
@dataclass(frozen=True)
class TensorInfo:
    """One header entry: dtype, shape, and [begin, end) counted from the start of the data buffer."""

    dtype: str
    shape: tuple[int, ...]
    data_offsets: tuple[int, int]

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.data_offsets[1] - self.data_offsets[0]


@dataclass(frozen=True)
class Layout:
    """A checked header: tensors in file order, the metadata, and where the data buffer starts (8 + N)."""

    tensors: dict[str, TensorInfo]
    metadata: dict[str, str]
    data_start: int

    @property
    def data_size(self) -> int:
        """Bytes in the data buffer (the ranges tile it, so this is where the last one ends)."""
        return max((t.data_offsets[1] for t in self.tensors.values()), default=0)

    @property
    def file_size(self) -> int:
        return self.data_start + self.data_size


def parse_layout(buf) -> Layout:
    """Check a safetensors file's header and layout: buf is the file's bytes (bytes, mmap, memoryview).

    Every rule of docs/formats/safetensors.md, in the order written there; any violation is a
    FormatError. Only the header is copied (at most 100 MB and never more than the file holds).
    """
    size = buf.nbytes if isinstance(buf, memoryview) else len(buf)
    if size < 8:
        raise FormatError(f"the file is {size} bytes, shorter than its 8-byte header length")
    N = int.from_bytes(bytes(buf[:8]), "little")
    if N > MAX_HEADER_BYTES:
        raise FormatError(f"header length N = {N} bytes is over the 100 MB limit ({MAX_HEADER_BYTES})")
    if 8 + N > size:
        raise FormatError(
            f"header length N = {N} runs past the end of the file (8 + N = {8 + N} > {size} bytes): "
            f"truncated or not a safetensors file"
        )
    _check_entry_count(buf, N)
    raw = header_bytes(buf, N)
    text = header_text(raw)
    del raw  # the parse holds the text and what it builds, not the bytes too
    header = _parse_header_json(text)
    tensors, metadata = _check_entries(header)
    _check_tiling(tensors, data_size=size - 8 - N, data_start=8 + N)
    ordered = dict(sorted(tensors.items(), key=lambda kv: (kv[1].data_offsets, kv[0])))
    return Layout(ordered, metadata, 8 + N)


def _check_entry_count(buf, N: int) -> None:
    """Refuse a header with more than MAX_TENSORS entries or MAX_HEADER_VALUES JSON values before
    copying or parsing it (cheap: byte counts, a piece at a time; the parse takes about 1 KB for each).

    Every entry has one "data_offsets" key; a name that happens to contain the string only makes the
    count larger, never smaller, so nothing over the limit slips through. A key is counted in the
    piece where it starts (each piece overlaps the next by the key's length - 1)."""
    n = values = 0
    for piece in header_pieces(buf, N, overlap=len(TENSOR_KEY) - 1):
        own = min(len(piece), 1 << 22)  # the bytes of this piece, without the overlap
        n += piece.count(TENSOR_KEY)
        values += sum(piece.count(c, 0, own) for c in (b",", b":", b"{", b"["))  # inside strings too
    if n > MAX_TENSORS:
        raise FormatError(
            f"the header lists about {n:,} tensors, over the limit of {MAX_TENSORS:,} (a real checkpoint "
            "file holds a few thousand at most); refused before parsing it"
        )
    if values > MAX_HEADER_VALUES:
        raise FormatError(
            f"the header holds about {values:,} JSON values, over the limit of {MAX_HEADER_VALUES:,} "
            f"({MAX_HEADER_VALUES // MAX_TENSORS} for each of {MAX_TENSORS:,} tensors); refused before parsing it"
        )


def _parse_header_json(text: str) -> dict:
    try:
        decoder = json.JSONDecoder(object_pairs_hook=no_duplicate_keys, parse_constant=no_constants,
                                   parse_int=json_int)
        header, end = decoder.raw_decode(text)
    except DuplicateKey as exc:
        raise FormatError(f"the header repeats the key {exc.args[0]!r} (duplicate tensor name?)") from None
    except HugeInt as exc:
        raise FormatError(f"the header holds {exc}") from None
    except (ValueError, RecursionError) as exc:  # bad UTF-8, bad JSON, NaN, absurd nesting
        raise FormatError(f"the header is not valid JSON: {str(exc)[:200]}") from None
    if text[end:].strip(" "):
        raise FormatError(
            f"the header has {len(text) - end} bytes after its JSON object that are not spaces"
        )
    return header


def _check_entries(header: dict) -> tuple[dict[str, TensorInfo], dict[str, str]]:
    tensors: dict[str, TensorInfo] = {}
    metadata: dict[str, str] = {}
    for name, entry in header.items():
        if name == "__metadata__":
            if not isinstance(entry, dict) or not all(isinstance(v, str) for v in entry.values()):
                raise FormatError("__metadata__ must be an object mapping strings to strings")
            metadata = dict(entry)
            continue
        if not name:
            raise FormatError("a tensor has an empty name")
        tensors[name] = _check_entry(name, entry)
    return tensors, metadata


def _check_entry(name: str, entry) -> TensorInfo:
    if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
        keys = sorted(entry) if isinstance(entry, dict) else type(entry).__name__
        raise FormatError(
            f"tensor {quoted(name)}: an entry must have exactly dtype, shape and data_offsets, got {clip(str(keys), 200)}"
        )
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise FormatError(f"tensor {quoted(name)}: unknown dtype {dtype!r} (known: {', '.join(DTYPES)})")
    if not isinstance(shape, list) or not all(is_count(s) for s in shape):
        raise FormatError(f"tensor {quoted(name)}: shape must be a list of non-negative integers, got {clip(repr(shape), 200)}")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(is_count(o) for o in offsets)):
        raise FormatError(
            f"tensor {quoted(name)}: data_offsets must be [begin, end], two non-negative integers, got {clip(repr(offsets), 200)}"
        )
    begin, end = offsets
    if begin > end:
        raise FormatError(f"tensor {quoted(name)}: data_offsets [{begin}, {end}] end before they begin")
    info = TensorInfo(dtype, tuple(shape), (begin, end))
    need = info.numel * DTYPES[dtype][1]
    if end - begin != need:
        raise FormatError(
            f"tensor {quoted(name)}: data_offsets [{begin}, {end}] hold {end - begin} bytes, but shape "
            f"{tuple(shape)} of {dtype} needs {info.numel} x {DTYPES[dtype][1]} = {need}"
        )
    return info


def _check_tiling(tensors: dict[str, TensorInfo], data_size: int, data_start: int) -> None:
    """The ranges, sorted by begin, must cover [0, data_size) exactly: no gap, overlap or tail."""
    ranges = sorted((t.data_offsets, name) for name, t in tensors.items())
    hint = ""
    if ranges and ranges[0][0][0] == data_start:
        hint = (
            f" (the first tensor begins at {data_start} = 8 + N: data_offsets look counted from the "
            f"start of the file; they count from the start of the data buffer)"
        )
    for (begin, end), name in ranges:
        if end > data_size:
            raise FormatError(
                f"tensor {quoted(name)}: data_offsets [{begin}, {end}] run past the end of the data buffer "
                f"({data_size} bytes): truncated file{hint}"
            )
    cursor, prev = 0, None
    for (begin, end), name in ranges:
        if begin > cursor:
            raise FormatError(
                f"bytes [{cursor}, {begin}) of the data buffer belong to no tensor: a gap before "
                f"tensor {quoted(name)}{hint}"
            )
        if begin < cursor:
            raise FormatError(
                f"tensor {quoted(name)}: data_offsets [{begin}, {end}] overlap tensor {quoted(prev)}, which ends at {cursor}"
            )
        cursor, prev = end, name
    if cursor < data_size:
        raise FormatError(
            f"{data_size - cursor} trailing bytes: the tensors end at byte {cursor} of the data buffer, "
            f"which holds {data_size}"
        )


# ---------------------------------------------------------------------------------------------
# The memory-mapped reader
# ---------------------------------------------------------------------------------------------


class SafeTensors(MappedFile):
    """A safetensors file, memory-mapped read-only. Chapter L10.1, section 2.3.

    `open` maps the file and checks its header (`parse_layout`); tensor bytes are paged in by the
    operating system only when a tensor is read. `.raw` is a zero-copy view with the stored dtype,
    `.f32` a float32 array of its own, `.q4` a QLinear. Use as a context manager or call `close()`.
    """

    def __init__(self, path: Path, mm: mmap.mmap | bytes, layout: Layout):
        super().__init__(path, mm, layout.file_size, layout.data_start)
        self.layout = layout

    @classmethod
    def open(cls, path: str | os.PathLike) -> SafeTensors:
        path = Path(path)
        with open_regular(path, "safetensors file", FormatError) as f:
            size = os.fstat(f.fileno()).st_size
            try:
                if size < 8:  # mmap refuses empty files; parse_layout says what is wrong
                    mm: mmap.mmap | bytes = f.read(8)
                else:
                    mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            except OSError as exc:  # /proc/self/mem, a dying disk: say which file
                raise FormatError(f"safetensors file: cannot read {path}: {exc.strerror or exc}") from None
        try:
            layout = parse_layout(mm)
        except BaseException:
            if isinstance(mm, mmap.mmap):
                mm.close()
            raise
        return cls(path, mm, layout)

    def __repr__(self) -> str:
        state = "closed" if self._mm is None else f"{len(self.layout.tensors)} tensors"
        return f"SafeTensors({str(self.path)!r}, {state})"

    @property
    def metadata(self) -> dict[str, str]:
        return self.layout.metadata

    def names(self) -> list[str]:
        """Tensor names in file order (by data offset)."""
        return list(self.layout.tensors)

    def __contains__(self, name: str) -> bool:
        return name in self.layout.tensors

    def info(self, name: str) -> TensorInfo:
        if not isinstance(name, str):  # a list was "unhashable type", an int "tensor 5 is not in ..."
            raise ValueError(f"a tensor name is a str, got {type(name).__name__} {name!r}")
        try:
            return self.layout.tensors[name]
        except KeyError:
            raise FormatError(f"tensor {name!r} is not in {self.path.name}") from None

    def raw(self, name: str) -> np.ndarray:
        """A zero-copy read-only view of tensor `name` with its stored dtype (F16/BF16 as uint16)."""
        if self._mm is None:
            raise ValueError(f"{self!r}: the file is closed")
        self.check_not_truncated()
        t = self.info(name)
        dt = np.dtype(DTYPES[t.dtype][0])
        if t.numel == 0:
            return np.empty(t.shape, dtype=dt)
        offset = self.layout.data_start + t.data_offsets[0]
        return np.frombuffer(self._mm, dtype=dt, count=t.numel, offset=offset).reshape(t.shape)

    def f32(self, name: str, shape=None, out: np.ndarray | None = None, finite: bool = False) -> np.ndarray:
        """Tensor `name` as a new float32 array: F32 copied, F16 and BF16 widened (each as itself).

        Every stored value is read exactly, infinities and NaNs included (an attention mask of -inf
        is a valid file; f16 0x7C00 is inf, section 2.3). `shape`, when given, must equal the stored
        shape (FormatError otherwise). `out`, a C-contiguous float32 array of the tensor's shape (a
        slice of a stacked weight), is filled and returned instead of a new array. `finite=True`
        (what `load_weights` asks of a weight) refuses a non-finite value: see `f32_into`.
        """
        t = self.info(name)
        if shape is not None and not isinstance(shape, (tuple, list)):  # f32(name, 5): "not iterable"
            raise ValueError(f"shape must be a tuple of ints, got {type(shape).__name__} {shape!r}")
        if shape is not None and tuple(shape) != t.shape:
            raise FormatError(f"tensor {name!r} has shape {t.shape}, expected {tuple(shape)}")
        out = f32_out(out, t.shape, name)
        self.f32_into({name: out}, finite=finite)
        return out

    def f32_into(self, outs: dict[str, np.ndarray], finite: bool = False) -> None:
        """Widen each tensor `name` into `outs[name]`, a C-contiguous float32 array of its stored shape.

        Section 2.3, loading: each tensor with the rule of its stored dtype (`_widening`); how the
        pieces run in parallel and hand their file pages back is given (`tl_lab.ops.widening.widen_all`).
        With `finite=True` (a model's weights) a NaN or infinite weight is a FormatError naming the first
        such tensor (in the order of `outs`) and its flat index.
        """
        widen_all([self._widening(name, out) for name, out in outs.items()], self.drop_pages, finite)

    def _widening(self, name: str, out: np.ndarray) -> Widening:
        """The checked `Widening` of tensor `name` into `out`: the rule of its stored dtype."""
        t = self.info(name)
        if t.dtype not in _WIDEN:
            raise FormatError(
                f"tensor {name!r} is {t.dtype}; .f32 widens only {', '.join(FLOAT_DTYPES)} (use .raw)"
            )
        widen = _WIDEN[t.dtype]
        out = f32_out(out, t.shape, name)
        return Widening(name, t.data_offsets[0], self.raw(name).reshape(-1), out.reshape(-1), widen)

    def q4(self, name: str, out: int, inp: int, group: int) -> QLinear:
        """The int4 linear `name` from `<name>.qweight` (U8) and `<name>.scales` (F16 bits). Section 2.5."""
        want = Int4(group).tag
        got = self.layout.metadata.get("quant")
        if got != want:
            raise FormatError(
                f"{self.path.name}: metadata quant is {got!r}, expected {want!r} for tensor {name!r}"
            )
        parts = {}
        for suffix, dtype, shape in (("qweight", "U8", (out, inp // 2)), ("scales", "F16", (out, inp // group))):
            t = self.info(f"{name}.{suffix}")
            if t.dtype != dtype or t.shape != shape:
                raise FormatError(
                    f"tensor '{name}.{suffix}' is {t.dtype} {t.shape}, expected {dtype} {shape}"
                )
            parts[suffix] = self.raw(f"{name}.{suffix}")  # views of the map: QLinear repacks them
        try:
            lin = QLinear(out, inp, group, parts["qweight"], np.array(parts["scales"], dtype=np.uint16))
        except ValueError as exc:  # e.g. a negative or infinite scale
            raise FormatError(f"tensor {name!r}: {exc}") from None
        for suffix in parts:
            self.drop_pages(*self.info(f"{name}.{suffix}").data_offsets)
        return lin


# ---------------------------------------------------------------------------------------------
# Weights
# ---------------------------------------------------------------------------------------------


@dataclass(eq=False)
class Linear:
    """y = x W^T with W float32 (out, inp), stored [out, in] as in the checkpoint."""

    w: np.ndarray

    def __post_init__(self) -> None:
        if not isinstance(self.w, np.ndarray) or self.w.ndim != 2 or self.w.dtype != np.float32:
            desc = f"{self.w.dtype} {self.w.shape}" if isinstance(self.w, np.ndarray) else type(self.w).__name__
            raise ValueError(f"Linear.w must be a 2D float32 array (out, inp), got {desc}")

    @property
    def out(self) -> int:
        return self.w.shape[0]

    @property
    def inp(self) -> int:
        return self.w.shape[1]

    @property
    def nbytes(self) -> int:
        return self.w.nbytes

    def forward(self, x) -> np.ndarray:
        """y = x W^T. x: float32 (m, inp), or one row (inp,) -> y: float32 (m, out) (or (out,)).

        Given: `rows_of(x, inp)` checks x and gives float32 rows; `product_f32(x, w)` (from
        tl_lab.ops.lazy_kernels) is the product with the weights (out, inp): equal to x @ w.T within
        float tolerance, and row-invariant (a row's bits do not depend on the others)."""
        return product_f32(rows_of(x, self.inp), self.w)


AnyLinear = Union[Linear, QLinear]

LAYER_NORMS = ("input_layernorm", "post_attention_layernorm")
# (LlamaLayer field, Hugging Face module path inside model.layers.{i})
LAYER_LINEARS = (
    ("q_proj", "self_attn.q_proj"),
    ("k_proj", "self_attn.k_proj"),
    ("v_proj", "self_attn.v_proj"),
    ("o_proj", "self_attn.o_proj"),
    ("gate_proj", "mlp.gate_proj"),
    ("up_proj", "mlp.up_proj"),
    ("down_proj", "mlp.down_proj"),
)


@dataclass(eq=False)
class LlamaLayer:
    """One decoder layer (section 2.4): two RMSNorm weights (d,) float32 and seven linears."""

    input_layernorm: np.ndarray
    q_proj: AnyLinear
    k_proj: AnyLinear
    v_proj: AnyLinear
    o_proj: AnyLinear
    post_attention_layernorm: np.ndarray
    gate_proj: AnyLinear
    up_proj: AnyLinear
    down_proj: AnyLinear

    qkv: AnyLinear = field(init=False, repr=False)
    gate_up: AnyLinear = field(init=False, repr=False)

    def __post_init__(self) -> None:
        """Stack W_q, W_k, W_v into `qkv` and W_gate, W_up into `gate_up`, once: a step then runs
        one product (one parallel loop, one read of h) for each stack. The seven linears become
        views of the stacks' rows (no second copy), and each output is the same loop either way."""
        self.qkv, (self.q_proj, self.k_proj, self.v_proj) = stack_linears([self.q_proj, self.k_proj, self.v_proj])
        self.gate_up, (self.gate_proj, self.up_proj) = stack_linears([self.gate_proj, self.up_proj])

    def linears(self) -> dict[str, AnyLinear]:
        return {f: getattr(self, f) for f, _ in LAYER_LINEARS}


def stack_linears(parts: list) -> tuple[AnyLinear, list]:
    """Linears of one input size stacked along their outputs -> (the stack, each part as a view of
    its rows). float32 parts that already lie end to end in one buffer (as `load_weights` widens
    them) are stacked without a copy."""
    if all(isinstance(p, QLinear) for p in parts):
        return QLinear.stack(parts)
    if not all(isinstance(p, Linear) for p in parts) or len({p.inp for p in parts}) != 1:
        raise ValueError(f"a layer's stacked linears must be all float32 or all int4, of one input size: {parts}")
    ws, bounds = [p.w for p in parts], np.cumsum([0] + [p.out for p in parts])
    base = ws[0].base
    if base is not None and all(w.base is base and w.flags.c_contiguous for w in ws) and all(
            b.ctypes.data == a.ctypes.data + a.nbytes for a, b in zip(ws, ws[1:])):  # end to end already
        W = np.ndarray((int(bounds[-1]), ws[0].shape[1]), np.float32, buffer=base,
                       offset=ws[0].ctypes.data - base.ctypes.data)
    else:
        W = np.concatenate(ws)
    return Linear(W), [Linear(W[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]


@dataclass(eq=False)
class LlamaWeights:
    """A Llama model's weights. embed (V, d), norm (d,) float32; lm_head None when tied.

    `quant` is None when every linear is a float32 `Linear`, else the `Int4` scheme of the layer
    linears. An int4 model's LM head is int8 (`head_q8`, made here from the float32 head: see
    `q8.Q8Linear`), as llama.cpp's Q4_1 file of SmolLM2 holds it; the embedding rows a lookup
    reads stay float32, exact.
    """

    config: ModelConfig
    embed: np.ndarray
    layers: list[LlamaLayer]
    norm: np.ndarray
    lm_head: Linear | None
    quant: Int4 | None = None
    head_q8: Q8Linear | None = None

    HEAD_GROUP = 32  # the int8 head's group: llama.cpp's Q8_0 block

    def __post_init__(self) -> None:
        if self.quant is not None and self.head_q8 is None and self.config.hidden_size % self.HEAD_GROUP == 0:
            self.head_q8 = Q8Linear.quantize(self.head_weight, self.HEAD_GROUP)

    @property
    def head_weight(self) -> np.ndarray:
        """The float32 LM head matrix (V, d): the embedding itself when tie_word_embeddings."""
        return self.embed if self.lm_head is None else self.lm_head.w

    @property
    def head_hat(self) -> np.ndarray:
        """The matrix the LM head multiplies by, (V, d) float32: W_hat of the int8 head of an int4
        model (a new array), else `head_weight`."""
        return self.head_weight if self.head_q8 is None else self.head_q8.dequantize()

    @property
    def head(self) -> Linear:
        """The LM head as a Linear (sharing memory with `embed` when tied): logits = h @ W^T."""
        return Linear(self.embed) if self.lm_head is None else self.lm_head


@dataclass(eq=False)
class BigramWeights:
    """The byte bigram of L10.0: logits (V, V) float32, row a = logits of the token after a."""

    config: ModelConfig
    logits: np.ndarray


Weights = Union[BigramWeights, LlamaWeights]


def tensor_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """The float tensors a checkpoint for `config` holds, Hugging Face names -> shapes, in model order.

    Linears appear as `<module>.weight`; an int4 file stores each as `.qweight` + `.scales` instead.
    """
    return dict(_iter_shapes(config))


def _iter_shapes(config: ModelConfig) -> Iterator[tuple[str, tuple[int, ...]]]:
    """`tensor_shapes` one entry at a time, so a check can stop at the first missing name."""
    c = config
    V = c.vocab_size
    if c.arch == "bigram":
        yield "bigram.logits", (V, V)
        return
    d, I, D = c.hidden_size, c.intermediate_size, c.head_dim
    H, H_kv = c.num_attention_heads, c.num_key_value_heads
    linear_shapes = {
        "q_proj": (H * D, d), "k_proj": (H_kv * D, d), "v_proj": (H_kv * D, d), "o_proj": (d, H * D),
        "gate_proj": (I, d), "up_proj": (I, d), "down_proj": (d, I),
    }
    yield "model.embed_tokens.weight", (V, d)
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}"
        yield f"{p}.input_layernorm.weight", (d,)
        for fname, module in LAYER_LINEARS[:4]:
            yield f"{p}.{module}.weight", linear_shapes[fname]
        yield f"{p}.post_attention_layernorm.weight", (d,)
        for fname, module in LAYER_LINEARS[4:]:
            yield f"{p}.{module}.weight", linear_shapes[fname]
    yield "model.norm.weight", (d,)
    if not c.tie_word_embeddings:
        yield "lm_head.weight", (V, d)


def _is_layer_linear(name: str) -> bool:
    return name.startswith("model.layers.") and name.endswith("_proj.weight")


# Non-persistent buffers some older exports saved; the engine computes RoPE itself.
_IGNORED = re.compile(r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq")


def file_quant(st: SafeTensors) -> Int4 | None:
    """The Int4 scheme an int4 file declares in its metadata `quant`, or None for a plain file."""
    tag = st.layout.metadata.get("quant")
    return None if tag is None else Int4.from_tag(tag)


def load_weights(directory: str | os.PathLike, quant: Int4 | None = None) -> Weights:
    """Read config.json and model.safetensors into BigramWeights or LlamaWeights (section 2.3).

    Every tensor is checked against config.json: a missing one, a wrong shape or an unknown name
    (a bias the engine would drop, say) is a FormatError naming the tensor. An int4 file (metadata
    quant = "int4-g<g>-sym") is detected and its linears loaded with `.q4`. `quant=Int4(g)`
    quantizes each layer linear of a float file while loading, one tensor at a time, so the float32
    copies of the linears never coexist. Embeddings, norms and an untied lm_head stay float32 (the
    LM head decides the token; int4 there would move the argmax the greedy tests compare).
    """
    directory = Path(directory)
    config = ModelConfig.load(directory)
    if quant is not None and not isinstance(quant, Int4):
        raise ValueError(f"quant must be Int4(group) or None, got {quant!r}")
    if quant is not None and config.arch != "llama":
        raise ValueError(f"quant={quant!r} needs a llama checkpoint; a {config.arch} has no linear layers")
    with SafeTensors.open(directory / "model.safetensors") as st:
        stored = file_quant(st)
        if config.quant is not None and (stored is None or stored.tag != config.quant):
            raise FormatError(
                f"config.json says tl_quant = {config.quant!r} but model.safetensors has metadata "
                f"quant = {st.layout.metadata.get('quant')!r}"
            )
        if stored is not None and quant is not None and stored != quant:
            raise ValueError(
                f"model.safetensors is already {stored.tag}; re-quantizing it as {quant.tag} would "
                f"compound the rounding (load it with quant=None or quant={stored!r})"
            )
        _check_tensor_count(st, config, stored)  # before anything that grows with the config
        expected = tensor_shapes(config)
        _check_names(st, expected, stored, config)
        if config.arch == "bigram":
            return BigramWeights(config, st.f32("bigram.logits", expected["bigram.logits"], finite=True))
        return _load_llama(st, config, expected, stored, quant)


def _check_tensor_count(st: SafeTensors, config: ModelConfig, stored: Int4 | None) -> None:
    """Refuse a config.json that asks for more tensors than the file holds, before building anything
    that grows with the config (`tensor_shapes` for num_hidden_layers = 10**7 would take gigabytes).

    The count is arithmetic: per layer 2 norms and 7 linears, each linear one tensor (`.weight`) or
    two in an int4 file (`.qweight`, `.scales`). The missing name is then found by walking the
    expected names lazily, which stops within the file's own tensor count."""
    c = config
    if c.arch == "bigram":
        need, how = 1, "bigram.logits"
    else:
        per_layer = len(LAYER_NORMS) + len(LAYER_LINEARS) * (1 if stored is None else 2)
        top = 2 + (0 if c.tie_word_embeddings else 1)
        need = top + per_layer * c.num_hidden_layers
        how = f"num_hidden_layers {c.num_hidden_layers:,} x {per_layer} + {top}"
    have = len(st.layout.tensors)
    if have >= need:
        return
    missing = next((name for name, _ in _file_names(_iter_shapes(c), stored) if name not in st), "?")
    raise FormatError(
        f"model.safetensors has no tensor {missing!r} (config.json needs it): config.json needs "
        f"{need:,} tensors ({how}), the file holds {have:,}"
    )


def _file_names(shapes, stored: Int4 | None) -> Iterator[tuple[str, tuple[int, ...] | None]]:
    """The names a file holds for `shapes` (name, shape): an int4 file's layer linears as `.qweight`
    and `.scales` (shape None: `.q4` checks those)."""
    for name, shape in shapes:
        if stored is not None and _is_layer_linear(name):
            base = name[: -len(".weight")]
            yield f"{base}.qweight", None
            yield f"{base}.scales", None
        else:
            yield name, shape


def _check_names(st: SafeTensors, expected: dict, stored: Int4 | None, config: ModelConfig) -> None:
    names = dict(_file_names(expected.items(), stored))
    for name, shape in names.items():
        if name not in st:
            raise FormatError(f"model.safetensors has no tensor {name!r} (config.json needs it)")
        if shape is not None and st.info(name).shape != shape:
            raise FormatError(
                f"tensor {name!r} has shape {st.info(name).shape}, config.json needs {shape}"
            )
    for name in st.names():
        if name in names or _IGNORED.fullmatch(name):
            continue
        if name == "lm_head.weight" and config.tie_word_embeddings:
            continue  # a tied checkpoint that stored the head anyway: Hugging Face ignores it too
        raise FormatError(
            f"model.safetensors has a tensor the engine does not know: {name!r} "
            f"(a {config.arch} with this config.json has no such weight)"
        )


def _load_llama(st, config, expected, stored: Int4 | None, quant: Int4 | None) -> LlamaWeights:
    """Every resident float32 tensor is widened into one `tl_lab.ops.widening.Arena` in one parallel pass (`f32_into`),
    in model order, so q, k, v (and gate, up) land end to end and are stacked without a copy. The
    layer linears of an int4 file, or of a float file quantized at load, are read one at a time."""
    f32_linears = stored is None and quant is None
    resident = [name for name in expected if f32_linears or not _is_layer_linear(name)]
    arena = Arena(sum(math.prod(expected[name]) for name in resident))
    w = {name: arena.take(expected[name]) for name in resident}
    st.f32_into(w, finite=True)  # a weight must be finite (the file may hold inf: section 2.3)

    def linear(module: str) -> AnyLinear:
        name = f"{module}.weight"
        if name in w:
            return Linear(w[name])
        out, inp = expected[name]
        if stored is not None:
            return st.q4(module, out, inp, stored.group)
        try:  # st.f32's array, the only f32 copy of this linear, dies on return
            return QLinear.quantize(st.f32(name, (out, inp), finite=True), quant.group)
        except ValueError as exc:
            raise ValueError(f"cannot quantize {module!r} as {quant.tag}: {exc}") from None

    layers = []
    for i in range(config.num_hidden_layers):
        p = f"model.layers.{i}"
        parts = {n: w[f"{p}.{n}.weight"] for n in LAYER_NORMS}
        parts.update({f: linear(f"{p}.{m}") for f, m in LAYER_LINEARS})
        layers.append(LlamaLayer(**parts))
    embed, norm = w["model.embed_tokens.weight"], w["model.norm.weight"]
    lm_head = None if config.tie_word_embeddings else Linear(w["lm_head.weight"])
    return LlamaWeights(config, embed, layers, norm, lm_head, quant=stored or quant)
