"""RecallBudget: the cap on recall traffic per decode step, and its split over the rows of a step.

Recall copies blocks host -> device over the link (PCIe) that the step's other
traffic also uses. The cap is `recall_bytes_per_step` when the configuration
gives one, else recall_link_gbps x recall_link_share x the step time, measured
here as the interval between consecutive plans: an exponential average, where
an interval counts at most OUTLIER times the current estimate (a server idling
between steps moves it by a fifth at most, a slower regime raises it step by
step), an interval next to a step that decodes nothing (a CUDA graph's
capture) does not count, and STEP_S_GUESS stands until a step has been seen.

The cap is shared equally by the offloaded layers, and each layer's share by
the rows of the step, (request, KV head) in order: every row gets the floor,
and the remainder goes to a window of rows that moves by one step each step,
so no row is left out for long. A row's cap is also at most its buffer's
recall quota. The caps are computed on the host with the rest of the plan
(step_plan.py); the recall stage reads them as its per-row quota, so recall
bytes per step never exceed the cap.
"""

from __future__ import annotations

import time

import torch

STEP_S_GUESS = 0.02  # the first steps' cap assumes a 20 ms step
OUTLIER = 2.0  # an interval counts at most this many times the current estimate
SMOOTHING = 0.2  # weight of the newest interval


class RecallBudget:
    """The recall cap of an engine.

    Parameters
    ----------
    config : ScoutConfig (recall_bytes_per_step, recall_link_gbps, recall_link_share, recall_quota)
    block_bytes : bytes of one (block, KV head) of K and V
    num_layers : the layers that recall (the offloaded layers)
    clock : seconds, monotonic (tests pass their own)
    """

    def __init__(self, config, *, block_bytes: int, num_layers: int, clock=time.perf_counter):
        self.fixed_bytes = config.recall_bytes_per_step
        self.link_bytes_per_s = config.recall_link_gbps * 1e9 * config.recall_link_share
        self.quota = config.recall_quota
        self.block_bytes, self.num_layers = block_bytes, num_layers
        self.clock = clock
        self.step_s = STEP_S_GUESS
        self._last: float | None = None

    def observe_step(self, decodes: bool = True) -> None:
        """A step is being planned: the interval since the last one updates the measured step time. A step that
        decodes nothing (a CUDA graph's capture, padding rows only) is not a step time and breaks the chain."""
        now = self.clock()
        if not decodes:
            self._last = None
            return
        if self._last is not None and now > self._last:
            interval = min(now - self._last, OUTLIER * self.step_s)
            self.step_s += SMOOTHING * (interval - self.step_s)
        self._last = now

    def bytes_per_step(self) -> int:
        """The cap in bytes, before rounding to whole blocks."""
        if self.fixed_bytes is not None:
            return self.fixed_bytes
        return int(self.link_bytes_per_s * self.step_s)

    def blocks_per_layer(self) -> int:
        """(block, KV head) pairs one layer may recall in a step."""
        if self.num_layers == 0 or self.block_bytes == 0:
            return 0
        return self.bytes_per_step() // (self.block_bytes * self.num_layers)

    def cap_bytes(self, rows: int) -> int:
        """What a step of `rows` (request, KV head) rows may recall at most: whole blocks in every layer, and no
        more than the rows' quotas."""
        return min(self.blocks_per_layer(), rows * self.quota) * self.block_bytes * self.num_layers

    def row_caps(self, batch_size: int, num_kv_heads: int, step: int) -> torch.Tensor:
        """[B, Hkv] int32: the blocks each row may recall in step number `step` (module docstring)."""
        return row_caps(self.blocks_per_layer(), batch_size, num_kv_heads, step, self.quota)


def row_caps(blocks: int, batch_size: int, num_kv_heads: int, step: int, quota: int) -> torch.Tensor:
    """[B, Hkv] int32 split of `blocks` over the rows: the floor each, one more for the `remainder` rows from
    (step mod rows) on, wrapping; at most `quota` each."""
    rows = batch_size * num_kv_heads
    if rows == 0:
        return torch.zeros(batch_size, num_kv_heads, dtype=torch.int32)
    base, remainder = divmod(blocks, rows)
    if base >= quota:  # (also keeps a huge cap from overflowing int32)
        return torch.full((batch_size, num_kv_heads), quota, dtype=torch.int32)
    turn = (torch.arange(rows) - step) % rows < remainder
    return (base + turn.to(torch.int32)).clamp(max=quota).to(torch.int32).view(batch_size, num_kv_heads)
