"""Tokenizers: text <-> token ids, behind one small interface (interface page, "Beyond the chapter").

config.json's `tl_tokenizer` picks one (chapter L10.1, section 2.3):

- "byte": ByteTokenizer, token id = byte value (vocab 256), for the bigram and the tiny Llama;
- "bpe":  BpeTokenizer, the model directory's tokenizer.json through the `tokenizers` library
          (SmolLM2's byte-level BPE, rebuilt from its GGUF by tl_lab.engine.fetch).

encode() adds no special tokens: a chat prompt gets them from the chat template
(apply_chat_template renders config.json's `tl_chat_template`, exactly as transformers does).
"""

from __future__ import annotations

import contextlib
import functools
import json
import re
import sys
import time
from pathlib import Path
from typing import Any, Iterable, Sequence

from tl_lab.ops.checks import as_int
from tl_lab.errors import ConfigError
from tl_lab.ops.paths import read_regular


# tokenizer.json is refused by its size before the tokenizers library parses it: a parse holds about
# 15 bytes of memory for each byte of the file and takes 0.1 s a MB (65 MB: 1 GB and 5 to 10 s here,
# all to be refused after for more tokens than config.json's vocab_size). Real files take 30 to 130 bytes
# a token: SmolLM2's as tl_lab fetch writes it 72 (3.5 MB for 49,152), Llama 3's 71 (9.1 MB for
# 128,256), Gemma 3's 127 (33 MB for 262,145, the largest we know of). So a file may take twice the
# most of those for each token of vocab_size, and 1 MiB more for a small vocabulary's settings (the
# added tokens, the pipeline): SmolLM2's vocab_size allows 13.6 MB, a parse of 0.2 GB and 1.3 s.
TOKENIZER_BYTES_PER_TOKEN = 256
TOKENIZER_BASE_BYTES = 1 << 20
MAX_TOKENIZER_BYTES = 64 << 20  # whatever vocab_size says (or with none): twice the largest real file


def tokenizer_limit(vocab_size: int | None) -> tuple[int, str]:
    """(the most bytes a tokenizer.json may have for a vocabulary of vocab_size tokens, what that limit
    is for, in words for a message); vocab_size None: not known."""
    scaled = None if vocab_size is None else TOKENIZER_BASE_BYTES + TOKENIZER_BYTES_PER_TOKEN * vocab_size
    if scaled is None or scaled > MAX_TOKENIZER_BYTES:
        return MAX_TOKENIZER_BYTES, "any tokenizer.json (twice the largest real one)"
    return scaled, (f"config.json's vocab_size {vocab_size:,} ({TOKENIZER_BYTES_PER_TOKEN} bytes a token and "
                    f"{TOKENIZER_BASE_BYTES >> 20} MiB; real files take under 130 a token)")


