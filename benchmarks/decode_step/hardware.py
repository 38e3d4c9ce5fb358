"""The machine a run was measured on: CPU model, cores, torch threads, host
memory read bandwidth (measured), the CPU worker and the device.
"""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import time

import torch


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.CalledProcessError):
        pass
    return platform.processor() or "unknown"


def host_read_bandwidth_gbs(num_bytes: int = 512 << 20) -> float:
    """Host memory read bandwidth, a sum over a large buffer (median of 5)."""
    buf = torch.ones(num_bytes // 4, dtype=torch.float32)
    times = []
    for _ in range(6):
        start = time.perf_counter()
        buf.sum()
        times.append(time.perf_counter() - start)
    return num_bytes / statistics.median(times[1:]) / 1e9


def hardware(device: torch.device, worker: str) -> dict:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    info = dict(cpu_model=cpu_model(), cores=cores, torch=torch.__version__, torch_threads=torch.get_num_threads(),
                host_read_gbs=host_read_bandwidth_gbs(), cpu_pool=worker, device=str(device))
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info
