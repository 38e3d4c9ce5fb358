"""The step-time model against hand-computed steps, and its invariants: what bounds a step follows the
slowest resource, the CPU part follows the mode and the recall policy."""

import dataclasses
import json

import pytest

from scout_sglang.config import ScoutConfig
from scout_sglang.plan.host_counts import host_counts
from scout_sglang.plan.models import ModelSpec
from scout_sglang.env import load_preset
from scout_sglang.plan.models import load_model
from scout_sglang.plan.step_model import (Hardware, Workload, expected_cpu_ratio, parse_cpu_split, recall_share,
                                          step_time)

# Two layers, one KV head of 4 dims: a layer's weights are 8*4*2 + 8*4*2 (q, o; k, v) + 3*8*8 + 2*8 = 336.
SPEC = ModelSpec(name="toy", num_layers=2, num_qo_heads=1, num_kv_heads=1, head_dim=4, hidden_size=8,
                 intermediate_size=8, vocab_size=16)
CONFIG = ScoutConfig(block_size=4, token_budget=16, sink_blocks=1, local_blocks=1, dense_layers=(0,))
HW = Hardware(hbm_gbs=1.0, pcie_gbs=1.0, cpu_attention_gbs=1.0, bf16_tflops=1e6, launch_us=0.0, sync_us=0.0,
              model_launches_per_layer=0.0)  # 1 GB/s everywhere: a step's seconds are its bytes / 1e9


def test_a_stock_step_by_hand():
    """Two dense layers read weights and every token's K/V; then the output projection."""
    work = Workload(batch_size=3, context=100, itemsize=2)
    step = step_time("full", CONFIG, SPEC, HW, work)
    layer = 336 * 2 + 3 * 100 * (2 * 4 * 2)  # weights + B x C x (K, V of 4 dims, bf16)
    head = (16 * 8 + 8) * 2  # output projection and final norm
    assert step.step_ms == pytest.approx((2 * layer + head) / 1e9 * 1e3)
    assert step.tokens_per_s == pytest.approx(3 / (step.step_ms / 1e3))
    assert (step.bound, step.gpu_idle, step.cpu_ratio) == ("HBM", 0.0, 0.0)


TOKEN = 2 * 4 * 2  # K and V of one token for the one KV head, bf16
DENSE_LAYER = 336 * 2 + 100 * TOKEN  # layer 0 at context 100, batch 1
HEAD = (16 * 8 + 8) * 2  # output projection and final norm
DIGESTS = 25 * (2 * 4 * 2 + 8)  # 25 blocks: min and max of K, bf16, and an fp32 score written and read
CPU_OUTPUT = 4 * 4 + 4  # o and lse of the CPU part, fp32, for the one query head


def test_a_resident_first_row_is_attended_whole_and_shrinks_the_cpu_part_to_nothing_when_it_holds_every_block():
    """Resident-first's sparse rows: a quota of `row` of the 23 blocks outside the window (25 full, 2 forced). The
    device part reads the window and the whole row; the CPU part and the recall scale by the share of the blocks
    the row leaves off the device, (23 - row) / (23 - 4): all of them at the floor (4, the fixed buffer's), none
    when the row holds every block."""
    def step(row):
        work = Workload(batch_size=1, context=100, itemsize=2, change_rate=0.1, resident_row_blocks=row)
        return step_time("scout", CONFIG, SPEC, HW, work, host_overhead_path="/nonexistent")

    fixed = step_time("scout", CONFIG, SPEC, HW, Workload(batch_size=1, context=100, itemsize=2, change_rate=0.1),
                      host_overhead_path="/nonexistent")
    floor, half, whole = step(4), step(13), step(23)
    assert floor.as_dict() == fixed.as_dict()
    assert half.cpu_bytes == pytest.approx(floor.cpu_bytes * 10 / 19)
    assert half.pcie_bytes == pytest.approx(0.1 * 2 * 4 * TOKEN * 10 / 19 + CPU_OUTPUT)
    assert whole.cpu_bytes == whole.pcie_bytes == whole.cpu_ratio == 0.0
    layer_weights = 336 * 2
    assert whole.hbm_bytes - floor.hbm_bytes == pytest.approx((23 - 4) * 4 * TOKEN - 2 * CPU_OUTPUT)
    assert whole.hbm_bytes == pytest.approx(DENSE_LAYER + layer_weights + (2 + 23) * 4 * TOKEN + DIGESTS + HEAD)
    assert step(40).as_dict() == whole.as_dict()  # a row is at most the request's blocks


