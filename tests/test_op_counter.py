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
