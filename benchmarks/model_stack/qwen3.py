"""A Qwen3 decoder stack for the GPU benchmark: the model's own GEMMs, norms and RoPE around the engine's attention.

What a decode step of a served model costs besides attention is what the layer-ahead CPU part hides behind: per
layer the input RMSNorm, the QKV projection, the per-head q/k norms, RoPE, the engine's attention, the O
projection, the post-attention RMSNorm and the SwiGLU MLP; the final norm at the end (no LM head). The weights are
random (bf16); nothing here is trained. The layer-ahead prediction is the server's (sglang_adapter/layer_ahead.py):
layer i+1's q projection, q_norm and RoPE applied to layer i's normalized input.

The attention inputs that decide the selection come from a workload (workload.py), not from these random weights
(whose attention would be meaningless): after the model computes q, k, v and the prediction at full size (their
time is real), the workload's are copied over them (`inject`) before the engine sees them.

Every op writes a buffer allocated once (`out=`, in place): a step allocates nothing, so one CUDA graph captures
it whole, and the tests check that no op makes a tensor of its own (test_model_stack.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Qwen3Shape:
    """The decoder's shape (Qwen3-8B by default: config.json's fields)."""

    num_layers: int = 36
    hidden_size: int = 4096
    intermediate_size: int = 12288
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    rope_theta: float = 1_000_000.0
    rms_eps: float = 1e-6

    def weight_bytes(self, itemsize: int = 2) -> int:
        """The bytes of one layer's weights (what a step reads per layer, whatever the batch)."""
        h, i, d = self.hidden_size, self.intermediate_size, self.head_dim
        qkv = (self.num_qo_heads + 2 * self.num_kv_heads) * d * h
        return itemsize * (qkv + self.num_qo_heads * d * h + 3 * i * h + 2 * h + 2 * d)


TINY = Qwen3Shape(num_layers=3, hidden_size=64, intermediate_size=96, num_qo_heads=4, num_kv_heads=2, head_dim=16)


