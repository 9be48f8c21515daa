"""Loading SmolLM2-135M to f32, stage by stage: tl_lab's ModelRunner.load against transformers' from_pretrained.

    python benchmarks/bench_load.py [--threads 1,2] [--repeat 5] [--no-hf]

Chapter L10.1, section 2.3 (loading). Needs the fetched model (python -m tl_lab fetch smollm2) and, for
the transformers rows, the hf extra. Each load runs in a fresh subprocess (imports done before the clock
starts, as in bench_smollm2.py), so the numbers are those of a first load: fresh pages, the model file in
the page cache. Measured in each child: the load's seconds; for tl_lab the seconds of each stage (the
functions of `STAGES`, wrapped with a timer; "other" is the rest); the resident memory once loaded and
the peak while loading (VmHWM, which starts afresh in each process), and their ratio. The best load of
--repeat interleaved runs counts (the machine is shared: the best run is the least disturbed one); the
stage times and memory are those of that run.

The same load as bench_smollm2's tl_lab f32 row: ModelRunner.load(dir, EngineConfig(kv=KvConfig(n_blocks=160),
threads=N)); transformers: LlamaForCausalLM.from_pretrained(dir, dtype=torch.float32), torch.set_num_threads(N).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import current_rss_mb, report  # noqa: E402
from bench_smollm2 import model_dir, peak_rss_mb  # noqa: E402

# (label, module, attribute path): the functions of a load whose time is a stage of its own
STAGES = (
    ("config.json (jsonschema)", "tl_lab.model", "ModelConfig.load"),
    ("header", "tl_lab.model", "parse_layout"),
    ("name and shape checks", "tl_lab.model", "_check_names"),
    ("arena map", "tl_lab.ops.widening", "Arena.__init__"),
    ("widen + finite + page faults", "tl_lab.model", "SafeTensors.f32_into"),
    ("stacking q/k/v, gate/up", "tl_lab.model", "LlamaLayer.__post_init__"),
    ("KV pool", "tl_lab.runner", "KvPool.__init__"),
    ("thread counts", "tl_lab.runner", "set_threads"),
)


def _timed(owner, attr: str, label: str, acc: dict) -> None:
    """Replace owner.attr by a wrapper adding its seconds to acc[label]."""
    fn = getattr(owner, attr)

    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            acc[label] = acc.get(label, 0.0) + time.perf_counter() - t0

    setattr(owner, attr, wrapper)


def measure_tl(threads: int) -> dict:
    import importlib

    from tl_lab.runner import EngineConfig, KvConfig, ModelRunner

    acc: dict[str, float] = {}
    for label, module, path in STAGES:
        owner = importlib.import_module(module)
        *outer, attr = path.split(".")
        for name in outer:
            owner = getattr(owner, name)
        _timed(owner, attr, label, acc)
    d = model_dir()
    t0 = time.perf_counter()
    runner = ModelRunner.load(d, EngineConfig(kv=KvConfig(n_blocks=160), threads=threads))
    load_s = time.perf_counter() - t0
    stages = {label: acc.get(label, 0.0) for label, _, _ in STAGES}
    stages["other"] = load_s - sum(stages.values())
    return {"load_s": load_s, **_memory(runner), "stages": stages}


def measure_hf(threads: int) -> dict:
    import torch
    import transformers
    from transformers import LlamaForCausalLM

    torch.set_num_threads(threads)
    transformers.utils.logging.disable_progress_bar()
    d = model_dir()
    t0 = time.perf_counter()
    model = LlamaForCausalLM.from_pretrained(str(d), dtype=torch.float32).eval()
    return {"load_s": time.perf_counter() - t0, **_memory(model)}


def _memory(model) -> dict:
    """Resident MiB with `model` alive, the peak while loading, and their ratio."""
    loaded, peak = current_rss_mb(), peak_rss_mb()
    del model
    return {"rss_loaded_MB": loaded, "peak_load_MB": peak, "peak_over_loaded": peak / loaded}


def run_child(kind: str, threads: int) -> dict:
    cmd = [sys.executable, __file__, "--one", kind, "--threads", str(threads)]
    p = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", default="1,2", help="comma list of thread counts (default 1,2)")
    ap.add_argument("--repeat", type=int, default=5, help="runs of each configuration, interleaved; the best counts")
    ap.add_argument("--no-hf", action="store_true", help="skip the transformers rows")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    counts = [int(t) for t in args.threads.split(",")]
    if args.one:
        print(json.dumps((measure_tl if args.one == "tl" else measure_hf)(counts[0])))
        return
    kinds = [("tl_lab", "tl")] + ([] if args.no_hf else [("transformers", "hf")])
    rows, stage_rows = [], []
    for threads in counts:
        runs: dict[str, list[dict]] = {}
        for k in range(args.repeat):  # interleaved, so a burst of load on the shared machine hits one run
            for engine, kind in kinds:
                res = run_child(kind, threads)
                print(f"{engine}, {threads} threads, run {k + 1}: load {res['load_s']:.3f} s", file=sys.stderr, flush=True)
                runs.setdefault(engine, []).append(res)
        for engine, _ in kinds:
            best = min(runs[engine], key=lambda r: r["load_s"])
            rows.append({"engine": engine, "threads": threads, "load_s": best["load_s"],
                         "median_load_s": sorted(r["load_s"] for r in runs[engine])[len(runs[engine]) // 2],
                         **{k: best[k] for k in ("rss_loaded_MB", "peak_load_MB", "peak_over_loaded")}})
            if "stages" in best:
                stage_rows.append({"threads": threads, **best["stages"]})
    notes = (f"SmolLM2-135M-Instruct, BF16 file loaded to f32; best (and median) of {args.repeat} interleaved fresh "
             "processes; peak_over_loaded: VmHWM while loading / RSS once loaded. Stages: tl_lab's best run.")
    out = report("load", rows + [{"engine": "tl_lab stages (s)", **r} for r in stage_rows], notes)
    print(f"written to {out}")


if __name__ == "__main__":
    main()
