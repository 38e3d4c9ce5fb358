"""Layer-ahead query prediction inside an SGLang Llama/Qwen3 model (sglang 0.5.23).

A forward pre-hook on layer i's `self_attn.qkv_proj` receives X_i, the
normalized input of layer i. From it we predict layer i+1's query the way that
layer will compute it from X_{i+1}: the Q rows of its fused projection
(`qkv_proj.weight[:q_size]`, local heads under tensor parallelism), its
per-head `q_norm` (Qwen3), then RoPE at the step's positions. The engine
uses the prediction to select blocks and launch the CPU part one layer early.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def decoder_layers(model) -> list:
    """`model.model.layers` of an SGLang causal LM, or [] when the structure differs."""
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    return list(layers) if layers is not None else []


def prediction_problems(model, num_layers: int) -> list[str]:
    """Why layer-ahead prediction cannot run on this model (empty: it can)."""
    layers = decoder_layers(model)
    if len(layers) != num_layers:
        return [f"the model's decoder layers were not found at model.model.layers ({len(layers)} found, "
                f"{num_layers} expected)"]
    problems = []
    for index, layer in enumerate(layers):
        attn = getattr(layer, "self_attn", None)
        proj = getattr(attn, "qkv_proj", None)
        weight = getattr(proj, "weight", None)
        if proj is None or not hasattr(attn, "rotary_emb") or not hasattr(attn, "q_size"):
            problems.append(f"layer {index} has no self_attn.qkv_proj / rotary_emb / q_size")
        elif not isinstance(weight, torch.Tensor) or not weight.is_floating_point() or weight.dim() != 2 \
                or weight.shape[0] != attn.q_size + 2 * attn.kv_size:
            problems.append(f"layer {index}'s qkv_proj weight is not a plain floating-point matrix (quantized?)")
        if problems:
            break
    return problems


class QueryPredictor:
    """Hooks that call `on_prediction(layer, q_pred [B, Hq, D])` for layer i+1 from layer i's input.

    `active` and `positions` are set by the backend for each decode forward;
    the hooks do nothing while `active` is False (prefill, idle).
    """

    def __init__(self, model, head_dim: int, wants, on_prediction):
        self.layers = decoder_layers(model)
        self.head_dim = head_dim
        self.wants = wants
        self.on_prediction = on_prediction
        self.active = False
        self.positions: torch.Tensor | None = None
        self._handles = [layer.self_attn.qkv_proj.register_forward_pre_hook(self._hook(index))
                         for index, layer in enumerate(self.layers[:-1])]

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def _hook(self, index: int):
        def hook(module, args):
            if self.wants(index + 1):  # inside a captured decode graph too: its ops and the engine's are kernels
                self.predict_and_deliver(index + 1, args[0])

        return hook

    def predict_and_deliver(self, layer: int, x: torch.Tensor) -> None:
        """Predict `layer`'s query from x [B', hidden] (a graph's padded rows are dropped) and hand it on."""
        if self.active:
            self.on_prediction(layer, self.predict(layer, x[: self.positions.shape[0]]))

    @torch.no_grad()
    def predict(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        """Layer `layer`'s query from x [B, hidden] (the previous layer's normalized input) -> [B, Hq, D]."""
        attn = self.layers[layer].self_attn
        proj = attn.qkv_proj
        bias = proj.bias[: attn.q_size] if getattr(proj, "bias", None) is not None else None
        q = F.linear(x, proj.weight[: attn.q_size], bias)  # a new tensor: the in-place ops below never touch x
        if hasattr(attn, "q_norm"):
            q = attn.q_norm.forward_native(q.reshape(-1, self.head_dim)).reshape(q.shape)
        q, _ = attn.rotary_emb.forward_native(self.positions, q, q[:, : self.head_dim].clone())
        return q.reshape(x.shape[0], -1, self.head_dim)
