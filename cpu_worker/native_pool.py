"""NativeWorkerPool: the CPU part's worker as C++ threads that follow the hand-off words (native/worker_pool.h).

digest -> select -> split -> device part / **CPU part** -> merge. The host
wrapper of the native pool, with the interface of flag_worker.FlagWorker (its
Python reference): register each layer's part once, kick() at each step, and
on the CPU device wait_done(). Its threads take no GIL: between the device's
ring and its wait, no Python runs on their path. Built with the native kernel
(native_kernel.py); `available()` says whether this host has it.
"""

from __future__ import annotations

from scout_sglang.cpu_worker.faults import FaultPlan
from scout_sglang.cpu_worker.flag_worker import LayerPart
from scout_sglang.cpu_worker.native_kernel import load_native

from scout_sglang.handoff_words import STATUS_DEADLINE

# 16 blocks of 32 tokens: 256 KiB of bf16 K and V per KV head of 128 dims, long enough that a range's prefetch
# warm-up is a small part of it.
MIN_SPLIT_BLOCKS = 16


def available() -> bool:
    """Whether the native pool can be built on this host (the native kernel's build)."""
    return load_native().module is not None


class NativeWorkerPool:
    """C++ threads that attend the CPU parts their layers' doorbells announce.

    Parameters
    ----------
    threads : worker threads (each takes one block range of one KV head of one sequence at a time)
    cpus : the CPUs the threads may run on (one rank's share of the host, cpu_sets.py); None: the process's
    pin : thread i runs on cpus[i % len(cpus)] alone
    faults : a FaultPlan (tests only; drawn once per part) or None
    spin_s : how long an idle thread polls the doorbells before it sleeps until kick()
    min_split_blocks : the shortest block range a long list is cut into so that the threads share a part of few
        or uneven lists (native/work_items.h); 0: one item per list
    """

    def __init__(self, *, threads: int, cpus: list[int] | None = None, pin: bool = False,
                 faults: FaultPlan | None = None, spin_s: float = 0.05, min_split_blocks: int = MIN_SPLIT_BLOCKS):
        if min_split_blocks < 0:
            raise ValueError(f"min_split_blocks must be >= 0 (0: never split), got {min_split_blocks}")
        module = load_native().module
        if module is None:
            raise RuntimeError(f"the native CPU worker pool is unavailable: {load_native().error}")
        self._pool = module.WorkerPool(threads, sorted(cpus or []), pin, spin_s, min_split_blocks)
        if faults is not None and faults.cpu_faults:
            self._pool.set_faults(faults.raise_probability, faults.delay_probability, faults.delay_ms,
                                  faults.thread_exits, faults.seed)
        self._parts: dict[int, LayerPart] = {}

    @property
    def threads(self) -> range:
        return range(self._pool.num_threads())

    @property
    def replaced_threads(self) -> int:
        return self._pool.replaced_threads()

    @property
    def errors(self) -> dict[int, str]:
        return {index: self._pool.last_error(index) for index in self._parts if self._pool.last_error(index)}

    @property
    def busy_s(self) -> float:
        """Seconds the threads spent attending since start-up, summed over threads."""
        return self._pool.busy_ns() / 1e9

    def layer_busy_s(self, index: int) -> float:
        """Seconds the threads spent attending the parts of registered layer `index`."""
        return self._pool.layer_busy_ns(index) / 1e9

    def thread_ids(self) -> list[int]:
        """The OS ids of the threads (for /proc accounting)."""
        return [tid for tid in self._pool.thread_ids() if tid]

    def thread_cpus(self) -> list[int]:
        """The CPUs the live threads may run on, read back from the OS."""
        return self._pool.thread_cpus()

    def register_layer(self, index: int, part: LayerPart) -> None:
        self._parts[index] = part
        self._pool.register_layer(index, part.q, part.pages, part.counts, part.out_o, part.out_lse, part.k_cache,
                                  part.v_cache, part.words, part.scale)

    def kick(self) -> None:
        self._pool.kick()

    def wait_done(self, index: int, seq: int, timeout_s: float) -> int:
        status = self._pool.wait_done(index, seq, timeout_s)
        return STATUS_DEADLINE if status < 0 else status

    def shutdown(self) -> None:
        self._pool.shutdown()
