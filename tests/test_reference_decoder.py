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


def generate_sparse(model, prompts, new_tokens, config=SPARSE, **options):
    decoder = ReferenceDecoder(model, config, max_requests=4, max_tokens_per_request=256, **options)
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
        decoder._phase = ("prefill", 0, None)
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


def test_noise_blending_turns_each_row_to_exactly_the_asked_cosine_at_its_norm():
    from scout_sglang.hf.reference_decoder import blend_to_cosine

    q = torch.randn(5, 4, 16, generator=torch.Generator().manual_seed(3))
    for cosine in (1.0, 0.95, 0.6, 0.0, -0.5):
        turned = blend_to_cosine(q, cosine, torch.Generator().manual_seed(4))
        got = torch.nn.functional.cosine_similarity(turned.flatten(1), q.flatten(1), dim=-1)
        torch.testing.assert_close(got, torch.full((5,), cosine), atol=1e-5, rtol=0)
        torch.testing.assert_close(turned.flatten(1).norm(dim=1), q.flatten(1).norm(dim=1))
    other = blend_to_cosine(q, 0.6, torch.Generator().manual_seed(5))
    assert not torch.allclose(other, blend_to_cosine(q, 0.6, torch.Generator().manual_seed(4)))  # real noise
    with pytest.raises(ValueError, match="cosine"):
        blend_to_cosine(q, 1.5, torch.Generator())


def test_a_noisy_prediction_is_what_the_engine_gets_and_what_is_measured(model_and_truth):
    model, prompts, truth = model_and_truth
    noisy = generate_sparse(model, prompts, 8, prediction_cosine=0.6)
    assert sorted(noisy.query_cosine) == [1, 2]
    assert all(abs(v - 0.6) < 1e-4 for values in noisy.query_cosine.values() for v in values)
    # cosine 1: the engine selects with the real query, as without layer-ahead prediction; cosine 0 selects apart
    same_layer = generate_sparse(model, prompts, 8, config=ScoutConfig(**{**SPARSE.__dict__, "layer_ahead": False}))
    exact = generate_sparse(model, prompts, 8, prediction_cosine=1.0)
    assert exact.tokens == same_layer.tokens
    for ours, theirs in zip(exact.logits, same_layer.logits):
        torch.testing.assert_close(ours, theirs, **LOGITS_TOLERANCE[torch.float32])
    blind = generate_sparse(model, prompts, 8, prediction_cosine=0.0)
    assert any(not torch.allclose(a, b, atol=1e-3) for a, b in zip(blind.logits, same_layer.logits))
    covering_budget = ScoutConfig(mode="scout", block_size=16, token_budget=256, sink_blocks=1, local_blocks=2,
                                  cpu_groups=1)
    covering = generate_sparse(model, prompts, NEW_TOKENS, config=covering_budget, prediction_cosine=0.0)
    assert covering.tokens == truth.tokens  # the budget covers the context: the prediction cannot matter


def test_a_kept_prefill_decodes_like_running_the_prompt_again(model_and_truth):
    """generate(prefills=...) gives the engine the same K/V and the first token the same logits as running the
    prompts: the accuracy benchmark prefills each sequence once for all its configurations."""
    model, prompts, _ = model_and_truth
    decoder = ReferenceDecoder(model, SPARSE.replace(estimate=True), max_requests=4, max_tokens_per_request=256)
    try:
        first = decoder.generate(prompts, 8, keep_prefills=True)
        again = decoder.generate(prompts, 8, prefills=first.prefills)
    finally:
        decoder.close()
    assert len(first.prefills) == len(prompts) and not again.prefills
    assert [len(p.keys) for p in first.prefills] == [model.config.num_hidden_layers] * len(prompts)
    assert again.tokens == first.tokens
    for ours, theirs in zip(again.logits, first.logits):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=0)
