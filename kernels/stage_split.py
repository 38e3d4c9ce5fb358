"""The split stage of the decode step: the device list, the CPU list and the staged query, per (request, KV head).

digest -> select -> **split** -> device part / CPU part -> merge -> recall.
One call per offloaded layer and step, after the selection (and the resident
buffer's first fill): on CUDA one Triton launch (triton/stage_split.py) that
writes the CPU lists and the query straight into the hand-off's page-locked
staging, on the CPU a fixed sequence of torch ops.

    device list: resident pages holding a block (only_selected_resident: a selected one), in slot order,
                 then the window's pages ascending; [B, Hkv, R + W] with counts, PAD past them
    CPU list:    selected blocks, best first, that neither the window's full blocks (forced_blocks) nor
                 the resident buffer hold, capped at `capacity`; logical blocks and host pages [B, Hkv, C]
    split:       with a CPU cap (the plan's, per row), the CPU list's first `cap` entries stay the workers'
                 host pages; the rest go, in order, to the zero-copy list [B, Hkv, C] that the device reads
                 from the host store itself; every listed block is in exactly one of the two
    page check:  a listed block whose host page lies outside [0, num_host_pages) (a corrupt or stale page
                 table) is counted in BAD_PAGES and listed as page 0, so neither the workers, the
                 fallback nor the zero-copy reads ever leave the store; the engine names it at its next
                 counter read and the request is aborted (its row's output is wrong from then on)

The CPU list is what reference.split_selection returns for the selection and
the blocks the device holds; the tests compare both paths with it.
"""

from __future__ import annotations

import torch
from scout_sglang.kernels.checks import check_shape, check_tensor
from scout_sglang.kernels.dispatch import select_impl
from scout_sglang.kernels.step_counters import BAD_PAGES, CPU, DROPPED, NUM_COUNTERS, ZERO_COPY

from scout_sglang.layout import PAD_BLOCK


