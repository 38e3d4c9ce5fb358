"""The select stage (kernels.stage_select): the Triton kernel and the torch path against the reference top-k,
the change count against a count written out by hand, and quest's page lists."""

import pytest
import torch
from support import TRITON_DEVICE, expected_warps, launched_warps, requires_triton

from scout_sglang import reference
from scout_sglang.kernels.stage_select import select_blocks
from scout_sglang.kernels.step_counters import CHANGED, COMPARED, NUM_COUNTERS, SELECTED
from scout_sglang.layout import PAD_BLOCK

IMPLS = ["torch", pytest.param("triton", marks=[requires_triton, pytest.mark.triton_interpret])]


def device_of(impl):
    return TRITON_DEVICE if impl == "triton" else "cpu"


def random_scores(num_full, num_kv_heads, width, *, seed=0, ties=False):
    gen = torch.Generator().manual_seed(seed)
    scores = torch.randn(len(num_full), num_kv_heads, width, generator=gen)
    if ties:  # few distinct values: the tie-break decides most of the order
        scores = (scores * 2).round() / 2
    position = torch.arange(width)
    for b, n in enumerate(num_full):
        scores[b, :, position >= n] = float("-inf")
    return scores


def expected_selection(scores, num_full, topk, sink, local):
    rows = []
    for b, n in enumerate(num_full):
        rows.append([reference.select_topk(scores[b, h, :n], topk=topk, num_sink_blocks=sink, num_local_blocks=local)
                     for h in range(scores.shape[1])])
    return rows


def run_select(impl, scores, num_full, topk, sink, local, **extra):
    device = device_of(impl)
    batch_size, num_kv_heads, _ = scores.shape
    selected = torch.full((batch_size, num_kv_heads, topk), 99, dtype=torch.int32, device=device)
    counts = torch.full((batch_size, num_kv_heads), 99, dtype=torch.int32, device=device)
    select_blocks(scores.to(device), torch.tensor(num_full, dtype=torch.int32, device=device), topk=topk,
                  num_sink_blocks=sink, num_local_blocks=local, out_selected=selected, out_counts=counts,
                  impl=impl, **extra)
    return selected.cpu(), counts.cpu()


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("topk, sink, local", [(1, 0, 0), (4, 1, 2), (6, 1, 2), (16, 2, 3)])
def test_selection_equals_the_reference_top_k_with_forced_blocks_first(impl, ties, topk, sink, local):
    if topk < sink + local:
        pytest.skip("topk must cover the forced blocks")
    num_full = [0, 1, 3, 5, 13, 7]  # empty, fewer than the forced blocks, fewer than k, more than k
    scores = random_scores(num_full, 2, 13, seed=topk, ties=ties)
    selected, counts = run_select(impl, scores, num_full, topk, sink, local)
    expected = expected_selection(scores, num_full, topk, sink, local)
    for b, rows in enumerate(expected):
        for h, blocks in enumerate(rows):
            assert counts[b, h] == len(blocks)
            assert selected[b, h].tolist() == blocks + [PAD_BLOCK] * (topk - len(blocks)), (b, h)


@pytest.mark.parametrize("impl", IMPLS)
def test_a_row_longer_than_a_chunk_is_selected_over_every_chunk(impl):
    """2500 blocks: three chunks of 1024 in the Triton kernel, each contributing to the best."""
    num_full = [2500, 1500]
    scores = random_scores(num_full, 1, 2500, seed=5)
    scores[0, 0, 2100] = 50.0  # the best block lies in the last chunk
    selected, counts = run_select(impl, scores, num_full, 8, 1, 1)
    expected = expected_selection(scores, num_full, 8, 1, 1)
    assert selected[0, 0].tolist() == expected[0][0] and 2100 in expected[0][0]
    assert selected[1, 0].tolist() == expected[1][0]


@pytest.mark.parametrize("impl", IMPLS)
def test_negative_zero_and_zero_are_a_tie(impl):
    scores = torch.tensor([[[1.0, -0.0, 0.0, -0.0, 2.0]]])
    selected, _ = run_select(impl, scores, [5], 4, 0, 0)
    assert selected[0, 0].tolist() == [4, 0, 1, 2]


@pytest.mark.parametrize("impl", IMPLS)
def test_the_change_count_compares_with_the_previous_selection_of_the_same_slot(impl, lookup):
    device = device_of(impl)
    topk, num_full = 3, [6, 6, 0]
    previous = torch.full((5, 1, topk), PAD_BLOCK, dtype=torch.int32)
    previous[4, 0] = torch.tensor([0, 1, 2])  # slot 4 selected blocks 0, 1, 2 last step
    previous[2, 0] = torch.tensor([5, 3, PAD_BLOCK])
    scores = torch.tensor([[[9.0, 0, 0, 8, 0, 7]], [[0, 0, 0, 9.0, 0, 8]], [[0.0] * 6]])
    counters = torch.zeros(NUM_COUNTERS, dtype=torch.int32, device=device)
    slots = torch.tensor([4, 2, 0], device=device)
    previous = previous.to(device)
    selected, counts = run_select(impl, scores, num_full, topk, 0, 0, previous=previous, slots=slots,
                                  counters=counters)
    assert selected[:, 0].tolist() == [[0, 3, 5], [3, 5, 0], [PAD_BLOCK] * 3]
    # slot 4: 3 and 5 are new; slot 2: 0 is new; slot 0 had nothing to compare with (and selected nothing).
    assert counters[SELECTED].item() == 6 and counters[COMPARED].item() == 6 and counters[CHANGED].item() == 3
    assert previous[4, 0].tolist() == [0, 3, 5] and previous[2, 0].tolist() == [3, 5, 0]
    assert previous[0, 0].tolist() == [PAD_BLOCK] * 3  # an empty selection keeps the row


