"""Host values onto the device without waiting for the stream.

A blocking host-to-device copy (torch.tensor(values, device=...), tensor.to(device)) synchronizes the stream, so
the host waits for every step already queued; one from pageable memory, even asynchronous, may too (the driver
stages it). Planning runs while the device still runs the step before (SGLang's overlap scheduler), so the copies
it makes go through page-locked memory, asynchronously: a snapshot of the values, whose block torch's caching host
allocator reuses only once the copy is done, so the values may change at once.
"""

from __future__ import annotations

import torch


def to_device(values, device, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A list or a host tensor as a tensor on `device` (of `dtype` when given); on CUDA an asynchronous copy of a
    page-locked snapshot, elsewhere the values themselves (no copy where the device is the host)."""
    tensor = values if isinstance(values, torch.Tensor) else torch.tensor(values, dtype=dtype)
    if dtype is not None and tensor.dtype != dtype:
        tensor = tensor.to(dtype)
    if torch.device(device).type != "cuda":
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)
