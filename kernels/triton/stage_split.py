"""The split stage of the decode step, one program per (request, KV head).

digest -> select -> **split** -> device part / CPU part -> merge. From the
selection it writes the two lists a layer attends:

    device list [R + W]: resident pages that hold a block (infinigen: a selected one), in slot order,
                         then the window's pages (sink, local blocks, partial tail), ascending
    CPU list    [C]:     selected blocks, best first, that neither the window nor the resident buffer
                         holds, capped at C; as logical blocks and as host pages (the hand-off's lists)
    split       (SPLIT)  the row's CPU cap keeps the first entries' host pages for the workers and moves
                         the rest, in order, to the zero-copy list that the device reads itself
    page check  (CHECK_PAGES) a host page outside [0, num_host_pages) is counted in BAD_PAGES and listed
                         as page 0, so no reader leaves the store (stage_split.py)

and stages the query rows of the KV head for the CPU worker. Compaction keeps
the order by placing entry i at its rank among the kept ones (lists.place): no
scatter, so every output row is written by one vector store. Rows and
selections as wide as a long request (resident-first) count through
histograms instead of comparing all pairs (WIDE: lists.member, lists.compact).
"""

from __future__ import annotations

import functools

import triton
import triton.language as tl
from scout_sglang.kernels.step_counters import BAD_PAGES, CPU, DROPPED, ZERO_COPY
from scout_sglang.kernels.triton.lists import compact, contains, member, place, rank_of
from scout_sglang.kernels.triton.sizes import bins_for, or_unused, p2, warps_for, wide_lists

from scout_sglang.layout import PAD_BLOCK


@triton.jit
def _held_pages_wide(pages_row, resident_pages, held, r, num_resident, lanes, DEVICE_P2: tl.constexpr):
    """The pages of a wide row's held columns, in column order, at 0.. of a [DEVICE_P2] vector (0 past them). A row
    whose held columns are its first ones (an exact resident-first row: it fills and admits into its lowest free
    columns) is read as it is; any other is compacted through a histogram (lists.compact)."""
    device = tl.load(pages_row + lanes, mask=lanes < num_resident, other=0)
    if tl.max(tl.where(held, r, -1), axis=0) + 1 != num_resident:
        device = compact(resident_pages, held, DEVICE_P2, True)
    return device


@triton.jit
def _on_device_wide(selected, sel_valid, resident, occupied, forced, PAD: tl.constexpr, BINS: tl.constexpr):
    """Which selected blocks a wide resident row holds. When the row and the window's full blocks hold every block
    up to the largest selected one (an exact resident-first row: all of its blocks) they hold them all, and nothing
    is looked up; else a histogram lookup (lists.member). Counting is enough: a row holds a block in one column at
    most, and the forced blocks are distinct (the row's own ones are not counted twice)."""
    top = tl.max(tl.where(sel_valid, selected, -1), axis=0)
    forced_in = (forced != PAD) & (forced >= 0) & (forced <= top)
    row_in = occupied & (resident >= 0) & (resident <= top) & ~contains(resident, forced, forced_in)
    held = tl.sum(row_in.to(tl.int32), axis=0) + tl.sum(forced_in.to(tl.int32), axis=0)
    found = sel_valid
    if held != top + 1:
        found = member(selected, resident, occupied, True, BINS)
    return found


