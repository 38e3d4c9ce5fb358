"""Decision trace: what each decode step decided, per layer, request and KV head.

Off by default: the engine then never builds a record (one `is None` test per
layer). When on (`CoAttentionEngine(trace=True)`), every `attend` appends one
LayerDecision, in logical block indices of the request, so that a test can
check each decision and recompute the output from its own copy of the K/V
(tests/oracle). Nothing in the decode path reads the trace.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from scout_sglang.layout import PAD_BLOCK


@dataclass
class LayerDecision:
    """One layer of one decode step. Lists are indexed [b][h] (request in the batch, KV head)."""

    step: int
    layer: int
    rids: list[int]
    num_tokens: list[int]  # tokens of each request after the step's token is appended
    offloaded: bool  # the layer's K/V lives in the host store (False: device-full layer)
    selected: list | None  # [B][Hkv] selected blocks, best first; None: no selection in this layer
    device_blocks: list  # [B][Hkv] blocks the device part attended; the partial tail block included
    cpu_blocks: list  # [B][Hkv] blocks the CPU part attended; empty lists when there is no CPU part
    resident_start: list | None = None  # [B][Hkv][R] resident slots at the step's start, after window admission
    resident: list | None = None  # [B][Hkv][R] resident slots when the device part ran (PAD_BLOCK: empty)
    resident_after: list | None = None  # [B][Hkv][R] after this layer's recall
    zero_copy_blocks: list | None = None  # [B][Hkv] the CPU split's device share, read from the host store
    cpu_cap: list | None = None  # [B] the CPU split's cap of each row (None: no split)
    quotas: list | None = None  # [B] resident-first: each request's resident columns with a page (None: fixed buffer)
    exact: list | None = None  # [B] resident-first: the request selects every block (its blocks fit its quota)
    exact_path: bool = False  # resident-first: every row exact and settled, the step selected nothing (the exact path)

    @property
    def recalled(self) -> list:
        """[B][Hkv] blocks that recall brought in after the attention of this layer."""
        if self.resident is None or self.resident_after is None:
            return [[[] for _ in heads] for heads in self.device_blocks]
        return [[[j for j in after if j != PAD_BLOCK and j not in set(now)] for now, after in zip(rows_now, rows_after)]
                for rows_now, rows_after in zip(self.resident, self.resident_after)]


@dataclass
class DecisionTrace:
    """Every LayerDecision of an engine since it was created, in order."""

    decisions: list[LayerDecision] = field(default_factory=list)
    resident_start: dict = field(default_factory=dict)  # layer -> [B][Hkv][R] after the step's window admission

    def begin_step(self) -> None:
        self.resident_start = {}

    def record(self, decision: LayerDecision) -> None:
        decision.resident_start = self.resident_start.get(decision.layer)
        self.decisions.append(decision)


def block_lists(blocks: torch.Tensor | None, counts: torch.Tensor | None, batch_size: int, num_kv_heads: int) -> list:
    """[B, Hkv, C] blocks with [B, Hkv] counts -> [B][Hkv] lists (empty lists when blocks is None)."""
    if blocks is None:
        return [[[] for _ in range(num_kv_heads)] for _ in range(batch_size)]
    blocks, counts = blocks[:batch_size].cpu(), counts[:batch_size].cpu()
    return [[blocks[b, h, : int(counts[b, h])].tolist() for h in range(num_kv_heads)] for b in range(batch_size)]


def full_layer_decision(engine, layer: int, selects: bool) -> LayerDecision:
    """A device-full layer of the engine's current step: every block, or quest's selection plus the partial tail."""
    batch = engine._batch
    heads, size = engine.shape.num_kv_heads, engine.block_size
    counts_after = [s.num_tokens + 1 for s in batch]
    selected = None
    if not selects:
        device = [[list(range(-(-n // size)))] * heads for n in counts_after]
    else:
        chosen = engine.buffers.of(layer)
        selected = block_lists(chosen.selected, chosen.counts, len(batch), heads)
        device = [[blocks + ([n // size] if n % size else []) for blocks in rows]
                  for rows, n in zip(selected, counts_after)]
    return LayerDecision(engine._step_index, layer, [s.rid for s in batch], counts_after, offloaded=False,
                         selected=selected, device_blocks=device, cpu_blocks=block_lists(None, None, len(batch), heads))


def offloaded_layer_decision(engine, layer: int) -> LayerDecision:
    """An offloaded layer of the engine's current step, after its front: resident blocks (the selected ones for
    infinigen) then the window, in the order the device part lists them; the CPU lists in the CPU modes."""
    batch = engine._batch
    heads, mode = engine.shape.num_kv_heads, engine.config.mode
    counts_after = [s.num_tokens + 1 for s in batch]
    resident = engine._resident_rows(layer) if mode in ("scout", "infinigen") else None
    chosen, exact_path = engine.buffers.of(layer), engine.plan.exact_step
    selected = None if exact_path else block_lists(chosen.selected, chosen.counts, len(batch), heads)
    device = []
    for b, n in enumerate(counts_after):
        window = engine.offloaded.window_blocks(n)
        rows = []
        for h in range(heads):
            held = [] if resident is None else [j for j in resident[b][h] if j != PAD_BLOCK]
            if mode == "infinigen":
                held = [j for j in held if j in set(selected[b][h])]
            rows.append(held + window)
        device.append(rows)
    cpu, zero_copy, caps = block_lists(None, None, len(batch), heads), None, None
    if engine.handoff is not None and not exact_path:
        cpu = block_lists(chosen.cpu_blocks, engine.handoff.counts[layer], len(batch), heads)
    if chosen.listed_counts is not None and not exact_path:  # the CPU split: the device's share, as host pages
        pages = block_lists(chosen.zero_copy_pages, chosen.zero_copy_counts, len(batch), heads)
        table = engine.plan.host_table[: len(batch)].tolist()  # [B][NB] host page of each block
        block_of = [{page: block for block, page in enumerate(row)} for row in table]
        zero_copy = [[[block_of[b].get(page, PAD_BLOCK) for page in head] for head in row] for b, row in enumerate(pages)]
        caps = engine.plan.cpu_cap[: len(batch), engine.offloaded_layers.index(layer)].tolist()
    pool = engine.pool
    return LayerDecision(engine._step_index, layer, [s.rid for s in batch], counts_after, offloaded=True,
                         selected=selected, device_blocks=device, cpu_blocks=cpu, resident=resident,
                         zero_copy_blocks=zero_copy, cpu_cap=caps,
                         quotas=None if pool is None else [pool.quota(s.rid) for s in batch],
                         exact=None if pool is None else [pool.exact[s.rid] for s in batch], exact_path=exact_path,
                         resident_after=resident if exact_path else None)
