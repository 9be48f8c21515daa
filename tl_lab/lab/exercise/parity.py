"""`exercise parity sampler rng`: the learner's sample.py against the golden files, case by case.

Chapter L10.1, "How to work this chapter" (`ol parity sampler rng`) and section 2.6. `rng`: PCG32,
mix64, child_seed and stream against data/golden/pcg32.vectors.json; `sampler`: the 12 cases x 12
tokens of data/golden/sampler.json (tools/make_sampler_goldens.py), ids and f64 logprobs bit for
bit. The first case that differs is reported with both values, floats as exact hex and decimal.

`in_child` runs it all in a child (`sandbox.run`, this module's `_main`), never in the command's process: any
BaseException of the learner's code (SystemExit included, at import or inside sample()) is a failure naming
their file and line; a loop at import or in a call is ended by SIGALRM after CASE_SECONDS, and the child as a
whole by a wall-clock limit (CHILD_SECONDS) even when the learner's code ignores the alarm; a child that ends
without its verdict (os._exit, a crash) is a failure too (issue #61: was exit 0 with no output, or a hang).

    python -m tl_lab.lab.exercise.parity WORKSPACE CASE_SECONDS SUITE ...   (the child)
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tl_lab.lab.exercise.alarm import time_limit
from tl_lab.ops.paths import GOLDEN_DIR

__all__ = ["SUITES", "CASE_SECONDS", "CHILD_SECONDS", "CaseTimeout", "Verdict", "limited", "parity_rng",
           "parity_sampler", "run", "in_child"]

SUITES = ("sampler", "rng")
GOLDEN = {"sampler": "data/golden/sampler.json", "rng": "data/golden/pcg32.vectors.json"}  # the file each suite reads
CASE_SECONDS = 30.0  # one call of the learner's code takes milliseconds here; a loop that never ends stops at this
CHILD_SECONDS = 600.0  # the whole child, wall clock: a learner's code that ignores SIGALRM stops at this
MARK = "tl_lab-parity: "  # the child's report lines on stdout (the learner's own prints are not shown)


class CaseTimeout(Exception):
    """A call of the learner's code ran past CASE_SECONDS (an infinite loop?)."""


@contextlib.contextmanager
def limited(seconds: float | None = None):
    """CaseTimeout raised in the learner's code after `seconds` (CASE_SECONDS): a loop is a case's
    verdict, not a command that never returns (`alarm.time_limit`)."""
    seconds = CASE_SECONDS if seconds is None else seconds

    def on_alarm(signum, frame):
        raise CaseTimeout(f"ran longer than {seconds:g} s (an infinite loop?)")

    with time_limit(seconds, on_alarm):
        yield


@dataclass(frozen=True)
class Verdict:
    """One suite: how many cases matched of how many, and the first difference in words ("" when none)."""

    suite: str
    matched: int
    total: int
    first_difference: str

    @property
    def ok(self) -> bool:
        return self.matched == self.total and not self.first_difference

    def line(self) -> str:
        head = f"parity {self.suite} (against {GOLDEN[self.suite]}): {self.matched}/{self.total} cases identical"
        return head if self.ok else f"{head}\n  first difference: {self.first_difference}"


def _f(x: float) -> str:
    return f"{float(x).hex()} ({float(x)!r})"


def parity_rng(ts) -> Verdict:
    """`ts`: the sample module to hold to pcg32.vectors.json (the learner's tl_lab.sample)."""
    vec = json.loads((GOLDEN_DIR / "pcg32.vectors.json").read_text())
    cases = []
    for e in vec["next_u32"]:
        def got(e=e):
            g = ts.Pcg32(int(e["seed"], 16), int(e["seq"], 16))
            return [f"{g.next_u32():#x}" for _ in e["u32"]]
        cases.append((f"next_u32 seed {e['seed']} seq {e['seq']}", got, [f"{int(w, 16):#x}" for w in e["u32"]]))
    for e in vec["uniform_f64"]:
        def got(e=e):
            g = ts.Pcg32(int(e["seed"], 16), int(e["seq"], 16))
            return [_f(g.uniform_f64()) for _ in e["u"]]
        cases.append((f"uniform_f64 seed {e['seed']} seq {e['seq']}", got, [_f(float.fromhex(u)) for u in e["u"]]))
    for e in vec["mix64"]:
        cases.append((f"mix64({e['in']})", lambda e=e: f"{ts.mix64(int(e['in'], 16)):#x}", f"{int(e['out'], 16):#x}"))
    for e in vec["child_seed"]:
        cases.append((f"child_seed({e['seed']}, {e['purpose']})",
                      lambda e=e: f"{ts.child_seed(int(e['seed'], 16), int(e['purpose'], 16)):#x}", f"{int(e['child'], 16):#x}"))
    for e in vec["stream"]:
        def got(e=e):
            g = ts.stream(int(e["seed"], 16), int(e["purpose"], 16))
            return [f"{g.next_u32():#x}" for _ in e["u32"]]
        cases.append((f"stream({e['seed']}, {e['purpose']})", got, [f"{int(w, 16):#x}" for w in e["u32"]]))
    return _compare("rng", cases)