@pytest.mark.parametrize("cpu_gbs", [1.0, 0.1])
def test_an_hgca_step_by_hand(cpu_gbs):
    """Layer 1 offloaded: 25 full blocks, 4 selected, 2 forced; the 2 others on the CPU beside the device part,
    which hides it only while it is shorter than the device attention."""
    work = Workload(batch_size=1, context=100, itemsize=2, change_rate=0.0)
    hw = Hardware(hbm_gbs=1.0, pcie_gbs=1.0, cpu_attention_gbs=cpu_gbs, bf16_tflops=1e6, launch_us=0.0, sync_us=0.0,
                  model_launches_per_layer=0.0)
    step = step_time("hgca", CONFIG, SPEC, hw, work, host_overhead_path="/nonexistent")
    device_attention = 2 * 4 * TOKEN + 2 * CPU_OUTPUT + DIGESTS  # window (2 blocks), the merge reads o twice
    cpu = 2 * 4 * TOKEN
    offloaded = 336 * 2 + device_attention + max(0.0, cpu / cpu_gbs - device_attention)
    assert step.step_ms == pytest.approx((DENSE_LAYER + offloaded + HEAD) / 1e9 * 1e3)
    assert step.cpu_bytes == cpu and step.pcie_bytes == CPU_OUTPUT
    assert step.cpu_ratio == pytest.approx(0.5)


def test_a_scout_step_by_hand():
    """Adaptive recall, beta 0.12, change rate 0.1: the CPU share climbs 0.1, 0.2, then a recall: 0.15 of the 4
    selected blocks on the CPU; 0.1 of the 2 free blocks recalled over PCIe each step; launched a layer ahead.
    The device part attends the window (2 blocks) and the whole resident row (4 blocks, selected or not)."""
    work = Workload(batch_size=1, context=100, itemsize=2, change_rate=0.1)
    step = step_time("scout", CONFIG, SPEC, HW, work, host_overhead_path="/nonexistent")
    cpu = 0.15 * 4 * 4 * TOKEN
    pcie = 0.1 * 2 * 4 * TOKEN + CPU_OUTPUT
    device = 336 * 2 + (2 + 4) * 4 * TOKEN + 2 * CPU_OUTPUT + DIGESTS
    assert step.cpu_bytes == pytest.approx(cpu) and step.pcie_bytes == pytest.approx(pcie)
    assert step.step_ms == pytest.approx((DENSE_LAYER + max(device, cpu, pcie) + HEAD) / 1e9 * 1e3)
    assert step.cpu_ratio == pytest.approx(0.15)
    infinigen = step_time("infinigen", CONFIG, SPEC, HW, work, host_overhead_path="/nonexistent")
    assert infinigen.cpu_bytes == 0 and infinigen.pcie_bytes == pytest.approx(0.1 * 2 * 4 * TOKEN)  # all on device


def test_the_cpu_ratio_follows_the_recall_policy():
    adaptive = ScoutConfig(recall_policy="adaptive", recall_beta=0.12)
    assert expected_cpu_ratio(adaptive, change_rate=0.05, free_share=1.0, output_len=100) == pytest.approx(0.1)  # 3 steps
    assert expected_cpu_ratio(adaptive, change_rate=0.2, free_share=1.0, output_len=100) == pytest.approx(0.2)  # each step
    interval = ScoutConfig(recall_policy="interval", recall_interval=8)
    assert expected_cpu_ratio(interval, change_rate=0.05, free_share=1.0, output_len=100) == pytest.approx(0.225)
    off = ScoutConfig(recall_policy="off")
    assert expected_cpu_ratio(off, change_rate=0.05, free_share=0.9, output_len=100) == pytest.approx(0.9)  # capped
    assert expected_cpu_ratio(adaptive, change_rate=0.0, free_share=1.0, output_len=100) == 0.0


