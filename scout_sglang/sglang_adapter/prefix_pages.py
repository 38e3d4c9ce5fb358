"""SGLang's page ids as the engine's pages: prefix reuse under the radix cache.

With the radix cache on, scout runs with --page-size equal to its block size,
and the engine keeps every block of every layer in the page SGLang's paged
allocator gave it (CoAttentionEngine(assigned_pages=True)): block j of a
request lives in page req_to_token[rid, j * S] // S of the host store (the
offloaded layers, and their digests) and of the device store (dense layers).

  - A new request whose prompt starts with a cached prefix of P tokens (SGLang
    matches whole pages, so P is a multiple of S) adopts the P / S pages the
    radix tree holds: they were written, in the engine's layout, by the
    request that computed them. Prefill runs from P on.
  - The page of each later block is assigned when SGLang allocates it: at
    prefill for a chunk's blocks (one read of req_to_token per chunk); at a
    decode step for the block its token starts, on the device, from the step's
    token slot (page = slot // S, core/device_tables.py), so that planning a
    step reads no device value.
  - After a checkpoint (SGLang inserts a running request's tokens into the
    tree) the request may be moved onto the tree's copy of blocks it computed
    itself, and its own pages freed: the engine's table follows
    (rebind_from_pool).
  - SGLang frees and evicts pages; the engine only forgets them. A page a
    running request uses is locked in the tree, so it is never evicted.
"""

from __future__ import annotations

import torch


def first_slots(req_to_token: torch.Tensor, pairs: list[tuple[int, int]]) -> list[int]:
    """req_to_token[rid, token] for each (rid, token): one gather, one read (a device read on a GPU)."""
    if not pairs:
        return []
    rows = torch.tensor([rid for rid, _ in pairs], device=req_to_token.device)
    columns = torch.tensor([token for _, token in pairs], device=req_to_token.device)
    return req_to_token[rows, columns].tolist()


def pages_of(slots: list[int], size: int, where: list[tuple[int, int]]) -> list[int]:
    """Pages of the blocks whose first token slots are `slots`, checking each starts a page of `size`."""
    for (rid, token), slot in zip(where, slots):
        if slot % size:
            raise RuntimeError(f"request slot {rid}: token {token} starts a block at token slot {slot}, not at the "
                               f"start of a page of {size}: run the scout backend with --page-size {size} under "
                               "the radix cache")
    return [slot // size for slot in slots]


def block_pages(req_to_token: torch.Tensor, rows: list[tuple[int, int, int]], size: int) -> list[list[int]]:
    """For each (rid, first_block, end_block): the pages of blocks [first_block, end_block) of rid."""
    where = [(rid, block * size) for rid, first, end in rows for block in range(first, end)]
    pages = iter(pages_of(first_slots(req_to_token, where), size, where))
    return [[next(pages) for _ in range(first, end)] for _, first, end in rows]
