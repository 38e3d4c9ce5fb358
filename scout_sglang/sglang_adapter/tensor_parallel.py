"""Tensor parallelism: which rank this process is, the host CPUs its CPU worker takes, and collectives over the
ranks of the server.

With `--tp-size N`, SGLang runs N scheduler processes, each with its share of the heads and its own scout engine,
host store and CPU worker pool. The ranks on one host split its CPUs: the CPU device's thread binding when
SGLANG_CPU_OMP_THREADS_BIND gives one (SGLang's syntax, `0-3|4-7`, indexed like SGLang by the rank's device
id), else the process's CPUs cut into whole physical cores per local rank (cpu_worker/cpu_sets.py). Host
memory is shared too: SCOUT_HOST_KV_GIB is the host memory of the whole server and each local rank takes its
part, and the start-up check counts every local rank's store against the memory free on the host.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping

from scout_sglang.cpu_worker.core_plan import CorePlan, plan_cores
from scout_sglang.cpu_worker.cpu_sets import parse_cpu_list, process_cpus, rank_share

logger = logging.getLogger("scout_sglang.sglang_adapter")
OMP_BIND = "SGLANG_CPU_OMP_THREADS_BIND"


@dataclasses.dataclass(frozen=True)
class RankPlace:
    """This process among the server's: tensor-parallel rank and size, and among the processes on this host."""

    tp_rank: int = 0
    tp_size: int = 1
    local_rank: int = 0  # index of this process among the server's processes on this host (SGLang's device id)
    local_ranks: int = 1
    attn_tp_size: int = 1  # ranks the query heads are split across


def rank_place(server_args) -> RankPlace:
    """From SGLang's parallel state; a single rank where there is none (SGLang's minimal test runners)."""
    from sglang.srt.runtime_context import get_device, get_parallel

    try:
        parallel = get_parallel()
        attn_tp_size = parallel.attn_tp_size
    except Exception:  # noqa: BLE001 - no parallel state was set up
        return RankPlace()
    try:
        tp_rank, tp_size = parallel.tp_rank, parallel.tp_size
        world = parallel.dp_size * parallel.tp_size * parallel.pp_size
        gpu_id = get_device().gpu_id
    except Exception:  # noqa: BLE001 - a partial parallel state (SGLang's minimal test runners)
        return RankPlace(attn_tp_size=attn_tp_size)
    local_ranks = max(1, world // max(1, int(getattr(server_args, "nnodes", 1) or 1)))
    base, step = int(getattr(server_args, "base_gpu_id", 0) or 0), int(getattr(server_args, "gpu_id_step", 1) or 1)
    local_rank = ((gpu_id if gpu_id is not None else tp_rank) - base) // step % local_ranks
    return RankPlace(tp_rank, tp_size, local_rank, local_ranks, attn_tp_size)


def rank_cpus(place: RankPlace, device, environ: Mapping[str, str] | None = None) -> list[int] | None:
    """The CPUs this rank's CPU worker may use; None: the whole process's (one rank on the host, no binding)."""
    environ = os.environ if environ is None else environ
    bind = environ.get(OMP_BIND, "")
    process = process_cpus()
    if str(device).startswith("cpu") and bind and bind != "all":
        entries = bind.split("|")
        if place.local_rank >= len(entries):
            raise RuntimeError(f"{OMP_BIND}={bind!r} has {len(entries)} entries, none for local rank "
                               f"{place.local_rank}: give one CPU list per rank")
        cpus = sorted(set(parse_cpu_list(entries[place.local_rank])) & set(process))
        if not cpus:
            raise RuntimeError(f"{OMP_BIND} gives local rank {place.local_rank} CPUs {entries[place.local_rank]!r}, "
                               f"none of which this process may use ({', '.join(map(str, process))})")
        return cpus
    if place.local_ranks == 1:
        return None
    try:
        return rank_share(process, place.local_rank, place.local_ranks)
    except ValueError as error:
        logger.warning("scout: %s; the ranks' CPU workers share all of them", error)
        return process


def rank_core_plan(place: RankPlace, device, environ: Mapping[str, str] | None = None,
                   topology=None) -> CorePlan:
    """This rank's CPUs split between its CPU worker pool and its host (cpu_worker/core_plan.py). On a CPU device
    bound by SGLANG_CPU_OMP_THREADS_BIND, the workers take this rank's share of the process's CPUs that no rank's
    binding names (none left: they share the rank's bound CPUs, as rank_cpus gives)."""
    environ = os.environ if environ is None else environ
    device_is_cpu = str(device).startswith("cpu")
    share = rank_cpus(place, device, environ) or process_cpus()
    bind = environ.get(OMP_BIND, "")
    if not (device_is_cpu and bind and bind != "all"):
        return plan_cores(share, device_is_cpu=device_is_cpu, topology=topology)
    bound = {cpu for entry in bind.split("|") if entry.strip() for cpu in parse_cpu_list(entry)}
    free = [cpu for cpu in process_cpus() if cpu not in bound]
    try:
        extra = rank_share(free, place.local_rank, place.local_ranks, topology) if free else []
    except ValueError:  # fewer unbound cores than ranks: none of them is this rank's alone
        extra = []
    return plan_cores(share + extra, device_is_cpu=True, device_cpus=share, topology=topology)


def tp_gather(value) -> list:
    """`value` of every tensor-parallel rank, in rank order (every rank must call this at the same point);
    [value] without tensor parallelism."""
    from sglang.srt.runtime_context import get_parallel

    try:
        parallel = get_parallel()
        size, group = parallel.tp_size, parallel.tp_group.cpu_group
    except Exception:  # noqa: BLE001 - no parallel state: a single rank
        return [value]
    if size == 1:
        return [value]
    import torch.distributed as dist

    gathered = [None] * size
    dist.all_gather_object(gathered, value, group=group)
    return gathered
