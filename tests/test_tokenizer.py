"""tl_lab.engine.tokenizer: the byte tokenizer, the BPE tokenizer on tokenizer.json, chat templates."""

from __future__ import annotations

import json
import re
import sys
import tracemalloc
from types import SimpleNamespace

import pytest

from conftest import MERGES, SPECIALS, need, write_bpe_tokenizer, write_sentencepiece_tokenizer
from tl_lab.errors import ConfigError
from tl_lab.engine.tokenizer import BpeTokenizer, ByteTokenizer, Tokenizer, _bytes_to_unicode, load_tokenizer, render_chat_template

CHATML = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# Whitespace control, loop controls, tojson, raise_exception and the special-token variables: the
# parts of transformers' Jinja set-up a template can depend on.
FANCY = """{{ bos_token }}
{%- for m in messages %}
    {%- if m['role'] not in ['system', 'user', 'assistant'] %}
        {{- raise_exception('unknown role ' + m['role']) }}
    {%- endif %}
    {%- if m['content'] == 'skip me' %}{% continue %}{% endif %}
    [{{ m['role'] | upper }}] {{ m['content'] | tojson }}
    {% if loop.last and m['role'] == 'assistant' %}{{ eos_token }}{% endif %}
{%- endfor %}
{% if add_generation_prompt %}
[ASSISTANT]
{% endif %}"""

CONVERSATIONS = [
    [{"role": "user", "content": "Hi!"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}],
    [
        {"role": "user", "content": "Name a colour."},
        {"role": "assistant", "content": "Blue."},
        {"role": "user", "content": "skip me"},
        {"role": "user", "content": "Another, with \"quotes\" and ünïcødé\n  and  spaces"},
    ],
    [{"role": "user", "content": ""}],
]


# ------------------------------------------------------------------------------------------------
# ByteTokenizer
# ------------------------------------------------------------------------------------------------


def test_byte_tokenizer_ids_are_utf8_bytes():
    tok = ByteTokenizer()
    text = "héllo 😀\n"
    assert tok.encode(text) == list(text.encode("utf-8"))
    assert tok.decode(tok.encode(text)) == text
    assert tok.vocab_size == 256 and tok.eos_ids == [] and tok.bos_id is None


def test_byte_tokenizer_decode_replaces_invalid_utf8():
    tok = ByteTokenizer()
    assert tok.decode([0xFF, 0x41]) == "\ufffdA"
    assert tok.decode(list("😀".encode())[:2]) == "\ufffd"  # half an emoji


def test_byte_tokenizer_token_str_shows_printable_bytes_or_escapes():
    tok = ByteTokenizer()
    assert [tok.token_str(i) for i in (65, 32, 126)] == ["A", " ", "~"]
    assert [tok.token_str(i) for i in (10, 0, 127, 0xF0)] == ["\\x0a", "\\x00", "\\x7f", "\\xf0"]


def test_byte_tokenizer_refuses_ids_outside_the_vocabulary():
    tok = ByteTokenizer()
    for bad in ([256], [-1]):
        with pytest.raises(ValueError, match="outside the vocabulary"):
            tok.decode(bad)
    with pytest.raises(ValueError, match="256"):
        tok.token_str(256)
    with pytest.raises(ValueError, match="300"):
        ByteTokenizer(eos_ids=[300])
    with pytest.raises(ValueError, match=r"^eos id must be an integer, got float 2\.5$"):
        ByteTokenizer(eos_ids=[2.5])


# ------------------------------------------------------------------------------------------------
# BpeTokenizer on a small tokenizer.json
# ------------------------------------------------------------------------------------------------


def make_bpe(root, alter=lambda tok: None, drop: str = ""):
    """`root` made a model directory with `write_bpe_tokenizer`'s tokenizer.json and a config.json for it."""
    n = write_bpe_tokenizer(root / "tokenizer.json", alter, drop)
    config = {"tl_tokenizer": "bpe", "vocab_size": n, "eos_token_id": [2, 0], "bos_token_id": 1,
              "tl_chat_template": CHATML}  # fmt: skip
    (root / "config.json").write_text(json.dumps(config))
    return root


@pytest.fixture(scope="module")
def bpe_dir(tmp_path_factory):
    return make_bpe(tmp_path_factory.mktemp("bpe"))


def test_bpe_tokenizer_encodes_merges_digits_and_special_tokens(bpe_dir):
    tok = load_tokenizer(bpe_dir)
    assert isinstance(tok, BpeTokenizer)
    assert tok.vocab_size == 3 + 256 + len(MERGES) and tok.eos_ids == [2, 0] and tok.bos_id == 1
    pieces = lambda s: [tok.token_str(i) for i in tok.encode(s)]  # noqa: E731
    assert pieces("hello the") == ["hello", " the"]
    assert pieces("a  12") == ["a", "  ", "1", "2"]
    ids = tok.encode("<|im_start|>hello<|im_end|>")
    assert ids[0] == 1 and ids[-1] == 2 and len(ids) == 3
    assert tok.encode("") == []


def test_a_chat_template_sees_the_bos_and_eos_tokens_by_name(tmp_path):
    """bos_token and eos_token (the first of eos_token_id), as Hugging Face's templates read them."""
    tok = BpeTokenizer(make_bpe(tmp_path) / "tokenizer.json", eos_ids=[2, 0], bos_id=1,
                       chat_template="{{ bos_token }}|{{ eos_token }}|{{ messages[0]['content'] }}")
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}]) == "<|im_start|>|<|im_end|>|hi"


