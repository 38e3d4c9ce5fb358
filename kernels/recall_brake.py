"""Recall's brake: scout's recall moves only blocks that stay selected, and backs off where it does not pay.

Two rules on top of the recall policy (adaptive or interval), per (request, layer, KV head) row, decided on the
device inside the recall stage (kernels.stage_recall; its Triton kernel repeats them line for line):

Hysteresis (recall_min_selected = k). Every step each selected block's run of consecutive selections is updated:
    run = run + 1 if the block was selected at the row's previous position, else 1
kept per block as one int32 word, (position << 8) | min(run, 255), in `runs` [slots, Hkv, NB + 1] (the last
column is a scratch column that unused lanes write). A CPU-list block is a recall candidate only once its run is
at least k: a block that flickers into the selection for one step stays on the CPU.

Back-off (recall_brake). `state` [slots, Hkv, STATE_WORDS + R] int32 keeps the row's LEVEL, its WAIT (steps
before it may recall again) and the blocks its last recall MOVED, then one FRESH flag per resident slot (1 where
that recall put its block). The step after a recall judges it: the recall paid when at least half of the blocks it
moved are selected again, each one a block that step attends on the device instead of the CPU,
    2 * (fresh slots whose block is selected now) >= moved.
Paid: LEVEL = 0; not paid: LEVEL + 1, at most recall_max_backoff; either way WAIT = 2^LEVEL - 1. Steps that judge
nothing count WAIT down. A row recalls only at WAIT 0, at most quota >> LEVEL blocks (at least 1 when its quota
is not 0). So a row whose recalls keep failing (the selection churns: what recall brings in is gone by the next
step) probes every 2^LEVEL steps with few blocks, and the first probe that pays (the workload changed: the
selection settled) resets it to full speed.

Counters: WITHHELD (candidates kept back by the hysteresis) and BACKED_OFF (rows at a level above 0, per step).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from scout_sglang.kernels.stage_split import contains
from scout_sglang.kernels.step_counters import BACKED_OFF, WITHHELD

from scout_sglang.layout import PAD_BLOCK

RUN_BITS = 8
RUN_LIMIT = (1 << RUN_BITS) - 1
LEVEL, WAIT, MOVED = range(3)
STATE_WORDS = 3  # then FRESH: one flag per resident slot
FRESH = STATE_WORDS
NO_RUN = -1  # a block never selected (position -1: never the previous one)
MAX_RUN_POSITION = 1 << (31 - RUN_BITS)  # positions fit the word's upper 23 bits below this


@dataclass
class RecallBrake:
    """The brake's tensors and settings for one layer's recall call (module docstring).

    runs : [slots, Hkv, NB + 1] int32 or None (no hysteresis); state : [slots, Hkv, STATE_WORDS + R] int32 or None
    (no back-off); positions : [B] int32/int64 each row's token count after the step (its position);
    min_selected : k; max_backoff : the highest level."""

    runs: torch.Tensor | None
    state: torch.Tensor | None
    positions: torch.Tensor
    min_selected: int = 1
    max_backoff: int = 0


def new_runs(rows: int, num_kv_heads: int, num_blocks: int, device) -> torch.Tensor:
    """[rows, Hkv, NB + 1] int32 runs of a layer: nothing selected yet."""
    return torch.full((rows, num_kv_heads, num_blocks + 1), NO_RUN, dtype=torch.int32, device=device)


def new_state(rows: int, num_kv_heads: int, num_resident: int, device) -> torch.Tensor:
    """[rows, Hkv, STATE_WORDS + R] int32 brake state of a layer: level 0, free to recall, no recall to judge."""
    return torch.zeros(rows, num_kv_heads, STATE_WORDS + num_resident, dtype=torch.int32, device=device)


def brake_candidates(candidates: torch.Tensor, quota: torch.Tensor, *, brake: RecallBrake, slots: torch.Tensor,
                     rows: torch.Tensor, selected: torch.Tensor, valid: torch.Tensor, counters: torch.Tensor | None):
    """Scout's recall candidates and quota after the brake -> (candidates [B, Hkv, C], quota [B, Hkv], state rows
    [B, Hkv, STATE_WORDS + R] or None, to finish with `note_recall`).

    candidates [B, Hkv, C] int32 (PAD where not due), quota [B, Hkv]; rows [B, Hkv, R] the resident rows before
    the recall; selected [B, Hkv, K] (PAD past the count) with valid [B, Hkv, K] bool. Updates brake.runs in place."""
    state = None
    if brake.state is not None:
        state = _judge(brake.state[slots], rows, selected, brake.max_backoff)
        level = state[..., LEVEL]
        candidates = torch.where((state[..., WAIT] == 0).unsqueeze(-1), candidates, PAD_BLOCK)
        quota = torch.where(level > 0, torch.where(quota > 0, (quota >> level).clamp(min=1), 0), quota)
        if counters is not None:
            counters[BACKED_OFF] += (level > 0).sum(dtype=torch.int32)
    if brake.runs is not None:
        runs = _update_runs(brake.runs, slots, selected, valid, brake.positions)
        scratch = runs.shape[-1] - 1
        listed = candidates != PAD_BLOCK
        run = runs.gather(-1, torch.where(listed, candidates, scratch).long()) & RUN_LIMIT
        lasting = run >= brake.min_selected
        if counters is not None:
            counters[WITHHELD] += (listed & ~lasting).sum(dtype=torch.int32)
        candidates = torch.where(lasting, candidates, PAD_BLOCK)
    return candidates, quota, state


def note_recall(brake: RecallBrake, slots: torch.Tensor, state: torch.Tensor | None, before: torch.Tensor,
                after: torch.Tensor, moved: torch.Tensor) -> None:
    """Remember this step's recall (resident rows before and after it [B, Hkv, R], moved [B, Hkv]) for the next
    step's judgement."""
    if state is None:
        return
    state[..., MOVED] = moved
    state[..., FRESH:] = (after != before).to(torch.int32)
    brake.state.index_copy_(0, slots, state)


def _judge(state: torch.Tensor, rows: torch.Tensor, selected: torch.Tensor, max_backoff: int) -> torch.Tensor:
    """The rows' state [B, Hkv, STATE_WORDS + R] after judging the last step's recalls (module docstring)."""
    state = state.clone()
    level, wait, moved = state[..., LEVEL], state[..., WAIT], state[..., MOVED]
    hits = ((state[..., FRESH:] != 0) & contains(rows, selected)).sum(dim=-1)
    judged = moved > 0
    paid = 2 * hits >= moved
    level = torch.where(judged, torch.where(paid, 0, (level + 1).clamp(max=max_backoff)), level)
    state[..., LEVEL] = level
    state[..., WAIT] = torch.where(judged, (1 << level) - 1, (wait - 1).clamp(min=0))
    state[..., MOVED] = 0
    return state


def _update_runs(runs: torch.Tensor, slots: torch.Tensor, selected: torch.Tensor, valid: torch.Tensor,
                 positions: torch.Tensor) -> torch.Tensor:
    """Each selected block's run of consecutive selections, updated in `runs`; -> the rows' runs [B, Hkv, NB + 1]."""
    rows = runs[slots]
    scratch = rows.shape[-1] - 1
    index = torch.where(valid, selected, scratch).long()
    position = positions.view(-1, 1, 1).to(torch.int32)
    word = rows.gather(-1, index)
    run = torch.where((word >> RUN_BITS) == position - 1, ((word & RUN_LIMIT) + 1).clamp(max=RUN_LIMIT), 1)
    rows.scatter_(-1, index, (position << RUN_BITS) | run)
    runs.index_copy_(0, slots, rows)
    return rows