def test_the_bound_is_the_slowest_resource():
    work = Workload(batch_size=8, context=4096, itemsize=2, change_rate=0.15)
    slow_cpu = Hardware(hbm_gbs=1000.0, pcie_gbs=1000.0, cpu_attention_gbs=0.01, bf16_tflops=1e3, launch_us=0.0,
                        sync_us=0.0, model_launches_per_layer=0.0)
    step = step_time("scout", CONFIG, SPEC, slow_cpu, work, host_overhead_path="/nonexistent")
    assert step.bound == "CPU" and step.gpu_idle > 0.9
    slow_pcie = Hardware(hbm_gbs=1000.0, pcie_gbs=0.01, cpu_attention_gbs=1000.0, bf16_tflops=1e3, launch_us=0.0,
                         sync_us=0.0, model_launches_per_layer=0.0)
    assert step_time("scout", CONFIG, SPEC, slow_pcie, work, host_overhead_path="/nonexistent").bound == "PCIe"
    slow_host = Hardware(hbm_gbs=1000.0, pcie_gbs=1000.0, cpu_attention_gbs=1000.0, bf16_tflops=1e3, launch_us=100.0,
                         sync_us=0.0, model_launches_per_layer=0.0)
    hosted = step_time("scout", CONFIG, SPEC, slow_host, work, host_overhead_path="/nonexistent")
    assert hosted.bound == "host" and hosted.step_ms_without_host < hosted.step_ms
    quest = step_time("quest", CONFIG, SPEC, slow_cpu, work, host_overhead_path="/nonexistent")
    assert quest.cpu_bytes == 0 and quest.pcie_bytes == 0  # quest never leaves the device


def test_scout_reads_less_device_kv_than_full_and_moves_its_rest_to_the_cpu():
    work = Workload(batch_size=4, context=4096, itemsize=2, change_rate=0.15)
    full = step_time("full", CONFIG, SPEC, HW, work)
    scout = step_time("scout", CONFIG, SPEC, HW, work, host_overhead_path="/nonexistent")
    dense_layer = 336 * 2 + 4 * 4096 * 16  # layer 0 stays dense
    assert scout.hbm_bytes - dense_layer < (full.hbm_bytes - dense_layer) / 2 and scout.cpu_bytes > 0
    assert 0 < scout.cpu_ratio <= 1 - 2 / 4  # at most the non-forced share of 4 selected blocks


def test_host_counts_come_from_the_file_interpolated_in_the_batch(tmp_path):
    rows = [{"mode": "scout", "variant": "steady", "batch": b, "num_kv_heads": h, "ops_per_layer": 100.0 * b + h,
             "scalar_reads_per_layer": 2.0 * b} for b in (1, 8) for h in (1, 8)]
    rows.append({"mode": "scout", "variant": "recall", "batch": 4, "num_kv_heads": 8, "ops_per_layer": 1e9,
                 "scalar_reads_per_layer": 1e9})
    path = tmp_path / "host_overhead.json"
    path.write_text(json.dumps({"rows": rows}))
    counts = host_counts("scout", 4, 8, path)
    assert (counts.ops_per_layer, counts.scalar_reads_per_layer, counts.how) == (408.0, 8.0, "measured")
    assert host_counts("scout", 16, 2, path).ops_per_layer == 1601.0  # nearest heads (1), extended past batch 8
    assert host_counts("hgca", 4, 8, path).how == "assumed"
    assert host_counts("scout", 4, 8, tmp_path / "missing.json").how == "assumed"


def _counts_file(tmp_path, **row):
    path = tmp_path / "host_overhead.json"
    path.write_text(json.dumps({"rows": [{"mode": "scout", "variant": "steady", "batch": 1, "num_kv_heads": 1,
                                          "scalar_reads_per_layer": 0.0, **row}]}))
    return path


