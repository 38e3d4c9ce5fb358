"""Per-(request, KV head) block lists for the device part of co-attention.

Each list feeds kernels.sparse_decode: page ids into one paged cache, with the
partial tail (if any) last so `last_block_len` applies to it. All counts are
taken AFTER the current step's token is appended.
"""

from __future__ import annotations

import torch

from scout_sglang.layout import PAD_BLOCK


def finish_lists(rows: list[list[list[int]]], tails: list[int], *, block_size: int, device):
    """rows[b][h] = page ids -> (block_table [B, Hkv, C], counts, last_block_len) int32."""
    batch_size, num_kv_heads = len(rows), len(rows[0])
    capacity = max(1, max(len(pages) for heads in rows for pages in heads))
    table = torch.full((batch_size, num_kv_heads, capacity), PAD_BLOCK, dtype=torch.int32)
    counts = torch.zeros(batch_size, num_kv_heads, dtype=torch.int32)
    for b, heads in enumerate(rows):
        for h, pages in enumerate(heads):
            table[b, h, : len(pages)] = torch.tensor(pages, dtype=torch.int32)
            counts[b, h] = len(pages)
    last = torch.tensor([[tail if tail else block_size] * num_kv_heads for tail in tails], dtype=torch.int32)
    return table.to(device), counts.to(device), last.to(device)


def full_store_lists(store, rids, num_tokens, *, num_kv_heads, device):
    """Every block of each request (dense attention over the device-full store)."""
    rows, tails = [], []
    for rid, n in zip(rids, num_tokens):
        pages = store.page_table(rid)[: -(-n // store.block_size)]
        rows.append([pages] * num_kv_heads)
        tails.append(n % store.block_size)
    return finish_lists(rows, tails, block_size=store.block_size, device=device)


def quest_lists(store, rids, num_tokens, selected, counts, *, device):
    """Selected full blocks (per head) plus the tail of each request."""
    selected, counts = selected.cpu(), counts.cpu()
    rows, tails = [], []
    for b, (rid, n) in enumerate(zip(rids, num_tokens)):
        table = store.page_table(rid)
        num_full, tail = divmod(n, store.block_size)
        heads = []
        for h in range(selected.shape[1]):
            pages = [table[j] for j in selected[b, h, : counts[b, h]].tolist()]
            if tail:
                pages.append(table[num_full])
            heads.append(pages)
        rows.append(heads)
        tails.append(tail)
    return finish_lists(rows, tails, block_size=store.block_size, device=device)


def offloaded_lists(store, layer, rids, slots, num_tokens, *, num_kv_heads, device, only_blocks=None, use_resident=True):
    """Resident blocks (optionally only those in `only_blocks[b][h]`) then the window.

    The window (sink, local full blocks, tail) is listed in ascending block
    order so the partial tail, when present, is the last entry.
    """
    rows, tails = [], []
    for b, (rid, slot, n) in enumerate(zip(rids, slots, num_tokens)):
        window = [store.window_page(rid, j) for j in store.window_blocks(n)]
        resident = store.resident_map[layer][slot] if use_resident else None
        heads = []
        for h in range(num_kv_heads):
            pages = []
            if resident is not None:
                wanted = None if only_blocks is None else only_blocks[b][h]
                for r, block in enumerate(resident[h].tolist()):
                    if block != PAD_BLOCK and (wanted is None or block in wanted):
                        pages.append(store.resident_page(rid, r))
            heads.append(pages + window)
        rows.append(heads)
        tails.append(n % store.block_size)
    return finish_lists(rows, tails, block_size=store.block_size, device=device)
