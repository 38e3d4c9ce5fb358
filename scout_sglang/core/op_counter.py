"""OpCounter: the aten ops a block of code dispatches on this thread, for host-overhead checks.

On a GPU every dispatched op that is not a view is a kernel launch (microseconds
of host time), and every `aten::_local_scalar_dense` (`.item()`, `int(t)`,
`.tolist()`) is a device-to-host sync. Worker threads are not counted (a
dispatch mode is per thread). Used by benchmarks/bench_host_overhead.py and the
tests of the decode step's per-layer programs.
"""

from __future__ import annotations

from collections import Counter

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

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func)] += 1
        return func(*args, **(kwargs or {}))

    def launches(self) -> int:
        """Ops that would launch a kernel: every op but views."""
        return sum(n for name, n in self.ops.items() if not is_view(name))

    @property
    def scalar_reads(self) -> int:
        return self.ops[SCALAR_READ]


def is_view(name: str) -> bool:
    """Whether an op named like "aten.view.default" only makes a view."""
    return name.split(".")[1] in VIEW_OPS
