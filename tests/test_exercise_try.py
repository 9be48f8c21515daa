"""`exercise try PIECE` exists for every piece of the registry, and a workspace copy of the reference
agrees with the reference on every case of every piece (one child per side and module)."""

import pytest

from tl_lab.lab.exercise.registry import MODULES, PIECES
from tl_lab.lab.exercise.stubs import reference_source
from tl_lab.lab.exercise.tries import cases_for, run_sides, same


@pytest.mark.parametrize("module", MODULES)
def test_every_piece_has_cases_and_a_reference_copy_agrees_on_each(tmp_path, module):
    quals = [p.qualname for p in PIECES[module]]
    assert all(cases_for(module, q) for q in quals), [q for q in quals if not cases_for(module, q)]
    (tmp_path / f"{module}.py").write_text(reference_source(module), encoding="utf-8")
    sides, err = run_sides(module, quals, str(tmp_path / f"{module}.py"), seconds=240)
    assert not err
    bad = []
    for q in quals:
        mine, ref = sides[f"yours:{q}"], sides[f"reference:{q}"]
        assert mine["import_error"] is None and ref["import_error"] is None
        for c, y, r in zip(cases_for(module, q), mine["cases"], ref["cases"]):
            if not same(y, r, c.close):
                bad.append(f"{q}: {c.label}")
    assert not bad, bad


def test_the_command_line_and_the_notebook_api(tmp_path):
    import subprocess
    import sys

    from tl_lab.lab import exercise
    from tl_lab.ops.paths import REPO_ROOT

    (tmp_path / "quant.py").write_text(reference_source("quant"), encoding="utf-8")
    res = exercise.try_piece("quant.unpack_int4", tmp_path)
    assert res.passed and "<table>" in res._repr_html_() and "6 of 6 cases agree" in repr(res)
    p = subprocess.run([sys.executable, "-m", "tl_lab", "exercise", "try", "quant.unpack_int4", "--workspace", str(tmp_path)],
                       cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "6 of 6 cases agree with the reference" in p.stdout


def test_the_learners_side_runs_in_the_sandbox_bounded_in_time(tmp_path):
    """Issue 60: `exercise try` runs the learner's code as untrusted code: through `sandbox.run` (bubblewrap
    where it works: a write outside the workspace fails), and a loop that never ends costs its seconds."""
    from tl_lab.lab.exercise import sandbox
    from tl_lab.lab.exercise.stubs import reference_source
    from tl_lab.lab.exercise.tries import try_piece

    ws = tmp_path / "ws"
    ws.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    src = reference_source("quant")
    head = "def f32_to_f16(x):\n"
    assert src.count(head) == 1
    probe = f"    open({str(outside / 'written')!r}, 'w').close()\n"
    (ws / "quant.py").write_text(src.replace(head, head + probe), encoding="utf-8")
    res = try_piece("quant.f32_to_f16", ws, seconds=60)
    if sandbox.bwrap() is not None:
        assert not (outside / "written").exists()
        assert not res.passed
    (ws / "quant.py").write_text(src.replace(head, head + "    while True:\n        pass\n"), encoding="utf-8")
    res = try_piece("quant.f32_to_f16", ws, seconds=8)
    assert not res.passed and "ran longer than 8 s" in res.note, res
