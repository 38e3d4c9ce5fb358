"""The model dimensions the planner needs, from a config.json or a preset.

Capacity needs the attention shape (layers, KV heads, head dim); the step
model also needs the weights a decode step reads (hidden, intermediate, vocab).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from scout_sglang.core.shape import ModelShape


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer as the planner sees it (dense MLP, grouped-query attention).

    Parameters
    ----------
    name : str
    num_layers, num_qo_heads, num_kv_heads, head_dim : int
        L, Hq, Hkv, D.
    hidden_size, intermediate_size, vocab_size : int
    tie_word_embeddings : bool
        True: the output projection is the embedding (read once per step either way).
    qk_norm : bool
        Per-head RMSNorm of q and k (Qwen3): 2 * D more weights per layer.
    source : str
    """

    name: str
    num_layers: int
    num_qo_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool = False
    qk_norm: bool = False
    source: str = ""

    def __post_init__(self):
        self.shape()  # validates the attention dimensions

    def shape(self) -> ModelShape:
        return ModelShape(num_layers=self.num_layers, num_qo_heads=self.num_qo_heads,
                          num_kv_heads=self.num_kv_heads, head_dim=self.head_dim)

    def layer_params(self) -> int:
        """Weights of one decoder layer: attention projections, gated MLP, norms."""
        h, d = self.hidden_size, self.head_dim
        attention = h * self.num_qo_heads * d * 2 + h * self.num_kv_heads * d * 2  # q, o; k, v
        mlp = 3 * h * self.intermediate_size  # gate, up, down
        return attention + mlp + 2 * h + (2 * d if self.qk_norm else 0)

    def head_params(self) -> int:
        """Weights read once per step outside the layers: the output projection and the final norm (the
        embedding lookup reads one row per request, nothing)."""
        return self.vocab_size * self.hidden_size + self.hidden_size

    def total_params(self) -> int:
        embedding = self.vocab_size * self.hidden_size
        output = 0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size
        return self.num_layers * self.layer_params() + embedding + output + self.hidden_size


def spec_from_config(config: dict, name: str, source: str) -> ModelSpec:
    """A ModelSpec from the fields of a Hugging Face config.json."""
    if "kv_lora_rank" in config:
        raise ValueError(f"{name}: MLA attention (kv_lora_rank) is not served by the scout backend")
    missing = [key for key in ("num_hidden_layers", "num_attention_heads", "hidden_size", "intermediate_size",
                               "vocab_size") if key not in config]
    if missing:
        raise ValueError(f"{name}: config.json lacks {missing}; is this a decoder-only transformer's config?")
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    return ModelSpec(name=name, num_layers=config["num_hidden_layers"], num_qo_heads=heads,
                     num_kv_heads=config.get("num_key_value_heads") or heads, head_dim=head_dim,
                     hidden_size=config["hidden_size"], intermediate_size=config["intermediate_size"],
                     vocab_size=config["vocab_size"], tie_word_embeddings=bool(config.get("tie_word_embeddings")),
                     qk_norm=config.get("model_type") in ("qwen3", "qwen3_moe"), source=source)


# The fields of each model's config.json as published on the Hugging Face Hub (Qwen/Qwen3-8B, Qwen/Qwen3-14B,
# Qwen/Qwen3-32B, meta-llama/Llama-3.1-8B), copied here so that planning needs no download.
PRESETS = {
    "Qwen3-8B": dict(model_type="qwen3", num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
                     head_dim=128, hidden_size=4096, intermediate_size=12288, vocab_size=151936,
                     tie_word_embeddings=False),
    "Qwen3-14B": dict(model_type="qwen3", num_hidden_layers=40, num_attention_heads=40, num_key_value_heads=8,
                      head_dim=128, hidden_size=5120, intermediate_size=17408, vocab_size=151936,
                      tie_word_embeddings=False),
    "Qwen3-32B": dict(model_type="qwen3", num_hidden_layers=64, num_attention_heads=64, num_key_value_heads=8,
                      head_dim=128, hidden_size=5120, intermediate_size=25600, vocab_size=151936,
                      tie_word_embeddings=False),
    "Llama-3.1-8B": dict(model_type="llama", num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                         hidden_size=4096, intermediate_size=14336, vocab_size=128256, tie_word_embeddings=False),
}
BUNDLED = "needle-llama"  # the retrieval model shipped in scout_sglang/assets


def bundled_config_path() -> Path:
    from scout_sglang import assets

    return Path(assets.__file__).resolve().parent / BUNDLED / "config.json"


def load_model(name_or_path: str) -> ModelSpec:
    """A preset name (PRESETS, or 'needle-llama'), a config.json, or a directory holding one."""
    for preset, fields in PRESETS.items():
        if name_or_path.lower() in (preset.lower(), f"qwen/{preset.lower()}", f"meta-llama/{preset.lower()}"):
            return spec_from_config(fields, preset, "preset: the model's config.json on the Hugging Face Hub")
    path = bundled_config_path() if name_or_path == BUNDLED else Path(name_or_path)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise ValueError(f"--model {name_or_path!r} is neither a preset ({', '.join([*PRESETS, BUNDLED])}) nor an "
                         "existing config.json (or a directory holding one)")
    try:
        config = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is not valid JSON: {error}") from None
    config = config.get("text_config", config)  # multimodal wrappers keep the decoder's fields there
    return spec_from_config(config, path.parent.name or str(path), f"read from {path}")
