"""tl_lab/lab/exercise/guard.py in this process: blame's fault, trial's retries, the trial process's verdict
(the notebooks' trials in a process of their own are test_exercises.py's).
"""



from tl_lab.lab.exercise import registry
from tl_lab.lab.exercise.registry import MODULES
from tl_lab.lab.exercise.workspace import read_source


def _raised_in(ws, module, source, call="f()"):
    """The exception `source` (compiled as the workspace's `module`.py) raises at `call`."""
    path = ws / f"{module}.py"
    path.write_text(source, encoding="utf-8")
    scope = {}
    try:
        exec(compile(source, str(path), "exec"), scope)
        eval(call, scope)
    except BaseException as exc:  # noqa: BLE001
        return exc
    raise AssertionError("did not raise")


def test_in_process_guard_blames_the_learners_innermost_frame(tmp_path):
    from tl_lab.lab.exercise import guard

    piece = registry.PIECES["kv"][0]
    owner, _, name = piece.qualname.rpartition(".")
    source = (f"class {owner}:\n    def {name}(self):\n        return 1 / 0\n" if owner else
              f"def {name}():\n    return 1 / 0\n")
    exc = _raised_in(tmp_path, "kv", source, f"{owner}().{name}()" if owner else f"{name}()")
    fault = guard.blame(exc, tmp_path, "runner")  # tried through the runner, raised in kv.py
    assert (fault.module, fault.file, fault.line, fault.function) == ("kv", str(tmp_path / "kv.py"), 3 if owner else 2,
                                                                       piece.qualname)
    assert fault.error == "ZeroDivisionError: division by zero"
    ws = f" --workspace {tmp_path}"  # not the default work/L10.1: each command suggested names it
    assert fault.hint == f"{piece.hint} (section {piece.section}); python -m tl_lab exercise hint kv{ws}"
    assert fault.at == f"{tmp_path / 'kv.py'}:{fault.line}"
    assert fault.lines() == [
        "!! your kv.py raises, so this notebook runs the reference's kv in its place:",
        f"   {fault.at} in {piece.qualname}: ZeroDivisionError: division by zero",
        f"   hint: {fault.hint}",
        f"   fix it (python -m tl_lab exercise check kv{ws} says more), then restart the kernel"]


def test_in_process_guard_blames_imports_syntax_stubs_and_long_errors(tmp_path):
    from tl_lab.lab.exercise import guard
    from tl_lab.lab.exercise.stubs import NOT_WRITTEN

    ws = f" --workspace {tmp_path}"  # not the default work/L10.1: each command suggested names it
    exc = _raised_in(tmp_path, "sample", "x = undefined_name\n", "0")
    fault = guard.blame(exc, tmp_path, "sample")
    assert (fault.module, fault.line, fault.function) == ("sample", 1, "(import)")
    assert fault.hint == f"reread {registry.SECTIONS['sample']}; python -m tl_lab exercise hint sample{ws}"
    try:
        compile("def f(:\n", str(tmp_path / "quant.py"), "exec")
    except SyntaxError as exc:
        fault = guard.blame(exc, tmp_path, "runner")
    assert (fault.module, fault.file, fault.line, fault.function) == ("quant", str(tmp_path / "quant.py"), 1, "(import)")
    exc = _raised_in(tmp_path, "model", f"def f():\n    raise NotImplementedError('load: {NOT_WRITTEN} (section 2.3)')\n")
    fault = guard.blame(exc, tmp_path, "model")
    assert fault.hint == f"a piece still the stub (its message says what to write); python -m tl_lab exercise hint model{ws}"
    exc = _raised_in(tmp_path, "kv", "def f():\n    raise ValueError('v' * 400)\n")
    fault = guard.blame(exc, tmp_path, "kv")
    assert fault.error == ("ValueError: " + "v" * 400)[: guard.MESSAGE_CHARS] + " ..."
    (tmp_path / "kv.py").write_bytes(b"x = 1\n# caf\xe9\n")
    try:
        read_source(tmp_path / "kv.py")
    except SyntaxError as exc:
        fault = guard.blame(exc, tmp_path, "runner")  # raised where runner.py imported kv
    assert (fault.module, fault.at, fault.function) == ("kv", f"{tmp_path / 'kv.py'}:2", "(import)")
    assert fault.error == "NotUtf8Error: not UTF-8 text (invalid continuation byte) (kv.py, line 2)"
    assert fault.hint == f"save kv.py as UTF-8 (the character at line 2); python -m tl_lab exercise hint kv{ws}"
    fault = guard.blame(ValueError("no traceback"), tmp_path, "runner")  # no frame of the learner's
    assert (fault.module, fault.file, fault.line, fault.at, fault.function) == (
        "runner", str(tmp_path / "runner.py"), None, str(tmp_path / "runner.py"), "(import)")


