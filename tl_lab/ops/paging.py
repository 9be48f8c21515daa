"""Block tables over a KV pool: the arithmetic of section 2.4 and the pool calls every owner of
blocks makes the same way (the runner's temporary blocks, the engine's block manager).

Chapter L10.1, section 2.4: position j of a sequence lives in block table[j // B]. Given code: it
takes any pool with the chapter's interface (`alloc`, `release`, `available`, `fill`, `set_fill`,
`hash_of`, `block_tokens`, `n_blocks`) and imports no learner module.
"""

from __future__ import annotations

from contextlib import contextmanager
from itertools import accumulate
from typing import Iterator

from tl_lab.errors import KvError

__all__ = ["blocks_for", "cacheable", "fill_table", "give_back", "temporary_tables"]


def blocks_for(n_positions: int, block_tokens: int) -> int:
    """Blocks that hold positions 0 .. n-1: ceil(n / B). The one place this division is written."""
    return -(-n_positions // block_tokens)


def cacheable(n_prompt: int, block_tokens: int) -> int:
    """Prompt positions the prefix cache may supply: the full blocks before the last prompt token.

    The last prompt token is always computed, because its logits pick the first new token: a
    P-token prompt looks up at most (P - 1) // B blocks.
    """
    return (n_prompt - 1) // block_tokens * block_tokens


def fill_table(pool, table, start: int, end: int) -> None:
    """Raise the fill of the blocks holding positions start .. end-1 to cover them (a registered
    block is full already and keeps its fill). What the runner does after writing K and V."""
    B = pool.block_tokens
    for j in range(start // B, blocks_for(end, B)):
        b, want = int(table[j]), min(B, end - j * B)
        if pool.hash_of(b) is None and pool.fill(b) < want:
            pool.set_fill(b, want)


def give_back(pool, table: list[int]) -> list[int]:
    """Release one reference to each block of `table`, tail first; -> that order."""
    order = list(reversed(table))
    for b in order:
        pool.release(b)
    return order


@contextmanager
def temporary_tables(pool, lengths) -> Iterator[list[list[int]]]:
    """Block tables for sequences of `lengths` positions (at least one block each), given back
    when the block ends, even on an error. All or nothing: a KvError naming the figures when the
    pool cannot hold them all, and nothing allocated."""
    B = pool.block_tokens
    need = [max(1, blocks_for(n, B)) for n in lengths]
    if sum(need) > pool.available():
        raise KvError(f"{sum(lengths)} positions need {sum(need)} KV blocks of B = {B}; the pool has "
                      f"{pool.available()} available of {pool.n_blocks}")
    ids = pool.alloc(sum(need))
    ends = list(accumulate(need, initial=0))
    tables = [ids[a:b] for a, b in zip(ends, ends[1:])]
    try:
        yield tables
    finally:
        for table in tables:
            give_back(pool, table)  # temporary blocks go back to the pool, every time
