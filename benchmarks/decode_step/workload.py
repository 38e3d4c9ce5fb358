"""The synthetic workload: block-biased prompt K/V per request and layer, the
AR(1) query walk with its noisy layer-ahead predictions and new tokens, and the
simulated rest of each layer (sleep or a calibrated matmul chain).
"""

from __future__ import annotations

import math
import time

import torch

from .common import BLOCK_SIZE, HEAD_DIM, NUM_KV_HEADS, NUM_QO_HEADS, log, synchronize


class LayerCompute:
    """Stands in for a layer's projections and FFN: `ms` milliseconds of device time.

    kind "sleep": the host thread sleeps (a device busy while the host cores are
    free; the CPU default). kind "matmul": a chain of square matmuls on the
    device, calibrated to `ms` (the CUDA default; on the CPU it burns the cores).
    """

    def __init__(self, ms: float, kind: str, device: torch.device):
        self.ms, self.kind, self.device = ms, kind, device
        self.reps, self.calibrated_ms = 0, 0.0
        if ms <= 0:
            return
        if kind == "matmul":
            n = 4096 if device.type == "cuda" else 512
            dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
            self.a = torch.randn(n, n, device=device, dtype=dtype)
            self.b = torch.randn(n, n, device=device, dtype=dtype)
            self.out = torch.empty_like(self.a)
            for _ in range(3):
                torch.matmul(self.a, self.b, out=self.out)
            synchronize(device)
            trials = 20
            start = time.perf_counter()
            for _ in range(trials):
                torch.matmul(self.a, self.b, out=self.out)
            synchronize(device)
            per_rep_ms = 1e3 * (time.perf_counter() - start) / trials
            self.reps = max(1, round(ms / per_rep_ms))
            self.calibrated_ms = self.reps * per_rep_ms
            log(f"layer compute: {self.reps} x {n}x{n} matmul = {self.calibrated_ms:.2f} ms per layer")

    def __call__(self) -> float:
        """Run it; seconds it took (the calibrated time on CUDA, where the launch is asynchronous)."""
        if self.ms <= 0:
            return 0.0
        start = time.perf_counter()
        if self.kind == "sleep":
            time.sleep(self.ms * 1e-3)
            return time.perf_counter() - start
        for _ in range(self.reps):
            torch.matmul(self.a, self.b, out=self.out)
        if self.device.type == "cuda":
            return self.calibrated_ms * 1e-3
        return time.perf_counter() - start


def block_biased(n: int, bias: torch.Tensor, gen: torch.Generator, first_token: int = 0) -> torch.Tensor:
    """[n, Hkv, D] N(0, 1) keys plus the bias [NB, Hkv, D] of each token's block."""
    blocks = torch.arange(first_token, first_token + n) // BLOCK_SIZE
    return torch.randn(n, NUM_KV_HEADS, HEAD_DIM, generator=gen) + bias[blocks]


class Prompts:
    """Prompt K/V of `max_batch` requests at one context length, per layer (bf16, CPU)."""

    def __init__(self, context: int, max_batch: int, num_layers: int, max_new: int, *, seed: int):
        gen = torch.Generator().manual_seed(seed)
        num_blocks = (context + max_new) // BLOCK_SIZE + 1
        self.context = context
        self.bias, self.k, self.v = {}, {}, {}
        for b in range(max_batch):
            for layer in range(num_layers):
                bias = 0.5 * torch.randn(num_blocks, NUM_KV_HEADS, HEAD_DIM, generator=gen)
                self.bias[b, layer] = bias
                self.k[b, layer] = block_biased(context, bias, gen).to(torch.bfloat16)
                self.v[b, layer] = torch.randn(context, NUM_KV_HEADS, HEAD_DIM, generator=gen).to(torch.bfloat16)


class StepInputs:
    """Queries, predicted queries and new K/V of `num_steps` steps, [steps, layers, B, ...] bf16."""

    def __init__(self, prompts: Prompts, batch_size: int, num_layers: int, num_steps: int, *, rho: float,
                 predict_noise: float, seed: int, device: torch.device):
        gen = torch.Generator().manual_seed(seed)
        shape_q = (num_layers, batch_size, NUM_QO_HEADS, HEAD_DIM)
        state = torch.randn(*shape_q, generator=gen)
        q, q_pred, k_new, v_new = [], [], [], []
        for s in range(num_steps):
            state = rho * state + math.sqrt(1 - rho**2) * torch.randn(*shape_q, generator=gen)
            q.append(state)
            q_pred.append(state + predict_noise * torch.randn(*shape_q, generator=gen))
            position = prompts.context + s
            k_new.append(torch.stack([
                torch.stack([block_biased(1, prompts.bias[b, layer], gen, position)[0] for b in range(batch_size)])
                for layer in range(num_layers)
            ]))  # fmt: skip
            v_new.append(torch.randn(num_layers, batch_size, NUM_KV_HEADS, HEAD_DIM, generator=gen))
        self.q = torch.stack(q).to(device, torch.bfloat16)  # [steps, L, B, Hq, D]
        self.q_pred = torch.stack(q_pred).to(device, torch.bfloat16)  # [steps, L, B, Hq, D]
        self.k_new = torch.stack(k_new).to(device, torch.bfloat16)  # [steps, L, B, Hkv, D]
        self.v_new = torch.stack(v_new).to(device, torch.bfloat16)  # [steps, L, B, Hkv, D]
        qf, pf = self.q.float(), self.q_pred.float()
        self.predict_cosine = float(torch.nn.functional.cosine_similarity(qf, pf, dim=-1).mean())
        self.step_cosine = 1.0
        if num_steps > 1:
            self.step_cosine = float(torch.nn.functional.cosine_similarity(qf[1:], qf[:-1], dim=-1).mean())
