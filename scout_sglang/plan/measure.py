"""Host figures measured on this machine (--measure): memory read bandwidth, the CPU attention's K/V
throughput, and the host cost of dispatching one op.

The read-bandwidth measurement and the standalone kernel's threads
(KernelThreads) are the ones benchmarks/bench_cpu_attention.py reports (it
imports them from here). The CPU attention figure runs the CPU part's kernel
(native, or the torch path where it does not build) from one thread per core on
a Qwen3-8B-like workload (Hkv 8, D 128, block 32, bf16) in a host cache larger
than the last-level cache, briefly: a planning figure, not a benchmark (that one
is bench_cpu_attention.py).
"""

from __future__ import annotations

import itertools
import os
import statistics
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

from scout_sglang.plan.figures import Figure

NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE, GROUP_SIZE = 8, 128, 32, 4
BATCH_SIZE, BLOCKS_PER_HEAD = 8, 64


def _threaded_seconds(work: list) -> float:
    """Wall time of running each callable of `work` on its own thread."""
    threads = [threading.Thread(target=fn) for fn in work]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - start


def read_bandwidth_gbs(buf, num_threads: int) -> dict:
    """One measurement per method of GB/s read by `num_threads` threads summing disjoint chunks of `buf` (a CPU
    tensor much larger than the last-level cache)."""
    chunks = buf.chunk(num_threads)
    arrays = [c.numpy() for c in chunks]
    nbytes = buf.numel() * buf.element_size()
    return dict(
        torch_sum=nbytes / _threaded_seconds([lambda c=c: c.sum() for c in chunks]) / 1e9,
        numpy_sum=nbytes / _threaded_seconds([lambda a=a: a.sum() for a in arrays]) / 1e9,
    )


def measure_read_bandwidth(*, gib: float = 0.5, rounds: int = 3, num_threads: int | None = None) -> Figure:
    """Best GB/s over `rounds` of `num_threads` threads (default: one per usable CPU) summing a `gib` GiB fp32
    buffer."""
    import torch

    threads = num_threads or len(os.sched_getaffinity(0))
    buf = torch.ones(int(gib * 2**28), dtype=torch.float32)  # 4 bytes an element
    best = max(max(read_bandwidth_gbs(buf, threads).values()) for _ in range(rounds))
    return Figure(round(best, 2), "GB/s", "measured", f"{threads} threads summing {gib:g} GiB, best of {rounds}")


class KernelThreads:
    """The CPU part's kernel measured on its own: `threads` Python threads that each attend whole sequences,
    taken first come first served from one queue (one thread per sequence at a time; "N groups of 1 thread" in
    earlier results). The kernel releases the GIL (the native one for its whole call, the torch path inside its
    ops), so the threads attend in parallel; the torch path also needs torch's intra-op threads at 1, which the
    caller sets (these threads are the parallelism). Not the engine's worker (cpu_worker/native_pool.py, driven
    by the doorbell words): the kernel alone, which that worker's numbers are compared with.

    Parameters
    ----------
    kernel : cpu_worker NativeKernel or TorchKernel (cpu_worker.dispatch.make_kernel)
    threads : int, >= 1
    cpus : the CPU each thread is pinned to, in the order the threads start (cpu_worker.core_plan.worker_cpus,
        as the engine's workers); None: the threads inherit the caller's CPUs (on a GPU host that a core plan
        moved to its host core, that is one core for every thread)
    """

    def __init__(self, kernel, threads: int, cpus: list[int] | None = None):
        self.kernel = kernel
        self._local = threading.local()
        pins = itertools.cycle(list(cpus)) if cpus else None

        def pin() -> None:  # each thread, as it starts, takes the next CPU (round-robin past the list's end)
            if pins is not None:
                os.sched_setaffinity(0, [next(pins)])

        self._executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="scout-cpu-kernel",
                                            initializer=pin)

    def submit(self, q, k_cache, v_cache, block_table, counts, *, scale: float, out_o, out_lse) -> list[Future]:
        """Queue one task per sequence and return at once; wait() on the result.

        q [B, Hq, D]; k_cache, v_cache [P, Hkv, S, D] (dtype of q); block_table [B, Hkv, C] int32; counts
        [B, Hkv] int32; out_o [B, Hq, D] fp32 or dtype of q; out_lse [B, Hq] fp32 (natural log); all on the CPU.
        Nothing is validated (the measurements build their inputs), and the tensors must live until wait()
        returns.
        """
        return [self._executor.submit(self._attend, q, k_cache, v_cache, block_table, counts, b, scale, out_o,
                                      out_lse) for b in range(q.shape[0])]

    @staticmethod
    def wait(tasks: list[Future]) -> None:
        """Block until every task of one submit is done; re-raise the first error."""
        for task in tasks:
            task.result()

    def shutdown(self) -> None:
        """Finish queued tasks, then join the threads (idempotent)."""
        self._executor.shutdown(wait=True)

    def _attend(self, q, k_cache, v_cache, block_table, counts, batch_index: int, scale: float, out_o,
                out_lse) -> None:
        if not hasattr(self._local, "scratch"):  # per thread, made once (None for the native kernel)
            self._local.scratch = self.kernel.new_scratch()
        self.kernel.decode(q, k_cache, v_cache, block_table, counts, batch_index=batch_index, out_o=out_o,
                           out_lse=out_lse, out_index=batch_index, scale=scale, head_begin=0,
                           head_end=k_cache.shape[1], split_index=0, num_splits=1, scratch=self._local.scratch)