def test_bpe_tokenizer_decode_round_trips(bpe_dir):
    tok = load_tokenizer(bpe_dir)
    for text in ("hello the world", "  x\n\n\ty  ", "naïve 😀 日本", "<|im_start|>a<|im_end|>\n", "1,234.5"):
        assert tok.decode(tok.encode(text)) == text
    assert tok.decode(tok.encode("<|im_start|>hi<|im_end|>"), skip_special_tokens=True) == "hi"


def test_bpe_token_str_shows_partial_utf8_as_escapes(bpe_dir):
    tok = load_tokenizer(bpe_dir)
    ids = tok.encode("😀é")
    assert [tok.token_str(i) for i in ids] == ["\\xf0", "\\x9f", "\\x98", "\\x80", "\\xc3", "\\xa9"]
    assert tok.token_str(2) == "<|im_end|>"
    assert tok.token_bytes(tok.encode(" ")[0]) == b" "
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tok.token_str(tok.vocab_size)


def test_bytes_to_unicode_is_gpt2s_alphabet():
    table = _bytes_to_unicode()
    assert len(set(table.values())) == 256
    assert table[ord("A")] == "A" and table[ord(" ")] == "Ġ" and table[ord("\n")] == "Ċ" and table[0] == "Ā"


# ------------------------------------------------------------------------------------------------
# fewest_tokens: the bound that refuses a prompt over the context before it is encoded
# ------------------------------------------------------------------------------------------------

BOUND_TEXTS = ["", "hello the world", "  x\n\n\ty  ", "naïve 😀 日本 \U00050000", "<|im_start|>a<|im_end|>\n",
               "1,234.5", "hellohellohello the", "x" * 1000, "\x00\x04" * 50 + "hi", "<|endoftext|>" * 3 + "<|im_end"]


def test_fewest_tokens_is_a_lower_bound_that_the_longest_token_reaches(bpe_dir):
    """Every token covers at most max_token_bytes of UTF-8 (here the longest special token's 13), so
    ceil(bytes / 13) never exceeds the count; a run of that token meets it, so it is as tight as it can be."""
    tok = load_tokenizer(bpe_dir)
    assert tok.max_token_bytes == len("<|endoftext|>") and tok.dropped_bytes == b""
    for text in BOUND_TEXTS:
        assert tok.fewest_tokens(text) <= len(tok.encode(text)), text
    for k in (1, 7):
        assert tok.fewest_tokens("<|endoftext|>" * k) == len(tok.encode("<|endoftext|>" * k)) == k
        assert tok.fewest_tokens("<|endoftext|>" * k + "h") == k + 1
    byte = ByteTokenizer()
    assert byte.max_token_bytes == 1 and all(byte.fewest_tokens(t) == len(byte.encode(t)) for t in BOUND_TEXTS)
    with pytest.raises(ValueError, match="byte 0xff"):
        tok.fewest_tokens("a\udcff")  # as encode says it


def test_bytes_the_vocabulary_lacks_are_dropped_so_not_counted(tmp_path):
    """The library drops a byte whose character is not in the vocabulary (SmolLM2 lacks 21, 0x04 among
    them): counted, 10,000 of them would have proved a text of one token too long."""
    tok = BpeTokenizer(make_bpe(tmp_path, drop="x\x04") / "tokenizer.json")
    assert tok.dropped_bytes == b"\x04x"
    text = "x\x04" * 5000 + "hello"
    assert tok.encode(text) == tok.encode("hello") and tok.fewest_tokens(text) == 1
    for text in BOUND_TEXTS:
        assert tok.fewest_tokens(text) <= len(tok.encode(text)), text


def test_encode_within_refuses_a_prompt_over_the_context_before_encoding_when_the_bytes_prove_it(bpe_dir, monkeypatch):
    """n longest tokens fit a context of n; one byte more is at least n + 1 tokens, refused with encode
    never called. A text the bound lets through is encoded and refused by its count."""
    tok = load_tokenizer(bpe_dir)
    assert tok.encode_within("<|endoftext|>" * 4, 4) == tok.encode("<|endoftext|>" * 4)
    text = "hello the world"  # 15 bytes, at least 2 tokens by the bound
    k = len(tok.encode(text))
    assert k > 2 and tok.encode_within(text, k) == tok.encode(text)
    with pytest.raises(KeyError, match=f"where: a {k}-token prompt is longer than the context "
                                       rf"\(max_position_embeddings {k - 1}\)"):
        tok.encode_within(text, k - 1, KeyError, "where: ")
    monkeypatch.setattr(type(tok), "encode", lambda self, text: pytest.fail("encoded"))
    with pytest.raises(ValueError, match=r"^a prompt of 53 bytes is at least 5 tokens, longer than the context "
                                         r"\(max_position_embeddings 4\)$"):
        tok.encode_within("<|endoftext|>" * 4 + "h", 4)


def _add_lstrip_token(tok):
    from tokenizers import AddedToken

    tok.add_special_tokens([AddedToken("<|im_end|>", special=True, lstrip=True, normalized=False)])


def _pre(*parts):
    from tokenizers import pre_tokenizers

    return lambda tok: setattr(tok, "pre_tokenizer", pre_tokenizers.Sequence(list(parts)))


