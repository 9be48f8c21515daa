"""tl_lab/lab/widgets/exercise.py: the check table as a widget, re-run with its button."""

from conftest import shown_text as plain
import pytest
from tl_lab.lab.exercise.cli import start
from tl_lab.lab.exercise.grading import Row
from tl_lab.lab.exercise.stubs import reference_source
from tl_lab.lab.widgets import exercise
from tl_lab.lab.widgets.common import NOTE
from tl_lab.lab.widgets.exercise import CheckPanel, table_html


def test_the_check_panel_runs_the_check_and_redraws_on_each_press(tmp_path):
    ws = tmp_path / "ws"
    start(ws, ["sample", "kv"])
    panel = CheckPanel(ws)
    panel.modules.value = "sample"
    panel.button.click()
    assert [(r.module, r.state) for r in panel.rows] == [("sample", "not started")]
    assert "not started" in panel.table.value and "0 of 1 modules pass" in panel.table.value
    (ws / "sample.py").write_text(reference_source("sample"))
    panel.button.click()
    assert [(r.module, r.state, r.passed, r.total) for r in panel.rows] == [("sample", "passed", 7, 7)]
    assert "1 of 1 modules pass" in panel.table.value and not panel.button.disabled


def test_a_missing_workspace_is_a_message(tmp_path):
    panel = CheckPanel(tmp_path / "nowhere")
    panel.button.click()
    assert panel.rows == [] and "does not exist" in panel.message and "does not exist" in panel.table.value


def test_another_pick_clears_the_table_it_no_longer_answers(tmp_path):
    ws = tmp_path / "ws"
    start(ws, ["sample"])
    panel = CheckPanel(ws, modules="sample")
    panel.button.click()
    assert panel.rows and "0 of 1 modules pass" in panel.table.value
    panel.modules.value = "kv"
    assert panel.rows == [] and panel.message == "" and "kv: press check" in panel.table.value
    panel.button.click()
    assert [r.module for r in panel.rows] == ["kv"]
    panel.ref_deps.value = True
    assert panel.rows == [] and "press check" in panel.table.value


def test_a_new_panel_asks_for_a_check_as_a_note(tmp_path):
    panel = CheckPanel(tmp_path)
    assert panel.rows == [] and panel.message == ""
    assert "press check" in plain(panel.table.value) and f"color:{NOTE}" in panel.table.value  # not an error


def test_while_the_check_runs_its_button_is_off_and_a_refusal_is_forgotten_after(tmp_path, monkeypatch):
    """A press while a check runs would start a second one: the button is off until the check ends."""
    panel = CheckPanel(tmp_path / "ws", modules="sample")
    panel.button.click()
    assert "does not exist" in panel.message
    seen = []

    def check(workspace, asked, ref_deps, timeout):
        seen.append((panel.button.disabled, panel.table.value, asked))
        return [Row("sample", "passed", "sample.py", passed=7, total=7)]

    monkeypatch.setattr(exercise, "check", check)
    (tmp_path / "ws").mkdir()
    panel.button.click()
    (disabled, shown, asked), = seen
    assert disabled and plain(shown) == "checking ..." and f"color:{NOTE}" in shown and asked == ["sample"]
    assert not panel.button.disabled and panel.message == "" and "1 of 1 modules pass" in panel.table.value


def test_the_table_shows_each_modules_row_and_its_details_and_nothing_else():
    """Tests '-' where none ran; the failure, the message's lines and the hint under a row that has them."""
    rows = [Row("sample", "passed", "sample.py", uses={"sample": "learner"}, passed=7, total=7),
            Row("kv", "failed", "kv.py", uses={"kv": "learner", "sample": "reference (--ref-deps)"}, passed=3,
                total=9, first_failure="test_kv_append", message="assert 1 == 2\nat kv.py:12", hint="exercise hint kv"),
            Row("blocks", "does not import", "blocks.py")]
    assert plain(table_html(rows)) == (
        "module state tests from "
        "sample passed 7/7 sample: learner "
        "kv failed 3/9 kv: learner, sample: reference (--ref-deps) "
        "first failing: test_kv_append assert 1 == 2 at kv.py:12 hint: exercise hint kv "
        "blocks does not import - - "
        "1 of 3 modules pass")


def test_bad_arguments_are_a_message_in_the_panel_never_raised(tmp_path, monkeypatch):
    """Issue #61: CheckPanel("str").run() was an AttributeError; timeout=nan or -1 was taken as no limit."""
    from tl_lab.lab.widgets import exercise as panel_module

    monkeypatch.setattr(panel_module, "check", lambda *a, **k: pytest.fail("checked with bad arguments"))
    for kwargs, says in [({"workspace": object()}, "workspace must be a folder's path"),
                         ({"workspace": tmp_path, "timeout": float("nan")}, "timeout must be a number of seconds"),
                         ({"workspace": tmp_path, "timeout": -1}, "timeout must be"),
                         ({"workspace": tmp_path, "timeout": 1e10}, "at most a day"),
                         ({"workspace": tmp_path, "timeout": "9"}, "timeout must be"),
                         ({"workspace": tmp_path, "modules": "kvv"}, "modules must be")]:
        p = CheckPanel(**kwargs)
        assert says in p.message and says in plain(p.table.value)
        assert p.run() == [] and says in p.message and len(p.message) < 200
    p = CheckPanel(str(tmp_path / "missing"))  # a str is a path
    assert p.run() == [] and "does not exist" in p.message
