"""The CPU split's caps: how many of each layer's CPU-list blocks the CPU workers take, the rest the device reads.

digest -> select -> **split** -> device part / CPU part (workers + zero-copy) -> merge.
A layer's CPU part runs on the workers one layer ahead, inside a window: the
device's work between the layer's ring and its wait. When the part takes longer
than that, the device waits. The split stage (kernels/stage_split.py) gives the
workers the first `cap` entries of each (row, KV head) list and the device the
rest, which it attends straight from the page-locked host store (zero-copy over
PCIe, core/layer_stages.py). The cap of each offloaded layer is data in the
step plan, never a shape, so a captured graph replays every cap.

    off      no split: the workers take every listed block (today's behaviour)
    share s  the workers take round(s x C) entries per row (C: the list's capacity), for tests and benchmarks
    auto     from the telemetry read once per step, per layer: the listed bytes B, the window W (the ring-to-wait
             time) and the wait; the workers' rate c, a moving estimate from the steps the device waited (the part
             then took W + wait) and a lower bound B_cpu / W from the ones it did not; the zero-copy rate p, the
             link rate less the share recall may take of it (they share the link): on CUDA timed once at
             start-up (zero_copy_rate.py), elsewhere the configured recall_link_gbps; then, while serving, a
             moving estimate of the zero-copy reads' own rate (their bytes over their time, from every step
             whose reads took at least MIN_LINK_SAMPLE_S: shorter ones measure latency, not the link). The
             workers' share of the bytes:
                 s = 1                          while B / c fits in W (no zero-copy read at all)
                 s = max(c W / B, c / (c + p))  else: what fits in the window, and never less than the share that
                                                balances both paths when neither fits
             cap = ceil(s x the mean listed entries per (row, KV head)), C when s = 1. A step in which the
             workers finished inside the window also raises the cap by one block (up to C): the rate it shows is
             only a lower bound, so the cap probes upward until a wait measures the rate again. Until a layer has a rate,
             the workers take everything (the start-up default: today's behaviour, said by `source`). Without a
             worker, or in a step the health circuit bypasses it (cpu_health.py), the device reads every block
             itself (cap 0): on its side stream that overlaps, where the fallback after the wait would not.
"""

from __future__ import annotations

import math

# A wait shorter than this (per step) is noise, not a part that overran its window.
MIN_WAIT_S = 20e-6
RATE_SMOOTHING = 0.5  # weight of the newest measurement in the moving estimates of both rates
MIN_LINK_SAMPLE_S = 50e-6  # per step and layer: zero-copy reads shorter than this do not update the link rate


class CpuSplit:
    """Per-layer caps of the CPU split (module docstring).

    Parameters
    ----------
    setting : the configuration's cpu_split: "auto" or a share in [0, 1] ("off" makes no CpuSplit)
    layers : the offloaded layers with a CPU part, in order
    capacity : C, the CPU list's capacity per (row, KV head)
    block_bytes : K + V bytes of one block of one KV head
    link_gbs : the zero-copy read rate assumed, GB/s; link_source : where it comes from (said by describe())
    workers : whether a CPU worker takes parts at all
    """

    def __init__(self, setting: str, *, layers, capacity: int, block_bytes: int, link_gbs: float,
                 link_source: str = "configured", workers: bool = True):
        self.layers, self.workers, self.link_source = tuple(layers), workers, link_source
        self.capacity, self.block_bytes, self.link_bps = capacity, block_bytes, link_gbs * 1e9
        self.share = None if setting == "auto" else float(setting)
        cap = self.capacity if self.share is None else round(self.share * capacity)
        self.caps = {layer: cap for layer in self.layers}
        self.cpu_bps: dict[int, float] = {}  # the workers' measured rate, per layer
        self.source = "fixed share" if self.share is not None else "start-up: every block to the workers"

    def step_caps(self, *, bypass: bool = False) -> list[int]:
        """The caps of the next step, one per layer (the step plan's cpu_cap columns); bypass: the step gives the
        worker no part."""
        if self.share is None and (bypass or not self.workers):
            return [0] * len(self.layers)
        return [self.caps[layer] for layer in self.layers]

    def observe(self, layer: int, *, cpu_blocks: int, zero_copy_blocks: int, rows: int, steps: int, window_s: float,
                wait_s: float, zero_copy_s: float = 0.0) -> None:
        """One layer's telemetry over `steps` steps and `rows` (row, KV head) lists in all: the blocks each share
        took, the windows, the waits and the zero-copy reads' time, summed over those steps. auto: update the
        rates and the cap."""
        if self.share is not None or rows <= 0 or window_s <= 0:
            return
        if zero_copy_blocks and zero_copy_s >= MIN_LINK_SAMPLE_S * steps:
            measured = zero_copy_blocks * self.block_bytes / zero_copy_s
            self.link_bps = RATE_SMOOTHING * measured + (1 - RATE_SMOOTHING) * self.link_bps
            self.link_source = "measured while serving: the zero-copy reads' own rate"
        cpu_bytes = cpu_blocks * self.block_bytes
        waited = wait_s > MIN_WAIT_S * steps
        if cpu_bytes:
            if waited:  # the part ended with the wait: its rate
                measured = cpu_bytes / (window_s + wait_s)
                known = self.cpu_bps.get(layer)
                self.cpu_bps[layer] = measured if known is None else (
                    RATE_SMOOTHING * measured + (1 - RATE_SMOOTHING) * known)
            elif layer in self.cpu_bps:  # done inside the window: at least this fast
                self.cpu_bps[layer] = max(self.cpu_bps[layer], cpu_bytes / window_s)
        rate = self.cpu_bps.get(layer)
        if rate is None:
            return
        listed = cpu_blocks + zero_copy_blocks
        share = workers_share(listed * self.block_bytes, window_s, rate, self.link_bps)
        cap = self.capacity if share >= 1.0 else min(self.capacity, math.ceil(share * listed / rows))
        if not waited:  # inside the window: probe one block further
            cap = max(cap, min(self.caps[layer] + 1, self.capacity))
        self.caps[layer] = cap
        self.source = "measured: the workers' rate and each layer's window"

    def describe(self) -> dict:
        return {"setting": "auto" if self.share is None else self.share, "source": self.source,
                "caps": dict(self.caps), "cpu_gbs": {layer: round(rate / 1e9, 2) for layer, rate in self.cpu_bps.items()},
                "link_gbs": round(self.link_bps / 1e9, 2), "link_source": self.link_source}


def workers_share(listed_bytes: float, window_s: float, cpu_bps: float, link_bps: float) -> float:
    """The workers' share of a layer's listed bytes (module docstring): 1 while they finish inside the window;
    else what fits in it, never below the share that balances the two paths."""
    if listed_bytes <= 0 or listed_bytes / cpu_bps <= window_s:
        return 1.0
    return max(cpu_bps * window_s / listed_bytes, cpu_bps / (cpu_bps + link_bps))
