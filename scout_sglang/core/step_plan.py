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


def plan_fields(slots: list[int], num_tokens: list[int], steps: list[int], *, config, num_kv_heads: int, width,
                offloaded, full_store, offloaded_layers) -> tuple[dict[str, torch.Tensor], list]:
    """The host tensors of a StepPlan, and the blocks the step's tokens complete (for end_step's host copies).

    slots, num_tokens (after the step's token), steps (the step's number per request, from 1): one per request.
    width(needed) gives a page table's column count; offloaded / full_store: the engine's stores, or None
    where it has no layer of that kind."""
    size, heads, batch_size = config.block_size, num_kv_heads, len(slots)
    slots = torch.tensor(slots, dtype=torch.long)
    after = torch.tensor(num_tokens, dtype=torch.long)
    num_full, tail = after // size, after % size
    token_block = (after - 1) // size  # the block of the step's token
    fills = tail == 0  # the token completes its block
    last_len = torch.where(tail > 0, tail, size)
    fields = dict(slots=slots, num_tokens=after, num_full=num_full, last_len=last_len,
                  last_len_heads=last_len.view(-1, 1).expand(-1, heads).contiguous(),
                  append_offset=(after - 1) % size)
    filled = []
    if offloaded is not None:
        sink, local = config.sink_blocks, config.local_blocks
        host_rows = offloaded.host_tables.table[slots]  # [B, NBcap]
        blocks, ring, valid = window_geometry(after, block_size=size, sink_blocks=sink, local_blocks=local)
        window_rows = offloaded.window_page_table[slots]  # [B, W]
        append_page = window_rows.gather(1, ring_index(token_block, sink, local).view(-1, 1)).view(-1)
        last_column = host_rows.shape[1] - 1
        fill_row = torch.where(fills, host_rows.gather(1, token_block.clamp(max=last_column).view(-1, 1)).view(-1),
                               offloaded.host_scratch_page)
        forced = pad_where(valid & (blocks < num_full.view(-1, 1)), blocks)
        fields.update(host_table=host_rows[:, : width(int(num_full.max()) if batch_size else 0)].contiguous(),
                      window_pages=pad_where(valid, window_rows.gather(1, ring)), window_blocks=pad_where(valid, blocks),
                      forced_blocks=forced, forced_heads=forced.view(batch_size, 1, -1).expand(-1, heads, -1).contiguous(),
                      resident_pages=offloaded.resident_page_table[slots], window_append_page=append_page,
                      fill_host_row=fill_row)
        if config.recall_policy == "interval":
            step = torch.tensor(steps, dtype=torch.long)
            fields["recall_due"] = torch.stack([step % config.interval_for_layer(layer) == 0
                                                for layer in offloaded_layers]).to(torch.int32)
        filled = [(page, row, b) for b, (page, row, fill) in
                  enumerate(zip(append_page.tolist(), fill_row.tolist(), fills.tolist())) if fill]
    if full_store is not None:
        full_rows = full_store.tables.table[slots]
        num_blocks = (after + size - 1) // size
        append_page = full_rows.gather(1, token_block.view(-1, 1)).view(-1)
        full_table = full_rows[:, : width(int(num_blocks.max()) if batch_size else 0)].contiguous()
        fields.update(full_table=full_table, num_blocks=num_blocks, full_append_page=append_page,
                      full_lists=full_table.view(batch_size, 1, -1).expand(-1, heads, -1).contiguous(),
                      full_counts=num_blocks.view(-1, 1).expand(-1, heads).contiguous(),
                      fill_full_row=torch.where(fills, append_page, full_store.scratch_page))
    return fields, filled
