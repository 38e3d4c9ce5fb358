"""Small Llama / Qwen3 causal LMs with random weights, built locally (no hub)."""

from __future__ import annotations

import torch


def tiny_model(arch: str = "llama", *, num_layers: int = 3, hidden: int = 64, num_heads: int = 4, num_kv_heads: int = 2,
               head_dim: int = 16, vocab: int = 128, max_positions: int = 4096, seed: int = 0,
               init_std: float = 0.2, dtype=torch.float32):
    """A random-weight model in eval mode. A large `init_std` gives peaked logits,
    so greedy decoding has no near-ties for rounding to flip."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

    common = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=num_layers,
                  num_attention_heads=num_heads, num_key_value_heads=num_kv_heads, head_dim=head_dim,
                  max_position_embeddings=max_positions, initializer_range=init_std, tie_word_embeddings=False)
    if arch == "llama":
        config, model_class = LlamaConfig(**common), LlamaForCausalLM
    elif arch == "qwen3":
        config, model_class = Qwen3Config(**common), Qwen3ForCausalLM
    else:
        raise ValueError(f"arch must be 'llama' or 'qwen3', got {arch!r}")
    torch.manual_seed(seed)
    model = model_class(config).to(dtype)
    return model.eval()
