"""The scout KV pool's decisions from a server's arguments: which layout, what
it refuses, the logical capacity and the memory comparison logged at start-up
(units isolated from SGLang; the served pool is tested in test_sglang_capacity.py)."""

from types import SimpleNamespace

import pytest
import torch

from scout_sglang.config import ScoutConfig
from scout_sglang.core.engine import CoAttentionEngine
from scout_sglang.core.shape import ModelShape
from scout_sglang.env import PoolSettings, pool_settings_from_env
from scout_sglang.sglang_adapter import memory_report
from scout_sglang.sglang_adapter.kv_pool import logical_capacity, pool_layout, pool_problems


def args(backend="scout", prefill=None, decode=None, mode="null", radix_off=True, **extra):
    return SimpleNamespace(attention_backend=backend, prefill_attention_backend=prefill,
                           decode_attention_backend=decode, disaggregation_mode=mode,
                           disable_radix_cache=radix_off, **extra)


SCOUT = PoolSettings()


def test_layout_follows_who_runs_prefill():
    assert pool_layout(args(), "cuda", False, SCOUT) == "logical"
    assert pool_layout(args(mode="decode"), "cuda", False, SCOUT) == "arrival"
    assert pool_layout(args("triton", decode="scout"), "cpu", False, SCOUT) == "arrival"
    assert pool_layout(args("triton"), "cuda", False, SCOUT) is None
    assert pool_layout(args(prefill="scout", decode="triton"), "cuda", False, SCOUT) is None
    assert pool_layout(args(), "cuda", True, SCOUT) is None  # a draft worker keeps SGLang's pool
    assert pool_layout(args(), "cuda", False, PoolSettings(kv_pool="stock")) is None


def test_a_stock_prefill_backend_on_a_gpu_cannot_write_host_memory():
    with pytest.raises(RuntimeError, match="use --attention-backend scout.*SCOUT_KV_POOL=stock"):
        pool_layout(args("flashinfer", decode="scout"), "cuda", False, SCOUT)


def test_refuses_the_radix_cache_and_hierarchical_cache():
    assert pool_problems(args()) == []
    problems = pool_problems(args(radix_off=False, enable_hierarchical_cache=True))
    assert any("--disable-radix-cache" in p for p in problems)
    assert any("--enable-hierarchical-cache" in p for p in problems)


def test_logical_capacity_from_tokens_or_host_gib():
    assert logical_capacity(10_007, SCOUT, token_bytes=1024, page_size=16) == 10_000
    assert logical_capacity(10_000, PoolSettings(host_kv_gib=1.0), token_bytes=2**20, page_size=1) == 1024
    with pytest.raises(RuntimeError, match="--max-total-tokens N .* or set SCOUT_HOST_KV_GIB"):
        logical_capacity(None, SCOUT, token_bytes=1024, page_size=1)
    with pytest.raises(RuntimeError, match="below one page"):
        logical_capacity(8, SCOUT, token_bytes=1024, page_size=16)


def test_pool_settings_are_checked():
    assert pool_settings_from_env({}) == PoolSettings("scout", None)
    assert pool_settings_from_env({"SCOUT_KV_POOL": "stock", "SCOUT_HOST_KV_GIB": "2.5"}) == PoolSettings("stock", 2.5)
    with pytest.raises(ValueError, match="SCOUT_KV_POOL='host' is not accepted; accepted values: scout, stock"):
        pool_settings_from_env({"SCOUT_KV_POOL": "host"})
    with pytest.raises(ValueError, match="must be positive"):
        pool_settings_from_env({"SCOUT_HOST_KV_GIB": "0"})
    with pytest.raises(ValueError, match="not a number"):
        pool_settings_from_env({"SCOUT_HOST_KV_GIB": "lots"})


def test_device_bytes_per_request_and_layer_against_full_attention():
    shape = ModelShape(num_layers=2, num_qo_heads=4, num_kv_heads=2, head_dim=16)
    config = ScoutConfig(mode="scout", block_size=16, token_budget=64, sink_blocks=1, local_blocks=1,
                         dense_layers=(), cpu_groups=1)
    engine = CoAttentionEngine(config, shape, dtype=torch.bfloat16, max_requests=2, max_tokens_per_request=64)
    token = 2 * 2 * 16 * 2  # K and V, 2 heads of 16 dims, 2 bytes
    per = memory_report.per_request_layer_bytes(engine, 4096)
    assert per["full_attention"] == 4096 * token
    assert per["digests"] == 4096 // 16 * token
    assert per["window_and_resident"] == engine.offloaded.pages_per_request * 16 * token
    assert per["device"] == per["digests"] + per["window_and_resident"] < per["full_attention"] / 5
    message = memory_report.startup_message(engine, "logical", 8192, 4096, {"device": 0, "host": 0}, 2)
    assert "a 4096-token request needs" in message and "full attention needs 512.0 KiB" in message
