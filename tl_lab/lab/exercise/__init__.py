"""Your turn: the learner writes the six modules of chapter L10.1 and the chapter's tests grade them.

    python -m tl_lab exercise start [MODULE ...]    stubs into the workspace (never overwrites)
    python -m tl_lab exercise tests                 the chapter's catalogue, with your last results
    python -m tl_lab exercise check [MODULE ...]    the graded tests on your code; exit 0 = all pass
    python -m tl_lab exercise parity sampler rng    your sampler and PCG32 against the golden files
    python -m tl_lab exercise try quant.f32_to_f16  one piece alone on its cases, against the reference
    python -m tl_lab exercise hint|status|reset     ... (every command takes --workspace DIR)

The pieces (`registry`), the stubs made from the reference (`stubs`), the import of a workspace
(`workspace`), the graded runs (`grading`, with the pytest `plugin`), the command line (`cli`).
In a notebook: `from tl_lab import exercise; exercise.activate()` in the first cell.
"""

from __future__ import annotations

import os

from tl_lab.lab.exercise.registry import MODULES
from tl_lab.lab.exercise.stubs import ExerciseError
from tl_lab.lab.exercise import side  # noqa: F401 (exercise.side.yours in the notebooks)
from tl_lab.lab.exercise.workspace import active, install, learners_loaded, origins, resolve

__all__ = ["MODULES", "ExerciseError", "activate", "origins", "active", "try_piece"]


def try_piece(piece: str, workspace=None):
    """One piece of your module on its cases against the reference (`exercise try PIECE`): a TryResult
    that shows as a table in a notebook, with `.passed`."""
    from tl_lab.lab.exercise.diagnose import try_piece as run

    return run(piece, workspace)


def activate(workspace=None, quiet: bool = False) -> dict[str, dict]:
    """Make the learner's workspace tl_lab's modules in this process (a section notebook's first cell)
    and return `origins()`. The workspace: `workspace`, else TL_LAB_WORKSPACE, else the clone's
    work/L10.1; with none of those (TL_LAB_WORKSPACE=off, or no work/L10.1) the reference runs. With
    TL_LAB_PITFALL on, work/L10.1 is not taken (the pitfall edits the reference, which runs), and a
    `workspace` named is refused like TL_LAB_WORKSPACE with it (`tl_lab.lab.pitfalls.with_workspace`).
    Each learner module is tried first (`tl_lab.lab.exercise.guard`): one that raises is reported with
    its file, line, error and hint, and the reference runs in its place. A workspace that cannot be
    used is one line, and the reference runs. Prints one line per module unless quiet (the faults
    and a bad workspace always)."""
    from tl_lab.lab.exercise.workspace import ENV, OFF, env_error, lift_refusal, usable

    named = workspace is not None or os.environ.get(ENV, "").strip().lower() not in OFF
    off = workspace is None and os.environ.get(ENV) is not None and not named  # TL_LAB_WORKSPACE=off
    bad = env_error() if workspace is None else None
    pitfall = ",".join(_pitfalls_on())
    if pitfall and workspace is not None:  # TL_LAB_WORKSPACE with it never gets here: `import tl_lab` refused it
        from tl_lab.lab.pitfalls import with_workspace

        bad = with_workspace(pitfall, resolve(workspace))
    lift_refusal()  # said aloud below: the reference runs
    ws = None if bad or off or pitfall else resolve(workspace)
    faults = {}
    try:
        if ws is not None and (named or ws.is_dir()):
            faults = _install_tried(usable(ws), quiet)
    except ExerciseError as exc:
        bad = exc
    out = origins()
    if bad is not None:
        print(f"error: {bad}; this notebook runs the reference's modules (fix it, then restart the kernel)")
    if not quiet:
        print(_one_line(out, pitfall if not bad and not off and resolve().is_dir() else ""))
        from tl_lab.lab.warm import note  # a notebook that will still compile the kernels says so first

        if (cold := note()) is not None:
            print(cold)
    for fault in faults.values():
        print("\n".join(fault.lines()))
    _name_yours_after_a_failed_assert()
    return out


