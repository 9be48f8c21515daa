"""The learner's workspace: a folder of the six modules, imported as tl_lab's own.

Chapter L10.1, "How to work this chapter". With a workspace active, `import tl_lab.<module>` gives
the learner's file, compiled under its own path (tracebacks show the learner's line), through the
same import hook that switches a pitfall in (`tl_lab.lab.switch`). A module whose file is missing, or
still the stub `start` wrote, comes from the reference. `origins()` says where each came from. A
file that is not UTF-8 text fails its own module's import (`NotUtf8Error`: the hook reads UTF-8 only,
a coding declaration is not honoured), never the workspace.

When a workspace is active (the project's own tests never see one unless asked for):
- TL_LAB_WORKSPACE=DIR in the environment of a process (`exercise check` sets it for its pytest runs;
  a learner may set it for `python -m tl_lab generate`, pytest or the lab); TL_LAB_WORKSPACE=off
  (or empty) switches it off;
- `tl_lab.lab.exercise.activate()` in a notebook's first cell: TL_LAB_WORKSPACE when set, else the
  clone's `work/L10.1` when it exists. The clone's root conftest.py sets TL_LAB_WORKSPACE=off when it
  is unset, so every pytest run in the clone (its tests, nbval's notebooks) uses the reference even with work/.
TL_LAB_EXERCISE_USE=kv,quant (set by `exercise check`): only these come from the learner, each
even when untouched; the others from the reference.
"""

from __future__ import annotations

import codecs
import os
import shlex
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from tl_lab.lab.exercise.registry import MODULES
from tl_lab.lab.exercise.stubs import ExerciseError, reference_path, stub_source
from tl_lab.lab.switch import SourceFinder

__all__ = ["ENV", "ENV_USE", "OFF", "Origin", "WorkspaceFinder", "NotUtf8Error", "read_source", "is_stub",
           "default_workspace", "resolve", "usable", "plan", "install", "install_from_env", "refuse_from_env",
           "env_error", "lift_refusal", "origins", "learners_loaded", "active"]

ENV = "TL_LAB_WORKSPACE"
ENV_USE = "TL_LAB_EXERCISE_USE"
OFF = ("", "off", "0", "none")
REPO_ROOT = Path(__file__).resolve().parents[3]  # the clone, this file being tl_lab/lab/exercise/workspace.py


def default_workspace() -> Path:
    """work/L10.1 in the clone (ignored by git: pulling an update never touches it)."""
    return REPO_ROOT / "work" / "L10.1"




def command(*words: str, workspace: str | os.PathLike | None = None, named: bool = False) -> str:
    """A command suggested in the output: `python -m tl_lab exercise WORDS`, with `--workspace DIR` (quoted
    for the shell) when the workspace was `named` by --workspace or is not the default work/L10.1, so a
    copied suggestion acts on the folder the output is about (an instructor grading --workspace learner1,
    never their own work/L10.1). The one builder of the commands tl_lab.lab.exercise suggests."""
    text = " ".join(["python -m tl_lab exercise", *words])
    if workspace is not None and (named or Path(workspace).resolve() != default_workspace().resolve()):
        text += f" --workspace {shlex.quote(str(workspace))}"
    return text
def resolve(workspace: str | os.PathLike | None = None) -> Path:
    """The workspace asked for: `workspace`, else TL_LAB_WORKSPACE (when not off), else the default."""
    if workspace is not None:
        return Path(workspace).expanduser().resolve()
    env = os.environ.get(ENV, "")
    if env.strip().lower() not in OFF:
        return Path(env).expanduser().resolve()
    return default_workspace()


def inside_repo(ws: Path) -> None:
    """ExerciseError when `ws` is the repository, or a folder of it other than `work/` (the package, tests/,
    data/, ...): `reset` and `start` would move or overwrite the repository's own files (issue #61)."""
    try:
        real = Path(os.path.realpath(ws))
    except (OSError, ValueError):
        return
    root = Path(os.path.realpath(REPO_ROOT))
    if real == root or (root in real.parents and not (real.relative_to(root).parts[0] == "work")):
        raise ExerciseError(f"workspace {ws} is inside the repository ({root}), outside its work/ folder: "
                            f"a workspace there would overwrite the repository's files; name a folder of your own")


