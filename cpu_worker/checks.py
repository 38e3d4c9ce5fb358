"""The range checks of a staged part's block lists, run by the Python worker before the kernel reads them.

Wrappers validate, kernels never do: the native kernel reads the paged cache
through raw page ids, so an id out of range here would be a wild read there.
FlagWorker (flag_worker.py) checks each row it attends with this; the native
pool checks its rows in C++ (native/worker_pool.h). Every message states the
allowed range and the bad value with its place. Costs O(B * Hkv * C) on small
int32 tables, no pass over the KV cache.
"""

from __future__ import annotations

import torch


def check_block_lists(block_table: torch.Tensor, counts: torch.Tensor, *, num_pages: int) -> None:
    """Raise ValueError unless 0 <= counts <= C and every page id within counts is in [0, num_pages).

    block_table : [B, Hkv, C] int32, CPU; entries at or past counts are not read (padding, e.g. -1)
    counts : [B, Hkv] int32, CPU
    num_pages : P, pages of the host cache the ids index
    """
    capacity = block_table.shape[2]
    low, high = int(counts.min()), int(counts.max())
    if low < 0 or high > capacity:
        bad = int(low) if low < 0 else int(high)
        where = tuple(int(i) for i in (counts == bad).nonzero()[0])
        raise ValueError(f"counts must be in [0, {capacity}] (block_table capacity), got {bad} at {where}")
    counted = torch.arange(capacity, dtype=torch.int32) < counts.unsqueeze(-1)  # [B, Hkv, C]
    ids = block_table[counted]
    if ids.numel() == 0:
        return
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or high >= num_pages:
        bad = low if low < 0 else high
        where = tuple(int(i) for i in ((block_table == bad) & counted).nonzero()[0])
        raise ValueError(
            f"block_table page ids within counts must be in [0, {num_pages}) (num_pages of the cache), "
            f"got {bad} at {where}"
        )
