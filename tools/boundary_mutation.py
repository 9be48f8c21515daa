"""Boundary-only mutation testing (issue 62): every comparison operator and every off-by-one of an
integer constant in a module, all of them (no sample), each run against a chosen set of test files.

    python tools/boundary_mutation.py --label before blocks kv          # the mirror tests only
    python tools/boundary_mutation.py --label after --with-boundaries blocks kv runner sample fetch generate

The mutants, found with `tokenize` (so strings, comments and docstrings are never touched):

* each comparison operator swapped with its boundary twin: `<` <-> `<=`, `>` <-> `>=`;
* each integer literal next to `+`, `-`, `//`, a comparison, or as an argument of min / max / range /
  as_int's lo / hi, moved by one each way (`n - 1` -> `n - 0` and `n - 2`; `lo=1` -> `lo=0` and `lo=2`).

Each mutant is written into a scratch copy of the tree (tl_lab/, tests/, the root files; data/ is a
link), the module's tests run there with `-x` under a time budget, and the result is killed (a test
failed), survived (all passed) or timeout. mutmut (tools/mutation.py) samples every kind of mutant;
this tool runs the one kind the boundary tests are about, exhaustively, fast enough for two shared
cores (a mutant costs one pytest process; a killed one stops at its first failure).

Results merge into benchmarks/results/mutation.json under boundary[<label>][module] (a key of its
own: tools/mutation.py's `results` hold mutmut's runs): the counts, the score, and each survivor (line,
the edit, its source line) so it can be read and closed or called equivalent (docs/dev/mutation.md says
which and why).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import subprocess
import sys
import time
import tokenize
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results" / "mutation.json"
SCRATCH = Path(os.environ.get("TL_LAB_MUTATION_DIR", "/tmp/tl_lab-boundary-mutation"))

# module -> (its mirror tests, what the boundary tests add); "-m" keeps hf and the fetched model out
# where the mirror file has them, except fetch's real-GGUF checks, which are the point of its tests.
MODULES = {
    "blocks": (["tests/test_blocks.py"], ["tests/test_blocks_boundaries.py"]),
    "kv": (["tests/test_kv.py"], ["tests/test_kv_boundaries.py"]),
    "runner": (["tests/test_runner.py"], ["tests/test_runner_boundaries.py"]),
    "sample": (["tests/test_sample.py"], ["tests/test_sample_boundaries.py"]),
    "fetch": (["tests/test_fetch.py"], ["tests/test_fetch_gguf.py"]),
    "generate": (["tests/test_generate.py"], ["tests/test_generate_boundaries.py"]),
}
MARKS = {"runner": "not hf and not smollm2", "generate": "not hf and not smollm2"}

SWAP = {"<": "<=", "<=": "<", ">": ">=", ">=": ">"}
NEIGHBOURS = {"+", "-", "//", "<", "<=", ">", ">=", "==", "!="}
CALLS = {"min", "max", "range"}
KEYWORDS = {"lo", "hi"}


@dataclass(frozen=True)
class Mutant:
    line: int
    col: int
    old: str
    new: str
    source: str  # the original line, stripped

    @property
    def name(self) -> str:
        return f"line {self.line}: {self.old} -> {self.new}"



def source_of(module: str, root: Path = REPO) -> str:
    """The module's file under `root`: in the layout of section 2.1 ("kv" -> tl_lab/kv.py, "blocks" ->
    tl_lab/engine/blocks.py), or at the top of tl_lab/ in a tree from before it (a --ref run)."""
    import tl_lab

    if (root / "tl_lab" / f"{module}.py").exists():
        return f"tl_lab/{module}.py"
    layer = tl_lab._MOVED.get(module)
    return f"tl_lab/{layer + '/' if layer else ''}{module}.py"

def mutants(text: str) -> list[Mutant]:
    """Every boundary mutant of `text` (module docstring above), in source order."""
    lines = text.splitlines()
    toks = [t for t in tokenize.generate_tokens(io.StringIO(text).readline)
            if t.type not in (tokenize.NL, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER)]
    out = []
    for i, t in enumerate(toks):
        src = lines[t.start[0] - 1].strip()
        if t.type == tokenize.OP and t.string in SWAP:
            out.append(Mutant(t.start[0], t.start[1], t.string, SWAP[t.string], src))
        elif t.type == tokenize.NUMBER and t.string.isdigit():
            prev = toks[i - 1].string if i else ""
            nxt = toks[i + 1].string if i + 1 < len(toks) else ""
            call_arg = _in_call(toks, i)
            keyword = prev == "=" and i >= 2 and toks[i - 2].string in KEYWORDS
            if prev in NEIGHBOURS or nxt in NEIGHBOURS or call_arg or keyword:
                v = int(t.string)
                for w in (v - 1, v + 1):
                    if w >= 0:
                        out.append(Mutant(t.start[0], t.start[1], t.string, str(w), src))
    return out


def _in_call(toks, i) -> bool:
    """Whether token i is a direct argument of min( / max( / range( (depth one)."""
    depth = 0
    for j in range(i - 1, -1, -1):
        if toks[j].type == tokenize.NEWLINE:  # the statement's start
            return False
        s = toks[j].string
        if s in (")", "]", "}"):
            depth += 1
        elif s in ("(", "[", "{"):
            if depth == 0:
                return s == "(" and j > 0 and toks[j - 1].string in CALLS
            depth -= 1
    return False


def apply(text: str, m: Mutant) -> str:
    lines = text.splitlines(keepends=True)
    line = lines[m.line - 1]
    assert line[m.col:m.col + len(m.old)] == m.old, (m, line)
    lines[m.line - 1] = line[:m.col] + m.new + line[m.col + len(m.old):]
    return "".join(lines)


def scratch_tree(ref: str | None = None) -> Path:
    """A copy of the tree the mutants are written into (data/ linked, not copied): the working tree,
    or commit `ref` (`git archive`: its modules and its tests, e.g. the tree before new tests)."""
    root = SCRATCH / (ref or "tree")
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    if ref is not None:
        archive = subprocess.run(["git", "archive", ref, "tl_lab", "tests", "tools", "benchmarks", "conftest.py",
                                  "pyproject.toml"], cwd=REPO, capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(root)], input=archive, check=True)
        for name in ("data", "docs", "notebooks"):
            (root / name).symlink_to(REPO / name)
        return root
    for name in ("tl_lab", "tests", "tools", "benchmarks"):
        shutil.copytree(REPO / name, root / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in ("conftest.py", "pyproject.toml"):
        shutil.copy2(REPO / name, root / name)
    for name in ("data", "docs", "notebooks"):
        (root / name).symlink_to(REPO / name)
    return root


def run_tests(root: Path, files: list[str], mark: str | None, budget: float) -> str:
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-n", "0", *files]
    if mark:
        cmd += ["-m", mark]
    env = {**os.environ, "PYTHONPATH": str(root), "PYTHONDONTWRITEBYTECODE": "1"}
    try:
        p = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=budget)
    except subprocess.TimeoutExpired:
        return "timeout"
    if p.returncode == 0:
        return "survived"
    if p.returncode == 1:
        return "killed"
    return "killed" if "failed" in p.stdout or "error" in p.stdout else f"error (exit {p.returncode})"


def run_module(root: Path, module: str, files: list[str], budget: float, log, only: set[str] | None = None) -> dict:
    """Run every mutant of `module` against `files`; only: the names of the mutants to run (the others
    are counted killed: a superset of tests that killed them before kills them again)."""
    path = root / source_of(module, root)
    text = path.read_text()
    ms = mutants(text)
    counts = {"killed": 0, "survived": 0, "timeout": 0, "error": 0}
    survivors = []
    t0 = time.perf_counter()
    try:
        for k, m in enumerate(ms, 1):
            if only is not None and m.name not in only:
                counts["killed"] += 1
                continue
            path.write_text(apply(text, m))
            verdict = run_tests(root, files, MARKS.get(module), budget)
            key = verdict.split(" ")[0]
            counts[key] = counts.get(key, 0) + 1
            if key != "killed":
                survivors.append({"mutant": m.name, "source": m.source, "verdict": verdict})
            log(f"  [{k}/{len(ms)}] {verdict:9s} {m.name}: {m.source[:90]}")
    finally:
        path.write_text(text)
    done = counts["killed"] + counts["survived"]
    return {"mutants": len(ms), **counts, "score": round(counts["killed"] / done, 4) if done else None,
            "tests": files, "seconds": round(time.perf_counter() - t0, 1), "survivors": survivors}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("modules", nargs="*", default=list(MODULES))
    ap.add_argument("--label", required=True, help="before / after: results go under boundary[label]")
    ap.add_argument("--with-boundaries", action="store_true", help="also run the module's boundary test files")
    ap.add_argument("--ref", default=None, help="mutate this commit's tree (its modules and tests) instead of the working tree")
    ap.add_argument("--budget", type=float, default=300.0, help="seconds per mutant's test run")
    ap.add_argument("--list", action="store_true", help="only list the mutants")
    ap.add_argument("--rerun-survivors-of", metavar="LABEL", default=None,
                    help="run only the mutants that survived under boundary-LABEL (with more tests: the others "
                         "were killed by a subset of these tests)")
    args = ap.parse_args(argv)
    for module in args.modules:
        if module not in MODULES:
            raise SystemExit(f"unknown module {module!r}; known: {', '.join(MODULES)}")
    if args.list:
        for module in args.modules:
            for m in mutants((REPO / source_of(module)).read_text()):
                print(f"{module} {m.name}: {m.source}")
        return
    root = scratch_tree(args.ref)
    results = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    for module in args.modules:
        mirror, extra = MODULES[module]
        files = mirror + (extra if args.with_boundaries else [])
        files = [f for f in files if (root / f).exists()]  # an older ref has no boundary files
        print(f"{module}: {len(mutants((root / source_of(module, root)).read_text()))} mutants, tests {files}", flush=True)
        only = None
        if args.rerun_survivors_of:
            prior = results["boundary"][args.rerun_survivors_of][module]
            only = {sv["mutant"] for sv in prior["survivors"]}
            print(f"{module}: rerunning the {len(only)} survivors of {args.rerun_survivors_of}", flush=True)
        res = run_module(root, module, files, args.budget, lambda s: print(s, flush=True), only)
        if only is not None:
            res["rerun_survivors_of"] = args.rerun_survivors_of
        res["ref"] = args.ref or "working tree"
        print(f"{module}: {res['killed']} killed, {res['survived']} survived, {res['timeout']} timeouts "
              f"(score {res['score']}) in {res['seconds']} s", flush=True)
        results = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}  # merge with other runs
        results.setdefault("boundary", {}).setdefault(args.label, {})[module] = res
        RESULTS.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
