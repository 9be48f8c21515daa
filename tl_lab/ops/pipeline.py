"""A long prefill as two pipelined stages on two Python threads: engineering around the learner's
runner and forward (chapter L10.1, section 2.4, going further), not a piece a learner writes.

Why: at 2 kernel threads a long prefill spent a large share of its time in the forward's numpy (the
norms, RoPE, SwiGLU, the KV write) on one core while the other idled. Two stages, each sequence's
first half (A) and the rest (B), each on half the kernel threads (numba's count is per Python
thread), overlap one stage's numpy with the other's kernels (the parallel kernels release the GIL,
nogil). SmolLM2's 512-token prefill at 2 threads on processor E (AMD EPYC, znver4), 6 interleaved
rounds: f32 550 -> 647 tokens/s, int4 603 -> 661.

The bits are the one step's: stage B's attention of layer l waits at `kernels.GATE` (the hook just
before `attend_paged` reads the pool) for A's keys and values of layer l, and a query's bits depend
only on its own sequence's keys (batch invariance), so B's logits (the step's last rows) and the
hidden states (A's rows and B's, put back in step order) are those of one call. A forward whose
attention never meets the gate (a learner's own) could have read keys A had not written: that step
runs again in one call and the runner pipelines no more.
"""

from __future__ import annotations

import threading
import weakref

import numba
import numpy as np

from tl_lab.ops.kernels import GATE
from tl_lab.ops.products import Scratch

PIPELINE_ROWS = 256
"""The fewest rows of a step run as a pipelined prefill (`pipelined`)."""


def run_step(runner, step, hidden: bool, one_call, llama_forward=None):
    """The step pipelined when `pipeline_parts` says so, else `one_call(runner, step, hidden)` (the
    runner's `_run_llama`, also the fallback of `pipelined`). step: the forward's Step;
    llama_forward: the forward's function each stage calls (passed in: ops imports no learner module);
    None (a runner written before it was passed) runs every step in one call, the same bits."""
    parts = None if llama_forward is None else pipeline_parts(runner, step)
    if parts is None:
        return one_call(runner, step, hidden)
    return pipelined(runner, step, parts, hidden, one_call, llama_forward)


class Pipeline:
    """A runner's pipelined prefills: each stage's own Scratch (the runner's is one thread's),
    `steps` run pipelined, and `off` once a forward's attention bypassed the gate (see `pipelined`)."""

    def __init__(self) -> None:
        self.scratch = (Scratch(), Scratch())
        self.steps = 0
        self.off = False


_PIPELINES = weakref.WeakKeyDictionary()  # runner -> its Pipeline (not set in __init__: a learner's piece)


def pipeline_of(runner) -> Pipeline:
    return _PIPELINES.setdefault(runner, Pipeline())


def pipeline_parts(runner, step) -> tuple | None:
    """`split_step(step)` when the step should run pipelined: at least PIPELINE_ROWS rows, two
    kernel threads or more in force, the invariant product (a BLAS product's bits follow the
    shapes, and its threads are not numba's); else None."""
    if len(step.tokens) < PIPELINE_ROWS or runner.product != "invariant" or numba.get_num_threads() < 2:
        return None
    return None if pipeline_of(runner).off else split_step(step)


def split_step(step) -> tuple | None:
    """Stage A's step (the first half of every sequence of two rows or more), stage B's (the rest:
    every sequence, from where A's part of it ends, so B's last rows are the step's) and the rows
    of `step` that A holds, (N_A,) in step order; None when A would be empty (a step of decodes).
    The steps are built directly: `_check` checked the batch as a whole, and would refuse B, whose
    first blocks A has not filled yet."""
    a, b, rows_a = [], [], []
    for s in range(step.n_seqs):
        r, start, table = step.rows(s), int(step.starts[s]), step.tables[s]
        h = (r.stop - r.start) // 2
        if h:
            a.append((step.tokens[r.start : r.start + h], start, table))
            rows_a.append(np.arange(r.start, r.start + h))
        b.append((step.tokens[r.start + h : r.stop], start + h, table))
    return (type(step).of(a), type(step).of(b), np.concatenate(rows_a)) if a else None


class _Abandoned(Exception):
    """A stage stopped because the other one raised (that error is the one re-raised)."""