def _one_line(out: dict[str, dict], pitfall: str = "") -> str:
    """What runs, in one line (a notebook's first output): the workspace and which modules are yours;
    `exercise.origins()` has each module's file and why."""
    if pitfall:
        return (f"no workspace: TL_LAB_PITFALL={pitfall} is on, and a pitfall edits the reference, so every "
                f"module is the reference's (your {resolve()} is not used)")
    if active() is None:
        return "no workspace: every module is the reference's (write your own: python -m tl_lab exercise start)"
    yours = [m for m, o in out.items() if o["origin"] == "learner"]
    rest = [m for m in out if m not in yours]
    return (f"workspace {active().workspace}: yours run for {', '.join(yours) or 'no module yet'}"
            + (f"; the reference's for {', '.join(rest)}" if rest else "") + " (exercise.origins() says why)")


def _pitfalls_on() -> tuple[str, ...]:
    """The pitfalls on in this process (TL_LAB_PITFALL; `import tl_lab` imported tl_lab.lab.pitfalls for it)."""
    import sys

    pitfalls = sys.modules.get("tl_lab.lab.pitfalls")
    return pitfalls.active() if pitfalls is not None else ()


def _name_yours_after_a_failed_assert() -> None:
    """In a notebook's kernel: after a cell whose assert fails, or that raised inside tl_lab, name the
    learner's files this notebook runs. The cell's assert has no frame of theirs, so its traceback said
    only "AssertionError:"; an error the engine raises on a learner's wrong answer (a KvError from
    generate.py when their pool miscounts) blamed the engine's configuration, not their file.
    Registered once per kernel (the first cell run again adds nothing)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return
    ip = get_ipython()
    if ip is not None:
        ip.events.register("post_run_cell", _after_cell)


def _after_cell(result) -> None:
    error = getattr(result, "error_in_exec", None)
    if not isinstance(error, Exception):  # none, or the learner's own interrupt of a long cell
        return
    yours = learners_loaded()
    if not yours:
        return
    if isinstance(error, AssertionError):
        what = "the assert above checks what your code answers"
    elif _raised_in_tl_lab(error):
        what = "the error above was raised while tl_lab ran your code, perhaps on a wrong answer of it"
    else:
        return  # the cell's own slip (a name misspelt): nothing of the learner's modules to name
    from tl_lab.lab.exercise.workspace import command

    files, ws = ", ".join(f"{m}.py" for m in yours), active().workspace
    print(f"this notebook runs your {files} (workspace {ws}): {what}; "
          f"{command('check', *yours, workspace=ws)} names the chapter's test")


def _raised_in_tl_lab(error: BaseException) -> bool:
    """Whether the traceback reaches into tl_lab's package or the learner's workspace."""
    from tl_lab.ops.paths import PACKAGE_DIR

    places = (str(PACKAGE_DIR) + os.sep, str(active().workspace) + os.sep)
    tb = error.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename.startswith(places):
            return True
        tb = tb.tb_next
    return False


def _install_tried(ws, quiet: bool) -> dict:
    """Try the learner's modules of `ws` (`guard.trial`), then install the workspace with the reference
    in place of each that raised -> {module: Fault}. Nothing is tried again once one of the six is
    imported in this process (the cell run again): what runs is what was imported, until a restart."""
    import sys

    from tl_lab.lab.exercise import guard
    from tl_lab.lab.exercise.workspace import plan

    if any(f"tl_lab.{m}" in sys.modules for m in MODULES):
        install(ws)  # the same workspace is kept; another one is refused
        if not quiet:
            print("the six were imported earlier in this kernel: restart the kernel to run your edits")
        return {}
    learner = [m for m, o in plan(ws).items() if o.origin == "learner"]
    if learner and not quiet:
        from tl_lab.lab.exercise.guard import TIMEOUT

        print(f"trying your {', '.join(learner)} once before this notebook imports them (up to {TIMEOUT:g} s; "
              f"one that raises or loops is not imported in this kernel) ...", flush=True)
    faults = guard.trial(ws, learner) if learner else {}
    _forget_unused_finder()
    install(ws, instead={m: f"your {m}.py raised when tried: the reference runs in its place" for m in faults})
    return faults


def _forget_unused_finder() -> None:
    """The hook `import tl_lab` installed from TL_LAB_WORKSPACE before the trial's verdict: dropped
    while none of the six is imported, so `install` makes it again with the faults' modules the reference."""
    import sys

    finder = active()
    if finder is not None and not any(f"tl_lab.{m}" in sys.modules for m in MODULES):
        sys.meta_path.remove(finder)
