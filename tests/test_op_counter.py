"""OpCounter (core/op_counter.py), which the host-overhead checks rest on: it sees a scalar read and a tolist() on
its own thread (tolist() dispatches no aten op, so without a count of its own a device list read in the step
path would go unseen), not on another thread, and puts tolist back when it exits."""

import threading

import torch

from scout_sglang.core.op_counter import SCALAR_READ, OpCounter


def test_scalar_reads_and_list_reads_are_counted_on_the_counting_thread_only():
    values = torch.arange(4)
    original = torch.Tensor.tolist
    with OpCounter() as counter:
        assert values.tolist() == [0, 1, 2, 3]  # the wrapped call still returns the values
        int(values[1])
        elsewhere = threading.Thread(target=values.tolist)
        elsewhere.start()
        elsewhere.join()
    assert counter.list_reads == 1 and counter.scalar_reads == 1 and counter.reads == 2
    assert counter.ops[SCALAR_READ] == 1
    assert torch.Tensor.tolist is original
    values.tolist()
    assert counter.list_reads == 1  # not counted after exit


def test_nested_counters_each_count_and_restore_in_turn():
    values = torch.arange(2)
    original = torch.Tensor.tolist
    with OpCounter() as outer:
        values.tolist()
        with OpCounter() as inner:
            values.tolist()
        values.tolist()
    assert (outer.list_reads, inner.list_reads) == (3, 1)
    assert torch.Tensor.tolist is original


def test_counters_on_two_threads_exiting_out_of_order_put_tolist_back():
    """A counter on a worker thread that outlives the main thread's: the original comes back once both are out,
    and each counted only its own thread's call."""
    original = torch.Tensor.tolist
    entered, release, done = threading.Event(), threading.Event(), threading.Event()
    counted = {}

    def worker():
        with OpCounter() as mine:
            entered.set()
            release.wait(10)
            torch.arange(2).tolist()
        counted["worker"] = mine.list_reads
        done.set()

    thread = threading.Thread(target=worker)
    main = OpCounter()
    main.__enter__()
    thread.start()
    assert entered.wait(10)
    torch.arange(2).tolist()
    main.__exit__(None, None, None)  # first out, while the worker's is still active
    assert torch.Tensor.tolist is not original  # the worker's counter still needs the wrapper
    release.set()
    assert done.wait(10)
    thread.join()
    assert (main.list_reads, counted["worker"]) == (1, 1)
    assert torch.Tensor.tolist is original
