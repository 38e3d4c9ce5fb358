"""Shared builders for the CPU attention worker tests (no tests here; imported by the others)."""

from __future__ import annotations

import pytest
import torch

from scout_sglang.cpu_worker import CpuAttentionPool
from scout_sglang.cpu_worker.native_kernel import load_native
from scout_sglang.testing import random_block_lists, random_paged_kv

IMPLS = ("native", "torch")


def make_pool(impl: str, num_groups: int = 2, threads_per_group: int = 1, **kwargs) -> CpuAttentionPool:
    """A pool of `impl`; skips the test when the native kernel cannot be built here."""
    if impl == "native" and load_native().module is None:
        pytest.skip(f"native CPU kernel unavailable: {load_native().error}")
    return CpuAttentionPool(num_groups, threads_per_group, impl=impl, **kwargs)


def make_case(
    counts: list[list[int]],
    *,
    group_size: int,
    head_dim: int,
    block_size: int = 16,
    dtype: torch.dtype = torch.bfloat16,
    num_pages: int = 48,
    capacity: int | None = None,
    seed: int = 0,
) -> dict:
    """Random q, paged KV and block lists for counts [B][Hkv]."""
    batch_size, num_kv_heads = len(counts), len(counts[0])
    capacity = capacity or max(max(row) for row in counts) or 1
    k_cache, v_cache = random_paged_kv(num_pages, num_kv_heads, block_size, head_dim, dtype=dtype, seed=seed)
    block_table, count_tensor = random_block_lists(counts, num_pages=num_pages, capacity=capacity, seed=seed + 1)
    gen = torch.Generator().manual_seed(seed + 2)
    q = torch.randn(batch_size, num_kv_heads * group_size, head_dim, generator=gen).to(dtype)
    return dict(q=q, k_cache=k_cache, v_cache=v_cache, block_table=block_table, counts=count_tensor)


def outputs_for(case: dict, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """out_o / out_lse filled with garbage, so unwritten rows show up."""
    batch_size, num_qo_heads, head_dim = case["q"].shape
    out_o = torch.full((batch_size, num_qo_heads, head_dim), float("nan"), dtype=dtype)
    out_lse = torch.full((batch_size, num_qo_heads), float("nan"))
    return out_o, out_lse


def run(pool: CpuAttentionPool, case: dict, *, scale: float, out_dtype: torch.dtype = torch.float32, **kwargs):
    """Submit one batch, wait, return (o, lse)."""
    out_o, out_lse = outputs_for(case, out_dtype)
    handle = pool.submit(
        case["q"], case["k_cache"], case["v_cache"], case["block_table"], case["counts"],
        scale=scale, out_o=out_o, out_lse=out_lse, **kwargs,
    )  # fmt: skip
    pool.wait(handle)
    return out_o, out_lse
