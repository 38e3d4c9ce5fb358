"""The planner's capacity model: hand-computed byte counts, and the numbers of the server's own memory report
for an engine actually built (the bundled retrieval model with the tiny preset)."""

import pytest
import torch

from scout_sglang.config import ScoutConfig
from scout_sglang.core.engine import CoAttentionEngine
from scout_sglang.env import load_preset
from scout_sglang.plan.capacity import (engine_device_bytes, max_batch, request_bytes, server_batch,
                                        stock_device_bytes, token_bytes)
from scout_sglang.plan.models import load_model
from scout_sglang.sglang_adapter import memory_report

KIB, MIB = 1024, 2**20


def test_a_qwen3_14b_token_is_160_kib_of_kv():
    assert token_bytes(load_model("Qwen3-14B"), itemsize=2) == 40 * 8 * 128 * 2 * 2 == 160 * KIB


def test_parameter_counts_match_the_published_ones():
    assert load_model("Llama-3.1-8B").total_params() == 8_030_261_248  # Meta's count for Llama 3 8B
    qwen_layer = 5120 * 5120 * 2 + 5120 * 1024 * 2 + 3 * 5120 * 17408 + 2 * 5120 + 2 * 128  # q,o; k,v; MLP; norms
    assert load_model("Qwen3-14B").total_params() == 40 * qwen_layer + 2 * 151936 * 5120 + 5120  # 14.8 B


def test_a_64k_qwen3_14b_request_by_hand():
    """Default preset: block 32, budget 2048 (64 blocks), sink 1 + local 2, layer 0 dense, bf16."""
    per = request_bytes(ScoutConfig(), load_model("Qwen3-14B"), itemsize=2, request_tokens=65536)
    layer_token = 8 * 128 * 2 * 2  # K and V of a token in one layer: 4 KiB
    window = (1 + 2 + 1 + 64) * 32 * layer_token  # sink, local, tail, 64 resident blocks: 8.5 MiB
    digests = 65536 // 32 * 8 * 128 * 2 * 2  # min and max of K per block: 8 MiB
    assert per["offloaded_layer"] == {"window_and_resident": window, "digests": digests, "device": window + digests}
    assert per["dense_layer"] == 65536 * layer_token == 256 * MIB
    assert per["device"] == 39 * (8.5 + 8) * MIB + 256 * MIB  # 899.5 MiB
    assert per["full_attention"] == 40 * 256 * MIB


def needle_engine(config, slots, logical_tokens):
    spec = load_model("needle-llama")
    total_pages = memory_report.engine_total_pages(logical_tokens, config.block_size, slots)
    engine = CoAttentionEngine(config, spec.shape(), dtype=torch.float32, max_requests=slots, total_pages=total_pages,
                               cpu_worker=False)  # no CPU work here: no threads
    return spec, engine


@pytest.mark.parametrize("mode", ["scout", "hgca", "infinigen", "quest"])
def test_capacity_equals_the_memory_report_of_the_built_engine(mode):
    """The bundled model (3 layers, 2 KV heads of 32, fp32) with the tiny preset: the planner's bytes are the
    engine's allocation and the start-up log's per-request bytes."""
    config = ScoutConfig(**load_preset("tiny")).replace(mode=mode)
    spec, engine = needle_engine(config, slots=3, logical_tokens=1000)
    planned = engine_device_bytes(config, spec, itemsize=4, logical_tokens=1000, slots=3)
    memory = engine.memory()
    assert planned["device_bytes_allocated"] - planned["sglang_pool_device_bytes"] == memory["device_bytes_allocated"]
    assert planned["host_bytes_allocated"] == memory["host_bytes_allocated"]
    for part, value in memory_report.device_parts(engine).items():
        assert planned[part] == value
    assert request_bytes(config, spec, itemsize=4, request_tokens=777) == memory_report.per_request_bytes(engine, 777)
    # SGLang's placeholder pool beside the engine: 2 tokens per slot plus a padding page, every layer
    assert planned["sglang_pool_device_bytes"] == (2 * 3 + 1) * token_bytes(spec, 4)


