"""The counting list helpers of the fused stages (kernels/triton/lists.py: member_of, compacted, which wide rows
take) against torch and against the all-pairs helpers they stand in for (contains, place), in one test kernel per
call, over random lists with PAD entries, repeated ids, ids up to the last one the bins take and past it, lists
longer and shorter than each other and than the output."""

import pytest
import torch
from support import requires_triton

from scout_sglang.layout import PAD_BLOCK

pytestmark = [requires_triton, pytest.mark.triton_interpret]

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")
from scout_sglang.kernels.triton.lists import compacted, contains, member_of, place, rank_of  # noqa: E402


@triton.jit
def _lists_kernel(values_ptr, pool_ptr, member_ptr, contains_ptr, compact_ptr, place_ptr,
                  A: tl.constexpr, P: tl.constexpr, OUT: tl.constexpr, BINS: tl.constexpr):
    a = tl.arange(0, A)
    p = tl.arange(0, P)
    o = tl.arange(0, OUT)
    values = tl.load(values_ptr + a)
    pool = tl.load(pool_ptr + p)
    valid = pool != -1
    tl.store(member_ptr + a, member_of(values, pool, valid, BINS).to(tl.int32))
    tl.store(contains_ptr + a, contains(values, pool, valid).to(tl.int32))
    tl.store(compact_ptr + o, compacted(pool, valid, OUT))
    tl.store(place_ptr + o, place(pool, rank_of(valid), valid, OUT))


@pytest.mark.parametrize("length, pool_length, out, seed",
                         [(16, 16, 16, 0), (64, 16, 16, 1), (16, 64, 64, 2), (128, 128, 32, 3), (32, 8, 64, 4)])
def test_the_counting_helpers_equal_torch_and_the_all_pairs_ones(length, pool_length, out, seed):
    gen = torch.Generator().manual_seed(seed)
    bins = 64  # ids 0..62 count; 63 (the histogram's spare bin) and above never match, nor negative ones
    pool = torch.randint(0, bins + 8, (pool_length,), generator=gen, dtype=torch.int32)  # repeats
    pool[torch.rand(pool_length, generator=gen) < 0.3] = PAD_BLOCK
    pool[0] = bins - 2  # the last id the bins take
    values = torch.cat([pool[torch.randint(0, pool_length, (length // 2,), generator=gen)],
                        torch.randint(0, bins + 8, (length - length // 2,), generator=gen, dtype=torch.int32)])
    values[0] = PAD_BLOCK  # a PAD value: never in the pool, whose PAD entries do not count
    outputs = [torch.full((n,), -7, dtype=torch.int32) for n in (length, length, out, out)]
    _lists_kernel[(1,)](values, pool, *outputs, A=length, P=pool_length, OUT=out, BINS=bins)
    member, all_pairs, compact, placed = outputs

    counted = set(pool[(pool >= 0) & (pool < bins - 1)].tolist())
    assert member.tolist() == [int(v in counted) for v in values.tolist()]
    within = (values >= 0) & (values < bins - 1)  # the block ids a table of bins - 1 blocks has
    assert torch.equal(member[within], all_pairs[within])
    kept = pool[pool != PAD_BLOCK][:out]
    expected = torch.zeros(out, dtype=torch.int32)
    expected[: len(kept)] = kept
    assert torch.equal(compact, expected) and torch.equal(placed, expected)