def usable(ws: Path, write: bool = False) -> Path:
    """`ws` when it is a directory this process can read (and, with `write`, write), else
    ExerciseError in one line naming the folder and what is wrong with it."""
    inside_repo(ws)
    if not ws.exists():

        raise ExerciseError(f"workspace {ws} does not exist: {command('start', workspace=ws)} writes it")
    if not ws.is_dir():
        raise ExerciseError(f"workspace {ws} is a file, not a folder: name a folder (exercise start makes it)")
    if not os.access(ws, os.R_OK | os.X_OK):
        raise ExerciseError(f"workspace {ws} cannot be read (permissions)")
    if write and not os.access(ws, os.W_OK):
        raise ExerciseError(f"workspace {ws} is not writable")
    return ws


@dataclass(frozen=True)
class Origin:
    """Where module `module` comes from: "learner" (the workspace's file) or "reference"; `file`
    the path that is (or will be) compiled; `why` in words."""

    module: str
    origin: str
    file: str
    why: str


def plan(workspace: Path, use=None, instead=None) -> dict[str, Origin]:
    """Where each of the six modules would come from with `workspace` active; `use`: the modules
    to take from the learner (None: every one whose file differs from its stub); `instead`:
    {module: why} the reference runs in the learner's place (`tl_lab.lab.exercise.guard`)."""
    out = {}
    for m in MODULES:
        f = workspace / f"{m}.py"
        ref = str(reference_path(m))
        if instead and m in instead:
            out[m] = Origin(m, "reference", ref, instead[m])
        elif use is not None and m not in use:
            out[m] = Origin(m, "reference", ref, "the reference stands in (not asked for)")
        elif not f.is_file():
            out[m] = Origin(m, "reference", ref, f"no {f.name} in the workspace")
        elif use is None and is_stub(f, m):
            out[m] = Origin(m, "reference", ref, "untouched since start (the stub)")
        else:
            out[m] = Origin(m, "learner", str(f), "the learner's file")
    return out


class NotUtf8Error(SyntaxError):
    """A learner's file that is not UTF-8 text, at the line of its first bad byte. A SyntaxError, so that
    it counts against its module alone, like any module that does not import (`exercise check`'s row, the
    notebooks' trial in `tl_lab.lab.exercise.guard`). The hook's rule, not Python's: Python's own import honours
    a coding declaration (`# -*- coding: latin-1 -*-`) and, on 3.11, lets bad bytes in a comment pass."""


def read_source(f: Path) -> str:
    """The text of learner file `f`, its newlines as `Path.read_text` gives them, a UTF-8 byte order mark
    at its start dropped (older Windows Notepad writes one; Python's import drops it too); NotUtf8Error
    when any byte of it, a comment's included, is not UTF-8: the hook reads UTF-8 only, and does not honour
    a coding declaration. The error's line counts "\r\n", "\r" and "\n" each as one line break, as the
    text's newlines are."""
    from tl_lab.lab.exercise.files import SOURCE_LIMIT, read_regular

    data = read_regular(f, SOURCE_LIMIT)  # a FIFO, a device, a link or a huge file is an OSError, never a hang
    if data.startswith(codecs.BOM_UTF8):
        data = data[len(codecs.BOM_UTF8):]  # not decoded with "utf-8-sig": the error's offsets are the data's
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        before = data[:exc.start]
        line = before.count(b"\n") + before.count(b"\r") - before.count(b"\r\n") + 1
        raise NotUtf8Error(f"not UTF-8 text ({exc.reason})", (str(f), line, None, None)) from None
    return text.replace("\r\n", "\n").replace("\r", "\n")


def is_stub(f: Path, module: str) -> bool:
    """Whether learner file `f` is `module`'s stub, as the hook reads it (`read_source`: a byte order mark
    or other line endings do not make it the learner's)."""
    try:
        return read_source(f) == stub_source(module)
    except NotUtf8Error:  # the stub is UTF-8: this is the learner's, refused where it is imported
        return False


class WorkspaceFinder(SourceFinder):
    """Serves the learner's modules of a workspace from their files (first on sys.meta_path); importing
    one whose file is not UTF-8 raises its NotUtf8Error, and the others are served all the same."""

    def __init__(self, workspace: Path, origins: dict[str, Origin]):
        learner, self.unreadable = {}, {}
        for m, o in origins.items():
            if o.origin != "learner":
                continue
            try:
                learner[f"tl_lab.{m}"] = (o.file, read_source(Path(o.file)))
            except NotUtf8Error as exc:
                self.unreadable[f"tl_lab.{m}"] = exc.args
        super().__init__(learner)
        self.workspace = workspace
        self.origins = origins

    def find_spec(self, fullname, path=None, target=None):
        if fullname in self.unreadable:  # a new error each import: one raised twice would grow its traceback
            raise NotUtf8Error(*self.unreadable[fullname])
        return super().find_spec(fullname, path, target)


