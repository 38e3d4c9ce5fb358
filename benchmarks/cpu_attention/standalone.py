"""The CPU part's kernel on its own, at the shape and thread count of an engine's CPU part: what bench_gpu sets the
in-engine rate against, in the same call on the same host.

`standalone_native_gbs` times the native kernel called directly (plan.measure.KernelThreads: one thread per
sequence, GIL released), over random blocks of a host store far larger than the caches, at `threads` threads and
a batch x KV heads x blocks like the engine's step: GB/s of K+V read, the best of a few rounds.
"""

from __future__ import annotations

import time

import torch


def standalone_native_gbs(*, threads: int, batch: int, num_kv_heads: int, group_size: int, head_dim: int,
                          block_size: int, blocks_per_head: int, store_gib: float = 2.0, rounds: int = 3,
                          cpus: list[int] | None = None) -> dict:
    """-> {"gbs": best GB/s, "threads", "shape"}; None figures when the native kernel does not build here.

    cpus : the CPU of each thread (the engine's workers' CPUs, so that both run on the same cores); None: the
        caller's CPUs"""
    from scout_sglang.cpu_worker.dispatch import make_kernel
    from scout_sglang.cpu_worker.native_kernel import load_native
    from scout_sglang.plan.measure import KernelThreads

    shape = dict(threads=threads, batch=batch, num_kv_heads=num_kv_heads, blocks_per_head=blocks_per_head)
    if load_native().module is None:
        return dict(gbs=None, why="the native kernel does not build here", **shape)
    block_bytes = block_size * head_dim * 2  # one KV head's K (or V) block, bf16
    pages = max(blocks_per_head + 1, int(store_gib * 2**30 / (2 * num_kv_heads * block_bytes)))
    gen = torch.Generator().manual_seed(0)
    store = (pages, num_kv_heads, block_size, head_dim)
    k_cache = torch.empty(store, dtype=torch.bfloat16).normal_(generator=gen)
    v_cache = torch.empty(store, dtype=torch.bfloat16).normal_(generator=gen)
    q = torch.randn(batch, num_kv_heads * group_size, head_dim, generator=gen).to(torch.bfloat16)
    out_o = torch.empty(q.shape, dtype=torch.float32)
    out_lse = torch.empty(q.shape[:2], dtype=torch.float32)
    tables = [torch.randint(0, pages, (batch, num_kv_heads, blocks_per_head), generator=gen, dtype=torch.int32)
              for _ in range(4)]
    counts = torch.full((batch, num_kv_heads), blocks_per_head, dtype=torch.int32)
    nbytes = 2 * batch * num_kv_heads * blocks_per_head * block_bytes
    runner = KernelThreads(make_kernel("native"), threads, cpus=cpus)
    best = 0.0
    try:
        for attempt in range(rounds + 1):  # the first pass warms up
            start = time.perf_counter()
            for table in tables:
                runner.wait(runner.submit(q, k_cache, v_cache, table, counts, scale=head_dim**-0.5, out_o=out_o,
                                          out_lse=out_lse))
            if attempt:
                best = max(best, nbytes * len(tables) / (time.perf_counter() - start) / 1e9)
    finally:
        runner.shutdown()
    return dict(gbs=round(best, 2), **shape)
