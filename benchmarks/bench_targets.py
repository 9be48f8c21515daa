"""The kernels compiled for other processors' targets, on this machine: is the code another machine
gets as fast as the code this one gets? Chapter L10.1, section 2.4.

    python benchmarks/bench_targets.py [--targets native,rocketlake,skylake-avx512,haswell] [--repeat 2]

numba compiles for the host's CPU name unless NUMBA_CPU_NAME names another; each target here runs in
a process of its own with a numba cache of its own (NUMBA_CACHE_DIR in a temporary folder), the
host's features unchanged, so only the CPU name's tuning differs: `rocketlake` is what numba's LLVM
called processor B, `skylake-avx512` an older AVX-512 Xeon, `haswell` an AVX2 machine's tuning (the
AVX-512 features stay on). "haswell (AVX2 only)" also turns the features down to AVX2, the code an
AVX2-only processor gets. Measured in each, on 1 thread, CPU time (the host is shared), best of
rounds and of --repeat runs interleaved: SmolLM2's 30 layers' products for one row (f32: the
weights read from memory; int4 g32), its int8 LM head (49152 x 576, groups of 32) for one row, the
30 layers' f32 products for 8 rows (a batch of 8 decodes, `matmul8_f32`), and a 512-row prefill (f32),
over random weights of the real shapes. Writes results/targets.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import report  # noqa: E402
from tl_lab.ops.machine import AVX2_ONLY  # noqa: E402

SHAPES = [(1152, 576), (576, 576), (3072, 576), (576, 1536)]  # (N, K): stacked q/k/v, o, gate/up, down


def measure(rounds: int) -> dict:
    import numba
    import numpy as np

    from tl_lab.ops.kernels import aligned_zeros, product_f32, product_q4, product_q8
    from tl_lab.ops.q8 import Q8Linear
    from tl_lab.quant import _F16_TABLE, QLinear

    numba.set_num_threads(1)
    rng = np.random.default_rng(0)

    def weight(N, K):
        w = aligned_zeros((N, K))  # the runner's weights start on a cache line (its arena)
        w[:] = rng.standard_normal((N, K), dtype=np.float32) * 0.02
        return w

    f32 = [weight(N, K) for _ in range(30) for N, K in SHAPES]
    q4 = [QLinear.quantize(f32[i], 32) for i in range(0, len(f32))]
    head = Q8Linear.quantize(rng.standard_normal((49152, 576), dtype=np.float32) * 0.02, group=32)
    one = {K: rng.standard_normal((1, K), dtype=np.float32) for K in (576, 1536)}
    eight = {K: rng.standard_normal((8, K), dtype=np.float32) for K in (576, 1536)}
    many = {K: rng.standard_normal((512, K), dtype=np.float32) for K in (576, 1536)}
    tests = {
        "f32 one row, ms": lambda: [product_f32(one[w.shape[1]], w) for w in f32],
        "int4 one row, ms": lambda: [product_q4(one[q.inp], q.planar, q.scales, _F16_TABLE) for q in q4],
        "int8 head one row, ms": lambda: product_q8(one[576], head.q, head.scales, _F16_TABLE),
        "f32 8 rows, ms": lambda: [product_f32(eight[w.shape[1]], w) for w in f32],
        "f32 512 rows (one layer), ms": lambda: [product_f32(many[w.shape[1]], w) for w in f32[:4]],
    }
    best = {}
    for fn in tests.values():
        fn()
    for _ in range(rounds):
        for name, fn in tests.items():
            t0 = time.process_time()
            fn()
            best[name] = min(best.get(name, 1e9), 1e3 * (time.process_time() - t0))
    from llvmlite import binding

    best["compiled for"] = numba.config.CPU_NAME or binding.get_host_cpu_name()
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--targets", default="native,rocketlake,skylake-avx512,haswell,haswell (AVX2 only)")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(measure(args.rounds)))
        return
    targets = args.targets.split(",")
    runs: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(args.repeat):
            for t in targets:
                env = {**os.environ, "NUMBA_CACHE_DIR": str(Path(tmp) / t.replace(" ", "_"))}
                name = t.split(" ")[0]
                if name != "native":
                    env["NUMBA_CPU_NAME"] = name
                if "AVX2 only" in t:
                    env["NUMBA_CPU_FEATURES"] = AVX2_ONLY["NUMBA_CPU_FEATURES"]
                p = subprocess.run([sys.executable, __file__, "--one", "--rounds", str(args.rounds)], env=env,
                                   capture_output=True, text=True, check=False)
                if p.returncode != 0:
                    raise SystemExit(f"target {t} failed:\n{p.stderr[-3000:]}")
                res = json.loads(p.stdout.strip().splitlines()[-1])
                print(f"{t}, run {k + 1}: {res}", file=sys.stderr, flush=True)
                runs.setdefault(t, []).append(res)
    rows = []
    for t, rs in runs.items():
        row = {"target": t, "compiled for": rs[0]["compiled for"]}
        row.update({key: min(r[key] for r in rs) for key in rs[0] if key != "compiled for"})
        rows.append(row)
    base = rows[0]
    for row in rows:
        for key in [k for k in base if k.endswith("ms")]:
            row[key.replace(", ms", " / native")] = row[key] / base[key]
    report("targets", rows, notes="1 thread, CPU time, best of rounds and runs; '/ native' above 1: slower than the "
                                  "code compiled for this host's own CPU name")


if __name__ == "__main__":
    main()
