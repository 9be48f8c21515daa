"""tl_lab/exercise in the notebooks: the section notebooks run the learner's workspace (04, 05 and 07 on a
complete one), a learner module that raises, loops or is not UTF-8 costs its own cells only, and the first
cell names whose file ran. Split from tests/test_exercises.py so that the test command's workers share
the notebook runs out.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from conftest import need, workspace
from tl_lab.lab.exercise.registry import MODULES
from tl_lab.lab.exercise.stubs import reference_path, reference_source
from tl_lab.ops.paths import REPO_ROOT
from tl_lab.lab.pitfalls import PITFALLS, apply_edit

PY = sys.executable


def _nbval(ws, *notebooks):
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "TL_LAB_WORKSPACE": str(ws)}
    return subprocess.run([PY, "-m", "pytest", "--nbval-lax", "-q", "-p", "no:cacheprovider",
                           *[f"notebooks/{n}.ipynb" for n in notebooks]], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=900)


def test_the_sampler_and_kv_notebooks_run_on_a_complete_workspace(tmp_path):
    """The section notebooks run the learner's files: 04 and 07 pass on a workspace of reference
    copies, and 07 fails on one whose sample.py has the pitfall s04 (so 07 really ran that file)."""
    ws = workspace(tmp_path, "ref")
    p = _nbval(ws, "07_sampler", "04_kv_pool")
    assert p.returncode == 0, p.stdout[-3000:]
    src = reference_source("sample")
    for e in PITFALLS["s04"].edits:
        src = apply_edit(src, e, "s04")
    (ws / "sample.py").write_text(src)
    p = _nbval(ws, "07_sampler")
    assert p.returncode == 1 and "failed" in p.stdout.splitlines()[-1], p.stdout[-3000:]


def _run_cells(ws, notebook: str, monkeypatch, code_cells=(0, 1)) -> list[tuple[str, str | None]]:
    """Code cells `code_cells` (indices among the code cells) of `notebook`, run in a python3 kernel
    (nbclient) whose TL_LAB_WORKSPACE is `ws` -> per cell (its text output, its error name or None)."""
    nbformat, nbclient = need("nbformat"), need("nbclient")
    nb = nbformat.read(REPO_ROOT / "notebooks" / f"{notebook}.ipynb", 4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    nb.cells = [code[i] for i in code_cells]
    monkeypatch.setenv("TL_LAB_WORKSPACE", str(ws))
    monkeypatch.setenv("PYTHONPATH", str(REPO_ROOT))
    nbclient.NotebookClient(nb, timeout=300, kernel_name="python3", allow_errors=True,
                            resources={"metadata": {"path": str(REPO_ROOT / "notebooks")}}).execute()
    return [("".join(o.get("text", "") for o in c.outputs),
             next((o.ename for o in c.outputs if o.output_type == "error"), None)) for c in nb.cells]


def _first_cells(ws, notebook: str, monkeypatch) -> list[str]:
    """The text output of the first two code cells (the first cell, the imports); neither may raise."""
    out = _run_cells(ws, notebook, monkeypatch)
    assert [e for _, e in out] == [None, None], out
    return [text for text, _ in out]


def test_a_notebook_whose_learner_module_raises_shows_the_error_and_hint_and_runs_to_the_end(tmp_path, monkeypatch):
    """tl_lab.lab.exercise.guard through each section notebook's first cell: kv.py with a SyntaxError,
    quant.py with a NameError at import, sample.py raising at call. The first cell names each with
    its file, line and hint, the reference runs in their place, and 04 and 07 run to the end."""
    ws = workspace(tmp_path, "ref")
    kv = reference_source("kv").replace("class KvPool:", "class KvPool(:", 1)
    quant = reference_source("quant").replace("\nclass QLinear:", "\nundefined_name\n\nclass QLinear:", 1)
    sample = reference_source("sample").replace("    M = max(l)\n", "    M = l.maximum()\n", 1)
    for m, src in (("kv", kv), ("quant", quant), ("sample", sample)):
        assert src != reference_source(m)
        (ws / f"{m}.py").write_text(src)
    line = {m: src.splitlines().index(text) + 1 for m, src, text in
            (("kv", kv, "class KvPool(:"), ("quant", quant, "undefined_name"), ("sample", sample, "    M = l.maximum()"))}

    first, imports = _first_cells(ws, "04_kv_pool", monkeypatch)
    assert imports == ""
    for m, what in (("kv", "SyntaxError"), ("quant", "NameError: name 'undefined_name' is not defined"),
                    ("sample", "AttributeError")):
        assert f"!! your {m}.py raises, so this notebook runs the reference's {m} in its place" in first, first
        assert f"{ws / f'{m}.py'}:{line[m]} in " in first and what in first, first
    assert "hint: steps 1 to 9 of docs/spec/sampling.md" in first  # the piece it raised in: sample's sample_trace
    assert "python -m tl_lab exercise hint kv" in first
    assert f"workspace {ws}: yours run for " in first and "model" in first.split("yours run for ")[1].split(";")[0]  # the modules that run stay the learner's

    p = _nbval(ws, "04_kv_pool", "07_sampler")
    assert p.returncode == 0, p.stdout[-3000:]


def test_a_notebook_assert_that_fails_on_the_learners_code_names_their_file(tmp_path, monkeypatch):
    """A quant.py that rounds ties up (it imports and runs, so the guard lets it through): 03's assert on
    the ties fails. Its traceback said only "AssertionError:"; now the cell also names the learner's file
    and the check to run, and once only with the first cell run again."""
    ws = workspace(tmp_path, "ref", ["quant"])
    src = reference_source("quant").replace('round_up = verdict == "above half" or (verdict == "tie" and kept & 1 == 1)',
                                            'round_up = verdict in ("above half", "tie")', 1)
    assert src != reference_source("quant")
    (ws / "quant.py").write_text(src)
    nbformat = need("nbformat")
    code = [c.source for c in nbformat.read(REPO_ROOT / "notebooks" / "03_numbers.ipynb", 4).cells if c.cell_type == "code"]
    ties = next(i for i, c in enumerate(code) if "assert f32_to_f16(1 + 2**-11) == 0x3C00" in c)
    out = _run_cells(ws, "03_numbers", monkeypatch, (0, 1, ties, 0, ties))
    note = (f"this notebook runs your quant.py (workspace {ws}): the assert above checks what your code answers; "
            f"python -m tl_lab exercise check quant --workspace {ws} names the chapter's test")
    assert [e for _, e in out] == [None, None, "AssertionError", None, "AssertionError"], out
    assert [text.count(note) for text, _ in out] == [0, 0, 1, 0, 1], out


def test_an_error_tl_lab_raises_on_the_learners_code_names_their_file_and_a_cells_own_slip_does_not(
        tmp_path, monkeypatch, capsys):
    """A kv.py whose available() forgets the cached blocks passes the guard; 12's engine then raised
    "KvError: ... the pool has only 3 available of 14; raise KvConfig.n_blocks" from generate.py, with no
    word of kv.py. An error raised inside tl_lab now names the learner's files too; a NameError of the
    cell's own does not."""
    from types import SimpleNamespace

    import tl_lab.lab.exercise as ex
    import tl_lab.lab.exercise.workspace as wsm
    from tl_lab.errors import KvError
    from tl_lab.kv import KvCfg

    kv = str(tmp_path / "kv.py")
    monkeypatch.setattr(wsm, "origins", lambda: {"kv": {"origin": "learner", "file": kv, "loaded": kv},
                                                 "quant": {"origin": "reference", "file": "q", "loaded": "q"}})
    monkeypatch.setattr(ex, "active", lambda: SimpleNamespace(workspace=tmp_path))
    try:
        KvCfg(n_blocks=0, block_tokens=4, n_layers=1, n_kv_heads=1, head_dim=2).validate()
    except KvError as exc:
        inside = exc
    try:
        undefined_name  # noqa: B018, F821
    except NameError as exc:
        slip = exc
    for error in (inside, slip, None, KeyboardInterrupt()):
        ex._after_cell(SimpleNamespace(error_in_exec=error))
    assert capsys.readouterr().out == (
        f"this notebook runs your kv.py (workspace {tmp_path}): the error above was raised while tl_lab ran your "
        f"code, perhaps on a wrong answer of it; python -m tl_lab exercise check kv --workspace {tmp_path} names the "
        "chapter's test\n")


