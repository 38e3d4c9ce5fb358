"""The CPU attention worker seen from outside: a CpuAttentionPool wrapper that
records when each submit's tasks finish (wall time the worker was busy) and
reads the worker threads' CPU seconds from /proc.
"""

from __future__ import annotations

import math
import os
import queue
import threading
import time
from pathlib import Path


class WatchedPool:
    """A CpuAttentionPool seen through its public submit / wait, with finish times.

    A watcher thread waits on every handle in submit order (the pool serves
    one FIFO queue) and records (submitted, finished) wall times; the union of
    those spans is the time the CPU worker had work outstanding.
    """

    def __init__(self, pool):
        self.pool = pool
        self._pending: queue.SimpleQueue = queue.SimpleQueue()
        self._spans: list[tuple[float, float]] = []
        self._lock = threading.Lock()
        self._submitted = 0
        self._finished = 0
        self._thread = threading.Thread(target=self._watch, name="bench-cpu-watch", daemon=True)
        self._thread.start()

    def submit(self, *args, **kwargs):
        start = time.perf_counter()
        handle = self.pool.submit(*args, **kwargs)
        self._submitted += 1
        self._pending.put((handle, start))
        return handle

    def wait(self, handle, timeout=None):
        self.pool.wait(handle, timeout)

    def _watch(self):
        while (item := self._pending.get()) is not None:
            handle, start = item
            try:
                self.pool.wait(handle)
            except Exception:  # noqa: BLE001 - the engine's own wait reports failures
                pass
            with self._lock:
                self._spans.append((start, time.perf_counter()))
                self._finished += 1

    def take_busy_s(self) -> float:
        """Seconds covered by the spans of every submit so far (then forgets them)."""
        while True:
            with self._lock:
                if self._finished >= self._submitted:
                    spans, self._spans = sorted(self._spans), []
                    break
            time.sleep(1e-4)
        busy, end = 0.0, -math.inf
        for start, finish in spans:
            if finish > end:
                busy += finish - max(start, end)
                end = finish
        return busy

    def thread_cpu_s(self) -> float | None:
        """CPU seconds consumed so far by the pool's worker threads (Linux /proc; 10 ms ticks)."""
        tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        total = 0
        try:
            for thread in self.pool.threads:
                fields = Path(f"/proc/self/task/{thread.native_id}/stat").read_text().rsplit(")", 1)[1].split()
                total += int(fields[11]) + int(fields[12])  # utime, stime
        except (OSError, IndexError, ValueError):
            return None
        return total / tick

    def shutdown(self):
        self._pending.put(None)
        self._thread.join()
        self.pool.shutdown()
