"""Triton kernels (scout_sglang.kernels.triton) against the fp32 references.

digest -> score -> sparse decode -> merge, each checked against
scout_sglang.reference at odd and boundary sizes, plus the invariants the
engine relies on (empty side, split + merge == whole, in-place merge). Without
a GPU they run under TRITON_INTERPRET=1 on CPU tensors: sizes stay small.
"""

import math

import pytest
import torch
from support import TRITON_DEVICE, assert_close, requires_triton

from scout_sglang.handoff_words import STATUS_DEADLINE, STATUS_ERROR, STATUS_OK
from scout_sglang.layout import PAD_BLOCK
from scout_sglang.reference import block_digests, merge_states, quest_scores, sparse_decode
from scout_sglang.testing import random_block_lists, random_paged_kv

pytestmark = [pytest.mark.triton_interpret, requires_triton]

BLOCK_SIZE = 16
NUM_KV_HEADS = 2


@pytest.fixture(scope="module")
def ops():
    import scout_sglang.kernels.triton as ops

    return ops


def _cache(num_pages, head_dim, dtype, *, block_size=BLOCK_SIZE, seed=0):
    return random_paged_kv(num_pages, NUM_KV_HEADS, block_size, head_dim, dtype=dtype, seed=seed, device=TRITON_DEVICE)


def _query(batch_size, num_qo_heads, head_dim, dtype, *, seed=0):
    gen = torch.Generator().manual_seed(seed + 1000)
    q = torch.randn(batch_size, num_qo_heads, head_dim, generator=gen)  # [B, Hq, D]
    return q.to(dtype).to(TRITON_DEVICE)


def _lists_for_tokens(tokens, *, num_pages, capacity, block_size=BLOCK_SIZE, seed=0):
    """Block lists holding `tokens[b][h]` tokens each -> (table, counts, last_block_len)."""
    counts = [[math.ceil(n / block_size) for n in row] for row in tokens]
    table, count_tensor = random_block_lists(
        counts, num_pages=num_pages, capacity=capacity, seed=seed, device=TRITON_DEVICE
    )
    last = [[n - (c - 1) * block_size if c else block_size for n, c in zip(r, cr)] for r, cr in zip(tokens, counts)]
    last_block_len = torch.tensor(last, dtype=torch.int32, device=TRITON_DEVICE)  # [B, Hkv]
    return table, count_tensor, last_block_len


def _run_decode(ops, q, k, v, table, counts, last_block_len, *, num_splits=None):
    batch_size, num_qo_heads, head_dim = q.shape
    # Garbage in the outputs proves every element is written.
    o = torch.full((batch_size, num_qo_heads, head_dim), float("nan"), dtype=q.dtype, device=q.device)
    lse = torch.full((batch_size, num_qo_heads), float("nan"), dtype=torch.float32, device=q.device)
    ops.sparse_decode_triton(
        q, k, v, table, counts, last_block_len, o, lse, scale=head_dim**-0.5, num_splits=num_splits
    )
    return o, lse


def _check_decode(o, lse, q, k, v, table, counts, last_block_len):
    ref_o, ref_lse = sparse_decode(
        q.cpu(), k.cpu(), v.cpu(), table.cpu(), counts.cpu(), scale=q.shape[-1] ** -0.5,
        last_block_len=None if last_block_len is None else last_block_len.cpu(),
    )
    assert_close(o, ref_o, q.dtype)
    assert_close(lse, ref_lse, q.dtype, lse=True)


# ---------------------------------------------------------------- digests


@pytest.mark.parametrize(
    "dtype, head_dim, block_size",
    [(torch.float32, 64, 16), (torch.bfloat16, 128, 16), (torch.float16, 64, 7)],
)
def test_digests_match_reference_and_touch_only_listed_pages(ops, dtype, head_dim, block_size):
    num_pages = 6
    k, _ = _cache(num_pages, head_dim, dtype, block_size=block_size)
    page_ids = torch.tensor([4, 0, 2], dtype=torch.int32, device=TRITON_DEVICE)
    sentinel = 123.0
    out_min = torch.full((num_pages, NUM_KV_HEADS, head_dim), sentinel, dtype=dtype, device=TRITON_DEVICE)
    out_max = out_min.clone()

    ops.digests_triton(k, page_ids, out_min, out_max)

    ref_min, ref_max = block_digests(k.cpu())
    listed = page_ids.long().cpu()
    # min/max are exact in the cache dtype.
    assert torch.equal(out_min.cpu()[listed], ref_min[listed].to(dtype))
    assert torch.equal(out_max.cpu()[listed], ref_max[listed].to(dtype))
    others = [p for p in range(num_pages) if p not in set(listed.tolist())]
    assert torch.all(out_min.cpu()[others] == sentinel)
    assert torch.all(out_max.cpu()[others] == sentinel)


