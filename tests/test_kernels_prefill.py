"""chunk_prefill_attention against the fp32 reference: a chunk at the end of a
longer sequence, GQA groups, lower precision, and bad shapes."""

import pytest
import torch
from support import requires_cuda

from scout_sglang.kernels.prefill import chunk_prefill_attention
from scout_sglang.reference.attention import dense_prefill


@pytest.mark.parametrize("new, total, heads, kv_heads", [(5, 5, 4, 2), (3, 40, 8, 2), (1, 9, 4, 4), (64, 100, 6, 3)])
def test_matches_the_reference(new, total, heads, kv_heads):
    gen = torch.Generator().manual_seed(new * total)
    q = torch.randn(new, heads, 32, generator=gen)
    k, v = torch.randn(total, kv_heads, 32, generator=gen), torch.randn(total, kv_heads, 32, generator=gen)
    got = chunk_prefill_attention(q, k, v, scale=32**-0.5)
    assert torch.allclose(got, dense_prefill(q, k, v, scale=32**-0.5), atol=1e-5)


def test_bf16_is_close_to_the_reference():
    gen = torch.Generator().manual_seed(1)
    q, k = torch.randn(7, 4, 32, generator=gen), torch.randn(20, 2, 32, generator=gen)
    v = torch.randn(20, 2, 32, generator=gen)
    got = chunk_prefill_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), scale=0.2)
    assert got.dtype == torch.bfloat16
    assert torch.allclose(got.float(), dense_prefill(q, k, v, scale=0.2), atol=3e-2)


def test_the_first_query_sees_only_the_prefix_and_itself():
    q = torch.zeros(2, 1, 4)
    k = torch.zeros(5, 1, 4)
    v = torch.arange(5, dtype=torch.float32).view(5, 1, 1).expand(5, 1, 4).contiguous()
    out = chunk_prefill_attention(q, k, v, scale=1.0)  # uniform weights over the visible tokens
    assert torch.allclose(out[0, 0], torch.full((4,), 1.5)) and torch.allclose(out[1, 0], torch.full((4,), 2.0))


def test_rejects_more_queries_than_keys_and_bad_groups():
    with pytest.raises(ValueError, match="must be the sequence's end"):
        chunk_prefill_attention(torch.zeros(4, 2, 8), torch.zeros(3, 1, 8), torch.zeros(3, 1, 8), scale=1.0)
    with pytest.raises(ValueError):
        chunk_prefill_attention(torch.zeros(4, 3, 8), torch.zeros(4, 2, 8), torch.zeros(4, 2, 8), scale=1.0)


@requires_cuda
def test_cuda_matches_the_reference():
    gen = torch.Generator().manual_seed(2)
    q, k = torch.randn(50, 8, 64, generator=gen), torch.randn(300, 2, 64, generator=gen)
    v = torch.randn(300, 2, 64, generator=gen)
    got = chunk_prefill_attention(q.cuda().half(), k.cuda().half(), v.cuda().half(), scale=0.125)
    assert torch.allclose(got.float().cpu(), dense_prefill(q, k, v, scale=0.125), atol=1e-2)
