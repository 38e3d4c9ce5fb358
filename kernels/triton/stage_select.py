"""Top-k block selection of the decode step, one program per (request, KV head).

Second stage of digest -> select -> device part / CPU part -> merge, after the
Quest scores (selection.py). One launch does what took a sort, a dozen
elementwise ops and the change count: the top-k with the sink and local blocks
forced first, ties to the lower block index; the change count against the
previous step's selection of the same request; and for quest's device-full
layers, the page list to attend (the selected pages, then the partial tail).

Ordering key: one int64 per block, so that a descending sort is the policy:

    bits 63..32  sortable(score) as int32     (forced: INT32_MAX; past num_full: INT32_MIN)
    bits 31..0   0xFFFFFFFF - block           (equal scores: the lower block first)

The row is taken CHUNK blocks at a time (a bitonic sort of each chunk, its best
K merged with the running best K), so a long context costs registers of one
chunk, not of the whole row. The grid is (B, Hkv) whatever the data. The
change count looks each selected block up in the previous selection: all
pairs, or for a selection as wide as a long request (resident-first), a
histogram of block ids (lists.member).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from scout_sglang.kernels.step_counters import CHANGED, COMPARED, SELECTED
from scout_sglang.kernels.triton.lists import member
from scout_sglang.kernels.triton.sizes import bins_for, cdiv, p2, warps_for, wide_lists

from scout_sglang.layout import PAD_BLOCK

_MAX_CHUNK = 1024


@triton.jit
def _sortable(score):
    # fp32 -> int32 of the same order; + 0.0 makes -0.0 equal to +0.0, as a float compare does.
    bits = (score + 0.0).to(tl.int32, bitcast=True)
    return bits ^ ((bits >> 31) & 0x7FFFFFFF)


@triton.jit
def _best(keys, TOPK_P2: tl.constexpr):
    # The TOPK_P2 largest keys, largest first. After a descending sort, column j of the
    # [N / TOPK_P2, TOPK_P2] view holds its largest value in row 0: the max over rows is row 0.
    n: tl.constexpr = keys.shape[0]
    ordered = tl.sort(keys, descending=True)
    return tl.max(tl.reshape(ordered, (n // TOPK_P2, TOPK_P2)), axis=0)


@triton.jit
def _in_previous_wide(selected, before, PAD: tl.constexpr, BINS: tl.constexpr):
    """Which selected blocks the previous selection `before` (PAD-padded) has, for wide rows. A previous selection
    of every block up to its largest (an exact resident-first row's: all of its blocks) is a range, read as one;
    any other is looked up through a histogram (lists.member). A selection lists a block once."""
    listed = before != PAD
    top = tl.max(tl.where(listed, before, -1), axis=0)
    found = (selected >= 0) & (selected <= top)
    if tl.sum(listed.to(tl.int32), axis=0) != top + 1:
        found = member(selected, before, listed, True, BINS)
    return found


@triton.jit
def _select_topk_kernel(
    scores_ptr,
    num_full_ptr,
    selected_ptr,
    counts_ptr,
    previous_ptr,
    slots_ptr,
    counters_ptr,
    table_ptr,
    num_tokens_ptr,
    pages_ptr,
    page_counts_ptr,
    row_topk_ptr,
    stride_num_full,
    stride_slots,
    stride_num_tokens,
    stride_scores_batch,
    stride_scores_head,
    stride_sel_batch,
    stride_sel_head,
    stride_counts_batch,
    stride_prev_slot,
    stride_prev_head,
    stride_table_batch,
    stride_pages_batch,
    stride_pages_head,
    stride_page_counts_batch,
    stride_row_topk,
    TOPK: tl.constexpr,
    TOPK_P2: tl.constexpr,
    SINK: tl.constexpr,
    LOCAL: tl.constexpr,
    CHUNK: tl.constexpr,
    NUM_CHUNKS: tl.constexpr,
    TRACK: tl.constexpr,
    COUNT: tl.constexpr,
    WITH_PAGES: tl.constexpr,
    ROW_TOPK: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    PAD: tl.constexpr,
    SELECTED_COL: tl.constexpr,
    CHANGED_COL: tl.constexpr,
    COMPARED_COL: tl.constexpr,
    WIDE: tl.constexpr,
    BINS: tl.constexpr,
):
    # grid: (B, Hkv).
    batch = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1).to(tl.int64)
    num_full = tl.load(num_full_ptr + batch * stride_num_full)
    lanes = tl.arange(0, CHUNK)
    best = tl.full((TOPK_P2,), -(2**63) + 1, tl.int64)
    for chunk in range(NUM_CHUNKS):
        block = chunk * CHUNK + lanes
        valid = block < num_full
        score = tl.load(scores_ptr + batch * stride_scores_batch + head * stride_scores_head + block, mask=valid,
                        other=0.0)
        forced = valid & ((block < SINK) | (block >= num_full - LOCAL))
        high = tl.where(forced, 2147483647, tl.where(valid, _sortable(score), -2147483648))
        key = (high.to(tl.int64) << 32) | (4294967295 - block.to(tl.int64))
        top = _best(key, TOPK_P2)
        if NUM_CHUNKS == 1:
            best = top
        else:
            best = _best(tl.reshape(tl.join(best, top), (2 * TOPK_P2,)), TOPK_P2)

    rank = tl.arange(0, TOPK_P2)
    count = tl.minimum(num_full, TOPK)
    if ROW_TOPK:  # the row's own k: the first of the policy's order
        count = tl.minimum(count, tl.load(row_topk_ptr + batch * stride_row_topk))
    chosen = rank < count
    selected = tl.where(chosen, (4294967295 - (best & 4294967295)).to(tl.int32), PAD)
    tl.store(selected_ptr + batch * stride_sel_batch + head * stride_sel_head + rank, selected, mask=rank < TOPK)
    tl.store(counts_ptr + batch * stride_counts_batch + head, count)
    if COUNT:
        tl.atomic_add(counters_ptr + SELECTED_COL, count)

    if TRACK:  # blocks the previous step of the same request did not select
        slot = tl.load(slots_ptr + batch * stride_slots).to(tl.int64)
        row = previous_ptr + slot * stride_prev_slot + head * stride_prev_head
        before = tl.load(row + rank, mask=rank < TOPK, other=PAD)
        had_any = tl.max((before != PAD).to(tl.int32), axis=0) > 0
        if WIDE:
            kept = _in_previous_wide(selected, before, PAD, BINS)
        else:
            kept = member(selected, before, before != PAD, WIDE, BINS)
        compared = chosen & had_any
        tl.atomic_add(counters_ptr + COMPARED_COL, tl.sum(compared.to(tl.int32), axis=0))
        tl.atomic_add(counters_ptr + CHANGED_COL, tl.sum((compared & ~kept).to(tl.int32), axis=0))
        tl.store(row + rank, selected, mask=(rank < TOPK) & (rank * 0 < count))  # count > 0, as a vector

    if WITH_PAGES:  # quest: the selected pages, then the partial tail's page (TOPK_P2 > TOPK leaves it a lane)
        num_tokens = tl.load(num_tokens_ptr + batch * stride_num_tokens)
        has_tail = (num_tokens % BLOCK_SIZE) != 0
        table = table_ptr + batch * stride_table_batch
        page = tl.load(table + selected, mask=chosen, other=PAD)
        tail_page = tl.load(table + num_full, mask=has_tail, other=PAD)
        pages = tl.where(chosen, page, tl.where((rank == count) & has_tail, tail_page, PAD))
        tl.store(pages_ptr + batch * stride_pages_batch + head * stride_pages_head + rank, pages,
                 mask=rank < TOPK + 1)
        tl.store(page_counts_ptr + batch * stride_page_counts_batch + head, count + has_tail.to(tl.int32))


def select_topk_triton(scores: torch.Tensor, num_full: torch.Tensor, selected: torch.Tensor, counts: torch.Tensor, *,
                       topk: int, num_sink_blocks: int, num_local_blocks: int, previous: torch.Tensor | None,
                       slots: torch.Tensor | None, counters: torch.Tensor | None, page_table: torch.Tensor | None,
                       num_tokens: torch.Tensor | None, block_size: int, pages: torch.Tensor | None,
                       page_counts: torch.Tensor | None, row_topk: torch.Tensor | None = None) -> None:
    """Launch the selection stage; arguments as stage_select.select_blocks (validated there)."""
    batch_size, num_kv_heads, max_blocks = scores.shape
    if batch_size == 0:
        return
    with_pages = pages is not None
    dummy = counts  # pointer arguments that a disabled branch never reads
    config = _config(topk, max_blocks, num_sink_blocks, num_local_blocks, block_size, previous is not None,
                     counters is not None, with_pages, row_topk is not None)
    _select_topk_kernel[(batch_size, num_kv_heads)](
        scores, num_full, selected, counts,
        dummy if previous is None else previous,
        dummy if slots is None else slots,
        dummy if counters is None else counters,
        dummy if page_table is None else page_table,
        dummy if num_tokens is None else num_tokens,
        dummy if pages is None else pages,
        dummy if page_counts is None else page_counts,
        dummy if row_topk is None else row_topk,
        num_full.stride(0), 0 if slots is None else slots.stride(0), 0 if num_tokens is None else num_tokens.stride(0),
        scores.stride(0), scores.stride(1), selected.stride(0), selected.stride(1), counts.stride(0),
        0 if previous is None else previous.stride(0), 0 if previous is None else previous.stride(1),
        0 if page_table is None else page_table.stride(0),
        0 if pages is None else pages.stride(0), 0 if pages is None else pages.stride(1),
        0 if page_counts is None else page_counts.stride(0),
        0 if row_topk is None else row_topk.stride(0),
        num_warps=warps_for(config), **config,
    )  # fmt: skip


@functools.cache
def _config(topk, max_blocks, sink, local, block_size, track, count, with_pages, row_topk):
    topk_p2 = p2(topk + 1 if with_pages else topk)
    chunk = max(topk_p2, min(p2(max_blocks), _MAX_CHUNK))
    return dict(TOPK=topk, TOPK_P2=topk_p2, SINK=sink, LOCAL=local, CHUNK=chunk,
                NUM_CHUNKS=cdiv(max(max_blocks, 1), chunk), TRACK=track, COUNT=count, WITH_PAGES=with_pages,
                ROW_TOPK=row_topk, BLOCK_SIZE=block_size, PAD=PAD_BLOCK, SELECTED_COL=SELECTED, CHANGED_COL=CHANGED,
                COMPARED_COL=COMPARED, WIDE=wide_lists(topk_p2),
                BINS=bins_for(max_blocks))
