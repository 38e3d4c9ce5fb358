"""The page tables on the device, kept in step with their host copies by what changed: no O(context) copy per step.

plan (step_plan.py) -> **step tables** -> the layers' stages. A store's page
table (stores.SlotPageTable: host [slots, NB], the allocator's bookkeeping) has
a device copy here. A decode step moves only what changed in it:

  - the cells the host changed in the step (a block a token completes gets its
    page): (cell, page) pairs in the plan, at most one per row and table,
    written by one scatter;
  - under the radix cache and on a PD decode instance, where SGLang's allocator
    picks the page of a block a token starts, that page straight from the step's
    token slots on the device (page = slot // block_size): the host learns it
    never (a marker holds its place in the bookkeeping), so planning reads no
    device value;
  - anything larger (a prefill's blocks, a released or rebound row) is copied
    range by range when the next step is planned: once per request, not per step.

Then the step's tables are gathered by slot on the device into static buffers
(one index_select per table), and the pages a step writes (the token's page,
the page of the block it completes) are read from the device table by cell:

    device table [slots + 3, NB] int32
      rows 0..slots-1   each request slot's pages, PAD past its blocks
      padding_row       PAD everywhere: a padding row's table (the step plan's padding slot)
      constant_row      the store's scratch page everywhere: the page of "nothing to write"
      scratch_row       writes that change nothing land here

Nothing here allocates on the device once built, and every op is over static
buffers and the plan's views, so a CUDA graph's step finds the same addresses.
"""

from __future__ import annotations

import torch

from scout_sglang.core.host_copy import to_device
from scout_sglang.layout import PAD_BLOCK


class DeviceTable:
    """The device copy of one store's page table, and the step's gathered rows of it.

    Parameters
    ----------
    tables : the store's SlotPageTable (its host `table` [slots, NB] int32 and its `dirty` ranges)
    scratch_page : the store's scratch page (the constant row's value)
    max_rows : the most rows a step runs
    device : where the layers run
    """

    def __init__(self, tables, *, scratch_page: int, max_rows: int, device):
        self.tables = tables
        slots, width = tables.table.shape
        self.slots, self.width = slots, width
        self.padding_row, self.constant_row, self.scratch_row = slots, slots + 1, slots + 2
        self.table = torch.full((slots + 3, width), PAD_BLOCK, dtype=torch.int32, device=device)  # [slots + 3, NB]
        self.table[self.constant_row] = scratch_page
        self.flat = self.table.view(-1)
        self.step_table = torch.full((max_rows, width), PAD_BLOCK, dtype=torch.int32, device=device)  # [rows, NB]
        self.scratch_cell = self.cell(self.scratch_row, 0)
        self.bytes_copied = 0  # host-to-device bytes of the range copies (prefills, releases, rebinds)

    def cell(self, row: int, column: int) -> int:
        """Flat index of (row, column) in the device table."""
        return row * self.width + column

    def constant_cell(self) -> int:
        """A cell that holds the store's scratch page."""
        return self.cell(self.constant_row, 0)

    def take_changes(self, limit: int) -> tuple[list[int], list[int]]:
        """The host's changes since the last step as (cells, pages) when they are at most `limit` single cells (a
        step's own: a block a token completes); larger ones (a prefill, a release, a rebind) are copied here, range
        by range, and () is returned for them."""
        dirty = self.tables.take_dirty()
        cells, pages = [], []
        if sum(hi - lo for lo, hi in dirty.values()) <= limit:
            for slot, (lo, hi) in dirty.items():
                for column in range(lo, hi):
                    cells.append(self.cell(slot, column))
                    pages.append(int(self.tables.table[slot, column]))
            return cells, pages
        host = self.tables.table
        for slot, (lo, hi) in dirty.items():
            # a page-locked snapshot, copied without waiting for the stream (host_copy.py)
            self.table[slot, lo:hi].copy_(to_device(host[slot, lo:hi], self.table.device), non_blocking=True)
            self.bytes_copied += (hi - lo) * host.element_size()
        return [], []


class StepTables:
    """The step-side work of the device tables: apply the plan's changes, gather the step's rows, read the pages
    the step writes. One per engine; `tables` maps a name ("host", "full") to its DeviceTable.

    The plan's fields it reads ([rows] int32 views on the device): `slots`; per table `<name>_delta` [rows, 2]
    (cell, page) and `<name>_started` [rows] (the cell of a block the row's token starts whose page is the token's
    slot // block_size, else the scratch cell); the cells of the pages a step writes (`fill_host_cell`,
    `full_append_cell`, `fill_full_cell`)."""

    READS = {"fill_host_row": ("host", "fill_host_cell"), "full_append_page": ("full", "full_append_cell"),
             "fill_full_row": ("full", "fill_full_cell")}

    def __init__(self, tables: dict[str, DeviceTable], *, max_rows: int, block_size: int, device):
        self.tables, self.block_size = tables, block_size
        self.index = torch.zeros(max_rows, dtype=torch.int64, device=device)  # cells, as index ops take them
        self.values = torch.zeros(max_rows, dtype=torch.int32, device=device)
        self.slot_pages = torch.zeros(max_rows, dtype=torch.int64, device=device)  # token slot // block size
        self.read = {name: torch.zeros(max_rows, dtype=torch.int32, device=device) for name in self.READS
                     if self.READS[name][0] in tables}

    def apply(self, views: dict, rows: int, widths: dict[str, int], token_slots: torch.Tensor | None,
              batch_size: int) -> dict:
        """The plan's changes into the device tables, then the step's views: `<name>_table` [rows, width] and the
        pages the step writes ([rows] each). token_slots: the requests' (the first batch_size rows; a captured
        graph's padding rows past them start no block)."""
        out = {}
        index, values, n = self.index[:rows], self.values[:batch_size], batch_size
        if token_slots is not None and n:
            torch.div(token_slots[:n], self.block_size, rounding_mode="floor", out=self.slot_pages[:n])
            values.copy_(self.slot_pages[:n])
        for name, table in self.tables.items():
            delta = views[f"{name}_delta"]
            index.copy_(delta[:, 0])
            table.flat.index_put_((index,), delta[:, 1])
            if token_slots is not None and n and f"{name}_started" in views:
                index[:n].copy_(views[f"{name}_started"][:n])
                table.flat.index_put_((index[:n],), values)
            torch.index_select(table.table, 0, views["slots"], out=table.step_table[:rows])
            out[f"{name}_table"] = table.step_table[:rows, : widths[name]]
        for name, (table_name, cells) in self.READS.items():
            if name in self.read:
                index.copy_(views[cells])
                torch.index_select(self.tables[table_name].flat, 0, index, out=self.read[name][:rows])
                out[name] = self.read[name][:rows]
        return out
