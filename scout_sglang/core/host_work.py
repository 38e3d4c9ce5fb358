"""The host work of a block of code besides its op count: Python lines executed, and time outside the ops.

On a GPU the host thread of a decode step launches kernels and runs the Python
between them; the kernels' work is the device's. Its time per layer is made of
two things: the launches (counted by op_counter.OpCounter) and the Python that
issues them. `PythonLineCounter` counts the second exactly: the Python lines
this thread executes (sys.settrace), a count that is the same at any batch when
nothing loops over requests, and that no noise of a shared host changes.

Where the device is this machine's CPU, the wall time of a layer also holds the
ops' math. `HostClock` times every aten op dispatched on this thread
(`inside_s`); the rest of the wall time (`outside_s`) is the host's own part.
Freeing a large device tensor is not an op: glibc unmaps it (milliseconds for
tens of MB), where a GPU's caching allocator keeps it; `keep_freed_memory()`
makes glibc keep freed memory as that allocator does. What the CPU device still
leaves in the time outside the ops (its math's traffic through the caches the
host code uses) is not taken out: the counts are the exact measure.

Worker threads are neither counted nor timed (a dispatch mode and a trace
function are per thread): they are the CPU part.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import sys
import threading
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from scout_sglang.core import op_counter
from scout_sglang.core.op_counter import unwrap_triton_launches, wrap_triton_launches

# glibc mallopt parameters (malloc.h)
M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4


class PythonLineCounter:
    """Counts the Python lines this thread executes while active (`with PythonLineCounter() as lines:`).

    Code of the `threading` module is not counted: a wait on an event runs more lines when the event is not set
    yet, so its count follows the timing of other threads, not the work of this one; nor is op_counter's wrapper
    of Triton's launches (the counting's own code). With skip_launches, nothing
    inside a Triton kernel launch is counted either: the launcher's own Python is the launch (counted as one by
    op_counter.LaunchCounter, and absent from a replayed CUDA graph), and in Triton's interpreter the kernel's
    body runs as Python that a GPU runs as device code. The cyclic garbage collector is paused while counting: a
    collection that happens to fall in the window runs the finalizers of other objects (an engine closed
    earlier), whose lines are not the counted work's.
    """

    IGNORED_FILES = frozenset((threading.__file__, op_counter.__file__))  # op_counter: the launch wrapper

    def __init__(self, *, skip_launches: bool = False, run_launches: bool = True):
        self.lines = 0
        self._skip_launches = skip_launches
        self._run_launches = run_launches  # False: the launches are not run (op_counter.LaunchCounter says why)
        self._inside = 0  # > 0 inside a Triton launch
        self._patched = []
        self._gc_was_enabled = False

    def _trace(self, frame, event, arg):
        if event == "call" and frame.f_code.co_filename in self.IGNORED_FILES:
            return None  # no line events in this frame (calls it makes are traced again)
        if event == "line" and not self._inside:
            self.lines += 1
        return self._trace

    def __enter__(self):
        if sys.gettrace() is not None:
            raise RuntimeError("a trace function is already set on this thread (a debugger or coverage?): "
                               "PythonLineCounter cannot count under it")
        if self._skip_launches:
            self._patched = wrap_triton_launches(self, run=self._run_launches)
        self._gc_was_enabled = gc.isenabled()
        gc.disable()
        sys.settrace(self._trace)
        return self

    def __exit__(self, *exc):
        sys.settrace(None)
        if self._gc_was_enabled:
            gc.enable()
        unwrap_triton_launches(self._patched)
        return False


class HostClock(TorchDispatchMode):
    """Times the aten ops dispatched on this thread while active (`with HostClock() as clock:`)."""

    def __init__(self):
        super().__init__()
        self.inside_s = 0.0
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        start = time.perf_counter()
        out = func(*args, **(kwargs or {}))
        self.inside_s += time.perf_counter() - start
        self.ops += 1
        return out

    def outside_s(self, wall_s: float, overhead_s_per_op: float = 0.0) -> float:
        """Of `wall_s`, the wall time of the timed block, the seconds not spent in its ops, less this clock's own
        cost per op (`clock_overhead_s_per_op()`). A little of that cost falls inside the timed window (the call
        of the op, a clock read), so the result is low by that much per op: the same at every batch size, so a
        difference between batch sizes is free of that bias where a ratio is not."""
        return wall_s - self.inside_s - self.ops * overhead_s_per_op


def clock_overhead_s_per_op(ops: int = 3000, rounds: int = 5) -> float:
    """What a HostClock adds to a block's wall time per op: a loop of trivial ops timed with and without it (the
    best of `rounds` each)."""
    x = torch.zeros(1)

    def wall(clock) -> float:
        start = time.perf_counter()
        with clock if clock is not None else contextlib.nullcontext():
            for _ in range(ops):
                x.add_(0.0)
        return time.perf_counter() - start

    plain = min(wall(None) for _ in range(rounds))
    clocked = min(wall(HostClock()) for _ in range(rounds))
    return max(0.0, (clocked - plain) / ops)


def keep_freed_memory() -> bool:
    """Make glibc serve every allocation from its heap and never give freed memory back to the system, so that a
    CPU "device" tensor's allocation and free cost what they cost with a GPU's caching allocator. Process-wide, for
    benchmarks. False where the C library is not glibc (nothing changed)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.mallopt(M_MMAP_MAX, 0)) and bool(libc.mallopt(M_TRIM_THRESHOLD, 2**31 - 1))
    except (OSError, AttributeError):
        return False