@triton.jit
def _split_lists_kernel(
    selected_ptr, counts_ptr, forced_ptr, window_pages_ptr, resident_pages_ptr, host_table_ptr, resident_ptr,
    slots_ptr, dev_pages_ptr, dev_counts_ptr, cpu_blocks_ptr, cpu_pages_ptr, cpu_counts_ptr, q_ptr, q_out_ptr,
    cap_ptr, zc_pages_ptr, zc_counts_ptr, listed_ptr, counters_ptr,
    stride_sel_batch, stride_sel_head, stride_counts_batch, stride_forced_batch, stride_window_batch,
    stride_res_pages_batch, stride_host_batch, stride_res_slot, stride_res_head, stride_slots,
    stride_dev_batch, stride_dev_head, stride_dev_counts_batch, stride_cpu_blocks_batch, stride_cpu_blocks_head,
    stride_cpu_pages_batch, stride_cpu_pages_head, stride_cpu_counts_batch, stride_q_batch, stride_q_head,
    stride_q_out_batch, stride_q_out_head, stride_cap, stride_zc_batch, stride_zc_head, stride_zc_counts_batch,
    stride_listed_batch, num_host_pages,
    TOPK_P2: tl.constexpr, WIDTH: tl.constexpr, WIDTH_P2: tl.constexpr, RESIDENT: tl.constexpr,
    RESIDENT_P2: tl.constexpr, DEVICE_P2: tl.constexpr, CAPACITY: tl.constexpr, CAPACITY_P2: tl.constexpr,
    HAS_RESIDENT: tl.constexpr, ONLY_SELECTED_RESIDENT: tl.constexpr, CPU_LISTS: tl.constexpr, SPLIT: tl.constexpr,
    GROUP_SIZE: tl.constexpr, GROUP_P2: tl.constexpr, HEAD_DIM: tl.constexpr, DIM_P2: tl.constexpr,
    PAD: tl.constexpr, CPU_COL: tl.constexpr, DROPPED_COL: tl.constexpr, ZERO_COPY_COL: tl.constexpr,
    CHECK_PAGES: tl.constexpr, BAD_PAGES_COL: tl.constexpr, COUNTS: tl.constexpr, WIDE: tl.constexpr,
    BINS: tl.constexpr,
):  # fmt: skip
    # grid: (B, Hkv).
    batch = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1).to(tl.int64)
    rank = tl.arange(0, TOPK_P2)
    count = tl.load(counts_ptr + batch * stride_counts_batch + head)
    sel_valid = rank < count
    selected = tl.load(selected_ptr + batch * stride_sel_batch + head * stride_sel_head + rank, mask=sel_valid,
                       other=PAD)
    columns = tl.arange(0, WIDTH_P2)
    window = tl.load(window_pages_ptr + batch * stride_window_batch + columns, mask=columns < WIDTH, other=PAD)
    in_window = window != PAD
    lanes = tl.arange(0, DEVICE_P2)
    if HAS_RESIDENT:
        slot = tl.load(slots_ptr + batch * stride_slots).to(tl.int64)
        r = tl.arange(0, RESIDENT_P2)
        resident = tl.load(resident_ptr + slot * stride_res_slot + head * stride_res_head + r, mask=r < RESIDENT,
                           other=PAD)
        occupied = resident != PAD
        held = occupied
        if ONLY_SELECTED_RESIDENT:  # infinigen attends the resident blocks it selected
            held = occupied & member(resident, selected, sel_valid, WIDE, BINS)
        resident_pages = tl.load(resident_pages_ptr + batch * stride_res_pages_batch + r, mask=r < RESIDENT,
                                 other=PAD)
        num_resident = tl.sum(held.to(tl.int32), axis=0)
        if WIDE:
            device = _held_pages_wide(resident_pages_ptr + batch * stride_res_pages_batch, resident_pages, held, r,
                                      num_resident, lanes, DEVICE_P2)
        else:
            device = compact(resident_pages, held, DEVICE_P2, WIDE)
        device += place(window, num_resident + rank_of(in_window), in_window, DEVICE_P2)
    else:
        num_resident = 0
        device = place(window, rank_of(in_window), in_window, DEVICE_P2)
    num_device = num_resident + tl.sum(in_window.to(tl.int32), axis=0)
    tl.store(dev_pages_ptr + batch * stride_dev_batch + head * stride_dev_head + lanes,
             tl.where(lanes < num_device, device, PAD), mask=lanes < RESIDENT + WIDTH)
    tl.store(dev_counts_ptr + batch * stride_dev_counts_batch + head, num_device)

    if CPU_LISTS:
        forced = tl.load(forced_ptr + batch * stride_forced_batch + columns, mask=columns < WIDTH, other=PAD)
        on_device = contains(selected, forced, forced != PAD)
        if HAS_RESIDENT:
            if WIDE:
                on_device = on_device | _on_device_wide(selected, sel_valid, resident, occupied, forced, PAD, BINS)
            else:
                on_device = on_device | member(selected, resident, occupied, WIDE, BINS)
        keep = sel_valid & ~on_device
        wanted = tl.sum(keep.to(tl.int32), axis=0)
        num_listed = tl.minimum(wanted, CAPACITY)
        c = tl.arange(0, CAPACITY_P2)
        listed = c < num_listed
        blocks = tl.where(listed, compact(selected, keep, CAPACITY_P2, WIDE), PAD)
        pages = tl.load(host_table_ptr + batch * stride_host_batch + blocks, mask=listed, other=PAD)
        if CHECK_PAGES:  # a corrupt or stale page table: no reader may leave the store
            bad = listed & ((pages < 0) | (pages >= num_host_pages))
            pages = tl.where(bad, 0, pages)
            if COUNTS:
                tl.atomic_add(counters_ptr + BAD_PAGES_COL, tl.sum(bad.to(tl.int32), axis=0))
        tl.store(cpu_blocks_ptr + batch * stride_cpu_blocks_batch + head * stride_cpu_blocks_head + c, blocks,
                 mask=c < CAPACITY)
        num_cpu = num_listed
        if SPLIT:  # the workers' share first, the rest to the device's zero-copy list, shifted to its front
            num_cpu = tl.minimum(num_listed, tl.maximum(tl.load(cap_ptr + batch * stride_cap), 0))
            num_zero_copy = num_listed - num_cpu
            moved = listed & (c >= num_cpu)
            zero_copy = tl.where(c < num_zero_copy, place(pages, c - num_cpu, moved, CAPACITY_P2), PAD)
            tl.store(zc_pages_ptr + batch * stride_zc_batch + head * stride_zc_head + c, zero_copy, mask=c < CAPACITY)
            tl.store(zc_counts_ptr + batch * stride_zc_counts_batch + head, num_zero_copy)
            tl.store(listed_ptr + batch * stride_listed_batch + head, num_listed)
            if COUNTS:
                tl.atomic_add(counters_ptr + ZERO_COPY_COL, num_zero_copy)
            pages = tl.where(c < num_cpu, pages, PAD)
        tl.store(cpu_pages_ptr + batch * stride_cpu_pages_batch + head * stride_cpu_pages_head + c, pages,
                 mask=c < CAPACITY)
        tl.store(cpu_counts_ptr + batch * stride_cpu_counts_batch + head, num_cpu)
        if COUNTS:  # without a counters row its pointer stands in unused: nothing may be added there
            tl.atomic_add(counters_ptr + CPU_COL, num_cpu)
            tl.atomic_add(counters_ptr + DROPPED_COL, wanted - num_listed)
        # The query rows of this KV head, in the dtype of the staging buffer.
        g = tl.arange(0, GROUP_P2)
        d = tl.arange(0, DIM_P2)
        q_heads = head * GROUP_SIZE + g
        mask = (g < GROUP_SIZE)[:, None] & (d < HEAD_DIM)[None, :]
        q = tl.load(q_ptr + batch * stride_q_batch + q_heads[:, None] * stride_q_head + d[None, :], mask=mask)
        tl.store(q_out_ptr + batch * stride_q_out_batch + q_heads[:, None] * stride_q_out_head + d[None, :],
                 q.to(q_out_ptr.dtype.element_ty), mask=mask)


