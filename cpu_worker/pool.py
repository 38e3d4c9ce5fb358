"""The CPU attention worker pool: the CPU part of co-attention, one layer ahead.

digest -> select -> device part / CPU part (here) -> merge. The caller submits
a batch (one decode token per sequence, the host KV of one layer, per-head
block lists) and later waits; results land in the caller's out_o / out_lse,
page-locked when CUDA is present (buffers.py) so the device side reads them
without another copy. A pool owns num_groups x threads_per_group threads; a
group works on one sequence at a time (group.py, partition.py). A group whose
thread ended is replaced by a new one at the next submit, so one dead thread
costs the tasks it held (their callers' deadlines cover them), not the pool.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from collections.abc import Sequence

import torch

from scout_sglang.cpu_worker.checks import check_decode_args
from scout_sglang.cpu_worker.cpu_sets import cpus_of_threads
from scout_sglang.cpu_worker.dispatch import make_kernel, select_impl
from scout_sglang.cpu_worker.errors import CpuAttentionError
from scout_sglang.cpu_worker.faults import FaultInjector, FaultPlan
from scout_sglang.cpu_worker.group import STOP, ThreadGroup

logger = logging.getLogger("scout_sglang.cpu_worker")


class CpuAttentionHandle:
    """Completion state of one `submit`; pass it to `CpuAttentionPool.wait`.

    Holds the submitted tensors until the tasks are done, so the caller's
    buffers stay alive while worker threads write them.
    """

    def __init__(self, q, k_cache, v_cache, block_table, counts, *, scale, out_o, out_lse, seq_ids, layer,
                 ready=None, num_parts: int = 0):
        self.q, self.k_cache, self.v_cache = q, k_cache, v_cache
        self.block_table, self.counts = block_table, counts
        self.out_o, self.out_lse = out_o, out_lse
        self.scale = float(scale)
        self.layer = layer
        self.batch_size = q.shape[0]
        self.seq_ids = list(seq_ids) if seq_ids is not None else list(range(self.batch_size))
        self.ready = ready  # None, or an object whose synchronize() returns once the inputs have landed
        self.num_parts = num_parts  # 0: one task per sequence; n: n tasks, part p takes sequences p, p + n, ...
        self._counts_rows: list[list[int]] | None = None
        self._lock = threading.Lock()
        self._remaining = self.batch_size
        self._errors: dict[int, BaseException] = {}
        self._done = threading.Event()
        if self.batch_size == 0:
            self._done.set()

    @property
    def counts_rows(self) -> list[list[int]]:
        """[B][Hkv] listed blocks, for work planning; read by a worker thread, once, after `ready`."""
        with self._lock:
            if self._counts_rows is None:
                self._counts_rows = self.counts.tolist()
            return self._counts_rows

    def done(self) -> bool:
        """True once every task of the submit has finished (or failed)."""
        return self._done.is_set()

    def _task_done(self, batch_index: int, error: BaseException | None) -> None:
        with self._lock:
            if error is not None:
                self._errors[batch_index] = error
            self._remaining -= 1
            finished = self._remaining == 0
        if finished:
            self._done.set()

    def _raise_if_failed(self) -> None:
        if not self._errors:
            return
        first = min(self._errors)
        cause = self._errors[first]
        raise CpuAttentionError(
            seq_id=self.seq_ids[first], batch_index=first, layer=self.layer, cause=cause, num_failed=len(self._errors)
        ) from cause


class CpuAttentionPool:
    """Thread groups that run sparse decode attention over host KV.

    Parameters
    ----------
    num_groups : int
        Groups; each works on one sequence at a time (>= 1).
    threads_per_group : int
        Threads per group that share a sequence (>= 1), by KV head or, with
        more threads than KV heads, by block range merged by LSE.
    pin_cores : None, "auto" or sequence of int
        None: no pinning. "auto": threads pinned round-robin to the CPUs of
        `cpu_set`. A sequence: one CPU per thread, in order group 0 thread 0,
        group 0 thread 1, ...
    cpu_set : None or sequence of int
        The CPUs the pool's threads may use (one rank's share of the host,
        cpu_sets.py); an unpinned thread may run on any of them. None: the
        CPUs this process may use.
    impl : {"auto", "native", "torch"}
        Kernel; "auto" prefers the native one (dispatch.select_impl).
    faults : FaultPlan or None
        Tests only: faults the worker threads inject into their own work (faults.py).

    Submitting from several threads at once is safe. Use as a context manager
    or call shutdown(), which finishes queued tasks and joins every thread.
    """

    def __init__(
        self,
        num_groups: int = 2,
        threads_per_group: int = 1,
        *,
        pin_cores: str | Sequence[int] | None = None,
        cpu_set: Sequence[int] | None = None,
        impl: str = "auto",
        faults: FaultPlan | None = None,
    ):
        for name, value in (("num_groups", num_groups), ("threads_per_group", threads_per_group)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an int, got {type(value).__name__}")
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        self._cores = _resolve_cores(pin_cores, num_groups * threads_per_group, cpu_set)
        self.impl = select_impl(impl)
        self.num_groups = num_groups
        self.threads_per_group = threads_per_group
        self._kernel = make_kernel(self.impl)
        self._tasks: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._closed = False
        self._injector = FaultInjector(faults) if faults is not None else None
        self.replaced_groups = 0  # groups started in place of one whose thread ended
        started: queue.SimpleQueue = queue.SimpleQueue()
        self._groups = [self._new_group(g, started) for g in range(num_groups)]
        for group in self._groups:
            group.start()
        errors = [e for e in (started.get() for _ in range(num_groups * threads_per_group)) if e is not None]
        if errors:
            self.shutdown()
            raise RuntimeError(f"CPU attention worker set-up failed: {errors[0]!r}") from errors[0]

    def _new_group(self, g: int, started: queue.SimpleQueue, generation: int = 0) -> ThreadGroup:
        per_group = self.threads_per_group
        cores = None if self._cores is None else self._cores[g * per_group : (g + 1) * per_group]
        return ThreadGroup(g, per_group, self._kernel, self._tasks, cores, started, self._injector, generation)

    def _replace_broken_groups(self) -> None:
        """Retire each group with a thread that ended and start a new one in its place (under the lock)."""
        for g, group in enumerate(self._groups):
            if group.whole():
                continue
            ended = [thread.name for thread in group.threads if not thread.is_alive()]
            group.retire()
            self.replaced_groups += 1
            started: queue.SimpleQueue = queue.SimpleQueue()
            replacement = self._new_group(g, started, generation=self.replaced_groups)
            replacement.start()
            errors = [e for e in (started.get() for _ in replacement.threads) if e is not None]
            if errors:  # as at start-up: the pool cannot work without it
                raise RuntimeError(f"CPU attention worker group {g} could not be replaced: {errors[0]!r}") from errors[0]
            self._groups[g] = replacement
            logger.warning("CPU attention worker thread(s) %s ended: thread group %d replaced (%d replacements so "
                           "far)", ", ".join(ended), g, self.replaced_groups)

    @property
    def threads(self) -> list[threading.Thread]:
        """Every worker thread of the pool."""
        return [t for group in self._groups for t in group.threads]

    def thread_cpus(self) -> list[int]:
        """The CPUs the pool's live worker threads may run on, read back from the OS."""
        return cpus_of_threads(self.threads)

    def submit(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        block_table: torch.Tensor,
        counts: torch.Tensor,
        *,
        scale: float,
        out_o: torch.Tensor,
        out_lse: torch.Tensor,
        seq_ids: Sequence[int] | None = None,
        layer: int = 0,
    ) -> CpuAttentionHandle:
        """Queue one task per sequence; return at once.

        Parameters
        ----------
        q : [B, Hq, D] bf16/fp16/fp32, CPU
            One decode query token per sequence.
        k_cache, v_cache : [P, Hkv, S, D], dtype of q, CPU
            Host KV of one layer, paged layout (scout_sglang.layout).
        block_table : [B, Hkv, C] int32
            Page ids per (sequence, KV head); entries at or past counts ignored.
            Every listed block is full (no partial tail on the CPU side).
        counts : [B, Hkv] int32
            Listed blocks, 0 <= counts <= C; 0 gives o = 0, lse = -inf.
        scale : float
            Softmax scale (> 0).
        out_o : [B, Hq, D] fp32 or dtype of q
            Receives attention outputs.
        out_lse : [B, Hq] fp32
            Receives LSE, natural log of sum(exp(scale * q.k)).
        seq_ids : sequence of B ints or None
            Named in errors (default: batch index).
        layer : int
            Named in errors.

        The tensors must not be modified or freed until wait() returns.
        """
        check_decode_args(
            q, k_cache, v_cache, block_table, counts,
            scale=scale, out_o=out_o, out_lse=out_lse, seq_ids=seq_ids, layer=layer,
        )  # fmt: skip
        handle = CpuAttentionHandle(
            q, k_cache, v_cache, block_table, counts,
            scale=scale, out_o=out_o, out_lse=out_lse, seq_ids=seq_ids, layer=layer,
        )  # fmt: skip
        with self._lock:
            if self._closed:
                raise RuntimeError("submit() on a CpuAttentionPool that was shut down")
            self._replace_broken_groups()
            for b in range(handle.batch_size):
                self._tasks.put((handle, b))
        return handle

    def submit_batch(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        block_table: torch.Tensor,
        counts: torch.Tensor,
        *,
        scale: float,
        out_o: torch.Tensor,
        out_lse: torch.Tensor,
        seq_ids: Sequence[int] | None = None,
        layer: int = 0,
        ready=None,
    ) -> CpuAttentionHandle:
        """`submit` for the decode step: one queue entry per thread group, not per sequence, and no value
        of the inputs read on the calling thread.

        Arguments as in `submit`. `ready` (optional) has a `synchronize()` that returns once the inputs have
        landed (a CUDA event recorded after the copies into them); the workers call it before reading. The
        block lists are validated by the workers, and a bad list fails the wait, naming the sequence.
        """
        check_decode_args(
            q, k_cache, v_cache, block_table, counts,
            scale=scale, out_o=out_o, out_lse=out_lse, seq_ids=seq_ids, layer=layer, check_values=False,
        )  # fmt: skip
        parts = min(len(self._groups), q.shape[0]) or 1
        handle = CpuAttentionHandle(
            q, k_cache, v_cache, block_table, counts,
            scale=scale, out_o=out_o, out_lse=out_lse, seq_ids=seq_ids, layer=layer, ready=ready, num_parts=parts,
        )  # fmt: skip
        with self._lock:
            if self._closed:
                raise RuntimeError("submit_batch() on a CpuAttentionPool that was shut down")
            self._replace_broken_groups()
            if handle.batch_size:
                for part in range(parts):
                    self._tasks.put((handle, part))
        return handle

    def wait(self, handle: CpuAttentionHandle, timeout: float | None = None) -> None:
        """Block until every task of `handle` is done.

        Raises CpuAttentionError (naming sequence and layer) if a task failed,
        TimeoutError if `timeout` seconds pass first.
        """
        if not isinstance(handle, CpuAttentionHandle):
            raise TypeError(f"handle must be a CpuAttentionHandle from submit(), got {type(handle).__name__}")
        if not handle._done.wait(timeout):
            raise TimeoutError(f"CPU attention tasks of layer {handle.layer} not done after {timeout} s")
        handle._raise_if_failed()

    def shutdown(self) -> None:
        """Finish queued tasks, then stop and join every worker thread (idempotent)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for _ in self._groups:
                self._tasks.put(STOP)
        for group in self._groups:
            group.join()

    def __enter__(self) -> CpuAttentionPool:
        return self

    def __exit__(self, *exc_info) -> None:
        self.shutdown()

    def __repr__(self) -> str:
        state = "shut down" if self._closed else "running"
        return (
            f"CpuAttentionPool(num_groups={self.num_groups}, threads_per_group={self.threads_per_group}, "
            f"impl={self.impl!r}, {state})"
        )


def _resolve_cores(pin_cores: str | Sequence[int] | None, num_threads: int,
                   cpu_set: Sequence[int] | None = None) -> list[frozenset[int]] | None:
    """The CPUs each worker thread may run on (one CPU when pinned), or None: no affinity of their own."""
    if pin_cores is None and cpu_set is None:
        return None
    if not hasattr(os, "sched_setaffinity"):
        raise ValueError("pin_cores and cpu_set need os.sched_setaffinity (Linux); pass None")
    process = sorted(os.sched_getaffinity(0))
    allowed = process if cpu_set is None else sorted(set(cpu_set))
    if not allowed or not set(allowed) <= set(process):
        raise ValueError(f"cpu_set {allowed} is not a non-empty subset of this process's CPU set {process}")
    if pin_cores is None:
        return [frozenset(allowed)] * num_threads
    if isinstance(pin_cores, str):
        if pin_cores != "auto":
            raise ValueError(f"pin_cores must be None, 'auto' or a sequence of ints, got {pin_cores!r}")
        return [frozenset({allowed[i % len(allowed)]}) for i in range(num_threads)]
    cores = list(pin_cores)
    if len(cores) != num_threads:
        raise ValueError(f"pin_cores must name one CPU per worker thread ({num_threads}), got {len(cores)}")
    for i, core in enumerate(cores):
        if isinstance(core, bool) or not isinstance(core, int):
            raise TypeError(f"pin_cores[{i}] must be an int, got {type(core).__name__}")
        if core not in allowed:
            raise ValueError(f"pin_cores[{i}] = {core} is not in the pool's CPU set {allowed}")
    return [frozenset({core}) for core in cores]