class Tokenizer:
    """What the engine and the notebooks need from a tokenizer.

    vocab_size: ids are 0 .. vocab_size - 1.  eos_ids: generation stops at any of these.
    bos_id: the begin-of-sequence id or None.  chat_template: a Jinja template or None.
    """

    vocab_size: int
    eos_ids: list[int]
    bos_id: int | None
    chat_template: str | None
    # The most bytes of UTF-8 one token can cover, and the bytes no token covers (the encoder drops
    # them), for `fewest_tokens`; None: no such bound is known for this tokenizer.
    max_token_bytes: int | None = None
    dropped_bytes: bytes = b""
    # The bytes a space of the text becomes before the model sees it (SentencePiece's "▁" is 3).
    space_bytes: int = 1

    def __init__(self, eos_ids: Iterable[int] = (), bos_id: int | None = None, chat_template: str | None = None):
        """The special ids (checked against vocab_size, which a subclass sets first) and the template."""
        self.eos_ids = [as_int(i, "eos id") for i in eos_ids]
        self.bos_id = bos_id
        self.chat_template = chat_template
        self._check_ids(self.eos_ids + ([] if bos_id is None else [bos_id]))

    def encode(self, text: str) -> list[int]:
        raise NotImplementedError

    def decode(self, ids: Iterable[int]) -> str:
        raise NotImplementedError

    def decode_after(self, shown: list[int], new: list[int]) -> str:
        """The text ids `new` add after `shown` (the last few ids already out): decoded after them and
        cut where their text ends, because a SentencePiece decoder drops the space of the word it
        decodes first ("▁world" alone is "world", after "▁Hello" it is " world"). Decoded alone where
        the cut is not clean (`shown` ending in half a UTF-8 character)."""
        if not new:
            return ""
        before, both = self.decode(shown), self.decode(shown + new)
        return both[len(before):] if both.startswith(before) else self.decode(new)

    def fewest_tokens(self, text: str) -> int:
        """A lower bound on len(self.encode(text)) found without encoding: every token covers at most
        max_token_bytes of the text's UTF-8 as the model sees it (each space space_bytes), so its B bytes
        (less the dropped ones) need at least ceil(B / max_token_bytes) tokens; 0 when no bound is
        known. It lets a prompt far over the context be refused at once: encoding 10 MB of text took 6 s
        and 1.7 GB only to be refused. ValueError, as encode's, for a text that is not UTF-8."""
        most = self.max_token_bytes
        data = utf8(text)
        if not most:
            return 0
        seen = len(data.translate(None, self.dropped_bytes)) + (self.space_bytes - 1) * data.count(b" ")
        return -(-seen // most)

    def encode_within(self, text: str, n: int, error: type[Exception] = ValueError, where: str = "") -> list[int]:
        """The ids of prompt `text` when they fit a context of n tokens (max_position_embeddings), else
        error(where + why), raised before `text` is encoded when its bytes alone prove it (`fewest_tokens`)."""
        least = self.fewest_tokens(text)
        if least > n:
            raise error(f"{where}a prompt of {len(utf8(text)):,} bytes is at least {least:,} tokens, longer than "
                        f"the context (max_position_embeddings {n})")
        ids = self.encode(text)
        if len(ids) > n:
            raise error(f"{where}a {len(ids)}-token prompt is longer than the context (max_position_embeddings {n})")
        return ids

    def token_str(self, id: int) -> str:
        """One token for display: its text, with bytes that are not text on their own as \\xNN."""
        raise NotImplementedError

    def apply_chat_template(self, messages: Sequence[dict], add_generation_prompt: bool = True) -> str:
        """The prompt text for a chat: messages [{"role": ..., "content": ...}] rendered by the template."""
        if not self.chat_template:
            raise ConfigError("this model has no chat template (config.json tl_chat_template); use a plain prompt")
        _check_messages(messages, add_generation_prompt)
        return render_chat_template(
            self.chat_template,
            messages,
            add_generation_prompt=add_generation_prompt,
            special_tokens=self._special_token_strings(),
        )

    def _special_token_strings(self) -> dict[str, str | None]:
        return {}

    def _check_ids(self, ids: Iterable[int]) -> list[int]:
        if not hasattr(ids, "__iter__"):  # decode(65): "TypeError: 'int' object is not iterable"
            raise ValueError(f"token ids must be a sequence of ints, got {type(ids).__name__} {ids!r}")
        ids = [as_int(i, "token id") for i in ids]  # 2.7 is refused, not read as 2
        for i in ids:
            if not 0 <= i < self.vocab_size:
                raise ValueError(f"token id {i} is outside the vocabulary (0 .. {self.vocab_size - 1})")
        return ids


class ByteTokenizer(Tokenizer):
    """Token id = byte value: UTF-8 in, 256 ids; decode replaces invalid UTF-8 with U+FFFD."""

    vocab_size = 256
    max_token_bytes = 1  # fewest_tokens is the exact count

    def encode(self, text: str) -> list[int]:
        return list(utf8(text))

    def decode(self, ids: Iterable[int]) -> str:
        return bytes(self._check_ids(ids)).decode("utf-8", errors="replace")

    def token_str(self, id: int) -> str:
        (b,) = self._check_ids([id])
        return chr(b) if 0x20 <= b < 0x7F else f"\\x{b:02x}"

    def __repr__(self) -> str:
        return f"ByteTokenizer(vocab_size=256, eos_ids={self.eos_ids})"


class BpeTokenizer(Tokenizer):
    """A tokenizer.json (a BPE model, byte-level or SentencePiece-style, with special tokens) through the
    `tokenizers` library."""

    def __init__(
        self,
        path: str | Path,
        eos_ids: Iterable[int] = (),
        bos_id: int | None = None,
        chat_template: str | None = None,
        vocab_size: int | None = None,
    ):
        from tokenizers import Tokenizer as HfTokenizer

        path = Path(path)
        if not path.exists():
            raise ConfigError(f"tl_tokenizer is bpe but {path} is missing")
        if vocab_size is not None:
            vocab_size = as_int(vocab_size, "config.json vocab_size", lo=1, error=ConfigError)
        text = read_regular(path, "tokenizer.json", ConfigError, *tokenizer_limit(vocab_size))  # never blocks on a FIFO
        try:
            self._tok = HfTokenizer.from_str(text.decode("utf-8"))
        except BaseException as exc:  # a bare Exception for a malformed file; a panic (pyo3's PanicException,
            if not isinstance(exc, Exception) and type(exc).__name__ != "PanicException":  # a BaseException) for some
                raise  # Ctrl-C
            raise ConfigError(f"{path} is not a tokenizer.json the tokenizers library can read: {exc}") from exc
        n = self._tok.get_vocab_size(with_added_tokens=True)
        if vocab_size is not None and n > vocab_size:
            raise ConfigError(f"{path.name} has {n} tokens but config.json vocab_size is {vocab_size}")
        self.vocab_size = vocab_size if vocab_size is not None else n
        super().__init__(eos_ids, bos_id, chat_template)
        self._special = {t.content for t in self._tok.get_added_tokens_decoder().values() if t.special}
        self._byte_of = {c: b for b, c in _bytes_to_unicode().items()}

    @functools.cached_property
    def _token_bound(self) -> tuple[int | None, bytes, int]:
        """(max_token_bytes, dropped_bytes, space_bytes), worked out on first use (50 ms for SmolLM2's
        49152 tokens).

        The bound holds only where each token covers a known most of the text's bytes: no truncation, a
        BPE model that looks a character up as itself (a continuing_subword_prefix or end_of_word_suffix
        makes it look up "##a" or "a</w>" instead, and drop the character when only "a" is there), added
        tokens that cover their own text only (an lstrip or rstrip one takes the spaces around it too),
        and either of the two designs real tokenizer.json files use:
        - byte-level (GPT-2, SmolLM2, Llama 3): `_byte_level_bound`;
        - SentencePiece-style (Llama 2, Mistral, Gemma): `_metaspace_bound`.
        Any other tokenizer.json gets no bound: its prompts are encoded first, as before.
        """
        tok = self._tok
        added = list(tok.get_added_tokens_decoder().values())
        if (tok.truncation is not None or type(tok.model).__name__ != "BPE" or any(t.lstrip or t.rstrip for t in added)
                or tok.model.continuing_subword_prefix or tok.model.end_of_word_suffix):
            return _NO_BOUND
        normalizer = None if tok.normalizer is None else json.loads(tok.normalizer.__getstate__())
        pre = {} if tok.pre_tokenizer is None else json.loads(tok.pre_tokenizer.__getstate__())
        if not _steps(normalizer, "normalizers") and _keeps_every_byte(pre):
            return self._byte_level_bound(added)
        space = _space_becomes(normalizer, pre)
        return _NO_BOUND if space is None else self._metaspace_bound(added, space)

    def _byte_level_bound(self, added) -> tuple[int | None, bytes, int]:
        """No normalizer (NFC makes 2 bytes of 3, a Replace or Strip any number of none) and pre-tokenizers
        that split the text and map each byte to one character of the byte alphabet: a vocabulary token
        covers as many bytes as it has characters, an added one its text's, and a byte whose character
        is not in the vocabulary is dropped (SmolLM2 drops 21 bytes, 0x04, 0x13 among them)."""
        vocab = self._tok.get_vocab(with_added_tokens=False)
        alphabet = set(self._byte_of)
        most = max((len(p) if set(p) <= alphabet else len(p.encode("utf-8")) for p in vocab), default=0)
        most = max([most, *(len(t.content.encode("utf-8")) for t in added)])
        dropped = bytes(b for c, b in self._byte_of.items() if c not in vocab)
        return most or None, dropped, 1

    def _metaspace_bound(self, added, space: str) -> tuple[int | None, bytes, int]:
        """Each space of the text becomes `space` (SentencePiece's "▁") and the model reads characters:
        a vocabulary token covers its own UTF-8 bytes of that text, a byte-fallback one ("<0xE6>") one
        byte, an unknown one ("<unk>") one character, at most 4 bytes; an added token its text's, with
        its spaces as `space`. A "▁" put before the text (Prepend, prepend_scheme) is not counted, so
        the bound stays below. A character with neither is dropped, and with `fuse_unk` one "<unk>"
        covers any number of them: no bound then."""
        model, vocab = self._tok.model, self._tok.get_vocab(with_added_tokens=False)
        every_byte = model.byte_fallback and all(f"<0x{b:02X}>" in vocab for b in range(256))
        if not every_byte and (model.unk_token not in vocab or model.fuse_unk):
            return _NO_BOUND
        # an added token's spaces as `space` (never shorter than " "): matched in the text or in what the
        # normalizer made of it, it covers at most that many of the bytes counted
        most = max([4, *(len(p.encode("utf-8")) for p in vocab),
                    *(len(t.content.replace(" ", space).encode("utf-8")) for t in added)])
        return most, b"", len(space.encode("utf-8"))

    @property
    def max_token_bytes(self) -> int | None:
        return self._token_bound[0]

    @property
    def dropped_bytes(self) -> bytes:
        return self._token_bound[1]

    @property
    def space_bytes(self) -> int:
        return self._token_bound[2]

    def encode(self, text: str) -> list[int]:
        # Special-token strings in the text (the chat template writes them) become their ids.
        utf8(text)  # the library would raise a bare TypeError on a lone surrogate
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        return self._tok.decode(self._check_ids(ids), skip_special_tokens=skip_special_tokens)

    def token_bytes(self, id: int) -> bytes:
        """The bytes a token stands for (a special token: its text in UTF-8)."""
        (i,) = self._check_ids([id])
        piece = self._tok.id_to_token(i)
        if piece is None:
            return b""
        if piece in self._special or any(c not in self._byte_of for c in piece):
            return piece.encode("utf-8")
        return bytes(self._byte_of[c] for c in piece)

    def token_str(self, id: int) -> str:
        return self.token_bytes(id).decode("utf-8", errors="backslashreplace")

    def _special_token_strings(self) -> dict[str, str | None]:
        name = lambda i: None if i is None else self._tok.id_to_token(i)  # noqa: E731
        return {"bos_token": name(self.bos_id), "eos_token": name(self.eos_ids[0] if self.eos_ids else None)}

    def __repr__(self) -> str:
        return f"BpeTokenizer(vocab_size={self.vocab_size}, eos_ids={self.eos_ids}, bos_id={self.bos_id})"


# Pre-tokenizers that only split the text, and ByteLevel, which maps each byte to one character: with
# them, and ByteLevel among them, each byte of the text reaches the BPE model as one character.
_SPLITTERS = {"ByteLevel", "Digits", "Split", "Punctuation"}
_NO_BOUND = (None, b"", 1)  # BpeTokenizer._token_bound where no bound is known


def _steps(spec: dict | None, key: str) -> list[dict]:
    """The steps of a normalizer or pre-tokenizer in its tokenizer.json form: a Sequence's list under
    `key` ("normalizers", "pretokenizers"), else the one step; none for None or {}."""
    if not spec:
        return []
    return spec.get(key, []) if spec.get("type") == "Sequence" else [spec]


def _only_splits(step: dict) -> bool:
    """A pre-tokenizer step that splits the text and drops none of it (ByteLevel also maps its bytes)."""
    return step.get("type") in _SPLITTERS and step.get("behavior") != "Removed"


def _space_becomes(normalizer: dict | None, pre: dict) -> str | None:
    """What a space of the text becomes before the BPE model reads it, where that is all a
    SentencePiece-style tokenizer.json changes: normalizers that only prepend or replace " " with one
    non-empty string, pre-tokenizers that only split or are Metaspace with that string ("▁"); None
    for anything else (see BpeTokenizer._metaspace_bound)."""
    spaces = set()
    for n in _steps(normalizer, "normalizers"):
        if n.get("type") == "Replace" and n.get("pattern") == {"String": " "} and n.get("content"):
            spaces.add(n["content"])
        elif n.get("type") != "Prepend":
            return None
    for p in _steps(pre, "pretokenizers"):
        if p.get("type") == "Metaspace" and p.get("replacement"):
            spaces.add(p["replacement"])
        elif not _only_splits(p) or p.get("type") == "ByteLevel":
            return None
    return (spaces or {" "}).pop() if len(spaces) <= 1 else None


def _keeps_every_byte(pre: dict) -> bool:
    """Whether a pre-tokenizer (its tokenizer.json form) hands the BPE model every byte of the text as
    one character of the byte alphabet (see BpeTokenizer._token_bound)."""
    parts = _steps(pre, "pretokenizers")
    return all(map(_only_splits, parts)) and any(p.get("type") == "ByteLevel" for p in parts)


def utf8(text: str) -> bytes:
    """`text` as UTF-8 bytes, or ValueError saying where it is not text.

    Undecodable input bytes reach Python as lone surrogates (argv and stdin use surrogateescape), which
    no UTF-8 encoder accepts; the error names the original byte when that is what it was.
    """
    if not isinstance(text, str):
        raise ValueError(f"text to encode must be a str, got {type(text).__name__}")
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:
        c = ord(text[exc.start])
        what = f"the byte 0x{c - 0xDC00:02x}" if 0xDC80 <= c <= 0xDCFF else f"a lone surrogate U+{c:04X}"
        raise ValueError(f"the text is not valid UTF-8: {what} at character {exc.start}") from None


def load_tokenizer(model_dir: str | Path, config: Any = None) -> Tokenizer:
    """The tokenizer config.json asks for: config.tokenizer "byte" or "bpe" (tokenizer.json beside it).

    config: a tl_lab.model.ModelConfig, a dict of config.json keys, or None to read model_dir/config.json.
    """
    model_dir = Path(model_dir)
    if config is None:
        from tl_lab.model import MAX_CONFIG_BYTES

        path = model_dir / "config.json"
        try:
            config = json.loads(read_regular(path, "config.json", ConfigError, MAX_CONFIG_BYTES))
        except ValueError as exc:
            raise ConfigError(f"cannot read {path}: {exc}") from exc
    kind = _field(config, "tokenizer", "tl_tokenizer")
    eos = _field(config, "eos_token_ids", "eos_token_id")
    eos_ids = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
    bos_id = _field(config, "bos_token_id", "bos_token_id")
    template = _field(config, "chat_template", "tl_chat_template")
    if kind == "byte":
        return ByteTokenizer(eos_ids=eos_ids, bos_id=bos_id, chat_template=template)
    if kind == "bpe":
        vocab = _field(config, "vocab_size", "vocab_size")
        return BpeTokenizer(model_dir / "tokenizer.json", eos_ids, bos_id, template, vocab_size=vocab)
    raise ConfigError(f"tl_tokenizer must be 'byte' or 'bpe', got {kind!r}")


def _field(config: Any, attr: str, key: str):
    """A ModelConfig attribute, or a config.json key."""
    if isinstance(config, dict):
        return config.get(key)
    return getattr(config, attr, None)


# A chat template is data from a model directory: its rendering is bounded like any other input, in
# steps, wall time, the size of every value it makes and of its output (section 2.3; issue 20: a
# sandbox alone let `"a".ljust(10**9)` take 4 GB and three nested loops run for hours).
MAX_TEMPLATE_STEPS = 2_000_000  # lines of template code per render (SmolLM2's runs about a hundred)
MAX_TEMPLATE_ITEMS = 10_000_000  # characters or items in any value a template makes, and in its output
MAX_TEMPLATE_SECONDS = 1.0  # wall time of one render (SmolLM2's takes well under a millisecond)
MAX_TEMPLATE_NUMBER = 100_000  # an integer argument of a call or filter: a width, a count (= range's cap)
MAX_LIPSUM_WORDS = 10_000  # lipsum(n, max=...): n paragraphs of up to max words


def _check_messages(messages, add_generation_prompt) -> None:
    """ValueError naming what is wrong with a chat's messages, before the template runs: inside it a
    message without "content" (or a str for the list) is the template's UndefinedError, reported as a
    broken config.json, and add_generation_prompt="no" is true to Jinja."""
    if not isinstance(messages, (list, tuple)):
        raise ValueError(f"messages must be a list of {{'role': ..., 'content': ...}} dicts, got {type(messages).__name__}")
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise ValueError(f"messages[{i}] must be a dict with 'role' and 'content', got {type(m).__name__}")
        for key in ("role", "content"):
            if not isinstance(m.get(key), str):
                raise ValueError(f"messages[{i}]['{key}'] must be a str, got {type(m.get(key)).__name__}")
    if not isinstance(add_generation_prompt, bool):
        raise ValueError(f"add_generation_prompt must be True or False, got {add_generation_prompt!r}")


def render_chat_template(
    template: str,
    messages: Sequence[dict],
    *,
    add_generation_prompt: bool = True,
    special_tokens: dict[str, str | None] | None = None,
) -> str:
    """Render a Hugging Face chat template the way transformers does.

    transformers uses a sandboxed Jinja environment with trim_blocks and lstrip_blocks, the
    loopcontrols extension, a tojson filter and a raise_exception() helper; the special tokens
    (bos_token, eos_token, ...) are variables. A template that does not parse, raises or fails is
    refused with ConfigError naming the reason, and so is one that runs past MAX_TEMPLATE_STEPS or
    MAX_TEMPLATE_SECONDS, passes a call or filter an integer over MAX_TEMPLATE_NUMBER, or makes a
    value or an output of more than MAX_TEMPLATE_ITEMS characters or items (see `_jinja_env`).
    """
    env = _jinja_env()
    variables = dict(special_tokens or {})
    variables.update(messages=list(messages), add_generation_prompt=add_generation_prompt)
    try:
        with _step_budget(MAX_TEMPLATE_STEPS, MAX_TEMPLATE_SECONDS):
            compiled = env.from_string(template)  # inside the budget: Jinja folds constants as it compiles
            return _bounded_join(compiled.generate(**variables))
    except Exception as exc:  # noqa: BLE001: anything a template does wrong is the template's fault
        line = getattr(exc, "lineno", None)
        where = f" (line {line})" if line else ""
        raise ConfigError(
            f"the chat template (config.json tl_chat_template) failed{where}: {type(exc).__name__}: "
            f"{str(exc)[:300]}"
        ) from None


def _bounded_join(pieces: Iterable[str]) -> str:
    """The rendered text, refused once it passes MAX_TEMPLATE_ITEMS characters (a loop can print a
    modest string a hundred thousand times)."""
    from jinja2.exceptions import TemplateRuntimeError

    out, n = [], 0
    for piece in pieces:
        n += len(piece)
        if n > MAX_TEMPLATE_ITEMS:
            raise TemplateRuntimeError(f"the output would be more than {MAX_TEMPLATE_ITEMS:,} characters")
        out.append(piece)
    return "".join(out)


_TEMPLATE_FILE = "<template>"  # the file name Jinja gives the code of a template made from a string


@contextlib.contextmanager
def _step_budget(limit: int, seconds: float):
    """Count the lines of compiled template code executed inside the block and watch the clock at
    every line and every Python call (lipsum, a filter, the compiler); past either bound, raise in
    the template. A tracer, because a template loop that emits nothing calls nothing the sandbox sees."""
    from jinja2.exceptions import TemplateRuntimeError

    left, deadline = limit, time.monotonic() + seconds

    def late() -> None:
        if time.monotonic() > deadline:
            raise TemplateRuntimeError(f"the template ran longer than {seconds:g} s (a runaway loop?)")

    def count(frame, event, arg):
        nonlocal left
        if event == "line":
            left -= 1
            if left < 0:
                raise TemplateRuntimeError(f"the template ran more than {limit:,} steps (a runaway loop?)")
            late()
        return count

    def enter(frame, event, arg):
        late()
        return count if frame.f_code.co_filename == _TEMPLATE_FILE else None

    previous = sys.gettrace()
    sys.settrace(enter)
    try:
        yield
    finally:
        sys.settrace(previous)


_ENV = None


def _jinja_env():
    global _ENV
    if _ENV is None:
        from jinja2.exceptions import TemplateError, TemplateRuntimeError
        from jinja2.sandbox import ImmutableSandboxedEnvironment
        from jinja2.utils import Namespace, generate_lorem_ipsum

        def refuse(what: str):
            raise TemplateRuntimeError(f"{what} would make more than {MAX_TEMPLATE_ITEMS:,} items")

        class BoundedEnvironment(ImmutableSandboxedEnvironment):
            """The sandbox, with every operator, call and filter bounded in what it may make."""

            intercepted_binops = frozenset(["*", "**", "+", "%"])  # also stops Jinja folding them at compile

            def call_binop(self, context, operator, left, right):
                if _binop_size(operator, left, right) > MAX_TEMPLATE_ITEMS:
                    refuse(f"{operator!r} on {type(left).__name__} and {type(right).__name__}")
                return _checked_value(super().call_binop(context, operator, left, right), operator)

            def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805: Jinja's own signature
                _check_call(__obj, args, kwargs)
                return _checked_value(super().call(__context, __obj, *args, **kwargs), _name(__obj))

        class BoundedNamespace(Namespace):
            """namespace(): `{% set ns.s = ns.s ~ ns.s %}` in a loop is where a value grows unseen."""

            def __setitem__(self, name, value):
                Namespace.__setitem__(self, name, _checked_value(value, f"namespace attribute {name!r}"))

        def raise_exception(message):
            raise TemplateError(message)

        def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
            return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

        def lipsum(n=5, html=True, min=20, max=100):
            if as_int(n, "lipsum n") * as_int(max, "lipsum max") > MAX_LIPSUM_WORDS:
                raise TemplateRuntimeError(f"lipsum({n}, max={max}) would make more than {MAX_LIPSUM_WORDS:,} words")
            return generate_lorem_ipsum(n, html, min, max)

        env = BoundedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
        env.filters["tojson"] = tojson
        env.filters = {name: _bounded_filter(name, f) for name, f in env.filters.items()}
        env.globals.update(raise_exception=raise_exception, namespace=BoundedNamespace, lipsum=lipsum)
        _ENV = env
    return _ENV


def _name(obj) -> str:
    return getattr(obj, "__name__", type(obj).__name__)


def _bounded_filter(name: str, f):
    """Filter `name` with the same bounds as a call: its arguments checked first, its value after."""
    import functools

    skip = 1 if getattr(f, "jinja_pass_arg", None) else 0  # pass_eval_context & co: the context comes first

    @functools.wraps(f)
    def bounded(*args, **kwargs):
        _check_call(f, args[skip:], kwargs, name)
        return _checked_value(f(*args, **kwargs), f"the filter {name!r}")

    return bounded


def _check_call(f, args, kwargs, name: str | None = None) -> None:
    """Refuse a call or filter before it runs when an argument is over the bounds (an integer over
    MAX_TEMPLATE_NUMBER: a width, an indent, a count; a value over MAX_TEMPLATE_ITEMS) or when what
    it is known to make (str.replace, expandtabs, a %-format's width) would be."""
    from jinja2.exceptions import TemplateRuntimeError

    name = name or _name(f)
    values = (*args, *kwargs.values())
    for v in values:
        if isinstance(v, int) and not isinstance(v, bool) and abs(v) > MAX_TEMPLATE_NUMBER:
            raise TemplateRuntimeError(f"{name}() was given {_short(v)}, over the limit of {MAX_TEMPLATE_NUMBER:,} "
                                       "for a number a template passes")
        _checked_value(v, f"an argument of {name}()")
    owner = getattr(getattr(f, "__wrapped__", f), "__self__", None)  # the sandbox wraps str.format
    this = owner if isinstance(owner, str) else (args[0] if name in ("replace", "format", "indent") and args else None)
    rest = args if isinstance(owner, str) else args[1:]
    if isinstance(this, str) and _call_size(name, this, rest, kwargs) > MAX_TEMPLATE_ITEMS:
        raise TemplateRuntimeError(f"{name}() would make more than {MAX_TEMPLATE_ITEMS:,} characters")


def _call_size(name: str, s: str, args: tuple, kwargs: dict) -> int:
    """About how many characters str method or filter `name` makes of `s` (0: nothing to fear)."""
    if name == "replace" and len(args) >= 2 and all(isinstance(a, str) for a in args[:2]):
        old, new = args[:2]
        hits = len(s) + 1 if not old else s.count(old)
        return len(s) + hits * max(len(new) - len(old), 0)
    if name == "expandtabs":
        size = (args or [kwargs.get("tabsize", 8)])[0]
        return len(s) + s.count("\t") * (size if isinstance(size, int) else 0)
    if name == "indent":
        width = (args or [kwargs.get("width", 4)])[0]
        return len(s) + (s.count("\n") + 1) * (len(width) if isinstance(width, str) else width)
    if name in ("format", "format_map"):
        return len(s) + sum(int(w) for w in _FORMAT_WIDTH.findall(s))
    return 0


# the widths and precisions in a %-format ("%10.3f") or a str.format field ("{:>10}")
_FORMAT_WIDTH = re.compile(r"(?<=[%.:<>^=+\- #0,_])(\d+)")


def _checked_value(v, what: str):
    """v itself, unless it is a str, list, tuple or dict of more than MAX_TEMPLATE_ITEMS items."""
    from jinja2.exceptions import TemplateRuntimeError

    if isinstance(v, (str, list, tuple, dict)) and len(v) > MAX_TEMPLATE_ITEMS:
        raise TemplateRuntimeError(f"{what} made {len(v):,} items, more than {MAX_TEMPLATE_ITEMS:,}")
    return v


def _short(v: int) -> str:
    """An integer for a message: its digits, or how many there are (str() of 10**5000 raises)."""
    return str(v) if v.bit_length() < 64 else f"an integer of about {int(v.bit_length() * 0.30103)} digits"


def _binop_size(operator: str, left, right) -> int:
    """About how many items (characters, list items, bits) `left operator right` would make."""
    if operator == "*":
        for seq, n in ((left, right), (right, left)):
            if isinstance(seq, (str, list, tuple)) and isinstance(n, int):
                return len(seq) * max(n, 0)
    if operator == "**" and isinstance(left, int) and isinstance(right, int) and right > 0:
        return right * max(abs(left).bit_length(), 1)
    if operator == "+" and isinstance(left, (str, list, tuple)) and isinstance(right, (str, list, tuple)):
        return len(left) + len(right)
    if operator == "%" and isinstance(left, str):
        return len(left) + sum(int(w) for w in _FORMAT_WIDTH.findall(left))
    return 0


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte-level alphabet: each byte as a printable character (printable Latin-1 as itself)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table
