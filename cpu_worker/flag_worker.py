"""The CPU part's workers driven by the hand-off words: the Python reference of the native pool.

digest -> select -> split -> device part / **CPU part** -> merge. Both
workers follow the protocol of scout_sglang.handoff_words, over the same
descriptors: per registered layer, the staged query, host page lists and
counts, the outputs O (fp32) and LSE (natural log), the host store and the
layer's row of control words. A worker that sees a layer's DOORBELL change
attends the ROWS rows of that layer's staging, then writes STATUS and DONE
(always, also on error). Nothing is submitted: the device (or, on the CPU
device, the engine's thread) only writes the words.

NativeWorkerPool (native/worker_pool.h) is what serves: C++ threads that take
no GIL. FlagWorker is the same protocol in Python, for hosts where the native
build fails and as the reference the tests compare the native pool with; its
threads run the native kernel or the torch path per sequence.

Jobs: one per (layer, sequence number), first come first served; a job whose
layer rang again before it finished is stale and abandoned (its result would
be ignored). Faults (faults.FaultPlan, tests only) are drawn once per job by
the thread that starts it: raise (the job fails), delay (it sleeps first),
thread exit (the thread ends, the job never finishes: the device's deadline
covers it; kick() replaces the thread).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, field

import torch
from scout_sglang.cpu_worker.checks import check_block_lists
from scout_sglang.cpu_worker.cpu_sets import cpus_of_threads
from scout_sglang.cpu_worker.dispatch import make_kernel, select_impl
from scout_sglang.cpu_worker.faults import FaultInjector, FaultPlan, InjectedThreadExit

from scout_sglang.handoff_words import (
    DONE,
    DOORBELL,
    ERROR_ROW,
    ROWS,
    STATUS,
    STATUS_DEADLINE,
    STATUS_ERROR,
    STATUS_OK,
)

logger = logging.getLogger("scout_sglang.cpu_worker")


@dataclass
class LayerPart:
    """The descriptor of one layer's CPU part: static buffers, registered once."""

    q: torch.Tensor  # [Bmax, Hq, D] staged query (store dtype)
    pages: torch.Tensor  # [Bmax, Hkv, C] int32 host pages
    counts: torch.Tensor  # [Bmax, Hkv] int32
    out_o: torch.Tensor  # [Bmax, Hq, D] fp32
    out_lse: torch.Tensor  # [Bmax, Hq] fp32, natural log
    k_cache: torch.Tensor  # [P, Hkv, S, D] host store
    v_cache: torch.Tensor
    words: torch.Tensor  # [WORDS_PER_LAYER] int32 control words
    scale: float


@dataclass
class _Job:
    index: int
    seq: int
    rows: int
    next_row: int = 0
    left: int = 0
    error_row: int = -1
    error: str | None = None
    stale: bool = False
    started: bool = False
    failed_by_plan: bool = False
    dropped: bool = False  # cpu_drop: empty results, reported OK
    workers: set = field(default_factory=set)


def check_part_row(part: LayerPart, row: int) -> str | None:
    """Why row `row` of a staged part cannot be attended (a count past the capacity, a page outside the store),
    or None."""
    try:
        check_block_lists(part.pages[row: row + 1], part.counts[row: row + 1], num_pages=part.k_cache.shape[0])
    except ValueError as error:
        return f"a list entry is outside its range: {error}"
    return None


