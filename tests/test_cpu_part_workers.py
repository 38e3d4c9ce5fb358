"""The CPU part's workers driven by the hand-off words (cpu_worker.native_pool, cpu_worker.flag_worker): results
against the reference over random lists, the protocol's edge cases (empty parts, a part rung again before it
finished, bad staging named in the error), the fault plan, and no Python on the native pool's threads."""

import sys
import threading
import time

import pytest
import torch

from scout_sglang import reference
from scout_sglang.cpu_worker.faults import FaultPlan
from scout_sglang.cpu_worker.flag_worker import FlagWorker, LayerPart
from scout_sglang.cpu_worker.native_pool import NativeWorkerPool, available
from scout_sglang.handoff_words import (
    DONE,
    DOORBELL,
    ERROR_ROW,
    ROWS,
    STATUS_DEADLINE,
    STATUS_ERROR,
    STATUS_OK,
    WORDS_PER_LAYER,
)
from scout_sglang.layout import PAD_BLOCK

HEADS, GROUP, BLOCK, DIM, PAGES, CAPACITY, BATCH = 2, 4, 16, 64, 40, 6, 5
requires_native = pytest.mark.skipif(not available(), reason="the native CPU kernel does not build here")


def make_worker(kind, *, threads=2, faults=None, min_item_blocks=None):
    if kind == "native":
        items = {} if min_item_blocks is None else dict(min_item_blocks=min_item_blocks)
        return NativeWorkerPool(threads=threads, faults=faults, grace_s=0.0, **items)
    return FlagWorker(threads=threads, impl="torch", faults=faults)


WORKERS = [pytest.param("native", marks=requires_native), "python"]


def make_part(dtype=torch.bfloat16, seed=0, capacity=CAPACITY):
    gen = torch.Generator().manual_seed(seed)
    k, v = (torch.randn(PAGES, HEADS, BLOCK, DIM, generator=gen).to(dtype) for _ in range(2))
    q = torch.randn(BATCH, HEADS * GROUP, DIM, generator=gen).to(dtype)
    counts = torch.randint(0, capacity + 1, (BATCH, HEADS), generator=gen, dtype=torch.int32)
    counts[0] = torch.tensor([0, 1])  # an empty list and a single block
    counts[1] = capacity  # full lists
    pages = torch.full((BATCH, HEADS, capacity), PAD_BLOCK, dtype=torch.int32)
    for b in range(BATCH):
        for h in range(HEADS):
            pages[b, h, : counts[b, h]] = torch.randperm(PAGES, generator=gen)[: counts[b, h]].int()
    return LayerPart(q=q, pages=pages, counts=counts, out_o=torch.full((BATCH, HEADS * GROUP, DIM), 9.0),
                     out_lse=torch.full((BATCH, HEADS * GROUP), 9.0), k_cache=k, v_cache=v,
                     words=torch.zeros(WORDS_PER_LAYER, dtype=torch.int32), scale=DIM ** -0.5)


def ring(worker, part, seq, rows=BATCH):
    part.words[ROWS] = rows
    part.words[DOORBELL] = seq
    worker.kick()


def expected(part, rows=BATCH):
    o, lse = reference.sparse_decode(part.q[:rows], part.k_cache, part.v_cache, part.pages[:rows],
                                     part.counts[:rows], scale=part.scale)
    return o, lse


@pytest.mark.parametrize("kind", WORKERS)
@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_a_rung_part_is_attended_like_the_reference(kind, threads, dtype):
    worker = make_worker(kind, threads=threads)
    try:
        part = make_part(dtype)
        worker.register_layer(3, part)
        ring(worker, part, seq=1)
        assert worker.wait_done(3, 1, timeout_s=30) == STATUS_OK
        o, lse = expected(part)
        tolerance = dict(atol=2e-2, rtol=2e-2) if dtype == torch.bfloat16 else dict(atol=2e-5, rtol=2e-5)
        torch.testing.assert_close(part.out_o, o, **tolerance)
        assert torch.isinf(part.out_lse[0, :GROUP]).all() and (part.out_o[0, :GROUP] == 0).all()  # the empty list
        torch.testing.assert_close(part.out_lse[1:], lse[1:], **tolerance)
        assert int(part.words[DONE]) == 1 and int(part.words[ERROR_ROW]) == -1
        # The next step: fewer rows; the rows past them keep what they held.
        part.q.mul_(-1)
        before = part.out_o[3:].clone()
        ring(worker, part, seq=2, rows=3)
        assert worker.wait_done(3, 2, timeout_s=30) == STATUS_OK
        torch.testing.assert_close(part.out_o[:3], expected(part, rows=3)[0], **tolerance)
        assert torch.equal(part.out_o[3:], before)
    finally:
        worker.shutdown()


@requires_native
@pytest.mark.parametrize("threads", [2, 4])
@pytest.mark.parametrize("min_item_blocks", [1, 3])
def test_long_lists_cut_into_block_ranges_merge_to_the_reference(threads, min_item_blocks):
    """Lists of up to 40 blocks cut into items of at least 1 or 3 blocks, attended by different threads and
    merged by LSE: the reference's output, empty lists and empty ranges included; a bad page in a cut list
    still fails the part, naming its row, and nothing is merged from it."""
    worker = make_worker("native", threads=threads, min_item_blocks=min_item_blocks)
    try:
        part = make_part(torch.float32, seed=3, capacity=PAGES)
        part.counts[2] = torch.tensor([PAGES, 2])  # one long list beside a short one
        part.pages[2, 0] = torch.randperm(PAGES, generator=torch.Generator().manual_seed(4)).int()
        worker.register_layer(0, part)
        ring(worker, part, seq=1)
        assert worker.wait_done(0, 1, timeout_s=30) == STATUS_OK
        o, lse = expected(part)
        torch.testing.assert_close(part.out_o, o, atol=2e-5, rtol=2e-5)
        assert torch.isinf(part.out_lse[0, :GROUP]).all() and (part.out_o[0, :GROUP] == 0).all()
        torch.testing.assert_close(part.out_lse[1:], lse[1:], atol=2e-5, rtol=2e-5)
        part.pages[2, 0, PAGES - 1] = PAGES + 7  # in the long list's last range
        part.out_o[2].fill_(9.0)
        ring(worker, part, seq=2)
        assert worker.wait_done(0, 2, timeout_s=30) == STATUS_ERROR and int(part.words[ERROR_ROW]) == 2
        assert (part.out_o[2, :GROUP] == 9.0).all()  # the failed list's ranges were not merged into its rows
    finally:
        worker.shutdown()


