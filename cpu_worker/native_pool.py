"""NativeWorkerPool: the CPU part's worker as C++ threads that follow the hand-off words (native/worker_pool.h).

digest -> select -> split -> device part / **CPU part** -> merge. The host
wrapper of the native pool, with the interface of flag_worker.FlagWorker (its
Python reference): register each layer's part once; at each step's plan,
expect() the layers a GPU will ring (the threads spin from the first ring to
the step's last part, then park); on the CPU device kick() after each host
ring, and wait_done(). Its threads take no GIL and no lock per item: between
the device's ring and its wait, no Python runs on their path. Built with the
native kernel (native_kernel.py); `available()` says whether this host has it.
"""

from __future__ import annotations

from scout_sglang.cpu_worker.faults import FaultPlan
from scout_sglang.cpu_worker.flag_worker import LayerPart
from scout_sglang.cpu_worker.native_kernel import load_native

from scout_sglang.handoff_words import STATUS_DEADLINE

# 16 blocks of 32 tokens: 256 KiB of bf16 K and V per KV head of 128 dims, long enough that an item's prefetch
# warm-up is a small part of it.
MIN_ITEM_BLOCKS = 16
# How long the threads keep spinning once a step's parts have ended (the next step's first ring may be close),
# and how long they spin for a ring that does not come before they doze.
GRACE_S = 2e-4
STALL_S = 0.02


def available() -> bool:
    """Whether the native pool can be built on this host (the native kernel's build)."""
    return load_native().module is not None


class NativeWorkerPool:
    """C++ threads that attend the CPU parts their layers' doorbells announce.

    Parameters
    ----------
    threads : worker threads (each takes one item, a run of equal blocks of the part's lists, at a time)
    cpus : the CPUs the threads may run on (one rank's share of the host, cpu_sets.py); None: the process's
    pin : thread i runs on cpus[i % len(cpus)] alone
    faults : a FaultPlan (tests only; drawn once per part) or None
    grace_s : how long the threads spin once a step's expected parts have ended, before they park until the
        next expect() or kick() (0 where every ring is a host call: the CPU device)
    stall_s : how long they spin for an expected ring that does not come before they doze (1 ms naps)
    min_item_blocks : the fewest blocks of an item (native/work_items.h)
    """

    def __init__(self, *, threads: int, cpus: list[int] | None = None, pin: bool = False,
                 faults: FaultPlan | None = None, grace_s: float = GRACE_S, stall_s: float = STALL_S,
                 min_item_blocks: int = MIN_ITEM_BLOCKS):
        if min_item_blocks < 1:
            raise ValueError(f"min_item_blocks must be >= 1, got {min_item_blocks}")
        if grace_s < 0 or stall_s < 0:
            raise ValueError(f"grace_s and stall_s must be >= 0, got {grace_s} and {stall_s}")
        module = load_native().module
        if module is None:
            raise RuntimeError(f"the native CPU worker pool is unavailable: {load_native().error}")
        self._pool = module.WorkerPool(threads, sorted(cpus or []), pin, grace_s, stall_s, min_item_blocks)
        if faults is not None and faults.cpu_faults:
            self._pool.set_faults(faults.raise_probability, faults.delay_probability, faults.delay_ms,
                                  faults.drop_probability, faults.thread_exits, faults.seed)
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

    @property
    def cpu_s(self) -> float:
        """CPU seconds the threads used since start-up, summed over threads (attending, spinning, claiming)."""
        return self._pool.cpu_ns() / 1e9

    @property
    def lock_count(self) -> int:
        """Mutex acquisitions since start-up (the pool's and the layers' prepare locks; none per item)."""
        return self._pool.lock_count()

    @property
    def item_path_locks(self) -> int:
        """Mutex acquisitions by a thread inside an item (claim to end), the error path aside: 0 by design."""
        return self._pool.item_path_locks()

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

    def expect(self, indices: list[int], seq: int) -> None:
        """A step begins whose registered layers `indices` will ring `seq` without a host call (a GPU's)."""
        self._pool.expect(list(indices), seq)

    def kick(self) -> None:
        """A host just rang a layer (the CPU device): wake the threads, replace any that ended."""
        self._pool.kick()

    def wait_done(self, index: int, seq: int, timeout_s: float) -> int:
        status = self._pool.wait_done(index, seq, timeout_s)
        return STATUS_DEADLINE if status < 0 else status

    def shutdown(self) -> None:
        self._pool.shutdown()
