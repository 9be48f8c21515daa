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

    from tl_lab import exercise
    from tl_lab.ops.paths import REPO_ROOT

    (tmp_path / "quant.py").write_text(reference_source("quant"), encoding="utf-8")
    res = exercise.try_piece("quant.unpack_int4", tmp_path)
    assert res.passed and "<table>" in res._repr_html_() and "6 of 6 cases agree" in repr(res)
    p = subprocess.run([sys.executable, "-m", "tl_lab", "exercise", "try", "quant.unpack_int4", "--workspace", str(tmp_path)],
                       cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "6 of 6 cases agree with the reference" in p.stdout
