"""tl_lab/ops/pipeline.py: a long prefill as two pipelined stages gives the one step's bits, at the
threshold and past it, for any mix of sequences, and an error in either stage ends the step
promptly with nothing filled."""

import threading

import numpy as np
import pytest

from test_runner import blocks_for, smollm2_shaped, tiny
from tl_lab import forward as forward_module
from tl_lab.ops import pipeline as pipeline_module
from tl_lab.forward import Step, attend_reference
from tl_lab.ops.kernels import GATE, set_threads
from tl_lab.ops.pipeline import PIPELINE_ROWS, pipeline_of, split_step
from tl_lab.runner import EngineConfig, ForwardBatch, ForwardSeq, Int4, KvConfig, ModelRunner


@pytest.fixture
def two_threads(restore_threads):
    """The kernels at 2 threads in this thread for the test (the count before restored after)."""
    import numba

    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.fail("this test needs 2 cores for numba's thread pool")
    assert set_threads(2) == 2


def long_batch(runner, rng, lengths, history=()):
    """A batch of one sequence per length, each after its `history` tokens (0 when not given)
    already in the pool."""
    V, seqs = runner.config.vocab_size, []
    for n, hist in zip(lengths, list(history) + [0] * len(lengths)):
        toks = rng.integers(0, V, size=hist + n).tolist()
        blocks = blocks_for(runner, hist + n)
        if hist:
            runner.forward(ForwardBatch([ForwardSeq(toks[:hist], 0, blocks)]))
        seqs.append(ForwardSeq(toks[hist:], hist, blocks))
    return ForwardBatch(seqs)


def pipelined_and_one_step(runner, batch, monkeypatch):
    """`batch` as the runner runs it, then again from the same pool with pipelining off:
    -> ((logits, pool), (logits, pool), how many steps the first run pipelined)."""
    before, steps = runner.pool.data.copy(), pipeline_of(runner).steps
    piped = runner.forward(batch).data, runner.pool.data.copy()
    ran = pipeline_of(runner).steps - steps
    runner.pool.data[...] = before
    with monkeypatch.context() as m:
        m.setattr(pipeline_module, "PIPELINE_ROWS", 10 ** 9)
        one = runner.forward(batch).data, runner.pool.data.copy()
    return piped, one, ran


def check_pipelined_bits(runner, batch, monkeypatch):
    (z, pool), (z1, pool1), ran = pipelined_and_one_step(runner, batch, monkeypatch)
    lengths = [len(s.tokens) for s in batch.seqs]
    assert ran == 1, f"{lengths}: the step did not run pipelined"
    assert np.array_equal(z, z1), f"{lengths}: the pipelined logits differ from the one step's"
    assert np.array_equal(pool, pool1), f"{lengths}: the pipelined step wrote other K, V bits"


@pytest.mark.parametrize("n", [PIPELINE_ROWS, PIPELINE_ROWS + 1, 301, 511])
def test_a_pipelined_prefill_gives_the_one_steps_logits_and_kv_bit_for_bit(n, two_threads, monkeypatch):
    """A long prefill at 2 threads runs as two stages (`pipeline.pipelined`): the logits and every
    byte of the pool are the one step's, at the threshold, one past it and odd lengths."""
    runner = tiny(n_blocks=64)
    check_pipelined_bits(runner, long_batch(runner, np.random.default_rng(n), [n]), monkeypatch)


def test_a_pipelined_step_of_several_sequences_with_histories_gives_the_one_steps_bits(two_threads, monkeypatch):
    """Every sequence split at its half (a chunk after a history, a decode row wholly in stage B),
    in int4 and f32: the same logits and pool bytes as one step."""
    for runner in (tiny(n_blocks=128), tiny(n_blocks=128, quant=Int4(32))):
        batch = long_batch(runner, np.random.default_rng(5), [301, 40, 1, 3, 77], history=[0, 30, 20, 5, 100])
        check_pipelined_bits(runner, batch, monkeypatch)


