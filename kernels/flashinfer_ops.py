"""FlashInfer adapters for sparse decode and the merge (CUDA only).

Per-KV-head block lists become FlashInfer requests: the HND cache viewed as
[P * Hkv, 1, S, D] makes (page p, head h) the single-head page p * Hkv + h, and
each (request, KV head) is one FlashInfer request with G query heads and one
KV head. FlashInfer's LSE is base 2 (m + log2 d): converted here, lse_e =
lse_2 * ln 2. Imported only when FlashInfer is selected.
"""

from __future__ import annotations

import math

import torch

LN2 = math.log(2.0)
WORKSPACE_BYTES = 32 * 1024 * 1024


def sparse_decode_flashinfer(q, k_cache, v_cache, block_table, counts, last_block_len, out, out_lse, *, scale):
    """Same contract as kernels.sparse_decode; plans and runs in one call."""
    import flashinfer

    batch_size, num_qo_heads, head_dim = q.shape
    num_pages, num_kv_heads, block_size, _ = k_cache.shape
    group_size = num_qo_heads // num_kv_heads
    device = q.device
    flat_counts = counts.flatten()
    empty = flat_counts == 0
    # FlashInfer needs >= 1 page per request: give empty lists one dummy page
    # and overwrite their result (o = 0, lse = -inf) afterwards.
    used = torch.where(empty, torch.ones_like(flat_counts), flat_counts)
    indptr = torch.zeros(batch_size * num_kv_heads + 1, dtype=torch.int32, device=device)
    indptr[1:] = torch.cumsum(used, 0)
    head = torch.arange(num_kv_heads, device=device, dtype=torch.int32).view(1, num_kv_heads, 1)
    single_head_pages = (block_table.clamp(min=0) * num_kv_heads + head).view(batch_size * num_kv_heads, -1)
    keep = torch.arange(block_table.shape[2], device=device) < used.unsqueeze(1)
    indices = single_head_pages[keep].contiguous()
    if last_block_len is None:
        last = torch.full_like(flat_counts, block_size)
    else:
        last = torch.where(empty, torch.ones_like(flat_counts), last_block_len.flatten())

    workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, kv_layout="HND")
    wrapper.plan(
        indptr,
        indices,
        last,
        group_size,
        1,
        head_dim,
        block_size,
        sm_scale=scale,
        q_data_type=q.dtype,
        kv_data_type=k_cache.dtype,
    )
    kv = (
        k_cache.view(num_pages * num_kv_heads, 1, block_size, head_dim),
        v_cache.view(num_pages * num_kv_heads, 1, block_size, head_dim),
    )
    o, lse_2 = wrapper.run(q.view(batch_size * num_kv_heads, group_size, head_dim), kv, return_lse=True)
    empty_heads = empty.view(batch_size * num_kv_heads, 1)
    o = torch.where(empty_heads.unsqueeze(-1), torch.zeros_like(o), o)
    lse = torch.where(empty_heads, torch.full_like(lse_2, float("-inf")), lse_2 * LN2)
    out.copy_(o.view(batch_size, num_qo_heads, head_dim))
    out_lse.copy_(lse.view(batch_size, num_qo_heads))


def merge_states_flashinfer(o_a, lse_a, o_b, lse_b, out, out_lse):
    """Same contract as kernels.merge_attention_states (natural-log LSE in and out)."""
    import flashinfer

    log2e = 1.0 / LN2
    if o_b.dtype != o_a.dtype:
        o_b = o_b.to(o_a.dtype)
    merged, merged_lse_2 = flashinfer.merge_state(o_a, lse_a * log2e, o_b, lse_b * log2e)
    # Both sides empty: FlashInfer's max is -inf and the result NaN; define it.
    both_empty = torch.isinf(lse_a) & torch.isinf(lse_b)
    merged = torch.where(both_empty.unsqueeze(-1), torch.zeros_like(merged), merged)
    merged_lse = torch.where(both_empty, torch.full_like(lse_a, float("-inf")), merged_lse_2 * LN2)
    out.copy_(merged)
    out_lse.copy_(merged_lse)
