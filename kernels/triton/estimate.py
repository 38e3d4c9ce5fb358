"""The estimate of the unattended blocks and the layer's merge.

digest -> select -> split -> device part / CPU part -> **estimate + merge**
(kernels/estimate.py says what is estimated and why). The estimate walks a
row's full blocks in tiles of BLOCK_N, as the decode walks its tokens:

    blocks  | tile 0 | tile 1 | ... |            (num_full, read from the plan: the grid never depends on it)
    per tile: unattended = not selected, not resident (a [BLOCK_N, K] and a [BLOCK_N, R] comparison)
              key = (kmin + kmax) / 2 of the unattended blocks' pages, and their value summaries
              online softmax of the G query heads over them, each logit + log(block_size),
              each head's value MEAN + scale * (q . AXIS) * SLOPE (two more [G, N] x [N, D] products)
    then:     merge(device part, CPU part (the worker's, or the fallback's: the status picks), estimate) -> out

Short tables (at most SPLIT_BLOCKS blocks of capacity) are walked inside the
merge's own program, one per (request, KV head): the estimate costs no launch
of its own (in the CPU modes this kernel is the CPU part's merge, elsewhere the
layer's one merge). A longer table is cut into `estimate_splits` static slices,
one program per (request, KV head, slice), whose partials (o, lse) go to a flat
fp32 workspace that the merge then combines: one launch more, and the scan
spread over the device (on an H200 the single walk read the summaries at
105-326 GB/s: at 64k tokens it took 4-19x the budget's decode). Keys and values
of the estimate are reduced in fp32.
"""

from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl
from scout_sglang.kernels.triton.lists import contains
from scout_sglang.kernels.triton.merge import merge_tile
from scout_sglang.kernels.triton.sizes import or_unused, p2
from scout_sglang.kernels.triton.value_summary import load_value_summary

from scout_sglang.layout import PAD_BLOCK

_LOG2E = 1.4426950408889634
# tl.dot needs every dimension >= 16: the G query heads, the tile's blocks and D are padded to at least 16.
_MIN_DOT_DIM = 16
_BLOCK_N = 16
SPLIT_BLOCKS = 64  # blocks per slice of a split walk; a table of at most this many blocks is walked whole
MAX_SPLITS = 32


