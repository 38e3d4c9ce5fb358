"""The CPU part's worker seen from outside: its busy time (the seconds its threads spent attending, summed over
threads, as the worker counts them), its threads' CPU seconds (the native pool's own clock; Linux /proc, 10 ms
ticks, for the Python worker), and how many of its threads are runnable once a step is over.
"""

from __future__ import annotations

import os
from pathlib import Path


def bench_cores(device, device_threads: int | None = None):
    """A benchmark's core plan (cpu_worker/core_plan.py), the engine's own split: on CUDA the first physical core is
    the host's and the workers take the others; on the CPU device, which plays the GPU, `device_threads` CPUs
    (default half) are the device's (torch's intra-op threads and this thread are bound to them: two OpenMP
    threads and two worker threads on the same two cores made steps 10x slower and erratic in trials here) and
    the workers take the rest."""
    import torch

    from scout_sglang.cpu_worker.core_plan import plan_cores

    cpus = sorted(os.sched_getaffinity(0))
    if device.type != "cpu":
        return plan_cores(cpus, device_is_cpu=False)
    count = device_threads or max(1, len(cpus) // 2)
    device_cpus = cpus[:count] if len(cpus) > 1 else cpus
    os.sched_setaffinity(0, device_cpus)
    torch.set_num_threads(len(device_cpus))
    return plan_cores(cpus, device_is_cpu=True, device_cpus=device_cpus)


def make_worker(threads: int, impl: str, *, device, cores, kernel_impl: str | None = None):
    """The worker an engine of this benchmark hands its CPU parts to, with the benchmark's core plan applied
    (cpu_worker/factory.py: the engine's own way): the native pool (C++ threads, one pinned per physical core of
    the plan's workers, or `threads` of them) unless impl is torch or it does not build here, else the Python
    reference worker."""
    from scout_sglang.cpu_worker.factory import make_worker as make_cpu_worker

    rings_from_host = device.type != "cuda" and kernel_impl != "triton"
    worker, _ = make_cpu_worker(device_is_cpu=device.type == "cpu", rings_from_host=rings_from_host,
                                threads=threads, impl=impl, cores=cores)
    return worker


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
        """CPU seconds consumed so far by the worker's threads: the native pool's per-thread clocks (exact), else
        Linux /proc (10 ms ticks)."""
        if hasattr(self.worker, "cpu_s"):
            return self.worker.cpu_s
        tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        total = 0
        try:
            for tid in self.worker.thread_ids():
                fields = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
                total += int(fields[11]) + int(fields[12])  # utime, stime
        except (OSError, IndexError, ValueError):
            return None
        return total / tick

    def runnable_threads(self) -> int:
        """Threads of the worker that are runnable now (state R in /proc): 0 once a step's parts are done."""
        count = 0
        for tid in self.worker.thread_ids():
            try:
                stat = Path(f"/proc/self/task/{tid}/stat").read_text()
            except OSError:  # the thread ended
                continue
            count += stat[stat.rindex(")") + 2] == "R"
        return count

    def shutdown(self):
        self.worker.shutdown()

    def __repr__(self) -> str:
        return f"{type(self.worker).__name__}(threads={self.num_threads})"
