"""The append stage of the decode step: the new token's K/V into its page, and a completed block's digest and
host copy.

digest -> select -> split -> device part (**append**, then attend) / CPU part -> merge -> recall.
One call per layer and step: on CUDA one Triton launch (triton/stage_append.py),
masked on the device (no host branch on which requests complete a block); on
the CPU a fixed sequence of torch ops, whose host copy (the native row copy)
skips the rows aimed at the host store's scratch page, so its work follows the
blocks completed, not the batch.

A token completes its block when its offset is S - 1. Then:
- digests: the block's min and max of K per channel go to row digest_rows[b] (the block's host page for an
  offloaded layer, its own page for quest's device-full layers): reference.block_digests of the page; with the
  estimate on, its value summary (kernels/value_summary.py) to the same row of value_summary;
- host copy (offloaded layers): the block's K and V go to page host_rows[b] of the host store. The block
  stays in the local window long after, so nothing reads that page before this write.
"""

from __future__ import annotations

import torch
from scout_sglang.kernels.block_copy import copy_block_rows
from scout_sglang.kernels.checks import check_paged_cache, check_tensor
from scout_sglang.kernels.digest import digests_into
from scout_sglang.kernels.dispatch import select_impl
from scout_sglang.layout import VALUE_SUMMARY_ROWS


def append_token(k_new: torch.Tensor, v_new: torch.Tensor, k_store: torch.Tensor, v_store: torch.Tensor,
                 pages: torch.Tensor, offsets: torch.Tensor, *, digest_min: torch.Tensor | None = None,
                 digest_max: torch.Tensor | None = None, digest_rows: torch.Tensor | None = None,
                 value_summary: torch.Tensor | None = None, host_k: torch.Tensor | None = None,
                 host_v: torch.Tensor | None = None,
                 host_rows: torch.Tensor | None = None, host_scratch: int = 0, impl: str | None = None,
                 validate: bool = True) -> None:
    """Append one token per request.

    Parameters
    ----------
    k_new, v_new : [B, Hkv, D], any float dtype (converted to the store's)
    k_store, v_store : [P, Hkv, S, D] paged device store
    pages, offsets : [B] int32 page and position of each request's token (padding rows: a scratch page)
    digest_min, digest_max, digest_rows : optional digests [R, Hkv, D] (store dtype) and [B] int32 rows
    value_summary : optional [R, Hkv, 3, D] (store dtype), with the digests: a completed block's value summary
    host_k, host_v, host_rows, host_scratch : optional host store [H, Hkv, S, D] (page-locked on CUDA), [B] int32
        pages, and the scratch page that host_rows names for the rows whose token completes nothing
    validate : check the arguments (the decode step checks its static buffers once and passes False)
    """
    if validate:
        _check(k_new, v_new, k_store, v_store, pages, offsets, digest_min, digest_max, digest_rows, value_summary,
               host_k, host_v, host_rows)
    if select_impl("append_token", k_store.device.type, impl) == "triton":
        from scout_sglang.kernels.triton.stage_append import append_token_triton

        append_token_triton(k_new, v_new, k_store, v_store, pages, offsets, digest_min=digest_min,
                            digest_max=digest_max, digest_rows=digest_rows, value_summary=value_summary, host_k=host_k,
                            host_v=host_v, host_rows=host_rows)
        return
    page, offset = pages.long(), offsets.long()
    k_store[page, :, offset] = k_new.to(k_store.dtype)
    v_store[page, :, offset] = v_new.to(v_store.dtype)
    if digest_min is not None:  # every row: the rows that complete nothing write to a scratch row nobody reads
        digests_into(k_store, pages, digest_min, digest_max, "torch", rows=digest_rows,
                     v_cache=None if value_summary is None else v_store, value_summary=value_summary)
    if host_k is not None:
        num_kv_heads = k_store.shape[1]
        head = torch.arange(num_kv_heads, device=page.device).view(1, -1)
        src = (page.view(-1, 1) * num_kv_heads + head).flatten()
        host = host_rows.long().view(-1, 1)
        skip = host_scratch * num_kv_heads
        dst = torch.where(host == host_scratch, skip, host * num_kv_heads + head).flatten()
        for store, target in ((k_store, host_k), (v_store, host_v)):
            if target.device == store.device:
                copy_block_rows(store.flatten(0, 1), src, target.flatten(0, 1), dst, skip_row=skip)
            else:  # the torch path on CUDA: device rows to the host store (a blocking copy; Triton's is not)
                rows = store.flatten(0, 1).index_select(0, src).to(target.device)
                target.flatten(0, 1).index_copy_(0, dst.to(target.device), rows)


def _check(k_new, v_new, k_store, v_store, pages, offsets, digest_min, digest_max, digest_rows, value_summary, host_k,
           host_v, host_rows):
    check_paged_cache(k_store, v_store)
    device = k_store.device
    _, num_kv_heads, _, head_dim = k_store.shape
    for name, t in (("k_new", k_new), ("v_new", v_new)):
        check_tensor(name, t, ndim=3, device=device, contiguous="rows")
        if t.shape[1:] != (num_kv_heads, head_dim):
            raise ValueError(f"{name} must be [B, {num_kv_heads}, {head_dim}], got {tuple(t.shape)}")
    batch_size = k_new.shape[0]
    if v_new.shape[0] != batch_size:
        raise ValueError(f"k_new and v_new have {batch_size} and {v_new.shape[0]} rows")
    for name, t in (("pages", pages), ("offsets", offsets), ("digest_rows", digest_rows), ("host_rows", host_rows)):
        if t is not None:
            check_tensor(name, t, ndim=1, dtypes=(torch.int32,), device=device, contiguous=False)
            if t.shape[0] != batch_size:
                raise ValueError(f"{name} must have {batch_size} entries, got {t.shape[0]}")
    if (digest_min is None) != (digest_rows is None) or (digest_min is None) != (digest_max is None):
        raise ValueError("digest_min, digest_max and digest_rows go together")
    if value_summary is not None and digest_min is None:
        raise ValueError("value_summary is written with the digests: pass digest_min, digest_max and digest_rows too")
    if digest_min is not None:
        for name, t, entry in (("digest_min", digest_min, (num_kv_heads, head_dim)),
                               ("digest_max", digest_max, (num_kv_heads, head_dim)),
                               ("value_summary", value_summary, (num_kv_heads, VALUE_SUMMARY_ROWS, head_dim))):
            if t is None:
                continue
            check_tensor(name, t, ndim=len(entry) + 1, dtypes=(k_store.dtype,), device=device)
            if t.shape[1:] != entry:
                raise ValueError(f"{name} must be [rows, {', '.join(map(str, entry))}], got {tuple(t.shape)}")
    if (host_k is None) != (host_rows is None) or (host_k is None) != (host_v is None):
        raise ValueError("host_k, host_v and host_rows go together")
    if host_k is not None:
        check_paged_cache(host_k, host_v)
        if host_k.shape[1:] != k_store.shape[1:] or host_k.dtype != k_store.dtype:
            raise ValueError(f"the host store {tuple(host_k.shape)} {host_k.dtype} does not hold the pages of "
                             f"{tuple(k_store.shape)} {k_store.dtype}")
