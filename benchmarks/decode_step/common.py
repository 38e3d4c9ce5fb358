"""Names shared by the decode-step benchmark's modules: the Qwen3-8B attention
shape, the modes, the engine timers that make up the step breakdown, the
ablation's configurations, and small helpers (progress log, device sync,
comma-separated integers).
"""

from __future__ import annotations

import sys

import torch

MODES = ("full", "quest", "infinigen", "hgca", "scout")
NUM_QO_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE = 32, 8, 128, 32  # Qwen3-8B
# The step's parts, stacked (they add up to the step): the engine's stages (host and device, everything but the
# wait), the wait for the CPU part (the wait kernel's time on CUDA, the engine thread's on the CPU), the rest of
# each layer.
ENGINE_TIMERS = ("engine", "cpu_wait")
BREAKDOWN = ENGINE_TIMERS + ("layer_compute",)
ABLATION = (  # (label, layer_ahead, recall_policy)
    ("no layer-ahead, no recall", False, "off"),
    ("layer-ahead, no recall", True, "off"),
    ("layer-ahead + recall", True, "adaptive"),
)


def log(message: str) -> None:
    print(f"[bench_decode_step] {message}", file=sys.stderr, flush=True)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def parse_ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]
