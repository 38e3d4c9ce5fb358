"""The CPUs a tensor-parallel rank's CPU worker takes (sglang_adapter/tensor_parallel.py): the CPU device's
binding when SGLANG_CPU_OMP_THREADS_BIND gives one, else its share of the process's cores, else (one rank)
no restriction; bad bindings are refused with what to change."""

import pytest

from scout_sglang.cpu_worker.cpu_sets import process_cpus, rank_share
from scout_sglang.sglang_adapter.tensor_parallel import RankPlace, rank_cpus

CPUS = process_cpus()


def test_one_rank_without_a_binding_keeps_the_whole_process():
    assert rank_cpus(RankPlace(), "cuda", {}) is None
    assert rank_cpus(RankPlace(), "cpu", {"SGLANG_CPU_OMP_THREADS_BIND": "all"}) is None


@pytest.mark.skipif(len(CPUS) < 2, reason="needs two CPUs")
def test_ranks_on_a_gpu_host_split_the_process_cpus():
    shares = [rank_cpus(RankPlace(rank, 2, rank, 2), "cuda", {}) for rank in range(2)]
    assert shares == [rank_share(CPUS, rank, 2) for rank in range(2)]
    assert shares[0] and shares[1] and not set(shares[0]) & set(shares[1])
    # a GPU server ignores the CPU device's binding
    assert rank_cpus(RankPlace(0, 2, 0, 2), "cuda", {"SGLANG_CPU_OMP_THREADS_BIND": "0|0"}) == shares[0]


def test_a_cpu_server_follows_its_binding_by_local_rank():
    first, last = CPUS[0], CPUS[-1]
    bind = {"SGLANG_CPU_OMP_THREADS_BIND": f"{first}|{last}"}
    assert rank_cpus(RankPlace(1, 2, 1, 2), "cpu", bind) == [last]
    assert rank_cpus(RankPlace(0, 1, 0, 1), "cpu", bind) == [first]
    with pytest.raises(RuntimeError, match=r"has 2 entries, none for local rank 2: give one CPU list per rank"):
        rank_cpus(RankPlace(2, 3, 2, 3), "cpu", bind)
    with pytest.raises(RuntimeError, match=r"gives local rank 0 CPUs '4096', none of which this process may use"):
        rank_cpus(RankPlace(), "cpu", {"SGLANG_CPU_OMP_THREADS_BIND": "4096"})


def test_more_ranks_than_cores_share_them_with_a_warning(caplog):
    ranks = len(CPUS) + 1
    assert rank_cpus(RankPlace(0, ranks, 0, ranks), "cuda", {}) == CPUS
    assert "each rank's CPU worker needs at least one core of its own" in caplog.text
