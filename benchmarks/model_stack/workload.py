"""The attention workload of the GPU benchmark, generated on the device: prompt K/V per (request, layer) and, each
step, the queries, predicted queries and new K/V the engine sees.

The model stack's weights are random, so its own attention inputs would select blocks at random. What decides the
selection here is a synthetic pattern, the one benchmarks/decode_step/workload.py describes (the same math, on the
device and at any shape, so that 100 GB of prompt K/V take seconds):

* heavy hitters (the default: what real models show): each (request, layer, KV head) has a few "topic"
  directions; block j's keys lean into them with Zipf-like strength rank_j^-zipf; the query is a unit topic
  vector drifting by `drift` per step plus a slow background walk; the prediction error is a slow walk scaled to
  `target_cosine`. Measured by the benchmark and reported: the block change rate per step and the predicted-query
  cosine.
* flat (the stress case): keys N(0, 1) plus a random bias per (block, KV head), queries an AR(1) walk, the
  prediction a fresh noise of std `predict_noise` each step: a random selection that churns.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from decode_step.workload import BACKGROUND_RHO, HeavyHitters  # noqa: E402


class DeviceWorkload:
    """Prompt K/V and per-step attention inputs of `batch` requests over `num_layers` layers.

    Parameters
    ----------
    kind : "heavy" or "flat"
    num_layers, num_qo_heads, num_kv_heads, head_dim, block_size : the attention's shape
    batch : requests (rows)
    context : prompt tokens of every request
    max_new : decode steps the workload will make
    device : where everything is generated
    heavy : the heavy-hitter parameters (HeavyHitters()); rho, predict_noise: the flat workload's walk
    """

    def __init__(self, kind: str, *, num_layers: int, num_qo_heads: int, num_kv_heads: int, head_dim: int,
                 block_size: int, batch: int, context: int, max_new: int, device, heavy: HeavyHitters | None = None,
                 rho: float = 0.99, predict_noise: float = 0.33, seed: int = 0):
        if kind not in ("heavy", "flat"):
            raise ValueError(f"kind must be 'heavy' or 'flat', got {kind!r}")
        self.kind, self.device = kind, torch.device(device)
        self.layers, self.qo, self.kv, self.dim, self.block = num_layers, num_qo_heads, num_kv_heads, head_dim, block_size
        self.batch, self.context, self.heavy = batch, context, heavy or HeavyHitters()
        self.rho, self.predict_noise, self.seed = rho, predict_noise, seed
        self.gen = torch.Generator(device=self.device).manual_seed(seed)
        first, last = context // block_size, (context + max_new) // block_size
        self._tail_blocks = (first, last + 1)  # the blocks new tokens go to: their keys' bias is kept
        self._tail_bias = torch.zeros(num_layers, batch, last + 1 - first, num_kv_heads, head_dim, device=self.device)
        self._basis = torch.zeros(num_layers, batch, num_kv_heads, head_dim, self.heavy.topics, device=self.device)
        shape_q = (num_layers, batch, num_qo_heads, head_dim)
        self.q = torch.zeros(shape_q, device=self.device)  # [L, B, Hq, D] this step's
        self.q_pred = torch.zeros(shape_q, device=self.device)
        self.k_new = torch.zeros(num_layers, batch, num_kv_heads, head_dim, device=self.device)
        self.v_new = torch.zeros_like(self.k_new)
        self._background = torch.randn(shape_q, generator=self.gen, device=self.device)
        self._error = torch.randn(shape_q, generator=self.gen, device=self.device)
        self._topic = torch.nn.functional.normalize(
            torch.randn(num_layers, batch, num_kv_heads, self.heavy.topics, generator=self.gen, device=self.device),
            dim=-1)
        self.position = context
        self.cosines: list[torch.Tensor] = []  # one 0-dim tensor a step, read when reported (no read a step)

    # -- prompts ------------------------------------------------------------------------------------------------
    def prompt(self, row: int, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K, V [context, Hkv, D] of request `row` in `layer`, on the device (fp32), and the block biases of its later
        tokens kept for the steps."""
        num_blocks = self._tail_blocks[1]
        gen = torch.Generator(device=self.device).manual_seed(self.seed * 1_000_003 + row * 1009 + layer)
        if self.kind == "heavy":
            bias, basis = self._heavy_bias(num_blocks, gen)
            self._basis[layer, row] = basis
        else:
            bias = 0.5 * torch.randn(num_blocks, self.kv, self.dim, generator=gen, device=self.device)
        self._tail_bias[layer, row] = bias[self._tail_blocks[0]:]
        blocks = torch.arange(self.context, device=self.device) // self.block
        k = torch.randn(self.context, self.kv, self.dim, generator=gen, device=self.device).add_(bias[blocks])
        v = torch.randn(self.context, self.kv, self.dim, generator=gen, device=self.device)
        return k, v

    def _heavy_bias(self, num_blocks: int, gen) -> tuple[torch.Tensor, torch.Tensor]:
        """(bias [NB, Hkv, D] of each block's keys, basis [Hkv, D, topics] of the topic subspaces)."""
        spec, kv, dim = self.heavy, self.kv, self.dim
        basis = torch.linalg.qr(torch.randn(kv, dim, spec.topics, generator=gen, device=self.device)).Q
        ranks = torch.stack([torch.randperm(num_blocks, generator=gen, device=self.device) for _ in range(kv)]) + 1
        importance = ranks.float() ** (-spec.zipf)  # [Hkv, NB]
        direction = torch.nn.functional.normalize(
            torch.randn(kv, num_blocks, spec.topics, generator=gen, device=self.device), dim=-1)
        lean = torch.einsum("hdm,hnm->nhd", basis, direction * importance.unsqueeze(-1))  # [NB, Hkv, D]
        noise = 0.5 * torch.randn(num_blocks, kv, dim, generator=gen, device=self.device)
        return spec.strength * math.sqrt(dim) * lean + noise, basis

    # -- steps --------------------------------------------------------------------------------------------------
    def next_step(self) -> None:
        """This step's q, q_pred [L, B, Hq, D] and new K/V [L, B, Hkv, D] (fp32, on the device)."""
        gen, shape = self.gen, self.q.shape
        if self.kind == "heavy":
            spec = self.heavy
            rho = math.sqrt(1 - spec.drift**2)
            error_rho = rho if spec.error_rho is None else spec.error_rho
            noise = torch.randn(self._topic.shape, generator=gen, device=self.device) / math.sqrt(spec.topics)
            self._topic = torch.nn.functional.normalize(rho * self._topic + spec.drift * noise, dim=-1)
            lean = math.sqrt(self.dim) * torch.einsum("lbhdm,lbhm->lbhd", self._basis, self._topic)
            self._background.mul_(BACKGROUND_RHO).add_(
                math.sqrt(1 - BACKGROUND_RHO**2) * torch.randn(shape, generator=gen, device=self.device))
            self.q.copy_(lean.repeat_interleave(self.qo // self.kv, dim=2) + self._background)
            self._error.mul_(error_rho).add_(
                math.sqrt(1 - error_rho**2) * torch.randn(shape, generator=gen, device=self.device))
            sigma = self.q.norm(dim=-1, keepdim=True) * math.sqrt(1 / spec.target_cosine**2 - 1) / math.sqrt(self.dim)
            torch.addcmul(self.q, sigma, self._error, out=self.q_pred)
        else:
            self.q.mul_(self.rho).add_(math.sqrt(1 - self.rho**2) * torch.randn(shape, generator=gen, device=self.device))
            torch.add(self.q, self.predict_noise * torch.randn(shape, generator=gen, device=self.device), out=self.q_pred)
        block = self.position // self.block - self._tail_blocks[0]
        torch.add(torch.randn(self.k_new.shape, generator=gen, device=self.device), self._tail_bias[:, :, block],
                  out=self.k_new)
        self.v_new.normal_(generator=gen)
        self.position += 1
        cosine = torch.nn.functional.cosine_similarity(self.q, self.q_pred, dim=-1).mean()
        self.cosines.append(cosine)  # the calibration's record, read at the end: a read here waits for the device

    def inject(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_pred) -> None:
        """The model stack's hook: this step's inputs of `layer` over the model's (rows of the engine's buffers)."""
        rows = q.shape[0]
        q.copy_(self.q[layer, :rows])
        k.copy_(self.k_new[layer, :rows])
        v.copy_(self.v_new[layer, :rows])
        if q_pred is not None and layer + 1 < self.layers:
            q_pred.copy_(self.q_pred[layer + 1, :rows])

    def predict_cosine(self, first: int = 0) -> float:
        """The mean cosine of the predicted to the real query over the steps made (from step `first`)."""
        cosines = self.cosines[first:]
        return float(torch.stack(cosines).mean()) if cosines else float("nan")
