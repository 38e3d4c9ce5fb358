"""Causal prefill attention of a chunk over its request's prefix and itself.

The scout backend runs prefill itself when SGLang's KV pool is logical (the
device does not hold the prompt): the chunk's K/V and the prefix gathered
from the engine are staged on the device for one layer, attended, dropped.
Reference: scout_sglang.reference.attention.dense_prefill.
"""

from __future__ import annotations

import torch
from torch.nn.attention.bias import causal_lower_right

from scout_sglang.kernels.checks import check_group_size


def chunk_prefill_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float) -> torch.Tensor:
    """q [N, Hq, D] are the last N positions of k, v [M, Hkv, D] (M >= N); returns o [N, Hq, D] in q's dtype."""
    if q.dim() != 3 or k.dim() != 3 or k.shape != v.shape or q.shape[2] != k.shape[2]:
        raise ValueError(f"expected q [N, Hq, D] and k, v [M, Hkv, D], got {tuple(q.shape)}, {tuple(k.shape)}, "
                         f"{tuple(v.shape)}")
    if k.shape[0] < q.shape[0]:
        raise ValueError(f"{q.shape[0]} queries but only {k.shape[0]} keys: the chunk must be the sequence's end")
    group = check_group_size(q.shape[1], k.shape[1])
    if q.shape[0] == 0:
        return q.new_zeros(q.shape)
    qh = q.transpose(0, 1).unsqueeze(0)  # [1, Hq, N, D]
    kh = k.to(q.dtype).repeat_interleave(group, dim=1).transpose(0, 1).unsqueeze(0)
    vh = v.to(q.dtype).repeat_interleave(group, dim=1).transpose(0, 1).unsqueeze(0)
    mask = causal_lower_right(q.shape[0], k.shape[0])
    o = torch.nn.functional.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, scale=scale)
    return o.squeeze(0).transpose(0, 1)