def _compare(suite: str, cases) -> Verdict:
    matched = 0
    for name, got, want in cases:
        try:
            with limited():
                value = got()
        except BaseException as exc:  # noqa: BLE001: the learner's code; its error (SystemExit too) is the verdict
            return Verdict(suite, matched, len(cases), f"{name}: raised {_raised(exc)}")
        if value != want:
            return Verdict(suite, matched, len(cases), f"{name}: yours {_first_diff(value, want)}")
        matched += 1
    return Verdict(suite, matched, len(cases), "")


def _raised(exc: BaseException) -> str:
    """"Type: message", then " at FILE:LINE" of the learner's innermost frame in the module being held
    (the one of TL_LAB's workspace: tl_lab.sample's file) when it has one."""
    text = f"{type(exc).__name__}: {exc}"
    mine = getattr(sys.modules.get("tl_lab.sample"), "__file__", None)
    tb, at = exc.__traceback__, None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == mine:
            at = f"{mine}:{tb.tb_lineno}"
        tb = tb.tb_next
    return f"{text} at {at}" if at else text


def _first_diff(value, want) -> str:
    if isinstance(value, list) and isinstance(want, list) and len(value) == len(want):
        i = next(i for i, (a, b) in enumerate(zip(value, want)) if a != b)
        return f"{value[i]}, golden {want[i]} (output {i})"
    return f"{value}, golden {want}"


def _tables(g: dict) -> dict:
    return {name: [np.array([int(r[i: i + 8], 16) for i in range(0, len(r), 8)], np.uint32).view(np.float32)
                   for r in t["rows"]] for name, t in g["tables"].items()}


def parity_sampler(ts) -> Verdict:
    """`ts`: the sample module to hold to sampler.json: every case's 12 tokens, (id, logprob) bit for bit."""
    g = json.loads((GOLDEN_DIR / "sampler.json").read_text())
    tables = _tables(g)
    matched = 0
    for case in g["cases"]:
        params = ts.SamplingParams(**{k: (v if k == "top_k" else float.fromhex(v)) for k, v in case["params_hex"].items()})
        rows, prompt, output = tables[case["table"]], case["prompt"], []
        try:  # the learner's stream too: a sample.py with only the sampler written still gets a verdict
            with limited():
                rng = ts.stream(int(case["seed"], 16), g["purpose"])
        except BaseException as exc:  # noqa: BLE001: the learner's code; its error (SystemExit too) is the verdict
            return Verdict("sampler", matched, len(g["cases"]), f"case {case['name']}: stream raised {_raised(exc)}")
        for step, (want, want_lp) in enumerate(zip(case["tokens"], case["logprobs"])):
            want_lp = float.fromhex(want_lp)
            try:
                with limited():
                    tok, lp = ts.sample(rows[(prompt + output)[-1] % len(rows)], params, prompt, output, rng)
            except BaseException as exc:  # noqa: BLE001: the learner's code; its error (SystemExit too) is the verdict
                return Verdict("sampler", matched, len(g["cases"]), f"case {case['name']} token {step}: raised "
                                                                   f"{_raised(exc)}")
            if tok != want or float(lp).hex() != want_lp.hex():
                return Verdict("sampler", matched, len(g["cases"]),
                               f"case {case['name']} token {step}: yours id {tok} logprob {_f(lp)}, "
                               f"golden id {want} logprob {_f(want_lp)}")
            output.append(int(tok))
        matched += 1
    return Verdict("sampler", matched, len(g["cases"]), "")