def test_a_gpu_prices_launches_and_a_cpu_device_every_dispatched_op(tmp_path):
    """On a GPU views launch nothing and launches overlap the device; on a CPU device every op costs the one
    thread that also computes, so a layer is launch + device time, and the engine's plan comes on top."""
    path = _counts_file(tmp_path, ops_per_layer=300.0, launches_per_layer=200.0, plan_host_ms=0.5)
    work = Workload(batch_size=1, context=100, itemsize=2, change_rate=0.0)
    gpu = Hardware(hbm_gbs=1.0, pcie_gbs=1.0, cpu_attention_gbs=1.0, bf16_tflops=1e6, launch_us=10.0, sync_us=0.0,
                   model_launches_per_layer=0.0)
    on_gpu = step_time("scout", CONFIG, SPEC, gpu, work, host_overhead_path=path)
    no_host = step_time("scout", CONFIG, SPEC, HW, work, host_overhead_path="/nonexistent")
    device_ms = [no_host.step_ms]  # the same bytes, no host work: layer 0, layer 1 and the output projection
    launch_ms = 200 * 10e-3  # per layer: 2 ms, far above each layer's device time
    assert on_gpu.step_ms == pytest.approx(2 * launch_ms + HEAD / 1e6 + 0.5)
    cpu = dataclasses.replace(gpu, host_is_device=True)
    on_cpu = step_time("scout", CONFIG, SPEC, cpu, work, host_overhead_path=path)
    assert on_cpu.step_ms == pytest.approx(device_ms[0] + 2 * 300 * 10e-3 + 0.5)
    assert on_cpu.resource_ms["host"] == pytest.approx(2 * 300 * 10e-3 + 0.5) and on_cpu.bound == "host"


def test_a_gpu_prices_the_triton_paths_layers_apart_or_nothing_when_the_graph_replays_the_step(tmp_path):
    """Launched layer by layer, a GPU pays the Triton path's launches of each layer's kind (layer 0 dense, layer
    1 offloaded); with SGLang's decode graph replaying the whole step, only the plan before it stays on the host
    (and syncs and the plugin's launches, inside the graph too, cost nothing)."""
    path = _counts_file(tmp_path, ops_per_layer=300.0, launches_per_layer=200.0, plan_host_ms=0.5,
                        scalar_reads_per_layer=3.0, gpu_launches_per_offloaded_layer=13.0,
                        gpu_launches_per_dense_layer=3.0)
    work = Workload(batch_size=1, context=100, itemsize=2, change_rate=0.0)
    gpu = Hardware(hbm_gbs=1.0, pcie_gbs=1.0, cpu_attention_gbs=1.0, bf16_tflops=1e6, launch_us=1000.0, sync_us=0.0,
                   model_launches_per_layer=0.0, adapter_launches_per_layer=5.0)
    eager = step_time("scout", CONFIG, SPEC, gpu, work, host_overhead_path=path)
    assert eager.step_ms == pytest.approx((3 + 5) + (13 + 5) + HEAD / 1e6 + 0.5)  # 1 ms per launch
    captured = step_time("scout", CONFIG, SPEC, dataclasses.replace(gpu, cuda_graphs_for_engine=True, sync_us=50.0),
                         work, host_overhead_path=path)
    device_only = step_time("scout", CONFIG, SPEC, HW, work, host_overhead_path=path)
    assert captured.step_ms == pytest.approx(device_only.step_ms)  # the bytes and the plan: no launch, no sync
    assert captured.step_ms == pytest.approx(captured.step_ms_without_host) and "CUDA graph" in captured.host_counts_source
    cpu = dataclasses.replace(gpu, cuda_graphs_for_engine=True, host_is_device=True)  # a CPU device: no graphs
    assert step_time("scout", CONFIG, SPEC, cpu, work, host_overhead_path=path).step_ms > 2 * 300


def test_the_framework_step_cost_and_the_stock_loop_grow_with_the_batch():
    """A CPU server: the serving framework's host work a step (fixed + per request) and the stock backend's
    per-request attention loop (ops and host reads) without graphs."""
    hw = Hardware(hbm_gbs=1.0, pcie_gbs=1.0, cpu_attention_gbs=1.0, bf16_tflops=1e6, launch_us=2.0, sync_us=3.0,
                  model_launches_per_layer=0.0, cuda_graphs_for_stock=False, host_is_device=True, step_host_ms=4.0,
                  step_host_ms_per_request=0.5, stock_launches_per_layer=1.0, stock_launches_per_request=20.0,
                  stock_syncs_per_request=2.0)
    for batch in (1, 3):
        work = Workload(batch_size=batch, context=100, itemsize=2)
        bytes_only = step_time("full", CONFIG, SPEC, HW, work).step_ms
        step = step_time("full", CONFIG, SPEC, hw, work)
        per_layer_us = (1 + 20 * batch) * 2.0 + 2 * batch * 3.0
        assert step.step_ms == pytest.approx(bytes_only + 2 * per_layer_us / 1e3 + 4.0 + 0.5 * batch)
    graphs = dataclasses.replace(hw, cuda_graphs_for_stock=True)
    assert step_time("full", CONFIG, SPEC, graphs, work).step_ms == pytest.approx(bytes_only + 4.0 + 0.5 * 3)


