"""Write data/golden/pcg32.vectors.json and data/golden/sampler.json from tl_lab.sample.

    python tools/make_sampler_goldens.py [--out DIR]

The generator vectors come from `Pcg32`, `mix64`, `child_seed` and `stream`. The sampler cases are
12 autoregressive runs of 12 tokens each: every token is drawn by BOTH `tl_lab.sample.sample` (the plain
Python reading of docs/spec/sampling.md) and `tl_lab.ops.fast_sample.sample` (the numpy path), and the script refuses to write
anything unless the two agree on every id, every logprob bit and the generator state after each token.
All numbers are stored exactly: 64-bit values and u32 outputs as hex, floats as float.hex(), logits as
float32 bit patterns. Formats: docs/spec/pcg32.md and docs/spec/sampling.md, "Golden files".
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

import tl_lab.sample as ts
from tl_lab.ops.paths import GOLDEN_DIR
from tl_lab.ops import fast_sample

STEPS = 12
PCG32_FILE = "pcg32.vectors.json"
SAMPLER_FILE = "sampler.json"


class GoldenMismatch(RuntimeError):
    """The reference and the numpy sampler disagree: nothing is written."""


def _h64(v: int) -> str:
    return f"0x{v:016x}"


def _h32(v: int) -> str:
    return f"0x{v:08x}"


# ---------------------------------------------------------------------------------------------------
# pcg32.vectors.json

PCG_PAIRS = [  # (seed, seq)
    (42, 54),  # pcg-c-basic's pcg32-demo
    (0, 0),
    (1, 1),
    (0x853C49E6748FEA9B, 0xDA3E39CB94B95BDB),  # pcg-c-basic's PCG32_INITIALIZER constants
    ((1 << 64) - 1, (1 << 64) - 1),
    (12345, 1 << 63),
]
MIX_INPUTS = [0, 1, 2, 0x9E3779B97F4A7C15, 0xFFFFFFFFFFFFFFFF, 0x0123456789ABCDEF]
CHILD_PAIRS = [(0, 4), (0, 0), (1, 4), (42, 4), (42, 1), ((1 << 64) - 1, 4), (0xDEADBEEF, 7)]


def build_pcg32_vectors() -> dict:
    demo = ts.Pcg32(42, 54)
    out = {
        "format": "tl_lab pcg32 vectors v1",
        "spec": "docs/spec/pcg32.md",
        "demo": {"seed": _h64(42), "seq": _h64(54), "u32": [_h32(demo.next_u32()) for _ in range(6)]},
        "next_u32": [],
        "uniform_f64": [],
        "mix64": [{"in": _h64(z), "out": _h64(ts.mix64(z))} for z in MIX_INPUTS],
        "child_seed": [
            {"seed": _h64(s), "purpose": _h64(p), "child": _h64(ts.child_seed(s, p))} for s, p in CHILD_PAIRS
        ],
        "stream": [],
    }
    for seed, seq in PCG_PAIRS:
        g = ts.Pcg32(seed, seq)
        words = [_h32(g.next_u32()) for _ in range(16)]
        out["next_u32"].append({"seed": _h64(seed), "seq": _h64(seq), "u32": words, "state_after": _h64(g.state)})
        g = ts.Pcg32(seed, seq)
        us = [g.uniform_f64() for _ in range(8)]
        out["uniform_f64"].append(
            {"seed": _h64(seed), "seq": _h64(seq), "u": [u.hex() for u in us], "u_repr": [repr(u) for u in us]}
        )
    for seed, purpose in CHILD_PAIRS:
        g = ts.stream(seed, purpose)
        words = [_h32(g.next_u32()) for _ in range(8)]
        g = ts.stream(seed, purpose)
        us = [g.uniform_f64() for _ in range(4)]
        out["stream"].append(
            {"seed": _h64(seed), "purpose": _h64(purpose), "u32": words,
             "u": [u.hex() for u in us], "u_repr": [repr(u) for u in us]}
        )
    return out


# ---------------------------------------------------------------------------------------------------
# Deterministic logits tables (made with Pcg32 so they never depend on numpy's random streams)


def _normalish(g: ts.Pcg32, n: int) -> np.ndarray:
    """n values, roughly N(0, 1): a sum of three uniforms, centred and scaled."""
    u = np.array([g.uniform_f64() + g.uniform_f64() + g.uniform_f64() for _ in range(n)])
    return (u - 1.5) * 2.0


def _table(seed: int, vocab: int, n_rows: int, kind: str) -> np.ndarray:
    g = ts.Pcg32(seed, 7)
    rows = []
    for _ in range(n_rows):
        if kind == "ties":  # small integers: many equal logits
            row = np.array([float(g.next_u32() % 5) - 2.0 for _ in range(vocab)])
        elif kind == "lm":  # a broad body and a few strong candidates, like a language model
            row = _normalish(g, vocab) * 2.0
            for _ in range(max(4, vocab // 512)):
                row[g.next_u32() % vocab] += 6.0 + 10.0 * g.uniform_f64()
        else:
            row = _normalish(g, vocab) * 2.5
        rows.append(row.astype(np.float32))
    return np.stack(rows)


TABLES = {  # name -> (seed, vocab, rows, kind)
    "v8": (8, 8, 8, "normal"),
    "v16_ties": (16, 16, 16, "ties"),
    "v32": (32, 32, 32, "normal"),
    "v64": (64, 64, 64, "lm"),
    "v256": (256, 256, 4, "lm"),
    "v49152": (49152, 49152, 1, "lm"),
}

P = ts.SamplingParams
CASES = [  # name, table, params, seed, prompt
    ("greedy", "v8", P(temperature=0.0), 0, [1]),
    ("greedy_repetition_ties", "v16_ties", P(temperature=0.0, repetition_penalty=1.5), 3, [3, 5, 3]),
    ("big_top_p", "v49152", P(temperature=1.1, top_p=0.95), 0, [17, 4242, 49151]),
    ("temperature_0.7", "v32", P(temperature=0.7), 1, [0]),
    ("temperature_1.6_top_k_5", "v32", P(temperature=1.6, top_k=5), 42, [31]),
    ("top_k_ties", "v16_ties", P(top_k=3), 0xDEADBEEF, [7]),
    ("top_p_0.9", "v64", P(temperature=0.8, top_p=0.9), (1 << 64) - 1, [2, 9]),
    ("min_p_0.1", "v64", P(temperature=1.3, min_p=0.1), 7, [63]),
    ("penalties", "v32", P(repetition_penalty=1.3, presence_penalty=0.6, frequency_penalty=0.4), 11, [4, 4, 9, 20]),
    ("negative_penalties_top_p", "v16_ties",
     P(temperature=0.9, top_p=0.95, repetition_penalty=0.8, presence_penalty=-0.5, frequency_penalty=-0.25),
     12345, [1, 2]),
    ("combo_v256", "v256",
     P(temperature=0.9, top_k=40, top_p=0.95, min_p=0.05, repetition_penalty=1.1, presence_penalty=0.2,
       frequency_penalty=0.1), 2024, [5, 6, 7]),
    ("big_all_filters", "v49152",
     P(temperature=0.8, top_k=50, top_p=0.9, min_p=0.02, repetition_penalty=1.2, presence_penalty=0.3,
       frequency_penalty=0.2), 99, [1, 10, 100, 1000, 10000, 20000, 30000, 40000]),
]


def encode_row(row: np.ndarray) -> str:
    """float32 row -> 8 hex digits per value (the IEEE bit pattern, most significant digit first)."""
    return "".join(f"{b:08x}" for b in np.asarray(row, np.float32).view(np.uint32).tolist())


def decode_row(text: str) -> np.ndarray:
    bits = [int(text[i : i + 8], 16) for i in range(0, len(text), 8)]
    return np.array(bits, dtype=np.uint32).view(np.float32)


def _params_json(p: ts.SamplingParams) -> tuple[dict, dict]:
    names = ["temperature", "top_k", "top_p", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty"]
    dec = {n: getattr(p, n) for n in names}
    exact = {n: (v if n == "top_k" else float(v).hex()) for n, v in dec.items()}
    return dec, exact


def run_case(rows: np.ndarray, params, seed: int, prompt: list[int], name: str = "") -> dict:
    """12 tokens, each from both samplers; GoldenMismatch at the first disagreement."""
    rng_ref = ts.stream(seed, ts.PURPOSE_SAMPLE)
    rng_np = rng_ref.copy()
    output, logprobs = [], []
    for step in range(STEPS):
        context = prompt + output
        row = rows[context[-1] % len(rows)] if context else rows[0]
        a = ts.sample(row, params, prompt, output, rng_ref)
        b = fast_sample.sample(row, params, prompt, output, rng_np)
        if a[0] != b[0] or float(a[1]).hex() != float(b[1]).hex() or rng_ref != rng_np:
            raise GoldenMismatch(
                f"case {name!r} step {step}: reference gives {a} ({float(a[1]).hex()}), numpy gives {b} "
                f"({float(b[1]).hex()}); generator states {rng_ref!r} vs {rng_np!r}"
            )
        output.append(a[0])
        logprobs.append(a[1])
    return {"tokens": output, "logprobs": [v.hex() for v in logprobs],
            "logprobs_repr": [repr(v) for v in logprobs], "state_after": _h64(rng_ref.state)}


def build_sampler_cases() -> dict:
    tables = {name: _table(*spec) for name, spec in TABLES.items()}
    out = {
        "format": "tl_lab sampler golden v1",
        "spec": "docs/spec/sampling.md",
        "steps": STEPS,
        "purpose": ts.PURPOSE_SAMPLE,
        "row_rule": "the logits of a step are rows[last id of prompt + output so far % len(rows)]",
        "logits_encoding": "8 hex digits per float32 (its IEEE-754 bits, most significant first), id 0 first",
        "tables": {name: {"vocab": int(t.shape[1]), "rows": [encode_row(r) for r in t]} for name, t in tables.items()},
        "cases": [],
    }
    for name, table, params, seed, prompt in CASES:
        dec, exact = _params_json(params)
        result = run_case(tables[table], params, seed, list(prompt), name)
        out["cases"].append({"name": name, "table": table, "params": dec, "params_hex": exact,
                             "seed": _h64(seed), "prompt": list(prompt), **result})
    return out


def dumps(obj: dict) -> str:
    return json.dumps(obj, indent=1) + "\n"


def write(out_dir: Path) -> list[Path]:
    """Build both files in memory (every check passes first), then write them."""
    texts = {PCG32_FILE: dumps(build_pcg32_vectors()), SAMPLER_FILE: dumps(build_sampler_cases())}
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, text in texts.items():
        path = out_dir / name
        path.write_text(text, encoding="utf-8")
        paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=GOLDEN_DIR, help="output directory (default data/golden)")
    args = ap.parse_args(argv)
    try:
        paths = write(args.out)
    except GoldenMismatch as exc:
        print(f"refusing to write golden files: {exc}", file=sys.stderr)
        return 1
    for p in paths:
        print(f"wrote {p} ({p.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
