"""tl_lab/lab/exercise/side.py in this process: the learner's module beside the reference's, an import error
said with its line, where the learner's code raised, the reference against HF.
"""

import codecs
import sys

import pytest

from conftest import workspace
from tl_lab.lab.exercise.stubs import reference_source, stub_source


def test_in_process_side_loads_yours_beside_the_reference(tmp_path, capsys):
    from tl_lab.lab.exercise import side

    ws = tmp_path / "tl_lab" / "work" / "L10.1"  # a clone is often a folder named tl_lab
    ws.mkdir(parents=True)
    assert side.yours("sample", ws) is None  # no file yet
    (ws / "sample.py").write_text(stub_source("sample"), encoding="utf-8")
    assert side.yours("sample", ws) is None  # still the stub
    (ws / "sample.py").write_bytes(codecs.BOM_UTF8 + stub_source("sample").replace("\n", "\r\n").encode())
    assert side.yours("sample", ws) is None  # the stub as Notepad saves it
    (ws / "sample.py").write_text(reference_source("sample") + "\nMINE = 1\n", encoding="utf-8")
    mine, ref = side.yours("sample", ws), side.reference("sample")
    assert mine.__name__ == "tl_lab.lab.exercise.side.yours_sample" and mine.MINE == 1 and sys.modules[mine.__name__] is mine
    assert ref.__name__ == "tl_lab.lab.exercise.side.reference_sample" and not hasattr(ref, "MINE")
    assert mine.__file__ == str(ws / "sample.py") and ref.__file__ == str(side.reference_path("sample"))
    assert side.yours("sample", ws) is not mine  # a fresh module each call
    (ws / "sample.py").write_text("import numpy\n\nx = 1 / 0\n", encoding="utf-8")
    assert side.yours_or_none("sample", ws) is None
    assert "tl_lab.lab.exercise.side.yours_sample" not in sys.modules  # nothing half-imported is kept
    assert capsys.readouterr().out == (f"your sample.py does not import: {ws / 'sample.py'}:3: ZeroDivisionError: "
                                       "division by zero; the reference's is shown alone\n")
    (ws / "sample.py").write_text("def f(:\n", encoding="utf-8")
    assert side.yours_or_none("sample", ws) is None
    said = capsys.readouterr().out
    assert said.startswith(f"your sample.py does not import: {ws / 'sample.py'}:1: SyntaxError: ")
    with pytest.raises(SyntaxError):
        side.yours("sample", ws)  # as it is, from the learner's file
    (ws / "sample.py").write_text("from tl_lab.lab.exercise.side import no_such_name\n", encoding="utf-8")
    assert side.yours_or_none("sample", ws) is None
    assert capsys.readouterr().out.startswith(f"your sample.py does not import: {ws / 'sample.py'}:1: ImportError: ")


def test_a_learner_module_that_does_not_import_is_a_printed_line(tmp_path, capsys):
    from tl_lab.lab.exercise.side import yours_or_none

    ws = workspace(tmp_path, modules=["sample"])
    assert yours_or_none("sample", ws) is None and capsys.readouterr().out == ""  # the stub: nothing yet
    (ws / "sample.py").write_text("x = 1\ndef broken(:\n")
    assert yours_or_none("sample", ws) is None
    assert f"your sample.py does not import: {ws / 'sample.py'}:2: SyntaxError" in capsys.readouterr().out


def test_in_process_side_says_where_yours_raised(tmp_path):
    from tl_lab.lab.exercise import side

    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "sample.py").write_text(reference_source("sample") + "\n\ndef broken():\n    return 1 / 0\n",
                                  encoding="utf-8")
    mine = side.yours("sample", ws)
    try:
        mine.broken()
    except ZeroDivisionError as exc:
        said = side.raised(exc, mine, "sample")
    line = len(reference_source("sample").splitlines()) + 4
    assert said.startswith(f"your sample.py raised at {ws / 'sample.py'}:{line} in broken: ZeroDivisionError: "
                           "division by zero; hint: reread ")


def test_in_process_side_reference_against_hf_is_the_compare_of_the_tiny_llama():
    from tl_lab.lab.compare import hf_golden_cases
    from tl_lab.lab.exercise import side

    got = side._against_hf(16)
    cases = hf_golden_cases()
    assert got["lengths"] == [len(c["tokens"]) for c in cases] and len(got["z"]) == len(cases)
    assert all(e <= b for e, b in zip(got["errors"], got["bounds"]))
    assert [max(abs(a - b) for a, b in zip(z, c["z"])) for z, c in zip(got["z"], cases)] == pytest.approx(got["errors"])


def test_in_process_side_shows_yours_only_from_the_workspace_in_use(tmp_path, monkeypatch):
    """With TL_LAB_WORKSPACE=off the first cell says "every module is the reference's"; a work/L10.1
    in the clone was still loaded as "yours" beside the reference's in the widgets. Now "yours" is the
    file of the workspace this process uses (activate's), and none without one."""
    from types import SimpleNamespace

    from tl_lab.lab.exercise import side, workspace as wsmod

    ws = tmp_path / "work" / "L10.1"
    ws.mkdir(parents=True)
    (ws / "sample.py").write_text(reference_source("sample") + "\nMINE = 1\n", encoding="utf-8")
    monkeypatch.setattr(wsmod, "default_workspace", lambda: ws)
    monkeypatch.setenv("TL_LAB_WORKSPACE", "off")
    assert side.active() is None and side.yours("sample") is None and side.yours_or_none("sample") is None
    other = tmp_path / "other"
    other.mkdir()
    (other / "sample.py").write_text(reference_source("sample") + "\nMINE = 2\n", encoding="utf-8")
    monkeypatch.setattr(side, "active", lambda: SimpleNamespace(workspace=other))  # activate(workspace=other)
    assert side.yours("sample").MINE == 2
    assert side.yours("sample", ws).MINE == 1  # a workspace named is still taken
