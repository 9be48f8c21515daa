"""docs/speed.md's SmolLM2 speed table and issue 21's goals, rendered from the results files.

    python benchmarks/table.py            # print them
    python benchmarks/table.py --write    # put them into docs/speed.md, between its two markers

A column is a processor's last run of `bench_smollm2.py --threads 1,2`
(results/machines/smollm2.<LLVM CPU name>.json), newest first, then the last run held to another
processor's instructions on each host (`--as avx2`: smollm2-as-avx2.<LLVM CPU name>.json, named for
the processor whose code it runs and the host it ran on); every figure in it, and every goal
said to be missed under it, is read or divided out of that file, so the page cannot drift from
the runs (tests/test_bench_table.py holds it to them).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
PAGE = Path(__file__).resolve().parent.parent / "docs" / "speed.md"
BEGIN = "<!-- speed table: written by `python benchmarks/table.py --write` from results/machines/ -->"
END = "<!-- end of the speed table -->"

LETTERS = {"rocketlake": "A", "emeraldrapids": "B", "znver5": "C", "znver3": "D", "znver4": "E"}
"""The names the project's notes (docs/speed.md) give the processors its machines have landed on;
a processor not among them is called by its LLVM name."""

HELD_AS = {"avx2": "D"}
"""The processor whose instructions a held run (`bench_smollm2.py --as`) is held to."""

DISTURBED = 0.8
"""A default-count batch 1 slower than this share of the one-thread run's was disturbed: the
default count may choose one thread (the ALONE plan), never a slower plan than that, so such a run
measured the host, not the engine, and the figures that divide by it are shown as void."""


class Run:
    """One processor's last run: its rows by (engine, weights, threads), its machine and limits."""

    def __init__(self, doc: dict):
        self.machine, self.limits = doc["machine"], doc["roofline"]
        self.rows = {(r["engine"], r["weights"], r["threads"]): r for r in doc["rows"]}

    def row(self, engine: str, weights: str, threads) -> dict:
        return self.rows.get((engine, weights, threads), {})

    @property
    def cpu(self) -> str:
        return self.machine["llvm_host_cpu"]

    @property
    def held(self) -> str | None:
        """The instructions the run was held to (`bench_smollm2.py --as`), None for the host's own."""
        return self.machine.get("held_to")

    @property
    def name(self) -> str:
        host = LETTERS.get(self.cpu, self.cpu)
        return f"{HELD_AS.get(self.held, self.held)}'s code on {host}" if self.held else host

    def b8_over_b1(self, weights: str, threads) -> float:
        """Batch 8's aggregate over batch 1 (the older runs did not record it; it is the same division)."""
        r = self.row("tl_lab", weights, threads)
        return r.get("decode_b8 / b1", r["decode_b8_tok_s"] / r["decode_b1_tok_s"])

    def quiet_is_void(self) -> bool:
        quiet = self.row("tl_lab", "f32, quiet", "default")["decode_b1_tok_s"]
        return quiet < DISTURBED * self.row("tl_lab", "f32", 1)["decode_b1_tok_s"]


def load_runs(folder: Path = RESULTS / "machines") -> list[Run]:
    """The host runs, newest first, then the held runs, newest first."""
    paths = [*folder.glob("smollm2.*.json"), *folder.glob("smollm2-as-*.json")]
    runs = sorted((Run(json.loads(p.read_text())) for p in paths), key=lambda r: r.machine["started"], reverse=True)
    return sorted(runs, key=lambda r: r.held is not None)


def _isa(run: Run) -> str:
    isa = run.machine["isa"]
    if run.held:
        return f"held to {run.held.upper()} only"
    if "avx512f" not in isa:
        return "AVX2 only"
    return "AVX-512, AMX" if "amx_tile" in isa else "AVX-512"


def _model(cpu_model: str) -> str:
    """"Intel(R) Xeon(R) Processor" -> "Intel Xeon"."""
    return " ".join(w for w in cpu_model.replace("(R)", "").split() if w != "Processor")


