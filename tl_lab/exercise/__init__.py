"""Your turn: the learner writes the six modules of chapter L10.1 and the chapter's tests grade them.

    python -m tl_lab exercise start [MODULE ...]    stubs into the workspace (never overwrites)
    python -m tl_lab exercise tests                 the chapter's catalogue, with your last results
    python -m tl_lab exercise check [MODULE ...]    the graded tests on your code; exit 0 = all pass
    python -m tl_lab exercise parity sampler rng    your sampler and PCG32 against the golden files
    python -m tl_lab exercise hint|status|reset     ... (every command takes --workspace DIR)

The pieces (`registry`), the stubs made from the reference (`stubs`), the import of a workspace
(`workspace`), the graded runs (`grading`, with the pytest `plugin`), the command line (`cli`).
In a notebook: `from tl_lab import exercise; exercise.activate()` in the first cell.
"""

from __future__ import annotations

from tl_lab.exercise.registry import MODULES
from tl_lab.exercise.stubs import ExerciseError
from tl_lab.exercise import side  # noqa: F401 (exercise.side.yours in the notebooks)
from tl_lab.exercise.workspace import active, install, origins, resolve

__all__ = ["MODULES", "ExerciseError", "activate", "origins", "active"]


def activate(workspace=None, quiet: bool = False) -> dict[str, dict]:
    """Make the learner's workspace tl_lab's modules in this process (a notebook's first cell) and
    return `origins()`. The workspace: `workspace`, else TL_LAB_WORKSPACE, else the clone's
    work/L10.1; with none of those (TL_LAB_WORKSPACE=off, or no work/L10.1) the reference runs.
    Prints one line per module unless quiet."""
    import os

    from tl_lab.exercise.workspace import ENV, OFF

    off = workspace is None and os.environ.get(ENV) is not None and os.environ[ENV].strip().lower() in OFF
    ws = None if off else resolve(workspace)
    if ws is not None and ws.is_dir():
        install(ws)
    out = origins()
    if not quiet:
        where = "no workspace: every module is the reference's" if active() is None else f"workspace {active().workspace}"
        print(where)
        for m, o in out.items():
            print(f"  {m:<8} {o['origin']:<9} {o['file']}  ({o['why']})")
    return out
