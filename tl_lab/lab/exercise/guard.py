"""The notebooks' first cell: each of the learner's modules tried once, the reference in place of one that raises.

Chapter L10.1, "the learner's code runs everywhere the reference runs": a notebook whose learner
module raises must show the learner's error and the hint, and the rest of the notebook must stay
usable. Before a section notebook imports anything of the six, `tl_lab.lab.exercise.activate()` has
`trial` import each of the learner's modules and run it once on the chapter's small cases (a pool's
lifecycle and envelope, the f16 and int4 examples, the hand-example draw, the tiny Llama's forward),
in a fresh process so nothing half-imported stays in the notebook's. A module that raises there
(a SyntaxError, a missing name, a piece still the stub, a bug at call) is a `Fault`: its file and
line, the error, and the hint of the piece it was in; the notebook then runs the reference's module
in its place and says so. A module that runs but answers wrongly stays the learner's: the
notebook's own asserts are what show a wrong answer.

    python -m tl_lab.lab.exercise.guard WORKSPACE MODULE ...   (the trial process; TL_LAB_EXERCISE_USE set)
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from tl_lab.lab.exercise import sandbox
from tl_lab.lab.exercise.workspace import command
from tl_lab.lab.exercise.registry import MODULES, PIECES, SECTIONS
from tl_lab.lab.exercise.stubs import NOT_WRITTEN
from tl_lab.lab.exercise.workspace import ENV, ENV_USE, NotUtf8Error

__all__ = ["Fault", "TRIALS", "trial", "blame", "culprit", "located", "failed", "NotTriedAgain"]

MARK = "tl_lab-guard: "  # the trial's verdict line on stdout (the learner's own prints may come before it)
TIMEOUT = 180.0  # seconds for one trial process: the six modules take a few here; a never-ending loop stops
MESSAGE_CHARS = 300


@dataclass(frozen=True)
class Fault:
    """Module `module` of the learner raised: at `file`:`line` in `function`, `error` ("Type: message"),
    and `hint` (the piece's, from the registry, or the module's section)."""

    module: str
    file: str
    line: int | None
    function: str
    error: str
    hint: str

    @property
    def at(self) -> str:
        """file:line, or the file alone when no line is known."""
        return f"{self.file}:{self.line}" if self.line else self.file

    def sentence(self) -> str:
        """The report in one line (a widget's, the command line's)."""
        return f"your {self.module}.py raised at {self.at} in {self.function}: {self.error}; hint: {self.hint}"

    def lines(self) -> list[str]:
        """The loud report a notebook's first cell prints."""
        check = command("check", self.module, workspace=Path(self.file).parent)
        if self.function == "(its trial)":  # no error of it: it looped, or ended the trial's process
            return [f"!! your {self.module}.py did not finish its trial, so this notebook runs the reference's "
                    f"{self.module} in its place (your file is not imported again in this kernel):",
                    f"   {self.at}: {self.error}",
                    f"   hint: {self.hint}",
                    f"   fix it ({check} says more), then restart the kernel"]
        return [f"!! your {self.module}.py raises, so this notebook runs the reference's {self.module} in its place:",
                f"   {self.at} in {self.function}: {self.error}",
                f"   hint: {self.hint}",
                f"   fix it ({check} says more), then restart the kernel"]


# ------------------------------------------------------------------ the trials (the trial process)


def _kv() -> None:
    from tl_lab.kv import KvCfg, KvPool, prefix_hash

    cfg = KvCfg(n_blocks=4, block_tokens=4, n_layers=1, n_kv_heads=1, head_dim=2)
    pool = KvPool(cfg)
    a, b = pool.alloc(2)
    pool.slab(a, 0, False)[0, 0, :] = 0x3C00
    pool.set_fill(a, 4)
    h = prefix_hash(None, [1, 2, 3, 4])
    pool.register(a, h)
    pool.retain(a)
    envelope = pool.export([a])
    for block in (a, a, b):
        pool.release(block)
    pool.lookup(h)
    pool.stats(), pool.lru(), pool.free_list(), pool.available(), pool.state(a), pool.ref(a), pool.fill(a)
    pool.hash_of(a), pool.alloc(3)
    KvPool(cfg).import_(envelope)


def _quant() -> None:
    import numpy as np

    from tl_lab import quant

    quant.explain_f32_to_f16(1.00048828125), quant.explain_f32_to_bf16(1.00048828125)
    x = np.array([1.0, -2.5, 65520.0, 1e-7], np.float32)
    quant.f16_to_f32(quant.f32_to_f16(x)), quant.bf16_to_f32(quant.f32_to_bf16(x))
    quant.f16_to_f32(quant.f32_to_f16_scalar(0.1)), quant.bf16_to_f32(quant.f32_to_bf16_scalar(0.1))
    quant.unpack_int4(quant.pack_int4(np.array([[4, -7, 0, 2]], np.int8), 1, 4))
    w = np.linspace(-1, 1, 64, dtype=np.float32).reshape(2, 32)
    q = quant.QLinear.quantize(w, 32)
    q.dequantize(), q.forward(np.ones((3, 32), np.float32))


