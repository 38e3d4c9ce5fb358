"""Split a selection into its device-resident part and the CPU list.

Third stage of digest -> select -> device part / CPU part -> merge: the CPU set
of a (request, KV head) is its selected blocks minus the blocks resident on the
device, in selection order (best first) and capped at a fixed capacity, so that
a full list drops the least important blocks.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from scout_sglang.kernels.checks import check_shape, check_tensor
from scout_sglang.kernels.dispatch import select_impl
from scout_sglang.layout import PAD_BLOCK


class SplitResult(NamedTuple):
    """CPU lists of a split, all on the device of the inputs."""

    blocks: torch.Tensor  # [B, Hkv, C] int32 logical block indices, PAD_BLOCK past counts
    counts: torch.Tensor  # [B, Hkv] int32, <= C
    dropped: torch.Tensor  # [B, Hkv] int32, non-resident selected blocks past the capacity


def split_selection(
    selected: torch.Tensor,
    selected_counts: torch.Tensor,
    resident: torch.Tensor,
    resident_counts: torch.Tensor,
    *,
    capacity: int,
) -> SplitResult:
    """Selected blocks that are not resident, per (request, KV head).

    Parameters
    ----------
    selected : [B, Hkv, K] int32 logical block indices, best first (select_topk)
    selected_counts : [B, Hkv] int32
    resident : [B, Hkv, R] int32 logical block indices held on the device
    resident_counts : [B, Hkv] int32
    capacity : C, maximum CPU blocks per (request, KV head), >= 0
    """
    check_tensor("selected", selected, ndim=3, dtypes=(torch.int32,))
    device = selected.device
    batch_size, num_kv_heads, _ = selected.shape
    check_tensor("selected_counts", selected_counts, dtypes=(torch.int32,), device=device)
    check_shape("selected_counts", selected_counts, (batch_size, num_kv_heads))
    check_tensor("resident", resident, ndim=3, dtypes=(torch.int32,), device=device)
    if resident.shape[:2] != selected.shape[:2]:
        raise ValueError(
            f"resident must be [B, Hkv, R] with B, Hkv = {tuple(selected.shape[:2])}, got {tuple(resident.shape)}"
        )
    check_tensor("resident_counts", resident_counts, dtypes=(torch.int32,), device=device)
    check_shape("resident_counts", resident_counts, (batch_size, num_kv_heads))
    if capacity < 0:
        raise ValueError(f"capacity must be >= 0, got {capacity}")
    select_impl("split_selection", device.type, None)

    sel_valid = torch.arange(selected.shape[2], device=device) < selected_counts.unsqueeze(-1)
    res_valid = torch.arange(resident.shape[2], device=device) < resident_counts.unsqueeze(-1)
    same = selected.unsqueeze(-1) == resident.unsqueeze(-2)  # [B, Hkv, K, R]
    is_resident = (same & res_valid.unsqueeze(-2)).any(dim=-1)
    keep = sel_valid & ~is_resident
    # Compact the kept entries in order: entry i goes to slot cumsum(keep)[i]-1;
    # everything else (and overflow past C) lands in a scratch column C.
    slot = torch.cumsum(keep.to(torch.int32), dim=-1) - 1
    slot = torch.where(keep & (slot < capacity), slot, torch.full_like(slot, capacity))
    staged = torch.full((batch_size, num_kv_heads, capacity + 1), PAD_BLOCK, dtype=torch.int32, device=device)
    staged.scatter_(-1, slot.long(), selected)
    wanted = keep.sum(dim=-1, dtype=torch.int32)
    counts = wanted.clamp(max=capacity)
    blocks = staged[..., :capacity].clone(memory_format=torch.contiguous_format)  # always a copy: a fixed op sequence
    return SplitResult(blocks=blocks, counts=counts, dropped=wanted - counts)
