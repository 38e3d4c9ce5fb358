"""Host store layouts for the CPU part, read side by side: what the memory gives each layout's random blocks.

The engine's host store today keeps K and V apart, [pages, Hkv, block, D] each: one selected (page, KV head)
is two random reads of block x D x 2 bytes (8 KiB at block 32, D 128, bf16). Longer contiguous runs may read
faster (fewer DRAM row and TLB misses, more of each prefetch stream used):

  k_v_8k          today: K and V apart, 8 KiB each
  kv_16k          K and V of one (page, KV head) adjacent: one 16 KiB run
  k_v_16k_b64     pages of 64 tokens: K and V apart, 16 KiB each (half as many blocks for the same tokens)
  kv_32k_b64      both: one 32 KiB run

Each is measured with the native module's `read_blocks` (the kernel's own walk and prefetch, no compute) over
the same number of tokens per list, so only the layout differs. An adjacent K/V layout is given to
`read_blocks` as a store of 2 x Hkv heads whose even heads are K and whose odd ones, offset by one block, are
V: the walk reads K at (page, 2h) and V right after it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from scout_sglang.cpu_worker.host_memory import alloc_host_tensor


@dataclass(frozen=True)
class Layout:
    name: str
    block_size: int
    adjacent: bool  # K and V of one (page, KV head) side by side
    what: str


LAYOUTS = (
    Layout("k_v_8k", 32, False, "today: K and V apart, 8 KiB blocks"),
    Layout("kv_16k", 32, True, "K and V of a block and head adjacent (16 KiB)"),
    Layout("k_v_16k_b64", 64, False, "pages of 64 tokens, K and V apart (16 KiB each)"),
    Layout("kv_32k_b64", 64, True, "pages of 64 tokens, K and V adjacent (32 KiB)"),
)


@dataclass
class LayoutStore:
    """One layout's store, as `read_blocks` walks it, and its block lists."""

    layout: Layout
    k_view: torch.Tensor  # [pages, heads, block, D] (heads = 2 Hkv when adjacent)
    v_view: torch.Tensor
    tables: list[tuple[torch.Tensor, torch.Tensor]]  # (pages [B, heads, n], counts [B, heads]) per batch
    block_bytes: int  # K and V bytes of one listed block
    nbytes: int


def make_store(layout: Layout, *, store_bytes: int, num_kv_heads: int, head_dim: int, batch_size: int,
               tokens_per_list: int, num_sets: int, seed: int = 0) -> LayoutStore:
    """A store of about `store_bytes` in `layout` (every byte written: untouched anonymous memory would read
    from the shared zero page) and `num_sets` batches of random lists of `tokens_per_list` tokens."""
    block_bytes = 2 * layout.block_size * head_dim * 2  # K and V, bf16
    pages = max(1, store_bytes // (block_bytes * num_kv_heads))
    # adjacent: one page more than listed, so that the V view (the K view shifted by one block) stays inside
    shape = (pages + 1, num_kv_heads, 2, layout.block_size, head_dim) if layout.adjacent else (
        2, pages, num_kv_heads, layout.block_size, head_dim)
    store, _ = alloc_host_tensor(shape, torch.bfloat16)
    store.fill_(1.0)
    if layout.adjacent:
        block = layout.block_size * head_dim
        size = (pages, 2 * num_kv_heads, layout.block_size, head_dim)
        stride = (2 * num_kv_heads * block, block, head_dim, 1)
        k_view = torch.as_strided(store, size, stride, 0)
        v_view = torch.as_strided(store, size, stride, block)
    else:
        k_view, v_view = store[0], store[1]
    blocks = max(1, tokens_per_list // layout.block_size)
    gen = torch.Generator().manual_seed(seed)
    heads = k_view.shape[1]
    tables = []
    for _ in range(num_sets):
        table = torch.zeros(batch_size, heads, blocks, dtype=torch.int32)
        counts = torch.zeros(batch_size, heads, dtype=torch.int32)
        step = 2 if layout.adjacent else 1  # adjacent: the K heads list, the V heads (odd) list nothing
        for b in range(batch_size):
            for h in range(0, heads, step):
                table[b, h] = torch.randperm(pages, generator=gen)[:blocks].int()
                counts[b, h] = min(blocks, pages)
        tables.append((table, counts))
    return LayoutStore(layout, k_view, v_view, tables, block_bytes, store.numel() * 2)

