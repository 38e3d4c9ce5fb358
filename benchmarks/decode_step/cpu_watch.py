"""The CPU part's worker seen from outside: its busy time (the seconds its threads spent attending, summed over
threads, as the worker counts them) and its threads' CPU seconds (Linux /proc, 10 ms ticks).
"""

from __future__ import annotations

import os
from pathlib import Path


def make_worker(threads: int, impl: str):
    """The worker an engine of this benchmark hands its CPU parts to: the native pool (C++ threads) unless impl
    is torch or it does not build here, else the Python reference worker."""
    from scout_sglang.cpu_worker import native_pool
    from scout_sglang.cpu_worker.flag_worker import FlagWorker

    if impl != "torch" and native_pool.available():
        return native_pool.NativeWorkerPool(threads=threads)
    return FlagWorker(threads=threads, impl=impl)


class WatchedWorker:
    """A worker shared by the engines of one run group, with its busy time and CPU seconds per step."""

    def __init__(self, worker):
        self.worker = worker
        self._busy_mark = worker.busy_s

    @property
    def num_threads(self) -> int:
        return len(self.worker.threads)

    def take_busy_s(self) -> float:
        """Seconds the worker's threads spent attending since the last call (summed over threads)."""
        busy = self.worker.busy_s
        delta, self._busy_mark = busy - self._busy_mark, busy
        return delta

    def thread_cpu_s(self) -> float | None:
        """CPU seconds consumed so far by the worker's threads (Linux /proc; 10 ms ticks)."""
        tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        total = 0
        try:
            for tid in self.worker.thread_ids():
                fields = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
                total += int(fields[11]) + int(fields[12])  # utime, stime
        except (OSError, IndexError, ValueError):
            return None
        return total / tick

    def shutdown(self):
        self.worker.shutdown()

    def __repr__(self) -> str:
        return f"{type(self.worker).__name__}(threads={self.num_threads})"