def test_digests_read_one_page_and_write_another_row_when_rows_are_given(ops):
    k, _ = _cache(3, 64, torch.float32)
    out_min = torch.full((5, NUM_KV_HEADS, 64), 9.0, device=TRITON_DEVICE)
    out_max = out_min.clone()
    pages = torch.tensor([2, 0], dtype=torch.int32, device=TRITON_DEVICE)
    rows = torch.tensor([4, 1], dtype=torch.int32, device=TRITON_DEVICE)
    ops.digests_triton(k, pages, out_min, out_max, rows=rows)
    ref_min, ref_max = block_digests(k.cpu())
    assert torch.equal(out_min.cpu()[[4, 1]], ref_min[[2, 0]]) and torch.equal(out_max.cpu()[[4, 1]], ref_max[[2, 0]])
    assert torch.all(out_min.cpu()[[0, 2, 3]] == 9.0)


# ---------------------------------------------------------------- scores


@pytest.mark.parametrize(
    "group_reduce, group_size, dtype, head_dim",
    [
        ("max", 1, torch.float32, 64),
        ("max", 4, torch.bfloat16, 128),
        ("sum", 8, torch.float16, 64),
        ("sum", 4, torch.float32, 128),
    ],
)
def test_scores_match_reference_and_are_neg_inf_past_num_blocks(ops, group_reduce, group_size, dtype, head_dim):
    num_pages, max_blocks = 48, 40  # 40 logical blocks: more than one program's tile
    gen = torch.Generator().manual_seed(3)
    digest_min = torch.randn(num_pages, NUM_KV_HEADS, head_dim, generator=gen)
    digest_max = digest_min + torch.rand(num_pages, NUM_KV_HEADS, head_dim, generator=gen)
    digest_min = digest_min.to(dtype).to(TRITON_DEVICE)
    digest_max = digest_max.to(dtype).to(TRITON_DEVICE)
    num_blocks = [40, 5, 1, 0]
    table = torch.full((len(num_blocks), max_blocks), PAD_BLOCK, dtype=torch.int32)
    for b, n in enumerate(num_blocks):
        table[b, :n] = torch.randperm(num_pages, generator=gen)[:n].to(torch.int32)
    table = table.to(TRITON_DEVICE)
    num_blocks_t = torch.tensor(num_blocks, dtype=torch.int32, device=TRITON_DEVICE)
    q = _query(len(num_blocks), NUM_KV_HEADS * group_size, head_dim, dtype)
    out = torch.full((len(num_blocks), NUM_KV_HEADS, max_blocks), float("nan"), device=TRITON_DEVICE)

    ops.score_blocks_triton(q, digest_min, digest_max, table, num_blocks_t, out, group_reduce=group_reduce)

    out = out.cpu()
    for b, n in enumerate(num_blocks):
        pages = table[b, :n].long().cpu()
        ref = quest_scores(q[b].cpu(), digest_min.cpu()[pages], digest_max.cpu()[pages], group_reduce=group_reduce)
        # Products of rounded inputs are exact in fp32; only the sum order differs.
        assert_close(out[b, :, :n], ref, torch.float32)
        assert torch.all(out[b, :, n:] == float("-inf"))


# ---------------------------------------------------------------- sparse decode


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("num_tokens", [1, BLOCK_SIZE - 1, BLOCK_SIZE, BLOCK_SIZE + 1, 97, 4097])
def test_sparse_decode_kv_lengths(ops, num_tokens, dtype):
    head_dim, group_size = 64, 4
    capacity = math.ceil(num_tokens / BLOCK_SIZE)
    num_pages = max(capacity, 8)
    k, v = _cache(num_pages, head_dim, dtype)
    # Request 0: both heads at the length under test; request 1: mixed.
    tokens = [[num_tokens, num_tokens], [num_tokens, min(33, num_tokens)]]
    table, counts, last = _lists_for_tokens(tokens, num_pages=num_pages, capacity=capacity)
    q = _query(2, NUM_KV_HEADS * group_size, head_dim, dtype)
    o, lse = _run_decode(ops, q, k, v, table, counts, last, num_splits=3)
    _check_decode(o, lse, q, k, v, table, counts, last)


