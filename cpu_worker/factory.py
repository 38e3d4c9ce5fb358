"""make_worker: the CPU part's worker with its cores, the one place that builds it for the engine, the server,
the benchmarks and the tests.

digest -> select -> split -> device part / **CPU part** -> merge. The core plan
(core_plan.py) splits the CPUs between the host and the workers; this applies
it: the native pool's threads pinned one per physical core of the workers'
CPUs, and on a GPU the calling (host) thread and torch's intra-op threads on the
host core. The threads spin for a grace after a step's last part where a GPU
rings them (its next ring comes without a host call), and not at all where every
ring is a host call (the CPU device's torch path: the host kicks them).
"""

from __future__ import annotations

import logging

from scout_sglang.cpu_worker.core_plan import CorePlan, apply_host, plan_cores, worker_cpus
from scout_sglang.cpu_worker.cpu_sets import cpu_list_text, process_cpus

logger = logging.getLogger("scout_sglang.cpu_worker")


def default_cores(device_is_cpu: bool) -> CorePlan:
    """The plan of a process that was given no rank share: its own CPUs (the server passes its rank's plan)."""
    return plan_cores(process_cpus(), device_is_cpu=device_is_cpu)


def make_worker(*, device_is_cpu: bool, rings_from_host: bool, threads: int = 0, impl: str = "auto",
                cores: CorePlan | None = None, faults=None):
    """The native pool (C++ threads, no GIL) unless `impl` is "torch" or it cannot be built here, then the Python
    reference worker; -> (worker, the core plan applied).

    threads : 0 for one per physical core of the plan's worker CPUs, else that many (round-robin over them)
    rings_from_host : every ring is a host call (kick): the threads park at once after a part
    faults : a FaultPlan (tests only) or None
    """
    from scout_sglang.cpu_worker import native_pool
    from scout_sglang.cpu_worker.flag_worker import FlagWorker

    cores = cores or default_cores(device_is_cpu)
    cpus = worker_cpus(cores, threads)
    applied = apply_host(cores, device_is_cpu=device_is_cpu)
    logger.info("scout: cores: %s; %d CPU worker thread(s) pinned to CPUs %s%s", cores.why, len(cpus),
                cpu_list_text(cpus), "; host thread and torch's threads moved to the host core" if applied else "")
    grace = 0.0 if rings_from_host else native_pool.GRACE_S
    if impl != "torch" and native_pool.available():
        return native_pool.NativeWorkerPool(threads=len(cpus), cpus=cpus, pin=True, faults=faults,
                                            grace_s=grace), cores
    if impl == "native":
        raise RuntimeError("cpu_impl='native' was requested but the native CPU worker pool does not build here")
    return FlagWorker(threads=len(cpus), impl=impl, cpus=cpus, pin=True, faults=faults), cores
