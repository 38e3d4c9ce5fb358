"""The attention shape of a model, as the engine needs it (no model code)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelShape:
    """Attention dimensions of a decoder stack.

    `scale` defaults to head_dim ** -0.5.
    """

    num_layers: int
    num_qo_heads: int
    num_kv_heads: int
    head_dim: int
    scale: float | None = None

    def __post_init__(self):
        problems = [
            f"{name} must be >= 1, got {getattr(self, name)}"
            for name in ("num_layers", "num_qo_heads", "num_kv_heads", "head_dim")
            if getattr(self, name) < 1
        ]
        if not problems and self.num_qo_heads % self.num_kv_heads:
            problems.append(f"num_qo_heads ({self.num_qo_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})")
        if problems:
            raise ValueError("invalid model shape: " + "; ".join(problems))

    @property
    def group_size(self) -> int:
        return self.num_qo_heads // self.num_kv_heads

    @property
    def softmax_scale(self) -> float:
        return self.head_dim**-0.5 if self.scale is None else self.scale
