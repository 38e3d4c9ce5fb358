"""Start-up checks of the scout backend: every unsupported model or setting is
named with what to do instead (a unit test with stand-in runner objects; the
real server's refusal is in test_sglang_plugin.py)."""

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from scout_sglang.config import ScoutConfig
from scout_sglang.sglang_adapter.backend import unsupported_reasons
from scout_sglang.sglang_adapter.layer_ahead import QueryPredictor, prediction_problems


class Attention(nn.Module):
    def __init__(self, hidden=32, heads=4, kv_heads=2, head_dim=8, quantized=False):
        super().__init__()
        self.q_size, self.kv_size = heads * head_dim, kv_heads * head_dim
        self.qkv_proj = nn.Linear(hidden, self.q_size + 2 * self.kv_size, bias=False)
        if quantized:
            del self.qkv_proj.weight
            self.qkv_proj.weight = torch.zeros(self.q_size + 2 * self.kv_size, hidden // 2, dtype=torch.int8)
        self.rotary_emb = SimpleNamespace(forward_native=lambda positions, q, k: (q, k))


def runner(num_layers=2, quantized=False, **server_args):
    layers = nn.ModuleList(nn.Module() for _ in range(num_layers))
    for layer in layers:
        layer.self_attn = Attention(quantized=quantized)
    model = nn.Module()
    model.model = nn.Module()
    model.model.layers = layers
    args = dict(speculative_algorithm=None, enable_mixed_chunk=False, pp_size=1, kv_cache_dtype="auto")
    return SimpleNamespace(model=model, server_args=SimpleNamespace(**{**args, **server_args}),
                           model_config=SimpleNamespace(num_hidden_layers=num_layers, hf_config=SimpleNamespace()))


def test_a_plain_llama_like_model_is_supported():
    assert unsupported_reasons(runner(), ScoutConfig()) == []


def test_each_unsupported_setting_is_named_with_what_to_do():
    cases = {
        "speculative decoding": runner(speculative_algorithm="EAGLE"),
        "--enable-mixed-chunk": runner(enable_mixed_chunk=True),
        "pipeline parallelism": runner(pp_size=2),
        "--kv-cache-dtype fp8_e4m3": runner(kv_cache_dtype="fp8_e4m3"),
        "quantized": runner(quantized=True),
        "--disaggregation-decode-retraction-backup none": runner(disaggregation_mode="decode"),
    }
    for expected, server in cases.items():
        reasons = unsupported_reasons(server, ScoutConfig())
        assert len(reasons) == 1 and expected in reasons[0], (expected, reasons)
    mla = runner()
    mla.use_mla_backend = True
    assert "MLA" in unsupported_reasons(mla, ScoutConfig())[0]
    sliding = runner()
    sliding.model_config.hf_config = SimpleNamespace(sliding_window=4096, use_sliding_window=True)
    assert "sliding-window" in unsupported_reasons(sliding, ScoutConfig())[0]


def test_a_pd_decode_instance_needs_the_retraction_backup_off():
    """SGLang's backup copies its own pool, which holds no decoded token's K/V under scout: any backup it would
    choose (given, or resolved later from the default None) restores rows nobody wrote."""
    for backup in (None, "cpu_tensor", "host_pool"):
        reasons = unsupported_reasons(runner(disaggregation_mode="decode",
                                             disaggregation_decode_retraction_backup=backup), ScoutConfig())
        assert len(reasons) == 1 and "--disaggregation-decode-retraction-backup none" in reasons[0], (backup, reasons)
    assert unsupported_reasons(runner(disaggregation_mode="decode", disaggregation_decode_retraction_backup="none"),
                               ScoutConfig()) == []
    # receiving K/V into host memory first makes SGLang back retractions up to a host pool, whatever was given
    buffered = runner(disaggregation_mode="decode", disaggregation_decode_retraction_backup="none",
                      disaggregation_decode_host_receive_threshold=0.5)
    assert "--disaggregation-decode-retraction-backup none" in unsupported_reasons(buffered, ScoutConfig())[0]
    for mode in ("null", "prefill"):  # no decode instance: SGLang backs nothing up
        assert unsupported_reasons(runner(disaggregation_mode=mode), ScoutConfig()) == []


def test_quantized_weights_only_matter_when_predicting_ahead():
    assert "SCOUT_LAYER_AHEAD=0" in unsupported_reasons(runner(quantized=True), ScoutConfig())[0]
    assert unsupported_reasons(runner(quantized=True), ScoutConfig(layer_ahead=False)) == []
    assert unsupported_reasons(runner(quantized=True), ScoutConfig(mode="quest")) == []


def test_an_unrecognised_model_structure_is_reported():
    server = runner()
    server.model.model = nn.Module()
    assert "model.model.layers" in prediction_problems(server.model, 2)[0]


def test_the_predictor_uses_the_next_layers_q_rows_and_only_while_decoding():
    server = runner(num_layers=3)
    calls = []
    predictor = QueryPredictor(server.model, head_dim=8, wants=lambda layer: layer == 2,
                               on_prediction=lambda layer, q: calls.append((layer, q)))
    layers = server.model.model.layers
    x = torch.randn(5, 32)
    layers[1].self_attn.qkv_proj(x)  # not decoding: nothing
    predictor.active, predictor.positions = True, torch.arange(5)
    layers[0].self_attn.qkv_proj(x)  # predicts layer 1, which is not wanted
    layers[1].self_attn.qkv_proj(x)  # predicts layer 2
    assert [layer for layer, _ in calls] == [2]
    expected = x @ layers[2].self_attn.qkv_proj.weight[:32].T
    torch.testing.assert_close(calls[0][1], expected.view(5, 4, 8))
    predictor.remove()
    layers[1].self_attn.qkv_proj(x)
    assert len(calls) == 1


def test_a_host_store_larger_than_the_free_memory_is_refused_with_what_to_change():
    from scout_sglang.sglang_adapter.kv_pool import check_host_memory

    check_host_memory(2**20, 1000)
    with pytest.raises(RuntimeError, match="lower --max-total-tokens"):
        check_host_memory(2**60, 10**9)


def test_the_host_memory_check_counts_every_tensor_parallel_rank_on_the_host():
    from scout_sglang.sglang_adapter.kv_pool import check_host_memory

    check_host_memory(4 * 2**30, 1000, local_ranks=2, available=10 * 2**30)  # 8 GiB of 9 usable
    with pytest.raises(RuntimeError, match=r"needs 4\.0 GiB of host memory on each of the 4 tensor-parallel ranks on "
                                           r"this host \(16\.0 GiB together\), but only 10\.0 GiB is available"):
        check_host_memory(4 * 2**30, 1000, local_ranks=4, available=10 * 2**30)
