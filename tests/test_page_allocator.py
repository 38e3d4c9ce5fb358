"""core.page_allocator: exact accounting, all-or-nothing allocation, no leaks."""

import random

import pytest

from scout_sglang.core.page_allocator import OutOfPagesError, PageAllocator


def test_allocate_appends_to_the_request_table_in_order():
    pages = PageAllocator(8, name="host")
    first = pages.allocate(1, 3)
    second = pages.allocate(1, 2)
    assert pages.table(1) == first + second == [0, 1, 2, 3, 4]
    assert pages.num_used == 5 and pages.num_free == 3


def test_a_too_large_allocation_changes_nothing_and_says_why():
    pages = PageAllocator(4, name="host")
    pages.allocate(7, 3)
    with pytest.raises(OutOfPagesError, match="host: request 8 needs 2 pages, 1 of 4 free"):
        pages.allocate(8, 2)
    assert pages.num_free == 1 and pages.table(8) == []


def test_a_thousand_requests_admitted_and_released_leave_no_trace():
    pages = PageAllocator(500, name="host")
    rng = random.Random(0)
    live = []
    for request_id in range(1000):
        while live and (pages.num_free < 40 or rng.random() < 0.3):
            pages.release(live.pop(rng.randrange(len(live))))
        pages.allocate(request_id, rng.randint(0, 40))
        live.append(request_id)
        pages.check_consistent()
    for request_id in live:
        pages.release(request_id)
    assert pages.num_free == 500 and pages.requests() == []
    pages.check_consistent()


def test_releasing_an_unknown_request_frees_nothing():
    pages = PageAllocator(3)
    assert pages.release(42) == 0 and pages.num_free == 3
