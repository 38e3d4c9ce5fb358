"""The native pool's discipline (cpu_worker/native/worker_pool.h, work_items.h): items of near-equal blocks
whatever the batch and the list lengths, no lock per item, threads that spin only while a step's expected parts
are under way and park otherwise, and the test-only drop fault that throws a part's result away."""

import time
from pathlib import Path

import pytest
import torch

from scout_sglang import reference
from scout_sglang.cpu_worker.faults import FaultPlan
from scout_sglang.cpu_worker.flag_worker import FlagWorker, LayerPart
from scout_sglang.cpu_worker.native_kernel import load_native
from scout_sglang.cpu_worker.native_pool import NativeWorkerPool, available
from scout_sglang.handoff_words import DOORBELL, ROWS, STATUS_OK, WORDS_PER_LAYER

pytestmark = pytest.mark.skipif(not available(), reason="the native CPU kernel does not build here")
HEADS, GROUP, BLOCK, DIM, PAGES = 2, 2, 16, 32, 64


def part_of(counts: torch.Tensor, *, seed: int = 0, capacity: int = PAGES) -> LayerPart:
    gen = torch.Generator().manual_seed(seed)
    rows, heads = counts.shape
    k, v = (torch.randn(PAGES, heads, BLOCK, DIM, generator=gen) for _ in range(2))
    pages = torch.stack([torch.randperm(PAGES, generator=gen)[:capacity] for _ in range(rows * heads)])
    return LayerPart(q=torch.randn(rows, heads * GROUP, DIM, generator=gen), pages=pages.view(rows, heads, -1).int(),
                     counts=counts.int(), out_o=torch.zeros(rows, heads * GROUP, DIM),
                     out_lse=torch.zeros(rows, heads * GROUP), k_cache=k, v_cache=v,
                     words=torch.zeros(WORDS_PER_LAYER, dtype=torch.int32), scale=DIM ** -0.5)


def ring_by_device(part: LayerPart, seq: int) -> None:
    """What the GPU's ring kernel does: write the words, no host call to the pool."""
    part.words[ROWS] = part.q.shape[0]
    part.words[DOORBELL] = seq


def thread_states(tids: list[int]) -> list[str]:
    states = []
    for tid in tids:
        stat = Path(f"/proc/self/task/{tid}/stat").read_text()
        states.append(stat[stat.rindex(")") + 2])
    return states


@pytest.mark.parametrize("batch", [1, 7, 32, 64])
@pytest.mark.parametrize("heads", [1, 8])
@pytest.mark.parametrize("threads", [2, 16])
def test_items_are_near_equal_whatever_the_lists(batch, heads, threads):
    """Random list lengths (some empty, one very long): with enough blocks per thread the largest item is at most
    1.25x the mean, and the items cover every block once."""
    module = load_native().module
    gen = torch.Generator().manual_seed(batch * 100 + heads + threads)
    capacity, min_item = 512, 4
    counts = torch.randint(0, 200, (batch * heads,), generator=gen, dtype=torch.int32)
    counts[int(torch.randint(0, counts.numel(), (1,), generator=gen))] = capacity  # one list far longer
    counts[0] = 0
    items = module.item_blocks(counts, capacity, threads, min_item)
    total = int(counts.sum())
    assert sum(items) == total
    assert all(n >= 1 for n in items) if total else items == [0]  # an empty part: one item writes the empties
    if total >= 8 * threads * min_item:  # enough blocks per thread
        mean = total / len(items)
        assert max(items) / mean <= 1.25, (max(items), mean, len(items))
    assert module.item_blocks(torch.tensor([3, 600], dtype=torch.int32), 512, 2, 4) == []  # a bad count


def test_a_part_of_many_items_takes_no_lock_per_item():
    """16 threads on parts of 64 items with cut lists: no thread takes a lock inside an item (the debug counter
    of lock acquisitions between a claim and the item's end), and the whole job's locks (its prepare lock, a wake
    of parked threads, the threads' parking) do not grow with its items."""
    pool = NativeWorkerPool(threads=16, grace_s=0.0, min_item_blocks=1)
    try:
        taken = []
        for seq, blocks in ((1, 3), (2, 37)):
            part = part_of(torch.full((16, HEADS), blocks), seed=seq)
            pool.register_layer(seq, part)
            time.sleep(0.05)  # the threads parked after the registration's wake
            before = pool.lock_count
            ring_by_device(part, seq)
            pool.kick()
            assert pool.wait_done(seq, seq, timeout_s=30) == STATUS_OK
            time.sleep(0.05)
            taken.append(pool.lock_count - before)
        assert pool.item_path_locks == 0
        assert taken[1] <= 2 + 2 * 16, taken  # prepare, wake, and each thread's wake and park at most
    finally:
        pool.shutdown()


