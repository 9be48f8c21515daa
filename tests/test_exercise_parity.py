"""tl_lab/lab/exercise/parity.py in this process: the learner's sample module held to the golden files, and
the first case that differs said with both values.
"""

import numpy as np


class _Off:
    """The reference sample module with one thing changed: `name` replaced by `value`."""

    def __init__(self, **changed):
        import tl_lab.sample as ts

        self._ts, self._changed = ts, changed

    def __getattr__(self, name):
        return self._changed.get(name, getattr(self._ts, name))


def test_in_process_parity_of_the_reference_is_every_case():
    from tl_lab.lab.exercise import parity
    from tl_lab import sample as ts

    got = parity.run(ts, ["sampler", "rng"])
    assert [(v.suite, v.ok, v.first_difference) for v in got] == [("sampler", True, ""), ("rng", True, "")]
    assert got[0].matched == got[0].total == 12 and got[1].matched == got[1].total > 12
    assert got[0].line() == "parity sampler (against data/golden/sampler.json): 12/12 cases identical"


def test_in_process_parity_names_the_first_output_that_differs():
    from tl_lab.lab.exercise import parity
    from tl_lab import sample as ts

    class Pcg32(ts.Pcg32):
        outputs = None  # None while seeding: its own calls are not outputs

        def __init__(self, *args):
            super().__init__(*args)
            self.outputs = 0

        def next_u32(self):
            if self.outputs is None:
                return super().next_u32()
            self.outputs += 1
            return super().next_u32() ^ (1 if self.outputs == 3 else 0)  # every generator's third output

    v = parity.parity_rng(_Off(Pcg32=Pcg32))
    assert not v.ok and v.matched == 0 and v.total == parity.parity_rng(ts).total
    assert v.first_difference.startswith("next_u32 seed ") and v.first_difference.endswith("(output 2)")
    yours, golden = v.first_difference.split(": yours ")[1].split(" (output")[0].split(", golden ")
    assert int(yours, 16) ^ int(golden, 16) == 1
    assert v.line() == f"parity rng (against data/golden/pcg32.vectors.json): 0/{v.total} cases identical\n  first difference: {v.first_difference}"

    def mix64(x):
        raise ValueError("not written yet")

    v = parity.parity_rng(_Off(mix64=mix64))
    n_before = sum(1 for line in v.first_difference.splitlines())  # one line
    assert v.first_difference.startswith("mix64(") and v.first_difference.endswith(
        ": raised ValueError: not written yet") and n_before == 1
    assert 0 < v.matched < v.total  # the PCG32 cases before mix64's matched
    assert parity._first_diff(5, 7) == "5, golden 7" and parity._first_diff([1], [1, 2]) == "[1], golden [1, 2]"


def test_in_process_parity_of_the_sampler_is_bit_for_bit():
    from tl_lab.lab.exercise import parity
    from tl_lab import sample as ts

    def one_ulp_off(*args):
        tok, lp = ts.sample(*args)
        return tok, float(np.nextafter(lp, -np.inf))

    v = parity.parity_sampler(_Off(sample=one_ulp_off))
    assert not v.ok and v.matched == 0 and v.total == 12
    assert v.first_difference.startswith("case ") and " token 0: yours id " in v.first_difference
    yours, golden = (float.fromhex(part.split(" logprob ")[1].split(" ")[0])
                     for part in v.first_difference.split(", golden "))
    assert yours == np.nextafter(golden, -np.inf)
    assert v.line() == f"parity sampler (against data/golden/sampler.json): 0/12 cases identical\n  first difference: {v.first_difference}"

    def raising(*args):
        raise NotImplementedError("section 2.6")

    v = parity.parity_sampler(_Off(sample=raising))
    assert v.first_difference.endswith("token 0: raised NotImplementedError: section 2.6") and v.matched == 0
    assert v.line() == f"parity sampler (against data/golden/sampler.json): 0/12 cases identical\n  first difference: {v.first_difference}"


def test_in_process_parity_of_the_sampler_names_a_stream_that_raises():
    """A sample.py with the generator written before `stream`: the sampler suite is a verdict naming
    the error (not the command's internal error), and the rng suite still runs."""
    from tl_lab.lab.exercise import parity

    def stream(seed, purpose):
        raise NotImplementedError("stream: not written yet")

    learner = _Off(stream=stream)
    v = parity.parity_sampler(learner)
    assert not v.ok and v.matched == 0 and v.total == 12
    assert v.first_difference.endswith(": stream raised NotImplementedError: stream: not written yet")
    assert [x.suite for x in parity.run(learner, ["sampler", "rng"])] == ["sampler", "rng"]