def split_lists(selected: torch.Tensor, counts: torch.Tensor, *, forced_blocks: torch.Tensor,
                window_pages: torch.Tensor, out_device_pages: torch.Tensor, out_device_counts: torch.Tensor,
                resident: torch.Tensor | None = None, slots: torch.Tensor | None = None,
                resident_pages: torch.Tensor | None = None, only_selected_resident: bool = False,
                host_table: torch.Tensor | None = None, capacity: int = 0, out_cpu_blocks: torch.Tensor | None = None,
                out_cpu_pages: torch.Tensor | None = None, out_cpu_counts: torch.Tensor | None = None,
                q: torch.Tensor | None = None, out_q: torch.Tensor | None = None,
                cpu_cap: torch.Tensor | None = None, out_zero_copy_pages: torch.Tensor | None = None,
                out_zero_copy_counts: torch.Tensor | None = None, out_listed_counts: torch.Tensor | None = None,
                num_host_pages: int | None = None, counters: torch.Tensor | None = None, impl: str | None = None,
                validate: bool = True) -> None:
    """Write a layer's device list, and (CPU modes) its CPU list and staged query.

    Parameters
    ----------
    selected : [B, Hkv, K] int32 logical blocks best first (stage_select), counts : [B, Hkv] int32
    forced_blocks : [B, W] int32 the window's full blocks (sink and local), PAD elsewhere
    window_pages : [B, W] int32 device pages of the window's blocks ascending, PAD past them
    out_device_pages : [B, Hkv, R + W] int32, out_device_counts : [B, Hkv] int32
    resident, slots, resident_pages : the resident buffer (all or none): [slots, Hkv, R] int32 blocks by
        request slot (PAD: empty), [B] int32/int64 slots, [B, R] int32 device pages of the slots
    only_selected_resident : the device list keeps only the resident blocks that are selected (infinigen)
    host_table, capacity, out_cpu_blocks, out_cpu_pages, out_cpu_counts, q, out_q : the CPU part (all or
        none): [B, NB] int32 host page of each block, C, [B, Hkv, C] int32 (x2), [B, Hkv] int32, the query
        [B, Hq, D] and its staging [B, Hq, D] (any float dtype)
    cpu_cap, out_zero_copy_pages, out_zero_copy_counts, out_listed_counts : the split (all or none, with the CPU
        part): [B] int32 CPU-list entries per (row, KV head) the workers take (the plan's column of the layer),
        [B, Hkv, C] int32 host pages the device reads itself, PAD past their [B, Hkv] int32 counts, and [B, Hkv]
        int32 entries of the whole list (out_cpu_blocks holds them all; out_cpu_counts the workers' share)
    num_host_pages : with the CPU part, the host store's pages: the page check's bound (None: no check)
    counters : optional [NUM_COUNTERS] int32 row; CPU, ZERO_COPY, DROPPED and BAD_PAGES are added
    validate : check the arguments (the decode step checks its static buffers once and passes False)
    """
    if validate:
        _check(selected, counts, forced_blocks, window_pages, out_device_pages, out_device_counts, resident, slots,
               resident_pages, host_table, capacity, out_cpu_blocks, out_cpu_pages, out_cpu_counts, q, out_q,
               counters)
        _check_split(cpu_cap, out_zero_copy_pages, out_zero_copy_counts, out_listed_counts, out_cpu_pages)
    if select_impl("split_lists", selected.device.type, impl) == "triton":
        from scout_sglang.kernels.triton.stage_split import split_lists_triton

        split_lists_triton(selected, counts, forced_blocks=forced_blocks, window_pages=window_pages,
                           resident_pages=resident_pages, host_table=host_table, resident=resident, slots=slots,
                           only_selected_resident=only_selected_resident, out_device_pages=out_device_pages,
                           out_device_counts=out_device_counts, capacity=capacity, out_cpu_blocks=out_cpu_blocks,
                           out_cpu_pages=out_cpu_pages, out_cpu_counts=out_cpu_counts, q=q, out_q=out_q,
                           cpu_cap=cpu_cap, out_zero_copy_pages=out_zero_copy_pages,
                           out_zero_copy_counts=out_zero_copy_counts, out_listed_counts=out_listed_counts,
                           num_host_pages=num_host_pages, counters=counters)
        return
    batch_size, num_kv_heads, topk = selected.shape
    valid = torch.arange(topk, device=selected.device) < counts.unsqueeze(-1)
    selected = torch.where(valid, selected, PAD_BLOCK)
    window = window_pages.unsqueeze(1).expand(batch_size, num_kv_heads, -1)
    pages, listed = window, window != PAD_BLOCK
    if resident is not None:
        rows = resident[slots]  # [B, Hkv, R]
        held = rows != PAD_BLOCK
        if only_selected_resident:
            held = held & contains(rows, selected)
        resident_pages = resident_pages.unsqueeze(1).expand(batch_size, num_kv_heads, -1)
        pages, listed = torch.cat([resident_pages, window], dim=2), torch.cat([held, listed], dim=2)
    device_pages, device_counts, _ = compact_rows(pages, listed, pages.shape[2])
    out_device_pages.copy_(device_pages)
    out_device_counts.copy_(device_counts)
    if out_cpu_pages is None:
        return
    held = forced_blocks.unsqueeze(1).expand(batch_size, num_kv_heads, -1)
    if resident is not None:
        held = torch.cat([held, rows], dim=2)
    keep = valid & ~contains(selected, held)
    blocks, listed, wanted = compact_rows(selected, keep, capacity)
    host = host_table.gather(1, blocks.clamp(min=0).view(batch_size, -1).long()).view_as(blocks)
    bad = None
    if num_host_pages is not None:
        bad = (blocks != PAD_BLOCK) & ((host < 0) | (host >= num_host_pages))
        host = torch.where(bad, 0, host)
    pages = torch.where(blocks != PAD_BLOCK, host, PAD_BLOCK)
    out_cpu_blocks.copy_(blocks)
    cpu_counts, zero_copy = listed, None
    if cpu_cap is not None:
        cpu_counts = torch.minimum(listed, cpu_cap.clamp(min=0).view(-1, 1).to(torch.int32))
        zero_copy = listed - cpu_counts
        column = torch.arange(capacity, device=blocks.device)
        rest = pages.gather(2, (column + cpu_counts.unsqueeze(-1)).clamp(max=max(capacity - 1, 0)).long())
        out_zero_copy_pages.copy_(torch.where(column < zero_copy.unsqueeze(-1), rest, PAD_BLOCK))
        out_zero_copy_counts.copy_(zero_copy)
        out_listed_counts.copy_(listed)
        pages = torch.where(column < cpu_counts.unsqueeze(-1), pages, PAD_BLOCK)
    out_cpu_pages.copy_(pages)
    out_cpu_counts.copy_(cpu_counts)
    out_q.copy_(q)
    if counters is not None:
        counters[CPU] += cpu_counts.sum(dtype=torch.int32)
        counters[DROPPED] += (wanted - listed).sum(dtype=torch.int32)
        if zero_copy is not None:
            counters[ZERO_COPY] += zero_copy.sum(dtype=torch.int32)
        if bad is not None:
            counters[BAD_PAGES] += bad.sum(dtype=torch.int32)


def contains(values: torch.Tensor, pool: torch.Tensor) -> torch.Tensor:
    """values [..., A] in pool [..., P] (PAD entries of the pool never match) -> [..., A] bool."""
    same = values.unsqueeze(-1) == pool.unsqueeze(-2)
    return (same & (pool != PAD_BLOCK).unsqueeze(-2)).any(dim=-1)