def test_threads_spin_only_while_a_step_is_under_way_then_park():
    """A GPU-like step: expect() before the rings, the rings written without a host call. Every part is attended;
    then, a grace later, no thread is runnable and the pool burns no CPU while idle."""
    pool = NativeWorkerPool(threads=2, grace_s=2e-4, min_item_blocks=2)
    try:
        parts = {index: part_of(torch.randint(0, 40, (8, HEADS)), seed=index) for index in (0, 1)}
        for index, part in parts.items():
            pool.register_layer(index, part)
        for seq in (1, 2, 3):
            pool.expect(list(parts), seq)
            for index, part in parts.items():
                time.sleep(0.002)  # the GPU's layer between rings
                ring_by_device(part, seq)
                assert pool.wait_done(index, seq, timeout_s=30) == STATUS_OK
                o, lse = reference.sparse_decode(part.q, part.k_cache, part.v_cache, part.pages, part.counts,
                                                 scale=part.scale)
                torch.testing.assert_close(part.out_o, o, atol=2e-5, rtol=2e-5)
        time.sleep(0.005)
        assert thread_states(pool.thread_ids()) == ["S", "S"]
        idle_from = pool.cpu_s
        time.sleep(0.2)
        assert pool.cpu_s - idle_from < 0.005  # parked: no wake-ups on a timer
    finally:
        pool.shutdown()


def test_a_step_planned_while_the_last_still_rings_serves_both_in_order():
    """SGLang's overlap scheduler plans step N+1 (expect) while the GPU still runs step N: the rings of step N's
    later layers come after the expectation of step N+1. They are served, then step N+1's, each part exact; then
    the pool parks."""
    pool = NativeWorkerPool(threads=2, grace_s=2e-4, min_item_blocks=2)
    try:
        parts = {index: part_of(torch.randint(0, 40, (8, HEADS)), seed=10 + index) for index in (0, 1, 2)}
        for index, part in parts.items():
            pool.register_layer(index, part)
        expected = {index: reference.sparse_decode(part.q, part.k_cache, part.v_cache, part.pages, part.counts,
                                                   scale=part.scale) for index, part in parts.items()}
        pool.expect(list(parts), 1)
        for seq in (1, 2, 3):
            for position, (index, part) in enumerate(parts.items()):
                if position == 1 and seq < 3:
                    pool.expect(list(parts), seq + 1)  # the next step planned, this one's later layers to ring
                part.out_o.zero_()
                ring_by_device(part, seq)
                assert pool.wait_done(index, seq, timeout_s=30) == STATUS_OK, (seq, index)
                torch.testing.assert_close(part.out_o, expected[index][0], atol=2e-5, rtol=2e-5)
        time.sleep(0.005)
        assert thread_states(pool.thread_ids()) == ["S", "S"]
    finally:
        pool.shutdown()


def test_a_step_whose_rings_do_not_come_dozes_and_the_next_step_replaces_it():
    """expect() with no ring (a step the device never ran): thread 0 spins for the stall window then dozes, the
    others never leave their park; the next step's expectation replaces it and is served."""
    pool = NativeWorkerPool(threads=2, grace_s=0.0, stall_s=0.01)
    try:
        part = part_of(torch.randint(0, 20, (4, HEADS)))
        pool.register_layer(0, part)
        time.sleep(0.02)
        before = pool.cpu_s
        pool.expect([0], 1)
        time.sleep(0.3)
        assert pool.cpu_s - before < 0.1  # 10 ms of spin by one thread, then 1 ms naps
        pool.expect([0], 2)
        ring_by_device(part, 2)
        assert pool.wait_done(0, 2, timeout_s=30) == STATUS_OK
    finally:
        pool.shutdown()


@pytest.mark.parametrize("kind", ["native", "python"])
def test_the_drop_fault_reports_ok_with_empty_results(kind):
    """cpu_drop (tests only): the part is reported done and OK, every row empty (o = 0, lse = -inf), cut lists
    included, so the merge keeps the device part alone."""
    faults = FaultPlan(drop_probability=1.0)
    worker = (NativeWorkerPool(threads=2, faults=faults, grace_s=0.0, min_item_blocks=1) if kind == "native"
              else FlagWorker(threads=2, impl="torch", faults=faults))
    try:
        part = part_of(torch.tensor([[30, 1], [0, 45], [7, 7]]))
        part.out_o.fill_(5.0)
        worker.register_layer(0, part)
        ring_by_device(part, 1)
        worker.kick()
        assert worker.wait_done(0, 1, timeout_s=30) == STATUS_OK
        assert (part.out_o == 0).all() and torch.isinf(part.out_lse).all() and (part.out_lse < 0).all()
    finally:
        worker.shutdown()


def test_a_part_a_host_rings_right_after_the_last_is_never_missed():
    """The CPU device's rhythm: each ring (words, then kick) right after the previous part's DONE, while the threads
    are on their way to park. A thread that checked for work before the ring and parks after the kick would sleep
    through it (a lost wake-up: the part then waits for its deadline). 2000 rings in a row, every one done at
    once."""
    pool = NativeWorkerPool(threads=2, grace_s=0.0, min_item_blocks=1)
    try:
        part = part_of(torch.randint(1, 4, (2, HEADS)))
        pool.register_layer(0, part)
        slow = 0
        for seq in range(1, 2001):
            ring_by_device(part, seq)
            pool.kick()
            started = time.monotonic()
            assert pool.wait_done(0, seq, timeout_s=5.0) == STATUS_OK
            slow += time.monotonic() - started > 0.2
        assert slow == 0, f"{slow} of 2000 parts waited for a thread to wake"
    finally:
        pool.shutdown()
