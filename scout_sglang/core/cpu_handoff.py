"""The hand-off of one layer's CPU part: staging buffers in, one pool submit, O and LSE out.

Per offloaded layer, buffers of fixed capacity (max_requests rows) hold the
query the CPU attends with, its host page lists and counts, and the CPU's
output (O fp32, LSE natural log). They are page-locked on CUDA: the device
copies the query and lists in without a sync, records an event, and the pool's
workers wait on that event before reading (CpuAttentionPool.submit_batch);
after the wait the device copies O and LSE back before the merge. On the CPU
the same code runs over the same buffers (the copies are plain copies). A
layer's buffers are reused the next step, after its result was collected.

A CPU part that fails, or is not done `deadline_s` after its submit, costs
latency, never a token: the layer computes it itself from the same staged
inputs and host store (cpu_fallback.py). A late task keeps running into its
buffers; the layer's next submit takes a fresh set if it is still running.
When most parts fail, the worker is given no work for a while (cpu_health.py):
the staged part is computed by the layer at once ("device_only"), not after a
deadline.
"""

from __future__ import annotations

import logging
import time
from typing import NamedTuple

import torch

from scout_sglang.core.cpu_fallback import attend_listed_host_blocks
from scout_sglang.core.cpu_health import CpuWorkerHealth
from scout_sglang.cpu_worker.errors import CpuAttentionError

logger = logging.getLogger("scout_sglang.core")
# the task raised; the task was not done by its deadline; the worker was given no task (cpu_health.py)
FALLBACK_CAUSES = ("error", "deadline", "device_only")
LOG_INTERVAL_S = 10.0  # at most one fallback message per interval; it counts the ones not logged


class CpuResult(NamedTuple):
    """One layer's CPU part, as merged."""

    o: torch.Tensor  # [B, Hq, D] fp32, on the device
    lse: torch.Tensor  # [B, Hq] fp32 natural log, on the device
    waited_s: float  # time spent waiting for the task (the fallback's compute not included)
    fallback: str | None  # None: the task's result; else the cause (FALLBACK_CAUSES) and the layer computed it


class StagedPart(NamedTuple):
    """A CPU part staged but not handed to the worker (device-only), as the layer computes it."""

    q: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    block_table: torch.Tensor
    counts: torch.Tensor
    scale: float