def run(ts, suites) -> list[Verdict]:
    fns = {"sampler": parity_sampler, "rng": parity_rng}
    return [fns[s](ts) for s in suites]


# ------------------------------------------------------------------ the child, and the command's side


def _say(line: str) -> None:
    sys.__stdout__.write(MARK + json.dumps(line) + "\n")
    sys.__stdout__.flush()


def _main(argv: list[str]) -> int:
    """The child: the learner's sample.py of workspace argv[0] imported (SIGALRM after argv[1] seconds), then
    the suites; each report line on stdout after MARK, the exit code last ("code N")."""
    global CASE_SECONDS
    from tl_lab.lab.exercise.sandbox import arm_stack

    arm_stack()  # a loop that ignores the alarm: the parent still learns its line, from the stack dumped before its end
    from tl_lab.lab.exercise.guard import blame
    from tl_lab.lab.exercise.workspace import install

    ws, CASE_SECONDS, suites = Path(argv[0]), float(argv[1]), argv[2:]
    f = ws / "sample.py"
    install(ws, use={"sample"})
    try:
        with limited():  # a loop at the top level of sample.py too
            import tl_lab.sample as ts
    except BaseException as exc:  # noqa: BLE001: the learner's module does not import (SystemExit included)
        # blame's place: a SyntaxError has no frame in sample.py, its line is the error's own
        _say(f"parity: {blame(exc, ws, 'sample').at}: {type(exc).__name__}: {exc}")
        _say("code 1")
        return 0
    if ts.__file__ != str(f):  # never the reference held to the golden files in the learner's place
        _say(f"parity: tl_lab.sample was loaded from {ts.__file__}, not your {f}")
        _say("code 2")
        return 0
    _say(f"your {ts.__file__}")
    verdicts = run(ts, suites)
    for v in verdicts:
        for line in v.line().splitlines():
            _say(line)
    _say(f"code {0 if all(v.ok for v in verdicts) else 1}")
    return 0


def in_child(ws: Path, suites, *, case_seconds: float = CASE_SECONDS, timeout: float = CHILD_SECONDS) -> tuple[int, list[str]]:
    """Parity of workspace `ws`'s sample.py on `suites`, run in a sandboxed child -> (exit code: 0 every suite
    identical, 1 not, or the learner's code raised, looped or ended the child; the report's lines)."""
    from tl_lab.lab.exercise import sandbox
    from tl_lab.lab.exercise.workspace import ENV, ENV_USE
    from tl_lab.ops.paths import PACKAGE_DIR

    f = ws / "sample.py"
    env = {**os.environ, ENV: "off",
           "PYTHONPATH": os.pathsep.join([str(PACKAGE_DIR.parent), *filter(None, [os.environ.get("PYTHONPATH")])])}
    for k in ("TL_LAB_PITFALL", ENV_USE):
        env.pop(k, None)
    r = sandbox.run([sys.executable, "-m", "tl_lab.lab.exercise.parity", str(ws), repr(float(case_seconds)), *suites],
                    workspace=ws, timeout=timeout, env=env, stack=True)
    lines = []
    for s in r.stdout.splitlines():
        if MARK in s:
            try:
                lines.append(str(json.loads(s[s.index(MARK) + len(MARK):])))
            except ValueError:
                continue
    code = next((int(s.split()[1]) for s in lines if s.startswith("code ")), None)
    lines = [s for s in lines if not s.startswith("code ")]
    if r.timed_out:  # where it was looping: the child's stack, dumped a little before the end (`sandbox.stuck_at`)
        where = sandbox.stuck_at(r.stack, [f])
        at = f"{f}:{where[1]} in {where[2]}" if where else str(f)
        return 1, [*lines, f"parity: {at}: ran longer than {timeout:g} s, so it was stopped (a loop that ignores "
                           f"the {case_seconds:g} s alarm?)"]
    if code is None:  # no verdict: the learner's code ended the process (os._exit, a signal, a crash)
        tail = (r.stderr.strip().splitlines() or ["no output"])[-1][:300]
        how = f"signal {-r.returncode}" if r.returncode is not None and r.returncode < 0 else f"exit code {r.returncode}"
        return 1, [*lines, f"parity: {f}: the process ended ({how}) before parity finished: os._exit, a signal "
                           f"or a crash in your code? last line: {tail}"]
    return code, lines


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
