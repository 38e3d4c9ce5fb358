"""Argument checks of `CpuAttentionPool.submit`, run in the submitting thread.

Wrappers validate, kernels never do: the native kernel reads the paged cache
through raw page ids, so an id out of range here would be a wild read there.
Every message states expected versus actual. Costs O(B * Hkv * C) on small
int32 tables, no pass over the KV cache.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

ATTENTION_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
CPU = torch.device("cpu")


@dataclass(frozen=True)
class DecodeDims:
    """Sizes of one submit, read off validated tensors."""

    batch_size: int
    num_qo_heads: int
    num_kv_heads: int
    group_size: int
    head_dim: int
    num_pages: int
    block_size: int
    capacity: int  # C: entries per block list


def _tensor(name: str, value: object, *, ndim: int, dtypes: Sequence[torch.dtype]) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if value.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {tuple(value.shape)}")
    if value.dtype not in dtypes:
        raise TypeError(f"{name} must have dtype in ({', '.join(map(str, dtypes))}), got {value.dtype}")
    if value.device != CPU:
        raise ValueError(f"{name} must be on the CPU, got {value.device}")
    if not value.is_contiguous():
        raise ValueError(f"{name} must be contiguous, got strides {value.stride()} for shape {tuple(value.shape)}")
    return value


def _shape(name: str, tensor: torch.Tensor, expected: tuple[int, ...]) -> None:
    if tuple(tensor.shape) != expected:
        raise ValueError(f"{name} must have shape {expected}, got {tuple(tensor.shape)}")


def _int(name: str, value: object, *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def check_decode_args(
    q: object,
    k_cache: object,
    v_cache: object,
    block_table: object,
    counts: object,
    *,
    scale: object,
    out_o: object,
    out_lse: object,
    seq_ids: object,
    layer: object,
    check_values: bool = True,
) -> DecodeDims:
    """Validate a submit; return its sizes or raise TypeError/ValueError.

    Shapes: q [B, Hq, D]; k_cache, v_cache [P, Hkv, S, D] (dtype of q);
    block_table [B, Hkv, C] int32; counts [B, Hkv] int32 with 0 <= counts <= C
    and counted page ids in [0, P); out_o [B, Hq, D] fp32 or dtype of q;
    out_lse [B, Hq] fp32; seq_ids None or B ints; layer int >= 0; scale > 0.
    check_values=False skips the ranges of counts and page ids (they are read
    back from the tensors): the decode step's workers check them instead.
    """
    q = _tensor("q", q, ndim=3, dtypes=ATTENTION_DTYPES)
    k_cache = _tensor("k_cache", k_cache, ndim=4, dtypes=(q.dtype,))
    v_cache = _tensor("v_cache", v_cache, ndim=4, dtypes=(q.dtype,))
    _shape("v_cache", v_cache, tuple(k_cache.shape))
    batch_size, num_qo_heads, head_dim = q.shape
    num_pages, num_kv_heads, block_size, cache_head_dim = k_cache.shape
    if cache_head_dim != head_dim:
        raise ValueError(f"k_cache head_dim (last dim) must equal q's ({head_dim}), got {cache_head_dim}")
    if num_kv_heads == 0 or num_qo_heads % num_kv_heads != 0:
        raise ValueError(f"num_qo_heads ({num_qo_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")
    if block_size == 0 or head_dim == 0:
        raise ValueError(f"block_size and head_dim must be >= 1, got k_cache shape {tuple(k_cache.shape)}")
    block_table = _tensor("block_table", block_table, ndim=3, dtypes=(torch.int32,))
    counts = _tensor("counts", counts, ndim=2, dtypes=(torch.int32,))
    capacity = block_table.shape[2]
    _shape("block_table", block_table, (batch_size, num_kv_heads, capacity))
    _shape("counts", counts, (batch_size, num_kv_heads))
    out_dtypes = (torch.float32,) if q.dtype == torch.float32 else (torch.float32, q.dtype)
    out_o = _tensor("out_o", out_o, ndim=3, dtypes=out_dtypes)
    _shape("out_o", out_o, (batch_size, num_qo_heads, head_dim))
    out_lse = _tensor("out_lse", out_lse, ndim=2, dtypes=(torch.float32,))
    _shape("out_lse", out_lse, (batch_size, num_qo_heads))
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"scale must be a finite number > 0, got {scale!r}")
    _int("layer", layer, minimum=0)
    if seq_ids is not None:
        if isinstance(seq_ids, (str, bytes)) or not isinstance(seq_ids, Sequence):
            raise TypeError(f"seq_ids must be None or a sequence of {batch_size} ints, got {type(seq_ids).__name__}")
        if len(seq_ids) != batch_size:
            raise ValueError(f"seq_ids must have {batch_size} entries (one per sequence), got {len(seq_ids)}")
    if check_values and batch_size > 0 and num_kv_heads > 0:
        check_block_lists(block_table, counts, num_pages=num_pages)
    return DecodeDims(
        batch_size=batch_size,
        num_qo_heads=num_qo_heads,
        num_kv_heads=num_kv_heads,
        group_size=num_qo_heads // num_kv_heads,
        head_dim=head_dim,
        num_pages=num_pages,
        block_size=block_size,
        capacity=capacity,
    )


def check_block_lists(block_table: torch.Tensor, counts: torch.Tensor, *, num_pages: int) -> None:
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
