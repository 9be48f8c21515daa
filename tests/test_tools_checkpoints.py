"""The bundled checkpoints are what their scripts make (tools/make_bigram.py, make_tiny_llama.py,
make_tiny_llama_int4.py): each script regenerates into a temporary directory, byte for byte
equal to the committed files, and each checkpoint has the properties the chapter relies on."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tl_lab.model import BigramWeights, LlamaWeights, ModelConfig, SafeTensors, load_weights
from tl_lab.ops.paths import DATA_DIR

from conftest import need, tool


def assert_same_files(made: Path, committed: Path) -> None:
    names = sorted(p.name for p in committed.iterdir())
    assert sorted(p.name for p in made.iterdir()) == names == ["config.json", "model.safetensors"]
    for n in names:
        assert (made / n).read_bytes() == (committed / n).read_bytes(), f"{committed / n} differs from its script's output"


# ---------------------------------------------------------------------------------------------
# The bigram
# ---------------------------------------------------------------------------------------------


def test_make_bigram_reproduces_the_committed_checkpoint(tmp_path):
    tool("make_bigram").build(tmp_path)
    assert_same_files(tmp_path, DATA_DIR / "bigram")


def test_bigram_checkpoint_greedy_from_a_continues_bcd():
    w = load_weights(DATA_DIR / "bigram")
    assert isinstance(w, BigramWeights) and w.config.tokenizer == "byte" and w.logits.shape == (256, 256)
    token, out = ord("a"), b""
    for _ in range(3):
        token = int(np.argmax(w.logits[token]))
        out += bytes([token])
    assert out == b"bcd"
    # Each row is a log-distribution (add-one smoothed), and EOS (byte 3) is never the best.
    np.testing.assert_allclose(np.exp(w.logits.astype(np.float64)).sum(axis=1), 1.0, rtol=1e-5)
    assert not np.any(np.argmax(w.logits, axis=1) == w.config.eos_token_ids[0])


def test_bigram_logits_count_the_corpus():
    make = tool("make_bigram")
    logits = make.bigram_logits(b"abab")  # pairs: ab, ba, ab
    p = np.exp(logits.astype(np.float64))
    assert p[ord("a"), ord("b")] == pytest.approx(3 / 258)  # (2 + 1) / (2 + 256)
    assert p[ord("b"), ord("a")] == pytest.approx(2 / 257)
    assert p[ord("z"), ord("a")] == pytest.approx(1 / 256)


# ---------------------------------------------------------------------------------------------
# The tiny Llama (needs torch and transformers: the hf extra)
# ---------------------------------------------------------------------------------------------


@pytest.mark.hf
def test_make_tiny_llama_reproduces_the_committed_checkpoint(tmp_path):
    need("torch")
    need("transformers")
    make = tool("make_tiny_llama")
    report = make.build(tmp_path)
    assert_same_files(tmp_path, DATA_DIR / "tiny-llama")
    # Scaled as the chapter's f16 bound assumes: last-token logits of magnitude about 20.
    assert all(15 < m < 30 for m in report["max_logit"].values()), report
    assert report["min_gap"] > 0.05, report  # no greedy near-tie over the script's prompts


def test_tiny_llama_checkpoint_is_the_model_the_issue_asks_for():
    c = ModelConfig.load(DATA_DIR / "tiny-llama")
    assert (c.arch, c.tokenizer, c.vocab_size, c.hidden_size, c.num_hidden_layers) == ("llama", "byte", 256, 64, 2)
    assert (c.num_attention_heads, c.num_key_value_heads, c.head_dim) == (4, 2, 16)  # GQA
    assert c.tie_word_embeddings and c.rope_theta == 10000.0 and c.max_position_embeddings >= 256
    with SafeTensors.open(DATA_DIR / "tiny-llama" / "model.safetensors") as f:
        assert {t.dtype for t in f.layout.tensors.values()} == {"BF16"}
        assert "lm_head.weight" not in f
        assert f.metadata == {"format": "pt"}
    raw = json.loads((DATA_DIR / "tiny-llama" / "config.json").read_text())
    assert raw["model_type"] == "llama" and raw["architectures"] == ["LlamaForCausalLM"]
    assert (DATA_DIR / "tiny-llama" / "model.safetensors").stat().st_size < 256 * 1024


def test_tiny_llama_weights_are_seeded_and_rounded_to_bf16():
    """The committed BF16 values are the script's numpy draws rounded to nearest even (no torch)."""
    from tl_lab.quant import f32_to_bf16

    make = tool("make_tiny_llama")
    drawn = make.random_weights(make.CONFIG)
    with SafeTensors.open(DATA_DIR / "tiny-llama" / "model.safetensors") as f:
        assert sorted(drawn) == sorted(f.names())
        for name, w in drawn.items():
            np.testing.assert_array_equal(f.raw(name), f32_to_bf16(w))


