"""How the host waits for the GPU: on a blocking-sync event, sleeping in the driver, never spinning a core.

A default CUDA event (and torch.cuda.synchronize, a stream's synchronize, a
device tensor's .tolist()) makes the waiting host thread spin on its core; on a
GPU server the CPU workers attend on the other cores and the host core runs the
next step's plan, so the host waits by sleeping: the few microseconds of wake-up
cost nothing next to what a spinning thread takes from both. Nothing happens on
a CPU device (its "stream" is the calling thread).
"""

from __future__ import annotations

import torch


def blocking_event():
    """A CUDA event whose synchronize() sleeps until the GPU reaches it (cudaEventBlockingSync)."""
    return torch.cuda.Event(blocking=True)


def wait_for_device(device) -> None:
    """Wait, sleeping, until the work queued so far on `device`'s current stream is done."""
    device = torch.device(device)
    if device.type != "cuda":
        return
    event = blocking_event()
    event.record(torch.cuda.current_stream(device))
    event.synchronize()