@pytest.mark.parametrize("block_size, head_dim", [(8, 64), (24, 64), (32, 128), (64, 128)])
def test_sparse_decode_block_sizes(ops, block_size, head_dim):
    """Pages smaller than a tile, not a power of two, one per tile, larger than a tile."""
    dtype, group_size = torch.float16, 8
    k, v = _cache(12, head_dim, dtype, block_size=block_size, seed=8)
    tokens = [[5 * block_size - 3, 1], [block_size, 2 * block_size + 1]]
    table, counts, last = _lists_for_tokens(tokens, num_pages=12, capacity=6, block_size=block_size, seed=8)
    q = _query(2, NUM_KV_HEADS * group_size, head_dim, dtype, seed=8)
    o, lse = _run_decode(ops, q, k, v, table, counts, last, num_splits=2)
    _check_decode(o, lse, q, k, v, table, counts, last)


@pytest.mark.parametrize(
    "group_size, head_dim, dtype, num_splits",
    [
        (1, 64, torch.float32, 1),
        (4, 128, torch.bfloat16, 2),
        (8, 64, torch.float16, None),
        (8, 128, torch.bfloat16, 1),
        (1, 128, torch.float16, 4),
        (4, 64, torch.float32, 3),
    ],
)
def test_sparse_decode_groups_head_dims_mixed_batch(ops, group_size, head_dim, dtype, num_splits):
    k, v = _cache(20, head_dim, dtype, seed=1)
    # Mixed lengths, an empty list beside a full one, a one-token tail.
    tokens = [[40, 0], [1, 112], [16, 17]]
    table, counts, last = _lists_for_tokens(tokens, num_pages=20, capacity=9, seed=1)
    q = _query(3, NUM_KV_HEADS * group_size, head_dim, dtype, seed=1)
    o, lse = _run_decode(ops, q, k, v, table, counts, last, num_splits=num_splits)
    _check_decode(o, lse, q, k, v, table, counts, last)
    assert torch.all(o[0, group_size:].cpu() == 0)
    assert torch.all(lse[0, group_size:].cpu() == float("-inf"))


@pytest.mark.parametrize("num_splits", [1, 2])
def test_sparse_decode_full_blocks_without_last_block_len(ops, num_splits):
    dtype, head_dim = torch.float16, 64
    k, v = _cache(12, head_dim, dtype, seed=2)
    table, counts = random_block_lists([[5, 2], [1, 6]], num_pages=12, capacity=6, seed=2, device=TRITON_DEVICE)
    q = _query(2, NUM_KV_HEADS * 4, head_dim, dtype, seed=2)
    o, lse = _run_decode(ops, q, k, v, table, counts, None, num_splits=num_splits)
    _check_decode(o, lse, q, k, v, table, counts, None)


def test_sparse_decode_workspace_matches_allocation(ops):
    dtype, head_dim, num_qo_heads = torch.bfloat16, 128, NUM_KV_HEADS * 4
    k, v = _cache(16, head_dim, dtype, seed=9)
    table, counts, last = _lists_for_tokens([[100, 7], [30, 0]], num_pages=16, capacity=8, seed=9)
    q = _query(2, num_qo_heads, head_dim, dtype, seed=9)
    expected_o, expected_lse = _run_decode(ops, q, k, v, table, counts, last, num_splits=4)
    workspace = (
        torch.full((2, num_qo_heads, 5, head_dim), float("nan"), device=TRITON_DEVICE),  # [B, Hq, splits, D]
        torch.full((2, num_qo_heads, 5), float("nan"), device=TRITON_DEVICE),  # [B, Hq, splits]
    )
    o, lse = torch.empty_like(expected_o), torch.empty_like(expected_lse)
    ops.sparse_decode_triton(
        q, k, v, table, counts, last, o, lse, scale=head_dim**-0.5, num_splits=4, workspace=workspace
    )
    assert torch.equal(o, expected_o)
    assert torch.equal(lse, expected_lse)


