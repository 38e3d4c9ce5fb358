"""The CPU part computed by the layer itself, when its CPU task failed or missed its deadline.

digest -> select -> device part / CPU part (here, in place of the worker) -> merge.
The inputs are the task's own (the staged query, host page lists and counts)
over the same host store, so the merge gives what the task would have given, up
to the kernels' rounding. On the CPU the host store is attended where it lies.
On CUDA the listed (page, KV head) rows are first copied to a scratch device
store (the row copy recall uses), list entry (b, h, c) going to scratch page
b * C + c:

    pages [B, Hkv, C] host page ids --row p * Hkv + h--> scratch [B * C, Hkv, S, D]
    scratch table [b, h, c] = b * C + c    (counts unchanged)
"""

from __future__ import annotations

import torch

from scout_sglang import kernels


def attend_listed_host_blocks(q: torch.Tensor, host_k: torch.Tensor, host_v: torch.Tensor, pages: torch.Tensor,
                              counts: torch.Tensor, *, scale: float, device: torch.device, impl: str | None = None,
                              gather: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of q over the listed host blocks, as the CPU task computes it.

    Parameters
    ----------
    q : [B, Hq, D] dtype of the store, any device: the query the task was given
    host_k, host_v : [P, Hkv, S, D] the layer's host store (page-locked on CUDA)
    pages : [B, Hkv, C] int32 host pages, any device; entries at or past counts are ignored (may be PAD)
    counts : [B, Hkv] int32, any device
    scale : softmax scale
    device : where the result is computed and returned
    impl : sparse_decode implementation (None: kernels' choice for the device)
    gather : copy the listed rows to a scratch device store first; default: when device is not the CPU
        (on the CPU, True takes the CUDA path's index arithmetic, for tests)

    Returns
    -------
    o : [B, Hq, D] fp32 (the store's dtype rounded: exact for fp32 stores)
    lse : [B, Hq] fp32 natural log (-inf for an empty list)
    """
    device = torch.device(device)
    gather = device.type != "cpu" if gather is None else gather
    q, pages, counts = q.to(device), pages.to(device), counts.to(device)
    if gather:
        k_store, v_store, pages = _gather_listed_rows(host_k, host_v, pages, device=device)
    else:
        if host_k.device != device:
            raise ValueError(f"the host store is on {host_k.device}; attending it on {device} needs gather=True")
        k_store, v_store = host_k, host_v
    o, lse = kernels.sparse_decode(q.contiguous(), k_store, v_store, pages.contiguous(), counts.contiguous(),
                                   scale=scale, impl=impl)
    return o.float(), lse


def _gather_listed_rows(host_k, host_v, pages, *, device):
    """Copy the listed (page, head) rows to a scratch store on `device`
    -> (k [B*C, Hkv, S, D], v [B*C, Hkv, S, D], table [B, Hkv, C] int32)."""
    num_pages, num_kv_heads, block_size, head_dim = host_k.shape
    batch_size, _, capacity = pages.shape
    head = torch.arange(num_kv_heads, device=device).view(1, num_kv_heads, 1)
    # Entries past counts may be PAD: they copy row 0 of page 0 and are never read.
    src_rows = (pages.clamp(min=0).long() * num_kv_heads + head).transpose(1, 2).reshape(-1)  # [B * C * Hkv]
    dst_rows = torch.arange(src_rows.numel(), device=device)
    scratch = []
    for store in (host_k, host_v):
        rows = torch.empty(batch_size * capacity * num_kv_heads, block_size, head_dim, dtype=store.dtype,
                           device=device)  # [B * C * Hkv, S, D]
        kernels.copy_block_rows(store.view(num_pages * num_kv_heads, block_size, head_dim), src_rows, rows, dst_rows)
        scratch.append(rows.view(batch_size * capacity, num_kv_heads, block_size, head_dim))
    table = torch.arange(batch_size * capacity, dtype=torch.int32, device=device).view(batch_size, 1, capacity)
    return scratch[0], scratch[1], table.expand(batch_size, num_kv_heads, capacity)
