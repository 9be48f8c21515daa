"""`exercise parity sampler rng`: the learner's sample.py against the golden files, case by case.

Chapter L10.1, "How to work this chapter" (`ol parity sampler rng`) and section 2.6. `rng`: PCG32,
mix64, child_seed and stream against data/golden/pcg32.vectors.json; `sampler`: the 12 cases x 12
tokens of data/golden/sampler.json (tools/make_sampler_goldens.py), ids and f64 logprobs bit for
bit. The first case that differs is reported with both values, floats as exact hex and decimal.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass

import numpy as np

from tl_lab.lab.exercise.alarm import time_limit
from tl_lab.ops.paths import GOLDEN_DIR

__all__ = ["SUITES", "CASE_SECONDS", "CaseTimeout", "Verdict", "limited", "parity_rng", "parity_sampler", "run"]

SUITES = ("sampler", "rng")
GOLDEN = {"sampler": "data/golden/sampler.json", "rng": "data/golden/pcg32.vectors.json"}  # the file each suite reads
CASE_SECONDS = 30.0  # one call of the learner's code takes milliseconds here; a loop that never ends stops at this


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
        except Exception as exc:  # noqa: BLE001: the learner's code; its error is the verdict
            return Verdict(suite, matched, len(cases), f"{name}: raised {type(exc).__name__}: {exc}")
        if value != want:
            return Verdict(suite, matched, len(cases), f"{name}: yours {_first_diff(value, want)}")
        matched += 1
    return Verdict(suite, matched, len(cases), "")


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
        except Exception as exc:  # noqa: BLE001: the learner's code; its error is the verdict
            return Verdict("sampler", matched, len(g["cases"]), f"case {case['name']}: stream raised "
                                                               f"{type(exc).__name__}: {exc}")
        for step, (want, want_lp) in enumerate(zip(case["tokens"], case["logprobs"])):
            want_lp = float.fromhex(want_lp)
            try:
                with limited():
                    tok, lp = ts.sample(rows[(prompt + output)[-1] % len(rows)], params, prompt, output, rng)
            except Exception as exc:  # noqa: BLE001: the learner's code; its error is the verdict
                return Verdict("sampler", matched, len(g["cases"]), f"case {case['name']} token {step}: raised "
                                                                   f"{type(exc).__name__}: {exc}")
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