def test_in_process_guard_tries_each_module_once_without_the_ones_that_raised(tmp_path, monkeypatch):
    from tl_lab.lab.exercise import guard

    def fault(m):
        return guard.Fault(m, f"{m}.py", 1, "f", "E: e", "h")

    calls, verdicts = [], [fault("kv"), fault("elsewhere"), None]
    monkeypatch.setattr(guard, "_one_trial", lambda ws, left: calls.append(list(left)) or verdicts.pop(0))
    got = guard.trial(tmp_path, ["runner", "kv", "sample", "model"])
    assert calls == [["kv", "model", "runner", "sample"], ["model", "runner", "sample"], ["runner", "sample"]]
    assert list(got) == ["kv", "model"] and got["model"].file == "elsewhere.py"  # not one of ours: the first left
    assert guard._last_tried("x\ntrying kv\nprint\ntrying quant\n", ["kv", "quant"]) == "quant"
    assert guard._last_tried("trying model\n", ["kv", "quant"]) == "kv"  # not asked: the first
    assert guard._last_tried("", ["sample"]) == "sample"
    assert guard._last_tried("trying kv\ntrying quant\ntrying model\n", ["kv", "quant", "model"]) == "model"


def test_in_process_guard_trial_process_prints_its_verdict_last(tmp_path, monkeypatch, capsys):
    import json

    from tl_lab.lab.exercise import guard

    assert guard._main([str(tmp_path), "sample", *reversed(MODULES)]) == 0  # the reference: every trial runs
    out = capsys.readouterr().out.splitlines()
    assert out == [f"trying {m}" for m in MODULES] + [guard.MARK + "null"]  # the chapter's order, each once

    def boom():
        raise RuntimeError("at call")

    monkeypatch.setitem(guard.TRIALS, "quant", boom)
    guard._main([str(tmp_path), "quant", "sample"])
    out = capsys.readouterr().out.splitlines()
    assert out[:1] == ["trying quant"] and out[-1].startswith(guard.MARK)  # stopped at the first fault
    verdict = json.loads(out[-1][len(guard.MARK):])
    assert (verdict["module"], verdict["error"]) == ("quant", "RuntimeError: at call") and len(out) == 2


def test_in_process_guard_reads_the_verdict_after_a_print_without_a_newline(tmp_path, monkeypatch):
    """A learner's sample.py that prints progress dots (print(".", end="")) runs fine: the trial's verdict
    line begins after the dots. It was read as "the process ended: no output", a fault, and the
    reference ran in the notebook in place of a module that works."""
    import dataclasses
    import json

    from tl_lab.lab.exercise import guard

    def run(cmd, **kwargs):
        return guard.sandbox.Result(0, stdout=f"trying sample\n....{guard.MARK}null\n", stderr="")

    monkeypatch.setattr(guard.sandbox, "run", run)
    assert guard._one_trial(tmp_path, ["sample"]) is None
    fault = guard.Fault("sample", "sample.py", 3, "f", "E: e", "h")
    verdict = json.dumps(dataclasses.asdict(fault))
    monkeypatch.setattr(guard.sandbox, "run", lambda cmd, **kw: guard.sandbox.Result(
        0, stdout=f"trying sample\n.{guard.MARK}{verdict}\n", stderr=""))
    assert guard._one_trial(tmp_path, ["sample"]) == fault


