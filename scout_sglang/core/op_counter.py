"""OpCounter: the aten ops a block of code dispatches on this thread, for host-overhead checks.

On a GPU every dispatched op that is not a view is a kernel launch (microseconds
of host time), and every `aten::_local_scalar_dense` (`.item()`, `int(t)`) is a
device-to-host sync. `Tensor.tolist()` of a host tensor reads its elements
without dispatching any op, so on the CPU device it would go unseen: it is
counted apart (`list_reads`); on a GPU its device-to-host copy is a sync. Worker
threads are not counted (a dispatch mode is per thread). Used by
benchmarks/bench_host_overhead.py and the tests of the decode step's per-layer
programs.
"""

from __future__ import annotations

import threading
from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode

SCALAR_READ = "aten._local_scalar_dense.default"
# Ops that only make a view (metadata, no kernel launch).
VIEW_OPS = frozenset(("view", "_unsafe_view", "expand", "slice", "select", "unsqueeze", "permute", "transpose", "t",
                      "alias", "as_strided", "squeeze", "reshape", "detach"))


class OpCounter(TorchDispatchMode):
    """Counts every aten op dispatched on this thread while active (`with OpCounter() as counter:`)."""

    def __init__(self):
        super().__init__()
        self.ops = Counter()
        self.list_reads = 0  # Tensor.tolist() calls on this thread while active
        self._active_on = None  # the entering thread's list of active counters

    def __enter__(self):
        entered = super().__enter__()
        _counting_tolist.install()
        self._active_on = _active_counters()
        self._active_on.append(self)
        return entered

    def __exit__(self, *exc):
        active, self._active_on = self._active_on, None
        if active is not None:  # entered: leave the entering thread's list (even if exited on another thread)
            where = [i for i, counter in enumerate(active) if counter is self]
            if where:
                del active[where[-1]]
            _counting_tolist.uninstall()
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func)] += 1
        return func(*args, **(kwargs or {}))

    def launches(self) -> int:
        """Ops that would launch a kernel: every op but views."""
        return sum(n for name, n in self.ops.items() if not is_view(name))

    @property
    def scalar_reads(self) -> int:
        return self.ops[SCALAR_READ]

    @property
    def reads(self) -> int:
        """Every read of tensor values into Python on this thread: scalar reads and tolist() calls (on a GPU, each
        of a device tensor waits for the device)."""
        return self.scalar_reads + self.list_reads


class _CountingTolist:
    """One wrapper of Tensor.tolist for every active counter: installed while any is active (counted under a
    lock, so counters on several threads, entered and exited in any order, put the original back exactly once),
    it adds one to each counter active on the calling thread (but a LaunchCounter inside a Triton launch)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._users = 0
        self._original = None

    def install(self) -> None:
        with self._lock:
            if self._users == 0:
                self._original = torch.Tensor.tolist
                original, active = self._original, _active_counters

                def tolist(tensor, *args, **kwargs):
                    for counter in active():
                        if not getattr(counter, "_inside", 0):
                            counter.list_reads += 1
                    return original(tensor, *args, **kwargs)

                torch.Tensor.tolist = tolist
            self._users += 1

    def uninstall(self) -> None:
        with self._lock:
            self._users -= 1
            if self._users == 0:
                torch.Tensor.tolist = self._original
                self._original = None


_counting_tolist = _CountingTolist()
_thread_counters = threading.local()


def _active_counters() -> list:
    """The counters active on the calling thread, innermost last."""
    if not hasattr(_thread_counters, "active"):
        _thread_counters.active = []
    return _thread_counters.active


def is_view(name: str) -> bool:
    """Whether an op named like "aten.view.default" only makes a view."""
    return name.split(".")[1] in VIEW_OPS


class LaunchCounter(OpCounter):
    """An OpCounter that also counts Triton kernel launches, natively or in Triton's interpreter: what a GPU
    executes per layer is the Triton launches plus the aten ops that are not views. The aten ops a launch makes
    by itself (the interpreter copies its arguments) are not counted. `triton` maps kernel names to launches.

    run=False counts the launches without running them: the interpreter takes minutes for a large batch, and
    the launches do not depend on the data (what a run at a small batch shows); outputs are then garbage."""

    def __init__(self, *, run: bool = True):
        super().__init__()
        self._run = run
        self.triton = Counter()
        self._inside = 0
        self._patched = []

    def __enter__(self):
        self._patched = wrap_triton_launches(self, run=self._run, on_launch=self._count)
        return super().__enter__()

    def __exit__(self, *exc):
        unwrap_triton_launches(self._patched)
        return super().__exit__(*exc)

    def _count(self, kernel, args, kwargs) -> None:
        self.triton[getattr(kernel, "__name__", "kernel")] += 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self._inside:
            return func(*args, **(kwargs or {}))
        return super().__torch_dispatch__(func, types, args, kwargs)

    def launches(self) -> int:
        """Triton launches plus aten ops that are not views."""
        return super().launches() + sum(self.triton.values())


def wrap_triton_launches(owner, *, run: bool, on_launch=None) -> list:
    """Wrap every Triton kernel launch of this process (compiled and interpreted) until unwrap_triton_launches:
    `owner._inside` is > 0 during a launch, the launch runs only when `run`, and on_launch(kernel, args, kwargs)
    (optional; kwargs hold the grid) sees each launch but warm-ups first. Returns what unwrap_triton_launches
    puts back."""
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    patched = []
    for cls in (InterpretedFunction, JITFunction):
        original = cls.run

        def wrapped(kernel, *args, _original=original, **kwargs):
            if on_launch is not None and not kwargs.get("warmup"):
                on_launch(kernel, args, kwargs)
            owner._inside += 1
            try:
                return _original(kernel, *args, **kwargs) if run else None
            finally:
                owner._inside -= 1

        patched.append((cls, original))
        cls.run = wrapped
    return patched


def unwrap_triton_launches(patched: list) -> None:
    for cls, original in reversed(patched):
        cls.run = original
    patched.clear()
