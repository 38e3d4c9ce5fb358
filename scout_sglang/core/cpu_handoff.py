"""The hand-off of each layer's CPU part: staging buffers and control words, the ring, and the resolve.

digest -> select -> split -> device part / **CPU part** -> merge. Per layer
with a CPU part, fixed-capacity buffers (max_batch rows) hold what the split
stage stages (the query, host page lists, counts) and what the worker writes
back (O fp32, LSE natural log): page-locked on CUDA, where the device writes
and reads them through unified addressing. The layer's row of control words
(scout_sglang.handoff_words) carries the protocol; the worker
(cpu_worker.NativeWorkerPool, or the Python FlagWorker) is registered with
every layer's buffers once, at construction, and only ever reads words.

    ring(layer)      after the split: on CUDA a one-program kernel (ROWS, DOORBELL); on the CPU device the
                     engine's thread writes the words and wakes the worker
    resolve(layer)   before the merge: wait for DONE with the deadline, compute the part on the device when
                     the worker failed, was late or was bypassed (the fallback, exactly, from the same
                     staging and host store), merge. On CUDA three kernels, no host step.

Nothing on this path waits on the host on CUDA: a failed, late or bypassed
part shows as the layer's status (a device word), read once per step with the
counters (`step_statuses`). When most parts fail, the worker is given no work
for a while (cpu_health.py): the plan's BYPASS word makes every layer compute
its part on the device at once instead of after a deadline.
"""

from __future__ import annotations

import itertools
import logging
import time

import torch

from scout_sglang.core.cpu_fallback import attend_listed_host_blocks
from scout_sglang.core.cpu_health import CpuWorkerHealth
from scout_sglang.cpu_worker.flag_worker import LayerPart
from scout_sglang.handoff_words import (
    CAUSE_OF_STATUS,
    DOORBELL,
    ERROR_ROW,
    ROWS,
    STATUS_DEVICE_ONLY,
    STATUS_OK,
    WORDS_PER_LAYER,
)
from scout_sglang.kernels.cpu_part import merge_cpu_part, ring_doorbell, wait_cpu_part
from scout_sglang.kernels.estimate import CpuPartResult, merge_with_estimate

logger = logging.getLogger("scout_sglang.core")
# the worker failed; it was not done by the deadline; it was given no part (cpu_health.py)
FALLBACK_CAUSES = tuple(CAUSE_OF_STATUS.values())
LOG_INTERVAL_S = 10.0
_WORKER_IDS = itertools.count()  # at most one fallback message per interval; it counts the ones not logged


