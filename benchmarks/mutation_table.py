"""docs/dev/mutation.md's mutation-testing table, rendered from results/mutation.json.

    python benchmarks/mutation_table.py            # print it
    python benchmarks/mutation_table.py --write    # put it into docs/dev/mutation.md, between its two markers

Each row is one sample of a module's mutants (`tools/mutation.py`, seeded): killed of tried when it
was first run, and again after the tests written for its survivors. `SHOWN` chooses which runs a
row pairs (a module may have had several samples, and reruns of the same one); every figure is read
from the results file, so the page cannot drift from the runs (tests/test_mutation_table.py holds
it to them).
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from pathlib import Path

from table import RESULTS, write_readme

PAGE = Path(__file__).resolve().parent.parent / "docs" / "dev" / "mutation.md"

MUTATION = RESULTS / "mutation.json"
BEGIN = "<!-- mutation table: written by `python benchmarks/mutation_table.py --write` from results/mutation.json -->"
END = "<!-- end of the mutation table -->"

S53 = ("s53-review", "s53-review-after", "a new 40 after the review of 2026-12-06")
S54 = ("s54", "s54-after", "a new 40 after the changes of 2026-12-07")
S55 = ("s55", "s55-after", "a new 40 (seed 21) after the changes of 2026-12-07, second session")
"""The runs of the modules a change touched (S53: the review of 2026-12-06; S54, S55: the changes of
2026-12-07), and the rows' note."""

RETIRED = {"sample_reference": "the plain-loop sampler, since 2026-12-07 the learner's tl_lab/sample.py itself"}
"""Modules measured once that no longer exist under that name: their rows stay, as history."""

