"""StepPlan: the metadata of one decode step, built once on the host, read by every layer.

As FlashInfer's `plan()` and vLLM's metadata builders: everything the layers
need that depends on the batch (counts after the step's token, page tables,
where the token goes, which block it completes, the window's pages) is
computed here with a bounded number of tensor ops on host tensors, packed into
one int32 buffer and moved to the device with one non-blocking copy (from
page-locked memory on CUDA). The per-layer code then runs a fixed sequence of
tensor ops over these fields, whatever the batch size, and never reads a
device value back.

Fields are [B] or [B, X] int32 on the device unless noted; indices meant for
index ops are also kept as int64 (`*_index`). Counts are AFTER the step's
token is appended. Window columns (W = sink + local + 1) list the window's
blocks in ascending order, PAD_BLOCK past the window's count, so the partial
tail, when present, is the last valid entry.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from scout_sglang.layout import PAD_BLOCK


@dataclass
class StepPlan:
    batch_size: int  # B (host int)
    rids: list[int]  # host
    slots: torch.Tensor  # [B] int64, device: request slots
    num_tokens: torch.Tensor  # [B] tokens after the step's token
    num_full: torch.Tensor  # [B] full blocks
    last_len: torch.Tensor  # [B] tokens of the last listed block: the tail, or S when there is none
    last_len_heads: torch.Tensor  # [B, Hkv] the same per KV head, as the sparse decode takes it
    append_offset: torch.Tensor  # [B] int64: position of the step's token in its block
    # offloaded layers (scout, infinigen, hgca)
    host_table: torch.Tensor | None = None  # [B, NB] host page of each logical block, PAD past the allocated ones
    window_pages: torch.Tensor | None = None  # [B, W] device pages of the window's blocks
    window_blocks: torch.Tensor | None = None  # [B, W] their logical blocks
    forced_blocks: torch.Tensor | None = None  # [B, W] window blocks that are full (sink + local), else PAD
    forced_heads: torch.Tensor | None = None  # [B, Hkv, W] the same per KV head
    resident_pages: torch.Tensor | None = None  # [B, R] device pages of the resident slots
    window_append_page: torch.Tensor | None = None  # [B] int64 device page of the step's token
    fill_host_row: torch.Tensor | None = None  # [B] int64 host page of the block the token completes, else scratch
    recall_due: torch.Tensor | None = None  # [L_offloaded, B] bool: interval recall due this step
    # device-full layers (full, quest, dense layers)
    full_table: torch.Tensor | None = None  # [B, NB] device page of each block
    num_blocks: torch.Tensor | None = None  # [B] blocks including the partial tail
    full_lists: torch.Tensor | None = None  # [B, Hkv, NB] full_table per KV head: a dense layer's block lists
    full_counts: torch.Tensor | None = None  # [B, Hkv] num_blocks per KV head
    full_append_page: torch.Tensor | None = None  # [B] int64
    fill_full_row: torch.Tensor | None = None  # [B] int64 page the token completes (quest digest), else scratch
    # host-side, for end_step: blocks completed in this step (copied to the host store then)
    filled: list[tuple[int, int, int]] = field(default_factory=list)  # (window page, host page, batch index)


def bucket(count: int, capacity: int, minimum: int = 8) -> int:
    """Width of a per-step table: the next power of two >= count (at least `minimum`), at most `capacity`.

    Shapes then change only at powers of two (a compiled or captured layer is
    reused between them); a CUDA graph uses `capacity` itself."""
    width = minimum
    while width < count:
        width *= 2
    return max(1, min(width, capacity))


def window_geometry(num_tokens: torch.Tensor, *, block_size: int, sink_blocks: int, local_blocks: int):
    """Window columns of each request -> (blocks [B, W], ring index [B, W], valid [B, W]) on host tensors.

    Column c < sink holds block c; the others hold the local blocks and the tail,
    from max(sink, num_full - local) up. A block's window page is `ring index`
    into the request's window pages (sinks first, then a ring of local + 1)."""
    width = sink_blocks + local_blocks + 1
    num_full = num_tokens // block_size
    num_blocks = (num_tokens + block_size - 1) // block_size
    column = torch.arange(width).view(1, width)
    start = torch.clamp(num_full - local_blocks, min=sink_blocks).view(-1, 1)
    blocks = torch.where(column < sink_blocks, column, start + column - sink_blocks)
    valid = blocks < num_blocks.view(-1, 1)
    return blocks, ring_index(blocks, sink_blocks, local_blocks), valid


def ring_index(blocks: torch.Tensor, sink_blocks: int, local_blocks: int) -> torch.Tensor:
    """Column of a window block's page among a request's window pages."""
    return torch.where(blocks < sink_blocks, blocks, sink_blocks + (blocks - sink_blocks) % (local_blocks + 1))


class PlanTransfer:
    """Packs a plan's int32 fields into one buffer and moves it to the device in one copy.

    On CUDA the buffer is page-locked and the copy non-blocking; two buffers
    alternate so that filling the next step's never races the last copy."""

    def __init__(self, device: torch.device):
        self.device = device
        self._on_cuda = device.type == "cuda"
        self._buffers: list[torch.Tensor | None] = [None, None]
        self._events: list[object | None] = [None, None]
        self._turn = 0

    def __call__(self, fields: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        if not self._on_cuda:
            return fields
        flat = [t.to(torch.int32).flatten() for t in fields.values()]
        total = sum(t.numel() for t in flat)
        turn, self._turn = self._turn, 1 - self._turn
        if self._events[turn] is not None:
            self._events[turn].synchronize()  # the copy from this buffer two steps ago
        buffer = self._buffers[turn]
        if buffer is None or buffer.numel() < total:
            buffer = self._buffers[turn] = torch.empty(max(total, 1024), dtype=torch.int32, pin_memory=True)
        torch.cat(flat, out=buffer[:total])
        on_device = buffer[:total].to(self.device, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        self._events[turn] = event
        out, offset = {}, 0
        for name, tensor in fields.items():
            out[name] = on_device[offset: offset + tensor.numel()].view(tensor.shape)
            offset += tensor.numel()
        return out


def pad_where(valid: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    return torch.where(valid, values, torch.full_like(values, PAD_BLOCK))