NOT_ACTIVATED = {
    "10_pitfalls": "a pitfall edits the reference's text: pitfalls and a workspace do not combine",
    "11_interface": "it runs the project's own tests on the interface, item by item: the reference's",
    "13_your_turn": "it drives the exercise itself, in a workspace of its own under the project's tests",
}


def test_every_section_notebook_using_a_learner_module_activates_the_workspace_first():
    """The guard is one mechanism for every section notebook: the first code cell of each notebook
    that imports one of the six is exercise.activate(), before any of them is imported."""
    import re

    nbformat = need("nbformat")
    pattern = re.compile(r"(from tl_lab\.(%s) import|import tl_lab\.(%s)\b)" % ("|".join(MODULES), "|".join(MODULES)))
    seen = []
    for f in sorted((REPO_ROOT / "notebooks").glob("*.ipynb")):
        code = [c.source for c in nbformat.read(f, 4).cells if c.cell_type == "code"]
        if f.stem in NOT_ACTIVATED or not any(pattern.search(c) for c in code):
            continue
        assert "exercise.activate()" in code[0] and not pattern.search(code[0]), f.stem
        seen.append(f.stem)
    assert len(seen) >= 10 and {"04_kv_pool", "05_forward", "07_sampler"} <= set(seen), seen


def test_the_guard_stops_a_loop_and_survives_an_exit(tmp_path, monkeypatch):
    """A learner module that never ends its trial, or ends the process, is a Fault naming it; the
    other modules are tried again without it and stay the learner's."""
    from tl_lab.lab.exercise import guard

    ws = workspace(tmp_path, "ref", ["kv", "sample"])
    (ws / "sample.py").write_text(reference_source("sample") + "\nwhile True:\n    pass\n")
    monkeypatch.setattr(guard, "TIMEOUT", 20.0)
    faults = guard.trial(ws, ["kv", "sample"])
    assert list(faults) == ["sample"] and faults["sample"].error == "ran longer than 20 s", faults
    (ws / "kv.py").write_text(reference_source("kv") + "\nimport sys\nsys.exit(3)\n")
    (ws / "sample.py").write_text(reference_source("sample"))
    faults = guard.trial(ws, ["kv", "sample"])  # a SystemExit is a fault at its line (issue #61: was "the process ended")
    assert list(faults) == ["kv"] and faults["kv"].error == "SystemExit: 3", faults
    assert faults["kv"].line == reference_source("kv").count("\n") + 3
    (ws / "kv.py").write_text(reference_source("kv") + "\nimport os\nos._exit(3)\n")
    faults = guard.trial(ws, ["kv", "sample"])
    assert list(faults) == ["kv"] and faults["kv"].error.startswith("the process ended"), faults