def _normalizer(tok):
    from tokenizers import normalizers

    tok.normalizer = normalizers.Replace(" ", "")


@pytest.mark.parametrize("alter, text", [
    (_normalizer, " " * 100),  # a normalizer may drop text
    (lambda tok: tok.enable_truncation(max_length=2), "hello" * 100),  # truncation stops early
    (_add_lstrip_token, " " * 100 + "<|im_end|>"),  # the token takes the spaces before it
    ("Whitespace", " " * 100),  # a pre-tokenizer that drops whitespace
    ("Removed", " " * 100),  # a Split that removes what it matches
    ("Digits", "日" * 100),  # no ByteLevel: a character outside the vocabulary is dropped
], ids=["normalizer", "truncation", "lstrip", "whitespace", "split-removed", "no-byte-level"])
def test_no_bound_where_the_text_does_not_reach_the_model_byte_for_byte(tmp_path, alter, text):
    """Each of these makes fewer tokens of `text` than its bytes over the longest token: a bound there
    would refuse a prompt that fits, so there is none (fewest_tokens 0: the prompt is encoded and counted)."""
    from tokenizers import pre_tokenizers

    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False)
    alter = {"Whitespace": _pre(pre_tokenizers.Whitespace(), byte_level),
             "Removed": _pre(pre_tokenizers.Split(" ", "removed"), byte_level),
             "Digits": _pre(pre_tokenizers.Digits())}.get(alter, alter)
    tok = BpeTokenizer(make_bpe(tmp_path, alter) / "tokenizer.json")
    assert len(tok.encode(text)) < -(-len(text.encode()) // len("<|endoftext|>"))
    assert tok.max_token_bytes is None and tok.fewest_tokens(text) == 0


def _with_model(directory, **fields):
    """directory's tokenizer.json with its BPE model's `fields` replaced (what the library's setters cannot)."""
    spec = json.loads((directory / "tokenizer.json").read_text())
    spec["model"].update(fields)
    (directory / "tokenizer.json").write_text(json.dumps(spec))
    return directory / "tokenizer.json"


@pytest.mark.parametrize("field, value, text", [
    ("continuing_subword_prefix", "##", "a" * 100),  # every "a" after the first is looked up as "##a"
    ("end_of_word_suffix", "</w>", "a"),  # a word's last "a" is looked up as "a</w>"
])
def test_no_bound_for_a_bpe_that_looks_a_character_up_by_another_name(tmp_path, field, value, text):
    """A character in the vocabulary is dropped all the same where only its prefixed or suffixed form is
    looked up: fewer tokens than the bound would say, so there is none (the review's 513 "a" on a
    256-token vocabulary are 512 tokens, and a bound refused them)."""
    tok = BpeTokenizer(_with_model(make_bpe(tmp_path), **{field: value, "merges": []}))
    assert len(tok.encode(text)) < -(-len(text.encode()) // len("<|endoftext|>"))
    assert tok.max_token_bytes is None and tok.fewest_tokens(text) == 0


def test_a_tokenizer_json_the_library_panics_on_is_refused_in_one_line(tmp_path):
    """The library panics (a pyo3 PanicException, a BaseException: no `except Exception` caught it, and
    the command line ended in a traceback) on merges of plain pieces under a continuing_subword_prefix."""
    path = _with_model(make_bpe(tmp_path), continuing_subword_prefix="##")
    with pytest.raises(ConfigError, match=r"is not a tokenizer.json the tokenizers library can read: .*slice index"):
        BpeTokenizer(path)


def test_decode_after_gives_the_text_new_ids_add_after_the_ones_out(tmp_path):
    """A SentencePiece decoder drops the space of the first word it decodes: "▁world" after "▁hello" is
    " world", alone "world". Where the ids out end in half a character, the new ones are decoded alone."""
    write_sentencepiece_tokenizer(tmp_path / "tokenizer.json", "llama2")
    tok = BpeTokenizer(tmp_path / "tokenizer.json")
    ids = tok.encode("hello hello")
    assert [tok.token_str(i) for i in ids] == ["▁hello", "▁hello"]
    assert tok.decode(ids[1:]) == "hello" and tok.decode_after(ids[:1], ids[1:]) == " hello"
    assert tok.decode_after([], ids) == tok.decode(ids) == "hello hello" and tok.decode_after(ids, []) == ""
    byte = ByteTokenizer()
    assert byte.decode_after(list(b"ab"), list("日".encode())) == "日"
    assert byte.decode_after([0xE6], [0x97, 0xA5]) == "\ufffd\ufffd"  # as decoded alone


SP_TEXTS = BOUND_TEXTS + [" " * 800, "        x" * 30, "<s>hello</s>hello", "▁▁▁ ▁", "日本" * 40, " hello" * 50,
                          "a" * 300, "<s>" * 20, "\n \t " * 40]


@pytest.mark.parametrize("style", ["llama2", "metaspace", "gemma"])
def test_fewest_tokens_holds_for_a_sentencepiece_style_tokenizer(tmp_path, style):
    """A space reaches the model as "▁", three bytes: the eight-space token covers 24 of them, so a run
    of 8k spaces is at least k tokens and is k (one more where a "▁" is put before the text)."""
    write_sentencepiece_tokenizer(tmp_path / "tokenizer.json", style)
    tok = BpeTokenizer(tmp_path / "tokenizer.json")
    assert (tok.max_token_bytes, tok.dropped_bytes, tok.space_bytes) == (len("▁" * 8) * 3, b"", 3)
    for text in SP_TEXTS:
        assert tok.fewest_tokens(text) <= len(tok.encode(text)), text
    for k in (1, 5):
        assert tok.fewest_tokens(" " * 8 * k) == k and len(tok.encode(" " * 8 * k)) == k + (style == "llama2")
    with pytest.raises(ValueError, match=r"^a prompt of 8,001 bytes is at least 1,001 tokens"):
        tok.encode_within(" " * 8001, 1000)


def test_fewest_tokens_holds_for_random_texts_on_sentencepiece_style_tokenizers(tmp_path):
    """Any text of the pieces the bound is about (spaces, a literal "▁", the special tokens, characters
    the vocabulary has, characters it spells in byte-fallback tokens) gets a bound under its count."""
    from hypothesis import example, given, settings
    from hypothesis import strategies as st

    toks = []
    for style in ("llama2", "metaspace", "gemma"):
        write_sentencepiece_tokenizer(tmp_path / f"{style}.json", style)
        toks.append(BpeTokenizer(tmp_path / f"{style}.json"))
    pieces = st.sampled_from([" ", "  ", "▁", "<s>", "</s>", "<unk>", "hello", "h", "e", "x", "日", "😀", "\n", "é"])

    @settings(max_examples=150, deadline=None)
    @given(st.lists(pieces, max_size=60).map("".join))
    @example("")  # the hard cases, every run (issue 62): nothing, spaces only, markers and spaces
    @example(" " * 60)
    @example("▁ ▁  ▁")
    @example("<s></s><unk> <s>")
    @example("😀" * 30 + " 日")
    def holds(text):
        for tok in toks:
            assert tok.fewest_tokens(text) <= len(tok.encode(text)), (tok, text)

    holds()


@pytest.mark.parametrize("normalizer, pre, space", [
    (None, {}, " "),  # nothing changes a space
    ({"type": "Replace", "pattern": {"String": " "}, "content": "▁"}, {}, "▁"),
    (None, {"type": "Sequence", "pretokenizers": [{"type": "Metaspace", "replacement": "▁"},
                                                 {"type": "Punctuation", "behavior": "Isolated"}]}, "▁"),
    (None, {"type": "Metaspace", "replacement": ""}, None),  # a space dropped: no bound
    (None, {"type": "Split", "replacement": "▁", "behavior": "Isolated"}, " "),  # not a Metaspace: splits only
    ({"type": "Replace", "pattern": {"String": " "}, "content": "_"}, {"type": "Metaspace", "replacement": "▁"}, None),
    ({"type": "NFC"}, {}, None),
    (None, {"type": "Whitespace"}, None),
    (None, {"type": "Split", "behavior": "Removed"}, None),
])
def test_what_a_space_becomes_before_the_model(normalizer, pre, space):
    """The SentencePiece-style pipelines the bound reads (`_space_becomes`, in tokenizer.json's form)."""
    from tl_lab.engine.tokenizer import _space_becomes

    assert _space_becomes(normalizer, pre) == space


def test_a_byte_level_tokenizer_of_special_tokens_only_is_bounded_by_them(tmp_path):
    """No vocabulary at all: every byte is dropped, and the longest special token is the most a token covers."""
    from tokenizers import AddedToken
    from tokenizers import Tokenizer as HfTokenizer
    from tokenizers import models, pre_tokenizers

    tok = HfTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.add_special_tokens([AddedToken("<|end|>", special=True, normalized=False)])
    tok.save(str(tmp_path / "tokenizer.json"))
    bpe = BpeTokenizer(tmp_path / "tokenizer.json")
    assert (bpe.max_token_bytes, len(bpe.dropped_bytes)) == (len("<|end|>"), 256)
    # the special token's own bytes are among the dropped ones, so the bound is 0 here: low, never wrong
    assert bpe.fewest_tokens("<|end|>" * 3 + "hello") == 0 and len(bpe.encode("<|end|>" * 3 + "hello")) == 3


@pytest.mark.parametrize("byte_fallback, fuse_unk, bound", [(False, False, True), (False, True, False),
                                                            (True, True, True)])
def test_a_sentencepiece_style_tokenizer_without_byte_fallback_is_bounded_only_when_unk_covers_one_character(
        tmp_path, byte_fallback, fuse_unk, bound):
    """Without byte fallback a character outside the vocabulary is "<unk>", one character (4 bytes at
    most), unless fuse_unk makes one "<unk>" of a run of them: 200 CJK characters, one token."""
    write_sentencepiece_tokenizer(tmp_path / "tokenizer.json", "llama2", byte_fallback, fuse_unk)
    tok = BpeTokenizer(tmp_path / "tokenizer.json")
    text = "日本" * 100
    assert len(tok.encode(text)) == (2 if fuse_unk and not byte_fallback else 201 if not byte_fallback else 601)
    assert (tok.max_token_bytes is not None) == bound
    for text in SP_TEXTS:
        assert tok.fewest_tokens(text) <= len(tok.encode(text)), text


@pytest.mark.smollm2
def test_fewest_tokens_on_smollm2_never_exceeds_the_count():
    from conftest import smollm2_path

    tok = load_tokenizer(smollm2_path())
    assert tok.max_token_bytes == 81  # "\n" and 80 spaces
    assert tok.dropped_bytes == bytes([4, 6, 0x13, 0x14, 0x16, 0x1D, 0xC0, 0xC1, 0xF1, 0xF2, *range(0xF5, 0x100)])
    texts = BOUND_TEXTS + ["\n" + " " * 80, ("\n" + " " * 80) * 5 + "x", "\U00050000\U00048000" * 20,
                           "################################################################################"]
    for text in texts:
        assert tok.fewest_tokens(text) <= len(tok.encode(text)), text
    assert tok.fewest_tokens("\n" + " " * 80) == len(tok.encode("\n" + " " * 80)) == 1


# ------------------------------------------------------------------------------------------------
# load_tokenizer
# ------------------------------------------------------------------------------------------------


def test_load_tokenizer_chooses_by_config(bpe_dir, tmp_path):
    byte = load_tokenizer(tmp_path, {"tl_tokenizer": "byte", "eos_token_id": 10})
    assert isinstance(byte, ByteTokenizer) and byte.eos_ids == [10]
    # a ModelConfig-like object (attribute names of tl_lab.model.ModelConfig)
    cfg = SimpleNamespace(tokenizer="bpe", eos_token_ids=[2], bos_token_id=1, chat_template=None, vocab_size=300)
    bpe = load_tokenizer(bpe_dir, cfg)
    assert isinstance(bpe, BpeTokenizer) and bpe.eos_ids == [2] and bpe.vocab_size == 300
    assert isinstance(load_tokenizer(bpe_dir), Tokenizer)  # config.json read from the directory


def test_load_tokenizer_refusals_name_the_problem(bpe_dir, tmp_path):
    with pytest.raises(ConfigError, match="'words'"):
        load_tokenizer(tmp_path, {"tl_tokenizer": "words"})
    with pytest.raises(ConfigError, match="tokenizer.json is missing"):
        load_tokenizer(tmp_path, {"tl_tokenizer": "bpe"})
    with pytest.raises(ConfigError, match="vocab_size is 100"):
        load_tokenizer(bpe_dir, {"tl_tokenizer": "bpe", "vocab_size": 100})
    with pytest.raises(ConfigError, match="config.json"):
        load_tokenizer(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(ConfigError, match="tokenizers library"):
        load_tokenizer(tmp_path, {"tl_tokenizer": "bpe"})


# ------------------------------------------------------------------------------------------------
# Chat templates
# ------------------------------------------------------------------------------------------------


def test_chat_template_renders_chatml(bpe_dir):
    tok = load_tokenizer(bpe_dir)
    msgs = [{"role": "user", "content": "Hi!"}]
    assert tok.apply_chat_template(msgs) == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n"
    )
    sys_first = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    assert tok.apply_chat_template(sys_first, add_generation_prompt=False) == (
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n"
    )
    ids = tok.encode(tok.apply_chat_template(msgs))
    assert ids[0] == 1 and ids.count(1) == 3 and ids.count(2) == 2


def test_chat_template_variables_and_helpers():
    out = render_chat_template(FANCY, CONVERSATIONS[2], special_tokens={"bos_token": "<s>", "eos_token": "</s>"})
    assert out.startswith("<s>") and '[USER] "Name a colour."' in out and "skip me" not in out
    assert '"Another, with \\"quotes\\" and ünïcødé\\n  and  spaces"' in out and out.endswith("[ASSISTANT]\n")

    with pytest.raises(ConfigError, match="chat template .* unknown role tool"):
        render_chat_template(FANCY, [{"role": "tool", "content": "x"}])


def test_no_chat_template_is_a_clear_refusal():
    with pytest.raises(ConfigError, match="no chat template"):
        ByteTokenizer().apply_chat_template([{"role": "user", "content": "hi"}])


def test_decode_of_one_id_not_in_a_list_is_named(bpe_dir):
    """decode(65) raised Python's "TypeError: 'int' object is not iterable"; now a ValueError naming it."""
    for tok in (ByteTokenizer(), load_tokenizer(bpe_dir)):
        with pytest.raises(ValueError, match=r"^token ids must be a sequence of ints, got int 65$"):
            tok.decode(65)
        assert tok.decode([65]) == tok.decode((65,)) != ""  # a sequence still decodes


@pytest.mark.parametrize("messages, add, words", [
    ("hi", True, "messages must be a list of {'role': ..., 'content': ...} dicts, got str"),
    ({"role": "user", "content": "hi"}, True, "messages must be a list of {'role': ..., 'content': ...} dicts, got dict"),
    (None, True, "messages must be a list of {'role': ..., 'content': ...} dicts, got NoneType"),
    (["hi"], True, "messages[0] must be a dict with 'role' and 'content', got str"),
    ([{"role": "user"}], True, "messages[0]['content'] must be a str, got NoneType"),
    ([{"role": "user", "content": "a"}, {"content": "b"}], True, "messages[1]['role'] must be a str, got NoneType"),
    ([{"role": "user", "content": 5}], True, "messages[0]['content'] must be a str, got int"),
    ([{"role": "user", "content": "a"}], "no", "add_generation_prompt must be True or False, got 'no'"),
])
def test_chat_messages_that_are_not_a_chat_are_named_not_blamed_on_the_template(bpe_dir, messages, add, words):
    """apply_chat_template("hi") or a message without "content" was "ConfigError: the chat template
    (config.json tl_chat_template) failed: UndefinedError: ...", blaming the model's config for the
    caller's argument; None was "TypeError: 'NoneType' object is not iterable" and add_generation_prompt="no"
    added the prompt. Now a ValueError naming the argument, before the template runs."""
    with pytest.raises(ValueError, match=f"^{re.escape(words)}$"):
        load_tokenizer(bpe_dir).apply_chat_template(messages, add_generation_prompt=add)


@pytest.mark.hf
def test_chat_templates_render_like_transformers(bpe_dir):
    transformers = need("transformers")
    hf = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(bpe_dir / "tokenizer.json"), bos_token="<|im_start|>", eos_token="<|im_end|>"
    )
    ours = load_tokenizer(bpe_dir)
    for template in (CHATML, FANCY):
        ours.chat_template = template
        for msgs in CONVERSATIONS:
            for gen in (True, False):
                want = hf.apply_chat_template(msgs, chat_template=template, tokenize=False, add_generation_prompt=gen)
                assert ours.apply_chat_template(msgs, add_generation_prompt=gen) == want, (template[:20], msgs, gen)


@pytest.mark.parametrize("text, where", [("a\udcff", "the byte 0xff at character 1"),
                                         ("ok \ud800", "a lone surrogate U+D800 at character 3")])
def test_text_that_is_not_utf8_is_a_value_error_naming_the_byte(bpe_dir, text, where):
    """argv and stdin carry undecodable bytes as lone surrogates; both tokenizers refuse them alike
    (they were a UnicodeEncodeError and a TypeError from inside the tokenizers library)."""
    for tok in (ByteTokenizer(), load_tokenizer(bpe_dir)):
        with pytest.raises(ValueError, match=re.escape(f"not valid UTF-8: {where}")):
            tok.encode(text)
    with pytest.raises(ValueError, match="must be a str, got bytes"):
        ByteTokenizer().encode(b"abc")


@pytest.mark.parametrize("template, why", [
    ("{% for m in messages %}{{ m.content }", "TemplateSyntaxError"),
    ("{{ raise_exception('only user and assistant roles') }}", "only user and assistant roles"),
    ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", "runaway loop"),
    ("{% for m in messages %}{% for n in messages %}{% for i in range(99999) %}{% endfor %}{% endfor %}{% endfor %}",
     "runaway loop"),
    ("{{ 'ab' * 10**8 }}", "more than 10,000,000 items"),
    ("{{ 7 ** 100000000 }}", "more than 10,000,000 items"),  # Jinja's ** is left-associative
    ("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", "RecursionError"),
])
def test_a_bad_chat_template_is_a_config_error_and_never_hangs(template, why):
    messages = [{"role": "user", "content": "hi"}] * 30
    with pytest.raises(ConfigError, match=f"chat template .*{why}"):
        render_chat_template(template, messages)
    assert sys.gettrace() is None  # the step counter is gone again
    assert "<|im_start|>user\nhi<|im_end|>" in render_chat_template(CHATML, messages[:1])  # rendering still works


def test_a_chat_template_that_does_not_parse_is_refused_at_its_line():
    with pytest.raises(ConfigError, match=r"^the chat template \(config.json tl_chat_template\) failed \(line 2\): "
                                          r"TemplateSyntaxError: "):
        render_chat_template("{{ bos_token }}\n{% if %}", [])


def test_a_repetition_by_zero_or_fewer_makes_nothing_whatever_the_sequence(monkeypatch):
    """The bound on `*` counts what it makes: nothing for a count of 0 or below, even from a sequence
    longer than the bound (a message's content can be)."""
    import tl_lab.engine.tokenizer as tokenizer

    monkeypatch.setattr(tokenizer, "MAX_TEMPLATE_ITEMS", 5)
    messages = [{"role": "user", "content": "abcdefgh"}]
    assert render_chat_template("[{{ messages[0]['content'] * 0 }}{{ messages[0]['content'] * -2 }}]", messages) == "[]"
    with pytest.raises(ConfigError, match="more than 5 items"):
        render_chat_template("{{ messages[0]['content'] * 1 }}", messages)


def test_token_bytes_of_a_special_or_added_token_is_its_text(bpe_dir, tmp_path):
    """A special token is its text in UTF-8 even when its characters are in the byte-level alphabet
    ("Ġ" reads as a space there), and so is an added token with a character outside that alphabet."""
    import shutil

    from tokenizers import AddedToken
    from tokenizers import Tokenizer as HfTokenizer

    d = tmp_path / "m"
    shutil.copytree(bpe_dir, d)
    hf = HfTokenizer.from_file(str(d / "tokenizer.json"))
    hf.add_special_tokens([AddedToken("<|Ġ|>", special=True, normalized=False)])
    hf.add_tokens([AddedToken("✓ok", special=False, normalized=False)])
    hf.save(str(d / "tokenizer.json"))
    config = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**config, "vocab_size": hf.get_vocab_size(with_added_tokens=True)}))
    tok = load_tokenizer(d)
    special, added = (hf.token_to_id(s) for s in ("<|Ġ|>", "✓ok"))
    assert tok.token_bytes(special) == "<|Ġ|>".encode() and tok.token_bytes(added) == "✓ok".encode()
    assert tok.token_bytes(tok.encode(" the")[0]) == b" the"  # a byte-level piece: its bytes


