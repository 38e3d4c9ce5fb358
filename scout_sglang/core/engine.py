"""CoAttentionEngine: one decode step of co-attention, layer by layer.

The framework-agnostic core of DESIGN.md section 2. A driver (the SGLang
adapter, or the HF reference decoder) calls, per decode step:

    begin_step(rids)
    for layer i:  [predict(i + 1, q_pred)]   # from layer i's normalized input
                  o = attend(i, q, k_new, v_new)
    telemetry = end_step()

Every decision of a step (window, forced blocks, selection, CPU set) uses the
counts after the step's token is appended, so the device part and the CPU part
are always disjoint and together cover the selection.
"""

from __future__ import annotations

import os
import time
from contextlib import nullcontext
from dataclasses import dataclass, field

import torch

from scout_sglang import kernels
from scout_sglang.config import ScoutConfig
from scout_sglang.core import attention_lists, recall
from scout_sglang.core.shape import ModelShape
from scout_sglang.core.stores import DeviceFullStore, OffloadedStore, ceil_div
from scout_sglang.core.telemetry import StepTelemetry
from scout_sglang.core.timing import SectionTimer
from scout_sglang.core.trace import DecisionTrace, LayerDecision, block_lists
from scout_sglang.layout import PAD_BLOCK

RESIDENT_MODES = ("scout", "infinigen")
CPU_MODES = ("scout", "hgca")


@dataclass
class RequestState:
    rid: int
    slot: int
    num_tokens: int = 0  # tokens stored in every layer
    steps: int = 0  # decode steps completed
    previous_selection: dict = field(default_factory=dict)  # layer -> [per head set], for the change rate


@dataclass
class LayerSelection:
    """Selection of one offloaded layer in the current step (device tensors)."""

    selected: torch.Tensor  # [B, Hkv, K] int32 logical blocks, best first
    counts: torch.Tensor  # [B, Hkv] int32
    scores: torch.Tensor  # [B, Hkv, NBmax] fp32
    cpu_blocks: torch.Tensor | None = None  # [B, Hkv, C] logical, PAD past cpu_counts
    cpu_counts: torch.Tensor | None = None
    handle: object = None  # CPU pool handle
    out_o: torch.Tensor | None = None
    out_lse: torch.Tensor | None = None


