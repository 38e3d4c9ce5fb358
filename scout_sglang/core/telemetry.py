"""Co-attention telemetry: what each decode step did, per layer.

One structured object per step. Collection costs a few integer additions per
(layer, request) when enabled and nothing when disabled; the block change rate
needs the previous selection and is computed only when enabled.
"""

from __future__ import annotations

from dataclasses import dataclass, field


TOTALLED = ("selected_blocks", "cpu_blocks", "dropped_blocks", "budget_blocks", "recalled_blocks", "recall_bytes",
            "changed_blocks", "compared_blocks", "withheld_blocks", "backed_off_rows", "recall_rows", "zero_copy_blocks",
            "cpu_bytes", "zero_copy_bytes", "bad_pages")


@dataclass
class LayerStats:
    """Counts summed over the requests (and KV heads) of one layer in one step."""

    selected_blocks: int = 0  # blocks selected (top-k), summed over requests and KV heads
    cpu_blocks: int = 0  # of those, attended on the CPU
    zero_copy_blocks: int = 0  # of those, read by the device from the host store (the CPU split's other share)
    cpu_bytes: int = 0  # K/V bytes the CPU workers read (cpu_blocks x block bytes)
    zero_copy_bytes: int = 0  # K/V bytes the device read from the host store over PCIe
    bad_pages: int = 0  # CPU-list entries whose host page lay outside the host store (stage_split: read as page 0)
    dropped_blocks: int = 0  # non-resident selected blocks past the CPU list capacity
    budget_blocks: int = 0  # topk_blocks * KV heads * requests: the denominator of the CPU ratio
    recalled_blocks: int = 0  # (block, KV head) pairs copied host -> device by recall
    recall_bytes: int = 0
    changed_blocks: int = 0  # selected blocks not selected in the previous step
    compared_blocks: int = 0  # selected blocks that had a previous step to compare with
    withheld_blocks: int = 0  # recall candidates kept on the CPU by the hysteresis (kernels.recall_brake)
    backed_off_rows: int = 0  # (request, KV head) rows whose recall was backed off (brake level above 0)
    recall_rows: int = 0  # (request, KV head) rows that went through recall: backed_off_rows' denominator
    cpu_wait_s: float = 0.0  # time the device side waited for the CPU result
    cpu_window_s: float = 0.0  # time from the CPU part's ring to its wait: the device work it overlapped
    zero_copy_s: float = 0.0  # time of the device's zero-copy reads (the CPU split's other share)
    cpu_launched_ahead: bool = False  # CPU work of this layer was launched one layer earlier

    @property
    def cpu_ratio(self) -> float:
        """CPU tokens / budget tokens (the paper's CPU compute ratio)."""
        return self.cpu_blocks / self.budget_blocks if self.budget_blocks else 0.0

    @property
    def change_rate(self) -> float:
        return self.changed_blocks / self.compared_blocks if self.compared_blocks else 0.0


@dataclass
class StepTelemetry:
    """One decode step: per-layer stats plus step-level timings (seconds)."""

    step: int
    batch_size: int  # requests of the step (the most of any step it covers)
    layers: dict[int, LayerStats] = field(default_factory=dict)
    steps: int = 0  # decode steps it covers: 1, or more when read after several replayed graph steps
    decoded_tokens: int = 0  # requests x steps
    timings: dict[str, float] = field(default_factory=dict)  # device_attention, cpu_attention, cpu_wait, merge, recall, select
    cpu_fallbacks: dict[str, int] = field(default_factory=dict)  # cause -> layers whose CPU part the layer computed
    bad_page_requests: dict[int, str] = field(default_factory=dict)  # request slot -> the bad host page found in its lists
    recall_cap_bytes: int = 0  # the recall cap of the steps it covers, summed (core/recall_budget.py)
    exact_requests: int = 0  # resident-first: requests attended over every block, summed over the steps it covers
    pool_pages_used: int = 0  # resident-first: pages of the resident pool held at its last step (core/resident_pool.py)
    worker_free_steps: int = 0  # resident-first: steps whose requests were all exact, the workers left asleep
    exact_path_steps: int = 0  # resident-first: steps on the exact path (every request exact, its row filled)
    planned_device_only_steps: int = 0  # all-exact steps on the selecting path: a device-only part per CPU layer

    def layer(self, index: int) -> LayerStats:
        return self.layers.setdefault(index, LayerStats())

    def count_fallback(self, cause: str) -> None:
        self.cpu_fallbacks[cause] = self.cpu_fallbacks.get(cause, 0) + 1

    def add_time(self, key: str, seconds: float) -> None:
        self.timings[key] = self.timings.get(key, 0.0) + seconds

    def totals(self) -> LayerStats:
        total = LayerStats()
        for stats in self.layers.values():
            for name in TOTALLED:
                setattr(total, name, getattr(total, name) + getattr(stats, name))
            total.cpu_wait_s += stats.cpu_wait_s
            total.cpu_window_s += stats.cpu_window_s
            total.zero_copy_s += stats.zero_copy_s
        return total

    def summary(self) -> dict:
        total = self.totals()
        return {
            "step": self.step,
            "batch_size": self.batch_size,
            "cpu_ratio": round(total.cpu_ratio, 4),
            "change_rate": round(total.change_rate, 4),
            "cpu_blocks": total.cpu_blocks,
            "zero_copy_blocks": total.zero_copy_blocks,
            "cpu_bytes": total.cpu_bytes,
            "zero_copy_bytes": total.zero_copy_bytes,
            "recalled_blocks": total.recalled_blocks,
            "recall_bytes": total.recall_bytes,
            "recall_cap_bytes": self.recall_cap_bytes,
            "exact_requests": self.exact_requests,
            "exact_path_steps": self.exact_path_steps,
            "pool_pages_used": self.pool_pages_used,
            "withheld_blocks": total.withheld_blocks,
            "backed_off_rows": total.backed_off_rows,
            "cpu_wait_ms": round(1e3 * total.cpu_wait_s, 3),
            "zero_copy_ms": round(1e3 * total.zero_copy_s, 3),
            "cpu_fallbacks": dict(sorted(self.cpu_fallbacks.items())),
            **{f"{k}_ms": round(1e3 * v, 3) for k, v in sorted(self.timings.items())},
        }
