"""The decode step's static buffers: allocated once, at the largest batch, and reused by every step.

What the stages of one layer hand to each other (digest -> select -> split ->
device part / CPU part -> merge -> recall) lives here at fixed addresses, so a
step allocates nothing and a captured CUDA graph replays it. A layer's front
(select, split) runs one layer ahead of its attention, so two layers are in
flight at once: the selection buffers come in two sets, by layer parity.

    set[p] (p = layer % 2)   scores [Bmax, Hkv, NB] fp32, selected [Bmax, Hkv, K], counts [Bmax, Hkv],
                             cpu_blocks [Bmax, Hkv, C] (logical), device list [Bmax, Hkv, R + W] and counts,
                             quest's page list [Bmax, Hkv, K + 1] and counts; with the CPU split, the
                             zero-copy list [Bmax, Hkv, C] and counts, the whole CPU list's counts, and
                             the zero-copy share's (o [Bmax, Hq, D], lse [Bmax, Hq]) fp32
    device part              o [Bmax, Hq, D] (cache dtype), lse [Bmax, Hq] fp32 (natural log)
    counters                 [layers, NUM_COUNTERS] int32, read once per step (kernels/step_counters.py)
    workspace                the Triton decode's split partials (flat fp32), shared by every launch

A step of B rows uses views of the first B rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from scout_sglang.kernels.step_counters import NUM_COUNTERS


@dataclass
class SelectionSet:
    """One parity's selection and lists ([Bmax, ...] each)."""

    scores: torch.Tensor  # [Bmax, Hkv, NB] fp32, -inf past each request's full blocks
    selected: torch.Tensor  # [Bmax, Hkv, K] int32 logical blocks, best first, PAD past counts
    counts: torch.Tensor  # [Bmax, Hkv] int32
    cpu_blocks: torch.Tensor  # [Bmax, Hkv, C] int32 logical blocks of the CPU list, PAD past its counts
    device_pages: torch.Tensor  # [Bmax, Hkv, R + W] int32 the device part's pages, PAD past device_counts
    device_counts: torch.Tensor  # [Bmax, Hkv] int32
    quest_pages: torch.Tensor  # [Bmax, Hkv, K + 1] int32 quest's pages (selection, then the tail)
    quest_counts: torch.Tensor  # [Bmax, Hkv] int32
    # the CPU split (None without it): what the device reads from the host store itself, and its result
    zero_copy_pages: torch.Tensor | None = None  # [Bmax, Hkv, C] int32 host pages, PAD past zero_copy_counts
    zero_copy_counts: torch.Tensor | None = None  # [Bmax, Hkv] int32
    listed_counts: torch.Tensor | None = None  # [Bmax, Hkv] int32 entries of cpu_blocks: both shares
    zero_copy_o: torch.Tensor | None = None  # [Bmax, Hq, D] fp32
    zero_copy_lse: torch.Tensor | None = None  # [Bmax, Hq] fp32 natural log


class StepBuffers:
    """Static buffers of the decode step (module docstring)."""

    def __init__(self, *, max_batch: int, num_layers: int, num_qo_heads: int, num_kv_heads: int, head_dim: int,
                 max_blocks: int, topk: int, cpu_capacity: int, device_width: int, dtype: torch.dtype, device,
                 cpu_split: bool = False):
        def zeros(*shape, dtype=torch.int32):
            return torch.zeros(max_batch, *shape, dtype=dtype, device=device)

        self.sets = [SelectionSet(scores=zeros(num_kv_heads, max_blocks, dtype=torch.float32),
                                  selected=zeros(num_kv_heads, topk), counts=zeros(num_kv_heads),
                                  cpu_blocks=zeros(num_kv_heads, cpu_capacity),
                                  device_pages=zeros(num_kv_heads, device_width), device_counts=zeros(num_kv_heads),
                                  quest_pages=zeros(num_kv_heads, topk + 1), quest_counts=zeros(num_kv_heads))
                     for _ in range(2)]
        if cpu_split:
            for chosen in self.sets:
                chosen.zero_copy_pages, chosen.zero_copy_counts = zeros(num_kv_heads, cpu_capacity), zeros(num_kv_heads)
                chosen.listed_counts = zeros(num_kv_heads)
                chosen.zero_copy_o = zeros(num_qo_heads, head_dim, dtype=torch.float32)
                chosen.zero_copy_lse = zeros(num_qo_heads, dtype=torch.float32)
        self.o = zeros(num_qo_heads, head_dim, dtype=dtype)  # [Bmax, Hq, D]
        self.lse = zeros(num_qo_heads, dtype=torch.float32)  # [Bmax, Hq] natural log
        self.counters = torch.zeros(num_layers, NUM_COUNTERS, dtype=torch.int32, device=device)
        self.workspace: torch.Tensor | None = None  # the Triton decode's split partials (the engine sizes it)
        self.estimate_workspace: torch.Tensor | None = None  # the Triton estimate's split partials (likewise)

    def of(self, layer: int) -> SelectionSet:
        return self.sets[layer % 2]
