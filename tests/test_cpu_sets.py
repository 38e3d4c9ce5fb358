"""One rank's share of the host's CPUs (cpu_worker/cpu_sets.py): whole physical cores, disjoint between the
ranks of a host, NUMA node by node; CPU lists in the kernel's syntax."""

import pytest

from scout_sglang.cpu_worker.cpu_sets import CpuPlace, cpu_list_text, host_topology, parse_cpu_list, rank_share


def two_socket_host(cores_per_node: int = 4) -> dict[int, CpuPlace]:
    """Linux numbering on a two-socket host with SMT: the first hardware thread of every core, node 0 then
    node 1, then the second threads in the same order (0-3 and 8-11 on node 0, 4-7 and 12-15 on node 1)."""
    places = {}
    for thread in range(2):
        for node in range(2):
            for core in range(cores_per_node):
                cpu = thread * 2 * cores_per_node + node * cores_per_node + core
                places[cpu] = CpuPlace(node=node, package=node, core=core)
    return places


def test_cpu_lists_parse_and_print_in_the_kernel_syntax():
    assert parse_cpu_list("0-3,8, 10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert cpu_list_text([11, 0, 1, 2, 3, 8, 10]) == "0-3,8,10-11"
    assert parse_cpu_list(cpu_list_text([5])) == [5]
    for bad in ("", "a-b", "3-1", "-2"):
        with pytest.raises(ValueError, match="bad CPU list"):
            parse_cpu_list(bad)


def test_ranks_get_disjoint_whole_cores_node_by_node():
    host = two_socket_host()
    shares = [rank_share(host, rank, 4, host) for rank in range(4)]
    assert shares == [[0, 1, 8, 9], [2, 3, 10, 11], [4, 5, 12, 13], [6, 7, 14, 15]]
    # a naive cut of the sorted CPU ids would give rank 2 the second threads of rank 0's cores (8-11)
    for rank, share in enumerate(shares):
        assert {host[cpu].node for cpu in share} == {rank // 2}  # each rank on one node
    assert sorted(cpu for share in shares for cpu in share) == sorted(host)


def test_uneven_splits_differ_by_one_core_and_one_rank_takes_everything():
    host = two_socket_host(cores_per_node=3)  # 6 cores, 12 CPUs
    shares = [rank_share(host, rank, 4, host) for rank in range(4)]
    assert [len(share) // 2 for share in shares] == [2, 2, 1, 1]
    assert len({cpu for share in shares for cpu in share}) == 12
    assert rank_share([3, 1, 2], 0, 1) == [1, 2, 3]
    # no topology known: each CPU a core of its own, in CPU order
    assert [rank_share([3, 0, 2, 1], rank, 2, topology={}) for rank in range(2)] == [[0, 1], [2, 3]]


def test_more_ranks_than_cores_is_refused_with_the_numbers():
    host = {0: CpuPlace(0, 0, 0), 1: CpuPlace(0, 0, 0)}  # one core, two hardware threads
    with pytest.raises(ValueError, match=r"2 ranks on this host share 1 physical cores \(CPUs 0-1\)"):
        rank_share(host, 0, 2, host)
    with pytest.raises(ValueError, match="local rank 2 is not in 0..1"):
        rank_share(host, 2, 2, host)


def test_topology_is_read_from_sysfs_and_unknown_cpus_stand_alone(tmp_path):
    cpu, node = tmp_path / "cpu", tmp_path / "node"
    for n, (package, core) in enumerate([(0, 0), (0, 0), (0, 1)]):
        topology = cpu / f"cpu{n}" / "topology"
        topology.mkdir(parents=True)
        (topology / "physical_package_id").write_text(f"{package}\n")
        (topology / "core_id").write_text(f"{core}\n")
    (node / "node1").mkdir(parents=True)
    (node / "node1" / "cpulist").write_text("0-2\n")
    places = host_topology([0, 1, 2, 3], cpu, node)
    assert places[0] == places[1] == CpuPlace(1, 0, 0) and places[2] == CpuPlace(1, 0, 1)
    assert places[3].node == 0 and places[3].core not in (0, 1)  # no files: a core of its own
    assert rank_share([0, 1, 2], 0, 2, places) == [0, 1] and rank_share([0, 1, 2], 1, 2, places) == [2]
