"""CPU attention worker: the CPU part of co-attention, over host KV in the paged layout.

digest -> select -> device part / CPU part (this package) -> merge. Module map:

    pool.py          CpuAttentionPool (submit / wait / shutdown), CpuAttentionHandle
    group.py         one thread group: a leader and helpers sharing a sequence
    partition.py     work split within a group, LSE merge of split results
    checks.py        submit-time argument validation
    dispatch.py      select_impl: native kernel or torch path, logged once
    native_kernel.py build/load the C++ kernel (native/scout_cpu_attention.cpp)
    torch_kernel.py  gather + torch flash attention fallback
    buffers.py       alloc_output_buffers (pinned when CUDA is present)
    errors.py        CpuAttentionError
    faults.py        FaultPlan: test-only faults injected into the worker threads
    cpu_sets.py      CPU lists, the host's core topology, one rank's share of the CPUs

Importing this package starts no threads and compiles nothing.
"""

from scout_sglang.cpu_worker.buffers import alloc_output_buffers
from scout_sglang.cpu_worker.dispatch import select_impl
from scout_sglang.cpu_worker.errors import CpuAttentionError
from scout_sglang.cpu_worker.pool import CpuAttentionHandle, CpuAttentionPool

__all__ = [
    "CpuAttentionError",
    "CpuAttentionHandle",
    "CpuAttentionPool",
    "alloc_output_buffers",
    "select_impl",
]
