"""Naming the host pages that the split stage's page check found outside the host store.

The split stage (kernels/stage_split.py) lists such an entry as page 0, so no
reader (the CPU workers, the device's fallback, the zero-copy reads) leaves the
store, and counts it in the layer's BAD_PAGES counter. That counter is read with
the others, once per collection. Only when it is non-zero does the engine come
here: it reads the layer's CPU list and the step's host page table back from
the device (an error path; a healthy step reads nothing) and names each bad
entry by request, layer, KV head, block and page. The backend then aborts those
requests, since their page tables are corrupt and their outputs wrong.

When the counters cover several replayed steps, the lists are the last step's:
an entry found in an earlier step is reported by count and layer, unnamed.
"""

from __future__ import annotations

import torch

from scout_sglang.layout import PAD_BLOCK


def name_bad_pages(engine, layers: list[int], rids: list[int]) -> dict[int, str]:
    """The requests of the last step (rids: their slots, in row order) whose CPU lists of `layers` hold a host page
    outside the store -> {slot: message naming the first such entry}."""
    table = engine.device_tables["host"].step_table[: len(rids)].cpu()  # [rows, NB]
    found: dict[int, str] = {}
    for layer in layers:
        num_pages = engine.offloaded.host_k[layer].shape[0]
        blocks = engine.buffers.of(layer).cpu_blocks[: len(rids)].cpu()  # [rows, Hkv, C]
        listed = blocks != PAD_BLOCK
        pages = torch.where(listed, table.gather(1, blocks.clamp(min=0).flatten(1).long()).view_as(blocks), 0)
        bad = listed & ((pages < 0) | (pages >= num_pages))
        for row, head, entry in bad.nonzero().tolist():
            if rids[row] not in found:
                found[rids[row]] = (f"host page {int(pages[row, head, entry])} of block {int(blocks[row, head, entry])}"
                                    f" (layer {layer}, KV head {head}) lies outside the host store's [0, {num_pages}):"
                                    " the request's page table is corrupt")
    return found
