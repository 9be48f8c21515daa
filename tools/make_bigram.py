"""Make data/bigram: the byte bigram of L10.0, counted from data/corpus/bigram.txt.

    python tools/make_bigram.py [--out DIR] [--corpus FILE]

logits[a, b] = log((count(a, b) + 1) / (count(a, .) + 256)): add-one smoothed log-probabilities
of byte b following byte a, as float32. The corpus is written so that greedy decoding from "a"
continues "bcd" (tests/test_tools_checkpoints.py checks the chain and that this script
reproduces the committed files byte for byte).

Token ids: the byte tokenizer, id = byte value. bos_token_id 2 (ASCII STX, "start of text") and
eos_token_id 3 (ETX, "end of text"): control bytes that never occur in text, so the bigram never
chooses them greedily.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from tl_lab.ops.paths import DATA_DIR

V = 256
CONFIG = {
    "tl_arch": "bigram",
    "tl_tokenizer": "byte",
    "vocab_size": V,
    "max_position_embeddings": 2048,
    "bos_token_id": 2,
    "eos_token_id": 3,
}


def bigram_logits(text: bytes) -> np.ndarray:
    """(256, 256) float32: row a holds log P(next byte | a), add-one smoothed."""
    counts = np.zeros((V, V), dtype=np.float64)
    a = np.frombuffer(text, dtype=np.uint8)
    np.add.at(counts, (a[:-1], a[1:]), 1.0)
    smoothed = counts + 1.0
    return np.log(smoothed / smoothed.sum(axis=1, keepdims=True)).astype(np.float32)


def build(out: Path, corpus: Path = DATA_DIR / "corpus" / "bigram.txt") -> None:
    """Write out/config.json and out/model.safetensors."""
    out.mkdir(parents=True, exist_ok=True)
    logits = bigram_logits(corpus.read_bytes())
    (out / "config.json").write_text(json.dumps(CONFIG, indent=2) + "\n")
    # One metadata key: the library writes metadata in hash-map order, so two keys could swap
    # places between runs and the file would not be reproducible byte for byte.
    save_file({"bigram.logits": logits}, str(out / "model.safetensors"),
              metadata={"made_by": f"tools/make_bigram.py from {corpus.name}"})


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DATA_DIR / "bigram")
    ap.add_argument("--corpus", type=Path, default=DATA_DIR / "corpus" / "bigram.txt")
    args = ap.parse_args(argv)
    build(args.out, args.corpus)
    print(f"wrote {args.out}/config.json and {args.out}/model.safetensors")


if __name__ == "__main__":
    main()
