"""A CPU attention worker thread that ends (SCOUT_TEST_FAULTS cpu_thread_exits: an error no task handler
catches) costs the work it held, not the pool: its group is replaced at the next submit, later work is
computed right, and shutdown still joins every thread."""

import logging
import threading

import pytest
import torch
from support import assert_close
from test_cpu_worker_helpers import make_case, make_pool, outputs_for

from scout_sglang.cpu_worker.faults import FaultPlan
from scout_sglang.reference import sparse_decode


def worker_names() -> set[str]:
    return {t.name for t in threading.enumerate() if t.name.startswith("scout-cpu-attn-")}


def submit(pool, case, batch: bool):
    out_o, out_lse = outputs_for(case)
    method = pool.submit_batch if batch else pool.submit
    return method(*case.values(), scale=0.125, out_o=out_o, out_lse=out_lse, layer=3), out_o, out_lse


@pytest.mark.parametrize("batch", [False, True])
@pytest.mark.parametrize("threads_per_group", [1, 2])
def test_an_ended_thread_costs_its_work_and_its_group_is_replaced(batch, threads_per_group, caplog):
    case = make_case([[2, 3], [1, 4]], group_size=2, head_dim=64)
    expected_o, expected_lse = sparse_decode(**case, scale=0.125)
    before = worker_names()
    caplog.set_level(logging.WARNING, "scout_sglang.cpu_worker")
    pool = make_pool("torch", num_groups=1, threads_per_group=threads_per_group, faults=FaultPlan(thread_exits=1))
    lost, _, _ = submit(pool, case, batch)
    with pytest.raises(TimeoutError):
        pool.wait(lost, timeout=0.5)  # its thread ended before doing it
    for thread in pool.threads:
        thread.join(timeout=5)  # the leader ended; its helpers follow it
    assert not any(thread.is_alive() for thread in pool.threads)
    assert "ended (InjectedThreadExit(" in caplog.text
    handle, out_o, out_lse = submit(pool, case, batch)  # replaces the group first
    pool.wait(handle, timeout=30)
    assert_close(out_o, expected_o, torch.bfloat16)
    assert_close(out_lse, expected_lse, torch.bfloat16, lse=True)
    assert pool.replaced_groups == 1 and len(pool.threads) == threads_per_group
    assert all(thread.is_alive() and "g0r1" in thread.name for thread in pool.threads)
    assert "thread group 0 replaced" in caplog.text
    pool.shutdown()
    assert worker_names() == before


def test_a_retired_leader_hands_back_what_it_takes():
    """A group retired while its leader still runs (a helper ended): the leader, competing with the new group
    for the queue, passes on whatever it takes and ends, so no task is lost to it and shutdown's STOPs reach
    the live group (an idle retired leader just waits, a daemon, until an entry comes)."""
    case = make_case([[2, 3], [1, 4]], group_size=2, head_dim=64)
    expected_o, _ = sparse_decode(**case, scale=0.125)
    pool = make_pool("torch", num_groups=1, threads_per_group=2)
    old = pool._groups[0]
    old._inboxes[0].put(None)  # the helper ends as if it had died
    old.threads[1].join(timeout=5)
    handles = [submit(pool, case, batch=True) for _ in range(20)]  # the first submit replaces the group
    for handle, out_o, _ in handles:
        pool.wait(handle, timeout=30)
        assert_close(out_o, expected_o, torch.bfloat16)
    assert pool.replaced_groups == 1
    shutdown = threading.Thread(target=pool.shutdown)
    shutdown.start()
    shutdown.join(timeout=30)
    assert not shutdown.is_alive() and not any(thread.is_alive() for thread in pool.threads)
