"""CoAttentionEngine: one decode step of co-attention, planned once, run layer by layer.

The framework-agnostic core of co-attention. A driver (the SGLang adapter, or
the HF reference decoder) calls, per decode step:

    begin_step(rids)                             # plan: host work, once
    for layer i:  [predict(i + 1, q_pred)]       # from layer i's normalized input
                  o = attend(i, q, k_new, v_new)
    telemetry = end_step()                       # one read of the step's counters

`begin_step` allocates pages and builds a StepPlan (step_plan.py): every
per-request quantity as a device tensor. `predict` and `attend` are then a
fixed sequence of tensor ops per layer whatever the batch size and head
count, with no device value read back and no Python loop over requests,
heads or blocks: selection, the resident first fill and recall (recall.py),
the split into device and CPU blocks, the CPU hand-off (cpu_handoff.py), the
device sparse decode and the merge. Counters accumulate in a device tensor
read once in `end_step`, which also copies the blocks completed in the step
to the host store (they stay in the local window until then, so nothing reads
them from the host before).

Every decision of a step (window, forced blocks, selection, CPU set) uses the
counts after the step's token is appended, so the device part and the CPU part
are always disjoint and together cover the selection.
"""

from __future__ import annotations

import os
from contextlib import nullcontext
from dataclasses import dataclass
from typing import NamedTuple

import torch

from scout_sglang import kernels
from scout_sglang.config import ScoutConfig
from scout_sglang.core import recall
from scout_sglang.core.cpu_handoff import CpuHandoff
from scout_sglang.core.shape import ModelShape
from scout_sglang.core.step_plan import PlanTransfer, StepPlan, bucket, pad_where, plan_fields, ring_index
from scout_sglang.core.stores import DeviceFullStore, OffloadedStore, ceil_div
from scout_sglang.core.telemetry import StepTelemetry
from scout_sglang.core.timing import SectionTimer
from scout_sglang.core.trace import DecisionTrace, LayerDecision, full_layer_decision, offloaded_layer_decision
from scout_sglang.env import DEFAULT_CPU_DEADLINE_MS
from scout_sglang.layout import PAD_BLOCK

RESIDENT_MODES = ("scout", "infinigen")
CPU_MODES = ("scout", "hgca")
# Columns of the per-layer counters (a device tensor [layers, 6], read once per step).
SELECTED, CPU, DROPPED, RECALLED, CHANGED, COMPARED = range(6)
COUNTER_NAMES = ("selected_blocks", "cpu_blocks", "dropped_blocks", "recalled_blocks", "changed_blocks",
                 "compared_blocks")


@dataclass
class RequestState:
    rid: int
    slot: int
    num_tokens: int = 0  # tokens stored in every layer
    steps: int = 0  # decode steps completed


class FrontResult(NamedTuple):
    """What an offloaded layer decides before its attention (device tensors; None where the mode has none)."""

    selected: torch.Tensor  # [B, Hkv, K] int32 logical blocks, best first, PAD past counts
    counts: torch.Tensor  # [B, Hkv] int32
    scores: torch.Tensor  # [B, Hkv, NB] fp32
    fill_moves: object  # recall.RecallMoves of the first fill
    recall_moves: object  # recall.RecallMoves of infinigen's recall
    cpu_blocks: torch.Tensor | None  # [B, Hkv, C] int32 logical, PAD past cpu_counts
    cpu_counts: torch.Tensor | None  # [B, Hkv] int32
    cpu_pages: torch.Tensor | None  # [B, Hkv, C] int32 host pages of cpu_blocks


@dataclass
class LayerSelection:
    """Selection of one offloaded layer in the current step (device tensors)."""

    selected: torch.Tensor  # [B, Hkv, K] int32 logical blocks, best first, PAD past counts
    counts: torch.Tensor  # [B, Hkv] int32
    scores: torch.Tensor  # [B, Hkv, NB] fp32
    cpu_blocks: torch.Tensor | None = None  # [B, Hkv, C] logical, PAD past cpu_counts
    cpu_counts: torch.Tensor | None = None
    launched: bool = False  # a CPU part is in flight for this layer
    query: torch.Tensor | None = None  # [B, Hq, D] the query it was made with (predicted or real)


