"""Make data/golden/tiny_llama_hf.json: Hugging Face's own float32 forward of data/tiny-llama.

    python tools/make_goldens.py [--model DIR] [--out FILE]     (needs the hf extra: torch, transformers)
    python tools/make_goldens.py --untied                       data/golden/tiny_llama_untied_hf.json

The reference for chapter L10.1's tests tiny_llama_logits_match_hf and tiny_llama_greedy_matches_hf.
transformers' LlamaForCausalLM loads the checkpoint in float32 (the BF16 weights widen exactly) with
the eager attention, and for each prompt (byte tokens, lengths 1 to 100, so up to 7 KV blocks of 16)
records

* logits: the last-token logits, float32 little-endian bytes in base64 (exact);
* greedy: 32 greedy tokens, each step a full forward of prompt + tokens so far, argmax with ties to
  the lowest id (the sampler's rule);
* gap: at each greedy step, HF's top logit minus its second (the tests' near-tie rule: the runner
  may pick another token only where this gap is below the f16 bound). The text was picked (among
  a few tried) so that no gap on these prompts comes below 0.09: every greedy token is compared.

`--untied` does the same for data/tiny-llama-untied (tools/make_tiny_llama.py --untied: the same
model with its own LM head) into data/golden/tiny_llama_untied_hf.json.

Deterministic: one torch thread, no sampling, no dates or versions in the file, so running it again
gives the same bytes (tests/test_tools_goldens.py re-derives the data and compares).
"""

from __future__ import annotations

import argparse
import base64
import json
from pathlib import Path

import numpy as np

from tl_lab.ops.paths import DATA_DIR, GOLDEN_DIR

MODEL_DIR = DATA_DIR / "tiny-llama"
OUT = GOLDEN_DIR / "tiny_llama_hf.json"
UNTIED_MODEL_DIR = DATA_DIR / "tiny-llama-untied"
UNTIED_OUT = GOLDEN_DIR / "tiny_llama_untied_hf.json"
GREEDY_STEPS = 32
LENGTHS = (1, 5, 17, 40, 70, 100)
_TEXT = (
    b"Once upon a time, a tiny Llama learned to read bytes. It kept its keys in blocks of sixteen "
    b"and wrote them as f16, and never forgot a position. "
)


def prompts() -> list[bytes]:
    """The prompts: the first L bytes of a fixed text, one per length in LENGTHS."""
    return [_TEXT[:L] for L in LENGTHS]


def encode_f32(a) -> str:
    """float32 array -> base64 of its little-endian bytes."""
    return base64.b64encode(np.asarray(a, dtype="<f4").tobytes()).decode("ascii")


def decode_f32(s: str) -> np.ndarray:
    """The inverse of `encode_f32`."""
    return np.frombuffer(base64.b64decode(s), dtype="<f4").astype(np.float32)


def load_hf(model_dir: Path):
    """transformers' LlamaForCausalLM of `model_dir` in float32, eager attention, eval mode."""
    import torch
    from transformers import LlamaForCausalLM

    torch.set_num_threads(1)
    model = LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager")
    return model.eval()


def last_logits(model, tokens: list[int]) -> np.ndarray:
    """HF's logits (V,) float32 for the last of `tokens`."""
    import torch

    with torch.no_grad():
        out = model(torch.tensor([tokens], dtype=torch.long))
    return out.logits[0, -1].to(torch.float32).numpy().copy()


def greedy(model, tokens: list[int], steps: int) -> tuple[list[int], list[float]]:
    """`steps` greedy tokens after `tokens`, and HF's top-1 minus top-2 logit at each step."""
    ids, out, gaps = list(tokens), [], []
    for _ in range(steps):
        z = last_logits(model, ids)
        t = int(np.argmax(z))  # first maximum: ties go to the lowest id
        second = np.max(np.delete(z, t))
        out.append(t)
        gaps.append(float(z[t] - second))
        ids.append(t)
    return out, gaps


def make(model_dir: Path = MODEL_DIR, name: str = "data/tiny-llama") -> dict:
    """The golden data as a dict (what `main` writes); name: the model as the file names it."""
    model = load_hf(Path(model_dir))
    cases = []
    for p in prompts():
        toks = list(p)
        z = last_logits(model, toks)
        g, gaps = greedy(model, toks, GREEDY_STEPS)
        cases.append({
            "prompt": p.decode("ascii"),
            "tokens": toks,
            "logits": encode_f32(z),
            "max_abs_logit": float(np.abs(z).max()),
            "greedy": g,
            "gap": gaps,
        })
    return {
        "about": "Hugging Face transformers LlamaForCausalLM, float32, eager attention, on "
                 f"{name}; logits are float32 little-endian base64; made by tools/make_goldens.py",
        "model": name,
        "greedy_steps": GREEDY_STEPS,
        "cases": cases,
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--untied", action="store_true", help="data/tiny-llama-untied into tiny_llama_untied_hf.json")
    ap.add_argument("--model", type=Path, default=None, help="model directory (default data/tiny-llama)")
    ap.add_argument("--out", type=Path, default=None, help="output JSON (default data/golden/tiny_llama_hf.json)")
    args = ap.parse_args(argv)
    default_model = UNTIED_MODEL_DIR if args.untied else MODEL_DIR
    args.model = args.model or default_model
    args.out = args.out or (UNTIED_OUT if args.untied else OUT)
    data = make(args.model, f"data/{default_model.name}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(data, indent=1) + "\n")
    for c in data["cases"]:
        print(f"{len(c['tokens']):4d} tokens  max|logit| {c['max_abs_logit']:.3f}  "
              f"min gap {min(c['gap']):.4f}  greedy {bytes(c['greedy'])!r}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