def test_a_pipelined_prefill_of_smollm2_shapes_gives_the_one_steps_bits(two_threads, monkeypatch):
    """SmolLM2's shapes (D 64, 3 KV heads, the big head), random weights, two layers."""
    runner = ModelRunner(smollm2_shaped(n_layers=2), EngineConfig(kv=KvConfig(n_blocks=64)))
    check_pipelined_bits(runner, long_batch(runner, np.random.default_rng(7), [PIPELINE_ROWS + 45]), monkeypatch)


@pytest.mark.smollm2
def test_a_pipelined_smollm2_prefill_gives_the_one_steps_bits(two_threads, monkeypatch):
    from conftest import smollm2_path

    runner = ModelRunner.load(smollm2_path(), EngineConfig(kv=KvConfig(n_blocks=64)))
    check_pipelined_bits(runner, long_batch(runner, np.random.default_rng(8), [PIPELINE_ROWS + 1]), monkeypatch)


def test_run_once_pipelined_gives_the_one_steps_hidden_states(two_threads, monkeypatch):
    runner = tiny()
    toks = np.random.default_rng(2).integers(0, 256, size=PIPELINE_ROWS + 33).tolist()
    steps = pipeline_of(runner).steps
    hidden, z = runner.run_once(toks)
    assert pipeline_of(runner).steps == steps + 1
    monkeypatch.setattr(pipeline_module, "PIPELINE_ROWS", 10 ** 9)
    hidden1, z1 = runner.run_once(toks)
    assert hidden.shape == hidden1.shape == (len(toks), 64)
    assert np.array_equal(hidden, hidden1) and np.array_equal(z, z1)


@pytest.mark.parametrize("threads,n,product,pipelined", [
    (2, PIPELINE_ROWS, "invariant", True),
    (2, PIPELINE_ROWS - 1, "invariant", False),
    (1, 511, "invariant", False),
    (2, 511, "plain", False),
])
def test_the_pipeline_runs_for_long_steps_at_two_threads_only(threads, n, product, pipelined, restore_threads):
    runner = tiny(threads=threads, product=product)
    steps = pipeline_of(runner).steps
    runner.last_logits([list(np.arange(n) % 256)])
    assert pipeline_of(runner).steps - steps == int(pipelined)


def test_split_step_halves_every_sequence_and_leaves_a_decode_whole_to_stage_b():
    step = Step.of([(np.arange(5), 3, [0, 1]), (np.arange(1), 9, [2]), (np.arange(4), 0, [3])])
    a, b, rows_a = split_step(step)
    assert a.starts.tolist() == [3, 0] and np.diff(a.offsets).tolist() == [2, 2]
    assert b.starts.tolist() == [5, 9, 2] and np.diff(b.offsets).tolist() == [3, 1, 2]
    assert rows_a.tolist() == [0, 1, 6, 7]
    assert np.array_equal(np.concatenate([a.tokens, b.tokens])[np.argsort(np.r_[rows_a, [2, 3, 4, 5, 8, 9]])],
                          step.tokens)
    assert [t.tolist() for t in b.tables] == [[0, 1], [2], [3]]
    assert split_step(Step.of([(np.arange(1), 4, [0]), (np.arange(1), 2, [1])])) is None


def stage_thread_counts(monkeypatch):
    """Patch the forward's silu to record (thread id, the kernels' count) at every layer."""
    import numba

    seen, silu = [], forward_module.silu

    def recording(x):
        seen.append((threading.get_ident(), numba.get_num_threads()))
        return silu(x)

    monkeypatch.setattr(forward_module, "silu", recording)
    return seen


def test_each_stage_runs_on_one_kernel_thread_and_both_threads_get_their_count_back(two_threads, monkeypatch):
    import numba

    seen, after = stage_thread_counts(monkeypatch), []
    stage = pipeline_module._stage

    def stage_then_count(*args):
        before = numba.get_num_threads()
        try:
            return stage(*args)
        finally:
            after.append((before, numba.get_num_threads(), GATE.before))

    monkeypatch.setattr(pipeline_module, "_stage", stage_then_count)
    runner = tiny()
    runner.last_logits([list(range(PIPELINE_ROWS))])
    assert len({t for t, _ in seen}) == 2, "the layers did not run in two threads"
    assert {n for _, n in seen} == {1}
    assert len(after) == 2 and all(b == a and gate is None for b, a, gate in after), after
    assert numba.get_num_threads() == 2 and GATE.before is None