GROUPS = [
    # (module, what it is, then a run pair per row of the table: (the first run's label or None for a single
    # run, the last run's label, a note))
    ("kv", "the paged KV cache", ("before", "after", "")),
    ("quant", "f16, bf16 and int4", ("s43-fork-safe", "s48-whole2-after-rerun", "")),
    ("model", "the model and its safetensors", ("wide-before", "wide-after", ""), S53),
    ("forward", "the Llama forward", ("s43-forward", "s43-forward-rerun", "")),
    ("runner", "the runner", ("s43-fork-safe", "s43-fork-safe-rerun", "")),
    ("sample", "the sampler", ("after-2", "after-2-rerun", "")),
    ("generate", "the engine loop", ("s43-fork-safe", "s43-fork-safe-rerun", ""), S54, S55),
    ("tokenizer", "the tokenizer", ("after", "after-rerun", ""), S53, S54, S55),
    ("blocks", "the block manager", ("before", "after", ""),
     (None, "wide-before", "every mutant")),
    ("fetch", "the download and the converter", ("wide-before", "wide-after", "")),
    ("products", "the numpy products", ("s43-new-modules", "s48-after", "after: a new 40 (seed 20, the first 21)")),
    ("q8", "the int8 head", ("s43-new-modules", "s43-new-modules-rerun2", "")),
    ("compare", "the comparisons", ("s43-new-modules", "s48-after", "after: a new 40 (seed 20, the first 21)")),
    ("machine", "the machine's description", ("s43-new-modules", "s43-new-modules-after-rerun", ""),
     ("s46-cores", "s46-cores-rerun", "a second sample, after the count of cores moved there"),
     ("s56", "s56-after", "a new 30 (seed 22) after the FMA peak (`fma_gflops`) and `_best_seconds` came in")),
    ("tuning", "the process tuning",
     ("s43-new-modules", "s43-new-modules-after-rerun",
      "the first run's 9 tried of 40: under GNU OpenMP a forked run hung at its first parallel kernel; the runs "
      "since are on numba's fork-safe workqueue layer"),
     ("s49-tuning", "s49-tuning-after",
      "all of it again, after `blas_core` (the benchmarks' check of OpenBLAS's kernels); the 2 left are equivalent")),
    ("pipeline", "the pipelined prefill",
     ("s44-new-modules", "s44-new-modules-rerun",
      "on numba's TBB layer (`pip install 'tbb<2023'`): two Python threads launch kernels")),
    ("fp8", "the fp8 numbers", ("s44-new-modules", "s44-new-modules-rerun", "")),
    ("widening", "the load's widening", ("s44-new-modules", "s44-new-modules-rerun", "")),
    ("checks", "the argument checks", ("s44-new-modules", "s44-new-modules-rerun", ""), S53),
    ("sample_reference", "the reference sampler", ("s44-more-modules", "s44-more-modules-rerun", "")),
    ("schema", "config.json's schema", ("s44-more-modules", "s44-more-modules-rerun", ""), S53),
    ("lazy_kernels", "the kernels' entry points", ("s44-lazy-all", "s44-lazy-all-rerun", "every mutant")),
    ("paths", "the file paths", ("s46-paths-errors", "s46-paths-errors-rerun", "every mutant")),
    ("errors", "the refusals' clipped messages", ("s46-paths-errors", "s46-paths-errors-rerun", "every mutant")),
    ("switch", "the pitfalls' import hook", ("s46-switch", "s46-switch-after", "every mutant"), S54),
    ("pitfalls", "the pitfalls and the lab's probes",
     ("s47-pitfalls", "s48-whole2-after", "the probes had run only in subprocesses")),
    ("widgets.common", "what the widgets share",
     ("s46-widgets", "s48-after-rerun",
      "after: a new 40 (seed 20, the first 46), with the sampler widgets' tests, its charts' users"), S53),
    ("widgets.blockmap", "the block map", ("s46-widgets", "s46-widgets-after-rerun", "a second sample")),
    ("widgets.int4", "the int4 widget", ("s46-widgets", "s48-whole2-after-rerun", ""), S53),
    ("widgets.numbers", "the numbers widget", ("s46-widgets", "s46-widgets-rerun2", "")),
    ("widgets.checkpoint", "the checkpoint's map", ("s47-widgets", "s47-widgets-rerun", "")),
    ("widgets.enginesteps", "the engine's steps", ("s47-widgets", "s47-widgets-rerun", "")),
    ("widgets.exercise", "the exercise's check panel", ("s47-widgets", "s47-widgets-rerun", "")),
    ("widgets.pitfalls", "the pitfall lab",
     ("s47-widgets", "s47-widgets-after-rerun", "the pictures had been drawn by no test")),
    ("widgets.sampler_charts", "the sampler's charts", ("s47-widgets", "s47-widgets-rerun2", "at one kernel thread")),
    ("widgets.sampler_playground", "the sampler's playground",
     ("s47-widgets", "s48-whole2-after-rerun", "at one kernel thread"), S53),
    ("widgets.model_playground", "the playground on a model",
     ("s47-widgets", "s48-whole2-after-rerun", "at one kernel thread: workqueue aborts its pipelined prefill at two")),
    ("exercise.stubs", "the exercise's stubs", ("s47-exercise", "s47-exercise-rerun", "")),
    ("exercise.workspace", "the exercise's workspace",
     ("s47-exercise", "s48-after-rerun", "its import hook had run only in processes of their own")),
    ("exercise.registry", "the exercise's catalogue",
     ("s47-exercise", "s48-after",
      "17 survivors are in the rows built at import, which a forked run cannot reach (killed in a fresh process)")),
    ("exercise.cli", "the exercise's command line",
     ("s48-exercise", "s48-exercise-after2", "its commands had been run only as processes of their own")),
    ("exercise.grading", "the exercise's grading",
     ("s48-exercise", "s48-exercise-after2", "untried: `_run` and `_env`, which start the graded pytest process"), S53),
    ("exercise.gradebook", "the instructors' gradebook",
     ("s55", "s55-after",
      "after: a new 40 (seed 21) of the module as changed (grade's ref_deps no longer defaulted); the first run's "
      "survivors were killed or are equivalent (the gradebook's encoding and newline, check's default)")),
    ("exercise.guard", "the notebooks' guard",
     ("s48-exercise", "s48-exercise-after2",
      "untried: `_one_trial`, which starts the trial process; the survivors are the trials' inputs (equivalent)")),
    ("exercise.parity", "the exercise's parity", ("s48-exercise", "s48-exercise-after2", ""), S53),
    ("exercise.plugin", "the graded runs' pytest plugin",
     ("s48-exercise", "s48-exercise-after2", "its hooks had run only inside the graded pytest processes"), S53),
    ("exercise.side", "yours beside the reference",
     ("s48-exercise", "s48-exercise-after2",
      "untried: `reference_against_hf`, which starts a process; a bug found and mended (the learner's line)")),
    ("kernels (hand-written)", "the compiled kernels' hand-written mutants",
     (None, "s42-all-kernels", "all on one commit; the survivor leaves out a prefetch, which changes only the speed"),
     (None, "s50-kernels", "the two written for attention's keys transposed straight from the pool")),
]
"""Each module once, with the runs its rows pair."""

