"""The forward's speed and memory, and what batch invariance costs (chapter L10.1, sections 2.4, 2.5).

    python benchmarks/bench_forward.py [--threads 1,2] [--models tiny,smollm2] [--quick]

Models: the tiny Llama (data/tiny-llama, data/tiny-llama-int4) and a model with SmolLM2-135M's
shapes (hidden 576, 30 layers, 9 heads, 3 KV heads, head_dim 64, intermediate 1536, vocabulary
49,152, tied) with random weights, written once to a temporary directory as BF16 (like the real
checkpoint) and as an int4 file (tools/make_tiny_llama_int4.py's writer, group 32).

Each (model, f32 | int4) runs in a subprocess of its own, so peak resident memory is that
configuration's alone; inside it the invariant and the plain product alternate round by round. Measured: load time; prefill tokens/s (one
512-token prompt); decode tokens/s at batch 1 and the aggregate at batch 8 (every sequence has a
64-token prompt); peak and after-load RSS; the bytes the linear weights hold resident. The
ratios rows divide the plain product's speed by the invariant one's: the cost of invariance.
Times are the best of several rounds (the machine is shared; the best is the least disturbed).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import current_rss_mb, report  # noqa: E402

from tl_lab.ops.products import PRODUCTS  # noqa: E402
from tl_lab.ops.paths import DATA_DIR, REPO_ROOT  # noqa: E402

SMOL_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "tl_arch": "llama",
    "tl_tokenizer": "bpe", "vocab_size": 49152, "hidden_size": 576, "intermediate_size": 1536,
    "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64,
    "hidden_act": "silu", "rms_norm_eps": 1e-5, "rope_theta": 100000.0, "rope_scaling": None,
    "max_position_embeddings": 8192, "tie_word_embeddings": True, "attention_bias": False,
    "mlp_bias": False, "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "bfloat16",
}
PREFILL = 512
PROMPT = 64  # tokens of context before the decode steps are timed
BATCH = 8


# ------------------------------------------------------------------ the SmolLM2-shaped checkpoint


def write_bf16_safetensors(path: Path, tensors: dict[str, np.ndarray]) -> None:
    """A safetensors file with every tensor stored as BF16 (numpy has no bfloat16 to hand the
    safetensors library, so the header is written here: u64 length, JSON, the data buffer)."""
    from tl_lab.quant import f32_to_bf16

    header, offset = {}, 0
    for name, a in tensors.items():
        n = a.size * 2
        header[name] = {"dtype": "BF16", "shape": list(a.shape), "data_offsets": [offset, offset + n]}
        offset += n
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little"))
        f.write(text)
        for a in tensors.values():
            f.write(f32_to_bf16(a).astype("<u2").tobytes())


def build_smollm2_shaped(root: Path) -> tuple[Path, Path]:
    """Write root/smol (BF16) and root/smol-int4 (int4-g32); random weights, fixed seed."""
    from tl_lab.model import ModelConfig, tensor_shapes

    f32_dir, q_dir = root / "smol", root / "smol-int4"
    f32_dir.mkdir()
    (f32_dir / "config.json").write_text(json.dumps(SMOL_CONFIG, indent=2))
    rng = np.random.default_rng(135)
    tensors = {}
    for name, shape in tensor_shapes(ModelConfig.load(f32_dir)).items():
        if len(shape) == 1:
            tensors[name] = (1 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
        else:
            std = 0.5 if "embed" in name else shape[1] ** -0.5
            tensors[name] = (rng.standard_normal(shape, dtype=np.float32) * np.float32(std))
    write_bf16_safetensors(f32_dir / "model.safetensors", tensors)
    del tensors
    spec = importlib.util.spec_from_file_location("mk_int4", REPO_ROOT / "tools" / "make_tiny_llama_int4.py")
    mk = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mk)
    mk.build(q_dir, f32_dir, 32)
    return f32_dir, q_dir


# ------------------------------------------------------------------ one configuration (child)


def peak_rss_mb() -> float:
    """Peak RSS of this process, MiB, from /proc/self/status VmHWM. (getrusage's ru_maxrss is kept
    across exec on Linux, so a child would report its parent's peak; VmHWM starts afresh.)"""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def best_times(runner, fn, rounds: int) -> dict[str, float]:
    """Seconds of the fastest of `rounds` calls of fn() per product, the products alternating
    round by round (so a burst of load on the shared machine hits both alike)."""
    best = {}
    for product in PRODUCTS:
        runner.product = product
        fn()  # warm-up
        best[product] = math.inf
    for _ in range(rounds):
        for product in PRODUCTS:
            runner.product = product
            t0 = time.perf_counter()
            fn()
            best[product] = min(best[product], time.perf_counter() - t0)
    runner.product = "invariant"
    return best


def measure(model_dir: Path, quick: bool) -> dict:
    from tl_lab.quant import QLinear
    from tl_lab.runner import EngineConfig, ForwardBatch, ForwardSeq, KvConfig, ModelRunner

    t0 = time.perf_counter()
    runner = ModelRunner.load(model_dir, EngineConfig(kv=KvConfig(n_blocks=400)))
    load_s = time.perf_counter() - t0
    rss_loaded = current_rss_mb()
    c, pool, Bt = runner.config, runner.pool, runner.block_tokens
    lins = [l for layer in runner.weights.layers for l in layer.linears().values()]
    lin_bytes = sum(l.nbytes for l in lins)
    lin_f32 = sum(l.out * l.inp * 4 for l in lins)
    q = isinstance(lins[0], QLinear)
    rounds = 2 if (q or quick) else 5
    steps = 2 if (q or quick) else 4
    rng = np.random.default_rng(0)

    blocks = pool.alloc(PREFILL // Bt)
    toks = rng.integers(0, c.vocab_size, PREFILL).tolist()
    prefill = best_times(runner, lambda: runner.forward(ForwardBatch([ForwardSeq(toks, 0, blocks)])), rounds)
    for b in blocks:
        pool.release(b)

    def decode(batch: int) -> dict[str, float]:
        total = PROMPT + steps * (2 * rounds + 2) + 1
        seqs = []
        for _ in range(batch):
            bl = pool.alloc(-(-total // Bt))
            p = rng.integers(0, c.vocab_size, PROMPT).tolist()
            runner.forward(ForwardBatch([ForwardSeq(p, 0, bl)]))
            seqs.append([bl, PROMPT])

        def run_steps():
            for _ in range(steps):
                runner.forward(ForwardBatch([ForwardSeq([int(rng.integers(0, c.vocab_size))], pos, bl)
                                             for bl, pos in seqs]))
                for s in seqs:
                    s[1] += 1

        best = best_times(runner, run_steps, rounds)
        for bl, _ in seqs:
            for b in bl:
                pool.release(b)
        return {p: batch * steps / t for p, t in best.items()}

    b1, b8 = decode(1), decode(BATCH)
    common = {
        "load_s": load_s,
        "linear_MB": lin_bytes / 2**20,
        "linear_vs_f32": lin_bytes / lin_f32,
        "rss_loaded_MB": rss_loaded,
        "peak_rss_MB": peak_rss_mb(),
    }
    return {p: {"prefill_tok_s": PREFILL / prefill[p], "decode_b1_tok_s": b1[p],
                "decode_b8_tok_s": b8[p], **common} for p in PRODUCTS}


# ------------------------------------------------------------------ the driver


def run_child(model_dir: Path, threads: int | None, quick: bool) -> dict:
    cmd = [sys.executable, __file__, "--one", str(model_dir)]
    if threads:
        cmd += ["--threads", str(threads)]
    if quick:
        cmd.append("--quick")
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="tiny,smollm2")
    ap.add_argument("--threads", default="1,2",
                    help="BLAS thread counts to run, comma-separated (0: OpenBLAS's own default)")
    ap.add_argument("--quick", action="store_true", help="fewer rounds")
    ap.add_argument("--one", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:
        args.threads = int(args.threads)
        if args.threads:
            from tl_lab.ops.tuning import set_blas_threads

            set_blas_threads(args.threads)
        print(json.dumps(measure(args.one, args.quick)))
        return

    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_forward_") as tmp:
        dirs = {}
        if "tiny" in args.models:
            dirs["tiny"] = (DATA_DIR / "tiny-llama", DATA_DIR / "tiny-llama-int4")
        if "smollm2" in args.models:
            dirs["smollm2-shape"] = build_smollm2_shaped(Path(tmp))
        for threads in [int(t) for t in args.threads.split(",")]:
            for model, (f32_dir, q_dir) in dirs.items():
                for weights, d in (("f32", f32_dir), ("int4", q_dir)):
                    res = run_child(d, threads, args.quick)
                    print(f"{model} {weights} threads {threads}: {res}", file=sys.stderr, flush=True)
                    tag = {"threads": threads or "default", "model": model, "weights": weights}
                    for product in PRODUCTS:
                        rows.append({**tag, "product": product, **res[product]})
                    inv, plain = res["invariant"], res["plain"]
                    rows.append({
                        **tag, "product": "plain/invariant",
                        **{k: plain[k] / inv[k] for k in ("prefill_tok_s", "decode_b1_tok_s", "decode_b8_tok_s")},
                        "b8_vs_b1": inv["decode_b8_tok_s"] / inv["decode_b1_tok_s"],
                    })
    notes = (f"prefill: one {PREFILL}-token prompt; decode: {PROMPT}-token prompts, batch 1 and "
             f"{BATCH}; BLAS threads per row (2 = all cores of the machine, shared with other work); plain/invariant rows: speed of the "
             f"plain x @ W.T forward over the invariant one (1.0 = invariance is free); b8_vs_b1: "
             f"aggregate batch-8 decode over batch-1 decode, invariant product")
    report("forward", rows, notes)


if __name__ == "__main__":
    main()
