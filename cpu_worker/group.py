"""One thread group of the CPU attention pool: a leader and T-1 helpers.

The leader takes one task (one sequence) at a time from the pool's queue,
splits it into work items (partition.py), hands all but the first to its
helpers, runs the first itself, waits for the helpers, merges partials when the
block lists were split, and reports the task to its handle.

    pool queue ──> leader ──┬─ item 0 (itself)
                            ├─ item 1 ──> helper 1 inbox
                            └─ item T-1 ──> helper T-1 inbox
                   <── done queue ──┘

A thread that ends on an error no task handler catches (its task is left
undone: the caller's deadline covers it) logs why; the pool sees the group is
no longer whole at its next submit, retires it and starts a new one
(pool.py). A retired leader hands back whatever it takes from the shared queue
and ends.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from typing import TYPE_CHECKING

import torch

from scout_sglang.cpu_worker.checks import check_block_lists
from scout_sglang.cpu_worker.partition import WorkItem, merge_partials, plan_work

if TYPE_CHECKING:
    from scout_sglang.cpu_worker.faults import FaultInjector
    from scout_sglang.cpu_worker.native_kernel import NativeKernel
    from scout_sglang.cpu_worker.pool import CpuAttentionHandle
    from scout_sglang.cpu_worker.torch_kernel import TorchKernel

STOP = None  # queue sentinel
logger = logging.getLogger("scout_sglang.cpu_worker")


class WorkerLost(RuntimeError):
    """What a retired group's leader gets in place of the result of a helper thread that ended."""