@pytest.mark.parametrize("ids", [[104, 2.7], [True], ["104"]])
def test_ids_that_are_not_integers_are_refused_not_truncated(bpe_dir, ids):
    for tok in (ByteTokenizer(), load_tokenizer(bpe_dir)):
        with pytest.raises(ValueError, match="token id must be an integer"):
            tok.decode(ids)


@pytest.mark.parametrize("kind", ["directory", "fifo"])
def test_a_tokenizer_json_that_is_not_a_file_is_refused_at_once(bpe_dir, tmp_path, kind):
    import os
    import shutil

    d = tmp_path / "m"
    shutil.copytree(bpe_dir, d)
    (d / "tokenizer.json").unlink()
    os.mkdir(d / "tokenizer.json") if kind == "directory" else os.mkfifo(d / "tokenizer.json")
    with pytest.raises(ConfigError, match="tokenizer.json: .* not a regular file"):
        load_tokenizer(d)
    (d / "config.json").unlink()
    os.mkfifo(d / "config.json")  # load_tokenizer reads config.json itself when given none
    with pytest.raises(ConfigError, match="config.json: .* named pipe"):
        load_tokenizer(d)


def test_a_tokenizer_json_too_big_for_its_vocabulary_is_refused_before_it_is_read(tmp_path):
    """Was: anything up to 100 MB was parsed first (65 MB: 1 GB and 5 to 10 s), only to be refused for
    more tokens than vocab_size. The limit scales with vocab_size: 1 MiB + 256 bytes a token. The files
    here are sparse: one at the limit is read (and its NULs are not JSON), one byte more never is."""
    from tl_lab.engine.tokenizer import MAX_TOKENIZER_BYTES, tokenizer_limit

    assert tokenizer_limit(1)[0] == (1 << 20) + 256 and tokenizer_limit(49152)[0] == 13_631_488
    assert tokenizer_limit(None)[0] == tokenizer_limit(10**9)[0] == MAX_TOKENIZER_BYTES == 64 << 20
    path = tmp_path / "tokenizer.json"
    for size, words in [((1 << 20) + 256, "the tokenizers library can read"),
                        ((1 << 20) + 257, "has 1,048,833 bytes, over the 1,048,832-byte limit for config.json's "
                                          "vocab_size 1 (256 bytes a token and 1 MiB; real files take under 130 a token)")]:
        with open(path, "wb") as f:
            f.truncate(size)
        with pytest.raises(ConfigError) as info:
            BpeTokenizer(path, vocab_size=1)
        assert words in str(info.value)
    with open(path, "wb") as f:
        f.truncate(MAX_TOKENIZER_BYTES + 1)
    with pytest.raises(ConfigError, match="over the 67,108,864-byte limit for any tokenizer.json"):
        BpeTokenizer(path)
    with pytest.raises(ConfigError, match="vocab_size must be an integer, got str '49152'"):
        load_tokenizer(tmp_path, {"tl_tokenizer": "bpe", "vocab_size": "49152"})


