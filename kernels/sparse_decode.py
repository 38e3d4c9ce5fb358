"""Sparse decode: one query token per request over per-KV-head block lists.

The device part of digest -> select -> device part / CPU part -> merge (and the
`quest` mode's whole attention). Returns (o, lse) so it can be merged with the
CPU part. Lists are fixed-capacity with counts; the last listed block of a
list may be partial (`last_block_len`), which is how the tail is attended.
"""

from __future__ import annotations

import torch
from scout_sglang.kernels.checks import (
    check_group_size,
    check_paged_cache,
    check_shape,
    check_tensor,
    check_values_in_range,
)
from scout_sglang.kernels.dispatch import select_impl


def sparse_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    counts: torch.Tensor,
    *,
    scale: float,
    last_block_len: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    out_lse: torch.Tensor | None = None,
    impl: str | None = None,
    validate: bool = True,
    workspace: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention over the listed blocks of a paged KV cache.

    Parameters
    ----------
    q : [B, Hq, D], dtype of the cache
    k_cache, v_cache : [P, Hkv, S, D] (scout_sglang.layout)
    block_table : [B, Hkv, C] int32 page ids; entries past `counts` ignored
    counts : [B, Hkv] int32, each in [0, C]
    scale : softmax scale
    last_block_len : optional [B, Hkv] int32 in [1, S]; tokens valid in the
        last counted block of each list (None: all blocks full)
    out : optional [B, Hq, D] dtype of q; out_lse : optional [B, Hq] fp32
    validate : check the arguments, index ranges included by reading values back (a host
        sync on a GPU); the decode step passes False, with out= and out_lse= given and its
        static buffers checked once
    workspace : optional flat fp32 buffer for the Triton path's split partials
        (triton/decode.py workspace_size); None: allocated when needed

    Returns
    -------
    o : [B, Hq, D] dtype of q (zeros for an empty list)
    lse : [B, Hq] fp32 natural log (-inf for an empty list)
    """
    if validate:
        out, out_lse = _check_decode_args(q, k_cache, v_cache, block_table, counts, last_block_len, out, out_lse)
    elif out is None or out_lse is None:
        raise ValueError("sparse_decode(validate=False) needs out= and out_lse=")
    device = q.device
    choice = select_impl("sparse_decode", device.type, impl)
    if choice == "flashinfer":
        from scout_sglang.kernels.flashinfer_ops import sparse_decode_flashinfer

        sparse_decode_flashinfer(q, k_cache, v_cache, block_table, counts, last_block_len, out, out_lse, scale=scale)
    elif choice == "triton":
        from scout_sglang.kernels.triton import sparse_decode_triton

        sparse_decode_triton(q, k_cache, v_cache, block_table, counts, last_block_len, out, out_lse, scale=scale,
                             workspace=workspace)
    else:
        o, lse = sparse_decode_torch(q, k_cache, v_cache, block_table, counts, last_block_len, scale=scale)
        out.copy_(o)
        out_lse.copy_(lse)
    return out, out_lse


def _check_decode_args(q, k_cache, v_cache, block_table, counts, last_block_len, out, out_lse):
    """Every argument of sparse_decode; returns (out, out_lse), allocated where None."""
    check_paged_cache(k_cache, v_cache)
    device, dtype = k_cache.device, k_cache.dtype
    check_tensor("q", q, ndim=3, dtypes=(dtype,), device=device)
    batch_size, num_qo_heads, head_dim = q.shape
    _, num_kv_heads, _, cache_dim = k_cache.shape
    if cache_dim != head_dim:
        raise ValueError(f"q head_dim {head_dim} != cache head_dim {cache_dim}")
    check_group_size(num_qo_heads, num_kv_heads)
    check_tensor("block_table", block_table, ndim=3, dtypes=(torch.int32,), device=device)
    if block_table.shape[:2] != (batch_size, num_kv_heads):
        raise ValueError(
            f"block_table must be [B, Hkv, C] = [{batch_size}, {num_kv_heads}, C], got {tuple(block_table.shape)}"
        )
    check_tensor("counts", counts, dtypes=(torch.int32,), device=device)
    check_shape("counts", counts, (batch_size, num_kv_heads))
    if last_block_len is not None:
        check_tensor("last_block_len", last_block_len, dtypes=(torch.int32,), device=device)
        check_shape("last_block_len", last_block_len, (batch_size, num_kv_heads))
        check_values_in_range("last_block_len", last_block_len, 1, k_cache.shape[2])
    check_values_in_range("counts", counts, 0, block_table.shape[2])
    check_values_in_range("block_table", block_table, -1, k_cache.shape[0] - 1)
    if out is None:
        out = torch.empty_like(q)
    if out_lse is None:
        out_lse = torch.empty(batch_size, num_qo_heads, dtype=torch.float32, device=device)
    check_tensor("out", out, dtypes=(dtype,), device=device)
    check_shape("out", out, q.shape)
    check_tensor("out_lse", out_lse, dtypes=(torch.float32,), device=device)
    check_shape("out_lse", out_lse, (batch_size, num_qo_heads))
    return out, out_lse


def sparse_decode_torch(q, k_cache, v_cache, block_table, counts, last_block_len, *, scale):
    """Batched torch path: gather the listed blocks, masked softmax in fp32.

    Memory is O(B * Hkv * C * S * D): meant for the CPU "device" of CPU-only
    runs and for moderate list capacities. Returns (o fp32, lse fp32).
    """
    batch_size, num_qo_heads, head_dim = q.shape
    num_pages, num_kv_heads, block_size, _ = k_cache.shape
    group_size = num_qo_heads // num_kv_heads
    capacity = block_table.shape[2]
    # (page, head) -> row of the cache viewed as [P * Hkv, S, D]; padding reads row 0.
    head = torch.arange(num_kv_heads, device=q.device).view(1, num_kv_heads, 1)
    rows = (block_table.clamp(min=0).long() * num_kv_heads + head).flatten()
    k = k_cache.view(num_pages * num_kv_heads, block_size, head_dim).index_select(0, rows)
    v = v_cache.view(num_pages * num_kv_heads, block_size, head_dim).index_select(0, rows)
    k = k.view(batch_size, num_kv_heads, capacity * block_size, head_dim).float()
    v = v.view(batch_size, num_kv_heads, capacity * block_size, head_dim).float()

    block_pos = torch.arange(capacity, device=q.device).view(1, 1, capacity, 1)
    token_pos = torch.arange(block_size, device=q.device).view(1, 1, 1, block_size)
    n = counts.long().unsqueeze(-1).unsqueeze(-1)  # [B, Hkv, 1, 1]
    valid = block_pos < n
    if last_block_len is not None:
        tail = last_block_len.long().unsqueeze(-1).unsqueeze(-1)
        valid = valid & ((block_pos < n - 1) | (token_pos < tail))
    else:
        valid = valid.expand(-1, -1, -1, block_size)
    valid = valid.reshape(batch_size, num_kv_heads, 1, capacity * block_size)

    qf = q.float().view(batch_size, num_kv_heads, group_size, head_dim)
    logits = torch.matmul(qf, k.transpose(-1, -2)) * scale  # [B, Hkv, G, C*S]
    logits = logits.masked_fill(~valid, float("-inf"))
    lse = torch.logsumexp(logits, dim=-1)  # -inf where the list is empty
    finite = torch.isfinite(lse).unsqueeze(-1)
    probs = torch.where(finite, torch.exp(logits - torch.where(finite, lse.unsqueeze(-1), 0.0)), 0.0)
    o = torch.matmul(probs, v)
    return o.view(batch_size, num_qo_heads, head_dim), lse.view(batch_size, num_qo_heads)