class ThreadGroup:
    """Threads that work on one sequence at a time.

    Parameters
    ----------
    index : int
        Group number (thread names: scout-cpu-attn-g{index}-t{thread}).
    num_threads : int
        T, threads in the group (leader included).
    kernel : NativeKernel | TorchKernel
    tasks : queue.SimpleQueue
        The pool's queue of (handle, batch_index) tasks, or (handle, part) for a
        submit_batch (handle.num_parts > 0); STOP ends the leader.
    cores : list of frozenset of int, or None
        The CPUs each thread may run on (one CPU: pinned), or None: the process's.
    started : queue.SimpleQueue
        Each thread puts None (ready) or the exception that stopped its set-up.
    faults : FaultInjector or None
        Test-only faults drawn before each queue entry's work (faults.py); None: none.
    """

    def __init__(
        self,
        index: int,
        num_threads: int,
        kernel: NativeKernel | TorchKernel,
        tasks: queue.SimpleQueue,
        cores: list[frozenset[int]] | None,
        started: queue.SimpleQueue,
        faults: FaultInjector | None = None,
        generation: int = 0,
    ):
        self.index = index
        self._retired = threading.Event()
        self._kernel = kernel
        self._faults = faults
        self._tasks = tasks
        self._started = started
        self._inboxes = [queue.SimpleQueue() for _ in range(num_threads - 1)]
        self._done = queue.SimpleQueue()
        self._partials: tuple[torch.Tensor, torch.Tensor] | None = None  # [T, Hq, D], [T, Hq] fp32
        cores = cores or [None] * num_threads
        prefix = f"scout-cpu-attn-g{index}" + (f"r{generation}" if generation else "")
        self.threads = [threading.Thread(target=self._lead, args=(cores[0],), name=f"{prefix}-t0", daemon=True)]
        for t, inbox in enumerate(self._inboxes, start=1):
            self.threads.append(
                threading.Thread(target=self._help, args=(inbox, cores[t]), name=f"{prefix}-t{t}", daemon=True)
            )

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def join(self) -> None:
        for thread in self.threads:
            thread.join()

    def whole(self) -> bool:
        """Whether every thread of the group is still running."""
        return all(thread.is_alive() for thread in self.threads)

    def retire(self) -> None:
        """Stop using this group (a thread of it ended): its leader finishes what it holds, then ends; a leader
        waiting on an ended helper gets WorkerLost for it."""
        self._retired.set()
        for thread, inbox in zip(self.threads[1:], self._inboxes):
            inbox.put(STOP)
            if not thread.is_alive():
                self._done.put(WorkerLost(f"CPU attention worker thread {thread.name} ended"))

    # -- thread bodies --------------------------------------------------------

    def _set_up(self, cpus: frozenset[int] | None) -> object | None:
        """Bind the calling thread to its CPUs and make its scratch; report to `started`."""
        try:
            if cpus is not None:
                os.sched_setaffinity(0, cpus)  # 0 = the calling thread on Linux
            if self._kernel.name == "torch":
                # torch ops inside a task must not fan out to torch's own pool:
                # the pool's threads are the parallelism.
                torch.set_num_threads(1)
            scratch = self._kernel.new_scratch()
        except Exception as exc:  # noqa: BLE001 - reported to the constructor
            self._started.put(exc)
            return None
        self._started.put(None)
        return scratch

    def _lead(self, cpus: frozenset[int] | None) -> None:
        scratch = self._set_up(cpus)
        try:
            self._lead_loop(scratch)
        except BaseException as exc:  # noqa: BLE001 - an error no task handler catches: the thread ends
            logger.error("CPU attention worker thread %s ended (%r); its task is left to the caller's deadline, and "
                         "the pool replaces the thread group at its next submit", threading.current_thread().name, exc)
        finally:
            for inbox in self._inboxes:
                inbox.put(STOP)

    def _lead_loop(self, scratch) -> None:
        while (task := self._tasks.get()) is not STOP or self._retired.is_set():
            if self._retired.is_set():  # a live group takes it (a STOP too: it is some live group's)
                self._tasks.put(task)
                return
            handle, index = task
            if handle.num_parts:
                self._run_part(handle, index, scratch)
                continue
            try:
                if self._faults is not None:
                    self._faults.before_work(handle.layer)
                self._run_task(handle, index, scratch)
            except Exception as exc:  # noqa: BLE001 - surfaced by wait()
                handle._task_done(index, exc)
            else:
                handle._task_done(index, None)

    def _help(self, inbox: queue.SimpleQueue, cpus: frozenset[int] | None) -> None:
        scratch = self._set_up(cpus)
        while (job := inbox.get()) is not STOP:
            handle, batch_index, item, out_index, partial = job
            try:
                self._run_item(handle, batch_index, item, out_index, partial, scratch)
            except Exception as exc:  # noqa: BLE001 - handed to the leader
                self._done.put(exc)
            else:
                self._done.put(None)

    # -- work -------------------------------------------------------------------

    def _run_part(self, handle: CpuAttentionHandle, part: int, scratch: object) -> None:
        """Part `part` of a submit_batch: sequences part, part + num_parts, ... once the inputs have landed."""
        batch = range(part, handle.batch_size, handle.num_parts)
        try:
            if handle.ready is not None:
                handle.ready.synchronize()
            if self._faults is not None:
                self._faults.before_work(handle.layer)
            check_block_lists(handle.block_table, handle.counts, num_pages=handle.k_cache.shape[0])
        except Exception as exc:  # noqa: BLE001 - every sequence of the part fails with it
            for batch_index in batch:
                handle._task_done(batch_index, exc)
            return
        for batch_index in batch:
            try:
                self._run_task(handle, batch_index, scratch)
            except Exception as exc:  # noqa: BLE001 - surfaced by wait()
                handle._task_done(batch_index, exc)
            else:
                handle._task_done(batch_index, None)

    def _run_task(self, handle: CpuAttentionHandle, batch_index: int, scratch: object) -> None:
        items = plan_work(handle.counts_rows[batch_index], len(self.threads))
        partial = items[0].num_splits > 1
        if partial:
            self._ensure_partials(len(items), handle.out_o.shape[1], handle.out_o.shape[2])
        for t, item in enumerate(items[1:], start=1):
            self._inboxes[t - 1].put((handle, batch_index, item, t if partial else batch_index, partial))
        error = None
        try:
            self._run_item(handle, batch_index, items[0], 0 if partial else batch_index, partial, scratch)
        except Exception as exc:  # noqa: BLE001 - after the helpers are collected
            error = exc
        for _ in items[1:]:
            helper_error = self._done.get()
            error = error or helper_error
        if error is not None:
            raise error
        if partial:
            partial_o, partial_lse = self._partials
            merge_partials(
                partial_o[: len(items)], partial_lse[: len(items)], handle.out_o[batch_index], handle.out_lse[batch_index]
            )

    def _run_item(
        self, handle: CpuAttentionHandle, batch_index: int, item: WorkItem, out_index: int, partial: bool, scratch
    ) -> None:
        out_o, out_lse = self._partials if partial else (handle.out_o, handle.out_lse)
        self._kernel.decode(
            handle.q,
            handle.k_cache,
            handle.v_cache,
            handle.block_table,
            handle.counts,
            batch_index=batch_index,
            out_o=out_o,
            out_lse=out_lse,
            out_index=out_index,
            scale=handle.scale,
            head_begin=item.head_begin,
            head_end=item.head_end,
            split_index=item.split_index,
            num_splits=item.num_splits,
            scratch=scratch,
        )

    def _ensure_partials(self, num_items: int, num_qo_heads: int, head_dim: int) -> None:
        if self._partials is not None:
            partial_o, _ = self._partials
            if partial_o.shape[0] >= num_items and partial_o.shape[1:] == (num_qo_heads, head_dim):
                return
        self._partials = (
            torch.empty(len(self.threads), num_qo_heads, head_dim, dtype=torch.float32),  # [T, Hq, D]
            torch.empty(len(self.threads), num_qo_heads, dtype=torch.float32),  # [T, Hq]
        )