def test_stock_batch_is_the_pool_over_the_request_length():
    spec = load_model("Qwen3-14B")
    request = 1000
    budget = stock_device_bytes(spec, itemsize=2, tokens=10 * request)  # 10 requests and the padding token
    stock = ScoutConfig(mode="full")
    assert max_batch(stock, spec, itemsize=2, request_tokens=request, device_budget=budget, host_budget=0).max_batch == 10
    fewer = max_batch(stock, spec, itemsize=2, request_tokens=request, device_budget=budget - 1, host_budget=0)
    assert (fewer.max_batch, fewer.limit) == (9, "device memory")


@pytest.mark.parametrize("device_mib, host_mib", [(600, 10**6), (10**6, 20 * 1024), (4000, 10**6)])
def test_scout_batch_is_the_largest_that_fits_both_memories(device_mib, host_mib):
    spec, config = load_model("Qwen3-8B"), ScoutConfig()
    request = 32768 + 512
    capacity = max_batch(config, spec, itemsize=2, request_tokens=request, device_budget=device_mib * MIB,
                         host_budget=host_mib * MIB)
    batch = capacity.max_batch
    assert batch >= 1

    def fits(n):
        plan = engine_device_bytes(config, spec, itemsize=2, logical_tokens=n * request, slots=n)
        return plan["device_bytes_allocated"] <= device_mib * MIB and plan["host_bytes_allocated"] <= host_mib * MIB

    assert fits(batch) and not fits(batch + 1)
    expected_limit = "host memory" if host_mib < 10**6 else "device memory"
    assert capacity.limit == expected_limit
    assert capacity.device_bytes == engine_device_bytes(config, spec, itemsize=2, logical_tokens=batch * request,
                                                        slots=batch)["device_bytes_allocated"]


def test_request_slots_cap_the_batch():
    spec, config = load_model("Qwen3-8B"), ScoutConfig()
    capacity = max_batch(config, spec, itemsize=2, request_tokens=4096, device_budget=10**12, host_budget=10**13,
                         max_requests=5)
    assert (capacity.max_batch, capacity.limit) == (5, "max running requests")


def test_a_server_admits_what_its_token_capacity_and_slots_hold():
    spec, config = load_model("needle-llama"), ScoutConfig(**load_preset("tiny"))
    assert server_batch(config, spec, itemsize=4, request_tokens=1026, max_total_tokens=9216,
                        max_running_requests=8).max_batch == 8
    small = server_batch(config, spec, itemsize=4, request_tokens=1026, max_total_tokens=5000, max_running_requests=8)
    assert (small.max_batch, small.limit) == (4, "token capacity")
    assert small.device_bytes == engine_device_bytes(config, spec, itemsize=4, logical_tokens=5000,
                                                     slots=8)["device_bytes_allocated"]


def test_a_shared_prefix_is_held_once_in_either_pool():
    from scout_sglang.plan.capacity import held_tokens

    assert held_tokens(4, 3000, 2000, 32) == 1984 + 4 * (3000 - 1984)  # whole blocks of the prefix, once
    assert held_tokens(0, 3000, 2000, 32) == 0 and held_tokens(3, 3000, 0, 32) == 9000
    spec = load_model("Qwen3-8B")
    config = ScoutConfig()
    budgets = dict(itemsize=2, request_tokens=34816, device_budget=20 * 2**30, host_budget=2**40)
    for mode_config in (config, ScoutConfig(mode="full")):
        alone = max_batch(mode_config, spec, **budgets)
        shared = max_batch(mode_config, spec, **budgets, shared_prefix=32768)
        assert shared.max_batch > alone.max_batch
    stock = max_batch(ScoutConfig(mode="full"), spec, **budgets, shared_prefix=32768)
    tokens = 32768 + stock.max_batch * (34816 - 32768)
    assert stock.device_bytes == stock_device_bytes(spec, itemsize=2, tokens=tokens)


def test_the_planner_refuses_a_shared_prefix_longer_than_the_input():
    from scout_sglang.plan.planner import PlanRequest

    assert any("--shared-prefix" in p for p in PlanRequest(load_model("Qwen3-8B"), context=4096,
                                                           shared_prefix=8192).problems())
    assert PlanRequest(load_model("Qwen3-8B"), context=4096, shared_prefix=2048).problems() == []
