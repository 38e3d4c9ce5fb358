"""What the engine's reference decoder (transformers + the same engine and
config) produces for a saved model: the truth a sparse-budget server must match."""

from __future__ import annotations

import torch

from scout_sglang.env import config_from_env
from scout_sglang.hf.reference_decoder import ReferenceDecoder

# A setting where the CPU part decides tokens, for the tests whose claim is that a fault costs no token: the tiny
# preset (blocks of 16, a 128-token budget) with no resident buffer and no recall, so each step sends every
# selected block past the sink and the local window (6 of the 8) to the CPU part. At the preset alone the resident
# buffer holds most of them and a server whose CPU part is thrown away still answers many prompts as the
# reference decoder does; here nearly every answer differs (docs/testing.md has the counts), and each such test
# checks that on its own prompts (reference_outputs(..., drop_cpu_part=True)) or on a server (cpu_drop).
CPU_DECIDES_ENV = {"SCOUT_CONFIG": "tiny", "SCOUT_CPU_GROUPS": "1", "SCOUT_RESIDENT_BLOCKS": "0",
                   "SCOUT_RECALL_POLICY": "off"}


def random_prompts(lengths, *, vocab: int, seed: int = 0, first_id: int = 7) -> list[list[int]]:
    """Token-id prompts that avoid the tokenizer's special tokens (ids below first_id)."""
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(first_id, vocab, (n,), generator=generator).tolist() for n in lengths]


def reference_outputs(model_dir, scout_env: dict, prompts, new_tokens: int, *, drop_cpu_part: bool = False,
                      quota_runs=None):
    """Greedy tokens per prompt (each decoded alone) and the mean predicted-query cosine.

    drop_cpu_part : every CPU part's result thrown away (the cpu_drop fault: o = 0, lse = -inf, so the merge
        keeps the device part alone): the negative control of a test that faults cost no token, whose tokens
        must differ from these for that test to say anything
    quota_runs : resident-first, per prompt the quota runs a server gave it (/server_info resident_pool
        recent_requests): each prompt decoded alone at the quotas it had among the server's other requests (the
        pool, SCOUT_RESIDENT_POOL_BLOCKS, must hold the largest)
    """
    from transformers import AutoModelForCausalLM

    from scout_sglang.core.engine import CoAttentionEngine
    from scout_sglang.cpu_worker.faults import FaultPlan

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    max_tokens = max(map(len, prompts)) + new_tokens
    engine = None
    if drop_cpu_part:
        def engine(config, shape):
            return CoAttentionEngine(config, shape, dtype=torch.float32, max_requests=1,
                                     max_tokens_per_request=max_tokens, cpu_faults=FaultPlan(drop_probability=1.0))
    decoder = ReferenceDecoder(model, config_from_env(scout_env), max_requests=1, max_tokens_per_request=max_tokens,
                               engine=engine)
    tokens, cosines = [], []
    try:
        for index, prompt in enumerate(prompts):
            if quota_runs is not None:
                decoder.engine.pool.replayed = {0: quota_runs[index]}  # generate's request is rid 0
            result = decoder.generate([prompt], new_tokens)
            tokens.append(result.tokens[0])
            cosines += [c for values in result.query_cosine.values() for c in values]
    finally:
        decoder.close()
    return tokens, (sum(cosines) / len(cosines) if cosines else None), len(cosines)


def differing(outputs, expected) -> int:
    """How many of the outputs differ from the expected ones (lists of token lists, in the same order)."""
    assert len(outputs) == len(expected)
    return sum(a != b for a, b in zip(outputs, expected))