def _sample() -> None:
    import numpy as np

    from tl_lab.sample import PURPOSE_SAMPLE, SamplingParams, sample, stream

    logits = np.array([1.0, 3.0, 2.0, 3.0, -1.0], np.float32)  # section 3's hand example
    params = SamplingParams(temperature=1.0, top_k=3, top_p=0.8, repetition_penalty=1.2, presence_penalty=0.5)
    sample(logits, params, [1], [2, 2], stream(0, PURPOSE_SAMPLE))
    sample(logits, SamplingParams(temperature=0.0), [], [], stream(0, PURPOSE_SAMPLE))


def _model() -> None:
    from tl_lab.model import ModelConfig, load_weights
    from tl_lab.ops.paths import DATA_DIR

    ModelConfig.load(DATA_DIR / "tiny-llama")
    for name in ("tiny-llama", "tiny-llama-int4", "bigram"):
        load_weights(DATA_DIR / name)


def _runner() -> None:
    from tl_lab.ops.paging import blocks_for
    from tl_lab.ops.paths import DATA_DIR
    from tl_lab.runner import EngineConfig, ForwardBatch, ForwardSeq, KvConfig, ModelRunner

    for name in ("tiny-llama", "bigram"):
        runner = ModelRunner.load(DATA_DIR / name, EngineConfig(kv=KvConfig(n_blocks=8, block_tokens=16)))
        blocks = runner.pool.alloc(blocks_for(4, runner.block_tokens))
        runner.forward(ForwardBatch([ForwardSeq([1, 2, 3], 0, blocks)]))
        runner.forward(ForwardBatch([ForwardSeq([4], 3, blocks)]))
        runner.run_once([5, 6])


TRIALS = {"kv": _kv, "quant": _quant, "model": _model, "forward": _runner, "runner": _runner, "sample": _sample}
"""Each module's trial: its public interface on the chapter's small cases (the forward's is the runner's:
the layer runs through ModelRunner). Only that they run is looked at, never what they answer."""


def located(exc: BaseException, workspace: Path) -> tuple[str, str, int | None, str] | None:
    """(module, file, line, function) of the learner's file of `workspace` that `exc` came from: its
    innermost frame in one, or the file a SyntaxError names; None when no learner file is in it."""
    files = {str(workspace / f"{m}.py"): m for m in MODULES}
    found = None
    tb = exc.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        if code.co_filename in files:
            function = "(import)" if code.co_name == "<module>" else code.co_qualname
            found = files[code.co_filename], code.co_filename, tb.tb_lineno, function
        tb = tb.tb_next
    if isinstance(exc, SyntaxError) and exc.filename in files:
        found = files[exc.filename], exc.filename, exc.lineno, "(import)"
    return found


def culprit(exc: BaseException, workspace: Path) -> Fault | None:
    """`blame`'s Fault when `exc` came from a learner's file of `workspace`, else None (the command
    line tells the learner's errors from tl_lab's bugs by it)."""
    where = located(exc, workspace)
    return None if where is None else blame(exc, workspace, where[0])


def blame(exc: BaseException, workspace: Path, tried: str) -> Fault:
    """The Fault for `exc`: in the learner's file of its innermost frame in the workspace (the module
    `tried` when no frame is the learner's), with that piece's hint."""
    module, file, line, function = (located(exc, workspace)
                                    or (tried, str(workspace / f"{tried}.py"), None, "(import)"))
    piece = next((p for p in PIECES[module] if p.qualname == function), None)
    hint = f"{piece.hint} (section {piece.section})" if piece else f"reread {SECTIONS[module]}"
    error = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, NotImplementedError) and NOT_WRITTEN in str(exc):
        hint = "a piece still the stub (its message says what to write)"  # the stub's message has the hint
    if isinstance(exc, NotUtf8Error):
        hint = f"save {Path(file).name} as UTF-8 (the character at line {line})"
        if "null byte" in str(exc):
            hint = f"remove the null byte at line {line} of {Path(file).name}"
    if len(error) > MESSAGE_CHARS:
        error = error[:MESSAGE_CHARS] + " ..."
    return Fault(module, file, line, function, error, f"{hint}; {command('hint', module, workspace=workspace)}")