def test_host_counts_read_launches_and_the_plan_when_the_file_has_them(tmp_path):
    counts = host_counts("scout", 1, 1, _counts_file(tmp_path, ops_per_layer=300.0, launches_per_layer=200.0,
                                                      plan_host_ms=0.5))
    assert (counts.ops_per_layer, counts.launches_per_layer, counts.plan_ms_per_step) == (300.0, 200.0, 0.5)
    older = host_counts("scout", 1, 1, _counts_file(tmp_path, ops_per_layer=300.0))
    assert (older.launches_per_layer, older.plan_ms_per_step) == (300.0, 0.0)


def test_recall_steps_add_their_extra_counts_by_the_policys_share(tmp_path):
    rows = [{"mode": "scout", "variant": "steady", "batch": 1, "num_kv_heads": h, "ops_per_layer": 300.0,
             "launches_per_layer": 200.0, "scalar_reads_per_layer": 0.0, "plan_host_ms": 0.5} for h in (1, 8)]
    rows.append({"mode": "scout", "variant": "recall", "batch": 1, "num_kv_heads": 8, "ops_per_layer": 380.0,
                 "launches_per_layer": 250.0, "scalar_reads_per_layer": 0.0, "plan_host_ms": 0.7})
    path = tmp_path / "host_overhead.json"
    path.write_text(json.dumps({"rows": rows}))
    counts = host_counts("scout", 1, 1, path, recall_share=0.25)  # the recall delta, measured at 8 heads
    assert (counts.ops_per_layer, counts.launches_per_layer) == (320.0, 212.5)
    assert counts.plan_ms_per_step == pytest.approx(0.55)
    assert host_counts("scout", 1, 1, path).ops_per_layer == 300.0
    # adaptive recall at beta 0.12: a change rate of 0.05 recalls every 3rd step, 0.15 every step
    adaptive = ScoutConfig(recall_policy="adaptive", recall_beta=0.12)
    assert recall_share("scout", adaptive, Workload(batch_size=1, context=64, change_rate=0.05)) == pytest.approx(1 / 3)
    assert recall_share("scout", adaptive, Workload(batch_size=1, context=64, change_rate=0.15)) == 1.0
    assert recall_share("hgca", adaptive, Workload(batch_size=1, context=64)) == 0.0
    assert recall_share("scout", ScoutConfig(recall_policy="off"), Workload(batch_size=1, context=64)) == 0.0


def test_the_engines_kernel_rate_prices_every_mode_but_stock():
    """An engine kernel at half the stock kernel's rate doubles the time of the K/V the engine's modes attend
    on the device (quest's dense layer 0 among them), and leaves the stock step ("full") alone."""
    work = Workload(batch_size=1, context=100, itemsize=2)
    stock_hw = dataclasses.replace(HW, device_attention_gbs=1.0)
    engine_hw = dataclasses.replace(stock_hw, engine_attention_gbs=0.5)
    stock = step_time("full", CONFIG, SPEC, stock_hw, work)
    assert step_time("full", CONFIG, SPEC, engine_hw, work).step_ms == pytest.approx(stock.step_ms)
    quest = step_time("quest", CONFIG, SPEC, stock_hw, work, host_overhead_path="/nonexistent")
    slower = step_time("quest", CONFIG, SPEC, engine_hw, work, host_overhead_path="/nonexistent")
    dense_kv = 100 * TOKEN  # layer 0 of quest is dense: every token's K/V on the device
    assert slower.step_ms - quest.step_ms >= dense_kv / 1e9 * 1e3 * (1 / 0.5 - 1) - 1e-12


