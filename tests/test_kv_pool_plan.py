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
from scout_sglang.sglang_adapter.kv_pool import (check_device_memory, check_engine_memory, logical_capacity, pool_layout,
                                               pool_problems)


def args(backend="scout", prefill=None, decode=None, mode="null", radix_off=True, **extra):
    return SimpleNamespace(attention_backend=backend, prefill_attention_backend=prefill,
                           decode_attention_backend=decode, disaggregation_mode=mode,
                           disable_radix_cache=radix_off, **extra)


SCOUT = PoolSettings()


def test_a_pd_instance_refuses_the_nixl_transfer_backend():
    """NIXL would register the scout pool's host K/V as device memory; Mooncake (tested end to end) is fine."""
    nixl = pool_problems(args(mode="decode", disaggregation_transfer_backend="nixl"))
    assert nixl == ["the NIXL transfer backend (it registers the scout pool's host K/V as device memory): "
                    "use --disaggregation-transfer-backend mooncake"]
    assert pool_problems(args(mode="decode", disaggregation_transfer_backend="mooncake")) == []
    assert pool_problems(args(mode="null", disaggregation_transfer_backend="nixl")) == []  # no PD: not used


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


def test_the_radix_cache_needs_pages_of_one_block_and_scout_running_prefill():
    assert pool_problems(args()) == []
    assert pool_problems(args(radix_off=False, page_size=32), "logical", block_size=32) == []
    problems = pool_problems(args(radix_off=False, enable_hierarchical_cache=True), "logical", block_size=32)
    assert any("add --page-size 32 (or --disable-radix-cache)" in p for p in problems)
    assert any("--enable-hierarchical-cache" in p for p in problems)
    decode_only = pool_problems(args(mode="decode", radix_off=False, page_size=32), "arrival", block_size=32)
    assert decode_only and "add --disable-radix-cache" in decode_only[0]


def test_logical_capacity_from_tokens_or_host_gib():
    assert logical_capacity(10_007, SCOUT, token_bytes=1024, page_size=16) == 10_000
    assert logical_capacity(10_000, PoolSettings(host_kv_gib=1.0), token_bytes=2**20, page_size=1) == 1024
    # SCOUT_HOST_KV_GIB is the whole server's: 2 ranks on the host, each with half the heads (half the bytes
    # per token) in half the memory, hold the same tokens as one rank
    assert logical_capacity(10_000, PoolSettings(host_kv_gib=1.0), token_bytes=2**19, page_size=1,
                            local_ranks=2) == 1024
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


SHAPE = ModelShape(num_layers=3, num_qo_heads=4, num_kv_heads=2, head_dim=16)
TOKEN = 2 * 2 * 16 * 2  # K and V of a token in a layer: 2 heads of 16 dims, 2 bytes


def small_engine(dense_layers=(), mode="scout", total_pages=None, estimate=False, **settings):
    config = ScoutConfig(mode=mode, block_size=16, token_budget=64, sink_blocks=1, local_blocks=1,
                         dense_layers=dense_layers, cpu_groups=1, estimate=estimate, **settings)
    return CoAttentionEngine(config, SHAPE, dtype=torch.bfloat16, max_requests=2, max_tokens_per_request=64,
                             total_pages=total_pages, cpu_worker=False)  # no CPU work here: no threads


def test_device_bytes_per_request_count_every_layer_against_full_attention():
    per = memory_report.per_request_bytes(small_engine(), 4096)
    off = per["offloaded_layer"]
    assert per["full_attention"] == 3 * 4096 * TOKEN
    assert off["digests"] == 4096 // 16 * TOKEN  # min and max of K per block: one token's K+V worth
    assert off["window_and_resident"] == small_engine().offloaded.pages_per_request * 16 * TOKEN
    assert per["dense_layer"] is None and per["device"] == 3 * off["device"] < per["full_attention"] / 5
    dense = memory_report.per_request_bytes(small_engine(dense_layers=(0,)), 4096)
    assert dense["dense_layer"] == 4096 * TOKEN  # every token of the request, in the dense layer
    assert dense["device"] == 2 * off["device"] + 4096 * TOKEN