class CpuHandoff:
    """Staging, control words and fallback buffers of the CPU part, per layer.

    Parameters
    ----------
    layers : the layers with a CPU part
    max_batch : rows of every buffer
    num_qo_heads, num_kv_heads, head_dim, capacity : Hq, Hkv, D, C (CPU list capacity)
    dtype : dtype of the host store (the query is staged in it)
    device : where the layers run
    host_k, host_v : {layer: [P, Hkv, S, D]} the host store the worker and the fallback read
    scale : softmax scale
    worker : a NativeWorkerPool or FlagWorker (register_layer, kick, wait_done), or None (device-only)
    deadline_s : seconds after the ring that a part may take before the layer computes it itself
    impl : the sparse_decode implementation of the fallback (None: kernels' choice for the device)
    health : when the worker is given work (default: a CpuWorkerHealth of its defaults)
    workspace : the Triton decode's static split buffer the fallback may use (None: allocated when needed)
    """

    def __init__(self, layers, *, max_batch: int, num_qo_heads: int, num_kv_heads: int, head_dim: int, capacity: int,
                 dtype: torch.dtype, device: torch.device, host_k: dict, host_v: dict, scale: float, worker,
                 deadline_s: float, impl: str | None = None, health: CpuWorkerHealth | None = None,
                 workspace: torch.Tensor | None = None):
        if not deadline_s > 0:
            raise ValueError(f"deadline_s must be > 0, got {deadline_s}")
        self.device, self.deadline_s, self.impl, self.scale = torch.device(device), deadline_s, impl, scale
        self.merge_impl = impl if impl in ("triton", "torch") else None
        self.on_cuda = self.device.type == "cuda"
        # Ring, wait and the fallback as kernels: on CUDA, and on the CPU device's Triton path (the interpreter)
        self.kernels = self.on_cuda or impl == "triton"
        self.health = health or CpuWorkerHealth()
        self.worker = worker
        self.host_k, self.host_v, self.workspace = host_k, host_v, workspace
        self.layers = tuple(layers)
        self.index = {layer: i for i, layer in enumerate(self.layers)}  # row of the words and statuses
        # The layer's name with the worker: unique in the process, so engines may share one worker.
        self.worker_id = {layer: next(_WORKER_IDS) for layer in self.layers}
        pin = self.on_cuda
        rows = max_batch

        def staged(*shape, dtype):
            return torch.zeros(rows, *shape, dtype=dtype, pin_memory=pin)

        self.q = {layer: staged(num_qo_heads, head_dim, dtype=dtype) for layer in self.layers}  # [Bmax, Hq, D]
        self.pages = {layer: staged(num_kv_heads, capacity, dtype=torch.int32) for layer in self.layers}  # [Bmax, Hkv, C]
        self.counts = {layer: staged(num_kv_heads, dtype=torch.int32) for layer in self.layers}  # [Bmax, Hkv]
        self.out_o = {layer: staged(num_qo_heads, head_dim, dtype=torch.float32) for layer in self.layers}
        self.out_lse = {layer: staged(num_qo_heads, dtype=torch.float32) for layer in self.layers}  # natural log
        count = len(self.layers)
        self.words = torch.zeros(count, WORDS_PER_LAYER, dtype=torch.int32, pin_memory=pin)  # [L, words]
        # The fallback's result (device): a late worker may still write out_o/out_lse, never these.
        self.fb_o = torch.zeros(rows, num_qo_heads, head_dim, dtype=torch.float32, device=self.device)
        self.fb_lse = torch.zeros(rows, num_qo_heads, dtype=torch.float32, device=self.device)
        self.status = torch.zeros(count, dtype=torch.int32, device=self.device)  # [L] handoff_words.STATUS_*
        # [L, statuses] parts by outcome since the last read: what the health circuit and the fallback counts learn
        self.outcomes = torch.zeros(count, len(CAUSE_OF_STATUS) + 1, dtype=torch.int32, device=self.device)
        self.ring_ns = torch.zeros(count, dtype=torch.int64, device=self.device)
        self.wait_ns = torch.zeros(count, dtype=torch.int64, device=self.device)  # summed over the step
        self.window_ns = torch.zeros(count, dtype=torch.int64, device=self.device)  # ring to wait, summed likewise
        self.zero_copy_ns = torch.zeros(count, dtype=torch.int64, device=self.device)  # the CPU split's device reads
        # The CPU device's stream is this thread: it writes the words and statuses through numpy views (host
        # memory; no tensor op to dispatch, as the kernels that do this on CUDA are none of the layer's ops).
        self._words_np = self.words.numpy() if not self.on_cuda else None
        self._status_np = self.status.numpy() if not self.on_cuda else None
        self._outcomes_np = self.outcomes.numpy() if not self.on_cuda else None
        self._wait_np = self.wait_ns.numpy() if not self.on_cuda else None
        self._window_np = self.window_ns.numpy() if not self.on_cuda else None
        self._zero_copy_np = self.zero_copy_ns.numpy() if not self.on_cuda else None
        self._rung_at: dict[int, float] = {}
        self._last_log, self._unlogged = float("-inf"), {}
        if worker is not None:
            for layer in self.layers:
                worker.register_layer(self.worker_id[layer], LayerPart(
                    q=self.q[layer], pages=self.pages[layer], counts=self.counts[layer], out_o=self.out_o[layer],
                    out_lse=self.out_lse[layer], k_cache=host_k[layer], v_cache=host_v[layer],
                    words=self.words[self.index[layer]], scale=scale))

    def use_worker(self) -> bool:
        """Whether this step hands its parts to the worker (else BYPASS: device-only), asked once per step."""
        return self.worker is not None and self.health.use_worker()

    def begin_step(self, seq: int, bypass: bool) -> None:
        """A step `seq` is planned: where the device rings without a host call (kernels), the worker is told which
        layers will ring, so that its threads spin from the first ring to the last part, then park."""
        if self.worker is not None and self.kernels and not bypass:
            self.worker.expect([self.worker_id[layer] for layer in self.layers], seq)

    def ring(self, layer: int, plan) -> None:
        i = self.index[layer]
        if self.kernels:
            ring_doorbell(plan.header, self.words[i], self.ring_ns[i:i + 1])
            return
        self._rung_at[i] = time.monotonic()
        if not plan.bypass:
            self._words_np[i, ROWS] = plan.rows
            self._words_np[i, DOORBELL] = plan.seq
            self.worker.kick()

    def resolve(self, layer: int, plan, o: torch.Tensor, lse: torch.Tensor, out: torch.Tensor, *,
                estimate=None, zero_copy=None) -> None:
        """out <- merge of the device part (o, lse) with the layer's CPU part: the worker's, or the fallback's.
        estimate: (the layer's query, kernels.estimate.UnattendedBlocks) to merge the estimate of the blocks
        attended nowhere too, in the same launch; None: no estimate. zero_copy: (o, lse) of the CPU split's share
        that the device read from the host store, merged in the same launch; None: no split."""
        self.wait(layer, plan)
        self.finish(layer, plan, o, lse, out, estimate=estimate, zero_copy=zero_copy)

    def wait(self, layer: int, plan) -> None:
        """Wait for the worker's DONE (the deadline after the ring): the layer's status. A kernel on CUDA."""
        i = self.index[layer]
        if self.kernels:
            wait_cpu_part(plan.header, self.words[i], self.ring_ns[i:i + 1], self.status[i:i + 1],
                          self.wait_ns[i:i + 1], self.window_ns[i:i + 1], self.outcomes[i],
                          deadline_ns=int(self.deadline_s * 1e9))
        else:
            self._wait_on_host(i, plan)

    def finish(self, layer: int, plan, o: torch.Tensor, lse: torch.Tensor, out: torch.Tensor, *,
               estimate=None, zero_copy=None) -> None:
        """The fallback where the status is not OK, and the merge into out (with the estimate, when given)."""
        i, rows = self.index[layer], plan.rows
        status = self.status[i:i + 1]
        if self.kernels:
            from scout_sglang.kernels.triton.decode import sparse_decode_triton

            # The fallback, always launched and gated by the status: it attends the staging over the host store
            # in place where the worker's result is not good, and writes empty results otherwise.
            sparse_decode_triton(self.q[layer][:rows], self.host_k[layer], self.host_v[layer], self.pages[layer][:rows],
                                 self.counts[layer][:rows], None, self.fb_o[:rows], self.fb_lse[:rows],
                                 scale=self.scale, gate=status, workspace=self.workspace)
        elif self._status_np[i] != STATUS_OK:  # the CPU device's torch path: computed only when needed
            o_fb, lse_fb = attend_listed_host_blocks(self.q[layer][:rows], self.host_k[layer], self.host_v[layer],
                                                     self.pages[layer][:rows], self.counts[layer][:rows],
                                                     scale=self.scale, device=self.device, impl=self.impl)
            self.fb_o[:rows].copy_(o_fb)
            self.fb_lse[:rows].copy_(lse_fb)
        if estimate is not None:
            q, blocks = estimate
            cpu = CpuPartResult(self.out_o[layer][:rows], self.out_lse[layer][:rows], self.fb_o[:rows],
                                self.fb_lse[:rows], status, *(zero_copy or (None, None)))
            merge_with_estimate(q, o, lse, out, blocks=blocks, cpu=cpu, impl=self.merge_impl, validate=False)
            return
        merge_cpu_part(o, lse, self.out_o[layer][:rows], self.out_lse[layer][:rows], self.fb_o[:rows],
                       self.fb_lse[:rows], status, out, zero_copy=zero_copy, impl=self.merge_impl)

    def add_zero_copy_time(self, layer: int, seconds: float) -> None:
        """The CPU device: the time the engine's thread took for the layer's zero-copy share (on CUDA the kernel
        adds its own, zero_copy_clock)."""
        self._zero_copy_np[self.index[layer]] += int(1e9 * seconds)

    def zero_copy_clock(self, layer: int) -> torch.Tensor:
        """CUDA: the layer's zero-copy time word, [1] int64 ns, that the zero-copy decode adds its time to."""
        i = self.index[layer]
        return self.zero_copy_ns[i: i + 1]

    def _wait_on_host(self, i: int, plan) -> None:
        """The CPU device: the engine's thread waits on DONE, as the wait kernel does on CUDA."""
        start = time.monotonic()
        self._window_np[i] += int(1e9 * (start - self._rung_at[i]))
        if plan.bypass:
            code = STATUS_DEVICE_ONLY
        else:
            code = self.worker.wait_done(self.worker_id[self.layers[i]], plan.seq,
                                         self._rung_at[i] + self.deadline_s - start)
        self._wait_np[i] += int(1e9 * (time.monotonic() - start))
        self._status_np[i] = code
        self._outcomes_np[i, code] += 1

    def record_outcomes(self, outcomes: list[list[int]], rids: list[int], *,
                        planned_device_only: int = 0) -> dict[str, int]:
        """After the one read of the parts' outcome counts (per layer, per status): feed the health circuit, log
        fallbacks (rate-limited, naming the layer, the cause and, for an error, the request) -> {cause: parts}.
        planned_device_only: steps of these counts planned device-only with nothing for the CPU (every request
        exact), one device-only part per layer each: not fallbacks."""
        fallbacks = {}
        for layer, counts in zip(self.layers, outcomes):
            for code, count in enumerate(counts):
                if code == STATUS_DEVICE_ONLY:
                    count = max(0, count - planned_device_only)
                if not count:
                    continue
                cause = CAUSE_OF_STATUS.get(code)
                if cause is not None:
                    fallbacks[cause] = fallbacks.get(cause, 0) + count
                if code == STATUS_DEVICE_ONLY:
                    continue  # not handed to the worker: nothing to learn of its health
                for _ in range(count):
                    self.health.record(cause is not None, cause)
                if cause is not None:
                    self._log_fallback(layer, cause, rids)
        return fallbacks

    def _log_fallback(self, layer: int, cause: str, rids: list[int]) -> None:
        """A warning at most every LOG_INTERVAL_S, with the fallbacks by cause since the previous one."""
        self._unlogged[cause] = self._unlogged.get(cause, 0) + 1
        now = time.monotonic()
        if now - self._last_log < LOG_INTERVAL_S:
            return
        counts = ", ".join(f"{name} {count}" for name, count in sorted(self._unlogged.items()))
        detail = f"not done {1e3 * self.deadline_s:g} ms after its ring"
        if cause == "error":
            # the control words are page-locked host memory, read here outside the layer loop (when a step's
            # telemetry is collected), at most once per LOG_INTERVAL_S
            row = int(self.words[self.index[layer], ERROR_ROW])
            error = getattr(self.worker, "errors", {}).get(self.worker_id[layer], "")
            who = f"sequence {rids[row]}" if 0 <= row < len(rids) else "a padding row"
            detail = f"{who}, layer {layer}: {error}"
        logger.warning("scout: the CPU part of layer %d was computed by the layer itself (%s: %s); fallbacks since "
                       "the last message: %s", layer, cause, detail, counts)
        self._last_log, self._unlogged = now, {}