def compact_rows(values: torch.Tensor, keep: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The kept entries of values [..., X] moved to the front in order, capped at `width`
    -> (rows [..., width] int32 PAD past the count, counts [...] int32, kept [...] int32 before the cap)."""
    position = torch.cumsum(keep.to(torch.int32), dim=-1) - 1
    position = torch.where(keep & (position < width), position, width)  # the rest lands in a dump column
    staged = torch.full((*values.shape[:-1], width + 1), PAD_BLOCK, dtype=torch.int32, device=values.device)
    staged.scatter_(-1, position.long(), values.to(torch.int32))
    kept = keep.sum(dim=-1, dtype=torch.int32)
    return staged[..., :width], kept.clamp(max=width), kept


def _check_split(cpu_cap, out_zero_copy_pages, out_zero_copy_counts, out_listed_counts, out_cpu_pages):
    split = (cpu_cap, out_zero_copy_pages, out_zero_copy_counts, out_listed_counts)
    if all(t is None for t in split):
        return
    if any(t is None for t in split) or out_cpu_pages is None:
        raise ValueError("the CPU split needs the CPU part and cpu_cap, out_zero_copy_pages, out_zero_copy_counts "
                         "and out_listed_counts")
    batch_size, num_kv_heads, capacity = out_cpu_pages.shape
    index = (torch.int32,)
    check_tensor("cpu_cap", cpu_cap, ndim=1, dtypes=index, contiguous=False)
    check_shape("cpu_cap", cpu_cap, (batch_size,))
    check_tensor("out_zero_copy_pages", out_zero_copy_pages, dtypes=index, device=cpu_cap.device, contiguous="rows")
    check_shape("out_zero_copy_pages", out_zero_copy_pages, (batch_size, num_kv_heads, capacity))
    for name, t in (("out_zero_copy_counts", out_zero_copy_counts), ("out_listed_counts", out_listed_counts)):
        check_tensor(name, t, dtypes=index, device=cpu_cap.device, contiguous="rows")
        check_shape(name, t, (batch_size, num_kv_heads))


def _check(selected, counts, forced_blocks, window_pages, out_device_pages, out_device_counts, resident, slots,
           resident_pages, host_table, capacity, out_cpu_blocks, out_cpu_pages, out_cpu_counts, q, out_q, counters):
    rows, index = "rows", (torch.int32,)
    check_tensor("selected", selected, ndim=3, dtypes=index, contiguous=rows)
    device = selected.device
    batch_size, num_kv_heads, _ = selected.shape
    check_tensor("counts", counts, dtypes=index, device=device, contiguous=rows)
    check_shape("counts", counts, (batch_size, num_kv_heads))
    check_tensor("forced_blocks", forced_blocks, ndim=2, dtypes=index, device=device, contiguous=rows)
    width = forced_blocks.shape[1]
    check_tensor("window_pages", window_pages, dtypes=index, device=device, contiguous=rows)
    check_shape("window_pages", window_pages, (batch_size, width))
    parts = (resident, slots, resident_pages)
    if any(t is not None for t in parts) and any(t is None for t in parts):
        raise ValueError("resident, slots and resident_pages go together: pass all or none")
    num_resident = 0
    if resident is not None:
        check_tensor("resident", resident, ndim=3, dtypes=index, device=device, contiguous=rows)
        num_resident = resident.shape[2]
        if resident.shape[1] != num_kv_heads:
            raise ValueError(f"resident must be [slots, {num_kv_heads}, R], got {tuple(resident.shape)}")
        check_tensor("slots", slots, ndim=1, dtypes=(torch.int32, torch.int64), device=device, contiguous=False)
        check_shape("slots", slots, (batch_size,))
        check_tensor("resident_pages", resident_pages, dtypes=index, device=device, contiguous=rows)
        check_shape("resident_pages", resident_pages, (batch_size, num_resident))
    check_tensor("out_device_pages", out_device_pages, dtypes=index, device=device, contiguous=rows)
    check_shape("out_device_pages", out_device_pages, (batch_size, num_kv_heads, num_resident + width))
    check_tensor("out_device_counts", out_device_counts, dtypes=index, device=device, contiguous=rows)
    check_shape("out_device_counts", out_device_counts, (batch_size, num_kv_heads))
    cpu = (host_table, out_cpu_blocks, out_cpu_pages, out_cpu_counts, q, out_q)
    if any(t is not None for t in cpu):
        if any(t is None for t in cpu):
            raise ValueError("the CPU part needs host_table, out_cpu_blocks, out_cpu_pages, out_cpu_counts, q and "
                             "out_q")
        if capacity < 0:
            raise ValueError(f"capacity must be >= 0, got {capacity}")
        check_tensor("host_table", host_table, ndim=2, dtypes=index, device=device, contiguous=rows)
        for name, t in (("out_cpu_blocks", out_cpu_blocks), ("out_cpu_pages", out_cpu_pages)):
            check_tensor(name, t, dtypes=index, contiguous=rows)
            check_shape(name, t, (batch_size, num_kv_heads, capacity))
        check_tensor("out_cpu_counts", out_cpu_counts, dtypes=index, contiguous=rows)
        check_shape("out_cpu_counts", out_cpu_counts, (batch_size, num_kv_heads))
        check_tensor("q", q, ndim=3, device=device, contiguous=rows)
        if q.shape[0] != batch_size or q.shape[1] % num_kv_heads:
            raise ValueError(f"q must be [{batch_size}, a multiple of {num_kv_heads}, D], got {tuple(q.shape)}")
        check_tensor("out_q", out_q, contiguous=rows)
        check_shape("out_q", out_q, q.shape)
    if counters is not None:
        check_tensor("counters", counters, dtypes=index, device=device)
        check_shape("counters", counters, (NUM_COUNTERS,))
