"""The hand-off of one layer's CPU part: staging buffers in, one pool submit, O and LSE out.

Per offloaded layer, buffers of fixed capacity (max_requests rows) hold the
query the CPU attends with, its host page lists and counts, and the CPU's
output (O fp32, LSE natural log). They are page-locked on CUDA: the device
copies the query and lists in without a sync, records an event, and the pool's
workers wait on that event before reading (CpuAttentionPool.submit_batch);
after the wait the device copies O and LSE back before the merge. On the CPU
the same code runs over the same buffers (the copies are plain copies). A
layer's buffers are reused the next step, after its result was collected.
"""

from __future__ import annotations

import time

import torch


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
    """

    def __init__(self, layers, *, max_batch: int, num_qo_heads: int, num_kv_heads: int, head_dim: int, capacity: int,
                 dtype: torch.dtype, pool, device: torch.device):
        pin = device.type == "cuda"
        self.pool, self.device = pool, device

        def buffers(*shape, dtype):
            return {layer: torch.zeros(max_batch, *shape, dtype=dtype, pin_memory=pin) for layer in layers}

        self.q = buffers(num_qo_heads, head_dim, dtype=dtype)  # [Bmax, Hq, D]
        self.pages = buffers(num_kv_heads, capacity, dtype=torch.int32)  # [Bmax, Hkv, C] host pages
        self.counts = buffers(num_kv_heads, dtype=torch.int32)  # [Bmax, Hkv]
        self.out_o = buffers(num_qo_heads, head_dim, dtype=torch.float32)  # [Bmax, Hq, D]
        self.out_lse = buffers(num_qo_heads, dtype=torch.float32)  # [Bmax, Hq] natural log
        self._in_flight: dict[int, object] = {}

    def submit(self, layer: int, q: torch.Tensor, pages: torch.Tensor, counts: torch.Tensor, host_k: torch.Tensor,
               host_v: torch.Tensor, *, scale: float, seq_ids: list[int] | None = None) -> None:
        """Stage q [B, Hq, D], pages [B, Hkv, C] int32 and counts [B, Hkv] int32 and start the CPU part
        (seq_ids: named in errors)."""
        if layer in self._in_flight:
            raise RuntimeError(f"layer {layer}: a CPU part is already in flight (its result was never collected)")
        batch_size = q.shape[0]
        q_in, pages_in, counts_in = self.q[layer][:batch_size], self.pages[layer][:batch_size], self.counts[layer][:batch_size]
        q_in.copy_(q, non_blocking=True)
        pages_in.copy_(pages, non_blocking=True)
        counts_in.copy_(counts, non_blocking=True)
        ready = None
        if self.device.type == "cuda":
            ready = torch.cuda.Event()
            ready.record()
        self._in_flight[layer] = self.pool.submit_batch(
            q_in, host_k, host_v, pages_in, counts_in, scale=scale, out_o=self.out_o[layer][:batch_size],
            out_lse=self.out_lse[layer][:batch_size], seq_ids=seq_ids, layer=layer, ready=ready)

    def in_flight(self, layer: int) -> bool:
        return layer in self._in_flight

    def collect(self, layer: int) -> tuple[torch.Tensor, torch.Tensor, float]:
        """Wait for the layer's CPU part -> (O [B, Hq, D] fp32, LSE [B, Hq] fp32 on the device, seconds waited)."""
        handle = self._in_flight.pop(layer)
        start = time.perf_counter()
        self.pool.wait(handle)
        waited = time.perf_counter() - start
        batch_size = handle.batch_size
        o = self.out_o[layer][:batch_size].to(self.device, non_blocking=True)
        lse = self.out_lse[layer][:batch_size].to(self.device, non_blocking=True)
        return o, lse, waited

    def discard(self) -> None:
        """Wait for every submit still in flight and drop it (a step that ended early)."""
        for layer in list(self._in_flight):
            try:
                self.pool.wait(self._in_flight.pop(layer))
            except Exception:  # noqa: BLE001 - its result is dropped anyway
                pass