def test_the_plugins_own_launches_are_priced_per_layer_and_per_predicted_layer(tmp_path):
    """Around the engine the plugin adds its decode wrapper in every layer of an engine mode and the layer-ahead
    prediction in the layers that take one (scout and infinigen, the offloaded layers after the first: layer 1
    of the two here); the stock backend gets neither."""
    path = _counts_file(tmp_path, ops_per_layer=0.0, launches_per_layer=0.0, plan_host_ms=0.0)
    work = Workload(batch_size=1, context=100, itemsize=2, change_rate=0.0)
    cpu = Hardware(hbm_gbs=1.0, pcie_gbs=1.0, cpu_attention_gbs=1.0, bf16_tflops=1e6, launch_us=10.0, sync_us=0.0,
                   model_launches_per_layer=0.0, host_is_device=True, cuda_graphs_for_stock=False)
    plugin = dataclasses.replace(cpu, adapter_launches_per_layer=15.0, adapter_launches_per_predicted_layer=22.0)
    for mode, predicted_layers in (("scout", 1), ("infinigen", 1), ("quest", 0), ("hgca", 0)):
        without = step_time(mode, CONFIG, SPEC, cpu, work, host_overhead_path=path).step_ms
        added = step_time(mode, CONFIG, SPEC, plugin, work, host_overhead_path=path).step_ms - without
        assert added == pytest.approx((2 * 15 + predicted_layers * 22) * 10e-3), mode
    all_offloaded = CONFIG.replace(dense_layers=())  # layer 0 offloaded too, but no layer before it to predict it
    added = (step_time("scout", all_offloaded, SPEC, plugin, work, host_overhead_path=path).step_ms
             - step_time("scout", all_offloaded, SPEC, cpu, work, host_overhead_path=path).step_ms)
    assert added == pytest.approx((2 * 15 + 22) * 10e-3)
    no_ahead = CONFIG.replace(layer_ahead=False)
    added = (step_time("scout", no_ahead, SPEC, plugin, work, host_overhead_path=path).step_ms
             - step_time("scout", no_ahead, SPEC, cpu, work, host_overhead_path=path).step_ms)
    assert added == pytest.approx(2 * 15 * 10e-3)
    stock = [step_time("full", CONFIG, SPEC, hw, work).step_ms for hw in (cpu, plugin)]
    assert stock[0] == stock[1]


def test_the_plugins_step_cost_prices_the_engines_modes_and_not_stock():
    """The plugin's measured host work a step (fixed + per request) adds to every engine mode, never to stock."""
    plugin = dataclasses.replace(HW, engine_step_host_ms=2.0, engine_step_host_ms_per_request=0.25)
    for batch in (1, 4):
        work = Workload(batch_size=batch, context=100, itemsize=2)
        for mode in ("scout", "hgca", "quest"):
            without = step_time(mode, CONFIG, SPEC, HW, work, host_overhead_path="/nonexistent")
            with_plugin = step_time(mode, CONFIG, SPEC, plugin, work, host_overhead_path="/nonexistent")
            assert with_plugin.step_ms == pytest.approx(without.step_ms + 2.0 + 0.25 * batch)
            assert with_plugin.resource_ms["host"] == pytest.approx(without.resource_ms["host"] + 2.0 + 0.25 * batch)
        assert step_time("full", CONFIG, SPEC, plugin, work).step_ms == pytest.approx(
            step_time("full", CONFIG, SPEC, HW, work).step_ms)


# The CPU/zero-copy split, on a CPU-bound case: Qwen3-8B at 64k on an H100's rates, 12 requests (what 128 GiB of
# host memory holds), a 50 GB/s CPU, change rate 0.11; the host hidden (no launch, no sync).
H100_SLOW_CPU = Hardware(hbm_gbs=3350.0, pcie_gbs=64.0, cpu_attention_gbs=50.0, bf16_tflops=989.0, launch_us=0.0,
                         sync_us=0.0, model_launches_per_layer=0.0)
LONG = Workload(batch_size=12, context=65536 + 512, itemsize=2, change_rate=0.11)


def _scout(hw=H100_SLOW_CPU, work=LONG, **split):
    return step_time("scout", ScoutConfig(**load_preset("default")), load_model("Qwen3-8B"), hw, work,
                     host_overhead_path="/nonexistent", **split)


def test_the_split_off_or_a_cpu_share_of_one_is_todays_step():
    today = _scout()
    assert today.bound == "CPU" and today.cpu_share == 1.0
    assert _scout(cpu_split="off") == today
    assert _scout(cpu_split=1.0).as_dict() == today.as_dict()


