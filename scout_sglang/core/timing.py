"""Section timers of a decode step: wall clock on the CPU, CUDA events on a GPU.

On a GPU, device work is queued, so reading a host clock around it measures
the launch, not the work. There each section records a pair of CUDA events on
the current stream, and `resolve` (once per step, at its end) waits for the
last of them and adds the elapsed times to the step's telemetry.
"""

from __future__ import annotations

import time
from contextlib import contextmanager

import torch


class SectionTimer:
    def __init__(self, device: torch.device):
        self.on_cuda = torch.device(device).type == "cuda"
        self._pending: list[tuple[str, object, object]] = []

    @contextmanager
    def section(self, telemetry, key: str):
        """Time the enclosed device work under `key` of telemetry.timings (seconds)."""
        if not self.on_cuda:
            start = time.perf_counter()
            yield
            telemetry.add_time(key, time.perf_counter() - start)
            return
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        yield
        end.record()
        self._pending.append((key, start, end))

    def resolve(self, telemetry) -> None:
        """Add the CUDA sections of the step to telemetry (waits for the last one to finish)."""
        if self._pending:
            self._pending[-1][2].synchronize()
        for key, start, end in self._pending:
            telemetry.add_time(key, start.elapsed_time(end) / 1e3)
        self._pending.clear()
