"""Which CPUs a worker pool may use: CPU lists, the host's core topology, and one rank's share.

Several processes of one server run on a host (tensor-parallel ranks, data-parallel
replicas): each has its own CPU worker pool, and pools that take the same cores slow
each other down. `rank_share` gives each local rank a disjoint set of whole physical
cores (all hardware threads of a core go to the same rank), filled NUMA node by
node, so that a rank's cores sit on as few nodes as possible.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable
from pathlib import Path

SYS_CPU = Path("/sys/devices/system/cpu")
SYS_NODE = Path("/sys/devices/system/node")


def parse_cpu_list(text: str) -> list[int]:
    """'0-3,8,10-11' (the kernel's and SGLANG_CPU_OMP_THREADS_BIND's syntax) -> [0, 1, 2, 3, 8, 10, 11]."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        low, _, high = part.partition("-")
        try:
            first, last = int(low), int(high or low)
        except ValueError:
            raise ValueError(f"bad CPU list {text!r}: expected numbers and ranges such as 0-3,8") from None
        if first < 0 or last < first:
            raise ValueError(f"bad CPU list {text!r}: range {part!r} is empty or negative")
        cpus.extend(range(first, last + 1))
    if not cpus:
        raise ValueError(f"bad CPU list {text!r}: it names no CPU")
    return sorted(set(cpus))


def cpu_list_text(cpus: Iterable[int]) -> str:
    """[0, 1, 2, 3, 8] -> '0-3,8'."""
    ranges: list[list[int]] = []
    for cpu in sorted(set(cpus)):
        if ranges and cpu == ranges[-1][1] + 1:
            ranges[-1][1] = cpu
        else:
            ranges.append([cpu, cpu])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in ranges)


@dataclasses.dataclass(frozen=True)
class CpuPlace:
    """Where a logical CPU sits: NUMA node, package (socket) and physical core within it."""

    node: int
    package: int
    core: int


def alone(cpu: int) -> CpuPlace:
    """The place of a CPU whose topology is unknown: a core of its own on node 0, in CPU order."""
    return CpuPlace(0, -1, (1 << 20) + cpu)


def host_topology(cpus: Iterable[int], sys_cpu: Path = SYS_CPU, sys_node: Path = SYS_NODE) -> dict[int, CpuPlace]:
    """CpuPlace of each CPU from sysfs; a CPU whose files cannot be read is a core of its own on node 0."""
    node_of: dict[int, int] = {}
    for node_dir in sorted(sys_node.glob("node[0-9]*")):
        try:
            for cpu in parse_cpu_list((node_dir / "cpulist").read_text()):
                node_of[cpu] = int(node_dir.name[4:])
        except (OSError, ValueError):
            continue
    places = {}
    for cpu in cpus:
        topology = sys_cpu / f"cpu{cpu}" / "topology"
        try:
            package = int((topology / "physical_package_id").read_text())
            core = int((topology / "core_id").read_text())
        except (OSError, ValueError):
            places[cpu] = dataclasses.replace(alone(cpu), node=node_of.get(cpu, 0))
            continue
        places[cpu] = CpuPlace(node_of.get(cpu, 0), package, core)
    return places


def rank_share(cpus: Iterable[int], local_rank: int, local_ranks: int,
               topology: dict[int, CpuPlace] | None = None) -> list[int]:
    """The CPUs of `cpus` that local rank `local_rank` of `local_ranks` takes: whole physical cores, ordered by
    NUMA node then core, cut into `local_ranks` runs as even as whole cores allow (the first ranks get one core
    more when they do not divide). Raises ValueError when there are fewer cores than ranks."""
    cpus = sorted(set(cpus))
    if not 0 <= local_rank < local_ranks:
        raise ValueError(f"local rank {local_rank} is not in 0..{local_ranks - 1}")
    if local_ranks == 1:
        return cpus
    ordered = physical_cores(cpus, topology)
    if len(ordered) < local_ranks:
        raise ValueError(f"{local_ranks} ranks on this host share {len(ordered)} physical cores "
                         f"(CPUs {cpu_list_text(cpus)}): each rank's CPU worker needs at least one core of its own")
    base, extra = divmod(len(ordered), local_ranks)
    start = local_rank * base + min(local_rank, extra)
    mine = ordered[start:start + base + (1 if local_rank < extra else 0)]
    return sorted(cpu for core in mine for cpu in core)


def physical_cores(cpus: Iterable[int], topology: dict[int, CpuPlace] | None = None) -> list[list[int]]:
    """`cpus` grouped by physical core (a core's hardware threads together), ordered by NUMA node, package and
    core; `topology` from host_topology (read from sysfs when None)."""
    cpus = sorted(set(cpus))
    topology = topology if topology is not None else host_topology(cpus)
    cores: dict[tuple[int, int, int], list[int]] = {}
    for cpu in cpus:
        place = topology.get(cpu) or alone(cpu)
        cores.setdefault((place.node, place.package, place.core), []).append(cpu)
    return [cores[key] for key in sorted(cores)]


def cpus_of_threads(threads: Iterable) -> list[int]:
    """The CPUs the live ones of these Python threads may run on, read back from the OS."""
    cpus: set[int] = set()
    for thread in threads:
        if thread.is_alive() and thread.native_id is not None and hasattr(os, "sched_getaffinity"):
            try:
                cpus |= os.sched_getaffinity(thread.native_id)
            except OSError:  # the thread ended in between
                continue
    return sorted(cpus)


_process_cpus: list[int] | None = None  # the calling thread's CPUs before a core plan moved it (remember_...)


def process_cpus() -> list[int]:
    """The CPUs this process may run on: the calling thread's, or what they were before a core plan put the host
    thread on its host core (a second engine in the process plans from the same CPUs as the first)."""
    return list(_process_cpus) if _process_cpus is not None else sorted(os.sched_getaffinity(0))


def remember_process_cpus() -> None:
    """Keep the calling thread's CPUs as the process's, before a core plan narrows that thread to its host core."""
    global _process_cpus
    if _process_cpus is None:
        _process_cpus = sorted(os.sched_getaffinity(0))
