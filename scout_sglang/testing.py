"""Random paged KV caches and block lists for tests and benchmarks.

Pure torch, deterministic from a seed; no pytest import, so benchmarks use it too.
Layout: scout_sglang.layout.
"""

from __future__ import annotations

import torch

from scout_sglang.layout import PAD_BLOCK


def random_paged_kv(
    num_pages: int,
    num_kv_heads: int,
    block_size: int,
    head_dim: int,
    *,
    dtype: torch.dtype = torch.bfloat16,
    seed: int = 0,
    device: str = "cpu",
) -> tuple[torch.Tensor, torch.Tensor]:
    """(k_cache, v_cache), each [num_pages, Hkv, S, D], values ~ N(0, 1)."""
    gen = torch.Generator().manual_seed(seed)
    shape = (num_pages, num_kv_heads, block_size, head_dim)
    k = torch.randn(shape, generator=gen).to(dtype)
    v = torch.randn(shape, generator=gen).to(dtype)
    return k.to(device), v.to(device)


def random_block_lists(
    counts: list[list[int]], *, num_pages: int, capacity: int, seed: int = 0, device: str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per (request, KV head) lists of distinct random page ids.

    counts : nested [B][Hkv] list of list lengths (each <= capacity and <= num_pages)
    Returns block_table [B, Hkv, capacity] int32 (PAD_BLOCK past each count) and
    counts [B, Hkv] int32.
    """
    gen = torch.Generator().manual_seed(seed)
    batch_size, num_kv_heads = len(counts), len(counts[0])
    table = torch.full((batch_size, num_kv_heads, capacity), PAD_BLOCK, dtype=torch.int32)
    for b in range(batch_size):
        for h in range(num_kv_heads):
            n = counts[b][h]
            table[b, h, :n] = torch.randperm(num_pages, generator=gen)[:n].to(torch.int32)
    count_tensor = torch.tensor(counts, dtype=torch.int32)
    return table.to(device), count_tensor.to(device)