class CoAttentionEngine:
    """Block state, selection, CPU attention, merge and recall for every layer.

    Parameters
    ----------
    config : ScoutConfig
    shape : ModelShape
    device, dtype : where and in which dtype the device-side KV lives
    max_requests : concurrent requests (request slots)
    max_tokens_per_request : sizes the per-request page tables (and the stores, unless total_pages is given)
    total_pages : overrides the store sizing with a page count for all requests together
    cpu_pool : a CpuAttentionPool to use; None creates one when the mode needs it
    track_changes : compute the block change rate (costs a few ops per layer)
    trace : record every decision in `self.trace` (a DecisionTrace) for tests; off costs nothing
    fixed_widths : page tables of a step at their full capacity (what a CUDA graph captures) instead of
        the next power of two of the batch's longest request; default: on for CUDA
    cpu_deadline_ms : how long after its submit a layer waits for its CPU part before computing it itself
        (exactly, from the host store: cpu_handoff.py); the server passes SCOUT_CPU_DEADLINE_MS
    cpu_faults : a cpu_worker.faults.FaultPlan for the pool this engine creates (tests only; None: no faults)
    cpu_health : when the CPU worker is given work (cpu_health.CpuWorkerHealth; None: one of its defaults)
    cpu_set : the CPUs the pool this engine creates may use (one rank's share of the host: cpu_worker/cpu_sets.py);
        None: the CPUs of this process. Without SCOUT_CPU_GROUPS, one group per `cpu_threads_per_group` of them
    host_store : a stores.BorrowedHostStore to keep the full blocks of the offloaded layers in (its owner assigns
        each block's page: assign_host_pages); None: the engine allocates its own host store
    """

    def __init__(self, config: ScoutConfig, shape: ModelShape, *, device="cpu", dtype=torch.bfloat16,
                 max_requests: int = 8, max_tokens_per_request: int = 4096, total_pages: int | None = None,
                 cpu_pool=None, track_changes: bool = True, trace: bool = False, fixed_widths: bool | None = None,
                 cpu_deadline_ms: float = DEFAULT_CPU_DEADLINE_MS, cpu_faults=None, cpu_health=None,
                 cpu_set=None, host_store=None):
        if config.mode in RESIDENT_MODES + CPU_MODES and config.local_blocks < 1:
            raise ValueError(f"mode {config.mode!r} needs local_blocks >= 1 (the block that fills in a step stays local)")
        if any(layer >= shape.num_layers for layer in config.dense_layers):
            raise ValueError(f"dense_layers {config.dense_layers} out of range for {shape.num_layers} layers")
        self.config, self.shape = config, shape
        self.device, self.dtype = torch.device(device), dtype
        self.block_size = config.block_size
        self.track_changes = track_changes
        self.fixed_widths = self.device.type == "cuda" if fixed_widths is None else fixed_widths
        offloaded = config.mode in RESIDENT_MODES + CPU_MODES
        self.offloaded_layers = tuple(l for l in range(shape.num_layers) if offloaded and l not in config.dense_layers)
        self.full_layers = tuple(l for l in range(shape.num_layers) if l not in self.offloaded_layers)
        self.max_requests = max_requests
        self.max_blocks = ceil_div(max_tokens_per_request, self.block_size) + 1
        pages = total_pages or max_requests * ceil_div(max_tokens_per_request, self.block_size)
        self.full_store = DeviceFullStore(self.full_layers, num_pages=pages, max_requests=max_requests,
                                          max_blocks=self.max_blocks, shape=shape, block_size=self.block_size,
                                          dtype=dtype, device=self.device, with_digests=config.mode == "quest")
        self.offloaded = OffloadedStore(
            self.offloaded_layers, num_host_pages=pages, max_requests=max_requests, max_blocks=self.max_blocks,
            shape=shape, block_size=self.block_size, sink_blocks=config.sink_blocks, local_blocks=config.local_blocks,
            resident_blocks=config.resident_capacity if config.mode in RESIDENT_MODES else 0, dtype=dtype,
            device=self.device, borrowed=host_store,
        )  # fmt: skip
        self.requests: dict[int, RequestState] = {}
        self._free_slots = list(range(max_requests - 1, -1, -1))
        self._own_pool = cpu_pool is None and config.mode in CPU_MODES
        self.cpu_pool = self._make_pool(cpu_faults, cpu_set) if self._own_pool else cpu_pool
        # The device part's kernel reads its block counts on the device (Triton on CUDA): FlashInfer's
        # decode wrapper plans from host-side lengths, which per-layer, per-head lists would need each layer.
        self._decode_impl = config.kernel_impl or (None if self.device.type == "cpu" else "triton")
        self._handoff = None
        if config.mode in CPU_MODES:
            self._handoff = CpuHandoff(self.offloaded_layers, max_batch=max_requests, num_qo_heads=shape.num_qo_heads,
                                       num_kv_heads=shape.num_kv_heads, head_dim=shape.head_dim,
                                       capacity=config.cpu_capacity, dtype=dtype, pool=self.cpu_pool,
                                       device=self.device, deadline_s=cpu_deadline_ms / 1e3, impl=self._decode_impl,
                                       health=cpu_health)
        self._offloaded_index = {layer: i for i, layer in enumerate(self.offloaded_layers)}
        self._selects = [l for l in self.offloaded_layers] + (
            [l for l in self.full_layers if l not in config.dense_layers] if config.mode == "quest" else [])
        self._recall_capacity = config.recall_capacity(shape.num_kv_heads, max_requests)
        self._counters = torch.zeros(shape.num_layers, len(COUNTER_NAMES), dtype=torch.int64, device=self.device)
        self._previous = {layer: torch.full((max_requests, shape.num_kv_heads, config.topk_blocks), PAD_BLOCK,
                                            dtype=torch.int32, device=self.device)
                          for layer in (self._selects if track_changes else ())}
        self._plan_transfer = PlanTransfer(self.device)
        self.plan: StepPlan | None = None
        self._batch: list[RequestState] = []
        self._selection: dict[int, LayerSelection] = {}
        self.telemetry: StepTelemetry | None = None
        self._step_index = 0
        # Recall copies run on a side stream on CUDA; layer i awaits its event
        # only when it next attends (next step for scout, this step for infinigen).
        self._recall_stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        self._recall_events: dict[int, object] = {}
        self._timer = SectionTimer(self.device)
        self.trace: DecisionTrace | None = DecisionTrace() if trace else None

    def _make_pool(self, faults, cpu_set):
        from scout_sglang.cpu_worker import CpuAttentionPool

        cpus = len(cpu_set) if cpu_set is not None else len(os.sched_getaffinity(0))
        groups = self.config.cpu_groups or max(1, cpus // self.config.cpu_threads_per_group)
        return CpuAttentionPool(groups, self.config.cpu_threads_per_group,
                                pin_cores="auto" if self.config.cpu_pin_cores else None, cpu_set=cpu_set,
                                impl=self.config.cpu_impl, faults=faults)

    def close(self) -> None:
        if self._handoff is not None:
            self._handoff.discard()
        if self._own_pool and self.cpu_pool is not None:
            self.cpu_pool.shutdown()
            self.cpu_pool = None

    # -- requests ------------------------------------------------------------
    def add_request(self, rid: int) -> None:
        if rid in self.requests:
            raise ValueError(f"request {rid} is already admitted")
        if not self._free_slots:
            raise RuntimeError(f"no free request slot ({len(self.requests)} requests admitted)")
        state = RequestState(rid, self._free_slots.pop())
        if self.offloaded_layers:
            self.offloaded.admit(rid, state.slot)
        for previous in self._previous.values():
            previous[state.slot] = PAD_BLOCK
        self.requests[rid] = state

    def assign_host_pages(self, rid: int, first_block: int, pages: list[int]) -> None:
        """With a borrowed host store: full blocks first_block, first_block + 1, ... of `rid` live in `pages`
        (before the write that fills them: prefill for a prompt's blocks, begin_step for the block a step
        completes)."""
        self.offloaded.assign_host_pages(rid, self.requests[rid].slot, first_block, pages)

    def release_request(self, rid: int) -> None:
        """Free every host and device page of a request (finish, abort, retraction)."""
        state = self.requests.pop(rid, None)
        if state is None:
            return
        self.full_store.release(rid, state.slot)
        if self.offloaded_layers:
            self.offloaded.release(rid, state.slot)
        self._free_slots.append(state.slot)

    def cpu_worker_state(self) -> dict | None:
        """The CPU worker's health (cpu_health.py): whether decoding is device-only now, how often it went
        device-only, the pool's thread groups replaced after a thread ended, and the CPUs its threads may run on
        (read back from the OS); None without a CPU part."""
        if self._handoff is None:
            return None
        health = self._handoff.health
        thread_cpus = getattr(self.cpu_pool, "thread_cpus", None)
        return {"device_only": health.device_only, "device_only_switches": health.switches,
                "replaced_thread_groups": getattr(self.cpu_pool, "replaced_groups", 0),
                "threads": len(getattr(self.cpu_pool, "threads", ())),
                "cpus": thread_cpus() if thread_cpus is not None else []}

    def usage(self) -> dict:
        """Pages in use, for leak checks and metrics."""
        return {
            "requests": len(self.requests),
            "device_full_pages": self.full_store.pages.num_used,
            "host_pages": self.offloaded.host_pages.num_used,
            "device_window_pages": self.offloaded.device_pages.num_used,
        }

    def memory(self) -> dict:
        """Bytes the stores allocate and use, on the device and in host memory, and the tokens held."""
        full, off = self.full_store, self.offloaded
        full_kv = _nbytes(full.k, full.v)
        full_digests = _nbytes(full.digest_min, full.digest_max)
        digests, window = _nbytes(off.digest_min, off.digest_max), _nbytes(off.dev_k, off.dev_v)
        host_page = sum(t[0].numel() * t.element_size() for t in (*off.host_k.values(), *off.host_v.values()))
        # Each store has one scratch page beyond its allocator's pages (stores.py): allocated, never used.
        full_used = full.pages.num_used / (full.pages.num_pages + 1)
        digest_row = sum(t[0].numel() * t.element_size() for t in (*off.digest_min.values(), *off.digest_max.values()))
        window_used = off.device_pages.num_used / (off.device_pages.num_pages + 1)
        return {
            "tokens": sum(state.num_tokens for state in self.requests.values()),
            "device_bytes_allocated": full_kv + full_digests + digests + window,
            "device_bytes_used": round((full_kv + full_digests) * full_used + off.host_pages.num_used * digest_row
                                       + window * window_used),
            "host_bytes_allocated": off.host_bytes_owned(),  # a borrowed store's bytes are its owner's
            "host_bytes_used": off.host_pages.num_used * host_page,  # borrowed or not: the pages holding blocks
        }

    # -- prefill (host work per chunk, outside the decode step) ------------------
    def prefill(self, rid: int, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store a prompt's K/V [N, Hkv, D] (post-RoPE) for one layer; the last layer commits N."""
        self.extend(rid, layer, 0, k, v)

    def extend(self, rid: int, layer: int, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store tokens [start, start + N) of a request for one layer (a prefill chunk); the last layer
        commits the new count. Blocks that become full go to the host store (with their digests), and the
        window keeps the sink, the last full blocks and the tail."""
        state = self.requests[rid]
        if start != state.num_tokens:
            raise ValueError(f"request {rid}: extend at token {start}, but {state.num_tokens} tokens are stored")
        n, end, size = k.shape[0], start + k.shape[0], self.block_size
        if n == 0:  # an empty chunk (a request admitted with no token yet) stores nothing
            return
        if layer in self.full_layers:
            self.full_store.ensure_tokens(rid, state.slot, end)
            self.full_store.write(layer, [rid] * n, list(range(start, end)), k, v)
            self.full_store.update_digest(layer, self.full_store.page_table(rid)[start // size: end // size])
        else:
            store, first, last = self.offloaded, start // size, end // size
            store.ensure_full_blocks(rid, state.slot, last)
            if last > first:  # blocks first..last-1 become full; block `first` may begin in the window tail
                head = start - first * size
                k_full = k[: last * size - start].to(self.device, self.dtype)
                v_full = v[: last * size - start].to(self.device, self.dtype)
                if head:
                    page = store.window_page(rid, first)
                    k_full = torch.cat([store.dev_k[layer][page, :, :head].transpose(0, 1), k_full])
                    v_full = torch.cat([store.dev_v[layer][page, :, :head].transpose(0, 1), v_full])
                shape = (last - first, size, *k.shape[1:])
                blocks, k_blocks = list(range(first, last)), k_full.reshape(shape).transpose(1, 2)
                store.copy_blocks_to_host(layer, rid, blocks, k_blocks, v_full.reshape(shape).transpose(1, 2))
                store.write_digests(layer, rid, blocks, k_blocks)
            window = set(store.window_blocks(end))
            keep = [p - start for p in range(start, end) if p // size in window]
            store.write_window(layer, [rid] * len(keep), [start + i for i in keep], k[keep].to(self.device),
                               v[keep].to(self.device))
        if layer == self.shape.num_layers - 1:
            state.num_tokens = end

    def gather(self, rid: int, layer: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Tokens [0, end) of a stored request for one layer, as K, V [end, Hkv, D] on the device
        (full blocks from wherever they live, the unfinished block from the window)."""
        size, heads = self.block_size, (self.shape.num_kv_heads, self.shape.head_dim)
        if end > self.requests[rid].num_tokens:
            raise ValueError(f"request {rid}: {end} tokens asked, {self.requests[rid].num_tokens} stored")
        if layer in self.full_layers:
            pages = torch.tensor(self.full_store.page_table(rid)[: ceil_div(end, size)], device=self.device)
            k, v = self.full_store.k[layer][pages], self.full_store.v[layer][pages]
            return (k.transpose(1, 2).reshape(-1, *heads)[:end], v.transpose(1, 2).reshape(-1, *heads)[:end])
        store, num_full, tail = self.offloaded, end // size, end % size
        host = torch.tensor(store.host_pages.table(rid)[:num_full], dtype=torch.long)
        k = store.host_k[layer][host].to(self.device, non_blocking=True).transpose(1, 2).reshape(-1, *heads)
        v = store.host_v[layer][host].to(self.device, non_blocking=True).transpose(1, 2).reshape(-1, *heads)
        if tail:
            page = store.window_page(rid, num_full)
            k = torch.cat([k, store.dev_k[layer][page, :, :tail].transpose(0, 1)])
            v = torch.cat([v, store.dev_v[layer][page, :, :tail].transpose(0, 1)])
        return k, v

    # -- one decode step: plan ---------------------------------------------------
    def begin_step(self, rids: list[int]) -> StepPlan:
        """Plan the step of these requests (pages, metadata, window admission); returns the plan."""
        if self._handoff is not None:
            self._handoff.discard()  # a step that ended early left CPU parts in flight
        self._batch = [self.requests[rid] for rid in rids]
        self._selection = {}
        for state in self._batch:
            after = state.num_tokens + 1
            if self.full_layers:
                self.full_store.ensure_tokens(state.rid, state.slot, after)
            if self.offloaded_layers:
                self.offloaded.ensure_full_blocks(state.rid, state.slot, after // self.block_size)
        self.plan = self._build_plan()
        if self.config.mode in RESIDENT_MODES and self.offloaded.resident_blocks:
            self._admit_leaving_blocks()
        self.telemetry = StepTelemetry(self._step_index, len(rids))
        if self.trace is not None:
            self.trace.begin_step({layer: self.offloaded.resident_map[layer][self.plan.slots]
                                   for layer in self.offloaded_layers})
        return self.plan

    def _build_plan(self) -> StepPlan:
        batch = self._batch
        fields, filled = plan_fields(
            [s.slot for s in batch], [s.num_tokens + 1 for s in batch], [s.steps + 1 for s in batch],
            config=self.config, num_kv_heads=self.shape.num_kv_heads, width=self._width,
            offloaded=self.offloaded if self.offloaded_layers else None,
            full_store=self.full_store if self.full_layers else None, offloaded_layers=self.offloaded_layers)
        on_device = self._plan_transfer({name: t.to(torch.int32) for name, t in fields.items()})
        plan = StepPlan(batch_size=len(batch), rids=[s.rid for s in batch], filled=filled, **on_device)
        plan.slots = plan.slots.long()
        if plan.recall_due is not None:
            plan.recall_due = plan.recall_due != 0
        return plan

    def _width(self, needed: int) -> int:
        return self.max_blocks if self.fixed_widths else bucket(needed, self.max_blocks)

    def _admit_leaving_blocks(self) -> None:
        """The block that leaves the local window in this step enters the resident buffer
        before anything is selected, so it is never attended on the CPU in that step.
        Its ring page is still intact: the ring is overwritten one block later."""
        store, size, local, sink = self.offloaded, self.block_size, self.config.local_blocks, self.config.sink_blocks
        leaving = {b: (s.num_tokens + 1) // size - 1 - local for b, s in enumerate(self._batch)
                   if (s.num_tokens + 1) % size == 0 and (s.num_tokens + 1) // size - 1 - local >= sink}
        if not leaving:
            return
        slots = torch.tensor([self._batch[b].slot for b in leaving], dtype=torch.long)
        blocks = torch.tensor(list(leaving.values()), dtype=torch.long)
        pages = store.window_page_table[slots].gather(1, ring_index(blocks, sink, local).view(-1, 1)).view(-1)
        slots_dev, blocks_dev = slots.to(self.device), blocks.to(self.device)
        pages_dev, resident_pages = pages.long().to(self.device), store.resident_page_table[slots].to(self.device)
        for layer in self.offloaded_layers:
            new_rows, moves = recall.admit_leaving(store.resident_map[layer][slots_dev], blocks_dev, pages_dev,
                                                   resident_pages, dst_scratch=store.device_scratch_page)
            recall.copy_moves(moves, store.dev_k[layer], store.dev_v[layer], store.dev_k[layer], store.dev_v[layer],
                              dst_scratch=store.device_scratch_page)
            store.resident_map[layer].index_copy_(0, slots_dev, new_rows)

    # -- one decode step: run, per layer -------------------------------------------
    def wants_prediction(self, layer: int) -> bool:
        """Whether attend(layer) can use a query predicted one layer ahead."""
        return (self.config.layer_ahead and self.config.mode in RESIDENT_MODES and layer >= 1
                and layer in self.offloaded_layers)

    def predict(self, layer: int, q_pred: torch.Tensor) -> None:
        """Layer-ahead work of `layer` from its predicted query [B, Hq, D] (Algorithm 1).

        scout: select, split off the resident blocks, launch the CPU attention.
        infinigen: select and recall the selected blocks into the resident buffer.
        """
        if not self.wants_prediction(layer) or self.plan is None:  # no step planned: nothing to predict for
            return
        self._selection[layer] = self._prepare(layer, q_pred)
        if self.config.mode == "scout":
            self.telemetry.layer(layer).cpu_launched_ahead = True

    def attend(self, layer: int, q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor) -> torch.Tensor:
        """Append the step's K/V [B, Hkv, D] to `layer` and return its attention output [B, Hq, D]."""
        self._await_recall(layer)
        if layer in self.full_layers:
            with self._timer.section(self.telemetry, "device_attention"):
                o, selected, counts = self._run_full(layer, q, k_new, v_new)
            if self.trace is not None:
                self._trace_full(layer, selected, counts)
            return o
        selection = self._selection.get(layer)
        if selection is None:  # nothing launched ahead: same-layer path with the real query
            selection = self._selection[layer] = self._prepare(layer, q)
            self._await_recall(layer)
        with self._timer.section(self.telemetry, "device_attention"):
            o, lse = self._run_device_part(layer, q, k_new, v_new, selection.selected)
        traced = self._trace_offloaded(layer, selection) if self.trace is not None else None
        if selection.launched:
            cpu = self._handoff.collect(layer)  # a failed or late task: computed here, exactly
            self.telemetry.layer(layer).cpu_wait_s += cpu.waited_s
            self.telemetry.add_time("cpu_wait", cpu.waited_s)
            if cpu.fallback is not None:
                self.telemetry.count_fallback(cpu.fallback)
            with self._timer.section(self.telemetry, "merge"):
                o = self._run_merge(o, lse, cpu.o, cpu.lse)
        if self.config.mode == "scout" and self.config.recall_policy != "off" and self.offloaded.resident_blocks:
            self._issue_copies(layer, self._run_recall(layer, selection.selected, selection.counts, selection.scores,
                                                       selection.cpu_blocks, selection.cpu_counts))
        if traced is not None:
            traced.resident_after = self._resident_rows(layer) if self.config.mode in RESIDENT_MODES else None
            self.trace.record(traced)
        return o

    def end_step(self) -> StepTelemetry:
        """Commit the step: every request of the batch now holds one more token."""
        self._copy_filled_blocks()
        counters = self._counters.tolist()  # the step's one read of device values
        self._counters.zero_()
        budget = self.config.topk_blocks * self.shape.num_kv_heads * len(self._batch)
        for layer in self._selects:
            stats = self.telemetry.layer(layer)
            for name, value in zip(COUNTER_NAMES, counters[layer]):
                setattr(stats, name, getattr(stats, name) + value)
            stats.budget_blocks += budget
            if layer in self.offloaded_layers:
                stats.recall_bytes += stats.recalled_blocks * self.offloaded.block_bytes_per_head(layer)
        for state in self._batch:
            state.num_tokens += 1
            state.steps += 1
        self._step_index += 1
        self._timer.resolve(self.telemetry)
        telemetry, self.telemetry = self.telemetry, None
        self._batch, self._selection, self.plan = [], {}, None
        return telemetry
    def _copy_filled_blocks(self) -> None:
        """Host copies of the blocks completed in this step, every offloaded layer (once per step)."""
        if not self.plan.filled or not self.offloaded_layers:
            return
        store = self.offloaded
        pages = torch.tensor([page for page, _, _ in self.plan.filled], dtype=torch.long, device=self.device)
        rows = torch.tensor([row for _, row, _ in self.plan.filled], dtype=torch.long)
        for side_dev, side_host in ((store.dev_k, store.host_k), (store.dev_v, store.host_v)):
            staged = torch.stack([side_dev[layer].index_select(0, pages) for layer in self.offloaded_layers]).cpu()
            for i, layer in enumerate(self.offloaded_layers):
                side_host[layer].index_copy_(0, rows, staged[i])

    # -- internals: eager orchestration around the per-layer programs ------------------
    def _prepare(self, layer, q) -> LayerSelection:
        """Select; first fill (resident modes); infinigen's recall; the CPU launch (CPU modes)."""
        with self._timer.section(self.telemetry, "select"):
            front = self._run_front(layer, q)
        self._issue_copies(layer, front.fill_moves)
        self._issue_copies(layer, front.recall_moves)
        selection = LayerSelection(front.selected, front.counts, front.scores, front.cpu_blocks, front.cpu_counts,
                                   query=q)
        if self.config.mode in CPU_MODES:
            store = self.offloaded
            self._handoff.submit(layer, q, front.cpu_pages, front.cpu_counts, store.host_k[layer], store.host_v[layer],
                                 scale=self.shape.softmax_scale, seq_ids=self.plan.rids)
            selection.launched = True
        return selection

    def _issue_copies(self, layer, moves) -> None:
        """The layer's recall copies, host (or window) -> resident pages: one launch per store, a side stream on CUDA."""
        if moves is None:
            return
        store = self.offloaded
        with self._recall_copies():
            recall.copy_moves(moves, store.host_k[layer], store.host_v[layer], store.dev_k[layer], store.dev_v[layer],
                              dst_scratch=store.device_scratch_page)
        self._recall_issued(layer)

    # -- the per-layer programs: tensor ops only, no host reads, no Python loop over the batch ------------
    # These are what torch.compile(fullgraph=True) traces and a CUDA graph captures; the hand-off to the
    # CPU pool and the recall copies run between them (tests/test_layer_programs.py).
    def _run_full(self, layer, q, k_new, v_new):
        """Device-full layer: append, then dense attention (quest: its selection plus the tail) -> (o, selected, counts)."""
        plan, store, size = self.plan, self.full_store, self.block_size
        batch_size, num_kv_heads = plan.batch_size, self.shape.num_kv_heads
        store_k, store_v = store.k[layer], store.v[layer]
        store_k[plan.full_append_page, :, plan.append_offset] = k_new.to(store_k.dtype)
        store_v[plan.full_append_page, :, plan.append_offset] = v_new.to(store_v.dtype)
        if layer in store.digest_min:  # quest: the page the token completes gets its digest, others go to scratch
            kernels.update_digests(store_k, plan.full_append_page, store.digest_min[layer], store.digest_max[layer],
                                   rows=plan.fill_full_row, impl=self.config.kernel_impl)
        selected = counts = None
        if self.config.mode == "quest" and layer not in self.config.dense_layers:
            selected, counts, _ = self._select(layer, q, store.digest_min[layer], store.digest_max[layer],
                                               plan.full_table)
            pages = plan.full_table.gather(1, selected.clamp(min=0).view(batch_size, -1).long()).view_as(selected)
            last_column = plan.full_table.shape[1] - 1
            tail_page = plan.full_table.gather(1, plan.num_full.clamp(max=last_column).view(-1, 1).long())
            pages = torch.cat([pages, tail_page.view(batch_size, 1, 1).expand(batch_size, num_kv_heads, 1)], dim=2)
            has_tail = (plan.num_tokens % size != 0).view(batch_size, 1, 1).expand(batch_size, num_kv_heads, 1)
            table, list_counts = compact_lists(pages, torch.cat([selected != PAD_BLOCK, has_tail], dim=2))
        else:
            table, list_counts = plan.full_lists, plan.full_counts
        o, _ = kernels.sparse_decode(q.contiguous(), store_k, store_v, table, list_counts,
                                     scale=self.shape.softmax_scale, last_block_len=plan.last_len_heads,
                                     impl=self._decode_impl,
                                     validate=False)
        return o, selected, counts

    def _select(self, layer, q, digest_min, digest_max, table):
        """Scores and top-k over the full blocks of each request (forced sink/local) -> (selected, counts, scores)."""
        plan = self.plan
        scores = kernels.score_blocks(q.to(digest_min.dtype).contiguous(), digest_min, digest_max, table,
                                      plan.num_full, impl=self.config.kernel_impl, validate=False)
        selected, counts = kernels.select_topk(scores, plan.num_full, topk=self.config.topk_blocks,
                                               num_sink_blocks=self.config.sink_blocks,
                                               num_local_blocks=self.config.local_blocks)
        self._counters[layer, SELECTED] += counts.sum()
        if self.track_changes:
            self._count_changes(layer, selected)
        return selected, counts, scores

    def _run_front(self, layer, q) -> FrontResult:
        """An offloaded layer before its attention: selection, the resident first fill and infinigen's recall
        (decided, map updated; copies returned), and the CPU lists of the CPU modes."""
        store, plan, mode = self.offloaded, self.plan, self.config.mode
        selected, counts, scores = self._select(layer, q, store.digest_min[layer], store.digest_max[layer],
                                                plan.host_table)
        fill_moves = recall_moves = cpu_blocks = cpu_counts = cpu_pages = None
        if mode in RESIDENT_MODES and store.resident_blocks:
            ready = store.resident_ready[layer]
            pending = ~ready[plan.slots] & (plan.num_full > 0)  # first time this (request, layer) has a selection
            candidates = torch.where(pending.view(-1, 1, 1), self._unforced(selected), PAD_BLOCK)
            fill_moves = self._bring_in(layer, candidates, selected, None)
            ready.index_copy_(0, plan.slots, ready[plan.slots] | pending)
        if mode == "infinigen" and store.resident_blocks:
            candidates = self._unforced(selected)
            recall_moves = self._bring_in(layer, candidates, selected, scores)
            self._counters[layer, RECALLED] += recall_moves.moved.sum()
            resident = store.resident_map[layer][plan.slots]
            self._counters[layer, DROPPED] += ((candidates != PAD_BLOCK) & ~recall.contains(candidates, resident)).sum()
        if mode in CPU_MODES:
            cpu_blocks, cpu_counts, cpu_pages = self._split(layer, selected, counts)
        return FrontResult(selected, counts, scores, fill_moves, recall_moves, cpu_blocks, cpu_counts, cpu_pages)

    def _unforced(self, selected):
        """Selected blocks that the window does not hold, PAD elsewhere."""
        return torch.where(recall.contains(selected, self.plan.forced_heads), PAD_BLOCK, selected)

    def _bring_in(self, layer, candidates, selected, scores) -> recall.RecallMoves:
        """Decide which candidates enter the resident buffer, update its map; the copies are returned."""
        store, plan = self.offloaded, self.plan
        decision = recall.bring_in(store.resident_map[layer][plan.slots], candidates, selected, scores,
                                   self._recall_capacity)
        store.resident_map[layer].index_copy_(0, plan.slots, decision.resident)
        return recall.compact_moves(decision, candidates, plan.host_table, plan.resident_pages,
                                    capacity=self._recall_capacity, src_scratch=store.host_scratch_page,
                                    dst_scratch=store.device_scratch_page)

    def _split(self, layer, selected, counts):
        """CPU lists: selected blocks the device does not hold -> (logical blocks, counts, host pages)."""
        plan, store = self.plan, self.offloaded
        batch_size, num_kv_heads = plan.batch_size, self.shape.num_kv_heads
        held = plan.forced_heads
        if self.config.mode in RESIDENT_MODES:
            held = torch.cat([held, store.resident_map[layer][plan.slots]], dim=2)
        held_counts = torch.full((batch_size, num_kv_heads), held.shape[2], dtype=torch.int32, device=self.device)
        split = kernels.split_selection(selected, counts, held, held_counts,
                                        capacity=self.config.cpu_capacity)
        self._counters[layer, CPU] += split.counts.sum()
        self._counters[layer, DROPPED] += split.dropped.sum()
        pages = plan.host_table.gather(1, split.blocks.clamp(min=0).view(batch_size, -1).long()).view_as(split.blocks)
        return split.blocks, split.counts, pad_where(split.blocks != PAD_BLOCK, pages)

    def _run_device_part(self, layer, q, k_new, v_new, selected):
        """An offloaded layer's device part: append the token (and the digest of the block it completes; its host
        copy waits for end_step, the block stays in the local window until long after), then attention over the
        resident blocks (infinigen: the selected ones) and the window -> (o, lse)."""
        plan, store, num_kv_heads = self.plan, self.offloaded, self.shape.num_kv_heads
        dev_k, dev_v = store.dev_k[layer], store.dev_v[layer]
        dev_k[plan.window_append_page, :, plan.append_offset] = k_new.to(dev_k.dtype)
        dev_v[plan.window_append_page, :, plan.append_offset] = v_new.to(dev_v.dtype)
        kernels.update_digests(dev_k, plan.window_append_page, store.digest_min[layer], store.digest_max[layer],
                               rows=plan.fill_host_row, impl=self.config.kernel_impl)
        window = plan.window_pages.unsqueeze(1).expand(-1, num_kv_heads, -1)
        pages, valid = window, window != PAD_BLOCK
        if self.config.mode in RESIDENT_MODES:
            resident = store.resident_map[layer][plan.slots]
            held = resident != PAD_BLOCK
            if self.config.mode == "infinigen":
                held = held & recall.contains(resident, selected)
            resident_pages = plan.resident_pages.unsqueeze(1).expand(-1, num_kv_heads, -1)
            pages, valid = torch.cat([resident_pages, window], dim=2), torch.cat([held, valid], dim=2)
        table, counts = compact_lists(pages, valid)
        return kernels.sparse_decode(q.contiguous(), dev_k, dev_v, table, counts, scale=self.shape.softmax_scale,
                                     last_block_len=plan.last_len_heads, impl=self._decode_impl, validate=False)

    def _run_merge(self, o, lse, cpu_o, cpu_lse):
        merged, _ = kernels.merge_attention_states(o, lse, cpu_o, cpu_lse, impl=self.config.kernel_impl)
        return merged

    def _run_recall(self, layer, selected, counts, scores, cpu_blocks, cpu_counts) -> recall.RecallMoves:
        """Periodic recall after layer's attention: CPU-list blocks replace the least useful resident ones."""
        if self.config.recall_policy == "interval":
            due = self.plan.recall_due[self._offloaded_index[layer]]
        else:  # adaptive: the CPU's share of the selection passed beta
            num_selected = counts.sum(dim=1)
            share = cpu_counts.sum(dim=1).double() / num_selected.clamp(min=1).double()
            due = (num_selected > 0) & (share > self.config.recall_beta)
        candidates = torch.where(due.view(-1, 1, 1), cpu_blocks, PAD_BLOCK)
        moves = self._bring_in(layer, candidates, selected, scores)
        self._counters[layer, RECALLED] += moves.moved.sum()
        return moves

    def _count_changes(self, layer, selected):
        """Selected blocks that the previous step of the same request did not select."""
        previous = self._previous[layer]
        before = previous[self.plan.slots]
        now = selected != PAD_BLOCK
        compared = now & (before != PAD_BLOCK).any(dim=-1, keepdim=True)
        self._counters[layer, COMPARED] += compared.sum()
        self._counters[layer, CHANGED] += (compared & ~recall.contains(selected, before)).sum()
        previous.index_copy_(0, self.plan.slots, torch.where(now.any(dim=-1, keepdim=True), selected, before))

    # -- internals: streams -------------------------------------------------------

    def _recall_copies(self):
        """Context for recall copies: a side stream on CUDA (after the work already
        queued, which may still read the slots being replaced), a plain copy on CPU."""
        if self._recall_stream is None:
            return nullcontext()
        self._recall_stream.wait_stream(torch.cuda.current_stream(self.device))
        return torch.cuda.stream(self._recall_stream)

    def _recall_issued(self, layer) -> None:
        if self._recall_stream is not None:
            event = torch.cuda.Event()
            event.record(self._recall_stream)
            self._recall_events[layer] = event

    def _await_recall(self, layer) -> None:
        event = self._recall_events.pop(layer, None)
        if event is not None:
            torch.cuda.current_stream(self.device).wait_event(event)

    # -- decision trace (tests only; never built when self.trace is None) -------
    def _resident_rows(self, layer) -> list:
        return self.offloaded.resident_map[layer][self.plan.slots].tolist()

    def _trace_full(self, layer, selected, counts):
        self.trace.record(full_layer_decision(self, layer, selected, counts))

    def _trace_offloaded(self, layer, selection) -> LayerDecision:
        return offloaded_layer_decision(self, layer, selection)


def compact_lists(pages: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Move the valid entries of pages [B, Hkv, X] to the front, in order -> (table [B, Hkv, X + 1] int32, counts [B, Hkv]).

    The last column collects the invalid entries (page ids or PAD, past every count, so never read)."""
    width = pages.shape[-1]
    position = torch.where(valid, torch.cumsum(valid.to(torch.int32), dim=-1) - 1, width)
    table = torch.full((*pages.shape[:-1], width + 1), PAD_BLOCK, dtype=torch.int32, device=pages.device)
    table.scatter_(-1, position.long(), pages.to(torch.int32))
    return table, valid.sum(dim=-1, dtype=torch.int32)


def _nbytes(*stores: dict) -> int:
    return sum(t.numel() * t.element_size() for store in stores for t in store.values())