class CoAttentionEngine:
    """Block state, selection, CPU attention, merge and recall for every layer.

    Parameters
    ----------
    config : ScoutConfig
    shape : ModelShape
    device, dtype : where and in which dtype the device-side KV lives
    max_requests : concurrent requests
    max_tokens_per_request : sizes the stores (host pages, device-full pages)
    total_pages : overrides that sizing with a page count for all requests together
    cpu_pool : a CpuAttentionPool to use; None creates one when the mode needs it
    track_changes : compute the block change rate (costs a little per step)
    trace : record every decision in `self.trace` (a DecisionTrace) for tests; off costs nothing
    """

    def __init__(self, config: ScoutConfig, shape: ModelShape, *, device="cpu", dtype=torch.bfloat16,
                 max_requests: int = 8, max_tokens_per_request: int = 4096, total_pages: int | None = None,
                 cpu_pool=None, track_changes: bool = True, trace: bool = False):
        if config.mode in RESIDENT_MODES + CPU_MODES and config.local_blocks < 1:
            raise ValueError(f"mode {config.mode!r} needs local_blocks >= 1 (the block that fills in a step stays local)")
        if any(layer >= shape.num_layers for layer in config.dense_layers):
            raise ValueError(f"dense_layers {config.dense_layers} out of range for {shape.num_layers} layers")
        self.config, self.shape = config, shape
        self.device, self.dtype = torch.device(device), dtype
        self.block_size = config.block_size
        self.track_changes = track_changes
        offloaded = config.mode in RESIDENT_MODES + CPU_MODES
        self.offloaded_layers = tuple(l for l in range(shape.num_layers) if offloaded and l not in config.dense_layers)
        self.full_layers = tuple(l for l in range(shape.num_layers) if l not in self.offloaded_layers)
        pages = total_pages or max_requests * ceil_div(max_tokens_per_request, self.block_size)
        self.full_store = DeviceFullStore(self.full_layers, num_pages=pages, shape=shape, block_size=self.block_size,
                                          dtype=dtype, device=self.device, with_digests=config.mode == "quest")
        self.offloaded = OffloadedStore(
            self.offloaded_layers, num_host_pages=pages, max_requests=max_requests, shape=shape,
            block_size=self.block_size, sink_blocks=config.sink_blocks, local_blocks=config.local_blocks,
            resident_blocks=config.resident_capacity if config.mode in RESIDENT_MODES else 0, dtype=dtype, device=self.device,
        )  # fmt: skip
        self.requests: dict[int, RequestState] = {}
        self._free_slots = list(range(max_requests - 1, -1, -1))
        self._own_pool = cpu_pool is None and config.mode in CPU_MODES
        self.cpu_pool = self._make_pool() if self._own_pool else cpu_pool
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

    def _make_pool(self):
        from scout_sglang.cpu_worker import CpuAttentionPool

        groups = self.config.cpu_groups or max(1, len(os.sched_getaffinity(0)) // self.config.cpu_threads_per_group)
        return CpuAttentionPool(groups, self.config.cpu_threads_per_group,
                                pin_cores="auto" if self.config.cpu_pin_cores else None, impl=self.config.cpu_impl)

    def close(self) -> None:
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
        self.requests[rid] = state

    def release_request(self, rid: int) -> None:
        """Free every host and device page of a request (finish, abort, retraction)."""
        state = self.requests.pop(rid, None)
        if state is None:
            return
        self.full_store.release(rid)
        if self.offloaded_layers:
            self.offloaded.release(rid)
        self._free_slots.append(state.slot)

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
        digests, window, host = _nbytes(off.digest_min, off.digest_max), _nbytes(off.dev_k, off.dev_v), _nbytes(off.host_k, off.host_v)
        full_used = full.pages.num_used / max(1, full.pages.num_pages)
        host_used = off.host_pages.num_used / max(1, off.host_pages.num_pages)
        window_used = off.device_pages.num_used / max(1, off.device_pages.num_pages)
        return {
            "tokens": sum(state.num_tokens for state in self.requests.values()),
            "device_bytes_allocated": full_kv + full_digests + digests + window,
            "device_bytes_used": round((full_kv + full_digests) * full_used + digests * host_used + window * window_used),
            "host_bytes_allocated": host,
            "host_bytes_used": round(host * host_used),
        }

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
        if layer in self.full_layers:
            self.full_store.ensure_tokens(rid, end)
            self.full_store.write(layer, [rid] * n, list(range(start, end)), k, v)
            self.full_store.update_digest(layer, self.full_store.page_table(rid)[start // size: end // size])
        else:
            store, first, last = self.offloaded, start // size, end // size
            store.ensure_full_blocks(rid, last)
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

    # -- one decode step -----------------------------------------------------
    def begin_step(self, rids: list[int]) -> None:
        self._batch = [self.requests[rid] for rid in rids]
        self._selection = {}
        for state in self._batch:
            after = state.num_tokens + 1
            if self.full_layers:
                self.full_store.ensure_tokens(state.rid, after)
            if self.offloaded_layers:
                self.offloaded.ensure_full_blocks(state.rid, after // self.block_size)
            self._admit_leaving_block(state, after)
        self.telemetry = StepTelemetry(self._step_index, len(rids))
        if self.trace is not None:
            slots = torch.tensor([s.slot for s in self._batch], dtype=torch.long)
            self.trace.begin_step({layer: self.offloaded.resident_map[layer][slots] for layer in self.offloaded_layers})

    def wants_prediction(self, layer: int) -> bool:
        """Whether attend(layer) can use a query predicted one layer ahead."""
        return (self.config.layer_ahead and self.config.mode in RESIDENT_MODES and layer >= 1
                and layer in self.offloaded_layers)

    def predict(self, layer: int, q_pred: torch.Tensor) -> None:
        """Layer-ahead work of `layer` from its predicted query [B, Hq, D] (Algorithm 1).

        scout: select, split off the resident blocks, launch the CPU attention.
        infinigen: select and recall the selected blocks into the resident buffer.
        """
        if not self.wants_prediction(layer):
            return
        selection = self._select(layer, q_pred)
        if selection is None:
            return
        self._fill_resident(layer, selection)
        if self.config.mode == "scout":
            self._launch_cpu(layer, q_pred, selection)
            self.telemetry.layer(layer).cpu_launched_ahead = True
        else:
            self._infinigen_recall(layer, selection)
        self._selection[layer] = selection

    def attend(self, layer: int, q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor) -> torch.Tensor:
        """Append the step's K/V [B, Hkv, D] to `layer` and return its attention output [B, Hq, D]."""
        self._await_recall(layer)
        self._append(layer, k_new, v_new)
        if layer in self.full_layers:
            o, selected, counts = self._attend_full(layer, q)
            if self.trace is not None:
                self._trace_full(layer, selected, counts)
            return o
        mode = self.config.mode
        selection = self._selection.get(layer)
        if selection is None:  # nothing launched ahead: same-layer path with the real query
            selection = self._select(layer, q)
            if selection is not None and mode in RESIDENT_MODES:
                self._fill_resident(layer, selection)
            if selection is not None and mode in CPU_MODES:
                self._launch_cpu(layer, q, selection)
            if selection is not None and mode == "infinigen":
                self._infinigen_recall(layer, selection)
            self._selection[layer] = selection
        only = None
        if mode == "infinigen" and selection is not None:
            only = self._selected_sets(selection)
        o, lse = self._device_part(layer, q, only=only, use_resident=mode in RESIDENT_MODES)
        traced = self._trace_offloaded(layer, selection, only) if self.trace is not None else None
        if selection is not None and selection.handle is not None:
            o = self._merge_cpu(layer, o, lse, selection)
        if mode == "scout" and selection is not None:
            self._maybe_recall(layer, selection)
        if traced is not None:
            traced.resident_after = self._resident_rows(layer) if mode in RESIDENT_MODES else None
            self.trace.record(traced)
        return o

    def end_step(self) -> StepTelemetry:
        """Commit the step: every request of the batch now holds one more token."""
        for state in self._batch:
            state.num_tokens += 1
            state.steps += 1
        self._step_index += 1
        self._timer.resolve(self.telemetry)
        telemetry, self.telemetry = self.telemetry, None
        self._batch, self._selection = [], {}
        return telemetry

    # -- internals -----------------------------------------------------------
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

    def _admit_leaving_block(self, state, after):
        """The block that leaves the local window in this step enters the resident buffer
        before anything is selected, so it is never attended on the CPU in that step.
        Its ring page is still intact: the ring is overwritten one block later."""
        leaving = after // self.block_size - 1 - self.config.local_blocks
        if after % self.block_size or self.config.mode not in RESIDENT_MODES or leaving < self.config.sink_blocks:
            return
        for layer in self.offloaded_layers:
            recall.admit_leaving_block(self.offloaded, layer, state.rid, state.slot, leaving)

    def _after_counts(self) -> list[int]:
        return [s.num_tokens + 1 for s in self._batch]

    def _append(self, layer, k_new, v_new):
        rids = [s.rid for s in self._batch]
        positions = [s.num_tokens for s in self._batch]
        filled = [b for b, p in enumerate(positions) if p % self.block_size == self.block_size - 1]
        if layer in self.full_layers:
            self.full_store.write(layer, rids, positions, k_new, v_new)
            pages = [self.full_store.page_table(rids[b])[positions[b] // self.block_size] for b in filled]
            self.full_store.update_digest(layer, pages)
            return
        store = self.offloaded
        store.write_window(layer, rids, positions, k_new, v_new)
        for b in filled:  # the block this token completes: a host copy and its digest
            block = positions[b] // self.block_size
            page = store.window_page(rids[b], block)
            k_block, v_block = store.dev_k[layer][page : page + 1], store.dev_v[layer][page : page + 1]
            store.copy_blocks_to_host(layer, rids[b], [block], k_block, v_block)
            store.write_digests(layer, rids[b], [block], k_block)

    def _attend_full(self, layer, q):
        """Attention over a device-full layer -> (o, quest selection or None, its counts or None)."""
        rids = [s.rid for s in self._batch]
        counts_after = self._after_counts()
        selected = counts = None
        if self.config.mode == "quest" and layer not in self.config.dense_layers:
            store = self.full_store
            tables = [store.page_table(r) for r in rids]
            num_full = [n // self.block_size for n in counts_after]
            selected, counts, _ = self._topk(layer, q, store.digest_min[layer], store.digest_max[layer], tables, num_full)
            self._record_selection(layer, selected, counts)
            table, n_listed, last = attention_lists.quest_lists(store, rids, counts_after, selected, counts, device=self.device)
        else:
            table, n_listed, last = attention_lists.full_store_lists(
                self.full_store, rids, counts_after, num_kv_heads=self.shape.num_kv_heads, device=self.device)
        with self._timer.section(self.telemetry, "device_attention"):
            o, _ = kernels.sparse_decode(q.contiguous(), self.full_store.k[layer], self.full_store.v[layer], table,
                                         n_listed, scale=self.shape.softmax_scale, last_block_len=last,
                                         impl=self.config.kernel_impl)
        return o, selected, counts

    def _topk(self, layer, q, digest_min, digest_max, tables, num_full):
        """Scores and top-k over the full blocks of each request (forced sink/local)."""
        max_blocks = max(num_full) if num_full else 0
        table = torch.full((len(tables), max(max_blocks, 1)), PAD_BLOCK, dtype=torch.int32)
        for b, (pages, n) in enumerate(zip(tables, num_full)):
            table[b, :n] = torch.tensor(pages[:n], dtype=torch.int32)
        table, lengths = table.to(self.device), torch.tensor(num_full, dtype=torch.int32, device=self.device)
        with self._timer.section(self.telemetry, "select"):
            scores = kernels.score_blocks(q.to(digest_min.dtype).contiguous(), digest_min, digest_max, table, lengths,
                                          impl=self.config.kernel_impl)
            selected, counts = kernels.select_topk(scores, lengths, topk=self.config.topk_blocks,
                                                   num_sink_blocks=self.config.sink_blocks,
                                                   num_local_blocks=self.config.local_blocks)
        stats = self.telemetry.layer(layer)
        stats.selected_blocks += int(counts.sum())
        stats.budget_blocks += self.config.topk_blocks * self.shape.num_kv_heads * len(tables)
        return selected, counts, scores

    def _select(self, layer, q) -> LayerSelection | None:
        store = self.offloaded
        rids = [s.rid for s in self._batch]
        num_full = [n // self.block_size for n in self._after_counts()]
        if max(num_full, default=0) == 0:
            return None
        tables = [store.host_pages.table(r) for r in rids]
        selected, counts, scores = self._topk(layer, q, store.digest_min[layer], store.digest_max[layer], tables, num_full)
        self._record_selection(layer, selected, counts)
        return LayerSelection(selected, counts, scores)

    def _record_selection(self, layer, selected, counts):
        if not self.track_changes:
            return
        stats = self.telemetry.layer(layer)
        selected, counts = selected.cpu(), counts.cpu()
        for b, state in enumerate(self._batch):
            now = [set(selected[b, h, : counts[b, h]].tolist()) for h in range(selected.shape[1])]
            before = state.previous_selection.get(layer)
            if before is not None:
                stats.changed_blocks += sum(len(n - p) for n, p in zip(now, before))
                stats.compared_blocks += sum(len(n) for n in now)
            state.previous_selection[layer] = now

    def _selected_sets(self, selection):
        selected, counts = selection.selected.cpu(), selection.counts.cpu()
        return [[set(selected[b, h, : counts[b, h]].tolist()) for h in range(selected.shape[1])]
                for b in range(selected.shape[0])]

    def _forced_and_resident(self, layer, use_resident):
        """[B, Hkv, F + R] logical blocks the device holds (window's full blocks + resident)."""
        store, counts_after = self.offloaded, self._after_counts()
        forced = [store.forced_blocks(n) for n in counts_after]
        width = max(1, max(len(f) for f in forced))
        table = torch.full((len(self._batch), self.shape.num_kv_heads, width), PAD_BLOCK, dtype=torch.int32)
        for b, blocks in enumerate(forced):
            if blocks:
                table[b, :, : len(blocks)] = torch.tensor(blocks, dtype=torch.int32)
        if use_resident:
            slots = torch.tensor([s.slot for s in self._batch])
            table = torch.cat([table, store.resident_map[layer][slots]], dim=2)
        return table.to(self.device)

    def _fill_resident(self, layer, selection):
        """Fill a resident buffer the first time its (request, layer) is selected."""
        store = self.offloaded
        ready = store.resident_ready[layer]  # host tensor: no device read unless a fill is due
        pending = [b for b, s in enumerate(self._batch) if not bool(ready[s.slot])]
        if not pending:
            return
        selected, counts = selection.selected.cpu(), selection.counts.cpu()
        # A request without a full block yet has no selection: its first fill waits for one.
        pending = [b for b in pending if int(counts[b].sum()) > 0]
        sets = self._selected_sets(selection)
        for b in pending:
            state = self._batch[b]
            forced = set(store.forced_blocks(state.num_tokens + 1))
            for h in range(self.shape.num_kv_heads):
                order = [j for j in selected[b, h, : counts[b, h]].tolist() if j not in forced]
                recall.bring_in(store, layer, state.rid, state.slot, h, order, sets[b][h], None)
            ready[state.slot] = True

    def _split(self, layer, selection, use_resident):
        held = self._forced_and_resident(layer, use_resident)
        held_counts = torch.full(held.shape[:2], held.shape[2], dtype=torch.int32, device=self.device)
        split = kernels.split_selection(selection.selected, selection.counts, held, held_counts,
                                        capacity=self.config.cpu_capacity)
        selection.cpu_blocks, selection.cpu_counts = split.blocks, split.counts
        stats = self.telemetry.layer(layer)
        stats.cpu_blocks += int(split.counts.sum())
        stats.dropped_blocks += int(split.dropped.sum())
        return split

    def _launch_cpu(self, layer, q, selection):
        from scout_sglang.cpu_worker import alloc_output_buffers

        split = self._split(layer, selection, use_resident=self.config.mode in RESIDENT_MODES)
        store = self.offloaded
        blocks, counts = split.blocks.cpu(), split.counts.cpu()
        pages = torch.full_like(blocks, PAD_BLOCK)
        for b, state in enumerate(self._batch):
            table = store.host_pages.table(state.rid)
            for h in range(blocks.shape[1]):
                n = int(counts[b, h])
                pages[b, h, :n] = torch.tensor([table[j] for j in blocks[b, h, :n].tolist()], dtype=torch.int32)
        q_host = q.to("cpu", self.dtype).contiguous()
        out_o, out_lse = alloc_output_buffers(len(self._batch), self.shape.num_qo_heads, self.shape.head_dim, torch.float32)
        selection.handle = self.cpu_pool.submit(
            q_host, store.host_k[layer], store.host_v[layer], pages.contiguous(), counts.contiguous(),
            scale=self.shape.softmax_scale, out_o=out_o, out_lse=out_lse,
            seq_ids=[s.rid for s in self._batch], layer=layer,
        )  # fmt: skip
        selection.out_o, selection.out_lse = out_o, out_lse

    def _device_part(self, layer, q, *, only, use_resident):
        rids = [s.rid for s in self._batch]
        slots = [s.slot for s in self._batch]
        table, counts, last = attention_lists.offloaded_lists(
            self.offloaded, layer, rids, slots, self._after_counts(), num_kv_heads=self.shape.num_kv_heads,
            device=self.device, only_blocks=only, use_resident=use_resident)
        with self._timer.section(self.telemetry, "device_attention"):
            o, lse = kernels.sparse_decode(q.contiguous(), self.offloaded.dev_k[layer], self.offloaded.dev_v[layer],
                                           table, counts, scale=self.shape.softmax_scale, last_block_len=last,
                                           impl=self.config.kernel_impl)
        return o, lse

    def _merge_cpu(self, layer, o, lse, selection):
        start = time.perf_counter()
        self.cpu_pool.wait(selection.handle)
        waited = time.perf_counter() - start
        self.telemetry.layer(layer).cpu_wait_s += waited
        self.telemetry.add_time("cpu_wait", waited)
        with self._timer.section(self.telemetry, "merge"):
            cpu_o = selection.out_o.to(self.device, non_blocking=True)
            cpu_lse = selection.out_lse.to(self.device, non_blocking=True)
            merged, _ = kernels.merge_attention_states(o, lse, cpu_o, cpu_lse, impl=self.config.kernel_impl)
        return merged

    def _infinigen_recall(self, layer, selection):
        """Bring every selected non-resident block into the resident buffer now."""
        store = self.offloaded
        sets = self._selected_sets(selection)
        selected, counts = selection.selected.cpu(), selection.counts.cpu()
        scores = selection.scores.cpu()
        stats = self.telemetry.layer(layer)
        start = time.perf_counter()  # host time to issue the copies (they run on a side stream on CUDA)
        with self._recall_copies():
            for b, state in enumerate(self._batch):
                forced = set(store.forced_blocks(state.num_tokens + 1))
                for h in range(self.shape.num_kv_heads):
                    order = [j for j in selected[b, h, : counts[b, h]].tolist() if j not in forced]
                    moved = recall.bring_in(store, layer, state.rid, state.slot, h, order, sets[b][h], scores[b, h])
                    stats.recalled_blocks += moved
                    stats.recall_bytes += moved * store.block_bytes_per_head(layer)
                    resident = set(store.resident_map[layer][state.slot, h].tolist())
                    stats.dropped_blocks += sum(1 for j in order if j not in resident)
        self._recall_issued(layer)
        self.telemetry.add_time("recall", time.perf_counter() - start)

    def _recall_due(self, layer, b, cpu_counts, counts) -> bool:
        policy = self.config.recall_policy
        if policy == "off":
            return False
        if policy == "interval":
            return (self._batch[b].steps + 1) % self.config.interval_for_layer(layer) == 0
        selected = int(counts[b].sum())
        return selected > 0 and int(cpu_counts[b].sum()) / selected > self.config.recall_beta

    def _maybe_recall(self, layer, selection):
        """Periodic recall after layer's attention: CPU-list blocks replace the least useful resident ones."""
        if selection.cpu_blocks is None:
            return
        cpu_blocks, cpu_counts = selection.cpu_blocks.cpu(), selection.cpu_counts.cpu()
        counts = selection.counts.cpu()
        due = [b for b in range(len(self._batch)) if self._recall_due(layer, b, cpu_counts, counts)]
        if not due:
            return
        sets, scores = self._selected_sets(selection), selection.scores.cpu()
        stats, store = self.telemetry.layer(layer), self.offloaded
        start = time.perf_counter()
        with self._recall_copies():
            for b in due:
                state = self._batch[b]
                for h in range(self.shape.num_kv_heads):
                    candidates = cpu_blocks[b, h, : cpu_counts[b, h]].tolist()
                    moved = recall.bring_in(store, layer, state.rid, state.slot, h, candidates, sets[b][h], scores[b, h])
                    stats.recalled_blocks += moved
                    stats.recall_bytes += moved * store.block_bytes_per_head(layer)
        self._recall_issued(layer)
        self.telemetry.add_time("recall", time.perf_counter() - start)

    # -- decision trace (tests only; never built when self.trace is None) -------
    def _resident_rows(self, layer) -> list:
        slots = torch.tensor([s.slot for s in self._batch], dtype=torch.long)
        return self.offloaded.resident_map[layer][slots].tolist()

    def _trace_full(self, layer, selected, counts):
        """Device-full layer: every block, or quest's selection plus the partial tail."""
        batch, heads, size = len(self._batch), self.shape.num_kv_heads, self.block_size
        counts_after = self._after_counts()
        if selected is None:
            device = [[list(range(ceil_div(n, size)))] * heads for n in counts_after]
        else:
            device = block_lists(selected, counts, batch, heads)
            for b, n in enumerate(counts_after):
                if n % size:
                    device[b] = [blocks + [n // size] for blocks in device[b]]
        self.trace.record(LayerDecision(
            self._step_index, layer, [s.rid for s in self._batch], counts_after, offloaded=False,
            selected=None if selected is None else block_lists(selected, counts, batch, heads),
            device_blocks=device, cpu_blocks=block_lists(None, None, batch, heads)))

    def _trace_offloaded(self, layer, selection, only) -> LayerDecision:
        """Offloaded layer: resident blocks (those in `only` for infinigen) then the window, as _device_part lists them."""
        batch, heads = len(self._batch), self.shape.num_kv_heads
        counts_after = self._after_counts()
        resident = self._resident_rows(layer) if self.config.mode in RESIDENT_MODES else None
        device = []
        for b, n in enumerate(counts_after):
            window = self.offloaded.window_blocks(n)
            rows = []
            for h in range(heads):
                held = [] if resident is None else [j for j in resident[b][h] if j != PAD_BLOCK]
                if only is not None:
                    held = [j for j in held if j in only[b][h]]
                rows.append(held + window)
            device.append(rows)
        selected = None if selection is None else block_lists(selection.selected, selection.counts, batch, heads)
        cpu = block_lists(None, None, batch, heads)
        if selection is not None and selection.handle is not None:
            cpu = block_lists(selection.cpu_blocks, selection.cpu_counts, batch, heads)
        return LayerDecision(self._step_index, layer, [s.rid for s in self._batch], counts_after, offloaded=True,
                             selected=selected, device_blocks=device, cpu_blocks=cpu, resident=resident)


def _nbytes(*stores: dict) -> int:
    return sum(t.numel() * t.element_size() for store in stores for t in store.values())