class Qwen3Stack:
    """Random-weight Qwen3 layers and the static buffers of a decode step of up to `max_batch` tokens.

    Parameters
    ----------
    shape : Qwen3Shape
    max_batch : rows of every buffer (a captured graph's batch size)
    max_position : positions RoPE is tabled for
    device, dtype : where and in which dtype the weights and activations live
    seed : the weights' seed
    """

    def __init__(self, shape: Qwen3Shape, *, max_batch: int, max_position: int, device, dtype=torch.bfloat16,
                 seed: int = 0):
        self.shape, self.device, self.dtype = shape, torch.device(device), dtype
        s, b = shape, max_batch
        gen = torch.Generator(device=self.device).manual_seed(seed)
        qo, kv = s.num_qo_heads * s.head_dim, s.num_kv_heads * s.head_dim
        self.q_size, self.kv_size = qo, kv

        def weight(*dims, scale):
            return (torch.randn(*dims, generator=gen, device=self.device) * scale).to(dtype)

        self.layers = []
        for _ in range(s.num_layers):
            self.layers.append(dict(
                input_norm=weight(s.hidden_size, scale=0.1).add_(1.0),
                qkv=weight(qo + 2 * kv, s.hidden_size, scale=s.hidden_size ** -0.5),  # [Q; K; V] rows, as SGLang fuses
                q_norm=weight(s.head_dim, scale=0.1).add_(1.0), k_norm=weight(s.head_dim, scale=0.1).add_(1.0),
                o=weight(s.hidden_size, qo, scale=qo ** -0.5),
                post_norm=weight(s.hidden_size, scale=0.1).add_(1.0),
                gate_up=weight(2 * s.intermediate_size, s.hidden_size, scale=s.hidden_size ** -0.5),
                down=weight(s.hidden_size, s.intermediate_size, scale=s.intermediate_size ** -0.5),
            ))  # fmt: skip
        self.final_norm = weight(s.hidden_size, scale=0.1).add_(1.0)
        half = s.head_dim // 2
        inv_freq = 1.0 / (s.rope_theta ** (torch.arange(half, device=self.device, dtype=torch.float32) / half))
        angles = torch.outer(torch.arange(max_position, device=self.device, dtype=torch.float32), inv_freq)
        self.cos_table, self.sin_table = angles.cos().to(dtype), angles.sin().to(dtype)  # [positions, D/2]

        def buffer(*dims, dtype=dtype):
            return torch.zeros(*dims, dtype=dtype, device=self.device)

        # The step's static buffers ([B, ...]): what a captured graph reads and writes.
        self.positions = buffer(b, dtype=torch.int64)
        self.hidden = buffer(b, s.hidden_size)  # the residual stream
        self.normed = buffer(b, s.hidden_size)
        self.variance = buffer(b, 1, dtype=torch.float32)
        self.square = buffer(b, s.hidden_size, dtype=torch.float32)
        self.qkv = buffer(b, qo + 2 * kv)
        self.q_pred = buffer(b, qo)
        self.head_variance = buffer(b, s.num_qo_heads, 1, dtype=torch.float32)
        self.head_square = buffer(b, s.num_qo_heads, s.head_dim, dtype=torch.float32)
        self.cos, self.sin = buffer(b, half), buffer(b, half)
        self.rotated = buffer(b, s.num_qo_heads, half)
        # the engine's inputs, contiguous (the model's q, k, v are views of one fused projection)
        self.q_in, self.q_pred_in = buffer(b, s.num_qo_heads, s.head_dim), buffer(b, s.num_qo_heads, s.head_dim)
        self.k_in, self.v_in = buffer(b, s.num_kv_heads, s.head_dim), buffer(b, s.num_kv_heads, s.head_dim)
        self.attn_out = buffer(b, s.num_qo_heads, s.head_dim)
        self.projected = buffer(b, s.hidden_size)
        self.gate_up = buffer(b, 2 * s.intermediate_size)
        self.output = buffer(b, s.hidden_size)

    # -- the ops, each into a buffer of its own ------------------------------------------------------------------
    def _rms_norm(self, x, weight, out, *, square, variance) -> None:
        """out = x / sqrt(mean(x^2) + eps) * weight, over the last dim (fp32 statistics)."""
        torch.mul(x, x, out=square)
        torch.mean(square, dim=-1, keepdim=True, out=variance)
        variance.add_(self.shape.rms_eps).rsqrt_()
        torch.mul(x, variance, out=out)
        out.mul_(weight)

    def _heads(self, flat, heads: int):
        return flat.view(flat.shape[0], heads, self.shape.head_dim)

    def _rope(self, x, rows: int) -> None:
        """Neox-style rotary embedding of x [rows, heads, D] in place, at the step's positions."""
        half = self.shape.head_dim // 2
        first, second = x[..., :half], x[..., half:]
        cos, sin = self.cos[:rows].unsqueeze(1), self.sin[:rows].unsqueeze(1)
        rotated = self.rotated[:rows, : x.shape[1]]
        torch.mul(second, sin, out=rotated)  # x2 sin
        torch.addcmul(rotated.neg_(), first, cos, out=rotated)  # x1 cos - x2 sin
        second.mul_(cos).addcmul_(first, sin)  # x2 cos + x1 sin
        first.copy_(rotated)

    def _query(self, layer: int, normed, out, rows: int) -> None:
        """Layer `layer`'s post-RoPE query from a normalized input [rows, hidden] -> out [rows, Hq * D]."""
        weights = self.layers[layer]
        torch.mm(normed, weights["qkv"][: self.q_size].t(), out=out)
        heads = self._heads(out, self.shape.num_qo_heads)
        self._rms_norm(heads, weights["q_norm"], heads, square=self.head_square[:rows],
                       variance=self.head_variance[:rows])
        self._rope(heads, rows)

    def set_positions(self, positions: torch.Tensor) -> None:
        """The step's token positions [rows] (outside a captured graph: a static buffer's new content)."""
        rows = positions.shape[0]
        self.positions[:rows].copy_(positions)
        torch.index_select(self.cos_table, 0, self.positions[:rows], out=self.cos[:rows])
        torch.index_select(self.sin_table, 0, self.positions[:rows], out=self.sin[:rows])

    # -- one decode step --------------------------------------------------------------------------------------
    def step(self, engine, rows: int, inject=None) -> torch.Tensor:
        """One decode step of `rows` tokens whose hidden states are in self.hidden: every layer's projections, norms,
        RoPE and MLP at full size, the engine's attention (with its layer-ahead prediction where it wants one) and
        the final norm -> self.output[:rows]. `inject(layer, q, k, v, q_pred)`, when given, overwrites the attention
        inputs with a workload's (the engine's input buffers [rows, heads, D]: copy into them; q_pred None where
        the layer predicts nothing), after the model computed its own."""
        s = self.shape
        hidden, normed = self.hidden[:rows], self.normed[:rows]
        square, variance = self.square[:rows], self.variance[:rows]
        for layer, weights in enumerate(self.layers):
            self._rms_norm(hidden, weights["input_norm"], normed, square=square, variance=variance)
            q_pred = None
            if layer + 1 < s.num_layers and engine.wants_prediction(layer + 1):
                self._query(layer + 1, normed, self.q_pred[:rows], rows)  # the server's layer-ahead prediction
                q_pred = self.q_pred_in[:rows]
                q_pred.copy_(self._heads(self.q_pred[:rows], s.num_qo_heads))
            qkv = self.qkv[:rows]
            torch.mm(normed, weights["qkv"].t(), out=qkv)
            q = self._heads(qkv[:, : self.q_size], s.num_qo_heads)
            k = self._heads(qkv[:, self.q_size: self.q_size + self.kv_size], s.num_kv_heads)
            v = self._heads(qkv[:, self.q_size + self.kv_size:], s.num_kv_heads)
            self._rms_norm(q, weights["q_norm"], q, square=self.head_square[:rows], variance=self.head_variance[:rows])
            self._rms_norm(k, weights["k_norm"], k, square=self.head_square[:rows, : s.num_kv_heads],
                           variance=self.head_variance[:rows, : s.num_kv_heads])
            self._rope(q, rows)
            self._rope(k, rows)
            q_in, k_in, v_in = self.q_in[:rows], self.k_in[:rows], self.v_in[:rows]
            q_in.copy_(q)
            k_in.copy_(k)
            v_in.copy_(v)
            q, k, v = q_in, k_in, v_in
            if inject is not None:
                inject(layer, q, k, v, q_pred)
            if q_pred is not None:
                engine.predict(layer + 1, q_pred)
            out = self.attn_out[:rows]
            engine.attend(layer, q, k, v, out=out)
            torch.mm(out.view(rows, -1), weights["o"].t(), out=self.projected[:rows])
            hidden.add_(self.projected[:rows])
            self._rms_norm(hidden, weights["post_norm"], normed, square=square, variance=variance)
            gate_up = self.gate_up[:rows]
            torch.mm(normed, weights["gate_up"].t(), out=gate_up)
            gate, up = gate_up[:, : s.intermediate_size], gate_up[:, s.intermediate_size:]
            torch.nn.functional.silu(gate, inplace=True)
            gate.mul_(up)
            torch.mm(gate, weights["down"].t(), out=self.projected[:rows])
            hidden.add_(self.projected[:rows])
        self._rms_norm(hidden, self.final_norm, self.output[:rows], square=square, variance=variance)
        return self.output[:rows]
