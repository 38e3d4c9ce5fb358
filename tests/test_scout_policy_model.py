"""The second implementation of the policy (tests/oracle/policy_engine.py) against the engine:
the same outputs on random K/V in every mode at sparse budgets, and the same greedy
tokens inside real transformers models at a sparse budget with CPU work and recalls."""

import pytest
import torch
from oracle.driver import Driver
from oracle.policy_engine import PolicyEngine
from support import LOGITS_TOLERANCE

from scout_sglang.config import MODES, ScoutConfig
from scout_sglang.core.engine import CoAttentionEngine
from scout_sglang.core.shape import ModelShape
from scout_sglang.hf.reference_decoder import ReferenceDecoder
from scout_sglang.hf.tiny_models import tiny_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")
SHAPE = ModelShape(num_layers=3, num_qo_heads=8, num_kv_heads=2, head_dim=32)


@pytest.mark.parametrize("estimate", [False, True])
@pytest.mark.parametrize("mode", MODES)
def test_the_policy_model_gives_the_engine_outputs_on_random_kv(mode, estimate):
    config = ScoutConfig(mode=mode, block_size=8, token_budget=48, sink_blocks=1, local_blocks=2, cpu_groups=1,
                         dense_layers=(), resident_blocks=3 if mode == "scout" else None, estimate=estimate)
    driver = Driver(SHAPE, [5, 30, 150, 90], 40, seed=5)
    engine_out = driver.run(CoAttentionEngine(config, SHAPE, dtype=torch.float32, max_requests=4,
                                              max_tokens_per_request=256))
    policy_out = driver.run(PolicyEngine(config, SHAPE))
    torch.testing.assert_close(engine_out, policy_out, atol=2e-5, rtol=2e-5)
    if mode != "full":
        assert (engine_out - driver.dense()).abs().max() > 1e-2  # the budget really is sparse


@pytest.mark.parametrize("mode", ["scout", "hgca"])
def test_with_a_cpu_split_the_policy_model_gives_the_engine_outputs(mode):
    """The CPU list cut into the workers' share and the device's zero-copy share, each attended and merged: the
    policy model's outputs, which split the same way."""
    config = ScoutConfig(mode=mode, block_size=8, token_budget=48, sink_blocks=1, local_blocks=2, cpu_groups=1,
                         dense_layers=(), resident_blocks=3 if mode == "scout" else None, cpu_split="0.2")
    driver = Driver(SHAPE, [5, 30, 150, 90], 40, seed=6)
    engine = CoAttentionEngine(config, SHAPE, dtype=torch.float32, max_requests=4, max_tokens_per_request=256)
    engine_out = driver.run(engine)
    totals = [t.totals() for t in driver.telemetry]
    policy_out = driver.run(PolicyEngine(config, SHAPE))
    torch.testing.assert_close(engine_out, policy_out, atol=2e-5, rtol=2e-5)
    assert sum(t.zero_copy_blocks for t in totals) > 0 and sum(t.cpu_blocks for t in totals) > 0


NEW_TOKENS = 32
SPARSE = ScoutConfig(mode="scout", block_size=16, token_budget=64, sink_blocks=1, local_blocks=1, resident_blocks=1,
                     dense_layers=(), recall_policy="adaptive", cpu_groups=1)


def decode(decoder, prompts):
    try:
        return decoder.generate(prompts, NEW_TOKENS)
    finally:
        decoder.close()


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_the_policy_model_decodes_token_for_token_like_the_engine_at_a_sparse_budget(arch):
    model = tiny_model(arch)
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 128, (n,), generator=gen).tolist() for n in (9, 70, 180)]
    ours = decode(ReferenceDecoder(model, SPARSE, max_requests=4, max_tokens_per_request=256), prompts)
    second = decode(ReferenceDecoder(model, SPARSE, engine=PolicyEngine), prompts)  # hooks the model in turn
    assert ours.tokens == second.tokens
    for a, b in zip(ours.logits, second.logits):
        torch.testing.assert_close(a, b, **LOGITS_TOLERANCE[torch.float32])
    totals = [t.totals() for t in ours.telemetry]
    assert sum(t.cpu_blocks for t in totals) > 0 and sum(t.recalled_blocks for t in totals) > 0
    assert sum(t.selected_blocks for t in totals) > sum(t.budget_blocks for t in totals) // 2  # sparse, not empty