def active() -> WorkspaceFinder | None:
    """The workspace hook of this process, or None."""
    return next((f for f in sys.meta_path if isinstance(f, WorkspaceFinder)), None)


def install(workspace: str | os.PathLike, use=None, instead=None) -> WorkspaceFinder:
    """Make `workspace`'s modules tl_lab's in this process, before any of the six is imported
    (`use`, `instead`: as for `plan`)."""
    ws = usable(Path(workspace).expanduser().resolve())
    if (finder := active()) is not None:
        if finder.workspace != ws:
            raise ExerciseError(f"workspace {finder.workspace} is already active in this process")
        return finder
    loaded = [f"tl_lab.{m}" for m in MODULES if f"tl_lab.{m}" in sys.modules]
    origins = plan(ws, use, instead)
    if loaded and any(origins[m.split(".")[1]].origin == "learner" for m in loaded):
        raise ExerciseError(f"{', '.join(loaded)} already imported from the reference: activate the workspace "
                            f"before importing them (in a notebook: restart the kernel, activate in the first cell)")
    finder = WorkspaceFinder(ws, origins)
    sys.meta_path.insert(0, finder)
    return finder


def install_from_env() -> WorkspaceFinder | None:
    """`install` the workspace named by TL_LAB_WORKSPACE (nothing when unset or off), taking
    TL_LAB_EXERCISE_USE's modules when set."""
    env = os.environ.get(ENV, "")
    if env.strip().lower() in OFF:
        return None
    use = os.environ.get(ENV_USE)
    return install(env, None if use is None else {m.strip() for m in use.split(",") if m.strip()})


def _learner_module(name: str) -> bool:
    return name.startswith("tl_lab.") and name.split(".", 1)[1] in MODULES


def refuse_from_env(error: ExerciseError) -> None:
    """A TL_LAB_WORKSPACE that cannot be used (`import tl_lab` caught `error`): importing any of the six
    raises it again (never the reference quietly in the learner's place); the command line reports
    it as one line and exit code 2 (`env_error`)."""
    from tl_lab.lab.switch import RefusingFinder

    env = os.environ.get(ENV, "")
    given = Path(env).expanduser()
    if not given.is_absolute() and not given.exists():  # a notebook's kernel starts in notebooks/, not in the clone
        error = f"{error} (a relative {ENV} is taken from the current folder, {Path.cwd()}: " \
                f"name the workspace by its full path)"
    sys.meta_path.insert(0, RefusingFinder(ExerciseError(f"{ENV}={env}: {error}"), _learner_module))


def env_error() -> ExerciseError | None:
    """The error of a bad TL_LAB_WORKSPACE kept by `import tl_lab`, or None."""
    from tl_lab.lab.switch import refusal

    finder = refusal(ExerciseError)
    return finder.error if finder else None


def lift_refusal() -> None:
    """Forget a bad TL_LAB_WORKSPACE's refusal (a workspace named otherwise, or the reference said aloud)."""
    from tl_lab.lab.switch import refusal

    while (finder := refusal(ExerciseError)) is not None:
        sys.meta_path.remove(finder)


def origins() -> dict[str, dict]:
    """Each of the six modules: {origin, file, why, loaded}, `loaded` the file the imported module
    was really compiled from (None when not imported yet). Without a workspace: all the reference."""
    finder = active()
    planned = finder.origins if finder else {m: Origin(m, "reference", str(reference_path(m)), "no workspace active")
                                             for m in MODULES}
    out = {}
    for m, o in planned.items():
        mod = sys.modules.get(f"tl_lab.{m}")
        out[m] = {**asdict(o), "loaded": getattr(mod, "__file__", None) if mod else None}
    return out


def learners_loaded() -> list[str]:
    """The modules this process imported from the learner's file (`origins`: planned as the learner's,
    and loaded from that file), in the chapter's order: what an error after them may be a wrong answer of."""
    return [m for m, o in origins().items() if o["origin"] == "learner" and o["loaded"] == o["file"]]
