"""The step plan's fields of a small batch, computed request by request in Python.

step_plan.plan_fields computes them with about sixty tensor ops on tensors of O(batch) elements: at one request
each op's dispatch is the whole cost, about a quarter of a millisecond a step on a slow host, which a decode step of
a few milliseconds (resident-first's exact path at low load) cannot hide. Here each request's fields are a few
dozen integer operations, and the tensors are made once, one per field. Same arguments and the same fields and
padding as plan_fields (tests/test_step_plan_rows.py compares them); the engine takes this path up to ROW_BATCH
requests.
"""

from __future__ import annotations

import torch

from scout_sglang.core.resident_pool import exact_row_lists
from scout_sglang.layout import PAD_BLOCK

# Up to this many requests a step plans them here. Measured on a 2-core host at 8 KV heads (resident-first): 0.055
# ms against the tensor ops' 0.123 at one request, 0.111 against 0.132 at 16, 0.168 against 0.136 at 32.
ROW_BATCH = 16


def plan_fields_by_row(slots: list[int], num_tokens: list[int], steps: list[int], *, rows: int, padding_slot: int,
                       config, num_kv_heads: int, offloaded, full_store, offloaded_layers, recall_quota: int,
                       tables: dict, changes: dict, started: dict, recall_cap: torch.Tensor | None = None,
                       cpu_caps: list[int] | None = None, exact: list[bool] | None = None):
    """step_plan.plan_fields, request by request (its docstring says what each field is); a field is built as a list
    (one per request) or taken as a tensor, in plan_fields' order."""
    size, heads = config.block_size, num_kv_heads
    columns: dict[str, list] = {name: [] for name in ("slots", "num_tokens", "num_full", "last_len", "append_offset")}
    padding = dict(slots=padding_slot, num_tokens=0, num_full=0, last_len=size, append_offset=0)
    geometry = []  # per request: (num_full, token_block, fills)
    for slot, after in zip(slots, num_tokens):
        num_full, tail = divmod(after, size)
        token_block = (after - 1) // size
        geometry.append((num_full, token_block, tail == 0))
        for name, value in zip(columns, (slot, after, num_full, tail if tail > 0 else size, (after - 1) % size)):
            columns[name].append(value)
    for name, table in tables.items():
        if name in started:
            starting = set(started[name])
            columns[f"{name}_started"] = [slot * table.width + block if row in starting else table.scratch_cell
                                          for row, (slot, (_, block, _)) in enumerate(zip(slots, geometry))]
            padding[f"{name}_started"] = table.scratch_cell
    if offloaded is not None:
        _offloaded_columns(columns, padding, slots, num_tokens, steps, geometry, config=config,
                           heads=heads, offloaded=offloaded, offloaded_layers=offloaded_layers,
                           recall_quota=recall_quota, host=tables["host"], recall_cap=recall_cap, cpu_caps=cpu_caps,
                           exact=exact)
    if full_store is not None:
        full = tables["full"]
        columns["num_blocks"] = [-(-after // size) for after in num_tokens]
        cells = [slot * full.width + block for slot, (_, block, _) in zip(slots, geometry)]
        columns["full_append_cell"] = cells
        columns["fill_full_cell"] = [cell if fills else full.constant_cell()
                                     for cell, (_, _, fills) in zip(cells, geometry)]
        padding.update(num_blocks=0, full_append_cell=full.constant_cell(), fill_full_cell=full.constant_cell())
    fields = {name: values if isinstance(values, torch.Tensor) else torch.tensor(values, dtype=torch.long)
              for name, values in columns.items()}
    for name, table in tables.items():  # the host's changes, at most one a row: the rest write a scratch cell
        cells, pages = changes[name]
        delta = [[table.scratch_cell, PAD_BLOCK]] * rows
        delta[: len(cells)] = [[cell, page] for cell, page in zip(cells, pages)]
        fields[f"{name}_delta"] = torch.tensor(delta, dtype=torch.int32).view(rows, 2)
    return fields, padding


def _offloaded_columns(columns, padding, slots, num_tokens, steps, geometry, *, config, heads, offloaded,
                       offloaded_layers, recall_quota, host, recall_cap, cpu_caps, exact) -> None:
    """The offloaded layers' fields, into `columns`: lists (a list per request for a [B, X] field) or tensors."""
    sink, local, size = config.sink_blocks, config.local_blocks, config.block_size
    width = sink + local + 1

    def ring(block: int) -> int:
        return block if block < sink else sink + (block - sink) % (local + 1)

    # the window pages' host table (host memory: no device read), once a step
    window_rows = offloaded.window_page_table[torch.tensor(slots, dtype=torch.long)].tolist() if slots else []
    names = ("window_pages", "forced_blocks", "window_append_page", "fill_host_cell", "leaving_block",
             "leaving_page")
    for name in names:
        columns[name] = []
    for slot, after, window, (num_full, token_block, fills) in zip(slots, num_tokens, window_rows, geometry):
        num_blocks, start = -(-after // size), max(num_full - local, sink)
        blocks = [column if column < sink else start + column - sink for column in range(width)]
        columns["window_pages"].append([window[ring(block)] if block < num_blocks else PAD_BLOCK
                                        for block in blocks])
        columns["forced_blocks"].append([block if block < num_blocks and block < num_full else PAD_BLOCK
                                         for block in blocks])
        columns["window_append_page"].append(window[ring(token_block)])
        columns["fill_host_cell"].append(slot * host.width + token_block if fills else host.constant_cell())
        leaving = num_full - 1 - local
        leaves = fills and leaving >= sink
        columns["leaving_block"].append(leaving if leaves else PAD_BLOCK)
        columns["leaving_page"].append(window[ring(max(leaving, 0))] if leaves else PAD_BLOCK)
    padding.update(window_pages=PAD_BLOCK, forced_blocks=PAD_BLOCK, window_append_page=offloaded.device_scratch_page,
                   fill_host_cell=host.constant_cell(), leaving_block=PAD_BLOCK, leaving_page=PAD_BLOCK,
                   recall_quota=0)
    columns["recall_quota"] = [[recall_quota] * heads for _ in slots]
    if exact is None:  # a fixed resident buffer per slot
        columns["resident_pages"] = offloaded.resident_page_table[torch.tensor(slots, dtype=torch.long)]
        padding["resident_pages"] = offloaded.device_scratch_page
    else:  # resident-first: exact rows select every block and fill their whole row at once
        columns.update(exact_row_lists(exact, width=offloaded.resident_width, forced=sink + local,
                                       topk=config.topk_blocks, recall_quota=recall_quota, num_kv_heads=heads))
        padding["row_topk"] = 0
    if recall_cap is not None:
        columns["recall_cap"] = recall_cap
        padding["recall_cap"] = 0
    if cpu_caps is not None:
        columns["cpu_cap"] = [list(cpu_caps) for _ in slots]
        padding["cpu_cap"] = 0
    if config.recall_policy == "interval":
        intervals = [config.interval_for_layer(layer) for layer in offloaded_layers]
        columns["recall_due"] = [[int(step % interval == 0) for interval in intervals] for step in steps]
        padding["recall_due"] = 0
