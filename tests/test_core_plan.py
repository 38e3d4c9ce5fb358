"""One place splits a rank's CPUs between the CPU worker pool and the host (cpu_worker/core_plan.py,
tensor_parallel.rank_core_plan): on a GPU the first physical core is the host thread's and torch's, the workers
take the rest; on a CPU device the workers take what the device's binding leaves; with nothing to split both
share, and the plan says why."""

import os

import pytest

from scout_sglang.cpu_worker.core_plan import apply_host, plan_cores
from scout_sglang.cpu_worker.cpu_sets import CpuPlace, process_cpus
from scout_sglang.sglang_adapter.tensor_parallel import RankPlace, rank_core_plan

# Two NUMA nodes of two cores with two hardware threads each: CPUs 0-3 on node 0 (cores 0, 1), 4-7 on node 1.
HOST = {cpu: CpuPlace(node=cpu // 4, package=cpu // 4, core=(cpu % 4) // 2) for cpu in range(8)}


def test_a_gpu_host_keeps_its_first_core_and_its_torch_threads_off_the_workers():
    plan = plan_cores(range(8), device_is_cpu=False, topology=HOST)
    assert plan.host == (0, 1) and plan.workers == (2, 3, 4, 5, 6, 7) and plan.torch_threads == 2
    assert not plan.shared and not set(plan.host) & set(plan.workers)
    assert plan.as_report() == {"worker_cpus": "2-7", "host_cpus": "0-1", "torch_threads": 2, "shared": False,
                                "why": plan.why}


def test_one_core_is_shared_and_says_so():
    plan = plan_cores([4, 5], device_is_cpu=False, topology=HOST)  # both threads of one core
    assert plan.shared and plan.workers == plan.host == (4, 5) and "one physical core" in plan.why


def test_a_cpu_device_leaves_the_workers_what_its_binding_does_not_take():
    plan = plan_cores(range(8), device_is_cpu=True, device_cpus=range(6), topology=HOST)
    assert (plan.workers, plan.host, plan.shared, plan.torch_threads) == ((6, 7), tuple(range(6)), False, 0)
    everything = plan_cores(range(4), device_is_cpu=True, device_cpus=range(4), topology=HOST)
    assert everything.shared and everything.workers == (0, 1, 2, 3) and "bind the device to fewer" in everything.why
    unbound = plan_cores(range(4), device_is_cpu=True, device_cpus=None, topology=HOST)
    assert unbound.shared and "not bound" in unbound.why
    with pytest.raises(ValueError, match="at least one CPU"):
        plan_cores([], device_is_cpu=False)


def test_ranks_of_a_bound_cpu_device_split_the_unbound_cpus():
    cpus = process_cpus()
    if len(cpus) < 2:
        pytest.skip("needs two CPUs")
    bind = {"SGLANG_CPU_OMP_THREADS_BIND": str(cpus[0])}  # one rank bound to the first CPU
    plan = rank_core_plan(RankPlace(), "cpu", bind, topology={})
    assert plan.host == (cpus[0],) and plan.workers == tuple(cpus[1:]) and not plan.shared
    gpu = rank_core_plan(RankPlace(), "cuda", {}, topology={})  # each CPU a core of its own
    assert gpu.host == (cpus[0],) and gpu.workers == tuple(cpus[1:])
    unbound = rank_core_plan(RankPlace(), "cpu", {}, topology={})
    assert unbound.shared and unbound.workers == tuple(cpus)


@pytest.mark.skipif(len(process_cpus()) < 2, reason="a host core and a worker core need two CPUs")
def test_a_second_plan_in_the_process_starts_from_the_process_cpus_not_the_host_core(monkeypatch):
    """apply_host puts the calling thread on the host core; a second engine built by that thread (a benchmark's
    next configuration) must still plan the process's CPUs, not that one core (it had planned one worker thread)."""
    import threading

    import torch

    from scout_sglang.cpu_worker import cpu_sets

    monkeypatch.setattr(cpu_sets, "_process_cpus", None)  # as a fresh process: nothing remembered yet
    before = process_cpus()
    topology = {cpu: CpuPlace(node=0, package=0, core=cpu) for cpu in before}  # each CPU its own core
    torch_threads = torch.get_num_threads()
    seen = {}

    def engine_thread():  # not the test's own thread: its CPUs stay as they are
        first = plan_cores(process_cpus(), device_is_cpu=False, topology=topology)
        assert apply_host(first, device_is_cpu=False)
        seen["thread"] = sorted(os.sched_getaffinity(0))
        seen["second"] = plan_cores(process_cpus(), device_is_cpu=False, topology=topology)
        seen["first"] = first

    try:
        worker = threading.Thread(target=engine_thread)
        worker.start()
        worker.join()
    finally:
        torch.set_num_threads(torch_threads)
    if seen["thread"] != list(seen["first"].host):
        pytest.skip("this container forbids moving a thread to other CPUs (apply_host warned and went on)")
    assert seen["second"] == seen["first"] and len(seen["second"].workers) == len(before) - 1
