"""A short start-up calibration of the device's zero-copy reads of the host store: the CPU split's link rate.

The CPU split (cpu_split.py) gives the device what the CPU workers cannot finish in their window; how much it
may take depends on how fast the device reads the page-locked host store over PCIe. On CUDA the engine times
its own zero-copy decode (the split's kernel, at its bounded program count) over random pages of the store,
once, before serving; elsewhere the configured recall_link_gbps stands.
"""

from __future__ import annotations

import torch

CALIBRATION_REPEATS = 5


def calibrate_zero_copy_gbs(host_k: torch.Tensor, host_v: torch.Tensor, *, rows: int, num_qo_heads: int,
                            capacity: int, programs: int, device: torch.device) -> float:
    """GB/s of K/V the zero-copy decode reads from host_k, host_v ([P, Hkv, S, D], page-locked) on the engine's CUDA
    `device`: `rows` requests, full lists of `capacity` random pages per KV head."""
    from scout_sglang.kernels.triton.decode import sparse_decode_triton

    device = torch.device(device)
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    pages, heads, block, dim = host_k.shape
    gen = torch.Generator().manual_seed(0)
    table = torch.randint(0, pages, (rows, heads, capacity), generator=gen, dtype=torch.int32).to(device)
    counts = torch.full((rows, heads), capacity, dtype=torch.int32, device=device)
    q = torch.zeros(rows, num_qo_heads, dim, dtype=host_k.dtype, device=device)
    out = torch.empty(rows, num_qo_heads, dim, dtype=torch.float32, device=device)
    lse = torch.empty(rows, num_qo_heads, dtype=torch.float32, device=device)

    def read():
        sparse_decode_triton(q, host_k, host_v, table, counts, None, out, lse, scale=1.0, num_splits=1,
                             programs=programs)

    with torch.cuda.device(device):
        read()  # compiles
    # timed, and blocking: the host sleeps in end.synchronize() instead of spinning (host_wait.py)
    with torch.cuda.device(device):
        start, end = (torch.cuda.Event(enable_timing=True, blocking=True) for _ in range(2))
        start.record()
        for _ in range(CALIBRATION_REPEATS):
            read()
        end.record()
        end.synchronize()
    seconds = start.elapsed_time(end) / 1e3 / CALIBRATION_REPEATS
    nbytes = 2 * rows * heads * capacity * block * dim * host_k.element_size()
    return nbytes / seconds / 1e9