def _against(ratio: str, key: str, share: str | None = None):
    """A cell: tl_lab over its peer at 1 thread, then 2, each with f32's share of its limit."""
    def cell(run: Run) -> str:
        def at(t: int) -> str:
            x = f"{t}t {run.row(ratio, 'ratio', t)[key]:.2f}x"
            return f"{x} ({run.row('tl_lab', 'f32', t)[share]:.0%})" if share else x
        return f"{at(1)}, {at(2)}"
    return cell


def _limits(run: Run) -> str:
    bw, fl, peak = run.limits["read_GBps"], run.limits["sgemm_GFLOPs"], run.limits.get("fma_GFLOPs")
    out = f"{bw['1']:.1f} / {bw['2']:.1f} GB/s; {fl['1']['best']:.0f} / {fl['2']['best']:.0f} GFLOP/s"
    return out + (f"; {peak['1']:.0f} / {peak['2']:.0f}" if peak else "")


def _b8(run: Run, weights: str) -> str:
    ratios = " / ".join(f"{run.b8_over_b1(weights, t):.1f}x" for t in (1, 2))
    ceilings = [run.row("tl_lab", weights, t).get("decode_b8 / b1 ceiling") for t in (1, 2)]
    if None in ceilings:
        return f"{ratios} (not computed in this run)"
    return f"{ratios} ({ceilings[0]:.1f}x / {ceilings[1]:.1f}x)"


def _default(run: Run) -> str:
    if run.quiet_is_void():
        return "void: slower than 1 thread, the host busy"
    share = run.row("tl_lab", "f32, quiet", "default")["decode_b1 / bandwidth"]
    return f"{share:.0%}; {run.b8_over_b1('f32, quiet', 'default'):.1f}x"


def _busy(run: Run) -> str:
    kept = run.row("busy / quiet", "ratio", "default")["decode_b1_tok_s"]
    return "void" if run.quiet_is_void() else f"{kept:.2f}"


ROWS = (
    ("processor", lambda r: f"{_model(r.machine['cpu_model'])}, {r.cpu}, {_isa(r)}"),
    ("limits, 1t / 2t: read; sgemm; FMA peak (runs since 2026-12-07)", _limits),
    ("f32 decode batch 1 vs transformers (share of read bandwidth)",
     _against("tl_lab f32 / transformers", "decode_b1_tok_s", "decode_b1 / bandwidth")),
    ("f32 at the default thread count: batch 1's share of read bandwidth; batch 8 over batch 1", _default),
    ("int4 decode batch 1 vs llama.cpp", _against("tl_lab int4 g32 / llama.cpp", "decode_b1_tok_s")),
    ("prefill 512 vs transformers (share of sgemm)",
     _against("tl_lab f32 / transformers", "prefill_tok_s", "prefill / sgemm")),
    ("batch 8 over batch 1, f32 (1t / 2t; in brackets the most the run's limits allow)", lambda r: _b8(r, "f32")),
    ("batch 8 over batch 1, int4 (the same)", lambda r: _b8(r, "int4 g32")),
    ("batch 1 with one core busy (kept of quiet speed)", _busy),
)


def table(runs: list[Run]) -> str:
    head = [f"processor {r.name}, {r.machine['started']}" for r in runs]
    lines = ["| SmolLM2-135M | " + " | ".join(head) + " |", "|---" * (len(runs) + 1) + "|"]
    lines += [f"| {label} | " + " | ".join(cell(r) for r in runs) + " |" for label, cell in ROWS]
    return "\n".join(lines)


def _at_each(run: Run, figure, bar: float, fmt: str, note=lambda run, t: "") -> list[str]:
    """"1t 0.57x"-style entries for the thread counts whose figure falls below the bar, each followed
    by its `note`."""
    return [f"{t}t {fmt.format(figure(run, t))}{note(run, t)}" for t in (1, 2) if figure(run, t) < bar]