def measure_cpu_attention(*, num_pages: int = 2048, rounds: int = 3, num_threads: int = 0) -> Figure:
    """GB/s of K+V the CPU part's kernel reads for decode attention over random blocks of a host cache of
    `num_pages` blocks (2048: 256 MiB of K+V), from `num_threads` threads (0: one per usable CPU) each attending
    whole sequences (KernelThreads)."""
    import torch

    from scout_sglang.cpu_worker.dispatch import make_kernel, select_impl

    threads = num_threads or len(os.sched_getaffinity(0))
    gen = torch.Generator().manual_seed(0)
    shape = (num_pages, NUM_KV_HEADS, BLOCK_SIZE, HEAD_DIM)  # [P, Hkv, S, D] HND pages
    k_cache = torch.randn(shape, generator=gen).to(torch.bfloat16)
    v_cache = torch.randn(shape, generator=gen).to(torch.bfloat16)
    q = torch.randn(BATCH_SIZE, NUM_KV_HEADS * GROUP_SIZE, HEAD_DIM, generator=gen).to(torch.bfloat16)  # [B, Hq, D]
    out_o = torch.empty(q.shape, dtype=torch.float32)  # [B, Hq, D]
    out_lse = torch.empty(q.shape[:2], dtype=torch.float32)  # [B, Hq], natural log
    tables = [torch.stack([torch.randperm(num_pages, generator=gen)[:BLOCKS_PER_HEAD]
                           for _ in range(BATCH_SIZE * NUM_KV_HEADS)]).view(BATCH_SIZE, NUM_KV_HEADS, -1).to(torch.int32)
              for _ in range(4)]  # [B, Hkv, K] distinct pages per head
    counts = torch.full((BATCH_SIZE, NUM_KV_HEADS), BLOCKS_PER_HEAD, dtype=torch.int32)  # [B, Hkv]
    nbytes = 2 * BATCH_SIZE * NUM_KV_HEADS * BLOCKS_PER_HEAD * BLOCK_SIZE * HEAD_DIM * 2  # K and V, bf16
    impl = select_impl("auto")
    runner = KernelThreads(make_kernel(impl), threads)
    torch_threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the torch path's ops must not fan out: the runner's threads are the parallelism
    best = 0.0
    try:
        for attempt in range(rounds + 1):  # the first pass warms up (scratch buffers, page faults)
            start = time.perf_counter()
            for table in tables:
                runner.wait(runner.submit(q, k_cache, v_cache, table, counts, scale=HEAD_DIM**-0.5, out_o=out_o,
                                          out_lse=out_lse))
            if attempt:
                best = max(best, nbytes * len(tables) / (time.perf_counter() - start) / 1e9)
    finally:
        runner.shutdown()
        torch.set_num_threads(torch_threads)
    return Figure(round(best, 2), "GB/s", "measured",
                  f"CPU attention kernel ({impl}), {threads} threads each attending whole sequences, batch "
                  f"{BATCH_SIZE} x {NUM_KV_HEADS} KV heads x {BLOCKS_PER_HEAD} random blocks of {BLOCK_SIZE}, bf16, "
                  f"best of {rounds}")


def measure_dispatch_us(*, ops: int = 20000) -> Figure:
    """Host microseconds to dispatch one small torch op on this CPU (what a launch costs before the driver)."""
    import torch

    a, b = torch.ones(8), torch.ones(8)
    out = torch.empty(8)
    for _ in range(1000):  # warm-up
        torch.add(a, b, out=out)
    start = time.perf_counter()
    for _ in range(ops):
        torch.add(a, b, out=out)
    return Figure(round((time.perf_counter() - start) / ops * 1e6, 2), "us", "measured",
                  f"torch.add on 8 elements, {ops} times, on this host")


def extra_kv_gbs(decode_at, *, short: int, long: int, bytes_per_token: int, rounds: int = 20) -> float:
    """GB/s of K/V an attention kernel gets through: `decode_at(context)` returns a callable that decodes one
    step at that context; the extra K/V of `long` over `short` tokens (`bytes_per_token` for the whole batch)
    over the extra time, the median call of `rounds` each (the typical call, as a server's decode rate is the
    median of its steps), so that the per-call costs cancel out."""
    typical = {}
    for context in (short, long):
        decode = decode_at(context)
        decode()  # warm-up
        times = []
        for _ in range(rounds):
            start = time.perf_counter()
            decode()
            times.append(time.perf_counter() - start)
        typical[context] = statistics.median(times)
    return bytes_per_token * (long - short) / max(typical[long] - typical[short], 1e-9) / 1e9
