"""CPU attention worker: the CPU part of co-attention, over host KV in the paged layout.

digest -> select -> device part / CPU part (this package) -> merge. Module map:

    native_pool.py   NativeWorkerPool: C++ threads driven by the doorbell words (native/worker_pool.h), what serves
    flag_worker.py   FlagWorker: the same protocol in Python threads, its reference and the fallback; LayerPart
    native_kernel.py build/load the C++ kernel (native/scout_cpu_attention.cpp); NativeKernel, its host wrapper
    torch_kernel.py  gather + torch flash attention, where the native kernel does not build
    dispatch.py      select_impl: native kernel or torch path, logged once; make_kernel
    checks.py        range checks of a part's block lists (FlagWorker's, before the kernel reads them)
    faults.py        FaultPlan: test-only faults injected into the worker threads
    cpu_sets.py      CPU lists, the host's core topology, one rank's share of the CPUs
    core_plan.py     one rank's CPUs split between the worker and the host thread
    host_memory.py   the host K/V store on transparent huge pages

Importing this package starts no threads and compiles nothing.
"""

from scout_sglang.cpu_worker.dispatch import select_impl

__all__ = ["select_impl"]
