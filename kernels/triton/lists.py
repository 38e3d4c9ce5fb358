"""Small list helpers of the fused stages, inside one program: membership and order-keeping compaction.

Lists are register vectors of a (request, KV head) row. `contains` and
`place` compare all pairs: an [A, B] matrix, cheap for the lists of a sparse
row (a few hundred entries at most), and needing no shared-memory scatter
(whose writes to one address from two threads would race). A row or selection
as wide as a long request (resident-first: thousands of blocks) would make
that matrix millions of elements, which Triton refuses; there `member` and
`compact` count instead: a histogram of block ids read at the values
(`member_of`), a histogram of a list's running count (`compacted`). Triton
builds a histogram with warp ballots, each thread counting its share of the
bins for every value, so its code and time grow as values x bins / 32: far
less than all pairs, yet not free (benchmarks/results/kernel_widths.md; sorting
both lists took four to nine times the code). The kernels pick by a constexpr
WIDE (sizes.wide_lists), so a sparse row's code is the all-pairs code.
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
def member(values, pool, pool_valid, WIDE: tl.constexpr, BINS: tl.constexpr):
    """contains, or for WIDE lists whose ids fit BINS (> 0), member_of."""
    if WIDE and BINS > 0:
        found = member_of(values, pool, pool_valid, BINS)
    else:
        found = contains(values, pool, pool_valid)
    return found


@triton.jit
def compact(values, valid, OUT: tl.constexpr, WIDE: tl.constexpr):
    """place(values, rank_of(valid), valid, OUT), or compacted for WIDE lists."""
    if WIDE:
        out = compacted(values, valid, OUT)
    else:
        out = place(values, rank_of(valid), valid, OUT)
    return out
