"""Compile the engine's kernels once, before a learner waits on them (issue 59: a first run that says
what it does).

    python -m tl_lab.lab.warm          # what `bash tools/quickstart.sh lab` runs during set-up

The compiled kernels (`tl_lab.ops.kernels`, numba with cache=True) are compiled for this machine the
first time each is called, then loaded from numba's cache next to the module. Without this step the
first notebook or `generate` after set-up paid for that compile in silence (27.9 s against 1.8 s for
the first `generate` on SmolLM2, issue 59). `warm` drives the engine's paths once: a prefill, batch-1
and batch-8 decodes, f32 and int4, the sampler; then writes a stamp naming what it compiled for
(`stamp_text`: numba's version, the CPU LLVM targets, the kernels' source), so a notebook can say
whether it will still compile (`note`).
"""

from __future__ import annotations

import hashlib
import sys
import time
from pathlib import Path

ABOUT_S = 90
"""What the compile takes, said before it starts: benchmarks/bench_notebooks.py --first-run measured
`warm_s` 89 and 92 s on two busy shared cores (load 7); rounded."""

_OPS = Path(__file__).resolve().parent.parent / "ops"  # the kernels, and numba's cache beside them


def stamp_path() -> Path:
    return _OPS / "__pycache__" / "tl_lab-warm.stamp"


def stamp_text() -> str:
    """What a compile is for: numba's version, the CPU numba compiles for, and the kernels' source."""
    import numba
    from llvmlite import binding

    src = b"".join((_OPS / f).read_bytes() for f in ("kernels.py", "lanes.py"))
    return f"numba {numba.__version__}; cpu {binding.get_host_cpu_name()}; kernels {hashlib.sha256(src).hexdigest()[:16]}"


def compiled() -> bool:
    """Whether `warm` ran for this machine and these kernels (the stamp matches)."""
    try:
        return stamp_path().read_text().strip() == stamp_text()
    except OSError:
        return False


def note() -> str | None:
    """One line for a notebook's first cell when the kernels are not compiled yet, else None."""
    if compiled():
        return None
    return (f"the kernels are not compiled for this machine yet: the first steps below compile them, once "
            f"(about {ABOUT_S} s); `bash tools/quickstart.sh lab` does it during set-up")


def warm(model_dir=None) -> float:
    """Run the engine's paths once on `model_dir` (default: SmolLM2 when fetched, else the tiny Llama),
    f32 and int4, so that every kernel they call is compiled and cached; -> seconds taken."""
    from tl_lab.engine.fetch import smollm2_dir
    from tl_lab.engine.generate import Engine, Request
    from tl_lab.ops.paths import DATA_DIR
    from tl_lab.runner import EngineConfig, Int4, KvConfig
    from tl_lab.sample import SamplingParams

    t0 = time.perf_counter()
    model_dir = model_dir or smollm2_dir(quiet=True)
    dirs = [Path(model_dir)] if model_dir else []
    dirs.append(DATA_DIR / "tiny-llama")
    for d in dirs:
        for quant in (None, Int4(32)):
            engine = Engine.load(d, EngineConfig(kv=KvConfig(n_blocks=64, block_tokens=16), quant=quant))
            prompt = list(range(3, 43))  # 40 tokens: a prefill
            greedy, sampled = SamplingParams(temperature=0.0), SamplingParams(temperature=0.8, top_p=0.9)
            engine.generate([Request(prompt, greedy, 0, 3)])                                   # batch 1
            engine.generate([Request(prompt[i:], sampled, i, 3) for i in range(8)])           # batch 8
            engine.runner.run_once(list(range(3, 203)))                                       # a long prefill
    stamp_path().parent.mkdir(exist_ok=True)
    stamp_path().write_text(stamp_text() + "\n")
    return time.perf_counter() - t0


def main() -> int:
    if compiled():
        print("the kernels are already compiled for this machine")
        return 0
    print(f"compiling the kernels for this processor, once: about {ABOUT_S} s", flush=True)
    seconds = warm()
    print(f"compiled in {seconds:.0f} s; later runs load them from numba's cache")
    return 0


if __name__ == "__main__":
    sys.exit(main())
