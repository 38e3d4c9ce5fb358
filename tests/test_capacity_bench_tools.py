"""The capacity benchmark's parsing and server arguments, on made-up logs (the
real run is benchmarks/bench_capacity.py with two servers)."""

import importlib.util
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("bench_capacity", ROOT / "benchmarks/bench_capacity.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)

LOG = """[t] Prefill batch, #new-seq: 1, #new-token: 4000, #running-req: 0, #queue-req: 8
[t] Decode batch, #running-req: 3, #token: 12000, token usage: 0.3, #queue-req: 6
[t] Decode batch, #running-req: 9, #token: 36000, token usage: 0.9, #queue-req: 0
[t] Prefill batch, #new-seq: 1, #new-token: 4000, #running-req: 12, #queue-req: 0
"""


def test_peak_running_counts_decode_batches_only():
    assert bench.peak_running(LOG) == 9
    assert bench.peak_running("no batches") == 0


def test_token_capacity_reads_the_scheduler_state():
    info = {"internal_states": [{"memory_usage": {"token_capacity": 36864}}]}
    assert bench.token_capacity(info) == 36864
    assert bench.token_capacity({"memory_usage": {"token_capacity": 4096}}) == 4096
    assert bench.token_capacity({}) == 0


def test_both_servers_get_the_same_limits_and_only_scout_a_logical_capacity():
    args = SimpleNamespace(dtype="float32", num_prompts=9, input_len=4000, output_len=32, device="cpu", budget=4096,
                           logical_tokens=36864, scout_config="tiny")
    stock, stock_env = bench.server_args("stock", args)
    scout, scout_env = bench.server_args("scout", args)
    assert stock[:4] == ["--attention-backend", "torch_native", "--max-total-tokens", "4096"] and stock_env == {}
    assert scout[:4] == ["--attention-backend", "scout", "--max-total-tokens", "36864"]
    assert stock[4:] == scout[4:]  # same dtype, request slots, radix cache off, context length
    assert scout_env == {"SCOUT_CONFIG": "tiny"}  # the preset as shipped, dense layers and all


def test_scout_gets_the_largest_capacity_whose_device_part_fits_the_budget():
    from scout_sglang.env import config_from_env
    from scout_sglang.sglang_adapter.memory_report import engine_total_pages, planned_bytes

    layer_token = 2 * 2 * 16 * 4  # K and V of a token in a layer: 2 heads of 16 dims, fp32
    shape = dict(num_layers=4, num_kv_heads=2, head_dim=16, itemsize=4)
    budget = 4096 * 4 * layer_token
    capacity = {}
    for dense in ("0", ""):
        config = config_from_env({"SCOUT_CONFIG": "tiny", "SCOUT_DENSE_LAYERS": dense})
        tokens = bench.fitting_capacity(budget, config, slots=8, **shape)
        assert tokens % config.block_size == 0
        plan = planned_bytes(config, total_pages=engine_total_pages(tokens, config.block_size, 8), slots=8, **shape)
        placeholder = (2 * 8 + 1) * 4 * layer_token  # SGLang's pool: 2 tokens per request slot and padding
        assert plan["device_bytes_allocated"] + placeholder <= budget
        capacity[dense] = tokens
    # One of four layers dense: a logical token costs that layer's K/V (256 B) plus 3 layers' digests (48 B).
    assert 2 * 4096 < capacity["0"] < 4096 * 1024 // 304
    assert capacity[""] > 3 * capacity["0"]  # all offloaded: 64 B of digests per token


def test_the_decode_profile_takes_the_median_step_per_batch_and_adds_them_up():
    lines = ["[t] Decode batch, #running-req: 2, #token: 9, cpu graph: False, gen throughput (token/s): 0.50, #queue-req: 0",
             *["[t] Decode batch, #running-req: 2, #token: 9, cpu graph: False, gen throughput (token/s): 20.00, "
               "#queue-req: 0"] * 3,  # 100 ms a step; the first line's interval held a prefill (4 s)
             "[t] Decode batch, #running-req: 1, #token: 9, cpu graph: False, gen throughput (token/s): 40.00, "
             "#queue-req: 0"]
    profile = bench.decode_profile("\n".join(lines))
    assert profile["by_batch"] == {1: {"steps": 1, "median_step_ms": 25.0}, 2: {"steps": 4, "median_step_ms": 100.0}}
    assert profile["decode_seconds"] == 0.425


def test_the_floor_server_is_stock_with_room_for_the_largest_batch_at_short_prompts():
    args = SimpleNamespace(dtype="float32", num_prompts=9, input_len=3900, output_len=128, device="cpu", budget=4096,
                           logical_tokens=28304, scout_config="tiny", floor_batches=[1, 2, 7])
    floor, env = bench.server_args("floor", args)
    stock, _ = bench.server_args("stock", args)
    assert floor[:3] == ["--attention-backend", "torch_native", "--max-total-tokens"] and env == {}
    assert int(floor[3]) >= 7 * (bench.FLOOR_INPUT_LEN + 128)
    assert floor[4:] == stock[4:]


def test_the_host_floor_prices_scouts_steps_at_the_floor_after_the_stock_runs_prefill():
    stock = {"duration_s": 50.0, "decode": {"decode_seconds": 35.0, "by_batch": {1: {"median_step_ms": 29.0}}}}
    scout = {"duration_s": 55.0, "decode": {"decode_seconds": 36.0, "by_batch": {
        1: {"steps": 10, "median_step_ms": 100.0}, 7: {"steps": 100, "median_step_ms": 135.0}}}}
    floor = {"median_step_ms_by_batch": {1: 20.0, 7: 40.0}}
    bound = bench.host_floor(stock, scout, floor)
    # at best: the 15 s the stock run spent outside decoding + 10 steps of 20 ms + 100 steps of 40 ms = 19.2 s
    assert bound["floor_decode_seconds"] == 4.2
    assert bound["best_scout_duration_s"] == 19.2
    assert bound["output_throughput_ratio_ceiling"] == round(50.0 / 19.2, 3)
    assert bound["scout_step_ms_by_batch"] == {1: 100.0, 7: 135.0}
    assert bench.host_floor(stock, scout, {"median_step_ms_by_batch": {1: 20.0, 7: None}}) == {}