def _main(argv: list[str]) -> int:
    """The trial process: `tl_lab` has installed the workspace (TL_LAB_WORKSPACE, TL_LAB_EXERCISE_USE);
    try each module asked for, in the chapter's order; print the first Fault (or none) on the last line."""
    sandbox.arm_stack()  # a loop that never ends: its line, for the parent, from the stack dumped before the limit
    workspace, asked = Path(argv[0]), argv[1:]
    verdict = None
    for m in [m for m in MODULES if m in asked]:
        print(f"trying {m}", flush=True)
        try:
            __import__(f"tl_lab.{m}")
            TRIALS[m]()
        except BaseException as exc:  # noqa: BLE001: the learner's code; what it raised (SystemExit too) is the verdict
            verdict = asdict(blame(exc, workspace, m))
            break
    print(MARK + json.dumps(verdict), flush=True)
    return 0


# ------------------------------------------------------------------ the notebook's side


class NotTriedAgain(Exception):
    """The learner's module failed its trial in this process's first cell (it raised, looped or ended the
    trial's process): it is not imported again here, where a loop at its import would hang the kernel."""


_FAILED: dict[str, tuple[str, Fault]] = {}  # learner's file -> (sha256 when tried, its Fault): this process's trials


def _digest(path) -> str | None:
    from tl_lab.lab.exercise.files import SOURCE_LIMIT, read_regular

    try:
        return hashlib.sha256(read_regular(path, SOURCE_LIMIT)).hexdigest()
    except OSError:
        return None


def failed(path) -> Fault | None:
    """The Fault of learner file `path` when its trial in this process failed and the file is still the one
    tried (same sha256), else None: what must not be imported again in this kernel (`side.yours`)."""
    got = _FAILED.get(str(Path(path).resolve()))
    if got is None:
        return None
    digest, fault = got
    return fault if digest is None or _digest(path) in (digest, None) else None


def _one_trial(workspace: Path, modules: list[str]) -> Fault | None:
    from tl_lab.ops.paths import PACKAGE_DIR

    env = {**os.environ, ENV: str(workspace), ENV_USE: ",".join(modules),
           "PYTHONPATH": os.pathsep.join([str(PACKAGE_DIR.parent), *filter(None, [os.environ.get("PYTHONPATH")])])}
    env.pop("TL_LAB_PITFALL", None)
    cmd = [sys.executable, "-m", "tl_lab.lab.exercise.guard", str(workspace), *modules]
    # sandboxed and bounded (issue #61): its whole process group ended, its output capped (was: 1 GB of a
    # learner's prints held in the kernel); numba's cache the one place it writes, as in a check
    cache = sandbox.numba_cache(workspace)
    env.update({"NUMBA_CACHE_DIR": str(cache), "PYTHONDONTWRITEBYTECODE": "1"})
    r = sandbox.run(cmd, workspace=workspace, env=env, timeout=TIMEOUT, writable=[cache], stack=True)
    out, err = r.stdout, r.stderr
    if r.timed_out:
        m = _last_tried(out, modules)
        files = {str(workspace / f"{x}.py"): x for x in MODULES}
        where = sandbox.stuck_at(r.stack, files)  # the line it was looping at (its stack, dumped before the limit)
        file, line = where[:2] if where else (str(workspace / f"{m}.py"), None)
        return Fault(files.get(file, m), file, line, "(its trial)", f"ran longer than {TIMEOUT:g} s",
                     f"a loop that never ends? {command('check', m, workspace=workspace)} names the test")
    # the learner's print(..., end="") may leave the verdict's line begun: look for the mark anywhere in it
    verdict = next((s[s.rindex(MARK) + len(MARK):] for s in reversed(out.splitlines()) if MARK in s), None)
    if verdict is None:  # the process died (the learner's code called exit, or crashed the interpreter)
        m = _last_tried(out, modules)
        tail = (err.strip().splitlines() or ["no output"])[-1][:MESSAGE_CHARS]
        return Fault(m, str(workspace / f"{m}.py"), None, "(its trial)", f"the process ended: {tail}",
                     f"{command('check', m, workspace=workspace)} says more")
    data = json.loads(verdict)
    return None if data is None else Fault(**data)


def _last_tried(out: str, modules: list[str]) -> str:
    """The module the trial process was on when it stopped (its "trying m" lines)."""
    tried = [s.split()[-1] for s in out.splitlines() if s.startswith("trying ")]
    return tried[-1] if tried and tried[-1] in modules else modules[0]


def trial(workspace: Path, modules) -> dict[str, Fault]:
    """Try the learner's `modules` of `workspace` -> {module: Fault} for each that raises, the others
    tried again without it (a fault in kv.py shows up first through the runner too)."""
    left, faults = [m for m in MODULES if m in modules], {}
    while left:
        fault = _one_trial(workspace, left)
        if fault is None:
            break
        if fault.module not in left:  # not one of ours: never loop
            fault = Fault(**{**asdict(fault), "module": left[0]})
        faults[fault.module] = fault
        f = workspace / f"{fault.module}.py"
        _FAILED[str(f.resolve())] = (_digest(f), fault)
        left.remove(fault.module)
    return faults


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