def test_a_cpu_share_of_zero_puts_the_whole_cpu_list_on_the_link():
    today, zero_copy = _scout(), _scout(cpu_split=0.0)
    assert zero_copy.cpu_bytes == 0 and zero_copy.resource_ms["CPU"] == 0 and zero_copy.cpu_share == 0
    assert zero_copy.pcie_bytes == pytest.approx(today.pcie_bytes + today.cpu_bytes)
    assert zero_copy.hbm_bytes == today.hbm_bytes  # the zero-copy reads run beside the device work: no HBM bytes
    half = _scout(cpu_split=0.5)
    assert half.cpu_bytes == pytest.approx(today.cpu_bytes / 2) and half.cpu_share == pytest.approx(0.5)


def test_auto_balances_the_cpu_against_the_link_and_beats_every_fixed_share():
    today, auto = _scout(), _scout(cpu_split="auto")
    assert 0 < auto.cpu_share < 1 and auto.step_ms < today.step_ms
    assert auto.resource_ms["CPU"] == pytest.approx(auto.resource_ms["PCIe"], rel=0.01)  # layer 0 adds to neither
    assert auto.cpu_bytes + auto.pcie_bytes == pytest.approx(today.cpu_bytes + today.pcie_bytes)  # moved, not made
    for share in (0.0, 0.25, 0.5, 0.7, 0.75, 1.0):
        assert auto.step_ms <= _scout(cpu_split=share).step_ms + 1e-9, share


def test_the_share_follows_the_cpus_speed_and_stays_whole_where_the_link_is_the_bottleneck():
    slow_hw = dataclasses.replace(H100_SLOW_CPU, cpu_attention_gbs=0.01)
    slow = _scout(slow_hw, cpu_split="auto")
    assert slow.cpu_share < 0.01
    assert slow.step_ms == pytest.approx(_scout(slow_hw, cpu_split=0.0).step_ms, rel=0.01)  # nearly all zero-copy
    fast_hw = dataclasses.replace(H100_SLOW_CPU, cpu_attention_gbs=1e4)  # the recall alone outlasts the CPU's list
    fast = _scout(fast_hw, cpu_split="auto")
    assert fast.cpu_share == 1.0 and fast == _scout(fast_hw)  # clamped: the step of the split off


def test_the_split_is_scouts_and_a_gpus():
    """The other modes, and a CPU device (no link to read over), give the step of the split off."""
    work = Workload(batch_size=8, context=4096, itemsize=2, change_rate=0.15)
    for mode in ("full", "quest", "infinigen", "hgca"):
        off = step_time(mode, CONFIG, SPEC, HW, work, host_overhead_path="/nonexistent")
        assert step_time(mode, CONFIG, SPEC, HW, work, host_overhead_path="/nonexistent", cpu_split="auto") == off
    cpu_device = dataclasses.replace(HW, host_is_device=True)
    off = step_time("scout", CONFIG, SPEC, cpu_device, work, host_overhead_path="/nonexistent")
    assert step_time("scout", CONFIG, SPEC, cpu_device, work, host_overhead_path="/nonexistent",
                     cpu_split=0.0) == off


@pytest.mark.parametrize("value, parsed", [("off", "off"), ("AUTO", "auto"), ("0.25", 0.25), (1, 1.0)])
def test_a_cpu_split_is_off_auto_or_a_share(value, parsed):
    assert parse_cpu_split(value) == parsed


@pytest.mark.parametrize("value", ["half", "1.5", -0.1, "nan", None])
def test_a_cpu_split_outside_off_auto_and_zero_to_one_is_refused(value):
    with pytest.raises(ValueError, match="--cpu-split must be off, auto or a CPU share in"):
        parse_cpu_split(value)