def test_the_native_pool_refuses_an_empty_item():
    with pytest.raises(ValueError, match="min_item_blocks"):
        NativeWorkerPool(threads=1, min_item_blocks=0)


@pytest.mark.parametrize("kind", WORKERS)
def test_an_empty_part_is_done_at_once_and_an_unrung_one_times_out(kind):
    worker = make_worker(kind)
    try:
        part = make_part(torch.float32)
        worker.register_layer(0, part)
        ring(worker, part, seq=5, rows=0)
        assert worker.wait_done(0, 5, timeout_s=30) == STATUS_OK
        start = time.monotonic()
        assert worker.wait_done(0, 6, timeout_s=0.05) == STATUS_DEADLINE  # never rung: nothing answers
        assert time.monotonic() - start < 5
    finally:
        worker.shutdown()


@pytest.mark.parametrize("kind", WORKERS)
def test_a_bad_page_fails_the_part_naming_its_row_and_never_reads_out_of_bounds(kind):
    worker = make_worker(kind)
    try:
        part = make_part(torch.float32)
        part.pages[2, 1, 0] = PAGES + 1000  # a page outside the host store
        part.counts[2, 1] = max(int(part.counts[2, 1]), 1)
        worker.register_layer(1, part)
        ring(worker, part, seq=7)
        assert worker.wait_done(1, 7, timeout_s=30) == STATUS_ERROR
        assert int(part.words[ERROR_ROW]) == 2
        assert "outside" in worker.errors[1]
        part.pages[2, 1, 0] = 0  # fixed: the worker goes on with the next part
        ring(worker, part, seq=8)
        assert worker.wait_done(1, 8, timeout_s=30) == STATUS_OK
    finally:
        worker.shutdown()


@pytest.mark.parametrize("kind", WORKERS)
def test_a_part_rung_again_before_it_finished_answers_only_the_new_one(kind):
    """The first part is held up by a delay; the layer rings again: the late part writes no word, the new
    one's result and DONE are the new step's."""
    worker = make_worker(kind, threads=1, faults=FaultPlan(delay_probability=1.0, delay_ms=300, seed=1))
    try:
        part = make_part(torch.float32)
        worker.register_layer(0, part)
        ring(worker, part, seq=1)
        time.sleep(0.05)  # the first part started and sleeps
        ring(worker, part, seq=2)
        status = worker.wait_done(0, 2, timeout_s=30)
        assert status == STATUS_OK and int(part.words[DONE]) == 2
        torch.testing.assert_close(part.out_o, expected(part)[0], atol=2e-5, rtol=2e-5)
        time.sleep(0.4)
        assert int(part.words[DONE]) == 2  # the stale part never wrote its sequence number over it
    finally:
        worker.shutdown()


@pytest.mark.parametrize("kind", WORKERS)
def test_injected_faults_fail_delay_or_end_a_thread_which_the_next_kick_replaces(kind):
    failing = make_worker(kind, faults=FaultPlan(raise_probability=1.0, seed=0))
    try:
        part = make_part(torch.float32)
        failing.register_layer(0, part)
        ring(failing, part, seq=1)
        assert failing.wait_done(0, 1, timeout_s=30) == STATUS_ERROR
    finally:
        failing.shutdown()
    late = make_worker(kind, faults=FaultPlan(delay_probability=1.0, delay_ms=200, seed=0))
    try:
        part = make_part(torch.float32)
        late.register_layer(0, part)
        ring(late, part, seq=1)
        assert late.wait_done(0, 1, timeout_s=0.02) == STATUS_DEADLINE
        assert late.wait_done(0, 1, timeout_s=30) == STATUS_OK  # it does finish, late
    finally:
        late.shutdown()
    exiting = make_worker(kind, threads=1, faults=FaultPlan(thread_exits=1))
    try:
        part = make_part(torch.float32)
        exiting.register_layer(0, part)
        ring(exiting, part, seq=1)
        assert exiting.wait_done(0, 1, timeout_s=0.3) == STATUS_DEADLINE  # its thread ended mid-part
        ring(exiting, part, seq=2)  # the kick replaces the thread
        assert exiting.wait_done(0, 2, timeout_s=30) == STATUS_OK
        assert exiting.replaced_threads == 1
    finally:
        exiting.shutdown()


@requires_native
def test_the_native_pool_runs_no_python_thread():
    """Its threads are not Python threads: no frame, no GIL, whatever they are doing."""
    before = set(sys._current_frames())
    worker = NativeWorkerPool(threads=3, faults=FaultPlan(delay_probability=1.0, delay_ms=200, seed=0))
    try:
        part = make_part(torch.float32)
        worker.register_layer(0, part)
        ring(worker, part, seq=1)
        time.sleep(0.05)  # a thread is inside the part now (its delay)
        assert set(sys._current_frames()) == before
        assert threading.active_count() == len(before)
        assert worker.wait_done(0, 1, timeout_s=30) == STATUS_OK
    finally:
        worker.shutdown()