class FlagWorker:
    """Threads that attend the CPU parts their layers' doorbells announce (Python; see module docstring).

    Parameters
    ----------
    threads : worker threads
    impl : "auto", "native" or "torch": the per-sequence kernel (cpu_worker.dispatch)
    cpus : the CPUs the threads may run on (None: the process's); pin : thread i on cpus[i % len(cpus)] alone
    faults : a FaultPlan (tests only) or None
    spin_s : how long an idle thread polls the doorbells before it sleeps until kick()
    """

    def __init__(self, *, threads: int = 1, impl: str = "auto", cpus: list[int] | None = None, pin: bool = False,
                 faults: FaultPlan | None = None, spin_s: float = 0.05):
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        self._kernel = make_kernel(select_impl(impl))
        self._faults = FaultInjector(faults) if faults is not None and faults.cpu_faults else None
        self._spin_s = spin_s
        self._cpus, self._pin = sorted(cpus) if cpus else None, pin
        self._parts: dict[int, LayerPart] = {}
        self._seen: dict[int, int] = {}
        self._jobs: list[_Job] = []
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._stop = False
        self._kicked = time.monotonic()
        self.replaced_threads = 0
        self.busy_s = 0.0  # seconds the threads spent attending, summed over threads
        self._layer_busy: dict[int, float] = {}
        self.errors: dict[int, str] = {}  # layer index -> the last error message
        self.threads = [self._start_thread(i) for i in range(threads)]

    def _start_thread(self, number: int) -> threading.Thread:
        thread = threading.Thread(target=self._loop, args=(number,), name=f"scout-cpu-part-{number}", daemon=True)
        thread.start()
        return thread

    def layer_busy_s(self, index: int) -> float:
        """Seconds the threads spent attending the parts of registered layer `index`."""
        return self._layer_busy.get(index, 0.0)

    def thread_ids(self) -> list[int]:
        """The OS ids of the live threads (for /proc accounting)."""
        return [thread.native_id for thread in self.threads if thread.is_alive() and thread.native_id]

    def thread_cpus(self) -> list[int]:
        """The CPUs the live threads may run on, read back from the OS."""
        return cpus_of_threads(self.threads)

    def register_layer(self, index: int, part: LayerPart) -> None:
        with self._lock:
            self._parts[index] = part
            self._seen[index] = int(part.words[DOORBELL])

    def expect(self, indices: list[int], seq: int) -> None:
        """A step begins whose layers `indices` will ring without a host call: wake the threads."""
        self.kick()

    def kick(self) -> None:
        """Wake the threads (a step begins or a part was rung) and replace any that ended."""
        with self._lock:
            self._kicked = time.monotonic()
            for i, thread in enumerate(self.threads):
                if not thread.is_alive() and not self._stop:
                    self.threads[i] = self._start_thread(i)
                    self.replaced_threads += 1
                    logger.warning("scout: a CPU part worker thread ended; replaced (%d so far)", self.replaced_threads)
            self._wake.notify_all()

    def wait_done(self, index: int, seq: int, timeout_s: float) -> int:
        """Wait until layer `index` finished part `seq` or `timeout_s` passed -> its status (STATUS_DEADLINE when
        not done in time)."""
        words = self._parts[index].words.numpy()  # host memory: read without a tensor op
        deadline = time.monotonic() + max(0.0, timeout_s)
        while int(words[DONE]) != seq:
            if time.monotonic() >= deadline:
                return STATUS_DEADLINE
            time.sleep(0)
        return int(words[STATUS])

    def shutdown(self) -> None:
        with self._lock:
            self._stop = True
            self._wake.notify_all()
        for thread in self.threads:
            thread.join(timeout=5)

    # -- worker threads ---------------------------------------------------------
    def _loop(self, number: int) -> None:
        if self._cpus:
            os.sched_setaffinity(0, [self._cpus[number % len(self._cpus)]] if self._pin else self._cpus)
        try:
            while True:
                with self._lock:
                    if self._stop:
                        return
                    self._collect_doorbells()
                    taken = self._take_row()
                    if taken is None:
                        if time.monotonic() - self._kicked > self._spin_s:
                            self._wake.wait(timeout=0.05)
                        continue
                self._run(*taken)
        except InjectedThreadExit:
            return

    def _collect_doorbells(self) -> None:
        for index, part in self._parts.items():
            seq = int(part.words[DOORBELL])
            if seq == self._seen[index]:
                continue
            self._seen[index] = seq
            for job in self._jobs:
                if job.index == index:
                    job.stale = True  # rung again: nobody reads its result any more
            rows = int(part.words[ROWS])
            dropped = self._faults is not None and self._faults.drops()
            self._jobs.append(_Job(index, seq, rows, left=rows, dropped=dropped))
            self._kicked = time.monotonic()
        self._jobs = [job for job in self._jobs if not (job.stale and not job.workers)]

    def _take_row(self):
        busy = set()  # layers with an older job still in flight: both write the same output rows
        for job in self._jobs:
            blocked = job.index in busy
            if job.workers:
                busy.add(job.index)
            if job.stale or blocked or job.next_row >= job.rows:
                continue
            first, job.started = not job.started, True
            row = job.next_row
            job.next_row += 1
            job.workers.add(row)
            return job, row, first
        for job in list(self._jobs):  # an empty part finishes at once
            if job.rows == 0 and not job.stale:
                self._finish(job)
        return None

    def _draw_faults(self, job: _Job) -> None:
        """The fault plan's draw for a job, by the thread that starts it (outside the lock: a delay holds back
        this job only)."""
        try:
            self._faults.before_work(job.index)
        except InjectedThreadExit:
            with self._lock:
                job.next_row = job.rows  # abandoned: nobody finishes it (the device's deadline covers it)
                job.workers.clear()
            raise
        except Exception as error:  # noqa: BLE001 - an injected fault fails the job
            job.failed_by_plan, job.error = True, str(error)

    def _run(self, job: _Job, row: int, first: bool) -> None:
        part = self._parts[job.index]
        if first and self._faults is not None:
            self._draw_faults(job)
        error = None
        if not job.failed_by_plan and not job.stale:
            began = time.perf_counter()
            try:
                error = check_part_row(part, row)
                if error is None and job.dropped:
                    part.out_o[row].zero_()
                    part.out_lse[row].fill_(float("-inf"))
                elif error is None:
                    self._kernel.decode(part.q, part.k_cache, part.v_cache, part.pages, part.counts, batch_index=row,
                                        out_o=part.out_o, out_lse=part.out_lse, out_index=row, scale=part.scale,
                                        head_begin=0, head_end=part.k_cache.shape[1], split_index=0, num_splits=1,
                                        scratch=self._scratch())
            except Exception as exc:  # noqa: BLE001 - reported in the status word
                error = f"{type(exc).__name__}: {exc}"
            busy = time.perf_counter() - began
        else:
            busy = 0.0
        with self._lock:
            self.busy_s += busy
            self._layer_busy[job.index] = self._layer_busy.get(job.index, 0.0) + busy
            job.workers.discard(row)
            if error is not None and job.error_row < 0:
                job.error_row, job.error = row, error
            job.left -= 1
            if job.left == 0:
                self._finish(job)

    def _finish(self, job: _Job) -> None:
        """Under the lock: the job's status, then DONE (the outputs were written before)."""
        if job in self._jobs:
            self._jobs.remove(job)
        words = self._parts[job.index].words
        failed = job.failed_by_plan or job.error is not None
        if failed:
            self.errors[job.index] = job.error or "failed"
        words[STATUS] = STATUS_ERROR if failed else STATUS_OK
        words[ERROR_ROW] = job.error_row if not job.failed_by_plan else 0
        words[DONE] = job.seq

    _local = threading.local()

    def _scratch(self):
        scratch = getattr(self._local, "scratch", None)
        if scratch is None:
            scratch = self._local.scratch = self._kernel.new_scratch()
        return scratch