@pytest.mark.smollm2
def test_smollm2s_tokenizer_json_is_well_within_its_limit():
    from conftest import smollm2_path
    from tl_lab.engine.tokenizer import tokenizer_limit

    path = smollm2_path()
    size = (path / "tokenizer.json").stat().st_size
    assert 3 * size < tokenizer_limit(load_tokenizer(path).vocab_size)[0]  # 3.5 MB of 13.6 MB


# --------------------------------------------------------------------------------------------
# What mutation testing found unchecked (issue 20)
# --------------------------------------------------------------------------------------------


@pytest.fixture
def fresh_env(monkeypatch):
    """The template environment built anew: it is cached per process, so a test of what building it
    does (the filters, the bounds) must not see one an earlier test built."""
    import tl_lab.engine.tokenizer as t

    monkeypatch.setattr(t, "_ENV", None)


def test_tojson_passes_indent_and_sort_keys_as_transformers_does(fresh_env):
    template = "{{ messages[0]|tojson(indent=2, sort_keys=true) }}|{{ messages[0]|tojson }}"
    m = {"role": "user", "content": "hé"}
    want = json.dumps(m, ensure_ascii=False, indent=2, sort_keys=True) + "|" + json.dumps(m, ensure_ascii=False)
    assert render_chat_template(template, [m]) == want