# ---------------------------------------------------------------------------------------------
# The untied tiny Llama (tools/make_tiny_llama.py --untied, issue 62)
# ---------------------------------------------------------------------------------------------


@pytest.mark.hf
def test_make_tiny_llama_untied_reproduces_the_committed_checkpoint(tmp_path):
    need("torch")
    need("transformers")
    make = tool("make_tiny_llama")
    report = make.build(tmp_path, make.UNTIED_CONFIG)
    assert_same_files(tmp_path, DATA_DIR / "tiny-llama-untied")
    assert all(15 < m < 30 for m in report["max_logit"].values()), report  # the tied model's scale


def test_tiny_llama_untied_is_the_tied_model_with_its_own_head():
    """config.json is the tied one's but tie_word_embeddings false; the file holds lm_head.weight, of
    the embedding's shape and scale, and every other tensor bit for bit the tied model's."""
    from tl_lab.quant import f32_to_bf16

    d, tied = DATA_DIR / "tiny-llama-untied", DATA_DIR / "tiny-llama"
    raw = json.loads((d / "config.json").read_text())
    assert raw == {**json.loads((tied / "config.json").read_text()), "tie_word_embeddings": False}
    assert not ModelConfig.load(d).tie_word_embeddings
    make = tool("make_tiny_llama")
    drawn = make.random_weights(make.UNTIED_CONFIG)
    with SafeTensors.open(d / "model.safetensors") as f, SafeTensors.open(tied / "model.safetensors") as g:
        assert sorted(f.names()) == sorted([*g.names(), "lm_head.weight"]) == sorted(drawn)
        for name in g.names():
            np.testing.assert_array_equal(f.raw(name), g.raw(name), err_msg=name)
        np.testing.assert_array_equal(f.raw("lm_head.weight"), f32_to_bf16(drawn["lm_head.weight"]))
        head, embed = f.raw("lm_head.weight"), g.raw("model.embed_tokens.weight")
        assert head.shape == embed.shape and not np.array_equal(head, embed)
        assert f.metadata == {"format": "pt"} and {t.dtype for t in f.layout.tensors.values()} == {"BF16"}


# ---------------------------------------------------------------------------------------------
# The int4 tiny Llama
# ---------------------------------------------------------------------------------------------


def test_make_tiny_llama_int4_reproduces_the_committed_checkpoint(tmp_path):
    tool("make_tiny_llama_int4").build(tmp_path)
    assert_same_files(tmp_path, DATA_DIR / "tiny-llama-int4")


def test_tiny_llama_int4_checkpoint_layout():
    d = DATA_DIR / "tiny-llama-int4"
    assert ModelConfig.load(d).quant == "int4-g32-sym"
    src = json.loads((DATA_DIR / "tiny-llama" / "config.json").read_text())
    assert json.loads((d / "config.json").read_text()) == {**src, "tl_quant": "int4-g32-sym"}
    with SafeTensors.open(d / "model.safetensors") as f:
        assert f.metadata["quant"] == "int4-g32-sym"
        kinds = {n.rsplit(".", 1)[-1]: f.layout.tensors[n].dtype for n in f.names()}
        assert kinds == {"qweight": "U8", "scales": "F16", "weight": "F32"}
        assert sum(n.endswith(".qweight") for n in f.names()) == 14
    w = load_weights(d)
    assert isinstance(w, LlamaWeights) and w.quant is not None and w.quant.group == 32
