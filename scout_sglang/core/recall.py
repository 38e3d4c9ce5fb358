"""Resident-buffer maintenance: initial fill, recall, and window admission.

Recall copies the most important non-resident selected blocks of a
(request, layer, KV head) into its resident buffer, replacing empty slots
first (lowest slot first), then resident blocks outside the current selection,
lowest score first, ties to the lower slot (lowest slot first when no scores
are given, as at the first fill). These functions update the resident map and
issue the copies; when the copies are awaited is the engine's business (a side
stream on CUDA). The rules are written a second time, independently, in
tests/oracle/policy.py: a change here must change that one too.
"""

from __future__ import annotations

import torch

from scout_sglang.layout import PAD_BLOCK


def victim_slots(resident_row: list[int], selected: set[int], scores: torch.Tensor | None) -> list[int]:
    """Slots of one head's resident buffer that may be overwritten, best victim first."""
    empty = [r for r, block in enumerate(resident_row) if block == PAD_BLOCK]
    unused = [r for r, block in enumerate(resident_row) if block != PAD_BLOCK and block not in selected]
    if scores is not None:
        unused.sort(key=lambda r: (float(scores[resident_row[r]]) if resident_row[r] < scores.numel() else 0.0, r))
    return empty + unused


def bring_in(store, layer, rid, slot, head, candidates, selected_set, scores) -> int:
    """Copy candidate blocks (best first) host -> resident slots of one head; returns how many."""
    row = store.resident_map[layer][slot, head]
    resident_now = row.tolist()
    present = set(resident_now)
    wanted = [block for block in candidates if block not in present]
    victims = victim_slots(resident_now, selected_set, scores)
    moved = 0
    for block, slot_index in zip(wanted, victims):
        store.copy_host_to_resident(layer, rid, slot_index, head, block)
        row[slot_index] = block
        moved += 1
    return moved


def admit_leaving_block(store, layer, rid, slot, block) -> None:
    """A block leaving the local window enters each head's free resident slot, if any.

    Policy: only free slots are used (nothing is evicted for it); a head with a
    full buffer keeps the block on the host only, where selection still finds it.
    """
    for head in range(store.resident_map[layer].shape[1]):
        row = store.resident_map[layer][slot, head]
        if bool((row == block).any()):
            continue
        free = (row == PAD_BLOCK).nonzero()
        if free.numel():
            slot_index = int(free[0])
            store.copy_window_to_resident(layer, rid, slot_index, head, block)
            row[slot_index] = block