class Handoff:
    """Where stage B waits for stage A, layer by layer (the hook is `kernels.GATE`, called just
    before a step's attention reads the pool). ready[l]: set by A just before its attention of
    layer l, when A's keys and values of layer l are in the pool; B waits for it before its own
    attention of layer l. errors: what either stage raised, the first one real (a stage that sees
    an error stops at its next attention, `_Abandoned`); seen: the layers B waited for."""

    def __init__(self, n_layers: int) -> None:
        self.ready = [threading.Event() for _ in range(n_layers)]
        self.errors: list[BaseException] = []
        self.seen: set[int] = set()

    def a_reached(self, layer: int) -> None:
        self._stop_if_failed()
        self.ready[layer].set()

    def b_waits(self, layer: int) -> None:
        self.ready[layer].wait()
        self._stop_if_failed()
        self.seen.add(layer)

    def fail(self, exc: BaseException) -> None:
        self.errors.append(exc)
        self.release()

    def release(self) -> None:
        """Every layer ready: B never waits for a layer A will not reach."""
        for event in self.ready:
            event.set()

    def _stop_if_failed(self) -> None:
        if self.errors:
            raise _Abandoned("the other stage of the pipelined prefill raised")


def pipelined(runner, step, parts, hidden: bool, one_call, llama_forward):
    """The step as two stages on two Python threads: the learner's `llama_forward` on A's rows in a
    helper thread and on B's in this one, each on half the kernel threads, B's attention of layer l
    after A's keys of layer l (`Handoff`). -> what `one_call` would return, the same bits (the
    module's docstring says why); a forward that never met the gate is run again by `one_call`."""
    a, b, rows_a = parts
    n, pipe, hand = numba.get_num_threads(), pipeline_of(runner), Handoff(len(runner.weights.layers))
    out = {}

    def stage_a():
        try:
            out["a"] = _stage(llama_forward, runner, a, hand.a_reached, n // 2, pipe.scratch[0], hidden)
        except BaseException as exc:  # noqa: BLE001 (re-raised by the caller's thread)
            hand.fail(exc)
        finally:
            hand.release()

    worker = threading.Thread(target=stage_a, name="tl_lab prefill stage A", daemon=True)
    worker.start()
    try:
        out["b"] = _stage(llama_forward, runner, b, hand.b_waits, n - n // 2, pipe.scratch[1], hidden)
    except BaseException as exc:  # noqa: BLE001 (A stops at its next attention; re-raised below)
        hand.fail(exc)
    _join(worker, hand)
    if hand.errors:
        raise hand.errors[0]
    if len(hand.seen) < len(hand.ready):
        pipe.off = True
        return one_call(runner, step, hidden)
    pipe.steps += 1
    if not hidden:
        return out["b"]
    (_, hidden_a), (logits, hidden_b) = out["a"], out["b"]
    return logits, _rejoin(len(step.tokens), rows_a, hidden_a, hidden_b)


def _stage(llama_forward, runner, step, gate, threads: int, scratch: Scratch, hidden: bool):
    """One stage's forward on this Python thread at `threads` kernel threads, `gate` its hook
    before each attention; the thread's count and hook restored after."""
    before = numba.get_num_threads()
    numba.set_num_threads(threads)
    GATE.before = gate
    try:
        return llama_forward(runner.weights, step, runner.pool.data, product=runner.product,
                                     scratch=scratch, return_hidden=hidden)
    finally:
        GATE.before = None
        numba.set_num_threads(before)


def _join(worker: threading.Thread, hand: Handoff) -> None:
    """Wait for stage A; interrupted (Ctrl-C), tell it to stop at its next attention and wait for
    that, so nothing writes into the pool once the step has ended."""
    try:
        worker.join()
    except BaseException as exc:
        hand.fail(exc)
        worker.join()
        raise


def _rejoin(n: int, rows_a: np.ndarray, part_a: np.ndarray, part_b: np.ndarray) -> np.ndarray:
    """The step's (n, d) rows from A's (N_A, d), which go to rows_a, and B's, which fill the rest
    (both parts in step order)."""
    in_a = np.zeros(n, dtype=bool)
    in_a[rows_a] = True
    whole = np.empty((n, part_a.shape[1]), dtype=part_a.dtype)
    whole[in_a], whole[~in_a] = part_a, part_b
    return whole