@pytest.mark.parametrize("num_splits", [1, 3])
def test_sparse_decode_all_empty(ops, num_splits):
    dtype, head_dim = torch.bfloat16, 64
    k, v = _cache(4, head_dim, dtype)
    table, counts = random_block_lists([[0, 0], [0, 0]], num_pages=4, capacity=5, device=TRITON_DEVICE)
    q = _query(2, NUM_KV_HEADS * 4, head_dim, dtype)
    o, lse = _run_decode(ops, q, k, v, table, counts, None, num_splits=num_splits)
    assert torch.all(o.cpu() == 0)
    assert torch.all(lse.cpu() == float("-inf"))


@pytest.mark.parametrize("num_splits", [1, 2])
def test_sparse_decode_gate_attends_only_when_nonzero(ops, num_splits):
    """The CPU part's fallback is always launched, gated by the layer's status word on the device: a failed part
    (nonzero status) is attended, a good one (STATUS_OK, 0) gives the results of empty lists."""
    dtype, head_dim = torch.float32, 64
    k, v = _cache(12, head_dim, dtype, seed=10)
    table, counts, last = _lists_for_tokens([[40, 7], [1, 33]], num_pages=12, capacity=4, seed=10)
    q = _query(2, NUM_KV_HEADS * 4, head_dim, dtype, seed=10)
    for status in (STATUS_OK, STATUS_ERROR, STATUS_DEADLINE):
        o = torch.full((2, NUM_KV_HEADS * 4, head_dim), float("nan"), dtype=dtype, device=TRITON_DEVICE)
        lse = torch.full((2, NUM_KV_HEADS * 4), float("nan"), device=TRITON_DEVICE)
        gate = torch.tensor([status], dtype=torch.int32, device=TRITON_DEVICE)
        ops.sparse_decode_triton(q, k, v, table, counts, last, o, lse, scale=head_dim**-0.5, num_splits=num_splits,
                                 gate=gate)
        if status == STATUS_OK:
            assert torch.all(o.cpu() == 0) and torch.all(lse.cpu() == float("-inf"))
        else:
            _check_decode(o, lse, q, k, v, table, counts, last)


@pytest.mark.parametrize("programs", [1, 3])
def test_sparse_decode_on_a_bounded_number_of_programs_walks_every_list(ops, programs):
    """The CPU split's zero-copy decode: `programs` programs (fewer than the B x Hkv lists) walk the lists in turn
    and write every one, empty lists included, as the one-program-per-list launch does."""
    dtype, head_dim = torch.float32, 64
    k, v = _cache(12, head_dim, dtype, seed=11)
    table, counts, last = _lists_for_tokens([[40, 7], [0, 33], [18, 64]], num_pages=12, capacity=4, seed=11)
    q = _query(3, NUM_KV_HEADS * 2, head_dim, dtype, seed=11)
    o = torch.full((3, NUM_KV_HEADS * 2, head_dim), float("nan"), dtype=dtype, device=TRITON_DEVICE)
    lse = torch.full((3, NUM_KV_HEADS * 2), float("nan"), device=TRITON_DEVICE)
    ops.sparse_decode_triton(q, k, v, table, counts, last, o, lse, scale=head_dim**-0.5, num_splits=1,
                             programs=programs)
    _check_decode(o, lse, q, k, v, table, counts, last)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_split_list_then_merge_equals_whole(ops, dtype):
    head_dim, group_size, split_at = 64, 4, 3
    k, v = _cache(16, head_dim, dtype, seed=4)
    tokens = [[97, 40], [20, 48]]
    table, counts, last = _lists_for_tokens(tokens, num_pages=16, capacity=8, seed=4)
    q = _query(2, NUM_KV_HEADS * group_size, head_dim, dtype, seed=4)

    whole_o, whole_lse = _run_decode(ops, q, k, v, table, counts, last)
    # Head: the first `split_at` pages; tail: the rest. The partial last page
    # stays last in whichever part holds it.
    head_counts = torch.clamp(counts, max=split_at)
    head_last = torch.where(counts <= split_at, last, torch.full_like(last, BLOCK_SIZE))
    tail_counts = counts - head_counts
    tail_table = torch.full_like(table, PAD_BLOCK)
    tail_table[..., : table.shape[-1] - split_at] = table[..., split_at:]
    head_o, head_lse = _run_decode(ops, q, k, v, table, head_counts, head_last)
    tail_o, tail_lse = _run_decode(ops, q, k, v, tail_table, tail_counts, last)
    merged_o, merged_lse = torch.empty_like(head_o), torch.empty_like(head_lse)
    ops.merge_states_triton(head_o, head_lse, tail_o, tail_lse, merged_o, merged_lse)

    assert_close(merged_o, whole_o, dtype)
    assert_close(merged_lse, whole_lse, dtype, lse=True)
    _check_decode(merged_o, merged_lse, q, k, v, table, counts, last)


