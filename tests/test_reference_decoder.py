"""The engine inside real transformers models: with the budget covering the
context, every mode decodes exactly like transformers' own dense decoding."""

import pytest
import torch
from support import LOGITS_TOLERANCE

from scout_sglang.config import MODES, ScoutConfig
from scout_sglang.hf.reference_decoder import ReferenceDecoder, dense_generate
from scout_sglang.hf.tiny_models import tiny_model

NEW_TOKENS = 64


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def model_and_truth(request):
    model = tiny_model(request.param)
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 128, (n,), generator=gen).tolist() for n in (7, 40, 100)]
    return model, prompts, dense_generate(model, prompts, NEW_TOKENS)


@pytest.mark.parametrize("mode", MODES)
def test_budget_covering_the_context_decodes_like_dense(model_and_truth, mode):
    model, prompts, truth = model_and_truth
    config = ScoutConfig(mode=mode, block_size=16, token_budget=256, sink_blocks=1, local_blocks=2, cpu_groups=1)
    decoder = ReferenceDecoder(model, config, max_requests=4, max_tokens_per_request=256)
    try:
        result = decoder.generate(prompts, NEW_TOKENS)
    finally:
        decoder.close()
    assert result.tokens == truth.tokens
    for ours, theirs in zip(result.logits, truth.logits):
        torch.testing.assert_close(ours, theirs, **LOGITS_TOLERANCE[torch.float32])
    assert decoder.engine.usage()["requests"] == 0  # generate releases what it admitted


SPARSE = ScoutConfig(mode="scout", block_size=16, token_budget=64, sink_blocks=1, local_blocks=2, cpu_groups=1)


def generate_sparse(model, prompts, new_tokens):
    decoder = ReferenceDecoder(model, SPARSE, max_requests=4, max_tokens_per_request=256)
    try:
        return decoder.generate(prompts, new_tokens)
    finally:
        decoder.close()


def test_predicted_queries_are_measured_per_layer(model_and_truth):
    model, prompts, _ = model_and_truth
    result = generate_sparse(model, prompts, 8)
    # dense layer 0 is never predicted; layers 1.. are, once per request per decode step
    assert sorted(result.query_cosine) == [1, 2]
    assert all(len(values) == 3 * 7 and all(-1.0 <= v <= 1.0 for v in values) for values in result.query_cosine.values())


def test_the_prediction_equals_the_real_query_when_the_layer_input_is_the_same(model_and_truth):
    """predict_query reproduces the model's own post-RoPE query from the same input."""
    model, _, _ = model_and_truth
    decoder = ReferenceDecoder(model, SPARSE, max_requests=1)
    captured = {}
    layer = decoder.layers[1]
    handle = layer.self_attn.q_proj.register_forward_pre_hook(lambda m, args: captured.setdefault("x", args[0]))
    try:
        ids, positions = torch.tensor([[27]]), torch.tensor([[7]])  # one token, as in decode
        real = {}
        original = decoder._attention

        def spy(module, query, key, value, scaling):
            if module.layer_idx == 1:
                real["q"] = query[:, :, -1]
            return original(module, query, key, value, scaling)

        decoder._attention = spy
        decoder.engine.add_request(0)
        decoder._phase = ("prefill", 0)
        model.config._attn_implementation = "scout_engine"
        with torch.no_grad():
            model(input_ids=ids, position_ids=positions, use_cache=False)
            predicted = decoder.predict_query(1, captured["x"][:, -1:])
        torch.testing.assert_close(predicted, real["q"], atol=1e-6, rtol=1e-6)
    finally:
        handle.remove()
        decoder.close()


def test_each_layer_is_selected_once_per_step(model_and_truth):
    """Layer-ahead prediction must not re-enter the hooks: one selection per layer per step."""
    model, prompts, _ = model_and_truth
    result = generate_sparse(model, prompts, 6)
    budget_per_layer = SPARSE.topk_blocks * model.config.num_key_value_heads * len(prompts)
    for telemetry in result.telemetry:
        for layer, stats in telemetry.layers.items():
            assert stats.budget_blocks == budget_per_layer, f"layer {layer} selected more than once"
