"""The resident-buffer stage's bring-in for rows as wide as a long request (stage_recall.py, WIDE), where its
all-pairs victim rank ([R, R]) and candidate matches ([C, R]) would be millions of elements.

The victim order, (class, score, slot) ascending, is a sort of one 64-bit key per slot: class, the score's bits
in an order-keeping form, the slot. Candidate c goes to the slot at its rank among the wanted candidates; a
second sort, by slot, gives each slot its place in the order, so the slot takes the wanted candidate of that
rank. Blocks are looked up through a histogram of block ids (lists.member_of) and lists compacted through
a histogram of their running count (lists.compacted). The copies go MOVES blocks per pass, their pages gathered from the compacted moves.
"""

from __future__ import annotations

import triton
import triton.language as tl
from scout_sglang.kernels.triton.lists import compacted, member_of, rank_of

SLOT_BITS = 16  # a slot's bits in the victim order's key: rows of up to 65536 columns
MOVES = 4  # blocks copied per pass of a program


@triton.jit
def _ordered_bits(score):
    # A float32 as a 32-bit unsigned integer (in int64) that sorts as the float does; -0.0 as 0.0.
    bits = (score + 0.0).to(tl.int32, bitcast=True).to(tl.int64) & 0xFFFFFFFF
    return tl.where(bits >= 0x80000000, bits ^ 0xFFFFFFFF, bits | 0x80000000)


@triton.jit
def bring_in_wide(row, slots_r, in_slot, candidates, selected, sel_valid, vscore, quota, PAD: tl.constexpr,
                    SLOT_BITS: tl.constexpr, BINS: tl.constexpr):
    """stage_recall._bring_in for wide rows: -> (new row, applied [C], destination slot [C])."""
    occupied = row != PAD
    wanted = (candidates != PAD) & ~member_of(candidates, row, occupied, BINS)
    vclass = tl.where(in_slot & ~occupied, 0, tl.where(in_slot & ~member_of(row, selected, sel_valid, BINS), 1, 2))
    key = (vclass.to(tl.int64) << (32 + SLOT_BITS)) | (_ordered_bits(vscore) << SLOT_BITS) | slots_r.to(tl.int64)
    low = (1 << SLOT_BITS) - 1
    victims = (tl.sort(key) & low).to(tl.int32)  # slots, first victim first
    vrank = (tl.sort((victims.to(tl.int64) << SLOT_BITS) | slots_r.to(tl.int64)) & low).to(tl.int32)
    num_victims = tl.sum((vclass < 2).to(tl.int32), axis=0)
    crank = rank_of(wanted)
    num_applied = tl.maximum(tl.minimum(tl.minimum(tl.sum(wanted.to(tl.int32), axis=0), num_victims), quota), 0)
    applied = wanted & (crank < num_applied)
    lanes: tl.constexpr = candidates.shape[0]
    width: tl.constexpr = row.shape[0]
    dst = tl.gather(victims, tl.minimum(tl.maximum(crank, 0), width - 1), 0)
    incoming = tl.gather(compacted(candidates, wanted, lanes), tl.minimum(vrank, lanes - 1), 0)
    new_row = tl.where((vclass < 2) & (vrank < num_applied), incoming, row)
    return new_row, applied, dst


@triton.jit
def _copy_blocks(src_k, src_v, dst_k, dst_v, src_pages, dst_pages, live, head, stride_src_page, stride_src_head,
                 stride_src_tok, stride_dst_page, stride_dst_head, stride_dst_tok, tile, s, d):
    # (page, head) blocks of K and of V, one per live entry of the page vectors: [M, S, D] each.
    src = (src_pages.to(tl.int64)[:, None, None] * stride_src_page + head * stride_src_head
           + s[None, :, None] * stride_src_tok + d[None, None, :])
    dst = (dst_pages.to(tl.int64)[:, None, None] * stride_dst_page + head * stride_dst_head
           + s[None, :, None] * stride_dst_tok + d[None, None, :])
    mask = live[:, None, None] & tile[None, :, :]
    tl.store(dst_k + dst, tl.load(src_k + src, mask=mask), mask=mask)
    tl.store(dst_v + dst, tl.load(src_v + src, mask=mask), mask=mask)


@triton.jit
def copy_moves_gathered(candidates, applied, dst, pages, lanes, host_row, host_k_ptr, host_v_ptr, dev_k_ptr,
                        dev_v_ptr, head, stride_host_page, stride_host_head, stride_host_tok, stride_dev_page,
                        stride_dev_head, stride_dev_tok, tile, s, d, MOVES: tl.constexpr):
    """stage_recall._copy_moves for wide rows: the applied moves as (host page, resident page) pairs, compacted;
    then MOVES block copies per pass."""
    n: tl.constexpr = lanes.shape[0]
    width: tl.constexpr = pages.shape[0]
    num_moves = tl.sum(applied.to(tl.int32), axis=0)
    src_pages = tl.load(host_row + compacted(candidates, applied, n), mask=lanes < num_moves, other=0)
    dst_pages = tl.gather(pages, tl.minimum(tl.maximum(compacted(dst, applied, n), 0), width - 1), 0)
    for first in range(0, num_moves, MOVES):
        m = first + tl.arange(0, MOVES)
        index = tl.minimum(m, n - 1)
        _copy_blocks(host_k_ptr, host_v_ptr, dev_k_ptr, dev_v_ptr, tl.gather(src_pages, index, 0),
                     tl.gather(dst_pages, index, 0), m < num_moves, head, stride_host_page, stride_host_head,
                     stride_host_tok, stride_dev_page, stride_dev_head, stride_dev_tok, tile, s, d)
