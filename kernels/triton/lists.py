"""Small list helpers of the fused stages, inside one program: membership and order-keeping compaction.

Lists are register vectors of a (request, KV head) row. `contains` and
`place` compare all pairs: an [A, B] matrix, cheap for lists of a few dozen
entries (a window, a CPU list) and needing no scatter. A row or selection as
wide as a long request (resident-first: thousands of blocks) takes
`member_of` and `compacted` instead, linear in the lists: a histogram of
block ids and gathers, which Triton builds in shared memory. `member` picks
one of the two lookups by the histogram's size (sizes.bins_for).
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


@triton.jit
def member_of(values, pool, pool_valid, BINS: tl.constexpr):
    """contains(values, pool, pool_valid) for block ids below BINS - 1 (PAD and other ids never match), in
    O(A + P + BINS): the pool's histogram over the ids, read at the values."""
    pool_in = pool_valid & (pool >= 0) & (pool < BINS - 1)
    counts = tl.histogram(tl.where(pool_in, pool, BINS - 1), BINS)
    values_in = (values >= 0) & (values < BINS - 1)
    return values_in & (tl.gather(counts, tl.where(values_in, values, BINS - 1), 0) > 0)


@triton.jit
def compacted(values, valid, OUT: tl.constexpr):
    """place(values, rank_of(valid), valid, OUT): the valid values in order at 0.., 0 past them, in
    O(N + OUT). Output j is the value at the index where the count of valid entries first reaches j + 1, which is
    the number of entries with at most j valid through them: a histogram of those counts, summed."""
    n: tl.constexpr = values.shape[0]
    through = tl.cumsum(valid.to(tl.int32), axis=0)
    counts = tl.histogram(tl.minimum(through, 2 * OUT - 1), 2 * OUT)
    lanes = tl.arange(0, OUT)
    index = tl.gather(tl.cumsum(counts, axis=0), lanes, 0)
    out = tl.gather(values, tl.minimum(index, n - 1), 0)
    return tl.where(lanes < tl.sum(valid.to(tl.int32), axis=0), out, 0)


@triton.jit
def shifted(values, by, OUT: tl.constexpr):
    """An [OUT] vector with values[i] at i + by (0 <= by), 0 where no value lands."""
    n: tl.constexpr = values.shape[0]
    lanes = tl.arange(0, OUT)
    source = lanes - by
    inside = (source >= 0) & (source < n)
    return tl.where(inside, tl.gather(values, tl.minimum(tl.maximum(source, 0), n - 1), 0), 0)


@triton.jit
def member(values, pool, pool_valid, BINS: tl.constexpr):
    """member_of where the block ids fit a histogram of BINS (> 0), else contains (all pairs)."""
    if BINS > 0:
        found = member_of(values, pool, pool_valid, BINS)
    else:
        found = contains(values, pool, pool_valid)
    return found