@functools.cache
def _config(topk, width, num_resident, capacity, only_selected_resident, cpu_lists, split, check_pages, group_size,
            head_dim, counts, num_blocks=0):
    # num_blocks: the block ids' bound (the host table's width) where the CPU lists look selected blocks up
    return dict(TOPK_P2=p2(topk), WIDTH=width, WIDTH_P2=p2(width), RESIDENT=num_resident, RESIDENT_P2=p2(num_resident),
                DEVICE_P2=p2(num_resident + width), CAPACITY=capacity, CAPACITY_P2=p2(capacity),
                HAS_RESIDENT=num_resident > 0, ONLY_SELECTED_RESIDENT=only_selected_resident, CPU_LISTS=cpu_lists, SPLIT=split,
                GROUP_SIZE=group_size, GROUP_P2=p2(group_size), HEAD_DIM=head_dim, DIM_P2=p2(head_dim), PAD=PAD_BLOCK,
                CPU_COL=CPU, DROPPED_COL=DROPPED, ZERO_COPY_COL=ZERO_COPY, CHECK_PAGES=check_pages,
                BAD_PAGES_COL=BAD_PAGES, COUNTS=counts, WIDE=wide_lists(topk, num_resident + width),
                BINS=bins_for(num_blocks) if num_blocks else 0)