SHOWN = [(module, what, *run) for module, what, *runs in GROUPS for run in runs]
"""The rows of the table, in the chapter's order, then the tooling around it."""


def _run(doc: dict, label: str, module: str) -> dict:
    try:
        return doc["results"][label][module]
    except KeyError:
        raise SystemExit(f"{MUTATION.name}: no run {label!r} of {module!r} (SHOWN names it)") from None


def _drawn(r: dict) -> int:
    """The mutants a whole run of a sample drew: tried, reached by no test, or not run (the budget)."""
    return r["tried"] + (r.get("no_tests") or 0) + (r.get("not_run") or 0) + (r.get("other") or 0)


def _score(r: dict, drawn: int) -> str:
    """killed/tried, and how many of the sample's `drawn` mutants were not tried, if any."""
    untried = drawn - r["tried"]
    return f"{r['killed']}/{r['tried']}" + (f" ({untried} untried)" if untried else "")


def _sample(r: dict, drawn: int) -> str:
    """How many mutants the sample drew, of how many in the module ("hand-written" for the kernels')."""
    inside = r.get("mutants_in_module")
    if inside is None:
        return f"{drawn} hand-written"
    return f"all {inside}" if drawn >= inside else f"{drawn} of {inside}"


def table(doc: dict) -> str:
    head = ["| module | what | sample | first run | after the tests for its survivors | note |",
            "|---|---|---|---|---|---|"]
    rows = []
    for module, what, first, last, note in SHOWN:
        after = _run(doc, last, module)
        whole = after if first is None else _run(doc, first, module)  # a whole run of the sample
        drawn = _drawn(whole)
        before = "(one run)" if first is None else _score(whole, drawn)
        rows.append(f"| `{module}` | {what} | {_sample(whole, drawn)} | {before} | {_score(after, drawn)} | {note} |")
    return "\n".join(head + rows)


def section(doc: dict) -> str:
    lead = ("Killed of tried (mutmut 3.8.1, a seeded sample per module, each module mutated alone under its own "
            "tests; `tools/mutation.py` says how), when first run and after the tests written for its survivors. "
            "Untried: mutants of the sample that no test reached, or that a rerun of only the survivors left out:")
    tail = (f"Every survivor left is in `benchmarks/results/mutation.json` with why: {len(doc['equivalent'])} "
            "equivalent mutants, and those killed only outside the module's own tests.")
    wrap = textwrap.TextWrapper(width=110, break_on_hyphens=False)
    return "\n\n".join([BEGIN, wrap.fill(lead), table(doc), wrap.fill(tail), END])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--write", action="store_true", help="write the table into docs/dev/mutation.md")
    text = section(json.loads(MUTATION.read_text()))
    if ap.parse_args(argv).write:
        write_readme(text, BEGIN, END, PAGE)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