class CpuHandoff:
    """Staging buffers and in-flight submits of the CPU part, per layer.

    Parameters
    ----------
    layers : the layers with a CPU part
    max_batch : rows of every buffer
    num_qo_heads, num_kv_heads, head_dim, capacity : Hq, Hkv, D, C (CPU list capacity)
    dtype : dtype of the host store (the query is staged in it)
    pool : a CpuAttentionPool
    device : where the layers run
    deadline_s : seconds after its submit that a CPU part may take before the layer computes it itself
    impl : the sparse_decode implementation of that fallback (None: kernels' choice for the device)
    health : when the worker is given work (default: a CpuWorkerHealth of its defaults)
    """

    def __init__(self, layers, *, max_batch: int, num_qo_heads: int, num_kv_heads: int, head_dim: int, capacity: int,
                 dtype: torch.dtype, pool, device: torch.device, deadline_s: float, impl: str | None = None,
                 health: CpuWorkerHealth | None = None):
        if not deadline_s > 0:
            raise ValueError(f"deadline_s must be > 0, got {deadline_s}")
        self.pool, self.device, self.deadline_s, self.impl = pool, device, deadline_s, impl
        self.health = health or CpuWorkerHealth()
        self._buffer_shapes = {  # name -> (shape after the batch dimension, dtype)
            "q": ((num_qo_heads, head_dim), dtype),  # [Bmax, Hq, D]
            "pages": ((num_kv_heads, capacity), torch.int32),  # [Bmax, Hkv, C] host pages
            "counts": ((num_kv_heads,), torch.int32),  # [Bmax, Hkv]
            "out_o": ((num_qo_heads, head_dim), torch.float32),  # [Bmax, Hq, D]
            "out_lse": ((num_qo_heads,), torch.float32),  # [Bmax, Hq] natural log
        }
        self._max_batch = max_batch
        self.q, self.pages, self.counts, self.out_o, self.out_lse = {}, {}, {}, {}, {}
        for layer in layers:
            self._allocate(layer)
        self._in_flight: dict[int, tuple[object, float]] = {}  # layer -> (handle, submit time)
        self._late: dict[int, object] = {}  # layer -> handle of a task collected before it finished
        self.replaced_buffer_sets = 0  # fresh sets taken because a late task still used the old one
        self._last_log, self._unlogged = float("-inf"), {}  # cause -> fallbacks not logged yet

    def _allocate(self, layer: int) -> None:
        pin = self.device.type == "cuda"
        for name, (shape, dtype) in self._buffer_shapes.items():
            getattr(self, name)[layer] = torch.zeros(self._max_batch, *shape, dtype=dtype, pin_memory=pin)

    def submit(self, layer: int, q: torch.Tensor, pages: torch.Tensor, counts: torch.Tensor, host_k: torch.Tensor,
               host_v: torch.Tensor, *, scale: float, seq_ids: list[int] | None = None) -> None:
        """Stage q [B, Hq, D], pages [B, Hkv, C] int32 and counts [B, Hkv] int32 and start the CPU part
        (seq_ids: named in errors)."""
        if layer in self._in_flight:
            raise RuntimeError(f"layer {layer}: a CPU part is already in flight (its result was never collected)")
        late = self._late.pop(layer, None)
        if late is not None and not late.done():  # it still reads and writes the old set; its handle keeps it alive
            self._allocate(layer)
            self.replaced_buffer_sets += 1
        batch_size = q.shape[0]
        q_in, pages_in, counts_in = self.q[layer][:batch_size], self.pages[layer][:batch_size], self.counts[layer][:batch_size]
        q_in.copy_(q, non_blocking=True)
        pages_in.copy_(pages, non_blocking=True)
        counts_in.copy_(counts, non_blocking=True)
        if not self.health.use_worker():
            self._in_flight[layer] = (StagedPart(q_in, host_k, host_v, pages_in, counts_in, scale), time.perf_counter())
            return
        ready = None
        if self.device.type == "cuda":
            ready = torch.cuda.Event()
            ready.record()
        handle = self.pool.submit_batch(
            q_in, host_k, host_v, pages_in, counts_in, scale=scale, out_o=self.out_o[layer][:batch_size],
            out_lse=self.out_lse[layer][:batch_size], seq_ids=seq_ids, layer=layer, ready=ready)
        self._in_flight[layer] = (handle, time.perf_counter())

    def in_flight(self, layer: int) -> bool:
        return layer in self._in_flight

    def collect(self, layer: int) -> CpuResult:
        """The layer's CPU part: the task's result, or the layer's own when the task failed or is not done by
        its deadline (the task is then left to finish into buffers nobody reads)."""
        handle, submitted = self._in_flight.pop(layer)
        if isinstance(handle, StagedPart):
            o, lse = attend_listed_host_blocks(handle.q, handle.k_cache, handle.v_cache, handle.block_table,
                                               handle.counts, scale=handle.scale, device=self.device, impl=self.impl)
            return CpuResult(o, lse, 0.0, "device_only")
        start = time.perf_counter()
        cause = None
        try:
            self.pool.wait(handle, timeout=max(0.0, submitted + self.deadline_s - start))
        except TimeoutError:
            cause, detail = "deadline", f"not done {1e3 * self.deadline_s:g} ms after its submit"
            self._late[layer] = handle
        except CpuAttentionError as error:
            cause, detail = "error", error
        waited = time.perf_counter() - start
        self.health.record(cause is not None, cause)
        batch_size = handle.batch_size
        if cause is None:
            o = self.out_o[layer][:batch_size].to(self.device, non_blocking=True)
            lse = self.out_lse[layer][:batch_size].to(self.device, non_blocking=True)
            return CpuResult(o, lse, waited, None)
        self._log_fallback(layer, cause, detail)
        # The task's own inputs (staged query, lists, counts) and host store: what it would have attended.
        o, lse = attend_listed_host_blocks(handle.q, handle.k_cache, handle.v_cache, handle.block_table,
                                           handle.counts, scale=handle.scale, device=self.device, impl=self.impl)
        return CpuResult(o, lse, waited, cause)

    def discard(self) -> None:
        """Drop every submit still in flight (a step that ended early, or closing), each after waiting up to
        its deadline; one not done by then is left late (its buffers are replaced before reuse)."""
        for layer in list(self._in_flight):
            handle, submitted = self._in_flight.pop(layer)
            if isinstance(handle, StagedPart):
                continue
            try:
                self.pool.wait(handle, timeout=max(0.0, submitted + self.deadline_s - time.perf_counter()))
            except TimeoutError:
                self._late[layer] = handle
            except Exception:  # noqa: BLE001 - its result is dropped anyway
                pass

    def _log_fallback(self, layer: int, cause: str, detail) -> None:
        """A warning at most every LOG_INTERVAL_S, with the fallbacks by cause since the previous one."""
        self._unlogged[cause] = self._unlogged.get(cause, 0) + 1
        now = time.monotonic()
        if now - self._last_log < LOG_INTERVAL_S:
            return
        counts = ", ".join(f"{name} {count}" for name, count in sorted(self._unlogged.items()))
        logger.warning("scout: the CPU part of layer %d was computed by the layer itself (%s: %s); fallbacks since "
                       "the last message: %s", layer, cause, detail, counts)
        self._last_log, self._unlogged = now, {}
