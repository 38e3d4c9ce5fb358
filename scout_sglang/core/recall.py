"""Resident-buffer maintenance for a whole batch: first fill, recall, window admission.

Recall copies the most important non-resident candidate blocks of each
(request, layer, KV head) into its resident buffer, replacing empty slots
first (lowest slot first), then resident blocks outside the current selection,
lowest score first, ties to the lower slot (lowest slot first when no scores
are given, as at the first fill). At most `capacity` (block, KV head) copies
are made per call, in (request, head, candidate) order; the rest wait for a
later step and their blocks are attended on the CPU meanwhile. The rules are
written a second time, independently, in tests/oracle/policy.py: a change here
must change that one too.

Everything is a fixed sequence of tensor ops over [B, Hkv, ...] whatever the
data: no host reads, no Python loop over requests, heads or blocks. Copies go
through one `kernels.copy_block_rows` per store, over a list of `capacity` rows
whose unused entries point at the stores' scratch pages.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from scout_sglang import kernels
from scout_sglang.layout import PAD_BLOCK


class RecallMoves(NamedTuple):
    """The (block, KV head) copies of one call, compacted to a fixed capacity M."""

    src_rows: torch.Tensor  # [M] long, rows of the source store viewed as [pages * Hkv, S, D]
    dst_rows: torch.Tensor  # [M] long, rows of the device store viewed likewise
    moved: torch.Tensor  # [B, Hkv] int32, copies per (request, KV head)


class BringIn(NamedTuple):
    resident: torch.Tensor  # [B, Hkv, R] int32, the buffer after the moves
    applied: torch.Tensor  # [B, Hkv, C] bool, candidates that move in
    dst_slot: torch.Tensor  # [B, Hkv, C] long, their resident slot (meaningless where not applied)


def contains(values: torch.Tensor, pool: torch.Tensor) -> torch.Tensor:
    """values [..., A] in pool [..., P] (PAD_BLOCK entries of the pool never match) -> [..., A] bool."""
    same = values.unsqueeze(-1) == pool.unsqueeze(-2)
    return (same & (pool != PAD_BLOCK).unsqueeze(-2)).any(dim=-1)


def bring_in(resident: torch.Tensor, candidates: torch.Tensor, selected: torch.Tensor, scores: torch.Tensor | None,
             capacity: int) -> BringIn:
    """Which candidates enter which resident slots.

    Parameters
    ----------
    resident : [B, Hkv, R] int32 logical blocks per slot, PAD_BLOCK empty
    candidates : [B, Hkv, C] int32 logical blocks, best first, PAD_BLOCK: none
    selected : [B, Hkv, K] int32 the current selection (PAD_BLOCK padded); its
        resident blocks are never evicted
    scores : [B, Hkv, NB] fp32 block scores, or None (victims in slot order)
    capacity : M, copies allowed for the whole call
    """
    num_slots = resident.shape[-1]
    if num_slots == 0:  # no resident buffer: nothing moves (a shape, not a value: the op sequence stays fixed)
        nothing = torch.zeros_like(candidates, dtype=torch.bool)
        return BringIn(resident, nothing, torch.zeros_like(candidates, dtype=torch.long))
    wanted = (candidates != PAD_BLOCK) & ~contains(candidates, resident)
    empty = resident == PAD_BLOCK
    victim_class = torch.where(empty, 0, torch.where(contains(resident, selected), 2, 1))  # 2: not a victim
    order = torch.arange(num_slots, device=resident.device).expand_as(resident)
    if scores is not None:
        score = scores.gather(-1, resident.clamp(min=0).long()).masked_fill(empty, 0.0)
        order = torch.sort(score, dim=-1, stable=True).indices
    order = order.gather(-1, torch.sort(victim_class.gather(-1, order), dim=-1, stable=True).indices)
    num_victims = (victim_class < 2).sum(dim=-1, keepdim=True)
    rank = torch.cumsum(wanted.to(torch.int32), dim=-1) - 1
    applied = wanted & (rank < num_victims)
    batch_rank = torch.cumsum(applied.flatten().to(torch.int32), dim=0).view_as(applied) - 1
    applied = applied & (batch_rank < capacity)
    dst_slot = order.gather(-1, rank.clamp(min=0, max=num_slots - 1).long())
    staged = torch.cat([resident, torch.full_like(resident[..., :1], PAD_BLOCK)], dim=-1)
    staged.scatter_(-1, torch.where(applied, dst_slot, num_slots), candidates)
    return BringIn(staged[..., :num_slots], applied, dst_slot)


def compact_moves(decision: BringIn, candidates: torch.Tensor, host_table: torch.Tensor, resident_pages: torch.Tensor,
                  *, capacity: int, src_scratch: int, dst_scratch: int) -> RecallMoves:
    """Row lists of the copies host page -> resident page, fixed length `capacity`.

    host_table : [B, NB] int32 host page of each logical block
    resident_pages : [B, R] int32 device page of each resident slot
    src_scratch, dst_scratch : scratch pages of the source and the device store
    """
    batch_size, num_kv_heads, width = candidates.shape
    head = torch.arange(num_kv_heads, device=candidates.device).view(1, num_kv_heads, 1)
    src_page = host_table.gather(1, candidates.clamp(min=0).reshape(batch_size, -1).long()).view_as(candidates)
    dst_page = resident_pages.gather(1, decision.dst_slot.reshape(batch_size, -1)).view_as(candidates)
    return _compact(decision.applied, src_page.long() * num_kv_heads + head, dst_page.long() * num_kv_heads + head,
                    capacity=capacity, src_scratch=src_scratch * num_kv_heads, dst_scratch=dst_scratch * num_kv_heads)


def _compact(applied, src_rows, dst_rows, *, capacity, src_scratch, dst_scratch) -> RecallMoves:
    flat = applied.flatten()
    rank = torch.cumsum(flat.to(torch.int64), dim=0) - 1
    position = torch.where(flat, rank, capacity)  # everything else lands in a scratch entry
    src = torch.full((capacity + 1,), src_scratch, dtype=torch.long, device=applied.device)
    dst = torch.full((capacity + 1,), dst_scratch, dtype=torch.long, device=applied.device)
    src.scatter_(0, position, src_rows.flatten())
    dst.scatter_(0, position, dst_rows.flatten())
    return RecallMoves(src[:capacity], dst[:capacity], applied.sum(dim=-1, dtype=torch.int32))


def copy_moves(moves: RecallMoves, src_k, src_v, dst_k, dst_v, *, dst_scratch: int) -> None:
    """Apply the copies to one layer: stores [P, Hkv, S, D] viewed as rows [P * Hkv, S, D]; entries aimed at
    the device store's scratch page copy nothing."""
    num_kv_heads = dst_k.shape[1]
    for src, dst in ((src_k, dst_k), (src_v, dst_v)):
        kernels.copy_block_rows(src.flatten(0, 1), moves.src_rows, dst.flatten(0, 1), moves.dst_rows,
                                skip_row=dst_scratch * num_kv_heads)


