"""The benchmark's memory ceiling (native read_blocks) reads exactly the blocks a decode call reads.

bench_cpu_attention sets the kernel's GB/s against read_blocks' GB/s over the same block lists; that
comparison means something only if read_blocks touches every listed K and V block of the sequence and
nothing else. Its result is the XOR of all 64-bit words it read, recomputed here from the tensors.
"""

import numpy as np
import pytest
import torch

from scout_sglang.cpu_worker.native_kernel import load_native


def native_module():
    module = load_native().module
    if module is None:
        pytest.skip("the native CPU kernel did not build on this host")
    return module


def xor_of_listed_blocks(k_cache, v_cache, block_table, counts, batch_index) -> int:
    words = np.uint64(0)
    for head in range(k_cache.shape[1]):
        for i in range(int(counts[batch_index, head])):
            page = int(block_table[batch_index, head, i])
            for cache in (k_cache, v_cache):
                block = cache[page, head].contiguous().view(torch.uint8).numpy().view(np.uint64)
                words ^= np.bitwise_xor.reduce(block.ravel())
    return int(words) >> 1  # the binding returns the XOR shifted into int64


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("block_size, head_dim", [(32, 128), (16, 64), (8, 32)])
def test_read_blocks_reads_every_listed_block_and_no_other(dtype, block_size, head_dim):
    module = native_module()
    gen = torch.Generator().manual_seed(0)
    num_pages, num_kv_heads, capacity = 23, 3, 7
    shape = (num_pages, num_kv_heads, block_size, head_dim)
    k_cache = torch.randn(shape, generator=gen).to(dtype)
    v_cache = torch.randn(shape, generator=gen).to(dtype)
    block_table = torch.randint(0, num_pages, (2, num_kv_heads, capacity), generator=gen, dtype=torch.int32)
    counts = torch.tensor([[7, 0, 3], [1, 6, 2]], dtype=torch.int32)  # an empty list, a full one, partial ones
    for batch_index in range(2):
        got = module.read_blocks(k_cache, v_cache, block_table, counts, batch_index, 4, 0, num_kv_heads)
        assert got == xor_of_listed_blocks(k_cache, v_cache, block_table, counts, batch_index)
    # Entries past a list's count are not read: changing them changes nothing.
    block_table[0, 1, :] = (block_table[0, 1, :] + 1) % num_pages
    again = module.read_blocks(k_cache, v_cache, block_table, counts, 0, 4, 0, num_kv_heads)
    assert again == xor_of_listed_blocks(k_cache, v_cache, block_table, counts, 0)
