"""The linear list helpers of the fused stages (kernels/triton/lists.py: member_of, compacted, shifted) against
torch and against the all-pairs helpers they stand in for (contains, place), in one test kernel per call, over
random lists with PAD entries, ids up to the last one the bins take, and lists longer and shorter than the output."""

import pytest
import torch
from support import requires_triton

from scout_sglang.layout import PAD_BLOCK

pytestmark = [requires_triton, pytest.mark.triton_interpret]

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")
from scout_sglang.kernels.triton.lists import compacted, contains, member_of, place, rank_of, shifted  # noqa: E402


@triton.jit
def _lists_kernel(values_ptr, pool_ptr, by, member_ptr, contains_ptr, compact_ptr, place_ptr, shift_ptr,
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
    tl.store(shift_ptr + o, shifted(pool, by, OUT))


@pytest.mark.parametrize("length, out, seed", [(16, 16, 0), (64, 16, 1), (16, 64, 2), (128, 128, 3)])
def test_the_linear_helpers_equal_torch_and_the_all_pairs_ones(length, out, seed):
    gen = torch.Generator().manual_seed(seed)
    bins = 64  # ids 0..62 count; 63 (the histogram's spare bin) and above never match
    pool = torch.randint(0, bins + 8, (length,), generator=gen, dtype=torch.int32)
    pool[torch.rand(length, generator=gen) < 0.3] = PAD_BLOCK
    pool[0] = bins - 2  # the last id the bins take
    values = torch.cat([pool[torch.randperm(length, generator=gen)][: length // 2],
                        torch.randint(-1, bins + 8, (length - length // 2,), generator=gen, dtype=torch.int32)])
    by = int(torch.randint(0, out, (1,), generator=gen))
    outputs = [torch.full((n,), -7, dtype=torch.int32) for n in (length, length, out, out, out)]
    _lists_kernel[(1,)](values, pool, by, *outputs, A=length, P=length, OUT=out, BINS=bins)
    member, all_pairs, compact, placed, shift = outputs

    countable = set(pool[(pool >= 0) & (pool < bins - 1)].tolist())
    assert member.tolist() == [int(v in countable) for v in values.tolist()]
    in_range = (values >= 0) & (values < bins - 1)  # within the bins, the same as contains
    assert torch.equal(member[in_range], all_pairs[in_range])

    kept = pool[pool != PAD_BLOCK][:out]
    expected = torch.zeros(out, dtype=torch.int32)
    expected[: len(kept)] = kept
    assert torch.equal(compact, expected) and torch.equal(placed, expected)

    expected = torch.zeros(out, dtype=torch.int32)
    span = max(min(length, out - by), 0)
    expected[by: by + span] = pool[:span]
    assert torch.equal(shift, expected)