def test_the_startup_message_counts_the_dense_layers_in_the_request_and_the_allocation():
    engine = small_engine(dense_layers=(0,), total_pages=8192 // 16 + 2)
    message = memory_report.startup_message(engine, "logical", 8192, 4096, {"device": 0, "host": 0}, 2)
    per = memory_report.per_request_bytes(engine, 4096)
    assert f"a 4096-token request needs {per['device'] / 2**20:.2f} MiB of device memory over its 3 layers" in message
    assert "in each of 1 dense layers [0] (every token)" in message and "full attention needs 1.50 MiB" in message
    dense = (8192 + 2 * 16) * TOKEN
    assert f"({memory_report.size_text(dense)} dense layers" in message


@pytest.mark.parametrize("estimate", [False, True])
@pytest.mark.parametrize("mode", ["scout", "hgca", "infinigen", "quest", "full"])
@pytest.mark.parametrize("dense_layers", [(), (0,), (0, 2)])
def test_the_plan_is_what_the_engine_allocates(mode, dense_layers, estimate):
    """With the estimate on, the digests hold each block's value summary too, three vectors (not in mode full:
    nothing to estimate)."""
    engine = small_engine(dense_layers, mode, total_pages=37, estimate=estimate)
    plan = memory_report.planned_bytes(engine.config, num_layers=3, num_kv_heads=2, head_dim=16, itemsize=2,
                                       total_pages=37, slots=2)
    memory, parts = engine.memory(), memory_report.device_parts(engine)
    assert {key: plan[key] for key in parts} == parts
    assert plan["device_bytes_allocated"] == sum(parts.values()) == memory["device_bytes_allocated"]
    assert plan["host_bytes_allocated"] == memory["host_bytes_allocated"]
    assert plan["dense_layers"] == list(engine.full_layers)
    if estimate and parts["digest_bytes_allocated"]:
        without = memory_report.device_parts(small_engine(dense_layers, mode, total_pages=37))
        assert 2 * parts["digest_bytes_allocated"] == 5 * without["digest_bytes_allocated"]


def test_a_dense_layer_adds_its_full_store_to_the_device_bytes():
    """Offloaded, a layer costs digests and windows; dense, every token slot of the capacity."""
    pages = 64
    offloaded, dense = small_engine((), total_pages=pages), small_engine((0,), total_pages=pages)
    per_layer = offloaded.memory()["device_bytes_allocated"] // 3  # every offloaded layer allocates the same
    full_store = (pages + 1) * 16 * TOKEN  # token slots (and the scratch page) x K and V of a token in a layer
    assert dense.memory()["device_bytes_allocated"] == offloaded.memory()["device_bytes_allocated"] - per_layer + full_store
    assert memory_report.device_parts(dense)["dense_layer_bytes_allocated"] == full_store


def test_usage_reports_the_device_bytes_by_part():
    engine = small_engine(dense_layers=(0,), total_pages=40)
    pool = SimpleNamespace(k_buffer=[torch.zeros(8, 2, 16, dtype=torch.bfloat16)],
                           v_buffer=[torch.zeros(8, 2, 16, dtype=torch.bfloat16)])
    usage = memory_report.usage(engine, "logical", pool, slots=2)
    assert usage["token_slots"] == 40 * 16 and usage["request_slots"] == 2
    scratch_page = 16
    assert usage["dense_layer_bytes_allocated"] == (usage["token_slots"] + scratch_page) * TOKEN
    assert usage["dense_layers"] == [0]
    assert usage["sglang_pool_device_bytes"] == 2 * 8 * 2 * 16 * 2
    parts = sum(usage[key] for key in memory_report.DEVICE_PARTS)
    assert usage["device_bytes_allocated"] == parts + usage["sglang_pool_device_bytes"]


def test_device_memory_that_cannot_hold_the_dense_layers_is_refused():
    plan = memory_report.planned_bytes(ScoutConfig(dense_layers=(0,)), num_layers=36, num_kv_heads=8, head_dim=128,
                                       itemsize=2, total_pages=2**20 // 32 + 64, slots=64)
    # 4 KiB per token: ~4 GiB at 1M tokens (plus one scratch page of 32 tokens)
    assert plan["dense_layer_bytes_allocated"] == (2**20 + 64 * 32 + 32) * 4096
    check_device_memory(plan, 2**20, free_bytes=80 * 2**30)
    with pytest.raises(RuntimeError, match=r"needs \d+\.\d+ GiB of device memory for 1048576 logical tokens "
                                           r"\(4\.01 GiB of it for the dense layers \[0\].*SCOUT_DENSE_LAYERS="):
        check_device_memory(plan, 2**20, free_bytes=6 * 2**30)


def test_on_a_cpu_server_the_device_part_counts_against_host_memory():
    small = {"host_bytes_allocated": 2**20, "device_bytes_allocated": 2**20, "dense_layer_bytes_allocated": 0,
             "dense_layers": []}
    check_engine_memory(small, "cpu", 1000)
    with pytest.raises(RuntimeError, match=r"the scout engine \(host store and, on this CPU device, its device part\) "
                                           r"for 1000 tokens needs .* lower --max-total-tokens"):
        check_engine_memory({**small, "device_bytes_allocated": 2**60}, "cpu", 1000)


@pytest.mark.parametrize("pool_blocks", [None, 11])
def test_with_resident_first_the_plan_is_what_the_engine_allocates(pool_blocks):
    """Resident-first: one pool of resident pages instead of a buffer per slot (by default as many pages)."""
    engine = small_engine((0,), "scout", total_pages=37, resident_first=True, resident_pool_blocks=pool_blocks)
    plan = memory_report.planned_bytes(engine.config, num_layers=3, num_kv_heads=2, head_dim=16, itemsize=2,
                                       total_pages=37, slots=2)
    parts = memory_report.device_parts(engine)
    assert {key: plan[key] for key in parts} == parts
    plain = memory_report.device_parts(small_engine((0,), "scout", total_pages=37))
    same = plain["window_and_resident_bytes_allocated"] == parts["window_and_resident_bytes_allocated"]
    assert same == (pool_blocks is None)


def test_without_a_size_the_resident_pool_takes_the_stock_kv_budget_less_scouts_other_stores():
    """The pool is what a stock server's KV memory leaves after the digests, windows and dense layers, in pages of
    one block of every offloaded layer: the engine built with it allocates exactly the budget (to a page); a small
    budget keeps the floor (resident_blocks per slot), a huge one stops at every block of the logical capacity."""
    config = ScoutConfig(mode="scout", block_size=16, token_budget=64, sink_blocks=1, local_blocks=1,
                         dense_layers=(0,), cpu_groups=1, resident_first=True)
    geometry = dict(num_layers=3, num_kv_heads=2, head_dim=16, itemsize=2, total_pages=37, slots=2)
    page = 2 * 2 * 2 * 16 * 16 * 2  # two offloaded layers, K and V, 2 heads, 16 tokens, 16 dims, bf16
    others = memory_report.planned_bytes(config.replace(resident_pool_blocks=0), **geometry)["device_bytes_allocated"]
    sizing = memory_report.resident_pool_size(config, kv_budget_bytes=others + 20 * page + page // 2, **geometry)
    assert (sizing["pages"], sizing["page_bytes"], sizing["limit"]) == (20, page, "the stock KV budget")
    engine = small_engine((0,), "scout", total_pages=37, resident_first=True, resident_pool_blocks=sizing["pages"])
    allocated = sum(memory_report.device_parts(engine).values())
    assert others + 20 * page == allocated <= sizing["stock_kv_bytes"] < allocated + page
    floor = 2 * config.resident_capacity
    small = memory_report.resident_pool_size(config, kv_budget_bytes=others, **geometry)
    assert (small["pages"], small["limit"]) == (floor, "the floor")
    huge = memory_report.resident_pool_size(config, kv_budget_bytes=2**40, **geometry)
    assert (huge["pages"], huge["limit"]) == (37, "the logical capacity")
    assert "20 pages" in memory_report.resident_pool_text(sizing)
    assert memory_report.resident_pool_size(config.replace(resident_first=False), kv_budget_bytes=2**40,
                                            **geometry) is None


def test_the_stock_kv_budget_is_sglangs_own_profile_or_a_clear_error():
    from scout_sglang.sglang_adapter.kv_pool import stock_kv_budget

    seen = []
    configurator = SimpleNamespace(_profile_available_bytes=lambda memory: seen.append(memory) or 12345)
    assert stock_kv_budget(configurator, {"pre_model_load_memory": 80}) == 12345 and seen == [80]
    with pytest.raises(RuntimeError, match="set SCOUT_RESIDENT_POOL_BLOCKS to size it"):
        stock_kv_budget(SimpleNamespace(), {"pre_model_load_memory": 80})