def test_in_process_guard_trial_takes_a_learners_sys_exit_as_its_fault(tmp_path, monkeypatch, capsys):
    """Issue #61: a SystemExit in the learner's module ended the trial process with no verdict ("the process
    ended: no output", no line); it is now the module's fault like any error."""
    import json

    from tl_lab.lab.exercise import guard

    def bye():
        raise SystemExit(0)

    monkeypatch.setitem(guard.TRIALS, "quant", bye)
    assert guard._main([str(tmp_path), "quant"]) == 0
    out = capsys.readouterr().out.splitlines()
    verdict = json.loads(out[-1][len(guard.MARK):])
    assert (verdict["module"], verdict["error"]) == ("quant", "SystemExit: 0")


def test_a_module_whose_trial_looped_is_never_imported_again_in_this_process(tmp_path, monkeypatch, capsys):
    """Issue #61: notebook 07 with a sample.py that loops at import: the first cell waited, ran the reference,
    and a later `yours_or_none("sample")` imported the file again in the kernel and hung. The trial (in a
    sandboxed child, its whole group ended at the limit) is the only import; `yours` refuses it after."""
    import time

    from conftest import workspace
    from tl_lab.lab.exercise import guard, side

    ws = workspace(tmp_path, "reference", ["sample"])
    (ws / "sample.py").write_text("while True:\n    pass\n", encoding="utf-8")
    monkeypatch.setattr(guard, "TIMEOUT", 3.0)
    t0 = time.perf_counter()
    faults = guard.trial(ws, ["sample"])
    assert set(faults) == {"sample"} and faults["sample"].error == "ran longer than 3 s"
    assert faults["sample"].at in (f"{ws / 'sample.py'}:1", f"{ws / 'sample.py'}:2")  # its line (was: the file alone)
    assert time.perf_counter() - t0 < 20
    assert "did not finish its trial" in faults["sample"].lines()[0]
    assert side.yours_or_none("sample", ws) is None  # was: imported again here, and hung
    assert "failed its trial in this kernel's first cell" in capsys.readouterr().out
    (ws / "sample.py").write_text("X = 1\n", encoding="utf-8")  # edited since: the new text is not the one tried
    assert side.yours("sample", ws).X == 1


def test_guard_trial_takes_a_learners_keyboard_interrupt_as_its_fault_at_its_line(tmp_path):
    """Issue #61: a KeyboardInterrupt raised by the learner's quant.py (at import, or in a piece the trial calls)
    is the module's fault at its file and line, like any error: the notebook runs the reference in its place."""
    from conftest import workspace
    from tl_lab.lab.exercise import guard
    from tl_lab.lab.exercise.stubs import reference_source

    ws = workspace(tmp_path, "reference", ["quant"])
    f = ws / "quant.py"
    ref = reference_source("quant")
    f.write_text(ref + "\nraise KeyboardInterrupt('mine')\n", encoding="utf-8")
    fault = guard.trial(ws, ["quant"])["quant"]
    assert (fault.at, fault.function, fault.error) == (f"{f}:{ref.count(chr(10)) + 2}", "(import)", "KeyboardInterrupt: mine")
    f.write_text(ref.replace("def f32_to_f16(", "def f32_to_f16(*a, **k):\n    raise KeyboardInterrupt('mine')\n\n\n"
                             "def _was_f32_to_f16(", 1), encoding="utf-8")
    fault = guard.trial(ws, ["quant"])["quant"]
    line = ref[: ref.index("def f32_to_f16(")].count("\n") + 2
    assert (fault.at, fault.function, fault.error) == (f"{f}:{line}", "f32_to_f16", "KeyboardInterrupt: mine")
