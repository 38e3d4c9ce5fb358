"""Co-attention statistics accumulated over a server's decode steps.

The backend adds every step's telemetry; `report()` is what the server exposes
(under "scout" in each entry of `/server_info`'s "internal_states") and what
the main job prints: CPU compute ratio, recalls (and, over the recent steps, the
CPU ratio, recall bytes against their cap and the brake's share), the CPU split
(per recent step: bytes on the CPU, bytes the device read over PCIe, the wait), CPU wait, CPU
parts the layers computed themselves (by cause), predicted-query cosine, and the
engine's current page usage.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import torch

from scout_sglang.core.cpu_handoff import FALLBACK_CAUSES

COUNTERS = ("selected_blocks", "cpu_blocks", "dropped_blocks", "budget_blocks", "recalled_blocks", "recall_bytes",
            "withheld_blocks", "backed_off_rows", "recall_rows", "zero_copy_blocks", "cpu_bytes", "zero_copy_bytes")
RECENT = 64  # telemetry collections the "recall" section looks back over (one per step, or per 0.5 s replayed)


@dataclass
class ServingStats:
    decode_steps: int = 0
    decoded_tokens: int = 0  # requests x steps
    counters: dict = field(default_factory=lambda: dict.fromkeys(COUNTERS, 0))
    cpu_wait_s: float = 0.0
    layers_launched_ahead: int = 0
    layers_with_cpu_work: int = 0
    timings: dict = field(default_factory=dict)
    cosine_sum: object = 0.0  # a 0-dim fp64 tensor on the queries' device once a cosine is added
    cosine_count: int = 0
    admitted_requests: int = 0
    released_requests: int = 0
    prefix_hits: int = 0  # requests admitted with a cached prefix (radix cache)
    prefix_tokens: int = 0  # prompt tokens those requests did not prefill
    max_batch_size: int = 0  # most requests decoded together in one step
    cpu_fallbacks: dict = field(default_factory=lambda: dict.fromkeys(FALLBACK_CAUSES, 0))  # cause -> layers
    recent: deque = field(default_factory=lambda: deque(maxlen=RECENT))  # per collection: _recent_entry

    def add_step(self, telemetry) -> None:
        self.decode_steps += telemetry.steps
        self.decoded_tokens += telemetry.decoded_tokens
        self.max_batch_size = max(self.max_batch_size, telemetry.batch_size)
        for stats in telemetry.layers.values():
            for name in COUNTERS:
                self.counters[name] += getattr(stats, name)
            self.cpu_wait_s += stats.cpu_wait_s
            if stats.cpu_blocks:
                self.layers_with_cpu_work += 1
                self.layers_launched_ahead += int(stats.cpu_launched_ahead)
        self.recent.append(_recent_entry(telemetry))
        for key, seconds in telemetry.timings.items():
            self.timings[key] = self.timings.get(key, 0.0) + seconds
        for cause, count in telemetry.cpu_fallbacks.items():
            self.cpu_fallbacks[cause] = self.cpu_fallbacks.get(cause, 0) + count

    def add_prefix_hit(self, tokens: int) -> None:
        """A request admitted with a cached prefix of `tokens` tokens, which it does not prefill."""
        self.prefix_hits += 1
        self.prefix_tokens += tokens

    def add_cosines(self, values) -> None:
        """Adds one layer's cosines [B] inside the layer loop without reading them: the sum stays on their
        device (a read here would be a device sync every layer) until a report reads it once."""
        self.cosine_sum = values.sum(dtype=torch.float64) + self.cosine_sum
        self.cosine_count += values.numel()

    def report(self, usage: dict) -> dict:
        budget = self.counters["budget_blocks"]
        return {
            "decode_steps": self.decode_steps,
            "decoded_tokens": self.decoded_tokens,
            "max_batch_size": self.max_batch_size,
            "cpu_ratio": round(self.counters["cpu_blocks"] / budget, 4) if budget else 0.0,
            "cpu_blocks": self.counters["cpu_blocks"],
            "selected_blocks": self.counters["selected_blocks"],
            "dropped_blocks": self.counters["dropped_blocks"],
            "recalled_blocks": self.counters["recalled_blocks"],
            "recall_mib": round(self.counters["recall_bytes"] / 2**20, 3),
            "recall": self.recall_report(),
            "cpu_split": self.split_report(),
            "cpu_wait_ms": round(1e3 * self.cpu_wait_s, 3),
            "cpu_fallbacks": dict(self.cpu_fallbacks),
            "cpu_launched_ahead_fraction": (round(self.layers_launched_ahead / self.layers_with_cpu_work, 4)
                                            if self.layers_with_cpu_work else 0.0),
            "predicted_query_cosine": (round(float(self.cosine_sum) / self.cosine_count, 6)
                                       if self.cosine_count else None),
            "predicted_queries": self.cosine_count,
            "admitted_requests": self.admitted_requests,
            "released_requests": self.released_requests,
            "prefix": {"hits": self.prefix_hits, "prefill_tokens_saved": self.prefix_tokens},
            "timings_ms": {key: round(1e3 * value, 3) for key, value in sorted(self.timings.items())},
            "usage": usage,
        }

    def recall_report(self) -> dict:
        """Recall over the recent steps, where an operator sees thrash: the CPU ratio now, the bytes recall moved
        per step against its cap, and the share of rows its brake holds back."""
        totals = self._recent_totals()
        steps = totals["steps"]
        return {
            "recent_steps": steps,
            "recent_cpu_ratio": round(totals["cpu_blocks"] / totals["budget_blocks"], 4) if totals["budget_blocks"]
            else 0.0,
            "bytes_per_step": round(totals["recall_bytes"] / steps) if steps else 0,
            "cap_bytes_per_step": round(totals["recall_cap_bytes"] / steps) if steps else 0,
            "withheld_blocks_per_step": round(totals["withheld_blocks"] / steps, 2) if steps else 0.0,
            "backed_off_fraction": round(totals["backed_off_rows"] / totals["recall_rows"], 4)
            if totals["recall_rows"] else 0.0,
        }


    def split_report(self) -> dict:
        """Where the off-device blocks went over the recent steps (the CPU split, core/cpu_split.py), per step: the
        bytes the CPU workers read, the bytes the device read from the host store over PCIe (zero-copy) and moved
        by recall, the time the device waited for the CPU part and the time of its zero-copy reads."""
        totals = self._recent_totals()
        steps = totals["steps"]

        def per_step(value, digits=0):
            return round(value / steps, digits) if steps else 0

        return {
            "recent_steps": steps,
            "cpu_bytes_per_step": per_step(totals["cpu_bytes"]),
            "zero_copy_bytes_per_step": per_step(totals["zero_copy_bytes"]),
            "pcie_bytes_per_step": per_step(totals["zero_copy_bytes"] + totals["recall_bytes"]),
            "cpu_wait_ms_per_step": per_step(1e3 * totals["cpu_wait_s"], 4),
            "zero_copy_ms_per_step": per_step(1e3 * totals["zero_copy_s"], 4),
        }

    def recent_exact_share(self) -> float:
        """Resident-first: the share of the recent steps' decoded tokens whose request was attended exactly."""
        totals = self._recent_totals()
        return round(totals["exact_requests"] / totals["decoded_tokens"], 4) if totals["decoded_tokens"] else 0.0

    def recent_exact_path_share(self) -> float:
        """Resident-first: the share of the recent steps that ran the exact path (every request exact, settled)."""
        totals = self._recent_totals()
        return round(totals["exact_path_steps"] / totals["steps"], 4) if totals["steps"] else 0.0

    def _recent_totals(self) -> dict:
        totals = dict.fromkeys(_RECENT_FIELDS, 0)
        for entry in self.recent:
            for name, value in entry.items():
                totals[name] += value
        return totals


_RECENT_FIELDS = ("steps", "cpu_blocks", "budget_blocks", "recall_bytes", "recall_cap_bytes", "withheld_blocks",
                  "backed_off_rows", "recall_rows", "cpu_bytes", "zero_copy_bytes", "cpu_wait_s",
                  "zero_copy_s", "exact_requests", "decoded_tokens", "exact_path_steps")


def _recent_entry(telemetry) -> dict:
    total = telemetry.totals()
    entry = {name: getattr(total, name) for name in _RECENT_FIELDS if hasattr(total, name)}
    entry.update(steps=telemetry.steps, recall_cap_bytes=telemetry.recall_cap_bytes,
                 exact_requests=telemetry.exact_requests, decoded_tokens=telemetry.decoded_tokens,
                 exact_path_steps=telemetry.exact_path_steps)
    return entry