@pytest.mark.parametrize("impl", IMPLS)
def test_an_exact_row_counts_only_its_new_block_as_changed(impl, lookup):
    """Resident-first exact rows select every block: a previous selection of every block up to its largest is read
    as a range (wide rows), one with a hole is looked up; both count what a hand count does."""
    device = device_of(impl)
    topk = 8
    previous = torch.full((3, 1, topk), PAD_BLOCK, dtype=torch.int32)
    previous[0, 0, :6] = torch.tensor([3, 0, 5, 1, 4, 2])  # blocks 0..5: this step's block 6 is new
    previous[1, 0, :5] = torch.tensor([4, 0, 6, 1, 3])  # blocks 2 and 5 are not in it
    previous[2, 0, :3] = torch.tensor([0, 1, 2])  # the range ends before this step's 3..6
    scores = torch.randn(3, 1, 8, generator=torch.Generator().manual_seed(3))
    counters = torch.zeros(NUM_COUNTERS, dtype=torch.int32, device=device)
    with launched_warps() as warps:
        selected, counts = run_select(impl, scores, [7, 7, 7], topk, 0, 0, previous=previous.to(device),
                                      slots=torch.tensor([0, 1, 2], device=device), counters=counters)
    if impl == "triton":  # a wide row's program spreads over more warps (sizes.warps_for)
        assert warps == {"_select_topk_kernel": expected_warps(lookup)}
    assert counts.flatten().tolist() == [7, 7, 7]
    assert counters[COMPARED].item() == 21 and counters[CHANGED].item() == 1 + 2 + 4


@pytest.mark.parametrize("impl", IMPLS)
def test_quest_pages_list_the_selected_pages_then_the_partial_tail(impl):
    device = device_of(impl)
    block, topk = 4, 3
    num_tokens = [17, 16, 2, 9]  # tail of 1; no tail; only a tail; two full blocks and a tail
    num_full = [n // block for n in num_tokens]
    table = torch.arange(4 * 6, dtype=torch.int32).view(4, 6) * 10
    scores = random_scores(num_full, 2, 6, seed=3)
    pages = torch.full((4, 2, topk + 1), 99, dtype=torch.int32, device=device)
    page_counts = torch.zeros(4, 2, dtype=torch.int32, device=device)
    selected, counts = run_select(impl, scores, num_full, topk, 1, 1, page_table=table.to(device),
                                  num_tokens=torch.tensor(num_tokens, dtype=torch.int32, device=device),
                                  block_size=block, out_pages=pages, out_page_counts=page_counts)
    for b, n in enumerate(num_tokens):
        for h in range(2):
            blocks = selected[b, h, : counts[b, h]].tolist() + ([n // block] if n % block else [])
            listed = [int(table[b, j]) for j in blocks]
            assert page_counts[b, h] == len(listed)
            assert pages[b, h].tolist() == listed + [PAD_BLOCK] * (topk + 1 - len(listed)), (b, h)


def test_bad_arguments_are_named():
    scores = torch.zeros(2, 1, 4)
    num_full = torch.tensor([1, 2], dtype=torch.int32)
    out = torch.zeros(2, 1, 2, dtype=torch.int32), torch.zeros(2, 1, dtype=torch.int32)
    with pytest.raises(ValueError, match="cover sink"):
        select_blocks(scores, num_full, topk=2, num_sink_blocks=2, num_local_blocks=1, out_selected=out[0],
                      out_counts=out[1])
    with pytest.raises(ValueError, match="out_selected must have shape"):
        select_blocks(scores, num_full, topk=3, num_sink_blocks=0, num_local_blocks=0, out_selected=out[0],
                      out_counts=out[1])
    with pytest.raises(ValueError, match="previous and slots go together"):
        select_blocks(scores, num_full, topk=2, num_sink_blocks=0, num_local_blocks=0, out_selected=out[0],
                      out_counts=out[1], previous=torch.zeros(3, 1, 2, dtype=torch.int32))


@pytest.mark.parametrize("impl", IMPLS)
def test_a_row_of_its_own_k_selects_the_reference_top_k_of_that_k(impl):
    """row_topk (resident-first serving: a request that fits selects all its blocks, the others the budget): each
    row's selection is the reference top-k at its own k, within outputs as wide as the largest."""
    topk, sink, local = 16, 2, 3
    num_full = [0, 4, 13, 13, 30, 30]
    row_topk = [16, 5, 16, 6, 9, 16]
    scores = random_scores(num_full, 2, 30, seed=7, ties=True)
    selected, counts = run_select(impl, scores, num_full, topk, sink, local,
                                  row_topk=torch.tensor(row_topk, dtype=torch.int32, device=device_of(impl)))
    for b, (n, k) in enumerate(zip(num_full, row_topk)):
        for h in range(2):
            blocks = reference.select_topk(scores[b, h, :n], topk=k, num_sink_blocks=sink, num_local_blocks=local)
            assert counts[b, h] == len(blocks) == min(n, k)
            assert selected[b, h].tolist() == blocks + [PAD_BLOCK] * (topk - len(blocks)), (b, h)
