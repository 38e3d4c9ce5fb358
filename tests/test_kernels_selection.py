"""Digests, block scores and top-k selection against the references (the split: test_stage_split.py)."""

import pytest
import torch
from support import requires_cuda

from scout_sglang import kernels, reference
from scout_sglang.layout import PAD_BLOCK
from scout_sglang.testing import random_paged_kv


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_build_digests_matches_reference_exactly(dtype):
    k_cache, _ = random_paged_kv(7, 3, 16, 64, dtype=dtype)
    kmin, kmax = kernels.build_digests(k_cache)
    ref_min, ref_max = reference.block_digests(k_cache)
    assert kmin.dtype == dtype
    assert torch.equal(kmin.float(), ref_min) and torch.equal(kmax.float(), ref_max)


def test_update_digests_rewrites_only_the_given_pages():
    k_cache, _ = random_paged_kv(6, 2, 16, 64, dtype=torch.float32)
    kmin, kmax = kernels.build_digests(k_cache)
    before_min, before_max = kmin.clone(), kmax.clone()
    k_cache[[1, 4]] += 10.0  # blocks that "just filled" with new keys
    kernels.update_digests(k_cache, torch.tensor([1, 4], dtype=torch.int32), kmin, kmax)
    ref_min, ref_max = reference.block_digests(k_cache)
    assert torch.equal(kmin[[1, 4]], ref_min[[1, 4]]) and torch.equal(kmax[[1, 4]], ref_max[[1, 4]])
    untouched = [0, 2, 3, 5]
    assert torch.equal(kmin[untouched], before_min[untouched]) and torch.equal(kmax[untouched], before_max[untouched])


def test_digest_blocks_writes_the_digests_of_loose_blocks_into_the_given_rows_only():
    """How the engine digests a block that just filled: read from the window, written at its host page's row."""
    k_blocks, _ = random_paged_kv(3, 2, 16, 64, dtype=torch.float32, seed=2)
    kmin = torch.full((8, 2, 64), 7.0)
    kmax = kmin.clone()
    kernels.digest_blocks(k_blocks, torch.tensor([5, 0, 3], dtype=torch.int32), kmin, kmax)
    ref_min, ref_max = reference.block_digests(k_blocks)
    assert torch.equal(kmin[[5, 0, 3]], ref_min) and torch.equal(kmax[[5, 0, 3]], ref_max)
    assert torch.all(kmin[[1, 2, 4, 6, 7]] == 7.0) and torch.all(kmax[[1, 2, 4, 6, 7]] == 7.0)
    with pytest.raises(ValueError, match="one entry per block"):
        kernels.digest_blocks(k_blocks, torch.tensor([1], dtype=torch.int32), kmin, kmax)


def make_scoring_inputs(num_blocks, *, group_size=4, num_kv_heads=2, head_dim=64, seed=0):
    k_cache, _ = random_paged_kv(sum(num_blocks), num_kv_heads, 16, head_dim, dtype=torch.float32, seed=seed)
    kmin, kmax = kernels.build_digests(k_cache)
    gen = torch.Generator().manual_seed(seed)
    table = torch.zeros(len(num_blocks), max(num_blocks), dtype=torch.int32)
    for b, n in enumerate(num_blocks):
        table[b, :n] = torch.randperm(sum(num_blocks), generator=gen)[:n].to(torch.int32)
    q = torch.randn(len(num_blocks), num_kv_heads * group_size, head_dim, generator=gen)
    return q, kmin, kmax, table, torch.tensor(num_blocks, dtype=torch.int32)


@pytest.mark.parametrize("group_size", [1, 4, 8])
@pytest.mark.parametrize("group_reduce", ["max", "sum"])
def test_scores_match_reference_and_are_masked_past_the_count(group_size, group_reduce):
    q, kmin, kmax, table, num_blocks = make_scoring_inputs([5, 1, 0, 9], group_size=group_size)
    scores = kernels.score_blocks(q, kmin, kmax, table, num_blocks, group_reduce=group_reduce)
    for b, n in enumerate(num_blocks.tolist()):
        pages = table[b, :n].long()
        ref = reference.quest_scores(q[b], kmin[pages], kmax[pages], group_reduce=group_reduce)
        torch.testing.assert_close(scores[b, :, :n], ref, atol=1e-4, rtol=1e-5)
        assert torch.all(torch.isneginf(scores[b, :, n:]))


@pytest.mark.parametrize("topk", [1, 3, 8, 64])
def test_select_topk_matches_reference_per_request_and_head(topk):
    q, kmin, kmax, table, num_blocks = make_scoring_inputs([40, 1, 7, 0, 23], seed=1)
    scores = kernels.score_blocks(q, kmin, kmax, table, num_blocks)
    sink, local = (1, 1) if topk >= 2 else (0, 1)
    indices, counts = kernels.select_topk(scores, num_blocks, topk=topk, num_sink_blocks=sink, num_local_blocks=local)
    assert indices.shape == (5, 2, topk) and indices.dtype == torch.int32
    for b, n in enumerate(num_blocks.tolist()):
        for h in range(2):
            expected = reference.select_topk(scores[b, h, :n], topk=topk, num_sink_blocks=sink, num_local_blocks=local)
            assert int(counts[b, h]) == len(expected) == min(topk, n)
            assert indices[b, h, : len(expected)].tolist() == expected
            assert torch.all(indices[b, h, len(expected) :] == PAD_BLOCK)


def test_select_topk_of_a_budget_covering_the_context_takes_every_block():
    q, kmin, kmax, table, num_blocks = make_scoring_inputs([6, 3], seed=2)
    scores = kernels.score_blocks(q, kmin, kmax, table, num_blocks)
    indices, counts = kernels.select_topk(scores, num_blocks, topk=6, num_sink_blocks=1, num_local_blocks=2)
    for b, n in enumerate([6, 3]):
        for h in range(2):
            assert set(indices[b, h, : counts[b, h]].tolist()) == set(range(n))


def test_select_topk_ties_go_to_the_lower_index():
    scores = torch.zeros(1, 1, 10)  # every block ties
    indices, _ = kernels.select_topk(scores, torch.tensor([10], dtype=torch.int32), topk=4, num_local_blocks=1)
    assert indices[0, 0].tolist() == [9, 0, 1, 2]


def test_select_topk_refuses_a_budget_smaller_than_the_forced_blocks():
    with pytest.raises(ValueError, match=r"topk \(2\) must cover the forced blocks"):
        kernels.select_topk(torch.zeros(1, 1, 4), torch.tensor([4], dtype=torch.int32), topk=2, num_sink_blocks=1, num_local_blocks=2)


@requires_cuda
def test_cuda_scores_and_digests_match_cpu():
    q, kmin, kmax, table, num_blocks = make_scoring_inputs([40, 1, 7, 0, 23], seed=1)
    scores_cpu = kernels.score_blocks(q, kmin, kmax, table, num_blocks)
    scores_gpu = kernels.score_blocks(q.cuda(), kmin.cuda(), kmax.cuda(), table.cuda(), num_blocks.cuda())
    torch.testing.assert_close(scores_gpu.cpu(), scores_cpu, atol=1e-4, rtol=1e-5)
    k_cache, _ = random_paged_kv(7, 3, 16, 64, dtype=torch.bfloat16)
    gpu_min, gpu_max = kernels.build_digests(k_cache.cuda())
    ref_min, ref_max = reference.block_digests(k_cache)
    assert torch.equal(gpu_min.float().cpu(), ref_min) and torch.equal(gpu_max.float().cpu(), ref_max)
