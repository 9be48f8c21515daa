"""tl_lab/runner.py's batch checks at every limit (issue 62): each range, length and count comparison
tested exactly at its limit, one under and one over, on data/tiny-llama with a pool of 8 blocks of
B = 4 (and max_position_embeddings cut to 12 where the context matters). A refused batch writes nothing.

The comparisons (file:function: the comparison), each pinned by the test named after it:

    runner.py:KvConfig: n_blocks, block_tokens >= 1                      test_config_counts_at_their_floor
    runner.py:EngineConfig: max_batch_tokens, max_seqs, prefill_chunk >= 1 test_config_counts_at_their_floor
    runner.py:EngineConfig: 1 <= threads <= MAX_THREADS                   test_threads_at_their_edges
    runner.py:_check_tokens: toks.size == 0 (at least one token)          test_token_count_at_its_floor
    runner.py:_check_tokens: (toks < 0) | (toks >= vocab_size)            test_token_ids_at_the_vocabulary_edges
    runner.py:_check_tokens: start >= 0 (as_int lo=0)                     test_start_at_its_floor
    runner.py:_check_tokens: end > max_position_embeddings                test_last_position_at_the_context
    runner.py:_check_table: len(table) < blocks_for(end)                  test_table_length_at_what_the_positions_need
    runner.py:_check_table: 0 <= blk < n_blocks                           test_table_entries_at_the_pools_edges
    runner.py:_check_table: held = min(B, start - j*B); fill < held       test_start_at_what_the_blocks_hold
    runner.py:_check_table: j >= start // B (written) vs read             test_a_shared_block_read_or_written_at_the_boundary
    runner.py:_check_table: used = table[:blocks_for(end)]                test_only_the_used_part_of_a_table_counts
    runner.py:_check: empty batch (not seqs)                              test_token_count_at_its_floor
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from refusal import names_all, raises_naming
from tl_lab.errors import BatchError
from tl_lab.model import load_weights
from tl_lab.ops.paths import DATA_DIR
from tl_lab.runner import MAX_THREADS, EngineConfig, ForwardBatch, ForwardSeq, KvConfig, ModelRunner

B = 4
TINY = load_weights(DATA_DIR / "tiny-llama")


def runner(maxpos=None, n_blocks=8) -> ModelRunner:
    w = TINY
    if maxpos is not None:
        w = dataclasses.replace(w, config=dataclasses.replace(w.config, max_position_embeddings=maxpos))
    return ModelRunner(w, EngineConfig(kv=KvConfig(n_blocks=n_blocks, block_tokens=B)))


def batch(*seqs) -> ForwardBatch:
    return ForwardBatch([ForwardSeq(*s) for s in seqs])


def untouched(r: ModelRunner, table) -> bool:
    return all(r.pool.fill(b) == 0 for b in table)


@pytest.mark.parametrize("make, field", [
    (lambda v: KvConfig(n_blocks=v), "KvConfig.n_blocks"),
    (lambda v: KvConfig(block_tokens=v), "KvConfig.block_tokens"),
    (lambda v: EngineConfig(max_batch_tokens=v), "EngineConfig.max_batch_tokens"),
    (lambda v: EngineConfig(max_seqs=v), "EngineConfig.max_seqs"),
    (lambda v: EngineConfig(prefill_chunk=v), "EngineConfig.prefill_chunk"),
])
@pytest.mark.parametrize("value, ok", [(0, False), (1, True), (2, True)])
def test_config_counts_at_their_floor(make, field, value, ok):
    if ok:
        make(value)
    else:
        with raises_naming(ValueError, field, "runner"):
            make(value)


@pytest.mark.parametrize("threads, ok", [(0, False), (1, True), (MAX_THREADS, True), (MAX_THREADS + 1, False)])
def test_threads_at_their_edges(threads, ok):
    """Only the config is built (a runner with 1024 threads would set them for the whole process)."""
    if ok:
        assert EngineConfig(threads=threads).threads == threads
    else:
        with raises_naming(ValueError, "EngineConfig.threads", "runner"):
            EngineConfig(threads=threads)


@pytest.mark.parametrize("n, ok", [(0, False), (1, True), (2, True)])
def test_token_count_at_its_floor(n, ok):
    r = runner()
    table = r.pool.alloc(1)
    if ok:
        assert r.forward(batch((list(range(65, 65 + n)), 0, table))).rows() == 1
    else:
        with raises_naming(BatchError, "seq 0: no tokens", "runner"):
            r.forward(batch(([], 0, table)))
        with raises_naming(BatchError, "empty batch", "runner"):
            r.forward(ForwardBatch([]))
        assert untouched(r, table)


@pytest.mark.parametrize("token, ok", [(-1, False), (0, True), (255, True), (256, False)])
def test_token_ids_at_the_vocabulary_edges(token, ok):
    r = runner()
    table = r.pool.alloc(1)
    if ok:
        z = r.forward(batch(([65, token], 0, table))).row(0)
        assert z.shape == (256,) and np.isfinite(z).all()
    else:
        with raises_naming(BatchError, rf"seq 0: token {token} at index 1 is outside the vocabulary \[0, 256\)", "runner"):
            r.forward(batch(([65, token], 0, table)))
        assert untouched(r, table)


@pytest.mark.parametrize("start, ok", [(-1, False), (0, True), (1, True)])
def test_start_at_its_floor(start, ok):
    r = runner()
    table = r.pool.alloc(1)
    if ok:
        if start:
            r.forward(batch(([65], 0, table)))
        r.forward(batch(([66], start, table)))
        assert r.pool.fill(table[0]) == start + 1
    else:
        with raises_naming(BatchError, "seq 0: start", "runner"):
            r.forward(batch(([66], start, table)))
        assert untouched(r, table)


@pytest.mark.parametrize("n, ok", [(11, True), (12, True), (13, False)])
def test_last_position_at_the_context(n, ok):
    """max_position_embeddings 12: positions 0 .. 11 run; a step reaching position 12 is refused."""
    r = runner(maxpos=12)
    table = r.pool.alloc(4)
    toks = [65] * n
    if ok:
        r.forward(batch((toks, 0, table)))
    else:
        with raises_naming(BatchError, r"seq 0: position 12 is past the context \(max_position_embeddings 12\)", "runner"):
            r.forward(batch((toks, 0, table)))
        assert untouched(r, table)


@pytest.mark.parametrize("n, blocks, ok", [
    (8, 1, False),   # 8 positions need 2 blocks: one short
    (8, 2, True),    # exactly
    (8, 3, True),    # a longer table is allowed
    (9, 2, False),   # one position past the table
    (7, 2, True),
])
def test_table_length_at_what_the_positions_need(n, blocks, ok):
    r = runner()
    table = r.pool.alloc(blocks)
    if ok:
        r.forward(batch(([65] * n, 0, table)))
        assert [r.pool.fill(b) for b in table] == [min(B, max(0, n - j * B)) for j in range(blocks)]
    else:
        with raises_naming(BatchError, rf"seq 0: block table has {blocks} blocks, positions up to {n - 1} need", "runner"):
            r.forward(batch(([65] * n, 0, table)))
        assert untouched(r, table)


@pytest.mark.parametrize("entry, ok", [(-1, False), (0, True), (7, True), (8, False)])
def test_table_entries_at_the_pools_edges(entry, ok):
    """A pool of 8 blocks: ids 0 .. 7 (each in use) are block ids, -1 and 8 are not."""
    r = runner()
    r.pool.alloc(8)
    if ok:
        r.forward(batch(([65], 0, [entry])))
    else:
        with raises_naming(BatchError, rf"seq 0: block table entry 0 = {entry} is not a block id \(n_blocks 8\)", "runner"):
            r.forward(batch(([65], 0, [entry])))


@pytest.mark.parametrize("start, written, ok", [
    (3, 2, False),   # block 0 holds 2 of the 3 positions before start 3: one short
    (3, 3, True),    # exactly what it holds
    (4, 3, False),   # start 4 needs all 4 positions of block 0
    (4, 4, True),    # the block boundary: block 0 full, block 1 empty
    (5, 4, False),   # block 1 must hold position 4
])
def test_start_at_what_the_blocks_hold(start, written, ok):
    r = runner()
    table = r.pool.alloc(2)
    r.forward(batch(([65] * written, 0, table)))
    fills = [r.pool.fill(b) for b in table]
    if ok:
        r.forward(batch(([66], start, table)))
    else:
        with raises_naming(BatchError, rf"seq 0: start {start} is past what its blocks hold", "runner"):
            r.forward(batch(([66], start, table)))
        assert [r.pool.fill(b) for b in table] == fills


@pytest.mark.parametrize("start_b, ok", [
    (B - 1, False),   # seq 1 writes position 3: block 0, which seq 0 reads
    (B, True),        # seq 1 starts on the boundary: block 0 is only read by both
    (B + 1, True),
])
def test_a_shared_block_read_or_written_at_the_boundary(start_b, ok):
    """Two sequences share block 0 (a cached prefix); seq 0 starts at position 4 (block 1, its own)."""
    r = runner()
    shared, own_a, own_b = r.pool.alloc(3)
    r.forward(batch(([65] * start_b, 0, [shared, own_b])))
    r.pool.set_fill(shared, B)  # as if full, so seq 0's start is never the refusal
    r.pool.retain(shared)
    seqs = (([66], B, [shared, own_a]), ([67], start_b, [shared, own_b]))
    if ok:
        assert r.forward(batch(*seqs)).rows() == 2
    else:
        with raises_naming(BatchError, rf"block {shared} is written by seq 1 and also used by seq 0", "runner"):
            r.forward(batch(*seqs))


@pytest.mark.parametrize("n, ok", [(B, True), (B + 1, False)])
def test_only_the_used_part_of_a_table_counts(n, ok):
    """Seq 0's table [a, x] with x also written by seq 1: while seq 0's n positions fit block a, x is
    past its used part and nothing conflicts; one position more and x is written by both."""
    r = runner()
    a, x = r.pool.alloc(2)
    seqs = (([65] * n, 0, [a, x]), ([66], 0, [x]))
    if ok:
        assert r.forward(batch(*seqs)).rows() == 2
    else:
        with raises_naming(BatchError, rf"block {x} is written by seq 0 and also used by seq 1", "runner"):
            r.forward(batch(*seqs))