def admit_leaving(resident: torch.Tensor, leaving: torch.Tensor, leaving_page: torch.Tensor,
                  resident_pages: torch.Tensor, *, dst_scratch: int) -> tuple[torch.Tensor, RecallMoves]:
    """A block leaving the local window enters each head's first free resident slot, if any.

    Policy: only free slots are used (nothing is evicted for it); a head with a
    full buffer keeps the block on the host only, where selection still finds it.

    resident : [n, Hkv, R] rows of the requests whose block leaves; leaving : [n] long logical block;
    leaving_page : [n] long, its device window page; resident_pages : [n, R] int32.
    Returns the new rows and the device -> device copies (window page -> resident page).
    """
    count, num_kv_heads, num_slots = resident.shape
    free = resident == PAD_BLOCK
    admit = ~(resident == leaving.view(-1, 1, 1)).any(dim=-1) & free.any(dim=-1)  # [n, Hkv]
    first_free = free.to(torch.int8).argmax(dim=-1)  # the first free slot
    staged = torch.cat([resident, torch.full_like(resident[..., :1], PAD_BLOCK)], dim=-1)
    staged.scatter_(-1, torch.where(admit, first_free, num_slots).unsqueeze(-1),
                    leaving.view(-1, 1, 1).to(resident.dtype).expand(count, num_kv_heads, 1))
    head = torch.arange(num_kv_heads, device=resident.device).view(1, num_kv_heads)
    src_rows = leaving_page.view(-1, 1) * num_kv_heads + head
    dst_rows = resident_pages.gather(1, first_free).long() * num_kv_heads + head
    moves = _compact(admit, src_rows, dst_rows, capacity=count * num_kv_heads, src_scratch=dst_scratch * num_kv_heads,
                     dst_scratch=dst_scratch * num_kv_heads)
    return staged[..., :num_slots], moves