def _at_default(run: Run, figure, bar: float, fmt: str) -> list[str]:
    if run.quiet_is_void():
        return ["void"]
    return [fmt.format(figure(run))] if figure(run) < bar else []


def _past_the_peak(weights: str):
    """A batch-8 miss's note where the bound at the FMA peak is under 5x too: there no kernel could reach it."""
    def note(run: Run, t: int) -> str:
        peak = run.row("tl_lab", weights, t).get("decode_b8 / b1 at the FMA peak")
        return f" of at most {peak:.2f}x at the FMA peak" if peak is not None and peak < 5 else ""
    return note


GOALS = (
    ("f32 batch 1, 1.5x transformers", lambda r: _at_each(
        r, lambda r, t: r.row("tl_lab f32 / transformers", "ratio", t)["decode_b1_tok_s"], 1.5, "{:.2f}x")),
    ("f32 batch 1, 70% of the read bandwidth at the default count", lambda r: _at_default(
        r, lambda r: r.row("tl_lab", "f32, quiet", "default")["decode_b1 / bandwidth"], 0.7, "{:.1%}")),
    ("int4 batch 1, llama.cpp's speed", lambda r: _at_each(
        r, lambda r, t: r.row("tl_lab int4 g32 / llama.cpp", "ratio", t)["decode_b1_tok_s"], 1, "{:.2f}x")),
    ("prefill, transformers' speed", lambda r: _at_each(
        r, lambda r, t: r.row("tl_lab f32 / transformers", "ratio", t)["prefill_tok_s"], 1, "{:.2f}x")),
    ("prefill, 60% of sgemm", lambda r: _at_each(
        r, lambda r, t: r.row("tl_lab", "f32", t)["prefill / sgemm"], 0.6, "{:.1%}")),
    ("f32 batch 8, 5x batch 1", lambda r: _at_each(
        r, lambda r, t: r.b8_over_b1("f32", t), 5, "{:.2f}x", _past_the_peak("f32"))),
    ("int4 batch 8, 5x batch 1", lambda r: _at_each(
        r, lambda r, t: r.b8_over_b1("int4 g32", t), 5, "{:.2f}x", _past_the_peak("int4 g32"))),
    ("batch 1 beside a busy core, half its quiet speed", lambda r: _at_default(
        r, lambda r: r.row("busy / quiet", "ratio", "default")["decode_b1_tok_s"], 0.5, "{:.2f}")),
)
"""Issue 21's goals: what each asks, and the figures of a run that fall short of it."""


def misses(run: Run) -> list[str]:
    """The goals this run does not meet, each with the figures that miss."""
    return [f"{goal} ({', '.join(short)})" for goal, short in ((g, f(run)) for g, f in GOALS) if short]


def goals(runs: list[Run]) -> str:
    return "\n".join(f"- {r.name}: " + ("; ".join(misses(r)) or "every goal met") + "." for r in runs)


def section(runs: list[Run]) -> str:
    lead = "The goals of issue 21 each run misses, with the figures that miss:"
    return "\n\n".join([BEGIN, table(runs), lead, goals(runs), END])


def write_readme(text: str, begin: str = BEGIN, end: str = END, readme: Path = PAGE) -> None:
    """Replace what lies between the markers `begin` and `end` (the markers included) with `text`, in
    one write (`mutation_table.py`'s table, in docs/dev/mutation.md, has markers of its own)."""
    old = readme.read_text()
    start, stop = old.find(begin), old.find(end)
    if start < 0 or stop < start:
        raise SystemExit(f"{readme}: the markers {begin!r} and {end!r} are missing or out of order")
    tmp = readme.with_suffix(".md.tmp")
    tmp.write_text(old[:start] + text + old[stop + len(end):])
    tmp.replace(readme)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--write", action="store_true", help="write the section into docs/speed.md")
    text = section(load_runs())
    if ap.parse_args(argv).write:
        write_readme(text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
