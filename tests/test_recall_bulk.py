"""Bulk recall (scout_sglang.core.recall) against the oracle's per-row policy, and the row copies it issues.

The bulk version decides every (request, KV head) of a batch with tensor ops;
tests/oracle/policy.py states the rule one row at a time in plain Python. They
must agree on random rows, with and without scores, and the copy lists must
move exactly the blocks that entered.
"""

from __future__ import annotations

import random

import pytest
import torch

from scout_sglang import kernels
from scout_sglang.core import recall
from scout_sglang.layout import PAD_BLOCK
from oracle import policy

NUM_BLOCKS = 40


def random_rows(rng: random.Random, batch, heads, slots, width):
    resident, candidates, selected = [], [], []
    for _ in range(batch * heads):
        blocks = rng.sample(range(NUM_BLOCKS), slots + width + 6)
        row = [b if rng.random() < 0.7 else PAD_BLOCK for b in blocks[:slots]]
        chosen = rng.sample(blocks, 8)
        cands = [b for b in rng.sample(blocks, width) if rng.random() < 0.8]
        cands += [PAD_BLOCK] * (width - len(cands))
        resident.append(row)
        candidates.append(cands)
        selected.append(chosen)
    shape = (batch, heads, -1)
    return (torch.tensor(resident, dtype=torch.int32).view(shape), torch.tensor(candidates, dtype=torch.int32).view(shape),
            torch.tensor(selected, dtype=torch.int32).view(shape))


@pytest.mark.parametrize("with_scores", [False, True])
def test_bulk_bring_in_equals_the_row_by_row_policy(with_scores):
    rng = random.Random(7)
    for trial in range(20):
        resident, candidates, selected = random_rows(rng, batch=3, heads=2, slots=5, width=6)
        scores = torch.randn(3, 2, NUM_BLOCKS, generator=torch.Generator().manual_seed(trial)) if with_scores else None
        if scores is not None and trial % 2:
            scores = scores.round()  # ties: the lower slot goes first
        decision = recall.bring_in(resident, candidates, selected, scores, capacity=10**6)
        for b in range(3):
            for h in range(2):
                expected = policy.bring_in(resident[b, h].tolist(), [c for c in candidates[b, h].tolist() if c != PAD_BLOCK],
                                           set(selected[b, h].tolist()), None if scores is None else scores[b, h])
                assert decision.resident[b, h].tolist() == expected, f"trial {trial} row {b},{h}"


def test_a_capacity_bounds_the_moves_in_batch_order_and_the_map_shows_only_those():
    rng = random.Random(3)
    resident, candidates, selected = random_rows(rng, batch=4, heads=2, slots=4, width=5)
    unbounded = recall.bring_in(resident, candidates, selected, None, capacity=10**6)
    total = int(unbounded.applied.sum())
    assert total > 6
    bounded = recall.bring_in(resident, candidates, selected, None, capacity=6)
    assert int(bounded.applied.sum()) == 6
    flat = unbounded.applied.flatten().nonzero().flatten()[:6]  # the first six moves, (request, head, candidate) order
    assert bounded.applied.flatten().nonzero().flatten().tolist() == flat.tolist()
    moved_in = (bounded.resident != resident).sum()
    assert int(moved_in) == 6


def test_copy_lists_move_exactly_the_blocks_that_entered_and_nothing_else():
    rng = random.Random(5)
    batch, heads, slots, size, dim = 3, 2, 4, 4, 3
    resident, candidates, selected = random_rows(rng, batch=batch, heads=heads, slots=slots, width=5)
    decision = recall.bring_in(resident, candidates, selected, None, capacity=10**6)
    host_table = torch.arange(batch * NUM_BLOCKS, dtype=torch.int32).view(batch, NUM_BLOCKS)  # block j of b: b*NB+j
    resident_pages = torch.arange(batch * slots, dtype=torch.int32).view(batch, slots)
    host_pages, device_pages = batch * NUM_BLOCKS, batch * slots  # the scratch pages
    moves = recall.compact_moves(decision, candidates, host_table, resident_pages, capacity=batch * heads * slots,
                                 src_scratch=host_pages, dst_scratch=device_pages)
    host_k = torch.randn(host_pages + 1, heads, size, dim)
    host_v = torch.randn(host_pages + 1, heads, size, dim)
    dev_k, dev_v = torch.zeros(device_pages + 1, heads, size, dim), torch.zeros(device_pages + 1, heads, size, dim)
    recall.copy_moves(moves, host_k, host_v, dev_k, dev_v, dst_scratch=device_pages)
    for b in range(batch):
        for h in range(heads):
            for r in range(slots):
                page, block = int(resident_pages[b, r]), int(decision.resident[b, h, r])
                entered = block != int(resident[b, h, r])
                expected = host_k[int(host_table[b, block]), h] if entered else torch.zeros(size, dim)
                torch.testing.assert_close(dev_k[page, h], expected)
    assert int(moves.moved.sum()) == int(decision.applied.sum())
    assert torch.count_nonzero(dev_k[device_pages]) == 0, "the scratch page was written"


@pytest.mark.parametrize("skip", [True, False])
def test_row_copies_skip_the_scratch_entries(skip):
    src = torch.randn(6, 2, 3)
    dst = torch.zeros(5, 2, 3)
    src_rows = torch.tensor([4, 1, 0, 0])
    dst_rows = torch.tensor([2, 0, 4, 4])  # row 4: scratch
    kernels.copy_block_rows(src, src_rows, dst, dst_rows, skip_row=4 if skip else None)
    torch.testing.assert_close(dst[2], src[4])
    torch.testing.assert_close(dst[0], src[1])
    assert torch.count_nonzero(dst[[1, 3]]) == 0
    assert (torch.count_nonzero(dst[4]) == 0) == skip


def test_the_native_cpu_row_copy_is_one_dispatched_op():
    """Counters and host clocks see the native copy as the one launch it is on CUDA (not a hidden call)."""
    from scout_sglang.core.op_counter import OpCounter
    from scout_sglang.kernels.block_copy import _native_copy

    if _native_copy() is None:
        pytest.skip("native CPU kernel unavailable")
    src, dst = torch.randn(6, 2, 3), torch.zeros(5, 2, 3)
    src_rows, dst_rows = torch.tensor([4, 1]), torch.tensor([2, 4])
    counter = OpCounter()
    with counter:
        kernels.copy_block_rows(src, src_rows, dst, dst_rows, skip_row=4)
    assert dict(counter.ops) == {"scout.copy_rows_cpu.default": 1}
    torch.testing.assert_close(dst[2], src[4])