def test_an_operator_refusal_names_both_operands(fresh_env):
    with pytest.raises(ConfigError, match=r"'\*' on str and int would make more than 10,000,000 items"):
        render_chat_template("{{ 'ab' * 10**8 }}", [])
    with pytest.raises(ConfigError, match=r"'\*' on int and str would make more than"):
        render_chat_template("{{ 10**8 * 'ab' }}", [])
    # `**` is sized before it runs, also where Jinja would fold it as it compiles: there it is one C
    # call no step counter or clock can stop (12 s for this one before it gave True, when not intercepted)
    with pytest.raises(ConfigError, match=r"'\*\*' on int and int would make more than 10,000,000 items"):
        render_chat_template("{{ (7 ** 4000000) > 1 }}", [])


def test_a_byte_model_keeps_its_chat_template():
    template = "{% for m in messages %}{{ m.content }};{% endfor %}"
    for config in ({"tl_tokenizer": "byte", "tl_chat_template": template},
                   SimpleNamespace(tokenizer="byte", eos_token_ids=[], bos_token_id=None, chat_template=template)):
        tok = load_tokenizer(".", config)
        assert tok.chat_template == template and tok.apply_chat_template([{"role": "user", "content": "a"}]) == "a;"
    with pytest.raises(ConfigError, match=r"^this model has no chat template \(config.json tl_chat_template\); "
                                          r"use a plain prompt$"):
        ByteTokenizer().apply_chat_template([{"role": "user", "content": "a"}])


