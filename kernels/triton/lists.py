"""Small list helpers of the fused stages, inside one program: membership and order-keeping compaction.

Lists are register vectors of a (request, KV head) row: at most a few hundred
entries, so an [A, B] comparison matrix is cheap and needs no shared-memory
scatter (whose writes to one address from two threads would race).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def contains(values, pool, pool_valid):
    """values [A] in pool [P] (entries where pool_valid is False never match) -> [A] bool."""
    same = (values[:, None] == pool[None, :]) & pool_valid[None, :]
    return tl.max(same.to(tl.int32), axis=1) > 0


@triton.jit
def place(values, position, valid, OUT: tl.constexpr):
    """An [OUT] vector with values[i] at position[i] for each valid i (distinct positions), 0 elsewhere."""
    lanes = tl.arange(0, OUT)
    hit = (position[None, :] == lanes[:, None]) & valid[None, :]
    return tl.sum(tl.where(hit, values[None, :], 0), axis=1)


@triton.jit
def rank_of(valid):
    """Position of each valid entry among the valid ones, in order (meaningless where not valid)."""
    return tl.cumsum(valid.to(tl.int32), axis=0) - 1


@triton.jit
def as_mask(flag, lanes):
    """A scalar flag as a mask over the vector `lanes` (int): Triton's interpreter rejects a scalar flag
    combined with a vector in a load or store mask."""
    return (lanes * 0 + flag.to(tl.int32)) != 0
