"""The host wrappers drive the Triton kernels correctly (impl="triton").

On a GPU these run natively; without one, under TRITON_INTERPRET=1 on CPU
tensors, at small sizes. The kernels themselves are tested in
test_triton_kernels.py; this file checks the wrapper-to-kernel wiring.
"""

import pytest
import torch
from support import TRITON_DEVICE, assert_close, requires_triton

from scout_sglang import kernels, reference
from scout_sglang.testing import random_block_lists, random_paged_kv

pytestmark = [pytest.mark.triton_interpret, requires_triton]


def on_device(*tensors):
    return [t.to(TRITON_DEVICE) for t in tensors]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sparse_decode_through_the_wrapper(dtype):
    table, counts = random_block_lists([[0, 5], [3, 1]], num_pages=12, capacity=5, seed=1)
    k_cache, v_cache = random_paged_kv(12, 2, 16, 64, dtype=dtype, seed=2)
    q = torch.randn(2, 8, 64).to(dtype)
    tail = torch.tensor([[1, 7], [16, 2]], dtype=torch.int32)
    o, lse = kernels.sparse_decode(
        *on_device(q, k_cache, v_cache, table, counts), scale=0.125, last_block_len=tail.to(TRITON_DEVICE), impl="triton"
    )
    ref_o, ref_lse = reference.sparse_decode(q, k_cache, v_cache, table, counts, scale=0.125, last_block_len=tail)
    assert_close(o, ref_o, dtype)
    assert_close(lse, ref_lse, dtype, lse=True)


def test_digests_and_scores_through_the_wrapper():
    k_cache, _ = random_paged_kv(6, 2, 16, 64, dtype=torch.float32, seed=3)
    (k_dev,) = on_device(k_cache)
    kmin, kmax = kernels.build_digests(k_dev, impl="triton")
    ref_min, ref_max = reference.block_digests(k_cache)
    assert torch.equal(kmin.cpu(), ref_min) and torch.equal(kmax.cpu(), ref_max)
    q = torch.randn(2, 8, 64)
    table = torch.tensor([[5, 0, 3, 1], [2, 4, 0, 0]], dtype=torch.int32)
    num_blocks = torch.tensor([4, 2], dtype=torch.int32)
    scores = kernels.score_blocks(*on_device(q), kmin, kmax, *on_device(table, num_blocks), impl="triton")
    expected = kernels.score_blocks(q, ref_min, ref_max, table, num_blocks, impl="torch")
    torch.testing.assert_close(scores.cpu(), expected, atol=1e-4, rtol=1e-5)


def test_merge_in_place_through_the_wrapper():
    gen = torch.Generator().manual_seed(4)
    o_a, o_b = torch.randn(3, 4, 64, generator=gen), torch.randn(3, 4, 64, generator=gen)
    lse_a, lse_b = torch.randn(3, 4, generator=gen), torch.randn(3, 4, generator=gen)
    lse_b[0] = float("-inf")
    expected = reference.merge_states(o_a, lse_a, o_b, lse_b)
    o_a, lse_a, o_b, lse_b = on_device(o_a, lse_a, o_b, lse_b)
    kernels.merge_attention_states_(o_a, lse_a, o_b, lse_b, impl="triton")
    assert_close(o_a, expected[0], torch.float32)
    assert_close(lse_a, expected[1], torch.float32, lse=True)
