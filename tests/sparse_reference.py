"""What the engine's reference decoder (transformers + the same engine and
config) produces for a saved model: the truth a sparse-budget server must match."""

from __future__ import annotations

import torch

from scout_sglang.env import config_from_env
from scout_sglang.hf.reference_decoder import ReferenceDecoder


def random_prompts(lengths, *, vocab: int, seed: int = 0, first_id: int = 7) -> list[list[int]]:
    """Token-id prompts that avoid the tokenizer's special tokens (ids below first_id)."""
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(first_id, vocab, (n,), generator=generator).tolist() for n in lengths]


def reference_outputs(model_dir, scout_env: dict, prompts, new_tokens: int):
    """Greedy tokens per prompt (each decoded alone) and the mean predicted-query cosine."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    decoder = ReferenceDecoder(model, config_from_env(scout_env), max_requests=1,
                               max_tokens_per_request=max(map(len, prompts)) + new_tokens)
    tokens, cosines = [], []
    try:
        for prompt in prompts:
            result = decoder.generate([prompt], new_tokens)
            tokens.append(result.tokens[0])
            cosines += [c for values in result.query_cosine.values() for c in values]
    finally:
        decoder.close()
    return tokens, (sum(cosines) / len(cosines) if cosines else None), len(cosines)