def split_lists_triton(selected, counts, *, forced_blocks, window_pages, resident_pages, host_table, resident, slots,
                       only_selected_resident, out_device_pages, out_device_counts, capacity, out_cpu_blocks,
                       out_cpu_pages, out_cpu_counts, q, out_q, counters, cpu_cap=None, out_zero_copy_pages=None,
                       out_zero_copy_counts=None, out_listed_counts=None, num_host_pages=None) -> None:
    """Launch the split stage; arguments as stage_split.split_lists (validated there)."""
    batch_size, num_kv_heads, topk = selected.shape
    if batch_size == 0:
        return
    cpu_lists = out_cpu_pages is not None
    num_qo_heads, head_dim = (q.shape[1], q.shape[2]) if cpu_lists else (num_kv_heads, 1)
    split = cpu_cap is not None
    check_pages = cpu_lists and num_host_pages is not None
    config = _config(topk, window_pages.shape[1], 0 if resident is None else resident.shape[2], capacity,
                     only_selected_resident, cpu_lists, split, check_pages, num_qo_heads // num_kv_heads, head_dim,
                     counters is not None, host_table.shape[1] if cpu_lists else 0)
    (resident_pages, s_rp), (host_table, s_ht), (resident, s_res), (slots, s_slots) = (
        or_unused(resident_pages, counts, 1), or_unused(host_table, counts, 1), or_unused(resident, counts, 2),
        or_unused(slots, counts, 1))
    (out_cpu_blocks, s_cb), (out_cpu_pages, s_cp), (out_cpu_counts, s_cc) = (
        or_unused(out_cpu_blocks, counts, 2), or_unused(out_cpu_pages, counts, 2),
        or_unused(out_cpu_counts, counts, 1))
    (q, s_q), (out_q, s_oq), (counters, _) = (
        or_unused(q, counts, 2), or_unused(out_q, counts, 2), or_unused(counters, counts, 0))
    (cpu_cap, s_cap), (out_zero_copy_pages, s_zc), (out_zero_copy_counts, s_zcc), (out_listed_counts, s_lc) = (
        or_unused(cpu_cap, counts, 1), or_unused(out_zero_copy_pages, counts, 2),
        or_unused(out_zero_copy_counts, counts, 1), or_unused(out_listed_counts, counts, 1))
    _split_lists_kernel[(batch_size, num_kv_heads)](
        selected, counts, forced_blocks, window_pages, resident_pages, host_table, resident, slots, out_device_pages,
        out_device_counts, out_cpu_blocks, out_cpu_pages, out_cpu_counts, q, out_q, cpu_cap, out_zero_copy_pages,
        out_zero_copy_counts, out_listed_counts, counters,
        *selected.stride()[:2], counts.stride(0), forced_blocks.stride(0), window_pages.stride(0), *s_rp, *s_ht, *s_res,
        *s_slots, *out_device_pages.stride()[:2], out_device_counts.stride(0), *s_cb, *s_cp, *s_cc, *s_q, *s_oq,
        *s_cap, *s_zc, *s_zcc, *s_lc, num_host_pages or 0, num_warps=warps_for(config), **config)
