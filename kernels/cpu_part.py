"""The device side of the CPU part's hand-off: ring, wait with a deadline, and the merge that takes the worker's
result or the fallback's.

digest -> select -> split -> device part / CPU part -> **merge**. Protocol:
scout_sglang.handoff_words. On CUDA each is one kernel (triton/handoff.py); the
ring and the wait exist only there (they spin on page-locked memory and read
the GPU's clock; Triton's interpreter runs them too, counting spin iterations
for a clock). On the CPU device's torch path the engine's thread writes and
waits on the words itself (core/cpu_handoff.py), and the merge's torch path
reads the status, a host value there.
"""

from __future__ import annotations

import torch
from scout_sglang.kernels.dispatch import select_impl
from scout_sglang.kernels.merge import merge_states_torch


def ring_doorbell(header: torch.Tensor, words: torch.Tensor, ring_ns: torch.Tensor) -> None:
    """CUDA (or Triton's interpreter, for tests): announce a staged part. header [HEADER_WORDS] int32 (device), words [WORDS_PER_LAYER] int32
    (page-locked), ring_ns [1] int64 (device): when it rang."""
    from scout_sglang.kernels.triton.handoff import ring_triton

    ring_triton(header, words, ring_ns)


def wait_cpu_part(header: torch.Tensor, words: torch.Tensor, ring_ns: torch.Tensor, status: torch.Tensor,
                  wait_ns: torch.Tensor, window_ns: torch.Tensor, outcomes: torch.Tensor, *, deadline_ns: int) -> None:
    """CUDA (or Triton's interpreter, for tests: the deadline then counts spin iterations): wait until the worker
    finished the step's part or `deadline_ns` after the ring -> status [1] int32
    (device); wait_ns [1] int64 accumulates the time spent waiting, window_ns [1] int64 the time from the ring to
    the wait (the part's window), outcomes [statuses] int32 counts the status."""
    from scout_sglang.kernels.triton.handoff import wait_triton

    wait_triton(header, words, ring_ns, status, wait_ns, window_ns, outcomes, deadline_ns=deadline_ns)


def merge_cpu_part(o: torch.Tensor, lse: torch.Tensor, cpu_o: torch.Tensor, cpu_lse: torch.Tensor,
                   fb_o: torch.Tensor, fb_lse: torch.Tensor, status: torch.Tensor, out: torch.Tensor, *,
                   zero_copy: tuple[torch.Tensor, torch.Tensor] | None = None, impl: str | None = None) -> None:
    """out = merge((o, lse), the worker's (cpu_o, cpu_lse) if status == 0 else the fallback's (fb_o, fb_lse)
    [, the zero-copy share's (o, lse) of the CPU split]): one launch for the three parts.

    o, out : [B, Hq, D] (dtype of the layer); lse, cpu_lse, fb_lse : [B, Hq] fp32 natural log;
    cpu_o, fb_o : [B, Hq, D] fp32 (cpu_o, cpu_lse may be page-locked host memory on CUDA);
    status : [1] int32, the layer's hand-off status (handoff_words)
    zero_copy : ([B, Hq, D] fp32, [B, Hq] fp32) the device's attention of the CPU list's other share, or None
    """
    if select_impl("cpu_part", o.device.type, impl) == "triton":
        from scout_sglang.kernels.triton.handoff import merge_cpu_part_triton

        merge_cpu_part_triton(o, lse, cpu_o, cpu_lse, fb_o, fb_lse, status, out, zero_copy=zero_copy)
        return
    worker = status.to(o.device) == 0  # chosen on the device, as the kernel does: no host read of the status
    other_o = torch.where(worker, cpu_o.to(o.device), fb_o)
    other_lse = torch.where(worker, cpu_lse.to(o.device), fb_lse)
    merged, merged_lse = merge_states_torch(o, lse, other_o, other_lse)
    if zero_copy is not None:
        merged = merge_states_torch(merged, merged_lse, *zero_copy)[0]
    out.copy_(merged)
