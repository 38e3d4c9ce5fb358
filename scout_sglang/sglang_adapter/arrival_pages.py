"""The arrival pool as the engine's host store: one host copy of the K/V on a PD decode instance.

The arrival pool (kv_pool.py) is where the transfer engine, or a stock prefill
backend, writes a request's K/V: per layer a token-major buffer
[(L + S), Hkv, D] whose page p holds token slots [p * S, (p + 1) * S). When
SGLang's page size S is the engine's block size, a request's block j is
exactly one page (SGLang's paged allocator gives token j * S + i the slot
page_j * S + i), so the engine keeps its full blocks there instead of in a
store of its own:

  - the store is each offloaded layer's buffer viewed as [pages, Hkv, S, D]
    (page 0, SGLang's padding page, is its scratch page);
  - the pages of a request's blocks: the prompt's from req_to_token at
    admission (block_pages, the partial last block's too); the page of a block
    a decode step starts from that step's token slot, on the device
    (core/device_tables.py: planning reads no device value);
  - admission writes each full block back into its own page in the engine's
    head-major layout (one KV head's block is then one contiguous run of
    S * D values, what the CPU attention and the recall copies read), and
    builds its digests; nothing is copied to a second store;
  - SGLang allocates and frees the pages; the engine only forgets them.
"""

from __future__ import annotations

import torch

from scout_sglang.cpu_worker.host_memory import register_page_locked


def shares_arrival_pool(page_size: int, block_size: int) -> bool:
    """Whether the engine can keep its blocks in the arrival pool: its pages are the engine's blocks."""
    return page_size == block_size


def borrowed_host_store(pool, layers, block_size: int, device):
    """The arrival pool's pages of `layers` as a BorrowedHostStore. On CUDA the pool's memory is page-locked in
    place, so recall copies read it on the stream as they read the engine's own store: kv_pool.host_pool_like
    allocated it page-locked already (host_memory.alloc_host_buffer); anything not yet registered is registered
    here by the same code (host_memory.register_page_locked), and unregistered when freed."""
    from scout_sglang.core.stores import BorrowedHostStore

    heads, dim = pool.head_num, pool.head_dim
    k = {layer: pool.get_key_buffer(layer).view(-1, heads, block_size, dim) for layer in layers}
    v = {layer: pool.get_value_buffer(layer).view(-1, heads, block_size, dim) for layer in layers}
    if torch.device(device).type == "cuda":
        register_page_locked([*k.values(), *v.values()], what="the arrival pool")
    return BorrowedHostStore(k, v, scratch_page=0)


def block_pages(slots: torch.Tensor, size: int, rid: int, *, partial: bool = False) -> list[int]:
    """Pages of a request's full blocks from its token slots [N] (page = slot // size), checking that block j's
    tokens fill one page in order, as SGLang's paged allocator lays them out; with `partial`, the partial last
    block's page too (its tokens the start of one page, in order). At a request's admission (once)."""
    full = slots.shape[0] // size * size
    blocks = slots[:full].view(-1, size)
    pages = blocks[:, 0] // size
    expected = pages.view(-1, 1) * size + torch.arange(size, device=slots.device)
    tail = slots[full:]
    tail_ok = tail.numel() == 0 or torch.equal(tail, tail[0] + torch.arange(tail.numel(), device=slots.device))
    if not torch.equal(blocks, expected) or (partial and (not tail_ok or (tail.numel() and int(tail[0]) % size))):
        raise RuntimeError(f"request slot {rid}: its token slots are not whole pages of {size} in order, so the "
                           "arrival pool's pages cannot be the engine's blocks")
    if partial and tail.numel():
        pages = torch.cat([pages, tail[:1] // size])
    return pages.tolist()
