"""The learner's module and the reference's side by side in one process (for the widgets).

Chapter L10.1, "the learner's code runs everywhere the reference runs". `tl_lab.<module>` is one
module per process (the workspace's or the reference's); a widget that shows "yours beside the
reference's" needs both: each is loaded from its file under a name of its own
(tl_lab.lab.exercise.side.yours_<module>, ..._reference_<module>), its imports of the given modules
shared with the process. Used for the modules whose own imports are given ones (sample, quant, kv).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

from tl_lab.lab.exercise.stubs import reference_path
from tl_lab.lab.exercise.workspace import active, is_stub, resolve

__all__ = ["load", "yours", "yours_or_none", "reference", "raised", "reference_against_hf"]


def load(path: Path, name: str):
    """Module `name` compiled from `path` (a fresh one each call; registered in sys.modules so its
    dataclasses resolve their module)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def _learner_file(module: str, workspace=None) -> Path | None:
    """The learner's file of `module` in `workspace`, else in the workspace active in this process
    (the one `activate()` took), else None: with TL_LAB_WORKSPACE=off the first cell says "every module
    is the reference's", and a widget must not show a work/L10.1 file as "yours" beside it."""
    if workspace is not None:
        return resolve(workspace) / f"{module}.py"
    finder = active()
    return None if finder is None else finder.workspace / f"{module}.py"


def yours(module: str, workspace=None):
    """The learner's `module` from the workspace, or None while it is missing or still the stub.
    An error inside it (a SyntaxError, a failing import) is raised as it is, from the learner's file."""
    from tl_lab.lab.exercise.guard import NotTriedAgain, failed

    f = _learner_file(module, workspace)
    if f is None or not f.is_file() or is_stub(f, module):
        return None
    if (fault := failed(f)) is not None:  # its trial raised, looped or ended the process: never imported again
        raise NotTriedAgain(f"your {module}.py failed its trial in this kernel's first cell ({fault.at}: "
                            f"{fault.error}), so it is not imported again; fix it, then restart the kernel")
    return load(f, f"{__name__}.yours_{module}")


def reference(module: str):
    """The reference's `module`, loaded from tl_lab's file (whatever tl_lab.<module> is here)."""
    return load(reference_path(module), f"{__name__}.reference_{module}")


def yours_or_none(module: str, workspace=None):
    """`yours`, or None with the learner's error printed (file and line) when their module does not
    import, so a notebook cell that shows it stays usable."""
    from tl_lab.lab.exercise.guard import NotTriedAgain, located

    try:
        return yours(module, workspace)
    except NotTriedAgain as exc:
        print(f"{exc}; the reference's is shown alone")
        return None
    except Exception as exc:  # noqa: BLE001: the learner's code; its error is what to show

        f = _learner_file(module, workspace)
        found = located(exc, f.parent) if f is not None else None
        where = f"{found[1]}:{found[2]}: " if found else ""
        print(f"your {module}.py does not import: {where}{type(exc).__name__}: {exc}; the reference's is shown alone")
        return None


def raised(exc: BaseException, yours_module, module: str) -> str:
    """What a widget shows when the learner's `module` (loaded by `yours`) raised `exc`: one line with
    the learner's file and line, the function, the error and the hint of the piece it was in."""
    from tl_lab.lab.exercise.guard import blame

    file = getattr(yours_module, "__file__", None)
    if not isinstance(file, str):  # yours=object(), a class, a dict: was an AttributeError out of the widget (issue #61)
        return (f"yours= must be your {module} module (tl_lab.lab.exercise.side.yours({module!r})), not "
                f"{type(yours_module).__name__} {str(yours_module)[:60]!r}: {type(exc).__name__}: {str(exc)[:200]}")
    return blame(exc, Path(file).parent, module).sentence()


def reference_against_hf(block_tokens: int = 16) -> dict:
    """`tl_lab.lab.compare.against_hf` of the reference's runner on the tiny Llama, with each case's
    logits ("z": lists of floats). Run in a fresh process without the workspace: in this one
    tl_lab.forward, runner and model may be the learner's, and their imports are each other's
    (the forward cannot be loaded twice side by side as the sampler can)."""
    from tl_lab.lab.exercise.workspace import ENV
    from tl_lab.ops.paths import PACKAGE_DIR

    env = {**os.environ, ENV: "off",
           "PYTHONPATH": os.pathsep.join([str(PACKAGE_DIR.parent), *filter(None, [os.environ.get("PYTHONPATH")])])}
    env.pop("TL_LAB_PITFALL", None)
    code = f"import json, tl_lab.lab.exercise.side as s; print(json.dumps(s._against_hf({int(block_tokens)})))"
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600, check=False)
    if p.returncode != 0:
        raise RuntimeError(f"the reference's run against HF failed: {(p.stderr.strip().splitlines() or ['?'])[-1]}")
    return json.loads(p.stdout)


def _against_hf(block_tokens: int) -> dict:
    from tl_lab.lab.compare import against_hf, hf_golden_cases
    from tl_lab.ops.paths import DATA_DIR
    from tl_lab.runner import EngineConfig, KvConfig, ModelRunner

    runner = ModelRunner.load(DATA_DIR / "tiny-llama", EngineConfig(kv=KvConfig(n_blocks=96, block_tokens=block_tokens)))
    cases = hf_golden_cases()
    out = against_hf(runner, cases)
    out["z"] = [runner.run_once(c["tokens"])[1].tolist() for c in cases]
    return out
