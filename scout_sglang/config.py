"""ScoutConfig: one frozen, validated description of how a server decodes.

Read once at startup (scout_sglang.env builds it from a preset and SCOUT_*
overrides) and passed down to the engine; nothing below reads the environment.
Validation collects every problem and reports them together.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

MODES = ("full", "quest", "infinigen", "hgca", "scout")
RECALL_POLICIES = ("interval", "adaptive", "off")
KERNEL_IMPLS = (None, "flashinfer", "triton", "torch")
CPU_IMPLS = ("auto", "native", "torch")
MAX_SELECTION_RUN = 255  # a block's run of consecutive selections is counted in 8 bits (kernels.recall_brake)
MAX_BACKOFF = 16


@dataclass(frozen=True)
class ScoutConfig:
    """How the co-attention engine decodes (docs/algorithm.md; every field: docs/configuration.md, generated
    from the comments below by scripts/gen_config_docs.py).

    The token budget covers everything a query attends to per layer and KV
    head: sink, local window and the selected blocks. `topk_blocks` derives
    from it.
    """

    mode: str = "scout"  # one of MODES (docs/algorithm.md): scout is the method, the others baselines
    block_size: int = 32  # tokens per digest block
    token_budget: int = 2048  # tokens attended per (request, layer, KV head)
    resident_blocks: int | None = None  # device buffer per (request, layer, KV head); None: topk_blocks
    sink_blocks: int = 1  # first blocks, always attended and resident
    local_blocks: int = 2  # last full blocks, always attended and resident (plus the partial tail)
    # Layers decoded with dense attention on the device, every token of the capacity held there. Layer 0 by
    # default: offloading it cost accuracy and a same-layer CPU wait (configs/default.yaml says by how much).
    dense_layers: tuple[int, ...] = (0,)
    max_cpu_blocks: int | None = None  # CPU list capacity per (request, KV head); None: topk_blocks
    max_recall_blocks: int | None = None  # blocks one (request, layer, KV head) row may recall per step; None: its buffer
    recall_policy: str = "adaptive"  # one of RECALL_POLICIES: adaptive (by recall_beta), interval (by steps), off
    recall_interval: int = 8  # steps between recalls when no per-layer interval is given
    recall_intervals: tuple[int, ...] = ()  # per-layer intervals, profiled offline (python -m scout_sglang.profiler)
    recall_beta: float = 0.12  # adaptive: a (request, layer, KV head) row recalls when its CPU blocks / selected blocks exceeds this
    # Hysteresis: a block is recalled once selected in this many consecutive steps (1: off, the default: on the
    # heavy-hitter workload 2 kept each lasting newcomer a step longer on the CPU, 12.2% CPU ratio against 10.4%;
    # on the flat one it halved recall traffic, which the brake and the cap already bound; benchmarks/results/recall.md).
    recall_min_selected: int = 1
    recall_brake: bool = True  # a row backs off while what its recalls bring in is not selected again (docs/algorithm.md)
    recall_max_backoff: int = 6  # brake levels: a row at level n recalls at most every 2^n steps, cap / 2^n blocks
    # Recall traffic per decode step, all layers together; None: recall_link_gbps x recall_link_share x the step time
    # the engine measures.
    recall_bytes_per_step: int | None = None
    recall_link_gbps: float = 25.0  # host-to-device bandwidth the cap assumes, GB/s (PCIe 4.0 x16 ~25, 5.0 ~50)
    recall_link_share: float = 0.1  # share of a step's time that recall traffic may take on that link
    layer_ahead: bool = True  # ablation switch: False launches CPU work in the same layer
    # Sparse modes: the full blocks a layer attends neither on the device nor on the CPU enter as one more partial
    # attention, each block weighed by its size and its key digest's midpoint and read as its mean value moved to
    # first order in the query, merged by LSE (docs/algorithm.md). Costs three vectors per block and KV head on the
    # device (the value summary: mean, slope, axis).
    estimate: bool = False
    # The CPU split of each layer's CPU list (scout, hgca): "off" gives it all to the CPU workers; "auto" gives them
    # what their measured rate finishes inside the layer's measured window and the rest to the device, which reads
    # those blocks from the page-locked host store itself (zero-copy, over PCIe); a number in [0, 1] gives the
    # workers that share of the list's capacity, the rest to the device (tests, benchmarks). auto starts from the
    # device's zero-copy rate timed at start-up on CUDA (else recall_link_gbps), less recall's recall_link_share,
    # then follows the rate the zero-copy reads show while serving.
    cpu_split: str = "off"
    # Resident-first serving (scout): the offloaded layers' resident blocks come from one device page pool shared by
    # the running requests, each given its share (at least resident_blocks, at most all of its blocks); a request
    # whose every block fits is attended over all of them, exactly as full attention, with no CPU part.
    resident_first: bool = False
    resident_pool_blocks: int | None = None  # the pool's pages (one block of every offloaded layer each); None: on a server the stock KV budget less scout's other device stores, else max_requests x resident_blocks
    cpu_groups: int = 0  # CPU worker threads, each pinned to a core; 0: one per physical core the core plan gives the workers
    cpu_impl: str = "auto"  # one of CPU_IMPLS: the native C++ CPU kernel, torch, or auto (native when it builds)
    kernel_impl: str | None = None  # one of KERNEL_IMPLS for the device ops; None: automatic per op and device
    extra: dict = field(default_factory=dict, compare=False, repr=False)  # preset metadata (model, profile source)

    def __post_init__(self):
        problems = self.problems()
        if problems:
            raise ValueError("invalid scout configuration:\n  - " + "\n  - ".join(problems))

    @property
    def topk_blocks(self) -> int:
        """Blocks attended per (request, layer, KV head), forced ones included."""
        return self.token_budget // self.block_size

    @property
    def resident_capacity(self) -> int:
        return self.topk_blocks if self.resident_blocks is None else self.resident_blocks

    @property
    def cpu_capacity(self) -> int:
        return self.topk_blocks if self.max_cpu_blocks is None else self.max_cpu_blocks

    @property
    def recall_quota(self) -> int:
        """Blocks one (request, layer, KV head) resident row may take in per step and phase (first fill, recall).
        By default its whole buffer; a smaller max_recall_blocks bounds the copies, and the blocks past it wait
        (on the CPU meanwhile). Per row, so a request's decisions do not depend on the batch it decodes in, except
        through scout's per-step recall cap when it binds (core/recall_budget.py splits it over the step's rows)."""
        if self.max_recall_blocks is not None:
            return min(self.max_recall_blocks, self.resident_capacity)
        return self.resident_capacity

    @property
    def cpu_split_share(self) -> float | None:
        """cpu_split as a fixed share of the CPU list's capacity, or None ("off", "auto")."""
        if self.cpu_split in ("off", "auto"):
            return None
        return float(self.cpu_split)

    def interval_for_layer(self, layer: int) -> int:
        """Recall interval of a layer: the profiled one if present, else the default."""
        if layer < len(self.recall_intervals):
            return self.recall_intervals[layer]
        return self.recall_interval

    def problems(self) -> list[str]:
        """Every reason this configuration is invalid (empty when valid)."""
        out = []
        if self.mode not in MODES:
            out.append(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.recall_policy not in RECALL_POLICIES:
            out.append(f"recall_policy must be one of {RECALL_POLICIES}, got {self.recall_policy!r}")
        if self.cpu_impl not in CPU_IMPLS:
            out.append(f"cpu_impl must be one of {CPU_IMPLS}, got {self.cpu_impl!r}")
        if self.kernel_impl not in KERNEL_IMPLS:
            out.append(f"kernel_impl must be one of {KERNEL_IMPLS}, got {self.kernel_impl!r}")
        for name in ("block_size", "token_budget", "recall_interval"):
            if getattr(self, name) < 1:
                out.append(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("sink_blocks", "local_blocks", "cpu_groups"):
            if getattr(self, name) < 0:
                out.append(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.block_size >= 1 and self.token_budget % self.block_size:
            out.append(f"token_budget ({self.token_budget}) must be a multiple of block_size ({self.block_size})")
        if self.block_size >= 1 and self.topk_blocks < self.sink_blocks + self.local_blocks:
            out.append(
                f"token_budget covers {self.topk_blocks} blocks, fewer than sink_blocks + local_blocks "
                f"({self.sink_blocks} + {self.local_blocks})"
            )
        if self.resident_first and self.mode != "scout":
            out.append(f"resident_first serves mode scout, not {self.mode!r}")
        for name in ("resident_blocks", "max_cpu_blocks", "max_recall_blocks", "resident_pool_blocks"):
            value = getattr(self, name)
            if value is not None and value < 0:
                out.append(f"{name} must be >= 0 or None, got {value}")
        if any(layer < 0 for layer in self.dense_layers):
            out.append(f"dense_layers must be layer indices >= 0, got {self.dense_layers}")
        if any(interval < 1 for interval in self.recall_intervals):
            out.append(f"recall_intervals must all be >= 1, got {self.recall_intervals}")
        if not 0.0 < self.recall_beta < 1.0:
            out.append(f"recall_beta must be in (0, 1), got {self.recall_beta}")
        if not 1 <= self.recall_min_selected <= MAX_SELECTION_RUN:
            out.append(f"recall_min_selected must be in [1, {MAX_SELECTION_RUN}], got {self.recall_min_selected}")
        if not 0 <= self.recall_max_backoff <= MAX_BACKOFF:
            out.append(f"recall_max_backoff must be in [0, {MAX_BACKOFF}], got {self.recall_max_backoff}")
        if self.cpu_split not in ("off", "auto"):
            try:
                share = float(self.cpu_split)
            except ValueError:
                share = None
            if share is None or not 0.0 <= share <= 1.0:
                out.append(f"cpu_split must be 'off', 'auto' or a share in [0, 1], got {self.cpu_split!r}")
        if self.recall_bytes_per_step is not None and self.recall_bytes_per_step < 0:
            out.append(f"recall_bytes_per_step must be >= 0 or None, got {self.recall_bytes_per_step}")
        if not self.recall_link_gbps > 0:
            out.append(f"recall_link_gbps must be > 0, got {self.recall_link_gbps}")
        if not 0.0 < self.recall_link_share <= 1.0:
            out.append(f"recall_link_share must be in (0, 1], got {self.recall_link_share}")
        return out

    def replace(self, **changes) -> ScoutConfig:
        return dataclasses.replace(self, **changes)

    def describe(self) -> str:
        """One line per setting, for the startup log."""
        fields = [f.name for f in dataclasses.fields(self) if f.name != "extra"]
        lines = [f"{name} = {getattr(self, name)!r}" for name in fields]
        lines.append(f"topk_blocks = {self.topk_blocks} (derived)")
        return "\n".join(lines)