def test_the_byte_alphabet_is_gpt2s():
    """GPT-2's byte-level alphabet: the printable Latin-1 bytes are themselves; the 68 others (0-32,
    127-160 and the soft hyphen 0xAD) are 256, 257, ... in byte order. A byte off (0xAD kept) would
    decode every token holding a soft hyphen wrongly."""
    table = _bytes_to_unicode()
    assert sorted(table) == list(range(256)) and len(set(table.values())) == 256
    shifted = [b for b in range(256) if table[b] != chr(b)]
    assert shifted == [*range(0, 33), *range(127, 161), 0xAD]
    assert [table[b] for b in shifted] == [chr(256 + i) for i in range(len(shifted))]


# --------------------------------------------------------------------------------------------
# Bounded renders (issue 20's probes of chat templates)
# --------------------------------------------------------------------------------------------

HUGE_TEMPLATES = [  # what each one did before: the memory and the time it took inside the sandbox
    ('{{ "a".ljust(10**9) }}', "ljust() was given 1000000000"),  # 2 GB
    ('{{ "a".center(10**9) }}', "center() was given 1000000000"),
    ('{{ "a".zfill(10**9) }}', "zfill() was given 1000000000"),
    ('{{ "%1000000000d"|format(1) }}', "format() would make more than 10,000,000 characters"),  # 4 GB
    ('{{ "%1000000000d" % 1 }}', "'%' on str and int would make more than"),
    ('{{ "{:>1000000000}".format(1) }}', "format() would make more than"),
    ('{{ ("\t" * 1000).expandtabs(100000) }}', "expandtabs() would make more than"),
    ("{{ messages|tojson(indent=10**8) }}", "tojson() was given 100000000"),
    ('{{ ("a" * 5000000)|replace("a", "bbbbbbbbbbbb") }}', "replace() would make more than"),
    ('{{ ("x\n" * 3000000)|indent(1000) }}', "indent() would make more than"),
    ('{{ [1]|batch(10**9, "x")|list }}', "batch() was given 1000000000"),
    ("{% set ns = namespace(s='a') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}",
     "namespace attribute 's' made 16,777,216 items"),  # 3.8 GB, exit 0
    ('{% macro d(s, n) %}{% if n %}{{ d(s ~ s, n - 1) }}{% else %}{{ s }}{% endif %}{% endmacro %}{{ d("a", 40) }}',
     "an argument of Macro() made 16,777,216 items"),
    ('{% for i in range(100000) %}{{ "x" * 100000 }}{% endfor %}', "the output would be more than 10,000,000"),
    ("{{ lipsum(200000) }}", "lipsum() was given 200000"),  # 77 s, 2.4 GB
    ("{{ lipsum(1000) }}", "lipsum(1000, max=100) would make more than 10,000 words"),
    ("{% for i in range(100000) %}{% for j in range(100000) %}{% for k in range(100000) %}{% endfor %}{% endfor %}"
     "{% endfor %}", "ran longer than 1 s"),  # hours, inside the step budget
]


