"""tl_lab/widgets/exercise.py: the check table as a widget, re-run with its button."""

from tl_lab.exercise.cli import start
from tl_lab.exercise.stubs import reference_source
from tl_lab.widgets.exercise import CheckPanel


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
    assert panel.rows == [] and "kv: press check" in panel.table.value
    panel.button.click()
    assert [r.module for r in panel.rows] == ["kv"]
    panel.ref_deps.value = True
    assert panel.rows == [] and "press check" in panel.table.value