def test_a_learner_file_that_is_not_utf8_costs_a_notebook_that_module_alone(tmp_path):
    """Five good files and a kv.py saved in Latin-1: the first cell (exercise.activate(), with the
    workspace in TL_LAB_WORKSPACE as a notebook's kernel has it) names kv.py and its line, the reference's
    kv runs in its place, and the other five are the learner's (one bad file once switched all six off)."""
    ws = workspace(tmp_path, "ref")
    text = reference_source("kv") + "\n# café\n"
    (ws / "kv.py").write_bytes(text.encode("latin-1"))
    code = ("import importlib, json\nfrom tl_lab import exercise\nexercise.activate()\n"
            "print(json.dumps({m: importlib.import_module(f'tl_lab.{m}').__file__ for m in exercise.MODULES}))\n")
    p = subprocess.run([PY, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=600,
                       env={**os.environ, "PYTHONPATH": str(REPO_ROOT), "TL_LAB_WORKSPACE": str(ws)})
    assert p.returncode == 0 and "error:" not in p.stdout, p.stdout + p.stderr
    *printed, last = p.stdout.strip().splitlines()
    assert json.loads(last) == {m: str(reference_path(m)) if m == "kv" else str(ws / f"{m}.py") for m in MODULES}
    line = text.count("\n")
    assert "!! your kv.py raises, so this notebook runs the reference's kv in its place:" in printed
    assert (f"   {ws / 'kv.py'}:{line} in (import): NotUtf8Error: not UTF-8 text (invalid continuation byte) "
            f"(kv.py, line {line})") in printed


def test_a_bad_workspace_in_a_notebook_is_one_line_and_the_reference_runs(tmp_path, monkeypatch):
    first, imports = _first_cells(tmp_path / "missing", "04_kv_pool", monkeypatch)
    assert first.splitlines()[0] == (f"error: TL_LAB_WORKSPACE={tmp_path / 'missing'}: workspace "
                                     f"{tmp_path / 'missing'} does not exist: python -m tl_lab exercise start "
                                     f"--workspace {tmp_path / 'missing'} writes it; this notebook runs the reference's modules (fix it, then restart the kernel)")
    assert "Traceback" not in first and imports == ""


def test_05_holds_the_learners_forward_against_hf_and_the_reference(tmp_path, monkeypatch):
    """Notebook 05's central claim with a workspace: the runner is the learner's, and the reference's
    runs the same golden cases beside it. A forward that skips the final norm (s16) is OUTSIDE the
    bound beside a reference within it, and the cell's assert fails: the learner's forward ran."""
    import nbformat

    ws = workspace(tmp_path, "ref", ["quant", "kv", "model", "forward", "runner"])
    src = reference_source("forward")
    for e in PITFALLS["s16"].edits:
        src = apply_edit(src, e, "s16")
    (ws / "forward.py").write_text(src)
    code = [c for c in nbformat.read(REPO_ROOT / "notebooks" / "05_forward.ipynb", 4).cells if c.cell_type == "code"]
    claim = next(i for i, c in enumerate(code) if c.source.startswith("cases = hf_golden_cases()"))
    (first, _), (_, err), (text, claim_err) = _run_cells(ws, "05_forward", monkeypatch, (0, 1, claim))
    assert f"workspace {ws}: yours run for " in first and "forward" in first.split("yours run for ")[1] and err is None
    lines = [s for s in text.splitlines() if " tokens: yours " in s]
    assert len(lines) == 6 and all(s.endswith("OUTSIDE") for s in lines), text
    ref = [float(s.split("the reference's ")[1].split(",")[0]) for s in lines]
    bound = [float(s.split("bound ")[1].split(":")[0]) for s in lines]
    assert all(r <= b for r, b in zip(ref, bound)) and claim_err == "AssertionError"


# ------------------------------------------------------------------ pieces' sizes, catalogue ids, the workspace