class Boom(Exception):
    pass


@pytest.mark.parametrize("stage", ["A", "B"])
def test_an_error_in_either_stage_is_raised_and_neither_waits_forever(stage, two_threads, monkeypatch):
    """Stage A raising in its first layer, after its attention (B would wait for A's keys of the
    second layer forever), or stage B raising (A stops too): the forward raises that error,
    promptly, fills no block, and the runner's next long prefill runs pipelined with the one
    step's bits."""
    import numba

    runner = tiny(n_blocks=64)
    caller, calls, silu = {}, {}, forward_module.silu

    def failing(x):
        me = threading.get_ident()
        calls[me] = calls.get(me, 0) + 1
        if calls[me] == 1 and (me == caller["id"]) == (stage == "B"):
            raise Boom(f"stage {stage}")
        return silu(x)

    monkeypatch.setattr(forward_module, "silu", failing)
    batch = long_batch(runner, np.random.default_rng(3), [PIPELINE_ROWS + 10])
    raised = []

    def run():
        caller["id"] = threading.get_ident()
        set_threads(2)
        try:
            runner.forward(batch)
        except BaseException as exc:  # noqa: BLE001 (looked at below)
            raised.append(exc)
        raised.append(numba.get_num_threads())

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(timeout=60)
    assert not worker.is_alive(), "the pipelined forward hung after a stage raised"
    assert len(raised) == 2 and isinstance(raised[0], Boom) and str(raised[0]) == f"stage {stage}", raised
    assert raised[1] == 2, "the calling thread's kernel count was not restored"
    assert all(runner.pool.fill(b) == 0 for b in batch.seqs[0].blocks), "a failed step raised a fill"
    monkeypatch.setattr(forward_module, "silu", silu)
    check_pipelined_bits(runner, batch, monkeypatch)


def test_a_forward_whose_attention_bypasses_the_gate_is_run_again_in_one_step(two_threads, monkeypatch):
    """A learner's own attention (here the numpy reference) never meets `kernels.GATE`: stage B
    could have read A's keys before A wrote them, so the step runs again in one call, with the one
    step's bits, and the runner pipelines no more."""
    monkeypatch.setattr(forward_module.PoolKv, "attend", lambda self, layer, q: attend_reference(self, layer, q))
    runner = tiny(n_blocks=64)
    (z, pool), (z1, pool1), ran = pipelined_and_one_step(
        runner, long_batch(runner, np.random.default_rng(4), [PIPELINE_ROWS + 3]), monkeypatch)
    assert ran == 0 and pipeline_of(runner).off
    assert np.array_equal(z, z1) and np.array_equal(pool, pool1)


def test_a_bypassed_gate_gives_run_once_its_hidden_states_and_turns_the_pipeline_off(two_threads, monkeypatch):
    """The fallback of a forward that bypassed the gate runs the step again as the caller asked,
    hidden states included; from then on the runner's long steps are not split at all."""
    monkeypatch.setattr(forward_module.PoolKv, "attend", lambda self, layer, q: attend_reference(self, layer, q))
    runner = tiny()
    toks = np.random.default_rng(5).integers(0, 256, size=PIPELINE_ROWS + 7).tolist()
    hidden, z = runner.run_once(toks)
    assert pipeline_of(runner).off and pipeline_of(runner).steps == 0
    step = Step.of([(np.asarray(toks), 0, list(range(32)))])
    assert split_step(step) is not None and pipeline_module.pipeline_parts(runner, step) is None
    monkeypatch.setattr(pipeline_module, "PIPELINE_ROWS", 10 ** 9)
    hidden1, z1 = runner.run_once(toks)
    assert hidden.shape == (len(toks), 64) and np.array_equal(hidden, hidden1) and np.array_equal(z, z1)
