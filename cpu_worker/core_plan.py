"""Which cores do what in one server process, decided in one place: the CPU worker pool's threads, and the host
thread with torch's intra-op threads.

A GPU server's host thread launches the step and plans it: a worker thread spinning on its core delays the
launch of every step, and torch's intra-op threads (one per core by default) compete with the workers for the
cores they attend on. So on a GPU the rank's first physical core (all its hardware threads) is the host's, with
torch's intra-op threads limited to it, and the workers take the others. On a CPU device the host's threads are
the device: they compute the model on the CPUs SGLang binds them to (SGLANG_CPU_OMP_THREADS_BIND), and the
workers take the rank's CPUs outside that binding. Where there is nothing to split (one physical core, or a CPU
device whose binding takes every CPU) both share the rank's CPUs, and the plan says so and why. The plan is
reported in the server's /server_info ("cores"), and every benchmark prints it.

The engine applies the plan itself wherever it runs (the server, the benchmarks, the tests): `worker_cpus` pins
the pool's threads one per physical core of the workers' CPUs, and `apply_host` puts the calling (host) thread
and torch's intra-op threads on the host core on a GPU.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Iterable

from scout_sglang.cpu_worker.cpu_sets import CpuPlace, cpu_list_text, physical_cores, remember_process_cpus

logger = logging.getLogger("scout_sglang.cpu_worker")


@dataclasses.dataclass(frozen=True)
class CorePlan:
    """The rank's CPUs split between the CPU worker pool and the host.

    Parameters
    ----------
    workers : the CPUs the worker pool's threads may run on
    host : the CPUs of the host thread and torch's intra-op threads (on a CPU device: the device's threads)
    torch_threads : torch's intra-op threads to set on a GPU (0: leave torch's setting; a CPU device's is SGLang's)
    shared : the workers and the host share CPUs (nothing to split)
    why : one sentence for the log and the report
    """

    workers: tuple[int, ...]
    host: tuple[int, ...]
    torch_threads: int
    shared: bool
    why: str

    def as_report(self) -> dict:
        return {"worker_cpus": cpu_list_text(self.workers), "host_cpus": cpu_list_text(self.host),
                "torch_threads": self.torch_threads, "shared": self.shared, "why": self.why}


def plan_cores(rank_cpus: Iterable[int], *, device_is_cpu: bool, device_cpus: Iterable[int] | None = None,
               topology: dict[int, CpuPlace] | None = None) -> CorePlan:
    """Split `rank_cpus` (this rank's share of the host) between the worker pool and the host.

    device_cpus: on a CPU device, the CPUs its threads are bound to (None: unbound, every CPU of the process);
    `topology` as cpu_sets.host_topology (read from sysfs when None)."""
    rank_cpus = sorted(set(rank_cpus))
    if not rank_cpus:
        raise ValueError("a rank needs at least one CPU")
    if device_is_cpu:
        device = sorted(set(device_cpus)) if device_cpus is not None else None
        free = [cpu for cpu in rank_cpus if device is not None and cpu not in device]
        if device is None:
            return CorePlan(tuple(rank_cpus), tuple(rank_cpus), 0, True,
                            "the CPU device's threads are not bound (SGLANG_CPU_OMP_THREADS_BIND): the workers "
                            "share every CPU with them")
        if not free:
            return CorePlan(tuple(rank_cpus), tuple(device), 0, True,
                            f"the CPU device's threads are bound to every CPU of this rank ({cpu_list_text(device)}): "
                            "the workers share them; bind the device to fewer CPUs to give the workers their own")
        return CorePlan(tuple(free), tuple(device), 0, False,
                        f"the CPU device's threads on {cpu_list_text(device)}, the workers on the rank's other CPUs")
    cores = physical_cores(rank_cpus, topology)
    if len(cores) < 2:
        return CorePlan(tuple(rank_cpus), tuple(rank_cpus), 1, True,
                        "one physical core: the host thread and the workers share it")
    host, workers = cores[0], [cpu for core in cores[1:] for cpu in core]
    return CorePlan(tuple(workers), tuple(host), len(host), False,
                    f"the host thread and torch's {len(host)} intra-op thread(s) on core {cpu_list_text(host)}, "
                    f"the workers on the other {len(cores) - 1} cores")


def worker_cpus(plan: CorePlan, threads: int = 0, topology: dict[int, CpuPlace] | None = None) -> list[int]:
    """The CPU each worker thread is pinned to: one thread per physical core of `plan.workers` (on the core's
    first hardware thread: a sibling would share its caches and load ports), or `threads` threads (an explicit
    setting) round-robin over those cores."""
    firsts = [core[0] for core in physical_cores(plan.workers, topology)]
    count = threads or len(firsts)
    return [firsts[i % len(firsts)] for i in range(count)]


def apply_host(plan: CorePlan, *, device_is_cpu: bool) -> bool:
    """On a GPU: the calling thread (the host thread that plans and launches each step) on the plan's host CPUs,
    and torch's intra-op threads limited to them, off the workers' cores. A CPU device's threads are SGLang's to
    place, and a shared plan has nothing to move. Returns whether anything was applied."""
    if device_is_cpu or plan.shared:
        return False
    remember_process_cpus()  # what a later plan in this process starts from, not the host core alone
    try:
        os.sched_setaffinity(0, plan.host)
    except OSError as error:  # a container may forbid it: the workers are still pinned off the host core
        logger.warning("scout: could not put the host thread on CPUs %s: %s", cpu_list_text(plan.host), error)
    import torch

    if plan.torch_threads and torch.get_num_threads() > plan.torch_threads:
        torch.set_num_threads(plan.torch_threads)
    return True