def test_in_process_parity_ends_a_loop_in_the_learners_code(monkeypatch):
    """A learner's mix64 that never returns: the case's verdict names the limit (the command returns),
    and the alarm is off again after it."""
    import signal

    from tl_lab.lab.exercise import parity

    def mix64(z):
        while True:
            z |= 1

    monkeypatch.setattr(parity, "CASE_SECONDS", 0.2)
    before = signal.getsignal(signal.SIGALRM)
    v = parity.parity_rng(_Off(mix64=mix64))
    assert not v.ok and 0 < v.matched < v.total
    assert v.first_difference.startswith("mix64(") and v.first_difference.endswith(
        ": raised CaseTimeout: ran longer than 0.2 s (an infinite loop?)")
    assert signal.getsignal(signal.SIGALRM) == before and signal.getitimer(signal.ITIMER_REAL)[0] == 0


def test_parity_in_a_child_fails_every_way_the_learners_code_ends_it(tmp_path):
    """Issue #61: parity ran sample.py in the command's process, so its sys.exit(0) (at import or inside
    sample()) was exit 0 with no output, and a loop at import hung it. In the child, each is a failure
    (exit 1) naming the file (and its line when the code raised)."""
    from conftest import workspace
    from tl_lab.lab.exercise.parity import in_child
    from tl_lab.lab.exercise.stubs import reference_source

    ws = workspace(tmp_path, "reference", ["sample"])
    f = ws / "sample.py"
    ref = reference_source("sample")
    f.write_text("import sys\n\nsys.exit(0)\n", encoding="utf-8")
    assert in_child(ws, ["rng"]) == (1, [f"parity: {f}:3: SystemExit: 0"])
    f.write_text(ref.replace("def sample(", "def sample(*a, **k):\n    raise SystemExit(0)\n\n\ndef _was_sample("),
                 encoding="utf-8")
    code, lines = in_child(ws, ["sampler"])
    assert code == 1 and "raised SystemExit: 0 at " + str(f) + ":" in lines[-1]
    f.write_text("while True:\n    pass\n", encoding="utf-8")  # a loop at import: the alarm ends it
    code, lines = in_child(ws, ["rng"], case_seconds=0.5)
    assert code == 1 and lines[-1].startswith(f"parity: {f}:") and "CaseTimeout: ran longer than 0.5 s" in lines[-1]
    f.write_text("import signal\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\nwhile True:\n    pass\n", encoding="utf-8")
    code, lines = in_child(ws, ["rng"], case_seconds=0.5, timeout=4)  # the alarm ignored: the wall clock ends it
    # the line it looped at, from the child's stack dumped shortly before the end (was: the file alone)
    assert code == 1 and lines in ([f"parity: {f}:{n} in (import): ran longer than 4 s, so it was stopped (a loop that "
                                    "ignores the 0.5 s alarm?)"] for n in (3, 4)), lines
    f.write_text("import os\nos._exit(0)\n", encoding="utf-8")
    code, lines = in_child(ws, ["rng"])
    assert code == 1 and lines[-1].startswith(f"parity: {f}: the process ended (exit code 0) before parity finished")


def test_parity_in_a_child_takes_a_learners_keyboard_interrupt_as_a_failure_at_its_line(tmp_path):
    """Issue #61: a KeyboardInterrupt the learner's sample.py raises (at import, or inside sample()) is a failure
    naming its file and line, like any BaseException, never the command's own interruption."""
    from conftest import workspace
    from tl_lab.lab.exercise.parity import in_child
    from tl_lab.lab.exercise.stubs import reference_source

    ws = workspace(tmp_path, "reference", ["sample"])
    f = ws / "sample.py"
    f.write_text("import sys\n\nraise KeyboardInterrupt('mine')\n", encoding="utf-8")
    assert in_child(ws, ["rng"]) == (1, [f"parity: {f}:3: KeyboardInterrupt: mine"])
    ref = reference_source("sample")
    f.write_text(ref.replace("def sample(", "def sample(*a, **k):\n    raise KeyboardInterrupt('mine')\n\n\ndef _was_sample("),
                 encoding="utf-8")
    line = ref[: ref.index("def sample(")].count("\n") + 2
    code, lines = in_child(ws, ["sampler"])
    assert code == 1 and lines[-1].endswith(f": raised KeyboardInterrupt: mine at {f}:{line}"), lines
