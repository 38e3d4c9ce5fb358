"""CoAttentionEngine: one decode step of co-attention, planned once, run layer by layer.

The framework-agnostic core of co-attention. A driver (the SGLang adapter, or
the HF reference decoder) calls, per decode step:

    begin_step(rids)                             # plan: host work, once
    for layer i:  [predict(i + 1, q_pred)]       # from layer i's normalized input
                  o = attend(i, q, k_new, v_new)
    telemetry = end_step()                       # one read of the step's counters

`begin_step` allocates pages and writes the StepPlan (step_plan.py) into its
static device buffer. `predict` and `attend` are then a fixed sequence of fused
stages per layer (layer_stages.py) over that plan and the engine's static
buffers (step_buffers.py), whatever the batch size and head count: no device
value is read back, nothing is allocated, no Python loops over requests, heads
or blocks, and the CPU part is handed off through control words the device
writes (cpu_handoff.py), so a CUDA graph can capture the whole step. Counters
and the hand-off's statuses accumulate in device tensors read once, in
`end_step`.

Every decision of a step (window, forced blocks, selection, CPU set) uses the
counts after the step's token is appended, so the device part and the CPU part
are always disjoint and together cover the selection.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from scout_sglang.config import ScoutConfig
from scout_sglang.core.bad_pages import name_bad_pages
from scout_sglang.core.cpu_handoff import CpuHandoff
from scout_sglang.core.cpu_split import CpuSplit
from scout_sglang.core.device_tables import DeviceTable, StepTables
from scout_sglang.core.host_wait import wait_for_device
from scout_sglang.core.layer_stages import CPU_MODES, RESIDENT_MODES, LayerStages
from scout_sglang.core.recall_budget import RecallBudget
from scout_sglang.core.pool_rebalance import pool_quotas, rebalance
from scout_sglang.core.pool_sharing import adopt_rows
from scout_sglang.core.shape import ModelShape
from scout_sglang.core.step_buffers import StepBuffers
from scout_sglang.core.step_plan import (
    PlanBuffer,
    StepPlan,
    bucket,
    header_words,
    plan_fields,
)
from scout_sglang.core.step_plan_rows import ROW_BATCH, plan_fields_by_row
from scout_sglang.core.stores import DeviceFullStore, OffloadedStore, ceil_div
from scout_sglang.core.telemetry import StepTelemetry
from scout_sglang.core.trace import (
    DecisionTrace,
    full_layer_decision,
    offloaded_layer_decision,
)
from scout_sglang.env import DEFAULT_CPU_DEADLINE_MS
from scout_sglang.kernels.recall_brake import MAX_RUN_POSITION
from scout_sglang.kernels.step_counters import BAD_PAGES, COUNTER_NAMES
from scout_sglang.layout import PAD_BLOCK

SEQ_LIMIT = 2**31 - 2  # step sequence numbers wrap below int32's range, never 0 (a word's initial value)

logger = logging.getLogger("scout_sglang.core")


@dataclass
class RequestState:
    rid: int
    slot: int
    num_tokens: int = 0  # tokens stored in every layer
    steps: int = 0  # decode steps completed
    filling_to: int = 0  # the end of the prefill chunk being stored, layer by layer (num_tokens once committed)


class CoAttentionEngine:
    """Block state, selection, CPU attention, merge and recall for every layer.

    Parameters
    ----------
    config : ScoutConfig
    shape : ModelShape
    device, dtype : where and in which dtype the device-side KV lives
    max_requests : concurrent requests (request slots), and the largest step (rows)
    max_tokens_per_request : sizes the per-request page tables (and the stores, unless total_pages is given)
    total_pages : overrides the store sizing with a page count for all requests together
    cpu_worker : the CPU part's worker (a cpu_worker NativeWorkerPool or FlagWorker) to use; None creates one when
        the mode needs it; False: none, every CPU part is computed on the device (sizing, tests)
    track_changes : compute the block change rate (one more comparison in the select stage)
    trace : record every decision in `self.trace` (a DecisionTrace) for tests; off costs nothing
    fixed_widths : page tables of a step at their full capacity (what a CUDA graph captures) instead of
        the next power of two of the batch's longest request; default: on for CUDA
    cpu_deadline_ms : how long after its ring a layer waits for its CPU part before computing it itself
        (exactly, from the host store: cpu_handoff.py); the server passes SCOUT_CPU_DEADLINE_MS
    cpu_faults : a cpu_worker.faults.FaultPlan for the worker this engine creates (tests only; None: no faults)
    cpu_health : when the CPU worker is given work (cpu_health.CpuWorkerHealth; None: one of its defaults)
    cores : the core plan of the worker this engine creates (cpu_worker/core_plan.py: one rank's CPUs split between
        the host and the workers), applied by cpu_worker/factory.py: one worker thread pinned per physical core (or
        SCOUT_CPU_GROUPS threads), the host thread and torch's threads on the host core on a GPU; None: the plan
        of this process's CPUs
    host_store : a stores.BorrowedHostStore to keep the full blocks of the offloaded layers in (its owner assigns
        each block's page: assign_pages); None: the engine allocates its own host store
    assigned_pages : the caller picks the page of every block in every store (SGLang's allocator under its radix
        cache: assign_pages), so requests that share a cached prefix share its pages (adopt_prefix)
    replay_launches : on the Triton path, replay each layer's recorded launches instead of running the stage
        code that makes them (launch_program.py); False runs the stage code every step
    """

    def __init__(self, config: ScoutConfig, shape: ModelShape, *, device="cpu", dtype=torch.bfloat16,
                 max_requests: int = 8, max_tokens_per_request: int = 4096, total_pages: int | None = None,
                 cpu_worker=None, track_changes: bool = True, trace: bool = False, fixed_widths: bool | None = None,
                 cpu_deadline_ms: float = DEFAULT_CPU_DEADLINE_MS, cpu_faults=None, cpu_health=None,
                 cores=None, host_store=None, assigned_pages: bool = False, replay_launches: bool = True):
        if config.mode in RESIDENT_MODES + CPU_MODES and config.local_blocks < 1:
            raise ValueError(f"mode {config.mode!r} needs local_blocks >= 1 (the block that fills in a step stays local)")
        if any(layer >= shape.num_layers for layer in config.dense_layers):
            raise ValueError(f"dense_layers {config.dense_layers} out of range for {shape.num_layers} layers")
        if config.recall_min_selected > 1 and max_tokens_per_request >= MAX_RUN_POSITION:
            raise ValueError(f"recall_min_selected > 1 counts selection runs by token position in 23 bits: "
                             f"max_tokens_per_request must be below {MAX_RUN_POSITION}, got {max_tokens_per_request}")
        self.config, self.shape = config, shape
        self.device, self.dtype = torch.device(device), dtype
        self.block_size = config.block_size
        self.track_changes = track_changes
        self.replay_launches = replay_launches
        self.exact_path = True  # resident-first: steps whose every request is exact and settled skip the selection
        self.fixed_widths = self.device.type == "cuda" if fixed_widths is None else fixed_widths
        offloaded = config.mode in RESIDENT_MODES + CPU_MODES
        self.offloaded_layers = tuple(l for l in range(shape.num_layers) if offloaded and l not in config.dense_layers)
        self.full_layers = tuple(l for l in range(shape.num_layers) if l not in self.offloaded_layers)
        self.max_requests = max_requests
        self.max_blocks = ceil_div(max_tokens_per_request, self.block_size) + 1
        pages = total_pages or max_requests * ceil_div(max_tokens_per_request, self.block_size)
        # The estimate of the unattended blocks (kernels/estimate.py): every sparse mode, a value summary per block.
        self.estimates = config.estimate and config.mode != "full"
        self.full_store = DeviceFullStore(self.full_layers, num_pages=pages, max_requests=max_requests,
                                          max_blocks=self.max_blocks, shape=shape, block_size=self.block_size,
                                          dtype=dtype, device=self.device, with_digests=config.mode == "quest",
                                          with_value_summaries=self.estimates, assigned_pages=assigned_pages)
        # scout's recall, with its brake (kernels.recall_brake) and cap (recall_budget.py)
        recalls = (config.mode == "scout" and config.recall_policy != "off" and config.resident_capacity > 0
                   and bool(self.offloaded_layers))
        self.offloaded = OffloadedStore(
            self.offloaded_layers, num_host_pages=pages, max_requests=max_requests, max_blocks=self.max_blocks,
            shape=shape, block_size=self.block_size, sink_blocks=config.sink_blocks, local_blocks=config.local_blocks,
            resident_blocks=config.resident_capacity if config.mode in RESIDENT_MODES else 0, dtype=dtype,
            device=self.device, borrowed=host_store, assigned_pages=assigned_pages,
            selection_runs=recalls and config.recall_min_selected > 1, recall_brake=recalls and config.recall_brake,
            value_summaries=self.estimates, resident_pool=self._resident_pool_pages(max_requests),
            resident_row_limit=self._resident_row_limit(),
        )  # fmt: skip
        self.pool = self.offloaded.pool  # resident-first serving (resident_pool.py), or None
        # Outputs of the select stage: the budget's top-k, or (resident-first) every block of a request that fits.
        self.select_width = config.topk_blocks if self.pool is None else max(
            config.topk_blocks, self.offloaded.resident_width + config.sink_blocks + config.local_blocks)
        self.requests: dict[int, RequestState] = {}
        self._free_slots = list(range(max_requests - 1, -1, -1))
        # Device ops: the fused stages run Triton on CUDA and torch on the CPU, unless the configuration names
        # one (Triton on the CPU runs in its interpreter: the tests count what a GPU would launch that way).
        # The device part's decode reads its per-head counts on the device: Triton on CUDA (FlashInfer's decode
        # wrapper plans from host-side lengths), unless SCOUT_KERNEL_IMPL names another.
        self.stage_impl = None if config.kernel_impl == "flashinfer" else config.kernel_impl
        self.decode_impl = config.kernel_impl or (None if self.device.type == "cpu" else "triton")
        self._selects = list(self.offloaded_layers) + (
            [l for l in self.full_layers if l not in config.dense_layers] if config.mode == "quest" else [])
        # Each slot's last selection per layer: the change count's, and what a shrinking quota keeps (resident_pool)
        self.previous = {layer: torch.full((max_requests + 1, shape.num_kv_heads, self.select_width), PAD_BLOCK,
                                           dtype=torch.int32, device=self.device)
                         for layer in (self._selects if track_changes or self.pool is not None else ())}
        window = config.sink_blocks + config.local_blocks + 1
        # The CPU split (cpu_split.py): the device reads a share of each CPU list from the host store itself.
        splits = config.cpu_split != "off" and config.mode in CPU_MODES and bool(self.offloaded_layers)
        self.buffers = StepBuffers(max_batch=max_requests, num_layers=shape.num_layers,
                                   num_qo_heads=shape.num_qo_heads, num_kv_heads=shape.num_kv_heads,
                                   head_dim=shape.head_dim, max_blocks=self.max_blocks, topk=self.select_width,
                                   cpu_capacity=config.cpu_capacity, device_width=self.offloaded.resident_width + window,
                                   dtype=dtype, device=self.device, cpu_split=splits)
        self.buffers.workspace = self._decode_workspace(window)
        self.buffers.estimate_workspace = self._estimate_workspace()
        self._own_worker = cpu_worker is None and config.mode in CPU_MODES and bool(self.offloaded_layers)
        self.cores = None  # the core plan applied, when this engine made its worker
        self.cpu_worker = self._make_worker(cpu_faults, cores) if self._own_worker else (cpu_worker or None)
        self.cpu_split = self._make_cpu_split() if splits else None
        self.handoff = None
        if config.mode in CPU_MODES and self.offloaded_layers:
            self.handoff = CpuHandoff(self.offloaded_layers, max_batch=max_requests, num_qo_heads=shape.num_qo_heads,
                                      num_kv_heads=shape.num_kv_heads, head_dim=shape.head_dim,
                                      capacity=config.cpu_capacity, dtype=dtype, device=self.device,
                                      host_k=self.offloaded.host_k, host_v=self.offloaded.host_v,
                                      scale=shape.softmax_scale, worker=self.cpu_worker,
                                      deadline_s=cpu_deadline_ms / 1e3, impl=self.decode_impl, health=cpu_health,
                                      workspace=self.buffers.workspace)
        self.recall_budget = RecallBudget(
            config, block_bytes=self.offloaded.block_bytes_per_head(self.offloaded_layers[0]),
            num_layers=len(self.offloaded_layers)) if recalls else None
        self._plan_buffer = PlanBuffer(self.device, max_requests, self._max_plan_width(window))
        # The page tables on the device, moved by what changed (device_tables.py): no O(context) copy per step.
        self.device_tables = {}
        if self.offloaded_layers:
            self.device_tables["host"] = DeviceTable(self.offloaded.host_tables, max_rows=max_requests,
                                                     scratch_page=self.offloaded.host_scratch_page, device=self.device)
        if self.pool is not None:  # the resident columns' pages: a quota's change moves like a page table's
            self.device_tables["resident"] = DeviceTable(self.pool, max_rows=max_requests,
                                                         scratch_page=self.offloaded.device_scratch_page,
                                                         device=self.device)
        if self.full_layers:
            self.device_tables["full"] = DeviceTable(self.full_store.tables, max_rows=max_requests,
                                                     scratch_page=self.full_store.scratch_page, device=self.device)
        self.step_tables = StepTables(self.device_tables, max_rows=max_requests, block_size=self.block_size,
                                      device=self.device)
        self._slots_long = torch.zeros(max_requests, dtype=torch.int64, device=self.device)  # the plan's slots
        self._read_buffer = None  # page-locked, where a GPU's counters are read (_read_step_words)
        self.stages = LayerStages(self)
        self.plan: StepPlan | None = None
        self._batch: list[RequestState] = []
        self._predicted: set[int] = set()
        self.telemetry: StepTelemetry | None = None
        self._step_index = 0
        self._seq = 0
        self.trace: DecisionTrace | None = DecisionTrace() if trace else None

    def _make_cpu_split(self) -> CpuSplit:
        """The CPU split's caps (cpu_split.py). auto on CUDA: the device's zero-copy read rate timed once here
        (zero_copy_rate.py); elsewhere, and for a fixed share, the configured recall_link_gbps. Either way less the
        share recall may take of the link: the two share it."""
        config, layer = self.config, self.offloaded_layers[0]
        link_gbs, source = config.recall_link_gbps, "configured (recall_link_gbps)"
        if self.device.type == "cuda" and config.cpu_split == "auto":
            from scout_sglang.core.layer_stages import ZERO_COPY_PROGRAMS
            from scout_sglang.core.zero_copy_rate import calibrate_zero_copy_gbs

            link_gbs = calibrate_zero_copy_gbs(self.offloaded.host_k[layer], self.offloaded.host_v[layer],
                                               rows=self.max_requests, num_qo_heads=self.shape.num_qo_heads,
                                               capacity=config.cpu_capacity, programs=ZERO_COPY_PROGRAMS,
                                               device=self.device)
            source = "calibrated at start-up"
        return CpuSplit(config.cpu_split, layers=self.offloaded_layers, capacity=config.cpu_capacity,
                        block_bytes=self.offloaded.block_bytes_per_head(layer),
                        link_gbs=link_gbs * (1.0 - config.recall_link_share), link_source=source,
                        workers=self.cpu_worker is not None)

    def _resident_pool_pages(self, max_requests: int) -> int | None:
        """Pages of the resident pool (resident-first serving), or None: a fixed resident buffer per slot."""
        config = self.config
        if not (config.resident_first and self.offloaded_layers):
            return None
        if config.resident_pool_blocks is not None:
            return config.resident_pool_blocks
        return max_requests * config.resident_capacity

    def _resident_row_limit(self) -> int | None:
        """Resident-first where the resident stage runs Triton: rows of at most WIDEST_ROW blocks with the forced
        ones, ALL_PAIRS_ROW where the table's block ids are too many for the wide rows' histogram lookups
        (kernels/triton/stage_recall.py, sizes.bins_for), so a request with more blocks outside its window than
        that is served sparse, with that many resident; None elsewhere (the torch stage takes any row)."""
        config = self.config
        if not config.resident_first:
            return None
        from scout_sglang.kernels.dispatch import select_impl

        impl = None if config.kernel_impl == "flashinfer" else config.kernel_impl
        if select_impl("bring_in", self.device.type, impl) != "triton":
            return None
        from scout_sglang.kernels.triton.sizes import bins_for
        from scout_sglang.kernels.triton.stage_recall import ALL_PAIRS_ROW, WIDEST_ROW

        widest = WIDEST_ROW if bins_for(self.max_blocks) else ALL_PAIRS_ROW
        limit = widest - config.sink_blocks - config.local_blocks
        if self.max_blocks - config.sink_blocks - config.local_blocks > limit:
            logger.warning("scout: resident-first on the Triton path keeps at most %d blocks of a request resident "
                           "(the widest row its stages take for a table of %d blocks); a request with more blocks "
                           "outside its window (%d tokens at blocks of %d) is served sparse", limit, self.max_blocks,
                           (limit + config.sink_blocks + config.local_blocks) * self.block_size, self.block_size)
        return limit

    def _rebalance_pool(self, tokens: dict[int, int] | None = None, *, dips: bool = False) -> None:
        """Resident-first: every admitted request's quota of the pool, and what its change does (pool_rebalance.py)."""
        rebalance(self, tokens or {}, dips=dips)

    def exact_step_ready(self, rids: list[int]) -> bool:
        """Whether a step of these requests, planned now, runs the exact path (every request exact and settled:
        resident_pool.py): what the step's plan will say, without planning it (SGLang's graph runner picks the
        captured graph before the plan); a replay's recorded dip before the step is not foreseen (no graph replays
        one). O(admitted requests), host counts only."""
        if self.pool is None or not self.exact_path or not rids:
            return False
        if any(rid not in self.requests or rid not in self.pool.settled for rid in rids):
            return False
        needed, quotas = pool_quotas(self, {rid: self.requests[rid].num_tokens + 1 for rid in rids})
        return all(quotas[rid] >= needed[rid] for rid in rids)

    def _decode_workspace(self, window: int) -> torch.Tensor | None:
        """The Triton decode's split partials, one static buffer for every layer (None where torch decodes)."""
        if self.decode_impl != "triton" and not (self.device.type == "cuda" and self.config.mode in CPU_MODES):
            return None
        from scout_sglang.kernels.triton.decode import workspace_size

        shape, config = self.shape, self.config
        capacities = {self.max_blocks, config.topk_blocks + 1, self.offloaded.resident_width + window,
                      config.cpu_capacity}
        words = workspace_size(self.max_requests, shape.num_qo_heads, shape.num_kv_heads, shape.head_dim,
                               self.block_size, sorted(capacities))
        return torch.empty(max(words, 1), dtype=torch.float32, device=self.device)

    def _estimate_workspace(self) -> torch.Tensor | None:
        """The Triton estimate's split partials over tables of max_blocks, one static buffer for every layer (None
        without the estimate, where torch estimates, or where the walk does not split)."""
        triton = self.stage_impl == "triton" or (self.stage_impl is None and self.device.type == "cuda")
        if not self.estimates or not triton:
            return None
        from scout_sglang.kernels.triton.estimate import workspace_words

        words = workspace_words(self.max_requests, self.shape.num_qo_heads, self.shape.head_dim, self.max_blocks)
        return torch.empty(words, dtype=torch.float32, device=self.device) if words else None

    def _max_plan_width(self, window: int) -> int:
        """Columns of the widest step plan (step_plan.plan_fields): its buffer is allocated once."""
        width = 5  # slots, num_tokens, num_full, last_len, append_offset
        if self.offloaded_layers:
            width += 2 * window + 4 + self.shape.num_kv_heads
            # resident_pages; resident-first: row_topk and resident_delta (the pages come from the device table)
            width += self.offloaded.resident_blocks if self.pool is None else 3
            width += 2 * len(self.offloaded_layers) + self.shape.num_kv_heads  # recall_due, cpu_cap, recall_cap
            width += 2 + 1  # host_delta, host_started
        if self.full_layers:
            width += 3 + 2 + 1  # num_blocks and the two cells, full_delta, full_started
        return width

    def _make_worker(self, faults, cores):
        """The worker with its cores (cpu_worker/factory.py): the native pool unless cpu_impl asks for torch or it
        cannot be built; then the Python reference worker."""
        from scout_sglang.cpu_worker.factory import make_worker

        rings_from_host = self.device.type != "cuda" and self.decode_impl != "triton"  # CpuHandoff.kernels
        worker, self.cores = make_worker(device_is_cpu=self.device.type == "cpu", rings_from_host=rings_from_host,
                                         threads=self.config.cpu_groups, impl=self.config.cpu_impl, cores=cores,
                                         faults=faults)
        return worker

    def close(self) -> None:
        """Stop the CPU worker this engine made and unregister its page-locked host store (idempotent): close()
        leaves no CUDA registration behind; the store's memory goes with the engine."""
        if self._own_worker and self.cpu_worker is not None:
            self.cpu_worker.shutdown()
            self.cpu_worker = None
        self.offloaded.close()

    # -- requests ------------------------------------------------------------
    def add_request(self, rid: int) -> None:
        if rid in self.requests:
            raise ValueError(f"request {rid} is already admitted")
        if not self._free_slots:
            raise RuntimeError(f"no free request slot ({len(self.requests)} requests admitted)")
        state = RequestState(rid, self._free_slots.pop())
        if self.offloaded_layers:
            self.offloaded.admit(rid, state.slot)
        for previous in self.previous.values():
            previous[state.slot] = PAD_BLOCK
        self.requests[rid] = state
        if self.pool is not None:  # its floor, from the others' shares
            self._rebalance_pool()
            if self.pool.exact[rid]:  # its row holds every block it has (none): its prefill keeps it so while exact
                self.pool.settled.add(rid)

    def assign_pages(self, rid: int, first_block: int, pages: list[int]) -> None:
        """Blocks first_block, first_block + 1, ... of `rid` live in `pages`, in every store whose pages the caller
        assigns (a borrowed host store; every store with assigned_pages): before the write that fills them
        (prefill for a prompt's blocks, begin_step for the block a step completes or, with assigned_pages,
        starts)."""
        slot = self.requests[rid].slot
        if self.offloaded_layers and self.offloaded.assigned:
            self.offloaded.assign_host_pages(rid, slot, first_block, pages)
        if self.full_layers and self.full_store.assigned:
            self.full_store.tables.assign(rid, slot, first_block, pages)

    def assign_scratch(self, rid: int, first_block: int, count: int) -> None:
        """Blocks first_block.. first_block + count - 1 of `rid` write into each store's scratch page (nothing reads
        it): a request given up under assigned pages, which must not write into a page SGLang may share."""
        slot = self.requests[rid].slot
        if self.offloaded_layers and self.offloaded.assigned:
            self.offloaded.host_tables.assign(rid, slot, first_block, [self.offloaded.host_scratch_page] * count)
        if self.full_layers and self.full_store.assigned:
            self.full_store.tables.assign(rid, slot, first_block, [self.full_store.scratch_page] * count)

    def held_blocks(self, rid: int) -> int:
        """Blocks of `rid` that have a page (with assigned pages: those the caller assigned)."""
        return max(self.offloaded.host_pages.count(rid) if self.offloaded_layers else 0,
                   self.full_store.pages.count(rid) if self.full_layers else 0)

    def rebind_pages(self, rid: int, pages: list[int]) -> int:
        """Blocks 0, 1, ... of `rid` now live in `pages` (assigned_pages: SGLang moved the request onto the radix
        tree's copy of its prefix, the same K/V, and freed its own); returns the blocks that changed page."""
        slot, changed = self.requests[rid].slot, 0
        if self.offloaded_layers:
            changed = self.offloaded.host_tables.rebind(rid, slot, pages)
        if self.full_layers:
            changed = max(changed, self.full_store.tables.rebind(rid, slot, pages))
        return changed

    def adopt_prefix(self, rid: int, num_tokens: int, pages: list[int], *, filling_to: int = 0) -> None:
        """A new request starts with a cached prefix of `num_tokens` tokens (whole blocks) in `pages`, written by
        an earlier request (assigned_pages): it shares those blocks and their digests, and copies the ones its
        window holds (sink and local) to its own window pages. Prefill then continues at `num_tokens`; filling_to:
        the tokens it holds once that prefill chunk is stored (resident-first plans its quota at them)."""
        state = self.requests[rid]
        if not (self.offloaded.assigned or not self.offloaded_layers) or \
                not (self.full_store.assigned or not self.full_layers):
            raise RuntimeError("a cached prefix is adopted only when the caller assigns every page (assigned_pages)")
        if state.num_tokens or num_tokens % self.block_size or len(pages) != num_tokens // self.block_size:
            raise ValueError(f"request {rid}: a prefix of {num_tokens} tokens needs {num_tokens // self.block_size} "
                             f"whole blocks on a new request; got {len(pages)} pages, {state.num_tokens} tokens held")
        self.assign_pages(rid, 0, pages)
        if self.device.type == "cuda" and self.offloaded_layers:
            # A decode step of another request may have completed one of these blocks into its host page by a
            # copy still in flight on the stream: the host reads below wait for it (prefill, not a decode step).
            wait_for_device(self.device)
        for layer in self.offloaded_layers:
            self.offloaded.fill_window_from_host(layer, rid, num_tokens)
        state.num_tokens, state.filling_to = num_tokens, filling_to
        if self.pool is not None:  # the prefix's blocks outside the window in its row: shared, copied or filled later
            adopt_rows(self, rid, num_tokens)

    def release_request(self, rid: int) -> None:
        """Free every host and device page of a request (finish, abort, retraction)."""
        state = self.requests.pop(rid, None)
        if state is None:
            return
        self.full_store.release(rid, state.slot)
        if self.pool is not None:
            self.pool.finish(rid)
            self.pool.settled.discard(rid)
            self.pool.unselected.discard(rid)
        if self.offloaded_layers:
            self.offloaded.release(rid, state.slot)
        self._free_slots.append(state.slot)

    def cpu_worker_state(self) -> dict | None:
        """The CPU worker's health (cpu_health.py): whether decoding is device-only now, how often it went
        device-only, the pool's threads replaced after one ended, the CPUs its threads may run on (read back
        from the OS) and the CPU split's caps, with where they come from; None without a CPU part."""
        if self.handoff is None:
            return None
        health, worker = self.handoff.health, self.cpu_worker
        thread_cpus = getattr(worker, "thread_cpus", None)
        return {"device_only": health.device_only, "device_only_switches": health.switches,
                "replaced_threads": getattr(worker, "replaced_threads", 0),
                "threads": len(getattr(worker, "threads", ())),
                "cpus": thread_cpus() if thread_cpus is not None else [],
                "split": self.cpu_split.describe() if self.cpu_split is not None else None}

    def usage(self) -> dict:
        """Pages in use, for leak checks and metrics."""
        return {
            "requests": len(self.requests),
            "device_full_pages": self.full_store.pages.num_used,
            "host_pages": self.offloaded.host_pages.num_used,
            "device_window_pages": self.offloaded.device_pages.num_used - self._pool_reserve(),
            **({} if self.pool is None else {"resident_pool_pages": self.pool.pages.num_used}),
        }

    def _pool_reserve(self) -> int:
        """Device pages the resident pool holds for good in the window/resident allocator (0 without it)."""
        return 0 if self.pool is None else self.pool.pages.num_pages

    def resident_pool_state(self) -> dict | None:
        """Resident-first serving (resident_pool.py): the pool's pages and their use, the requests attended
        exactly now, and the resident columns quota shrinkage gave back since start-up; None without it."""
        return None if self.pool is None else self.pool.usage() | {"row_blocks": self.offloaded.resident_width}

    def memory(self) -> dict:
        """Bytes the stores allocate and use, on the device and in host memory, and the tokens held."""
        full, off = self.full_store, self.offloaded
        full_kv = _nbytes(full.k, full.v)
        full_digests = _nbytes(full.digest_min, full.digest_max, full.value_summary)
        digests, window = _nbytes(off.digest_min, off.digest_max, off.value_summary), _nbytes(off.dev_k, off.dev_v)
        host_page = sum(t[0].numel() * t.element_size() for t in (*off.host_k.values(), *off.host_v.values()))
        # Each store has one scratch page beyond its allocator's pages (stores.py): allocated, never used.
        full_used = full.pages.num_used / (full.pages.num_pages + 1)
        digest_row = sum(t[0].numel() * t.element_size()
                         for t in (*off.digest_min.values(), *off.digest_max.values(), *off.value_summary.values()))
        pooled = self._pool_reserve() - (self.pool.pages.num_used if self.pool is not None else 0)  # reserved, unused
        window_used = (off.device_pages.num_used - pooled) / (off.device_pages.num_pages + 1)
        return {
            "tokens": sum(state.num_tokens for state in self.requests.values()),
            "device_bytes_allocated": full_kv + full_digests + digests + window,
            "device_bytes_used": round((full_kv + full_digests) * full_used + off.host_pages.num_used * digest_row
                                       + window * window_used),
            "host_bytes_allocated": off.host_bytes_owned(),  # a borrowed store's bytes are its owner's
            "host_bytes_used": off.host_pages.num_used * host_page,  # borrowed or not: the pages holding blocks
            # pages more than one request holds (assigned pages: a shared prefix), counted once in the used bytes
            "host_bytes_shared": getattr(off.host_pages, "num_shared", 0) * host_page,
            "host_page_bytes": host_page,
        }

    def host_store_pages(self, max_age_s: float = 30.0) -> dict:
        """Which pages the host store got (host_memory.page_report): its page kind and the share of its bytes on
        2 MiB pages, measured from /proc/self/smaps at most every `max_age_s` seconds (a read walks every mapping
        of the process). A borrowed store (the arrival pool) is described too."""
        return self.offloaded.host_pages_survey.report(max_age_s)

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
        if self.pool is not None and layer == self.offloaded_layers[0]:
            state.filling_to = end
            self._rebalance_pool({rid: end})  # the quotas with this request at `end` tokens
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
                v_blocks = v_full.reshape(shape).transpose(1, 2)
                store.copy_blocks_to_host(layer, rid, blocks, k_blocks, v_blocks)
                store.write_digests(layer, rid, blocks, k_blocks, v_blocks)
            if self.pool is not None and self.pool.exact.get(rid):
                self._write_leaving_blocks(layer, rid, start, end, *((k_blocks, v_blocks) if last > first else ()))
            window = set(store.window_blocks(end))
            keep = [p - start for p in range(start, end) if p // size in window]
            store.write_window(layer, [rid] * len(keep), [start + i for i in keep], k[keep].to(self.device),
                               v[keep].to(self.device))
        if layer == self.shape.num_layers - 1:
            state.num_tokens = end

    def _write_leaving_blocks(self, layer: int, rid: int, start: int, end: int, k_blocks=None, v_blocks=None) -> None:
        """Resident-first: a prefill chunk of a request that fits its quota writes the blocks it moves out of the
        window into the request's pool columns too (column c holds block sink + c), so its first decode step
        attends them all with no copy from the host. They come from the chunk's own blocks, or from the window
        pages of the blocks an earlier chunk completed (read before this chunk's window write overwrites them);
        every copy stays on the device."""
        size, sink = self.block_size, self.config.sink_blocks
        forced = sink + self.config.local_blocks
        before, after = max(0, start // size - forced), max(0, end // size - forced)
        if after <= before:
            return
        store, slot, first = self.offloaded, self.requests[rid].slot, start // size
        blocks = list(range(sink + before, sink + after))
        window = [store.window_page(rid, b) for b in blocks if b < first]  # completed by an earlier chunk
        parts_k = [store.dev_k[layer][window]] if window else []
        parts_v = [store.dev_v[layer][window]] if window else []
        if len(window) < len(blocks):
            chunk = [b - first for b in blocks if b >= first]
            parts_k.append(k_blocks[chunk])
            parts_v.append(v_blocks[chunk])
        columns = [b - sink for b in blocks]
        if columns[-1] >= self.pool.quota(rid):  # never past its quota: those columns have no page
            logger.error("scout: resident pool: request %d is exact at %d columns, but its prefill moves block %d "
                         "out of its window; its row is filled at its first step instead", rid, self.pool.quota(rid),
                         blocks[-1])
            self.pool.exact[rid] = False  # the next rebalance makes it exact again, and its first fill takes them all
            self.pool.settled.discard(rid)
            self.pool.identity.pop(rid, None)  # its first fill may take any empty column
            return
        pages = self.pool.table[slot, columns].long().to(self.device)
        store.dev_k[layer][pages] = torch.cat(parts_k)
        store.dev_v[layer][pages] = torch.cat(parts_v)
        store.resident_map[layer][slot, :, columns] = torch.tensor(blocks, dtype=torch.int32, device=self.device)
        if layer == self.offloaded_layers[-1] and self.pool.identity.get(rid, 0) == columns[0]:
            self.pool.identity[rid] = columns[-1] + 1  # its row holds block sink + c at column c: it may share them
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
    def begin_step(self, rids: list[int], *, rows: int | None = None, token_slots: torch.Tensor | None = None,
                   exact_step: bool | None = None) -> StepPlan:
        """Plan the step of these requests (pages, metadata); returns the plan. Host work of O(batch): nothing
        here reads a device value or copies a page table.

        rows : the rows the layers will run (a captured graph's batch size); the ones past the requests are
            padding (default: one per request)
        token_slots : [>= rows] int64 on the device, where the caller's allocator put each row's token (SGLang's
            out_cache_loc), for stores whose pages the caller assigns: a block a token starts that the host was
            not given a page for gets page token_slot // block_size, on the device (device_tables.py)
        exact_step : resident-first: run the step on the exact path (every request exact and settled; a step of
            padding rows only may: a captured graph's) or not; None: the engine decides (exact_step_ready). A
            captured graph's caller names the path its graph was captured for."""
        rows = len(rids) if rows is None else rows
        if rows < len(rids) or rows > self.max_requests:
            raise ValueError(f"a step of {len(rids)} requests cannot run {rows} rows (max_requests "
                             f"{self.max_requests})")
        self._batch = [self.requests[rid] for rid in rids]
        self._predicted = set()
        self._started = self._assign_started_blocks(token_slots)
        for state in self._batch:
            after = state.num_tokens + 1
            if self.full_layers:
                self.full_store.ensure_tokens(state.rid, state.slot, after)
            if self.offloaded_layers:
                self.offloaded.ensure_full_blocks(state.rid, state.slot, after // self.block_size)
        if self.pool is not None:
            if self.pool.replayed and self.pool.dips_due({s.rid: s.steps for s in self._batch}):
                self._rebalance_pool(dips=True)  # the recorded dip first, at the tokens it happened at
            self._rebalance_pool({state.rid: state.num_tokens + 1 for state in self._batch})
            for state in self._batch:
                self.pool.record(state.rid, state.num_tokens - state.steps)
        self._seq = self._seq % SEQ_LIMIT + 1
        if self.recall_budget is not None:
            self.recall_budget.observe_step(decodes=bool(rids))
        bypass = self.handoff is not None and not self.handoff.use_worker()
        # Resident-first: a step whose every request is exact lists nothing for the CPU, so the workers are not
        # woken for it (they would spin through its layers): on the selecting path the layers compute their
        # (empty) CPU parts themselves, as in a bypassed step, which stays exact even where a row's first fill is
        # still to come; the exact path has no CPU part at all.
        idle = not bypass and self.handoff is not None and self.pool is not None and bool(rids) and \
            all(self.pool.exact.get(rid, False) for rid in rids)
        self.plan = self._build_plan(rows, bypass or idle, token_slots)
        settled = self.pool is not None and self.exact_path and bool(rids) and all(
            rid in self.pool.settled and self.pool.exact[rid] for rid in rids)  # what exact_step_ready foresaw
        if exact_step and rids and not settled:  # exact_step_ready said otherwise a moment ago: a bug
            raise RuntimeError(f"a step of requests {rids} cannot run the exact path: not every one is exact and "
                               "settled (exact_step_ready)")
        self.plan.exact_step = bool(settled if exact_step is None else exact_step)
        if self.handoff is not None:
            self.handoff.begin_step(self._seq, bypass or idle)
        if self.telemetry is None:  # else it accumulates the steps not read yet (end_step(read=False))
            self.telemetry = StepTelemetry(self._step_index, len(rids))
        self.telemetry.worker_free_steps += idle
        self.telemetry.exact_path_steps += self.plan.exact_step and bool(rids)
        self.telemetry.planned_device_only_steps += idle and not self.plan.exact_step
        if self.pool is not None:
            self.telemetry.exact_requests += sum(self.pool.exact[rid] for rid in rids)
            self.telemetry.pool_pages_used = self.pool.pages.num_used
        if self.recall_budget is not None and rids:
            self.telemetry.recall_cap_bytes += self.recall_budget.cap_bytes(len(rids) * self.shape.num_kv_heads)
        if self.trace is not None:
            self.trace.begin_step()
        return self.plan

    def _assign_started_blocks(self, token_slots) -> dict[str, list[int]]:
        """Rows whose token starts a block that a caller-assigned store has no page for yet: the device assigns it
        from the row's token slot (the host holds a marker); -> {table name: rows}."""
        stores = {name: tables for name, tables, assigned in (
            ("host", self.offloaded.host_tables, bool(self.offloaded_layers) and self.offloaded.assigned),
            ("full", self.full_store.tables, bool(self.full_layers) and self.full_store.assigned)) if assigned}
        started = {name: [] for name in stores}
        if token_slots is None or not stores:
            return started
        for row, state in enumerate(self._batch):
            block, offset = divmod(state.num_tokens, self.block_size)
            for name, tables in stores.items():
                if offset == 0 and tables.pages.count(state.rid) == block:
                    tables.assign_on_device(state.rid, state.slot, block)
                    started[name].append(row)
        return started

    def _plan_arguments(self, rows: int, bypass: bool) -> tuple[tuple, dict]:
        """The arguments of plan_fields for this step (taking the device tables' changes since the last one)."""
        batch, config = self._batch, self.config
        changes = {name: table.take_changes(rows) for name, table in self.device_tables.items()}
        return ([s.slot for s in batch], [s.num_tokens + 1 for s in batch], [s.steps + 1 for s in batch]), dict(
            rows=rows, padding_slot=self.max_requests, config=config, num_kv_heads=self.shape.num_kv_heads,
            offloaded=self.offloaded if self.offloaded_layers else None,
            full_store=self.full_store if self.full_layers else None, offloaded_layers=self.offloaded_layers,
            recall_quota=config.recall_quota, tables=self.device_tables, changes=changes, started=self._started,
            exact=None if self.pool is None else [self.pool.exact.get(s.rid, False) for s in batch],
            recall_cap=None if self.recall_budget is None else self.recall_budget.row_caps(
                len(batch), self.shape.num_kv_heads, self._step_index),
            cpu_caps=None if self.cpu_split is None else self.cpu_split.step_caps(bypass=bypass))

    def _build_plan(self, rows: int, bypass: bool, token_slots=None) -> StepPlan:
        batch = self._batch
        args, kwargs = self._plan_arguments(rows, bypass)
        # a few requests: their fields in Python, not dozens of tensor ops on tensors of a few elements
        fields, padding = (plan_fields_by_row if 0 < len(batch) <= ROW_BATCH else plan_fields)(*args, **kwargs)
        header, views = self._plan_buffer.write(header_words(seq=self._seq, rows=rows, bypass=bypass), fields, rows,
                                                padding)
        size = self.block_size
        widths = {"host": self._width(max((s.num_tokens + 1) // size for s in batch) if batch else 0),
                  "full": self._width(max(ceil_div(s.num_tokens + 1, size) for s in batch) if batch else 0),
                  "resident": self._resident_step_width(batch)}
        views |= self.step_tables.apply(views, rows, widths, token_slots if any(self._started.values()) else None,
                                        len(batch))
        self._slots_long[:rows].copy_(views["slots"])
        heads = self.shape.num_kv_heads
        plan = StepPlan(batch_size=len(batch), rows=rows, rids=[s.rid for s in batch], seq=self._seq, bypass=bypass,
                        header=header, slots_long=self._slots_long[:rows],
                        last_len_heads=views["last_len"].unsqueeze(1).expand(rows, heads),
                        **{name: view for name, view in views.items() if not name.endswith("_table")},
                        host_table=views.get("host_table"), full_table=views.get("full_table"))
        if self.pool is not None:
            plan.resident_pages = views["resident_table"]
        if plan.full_table is not None:
            plan.full_lists = plan.full_table.unsqueeze(1).expand(rows, heads, -1)
            plan.full_counts = plan.num_blocks.unsqueeze(1).expand(rows, heads)
        return plan

    def _width(self, needed: int) -> int:
        return self.max_blocks if self.fixed_widths else bucket(needed, self.max_blocks)

    def _resident_step_width(self, batch) -> int:
        """Resident columns the step's stages walk: the row's (fixed widths), or with resident-first the bucket of
        the batch's largest quota (the columns past it hold nothing in these rows)."""
        width = self.offloaded.resident_width
        if self.pool is None or self.fixed_widths:
            return width
        return bucket(max((self.pool.quota(s.rid) for s in batch), default=0), width)

    # -- one decode step: run, per layer -------------------------------------------
    def wants_prediction(self, layer: int) -> bool:
        """Whether attend(layer) can use a query predicted one layer ahead (never in a step on the exact path:
        it selects nothing, so the caller need not compute the prediction)."""
        return (self.config.layer_ahead and self.config.mode in RESIDENT_MODES and layer >= 1
                and layer in self.offloaded_layers and not (self.plan is not None and self.plan.exact_step))

    def predict(self, layer: int, q_pred: torch.Tensor) -> None:
        """Layer-ahead work of `layer` from its predicted query [rows, Hq, D] (Algorithm 1).

        scout: select, fill, split off the resident blocks, ring the CPU part.
        infinigen: select and recall the selected blocks into the resident buffer.
        """
        if not self.wants_prediction(layer) or self.plan is None:  # no step planned: nothing to predict for
            return
        self.stages.front(layer, q_pred, trace=self.trace)
        self._predicted.add(layer)

    def attend(self, layer: int, q: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor, *,
               out: torch.Tensor | None = None) -> torch.Tensor:
        """Append the step's K/V [rows, Hkv, D] to `layer` and return its attention output [rows, Hq, D] (into
        `out` when given: a captured graph's static buffer)."""
        out = torch.empty_like(q) if out is None else out
        if layer in self.full_layers:
            selects = layer in self._selects
            self.stages.attend_full(layer, q, k_new, v_new, out, selects=selects)
            if self.trace is not None:
                self.trace.record(full_layer_decision(self, layer, selects))
            return out
        if self.plan.exact_step:  # every row exact and settled: append, admit, list, decode
            self.stages.attend_exact(layer, q, k_new, v_new, out, trace=self.trace)
            if self.trace is not None:
                self.trace.record(offloaded_layer_decision(self, layer))
            return out
        if layer not in self._predicted:  # nothing launched ahead: the front with the real query, same layer
            self.stages.front(layer, q, trace=self.trace)
        traced = offloaded_layer_decision(self, layer) if self.trace is not None else None
        self.stages.attend_offloaded(layer, q, k_new, v_new, out)
        if traced is not None:
            traced.resident_after = self._resident_rows(layer) if self.config.mode in RESIDENT_MODES else None
            self.trace.record(traced)
        return out

    def end_step(self, *, read: bool = True) -> StepTelemetry | None:
        """Commit the step: every request of the batch now holds one more token.

        read : read the step's counters (one device read, a stream sync on a GPU) and return its telemetry; False
            reads nothing (a replayed CUDA graph's step, whose host must not wait for it): the counters keep
            accumulating on the device until collect_telemetry()."""
        budget = self.config.topk_blocks * self.shape.num_kv_heads * len(self._batch)
        for layer in self._selects:
            self.telemetry.layer(layer).budget_blocks += budget
            if self.recall_budget is not None and layer in self.offloaded_layers:
                self.telemetry.layer(layer).recall_rows += self.shape.num_kv_heads * len(self._batch)
        if self.handoff is not None:
            for layer in self.handoff.layers:
                self.telemetry.layer(layer).cpu_launched_ahead |= layer in self._predicted
        for state in self._batch:
            state.num_tokens += 1
            state.steps += 1
            if self.pool is not None and self.pool.exact.get(state.rid, False):
                self.pool.settled.add(state.rid)  # its row holds every block: filled by this step
                self.pool.unselected.add(state.rid)  # a step exact: on the exact path it selected nothing
            elif self.pool is not None:
                self.pool.unselected.discard(state.rid)  # a sparse step: its last selection is current
        if self._batch:  # a step of padding rows only (a graph's capture) decodes nothing
            self.telemetry.steps += 1
            self.telemetry.decoded_tokens += len(self._batch)
            self.telemetry.batch_size = max(self.telemetry.batch_size, len(self._batch))
        self._step_index += 1
        rids = self.plan.rids
        self._batch, self._predicted, self.plan = [], set(), None
        return self.collect_telemetry(rids) if read else None

    def collect_telemetry(self, rids: list[int] | None = None) -> StepTelemetry | None:
        """The telemetry of the steps ended since the last collection: their counters, the CPU parts' outcomes
        (which also feed the worker's health) and wait times, in one device read; None when no step ended.
        rids: the requests of the last step, named in a fallback's log."""
        telemetry = self.telemetry
        if telemetry is None or self.plan is not None:  # nothing ended, or a step is under way
            return None
        counters, outcomes, waits, windows, zero_copy_times = self._read_step_words()
        for layer in self._selects:
            stats = telemetry.layer(layer)
            for name, value in zip(COUNTER_NAMES, counters[layer]):
                setattr(stats, name, getattr(stats, name) + value)
            if layer in self.offloaded_layers:
                block_bytes = self.offloaded.block_bytes_per_head(layer)
                stats.recall_bytes += stats.recalled_blocks * block_bytes
                stats.cpu_bytes, stats.zero_copy_bytes = stats.cpu_blocks * block_bytes, stats.zero_copy_blocks * block_bytes
        if self.handoff is not None:
            for layer, wait_ns, window_ns, zero_copy_ns in zip(self.handoff.layers, waits, windows, zero_copy_times):
                stats = telemetry.layer(layer)
                stats.cpu_wait_s += wait_ns / 1e9
                stats.cpu_window_s += window_ns / 1e9
                stats.zero_copy_s += zero_copy_ns / 1e9
                telemetry.add_time("cpu_wait", wait_ns / 1e9)
                if self.cpu_split is not None:
                    self.cpu_split.observe(layer, cpu_blocks=stats.cpu_blocks, zero_copy_blocks=stats.zero_copy_blocks,
                                           rows=telemetry.decoded_tokens * self.shape.num_kv_heads,
                                           steps=telemetry.steps, window_s=stats.cpu_window_s,
                                           wait_s=stats.cpu_wait_s, zero_copy_s=stats.zero_copy_s)
            planned = telemetry.planned_device_only_steps  # the exact path has no CPU part, so no outcome
            for cause, count in self.handoff.record_outcomes(outcomes, rids or [],
                                                              planned_device_only=planned).items():
                telemetry.cpu_fallbacks[cause] = telemetry.cpu_fallbacks.get(cause, 0) + count
            bad = [layer for layer in self.handoff.layers if counters[layer][BAD_PAGES]]
            if bad:  # an error path: the page check's finds are named from the device's lists
                telemetry.bad_page_requests = name_bad_pages(self, bad, rids or [])
                logger.error("scout: %d CPU-list entries of layers %s listed a host page outside the host store "
                             "(read as page 0) in the last %d steps: %s", sum(counters[l][BAD_PAGES] for l in bad),
                             bad, telemetry.steps, telemetry.bad_page_requests or "not in the last step's lists")
        self.telemetry = None
        return telemetry

    def _read_step_words(self):
        """Counters [layers][NUM_COUNTERS], the hand-off's outcome counts [CPU layers][statuses], wait times,
        windows (ring to wait) and zero-copy read times per CPU layer: one device read, after which they are
        zeroed."""
        counters = self.buffers.counters
        parts = [counters.flatten().long()]
        if self.handoff is not None:
            parts += [self.handoff.outcomes.flatten().long(), self.handoff.wait_ns, self.handoff.window_ns,
                      self.handoff.zero_copy_ns]
        words = torch.cat(parts)
        if words.device.type == "cuda":  # through page-locked memory, the host sleeping until the copy is done
            if self._read_buffer is None:
                self._read_buffer = torch.empty(words.numel(), dtype=words.dtype, pin_memory=True)
            self._read_buffer.copy_(words, non_blocking=True)
            wait_for_device(words.device)
            words = self._read_buffer
        values = words.tolist()
        counters.zero_()
        width = counters.shape[1]
        rows = [values[i: i + width] for i in range(0, counters.numel(), width)]
        if self.handoff is None:
            return rows, [], [], [], []
        for words in (self.handoff.outcomes, self.handoff.wait_ns, self.handoff.window_ns, self.handoff.zero_copy_ns):
            words.zero_()
        start, kinds, layers = counters.numel(), self.handoff.outcomes.shape[1], len(self.handoff.layers)
        outcomes = [values[start + i * kinds: start + (i + 1) * kinds] for i in range(layers)]
        start += self.handoff.outcomes.numel()
        waits, windows, zero_copy = (values[start + i * layers: start + (i + 1) * layers] for i in range(3))
        return rows, outcomes, waits, windows, zero_copy

    # -- decision trace (tests only; never built when self.trace is None) -------
    def _resident_rows(self, layer) -> list:
        return self.offloaded.resident_map[layer][self.plan.slots_long[: self.plan.batch_size]].tolist()


def _nbytes(*stores: dict) -> int:
    return sum(t.numel() * t.element_size() for store in stores for t in store.values())