def test_the_exact_path_reads_what_full_attention_reads_with_its_own_launches_and_plan(tmp_path):
    """Resident-first's exact path: the offloaded layer attends every token on the device as the dense one does
    (no digests, no CPU part, no recall), priced with the file's exact rows (launches, plan), not its steady ones;
    with the step graph-replayed the plan is all that is left of the host. Other modes have no exact path."""
    rows = [{"mode": "scout", "variant": variant, "batch": 1, "num_kv_heads": 1, "ops_per_layer": 300.0,
             "scalar_reads_per_layer": 0.0, "plan_host_ms": plan, "gpu_launches_per_offloaded_layer": launches,
             "gpu_launches_per_dense_layer": 3.0} for variant, plan, launches in (("steady", 0.5, 13.0),
                                                                                  ("exact", 0.25, 5.0))]
    path = tmp_path / "host_overhead.json"
    path.write_text(json.dumps({"rows": rows}))
    work = Workload(batch_size=1, context=100, itemsize=2, change_rate=0.1)
    exact = step_time("scout", CONFIG, SPEC, HW, work, host_overhead_path=path, exact=True)
    full = step_time("full", CONFIG, SPEC, HW, work)
    assert exact.step_ms == pytest.approx(full.step_ms + 0.25)  # the same bytes, and the plan before the step
    assert (exact.cpu_bytes, exact.pcie_bytes, exact.cpu_ratio) == (0.0, 0.0, 0.0)
    assert exact.hbm_bytes == full.hbm_bytes
    eager = Hardware(hbm_gbs=1.0, pcie_gbs=1.0, cpu_attention_gbs=1.0, bf16_tflops=1e6, launch_us=1000.0,
                     sync_us=0.0, model_launches_per_layer=0.0)
    launched = step_time("scout", CONFIG, SPEC, eager, work, host_overhead_path=path, exact=True)
    assert launched.step_ms == pytest.approx(3 + 5 + HEAD / 1e6 + 0.25)  # 1 ms a launch: dense 3, exact 5
    assert "exact" in launched.host_counts_source
    with pytest.raises(ValueError, match="exact path"):
        step_time("hgca", CONFIG, SPEC, HW, work, exact=True)


def test_under_the_overlap_scheduler_the_plan_hides_behind_the_previous_step_unless_a_step_reads_the_device(
        tmp_path):
    """SGLang's overlap scheduler plans step N+1 while the device runs step N: with nothing read from the device,
    a step takes the longer of the device's part and the host's, not their sum. A step with host reads waits for
    the device every time (no overlap), and a CPU device computes on the thread that plans."""
    path = _counts_file(tmp_path, ops_per_layer=300.0, launches_per_layer=200.0, plan_host_ms=0.25,
                        gpu_launches_per_offloaded_layer=13.0, gpu_launches_per_dense_layer=3.0)
    overlapped = dataclasses.replace(HW, cuda_graphs_for_engine=True, overlap_schedule=True)
    for context, device_longer in ((40000, True), (8, False)):  # layer 0 reads 16 bytes a token at 1 GB/s
        work = Workload(batch_size=1, context=context, itemsize=2, change_rate=0.0)
        serial = step_time("scout", CONFIG, SPEC, dataclasses.replace(overlapped, overlap_schedule=False), work,
                           host_overhead_path=path)
        device_part = serial.step_ms - 0.25
        assert (device_part > 0.25) == device_longer, device_part
        step = step_time("scout", CONFIG, SPEC, overlapped, work, host_overhead_path=path)
        assert step.step_ms == pytest.approx(max(device_part, 0.25)), context
        assert "overlap" in step.host_counts_source and "overlap" not in serial.host_counts_source
    work = Workload(batch_size=1, context=100, itemsize=2, change_rate=0.0)
    reading = _counts_file(tmp_path, ops_per_layer=300.0, launches_per_layer=200.0, plan_host_ms=0.25,
                           scalar_reads_per_layer=1.0, gpu_launches_per_offloaded_layer=13.0,
                           gpu_launches_per_dense_layer=3.0)
    launched = dataclasses.replace(overlapped, cuda_graphs_for_engine=False)  # its syncs are not graph-replayed
    waits = step_time("scout", CONFIG, SPEC, launched, work, host_overhead_path=reading)
    assert waits.step_ms == pytest.approx(step_time("scout", CONFIG, SPEC, dataclasses.replace(
        launched, overlap_schedule=False), work, host_overhead_path=reading).step_ms)
    cpu = dataclasses.replace(overlapped, host_is_device=True)
    assert step_time("scout", CONFIG, SPEC, cpu, work, host_overhead_path=path).step_ms == pytest.approx(
        step_time("scout", CONFIG, SPEC, dataclasses.replace(cpu, overlap_schedule=False), work,
                  host_overhead_path=path).step_ms)
