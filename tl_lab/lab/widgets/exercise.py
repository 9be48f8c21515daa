"""The exercise's check as a widget: the table of `exercise check`, re-run with a button.

Chapter L10.1, "How to work this chapter" (`ol check L10.1`). Pick the modules (all six, or one),
tick --ref-deps if a dependency is not passing yet, press "check": the graded tests run on the
learner's files (`tl_lab.lab.exercise.grading.check`, one pytest subprocess per module) and the table
shows each module's state, passed/total, where its code came from, the first failing chapter test
and the hint. A bad workspace or module is a message, never a traceback.
"""

from __future__ import annotations

import html
import math
import os
from pathlib import Path

import ipywidgets as widgets

from tl_lab.lab.exercise.grading import DEFAULT_TIMEOUT, Row, check
from tl_lab.lab.exercise.registry import MODULES
from tl_lab.lab.exercise.stubs import ExerciseError
from tl_lab.lab.widgets.common import MONO, NOTE, field_style, message

ALL = "all six"
COLOURS = {"passed": "#1e8449", "failed": "#c0392b", "not started": "#555", "blocked": "#b9770e",
           "does not import": "#c0392b", "origin error": "#c0392b", "not run": "#c0392b"}


class CheckPanel(widgets.VBox):
    """Controls: `modules` (Dropdown: all six or one), `ref_deps` (Checkbox), `button` ("check").
    Shown: `table` (HTML). After a check `rows` holds the grading Rows, `message` a refusal ("" when fine)."""

    def __init__(self, workspace, modules: str = ALL, timeout: float = DEFAULT_TIMEOUT):
        self.rows: list[Row] = []
        self.message = self._refused = bad_arguments(workspace, modules, timeout)  # said in the widget, never raised
        self.workspace = Path(workspace) if isinstance(workspace, (str, os.PathLike)) else workspace
        self.timeout = timeout
        self.modules = widgets.Dropdown(options=[ALL, *MODULES], value=modules if modules in (ALL, *MODULES) else ALL,
                                        description="modules", **field_style())
        # width auto: at the default 300 px JupyterLab cuts the description to "--ref-deps (borrow the refer..."
        self.ref_deps = widgets.Checkbox(value=False, description="--ref-deps (borrow the reference for a dependency)",
                                         layout=widgets.Layout(width="auto"))
        self.button = widgets.Button(description="check", button_style="primary")
        self.table = widgets.HTML(message("press check to run the chapter's tests on your code", NOTE))
        self.button.on_click(lambda _: self.run())
        # a table left from another choice of modules would answer a question no longer asked
        for control in (self.modules, self.ref_deps):
            control.observe(lambda _: self._unchecked(), names="value")
        super().__init__([widgets.HBox([self.modules, self.button]), self.ref_deps, self.table])
        if self.message:
            self.table.value = message(self.message)

    def _unchecked(self) -> None:
        self.rows, self.message = [], ""
        self.table.value = message(f"{self.modules.value}: press check to run the chapter's tests on your code", NOTE)

    def run(self) -> list[Row]:
        """Run the check now and redraw the table."""
        asked = None if self.modules.value == ALL else [self.modules.value]
        why = self._refused or bad_arguments(self.workspace, self.modules.value, self.timeout)
        if why:
            self.rows, self.message, self.table.value = [], why, message(why)
            return self.rows
        self.button.disabled, self.table.value = True, message("checking ...", NOTE)
        try:
            if not self.workspace.is_dir():
                raise ExerciseError(f"workspace {self.workspace} does not exist: start the exercise first")
            self.rows = check(self.workspace, asked, ref_deps=self.ref_deps.value, timeout=self.timeout)
            self.message = ""
            self.table.value = table_html(self.rows)
        except ExerciseError as exc:
            self.rows, self.message = [], str(exc)
            self.table.value = message(self.message)
        finally:
            self.button.disabled = False
        return self.rows


def bad_arguments(workspace, modules, timeout) -> str:
    """What is wrong with CheckPanel's arguments in one line ("" when nothing): a workspace that is not a path,
    a module not one of the six, a timeout not a number of seconds above 0 and at most a day."""
    if not isinstance(workspace, (str, os.PathLike)) or not str(workspace):
        return f"workspace must be a folder's path, not {type(workspace).__name__} {str(workspace)[:60]!r}"
    if not isinstance(modules, str) or modules not in (ALL, *MODULES):
        return f"modules must be {ALL!r} or one of {', '.join(MODULES)}, not {str(modules)[:60]!r}"
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not math.isfinite(timeout) \
            or not 0 < timeout <= 86400:
        return f"timeout must be a number of seconds, more than 0 and at most a day (86400), not {str(timeout)[:60]!r}"
    return ""


def table_html(rows: list[Row]) -> str:
    """The rows as an HTML table: module, state, tests, from; the failure and the hint under each."""
    head = "".join(f"<th style='text-align:left;padding:2px 10px'>{h}</th>" for h in ("module", "state", "tests", "from"))
    body = []
    for r in rows:
        uses = ", ".join(f"{m}: {how}" for m, how in r.uses.items()) or "-"
        state = f"<b style='color:{COLOURS.get(r.state, '#000')}'>{html.escape(r.state)}</b>"
        cells = [r.module, state, f"{r.passed}/{r.total}" if r.total else "-", html.escape(uses)]
        body.append("<tr>" + "".join(f"<td style='padding:2px 10px;vertical-align:top'>{c}</td>" for c in cells) + "</tr>")
        detail = [f"first failing: <b>{html.escape(r.first_failure)}</b>"] if r.first_failure else []
        detail += [html.escape(s) for s in r.message.splitlines()]
        detail += [f"hint: {html.escape(r.hint)}"] if r.hint else []
        if detail:
            body.append(f"<tr><td></td><td colspan='3' style='padding:0 10px 6px;color:#444'>{'<br>'.join(detail)}</td></tr>")
    n_ok = sum(r.ok for r in rows)
    return (f"<table class='tl-check' style='{MONO};border-collapse:collapse'><tr>{head}</tr>{''.join(body)}</table>"
            f"<p style='{MONO}'>{n_ok} of {len(rows)} modules pass</p>")