# ---------------------------------------------------------------- merge


def _random_states(num_rows, num_heads, head_dim, dtype, *, seed):
    gen = torch.Generator().manual_seed(seed)
    o_a = torch.randn(num_rows, num_heads, head_dim, generator=gen).to(dtype)  # [N, H, D]
    o_b = torch.randn(num_rows, num_heads, head_dim, generator=gen).to(dtype)
    lse_a = torch.randn(num_rows, num_heads, generator=gen) * 3  # [N, H] natural log
    lse_b = torch.randn(num_rows, num_heads, generator=gen) * 3
    # Row 0: a empty; row 1: b empty; row 2: both empty; the rest: both present.
    lse_a[0], lse_b[1] = float("-inf"), float("-inf")
    lse_a[2], lse_b[2] = float("-inf"), float("-inf")
    return [t.to(TRITON_DEVICE) for t in (o_a, lse_a, o_b, lse_b)]


@pytest.mark.parametrize(
    "dtype, num_heads, head_dim",
    [(torch.float32, 12, 64), (torch.bfloat16, 5, 128), (torch.float16, 8, 64)],
)
def test_merge_matches_reference(ops, dtype, num_heads, head_dim):
    o_a, lse_a, o_b, lse_b = _random_states(6, num_heads, head_dim, dtype, seed=5)
    out_o = torch.full_like(o_a, float("nan"))
    out_lse = torch.full_like(lse_a, float("nan"))
    ops.merge_states_triton(o_a, lse_a, o_b, lse_b, out_o, out_lse)
    ref_o, ref_lse = merge_states(o_a.cpu(), lse_a.cpu(), o_b.cpu(), lse_b.cpu())
    assert_close(out_o, ref_o, dtype)
    assert_close(out_lse, ref_lse, dtype, lse=True)
    assert torch.all(out_o[2].cpu() == 0) and torch.all(out_lse[2].cpu() == float("-inf"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_merge_with_empty_side_changes_nothing(ops, dtype):
    o_a, lse_a, o_b, lse_b = _random_states(4, 8, 64, dtype, seed=6)
    lse_empty = torch.full_like(lse_b, float("-inf"))
    o_garbage = torch.full_like(o_b, float("nan"))  # an empty side's o is never read
    for o_x, lse_x in ((o_a, lse_a), (o_b, lse_b)):
        for args in ((o_x, lse_x, o_garbage, lse_empty), (o_garbage, lse_empty, o_x, lse_x)):
            out_o, out_lse = torch.empty_like(o_x), torch.empty_like(lse_x)
            ops.merge_states_triton(*args, out_o, out_lse)
            nonempty = torch.isfinite(lse_x)
            assert torch.equal(out_o[nonempty], o_x[nonempty])
            assert torch.equal(out_lse, lse_x)
            assert torch.all(out_o[~nonempty] == 0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_merge_in_place_equals_out_of_place(ops, dtype):
    o_a, lse_a, o_b, lse_b = _random_states(5, 12, 128, dtype, seed=7)
    out_o, out_lse = torch.empty_like(o_a), torch.empty_like(lse_a)
    ops.merge_states_triton(o_a, lse_a, o_b, lse_b, out_o, out_lse)
    ops.merge_states_triton(o_a, lse_a, o_b, lse_b, o_a, lse_a)
    assert torch.equal(o_a, out_o)
    assert torch.equal(lse_a, out_lse)


def test_default_num_splits_grows_with_capacity_and_is_bounded(ops):
    small = ops.default_num_splits(4, batch_size=1, num_kv_heads=8)
    large = ops.default_num_splits(4096, batch_size=1, num_kv_heads=8)
    busy = ops.default_num_splits(4096, batch_size=256, num_kv_heads=8)
    assert small == 1 and large > 1 and busy == 1
    assert ops.default_num_splits(0, batch_size=1, num_kv_heads=1) == 1