@pytest.mark.parametrize("template, words", HUGE_TEMPLATES)
def test_a_chat_template_is_bounded_in_memory_time_and_output(template, words, fresh_env):
    """Issue 20 (its probes): the sandbox bounded `*` only. Now every call, filter, operator, namespace value and
    the output are bounded in size, and a render in wall time: each probe is one ConfigError naming
    the bound, with little memory (tracemalloc's peak, the strings and lists a render makes)."""
    tracemalloc.start()
    try:
        with pytest.raises(ConfigError, match="chat template") as info:
            render_chat_template(template, [{"role": "user", "content": "hi"}])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert words in str(info.value)
    assert peak < 150_000_000, peak
    assert sys.gettrace() is None


def test_a_value_of_exactly_the_bound_is_rendered(fresh_env):
    """The bounds are inclusive: ten million characters is a value a template may make and print."""
    assert len(render_chat_template("{{ 'a' * 10000000 }}", [])) == 10_000_000
    assert render_chat_template("{{ 'ab'.ljust(100000)|length }}", []) == "100000"


def test_arithmetic_on_large_integers_is_not_mistaken_for_a_power(fresh_env):
    """Only `**` is sized by its exponent: 1 + 20,000,000 is a small value (mutation testing, s55)."""
    assert render_chat_template("{{ 1 + 20000000 }}|{{ 3 * 20000000 }}|{{ 2 ** 10 }}", []) == "20000001|60000000|1024"


def test_an_integer_in_a_message_is_its_digits_up_to_63_bits():
    from tl_lab.engine.tokenizer import _short

    assert _short(2**63 - 1) == "9223372036854775807" and _short(-(2**63) + 1) == "-9223372036854775807"
    assert _short(2**63) == "an integer of about 19 digits"


def test_filters_keep_their_defaults_under_the_bounds(fresh_env):
    """The bounds read a filter's arguments; a filter called without them keeps Jinja's defaults
    (mutation testing: `indent` with no width was never rendered)."""
    assert render_chat_template('{{ "a\nb"|indent }}|{{ "a\tb".expandtabs() }}', []) == "a\n    b|a       b"