def slice_plan(block_capacity: int) -> tuple[int, int]:
    """(slices, blocks per slice) of the estimate's walk over a table of `block_capacity` blocks (one slice: walked
    inside the merge). A slice longer than a tile is a whole number of tiles, so that none starts mid-tile."""
    splits = max(1, min(MAX_SPLITS, -(-block_capacity // SPLIT_BLOCKS)))
    size = -(-block_capacity // splits)
    if splits > 1 and size > _BLOCK_N:
        size = -(-size // _BLOCK_N) * _BLOCK_N
    return -(-block_capacity // size), size


def estimate_splits(block_capacity: int) -> int:
    """Slices of the estimate's walk over a table of `block_capacity` blocks (1: walked inside the merge)."""
    return slice_plan(block_capacity)[0]


def workspace_words(rows: int, num_qo_heads: int, head_dim: int, block_capacity: int) -> int:
    """fp32 words of the partials of a split walk of up to `rows` rows (0: the walk does not split)."""
    splits = estimate_splits(block_capacity)
    return 0 if splits == 1 else rows * num_qo_heads * splits * (head_dim + 1)


@triton.jit
def _walk(q, row, head, lo, hi, num_full, selected, sel_valid, resident, occupied, min_ptr, max_ptr, mean_ptr,
          table_ptr, stride_min_page, stride_min_head, stride_max_page, stride_max_head, stride_mean_page,
          stride_mean_head, stride_mean_part, stride_table_row, scale, scale_log2, log_block_size,
          HAS_RESIDENT: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
          HEAD_DIM: tl.constexpr):
    """The estimate of the unattended blocks among [lo, min(hi, num_full)) -> (o [BLOCK_G, BLOCK_D] fp32, lse
    [BLOCK_G] natural log, -inf where none is left)."""
    d = tl.arange(0, BLOCK_D)
    in_d = d < HEAD_DIM
    end = tl.minimum(hi, num_full)
    m_i = tl.full((BLOCK_G,), float("-inf"), tl.float32)  # running max, log2 units
    l_i = tl.zeros((BLOCK_G,), tl.float32)
    acc = tl.zeros((BLOCK_G, BLOCK_D), tl.float32)
    for start in range(lo, end, BLOCK_N):
        block = start + tl.arange(0, BLOCK_N)
        attended = contains(block, selected, sel_valid)
        if HAS_RESIDENT:
            attended = attended | contains(block, resident, occupied)
        left = (block < end) & ~attended
        page = tl.load(table_ptr + row * stride_table_row + block, mask=left, other=0).to(tl.int64)
        summary = left[:, None] & in_d[None, :]
        k_min = tl.load(min_ptr + page[:, None] * stride_min_page + head * stride_min_head + d[None, :],
                        mask=summary, other=0.0).to(tl.float32)
        k_max = tl.load(max_ptr + page[:, None] * stride_max_page + head * stride_max_head + d[None, :],
                        mask=summary, other=0.0).to(tl.float32)
        qk = tl.dot(q, tl.trans((k_min + k_max) * 0.5), input_precision="ieee")  # [BLOCK_G, BLOCK_N]
        qk = tl.where(left[None, :], qk * scale_log2, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a tile with no block left keeps m = -inf
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(qk - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        mean, slope, axis = load_value_summary(
            mean_ptr + page[:, None] * stride_mean_page + head * stride_mean_head + d[None, :], stride_mean_part,
            summary)
        moved = p * tl.dot(q, tl.trans(axis), input_precision="ieee") * scale  # [BLOCK_G, BLOCK_N]
        acc = acc * alpha[:, None] + tl.dot(p, mean, input_precision="ieee") + tl.dot(moved, slope,
                                                                                    input_precision="ieee")
        m_i = m_new
    has = l_i > 0
    est_o = acc / tl.where(has, l_i, 1.0)[:, None]
    est_lse = tl.where(has, (m_i + tl.log2(tl.where(has, l_i, 1.0))) * 0.6931471805599453 + log_block_size,
                       float("-inf"))
    return est_o, est_lse


@triton.jit
def _attended(row, head, selected_ptr, counts_ptr, resident_ptr, slots_ptr, stride_sel_row, stride_sel_head,
              stride_counts_row, stride_res_slot, stride_res_head, stride_slots, TOPK_P2: tl.constexpr,
              RESIDENT: tl.constexpr, RESIDENT_P2: tl.constexpr, HAS_RESIDENT: tl.constexpr, PAD: tl.constexpr):
    """What the layer attends exactly: the selection (window's full blocks and CPU list included), the resident
    rows -> (selected, valid, resident, occupied)."""
    r = tl.arange(0, TOPK_P2)
    count = tl.load(counts_ptr + row * stride_counts_row + head)
    sel_valid = r < count
    selected = tl.load(selected_ptr + row * stride_sel_row + head * stride_sel_head + r, mask=sel_valid, other=PAD)
    if HAS_RESIDENT:
        slot = tl.load(slots_ptr + row * stride_slots).to(tl.int64)
        s = tl.arange(0, RESIDENT_P2)
        resident = tl.load(resident_ptr + slot * stride_res_slot + head * stride_res_head + s, mask=s < RESIDENT,
                           other=PAD)
        occupied = resident != PAD
    else:
        resident = selected
        occupied = sel_valid & False
    return selected, sel_valid, resident, occupied


@triton.jit
def _estimate_slice(q_ptr, min_ptr, max_ptr, mean_ptr, table_ptr, num_full_ptr, selected_ptr, counts_ptr,
                    resident_ptr, slots_ptr, row, head, heads, tile, lo, hi, stride_q_row, stride_q_head,
                    stride_min_page, stride_min_head, stride_max_page, stride_max_head, stride_mean_page,
                    stride_mean_head, stride_mean_part, stride_table_row, stride_num_full, stride_sel_row,
                    stride_sel_head, stride_counts_row, stride_res_slot, stride_res_head, stride_slots, scale,
                    scale_log2, log_block_size, HEAD_DIM: tl.constexpr, TOPK_P2: tl.constexpr,
                    RESIDENT: tl.constexpr, RESIDENT_P2: tl.constexpr, HAS_RESIDENT: tl.constexpr,
                    PAD: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """The estimate of (row, head)'s unattended blocks among [lo, hi) with its query -> (o, lse) as _walk."""
    d = tl.arange(0, BLOCK_D)
    q = tl.load(q_ptr + row * stride_q_row + heads[:, None] * stride_q_head + d[None, :], mask=tile,
                other=0.0).to(tl.float32)
    selected, sel_valid, resident, occupied = _attended(
        row, head, selected_ptr, counts_ptr, resident_ptr, slots_ptr, stride_sel_row, stride_sel_head,
        stride_counts_row, stride_res_slot, stride_res_head, stride_slots, TOPK_P2, RESIDENT, RESIDENT_P2,
        HAS_RESIDENT, PAD)
    num_full = tl.load(num_full_ptr + row * stride_num_full)
    return _walk(q, row, head, lo, hi, num_full, selected, sel_valid, resident, occupied, min_ptr, max_ptr,
                 mean_ptr, table_ptr, stride_min_page, stride_min_head, stride_max_page, stride_max_head,
                 stride_mean_page, stride_mean_head, stride_mean_part, stride_table_row, scale, scale_log2,
                 log_block_size, HAS_RESIDENT, BLOCK_G, BLOCK_N, BLOCK_D, HEAD_DIM)


@triton.jit
def _estimate_partials_kernel(
    q_ptr, min_ptr, max_ptr, mean_ptr, table_ptr, num_full_ptr, selected_ptr, counts_ptr, resident_ptr, slots_ptr,
    part_ptr,
    stride_q_row, stride_q_head, stride_min_page, stride_min_head, stride_max_page, stride_max_head,
    stride_mean_page, stride_mean_head, stride_mean_part, stride_table_row, stride_num_full, stride_sel_row,
    stride_sel_head, stride_counts_row, stride_res_slot, stride_res_head, stride_slots,
    scale, scale_log2, log_block_size, lse_offset,
    GROUP_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, NUM_QO_HEADS: tl.constexpr, SPLITS: tl.constexpr,
    SLICE: tl.constexpr, TOPK_P2: tl.constexpr, RESIDENT: tl.constexpr, RESIDENT_P2: tl.constexpr,
    HAS_RESIDENT: tl.constexpr, PAD: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
):  # fmt: skip
    # grid: (B, Hkv, SPLITS). Partials: o [B, Hq, SPLITS, D] from word 0, lse [B, Hq, SPLITS] from lse_offset.
    row = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1).to(tl.int64)
    split = tl.program_id(2)
    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    in_g = g < GROUP_SIZE
    tile = in_g[:, None] & (d < HEAD_DIM)[None, :]
    heads = head * GROUP_SIZE + g
    est_o, est_lse = _estimate_slice(
        q_ptr, min_ptr, max_ptr, mean_ptr, table_ptr, num_full_ptr, selected_ptr, counts_ptr, resident_ptr,
        slots_ptr, row, head, heads, tile, split * SLICE, split * SLICE + SLICE, stride_q_row, stride_q_head,
        stride_min_page, stride_min_head, stride_max_page, stride_max_head, stride_mean_page, stride_mean_head,
        stride_mean_part, stride_table_row, stride_num_full, stride_sel_row, stride_sel_head, stride_counts_row,
        stride_res_slot, stride_res_head, stride_slots, scale, scale_log2, log_block_size, HEAD_DIM, TOPK_P2,
        RESIDENT, RESIDENT_P2, HAS_RESIDENT, PAD, BLOCK_G, BLOCK_N, BLOCK_D)
    cell = (row * NUM_QO_HEADS + heads) * SPLITS + split  # [BLOCK_G]
    tl.store(part_ptr + cell[:, None] * HEAD_DIM + d[None, :], est_o, mask=tile)
    tl.store(part_ptr + lse_offset + cell, est_lse, mask=in_g)


@triton.jit
def _estimate_merge_kernel(
    q_ptr, min_ptr, max_ptr, mean_ptr, table_ptr, num_full_ptr, selected_ptr, counts_ptr, resident_ptr, slots_ptr,
    part_ptr, o_ptr, lse_ptr, cpu_o_ptr, cpu_lse_ptr, fb_o_ptr, fb_lse_ptr, status_ptr, zc_o_ptr, zc_lse_ptr, out_ptr,
    out_lse_ptr,
    stride_q_row, stride_q_head, stride_min_page, stride_min_head, stride_max_page, stride_max_head,
    stride_mean_page, stride_mean_head, stride_mean_part, stride_table_row, stride_num_full, stride_sel_row,
    stride_sel_head,
    stride_counts_row, stride_res_slot, stride_res_head, stride_slots, stride_o_row, stride_o_head, stride_lse_row,
    stride_cpu_o_row, stride_cpu_o_head, stride_cpu_lse_row, stride_fb_o_row, stride_fb_o_head, stride_fb_lse_row,
    stride_zc_o_row, stride_zc_o_head, stride_zc_lse_row, stride_out_row, stride_out_head, stride_out_lse_row,
    scale, scale_log2, log_block_size, lse_offset,
    GROUP_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, NUM_QO_HEADS: tl.constexpr, SPLITS: tl.constexpr,
    TOPK_P2: tl.constexpr, RESIDENT: tl.constexpr,
    RESIDENT_P2: tl.constexpr, HAS_RESIDENT: tl.constexpr, CPU_PART: tl.constexpr, WRITE_LSE: tl.constexpr,
    PAD: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, ZERO_COPY: tl.constexpr,
):  # fmt: skip
    # grid: (B, Hkv). SPLITS == 1: the walk is this program's; else the partials of _estimate_partials_kernel.
    row = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1).to(tl.int64)
    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    in_g = g < GROUP_SIZE
    in_d = d < HEAD_DIM
    tile = in_g[:, None] & in_d[None, :]
    heads = head * GROUP_SIZE + g
    if SPLITS == 1:  # every block of the row: [0, num_full) (hi past any table)
        est_o, est_lse = _estimate_slice(
            q_ptr, min_ptr, max_ptr, mean_ptr, table_ptr, num_full_ptr, selected_ptr, counts_ptr, resident_ptr,
            slots_ptr, row, head, heads, tile, 0, 2**30, stride_q_row, stride_q_head, stride_min_page,
            stride_min_head, stride_max_page, stride_max_head, stride_mean_page, stride_mean_head, stride_mean_part,
            stride_table_row, stride_num_full, stride_sel_row, stride_sel_head, stride_counts_row, stride_res_slot,
            stride_res_head, stride_slots, scale, scale_log2, log_block_size, HEAD_DIM, TOPK_P2, RESIDENT,
            RESIDENT_P2, HAS_RESIDENT, PAD, BLOCK_G, BLOCK_N, BLOCK_D)
    else:
        est_o = tl.zeros((BLOCK_G, BLOCK_D), tl.float32)
        est_lse = tl.full((BLOCK_G,), float("-inf"), tl.float32)
        for split in range(SPLITS):
            cell = (row * NUM_QO_HEADS + heads) * SPLITS + split
            part_lse = tl.load(part_ptr + lse_offset + cell, mask=in_g, other=float("-inf"))
            part_o = tl.load(part_ptr + cell[:, None] * HEAD_DIM + d[None, :], mask=tile, other=0.0)
            est_o, est_lse = merge_tile(est_o, est_lse, part_o, part_lse)

    lse = tl.load(lse_ptr + row * stride_lse_row + heads, mask=in_g, other=float("-inf"))
    o = tl.load(o_ptr + row * stride_o_row + heads[:, None] * stride_o_head + d[None, :], mask=tile,
                other=0.0).to(tl.float32)
    if CPU_PART:  # the worker's result where the status is OK, the fallback's otherwise (as handoff.py merges)
        worker = (heads * 0 + tl.load(status_ptr)) == 0
        fallback = ~worker
        cpu_lse = tl.where(worker, tl.load(cpu_lse_ptr + row * stride_cpu_lse_row + heads, mask=in_g & worker,
                                           other=0.0),
                           tl.load(fb_lse_ptr + row * stride_fb_lse_row + heads, mask=in_g & fallback, other=0.0))
        cpu_o = tl.where(worker[:, None],
                         tl.load(cpu_o_ptr + row * stride_cpu_o_row + heads[:, None] * stride_cpu_o_head + d[None, :],
                                 mask=tile & worker[:, None], other=0.0),
                         tl.load(fb_o_ptr + row * stride_fb_o_row + heads[:, None] * stride_fb_o_head + d[None, :],
                                 mask=tile & fallback[:, None], other=0.0).to(tl.float32))
        o, lse = merge_tile(o, lse, cpu_o, tl.where(in_g, cpu_lse, float("-inf")))
    if ZERO_COPY:  # the CPU split's other share, attended by the device from the host store
        zc_lse = tl.load(zc_lse_ptr + row * stride_zc_lse_row + heads, mask=in_g, other=float("-inf"))
        zc_o = tl.load(zc_o_ptr + row * stride_zc_o_row + heads[:, None] * stride_zc_o_head + d[None, :], mask=tile,
                       other=0.0)
        o, lse = merge_tile(o, lse, zc_o, zc_lse)
    out, out_lse = merge_tile(o, lse, est_o, est_lse)
    tl.store(out_ptr + row * stride_out_row + heads[:, None] * stride_out_head + d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=tile)
    if WRITE_LSE:
        tl.store(out_lse_ptr + row * stride_out_lse_row + heads, out_lse, mask=in_g)


@functools.cache
def _config(group_size, head_dim, topk, num_resident):
    return dict(GROUP_SIZE=group_size, HEAD_DIM=head_dim, TOPK_P2=p2(topk), RESIDENT=num_resident,
                RESIDENT_P2=p2(num_resident), HAS_RESIDENT=num_resident > 0, PAD=PAD_BLOCK,
                BLOCK_G=max(_MIN_DOT_DIM, p2(group_size)), BLOCK_N=_BLOCK_N, BLOCK_D=max(_MIN_DOT_DIM, p2(head_dim)))


def merge_with_estimate_triton(q, o, lse, out, out_lse, *, blocks, cpu) -> None:
    """Launch the estimate (its partials first where the table is long) and the merge; arguments as
    estimate.merge_with_estimate (validated there)."""
    rows, num_qo_heads, head_dim = q.shape
    if rows == 0:
        return
    num_kv_heads = blocks.digest_min.shape[1]
    resident = blocks.resident if blocks.resident is not None and blocks.resident.shape[2] > 0 else None
    config = _config(num_qo_heads // num_kv_heads, head_dim, blocks.selected.shape[2],
                     0 if resident is None else resident.shape[2])
    splits, size = slice_plan(blocks.block_table.shape[1])
    unused = blocks.counts  # pointer arguments that a disabled branch never reads
    (resident, s_res), (slots, s_slots) = (or_unused(resident, unused, 2),
                                           or_unused(None if resident is None else blocks.slots, unused, 1))
    summaries = (q, blocks.digest_min, blocks.digest_max, blocks.value_summary, blocks.block_table, blocks.num_full,
                 blocks.selected, blocks.counts, resident, slots)
    strides = (*q.stride()[:2], *blocks.digest_min.stride()[:2], *blocks.digest_max.stride()[:2],
               *blocks.value_summary.stride()[:3], blocks.block_table.stride(0), blocks.num_full.stride(0),
               *blocks.selected.stride()[:2], blocks.counts.stride(0), *s_res, *s_slots)
    scales = (blocks.scale, blocks.scale * _LOG2E, math.log(blocks.block_size))
    lse_offset = rows * num_qo_heads * splits * head_dim
    if splits > 1:
        words = workspace_words(rows, num_qo_heads, head_dim, blocks.block_table.shape[1])
        part = blocks.workspace
        if part is None:
            part = torch.empty(words, dtype=torch.float32, device=q.device)
        elif part.numel() < words or part.dtype != torch.float32:
            raise ValueError(f"the estimate's workspace holds {part.numel()} {part.dtype} words; a split walk of "
                             f"{rows} rows needs {words} fp32")
        _estimate_partials_kernel[(rows, num_kv_heads, splits)](
            *summaries, part, *strides, *scales, lse_offset, NUM_QO_HEADS=num_qo_heads, SPLITS=splits,
            SLICE=size, **config)
    else:
        part = unused
    parts = (None,) * 4 if cpu is None else (cpu.cpu_o, cpu.cpu_lse, cpu.fb_o, cpu.fb_lse)
    (cpu_o, s_cpu_o), (cpu_lse, s_cpu_lse), (fb_o, s_fb_o), (fb_lse, s_fb_lse) = (
        or_unused(part_, unused, part_dims) for part_, part_dims in zip(parts, (2, 1, 2, 1)))
    status = unused if cpu is None else cpu.status
    zero_copy = cpu is not None and cpu.zc_o is not None
    (zc_o, s_zc_o), (zc_lse, s_zc_lse) = (or_unused(cpu.zc_o if zero_copy else None, unused, 2),
                                          or_unused(cpu.zc_lse if zero_copy else None, unused, 1))
    out_lse_arg, s_out_lse = or_unused(out_lse, unused, 1)
    _estimate_merge_kernel[(rows, num_kv_heads)](
        *summaries, part, o, lse, cpu_o, cpu_lse, fb_o, fb_lse, status, zc_o, zc_lse, out, out_lse_arg,
        *strides, *o.stride()[:2], lse.stride(0), *s_cpu_o, *s_cpu_lse, *s_fb_o, *s_fb_lse, *s_zc_o, *s_zc_lse,
        *out.stride()[:2], *s_out_lse, *scales, lse_offset, NUM_QO_HEADS=num_qo_heads, SPLITS=splits,
        CPU_PART=cpu is not None, WRITE_LSE=out_lse is not None, ZERO_COPY=zero_copy, **config,
    )  # fmt: skip
