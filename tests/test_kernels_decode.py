"""kernels.sparse_decode (torch path here; every path on CUDA) against the reference."""

import pytest
import torch
from support import HAS_TRITON, assert_close, requires_cuda

from scout_sglang import kernels, reference
from scout_sglang.kernels.dispatch import is_available
from scout_sglang.layout import PAD_BLOCK
from scout_sglang.testing import random_block_lists, random_paged_kv

BLOCK = 16


def lists_for_lengths(kv_lengths, num_kv_heads, block_size):
    """Contiguous per-request pages covering each length; tail length per list."""
    num_pages = sum(-(-n // block_size) for n in kv_lengths)
    capacity = max(-(-n // block_size) for n in kv_lengths)
    table = torch.full((len(kv_lengths), num_kv_heads, capacity), PAD_BLOCK, dtype=torch.int32)
    counts = torch.zeros(len(kv_lengths), num_kv_heads, dtype=torch.int32)
    tail = torch.ones(len(kv_lengths), num_kv_heads, dtype=torch.int32)
    page = 0
    for b, n in enumerate(kv_lengths):
        blocks = -(-n // block_size)
        table[b, :, :blocks] = torch.arange(page, page + blocks, dtype=torch.int32)
        counts[b] = blocks
        tail[b] = n - (blocks - 1) * block_size
        page += blocks
    return table, counts, tail, num_pages


def contiguous_kv(k_cache, pages, length):
    """[length, Hkv, D] tokens of consecutive pages, for dense_decode."""
    k = k_cache[pages].permute(0, 2, 1, 3).reshape(-1, k_cache.shape[1], k_cache.shape[3])
    return k[:length]


@pytest.mark.parametrize("kv_len", [1, BLOCK - 1, BLOCK, BLOCK + 1, 97, 4097])
@pytest.mark.parametrize("group_size", [1, 4, 8])
def test_all_blocks_listed_equals_dense(kv_len, group_size):
    num_kv_heads, head_dim, dtype = 2, 64, torch.bfloat16
    table, counts, tail, num_pages = lists_for_lengths([kv_len], num_kv_heads, BLOCK)
    k_cache, v_cache = random_paged_kv(num_pages, num_kv_heads, BLOCK, head_dim, dtype=dtype, seed=kv_len)
    q = torch.randn(1, num_kv_heads * group_size, head_dim).to(dtype)
    o, lse = kernels.sparse_decode(q, k_cache, v_cache, table, counts, scale=0.125, last_block_len=tail)
    pages = table[0, 0, : counts[0, 0]].long()
    dense_o, dense_lse = reference.dense_decode(
        q[0], contiguous_kv(k_cache, pages, kv_len), contiguous_kv(v_cache, pages, kv_len), scale=0.125
    )
    assert_close(o[0], dense_o, dtype)
    assert_close(lse[0], dense_lse, dtype, lse=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_random_lists_mixed_lengths_match_reference(dtype, head_dim):
    num_kv_heads, group_size, num_pages, capacity = 4, 4, 40, 9
    counts_list = [[0, 9, 3, 1], [5, 5, 0, 2], [9, 9, 9, 9]]
    table, counts = random_block_lists(counts_list, num_pages=num_pages, capacity=capacity, seed=3)
    k_cache, v_cache = random_paged_kv(num_pages, num_kv_heads, BLOCK, head_dim, dtype=dtype, seed=4)
    q = torch.randn(3, num_kv_heads * group_size, head_dim).to(dtype)
    tail = torch.randint(1, BLOCK + 1, (3, num_kv_heads), dtype=torch.int32)
    o, lse = kernels.sparse_decode(q, k_cache, v_cache, table, counts, scale=head_dim**-0.5, last_block_len=tail)
    ref_o, ref_lse = reference.sparse_decode(
        q, k_cache, v_cache, table, counts, scale=head_dim**-0.5, last_block_len=tail
    )
    assert_close(o, ref_o, dtype)
    assert_close(lse, ref_lse, dtype, lse=True)
    empty = counts.repeat_interleave(group_size, dim=1) == 0
    assert torch.all(o[empty] == 0) and torch.all(torch.isneginf(lse[empty]))


def test_device_part_plus_cpu_part_merged_equals_dense():
    """Split each list between two disjoint parts, decode both, merge == whole."""
    num_kv_heads, group_size, head_dim, dtype = 2, 4, 64, torch.float32
    table, counts = random_block_lists([[12, 7], [3, 12]], num_pages=30, capacity=12, seed=5)
    k_cache, v_cache = random_paged_kv(30, num_kv_heads, BLOCK, head_dim, dtype=dtype, seed=6)
    q = torch.randn(2, num_kv_heads * group_size, head_dim)
    whole = kernels.sparse_decode(q, k_cache, v_cache, table, counts, scale=0.1)
    gpu_counts = counts // 2
    cpu_table = torch.full_like(table, PAD_BLOCK)
    for b in range(2):
        for h in range(num_kv_heads):
            rest = table[b, h, gpu_counts[b, h] : counts[b, h]]
            cpu_table[b, h, : rest.numel()] = rest
    gpu = kernels.sparse_decode(q, k_cache, v_cache, table, gpu_counts, scale=0.1)
    cpu = reference.sparse_decode(q, k_cache, v_cache, cpu_table, counts - gpu_counts, scale=0.1)
    o, lse = kernels.merge_attention_states(gpu[0], gpu[1], cpu[0].to(dtype), cpu[1])
    assert_close(o, whole[0], dtype)
    assert_close(lse, whole[1], dtype, lse=True)


def test_out_buffers_are_written_and_returned():
    table, counts = random_block_lists([[2, 3]], num_pages=6, capacity=3)
    k_cache, v_cache = random_paged_kv(6, 2, BLOCK, 64, dtype=torch.float32)
    q = torch.randn(1, 4, 64)
    out, out_lse = torch.empty_like(q), torch.empty(1, 4)
    o, lse = kernels.sparse_decode(q, k_cache, v_cache, table, counts, scale=0.1, out=out, out_lse=out_lse)
    assert o.data_ptr() == out.data_ptr() and lse.data_ptr() == out_lse.data_ptr()


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(q=torch.randn(1, 4, 64, dtype=torch.float16)), "q must have dtype"),
        (dict(q=torch.randn(1, 3, 64)), "multiple of num_kv_heads"),
        (dict(counts=torch.zeros(2, 2, dtype=torch.int32)), "counts must have shape"),
        (dict(block_table=torch.zeros(1, 2, 3, dtype=torch.int64)), "block_table must have dtype"),
        (dict(q=torch.randn(1, 4, 32)), "head_dim"),
        (dict(counts=torch.tensor([[2, 4]], dtype=torch.int32)), r"counts values must lie in \[0, 3\], got \[2, 4\]"),
        (dict(block_table=torch.tensor([[[0, 1, 6], [2, 3, 4]]], dtype=torch.int32)), r"block_table values must lie in \[-1, 5\]"),
    ],
)
def test_bad_arguments_say_expected_versus_actual(change, message):
    table, counts = random_block_lists([[2, 3]], num_pages=6, capacity=3)
    k_cache, v_cache = random_paged_kv(6, 2, BLOCK, 64, dtype=torch.float32)
    args = dict(q=torch.randn(1, 4, 64), block_table=table, counts=counts) | change
    with pytest.raises((ValueError, TypeError), match=message):
        kernels.sparse_decode(args["q"], k_cache, v_cache, args["block_table"], args["counts"], scale=0.1)


@requires_cuda
@pytest.mark.parametrize("impl", ["flashinfer", "triton", "torch"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_every_cuda_path_matches_reference(impl, dtype):
    if not is_available(impl, "cuda"):
        pytest.skip(f"{impl} not installed")
    counts_list = [[0, 9, 3, 1], [5, 5, 0, 2], [9, 9, 9, 9]]
    table, counts = random_block_lists(counts_list, num_pages=40, capacity=9, seed=3)
    k_cache, v_cache = random_paged_kv(40, 4, BLOCK, 128, dtype=dtype, seed=4)
    q = torch.randn(3, 32, 128).to(dtype)
    tail = torch.randint(1, BLOCK + 1, (3, 4), dtype=torch.int32)
    cuda = [t.cuda() for t in (q, k_cache, v_cache, table, counts, tail)]
    o, lse = kernels.sparse_decode(*cuda[:5], scale=0.088, last_block_len=cuda[5], impl=impl)
    ref_o, ref_lse = reference.sparse_decode(q, k_cache, v_cache, table, counts, scale=0.088, last_block_len=tail)
    assert_close(o, ref_o, dtype)
    assert_close(lse, ref_lse, dtype, lse=True)


def test_cuda_only_implementations_are_refused_on_cpu(monkeypatch):
    table, counts = random_block_lists([[2, 3]], num_pages=6, capacity=3)
    k_cache, v_cache = random_paged_kv(6, 2, BLOCK, 64, dtype=torch.float32)
    with pytest.raises(ValueError, match="not available for sparse_decode on cpu"):
        kernels.sparse_decode(torch.randn(1, 4, 64), k_cache, v_cache, table, counts, scale=0.1, impl="flashinfer")
    # On CPU tensors: torch always, FlashInfer never, Triton only under its interpreter (when installed).
    # is_available is cached for the session's TRITON_INTERPRET: both settings go through the uncached function.
    available = is_available.__wrapped__
    for interpret in ("0", "1"):
        monkeypatch.setenv("TRITON_INTERPRET", interpret)
        assert available("torch", "cpu") and not available("flashinfer", "cpu")
        assert available("triton", "cpu") == (interpret == "1" and HAS_TRITON)
    assert available("torch", "cuda")
