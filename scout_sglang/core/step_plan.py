"""StepPlan: the metadata of one decode step, built once on the host, read by every layer.

As FlashInfer's `plan()` and vLLM's metadata builders: everything the layers
need that depends on the batch (counts after the step's token, where the token
goes, which block it completes, the window's pages, the block leaving the
window, what changed in the page tables) is computed here with a bounded number
of tensor ops on host tensors of O(batch) size (never O(context): the page
tables themselves live on the device, device_tables.py), written into one int32
buffer and moved to the device in one copy. The per-layer stages then read
these fields and never read a device value back.

The device buffer is allocated once, at its largest, and each step's fields are
views of it: with fixed widths (CUDA) the same step size gives the same
addresses every step, which is what a captured CUDA graph replays.

    buffer [1 + rows, width] int32, row-major
      row 0        header: SEQ, ROWS, BYPASS (handoff_words): read by the hand-off's ring and wait
      rows 1..     one per batch row; columns: the fields below, side by side

A step may run more rows than it has requests (`rows`, a captured graph's batch
size): padding rows name the padding slot, hold no token and attend nothing.
Fields are [rows] or [rows, X] int32 views (row stride = width). Counts are
AFTER the step's token is appended. Window columns (W = sink + local + 1) list
the window's blocks in ascending order, PAD_BLOCK past the window's count, so
the partial tail, when present, is the last valid entry.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from scout_sglang.core.host_wait import blocking_event
from scout_sglang.handoff_words import (
    HEADER_BYPASS,
    HEADER_ROWS,
    HEADER_SEQ,
    HEADER_WORDS,
)
from scout_sglang.layout import PAD_BLOCK


@dataclass
class StepPlan:
    batch_size: int  # requests (host int)
    rows: int  # rows the layers run: batch_size, or a captured graph's batch size (host int)
    rids: list[int]  # host
    seq: int  # the step's sequence number (host int; also in the header)
    bypass: bool  # the CPU parts are computed on the device this step (host bool; also in the header)
    header: torch.Tensor  # [HEADER_WORDS] int32, device
    slots: torch.Tensor  # [rows] request slots (padding rows: the padding slot)
    slots_long: torch.Tensor  # [rows] int64, device: the same, for index ops
    num_tokens: torch.Tensor  # [rows] tokens after the step's token
    num_full: torch.Tensor  # [rows] full blocks
    last_len: torch.Tensor  # [rows] tokens of the last listed block: the tail, or S when there is none
    last_len_heads: torch.Tensor  # [rows, Hkv] the same per KV head (a stride-0 view), as the decode takes it
    append_offset: torch.Tensor  # [rows] position of the step's token in its block
    exact_step: bool = False  # resident-first: every request exact and settled; the offloaded layers skip selection
    # offloaded layers (scout, infinigen, hgca); the page tables are the step's rows of the device tables
    host_table: torch.Tensor | None = None  # [rows, NB] host page of each logical block, PAD past the allocated ones
    window_pages: torch.Tensor | None = None  # [rows, W] device pages of the window's blocks
    forced_blocks: torch.Tensor | None = None  # [rows, W] window blocks that are full (sink + local), else PAD
    resident_pages: torch.Tensor | None = None  # [rows, R] device pages of the resident slots
    window_append_page: torch.Tensor | None = None  # [rows] device page of the step's token
    fill_host_row: torch.Tensor | None = None  # [rows] host page of the block the token completes, else scratch
    host_delta: torch.Tensor | None = None  # [rows, 2] (cell, page) the host changed in the host table (device_tables)
    resident_delta: torch.Tensor | None = None  # [rows, 2] resident-first: (cell, page) of the resident columns' table
    host_started: torch.Tensor | None = None  # [rows] cell whose page is the token's slot // S (assigned pages)
    fill_host_cell: torch.Tensor | None = None  # [rows] the cell holding fill_host_row
    leaving_block: torch.Tensor | None = None  # [rows] the block leaving the local window in this step, else PAD
    leaving_page: torch.Tensor | None = None  # [rows] its window page (its ring slot is rewritten one block later)
    recall_due: torch.Tensor | None = None  # [rows, L_offloaded] interval recall due this step (nonzero)
    recall_quota: torch.Tensor | None = None  # [rows, Hkv] blocks one resident row may take in per phase
    recall_cap: torch.Tensor | None = None  # [rows, Hkv] blocks scout's recall may move per row (recall_budget.py)
    cpu_cap: torch.Tensor | None = None  # [rows, L_offloaded] CPU-list entries per KV head the workers take (cpu_split.py)
    row_topk: torch.Tensor | None = None  # [rows] resident-first: the row's k (exact rows: every block; resident_pool.py)
    # device-full layers (full, quest, dense layers)
    full_table: torch.Tensor | None = None  # [rows, NB] device page of each block
    num_blocks: torch.Tensor | None = None  # [rows] blocks including the partial tail
    full_lists: torch.Tensor | None = None  # [rows, Hkv, NB] full_table per KV head (a stride-0 view)
    full_counts: torch.Tensor | None = None  # [rows, Hkv] num_blocks per KV head (a stride-0 view)
    full_append_page: torch.Tensor | None = None  # [rows]
    fill_full_row: torch.Tensor | None = None  # [rows] page the token completes (quest digest), else scratch
    full_delta: torch.Tensor | None = None  # [rows, 2] (cell, page) the host changed in the full table
    full_started: torch.Tensor | None = None  # [rows] cell whose page is the token's slot // S (assigned pages)
    full_append_cell: torch.Tensor | None = None  # [rows] the cells holding full_append_page, fill_full_row
    fill_full_cell: torch.Tensor | None = None


def bucket(count: int, capacity: int, minimum: int = 8) -> int:
    """Width of a per-step table: the next power of two >= count (at least `minimum`), at most `capacity`.

    Shapes then change only at powers of two (a compiled layer is reused
    between them); a CUDA graph uses `capacity` itself."""
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


def pad_where(valid: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    return torch.where(valid, values, torch.full_like(values, PAD_BLOCK))


class PlanBuffer:
    """The step plan's int32 buffer: a host staging copy (page-locked on CUDA) and a device buffer allocated once
    at its largest; `write` lays out a step's fields and moves them in one copy.

    On CUDA two staging buffers alternate, so that filling the next step's never races the copy of the last
    (the host waits for that copy on a blocking event, never by spinning); on the CPU the staging buffer is the
    device buffer. `bytes_moved` counts the words copied: O(batch), whatever the context."""

    def __init__(self, device: torch.device, max_rows: int, max_width: int):
        self.device = torch.device(device)
        self._on_cuda = self.device.type == "cuda"
        size = (1 + max_rows) * max_width
        self.capacity = size
        self._device_buffer = torch.zeros(size, dtype=torch.int32, device=self.device)
        self._staging = ([torch.zeros(size, dtype=torch.int32, pin_memory=True) for _ in range(2)] if self._on_cuda
                         else [self._device_buffer] * 2)
        self._events: list[object | None] = [None, None]
        self._turn = 0
        self.bytes_moved = 0

    def write(self, header: list[int], fields: dict[str, torch.Tensor], rows: int,
              padding: dict[str, int] | None = None) -> tuple[torch.Tensor, dict]:
        """Lay out `header` and the fields ([n, X] or [n] host tensors) -> (header view, field views of `rows` rows):
        a field of n < rows rows has its padding value (`padding[name]`) in the rest."""
        widths = {name: (t.shape[1] if t.dim() == 2 else 1) for name, t in fields.items()}
        width = max(sum(widths.values()), HEADER_WORDS)
        size = (1 + rows) * width
        if size > self.capacity:
            raise ValueError(f"a step of {rows} rows x {width} plan columns needs {size} words; the plan buffer "
                             f"holds {self.capacity} (max_requests, max_tokens_per_request)")
        turn, self._turn = self._turn, 1 - self._turn
        if self._events[turn] is not None:
            self._events[turn].synchronize()  # the copy from this buffer two steps ago (outside the layer loop)
        staging = self._staging[turn][:size].view(1 + rows, width)
        staging[0, :HEADER_WORDS] = torch.tensor(header, dtype=torch.int32)
        column, layout, runs = 0, {}, []  # runs: consecutive fields of as many rows, laid out by one copy
        for name, tensor in fields.items():
            given = tensor.shape[0]
            if not runs or runs[-1][0] != given:
                runs.append((given, column, []))
            runs[-1][2].append(name)
            layout[name] = (column, widths[name], tensor.dim())
            column += widths[name]
        for given, start, names in runs:
            end = start + sum(widths[name] for name in names)
            parts = [fields[name].view(given, widths[name]) for name in names]
            staging[1: 1 + given, start: end] = parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)
            if given < rows:
                staging[1 + given:, start: end] = torch.tensor(
                    [padding[name] for name in names for _ in range(widths[name])], dtype=torch.int32)
        if self._on_cuda:
            self._device_buffer[:size].copy_(staging.view(-1), non_blocking=True)
            event = blocking_event()  # its synchronize() sleeps in the driver: no host core spins
            event.record()
            self._events[turn] = event
        self.bytes_moved += size * 4
        device = self._device_buffer[:size].view(1 + rows, width)
        views = {}
        for name, (start, columns, ndim) in layout.items():
            view = device[1:, start: start + columns]
            views[name] = view if ndim == 2 else view[:, 0]
        return device[0, :HEADER_WORDS], views


def plan_fields(slots: list[int], num_tokens: list[int], steps: list[int], *, rows: int, padding_slot: int, config,
                num_kv_heads: int, offloaded, full_store, offloaded_layers, recall_quota: int, tables: dict,
                changes: dict, started: dict, recall_cap: torch.Tensor | None = None,
                cpu_caps: list[int] | None = None, exact: list[bool] | None = None):
    """The host tensors of a StepPlan ([B, X] each, B the requests; the host changes' [rows, 2]) and each one's value
    in the padding rows past the requests (PlanBuffer.write lays them out as [rows, X] int32).

    slots, num_tokens (after the step's token), steps (the step's number per request, from 1): one per request.
    offloaded / full_store: the engine's stores, or None where it has no layer of that kind; tables: their
    device_tables.DeviceTable ("host", "full"); changes: per table the (cells, pages) the host changed since the
    last step (at most one per row); started: per assigned table the rows whose token starts a block the device
    assigns (its page from the token's slot). recall_cap: [B, Hkv] scout's recall caps, or None (no recall).
    cpu_caps: the CPU split's cap of each offloaded layer (the same for every row), or None (no split).
    exact: resident-first serving (resident_pool.py): per request, whether all its blocks fit its quota (it selects
    every block and fills its whole resident row); None: a fixed resident buffer, whose pages the plan carries.
    Every tensor here is O(batch): the page tables stay on the device."""
    size, heads, batch_size = config.block_size, num_kv_heads, len(slots)
    after = torch.tensor(num_tokens, dtype=torch.long)
    slot_index = torch.tensor(slots, dtype=torch.long)
    num_full, tail = after // size, after % size
    token_block = (after - 1) // size  # the block of the step's token
    fills = tail == 0  # the token completes its block
    last_len = torch.where(tail > 0, tail, size)
    fields = dict(slots=slot_index, num_tokens=after, num_full=num_full, last_len=last_len,
                  append_offset=(after - 1) % size)
    padding = dict(slots=padding_slot, num_tokens=0, num_full=0, last_len=size, append_offset=0)
    for name, table in tables.items():
        if name in started:
            cell = slot_index * table.width + token_block
            starts = torch.zeros(batch_size, dtype=torch.bool)
            starts[started[name]] = True
            fields[f"{name}_started"] = torch.where(starts, cell, table.scratch_cell)
            padding[f"{name}_started"] = table.scratch_cell
    if offloaded is not None:
        sink, local = config.sink_blocks, config.local_blocks
        host = tables["host"]
        blocks, ring, valid = window_geometry(after, block_size=size, sink_blocks=sink, local_blocks=local)
        window_rows = offloaded.window_page_table[slot_index]  # [B, W]
        append_page = window_rows.gather(1, ring_index(token_block, sink, local).view(-1, 1)).view(-1)
        leaving = num_full - 1 - local
        leaves = fills & (leaving >= sink)
        leaving_page = window_rows.gather(1, ring_index(leaving.clamp(min=0), sink, local).view(-1, 1)).view(-1)
        fields.update(window_pages=pad_where(valid, window_rows.gather(1, ring)),
                      forced_blocks=pad_where(valid & (blocks < num_full.view(-1, 1)), blocks),
                      window_append_page=append_page,
                      fill_host_cell=torch.where(fills, slot_index * host.width + token_block, host.constant_cell()),
                      leaving_block=pad_where(leaves, leaving), leaving_page=pad_where(leaves, leaving_page),
                      recall_quota=torch.full((batch_size, heads), recall_quota))
        padding.update(window_pages=PAD_BLOCK, forced_blocks=PAD_BLOCK, window_append_page=offloaded.device_scratch_page,
                       fill_host_cell=host.constant_cell(), leaving_block=PAD_BLOCK, leaving_page=PAD_BLOCK,
                       recall_quota=0)
        if exact is None:  # a fixed resident buffer per slot
            fields["resident_pages"] = offloaded.resident_page_table[slot_index]
            padding["resident_pages"] = offloaded.device_scratch_page
        else:  # resident-first: exact rows select every block and fill their whole row at once
            from scout_sglang.core.resident_pool import exact_row_fields

            fields.update(exact_row_fields(exact, width=offloaded.resident_width, forced=sink + local,
                                           topk=config.topk_blocks, recall_quota=recall_quota, num_kv_heads=heads))
            padding["row_topk"] = 0
        if recall_cap is not None:
            fields["recall_cap"] = recall_cap
            padding["recall_cap"] = 0
        if cpu_caps is not None:
            fields["cpu_cap"] = torch.tensor(cpu_caps, dtype=torch.long).view(1, -1).expand(batch_size, -1)
            padding["cpu_cap"] = 0
        if config.recall_policy == "interval":
            step = torch.tensor(steps, dtype=torch.long).view(-1, 1)
            intervals = torch.tensor([config.interval_for_layer(layer) for layer in offloaded_layers]).view(1, -1)
            fields["recall_due"] = (step % intervals == 0).to(torch.int32)
            padding["recall_due"] = 0
    if full_store is not None:
        full = tables["full"]
        num_blocks = (after + size - 1) // size
        append_cell = slot_index * full.width + token_block
        fields.update(num_blocks=num_blocks, full_append_cell=append_cell,
                      fill_full_cell=torch.where(fills, append_cell, full.constant_cell()))
        padding.update(num_blocks=0, full_append_cell=full.constant_cell(), fill_full_cell=full.constant_cell())
    for name, table in tables.items():  # the host's changes, at most one a row: the rest write a scratch cell
        cells, pages = changes[name]
        delta = torch.empty(rows, 2, dtype=torch.int32)
        delta[:, 0], delta[:, 1] = table.scratch_cell, PAD_BLOCK
        if cells:
            delta[: len(cells), 0], delta[: len(cells), 1] = torch.tensor(cells), torch.tensor(pages)
        fields[f"{name}_delta"] = delta
    return fields, padding


def header_words(*, seq: int, rows: int, bypass: bool) -> list[int]:
    words = [0] * HEADER_WORDS
    words[HEADER_SEQ], words[HEADER_ROWS], words[HEADER_BYPASS] = seq, rows, int(bypass)
    return words
