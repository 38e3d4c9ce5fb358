"""The synthetic workloads: prompt K/V per request and layer, the query walk with
its layer-ahead predictions and new tokens, and the simulated rest of each layer
(sleep or a calibrated matmul chain).

Two workloads:

* flat (the stress case): keys N(0, 1) plus a random bias per (block, KV head),
  queries an AR(1) walk, predictions with fresh noise every step. Block scores
  are flat, so the top-k churns: about a third of the selection changes per
  step with prediction noise at cosine 0.95.
* heavy hitters (HeavyHitters): a few blocks hold most of the attention, as
  measured in real models (H2O, Quest, ScoutAttention). Each (request, layer,
  KV head) has a small "topic" subspace of `topics` directions; block j's keys
  lean into it with strength `strength` * rank_j^-`zipf` (ranks a random
  permutation: Zipf-like importance) along its own direction there. The query is
  a unit topic vector that drifts (AR(1) with innovation `drift`) plus a slow
  background walk, so the set of heavy hitters moves at a rate the drift sets.
  The prediction error is a slow AR(1) walk too (correlated over steps, as the
  layer-ahead error of consecutive tokens is), scaled to `target_cosine`.
  `drift` 0.16 gives about 10% of the selection changing per step at 16k-32k
  tokens (0.2: 11%); the benchmark reports the change rate it measured.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass

import torch

from .common import BLOCK_SIZE, HEAD_DIM, NUM_KV_HEADS, NUM_QO_HEADS, log, synchronize

BACKGROUND_RHO = 0.99  # the heavy-hitter query's background walk: as the flat workload's default


@dataclass(frozen=True)
class HeavyHitters:
    """The heavy-hitter workload (module docstring)."""

    zipf: float = 0.5  # importance of the block of rank r: r^-zipf
    strength: float = 4.0  # the top block's lean into the topic subspace, in units of sqrt(D)
    topics: int = 4  # dimensions of each (request, layer, KV head)'s topic subspace
    drift: float = 0.16  # innovation of the topic walk per step (0: the heavy hitters never move)
    target_cosine: float = 0.95  # cosine of the predicted to the real query
    error_rho: float | None = None  # AR(1) coefficient of the prediction error; None: the topic walk's

    def describe(self) -> dict:
        return {"kind": "heavy", **dataclasses.asdict(self)}


def heavy_bias(num_blocks: int, spec: HeavyHitters, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(bias [NB, Hkv, D] of each block's keys, basis [Hkv, D, topics] of the topic subspaces)."""
    basis = torch.linalg.qr(torch.randn(NUM_KV_HEADS, HEAD_DIM, spec.topics, generator=gen)).Q
    ranks = torch.stack([torch.randperm(num_blocks, generator=gen) for _ in range(NUM_KV_HEADS)]) + 1  # [Hkv, NB]
    importance = ranks.float() ** (-spec.zipf)
    direction = torch.nn.functional.normalize(torch.randn(NUM_KV_HEADS, num_blocks, spec.topics, generator=gen), dim=-1)
    lean = torch.einsum("hdm,hnm->nhd", basis, direction * importance.unsqueeze(-1))  # [NB, Hkv, D]
    return spec.strength * math.sqrt(HEAD_DIM) * lean + 0.5 * torch.randn(num_blocks, NUM_KV_HEADS, HEAD_DIM,
                                                                            generator=gen), basis


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

    def __init__(self, context: int, max_batch: int, num_layers: int, max_new: int, *, seed: int,
                 heavy: HeavyHitters | None = None):
        gen = torch.Generator().manual_seed(seed)
        num_blocks = (context + max_new) // BLOCK_SIZE + 1
        self.context, self.heavy = context, heavy
        self.bias, self.basis, self.k, self.v = {}, {}, {}, {}
        for b in range(max_batch):
            for layer in range(num_layers):
                if heavy is None:
                    bias = 0.5 * torch.randn(num_blocks, NUM_KV_HEADS, HEAD_DIM, generator=gen)
                else:
                    bias, self.basis[b, layer] = heavy_bias(num_blocks, heavy, gen)
                self.bias[b, layer] = bias
                self.k[b, layer] = block_biased(context, bias, gen).to(torch.bfloat16)
                self.v[b, layer] = torch.randn(context, NUM_KV_HEADS, HEAD_DIM, generator=gen).to(torch.bfloat16)


class StepInputs:
    """Queries, predicted queries and new K/V of `num_steps` steps, [steps, layers, B, ...] bf16.

    Flat prompts: the AR(1) walk (rho) with fresh prediction noise (predict_noise); heavy-hitter prompts: their
    topic walk and prediction error (HeavyHitters; rho and predict_noise unused)."""

    def __init__(self, prompts: Prompts, batch_size: int, num_layers: int, num_steps: int, *, rho: float,
                 predict_noise: float, seed: int, device: torch.device):
        gen = torch.Generator().manual_seed(seed)
        shape_q = (num_layers, batch_size, NUM_QO_HEADS, HEAD_DIM)
        walk = HeavyWalk(prompts, batch_size, num_layers, gen) if prompts.heavy is not None else None
        state = torch.randn(*shape_q, generator=gen)
        q, q_pred, k_new, v_new = [], [], [], []
        for s in range(num_steps):
            if walk is not None:
                real, predicted = walk.step()
                q.append(real)
                q_pred.append(predicted)
            else:
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


class HeavyWalk:
    """The heavy-hitter queries of a batch, step by step (module docstring): real and predicted [L, B, Hq, D]."""

    def __init__(self, prompts: Prompts, batch_size: int, num_layers: int, gen: torch.Generator):
        spec, self.gen = prompts.heavy, gen
        self.spec = spec
        self.basis = torch.stack([torch.stack([prompts.basis[b, layer] for b in range(batch_size)])
                                  for layer in range(num_layers)])  # [L, B, Hkv, D, topics]
        self.rho = math.sqrt(1 - spec.drift**2)
        self.error_rho = self.rho if spec.error_rho is None else spec.error_rho
        self.topic = torch.nn.functional.normalize(
            torch.randn(num_layers, batch_size, NUM_KV_HEADS, spec.topics, generator=gen), dim=-1)
        shape_q = (num_layers, batch_size, NUM_QO_HEADS, HEAD_DIM)
        self.background = torch.randn(*shape_q, generator=gen)
        self.error = torch.randn(*shape_q, generator=gen)

    def step(self) -> tuple[torch.Tensor, torch.Tensor]:
        spec, gen = self.spec, self.gen
        noise = torch.randn(self.topic.shape, generator=gen) / math.sqrt(spec.topics)
        self.topic = torch.nn.functional.normalize(self.rho * self.topic + spec.drift * noise, dim=-1)
        lean = math.sqrt(HEAD_DIM) * torch.einsum("lbhdm,lbhm->lbhd", self.basis, self.topic)  # [L, B, Hkv, D]
        group = NUM_QO_HEADS // NUM_KV_HEADS
        self.background = BACKGROUND_RHO * self.background + math.sqrt(1 - BACKGROUND_RHO**2) * torch.randn(
            self.background.shape, generator=gen)
        real = lean.repeat_interleave(group, dim=2) + self.background
        self.error = self.error_rho * self.error + math.sqrt(1 - self.error_rho**2) * torch.randn(
            self.error.shape, generator=gen)
        sigma = real.norm(dim=-1, keepdim=True) * math.sqrt(1 / spec.target_cosine**2 - 1) / math.sqrt(HEAD_DIM)
        return real, real + sigma * self.error
