"""The host-work measures of the decode step's benchmark and tests (scout_sglang/core/host_work.py)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time

import pytest
import torch

from scout_sglang.core.host_work import HostClock, PythonLineCounter


def loop(n: int, x: torch.Tensor) -> None:
    for _ in range(n):
        x.add_(1.0)


def lines_of(fn, *args) -> int:
    with PythonLineCounter() as counter:
        fn(*args)
    return counter.lines


def test_lines_grow_with_a_python_loop_and_not_with_the_tensors():
    small = torch.zeros(4)
    per_ten = lines_of(loop, 10, small) - lines_of(loop, 0, small)
    assert per_ten > 0
    assert lines_of(loop, 20, small) - lines_of(loop, 10, small) == per_ten
    assert lines_of(loop, 10, torch.zeros(1_000_000)) == lines_of(loop, 10, small)


def test_the_line_counter_refuses_to_replace_another_trace_function():
    previous = sys.gettrace()
    sys.settrace(lambda *args: None)
    try:
        with pytest.raises(RuntimeError, match="trace function is already set"):
            with PythonLineCounter():
                pass
    finally:
        sys.settrace(previous)


def test_the_clock_puts_python_time_outside_the_ops_and_counts_them():
    x = torch.zeros(4)
    start = time.perf_counter()
    with HostClock() as clock:
        x.add_(1.0)
        time.sleep(0.05)  # host work between two launches
        x.add_(1.0)
    wall = time.perf_counter() - start
    assert clock.ops == 2
    assert clock.outside_s(wall) >= 0.05
    assert clock.inside_s < 0.05
    assert clock.outside_s(wall, overhead_s_per_op=0.01) == pytest.approx(clock.outside_s(wall) - 0.02)


def test_kept_memory_is_not_given_back_when_a_large_tensor_is_freed():
    """In a fresh process: a freed 256 MiB tensor leaves the resident set without keep_freed_memory() and stays
    in it with (glibc keeps it for the next allocation, as a GPU's caching allocator does)."""
    script = textwrap.dedent("""
        import sys, torch
        from scout_sglang.core.host_work import keep_freed_memory
        def rss():
            return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmRSS")) * 1024
        if sys.argv[1] == "keep":
            assert keep_freed_memory()
        x = torch.ones(64 * 2**20)
        before = rss()
        del x
        print((before - rss()) / 2**20)
    """)
    released = {}
    for how in ("default", "keep"):
        out = subprocess.run([sys.executable, "-P", "-c", script, how], capture_output=True, text=True, check=True)
        released[how] = float(out.stdout.strip().splitlines()[-1])
    assert released["default"] > 200, released
    assert released["keep"] < 16, released


def test_waits_on_other_threads_count_the_same_lines_however_long_they_take():
    def wait_for(event: threading.Event) -> None:
        event.wait(1.0)

    done = threading.Event()
    done.set()
    already_set = lines_of(wait_for, done)
    pending = threading.Event()
    threading.Timer(0.05, pending.set).start()
    assert lines_of(wait_for, pending) == already_set
